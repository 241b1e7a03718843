//! The process on Linux: its scheduling policy and its CPU time. Part of
//! `sys/linux.rs`'s backend, split off by concern (the sockets stay there;
//! the budget of open files is `sys/rlimit.rs`, shared with macOS).

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
