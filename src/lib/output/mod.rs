//! The only code that writes to stdout or stderr, and the only user of
//! indicatif and plotters. Roles (server, client, proxy, bench) compute and
//! return report structs or send typed events to a sink; this module turns
//! them into text, JSON, CSV, tables, charts and progress bars.
//!
//! Why one place: a figure is then formatted one way wherever it appears,
//! the roles can be tested without capturing output, and a new output
//! (intervals, CPU figures, metrics) has one obvious home.

pub mod bench;
pub mod progress;
pub mod proxy;
pub mod report;

use crate::error::Error;

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
