//! A udp_server left on a public address, tried as an attacker would:
//! four network namespaces, a client behind a home router that
//! masquerades it (nftables), the server, and an attacker on the server's
//! side that forges any source address with a raw socket, the router's
//! public address (the client as the server sees it) among them.
//!
//! Every flood is bounded in rate and time (at most 30 s). The witnesses
//! are the real client's own reports, the server's events, and the
//! server namespace's kernel counters.

mod common;

use common::forge::{flood, forged, Random};
use common::impair::{delta, spawn_in, tbf_alone};
use common::netns::{require_root_and_ip, routed, veth_pair, Netns, Routed};
use common::udp::{args_to, client_outcome_in, stream, u, Server};
use netspeed::wire;
use serde_json::Value;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The client behind its NAT, the server, and an attacker wired straight
/// to the server's namespace (its forged sources reach the server, its
/// own address is 10.N.3.2).
struct Public {
    net: Routed,
    attacker: Netns,
}

fn public(tag: &str, n: u8) -> Public {
    require_root_and_ip();
    let net = routed(tag, n, true);
    let attacker = Netns::new(&format!("{tag}atk"));
    veth_pair(
        &net.server,
        &format!("10.{n}.3.1/24"),
        &attacker,
        &format!("10.{n}.3.2/24"),
    );
    attacker.ip(&["route", "add", "default", "via", &format!("10.{n}.3.1")]);
    for setting in [
        "net.ipv4.conf.all.rp_filter=0",
        "net.ipv4.conf.default.rp_filter=0",
    ] {
        net.server.run(&["sysctl", "-q", "-w", setting]);
    }
    Public { net, attacker }
}

impl Public {
    fn server_addr(&self, server: &Server) -> SocketAddrV4 {
        SocketAddrV4::new(self.net.server_ip.parse().unwrap(), server.port())
    }

    /// The client as the server sees it: the router's public address.
    fn client_public_ip(&self) -> Ipv4Addr {
        self.net.client_seen_as.parse().unwrap()
    }
}

/// A client run from behind the NAT: its outcome, which must be a
/// success with the server's answer.
fn must_succeed(p: &Public, server: &Server, rest: &str) -> Value {
    let target = format!("{}:{}", p.net.server_ip, server.port());
    let out = client_outcome_in(&p.net.client, &args_to(&target, rest));
    assert_eq!(out.code, Some(0), "{rest}: {}", out.stderr);
    out.report.expect("a report")
}

/// Every `total` event's figure `key`, summed (the span counts).
fn total_of(events: &[Value], key: &str) -> u64 {
    events
        .iter()
        .filter(|e| e["event"] == "total")
        .map(|e| e[key].as_u64().unwrap_or(0))
        .sum()
}

fn hello(session: u64, nonce: u64, cookie: u64) -> [u8; wire::HELLO_LEN] {
    wire::encode_hello(&wire::Hello {
        header: wire::Header {
            session,
            ..Default::default()
        },
        nonce,
        cookie,
        ..Default::default()
    })
}

#[test]
fn forged_hellos_from_anywhere_and_from_the_clients_own_address_lock_no_one_out() {
    let p = public("pbh", 101);
    let server = Server::start_args_in(
        &p.net.server,
        &[
            "--listen",
            "0.0.0.0:0",
            "--recv-buffer-size",
            "4M",
            "--interval",
            "1s",
        ],
    );
    let dst = p.server_addr(&server);
    let client_ip = p.client_public_ip();
    let done = Arc::new(AtomicBool::new(false));
    let stop = Arc::clone(&done);
    // 10,000 a second from random addresses and 2,500 from the client's
    // own public address, from random ports: 12,500 Hellos a second.
    let attack = spawn_in(&p.attacker, move || {
        let mut rng = Random::new(0x5eed);
        flood(
            dst,
            12_500,
            Duration::from_secs(30),
            &|| stop.load(Ordering::Relaxed),
            |i| {
                let ip = if i % 5 == 0 { client_ip } else { rng.addr() };
                let src = SocketAddrV4::new(ip, rng.port());
                forged(src, dst, &hello(rng.next(), i, 0))
            },
        )
    });
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let upload = must_succeed(&p, &server, "-b 1400 -t 5M --rate 50M");
    let reverse = must_succeed(&p, &server, "-R -b 1400 -t 5M --rate 50M");
    let bidir = must_succeed(&p, &server, "--bidir -b 1400 -t 5M --rate 50M");
    let during = started.elapsed();
    done.store(true, Ordering::Relaxed);
    let sent = attack.join().expect("the flood");
    assert!(
        sent.seconds >= during.as_secs_f64(),
        "the flood ran through every client run: {sent:?} for {during:?}"
    );
    for (report, direction) in [
        (&upload, "client_to_server"),
        (&reverse, "server_to_client"),
        (&bidir, "client_to_server"),
        (&bidir, "server_to_client"),
    ] {
        let s = stream(report, direction);
        assert_eq!(
            u(&s["receiver"], "packets") + u(&s["receiver"], "lost_packets"),
            u(&s["sender"], "packets"),
            "{direction}: exact: {report}"
        );
    }
    let events = server.stop();
    let down = events.last().unwrap();
    // The Hellos were answered or refused by the budgets, and none kept
    // anything: the only peers ever made are the client's own.
    assert!(
        u(down, "hellos") > sent.packets / 2,
        "the flood reached the server: {down}"
    );
    assert!(u(down, "peers") <= 8, "no forged Hello made a peer: {down}");
    assert_eq!(
        total_of(&events, "hellos"),
        u(down, "hellos"),
        "the totals count them per interval"
    );
}

