//! Linux backend: recvmmsg batches with SO_RXQ_OVFL drop counts and UDP_GRO
//! segment sizes read from control messages; IP_RECVERR so that local queue
//! drops surface as ENOBUFS.

use socket2::Socket;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;

use super::Received;

/// True: SO_RXQ_OVFL reports the socket's drop counter on every receive.
pub const KERNEL_DROPS_SUPPORTED: bool = true;

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

/// Room for the control messages we ask for: SO_RXQ_OVFL (u32) and
/// UDP_GRO (int), with headers and alignment, plus slack.
const CONTROL_LEN: usize = 64;

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
    drops: Vec<u64>,
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
        for header in &mut self.headers {
            header.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            header.msg_hdr.msg_controllen = CONTROL_LEN as _;
            header.msg_hdr.msg_flags = 0;
            header.msg_len = 0;
        }
        // SAFETY: every pointer in `headers` points into buffers owned by
        // `self` that are neither moved nor resized after `new` (the Vecs
        // are never pushed to again), and each length matches its buffer.
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                self.headers.as_mut_ptr(),
                self.headers.len() as libc::c_uint,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            self.filled = 0;
            return Err(io::Error::last_os_error());
        }
        self.filled = n as usize;
        for i in 0..self.filled {
            // Linux attaches the counter only once it is non-zero.
            self.drops[i] = self.read_drop_counter(i).unwrap_or(0);
        }
        Ok(self.filled)
    }

    /// Reads SO_RXQ_OVFL from datagram `i`'s control messages.
    fn read_drop_counter(&self, i: usize) -> Option<u64> {
        let msg = &self.headers[i].msg_hdr;
        let mut found = None;
        // SAFETY: `msg` was filled by the kernel in the last recvmmsg; its
        // control pointer and length describe our own control buffer, and
        // the CMSG_* macros stay within msg_controllen.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SO_RXQ_OVFL
                {
                    let data = libc::CMSG_DATA(cmsg) as *const u32;
                    found = Some(u64::from(data.read_unaligned()));
                }
                cmsg = libc::CMSG_NXTHDR(msg, cmsg);
            }
        }
        found
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
/// The kernel doubles the requested buffer to leave room for bookkeeping.
pub const RCVBUF_DOUBLES: bool = true;
