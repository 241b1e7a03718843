//! The receive methods: six real, separate ways to wait for and read
//! datagrams (seed 002 compared SELECT, EPOLL and THREAD; its EPOLL was
//! never written). Each loop reads into a [`RecvBatch`] allocated once per
//! socket and hands what it read to a [`Deliver`], which does the counting.
//! `udp_server` and `sockbench mux` share these loops.
//!
//! Every loop wakes at least every [`POLL`] to check the shutdown flag.

use crate::shutdown::{Shutdown, POLL};
use crate::sys::RecvBatch;
use socket2::Socket;
use std::io;
use std::time::{Duration, Instant};

/// Datagrams per recvmmsg call. More than 32 gains nothing measurable
/// (daeuniverse/honk #80); 8 already gets most of the benefit.
pub const RECV_BATCH: usize = 32;
/// Each receive buffer holds the largest datagram, or a whole GRO buffer:
/// a UDP payload is at most 65535 - 8 bytes, and Linux stops coalescing a
/// UDP GRO buffer before it reaches 64 KiB. Should the kernel ever cut one
/// anyway, MSG_TRUNC is counted and reported (`truncated`).
pub const RECV_BUF_SIZE: usize = 65536;

/// How the server waits for and reads datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// A blocking thread per socket, one recvmsg per datagram.
    Thread,
    /// select(2) over the sockets, then recvmsg until EAGAIN.
    Select,
    /// poll(2) over the sockets, then recvmsg until EAGAIN.
    Poll,
    /// epoll(7) over the sockets, then recvmsg until EAGAIN.
    Epoll,
    /// A tokio current-thread runtime: readiness from tokio, recvmsg ours.
    Tokio,
    /// recvmmsg(2): up to 32 datagrams per call on a blocking socket.
    Mmsg,
}

impl Method {
    /// The best method this platform has.
    pub fn default_for_platform() -> Self {
        if crate::sys::LINUX_SOCKETS {
            Method::Mmsg
        } else {
            Method::Thread
        }
    }

    /// What it does, in a line (the flag's help).
    pub fn about(self) -> &'static str {
        match self {
            Method::Thread => "A blocking thread per socket, one recvmsg per datagram",
            Method::Select => "select(2) over the sockets, then recvmsg until EAGAIN",
            Method::Poll => "poll(2) over the sockets, then recvmsg until EAGAIN",
            Method::Epoll => "epoll(7) over the sockets, then recvmsg until EAGAIN",
            Method::Tokio => "A tokio current-thread runtime: readiness from tokio, recvmsg ours",
            Method::Mmsg => "recvmmsg(2): up to 32 datagrams per call on a blocking socket",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Method::Thread => "thread",
            Method::Select => "select",
            Method::Poll => "poll",
            Method::Epoll => "epoll",
            Method::Tokio => "tokio",
            Method::Mmsg => "mmsg",
        }
    }

    /// Every method, for sweeps.
    pub const ALL: [Method; 6] = [
        Method::Thread,
        Method::Select,
        Method::Poll,
        Method::Epoll,
        Method::Tokio,
        Method::Mmsg,
    ];

    /// An error naming the platform when this method does not exist on it.
    pub fn check_available(self) -> crate::error::Result<()> {
        let linux_only = matches!(
            self,
            Method::Select | Method::Poll | Method::Epoll | Method::Mmsg
        );
        if linux_only && !crate::sys::LINUX_SOCKETS {
            return Err(crate::error::Error::usage(format!(
                "the {} receive method is not available on this platform (built for Linux); use thread or tokio",
                self.name()
            )));
        }
        Ok(())
    }
}

/// Receives what a loop read.
pub trait Deliver: Sync {
    /// `batch` holds `count` datagrams just read from socket `index`.
    fn deliver(&self, index: usize, socket: &Socket, batch: &RecvBatch, count: usize);