#[test]
fn forged_probes_from_the_clients_own_address_take_none_of_its_answers() {
    let p = public("pbp", 102);
    let server = Server::start_in(&p.net.server, "0.0.0.0:0", &["--recv-buffer-size", "4M"]);
    let dst = p.server_addr(&server);
    let client_ip = p.client_public_ip();
    let done = Arc::new(AtomicBool::new(false));
    let stop = Arc::clone(&done);
    let attack = spawn_in(&p.attacker, move || {
        let mut rng = Random::new(0xbeef);
        flood(
            dst,
            10_000,
            Duration::from_secs(15),
            &|| stop.load(Ordering::Relaxed),
            |i| {
                let probe = wire::encode_probe(&wire::Probe {
                    header: wire::Header {
                        session: rng.next(),
                        seq: i,
                        send_time_ns: 0,
                    },
                    cookie: rng.next(),
                });
                forged(SocketAddrV4::new(client_ip, rng.port()), dst, &probe)
            },
        )
    });
    std::thread::sleep(Duration::from_millis(300));
    let report = must_succeed(&p, &server, "-R -b 1400 --duration 8s --rate 20M");
    done.store(true, Ordering::Relaxed);
    let sent = attack.join().expect("the flood");
    let latency = &stream(&report, "server_to_client")["latency"];
    let (probes, lost) = (u(latency, "probes_sent"), u(latency, "probes_lost"));
    assert!(probes >= 100, "{latency}");
    assert!(
        lost * 10 <= probes,
        "{lost} of {probes} probes lost under {} forged probes: {latency}",
        sent.packets
    );
    let down = server.stop();
    let down = down.last().unwrap();
    assert!(u(down, "probes_unproven") > sent.packets / 2, "{down}");
}

#[test]
fn forged_ends_are_counted_not_logged_one_by_one() {
    let p = public("pbe", 103);
    let server = Server::start_args_in(
        &p.net.server,
        &[
            "--listen",
            "0.0.0.0:0",
            "--recv-buffer-size",
            "4M",
            "--interval",
            "1s",
        ],
    );
    let dst = p.server_addr(&server);
    let before = p.net.server.read_snmp_udp();
    let sent = spawn_in(&p.attacker, move || {
        let mut rng = Random::new(0xe0d);
        flood(dst, 3_000, Duration::from_secs(2), &|| false, |i| {
            let end = wire::encode_end(&wire::End {
                header: wire::Header {
                    session: rng.next(),
                    seq: 100,
                    send_time_ns: 0,
                },
                sent_packets: 100,
                sent_bytes: 100_000,
                nonce: i,
                ..Default::default()
            });
            forged(SocketAddrV4::new(rng.addr(), rng.port()), dst, &end)
        })
    })
    .join()
    .expect("the flood");
    assert_eq!(sent.packets, 6_000);
    // Two interval lines later, the totals have spoken.
    std::thread::sleep(Duration::from_millis(2500));
    let after = p.net.server.read_snmp_udp();
    let events = server.stop();
    // The whole log, from `listening` to `shutdown`, one line an event.
    let log: u64 = events.iter().map(|e| e.to_string().len() as u64 + 1).sum();
    assert!(
        log < sent.bytes,
        "the log holds {log} bytes for {} bytes of forged Ends",
        sent.bytes
    );
    let down = events.last().unwrap();
    let read = delta(&before, &after, "InDatagrams");
    assert_eq!(
        u(down, "ends_unknown"),
        read,
        "every End read was counted: {down}"
    );
    assert_eq!(total_of(&events, "ends_unknown"), read, "per interval too");
    assert_eq!(u(down, "peers"), 0, "and none kept: {down}");
    assert!(
        !events.iter().any(|e| e["event"] == "peer_done"),
        "no End got a summary of its own"
    );
}

