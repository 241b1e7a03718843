//! Proof that the scripted test relay (`common::impair::Relay`) does what it
//! claims, before any end-to-end test takes its expected figures from the
//! relay's counts. No netspeed binary runs here: a plain "server" socket
//! records what arrives (and answers when told to), a plain "client" socket
//! sends datagrams built by hand in the wire layout (`NSPD`, version, kind,
//! 2 zero bytes, session u64, seq u64, time u64, payload).
//!
//! Every wait is bounded by a read timeout, and each test takes well under a
//! second.

mod common;

use common::impair::{data_seq, kind, kind_of, Action, Dir, Pick, Relay, RelayCounts, CAPTURE_MAX};
use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// The relay's own deadline; the tests finish it long before.
const LIFE: Duration = Duration::from_secs(10);
/// How long to wait for datagrams that must arrive.
const WAIT: Duration = Duration::from_secs(2);
/// How long to listen to make sure nothing (more) arrives.
const QUIET: Duration = Duration::from_millis(60);
const SESSION: u64 = 0x5e55_1011_dead_beef;

/// A datagram in the wire layout, with version 2.
fn dgram(kind: u8, session: u64, seq: u64, payload: &[u8]) -> Vec<u8> {
    dgram_v(2, kind, session, seq, payload)
}

fn dgram_v(version: u8, kind: u8, session: u64, seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut d = Vec::with_capacity(32 + payload.len());
    d.extend_from_slice(b"NSPD");
    d.extend_from_slice(&[version, kind, 0, 0]);
    d.extend_from_slice(&session.to_be_bytes());
    d.extend_from_slice(&seq.to_be_bytes());
    d.extend_from_slice(&0x0123_4567_89ab_cdefu64.to_be_bytes());
    d.extend_from_slice(payload);
    d
}

/// A Data datagram; the payload differs per seq, so copies are recognisable.
fn data(seq: u64) -> Vec<u8> {
    dgram(0, SESSION, seq, &[seq as u8; 100])
}

/// The big-endian u64 at `at` (session at 8, seq at 16).
fn field(d: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(d[at..at + 8].try_into().unwrap())
}

fn socket() -> UdpSocket {
    UdpSocket::bind("127.0.0.1:0").expect("bind test socket")
}

/// A client socket connected to the relay.
fn client_of(relay: &Relay) -> UdpSocket {
    let c = socket();
    c.connect(relay.addr).expect("connect client to relay");
    c
}

struct Got {
    bytes: Vec<u8>,
    from: SocketAddr,
    at: Instant,
}

impl std::fmt::Debug for Got {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{{kind {:?}, {} bytes, seq field {}, from {}}}",
            kind_of(&self.bytes),
            self.bytes.len(),
            self.bytes.get(16..24).map_or(0, |_| field(&self.bytes, 16)),
            self.from
        )
    }
}

/// Exactly `n` datagrams arriving within [`WAIT`]; panics with what did
/// arrive otherwise.
fn recv_n(sock: &UdpSocket, n: usize) -> Vec<Got> {
    let deadline = Instant::now() + WAIT;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    while got.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "only {} of {n} datagrams within {WAIT:?}: {got:?}",
            got.len()
        );
        sock.set_read_timeout(Some(left)).unwrap();
        match sock.recv_from(&mut buf) {
            Ok((len, from)) => got.push(Got {
                bytes: buf[..len].to_vec(),
                from,
                at: Instant::now(),
            }),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("recv: {e}"),
        }
    }
    got
}

/// Panics if anything arrives within [`QUIET`].
fn assert_silent(sock: &UdpSocket, what: &str) {
    sock.set_read_timeout(Some(QUIET)).unwrap();
    let mut buf = vec![0u8; 65536];
    if let Ok((len, from)) = sock.recv_from(&mut buf) {
        panic!(
            "{what}: unexpected datagram from {from}: {:?}",
            Got {
                bytes: buf[..len].to_vec(),
                from,
                at: Instant::now()
            }
        );
    }
}

fn data_seqs(got: &[Got]) -> Vec<u64> {
    got.iter()
        .map(|g| data_seq(&g.bytes).unwrap_or_else(|| panic!("not a data datagram: {g:?}")))
        .collect()
}

fn send_data(client: &UdpSocket, seqs: impl IntoIterator<Item = u64>) {
    for s in seqs {
        client.send(&data(s)).expect("client send");
    }
}

fn server_addr(server: &UdpSocket) -> SocketAddr {
    server.local_addr().unwrap()
}

/// A relay in front of `server` applying `rules`, for at most `LIFE`.
fn relay_to(server: &UdpSocket, rules: &[(Pick, Action)]) -> Relay {
    Relay::start(server_addr(server), rules, LIFE)
}

