//! Linux backend: recvmmsg batches with SO_RXQ_OVFL drop counts and UDP_GRO
//! segment sizes read from control messages; IP_RECVERR so that local queue
//! drops surface as ENOBUFS.

use socket2::Socket;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;

use super::Received;

#[path = "linux_process.rs"]
mod process;
pub use super::rlimit::{
    file_limit_ceiling, file_limits, open_files, raise_file_limit, raise_hard_file_limit,
};
pub use process::{rusage, set_scheduler};

#[path = "linux_qdisc.rs"]
mod qdisc;
pub use qdisc::{egress_device, root_qdisc, thread_sched, udp_sndbuf_errors};

#[path = "linux_reply.rs"]
mod reply;
pub use reply::{clock_status, enable_rx_ttl, ReplyBatch};

#[path = "linux_meminfo.rs"]
mod meminfo;
pub use meminfo::{kernel_drop_count, recv_buffer_held};

fn setsockopt_int(
    socket: &Socket,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `value` lives across the call and its size is passed exactly;
    // the fd is owned by `socket` and open.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets IP_RECVERR (and IPV6_RECVERR on IPv6 sockets) so that a datagram
/// dropped by a full local queue (qdisc, device) makes `send` fail with
/// ENOBUFS instead of vanishing. Returns true when it took effect.
pub fn enable_send_errors(socket: &Socket) -> io::Result<bool> {
    let domain = socket.local_addr()?.as_socket().map(|a| a.is_ipv6());
    // On a dual-stack IPv6 socket the IPv4 option matters too.
    let v4 = setsockopt_int(socket, libc::IPPROTO_IP, libc::IP_RECVERR, 1);
    if domain == Some(true) {
        setsockopt_int(socket, libc::IPPROTO_IPV6, libc::IPV6_RECVERR, 1)?;
        return Ok(true);
    }
    v4.map(|()| true)
}

/// Turns on SO_RXQ_OVFL: every received datagram then carries the number of
/// datagrams the kernel dropped on this socket because its buffer was full.
pub fn enable_kernel_drop_counter(socket: &Socket) -> io::Result<bool> {
    setsockopt_int(socket, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1).map(|()| true)
}

/// Room for the control messages we ask for: SO_RXQ_OVFL (u32), UDP_GRO
/// (int), SO_TIMESTAMPNS (timespec), IP_PKTINFO or IPV6_PKTINFO, and
/// IP_TTL or IPV6_HOPLIMIT (int), with headers and alignment (24 + 24 +
/// 32 + 40 + 24), plus slack.
const CONTROL_LEN: usize = 192;

/// Buffers for one recvmmsg call, allocated once per socket and reused, so
/// that the hot path never allocates.
pub struct RecvBatch {
    buf_size: usize,
    buffers: Vec<u8>,
    addrs: Vec<libc::sockaddr_storage>,
    iovecs: Vec<libc::iovec>,
    /// u64 elements keep the control buffers aligned for cmsghdr.
    controls: Vec<[u64; CONTROL_LEN / 8]>,
    headers: Vec<libc::mmsghdr>,
    /// Per datagram: the socket's drop counter when it was queued.
    drops: Vec<u32>,
    /// Per datagram: the GRO segment size, when the kernel coalesced.
    segments: Vec<u32>,
    /// Per datagram: the kernel's receive time (CLOCK_REALTIME ns), or 0.
    stamps: Vec<u64>,
    /// Per datagram: its IP TTL or hop limit, if asked for, or 0.
    ttls: Vec<u8>,
    /// Per datagram: MSG_TRUNC was set.
    truncated: Vec<bool>,
    /// Per datagram: the address it was sent to (IP_PKTINFO), if asked for.
    locals: Vec<Option<IpAddr>>,
    /// Datagrams per recvmmsg call, at most the number of slots.
    limit: usize,
    filled: usize,
}

impl RecvBatch {
    /// `batch` datagrams of up to `buf_size` bytes per call.
    pub fn new(batch: usize, buf_size: usize) -> Self {
        let batch = batch.max(1);
        let mut this = RecvBatch {
            buf_size,
            buffers: vec![0u8; batch * buf_size],
            // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
            addrs: vec![unsafe { zeroed() }; batch],
            iovecs: Vec::with_capacity(batch),
            controls: vec![[0u64; CONTROL_LEN / 8]; batch],
            headers: Vec::with_capacity(batch),
            drops: vec![0; batch],
            segments: vec![0; batch],
            stamps: vec![0; batch],
            ttls: vec![0; batch],
            truncated: vec![false; batch],
            locals: vec![None; batch],
            limit: batch,
            filled: 0,
        };
        for i in 0..batch {
            this.iovecs.push(libc::iovec {
                iov_base: this.buffers[i * buf_size..].as_mut_ptr().cast(),
                iov_len: buf_size,
            });
        }
        for i in 0..batch {
            // SAFETY: mmsghdr is plain old data; all-zero is a valid value
            // that we then fill in field by field.
            let mut header: libc::mmsghdr = unsafe { zeroed() };
            header.msg_hdr.msg_name = (&mut this.addrs[i] as *mut libc::sockaddr_storage).cast();
            header.msg_hdr.msg_iov = &mut this.iovecs[i];
            header.msg_hdr.msg_iovlen = 1;
            header.msg_hdr.msg_control = this.controls[i].as_mut_ptr().cast();
            this.headers.push(header);
        }
        this
    }

    /// Blocks until at least one datagram is there (or the socket's receive
    /// timeout passes), then takes as many as are queued, up to the batch
    /// size. Returns how many were received.
    pub fn recv(&mut self, socket: &Socket) -> io::Result<usize> {
        self.recv_mmsg(socket, libc::MSG_WAITFORONE)
    }

    /// Like [`Self::recv`], but returns WouldBlock at once when nothing is
    /// queued (MSG_DONTWAIT), for polling before going to sleep.
    pub fn try_recv(&mut self, socket: &Socket) -> io::Result<usize> {
        self.recv_mmsg(socket, libc::MSG_DONTWAIT)
    }

    /// Datagrams per call now.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Receives at most `limit` datagrams per call from now on (at least
    /// 1, at most the batch size given to `new`).
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit.clamp(1, self.headers.len());
    }

    fn recv_mmsg(&mut self, socket: &Socket, flags: libc::c_int) -> io::Result<usize> {
        self.reset_headers(self.limit);
        // SAFETY: every pointer in `headers` points into buffers owned by
        // `self` that are neither moved nor resized after `new` (the Vecs
        // are never pushed to again), and each length matches its buffer.
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                self.headers.as_mut_ptr(),
                self.limit as libc::c_uint,
                flags,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            self.filled = 0;
            return Err(io::Error::last_os_error());
        }
        self.filled = n as usize;
        self.read_controls();
        Ok(self.filled)
    }

    /// Receives one datagram with recvmsg (the `thread`, `select`, `poll`,
    /// `epoll` and `tokio` methods), into slot 0. Returns 1, or an error
    /// (WouldBlock on a non-blocking socket with nothing queued).
    pub fn recv_one(&mut self, socket: &Socket) -> io::Result<usize> {
        self.reset_headers(1);
        // SAFETY: as in `recv`: slot 0's pointers are valid and sized.
        let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut self.headers[0].msg_hdr, 0) };
        if n < 0 {
            self.filled = 0;
            return Err(io::Error::last_os_error());
        }
        self.headers[0].msg_len = n as libc::c_uint;
        self.filled = 1;
        self.read_controls();
        Ok(1)
    }

    fn reset_headers(&mut self, count: usize) {
        for header in &mut self.headers[..count] {
            header.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            header.msg_hdr.msg_controllen = CONTROL_LEN as _;
            header.msg_hdr.msg_flags = 0;
            header.msg_len = 0;
        }
    }

    fn read_controls(&mut self) {
        for i in 0..self.filled {
            // msg_controllen is usize on glibc but u32 on musl.
            #[allow(clippy::unnecessary_cast)]
            let len = (self.headers[i].msg_hdr.msg_controllen as usize).min(CONTROL_LEN);
            // SAFETY: the control buffer is CONTROL_LEN bytes of u64s that
            // we own; viewing its first `len` bytes as u8 is always valid.
            let bytes =
                unsafe { std::slice::from_raw_parts(self.controls[i].as_ptr().cast::<u8>(), len) };
            let info = parse_control(bytes);
            // Linux attaches the drop counter only once it is non-zero.
            self.drops[i] = info.kernel_drops.unwrap_or(0);
            self.truncated[i] = self.headers[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            self.locals[i] = info.local;
            self.segments[i] = info.segment_size.unwrap_or(0);
            self.stamps[i] = info.rx_time_ns.unwrap_or(0);
            self.ttls[i] = info.ttl.unwrap_or(0);
        }
    }

    /// Datagram `i` of the last batch, to be rewritten in place (an
    /// answer sent back from the same buffer by [`ReplyBatch`]).
    pub fn datagram_mut(&mut self, i: usize) -> &mut [u8] {
        let len = (self.headers[i].msg_len as usize).min(self.buf_size);
        let start = i * self.buf_size;
        &mut self.buffers[start..start + len]
    }

    /// Datagram `i` of the last batch, who sent it, and how many datagrams
    /// the kernel had dropped on this socket when it was queued.
    pub fn datagram(&self, i: usize) -> Received<'_> {
        let header = &self.headers[i];
        let len = (header.msg_len as usize).min(self.buf_size);
        let start = i * self.buf_size;
        Received {
            data: &self.buffers[start..start + len],
            from: sockaddr_to_std(&self.addrs[i], header.msg_hdr.msg_namelen),
            kernel_drops: Some(self.drops[i]),
            truncated: self.truncated[i],
            local: self.locals[i],
            segment_size: match self.segments[i] {
                0 => None,
                n => Some(n as usize),
            },
            rx_time_ns: match self.stamps[i] {
                0 => None,
                t => Some(t),
            },
            ttl: match self.ttls[i] {
                0 => None,
                t => Some(t),
            },
        }
    }
}

