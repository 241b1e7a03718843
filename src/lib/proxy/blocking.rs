//! The two std modes: blocking sockets and a thread per direction, as in
//! seed 004's std proxy. The accept loop and the upstream connect stay on
//! tokio; once both legs exist they are turned into blocking std sockets,
//! and the connection's task waits for its two threads, so that the
//! connection is closed and counted in the same place as in every mode.
//!
//! Why read and write time-outs only with `--idle-timeout`: a thread parked
//! in `read` cannot notice that the connection went idle, so with a
//! time-out set each blocked call wakes up now and then to look at the
//! shared idle clock. Without one, the threads block for real and cost
//! nothing while waiting. On an error or idle expiry both sockets are shut
//! down in both directions, which wakes the other thread at once; the drain
//! deadline's cut does the same from the connection's task.
//!
//! Why `--mode std` peeks before it reads: a thread blocked in `read` must
//! hand the kernel its buffer, so an idle connection would hold 2 ×
//! `--buffer-size` for its whole life. Instead each direction blocks in a
//! one-byte `peek`, takes a buffer once bytes are queued, reads and writes
//! while more are queued (a non-blocking peek tells), and frees it. The
//! buffer is a `BufReader`'s, which std reads into without zeroing it.

use super::events::End;
use super::{Cut, Meter};
use crate::config::proxy::{Mode, ProxyConfig};
use futures::channel::oneshot;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// How long the cut waits for a connection's threads to return, so that
/// their last write is counted. Shut-down sockets wake them at once.
const STOP_WAIT: Duration = Duration::from_millis(500);

/// Runs one connection on two threads until both directions end (or an
/// error, or idle expiry), or until the drain deadline cuts it.
pub(super) async fn relay(
    cfg: &ProxyConfig,
    id: u64,
    client: tokio::net::TcpStream,
    upstream: tokio::net::TcpStream,
    meter: &Arc<Meter>,
    cut: Cut,
) -> End {
    let (c, u) = match blocking_legs(client, upstream, cfg.idle_timeout) {
        Ok(legs) => legs,
        Err(e) => return End::Error(e.to_string()),
    };
    let dir = Direction {
        mode: cfg.mode,
        buffer_size: cfg.buffer_size,
        idle: cfg.idle_timeout,
        meter: Arc::clone(meter),
    };
    let down = match start(format!("conn{id}-down"), &dir, &u, &c, Leg::Down) {
        Ok(done) => done,
        Err(e) => return End::Error(format!("cannot start a thread: {e}")),
    };
    let up = match start(format!("conn{id}-up"), &dir, &c, &u, Leg::Up) {
        Ok(done) => done,
        Err(e) => {
            // Stop the thread that did start, and wait for its last count.
            shut_both(&c, &u);
            let _ = tokio::time::timeout(STOP_WAIT, down).await;
            return End::Error(format!("cannot start a thread: {e}"));
        }
    };
    let mut both = futures::future::join(up, down);
    tokio::select! {
        biased;
        (up, down) = &mut both => {
            let gone = || End::Error("a relay thread panicked".into());
            match (up.unwrap_or_else(|_| gone()), down.unwrap_or_else(|_| gone())) {
                (End::Error(e), _) | (_, End::Error(e)) => End::Error(e),
                (End::Reset, _) | (_, End::Reset) => End::Reset,
                (End::Idle, _) | (_, End::Idle) => End::Idle,
                _ => End::Closed,
            }
        }
        _ = cut => {
            shut_both(&c, &u);
            let _ = tokio::time::timeout(STOP_WAIT, both).await;
            End::Cut
        }
    }
}

/// The two legs as blocking std sockets, with the idle tick as their
/// read and write time-outs.
fn blocking_legs(
    client: tokio::net::TcpStream,
    upstream: tokio::net::TcpStream,
    idle: Option<Duration>,
) -> io::Result<(Arc<TcpStream>, Arc<TcpStream>)> {
    let c = client.into_std()?;
    let u = upstream.into_std()?;
    c.set_nonblocking(false)?;
    u.set_nonblocking(false)?;
    if let Some(idle) = idle {
        let tick = Some((idle / 4).clamp(Duration::from_millis(5), Duration::from_secs(1)));
        for s in [&c, &u] {
            s.set_read_timeout(tick)?;
            s.set_write_timeout(tick)?;
        }
    }
    Ok((Arc::new(c), Arc::new(u)))
}

#[derive(Clone, Copy)]
enum Leg {
    /// Client to upstream.
    Up,
    /// Upstream to client.
    Down,
}

