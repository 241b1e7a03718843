//! A meter that does not disturb what it measures (issue 13): CPU cost in
//! every report, on both ends, and neither end spinning when there is
//! nothing to do. These are checks of behaviour, not benchmarks:
//! `bench/cpu-cost.sh` compares the cost with iperf3's.

mod common;

use common::args;
use common::udp::{client, f, u, Server};
use serde_json::Value;
use std::time::{Duration, Instant};

/// One second of 1400-byte datagrams at `rate` to a fresh server.
fn paced_second(rate: &str) -> (Server, Value) {
    let server = Server::loopback();
    let report = client(&[
        "-s",
        &server.addr,
        "-b",
        "1400",
        "--rate",
        rate,
        "--duration",
        "1s",
    ]);
    (server, report)
}

/// A CPU figure is well formed: non-negative parts that add up, and no more
/// CPU than `threads` threads can spend in `wall` seconds (with a little
/// slack for the sampling granularity).
fn check_cpu(cpu: &Value, wall: f64, threads: f64, what: &str) {
    assert!(cpu.is_object(), "{what}: no cpu figure: {cpu}");
    let seconds = f(cpu, "seconds");
    assert!(seconds >= 0.0, "{what}: {cpu}");
    if let (Some(user), Some(system)) =
        (cpu["user_seconds"].as_f64(), cpu["system_seconds"].as_f64())
    {
        assert!(user >= 0.0 && system >= 0.0, "{what}: {cpu}");
        assert!((user + system - seconds).abs() < 1e-6, "{what}: {cpu}");
    }
    assert!(
        seconds <= wall * threads + 0.005,
        "{what}: {seconds} CPU-s in {wall} s on {threads} thread(s): {cpu}"
    );
    if let Some(p) = cpu["percent_of_core"].as_f64() {
        assert!(p >= 0.0, "{what}: {cpu}");
    }
}

#[test]
fn cpu_is_reported_on_both_ends_and_in_every_line() {
    let started = Instant::now();
    let server = Server::start_args(&args(
        "--listen 127.0.0.1:0 --interval 200ms --recv-buffer-size 4M",
    ));
    let report = server.client("-b 1400 --rate 100Mbit --duration 1s --clients 2");
    for c in report["clients"].as_array().unwrap() {
        check_cpu(&c["cpu"], f(c, "seconds") + 0.01, 1.0, "client");
        let answer = &c["server"];
        check_cpu(
            &answer["cpu"],
            f(answer, "seconds") + 0.01,
            1.0,
            "its server side",
        );
        assert!(answer["cpu"]["seconds_per_gb"].is_number(), "{answer}");
    }
    check_cpu(
        &report["cpu"],
        f(&report, "seconds") + 0.01,
        2.0,
        "all clients",
    );
    check_cpu(
        &report["server"]["cpu"],
        f(&report["server"], "seconds") + 0.01,
        1.0,
        "the server over both",
    );
    let session = report["clients"][0]["session"]
        .as_str()
        .unwrap()
        .to_string();
    let done = server.done_for(&session);
    check_cpu(&done["cpu"], f(&done, "seconds") + 0.2, 1.0, "peer_done");
    let events = server.stop();
    let wall = started.elapsed().as_secs_f64();
    let intervals: Vec<&Value> = events
        .iter()
        .filter(|v| v["event"] == "interval" && v["session"] == session.as_str())
        .collect();
    assert!(intervals.len() >= 3, "{intervals:?}");
    for v in intervals {
        check_cpu(&v["cpu"], f(v, "seconds"), 1.0, "interval");
    }
    let down = events.last().unwrap();
    // The process: one receive thread and the main thread.
    check_cpu(&down["cpu"], wall, 2.0, "shutdown");
    check_cpu(&down["receive_cpu"], wall, 1.0, "shutdown, receive threads");
}

#[test]
fn a_paced_sender_sleeps_between_its_batches() {
    // 1400 B at 200 Mbit/s: 18,000 datagrams a second, 56 µs apart. A
    // sender that spins to each one uses a whole core (it did).
    let (_server, report) = paced_second("200Mbit");
    let c = &report["clients"][0];
    let cpu = f(&c["cpu"], "percent_of_core");
    assert!(cpu < 50.0, "the paced sender used {cpu}% of a core");
    assert_eq!(c["pacing"]["mode"], "batches", "{c}");
    assert_eq!(u(&report["server"], "lost_packets"), 0);
    // The rate is held, except for any stall the sender admits to (on a
    // busy host it can be descheduled; it then reports the time it fell
    // behind instead of bursting to catch up).
    let behind = f(&c["pacing"], "behind_seconds");
    let expected = 0.2 * (1.0 - behind).max(0.0);
    let gbps = f(&report["server"], "gbps");
    assert!(
        (gbps / expected - 1.0).abs() < 0.03,
        "{gbps} Gbit/s, expected {expected} (fell behind {behind} s)"
    );
}

#[test]
fn the_receiver_sleeps_when_there_is_nothing_to_read() {
    // 100 Mbit/s of 1400-byte datagrams: one every 112 µs. A receiver that
    // polls for 50 µs after each read spent half a core on it (it did).
    let (server, report) = paced_second("100Mbit");
    let session = report["clients"][0]["session"]
        .as_str()
        .unwrap()
        .to_string();
    let done = server.done_for(&session);
    let cpu = f(&done["cpu"], "percent_of_core");
    assert!(
        cpu < 25.0,
        "the receive thread used {cpu}% of a core: {done}"
    );
    // An idle server costs (almost) nothing.
    let idle = Server::start("127.0.0.1:0", &[]);
    // The idle period is what is measured, so it is a plain pause.
    std::thread::sleep(Duration::from_millis(1500));
    let events = idle.stop();
    let down = events.last().unwrap();
    assert!(
        f(&down["cpu"], "seconds") < 0.1,
        "an idle server used {down}"
    );
}
