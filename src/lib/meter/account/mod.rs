//! The receiver's bounded table of peers (the server's for uploads, a
//! client's for a reverse stream): who sent what, and when they are
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
//! Why nothing before proof: a Hello proves nothing about its source
//! address, which anyone can forge. So a Hello creates nothing: it is
//! answered, no larger than itself, with the address cookie (QUIC's
//! Retry, DTLS's HelloVerifyRequest), and only a Hello that echoes that
//! cookie creates a session, proven: its source receives where it sends
//! from. Sessions seen only in data (forged, or a sender that never said
//! Hello) have a budget of their own, half the table and a quarter of
//! that per source (an IPv4 address, an IPv6 /64); a proven session that
//! finds the table full takes the slot of the one silent longest, and
//! they are never reported one by one: their datagrams, Ends and probes
//! are counted in the totals per reason. Proven sessions are counted
//! apart: one source holds at most a quarter of the table of them (but
//! room for `--clients 1024`). Answers to a proven session come from its
//! own budget; everything else from budgets kept in hashed buckets (per
//! source address and port, per source, server-wide), never in state per
//! source. A flood of forged Hellos or probes, from anywhere or from a
//! client's own address, can then take neither the room nor the answers
//! a real client needs.
//!
//! The table is split by concern: this file holds its shape and the
//! receive dispatch (a datagram in, decoded once, handed to the code that
//! owns its kind); `admission.rs` who gets a slot and an answer; `peer.rs`
//! one peer's figures and its answer to an End; `exchange.rs` the
//! Hello/End exchange and a session's data; `expiry.rs` time (intervals,
//! grace periods, idle peers, records); `report.rs` what is reported;
//! `history.rs` a session's figures per interval of send time, kept when
//! its Hello asked, and the pages that carry them back.

use crate::auth::Psk;
use crate::stats::delay::{QueueDelay, Spread};
use crate::stats::{
    self, percent, wire_bytes, Arrival, CpuCost, CpuTime, Jitter, KernelDrops, LossSplit, RateSpan,
    SeqSet,
};
use crate::wire::{self, End, EndAck, Hello, HelloAck, Message};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Answers per source address (IP and port) per second, for requests not
/// of a proven session: a client asks at most 5 times a second.
pub const ANSWERS_PER_SOURCE: u32 = 64;
/// Unproven answers per source (an IPv4 address, an IPv6 /64) per second:
/// room for `--clients 1024` on one host asking twice within a second,
/// and for a flood forged from that host's own address beside them. What
/// an unproven source draws toward one address is at most this many
/// answers, each no larger than its request.
pub const ANSWERS_PER_PREFIX: u32 = 8192;
/// Unproven answers per second, all sources together: the most work a
/// flood of forged requests can make the server do.
pub const UNPROVEN_ANSWERS: u32 = 65536;
/// Of those, answers to probes without a valid cookie: a probe gets its
/// cookie from a Hello, so a flood of these takes nothing a client needs.
pub const UNPROVEN_PROBE_ANSWERS: u32 = 1024;
/// Answers per proven session per second.
pub const ANSWERS_PER_SESSION: u32 = 64;
/// Answers per second to requests proven by their cookie but kept in no
/// state (a client's probes, 20 a second; its Starts), per address, port
/// and session.
pub const ANSWERS_PER_FLOW: u32 = 128;
/// Sources that sent datagrams of other versions, reported one line each
/// per interval; more are only counted.
pub const WRONG_VERSION_SOURCES: usize = 64;

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

/// Most finished sessions' records kept, whatever `--max-peers` says.
pub const MAX_RECORDS: usize = 65536;

mod admission;
mod exchange;
mod expiry;
mod history;
mod peer;
mod report;

use admission::*;
pub use admission::{source_prefix, Asker};
use history::{History, Room};
pub use history::{INTERVALS_BUDGET, MOST_INTERVALS, SHORTEST_INTERVAL};
use peer::*;
pub use report::*;

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
    /// Every receive socket stamps datagrams with the kernel's receive
    /// time (SO_TIMESTAMPNS); else they are timed when read.
    pub kernel_times: bool,
    /// What the kernel granted for SO_RCVBUF, for the Hello answer.
    pub recv_buffer: u64,
    /// Interval lines are written: the last partial interval of a peer is
    /// written before its summary, so that interval lines add up to it.
    pub intervals: bool,
    /// `--psk`: Ends must carry its tag, and answers carry it.
    pub psk: Option<Psk>,
}

