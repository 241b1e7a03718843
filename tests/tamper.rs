//! Results no third party can falsify, and processes that stay well-behaved
//! whatever they are fed (issue 12), with the real binaries on loopback.
//! Forgeries come from the test (another port) or through the relay (the
//! client's or the server's own address, as an on-path attacker would
//! send them).

mod common;

use common::impair::{kind, Action, Dir, Pick, Relay};
use common::udp::{args_to, client, client_outcome, u, Server, CLIENT, SERVER, WAIT};
use common::{args, run_bounded, wait_until, ChildGuard, TempDir};
use netspeed::wire;
use serde_json::Value;
use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn session_of(report: &Value) -> String {
    report["clients"][0]["session"]
        .as_str()
        .expect("session")
        .to_string()
}

/// Waits (bounded) until the relay has seen a datagram of `kind` going
/// `dir`, and returns the first.
fn wait_captured(relay: &Relay, dir: Dir, kind: Option<u8>) -> Vec<u8> {
    let mut first = None;
    wait_until(WAIT, &format!("a {kind:?} datagram"), || {
        first = relay
            .stats()
            .captured_kind(dir, kind)
            .first()
            .map(|d| d.to_vec());
        first.is_some()
    });
    first.expect("seen")
}

/// The session of the load's client: the one whose Hello names its run
/// (bytes 40..48; the prober's Hello, from a socket of its own, names
/// none).
fn load_session(relay: &Relay) -> u64 {
    let mut session = None;
    wait_until(WAIT, "the load's Hello", || {
        session = relay
            .stats()
            .load_hello()
            .map(|h| u64::from_be_bytes(h[8..16].try_into().unwrap()));
        session.is_some()
    });
    session.expect("seen")
}

fn forged_end_ack(session: u64, nonce: u64) -> [u8; wire::END_LEN] {
    wire::encode_end_ack(&wire::EndAck {
        session,
        nonce,
        received_packets: 7,
        received_bytes: 7000,
        ..wire::EndAck::default()
    })
}

// ---------------------------------------------------------------- 1

#[test]
fn forged_answers_are_ignored() {
    // Every real answer is dropped by the relay. The forger knows the
    // session and even the nonce (it watches the wire): its answer from
    // another port, and one from the server's address with a stale nonce,
    // must both be ignored. Before, either made the client print
    // "received 7, lost 0".
    let server = Server::start("127.0.0.1:0", &[]);
    let rules: Vec<(Pick, Action)> = (0..10)
        .map(|n| (Pick::to_client(kind::END_ACK, n), Action::Drop))
        .collect();
    let relay = server.relay(&rules);
    let target = relay.addr().to_string();
    let run = std::thread::spawn(move || {
        client_outcome(&args_to(&target, "-b 1000 -n 200 --end-timeout 2s"))
    });
    let end = wait_captured(&relay, Dir::ToServer, kind::END);
    let Ok(wire::Message::End(end)) = wire::decode(&end) else {
        panic!("not an End")
    };
    let client_at = relay.client().expect("the client's address");
    let elsewhere = UdpSocket::bind("127.0.0.1:0").unwrap();
    let good_nonce = forged_end_ack(end.header.session, end.nonce);
    for _ in 0..3 {
        elsewhere.send_to(&good_nonce, client_at).unwrap();
        relay.inject_to_client(&forged_end_ack(end.header.session, end.nonce ^ 1));
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = run.join().unwrap();
    relay.finish();
    assert_eq!(
        out.code,
        Some(3),
        "a forged answer was taken: {:?}",
        out.report
    );
    let report = out.report.expect("a report");
    assert!(report["server"].is_null(), "{report}");
    assert_eq!(report["clients"][0]["answer"], "no_answer");
}

// ---------------------------------------------------------------- 2

/// A client run through a relay, with an End forged in the client's name
/// (its address and session) injected after `after` data datagrams.
fn run_with_a_spoofed_end(server: &Server, client_args: &[&str]) -> (common::udp::Outcome, Relay) {
    let relay = server.relay(&[]);
    let target = relay.addr().to_string();
    let mut args: Vec<String> = vec!["-s".into(), target];
    args.extend(client_args.iter().map(|s| s.to_string()));
    let run = std::thread::spawn(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        client_outcome(&args)
    });
    let session = load_session(&relay);
    wait_until(WAIT, "300 data datagrams forwarded", || {
        relay.stats().forwarded(Dir::ToServer, kind::DATA) >= 300
    });
    let forged = wire::encode_end(&wire::End {
        header: wire::Header {
            session,
            seq: 300,
            send_time_ns: 0,
        },
        sent_packets: 300,
        sent_bytes: 300_000,
        duration_ns: 0,
        nonce: 42,
        answer_wait_ns: 0,
        sender: None,
        tag: [0; wire::TAG_LEN],
    });
    relay.inject_to_server(&forged);
    (run.join().unwrap(), relay)
}

