//! `udp_client`: send an exact volume, pace it, survive a full queue, then
//! ask the server what arrived.
//!
//! Each client socket runs in its own thread ([`run_one`]) and is its own
//! peer at the server (its own session id). The send loop never skips a
//! datagram: on ENOBUFS or EAGAIN it backs off exponentially (capped, reset
//! after a success) and sends the same datagram again, counting the
//! back-offs and the time spent in them.

mod pacing;
pub mod send;

use crate::config::{ClientConfig, Volume};
use crate::error::{Error, Result};
use crate::progress::Progress;
use crate::server::BufferGrant;
use crate::shutdown::Shutdown;
use crate::sys;
use crate::units;
use crate::wire::{self, End, Header, Message};
use pacing::Pacer;
use send::{SendPath, Transmitter};
use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// End-of-test attempts within `--end-timeout`.
const END_ATTEMPTS: u32 = 5;

/// What the server said it received for one session.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ServerView {
    pub received_packets: u64,
    pub received_bytes: u64,
    pub lost_packets: u64,
    pub loss_percent: f64,
    pub duplicates: u64,
    pub reordered: u64,
    pub jitter_ms: f64,
    /// Receive rate: bytes over the server's first-to-last datagram time.
    pub gbps: f64,
    pub seconds: f64,
    /// Drops on the server's socket while this session ran; absent when
    /// the server cannot know.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_drops: Option<u64>,
    /// The server had UDP_GRO on: `kernel_drops` counts dropped buffers of
    /// up to 64 KiB of datagrams each, not datagrams.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub kernel_drops_are_buffers: bool,
}

/// One client socket's result.
#[derive(Debug, Clone, Serialize)]
pub struct ClientReport {
    pub session: String,
    pub local_addr: String,
    pub sent_packets: u64,
    pub sent_bytes: u64,
    /// Datagrams too short to carry a header (counted, not sequence-checked).
    pub untagged_packets: u64,
    pub seconds: f64,
    pub gbps: f64,
    pub enobufs_retries: u64,
    pub backoff_seconds: f64,
    /// How the datagrams were really sent: batch, GSO, fallbacks.
    pub send_path: SendPath,
    /// SO_SNDBUF as granted, when --sndbuf was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sndbuf: Option<BufferGrant>,
    #[serde(skip)]
    started: Instant,
    #[serde(skip)]
    finished: Instant,
    pub server: Option<ServerView>,
}

/// The whole run: every client socket, and their totals.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub server_addr: String,
    pub buffer_size: usize,
    pub connected: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_bps: Option<u64>,
    pub sent_packets: u64,
    pub sent_bytes: u64,
    /// Wall time from the first client's first send to the last one's end.
    pub seconds: f64,
    /// Send rate over `seconds` (sender side).
    pub gbps: f64,
    pub enobufs_retries: u64,
    pub backoff_seconds: f64,
    /// Sums over the clients the server answered for; null if none did.
    pub server: Option<ServerView>,
    pub clients_answered: usize,
    pub clients: Vec<ClientReport>,
    /// Things the user should know about how the run went.
    pub notes: Vec<String>,
}

