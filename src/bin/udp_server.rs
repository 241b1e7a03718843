//! udp_server: counts what each peer sends and reports it. See `--help`.

use clap::CommandFactory;
use netspeed::config::{ServerArgs, ServerConfig};
use netspeed::error::Result;
use netspeed::output::report::server::{Listening, ServerOutput};
use netspeed::output::{metrics_http, run_binary, start};
use netspeed::server::metrics::{Board, ServerInfo};
use netspeed::server::{self, ServerEvent};
use netspeed::shutdown::Shutdown;
use std::sync::Arc;

fn main() {
    run_binary(ServerArgs::command, run);
}

fn run() -> Result<i32> {
    let (cfg, shutdown) = start(ServerConfig::from_args, |cfg| cfg.sched)?;
    let mut output = ServerOutput::from_flags(cfg.json, cfg.iperf3_json, cfg.interval);
    let served = serve(&cfg, &shutdown, &mut output);
    if let Err(e) = &served {
        output.failed(&mut std::io::stdout().lock(), &e.to_string());
    }
    served
}

fn serve(cfg: &ServerConfig, shutdown: &Shutdown, output: &mut ServerOutput) -> Result<i32> {
    let listener = server::bind(cfg)?;
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
    let mut out = std::io::stdout().lock();
    let metrics_addr = metrics.as_ref().map(|(_, endpoint)| endpoint.addr);
    output.listening(
        &mut out,
        &Listening {
            bound,
            cfg,
            metrics: metrics_addr,
        },
    );
    let summary = server::run_with(
        bound,
        cfg,
        shutdown,
        &mut |event: ServerEvent| output.event(&mut out, event),
        metrics.as_ref().map(|(board, _)| &**board),
    );
    // The endpoint stops on the same flag (set already, unless the server
    // failed).
    shutdown.trigger();
    if let Some((_, endpoint)) = metrics {
        endpoint.join();
    }
    Ok(output.last(&mut out, &summary?))
}
