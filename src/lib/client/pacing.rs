//! Pacing to a target rate, and the back-off used when the local queue is
//! full.
//!
//! Why pacing by schedule rather than by sleeping a fixed gap per datagram:
//! each datagram's send time is computed from the bytes sent before it, so
//! sleep overshoot in one gap is made up in the next and the average rate
//! stays on target over the whole run.

use crate::shutdown::Shutdown;
use std::time::{Duration, Instant};

/// The longest the pacer sleeps before it looks at the shutdown flag.
pub const WAKE: Duration = Duration::from_millis(50);

/// Below this much time ahead of schedule, spin instead of sleeping: the
/// OS's sleep granularity would overshoot.
const SPIN_BELOW: Duration = Duration::from_micros(200);

/// Sends at most `rate_bps` payload bits per second, on average from start.
pub struct Pacer {
    start: Instant,
    rate_bps: f64,
}

impl Pacer {
    pub fn new(rate_bps: u64) -> Self {
        Pacer {
            start: Instant::now(),
            rate_bps: rate_bps as f64,
        }
    }

    /// When the datagram after `bytes_sent` payload bytes is due.
    pub fn due(&self, bytes_sent: u64) -> Instant {
        self.start + Duration::from_secs_f64(bytes_sent as f64 * 8.0 / self.rate_bps)
    }

    /// Waits until the next datagram is due; false when `shutdown` came
    /// first (a slow rate can mean minutes between datagrams: a signal
    /// still ends the wait within [`WAKE`]).
    pub fn wait_until_due(&mut self, bytes_sent: u64, shutdown: &Shutdown) -> bool {
        let due = self.due(bytes_sent);
        loop {
            if shutdown.is_triggered() {
                return false;
            }
            let now = Instant::now();
            if now >= due {
                return true;
            }
            let ahead = due - now;
            if ahead > SPIN_BELOW {
                std::thread::sleep((ahead - SPIN_BELOW / 2).min(WAKE));
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// Exponential back-off: 20 µs doubling to a 16 ms cap (nuttcp, the only
/// peer with one, sleeps a fixed 18 ms), reset after every success.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
}

pub const BACKOFF_START: Duration = Duration::from_micros(20);
pub const BACKOFF_CAP: Duration = Duration::from_millis(16);

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: BACKOFF_START,
        }
    }
}

impl Backoff {
    /// The next wait, doubling up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(BACKOFF_CAP);
        delay
    }

    /// Sleeps for the next delay; returns the time really slept.
    pub fn wait(&mut self) -> Duration {
        let start = Instant::now();
        std::thread::sleep(self.next_delay());
        start.elapsed()
    }

    pub fn reset(&mut self) {
        self.next = BACKOFF_START;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_cap_and_resets() {
        let mut b = Backoff::default();
        let delays: Vec<_> = (0..12).map(|_| b.next_delay()).collect();
        assert_eq!(delays[0], BACKOFF_START);
        assert_eq!(delays[1], BACKOFF_START * 2);
        assert!(delays.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*delays.last().unwrap(), BACKOFF_CAP);
        b.reset();
        assert_eq!(b.next_delay(), BACKOFF_START);
    }

    #[test]
    fn schedule_is_cumulative() {
        let p = Pacer::new(8_000_000); // 1 MB/s
        assert_eq!(p.due(0), p.start);
        assert_eq!(p.due(1_000_000) - p.start, Duration::from_secs(1));
        assert_eq!(p.due(500) - p.start, Duration::from_micros(500));
    }
}
