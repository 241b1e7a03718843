//! A run a signal cuts short (issue 28): it still prints its report, says
//! "interrupted" in the text and the JSON, and exits as the shell expects
//! of a process that signal ended (130 for SIGINT, 143 for SIGTERM); a
//! second signal during the wind-down ends the process at once. The real
//! binaries, on loopback.

mod common;

use common::proxy::{self, Proxy};
use common::udp::{CLIENT, WAIT};
use common::{args, ChildGuard};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A `--local` run long enough to be cut short (2 GB at 1 Gbit/s: 16 s;
/// the server refuses a reverse stream longer than 60 s).
const LONG_RUN: &str = "--local -t 2G --rate 1G -b 1400";

/// Starts `udp_client` with `extra`, lets it send for a while, sends
/// `signal`, and returns its exit code and
/// everything it wrote to stdout.
fn interrupted_client(extra: &str, signal: libc::c_int) -> (Option<i32>, String) {
    let mut cmd = Command::new(CLIENT);
    cmd.args(args(LONG_RUN))
        .args(args(extra))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = ChildGuard::spawn(&mut cmd, "udp_client");
    let out = child.stdout_lines();
    // A pause on purpose: --json prints nothing until the end, and the
    // idle round-trip probe takes about a second before the load; the run
    // would take 16 s, so at 2 s it is sending.
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        child.wait_timeout(Duration::ZERO).is_none(),
        "udp_client ended by itself:\n{}",
        out.transcript()
    );
    child.signal(signal);
    let status = child
        .wait_timeout(Duration::from_secs(10))
        .expect("the client ends within 10 s of the signal");
    (status.code(), out.drain(WAIT).join("\n"))
}

#[test]
fn sigint_prints_the_report_says_interrupted_and_exits_130() {
    let (code, text) = interrupted_client("", libc::SIGINT);
    assert_eq!(code, Some(130), "{text}");
    // The full report, not a stub: both sides' lines and the verdict.
    for line in ["sent ", "received ", "limit "] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "no '{line}' line:\n{text}"
        );
    }
    assert!(
        text.contains("interrupted by SIGINT after "),
        "the text does not say it was interrupted:\n{text}"
    );
}

#[test]
fn sigterm_says_interrupted_in_the_json_and_exits_143() {
    let (code, text) = interrupted_client("--json", libc::SIGTERM);
    assert_eq!(code, Some(143), "{text}");
    let report: Value = serde_json::from_str(&text).expect("one JSON report");
    assert_eq!(report["interrupted"]["signal"], "SIGTERM", "{report}");
    let after = report["interrupted"]["after_seconds"].as_f64().unwrap();
    // The program ran at least as long as the sending it reports.
    assert!(
        after >= report["seconds"].as_f64().unwrap(),
        "{after} < the sending span: {report}"
    );
    assert!(
        report["notes"][0]
            .as_str()
            .unwrap()
            .starts_with("interrupted by SIGTERM"),
        "{report}"
    );
    // Cut short: far fewer than the 10 GB asked for, and every datagram
    // accounted for by the server.
    let sent = report["sent_packets"].as_u64().unwrap();
    assert!(sent > 0 && sent < 2_000_000_000 / 1400, "{report}");
    assert_eq!(report["complete"], true, "{report}");
}

#[test]
fn an_interrupted_download_says_so_too() {
    let (code, text) = interrupted_client("-R --json", libc::SIGINT);
    assert_eq!(code, Some(130), "{text}");
    let report: Value = serde_json::from_str(&text).expect("one JSON report");
    assert_eq!(report["interrupted"]["signal"], "SIGINT", "{report}");
    // Issue 41: the server's count, if it came, is at least what this
    // client received; if it did not, it is unknown (null), never 0.
    let stream = &report["streams"][0];
    let received = stream["receiver"]["packets"].as_u64().expect("received");
    assert!(received > 0, "{report}");
    let sender = &stream["sender"];
    match sender["packets"].as_u64() {
        Some(sent) => assert!(
            sent >= received,
            "sent {sent} < received {received}: {report}"
        ),
        None => {
            for key in ["packets", "bytes", "seconds", "gbps"] {
                assert!(
                    sender[key].is_null(),
                    "{key} unknown yet not null: {sender}"
                );
            }
        }
    }
}

#[test]
fn an_interrupted_download_in_text_never_says_the_server_sent_nothing() {
    let (code, text) = interrupted_client("-R", libc::SIGINT);
    assert_eq!(code, Some(130), "{text}");
    let sent = text
        .lines()
        .find(|l| l.starts_with("[S->C] sent "))
        .unwrap_or_else(|| panic!("no sent line:\n{text}"));
    assert!(!sent.contains(" 0 packets"), "{sent}\n{text}");
}

#[test]
fn a_run_that_ends_by_itself_is_not_interrupted() {
    let mut cmd = Command::new(CLIENT);
    cmd.args(args("--local -t 2M -b 1400 --rate 500M --json"));
    let out = common::run_bounded(&mut cmd, WAIT);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report.get("interrupted").is_none(), "{report}");
}

#[test]
fn an_interrupted_proxy_bench_says_so_and_exits_130() {
    let mut cmd = Command::new(proxy::bin());
    cmd.args(args("bench --duration 2s --tests test1"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = ChildGuard::spawn(&mut cmd, "tcp_proxy bench");
    let _out = child.stdout_lines();
    let err = child.stderr_lines();
    // Into the matrix: each row says on stderr when it is done.
    err.wait_for(WAIT, |l| l.contains("done"))
        .unwrap_or_else(|| panic!("no first row:\n{}", err.transcript()));
    child.signal(libc::SIGINT);
    let status = child
        .wait_timeout(Duration::from_secs(10))
        .expect("the bench ends within 10 s of Ctrl-C");
    let stderr = err.drain(WAIT).join("\n");
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("interrupted (SIGINT after"),
        "stderr does not say it was interrupted: {stderr}"
    );
}

#[test]
fn a_second_signal_ends_the_proxys_drain_at_once() {
    // An upstream that holds every connection open and silent.
    let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = upstream.local_addr().unwrap();
    let (accepted, connected) = std::sync::mpsc::channel();
    let holder = std::thread::spawn(move || {
        let (mut s, _) = upstream.accept().unwrap();
        accepted.send(()).unwrap();
        let mut buf = [0u8; 64];
        // Until the proxy goes away.
        while s.read(&mut buf).is_ok_and(|n| n > 0) {}
    });
    let mut proxy = Proxy::start(addr, "splice", &["--drain-timeout", "30s"]);
    let mut held = std::net::TcpStream::connect(proxy.addr).unwrap();
    held.write_all(b"x").unwrap();
    connected
        .recv_timeout(WAIT)
        .expect("the proxy connects upstream");
    proxy.guard.signal(libc::SIGTERM);
    proxy.event(|v| v["event"] == "draining");
    // Draining: it waits for the held connection, up to 30 s.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        proxy.guard.wait_timeout(Duration::ZERO).is_none(),
        "the proxy did not drain"
    );
    let asked = Instant::now();
    proxy.guard.signal(libc::SIGTERM);
    let status = proxy
        .guard
        .wait_timeout(Duration::from_secs(5))
        .expect("the second SIGTERM ends the drain");
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "took {:?}",
        asked.elapsed()
    );
    assert_eq!(status.code(), Some(143), "{status}");
    drop(held);
    holder.join().unwrap();
}