fn sockaddr_to_std(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    match storage.ss_family as libc::c_int {
        libc::AF_INET if len as usize >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says this storage holds a sockaddr_in, and
            // sockaddr_storage is large and aligned enough for it.
            let sin =
                unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe {
                &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// SO_RCVBUFFORCE: like SO_RCVBUF but ignores `net.core.rmem_max`. Needs
/// CAP_NET_ADMIN; fails with EPERM otherwise.
pub fn force_recv_buffer(socket: &Socket, bytes: usize) -> io::Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    setsockopt_int(socket, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, value)
}

/// The sysctl that caps SO_RCVBUF on this platform.
pub const RCVBUF_SYSCTL: &str = "net.core.rmem_max";
/// The sysctl that caps SO_SNDBUF.
pub const SNDBUF_SYSCTL: &str = "net.core.wmem_max";
/// The kernel doubles the requested buffer to leave room for bookkeeping.
pub const RCVBUF_DOUBLES: bool = true;
/// Received datagrams carry the kernel's receive time
/// ([`enable_rx_timestamps`]).
pub const RX_TIMESTAMPS: bool = true;
/// Received datagrams carry their TTL or hop limit ([`enable_rx_ttl`]).
pub const RX_TTL: bool = true;

/// Turns on UDP_GRO: the kernel may hand us several datagrams of one flow
/// coalesced into one buffer, with their size in a control message.
pub fn enable_gro(socket: &Socket) -> io::Result<()> {
    setsockopt_int(socket, libc::SOL_UDP, libc::UDP_GRO, 1)
}

/// Sets UDP_SEGMENT (GSO) on the socket: every send larger than `size` is
/// cut by the kernel into `size`-byte datagrams. 0 turns it off. Set on the
/// socket, not per call, to keep the connected-socket fast path.
pub fn set_gso_segment(socket: &Socket, size: u16) -> io::Result<()> {
    setsockopt_int(
        socket,
        libc::SOL_UDP,
        libc::UDP_SEGMENT,
        libc::c_int::from(size),
    )
}

/// SO_SNDBUFFORCE: like SO_SNDBUF but past `net.core.wmem_max`; needs
/// CAP_NET_ADMIN.
pub fn force_send_buffer(socket: &Socket, bytes: usize) -> io::Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    setsockopt_int(socket, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, value)
}

/// TCP_CONGESTION (tcp(7)): the congestion control algorithm of one TCP
/// socket, by name ("cubic", "bbr", "reno", ...). ENOENT: the kernel has no
/// such algorithm; EPERM: it is not in net.ipv4.tcp_allowed_congestion_control
/// and the caller lacks CAP_NET_ADMIN.
pub fn set_tcp_congestion(socket: &Socket, name: &str) -> io::Result<()> {
    socket.set_tcp_congestion(name.as_bytes())
}

/// The algorithm new TCP sockets get (net.ipv4.tcp_congestion_control).
pub fn default_tcp_congestion() -> Option<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .ok()
        .map(|s| s.trim().to_string())
}

