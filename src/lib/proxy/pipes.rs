//! Splice pipes that grow on demand, under one budget for the whole proxy.
//!
//! Why grow: a pipe's size is how much one splice call can move. With the
//! kernel's default 64 KiB, a bulk stream costs a splice pair per 64 KiB;
//! with 1 MiB it costs one per up to a megabyte, and the proxy kept up
//! with a faster sender (docs/proxy.md has the figures). But a pipe's size
//! is also what it may hold while its destination does not read, and the
//! kernel charges the whole size to the user's pipe budget whether or not
//! it is used: 4,096 connections × 2 pipes × 1 MiB would be 8 GiB. So
//! every pipe starts at the kernel's default, and a pipe doubles only when
//! a fill took all of it (the sender was faster than one pipe-full), up to
//! `--buffer-size`. A pipe never shrinks: the relay only grows a pipe it
//! has just emptied, and keeps it until the connection closes.
//!
//! Why a budget: growth is charged to one process-wide [`PipeBudget`]
//! (`--pipe-budget`): what a pipe has grown above its starting size, held
//! until the pipe closes. A growth that would take the total above the
//! budget, or that the kernel refuses (EPERM once the user's pipe pages
//! are spent, EBUSY, ENOMEM), leaves the pipe at its size: the connection
//! carries on at that size, and that pipe does not ask again. The first
//! refusal is reported as an event and every one is counted in the
//! summary. The starting sizes are not charged: a connection needs its two
//! pipes, and `--max-conns` bounds them (4,096 × 2 × 64 KiB = 512 MiB).
//! Charging them too was tried: 3,290 idle connections then held 411 MiB
//! of a 256 MiB budget, and no busy connection could grow at all. So the
//! pipes hold at most `--max-conns` × 128 KiB + `--pipe-budget`.

use crate::sys::SplicePipe;
use serde::Serialize;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The size every pipe starts at: the kernel's default pipe (16 pages).
pub const START_SIZE: usize = 64 * 1024;

/// The pipe bytes above their starting sizes that the whole proxy may
/// hold, charged as pipes grow and released as they close.
#[derive(Debug)]
pub struct PipeBudget {
    limit: usize,
    charged: AtomicUsize,
}

impl PipeBudget {
    pub fn new(limit: usize) -> PipeBudget {
        PipeBudget {
            limit,
            charged: AtomicUsize::new(0),
        }
    }

    /// The `--pipe-budget` in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes charged now: the sum of the open pipes' growth.
    pub fn charged(&self) -> usize {
        self.charged.load(Ordering::Relaxed)
    }

