//! Pacing to a target rate, and the back-off used when the local queue is
//! full.
//!
//! Why pacing by schedule rather than by sleeping a fixed gap per datagram:
//! each datagram's send time is computed from the bytes sent before it, so
//! sleep overshoot in one gap is made up in the next and the average rate
//! stays on target over the whole run.
//!
//! Why release in batches at timer granularity instead of spinning to each
//! datagram's exact time: a spinning sender burns a core at any rate, and
//! several of them on one host starve the receiver and cause the very loss
//! they report. [`Pacer::release`] says, for the time it is asked, either
//! how many datagrams are due (send them as one batch) or until when to
//! sleep. Between two releases it sleeps at least one [`QUANTUM`], so a
//! fast sender wakes 2000 times a second, not once per datagram. The cost
//! is a burst: at most the datagrams due in [`QUANTUM`] plus [`MAX_DEBT`]
//! (see [`Pacer::burst_bound`]) go back to back, so datagrams of one burst
//! arrive up to that much earlier than their exact schedule. A slow sender
//! (gaps longer than the quantum) still sends each datagram at its time.
//!
//! A thread that sends many streams (`udp_client -P N`) keeps one
//! [`Schedule`] of when each is next due, and sleeps once for all of
//! them: its wakes are bounded by the quantum, not by the number of
//! streams.

use crate::shutdown::Shutdown;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

/// The longest the pacer sleeps before it looks at the shutdown flag.
pub const WAKE: Duration = Duration::from_millis(50);

/// The shortest time between two releases (the batch timer): half of
/// iperf3's default `--pacing-timer`, so that a 100 ms window is within
/// 1 % of the rate.
pub const QUANTUM: Duration = Duration::from_micros(500);
/// How far behind schedule the pacer catches up in one burst; a sender
/// that was held up longer (descheduled, a full queue) forgives the rest
/// instead of sending it all at once.
pub const MAX_DEBT: Duration = Duration::from_millis(2);

/// With `--precise-pacing`: below this much time ahead of schedule, spin
/// instead of sleeping, since the OS's sleep granularity would overshoot.
const SPIN_BELOW: Duration = Duration::from_micros(200);

/// What the pacer says when asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Send this many datagrams now (at least 1), as one batch.
    Send(u64),
    /// Nothing is due: sleep until then.
    Wait(Instant),
}

/// Sends at most `rate_bps` payload bits per second, on average from the
/// first release. Pure: it reads no clock of its own.
#[derive(Debug, Clone)]
pub struct Pacer {
    rate_bps: u128,
    /// One datagram at its exact time, and spin for the last 200 µs.
    precise: bool,
    start: Option<Instant>,
    /// Lateness forgiven so far: the schedule moved this much later.
    forgiven: Duration,
    last_release: Option<Instant>,
}

impl Pacer {
    pub fn new(rate_bps: u64, precise: bool) -> Self {
        Pacer {
            rate_bps: u128::from(rate_bps.max(1)),
            precise,
            start: None,
            forgiven: Duration::ZERO,
            last_release: None,
        }
    }

    /// The rate it paces at, bit/s.
    pub fn rate_bps(&self) -> u64 {
        self.rate_bps.min(u128::from(u64::MAX)) as u64
    }

    /// Paces at `rate_bps` from `now` on, `sent_bytes` having been sent:
    /// the schedule is laid anew so that what was sent at the old rate is
    /// neither owed nor forgiven (a sender told to slow down does not
    /// send a burst to catch up, nor pause to pay back).
    pub fn set_rate(&mut self, rate_bps: u64, now: Instant, sent_bytes: u64) {
        self.rate_bps = u128::from(rate_bps.max(1));
        // Where `sent_bytes` falls on the new schedule is `now`.
        self.forgiven = Duration::ZERO;
        self.start = Some(now.checked_sub(self.offset(sent_bytes)).unwrap_or(now));
    }

    /// Time the schedule moved later because the sender fell behind by
    /// more than [`MAX_DEBT`].
    pub fn forgiven(&self) -> Duration {
        self.forgiven
    }

    /// Where `bytes` payload bytes take the schedule, from its start.
    fn offset(&self, bytes: u64) -> Duration {
        let ns = u128::from(bytes) * 8 * 1_000_000_000 / self.rate_bps;
        Duration::from_nanos(ns.min(u128::from(u64::MAX)) as u64)
    }

