//! What the table reports: a peer's interval lines and summary
//! ([`PeerReport`]), disputed sessions, late data, and why a summary was
//! written. Nothing here counts; it reads a [`Peer`]'s figures.

use super::*;

/// A fall of the queue delay's floor smaller than this (ms) is noise,
/// not worth a word.
pub const BASELINE_DROP_SHOWN_MS: f64 = 0.05;

/// Why a peer's summary was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DoneReason {
    /// Its end-of-test message arrived (and the grace period passed).
    End,
    /// Nothing arrived for `--idle-timeout`.
    Idle,
    /// The server is stopping.
    Shutdown,
    /// A session seen only in data, whose slot a session that began with a
    /// Hello needed (the table was full).
    Evicted,
}

/// One peer's figures, for an interval line or a final summary. Optional
/// fields are left out of JSON when unknown. `docs/output.md` defines each.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, Serialize)]
pub struct PeerReport {
    pub peer: String,
    pub tagged: bool,
    pub session: Option<String>,
    /// Distinct datagrams received (duplicates are not counted again).
    pub packets: u64,
    pub bytes: u64,
    /// Summary: first to last datagram. Interval: the interval's span ...
    pub seconds: f64,
    /// ... which began this long after the table's start (the server's,
    /// or the receiving client's); absent in summaries.
    pub start_seconds: Option<f64>,
    /// Rates of what arrived after the span's start, over the span named
    /// by `rate_span`: a summary's is the longer of `seconds` and the
    /// sender's declared span (`stats::receive_span`), an interval's is
    /// `seconds`. Null only when that span is under `stats::MIN_RATE_SPAN`.
    #[serialize_always]
    pub gbps: Option<f64>,
    #[serialize_always]
    pub pps: Option<f64>,
    #[serialize_always]
    pub wire_gbps: Option<f64>,
    /// `arrivals`, `sender` or `interval`: the span the rates are over.
    pub rate_span: RateSpan,
    pub total_packets: Option<u64>,
    pub total_bytes: Option<u64>,
    pub sent_packets: Option<u64>,
    pub sent_bytes: Option<u64>,
    /// Lost datagrams (at most this many, see `lost_fewest`).
    pub lost: Option<u64>,
    /// Present only when some arrivals could not be classified: the loss is
    /// then between this and `lost`.
    pub lost_fewest: Option<u64>,
    pub loss_percent: Option<f64>,
    /// `declared` (the client's end-of-test totals) or `sequence` (estimated
    /// from the highest sequence number, when no end-of-test arrived).
    pub loss_basis: Option<&'static str>,
    pub duplicates: Option<u64>,
    pub reordered: Option<u64>,
    /// Arrivals that could not be classified as new or duplicate.
    #[serde(skip_serializing_if = "is_zero")]
    pub uncertain: u64,
    /// Datagrams whose sequence numbers the sender never sent.
    #[serde(skip_serializing_if = "is_zero")]
    pub unexpected: u64,
    pub jitter_ms: Option<f64>,
    /// How long the datagrams waited in queues beyond the fastest before
    /// them (ms; `stats::delay`): each datagram above the floor known at
    /// its arrival, the interval's in an interval line, all of them in a
    /// summary.
    pub queue_delay_ms: Option<Spread>,
    /// Summaries: how far that floor fell after the first quarter second
    /// (ms), when it did: the datagrams before measured from the higher.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_baseline_drop_ms: Option<f64>,
    /// Summaries: the floor's slope (the clocks' relative drift, ppm),
    /// when it could be estimated ...
    pub clock_skew_ppm: Option<f64>,
    /// ... and how much drift can have moved any one delay (ms) ...
    pub drift_bound_ms: Option<f64>,
    /// ... over this many datagrams.
    pub delay_samples: Option<u64>,
    /// Datagrams without a netspeed header counted in this session (a
    /// client's datagrams shorter than the header).
    #[serde(skip_serializing_if = "is_zero")]
    pub untagged_packets: u64,
    /// Drops on the server socket while this peer was active.
    #[serde(flatten)]
    pub drops: KernelDrops,
    /// Summaries: the loss split by where it happened.
    #[serde(flatten)]
    pub split: LossSplit,
    /// Buffers received that held more than one datagram (UDP GRO).
    pub gro_buffers: u64,
    /// The datagrams those buffers held.
    pub gro_datagrams: u64,
    /// Buffers the kernel cut to fit (MSG_TRUNC): should never happen.
    #[serde(skip_serializing_if = "is_zero")]
    pub truncated: u64,
    /// Transit times left out of the jitter as implausible.
    #[serde(skip_serializing_if = "is_zero")]
    pub transit_discarded: u64,
    /// The server's receive threads' CPU over this span (shared with any
    /// other peer active at the same time); absent where unknown.
    pub cpu: Option<CpuCost>,
    /// Why this session's figures are disputed: Ends with different
    /// totals, or data after an End that its total does not cover.
    pub conflict: Option<&'static str>,
    pub reason: Option<DoneReason>,
    /// The sender's End, as received: a reverse stream's client reads the
    /// server's own figures from it.
    #[serde(skip)]
    pub declared: Option<End>,
    /// The udp_client run the session belongs to (`--one-off`).
    #[serde(skip)]
    pub run: Option<wire::Run>,
}

