//! One peer's figures: a session (tagged traffic, with its sequence
//! accounting in [`Tagged`]) or an untagged source, its state from active
//! to finished, and its answer to an End built from those figures.

use super::*;

/// Packets, payload bytes and estimated wire bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Amount {
    pub(super) packets: u64,
    pub(super) bytes: u64,
    pub(super) wire: u64,
}

impl Amount {
    pub(super) fn add(&mut self, other: Amount) {
        self.packets += other.packets;
        self.bytes += other.bytes;
        self.wire += other.wire;
    }

    pub(super) fn minus(self, other: Amount) -> Amount {
        Amount {
            packets: self.packets.saturating_sub(other.packets),
            bytes: self.bytes.saturating_sub(other.bytes),
            wire: self.wire.saturating_sub(other.wire),
        }
    }
}

/// Where the last interval line left off.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mark {
    pub(super) at: Instant,
    pub(super) total: Amount,
    pub(super) cpu: Option<CpuTime>,
}

/// Where to send an answer to an End, once the session is finalised.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReplyTo {
    /// As received (a v4-mapped address on a dual-stack socket).
    pub(super) to: SocketAddr,
    /// The address the End was sent to: the answer leaves from it.
    pub(super) local: Option<IpAddr>,
    pub(super) socket: usize,
    pub(super) nonce: u64,
}

pub(super) enum State {
    Active,
    Closing {
        grace_until: Instant,
        reply: ReplyTo,
    },
    Finished(Finished),
}

pub(super) struct Finished {
    pub(super) at: Instant,
    pub(super) reason: DoneReason,
    pub(super) late: Amount,
    pub(super) late_reported: u64,
    pub(super) last_late: Option<Instant>,
    /// When late datagrams were last reported (at most once a second).
    pub(super) late_reported_at: Option<Instant>,
    /// The record's key in the expiry index.
    pub(super) expiry: (Instant, u64),
}

pub(super) struct Tagged {
    pub(super) session: u64,
    pub(super) seq: SeqSet,
    pub(super) jitter: Jitter,
    /// Each new datagram's queue delay (the duplicates' says nothing new).
    pub(super) delay: QueueDelay,
    pub(super) declared: Option<End>,
    /// Untagged datagrams from the same address, counted in this session.
    pub(super) untagged_packets: u64,
    /// A Hello echoed the cookie of its address: the session's source
    /// receives where it sends from. Only a proven session is reported one
    /// by one; one seen only in data is counted in the totals.
    pub(super) proven: bool,
    pub(super) conflict: Option<&'static str>,
    /// Set when the session is finished with its End's totals: the figures
    /// no longer change, and the sequence set is freed.
    pub(super) frozen: Option<SeqFigures>,
    /// Its answers this second: its own budget, no other sender's.
    pub(super) answers: SessionBudget,
    /// The udp_client run it belongs to, as its confirming Hello said.
    pub(super) run: Option<wire::Run>,
    /// Its figures per interval of send time, when its Hello asked.
    pub(super) history: Option<History>,
}

/// Loss against what the sender declared, or estimated from sequence
/// numbers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Loss {
    /// Lost at most ...
    pub(super) most: u64,
    /// ... and at least (equal unless arrivals were uncertain).
    pub(super) fewest: u64,
    pub(super) expected: u64,
    pub(super) basis: &'static str,
}

/// What a session's sequence numbers say.
#[derive(Debug, Clone, Copy)]
pub(super) struct SeqFigures {
    pub(super) loss: Option<Loss>,
    pub(super) duplicates: u64,
    pub(super) reordered: u64,
    pub(super) uncertain: u64,
    pub(super) unexpected: u64,
}