/// Opens `count` reverse streams from one socket (a Hello, its cookie, a
/// Start), and returns each one's StartAck.
fn starts(
    socket: &UdpSocket,
    dst: SocketAddrV4,
    first_session: u64,
    count: u64,
) -> Vec<wire::StartAck> {
    let mut acks = Vec::new();
    let mut buf = [0u8; 512];
    for session in first_session..first_session + count {
        socket.send_to(&hello(session, 1, 0), dst).unwrap();
        let n = socket.recv(&mut buf).expect("a HelloAck");
        let Ok(wire::Message::HelloAck(h)) = wire::decode(&buf[..n]) else {
            panic!("not a HelloAck")
        };
        let start = wire::encode_start(&wire::Start {
            header: wire::Header {
                session,
                ..Default::default()
            },
            nonce: 2,
            cookie: h.cookie,
            direction: wire::Direction::ServerToClient,
            request: wire::StreamRequest {
                buffer_size: 125,
                amount: wire::Amount::Nanos(40_000_000_000),
                rate_bps: 1_000,
                flags: 0,
                batch: 1,
            },
            ..Default::default()
        });
        socket.send_to(&start, dst).unwrap();
        let n = socket.recv(&mut buf).expect("a StartAck");
        let Ok(wire::Message::StartAck(ack)) = wire::decode(&buf[..n]) else {
            panic!("not a StartAck")
        };
        acks.push(ack);
    }
    acks
}

#[test]
fn one_host_holds_no_more_than_its_share_of_the_reverse_streams() {
    let p = public("pbr", 104);
    // Eight streams in all: a source holds two at most.
    let server = Server::start_in(
        &p.net.server,
        "0.0.0.0:0",
        &["--recv-buffer-size", "4M", "--max-reverse-streams", "8"],
    );
    let dst = p.server_addr(&server);
    let done = Arc::new(AtomicBool::new(false));
    let stop = Arc::clone(&done);
    // The attacker's own address: it receives the StartAcks, confirms
    // what it is granted with Feedback at 1 kbit/s, and keeps asking for
    // more from another socket without ever confirming those.
    let attack = spawn_in(&p.attacker, move || {
        let held = UdpSocket::bind("10.104.3.2:0").unwrap();
        held.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let acks = starts(&held, dst, 0xa000, 8);
        let granted: Vec<(u64, u64)> = acks
            .iter()
            .filter(|a| a.status == wire::START_OK)
            .map(|a| (a.session, a.stream_nonce))
            .collect();
        let refused = acks
            .iter()
            .filter(|a| a.status == wire::START_SOURCE_SHARE)
            .count();
        let asker = UdpSocket::bind("10.104.3.2:0").unwrap();
        asker
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut next = 0xb000;
        let (mut asked, mut granted_unconfirmed) = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            for &(session, nonce) in &granted {
                let fb = wire::encode_feedback(&wire::Feedback {
                    header: wire::Header {
                        session,
                        ..Default::default()
                    },
                    stream_nonce: nonce,
                    ..Default::default()
                });
                held.send_to(&fb, dst).unwrap();
            }
            for ack in starts(&asker, dst, next, 1) {
                asked += 1;
                granted_unconfirmed += u64::from(ack.status == wire::START_OK);
            }
            next += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        (granted.len(), refused, asked, granted_unconfirmed)
    });
    std::thread::sleep(Duration::from_secs(2));
    let reverse = must_succeed(&p, &server, "-R -b 1400 -t 5M --rate 50M");
    let bidir = must_succeed(&p, &server, "--bidir -b 1400 -t 5M --rate 50M");
    done.store(true, Ordering::Relaxed);
    let (granted, refused, asked, unconfirmed) = attack.join().expect("the attacker");
    assert_eq!(
        (granted, refused),
        (2, 6),
        "a source's share is two of eight"
    );
    assert!(asked > 10, "the attacker kept asking ({asked})");
    assert_eq!(
        unconfirmed, 0,
        "its share was taken: every further Start was refused"
    );
    for report in [&reverse, &bidir] {
        let s = stream(report, "server_to_client");
        assert_eq!(
            u(&s["receiver"], "packets") + u(&s["receiver"], "lost_packets"),
            u(&s["sender"], "packets"),
            "{report}"
        );
    }
    server.stop();
}