    /// Charges `bytes` if the total stays within the limit.
    fn try_charge(&self, bytes: usize) -> bool {
        self.charged
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                c.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    /// Charges the pages the kernel granted above the asked size.
    fn charge(&self, bytes: usize) {
        self.charged.fetch_add(bytes, Ordering::Relaxed);
    }

    fn release(&self, bytes: usize) {
        self.charged.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Why a pipe did not grow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusedBy {
    /// Growing would take the proxy's pipes above `--pipe-budget`.
    Budget,
    /// F_SETPIPE_SZ failed (EPERM: the user's pipe pages are spent; EBUSY;
    /// ENOMEM); the kernel's message.
    Kernel(String),
}

impl RefusedBy {
    /// For the text line: `--pipe-budget` or `the kernel: ...`.
    pub fn text(&self) -> String {
        match self {
            RefusedBy::Budget => "--pipe-budget".into(),
            RefusedBy::Kernel(e) => format!("the kernel: {e}"),
        }
    }
}

/// A growth that was refused: the pipe stays at `from`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub from: usize,
    pub to: usize,
    pub by: RefusedBy,
}

/// One direction's pipe, charged to the budget for as long as it lives.
#[derive(Debug)]
pub struct GrowingPipe<'a> {
    pipe: SplicePipe,
    /// The size it may grow to: `--buffer-size`, within pipe-max-size.
    max: usize,
    budget: &'a PipeBudget,
    /// What this pipe has charged to the budget: its growth.
    charged: usize,
    /// A growth was refused once; the pipe keeps its size from then on.
    settled: bool,
}

impl<'a> GrowingPipe<'a> {
    /// A pipe of [`START_SIZE`] (or `max`, if smaller) that may grow to
    /// `max` bytes. Above /proc/sys/fs/pipe-max-size the kernel would
    /// refuse an unprivileged process, so `max` is capped there too.
    pub fn new(max: usize, budget: &'a PipeBudget) -> io::Result<GrowingPipe<'a>> {
        let max = match crate::sys::pipe_max_size() {
            Some(kernel_max) => max.min(kernel_max),
            None => max,
        };
        let pipe = SplicePipe::new(START_SIZE.min(max))?;
        Ok(GrowingPipe {
            max: max.max(pipe.capacity()),
            pipe,
            budget,
            charged: 0,
            settled: false,
        })
    }

    /// Bytes the pipe holds at most, now.
    pub fn capacity(&self) -> usize {
        self.pipe.capacity()
    }

    /// See [`SplicePipe::fill_from`].
    pub fn fill_from(&self, socket: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
        self.pipe.fill_from(socket, len)
    }

    /// See [`SplicePipe::drain_to`].
    pub fn drain_to(&self, socket: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
        self.pipe.drain_to(socket, len)
    }

    /// Called with the size of a fill once the pipe is empty again: if that
    /// fill took the whole pipe, the sender is faster than one pipe-full,
    /// so the pipe doubles (up to its maximum). `Some` says the growth was
    /// refused; the pipe keeps its size and does not ask again.
    pub fn grow_if_full(&mut self, filled: usize) -> Option<Refusal> {
        let from = self.capacity();
        if self.settled || filled < from || from >= self.max {
            return None;
        }
        let to = (from * 2).min(self.max);
        let refused = |by| Some(Refusal { from, to, by });
        if !self.budget.try_charge(to - from) {
            self.settled = true;
            return refused(RefusedBy::Budget);
        }
        match self.pipe.resize(to) {
            Ok(granted) => {
                // The kernel rounds up to a power-of-two number of pages;
                // charge what it granted.
                if granted > to {
                    self.budget.charge(granted - to);
                } else {
                    self.budget.release(to - granted);
                }
                self.charged = self.charged + granted - from;
                None
            }
            Err(e) => {
                self.budget.release(to - from);
                self.settled = true;
                refused(RefusedBy::Kernel(e.to_string()))
            }
        }
    }
}

impl Drop for GrowingPipe<'_> {
    fn drop(&mut self) {
        self.budget.release(self.charged);
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn grows_by_doubling_to_the_maximum_and_releases_on_drop() {
        let budget = PipeBudget::new(8 << 20);
        let mut pipe = GrowingPipe::new(1 << 20, &budget).unwrap();
        assert_eq!((pipe.capacity(), budget.charged()), (START_SIZE, 0));
        // A fill that did not take the whole pipe: no growth.
        assert_eq!(pipe.grow_if_full(START_SIZE - 1), None);
        assert_eq!(pipe.capacity(), START_SIZE);
        let mut sizes = vec![];
        for _ in 0..10 {
            assert_eq!(pipe.grow_if_full(pipe.capacity()), None);
            sizes.push(pipe.capacity());
        }
        let max = crate::sys::pipe_max_size().unwrap_or(1 << 20).min(1 << 20);
        assert_eq!(*sizes.last().unwrap(), max);
        assert_eq!(sizes[0], (2 * START_SIZE).min(max));
        assert_eq!(budget.charged(), max - START_SIZE);
        drop(pipe);
        assert_eq!(budget.charged(), 0);
    }

    #[test]
    fn over_budget_keeps_the_size_and_says_so_once() {
        let budget = PipeBudget::new(START_SIZE);
        let mut a = GrowingPipe::new(1 << 20, &budget).unwrap();
        let mut b = GrowingPipe::new(1 << 20, &budget).unwrap();
        assert_eq!(a.grow_if_full(START_SIZE), None);
        assert_eq!(budget.charged(), START_SIZE);
        let refusal = b.grow_if_full(START_SIZE).unwrap();
        assert_eq!(
            refusal,
            Refusal {
                from: START_SIZE,
                to: 2 * START_SIZE,
                by: RefusedBy::Budget
            }
        );
        assert_eq!(b.capacity(), START_SIZE);
        // Settled: no second refusal, even once the budget has room.
        drop(a);
        assert_eq!(b.grow_if_full(START_SIZE), None);
        assert_eq!(b.capacity(), START_SIZE);
        drop(b);
        assert_eq!(budget.charged(), 0);
    }

    #[test]
    fn a_zero_budget_still_gives_every_connection_its_starting_pipes() {
        let budget = PipeBudget::new(0);
        let mut a = GrowingPipe::new(1 << 20, &budget).unwrap();
        assert_eq!((a.capacity(), budget.charged()), (START_SIZE, 0));
        assert_eq!(a.grow_if_full(START_SIZE).unwrap().by, RefusedBy::Budget);
    }
}
