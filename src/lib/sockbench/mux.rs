//! `sockbench mux`: seed 002's IO-multiplexing table. One receiver waits
//! on K UDP sockets with each of the server's receive methods (the very
//! loops `udp_server` runs, [`run_method`]), while a sender drives all K
//! sockets round-robin with a fixed payload and a fixed number of packets.
//!
//! Why a rate: seed 002 ran over a 1 Gbit/s wire, which paced its sender.
//! On loopback an unpaced sender is limited only by the CPU, and the loss
//! would measure the sender's speed more than the receiver's. With
//! `--rate` the sender is paced like a wire, and what the receive buffer
//! does is visible again: a small buffer overflows during the receiver's
//! scheduling hiccups, a large one absorbs them, and the loss falls to 0
//! as `--rcvbuf` grows, as in the seed's table.
//!
//! Loss is (sent − received) / sent over exact counts from both ends. Data
//! Mbit/s counts payload bytes; wire Mbit/s counts what each datagram
//! would occupy on Ethernet ([`wire_bytes`]: headers, preamble, gap, FCS
//! and fragmentation), both over the receiver's first-to-last datagram.

use crate::config::sockbench::{Conn, Ip};
use crate::config::sockbench::{MuxArgs, MuxSettings};
use crate::error::{Error, Result};
use crate::meter::recv::{run_method, Deliver, Method};
use crate::shutdown::Shutdown;
use crate::stats::wire_bytes;
use crate::sys::{self, RecvBatch, SchedPolicy};
use crate::units;
use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Most sockets one receiver waits on.
pub const MAX_SOCKETS: usize = 256;

/// One configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MuxCase {
    pub method: Method,
    pub sockets: usize,
    pub payload: usize,
    pub total: u64,
    pub rcvbuf: usize,
    pub scheduler: SchedPolicy,
    pub priority: i32,
    pub conn: Conn,
    /// Payload bits per second; 0 is unpaced.
    pub rate_bps: u64,
    pub ipv6: bool,
}

/// One row of results.
#[derive(Debug, Clone, Serialize)]
pub struct MuxRow {
    pub method: Method,
    pub sockets: usize,
    pub payload: usize,
    pub conn: Conn,
    pub scheduler: SchedPolicy,
    pub rate_mbit: f64,
    /// SO_RCVBUF asked for.
    pub rcvbuf: usize,
    /// What getsockopt(SO_RCVBUF) returned (Linux doubles the request for
    /// its bookkeeping).
    pub rcvbuf_granted: usize,
    pub sent_packets: u64,
    pub received_packets: u64,
    pub received_bytes: u64,
    pub loss_percent: f64,
    /// Receiver's first to last datagram.
    pub seconds: f64,
    pub data_mbit_per_s: f64,
    pub wire_mbit_per_s: f64,
    /// Sockets that received nothing (should be 0).
    pub idle_sockets: usize,
}

/// Counts per socket, and the first and last arrival; `run_method`'s
/// loops call it from one or many threads.
struct Counter {
    base: Instant,
    packets: Vec<AtomicU64>,
    bytes: Vec<AtomicU64>,
    first_ns: AtomicU64,
    last_ns: AtomicU64,
}

impl Counter {
    fn new(k: usize) -> Self {
        Counter {
            base: Instant::now(),
            packets: (0..k).map(|_| AtomicU64::new(0)).collect(),
            bytes: (0..k).map(|_| AtomicU64::new(0)).collect(),
            first_ns: AtomicU64::new(u64::MAX),
            last_ns: AtomicU64::new(0),
        }
    }

    fn total_packets(&self) -> u64 {
        self.packets.iter().map(|p| p.load(Ordering::Relaxed)).sum()
    }
}

