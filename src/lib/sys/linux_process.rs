//! The process on Linux: its scheduling policy, its CPU time, and its
//! budget of open files. Part of `sys/linux.rs`'s backend, split off by
//! concern (the sockets stay there).

use std::io;
use std::mem::zeroed;

/// A Linux scheduling policy (sched(7)).
pub fn set_scheduler(policy: crate::sys::SchedPolicy, priority: i32) -> io::Result<()> {
    use crate::sys::SchedPolicy::*;
    let policy = match policy {
        Other => libc::SCHED_OTHER,
        Batch => libc::SCHED_BATCH,
        Idle => libc::SCHED_IDLE,
        Fifo => libc::SCHED_FIFO,
        Rr => libc::SCHED_RR,
    };
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: `param` is a valid sched_param for the duration of the call;
    // pid 0 means the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, policy, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// getrusage for the calling thread (RUSAGE_THREAD) or the whole process.
pub fn rusage(process: bool) -> Option<crate::stats::CpuTime> {
    // SAFETY: rusage is plain old data; all-zero is valid.
    let mut usage: libc::rusage = unsafe { zeroed() };
    let who = if process {
        libc::RUSAGE_SELF
    } else {
        libc::RUSAGE_THREAD
    };
    // SAFETY: `usage` is a valid, writable rusage for the call.
    if unsafe { libc::getrusage(who, &mut usage) } != 0 {
        return None;
    }
    let time = |t: libc::timeval| {
        std::time::Duration::from_secs(t.tv_sec.max(0) as u64)
            + std::time::Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    Some(crate::stats::CpuTime {
        user: time(usage.ru_utime),
        system: time(usage.ru_stime),
    })
}

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

/// Raises RLIMIT_NOFILE's soft limit to its hard limit (an unprivileged
/// process may); returns the new soft limit.
pub fn raise_file_limit() -> io::Result<u64> {
    // SAFETY: as in `file_limits`.
    let mut limit: libc::rlimit = unsafe { zeroed() };
    // SAFETY: `limit` is a valid, writable rlimit for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: `limit` is a valid rlimit, read for the call only; raising
    // the soft limit up to the hard one needs no privilege and touches no
    // memory of ours.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(limit.rlim_cur as u64)
}

/// Files this process has open now (the entries of /proc/self/fd, less
/// the one that reads it).
pub fn open_files() -> io::Result<u64> {
    let entries = std::fs::read_dir("/proc/self/fd")?.count() as u64;
    Ok(entries.saturating_sub(1))
}