impl Tagged {
    pub(super) fn figures(&self) -> SeqFigures {
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
    pub(super) fn freeze(&mut self) {
        if self.declared.is_some() {
            self.frozen = Some(self.figures());
            self.seq = SeqSet::with_bound(2);
        } else {
            self.seq.shrink();
        }
    }
}

pub(super) struct Peer {
    pub(super) addr: SocketAddr,
    pub(super) state: State,
    pub(super) total: Amount,
    /// The first data arrival, and what arrived at that instant.
    pub(super) first: Option<Instant>,
    pub(super) at_first: Amount,
    /// The last data arrival.
    pub(super) last: Instant,
    /// The last datagram of any kind (for the idle time-out).
    pub(super) last_seen: Instant,
    pub(super) mark: Option<Mark>,
    /// The receive socket, its drop counter at this peer's first and latest
    /// datagram, and whether anything else arrived on it meanwhile.
    pub(super) socket: usize,
    pub(super) drops_start: Option<u64>,
    pub(super) drops_end: Option<u64>,
    /// The receive threads' CPU at this peer's first and latest datagram,
    /// and when the first came.
    pub(super) cpu_start: Option<CpuTime>,
    pub(super) cpu_end: Option<CpuTime>,
    pub(super) first_seen: Instant,
    pub(super) joins_at_start: u64,
    pub(super) shared: bool,
    pub(super) gro_buffers: u64,
    /// The datagrams those GRO buffers held.
    pub(super) gro_datagrams: u64,
    pub(super) truncated: u64,
    /// What the table had handled at the peer's first and latest CPU
    /// sample, and the peers active when it started: whom its share of
    /// the receive CPU is taken against ([`Peer::cpu_sharing`]).
    pub(super) handled_start: Option<Handled>,
    pub(super) handled_end: Handled,
    pub(super) others_at_start: u64,
    /// The table's count of peers started, this one included.
    pub(super) started_as: u64,
}

/// The table's running counts when a datagram was read: every datagram
/// accounted so far and every peer started so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Handled {
    pub(super) datagrams: u64,
    pub(super) peers_started: u64,
}

impl Peer {
    pub(super) fn new(addr: SocketAddr, now: Instant, socket: usize) -> Self {
        Peer {
            addr,
            state: State::Active,
            total: Amount::default(),
            first: None,
            at_first: Amount::default(),
            last: now,
            last_seen: now,
            mark: None,
            socket,
            drops_start: None,
            drops_end: None,
            cpu_start: None,
            cpu_end: None,
            first_seen: now,
            joins_at_start: 0,
            shared: false,
            gro_buffers: 0,
            gro_datagrams: 0,
            truncated: 0,
            handled_start: None,
            handled_end: Handled::default(),
            others_at_start: 0,
            started_as: 0,
        }
    }

    pub(super) fn is_finished(&self) -> bool {
        matches!(self.state, State::Finished(_))
    }

