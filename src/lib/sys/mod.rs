//! Every platform syscall that socket2 and std do not cover, behind one safe
//! API. This is the only module that may use `unsafe`.
//!
//! Why one module: unsafe code is easiest to review when it is small, local
//! and in one place (quinn-udp's layout). The backend is chosen once at
//! compile time: `linux.rs` uses recvmmsg, SO_RXQ_OVFL and IP_RECVERR;
//! `fallback.rs` does one `recv_from` per datagram and says what it lacks.
//! The `portable` feature builds `fallback.rs` on Linux too, so that the
//! backend macOS and the BSDs use is compiled and tested where CI runs.

use std::io;

#[cfg(all(target_os = "linux", not(feature = "portable")))]
#[path = "linux.rs"]
mod imp;

#[cfg(any(not(target_os = "linux"), feature = "portable"))]
#[path = "fallback.rs"]
mod imp;

/// RLIMIT_NOFILE: read, raised, and the files open counted.
#[cfg(any(target_os = "linux", target_os = "macos"))]
mod rlimit;

/// splice(2) through a pipe: the zero-copy proxy path.
#[cfg(all(target_os = "linux", not(feature = "portable")))]
pub mod splice;

pub use imp::{
    available_tcp_congestion, default_tcp_congestion, enable_gro, enable_kernel_drop_counter,
    enable_local_address, enable_rx_timestamps, enable_send_errors, force_recv_buffer,
    force_send_buffer, kernel_drop_count, recv_buffer_held, send_from, set_dont_fragment,
    set_gso_segment, set_tcp_congestion, RecvBatch, SendBatch, RCVBUF_DOUBLES, RCVBUF_SYSCTL,
    RX_TIMESTAMPS, SNDBUF_SYSCTL,
};
pub use imp::{clock_status, enable_rx_ttl, ReplyBatch, RX_TTL};
pub use imp::{drain_error_queue, recv_from_nowait};
pub use imp::{egress_device, root_qdisc, udp_sndbuf_errors};
#[cfg(all(target_os = "linux", not(feature = "portable")))]
pub use imp::{parse_control, ControlInfo};
pub use imp::{select_readable, Epoll};
pub use poll::poll_readable;

mod poll;

/// What a socket, or a pipe's end, is to the calls here that take one: a
/// file descriptor the caller keeps open for the call. Callers pass their
/// sockets as they are (`&TcpStream`, `&UdpSocket`, socket2's `Socket`);
/// only this module names the Unix type behind it.
pub use std::os::fd::AsFd as Descriptor;

/// Whether a read of `socket` would return at once: bytes or the EOF are
/// queued (a peek that neither waits nor consumes).
pub fn read_would_return(socket: &std::net::TcpStream) -> io::Result<bool> {
    let mut probe = [std::mem::MaybeUninit::<u8>::uninit()];
    loop {
        let peek = socket2::SockRef::from(socket)
            .recv_with_flags(&mut probe, libc::MSG_PEEK | libc::MSG_DONTWAIT);
        return match peek {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => Err(e),
        };
    }
}

/// The process's budget of open files (RLIMIT_NOFILE), for a run that
/// opens many sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileBudget {
    /// The soft limit, after raising it.
    pub soft: u64,
    /// The hard limit: the most the soft limit may be raised to.
    pub hard: u64,
    /// Files open now.
    pub open: u64,
}

/// Makes room for `more` files beyond those open now: raises the soft
/// RLIMIT_NOFILE to the hard limit when the soft one is too low, and says
/// what the budget then is (the caller decides whether `more` fits).
/// `Unsupported` where the platform does not tell.
pub fn make_room_for_files(more: u64) -> io::Result<FileBudget> {
    let open = imp::open_files()?;
    let (mut soft, hard) = imp::file_limits()?;
    if open.saturating_add(more) > soft && hard > soft {
        soft = imp::raise_file_limit()?;
    }
    Ok(FileBudget { soft, hard, open })
}

/// Raises the soft RLIMIT_NOFILE to the hard limit, as a server that may
/// hold thousands of sockets should (Go's runtime, nginx and HAProxy do
/// the same), and says what the budget was before and is now. A failure
/// to raise it is not an error: the budget then says what it still is.
/// `Unsupported` where the platform does not tell (neither Linux nor
/// macOS).
pub fn raise_files_to_hard_limit() -> io::Result<(u64, FileBudget)> {
    let (before, hard) = imp::file_limits()?;
    let soft = if hard > before {
        imp::raise_file_limit().unwrap_or(before)
    } else {
        before
    };
    let open = imp::open_files()?;
    Ok((before, FileBudget { soft, hard, open }))
}

