//! `udp_server`: receive, count per peer, report.
//!
//! [`bind`] makes the socket (dual-stack by default) and sizes its receive
//! buffer; [`run`] takes that bound socket, a config and a shutdown flag,
//! and reports through a callback until the flag is set. Printing is the
//! caller's business (see [`crate::output::report`]), which is what lets
//! `udp_client --local` run a silent server in-process.
//!
//! Receiving is done by one thread per socket (`--threads N` sockets share
//! the address with SO_REUSEPORT), each with the `--method` chosen
//! ([`recv`]). They count into one shared [`PeerTable`], locked once per
//! batch, so a peer is reported once. The caller's thread writes interval
//! lines, expires idle peers and passes events on every 20 ms.

pub mod metrics;
pub mod probe;
pub mod reverse;
pub mod stream;
pub mod total;

use crate::config::ServerConfig;
use crate::error::{Error, Result};
use crate::meter::account::{
    ConflictReport, Event, LateReport, PeerReport, PeerTable, Reply, Rx, TableConfig, Totals,
};
use crate::meter::recv::{self, Deliver};
use crate::shutdown::Shutdown;
use crate::stats::{CpuCost, CpuTime};
use crate::sys;
use reverse::{Reverse, SessionKey, StreamEnd, StreamInterval, StreamReport};
use serde::Serialize;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use stream::{StreamOrder, StreamResult};
use sys::RecvBatch;
use total::{Counters, TotalMeter, TotalReport};

pub use crate::sys::BufferGrant;

/// The bound server sockets, ready for [`run`]: one per receive thread,
/// sharing the address with SO_REUSEPORT when there are several.
pub struct Bound {
    pub sockets: Vec<Socket>,
    pub addr: SocketAddr,
    pub buffer: BufferGrant,
    /// Set when the default dual-stack address was unavailable.
    pub fell_back_to_ipv4: bool,
    /// UDP_GRO is on (the kernel may coalesce datagrams of a flow).
    pub gro: bool,
    /// Why GRO is off although it was asked for.
    pub gro_note: Option<String>,
}

fn new_socket(addr: SocketAddr, reuse_port: bool) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        socket.set_only_v6(false)?;
    }
    if reuse_port {
        crate::sys::set_reuse_port(&socket)?;
    }
    Ok(socket)
}

fn bind_one(addr: SocketAddr, reuse_port: bool) -> io::Result<Socket> {
    let socket = new_socket(addr, reuse_port)?;
    socket.bind(&SockAddr::from(addr))?;
    Ok(socket)
}

/// Creates and binds the server sockets and sizes their receive buffers.
pub fn bind(cfg: &ServerConfig) -> Result<Bound> {
    // A receive method this platform lacks is a usage error (exit 2).
    cfg.method.check_available()?;
    let reuse = cfg.threads > 1;
    let mut addr = cfg.listen;
    let mut fell_back = false;
    let first = match bind_one(addr, reuse) {
        Ok(s) => s,
        Err(e)
            if cfg.listen_is_default && addr.is_ipv6() && e.kind() != io::ErrorKind::AddrInUse =>
        {
            addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()));
            fell_back = true;
            bind_one(addr, reuse).map_err(|e| Error::runtime(format!("cannot bind {addr}: {e}")))?
        }
        Err(e) => return Err(Error::runtime(format!("cannot bind {addr}: {e}"))),
    };
    let addr = first
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or_else(|| Error::runtime("cannot read the bound address"))?;
    let mut sockets = vec![first];
    // The others join the address actually bound (port 0 resolved).
    for _ in 1..cfg.threads {
        sockets.push(bind_one(addr, true).map_err(|e| {
            Error::runtime(format!(
                "cannot bind another SO_REUSEPORT socket to {addr}: {e}"
            ))
        })?);
    }
    let mut bound = adopt(sockets, cfg.recv_buffer_size, cfg.gro)?;
    bound.fell_back_to_ipv4 = fell_back;
    Ok(bound)
}

