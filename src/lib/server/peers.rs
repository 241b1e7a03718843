//! The server's bounded table of peers: who sent what, and when they are
//! finished.
//!
//! A peer is a client session (tagged traffic, keyed by source address and
//! session id) or a source address (untagged traffic from any sender).
//! Why two tables, each bounded by `max_peers`: a flood of garbage from
//! spoofed source addresses can fill the untagged table, but it cannot take
//! a slot from a real session. Traffic that finds its table full is summed
//! in an overflow bucket, so memory stays bounded and nothing is uncounted.
//!
//! A session lives through three states:
//!
//! * **active**: data is counted;
//! * **closing**: its End arrived; data still in flight is counted for
//!   `end_grace`, then the session is finalised: its summary is written and
//!   the End answered, once, from the same figures;
//! * **finished**: a record kept long enough to answer every retry the
//!   client can still send (it says how long in its End), with its own
//!   bound. Retries are answered from the record, so every answer agrees
//!   with the summary; datagrams that arrive now are *late*, counted against
//!   the record and reported as such, never as a new peer.
//!
//! Why sessions that began with a Hello come first: every udp_client says
//! Hello, and the answer proves the session can hear us. Sessions seen only
//! in data (forged, or a sender of another kind) may hold at most half of
//! the table, and a Hello that finds the table full takes the slot of the
//! one silent longest. One source IP holds at most a quarter of the table
//! (but room for `--clients 1024`). A flood can then slow new sessions
//! down, but not lock every real client out.

use super::reverse::{Reverse, ReverseConfig};
use super::stream::StreamCaps;
use crate::auth::{CookieKey, Psk};
use crate::stats::{
    self, percent, wire_bytes, Arrival, CpuCost, CpuTime, Jitter, KernelDrops, SeqSet,
};
use crate::wire::{self, End, EndAck, Hello, HelloAck, Message};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Answers (to End and Hello) allowed per source IP per second: room for
/// `--clients 1024` on one host retrying twice within a second, while
/// bounding what a flood of forged requests can draw out.
pub const ANSWERS_PER_SECOND: u32 = 2048;

/// Sequence-number ranges (16 bytes each) the whole session table may hold;
/// each session gets an equal share, at least [`MIN_RANGES_PER_SESSION`].
pub const RANGE_BUDGET: usize = 4 << 20;
/// The least ranges a session keeps before it forgets its oldest holes.
pub const MIN_RANGES_PER_SESSION: usize = 1024;

/// A finished session's record is kept at least this long, whatever the
/// client asked for: long enough for a straggler to be recognised as late.
pub const KEEP_FINISHED_MIN: Duration = Duration::from_secs(10);
/// ... and at most this long, whatever the client asked for.
pub const KEEP_FINISHED_MAX: Duration = Duration::from_secs(600);

pub use crate::config::MAX_PEERS_LIMIT;
/// Most finished sessions' records kept, whatever `--max-peers` says.
pub const MAX_RECORDS: usize = 65536;

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

/// How the server's table is set up.
#[derive(Debug, Clone)]
pub struct TableConfig {
    /// Most sessions, and most untagged sources, tracked at once.
    pub max_peers: usize,
    pub idle_timeout: Duration,
    /// How long after an End data still in flight is counted.
    pub end_grace: Duration,
    /// Receive sockets (`--threads`).
    pub sockets: usize,
    /// UDP_GRO is on.
    pub gro: bool,
    /// What the kernel granted for SO_RCVBUF, for the Hello answer.
    pub recv_buffer: u64,
    /// Interval lines are written: the last partial interval of a peer is
    /// written before its summary, so that interval lines add up to it.
    pub intervals: bool,
    /// `--psk`: Ends must carry its tag, and answers carry it.
    pub psk: Option<Psk>,
    /// The caps on reverse streams (`--max-duration`, `--max-rate`,
    /// `--max-reverse-streams`).
    pub streams: StreamCaps,
}

impl Default for TableConfig {
    fn default() -> Self {
        TableConfig {
            max_peers: 4096,
            idle_timeout: Duration::from_secs(2),
            end_grace: Duration::from_millis(100),
            sockets: 1,
            gro: false,
            recv_buffer: 0,
            intervals: false,
            psk: None,
            streams: StreamCaps::default(),
        }
    }
}

/// One peer's figures, for an interval line or a final summary. Optional
/// fields are left out of JSON when unknown. `docs/output.md` defines each.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize)]
pub struct PeerReport {
    pub peer: String,
    pub tagged: bool,
    pub session: Option<String>,
    /// Distinct datagrams received (duplicates are not counted again).
    pub packets: u64,
    pub bytes: u64,
    /// Summary: first to last datagram. Interval: the interval's span.
    pub seconds: f64,
    /// Rates over `seconds`, of what arrived after its start; null when the
    /// span is under `stats::MIN_RATE_SPAN`.
    #[serialize_always]
    pub gbps: Option<f64>,
    #[serialize_always]
    pub pps: Option<f64>,
    #[serialize_always]
    pub wire_gbps: Option<f64>,
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
    /// Datagrams without a netspeed header counted in this session (a
    /// client's datagrams shorter than the header).
    #[serde(skip_serializing_if = "is_zero")]
    pub untagged_packets: u64,
    /// Drops on the server socket while this peer was active.
    #[serde(flatten)]
    pub drops: KernelDrops,
    /// Buffers received that held more than one datagram (UDP GRO).
    pub gro_buffers: u64,
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

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Packets, payload bytes and estimated wire bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Amount {
    packets: u64,
    bytes: u64,
    wire: u64,
}

impl Amount {
    fn add(&mut self, other: Amount) {
        self.packets += other.packets;
        self.bytes += other.bytes;
        self.wire += other.wire;
    }

    fn minus(self, other: Amount) -> Amount {
        Amount {
            packets: self.packets.saturating_sub(other.packets),
            bytes: self.bytes.saturating_sub(other.bytes),
            wire: self.wire.saturating_sub(other.wire),
        }
    }
}

/// Where the last interval line left off.
#[derive(Debug, Clone, Copy)]
struct Mark {
    at: Instant,
    total: Amount,
    cpu: Option<CpuTime>,
}

/// Where to send an answer to an End, once the session is finalised.
#[derive(Debug, Clone, Copy)]
struct ReplyTo {
    /// As received (a v4-mapped address on a dual-stack socket).
    to: SocketAddr,
    /// The address the End was sent to: the answer leaves from it.
    local: Option<IpAddr>,
    socket: usize,
    nonce: u64,
}

enum State {
    Active,
    Closing {
        grace_until: Instant,
        reply: ReplyTo,
    },
    Finished(Finished),
}

struct Finished {
    at: Instant,
    reason: DoneReason,
    late: Amount,
    late_reported: u64,
    last_late: Option<Instant>,
    /// When late datagrams were last reported (at most once a second).
    late_reported_at: Option<Instant>,
    /// The record's key in the expiry index.
    expiry: (Instant, u64),
}

struct Tagged {
    session: u64,
    seq: SeqSet,
    jitter: Jitter,
    declared: Option<End>,
    /// Untagged datagrams from the same address, counted in this session.
    untagged_packets: u64,
    /// The session began with a Hello (or said one since).
    proven: bool,
    conflict: Option<&'static str>,
    /// Its End created the session: no Hello, no data before it (the
    /// server restarted, or forgot the session).
    unknown_start: bool,
    /// Set when the session is finished with its End's totals: the figures
    /// no longer change, and the sequence set is freed.
    frozen: Option<SeqFigures>,
}

/// Loss against what the sender declared, or estimated from sequence
/// numbers.
#[derive(Debug, Clone, Copy)]
struct Loss {
    /// Lost at most ...
    most: u64,
    /// ... and at least (equal unless arrivals were uncertain).
    fewest: u64,
    expected: u64,
    basis: &'static str,
}

/// What a session's sequence numbers say.
#[derive(Debug, Clone, Copy)]
struct SeqFigures {
    loss: Option<Loss>,
    duplicates: u64,
    reordered: u64,
    uncertain: u64,
    unexpected: u64,
}

impl Tagged {
    fn figures(&self) -> SeqFigures {
        if let Some(frozen) = self.frozen {
            return frozen;
        }
        let seq = &self.seq;
        let (loss, unexpected) = match &self.declared {
            Some(end) => {
                let (fewest, most) = seq.lost_range(end.sent_packets);
                // Untagged datagrams of the session have no sequence number
                // but were declared too.
                let loss = Loss {
                    most: most.saturating_sub(self.untagged_packets),
                    fewest: fewest.saturating_sub(self.untagged_packets),
                    expected: end.sent_packets,
                    basis: "declared",
                };
                (Some(loss), seq.unexpected(end.sent_packets))
            }
            None if seq.unique > 0 || seq.uncertain > 0 => {
                let expected = seq.expected_from_sequence();
                let (fewest, most) = seq.lost_range(expected);
                let loss = Loss {
                    most,
                    fewest,
                    expected,
                    basis: "sequence",
                };
                (Some(loss), seq.implausible)
            }
            None => (None, seq.implausible),
        };
        SeqFigures {
            loss,
            duplicates: seq.duplicates,
            reordered: seq.reordered,
            uncertain: seq.uncertain,
            unexpected,
        }
    }

    /// Once the End's totals are known and the session finished, the
    /// figures are fixed: keep them, and free the set. A session finished
    /// as idle keeps its set (shrunk) until its End comes, if ever.
    fn freeze(&mut self) {
        if self.declared.is_some() {
            self.frozen = Some(self.figures());
            self.seq = SeqSet::with_bound(2);
        } else {
            self.seq.shrink();
        }
    }
}

struct Peer {
    addr: SocketAddr,
    state: State,
    total: Amount,
    /// The first data arrival, and what arrived at that instant.
    first: Option<Instant>,
    at_first: Amount,
    /// The last data arrival.
    last: Instant,
    /// The last datagram of any kind (for the idle time-out).
    last_seen: Instant,
    mark: Option<Mark>,
    tagged: Option<Box<Tagged>>,
    /// The receive socket, its drop counter at this peer's first and latest
    /// datagram, and whether anything else arrived on it meanwhile.
    socket: usize,
    drops_start: Option<u64>,
    drops_end: Option<u64>,
    /// The receive threads' CPU at this peer's first and latest datagram,
    /// and when the first came.
    cpu_start: Option<CpuTime>,
    cpu_end: Option<CpuTime>,
    first_seen: Instant,
    joins_at_start: u64,
    shared: bool,
    gro_buffers: u64,
    truncated: u64,
}

impl Peer {
    fn new(addr: SocketAddr, now: Instant, socket: usize, tagged: Option<Box<Tagged>>) -> Self {
        Peer {
            addr,
            state: State::Active,
            total: Amount::default(),
            first: None,
            at_first: Amount::default(),
            last: now,
            last_seen: now,
            mark: None,
            tagged,
            socket,
            drops_start: None,
            drops_end: None,
            cpu_start: None,
            cpu_end: None,
            first_seen: now,
            joins_at_start: 0,
            shared: false,
            gro_buffers: 0,
            truncated: 0,
        }
    }

    fn is_finished(&self) -> bool {
        matches!(self.state, State::Finished(_))
    }

    fn count(&mut self, len: usize, at: Instant) {
        self.count_amount(
            Amount {
                packets: 1,
                bytes: len as u64,
                wire: wire_bytes(len as u64, self.addr.is_ipv6()),
            },
            at,
        );
    }

    /// Counts `amount`, all of which arrived at `at`.
    fn count_amount(&mut self, amount: Amount, at: Instant) {
        let first_ever = self.total.packets == 0;
        self.total.add(amount);
        match self.first {
            Some(first) if at > first => {}
            Some(first) if at == first => self.at_first.add(amount),
            _ => {
                self.first = Some(at);
                self.at_first = amount;
            }
        }
        if at > self.last || first_ever {
            self.last = at;
        }
    }

