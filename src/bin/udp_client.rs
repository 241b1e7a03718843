//! udp_client: sends an exact volume of UDP data and reports both ends.
//! See `--help`.

use clap::CommandFactory;
use netspeed::client::{self, duplex, latency};
use netspeed::config::{ClientArgs, ClientConfig, ClientMode};
use netspeed::error::Result;
use netspeed::output::progress::Progress;
use netspeed::output::report::{
    self, client::client_end_event, client::client_start, duplex::ReverseInterval, server::Interval,
};
use netspeed::output::{iperf3, run_binary, start, timeline, timeline_of, Format};
use netspeed::shutdown::Shutdown;
use std::path::Path;
use std::sync::Mutex;
use std::time::SystemTime;

fn main() {
    run_binary(ClientArgs::command, run);
}

fn run() -> Result<i32> {
    let (cfg, shutdown) = start(ClientConfig::from_args, |cfg| cfg.sched)?;
    // A run a signal cut short still prints its report, then ends with the
    // signal's exit code (130, 143); so does one it stopped before a result.
    match run_mode(&cfg, &shutdown) {
        Ok(code) => Ok(client::exit_code_after(code, &shutdown)),
        Err(e) => Err(e.after_signal(shutdown.signal())),
    }
}

fn run_mode(cfg: &ClientConfig, shutdown: &Shutdown) -> Result<i32> {
    match &cfg.mode {
        ClientMode::Run => {}
        ClientMode::Sweep {
            sizes,
            clients,
            plot,
        } => return sweep(cfg, sizes, clients, plot.as_deref(), shutdown),
        ClientMode::FindLimit { search, plot } => {
            return find_limit(cfg, search, plot.as_deref(), shutdown)
        }
        ClientMode::Stamp(stamp) => {
            // STAMP round trips alone (--no-load).
            let report = client::stamp::run(stamp, shutdown)?;
            println!("{}", Format::from_flags(cfg.json).show(&report));
            return Ok(report.exit_code());
        }
    }
    if cfg.iperf3_json {
        return iperf3_json(cfg, shutdown);
    }
    let mut progress = Progress::new(client::planned_bytes(cfg), !cfg.quiet && !cfg.json);
    if cfg.json_stream {
        progress = progress.with_interval_events();
        println!("{}", client_start(cfg));
    } else if !cfg.json {
        progress = progress.with_intervals(cfg.clients, cfg.traffic.has_reverse());
    }
    if cfg.traffic.has_reverse() {
        return duplex(cfg, shutdown, progress);
    }
    // Round-trip probes run beside the load, idle first.
    let go = |cfg: &ClientConfig| {
        latency::probed(cfg, shutdown, || {
            client::run_with_progress(cfg, shutdown, &progress)
        })
    };
    let result = if cfg.local {
        // The receiver side of each interval, from the in-process server.
        let show = |event: &netspeed::server::ServerEvent| {
            if let netspeed::server::ServerEvent::Interval(r) = event {
                progress.line(&Format::from_flags(cfg.json_stream).show(&Interval(r)));
            }
        };
        let shown = !cfg.json || cfg.json_stream;
        let events = shown.then_some(&show as netspeed::local::ServerEvents);
        netspeed::local::with_local_server(cfg, events, go)
    } else {
        go(cfg)
    };
    progress.finish();
    let (mut result, probes) = result?;
    latency::attach_upload(&mut result, &probes);
    if cfg.json_stream {
        println!("{}", client_end_event(&result));
    } else {
        println!("{}", Format::from_flags(cfg.json).show(&result));
    }
    if let Some(path) = &cfg.timeline_plot {
        timeline::write_svg(path, &timeline_of::of_upload(&result, &probes))?;
    }
    // A run without the server's answer is not a success: the receiver
    // side, the number that matters, is missing.
    Ok(result.exit_code())
}

/// `-R` and `--bidir`: the server sends (and, with --bidir, the client
/// too); each direction reported on its own.
fn duplex(cfg: &ClientConfig, shutdown: &Shutdown, progress: Progress) -> Result<i32> {
    // Every interval received, for --plot.
    let received = Mutex::new(Vec::new());
    let shown = !cfg.json || cfg.json_stream;
    let show = |r: &netspeed::meter::account::PeerReport| {
        if shown {
            progress.line(&Format::from_flags(cfg.json_stream).show(&ReverseInterval(r)));
        }
        if cfg.timeline_plot.is_some() {
            received
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(r.clone());
        }
    };
    let events =
        (shown || cfg.timeline_plot.is_some()).then_some(&show as client::reverse::ReceiveEvents);
    let go = |cfg: &ClientConfig| {
        latency::probed(cfg, shutdown, || {
            duplex::run(cfg, shutdown, &progress, events)
        })
    };
    let result = if cfg.local {
        netspeed::local::with_local_server(cfg, None, go)
    } else {
        go(cfg)
    };
    progress.finish();
    let (mut result, probes) = result?;
    duplex::attach_round_trips(&mut result, &probes);
    if cfg.json_stream {
        println!("{}", report::json_event("end", &result));
    } else {
        println!("{}", Format::from_flags(cfg.json).show(&result));
    }
    if let Some(path) = &cfg.timeline_plot {
        let received = received.into_inner().unwrap_or_else(|p| p.into_inner());
        timeline::write_svg(path, &timeline_of::of_duplex(&result, &received, &probes))?;
    }
    Ok(result.exit_code())
}