#[test]
fn a_spoofed_end_is_reported_as_a_dispute() {
    // Before: the forged End fixed the totals at 300, the real client read
    // "lost 0" of a stale answer, or its real End landed in a new entry.
    let server = Server::loopback();
    let (out, relay) =
        run_with_a_spoofed_end(&server, &["-b", "1000", "-n", "3000", "--rate", "20Mbit"]);
    relay.finish();
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    let report = out.report.expect("a report");
    assert_eq!(report["server"]["disputed"], true, "{report}");
    assert!(report["notes"].to_string().contains("DISPUTED"), "{report}");
    let session = session_of(&report);
    let conflict = server.find("conflict event", |v| {
        v["event"] == "conflict" && v["session"] == session.as_str()
    });
    assert_eq!(u(&conflict, "sent_packets"), 300, "{conflict}");
    let done = server.done_for(&session);
    assert!(done["conflict"].is_string(), "{done}");
    let events = server.stop();
    let dones = events
        .iter()
        .filter(|v| v["event"] == "peer_done" && v["session"] == session.as_str())
        .count();
    assert_eq!(dones, 1, "never a second entry for the session");
}

#[test]
fn with_a_pre_shared_key_a_spoofed_end_changes_nothing() {
    let dir = TempDir::new("netspeed-psk");
    let key = dir.file("key", "correct horse battery staple\n");
    let key = key.to_str().unwrap();
    let server = Server::start(
        "127.0.0.1:0",
        &["--recv-buffer-size", "4M", "--psk-file", key],
    );
    let (out, relay) = run_with_a_spoofed_end(
        &server,
        &[
            "-b",
            "1000",
            "-n",
            "3000",
            "--rate",
            "20Mbit",
            "--psk-file",
            key,
        ],
    );
    let counts = relay.finish();
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let report = out.report.expect("a report");
    let answer = &report["server"];
    assert_eq!(u(answer, "received_packets"), 3000, "{report}");
    assert_eq!(u(answer, "lost_packets"), 0);
    assert!(answer.get("disputed").is_none(), "{report}");
    assert_eq!(counts.injected(Dir::ToServer), 1);
    let events = server.stop();
    let down = events.last().unwrap();
    assert_eq!(u(down, "ends_rejected"), 1, "{down}");
}

