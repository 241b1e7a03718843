//! `udp_client -R` and `--bidir` through a home router: three network
//! namespaces, the client behind a router that masquerades it (nftables)
//! and drops whatever the server side starts. The server can reach the
//! client only through the mapping the client's own datagrams opened.
//!
//! The witnesses are independent of netspeed: nftables counters on the
//! router for every UDP datagram from the server to the client, and the
//! client namespace's own `/proc/net/snmp`. A fourth namespace forges the
//! client's address with a raw socket: the server must never send it a
//! stream.

mod common;

use common::forge::{forged, send_raw};
use common::impair::{delta, nft_apply, nft_counter, read_snmp};
use common::netns::{require_root_and_ip, routed, Routed};
use common::udp::{args_to, client_in, stream, u, Server, CLIENT};
use common::{poll_every, ChildGuard};
use netspeed::wire;
use serde_json::Value;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Counters on the router, before the NAT's own filter: datagrams from
/// the server's port to the client, split at 600 bytes of UDP length into
/// data (the tests send 1000 or 1460-byte datagrams) and control (HelloAck
/// 64, ProbeAck 64, StartAck 256 and End 320 bytes of payload).
fn count_server_to_client(net: &Routed, port: u16) {
    let server = &net.server_ip;
    for (table, cmp) in [("toclidata", "> 600"), ("toclictl", "<= 600")] {
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
    // HelloAck, StartAck, 1 to 6 Ends (docs/protocol.md), and the answers
    // to the round-trip probes: one per probe echoed, and 1 to 3 that only
    // brought the cookie.
    let latency = &s["latency"];
    let echoed = u(latency, "probes_sent") - u(latency, "probes_lost");
    assert!(
        echoed > 0,
        "probes were answered through the NAT: {latency}"
    );
    assert!(
        (4..=11).contains(&(control - echoed)),
        "control datagrams to the client: {control}, {echoed} of them echoed probes"
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
    let drops = report["downloads"][0]["received"]["socket_wide_kernel_drops"]
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

fn start_bytes(session: u64, cookie: u64, nonce: u64) -> Vec<u8> {
    wire::encode_start(&wire::Start {
        header: wire::Header {
            session,
            ..Default::default()
        },
        nonce,
        cookie,
        direction: wire::Direction::ServerToClient,
        request: wire::StreamRequest {
            buffer_size: 1000,
            amount: wire::Amount::Bytes(100_000_000),
            rate_bps: 0,
            flags: 0,
            batch: 32,
        },
        answer_wait_ns: 0,
        run: wire::Run::default(),
        tag: [0; wire::TAG_LEN],
    })
    .to_vec()
}

#[test]
fn a_spoofer_can_never_aim_a_stream_at_its_victim() {
    require_root_and_ip();
    // The victim is the client namespace; the attacker hangs off the router
    // on a third link, and the router does not filter forged sources.
    let net = routed("spf", 94, false);
    let attacker = common::netns::Netns::new("spfatk");
    common::netns::veth_pair(&net.router, "10.94.3.1/24", &attacker, "10.94.3.2/24");
    attacker.ip(&["route", "add", "default", "via", "10.94.3.1"]);
    let server = Server::start_in(&net.server, "0.0.0.0:0", &[]);
    let server_addr = SocketAddrV4::new(net.server_ip.parse().unwrap(), server.port());
    let victim_ip: Ipv4Addr = net.client_ip.parse().unwrap();
    // What reaches the victim from the server: all of it, and Data
    // (magic NSPD, kind 0) alone. And what the attacker sends.
    let sip = &net.server_ip;
    let vip = &net.client_ip;
    for (table, rule) in [
        (
            "tovictim",
            format!(
                "ip saddr {sip} ip daddr {vip} udp sport {} counter",
                server.port()
            ),
        ),
        (
            "datatovictim",
            format!("ip saddr {sip} ip daddr {vip} @th,64,32 0x4e535044 @th,104,8 0 counter"),
        ),
        (
            "fromattacker",
            format!(
                "ip saddr {vip} ip daddr {sip} iifname != \"{}\" counter",
                net.client_link.1
            ),
        ),
    ] {
        nft_apply(
            &net.router,
            &format!(
                "table ip {table} {{\n  chain c {{\n    type filter hook forward priority -10; policy accept;\n    {rule}\n  }}\n}}\n"
            ),
        );
    }

    // The victim's real opening, as an attacker on its link would capture
    // it: a Hello, its HelloAck's cookie, and a Start echoing it. Its
    // socket then closes without a Feedback.
    let victim_port = 40_000;
    let (hello, start) = common::impair::spawn_in(&net.client, move || {
        let socket = UdpSocket::bind((victim_ip, victim_port)).expect("victim socket");
        socket
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let session = 0x5106_0000_0000_0001;
        let hello = wire::encode_hello(&wire::Hello {
            header: wire::Header {
                session,
                ..Default::default()
            },
            nonce: 7,
            ..Default::default()
        })
        .to_vec();
        socket.send_to(&hello, server_addr).unwrap();
        let mut buf = [0u8; 512];
        let n = socket.recv(&mut buf).expect("a HelloAck");
        let Ok(wire::Message::HelloAck(ack)) = wire::decode(&buf[..n]) else {
            panic!("not a HelloAck")
        };
        assert_ne!(ack.cookie, 0);
        let start = start_bytes(session, ack.cookie, 8);
        socket.send_to(&start, server_addr).unwrap();
        let n = socket.recv(&mut buf).expect("a StartAck");
        let Ok(wire::Message::StartAck(ack)) = wire::decode(&buf[..n]) else {
            panic!("not a StartAck")
        };
        assert_eq!(ack.status, wire::START_OK);
        (hello, start)
    })
    .join()
    .expect("the victim's opening");
    let before_attack = nft_counter(&net.router, "ip", "tovictim");

    // The attack, every datagram with the victim's address: Hellos and
    // cookie-less Starts with fresh sessions, the captured opening
    // replayed, and Feedback guessing the stream nonce.
    let victim = SocketAddrV4::new(victim_ip, victim_port);
    let mut datagrams = Vec::new();
    for i in 0..100u64 {
        let hello = wire::encode_hello(&wire::Hello {
            header: wire::Header {
                session: 0x4000 + i,
                ..Default::default()
            },
            nonce: i,
            ..Default::default()
        });
        datagrams.push(forged(victim, server_addr, &hello));
        datagrams.push(forged(victim, server_addr, &start_bytes(0x8000 + i, 0, i)));
        datagrams.push(forged(
            victim,
            server_addr,
            &start_bytes(0x8000 + i, i * 7919 + 1, i),
        ));
        let fb = wire::encode_feedback(&wire::Feedback {
            header: wire::Header {
                session: 0x5106_0000_0000_0001,
                ..Default::default()
            },
            stream_nonce: i * 104_729 + 3,
            ..Default::default()
        });
        datagrams.push(forged(victim, server_addr, &fb));
    }
    datagrams.push(forged(victim, server_addr, &hello));
    datagrams.push(forged(victim, server_addr, &start));
    let attacker_bytes =
        common::impair::spawn_in(&attacker, move || send_raw(server_addr, &datagrams, 5))
            .join()
            .expect("the attack");
    // Past the server's wait for a first Feedback (1 s): any stream that
    // could start would have.
    std::thread::sleep(Duration::from_millis(2500));
    let sent_by_attacker = nft_counter(&net.router, "ip", "fromattacker");
    let to_victim = nft_counter(&net.router, "ip", "tovictim");
    let data_to_victim = nft_counter(&net.router, "ip", "datatovictim");
    assert_eq!(
        sent_by_attacker.1, attacker_bytes,
        "the router saw the whole attack"
    );
    let answered = to_victim.1 - before_attack.1;
    assert!(
        answered > 0,
        "the server did answer the forged requests (to the victim)"
    );
    assert!(
        answered <= attacker_bytes,
        "the victim received {answered} bytes for the attacker's {attacker_bytes}"
    );
    assert_eq!(
        data_to_victim.0, 0,
        "not one Data datagram reached the victim"
    );
    let done = server.find("stream_done", |v| v["event"] == "stream_done");
    assert_eq!(done["reason"], "never_confirmed", "{done}");
    assert_eq!(u(&done, "sent_packets"), 0, "{done}");
    server.stop();
}

/// Issue 41: `--bidir` through the NAT with no shaper. In each direction
/// the summary's queue-delay p50 lies within the p50s of the interval
/// lines that showed the same datagrams (the server's for the upload,
/// this client's for the reverse stream), and the queue stayed short.
#[test]
fn bidir_queue_delay_summaries_agree_with_their_intervals_through_nat() {
    require_root_and_ip();
    let net = routed("qbn", 85, true);
    // Interval lines every second (the test servers' default is none).
    let server = Server::start_args_in(
        &net.server,
        &["--listen", "0.0.0.0:0", "--recv-buffer-size", "4M"],
    );
    let target = format!("{}:{}", net.server_ip, server.port());
    let out = common::run_bounded(
        net.client.cmd(CLIENT).args(args_to(
            &target,
            "--bidir -b 1400 --rate 200M --duration 4s --json-stream",
        )),
        Duration::from_secs(60),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = common::ndjson(&String::from_utf8_lossy(&out.stdout));
    let end = lines
        .iter()
        .find(|v| v["event"] == "end")
        .unwrap_or_else(|| panic!("no end event: {lines:?}"));
    let events = server.stop();
    let upload_intervals: Vec<&Value> = events
        .iter()
        .filter(|v| v["event"] == "interval" && v["direction"] != "server_to_client")
        .filter(|v| v.get("queue_delay_ms").is_some())
        .collect();
    let reverse_intervals: Vec<&Value> = lines
        .iter()
        .filter(|v| v["event"] == "interval" && v["direction"] == "server_to_client")
        .filter(|v| v.get("queue_delay_ms").is_some())
        .collect();
    for (direction, intervals) in [
        ("client_to_server", upload_intervals),
        ("server_to_client", reverse_intervals),
    ] {
        assert!(intervals.len() >= 3, "{direction}: {intervals:?}");
        let p50s: Vec<f64> = intervals
            .iter()
            .map(|v| v["queue_delay_ms"]["p50"].as_f64().expect("p50"))
            .collect();
        let lowest = p50s.iter().copied().fold(f64::MAX, f64::min);
        let highest = p50s.iter().copied().fold(0.0, f64::max);
        let st = stream(end, direction);
        let summary = st["latency"]["queue_delay_ms"]["p50"]
            .as_f64()
            .unwrap_or_else(|| panic!("{direction}: no queue delay: {st}"));
        let slack = 0.002 + 0.01 * highest;
        eprintln!("FIGURE qbn {direction}: interval p50s {p50s:?}, summary p50 {summary}");
        assert!(
            summary >= lowest - slack && summary <= highest + slack,
            "{direction}: summary p50 {summary} ms outside its intervals' {p50s:?}: {st}"
        );
        assert!(
            summary < 0.5,
            "{direction}: no shaper, yet p50 {summary} ms: {st}"
        );
    }
}

/// `-R --no-gro` through the NAT (issue 41): the switch reaches the
/// client's receive socket (the report says GRO off), and the client's
/// count is the kernel's: every datagram its namespace's input hook saw
/// from the server was counted received or dropped by its socket.
#[test]
fn reverse_without_gro_counts_what_the_clients_input_hook_counted() {
    require_root_and_ip();
    let net = routed("rgn", 95, true);
    let server = Server::start_in(&net.server, "0.0.0.0:0", &["--recv-buffer-size", "4M"]);
    let target = format!("{}:{}", net.server_ip, server.port());
    // In the client's own namespace, after the NAT: the datagrams the
    // client's kernel took in, data only (UDP length over 600 bytes).
    nft_apply(
        &net.client,
        &format!(
            "table ip clientin {{\n  chain c {{\n    type filter hook input priority 0; policy accept;\n    ip saddr {} udp sport {} udp length > 600 counter\n  }}\n}}\n",
            net.server_ip,
            server.port()
        ),
    );
    // --no-gso: one packet per datagram on the wire, so the hook counts
    // datagrams; --no-gro: one datagram per read on the socket.
    let report = client_in(
        &net.client,
        &args_to(
            &target,
            "-R --no-gro --no-gso -b 1460 -n 20000 --rate 400Mbit",
        ),
    );
    let download = &report["downloads"][0];
    assert_eq!(
        download["gro"], false,
        "--no-gro reached the socket: {report}"
    );
    let receiver = &stream(&report, "server_to_client")["receiver"];
    let (hook, _) = nft_counter(&net.client, "ip", "clientin");
    let drops = download["received"]["socket_wide_kernel_drops"]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(
        u(receiver, "packets") + drops,
        hook,
        "the client's count and its socket's drops are what its input hook saw: {report}"
    );
    assert_eq!(u(&download["received"], "gro_buffers"), 0, "{download}");
    assert_eq!(
        u(receiver, "packets") + u(receiver, "lost_packets"),
        20_000,
        "{report}"
    );
    server.stop();
}
