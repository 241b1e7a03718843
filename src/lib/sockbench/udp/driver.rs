//! The one driver of a `sockbench udp` configuration: it binds the
//! receiving sockets, opens the senders, starts one task per sender and
//! receiver (or one ping-pong task), runs the clock through warm-up and
//! window, and adds up the counts. A backend ([`Backend`]) contributes
//! only its own socket calls and how it runs a task, so the send,
//! receive and ping-pong loops below exist once for all five libraries.
//!
//! Why the loops are `async` even for the blocking libraries: the async
//! libraries need them so, and a blocking call wrapped in a ready future
//! compiles to the same call (the blocking backends run each loop with a
//! trivial `block_on` on its own thread, and never return `Pending`).
//!
//! How a datagram is counted: its first byte says whether it was sent in
//! the warm-up (0) or the measured window (1). Senders count what they
//! sent in the window; receivers count what they received that was sent
//! in the window, including stragglers read just after it closed.

use super::{Conn, Ip, Mode, Reuse, Timing, UdpCase};
use crate::error::{Error, Result};
use crate::shutdown::Shutdown;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a waiting receiver wakes up to look at the phase.
pub const POLL: Duration = Duration::from_millis(20);
/// Longest time receivers keep draining after the window closes.
pub const DRAIN_MAX: Duration = Duration::from_millis(300);

pub(super) const WARMUP: u8 = 0;
pub(super) const MEASURE: u8 = 1;
pub(super) const DONE: u8 = 2;

/// Joins a task started by [`Backend::spawn`]; None if it panicked.
pub(super) type Join<T> = Box<dyn FnOnce() -> Option<T> + Send>;

/// What a socket library contributes: making its sockets, its send and
/// receive calls, and how it runs a task. How to give way and run a task
/// default to what the blocking libraries do (a thread yield; a thread of
/// its own per task); the async ones bring their runtime's.
pub(super) trait Backend: Sized + 'static {
    /// A sending socket with its destination (None when connected).
    type Tx: Send + 'static;
    /// A receiving socket, shared by the receivers that read it.
    type Rx: Send + Sync + 'static;

    /// Whatever the library needs before its first socket (a runtime).
    fn start(case: &UdpCase) -> Result<Self>;
    /// A receiving socket bound to `addr`, shared as `reuse` says.
    fn bind_rx(&self, addr: SocketAddr, reuse: Reuse) -> io::Result<Self::Rx>;
    fn local_addr(rx: &Self::Rx) -> io::Result<SocketAddr>;
    /// A sending socket bound to `bind`, aimed at `dest`.
    fn open_tx(&self, bind: SocketAddr, dest: SocketAddr, connected: bool) -> io::Result<Self::Tx>;
    fn send<'a>(
        tx: &'a mut Self::Tx,
        buf: &'a [u8],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a;
    /// One datagram, or a transient error after at most [`POLL`].
    fn recv<'a>(
        rx: &'a Self::Rx,
        buf: &'a mut [u8],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a;
    /// Gives way after a full queue.
    fn pause() -> impl Future<Output = ()> + Send {
        std::thread::yield_now();
        std::future::ready(())
    }
    /// Runs `task` on its own thread or worker.
    fn spawn<T: Send + 'static>(&self, task: impl Future<Output = T> + Send + 'static) -> Join<T> {
        spawn_thread(task, futures::executor::block_on)
    }
    /// Called once every task has been joined.
    fn finish(self) {}
}

/// Runs a task on a thread of its own with `block_on`: how the blocking
/// libraries and smol run theirs.
pub(super) fn spawn_thread<T: Send + 'static, F: Future<Output = T> + Send + 'static>(
    task: F,
    block_on: fn(F) -> T,
) -> Join<T> {
    let handle = std::thread::spawn(move || block_on(task));
    Box::new(move || handle.join().ok())
}

/// Per-receiver counts.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RxCount {
    pub packets: u64,
    pub bytes: u64,
}

impl RxCount {
    pub(super) fn add(&mut self, n: usize, buf: &[u8]) {
        if n > 0 && buf[0] == MEASURE {
            self.packets += 1;
            self.bytes += n as u64;
        }
    }
}

/// What a configuration's tasks add up to.
pub(super) struct Outcome {
    pub sent: u64,
    pub rx: Vec<RxCount>,
    pub seconds: f64,
}

