//! Who gets a slot in the table, and who gets an answer: the session
//! and untagged-source slabs and their bounds, the separate budgets of
//! proven sessions and sessions seen only in data (each with its share
//! per source), the rule that lets a proven session take the slot of a
//! session seen only in data, the overflow bucket, and the answer
//! budgets (per proven session; per flow for proof without state; per
//! source address, per source and server-wide for everything else, kept
//! in hashed buckets, not per source). See the module docs of [`super`]
//! for why.

use super::*;

/// Who asks for an answer, as far as the request shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// A request that echoed a valid cookie but has no state of its own
    /// (a probe, a Start): charged to its flow (address, port, session).
    Proven(SessionKey),
    /// Anything else: charged to its source address, its source (an IPv4
    /// address, an IPv6 /64) and the server's whole unproven budget.
    Unproven(SocketAddr),
    /// A probe without a valid cookie: as [`Asker::Unproven`], and to a
    /// small budget of its own, so that a flood of them cannot take what
    /// the Hellos need.
    UnprovenProbe(SocketAddr),
}

/// Answer budgets kept without state per source: counts in fixed arrays
/// of buckets, chosen by a hash keyed at random when the table starts, so
/// that a flood from forged sources creates nothing and cannot aim at the
/// bucket of an address it does not own. Each count lives one second.
///
/// Why no budget per IP address of the kind a proven session has: before
/// proof every answer is no larger than its request (the server never
/// amplifies), so what an unproven source can draw toward an address is
/// bounded by what it sends, and by the per-source buckets here; and
/// state per forged source is exactly what a flood would fill.
pub(super) struct AnswerBudget {
    epoch: Instant,
    hasher: std::collections::hash_map::RandomState,
    /// Unproven, per source address and port ...
    sources: Buckets,
    /// ... per source (IPv4 address, IPv6 /64) ...
    prefixes: Buckets,
    /// ... and proven without state, per flow.
    flows: Buckets,
    /// The current second, and the unproven answers given in it, all
    /// sources together, and to probes.
    second: u32,
    unproven: u32,
    unproven_probes: u32,
}

/// Buckets in each array: a flood spread over many sources puts
/// (rate / BUCKETS) answers a second in each, far under a bucket's limit.
const BUCKETS: usize = 4096;

/// Fixed-size counters, each of one second.
struct Buckets(Box<[(u32, u32)]>);

impl Buckets {
    fn new() -> Self {
        Buckets(vec![(0, 0); BUCKETS].into_boxed_slice())
    }

    /// Counts one in bucket `hash` for `second`, if it is under `limit`.
    fn take(&mut self, hash: u64, second: u32, limit: u32) -> bool {
        let slot = &mut self.0[(hash as usize) % BUCKETS];
        if slot.0 != second {
            *slot = (second, 0);
        }
        if slot.1 >= limit {
            return false;
        }
        slot.1 += 1;
        true
    }

    /// Whether bucket `hash` has room for one more in `second`.
    fn has_room(&self, hash: u64, second: u32, limit: u32) -> bool {
        let slot = self.0[(hash as usize) % BUCKETS];
        slot.0 != second || slot.1 < limit
    }
}

/// A source, as budgets and shares count it: an IPv4 address, or an IPv6
/// /64 (what one host, or one site, usually has). An IPv4 address mapped
/// into IPv6 is its IPv4 address.
pub fn source_prefix(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut octets = v6.octets();
                octets[8..].fill(0);
                IpAddr::V6(std::net::Ipv6Addr::from(octets))
            }
        },
    }
}

impl AnswerBudget {
    pub(super) fn new(now: Instant) -> Self {
        AnswerBudget {
            epoch: now,
            hasher: std::collections::hash_map::RandomState::new(),
            sources: Buckets::new(),
            prefixes: Buckets::new(),
            flows: Buckets::new(),
            second: 0,
            unproven: 0,
            unproven_probes: 0,
        }
    }