#[test]
fn a_key_on_one_side_only_is_a_clear_error() {
    let server = Server::start("127.0.0.1:0", &["--psk", "correct horse"]);
    let out = client_outcome(&["-s", &server.addr, "-n", "10"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("requires a pre-shared key"),
        "{}",
        out.stderr
    );
    let plain = Server::start("127.0.0.1:0", &[]);
    let out = client_outcome(&["-s", &plain.addr, "-n", "10", "--psk", "correct horse"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("has no pre-shared key"),
        "{}",
        out.stderr
    );
    let out = client_outcome(&["-s", &plain.addr, "-n", "10", "--psk", "short"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    // Another key: the server ignores the End, the client says why.
    let out = client_outcome(&[
        "-s",
        &server.addr,
        "-n",
        "10",
        "--psk",
        "the wrong horse",
        "--end-timeout",
        "300ms",
    ]);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(
        out.report.unwrap()["notes"]
            .to_string()
            .contains("another key"),
        "the note names the likely cause"
    );
}

// ---------------------------------------------------------------- 3

#[test]
fn a_slowly_paced_client_stops_at_once_on_a_signal() {
    // --rate 1bit: the second datagram is due in 800 s. Before, SIGTERM and
    // SIGINT were ignored until then.
    // Interval lines on, so that the server says when each client's first
    // datagram has arrived: the client is then waiting for the second.
    let server = Server::start_args(&args("--listen 127.0.0.1:0 --interval 50ms"));
    let mut peers_seen = Vec::new();
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let mut cmd = Command::new(CLIENT);
        cmd.args(["-s", &server.addr, "-b", "100", "-n", "2", "--rate", "1bit"])
            .arg("--json")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = ChildGuard::spawn(&mut cmd, "udp_client");
        let out = child.stdout_lines();
        let first = server.find("an interval line for a new client", |v| {
            v["event"] == "interval" && !peers_seen.contains(&v["peer"])
        });
        peers_seen.push(first["peer"].clone());
        let asked = Instant::now();
        child.signal(signal);
        let status = child
            .wait_timeout(Duration::from_secs(5))
            .expect("exits after the signal");
        let took = asked.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "took {took:?} after signal {signal}"
        );
        assert!(status.code().is_some(), "{status}");
        let report: Value =
            serde_json::from_str(&out.drain(WAIT).join("\n")).expect("the report is printed");
        assert_eq!(u(&report, "sent_packets"), 1, "{report}");
    }
}

#[test]
fn duration_bounds_a_paced_run() {
    // 5000-byte datagrams at 10 kbit/s are 4 s apart: --duration 1s must
    // still end after about a second (before: 4 s).
    let server = Server::start("127.0.0.1:0", &[]);
    let started = Instant::now();
    let report = server.client("-b 5000 --rate 10kbit --duration 1s");
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1800), "took {took:?}");
    assert_eq!(u(&report, "sent_packets"), 1, "{report}");
}

// ---------------------------------------------------------------- 4

#[test]
fn config_files_that_are_not_small_regular_files_are_refused() {
    let dir = TempDir::new("netspeed-cfg");
    let big = dir.file("big.toml", vec![b'#'; 2 << 20]);
    // An unknown key of 100 KB (under the size bound): its echo is cut.
    let long_key = dir.file("long.toml", format!("{} = 1\n", "K".repeat(100_000)));
    let proxy = env!("CARGO_BIN_EXE_tcp_proxy");
    let sockbench = env!("CARGO_BIN_EXE_sockbench");
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            SERVER,
            vec!["--config".into(), "/dev/zero".into()],
            "not a regular file",
        ),
        (
            CLIENT,
            vec!["--config".into(), "/dev/zero".into()],
            "not a regular file",
        ),
        (
            proxy,
            vec!["--config".into(), "/dev/zero".into()],
            "not a regular file",
        ),
        (
            SERVER,
            vec!["--config".into(), big.display().to_string()],
            "larger than",
        ),
        (
            SERVER,
            vec!["--config".into(), long_key.display().to_string()],
            "(cut)",
        ),
        (
            CLIENT,
            vec!["--config".into(), dir.path().display().to_string()],
            "not a regular file",
        ),
        (
            sockbench,
            // An invalid value of 100 KB: its echo is cut.
            vec!["udp".into(), "--socket".into(), "Y".repeat(100_000)],
            "(cut)",
        ),
    ];
    for (bin, args, mention) in cases {
        let started = Instant::now();
        let out = run_bounded(Command::new(bin).args(&args), WAIT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bin} {:?}: {err}", &args[..1]);
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {}", err.len());
        assert!(err.len() < 1000, "a {}-byte error line", err.len());
        assert!(
            err.contains(mention),
            "{bin}: should mention {mention}: {err}"
        );
    }
}

// ---------------------------------------------------------------- 7

#[test]
fn max_peers_cannot_be_configured_away() {
    let out = run_bounded(
        Command::new(SERVER).args(["--listen", "127.0.0.1:0", "--max-peers", "10000000"]),
        WAIT,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("65536"));
}