    /// A read of socket `index` that began at `began` found its queue
    /// empty (it came back with less than it asked for, or with nothing),
    /// after every datagram it read was delivered: everything that arrived
    /// on the socket before `began` has been delivered. The server judges
    /// idle peers by it: a datagram still queued is not yet counted, and
    /// its peer is not idle.
    fn drained(&self, _index: usize, _began: Instant) {}
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// A receive error that is not "nothing there": an ICMP error for one of
/// our answers and the like. One bad peer must not stop the server, so it
/// is skipped after a short pause (no busy loop on a persistent error).
fn pause_after_error() {
    std::thread::sleep(std::time::Duration::from_millis(1));
}

/// Runs `method` over `sockets` until `shutdown`. `first_index` numbers the
/// sockets for [`Deliver`]. Blocking methods (thread, mmsg) need blocking
/// sockets; the readiness methods set their sockets non-blocking.
pub fn run_method(
    method: Method,
    sockets: &[&Socket],
    first_index: usize,
    deliver: &dyn Deliver,
    shutdown: &Shutdown,
) -> io::Result<()> {
    method
        .check_available()
        .map_err(|e| io::Error::new(io::ErrorKind::Unsupported, e.to_string()))?;
    match method {
        Method::Thread | Method::Mmsg if sockets.len() > 1 => {
            // One blocking thread per socket.
            std::thread::scope(|scope| {
                let handles: Vec<_> = sockets
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        scope.spawn(move || {
                            blocking_loop(method, s, first_index + i, deliver, shutdown)
                        })
                    })
                    .collect();
                join_receive_threads(handles)
            })
        }
        Method::Thread | Method::Mmsg => {
            blocking_loop(method, sockets[0], first_index, deliver, shutdown)
        }
        Method::Select | Method::Poll | Method::Epoll => {
            readiness_loop(method, sockets, first_index, deliver, shutdown)
        }
        Method::Tokio => tokio_loop(sockets, first_index, deliver, shutdown),
    }
}

/// Waits for the receive threads in turn: the first error (or panic) it
/// meets is the result.
pub(crate) fn join_receive_threads(
    handles: Vec<std::thread::ScopedJoinHandle<'_, io::Result<()>>>,
) -> io::Result<()> {
    handles.into_iter().try_for_each(|h| {
        h.join()
            .unwrap_or_else(|_| Err(io::Error::other("receive thread panicked")))
    })
}

fn blocking_loop(
    method: Method,
    socket: &Socket,
    index: usize,
    deliver: &dyn Deliver,
    shutdown: &Shutdown,
) -> io::Result<()> {
    socket.set_nonblocking(false)?;
    socket.set_read_timeout(Some(POLL))?;
    let batch_size = if method == Method::Mmsg {
        RECV_BATCH
    } else {
        1
    };
    let mut batch = RecvBatch::new(batch_size, RECV_BUF_SIZE);
    let mut waiter = Waiter::default();
    while !shutdown.is_triggered() {
        let began = Instant::now();
        let (result, polled) = match (method, waiter.next) {
            (Method::Mmsg, Wait::Block) => (batch.recv(socket), Polled::No),
            (Method::Mmsg, Wait::Probe) => (batch.try_recv(socket), Polled::No),
            (Method::Mmsg, Wait::Poll) => poll_briefly(&mut batch, socket, waiter.window),
            _ => (batch.recv_one(socket), Polled::No),
        };
        let limit = batch.limit();
        match result {
            Ok(n) => {
                deliver.deliver(index, socket, &batch, n);
                if n < limit {
                    // recvmmsg reads until the queue is empty or the batch
                    // full (one recvmsg says nothing of what is behind).
                    deliver.drained(index, began);
                }
                if method == Method::Mmsg {
                    waiter.after_read(n, limit, polled);
                    batch.set_limit(batch_limit_after(&batch, n));
                }
            }
            Err(e) if is_transient(&e) => {
                deliver.drained(index, began);
                waiter.after_nothing()
            }
            Err(_) => {
                waiter.after_nothing();
                pause_after_error()
            }
        }
    }
    Ok(())
}

/// How the mmsg loop waits for its next read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Wait {
    /// Sleep until a datagram comes.
    #[default]
    Block,
    /// Try once without sleeping.
    Probe,
    /// Try for up to the waiter's window without sleeping, then sleep.
    Poll,
}

/// What a [`Wait::Poll`] read found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Polled {
    /// The read did not poll, or data was there at once.
    No,
    /// Data came after polling this long.
    Caught(Duration),
    /// Nothing came within the window; it slept.
    TimedOut,
}

/// The shortest poll after a read: long enough to see whether datagrams
/// keep coming back to back (an unpaced sender's are a few µs apart).
pub const POLL_MIN: Duration = Duration::from_micros(10);
/// The longest: while the queue is backed up.
pub const POLL_MAX: Duration = Duration::from_micros(50);

/// Decides how the mmsg loop waits. Why not just block: while datagrams
/// keep coming back to back, a receiver that sleeps costs the sender a
/// wake-up per datagram (sock_def_readable was 12% of a loopback sender's
/// time), and an unpaced run slows down. Why not poll after every read: a
/// receiver that polls an empty socket burns CPU, and several of them
/// starve the senders whose loss they then report. So it polls only while
/// the queue shows it is backed up:
/// - after a sleep, it reads what woke it; if that was more than one
///   datagram (or one of a size read singly), it looks once more without
///   sleeping ([`Wait::Probe`]): a paced sender's burst costs one wake-up
///   and one extra call, a lone datagram only the wake-up;
/// - only when that look (or a poll) found more does it poll, for a window
///   that follows the gaps it sees: four times the last gap a poll
///   bridged, between [`POLL_MIN`] and [`POLL_MAX`];
/// - after a full batch, the whole [`POLL_MAX`];
/// - when a look or a poll finds nothing, it sleeps.
#[derive(Debug, Clone, Copy)]
struct Waiter {
    next: Wait,
    window: Duration,
}

