//! The server's bounded table of peers: who sent what, and when they are
//! finished.
//!
//! A peer is a client session (tagged traffic, keyed by source address and
//! session id) or a source address (untagged traffic from any sender).
//! Why two tables, each bounded by `max_peers`: a flood of garbage from
//! spoofed source addresses can fill the untagged table, but it cannot take
//! a slot from a real session. Traffic that finds its table full is summed
//! in an overflow bucket, so memory stays bounded and nothing is uncounted.

use crate::stats::{self, wire_bytes, Jitter, SeqTracker};
use crate::units;
use crate::wire::{self, End, EndAck, Message};
use serde::Serialize;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Answers to end-of-test messages allowed per source IP per second: room
/// for `--clients 1024` on one host retrying twice within a second, while
/// bounding what a flood of forged end-of-test messages can draw out.
pub const ANSWERS_PER_SECOND: u32 = 2048;

/// Why a peer's summary was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DoneReason {
    /// Its end-of-test message arrived.
    End,
    /// Nothing arrived for `--idle-timeout`.
    Idle,
    /// The server is stopping.
    Shutdown,
}

/// One peer's figures, for an interval line or a final summary. Optional
/// fields are left out of JSON when unknown.
#[derive(Debug, Clone, Serialize)]
pub struct PeerReport {
    pub peer: String,
    pub tagged: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Distinct datagrams received (duplicates are not counted again).
    pub packets: u64,
    pub bytes: u64,
    /// Time from first to last datagram (summary), or the interval's length.
    pub seconds: f64,
    pub gbps: f64,
    pub pps: f64,
    pub wire_gbps: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_packets: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent_packets: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_percent: Option<f64>,
    /// `declared` (the client's end-of-test totals) or `sequence` (estimated
    /// from the highest sequence number, when no end-of-test arrived).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_basis: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duplicates: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reordered: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jitter_ms: Option<f64>,
    /// Datagrams without a netspeed header merged into this session (a
    /// client's datagrams shorter than the header).
    #[serde(skip_serializing_if = "is_zero")]
    pub untagged_packets: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_drops: Option<u64>,
    /// True when the server had UDP_GRO on: `kernel_drops` then counts
    /// dropped buffers, each holding up to 64 KiB of datagrams.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub kernel_drops_are_buffers: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<DoneReason>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

struct Tagged {
    session: u64,
    seq: SeqTracker,
    jitter: Jitter,
    declared: Option<End>,
    /// Untagged datagrams from the same address, merged at end of test.
    untagged_packets: u64,
}

struct Peer {
    addr: SocketAddr,
    packets: u64,
    bytes: u64,
    /// Estimated bytes on an Ethernet wire, per datagram (stats::wire_bytes).
    wire: u64,
    first: Instant,
    last: Instant,
    mark_at: Instant,
    mark_packets: u64,
    mark_bytes: u64,
    mark_wire: u64,
    tagged: Option<Box<Tagged>>,
    done_at: Option<Instant>,
    /// The receive socket this peer's traffic arrives on, and its drop
    /// counter when the peer's first datagram was queued.
    socket: usize,
    drops_at_start: Option<u64>,
}

impl Peer {
    fn new(
        addr: SocketAddr,
        now: Instant,
        socket: usize,
        drops: Option<u64>,
        session: Option<u64>,
    ) -> Self {
        Peer {
            addr,
            packets: 0,
            bytes: 0,
            wire: 0,
            first: now,
            last: now,
            mark_at: now,
            mark_packets: 0,
            mark_bytes: 0,
            mark_wire: 0,
            tagged: session.map(|session| {
                Box::new(Tagged {
                    session,
                    seq: SeqTracker::default(),
                    jitter: Jitter::default(),
                    declared: None,
                    untagged_packets: 0,
                })
            }),
            done_at: None,
            socket,
            drops_at_start: drops,
        }
    }

    fn count(&mut self, len: usize, now: Instant) {
        if self.packets == 0 {
            self.first = now;
            self.mark_at = now;
        }
        self.packets += 1;
        self.bytes += len as u64;
        self.wire += wire_bytes(len as u64, self.addr.is_ipv6());
        self.last = now;
    }