fn random_session() -> u64 {
    // RandomState is seeded from the OS once per process and per-thread
    // incremented, so distinct clients get distinct ids.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// Creates a client socket for `server`.
fn open_socket(server: SocketAddr, connected: bool, dont_fragment: bool) -> Result<UdpSocket> {
    let socket = Socket::new(
        Domain::for_address(server),
        Type::DGRAM,
        Some(Protocol::UDP),
    )
    .map_err(|e| Error::runtime(format!("cannot create a UDP socket: {e}")))?;
    let any: SocketAddr = if server.is_ipv6() {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    };
    socket
        .bind(&any.into())
        .map_err(|e| Error::runtime(format!("cannot bind a client socket: {e}")))?;
    // Without this, Linux silently drops datagrams its own queue refused.
    let _ = sys::enable_send_errors(&socket);
    if dont_fragment {
        sys::set_dont_fragment(&socket, server.is_ipv6())
            .map_err(|e| Error::runtime(format!("cannot set the don't-fragment option: {e}")))?;
    }
    if connected {
        socket
            .connect(&server.into())
            .map_err(|e| Error::runtime(format!("cannot connect to {server}: {e}")))?;
    }
    Ok(socket.into())
}

/// Sends end-of-test messages until the server answers or time runs out.
fn end_of_test(
    socket: &UdpSocket,
    tx: &mut Transmitter,
    end: &End,
    timeout: Duration,
) -> Option<wire::EndAck> {
    tx.end_gso();
    let message = wire::encode_end(end);
    let per_attempt = timeout / END_ATTEMPTS;
    let mut buf = [0u8; 256];
    for _ in 0..END_ATTEMPTS {
        // A refusal here is counted by the transmitter; keep listening.
        let _ = tx.send_control(&message);
        let deadline = Instant::now() + per_attempt;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let _ = socket.set_read_timeout(Some(left));
            let n = match socket.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                    tx.refused += 1;
                    continue;
                }
                Err(_) => continue,
            };
            if let Ok(Message::EndAck(ack)) = wire::decode(&buf[..n]) {
                if ack.session == end.header.session {
                    return Some(ack);
                }
            }
        }
    }
    None
}

/// Fills `buf` with bytes that do not compress, so that a compressing link
/// cannot overstate the rate.
fn fill_incompressible(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for byte in buf {
        // xorshift64
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *byte = x as u8;
    }
}

/// Plans the datagrams of the next call: fills `lengths` with up to
/// `count` datagram sizes that `volume` still allows.
fn plan(
    volume: Volume,
    size: usize,
    sent_packets: u64,
    sent_bytes: u64,
    started: Instant,
    count: usize,
    lengths: &mut Vec<usize>,
) {
    lengths.clear();
    let (mut packets, mut bytes) = (sent_packets, sent_bytes);
    if let Volume::Time(d) = volume {
        if started.elapsed() >= d {
            return;
        }
    }
    while lengths.len() < count {
        let len = match volume {
            Volume::Bytes(total) if bytes < total => (total - bytes).min(size as u64) as usize,
            Volume::Packets(n) if packets < n => size,
            Volume::Time(_) => size,
            _ => break,
        };
        lengths.push(len);
        packets += 1;
        bytes += len as u64;
    }
}