/// Makes bound sockets ready for [`run`]: sizes their receive buffers and
/// turns GRO on where asked and possible. A reverse stream's client
/// receives through its own socket this way.
pub fn adopt(
    sockets: Vec<Socket>,
    recv_buffer_size: Option<usize>,
    want_gro: bool,
) -> Result<Bound> {
    let addr = sockets
        .first()
        .and_then(|s| s.local_addr().ok())
        .and_then(|a| a.as_socket())
        .ok_or_else(|| Error::runtime("cannot read the bound address"))?;
    let mut buffer = None;
    for socket in &sockets {
        buffer = Some(match recv_buffer_size {
            Some(_) => sys::size_buffer(socket, sys::BufferSide::Receive, recv_buffer_size)?,
            None => sys::size_default_recv_buffer(socket)?,
        });
    }
    let (mut gro, mut gro_note) = (false, None);
    if want_gro {
        match sockets.iter().try_for_each(sys::enable_gro) {
            Ok(()) => gro = true,
            Err(e) if e.kind() == io::ErrorKind::Unsupported => gro_note = Some(e.to_string()),
            Err(e) => gro_note = Some(format!("UDP_GRO unavailable ({e})")),
        }
    }
    Ok(Bound {
        sockets,
        addr,
        buffer: buffer.expect("at least one socket"),
        fell_back_to_ipv4: false,
        gro,
        gro_note,
    })
}

/// What the server reports as it runs.
#[derive(Debug, Clone)]
pub enum ServerEvent {
    Interval(PeerReport),
    PeerDone(PeerReport),
    /// Datagrams arrived for a session after it had finished.
    Late(LateReport),
    /// A session's End is contradicted: a forged End, or a confused client.
    Conflict(ConflictReport),
    /// A reverse stream (the server sent) finished.
    StreamDone(StreamReport),
    /// An interval of a reverse stream that is sending.
    StreamInterval(StreamInterval),
    /// The receive socket(s) as a whole, after each interval's lines and
    /// when a burst ends ([`total`]).
    Total(TotalReport),
}

/// Totals over the server's whole run.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize)]
pub struct ServerSummary {
    #[serde(flatten)]
    pub totals: Totals,
    pub kernel_drops: Option<u64>,
    /// The whole process's CPU over its run, and the receive threads'.
    pub cpu: Option<CpuCost>,
    pub receive_cpu: Option<CpuCost>,
    pub method: &'static str,
    pub threads: usize,
    pub gro: bool,
}

/// The table, the events it produced and the answers it wants sent, shared
/// by the receive threads and the caller's thread.
struct Shared {
    table: PeerTable,
    /// Reverse sessions: the server sends (see [`reverse`]).
    reverse: Reverse,
    pending: Vec<ServerEvent>,
    replies: Vec<Reply>,
    /// Reverse streams whose sending thread has returned.
    streams_sent: Vec<(SessionKey, StreamResult)>,
}

/// The most any receive socket's buffer held since it was last taken.
/// Each receive thread looks (SO_MEMINFO) at most every
/// [`total::BUFFER_SAMPLE_EVERY`], after a read; a buffer that overflowed
/// in between shows as drops, not here.
struct BufferWatch {
    epoch: Instant,
    /// Per thread: when it last looked (ns since epoch + 1; 0 = never).
    looked: Vec<AtomicU64>,
    peak: AtomicU64,
    /// The most held since the server started (`--metrics`).
    most: AtomicU64,
    supported: std::sync::atomic::AtomicBool,
}

