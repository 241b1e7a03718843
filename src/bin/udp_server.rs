//! udp_server: counts what each peer sends and reports it. See `--help`.

use clap::CommandFactory;
use netspeed::config::{ServerArgs, ServerConfig};
use netspeed::error::{Error, Result};
use netspeed::output::report::server::{Listening, ServerOutput};
use netspeed::output::{metrics_http, run_binary, start};
use netspeed::server::metrics::{Board, ServerInfo};
use netspeed::server::{self, ServerEvent};
use netspeed::shutdown::Shutdown;
use std::sync::{Arc, Mutex, PoisonError};

fn main() {
    run_binary(ServerArgs::command, run);
}

fn run() -> Result<i32> {
    let (cfg, shutdown) = start(ServerConfig::from_args, |cfg| cfg.sched)?;
    // Shared with the `--stamp` reflector's thread: one whole line at a
    // time.
    let output = Mutex::new(ServerOutput::from_flags(
        cfg.json,
        cfg.iperf3_json,
        cfg.interval,
    ));
    let served = serve(&cfg, &shutdown, &output);
    if let Err(e) = &served {
        lock(&output).failed(&mut std::io::stdout().lock(), &e.to_string());
    }
    served
}

fn lock(output: &Mutex<ServerOutput>) -> std::sync::MutexGuard<'_, ServerOutput> {
    output.lock().unwrap_or_else(PoisonError::into_inner)
}

fn serve(cfg: &ServerConfig, shutdown: &Shutdown, output: &Mutex<ServerOutput>) -> Result<i32> {
    let listener = server::bind(cfg)?;
    // --stamp: the reflector's own socket, bound before anything is
    // printed, so the listening line names it.
    let reflector = cfg.stamp.as_ref().map(server::stamp::bind).transpose()?;
    let bound = &listener.bound;
    if listener.fell_back_to_ipv4 {
        eprintln!("udp_server: IPv6 is unavailable; listening on IPv4 only");
    }
    if let Some(w) = &bound.buffer.warning {
        eprintln!("udp_server: warning: {w}");
    }
    // --metrics: an HTTP endpoint on its own thread, fed by the server
    // through the board.
    let metrics = cfg
        .metrics
        .map(|addr| {
            let info = ServerInfo {
                version: env!("CARGO_PKG_VERSION"),
                method: cfg.method.name(),
                threads: bound.sockets.len(),
                recv_buffer: bound.buffer.granted as u64,
                max_peers: cfg.max_peers,
            };
            let board = Arc::new(Board::new(info, cfg.metrics_retain, cfg.max_peers));
            metrics_http::start(addr, Arc::clone(&board), shutdown.clone()).map(|e| (board, e))
        })
        .transpose()?;
    let aside = |item: &dyn netspeed::output::report::Shown| {
        lock(output).aside(&mut std::io::stdout().lock(), item)
    };
    let metrics_addr = metrics.as_ref().map(|(_, endpoint)| endpoint.addr);
    lock(output).listening(
        &mut std::io::stdout().lock(),
        &Listening {
            bound,
            cfg,
            metrics: metrics_addr,
            stamp: reflector.as_ref(),
        },
    );
    let (summary, reflected) = std::thread::scope(|scope| {
        let stamp = reflector
            .as_ref()
            .zip(cfg.stamp.as_ref())
            .map(|(l, settings)| {
                scope.spawn(move || server::stamp::run(l, settings, shutdown, &mut |r| aside(&r)))
            });
        let summary = server::run_with(
            bound,
            cfg,
            shutdown,
            &mut |event: ServerEvent| lock(output).event(&mut std::io::stdout().lock(), event),
            metrics.as_ref().map(|(board, _)| &**board),
        );
        // The endpoint and the reflector stop on the same flag (set
        // already, unless the server failed).
        shutdown.trigger();
        (summary, stamp.map(|t| t.join()))
    });
    if let Some((_, endpoint)) = metrics {
        endpoint.join();
    }
    match reflected {
        Some(Ok(report)) => aside(&report),
        Some(Err(_)) => return Err(Error::runtime("the STAMP reflector failed")),
        None => {}
    }
    Ok(lock(output).last(&mut std::io::stdout().lock(), &summary?))
}
