//! `tcp_proxy`: forwards each accepted TCP connection to one upstream, in
//! one of six ways ([`Mode`]), and the latency benchmark that compares them
//! ([`latency_bench`]).
//!
//! Why six: seed 004 compared Go's `io.Copy` with Rust proxies built on
//! tokio and std and found 20 ms rows it never explained. They were Nagle's
//! algorithm meeting delayed ACK (docs/proxy.md), not the choice of runtime.
//! Keeping all six lets the benchmark show that, once TCP_NODELAY is set on
//! both legs, the differences are microseconds, and that splice(2) is the
//! one that moves bulk data fastest.
//!
//! # Layout
//! - [`crate::config::proxy`]: flags and TOML into a validated
//!   [`ProxyConfig`].
//! - [`events`]: what the proxy reports ([`ProxyEvent`]), sent to the
//!   [`EventSink`] it is given; `crate::output::proxy` prints them.
//! - `relay`: the four modes that run on tokio (tokio, tokio-copy,
//!   copy-bidirectional, splice).
//! - `blocking`: the two std modes, a thread per direction.
//! - [`capacity`]: the descriptor limit, raised at start, and how many
//!   connections it allows (`--max-conns` is capped to it).
//! - [`pipes`]: splice's pipes, which grow on demand under `--pipe-budget`.
//! - [`http`]: the keep-alive HTTP/1.1 test server and client of the benchmark.
//! - [`latency_bench`]: the matrix behind `tcp_proxy bench`; its latency
//!   percentiles come from [`crate::stats::histogram`].
//!
//! Every mode has the same contract: bytes are counted per direction, EOF
//! from one side becomes `shutdown(Write)` on the other leg while the other
//! direction keeps flowing (half-close), a socket error ends the whole
//! connection, and `--idle-timeout` ends it when neither direction has moved
//! a byte for that long.
//!
//! # A connection's end is recorded in one place
//! Every accepted connection has an entry in `Ctx`'s table of live
//! connections until `Ctx::close` takes it out, sends its `conn_closed`
//! event and adds its bytes to the summary. Every end goes there: EOF both
//! ways, an error, the idle time-out, and the drain deadline. (The proxy
//! used to just exit at the deadline, so the connections it cut had no
//! line and added no bytes: "2 cut at the drain deadline; 0 B" after
//! seconds of iperf3.) At the deadline each connection's `Cut` fires,
//! its relay stops and reports [`End::Cut`] through the usual path (the std
//! modes shut their sockets and wait for their two threads first), and any
//! that could not stop within `CUT_GRACE` are closed from the table with
//! the bytes counted so far. Taking the entry out of the table is what
//! makes each connection reported and counted exactly once, whoever gets
//! there first.
//!
//! A byte is counted when it has been written to the other leg, write by
//! write, so the counts are what each peer was handed, also for a
//! connection that is cut half-way through a buffer.

mod blocking;
pub mod capacity;
pub mod events;
pub mod http;
pub mod latency_bench;
pub mod pipes;
mod relay;

pub use capacity::Capacity;
pub use events::{ConnReport, End, EventSink, ProxyEvent, Summary};

use crate::config::proxy::{Mode, ProxyConfig};
use crate::error::{Error, Result};
use crate::shutdown::{Shutdown, POLL};
use futures::channel::oneshot;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long the accept loop pauses when the process is out of
/// descriptors: connections wait in the backlog meanwhile, and a
/// connection that closes gives its descriptors back.
const FD_LIMIT_PAUSE: Duration = Duration::from_millis(100);

/// Pending connections the kernel may queue before we accept them; large
/// enough for a burst of 1000 clients without SYN retries.
const BACKLOG: i32 = 1024;

/// Binds the listening socket (SO_REUSEADDR, a deep backlog). Port 0 picks
/// a free port; read it back with `local_addr`.
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener> {
    let fail = |what: &str, e: std::io::Error| Error::io(format!("{what} {addr}"), e);
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .map_err(|e| fail("cannot create a socket for", e))?;
    socket
        .set_reuse_address(true)
        .map_err(|e| fail("cannot set SO_REUSEADDR on", e))?;
    socket
        .bind(&addr.into())
        .map_err(|e| fail("cannot bind", e))?;
    socket
        .listen(BACKLOG)
        .map_err(|e| fail("cannot listen on", e))?;
    socket
        .set_nonblocking(true)
        .map_err(|e| fail("cannot make non-blocking:", e))?;
    Ok(socket.into())
}