    /// Payload bytes the schedule allows by `elapsed` since its start.
    fn allowed(&self, elapsed: Duration) -> u64 {
        let bytes = elapsed.as_nanos() * self.rate_bps / 8 / 1_000_000_000;
        bytes.min(u128::from(u64::MAX)) as u64
    }

    /// The most datagrams of `size` bytes one release can say.
    pub fn burst_bound(&self, size: usize) -> u64 {
        if self.precise {
            return 1;
        }
        self.allowed(QUANTUM + MAX_DEBT) / size.max(1) as u64 + 1
    }

    /// When the datagram after `sent_bytes` is due (the first release
    /// starts the schedule).
    #[cfg(test)]
    pub fn due(&self, sent_bytes: u64) -> Option<Instant> {
        Some(self.start? + self.forgiven + self.offset(sent_bytes))
    }

    /// At `now`, with `sent_bytes` sent so far in datagrams of `size`:
    /// how many to send now, or until when to sleep.
    pub fn release(&mut self, now: Instant, sent_bytes: u64, size: usize) -> Release {
        let start = *self.start.get_or_insert(now);
        let due = start + self.forgiven + self.offset(sent_bytes);
        if due > now {
            let wake = match self.last_release {
                // At most one release per quantum: a fast sender batches.
                Some(last) if !self.precise => due.max(last + QUANTUM),
                _ => due,
            };
            return Release::Wait(wake);
        }
        // What fell due while the last batch went out waits for the next
        // quantum; what was due at the last release (more than one call
        // could take) goes now.
        if let Some(last) = self.last_release {
            if !self.precise && due > last && now < last + QUANTUM {
                return Release::Wait(last + QUANTUM);
            }
        }
        if now - due > MAX_DEBT {
            self.forgiven += now - due - MAX_DEBT;
        }
        self.last_release = Some(now);
        if self.precise {
            return Release::Send(1);
        }
        let elapsed = now.saturating_duration_since(start + self.forgiven);
        let ahead = self.allowed(elapsed).saturating_sub(sent_bytes);
        let count = ahead / size.max(1) as u64 + 1;
        Release::Send(count.min(self.burst_bound(size)))
    }
}

/// Sleeps until `wake`: in slices of at most [`WAKE`], so that a signal
/// ends it at once; with `precise` pacing, spinning through the last
/// 200 µs. False when `shutdown` came first.
pub fn sleep_until(wake: Instant, precise: bool, shutdown: &Shutdown) -> bool {
    loop {
        if shutdown.is_triggered() {
            return false;
        }
        let now = Instant::now();
        if now >= wake {
            return true;
        }
        let ahead = wake - now;
        if !precise {
            std::thread::sleep(ahead.min(WAKE));
        } else if ahead > SPIN_BELOW {
            std::thread::sleep((ahead - SPIN_BELOW / 2).min(WAKE));
        } else {
            std::hint::spin_loop();
        }
    }
}

/// When each of one thread's streams is next due, so that the thread
/// sleeps once for all of them: it wakes for the earliest, and serves
/// every stream due by then.
///
/// Why a floor of one [`QUANTUM`] between two wakes: each [`Pacer`]
/// already releases a fast stream at most once per quantum, but a thousand
/// slow streams, each due at its own time, would wake the thread a
/// hundred thousand times a second. Held to one wake per quantum, a
/// stream is served at most a quantum late, which its pacer's cumulative
/// schedule makes up in the next release (lateness below [`MAX_DEBT`] is
/// never forgiven), so each stream's rate holds and the thread wakes at
/// most 2000 times a second, however many streams it serves. Precise
/// pacing has no floor: each datagram at its time. Pure: it reads no
/// clock of its own.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// (due, order of entry, stream): equal times are served in the order
    /// they were entered, so unpaced streams take turns.
    due: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    entered: u64,
    floor: Duration,
    last_served: Option<Instant>,
}

/// What a thread does next, by its [`Schedule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Serve the streams [`Schedule::next`] put in its list, in order.
    Serve,
    /// Nothing is due: sleep until then.
    Sleep(Instant),
    /// No stream is left.
    Idle,
}

