//! A session's figures per interval of send time, kept when its Hello
//! asked (`udp_client --plot`), and the pages that carry them back
//! ([`wire::IntervalsAsk`]).
//!
//! Why by send time: see [`wire::intervals`]; the client matches each
//! interval to its own by the lowest sequence number that arrived in it.
//! Why only the newest interval's delays are open: datagrams arrive in
//! about the order they were sent, so an interval is done once the next
//! one's first datagram arrives. A straggler of an older interval is
//! counted in its packets and bytes, but its delay is not in that
//! interval's percentiles (one histogram per session, not one per
//! interval).
//!
//! Why bounded twice: an interval costs 40 bytes, and a session keeps at
//! most [`MOST_INTERVALS`] of them; the whole table at most
//! [`INTERVALS_BUDGET`], shared through [`Room`], which a history gives
//! back when it goes (whichever way its session leaves the table). A
//! datagram whose interval finds no room is left out, and the pages say
//! so (not `complete`): the client then does not take a missing interval
//! for one where nothing arrived.

use super::*;
use crate::stats::delay::SpanDelays;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Intervals one session keeps at most: an hour of seconds.
pub const MOST_INTERVALS: usize = 3600;
/// Intervals the whole table keeps at most (40 MB of them).
pub const INTERVALS_BUDGET: usize = 1 << 20;
/// The shortest interval a server keeps (a Hello that asks for shorter
/// ones gets none): shorter ones hold too few datagrams for a 99th
/// percentile, and would fill [`MOST_INTERVALS`] in seconds.
pub const SHORTEST_INTERVAL: Duration = Duration::from_millis(10);

/// The room for intervals the table's sessions share.
#[derive(Debug, Clone, Default)]
pub(super) struct Room(Arc<AtomicUsize>);

