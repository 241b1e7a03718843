//! udp_server: counts what each peer sends and reports it. See `--help`.

use clap::CommandFactory;
use netspeed::config::{ServerArgs, ServerConfig};
use netspeed::error::Result;
use netspeed::output::report::server::Listening;
use netspeed::output::report::Shown;
use netspeed::output::{metrics_http, run_binary, start, Format};
use netspeed::server::metrics::{Board, ServerInfo};
use netspeed::server::{self, ServerEvent};
use std::io::Write;
use std::sync::Arc;

fn main() {
    run_binary(ServerArgs::command, run);
}

fn run() -> Result<()> {
    let (cfg, shutdown) = start(ServerConfig::from_args, |cfg| cfg.sched)?;
    let listener = server::bind(&cfg)?;
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
    let format = Format::from_flags(cfg.json);
    // Lines from the server and the reflector's thread, one whole line at
    // a time.
    let print = |item: &dyn Shown| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", format.show(item));
        let _ = out.flush();
    };
    let metrics_addr = metrics.as_ref().map(|(_, endpoint)| endpoint.addr);
    print(&Listening {
        bound,
        cfg: &cfg,
        metrics: metrics_addr,
        stamp: reflector.as_ref(),
    });
    let (summary, reflected) = std::thread::scope(|scope| {
        let stamp = reflector
            .as_ref()
            .zip(cfg.stamp.as_ref())
            .map(|(l, settings)| {
                let shutdown = &shutdown;
                scope.spawn(move || server::stamp::run(l, settings, shutdown, &mut |r| print(&r)))
            });
        let summary = server::run_with(
            bound,
            &cfg,
            &shutdown,
            &mut |event: ServerEvent| print(&event),
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
    if let Some(reflected) = reflected {
        match reflected {
            Ok(report) => print(&report),
            Err(_) => {
                return Err(netspeed::error::Error::runtime(
                    "the STAMP reflector failed",
                ))
            }
        }
    }
    print(&summary?);
    Ok(())
}
