//! Portable backend: one `recv_from` per datagram, no kernel drop counter,
//! no send-error reporting. Each gap is reported to the user at run time.

use socket2::Socket;
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;

use super::Received;

/// What every stub of a call this platform lacks returns: an `Unsupported`
/// error that names the call, for the caller to report.
fn unsupported<T>(what: &'static str) -> io::Result<T> {
    Err(io::Error::new(io::ErrorKind::Unsupported, what))
}

/// No-op here; returns false so the caller can say that ENOBUFS-style
/// queue drops may go unreported on this platform.
pub fn enable_send_errors(_socket: &Socket) -> io::Result<bool> {
    Ok(false)
}

/// No-op here; returns false (kernel drops cannot be reported).
pub fn enable_kernel_drop_counter(_socket: &Socket) -> io::Result<bool> {
    Ok(false)
}

/// Receives one datagram per call.
pub struct RecvBatch {
    buf: Vec<MaybeUninit<u8>>,
    len: usize,
    from: Option<SocketAddr>,
}

impl RecvBatch {
    pub fn new(_batch: usize, buf_size: usize) -> Self {
        RecvBatch {
            buf: vec![MaybeUninit::new(0); buf_size],
            len: 0,
            from: None,
        }
    }

    /// One datagram per call here anyway.
    pub fn set_limit(&mut self, _limit: usize) {}

    /// One datagram per call here.
    pub fn limit(&self) -> usize {
        1
    }

    pub fn recv_one(&mut self, socket: &Socket) -> io::Result<usize> {
        self.recv(socket)
    }

    /// Non-blocking receive is not offered here: always WouldBlock, so
    /// callers fall through to a blocking receive.
    pub fn try_recv(&mut self, _socket: &Socket) -> io::Result<usize> {
        Err(io::ErrorKind::WouldBlock.into())
    }

    pub fn recv(&mut self, socket: &Socket) -> io::Result<usize> {
        let (len, addr) = socket.recv_from(&mut self.buf)?;
        self.len = len;
        self.from = addr.as_socket();
        Ok(1)
    }

    pub fn datagram(&self, i: usize) -> Received<'_> {
        debug_assert_eq!(i, 0);
        // SAFETY: the whole buffer was initialised with zeros at creation
        // and `len <= buf.len()` (recv_from never reports more than it got).
        let bytes: &[u8] =
            unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast(), self.len) };
        Received {
            data: bytes,
            from: self.from,
            kernel_drops: None,
            // socket2's recv_from does not report MSG_TRUNC here.
            truncated: false,
            local: None,
            segment_size: None,
            rx_time_ns: None,
            ttl: None,
        }
    }

    /// The datagram, to be rewritten in place and answered by
    /// [`ReplyBatch`].
    pub fn datagram_mut(&mut self, i: usize) -> &mut [u8] {
        debug_assert_eq!(i, 0);
        // SAFETY: as in `datagram`: initialised, and `len <= buf.len()`.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast(), self.len) }
    }
}

/// Not offered here: answers carry TTL 0, "unknown".
pub fn enable_rx_ttl(_socket: &Socket) -> io::Result<()> {
    unsupported("IP_RECVTTL is read on Linux only")
}

/// Received datagrams carry no TTL here.
pub const RX_TTL: bool = false;

/// Answers from the receive buffer, one `send_to` each (no sendmmsg
/// here), from the address the OS picks.
pub struct ReplyBatch;

impl ReplyBatch {
    pub fn new(_batch: usize) -> Self {
        ReplyBatch
    }

