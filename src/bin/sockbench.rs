//! sockbench: the socket benchmark matrices of issue 5 (`udp`, `tcp`,
//! `mux`). Everything is in `netspeed::bench`; this parses the flags,
//! installs the signal handlers and maps errors to exit codes.

use netspeed::bench::Cli;
use netspeed::config::parse_args;
use netspeed::error::{Error, Result};
use netspeed::output::exit_with;
use netspeed::shutdown::Shutdown;

fn main() {
    if let Err(e) = run() {
        exit_with(&e);
    }
}

fn run() -> Result<()> {
    let cli: Cli = parse_args(std::env::args_os())?;
    let shutdown = Shutdown::on_signals()
        .map_err(|e| Error::runtime(format!("cannot install signal handlers: {e}")))?;
    netspeed::bench::main(&cli, &shutdown)
}