#[test]
fn drop_of_the_nth_data_datagram() {
    let server = socket();
    let relay = relay_to(&server, &[(Pick::to_server(kind::DATA, 3), Action::Drop)]);
    let back = relay.back_addr();
    let client = client_of(&relay);
    // Seqs differ from the arrival indices, so the counts must have read
    // the seq field.
    let sent: Vec<u64> = (100..110).collect();
    send_data(&client, sent.iter().copied());
    client.send(&dgram(1, SESSION, 10, &[])).unwrap();

    let got = recv_n(&server, 10);
    let counts = relay.finish();
    assert_silent(&server, "after the drop");

    assert_eq!(counts.dropped_seqs(), &[103]);
    let expect: Vec<u64> = sent
        .iter()
        .copied()
        .filter(|s| !counts.dropped_seqs().contains(s))
        .collect();
    assert_eq!(data_seqs(&got[..9]), expect, "the rest, in order");
    assert_eq!(kind_of(&got[9].bytes), kind::END, "End after all data");
    assert!(
        got.iter().all(|g| g.from == back),
        "{got:?} not all from {back}"
    );

    assert_eq!(data_to_server(&counts), (10, 9, 1, 0, 0, 0), "{counts:?}");
    assert_eq!(counts.seen(Dir::ToServer, kind::END), 1);
    assert_eq!(counts.forwarded(Dir::ToServer, kind::END), 1);
    assert_eq!(counts.total(Dir::ToClient).seen, 0);
    assert!(counts.delayed_seqs().is_empty() && counts.repeated_seqs().is_empty());
}

#[test]
fn drop_of_the_nth_answer() {
    let server = socket();
    let relay = relay_to(
        &server,
        &[(Pick::to_client(kind::END_ACK, 1), Action::Drop)],
    );
    let client = client_of(&relay);
    for nonce in 0..3 {
        client.send(&dgram(1, SESSION, nonce, &[])).unwrap();
    }
    for end in recv_n(&server, 3) {
        assert_eq!(kind_of(&end.bytes), kind::END);
        let answer = dgram(2, SESSION, field(&end.bytes, 16), &[]);
        server.send_to(&answer, end.from).unwrap();
    }

    let got = recv_n(&client, 2);
    let counts = relay.finish();
    assert_silent(&client, "after the dropped answer");

    let nonces: Vec<u64> = got.iter().map(|g| field(&g.bytes, 16)).collect();
    assert_eq!(nonces, [0, 2], "the answer to End 1 was dropped");
    let a = counts.class(Dir::ToClient, kind::END_ACK);
    assert_eq!(
        (a.seen, a.forwarded, a.dropped, a.failed),
        (3, 2, 1, 0),
        "{counts:?}"
    );
    assert!(counts.dropped_seqs().is_empty(), "seqs are for Data only");
    // Captured on arrival, the dropped one too.
    let caught = counts.captured_kind(Dir::ToClient, kind::END_ACK);
    let caught: Vec<u64> = caught.iter().map(|b| field(b, 16)).collect();
    assert_eq!(caught, [0, 1, 2]);
    let e = counts.class(Dir::ToServer, kind::END);
    assert_eq!((e.seen, e.forwarded), (3, 3));
}

#[test]
fn delay_of_one_data_datagram() {
    let delay = Duration::from_millis(200);
    let server = socket();
    let relay = relay_to(
        &server,
        &[(Pick::to_server(kind::DATA, 2), Action::Delay(delay))],
    );
    let client = client_of(&relay);
    let t0 = Instant::now();
    send_data(&client, 0..6);

    let got = recv_n(&server, 6);
    let counts = relay.stats();
    assert_eq!(data_seqs(&got), [0, 1, 3, 4, 5, 2]);
    let (late, last_on_time) = (got[5].at, got[4].at);
    // The relay got it after t0, so it cannot have been sent before t0 + delay.
    assert!(late - t0 >= delay, "released after {:?}", late - t0);
    // Released by the timer, not only when the relay stopped.
    assert!(
        late - t0 < Duration::from_secs(1),
        "released after {:?}",
        late - t0
    );
    // The later ones were not held up behind it.
    assert!(
        late - last_on_time >= delay / 2,
        "later datagrams arrived only {:?} before the delayed one",
        late - last_on_time
    );

    assert_eq!(counts.delayed_seqs(), &[2]);
    assert_eq!(data_to_server(&counts), (6, 6, 0, 1, 0, 0), "{counts:?}");
    let end = relay.finish();
    let d = counts.class(Dir::ToServer, kind::DATA);
    assert_eq!(end.class(Dir::ToServer, kind::DATA), d);
    assert_silent(&server, "after the delayed datagram");
}

