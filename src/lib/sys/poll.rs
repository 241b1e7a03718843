//! poll(2), which POSIX defines the same everywhere: one implementation
//! for the Linux backend (the server's `--method poll`) and the others
//! (`udp_client -P N` waits for the answers of many sockets at once).

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// Waits until one of `sockets` is readable, with poll(2). Returns how
/// many are, marking each in `ready`; `scratch` is the caller's reusable
/// array.
pub fn poll_readable<S: AsFd>(
    sockets: &[S],
    timeout: std::time::Duration,
    ready: &mut [bool],
    scratch: &mut Vec<libc::pollfd>,
) -> io::Result<usize> {
    scratch.clear();
    scratch.extend(sockets.iter().map(|s| libc::pollfd {
        fd: s.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }));
    // SAFETY: `scratch` holds `sockets.len()` initialised pollfds, each
    // of a descriptor `sockets` keeps open for the call.
    let n = unsafe {
        libc::poll(
            scratch.as_mut_ptr(),
            scratch.len() as libc::nfds_t,
            timeout.as_millis().min(i32::MAX as u128) as libc::c_int,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    for (i, p) in scratch.iter().enumerate() {
        ready[i] = p.revents & (libc::POLLIN | libc::POLLERR) != 0;
    }
    Ok(n as usize)
}