    fn hash(&self, value: impl std::hash::Hash) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(value)
    }

    fn second(&mut self, now: Instant) -> u32 {
        let second = now.saturating_duration_since(self.epoch).as_secs() as u32;
        if second != self.second {
            self.second = second;
            self.unproven = 0;
            self.unproven_probes = 0;
        }
        second
    }

    /// Charges one answer to `asker`; false when its budget is spent.
    pub(super) fn allow(&mut self, asker: Asker, now: Instant) -> bool {
        let second = self.second(now);
        match asker {
            Asker::Proven(flow) => {
                let hash = self.hash(("flow", flow));
                self.flows.take(hash, second, ANSWERS_PER_FLOW)
            }
            Asker::Unproven(from) | Asker::UnprovenProbe(from) => {
                let probe = matches!(asker, Asker::UnprovenProbe(_));
                if self.unproven >= UNPROVEN_ANSWERS
                    || (probe && self.unproven_probes >= UNPROVEN_PROBE_ANSWERS)
                {
                    return false;
                }
                let source = self.hash(("source", from));
                let prefix = self.hash(("prefix", source_prefix(from.ip())));
                // Both buckets must have room before either is charged.
                if !(self.sources.has_room(source, second, ANSWERS_PER_SOURCE)
                    && self.prefixes.has_room(prefix, second, ANSWERS_PER_PREFIX))
                {
                    return false;
                }
                self.sources.take(source, second, ANSWERS_PER_SOURCE);
                self.prefixes.take(prefix, second, ANSWERS_PER_PREFIX);
                self.unproven += 1;
                if probe {
                    self.unproven_probes += 1;
                }
                true
            }
        }
    }
}

/// A proven session's own answer budget: kept in the session, so no other
/// sender can spend it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SessionBudget {
    second: Option<u64>,
    count: u32,
}

impl SessionBudget {
    pub(super) fn allow(&mut self, now: Instant, epoch: Instant) -> bool {
        let second = now.saturating_duration_since(epoch).as_secs();
        if self.second != Some(second) {
            *self = SessionBudget {
                second: Some(second),
                count: 0,
            };
        }
        if self.count >= ANSWERS_PER_SESSION {
            return false;
        }
        self.count += 1;
        true
    }
}

/// Peers in slots that do not move, so the receive path can remember the
/// slot of the last peer it saw and skip the hash lookup for the next
/// datagram of the same flow (the common case, and every segment of a GRO
/// buffer).
pub(super) struct Slab<K, V> {
    pub(super) index: HashMap<K, usize>,
    pub(super) slots: Vec<Option<V>>,
    pub(super) free: Vec<usize>,
    pub(super) last: Option<(K, usize)>,
}