    fn lost(&self) -> Option<(u64, &'static str, u64)> {
        let t = self.tagged.as_ref()?;
        match &t.declared {
            Some(end) => {
                let got = t.seq.unique() + t.untagged_packets;
                Some((
                    end.sent_packets.saturating_sub(got),
                    "declared",
                    end.sent_packets,
                ))
            }
            None if t.seq.received > 0 => {
                let lost = t.seq.lost_estimate(0);
                Some((lost, "sequence", lost + t.seq.unique()))
            }
            None => None,
        }
    }

    fn ack(&self, drops_now: Option<u64>) -> EndAck {
        let t = self.tagged.as_ref().expect("acks are for tagged peers");
        EndAck {
            session: t.session,
            received_packets: self.packets,
            received_bytes: self.bytes,
            lost: self.lost().map(|l| l.0).unwrap_or(0),
            duplicates: t.seq.duplicates,
            reordered: t.seq.reordered,
            first_to_last_ns: self.last.duration_since(self.first).as_nanos() as u64,
            jitter_ns: t.jitter.nanos() as u64,
            kernel_drops: self.kernel_drops(drops_now).unwrap_or(wire::UNKNOWN),
            flags: 0,
        }
    }

    fn kernel_drops(&self, drops_now: Option<u64>) -> Option<u64> {
        Some(drops_now?.saturating_sub(self.drops_at_start.unwrap_or(0)))
    }

    #[allow(clippy::too_many_arguments)]
    fn report(
        &self,
        packets: u64,
        bytes: u64,
        wire: u64,
        seconds: f64,
        drops_now: Option<u64>,
        reason: Option<DoneReason>,
    ) -> PeerReport {
        let t = self.tagged.as_deref();
        let lost = self.lost();
        PeerReport {
            peer: self.addr.to_string(),
            tagged: t.is_some(),
            session: t.map(|t| format!("{:016x}", t.session)),
            packets,
            bytes,
            seconds,
            gbps: units::gbps(bytes, seconds),
            pps: units::per_second(packets as f64, seconds),
            wire_gbps: units::gbps(wire, seconds),
            total_packets: None,
            total_bytes: None,
            sent_packets: t.and_then(|t| t.declared.map(|d| d.sent_packets)),
            sent_bytes: t.and_then(|t| t.declared.map(|d| d.sent_bytes)),
            lost: lost.map(|l| l.0),
            loss_percent: lost.map(|(lost, _, expected)| {
                if expected == 0 {
                    0.0
                } else {
                    lost as f64 * 100.0 / expected as f64
                }
            }),
            loss_basis: lost.map(|l| l.1),
            duplicates: t.map(|t| t.seq.duplicates),
            reordered: t.map(|t| t.seq.reordered),
            jitter_ms: t.map(|t| t.jitter.nanos() / 1e6),
            untagged_packets: t.map(|t| t.untagged_packets).unwrap_or(0),
            kernel_drops: self.kernel_drops(drops_now),
            kernel_drops_are_buffers: false,
            reason,
        }
    }