/// Starts the thread that moves `from` → `to`; its end arrives on the
/// returned channel.
fn start(
    name: String,
    dir: &Direction,
    from: &Arc<TcpStream>,
    to: &Arc<TcpStream>,
    leg: Leg,
) -> io::Result<oneshot::Receiver<End>> {
    let (tx, rx) = oneshot::channel();
    let (dir, from, to) = (dir.clone(), Arc::clone(from), Arc::clone(to));
    std::thread::Builder::new().name(name).spawn(move || {
        let counter = match leg {
            Leg::Up => &dir.meter.up,
            Leg::Down => &dir.meter.down,
        };
        let _ = tx.send(dir.run(&from, &to, counter));
    })?;
    Ok(rx)
}

fn shut_both(a: &TcpStream, b: &TcpStream) {
    let _ = a.shutdown(Shutdown::Both);
    let _ = b.shutdown(Shutdown::Both);
}

#[derive(Clone)]
struct Direction {
    mode: Mode,
    buffer_size: usize,
    idle: Option<Duration>,
    meter: Arc<Meter>,
}

impl Direction {
    /// Moves bytes `from` → `to` until EOF (then half-closes `to`), an
    /// error or idle expiry (then shuts down both legs entirely).
    fn run(&self, from: &TcpStream, to: &TcpStream, counter: &AtomicU64) -> End {
        let mut writer = Patient {
            inner: to,
            dir: self,
            counter: Some(counter),
        };
        let result = match self.mode {
            Mode::StdCopy => {
                let mut reader = Patient {
                    inner: from,
                    dir: self,
                    counter: None,
                };
                io::copy(&mut reader, &mut writer).map(|_| ())
            }
            _ => self.bursts(from, &mut writer),
        };
        match result {
            Ok(()) => match to.shutdown(Shutdown::Write) {
                Ok(()) => End::Closed,
                // The peer may already be gone; that ends the connection.
                Err(e) if e.kind() == io::ErrorKind::NotConnected => End::Closed,
                Err(e) => self.abort(from, to, End::from_io(&e)),
            },
            Err(e) if e.kind() == io::ErrorKind::TimedOut && self.idle_expired() => {
                self.abort(from, to, End::Idle)
            }
            Err(e) => self.abort(from, to, End::from_io(&e)),
        }
    }

    /// `--mode std`'s loop until EOF: block in a one-byte peek with no
    /// buffer held; once bytes are queued, read and write them with a
    /// buffer of `--buffer-size` until none are left, then free it.
    fn bursts(&self, from: &TcpStream, to: &mut Patient<'_>) -> io::Result<()> {
        loop {
            if self.patiently(|| from.peek(&mut [0u8; 1]))? == 0 {
                return Ok(());
            }
            let mut burst = BufReader::with_capacity(self.buffer_size, from);
            loop {
                // Bytes (or the EOF) are queued, so this read does not block.
                let chunk = burst.fill_buf()?;
                if chunk.is_empty() {
                    return Ok(());
                }
                let n = chunk.len();
                to.write_all(chunk)?;
                burst.consume(n);
                if !crate::sys::read_would_return(from)? {
                    break;
                }
            }
        }
    }

    fn abort(&self, a: &TcpStream, b: &TcpStream, end: End) -> End {
        shut_both(a, b);
        end
    }

    fn idle_expired(&self) -> bool {
        self.idle.is_some_and(|idle| self.meter.idle_for() >= idle)
    }

    /// Runs a socket call, retrying its time-outs until the connection has
    /// been idle for `--idle-timeout` (then a `TimedOut` error).
    fn patiently<T>(&self, mut call: impl FnMut() -> io::Result<T>) -> io::Result<T> {
        loop {
            match call() {
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) =>
                {
                    if self.idle_expired() {
                        return Err(io::Error::new(io::ErrorKind::TimedOut, "idle"));
                    }
                }
                other => return other,
            }
        }
    }
}

/// A socket whose time-outs are retried (see [`Direction::patiently`]);
/// `std::io::copy` sees an ordinary blocking stream. With a counter, each
/// write is counted as it completes.
struct Patient<'a> {
    inner: &'a TcpStream,
    dir: &'a Direction,
    counter: Option<&'a AtomicU64>,
}

impl Read for Patient<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut s = self.inner;
        self.dir.patiently(|| s.read(buf))
    }
}

impl Write for Patient<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut s = self.inner;
        let n = self.dir.patiently(|| s.write(buf))?;
        if let Some(c) = self.counter {
            self.dir.meter.add(c, n);
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