/// `--iperf3-json`: the run (an upload, `-R` or `--bidir`) as one iperf3
/// document on stdout, and nothing else there; a run that fails writes
/// iperf3's error document, and its one-line error on stderr.
fn iperf3_json(cfg: &ClientConfig, shutdown: &Shutdown) -> Result<i32> {
    let meta = iperf3::Meta::client(cfg, SystemTime::now());
    let progress = Progress::new(client::planned_bytes(cfg), false);
    // Every interval a reverse stream's receiver counted.
    let received = Mutex::new(Vec::new());
    let collect = |r: &netspeed::meter::account::PeerReport| {
        received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(r.clone());
    };
    let on_server = |go: &dyn Fn(&ClientConfig) -> Result<(serde_json::Value, i32)>| {
        if cfg.local {
            netspeed::local::with_local_server(cfg, None, go)
        } else {
            go(cfg)
        }
    };
    let outcome = if cfg.traffic.has_reverse() {
        on_server(&|cfg: &ClientConfig| {
            let events = Some(&collect as client::reverse::ReceiveEvents);
            let (mut report, probes) = latency::probed(cfg, shutdown, || {
                duplex::run(cfg, shutdown, &progress, events)
            })?;
            duplex::attach_round_trips(&mut report, &probes);
            let received = received.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(path) = &cfg.timeline_plot {
                timeline::write_svg(path, &timeline_of::of_duplex(&report, &received, &probes))?;
            }
            let doc = iperf3::client::duplex(&report, &received, &meta);
            Ok((doc, report.exit_code()))
        })
    } else {
        on_server(&|cfg: &ClientConfig| {
            let (mut report, probes) = latency::probed(cfg, shutdown, || {
                client::run_with_progress(cfg, shutdown, &progress)
            })?;
            latency::attach_upload(&mut report, &probes);
            if let Some(path) = &cfg.timeline_plot {
                timeline::write_svg(path, &timeline_of::of_upload(&report, &probes))?;
            }
            Ok((iperf3::client::upload(&report, &meta), report.exit_code()))
        })
    };
    match outcome {
        Ok((doc, code)) => {
            println!("{doc}");
            Ok(code)
        }
        Err(e) => {
            let e = e.after_signal(shutdown.signal());
            println!("{}", iperf3::client::failed(&meta, &e.to_string()));
            Err(e)
        }
    }
}

/// `--sweep`: seed 001's table, one run per size and client count.
fn sweep(
    cfg: &ClientConfig,
    sizes: &[usize],
    clients: &[usize],
    plot: Option<&Path>,
    shutdown: &Shutdown,
) -> Result<i32> {
    use netspeed::client::sweep;
    use netspeed::output::progress::CellBar;
    use netspeed::output::sweep::{sweep_plot, sweep_table};
    let go = |cfg: &ClientConfig| {
        let mut bar = CellBar::new(cfg.quiet || cfg.json);
        sweep::run(cfg, sizes, clients, shutdown, &mut bar)
    };
    let report = if cfg.local {
        netspeed::local::with_local_server(cfg, None, go)?
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
    if let Some(path) = plot {
        sweep_plot(&report, path)?;
    }
    Ok(report.exit_code())
}

/// `--find-limit`: the highest rate the path carries, trial by trial.
fn find_limit(
    cfg: &ClientConfig,
    search: &netspeed::config::SearchSettings,
    plot: Option<&Path>,
    shutdown: &Shutdown,
) -> Result<i32> {
    use netspeed::output::limit;
    let text = !cfg.json;
    let go = |cfg: &ClientConfig| {
        if text {
            println!("{}", limit::header(cfg, search));
        }
        let mut on_trial = |trial: &client::limit::Trial| {
            if text {
                println!("{}", limit::trial_line(trial));
            } else if cfg.json_stream {
                println!("{}", report::json_event("trial", trial));
            }
        };
        if cfg.traffic.has_reverse() {
            // -R: each trial is a reverse stream; the server sends.
            let mut reverse = |c: &ClientConfig| duplex::trial(c, shutdown);
            client::limit::find_with(cfg, search, shutdown, &mut on_trial, &mut reverse)
        } else {
            client::limit::find(cfg, search, shutdown, &mut on_trial)
        }
    };
    let report = if cfg.local {
        netspeed::local::with_local_server(cfg, None, go)?
    } else {
        go(cfg)?
    };
    if cfg.json_stream {
        println!("{}", report::json_event("end", &report));
    } else {
        println!("{}", Format::from_flags(cfg.json).show(&report));
    }
    if let Some(path) = plot {
        netspeed::output::limit::limit_plot(&report, path)?;
    }
    Ok(0)
}
