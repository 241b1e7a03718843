//! `udp_client`: find the server, send an exact volume, pace it, survive a
//! full queue, then ask the server what arrived.
//!
//! Each client socket runs in its own thread ([`run_one`]) and is its own
//! peer at the server (its own session id). Before sending, a short probe
//! (Hello) finds a missing server within a second, instead of after the
//! whole volume. The send loop never skips a datagram: on ENOBUFS or EAGAIN
//! it backs off exponentially (capped, reset after a success) and sends the
//! same datagram again, counting the back-offs and the time spent in them.
//! At the end, the End is answered only from the server's address and only
//! with the nonce of an End this client sent, so a forged or stale answer
//! is ignored.

pub mod limit;
pub mod start;
pub mod verdict;

use crate::config::ClientConfig;
use crate::error::{Error, Result};
use crate::meter::pace::{Pacer, Release};
use crate::meter::plan::{fill_incompressible, plan, Volume};
use crate::meter::send::{GsoChoice, GsoRequest, SendPath, Transmitter};
use crate::shutdown::Shutdown;
use crate::stats::{self, percent, CpuCost, CpuTime, IntervalClock, KernelDrops, SendInterval};
use crate::sys;
use crate::wire::{self, End, EndAck, Header, Hello, Message};
use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Attempts of each control exchange (probe, End) within its time.
const ATTEMPTS: u32 = 5;
/// How long the start probe waits for a udp_server to answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The exit code of a run that ended without the server's answer for
/// every client: the sender side is printed, the receiver side is unknown.
pub const EXIT_NO_ANSWER: i32 = 3;
/// The exit code of a run whose answer the server marked as disputed:
/// another End for the session, or data after it (a forged End?).
pub const EXIT_DISPUTED: i32 = 4;
/// Datagrams a paced sender hands over in one sendmmsg call at most: the
/// bursts of a release go out together.
const PACED_BATCH: usize = 64;
/// After a signal ended the test, how long (beyond the server's grace
/// period) the client still waits for the answer.
const SIGNALLED_WAIT: Duration = Duration::from_millis(300);

/// What the server said it received for one session, or for all of them.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize, Default)]
pub struct ServerView {
    pub received_packets: u64,
    pub received_bytes: u64,
    /// Datagrams lost (at most this many, see `lost_fewest`).
    pub lost_packets: u64,
    /// Present when some arrivals could not be classified: the loss is then
    /// between this and `lost_packets`.
    pub lost_fewest: Option<u64>,
    pub loss_percent: f64,
    pub duplicates: u64,
    pub reordered: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub uncertain: u64,
    /// Datagrams that reached the server after it had finished the session.
    #[serde(skip_serializing_if = "is_zero")]
    pub late: u64,
    /// Datagrams whose sequence numbers this client never sent.
    #[serde(skip_serializing_if = "is_zero")]
    pub unexpected: u64,
    pub jitter_ms: f64,
    /// Receive rate: what arrived after the first arrival, over the time
    /// from the first to the last (server's clock); null under 1 ms.
    #[serialize_always]
    pub gbps: Option<f64>,
    pub seconds: f64,
    /// Drops on the server's socket(s) while the session(s) ran.
    #[serde(flatten)]
    pub drops: KernelDrops,
    /// Buffers the server received that held several datagrams (GRO).
    pub gro_buffers: u64,
    /// Buffers the server's kernel cut short (MSG_TRUNC).
    #[serde(skip_serializing_if = "is_zero")]
    pub truncated: u64,
    /// The server had finished the session as idle before the End came.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub idle_finished: bool,
    /// Transit times the server left out of the jitter as implausible.
    #[serde(skip_serializing_if = "is_zero")]
    pub transit_discarded: u64,
    /// The server saw another End for the session, or data after it that
    /// its total does not cover: these figures cannot be trusted.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub disputed: bool,
    /// The server's receive threads' CPU while the session(s) ran (shared
    /// with anything else it received meanwhile); absent where unknown.
    pub cpu: Option<CpuCost>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How a paced sender held its rate.
#[derive(Debug, Clone, Serialize)]
pub struct PacingReport {
    /// `batches` (what is due goes out every 0.5 ms, sleeping in between)
    /// or `precise` (each datagram at its time, spinning before it).
    pub mode: &'static str,
    /// The most datagrams one release sends back to back.
    pub burst_bound: u64,
    /// Time the sender fell behind its schedule beyond what one burst
    /// catches up (descheduled, or a full queue): the rate was not held
    /// for that long.
    pub behind_seconds: f64,
}

/// What became of asking the server for its figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// The server answered the End.
    Answered,
    /// It answered the probe, but not the End.
    NoAnswer,
    /// The host said "port unreachable" while data was being sent.
    ServerGone,
    /// `--no-server`: the target is not a udp_server; nothing was asked.
    NotAsked,
    /// The server answered, but had no record of the session (it
    /// restarted, or forgot it): its figures are not this session's.
    NoRecord,
}

/// When the first and last send calls returned, and what the first took:
/// the sender-side rate counts what was sent after the first call.
#[derive(Debug, Clone, Copy)]
struct SendTiming {
    first_call: Option<Instant>,
    first_packets: u64,
    first_bytes: u64,
    last_call: Instant,
}

