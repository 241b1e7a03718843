//! What work cost in CPU: a thread's or a process's CPU time, and its
//! cost over a span and a volume, as iperf3 and netperf report it.
//!
//! Why a share: a server's receive threads serve every peer at once, so
//! their CPU over one session's span is not that session's. Splitting it
//! exactly would need the CPU clock read per batch (a syscall per batch on
//! the hot path); the threads' datagram count is free, so a session gets
//! the part of the whole that its datagrams were of all the datagrams the
//! threads handled meanwhile, and the report says it is a share
//! ([`SharedCpu`]).

use std::time::Duration;

use super::MIN_RATE_SPAN;

/// Per-GB figures only over at least this many bytes: below it a run's
/// fixed costs (the threads' start, the End exchange) dominate, and 10
/// bytes would read as 347,200 CPU-s/GB.
pub const MIN_PER_GB_BYTES: u64 = 1_000_000;

/// User and system CPU time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct CpuTime {
    pub user: Duration,
    pub system: Duration,
}

impl CpuTime {
    pub fn total(&self) -> Duration {
        self.user + self.system
    }

    /// What was used from `earlier` to `self` (never negative).
    pub fn since(&self, earlier: CpuTime) -> CpuTime {
        CpuTime {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
        }
    }

    pub fn plus(&self, other: CpuTime) -> CpuTime {
        CpuTime {
            user: self.user + other.user,
            system: self.system + other.system,
        }
    }
}

/// What some work cost in CPU, as iperf3 and netperf report it.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct CpuCost {
    /// User and system CPU seconds (absent when only the total is known).
    pub user_seconds: Option<f64>,
    pub system_seconds: Option<f64>,
    pub seconds: f64,
    /// `seconds` over the wall-clock span, in % of one core (can pass 100
    /// with several threads); null under [`MIN_RATE_SPAN`].
    #[serialize_always]
    pub percent_of_core: Option<f64>,
    /// CPU seconds per 10^9 payload bytes moved (netperf's service demand,
    /// per GB); null under [`MIN_PER_GB_BYTES`].
    #[serialize_always]
    pub seconds_per_gb: Option<f64>,
    /// Set when the CPU was spent for other peers too: the figures above
    /// are then this session's share of it (see the module docs).
    pub shared: Option<SharedCpu>,
}

/// The whole of a CPU figure that was shared with other peers, and the
/// share that was taken as this session's.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SharedCpu {
    /// The receive threads' whole CPU over the session's span.
    pub whole_seconds: f64,
    /// Other peers whose datagrams the threads handled in that span.
    pub other_peers: u64,
    /// This session's datagrams over all that the threads handled then:
    /// the part of `whole_seconds` given as the session's.
    pub share: f64,
}

impl CpuCost {
    /// The cost of `cpu` spent over `span` moving `bytes`.
    pub fn of(cpu: CpuTime, span: Duration, bytes: u64) -> Self {
        Self::of_total(cpu.total(), span, bytes).with_split(cpu)
    }

    /// The same when only the total CPU time is known.
    pub fn of_total(total: Duration, span: Duration, bytes: u64) -> Self {
        let seconds = total.as_secs_f64();
        CpuCost {
            user_seconds: None,
            system_seconds: None,
            seconds,
            percent_of_core: (span >= MIN_RATE_SPAN).then(|| seconds * 100.0 / span.as_secs_f64()),
            seconds_per_gb: (bytes >= MIN_PER_GB_BYTES).then(|| seconds / (bytes as f64 / 1e9)),
            shared: None,
        }
    }

    /// This session's share of a cost that served `other_peers` more:
    /// `own` of the `handled` datagrams the threads took in meanwhile were
    /// its own. Every figure scales by that share; a cost that served no
    /// one else stays whole.
    pub fn shared_by(self, own: u64, handled: u64, other_peers: u64) -> Self {
        let handled = handled.max(own);
        let share = if handled == 0 {
            0.0
        } else {
            own as f64 / handled as f64
        };
        self.with_share(share, other_peers)
    }

