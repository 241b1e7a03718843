//! The four modes that run on the tokio runtime. Each connection is one
//! task: both directions are polled together (`try_join`), next to an idle
//! watchdog and the drain deadline's [`Cut`]. Half-close is the same
//! everywhere: EOF on one leg becomes `shutdown(Write)` on the other, and
//! the task ends when both directions have ended, or at the first socket
//! error.
//!
//! Bytes are counted as they are written to the destination leg, write by
//! write, so a relay that is stopped half-way through a buffer (an error,
//! the idle time-out, the cut) has counted exactly what it handed over.
//!
//! # Memory: `--mode tokio` holds its buffers only while bytes flow
//! A direction waits for its socket to become readable holding no buffer,
//! then takes one of `--buffer-size`, reads and writes until the socket
//! would block, and frees it. An idle connection therefore costs its task
//! and its sockets (about 3 KiB), not 2 × `--buffer-size`. With a buffer
//! kept for the connection's life, 2,000 idle connections held 250 MB, and
//! glibc kept most of it after they closed: freed blocks below its mmap
//! threshold (128 KiB at first, and raised by every larger block freed)
//! stay in its heaps and arenas. The buffer is read into without being
//! zeroed (`try_read_buf` fills a `Vec`'s spare capacity), so taking a
//! fresh one per burst costs a malloc, not a memset.
//!
//! `tokio-copy` and `copy-bidirectional` are the library functions as they
//! are: each keeps its own 8 KiB buffer per direction for the connection's
//! life, and that is part of what those modes measure (docs/proxy.md has
//! the figures).
//!
//! `splice` copies a direction's bursts through its worker thread's
//! buffer of `--splice-after` (16 KiB; no connection holds one) until one
//! read fills it, and
//! from then on holds no user-space buffer at all: a pipe per direction while
//! bytes are queued, taken from the proxy's pool (warm, at the size it
//! grew to) or made at the kernel's 64 KiB, growing on demand up to
//! `--buffer-size` under `--pipe-budget`, and given back to the pool as
//! soon as a fill finds nothing queued (`super::pipes`). Request and
//! response traffic is cheaper copied (`copy_small_bursts` says by how
//! much); bulk is cheaper spliced. A direction that finds no pipe free
//! copies that burst like `tokio`, with a 64 KiB buffer, and tries for a
//! pipe again at its next burst: the descriptor limit plans none for a
//! connection (`super::capacity`), so under a tight limit every direction
//! copies.

use super::events::End;
use super::pipes::{GrowingPipe, START_SIZE};
use super::{Ctx, Cut, Meter};
use crate::config::proxy::Mode;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::TcpStream;

/// Relays until both directions end, an error, the idle timeout or the cut.
pub(super) async fn relay(
    ctx: &Ctx,
    id: u64,
    mut client: TcpStream,
    mut upstream: TcpStream,
    meter: &Arc<Meter>,
    cut: Cut,
) -> End {
    let cfg = &ctx.cfg;
    let work = async {
        match cfg.mode {
            Mode::Tokio => own_loop(&client, &upstream, cfg.buffer_size, meter).await,
            Mode::TokioCopy => copy_each_way(&mut client, &mut upstream, meter).await,
            Mode::CopyBidirectional => {
                // Each wrapper counts what is written into its stream.
                let mut c = Metered::new(&mut client, &meter.down, meter);
                let mut u = Metered::new(&mut upstream, &meter.up, meter);
                tokio::io::copy_bidirectional(&mut c, &mut u)
                    .await
                    .map(|_| ())
            }
            // Where the platform has no splice(2), the pipe cannot be made
            // and the connection ends with that error (config refuses the
            // mode there first).
            Mode::Splice => splice_both(&mut client, &mut upstream, ctx, id, meter).await,
            Mode::Std | Mode::StdCopy => Err(io::Error::other("not a tokio mode")),
        }
    };
    // Boxed, and only with --idle-timeout: its timer's room would be in
    // every connection's task otherwise, set or not.
    let watchdog = cfg
        .idle_timeout
        .map(|idle| Box::pin(idle_watchdog(meter, idle)));
    let idle = async {
        match watchdog {
            Some(watchdog) => watchdog.await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        r = work => match r {
            Ok(()) => End::Closed,
            Err(e) => End::from_io(&e),
        },
        () = idle => End::Idle,
        _ = cut => End::Cut,
    }
}

/// Resolves once no byte has moved either way for `idle`.
async fn idle_watchdog(meter: &Meter, idle: Duration) {
    loop {
        let quiet = meter.idle_for();
        if quiet >= idle {
            return;
        }
        tokio::time::sleep(idle - quiet).await;
    }
}

/// `--mode tokio`: our own loop with a buffer of `--buffer-size` per
/// direction, held only while that direction has bytes to move.
async fn own_loop(
    client: &TcpStream,
    upstream: &TcpStream,
    buffer_size: usize,
    meter: &Meter,
) -> io::Result<()> {
    let one_ended = AtomicBool::new(false);
    let up = pump(client, upstream, buffer_size, &meter.up, meter, &one_ended);
    let down = pump(
        upstream,
        client,
        buffer_size,
        &meter.down,
        meter,
        &one_ended,
    );
    tokio::try_join!(up, down).map(|_| ())
}

/// Passes a direction's EOF on to `to` as `shutdown(Write)`, unless the
/// other direction has already ended: then the connection is about to be
/// closed, and close(2) sends the same FIN. Both receive queues are empty
/// by then (each direction read its EOF), so that close is a FIN, never a
/// reset. One system call fewer per connection that ends cleanly (a short
/// connection made 24).
fn pass_eof(to: &TcpStream, one_ended: &AtomicBool) -> io::Result<()> {
    if one_ended.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    socket2::SockRef::from(to).shutdown(std::net::Shutdown::Write)
}

/// One direction: wait until `from` is readable with no buffer held, then
/// read and write with a fresh buffer until `from` would block, and free it.
///
/// The waits use `poll_read_ready`/`poll_write_ready` rather than
/// `readable()`/`writable()` because those spend the task's cooperative
/// budget: a stream that never runs dry still yields to the other
/// direction and to other connections.
async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    buffer_size: usize,
    counter: &AtomicU64,
    meter: &Meter,
    one_ended: &AtomicBool,
) -> io::Result<()> {
    loop {
        poll_fn(|cx| from.poll_read_ready(cx)).await?;
        if let Burst::Ended = copy_burst(from, to, buffer_size, counter, meter, one_ended).await? {
            return Ok(());
        }
    }
}