#[test]
fn a_stream_its_client_cannot_take_in_is_slowed_within_two_seconds() {
    require_root_and_ip();
    let net = routed("pbb", 105, true);
    // The client's link takes 30 Mbit/s; the stream asks for 90.
    tbf_alone(&net.router, &net.client_link.1, "30mbit", "32kb", "64kb");
    let server = Server::start_args_in(
        &net.server,
        &[
            "--listen",
            "0.0.0.0:0",
            "--recv-buffer-size",
            "4M",
            "--interval",
            "250ms",
        ],
    );
    let target = format!("{}:{}", net.server_ip, server.port());
    let out = client_outcome_in(
        &net.client,
        &args_to(&target, "-R -b 1400 --duration 5s --rate 90M --no-gso"),
    );
    let report = out.report.expect("a report");
    let s = stream(&report, "server_to_client");
    let verdict = s["limited_by"]["text"].as_str().unwrap_or_default();
    assert!(verdict.contains("circuit breaker"), "{verdict}");
    let session = report["downloads"][0]["session"].as_str().expect("session");
    let breaker = &report["downloads"][0]["server_breaker"];
    assert!(u(breaker, "backoffs") >= 1, "{report}");
    let events = server.stop();
    let done = events
        .iter()
        .find(|e| e["event"] == "stream_done" && e["session"] == session)
        .expect("the stream's report");
    assert!(u(&done["breaker"], "backoffs") >= 1, "{done}");
    // The server's own interval lines: within 2 s of the stream's start
    // it sent at no more than 60 % of the asked rate.
    let slowed = events
        .iter()
        .filter(|e| e["event"] == "interval" && e["session"] == session)
        .find(|e| e["gbps"].as_f64().unwrap_or(1.0) <= 0.054)
        .unwrap_or_else(|| panic!("never slowed: {events:?}"));
    assert!(
        slowed["end"].as_f64().unwrap_or(99.0) <= 2.25,
        "slowed only at {slowed}"
    );
}

#[test]
fn a_flood_of_other_versions_from_forged_sources_gets_no_more_than_each_sources_answers() {
    let p = public("pbv", 106);
    let server = Server::start_in(&p.net.server, "0.0.0.0:0", &["--recv-buffer-size", "4M"]);
    let dst = p.server_addr(&server);
    let victim = SocketAddrV4::new(p.client_public_ip(), 40_000);
    let before = p.net.server.read_snmp_udp();
    // 4,000 old Hellos a second for 2 s, all "from" one address and port.
    let sent = spawn_in(&p.attacker, move || {
        flood(dst, 4_000, Duration::from_secs(2), &|| false, |i| {
            let mut d = [0u8; 64];
            d[..4].copy_from_slice(&wire::MAGIC);
            d[4] = 3;
            d[5] = 3;
            d[8..16].copy_from_slice(&i.to_be_bytes());
            forged(victim, dst, &d)
        })
    })
    .join()
    .expect("the flood");
    let after = p.net.server.read_snmp_udp();
    let events = server.stop();
    let answers = delta(&before, &after, "OutDatagrams");
    // The source's budget, in each second the flood touched.
    let windows = sent.seconds.ceil() as u64 + 1;
    assert!(
        answers <= u64::from(netspeed::meter::account::ANSWERS_PER_SOURCE) * windows,
        "{answers} answers to {} datagrams from one source over {:.1} s",
        sent.packets,
        sent.seconds
    );
    assert!(answers > 0, "some were answered");
    let down = events.last().unwrap();
    assert_eq!(
        u(down, "wrong_version"),
        delta(&before, &after, "InDatagrams")
    );
}