/// Raises the hard RLIMIT_NOFILE (and the soft one with it) to `to`, or
/// to the system's ceiling (/proc/sys/fs/nr_open) if that is lower, and
/// returns what it is now. Needs privilege (CAP_SYS_RESOURCE on Linux):
/// without it, `EPERM`, and the limits stay as they were.
pub fn raise_hard_file_limit(to: u64) -> io::Result<u64> {
    let to = imp::file_limit_ceiling().map_or(to, |ceiling| to.min(ceiling));
    imp::raise_hard_file_limit(to)
}

/// Whether an error is the process's (EMFILE) or the system's (ENFILE)
/// table of open files being full: a local limit, not the peer's doing.
pub fn is_out_of_files(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// Whether an error means the peer reset or abandoned the connection
/// (ECONNRESET, EPIPE, ECONNABORTED): how many programs end a TCP
/// connection, not a failure of whoever relays it.
pub fn is_reset(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
    )
}

/// One received datagram.
pub struct Received<'a> {
    pub data: &'a [u8],
    /// The sender; None only for an address family we do not know.
    pub from: Option<std::net::SocketAddr>,
    /// The socket's drop counter (receive buffer full) when this datagram
    /// was queued, as the kernel keeps it: a u32 that wraps. None where the
    /// platform cannot tell.
    pub kernel_drops: Option<u32>,
    /// The kernel cut the datagram (or GRO buffer) to fit the receive
    /// buffer (MSG_TRUNC): `data` is shorter than what arrived.
    pub truncated: bool,
    /// With UDP_GRO: `data` holds several datagrams of this size (the last
    /// may be shorter), coalesced by the kernel.
    pub segment_size: Option<usize>,
    /// When the kernel received it (CLOCK_REALTIME, ns), if known.
    pub rx_time_ns: Option<u64>,
    /// The address it was sent to (one of ours), when asked for.
    pub local: Option<std::net::IpAddr>,
    /// The IP TTL or IPv6 hop limit it arrived with, when asked for
    /// ([`enable_rx_ttl`]) and the platform tells.
    pub ttl: Option<u8>,
}

/// What the kernel says of the system clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockStatus {
    /// The kernel's clock discipline is synchronised (an NTP daemon
    /// steers it). Not proof of an external source: STAMP's S bit is
    /// the user's to claim.
    pub kernel_synchronized: bool,
    /// The kernel's bound on the clock's error, in ns (it grows by
    /// 500 ppm while unsynchronised, up to 16 s).
    pub max_error_ns: u64,
}

pub use crate::stats::CpuTime;

/// The device datagrams to a destination leave by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressDevice {
    pub ifindex: u32,
    /// `eth0`, `veth1`, `lo`, ...
    pub name: String,
    /// Its MTU (bytes of IP packet), when the kernel tells.
    pub mtu: Option<u32>,
}

/// A device's root qdisc and its counters, as the kernel keeps them since
/// the qdisc was created. They count **all** the device's traffic, not one
/// socket's: take the growth over a run, and say it is device-wide.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QdiscStats {
    pub ifindex: u32,
    /// `tbf`, `pfifo_fast`, `noqueue`, `mq`, ...
    pub kind: String,
    /// Packets and bytes it sent (a GSO buffer counts as its segments).
    pub packets: u64,
    pub bytes: u64,
    /// Packets it dropped, in its own unit: each skb it refused (a GSO
    /// buffer it did not cut counts once; tbf cuts a buffer larger than its
    /// burst and counts each segment it drops). A u32 that wraps.
    pub drops: u32,
    /// Times it held a packet back over its rate (tbf: the bucket was
    /// empty). Wraps like `drops`.
    pub overlimits: u32,
    /// Packets the device handed back to it (busy driver).
    pub requeues: u32,
    /// Packets and bytes queued in it now.
    pub qlen: u32,
    pub backlog_bytes: u32,
    /// tbf's parameters, when it is one.
    pub tbf: Option<TbfParams>,
}

/// What a tbf qdisc was configured with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TbfParams {
    pub rate_bytes_per_s: u64,
    /// The bucket's depth: a packet (a GSO buffer) larger than this is cut
    /// into its segments, or dropped when it has none.
    pub burst_bytes: u64,
    /// Bytes it may queue before it drops.
    pub limit_bytes: u32,
}