    fn summary(&self, drops_now: Option<u64>, reason: DoneReason) -> PeerReport {
        let seconds = self.last.duration_since(self.first).as_secs_f64();
        self.report(
            self.packets,
            self.bytes,
            self.wire,
            seconds,
            drops_now,
            Some(reason),
        )
    }
}

/// When a datagram arrived, in the two forms the table needs.
#[derive(Clone, Copy)]
struct Arrival {
    now: Instant,
    /// Nanoseconds since the table's epoch, for jitter.
    ns: u64,
    /// Whether this datagram updates the jitter estimate.
    jitter: bool,
}

impl Arrival {
    fn new(now: Instant, epoch: Instant) -> Self {
        let since = now.saturating_duration_since(epoch);
        Arrival {
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
}

/// Traffic that found its table full.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Overflow {
    pub packets: u64,
    pub bytes: u64,
}

/// Limits end-of-test answers per source IP, in one-second windows.
struct AnswerLimiter {
    window_start: Instant,
    counts: HashMap<IpAddr, u32>,
    max_sources: usize,
}

impl AnswerLimiter {
    fn allow(&mut self, ip: IpAddr, now: Instant) -> bool {
        if now.duration_since(self.window_start) >= Duration::from_secs(1) {
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

    fn peers_mut(&mut self) -> impl Iterator<Item = &mut Peer> {
        self.slots.iter_mut().flatten()
    }

    fn peers(&self) -> impl Iterator<Item = &Peer> {
        self.slots.iter().flatten()
    }

    /// Keeps the peers for which `keep` is true.
    fn retain(&mut self, mut keep: impl FnMut(&mut Peer) -> bool) {
        let mut gone = Vec::new();
        for (key, &slot) in &self.index {
            let peer = self.slots[slot].as_mut().expect("live slot");
            if !keep(peer) {
                gone.push(*key);
            }
        }
        for key in gone {
            self.remove(&key);
        }
    }

    fn clear(&mut self) {
        *self = Slab::new();
    }
}

/// The peer table.
pub struct PeerTable {
    tagged: Slab<(SocketAddr, u64)>,
    untagged: Slab<SocketAddr>,
    max_peers: usize,
    idle_timeout: Duration,
    epoch: Instant,
    limiter: AnswerLimiter,
    /// Each receive socket's kernel drop counter, as last reported.
    socket_drops: Vec<Option<u64>>,
    /// UDP_GRO is on: the kernel counts dropped buffers, not datagrams.
    pub gro: bool,
    pub overflow: Overflow,
    /// End-of-test answers refused by the rate limit.
    pub answers_limited: u64,
    /// End-of-test messages of new sessions that found the session table
    /// full (`--max-peers`): unanswered.
    pub ends_table_full: u64,
    pub total_packets: u64,
    pub total_bytes: u64,
    pub peers_seen: u64,
}

/// An answer to send: bytes and destination.
pub type Reply = ([u8; wire::END_LEN], SocketAddr);

impl PeerTable {
    /// A table for traffic arriving on `sockets` receive sockets.
    pub fn new(max_peers: usize, idle_timeout: Duration, now: Instant, sockets: usize) -> Self {
        PeerTable {
            tagged: Slab::new(),
            untagged: Slab::new(),
            max_peers,
            idle_timeout,
            epoch: now,
            limiter: AnswerLimiter {
                window_start: now,
                counts: HashMap::new(),
                max_sources: max_peers,
            },
            socket_drops: vec![None; sockets.max(1)],
            gro: false,
            overflow: Overflow::default(),
            answers_limited: 0,
            ends_table_full: 0,
            total_packets: 0,
            total_bytes: 0,
            peers_seen: 0,
        }
    }

    /// Peers tracked right now (finished ones linger to answer retries).
    pub fn len(&self) -> usize {
        self.tagged.len() + self.untagged.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sum of every socket's kernel drop counter, when known.
    pub fn kernel_drops(&self) -> Option<u64> {
        self.socket_drops
            .iter()
            .copied()
            .reduce(|a, b| match (a, b) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            })?
    }

    fn drops_for(socket_drops: &[Option<u64>], peer: &Peer) -> Option<u64> {
        socket_drops.get(peer.socket).copied().flatten()
    }

    /// Accounts one received buffer: a datagram, or with UDP_GRO several
    /// datagrams of `segment_size` bytes (the last may be shorter) from one
    /// flow. Answers to send are pushed to `replies`.
    #[allow(clippy::too_many_arguments)]
    pub fn on_receive(
        &mut self,
        data: &[u8],
        segment_size: Option<usize>,
        from: SocketAddr,
        now: Instant,
        socket: usize,
        drops: Option<u64>,
        events: &mut dyn FnMut(Event),
        replies: &mut Vec<Reply>,
    ) {
        let at = Arrival::new(now, self.epoch);
        match segment_size {
            Some(seg) if seg > 0 && data.len() > seg => {
                // Coalesced datagrams arrived together: jitter is measured
                // once per buffer (its first datagram); the others would
                // only add zeros from the shared arrival time.
                for (i, chunk) in data.chunks(seg).enumerate() {
                    let at = Arrival {
                        jitter: i == 0,
                        ..at
                    };
                    if let Some(r) = self.account(chunk, from, at, socket, drops, events) {
                        replies.push(r);
                    }
                }
            }
            _ => {
                if let Some(r) = self.account(data, from, at, socket, drops, events) {
                    replies.push(r);
                }
            }
        }
    }

    /// Accounts one datagram from `from` (as received: a v4-mapped address
    /// on a dual-stack socket) on receive socket `socket`, whose drop
    /// counter was `drops` when the datagram was queued. Returns the answer
    /// to send, if any.
    pub fn on_datagram(
        &mut self,
        data: &[u8],
        from: SocketAddr,
        now: Instant,
        socket: usize,
        drops: Option<u64>,
        events: &mut dyn FnMut(Event),
    ) -> Option<Reply> {
        let at = Arrival::new(now, self.epoch);
        self.account(data, from, at, socket, drops, events)
    }

    fn account(
        &mut self,
        data: &[u8],
        from: SocketAddr,
        at: Arrival,
        socket: usize,
        drops: Option<u64>,
        events: &mut dyn FnMut(Event),
    ) -> Option<Reply> {
        let now = at.now;
        if drops.is_some() {
            if let Some(d) = self.socket_drops.get_mut(socket) {
                *d = drops;
            }
        }
        let addr = canonical(from);
        match wire::decode(data) {
            Ok(Message::Data(header)) => {
                self.total_packets += 1;
                self.total_bytes += data.len() as u64;
                let Some(slot) = self.tagged_slot(addr, header.session, now, socket, drops) else {
                    self.overflow.packets += 1;
                    self.overflow.bytes += data.len() as u64;
                    return None;
                };
                let peer = self.tagged.get_mut(slot);
                let t = peer
                    .tagged
                    .as_mut()
                    .expect("tagged table holds tagged peers");
                if t.seq.record(header.seq) == stats::Arrival::Duplicate {
                    return None;
                }
                if at.jitter {
                    t.jitter.record(header.send_time_ns, at.ns);
                }
                peer.count(data.len(), now);
                None
            }
            Ok(Message::End(end)) => self.on_end(end, addr, from, now, socket, drops, events),
            Ok(Message::EndAck(_)) => None,
            Err(_) => {
                self.total_packets += 1;
                self.total_bytes += data.len() as u64;
                match self.untagged.find(&addr) {
                    Some(slot) => self.untagged.get_mut(slot).count(data.len(), now),
                    None if self.untagged.len() >= self.max_peers => {
                        self.overflow.packets += 1;
                        self.overflow.bytes += data.len() as u64;
                    }
                    None => {
                        self.peers_seen += 1;
                        let mut peer = Peer::new(addr, now, socket, drops, None);
                        peer.count(data.len(), now);
                        self.untagged.insert(addr, peer);
                    }
                }
                None
            }
        }
    }

    fn tagged_slot(
        &mut self,
        addr: SocketAddr,
        session: u64,
        now: Instant,
        socket: usize,
        drops: Option<u64>,
    ) -> Option<usize> {
        let key = (addr, session);
        if let Some(slot) = self.tagged.find(&key) {
            return Some(slot);
        }
        if self.tagged.len() >= self.max_peers {
            return None;
        }
        self.peers_seen += 1;
        Some(
            self.tagged
                .insert(key, Peer::new(addr, now, socket, drops, Some(session))),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn on_end(
        &mut self,
        end: End,
        addr: SocketAddr,
        from: SocketAddr,
        now: Instant,
        socket: usize,
        drops: Option<u64>,
        events: &mut dyn FnMut(Event),
    ) -> Option<Reply> {
        let Some(slot) = self.tagged_slot(addr, end.header.session, now, socket, drops) else {
            self.ends_table_full += 1;
            return None;
        };
        let first_end = self
            .tagged
            .get(slot)
            .tagged
            .as_ref()
            .expect("tagged")
            .declared
            .is_none();
        if first_end {
            // The same socket's datagrams that were too short to tag.
            let merge = self.untagged.remove(&addr);
            let peer = self.tagged.get_mut(slot);
            let t = peer.tagged.as_mut().expect("tagged");
            t.declared = Some(end);
            if let Some(m) = merge {
                t.untagged_packets += m.packets;
                if peer.packets == 0 {
                    peer.first = m.first;
                    peer.mark_at = m.mark_at;
                } else {
                    peer.first = peer.first.min(m.first);
                }
                peer.last = peer.last.max(m.last);
                peer.packets += m.packets;
                peer.bytes += m.bytes;
                peer.wire += m.wire;
            }
            if peer.done_at.is_none() {
                peer.done_at = Some(now);
                let drops_now = Self::drops_for(&self.socket_drops, peer);
                let mut summary = peer.summary(drops_now, DoneReason::End);
                summary.kernel_drops_are_buffers = self.gro;
                events(Event::Done(summary));
            }
        }
        if !self.limiter.allow(addr.ip(), now) {
            self.answers_limited += 1;
            return None;
        }
        let peer = self.tagged.get(slot);
        let drops_now = Self::drops_for(&self.socket_drops, peer);
        let mut ack = peer.ack(drops_now);
        if self.gro {
            ack.flags |= wire::ACK_FLAG_GRO;
        }
        Some((wire::encode_end_ack(&ack), from))
    }

    /// Interval lines for every peer that received something since the last
    /// tick. Call every `--interval`.
    pub fn tick_intervals(&mut self, now: Instant, events: &mut dyn FnMut(Event)) {
        let socket_drops = &self.socket_drops;
        let gro = self.gro;
        for peer in self.tagged.peers_mut().chain(self.untagged.peers_mut()) {
            if peer.done_at.is_some() || peer.packets == peer.mark_packets {
                continue;
            }
            let seconds = now.duration_since(peer.mark_at).as_secs_f64();
            let mut report = peer.report(
                peer.packets - peer.mark_packets,
                peer.bytes - peer.mark_bytes,
                peer.wire - peer.mark_wire,
                seconds,
                Self::drops_for(socket_drops, peer),
                None,
            );
            report.total_packets = Some(peer.packets);
            report.kernel_drops_are_buffers = gro;
            report.total_bytes = Some(peer.bytes);
            events(Event::Interval(report));
            peer.mark_at = now;
            peer.mark_packets = peer.packets;
            peer.mark_bytes = peer.bytes;
            peer.mark_wire = peer.wire;
        }
    }

    /// Summarises peers idle for `--idle-timeout` and forgets finished
    /// peers once their retries can no longer come.
    pub fn expire(&mut self, now: Instant, events: &mut dyn FnMut(Event)) {
        let idle = self.idle_timeout;
        let linger = idle.max(Duration::from_secs(2));
        let socket_drops = &self.socket_drops;
        self.tagged.retain(|peer| match peer.done_at {
            Some(done) => now.duration_since(done) < linger,
            None if now.duration_since(peer.last) >= idle => {
                peer.done_at = Some(now);
                events(Event::Done(peer.summary(
                    Self::drops_for(socket_drops, peer),
                    DoneReason::Idle,
                )));
                true
            }
            None => true,
        });
        self.untagged.retain(|peer| {
            if now.duration_since(peer.last) >= idle {
                events(Event::Done(peer.summary(
                    Self::drops_for(socket_drops, peer),
                    DoneReason::Idle,
                )));
                false
            } else {
                true
            }
        });
    }

    /// Summarises every unfinished peer; used once, at shutdown.
    pub fn finish_all(&mut self, events: &mut dyn FnMut(Event)) {
        for peer in self.tagged.peers().chain(self.untagged.peers()) {
            if peer.done_at.is_none() && peer.packets > 0 {
                let drops_now = Self::drops_for(&self.socket_drops, peer);
                let mut summary = peer.summary(drops_now, DoneReason::Shutdown);
                summary.kernel_drops_are_buffers = self.gro;
                events(Event::Done(summary));
            }
        }
        self.tagged.clear();
        self.untagged.clear();
    }
}

/// `::ffff:1.2.3.4` (a v4 client on a dual-stack socket) as `1.2.3.4`.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{encode_end, write_data_header, Header};

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

    fn end(session: u64, packets: u64, bytes: u64) -> Vec<u8> {
        encode_end(&End {
            header: Header {
                session,
                seq: packets,
                send_time_ns: 0,
            },
            sent_packets: packets,
            sent_bytes: bytes,
            duration_ns: 0,
        })
        .to_vec()
    }

    fn collect() -> (Vec<PeerReport>, impl FnMut(Event)) {
        (Vec::new(), |_| {})
    }

    /// A sink that keeps the final summaries.
    fn keep(done: &mut Vec<PeerReport>) -> impl FnMut(Event) + '_ {
        |e: Event| {
            if let Event::Done(r) = e {
                done.push(r)
            }
        }
    }

    #[test]
    fn exact_counts_and_answer() {
        let t0 = Instant::now();
        let mut table = PeerTable::new(16, Duration::from_secs(2), t0, 1);
        let a: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let mut done = Vec::new();
        for seq in [0, 1, 3, 2, 2, 4] {
            assert!(table
                .on_datagram(&data(7, seq, 100), a, t0, 0, Some(0), &mut keep(&mut done))
                .is_none());
        }
        // A short tail from the same socket, untagged until the end merges it.
        table.on_datagram(&[1, 2, 3], a, t0, 0, Some(0), &mut keep(&mut done));
        let (bytes, to) = table
            .on_datagram(&end(7, 7, 603), a, t0, 0, Some(5), &mut keep(&mut done))
            .unwrap();
        assert_eq!(to, a);
        let Ok(Message::EndAck(ack)) = wire::decode(&bytes) else {
            panic!("not an ack")
        };
        assert_eq!(ack.received_packets, 6);
        assert_eq!(ack.received_bytes, 503);
        assert_eq!(ack.duplicates, 1);
        assert_eq!(ack.reordered, 1);
        assert_eq!(ack.lost, 1);
        assert_eq!(ack.kernel_drops, 5);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].untagged_packets, 1);
        assert_eq!(done[0].loss_basis, Some("declared"));
        assert_eq!(bytes.len(), end(7, 7, 603).len(), "no amplification");
    }

