//! The server's `total` line: the receive socket(s) as a whole.
//!
//! Why: a user who points 16 clients at one server to find where its
//! buffer gives out wants one line per interval that says how many peers
//! were active, what the server absorbed in all, what its socket dropped,
//! how full its buffer ran and what the receive threads cost, not 16
//! lines to add by hand (iperf2 prints `[SUM]`).
//!
//! Why the figures are summed from the peers' own reports: the `total`
//! events of a run then add up to the sum of its peers' summaries
//! exactly, because a peer's interval lines add up to its summary and each
//! interval line is counted in exactly one `total`. The socket-wide
//! figures (every datagram read, control messages, drops, the buffer, the
//! CPU) are the growth of the server's own counters over the same span.
//!
//! A `total` follows each interval's lines while any peer is active or
//! anything arrived, and one more when the last active peer of a burst
//! finishes (`burst_end`), so a burst shorter than an interval has its
//! total too. With interval lines off, only the burst-end totals are
//! written, summed from the peers' summaries.
//!
//! Why lines cover only active time: a line that runs from the end of the
//! last burst to the middle of the next (`7.13-22.00 s 1 peer active …
//! 3 Mbit/s` for a client pacing at 150 Mbit/s) gives a rate nobody sent.
//! So the line of a burst's first interval starts at the burst's first
//! arrival, and idle time that saw only control datagrams (a client's
//! Hello and idle probes before its data) is folded into the next line
//! instead of printing `0 peers active` lines of nothing
//! ([`TotalMeter::quiet`]).

use super::ServerEvent;
use crate::meter::account::{NotProven, Totals};
use crate::stats::{self, CpuCost, CpuTime};
use serde::Serialize;
use std::time::Instant;

/// One `total` event. `docs/output.md` defines each field.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, Serialize)]
pub struct TotalReport {
    /// The span covered, in seconds since the server started.
    pub start: f64,
    pub end: f64,
    pub seconds: f64,
    /// Peers not finished at `end` that have sent data: sessions and
    /// untagged sources.
    pub peers_active: u64,
    /// Peers whose first data was counted in the span (interval lines on),
    /// and peers that finished in it.
    pub peers_started: u64,
    pub peers_finished: u64,
    /// What the peers received in the span: the sum of their interval
    /// lines' figures (or, with interval lines off, of their summaries).
    pub packets: u64,
    pub bytes: u64,
    /// `bytes` and `packets` over `seconds`; null under 1 ms.
    #[serialize_always]
    pub gbps: Option<f64>,
    #[serialize_always]
    pub pps: Option<f64>,
    /// Every datagram the server's sockets handed it in the span: the
    /// peers', their duplicates, late and overflow datagrams, and control
    /// messages (Hello, End, probes), which are also counted apart.
    pub datagrams_read: u64,
    pub control_packets: u64,
    /// Drops on the receive socket(s) in the span, in the kernel's unit
    /// (`kernel_drops_unit`), and in datagrams: counted, or an estimate
    /// whose basis `kernel_drops_basis` states. Absent where the platform
    /// does not count them.
    pub kernel_drops: Option<u64>,
    pub kernel_drops_unit: Option<&'static str>,
    pub kernel_drops_datagrams: Option<u64>,
    pub kernel_drops_basis: Option<String>,
    /// Each receive socket's buffer (SO_RCVBUF as granted) and the most
    /// any of them was seen holding in the span (SO_MEMINFO's rmem_alloc,
    /// sampled at most every millisecond while receiving); absent where
    /// the platform cannot tell.
    pub recv_buffer_bytes: u64,
    pub recv_buffer_peak_bytes: Option<u64>,
    /// The receive threads' CPU over the span.
    pub cpu: Option<CpuCost>,
    /// The last active peer finished: the end of a burst.
    pub burst_end: bool,
    /// What came from sessions never proven in the span, by reason
    /// (answered without state, or counted in bulk, never one by one),
    /// and the answers the budgets refused.
    #[serde(flatten)]
    pub not_proven: NotProven,
    pub answers_limited: u64,
}

impl TotalReport {
    /// Nothing in it but control datagrams of proven sessions (a repeated
    /// End, the last probes): no peer active, started or finished, no
    /// data, no drops, nothing unproven, no answer refused. The JSON keeps
    /// it (the totals add up to every datagram read); a text line of it
    /// would say nothing.
    pub fn says_nothing(&self) -> bool {
        self.peers_active == 0
            && self.peers_started == 0
            && self.peers_finished == 0
            && self.packets == 0
            && self.kernel_drops.unwrap_or(0) == 0
            && !self.not_proven.any()
            && self.answers_limited == 0
    }
}

