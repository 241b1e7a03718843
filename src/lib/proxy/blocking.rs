//! The two std modes: blocking sockets and a thread per direction, as in
//! seed 004's std proxy. The accept loop and the upstream connect stay on
//! tokio; once both legs exist they are turned into blocking std sockets.
//!
//! Why read and write time-outs only with `--idle-timeout`: a thread parked
//! in `read` cannot notice that the connection went idle, so with a
//! time-out set each blocked call wakes up now and then to look at the
//! shared idle clock. Without one, the threads block for real and cost
//! nothing while waiting. On an error or idle expiry both sockets are shut
//! down in both directions, which wakes the other thread at once.

use super::config::Mode;
use super::log::End;
use super::{Ctx, Meter, Slot};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// Starts the two threads of one connection; the upstream-bound one joins
/// the other, logs the connection and frees its `--max-conns` slot.
pub(super) fn spawn(
    ctx: Arc<Ctx>,
    slot: Slot,
    client: tokio::net::TcpStream,
    upstream: tokio::net::TcpStream,
    meter: Arc<Meter>,
    client_addr: SocketAddr,
    id: u64,
) {
    let legs = (|| -> io::Result<(TcpStream, TcpStream)> {
        let c = client.into_std()?;
        let u = upstream.into_std()?;
        c.set_nonblocking(false)?;
        u.set_nonblocking(false)?;
        if let Some(idle) = ctx.cfg.idle_timeout {
            let tick = Some((idle / 4).clamp(Duration::from_millis(5), Duration::from_secs(1)));
            for s in [&c, &u] {
                s.set_read_timeout(tick)?;
                s.set_write_timeout(tick)?;
            }
        }
        Ok((c, u))
    })();
    let (c, u) = match legs {
        Ok(legs) => legs,
        Err(e) => return ctx.finish(&meter, id, client_addr, End::Error(e.to_string())),
    };
    let c = Arc::new(c);
    let u = Arc::new(u);
    let dir = Direction {
        mode: ctx.cfg.mode,
        buffer_size: ctx.cfg.buffer_size,
        idle: ctx.cfg.idle_timeout,
        meter: Arc::clone(&meter),
    };
    let down = {
        let (dir, c, u) = (dir.clone(), Arc::clone(&c), Arc::clone(&u));
        std::thread::Builder::new()
            .name(format!("conn{id}-down"))
            .spawn(move || dir.run(&u, &c, &dir.meter.down))
    };
    let down = match down {
        Ok(h) => h,
        Err(e) => return ctx.finish(&meter, id, client_addr, End::Error(e.to_string())),
    };
    let up = std::thread::Builder::new()
        .name(format!("conn{id}-up"))
        .spawn(move || {
            let up_end = dir.run(&c, &u, &dir.meter.up);
            let down_end = down
                .join()
                .unwrap_or_else(|_| End::Error("thread panicked".into()));
            let end = match (up_end, down_end) {
                (End::Error(e), _) | (_, End::Error(e)) => End::Error(e),
                (End::Idle, _) | (_, End::Idle) => End::Idle,
                _ => End::Closed,
            };
            drop(slot);
            ctx.finish(&meter, id, client_addr, end);
        });
    if let Err(e) = up {
        // The closure (and the slot in it) was dropped by the failed spawn;
        // the down thread still runs until its upstream side ends.
        eprintln!("tcp_proxy: conn {id}: cannot start a thread: {e}");
    }
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
        let mut reader = Patient {
            inner: from,
            dir: self,
            counter: Some(counter),
        };
        let mut writer = Patient {
            inner: to,
            dir: self,
            counter: None,
        };
        let result = match self.mode {
            Mode::StdCopy => io::copy(&mut reader, &mut writer).map(|_| ()),
            _ => {
                let mut buf = vec![0u8; self.buffer_size];
                (|| loop {
                    let n = reader.read(&mut buf)?;
                    if n == 0 {
                        return Ok(());
                    }
                    writer.write_all(&buf[..n])?;
                })()
            }
        };
        match result {
            Ok(()) => match to.shutdown(Shutdown::Write) {
                Ok(()) => End::Closed,
                // The peer may already be gone; that ends the connection.
                Err(e) if e.kind() == io::ErrorKind::NotConnected => End::Closed,
                Err(e) => self.abort(from, to, End::Error(e.to_string())),
            },
            Err(e) if e.kind() == io::ErrorKind::TimedOut && self.idle_expired() => {
                self.abort(from, to, End::Idle)
            }
            Err(e) => self.abort(from, to, End::Error(e.to_string())),
        }
    }

    fn abort(&self, a: &TcpStream, b: &TcpStream, end: End) -> End {
        let _ = a.shutdown(Shutdown::Both);
        let _ = b.shutdown(Shutdown::Both);
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

/// A socket whose time-outs are retried (see [`Direction::patiently`]) and
/// whose reads are counted; `std::io::copy` sees an ordinary blocking stream.
struct Patient<'a> {
    inner: &'a TcpStream,
    dir: &'a Direction,
    counter: Option<&'a AtomicU64>,
}

impl Read for Patient<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut s = self.inner;
        let n = self.dir.patiently(|| s.read(buf))?;
        if let Some(c) = self.counter {
            self.dir.meter.add(c, n);
        }
        Ok(n)
    }
}

impl Write for Patient<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut s = self.inner;
        self.dir.patiently(|| s.write(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