    #[test]
    fn garbage_cannot_evict_a_session() {
        let t0 = Instant::now();
        let (_, mut sink) = collect();
        let mut table = PeerTable::new(4, Duration::from_secs(2), t0, 1);
        let real: SocketAddr = "10.0.0.1:9".parse().unwrap();
        table.on_datagram(&data(1, 0, 64), real, t0, 0, None, &mut sink);
        for port in 0..1000u16 {
            let spoofed = SocketAddr::from(([10, 0, 0, 2], port));
            table.on_datagram(&[0xFF; 40], spoofed, t0, 0, None, &mut sink);
        }
        table.on_datagram(&data(1, 1, 64), real, t0, 0, None, &mut sink);
        assert!(table.len() <= 8);
        assert_eq!(table.overflow.packets, 996);
        let reply = table
            .on_datagram(&end(1, 2, 128), real, t0, 0, None, &mut sink)
            .unwrap();
        let Ok(Message::EndAck(ack)) = wire::decode(&reply.0) else {
            panic!()
        };
        assert_eq!((ack.received_packets, ack.lost), (2, 0));
        assert_eq!(table.total_packets, 1002);
    }

    #[test]
    fn ends_that_find_the_table_full_are_counted() {
        let t0 = Instant::now();
        let (_, mut sink) = collect();
        let mut table = PeerTable::new(2, Duration::from_secs(2), t0, 1);
        let a: SocketAddr = "10.0.0.1:9".parse().unwrap();
        let answered = (0..5)
            .filter(|i| {
                table
                    .on_datagram(&end(*i, 0, 0), a, t0, 0, None, &mut sink)
                    .is_some()
            })
            .count();
        assert_eq!(answered, 2);
        assert_eq!(table.ends_table_full, 3);
    }