/// Runs one client socket to the end and asks the server for its figures.
pub fn run_one(
    cfg: &ClientConfig,
    shutdown: &Shutdown,
    progress: &Progress,
) -> Result<ClientReport> {
    let socket = open_socket(cfg.server, cfg.connected, cfg.dont_fragment)?;
    let sndbuf = match cfg.sndbuf {
        Some(want) => Some(size_send_buffer(&socket, want)?),
        None => None,
    };
    let local_addr = socket
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let session = random_session();
    let size = cfg.buffer_size;
    let mut tx = Transmitter::new(&socket, cfg.server, cfg.connected, size, cfg.batch, cfg.gso);
    tx.dont_fragment = cfg.dont_fragment;
    let max_payload = if cfg.server.is_ipv4() {
        sys::MAX_UDP_PAYLOAD_V4
    } else {
        sys::MAX_UDP_PAYLOAD_V6
    };
    // One region per message of a call, each room for a full GSO buffer.
    let region = size.max(1) * tx.segments_per_message(max_payload);
    let mut staging = vec![0u8; region * tx.batch()];
    fill_incompressible(&mut staging, session);
    let mut lengths = Vec::new();
    let mut message_ends: Vec<usize> = Vec::new();
    let mut pacer = cfg.rate_bps.map(Pacer::new);
    let (mut packets, mut bytes, mut untagged) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let mut last_send = start;
    while !shutdown.is_triggered() {
        let per_message = tx.segments_per_message(max_payload);
        plan(
            cfg.volume,
            size,
            packets,
            bytes,
            start,
            per_message * tx.batch(),
            &mut lengths,
        );
        if lengths.is_empty() {
            break;
        }
        if let Some(p) = pacer.as_mut() {
            p.wait_until_due(bytes);
        }
        // Lay the datagrams out: message m holds datagrams
        // [m * per_message, (m + 1) * per_message), back to back.
        let now_ns = start.elapsed().as_nanos() as u64;
        message_ends.clear();
        let mut tagged_misses = 0;
        for (m, chunk) in lengths.chunks(per_message).enumerate() {
            let mut offset = m * region;
            for (k, &len) in chunk.iter().enumerate() {
                let header = Header {
                    session,
                    seq: packets + (m * per_message + k) as u64,
                    send_time_ns: now_ns,
                };
                if !wire::write_data_header(&mut staging[offset..offset + len], &header) {
                    tagged_misses += 1;
                }
                offset += len;
            }
            message_ends.push(offset);
        }
        let message_count = message_ends.len();
        let sent_messages = if message_count == 1 {
            // The common one-datagram-per-call path: no allocation.
            tx.send_all(&[&staging[..message_ends[0]]], shutdown)?
        } else {
            let messages: Vec<&[u8]> = message_ends
                .iter()
                .enumerate()
                .map(|(m, &end)| &staging[m * region..end])
                .collect();
            tx.send_all(&messages, shutdown)?
        };
        let sent: &[usize] = if sent_messages == message_count {
            &lengths
        } else {
            &lengths[..(sent_messages * per_message).min(lengths.len())]
        };
        let sent_bytes: u64 = sent.iter().map(|&l| l as u64).sum();
        packets += sent.len() as u64;
        bytes += sent_bytes;
        untagged += if sent.len() == lengths.len() {
            tagged_misses
        } else {
            sent.iter().filter(|&&l| l < wire::HEADER_LEN).count() as u64
        };
        progress.add(sent_bytes);
        last_send = Instant::now();
        if sent_messages < message_count {
            break;
        }
    }
    let send_seconds = last_send.duration_since(start).as_secs_f64();
    let end = End {
        header: Header {
            session,
            seq: packets,
            send_time_ns: start.elapsed().as_nanos() as u64,
        },
        sent_packets: packets,
        sent_bytes: bytes,
        duration_ns: (send_seconds * 1e9) as u64,
    };
    let ack = end_of_test(&socket, &mut tx, &end, cfg.end_timeout);
    if ack.is_none() && tx.refused > 0 {
        return Err(tx.nobody_listening());
    }
    let server = ack.map(|a| {
        let seconds = a.first_to_last_ns as f64 / 1e9;
        ServerView {
            received_packets: a.received_packets,
            received_bytes: a.received_bytes,
            lost_packets: a.lost,
            loss_percent: if packets == 0 {
                0.0
            } else {
                a.lost as f64 * 100.0 / packets as f64
            },
            duplicates: a.duplicates,
            reordered: a.reordered,
            jitter_ms: a.jitter_ns as f64 / 1e6,
            gbps: units::gbps(a.received_bytes, seconds),
            seconds,
            kernel_drops: (a.kernel_drops != wire::UNKNOWN).then_some(a.kernel_drops),
            kernel_drops_are_buffers: a.flags & wire::ACK_FLAG_GRO != 0,
        }
    });
    Ok(ClientReport {
        session: format!("{session:016x}"),
        local_addr,
        sent_packets: packets,
        sent_bytes: bytes,
        untagged_packets: untagged,
        seconds: send_seconds,
        gbps: units::gbps(bytes, send_seconds),
        enobufs_retries: tx.enobufs_retries,
        backoff_seconds: tx.backoff_time.as_secs_f64(),
        send_path: tx.path(),
        sndbuf,
        started: start,
        finished: last_send,
        server,
    })
}