impl SendTiming {
    fn new(now: Instant) -> Self {
        SendTiming {
            first_call: None,
            first_packets: 0,
            first_bytes: 0,
            last_call: now,
        }
    }

    /// A send call that returned at `at`, having sent this much.
    fn call(&mut self, at: Instant, packets: u64, bytes: u64) {
        if self.first_call.is_none() {
            self.first_call = Some(at);
            self.first_packets = packets;
            self.first_bytes = bytes;
        }
        self.last_call = at;
    }

    fn span(&self) -> Duration {
        self.first_call.map_or(Duration::ZERO, |f| {
            self.last_call.saturating_duration_since(f)
        })
    }
}

/// One client socket's result.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize)]
pub struct ClientReport {
    pub session: String,
    pub local_addr: String,
    pub sent_packets: u64,
    pub sent_bytes: u64,
    /// Datagrams too short to carry a header (counted, not sequence-checked).
    pub untagged_packets: u64,
    /// From the return of the first send call to the return of the last.
    pub seconds: f64,
    /// Send rate over `seconds` of what the calls after the first sent;
    /// null under 1 ms.
    #[serialize_always]
    pub gbps: Option<f64>,
    pub enobufs_retries: u64,
    pub backoff_seconds: f64,
    /// How the datagrams were really sent: batch, GSO, fallbacks.
    pub send_path: SendPath,
    /// SO_SNDBUF as granted, when --sndbuf was given.
    pub sndbuf: Option<sys::BufferGrant>,
    /// The sending thread's CPU over the send loop (getrusage
    /// RUSAGE_THREAD); absent where the platform cannot tell.
    pub cpu: Option<CpuCost>,
    /// How the rate was held, with --rate.
    pub pacing: Option<PacingReport>,
    /// What was sent per `--interval` (sender side); empty when off.
    pub intervals: Vec<SendInterval>,
    pub answer: Answer,
    #[serialize_always]
    pub server: Option<ServerView>,
    #[serde(skip)]
    timing: SendTiming,
    #[serde(skip)]
    cpu_used: Option<CpuTime>,
    #[serde(skip)]
    loop_time: Duration,
    #[serde(skip)]
    ack: Option<EndAck>,
}

/// The whole run: every client socket, and their totals.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// netspeed's version.
    pub version: &'static str,
    /// When the run started, RFC 3339 in UTC (to the millisecond).
    pub start: String,
    /// The sending host.
    pub host: Host,
    /// The settings that ran, after defaults, config file and flags.
    pub settings: Settings,
    pub server_addr: String,
    pub buffer_size: usize,
    pub connected: bool,
    pub rate_bps: Option<u64>,
    pub sent_packets: u64,
    pub sent_bytes: u64,
    /// From the first client's first send call to the last one's last.
    pub seconds: f64,
    /// Send rate over `seconds` (sender side); null under 1 ms.
    #[serialize_always]
    pub gbps: Option<f64>,
    pub enobufs_retries: u64,
    pub backoff_seconds: f64,
    /// All sending threads' CPU, over the run's wall time.
    pub cpu: Option<CpuCost>,
    /// Combined over the clients the server answered for; null if none did.
    #[serialize_always]
    pub server: Option<ServerView>,
    pub clients_answered: usize,
    /// Every client that asked got its answer (or none asked: --no-server).
    pub complete: bool,
    pub clients: Vec<ClientReport>,
    /// Things the user should know about how the run went.
    pub notes: Vec<String>,
    /// What capped the run, and what to try (`docs/output.md`).
    pub limited_by: verdict::Verdict,
}

impl RunReport {
    /// 0; [`EXIT_DISPUTED`] when the server marked an answer as disputed;
    /// [`EXIT_NO_ANSWER`] when the receiver side is missing for a client
    /// that asked for it.
    pub fn exit_code(&self) -> i32 {
        if self.server.as_ref().is_some_and(|v| v.disputed) {
            EXIT_DISPUTED
        } else if self.complete {
            0
        } else {
            EXIT_NO_ANSWER
        }
    }
}

/// A random u64 from the OS: session ids and nonces must not be guessable
/// by anyone who cannot see the traffic.
pub fn random_u64() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        // No OS randomness (never seen on Linux): a keyed hash of the time
        // is still unique per call, if not secret.
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        h.finish()
    })
}