impl Deliver for Counter {
    fn deliver(&self, index: usize, _socket: &Socket, batch: &RecvBatch, count: usize) {
        let bytes: usize = (0..count).map(|i| batch.datagram(i).data.len()).sum();
        if let (Some(p), Some(b)) = (self.packets.get(index), self.bytes.get(index)) {
            p.fetch_add(count as u64, Ordering::Relaxed);
            b.fetch_add(bytes as u64, Ordering::Relaxed);
        }
        let now = self.base.elapsed().as_nanos() as u64;
        self.first_ns.fetch_min(now, Ordering::Relaxed);
        self.last_ns.fetch_max(now, Ordering::Relaxed);
    }
}

/// The validated matrix.
#[derive(Debug, Clone)]
pub struct MuxMatrix {
    pub cases: Vec<MuxCase>,
}

impl MuxMatrix {
    /// Checks the flags and expands the axes: payload, connection mode,
    /// scheduler, receive buffer, then method innermost.
    pub fn from_args(a: &MuxSettings) -> Result<Self> {
        if a.sockets == 0 || a.sockets > MAX_SOCKETS {
            return Err(Error::usage(format!(
                "--sockets {}: must be between 1 and {MAX_SOCKETS}",
                a.sockets
            )));
        }
        if a.total == 0 || a.total > 1_000_000_000 {
            return Err(Error::usage(format!(
                "--total {}: must be between 1 and 1000000000 packets",
                a.total
            )));
        }
        let ipv6 = a.ip == Ip::V6;
        let limit = a.ip.max_payload();
        for &p in &a.payload {
            if p == 0 || p > limit as u64 {
                return Err(Error::usage(format!(
                    "--payload {p}: must be between 1 and {limit} bytes"
                )));
            }
        }
        for &b in &a.rcvbuf {
            if b == 0 || b > i32::MAX as u64 / 2 {
                return Err(Error::usage(format!(
                    "--rcvbuf {b}: must be between 1 and {}",
                    i32::MAX / 2
                )));
            }
        }
        for &m in &a.method {
            m.check_available()?;
        }
        // --priority applies to the realtime policies only; the others
        // run at 0 whatever it says.
        for &s in &a.scheduler {
            if s.priority_range().end() > &0 {
                crate::config::sched_from(Some(s), Some(a.priority))?;
            }
        }
        let mut cases = Vec::new();
        for &payload in &a.payload {
            for &conn in &a.conn {
                for &scheduler in &a.scheduler {
                    for &rcvbuf in &a.rcvbuf {
                        for &method in &a.method {
                            let priority = if scheduler.priority_range().end() > &0 {
                                a.priority
                            } else {
                                0
                            };
                            cases.push(MuxCase {
                                method,
                                sockets: a.sockets,
                                payload: payload as usize,
                                total: a.total,
                                rcvbuf: rcvbuf as usize,
                                scheduler,
                                priority,
                                conn,
                                rate_bps: a.rate,
                                ipv6,
                            });
                        }
                    }
                }
            }
        }
        Ok(MuxMatrix { cases })
    }
}

/// Tries each scheduler once on a scratch thread, so that a policy the
/// process may not use fails the run before any cell, with the reason.
pub fn check_schedulers(cases: &[MuxCase]) -> Result<()> {
    let mut seen: Vec<(SchedPolicy, i32)> = Vec::new();
    for c in cases {
        if seen.contains(&(c.scheduler, c.priority)) {
            continue;
        }
        seen.push((c.scheduler, c.priority));
        let (p, prio) = (c.scheduler, c.priority);
        std::thread::spawn(move || sys::apply_scheduler(p, prio))
            .join()
            .unwrap_or_else(|_| Err(Error::runtime("scheduler check panicked")))?;
    }
    Ok(())
}

fn loopback(ipv6: bool) -> SocketAddr {
    if ipv6 { Ip::V6 } else { Ip::V4 }.loopback(0)
}

/// A receive socket with the buffer asked for (forced past the sysctl
/// limit where allowed); returns the socket and what the kernel granted.
fn receive_socket(addr: SocketAddr, rcvbuf: usize) -> std::io::Result<(Socket, usize)> {
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    s.set_recv_buffer_size(rcvbuf)?;
    let full = if sys::RCVBUF_DOUBLES {
        rcvbuf.saturating_mul(2)
    } else {
        rcvbuf
    };
    if s.recv_buffer_size()? < full {
        let _ = sys::force_recv_buffer(&s, rcvbuf);
    }
    s.bind(&addr.into())?;
    let granted = s.recv_buffer_size()?;
    Ok((s, granted))
}

