//! `sockbench`: the socket benchmark matrices of the seeds, run from one
//! binary (issue 5). The matrix code lives here so that tests drive it
//! in-process and the binary stays thin. Nothing here prints: each suite
//! returns its rows, reports progress through [`Progress`], and
//! [`crate::output::sockbench`] turns them into tables, JSON, CSV and charts.
//!
//! # Layout
//! - [`udp`]: seed 000's UDP matrix over five socket libraries (one
//!   driver, a backend per library).
//! - [`tcp`]: seed 003's TCP transfers, half and full duplex, repeated.
//! - [`mux`]: seed 002's table: one receiver waiting on K sockets with
//!   each of the server's receive methods, against receive buffer sizes.
//! - [`ceiling`]: netspeed's default UDP path without its accounting, and
//!   one core's memcpy: the limit the other figures are read against.
//! - [`crate::matrix`]: the one loop over a suite's cells, shared with
//!   `udp_client --sweep`.
//!
//! Sample statistics are in [`crate::stats::samples`].

pub mod ceiling;
pub mod mux;
pub mod tcp;
pub mod udp;

use crate::config::sockbench::Suite;

use crate::error::{Error, Result};
use crate::matrix::Progress;
use crate::shutdown::Shutdown;

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