/// The algorithms this kernel can give a socket, as the sysctl lists them.
pub fn available_tcp_congestion() -> Option<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .ok()
        .map(|s| s.trim().to_string())
}

/// Sends many datagrams per sendmmsg call. Reused across calls so that
/// the hot path does not allocate.
pub struct SendBatch {
    headers: Vec<libc::mmsghdr>,
    iovecs: Vec<libc::iovec>,
    dest: Option<socket2::SockAddr>,
    /// Control messages every datagram of a call carries (the source
    /// address, UDP_SEGMENT), laid out once; u64 keeps them aligned.
    control: [u64; CONTROL_WORDS],
    control_len: usize,
    /// What `control` holds, so it can be rebuilt when one part changes.
    source: Option<IpAddr>,
    gso_segment: Option<u16>,
}

/// Room for one in6_pktinfo and one UDP_SEGMENT (u16) control message,
/// with headers and alignment (40 + 24), plus slack.
const CONTROL_WORDS: usize = 12;

impl SendBatch {
    /// Up to `batch` datagrams per call, to `dest` (None on a connected socket).
    pub fn new(batch: usize, dest: Option<SocketAddr>) -> Self {
        let batch = batch.max(1);
        SendBatch {
            // SAFETY: mmsghdr and iovec are plain old data; all-zero is valid.
            headers: vec![unsafe { zeroed() }; batch],
            iovecs: vec![unsafe { zeroed() }; batch],
            dest: dest.map(socket2::SockAddr::from),
            control: [0; CONTROL_WORDS],
            control_len: 0,
            source: None,
            gso_segment: None,
        }
    }