/// The server counters a `total` takes the growth of.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    pub read: u64,
    pub control: u64,
    pub drops: Option<u64>,
    pub cpu: Option<CpuTime>,
    /// The whole run's arrivals so far: their growth over a span is the
    /// basis of its drops' estimate.
    pub arrivals: stats::Arrivals,
    pub not_proven: NotProven,
    pub answers_limited: u64,
}

impl Counters {
    /// The counters of the server's table now.
    pub fn of(totals: &Totals, drops: Option<u64>, cpu: Option<CpuTime>) -> Self {
        Counters {
            read: totals.packets + totals.control_packets,
            control: totals.control_packets,
            drops,
            cpu,
            arrivals: stats::Arrivals {
                datagrams: totals.packets,
                coalesced_buffers: totals.gro_buffers,
                coalesced_datagrams: Some(totals.gro_datagrams),
            },
            not_proven: totals.not_proven,
            answers_limited: totals.answers_limited,
        }
    }
}

/// What the server knows at the moment a `total` is written.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub at: Instant,
    pub active: u64,
    pub counters: Counters,
    pub buffer_peak: Option<u64>,
}

/// Sums the peers' reports between two `total` events.
#[derive(Debug)]
pub struct TotalMeter {
    epoch: Instant,
    intervals: bool,
    recv_buffer: u64,
    /// Receive threads: the CPU figure is at most a core each.
    threads: usize,
    from: Instant,
    mark: Counters,
    packets: u64,
    bytes: u64,
    started: u64,
    finished: u64,
    /// No peer was active when the last `total` was taken (or none yet):
    /// the next burst's line starts at its first arrival ...
    idle_before: bool,
    /// ... the earliest start of a peer's first interval line in the span
    /// (seconds since the epoch).
    first_arrival: Option<f64>,
}

/// Idle spans whose unproven datagrams were at most this many (a few
/// clients' Hellos) are folded into the next `total`; more (a flood of
/// forged Hellos, say) get lines of their own, interval by interval.
pub const FOLDED_UNPROVEN: u64 = 8;

impl TotalMeter {
    /// The same meter, for `threads` receive threads (1 by default).
    pub fn on_threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// A meter from `epoch` (the server's start); `intervals` when
    /// interval lines are written; `recv_buffer` as granted.
    pub fn new(epoch: Instant, intervals: bool, recv_buffer: u64, counters: Counters) -> Self {
        TotalMeter {
            epoch,
            intervals,
            recv_buffer,
            threads: 1,
            from: epoch,
            mark: counters,
            packets: 0,
            bytes: 0,
            started: 0,
            finished: 0,
            idle_before: true,
            first_arrival: None,
        }
    }

    /// Counts the peers' reports among `events`.
    pub fn observe(&mut self, events: &[ServerEvent]) {
        for event in events {
            match event {
                ServerEvent::Interval(r) if self.intervals => {
                    self.packets += r.packets;
                    self.bytes += r.bytes;
                    // A peer's first interval line covers all it has.
                    if r.total_packets == Some(r.packets) {
                        self.started += 1;
                        if let Some(start) = r.start_seconds {
                            self.first_arrival =
                                Some(self.first_arrival.map_or(start, |f| f.min(start)));
                        }
                    }
                }
                ServerEvent::PeerDone(r) => {
                    self.finished += 1;
                    if !self.intervals {
                        self.packets += r.packets;
                        self.bytes += r.bytes;
                        self.started += 1;
                    }
                }
                _ => {}
            }
        }
    }

    /// Whether the last active peer of a burst has just finished.
    pub fn burst_ended(&self, active: u64) -> bool {
        active == 0 && self.finished > 0
    }

    /// Whether a `total` now has anything to say: a peer is active, or
    /// something was counted since the last one (a control message, a
    /// drop), so that the `total` events of a run account for every
    /// datagram the server read.
    pub fn worth(&self, active: u64, counters: &Counters) -> bool {
        active > 0
            || self.packets > 0
            || self.finished > 0
            || counters.read != self.mark.read
            || counters.drops != self.mark.drops
            || counters.not_proven != self.mark.not_proven
            || counters.answers_limited != self.mark.answers_limited
    }