/// The calling thread's time on a CPU and its time waiting on a run queue
/// so far (Linux's schedstat), or None where the platform cannot tell.
pub fn thread_sched() -> Option<(std::time::Duration, std::time::Duration)> {
    imp::thread_sched()
}

/// The CPU time of the calling thread so far (getrusage RUSAGE_THREAD), or
/// None where the platform cannot tell.
pub fn thread_cpu() -> Option<CpuTime> {
    imp::rusage(false)
}

/// The CPU time of the whole process so far (getrusage RUSAGE_SELF).
pub fn process_cpu() -> Option<CpuTime> {
    imp::rusage(true)
}

/// Scheduling policies (sched(7)), as seed 002's `-S` offered them. (The
/// flag that names them is in `config`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SchedPolicy {
    Other,
    Batch,
    Idle,
    Fifo,
    Rr,
}

impl SchedPolicy {
    pub const ALL: [SchedPolicy; 5] = [
        SchedPolicy::Other,
        SchedPolicy::Batch,
        SchedPolicy::Idle,
        SchedPolicy::Fifo,
        SchedPolicy::Rr,
    ];

    /// The name sched(7) and the flags use: `other`, `fifo`, ...
    pub fn name(self) -> &'static str {
        match self {
            SchedPolicy::Other => "other",
            SchedPolicy::Batch => "batch",
            SchedPolicy::Idle => "idle",
            SchedPolicy::Fifo => "fifo",
            SchedPolicy::Rr => "rr",
        }
    }

    /// The priorities the policy accepts.
    pub fn priority_range(self) -> std::ops::RangeInclusive<i32> {
        match self {
            SchedPolicy::Fifo | SchedPolicy::Rr => 1..=99,
            _ => 0..=0,
        }
    }
}

