//! Delay under load: the queueing delay of every data datagram, and the
//! round trips of small probes (idle, then under load).
//!
//! Why the load's own datagrams: every one carries its send time on the
//! sender's clock, and the receiver has the kernel's arrival time on its
//! own. Their difference is the one-way delay plus an unknown, constant
//! clock offset. Subtract the smallest one-way delay seen so far (the
//! floor) and the offset cancels: what remains is how long each datagram
//! waited in queues beyond the fastest datagram before it (the queue
//! delay). No clock sync, no extra packet, no extra system call.
//!
//! Why the floor *so far*, for every figure: the interval lines are
//! printed while the run goes on, so they can only use the floor known
//! then. Were the run's figures to use the run's final floor, a minimum
//! that came late (a path that got shorter, a clock that drifts down, one
//! datagram stamped oddly) would lift every earlier datagram after the
//! lines that showed them were printed, and the summary would contradict
//! its own intervals. So each datagram is measured once, from the floor
//! at its arrival, and the same value goes into its interval and into the
//! run: the run's percentiles are those of its intervals' datagrams taken
//! together. How far the floor fell after the first quarter second is
//! kept too ([`QueueDelay::baseline_drop_ms`]), for the report to say.
//!
//! Why a bound on clock drift rather than a correction: two hosts' clocks
//! run at slightly different rates (a few ppm when both follow NTP, up to
//! about 100 ppm when neither does), so the floor of the one-way delay
//! drifts by that much per second. The floor's slope is estimated from
//! the least delay in each window of the run (the lower hull, as Moon,
//! Skelly and Towsley remove skew from delay traces) and reported with the
//! error it can cause (`drift_bound_ms`); a slope steeper than any clock
//! drifts is a queue that never drained, not a clock, and is not
//! estimated. The percentiles themselves are not corrected: they come from
//! a histogram filled as the datagrams arrive, before the slope is known.
//!
//! Why histograms: the percentiles of a run of a billion datagrams come
//! from constant memory (HDR histograms, two significant digits, exact
//! below 256 µs), never from a vector that grows with the run.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Delays are kept in microseconds up to an hour (clamped beyond).
const HIGHEST_US: u64 = 3_600_000_000;
/// Two significant digits: exact to the microsecond below 256 µs, within
/// 1 % above.
const DIGITS: u8 = 2;
/// The floor is sampled once per window of arrival time, starting with
/// this long; windows double whenever [`MAX_WINDOWS`] are kept.
const FIRST_WINDOW_NS: i64 = 250_000_000;
const MAX_WINDOWS: usize = 256;
/// No clock drifts faster than this (a cheap crystal is within 100 ppm):
/// a steeper floor is a standing queue, not a clock.
pub const MAX_SKEW_PPM: f64 = 200.0;

fn histogram() -> Histogram<u32> {
    let mut h = Histogram::new_with_bounds(1, HIGHEST_US, DIGITS)
        .expect("1 us..1 h at 2 digits is a valid histogram");
    h.auto(false);
    h
}

/// Three percentiles and the largest value, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Spread {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Spread {
    /// Each figure the larger of the two: the worst either saw.
    pub fn worst(a: Spread, b: Spread) -> Spread {
        Spread {
            p50: a.p50.max(b.p50),
            p90: a.p90.max(b.p90),
            p99: a.p99.max(b.p99),
            max: a.max.max(b.max),
        }
    }

    /// The spread of one histogram of microseconds, each value shifted by
    /// `shift_us`; None when it is empty.
    fn of(h: &Histogram<u32>, shift_us: f64) -> Option<Spread> {
        if h.is_empty() {
            return None;
        }
        let at = |q: f64| (h.value_at_quantile(q) as f64 + shift_us) / 1e3;
        Some(Spread {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: (h.max() as f64 + shift_us) / 1e3,
        })
    }
}

/// The queue delays of one span of datagrams (µs above the floor, as
/// [`QueueDelay::record`] returns them): their median and 99th
/// percentile, from one histogram used span after span, allocated at the
/// first delay.
#[derive(Debug, Clone, Default)]
pub struct SpanDelays {
    h: Option<Histogram<u32>>,
}

impl SpanDelays {
    pub fn record(&mut self, us: u64, count: u64) {
        let h = self.h.get_or_insert_with(histogram);
        h.saturating_record_n(us.min(HIGHEST_US), count.clamp(1, u32::MAX as u64) as u32);
    }

