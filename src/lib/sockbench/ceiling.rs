//! `sockbench ceiling`: what the machine can do on netspeed's own path, with
//! the accounting taken out, so that every netspeed figure can be read as a
//! share of it.
//!
//! Why: a ratio against iperf3 says who is faster, not how much faster
//! either could be. This moves the same bytes over the same path as
//! `udp_client` and `udp_server` with their defaults (a connected socket,
//! sendmmsg batches, UDP GSO where a buffer holds two datagrams; recvmmsg
//! with UDP GRO through the server's own receive loop and socket setup),
//! but writes no header into a datagram and reads none: no sequence
//! tracking, no peer table, no pacing. What is left is the kernel's cost
//! and the loop around it. netspeed's rate over this one is what its
//! accounting costs.
//!
//! It also times one core's memcpy: loopback UDP copies every byte twice
//! (sender → kernel, kernel → receiver), so no socket path beats that.

use crate::config::ServerConfig;
use crate::error::{Error, Result};
use crate::meter::recv::Method;
use crate::meter::recv::{run_method, Deliver};
use crate::meter::send::{GsoChoice, GsoRequest, Transmitter};
use crate::shutdown::Shutdown;
use crate::sys::{self, RecvBatch};
use serde::Serialize;
use socket2::Socket;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One measured size.
#[derive(Debug, Clone, Serialize)]
pub struct CeilingRow {
    /// UDP payload bytes per datagram.
    pub size: usize,
    /// The send path, as `udp_client` names it (`sendmmsg+gso`, ...).
    pub send_path: String,
    /// Datagrams per GSO buffer (1 without GSO).
    pub segments: usize,
    pub sent_bytes: u64,
    pub received_bytes: u64,
    pub received_datagrams: u64,
    /// Received payload bits per second over the receiver's span (first
    /// to last arrival), as `udp_server` reports its rate.
    pub gbps: f64,
    /// Received datagrams per second, millions.
    pub mpps: f64,
    /// Received bytes as a share of sent: the rest was dropped.
    pub delivered: f64,
}

/// What `sockbench ceiling` measured.
#[derive(Debug, Clone, Serialize)]
pub struct CeilingReport {
    /// One core copying 64 KiB blocks through a buffer larger than its
    /// caches, in Gbit/s.
    pub memcpy_gbps: f64,
    pub rows: Vec<CeilingRow>,
}

/// Counts what arrives and nothing else: bytes, datagrams (a GRO buffer
/// is `len / segment` of them, rounded up) and the arrival span.
struct Count {
    base: Instant,
    bytes: AtomicU64,
    datagrams: AtomicU64,
    /// Nanoseconds after `base` of the first and the last arrival, +1 so
    /// that 0 means none yet.
    first: AtomicU64,
    last: AtomicU64,
}

impl Deliver for Count {
    fn deliver(&self, _: usize, _: &Socket, batch: &RecvBatch, count: usize) {
        let now = self.base.elapsed().as_nanos() as u64 + 1;
        let (mut bytes, mut datagrams) = (0u64, 0u64);
        for i in 0..count {
            let d = batch.datagram(i);
            bytes += d.data.len() as u64;
            datagrams += match d.segment_size {
                Some(s) if s > 0 => d.data.len().div_ceil(s) as u64,
                _ => 1,
            };
        }
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.datagrams.fetch_add(datagrams, Ordering::Relaxed);
        let _ = self
            .first
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        self.last.store(now, Ordering::Relaxed);
    }
}