/// What the tasks of one configuration share: the phase and the first
/// error.
pub(super) struct Ctl {
    phase: AtomicU8,
    error: Mutex<Option<String>>,
}

impl Ctl {
    fn new() -> Self {
        Ctl {
            phase: AtomicU8::new(WARMUP),
            error: Mutex::new(None),
        }
    }

    fn phase(&self) -> u8 {
        self.phase.load(Ordering::Relaxed)
    }

    /// Records the first failure and ends the configuration.
    fn fail(&self, msg: String) {
        if let Ok(mut e) = self.error.lock() {
            e.get_or_insert(msg);
        }
        self.phase.store(DONE, Ordering::Relaxed);
    }

    fn failed(&self) -> bool {
        self.error.lock().map(|e| e.is_some()).unwrap_or(true)
    }

    fn take_error(&self) -> Option<String> {
        self.error.lock().ok().and_then(|mut e| e.take())
    }

    /// Runs the clock on the calling thread: warm-up, then the window.
    /// Returns the window's length in seconds.
    fn drive(&self, warmup: Duration, duration: Duration, shutdown: &Shutdown) -> f64 {
        let sleep_until = |deadline: Instant| {
            while !self.failed() && !shutdown.is_triggered() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                std::thread::sleep(left.min(Duration::from_millis(10)));
            }
        };
        sleep_until(Instant::now() + warmup);
        let t0 = Instant::now();
        let _ = self
            .phase
            .compare_exchange(WARMUP, MEASURE, Ordering::Relaxed, Ordering::Relaxed);
        sleep_until(t0 + duration);
        self.phase.store(DONE, Ordering::Relaxed);
        t0.elapsed().as_secs_f64()
    }
}

/// What one [`send_step`] came to.
enum Step {
    /// Sent (and counted when in the window).
    Sent,
    /// The queue was full: nothing went out.
    Full,
    /// The configuration is over, or the send failed (recorded in `ctl`).
    Stop,
}

/// The send of the sender and ping-pong loops: `buf` stamped with the
/// phase, sent, and counted in `sent` when it belongs to the window.
async fn send_step<B: Backend>(
    tx: &mut B::Tx,
    buf: &mut [u8],
    sent: &mut u64,
    ctl: &Ctl,
    lib: &str,
) -> Step {
    let phase = ctl.phase();
    if phase == DONE {
        return Step::Stop;
    }
    buf[0] = phase;
    match B::send(tx, buf).await {
        Ok(_) => {
            *sent += u64::from(phase == MEASURE);
            Step::Sent
        }
        Err(e) if crate::sys::is_transient(&e) => Step::Full,
        Err(e) => {
            ctl.fail(format!("{lib} send failed: {e}"));
            Step::Stop
        }
    }
}

async fn send_loop<B: Backend>(
    mut tx: B::Tx,
    payload: usize,
    ctl: Arc<Ctl>,
    lib: &'static str,
) -> u64 {
    let mut buf = vec![0xA5u8; payload];
    let mut sent = 0;
    loop {
        match send_step::<B>(&mut tx, &mut buf, &mut sent, &ctl, lib).await {
            Step::Sent => {}
            Step::Full => B::pause().await,
            Step::Stop => break,
        }
    }
    sent
}

async fn recv_loop<B: Backend>(rx: Arc<B::Rx>, ctl: Arc<Ctl>, lib: &'static str) -> RxCount {
    let mut buf = vec![0u8; 65536];
    let mut count = RxCount::default();
    let mut done_at = None;
    loop {
        match B::recv(&rx, &mut buf).await {
            Ok(n) => count.add(n, &buf),
            // Nothing for a whole POLL after the window: drained.
            Err(e) if crate::sys::is_transient(&e) => {
                if ctl.phase() == DONE {
                    break;
                }
                continue;
            }
            Err(e) => {
                ctl.fail(format!("{lib} recv failed: {e}"));
                break;
            }
        }
        if ctl.phase() == DONE && done_at.get_or_insert_with(Instant::now).elapsed() > DRAIN_MAX {
            break;
        }
    }
    count
}

