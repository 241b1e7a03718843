//! The only code that writes to stdout or stderr, and the only user of
//! indicatif and plotters (and of prometheus-client and hyper, for
//! `udp_server --metrics`: [`metrics`] and
//! [`metrics_http`]). Roles (server, client, proxy, bench) compute and
//! return report structs or send typed events to a sink; this module turns
//! them into text, JSON, CSV, tables, charts and progress bars.
//!
//! Why one place: a figure is then formatted one way wherever it appears,
//! the roles can be tested without capturing output, and a new output
//! (intervals, CPU figures, metrics) has one obvious home.
//!
//! It also holds the two ends of a binary's run that sit next to that
//! output: [`run_binary`] (what every `main` is: `--completions` and
//! `--man`, the run, the one-line error and the exit code), [`start`]
//! (flags, signals and scheduler, as the UDP binaries begin) and
//! [`exit_with`] (the one-line error and the exit code).

pub mod iperf3;
pub mod limit;
pub mod manual;
pub mod metrics;
pub mod metrics_http;
pub mod plot;
pub mod progress;
pub mod proxy;
pub mod report;
pub mod sockbench;
pub mod stamp;
pub mod sweep;
pub mod table;
pub mod timeline;
pub mod timeline_of;

use crate::config::{parse_args, Sched};
use crate::error::{Error, Result};
use crate::shutdown::Shutdown;

/// How a report is printed: chosen once, from the flags, and handed to
/// whatever prints (`Format::show` in [`report`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    /// One JSON object per line.
    Json,
}

impl Format {
    /// `--json` (or `--json-stream`) as given.
    pub fn from_flags(json: bool) -> Format {
        if json {
            Format::Json
        } else {
            Format::Text
        }
    }
}

/// How a binary's `run` ends when it did not fail: `()` is exit 0; an
/// `i32` is the code its report asks for (udp_client's 3 for a run that
/// got no answer from the server).
pub trait Outcome {
    fn exit_code(self) -> i32;
}

impl Outcome for () {
    fn exit_code(self) -> i32 {
        0
    }
}

impl Outcome for i32 {
    fn exit_code(self) -> i32 {
        self
    }
}

/// A binary's whole `main`: `--completions` and `--man` answered from
/// `command` (the clap definition of its flags, see [`manual`]), then
/// `run`; an error is printed on one line and ends the process with its
/// exit code, and so does a report that asks for one. The binaries exit
/// here and nowhere else.
pub fn run_binary<T: Outcome>(
    command: impl FnOnce() -> clap::Command,
    run: impl FnOnce() -> Result<T>,
) {
    let argv: Vec<_> = std::env::args_os().collect();
    manual::handle(&argv, command);
    match run().map(Outcome::exit_code) {
        Ok(0) => {}
        Ok(code) => std::process::exit(code),
        Err(e) => exit_with(&e),
    }
}

/// Prints a one-line error to stderr and exits with its code.
pub fn exit_with(err: &Error) -> ! {
    let prog = std::env::args()
        .next()
        .and_then(|p| {
            std::path::Path::new(&p)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "netspeed".into());
    eprintln!("{prog}: error: {err}");
    std::process::exit(err.exit_code())
}

/// The start udp_client and udp_server share: their flags parsed and
/// validated into a config by `build`, Ctrl-C and SIGTERM wired to the
/// returned stop flag, and `--scheduler` (what `sched` reads from the
/// config) applied to the whole process before any socket is opened.
pub fn start<A: clap::Parser, C>(
    build: impl FnOnce(A) -> Result<C>,
    sched: impl FnOnce(&C) -> Option<Sched>,
) -> Result<(C, Shutdown)> {
    let cfg = build(parse_args(std::env::args_os())?)?;
    let shutdown = Shutdown::on_signals()
        .map_err(|e| Error::runtime(format!("cannot install signal handlers: {e}")))?;
    if let Some(sched) = sched(&cfg) {
        crate::sys::apply_scheduler(sched.policy, sched.priority)?;
    }
    Ok((cfg, shutdown))
}
