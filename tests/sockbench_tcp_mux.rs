//! `sockbench tcp` and `sockbench mux`, briefly: every TCP implementation
//! and duplex mode with exact byte counts, every receive method with exact
//! datagram counts.

mod common;

use netspeed::config::sockbench::Conn;
use netspeed::config::sockbench::{Duplex, Impl};
use netspeed::meter::recv::Method;
use netspeed::shutdown::Shutdown;
use netspeed::sockbench::mux::{self, MuxCase};
use netspeed::sockbench::tcp::{self, TcpCase};
use netspeed::sys::SchedPolicy;
use std::process::Command;

#[test]
fn every_tcp_implementation_moves_exact_bytes() {
    let stop = Shutdown::new();
    for implementation in [Impl::Std, Impl::TokioCt, Impl::TokioMt] {
        for duplex in [Duplex::Half, Duplex::Full] {
            for (chunk, concurrency) in [(40, 1), (4000, 5)] {
                let case = TcpCase {
                    implementation,
                    duplex,
                    chunk,
                    concurrency,
                    bytes: 100_003,
                    nodelay: false,
                    congestion: None,
                };
                // run_cell checks every sample moved bytes × conns × dirs.
                let times =
                    tcp::run_cell(&case, 3, &stop).unwrap_or_else(|e| panic!("{case:?}: {e}"));
                assert_eq!(times.len(), 3);
                assert!(times.iter().all(|&t| t > 0.0));
            }
        }
    }
}

#[test]
fn tcp_binary_reports_statistics() {
    let out = Command::new(env!("CARGO_BIN_EXE_sockbench"))
        .args([
            "tcp",
            "--impl",
            "std",
            "--duplex",
            "full",
            "--chunk",
            "4000",
            "--concurrency",
            "5",
            "--bytes",
            "200K",
            "--samples",
            "5",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = &doc["rows"][0];
    assert_eq!(row["bytes_per_sample"].as_u64(), Some(2 * 5 * 200_000));
    assert_eq!(row["samples"].as_u64(), Some(5));
    for key in [
        "mean_ms",
        "std_dev_ms",
        "min_ms",
        "max_ms",
        "outlier_variance_percent",
    ] {
        assert!(row[key].as_f64().is_some(), "{key}");
    }
    assert!(row["min_ms"].as_f64() <= row["mean_ms"].as_f64());
}

#[test]
fn every_mux_method_counts_exactly() {
    let stop = Shutdown::new();
    for method in Method::ALL {
        let case = MuxCase {
            method,
            sockets: 3,
            payload: 200,
            total: 3000,
            rcvbuf: 4 << 20,
            scheduler: SchedPolicy::Other,
            priority: 0,
            conn: if method == Method::Epoll {
                Conn::Connected
            } else {
                Conn::Unconnected
            },
            rate_bps: 50_000_000,
            ipv6: false,
        };
        let row = mux::run_case(&case, &stop).unwrap_or_else(|e| panic!("{method:?}: {e}"));
        assert_eq!(row.sent_packets, 3000, "{row:?}");
        assert_eq!(row.received_bytes, row.received_packets * 200, "{row:?}");
        assert!(row.received_packets <= 3000);
        // A paced sender into a 4 MB buffer loses nothing on loopback.
        assert_eq!(row.received_packets, 3000, "{row:?}");
        assert_eq!(row.idle_sockets, 0, "{row:?}");
        assert!(row.wire_mbit_per_s > row.data_mbit_per_s);
    }
}

/// `sockbench tcp --congestion` reaches both ends of its connections, as
/// the kernel reports them (`ss -tinp`) while a long transfer runs; the
/// run is killed as soon as that is seen.
#[test]
fn tcp_congestion_reaches_the_sockets() {
    let (default, algo) = common::congestion_other_than_default();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sockbench"));
    cmd.args([
        "tcp",
        "--impl",
        "std",
        "--duplex",
        "half",
        "--chunk",
        "65536",
        "--concurrency",
        "1",
        "--bytes",
        "20G",
        "--samples",
        "1",
        "--quiet",
        "--congestion",
        algo,
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    let guard = common::ChildGuard::spawn(&mut cmd, "sockbench");
    let owner = format!("pid={},", guard.id());
    let mut seen = Vec::new();
    common::poll_every(
        std::time::Duration::from_millis(20),
        std::time::Duration::from_secs(30),
        || {
            seen = common::congestion_of_sockets(&[], &owner, &[algo, &default]);
            seen.len() >= 2
        },
    );
    guard.signal(libc::SIGKILL);
    assert!(
        seen.len() >= 2,
        "never saw both ends of a connection: {seen:?}"
    );
    assert!(
        seen.iter().all(|a| a == algo),
        "{seen:?} (asked for {algo})"
    );
}
