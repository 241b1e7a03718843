//! Two hosts on different releases: a datagram of another wire version
//! gets an answer that lists the versions the server speaks (never larger
//! than the datagram), a client that hears one says which versions each
//! side speaks and exits 1, and the server logs one line per source and
//! interval.

mod common;

use common::udp::{client_outcome, Server};
use netspeed::wire;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

/// A datagram as release `version` would send its Hello: netspeed's
/// magic, the version byte, kind 3, a session, 64 bytes.
fn old_hello(version: u8, session: u64) -> [u8; 64] {
    let mut d = [0u8; 64];
    d[..4].copy_from_slice(&wire::MAGIC);
    d[4] = version;
    d[5] = 3;
    d[8..16].copy_from_slice(&session.to_be_bytes());
    d
}

#[test]
fn other_versions_are_answered_with_the_versions_spoken_no_larger_than_they_were() {
    let server = Server::start_args(&["--listen", "127.0.0.1:0", "--interval", "200ms"]);
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    for (version, session) in [(2u8, 0x0202u64), (3, 0x0303), (250, 0xfafa)] {
        let asked = old_hello(version, session);
        s.send_to(&asked, &server.addr).unwrap();
        let mut buf = [0u8; 2048];
        let n = s.recv(&mut buf).expect("an answer");
        assert!(n <= asked.len(), "{n} bytes for {}", asked.len());
        let Ok(wire::Message::Versions(v)) = wire::decode(&buf[..n]) else {
            panic!("not a version negotiation: {:?}", &buf[..n])
        };
        assert_eq!((v.session, v.refused), (session, version));
        assert_eq!(v.spoken(), &wire::VERSIONS_SPOKEN[..]);
    }
    // Many from one source: one log line per source and interval, never
    // one per datagram, and never a peer.
    for i in 0..500 {
        s.send_to(&old_hello(2, i), &server.addr).unwrap();
    }
    std::thread::sleep(Duration::from_millis(600));
    let events = server.stop();
    let lines: Vec<_> = events
        .iter()
        .filter(|e| e["event"] == "wrong_version")
        .collect();
    assert!(
        !lines.is_empty() && lines.len() <= 6,
        "{} wrong_version lines for 503 datagrams: {lines:?}",
        lines.len()
    );
    let seen: u64 = lines.iter().map(|e| e["datagrams"].as_u64().unwrap()).sum();
    assert_eq!(seen, 503, "{lines:?}");
    assert_eq!(lines[0]["versions"], serde_json::json!([2, 3, 250]));
    let down = events.last().unwrap();
    assert_eq!(down["wrong_version"], 503, "{down}");
    assert_eq!(down["peers"], 0, "no old Hello made a peer: {down}");
}

#[test]
fn a_client_facing_another_version_says_so_and_exits_1() {
    // A server of release 3, as this one answers release 3: the versions
    // it speaks.
    let old = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = old.local_addr().unwrap().to_string();
    let answering = std::thread::spawn(move || {
        old.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut answered = 0;
        let mut buf = [0u8; 2048];
        while Instant::now() < deadline && answered < 500 {
            let Ok((n, from)) = old.recv_from(&mut buf) else {
                continue;
            };
            if n < 17 || buf[..4] != wire::MAGIC {
                continue;
            }
            let mut answer = vec![0u8; 17];
            answer[..4].copy_from_slice(&wire::MAGIC);
            answer[4] = wire::NEGOTIATION;
            answer[5] = buf[4];
            answer[6] = 1;
            answer[8..16].copy_from_slice(&buf[8..16]);
            answer[16] = 3;
            old.send_to(&answer, from).unwrap();
            answered += 1;
        }
    });
    let out = client_outcome(&["-s", &addr, "-t", "1M"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "speaks wire version 3; this udp_client speaks {}",
            wire::VERSION
        )),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("--version"), "{}", out.stderr);
    drop(answering);
}
