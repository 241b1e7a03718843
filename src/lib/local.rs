//! `udp_client --local`: a client and a silent server in one process, the
//! server on an ephemeral loopback port. It lives above both roles so that
//! neither imports the other.

use crate::client::{RunReport, SendProgress};
use crate::config::{ClientConfig, ServerConfig};
use crate::error::Result;
use crate::server::ServerEvent;
use crate::shutdown::Shutdown;
use std::net::{Ipv4Addr, SocketAddr};

/// What the in-process server reports while it runs, to whoever shows it.
pub type ServerEvents<'a> = &'a (dyn Fn(&ServerEvent) + Sync);

/// `--local`: starts an in-process server on an ephemeral loopback port,
/// runs the clients against it, then stops the server. With
/// `server_events`, the server reports every `cfg.interval` to it (the
/// receiver side of each interval); without, it is silent.
pub fn run_local(
    cfg: &ClientConfig,
    shutdown: &Shutdown,
    progress: &dyn SendProgress,
    server_events: Option<ServerEvents>,
) -> Result<RunReport> {
    with_local_server(cfg, server_events, |cfg| {
        crate::client::run_with_progress(cfg, shutdown, progress)
    })
}

/// Starts an in-process server on an ephemeral loopback port (silent
/// unless `server_events` is given), calls `f` with `cfg` pointed at it,
/// then stops the server.
pub fn with_local_server<T>(
    cfg: &ClientConfig,
    server_events: Option<ServerEvents>,
    f: impl FnOnce(&ClientConfig) -> Result<T>,
) -> Result<T> {
    let server_cfg = ServerConfig {
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        listen_is_default: false,
        interval: server_events.and(cfg.interval),
        // A generous buffer, as a user tuning a real server would set.
        recv_buffer_size: Some(4 << 20),
        ..Default::default()
    };
    let bound = crate::server::bind(&server_cfg)?;
    let mut cfg = cfg.clone();
    cfg.server = bound.addr;
    let server_stop = Shutdown::new();
    std::thread::scope(|scope| {
        let server = scope.spawn(|| {
            crate::server::run(&bound, &server_cfg, &server_stop, &mut |event| {
                if let Some(show) = server_events {
                    show(&event);
                }
            })
        });
        let result = f(&cfg);
        server_stop.trigger();
        let _ = server.join();
        result
    })
}