    /// Every datagram leaves from `source` (IP_PKTINFO / IPV6_PKTINFO):
    /// for a shared, unconnected socket bound to a wildcard address, the
    /// address the peer sent to.
    pub fn set_source(&mut self, source: Option<IpAddr>) {
        self.source = source;
        self.rebuild_control();
    }

    /// Every datagram larger than `segment` is cut by the kernel into
    /// `segment`-byte datagrams (a per-call UDP_SEGMENT control message):
    /// GSO on a socket shared with other senders, where the socket option
    /// would cut their datagrams too. None turns it off.
    pub fn set_gso_segment(&mut self, segment: Option<u16>) {
        self.gso_segment = segment;
        self.rebuild_control();
    }

    fn rebuild_control(&mut self) {
        let ipv6 = self
            .dest
            .as_ref()
            .and_then(|d| d.as_socket())
            .is_some_and(|d| d.is_ipv6());
        self.control = [0; CONTROL_WORDS];
        self.control_len = write_control(&mut self.control, self.source, ipv6, self.gso_segment);
    }

    pub fn capacity(&self) -> usize {
        self.headers.len()
    }

    /// Sends `datagrams` (at most `capacity()`) in one sendmmsg call.
    /// Returns how many the kernel took; the caller resends the rest.
    pub fn send(&mut self, socket: &Socket, datagrams: &[&[u8]]) -> io::Result<usize> {
        let count = datagrams.len().min(self.headers.len());
        let control: *mut libc::c_void = if self.control_len > 0 {
            self.control.as_mut_ptr().cast()
        } else {
            std::ptr::null_mut()
        };
        for (i, datagram) in datagrams[..count].iter().enumerate() {
            self.iovecs[i] = libc::iovec {
                iov_base: datagram.as_ptr() as *mut libc::c_void,
                iov_len: datagram.len(),
            };
            let header = &mut self.headers[i];
            header.msg_hdr.msg_iov = &mut self.iovecs[i];
            header.msg_hdr.msg_iovlen = 1;
            match &self.dest {
                Some(dest) => {
                    header.msg_hdr.msg_name = dest.as_ptr() as *mut libc::c_void;
                    header.msg_hdr.msg_namelen = dest.len();
                }
                None => {
                    header.msg_hdr.msg_name = std::ptr::null_mut();
                    header.msg_hdr.msg_namelen = 0;
                }
            }
            // Every message points at the same control bytes: the kernel
            // only reads them.
            header.msg_hdr.msg_control = control;
            header.msg_hdr.msg_controllen = self.control_len as _;
            header.msg_len = 0;
        }
        // SAFETY: the first `count` headers point at iovecs we own and at
        // `datagrams`, which the kernel only reads and which outlive the
        // call; the destination address and the control bytes are owned by
        // `self` and not moved during the call.
        let n = unsafe {
            libc::sendmmsg(
                socket.as_raw_fd(),
                self.headers.as_mut_ptr(),
                count as libc::c_uint,
                0,
            )
        };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

/// Lays out the control messages of a send in `control`: the source
/// address (IP_PKTINFO, or IPV6_PKTINFO when the destination is IPv6) and
/// the GSO segment size (UDP_SEGMENT), each when given. Returns the bytes
/// used (0 for none).
fn write_control(
    control: &mut [u64; CONTROL_WORDS],
    source: Option<IpAddr>,
    ipv6: bool,
    gso_segment: Option<u16>,
) -> usize {
    // SAFETY: msghdr is plain old data; all-zero is valid. It is used only
    // to walk `control` with the CMSG_* macros.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_control = control.as_mut_ptr().cast();
    let pktinfo_len = if ipv6 {
        size_of::<libc::in6_pktinfo>()
    } else {
        size_of::<libc::in_pktinfo>()
    };
    // SAFETY: CMSG_SPACE is arithmetic on a length.
    let space = |len: usize| unsafe { libc::CMSG_SPACE(len as u32) } as usize;
    let total = source.map_or(0, |_| space(pktinfo_len))
        + gso_segment.map_or(0, |_| space(size_of::<u16>()));
    assert!(
        total <= std::mem::size_of_val(control),
        "control buffer too small"
    );
    if total == 0 {
        return 0;
    }
    msg.msg_controllen = total as _;
    // SAFETY: msg_control points at `control`, which is at least `total`
    // bytes, zeroed and aligned for cmsghdr; CMSG_FIRSTHDR/CMSG_NXTHDR
    // stay within those bytes because `total` is the sum of the spaces of
    // the messages written, and each CMSG_DATA write is the message's own
    // length within its space.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        if let Some(from) = source {
            (*cmsg).cmsg_len = libc::CMSG_LEN(pktinfo_len as u32) as _;
            let data = libc::CMSG_DATA(cmsg);
            if ipv6 {
                (*cmsg).cmsg_level = libc::IPPROTO_IPV6;
                (*cmsg).cmsg_type = libc::IPV6_PKTINFO;
                let addr = match from {
                    IpAddr::V6(a) => a,
                    IpAddr::V4(a) => a.to_ipv6_mapped(),
                };
                let info = libc::in6_pktinfo {
                    ipi6_addr: libc::in6_addr {
                        s6_addr: addr.octets(),
                    },
                    ipi6_ifindex: 0,
                };
                std::ptr::write_unaligned(data.cast::<libc::in6_pktinfo>(), info);
            } else {
                (*cmsg).cmsg_level = libc::IPPROTO_IP;
                (*cmsg).cmsg_type = libc::IP_PKTINFO;
                let addr = match from {
                    IpAddr::V4(a) => a,
                    IpAddr::V6(a) => a.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED),
                };
                let info = libc::in_pktinfo {
                    ipi_ifindex: 0,
                    ipi_spec_dst: libc::in_addr {
                        s_addr: u32::from_ne_bytes(addr.octets()),
                    },
                    ipi_addr: libc::in_addr { s_addr: 0 },
                };
                std::ptr::write_unaligned(data.cast::<libc::in_pktinfo>(), info);
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if let Some(segment) = gso_segment {
            (*cmsg).cmsg_level = libc::SOL_UDP;
            (*cmsg).cmsg_type = libc::UDP_SEGMENT;
            (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), segment);
        }
    }
    total
}

