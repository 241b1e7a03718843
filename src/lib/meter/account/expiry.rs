//! Time in the table: when the finalising thread must look next,
//! interval lines, idle peers and grace periods that ended, records that
//! may go, and the last summaries when the server stops.

use super::*;

impl PeerTable {
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
    pub(super) fn extend_record(&mut self, slot: usize, now: Instant) {
        let keep = self.keep_for(self.tagged.get(slot));
        let peer = self.tagged.get_mut(slot);
        let key = (peer.addr, peer.tagged.session);
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

    /// How long a finished session's record is kept: as long as its client
    /// said it would ask, within bounds.
    pub(super) fn keep_for(&self, peer: &Session) -> Duration {
        let asked = peer
            .tagged
            .declared
            .map_or(Duration::ZERO, |e| Duration::from_nanos(e.answer_wait_ns));
        asked
            .max(self.cfg.idle_timeout * 2)
            .clamp(KEEP_FINISHED_MIN, KEEP_FINISHED_MAX)
    }

    /// Drops a finished session's record, reporting late datagrams not yet
    /// reported.
    pub(super) fn forget(&mut self, key: SessionKey, events: &mut dyn FnMut(Event)) {
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
        let threads = self.cfg.sockets;
        let epoch = self.epoch;
        let sessions = self
            .tagged
            .slots
            .iter_mut()
            .flatten()
            .map(|s| (&mut s.peer, Some(&mut *s.tagged)));
        let sources = self.untagged.slots.iter_mut().flatten().map(|p| (p, None));
        for (peer, mut t) in sessions.chain(sources) {
            // Sessions never proven are counted in the totals only.
            if peer.is_finished() || t.as_ref().is_some_and(|t| !t.proven) {
                continue;
            }
            let shared = peer.shared_now(flags);
            if let Some(report) =
                peer.interval(t.as_deref(), (epoch, now), cpu_now, shared, threads)
            {
                events(Event::Interval(report));
                if let Some(t) = t.as_mut() {
                    t.delay.take_interval();
                }
                peer.mark = Some(Mark {
                    at: now,
                    total: peer.total,
                    cpu: cpu_now,
                });
            }
        }
        self.flush_wrong_versions(now, events);
    }

    /// One report per source that sent another version since the last.
    fn flush_wrong_versions(&mut self, now: Instant, events: &mut dyn FnMut(Event)) {
        self.versions_flushed = now;
        for report in self.take_wrong_versions() {
            events(Event::WrongVersion(report));
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
        if !self.cfg.intervals
            && now.saturating_duration_since(self.versions_flushed) >= Duration::from_secs(1)
        {
            // Without interval lines, other versions are reported once a
            // second per source.
            self.flush_wrong_versions(now, events);
        }
        let idle = self.cfg.idle_timeout;
        // Idle is judged by what the readers have read, not by the clock
        // alone: a peer whose datagrams still wait in a socket's queue (a
        // starved receive thread) is not idle, and ending it then would
        // split it in two, its queued datagrams starting a new peer.
        let horizon = self.read_horizon(now);
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
                State::Active
                    if horizon.saturating_duration_since(self.last_sign(peer)) >= idle =>
                {
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
                        let proven = peer.tagged.proven;
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
                horizon.saturating_duration_since(self.last_sign(self.untagged.get(slot))) >= idle
            })
            .map(|(addr, _)| *addr)
            .collect();
        for addr in idle_sources {
            if let Some(mut peer) = self.untagged.remove(&addr) {
                peer.drops_end = self.drops_end_now(&peer);
                self.end_peer(peer.socket);
                self.write_done(&peer, None, DoneReason::Idle, events);
            }
        }
    }

    /// What session `key` (canonical address, session id) has received so
    /// far: distinct datagrams, their bytes, and one more than the highest
    /// sequence number seen (0 before any). A reverse stream's client
    /// sends them back in its Feedback.
    pub fn session_counts(&self, key: SessionKey) -> Option<(u64, u64, u64)> {
        let peer = self.tagged.peers_find(&key)?;
        let next = peer.tagged.seq.highest().map_or(0, |h| h + 1);
        Some((peer.total.packets, peer.total.bytes, next))
    }

    /// Hands over the events queued while a datagram was accounted (an
    /// eviction finalises a session where no event sink is at hand).
    pub(super) fn flush_queued(&mut self, events: &mut dyn FnMut(Event)) {
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
        // In slot order; the table is cleared below.
        for slot in 0..self.untagged.slots.len() {
            if let Some(mut peer) = self.untagged.slots[slot].take() {
                peer.drops_end = self.drops_end_now(&peer);
                self.write_done(&peer, None, DoneReason::Shutdown, events);
            }
        }
        self.flush_wrong_versions(now, events);
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
        self.proven_per_source.clear();
        self.unproven_per_source.clear();
    }
}