async fn ping_pong_loop<B: Backend>(
    mut tx: B::Tx,
    rx: Arc<B::Rx>,
    payload: usize,
    ctl: Arc<Ctl>,
    lib: &'static str,
) -> (u64, RxCount) {
    let mut out = vec![0xA5u8; payload];
    let mut buf = vec![0u8; 65536];
    let (mut sent, mut count) = (0, RxCount::default());
    loop {
        match send_step::<B>(&mut tx, &mut out, &mut sent, &ctl, lib).await {
            Step::Sent => {}
            Step::Full => continue,
            Step::Stop => break,
        }
        // A lost datagram costs one POLL, then the next is sent.
        match B::recv(&rx, &mut buf).await {
            Ok(n) => count.add(n, &buf),
            Err(e) if crate::sys::is_transient(&e) => {}
            Err(e) => {
                ctl.fail(format!("{lib} recv failed: {e}"));
                break;
            }
        }
    }
    (sent, count)
}

fn open_err(lib: &str, what: &str, addr: SocketAddr, e: io::Error) -> Error {
    Error::io(format!("{lib}: cannot open the {what} socket on {addr}"), e)
}

fn any_addr(ip: Ip) -> SocketAddr {
    ip.loopback(0)
}

/// Runs one configuration on backend `B`: set-up, the tasks, the clock,
/// the counts. A failure in any task fails the configuration.
pub(super) fn run<B: Backend>(
    case: &UdpCase,
    timing: &Timing,
    shutdown: &Shutdown,
) -> Result<Outcome> {
    let lib = case.socket.name();
    let backend = B::start(case)?;
    // Set-up: the first receiving socket on port 0, the others on the
    // port it got, then the senders aimed at it.
    let any = any_addr(case.ip);
    let first = backend
        .bind_rx(any, case.reuse)
        .map_err(|e| open_err(lib, "receiving", any, e))?;
    let addr = B::local_addr(&first).map_err(|e| open_err(lib, "receiving", any, e))?;
    let mut rx = vec![Arc::new(first)];
    for _ in 1..case.rx_sockets() {
        let sock = backend
            .bind_rx(addr, case.reuse)
            .map_err(|e| open_err(lib, "receiving", addr, e))?;
        rx.push(Arc::new(sock));
    }
    let (senders, receivers) = UdpCase::split(case.threads);
    let connected = case.conn == Conn::Connected;
    let mut txs = (0..senders)
        .map(|_| {
            backend
                .open_tx(any, addr, connected)
                .map_err(|e| open_err(lib, "sending", any, e))
        })
        .collect::<Result<Vec<_>>>()?;
    // The tasks and the clock.
    let ctl = Arc::new(Ctl::new());
    let payload = case.payload;
    let outcome = if case.mode() == Mode::PingPong {
        let tx = txs.swap_remove(0);
        let join = backend.spawn(ping_pong_loop::<B>(
            tx,
            Arc::clone(&rx[0]),
            payload,
            Arc::clone(&ctl),
            lib,
        ));
        let seconds = ctl.drive(timing.warmup, timing.duration, shutdown);
        let (sent, count) = join().unwrap_or_default();
        Outcome {
            sent,
            rx: vec![count],
            seconds,
        }
    } else {
        let rx_joins: Vec<_> = (0..receivers)
            .map(|i| {
                let sock = Arc::clone(&rx[i % rx.len()]);
                backend.spawn(recv_loop::<B>(sock, Arc::clone(&ctl), lib))
            })
            .collect();
        let tx_joins: Vec<_> = txs
            .into_iter()
            .map(|tx| backend.spawn(send_loop::<B>(tx, payload, Arc::clone(&ctl), lib)))
            .collect();
        let seconds = ctl.drive(timing.warmup, timing.duration, shutdown);
        let sent = tx_joins.into_iter().map(|j| j().unwrap_or(0)).sum();
        let rx = rx_joins
            .into_iter()
            .map(|j| j().unwrap_or_default())
            .collect();
        Outcome { sent, rx, seconds }
    };
    backend.finish();
    match ctl.take_error() {
        Some(e) => Err(Error::runtime(format!("{}: {e}", super::describe(case)))),
        None => Ok(outcome),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_the_window() {
        let mut c = RxCount::default();
        c.add(10, &[WARMUP; 10]);
        c.add(10, &[MEASURE; 10]);
        c.add(0, &[MEASURE]);
        assert_eq!((c.packets, c.bytes), (1, 10));
    }
}