/// The kernel's release (`uname -r`), where the platform tells it without
/// a system call of its own: Linux's /proc. None elsewhere.
pub fn kernel_release() -> Option<String> {
    if !LINUX_SOCKETS {
        return None;
    }
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Applies a scheduling policy to the calling thread (threads it starts
/// later inherit it), with an error that says what grants the right. The
/// priority is the caller's to check ([`SchedPolicy::priority_range`]).
pub fn apply_scheduler(policy: SchedPolicy, priority: i32) -> crate::error::Result<()> {
    use crate::error::Error;
    let name = policy.name();
    imp::set_scheduler(policy, priority).map_err(|e| {
        if e.raw_os_error() == Some(libc::EPERM) {
            Error::runtime(format!(
                "not permitted to use scheduler {name} with priority {priority}: run as root, grant CAP_SYS_NICE (setcap cap_sys_nice+ep BINARY), or raise the realtime limit (ulimit -r {priority})"
            ))
        } else {
            Error::io(format!("cannot set scheduler {name}"), e)
        }
    })
}

/// What kind of send failure this is, for the client's retry logic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendFailure {
    /// The local queue is full (ENOBUFS, or EAGAIN on a non-blocking
    /// socket): back off and send the same datagram again.
    QueueFull,
    /// An ICMP port unreachable came back (ECONNREFUSED): nothing listens.
    Refused,
    /// The datagram is larger than the OS or the path allows.
    TooBig,
    /// Interrupted by a signal: retry at once.
    Interrupted,
    /// Anything else: give up.
    Other,
}

/// Classifies a send error.
pub fn classify_send_error(err: &io::Error) -> SendFailure {
    if err.kind() == io::ErrorKind::Interrupted {
        return SendFailure::Interrupted;
    }
    if err.kind() == io::ErrorKind::WouldBlock {
        return SendFailure::QueueFull;
    }
    match err.raw_os_error() {
        Some(code) if code == libc::ENOBUFS || code == libc::EAGAIN => SendFailure::QueueFull,
        Some(code) if code == libc::ECONNREFUSED => SendFailure::Refused,
        Some(code) if code == libc::EMSGSIZE => SendFailure::TooBig,
        _ => SendFailure::Other,
    }
}

/// What the kernel granted for a socket buffer (SO_RCVBUF or SO_SNDBUF).
#[derive(Debug, Clone, serde::Serialize)]
pub struct BufferGrant {
    pub requested: Option<usize>,
    /// What getsockopt returns: on Linux twice the usable size.
    pub granted: usize,
    /// SO_RCVBUFFORCE / SO_SNDBUFFORCE was used to go past the sysctl limit.
    pub forced: bool,
    /// Set when the kernel gave less than asked: how to raise the limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// Which socket buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferSide {
    Receive,
    Send,
}

/// Asks for a `requested`-byte socket buffer (None: leave the default) and
/// reports what the kernel granted, going past the sysctl limit where the
/// process may (SO_*BUFFORCE). A refusal or a shortfall is not an error:
/// the grant says so, with how to raise the limit. Only failing to read the
/// size back is.
pub fn size_buffer(
    socket: &socket2::Socket,
    side: BufferSide,
    requested: Option<usize>,
) -> crate::error::Result<BufferGrant> {
    type Get = fn(&socket2::Socket) -> io::Result<usize>;
    type Set = fn(&socket2::Socket, usize) -> io::Result<()>;
    let (option, read, set, force): (_, Get, Set, Set) = match side {
        BufferSide::Receive => (
            "SO_RCVBUF",
            socket2::Socket::recv_buffer_size,
            socket2::Socket::set_recv_buffer_size,
            force_recv_buffer,
        ),
        BufferSide::Send => (
            "SO_SNDBUF",
            socket2::Socket::send_buffer_size,
            socket2::Socket::set_send_buffer_size,
            force_send_buffer,
        ),
    };
    let read =
        || read(socket).map_err(|e| crate::error::Error::io(format!("cannot read {option}"), e));
    let Some(want) = requested else {
        return Ok(BufferGrant {
            requested: None,
            granted: read()?,
            forced: false,
            warning: None,
        });
    };
    if let Err(e) = set(socket, want) {
        // BSD kernels refuse a size above kern.ipc.maxsockbuf outright
        // instead of capping it: keep the default and say why.
        let warning = match side {
            BufferSide::Receive => format!(
                "cannot set a {want}-byte receive buffer ({e}); raise the limit ({RCVBUF_SYSCTL}) or ask for less"
            ),
            BufferSide::Send => format!("cannot set SO_SNDBUF to {want}: {e}"),
        };
        return Ok(BufferGrant {
            requested: Some(want),
            granted: read()?,
            forced: false,
            warning: Some(warning),
        });
    }
    let full = if RCVBUF_DOUBLES {
        want.saturating_mul(2)
    } else {
        want
    };
    let mut granted = read()?;
    let mut forced = false;
    if granted < full && force(socket, want).is_ok() {
        granted = read()?;
        forced = true;
    }
    let warning = (granted < full).then(|| match side {
        BufferSide::Receive => format!(
            "asked for a {want}-byte receive buffer but the kernel granted {granted}; raise the limit with: sysctl -w {RCVBUF_SYSCTL}={want} (or run as root, which uses SO_RCVBUFFORCE)"
        ),
        BufferSide::Send => format!(
            "asked for a {want}-byte send buffer but the kernel granted {granted}; raise the limit with: sysctl -w {SNDBUF_SYSCTL}={want}"
        ),
    });
    Ok(BufferGrant {
        requested: Some(want),
        granted,
        forced,
        warning,
    })
}

/// The receive buffer a receiver asks for when the user did not choose one
/// (16 MiB; Linux doubles it to 32 MiB of accounting). The system default
/// (`net.core.rmem_default`, 208 KiB on Linux) holds about 40 datagrams of
/// 5000 bytes: one unpaced client's first millisecond overflows it, and
/// the loss looks like the network's. This holds about 1.3 ms at
/// 100 Gbit/s, or a 10 ms pause of the receive thread at 13 Gbit/s.
pub const DEFAULT_RECV_BUFFER: usize = 16 << 20;

/// The smallest request [`size_default_recv_buffer`] steps down to where
/// the OS refuses a larger one outright (BSD's `kern.ipc.maxsockbuf`).
const SMALLEST_DEFAULT_RECV_BUFFER: usize = 256 << 10;

/// A receiver's default buffer: asks for [`DEFAULT_RECV_BUFFER`], past the
/// sysctl limit where the process may (SO_RCVBUFFORCE), else takes what
/// the limit allows. When that is less, the grant's `warning` says so and
/// names the sysctl that raises it, for the caller to print once.
pub fn size_default_recv_buffer(socket: &socket2::Socket) -> crate::error::Result<BufferGrant> {
    // Linux caps a request at the limit; BSD refuses one above it, so
    // step down until one is taken. Then the one sizing path: set, read
    // back, force past the limit where the process may.
    let mut want = DEFAULT_RECV_BUFFER;
    while socket.set_recv_buffer_size(want).is_err() && want > SMALLEST_DEFAULT_RECV_BUFFER {
        want /= 2;
    }
    let mut grant = size_buffer(socket, BufferSide::Receive, Some(want))?;
    let full = if RCVBUF_DOUBLES {
        DEFAULT_RECV_BUFFER * 2
    } else {
        DEFAULT_RECV_BUFFER
    };
    // The user asked for nothing: the warning speaks of the default.
    grant.warning = (grant.granted < full).then(|| {
        format!(
            "receive buffer {} bytes: {RCVBUF_SYSCTL} allows no more than that of the {DEFAULT_RECV_BUFFER} bytes asked for by default, and an unpaced burst from several clients can overflow it; raise the limit with: sysctl -w {RCVBUF_SYSCTL}={DEFAULT_RECV_BUFFER} (or run as root, which uses SO_RCVBUFFORCE)",
            grant.granted
        )
    });
    Ok(grant)
}

/// `::ffff:1.2.3.4` (a v4 peer on a dual-stack socket) as `1.2.3.4`: the
/// same peer whichever socket family it reached.
pub fn canonical_addr(addr: std::net::SocketAddr) -> std::net::SocketAddr {
    std::net::SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// Why the kernel refused a UDP GSO send (nothing was sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GsoRefusal {
    /// EINVAL: too many segments for this kernel, or UDP_SEGMENT refused.
    Invalid,
    /// EIO: the outgoing device cannot checksum GSO buffers.
    NoChecksum,
    /// EMSGSIZE: a segment plus its headers exceeds the path MTU.
    TooBig,
}

/// Whether a send error is the kernel refusing a GSO buffer, and why.
pub fn gso_refusal(err: &io::Error) -> Option<GsoRefusal> {
    match err.raw_os_error() {
        Some(libc::EINVAL) => Some(GsoRefusal::Invalid),
        Some(libc::EIO) => Some(GsoRefusal::NoChecksum),
        Some(libc::EMSGSIZE) => Some(GsoRefusal::TooBig),
        _ => None,
    }
}

/// ECONNREFUSED: an ICMP port unreachable came back for something we sent.
pub fn is_refused(err: &io::Error) -> bool {
    err.raw_os_error() == Some(libc::ECONNREFUSED)
}

/// The operating systems whose limits netspeed explains by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Os {
    Linux,
    MacOs,
    Other,
}

