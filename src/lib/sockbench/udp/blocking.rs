//! The blocking backends: `std::net::UdpSocket`, `socket2::Socket`, and
//! nix's `send`/`sendto`/`recv` on an `OwnedFd`. Each waits in the kernel
//! (receive and send timeouts of [`POLL`]) and runs each loop on a thread
//! of its own (the [`Backend`] defaults for `pause` and `spawn`). Only the
//! reuse options of `std` are set with socket2 before binding, because std
//! has no call for them.

use super::driver::{Backend, POLL};
use super::{Reuse, UdpCase};
use crate::error::Result;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::future::{ready, Future};
use std::io;
use std::net::{SocketAddr, UdpSocket};

/// A sending socket and where it sends (None when connected).
pub(super) struct Sender<S, A> {
    pub sock: S,
    pub dest: Option<A>,
}

/// A socket2 socket with the reuse option set and bound: how `std`,
/// `tokio` and smol get SO_REUSEADDR/SO_REUSEPORT, which they have no
/// call for.
pub(super) fn socket2_reuse_bound(addr: SocketAddr, reuse: Reuse) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    match reuse {
        Reuse::None => {}
        Reuse::Addr => s.set_reuse_address(true)?,
        Reuse::Port => s.set_reuse_port(true)?,
    }
    s.bind(&addr.into())?;
    Ok(s)
}

/// A std socket bound to `addr` with the reuse option.
pub(super) fn std_bind(addr: SocketAddr, reuse: Reuse) -> io::Result<UdpSocket> {
    match reuse {
        Reuse::None => UdpSocket::bind(addr),
        _ => Ok(socket2_reuse_bound(addr, reuse)?.into()),
    }
}

pub(super) struct StdLib;

impl Backend for StdLib {
    type Tx = Sender<UdpSocket, SocketAddr>;
    type Rx = UdpSocket;
    fn start(_: &UdpCase) -> Result<Self> {
        Ok(StdLib)
    }
    fn bind_rx(&self, addr: SocketAddr, reuse: Reuse) -> io::Result<UdpSocket> {
        let s = std_bind(addr, reuse)?;
        s.set_read_timeout(Some(POLL))?;
        Ok(s)
    }
    fn local_addr(rx: &UdpSocket) -> io::Result<SocketAddr> {
        rx.local_addr()
    }
    fn open_tx(&self, bind: SocketAddr, dest: SocketAddr, connected: bool) -> io::Result<Self::Tx> {
        let sock = UdpSocket::bind(bind)?;
        sock.set_write_timeout(Some(POLL))?;
        if connected {
            sock.connect(dest)?;
        }
        Ok(Sender {
            sock,
            dest: (!connected).then_some(dest),
        })
    }
    fn send<'a>(
        tx: &'a mut Self::Tx,
        buf: &'a [u8],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a {
        ready(match tx.dest {
            Some(d) => tx.sock.send_to(buf, d),
            None => tx.sock.send(buf),
        })
    }
    fn recv<'a>(
        rx: &'a UdpSocket,
        buf: &'a mut [u8],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a {
        ready(rx.recv(buf))
    }
}

pub(super) struct Socket2Lib;

impl Backend for Socket2Lib {
    type Tx = Sender<Socket, SockAddr>;
    type Rx = Socket;
    fn start(_: &UdpCase) -> Result<Self> {
        Ok(Socket2Lib)
    }
    fn bind_rx(&self, addr: SocketAddr, reuse: Reuse) -> io::Result<Socket> {
        let s = socket2_reuse_bound(addr, reuse)?;
        s.set_read_timeout(Some(POLL))?;
        Ok(s)
    }
    fn local_addr(rx: &Socket) -> io::Result<SocketAddr> {
        rx.local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("not an IP socket"))
    }
    fn open_tx(&self, bind: SocketAddr, dest: SocketAddr, connected: bool) -> io::Result<Self::Tx> {
        let sock = Socket::new(Domain::for_address(bind), Type::DGRAM, Some(Protocol::UDP))?;
        sock.bind(&bind.into())?;
        sock.set_write_timeout(Some(POLL))?;
        if connected {
            sock.connect(&dest.into())?;
        }
        Ok(Sender {
            sock,
            dest: (!connected).then(|| dest.into()),
        })
    }
    fn send<'a>(
        tx: &'a mut Self::Tx,
        buf: &'a [u8],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a {
        ready(match &tx.dest {
            Some(d) => tx.sock.send_to(buf, d),
            None => tx.sock.send(buf),
        })
    }
    fn recv<'a>(
        rx: &'a Socket,
        buf: &'a mut [u8],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a {
        // socket2's safe recv: `Read for &Socket` is recv(2) into `buf`.
        ready(io::Read::read(&mut &*rx, buf))
    }
}