    pub(super) fn count(&mut self, len: usize, at: Instant) {
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
    pub(super) fn count_amount(&mut self, amount: Amount, at: Instant) {
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

    pub(super) fn seen(
        &mut self,
        now: Instant,
        drops: Option<u64>,
        cpu: Option<CpuTime>,
        handled: Handled,
    ) {
        self.last_seen = self.last_seen.max(now);
        if drops.is_some() {
            self.drops_start = self.drops_start.or(drops);
            self.drops_end = drops;
        }
        if cpu.is_some() {
            self.cpu_start = self.cpu_start.or(cpu);
            self.cpu_end = cpu;
            self.handled_start.get_or_insert(handled);
            self.handled_end = handled;
        }
    }

    /// The receive CPU from the peer's first datagram to its latest.
    pub(super) fn cpu_used(&self) -> Option<CpuTime> {
        Some(self.cpu_end?.since(self.cpu_start?))
    }

    /// What the receive threads handled while [`Peer::cpu_used`] was
    /// spent: every datagram (its own included: at least those) and the
    /// other peers whose datagrams were among them, those active when it
    /// started and those started since.
    pub(super) fn cpu_sharing(&self) -> Option<wire::CpuSharing> {
        let start = self.handled_start?;
        let end = self.handled_end;
        let started_since = end.peers_started.saturating_sub(self.started_as);
        Some(wire::CpuSharing {
            other_peers: self.others_at_start + started_since,
            datagrams: end
                .datagrams
                .saturating_sub(start.datagrams)
                .max(self.total.packets),
        })
    }

    /// [`Peer::cpu_used`] as a cost over its span and bytes, its share
    /// where it was shared.
    pub(super) fn cpu_cost(&self, threads: usize) -> Option<CpuCost> {
        let cpu = self.cpu_used()?;
        let span = self.last_seen.saturating_duration_since(self.first_seen);
        // The receive threads' CPU: at most a core each.
        let whole = CpuCost::of(cpu, span, self.total.bytes).on_threads(threads);
        Some(match self.cpu_sharing() {
            Some(s) => whole.shared_by(self.total.packets, s.datagrams, s.other_peers),
            None => whole,
        })
    }

    /// How its datagrams came in: the basis of its drops in datagrams.
    pub(super) fn arrivals(&self) -> stats::Arrivals {
        stats::Arrivals {
            datagrams: self.total.packets,
            coalesced_buffers: self.gro_buffers,
            coalesced_datagrams: Some(self.gro_datagrams),
        }
    }

    pub(super) fn socket_drops(&self) -> Option<u64> {
        Some(self.drops_end?.saturating_sub(self.drops_start?))
    }

    /// Whether anything else arrived on this peer's socket while it was
    /// active (decided for good when it finishes: `finalise` stores it).
    pub(super) fn shared_now(&self, table: &TableFlags) -> bool {
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

/// A session: a peer's counters with its sequence accounting. Sessions
/// and untagged sources have their own types (and slabs), so there is no
/// session without its accounting.
pub(super) struct Session {
    pub(super) peer: Peer,
    pub(super) tagged: Box<Tagged>,
}

impl std::ops::Deref for Session {
    type Target = Peer;

    fn deref(&self) -> &Peer {
        &self.peer
    }
}

impl std::ops::DerefMut for Session {
    fn deref_mut(&mut self) -> &mut Peer {
        &mut self.peer
    }
}

impl Session {
    /// The answer to an End: the session's figures, which no longer change
    /// once it is finished (late datagrams are counted apart).
    pub(super) fn answer(&self, nonce: u64, epoch: Instant, table: &TableFlags) -> EndAck {
        let t = &self.tagged;
        let figures = t.figures();
        let (lost, lost_fewest) = figures.loss.map_or((0, 0), |l| (l.most, l.fewest));
        let since = |at: Instant| at.saturating_duration_since(epoch).as_nanos() as u64;
        let mut flags = 0;
        if table.gro {
            flags |= wire::ACK_GRO;
        }
        if table.kernel_times {
            flags |= wire::ACK_KERNEL_TIMES;
        }
        if self.shared_now(table) {
            flags |= wire::ACK_DROPS_SHARED;
        }
        if t.conflict.is_some() {
            flags |= wire::ACK_CONFLICT;
        }
        if t.history.is_some() {
            flags |= wire::ACK_INTERVALS;
        }
        let delay = t.delay.run();
        let ns = |ms: f64| (ms * 1e6).round() as u64;
        let queue = |pick: fn(&Spread) -> f64| delay.map_or(wire::UNKNOWN, |d| ns(pick(&d.spread)));
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
            gro_datagrams: self.gro_datagrams,
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
            queue_p50_ns: queue(|s| s.p50),
            queue_p90_ns: queue(|s| s.p90),
            queue_p99_ns: queue(|s| s.p99),
            queue_max_ns: queue(|s| s.max),
            delay_samples: delay.map_or(0, |d| d.samples),
            clock_skew_ppb: delay
                .and_then(|d| d.skew_ppm)
                .map_or(wire::UNKNOWN, |ppm| (ppm * 1e3).round() as i64 as u64),
            cpu_sharing: self.cpu_sharing().map_or(0, wire::CpuSharing::encode),
            tag: [0; wire::TAG_LEN],
        }
    }
}

/// Adds an untagged source's datagrams to the session from the same
/// address.
pub(super) fn merge(session: &mut Session, m: Peer) {
    session.tagged.untagged_packets += m.total.packets;
    let peer = &mut session.peer;
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
    peer.gro_datagrams += m.gro_datagrams;
    peer.truncated += m.truncated;
}

/// Both combined with `both`, or whichever is known.
pub(super) fn either<T>(a: Option<T>, b: Option<T>, both: impl FnOnce(T, T) -> T) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(both(a, b)),
        (a, b) => a.or(b),
    }
}