impl Default for Waiter {
    fn default() -> Self {
        Waiter {
            next: Wait::Block,
            window: POLL_MIN,
        }
    }
}

impl Waiter {
    /// A read returned `n` datagrams of at most `limit`.
    fn after_read(&mut self, n: usize, limit: usize, polled: Polled) {
        let slept = match polled {
            Polled::Caught(gap) => {
                self.window = (gap * 4).clamp(POLL_MIN, POLL_MAX);
                false
            }
            Polled::TimedOut => {
                self.window = POLL_MIN;
                true
            }
            Polled::No => self.next == Wait::Block,
        };
        self.next = if n >= limit && limit > 1 {
            // A full batch: the queue is backed up.
            self.window = POLL_MAX;
            Wait::Poll
        } else if slept && n == 1 && limit > 1 {
            // A lone datagram woke it, and the same call (MSG_WAITFORONE)
            // found nothing behind it: a paced sender's single datagram.
            // Another look would be a wasted call per datagram.
            Wait::Block
        } else if slept {
            Wait::Probe
        } else {
            Wait::Poll
        };
    }

    /// A read found nothing (or failed).
    fn after_nothing(&mut self) {
        self.next = Wait::Block;
    }
}

fn poll_briefly(
    batch: &mut RecvBatch,
    socket: &Socket,
    window: Duration,
) -> (io::Result<usize>, Polled) {
    let start = std::time::Instant::now();
    let mut waited = false;
    loop {
        match batch.try_recv(socket) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && start.elapsed() < window => {
                waited = true;
                std::hint::spin_loop()
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return (batch.recv(socket), Polled::TimedOut)
            }
            other if waited => return (other, Polled::Caught(start.elapsed())),
            other => return (other, Polled::No),
        }
    }
}

/// Above this average datagram size, mmsg reads one datagram per call.
pub const LARGE_DATAGRAM: usize = 16 * 1024;

/// How many datagrams the next recvmmsg call should take. Large datagrams
/// go one at a time into the same buffer: the syscall saving is nothing
/// next to a 64 KiB copy, and one buffer reused stays in the CPU cache
/// while 32 of them (2 MiB) do not (65500 B: 52-72 Gbit/s batched against
/// 63-69 one at a time, measured with udp_client -b 65500 on loopback).
fn batch_limit_after(batch: &RecvBatch, received: usize) -> usize {
    let bytes: usize = (0..received).map(|i| batch.datagram(i).data.len()).sum();
    if received > 0 && bytes / received > LARGE_DATAGRAM {
        1
    } else {
        RECV_BATCH
    }
}

