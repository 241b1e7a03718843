//! `tcp_proxy`: forwards each accepted TCP connection to one upstream, in
//! one of six ways ([`Mode`]), and the latency benchmark that compares them
//! ([`bench`]).
//!
//! Why six: seed 004 compared Go's `io.Copy` with Rust proxies built on
//! tokio and std and found 20 ms rows it never explained. They were Nagle's
//! algorithm meeting delayed ACK (docs/proxy.md), not the choice of runtime.
//! Keeping all six lets the benchmark show that, once TCP_NODELAY is set on
//! both legs, the differences are microseconds, and that splice(2) is the
//! one that moves bulk data fastest.
//!
//! # Layout
//! - [`config`]: flags and TOML into a validated [`ProxyConfig`].
//! - [`log`]: the event lines (text on stderr, or NDJSON on stdout).
//! - `relay`: the four modes that run on tokio (tokio, tokio-copy,
//!   copy-bidirectional, splice).
//! - `blocking`: the two std modes, a thread per direction.
//! - [`http`]: the keep-alive HTTP/1.1 test server and client of the benchmark.
//! - [`histogram`]: latency percentiles on an HDR histogram.
//! - [`bench`]: the matrix behind `tcp_proxy bench`.
//!
//! Every mode has the same contract: bytes are counted per direction, EOF
//! from one side becomes `shutdown(Write)` on the other leg while the other
//! direction keeps flowing (half-close), a socket error ends the whole
//! connection, and `--idle-timeout` ends it when neither direction has moved
//! a byte for that long.

pub mod bench;
mod blocking;
pub mod config;
pub mod histogram;
pub mod http;
pub mod log;
mod relay;

pub use config::{Mode, ProxyArgs, ProxyConfig};
pub use log::{ConnReport, End, EventLog, Summary};

use crate::error::{Error, Result};
use crate::shutdown::{Shutdown, POLL};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Pending connections the kernel may queue before we accept them; large
/// enough for a burst of 1000 clients without SYN retries.
const BACKLOG: i32 = 1024;

