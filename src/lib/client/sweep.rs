//! `udp_client --sweep`: seed 001's table, buffer size against speed with
//! one and with two clients, against a running `udp_server`; and
//! `--sweep-clients`, the buffer-exhaustion probe: one size, more and more
//! clients, the aggregate received rate, the loss and the server socket's
//! drops per client count, and where its buffer first overflowed.
//!
//! Why the server's figure: seed 001's 63.5 Gbit/s headline was a sender
//! rate measured while the server's buffer overflowed. Every cell here
//! takes the receive rate from the server's end-of-test answers
//! (`report.server.gbps`: all clients' bytes over the union of their
//! spans); a cell whose answer never came shows as missing rather than as
//! the send rate, and makes the run exit with code 3.
//!
//! The sweep is a loop around [`crate::client::run`] with the caller's
//! validated config, overriding only the buffer size and the client count,
//! so every other flag (`--duration`, `--connected`, `--batch`, ...) means
//! what it always means.

use crate::client;
use crate::config::ClientConfig;
use crate::error::{Error, Result};
use crate::matrix::Progress;
use crate::shutdown::Shutdown;
use serde::Serialize;

/// One cell: one buffer size at one client count.
#[derive(Debug, Clone, Serialize)]
pub struct SweepCell {
    pub buffer_size: usize,
    pub clients: usize,
    /// Receive rate from the server's answers (over the clients' union of
    /// spans); None when no client got an answer, or the run was too short
    /// for a rate.
    pub server_gbps: Option<f64>,
    /// Send rate (sender side), for comparison only.
    pub sent_gbps: Option<f64>,
    pub sent_packets: u64,
    pub received_packets: Option<u64>,
    pub loss_percent: Option<f64>,
    pub lost_packets: Option<u64>,
    /// The server socket's drops while the cell ran (anyone's), in the
    /// kernel's unit, and in datagrams (counted, or estimated from the
    /// GRO buffers that arrived).
    pub kernel_drops: Option<u64>,
    pub kernel_drops_unit: Option<&'static str>,
    pub kernel_drops_datagrams: Option<u64>,
    /// Every client of the cell got the server's answer.
    pub complete: bool,
}

impl SweepReport {
    /// 0, or `client::EXIT_NO_ANSWER` when a cell lacks the server's answer.
    pub fn exit_code(&self) -> i32 {
        if self.cells.iter().all(|c| c.complete) {
            0
        } else {
            client::EXIT_NO_ANSWER
        }
    }
}

/// The whole sweep, row-major: for each size, each client count.
#[derive(Debug, Clone, Serialize)]
pub struct SweepReport {
    pub server: String,
    pub sizes: Vec<usize>,
    pub clients: Vec<usize>,
    pub cells: Vec<SweepCell>,
    /// One size, several client counts (`--sweep-clients`): the fewest
    /// clients at which the server's socket dropped.
    pub first_overflow: Option<usize>,
    /// A signal cut the sweep short: the cells are those that ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<client::Interrupted>,
    /// What each client sent per run, in words (`1.00 MB`, `for 1 s`,
    /// `1000 datagrams`), for the table's title.
    #[serde(skip)]
    pub each_client: String,
}

impl SweepReport {
    /// One size against several client counts: the buffer-exhaustion
    /// probe's table and chart.
    pub fn by_clients(&self) -> bool {
        self.sizes.len() == 1 && self.clients.len() > 1
    }

    pub fn cell(&self, size: usize, clients: usize) -> Option<&SweepCell> {
        self.cells
            .iter()
            .find(|c| c.buffer_size == size && c.clients == clients)
    }
}

/// Checks the lists against the server's address family.
pub fn validate(base: &ClientConfig, sizes: &[usize], clients: &[usize]) -> Result<()> {
    if sizes.is_empty() || clients.is_empty() {
        return Err(Error::usage(
            "--sweep needs at least one size and one client count",
        ));
    }
    let limit = crate::sys::max_udp_payload(&base.server);
    for &s in sizes {
        if s == 0 || s > limit {
            return Err(Error::usage(format!(
                "--sweep {s}: buffer sizes must be between 1 and {limit} bytes"
            )));
        }
    }
    for &c in clients {
        if c == 0 || c > crate::config::MAX_CLIENTS {
            return Err(Error::usage(format!(
                "--clients {c}: must be between 1 and {}",
                crate::config::MAX_CLIENTS
            )));
        }
    }
    Ok(())
}

/// Runs `udp_client` once per (size, client count) against `base.server`,
/// with everything else from `base`.
pub fn run(
    base: &ClientConfig,
    sizes: &[usize],
    clients: &[usize],
    shutdown: &Shutdown,
    progress: &mut dyn Progress,
) -> Result<SweepReport> {
    validate(base, sizes, clients)?;
    let grid: Vec<(usize, usize)> = sizes
        .iter()
        .flat_map(|&size| clients.iter().map(move |&n| (size, n)))
        .collect();
    let describe = |&(size, n): &(usize, usize)| format!("buffer {size}, {n} client(s)");
    let cells = crate::matrix::run_matrix(
        "sweep",
        &grid,
        None,
        progress,
        shutdown,
        describe,
        |&(size, n)| {
            let mut cfg = base.clone();
            cfg.buffer_size = size;
            cfg.clients = n;
            cfg.quiet = true;
            cfg.json = false;
            client::run(&cfg, shutdown)
                .map(|r| {
                    let v = r.server.as_ref();
                    let facts = v.map(client::verdict::ReceiverFacts::of);
                    SweepCell {
                        buffer_size: size,
                        clients: n,
                        server_gbps: v.and_then(|s| s.gbps),
                        sent_gbps: r.gbps,
                        sent_packets: r.sent_packets,
                        received_packets: v.map(|s| s.received_packets),
                        loss_percent: v.map(|s| s.loss_percent),
                        lost_packets: v.map(|s| s.lost_packets),
                        kernel_drops: facts.and_then(|f| f.kernel_drops),
                        kernel_drops_unit: v.and_then(|s| s.drops.kernel_drops_unit),
                        kernel_drops_datagrams: facts
                            .filter(|f| f.kernel_drops.is_some())
                            .map(|f| f.dropped_datagrams()),
                        complete: r.complete,
                    }
                })
                .map_err(|e| {
                    Error::runtime(format!("sweep at buffer {size} with {n} client(s): {e}"))
                })
        },
    )?;
    let first_overflow = (sizes.len() == 1)
        .then(|| {
            cells
                .iter()
                .filter(|c| c.kernel_drops.is_some_and(|d| d > 0))
                .map(|c| c.clients)
                .min()
        })
        .flatten();
    Ok(SweepReport {
        server: base.server.to_string(),
        sizes: sizes.to_vec(),
        clients: clients.to_vec(),
        cells,
        first_overflow,
        interrupted: client::Interrupted::of(shutdown),
        each_client: match base.volume {
            crate::meter::plan::Volume::Bytes(b) => {
                format!("{} each", crate::units::HumanBytes(b))
            }
            crate::meter::plan::Volume::Packets(n) => format!("{n} datagrams each"),
            crate::meter::plan::Volume::Time(d) => format!("for {:?} each", d),
        },
    })
}