/// Waits until one of `sockets` is readable, with select(2). Returns a
/// bit per socket (in `ready`), re-arming the fd set and timeout on every
/// call (seed 002 forgot to re-arm its timeout).
pub fn select_readable<S: std::os::fd::AsFd>(
    sockets: &[S],
    timeout: std::time::Duration,
    ready: &mut [bool],
) -> io::Result<usize> {
    let fds: Vec<std::os::fd::RawFd> = sockets.iter().map(|s| s.as_fd().as_raw_fd()).collect();
    // SAFETY: fd_set is plain old data; FD_ZERO/FD_SET only write inside it,
    // and every fd is checked against FD_SETSIZE first.
    unsafe {
        let mut set: libc::fd_set = zeroed();
        libc::FD_ZERO(&mut set);
        let mut max = -1;
        for &fd in &fds {
            if fd as usize >= libc::FD_SETSIZE {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "fd too large for select()",
                ));
            }
            libc::FD_SET(fd, &mut set);
            max = max.max(fd);
        }
        let mut tv = libc::timeval {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_usec: timeout.subsec_micros() as libc::suseconds_t,
        };
        let n = libc::select(
            max + 1,
            &mut set,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut tv,
        );
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        for (i, &fd) in fds.iter().enumerate() {
            ready[i] = libc::FD_ISSET(fd, &set);
        }
        Ok(n as usize)
    }
}

/// An epoll instance watching sockets for readability.
pub struct Epoll {
    fd: std::os::fd::OwnedFd,
    events: Vec<libc::epoll_event>,
}

