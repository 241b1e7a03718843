//! The one loop over a benchmark's cells, and how it reports its way
//! through them: sockbench's suites ([`crate::sockbench`]) and
//! `udp_client --sweep` ([`crate::client::sweep`]) both run a matrix of
//! cells, and the output layer's bar shows either.
//!
//! Why a leaf: the sweep is the client's and the suites are sockbench's;
//! neither role may import the other's files, so the loop they share sits
//! below both.

use crate::error::Result;
use crate::shutdown::Shutdown;
use std::time::Duration;

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