/// The one this build is for.
pub const OS: Os = if cfg!(target_os = "linux") {
    Os::Linux
} else if cfg!(target_os = "macos") {
    Os::MacOs
} else {
    Os::Other
};

/// Whether this build has the Linux socket API netspeed uses: select,
/// poll, epoll, recvmmsg/sendmmsg, UDP_GRO/GSO, splice. Callers ask this
/// instead of testing the target themselves.
pub const LINUX_SOCKETS: bool = cfg!(all(target_os = "linux", not(feature = "portable")));

/// SO_REUSEPORT on `socket`, so several receive sockets share one address
/// (`udp_server --threads N`); an error naming the platform where it has
/// none.
pub fn set_reuse_port(socket: &socket2::Socket) -> io::Result<()> {
    #[cfg(unix)]
    return socket.set_reuse_port(true);
    #[cfg(not(unix))]
    {
        let _ = socket;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "SO_REUSEPORT is not available on this platform: use --threads 1",
        ))
    }
}

/// The largest UDP payload one datagram to `addr` can carry (by the IP
/// header's length field; the OS or the path may allow less).
pub fn max_udp_payload(addr: &std::net::SocketAddr) -> usize {
    if addr.is_ipv4() {
        MAX_UDP_PAYLOAD_V4
    } else {
        MAX_UDP_PAYLOAD_V6
    }
}

/// Largest UDP payload for one datagram (65535 minus the IP and UDP headers).
pub const MAX_UDP_PAYLOAD_V4: usize = 65507;
/// Largest UDP payload over IPv6 without jumbograms (65535 minus the UDP header).
pub const MAX_UDP_PAYLOAD_V6: usize = 65527;

// ---- added for the proxy ----

/// Why the kernel refused a congestion control algorithm on a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CongestionRefusal {
    /// The kernel has no algorithm of that name loaded (ENOENT).
    NotLoaded,
    /// It is loaded, but not allowed for an unprivileged process (EPERM).
    NotAllowed,
    /// Anything else, or a platform that does not tell.
    Other,
}

pub use imp::{congestion_refusal, pipe_max_size, SplicePipe, HAS_SPLICE};

// ---- added for sockbench ----

/// Errors that mean "try again" to a benchmark loop: a receive or send
/// timeout, a full queue, a signal ([`classify_send_error`] plus timeouts).
pub fn is_transient(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::TimedOut
        || matches!(
            classify_send_error(e),
            SendFailure::QueueFull | SendFailure::Interrupted
        )
}