/// Datagrams of other versions of netspeed from one source over an
/// interval: a client (or server) of another release. Each was answered
/// with the versions this one speaks.
#[derive(Debug, Clone, Serialize)]
pub struct VersionReport {
    pub peer: String,
    /// The versions it sent.
    pub versions: Vec<u8>,
    pub datagrams: u64,
    /// The versions this server speaks.
    pub speaks: Vec<u8>,
}

/// A session whose End is contradicted.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize)]
pub struct ConflictReport {
    pub peer: String,
    pub session: String,
    pub conflict: &'static str,
    /// The totals of the End the session was finalised with.
    pub sent_packets: u64,
    pub sent_bytes: u64,
    /// What contradicts them: another End's totals, or a sequence number.
    pub other_sent_packets: Option<u64>,
    pub other_sent_bytes: Option<u64>,
    pub seq: Option<u64>,
}

/// Why a session is in conflict.
pub const CONFLICT_ENDS: &str = "two End messages with different totals";
pub const CONFLICT_DATA: &str = "data after the End, beyond its total";

/// Datagrams that arrived for a session after it was finished.
#[derive(Debug, Clone, Serialize)]
pub struct LateReport {
    pub peer: String,
    pub session: String,
    /// Since the session finished, in all.
    pub late_packets: u64,
    pub late_bytes: u64,
    /// From the session's end to the latest of them.
    pub seconds_after_end: f64,
}

pub(super) fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Peer {
    /// A report of `amount` over the span from `start` to `end`, where
    /// `after_start` is the part of `amount` that arrived after `start`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn report(
        &self,
        t: Option<&Tagged>,
        amount: Amount,
        after_start: Amount,
        (span, rate_span): (Duration, RateSpan),
        shared: bool,
        cpu: Option<CpuCost>,
        reason: Option<DoneReason>,
    ) -> PeerReport {
        let figures = t.map(Tagged::figures);
        let loss = figures.and_then(|f| f.loss);
        PeerReport {
            peer: self.addr.to_string(),
            tagged: t.is_some(),
            session: t.map(|t| format!("{:016x}", t.session)),
            packets: amount.packets,
            bytes: amount.bytes,
            seconds: span.as_secs_f64(),
            start_seconds: None,
            gbps: stats::rate_gbps(after_start.bytes, span),
            pps: stats::rate_per_second(after_start.packets, span),
            wire_gbps: stats::rate_gbps(after_start.wire, span),
            rate_span,
            total_packets: None,
            total_bytes: None,
            sent_packets: t.and_then(|t| t.declared.map(|d| d.sent_packets)),
            sent_bytes: t.and_then(|t| t.declared.map(|d| d.sent_bytes)),
            declared: t.and_then(|t| t.declared),
            run: t.and_then(|t| t.run),
            lost: loss.map(|l| l.most),
            lost_fewest: loss.filter(|l| l.fewest != l.most).map(|l| l.fewest),
            loss_percent: loss.map(|l| percent(l.most, l.expected)),
            loss_basis: loss.map(|l| l.basis),
            duplicates: figures.map(|f| f.duplicates),
            reordered: figures.map(|f| f.reordered),
            uncertain: figures.map_or(0, |f| f.uncertain),
            unexpected: figures.map_or(0, |f| f.unexpected),
            jitter_ms: t.map(|t| t.jitter.nanos() / 1e6),
            queue_delay_ms: None,
            clock_skew_ppm: None,
            drift_bound_ms: None,
            delay_samples: None,
            queue_baseline_drop_ms: None,
            untagged_packets: t.map_or(0, |t| t.untagged_packets),
            drops: KernelDrops::new(self.socket_drops(), shared, self.arrivals()),
            split: LossSplit::default(),
            gro_buffers: self.gro_buffers,
            gro_datagrams: self.gro_datagrams,
            truncated: self.truncated,
            transit_discarded: t.map_or(0, |t| t.jitter.discarded),
            cpu,
            conflict: t.and_then(|t| t.conflict),
            reason,
        }
    }

    /// The whole peer: first to last datagram; `reason` why it is done, or
    /// None while it is not.
    pub(super) fn summary(
        &self,
        t: Option<&Tagged>,
        shared: bool,
        reason: Option<DoneReason>,
        threads: usize,
    ) -> PeerReport {
        let arrivals = match self.first {
            Some(first) => self.last.saturating_duration_since(first),
            None => Duration::ZERO,
        };
        let sender = t
            .and_then(|t| t.declared)
            .map(|end| Duration::from_nanos(end.duration_ns));
        let (rate_over, rate_span) = stats::receive_span(arrivals, sender);
        let cpu = self.cpu_cost(threads);
        let mut report = self.report(
            t,
            self.total,
            self.total.minus(self.at_first),
            (rate_over, rate_span),
            shared,
            cpu,
            reason,
        );
        report.seconds = arrivals.as_secs_f64();
        report.split = stats::split_loss(report.lost.unwrap_or(0), &report.drops);
        if let Some(q) = t.and_then(|t| t.delay.run()) {
            report.queue_delay_ms = Some(q.spread);
            report.clock_skew_ppm = q.skew_ppm;
            report.drift_bound_ms = Some(q.drift_bound_ms);
            report.delay_samples = Some(q.samples);
        }
        report.queue_baseline_drop_ms = t
            .map(|t| t.delay.baseline_drop_ms())
            .filter(|&d| d >= BASELINE_DROP_SHOWN_MS);
        report
    }

    /// What arrived since the last interval line, up to `end`; None when
    /// nothing did.
    pub(super) fn interval(
        &self,
        t: Option<&Tagged>,
        (epoch, end): (Instant, Instant),
        cpu_now: Option<CpuTime>,
        shared: bool,
        threads: usize,
    ) -> Option<PeerReport> {
        let first = self.first?;
        let (start, amount, after_start, cpu_from) = match self.mark {
            Some(m) => {
                let amount = self.total.minus(m.total);
                (m.at, amount, amount, m.cpu)
            }
            None => (
                first,
                self.total,
                self.total.minus(self.at_first),
                self.cpu_start,
            ),
        };
        if amount.packets == 0 {
            return None;
        }
        let span = end.saturating_duration_since(start);
        let cpu = cpu_now.zip(cpu_from).map(|(now, from)| {
            CpuCost::of(now.since(from), span, amount.bytes).on_threads(threads)
        });
        let mut report = self.report(
            t,
            amount,
            after_start,
            (span, RateSpan::Interval),
            shared,
            cpu,
            None,
        );
        report.total_packets = Some(self.total.packets);
        report.total_bytes = Some(self.total.bytes);
        report.queue_delay_ms = t.and_then(|t| t.delay.interval());
        report.start_seconds = Some(start.saturating_duration_since(epoch).as_secs_f64());
        Some(report)
    }
}

