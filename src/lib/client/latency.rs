//! Delay under load, for every run: round-trip probes before and during
//! the load ([`probed`]), and each direction's figures as the report shows
//! them ([`Latency`]).
//!
//! The probes run beside any load (an upload, a reverse stream, both),
//! and the queue delay comes from whichever end received (the server's
//! answer for an upload, this client's own count for a reverse stream).

use super::rtt::{self, Phases, RttRecord, Target};
use super::verdict::Verdict;
use super::RunReport;
use crate::config::ClientConfig;
use crate::error::Result;
use crate::shutdown::Shutdown;
use crate::stats::delay::{QueueFigures, RoundTripFigures, Spread};
use serde::Serialize;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Loaded round trips at least this many times the idle one ...
pub const BLOAT_FACTOR: f64 = 4.0;
/// ... and at least this much longer, in ms, mean a queue filled.
pub const BLOAT_MIN_MS: f64 = 5.0;

/// One direction's delay under load, as `streams[].latency` shows it.
/// `docs/output.md` defines each figure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Latency {
    /// The probes' median round trip before the load.
    pub idle_rtt_ms: Option<f64>,
    pub loaded_rtt_ms: Option<Spread>,
    /// How long this direction's data waited in queues beyond its fastest
    /// datagram.
    pub queue_delay_ms: Option<Spread>,
    pub delay_samples: u64,
    /// How far the queue delay's floor fell after the first quarter
    /// second, when it did and this client measured it (reverse streams).
    pub queue_baseline_drop_ms: Option<f64>,
    pub clock_skew_ppm: Option<f64>,
    pub drift_bound_ms: f64,
    pub probes_sent: u64,
    pub probes_lost: u64,
    /// Round trips per minute under load (60 s over the loaded median).
    pub rpm: Option<f64>,
    /// The STAMP reflector that answered the probes (`--stamp-reflector`);
    /// null: udp_server did.
    pub stamp_reflector: Option<std::net::SocketAddr>,
    /// Where the receiver's arrival times came from: `kernel` (its receive
    /// timestamps) or `read` (when the datagrams were read); null without
    /// a queue delay.
    pub arrival_times: Option<&'static str>,
}

/// What `arrival_times` says for a receiver that did (or did not) have the
/// kernel's receive timestamps.
pub fn arrival_times(kernel: bool) -> &'static str {
    if kernel {
        "kernel"
    } else {
        "read"
    }
}

impl Latency {
    pub fn new(queue: Option<QueueFigures>, rtt: Option<&RoundTripFigures>) -> Latency {
        Latency {
            queue_delay_ms: queue.map(|q| q.spread),
            delay_samples: queue.map_or(0, |q| q.samples),
            clock_skew_ppm: queue.and_then(|q| q.skew_ppm),
            drift_bound_ms: queue.map_or(0.0, |q| q.drift_bound_ms),
            ..Latency::default()
        }
        .with_round_trips(rtt)
    }

    /// The same queue delay, with the probes' round trips.
    pub fn with_round_trips(self, rtt: Option<&RoundTripFigures>) -> Latency {
        Latency {
            idle_rtt_ms: rtt.and_then(|r| r.idle_rtt_ms),
            loaded_rtt_ms: rtt.and_then(|r| r.loaded_rtt_ms),
            probes_sent: rtt.map_or(0, |r| r.probes_sent),
            probes_lost: rtt.map_or(0, |r| r.probes_lost),
            rpm: rtt.and_then(|r| r.rpm),
            stamp_reflector: rtt.and_then(|r| r.stamp_reflector),
            ..self
        }
    }

    /// The same, saying where the queue delay's arrival times came from.
    pub fn with_arrival(self, kernel: bool) -> Latency {
        Latency {
            arrival_times: self.queue_delay_ms.map(|_| arrival_times(kernel)),
            ..self
        }
    }