impl BufferWatch {
    fn new(threads: usize, epoch: Instant) -> Self {
        BufferWatch {
            epoch,
            looked: (0..threads).map(|_| AtomicU64::new(0)).collect(),
            peak: AtomicU64::new(0),
            most: AtomicU64::new(0),
            supported: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// Called on receive thread `index` after a read.
    fn sample(&self, index: usize, socket: &Socket, now: Instant) {
        let Some(looked) = self.looked.get(index) else {
            return;
        };
        let at = now.saturating_duration_since(self.epoch).as_nanos() as u64 + 1;
        let last = looked.load(Ordering::Relaxed);
        if last != 0 && at < last + total::BUFFER_SAMPLE_EVERY.as_nanos() as u64 {
            return;
        }
        looked.store(at, Ordering::Relaxed);
        match sys::recv_buffer_held(socket) {
            Ok(held) => {
                self.peak.fetch_max(held, Ordering::Relaxed);
                self.most.fetch_max(held, Ordering::Relaxed);
            }
            Err(_) => self.supported.store(false, Ordering::Relaxed),
        }
    }

    /// The most held since the server started, where the platform tells.
    fn most(&self) -> Option<u64> {
        let most = self.most.load(Ordering::Relaxed);
        self.supported.load(Ordering::Relaxed).then_some(most)
    }

    /// The most held since the last call, where the platform tells.
    fn take(&self) -> Option<u64> {
        let peak = self.peak.swap(0, Ordering::Relaxed);
        self.supported.load(Ordering::Relaxed).then_some(peak)
    }
}

/// Counts what the receive loops read into the shared table.
struct Counter<'a> {
    shared: &'a Mutex<Shared>,
    cpu: &'a ReceiveCpu,
    buffer: &'a BufferWatch,
    /// The thread that finalises sessions, woken when one needs it sooner
    /// than its next regular look.
    main: std::thread::Thread,
}

/// The longest the finalising thread sleeps: how late it notices a
/// shutdown, an idle peer or an expired record.
const LONGEST_NAP: Duration = Duration::from_millis(100);
/// Its nap once shutting down, so the receive threads can finish.
const LAST_LOOK: Duration = Duration::from_millis(20);

/// How often a busy receive thread refreshes its CPU figure.
const CPU_SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// The receive threads' CPU time. Each thread reads its own (getrusage
/// RUSAGE_THREAD) at most once per [`CPU_SAMPLE_EVERY`], when it has read
/// something, and publishes it here; anyone may add them up. A figure is
/// then at most that much wall time old, so it misses at most that much
/// CPU (and far less at low load, when the thread mostly sleeps).
/// Sampling more often costs a syscall per datagram at low rates.
struct ReceiveCpu {
    epoch: Instant,
    /// Per thread: user ns, system ns, when sampled (ns since epoch + 1;
    /// 0 = never).
    slots: Vec<[AtomicU64; 3]>,
    supported: bool,
}

impl ReceiveCpu {
    fn new(threads: usize, epoch: Instant) -> Self {
        ReceiveCpu {
            epoch,
            slots: (0..threads).map(|_| Default::default()).collect(),
            supported: sys::thread_cpu().is_some(),
        }
    }

    /// Called on receive thread `index`: refreshes its figure if it is
    /// older than [`CPU_SAMPLE_EVERY`], or at once with `force`.
    fn sample(&self, index: usize, now: Instant, force: bool) {
        let Some(slot) = self.slots.get(index) else {
            return;
        };
        let at = now.saturating_duration_since(self.epoch).as_nanos() as u64 + 1;
        let last = slot[2].load(Ordering::Relaxed);
        if !force && last != 0 && at < last + CPU_SAMPLE_EVERY.as_nanos() as u64 {
            return;
        }
        if let Some(cpu) = sys::thread_cpu() {
            slot[0].store(cpu.user.as_nanos() as u64, Ordering::Relaxed);
            slot[1].store(cpu.system.as_nanos() as u64, Ordering::Relaxed);
            slot[2].store(at, Ordering::Relaxed);
        }
    }

