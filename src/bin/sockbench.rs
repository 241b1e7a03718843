//! sockbench: the socket benchmark matrices of issue 5 (`udp`, `tcp`,
//! `mux`). The suites are in `netspeed::sockbench`, their views in
//! `netspeed::output::sockbench`; this parses the flags, installs the signal
//! handlers, hands the report to output and maps errors to exit codes.

use clap::CommandFactory;
use netspeed::config::parse_args;
use netspeed::config::sockbench::Cli;
use netspeed::error::{Error, Result};
use netspeed::output::progress::CellBar;
use netspeed::output::run_binary;
use netspeed::output::sockbench::Format;
use netspeed::shutdown::Shutdown;

fn main() {
    run_binary(Cli::command, run);
}

fn run() -> Result<()> {
    let cli: Cli = parse_args(std::env::args_os())?;
    let out = cli.suite.out();
    Format::from_flags(out.json, out.csv)?;
    let shutdown = Shutdown::on_signals()
        .map_err(|e| Error::runtime(format!("cannot install signal handlers: {e}")))?;
    let report = netspeed::sockbench::run(&cli.suite, &mut CellBar::new(out.quiet), &shutdown)
        .map_err(|e| e.after_signal(shutdown.signal()))?;
    netspeed::output::sockbench::print(&report, out)?;
    report.complete(&shutdown)
}
