//! The table's unit tests: datagrams in, replies and events out, no sockets.

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
            send_time_ns: seq.wrapping_mul(1000),
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
    hello_with(session, nonce, 0)
}

fn hello_with(session: u64, nonce: u64, cookie: u64) -> [u8; wire::HELLO_LEN] {
    encode_hello(&Hello {
        header: Header {
            session,
            ..Header::default()
        },
        nonce,
        cookie,
        ..Hello::default()
    })
}

/// Cookies as the server makes them (one fixed key, one slot), so that
/// the table's tests can prove a session's address.
struct Cookies(crate::auth::CookieKey);

impl Control for Cookies {
    fn on_control(
        &mut self,
        _request: ControlRequest,
        _may_answer: &mut dyn FnMut(Asker) -> bool,
        _replies: &mut Vec<Reply>,
    ) -> bool {
        false
    }

    fn cookie(&self, addr: SocketAddr, session: u64, _now: Instant) -> u64 {
        self.0.cookie(addr, session, 1)
    }

    fn cookie_is_good(&self, addr: SocketAddr, session: u64, cookie: u64, _now: Instant) -> bool {
        self.0.check(addr, session, cookie, 1)
    }
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
    versions: Vec<VersionReport>,
}

impl Sink {
    fn f(&mut self) -> impl FnMut(Event) + '_ {
        |e| match e {
            Event::Done(r) => self.done.push(r),
            Event::Interval(r) => self.intervals.push(r),
            Event::Late(r) => self.late.push(r),
            Event::Conflict(r) => self.conflicts.push(r),
            Event::WrongVersion(r) => self.versions.push(r),
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
    cookies: Cookies,
    /// Sessions are proven before their first datagram, as a client's
    /// are by its Hello; false for the tests of what is not proven.
    proving: bool,
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
            cookies: Cookies(crate::auth::CookieKey::from_bytes([7; 32])),
            proving: true,
        }
    }

    /// `bytes` arrive from `from`; the answer, if one is sent at once.
    fn send(&mut self, bytes: &[u8], from: SocketAddr, at: Duration) -> Option<Reply> {
        let now = self.t0 + at;
        let rx = Rx {
            from,
            arrived: now,
            processed: now,
            socket: 0,
            drops: self.drops,
            ..Rx::default()
        };
        let mut replies = Vec::new();
        self.table
            .on_receive_with(bytes, &rx, &mut replies, &mut self.cookies);
        replies.pop()
    }

    /// The same table, its sessions not proven unless a Hello proves
    /// them.
    fn unproven(mut self) -> Self {
        self.proving = false;
        self
    }

    /// Proves `session` from `from`, if the harness does and the table
    /// does not know it yet.
    fn prove(&mut self, from: SocketAddr, session: u64, at: Duration) {
        let key = (canonical(from), session);
        if self.proving && self.table.tagged.peers_find(&key).is_none() {
            self.table.expect(key, self.t0 + at);
        }
    }

    fn data(
        &mut self,
        from: SocketAddr,
        session: u64,
        seq: u64,
        len: usize,
        at: Duration,
    ) -> Option<Reply> {
        self.prove(from, session, at);
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
        self.prove(from, session, at);
        self.send(&end_msg(session, packets, bytes, nonce), from, at)
    }

    /// A client's start: a Hello, and the Hello that echoes the cookie
    /// of the answer (nonces: the session id). The second answer, if any.
    fn hello(&mut self, from: SocketAddr, session: u64, at: Duration) -> Option<Reply> {
        let cookie = self.cookies.cookie(canonical(from), session, self.t0 + at);
        self.send(&hello_with(session, session, cookie), from, at)
    }

    /// A Hello without a cookie (the first round trip, or a forged one).
    fn hello_ask(&mut self, from: SocketAddr, session: u64, at: Duration) -> Option<Reply> {
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
fn hellos_that_find_the_table_full_are_answered_busy_and_counted() {
    let mut t = Harness::with_max_peers(2);
    let a = addr("10.0.0.1:9");
    let busy = (0..5)
        .filter(|&i| hello_flags(t.hello(a, i, START)) & wire::ACK_BUSY != 0)
        .count();
    assert_eq!(busy, 3);
    assert_eq!(t.table.totals.hellos_table_full, 3);
    assert_eq!(t.table.len(), 2);
}

#[test]
fn a_proven_session_takes_the_slot_of_a_session_seen_only_in_data() {
    let mut t = Harness::with_max_peers(4).unproven();
    // A flood of forged data sessions (from many addresses: one IP holds
    // a quarter of their budget) fills its half of the table.
    for port in 0..10u16 {
        let from = SocketAddr::from(([10, 0, 1, port as u8], port));
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
    // Never proven: counted, not reported one by one.
    assert!(t.sink.done.is_empty(), "{:?}", t.sink.done);
    assert_eq!(t.table.totals.not_proven.unproven_sessions, 2);
    assert_eq!(t.table.totals.not_proven.unproven_packets, 2);
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
    assert!(t.table.tagged.get(slot).tagged.seq.ranges() <= 1);
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
fn an_end_for_a_session_never_seen_says_so_and_leaves_nothing() {
    let mut t = Harness::new();
    let a = addr("127.0.0.1:5000");
    // Answered at once, no larger than the End, and nothing is kept: a
    // flood of forged Ends leaves no state and no summaries.
    let reply = t.send(&end_msg(7, 10, 1000, 1), a, START).unwrap();
    assert!(reply.bytes.as_slice().len() <= wire::END_LEN);
    let ack = ack_of(&reply);
    assert_ne!(ack.flags & wire::ACK_NO_RECORD, 0);
    assert_eq!((ack.received_packets, ack.lost), (0, 10));
    t.expire(200 * MS);
    assert!(t.table.is_empty() && t.sink.done.is_empty());
    assert_eq!(t.table.totals.not_proven.ends_unknown, 1);
    // With a Hello first, all data lost is a real 100 % loss.
    let b = addr("127.0.0.1:5001");
    t.hello(b, 8, START);
    t.end(b, 8, 10, 1000, 1, START);
    let ack = t.first_ack(400 * MS);
    assert_eq!(ack.flags & wire::ACK_NO_RECORD, 0);
    assert_eq!(ack.lost, 10);
}

#[test]
fn unproven_answers_are_bounded_per_source_and_per_prefix_and_create_nothing() {
    let mut t = Harness::with_max_peers(4096);
    let a = addr("10.0.0.1:9");
    let answered = (0..3000)
        .filter(|&i| t.hello_ask(a, i, START).is_some())
        .count();
    assert_eq!(
        answered, ANSWERS_PER_SOURCE as usize,
        "one port: its own budget"
    );
    assert_eq!(
        t.table.len(),
        0,
        "a Hello without its cookie creates nothing"
    );
    // Other ports of the same IP share the source's budget.
    let asked = 2 * ANSWERS_PER_PREFIX as u64;
    let answered = (0..asked)
        .filter(|&i| {
            let from = SocketAddr::from(([10, 0, 0, 1], 1000 + (i % 4000) as u16));
            t.hello_ask(from, 10_000 + i, START).is_some()
        })
        .count();
    assert_eq!(answered as u32, ANSWERS_PER_PREFIX - ANSWERS_PER_SOURCE);
    assert_eq!(
        t.table.totals.answers_limited,
        3000 + asked - u64::from(ANSWERS_PER_PREFIX)
    );
    assert_eq!(t.table.totals.not_proven.hellos, 3000 + asked);
    assert_eq!(t.table.len(), 0);
    // A session proven by its cookie is answered from its own budget,
    // whatever its source's unproven budget says.
    let flags = hello_flags(t.hello(addr("10.0.0.1:5000"), 7, START));
    assert_ne!(flags & wire::ACK_PROVEN, 0);
    // A second later the budgets are full again.
    let reply = t.hello_ask(a, 1, Duration::from_millis(1001)).unwrap();
    let Ok(Message::HelloAck(ack)) = wire::decode(reply.bytes.as_slice()) else {
        panic!("not a HelloAck")
    };
    assert_eq!((ack.session, ack.nonce), (1, 1));
    assert_eq!(ack.flags & wire::ACK_PROVEN, 0);
    assert_ne!(ack.cookie, 0);
    assert!(reply.bytes.as_slice().len() <= wire::HELLO_LEN);
}

#[test]
fn floods_from_another_port_of_the_same_ip_cannot_lock_a_client_out() {
    let mut t = Harness::with_max_peers(4096).unproven();
    let attacker = addr("10.0.0.1:6000");
    // 1,100 sessions seen only in data, from another port of the
    // client's own IP: they take at most their own budget.
    for i in 0..1100u64 {
        t.data(attacker, 0xa000 + i, 0, 64, START);
    }
    assert_eq!(t.table.active_sessions, t.table.unproven_per_source_bound());
    // 40,000 Hellos with one session id, from the same port, and as many
    // from random ports of the same IP.
    for i in 0..40_000u64 {
        t.hello_ask(attacker, 0xbad, START + Duration::from_micros(i));
        let port = SocketAddr::from(([10, 0, 0, 1], 1024 + (i % 60_000) as u16));
        t.hello_ask(port, i, START + Duration::from_micros(i));
    }
    // The real client, on its own port, still gets a session and its
    // answer.
    let client = addr("10.0.0.1:5000");
    let flags = hello_flags(t.hello(client, 7, START + 50 * MS));
    assert_eq!(flags & wire::ACK_BUSY, 0, "the client got a session");
    for seq in 0..100 {
        t.data(client, 7, seq, 1000, START + 60 * MS);
    }
    t.end(client, 7, 100, 100_000, 1, START + 70 * MS);
    let ack = t.first_ack(START + 400 * MS);
    assert_eq!((ack.received_packets, ack.lost), (100, 0));
}

#[test]
fn a_hello_alone_leaves_nothing() {
    let mut t = Harness::new();
    let a = addr("10.0.0.1:9");
    assert!(t.send(&hello(5, 1), a, START).is_some());
    assert_eq!(
        t.table.len(),
        0,
        "a Hello without its cookie creates nothing"
    );
    // A confirmed one makes a session, which leaves no summary if no
    // data comes.
    t.hello(a, 5, START);
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
    t.prove(a, 4, START);
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
    let mut tail = data(4, 6, 400);
    tail.extend_from_slice(&end_msg(4, 7, 940, 1)[..]);
    let rx = Rx {
        arrived: t.t0 + 10 * MS,
        processed: t.t0 + 10 * MS,
        segment_size: Some(400),
        ..rx
    };
    t.table.on_receive(&tail, &rx, &mut replies);
    let replies = t.expire(200 * MS);
    let ack = ack_of(&replies[0]);
    assert_eq!(
        (ack.received_packets, ack.received_bytes, ack.lost),
        (7, 940, 0)
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
            t.table
                .receive(buf, &rx, &mut Vec::new(), runs, &mut NoControl);
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

/// Issue 41: a foreign sender's last datagrams, dropped while the reader
/// was starved, are in no later datagram's stamp; the counter read
/// directly has them, and the peer's summary counts them.
#[test]
fn drops_after_a_peers_last_datagram_count_in_its_summary() {
    let mut t = Harness::new();
    let a = addr("127.0.0.1:7");
    t.drops = Some(0);
    for i in 0..100u32 {
        t.send(&[0u8; 14], a, MS * i);
    }
    // The reader was starved: 40 more were dropped, and nothing queued
    // after them says so.
    t.table.observe_kernel_drops(0, 40, Instant::now());
    // A stamp older than that reading (a datagram queued before the
    // drops, read after it) moves nothing back.
    t.send(&[0u8; 14], a, 100 * MS);
    assert_eq!(t.table.kernel_drops(), Some(40));
    t.expire(2200 * MS);
    let done = &t.sink.done[0];
    assert_eq!((done.packets, done.reason), (101, Some(DoneReason::Idle)));
    assert_eq!(done.drops.kernel_drops, Some(40));
    assert_eq!(t.table.kernel_drops(), Some(40));
}

/// Issue 41: a peer whose datagrams still wait in the socket's queue is
/// not idle, however long ago the reader last read one: it is judged by
/// how far the readers have read, and its queued datagrams stay its own.
#[test]
fn a_peer_is_idle_only_once_the_readers_have_read_past_its_timeout() {
    let mut t = Harness::with(TableConfig {
        idle_timeout: Duration::from_secs(1),
        ..TableConfig::default()
    });
    let a = addr("127.0.0.1:7");
    t.table.read_up_to(0, t.t0);
    for i in 0..10u32 {
        t.send(&[0u8; 14], a, MS * i);
    }
    t.table.read_up_to(0, t.t0 + 9 * MS);
    // The reader stalls for 3 s, with more of the peer's datagrams
    // queued: by the clock the peer is long idle, by the reader not.
    t.expire(3000 * MS);
    assert!(t.sink.done.is_empty(), "not idle while its data is queued");
    for i in 10..20u32 {
        t.send(&[0u8; 14], a, MS * i);
    }
    t.table.read_up_to(0, t.t0 + 19 * MS);
    // Back, the reader finds the queue empty at a read that began 0.9 s
    // into the run: not yet a second past the peer's last datagram ...
    t.table.read_up_to(0, t.t0 + 900 * MS);
    t.expire(3100 * MS);
    assert!(t.sink.done.is_empty());
    // ... and then past it: one summary, every datagram in it.
    t.table.read_up_to(0, t.t0 + 1100 * MS);
    t.expire(3200 * MS);
    assert_eq!(t.sink.done.len(), 1);
    assert_eq!(t.sink.done[0].packets, 20);
    assert_eq!(t.table.totals.peers, 1, "one peer, not split");
}

/// A reader starved while the socket overflows: nothing of the peer is
/// queued, but the drop counter grows. The peer is not idle until the
/// drops stop too, so the datagrams after it are not a second peer.
#[test]
fn a_peer_whose_socket_still_drops_is_not_idle() {
    let mut t = Harness::with(TableConfig {
        idle_timeout: Duration::from_secs(1),
        ..TableConfig::default()
    });
    let a = addr("127.0.0.1:7");
    t.drops = Some(0);
    for i in 0..10u32 {
        t.send(&[0u8; 14], a, MS * i);
    }
    t.table.observe_kernel_drops(0, 0, t.t0 + 10 * MS);
    t.table.observe_kernel_drops(0, 500, t.t0 + 1500 * MS);
    t.expire(2000 * MS);
    assert!(t.sink.done.is_empty(), "its socket still took traffic");
    t.expire(2600 * MS);
    assert_eq!(t.sink.done.len(), 1);
    assert_eq!(t.sink.done[0].packets, 10);
    assert_eq!(t.sink.done[0].drops.kernel_drops, Some(500));
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