/// Runs `cfg.clients` client sockets at once and sums their reports.
pub fn run(cfg: &ClientConfig, shutdown: &Shutdown) -> Result<RunReport> {
    let total = match cfg.volume {
        Volume::Bytes(t) => Some(t * cfg.clients as u64),
        Volume::Packets(n) => Some(n * cfg.buffer_size as u64 * cfg.clients as u64),
        Volume::Time(_) => None,
    };
    let progress = Progress::new(total, !cfg.quiet && !cfg.json);
    let results: Vec<Result<ClientReport>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..cfg.clients)
            .map(|_| scope.spawn(|| run_one(cfg, shutdown, &progress)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::runtime("a client thread panicked")))
            })
            .collect()
    });
    progress.finish();
    let clients = results.into_iter().collect::<Result<Vec<_>>>()?;
    Ok(summarise(cfg, clients))
}

fn summarise(cfg: &ClientConfig, clients: Vec<ClientReport>) -> RunReport {
    let sent_packets = clients.iter().map(|c| c.sent_packets).sum();
    let sent_bytes: u64 = clients.iter().map(|c| c.sent_bytes).sum();
    // From the first client's first send to the last one's last send.
    let first = clients.iter().map(|c| c.started).min();
    let last = clients.iter().map(|c| c.finished).max();
    let seconds = match (first, last) {
        (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    let answered: Vec<&ServerView> = clients.iter().filter_map(|c| c.server.as_ref()).collect();
    let server = (!answered.is_empty()).then(|| {
        let mut s = ServerView::default();
        for v in &answered {
            s.received_packets += v.received_packets;
            s.received_bytes += v.received_bytes;
            s.lost_packets += v.lost_packets;
            s.duplicates += v.duplicates;
            s.reordered += v.reordered;
            s.jitter_ms = s.jitter_ms.max(v.jitter_ms);
            // Concurrent sessions: rates add up, like iperf3's -P sum.
            s.gbps += v.gbps;
            s.seconds = s.seconds.max(v.seconds);
            s.kernel_drops = v.kernel_drops.max(s.kernel_drops);
            s.kernel_drops_are_buffers |= v.kernel_drops_are_buffers;
        }
        let answered_sent: u64 = clients
            .iter()
            .filter(|c| c.server.is_some())
            .map(|c| c.sent_packets)
            .sum();
        s.loss_percent = if answered_sent == 0 {
            0.0
        } else {
            s.lost_packets as f64 * 100.0 / answered_sent as f64
        };
        s
    });
    let mut notes = Vec::new();
    let untagged: u64 = clients.iter().map(|c| c.untagged_packets).sum();
    if untagged > 0 {
        notes.push(format!(
            "{untagged} datagrams were shorter than the {}-byte header: the server counts them, but cannot check them for duplication or reordering",
            wire::HEADER_LEN
        ));
    }
    if answered.len() < clients.len() {
        notes.push(format!(
            "no end-of-test answer from {} for {} of {} clients: only sender-side figures are known for them (a foreign server, a firewall, or every answer lost)",
            cfg.server,
            clients.len() - answered.len(),
            clients.len()
        ));
    }
    RunReport {
        server_addr: cfg.server.to_string(),
        buffer_size: cfg.buffer_size,
        connected: cfg.connected,
        rate_bps: cfg.rate_bps,
        sent_packets,
        sent_bytes,
        seconds,
        gbps: units::gbps(sent_bytes, seconds),
        enobufs_retries: clients.iter().map(|c| c.enobufs_retries).sum(),
        backoff_seconds: clients.iter().map(|c| c.backoff_seconds).sum(),
        server,
        clients_answered: answered.len(),
        clients,
        notes,
    }
}

/// `--local`: starts a silent in-process server on an ephemeral loopback
/// port, runs the clients against it, then stops the server.
pub fn run_local(cfg: &ClientConfig, shutdown: &Shutdown) -> Result<RunReport> {
    with_local_server(cfg, |cfg| run(cfg, shutdown))
}

/// Starts a silent in-process server on an ephemeral loopback port, calls
/// `f` with `cfg` pointed at it, then stops the server.
pub fn with_local_server<T>(
    cfg: &ClientConfig,
    f: impl FnOnce(&ClientConfig) -> Result<T>,
) -> Result<T> {
    let server_cfg = crate::config::ServerConfig {
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        listen_is_default: false,
        interval: None,
        // A generous buffer, as a user tuning a real server would set.
        recv_buffer_size: Some(4 << 20),
        ..Default::default()
    };
    let bound = crate::server::bind(&server_cfg)?;
    let mut cfg = cfg.clone();
    cfg.server = bound.addr;
    let server_stop = Shutdown::new();
    std::thread::scope(|scope| {
        let server =
            scope.spawn(|| crate::server::run(&bound, &server_cfg, &server_stop, &mut |_| {}));
        let result = f(&cfg);
        server_stop.trigger();
        let _ = server.join();
        result
    })
}

/// Sets SO_SNDBUF and reports what the kernel granted (forcing past the
/// sysctl limit where permitted).
fn size_send_buffer(socket: &UdpSocket, want: usize) -> Result<BufferGrant> {
    let sock = socket2::SockRef::from(socket);
    let read = || {
        sock.send_buffer_size()
            .map_err(|e| Error::runtime(format!("cannot read SO_SNDBUF: {e}")))
    };
    if let Err(e) = sock.set_send_buffer_size(want) {
        return Ok(BufferGrant {
            requested: Some(want),
            granted: read()?,
            forced: false,
            warning: Some(format!("cannot set SO_SNDBUF to {want}: {e}")),
        });
    }
    let full = if sys::RCVBUF_DOUBLES {
        want.saturating_mul(2)
    } else {
        want
    };
    let mut granted = read()?;
    let mut forced = false;
    #[cfg(target_os = "linux")]
    if granted < full && sys::force_send_buffer(&sock, want).is_ok() {
        granted = read()?;
        forced = true;
    }
    let limit = if cfg!(target_os = "linux") {
        "net.core.wmem_max"
    } else {
        sys::RCVBUF_SYSCTL
    };
    Ok(BufferGrant {
        requested: Some(want),
        granted,
        forced,
        warning: (granted < full).then(|| {
            format!("asked for a {want}-byte send buffer but the kernel granted {granted}; raise the limit with: sysctl -w {limit}={want}")
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_exact_totals_with_a_short_tail() {
        let t = Instant::now();
        let mut lengths = Vec::new();
        plan(Volume::Bytes(2500), 1000, 0, 0, t, 8, &mut lengths);
        assert_eq!(lengths, [1000, 1000, 500]);
        plan(Volume::Bytes(2500), 1000, 2, 2000, t, 8, &mut lengths);
        assert_eq!(lengths, [500]);
        plan(Volume::Bytes(2500), 1000, 3, 2500, t, 8, &mut lengths);
        assert!(lengths.is_empty());
        plan(Volume::Packets(3), 0, 1, 0, t, 8, &mut lengths);
        assert_eq!(lengths, [0, 0]);
        plan(
            Volume::Time(Duration::from_secs(60)),
            10,
            0,
            0,
            t,
            4,
            &mut lengths,
        );
        assert_eq!(lengths, [10; 4]);
        plan(Volume::Time(Duration::ZERO), 10, 0, 0, t, 4, &mut lengths);
        assert!(lengths.is_empty());
    }

    #[test]
    fn payload_does_not_compress() {
        let mut buf = vec![0u8; 4096];
        fill_incompressible(&mut buf, 42);
        let distinct: std::collections::HashSet<u8> = buf.iter().copied().collect();
        assert!(distinct.len() > 200);
    }
}