/// When packet `i` is due for a paced sender: `i × payload × 8 / rate`.
pub fn due(i: u64, payload: usize, rate_bps: u64) -> Duration {
    if rate_bps == 0 {
        return Duration::ZERO;
    }
    let bits = i as u128 * payload as u128 * 8;
    Duration::from_nanos((bits * 1_000_000_000 / rate_bps as u128).min(u64::MAX as u128) as u64)
}

/// Sends `total` packets round-robin over the targets; returns how many
/// went out. A full queue is retried, anything else fails.
fn send_all(case: &MuxCase, senders: &[(UdpSocket, SocketAddr)], stop: &Shutdown) -> Result<u64> {
    let connected = case.conn == Conn::Connected;
    let buf = vec![0x5Au8; case.payload];
    let start = Instant::now();
    let mut sent = 0u64;
    let k = senders.len();
    while sent < case.total {
        if stop.is_triggered() {
            break;
        }
        if case.rate_bps > 0 {
            let at = due(sent, case.payload, case.rate_bps);
            loop {
                let now = start.elapsed();
                if now >= at || stop.is_triggered() {
                    break;
                }
                if at - now > Duration::from_millis(1) {
                    // In slices: a slow rate must not outlast a signal.
                    let nap = at - now - Duration::from_micros(500);
                    std::thread::sleep(nap.min(Duration::from_millis(50)));
                } else {
                    std::hint::spin_loop();
                }
            }
            if stop.is_triggered() {
                break;
            }
        }
        let (sock, dest) = &senders[(sent % k as u64) as usize];
        let r = if connected {
            sock.send(&buf)
        } else {
            sock.send_to(&buf, dest)
        };
        match r {
            Ok(_) => sent += 1,
            Err(e)
                if matches!(
                    sys::classify_send_error(&e),
                    sys::SendFailure::QueueFull | sys::SendFailure::Interrupted
                ) =>
            {
                std::thread::yield_now()
            }
            Err(e) => return Err(Error::io(format!("mux sender: send to {dest} failed"), e)),
        }
    }
    Ok(sent)
}

