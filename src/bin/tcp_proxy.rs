//! tcp_proxy: forwards TCP connections to one upstream, six ways; and
//! `tcp_proxy bench`, the latency benchmark that compares them. See
//! `--help`, `tcp_proxy bench --help` and docs/proxy.md.

use clap::CommandFactory;
use netspeed::config::parse_args;
use netspeed::config::proxy::{BenchArgs, BenchConfig, ProxyArgs, ProxyConfig};
use netspeed::error::{Error, Result};
use netspeed::output;
use netspeed::proxy::{self, latency_bench};
use netspeed::shutdown::Shutdown;
use std::ffi::OsString;

fn main() {
    output::run_binary(command, run);
}

/// One page and one script for both: `bench` appears as a subcommand.
fn command() -> clap::Command {
    ProxyArgs::command().subcommand(BenchArgs::command().name("bench"))
}

fn run() -> Result<()> {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "bench") {
        args.splice(0..2, [OsString::from("tcp_proxy bench")]);
        run_bench(args)
    } else {
        run_proxy(args)
    }
}

fn signals() -> Result<Shutdown> {
    Shutdown::on_signals().map_err(|e| Error::io("cannot install signal handlers", e))
}

fn run_proxy(args: Vec<OsString>) -> Result<()> {
    let args: ProxyArgs = parse_args(args)?;
    let cfg = ProxyConfig::from_args(args)?;
    if let Some(algo) = cfg.congestion {
        algo.check_available()?;
    }
    let shutdown = signals()?;
    let listener = proxy::bind(cfg.listen)?;
    let format = output::Format::from_flags(cfg.json);
    let events = Box::new(move |event| output::proxy::proxy_event(&event, format));
    proxy::run(listener, &cfg, &shutdown, events)?;
    Ok(())
}

fn run_bench(args: Vec<OsString>) -> Result<()> {
    let args: BenchArgs = parse_args(args)?;
    let cfg = BenchConfig::from_args(args)?;
    let shutdown = signals()?;
    let format = output::Format::from_flags(cfg.json);
    let rows = latency_bench::run(&cfg, &shutdown, &mut |row| {
        output::proxy::bench_row(row, format)
    })
    .map_err(|e| e.after_signal(shutdown.signal()))?;
    if format == output::Format::Text {
        output::proxy::bench_table(&rows);
    }
    // As sockbench: a partial table is not a result.
    if let Some(signal) = shutdown.signal() {
        return Err(Error::interrupted(
            format!(
                "interrupted ({} after {:.1} s) with {} rows measured: the table above is partial",
                signal.name(),
                shutdown.elapsed().as_secs_f64(),
                rows.len()
            ),
            signal,
        ));
    }
    let failed = rows.iter().filter(|r| r.error.is_some()).count();
    if failed > 0 {
        return Err(Error::runtime(format!(
            "{failed} benchmark rows failed (see the table)"
        )));
    }
    Ok(())
}