impl Epoll {
    pub fn new(capacity: usize) -> io::Result<Self> {
        // SAFETY: plain syscall; the returned fd is checked and then owned.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(Epoll {
            fd,
            // SAFETY: epoll_event is plain old data.
            events: vec![unsafe { zeroed() }; capacity.max(1)],
        })
    }

    /// Watches `socket` for input, reporting it as `token`. The caller
    /// keeps it open while this epoll waits on it.
    pub fn add<S: std::os::fd::AsFd>(&self, socket: &S, token: u64) -> io::Result<()> {
        let fd = socket.as_fd().as_raw_fd();
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: `event` is valid for the call; both fds are open.
        let rc = unsafe {
            libc::epoll_ctl(
                std::os::fd::AsRawFd::as_raw_fd(&self.fd),
                libc::EPOLL_CTL_ADD,
                fd,
                &mut event,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits for readiness; calls `ready(token)` for each ready fd.
    pub fn wait(
        &mut self,
        timeout: std::time::Duration,
        mut ready: impl FnMut(u64),
    ) -> io::Result<usize> {
        // SAFETY: `events` has room for `len` entries the kernel may write.
        let n = unsafe {
            libc::epoll_wait(
                std::os::fd::AsRawFd::as_raw_fd(&self.fd),
                self.events.as_mut_ptr(),
                self.events.len() as libc::c_int,
                timeout.as_millis() as libc::c_int,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        for event in &self.events[..n as usize] {
            let token = event.u64;
            ready(token);
        }
        Ok(n as usize)
    }
}

/// Sets the don't-fragment option (IP_MTU_DISCOVER / IPV6_MTU_DISCOVER =
/// PMTUDISC_DO): a datagram larger than the path MTU then fails with
/// EMSGSIZE instead of being fragmented.
pub fn set_dont_fragment(socket: &Socket, ipv6: bool) -> io::Result<()> {
    if ipv6 {
        setsockopt_int(
            socket,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
    } else {
        setsockopt_int(
            socket,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    }
}

/// Asks for the address each datagram was sent to (IP_PKTINFO, and
/// IPV6_RECVPKTINFO on IPv6 sockets), so that an answer can leave from the
/// address the client sent to, also on a host with several addresses.
pub fn enable_local_address(socket: &Socket) -> io::Result<()> {
    let ipv6 = socket
        .local_addr()?
        .as_socket()
        .is_some_and(|a| a.is_ipv6());
    // On a dual-stack socket, IPv4 datagrams carry IP_PKTINFO.
    let v4 = setsockopt_int(socket, libc::IPPROTO_IP, libc::IP_PKTINFO, 1);
    if ipv6 {
        return setsockopt_int(socket, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1);
    }
    v4
}

/// Sends `buf` to `to` from the local address `from` (when given): the
/// source a client that checks where answers come from expects. `to` is as
/// received, so its family is the socket's.
pub fn send_from(
    socket: &Socket,
    buf: &[u8],
    to: SocketAddr,
    from: Option<IpAddr>,
) -> io::Result<usize> {
    if from.is_none() {
        return socket.send_to(buf, &to.into());
    }
    let dest = socket2::SockAddr::from(to);
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut control = [0u64; CONTROL_WORDS];
    let control_len = write_control(&mut control, from, to.is_ipv6(), None);
    // SAFETY: msghdr is plain old data; all-zero is valid, then filled in.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_name = dest.as_ptr() as *mut libc::c_void;
    msg.msg_namelen = dest.len();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control_len as _;
    // SAFETY: every pointer in `msg` points at a live local of the right
    // size: `dest`, `iov` (into `buf`) and `control`.
    let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, 0) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Turns on SO_TIMESTAMPNS: every datagram carries the time the kernel
/// received it, so rates and jitter do not depend on when we read it.
pub fn enable_rx_timestamps(socket: &Socket) -> io::Result<()> {
    setsockopt_int(socket, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)
}

/// What the control messages of one received datagram said.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ControlInfo {
    /// SO_RXQ_OVFL: the socket's drop counter (a u32 that wraps).
    pub kernel_drops: Option<u32>,
    /// UDP_GRO: the size of each coalesced datagram.
    pub segment_size: Option<u32>,
    /// SCM_TIMESTAMPNS: the kernel's receive time, CLOCK_REALTIME ns.
    pub rx_time_ns: Option<u64>,
    /// IP_PKTINFO / IPV6_PKTINFO: the address the datagram was sent to.
    pub local: Option<IpAddr>,
    /// IP_TTL / IPV6_HOPLIMIT: the TTL or hop limit it arrived with.
    pub ttl: Option<u8>,
}

const CMSG_HEADER: usize = size_of::<libc::cmsghdr>();

fn cmsg_align(len: usize) -> usize {
    let a = size_of::<usize>();
    len.div_ceil(a) * a
}

/// Walks a control-message buffer as the kernel lays it out (cmsghdr,
/// data, padding to the word size), in safe code: any bytes give an answer,
/// never a read out of bounds. Unknown messages are skipped.
pub fn parse_control(control: &[u8]) -> ControlInfo {
    let mut info = ControlInfo::default();
    let mut offset = 0;
    while offset + CMSG_HEADER <= control.len() {
        let header = &control[offset..offset + CMSG_HEADER];
        let mut word = [0u8; size_of::<usize>()];
        word.copy_from_slice(&header[..size_of::<usize>()]);
        let len = usize::from_ne_bytes(word);
        let level = i32::from_ne_bytes(
            header[size_of::<usize>()..size_of::<usize>() + 4]
                .try_into()
                .expect("4 bytes"),
        );
        let kind = i32::from_ne_bytes(
            header[size_of::<usize>() + 4..size_of::<usize>() + 8]
                .try_into()
                .expect("4 bytes"),
        );
        if len < CMSG_HEADER || len > control.len() - offset {
            break;
        }
        let data = &control[offset + CMSG_HEADER..offset + len];
        match (level, kind) {
            (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) if data.len() >= 4 => {
                info.kernel_drops =
                    Some(u32::from_ne_bytes(data[..4].try_into().expect("4 bytes")));
            }
            (libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS) if data.len() >= 16 => {
                let sec = i64::from_ne_bytes(data[..8].try_into().expect("8 bytes"));
                let nsec = i64::from_ne_bytes(data[8..16].try_into().expect("8 bytes"));
                if sec >= 0 && (0..1_000_000_000).contains(&nsec) {
                    info.rx_time_ns = (sec as u64)
                        .checked_mul(1_000_000_000)
                        .and_then(|n| n.checked_add(nsec as u64));
                }
            }
            (libc::IPPROTO_IP, libc::IP_PKTINFO) if data.len() >= 12 => {
                // struct in_pktinfo { int ifindex; in_addr spec_dst, addr }:
                // `addr` is the destination in the datagram's header.
                let octets: [u8; 4] = data[8..12].try_into().expect("4 bytes");
                info.local = Some(IpAddr::V4(Ipv4Addr::from(octets)));
            }
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) if data.len() >= 20 => {
                // struct in6_pktinfo { in6_addr addr; unsigned ifindex }.
                let octets: [u8; 16] = data[..16].try_into().expect("16 bytes");
                info.local = Some(IpAddr::V6(Ipv6Addr::from(octets)));
            }
            (libc::IPPROTO_IP, libc::IP_TTL) | (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT)
                if data.len() >= 4 =>
            {
                let value = i32::from_ne_bytes(data[..4].try_into().expect("4 bytes"));
                info.ttl = u8::try_from(value).ok();
            }
            (libc::SOL_UDP, libc::UDP_GRO) if data.len() >= 4 => {
                info.segment_size =
                    u32::try_from(i32::from_ne_bytes(data[..4].try_into().expect("4 bytes"))).ok();
            }
            _ => {}
        }
        offset += cmsg_align(len);
    }
    info
}

// ---- added for many clients in one process (udp_client -P N) ----

/// Receives one datagram if one is queued, without waiting (MSG_DONTWAIT
/// on this call only: the socket stays blocking for its sends). Fails with
/// `WouldBlock` when nothing is queued.
pub fn recv_from_nowait(
    socket: &std::net::UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, Option<SocketAddr>)> {
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
    let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `buf` is writable for `buf.len()` bytes; `storage` and `len`
    // live across the call and `len` is the storage's exact size; the fd
    // is owned by `socket` and open.
    let n = unsafe {
        libc::recvfrom(
            socket.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
            (&mut storage as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((n as usize, sockaddr_to_std(&storage, len)))
}

/// Empties the socket's error queue, where IP_RECVERR puts every ICMP
/// error (poll reports POLLERR until it is read, so a loop that polls the
/// socket would never sleep); returns how many errors it held.
pub fn drain_error_queue(socket: &std::net::UdpSocket) -> usize {
    let mut buf = [0u8; 64];
    let mut drained = 0;
    loop {
        // SAFETY: `buf` is writable for its length; no address and no
        // control data are asked for (the kernel flags MSG_CTRUNC and
        // still dequeues the error); the fd is owned by `socket` and open.
        let n = unsafe {
            libc::recv(
                socket.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            return drained;
        }
        drained += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmsg(level: i32, kind: i32, data: &[u8]) -> Vec<u8> {
        let len = CMSG_HEADER + data.len();
        let mut out = Vec::new();
        out.extend_from_slice(&len.to_ne_bytes());
        out.extend_from_slice(&level.to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(data);
        out.resize(cmsg_align(len), 0);
        out
    }

    #[test]
    fn parses_what_the_kernel_sends() {
        let mut buf = cmsg(libc::SOL_SOCKET, libc::SO_RXQ_OVFL, &7u32.to_ne_bytes());
        let mut ts = 5i64.to_ne_bytes().to_vec();
        ts.extend_from_slice(&9i64.to_ne_bytes());
        buf.extend(cmsg(libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS, &ts));
        buf.extend(cmsg(libc::SOL_UDP, libc::UDP_GRO, &1460i32.to_ne_bytes()));
        buf.extend(cmsg(99, 99, &[1, 2, 3]));
        buf.extend(cmsg(libc::IPPROTO_IP, libc::IP_TTL, &33i32.to_ne_bytes()));
        let info = parse_control(&buf);
        assert_eq!(info.kernel_drops, Some(7));
        assert_eq!(info.rx_time_ns, Some(5_000_000_009));
        assert_eq!(info.segment_size, Some(1460));
        assert_eq!(info.ttl, Some(33));
        let v6 = cmsg(
            libc::IPPROTO_IPV6,
            libc::IPV6_HOPLIMIT,
            &44i32.to_ne_bytes(),
        );
        assert_eq!(parse_control(&v6).ttl, Some(44));
        // A hop limit out of a byte's range is no TTL.
        let bad = cmsg(libc::IPPROTO_IP, libc::IP_TTL, &300i32.to_ne_bytes());
        assert_eq!(parse_control(&bad).ttl, None);
    }

    #[test]
    fn a_datagram_cut_to_fit_is_flagged() {
        use socket2::{Domain, Type};
        let rx = Socket::new(Domain::IPV4, Type::DGRAM, None).unwrap();
        rx.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let to = rx.local_addr().unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut batch = RecvBatch::new(2, 100);
        tx.send_to(&[7u8; 200], to.as_socket().unwrap()).unwrap();
        tx.send_to(&[8u8; 50], to.as_socket().unwrap()).unwrap();
        let mut got = Vec::new();
        while got.len() < 2 {
            let n = batch.recv(&rx).unwrap();
            for i in 0..n {
                let d = batch.datagram(i);
                got.push((d.data.len(), d.truncated));
            }
        }
        assert_eq!(got, [(100, true), (50, false)]);
        let n = {
            tx.send_to(&[9u8; 300], to.as_socket().unwrap()).unwrap();
            batch.recv_one(&rx).unwrap()
        };
        assert_eq!(n, 1);
        assert!(batch.datagram(0).truncated, "recvmsg path too");
    }

    /// A receiver on loopback.
    fn receiver() -> (Socket, SocketAddr) {
        use socket2::{Domain, Type};
        let rx = Socket::new(Domain::IPV4, Type::DGRAM, None).unwrap();
        rx.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let addr = rx.local_addr().unwrap().as_socket().unwrap();
        (rx, addr)
    }

    #[test]
    fn a_shared_socket_sends_gso_buffers_from_the_address_asked() {
        use socket2::{Domain, Type};
        let (rx, to) = receiver();
        // An unconnected sender bound to the wildcard, as udp_server's is.
        let tx = Socket::new(Domain::IPV4, Type::DGRAM, None).unwrap();
        tx.bind(&"0.0.0.0:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        let mut batch = SendBatch::new(4, Some(to));
        // Any 127/8 address is this host's on Linux: a source other than
        // the one the OS would pick shows the option took effect.
        batch.set_source(Some("127.0.0.2".parse().unwrap()));
        batch.set_gso_segment(Some(100));
        let buffer = [5u8; 350];
        let small = [6u8; 40];
        assert_eq!(batch.send(&tx, &[&buffer, &small]).unwrap(), 2);
        let mut got = Vec::new();
        let mut recv = RecvBatch::new(8, 1000);
        while got.len() < 5 {
            let n = recv.recv(&rx).unwrap();
            for i in 0..n {
                let d = recv.datagram(i);
                got.push(d.data.len());
                assert_eq!(d.from.unwrap().ip(), "127.0.0.2".parse::<IpAddr>().unwrap());
            }
        }
        // The kernel cut the buffer into 100-byte datagrams (the last one
        // shorter); the short message went whole.
        assert_eq!(got, [100, 100, 100, 50, 40]);
        // Off again: one datagram per message.
        batch.set_gso_segment(None);
        assert_eq!(batch.send(&tx, &[&buffer]).unwrap(), 1);
        assert_eq!(recv.recv(&rx).unwrap(), 1);
        assert_eq!(recv.datagram(0).data.len(), 350);
    }

    #[test]
    fn garbage_is_harmless() {
        assert_eq!(parse_control(&[]), ControlInfo::default());
        assert_eq!(parse_control(&[0xFF; 7]), ControlInfo::default());
        // A length that runs past the buffer stops the walk.
        let mut buf = cmsg(libc::SOL_UDP, libc::UDP_GRO, &1460i32.to_ne_bytes());
        buf[0] = 200;
        assert_eq!(parse_control(&buf), ControlInfo::default());
        // A negative GRO size is ignored.
        let buf = cmsg(libc::SOL_UDP, libc::UDP_GRO, &(-1i32).to_ne_bytes());
        assert_eq!(parse_control(&buf).segment_size, None);
    }
}

// ---- added for the proxy ----
// (In a module of its own because items after the test module above would
// trip clippy's items_after_test_module.)

pub use proxy_calls::{congestion_refusal, pipe_max_size, SplicePipe, HAS_SPLICE};

mod proxy_calls {
    use std::io;

    /// splice(2) is available here.
    pub const HAS_SPLICE: bool = true;

    /// A pipe that splice(2) moves bytes through (see `sys/splice.rs`).
    pub use crate::sys::splice::Pipe as SplicePipe;

    /// /proc/sys/fs/pipe-max-size (see `sys/splice.rs`).
    pub use crate::sys::splice::pipe_max_size;

    /// Why setsockopt(TCP_CONGESTION) refused an algorithm.
    pub fn congestion_refusal(err: &io::Error) -> crate::sys::CongestionRefusal {
        use crate::sys::CongestionRefusal;
        match err.raw_os_error() {
            Some(libc::ENOENT) => CongestionRefusal::NotLoaded,
            Some(libc::EPERM) => CongestionRefusal::NotAllowed,
            _ => CongestionRefusal::Other,
        }
    }
}