/// Sends `size`-byte datagrams for `duration` on `udp_client`'s default
/// path to a receiver on `udp_server`'s default path, and counts.
pub fn run_size(size: usize, duration: Duration, shutdown: &Shutdown) -> Result<CeilingRow> {
    let server_cfg = ServerConfig {
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        listen_is_default: false,
        interval: None,
        ..Default::default()
    };
    let bound = crate::server::bind(&server_cfg)?.bound;
    let target = bound.addr;
    // udp_client's own socket setup, connected, as its default.
    let socket = crate::client::open_socket(target, true, false, None)?;
    let gso = GsoChoice {
        request: GsoRequest::Auto,
        max_payload: sys::MAX_UDP_PAYLOAD_V4,
        precise_pacing: false,
    };
    let batch = crate::config::DEFAULT_BATCH;
    let mut tx = Transmitter::new(&socket, target, true, size, batch, gso);
    let segments = tx.segments_per_message(sys::MAX_UDP_PAYLOAD_V4);
    let region = size * segments;
    let staging = vec![0x5au8; region * tx.batch()];
    let messages: Vec<&[u8]> = staging.chunks(region.max(1)).collect();

    let count = Count {
        base: Instant::now(),
        bytes: AtomicU64::new(0),
        datagrams: AtomicU64::new(0),
        first: AtomicU64::new(0),
        last: AtomicU64::new(0),
    };
    let receiver_stop = Shutdown::new();
    let sent_bytes = std::thread::scope(|s| -> Result<u64> {
        let receiver = s.spawn(|| {
            let sockets: Vec<&Socket> = bound.sockets.iter().collect();
            run_method(
                Method::default_for_platform(),
                &sockets,
                0,
                &count,
                &receiver_stop,
            )
        });
        let deadline = Instant::now() + duration;
        let mut sent = 0u64;
        let result = (|| {
            while Instant::now() < deadline && !shutdown.is_triggered() {
                let n = tx.send_all(&messages, shutdown)?;
                sent += (n * region) as u64;
            }
            Ok(())
        })();
        // Let what is in flight land, then stop the receiver.
        std::thread::sleep(Duration::from_millis(50));
        receiver_stop.trigger();
        let received = receiver.join();
        result?;
        match received {
            Ok(Ok(())) => Ok(sent),
            Ok(Err(e)) => Err(Error::io("the receiver failed", e)),
            Err(_) => Err(Error::runtime("the receiver panicked")),
        }
    })?;
    let bytes = count.bytes.load(Ordering::Relaxed);
    let datagrams = count.datagrams.load(Ordering::Relaxed);
    let (first, last) = (
        count.first.load(Ordering::Relaxed),
        count.last.load(Ordering::Relaxed),
    );
    let span = last.saturating_sub(first) as f64 / 1e9;
    let rate = |x: f64| if span > 0.0 { x / span } else { 0.0 };
    Ok(CeilingRow {
        size,
        send_path: tx.path().name,
        segments,
        sent_bytes,
        received_bytes: bytes,
        received_datagrams: datagrams,
        gbps: rate(bytes as f64 * 8.0) / 1e9,
        mpps: rate(datagrams as f64) / 1e6,
        delivered: if sent_bytes > 0 {
            bytes as f64 / sent_bytes as f64
        } else {
            0.0
        },
    })
}

/// One core copying 64 KiB blocks out of a 64 MiB buffer (larger than
/// the caches, as socket data is by the time it is read) into a 64 KiB
/// one, for `duration`: Gbit/s.
pub fn memcpy_gbps(duration: Duration) -> f64 {
    const BLOCK: usize = 64 << 10;
    const SOURCE: usize = 64 << 20;
    let source = vec![0x5au8; SOURCE];
    let mut target = vec![0u8; BLOCK];
    let start = Instant::now();
    let mut copied = 0u64;
    let mut offset = 0;
    while start.elapsed() < duration {
        for _ in 0..256 {
            target.copy_from_slice(&source[offset..offset + BLOCK]);
            offset = (offset + BLOCK) % SOURCE;
        }
        std::hint::black_box(&mut target);
        copied += 256 * BLOCK as u64;
    }
    copied as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9
}

/// `sockbench ceiling`: memcpy, then each size in turn.
pub fn run(
    sizes: &[usize],
    duration: Duration,
    progress: &mut dyn crate::matrix::Progress,
    shutdown: &Shutdown,
) -> Result<CeilingReport> {
    if let Some(&bad) = sizes
        .iter()
        .find(|&&s| s == 0 || s > sys::MAX_UDP_PAYLOAD_V4)
    {
        return Err(Error::usage(format!(
            "--size {bad}: must be between 1 and {}",
            sys::MAX_UDP_PAYLOAD_V4
        )));
    }
    let memcpy = memcpy_gbps(duration.min(Duration::from_secs(1)));
    let rows = crate::matrix::run_matrix(
        "ceiling",
        sizes,
        Some(duration * sizes.len() as u32),
        progress,
        shutdown,
        |size| format!("{size}-byte datagrams"),
        |&size| run_size(size, duration, shutdown),
    )?;
    Ok(CeilingReport {
        memcpy_gbps: memcpy,
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_arrives_and_names_the_path() {
        let row = run_size(1460, Duration::from_millis(200), &Shutdown::new()).unwrap();
        assert!(row.received_bytes > 0 && row.received_bytes <= row.sent_bytes);
        assert_eq!(row.received_bytes, row.received_datagrams * 1460);
        if sys::LINUX_SOCKETS {
            assert_eq!(row.send_path, "sendmmsg+gso");
            assert_eq!(row.segments, sys::MAX_UDP_PAYLOAD_V4 / 1460);
        }
        assert!(row.gbps > 0.0 && row.delivered <= 1.0);
        assert!(memcpy_gbps(Duration::from_millis(20)) > 0.0);
    }
}
