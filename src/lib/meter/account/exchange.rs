//! The Hello/End exchange and the data of a session: counting a data
//! datagram, late data and disputes, answering a Hello, taking an End
//! into its grace period, and finalising a session with one answer and
//! one summary from the same figures.

use super::*;

impl PeerTable {
    pub(super) fn on_data(
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
        if !self.tagged.get(slot).tagged.proven {
            self.totals.not_proven.unproven_packets += 1;
            self.totals.not_proven.unproven_bytes += len as u64;
        }
        // After an End, a sequence number at or beyond its total says the
        // End was not this sender's last word.
        let beyond = self
            .tagged
            .get(slot)
            .tagged
            .declared
            .is_some_and(|end| header.seq >= end.sent_packets);
        if beyond {
            self.conflict(slot, CONFLICT_DATA, None, Some(header.seq));
        }
        if self.tagged.get(slot).is_finished() {
            self.late(slot, len, at.now);
            return;
        }
        let peer = self.tagged.get_mut(slot);
        peer.seen(at.now, meta.drops, meta.cpu, meta.handled);
        if meta.coalesced_first {
            peer.gro_buffers += 1;
        }
        if meta.coalesced {
            peer.gro_datagrams += 1;
        }
        if meta.truncated {
            peer.truncated += 1;
        }
        let t = &mut peer.tagged;
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
        let sent = at.buffer_sent_ns.unwrap_or(header.send_time_ns);
        let delay_us = t.delay.record(sent, at.ns, 1);
        if let Some(h) = t.history.as_mut() {
            h.record(header.send_time_ns, header.seq, 1, len as u64, delay_us);
        }
        peer.count(len, at.now);
    }