    /// The span's median and 99th percentile (µs), and a new span; None
    /// when nothing was recorded since the last.
    pub fn take(&mut self) -> Option<(u64, u64)> {
        let h = self.h.as_mut().filter(|h| !h.is_empty())?;
        let figures = (h.value_at_quantile(0.5), h.value_at_quantile(0.99));
        h.reset();
        Some(figures)
    }

    /// Gives the histogram's memory back (what comes after starts anew).
    pub fn free(&mut self) {
        self.h = None;
    }
}

/// A run's queue delay: its spread, how many datagrams it covers, and
/// what clock drift may have added to it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct QueueFigures {
    #[serde(flatten)]
    pub spread: Spread,
    /// Datagrams whose delay is in the spread.
    pub samples: u64,
    /// The floor's slope, in ppm of elapsed time (the receiver's clock
    /// against the sender's); None when it could not be estimated (too
    /// short a run, or a floor that rose faster than any clock drifts).
    pub skew_ppm: Option<f64>,
    /// How much drift can have added to (or taken from) any one delay:
    /// |skew| times the run's length, in ms.
    pub drift_bound_ms: f64,
}

impl QueueFigures {
    /// The figures of several sessions (several clients) as one: each
    /// percentile the largest of theirs (the worst any session saw), the
    /// samples summed, the skew the largest in size.
    pub fn worst(a: QueueFigures, b: QueueFigures) -> QueueFigures {
        let skew = match (a.skew_ppm, b.skew_ppm) {
            (Some(x), Some(y)) => Some(if x.abs() >= y.abs() { x } else { y }),
            (x, y) => x.or(y),
        };
        QueueFigures {
            spread: Spread::worst(a.spread, b.spread),
            samples: a.samples + b.samples,
            skew_ppm: skew,
            drift_bound_ms: a.drift_bound_ms.max(b.drift_bound_ms),
        }
    }
}

/// The least one-way delay in one window of arrival time.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Floor {
    at_ns: i64,
    delay_ns: i64,
}

/// One direction's queue delay, fed one received buffer at a time.
#[derive(Debug, Clone)]
pub struct QueueDelay {
    /// The least one-way delay so far; i64::MAX before any datagram.
    floor_ns: i64,
    /// The floor when the first window of arrivals ended (None before).
    early_floor_ns: Option<i64>,
    /// Every datagram's delay above the floor known at its arrival.
    run: Option<Histogram<u32>>,
    /// The same, since the last interval.
    interval: Option<Histogram<u32>>,
    keep_intervals: bool,
    floors: Vec<Floor>,
    window_ns: i64,
    /// The arrival times the last floor's window covers, [start, end):
    /// most datagrams fall in it and need no division.
    window_span: (i64, i64),
    first_at_ns: Option<i64>,
    last_at_ns: i64,
}

impl QueueDelay {
    /// `intervals`: keep the delays since the last [`Self::take_interval`]
    /// as well (one more histogram).
    pub fn new(intervals: bool) -> Self {
        QueueDelay {
            floor_ns: i64::MAX,
            early_floor_ns: None,
            run: None,
            interval: None,
            keep_intervals: intervals,
            floors: Vec::new(),
            window_ns: FIRST_WINDOW_NS,
            window_span: (0, 0),
            first_at_ns: None,
            last_at_ns: 0,
        }
    }

    /// Records `count` datagrams sent at `send_ns` (sender's clock) that
    /// arrived at `recv_ns` (receiver's clock). The clocks' epochs are
    /// unrelated: only differences of one-way delays are used. Wrapping
    /// arithmetic: a forged send time gives a wrong delay for its own
    /// session, never a panic. Returns the value recorded for them (µs
    /// above the floor known at their arrival), the one the run's and the
    /// interval's histograms hold: a [`SpanDelays`] fed with it shares
    /// their baseline.
    pub fn record(&mut self, send_ns: u64, recv_ns: u64, count: u64) -> u64 {
        let at = recv_ns as i64;
        let delay = at.wrapping_sub(send_ns as i64);
        let first = *self.first_at_ns.get_or_insert(at);
        if self.early_floor_ns.is_none() && at.wrapping_sub(first) >= FIRST_WINDOW_NS {
            self.early_floor_ns = Some(self.floor_ns);
        }
        self.last_at_ns = self.last_at_ns.max(at);
        self.floor_ns = self.floor_ns.min(delay);
        let count = count.max(1) as u32;
        let over_floor = delay.wrapping_sub(self.floor_ns);
        let us = (over_floor.unsigned_abs().saturating_add(500) / 1000).min(HIGHEST_US);
        self.run
            .get_or_insert_with(histogram)
            .saturating_record_n(us, count);
        if self.keep_intervals {
            self.interval
                .get_or_insert_with(histogram)
                .saturating_record_n(us, count);
        }
        self.sample_floor(at, delay);
        us
    }

