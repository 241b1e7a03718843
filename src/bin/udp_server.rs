//! udp_server: counts what each peer sends and reports it. See `--help`.

use clap::CommandFactory;
use netspeed::config::{ServerArgs, ServerConfig};
use netspeed::error::Result;
use netspeed::output::{report, run_binary, start};
use netspeed::server::{self, ServerEvent};
use std::io::Write;

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
    let json = cfg.json;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", report::listening(&bound, &cfg, json));
    let _ = out.flush();
    let summary = server::run(&bound, &cfg, &shutdown, &mut |event| {
        let line = match &event {
            ServerEvent::Interval(r) => report::interval(r, json),
            ServerEvent::PeerDone(r) => report::peer_done(r, json),
            ServerEvent::Late(r) => report::late(r, json),
            ServerEvent::Conflict(r) => report::conflict(r, json),
        };
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    })?;
    let _ = writeln!(out, "{}", report::server_summary(&summary, json));
    Ok(())
}
