//! `udp_client -R` and `--bidir` through a home router: three network
//! namespaces, the client behind a router that masquerades it (nftables)
//! and drops whatever the server side starts. The server can reach the
//! client only through the mapping the client's own datagrams opened.
//!
//! The witnesses are independent of netspeed: nftables counters on the
//! router for every UDP datagram from the server to the client, and the
//! client namespace's own `/proc/net/snmp`.

mod common;

use common::impair::{delta, nft_apply, nft_counter, read_snmp};
use common::netns::{require_root_and_ip, routed, Routed};
use common::udp::{args_to, client_in, u, Server, CLIENT};
use common::{poll_every, ChildGuard};
use serde_json::Value;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Counters on the router, before the NAT's own filter: datagrams from
/// the server's port to the client, split at 300 bytes of UDP length into
/// data (the tests send 1000 or 1460-byte datagrams) and control (HelloAck
/// 64, StartAck and End 256 bytes of payload).
fn count_server_to_client(net: &Routed, port: u16) {
    let server = &net.server_ip;
    for (table, cmp) in [("toclidata", "> 300"), ("toclictl", "<= 300")] {
        nft_apply(
            &net.router,
            &format!(
                "table ip {table} {{\n  chain c {{\n    type filter hook forward priority -10; policy accept;\n    ip saddr {server} udp sport {port} udp length {cmp} counter\n  }}\n}}\n"
            ),
        );
    }
}

fn data_and_control(net: &Routed) -> (u64, u64) {
    (
        nft_counter(&net.router, "ip", "toclidata").0,
        nft_counter(&net.router, "ip", "toclictl").0,
    )
}

fn stream<'a>(report: &'a Value, direction: &str) -> &'a Value {
    report["streams"]
        .as_array()
        .unwrap_or_else(|| panic!("no streams: {report}"))
        .iter()
        .find(|s| s["direction"] == direction)
        .unwrap_or_else(|| panic!("no {direction} stream: {report}"))
}

#[test]
fn reverse_through_nat_matches_the_routers_count_and_the_kernels() {
    require_root_and_ip();
    let net = routed("rvn", 91, true);
    let server = Server::start_in(&net.server, "0.0.0.0:0", &["--recv-buffer-size", "4M"]);
    count_server_to_client(&net, server.port());
    let target = format!("{}:{}", net.server_ip, server.port());
    let before = read_snmp(&net.client, "Udp");
    // --no-gso: the router then sees (and counts) one datagram per packet.
    let report = client_in(
        &net.client,
        &args_to(&target, "-R --no-gso -b 1460 -n 20000 --rate 400Mbit"),
    );
    let after = read_snmp(&net.client, "Udp");
    let s = stream(&report, "server_to_client");
    let (sender, receiver) = (&s["sender"], &s["receiver"]);
    assert_eq!(u(sender, "packets"), 20_000, "{report}");
    assert_eq!(
        u(receiver, "packets") + u(receiver, "lost_packets"),
        20_000,
        "{report}"
    );
    let session = report["downloads"][0]["session"].as_str().expect("session");
    let done = server.find("stream_done", |v| {
        v["event"] == "stream_done" && v["session"] == session
    });
    assert_eq!(done["reason"], "answered", "{done}");
    assert_eq!(
        done["peer"]
            .as_str()
            .map(|p| p.starts_with(&format!("{}:", net.client_seen_as))),
        Some(true),
        "the server saw the client as the router: {done}"
    );
    let (data, control) = data_and_control(&net);
    assert_eq!(
        data, 20_000,
        "the router forwarded every data datagram the server says it sent"
    );
    assert_eq!(data, u(&done, "sent_packets"));
    // HelloAck, StartAck, and 1 to 6 Ends: docs/protocol.md.
    assert!(
        (3..=8).contains(&control),
        "control datagrams to the client: {control}"
    );
    // Every datagram forwarded to the client was read, dropped by its
    // socket, or met a closed port (a retried End after it left).
    let read = delta(&before, &after, "InDatagrams");
    let dropped = delta(&before, &after, "RcvbufErrors");
    let closed = delta(&before, &after, "NoPorts");
    assert_eq!(
        read + dropped + closed,
        data + control,
        "snmp {before:?} -> {after:?}"
    );
    let drops = report["downloads"][0]["received"]["socket_kernel_drops"]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(
        dropped, drops,
        "the client's kernel drops are the kernel's: {report}"
    );
    assert!(
        u(receiver, "packets") <= read,
        "the client cannot count more than the kernel delivered: {report}"
    );
    server.stop();
}

#[test]
fn bidir_and_the_default_send_path_work_through_nat() {
    require_root_and_ip();
    let net = routed("bdn", 92, true);
    let server = Server::start_in(&net.server, "0.0.0.0:0", &["--recv-buffer-size", "4M"]);
    let target = format!("{}:{}", net.server_ip, server.port());
    for rest in [
        "-R -b 1400 -t 20M --rate 800Mbit",
        "--bidir -b 1000 -n 10000 --rate 300Mbit",
    ] {
        let report = client_in(&net.client, &args_to(&target, rest));
        for st in report["streams"].as_array().expect("streams") {
            let sent = u(&st["sender"], "packets");
            assert!(sent > 0, "{rest}: {report}");
            assert_eq!(
                u(&st["receiver"], "packets") + u(&st["receiver"], "lost_packets"),
                sent,
                "{rest}: received + lost = sent: {report}"
            );
        }
    }
    server.stop();
}

#[test]
fn a_killed_client_stops_the_stream_within_a_second() {
    require_root_and_ip();
    let net = routed("kln", 93, true);
    let server = Server::start_in(&net.server, "0.0.0.0:0", &[]);
    count_server_to_client(&net, server.port());
    let target = format!("{}:{}", net.server_ip, server.port());
    let mut cmd = net.client.cmd(CLIENT);
    cmd.args(args_to(
        &target,
        "-R --no-gso -b 1000 --rate 40Mbit --duration 20s -q",
    ))
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    let client = ChildGuard::spawn(&mut cmd, "udp_client -R");
    assert!(
        poll_every(Duration::from_millis(20), Duration::from_secs(10), || {
            data_and_control(&net).0 > 1000
        }),
        "the stream never started"
    );
    client.signal(libc::SIGKILL);
    let killed = Instant::now();
    let mut last = data_and_control(&net).0;
    let mut last_change = killed;
    while killed.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
        let now = data_and_control(&net).0;
        if now != last {
            last = now;
            last_change = Instant::now();
        }
    }
    let ran_on = last_change - killed;
    assert!(
        ran_on <= Duration::from_secs(1),
        "the server kept sending {ran_on:?} after its client died"
    );
    let done = server.find("stream_done", |v| v["event"] == "stream_done");
    assert_eq!(done["reason"], "silent", "{done}");
    assert_eq!(u(&done, "sent_packets"), last, "{done}");
    server.stop();
}
