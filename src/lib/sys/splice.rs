//! splice(2) through a pipe: the zero-copy path of `tcp_proxy --mode splice`.
//!
//! Why a pipe: splice moves pages between a file descriptor and a pipe, never
//! between two sockets directly, so each direction of a proxied connection
//! owns one pipe. Data goes socket → pipe (the kernel takes references to the
//! socket's receive pages instead of copying them to user space) and then
//! pipe → socket. Go's `io.Copy` between two `*net.TCPConn` does the same on
//! Linux, which is why seed 004's Go proxy was hard to beat.
//!
//! Everything here is non-blocking (`SPLICE_F_NONBLOCK`, `O_NONBLOCK` pipe)
//! provided the socket is non-blocking too (the socket side of splice
//! looks only at the socket's own `O_NONBLOCK`; tokio sets it): the caller
//! waits for socket readiness and retries on `WouldBlock`. The calls are nix's safe wrappers; this file has no
//! `unsafe`.
//!
//! Flags: `SPLICE_F_MOVE` is a hint to move pages rather than copy them (the
//! kernel may ignore it); it costs nothing. `SPLICE_F_MORE` is deliberately
//! *not* used on the pipe → socket side: for a TCP socket it means
//! `MSG_MORE`, which holds back a partial segment until the next write, and
//! a proxy cannot know whether a next write will come soon. That would
//! reintroduce exactly the Nagle-style stall this proxy exists to remove
//! (see docs/proxy.md).
//!
//! Size: a pipe starts at what it is asked for (the proxy asks for the
//! kernel's default, 64 KiB) and can be resized while it is open
//! (`Pipe::resize`, F_SETPIPE_SZ), which is how the proxy grows a busy
//! connection's pipes on demand instead of giving every connection the
//! largest one. The kernel charges every pipe's size, used or not, to its
//! owner's per-user budget (/proc/sys/fs/pipe-user-pages-soft and -hard;
//! root is exempt) and caps a resize at /proc/sys/fs/pipe-max-size unless
//! the process has CAP_SYS_RESOURCE ([`pipe_max_size`]). Pages themselves
//! are allocated only while bytes sit in the pipe.

use nix::fcntl::{fcntl, splice, FcntlArg, OFlag, SpliceFFlags};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// One pipe: the in-kernel buffer of one direction of a spliced connection.
#[derive(Debug)]
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

impl Pipe {
    /// A non-blocking pipe, asked to hold `capacity` bytes (F_SETPIPE_SZ).
    /// The kernel rounds up to a power-of-two number of pages and caps an
    /// unprivileged request at /proc/sys/fs/pipe-max-size; if it refuses, the
    /// default (64 KiB) is kept. [`Pipe::capacity`] is what was granted.
    pub fn new(capacity: usize) -> io::Result<Pipe> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        let want = capacity.clamp(4096, 1 << 30) as i32;
        let size = |fd: &OwnedFd| {
            fcntl(fd.as_raw_fd(), FcntlArg::F_GETPIPE_SZ)
                .map(|n| n as usize)
                .unwrap_or(65536)
        };
        // A new pipe usually has the size the proxy asks for (the default):
        // then there is nothing to set.
        let mut granted = size(&write);
        if granted != want as usize {
            let _ = fcntl(write.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(want));
            granted = size(&write);
        }
        Ok(Pipe {
            read,
            write,
            capacity: granted,
        })
    }

    /// Bytes the pipe holds at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Asks the kernel to make the pipe hold `capacity` bytes (F_SETPIPE_SZ)
    /// and returns what it granted (a power-of-two number of pages, at least
    /// `capacity`). On an error the pipe keeps its size and its contents.
    /// The kernel refuses with `EBUSY` when the pipe holds more than the new
    /// size would, `EPERM` above /proc/sys/fs/pipe-max-size (without
    /// CAP_SYS_RESOURCE) or when the user's pipe budget is spent, and
    /// `ENOMEM`.
    pub fn resize(&mut self, capacity: usize) -> io::Result<usize> {
        let want = i32::try_from(capacity.max(4096))
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let granted = fcntl(self.write.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(want))?;
        self.capacity = granted as usize;
        Ok(self.capacity)
    }

    /// Moves up to `len` bytes from `socket`'s receive queue into the pipe.
    /// `Ok(0)` means the peer sent EOF (when `len > 0`); `WouldBlock` means
    /// nothing is queued yet (or the pipe is full).
    pub fn fill_from(&self, socket: &impl AsFd, len: usize) -> io::Result<usize> {
        retry_eintr(|| {
            splice(
                socket.as_fd(),
                None,
                self.write.as_fd(),
                None,
                len,
                SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK,
            )
        })
    }

    /// Moves up to `len` bytes from the pipe into `socket`'s send queue.
    /// May move fewer (a partial splice when the send buffer fills);
    /// `WouldBlock` means the send buffer is full.
    pub fn drain_to(&self, socket: &impl AsFd, len: usize) -> io::Result<usize> {
        retry_eintr(|| {
            splice(
                self.read.as_fd(),
                None,
                socket.as_fd(),
                None,
                len,
                SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK,
            )
        })
    }
}

/// The largest pipe an unprivileged process may ask for, from
/// /proc/sys/fs/pipe-max-size (1 MiB unless the administrator changed it);
/// `None` when it cannot be read.
pub fn pipe_max_size() -> Option<usize> {
    std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn retry_eintr(mut f: impl FnMut() -> nix::Result<usize>) -> io::Result<usize> {
    loop {
        match f() {
            Err(nix::errno::Errno::EINTR) => continue,
            other => return other.map_err(io::Error::from),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn moves_bytes_between_sockets() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        let listener2 = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(listener2.local_addr().unwrap()).unwrap();
        let (mut d, _) = listener2.accept().unwrap();
        // The socket side of splice honours only the socket's own
        // O_NONBLOCK, as in the proxy, where tokio sets it.
        b.set_nonblocking(true).unwrap();
        c.set_nonblocking(true).unwrap();
        let pipe = Pipe::new(1 << 16).unwrap();
        assert!(pipe.capacity() >= 4096);
        // Nothing queued yet: WouldBlock, not EOF.
        let err = pipe.fill_from(&b, 1024).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        a.write_all(b"hello splice").unwrap();
        let mut moved = 0;
        for _ in 0..1000 {
            match pipe.fill_from(&b, 1024) {
                Ok(n) => {
                    moved = n;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(moved, 12);
        assert_eq!(pipe.drain_to(&c, moved).unwrap(), 12);
        let mut got = [0u8; 12];
        d.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello splice");
        drop(a);
        // EOF shows as 0 once the FIN arrives.
        let mut eof = false;
        for _ in 0..1000 {
            match pipe.fill_from(&b, 1024) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => panic!("unexpected {n} bytes"),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(eof);
    }

    #[test]
    fn resize_grows_and_refuses_to_drop_contents() {
        let mut pipe = Pipe::new(1 << 16).unwrap();
        assert_eq!(pipe.capacity(), 1 << 16);
        let limit = pipe_max_size().unwrap_or(1 << 20);
        assert_eq!(pipe.resize(limit.min(1 << 18)).unwrap(), limit.min(1 << 18));
        assert_eq!(pipe.capacity(), limit.min(1 << 18));
        // 8 KiB in a pipe cannot shrink to one page: EBUSY, size kept.
        nix::unistd::write(&pipe.write, &[7u8; 8192]).unwrap();
        let before = pipe.capacity();
        let err = pipe.resize(4096).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBUSY));
        assert_eq!(pipe.capacity(), before);
    }
}