    /// All receive threads' CPU so far.
    fn total(&self) -> Option<CpuTime> {
        self.supported.then(|| {
            self.slots.iter().fold(CpuTime::default(), |sum, slot| {
                sum.plus(CpuTime {
                    user: Duration::from_nanos(slot[0].load(Ordering::Relaxed)),
                    system: Duration::from_nanos(slot[1].load(Ordering::Relaxed)),
                })
            })
        })
    }
}

fn push_event(pending: &mut Vec<ServerEvent>) -> impl FnMut(Event) + '_ {
    move |e| {
        pending.push(match e {
            Event::Interval(r) => ServerEvent::Interval(r),
            Event::Done(r) => ServerEvent::PeerDone(r),
            Event::Late(r) => ServerEvent::Late(r),
            Event::Conflict(r) => ServerEvent::Conflict(r),
        })
    }
}

/// The event that ends a `--one-off` server: a tagged session finalised
/// because its End arrived (and was answered). Untagged sources, sessions
/// that went idle or were evicted, late and conflict reports do not: a
/// port scan or a client that died mid-test leaves the server waiting for
/// a real test.
fn serves_one_off(event: &ServerEvent) -> bool {
    match event {
        ServerEvent::PeerDone(r) => {
            r.tagged && r.reason == Some(crate::meter::account::DoneReason::End)
        }
        ServerEvent::StreamDone(r) => r.reason == StreamEnd::Answered,
        _ => false,
    }
}

/// Hands the reverse streams' news to the table: threads that returned
/// (their End goes out), deadlines passed (silence, --max-duration, End
/// retries), reports finished. Returns the streams to launch.
fn drive_streams(
    reverse: &mut Reverse,
    sent: &mut Vec<(SessionKey, StreamResult)>,
    now: Instant,
    pending: &mut Vec<ServerEvent>,
    replies: &mut Vec<Reply>,
) -> Vec<StreamOrder> {
    for (key, result) in sent.drain(..) {
        reverse.sent(key, result, now, replies);
    }
    reverse.tick(now, replies);
    pending.extend(
        reverse
            .take_last_intervals()
            .into_iter()
            .map(ServerEvent::StreamInterval),
    );
    pending.extend(reverse.take_done().into_iter().map(ServerEvent::StreamDone));
    reverse.take_launches()
}

/// Sends answers; best effort: a lost answer is retried by the client.
fn send_replies(sockets: &[&Socket], replies: &mut Vec<Reply>) {
    for reply in replies.drain(..) {
        if let Some(socket) = sockets.get(reply.socket).or(sockets.first()) {
            let _ = sys::send_from(socket, reply.bytes.as_slice(), reply.to, reply.from);
        }
    }
}

impl Deliver for Counter<'_> {
    fn deliver(&self, index: usize, socket: &Socket, batch: &RecvBatch, count: usize) {
        let now = Instant::now();
        self.cpu.sample(index, now, false);
        self.buffer.sample(index, socket, now);
        let cpu = self.cpu.total();
        let real_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mut replies = Vec::new();
        {
            // One lock per batch: the receive threads share one table so a
            // peer is reported once whichever socket its traffic reaches.
            let mut guard = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            let Shared { table, reverse, .. } = &mut *guard;
            for i in 0..count {
                let received = batch.datagram(i);
                let Some(from) = received.from else { continue };
                // The kernel's receive time, on our monotonic clock: rates
                // and jitter then do not depend on when the batch was read.
                let at = received
                    .rx_time_ns
                    .and_then(|rx| {
                        now.checked_sub(Duration::from_nanos(real_now.saturating_sub(rx)))
                    })
                    .unwrap_or(now);
                let rx = Rx {
                    from,
                    arrived: at,
                    processed: now,
                    socket: index,
                    drops: received.kernel_drops,
                    local: received.local,
                    segment_size: received.segment_size,
                    truncated: received.truncated,
                    cpu,
                };
                table.on_receive_with(received.data, &rx, &mut replies, reverse);
            }
            if table.take_attention() {
                self.main.unpark();
            }
        }
        // Answers go out of the socket the request came in on, from the
        // address it was sent to.
        for reply in replies {
            let _ = sys::send_from(socket, reply.bytes.as_slice(), reply.to, reply.from);
        }
    }
}