    fn seen(&mut self, now: Instant, drops: Option<u64>, cpu: Option<CpuTime>) {
        self.last_seen = self.last_seen.max(now);
        if drops.is_some() {
            self.drops_start = self.drops_start.or(drops);
            self.drops_end = drops;
        }
        if cpu.is_some() {
            self.cpu_start = self.cpu_start.or(cpu);
            self.cpu_end = cpu;
        }
    }

    /// The receive CPU from the peer's first datagram to its latest.
    fn cpu_used(&self) -> Option<CpuTime> {
        Some(self.cpu_end?.since(self.cpu_start?))
    }

    fn socket_drops(&self) -> Option<u64> {
        Some(self.drops_end?.saturating_sub(self.drops_start?))
    }

    /// A report of `amount` over the span from `start` to `end`, where
    /// `after_start` is the part of `amount` that arrived after `start`.
    #[allow(clippy::too_many_arguments)]
    fn report(
        &self,
        amount: Amount,
        after_start: Amount,
        span: Duration,
        shared: bool,
        cpu: Option<CpuCost>,
        reason: Option<DoneReason>,
    ) -> PeerReport {
        let t = self.tagged.as_deref();
        let figures = t.map(Tagged::figures);
        let loss = figures.and_then(|f| f.loss);
        PeerReport {
            peer: self.addr.to_string(),
            tagged: t.is_some(),
            session: t.map(|t| format!("{:016x}", t.session)),
            packets: amount.packets,
            bytes: amount.bytes,
            seconds: span.as_secs_f64(),
            gbps: stats::rate_gbps(after_start.bytes, span),
            pps: stats::rate_per_second(after_start.packets, span),
            wire_gbps: stats::rate_gbps(after_start.wire, span),
            total_packets: None,
            total_bytes: None,
            sent_packets: t.and_then(|t| t.declared.map(|d| d.sent_packets)),
            sent_bytes: t.and_then(|t| t.declared.map(|d| d.sent_bytes)),
            declared: t.and_then(|t| t.declared),
            lost: loss.map(|l| l.most),
            lost_fewest: loss.filter(|l| l.fewest != l.most).map(|l| l.fewest),
            loss_percent: loss.map(|l| percent(l.most, l.expected)),
            loss_basis: loss.map(|l| l.basis),
            duplicates: figures.map(|f| f.duplicates),
            reordered: figures.map(|f| f.reordered),
            uncertain: figures.map_or(0, |f| f.uncertain),
            unexpected: figures.map_or(0, |f| f.unexpected),
            jitter_ms: t.map(|t| t.jitter.nanos() / 1e6),
            untagged_packets: t.map_or(0, |t| t.untagged_packets),
            drops: KernelDrops::new(self.socket_drops(), shared, self.gro_buffers > 0),
            gro_buffers: self.gro_buffers,
            truncated: self.truncated,
            transit_discarded: t.map_or(0, |t| t.jitter.discarded),
            cpu,
            conflict: t.and_then(|t| t.conflict),
            reason,
        }
    }

    /// The whole peer: first to last datagram; `reason` why it is done, or
    /// None while it is not.
    fn summary(&self, shared: bool, reason: Option<DoneReason>) -> PeerReport {
        let span = match self.first {
            Some(first) => self.last.saturating_duration_since(first),
            None => Duration::ZERO,
        };
        let cpu = self.cpu_used().map(|c| {
            let span = self.last_seen.saturating_duration_since(self.first_seen);
            CpuCost::of(c, span, self.total.bytes)
        });
        self.report(
            self.total,
            self.total.minus(self.at_first),
            span,
            shared,
            cpu,
            reason,
        )
    }

    /// What arrived since the last interval line, up to `end`; None when
    /// nothing did.
    fn interval(&self, end: Instant, cpu_now: Option<CpuTime>, shared: bool) -> Option<PeerReport> {
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
        let cpu = cpu_now
            .zip(cpu_from)
            .map(|(now, from)| CpuCost::of(now.since(from), span, amount.bytes));
        let mut report = self.report(amount, after_start, span, shared, cpu, None);
        report.total_packets = Some(self.total.packets);
        report.total_bytes = Some(self.total.bytes);
        Some(report)
    }

    /// The answer to an End: the session's figures, which no longer change
    /// once it is finished (late datagrams are counted apart).
    fn answer(&self, nonce: u64, epoch: Instant, table: &TableFlags) -> EndAck {
        let t = self.tagged.as_ref().expect("answers are for tagged peers");
        let figures = t.figures();
        let (lost, lost_fewest) = figures.loss.map_or((0, 0), |l| (l.most, l.fewest));
        let since = |at: Instant| at.saturating_duration_since(epoch).as_nanos() as u64;
        let mut flags = 0;
        if table.gro {
            flags |= wire::ACK_GRO;
        }
        if self.shared_now(table) {
            flags |= wire::ACK_DROPS_SHARED;
        }
        if t.conflict.is_some() {
            flags |= wire::ACK_CONFLICT;
        }
        if t.unknown_start {
            flags |= wire::ACK_NO_RECORD;
        }
        let late = match &self.state {
            State::Finished(f) => {
                if f.reason == DoneReason::Idle {
                    flags |= wire::ACK_IDLE_FINISHED;
                }
                f.late.packets
            }
            _ => 0,
        };
        EndAck {
            session: t.session,
            flags,
            nonce,
            received_packets: self.total.packets,
            received_bytes: self.total.bytes,
            lost,
            lost_fewest,
            duplicates: figures.duplicates,
            reordered: figures.reordered,
            uncertain: figures.uncertain,
            late,
            unexpected: figures.unexpected,
            first_arrival_ns: self.first.map_or(0, since),
            last_arrival_ns: self.first.map_or(0, |_| since(self.last)),
            first_arrival_packets: self.at_first.packets,
            first_arrival_bytes: self.at_first.bytes,
            jitter_ns: t.jitter.nanos() as u64,
            drops_start: self.drops_start.unwrap_or(wire::UNKNOWN),
            drops_end: self.drops_end.unwrap_or(wire::UNKNOWN),
            drop_socket: self.socket as u64,
            gro_buffers: self.gro_buffers,
            truncated: self.truncated,
            cpu_user_ns: self
                .cpu_used()
                .map_or(wire::UNKNOWN, |c| c.user.as_nanos() as u64),
            cpu_system_ns: self
                .cpu_used()
                .map_or(wire::UNKNOWN, |c| c.system.as_nanos() as u64),
            cpu_start_ns: self
                .cpu_start
                .map_or(wire::UNKNOWN, |c| c.total().as_nanos() as u64),
            transit_discarded: t.jitter.discarded,
            tag: [0; wire::TAG_LEN],
        }
    }

    /// Whether anything else arrived on this peer's socket while it was
    /// active (decided for good when it finishes: `finalise` stores it).
    fn shared_now(&self, table: &TableFlags) -> bool {
        if self.is_finished() {
            return self.shared;
        }
        self.shared
            || table
                .socket_joins
                .get(self.socket)
                .is_some_and(|&joins| joins != self.joins_at_start)
    }
}

/// When a datagram arrived, in the two forms the table needs.
#[derive(Clone, Copy)]
struct At {
    now: Instant,
    /// Nanoseconds since the table's epoch, for jitter.
    ns: u64,
    /// Whether this datagram updates the jitter estimate.
    jitter: bool,
}

impl At {
    fn new(now: Instant, epoch: Instant) -> Self {
        let since = now.saturating_duration_since(epoch);
        At {
            now,
            ns: since.as_secs() * 1_000_000_000 + u64::from(since.subsec_nanos()),
            jitter: true,
        }
    }
}

/// What the table asks its owner to do.
pub enum Event {
    Interval(PeerReport),
    Done(PeerReport),
    Late(LateReport),
    Conflict(ConflictReport),
}

/// Traffic that found its table full.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Overflow {
    pub packets: u64,
    pub bytes: u64,
}

/// Limits answers per source IP, in one-second windows.
struct AnswerLimiter {
    window_start: Instant,
    counts: HashMap<IpAddr, u32>,
    max_sources: usize,
}

impl AnswerLimiter {
    fn allow(&mut self, ip: IpAddr, now: Instant) -> bool {
        if now.saturating_duration_since(self.window_start) >= Duration::from_secs(1) {
            self.window_start = now;
            self.counts.clear();
        }
        if self.counts.len() >= self.max_sources && !self.counts.contains_key(&ip) {
            return false;
        }
        let count = self.counts.entry(ip).or_insert(0);
        *count += 1;
        *count <= ANSWERS_PER_SECOND
    }
}

/// Peers in slots that do not move, so the receive path can remember the
/// slot of the last peer it saw and skip the hash lookup for the next
/// datagram of the same flow (the common case, and every segment of a GRO
/// buffer).
struct Slab<K> {
    index: HashMap<K, usize>,
    slots: Vec<Option<Peer>>,
    free: Vec<usize>,
    last: Option<(K, usize)>,
}

impl<K: std::hash::Hash + Eq + Copy> Slab<K> {
    fn new() -> Self {
        Slab {
            index: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            last: None,
        }
    }

    fn len(&self) -> usize {
        self.index.len()
    }

    fn find(&mut self, key: &K) -> Option<usize> {
        if let Some((k, slot)) = &self.last {
            if k == key {
                return Some(*slot);
            }
        }
        let slot = *self.index.get(key)?;
        self.last = Some((*key, slot));
        Some(slot)
    }

    fn insert(&mut self, key: K, peer: Peer) -> usize {
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some(peer);
                slot
            }
            None => {
                self.slots.push(Some(peer));
                self.slots.len() - 1
            }
        };
        self.index.insert(key, slot);
        self.last = Some((key, slot));
        slot
    }

    /// The peer at `key`, without touching the lookup cache.
    fn peers_find(&self, key: &K) -> Option<&Peer> {
        self.index.get(key).map(|&slot| self.get(slot))
    }

    fn get(&self, slot: usize) -> &Peer {
        self.slots[slot].as_ref().expect("live slot")
    }

    fn get_mut(&mut self, slot: usize) -> &mut Peer {
        self.slots[slot].as_mut().expect("live slot")
    }

    fn remove(&mut self, key: &K) -> Option<Peer> {
        let slot = self.index.remove(key)?;
        if matches!(&self.last, Some((k, _)) if k == key) {
            self.last = None;
        }
        self.free.push(slot);
        self.slots[slot].take()
    }

    fn keys(&self) -> Vec<(K, usize)> {
        self.index.iter().map(|(k, &s)| (*k, s)).collect()
    }

    fn peers(&self) -> impl Iterator<Item = &Peer> {
        self.slots.iter().flatten()
    }

    fn clear(&mut self) {
        *self = Slab::new();
    }
}

type SessionKey = (SocketAddr, u64);

/// Per receive socket: its drop counter, and who is on it.
#[derive(Debug, Clone, Default)]
struct SocketState {
    /// The kernel's counter as last seen (a u32 that wraps).
    raw: Option<u32>,
    /// Drops since the server started, taken in wrapping u32 steps.
    total: u64,
    /// Unfinished peers on this socket.
    active: u32,
}

/// What peers need to know about the table to build their reports.
struct TableFlags {
    gro: bool,
    /// Per socket: bumped whenever traffic of more than one peer meets on
    /// it, so a peer can tell whether its drops were its own.
    socket_joins: Vec<u64>,
}