impl Room {
    /// Takes `n` intervals' room, if there is that much.
    fn take(&self, n: usize) -> bool {
        self.0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                (used + n <= INTERVALS_BUDGET).then_some(used + n)
            })
            .is_ok()
    }

    fn give(&self, n: usize) {
        self.0.fetch_sub(n, Ordering::Relaxed);
    }

    /// Intervals kept now, by every session.
    #[cfg(test)]
    pub(super) fn used(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// One session's intervals.
#[derive(Debug)]
pub(super) struct History {
    every_ns: u64,
    kept: Vec<wire::IntervalFigures>,
    /// The newest interval, whose delays are still being gathered.
    open: Option<usize>,
    delays: SpanDelays,
    /// A datagram was left out (no room, or beyond the most kept).
    left_out: bool,
    /// The room taken from the table's: `kept`'s capacity.
    held: usize,
    room: Room,
}

impl History {
    /// The history a Hello asked for with `every_ns`; None when it asked
    /// for none, or for intervals shorter than [`SHORTEST_INTERVAL`].
    pub(super) fn asked(every_ns: u64, room: &Room) -> Option<History> {
        (every_ns >= SHORTEST_INTERVAL.as_nanos() as u64).then(|| History {
            every_ns,
            kept: Vec::new(),
            open: None,
            delays: SpanDelays::default(),
            left_out: false,
            held: 0,
            room: room.clone(),
        })
    }

    fn index(&self, send_ns: u64) -> usize {
        usize::try_from(send_ns / self.every_ns).unwrap_or(usize::MAX)
    }

    /// Whether datagrams sent at `a` and at `b` fall in one interval.
    pub(super) fn same_interval(&self, a: u64, b: u64) -> bool {
        self.index(a) == self.index(b)
    }

    /// `count` new datagrams (`bytes` in all), the first numbered `seq`,
    /// sent at `send_ns` on the sender's clock, that waited `delay_us`
    /// above the floor ([`QueueDelay::record`]'s).
    pub(super) fn record(&mut self, send_ns: u64, seq: u64, count: u64, bytes: u64, delay_us: u64) {
        let i = self.index(send_ns);
        if i >= self.kept.len() {
            if i >= MOST_INTERVALS || !self.make_room(i + 1) {
                self.left_out = true;
                return;
            }
            self.kept.resize(i + 1, wire::IntervalFigures::NONE);
        }
        let f = &mut self.kept[i];
        f.packets += count;
        f.bytes += bytes;
        f.lowest_seq = f.lowest_seq.min(seq);
        match self.open {
            Some(open) if open > i => return,
            Some(open) if open < i => {
                self.close();
                self.open = Some(i);
            }
            _ => self.open = Some(i),
        }
        self.delays.record(delay_us, count);
    }

    /// Room for `len` intervals, taken from the table's as the vector
    /// grows (doubling, up to [`MOST_INTERVALS`]): what it holds is what
    /// it counts.
    fn make_room(&mut self, len: usize) -> bool {
        if len <= self.held {
            return true;
        }
        let want = len.max(self.held * 2).clamp(16, MOST_INTERVALS);
        if !self.room.take(want - self.held) {
            return false;
        }
        self.held = want;
        self.kept.reserve_exact(want - self.kept.len());
        true
    }

    /// The open interval's percentiles, into its figures.
    fn close(&mut self) {
        let Some(open) = self.open.take() else {
            return;
        };
        if let Some((p50, p99)) = self.delays.take() {
            let f = &mut self.kept[open];
            (f.queue_p50_ns, f.queue_p99_ns) = (p50 * 1000, p99 * 1000);
        }
    }

    /// The session is finished: the last interval's percentiles, and the
    /// histogram's memory back.
    pub(super) fn finish(&mut self) {
        self.close();
        self.delays.free();
    }

    /// The page from interval `first` on, answering `nonce`.
    pub(super) fn page(&self, session: u64, nonce: u64, first: u64) -> [u8; wire::INTERVALS_LEN] {
        let from = usize::try_from(first)
            .unwrap_or(usize::MAX)
            .min(self.kept.len());
        let to = (from + wire::INTERVALS_PER_PAGE).min(self.kept.len());
        let page = wire::IntervalsPage {
            session,
            flags: 0,
            nonce,
            every_ns: self.every_ns,
            total: self.kept.len() as u64,
            first: from as u64,
            count: (to - from) as u64,
            complete: !self.left_out,
        };
        wire::encode_intervals_page(&page, &self.kept[from..to])
    }

    #[cfg(test)]
    pub(super) fn kept(&self) -> &[wire::IntervalFigures] {
        &self.kept
    }
}

impl Drop for History {
    fn drop(&mut self) {
        self.room.give(self.held);
    }
}

impl PeerTable {
    /// An ask for a page of a finished session's intervals: answered from
    /// its record, within the session's own budget, never larger than the
    /// ask; anything else (no such session, not proven, not finished, no
    /// intervals kept, a bad tag) is not answered.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_intervals_ask(
        &mut self,
        ask: wire::IntervalsAsk,
        raw: &[u8],
        addr: SocketAddr,
        from: SocketAddr,
        now: Instant,
        meta: Meta,
        replies: &mut Vec<Reply>,
    ) {
        if let Some(psk) = &self.cfg.psk {
            if !wire::verify_tag(raw, psk) {
                return;
            }
        }
        let Some(slot) = self.tagged.find(&(addr, ask.session)) else {
            return;
        };
        let epoch = self.epoch;
        let session = self.tagged.get_mut(slot);
        if !session.is_finished() || !session.tagged.proven {
            return;
        }
        let t = &mut *session.tagged;
        let Some(history) = t.history.as_ref() else {
            return;
        };
        let page = history.page(ask.session, ask.nonce, ask.first);
        if !t.answers.allow(now, epoch) {
            self.totals.answers_limited += 1;
            return;
        }
        let bytes = match &self.cfg.psk {
            Some(psk) => wire::encode_tagged(page, psk),
            None => page,
        };
        replies.push(Reply {
            bytes: ReplyBytes::Intervals(Box::new(bytes)),
            to: from,
            from: meta.local,
            socket: meta.socket,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{encode_end, encode_hello, write_data_header, Header};

    const MS: u64 = 1_000_000;
    const SESSION: u64 = 0x77;

    /// Every cookie but 0 is good: a Hello with one proves its session.
    struct AnyCookie;

    impl Control for AnyCookie {
        fn on_control(
            &mut self,
            _request: ControlRequest,
            _may_answer: &mut dyn FnMut(Asker) -> bool,
            _replies: &mut Vec<Reply>,
        ) -> bool {
            false
        }

        fn cookie(&self, _addr: SocketAddr, _session: u64, _now: Instant) -> u64 {
            1
        }

        fn cookie_is_good(&self, _a: SocketAddr, _s: u64, cookie: u64, _now: Instant) -> bool {
            cookie != 0
        }
    }

    struct Table {
        table: PeerTable,
        t0: Instant,
        from: SocketAddr,
    }

    impl Table {
        fn new() -> Self {
            let t0 = Instant::now();
            Table {
                table: PeerTable::new(TableConfig::default(), t0),
                t0,
                from: "127.0.0.1:5000".parse().unwrap(),
            }
        }

        /// `bytes` arrive `at_ms` after the start (as one GRO buffer of
        /// `segment`-byte datagrams, when given); the answers sent at once.
        fn receive(&mut self, bytes: &[u8], at_ms: u64, segment: Option<usize>) -> Vec<Reply> {
            let now = self.t0 + Duration::from_nanos(at_ms * MS);
            let rx = Rx {
                from: self.from,
                arrived: now,
                processed: now,
                segment_size: segment,
                ..Rx::default()
            };
            let mut replies = Vec::new();
            self.table
                .on_receive_with(bytes, &rx, &mut replies, &mut AnyCookie);
            replies
        }

        /// The confirming Hello, asking for intervals of `every_ms`.
        fn hello(&mut self, every_ms: u64) {
            let hello = encode_hello(&Hello {
                header: Header {
                    session: SESSION,
                    seq: every_ms * MS,
                    send_time_ns: 0,
                },
                nonce: 1,
                cookie: 1,
                ..Hello::default()
            });
            let replies = self.receive(&hello, 0, None);
            let Ok(Message::HelloAck(ack)) = wire::decode(replies[0].bytes.as_slice()) else {
                panic!("a HelloAck");
            };
            assert_ne!(ack.flags & wire::ACK_PROVEN, 0);
        }

        /// Datagram `seq` (100 bytes), sent at `sent_ms`, arrives at `at_ms`.
        fn data(&mut self, seq: u64, sent_ms: u64, at_ms: u64) {
            let bytes = datagram(seq, sent_ms);
            assert!(self.receive(&bytes, at_ms, None).is_empty());
        }

        /// The End for `sent` datagrams at `at_ms`, and its answer after
        /// the grace period.
        fn end(&mut self, sent: u64, at_ms: u64) -> EndAck {
            let end = encode_end(&End {
                header: Header {
                    session: SESSION,
                    seq: sent,
                    send_time_ns: 0,
                },
                sent_packets: sent,
                sent_bytes: sent * 100,
                nonce: 5,
                ..End::default()
            });
            assert!(self.receive(&end, at_ms, None).is_empty());
            let mut replies = Vec::new();
            let later = self.t0 + Duration::from_nanos((at_ms + 200) * MS);
            self.table.expire(later, &mut |_| {}, &mut replies);
            match wire::decode(replies[0].bytes.as_slice()) {
                Ok(Message::EndAck(ack)) => ack,
                other => panic!("not an EndAck: {other:?}"),
            }
        }

        /// The page from `first` on, if answered.
        fn page(
            &mut self,
            first: u64,
            at_ms: u64,
        ) -> Option<(IntervalsPage, Vec<IntervalFigures>)> {
            let ask = wire::encode_intervals_ask(&wire::IntervalsAsk {
                session: SESSION,
                nonce: 40 + first,
                first,
            });
            let replies = self.receive(&ask, at_ms, None);
            let reply = replies.first()?;
            let raw = reply.bytes.as_slice();
            assert_eq!(raw.len(), ask.len(), "never larger than the ask");
            match wire::decode(raw) {
                Ok(Message::Intervals(p)) => {
                    assert_eq!(p.nonce, 40 + first);
                    Some((p, wire::page_intervals(raw, &p)))
                }
                other => panic!("not a page: {other:?}"),
            }
        }
    }

    use wire::{End, EndAck, Hello, IntervalFigures, IntervalsPage};

    fn datagram(seq: u64, sent_ms: u64) -> Vec<u8> {
        let mut buf = vec![0u8; 100];
        let header = Header {
            session: SESSION,
            seq,
            send_time_ns: sent_ms * MS,
        };
        assert!(write_data_header(&mut buf, &header));
        buf
    }

    #[test]
    fn what_arrived_of_each_interval_sent_comes_back_in_pages() {
        let mut t = Table::new();
        t.hello(1000);
        // Interval 0 (sent in the first second): seq 0..3, one datagram
        // 30 ms late; interval 1: seq 3 lost, 4..6; interval 2: seq 6.
        // Seq 2 is a straggler: it arrives after interval 1 opened, and
        // counts in interval 0, its delay in no percentile.
        t.data(0, 100, 101);
        t.data(1, 500, 531);
        t.data(4, 1100, 1101);
        t.data(2, 900, 1150);
        t.data(5, 1500, 1502);
        t.data(6, 2100, 2101);
        assert!(t.page(0, 2200).is_none(), "not before the session is done");
        let ack = t.end(7, 2300);
        assert_ne!(ack.flags & wire::ACK_INTERVALS, 0, "the answer says so");
        let (page, kept) = t.page(0, 2600).expect("a page");
        assert_eq!(
            (page.every_ns, page.total, page.first, page.count),
            (1000 * MS, 3, 0, 3)
        );
        assert!(page.complete);
        let figures: Vec<(u64, u64, u64)> = kept
            .iter()
            .map(|f| (f.packets, f.bytes, f.lowest_seq))
            .collect();
        assert_eq!(figures, [(3, 300, 0), (2, 200, 4), (1, 100, 6)]);
        // Delays above the floor (1 ms): interval 0's are 0 and 30 ms.
        assert_eq!(kept[0].queue_p50_ns, 0);
        assert!(
            (29_500_000..=30_500_000).contains(&kept[0].queue_p99_ns),
            "{:?}",
            kept[0]
        );
        // Two significant digits: 1 ms within 1 %.
        assert_eq!(kept[1].queue_p50_ns, 0);
        assert!(
            (1_000_000..=1_010_000).contains(&kept[1].queue_p99_ns),
            "{:?}",
            kept[1]
        );
        assert_eq!((kept[2].queue_p50_ns, kept[2].queue_p99_ns), (0, 0));
        // Past the end: an empty page that says how many there are.
        let (past, none) = t.page(3, 2700).expect("an empty page");
        assert_eq!((past.total, past.count), (3, 0));
        assert!(none.is_empty());
    }

    #[test]
    fn a_session_that_did_not_ask_keeps_nothing_and_is_not_answered() {
        for every_ms in [0, 5] {
            let mut t = Table::new();
            t.hello(every_ms);
            t.data(0, 0, 1);
            let ack = t.end(1, 10);
            assert_eq!(ack.flags & wire::ACK_INTERVALS, 0, "every {every_ms} ms");
            assert!(t.page(0, 300).is_none());
        }
        assert_eq!(SHORTEST_INTERVAL, Duration::from_millis(10));
    }

    #[test]
    fn a_gro_buffer_across_two_intervals_is_counted_in_each() {
        let mut t = Table::new();
        t.hello(100);
        let mut buffer = datagram(0, 90);
        buffer.extend(datagram(1, 95));
        buffer.extend(datagram(2, 101));
        assert!(t.receive(&buffer, 102, Some(100)).is_empty());
        t.end(3, 200);
        let (_, kept) = t.page(0, 400).unwrap();
        let figures: Vec<(u64, u64)> = kept.iter().map(|f| (f.packets, f.lowest_seq)).collect();
        assert_eq!(figures, [(2, 0), (1, 2)]);
        // Within one interval, one run.
        let mut t = Table::new();
        t.hello(100);
        let mut buffer = datagram(0, 10);
        buffer.extend(datagram(1, 20));
        assert!(t.receive(&buffer, 21, Some(100)).is_empty());
        t.end(2, 100);
        assert_eq!(t.page(0, 300).unwrap().1[0].packets, 2);
        assert_eq!(t.table.totals.gro_buffers, 1);
    }

    #[test]
    fn intervals_are_bounded_per_session_and_in_all_and_the_room_comes_back() {
        let room = Room::default();
        let mut h = History::asked(10 * MS, &room).unwrap();
        h.record(0, 0, 1, 100, 0);
        assert!(room.used() >= 1);
        // Beyond the most a session keeps: left out, and said.
        h.record(MOST_INTERVALS as u64 * 10 * MS, 1, 1, 100, 0);
        assert!(h.kept().len() == 1 && h.left_out);
        h.record((MOST_INTERVALS as u64 - 1) * 10 * MS, 2, 1, 100, 0);
        assert_eq!(h.kept().len(), MOST_INTERVALS);
        assert_eq!(room.used(), MOST_INTERVALS);
        drop(h);
        assert_eq!(room.used(), 0, "given back");
        // The table's room: what one session took, another cannot.
        room.0.store(INTERVALS_BUDGET - 16, Ordering::Relaxed);
        let mut a = History::asked(10 * MS, &room).unwrap();
        a.record(0, 0, 1, 100, 0);
        assert_eq!(room.used(), INTERVALS_BUDGET);
        let mut b = History::asked(10 * MS, &room).unwrap();
        b.record(0, 0, 1, 100, 0);
        assert!(b.kept().is_empty() && b.left_out);
        drop(a);
        b.record(0, 1, 1, 100, 0);
        assert_eq!(b.kept().len(), 1);
        // A finished session's record keeps its intervals until it goes.
        let mut t = Table::new();
        t.hello(1000);
        t.data(0, 0, 1);
        t.end(1, 10);
        assert!(t.table.room.used() > 0);
        t.table
            .expire(t.t0 + Duration::from_secs(60), &mut |_| {}, &mut Vec::new());
        assert!(t.table.is_empty());
        assert_eq!(t.table.room.used(), 0);
    }
}