pub(super) use nixlib::NixLib;

mod nixlib {
    //! The nix backend: `OwnedFd` sockets and nix's send/sendto/recv.
    use super::*;
    use nix::sys::socket::{
        bind, connect, getsockname, recv, send, sendto, setsockopt, socket, sockopt, AddressFamily,
        MsgFlags, SockFlag, SockProtocol, SockType, SockaddrLike, SockaddrStorage,
    };
    use nix::sys::time::TimeVal;
    use std::os::fd::{AsRawFd, OwnedFd};

    pub struct NixLib;

    fn timeval() -> TimeVal {
        TimeVal::new(0, POLL.as_micros() as _)
    }

    fn udp_socket(addr: SocketAddr) -> io::Result<OwnedFd> {
        let family = if addr.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        Ok(socket(
            family,
            SockType::Datagram,
            // No SOCK_CLOEXEC: macOS has no such flag, and sockbench does
            // not exec while a cell runs, so nothing could inherit it.
            SockFlag::empty(),
            SockProtocol::Udp,
        )?)
    }

    impl Backend for NixLib {
        type Tx = Sender<OwnedFd, SockaddrStorage>;
        type Rx = OwnedFd;
        fn start(_: &UdpCase) -> Result<Self> {
            Ok(NixLib)
        }
        fn bind_rx(&self, addr: SocketAddr, reuse: Reuse) -> io::Result<OwnedFd> {
            let fd = udp_socket(addr)?;
            match reuse {
                Reuse::None => {}
                Reuse::Addr => setsockopt(&fd, sockopt::ReuseAddr, &true)?,
                Reuse::Port => setsockopt(&fd, sockopt::ReusePort, &true)?,
            }
            bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
            setsockopt(&fd, sockopt::ReceiveTimeout, &timeval())?;
            Ok(fd)
        }
        fn local_addr(rx: &OwnedFd) -> io::Result<SocketAddr> {
            let a: SockaddrStorage = getsockname(rx.as_raw_fd())?;
            if let Some(v4) = a.as_sockaddr_in() {
                Ok(SocketAddr::V4((*v4).into()))
            } else if let Some(v6) = a.as_sockaddr_in6() {
                Ok(SocketAddr::V6((*v6).into()))
            } else {
                Err(io::Error::other(format!(
                    "unexpected address family {:?}",
                    a.family()
                )))
            }
        }
        fn open_tx(
            &self,
            bind_to: SocketAddr,
            dest: SocketAddr,
            connected: bool,
        ) -> io::Result<Self::Tx> {
            let fd = udp_socket(bind_to)?;
            bind(fd.as_raw_fd(), &SockaddrStorage::from(bind_to))?;
            setsockopt(&fd, sockopt::SendTimeout, &timeval())?;
            let dest = SockaddrStorage::from(dest);
            if connected {
                connect(fd.as_raw_fd(), &dest)?;
            }
            Ok(Sender {
                sock: fd,
                dest: (!connected).then_some(dest),
            })
        }
        fn send<'a>(
            tx: &'a mut Self::Tx,
            buf: &'a [u8],
        ) -> impl Future<Output = io::Result<usize>> + Send + 'a {
            let fd = tx.sock.as_raw_fd();
            ready(
                match &tx.dest {
                    Some(d) => sendto(fd, buf, d, MsgFlags::empty()),
                    None => send(fd, buf, MsgFlags::empty()),
                }
                .map_err(io::Error::from),
            )
        }
        fn recv<'a>(
            rx: &'a OwnedFd,
            buf: &'a mut [u8],
        ) -> impl Future<Output = io::Result<usize>> + Send + 'a {
            ready(recv(rx.as_raw_fd(), buf, MsgFlags::empty()).map_err(io::Error::from))
        }
    }
}