    /// The part `share` (0–1) of this cost, which served `other_peers`
    /// more; alone, the extra datagrams were its own (duplicates,
    /// control), and the whole is its own.
    pub fn with_share(self, share: f64, other_peers: u64) -> Self {
        if other_peers == 0 {
            return self;
        }
        let share = share.clamp(0.0, 1.0);
        let scale = |x: f64| x * share;
        CpuCost {
            user_seconds: self.user_seconds.map(scale),
            system_seconds: self.system_seconds.map(scale),
            seconds: scale(self.seconds),
            percent_of_core: self.percent_of_core.map(scale),
            seconds_per_gb: self.seconds_per_gb.map(scale),
            shared: Some(SharedCpu {
                whole_seconds: self.seconds,
                other_peers,
                share,
            }),
        }
    }

    /// The same, for work done by `threads` threads: at most 100 % of a
    /// core each. The CPU clock and the span are read at slightly
    /// different moments, so a short span's quotient can pass that (105 %
    /// for one thread over a last, short interval); it is capped, not shown.
    pub fn on_threads(mut self, threads: usize) -> Self {
        let most = 100.0 * threads.max(1) as f64;
        self.percent_of_core = self.percent_of_core.map(|p| p.min(most));
        self
    }

    fn with_split(mut self, cpu: CpuTime) -> Self {
        self.user_seconds = Some(cpu.user.as_secs_f64());
        self.system_seconds = Some(cpu.system.as_secs_f64());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_cost_per_core_and_per_gb() {
        let cpu = CpuTime {
            user: Duration::from_millis(300),
            system: Duration::from_millis(200),
        };
        let c = CpuCost::of(cpu, Duration::from_secs(2), 2_000_000_000);
        assert_eq!(c.seconds, 0.5);
        assert_eq!(c.percent_of_core, Some(25.0));
        assert_eq!(c.seconds_per_gb, Some(0.25));
        assert_eq!((c.user_seconds, c.system_seconds), (Some(0.3), Some(0.2)));
        let skewed = CpuCost::of_total(Duration::from_millis(105), Duration::from_millis(100), 1);
        assert_eq!(skewed.on_threads(1).percent_of_core, Some(100.0));
        assert_eq!(skewed.on_threads(2).percent_of_core, skewed.percent_of_core);
        let none = CpuCost::of_total(Duration::from_millis(5), Duration::ZERO, 0);
        assert_eq!((none.percent_of_core, none.seconds_per_gb), (None, None));
        assert_eq!(
            cpu.since(CpuTime::default()).plus(cpu).total(),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn a_shared_cost_gives_the_sessions_share_and_keeps_the_whole() {
        let cpu = CpuTime {
            user: Duration::from_millis(600),
            system: Duration::from_millis(200),
        };
        // 16 sessions of equal size, one core busy for a second.
        let whole = CpuCost::of(cpu, Duration::from_secs(1), 100_000_000);
        let own = whole.shared_by(1_000, 16_000, 15);
        assert!((own.seconds - 0.05).abs() < 1e-12, "{own:?}");
        assert!((own.user_seconds.unwrap() - 0.0375).abs() < 1e-12);
        assert!((own.percent_of_core.unwrap() - 5.0).abs() < 1e-9);
        // Its share over its own bytes: the whole over all 16 sessions'.
        assert!((own.seconds_per_gb.unwrap() - 0.5).abs() < 1e-9);
        let s = own.shared.expect("said as shared");
        assert_eq!((s.whole_seconds, s.other_peers), (0.8, 15));
        assert!((s.share - 1.0 / 16.0).abs() < 1e-12);
        // Sixteen shares add up to the whole, not to sixteen wholes.
        assert!((16.0 * own.seconds - whole.seconds).abs() < 1e-9);
        // Alone: its own, unchanged, whatever else the threads read (its
        // duplicates, its control datagrams).
        assert_eq!(whole.shared_by(1_000, 1_000, 0), whole);
        assert_eq!(whole.shared_by(1_000, 1_002, 0), whole);
        // Never more than the whole, whatever the counts say.
        assert_eq!(whole.shared_by(2_000, 1_000, 1).seconds, whole.seconds);
    }
}
