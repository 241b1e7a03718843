//! Answering datagrams from the buffers they arrived in (the STAMP
//! reflector's path): the request's TTL or hop limit (IP_RECVTTL,
//! IPV6_RECVHOPLIMIT), one sendmmsg that sends each rewritten buffer back
//! to its sender, and the kernel's word on the clock (adjtimex).

use super::{setsockopt_int, write_control, RecvBatch, CONTROL_WORDS};
use crate::sys::ClockStatus;
use socket2::Socket;
use std::io;
use std::mem::zeroed;
use std::os::fd::AsRawFd;

/// Asks for the TTL (IPv4) or hop limit (IPv6) of every datagram
/// received ([`crate::sys::Received::ttl`]). On a dual-stack socket both:
/// IPv4 datagrams then carry IP_TTL, IPv6 ones IPV6_HOPLIMIT.
pub fn enable_rx_ttl(socket: &Socket) -> io::Result<()> {
    let ipv6 = socket
        .local_addr()?
        .as_socket()
        .is_some_and(|a| a.is_ipv6());
    let v4 = setsockopt_int(socket, libc::IPPROTO_IP, libc::IP_RECVTTL, 1);
    if ipv6 {
        return setsockopt_int(socket, libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, 1);
    }
    v4
}

/// Sends datagrams of a [`RecvBatch`] back where they came from, from the
/// buffers they arrived in, in one sendmmsg call: no copy, and nothing
/// allocated after [`ReplyBatch::new`].
pub struct ReplyBatch {
    headers: Vec<libc::mmsghdr>,
    iovecs: Vec<libc::iovec>,
    /// Per answer: the source address it leaves from (IP_PKTINFO).
    controls: Vec<[u64; CONTROL_WORDS]>,
}

impl ReplyBatch {
    /// Room for `batch` answers per call (a receive batch's size).
    pub fn new(batch: usize) -> Self {
        let batch = batch.max(1);
        ReplyBatch {
            // SAFETY: mmsghdr and iovec are plain old data; all-zero is valid.
            headers: vec![unsafe { zeroed() }; batch],
            iovecs: vec![unsafe { zeroed() }; batch],
            controls: vec![[0; CONTROL_WORDS]; batch],
        }
    }