impl Schedule {
    /// For streams paced in batches (`precise` false: a floor of one
    /// [`QUANTUM`] between wakes) or each datagram at its time.
    pub fn new(precise: bool) -> Self {
        Schedule {
            due: BinaryHeap::new(),
            entered: 0,
            floor: if precise { Duration::ZERO } else { QUANTUM },
            last_served: None,
        }
    }

    /// Stream `stream` is next due at `at` (an unpaced stream that has
    /// more to send: now). A stream that is done is simply not entered.
    pub fn at(&mut self, stream: usize, at: Instant) {
        self.entered += 1;
        self.due.push(Reverse((at, self.entered, stream)));
    }

    /// Streams still entered.
    pub fn len(&self) -> usize {
        self.due.len()
    }

    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }

    /// At `now`: takes every stream due by then into `serve` (cleared
    /// first), earliest first, or says until when to sleep.
    pub fn next(&mut self, now: Instant, serve: &mut Vec<usize>) -> Next {
        serve.clear();
        let Some(&Reverse((earliest, _, _))) = self.due.peek() else {
            return Next::Idle;
        };
        let wake = match self.last_served {
            Some(last) if earliest > last => earliest.max(last + self.floor),
            _ => earliest,
        };
        if wake > now {
            return Next::Sleep(wake);
        }
        while let Some(&Reverse((at, _, stream))) = self.due.peek() {
            if at > now {
                break;
            }
            self.due.pop();
            serve.push(stream);
        }
        self.last_served = Some(now);
        Next::Serve
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
    fn a_new_rate_neither_owes_nor_forgives_what_was_sent() {
        let t0 = Instant::now();
        // 8 Mbit/s: a byte a microsecond.
        let mut p = Pacer::new(8_000_000, true);
        assert!(matches!(p.release(t0, 0, 1000), Release::Send(1)));
        assert_eq!(p.due(1000), Some(t0 + Duration::from_micros(1000)));
        // 3 ms later, 1000 bytes sent (the sender was slow), the rate
        // halves: the next byte is due now, and 500 more take a ms.
        let now = t0 + Duration::from_millis(3);
        p.set_rate(4_000_000, now, 1000);
        assert_eq!(p.rate_bps(), 4_000_000);
        assert_eq!(p.due(1000), Some(now));
        assert_eq!(p.due(1500), Some(now + Duration::from_millis(1)));
    }

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

    /// A sender on a fake clock whose sleeps overshoot by up to
    /// `slack`; returns the send time of each datagram and the number of
    /// sleeps and releases.
    fn simulate(rate: u64, size: usize, seconds: f64, slack_ns: u64) -> (Vec<Instant>, u64, u64) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut pacer = Pacer::new(rate, false);
        let (mut sent, mut sends, mut sleeps, mut releases) = (0u64, Vec::new(), 0, 0);
        let end = t0 + Duration::from_secs_f64(seconds);
        let mut noise = 12345u64;
        while now < end {
            match pacer.release(now, sent, size) {
                Release::Send(n) => {
                    assert!(n >= 1 && n <= pacer.burst_bound(size));
                    releases += 1;
                    for _ in 0..n {
                        sends.push(now);
                        sent += size as u64;
                    }
                    // A batch takes a little time to hand over.
                    now += Duration::from_nanos(500 * n);
                }
                Release::Wait(t) => {
                    assert!(t > now, "a wait is always for later");
                    sleeps += 1;
                    noise = noise
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    now = t + Duration::from_nanos((noise >> 33) % (slack_ns + 1));
                }
            }
        }
        (sends, sleeps, releases)
    }

    #[test]
    fn the_rate_holds_within_1_percent_over_any_100_ms_window() {
        // From 1 Mbit/s to 10 Gbit/s, timers up to 100 µs late.
        for (rate, size) in [
            (1_000_000u64, 1400usize),
            (10_000_000, 1400),
            (100_000_000, 1400),
            (1_000_000_000, 1400),
            (1_000_000_000, 8972),
            (10_000_000_000, 1472),
            (10_000_000_000, 65000),
        ] {
            let seconds = if rate < 10_000_000 { 4.0 } else { 1.0 };
            let (sends, _, _) = simulate(rate, size, seconds, 100_000);
            // Every window of at least 100 ms and 100 datagrams, starting
            // at each of 50 points: bytes sent in it against the target.
            let span = Duration::from_millis(100).max(Duration::from_secs_f64(
                100.0 * size as f64 * 8.0 / rate as f64,
            ));
            let t0 = sends[0];
            let last = *sends.last().unwrap();
            // A window's count is a whole number of datagrams: even a
            // perfect pacer is off by up to one at its edges.
            let expected = span.as_secs_f64() * rate as f64 / 8.0 / size as f64;
            for k in 0..50u32 {
                let from = t0 + (last - t0 - span).mul_f64(f64::from(k) / 50.0);
                let to = from + span;
                let n = sends.iter().filter(|&&t| t >= from && t < to).count() as f64;
                assert!(
                    (n - expected).abs() <= 0.01 * expected + 1.0,
                    "{rate} bit/s, {size} B, window {k}: {n} datagrams for {expected:.1}"
                );
            }
        }
    }

    #[test]
    fn it_sleeps_for_gaps_above_the_quantum_and_batches_below() {
        // 1400 B at 1 Mbit/s: 11.2 ms apart. Every datagram is a release of
        // one, after a sleep: never a spin.
        let (sends, sleeps, releases) = simulate(1_000_000, 1400, 1.0, 50_000);
        assert_eq!(releases as usize, sends.len());
        assert!(sleeps >= releases - 1, "a sleep before every release");
        // 1400 B at 1 Gbit/s: 89,000 datagrams a second, but at most one
        // release per quantum (2000 a second, plus catch-ups).
        let (sends, sleeps, releases) = simulate(1_000_000_000, 1400, 1.0, 50_000);
        assert!(sends.len() > 88_000, "{}", sends.len());
        assert!(
            releases <= 2100,
            "{releases} releases for {} datagrams",
            sends.len()
        );
        assert!(sleeps <= releases + 1);
    }

    #[test]
    fn bursts_are_bounded_and_a_long_stall_is_forgiven() {
        let t0 = Instant::now();
        let mut pacer = Pacer::new(1_000_000_000, false);
        assert_eq!(pacer.release(t0, 0, 1400), Release::Send(1));
        // Held up for 50 ms: it catches up at most MAX_DEBT, not 50 ms.
        let later = t0 + Duration::from_millis(50);
        let Release::Send(n) = pacer.release(later, 1400, 1400) else {
            panic!("behind schedule")
        };
        // 1 Gbit/s over MAX_DEBT (2 ms) is 250,000 bytes: 179 datagrams.
        assert_eq!(n, 179);
        // A release is at most QUANTUM + MAX_DEBT (2.5 ms) worth: 224.
        assert_eq!(pacer.burst_bound(1400), 224);
        assert!(pacer.forgiven() >= Duration::from_millis(47));
        // Precise pacing releases one datagram at a time.
        let mut precise = Pacer::new(1_000_000_000, true);
        assert_eq!(precise.burst_bound(1400), 1);
        assert_eq!(precise.release(t0, 0, 1400), Release::Send(1));
        assert_eq!(precise.release(later, 1400, 1400), Release::Send(1));
    }

    #[test]
    fn one_wake_serves_every_stream_then_due() {
        let t0 = Instant::now();
        let ms = |m: f64| t0 + Duration::from_secs_f64(m / 1e3);
        let mut s = Schedule::new(false);
        let mut serve = Vec::new();
        assert_eq!(s.next(t0, &mut serve), Next::Idle);
        s.at(0, ms(1.0));
        s.at(1, ms(3.0));
        s.at(2, ms(1.2));
        // Nothing due: one sleep, until the earliest.
        assert_eq!(s.next(t0, &mut serve), Next::Sleep(ms(1.0)));
        assert!(serve.is_empty());
        // Woken late: both streams due by then, earliest first; not the
        // one due at 3 ms.
        assert_eq!(s.next(ms(1.3), &mut serve), Next::Serve);
        assert_eq!(serve, [0, 2]);
        assert_eq!(s.len(), 1);
        // A stream due 0.1 ms after a wake waits for the quantum: one wake
        // per quantum, however many streams.
        s.at(0, ms(1.4));
        assert_eq!(s.next(ms(1.35), &mut serve), Next::Sleep(ms(1.3) + QUANTUM));
        assert_eq!(s.next(ms(1.8), &mut serve), Next::Serve);
        assert_eq!(serve, [0]);
        // Precise pacing has no floor.
        let mut p = Schedule::new(true);
        p.at(0, t0);
        assert_eq!(p.next(t0, &mut serve), Next::Serve);
        p.at(0, ms(0.01));
        assert_eq!(p.next(t0, &mut serve), Next::Sleep(ms(0.01)));
    }

    #[test]
    fn unpaced_streams_take_turns() {
        // Entered at the time of the round that served them: all due at
        // once, and served in the order they were entered.
        let t0 = Instant::now();
        let mut s = Schedule::new(false);
        let mut serve = Vec::new();
        for i in 0..3 {
            s.at(i, t0);
        }
        let mut order = Vec::new();
        for round in 0..4u32 {
            let now = t0 + Duration::from_micros(u64::from(round));
            assert_eq!(s.next(now, &mut serve), Next::Serve);
            order.extend_from_slice(&serve);
            // Stream 1 finishes after its second turn.
            for &i in &serve.clone() {
                if !(i == 1 && round >= 1) {
                    s.at(i, now);
                }
            }
        }
        assert_eq!(order, [0, 1, 2, 0, 1, 2, 0, 2, 0, 2]);
    }

    #[test]
    fn many_streams_on_one_schedule_hold_their_rates_with_few_wakes() {
        // 500 streams at 1 Mbit/s and 100 at 10 Mbit/s, 1000-byte
        // datagrams, on one thread of a fake clock whose sleeps overshoot
        // by up to 100 µs and whose sends take 2 µs each.
        let t0 = Instant::now();
        let mut now = t0;
        let rates: Vec<u64> = (0..600)
            .map(|i| if i < 500 { 1_000_000 } else { 10_000_000 })
            .collect();
        let mut pacers: Vec<Pacer> = rates.iter().map(|&r| Pacer::new(r, false)).collect();
        let mut sent = vec![0u64; rates.len()];
        let mut s = Schedule::new(false);
        for i in 0..rates.len() {
            s.at(i, t0);
        }
        let (mut sleeps, mut serve, mut noise) = (0u64, Vec::new(), 99u64);
        let end = t0 + Duration::from_secs(2);
        while now < end {
            match s.next(now, &mut serve) {
                Next::Idle => break,
                Next::Sleep(t) => {
                    sleeps += 1;
                    noise = noise
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    now = t + Duration::from_nanos((noise >> 33) % 100_001);
                }
                Next::Serve => {
                    let round = now;
                    for &i in &serve {
                        match pacers[i].release(now, sent[i], 1000) {
                            Release::Send(n) => {
                                sent[i] += 1000 * n;
                                now += Duration::from_micros(2);
                                match pacers[i].release(now, sent[i], 1000) {
                                    Release::Wait(t) => s.at(i, t),
                                    Release::Send(_) => s.at(i, round),
                                }
                            }
                            Release::Wait(t) => s.at(i, t),
                        }
                    }
                }
            }
        }
        // At most one wake per quantum, for all 600 streams.
        assert!(sleeps <= 4100, "{sleeps} sleeps in 2 s");
        let seconds = (now - t0).as_secs_f64();
        for (i, (&rate, &bytes)) in rates.iter().zip(&sent).enumerate() {
            let want = rate as f64 / 8.0 * seconds;
            assert!(
                (bytes as f64 - want).abs() <= 0.01 * want + 2000.0,
                "stream {i}: {bytes} bytes for {want:.0}"
            );
            assert_eq!(
                pacers[i].forgiven(),
                Duration::ZERO,
                "stream {i} fell behind"
            );
        }
    }

    #[test]
    fn schedule_is_cumulative() {
        let t0 = Instant::now();
        let mut p = Pacer::new(8_000_000, false); // 1 MB/s
        assert_eq!(p.release(t0, 0, 500), Release::Send(1));
        assert_eq!(p.due(1_000_000).unwrap() - t0, Duration::from_secs(1));
        assert_eq!(p.due(500).unwrap() - t0, Duration::from_micros(500));
        // 500 bytes later is due at 500 µs; asked at 100 µs: wait, but not
        // less than a quantum after the last release.
        assert_eq!(
            p.release(t0 + Duration::from_micros(100), 500, 500),
            Release::Wait(t0 + QUANTUM.max(Duration::from_micros(500)))
        );
    }
}