/// Starts the thread that sends reverse stream `order`, through a copy of
/// the receive socket its Start came in on (the same port, so the stream
/// leaves from where the client sent). The thread hands its result to the
/// table and wakes the finalising thread.
fn launch_stream<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    bound: &'scope Bound,
    order: StreamOrder,
    shared: &'scope Mutex<Shared>,
) {
    let main = std::thread::current();
    let socket = bound
        .sockets
        .get(order.socket)
        .or(bound.sockets.first())
        .expect("at least one socket")
        .try_clone()
        .map(std::net::UdpSocket::from);
    scope.spawn(move || {
        let result = match socket {
            Ok(socket) => stream::run(&socket, &order),
            Err(e) => stream::failed(format!("cannot share the server socket: {e}")),
        };
        order.control.stop.trigger();
        let mut guard = shared.lock().unwrap_or_else(|p| p.into_inner());
        guard.streams_sent.push((order.key, result));
        drop(guard);
        main.unpark();
    });
}

/// Receives and counts until `shutdown` is set, reporting through `events`
/// from the calling thread. Receive threads do the counting; this thread
/// writes interval lines, finalises sessions (sending their answers),
/// expires idle peers and passes events on.
pub fn run(
    bound: &Bound,
    cfg: &ServerConfig,
    shutdown: &Shutdown,
    events: &mut dyn FnMut(ServerEvent),
) -> Result<ServerSummary> {
    run_with(bound, cfg, shutdown, events, None, None)
}

/// Called on the finalising thread at every pass (at least every
/// 100 ms, `LONGEST_NAP`) with the table: a reverse stream's client sends its
/// Feedback from here.
pub type Watch<'a> = &'a mut dyn FnMut(&PeerTable, Instant);

/// Hands every `peer_done` among `pending` (each is there for one pass of
/// the finalising loop) to the metrics board.
fn record_finished(board: Option<&metrics::Board>, pending: &[ServerEvent]) {
    let Some(board) = board else { return };
    for event in pending {
        match event {
            ServerEvent::PeerDone(r) => board.finished(r),
            ServerEvent::StreamDone(r) => board.finished_sample(metrics::PeerSample::of_stream(
                r.peer.clone(),
                r.session.clone(),
                r.sent_bytes,
                r.received.as_ref().map(|c| (c.packets, c.bytes)),
                true,
            )),
            _ => {}
        }
    }
}

