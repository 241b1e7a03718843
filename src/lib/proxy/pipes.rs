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
//! has just emptied, and keeps it while bytes are queued; then the empty
//! pipe goes to the [`PipePool`] at its size, for the next busy
//! direction.
//!
//! Why a budget: growth is charged to one process-wide [`PipeBudget`]
//! (`--pipe-budget`): what a pipe has grown above its starting size, held
//! until the pipe closes. A growth that would take the total above the
//! budget, or that the kernel refuses (EPERM once the user's pipe pages
//! are spent, EBUSY, ENOMEM), leaves the pipe at its size: the connection
//! carries on at that size, and that pipe does not ask again. The first
//! refusal is reported as an event and every one is counted in the
//! summary. Pooled pipes keep their growth charged. The starting sizes are
//! not charged: the pool's cap on open pipes bounds them.
//! Charging them too was tried: 3,290 idle connections then held 411 MiB
//! of a 256 MiB budget, and no busy connection could grow at all. So the
//! pipes hold at most `--max-conns` × 128 KiB + `--pipe-budget`.

use crate::sys::{Descriptor, SplicePipe};
use serde::Serialize;
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

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

/// A pipe that is not in use: kept open in the [`PipePool`], with the
/// size it has grown to and the growth still charged to the budget.
#[derive(Debug)]
struct Idle {
    pipe: SplicePipe,
    charged: usize,
    /// A growth was refused: the pipe keeps its size wherever it goes next.
    settled: bool,
}

/// Every splice pipe of the proxy: the ones in use, and a bounded pool of
/// empty ones kept for reuse.
///
/// Why lazy, and why a pool: a pipe is two descriptors. Made when the
/// connection opened, a splice connection held six descriptors before a
/// byte moved. Now a direction takes a pipe when bytes are queued (an idle
/// connection holds its two sockets only) and gives it back as soon as a
/// fill finds nothing queued, or the direction ends. An empty pipe goes
/// into the pool, at the size it grew to, and the next busy direction
/// takes it warm. A pipe that still
/// holds bytes (an error mid-drain) is closed instead: nothing of one
/// connection may reach another. The pool keeps at most `max_pooled`
/// pipes, and in use and pooled together there are at most `max_pipes`,
/// both sized from the descriptor limit (`super::capacity`): from the
/// descriptors left once the connections have their sockets, so that a
/// pipe is taken only when the descriptors allow. A direction that finds
/// no pipe (the cap, or the kernel's EMFILE) copies that burst through a
/// buffer instead, and the connection goes on.
#[derive(Debug)]
pub struct PipePool {
    budget: PipeBudget,
    idle: Mutex<Vec<Idle>>,
    max_pooled: usize,
    max_pipes: usize,
    /// /proc/sys/fs/pipe-max-size, read once: reading it for every pipe
    /// taken cost five system calls per connection direction.
    kernel_max: Option<usize>,
    /// Pipes open now: in use and pooled.
    open: AtomicUsize,
    in_use: AtomicUsize,
    created: AtomicU64,
    reused: AtomicU64,
}

impl PipePool {
    /// A pool under `budget` bytes of growth (`--pipe-budget`, which
    /// covers pooled pipes too), with at most `max_pipes` pipes open and
    /// `max_pooled` of them idle.
    pub fn new(budget: usize, max_pipes: usize, max_pooled: usize) -> PipePool {
        PipePool {
            budget: PipeBudget::new(budget),
            idle: Mutex::new(Vec::new()),
            max_pooled: max_pooled.min(max_pipes),
            max_pipes,
            kernel_max: crate::sys::pipe_max_size(),
            open: AtomicUsize::new(0),
            in_use: AtomicUsize::new(0),
            created: AtomicU64::new(0),
            reused: AtomicU64::new(0),
        }
    }

    /// Whether a new pipe may be made: fewer than `max_pipes` are open.
    /// `max_pipes` is what the descriptor limit leaves once the
    /// connections have their sockets (`super::capacity`), so a pipe never
    /// takes a descriptor a connection was planned to have.
    pub fn has_room(&self) -> bool {
        self.open.load(Ordering::Relaxed) < self.max_pipes
    }

    /// The growth budget.
    pub fn budget(&self) -> &PipeBudget {
        &self.budget
    }