impl PeerTable {
    /// Every unfinished peer's figures so far, as its summary would give
    /// them now (no reason: it is not done), for `--metrics`. Finished
    /// sessions' records are left out: their `peer_done` was the last word.
    pub fn live_reports(&self) -> Vec<PeerReport> {
        let live = |peer: &Peer| !peer.is_finished() && peer.total.packets > 0;
        let threads = self.cfg.sockets;
        let sessions = self
            .tagged
            .peers()
            .filter(|s| live(s))
            .map(|s| s.summary(Some(&s.tagged), s.shared_now(&self.flags), None, threads));
        let sources = self
            .untagged
            .peers()
            .filter(|p| live(p))
            .map(|p| p.summary(None, p.shared_now(&self.flags), None, threads));
        sessions.chain(sources).collect()
    }

    /// A peer's last interval (when interval lines are on) and summary.
    pub(super) fn write_done(
        &self,
        peer: &Peer,
        t: Option<&Tagged>,
        reason: DoneReason,
        events: &mut dyn FnMut(Event),
    ) {
        let shared = peer.shared_now(&self.flags);
        if self.cfg.intervals {
            if let Some(report) = peer.interval(
                t,
                (self.epoch, peer.last),
                peer.cpu_end,
                shared,
                self.cfg.sockets,
            ) {
                events(Event::Interval(report));
            }
        }
        events(Event::Done(peer.summary(
            t,
            shared,
            Some(reason),
            self.cfg.sockets,
        )));
    }
}

/// The session's late datagrams, if some are not reported yet.
pub(super) fn late_report(peer: &Session) -> Option<LateReport> {
    let State::Finished(f) = &peer.state else {
        return None;
    };
    if !peer.tagged.proven {
        // Counted in the totals (`late_packets`), not reported one by one.
        return None;
    }
    if f.late.packets <= f.late_reported {
        return None;
    }
    let t = &peer.tagged;
    Some(LateReport {
        peer: peer.addr.to_string(),
        session: format!("{:016x}", t.session),
        late_packets: f.late.packets,
        late_bytes: f.late.bytes,
        seconds_after_end: f
            .last_late
            .map_or(0.0, |l| l.saturating_duration_since(f.at).as_secs_f64()),
    })
}