    #[test]
    fn answers_are_rate_limited_per_source() {
        let t0 = Instant::now();
        let (_, mut sink) = collect();
        let mut table = PeerTable::new(4096, Duration::from_secs(2), t0, 1);
        let a: SocketAddr = "10.0.0.1:9".parse().unwrap();
        let answered = (0..3000)
            .filter(|i| {
                table
                    .on_datagram(&end(*i, 0, 0), a, t0, 0, None, &mut sink)
                    .is_some()
            })
            .count();
        assert_eq!(answered, ANSWERS_PER_SECOND as usize);
        assert_eq!(table.answers_limited, 3000 - ANSWERS_PER_SECOND as u64);
        let later = t0 + Duration::from_millis(1001);
        assert!(table
            .on_datagram(&end(1, 0, 0), a, later, 0, None, &mut sink)
            .is_some());
    }

    #[test]
    fn idle_peers_are_summarised_and_forgotten() {
        let t0 = Instant::now();
        let mut table = PeerTable::new(16, Duration::from_secs(2), t0, 1);
        let mut done = Vec::new();
        let a: SocketAddr = "[::1]:1".parse().unwrap();
        table.on_datagram(&data(3, 0, 100), a, t0, 0, None, &mut keep(&mut done));
        table.on_datagram(
            &data(3, 2, 100),
            a,
            t0 + Duration::from_secs(1),
            0,
            None,
            &mut keep(&mut done),
        );
        table.on_datagram(b"hello", a, t0, 0, None, &mut keep(&mut done));
        table.expire(t0 + Duration::from_millis(2500), &mut keep(&mut done));
        assert_eq!(done.len(), 1, "untagged peer idle, tagged still active");
        table.expire(t0 + Duration::from_millis(3100), &mut keep(&mut done));
        assert_eq!(done.len(), 2);
        let tagged = done.iter().find(|r| r.tagged).unwrap();
        assert_eq!(tagged.loss_basis, Some("sequence"));
        assert_eq!(tagged.lost, Some(1));
        assert_eq!(tagged.seconds, 1.0);
        assert_eq!(tagged.reason, Some(DoneReason::Idle));
        table.expire(t0 + Duration::from_secs(10), &mut keep(&mut done));
        assert!(table.is_empty());
    }

