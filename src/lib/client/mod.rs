//! `udp_client`: find the server, send an exact volume, pace it, survive a
//! full queue, then ask the server what arrived.
//!
//! Each client socket is its own peer at the server (its own session id).
//! The clients of a run (`-P N`) share a few threads, no more than the
//! cores (`client/fleet.rs`): each thread probes, sends and asks for the
//! counts of its share of the clients at once, one schedule and one
//! staging buffer for all of them; a single client is one thread with one
//! client. Before sending, a short probe (Hello) finds a missing server
//! within a second, instead of after the whole volume, and no client
//! sends until every client has probed ([`StartGate`]). The send loop
//! never skips a datagram: on ENOBUFS or EAGAIN it backs off
//! exponentially (capped, reset after a success) and sends the same
//! datagram again, counting the back-offs and the time spent in them.
//! At the end, the End is answered only from the server's address and only
//! with the nonce of an End this client sent, so a forged or stale answer
//! is ignored.

pub mod duplex;
pub mod egress;
mod exchange;
mod fleet;
pub mod intervals;
pub mod latency;
pub mod limit;
mod report;
pub mod reverse;
pub mod rtt;
mod sender;
pub mod stamp;
pub mod start;
mod summary;
pub mod sweep;
pub mod verdict;

pub use crate::auth::random_u64;
pub use exchange::*;
pub use fleet::{apportion, shares, workers_for};
pub use report::*;
pub use sender::*;
use summary::*;

use crate::config::ClientConfig;
use crate::error::{Error, Result};
use crate::meter::plan::Volume;
use crate::meter::send::{GsoChoice, GsoOff, GsoRequest, SendPath, Transmitter};
use crate::shutdown::Shutdown;
use crate::stats::delay::{QueueFigures, RoundTripFigures, Spread};
use crate::stats::{self, percent, CpuCost, CpuTime, KernelDrops, RateSpan, SendInterval};
use crate::sys;
use crate::wire::{self, End, EndAck, Header, Hello, Message};
use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How long the start probe waits for a udp_server to answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The exit code of a run that ended without the server's answer for
/// every client: the sender side is printed, the receiver side is unknown.
pub const EXIT_NO_ANSWER: i32 = 3;
/// The exit code of a run whose answer the server marked as disputed:
/// another End for the session, or data after it (a forged End?).
pub const EXIT_DISPUTED: i32 = 4;
/// Runs `cfg.clients` client sockets at once (on at most one thread per
/// core) and sums their reports.
pub fn run(cfg: &ClientConfig, shutdown: &Shutdown) -> Result<RunReport> {
    run_with_progress(cfg, shutdown, &NoProgress)
}

/// [`run`], reporting the bytes sent to `progress` as they go.
pub fn run_with_progress(
    cfg: &ClientConfig,
    shutdown: &Shutdown,
    progress: &dyn SendProgress,
) -> Result<RunReport> {
    let started = SystemTime::now();
    // Every session of this run says so in its Hello (`--one-off` waits
    // for all of them); -R and --bidir set the run for both halves.
    let with_run;
    let cfg = match cfg.run {
        Some(_) => cfg,
        None => {
            with_run = ClientConfig {
                run: Some(wire::Run {
                    id: random_u64(),
                    clients: cfg.clients as u64,
                }),
                ..cfg.clone()
            };
            &with_run
        }
    };
    fleet::make_room(cfg.clients)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let shares = shares(cfg.clients, workers_for(cfg.clients, cores));
    let gate = StartGate::new(cfg.clients);
    // The sender's own egress queue, before and after: its counters are
    // the device's. While the run sends, a watch reads them on a thread of
    // its own when the qdisc cuts GSO buffers (and drops their datagrams
    // unheard): at the first drops it turns GSO off.
    let queue_before = egress::snapshot(cfg.server);
    let gso_off = GsoOff::default();
    let finished = std::sync::atomic::AtomicBool::new(false);
    let watched = queue_before
        .as_ref()
        .ok()
        .filter(|b| egress::cuts_gso(b, &send_shape(cfg)));
    let results: Vec<Result<Vec<ClientReport>>> = std::thread::scope(|scope| {
        let watch = watched.map(|before| {
            let (gso_off, finished) = (&gso_off, &finished);
            scope.spawn(move || egress::watch_gso(before, gso_off, finished))
        });
        let handles: Vec<_> = shares
            .iter()
            .map(|&count| {
                let (gate, gso_off) = (&gate, &gso_off);
                scope
                    .spawn(move || fleet::run_worker(cfg, shutdown, progress, gate, count, gso_off))
            })
            .collect();
        let results = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::runtime("a client thread panicked")))
            })
            .collect();
        finished.store(true, std::sync::atomic::Ordering::Release);
        if let Some(w) = watch {
            let _ = w.join();
        }
        results
    });
    // The error worth showing is the one that stopped the run, not a
    // client held back because of it.
    let (mut clients, mut first_error, mut held_back) = (Vec::new(), None, None);
    for result in results {
        match result {
            Ok(c) => clients.extend(c),
            Err(e) if e.to_string() == HELD_BACK => held_back = Some(e),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error.or(held_back) {
        return Err(e);
    }
    let interrupted = Interrupted::of(shutdown);
    let queue = queue_before.and_then(|b| egress::again(b.device()).map(|a| (b, a)));
    Ok(summarise(
        cfg,
        clients,
        started,
        interrupted,
        queue,
        gso_off.why(),
    ))
}