/// Byte counters and the time of the last byte, shared by both directions
/// of one connection (and read by its idle watchdog). A byte counts once it
/// has been written to the destination leg.
#[derive(Debug)]
pub(crate) struct Meter {
    base: Instant,
    pub up: AtomicU64,
    pub down: AtomicU64,
    /// Nanoseconds since `base` of the last byte in either direction.
    last: AtomicU64,
    /// `--mode splice`: each direction's pipe size now (0: no pipe).
    pub pipe_up: AtomicUsize,
    pub pipe_down: AtomicUsize,
}

impl Meter {
    fn new() -> Meter {
        Meter {
            base: Instant::now(),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            last: AtomicU64::new(0),
            pipe_up: AtomicUsize::new(0),
            pipe_down: AtomicUsize::new(0),
        }
    }

    /// Counts `n` bytes on `counter` and notes the activity.
    pub fn add(&self, counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
        self.last
            .store(self.base.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// How long since the last byte moved (or since the connection opened).
    pub fn idle_for(&self) -> Duration {
        let last = Duration::from_nanos(self.last.load(Ordering::Relaxed));
        self.base.elapsed().saturating_sub(last)
    }

    fn report(&self, id: u64, client: SocketAddr, end: End) -> ConnReport {
        ConnReport {
            id,
            client,
            client_to_upstream: self.up.load(Ordering::Relaxed),
            upstream_to_client: self.down.load(Ordering::Relaxed),
            seconds: self.base.elapsed().as_secs_f64(),
            end,
            pipe_client_to_upstream: pipe_size(&self.pipe_up),
            pipe_upstream_to_client: pipe_size(&self.pipe_down),
        }
    }
}

/// A pipe size for the report: `None` for a connection without one.
fn pipe_size(size: &AtomicUsize) -> Option<usize> {
    Some(size.load(Ordering::Relaxed)).filter(|&n| n > 0)
}

/// Resolves once the drain deadline has passed (the drain drops the
/// sender, which [`Live`] keeps); the relay then ends as [`End::Cut`].
pub(crate) type Cut = oneshot::Receiver<()>;

/// How long connections get to stop after the cut before the drain closes
/// them itself. The tokio relays stop at their next poll; the std threads
/// wake as soon as their sockets are shut down.
const CUT_GRACE: Duration = Duration::from_secs(1);

/// A live connection, as the drain sees it. The accept loop enters it with
/// no allocation of its own; the connection's task adds its meter and its
/// cut once it runs. Why there: small blocks malloc'ed by the accept thread
/// and freed by a worker stay scattered in the accept thread's heap (glibc
/// keeps them in per-thread caches and fast bins), and pin its memory after
/// the connections close.
struct Live {
    client: SocketAddr,
    started: Option<Started>,
    /// The drain cut this connection before its task started.
    cut_early: bool,
}

struct Started {
    meter: Arc<Meter>,
    /// Dropped to cut the connection.
    cut: Option<oneshot::Sender<()>>,
}

/// State shared by the accept loop and every connection.
pub(crate) struct Ctx {
    /// The configuration, with `max_conns` capped to [`Capacity`].
    pub cfg: ProxyConfig,
    /// What the descriptor limit allows.
    capacity: Capacity,
    events: EventSink,
    /// Every accepted connection until it is closed: its size is the number
    /// open (for `--max-conns`). Sized up front, so that it does not grow
    /// (and move) in the middle of the connections' memory.
    live: Mutex<HashMap<u64, Live>>,
    summary: Mutex<Summary>,
    /// What every connection's splice pipes may hold together.
    pub pipes: pipes::PipePool,
    /// The first direction that found no pipe has been reported.
    pipe_unavailable_reported: AtomicBool,
    /// The first refused pipe growth has been reported.
    pipe_refusal_reported: AtomicBool,
    /// A connection ran out of descriptors: the accept loop pauses.
    pause_accept: AtomicBool,
}

impl Ctx {
    fn new(cfg: &ProxyConfig, capacity: Capacity, events: EventSink) -> Ctx {
        let mut cfg = cfg.clone();
        cfg.max_conns = capacity.max_conns;
        let table = cfg.max_conns.min(4096);
        let pipes = pipes::PipePool::new(
            cfg.pipe_budget,
            capacity.pipes_max.unwrap_or(0),
            capacity.pipe_pool_max.unwrap_or(0),
        );
        Ctx {
            cfg,
            capacity,
            events,
            live: Mutex::new(HashMap::with_capacity(table)),
            summary: Mutex::new(Summary::default()),
            pipes,
            pipe_refusal_reported: AtomicBool::new(false),
            pipe_unavailable_reported: AtomicBool::new(false),
            pause_accept: AtomicBool::new(false),
        }
    }

    /// A poisoned lock only means another connection's thread panicked;
    /// the table and the totals are still whole, so keep using them.
    fn live(&self) -> MutexGuard<'_, HashMap<u64, Live>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn emit(&self, event: ProxyEvent) {
        (self.events)(event);
    }

    fn summary(&self) -> MutexGuard<'_, Summary> {
        self.summary.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn open_count(&self) -> usize {
        self.live().len()
    }

    /// Enters a just-accepted connection in the table.
    fn open(&self, id: u64, client: SocketAddr) {
        let live = Live {
            client,
            started: None,
            cut_early: false,
        };
        self.live().insert(id, live);
        self.summary().accepted += 1;
    }

    /// Called by the connection's task as it starts: its meter, and the
    /// cut it must select on (already fired if the drain got there first).
    fn start(self: &Arc<Self>, id: u64) -> (Conn, Cut) {
        let meter = Arc::new(Meter::new());
        let (fire, cut) = oneshot::channel();
        if let Some(live) = self.live().get_mut(&id) {
            let fire = (!live.cut_early).then_some(fire);
            live.started = Some(Started {
                meter: Arc::clone(&meter),
                cut: fire,
            });
        }
        let conn = Conn {
            ctx: Arc::clone(self),
            id,
            meter,
            end: None,
        };
        (conn, cut)
    }

    /// The one place a connection ends. It leaves the table (which frees
    /// its `--max-conns` slot before the event is sent, so whoever reads
    /// it may connect again at once), then its `conn_closed` event is sent
    /// and its bytes are added to the totals. A connection that never
    /// reached the upstream has its own event (`upstream_failed`, or
    /// `fd_limit_reached`) and is only counted. A second call for the same
    /// connection does nothing.
    fn close(&self, id: u64, outcome: Outcome) {
        let Some(live) = self.live().remove(&id) else {
            return;
        };
        let mut summary = self.summary();
        let end = match outcome {
            Outcome::Relayed(end) => end,
            Outcome::UpstreamFailed => {
                summary.upstream_failures += 1;
                return;
            }
            Outcome::OutOfFiles => {
                summary.fd_limit_refused += 1;
                return;
            }
        };
        let report = match &live.started {
            Some(started) => started.meter.report(id, live.client, end),
            None => Meter::new().report(id, live.client, end),
        };
        summary.client_to_upstream += report.client_to_upstream;
        summary.upstream_to_client += report.upstream_to_client;
        match report.end {
            End::Cut => summary.cut_at_deadline += 1,
            End::Reset => summary.resets += 1,
            End::Error(_) => summary.errors += 1,
            End::Closed | End::Idle => {}
        }
        drop(summary);
        self.emit(ProxyEvent::ConnClosed(report));
    }

    /// A pipe of connection `id` could not grow: counted in the summary,
    /// and the first one of the run is reported as an event.
    pub(crate) fn pipe_growth_refused(
        &self,
        id: u64,
        direction: &'static str,
        refusal: pipes::Refusal,
    ) {
        self.summary().pipe_growths_refused += 1;
        if self.pipe_refusal_reported.swap(true, Ordering::Relaxed) {
            return;
        }
        self.emit(ProxyEvent::PipeGrowthRefused {
            id,
            direction,
            from: refusal.from,
            to: refusal.to,
            refused_by: refusal.by,
            pipe_budget: self.pipes.budget().limit(),
            pipes_grown: self.pipes.budget().charged(),
        });
    }

    /// A splice direction of connection `id` found no pipe (`error`: the
    /// kernel refused one; else all `pipes_max` are open) and copies its
    /// burst through a buffer instead: counted once per direction, and the
    /// first one of the run reported.
    pub(crate) fn pipe_unavailable(
        &self,
        id: u64,
        direction: &'static str,
        error: Option<&std::io::Error>,
    ) {
        self.summary().pipes_unavailable += 1;
        if self.pipe_unavailable_reported.swap(true, Ordering::Relaxed) {
            return;
        }
        self.emit(ProxyEvent::PipeUnavailable {
            id,
            direction,
            pipes_max: self.capacity.pipes_max.unwrap_or(0),
            error: error.map(|e| e.to_string()),
        });
    }

    /// The process is out of descriptors (EMFILE, ENFILE) at `at`: said as
    /// what it is, the local limit, and the accept loop pauses.
    fn out_of_files(
        &self,
        at: events::FdLimitAt,
        conn: Option<(u64, SocketAddr)>,
        error: &std::io::Error,
    ) -> Outcome {
        self.pause_accept.store(true, Ordering::Relaxed);
        self.emit(ProxyEvent::FdLimitReached {
            at,
            id: conn.map(|c| c.0),
            client: conn.map(|c| c.1),
            error: error.to_string(),
            open: self.open_count(),
            fd_limit: self.capacity.fd_limit,
        });
        Outcome::OutOfFiles
    }

    /// The drain deadline: tells every open connection to stop.
    fn cut_all(&self) {
        for live in self.live().values_mut() {
            match &mut live.started {
                Some(started) => drop(started.cut.take()),
                None => live.cut_early = true,
            }
        }
    }

    /// Waits until no connection is open or `deadline` has passed.
    async fn wait_all_closed(&self, deadline: Instant) {
        while self.open_count() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A started connection's handle on its entry in [`Ctx`]'s table. Its task
/// closes it with how it ended; should the task be dropped first (a
/// panic), the entry is closed as an error on drop, so the `--max-conns`
/// slot frees.
pub(crate) struct Conn {
    ctx: Arc<Ctx>,
    id: u64,
    meter: Arc<Meter>,
    /// Set by [`Conn::close`].
    end: Option<Outcome>,
}

impl Conn {
    fn close(mut self, end: Outcome) {
        self.end = Some(end);
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let end = self.end.take().unwrap_or_else(|| {
            Outcome::Relayed(End::Error("the connection's task ended early".into()))
        });
        self.ctx.close(self.id, end);
    }
}

/// Runs the proxy on an already bound `listener` until `shutdown` fires,
/// then drains open connections for up to `--drain-timeout`. Every event
/// goes to `events`. The listening event is sent once the runtime is up and the listener is
/// registered, so whoever reads it can connect, and count its fds, at once.
pub fn run(
    listener: std::net::TcpListener,
    cfg: &ProxyConfig,
    shutdown: &Shutdown,
    events: EventSink,
) -> Result<Summary> {
    if !cfg.mode.available() {
        return Err(Error::usage(format!(
            "--mode {} needs Linux (splice(2)); use --mode tokio or std here",
            cfg.mode.name()
        )));
    }
    let runtime = if cfg.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.threads)
            .enable_io()
            .enable_time()
            .build()
    }
    .map_err(|e| Error::io("cannot start the tokio runtime", e))?;
    // Once the runtime is up: its epoll and wake-up descriptors are then
    // counted as open, where a guess for them used to sit in the headroom.
    let capacity = Capacity::at_start(cfg.mode, cfg.max_conns)?;
    let ctx = Arc::new(Ctx::new(cfg, capacity, events));
    // The accept loop runs as a task on the runtime, not on this thread:
    // a connection it spawns then starts on the worker that accepted it,
    // where from this thread every connection cost a cross-thread wake
    // (a futex and an eventfd write).
    let accepting = accept_loop(listener, Arc::clone(&ctx), shutdown.clone());
    let summary = runtime
        .block_on(runtime.spawn(accepting))
        .map_err(|e| Error::io("the accept loop failed", std::io::Error::other(e)))??;
    // Every connection has been closed and counted; what is left of their
    // tasks is dropped here.
    runtime.shutdown_timeout(Duration::from_millis(100));
    ctx.emit(ProxyEvent::Stopped(summary.clone()));
    Ok(summary)
}

async fn accept_loop(
    listener: std::net::TcpListener,
    ctx: Arc<Ctx>,
    shutdown: Shutdown,
) -> Result<Summary> {
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|e| Error::io("cannot register the listener", e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("cannot read the bound address", e))?;
    let listening = events::Listening::new(addr, &ctx.cfg, &ctx.capacity);
    ctx.emit(ProxyEvent::Listening(Box::new(listening)));
    if ctx.capacity.capped() {
        ctx.emit(ProxyEvent::MaxConnsCapped {
            max_conns_asked: ctx.capacity.max_conns_asked,
            max_conns: ctx.capacity.max_conns,
            fd_limit: ctx.capacity.fd_limit.unwrap_or(0),
            fds_needed: ctx.capacity.fds_needed(ctx.capacity.max_conns_asked),
            message: ctx.capacity.capped_text(),
        });
    }
    let mut next_id = 0u64;
    // One timer for the whole loop (a new one per accept cost a timer
    // registration per connection): it wakes the loop to look at the
    // shutdown flag when nobody connects.
    let mut look = tokio::time::interval(POLL);
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !shutdown.is_triggered() {
        if ctx.pause_accept.swap(false, Ordering::Relaxed) {
            // Out of descriptors at accept or at an upstream connect:
            // accepting more now would only fail or refuse them too.
            ctx.summary().accept_paused += 1;
            tokio::time::sleep(FD_LIMIT_PAUSE).await;
            continue;
        }
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = look.tick() => continue,
        };
        let (stream, client) = match accepted {
            Ok(a) => a,
            Err(e) if crate::sys::is_out_of_files(&e) => {
                // The connection waits in the backlog; the ones open keep
                // being served. Pause rather than spin on a listener that
                // stays readable.
                ctx.out_of_files(events::FdLimitAt::Accept, None, &e);
                continue;
            }
            Err(e) => {
                // Anything else: say so, and back off instead of spinning.
                ctx.emit(ProxyEvent::AcceptFailed {
                    error: e.to_string(),
                });
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        next_id += 1;
        if ctx.open_count() >= ctx.cfg.max_conns {
            ctx.summary().rejected += 1;
            ctx.emit(ProxyEvent::Rejected {
                client,
                max_conns: ctx.cfg.max_conns,
                limited_by: if ctx.capacity.capped() {
                    "fd_limit"
                } else {
                    "max_conns"
                },
            });
            drop(stream);
            continue;
        }
        ctx.open(next_id, client);
        tokio::spawn(connection(Arc::clone(&ctx), next_id, stream, client));
    }
    drop(listener);
    ctx.emit(ProxyEvent::Draining {
        open: ctx.open_count(),
        deadline_seconds: ctx.cfg.drain_timeout.as_secs_f64(),
    });
    ctx.wait_all_closed(Instant::now() + ctx.cfg.drain_timeout)
        .await;
    if ctx.open_count() > 0 {
        ctx.cut_all();
        ctx.wait_all_closed(Instant::now() + CUT_GRACE).await;
        // Whatever did not stop in time is closed here, with the bytes it
        // had moved so far.
        let left: Vec<u64> = ctx.live().keys().copied().collect();
        for id in left {
            ctx.close(id, Outcome::Relayed(End::Cut));
        }
    }
    let mut summary = ctx.summary().clone();
    if ctx.cfg.mode == Mode::Splice {
        summary.pipes_created = ctx.pipes.created();
        summary.pipes_reused = ctx.pipes.reused();
        summary.pipes_in_use = ctx.pipes.in_use();
        summary.pipes_pooled = ctx.pipes.pooled();
    }
    Ok(summary)
}

/// One accepted client: connect upstream, then relay in the chosen mode.
/// The drain deadline cuts it in either phase.
async fn connection(
    ctx: Arc<Ctx>,
    id: u64,
    client: tokio::net::TcpStream,
    client_addr: SocketAddr,
) {
    let (conn, cut) = ctx.start(id);
    let end = serve(&ctx, &conn, cut, client, client_addr).await;
    conn.close(end);
}

/// How a connection's task ended.
pub(crate) enum Outcome {
    /// It reached the upstream and relayed until `End`.
    Relayed(End),
    /// The upstream refused or did not answer.
    UpstreamFailed,
    /// The process had no descriptor left for the upstream leg (EMFILE,
    /// ENFILE): the local limit, not the upstream's doing.
    OutOfFiles,
}

/// Connects upstream and relays.
async fn serve(
    ctx: &Ctx,
    conn: &Conn,
    mut cut: Cut,
    client: tokio::net::TcpStream,
    client_addr: SocketAddr,
) -> Outcome {
    let cfg = &ctx.cfg;
    let connect = tokio::time::timeout(
        cfg.connect_timeout,
        tokio::net::TcpStream::connect(cfg.upstream),
    );
    let upstream = tokio::select! {
        biased;
        r = connect => match r {
            Ok(Ok(s)) => s,
            Ok(Err(e)) if crate::sys::is_out_of_files(&e) => {
                return ctx.out_of_files(events::FdLimitAt::Upstream, Some((conn.id, client_addr)), &e);
            }
            Ok(Err(e)) => return upstream_failed(ctx, conn.id, client_addr, &e.to_string()),
            Err(_) => {
                let why = format!("no answer within {:?}", cfg.connect_timeout);
                return upstream_failed(ctx, conn.id, client_addr, &why);
            }
        },
        _ = &mut cut => return Outcome::Relayed(End::Cut),
    };
    if cfg.nodelay {
        // Seed 004's 20 ms rows came from leaving these off; see docs/proxy.md.
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
    }
    if let Some(algo) = cfg.congestion {
        // Checked at start-up; a failure now is worth an event, not a silent
        // connection on the system default.
        for leg in [
            socket2::SockRef::from(&client),
            socket2::SockRef::from(&upstream),
        ] {
            if let Err(e) = algo.apply(&leg) {
                return Outcome::Relayed(End::Error(format!(
                    "cannot set --congestion {algo}: {e}"
                )));
            }
        }
    }
    Outcome::Relayed(if cfg.mode.uses_runtime() {
        relay::relay(ctx, conn.id, client, upstream, &conn.meter, cut).await
    } else {
        blocking::relay(cfg, conn.id, client, upstream, &conn.meter, cut).await
    })
}

fn upstream_failed(ctx: &Ctx, id: u64, client: SocketAddr, why: &str) -> Outcome {
    ctx.emit(ProxyEvent::UpstreamFailed {
        id,
        client,
        upstream: ctx.cfg.upstream,
        error: why.to_string(),
    });
    Outcome::UpstreamFailed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// The proxy reports through its sink alone: a run can be checked
    /// from the events, with nothing printed.
    #[test]
    fn events_reach_the_sink_in_order() {
        let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut cfg = ProxyConfig::new(
            "127.0.0.1:0".parse().unwrap(),
            upstream.local_addr().unwrap(),
        );
        cfg.mode = Mode::Tokio;
        cfg.threads = 1;
        let listener = bind(cfg.listen).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let shutdown = Shutdown::new();
        let stop = shutdown.clone();
        let proxy = std::thread::spawn(move || {
            let events: EventSink = Box::new(move |e| sink.lock().unwrap().push(e));
            run(listener, &cfg, &stop, events).unwrap()
        });
        let echo = std::thread::spawn(move || {
            let (mut s, _) = upstream.accept().unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf).unwrap();
        });
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        client.write_all(b"hello").unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).unwrap();
        assert_eq!(back, b"hello");
        echo.join().unwrap();
        drop(client);
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.lock().unwrap().len() < 2 {
            assert!(Instant::now() < deadline, "no conn_closed event");
            std::thread::sleep(Duration::from_millis(5));
        }
        shutdown.trigger();
        let summary = proxy.join().unwrap();
        assert_eq!((summary.accepted, summary.client_to_upstream), (1, 5));
        let names: Vec<String> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|e| serde_json::to_value(e).unwrap()["event"].to_string())
            .collect();
        assert_eq!(
            names,
            [
                "\"listening\"",
                "\"conn_closed\"",
                "\"draining\"",
                "\"stopped\""
            ]
        );
    }
}