#[test]
fn a_flood_of_forged_sessions_does_not_lock_out_a_real_client() {
    // Before: forged data sessions filled the table, and a new client got
    // "server": null (and exit 0).
    let server = Server::start(
        "127.0.0.1:0",
        &args("--recv-buffer-size 4M --max-peers 64 --idle-timeout 30s"),
    );
    let target = server.addr.clone();
    let sockets: Vec<UdpSocket> = (0..500)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    for (i, s) in sockets.iter().enumerate() {
        let mut d = [0u8; 64];
        wire::write_data_header(
            &mut d,
            &wire::Header {
                session: 0xF00D_0000 + i as u64,
                seq: 0,
                send_time_ns: 0,
            },
        );
        s.send_to(&d, &target).unwrap();
    }
    let report = server.client("-b 1000 -n 2000 --rate 100Mbit");
    let answer = &report["server"];
    assert_eq!(u(answer, "received_packets"), 2000, "{report}");
    assert_eq!(u(answer, "lost_packets"), 0);
    let events = server.stop();
    let down = events.last().unwrap();
    assert!(
        u(&down["overflow"], "packets") > 0,
        "the flood overflowed: {down}"
    );
}

#[test]
fn a_full_server_says_so() {
    // Four probes take every slot of --max-peers 4; the next client is told
    // the server is full, not that there is no server.
    let server = Server::start(
        "127.0.0.1:0",
        &["--max-peers", "4", "--idle-timeout", "30s"],
    );
    // Four sessions proven from one socket: a Hello, its cookie, the Hello
    // that echoes it (a Hello alone creates nothing).
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    for session in 1..=4u64 {
        let mut hello = wire::Hello {
            header: wire::Header {
                session,
                ..wire::Header::default()
            },
            nonce: session,
            ..Default::default()
        };
        for _ in 0..2 {
            s.send_to(&wire::encode_hello(&hello), &server.addr)
                .unwrap();
            let mut buf = [0u8; 128];
            let n = s.recv(&mut buf).expect("a HelloAck");
            let Ok(wire::Message::HelloAck(ack)) = wire::decode(&buf[..n]) else {
                panic!("not a HelloAck")
            };
            hello.cookie = ack.cookie;
            if hello.cookie != 0 && ack.flags & wire::ACK_PROVEN != 0 {
                break;
            }
        }
    }
    let out = client_outcome(&["-s", &server.addr, "-n", "10"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("is full"), "{}", out.stderr);
    assert_eq!(out.stderr.trim().lines().count(), 1);
    // With several clients, one that cannot start holds all back: no data
    // is sent for a report that will not be printed.
    let roomy = Server::start("127.0.0.1:0", &["--max-peers", "4"]);
    let out = client_outcome(&["-s", &roomy.addr, "-n", "1000", "--clients", "5"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("is full"), "{}", out.stderr);
    let events = roomy.stop();
    assert_eq!(u(events.last().unwrap(), "packets"), 0, "no data was sent");
}

// ---------------------------------------------------------------- 8

/// Runs `bin args` under `ulimit -n limit` for at most `wait`: it may run on
/// (a server), succeed, or fail with one line and exit 1; it must never
/// panic.
fn under_fd_limit(bin: &str, args: &[&str], limit: u32, wait: Duration) {
    let mut cmd = Command::new("prlimit");
    cmd.arg(format!("--nofile={limit}:{limit}"))
        .arg(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = ChildGuard::spawn(&mut cmd, bin);
    let err = child.stderr_lines();
    let status = child.wait_timeout(wait);
    drop(child);
    let text = err.drain(Duration::from_secs(2)).join("\n");
    let what = format!("{bin} {args:?} under ulimit -n {limit}");
    assert!(!text.contains("panicked"), "{what}: {text}");
    match status.and_then(|s| s.code()) {
        // Still running when stopped, or done.
        None | Some(0) => {}
        // One error line (a progress line may come before it).
        Some(1) => assert_eq!(
            text.lines().filter(|l| l.contains("error:")).count(),
            1,
            "{what}: {text}"
        ),
        Some(code) => panic!("{what}: exit {code}: {text}"),
    }
}

#[test]
fn small_fd_limits_give_one_line_errors_never_panics() {
    common::impair::require_tool("prlimit", "--version", "util-linux");
    let proxy = env!("CARGO_BIN_EXE_tcp_proxy");
    let sockbench = env!("CARGO_BIN_EXE_sockbench");
    // Below 4 the dynamic loader itself cannot start the program. A server
    // still running after `short` has got past its start.
    let short = Duration::from_millis(300);
    let long = Duration::from_secs(10);
    let bench = |socket: &'static str| {
        [
            "udp",
            "--socket",
            socket,
            "--threads",
            "2",
            "--conn",
            "unconnected",
            "--ip",
            "v4",
            "--payload",
            "26",
            "--duration",
            "50ms",
        ]
    };
    for limit in 4..=10 {
        under_fd_limit(SERVER, &["--listen", "127.0.0.1:0"], limit, short);
        let threads = [
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "4",
            "--method",
            "tokio",
        ];
        under_fd_limit(SERVER, &threads, limit, short);
        under_fd_limit(CLIENT, &["--local", "-t", "100K"], limit, long);
        for mode in common::proxy::MODES {
            let args = [
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                "127.0.0.1:9",
                "--mode",
                mode,
            ];
            under_fd_limit(proxy, &args, limit, short);
        }
        under_fd_limit(sockbench, &bench("tokio"), limit, long);
        under_fd_limit(sockbench, &bench("async"), limit, long);
    }
}

// ---------------------------------------------------------------- 9

#[test]
fn forged_send_times_cannot_blow_up_jitter() {
    // Before: random send_time_ns values pushed jitter to 1.7e12 ms.
    let server = Server::loopback();
    let relay = server.relay(&[]);
    let target = relay.addr().to_string();
    let run = std::thread::spawn(move || {
        client(&[
            "-s", &target, "-b", "1000", "-n", "2000", "--rate", "20Mbit",
        ])
    });
    let session = load_session(&relay);
    wait_until(WAIT, "500 data datagrams forwarded", || {
        relay.stats().forwarded(Dir::ToServer, kind::DATA) >= 500
    });
    for i in 0..20u64 {
        let mut d = vec![0u8; 1000];
        let forged_time = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | (1 << 62);
        wire::write_data_header(
            &mut d,
            &wire::Header {
                session,
                seq: 1_000_000 + i,
                send_time_ns: forged_time,
            },
        );
        relay.inject_to_server(&d);
    }
    let report = run.join().unwrap();
    relay.finish();
    let answer = &report["server"];
    let jitter = answer["jitter_ms"].as_f64().unwrap();
    assert!(jitter < 100.0, "jitter {jitter} ms: {report}");
    assert!(u(answer, "transit_discarded") >= 1, "{report}");
    assert_eq!(u(answer, "unexpected"), 20, "{report}");
    assert_eq!(u(answer, "lost_packets"), 0);
}

#[test]
fn every_binary_stops_soon_after_sigterm() {
    // Every wait wakes for a signal (the target is about 100 ms; the bound
    // here leaves room for a loaded CI machine).
    let proxy = env!("CARGO_BIN_EXE_tcp_proxy");
    let sockbench = env!("CARGO_BIN_EXE_sockbench");
    let cases: &[(&str, &[&str])] = &[
        (SERVER, &["--listen", "127.0.0.1:0"]),
        (
            proxy,
            &["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9"],
        ),
        // A paced sender whose next datagram is due in hours.
        (
            sockbench,
            &[
                "mux", "--total", "20", "--rate", "1bit", "--method", "epoll",
            ],
        ),
        (
            sockbench,
            &args("udp --socket std --threads 2 --conn unconnected --ip v4 --payload 1460 --duration 30s"),
        ),
    ];
    for (bin, args) in cases {
        let mut cmd = Command::new(bin);
        cmd.args(*args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = ChildGuard::spawn(&mut cmd, bin);
        // A pause on purpose: it is the time each binary must keep running
        // by itself, and sockbench writes nothing before it ends, so there
        // is no line to wait for; 0.8 s puts every one inside its wait.
        std::thread::sleep(Duration::from_millis(800));
        assert!(
            child.wait_timeout(Duration::ZERO).is_none(),
            "{bin} {args:?} ended by itself"
        );
        let asked = Instant::now();
        child.signal(libc::SIGTERM);
        child
            .wait_timeout(Duration::from_secs(5))
            .unwrap_or_else(|| panic!("{bin} {args:?} ignored SIGTERM"));
        let took = asked.elapsed();
        assert!(
            took < Duration::from_millis(500),
            "{bin} {args:?} took {took:?} to stop"
        );
    }
}
