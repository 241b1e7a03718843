//! The async backends: `tokio::net::UdpSocket` tasks on a multi-thread
//! runtime with one worker per sender and receiver, and smol's
//! `Async<UdpSocket>` (async-io's reactor, no tokio), each task on its own
//! thread with `smol::block_on`. Sockets are bound with std (and socket2
//! for the reuse options) and handed to the library; a wait for data is
//! bounded by [`POLL`] with each library's own timer.

use super::blocking::{std_bind, Sender};
use super::driver::{spawn_thread, Backend, Join, POLL};
use super::{Mode, Reuse, UdpCase};
use crate::error::{Error, Result};
use smol::Async;
use std::future::Future;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;
use tokio::net::UdpSocket as TokioUdp;

pub(super) struct TokioLib {
    rt: tokio::runtime::Runtime,
}

impl TokioLib {
    /// A std socket handed to tokio (in the runtime's context).
    fn adopt(&self, sock: UdpSocket) -> io::Result<TokioUdp> {
        let _context = self.rt.enter();
        sock.set_nonblocking(true)?;
        TokioUdp::from_std(sock)
    }
}

impl Backend for TokioLib {
    type Tx = Sender<TokioUdp, SocketAddr>;
    type Rx = TokioUdp;
    fn start(case: &UdpCase) -> Result<Self> {
        let (senders, receivers) = UdpCase::split(case.threads);
        let workers = if case.mode() == Mode::PingPong {
            1
        } else {
            senders + receivers
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| Error::io("tokio: cannot start a runtime", e))?;
        Ok(TokioLib { rt })
    }
    fn bind_rx(&self, addr: SocketAddr, reuse: Reuse) -> io::Result<TokioUdp> {
        self.adopt(std_bind(addr, reuse)?)
    }
    fn local_addr(rx: &TokioUdp) -> io::Result<SocketAddr> {
        rx.local_addr()
    }
    fn open_tx(&self, bind: SocketAddr, dest: SocketAddr, connected: bool) -> io::Result<Self::Tx> {
        let sock = UdpSocket::bind(bind)?;
        if connected {
            // UDP connect only sets the default peer; it never waits.
            sock.connect(dest)?;
        }
        Ok(Sender {
            sock: self.adopt(sock)?,
            dest: (!connected).then_some(dest),
        })
    }
    async fn send(tx: &mut Self::Tx, buf: &[u8]) -> io::Result<usize> {
        match tx.dest {
            Some(d) => tx.sock.send_to(buf, d).await,
            None => tx.sock.send(buf).await,
        }
    }
    /// Reads what is queued with try_recv; waits for readiness (bounded
    /// by POLL) only when the socket is empty.
    async fn recv(rx: &TokioUdp, buf: &mut [u8]) -> io::Result<usize> {
        match rx.try_recv(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                match tokio::time::timeout(POLL, rx.readable()).await {
                    Err(_) => Err(io::ErrorKind::TimedOut.into()),
                    Ok(Err(e)) => Err(e),
                    Ok(Ok(())) => rx.try_recv(buf),
                }
            }
            other => other,
        }
    }
    fn pause() -> impl Future<Output = ()> + Send {
        tokio::task::yield_now()
    }
    fn spawn<T: Send + 'static>(&self, task: impl Future<Output = T> + Send + 'static) -> Join<T> {
        let handle = self.rt.spawn(task);
        let rt = self.rt.handle().clone();
        Box::new(move || rt.block_on(handle).ok())
    }
    fn finish(self) {
        self.rt.shutdown_timeout(Duration::from_millis(100));
    }
}

pub(super) struct SmolLib;

impl Backend for SmolLib {
    type Tx = Sender<Async<UdpSocket>, SocketAddr>;
    type Rx = Async<UdpSocket>;
    /// async-io's reactor starts on first use and panics when it cannot
    /// get its file descriptors (a small `ulimit -n`): make sure there is
    /// room for it and the first socket, so that such a limit is a
    /// one-line error like any other.
    fn start(_: &UdpCase) -> Result<Self> {
        let held = (0..4)
            .map(|_| std::fs::File::open("/dev/null"))
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| Error::io("async: cannot start the reactor", e))?;
        drop(held);
        Ok(SmolLib)
    }
    fn bind_rx(&self, addr: SocketAddr, reuse: Reuse) -> io::Result<Async<UdpSocket>> {
        Async::new(std_bind(addr, reuse)?)
    }
    fn local_addr(rx: &Async<UdpSocket>) -> io::Result<SocketAddr> {
        rx.get_ref().local_addr()
    }
    fn open_tx(&self, bind: SocketAddr, dest: SocketAddr, connected: bool) -> io::Result<Self::Tx> {
        let sock = Async::<UdpSocket>::bind(bind)?;
        if connected {
            // UDP connect only sets the default peer; it never waits.
            sock.get_ref().connect(dest)?;
        }
        Ok(Sender {
            sock,
            dest: (!connected).then_some(dest),
        })
    }
    async fn send(tx: &mut Self::Tx, buf: &[u8]) -> io::Result<usize> {
        match tx.dest {
            Some(d) => tx.sock.send_to(buf, d).await,
            None => tx.sock.send(buf).await,
        }
    }
    /// Like `Async::recv` (try the read, else wait for readiness), with
    /// the wait bounded by POLL.
    async fn recv(rx: &Async<UdpSocket>, buf: &mut [u8]) -> io::Result<usize> {
        match rx.get_ref().recv(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let ready = smol::future::or(async { rx.readable().await.map(|_| true) }, async {
                    smol::Timer::after(POLL).await;
                    Ok(false)
                })
                .await?;
                if ready {
                    // Another receiver on a shared socket may have
                    // taken the datagram: try once, never wait
                    // unbounded.
                    rx.get_ref().recv(buf)
                } else {
                    Err(io::ErrorKind::TimedOut.into())
                }
            }
            other => other,
        }
    }
    fn pause() -> impl Future<Output = ()> + Send {
        smol::future::yield_now()
    }
    fn spawn<T: Send + 'static>(&self, task: impl Future<Output = T> + Send + 'static) -> Join<T> {
        spawn_thread(task, smol::block_on)
    }
}
