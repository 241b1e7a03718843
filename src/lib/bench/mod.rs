//! `sockbench`: the socket benchmark matrices of the seeds, run from one
//! binary (issue 5). The matrix code lives here so that tests drive it
//! in-process and the binary stays thin.
//!
//! # Layout
//! - [`udp`]: seed 000's UDP matrix over five socket libraries.
//! - [`tcp`]: seed 003's TCP transfers, half and full duplex, repeated.
//! - [`mux`]: seed 002's table: one receiver waiting on K sockets with
//!   each of the server's receive methods, against receive buffer sizes.
//! - [`sweep`]: seed 001's table, `udp_client` at each buffer size.
//! - [`stats`]: pure sample statistics (criterion's outliers and
//!   "variance introduced by outliers").
//! - [`output`]: text table, JSON and CSV views of a suite's rows.
//! - [`plot`]: SVG line charts.

pub mod mux;
pub mod output;
pub mod plot;
pub mod stats;
pub mod sweep;
pub mod tcp;
pub mod udp;

use crate::error::Result;
use crate::shutdown::Shutdown;
use crate::units;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

/// `sockbench`'s command line.
#[derive(Parser, Debug)]
#[command(
    name = "sockbench",
    version,
    about = "Socket benchmark matrices over loopback: UDP socket libraries, TCP transfers, and receive methods.",
    long_about = None
)]
pub struct Cli {
    #[command(subcommand)]
    pub suite: Suite,
}

#[derive(Subcommand, Debug)]
pub enum Suite {
    /// UDP throughput across socket libraries (seed 000's matrix).
    Udp(udp::UdpArgs),
    /// TCP transfers, half and full duplex, repeated with statistics (seed 003).
    Tcp(tcp::TcpArgs),
    /// One receiver waiting on K UDP sockets, per receive method and buffer size (seed 002).
    Mux(mux::MuxArgs),
}

/// Output flags shared by every suite.
#[derive(clap::Args, Debug, Default)]
pub struct OutputArgs {
    /// Print the rows as JSON.
    #[arg(long)]
    pub json: bool,
    /// Print the rows as CSV.
    #[arg(long)]
    pub csv: bool,
    /// Also draw the results into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// No progress bar and no estimate line.
    #[arg(short, long)]
    pub quiet: bool,
}

/// Runs the chosen suite.
/// The end of a suite: print its table, draw its chart when `--plot` was
/// given, and fail if the run was interrupted (a partial table is printed
/// but is not a result).
fn finish(
    text: &str,
    plot_path: Option<&std::path::Path>,
    chart: &plot::Chart,
    shutdown: &Shutdown,
) -> Result<()> {
    print!("{text}");
    if let Some(path) = plot_path {
        plot::draw(path, chart)?;
    }
    if shutdown.is_triggered() {
        return Err(crate::error::Error::runtime("interrupted"));
    }
    Ok(())
}

pub fn main(cli: &Cli, shutdown: &Shutdown) -> Result<()> {
    match &cli.suite {
        Suite::Udp(a) => udp::main(a, shutdown),
        Suite::Tcp(a) => tcp::main(a, shutdown),
        Suite::Mux(a) => mux::main(a, shutdown),
    }
}

pub(crate) fn size_arg(s: &str) -> std::result::Result<u64, String> {
    units::parse_size(s).map_err(|e| e.to_string())
}

pub(crate) fn duration_arg(s: &str) -> std::result::Result<Duration, String> {
    units::parse_duration(s).map_err(|e| e.to_string())
}

/// A bar counting configurations. Hidden when stderr is not a terminal or
/// with `--quiet`. (`crate::output::progress` counts bytes; this counts cells.)
pub struct Bar {
    bar: Option<ProgressBar>,
}

impl Bar {
    pub fn new(total: usize, quiet: bool) -> Self {
        if quiet || !std::io::stderr().is_terminal() {
            return Bar { bar: None };
        }
        let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr())
            .with_style(
                ProgressStyle::with_template(
                    "{bar:30.cyan/blue} {pos}/{len} configurations, ETA {eta}  {wide_msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
        Bar { bar: Some(bar) }
    }

    /// A bar that never draws (tests, libraries).
    pub fn hidden() -> Self {
        Bar { bar: None }
    }

    pub fn message(&self, msg: &str) {
        if let Some(b) = &self.bar {
            b.set_message(msg.to_string());
        }
    }

    pub fn inc(&self) {
        if let Some(b) = &self.bar {
            b.inc(1);
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
