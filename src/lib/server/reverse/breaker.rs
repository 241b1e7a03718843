//! A reverse stream's circuit breaker (RFC 8084): the client's Feedback
//! says what it has taken in, and a stream it keeps taking in less than
//! half of is slowed, then stopped. Pure: time and counts come in as
//! arguments.
//!
//! Why: a stream granted at a rate its path or its client cannot carry
//! only fills a queue somewhere and spends the server's work on datagrams
//! that are dropped; a sender that watches what arrives backs off, as
//! RFC 8084 asks of any unresponsive flow.

use serde::Serialize;
use std::time::{Duration, Instant};

/// The circuit breaker (RFC 8084) looks at what the client took in over
/// windows of this long ...
pub const BREAKER_WINDOW: Duration = Duration::from_millis(500);
/// ... and trips after this many windows in a row in which the client
/// took in less than half of what was sent (1.5 s of heavy loss).
pub const BREAKER_WINDOWS: u32 = 3;
/// A window counts only once this much was sent in it.
const BREAKER_LEAST_BYTES: u64 = 64 * 1024;
/// Times a stream's rate is halved before a further trip stops it.
pub const BREAKER_HALVINGS: u32 = 3;

/// A stream's circuit breaker: what the client's Feedback says it took in,
/// window by window, against what was sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Breaker {
    /// Times it slowed the stream (the first trip of an unpaced stream
    /// paces it at what the client took in; later ones halve the rate).
    pub backoffs: u32,
    /// The rate it set last, bit/s.
    pub rate_bps: Option<u64>,
    /// The share of what was sent that the client took in over the
    /// windows that tripped it, %.
    pub intake_percent: f64,
    #[serde(skip)]
    window: Option<(Instant, u64, u64)>,
    #[serde(skip)]
    bad: u32,
}

/// What a trip of the breaker does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Trip {
    /// Send at this rate from now on.
    Slow(u64),
    Stop,
}

impl Breaker {
    /// A Feedback at `now`: the stream has sent `sent` bytes, the client
    /// took in `received`; `rate` is the stream's current rate, if paced.
    pub(super) fn feedback(
        &mut self,
        now: Instant,
        sent: u64,
        received: u64,
        rate: Option<u64>,
    ) -> Option<Trip> {
        let Some((at, sent_then, received_then)) = self.window else {
            self.window = Some((now, sent, received));
            return None;
        };
        let span = now.saturating_duration_since(at);
        if span < BREAKER_WINDOW {
            return None;
        }
        self.window = Some((now, sent, received));
        let (ds, dr) = (
            sent.saturating_sub(sent_then),
            received.saturating_sub(received_then),
        );
        if ds < BREAKER_LEAST_BYTES || dr * 2 >= ds {
            self.bad = 0;
            return None;
        }
        self.bad += 1;
        if self.bad < BREAKER_WINDOWS {
            return None;
        }
        self.bad = 0;
        self.intake_percent = dr as f64 * 100.0 / ds as f64;
        if self.backoffs >= BREAKER_HALVINGS {
            return Some(Trip::Stop);
        }
        self.backoffs += 1;
        let taken_in = (dr as u128 * 8 * 1_000_000_000 / span.as_nanos().max(1)) as u64;
        let next = match rate {
            Some(r) => r / 2,
            // Unpaced: paced at what the client took in.
            None => taken_in,
        }
        .max(1);
        self.rate_bps = Some(next);
        Some(Trip::Slow(next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_breaker_slows_a_stream_its_client_cannot_take_and_then_stops_it() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut b = Breaker::default();
        // The client takes in a third of what is sent, at 90 Mbit/s:
        // 11.25 MB a second sent, 3.75 MB taken in.
        let (mut sent, mut got) = (0u64, 0u64);
        let mut step = |b: &mut Breaker, at: u64, rate: Option<u64>| {
            sent += 1_125_000;
            got += 375_000;
            b.feedback(ms(at), sent, got, rate)
        };
        assert_eq!(
            step(&mut b, 0, Some(90_000_000)),
            None,
            "the first window opens"
        );
        let mut trips = Vec::new();
        for at in (100..=1600).step_by(100) {
            if let Some(trip) = step(&mut b, at, Some(90_000_000)) {
                trips.push((at, trip));
            }
        }
        // Windows of 500 ms end at 500, 1000 and 1500 ms: three bad ones.
        assert_eq!(trips, vec![(1500, Trip::Slow(45_000_000))]);
        assert!(
            (b.intake_percent - 33.3).abs() < 0.1,
            "{}",
            b.intake_percent
        );
        // Each further 1.5 s of the same halves again, three times, then
        // stops the stream.
        let mut rate = 45_000_000;
        let mut later = Vec::new();
        for at in (1700..=8000).step_by(100) {
            match step(&mut b, at, Some(rate)) {
                Some(Trip::Slow(r)) => {
                    rate = r;
                    later.push(Trip::Slow(r));
                }
                Some(Trip::Stop) => {
                    later.push(Trip::Stop);
                    break;
                }
                None => {}
            }
        }
        assert_eq!(
            later,
            vec![Trip::Slow(22_500_000), Trip::Slow(11_250_000), Trip::Stop]
        );
        assert_eq!(b.backoffs, BREAKER_HALVINGS);
    }

    #[test]
    fn the_breaker_paces_an_unpaced_stream_at_what_its_client_takes_in() {
        let t0 = Instant::now();
        let mut b = Breaker::default();
        let mut trip = None;
        for i in 0..=15u64 {
            // 1 MB every 100 ms sent, a quarter taken in: 20 Mbit/s.
            let at = t0 + Duration::from_millis(100 * i);
            trip = trip.or(b.feedback(at, i * 1_000_000, i * 250_000, None));
        }
        assert_eq!(trip, Some(Trip::Slow(20_000_000)));
        // A client that keeps up never trips it, nor a trickle under
        // BREAKER_LEAST_BYTES a window.
        let mut ok = Breaker::default();
        let mut slow = Breaker::default();
        for i in 0..=40u64 {
            let at = t0 + Duration::from_millis(100 * i);
            assert_eq!(ok.feedback(at, i * 1_000_000, i * 990_000, None), None);
            assert_eq!(slow.feedback(at, i * 1_000, 0, Some(80_000)), None);
        }
    }
}
