//! `udp_server --one-off` (iperf3 `-1`): the real binaries on ephemeral
//! ports. The server serves the first session that ends with an End, prints
//! its summary and a shutdown event, and exits 0 by itself; foreign
//! datagrams and idle sources do not end it.

mod common;

use common::udp::{assert_exact, u, Server, WAIT};
use serde_json::Value;
use std::net::UdpSocket;
use std::time::Duration;

/// Reads the server's remaining lines until it closes stdout, then waits
/// (bounded) for it to exit; returns its exit code and every event.
fn wait_for_exit(mut server: Server) -> (Option<i32>, Vec<Value>) {
    for line in server.lines.drain(WAIT) {
        let v = serde_json::from_str::<Value>(&line)
            .unwrap_or_else(|e| panic!("server wrote a line that is not JSON ({e}): {line}"));
        server.events.borrow_mut().push(v);
    }
    let status = server.guard.wait_timeout(WAIT).unwrap_or_else(|| {
        panic!(
            "udp_server --one-off still running {WAIT:?} after its session; said:\n{}",
            server.lines.transcript()
        )
    });
    let events = server.events.borrow().clone();
    (status.code(), events)
}

fn peer_dones<'a>(events: &'a [Value], session: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|v| v["event"] == "peer_done" && v["session"] == session)
        .collect()
}

/// One exact session, then the server's own exit.
fn run_one_session(server: Server) -> (Value, Vec<Value>) {
    let report = server.client("-n 1000 --rate 100Mbit");
    assert_eq!(u(&report, "sent_packets"), 1000);
    let c = report["clients"][0].clone();
    let session = c["session"].as_str().expect("session").to_string();
    let (code, events) = wait_for_exit(server);
    assert_eq!(code, Some(0), "--one-off exits 0: {events:?}");
    let dones = peer_dones(&events, &session);
    assert_eq!(dones.len(), 1, "one peer_done for {session}: {events:?}");
    assert_exact(&report, &c, dones[0]);
    assert!(
        events.last().is_some_and(|v| v["event"] == "shutdown"),
        "the server finished with a shutdown event: {events:?}"
    );
    (report, events)
}

#[test]
fn one_off_serves_one_session_and_exits_zero() {
    let server = Server::start("127.0.0.1:0", &["--one-off"]);
    let (_, events) = run_one_session(server);
    let shutdowns = events.iter().filter(|v| v["event"] == "shutdown").count();
    assert_eq!(shutdowns, 1, "{events:?}");
}

#[test]
fn foreign_datagrams_and_idle_sources_do_not_end_a_one_off_server() {
    let mut server = Server::start("127.0.0.1:0", &["-1", "--idle-timeout", "200ms"]);
    let foreign = UdpSocket::bind("127.0.0.1:0").expect("bind a foreign sender");
    let from = foreign.local_addr().expect("local addr").to_string();
    // Not netspeed's format: a short one, and longer ones of another shape.
    foreign.send_to(b"hello", &server.addr).expect("send");
    for i in 0..5u8 {
        foreign.send_to(&[i; 200], &server.addr).expect("send");
    }
    // The foreign source goes idle and is summarised; the server stays.
    let done = server.find("peer_done for the foreign sender", |v| {
        v["event"] == "peer_done" && v["peer"] == from.as_str()
    });
    assert_eq!(done["tagged"], false, "{done}");
    assert_eq!(done["reason"], "idle", "{done}");
    assert_eq!(u(&done, "packets"), 6, "{done}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        server.guard.wait_timeout(Duration::ZERO).is_none(),
        "--one-off stopped on foreign traffic:\n{}",
        server.lines.transcript()
    );
    let (_, events) = run_one_session(server);
    let session_dones = events
        .iter()
        .filter(|v| v["event"] == "peer_done" && v["tagged"] == true)
        .count();
    assert_eq!(session_dones, 1, "{events:?}");
}
