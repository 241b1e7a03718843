//! SO_MEMINFO on Linux: what a socket's receive queue holds, and its drop
//! counter read directly. Part of `sys/linux.rs`'s backend, split off by
//! concern.

use socket2::Socket;
use std::io;
use std::mem::{size_of, size_of_val};
use std::os::fd::AsRawFd;

/// SO_MEMINFO (asm-generic/socket.h; the same on x86 and arm), which the
/// libc crate does not export for every target.
const SO_MEMINFO: libc::c_int = 55;

/// The socket's SO_MEMINFO figures (SK_MEMINFO_*), as many as the kernel
/// gives.
fn meminfo(socket: &Socket) -> io::Result<([u32; 16], usize)> {
    let mut info = [0u32; 16];
    let mut len = size_of_val(&info) as libc::socklen_t;
    // SAFETY: `info` and `len` live across the call and `len` is the size
    // of `info`; the kernel writes at most that much. The fd is owned by
    // `socket` and open.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((info, len as usize / size_of::<u32>()))
}

/// What the socket's receive queue holds now, in the kernel's accounting
/// (SK_MEMINFO_RMEM_ALLOC: each datagram's buffer with its overhead), the
/// figure the kernel compares with SO_RCVBUF before it drops.
pub fn recv_buffer_held(socket: &Socket) -> io::Result<u64> {
    let (info, _) = meminfo(socket)?;
    Ok(u64::from(info[libc::SK_MEMINFO_RMEM_ALLOC as usize]))
}

/// The socket's drop counter now (SK_MEMINFO_DROPS: the counter
/// SO_RXQ_OVFL stamps on each datagram as it is queued, a u32 that
/// wraps). Why read it directly as well: datagrams dropped after the last
/// one queued are in no datagram's stamp, so only this says they were
/// dropped.
pub fn kernel_drop_count(socket: &Socket) -> io::Result<u32> {
    let (info, fields) = meminfo(socket)?;
    let index = libc::SK_MEMINFO_DROPS as usize;
    if fields <= index {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "SO_MEMINFO without SK_MEMINFO_DROPS (a kernel before 4.6)",
        ));
    }
    Ok(info[index])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::imp::{enable_kernel_drop_counter, RecvBatch};
    use std::net::SocketAddr;

    fn receiver() -> (Socket, SocketAddr) {
        use socket2::{Domain, Type};
        let rx = Socket::new(Domain::IPV4, Type::DGRAM, None).unwrap();
        rx.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        let addr = rx.local_addr().unwrap().as_socket().unwrap();
        (rx, addr)
    }

    /// Datagrams dropped after the last one queued are in no datagram's
    /// SO_RXQ_OVFL stamp: the drop counter read directly has them.
    #[test]
    fn drops_after_the_last_datagram_queued_show_only_in_the_counter() {
        let (rx, to) = receiver();
        enable_kernel_drop_counter(&rx).unwrap();
        // The smallest buffer the kernel grants: a few datagrams fill it.
        rx.set_recv_buffer_size(1).unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let sent = 200u32;
        for _ in 0..sent {
            tx.send_to(&[1u8; 500], to).unwrap();
        }
        let dropped = kernel_drop_count(&rx).unwrap();
        rx.set_nonblocking(true).unwrap();
        let mut batch = RecvBatch::new(8, 1000);
        let (mut read, mut stamped) = (0u32, 0u32);
        while let Ok(n) = batch.recv(&rx) {
            for i in 0..n {
                stamped = stamped.max(batch.datagram(i).kernel_drops.unwrap_or(0));
            }
            read += n as u32;
        }
        assert!(read > 0 && dropped > 0, "read {read}, dropped {dropped}");
        assert_eq!(read + dropped, sent, "every datagram read or dropped");
        // Every datagram was queued before the first drop, so every
        // stamp says none.
        assert_eq!(stamped, 0, "the stamps cannot know of the drops");
        assert_eq!(kernel_drop_count(&rx).unwrap(), dropped);
    }
}
