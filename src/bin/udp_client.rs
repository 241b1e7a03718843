//! udp_client: sends an exact volume of UDP data and reports both ends.
//! See `--help`.

use netspeed::client;
use netspeed::config::{parse_args, ClientArgs, ClientConfig};
use netspeed::error::{Error, Result};
use netspeed::output::progress::Progress;
use netspeed::output::{exit_with, report};
use netspeed::shutdown::Shutdown;

fn main() {
    if let Err(e) = run() {
        exit_with(&e);
    }
}

fn run() -> Result<()> {
    let args: ClientArgs = parse_args(std::env::args_os())?;
    let cfg = ClientConfig::from_args(args)?;
    let shutdown = Shutdown::on_signals()
        .map_err(|e| Error::runtime(format!("cannot install signal handlers: {e}")))?;
    if let Some(sched) = cfg.sched {
        netspeed::sys::apply_scheduler(sched.policy, sched.priority)?;
    }
    if !cfg.sweep.is_empty() {
        return sweep(&cfg, &shutdown);
    }
    let progress = Progress::new(client::planned_bytes(&cfg), !cfg.quiet && !cfg.json);
    let result = if cfg.local {
        netspeed::local::run_local(&cfg, &shutdown, &progress)
    } else {
        client::run_with_progress(&cfg, &shutdown, &progress)
    };
    progress.finish();
    let result = result?;
    println!("{}", report::client_report(&result, cfg.json));
    // A run without the server's answer is not a success: the receiver
    // side, the number that matters, is missing.
    let code = result.exit_code();
    if code != 0 {
        std::process::exit(code);
    }
    Ok(())
}

/// `--sweep`: seed 001's table, one run per size and client count.
fn sweep(cfg: &ClientConfig, shutdown: &Shutdown) -> Result<()> {
    use netspeed::bench::sweep;
    use netspeed::output::bench::{sweep_plot, sweep_table, CellBar};
    let go = |cfg: &ClientConfig| {
        let mut bar = CellBar::new(cfg.quiet || cfg.json);
        sweep::run(cfg, &cfg.sweep, &cfg.sweep_clients, shutdown, &mut bar)
    };
    let report = if cfg.local {
        netspeed::local::with_local_server(cfg, go)?
    } else {
        go(cfg)?
    };
    if cfg.json {
        println!(
            "{}",
            serde_json::to_string(&report).unwrap_or_else(|_| "{}".into())
        );
    } else {
        println!("{}", sweep_table(&report));
    }
    if let Some(path) = &cfg.plot {
        sweep_plot(&report, path)?;
    }
    let code = report.exit_code();
    if code != 0 {
        std::process::exit(code);
    }
    Ok(())
}