/// Reads `socket` until it would block, delivering each datagram.
fn drain(socket: &Socket, index: usize, batch: &mut RecvBatch, deliver: &dyn Deliver) {
    // Bounded, so that one busy socket cannot starve the others.
    for _ in 0..1024 {
        let began = Instant::now();
        match batch.recv_one(socket) {
            Ok(n) => deliver.deliver(index, socket, batch, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_transient(&e) => {
                deliver.drained(index, began);
                return;
            }
            Err(_) => {
                pause_after_error();
                return;
            }
        }
    }
}

fn readiness_loop(
    method: Method,
    sockets: &[&Socket],
    first_index: usize,
    deliver: &dyn Deliver,
    shutdown: &Shutdown,
) -> io::Result<()> {
    use crate::sys::{poll_readable, select_readable, Epoll};
    for s in sockets {
        s.set_nonblocking(true)?;
    }
    let mut ready = vec![false; sockets.len()];
    let mut batch = RecvBatch::new(1, RECV_BUF_SIZE);
    let mut scratch = Vec::with_capacity(sockets.len());
    let mut epoll = if method == Method::Epoll {
        let ep = Epoll::new(sockets.len())?;
        for (i, socket) in sockets.iter().enumerate() {
            ep.add(socket, i as u64)?;
        }
        Some(ep)
    } else {
        None
    };
    while !shutdown.is_triggered() {
        let began = Instant::now();
        let result = match method {
            Method::Select => select_readable(sockets, POLL, &mut ready),
            Method::Poll => poll_readable(sockets, POLL, &mut ready, &mut scratch),
            _ => {
                ready.fill(false);
                let ep = epoll.as_mut().expect("epoll set up");
                ep.wait(POLL, |token| ready[token as usize] = true)
            }
        };
        match result {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for (i, socket) in sockets.iter().enumerate() {
            if ready[i] {
                drain(socket, first_index + i, &mut batch, deliver);
            } else {
                // Not readable when the wait returned: its queue was empty
                // then (level-triggered readiness).
                deliver.drained(first_index + i, began);
            }
        }
    }
    Ok(())
}

fn tokio_loop(
    sockets: &[&Socket],
    first_index: usize,
    deliver: &dyn Deliver,
    shutdown: &Shutdown,
) -> io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for (i, socket) in sockets.iter().enumerate() {
            socket.set_nonblocking(true)?;
            // tokio owns a duplicate of the fd for readiness; reads go
            // through our recvmsg on the original, to get the cmsgs.
            let registered = tokio::net::UdpSocket::from_std(socket.try_clone()?.into())?;
            let socket: &Socket = socket;
            tasks.push(async move {
                let mut batch = RecvBatch::new(1, RECV_BUF_SIZE);
                while !shutdown.is_triggered() {
                    let began = Instant::now();
                    match tokio::time::timeout(POLL, registered.readable()).await {
                        Err(_) => {
                            deliver.drained(first_index + i, began);
                            continue;
                        }
                        Ok(Err(e)) => return Err(e),
                        Ok(Ok(())) => {}
                    }
                    // Read until it would block, telling tokio so.
                    for _ in 0..1024 {
                        let began = Instant::now();
                        match registered
                            .try_io(tokio::io::Interest::READABLE, || batch.recv_one(socket))
                        {
                            Ok(n) => deliver.deliver(first_index + i, socket, &batch, n),
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                deliver.drained(first_index + i, began);
                                break;
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(_) => {
                                pause_after_error();
                                break;
                            }
                        }
                    }
                }
                Ok::<(), io::Error>(())
            });
        }
        // All sockets are served concurrently by this one thread.
        for result in futures::future::join_all(tasks).await {
            result?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    /// Asleep, it is woken by a read of `n` datagrams (of at most 32).
    fn woken_by(w: &mut Waiter, n: usize) {
        assert_eq!(w.next, Wait::Block);
        w.after_read(n, 32, Polled::No);
    }

    #[test]
    fn it_sleeps_after_a_gap_and_polls_only_while_datagrams_keep_coming() {
        let mut w = Waiter::default();
        assert_eq!(w.next, Wait::Block, "it starts asleep");
        // A read after a sleep: one look for more, no polling yet.
        w.after_read(3, 32, Polled::No);
        assert_eq!(w.next, Wait::Probe);
        // The look found more: the queue is backed up, poll briefly.
        w.after_read(2, 32, Polled::No);
        assert_eq!((w.next, w.window), (Wait::Poll, POLL_MIN));
        // The poll caught one 2 µs later: the window follows the gap
        // (4 × 2 µs, but at least the minimum).
        w.after_read(1, 32, Polled::Caught(2 * US));
        assert_eq!((w.next, w.window), (Wait::Poll, POLL_MIN));
        w.after_read(1, 32, Polled::Caught(6 * US));
        assert_eq!((w.next, w.window), (Wait::Poll, 24 * US));
        // A full batch: the longest window.
        w.after_read(32, 32, Polled::No);
        assert_eq!((w.next, w.window), (Wait::Poll, POLL_MAX));
        // The poll timed out, so the read slept: next time only a look,
        // and the shortest window if it polls again.
        w.after_read(2, 32, Polled::TimedOut);
        assert_eq!((w.next, w.window), (Wait::Probe, POLL_MIN));
        // The look found nothing: back to sleep.
        w.after_nothing();
        assert_eq!(w.next, Wait::Block);
    }

    #[test]
    fn a_paced_burst_costs_one_look_and_no_poll() {
        let mut w = Waiter::default();
        for _ in 0..100 {
            // Woken by a burst, read it whole, the look finds nothing.
            woken_by(&mut w, 5);
            assert_eq!(w.next, Wait::Probe, "never polls an idle socket");
            w.after_nothing();
        }
    }

    #[test]
    fn a_lone_datagram_costs_one_call() {
        let mut w = Waiter::default();
        for _ in 0..100 {
            // Woken by one datagram, nothing queued behind it: sleep again
            // at once, with no look in between.
            woken_by(&mut w, 1);
        }
        assert_eq!(w.next, Wait::Block);
        // A poll that timed out and then slept for a lone one: the same.
        w.next = Wait::Poll;
        w.after_read(1, 32, Polled::TimedOut);
        assert_eq!(w.next, Wait::Block);
    }

    #[test]
    fn large_datagrams_probe_once_then_poll_while_backed_up() {
        let mut w = Waiter::default();
        // One datagram per call (64 KiB ones): after a sleep, one try.
        w.after_read(1, 1, Polled::No);
        assert_eq!(w.next, Wait::Probe);
        // The try found another: backed up.
        w.after_read(1, 1, Polled::No);
        assert_eq!(w.next, Wait::Poll);
        // Nothing more came: sleep.
        w.after_nothing();
        assert_eq!(w.next, Wait::Block);
    }
}