    fn idle(&self) -> MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A pipe for one direction that may grow to `max` bytes: a pooled one
    /// if there is one, else a new one. `Ok(None)` when `max_pipes` are
    /// open already; an error when the kernel refuses a new pipe (EMFILE,
    /// ENFILE, ENOMEM).
    pub fn take(&self, max: usize) -> io::Result<Option<GrowingPipe<'_>>> {
        if let Some(pipe) = self.take_pooled(max) {
            return Ok(Some(pipe));
        }
        let room = self
            .open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_pipes).then_some(n + 1)
            })
            .is_ok();
        if !room {
            return Ok(None);
        }
        let max = self.cap(max);
        match SplicePipe::new(START_SIZE.min(max)) {
            Ok(pipe) => {
                self.created.fetch_add(1, Ordering::Relaxed);
                Ok(Some(self.lend(pipe, max, 0, false)))
            }
            Err(e) => {
                self.open.fetch_sub(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// A pooled pipe, or `None` when the pool is empty: never a new one.
    /// For a direction that may have nothing to read yet: trying a pooled
    /// pipe costs no system call, and it goes straight back.
    pub fn take_pooled(&self, max: usize) -> Option<GrowingPipe<'_>> {
        let idle = self.idle().pop()?;
        let mut pipe = self.lend(idle.pipe, self.cap(max), idle.charged, true);
        pipe.settled = idle.settled;
        Some(pipe)
    }

    /// `max` within /proc/sys/fs/pipe-max-size.
    fn cap(&self, max: usize) -> usize {
        match self.kernel_max {
            Some(kernel_max) => max.min(kernel_max),
            None => max,
        }
    }

    fn lend(&self, pipe: SplicePipe, max: usize, charged: usize, pooled: bool) -> GrowingPipe<'_> {
        self.in_use.fetch_add(1, Ordering::Relaxed);
        GrowingPipe {
            max: max.max(pipe.capacity()),
            pipe: Some(pipe),
            pool: self,
            charged,
            settled: false,
            held: 0,
            pooled,
            used: false,
        }
    }

    /// Pipes in use now.
    pub fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Relaxed)
    }

    /// Empty pipes in the pool now.
    pub fn pooled(&self) -> usize {
        self.idle().len()
    }

    /// Pipes made so far.
    pub fn created(&self) -> u64 {
        self.created.load(Ordering::Relaxed)
    }

    /// Times a pooled pipe was taken instead of making one, and carried
    /// bytes.
    pub fn reused(&self) -> u64 {
        self.reused.load(Ordering::Relaxed)
    }

    /// A pipe back from a direction: into the pool if it is empty and the
    /// pool has room, else closed (its growth released).
    fn give_back(&self, pipe: SplicePipe, charged: usize, settled: bool, empty: bool) {
        self.in_use.fetch_sub(1, Ordering::Relaxed);
        if empty {
            let mut idle = self.idle();
            if idle.len() < self.max_pooled {
                idle.push(Idle {
                    pipe,
                    charged,
                    settled,
                });
                return;
            }
        }
        self.budget.release(charged);
        self.open.fetch_sub(1, Ordering::Relaxed);
        // `pipe` closes as it goes out of scope: its descriptors go back.
    }
}

/// One direction's pipe, taken from the [`PipePool`] and given back when
/// it is dropped; its growth is charged to the budget for as long as the
/// pipe is open (pooled included).
#[derive(Debug)]
pub struct GrowingPipe<'a> {
    /// Always `Some` until the drop gives it back.
    pipe: Option<SplicePipe>,
    /// The size it may grow to: `--buffer-size`, within pipe-max-size.
    max: usize,
    pool: &'a PipePool,
    /// What this pipe has charged to the budget: its growth.
    charged: usize,
    /// A growth was refused once; the pipe keeps its size from then on.
    settled: bool,
    /// Bytes in the pipe now: filled and not yet drained.
    held: usize,
    /// It came from the pool.
    pooled: bool,
    /// It has carried a byte: a pooled pipe counts as reused from then on
    /// (one taken and given straight back, as nothing was queued after
    /// all, does not).
    used: bool,
}

impl GrowingPipe<'_> {
    fn gone() -> io::Error {
        io::Error::other("the pipe was given back")
    }

    /// Bytes the pipe holds at most, now.
    pub fn capacity(&self) -> usize {
        self.pipe.as_ref().map_or(0, SplicePipe::capacity)
    }

    /// See [`SplicePipe::fill_from`].
    pub fn fill_from(&mut self, socket: &impl Descriptor, len: usize) -> io::Result<usize> {
        let pipe = self.pipe.as_ref().ok_or_else(Self::gone)?;
        let n = pipe.fill_from(socket, len)?;
        self.held += n;
        if n > 0 && !self.used {
            self.used = true;
            if self.pooled {
                self.pool.reused.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(n)
    }

    /// See [`SplicePipe::drain_to`].
    pub fn drain_to(&mut self, socket: &impl Descriptor, len: usize) -> io::Result<usize> {
        let pipe = self.pipe.as_ref().ok_or_else(Self::gone)?;
        let n = pipe.drain_to(socket, len)?;
        self.held = self.held.saturating_sub(n);
        Ok(n)
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
        let budget = &self.pool.budget;
        if !budget.try_charge(to - from) {
            self.settled = true;
            return refused(RefusedBy::Budget);
        }
        let resized = match self.pipe.as_mut() {
            Some(pipe) => pipe.resize(to),
            None => Err(Self::gone()),
        };
        match resized {
            Ok(granted) => {
                // The kernel rounds up to a power-of-two number of pages;
                // charge what it granted.
                if granted > to {
                    budget.charge(granted - to);
                } else {
                    budget.release(to - granted);
                }
                self.charged = self.charged + granted - from;
                None
            }
            Err(e) => {
                budget.release(to - from);
                self.settled = true;
                refused(RefusedBy::Kernel(e.to_string()))
            }
        }
    }
}

impl Drop for GrowingPipe<'_> {
    fn drop(&mut self) {
        if let Some(pipe) = self.pipe.take() {
            self.pool
                .give_back(pipe, self.charged, self.settled, self.held == 0);
        }
    }
}

