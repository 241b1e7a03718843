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
        // The server a user tuning this host would run: the default
        // buffer (the largest the system allows, up to 16 MiB), and a
        // receive thread per client as far as the cores go once the
        // senders have theirs.
        recv_buffer_size: None,
        threads: receive_threads(cfg.clients, cores()),
        ..Default::default()
    };
    let bound = crate::server::bind(&server_cfg)?.bound;
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

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The in-process server's receive threads (SO_REUSEPORT sockets) for
/// `clients` senders on `cores`: one per client while half the cores are
/// left for the senders, at least one. More threads than clients would
/// idle (the kernel spreads flows, not datagrams); more than half the cores
/// would take them from the senders they measure.
pub fn receive_threads(clients: usize, cores: usize) -> usize {
    clients.min(cores / 2).max(1)
}

#[cfg(test)]
mod tests {
    use super::receive_threads;

    #[test]
    fn receive_threads_leave_the_senders_half_the_cores() {
        assert_eq!(receive_threads(1, 2), 1);
        assert_eq!(receive_threads(4, 2), 1);
        assert_eq!(receive_threads(4, 8), 4);
        assert_eq!(receive_threads(16, 8), 4);
        assert_eq!(receive_threads(1, 1), 1);
        assert_eq!(receive_threads(3, 64), 3);
    }
}