impl Default for TableConfig {
    fn default() -> Self {
        TableConfig {
            max_peers: 4096,
            idle_timeout: Duration::from_secs(2),
            end_grace: Duration::from_millis(100),
            sockets: 1,
            gro: false,
            kernel_times: false,
            recv_buffer: 0,
            intervals: false,
            psk: None,
        }
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
    /// The send time of the first datagram of its GRO buffer, which
    /// stands for the buffer's datagrams in the queue delay (they were
    /// sent in one batch and arrived together).
    buffer_sent_ns: Option<u64>,
}

impl At {
    fn new(now: Instant, epoch: Instant) -> Self {
        let since = now.saturating_duration_since(epoch);
        At {
            now,
            ns: since.as_secs() * 1_000_000_000 + u64::from(since.subsec_nanos()),
            jitter: true,
            buffer_sent_ns: None,
        }
    }
}

/// What the table asks its owner to do.
pub enum Event {
    Interval(PeerReport),
    Done(PeerReport),
    Late(LateReport),
    Conflict(ConflictReport),
    /// A source sent datagrams of another version of netspeed (one per
    /// source and interval).
    WrongVersion(VersionReport),
}

/// Traffic that found its table full.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Overflow {
    pub packets: u64,
    pub bytes: u64,
}

pub(super) type SessionKey = (SocketAddr, u64);

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
    /// Answers refused by a budget.
    pub answers_limited: u64,
    /// Confirming Hellos that found the table (or their source's share)
    /// full: answered busy.
    pub hellos_table_full: u64,
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
    /// What came from sessions never proven, by reason: answered without
    /// state, or counted in bulk, never reported one by one.
    #[serde(flatten)]
    pub not_proven: NotProven,
    /// Control messages read (Hello, End, probes, a reverse stream's
    /// Start and Feedback, and any answer): not in `packets`.
    pub control_packets: u64,
    /// Buffers read that held several datagrams (UDP GRO), and those
    /// datagrams: the basis of the socket's drops in datagrams.
    pub gro_buffers: u64,
    pub gro_datagrams: u64,
}

/// What the table saw of sessions never proven, by reason (a `total`
/// event shows each over its span; `--metrics` since the start).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct NotProven {
    /// Hellos without a valid cookie: answered with the cookie, no state.
    pub hellos: u64,
    /// Ends for sessions the table does not know: answered "no record",
    /// no state.
    pub ends_unknown: u64,
    /// Ends, and datagrams, of sessions seen only in data.
    pub ends_unproven: u64,
    pub unproven_packets: u64,
    pub unproven_bytes: u64,
    /// Sessions seen only in data that finished (idle, End, evicted).
    pub unproven_sessions: u64,
    /// Probes without a valid cookie.
    pub probes_unproven: u64,
    /// Datagrams with netspeed's magic and another version: answered with
    /// the versions this server speaks.
    pub wrong_version: u64,
}

impl NotProven {
    /// What grew since `then`.
    pub fn since(&self, then: &NotProven) -> NotProven {
        NotProven {
            hellos: self.hellos.saturating_sub(then.hellos),
            ends_unknown: self.ends_unknown.saturating_sub(then.ends_unknown),
            ends_unproven: self.ends_unproven.saturating_sub(then.ends_unproven),
            unproven_packets: self.unproven_packets.saturating_sub(then.unproven_packets),
            unproven_bytes: self.unproven_bytes.saturating_sub(then.unproven_bytes),
            unproven_sessions: self
                .unproven_sessions
                .saturating_sub(then.unproven_sessions),
            probes_unproven: self.probes_unproven.saturating_sub(then.probes_unproven),
            wrong_version: self.wrong_version.saturating_sub(then.wrong_version),
        }
    }

    /// Datagrams counted here, of every reason (bytes aside).
    pub fn datagrams(&self) -> u64 {
        self.hellos
            + self.ends_unknown
            + self.ends_unproven
            + self.unproven_packets
            + self.probes_unproven
            + self.wrong_version
    }

