//! `sockbench udp`: seed 000's matrix of UDP socket libraries, finished.
//!
//! Each configuration runs unpaced senders, each on its own socket, into
//! receivers that share one address. Why each backend keeps its own socket
//! calls (and only those: the loops are shared, see `driver`): the point
//! of the suite is the cost of each library's own calls, so `std`
//! uses `std::net::UdpSocket`, `socket2` uses `socket2::Socket`, `nix` uses
//! `nix::sys::socket::{send, sendto, recv}` on an `OwnedFd`, `tokio` uses
//! `tokio::net::UdpSocket` on a multi-thread runtime, and `async` uses
//! smol's `Async<UdpSocket>` (async-io's reactor, no tokio). Only the
//! reuse options of `std`, `tokio` and `async` are set with socket2 before
//! binding, because those libraries have no call for them.
//!
//! How a datagram is counted: its first byte says whether it was sent in
//! the warm-up (0) or the measured window (1). Senders count what they
//! sent in the window; receivers count what they received that was sent in
//! the window, including stragglers read just after it closed. So the loss
//! `(sent − received) / sent` compares like with like, and the bandwidth
//! is payload bytes actually returned by `recv` (never the configured size)
//! over the window's length.
//!
//! With `--threads 1` there is no second thread to receive while one
//! sends: the row is a ping-pong (send one datagram, read it back, one in
//! flight) and is labelled so, with its mean round-trip time.
//!
//! Every loop is bounded: receive timeouts of [`POLL`], send timeouts,
//! and a drain of at most [`DRAIN_MAX`] after the window. Any error fails
//! the configuration (and the run) with a message naming the backend.
//!
//! # Files
//! - this file: the matrix, its rows, and one configuration's result.
//! - `driver`: the phases (set-up, tasks, clock, counts) and the send,
//!   receive and ping-pong loops, once for every library.
//! - `blocking`: the std, socket2 and nix calls.
//! - `runtimes`: the tokio and smol calls.

mod blocking;
mod driver;
mod runtimes;

use crate::config::sockbench::{Conn, Ip, Reuse, SocketKind, UdpArgs, UdpSettings};
pub use driver::{DRAIN_MAX, POLL};

use crate::config::{check_threads, MAX_THREADS};
use crate::error::{Error, Result};
use crate::shutdown::Shutdown;
use crate::units;
use serde::Serialize;
use std::time::Duration;

/// What a row measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Senders and receivers in parallel: throughput.
    Stream,
    /// One thread, one datagram in flight: latency-bound.
    PingPong,
}

/// One configuration of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpCase {
    pub socket: SocketKind,
    pub threads: usize,
    pub conn: Conn,
    pub ip: Ip,
    pub payload: usize,
    pub reuse: Reuse,
}

impl UdpCase {
    /// Senders and receivers for `threads`: receivers get the smaller half
    /// (3 is 2 + 1), and 1 thread is a ping-pong (one of each role, in
    /// turn, on the same thread).
    pub fn split(threads: usize) -> (usize, usize) {
        if threads <= 1 {
            return (1, 1);
        }
        let receivers = threads / 2;
        (threads - receivers, receivers)
    }

    pub fn mode(&self) -> Mode {
        if self.threads <= 1 {
            Mode::PingPong
        } else {
            Mode::Stream
        }
    }

    /// Receiving sockets: one with `--reuse none`, else one per receiver.
    pub fn rx_sockets(&self) -> usize {
        match self.reuse {
            Reuse::None => 1,
            _ => Self::split(self.threads).1,
        }
    }
}

/// The validated matrix.
#[derive(Debug, Clone)]
pub struct UdpMatrix {
    pub cases: Vec<UdpCase>,
    pub duration: Duration,
    pub warmup: Duration,
}

fn dedup<T: PartialEq + Copy>(v: &[T]) -> Vec<T> {
    let mut out = Vec::new();
    for &x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

impl UdpMatrix {
    /// Checks every axis and expands them in seed 000's order: payload
    /// outermost, then threads, IP version, connection mode, reuse, and
    /// socket type innermost.
    pub fn from_args(args: &UdpSettings) -> Result<Self> {
        if args.duration.is_zero() {
            return Err(Error::usage("--duration must be greater than 0"));
        }
        if args.duration > Duration::from_secs(3600) || args.warmup > Duration::from_secs(3600) {
            return Err(Error::usage("--duration and --warmup must be at most 1h"));
        }
        for &t in &args.threads {
            check_threads(t, MAX_THREADS)?;
        }
        let ips = dedup(&args.ip);
        // The smallest limit of the IP versions asked for.
        let (narrowest, family) = if ips.contains(&Ip::V4) {
            (Ip::V4, "IPv4")
        } else {
            (Ip::V6, "IPv6")
        };
        let limit = narrowest.max_payload();
        for &p in &args.payload {
            if p == 0 || p > limit as u64 {
                return Err(Error::usage(format!(
                    "--payload {p}: must be between 1 and {limit} bytes (the largest UDP datagram over {family})"
                )));
            }
        }
        let mut cases = Vec::new();
        for &payload in &dedup(&args.payload) {
            for &threads in &dedup(&args.threads) {
                for &ip in &ips {
                    for &conn in &dedup(&args.conn) {
                        for &reuse in &dedup(&args.reuse) {
                            for &socket in &dedup(&args.socket) {
                                cases.push(UdpCase {
                                    socket,
                                    threads,
                                    conn,
                                    ip,
                                    payload: payload as usize,
                                    reuse,
                                });
                            }
                        }
                    }
                }
            }
        }
        Ok(UdpMatrix {
            cases,
            duration: args.duration,
            warmup: args.warmup,
        })
    }

    /// A fair estimate of the run time: the window, the warm-up, and about
    /// 30 ms of set-up and drain per configuration.
    pub fn estimate(&self) -> Duration {
        (self.duration + self.warmup + Duration::from_millis(30)) * self.cases.len() as u32
    }
}

/// One row of results.
#[derive(Debug, Clone, Serialize)]
pub struct UdpRow {
    pub socket: SocketKind,
    pub mode: Mode,
    pub threads: usize,
    pub senders: usize,
    pub receivers: usize,
    /// Receiving sockets (1 with `--reuse none`).
    pub rx_sockets: usize,
    pub conn: Conn,
    pub ip: Ip,
    pub payload: usize,
    pub reuse: Reuse,
    /// Length of the measured window.
    pub seconds: f64,
    pub sent_packets: u64,
    pub received_packets: u64,
    /// Payload bytes returned by recv for datagrams sent in the window.
    pub received_bytes: u64,
    /// received_bytes × 8 / seconds / 1e6.
    pub mbit_per_s: f64,
    pub packets_per_s: f64,
    /// (sent − received) / sent × 100.
    pub loss_percent: f64,
    /// Receiver threads that got at least one datagram.
    pub active_receivers: usize,
    /// Ping-pong rows: mean round trip in microseconds.
    pub rtt_us: Option<f64>,
}

/// Warm-up and window lengths.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub warmup: Duration,
    pub duration: Duration,
}