/// [`run`], also publishing to `board` for `--metrics`: a snapshot when a
/// scrape asks for one (taken here, not on the receive threads), and
/// every `peer_done` report as it is passed on.
pub fn run_with(
    bound: &Bound,
    cfg: &ServerConfig,
    shutdown: &Shutdown,
    events: &mut dyn FnMut(ServerEvent),
    board: Option<&metrics::Board>,
    mut watch: Option<Watch>,
) -> Result<ServerSummary> {
    if let Some(board) = board {
        board.attach();
    }
    let drops_supported = bound
        .sockets
        .iter()
        .all(|s| sys::enable_kernel_drop_counter(s).unwrap_or(false));
    let mut kernel_times = true;
    for socket in &bound.sockets {
        // Best effort: without it datagrams are timed when read (and the
        // reports say so).
        kernel_times &= sys::enable_rx_timestamps(socket).is_ok();
        // Best effort: without it answers leave from the address the OS
        // picks, which a client may not recognise on a multi-homed host.
        let _ = sys::enable_local_address(socket);
    }
    let start = Instant::now();
    let table = PeerTable::new(
        TableConfig {
            max_peers: cfg.max_peers,
            idle_timeout: cfg.idle_timeout,
            end_grace: cfg.end_grace,
            sockets: bound.sockets.len(),
            gro: bound.gro,
            kernel_times,
            recv_buffer: bound.buffer.granted as u64,
            intervals: cfg.interval.is_some(),
            psk: cfg.psk.clone(),
        },
        start,
    );
    let reverse =
        Reverse::with_fresh_cookies(cfg.streams, cfg.psk.clone(), start, cfg.interval.is_some());
    let shared = Mutex::new(Shared {
        table,
        reverse,
        pending: Vec::new(),
        replies: Vec::new(),
        streams_sent: Vec::new(),
    });
    let sockets: Vec<&Socket> = bound.sockets.iter().collect();
    let receive_cpu = ReceiveCpu::new(bound.sockets.len(), start);
    let buffer_watch = BufferWatch::new(bound.sockets.len(), start);
    let process_cpu_at_start = sys::process_cpu();
    // Drops are known to be counted (0 until the first report) where
    // every socket has the counter.
    let socket_drops =
        |table: &PeerTable| drops_supported.then(|| table.kernel_drops().unwrap_or(0));
    let mut total_meter = TotalMeter::new(
        start,
        cfg.interval.is_some(),
        bound.buffer.granted as u64,
        Counters {
            drops: drops_supported.then_some(0),
            cpu: receive_cpu.total(),
            ..Counters::default()
        },
    )
    .on_threads(bound.sockets.len());
    let counter = Counter {
        shared: &shared,
        cpu: &receive_cpu,
        buffer: &buffer_watch,
        main: std::thread::current(),
    };
    let receivers_done = Shutdown::new();
    let result = std::thread::scope(|scope| {
        let receivers: Vec<_> = bound
            .sockets
            .iter()
            .enumerate()
            .map(|(i, socket)| {
                let counter = &counter;
                let receivers_done = &receivers_done;
                scope.spawn(move || {
                    let done = recv::run_method(cfg.method, &[socket], i, counter, receivers_done);
                    counter.cpu.sample(i, Instant::now(), true);
                    done
                })
            })
            .collect();
        let mut next_interval = cfg.interval.map(|i| start + i);
        let mut flushed = Vec::new();
        let mut replies = Vec::new();
        let mut nap = LONGEST_NAP;
        loop {
            let stopping = shutdown.is_triggered() || receivers.iter().any(|h| h.is_finished());
            if stopping {
                receivers_done.trigger();
                nap = nap.min(LAST_LOOK);
            }

            // Sleeps until the next interval line or grace period ends, or
            // a receive thread wakes it, or LONGEST_NAP: a fixed short tick
            // cost an idle server a wake-up every 20 ms.
            std::thread::park_timeout(nap);
            let now = Instant::now();
            let mut launches;
            {
                let mut guard = shared.lock().unwrap_or_else(|p| p.into_inner());
                let Shared {
                    table,
                    reverse,
                    pending,
                    replies: queued,
                    streams_sent,
                } = &mut *guard;
                if stopping {
                    reverse.stop_all();
                }
                launches = drive_streams(reverse, streams_sent, now, pending, queued);
                if stopping {
                    // No stream starts once the server is stopping.
                    launches.clear();
                }
                let mut stream_intervals = Vec::new();
                let mut ticked = false;
                let seen = pending.len();
                {
                    let mut sink = push_event(pending);
                    if let Some(due) = next_interval {
                        if now >= due {
                            ticked = true;
                            table.tick_intervals(now, receive_cpu.total(), &mut sink);
                            stream_intervals = reverse.intervals(now);
                            let interval = cfg.interval.expect("interval set");
                            next_interval = Some(if due + interval <= now {
                                now + interval
                            } else {
                                due + interval
                            });
                        }
                    }
                    table.expire(now, &mut sink, queued);
                }
                total_meter.observe(&pending[seen..]);
                let active = table.active_peers() as u64;
                let burst_end = total_meter.burst_ended(active);
                let counters =
                    Counters::of(&table.totals, socket_drops(table), receive_cpu.total());
                if burst_end || (ticked && total_meter.worth(active, &counters)) {
                    let at = total::Now {
                        at: now,
                        active,
                        counters,
                        buffer_peak: buffer_watch.take(),
                    };
                    pending.push(ServerEvent::Total(total_meter.take(at, burst_end)));
                }
                pending.extend(
                    stream_intervals
                        .into_iter()
                        .map(ServerEvent::StreamInterval),
                );
                // A peer finished in this pass has left the live table:
                // it joins the retained set now, before any snapshot, so
                // no scrape misses it.
                record_finished(board, pending);
                if let Some(board) = board.filter(|b| b.take_wanted()) {
                    let kernel_drops = socket_drops(table);
                    board.publish(metrics::Live {
                        peers: table
                            .live_reports()
                            .iter()
                            .map(|r| metrics::PeerSample::of(r, false))
                            .chain(reverse.live().into_iter().map(|s| {
                                metrics::PeerSample::of_stream(
                                    s.peer.to_string(),
                                    format!("{:016x}", s.session),
                                    s.sent_bytes,
                                    Some((s.received_packets, s.received_bytes)),
                                    false,
                                )
                            }))
                            .collect(),
                        server: metrics::ServerSample {
                            recv_buffer_most: buffer_watch.most(),
                            ..metrics::ServerSample::of(
                                &table.totals,
                                kernel_drops,
                                receive_cpu.total(),
                            )
                        },
                    });
                }
                if let Some(watch) = watch.as_mut() {
                    watch(table, now);
                }
                let due = [next_interval, table.next_due(now), reverse.next_due()]
                    .into_iter()
                    .flatten()
                    .min();
                nap = due.map_or(LONGEST_NAP, |due| {
                    due.saturating_duration_since(Instant::now())
                        .min(LONGEST_NAP)
                });
                std::mem::swap(pending, &mut flushed);
                std::mem::swap(queued, &mut replies);
            }
            send_replies(&sockets, &mut replies);
            for order in launches {
                launch_stream(scope, bound, order, &shared);
            }
            for event in flushed.drain(..) {
                // --one-off stops through the same flag as Ctrl-C, once the
                // session's answer is sent (just above) and its summary out.
                let served = cfg.one_off && serves_one_off(&event);
                events(event);
                if served {
                    shutdown.trigger();
                }
            }
            if stopping {
                break;
            }
        }
        recv::join_receive_threads(receivers)
    });
    // Every sending thread has returned (the scope joined them): their
    // Ends go out once, and every stream left is reported.
    let mut guard = shared.lock().unwrap_or_else(|p| p.into_inner());
    let Shared {
        table,
        reverse,
        pending,
        replies,
        streams_sent,
    } = &mut *guard;
    let now = Instant::now();
    drive_streams(reverse, streams_sent, now, pending, replies);
    pending.extend(
        reverse
            .finish_all()
            .into_iter()
            .map(ServerEvent::StreamDone),
    );
    let seen = pending.len();
    table.finish_all(now, &mut push_event(pending), replies);
    total_meter.observe(&pending[seen..]);
    let counters = Counters::of(&table.totals, socket_drops(table), receive_cpu.total());
    if total_meter.worth(0, &counters) {
        let at = total::Now {
            at: now,
            active: 0,
            counters,
            buffer_peak: buffer_watch.take(),
        };
        pending.push(ServerEvent::Total(total_meter.take(at, true)));
    }
    send_replies(&sockets, replies);
    record_finished(board, pending);
    for event in pending.drain(..) {
        events(event);
    }
    if let Some(board) = board {
        board.detach();
    }
    result.map_err(|e| Error::runtime(format!("receive failed: {e}")))?;
    let wall = start.elapsed();
    let cpu = sys::process_cpu()
        .zip(process_cpu_at_start)
        .map(|(now, then)| CpuCost::of(now.since(then), wall, table.totals.bytes));
    Ok(ServerSummary {
        cpu,
        receive_cpu: receive_cpu
            .total()
            .map(|c| CpuCost::of(c, wall, table.totals.bytes).on_threads(bound.sockets.len())),
        totals: table.totals.clone(),
        kernel_drops: table.kernel_drops().filter(|_| drops_supported),
        method: cfg.method.name(),
        threads: bound.sockets.len(),
        gro: bound.gro,
    })
}