/// Counters over the table's whole life.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Totals {
    /// Every datagram counted: data (duplicates included), untagged, late
    /// and overflow. Control messages are not counted.
    pub packets: u64,
    pub bytes: u64,
    /// Peer entries ever created.
    pub peers: u64,
    pub overflow: Overflow,
    /// Answers refused by the per-IP rate limit.
    pub answers_limited: u64,
    /// End messages of new sessions that found the table full: unanswered.
    pub ends_table_full: u64,
    /// Datagrams for sessions already finished.
    pub late_packets: u64,
    pub late_bytes: u64,
    /// Buffers cut short by the kernel (MSG_TRUNC).
    pub truncated: u64,
    /// Finished sessions' records dropped early because too many were kept.
    pub records_evicted: u64,
    /// Sessions seen only in data, evicted for one that began with a Hello.
    pub sessions_evicted: u64,
    /// Ends without a valid tag, ignored (`--psk`).
    pub ends_rejected: u64,
    /// Sessions whose End was contradicted (see `conflict` events).
    pub conflicts: u64,
}

/// An answer to send: bytes, destination (as received) and the receive
/// socket the request came in on.
#[derive(Debug, Clone)]
pub struct Reply {
    pub bytes: ReplyBytes,
    pub to: SocketAddr,
    /// The source address the request was sent to, when known.
    pub from: Option<IpAddr>,
    pub socket: usize,
}

/// An EndAck or a HelloAck, without allocating.
#[derive(Debug, Clone)]
pub enum ReplyBytes {
    End([u8; wire::END_LEN]),
    Hello([u8; wire::HELLO_LEN]),
}

impl ReplyBytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            ReplyBytes::End(b) => b,
            ReplyBytes::Hello(b) => b,
        }
    }
}

/// The peer table.
pub struct PeerTable {
    cfg: TableConfig,
    /// Sessions in every state, finished ones included.
    tagged: Slab<SessionKey>,
    untagged: Slab<SocketAddr>,
    /// The latest session seen from each source address, for datagrams
    /// too short to carry a session id.
    by_addr: HashMap<SocketAddr, SessionKey>,
    /// Sessions not yet finished, those of them seen only in data, and
    /// per source IP.
    active_sessions: usize,
    unproven_sessions: usize,
    sessions_per_ip: HashMap<IpAddr, usize>,
    /// Finished sessions' records, by when they may go.
    expiry: BTreeMap<(Instant, u64), SessionKey>,
    expiry_ids: u64,
    epoch: Instant,
    limiter: AnswerLimiter,
    sockets: Vec<SocketState>,
    flags: TableFlags,
    ranges_per_session: usize,
    /// Events that arise as datagrams arrive (a conflict, an eviction),
    /// handed on at the next `expire` (or `finish_all`).
    queued: Vec<Event>,
    /// Something arrived that the thread calling `expire` should see
    /// before its next regular look: a queued event or a new grace period.
    attention: bool,
    pub totals: Totals,
    /// Reverse sessions: the server sends (see [`super::reverse`]).
    pub reverse: Reverse,
}

impl PeerTable {
    /// A table whose clock starts at `now`.
    pub fn new(cfg: TableConfig, now: Instant) -> Self {
        let sockets = cfg.sockets.max(1);
        let ranges_per_session =
            (RANGE_BUDGET / cfg.max_peers.max(1)).clamp(MIN_RANGES_PER_SESSION, RANGE_BUDGET);
        PeerTable {
            tagged: Slab::new(),
            untagged: Slab::new(),
            by_addr: HashMap::new(),
            active_sessions: 0,
            unproven_sessions: 0,
            sessions_per_ip: HashMap::new(),
            expiry: BTreeMap::new(),
            expiry_ids: 0,
            epoch: now,
            limiter: AnswerLimiter {
                window_start: now,
                counts: HashMap::new(),
                max_sources: cfg.max_peers,
            },
            sockets: vec![SocketState::default(); sockets],
            flags: TableFlags {
                gro: cfg.gro,
                socket_joins: vec![0; sockets],
            },
            ranges_per_session,
            queued: Vec::new(),
            attention: false,
            totals: Totals::default(),
            reverse: Reverse::new(ReverseConfig {
                caps: cfg.streams,
                psk: cfg.psk.clone(),
                cookies: CookieKey::random().unwrap_or_else(|| {
                    let mut key = [0u8; 32];
                    for chunk in key.chunks_mut(8) {
                        chunk.copy_from_slice(&crate::auth::random_u64().to_be_bytes());
                    }
                    CookieKey::from_bytes(key)
                }),
                epoch: now,
            }),
            cfg,
        }
    }

    /// Finished sessions' records kept at most.
    pub fn records_bound(&self) -> usize {
        (self.cfg.max_peers * 4).clamp(1024, MAX_RECORDS)
    }

    /// Most unfinished sessions from one source IP: a quarter of the table,
    /// but always room for `--clients 1024` (or the whole table, if smaller).
    pub fn sessions_per_ip_bound(&self) -> usize {
        (self.cfg.max_peers / 4).max(self.cfg.max_peers.min(1024))
    }

