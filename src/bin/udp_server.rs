//! udp_server: counts what each peer sends and reports it. See `--help`.

use netspeed::config::{parse_args, ServerArgs, ServerConfig};
use netspeed::error::{Error, Result};
use netspeed::output::{exit_with, report};
use netspeed::server::{self, ServerEvent};
use netspeed::shutdown::Shutdown;
use std::io::Write;

fn main() {
    if let Err(e) = run() {
        exit_with(&e);
    }
}

fn run() -> Result<()> {
    let args: ServerArgs = parse_args(std::env::args_os())?;
    let cfg = ServerConfig::from_args(args)?;
    let shutdown = Shutdown::on_signals()
        .map_err(|e| Error::runtime(format!("cannot install signal handlers: {e}")))?;
    if let Some(sched) = cfg.sched {
        netspeed::sys::apply_scheduler(sched.policy, sched.priority)?;
    }
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