/// Runs one configuration: receiver thread with the method and scheduler,
/// the sender on this thread, then a bounded drain.
pub fn run_case(case: &MuxCase, shutdown: &Shutdown) -> Result<MuxRow> {
    let addr = loopback(case.ipv6);
    let mut sockets = Vec::with_capacity(case.sockets);
    let mut granted = 0;
    let mut targets = Vec::with_capacity(case.sockets);
    for _ in 0..case.sockets {
        let (s, g) = receive_socket(addr, case.rcvbuf)
            .map_err(|e| Error::io(format!("mux: cannot open a receive socket on {addr}"), e))?;
        granted = g;
        targets.push(
            s.local_addr()
                .ok()
                .and_then(|a| a.as_socket())
                .ok_or_else(|| Error::runtime("mux: cannot read a receive socket's address"))?,
        );
        sockets.push(s);
    }
    let connected = case.conn == Conn::Connected;
    // Unconnected: one socket sends to every target. Connected: one each.
    let n_senders = if connected { case.sockets } else { 1 };
    let mut senders = Vec::with_capacity(case.sockets);
    for (i, &t) in targets.iter().enumerate() {
        if i < n_senders {
            let s = UdpSocket::bind(addr)
                .map_err(|e| Error::io("mux: cannot open a send socket", e))?;
            s.set_write_timeout(Some(Duration::from_millis(100)))
                .map_err(|e| Error::io("mux", e))?;
            if connected {
                s.connect(t)
                    .map_err(|e| Error::io(format!("mux: cannot connect to {t}"), e))?;
            }
            senders.push((s, t));
        } else {
            let s = senders[0].0.try_clone().map_err(|e| Error::io("mux", e))?;
            senders.push((s, t));
        }
    }
    let counter = Counter::new(case.sockets);
    let stop = Shutdown::new();
    let (sent, received) = std::thread::scope(|scope| {
        let receiver = scope.spawn(|| {
            sys::apply_scheduler(case.scheduler, case.priority)?;
            let refs: Vec<&Socket> = sockets.iter().collect();
            run_method(case.method, &refs, 0, &counter, &stop)
                .map_err(|e| Error::io(format!("mux: method {}", case.method.name()), e))
        });
        // Let the receiver reach its loop before the first datagram.
        std::thread::sleep(Duration::from_millis(20));
        let sent = send_all(case, &senders, shutdown);
        // Drain: until everything arrived, or nothing moved for 200 ms,
        // or 2 s passed.
        let sent_n = *sent.as_ref().unwrap_or(&0);
        let drain_start = Instant::now();
        let mut last = (counter.total_packets(), Instant::now());
        while !receiver.is_finished()
            && drain_start.elapsed() < Duration::from_secs(2)
            && !shutdown.is_triggered()
        {
            let now = counter.total_packets();
            if now >= sent_n {
                break;
            }
            if now != last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() > Duration::from_millis(200) {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.trigger();
        let received = receiver
            .join()
            .unwrap_or_else(|_| Err(Error::runtime("mux: the receiver panicked")));
        (sent, received)
    });
    received?;
    let sent = sent?;
    let packets = counter.total_packets();
    let bytes: u64 = counter
        .bytes
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .sum();
    let first = counter.first_ns.load(Ordering::Relaxed);
    let last = counter.last_ns.load(Ordering::Relaxed);
    let seconds = if packets > 1 && last > first {
        (last - first) as f64 / 1e9
    } else {
        0.0
    };
    let wire = packets * wire_bytes(case.payload as u64, case.ipv6);
    Ok(MuxRow {
        method: case.method,
        sockets: case.sockets,
        payload: case.payload,
        conn: case.conn,
        scheduler: case.scheduler,
        rate_mbit: case.rate_bps as f64 / 1e6,
        rcvbuf: case.rcvbuf,
        rcvbuf_granted: granted,
        sent_packets: sent,
        received_packets: packets,
        received_bytes: bytes,
        loss_percent: crate::stats::percent(sent.saturating_sub(packets), sent),
        seconds,
        data_mbit_per_s: units::per_second(bytes as f64 * 8.0, seconds) / 1e6,
        wire_mbit_per_s: units::per_second(wire as f64 * 8.0, seconds) / 1e6,
        idle_sockets: counter
            .packets
            .iter()
            .filter(|p| p.load(Ordering::Relaxed) == 0)
            .count(),
    })
}

/// What `sockbench mux` measured.
#[derive(Debug, Clone)]
pub struct MuxReport {
    pub rows: Vec<MuxRow>,
}

/// A cell in words, for the progress bar.
pub fn describe(c: &MuxCase) -> String {
    format!(
        "method={} rcvbuf={} scheduler={:?}",
        c.method.name(),
        crate::units::size_label(c.rcvbuf as u64),
        c.scheduler
    )
}

/// `sockbench mux`: validate, try the schedulers, then run every cell.
pub fn run(
    a: &MuxArgs,
    progress: &mut dyn crate::matrix::Progress,
    shutdown: &Shutdown,
) -> Result<MuxReport> {
    let m = MuxMatrix::from_args(&a.settings()?)?;
    check_schedulers(&m.cases)?;
    let rows =
        crate::matrix::run_matrix("mux", &m.cases, None, progress, shutdown, describe, |c| {
            run_case(c, shutdown)
        })?;
    Ok(MuxReport { rows })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_schedule() {
        assert_eq!(due(0, 64, 1_000_000), Duration::ZERO);
        // 125 packets of 1000 bytes at 1 Mbit/s: 1 s.
        assert_eq!(due(125, 1000, 1_000_000), Duration::from_secs(1));
        assert_eq!(due(5, 1000, 0), Duration::ZERO);
    }
}
