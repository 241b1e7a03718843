//! Every platform syscall that socket2 and std do not cover, behind one safe
//! API. This is the only module that may use `unsafe`.
//!
//! Why one module: unsafe code is easiest to review when it is small, local
//! and in one place (quinn-udp's layout). The backend is chosen once at
//! compile time: `linux.rs` uses recvmmsg, SO_RXQ_OVFL and IP_RECVERR;
//! `fallback.rs` does one `recv_from` per datagram and says what it lacks.

use std::io;

#[cfg(target_os = "linux")]
#[path = "linux.rs"]
mod imp;

#[cfg(not(target_os = "linux"))]
#[path = "fallback.rs"]
mod imp;

pub use imp::{
    enable_kernel_drop_counter, enable_send_errors, force_recv_buffer, RecvBatch,
    KERNEL_DROPS_SUPPORTED, RCVBUF_DOUBLES, RCVBUF_SYSCTL,
};

/// One received datagram.
pub struct Received<'a> {
    pub data: &'a [u8],
    /// The sender; None only for an address family we do not know.
    pub from: Option<std::net::SocketAddr>,
    /// The socket's cumulative drop counter (receive buffer full) when this
    /// datagram was queued; None where the platform cannot tell.
    pub kernel_drops: Option<u64>,
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

/// Largest UDP payload for one datagram (65535 minus the IP and UDP headers).
pub const MAX_UDP_PAYLOAD_V4: usize = 65507;
/// Largest UDP payload over IPv6 without jumbograms (65535 minus the UDP header).
pub const MAX_UDP_PAYLOAD_V6: usize = 65527;