#[test]
fn repeat_after_k_later_datagrams() {
    let server = socket();
    let relay = relay_to(
        &server,
        &[(Pick::to_server(kind::DATA, 1), Action::RepeatAfter(3))],
    );
    let client = client_of(&relay);
    send_data(&client, 0..8);

    let got = recv_n(&server, 9);
    let counts = relay.finish();
    assert_silent(&server, "after the repeat");

    assert_eq!(data_seqs(&got), [0, 1, 2, 3, 4, 1, 5, 6, 7]);
    assert_eq!(got[5].bytes, data(1), "an identical copy");
    assert_eq!(counts.repeated_seqs(), &[1]);
    assert_eq!(data_to_server(&counts), (8, 9, 0, 0, 1, 0), "{counts:?}");
    let (seen, forwarded, dropped, _, repeated, _) = data_to_server(&counts);
    assert_eq!(forwarded, seen - dropped + repeated);
}

/// (seen, forwarded, dropped, delayed, repeated, failed) of the Data
/// datagrams toward the server: every count, so that a test also sees an
/// action where it should not be.
fn data_to_server(counts: &RelayCounts) -> (u64, u64, u64, u64, u64, u64) {
    let d = counts.class(Dir::ToServer, kind::DATA);
    (
        d.seen,
        d.forwarded,
        d.dropped,
        d.delayed,
        d.repeated,
        d.failed,
    )
}

#[test]
fn finish_flushes_what_is_held_back_or_owed() {
    let server = socket();
    let relay = relay_to(
        &server,
        &[
            (
                Pick::to_server(kind::DATA, 0),
                Action::Delay(Duration::from_secs(60)),
            ),
            (Pick::to_server(kind::DATA, 2), Action::RepeatAfter(5)),
        ],
    );
    let client = client_of(&relay);
    send_data(&client, 0..4);

    // 0 is held for a minute; the copy of 2 waits for 5 later datagrams,
    // and only 1 comes.
    assert_eq!(data_seqs(&recv_n(&server, 3)), [1, 2, 3]);
    assert_silent(&server, "before finish");
    let mid = relay.stats();
    assert_eq!(data_to_server(&mid), (4, 3, 0, 1, 0, 0), "{mid:?}");
    assert_eq!(mid.delayed_seqs(), &[0]);
    assert!(mid.repeated_seqs().is_empty());

    let counts = relay.finish();
    assert_eq!(
        data_seqs(&recv_n(&server, 2)),
        [0, 2],
        "held one, then the copy"
    );
    assert_silent(&server, "after finish");
    assert_eq!(data_to_server(&counts), (4, 5, 0, 1, 1, 0), "{counts:?}");
    assert_eq!(counts.repeated_seqs(), &[2]);
}

#[test]
fn max_life_ends_the_relay_and_flushes() {
    let server = socket();
    let relay = Relay::start(
        server_addr(&server),
        &[(
            Pick::to_server(kind::DATA, 0),
            Action::Delay(Duration::from_secs(60)),
        )],
        Duration::from_millis(150),
    );
    let client = client_of(&relay);
    let t0 = Instant::now();
    send_data(&client, 0..1);
    let got = recv_n(&server, 1);
    assert_eq!(data_seqs(&got), [0]);
    assert!(
        got[0].at - t0 < Duration::from_secs(1),
        "flushed at max_life"
    );
    // The thread has ended: nothing is forwarded any more.
    send_data(&client, 1..2);
    assert_silent(&server, "after max_life");
    let counts = relay.finish();
    assert_eq!(data_to_server(&counts), (1, 1, 0, 1, 0, 0), "{counts:?}");
}