/// Creates a client socket for `server`: bound (to `bind`, or any
/// address), send errors on, optionally don't-fragment, optionally
/// connected. `sockbench ceiling` opens its sender with it too.
pub fn open_socket(
    server: SocketAddr,
    connected: bool,
    dont_fragment: bool,
    bind: Option<SocketAddr>,
) -> Result<UdpSocket> {
    let socket = Socket::new(
        Domain::for_address(server),
        Type::DGRAM,
        Some(Protocol::UDP),
    )
    .map_err(|e| Error::runtime(format!("cannot create a UDP socket: {e}")))?;
    let local: SocketAddr = match bind {
        Some(addr) => addr,
        None if server.is_ipv6() => (Ipv6Addr::UNSPECIFIED, 0).into(),
        None => (Ipv4Addr::UNSPECIFIED, 0).into(),
    };
    socket.bind(&local.into()).map_err(|e| match bind {
        Some(addr) => Error::runtime(format!(
            "cannot bind a client socket to {addr} (--bind): {e}"
        )),
        None => Error::runtime(format!("cannot bind a client socket: {e}")),
    })?;
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

/// How a control exchange ended.
enum Exchange<T> {
    Answered(T),
    /// The host said "port unreachable".
    Refused,
    Silent,
    /// A signal came while it waited.
    Interrupted,
}

/// How long one wait of an exchange may last before it looks at the
/// shutdown flag again.
const WAKE: Duration = Duration::from_millis(50);

/// Asks the server one question ([`ATTEMPTS`] times within `wait`, each
/// with a fresh nonce) until `accept` takes an answer that came from
/// `server` and echoes one of the nonces sent (`accept` gets the decoded
/// message, its bytes and the nonces). A signal that arrives while it
/// waits ends it within [`WAKE`].
fn exchange<T>(
    socket: &UdpSocket,
    tx: &mut Transmitter,
    server: SocketAddr,
    wait: Duration,
    shutdown: &Shutdown,
    mut ask: impl FnMut(u64) -> Vec<u8>,
    mut accept: impl FnMut(Message, &[u8], &[u64]) -> Option<T>,
) -> Exchange<T> {
    let per_attempt = wait / ATTEMPTS;
    let mut nonces = Vec::with_capacity(ATTEMPTS as usize);
    let mut refused = false;
    let mut buf = [0u8; 512];
    // A signal that already came (it ended the test) does not cut the
    // exchange short: the caller gave it a short `wait` instead.
    let signalled_before = shutdown.is_triggered();
    for _ in 0..ATTEMPTS {
        let nonce = random_u64();
        nonces.push(nonce);
        // A refusal here is counted by the transmitter; keep listening.
        if let Ok(0) = tx.send_control(&ask(nonce)) {
            refused = true;
        }
        let deadline = Instant::now() + per_attempt;
        loop {
            if !signalled_before && shutdown.is_triggered() {
                return Exchange::Interrupted;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let _ = socket.set_read_timeout(Some(left.min(WAKE)));
            let (n, from) = match socket.recv_from(&mut buf) {
                Ok(got) => got,
                Err(e) if sys::is_refused(&e) => {
                    refused = true;
                    continue;
                }
                Err(_) => continue,
            };
            // Only the address asked answers; anything else is not ours.
            if sys::canonical_addr(from) != sys::canonical_addr(server) {
                continue;
            }
            if let Ok(message) = wire::decode(&buf[..n]) {
                if let Some(answer) = accept(message, &buf[..n], &nonces) {
                    return Exchange::Answered(answer);
                }
            }
        }
    }
    if refused {
        Exchange::Refused
    } else {
        Exchange::Silent
    }
}

/// What the probe learned about the server.
#[derive(Debug, Clone, Copy)]
struct ServerInfo {
    end_grace: Duration,
    /// The HelloAck's address cookie (0 from a server without reverse
    /// streams).
    cookie: u64,
}

/// The start probe: is a udp_server at `server`, with room for us, and do
/// we agree about the pre-shared key?
fn probe(
    socket: &UdpSocket,
    tx: &mut Transmitter,
    cfg: &ClientConfig,
    session: u64,
    shutdown: &Shutdown,
) -> Result<ServerInfo> {
    let server = cfg.server;
    let started = Instant::now();
    let ask = |nonce| {
        wire::encode_hello(&Hello {
            header: Header {
                session,
                seq: 0,
                send_time_ns: started.elapsed().as_nanos() as u64,
            },
            nonce,
        })
        .to_vec()
    };
    let accept = |message, _: &[u8], nonces: &[u64]| match message {
        Message::HelloAck(ack) if ack.session == session && nonces.contains(&ack.nonce) => {
            Some(ack)
        }
        _ => None,
    };
    let ack = match exchange(socket, tx, server, PROBE_TIMEOUT, shutdown, ask, accept) {
        Exchange::Answered(ack) => ack,
        Exchange::Refused => return Err(tx.nobody_listening()),
        Exchange::Interrupted => {
            return Err(Error::runtime("interrupted before the test began"))
        }
        Exchange::Silent => {
            return Err(Error::runtime(format!(
                "no udp_server answered at {server} within {} s: check the address, that udp_server runs there, and that UDP is not filtered on the way (to send to something that is not udp_server, such as nc or sockperf, add --no-server)",
                PROBE_TIMEOUT.as_secs()
            )))
        }
    };
    if ack.flags & wire::ACK_BUSY != 0 {
        return Err(Error::runtime(format!(
            "the udp_server at {server} is full: its session table (--max-peers), or this address's share of it, is in use; try again later"
        )));
    }
    let server_has_key = ack.flags & wire::ACK_AUTH != 0;
    match (server_has_key, cfg.psk.is_some()) {
        (true, false) => {
            return Err(Error::usage(format!(
                "the udp_server at {server} requires a pre-shared key: add --psk or --psk-file"
            )))
        }
        (false, true) => {
            return Err(Error::usage(format!(
                "the udp_server at {server} has no pre-shared key, but --psk was given: start it with the same --psk"
            )))
        }
        _ => {}
    }
    Ok(ServerInfo {
        end_grace: Duration::from_nanos(ack.end_grace_ns).min(crate::config::MAX_END_GRACE),
        cookie: ack.cookie,
    })
}

/// Sends End messages until the server answers one of them, or `wait`
/// passes. With a pre-shared key, the End is tagged and only a tagged
/// answer counts.
fn end_of_test(
    socket: &UdpSocket,
    tx: &mut Transmitter,
    cfg: &ClientConfig,
    end: End,
    wait: Duration,
    shutdown: &Shutdown,
) -> Option<EndAck> {
    tx.end_gso();
    let session = end.header.session;
    let psk = cfg.psk.as_ref();
    let ask = |nonce| {
        let mut this = end;
        this.nonce = nonce;
        this.answer_wait_ns = wait.as_nanos() as u64;
        match psk {
            Some(psk) => wire::encode_end_tagged(&this, psk).to_vec(),
            None => wire::encode_end(&this).to_vec(),
        }
    };
    let accept = |message, raw: &[u8], nonces: &[u64]| match message {
        Message::EndAck(ack)
            if ack.session == session
                && nonces.contains(&ack.nonce)
                && psk.is_none_or(|psk| wire::verify_tag(raw, psk)) =>
        {
            Some(ack)
        }
        _ => None,
    };
    match exchange(socket, tx, cfg.server, wait, shutdown, ask, accept) {
        Exchange::Answered(ack) => Some(ack),
        Exchange::Refused | Exchange::Silent | Exchange::Interrupted => None,
    }
}

/// Holds every client back until all of them have probed the server: if
/// one cannot start (no room for it, say), none sends, so that no data is
/// sent for a report that will not be printed.
pub struct StartGate {
    state: Mutex<(usize, bool)>,
    all_ready: Condvar,
    clients: usize,
}

/// The message of a client that did not start because another could not.
const HELD_BACK: &str = "held back: another client could not start";

impl StartGate {
    pub fn new(clients: usize) -> Self {
        StartGate {
            state: Mutex::new((0, false)),
            all_ready: Condvar::new(),
            clients,
        }
    }

    /// One client says whether it could start; returns whether all could,
    /// once every client has said.
    fn ready(&self, ok: bool) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.0 += 1;
        state.1 |= !ok;
        if state.0 >= self.clients {
            self.all_ready.notify_all();
        }
        while state.0 < self.clients {
            state = self
                .all_ready
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
        !state.1
    }
}

/// A client's place at the [`StartGate`]; says "could not start" if
/// dropped unused (an error or a panic before the probe ended).
struct Ticket<'a> {
    gate: &'a StartGate,
    used: bool,
}

impl Ticket<'_> {
    fn ready(mut self, ok: bool) -> bool {
        self.used = true;
        self.gate.ready(ok)
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.used {
            self.gate.ready(false);
        }
    }
}