    /// Sends each `(slot, length)` back to its sender, never longer than
    /// what arrived; returns how many went.
    pub fn send(
        &mut self,
        socket: &Socket,
        batch: &RecvBatch,
        answers: &[(usize, usize)],
        _from_local: bool,
    ) -> io::Result<usize> {
        let mut sent = 0;
        for &(slot, length) in answers {
            let datagram = batch.datagram(slot);
            let Some(to) = datagram.from else {
                sent += 1;
                continue;
            };
            let data = &datagram.data[..length.min(datagram.data.len())];
            match socket.send_to(data, &to.into()) {
                Ok(_) => sent += 1,
                Err(e) if sent == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(sent)
    }
}

/// The kernel's clock state is read on Linux only.
pub fn clock_status() -> Option<super::ClockStatus> {
    None
}

/// Per-thread CPU time is not available here.
pub fn rusage(_process: bool) -> Option<crate::stats::CpuTime> {
    None
}

/// Not available here: answers leave from the address the OS picks.
pub fn enable_local_address(_socket: &Socket) -> io::Result<()> {
    unsupported("IP_PKTINFO")
}

/// Sends `buf` to `to`; the source address is the OS's choice here.
pub fn send_from(
    socket: &Socket,
    buf: &[u8],
    to: std::net::SocketAddr,
    _from: Option<std::net::IpAddr>,
) -> io::Result<usize> {
    socket.send_to(buf, &to.into())
}

/// What the receive queue holds: only Linux says (SO_MEMINFO).
pub fn recv_buffer_held(_socket: &Socket) -> io::Result<u64> {
    unsupported("SO_MEMINFO is Linux-only")
}

/// The socket's drop counter: only Linux says (SO_MEMINFO).
pub fn kernel_drop_count(_socket: &Socket) -> io::Result<u32> {
    unsupported("SO_MEMINFO is Linux-only")
}

/// Not available here.
pub fn force_recv_buffer(_socket: &Socket, _bytes: usize) -> io::Result<()> {
    unsupported("SO_RCVBUFFORCE is Linux-only")
}

/// The sysctl that caps socket buffers on this platform.
#[cfg(target_os = "macos")]
pub const RCVBUF_SYSCTL: &str = "kern.ipc.maxsockbuf";
#[cfg(not(target_os = "macos"))]
pub const RCVBUF_SYSCTL: &str = "the OS socket buffer limit";
pub const SNDBUF_SYSCTL: &str = RCVBUF_SYSCTL;
pub const RCVBUF_DOUBLES: bool = false;
/// No kernel receive times here: datagrams are timed when read.
pub const RX_TIMESTAMPS: bool = false;

/// Not available here.
pub fn force_send_buffer(_socket: &Socket, _bytes: usize) -> io::Result<()> {
    unsupported("SO_SNDBUFFORCE is Linux-only")
}

/// Not available here: the server counts datagrams one by one.
pub fn enable_gro(_socket: &Socket) -> io::Result<()> {
    unsupported("UDP_GRO is Linux-only")
}

/// sched_setscheduler with these policies is Linux's; say so.
pub fn set_scheduler(_policy: super::SchedPolicy, _priority: i32) -> io::Result<()> {
    unsupported("this platform has no sched_setscheduler with these policies (Linux only)")
}

/// Not offered here; the caller reports it.
pub fn set_dont_fragment(_socket: &Socket, _ipv6: bool) -> io::Result<()> {
    unsupported("--dont-fragment is implemented for Linux only")
}

/// TCP_CONGESTION is set on Linux only here; say so.
pub fn set_tcp_congestion(_socket: &Socket, _name: &str) -> io::Result<()> {
    unsupported(
        "choosing the congestion control per socket (TCP_CONGESTION) is implemented for Linux only",
    )
}

/// Unknown here.
pub fn default_tcp_congestion() -> Option<String> {
    None
}

/// Unknown here.
pub fn available_tcp_congestion() -> Option<String> {
    None
}

/// Not offered here: datagrams are timed when read.
pub fn enable_rx_timestamps(_socket: &Socket) -> io::Result<()> {
    unsupported("kernel receive timestamps are read on Linux only")
}

/// sendmmsg is Linux's: here a batch is never built (the client checks
/// [`super::LINUX_SOCKETS`] and sends one datagram per call), and a send
/// says so if it is.
pub struct SendBatch;

impl SendBatch {
    pub fn new(_batch: usize, _dest: Option<SocketAddr>) -> Self {
        SendBatch
    }

    pub fn set_source(&mut self, _source: Option<std::net::IpAddr>) {}

    pub fn set_gso_segment(&mut self, _segment: Option<u16>) {}

    pub fn capacity(&self) -> usize {
        1
    }

    pub fn send(&mut self, _socket: &Socket, _datagrams: &[&[u8]]) -> io::Result<usize> {
        unsupported("sendmmsg is Linux-only")
    }
}

/// UDP_SEGMENT is Linux's.
pub fn set_gso_segment(_socket: &Socket, _size: u16) -> io::Result<()> {
    unsupported("UDP GSO is Linux-only")
}

fn readiness_unsupported<T>() -> io::Result<T> {
    unsupported("select, poll and epoll receive loops are implemented for Linux only")
}

/// Linux's; the server refuses `--method select` here before it gets this
/// far.
pub fn select_readable<S: std::os::fd::AsFd>(
    _sockets: &[S],
    _timeout: std::time::Duration,
    _ready: &mut [bool],
) -> io::Result<usize> {
    readiness_unsupported()
}

/// Linux's, as [`select_readable`].
pub struct Epoll;

impl Epoll {
    pub fn new(_capacity: usize) -> io::Result<Self> {
        readiness_unsupported()
    }

    pub fn add<S: std::os::fd::AsFd>(&self, _socket: &S, _token: u64) -> io::Result<()> {
        readiness_unsupported()
    }

    pub fn wait(
        &mut self,
        _timeout: std::time::Duration,
        _ready: impl FnMut(u64),
    ) -> io::Result<usize> {
        readiness_unsupported()
    }
}

// ---- added for the proxy ----

/// splice(2) is Linux's.
pub const HAS_SPLICE: bool = false;

/// splice(2) is Linux's: a pipe cannot be made here, so a caller compiled
/// everywhere fails at run time with a clear error instead of needing a
/// `cfg`.
#[derive(Debug)]
pub struct SplicePipe {
    _none: (),
}

impl SplicePipe {
    fn unsupported() -> io::Error {
        io::Error::new(io::ErrorKind::Unsupported, "splice needs Linux")
    }

    pub fn new(_capacity: usize) -> io::Result<SplicePipe> {
        Err(Self::unsupported())
    }

    pub fn capacity(&self) -> usize {
        0
    }

    pub fn resize(&mut self, _capacity: usize) -> io::Result<usize> {
        Err(Self::unsupported())
    }

    pub fn fill_from(&self, _socket: &impl std::os::fd::AsFd, _len: usize) -> io::Result<usize> {
        Err(Self::unsupported())
    }

    pub fn drain_to(&self, _socket: &impl std::os::fd::AsFd, _len: usize) -> io::Result<usize> {
        Err(Self::unsupported())
    }
}

/// Pipes cannot be resized here.
pub fn pipe_max_size() -> Option<usize> {
    None
}

/// The errno values are not told apart here.
pub fn congestion_refusal(_err: &io::Error) -> super::CongestionRefusal {
    super::CongestionRefusal::Other
}

// ---- added for many clients in one process (udp_client -P N) ----

/// Receives one datagram if one is queued, without waiting: `WouldBlock`
/// when nothing is.
pub fn recv_from_nowait(
    socket: &std::net::UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, Option<SocketAddr>)> {
    let socket = socket2::SockRef::from(socket);
    // SAFETY: `u8` and `MaybeUninit<u8>` have the same layout, and
    // socket2 only writes initialised bytes into the buffer.
    let uninit = unsafe { &mut *(buf as *mut [u8] as *mut [MaybeUninit<u8>]) };
    let (n, from) = socket.recv_from_with_flags(uninit, libc::MSG_DONTWAIT)?;
    Ok((n, from.as_socket()))
}

/// No error queue here (no IP_RECVERR): nothing to drain.
pub fn drain_error_queue(_socket: &std::net::UdpSocket) -> usize {
    0
}

/// macOS has RLIMIT_NOFILE as Linux does (`sys/rlimit.rs`), and so does
/// Linux when this backend is built there (`--features portable`).
#[cfg(any(target_os = "macos", target_os = "linux"))]
pub use super::rlimit::{
    file_limit_ceiling, file_limits, open_files, raise_file_limit, raise_hard_file_limit,
};

/// Not read here: the caller goes ahead without raising it.
#[cfg(not(any(target_os = "macos", target_os = "linux")))]
pub fn file_limits() -> io::Result<(u64, u64)> {
    unsupported("RLIMIT_NOFILE is read on Linux and macOS only")
}

/// Not raised here.
#[cfg(not(any(target_os = "macos", target_os = "linux")))]
pub fn raise_file_limit() -> io::Result<u64> {
    unsupported("RLIMIT_NOFILE is raised on Linux and macOS only")
}

/// Not raised here.
#[cfg(not(any(target_os = "macos", target_os = "linux")))]
pub fn raise_hard_file_limit(_to: u64) -> io::Result<u64> {
    unsupported("RLIMIT_NOFILE is raised on Linux and macOS only")
}

/// Not known here.
#[cfg(not(any(target_os = "macos", target_os = "linux")))]
pub fn file_limit_ceiling() -> Option<u64> {
    None
}

/// Not counted here.
#[cfg(not(any(target_os = "macos", target_os = "linux")))]
pub fn open_files() -> io::Result<u64> {
    unsupported("open files are counted on Linux and macOS only")
}

/// The egress device: not available on this platform.
pub fn egress_device(_dest: std::net::IpAddr) -> io::Result<super::EgressDevice> {
    unsupported("the egress device of a route is not available on this platform")
}

/// Qdisc counters: not available on this platform.
pub fn root_qdisc(_ifindex: u32) -> io::Result<Option<super::QdiscStats>> {
    unsupported("qdisc counters are not available on this platform")
}

/// UDP SndbufErrors: not available on this platform.
pub fn udp_sndbuf_errors() -> io::Result<u64> {
    unsupported("UDP SndbufErrors are not available on this platform")
}

/// Scheduler times: not available on this platform.
pub fn thread_sched() -> Option<(std::time::Duration, std::time::Duration)> {
    None
}