    /// How far the floor fell after the first quarter second of arrivals,
    /// in ms: the datagrams before the fall were measured from a floor
    /// that much higher. 0 when it did not fall (or the run was shorter).
    pub fn baseline_drop_ms(&self) -> f64 {
        match self.early_floor_ns {
            Some(early) => early.wrapping_sub(self.floor_ns).max(0) as f64 / 1e6,
            None => 0.0,
        }
    }

    fn sample_floor(&mut self, at: i64, delay: i64) {
        // The common case: the same window as the last datagram.
        if let Some(last) = self.floors.last_mut() {
            if at >= self.window_span.0 && at < self.window_span.1 {
                if delay < last.delay_ns {
                    *last = Floor {
                        at_ns: at,
                        delay_ns: delay,
                    };
                }
                return;
            }
        }
        let first_at = self.first_at_ns.unwrap_or(at);
        let window = at.wrapping_sub(first_at) / self.window_ns;
        let start = first_at.wrapping_add(window.wrapping_mul(self.window_ns));
        self.window_span = (start, start.wrapping_add(self.window_ns));
        let last_window = self
            .floors
            .last()
            .map(|f| f.at_ns.wrapping_sub(first_at) / self.window_ns);
        match self.floors.last_mut() {
            Some(last) if last_window == Some(window) => {
                if delay < last.delay_ns {
                    *last = Floor {
                        at_ns: at,
                        delay_ns: delay,
                    };
                }
            }
            _ => {
                if self.floors.len() == MAX_WINDOWS {
                    self.merge_windows();
                    return self.sample_floor(at, delay);
                }
                self.floors.push(Floor {
                    at_ns: at,
                    delay_ns: delay,
                });
            }
        }
    }

    /// Doubles the window: each pair of windows keeps its lower floor.
    fn merge_windows(&mut self) {
        self.window_ns *= 2;
        self.window_span = (0, 0);
        let first = self.first_at_ns.unwrap_or(0);
        let window = self.window_ns;
        let mut merged: Vec<Floor> = Vec::with_capacity(MAX_WINDOWS / 2 + 1);
        for f in self.floors.drain(..) {
            match merged.last_mut() {
                Some(m) if (m.at_ns - first) / window == (f.at_ns - first) / window => {
                    if f.delay_ns < m.delay_ns {
                        *m = f;
                    }
                }
                _ => merged.push(f),
            }
        }
        self.floors = merged;
    }

    /// Datagrams recorded.
    pub fn samples(&self) -> u64 {
        self.run.as_ref().map_or(0, |h| h.len())
    }

    /// The run's queue delay: each datagram's one-way delay less the floor
    /// known at its arrival, as its interval counted it. None before any
    /// datagram.
    pub fn run(&self) -> Option<QueueFigures> {
        let h = self.run.as_ref()?;
        let spread = Spread::of(h, 0.0)?;
        let skew = self.skew_ppm();
        let first = self.first_at_ns.unwrap_or(self.last_at_ns);
        let span_s = self.last_at_ns.wrapping_sub(first).max(0) as f64 / 1e9;
        Some(QueueFigures {
            spread,
            samples: h.len(),
            skew_ppm: skew,
            drift_bound_ms: skew.map_or(0.0, |s| s.abs() * 1e-6 * span_s * 1e3),
        })
    }

    /// The delays since the last call (above the floor known as each
    /// arrived), and starts a new interval. None when nothing arrived, or
    /// intervals are not kept.
    pub fn take_interval(&mut self) -> Option<Spread> {
        let h = self.interval.as_mut()?;
        let spread = Spread::of(h, 0.0);
        h.reset();
        spread
    }