    /// Peers tracked right now: unfinished ones, and finished sessions'
    /// records.
    pub fn len(&self) -> usize {
        self.tagged.len() + self.untagged.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Finished sessions' records kept now.
    pub fn records(&self) -> usize {
        self.tagged.len() - self.active_sessions
    }

    /// The sum of every socket's kernel drop counter, when known.
    pub fn kernel_drops(&self) -> Option<u64> {
        let known: Vec<u64> = self
            .sockets
            .iter()
            .filter(|s| s.raw.is_some())
            .map(|s| s.total)
            .collect();
        (!known.is_empty()).then(|| known.iter().sum())
    }

    /// Folds a datagram's raw drop counter into its socket's running total
    /// (wrapping u32 steps) and returns that total.
    fn socket_drops(&mut self, socket: usize, raw: Option<u32>) -> Option<u64> {
        let raw = raw?;
        let s = self.sockets.get_mut(socket)?;
        if let Some(previous) = s.raw {
            s.total += u64::from(raw.wrapping_sub(previous));
        } else {
            s.total = u64::from(raw);
        }
        s.raw = Some(raw);
        Some(s.total)
    }

    /// Someone other than the peers already on `socket` used it.
    fn join(&mut self, socket: usize) {
        if let Some(joins) = self.flags.socket_joins.get_mut(socket) {
            *joins += 1;
        }
    }

    /// Registers a new unfinished peer on `socket`.
    fn start_peer(&mut self, peer: &mut Peer, socket: usize) {
        let others = self.sockets.get(socket).map_or(0, |s| s.active);
        if others > 0 {
            self.join(socket);
            peer.shared = true;
        }
        peer.joins_at_start = self.flags.socket_joins.get(socket).copied().unwrap_or(0);
        if let Some(s) = self.sockets.get_mut(socket) {
            s.active += 1;
        }
        self.totals.peers += 1;
    }

    fn end_peer(&mut self, socket: usize) {
        if let Some(s) = self.sockets.get_mut(socket) {
            s.active = s.active.saturating_sub(1);
        }
    }

    /// Accounts one received buffer: a datagram, or with UDP_GRO several
    /// datagrams of `rx.segment_size` bytes (the last may be shorter) from
    /// one flow. Answers to send are pushed to `replies`.
    pub fn on_receive(&mut self, data: &[u8], rx: &Rx, replies: &mut Vec<Reply>) {
        self.receive(data, rx, replies, true)
    }

    /// [`Self::on_receive`]; `runs` false accounts every GRO buffer
    /// datagram by datagram (tests compare the two).
    fn receive(&mut self, data: &[u8], rx: &Rx, replies: &mut Vec<Reply>, runs: bool) {
        let at = At::new(rx.arrived, self.epoch);
        let drops = self.socket_drops(rx.socket, rx.drops);
        if rx.truncated {
            self.totals.truncated += 1;
        }
        let meta = Meta {
            socket: rx.socket,
            local: rx.local,
            cpu: rx.cpu,
            processed: rx.processed,
            drops,
            coalesced_first: false,
            truncated: rx.truncated,
        };
        match rx.segment_size {
            Some(seg) if seg > 0 && data.len() > seg => {
                if !(runs && self.account_run(data, seg, rx.from, at, meta)) {
                    self.account_each(data, seg, rx.from, at, meta, replies);
                }
            }
            _ => self.account(data, rx.from, at, meta, replies),
        }
    }

    /// A GRO buffer, datagram by datagram. Coalesced datagrams arrived
    /// together: jitter is measured once per buffer (its first datagram);
    /// the others would only add zeros from the shared arrival time.
    fn account_each(
        &mut self,
        data: &[u8],
        segment: usize,
        from: SocketAddr,
        at: At,
        meta: Meta,
        replies: &mut Vec<Reply>,
    ) {
        for (i, chunk) in data.chunks(segment).enumerate() {
            let at = At {
                jitter: i == 0,
                ..at
            };
            let meta = Meta {
                coalesced_first: i == 0,
                truncated: meta.truncated && i == 0,
                ..meta
            };
            self.account(chunk, from, at, meta, replies);
        }
    }

    /// A GRO buffer that holds one known session's next sequence numbers in
    /// order, as a GSO sender's buffers do: accounted in one step, with the
    /// same result as datagram by datagram (one lookup, one range insert,
    /// one count, instead of one each per datagram). Returns false,
    /// changing nothing, for anything else (a new or finished session, an
    /// End already declared, a duplicate, reordering, a foreign or short
    /// datagram); the caller then goes datagram by datagram.
    fn account_run(
        &mut self,
        data: &[u8],
        segment: usize,
        from: SocketAddr,
        at: At,
        meta: Meta,
    ) -> bool {
        let Ok(Message::Data(first)) = wire::decode(&data[..segment]) else {
            return false;
        };
        // The first is decoded above; the rest must follow it.
        let mut count = 1u64;
        for chunk in data.chunks(segment).skip(1) {
            match wire::decode(chunk) {
                Ok(Message::Data(h))
                    if h.session == first.session && h.seq == first.seq + count =>
                {
                    count += 1
                }
                _ => return false,
            }
        }
        let addr = canonical(from);
        let Some(slot) = self.tagged.find(&(addr, first.session)) else {
            return false;
        };
        let peer = self.tagged.get_mut(slot);
        if peer.is_finished() {
            return false;
        }
        let t = peer.tagged.as_mut().expect("sessions are tagged");
        if t.declared.is_some() || !t.seq.record_run(first.seq, count) {
            return false;
        }
        if at.jitter {
            t.jitter.record(first.send_time_ns, at.ns);
        }
        let last_len = data.len() - (count as usize - 1) * segment;
        let ipv6 = peer.addr.is_ipv6();
        let amount = Amount {
            packets: count,
            bytes: data.len() as u64,
            wire: (count - 1) * wire_bytes(segment as u64, ipv6)
                + wire_bytes(last_len as u64, ipv6),
        };
        peer.seen(at.now, meta.drops, meta.cpu);
        peer.gro_buffers += 1;
        if meta.truncated {
            peer.truncated += 1;
        }
        peer.count_amount(amount, at.now);
        self.totals.packets += count;
        self.totals.bytes += data.len() as u64;
        true
    }

    /// Accounts one datagram that was not coalesced (tests and fuzzing).
    #[allow(clippy::too_many_arguments)]
    pub fn on_datagram(
        &mut self,
        data: &[u8],
        from: SocketAddr,
        now: Instant,
        socket: usize,
        drops: Option<u32>,
    ) -> Option<Reply> {
        let mut replies = Vec::new();
        let rx = Rx {
            from,
            arrived: now,
            processed: now,
            socket,
            drops,
            ..Rx::default()
        };
        self.on_receive(data, &rx, &mut replies);
        replies.pop()
    }

    fn account(
        &mut self,
        data: &[u8],
        from: SocketAddr,
        at: At,
        meta: Meta,
        replies: &mut Vec<Reply>,
    ) {
        let addr = canonical(from);
        match wire::decode(data) {
            Ok(Message::Data(header)) => {
                self.totals.packets += 1;
                self.totals.bytes += data.len() as u64;
                self.on_data(data.len(), header, addr, at, meta, replies);
            }
            Ok(Message::End(end)) => self.on_end(end, data, addr, from, at.now, meta, replies),
            Ok(Message::Hello(hello)) => self.on_hello(hello, addr, from, at.now, meta, replies),
            Ok(Message::Start(start)) => {
                // A Start is answered like a Hello: within the source's
                // answer budget, and never with more bytes than it carried.
                if self.limiter.allow(addr.ip(), at.now) {
                    self.reverse.on_start(
                        start,
                        data,
                        addr,
                        from,
                        meta.local,
                        meta.socket,
                        at.now,
                        replies,
                    );
                } else {
                    self.totals.answers_limited += 1;
                }
            }
            Ok(Message::Feedback(feedback)) => {
                self.reverse.on_feedback(feedback, data, addr, at.now);
                // A first Feedback launches a stream: the finalising thread
                // does that, at once.
                self.attention |= self.reverse.has_launches();
            }
            Ok(Message::EndAck(ack)) => {
                self.reverse.on_end_ack(ack, data, addr);
                self.attention |= self.reverse.has_done();
            }
            Ok(Message::HelloAck(_) | Message::StartAck(_)) => {}
            Err(_) => {
                self.totals.packets += 1;
                self.totals.bytes += data.len() as u64;
                self.on_untagged(data.len(), addr, at.now, meta);
            }
        }
    }

    /// The slot of session `key`, creating it if there is room: see the
    /// module docs for who gets room. `proven` says the datagram is a Hello.
    fn session_slot(
        &mut self,
        key: SessionKey,
        now: Instant,
        socket: usize,
        proven: bool,
        replies: &mut Vec<Reply>,
    ) -> Option<usize> {
        if let Some(slot) = self.tagged.find(&key) {
            let peer = self.tagged.get_mut(slot);
            let finished = peer.is_finished();
            let t = peer.tagged.as_mut().expect("sessions are tagged");
            if proven && !t.proven {
                t.proven = true;
                if !finished {
                    self.unproven_sessions -= 1;
                }
            }
            return Some(slot);
        }
        let ip = key.0.ip();
        if self.sessions_per_ip.get(&ip).copied().unwrap_or(0) >= self.sessions_per_ip_bound() {
            return None;
        }
        if !proven && self.unproven_sessions >= (self.cfg.max_peers / 2).max(1) {
            return None;
        }
        if self.active_sessions >= self.cfg.max_peers
            && !(proven && self.evict_unproven(now, replies))
        {
            return None;
        }
        let tagged = Box::new(Tagged {
            session: key.1,
            seq: SeqSet::with_bound(self.ranges_per_session),
            jitter: Jitter::default(),
            declared: None,
            untagged_packets: 0,
            proven,
            conflict: None,
            unknown_start: false,
            frozen: None,
        });
        let mut peer = Peer::new(key.0, now, socket, Some(tagged));
        self.start_peer(&mut peer, socket);
        self.active_sessions += 1;
        if !proven {
            self.unproven_sessions += 1;
        }
        *self.sessions_per_ip.entry(ip).or_insert(0) += 1;
        self.by_addr.insert(key.0, key);
        Some(self.tagged.insert(key, peer))
    }

    /// Finalises the unfinished session seen only in data that has been
    /// silent longest, to make room; false when there is none.
    fn evict_unproven(&mut self, now: Instant, replies: &mut Vec<Reply>) -> bool {
        if self.unproven_sessions == 0 {
            return false;
        }
        let victim = self
            .tagged
            .index
            .iter()
            .filter_map(|(key, &slot)| {
                let peer = self.tagged.get(slot);
                let unproven = !peer.tagged.as_ref().is_some_and(|t| t.proven);
                (unproven && !peer.is_finished()).then_some((peer.last_seen, *key))
            })
            .min()
            .map(|(_, key)| key);
        let Some(key) = victim else {
            return false;
        };
        let mut events = std::mem::take(&mut self.queued);
        self.finalise(
            key,
            now,
            DoneReason::Evicted,
            &mut |e| events.push(e),
            replies,
        );
        self.queued = events;
        self.totals.sessions_evicted += 1;
        true
    }

    /// A session that is no longer counted among the unfinished ones.
    fn session_ended(&mut self, key: SessionKey, proven: bool, socket: usize) {
        self.active_sessions -= 1;
        if !proven {
            self.unproven_sessions -= 1;
        }
        let ip = key.0.ip();
        if let Some(n) = self.sessions_per_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.sessions_per_ip.remove(&ip);
            }
        }
        self.end_peer(socket);
    }

    /// Marks session `slot` as disputed (once), and reports it.
    fn conflict(&mut self, slot: usize, why: &'static str, other: Option<&End>, seq: Option<u64>) {
        let peer = self.tagged.get_mut(slot);
        let t = peer.tagged.as_mut().expect("sessions are tagged");
        if t.conflict.is_some() {
            return;
        }
        t.conflict = Some(why);
        let declared = t.declared.expect("a conflict needs an End");
        let report = ConflictReport {
            peer: peer.addr.to_string(),
            session: format!("{:016x}", t.session),
            conflict: why,
            sent_packets: declared.sent_packets,
            sent_bytes: declared.sent_bytes,
            other_sent_packets: other.map(|e| e.sent_packets),
            other_sent_bytes: other.map(|e| e.sent_bytes),
            seq,
        };
        self.totals.conflicts += 1;
        self.queued.push(Event::Conflict(report));
        self.attention = true;
    }

    fn on_data(
        &mut self,
        len: usize,
        header: wire::Header,
        addr: SocketAddr,
        at: At,
        meta: Meta,
        replies: &mut Vec<Reply>,
    ) {
        let key = (addr, header.session);
        let Some(slot) = self.session_slot(key, at.now, meta.socket, false, replies) else {
            self.overflow(len, meta.socket);
            return;
        };
        // After an End, a sequence number at or beyond its total says the
        // End was not this sender's last word.
        let beyond = self
            .tagged
            .get(slot)
            .tagged
            .as_ref()
            .and_then(|t| t.declared)
            .is_some_and(|end| header.seq >= end.sent_packets);
        if beyond {
            self.conflict(slot, CONFLICT_DATA, None, Some(header.seq));
        }
        if self.tagged.get(slot).is_finished() {
            self.late(slot, len, at.now);
            return;
        }
        let peer = self.tagged.get_mut(slot);
        peer.seen(at.now, meta.drops, meta.cpu);
        if meta.coalesced_first {
            peer.gro_buffers += 1;
        }
        if meta.truncated {
            peer.truncated += 1;
        }
        let t = peer.tagged.as_mut().expect("sessions are tagged");
        match t.seq.record(header.seq) {
            Arrival::Duplicate | Arrival::Uncertain => return,
            Arrival::Implausible => {
                // Counted as unexpected; it says nothing about timing.
                peer.count(len, at.now);
                return;
            }
            Arrival::New { .. } => {}
        }
        if at.jitter {
            t.jitter.record(header.send_time_ns, at.ns);
        }
        peer.count(len, at.now);
    }

    fn on_untagged(&mut self, len: usize, addr: SocketAddr, now: Instant, meta: Meta) {
        if let Some(slot) = self.untagged.find(&addr) {
            let peer = self.untagged.get_mut(slot);
            peer.seen(now, meta.drops, meta.cpu);
            peer.count(len, now);
            return;
        }
        // From an address with a session: a datagram of that client too
        // short for a header (the short tail of a -t run, or -b under 32).
        if let Some(slot) = self
            .by_addr
            .get(&addr)
            .copied()
            .and_then(|key| self.tagged.find(&key))
        {
            if self.tagged.get(slot).is_finished() {
                self.late(slot, len, now);
                return;
            }
            let peer = self.tagged.get_mut(slot);
            peer.seen(now, meta.drops, meta.cpu);
            peer.count(len, now);
            peer.tagged.as_mut().expect("tagged").untagged_packets += 1;
            return;
        }
        if self.untagged.len() >= self.cfg.max_peers {
            self.overflow(len, meta.socket);
            return;
        }
        let mut peer = Peer::new(addr, now, meta.socket, None);
        self.start_peer(&mut peer, meta.socket);
        peer.seen(now, meta.drops, meta.cpu);
        peer.count(len, now);
        self.untagged.insert(addr, peer);
    }

    /// A datagram for session `slot`, which is finished.
    fn late(&mut self, slot: usize, len: usize, now: Instant) {
        let peer = self.tagged.get_mut(slot);
        let socket = peer.socket;
        if let State::Finished(f) = &mut peer.state {
            f.late.add(Amount {
                packets: 1,
                bytes: len as u64,
                wire: 0,
            });
            f.last_late = Some(now);
        }
        self.totals.late_packets += 1;
        self.totals.late_bytes += len as u64;
        // Its datagrams share the socket with whoever is on it now.
        self.join(socket);
    }

    fn overflow(&mut self, len: usize, socket: usize) {
        self.totals.overflow.packets += 1;
        self.totals.overflow.bytes += len as u64;
        self.join(socket);
    }

    /// The slot for a Hello's or End's session; None (counted) when the
    /// table is full: the request goes unanswered.
    fn control_slot(
        &mut self,
        key: SessionKey,
        now: Instant,
        socket: usize,
        proven: bool,
        replies: &mut Vec<Reply>,
    ) -> Option<usize> {
        let slot = self.session_slot(key, now, socket, proven, replies);
        if slot.is_none() {
            self.totals.ends_table_full += 1;
        }
        slot
    }

    fn on_hello(
        &mut self,
        hello: Hello,
        addr: SocketAddr,
        from: SocketAddr,
        now: Instant,
        meta: Meta,
        replies: &mut Vec<Reply>,
    ) {
        let key = (addr, hello.header.session);
        let slot = self.control_slot(key, now, meta.socket, true, replies);
        if let Some(slot) = slot {
            let peer = self.tagged.get_mut(slot);
            if !peer.is_finished() {
                peer.seen(now, meta.drops, meta.cpu);
            }
        }
        if !self.limiter.allow(addr.ip(), now) {
            self.totals.answers_limited += 1;
            return;
        }
        let mut flags = 0;
        if self.cfg.gro {
            flags |= wire::ACK_GRO;
        }
        if self.cfg.psk.is_some() {
            flags |= wire::ACK_AUTH;
        }
        if slot.is_none() {
            // Say so, rather than leave the client to conclude that no
            // server is there.
            flags |= wire::ACK_BUSY;
        }
        let ack = HelloAck {
            session: hello.header.session,
            nonce: hello.nonce,
            flags,
            end_grace_ns: self.cfg.end_grace.as_nanos() as u64,
            recv_buffer: self.cfg.recv_buffer,
            cookie: self.reverse.cookie(addr, hello.header.session, now),
        };
        replies.push(Reply {
            bytes: ReplyBytes::Hello(wire::encode_hello_ack(&ack)),
            to: from,
            from: meta.local,
            socket: meta.socket,
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn on_end(
        &mut self,
        end: End,
        raw: &[u8],
        addr: SocketAddr,
        from: SocketAddr,
        now: Instant,
        meta: Meta,
        replies: &mut Vec<Reply>,
    ) {
        if let Some(psk) = &self.cfg.psk {
            if !wire::verify_tag(raw, psk) {
                // Not from a client that knows the key: it changes nothing.
                self.totals.ends_rejected += 1;
                return;
            }
        }
        let key = (addr, end.header.session);
        let known = self.tagged.find(&key).is_some();
        let Some(slot) = self.control_slot(key, now, meta.socket, false, replies) else {
            return;
        };
        if !known {
            // No Hello and no data came first: the server never saw this
            // session start (or forgot it), so its figures are not the
            // session's.
            self.tagged
                .get_mut(slot)
                .tagged
                .as_mut()
                .expect("tagged")
                .unknown_start = true;
        }
        let reply = ReplyTo {
            to: from,
            local: meta.local,
            socket: meta.socket,
            nonce: end.nonce,
        };
        let declared = self
            .tagged
            .get(slot)
            .tagged
            .as_ref()
            .and_then(|t| t.declared);
        match declared {
            Some(first)
                if (first.sent_packets, first.sent_bytes) != (end.sent_packets, end.sent_bytes) =>
            {
                self.conflict(slot, CONFLICT_ENDS, Some(&end), None);
            }
            _ => {}
        }
        if self.tagged.get(slot).is_finished() {
            // A retry: answer from the record, which no longer changes. It
            // shares the socket with whoever is on it now.
            self.join(meta.socket);
            let t = self.tagged.get_mut(slot).tagged.as_mut().expect("tagged");
            if t.declared.is_none() {
                // Finished as idle before its End came: now its totals are
                // known, the figures are fixed, and the record is kept as
                // long as this client will ask.
                t.declared = Some(end);
                t.freeze();
                self.extend_record(slot, now);
            }
            self.answer(slot, reply, now, replies);
            return;
        }
        let grace = self.cfg.end_grace;
        // The grace period runs from when the End is read, not from when it
        // arrived: a receive thread that lags behind must not cut it short.
        let grace_from = meta.processed.max(now);
        let peer = self.tagged.get_mut(slot);
        peer.seen(now, meta.drops, meta.cpu);
        match &mut peer.state {
            State::Closing { reply: pending, .. } => {
                // Answered once the grace period is over, to the latest ask.
                *pending = reply;
            }
            _ => {
                peer.tagged.as_mut().expect("tagged").declared = Some(end);
                peer.state = State::Closing {
                    grace_until: grace_from + grace,
                    reply,
                };
                self.attention = true;
            }
        }
    }

    /// Whether something arrived since the last call that `expire` should
    /// handle sooner than its caller's longest nap (see [`Self::next_due`]).
    pub fn take_attention(&mut self) -> bool {
        std::mem::take(&mut self.attention)
    }

    /// The earliest time `expire` has work that cannot wait: `now` while
    /// events are queued, else the end of the first grace period. Idle
    /// timeouts and record expiry are not in it: they tolerate a nap.
    pub fn next_due(&self, now: Instant) -> Option<Instant> {
        if !self.queued.is_empty() {
            return Some(now);
        }
        self.tagged
            .slots
            .iter()
            .flatten()
            .filter_map(|peer| match peer.state {
                State::Closing { grace_until, .. } => Some(grace_until),
                _ => None,
            })
            .min()
    }

    /// Moves a record's expiry later, if its client now says it will ask
    /// for longer.
    fn extend_record(&mut self, slot: usize, now: Instant) {
        let keep = self.keep_for(self.tagged.get(slot));
        let peer = self.tagged.get_mut(slot);
        let key = (peer.addr, peer.tagged.as_ref().map_or(0, |t| t.session));
        let State::Finished(f) = &mut peer.state else {
            return;
        };
        if f.expiry.0 < now + keep {
            self.expiry.remove(&f.expiry);
            self.expiry_ids += 1;
            f.expiry = (now + keep, self.expiry_ids);
            self.expiry.insert(f.expiry, key);
        }
    }

    /// Sends session `slot`'s answer, if the rate limit allows.
    fn answer(&mut self, slot: usize, reply: ReplyTo, now: Instant, replies: &mut Vec<Reply>) {
        let ip = canonical(reply.to).ip();
        if !self.limiter.allow(ip, now) {
            self.totals.answers_limited += 1;
            return;
        }
        let ack = self
            .tagged
            .get(slot)
            .answer(reply.nonce, self.epoch, &self.flags);
        let bytes = match &self.cfg.psk {
            Some(psk) => wire::encode_end_ack_tagged(&ack, psk),
            None => wire::encode_end_ack(&ack),
        };
        replies.push(Reply {
            bytes: ReplyBytes::End(bytes),
            to: reply.to,
            from: reply.local,
            socket: reply.socket,
        });
    }

    /// Writes a session's last interval and summary, answers its End, and
    /// keeps its record.
    fn finalise(
        &mut self,
        key: SessionKey,
        now: Instant,
        reason: DoneReason,
        events: &mut dyn FnMut(Event),
        replies: &mut Vec<Reply>,
    ) {
        let Some(slot) = self.tagged.find(&key) else {
            return;
        };
        // Short datagrams that came from this address before the session
        // was known belong to it.
        if let Some(m) = self.untagged.remove(&key.0) {
            self.end_peer(m.socket);
            let peer = self.tagged.get_mut(slot);
            merge(peer, m);
        }
        let (reply, socket, proven) = {
            let peer = self.tagged.get_mut(slot);
            let reply = match peer.state {
                State::Closing { reply, .. } => Some(reply),
                _ => None,
            };
            let proven = peer.tagged.as_ref().is_some_and(|t| t.proven);
            (reply, peer.socket, proven)
        };
        let shared = self.tagged.get(slot).shared_now(&self.flags);
        self.tagged.get_mut(slot).shared = shared;
        self.write_done(self.tagged.get(slot), reason, events);
        self.session_ended(key, proven, socket);
        let keep = self.keep_for(self.tagged.get(slot));
        self.expiry_ids += 1;
        let expiry = (now + keep, self.expiry_ids);
        self.expiry.insert(expiry, key);
        {
            let peer = self.tagged.get_mut(slot);
            peer.state = State::Finished(Finished {
                at: now,
                reason,
                late: Amount::default(),
                late_reported: 0,
                last_late: None,
                late_reported_at: None,
                expiry,
            });
            if let Some(t) = peer.tagged.as_mut() {
                t.freeze();
            }
        }
        if let Some(reply) = reply {
            self.answer(slot, reply, now, replies);
        }
        while self.records() > self.records_bound() {
            let Some((_, oldest)) = self.expiry.pop_first() else {
                break;
            };
            self.totals.records_evicted += 1;
            self.forget(oldest, events);
        }
    }

    /// How long a finished session's record is kept: as long as its client
    /// said it would ask, within bounds.
    fn keep_for(&self, peer: &Peer) -> Duration {
        let asked = peer
            .tagged
            .as_ref()
            .and_then(|t| t.declared)
            .map_or(Duration::ZERO, |e| Duration::from_nanos(e.answer_wait_ns));
        asked
            .max(self.cfg.idle_timeout * 2)
            .clamp(KEEP_FINISHED_MIN, KEEP_FINISHED_MAX)
    }

    /// Drops a finished session's record, reporting late datagrams not yet
    /// reported.
    fn forget(&mut self, key: SessionKey, events: &mut dyn FnMut(Event)) {
        if let Some(peer) = self.tagged.remove(&key) {
            if let Some(report) = late_report(&peer) {
                events(Event::Late(report));
            }
        }
        if self.by_addr.get(&key.0) == Some(&key) {
            self.by_addr.remove(&key.0);
        }
    }

    /// Interval lines for every peer that received something since the last
    /// tick. Call every `--interval`.
    /// `cpu_now` is the receive threads' CPU so far, for the lines' CPU.
    pub fn tick_intervals(
        &mut self,
        now: Instant,
        cpu_now: Option<CpuTime>,
        events: &mut dyn FnMut(Event),
    ) {
        let flags = &self.flags;
        for peer in self
            .tagged
            .slots
            .iter_mut()
            .chain(self.untagged.slots.iter_mut())
            .flatten()
        {
            if peer.is_finished() {
                continue;
            }
            let shared = peer.shared_now(flags);
            if let Some(report) = peer.interval(now, cpu_now, shared) {
                events(Event::Interval(report));
                peer.mark = Some(Mark {
                    at: now,
                    total: peer.total,
                    cpu: cpu_now,
                });
            }
        }
    }

    /// Finalises sessions whose grace period is over or that went idle,
    /// summarises idle untagged sources, and forgets finished sessions'
    /// records once no retry can come. Call at [`Self::next_due`], and at
    /// least every 100 ms.
    pub fn expire(
        &mut self,
        now: Instant,
        events: &mut dyn FnMut(Event),
        replies: &mut Vec<Reply>,
    ) {
        self.flush_queued(events);
        let idle = self.cfg.idle_timeout;
        let mut due = Vec::new();
        for peer in self.tagged.slots.iter_mut().flatten() {
            // Stragglers, reported at most once a second per session.
            let due = match &peer.state {
                State::Finished(f) => {
                    f.late.packets > f.late_reported
                        && f.late_reported_at.is_none_or(|at| {
                            now.saturating_duration_since(at) >= Duration::from_secs(1)
                        })
                }
                _ => false,
            };
            if !due {
                continue;
            }
            if let Some(report) = late_report(peer) {
                events(Event::Late(report));
            }
            if let State::Finished(f) = &mut peer.state {
                f.late_reported = f.late.packets;
                f.late_reported_at = Some(now);
            }
        }
        for (key, &slot) in &self.tagged.index {
            let peer = self.tagged.get(slot);
            match peer.state {
                State::Closing { grace_until, .. } if now >= grace_until => {
                    due.push((*key, Some(DoneReason::End)))
                }
                State::Active if now.saturating_duration_since(peer.last_seen) >= idle => {
                    // A probe and nothing else has nothing to report.
                    let reason = (peer.total.packets > 0).then_some(DoneReason::Idle);
                    due.push((*key, reason));
                }
                _ => {}
            }
        }
        for (key, reason) in due {
            match reason {
                Some(reason) => self.finalise(key, now, reason, events, replies),
                None => {
                    if let Some(peer) = self.tagged.remove(&key) {
                        let proven = peer.tagged.as_ref().is_some_and(|t| t.proven);
                        self.session_ended(key, proven, peer.socket);
                    }
                    if self.by_addr.get(&key.0) == Some(&key) {
                        self.by_addr.remove(&key.0);
                    }
                }
            }
        }
        while let Some((&(until, id), &key)) = self.expiry.first_key_value() {
            if until > now {
                break;
            }
            self.expiry.remove(&(until, id));
            self.forget(key, events);
        }
        let idle_sources: Vec<SocketAddr> = self
            .untagged
            .index
            .iter()
            .filter(|(_, &slot)| {
                now.saturating_duration_since(self.untagged.get(slot).last_seen) >= idle
            })
            .map(|(addr, _)| *addr)
            .collect();
        for addr in idle_sources {
            if let Some(peer) = self.untagged.remove(&addr) {
                self.end_peer(peer.socket);
                self.write_done(&peer, DoneReason::Idle, events);
            }
        }
    }

    /// Every unfinished peer's figures so far, as its summary would give
    /// them now (no reason: it is not done), for `--metrics`. Finished
    /// sessions' records are left out: their `peer_done` was the last word.
    pub fn live_reports(&self) -> Vec<PeerReport> {
        self.tagged
            .peers()
            .chain(self.untagged.peers())
            .filter(|peer| !peer.is_finished() && peer.total.packets > 0)
            .map(|peer| peer.summary(peer.shared_now(&self.flags), None))
            .collect()
    }

    /// What session `key` (canonical address, session id) has received so
    /// far: distinct datagrams, their bytes, and one more than the highest
    /// sequence number seen (0 before any). A reverse stream's client
    /// sends them back in its Feedback.
    pub fn session_counts(&self, key: SessionKey) -> Option<(u64, u64, u64)> {
        let peer = self.tagged.peers_find(&key)?;
        let next = peer
            .tagged
            .as_ref()
            .and_then(|t| t.seq.highest())
            .map_or(0, |h| h + 1);
        Some((peer.total.packets, peer.total.bytes, next))
    }

    /// A peer's last interval (when interval lines are on) and summary.
    fn write_done(&self, peer: &Peer, reason: DoneReason, events: &mut dyn FnMut(Event)) {
        let shared = peer.shared_now(&self.flags);
        if self.cfg.intervals {
            if let Some(report) = peer.interval(peer.last, peer.cpu_end, shared) {
                events(Event::Interval(report));
            }
        }
        events(Event::Done(peer.summary(shared, Some(reason))));
    }

    /// Hands over the events queued while a datagram was accounted (an
    /// eviction finalises a session where no event sink is at hand).
    fn flush_queued(&mut self, events: &mut dyn FnMut(Event)) {
        for event in self.queued.drain(..) {
            events(event);
        }
    }

    /// Finalises every unfinished peer and reports every record's
    /// unreported late datagrams; used once, at shutdown. Sessions whose
    /// End arrived are answered.
    pub fn finish_all(
        &mut self,
        now: Instant,
        events: &mut dyn FnMut(Event),
        replies: &mut Vec<Reply>,
    ) {
        self.flush_queued(events);
        for (key, _) in self.tagged.keys() {
            // Finalising one session can evict another's record.
            let Some(slot) = self.tagged.find(&key) else {
                continue;
            };
            let peer = self.tagged.get(slot);
            match peer.state {
                State::Closing { .. } => self.finalise(key, now, DoneReason::End, events, replies),
                State::Active if peer.total.packets > 0 => {
                    self.finalise(key, now, DoneReason::Shutdown, events, replies)
                }
                _ => {}
            }
        }
        for peer in self.untagged.peers() {
            self.write_done(peer, DoneReason::Shutdown, events);
        }
        for peer in self.tagged.peers() {
            if let Some(report) = late_report(peer) {
                events(Event::Late(report));
            }
        }
        self.tagged.clear();
        self.untagged.clear();
        self.by_addr.clear();
        self.expiry.clear();
        self.active_sessions = 0;
        self.unproven_sessions = 0;
        self.sessions_per_ip.clear();
    }
}

/// A received buffer: who sent it, when, where, and what the kernel said
/// about it.
#[derive(Debug, Clone, Copy)]
pub struct Rx {
    /// As received (a v4-mapped address on a dual-stack socket).
    pub from: SocketAddr,
    /// When the kernel received it, on our monotonic clock.
    pub arrived: Instant,
    /// When it was read.
    pub processed: Instant,
    /// Which receive socket.
    pub socket: usize,
    /// The socket's drop counter (a u32 that wraps), where known.
    pub drops: Option<u32>,
    /// The address it was sent to (answers leave from it).
    pub local: Option<IpAddr>,
    /// UDP GRO: the size of each coalesced datagram.
    pub segment_size: Option<usize>,
    /// MSG_TRUNC: the kernel cut it.
    pub truncated: bool,
    /// The receive threads' CPU so far, when known.
    pub cpu: Option<CpuTime>,
}

impl Default for Rx {
    fn default() -> Self {
        let now = Instant::now();
        Rx {
            from: SocketAddr::from(([0, 0, 0, 0], 0)),
            arrived: now,
            processed: now,
            socket: 0,
            drops: None,
            local: None,
            segment_size: None,
            truncated: false,
            cpu: None,
        }
    }
}

/// Where a datagram came in, and what the kernel said about it.
#[derive(Clone, Copy)]
struct Meta {
    socket: usize,
    local: Option<IpAddr>,
    cpu: Option<CpuTime>,
    /// When the datagram was read (its arrival time is the kernel's).
    processed: Instant,
    /// The socket's running drop total, when known.
    drops: Option<u64>,
    /// The first datagram of a coalesced (GRO) buffer.
    coalesced_first: bool,
    truncated: bool,
}

/// Adds an untagged source's datagrams to the session from the same
/// address.
fn merge(peer: &mut Peer, m: Peer) {
    if let Some(t) = peer.tagged.as_mut() {
        t.untagged_packets += m.total.packets;
    }
    match (peer.first, m.first) {
        (_, None) => {}
        (Some(a), Some(b)) if a < b => {}
        (Some(a), Some(b)) if a == b => peer.at_first.add(m.at_first),
        (_, Some(b)) => {
            peer.first = Some(b);
            peer.at_first = m.at_first;
        }
    }
    if peer.total.packets == 0 || m.last > peer.last {
        peer.last = m.last;
    }
    peer.total.add(m.total);
    // Interval lines already written under the source address count for
    // the session: its lines go on from where both left off.
    peer.mark = either(peer.mark, m.mark, |a, b| {
        let mut total = a.total;
        total.add(b.total);
        Mark {
            at: a.at.max(b.at),
            total,
            cpu: a.cpu.or(b.cpu),
        }
    });
    peer.drops_start = either(peer.drops_start, m.drops_start, Ord::min);
    peer.drops_end = either(peer.drops_end, m.drops_end, Ord::max);
    peer.cpu_start = either(peer.cpu_start, m.cpu_start, Ord::min);
    peer.cpu_end = either(peer.cpu_end, m.cpu_end, Ord::max);
    peer.first_seen = peer.first_seen.min(m.first_seen);
    peer.shared |= m.shared;
    peer.gro_buffers += m.gro_buffers;
    peer.truncated += m.truncated;
}

/// Both combined with `both`, or whichever is known.
fn either<T>(a: Option<T>, b: Option<T>, both: impl FnOnce(T, T) -> T) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(both(a, b)),
        (a, b) => a.or(b),
    }
}

