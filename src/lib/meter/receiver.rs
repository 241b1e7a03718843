//! The receive engine: threads that read the sockets and count into one
//! [`PeerTable`], and the thread that finalises what they counted.
//!
//! Why one engine for both roles: an upload is counted by the server and
//! a reverse stream by the client, and both must be counted the same way
//! (batching, GRO, the socket's drop counter, loss, duplicates,
//! reordering, jitter, data after the End, the receiving side of the
//! end-of-test exchange). The roles differ in what they add around the
//! counting, and they add it through a [`Role`]:
//!
//! - the control messages the table does not handle itself go to the
//!   role's [`Control`] on the receive threads (the server's reverse
//!   sessions; a client needs none);
//! - at every pass of the finalising thread the role sees the table and
//!   the events of the pass, before and after the table ticks its
//!   intervals and expires its peers (the server's totals, metrics and
//!   reverse streams; the client's Feedback and its stop);
//! - every event goes to one sink, in order, outside the table's lock.
//!
//! [`run`] takes sockets already bound ([`adopt`] sizes them), a config
//! and a shutdown flag; it returns when the flag is set, after a last
//! pass that finishes every session and answers what is still owed.

use crate::auth::Psk;
use crate::error::{Error, Result};
use crate::meter::account::{Control, Event, PeerTable, Reply, Rx, TableConfig, Totals};
use crate::meter::recv::{self, Deliver, Method};
use crate::shutdown::Shutdown;
use crate::stats::{CpuCost, CpuTime};
use crate::sys::{self, BufferGrant, RecvBatch};
use serde::Serialize;
use socket2::Socket;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Sockets ready for [`run`]: one per receive thread, sharing the address
/// with SO_REUSEPORT when there are several.
pub struct Bound {
    pub sockets: Vec<Socket>,
    pub addr: SocketAddr,
    pub buffer: BufferGrant,
    /// UDP_GRO is on (the kernel may coalesce datagrams of a flow).
    pub gro: bool,
    /// Why GRO is off although it was asked for.
    pub gro_note: Option<String>,
}

/// Makes bound sockets ready for [`run`]: sizes their receive buffers
/// (`None`: the default, the largest the system allows up to a limit) and
/// turns GRO on where asked and possible.
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
        gro,
        gro_note,
    })
}

/// How the engine counts: the receive method and the table's bounds.
#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    pub method: Method,
    /// Interval reports every so often; None for none.
    pub interval: Option<Duration>,
    /// Most sessions, and most untagged sources, tracked at once.
    pub max_peers: usize,
    pub idle_timeout: Duration,
    /// How long after an End data still in flight is counted.
    pub end_grace: Duration,
    /// `--psk`: Ends must carry its tag, and answers carry it.
    pub psk: Option<Psk>,
    /// Sessions proven before they begin: a receiver that asked for them
    /// (a reverse stream's client) knows their source.
    pub expected: Vec<(SocketAddr, u64)>,
}

/// What the engine counted over its whole run.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize)]
pub struct ReceiverSummary {
    #[serde(flatten)]
    pub totals: Totals,
    pub kernel_drops: Option<u64>,
    /// The whole process's CPU over the run, and the receive threads'.
    pub cpu: Option<CpuCost>,
    pub receive_cpu: Option<CpuCost>,
    pub method: &'static str,
    pub threads: usize,
    pub gro: bool,
}

/// What a role adds to the engine. Every hook runs on the finalising
/// thread; the ones that take a [`Pass`] run with the table locked.
pub trait Role {
    /// What the receive threads hand the control messages the table does
    /// not handle itself (under the table's lock).
    type Control: Control + Send;
    /// What the role reports: the table's events, and its own.
    type Event: From<Event>;