/// How [`copy_burst`] ended.
enum Burst {
    /// `from` would block: everything queued was copied.
    Drained,
    /// The EOF came and was passed on: the direction is done.
    Ended,
}

/// Reads and writes with a fresh buffer of `buffer_size` until `from`
/// would block (which clears its readiness) or reaches its EOF, and frees
/// the buffer.
async fn copy_burst(
    from: &TcpStream,
    to: &TcpStream,
    buffer_size: usize,
    counter: &AtomicU64,
    meter: &Meter,
    one_ended: &AtomicBool,
) -> io::Result<Burst> {
    let mut buf = Vec::with_capacity(buffer_size);
    loop {
        match from.try_read_buf(&mut buf) {
            // Half-close: pass the EOF on; the other direction keeps going.
            Ok(0) => return pass_eof(to, one_ended).map(|()| Burst::Ended),
            Ok(_) => {
                write_all(to, &buf, counter, meter).await?;
                buf.clear();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Burst::Drained),
            Err(e) => return Err(e),
        }
    }
}

/// Writes all of `bytes` to `to`, counting each write as it completes.
async fn write_all(
    to: &TcpStream,
    mut bytes: &[u8],
    counter: &AtomicU64,
    meter: &Meter,
) -> io::Result<()> {
    while !bytes.is_empty() {
        poll_fn(|cx| to.poll_write_ready(cx)).await?;
        match to.try_write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                meter.add(counter, n);
                bytes = &bytes[n..];
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `--mode tokio-copy`: `tokio::io::copy` each way, then pass the EOF on.
async fn copy_each_way(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    meter: &Meter,
) -> io::Result<()> {
    let (mut cr, cw) = client.split();
    let (mut ur, uw) = upstream.split();
    let up = async {
        let mut to = Metered::new(uw, &meter.up, meter);
        tokio::io::copy(&mut cr, &mut to).await?;
        to.shutdown().await
    };
    let down = async {
        let mut to = Metered::new(cw, &meter.down, meter);
        tokio::io::copy(&mut ur, &mut to).await?;
        to.shutdown().await
    };
    tokio::try_join!(up, down).map(|_| ())
}

/// Counts the bytes written through it (reads pass straight through), so
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
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            if n > 0 {
                self.meter.add(self.counter, n);
            }
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// `--mode splice`: each direction copies its small bursts, then moves
/// bulk through a pipe with splice(2). Each pipe may grow to
/// `--buffer-size`, within the proxy's pipe budget.
async fn splice_both(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    ctx: &Ctx,
    id: u64,
    meter: &Meter,
) -> io::Result<()> {
    let up = SpliceDirection {
        name: "client_to_upstream",
        counter: &meter.up,
        size: &meter.pipe_up,
    };
    let down = SpliceDirection {
        name: "upstream_to_client",
        counter: &meter.down,
        size: &meter.pipe_down,
    };
    let one_ended = AtomicBool::new(false);
    let (client_in, client_out) = client.split();
    let (upstream_in, upstream_out) = upstream.split();
    let up = splice_pump(client_in, upstream_out, ctx, id, up, meter, &one_ended);
    let down = splice_pump(upstream_in, client_out, ctx, id, down, meter, &one_ended);
    tokio::try_join!(up, down).map(|_| ())
}

/// One direction's name for events, its byte counter and where its pipe's
/// current size is published for the connection's report.
struct SpliceDirection<'a> {
    name: &'static str,
    counter: &'a AtomicU64,
    size: &'a AtomicUsize,
}

/// One direction: small bursts first ([`copy_small_bursts`]); once a read
/// fills its buffer, splice: fill the pipe from `from` as far as is queued (up to its
/// capacity), then drain it completely into `to`, partial splice by partial
/// splice. Because the pipe is always emptied before the next fill, a
/// `WouldBlock` on the fill can only mean "nothing queued on the socket".
/// Once empty, a pipe that the last fill filled completely doubles (see
/// `super::pipes`); a refused growth is reported and the pipe keeps its
/// size.
///
/// A burst that finds no pipe free (all `pipes_max` are open, or the
/// kernel refuses one) is copied like `tokio` ([`copy_burst`]), and the
/// next burst tries for a pipe again: a connection needs no pipe to work,
/// so the descriptor limit plans none for it (`super::capacity`). The
/// first such burst of a direction is counted (`pipes_unavailable`).
///
/// A pipe is held only while bytes are queued: when a fill finds nothing,
/// the empty pipe goes back to the pool and the direction waits for its
/// next byte holding two sockets, like HAProxy, which releases a pipe as
/// soon as it is empty. A connection that exchanged a few bytes and then
/// sat idle used to keep its pipes to the end: 7,990 idle connections that
/// had each echoed 8 bytes held all 1,998 pipes the descriptor limit
/// allowed, and the next busy connection had to copy.
async fn splice_pump(
    mut from: ReadHalf<'_>,
    to: WriteHalf<'_>,
    ctx: &Ctx,
    id: u64,
    direction: SpliceDirection<'_>,
    meter: &Meter,
    one_ended: &AtomicBool,
) -> io::Result<()> {
    use tokio::io::Interest;

    let to = to.as_ref();
    let copy_until = ctx.cfg.splice_after;
    if copy_until > 0 {
        match copy_small_bursts(
            &mut from,
            to,
            copy_until,
            direction.counter,
            meter,
            one_ended,
        )
        .await?
        {
            Copied::Ended => return Ok(()),
            Copied::Bulk => {}
        }
    }
    let from = from.as_ref();
    let mut copied = false;
    loop {
        let (mut pipe, mut n) = match take_pipe_for_bytes(from, ctx).await? {
            Taken::Pipe(pipe, n) => (pipe, n),
            Taken::Eof => return pass_eof(to, one_ended),
            Taken::Refused(refused) => {
                if !std::mem::replace(&mut copied, true) {
                    ctx.pipe_unavailable(id, direction.name, refused.as_ref());
                }
                let burst = copy_burst(from, to, START_SIZE, direction.counter, meter, one_ended);
                match burst.await? {
                    Burst::Ended => return Ok(()),
                    Burst::Drained => continue,
                }
            }
        };
        direction.size.store(pipe.capacity(), Ordering::Relaxed);
        loop {
            if n == 0 {
                // Half-close: pass the EOF on; the other direction keeps going.
                return pass_eof(to, one_ended);
            }
            let mut left = n;
            while left > 0 {
                to.writable().await?;
                match to.try_io(Interest::WRITABLE, || pipe.drain_to(to, left)) {
                    Ok(0) => return Err(io::Error::other("splice moved 0 bytes from a full pipe")),
                    Ok(m) => {
                        left -= m;
                        meter.add(direction.counter, m);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            }
            if let Some(refusal) = pipe.grow_if_full(n) {
                ctx.pipe_growth_refused(id, direction.name, refusal);
            }
            direction.size.store(pipe.capacity(), Ordering::Relaxed);
            // More queued? Fill again; if nothing is, the empty pipe goes
            // back to the pool (dropped at the end of this loop).
            let chunk = pipe.capacity();
            match from.try_io(Interest::READABLE, || pipe.fill_from(from, chunk)) {
                Ok(m) => n = m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
    }
}

/// How [`copy_small_bursts`] ended.
enum Copied {
    /// The EOF came and was passed on: the direction is done.
    Ended,
    /// A read filled the buffer: bulk, so splice the rest.
    Bulk,
}

/// A direction's bursts while each fits in one read of `size` bytes
/// (`--splice-after`, 16 KiB by default). For small exchanges this costs less than
/// splice(2): a 1 KiB response moved by splice took 35 µs of kernel time
/// per connection where HAProxy's recv and send took 24 µs, and a short
/// read shows the socket drained (tokio clears its readiness on one), where
/// a splice fill had to be repeated until `EAGAIN`. Once a read fills the
/// buffer the direction is moving bulk, and splices from then on: the CPU
/// per GB of splice is what bulk needs.
///
/// The buffer is the worker thread's own, used within one poll: the read
/// and the write that follows it happen without an await between them, so
/// no connection holds a buffer, not even for a burst. Only bytes the
/// destination would not take at once are copied into a buffer of their
/// own, to wait for it. (A fresh 16 KiB buffer per burst, freed after it,
/// left 10,000 connections that had each echoed 8 bytes at 3.9 KiB of RSS
/// each, not 3.0: glibc keeps what it freed.)
async fn copy_small_bursts(
    from: &mut ReadHalf<'_>,
    to: &TcpStream,
    size: usize,
    counter: &AtomicU64,
    meter: &Meter,
    one_ended: &AtomicBool,
) -> io::Result<Copied> {
    thread_local! {
        static BURST: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    loop {
        let (read, unwritten) = poll_fn(|cx| {
            BURST.with_borrow_mut(|burst| {
                if burst.len() < size {
                    burst.resize(size, 0);
                }
                let mut buf = ReadBuf::new(&mut burst[..size]);
                std::task::ready!(Pin::new(&mut *from).poll_read(cx, &mut buf))?;
                let read = buf.filled();
                let written = match to.try_write(read) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                    Err(e) => return Poll::Ready(Err(e)),
                };
                if written > 0 {
                    meter.add(counter, written);
                }
                Poll::Ready(Ok((read.len(), read[written..].to_vec())))
            })
        })
        .await?;
        if read == 0 {
            pass_eof(to, one_ended)?;
            return Ok(Copied::Ended);
        }
        write_all(to, &unwritten, counter, meter).await?;
        if read == size {
            return Ok(Copied::Bulk);
        }
    }
}

/// What [`take_pipe_for_bytes`] found.
enum Taken<'a> {
    /// A pipe, and what its first fill moved (0: the EOF).
    Pipe(GrowingPipe<'a>, usize),
    /// The EOF, before any byte (no pipe was made for it).
    Eof,
    /// No pipe: all `pipes_max` are out (`None`), or the kernel refused
    /// one (EMFILE, ENOMEM).
    Refused(Option<io::Error>),
}

/// Waits until bytes are queued on `from` and moves them into a pipe. A
/// socket can be reported readable with nothing queued (a fresh connection
/// was, every one), so a pipe is only tried, not kept: with a pooled pipe
/// the fill is tried at once and the pipe goes straight back if nothing
/// was there (no system call spent, where a peek costs one); with none
/// pooled, a peek waits for a byte (or the EOF) to be really there before
/// a pipe is made, so that idle connections never fill the pool. When
/// every pipe the descriptors allow is open, it says so at once, without
/// the peek: the copy that follows reads whatever is there, or the EOF.
async fn take_pipe_for_bytes<'a>(from: &TcpStream, ctx: &'a Ctx) -> io::Result<Taken<'a>> {
    use tokio::io::Interest;

    loop {
        from.readable().await?;
        let mut pipe = match ctx.pipes.take_pooled(ctx.cfg.buffer_size) {
            Some(pipe) => pipe,
            None if !ctx.pipes.has_room() => return Ok(Taken::Refused(None)),
            None => {
                // poll_peek, not peek(): that future's waiter is 232 bytes
                // of every connection's task.
                let peeked = poll_fn(|cx| {
                    let mut one = [0u8; 1];
                    let mut buf = ReadBuf::new(&mut one);
                    from.poll_peek(cx, &mut buf)
                })
                .await?;
                if peeked == 0 {
                    return Ok(Taken::Eof);
                }
                match ctx.pipes.take(ctx.cfg.buffer_size) {
                    Ok(Some(pipe)) => pipe,
                    Ok(None) => return Ok(Taken::Refused(None)),
                    Err(e) => return Ok(Taken::Refused(Some(e))),
                }
            }
        };
        let chunk = pipe.capacity();
        match from.try_io(Interest::READABLE, || pipe.fill_from(from, chunk)) {
            Ok(n) => return Ok(Taken::Pipe(pipe, n)),
            // Nothing queued after all: the pipe goes back to the pool.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}
