//! `udp_server`: receive, count per peer, report.
//!
//! [`bind`] makes the socket (dual-stack by default) and sizes its receive
//! buffer; [`run`] takes that bound socket, a config and a shutdown flag,
//! and reports through a callback until the flag is set. Printing is the
//! caller's business (see [`crate::report`]), which is what lets
//! `udp_client --local` run a silent server in-process.
//!
//! The receive loop is one blocking thread. It wakes at least every
//! [`shutdown::POLL`] (the socket's receive timeout) to write interval
//! lines, expire idle peers and check the shutdown flag.

pub mod peers;

use crate::config::ServerConfig;
use crate::error::{Error, Result};
use crate::shutdown::{self, Shutdown};
use crate::sys;
use peers::{Event, Overflow, PeerReport, PeerTable};
use serde::Serialize;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

/// Datagrams per recvmmsg call.
pub const RECV_BATCH: usize = 32;
/// Each receive buffer holds the largest datagram (65535 including headers).
pub const RECV_BUF_SIZE: usize = 65536;

/// What the kernel granted for SO_RCVBUF.
#[derive(Debug, Clone, Serialize)]
pub struct BufferGrant {
    pub requested: Option<usize>,
    /// What getsockopt(SO_RCVBUF) returns: on Linux twice the usable size.
    pub granted: usize,
    /// SO_RCVBUFFORCE was used to go past the sysctl limit.
    pub forced: bool,
    /// Set when the kernel gave less than asked: how to raise the limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// A bound server socket, ready for [`run`].
pub struct Bound {
    pub socket: Socket,
    pub addr: SocketAddr,
    pub buffer: BufferGrant,
    /// Set when the default dual-stack address was unavailable.
    pub fell_back_to_ipv4: bool,
}

fn new_socket(addr: SocketAddr) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        socket.set_only_v6(false)?;
    }
    Ok(socket)
}

/// Creates and binds the server socket and sizes its receive buffer.
pub fn bind(cfg: &ServerConfig) -> Result<Bound> {
    let mut addr = cfg.listen;
    let mut fell_back = false;
    let socket = match new_socket(addr).and_then(|s| s.bind(&SockAddr::from(addr)).map(|()| s)) {
        Ok(s) => s,
        Err(e)
            if cfg.listen_is_default && addr.is_ipv6() && e.kind() != io::ErrorKind::AddrInUse =>
        {
            addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()));
            fell_back = true;
            let s = new_socket(addr)
                .map_err(|e| Error::runtime(format!("cannot create a UDP socket: {e}")))?;
            s.bind(&SockAddr::from(addr))
                .map_err(|e| Error::runtime(format!("cannot bind {addr}: {e}")))?;
            s
        }
        Err(e) => return Err(Error::runtime(format!("cannot bind {addr}: {e}"))),
    };
    let buffer = size_recv_buffer(&socket, cfg.recv_buffer_size)?;
    let addr = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or_else(|| Error::runtime("cannot read the bound address"))?;
    Ok(Bound {
        socket,
        addr,
        buffer,
        fell_back_to_ipv4: fell_back,
    })
}

fn size_recv_buffer(socket: &Socket, requested: Option<usize>) -> Result<BufferGrant> {
    let read = |s: &Socket| {
        s.recv_buffer_size()
            .map_err(|e| Error::runtime(format!("cannot read SO_RCVBUF: {e}")))
    };
    let Some(want) = requested else {
        return Ok(BufferGrant {
            requested: None,
            granted: read(socket)?,
            forced: false,
            warning: None,
        });
    };
    socket
        .set_recv_buffer_size(want)
        .map_err(|e| Error::runtime(format!("cannot set SO_RCVBUF to {want}: {e}")))?;
    let full = if sys::RCVBUF_DOUBLES {
        want.saturating_mul(2)
    } else {
        want
    };
    let mut granted = read(socket)?;
    let mut forced = false;
    if granted < full && sys::force_recv_buffer(socket, want).is_ok() {
        granted = read(socket)?;
        forced = true;
    }
    let warning = (granted < full).then(|| {
        format!(
            "asked for a {want}-byte receive buffer but the kernel granted {granted}; raise the limit with: sysctl -w {}={want} (or run as root, which uses SO_RCVBUFFORCE)",
            sys::RCVBUF_SYSCTL
        )
    });
    Ok(BufferGrant {
        requested: Some(want),
        granted,
        forced,
        warning,
    })
}

/// What the server reports as it runs.
#[derive(Debug, Clone)]
pub enum ServerEvent {
    Interval(PeerReport),
    PeerDone(PeerReport),
}

/// Totals over the server's whole run.
#[derive(Debug, Clone, Serialize)]
pub struct ServerSummary {
    pub packets: u64,
    pub bytes: u64,
    pub peers: u64,
    pub overflow: Overflow,
    pub answers_limited: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_drops: Option<u64>,
    pub method: &'static str,
}

/// Receives and counts until `shutdown` is set, reporting through `events`.
pub fn run(
    socket: &Socket,
    cfg: &ServerConfig,
    shutdown: &Shutdown,
    events: &mut dyn FnMut(ServerEvent),
) -> Result<ServerSummary> {
    socket
        .set_read_timeout(Some(shutdown::POLL))
        .map_err(|e| Error::runtime(format!("cannot set a receive timeout: {e}")))?;
    let drops_supported = sys::enable_kernel_drop_counter(socket).unwrap_or(false);
    let mut batch = sys::RecvBatch::new(RECV_BATCH, RECV_BUF_SIZE);
    let start = Instant::now();
    let mut table = PeerTable::new(cfg.max_peers, cfg.idle_timeout, start);
    let mut next_interval = cfg.interval.map(|i| start + i);
    let mut next_housekeeping = start;
    let housekeeping_every = Duration::from_millis(50);
    let mut drops = None;
    let mut forward = |e: Event| match e {
        Event::Interval(r) => events(ServerEvent::Interval(r)),
        Event::Done(r) => events(ServerEvent::PeerDone(r)),
    };
    while !shutdown.is_triggered() {
        match batch.recv(socket) {
            Ok(n) => {
                let now = Instant::now();
                for i in 0..n {
                    let received = batch.datagram(i);
                    if drops_supported {
                        drops = received.kernel_drops;
                    }
                    let Some(from) = received.from else { continue };
                    if let Some((reply, to)) =
                        table.on_datagram(received.data, from, now, drops, &mut forward)
                    {
                        // Best effort: a lost answer is retried by the client.
                        let _ = socket.send_to(&reply, &SockAddr::from(to));
                    }
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => {
                // ICMP errors for our answers and similar are transient;
                // one bad peer must not stop the server.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let now = Instant::now();
        if now >= next_housekeeping {
            next_housekeeping = now + housekeeping_every;
            if let Some(due) = next_interval {
                if now >= due {
                    table.tick_intervals(now, drops, &mut forward);
                    let interval = cfg.interval.expect("interval set");
                    let mut next = due + interval;
                    if next <= now {
                        next = now + interval;
                    }
                    next_interval = Some(next);
                }
            }
            table.expire(now, drops, &mut forward);
        }
    }
    table.finish_all(drops, &mut forward);
    Ok(ServerSummary {
        packets: table.total_packets,
        bytes: table.total_bytes,
        peers: table.peers_seen,
        overflow: table.overflow,
        answers_limited: table.answers_limited,
        kernel_drops: drops.filter(|_| drops_supported),
        method: if cfg!(target_os = "linux") {
            "mmsg"
        } else {
            "thread"
        },
    })
}
