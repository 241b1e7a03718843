//! Request latencies on an HDR histogram: constant memory however many
//! requests a run makes, and every percentile within 0.1% of the truth
//! (three significant digits). Seed 004 kept criterion's samples; a sorted
//! `Vec` of every request would grow without bound on a long run.
//!
//! Used by `tcp_proxy bench`; it lives with the other statistics so that
//! percentiles are computed in one place. How a latency is shown (`87.3
//! us`) is `crate::output::proxy::format_us`.

use hdrhistogram::Histogram;
use serde::Serialize;
use std::time::Duration;

/// Latencies in nanoseconds, from 1 ns to 100 s.
#[derive(Debug, Clone)]
pub struct Latencies {
    hist: Histogram<u64>,
    /// Requests slower than 100 s are clamped to it and counted here.
    clamped: u64,
}

const HIGHEST_NS: u64 = 100_000_000_000;

impl Default for Latencies {
    fn default() -> Self {
        Self::new()
    }
}

impl Latencies {
    pub fn new() -> Latencies {
        Latencies {
            // Constant bounds that hdrhistogram accepts: this cannot fail.
            hist: Histogram::new_with_bounds(1, HIGHEST_NS, 3)
                .expect("1 ns..100 s at 3 digits is a valid histogram"),
            clamped: 0,
        }
    }

    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1);
        if ns > HIGHEST_NS {
            self.clamped += 1;
        }
        self.hist.saturating_record(ns.min(HIGHEST_NS));
    }

    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// The latency at quantile `q` (0 to 1; 0 is the least, 1 the most),
    /// or None when nothing was recorded.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.hist.is_empty() {
            return None;
        }
        let ns = match q {
            q if q <= 0.0 => self.hist.min(),
            q if q >= 1.0 => self.hist.max(),
            q => self.hist.value_at_quantile(q),
        };
        Some(Duration::from_nanos(ns))
    }

    /// Mean, percentiles and maximum in microseconds.
    pub fn summary(&self) -> LatencySummary {
        let us = |ns: u64| ns as f64 / 1e3;
        if self.hist.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            count: self.hist.len(),
            mean_us: self.hist.mean() / 1e3,
            p50_us: us(self.hist.value_at_quantile(0.5)),
            p99_us: us(self.hist.value_at_quantile(0.99)),
            p999_us: us(self.hist.value_at_quantile(0.999)),
            max_us: us(self.hist.max()),
            min_us: us(self.hist.min()),
        }
    }
}

/// What a row of the benchmark table shows, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub min_us: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: f64, want: f64) -> bool {
        // Three significant digits: within 0.1% (plus a rounding ulp).
        (got - want).abs() <= want * 0.001 + 0.001
    }

    #[test]
    fn percentiles_of_a_uniform_run() {
        let mut l = Latencies::new();
        for us in 1..=1000u64 {
            l.record(Duration::from_micros(us));
        }
        let s = l.summary();
        assert_eq!(s.count, 1000);
        assert!(close(s.mean_us, 500.5), "{s:?}");
        assert!(close(s.p50_us, 500.0), "{s:?}");
        assert!(close(s.p99_us, 990.0), "{s:?}");
        assert!(close(s.p999_us, 999.0), "{s:?}");
        assert!(close(s.max_us, 1000.0), "{s:?}");
        assert!(close(s.min_us, 1.0), "{s:?}");
    }

    #[test]
    fn one_outlier_shows_only_in_the_tail() {
        // 999 fast requests and one 40 ms stall: p50 and p99 stay fast, the
        // stall is visible at p99.9 and max. That is why the table has both.
        let mut l = Latencies::new();
        for _ in 0..999 {
            l.record(Duration::from_micros(50));
        }
        l.record(Duration::from_millis(40));
        let s = l.summary();
        assert!(close(s.p50_us, 50.0), "{s:?}");
        assert!(close(s.p99_us, 50.0), "{s:?}");
        assert!(
            close(s.p999_us, 50.0) || close(s.p999_us, 40_000.0),
            "{s:?}"
        );
        assert!(close(s.max_us, 40_000.0), "{s:?}");
        assert!(
            close(s.mean_us, (999.0 * 50.0 + 40_000.0) / 1000.0),
            "{s:?}"
        );
    }

    #[test]
    fn empty_and_extreme_values() {
        let l = Latencies::new();
        assert_eq!(l.summary(), LatencySummary::default());
        let mut l = Latencies::new();
        l.record(Duration::ZERO);
        l.record(Duration::from_secs(1000));
        assert_eq!(l.count(), 2);
        assert_eq!(l.clamped, 1);
        assert!(l.summary().max_us >= 99_000_000.0);
    }
}