    /// The delays since the last [`Self::take_interval`], without
    /// starting a new interval.
    pub fn interval(&self) -> Option<Spread> {
        Spread::of(self.interval.as_ref()?, 0.0)
    }

    /// The slope of the floor in ppm (Moon, Skelly and Towsley: the line
    /// under every window's least delay that lies closest to them all,
    /// which is the lower hull's edge over the windows' mean time). None
    /// with fewer than two windows, or a slope no clock has.
    pub fn skew_ppm(&self) -> Option<f64> {
        let points = &self.floors;
        if points.len() < 2 {
            return None;
        }
        let origin = points[0];
        let xy = |f: &Floor| {
            (
                f.at_ns.wrapping_sub(origin.at_ns) as f64,
                f.delay_ns.wrapping_sub(origin.delay_ns) as f64,
            )
        };
        let mut hull: Vec<(f64, f64)> = Vec::with_capacity(points.len());
        for p in points.iter().map(xy) {
            while hull.len() >= 2 {
                let (a, b) = (hull[hull.len() - 2], hull[hull.len() - 1]);
                // Keep only left turns (a lower hull, x increasing).
                let cross = (b.0 - a.0) * (p.1 - a.1) - (b.1 - a.1) * (p.0 - a.0);
                if cross <= 0.0 {
                    hull.pop();
                } else {
                    break;
                }
            }
            hull.push(p);
        }
        let mean_x = points.iter().map(|f| xy(f).0).sum::<f64>() / points.len() as f64;
        let edge = hull
            .windows(2)
            .find(|e| e[1].0 >= mean_x)
            .or_else(|| hull.windows(2).last())?;
        let dx = edge[1].0 - edge[0].0;
        if dx <= 0.0 {
            return None;
        }
        let ppm = (edge[1].1 - edge[0].1) / dx * 1e6;
        (ppm.abs() <= MAX_SKEW_PPM).then_some(ppm)
    }
}

/// Round trips of small probes: a short idle phase before the load, then
/// under it. Pure: the prober hands it what it sent and what came back.
#[derive(Debug, Clone)]
pub struct RoundTrips {
    idle: Histogram<u32>,
    loaded: Histogram<u32>,
    pub idle_sent: u64,
    pub loaded_sent: u64,
    /// Answers to probes sent in each phase.
    pub idle_answered: u64,
    pub loaded_answered: u64,
}

impl Default for RoundTrips {
    fn default() -> Self {
        RoundTrips {
            idle: histogram(),
            loaded: histogram(),
            idle_sent: 0,
            loaded_sent: 0,
            idle_answered: 0,
            loaded_answered: 0,
        }
    }
}

/// What the probes found, as reported.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RoundTripFigures {
    /// The median round trip before the load; None without an idle phase
    /// (or when no idle probe came back).
    pub idle_rtt_ms: Option<f64>,
    pub loaded_rtt_ms: Option<Spread>,
    pub probes_sent: u64,
    pub probes_lost: u64,
    /// Round trips per minute under load: 60 s over the loaded median.
    pub rpm: Option<f64>,
    /// The STAMP reflector the probes went to (`--stamp-reflector`); None:
    /// udp_server answered them.
    pub stamp_reflector: Option<std::net::SocketAddr>,
}

impl RoundTrips {
    pub fn sent(&mut self, loaded: bool) {
        if loaded {
            self.loaded_sent += 1;
        } else {
            self.idle_sent += 1;
        }
    }

    /// An answer to a probe sent in the idle phase or under load, after
    /// `rtt_ns`.
    pub fn answered(&mut self, loaded: bool, rtt_ns: u64) {
        let us = (rtt_ns.saturating_add(500) / 1000).min(HIGHEST_US);
        if loaded {
            self.loaded_answered += 1;
            self.loaded.saturating_record(us);
        } else {
            self.idle_answered += 1;
            self.idle.saturating_record(us);
        }
    }