    /// Anything at all.
    pub fn any(&self) -> bool {
        *self != NotProven::default()
    }
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

/// An answer's bytes, without allocating: an EndAck, a HelloAck, a
/// StartAck or a ProbeAck (a version negotiation answer, rare, allocates).
#[derive(Debug, Clone)]
pub enum ReplyBytes {
    End([u8; wire::END_LEN]),
    Hello([u8; wire::HELLO_LEN]),
    Start([u8; wire::START_LEN]),
    Probe([u8; wire::PROBE_LEN]),
    Versions(Vec<u8>),
    /// A page of intervals (rare, and larger than the others: boxed).
    Intervals(Box<[u8; wire::INTERVALS_LEN]>),
}

impl ReplyBytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            ReplyBytes::End(b) => b,
            ReplyBytes::Hello(b) => b,
            ReplyBytes::Start(b) => b,
            ReplyBytes::Probe(b) => b,
            ReplyBytes::Versions(b) => b,
            ReplyBytes::Intervals(b) => &b[..],
        }
    }
}

/// The peer table.
pub struct PeerTable {
    cfg: TableConfig,
    /// Sessions in every state, finished ones included.
    tagged: Slab<SessionKey, Session>,
    untagged: Slab<SocketAddr, Peer>,
    /// The latest session seen from each source address, for datagrams
    /// too short to carry a session id.
    by_addr: HashMap<SocketAddr, SessionKey>,
    /// Sessions not yet finished, those of them seen only in data, and
    /// per source IP.
    active_sessions: usize,
    unproven_sessions: usize,
    /// Unfinished sessions per source (IPv4 address, IPv6 /64): proven
    /// ones, and those seen only in data (separate budgets).
    proven_per_source: HashMap<IpAddr, usize>,
    unproven_per_source: HashMap<IpAddr, usize>,
    /// Sources that sent another version this interval, and how many;
    /// when they were last reported.
    wrong_versions: BTreeMap<IpAddr, WrongVersion>,
    versions_flushed: Instant,
    /// Finished sessions' records, by when they may go.
    expiry: BTreeMap<(Instant, u64), SessionKey>,
    expiry_ids: u64,
    epoch: Instant,
    budget: AnswerBudget,
    sockets: Vec<SocketState>,
    flags: TableFlags,
    ranges_per_session: usize,
    /// The room for the intervals sessions keep (`history.rs`).
    room: Room,
    /// Events that arise as datagrams arrive (a conflict, an eviction),
    /// handed on at the next `expire` (or `finish_all`).
    queued: Vec<Event>,
    /// Something arrived that the thread calling `expire` should see
    /// before its next regular look: a queued event or a new grace period.
    attention: bool,
    pub totals: Totals,
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
            proven_per_source: HashMap::new(),
            unproven_per_source: HashMap::new(),
            wrong_versions: BTreeMap::new(),
            versions_flushed: now,
            expiry: BTreeMap::new(),
            expiry_ids: 0,
            epoch: now,
            budget: AnswerBudget::new(now),
            sockets: vec![SocketState::default(); sockets],
            flags: TableFlags {
                gro: cfg.gro,
                kernel_times: cfg.kernel_times,
                socket_joins: vec![0; sockets],
            },
            ranges_per_session,
            room: Room::default(),
            queued: Vec::new(),
            attention: false,
            totals: Totals::default(),
            cfg,
        }
    }

    /// Finished sessions' records kept at most.
    pub fn records_bound(&self) -> usize {
        (self.cfg.max_peers * 4).clamp(1024, MAX_RECORDS)
    }

    /// Most unfinished proven sessions from one source (an IPv4 address,
    /// an IPv6 /64): a quarter of the table, but always room for
    /// `--clients 1024` (or the whole table, if smaller).
    pub fn sessions_per_ip_bound(&self) -> usize {
        (self.cfg.max_peers / 4).max(self.cfg.max_peers.min(1024))
    }

    /// Most unfinished sessions seen only in data (no Hello), in all ...
    pub fn unproven_bound(&self) -> usize {
        (self.cfg.max_peers / 2).max(1)
    }

    /// ... and from one source: a quarter of that.
    pub fn unproven_per_source_bound(&self) -> usize {
        (self.unproven_bound() / 4).max(1)
    }

    /// Peers tracked right now: unfinished ones, and finished sessions'
    /// records.
    pub fn len(&self) -> usize {
        self.tagged.len() + self.untagged.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Peers not finished that have sent data: sessions and untagged
    /// sources. A session that has only said Hello (a client about to
    /// start, or one that only probes round trips) is not counted.
    pub fn active_peers(&self) -> usize {
        let sessions = self
            .tagged
            .peers()
            .filter(|s| !s.is_finished() && s.total.packets > 0)
            .count();
        sessions + self.untagged.len()
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

    /// Accounts one received buffer: a datagram, or with UDP_GRO several
    /// datagrams of `rx.segment_size` bytes (the last may be shorter) from
    /// one flow. Answers to send are pushed to `replies`.
    pub fn on_receive(&mut self, data: &[u8], rx: &Rx, replies: &mut Vec<Reply>) {
        self.receive(data, rx, replies, true, &mut NoControl)
    }

    /// [`Self::on_receive`], handing the control messages this engine
    /// does not handle itself (Start, Feedback, the EndAck of a stream
    /// this host sent) to `control`, which also gives HelloAcks their
    /// address cookie.
    pub fn on_receive_with(
        &mut self,
        data: &[u8],
        rx: &Rx,
        replies: &mut Vec<Reply>,
        control: &mut dyn Control,
    ) {
        self.receive(data, rx, replies, true, control)
    }

    /// [`Self::on_receive`]; `runs` false accounts every GRO buffer
    /// datagram by datagram (tests compare the two).
    fn receive(
        &mut self,
        data: &[u8],
        rx: &Rx,
        replies: &mut Vec<Reply>,
        runs: bool,
        control: &mut dyn Control,
    ) {
        let at = At::new(rx.arrived, self.epoch);
        let drops = self.socket_drops(rx.socket, rx.drops);
        if rx.truncated {
            self.totals.truncated += 1;
        }
        let meta = Meta {
            socket: rx.socket,
            local: rx.local,
            cpu: rx.cpu,
            handled: Handled {
                datagrams: self.totals.packets,
                peers_started: self.totals.peers,
            },
            processed: rx.processed,
            drops,
            coalesced_first: false,
            coalesced: false,
            truncated: rx.truncated,
        };
        match rx.segment_size {
            Some(seg) if seg > 0 && data.len() > seg => {
                if !(runs && self.account_run(data, seg, rx.from, at, meta)) {
                    self.account_each(data, seg, rx.from, at, meta, replies, control);
                }
            }
            _ => self.account(data, rx.from, at, meta, replies, control),
        }
    }

    /// A GRO buffer, datagram by datagram. Coalesced datagrams arrived
    /// together: jitter is measured once per buffer (its first datagram);
    /// the others would only add zeros from the shared arrival time.
    #[allow(clippy::too_many_arguments)]
    fn account_each(
        &mut self,
        data: &[u8],
        segment: usize,
        from: SocketAddr,
        at: At,
        meta: Meta,
        replies: &mut Vec<Reply>,
        control: &mut dyn Control,
    ) {
        let buffer_sent_ns = match wire::decode(&data[..segment.min(data.len())]) {
            Ok(Message::Data(first)) => Some(first.send_time_ns),
            _ => None,
        };
        for (i, chunk) in data.chunks(segment).enumerate() {
            let at = At {
                jitter: i == 0,
                buffer_sent_ns,
                ..at
            };
            let meta = Meta {
                coalesced_first: i == 0,
                coalesced: true,
                truncated: meta.truncated && i == 0,
                ..meta
            };
            self.account(chunk, from, at, meta, replies, control);
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
        let (mut count, mut last_sent) = (1u64, first.send_time_ns);
        for chunk in data.chunks(segment).skip(1) {
            match wire::decode(chunk) {
                Ok(Message::Data(h))
                    if h.session == first.session && h.seq == first.seq + count =>
                {
                    count += 1;
                    last_sent = h.send_time_ns;
                }
                _ => return false,
            }
        }
        let addr = canonical(from);
        let Some(slot) = self.tagged.find(&(addr, first.session)) else {
            return false;
        };
        let peer = self.tagged.get_mut(slot);
        if peer.is_finished() || !peer.tagged.proven {
            return false;
        }
        let t = &mut peer.tagged;
        // Kept per interval: one interval's datagrams, or one by one.
        let split = |h: &History| !h.same_interval(first.send_time_ns, last_sent);
        if t.history.as_ref().is_some_and(split) {
            return false;
        }
        if t.declared.is_some() || !t.seq.record_run(first.seq, count) {
            return false;
        }
        if at.jitter {
            t.jitter.record(first.send_time_ns, at.ns);
        }
        // The buffer's datagrams were sent together (one batch) and share
        // one arrival time: one delay, counted for each of them.
        let delay_us = t.delay.record(first.send_time_ns, at.ns, count);
        if let Some(h) = t.history.as_mut() {
            let bytes = data.len() as u64;
            h.record(first.send_time_ns, first.seq, count, bytes, delay_us);
        }
        let last_len = data.len() - (count as usize - 1) * segment;
        let ipv6 = peer.addr.is_ipv6();
        let amount = Amount {
            packets: count,
            bytes: data.len() as u64,
            wire: (count - 1) * wire_bytes(segment as u64, ipv6)
                + wire_bytes(last_len as u64, ipv6),
        };
        peer.seen(at.now, meta.drops, meta.cpu, meta.handled);
        peer.gro_buffers += 1;
        peer.gro_datagrams += count;
        self.totals.gro_buffers += 1;
        self.totals.gro_datagrams += count;
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
        control: &mut dyn Control,
    ) {
        let addr = canonical(from);
        if meta.coalesced_first {
            self.totals.gro_buffers += 1;
        }
        if meta.coalesced {
            self.totals.gro_datagrams += 1;
        }
        let decoded = wire::decode(data);
        // Control: every message but Data, and datagrams of another
        // version (answered with the versions spoken).
        if matches!(
            &decoded,
            Ok(m) if !matches!(m, Message::Data(_))
        ) || matches!(decoded, Err(wire::WireError::BadVersion(_)))
        {
            self.totals.control_packets += 1;
        }
        match decoded {
            Ok(Message::Data(header)) => {
                self.totals.packets += 1;
                self.totals.bytes += data.len() as u64;
                self.on_data(data.len(), header, addr, at, meta, replies);
            }
            Ok(Message::End(end)) => self.on_end(end, data, addr, from, at.now, meta, replies),
            Ok(Message::IntervalsAsk(ask)) => {
                self.on_intervals_ask(ask, data, addr, from, at.now, meta, replies)
            }
            Ok(Message::Hello(hello)) => {
                let session = hello.header.session;
                let proven = hello.cookie != 0
                    && control.cookie_is_good(addr, session, hello.cookie, at.now);
                let cookie = control.cookie(addr, session, at.now);
                self.on_hello(hello, proven, cookie, addr, from, at.now, meta, replies)
            }
            Ok(
                message @ (Message::Start(_)
                | Message::Feedback(_)
                | Message::EndAck(_)
                | Message::Probe(_)),
            ) => {
                if let Message::Probe(probe) = message {
                    let session = probe.header.session;
                    if !control.cookie_is_good(addr, session, probe.cookie, at.now) {
                        self.totals.not_proven.probes_unproven += 1;
                    }
                }
                // Answered within the asker's budget, never with more bytes
                // than the request carried.
                let budget = &mut self.budget;
                let totals = &mut self.totals;
                let mut may_answer = |asker: Asker| {
                    let allowed = budget.allow(asker, at.now);
                    if !allowed {
                        totals.answers_limited += 1;
                    }
                    allowed
                };
                let request = ControlRequest {
                    message,
                    raw: data,
                    addr,
                    from,
                    local: meta.local,
                    socket: meta.socket,
                    now: at.now,
                };
                // Something for the finalising thread to do at once (a
                // stream to launch, a report to pass on).
                self.attention |= control.on_control(request, &mut may_answer, replies);
            }
            Ok(
                Message::HelloAck(_)
                | Message::StartAck(_)
                | Message::ProbeAck(_)
                | Message::Intervals(_)
                | Message::Versions(_),
            ) => {}
            Err(wire::WireError::BadVersion(version)) => {
                self.on_wrong_version(data, version, addr, from, at.now, meta, replies)
            }
            Err(_) => {
                self.totals.packets += 1;
                self.totals.bytes += data.len() as u64;
                self.on_untagged(data.len(), addr, at.now, meta);
            }
        }
    }

    /// A datagram of another version of netspeed: answered with the
    /// versions this one speaks (no larger than the datagram, within the
    /// source's budget), counted, and reported once per source and
    /// interval; never taken for a peer's data.
    #[allow(clippy::too_many_arguments)]
    fn on_wrong_version(
        &mut self,
        data: &[u8],
        version: u8,
        addr: SocketAddr,
        from: SocketAddr,
        now: Instant,
        meta: Meta,
        replies: &mut Vec<Reply>,
    ) {
        self.totals.not_proven.wrong_version += 1;
        let ip = addr.ip();
        if let Some(seen) = self.wrong_versions.get_mut(&ip) {
            seen.add(version);
        } else if self.wrong_versions.len() < WRONG_VERSION_SOURCES {
            let mut seen = WrongVersion::default();
            seen.add(version);
            self.wrong_versions.insert(ip, seen);
        }
        let Some(answer) = wire::encode_versions(data) else {
            return;
        };
        if !self.budget.allow(Asker::Unproven(addr), now) {
            self.totals.answers_limited += 1;
            return;
        }
        replies.push(Reply {
            bytes: ReplyBytes::Versions(answer),
            to: from,
            from: meta.local,
            socket: meta.socket,
        });
    }

    /// The sources that sent datagrams of another version since the last
    /// call, one report each.
    pub(super) fn take_wrong_versions(&mut self) -> Vec<VersionReport> {
        std::mem::take(&mut self.wrong_versions)
            .into_iter()
            .map(|(ip, seen)| VersionReport {
                peer: ip.to_string(),
                versions: seen.versions(),
                datagrams: seen.datagrams,
                speaks: wire::VERSIONS_SPOKEN.to_vec(),
            })
            .collect()
    }
}

/// Datagrams of other versions from one source over an interval.
#[derive(Debug, Default, Clone, Copy)]
struct WrongVersion {
    /// Bit v: version v was seen.
    seen: [u64; 4],
    datagrams: u64,
}

impl WrongVersion {
    fn add(&mut self, version: u8) {
        self.seen[(version / 64) as usize] |= 1 << (version % 64);
        self.datagrams += 1;
    }

    fn versions(&self) -> Vec<u8> {
        (0..=255u8)
            .filter(|v| self.seen[(v / 64) as usize] & (1 << (v % 64)) != 0)
            .collect()
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

/// A control message for a [`Control`]: what it is, who sent it, where.
pub struct ControlRequest<'a> {
    pub message: Message,
    /// Its bytes (for the `--psk` tag).
    pub raw: &'a [u8],
    /// The sender, canonical (an IPv4 peer on a dual-stack socket by its
    /// IPv4 address) ...
    pub addr: SocketAddr,
    /// ... and as received, for the answer.
    pub from: SocketAddr,
    /// The local address it was sent to, and the receive socket.
    pub local: Option<IpAddr>,
    pub socket: usize,
    pub now: Instant,
}

/// What a role adds to this receive engine: the control messages it does
/// not handle itself (a reverse stream's Start and Feedback, and the
/// EndAck of a stream the role sent), and the address cookie a HelloAck
/// carries. Why a trait: the engine counts whatever arrives the same way
/// for every role; what a role sends is the role's business
/// (`server::reverse`).
pub trait Control {
    /// Handles `request`. `may_answer` charges the asker's answer budget
    /// (call it before pushing an answer, saying who asks as the request
    /// shows it). Returns true when the thread that finalises sessions
    /// should look at once.
    fn on_control(
        &mut self,
        request: ControlRequest,
        may_answer: &mut dyn FnMut(Asker) -> bool,
        replies: &mut Vec<Reply>,
    ) -> bool;

    /// The cookie a HelloAck to `addr` for `session` carries; 0 for none.
    fn cookie(&self, addr: SocketAddr, session: u64, now: Instant) -> u64;

    /// Whether `cookie` is the one made for `addr` and `session`, in the
    /// current time slot or the one before.
    fn cookie_is_good(&self, addr: SocketAddr, session: u64, cookie: u64, now: Instant) -> bool;
}

/// No control messages: they are ignored, and HelloAcks carry no cookie.
pub struct NoControl;

impl Control for NoControl {
    fn on_control(
        &mut self,
        _request: ControlRequest,
        _may_answer: &mut dyn FnMut(Asker) -> bool,
        _replies: &mut Vec<Reply>,
    ) -> bool {
        false
    }

    fn cookie(&self, _addr: SocketAddr, _session: u64, _now: Instant) -> u64 {
        0
    }

    fn cookie_is_good(
        &self,
        _addr: SocketAddr,
        _session: u64,
        _cookie: u64,
        _now: Instant,
    ) -> bool {
        false
    }
}

/// Where a datagram came in, and what the kernel said about it.
#[derive(Clone, Copy)]
struct Meta {
    socket: usize,
    local: Option<IpAddr>,
    cpu: Option<CpuTime>,
    /// The table's counts before the buffer was accounted.
    handled: Handled,
    /// When the datagram was read (its arrival time is the kernel's).
    processed: Instant,
    /// The socket's running drop total, when known.
    drops: Option<u64>,
    /// The first datagram of a coalesced (GRO) buffer ...
    coalesced_first: bool,
    /// ... or any of its datagrams.
    coalesced: bool,
    truncated: bool,
}

pub use crate::sys::canonical_addr as canonical;

#[cfg(test)]
mod tests;