#[test]
fn inject_comes_from_the_relayed_addresses() {
    let server = socket();
    let relay = relay_to(&server, &[]);
    let client = client_of(&relay);
    client.send(&dgram(3, SESSION, 7, &[0; 32])).unwrap();
    let hello = recv_n(&server, 1).remove(0);
    assert_eq!(hello.from, relay.back_addr());
    assert_eq!(relay.client(), Some(client.local_addr().unwrap()));

    // A forged copy of the captured Hello, "from the client".
    let mut forged = relay.stats().captured_kind(Dir::ToServer, kind::HELLO)[0].to_vec();
    assert_eq!(forged, hello.bytes);
    forged[16..24].copy_from_slice(&8u64.to_be_bytes());
    relay.inject_to_server(&forged);
    let got = recv_n(&server, 1).remove(0);
    assert_eq!(got.from, hello.from, "same source as the relayed client");
    assert_eq!(got.bytes, forged);

    // An answer relayed, then one forged "from the server".
    server
        .send_to(&dgram(4, SESSION, 7, &[]), hello.from)
        .unwrap();
    let fake = dgram(4, SESSION, 99, &[]);
    let answer = recv_n(&client, 1).remove(0);
    relay.inject_to_client(&fake);
    let injected = recv_n(&client, 1).remove(0);
    assert_eq!(answer.from, relay.addr);
    assert_eq!(field(&answer.bytes, 16), 7);
    assert_eq!(injected.from, relay.addr);
    assert_eq!(injected.bytes, fake);

    let counts = relay.finish();
    assert_silent(&server, "after the injection");
    assert_eq!(counts.injected(Dir::ToServer), 1);
    assert_eq!(counts.injected(Dir::ToClient), 1);
    // Injected datagrams are not seen or forwarded.
    assert_eq!(counts.total(Dir::ToServer).seen, 1);
    assert_eq!(counts.total(Dir::ToServer).forwarded, 1);
    assert_eq!(counts.seen(Dir::ToClient, kind::HELLO_ACK), 1);
    assert_eq!(counts.forwarded(Dir::ToClient, kind::HELLO_ACK), 1);
    assert_eq!(counts.captured(Dir::ToServer).len(), 1);
}

#[test]
fn captures_control_datagrams_classified_by_magic_and_kind() {
    let server = socket();
    let relay = relay_to(&server, &[]);
    let client = client_of(&relay);
    let t0 = Instant::now();
    let hello = dgram(3, SESSION, 1, &[0; 32]);
    let end = dgram(1, SESSION, 3, b"totals");
    // Another protocol version: still an End to the relay.
    let end_v9 = dgram_v(9, 1, SESSION + 1, 3, &[]);
    let untagged = b"hello world, no magic here".to_vec();
    let short = b"NSPD\x02".to_vec();
    client.send(&hello).unwrap();
    send_data(&client, 0..3);
    for d in [&end, &end_v9, &untagged, &short] {
        client.send(d).unwrap();
    }
    let got = recv_n(&server, 8);
    assert!(got[1..4].iter().all(|g| kind_of(&g.bytes) == kind::DATA));
    let ack = dgram(2, SESSION, 3, &[1; 16]);
    server.send_to(&ack, got[0].from).unwrap();
    assert_eq!(recv_n(&client, 1)[0].bytes, ack);
    let counts = relay.finish();

    let cap = counts.captured(Dir::ToServer);
    assert_eq!(
        cap,
        [hello, end, end_v9, untagged, short],
        "Data not captured"
    );
    let kinds: Vec<Option<u8>> = cap.iter().map(|b| kind_of(b)).collect();
    assert_eq!(
        kinds,
        [kind::HELLO, kind::END, kind::END, kind::OTHER, kind::OTHER]
    );
    let at = counts.captured_at(Dir::ToServer);
    assert_eq!(at.len(), cap.len());
    assert!(at[0] >= t0 && at.windows(2).all(|w| w[0] <= w[1]));
    // A test reads the session id from the End it captured.
    assert_eq!(
        field(counts.captured_kind(Dir::ToServer, kind::END)[0], 8),
        SESSION
    );
    assert_eq!(counts.seen(Dir::ToServer, kind::DATA), 3);
    assert_eq!(counts.seen(Dir::ToServer, kind::END), 2);
    assert_eq!(counts.seen(Dir::ToServer, kind::OTHER), 2);
    assert_eq!(counts.total(Dir::ToServer).forwarded, 8);
    assert_eq!(counts.captured(Dir::ToClient), [ack]);
    assert!(counts.captured_at(Dir::ToClient)[0] >= at[4]);
}

#[test]
fn capture_keeps_the_first_64_per_direction() {
    let server = socket();
    let relay = relay_to(&server, &[]);
    let client = client_of(&relay);
    let n = CAPTURE_MAX as u64 + 6;
    for i in 0..n {
        client.send(&dgram(1, SESSION, i, &[])).unwrap();
    }
    recv_n(&server, n as usize);
    let counts = relay.finish();
    let caught: Vec<u64> = counts
        .captured(Dir::ToServer)
        .iter()
        .map(|b| field(b, 16))
        .collect();
    assert_eq!(caught, (0..CAPTURE_MAX as u64).collect::<Vec<_>>());
    assert_eq!(counts.seen(Dir::ToServer, kind::END), n);
    assert_eq!(counts.forwarded(Dir::ToServer, kind::END), n);
}

#[test]
#[should_panic(expected = "two rules")]
fn two_rules_for_one_datagram_are_refused() {
    let server = socket();
    let pick = Pick::to_server(kind::DATA, 0);
    relay_to(
        &server,
        &[(pick, Action::Drop), (pick, Action::RepeatAfter(1))],
    );
}
