//! `udp_client`: send an exact volume, pace it, survive a full queue, then
//! ask the server what arrived.
//!
//! Each client socket runs in its own thread ([`run_one`]) and is its own
//! peer at the server (its own session id). The send loop never skips a
//! datagram: on ENOBUFS or EAGAIN it backs off exponentially (capped, reset
//! after a success) and sends the same datagram again, counting the
//! back-offs and the time spent in them.

mod pacing;

use crate::config::{ClientConfig, Volume};
use crate::error::{Error, Result};
use crate::progress::Progress;
use crate::shutdown::Shutdown;
use crate::sys::{self, SendFailure};
use crate::units;
use crate::wire::{self, End, Header, Message};
use pacing::{Backoff, Pacer};
use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// ECONNREFUSED answers (ICMP port unreachable, surfaced by IP_RECVERR)
/// after which we conclude that nobody is listening and stop sending.
const MAX_REFUSED: u64 = 3;
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

fn too_big_message(size: usize, server: SocketAddr, err: &std::io::Error) -> String {
    let hint = if cfg!(target_os = "macos") {
        "macOS limits UDP datagrams to 9216 bytes by default; raise it with: sudo sysctl -w net.inet.udp.maxdgram=65535"
    } else if cfg!(target_os = "linux") {
        "Linux allows 65507 bytes over IPv4 and 65527 over IPv6; a smaller limit means the don't-fragment option or the path MTU"
    } else {
        "lower --buffer-size or raise the OS's maximum UDP datagram size"
    };
    format!("the OS refused a {size}-byte datagram to {server} ({err}); {hint}")
}

/// Creates a client socket for `server`.
fn open_socket(server: SocketAddr, connected: bool) -> Result<UdpSocket> {
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
    if connected {
        socket
            .connect(&server.into())
            .map_err(|e| Error::runtime(format!("cannot connect to {server}: {e}")))?;
    }
    Ok(socket.into())
}

struct Sender<'a> {
    socket: &'a UdpSocket,
    connected: bool,
    server: SocketAddr,
    backoff: Backoff,
    enobufs_retries: u64,
    backoff_time: Duration,
    refused: u64,
}

impl Sender<'_> {
    fn nobody_listening(&self) -> Error {
        Error::runtime(format!(
            "nothing is listening at {}: the host answered 'port unreachable' (is udp_server running?)",
            self.server
        ))
    }

    /// Sends `buf` once, retrying the same datagram on a full queue.
    fn send(&mut self, buf: &[u8], shutdown: &Shutdown) -> Result<bool> {
        loop {
            let result = if self.connected {
                self.socket.send(buf)
            } else {
                self.socket.send_to(buf, self.server)
            };
            match result {
                Ok(_) => {
                    self.backoff.reset();
                    return Ok(true);
                }
                Err(e) => match sys::classify_send_error(&e) {
                    SendFailure::QueueFull => {
                        self.enobufs_retries += 1;
                        self.backoff_time += self.backoff.wait();
                        if shutdown.is_triggered() {
                            return Ok(false);
                        }
                    }
                    SendFailure::Interrupted => {}
                    SendFailure::Refused => {
                        // The error belonged to an earlier datagram; this
                        // one was not sent, so it is retried.
                        self.refused += 1;
                        if self.refused >= MAX_REFUSED {
                            return Err(self.nobody_listening());
                        }
                    }
                    SendFailure::TooBig => {
                        return Err(Error::runtime(too_big_message(buf.len(), self.server, &e)))
                    }
                    SendFailure::Other => {
                        return Err(Error::runtime(format!(
                            "cannot send to {}: {e}",
                            self.server
                        )));
                    }
                },
            }
        }
    }
}

/// Sends end-of-test messages until the server answers or time runs out.
fn end_of_test(
    socket: &UdpSocket,
    sender: &mut Sender,
    end: &End,
    timeout: Duration,
    shutdown: &Shutdown,
) -> Option<wire::EndAck> {
    let message = wire::encode_end(end);
    let per_attempt = timeout / END_ATTEMPTS;
    let mut buf = [0u8; 256];
    for _ in 0..END_ATTEMPTS {
        if sender.send(&message, shutdown).is_err() {
            // Refused: no server; a later attempt may still get through.
        }
        let deadline = Instant::now() + per_attempt;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let _ = socket.set_read_timeout(Some(left));
            let Ok(n) = socket.recv(&mut buf) else {
                continue;
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

/// Runs one client socket to the end and asks the server for its figures.
pub fn run_one(
    cfg: &ClientConfig,
    shutdown: &Shutdown,
    progress: &Progress,
) -> Result<ClientReport> {
    let socket = open_socket(cfg.server, cfg.connected)?;
    let local_addr = socket
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let session = random_session();
    let mut sender = Sender {
        socket: &socket,
        connected: cfg.connected,
        server: cfg.server,
        backoff: Backoff::default(),
        enobufs_retries: 0,
        backoff_time: Duration::ZERO,
        refused: 0,
    };
    let mut buf = vec![0u8; cfg.buffer_size.max(1)];
    let mut pacer = cfg.rate_bps.map(Pacer::new);
    let (mut packets, mut bytes, mut untagged) = (0u64, 0u64, 0u64);
    let mut unreported = 0u64;
    let start = Instant::now();
    let mut last_send = start;
    loop {
        if shutdown.is_triggered() {
            break;
        }
        let len = match cfg.volume {
            Volume::Bytes(total) => (total - bytes).min(cfg.buffer_size as u64) as usize,
            Volume::Packets(n) if packets < n => cfg.buffer_size,
            Volume::Packets(_) => break,
            Volume::Time(d) if start.elapsed() < d => cfg.buffer_size,
            Volume::Time(_) => break,
        };
        if matches!(cfg.volume, Volume::Bytes(total) if bytes >= total) {
            break;
        }
        if let Some(p) = pacer.as_mut() {
            p.wait_until_due(bytes);
        }
        let datagram = &mut buf[..len];
        let header = Header {
            session,
            seq: packets,
            send_time_ns: start.elapsed().as_nanos() as u64,
        };
        if !wire::write_data_header(datagram, &header) {
            untagged += 1;
        }
        if !sender.send(datagram, shutdown)? {
            break;
        }
        packets += 1;
        bytes += len as u64;
        unreported += len as u64;
        if packets % 64 == 0 {
            progress.add(unreported);
            unreported = 0;
        }
    }
    if packets > 0 {
        last_send = Instant::now();
    }
    progress.add(unreported);
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
    let ack = end_of_test(
        &socket,
        &mut sender,
        &end,
        cfg.end_timeout,
        &Shutdown::new(),
    );
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
        enobufs_retries: sender.enobufs_retries,
        backoff_seconds: sender.backoff_time.as_secs_f64(),
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
    let start = Instant::now();
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
    let seconds = start.elapsed().as_secs_f64();
    progress.finish();
    let clients = results.into_iter().collect::<Result<Vec<_>>>()?;
    Ok(summarise(cfg, clients, seconds))
}

fn summarise(cfg: &ClientConfig, clients: Vec<ClientReport>, wall_seconds: f64) -> RunReport {
    let sent_packets = clients.iter().map(|c| c.sent_packets).sum();
    let sent_bytes: u64 = clients.iter().map(|c| c.sent_bytes).sum();
    let seconds = if clients.len() == 1 {
        clients[0].seconds
    } else {
        wall_seconds
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
        let server = scope
            .spawn(|| crate::server::run(&bound.socket, &server_cfg, &server_stop, &mut |_| {}));
        let report = run(&cfg, shutdown);
        server_stop.trigger();
        let _ = server.join();
        report
    })
}