    /// What the queue did, in words, when the probes can tell: a sentence
    /// for the verdict. None without idle and loaded round trips.
    pub fn queue_words(&self) -> Option<String> {
        let loaded = self.loaded_rtt_ms?.p50;
        // Without an idle phase (--idle-probe 0) there is nothing to
        // compare with.
        let idle = self.idle_rtt_ms?;
        if bloated(idle, loaded) {
            Some(format!(
                "a queue on the path filled: round trip rose from {} idle to {} under load (bufferbloat)",
                ms(idle),
                ms(loaded)
            ))
        } else {
            Some(format!(
                "the queue stayed short: round trip {} idle, {} under load",
                ms(idle),
                ms(loaded)
            ))
        }
    }
}

/// Whether a loaded round trip of `loaded` ms over an idle one of `idle`
/// means a queue filled.
pub fn bloated(idle: f64, loaded: f64) -> bool {
    loaded > idle * BLOAT_FACTOR && loaded - idle >= BLOAT_MIN_MS
}

/// A delay in words: `0.31 ms`, `98 ms`.
pub fn ms(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0} ms")
    } else if v >= 1.0 {
        format!("{v:.1} ms")
    } else {
        format!("{v:.2} ms")
    }
}

/// Gives an upload's report the probes' round trips, and its verdict
/// what the queue did.
pub fn attach_upload(report: &mut RunReport, record: &RttRecord) {
    report.rtt = record.figures;
    let latency = Latency::new(
        report.server.as_ref().and_then(|v| v.queue),
        record.figures.as_ref(),
    );
    speak_of_the_queue(&mut report.limited_by, &latency);
}

/// Adds what the queue did to a verdict's words (its cause stays: the
/// queue is where the wait was, not what capped the rate).
pub fn speak_of_the_queue(verdict: &mut Verdict, latency: &Latency) {
    if let Some(words) = latency.queue_words() {
        if !verdict.text.contains(&words) {
            verdict.text = format!("{}; {words}", verdict.text);
        }
    }
}

/// Runs `load` with round-trip probes beside it: probes alone for
/// `cfg.idle_probe` first, then with the load, then a short last wait for
/// their answers. The probes go to `--stamp-reflector` when given, else to
/// the server; without either to answer (`--no-server`), the load runs
/// alone.
pub fn probed<T>(
    cfg: &ClientConfig,
    shutdown: &Shutdown,
    load: impl FnOnce() -> Result<T>,
) -> Result<(T, RttRecord)> {
    let target = match &cfg.stamp_probes {
        Some(stamp) => Target::Stamp(stamp),
        None if cfg.no_server => return Ok((load()?, RttRecord::default())),
        None => Target::Server(cfg.server),
    };
    let socket = rtt::open(&target, cfg.bind)?;
    let phases = Phases::default();
    std::thread::scope(|scope| {
        let prober = scope.spawn(|| rtt::run(&socket, &target, &phases));
        let until = Instant::now() + cfg.idle_probe;
        while Instant::now() < until && !shutdown.is_triggered() {
            std::thread::sleep(
                until
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(20)),
            );
        }
        phases.loaded.store(true, Ordering::Release);
        let result = load();
        phases.done.store(true, Ordering::Release);
        let record = prober.join().unwrap_or_default();
        result.map(|r| (r, record))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_words_follow_the_rule() {
        let at = |idle: Option<f64>, loaded: f64| Latency {
            idle_rtt_ms: idle,
            loaded_rtt_ms: Some(Spread {
                p50: loaded,
                p90: loaded,
                p99: loaded,
                max: loaded,
            }),
            ..Latency::default()
        };
        let filled = at(Some(0.3), 98.0).queue_words().unwrap();
        assert_eq!(
            filled,
            "a queue on the path filled: round trip rose from 0.30 ms idle to 98 ms under load (bufferbloat)"
        );
        for (idle, loaded, starts, why) in [
            (0.3, 4.0, "the queue stayed short", "under 5 ms more"),
            (20.0, 70.0, "the queue stayed short", "under 4 times"),
            (20.0, 90.0, "a queue on the path filled", "both"),
        ] {
            let words = at(Some(idle), loaded).queue_words().unwrap();
            assert!(words.starts_with(starts), "{why}: {words}");
        }
        assert_eq!(Latency::default().queue_words(), None);
        assert_eq!(at(None, 98.0).queue_words(), None, "no idle phase");
    }
}