    /// Whether the span since the last `total` was idle but for control
    /// datagrams of proven sessions (a client's idle round-trip probes)
    /// and a few unproven ones ([`FOLDED_UNPROVEN`]): no peer active,
    /// started or finished, no data, no drops, no answer refused. Its line
    /// would say nothing; its counts go into the next one.
    pub fn quiet(&self, active: u64, counters: &Counters) -> bool {
        active == 0
            && self.packets == 0
            && self.started == 0
            && self.finished == 0
            && counters.drops == self.mark.drops
            && counters.answers_limited == self.mark.answers_limited
            && counters.not_proven.since(&self.mark.not_proven).datagrams() <= FOLDED_UNPROVEN
    }

    /// The `total` of the span since the last one, ending now; starts the
    /// next span.
    pub fn take(&mut self, now: Now, burst_end: bool) -> TotalReport {
        // A burst after idle time: its line starts at its first arrival.
        let from = match (self.idle_before, self.first_arrival) {
            (true, Some(first)) => {
                let at = self.epoch + std::time::Duration::from_secs_f64(first);
                at.clamp(self.from, now.at.max(self.from))
            }
            _ => self.from,
        };
        let span = now.at.saturating_duration_since(from);
        let c = now.counters;
        let drops = c
            .drops
            .zip(self.mark.drops)
            .map(|(n, m)| n.saturating_sub(m));
        // The span's own arrivals are the basis: drops in a span whose
        // datagrams came one by one are counted datagrams, as its peers
        // count them, whatever earlier peers' GRO did. A span where
        // nothing arrived falls back on the run's.
        let span_arrivals = c.arrivals.since(&self.mark.arrivals);
        let basis = if span_arrivals.datagrams > 0 {
            span_arrivals
        } else {
            c.arrivals
        };
        let converted = drops.map(|d| basis.drops_in_datagrams(d));
        let cpu = c
            .cpu
            .zip(self.mark.cpu)
            .map(|(n, m)| CpuCost::of(n.since(m), span, self.bytes).on_threads(self.threads));
        let since = |at: Instant| at.saturating_duration_since(self.epoch).as_secs_f64();
        let report = TotalReport {
            start: since(from),
            end: since(now.at),
            seconds: span.as_secs_f64(),
            peers_active: now.active,
            peers_started: self.started,
            peers_finished: self.finished,
            packets: self.packets,
            bytes: self.bytes,
            gbps: stats::rate_gbps(self.bytes, span),
            pps: stats::rate_per_second(self.packets, span),
            datagrams_read: c.read.saturating_sub(self.mark.read),
            control_packets: c.control.saturating_sub(self.mark.control),
            kernel_drops: drops,
            kernel_drops_unit: drops.map(|_| basis.drops_unit()),
            kernel_drops_datagrams: converted.as_ref().map(|d| d.datagrams),
            kernel_drops_basis: converted.map(|d| d.basis),
            recv_buffer_bytes: self.recv_buffer,
            recv_buffer_peak_bytes: now.buffer_peak,
            cpu,
            burst_end,
            not_proven: c.not_proven.since(&self.mark.not_proven),
            answers_limited: c.answers_limited.saturating_sub(self.mark.answers_limited),
        };
        *self = TotalMeter {
            from: now.at,
            mark: c,
            threads: self.threads,
            idle_before: now.active == 0,
            ..TotalMeter::new(self.epoch, self.intervals, self.recv_buffer, c)
        };
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::account::{PeerTable, TableConfig};
    use std::net::SocketAddr;
    use std::time::Duration;

    fn data(session: u64, seq: u64) -> Vec<u8> {
        let mut buf = vec![0u8; 200];
        let header = crate::wire::Header {
            session,
            seq,
            send_time_ns: 0,
        };
        assert!(crate::wire::write_data_header(&mut buf, &header));
        buf
    }

    /// Two peers, interval lines every 100 ms, one finishing early: the
    /// totals add up to the peers' summaries, and the burst ends once.
    #[test]
    fn totals_add_up_to_the_peers_summaries() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut table = PeerTable::new(
            TableConfig {
                intervals: true,
                idle_timeout: Duration::from_millis(250),
                ..TableConfig::default()
            },
            t0,
        );
        let a: SocketAddr = "10.0.0.1:1000".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:1000".parse().unwrap();
        // Proven sessions: only they are reported one by one.
        assert!(table.expect((a, 1), t0) && table.expect((b, 2), t0));
        let mut meter = TotalMeter::new(t0, true, 1 << 20, Counters::of(&table.totals, None, None));
        let (mut totals, mut done) = (Vec::new(), Vec::new());
        let mut seq = (0, 0);
        for step in 1..=10u64 {
            let now = ms(step * 50);
            for _ in 0..3 {
                table.on_datagram(&data(1, seq.0), a, now, 0, None);
                seq.0 += 1;
            }
            if step <= 4 {
                table.on_datagram(&data(2, seq.1), b, now, 0, None);
                seq.1 += 1;
            }
            let mut events = Vec::new();
            let mut sink = |e| events.push(ServerEvent::from(e));
            if step % 2 == 0 {
                table.tick_intervals(now, None, &mut sink);
            }
            table.expire(now, &mut sink, &mut Vec::new());
            if step == 10 {
                table.finish_all(now, &mut sink, &mut Vec::new());
            }
            meter.observe(&events);
            for e in &events {
                if let ServerEvent::PeerDone(r) = e {
                    done.push(r.packets);
                }
            }
            let active = table.active_peers() as u64;
            let counters = Counters::of(&table.totals, None, None);
            let at = Now {
                at: now,
                active,
                counters,
                buffer_peak: None,
            };
            if meter.burst_ended(active) {
                totals.push(meter.take(at, true));
            } else if step % 2 == 0 && meter.worth(active, &counters) {
                totals.push(meter.take(at, false));
            }
        }
        let summed: u64 = totals.iter().map(|t| t.packets).sum();
        assert_eq!(done.iter().sum::<u64>(), summed);
        assert_eq!(summed, seq.0 + seq.1);
        assert_eq!(totals.iter().map(|t| t.peers_started).sum::<u64>(), 2);
        assert_eq!(totals.iter().map(|t| t.peers_finished).sum::<u64>(), 2);
        assert_eq!(totals.iter().filter(|t| t.burst_end).count(), 1);
        // Every datagram read is the peers' here (no control messages).
        assert_eq!(totals.iter().map(|t| t.datagrams_read).sum::<u64>(), summed);
    }