/// Runs one client socket to the end and asks the server for its figures.
/// `gate` holds it back until every client of the run has probed the
/// server.
pub fn run_one(
    cfg: &ClientConfig,
    shutdown: &Shutdown,
    progress: &dyn SendProgress,
    gate: &StartGate,
) -> Result<ClientReport> {
    let ticket = Ticket { gate, used: false };
    let socket = open_socket(cfg.server, cfg.connected, cfg.dont_fragment, cfg.bind)?;
    let sndbuf = match cfg.sndbuf {
        Some(want) => Some(sys::size_buffer(
            &socket2::SockRef::from(&socket),
            sys::BufferSide::Send,
            Some(want),
        )?),
        None => None,
    };
    let local_addr = socket
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let session = random_u64();
    let size = cfg.buffer_size;
    // The probe goes out before GSO is set on the socket: a Hello longer
    // than -b would otherwise be cut into segments.
    let info = if cfg.no_server {
        None
    } else {
        let mut plain =
            Transmitter::new(&socket, cfg.server, cfg.connected, size, 1, GsoChoice::OFF);
        Some(probe(&socket, &mut plain, cfg, session, shutdown)?)
    };
    if !ticket.ready(true) {
        return Err(Error::runtime(HELD_BACK));
    }
    let mut pacer = cfg.rate_bps.map(|r| Pacer::new(r, cfg.precise_pacing));
    // A paced sender on the sendmmsg path hands each release to the kernel
    // as one batch; `--batch 1` and `--plain-send` keep one per call.
    let batch = match &pacer {
        Some(p) if !cfg.precise_pacing && cfg.batch > 1 => cfg
            .batch
            .max(p.burst_bound(size).min(PACED_BATCH as u64) as usize),
        _ => cfg.batch,
    };
    let max_payload = sys::max_udp_payload(&cfg.server);
    let gso = GsoChoice {
        request: cfg.gso,
        max_payload,
        precise_pacing: cfg.precise_pacing,
    };
    let mut tx = Transmitter::new(&socket, cfg.server, cfg.connected, size, batch, gso);
    tx.dont_fragment = cfg.dont_fragment;
    // One region per message of a call, each room for a full GSO buffer.
    let region = size.max(1) * tx.segments_per_message(max_payload);
    let mut staging = vec![0u8; region * tx.batch()];
    fill_incompressible(&mut staging, session);
    let mut message_ends: Vec<usize> = Vec::new();
    let (mut packets, mut bytes, mut untagged) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let cpu_at_start = sys::thread_cpu();
    let mut timing = SendTiming::new(start);
    let session_text = format!("{session:016x}");
    let mut clock = cfg.interval.map(IntervalClock::new);
    let mut intervals = Vec::new();
    'sending: while !shutdown.is_triggered() && !tx.gone {
        let per_message = tx.segments_per_message(max_payload);
        let mut count = per_message * tx.batch();
        if let Some(p) = pacer.as_mut() {
            loop {
                match p.release(Instant::now(), bytes, size) {
                    Release::Send(due) => {
                        count = count.min(due as usize);
                        break;
                    }
                    Release::Wait(wake) => {
                        // --duration bounds the run: nothing due after it
                        // is sent.
                        if let Volume::Time(d) = cfg.volume {
                            if wake >= start + d {
                                break 'sending;
                            }
                        }
                        if !p.sleep_until(wake, shutdown) {
                            break 'sending;
                        }
                    }
                }
            }
        }
        let planned = plan(cfg.volume, size, packets, bytes, start, count);
        if planned.is_empty() {
            break;
        }
        // Lay the datagrams out: message m holds datagrams
        // [m * per_message, (m + 1) * per_message), back to back.
        let now_ns = start.elapsed().as_nanos() as u64;
        message_ends.clear();
        let mut tagged_misses = 0;
        for m in 0..planned.len().div_ceil(per_message) {
            let mut offset = m * region;
            let first = m * per_message;
            for i in first..planned.len().min(first + per_message) {
                let len = planned.get(i);
                let header = Header {
                    session,
                    seq: packets + i as u64,
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
        let sent = if sent_messages == message_count {
            planned.len()
        } else {
            (sent_messages * per_message).min(planned.len())
        };
        let sent_bytes = planned.bytes(sent);
        packets += sent as u64;
        bytes += sent_bytes;
        untagged += if sent == planned.len() {
            tagged_misses
        } else {
            planned.untagged(sent)
        };
        if sent > 0 {
            let now = Instant::now();
            timing.call(now, sent as u64, sent_bytes);
            if let Some(iv) = clock
                .as_mut()
                .and_then(|c| c.on_call(now - start, packets, bytes))
            {
                progress.interval(&session_text, &iv);
                intervals.push(iv);
            }
        }
        progress.add(sent_bytes);
        if sent_messages < message_count {
            break;
        }
    }
    if let Some(iv) = clock
        .as_mut()
        .and_then(|c| c.finish(timing.last_call - start, packets, bytes))
    {
        progress.interval(&session_text, &iv);
        intervals.push(iv);
    }
    let span = timing.span();
    // The sending thread's CPU, over the send loop's wall time.
    let cpu_used = sys::thread_cpu()
        .zip(cpu_at_start)
        .map(|(now, then)| now.since(then));
    let loop_time = timing.last_call.saturating_duration_since(start);
    let end = End {
        header: Header {
            session,
            seq: packets,
            send_time_ns: start.elapsed().as_nanos() as u64,
        },
        sent_packets: packets,
        sent_bytes: bytes,
        duration_ns: span.as_nanos() as u64,
        nonce: 0,
        answer_wait_ns: 0,
        sender: None,
        tag: [0; wire::TAG_LEN],
    };
    let (answer, ack) = match info {
        None => (Answer::NotAsked, None),
        Some(_) if tx.gone => (Answer::ServerGone, None),
        Some(info) => {
            let mut wait = cfg.end_timeout + info.end_grace;
            if shutdown.is_triggered() {
                // Stopped by a signal: one quick question, not a long wait.
                wait = wait.min(info.end_grace + SIGNALLED_WAIT);
            }
            match end_of_test(&socket, &mut tx, cfg, end, wait, shutdown) {
                Some(ack) if ack.flags & wire::ACK_NO_RECORD != 0 => (Answer::NoRecord, None),
                Some(ack) => (Answer::Answered, Some(ack)),
                None => (Answer::NoAnswer, None),
            }
        }
    };
    let answer = if tx.gone && answer == Answer::NotAsked {
        Answer::ServerGone
    } else {
        answer
    };
    Ok(ClientReport {
        session: session_text,
        local_addr,
        sent_packets: packets,
        sent_bytes: bytes,
        untagged_packets: untagged,
        seconds: span.as_secs_f64(),
        gbps: stats::rate_gbps(bytes.saturating_sub(timing.first_bytes), span),
        enobufs_retries: tx.enobufs_retries,
        backoff_seconds: tx.backoff_time.as_secs_f64(),
        send_path: tx.path(),
        sndbuf,
        cpu: cpu_used.map(|c| CpuCost::of(c, loop_time, bytes)),
        pacing: pacer.as_ref().map(|p| PacingReport {
            mode: if cfg.precise_pacing {
                "precise"
            } else {
                "batches"
            },
            burst_bound: p.burst_bound(size),
            behind_seconds: p.forgiven().as_secs_f64(),
        }),
        intervals,
        answer,
        server: ack.as_ref().map(|a| server_view(&[(a, packets)])),
        timing,
        cpu_used,
        loop_time,
        ack,
    })
}

/// Where the senders report the bytes they have sent as they go (a
/// progress bar, in `output`). Called from every client thread.
pub trait SendProgress: Sync {
    fn add(&self, bytes: u64);
    /// Client `session` closed an interval (`--interval`).
    fn interval(&self, _session: &str, _interval: &SendInterval) {}
}

/// No progress reports.
pub struct NoProgress;

impl SendProgress for NoProgress {
    fn add(&self, _bytes: u64) {}
}

/// The payload bytes a run will send, when its volume is a size.
pub fn planned_bytes(cfg: &ClientConfig) -> Option<u64> {
    match cfg.volume {
        Volume::Bytes(t) => Some(t * cfg.clients as u64),
        Volume::Packets(n) => Some(n * cfg.buffer_size as u64 * cfg.clients as u64),
        Volume::Time(_) => None,
    }
}

/// Runs `cfg.clients` client sockets at once and sums their reports.
pub fn run(cfg: &ClientConfig, shutdown: &Shutdown) -> Result<RunReport> {
    run_with_progress(cfg, shutdown, &NoProgress)
}

/// [`run`], reporting the bytes sent to `progress` as they go.
pub fn run_with_progress(
    cfg: &ClientConfig,
    shutdown: &Shutdown,
    progress: &dyn SendProgress,
) -> Result<RunReport> {
    let started = SystemTime::now();
    let gate = StartGate::new(cfg.clients);
    let results: Vec<Result<ClientReport>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..cfg.clients)
            .map(|_| scope.spawn(|| run_one(cfg, shutdown, progress, &gate)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::runtime("a client thread panicked")))
            })
            .collect()
    });
    // The error worth showing is the one that stopped the run, not a
    // client held back because of it.
    let (mut clients, mut first_error, mut held_back) = (Vec::new(), None, None);
    for result in results {
        match result {
            Ok(c) => clients.push(c),
            Err(e) if e.to_string() == HELD_BACK => held_back = Some(e),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error.or(held_back) {
        return Err(e);
    }
    Ok(summarise(cfg, clients, started))
}

/// The receiver side of one or more sessions of one server, from its
/// answers and what each session sent: sums, and rates and drops over the
/// union of their spans (the answers' times share the server's clock).
fn server_view(answers: &[(&EndAck, u64)]) -> ServerView {
    let mut v = ServerView::default();
    let mut sent = 0;
    for &(a, sent_packets) in answers {
        sent += sent_packets;
        v.received_packets += a.received_packets;
        v.received_bytes += a.received_bytes;
        v.lost_packets += a.lost;
        v.duplicates += a.duplicates;
        v.reordered += a.reordered;
        v.uncertain += a.uncertain;
        v.late += a.late;
        v.unexpected += a.unexpected;
        v.jitter_ms = v.jitter_ms.max(a.jitter_ns as f64 / 1e6);
        v.gro_buffers += a.gro_buffers;
        v.truncated += a.truncated;
        v.idle_finished |= a.flags & wire::ACK_IDLE_FINISHED != 0;
        v.transit_discarded += a.transit_discarded;
        v.disputed |= a.flags & wire::ACK_CONFLICT != 0;
    }
    let fewest: u64 = answers.iter().map(|(a, _)| a.lost_fewest).sum();
    v.lost_fewest = (fewest != v.lost_packets).then_some(fewest);
    v.loss_percent = percent(v.lost_packets, sent);
    // Rates: what arrived after the earliest first arrival, over the span
    // from it to the latest arrival.
    let with_data: Vec<&EndAck> = answers
        .iter()
        .map(|(a, _)| *a)
        .filter(|a| a.received_packets > 0)
        .collect();
    if let (Some(first), Some(last)) = (
        with_data.iter().map(|a| a.first_arrival_ns).min(),
        with_data.iter().map(|a| a.last_arrival_ns).max(),
    ) {
        let at_first: u64 = with_data
            .iter()
            .filter(|a| a.first_arrival_ns == first)
            .map(|a| a.first_arrival_bytes)
            .sum();
        let span = Duration::from_nanos(last.saturating_sub(first));
        v.seconds = span.as_secs_f64();
        v.gbps = stats::rate_gbps(v.received_bytes.saturating_sub(at_first), span);
    }
    // Kernel drops: per receive socket, the counter's growth over the union
    // of the sessions' spans on it, then summed over sockets.
    let mut sockets: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut known = true;
    let mut shared = answers.len() > 1;
    for (a, _) in answers {
        if a.drops_start == wire::UNKNOWN || a.drops_end == wire::UNKNOWN {
            known = false;
            continue;
        }
        shared |= a.flags & wire::ACK_DROPS_SHARED != 0;
        let entry = sockets
            .entry(a.drop_socket)
            .or_insert((a.drops_start, a.drops_end));
        entry.0 = entry.0.min(a.drops_start);
        entry.1 = entry.1.max(a.drops_end);
    }
    v.cpu = server_cpu(answers, v.received_bytes);
    let drops = (known && !sockets.is_empty())
        .then(|| sockets.values().map(|(s, e)| e.saturating_sub(*s)).sum());
    v.drops = KernelDrops::new(drops, shared, v.gro_buffers > 0);
    v
}

/// The server's receive CPU over the answered sessions: one session's own
/// split, or the total from the earliest start to the latest end of
/// several (the counter runs from the server's start, so overlapping
/// sessions are not counted twice).
fn server_cpu(answers: &[(&EndAck, u64)], bytes: u64) -> Option<CpuCost> {
    let known = |a: &EndAck| {
        [a.cpu_user_ns, a.cpu_system_ns, a.cpu_start_ns]
            .iter()
            .all(|&x| x != wire::UNKNOWN)
    };
    if answers.is_empty() || !answers.iter().all(|(a, _)| known(a)) {
        return None;
    }
    let span =
        |a: &EndAck| Duration::from_nanos(a.last_arrival_ns.saturating_sub(a.first_arrival_ns));
    if let [(a, _)] = answers {
        let cpu = CpuTime {
            user: Duration::from_nanos(a.cpu_user_ns),
            system: Duration::from_nanos(a.cpu_system_ns),
        };
        return Some(CpuCost::of(cpu, span(a), bytes));
    }
    let start = answers.iter().map(|(a, _)| a.cpu_start_ns).min()?;
    let end = answers
        .iter()
        .map(|(a, _)| a.cpu_start_ns + a.cpu_user_ns + a.cpu_system_ns)
        .max()?;
    let first = answers.iter().map(|(a, _)| a.first_arrival_ns).min()?;
    let last = answers.iter().map(|(a, _)| a.last_arrival_ns).max()?;
    Some(CpuCost::of_total(
        Duration::from_nanos(end.saturating_sub(start)),
        Duration::from_nanos(last.saturating_sub(first)),
        bytes,
    ))
}

/// The sending host, for the record.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize)]
pub struct Host {
    /// `linux`, `macos`, ...
    pub os: &'static str,
    /// The kernel release, where the platform tells.
    pub kernel: Option<String>,
    /// CPUs this process may use.
    pub cpus: usize,
}

impl Host {
    pub fn this() -> Host {
        Host {
            os: std::env::consts::OS,
            kernel: sys::kernel_release(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// The settings a run used, resolved (see `docs/output.md`).
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub server: String,
    pub buffer_size: usize,
    /// `{"bytes": N}`, `{"packets": N}` or `{"seconds": S}`.
    pub volume: serde_json::Value,
    pub rate_bps: Option<u64>,
    pub precise_pacing: bool,
    pub clients: usize,
    /// `--interval` in seconds; null when off.
    pub interval: Option<f64>,
    pub connected: bool,
    pub batch: usize,
    /// `auto`, `on` or `off`.
    pub gso: &'static str,
    pub sndbuf: Option<usize>,
    pub dont_fragment: bool,
    pub bind: Option<String>,
    pub end_timeout: f64,
    pub no_server: bool,
    pub psk: bool,
}

impl Settings {
    pub fn of(cfg: &ClientConfig) -> Settings {
        Settings {
            server: cfg.server.to_string(),
            buffer_size: cfg.buffer_size,
            volume: match cfg.volume {
                Volume::Bytes(n) => serde_json::json!({ "bytes": n }),
                Volume::Packets(n) => serde_json::json!({ "packets": n }),
                Volume::Time(d) => serde_json::json!({ "seconds": d.as_secs_f64() }),
            },
            rate_bps: cfg.rate_bps,
            precise_pacing: cfg.precise_pacing,
            clients: cfg.clients,
            interval: cfg.interval.map(|d| d.as_secs_f64()),
            connected: cfg.connected,
            batch: cfg.batch,
            gso: match cfg.gso {
                GsoRequest::Auto => "auto",
                GsoRequest::On => "on",
                GsoRequest::Off => "off",
            },
            sndbuf: cfg.sndbuf,
            dont_fragment: cfg.dont_fragment,
            bind: cfg.bind.map(|a| a.to_string()),
            end_timeout: cfg.end_timeout.as_secs_f64(),
            no_server: cfg.no_server,
            psk: cfg.psk.is_some(),
        }
    }
}

fn summarise(cfg: &ClientConfig, clients: Vec<ClientReport>, started: SystemTime) -> RunReport {
    let sent_packets = clients.iter().map(|c| c.sent_packets).sum();
    let sent_bytes: u64 = clients.iter().map(|c| c.sent_bytes).sum();
    // Sender side: what the calls after the earliest first call sent, from
    // it to the latest last call.
    let first = clients.iter().filter_map(|c| c.timing.first_call).min();
    let last = clients
        .iter()
        .filter(|c| c.timing.first_call.is_some())
        .map(|c| c.timing.last_call)
        .max();
    let (span, at_first) = match (first, last) {
        (Some(a), Some(b)) => (
            b.saturating_duration_since(a),
            clients
                .iter()
                .filter(|c| c.timing.first_call == Some(a))
                .map(|c| c.timing.first_bytes)
                .sum(),
        ),
        _ => (Duration::ZERO, 0),
    };
    let answered: Vec<(&EndAck, u64)> = clients
        .iter()
        .filter_map(|c| c.ack.as_ref().map(|a| (a, c.sent_packets)))
        .collect();
    let server = (!answered.is_empty()).then(|| server_view(&answered));
    let mut notes = Vec::new();
    let untagged: u64 = clients.iter().map(|c| c.untagged_packets).sum();
    if untagged > 0 {
        notes.push(format!(
            "{untagged} datagrams were shorter than the {}-byte header: the server counts them, but cannot check them for duplication or reordering",
            wire::HEADER_LEN
        ));
    }
    let count = |answer: Answer| clients.iter().filter(|c| c.answer == answer).count();
    let n = clients.len();
    let gone = count(Answer::ServerGone);
    if gone > 0 {
        notes.push(format!(
            "{} answered 'port unreachable' while {gone} of {n} clients were sending: the server went away (or never listened); only sender-side figures are known for them, up to that point",
            cfg.server
        ));
    }
    let silent = count(Answer::NoAnswer);
    if silent > 0 {
        let key = if cfg.psk.is_some() {
            "; with --psk, also a server with another key, which ignores the End"
        } else {
            ""
        };
        notes.push(format!(
            "no end-of-test answer from {} for {silent} of {n} clients within {:.1} s: only sender-side figures are known for them (the server stopped, a firewall, or every answer lost; raise --end-timeout on a lossy path{key})",
            cfg.server,
            cfg.end_timeout.as_secs_f64()
        ));
    }
    let forgotten = count(Answer::NoRecord);
    if forgotten > 0 {
        notes.push(format!(
            "the server had no record of {forgotten} of {n} sessions when their End came (it restarted, or forgot them under a flood of sessions): their receiver side is unknown"
        ));
    }
    if count(Answer::NotAsked) > 0 {
        notes.push(
            "--no-server: the receiver was not asked what arrived; these are sender-side figures only".into(),
        );
    }
    if let Some(v) = &server {
        notes.extend(server_notes(v));
    }
    let answered_count = count(Answer::Answered);
    let limited_by = verdict::judge(&verdict::Facts {
        offered_bps: cfg.rate_bps.map(|r| r.saturating_mul(n as u64)),
        // Paced, each client holds its share from its own start.
        sent_bps: if cfg.rate_bps.is_some() {
            verdict::summed_client_bps(&clients)
        } else {
            stats::rate_gbps(sent_bytes.saturating_sub(at_first), span).map(|g| g * 1e9)
        },
        seconds: span.as_secs_f64(),
        sender_cpu_percent: verdict::busiest_sender_percent(&clients),
        enobufs_retries: clients.iter().map(|c| c.enobufs_retries).sum(),
        backoff_seconds: clients.iter().map(|c| c.backoff_seconds).sum(),
        clients: n,
        gso: clients.iter().any(|c| c.send_path.gso_segments.is_some()),
        local: cfg.local,
        receiver: server.as_ref().map(verdict::ReceiverFacts::of),
    });
    RunReport {
        version: env!("CARGO_PKG_VERSION"),
        start: humantime::format_rfc3339_millis(started).to_string(),
        host: Host::this(),
        settings: Settings::of(cfg),
        server_addr: cfg.server.to_string(),
        buffer_size: cfg.buffer_size,
        connected: cfg.connected,
        rate_bps: cfg.rate_bps,
        sent_packets,
        sent_bytes,
        seconds: span.as_secs_f64(),
        gbps: stats::rate_gbps(sent_bytes.saturating_sub(at_first), span),
        enobufs_retries: clients.iter().map(|c| c.enobufs_retries).sum(),
        backoff_seconds: clients.iter().map(|c| c.backoff_seconds).sum(),
        cpu: clients
            .iter()
            .map(|c| c.cpu_used)
            .collect::<Option<Vec<CpuTime>>>()
            .map(|all| {
                let total = all.iter().fold(CpuTime::default(), |a, b| a.plus(*b));
                let wall = clients
                    .iter()
                    .map(|c| c.loop_time)
                    .max()
                    .unwrap_or_default();
                CpuCost::of(total, wall, sent_bytes)
            }),
        server,
        clients_answered: answered_count,
        complete: answered_count + count(Answer::NotAsked) == n,
        clients,
        notes,
        limited_by,
    }
}

/// What the server's answer says about its own figures: where they stop
/// short, what they leave out, and whether they can be trusted.
fn server_notes(v: &ServerView) -> impl Iterator<Item = String> {
    let ServerView {
        idle_finished,
        late,
        unexpected,
        disputed,
        truncated,
        ..
    } = *v;
    [
        (idle_finished, "the server had already finished a session as idle (no datagram for its --idle-timeout) when the End arrived: its figures stop there; raise the server's --idle-timeout for slow senders".to_string()),
        (late > 0, format!("{late} datagrams reached the server after it had finished the session: they are not in its figures (raise the server's --end-grace on a path that delays datagrams this much)")),
        (unexpected > 0, format!("the server received {unexpected} datagrams for this session with sequence numbers it never sent: forged, or from another sender")),
        (disputed, "DISPUTED: the server received another End for this session (with other totals), or data after the End that its total does not cover: a forged End, or a confused sender; these figures cannot be trusted (--psk on both ends makes Ends unforgeable)".to_string()),
        (truncated > 0, format!("the server's kernel cut {truncated} buffers short (MSG_TRUNC): their datagrams count as lost")),
    ]
    .into_iter()
    .filter_map(|(due, note)| due.then_some(note))
}
