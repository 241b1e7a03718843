//! udp_server: counts what each peer sends and reports it. See `--help`.

use clap::CommandFactory;
use netspeed::config::{ServerArgs, ServerConfig};
use netspeed::error::Result;
use netspeed::output::{metrics, report, run_binary, start};
use netspeed::server::metrics::{Board, ServerInfo};
use netspeed::server::{self, ServerEvent};
use std::io::Write;
use std::sync::Arc;

fn main() {
    run_binary(ServerArgs::command, run);
}

fn run() -> Result<()> {
    let (cfg, shutdown) = start(ServerConfig::from_args, |cfg| cfg.sched)?;
    let bound = server::bind(&cfg)?;
    if bound.fell_back_to_ipv4 {
        eprintln!("udp_server: IPv6 is unavailable; listening on IPv4 only");
    }
    if let Some(w) = &bound.buffer.warning {
        eprintln!("udp_server: warning: {w}");
    }
    // --metrics: an HTTP endpoint on its own thread, fed by the server.
    let board = cfg.metrics.map(|_| {
        let info = ServerInfo {
            version: env!("CARGO_PKG_VERSION"),
            method: cfg.method.name(),
            threads: bound.sockets.len(),
            recv_buffer: bound.buffer.granted as u64,
            max_peers: cfg.max_peers,
        };
        Arc::new(Board::new(info, cfg.metrics_retain, cfg.max_peers))
    });
    let endpoint = match (cfg.metrics, &board) {
        (Some(addr), Some(board)) => {
            Some(metrics::start(addr, Arc::clone(board), shutdown.clone())?)
        }
        _ => None,
    };
    let json = cfg.json;
    let mut out = std::io::stdout().lock();
    let metrics_addr = endpoint.as_ref().map(|e| e.addr);
    let _ = writeln!(
        out,
        "{}",
        report::listening_with_metrics(&bound, &cfg, metrics_addr, json)
    );
    let _ = out.flush();
    let summary = server::run_with(
        &bound,
        &cfg,
        &shutdown,
        &mut |event| {
            let line = match &event {
                ServerEvent::Interval(r) => report::interval(r, json),
                ServerEvent::PeerDone(r) => report::peer_done(r, json),
                ServerEvent::Late(r) => report::late(r, json),
                ServerEvent::Conflict(r) => report::conflict(r, json),
            };
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        },
        board.as_deref(),
    );
    // The endpoint stops on the same flag (set already, unless the server
    // failed).
    shutdown.trigger();
    if let Some(endpoint) = endpoint {
        endpoint.join();
    }
    let _ = writeln!(out, "{}", report::server_summary(&summary?, json));
    Ok(())
}
