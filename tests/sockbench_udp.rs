//! `sockbench udp`: every backend, briefly, with the counts checked
//! against each other; the binary's output formats and its usage errors.

use netspeed::config::sockbench::{Conn, Ip, Reuse, SocketKind};
use netspeed::shutdown::Shutdown;
use netspeed::sockbench::udp::{run_case, Mode, Timing, UdpCase};
use std::process::Command;
use std::time::{Duration, Instant};

const ALL: [SocketKind; 5] = [
    SocketKind::Std,
    SocketKind::Socket2,
    SocketKind::Nix,
    SocketKind::Tokio,
    SocketKind::Async,
];

fn timing() -> Timing {
    Timing {
        warmup: Duration::from_millis(20),
        duration: Duration::from_millis(150),
    }
}

fn case(
    socket: SocketKind,
    threads: usize,
    conn: Conn,
    ip: Ip,
    payload: usize,
    reuse: Reuse,
) -> UdpCase {
    UdpCase {
        socket,
        threads,
        conn,
        ip,
        payload,
        reuse,
    }
}

/// What every row must satisfy, checked against what was asked for rather
/// than against the row's own derived fields: the row describes the case
/// that ran, the window lasted the requested duration, nothing is received
/// that was not sent, and the bandwidth is the received datagrams at the
/// requested payload over the window (so a count that includes warm-up
/// datagrams, partial reads or a wrong clock fails).
fn check(row: &netspeed::sockbench::udp::UdpRow, asked: &UdpCase, timing: &Timing) {
    assert_eq!(
        (
            row.socket,
            row.threads,
            row.conn,
            row.ip,
            row.payload,
            row.reuse
        ),
        (
            asked.socket,
            asked.threads,
            asked.conn,
            asked.ip,
            asked.payload,
            asked.reuse
        ),
        "{row:?}"
    );
    assert!(row.received_packets > 0, "{row:?}");
    assert!(row.sent_packets >= row.received_packets, "{row:?}");
    let window = timing.duration.as_secs_f64();
    assert!(
        row.seconds >= window && row.seconds < window + 0.25,
        "window of {window} s lasted {} s: {row:?}",
        row.seconds
    );
    let mbit = row.received_packets as f64 * asked.payload as f64 * 8.0 / row.seconds / 1e6;
    assert!(
        (row.mbit_per_s - mbit).abs() < 1e-6 * mbit.max(1.0),
        "{row:?}: expected {mbit} Mbit/s from the datagrams received"
    );
    let loss = (row.sent_packets - row.received_packets) as f64 * 100.0 / row.sent_packets as f64;
    assert!((row.loss_percent - loss).abs() < 1e-9, "{row:?}");
}

#[test]
fn every_backend_streams_and_counts_exactly() {
    let stop = Shutdown::new();
    for socket in ALL {
        for (conn, ip) in [(Conn::Unconnected, Ip::V4), (Conn::Connected, Ip::V6)] {
            let c = case(socket, 2, conn, ip, 300, Reuse::Port);
            let started = Instant::now();
            let row = run_case(&c, &timing(), &stop).unwrap_or_else(|e| panic!("{c:?}: {e}"));
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{c:?} took too long"
            );
            assert_eq!(row.mode, Mode::Stream);
            assert_eq!((row.senders, row.receivers), (1, 1));
            check(&row, &c, &timing());
        }
    }
}

#[test]
fn one_thread_is_a_labelled_ping_pong() {
    let stop = Shutdown::new();
    for socket in ALL {
        let c = case(socket, 1, Conn::Connected, Ip::V4, 26, Reuse::None);
        // One round trip at a time: a window long enough that a thread
        // descheduled on a busy machine (the async runtime's, beside two
        // CPU burners, sent nothing in 150 ms) still completes some.
        let long = Timing {
            duration: Duration::from_millis(600),
            ..timing()
        };
        let row = run_case(&c, &long, &stop).unwrap();
        assert_eq!(row.mode, Mode::PingPong);
        check(&row, &c, &long);
        // One datagram in flight: every one comes back.
        assert!(row.sent_packets - row.received_packets <= 1, "{row:?}");
        assert!(row.rtt_us.unwrap() > 0.0);
    }
}

#[test]
fn odd_threads_and_every_reuse_option_finish() {
    let stop = Shutdown::new();
    for (socket, reuse) in [
        (SocketKind::Std, Reuse::None),
        (SocketKind::Nix, Reuse::Addr),
        (SocketKind::Tokio, Reuse::Port),
        (SocketKind::Async, Reuse::None),
        (SocketKind::Socket2, Reuse::Addr),
    ] {
        let c = case(socket, 3, Conn::Unconnected, Ip::V4, 1460, reuse);
        let row = run_case(&c, &timing(), &stop).unwrap();
        assert_eq!((row.senders, row.receivers), (2, 1));
        check(&row, &c, &timing());
        let c = case(socket, 4, Conn::Connected, Ip::V4, 64, reuse);
        let row = run_case(&c, &timing(), &stop).unwrap();
        assert_eq!(row.rx_sockets, if reuse == Reuse::None { 1 } else { 2 });
        check(&row, &c, &timing());
    }
}

fn sockbench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sockbench"))
        .args(args)
        .output()
        .expect("run sockbench")
}

#[test]
fn json_csv_and_plot() {
    let dir = std::env::temp_dir().join(format!("sockbench-udp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("udp.svg");
    let common = [
        "udp",
        "--socket",
        "std,nix",
        "--threads",
        "2",
        "--conn",
        "connected",
        "--ip",
        "v4",
        "--payload",
        "64,1460",
        "--duration",
        "100ms",
        "--warmup",
        "10ms",
    ];
    let mut args = common.to_vec();
    args.extend(["--json", "--plot", svg.to_str().unwrap()]);
    let out = sockbench(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for r in rows {
        assert_eq!(
            r["received_bytes"].as_u64().unwrap(),
            r["received_packets"].as_u64().unwrap() * r["payload"].as_u64().unwrap()
        );
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("<svg") && text.contains("nix"));
    let mut args = common.to_vec();
    args.push("--csv");
    let out = sockbench(&args);
    assert!(out.status.success());
    let csv = String::from_utf8(out.stdout).unwrap();
    assert!(csv.starts_with("socket,mode,threads,"), "{csv}");
    assert_eq!(csv.lines().count(), 5);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn bad_input_is_exit_2_with_one_line() {
    for bad in [
        &["udp", "--socket", "java"][..],
        &["udp", "--threads", "0"],
        &["udp", "--payload", "0"],
        &["udp", "--payload", "70000"],
        &["udp", "--duration", "0s"],
        &["udp", "--reuse", "both"],
        &["udp", "--json", "--csv"],
        &["tcp", "--chunk", "0"],
        &["mux", "--method", "kqueue"],
        &["nonsense"],
    ] {
        let out = sockbench(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{bad:?}: {err}");
        assert!(err.contains("error"), "{bad:?}: {err}");
    }
}
