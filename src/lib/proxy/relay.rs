//! The four modes that run on the tokio runtime. Each connection is one
//! task: both directions are polled together (`try_join`), next to an idle
//! watchdog. Half-close is the same everywhere: EOF on one leg becomes
//! `shutdown(Write)` on the other, and the task ends when both directions
//! have ended, or at the first socket error.

use super::config::{Mode, ProxyConfig};
use super::log::End;
use super::Meter;
use std::io;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// Relays until both directions end, an error, or the idle timeout.
pub(super) async fn relay(
    cfg: &ProxyConfig,
    mut client: TcpStream,
    mut upstream: TcpStream,
    meter: &Arc<Meter>,
) -> End {
    let work = async {
        match cfg.mode {
            Mode::Tokio => own_loop(&mut client, &mut upstream, cfg.buffer_size, meter).await,
            Mode::TokioCopy => copy_each_way(&mut client, &mut upstream, meter).await,
            Mode::CopyBidirectional => {
                let mut c = Metered::new(&mut client, &meter.up, meter);
                let mut u = Metered::new(&mut upstream, &meter.down, meter);
                tokio::io::copy_bidirectional(&mut c, &mut u)
                    .await
                    .map(|_| ())
            }
            #[cfg(target_os = "linux")]
            Mode::Splice => splice_both(&client, &upstream, cfg.buffer_size, meter).await,
            #[cfg(not(target_os = "linux"))]
            Mode::Splice => Err(io::Error::other("splice needs Linux")),
            Mode::Std | Mode::StdCopy => Err(io::Error::other("not a tokio mode")),
        }
    };
    tokio::select! {
        r = work => match r {
            Ok(()) => End::Closed,
            Err(e) => End::Error(e.to_string()),
        },
        () = idle_watchdog(meter, cfg.idle_timeout) => End::Idle,
    }
}

/// Resolves once no byte has moved either way for `idle`; never without one.
async fn idle_watchdog(meter: &Meter, idle: Option<Duration>) {
    let Some(idle) = idle else {
        return std::future::pending().await;
    };
    loop {
        let quiet = meter.idle_for();
        if quiet >= idle {
            return;
        }
        tokio::time::sleep(idle - quiet).await;
    }
}

/// `--mode tokio`: our own loop with a buffer of `--buffer-size` per direction.
async fn own_loop(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    buffer_size: usize,
    meter: &Meter,
) -> io::Result<()> {
    let (mut cr, mut cw) = client.split();
    let (mut ur, mut uw) = upstream.split();
    let up = pump(&mut cr, &mut uw, buffer_size, &meter.up, meter);
    let down = pump(&mut ur, &mut cw, buffer_size, &meter.down, meter);
    tokio::try_join!(up, down).map(|_| ())
}

async fn pump<R, W>(
    from: &mut R,
    to: &mut W,
    buffer_size: usize,
    counter: &AtomicU64,
    meter: &Meter,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; buffer_size];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            // Half-close: pass the EOF on; the other direction keeps going.
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
        meter.add(counter, n);
    }
}

/// `--mode tokio-copy`: `tokio::io::copy` each way, then pass the EOF on.
async fn copy_each_way(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    meter: &Meter,
) -> io::Result<()> {
    let (cr, mut cw) = client.split();
    let (ur, mut uw) = upstream.split();
    let up = async {
        tokio::io::copy(&mut Metered::new(cr, &meter.up, meter), &mut uw).await?;
        uw.shutdown().await
    };
    let down = async {
        tokio::io::copy(&mut Metered::new(ur, &meter.down, meter), &mut cw).await?;
        cw.shutdown().await
    };
    tokio::try_join!(up, down).map(|_| ())
}

/// Counts the bytes read through it (writes pass straight through), so
/// the library copy functions feed the same counters and idle clock.
struct Metered<'a, S> {
    inner: S,
    counter: &'a AtomicU64,
    meter: &'a Meter,
}

impl<'a, S> Metered<'a, S> {
    fn new(inner: S, counter: &'a AtomicU64, meter: &'a Meter) -> Self {
        Metered {
            inner,
            counter,
            meter,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.meter.add(self.counter, n);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// `--mode splice`: a pipe per direction, moved with splice(2).
#[cfg(target_os = "linux")]
async fn splice_both(
    client: &TcpStream,
    upstream: &TcpStream,
    pipe_size: usize,
    meter: &Meter,
) -> io::Result<()> {
    let up = splice_pump(client, upstream, pipe_size, &meter.up, meter);
    let down = splice_pump(upstream, client, pipe_size, &meter.down, meter);
    tokio::try_join!(up, down).map(|_| ())
}

/// One direction: fill the pipe from `from` as far as is queued (up to its
/// capacity), then drain it completely into `to`, partial splice by partial
/// splice. Because the pipe is always emptied before the next fill, a
/// `WouldBlock` on the fill can only mean "nothing queued on the socket".
#[cfg(target_os = "linux")]
async fn splice_pump(
    from: &TcpStream,
    to: &TcpStream,
    pipe_size: usize,
    counter: &AtomicU64,
    meter: &Meter,
) -> io::Result<()> {
    use crate::sys::splice::Pipe;
    use std::os::fd::AsFd;
    use tokio::io::Interest;

    let pipe = Pipe::new(pipe_size)?;
    let chunk = pipe.capacity();
    loop {
        let n = loop {
            from.readable().await?;
            match from.try_io(Interest::READABLE, || pipe.fill_from(from.as_fd(), chunk)) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            // Half-close: pass the EOF on; the other direction keeps going.
            return socket2::SockRef::from(to).shutdown(std::net::Shutdown::Write);
        }
        let mut left = n;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || pipe.drain_to(to.as_fd(), left)) {
                Ok(0) => return Err(io::Error::other("splice moved 0 bytes from a full pipe")),
                Ok(m) => left -= m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        meter.add(counter, n);
    }
}