    /// Sends `answers`, each `(slot, length)`: datagram `slot` of `batch`
    /// (as rewritten through [`RecvBatch::datagram_mut`]), cut to
    /// `length` bytes, which is never more than arrived: an answer is
    /// never larger than its request. Each goes to the address its
    /// datagram came from; with `from_local`, from the address it was sent
    /// to (the socket must have [`super::enable_local_address`]). Returns
    /// how many the kernel took, in order; the caller sends the rest again.
    pub fn send(
        &mut self,
        socket: &Socket,
        batch: &RecvBatch,
        answers: &[(usize, usize)],
        from_local: bool,
    ) -> io::Result<usize> {
        let count = answers.len().min(self.headers.len());
        for (i, &(slot, length)) in answers[..count].iter().enumerate() {
            let received = &batch.headers[slot];
            let arrived = (received.msg_len as usize).min(batch.buf_size);
            self.iovecs[i] = libc::iovec {
                iov_base: batch.buffers[slot * batch.buf_size..].as_ptr() as *mut libc::c_void,
                iov_len: length.min(arrived),
            };
            let header = &mut self.headers[i];
            header.msg_hdr.msg_iov = &mut self.iovecs[i];
            header.msg_hdr.msg_iovlen = 1;
            header.msg_hdr.msg_name =
                (&batch.addrs[slot] as *const libc::sockaddr_storage) as *mut libc::c_void;
            header.msg_hdr.msg_namelen = received.msg_hdr.msg_namelen;
            let source = batch.locals[slot].filter(|_| from_local);
            let ipv6 = batch.addrs[slot].ss_family as libc::c_int == libc::AF_INET6;
            let control_len = write_control(&mut self.controls[i], source, ipv6, None);
            header.msg_hdr.msg_control = if control_len > 0 {
                self.controls[i].as_mut_ptr().cast()
            } else {
                std::ptr::null_mut()
            };
            header.msg_hdr.msg_controllen = control_len as _;
            header.msg_hdr.msg_flags = 0;
            header.msg_len = 0;
        }
        // SAFETY: the first `count` headers point at iovecs and control
        // buffers owned by `self`, and at the addresses and data buffers of
        // `batch`, which the borrow keeps alive and unmoved for the call;
        // every length is that of the memory it describes (an iovec's is
        // at most what arrived in its buffer). sendmmsg only reads them.
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

/// What the kernel says of the system clock (adjtimex(2) read-only): not
/// synchronised (STA_UNSYNC), and its maximum error.
pub fn clock_status() -> Option<ClockStatus> {
    // SAFETY: timex is plain old data; all-zero (modes 0) asks for a read
    // and changes nothing.
    let mut tx: libc::timex = unsafe { zeroed() };
    // SAFETY: `tx` lives across the call and is the struct adjtimex takes.
    let state = unsafe { libc::adjtimex(&mut tx) };
    if state < 0 {
        return None;
    }
    let unsynced = tx.status & libc::STA_UNSYNC != 0 || state == libc::TIME_ERROR;
    Some(ClockStatus {
        kernel_synchronized: !unsynced,
        max_error_ns: u64::try_from(tx.maxerror).unwrap_or(0).saturating_mul(1000),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{SocketAddr, UdpSocket};
    use std::time::Duration;

    fn bound(addr: &str) -> Socket {
        let addr: SocketAddr = addr.parse().unwrap();
        let socket = Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::DGRAM,
            None,
        )
        .unwrap();
        if addr.is_ipv6() {
            socket.set_only_v6(false).unwrap();
        }
        socket.bind(&addr.into()).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        socket
    }

    #[test]
    fn the_ttl_and_hop_limit_of_a_request_are_read() {
        let rx = bound("[::]:0");
        enable_rx_ttl(&rx).unwrap();
        let port = rx.local_addr().unwrap().as_socket().unwrap().port();
        let v4 = UdpSocket::bind("127.0.0.1:0").unwrap();
        v4.set_ttl(33).unwrap();
        v4.send_to(b"x", ("127.0.0.1", port)).unwrap();
        let mut batch = RecvBatch::new(4, 100);
        assert_eq!(batch.recv_one(&rx).unwrap(), 1);
        assert_eq!(
            batch.datagram(0).ttl,
            Some(33),
            "IPv4 on a dual-stack socket"
        );
        let v6 = Socket::new(socket2::Domain::IPV6, socket2::Type::DGRAM, None).unwrap();
        v6.set_unicast_hops_v6(44).unwrap();
        let to: SocketAddr = format!("[::1]:{port}").parse().unwrap();
        v6.send_to(b"y", &to.into()).unwrap();
        assert_eq!(batch.recv_one(&rx).unwrap(), 1);
        assert_eq!(batch.datagram(0).ttl, Some(44), "IPv6");
    }

    #[test]
    fn answers_go_back_to_each_sender_never_longer_than_their_request() {
        let rx = bound("127.0.0.1:0");
        crate::sys::enable_local_address(&rx).unwrap();
        let to = rx.local_addr().unwrap().as_socket().unwrap();
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.2:0").unwrap();
        for s in [&a, &b] {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        }
        a.send_to(&[1u8; 60], to).unwrap();
        b.send_to(&[2u8; 50], to).unwrap();
        let mut batch = RecvBatch::new(4, 100);
        let mut replies = ReplyBatch::new(4);
        let mut seen = 0;
        while seen < 2 {
            let n = batch.recv(&rx).unwrap();
            let mut answers = Vec::new();
            for i in 0..n {
                let first = batch.datagram(i).data[0];
                batch.datagram_mut(i)[0] = first | 0xA0;
                // Asks for more than arrived: cut to what did.
                answers.push((i, 500));
            }
            assert_eq!(replies.send(&rx, &batch, &answers, true).unwrap(), n);
            seen += n;
        }
        let mut buf = [0u8; 1000];
        let (n, from) = a.recv_from(&mut buf).unwrap();
        assert_eq!((n, buf[0], buf[1]), (60, 0xA1, 1));
        assert_eq!(from, to);
        let (n, from) = b.recv_from(&mut buf).unwrap();
        assert_eq!((n, buf[0], buf[1]), (50, 0xA2, 2));
        assert_eq!(from, to);
    }

    #[test]
    fn the_kernel_says_something_of_the_clock() {
        let status = clock_status().expect("adjtimex works on Linux");
        // Unsynchronised clocks carry the kernel's growing bound (at most
        // 16 s); a synchronised one a small one. Either way, some bound.
        assert!(
            status.max_error_ns <= 16_000_000_000 + 1_000_000,
            "{status:?}"
        );
    }
}
