//! The process's budget of open files (RLIMIT_NOFILE), on Linux and macOS:
//! read it, raise the soft limit to the hard one (and, with privilege, the
//! hard one), count the files open.
//!
//! Why raise it: the soft limit is 1024 in most shells, a relic of
//! select(2)'s FD_SETSIZE, while the hard limit is usually far higher. A
//! process that opens many sockets (a fleet of UDP clients, a proxy with
//! thousands of connections) and does not use select may raise its own
//! soft limit to the hard one without any privilege. Go's runtime, nginx
//! and HAProxy do so too.

use std::io;
use std::mem::zeroed;

/// RLIMIT_NOFILE's soft and hard limits.
pub fn file_limits() -> io::Result<(u64, u64)> {
    // SAFETY: rlimit is plain old data; all-zero is valid.
    let mut limit: libc::rlimit = unsafe { zeroed() };
    // SAFETY: `limit` is a valid, writable rlimit for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((limit.rlim_cur as u64, limit.rlim_max as u64))
}

/// macOS refuses a soft limit above OPEN_MAX (10240) when the hard limit
/// is "unlimited" (EINVAL); Go's runtime retries with this, and so do we.
#[cfg(target_os = "macos")]
const OPEN_MAX: u64 = 10240;

/// Raises RLIMIT_NOFILE's soft limit to its hard limit (an unprivileged
/// process may); returns the new soft limit.
pub fn raise_file_limit() -> io::Result<u64> {
    // SAFETY: rlimit is plain old data; all-zero is valid.
    let mut limit: libc::rlimit = unsafe { zeroed() };
    // SAFETY: `limit` is a valid, writable rlimit for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: `limit` is a valid rlimit, read for the call only; raising
    // the soft limit up to the hard one needs no privilege and touches no
    // memory of ours.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } == 0 {
        return Ok(limit.rlim_cur as u64);
    }
    let err = io::Error::last_os_error();
    #[cfg(target_os = "macos")]
    if err.raw_os_error() == Some(libc::EINVAL) && (limit.rlim_max as u64) > OPEN_MAX {
        limit.rlim_cur = OPEN_MAX as libc::rlim_t;
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } == 0 {
            return Ok(OPEN_MAX);
        }
    }
    Err(err)
}

/// Raises both RLIMIT_NOFILE limits to `to` and returns it. Raising a
/// hard limit needs privilege (CAP_SYS_RESOURCE on Linux, root on macOS),
/// and Linux refuses one above /proc/sys/fs/nr_open ([`file_limit_ceiling`]):
/// both give `EPERM`. HAProxy and nginx do this when started as root.
pub fn raise_hard_file_limit(to: u64) -> io::Result<u64> {
    let limit = libc::rlimit {
        rlim_cur: to as libc::rlim_t,
        rlim_max: to as libc::rlim_t,
    };
    // SAFETY: `limit` is a valid rlimit, read for the call only; the call
    // touches no memory of ours.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } == 0 {
        Ok(to)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The most any process's hard RLIMIT_NOFILE may be: /proc/sys/fs/nr_open
/// on Linux; `None` where it is not read (macOS, or unreadable).
pub fn file_limit_ceiling() -> Option<u64> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Files this process has open now (the entries of /proc/self/fd on
/// Linux, /dev/fd on macOS, less the one that reads it).
pub fn open_files() -> io::Result<u64> {
    let dir = if cfg!(target_os = "linux") {
        "/proc/self/fd"
    } else {
        "/dev/fd"
    };
    let entries = std::fs::read_dir(dir)?.count() as u64;
    Ok(entries.saturating_sub(1))
}