    /// Once, before the receive threads start: `epoch` is the table's.
    fn start(&mut self, _epoch: Instant, _gauges: &Gauges) {}
    /// Before the table ticks its intervals and expires its peers.
    fn before_tick(&mut self, _pass: &mut Pass<'_, Self::Control, Self::Event>) {}
    /// After it: `pass.events` holds every event of this pass.
    fn after_tick(&mut self, _pass: &mut Pass<'_, Self::Control, Self::Event>) {}
    /// When the role next needs a pass, if sooner than the table.
    fn next_due(&self, _control: &Self::Control) -> Option<Instant> {
        None
    }
    /// After the pass, once the lock is released and the answers sent,
    /// before the events go out.
    fn after_pass(&mut self) {}
    /// The last pass, once the receive threads have returned and before
    /// the table finishes every session.
    fn finish(&mut self, _pass: &mut Pass<'_, Self::Control, Self::Event>) {}
}

/// One pass of the finalising thread, as a role sees it.
pub struct Pass<'a, C, E> {
    pub now: Instant,
    pub table: &'a mut PeerTable,
    pub control: &'a mut C,
    /// This pass's events, in the order they will be reported.
    pub events: &'a mut Vec<E>,
    /// Answers to send once the lock is released.
    pub replies: &'a mut Vec<Reply>,
    /// An interval ended in this pass (the table wrote its lines).
    pub ticked: bool,
    /// The engine is stopping: this is one of its last passes ...
    pub stopping: bool,
    /// ... or the very last, after every session was finished.
    pub last: bool,
    pub gauges: &'a Gauges<'a>,
}

/// The figures the engine keeps about its sockets, for a role's reports.
pub struct Gauges<'a> {
    cpu: &'a ReceiveCpu,
    buffer: &'a BufferWatch,
    drops_supported: bool,
    threads: usize,
}

impl Gauges<'_> {
    /// All receive threads' CPU so far, where the platform tells.
    pub fn receive_cpu(&self) -> Option<CpuTime> {
        self.cpu.total()
    }

    /// The most any receive buffer held since the last call.
    pub fn take_buffer_peak(&self) -> Option<u64> {
        self.buffer.take()
    }

    /// The most any receive buffer held since the engine started.
    pub fn buffer_most(&self) -> Option<u64> {
        self.buffer.most()
    }

    /// Whether every socket counts its kernel drops.
    pub fn drops_supported(&self) -> bool {
        self.drops_supported
    }

    /// The sockets' kernel drops so far: 0 until the first report where
    /// every socket has the counter, None where one lacks it.
    pub fn socket_drops(&self, table: &PeerTable) -> Option<u64> {
        self.drops_supported
            .then(|| table.kernel_drops().unwrap_or(0))
    }

    /// Receive threads (one per socket).
    pub fn threads(&self) -> usize {
        self.threads
    }
}

/// The table and what the receive threads share with the finalising one.
struct Shared<C> {
    table: PeerTable,
    control: C,
}

/// The most any receive socket's buffer held since it was last taken.
/// Each receive thread looks (SO_MEMINFO) at most every
/// [`BUFFER_SAMPLE_EVERY`], after a read; a buffer that overflowed in
/// between shows as drops, not here.
struct BufferWatch {
    epoch: Instant,
    /// Per thread: when it last looked (ns since epoch + 1; 0 = never).
    looked: Vec<AtomicU64>,
    peak: AtomicU64,
    /// The most held since the engine started (`--metrics`).
    most: AtomicU64,
    supported: AtomicBool,
}

/// How often a receive thread looks at how full its buffer is.
pub const BUFFER_SAMPLE_EVERY: Duration = Duration::from_millis(1);

impl BufferWatch {
    fn new(threads: usize, epoch: Instant) -> Self {
        BufferWatch {
            epoch,
            looked: (0..threads).map(|_| AtomicU64::new(0)).collect(),
            peak: AtomicU64::new(0),
            most: AtomicU64::new(0),
            supported: AtomicBool::new(true),
        }
    }

