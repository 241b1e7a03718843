//! `sockbench`: the socket benchmark matrices of the seeds, run from one
//! binary (issue 5). The matrix code lives here so that tests drive it
//! in-process and the binary stays thin. Nothing here prints: each suite
//! returns its rows, reports progress through [`Progress`], and
//! [`crate::output::bench`] turns them into tables, JSON, CSV and charts.
//!
//! # Layout
//! - [`udp`]: seed 000's UDP matrix over five socket libraries (one
//!   driver, a backend per library).
//! - [`tcp`]: seed 003's TCP transfers, half and full duplex, repeated.
//! - [`mux`]: seed 002's table: one receiver waiting on K sockets with
//!   each of the server's receive methods, against receive buffer sizes.
//! - [`sweep`]: seed 001's table, `udp_client` at each buffer size.
//! - [`ceiling`]: netspeed's default UDP path without its accounting, and
//!   one core's memcpy: the limit the other figures are read against.
//! - [`run_matrix`]: the one loop over a suite's cells.
//!
//! Sample statistics are in [`crate::stats::samples`].

pub mod ceiling;
pub mod mux;
pub mod sweep;
pub mod tcp;
pub mod udp;

use crate::config::bench::Suite;

use crate::error::{Error, Result};
use crate::shutdown::Shutdown;
use std::time::Duration;

/// What a suite measured.
#[derive(Debug, Clone)]
pub enum Report {
    Udp(udp::UdpReport),
    Tcp(tcp::TcpReport),
    Mux(mux::MuxReport),
    Ceiling(ceiling::CeilingReport),
}

impl Report {
    /// Fails if the run was interrupted: a partial table is printed but is
    /// not a result. A signal's interruption ends with its exit code (130,
    /// 143), and says how long the run went on.
    pub fn complete(&self, shutdown: &Shutdown) -> Result<()> {
        if !shutdown.is_triggered() {
            return Ok(());
        }
        let what = match self {
            Report::Udp(r) => format!(
                "interrupted after {} of {} configurations",
                r.rows.len(),
                r.planned
            ),
            _ => "interrupted".into(),
        };
        Err(match shutdown.signal() {
            Some(signal) => Error::interrupted(
                format!(
                    "{what} ({} after {:.1} s): the table above is partial",
                    signal.name(),
                    shutdown.elapsed().as_secs_f64()
                ),
                signal,
            ),
            None => Error::runtime(what),
        })
    }
}

/// Runs the chosen suite.
pub fn run(suite: &Suite, progress: &mut dyn Progress, shutdown: &Shutdown) -> Result<Report> {
    Ok(match suite {
        Suite::Udp(a) => Report::Udp(udp::run(a, progress, shutdown)?),
        Suite::Tcp(a) => Report::Tcp(tcp::run(a, progress, shutdown)?),
        Suite::Mux(a) => Report::Mux(mux::run(a, progress, shutdown)?),
        Suite::Ceiling(a) => {
            let (sizes, duration) = a.settings()?;
            Report::Ceiling(ceiling::run(&sizes, duration, progress, shutdown)?)
        }
    })
}

/// How a suite reports its way through the cells; the output layer's bar
/// implements it, tests pass [`NoProgress`].
pub trait Progress {
    /// `total` cells of `suite` are about to run, taking about `estimate`.
    fn start(&mut self, suite: &str, total: usize, estimate: Option<Duration>);
    /// The next cell, in words.
    fn cell(&mut self, description: &str);
    /// The cell finished.
    fn done(&mut self);
    /// The matrix ended (finished, failed or interrupted).
    fn finish(&mut self);
}

/// Progress that goes nowhere.
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&mut self, _: &str, _: usize, _: Option<Duration>) {}
    fn cell(&mut self, _: &str) {}
    fn done(&mut self) {}
    fn finish(&mut self) {}
}

/// The one matrix loop: runs each cell in turn, reporting progress, until
/// the first failure or a signal (then the rows so far are returned).
pub fn run_matrix<C, R>(
    suite: &str,
    cells: &[C],
    estimate: Option<Duration>,
    progress: &mut dyn Progress,
    shutdown: &Shutdown,
    describe: impl Fn(&C) -> String,
    mut run: impl FnMut(&C) -> Result<R>,
) -> Result<Vec<R>> {
    progress.start(suite, cells.len(), estimate);
    let mut rows = Vec::with_capacity(cells.len());
    let mut result = Ok(());
    for cell in cells {
        if shutdown.is_triggered() {
            break;
        }
        progress.cell(&describe(cell));
        match run(cell) {
            Ok(row) => rows.push(row),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
        progress.done();
    }
    progress.finish();
    result.map(|()| rows)
}