#[cfg(all(test, target_os = "linux", not(feature = "portable")))]
mod tests {
    use super::*;

    /// Two ends of a loopback TCP connection: something a pipe fills from
    /// and drains to.
    fn tcp_pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let near = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (far, _) = listener.accept().unwrap();
        (near, far)
    }

    #[test]
    fn grows_by_doubling_to_the_maximum_and_releases_on_drop() {
        let pool = PipePool::new(8 << 20, 8, 0);
        let budget = pool.budget();
        let mut pipe = pool.take(1 << 20).unwrap().unwrap();
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
        let pool = PipePool::new(START_SIZE, 8, 0);
        let budget = pool.budget();
        let mut a = pool.take(1 << 20).unwrap().unwrap();
        let mut b = pool.take(1 << 20).unwrap().unwrap();
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
    fn take_pooled_never_makes_a_pipe() {
        let pool = PipePool::new(8 << 20, 4, 4);
        assert!(pool.take_pooled(1 << 20).is_none());
        assert_eq!((pool.created(), pool.in_use()), (0, 0));
        drop(pool.take(1 << 20).unwrap().unwrap());
        let again = pool.take_pooled(1 << 20).expect("the pooled pipe");
        assert_eq!((pool.created(), pool.in_use(), pool.pooled()), (1, 1, 0));
        drop(again);
        assert_eq!((pool.in_use(), pool.pooled(), pool.reused()), (0, 1, 0));
    }

    #[test]
    fn a_zero_budget_still_gives_every_connection_its_starting_pipes() {
        let pool = PipePool::new(0, 8, 0);
        let budget = pool.budget();
        let mut a = pool.take(1 << 20).unwrap().unwrap();
        assert_eq!((a.capacity(), budget.charged()), (START_SIZE, 0));
        assert_eq!(a.grow_if_full(START_SIZE).unwrap().by, RefusedBy::Budget);
    }

    #[test]
    fn an_empty_pipe_is_pooled_warm_a_full_one_closed_and_the_cap_holds() {
        let pool = PipePool::new(8 << 20, 2, 1);
        let mut a = pool.take(1 << 20).unwrap().unwrap();
        assert_eq!(a.grow_if_full(START_SIZE), None);
        let grown = a.capacity();
        let b = pool.take(1 << 20).unwrap().unwrap();
        // Two open: the cap.
        assert!(pool.take(1 << 20).unwrap().is_none());
        assert_eq!((pool.in_use(), pool.created()), (2, 2));
        drop(a);
        assert_eq!((pool.in_use(), pool.pooled()), (1, 1));
        // Its growth stays charged while it is pooled.
        assert_eq!(pool.budget().charged(), grown - START_SIZE);
        let mut again = pool.take(1 << 20).unwrap().unwrap();
        // Reused once it carries a byte, not when it is only taken.
        assert_eq!((again.capacity(), pool.reused()), (grown, 0));
        let (mut tx, rx) = tcp_pair();
        std::io::Write::write_all(&mut tx, b"x").unwrap();
        assert_eq!(again.fill_from(&rx, 1).unwrap(), 1);
        assert_eq!(pool.reused(), 1);
        let mut sink = [0u8; 1];
        let (drain_tx, mut drain_rx) = tcp_pair();
        assert_eq!(again.drain_to(&drain_tx, 1).unwrap(), 1);
        std::io::Read::read_exact(&mut drain_rx, &mut sink).unwrap();
        drop(again);
        // The pool is full (1): b is closed, its descriptors freed.
        drop(b);
        assert_eq!((pool.in_use(), pool.pooled()), (0, 1));
        assert!(pool.take(1 << 20).unwrap().is_some());
    }

    #[test]
    fn a_pipe_given_back_holding_bytes_is_closed_not_pooled() {
        let pool = PipePool::new(8 << 20, 4, 4);
        let mut a = pool.take(1 << 20).unwrap().unwrap();
        a.held = 10;
        drop(a);
        assert_eq!((pool.in_use(), pool.pooled()), (0, 0));
    }
}
