//! Every receive method, send path and offload delivers exact counts; the
//! report names what was really used.

mod common;

use common::run_bounded;
use common::udp::{args_to, assert_exact, client, u, Server, CLIENT, SERVER, WAIT};
use std::process::Command;

/// The send paths: plain, sendmmsg, GSO, GSO in sendmmsg batches.
const SEND_PATHS: [&[&str]; 4] = [
    &[],
    &["--batch", "16"],
    &["--gso"],
    &["--gso", "--batch", "4"],
];

/// Runs every send path against `udp_server --method METHOD`, with GRO on
/// and off, and checks exact counts at both ends.
fn method_delivers_exact_counts(method: &str) {
    for gro in ["--gro", "--no-gro"] {
        let server = Server::start(
            "127.0.0.1:0",
            &["--method", method, gro, "--recv-buffer-size", "8M"],
        );
        let listening = server.find("listening", |v| v["event"] == "listening");
        assert_eq!(listening["method"], method);
        assert_eq!(listening["gro"], gro == "--gro", "{listening}");
        for path in SEND_PATHS {
            // 1460-byte datagrams and a 300-byte tail: GSO buffers carry a
            // short last segment.
            let mut args = vec![
                "-s",
                &server.addr,
                "-b",
                "1460",
                "-t",
                "2920300",
                "--rate",
                "300Mbit",
            ];
            args.extend_from_slice(path);
            let report = client(&args);
            let c = &report["clients"][0];
            assert_eq!(u(c, "sent_bytes"), 2_920_300, "{method} {gro} {path:?}");
            assert_eq!(u(c, "sent_packets"), 2001);
            let done = server.done_for(c["session"].as_str().unwrap());
            assert_exact(&report, c, &done);
            let send_path = &c["send_path"];
            let gso_asked = path.contains(&"--gso");
            assert_eq!(
                send_path["gso"],
                if gso_asked { "on" } else { "not requested" },
                "{send_path}"
            );
            let batch: u64 = path
                .iter()
                .skip_while(|a| **a != "--batch")
                .nth(1)
                .map_or(1, |b| b.parse().unwrap());
            // Paced, what is due goes out as one batch: at least --batch
            // per call, and far fewer calls than datagrams.
            assert!(u(send_path, "batch") >= batch, "{send_path}");
            assert!(u(send_path, "calls") < 2001 / 2, "{send_path}");
            if gso_asked {
                // 2001 datagrams in GSO buffers of up to 44 segments (64 KiB).
                assert!(u(send_path, "calls") < 2001 / 10, "{send_path}");
            }
        }
    }
}

#[test]
fn method_thread() {
    method_delivers_exact_counts("thread");
}

#[test]
fn method_select() {
    method_delivers_exact_counts("select");
}

#[test]
fn method_poll() {
    method_delivers_exact_counts("poll");
}

#[test]
fn method_epoll() {
    method_delivers_exact_counts("epoll");
}

#[test]
fn method_tokio() {
    method_delivers_exact_counts("tokio");
}

#[test]
fn method_mmsg() {
    method_delivers_exact_counts("mmsg");
}

#[test]
fn gso_at_64_bytes_counts_each_segment() {
    // 128 segments per GSO buffer, coalesced again by GRO at the server.
    let server = Server::start("127.0.0.1:0", &["--gro", "--recv-buffer-size", "8M"]);
    let report = client(&args_to(
        &server.addr,
        "-b 64 -n 20000 --gso --rate 100Mbit",
    ));
    let c = &report["clients"][0];
    assert_eq!(u(c, "sent_packets"), 20_000);
    assert_eq!(u(&c["send_path"], "gso_segments"), 128);
    assert_exact(&report, c, &server.done_for(c["session"].as_str().unwrap()));
}