/// Runs one configuration. Fails with a message naming the backend on any
/// socket error; never blocks longer than warm-up + window + drain.
pub fn run_case(case: &UdpCase, timing: &Timing, shutdown: &Shutdown) -> Result<UdpRow> {
    let outcome = match case.socket {
        SocketKind::Std => driver::run::<blocking::StdLib>(case, timing, shutdown),
        SocketKind::Socket2 => driver::run::<blocking::Socket2Lib>(case, timing, shutdown),
        SocketKind::Nix => driver::run::<blocking::NixLib>(case, timing, shutdown),
        SocketKind::Tokio => driver::run::<runtimes::TokioLib>(case, timing, shutdown),
        SocketKind::Async => driver::run::<runtimes::SmolLib>(case, timing, shutdown),
    }?;
    Ok(row(case, &outcome))
}

/// A configuration in words, for error messages and the progress bar.
pub fn describe(case: &UdpCase) -> String {
    format!(
        "socket={} threads={} conn={:?} ip={:?} payload={} reuse={:?}",
        case.socket.name(),
        case.threads,
        case.conn,
        case.ip,
        case.payload,
        case.reuse
    )
    .to_lowercase()
}

fn row(case: &UdpCase, o: &driver::Outcome) -> UdpRow {
    let (senders, receivers) = UdpCase::split(case.threads);
    let packets: u64 = o.rx.iter().map(|c| c.packets).sum();
    let bytes: u64 = o.rx.iter().map(|c| c.bytes).sum();
    UdpRow {
        socket: case.socket,
        mode: case.mode(),
        threads: case.threads,
        senders,
        receivers,
        rx_sockets: case.rx_sockets(),
        conn: case.conn,
        ip: case.ip,
        payload: case.payload,
        reuse: case.reuse,
        seconds: o.seconds,
        sent_packets: o.sent,
        received_packets: packets,
        received_bytes: bytes,
        mbit_per_s: units::per_second(bytes as f64 * 8.0, o.seconds) / 1e6,
        packets_per_s: units::per_second(packets as f64, o.seconds),
        loss_percent: crate::stats::percent(o.sent.saturating_sub(packets), o.sent),
        active_receivers: o.rx.iter().filter(|c| c.packets > 0).count(),
        rtt_us: (case.mode() == Mode::PingPong && packets > 0)
            .then(|| o.seconds * 1e6 / packets as f64),
    }
}

/// What `sockbench udp` measured, and the settings it ran with.
#[derive(Debug, Clone)]
pub struct UdpReport {
    pub rows: Vec<UdpRow>,
    pub duration: Duration,
    pub warmup: Duration,
    /// Configurations in the matrix (more than rows when interrupted).
    pub planned: usize,
}

/// `sockbench udp`: validate, then run the matrix.
pub fn run(
    args: &UdpArgs,
    progress: &mut dyn crate::matrix::Progress,
    shutdown: &Shutdown,
) -> Result<UdpReport> {
    let m = UdpMatrix::from_args(&args.settings()?)?;
    let timing = Timing {
        warmup: m.warmup,
        duration: m.duration,
    };
    let rows = crate::matrix::run_matrix(
        "udp",
        &m.cases,
        Some(m.estimate()),
        progress,
        shutdown,
        describe,
        |case| run_case(case, &timing, shutdown),
    )?;
    Ok(UdpReport {
        rows,
        duration: m.duration,
        warmup: m.warmup,
        planned: m.cases.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_split_has_no_idle_or_missing_role() {
        assert_eq!(UdpCase::split(1), (1, 1));
        assert_eq!(UdpCase::split(2), (1, 1));
        assert_eq!(UdpCase::split(3), (2, 1));
        assert_eq!(UdpCase::split(4), (2, 2));
        assert_eq!(UdpCase::split(5), (3, 2));
    }
}