    /// A datagram for session `slot`, which is finished.
    pub(super) fn late(&mut self, slot: usize, len: usize, now: Instant) {
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

    /// Marks session `slot` as disputed (once), and reports it.
    pub(super) fn conflict(
        &mut self,
        slot: usize,
        why: &'static str,
        other: Option<&End>,
        seq: Option<u64>,
    ) {
        let Session { peer, tagged: t } = self.tagged.get_mut(slot);
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

    /// A Hello. Without the cookie of its address (the first round trip)
    /// it is answered with that cookie and creates nothing: it proves
    /// nothing about its source. With it (`proven`), the session is
    /// created, proven, or found; the answer says so (`ACK_PROVEN`), or
    /// that there is no room (`ACK_BUSY`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_hello(
        &mut self,
        hello: Hello,
        proven: bool,
        cookie: u64,
        addr: SocketAddr,
        from: SocketAddr,
        now: Instant,
        meta: Meta,
        replies: &mut Vec<Reply>,
    ) {
        let key = (addr, hello.header.session);
        let mut flags = 0;
        if self.cfg.gro {
            flags |= wire::ACK_GRO;
        }
        if self.cfg.psk.is_some() {
            flags |= wire::ACK_AUTH;
        }
        let slot = if proven {
            self.control_slot(key, now, meta.socket, true, replies)
        } else {
            self.totals.not_proven.hellos += 1;
            None
        };
        let allowed = match slot {
            Some(slot) => {
                let epoch = self.epoch;
                let peer = self.tagged.get_mut(slot);
                if !peer.is_finished() {
                    peer.seen(now, meta.drops, meta.cpu, meta.handled);
                }
                if hello.run.id != 0 {
                    peer.tagged.run.get_or_insert(hello.run);
                }
                if peer.tagged.history.is_none() && !peer.is_finished() {
                    peer.tagged.history = History::asked(hello.keep_intervals_ns(), &self.room);
                }
                flags |= wire::ACK_PROVEN;
                peer.tagged.answers.allow(now, epoch)
            }
            None => {
                if proven {
                    // Say so, rather than leave the client to conclude
                    // that no server is there.
                    flags |= wire::ACK_BUSY;
                }
                self.budget.allow(Asker::Unproven(addr), now)
            }
        };
        if !allowed {
            self.totals.answers_limited += 1;
            return;
        }
        let ack = HelloAck {
            session: hello.header.session,
            nonce: hello.nonce,
            flags,
            end_grace_ns: self.cfg.end_grace.as_nanos() as u64,
            recv_buffer: self.cfg.recv_buffer,
            cookie,
        };
        replies.push(Reply {
            bytes: ReplyBytes::Hello(wire::encode_hello_ack(&ack)),
            to: from,
            from: meta.local,
            socket: meta.socket,
        });
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_end(
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
        let Some(slot) = self.tagged.find(&key) else {
            // No session: the server never saw it start (or forgot it),
            // or the End is forged. Answered "no record", no larger than
            // the End and within the source's budget; nothing is kept.
            self.totals.not_proven.ends_unknown += 1;
            self.answer_unknown(&end, from, now, meta, replies);
            return;
        };
        if !self.tagged.get(slot).tagged.proven {
            self.totals.not_proven.ends_unproven += 1;
        }
        let reply = ReplyTo {
            to: from,
            local: meta.local,
            socket: meta.socket,
            nonce: end.nonce,
        };
        let declared = self.tagged.get(slot).tagged.declared;
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
            let t = &mut self.tagged.get_mut(slot).tagged;
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
        peer.seen(now, meta.drops, meta.cpu, meta.handled);
        match &mut peer.state {
            State::Closing { reply: pending, .. } => {
                // Answered once the grace period is over, to the latest ask.
                *pending = reply;
            }
            _ => {
                peer.tagged.declared = Some(end);
                peer.state = State::Closing {
                    grace_until: grace_from + grace,
                    reply,
                };
                self.attention = true;
            }
        }
    }

    /// Sends session `slot`'s answer, if the rate limit allows.
    pub(super) fn answer(
        &mut self,
        slot: usize,
        reply: ReplyTo,
        now: Instant,
        replies: &mut Vec<Reply>,
    ) {
        let from = canonical(reply.to);
        let epoch = self.epoch;
        let t = &mut self.tagged.get_mut(slot).tagged;
        let allowed = if t.proven {
            t.answers.allow(now, epoch)
        } else {
            self.budget.allow(Asker::Unproven(from), now)
        };
        if !allowed {
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

    /// The answer to an End of a session the table does not know: its
    /// figures are not the session's (`ACK_NO_RECORD`), and nothing is
    /// kept.
    fn answer_unknown(
        &mut self,
        end: &End,
        to: SocketAddr,
        now: Instant,
        meta: Meta,
        replies: &mut Vec<Reply>,
    ) {
        if !self.budget.allow(Asker::Unproven(canonical(to)), now) {
            self.totals.answers_limited += 1;
            return;
        }
        let unknown = wire::UNKNOWN;
        let ack = wire::EndAck {
            session: end.header.session,
            flags: wire::ACK_NO_RECORD,
            nonce: end.nonce,
            lost: end.sent_packets,
            lost_fewest: end.sent_packets,
            drops_start: unknown,
            drops_end: unknown,
            cpu_user_ns: unknown,
            cpu_system_ns: unknown,
            queue_p50_ns: unknown,
            queue_p90_ns: unknown,
            queue_p99_ns: unknown,
            queue_max_ns: unknown,
            clock_skew_ppb: unknown,
            ..wire::EndAck::default()
        };
        let bytes = match &self.cfg.psk {
            Some(psk) => wire::encode_end_ack_tagged(&ack, psk),
            None => wire::encode_end_ack(&ack),
        };
        replies.push(Reply {
            bytes: ReplyBytes::End(bytes),
            to,
            from: meta.local,
            socket: meta.socket,
        });
    }

    /// Writes a session's last interval and summary, answers its End, and
    /// keeps its record.
    pub(super) fn finalise(
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
            let proven = peer.tagged.proven;
            (reply, peer.socket, proven)
        };
        if reason != DoneReason::End {
            let drops_end = self.drops_end_now(self.tagged.get(slot));
            self.tagged.get_mut(slot).drops_end = drops_end;
        }
        let shared = self.tagged.get(slot).shared_now(&self.flags);
        self.tagged.get_mut(slot).shared = shared;
        let session = self.tagged.get(slot);
        if proven {
            self.write_done(session, Some(&session.tagged), reason, events);
        } else {
            // Never proven: counted in the totals, not reported one by one
            // (a flood of forged sessions must not flood the log).
            self.totals.not_proven.unproven_sessions += 1;
        }
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
            peer.tagged.freeze();
            if let Some(h) = peer.tagged.history.as_mut() {
                h.finish();
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
}
