//! A newcomer's first runs (issue 28): the defaults against each other lose
//! nothing and print no absurd rate; the server's default receive buffer
//! is the largest the system allows, and says once how to raise the limit
//! when that is less than it asks for; `--local` never blames a network
//! that is not there. The real binaries on loopback.

mod common;

use common::udp::{client, f, u, Server, CLIENT, SERVER, WAIT};
use common::{args, run_bounded, ChildGuard};
use std::process::{Command, Stdio};

/// What udp_server asks for by default (16 MiB; Linux reports it doubled).
const DEFAULT_RECV_BUFFER: u64 = 16 << 20;

#[test]
fn the_default_client_against_the_default_server_loses_nothing() {
    // Seed 001's defaults: 1,000,000 bytes in 5000-byte datagrams, unpaced,
    // in well under a millisecond. Into the system's default buffer
    // (212,992 bytes) this lost 26-74 %.
    let server = Server::start_args(&["--listen", "127.0.0.1:0"]);
    let listening = server.events.borrow()[0].clone();
    let granted = u(&listening["recv_buffer"], "granted");
    // As root (the tests run as root): forced past net.core.rmem_max.
    assert_eq!(granted, 2 * DEFAULT_RECV_BUFFER, "{listening}");
    assert_eq!(listening["recv_buffer"]["forced"], true, "{listening}");
    for run in 0..3 {
        let report = client(&["-s", &server.addr]);
        assert_eq!(u(&report, "sent_packets"), 200, "run {run}: {report}");
        let v = &report["server"];
        assert_eq!(u(v, "received_packets"), 200, "run {run}: {report}");
        assert_eq!(u(v, "lost_packets"), 0, "run {run}: {report}");
        // No absurd rate: a rate is shown only over a span it can be
        // timed on, and then it is one loopback can carry.
        for gbps in [&report["gbps"], &v["gbps"]] {
            assert!(
                gbps.is_null() || gbps.as_f64().unwrap() < 400.0,
                "run {run}: {gbps} Gbit/s: {report}"
            );
        }
        for i in report["clients"][0]["intervals"].as_array().unwrap() {
            let span = f(i, "end") - f(i, "start");
            assert!(
                span >= 0.001 || i["gbps"].is_null(),
                "an interval of {span} s with a rate: {i}"
            );
        }
    }
}

#[test]
fn the_default_run_in_text_shows_no_rate_it_cannot_time() {
    let server = Server::start_args(&["--listen", "127.0.0.1:0"]);
    let mut cmd = Command::new(CLIENT);
    cmd.args(["-s", &server.addr]);
    let out = run_bounded(&mut cmd, WAIT);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    for line in text.lines() {
        // "0.00-0.00 s ... 45.123 Gbit/s" beside a summary of "rate
        // unknown" was the contradiction.
        assert!(
            !(line.contains("0.00-0.00 s") && line.contains("bit/s")),
            "a rate over no time: {line}\n{text}"
        );
        assert!(
            !line.contains("fell behind by 0.000 s"),
            "a shortfall of nothing: {line}"
        );
        assert!(!line.contains("about 0 datagrams"), "{line}");
    }
    // Too short to time: it says so, with the flags that fix it.
    assert!(
        text.contains("--duration 10s") && text.contains("-t 1G"),
        "no advice for a run too short to time:\n{text}"
    );
}

#[test]
fn without_privilege_the_server_takes_what_the_limit_allows_and_names_the_sysctl() {
    let setpriv = std::path::Path::new("/usr/bin/setpriv");
    assert!(
        setpriv.exists(),
        "this test needs setpriv (util-linux) to drop privileges"
    );
    let rmem_max: u64 = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .expect("net.core.rmem_max")
        .trim()
        .parse()
        .unwrap();
    assert!(
        rmem_max < DEFAULT_RECV_BUFFER,
        "net.core.rmem_max is {rmem_max}: the default is not capped here, so this test proves nothing"
    );
    let mut cmd = Command::new(setpriv);
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        SERVER,
        "--listen",
        "127.0.0.1:0",
        "--json",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut guard = ChildGuard::spawn(&mut cmd, "udp_server as nobody");
    let lines = guard.stdout_lines();
    let err = guard.stderr_lines();
    let listening = lines.listening(WAIT, "udp_server");
    let buffer = &listening["recv_buffer"];
    // The most the limit allows (doubled), not the system's default.
    assert_eq!(u(buffer, "granted"), 2 * rmem_max, "{listening}");
    assert_eq!(buffer["forced"], false, "{listening}");
    let warning = err
        .wait_for(WAIT, |l| l.contains("warning"))
        .unwrap_or_else(|| panic!("no warning on stderr: {}", err.transcript()));
    assert!(
        warning.contains("sysctl -w net.core.rmem_max=16777216"),
        "{warning}"
    );
    drop(guard);
    // Once: one line, not one per socket or per peer.
    assert_eq!(
        err.seen().iter().filter(|l| l.contains("rmem_max")).count(),
        1,
        "{}",
        err.transcript()
    );
}

#[test]
fn local_never_blames_a_network_that_is_not_there() {
    // Unpaced, for a second: whatever the in-process server could not take
    // in (a 2-core machine often cannot take all of it) is this host's
    // limit, said as such, never "lost on the way".
    for run in 0..2 {
        let report = client(&args("--local --duration 1s -b 1400"));
        let v = &report["server"];
        let lost = u(v, "lost_packets");
        assert_ne!(
            report["limited_by"]["cause"], "network",
            "run {run}: {report}"
        );
        let local_note = report["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().starts_with("--local: no network"));
        assert_eq!(local_note, lost > 0, "run {run}: {report}");
        if lost > 0 {
            // The split puts it in the socket (GRO makes it an estimate).
            assert!(
                u(v, "lost_in_socket") >= lost * 9 / 10,
                "run {run}: {report}"
            );
        }
    }
}