    #[test]
    fn drops_in_gro_buffers_are_estimated_with_their_basis() {
        let t0 = Instant::now();
        let before = Counters {
            drops: Some(10),
            ..Counters::default()
        };
        let mut meter = TotalMeter::new(t0, true, 1 << 20, before);
        let mut now = before;
        now.drops = Some(1289);
        now.arrivals = stats::Arrivals {
            datagrams: 46 * 100,
            coalesced_buffers: 100,
            coalesced_datagrams: Some(46 * 100),
        };
        let t = meter.take(
            Now {
                at: t0 + Duration::from_secs(1),
                active: 3,
                counters: now,
                buffer_peak: Some(900_000),
            },
            false,
        );
        assert_eq!(t.kernel_drops, Some(1279));
        assert_eq!(t.kernel_drops_unit, Some("buffers"));
        assert_eq!(t.kernel_drops_datagrams, Some(58_834));
        assert!(t
            .kernel_drops_basis
            .unwrap()
            .contains("46.0 datagrams per buffer"));
        assert_eq!(t.recv_buffer_peak_bytes, Some(900_000));
    }

    /// Issue 41: a span whose datagrams came one by one counts its drops
    /// in datagrams, as its peers do, though earlier peers' came coalesced.
    #[test]
    fn a_span_without_gro_counts_drops_in_datagrams_whatever_came_before() {
        let t0 = Instant::now();
        let before = Counters {
            drops: Some(0),
            arrivals: stats::Arrivals {
                datagrams: 46 * 100,
                coalesced_buffers: 100,
                coalesced_datagrams: Some(46 * 100),
            },
            ..Counters::default()
        };
        let mut meter = TotalMeter::new(t0, true, 1 << 20, before);
        let mut now = before;
        now.drops = Some(263);
        now.arrivals.datagrams += 15_000;
        let t = meter.take(
            Now {
                at: t0 + Duration::from_secs(1),
                active: 1,
                counters: now,
                buffer_peak: None,
            },
            false,
        );
        assert_eq!(t.kernel_drops_unit, Some("datagrams"));
        assert_eq!(t.kernel_drops_datagrams, Some(263));
        assert_eq!(t.kernel_drops_basis.as_deref(), Some("counted"));
    }
}
