//! Who gets a slot in the table, and who gets an answer: the session
//! and untagged-source slabs and their bounds, the separate budgets of
//! sessions that began with a Hello and sessions seen only in data (each
//! with its per-IP share), the rule that lets a Hello take the slot of a
//! session seen only in data, the overflow bucket, and the answer limiter
//! (per proven session, else per source address and IP). See the
//! module docs of [`super`] for why.

use super::*;

/// What an answer is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Charge {
    /// A session that began with a Hello: its own budget, which no other
    /// sender can spend.
    Session(SessionKey),
    /// Anything else, from this address and port ...
    Source(SocketAddr),
    /// ... and from this IP, whatever the port.
    Ip(IpAddr),
}

impl Charge {
    fn limit(self) -> u32 {
        match self {
            Charge::Session(_) => ANSWERS_PER_SESSION,
            Charge::Source(_) => ANSWERS_PER_SOURCE,
            Charge::Ip(_) => ANSWERS_PER_SECOND,
        }
    }
}

/// Limits answers in one-second windows: a proven session's per session,
/// everything else per source address and per source IP. Why both: a
/// flood of requests from one port of a client's own IP (forged or not)
/// spends that port's budget and stops there, so it cannot spend the IP's
/// budget that the real client's Hello needs, nor the budget of the real
/// client's session for its End.
pub(super) struct AnswerLimiter {
    pub(super) window_start: Instant,
    pub(super) counts: HashMap<Charge, u32>,
    /// Most entries in a window (a bound on memory under a flood).
    pub(super) max_entries: usize,
}

impl AnswerLimiter {
    fn charge(&mut self, key: Charge, now: Instant) -> bool {
        if now.saturating_duration_since(self.window_start) >= Duration::from_secs(1) {
            self.window_start = now;
            self.counts.clear();
        }
        if self.counts.len() >= self.max_entries && !self.counts.contains_key(&key) {
            return false;
        }
        let count = self.counts.entry(key).or_insert(0);
        if *count >= key.limit() {
            return false;
        }
        *count += 1;
        true
    }

    /// An answer to a session that began with a Hello.
    pub(super) fn allow_session(&mut self, key: SessionKey, now: Instant) -> bool {
        self.charge(Charge::Session(key), now)
    }

    /// An answer to anyone else (a Hello, a Start, an End of a session
    /// seen only in data): charged to the source address, then to its IP.
    pub(super) fn allow(&mut self, from: SocketAddr, now: Instant) -> bool {
        self.charge(Charge::Source(from), now) && self.charge(Charge::Ip(from.ip()), now)
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

/// Per receive socket: its drop counter, and who is on it.
#[derive(Debug, Clone, Default)]
pub(super) struct SocketState {
    /// The kernel's counter as last seen (a u32 that wraps).
    pub(super) raw: Option<u32>,
    /// Drops since the server started, taken in wrapping u32 steps.
    pub(super) total: u64,
    /// Unfinished peers on this socket.
    pub(super) active: u32,
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
    pub(super) fn join(&mut self, socket: usize) {
        if let Some(joins) = self.flags.socket_joins.get_mut(socket) {
            *joins += 1;
        }
    }

    /// Registers a new unfinished peer on `socket`.
    pub(super) fn start_peer(&mut self, peer: &mut Peer, socket: usize) {
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

    pub(super) fn end_peer(&mut self, socket: usize) {
        if let Some(s) = self.sockets.get_mut(socket) {
            s.active = s.active.saturating_sub(1);
        }
    }

    /// The slot of session `key`, creating it if there is room: see the
    /// module docs for who gets room. `proven` says the datagram is a Hello.
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
                    let ip = key.0.ip();
                    decrement(&mut self.unproven_per_ip, ip);
                    *self.proven_per_ip.entry(ip).or_insert(0) += 1;
                }
            }
            return Some(slot);
        }
        // Two budgets: sessions that began with a Hello (a quarter of the
        // table per IP), and sessions seen only in data (half the table,
        // a quarter of that per IP). Data alone can then never take the
        // room a Hello needs: a full table makes room by evicting it.
        let ip = key.0.ip();
        let per_ip = if proven {
            &self.proven_per_ip
        } else {
            &self.unproven_per_ip
        };
        let bound = if proven {
            self.sessions_per_ip_bound()
        } else {
            self.unproven_per_ip_bound()
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
            unknown_start: false,
            frozen: None,
        });
        let mut peer = Peer::new(key.0, now, socket);
        self.start_peer(&mut peer, socket);
        let session = Session { peer, tagged };
        self.active_sessions += 1;
        if !proven {
            self.unproven_sessions += 1;
        }
        let per_ip = if proven {
            &mut self.proven_per_ip
        } else {
            &mut self.unproven_per_ip
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
        let ip = key.0.ip();
        if proven {
            decrement(&mut self.proven_per_ip, ip);
        } else {
            self.unproven_sessions -= 1;
            decrement(&mut self.unproven_per_ip, ip);
        }
        self.end_peer(socket);
    }

    pub(super) fn on_untagged(&mut self, len: usize, addr: SocketAddr, now: Instant, meta: Meta) {
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
            peer.tagged.untagged_packets += 1;
            return;
        }
        if self.untagged.len() >= self.cfg.max_peers {
            self.overflow(len, meta.socket);
            return;
        }
        let mut peer = Peer::new(addr, now, meta.socket);
        self.start_peer(&mut peer, meta.socket);
        peer.seen(now, meta.drops, meta.cpu);
        peer.count(len, now);
        self.untagged.insert(addr, peer);
    }

    pub(super) fn overflow(&mut self, len: usize, socket: usize) {
        self.totals.overflow.packets += 1;
        self.totals.overflow.bytes += len as u64;
        self.join(socket);
    }

    /// The slot for a Hello's or End's session; None (counted) when the
    /// table is full: the request goes unanswered.
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
            self.totals.ends_table_full += 1;
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