/// Binds the listening socket (SO_REUSEADDR, a deep backlog). Port 0 picks
/// a free port; read it back with `local_addr`.
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener> {
    let fail = |what: &str, e: std::io::Error| Error::runtime(format!("{what} {addr}: {e}"));
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
/// of one connection (and read by its idle watchdog).
#[derive(Debug)]
pub(crate) struct Meter {
    base: Instant,
    pub up: AtomicU64,
    pub down: AtomicU64,
    /// Nanoseconds since `base` of the last byte in either direction.
    last: AtomicU64,
}

impl Meter {
    fn new() -> Meter {
        Meter {
            base: Instant::now(),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            last: AtomicU64::new(0),
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
        }
    }
}

/// State shared by the accept loop and every connection.
pub(crate) struct Ctx {
    pub cfg: ProxyConfig,
    pub log: EventLog,
    open: AtomicUsize,
    summary: Mutex<Summary>,
}

impl Ctx {
    /// Logs a finished connection and adds it to the totals.
    fn finish(&self, meter: &Meter, id: u64, client: SocketAddr, end: End) {
        let report = meter.report(id, client, end);
        self.log.conn_closed(&report);
        if let Ok(mut s) = self.summary.lock() {
            s.client_to_upstream += report.client_to_upstream;
            s.upstream_to_client += report.upstream_to_client;
        }
    }
}

/// Holds one slot of `--max-conns`; the slot frees when the connection's
/// last task or thread drops it.
pub(crate) struct Slot(Arc<Ctx>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs the proxy on an already bound `listener` until `shutdown` fires,
/// then drains open connections for up to `--drain-timeout`. The
/// listening line is printed once the runtime is up and the listener is
/// registered, so whoever reads it can connect, and count its fds, at once.
pub fn run(
    listener: std::net::TcpListener,
    cfg: &ProxyConfig,
    shutdown: &Shutdown,
    log: EventLog,
) -> Result<Summary> {
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
    .map_err(|e| Error::runtime(format!("cannot start the tokio runtime: {e}")))?;
    let ctx = Arc::new(Ctx {
        cfg: cfg.clone(),
        log,
        open: AtomicUsize::new(0),
        summary: Mutex::new(Summary::default()),
    });
    let summary = runtime.block_on(accept_loop(listener, Arc::clone(&ctx), shutdown.clone()))?;
    // Connections still open were cut by the deadline; don't wait for them.
    runtime.shutdown_timeout(Duration::from_millis(100));
    log.stopped(&summary);
    Ok(summary)
}

async fn accept_loop(
    listener: std::net::TcpListener,
    ctx: Arc<Ctx>,
    shutdown: Shutdown,
) -> Result<Summary> {
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|e| Error::runtime(format!("cannot register the listener: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::runtime(format!("cannot read the bound address: {e}")))?;
    ctx.log.listening(addr, &ctx.cfg);
    let mut next_id = 0u64;
    while !shutdown.is_triggered() {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = tokio::time::sleep(POLL) => continue,
        };
        let (stream, client) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and friends: say so, and back off instead of spinning.
                ctx.log.accept_failed(&e.to_string());
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        next_id += 1;
        if ctx.open.load(Ordering::Acquire) >= ctx.cfg.max_conns {
            if let Ok(mut s) = ctx.summary.lock() {
                s.rejected += 1;
            }
            ctx.log.rejected(client, ctx.cfg.max_conns);
            drop(stream);
            continue;
        }
        ctx.open.fetch_add(1, Ordering::AcqRel);
        if let Ok(mut s) = ctx.summary.lock() {
            s.accepted += 1;
        }
        let slot = Slot(Arc::clone(&ctx));
        tokio::spawn(connection(Arc::clone(&ctx), slot, stream, client, next_id));
    }
    drop(listener);
    let open = ctx.open.load(Ordering::Acquire);
    let deadline = Instant::now() + ctx.cfg.drain_timeout;
    ctx.log.draining(open, ctx.cfg.drain_timeout.as_secs_f64());
    while ctx.open.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut summary = ctx.summary.lock().map(|s| s.clone()).unwrap_or_default();
    summary.cut_at_deadline = ctx.open.load(Ordering::Acquire);
    Ok(summary)
}

/// One accepted client: connect upstream, then relay in the chosen mode.
async fn connection(
    ctx: Arc<Ctx>,
    slot: Slot,
    client: tokio::net::TcpStream,
    client_addr: SocketAddr,
    id: u64,
) {
    let cfg = &ctx.cfg;
    let upstream = match tokio::time::timeout(
        cfg.connect_timeout,
        tokio::net::TcpStream::connect(cfg.upstream),
    )
    .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return upstream_failed(&ctx, id, client_addr, &e.to_string()),
        Err(_) => {
            let why = format!("no answer within {:?}", cfg.connect_timeout);
            return upstream_failed(&ctx, id, client_addr, &why);
        }
    };
    if cfg.nodelay {
        // Seed 004's 20 ms rows came from leaving these off; see docs/proxy.md.
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
    }
    if let Some(algo) = cfg.congestion {
        // Checked at start-up; a failure now is worth a line, not a silent
        // connection on the system default.
        for leg in [
            socket2::SockRef::from(&client),
            socket2::SockRef::from(&upstream),
        ] {
            if let Err(e) = algo.apply(&leg) {
                let why = format!("cannot set --congestion {algo}: {e}");
                let meter = Meter::new();
                drop(slot);
                return ctx.finish(&meter, id, client_addr, End::Error(why));
            }
        }
    }
    let meter = Arc::new(Meter::new());
    if cfg.mode.uses_runtime() {
        let end = relay::relay(cfg, client, upstream, &meter).await;
        // Free the slot before logging: whoever reads the log line may
        // connect again at once.
        drop(slot);
        ctx.finish(&meter, id, client_addr, end);
    } else {
        blocking::spawn(
            Arc::clone(&ctx),
            slot,
            client,
            upstream,
            meter,
            client_addr,
            id,
        );
    }
}

fn upstream_failed(ctx: &Ctx, id: u64, client: SocketAddr, why: &str) {
    if let Ok(mut s) = ctx.summary.lock() {
        s.upstream_failures += 1;
    }
    ctx.log.upstream_failed(id, client, ctx.cfg.upstream, why);
}