    /// Called on receive thread `index` after a read.
    fn sample(&self, index: usize, socket: &Socket, now: Instant) {
        let Some(looked) = self.looked.get(index) else {
            return;
        };
        let at = now.saturating_duration_since(self.epoch).as_nanos() as u64 + 1;
        let last = looked.load(Ordering::Relaxed);
        if last != 0 && at < last + BUFFER_SAMPLE_EVERY.as_nanos() as u64 {
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

    fn most(&self) -> Option<u64> {
        let most = self.most.load(Ordering::Relaxed);
        self.supported.load(Ordering::Relaxed).then_some(most)
    }

    fn take(&self) -> Option<u64> {
        let peak = self.peak.swap(0, Ordering::Relaxed);
        self.supported.load(Ordering::Relaxed).then_some(peak)
    }
}

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

/// How far each receive thread has read, by what its loop says between
/// reads: a read that came back short or empty (see [`Deliver::drained`]).
/// The finalising thread hands it to the table at each pass, which then
/// judges idle peers by it. Why not by the clock alone: a receive thread
/// starved for longer than `--idle-timeout` (a loaded host) leaves its
/// peers' datagrams queued; ended by the clock, a peer would be summarised
/// short, and its queued datagrams would start a second peer.
struct ReadProgress {
    epoch: Instant,
    /// Per socket: everything that arrived before this (ns since epoch)
    /// has been delivered.
    drained: Vec<AtomicU64>,
}

impl ReadProgress {
    fn new(threads: usize, epoch: Instant) -> Self {
        ReadProgress {
            epoch,
            drained: (0..threads).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn drained(&self, index: usize, began: Instant) {
        if let Some(slot) = self.drained.get(index) {
            let ns = began.saturating_duration_since(self.epoch).as_nanos() as u64;
            slot.fetch_max(ns, Ordering::Release);
        }
    }

    /// Tells the table how far every socket has been read.
    fn apply(&self, table: &mut PeerTable) {
        for (index, slot) in self.drained.iter().enumerate() {
            let ns = slot.load(Ordering::Acquire);
            table.read_up_to(index, self.epoch + Duration::from_nanos(ns));
        }
    }
}

/// Reads every socket's drop counter directly into the table (SO_MEMINFO):
/// the drops after the last datagram queued are in no datagram's stamp.
fn observe_drops(sockets: &[Socket], table: &mut PeerTable) {
    let now = Instant::now();
    for (index, socket) in sockets.iter().enumerate() {
        if let Ok(raw) = sys::kernel_drop_count(socket) {
            table.observe_kernel_drops(index, raw, now);
        }
    }
}

/// Counts what the receive loops read into the shared table.
struct Counter<'a, C> {
    shared: &'a Mutex<Shared<C>>,
    cpu: &'a ReceiveCpu,
    buffer: &'a BufferWatch,
    progress: &'a ReadProgress,
    /// The thread that finalises sessions, woken when one needs it sooner
    /// than its next regular look.
    main: std::thread::Thread,
}

impl<C: Control + Send> Deliver for Counter<'_, C> {
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
            let Shared { table, control } = &mut *guard;
            // The latest arrival read: the queue is first in, first out, so
            // everything that arrived before it has been read.
            let mut latest: Option<Instant> = None;
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
                table.on_receive_with(received.data, &rx, &mut replies, control);
                latest = Some(latest.map_or(at, |l| l.max(at)));
            }
            if let Some(latest) = latest {
                table.read_up_to(index, latest);
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

    fn drained(&self, index: usize, began: Instant) {
        self.progress.drained(index, began);
    }
}

/// Sends answers; best effort: a lost answer is retried by its asker.
fn send_replies(sockets: &[Socket], replies: &mut Vec<Reply>) {
    for reply in replies.drain(..) {
        if let Some(socket) = sockets.get(reply.socket).or(sockets.first()) {
            let _ = sys::send_from(socket, reply.bytes.as_slice(), reply.to, reply.from);
        }
    }
}

/// The longest the finalising thread sleeps: how late it notices a
/// shutdown, an idle peer or an expired record.
const LONGEST_NAP: Duration = Duration::from_millis(100);
/// Its nap once shutting down, so the receive threads can finish.
const LAST_LOOK: Duration = Duration::from_millis(20);

/// Receives and counts until `shutdown` is set, handing every event to
/// `events` from the calling thread, which finalises sessions (sending
/// their answers), writes interval reports, expires idle peers and runs
/// `role`'s hooks. `control` takes the control messages the table does
/// not handle itself.
pub fn run<R: Role>(
    bound: &Bound,
    cfg: &ReceiverConfig,
    control: R::Control,
    role: &mut R,
    shutdown: &Shutdown,
    events: &mut dyn FnMut(R::Event),
) -> Result<ReceiverSummary> {
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
        // picks, which a peer may not recognise on a multi-homed host.
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
    let mut table = table;
    for &key in &cfg.expected {
        table.expect(key, start);
    }
    let shared = Mutex::new(Shared { table, control });
    let receive_cpu = ReceiveCpu::new(bound.sockets.len(), start);
    let buffer_watch = BufferWatch::new(bound.sockets.len(), start);
    let read_progress = ReadProgress::new(bound.sockets.len(), start);
    let gauges = Gauges {
        cpu: &receive_cpu,
        buffer: &buffer_watch,
        drops_supported,
        threads: bound.sockets.len(),
    };
    let process_cpu_at_start = sys::process_cpu();
    let counter = Counter {
        shared: &shared,
        cpu: &receive_cpu,
        buffer: &buffer_watch,
        progress: &read_progress,
        main: std::thread::current(),
    };
    role.start(start, &gauges);
    let receivers_done = Shutdown::new();
    let mut pending: Vec<R::Event> = Vec::new();
    let mut replies = Vec::new();
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
        let mut nap = LONGEST_NAP;
        loop {
            let stopping = shutdown.is_triggered() || receivers.iter().any(|h| h.is_finished());
            if stopping {
                receivers_done.trigger();
                nap = nap.min(LAST_LOOK);
            }
            // Sleeps until the next interval or grace period ends, or a
            // receive thread wakes it, or LONGEST_NAP: a fixed short tick
            // cost an idle receiver a wake-up every 20 ms.
            std::thread::park_timeout(nap);
            let now = Instant::now();
            {
                let mut guard = shared.lock().unwrap_or_else(|p| p.into_inner());
                let Shared { table, control } = &mut *guard;
                read_progress.apply(table);
                if drops_supported {
                    observe_drops(&bound.sockets, table);
                }
                let mut pass = Pass {
                    now,
                    table,
                    control,
                    events: &mut pending,
                    replies: &mut replies,
                    ticked: false,
                    stopping,
                    last: false,
                    gauges: &gauges,
                };
                role.before_tick(&mut pass);
                if let Some(due) = next_interval.filter(|due| now >= *due) {
                    pass.ticked = true;
                    let mut sink = |e: Event| pass.events.push(R::Event::from(e));
                    pass.table
                        .tick_intervals(now, receive_cpu.total(), &mut sink);
                    let interval = cfg.interval.expect("interval set");
                    next_interval = Some(if due + interval <= now {
                        now + interval
                    } else {
                        due + interval
                    });
                }
                let mut sink = |e: Event| pass.events.push(R::Event::from(e));
                pass.table.expire(now, &mut sink, pass.replies);
                role.after_tick(&mut pass);
                let due = [
                    next_interval,
                    pass.table.next_due(now),
                    role.next_due(pass.control),
                ]
                .into_iter()
                .flatten()
                .min();
                nap = due.map_or(LONGEST_NAP, |due| {
                    due.saturating_duration_since(Instant::now())
                        .min(LONGEST_NAP)
                });
            }
            send_replies(&bound.sockets, &mut replies);
            role.after_pass();
            for event in pending.drain(..) {
                events(event);
            }
            if stopping {
                break;
            }
        }
        recv::join_receive_threads(receivers)
    });
    // The last pass: the role finishes its own work, then every session
    // left is finished and answered once.
    let mut guard = shared.lock().unwrap_or_else(|p| p.into_inner());
    let Shared { table, control } = &mut *guard;
    if drops_supported {
        observe_drops(&bound.sockets, table);
    }
    let now = Instant::now();
    let mut pass = Pass {
        now,
        table,
        control,
        events: &mut pending,
        replies: &mut replies,
        ticked: false,
        stopping: true,
        last: true,
        gauges: &gauges,
    };
    role.finish(&mut pass);
    let mut sink = |e: Event| pass.events.push(R::Event::from(e));
    pass.table.finish_all(now, &mut sink, pass.replies);
    role.after_tick(&mut pass);
    send_replies(&bound.sockets, &mut replies);
    for event in pending.drain(..) {
        events(event);
    }
    result.map_err(|e| Error::runtime(format!("receive failed: {e}")))?;
    let wall = start.elapsed();
    let cpu = sys::process_cpu()
        .zip(process_cpu_at_start)
        .map(|(now, then)| CpuCost::of(now.since(then), wall, table.totals.bytes));
    Ok(ReceiverSummary {
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
