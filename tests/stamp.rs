//! STAMP (RFC 8762, RFC 8972) against an independent implementation,
//! stamp-suite 1.0.0, both ways: its sender against `udp_server --stamp`,
//! and `udp_client --stamp-reflector ... --no-load` against its reflector
//! (stateless, stateful, PTP timestamps). Then what no peer checks: a
//! short or malformed request is never answered larger than it came, and
//! a flood from many sources gets no more answers than their budgets; and
//! loss dropped by nft on each way is placed on its way.
//!
//! stamp-suite is found in PATH or at $STAMP_SUITE. Without it these tests
//! fail (they never skip): install it as CI does (.ci/run).

mod common;

use common::stamp_suite::stamp_suite;
use common::udp::{Server, CLIENT, WAIT};
use common::{run_bounded, ChildGuard, LineReader};
use serde_json::Value;
use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A udp_server with a STAMP reflector on a free loopback port, and the
/// reflector's address.
fn reflector(extra: &[&str]) -> (Server, SocketAddr) {
    let mut args = vec!["--stamp", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let server = Server::start("127.0.0.1:0", &args);
    let listening = server.events.borrow()[0].clone();
    let addr = listening["stamp"]["addr"]
        .as_str()
        .unwrap_or_else(|| panic!("no stamp in the listening event: {listening}"))
        .parse()
        .expect("the reflector's address");
    (server, addr)
}

/// The reflector's last report, once the server stopped.
fn stamp_done(server: Server) -> Value {
    let events = server.stop();
    events
        .into_iter()
        .find(|v| v["event"] == "stamp_done")
        .expect("a stamp_done event")
}

/// `udp_client --stamp-reflector ADDR --no-load --json` plus `args`.
fn our_sender(addr: SocketAddr, args: &[&str]) -> Value {
    let mut cmd = Command::new(CLIENT);
    cmd.args([
        "--stamp-reflector",
        &addr.to_string(),
        "--no-load",
        "--json",
    ])
    .args(args);
    json_of(&mut cmd)
}

/// Runs `cmd` (bounded), which must exit 0, and reads its stdout's JSON.
fn json_of(cmd: &mut Command) -> Value {
    let out = run_bounded(cmd, Duration::from_secs(60));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

fn f(v: &Value, path: &[&str]) -> f64 {
    let mut at = v;
    for key in path {
        at = &at[key];
    }
    at.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number in {v}"))
}

#[test]
fn stamp_suites_sender_gets_every_answer_from_our_reflector() {
    let suite = stamp_suite();
    let (server, addr) = reflector(&[]);
    let port = addr.port().to_string();
    // 20 test packets with SSID 4660: its sender stops at a zeroed SSID
    // (proof that we echo it) and counts answers with a bad error
    // estimate; -R prints each answer's TTL (its sender sends TTL 255).
    let mut cmd = Command::new(&suite);
    cmd.env("NO_COLOR", "1").args([
        "--remote-addr",
        "127.0.0.1",
        "--remote-port",
        &port,
        "--count",
        "20",
        "--send-delay",
        "10ms",
        "--timeout",
        "1",
        "--ssid",
        "4660",
        "--on-zero-ssid",
        "stop",
        "--output-format",
        "json",
        "-R",
    ]);
    let out = run_bounded(&mut cmd, Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("stamp-suite's summary ({e}): {stdout}\n{stderr}"));
    assert_eq!(summary["packets_sent"], 20, "{summary}");
    assert_eq!(
        summary["packets_received"], 20,
        "every packet answered: {summary}"
    );
    assert_eq!(summary["measurements"]["unknown_replies"], 0, "{summary}");
    assert_eq!(
        summary["owd"]["clock_quality"]["invalid_estimate"], 0,
        "{summary}"
    );
    assert_eq!(
        summary["owd"]["clock_quality"]["last_reflector"]["synchronized"], false,
        "not synchronised unless told: {summary}"
    );
    let ttls: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.split("ttl=").nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(ttls.len(), 20, "{stderr}");
    assert!(ttls.iter().all(|t| *t == "255"), "the real TTL: {ttls:?}");
    // Larger packets (an Extra Padding TLV) and a malformed TLV: answered.
    for extra in [
        &["--extra-padding", "100"][..],
        &["--malformed", "bad-length"],
    ] {
        let mut cmd = Command::new(&suite);
        cmd.env("NO_COLOR", "1")
            .args([
                "--remote-addr",
                "127.0.0.1",
                "--remote-port",
                &port,
                "--count",
                "5",
                "--send-delay",
                "10ms",
                "--timeout",
                "1",
                "--output-format",
                "json",
            ])
            .args(extra);
        let out = run_bounded(&mut cmd, Duration::from_secs(60));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let summary: Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();
        assert_eq!(summary["packets_received"], 5, "{extra:?}: {summary}");
    }
    // Our own sender against the same reflector: the round trips agree
    // (both T4 - T1 on loopback; a busy machine spreads them, so the
    // bound is loose).
    let theirs = f(&summary, &["median_rtt_ms"]);
    let ours = our_sender(addr, &["--count", "20", "--stamp-interval", "10ms"]);
    assert_eq!(ours["answered"], 20, "{ours}");
    assert_eq!(ours["reflector_numbering"], "echoed", "{ours}");
    let our_median = f(&ours, &["rtt_ms", "p50"]);
    assert!(
        (our_median - theirs).abs() < 2.0 && theirs < 5.0,
        "ours {our_median} ms against stamp-suite's {theirs} ms"
    );
    let done = stamp_done(server);
    assert_eq!(done["answered"], 50, "{done}");
    assert_eq!(done["received"], 50, "{done}");
    assert_eq!(done["malformed_tlvs"], 5, "{done}");
    assert_eq!(done["sessions_started"], 4, "{done}");
}

/// stamp-suite's reflector on a free loopback port, started with `extra`,
/// and its stderr (where it says it listens).
fn their_reflector(extra: &[&str]) -> (ChildGuard, LineReader, u16) {
    let suite = stamp_suite();
    for _ in 0..5 {
        let port = UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .expect("a free port")
            .port();
        let mut cmd = Command::new(&suite);
        cmd.env("NO_COLOR", "1")
            .args([
                "--is-reflector",
                "--local-addr",
                "127.0.0.1",
                "--local-port",
                &port.to_string(),
                "--output-format",
                "json",
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut guard = ChildGuard::spawn(&mut cmd, "stamp-suite reflector");
        let stdout = guard.stdout_lines();
        let stderr = guard.stderr_lines();
        if stderr
            .wait_for(WAIT, |l| l.contains("STAMP Reflector listening on"))
            .is_some()
        {
            return (guard, stdout, port);
        }
        // The port was taken meanwhile: another one.
        drop(guard);
    }
    panic!("stamp-suite's reflector did not start");
}

/// Stops stamp-suite's reflector (SIGINT) and reads its JSON statistics.
fn their_statistics(guard: ChildGuard, stdout: LineReader) -> Value {
    guard.signal(libc::SIGINT);
    let line = stdout
        .wait_for(WAIT, |l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no statistics from stamp-suite: {}", stdout.transcript()));
    drop(guard);
    serde_json::from_str(&line).expect("stamp-suite's statistics")
}

#[test]
fn our_sender_against_stamp_suites_stateless_reflector() {
    let (guard, stdout, port) = their_reflector(&[]);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let r = our_sender(
        addr,
        &[
            "--count",
            "50",
            "--stamp-interval",
            "5ms",
            "--stamp-ssid",
            "4660",
        ],
    );
    assert_eq!(
        (r["sent"].as_u64(), r["answered"].as_u64()),
        (Some(50), Some(50)),
        "{r}"
    );
    assert_eq!(
        (r["lost"].as_u64(), r["loss_percent"].as_f64()),
        (Some(0), Some(0.0)),
        "{r}"
    );
    // A stateless reflector echoes our numbers: 0 to 49.
    assert_eq!(r["reflector_numbering"], "echoed", "{r}");
    assert_eq!(r["last_reflector_seq"], 49, "{r}");
    assert_eq!(r["loss_split"]["forward"], 0, "{r}");
    assert_eq!(r["loss_split"]["backward"], 0, "{r}");
    assert_eq!(
        r["zero_ssid_answers"], 0,
        "its reflector echoes the SSID: {r}"
    );
    assert_eq!(r["ttl_at_reflector"], 64, "{r}");
    assert_eq!(r["reflector_clock"]["format"], "NTP", "{r}");
    assert!(r["network_rtt_ms"]["p50"].as_f64().is_some(), "{r}");
    assert!(r["one_way"].is_null(), "no clock says synchronised: {r}");
    let stats = their_statistics(guard, stdout);
    assert_eq!(stats["total_packets_reflected"], 50, "{stats}");
    assert_eq!(stats["sessions"][0]["ssid"], 4660, "{stats}");
}

#[test]
fn our_sender_against_stamp_suites_stateful_reflector_sees_its_own_numbers() {
    let (guard, stdout, port) = their_reflector(&["--stateful-reflector"]);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    // Two runs from one address, port and SSID are one session to the
    // reflector: its count goes on (20 to 39) while ours starts again.
    let bind = UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a free port")
        .to_string();
    let args = [
        "--count",
        "20",
        "--stamp-interval",
        "5ms",
        "--stamp-ssid",
        "77",
        "--bind",
        &bind,
    ];
    let first = our_sender(addr, &args);
    assert_eq!(first["answered"], 20, "{first}");
    assert_eq!(first["last_reflector_seq"], 19, "{first}");
    let second = our_sender(addr, &args);
    assert_eq!(second["answered"], 20, "{second}");
    assert_eq!(second["reflector_numbering"], "own", "{second}");
    assert_eq!(second["last_reflector_seq"], 39, "{second}");
    assert_eq!(
        second["loss_split_basis"], "the reflector's own numbers",
        "{second}"
    );
    assert_eq!(second["loss_split"]["forward"], 0, "{second}");
    assert_eq!(second["loss_split"]["backward"], 0, "{second}");
    let stats = their_statistics(guard, stdout);
    assert_eq!(stats["total_packets_reflected"], 40, "{stats}");
}

#[test]
fn ptp_timestamps_from_stamp_suite_are_read_by_the_z_bit() {
    let (guard, stdout, port) = their_reflector(&["--clock-source", "PTP"]);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let r = our_sender(addr, &["--count", "10", "--stamp-interval", "5ms"]);
    assert_eq!(r["answered"], 10, "{r}");
    assert_eq!(r["reflector_clock"]["format"], "PTP", "{r}");
    // T3 - T2 decoded as PTP made sense (not before T2, within the round
    // trip): the network round trip is there.
    assert!(r["network_rtt_ms"]["p50"].as_f64().is_some(), "{r}");
    their_statistics(guard, stdout);
}

/// Sends each of `requests` from `socket` to `to`; the sizes of whatever
/// comes back until 300 ms pass without an answer.
fn answers_to(socket: &UdpSocket, to: SocketAddr, requests: &[Vec<u8>]) -> Vec<usize> {
    for r in requests {
        socket.send_to(r, to).expect("send");
    }
    collect(socket, Duration::from_millis(300))
        .into_iter()
        .map(|(_, n)| n)
        .collect()
}

/// Every datagram that reaches `socket` until none came for `quiet`
/// (bounded at 10 s): (from, size).
fn collect(socket: &UdpSocket, quiet: Duration) -> Vec<(SocketAddr, usize)> {
    socket.set_read_timeout(Some(quiet)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 70_000];
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match socket.recv_from(&mut buf) {
            Ok((n, from)) => got.push((from, n)),
            Err(_) => break,
        }
    }
    got
}

/// A base packet (sequence 0, SSID `ssid`) padded to `size` with `fill`.
fn request(size: usize, fill: u8, ssid: u16) -> Vec<u8> {
    let mut p = vec![fill; size];
    if size >= 44 {
        p[..44].fill(0);
        p[12..14].copy_from_slice(&1u16.to_be_bytes());
        p[14..16].copy_from_slice(&ssid.to_be_bytes());
    }
    p
}

#[test]
fn short_malformed_and_long_requests_are_never_answered_larger() {
    let (server, addr) = reflector(&[]);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    // Every size below the base packet, garbage or zeros: no answer.
    let short: Vec<Vec<u8>> = (0..44)
        .map(|n| vec![if n % 2 == 0 { 0xFF } else { 0 }; n])
        .collect();
    assert_eq!(answers_to(&socket, addr, &short), Vec::<usize>::new());
    // Garbage of 44 bytes and more, a TLV that runs past the end, huge
    // requests: each answered once, at its own size (a size at a time,
    // three fills each, so the answers are the requests').
    let mut sent = 0u64;
    for size in [44, 45, 47, 48, 64, 100, 1400, 9000, 65_000] {
        let group: Vec<Vec<u8>> = [0x00u8, 0xFF, 0x80]
            .into_iter()
            .map(|fill| request(size, fill, 9))
            .collect();
        assert_eq!(
            answers_to(&socket, addr, &group),
            vec![size; 3],
            "{size} bytes"
        );
        sent += 3;
    }
    let mut overrun = request(60, 0, 9);
    overrun[44..48].copy_from_slice(&[0x80, 200, 0x01, 0x90]);
    assert_eq!(answers_to(&socket, addr, &[overrun]), vec![60]);
    sent += 1;
    let done = stamp_done(server);
    assert_eq!(done["unanswered"]["too_short"], 44, "{done}");
    assert_eq!(done["answered"].as_u64(), Some(sent), "{done}");
    assert!(done["malformed_tlvs"].as_u64() >= Some(1), "{done}");
}

#[test]
fn a_flood_from_many_sources_gets_no_more_than_each_budget() {
    // 3 answers a second per source, 40 per address, 500 in all, 16
    // sessions numbered.
    let (server, addr) = reflector(&[
        "--stamp-max-per-source",
        "3",
        "--stamp-max-per-prefix",
        "40",
        "--stamp-max-total",
        "500",
        "--stamp-max-sessions",
        "16",
    ]);
    // 20 addresses (any 127/8 address is this host's): 30 ports on the
    // first, whose address's budget binds in the second round; 10 ports
    // on each other one. 20 requests from each port, round by round: the
    // server's budget binds in the third.
    let mut sockets = Vec::new();
    for host in 1..=20u8 {
        for _ in 0..if host == 1 { 30 } else { 10 } {
            let s = UdpSocket::bind(SocketAddr::from(([127, 0, 1, host], 0))).unwrap();
            sockets.push(s);
        }
    }
    let started = Instant::now();
    for round in 0..20u8 {
        for s in &sockets {
            let size = 44 + usize::from(round);
            s.send_to(&request(size, 0, 1), addr).unwrap();
        }
    }
    let mut per_source = HashMap::new();
    let mut per_host: HashMap<std::net::IpAddr, u64> = HashMap::new();
    let mut total = 0u64;
    // The answers are in the sockets' queues once the reflector has been
    // quiet a while: read what each holds.
    std::thread::sleep(Duration::from_millis(500));
    for s in &sockets {
        let me = s.local_addr().unwrap();
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 100];
        let queued = std::iter::from_fn(|| s.recv_from(&mut buf).ok().map(|(n, from)| (from, n)));
        for (from, size) in queued.collect::<Vec<_>>() {
            assert_eq!(from, addr);
            // Each socket sent sizes 44 to 63: no answer larger.
            assert!((44..64).contains(&size), "a {size}-byte answer");
            *per_source.entry(me).or_insert(0u64) += 1;
            *per_host.entry(me.ip()).or_insert(0) += 1;
            total += 1;
        }
    }
    // The budgets are per one-second window: the run spans at most this
    // many of them.
    let windows = started.elapsed().as_secs() + 2;
    let most = |budget: u64| budget * windows;
    assert!(per_source.values().all(|&n| n <= most(3)), "{per_source:?}");
    assert!(per_host.values().all(|&n| n <= most(40)), "{per_host:?}");
    assert!(total <= most(500), "{total} answers");
    assert!(total > 0, "some answers");
    let done = stamp_done(server);
    let u = &done["unanswered"];
    let refused = [
        "over_source_budget",
        "over_prefix_budget",
        "over_total_budget",
    ]
    .iter()
    .map(|k| u[k].as_u64().unwrap())
    .sum::<u64>();
    assert_eq!(done["answered"].as_u64(), Some(total), "{done}");
    assert_eq!(done["received"].as_u64(), Some(total + refused), "{done}");
    assert!(u["over_prefix_budget"].as_u64() > Some(0), "{done}");
    assert!(u["over_total_budget"].as_u64() > Some(0), "{done}");
    assert!(done["sessions_peak"].as_u64() <= Some(16), "{done}");
    assert!(done["answered_stateless"].as_u64() > Some(0), "{done}");
}

#[test]
fn loss_is_split_by_direction_from_our_reflectors_numbers() {
    // In a namespace of its own, nft drops every 10th test packet on the
    // way to the reflector (the 4th of each ten) and every 10th answer on
    // the way back (the 6th): of 100, 10 forward, and 9 of the 90 answers.
    common::impair::require_nft();
    let ns = common::netns::Netns::new("stampsplit");
    let server = Server::start_in(&ns, "127.0.0.1:0", &["--stamp", "127.0.0.1:0"]);
    let listening = server.events.borrow()[0].clone();
    let addr = listening["stamp"]["addr"]
        .as_str()
        .expect("stamp addr")
        .to_string();
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    common::impair::nft_apply(
        &ns,
        &format!(
            "table inet split {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    \
             udp dport {port} numgen inc mod 10 3 counter drop\n    \
             udp sport {port} numgen inc mod 10 5 counter drop\n  }}\n}}\n"
        ),
    );
    let mut cmd = ns.cmd(CLIENT);
    cmd.args([
        "--stamp-reflector",
        &addr,
        "--no-load",
        "--json",
        "--count",
        "100",
        "--stamp-interval",
        "2ms",
    ]);
    let out = run_bounded(&mut cmd, Duration::from_secs(60));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(
        (r["sent"].as_u64(), r["answered"].as_u64()),
        (Some(100), Some(81)),
        "{r}"
    );
    assert_eq!(r["reflector_numbering"], "own", "{r}");
    assert_eq!(r["loss_split_basis"], "the reflector's own numbers", "{r}");
    assert_eq!(r["loss_split"]["forward"], 10, "{r}");
    assert_eq!(r["loss_split"]["backward"], 9, "{r}");
    assert_eq!(r["loss_split"]["after_last_answer"], 0, "{r}");
    assert_eq!(r["last_reflector_seq"], 89, "{r}");
    let done = stamp_done(server);
    assert_eq!(done["answered"], 90, "{done}");
}

/// Beside a load, the round-trip probes go to the STAMP reflector and
/// not to udp_server: stamp-suite counts every one it reflected, and the
/// count is the client's `probes_sent` exactly (none lost on loopback).
#[test]
fn probes_beside_a_load_go_to_stamp_suites_reflector_every_one() {
    let (guard, stdout, port) = their_reflector(&[]);
    let server = Server::start("127.0.0.1:0", &[]);
    let target = format!("127.0.0.1:{}", server.port());
    let reflector = format!("127.0.0.1:{port}");
    let mut cmd = Command::new(CLIENT);
    cmd.args([
        "-s",
        &target,
        "--stamp-reflector",
        &reflector,
        "--stamp-ssid",
        "4661",
        "--duration",
        "2s",
        "--rate",
        "200M",
        "--idle-probe",
        "500ms",
        "--json",
    ]);
    let report = json_of(&mut cmd);
    let lat = &report["streams"][0]["latency"];
    assert_eq!(lat["stamp_reflector"], reflector.as_str(), "{lat}");
    let sent = lat["probes_sent"].as_u64().expect("probes_sent");
    // 20 a second for the idle 0.5 s and the load's 2 s.
    assert!((40..=60).contains(&sent), "{sent} probes: {lat}");
    assert_eq!(lat["probes_lost"], 0, "{lat}");
    assert!(lat["idle_rtt_ms"].as_f64().is_some(), "{lat}");
    assert!(lat["loaded_rtt_ms"]["p50"].as_f64().is_some(), "{lat}");
    let stats = their_statistics(guard, stdout);
    assert_eq!(stats["total_packets_reflected"], sent, "{stats}");
    assert_eq!(stats["sessions"][0]["ssid"], 4661, "{stats}");
    server.stop();
}

#[test]
fn stamp_settings_that_cannot_work_are_one_line_usage_errors() {
    for (args, says) in [
        (
            &["--stamp-reflector", "127.0.0.1:9", "--stamp-stateful"][..],
            "only --no-load reports",
        ),
        (
            &["--stamp-reflector", "127.0.0.1:9", "--no-load", "-R"],
            "--no-load cannot be used with --reverse",
        ),
        (&["--stamp-size", "100"], "needs --stamp-reflector"),
    ] {
        let out = run_bounded(Command::new(CLIENT).args(args), WAIT);
        common::one_line_error(&out, 2, says, &args.join(" "));
    }
}