/// The session's late datagrams, if some are not reported yet.
fn late_report(peer: &Peer) -> Option<LateReport> {
    let State::Finished(f) = &peer.state else {
        return None;
    };
    if f.late.packets <= f.late_reported {
        return None;
    }
    let t = peer.tagged.as_ref()?;
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

pub use crate::sys::canonical_addr as canonical;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{encode_end, encode_hello, write_data_header, Header};

    const MS: Duration = Duration::from_millis(1);
    /// The instant a [`Harness`]'s table was created, as an offset.
    const START: Duration = Duration::ZERO;

    fn data(session: u64, seq: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        write_data_header(
            &mut buf,
            &Header {
                session,
                seq,
                send_time_ns: seq * 1000,
            },
        );
        buf
    }

    fn end_msg(session: u64, packets: u64, bytes: u64, nonce: u64) -> Vec<u8> {
        encode_end(&End {
            header: Header {
                session,
                seq: packets,
                send_time_ns: 0,
            },
            sent_packets: packets,
            sent_bytes: bytes,
            duration_ns: 0,
            nonce,
            answer_wait_ns: 0,
            sender: None,
            tag: [0; wire::TAG_LEN],
        })
        .to_vec()
    }

    fn hello(session: u64, nonce: u64) -> [u8; wire::HELLO_LEN] {
        encode_hello(&Hello {
            header: Header {
                session,
                ..Header::default()
            },
            nonce,
        })
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// Collects events.
    #[derive(Default)]
    struct Sink {
        done: Vec<PeerReport>,
        intervals: Vec<PeerReport>,
        late: Vec<LateReport>,
        conflicts: Vec<ConflictReport>,
    }

    impl Sink {
        fn f(&mut self) -> impl FnMut(Event) + '_ {
            |e| match e {
                Event::Done(r) => self.done.push(r),
                Event::Interval(r) => self.intervals.push(r),
                Event::Late(r) => self.late.push(r),
                Event::Conflict(r) => self.conflicts.push(r),
            }
        }
    }

    /// A table under test and the events it wrote. Times are offsets from
    /// `t0`, when the table was created; datagrams arrive on socket 0.
    struct Harness {
        table: PeerTable,
        t0: Instant,
        sink: Sink,
        /// The socket's drop counter, as each datagram sent reports it.
        drops: Option<u32>,
    }

    impl Harness {
        fn new() -> Self {
            Self::with(TableConfig::default())
        }

        fn with_max_peers(max_peers: usize) -> Self {
            Self::with(TableConfig {
                max_peers,
                ..TableConfig::default()
            })
        }

        fn with(cfg: TableConfig) -> Self {
            let t0 = Instant::now();
            Harness {
                table: PeerTable::new(cfg, t0),
                t0,
                sink: Sink::default(),
                drops: None,
            }
        }

        /// `bytes` arrive from `from`; the answer, if one is sent at once.
        fn send(&mut self, bytes: &[u8], from: SocketAddr, at: Duration) -> Option<Reply> {
            self.table
                .on_datagram(bytes, from, self.t0 + at, 0, self.drops)
        }

        fn data(
            &mut self,
            from: SocketAddr,
            session: u64,
            seq: u64,
            len: usize,
            at: Duration,
        ) -> Option<Reply> {
            self.send(&data(session, seq, len), from, at)
        }

        fn end(
            &mut self,
            from: SocketAddr,
            session: u64,
            packets: u64,
            bytes: u64,
            nonce: u64,
            at: Duration,
        ) -> Option<Reply> {
            self.send(&end_msg(session, packets, bytes, nonce), from, at)
        }

        /// A Hello whose nonce is its session id.
        fn hello(&mut self, from: SocketAddr, session: u64, at: Duration) -> Option<Reply> {
            self.send(&hello(session, session), from, at)
        }

        fn expire(&mut self, at: Duration) -> Vec<Reply> {
            let mut replies = Vec::new();
            self.table
                .expire(self.t0 + at, &mut self.sink.f(), &mut replies);
            replies
        }

        /// Expires at `at`; the first answer it sends, as an EndAck.
        fn first_ack(&mut self, at: Duration) -> EndAck {
            ack_of(&self.expire(at)[0])
        }

        fn tick(&mut self, at: Duration) {
            self.table
                .tick_intervals(self.t0 + at, None, &mut self.sink.f());
        }
    }

    fn ack_of(reply: &Reply) -> EndAck {
        match wire::decode(reply.bytes.as_slice()) {
            Ok(Message::EndAck(a)) => a,
            other => panic!("not an EndAck: {other:?}"),
        }
    }

    fn hello_flags(reply: Option<Reply>) -> u16 {
        match reply.map(|r| wire::decode(r.bytes.as_slice())) {
            Some(Ok(Message::HelloAck(ack))) => ack.flags,
            other => panic!("not a HelloAck: {other:?}"),
        }
    }

    #[test]
    fn the_answer_waits_for_the_grace_period_and_counts_what_is_in_flight() {
        let mut t = Harness::new();
        let a = addr("127.0.0.1:5000");
        t.drops = Some(0);
        for seq in [0, 1, 3, 2, 2] {
            assert!(t.data(a, 7, seq, 100, START).is_none());
        }
        t.drops = Some(5);
        assert!(
            t.end(a, 7, 6, 600, 11, MS).is_none(),
            "no answer before the grace period is over"
        );
        // Seq 4 and 5 were behind the End; they land within the grace.
        t.data(a, 7, 5, 100, 50 * MS);
        t.data(a, 7, 4, 100, 60 * MS);
        assert!(t.expire(90 * MS).is_empty());
        let replies = t.expire(101 * MS);
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0].to, a);
        let ack = ack_of(&replies[0]);
        assert_eq!(ack.nonce, 11, "the answer echoes the End's nonce");
        assert_eq!((ack.received_packets, ack.received_bytes), (6, 600));
        assert_eq!((ack.lost, ack.lost_fewest), (0, 0));
        assert_eq!((ack.duplicates, ack.reordered), (1, 2));
        assert_eq!(ack.drops_end - ack.drops_start, 5);
        assert_eq!(t.sink.done.len(), 1);
        let done = &t.sink.done[0];
        assert_eq!((done.packets, done.lost), (6, Some(0)));
        assert_eq!(
            done.drops.kernel_drops,
            Some(5),
            "alone on the socket: its own"
        );
        assert_eq!(replies[0].bytes.as_slice().len(), wire::END_LEN);
    }

    #[test]
    fn retries_are_answered_from_the_record_and_stragglers_are_late() {
        let mut t = Harness::new();
        let a = addr("127.0.0.1:5000");
        for seq in 0..10 {
            t.data(a, 7, seq, 100, START);
        }
        t.end(a, 7, 11, 1100, 1, START);
        let first = t.first_ack(200 * MS);
        assert_eq!((first.received_packets, first.lost), (10, 1));
        // The lost datagram turns up 3 s later: late, not a new peer.
        t.data(a, 7, 10, 100, 3000 * MS);
        // A retry 8 s later (the first answer was lost) gets the same figures.
        let retry = t
            .end(a, 7, 11, 1100, 2, 8000 * MS)
            .expect("a retry is answered at once");
        let retry = ack_of(&retry);
        assert_eq!(retry.nonce, 2);
        assert_eq!(
            (retry.received_packets, retry.lost),
            (first.received_packets, first.lost)
        );
        assert_eq!(retry.late, 1);
        t.expire(9000 * MS);
        t.expire(9100 * MS);
        assert_eq!(t.sink.done.len(), 1, "one summary per session, ever");
        assert_eq!(t.sink.late.len(), 1);
        assert_eq!(t.sink.late[0].late_packets, 1);
        assert_eq!(t.table.totals.late_packets, 1);
        // The record goes after KEEP_FINISHED_MIN; nothing is reborn.
        t.expire(11_000 * MS);
        assert!(t.table.is_empty());
        assert_eq!(t.sink.done.len(), 1);
    }

    #[test]
    fn a_record_is_kept_as_long_as_the_client_says_it_will_ask() {
        let mut t = Harness::new();
        let a = addr("127.0.0.1:5000");
        t.data(a, 7, 0, 100, START);
        let mut end = wire::decode(&end_msg(7, 1, 100, 1)).unwrap();
        if let Message::End(e) = &mut end {
            e.answer_wait_ns = 30_000_000_000;
            t.send(&encode_end(e), a, START);
        }
        t.expire(200 * MS);
        t.expire(25_000 * MS);
        let retry = t.end(a, 7, 1, 100, 9, 25_000 * MS);
        assert_eq!(ack_of(&retry.unwrap()).received_packets, 1);
    }

    #[test]
    fn finished_records_are_bounded() {
        let mut t = Harness::with_max_peers(4);
        let bound = t.table.records_bound();
        for port in 0..(bound as u16 + 50) {
            let a = SocketAddr::from(([127, 0, 0, 1], 1000 + port));
            t.end(a, 1, 0, 0, 1, START);
            t.expire(200 * MS);
        }
        assert_eq!(t.table.records(), bound);
        assert_eq!(t.table.totals.records_evicted, 50);
    }

    #[test]
    fn garbage_cannot_evict_a_session() {
        let mut t = Harness::with_max_peers(4);
        let real = addr("10.0.0.1:9");
        t.data(real, 1, 0, 64, START);
        for port in 0..1000u16 {
            let spoofed = SocketAddr::from(([10, 0, 0, 2], port));
            t.send(&[0xFF; 40], spoofed, START);
        }
        t.data(real, 1, 1, 64, START);
        assert!(t.table.len() <= 8);
        assert_eq!(t.table.totals.overflow.packets, 996);
        t.end(real, 1, 2, 128, 3, START);
        let ack = t.first_ack(200 * MS);
        assert_eq!((ack.received_packets, ack.lost), (2, 0));
        assert_eq!(t.table.totals.packets, 1002);
        assert!(
            ack.flags & wire::ACK_DROPS_SHARED != 0,
            "the socket carried other traffic"
        );
    }

    #[test]
    fn ends_that_find_the_table_full_are_counted() {
        let mut t = Harness::with_max_peers(2);
        let a = addr("10.0.0.1:9");
        for i in 0..5 {
            t.end(a, i, 0, 0, 0, START);
        }
        // An End without a Hello makes an unproven session: at most half the
        // table.
        assert_eq!(t.table.totals.ends_table_full, 4);
    }

    #[test]
    fn a_hello_takes_the_slot_of_a_session_seen_only_in_data() {
        let mut t = Harness::with_max_peers(4);
        // A flood of forged data sessions fills its half of the table.
        for port in 0..10u16 {
            let from = SocketAddr::from(([10, 0, 0, 2], port));
            t.data(from, u64::from(port), 0, 64, MS * u32::from(port));
        }
        assert_eq!(t.table.active_sessions, 2);
        assert_eq!(t.table.totals.overflow.packets, 8);
        // Real clients say Hello: two fill the rest, two more evict the
        // forged ones (the one silent longest first).
        for i in 0..4u16 {
            let from = SocketAddr::from(([10, 0, 0, 3], i));
            let flags = hello_flags(t.hello(from, 100 + u64::from(i), MS * 20));
            assert_eq!(flags & wire::ACK_BUSY, 0, "client {i} got in");
        }
        assert_eq!(t.table.totals.sessions_evicted, 2);
        t.expire(MS * 30);
        let evicted: Vec<_> = t
            .sink
            .done
            .iter()
            .filter(|r| r.reason == Some(DoneReason::Evicted))
            .collect();
        assert_eq!(evicted.len(), 2);
        assert_eq!(evicted[0].peer, "10.0.0.2:0", "{evicted:?}");
        // Now the table is full of proven sessions: say so.
        let from = SocketAddr::from(([10, 0, 0, 4], 1));
        let flags = hello_flags(t.hello(from, 200, MS * 40));
        assert_ne!(flags & wire::ACK_BUSY, 0);
    }

    #[test]
    fn one_source_ip_holds_at_most_its_share() {
        let mut t = Harness::with_max_peers(8192);
        assert_eq!(t.table.sessions_per_ip_bound(), 2048);
        for port in 0..3000u16 {
            let from = SocketAddr::from(([10, 0, 0, 5], port));
            t.hello(from, u64::from(port), START);
        }
        assert_eq!(t.table.active_sessions, 2048);
        let other = SocketAddr::from(([10, 0, 0, 6], 1));
        let flags = hello_flags(t.hello(other, 1, START));
        assert_eq!(flags & wire::ACK_BUSY, 0, "another IP still gets in");
    }

    #[test]
    fn conflicting_ends_and_data_beyond_the_total_are_disputed() {
        let mut t = Harness::new();
        let a = addr("127.0.0.1:5000");
        t.hello(a, 7, START);
        for seq in 0..100 {
            t.data(a, 7, seq, 100, START);
        }
        // A forged End declares 50; the real data goes on.
        t.end(a, 7, 50, 5000, 1, START);
        t.expire(200 * MS);
        for seq in 100..150 {
            t.data(a, 7, seq, 100, 300 * MS);
        }
        let real = t.end(a, 7, 150, 15_000, 2, 400 * MS).unwrap();
        let ack = ack_of(&real);
        assert_ne!(ack.flags & wire::ACK_CONFLICT, 0, "the answer says so");
        t.expire(500 * MS);
        assert_eq!(
            t.sink.conflicts.len(),
            1,
            "reported once: {:?}",
            t.sink.conflicts
        );
        assert_eq!(t.sink.conflicts[0].conflict, CONFLICT_DATA);
        assert_eq!(t.table.totals.conflicts, 1);
        // Two Ends that disagree, without any data after them.
        let b = addr("127.0.0.1:5001");
        t.data(b, 8, 0, 100, START);
        t.end(b, 8, 1, 100, 1, START);
        t.end(b, 8, 5, 500, 2, START);
        t.expire(600 * MS);
        assert_eq!(t.sink.conflicts[1].conflict, CONFLICT_ENDS);
        assert_eq!(t.sink.done.last().unwrap().conflict, Some(CONFLICT_ENDS));
    }

    #[test]
    fn with_a_key_only_tagged_ends_count_and_answers_are_tagged() {
        let psk = Psk::new(b"a shared secret").unwrap();
        let mut t = Harness::with(TableConfig {
            psk: Some(psk.clone()),
            ..TableConfig::default()
        });
        let a = addr("127.0.0.1:5000");
        let flags = hello_flags(t.hello(a, 7, START));
        assert_ne!(
            flags & wire::ACK_AUTH,
            0,
            "the Hello answer says a key is needed"
        );
        for seq in 0..10 {
            t.data(a, 7, seq, 100, START);
        }
        // A forged End (no tag) changes nothing.
        t.end(a, 7, 3, 300, 1, START);
        assert_eq!(t.table.totals.ends_rejected, 1);
        assert!(t.expire(200 * MS).is_empty());
        let Ok(Message::End(end)) = wire::decode(&end_msg(7, 10, 1000, 2)) else {
            panic!()
        };
        t.send(&wire::encode_end_tagged(&end, &psk), a, 300 * MS);
        let replies = t.expire(500 * MS);
        let raw = replies[0].bytes.as_slice();
        assert!(wire::verify_tag(raw, &psk), "the answer carries the tag");
        let ack = ack_of(&replies[0]);
        assert_ne!(ack.flags & wire::ACK_AUTH, 0);
        assert_eq!((ack.received_packets, ack.lost, ack.nonce), (10, 0, 2));
        let other = Psk::new(b"another secret").unwrap();
        assert!(!wire::verify_tag(raw, &other));
    }

    #[test]
    fn records_free_their_sequence_sets() {
        let mut t = Harness::new();
        let a = addr("127.0.0.1:5000");
        // Every other datagram lost: 2000 holes.
        for seq in (0..4000).step_by(2) {
            t.data(a, 7, seq, 100, START);
        }
        t.end(a, 7, 4000, 400_000, 1, START);
        let first = t.first_ack(200 * MS);
        let slot = t.table.tagged.find(&(a, 7)).unwrap();
        assert!(
            t.table
                .tagged
                .get(slot)
                .tagged
                .as_ref()
                .unwrap()
                .seq
                .ranges()
                <= 1
        );
        let retry = ack_of(&t.end(a, 7, 4000, 400_000, 2, 300 * MS).unwrap());
        assert_eq!(
            (retry.lost, retry.received_packets),
            (first.lost, first.received_packets)
        );
        assert_eq!(retry.lost, 2000);
    }

    #[test]
    fn shutting_down_with_a_full_record_table_does_not_panic() {
        // Found in review: finalising at shutdown evicted records that the
        // loop was still to visit.
        let mut t = Harness::with_max_peers(4);
        let bound = t.table.records_bound();
        for port in 0..bound as u16 {
            let a = SocketAddr::from(([127, 0, 0, 1], 1000 + port));
            t.hello(a, 1, START);
            t.end(a, 1, 0, 0, 1, START);
            t.expire(200 * MS);
        }
        for port in 0..3u16 {
            let a = SocketAddr::from(([127, 0, 0, 2], port));
            t.data(a, 9, 0, 100, 300 * MS);
        }
        let mut replies = Vec::new();
        t.table
            .finish_all(t.t0 + 400 * MS, &mut t.sink.f(), &mut replies);
        assert!(t.table.is_empty());
    }

    #[test]
    fn an_end_for_a_session_never_seen_says_so() {
        let mut t = Harness::new();
        let a = addr("127.0.0.1:5000");
        t.end(a, 7, 10, 1000, 1, START);
        let ack = t.first_ack(200 * MS);
        assert_ne!(ack.flags & wire::ACK_NO_RECORD, 0);
        // With a Hello first, all data lost is a real 100 % loss.
        let b = addr("127.0.0.1:5001");
        t.hello(b, 8, START);
        t.end(b, 8, 10, 1000, 1, START);
        let ack = t.first_ack(400 * MS);
        assert_eq!(ack.flags & wire::ACK_NO_RECORD, 0);
        assert_eq!(ack.lost, 10);
    }

    #[test]
    fn answers_are_rate_limited_per_source() {
        let mut t = Harness::with_max_peers(4096);
        let a = addr("10.0.0.1:9");
        let answered = (0..3000)
            .filter(|&i| t.hello(a, i, START).is_some())
            .count();
        assert_eq!(answered, ANSWERS_PER_SECOND as usize);
        assert_eq!(
            t.table.totals.answers_limited,
            3000 - ANSWERS_PER_SECOND as u64
        );
        let reply = t.hello(a, 1, Duration::from_millis(1001)).unwrap();
        let Ok(Message::HelloAck(ack)) = wire::decode(reply.bytes.as_slice()) else {
            panic!("not a HelloAck")
        };
        assert_eq!((ack.session, ack.nonce), (1, 1));
        assert!(reply.bytes.as_slice().len() <= wire::HELLO_LEN);
    }

    #[test]
    fn a_probe_alone_leaves_no_summary() {
        let mut t = Harness::new();
        let a = addr("10.0.0.1:9");
        assert!(t.send(&hello(5, 1), a, START).is_some());
        assert_eq!(t.table.len(), 1);
        t.expire(Duration::from_secs(3));
        assert!(t.table.is_empty());
        assert!(t.sink.done.is_empty());
    }

    #[test]
    fn idle_peers_are_summarised_and_their_stragglers_are_late() {
        let mut t = Harness::new();
        let a = addr("[::1]:1");
        let b = addr("[::1]:2");
        t.data(a, 3, 0, 100, START);
        t.data(a, 3, 2, 100, 1000 * MS);
        t.send(b"hello", b, START);
        t.expire(2500 * MS);
        assert_eq!(
            t.sink.done.len(),
            1,
            "untagged peer idle, tagged still active"
        );
        t.expire(3100 * MS);
        assert_eq!(t.sink.done.len(), 2);
        let tagged = t.sink.done.iter().find(|r| r.tagged).unwrap();
        assert_eq!(tagged.loss_basis, Some("sequence"));
        assert_eq!(tagged.lost, Some(1));
        assert_eq!(tagged.seconds, 1.0);
        assert_eq!(tagged.reason, Some(DoneReason::Idle));
        // A datagram of that session after it went idle is late.
        t.data(a, 3, 3, 100, 4000 * MS);
        assert_eq!(t.table.totals.late_packets, 1);
        // An End after the idle summary is answered, flagged as such.
        let reply = t.end(a, 3, 4, 400, 8, 4100 * MS).unwrap();
        let ack = ack_of(&reply);
        assert!(ack.flags & wire::ACK_IDLE_FINISHED != 0);
        assert_eq!((ack.received_packets, ack.lost, ack.late), (2, 2, 1));
        t.expire(Duration::from_secs(30));
        assert!(t.table.is_empty());
        assert_eq!(t.sink.done.len(), 2);
    }

    #[test]
    fn gro_buffers_are_split_into_their_datagrams() {
        let mut t = Harness::with(TableConfig {
            sockets: 2,
            gro: true,
            ..TableConfig::default()
        });
        let a = addr("127.0.0.1:7");
        // Five 100-byte datagrams and a 40-byte tail, coalesced.
        let mut buf = Vec::new();
        for seq in 0..5 {
            buf.extend_from_slice(&data(4, seq, 100));
        }
        buf.extend_from_slice(&data(4, 5, 40));
        let mut replies = Vec::new();
        let rx = Rx {
            from: a,
            arrived: t.t0,
            processed: t.t0,
            socket: 1,
            drops: Some(3),
            segment_size: Some(100),
            ..Rx::default()
        };
        t.table.on_receive(&buf, &rx, &mut replies);
        // The end-of-test message may be the last, shorter segment of a GRO
        // buffer.
        let mut tail = data(4, 6, 300);
        tail.extend_from_slice(&end_msg(4, 7, 840, 1)[..]);
        let rx = Rx {
            arrived: t.t0 + 10 * MS,
            processed: t.t0 + 10 * MS,
            segment_size: Some(300),
            ..rx
        };
        t.table.on_receive(&tail, &rx, &mut replies);
        let replies = t.expire(200 * MS);
        let ack = ack_of(&replies[0]);
        assert_eq!(
            (ack.received_packets, ack.received_bytes, ack.lost),
            (7, 840, 0)
        );
        assert_eq!(
            ack.drops_end - ack.drops_start,
            0,
            "drops from the peer's start"
        );
        assert_eq!(ack.gro_buffers, 2, "both buffers held several datagrams");
        assert_eq!(t.sink.done[0].drops.kernel_drops_unit, Some("buffers"));
        assert_eq!(t.table.kernel_drops(), Some(3));
        assert_eq!(
            (ack.first_arrival_packets, ack.first_arrival_bytes),
            (6, 540),
            "the first GRO buffer arrived at one instant"
        );
    }

    #[test]
    fn a_gro_buffer_in_one_step_counts_as_its_datagrams_would() {
        // The same GRO buffers into two tables: one takes in-order runs in
        // one step, the other goes datagram by datagram. Buffers: in order,
        // after a gap, a repeat, one from the past, a short tail, then the
        // End; every figure of the answer and the summary must agree.
        let a = addr("127.0.0.1:7");
        let (mut fast, mut slow) = (Harness::new(), Harness::new());
        let buffer = |seqs: std::ops::Range<u64>, last_len: usize| {
            let mut buf = Vec::new();
            for seq in seqs.clone() {
                let len = if seq + 1 == seqs.end { last_len } else { 100 };
                buf.extend_from_slice(&data(4, seq, len));
            }
            buf
        };
        let buffers = [
            (buffer(0..10, 100), START),
            (buffer(10..30, 100), MS),
            (buffer(35..44, 100), 2 * MS),
            (buffer(35..44, 100), 3 * MS),
            (buffer(30..35, 100), 4 * MS),
            (buffer(44..60, 40), 5 * MS),
        ];
        for t in [&mut fast, &mut slow] {
            t.hello(a, 4, START);
        }
        for (runs, t) in [(true, &mut fast), (false, &mut slow)] {
            for (i, (buf, at)) in buffers.iter().enumerate() {
                let rx = Rx {
                    from: a,
                    arrived: t.t0 + *at,
                    processed: t.t0 + *at,
                    drops: Some(i as u32),
                    segment_size: Some(100),
                    ..Rx::default()
                };
                t.table.receive(buf, &rx, &mut Vec::new(), runs);
            }
            t.end(a, 4, 60, 59 * 100 + 40, 1, 6 * MS);
        }
        let (f, s) = (fast.first_ack(300 * MS), slow.first_ack(300 * MS));
        assert_eq!(format!("{f:?}"), format!("{s:?}"));
        assert_eq!((f.received_packets, f.lost), (60, 0));
        assert_eq!(
            format!("{:?}", fast.sink.done),
            format!("{:?}", slow.sink.done)
        );
        assert_eq!(fast.table.totals.packets, slow.table.totals.packets);
        assert_eq!(fast.table.totals.bytes, slow.table.totals.bytes);
    }

    #[test]
    fn kernel_drop_counters_wrap_as_u32() {
        let mut t = Harness::new();
        let a = addr("127.0.0.1:7");
        t.drops = Some(u32::MAX - 2);
        t.data(a, 1, 0, 100, START);
        t.drops = Some(4);
        t.data(a, 1, 1, 100, START);
        t.end(a, 1, 2, 200, 1, START);
        t.expire(200 * MS);
        assert_eq!(t.sink.done[0].drops.kernel_drops, Some(7));
    }

    #[test]
    fn short_datagrams_count_in_their_session_and_their_drops_too() {
        // -b 10: every datagram untagged. Drops counted from the first.
        let mut t = Harness::new();
        let a = addr("127.0.0.1:7");
        for i in 0..5u32 {
            t.drops = Some(i * 2);
            t.send(&[0u8; 10], a, MS * i);
        }
        t.drops = Some(10);
        t.end(a, 9, 10, 100, 1, 5 * MS);
        let ack = t.first_ack(200 * MS);
        assert_eq!((ack.received_packets, ack.lost), (5, 5));
        assert_eq!(ack.drops_end - ack.drops_start, 10);
        assert_eq!(t.sink.done[0].untagged_packets, 5);
        // With a session already there, they count in it directly.
        t.drops = None;
        let b = addr("127.0.0.1:8");
        t.data(b, 2, 0, 100, START);
        t.send(&[0u8; 3], b, MS);
        t.end(b, 2, 2, 103, 1, MS);
        let ack = t.first_ack(300 * MS);
        assert_eq!(
            (ack.received_packets, ack.received_bytes, ack.lost),
            (2, 103, 0)
        );
    }

    #[test]
    fn interval_lines_add_up_to_the_summary() {
        let mut t = Harness::with(TableConfig {
            intervals: true,
            ..TableConfig::default()
        });
        let a = addr("127.0.0.1:7");
        for seq in 0..100 {
            t.data(a, 1, seq, 1000, MS * (seq as u32 * 10));
            if seq % 30 == 29 {
                t.tick(MS * (seq as u32 * 10 + 5));
            }
        }
        t.end(a, 1, 100, 100_000, 1, 1000 * MS);
        t.expire(1200 * MS);
        let done = &t.sink.done[0];
        let sum: u64 = t.sink.intervals.iter().map(|r| r.packets).sum();
        let bytes: u64 = t.sink.intervals.iter().map(|r| r.bytes).sum();
        assert_eq!(t.sink.intervals.len(), 4, "three ticks and the last part");
        assert_eq!((sum, bytes), (done.packets, done.bytes));
        // 100 datagrams 10 ms apart: 99 gaps of 10 ms, 1000 bytes each.
        let gbps = done.gbps.unwrap();
        assert!((gbps - 0.0008).abs() < 1e-12, "{gbps}");
    }

    #[test]
    fn rates_of_very_short_runs_are_unknown() {
        let mut t = Harness::new();
        let a = addr("127.0.0.1:7");
        for seq in 0..3 {
            let at = Duration::from_micros(18) * seq as u32;
            t.data(a, 1, seq, 1000, at);
        }
        t.end(a, 1, 3, 3000, 1, MS);
        let ack = t.first_ack(200 * MS);
        assert_eq!(t.sink.done[0].gbps, None);
        assert_eq!(ack.last_arrival_ns - ack.first_arrival_ns, 36_000);
    }

    #[test]
    fn a_forged_far_sequence_number_does_not_wrap_the_loss() {
        let mut t = Harness::new();
        let a = addr("127.0.0.1:7");
        for seq in [0, 1, u64::MAX, 2] {
            t.data(a, 1, seq, 100, START);
        }
        t.tick(MS);
        t.end(a, 1, 3, 300, 1, START);
        let ack = t.first_ack(200 * MS);
        assert_eq!((ack.lost, ack.unexpected), (0, 1));
        assert_eq!(t.sink.done[0].lost, Some(0));
        assert_eq!(t.sink.done[0].unexpected, 1);
    }

    #[test]
    fn dual_stack_addresses_are_canonical() {
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:80".parse().unwrap();
        assert_eq!(
            canonical(mapped),
            "127.0.0.1:80".parse::<SocketAddr>().unwrap()
        );
    }
}