impl<K: std::hash::Hash + Eq + Copy, V> Slab<K, V> {
    pub(super) fn new() -> Self {
        Slab {
            index: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            last: None,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    pub(super) fn find(&mut self, key: &K) -> Option<usize> {
        if let Some((k, slot)) = &self.last {
            if k == key {
                return Some(*slot);
            }
        }
        let slot = *self.index.get(key)?;
        self.last = Some((*key, slot));
        Some(slot)
    }

    pub(super) fn insert(&mut self, key: K, peer: V) -> usize {
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
    pub(super) fn peers_find(&self, key: &K) -> Option<&V> {
        self.index.get(key).map(|&slot| self.get(slot))
    }

    pub(super) fn get(&self, slot: usize) -> &V {
        self.slots[slot].as_ref().expect("live slot")
    }

    pub(super) fn get_mut(&mut self, slot: usize) -> &mut V {
        self.slots[slot].as_mut().expect("live slot")
    }

    pub(super) fn remove(&mut self, key: &K) -> Option<V> {
        let slot = self.index.remove(key)?;
        if matches!(&self.last, Some((k, _)) if k == key) {
            self.last = None;
        }
        self.free.push(slot);
        self.slots[slot].take()
    }

    pub(super) fn keys(&self) -> Vec<(K, usize)> {
        self.index.iter().map(|(k, &s)| (*k, s)).collect()
    }

    pub(super) fn peers(&self) -> impl Iterator<Item = &V> {
        self.slots.iter().flatten()
    }

    pub(super) fn clear(&mut self) {
        *self = Slab::new();
    }
}

/// Per receive socket: its drop counter, how far its reader has read, and
/// who is on it.
#[derive(Debug, Clone, Default)]
pub(super) struct SocketState {
    /// The kernel's counter as last seen (a u32 that wraps).
    pub(super) raw: Option<u32>,
    /// Drops since the server started, taken in wrapping u32 steps.
    pub(super) total: u64,
    /// Unfinished peers on this socket.
    pub(super) active: u32,
    /// Every datagram that arrived on this socket before this instant has
    /// been counted (see [`PeerTable::read_up_to`]); None where no reader
    /// says so.
    pub(super) read_up_to: Option<Instant>,
    /// When a direct reading last found the drop total grown: the socket
    /// was still taking traffic then, though none of it was queued.
    pub(super) drops_grew_at: Option<Instant>,
}

impl SocketState {
    /// Folds a reading of the kernel's drop counter into the running total
    /// and returns the total as of that reading. Readings come from two
    /// places: each datagram's stamp (the counter when it was queued) and
    /// the counter read directly, so a stamp read after the counter itself
    /// can be behind it: it moves nothing, and gives the total as it was.
    fn fold_drops(&mut self, raw: u32) -> u64 {
        let Some(latest) = self.raw else {
            self.raw = Some(raw);
            self.total = u64::from(raw);
            return self.total;
        };
        let ahead = raw.wrapping_sub(latest);
        if ahead < 1 << 31 {
            self.total += u64::from(ahead);
            self.raw = Some(raw);
            self.total
        } else {
            self.total
                .saturating_sub(u64::from(latest.wrapping_sub(raw)))
        }
    }
}

/// What peers need to know about the table to build their reports.
pub(super) struct TableFlags {
    pub(super) gro: bool,
    /// Arrival times are the kernel's receive timestamps.
    pub(super) kernel_times: bool,
    /// Per socket: bumped whenever traffic of more than one peer meets on
    /// it, so a peer can tell whether its drops were its own.
    pub(super) socket_joins: Vec<u64>,
}

impl PeerTable {
    /// Folds a datagram's raw drop counter into its socket's running total
    /// (wrapping u32 steps) and returns that total.
    pub(super) fn socket_drops(&mut self, socket: usize, raw: Option<u32>) -> Option<u64> {
        let raw = raw?;
        Some(self.sockets.get_mut(socket)?.fold_drops(raw))
    }

    /// The kernel's drop counter of `socket`, read directly (SO_MEMINFO)
    /// rather than from a datagram's stamp. Why both: a datagram carries
    /// the counter as it was when the datagram was queued, so the drops
    /// after the last datagram queued (a sender's tail, dropped while the
    /// reader was starved) are in no stamp; only this reading has them.
    /// The receive engine reads every socket's counter at each pass.
    pub fn observe_kernel_drops(&mut self, socket: usize, raw: u32, now: Instant) {
        if let Some(s) = self.sockets.get_mut(socket) {
            let before = s.raw.map(|_| s.total);
            let after = s.fold_drops(raw);
            if before.is_some_and(|b| after > b) {
                s.drops_grew_at = Some(now);
            }
        }
    }

    /// A peer's latest sign of traffic: its last datagram, or a later
    /// growth of its socket's drops. A socket whose buffer overflowed
    /// while its reader was starved took datagrams it could not queue;
    /// their peer is not idle, though nothing of it arrived (with other
    /// peers on the socket, each is kept until the drops stop).
    pub(super) fn last_sign(&self, peer: &Peer) -> Instant {
        self.sockets
            .get(peer.socket)
            .and_then(|s| s.drops_grew_at)
            .map_or(peer.last_seen, |at| at.max(peer.last_seen))
    }

    /// The running drop total of `socket`, where its counter is known.
    pub(super) fn socket_drops_now(&self, socket: usize) -> Option<u64> {
        let s = self.sockets.get(socket)?;
        s.raw.map(|_| s.total)
    }

    /// A peer that ends without an End (idle, evicted, at shutdown) takes
    /// its socket's drops up to now as its own span's: datagrams dropped at
    /// the tail of its run are in no later datagram's stamp, so its last
    /// datagram's stamp would leave them out. Returns the peer's
    /// `drops_end` so extended. (An End carries the stamp of its own
    /// queueing, after the session's data: nothing to add then.)
    pub(super) fn drops_end_now(&self, peer: &Peer) -> Option<u64> {
        match (peer.drops_start, self.socket_drops_now(peer.socket)) {
            (Some(_), Some(now)) => Some(peer.drops_end.map_or(now, |end| end.max(now))),
            _ => peer.drops_end,
        }
    }

    /// Says that every datagram that arrived on `socket` before `at` has
    /// been counted: the socket's reader found its queue empty at a read
    /// that began at `at`, or read a datagram that arrived then (the queue
    /// is first in, first out). Never moves back.
    pub fn read_up_to(&mut self, socket: usize, at: Instant) {
        if let Some(s) = self.sockets.get_mut(socket) {
            s.read_up_to = Some(s.read_up_to.map_or(at, |r| r.max(at)));
        }
    }

    /// The instant before which every datagram that arrived has been
    /// counted, on every socket: the earliest that any reader has read up
    /// to, and never later than `now`. Without a reader that says how far
    /// it has read (the table's own tests), `now`.
    pub(super) fn read_horizon(&self, now: Instant) -> Instant {
        self.sockets
            .iter()
            .try_fold(now, |horizon, s| s.read_up_to.map(|r| horizon.min(r)))
            .unwrap_or(now)
    }

    /// Someone other than the peers already on `socket` used it.
    pub(super) fn join(&mut self, socket: usize) {
        if let Some(joins) = self.flags.socket_joins.get_mut(socket) {
            *joins += 1;
        }
    }

    /// Registers a new unfinished peer on `socket`.
    pub(super) fn start_peer(&mut self, peer: &mut Peer, socket: usize) {
        peer.others_at_start = self.sockets.iter().map(|s| u64::from(s.active)).sum();
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
        peer.started_as = self.totals.peers;
    }

    pub(super) fn end_peer(&mut self, socket: usize) {
        if let Some(s) = self.sockets.get_mut(socket) {
            s.active = s.active.saturating_sub(1);
        }
    }

    /// The slot of session `key`, creating it if there is room: see the
    /// module docs for who gets room. `proven` says the datagram proved
    /// the session's address (a Hello that echoed its cookie).
    pub(super) fn session_slot(
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
            let t = &mut peer.tagged;
            if proven && !t.proven {
                t.proven = true;
                if !finished {
                    self.unproven_sessions -= 1;
                    let source = source_prefix(key.0.ip());
                    decrement(&mut self.unproven_per_source, source);
                    *self.proven_per_source.entry(source).or_insert(0) += 1;
                }
            }
            return Some(slot);
        }
        // Two budgets: proven sessions (a quarter of the table per source),
        // and sessions seen only in data (half the table, a quarter of that
        // per source). Data alone can then never take the room a proven
        // session needs: a full table makes room by evicting it.
        let ip = source_prefix(key.0.ip());
        let per_ip = if proven {
            &self.proven_per_source
        } else {
            &self.unproven_per_source
        };
        let bound = if proven {
            self.sessions_per_ip_bound()
        } else {
            self.unproven_per_source_bound()
        };
        if per_ip.get(&ip).copied().unwrap_or(0) >= bound {
            return None;
        }
        if !proven && self.unproven_sessions >= self.unproven_bound() {
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
            delay: QueueDelay::new(self.cfg.intervals),
            declared: None,
            untagged_packets: 0,
            proven,
            conflict: None,
            frozen: None,
            answers: SessionBudget::default(),
            run: None,
            history: None,
        });
        let mut peer = Peer::new(key.0, now, socket);
        self.start_peer(&mut peer, socket);
        let session = Session { peer, tagged };
        self.active_sessions += 1;
        if !proven {
            self.unproven_sessions += 1;
        }
        let per_ip = if proven {
            &mut self.proven_per_source
        } else {
            &mut self.unproven_per_source
        };
        *per_ip.entry(ip).or_insert(0) += 1;
        self.by_addr.insert(key.0, key);
        Some(self.tagged.insert(key, session))
    }

    /// Finalises the unfinished session seen only in data that has been
    /// silent longest, to make room; false when there is none.
    pub(super) fn evict_unproven(&mut self, now: Instant, replies: &mut Vec<Reply>) -> bool {
        if self.unproven_sessions == 0 {
            return false;
        }
        let victim = self
            .tagged
            .index
            .iter()
            .filter_map(|(key, &slot)| {
                let peer = self.tagged.get(slot);
                let unproven = !peer.tagged.proven;
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
    pub(super) fn session_ended(&mut self, key: SessionKey, proven: bool, socket: usize) {
        self.active_sessions -= 1;
        let ip = source_prefix(key.0.ip());
        if proven {
            decrement(&mut self.proven_per_source, ip);
        } else {
            self.unproven_sessions -= 1;
            decrement(&mut self.unproven_per_source, ip);
        }
        self.end_peer(socket);
    }

    pub(super) fn on_untagged(&mut self, len: usize, addr: SocketAddr, now: Instant, meta: Meta) {
        if let Some(slot) = self.untagged.find(&addr) {
            let peer = self.untagged.get_mut(slot);
            peer.seen(now, meta.drops, meta.cpu, meta.handled);
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
            peer.seen(now, meta.drops, meta.cpu, meta.handled);
            peer.count(len, now);
            peer.tagged.untagged_packets += 1;
            return;
        }
        if self.untagged.len() >= self.cfg.max_peers {
            self.overflow(len, meta.socket);
            return;
        }
        let mut peer = Peer::new(addr, now, meta.socket);
        self.start_peer(&mut peer, meta.socket);
        peer.seen(now, meta.drops, meta.cpu, meta.handled);
        peer.count(len, now);
        self.untagged.insert(addr, peer);
    }

    pub(super) fn overflow(&mut self, len: usize, socket: usize) {
        self.totals.overflow.packets += 1;
        self.totals.overflow.bytes += len as u64;
        self.join(socket);
    }

    /// Session `key`, created proven if it is not known: a receiver that
    /// asked for it (a reverse stream's client) expects it, so no Hello
    /// is needed to prove it. False when there is no room.
    pub fn expect(&mut self, key: SessionKey, now: Instant) -> bool {
        let key = (canonical(key.0), key.1);
        let mut replies = Vec::new();
        self.session_slot(key, now, 0, true, &mut replies).is_some()
    }

    /// The slot for a confirming Hello's session; None (counted) when the
    /// table, or its source's share, is full.
    pub(super) fn control_slot(
        &mut self,
        key: SessionKey,
        now: Instant,
        socket: usize,
        proven: bool,
        replies: &mut Vec<Reply>,
    ) -> Option<usize> {
        let slot = self.session_slot(key, now, socket, proven, replies);
        if slot.is_none() {
            self.totals.hellos_table_full += 1;
        }
        slot
    }
}

/// One fewer for `ip`; the entry goes at zero.
fn decrement(per_ip: &mut HashMap<IpAddr, usize>, ip: IpAddr) {
    if let Some(n) = per_ip.get_mut(&ip) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            per_ip.remove(&ip);
        }
    }
}