    #[test]
    fn gro_buffers_are_split_into_their_datagrams() {
        let t0 = Instant::now();
        let mut table = PeerTable::new(16, Duration::from_secs(2), t0, 2);
        let a: SocketAddr = "127.0.0.1:7".parse().unwrap();
        // Five 100-byte datagrams and a 40-byte tail, coalesced.
        let mut buf = Vec::new();
        for seq in 0..5 {
            buf.extend_from_slice(&data(4, seq, 100));
        }
        buf.extend_from_slice(&data(4, 5, 40));
        let mut replies = Vec::new();
        let mut done = Vec::new();
        table.on_receive(
            &buf,
            Some(100),
            a,
            t0,
            1,
            Some(3),
            &mut keep(&mut done),
            &mut replies,
        );
        // The end-of-test message may be the last segment of a GRO buffer.
        let mut tail = data(4, 6, 96);
        let end_msg = end(4, 7, 636);
        tail.extend_from_slice(&end_msg);
        table.on_receive(
            &tail,
            Some(96),
            a,
            t0,
            1,
            Some(3),
            &mut keep(&mut done),
            &mut replies,
        );
        assert_eq!(replies.len(), 1);
        let Ok(Message::EndAck(ack)) = wire::decode(&replies[0].0) else {
            panic!()
        };
        assert_eq!(
            (ack.received_packets, ack.received_bytes, ack.lost),
            (7, 636, 0)
        );
        assert_eq!(
            ack.kernel_drops, 0,
            "drops are per socket, from the peer's start"
        );
        assert_eq!(table.kernel_drops(), Some(3));
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