    pub fn figures(&self) -> RoundTripFigures {
        const MIN_RPM_ROUND_TRIPS: u64 = 5;
        let idle = Spread::of(&self.idle, 0.0).map(|s| s.p50);
        let loaded = Spread::of(&self.loaded, 0.0);
        let sent = self.idle_sent + self.loaded_sent;
        let answered = self.idle_answered + self.loaded_answered;
        RoundTripFigures {
            idle_rtt_ms: idle,
            loaded_rtt_ms: loaded,
            probes_sent: sent,
            probes_lost: sent.saturating_sub(answered),
            // Responsiveness is a figure of a load that lasted: a run of
            // a few datagrams has too few loaded round trips to give one.
            rpm: loaded
                .filter(|l| l.p50 > 0.0 && self.loaded_answered >= MIN_RPM_ROUND_TRIPS)
                .map(|l| 60_000.0 / l.p50),
            stamp_reflector: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Feeds a datagram every `every_ns` for `secs`, with a one-way delay
    /// of `offset + queue(t) + drift * t`.
    fn feed(
        q: &mut QueueDelay,
        offset: i64,
        drift_ppm: f64,
        secs: u64,
        mut queue: impl FnMut(u64) -> u64,
    ) {
        let every = MS;
        for i in 0..secs * 1000 {
            let send = 5_000_000_000 + i * every;
            let drift = (drift_ppm * 1e-6 * (i * every) as f64) as i64;
            let recv = (send as i64 + offset + queue(i * every) as i64 + drift) as u64;
            q.record(send, recv, 1);
        }
    }

    #[test]
    fn a_constant_offset_cancels_whatever_its_sign() {
        for offset in [-3_000_000_000_000i64, 0, 17, 86_400_000_000_000] {
            let mut q = QueueDelay::new(false);
            // Half the datagrams wait 10 ms, half none.
            feed(&mut q, offset, 0.0, 2, |t| {
                if (t / MS) % 2 == 0 {
                    0
                } else {
                    10 * MS
                }
            });
            let r = q.run().unwrap();
            assert_eq!(r.samples, 2000);
            assert!(r.spread.p50 < 0.01, "{offset}: {r:?}");
            assert!((r.spread.p90 - 10.0).abs() < 0.1, "{offset}: {r:?}");
            assert!((r.spread.max - 10.0).abs() < 0.1, "{offset}: {r:?}");
            assert_eq!(r.skew_ppm, Some(0.0));
            assert_eq!(r.drift_bound_ms, 0.0);
        }
    }

    #[test]
    fn a_first_datagram_that_waited_is_measured_from_itself_and_the_rest_from_the_floor() {
        // The first datagram waited 40 ms; the rest none, then a queue
        // of 20 ms for the last fifth. The first is its own floor (0);
        // every later one is measured from the floor the second set.
        let mut q = QueueDelay::new(false);
        let mut first = true;
        feed(&mut q, 1234, 0.0, 5, |t| {
            if std::mem::take(&mut first) {
                40 * MS
            } else if t >= 4000 * MS {
                20 * MS
            } else {
                0
            }
        });
        let r = q.run().unwrap();
        assert!(r.spread.p50 < 0.01, "{r:?}");
        assert!((r.spread.p90 - 20.0).abs() < 0.2, "{r:?}");
        assert!((r.spread.max - 20.0).abs() < 0.2, "{r:?}");
        assert_eq!(q.baseline_drop_ms(), 0.0, "it fell within the first window");
    }

    /// The issue-41 case: a delay that steps down mid-run (a hold of 2 ms
    /// that stops). The run's figures are its intervals' taken together
    /// (never lifted by the late floor), and the fall is reported.
    #[test]
    fn a_late_minimum_changes_neither_the_intervals_nor_the_run_it_is_said() {
        let mut q = QueueDelay::new(true);
        let mut intervals = Vec::new();
        for i in 0..4000u64 {
            let hold = if i < 3000 { 2 * MS } else { 0 };
            q.record(i * MS, 777 + i * MS + hold, 1);
            if i % 1000 == 999 {
                intervals.push(q.take_interval().unwrap());
            }
        }
        let r = q.run().unwrap();
        for s in &intervals {
            assert!(s.p50 < 0.01 && s.max < 0.01, "{s:?}");
        }
        assert!(r.spread.max < 0.01, "no datagram waited in a queue: {r:?}");
        assert!(
            (q.baseline_drop_ms() - 2.0).abs() < 1e-6,
            "{}",
            q.baseline_drop_ms()
        );
    }

    #[test]
    fn a_drift_of_50_ppm_is_estimated_and_bounds_the_error() {
        for drift in [50.0, -50.0] {
            let mut q = QueueDelay::new(false);
            feed(&mut q, 777, drift, 10, |_| 0);
            let r = q.run().unwrap();
            let skew = r.skew_ppm.expect("estimated");
            assert!((skew - drift).abs() < 1.0, "{drift}: {r:?}");
            // 50 ppm over 10 s is 0.5 ms: what the uncorrected delays
            // can be off by. A floor that rises shows as delay; one that
            // falls moves the baseline (each datagram is its own floor).
            assert!((r.drift_bound_ms - 0.5).abs() < 0.02, "{r:?}");
            assert!(r.spread.max <= r.drift_bound_ms + 0.01, "{r:?}");
            if drift > 0.0 {
                assert!(r.spread.max > 0.45, "the drift shows: {r:?}");
            } else {
                assert!(
                    (q.baseline_drop_ms() - 0.49).abs() < 0.02,
                    "{}",
                    q.baseline_drop_ms()
                );
            }
        }
    }

    #[test]
    fn a_standing_queue_is_not_taken_for_drift() {
        // The queue fills in the first second and never drains: the floor
        // rises 100 ms in 10 s (10,000 ppm), which no clock does.
        let mut q = QueueDelay::new(false);
        feed(&mut q, 0, 0.0, 10, |t| (t / 10).min(100 * MS));
        let r = q.run().unwrap();
        assert_eq!(r.skew_ppm, None, "{r:?}");
        assert!(r.spread.p50 > 95.0, "{r:?}");
    }

    #[test]
    fn intervals_measure_from_the_floor_known_then() {
        let mut q = QueueDelay::new(true);
        assert_eq!(q.take_interval(), None);
        for i in 0..100u64 {
            q.record(i * MS, 1_000 + i * MS + if i >= 50 { 5 * MS } else { 0 }, 1);
        }
        let first = q.take_interval().unwrap();
        assert!((first.max - 5.0).abs() < 0.05, "{first:?}");
        assert_eq!(q.take_interval(), None, "reset: nothing since");
        q.record(200 * MS, 1_000 + 200 * MS + 2 * MS, 3);
        let second = q.interval().unwrap();
        assert!((second.p50 - 2.0).abs() < 0.05, "{second:?}");
        assert_eq!(q.samples(), 103);
    }

    #[test]
    fn a_span_gives_its_median_and_tail_once() {
        let mut q = QueueDelay::new(false);
        let mut span = SpanDelays::default();
        assert_eq!(span.take(), None);
        // 100 datagrams: 98 at the floor, two 40 ms later.
        for i in 0..100u64 {
            let extra = if i >= 98 { 40 * MS } else { 0 };
            let us = q.record(i * MS, 7 + i * MS + extra, 1);
            span.record(us, 1);
        }
        let (p50, p99) = span.take().unwrap();
        assert_eq!(p50, 0);
        assert!((39_500..=40_500).contains(&p99), "{p99}");
        assert_eq!(span.take(), None, "a new span: empty");
        span.record(250, 3);
        assert_eq!(span.take(), Some((250, 250)));
        span.free();
        assert_eq!(span.take(), None);
    }

    #[test]
    fn floors_stay_bounded_on_a_long_run() {
        let mut q = QueueDelay::new(false);
        for i in 0..100_000u64 {
            q.record(i * 10 * MS, i * 10 * MS + 5, 1);
        }
        assert!(q.floors.len() <= MAX_WINDOWS);
        assert_eq!(q.skew_ppm(), Some(0.0));
    }

    #[test]
    fn round_trips_give_idle_loaded_lost_and_rpm() {
        let mut r = RoundTrips::default();
        assert_eq!(r.figures().rpm, None);
        for _ in 0..20 {
            r.sent(false);
            r.answered(false, 300_000);
        }
        for i in 0..100u64 {
            r.sent(true);
            if i % 10 != 0 {
                r.answered(true, 100 * MS);
            }
        }
        let f = r.figures();
        assert!((f.idle_rtt_ms.unwrap() - 0.3).abs() < 0.01, "{f:?}");
        assert!((f.loaded_rtt_ms.unwrap().p50 - 100.0).abs() < 1.0, "{f:?}");
        assert_eq!((f.probes_sent, f.probes_lost), (120, 10));
        assert!((f.rpm.unwrap() - 600.0).abs() < 6.0, "{f:?}");
    }
}
