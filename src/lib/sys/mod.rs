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

/// splice(2) through a pipe: the zero-copy proxy path.
#[cfg(target_os = "linux")]
pub mod splice;

pub use imp::{
    available_tcp_congestion, default_tcp_congestion, enable_kernel_drop_counter,
    enable_local_address, enable_rx_timestamps, enable_send_errors, force_recv_buffer, send_from,
    set_dont_fragment, set_tcp_congestion, RecvBatch, RCVBUF_DOUBLES, RCVBUF_SYSCTL,
};
#[cfg(target_os = "linux")]
pub use imp::{
    enable_gro, force_send_buffer, poll_readable, select_readable, set_gso_segment, Epoll,
    SendBatch,
};
#[cfg(target_os = "linux")]
pub use imp::{parse_control, ControlInfo};

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
}

pub use crate::stats::CpuTime;

/// The CPU time of the calling thread so far (getrusage RUSAGE_THREAD), or
/// None where the platform cannot tell.
pub fn thread_cpu() -> Option<CpuTime> {
    imp::rusage(false)
}

/// The CPU time of the whole process so far (getrusage RUSAGE_SELF).
pub fn process_cpu() -> Option<CpuTime> {
    imp::rusage(true)
}

/// Scheduling policies (sched(7)), as seed 002's `-S` offered them.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum SchedPolicy {
    Other,
    Batch,
    Idle,
    Fifo,
    Rr,
}

impl SchedPolicy {
    /// The priorities the policy accepts.
    pub fn priority_range(self) -> std::ops::RangeInclusive<i32> {
        match self {
            SchedPolicy::Fifo | SchedPolicy::Rr => 1..=99,
            _ => 0..=0,
        }
    }
}

/// Applies a scheduling policy to the calling thread (threads it starts
/// later inherit it), with an error that says what grants the right.
pub fn apply_scheduler(policy: SchedPolicy, priority: i32) -> Result<(), String> {
    let range = policy.priority_range();
    if !range.contains(&priority) {
        return Err(format!(
            "--priority {priority} is not valid for --scheduler {policy:?}: use {}..={}",
            range.start(),
            range.end()
        )
        .to_lowercase());
    }
    imp::set_scheduler(policy, priority).map_err(|e| {
        if e.raw_os_error() == Some(libc::EPERM) {
            format!(
                "not permitted to use scheduler {} with priority {priority}: run as root, grant CAP_SYS_NICE (setcap cap_sys_nice+ep BINARY), or raise the realtime limit (ulimit -r {priority})",
                format!("{policy:?}").to_lowercase()
            )
        } else {
            format!("cannot set scheduler {}: {e}", format!("{policy:?}").to_lowercase())
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

/// Largest UDP payload for one datagram (65535 minus the IP and UDP headers).
pub const MAX_UDP_PAYLOAD_V4: usize = 65507;
/// Largest UDP payload over IPv6 without jumbograms (65535 minus the UDP header).
pub const MAX_UDP_PAYLOAD_V6: usize = 65527;

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
