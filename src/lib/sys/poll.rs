//! poll(2), which POSIX defines the same everywhere: one implementation
//! for the Linux backend (the server's `--method poll`) and the others
//! (`udp_client -P N` waits for the answers of many sockets at once).

use std::io;

/// Waits until one of `fds` is readable, with poll(2). Returns how many
/// are, marking each in `ready`; `scratch` is the caller's reusable array.
pub fn poll_readable(
    fds: &[std::os::fd::RawFd],
    timeout: std::time::Duration,
    ready: &mut [bool],
    scratch: &mut Vec<libc::pollfd>,
) -> io::Result<usize> {
    scratch.clear();
    scratch.extend(fds.iter().map(|&fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }));
    // SAFETY: `scratch` holds `fds.len()` initialised pollfds.
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