#[test]
fn threads_share_one_table() {
    let server = Server::start(
        "127.0.0.1:0",
        &["--threads", "2", "--recv-buffer-size", "4M"],
    );
    let listening = server.find("listening", |v| v["event"] == "listening");
    assert_eq!(listening["threads"], 2);
    let report = client(&args_to(
        &server.addr,
        "-b 1000 -t 1M --clients 4 --rate 100Mbit",
    ));
    for c in report["clients"].as_array().unwrap() {
        let session = c["session"].as_str().unwrap();
        assert_exact(&report, c, &server.done_for(session));
    }
    // Each peer is reported once, whichever socket its traffic reached.
    // No pause before the signal: the four peer_done lines above are the
    // event to wait for, and a peer that a second socket still held would
    // be summarised at shutdown, before the shutdown line, and counted.
    server.guard.signal(libc::SIGTERM);
    let summary = server.find("shutdown", |v| v["event"] == "shutdown");
    assert_eq!(u(&summary, "peers"), 4, "{summary}");
    // End-of-test messages are control, not data.
    assert_eq!(u(&summary, "packets"), 4 * 1000, "{summary}");
    let done_lines = server
        .events
        .borrow()
        .iter()
        .filter(|v| v["event"] == "peer_done")
        .count();
    assert_eq!(done_lines, 4);
}

#[test]
fn pacing_stays_within_two_percent_with_batches_and_gso() {
    let server = Server::start("127.0.0.1:0", &["--recv-buffer-size", "8M"]);
    for path in [&["--batch", "16"][..], &["--gso", "--batch", "8"]] {
        let mut args = vec![
            "-s",
            &server.addr,
            "-b",
            "1460",
            "--duration",
            "2s",
            "--rate",
            "1Gbit",
        ];
        args.extend_from_slice(path);
        let report = client(&args);
        let rate = u(&report, "sent_bytes") as f64 * 8.0 / report["seconds"].as_f64().unwrap();
        let error = (rate - 1e9).abs() / 1e9;
        assert!(
            error < 0.02,
            "{path:?}: paced at {rate:.0} bit/s, {:.2}% off",
            error * 100.0
        );
    }
}

#[test]
fn unknown_method_or_scheduler_is_a_usage_error() {
    for (bin, args, mention) in [
        (SERVER, &["--method", "kqueue"][..], "kqueue"),
        (SERVER, &["--scheduler", "deadline"], "deadline"),
        (CLIENT, &["--scheduler", "deadline"], "deadline"),
        (
            CLIENT,
            &["--scheduler", "fifo", "--priority", "0"],
            "1..=99",
        ),
        (
            SERVER,
            &["--scheduler", "other", "--priority", "5"],
            "0..=0",
        ),
        (CLIENT, &["--priority", "5"], "--scheduler"),
        (SERVER, &["--threads", "0"], "--threads"),
        (CLIENT, &["--batch", "0"], "--batch"),
        (CLIENT, &["--gso", "-b", "0", "-n", "5"], "--gso"),
    ] {
        let out = run_bounded(Command::new(bin).args(args), WAIT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(mention) && err.trim().lines().count() == 1,
            "{args:?}: {err}"
        );
    }
}

#[test]
fn scheduler_not_permitted_names_what_grants_it() {
    // As an unprivileged user with no capabilities, SCHED_FIFO is refused.
    let setpriv = std::path::Path::new("/usr/bin/setpriv");
    assert!(
        setpriv.exists(),
        "this test needs setpriv (util-linux) to drop privileges"
    );
    let out = run_bounded(
        Command::new(setpriv).args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            CLIENT,
            "--scheduler",
            "fifo",
            "--priority",
            "10",
            "--local",
            "-t",
            "1K",
        ]),
        WAIT,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for needle in ["root", "CAP_SYS_NICE", "ulimit -r"] {
        assert!(err.contains(needle), "should mention {needle}: {err}");
    }
}

#[test]
fn scheduler_batch_is_applied() {
    // SCHED_BATCH needs no privilege; the run works under it.
    let report = client(&["--local", "--scheduler", "batch", "-t", "100K"]);
    assert_eq!(u(&report["server"], "received_bytes"), 100_000);
}
