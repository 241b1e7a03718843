//! `udp_server`: receive, count per peer, report.
//!
//! [`bind`] makes the socket (dual-stack by default) and sizes its receive
//! buffer; [`run`] takes that bound socket, a config and a shutdown flag,
//! and reports through a callback until the flag is set. Printing is the
//! caller's business (see [`crate::output::report`]), which is what lets
//! `udp_client --local` run a silent server in-process.
//!
//! The counting is the meter's receive engine ([`receiver`]): one thread
//! per socket (`--threads N` sockets share the address with
//! SO_REUSEPORT), each with the `--method` chosen, counting into one
//! table. The server composes it with what only a server does: reverse
//! streams for the sessions that proved their address ([`reverse`],
//! sent by [`reverse::send`]), the socket's totals ([`total`]) and what
//! `--metrics` exposes ([`metrics`]).

pub mod metrics;
pub mod probe;
pub mod reverse;
pub mod stamp;
pub mod total;

use crate::config::ServerConfig;
use crate::error::{Error, Result};
use crate::meter::account::{ConflictReport, Event, LateReport, PeerReport, VersionReport};
use crate::meter::receiver::{self, Bound, Gauges, Pass, ReceiverConfig, ReceiverSummary, Role};
use crate::shutdown::Shutdown;
use reverse::send::{self, StreamOrder, StreamResult};
use reverse::{Reverse, SessionKey, StreamEnd, StreamInterval, StreamReport};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::mpsc;
use std::thread::{Scope, ScopedJoinHandle};
use total::{Counters, TotalMeter, TotalReport};

/// The server's bound sockets, and how their address was chosen.
pub struct Listener {
    pub bound: Bound,
    /// Set when the default dual-stack address was unavailable.
    pub fell_back_to_ipv4: bool,
}

fn new_socket(addr: SocketAddr, reuse_port: bool) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        socket.set_only_v6(false)?;
    }
    if reuse_port {
        crate::sys::set_reuse_port(&socket)?;
    }
    Ok(socket)
}

fn bind_one(addr: SocketAddr, reuse_port: bool) -> io::Result<Socket> {
    let socket = new_socket(addr, reuse_port)?;
    socket.bind(&SockAddr::from(addr))?;
    Ok(socket)
}

/// Creates and binds the server sockets and sizes their receive buffers.
pub fn bind(cfg: &ServerConfig) -> Result<Listener> {
    // A receive method this platform lacks is a usage error (exit 2).
    cfg.method.check_available()?;
    let reuse = cfg.threads > 1;
    let mut addr = cfg.listen;
    let mut fell_back = false;
    let first = match bind_one(addr, reuse) {
        Ok(s) => s,
        Err(e)
            if cfg.listen_is_default && addr.is_ipv6() && e.kind() != io::ErrorKind::AddrInUse =>
        {
            addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()));
            fell_back = true;
            bind_one(addr, reuse).map_err(|e| Error::runtime(format!("cannot bind {addr}: {e}")))?
        }
        Err(e) => return Err(Error::runtime(format!("cannot bind {addr}: {e}"))),
    };
    let addr = first
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or_else(|| Error::runtime("cannot read the bound address"))?;
    let mut sockets = vec![first];
    // The others join the address actually bound (port 0 resolved).
    for _ in 1..cfg.threads {
        sockets.push(bind_one(addr, true).map_err(|e| {
            Error::runtime(format!(
                "cannot bind another SO_REUSEPORT socket to {addr}: {e}"
            ))
        })?);
    }
    Ok(Listener {
        bound: receiver::adopt(sockets, cfg.recv_buffer_size, cfg.gro)?,
        fell_back_to_ipv4: fell_back,
    })
}

/// What the server reports as it runs.
#[derive(Debug, Clone)]
pub enum ServerEvent {
    Interval(PeerReport),
    PeerDone(PeerReport),
    /// Datagrams arrived for a session after it had finished.
    Late(LateReport),
    /// A session's End is contradicted: a forged End, or a confused client.
    Conflict(ConflictReport),
    /// A source sent datagrams of another version of netspeed.
    WrongVersion(VersionReport),
    /// A reverse stream (the server sent) finished.
    StreamDone(StreamReport),
    /// An interval of a reverse stream that is sending.
    StreamInterval(StreamInterval),
    /// The receive socket(s) as a whole, after each interval's lines and
    /// when a burst ends ([`total`]).
    Total(TotalReport),
}

impl From<Event> for ServerEvent {
    fn from(e: Event) -> Self {
        match e {
            Event::Interval(r) => ServerEvent::Interval(r),
            Event::Done(r) => ServerEvent::PeerDone(r),
            Event::Late(r) => ServerEvent::Late(r),
            Event::Conflict(r) => ServerEvent::Conflict(r),
            Event::WrongVersion(r) => ServerEvent::WrongVersion(r),
        }
    }
}

/// Totals over the server's whole run: the receive engine's.
pub type ServerSummary = ReceiverSummary;

/// What ends a `--one-off` server: every session of the first udp_client
/// run finished because its End arrived and was answered (uploads), or
/// its client answered the stream's End (reverse streams). A run says in
/// each Hello and Start how many sessions it has (`-P N`, both halves of
/// `--bidir`). Untagged sources, sessions that went idle or were evicted,
/// late and conflict reports do not count: a port scan or a client that
/// died mid-test leaves the server waiting for a real test.
#[derive(Debug, Default)]
struct OneOff {
    /// The first run served, and how many of its sessions are done.
    run: Option<crate::wire::Run>,
    served: u64,
}

impl OneOff {
    /// Whether `event` completes the first run.
    fn completes(&mut self, event: &ServerEvent) -> bool {
        let run = match event {
            ServerEvent::PeerDone(r)
                if r.tagged && r.reason == Some(crate::meter::account::DoneReason::End) =>
            {
                r.run
            }
            ServerEvent::StreamDone(r) if r.reason == StreamEnd::Answered => r.run,
            _ => return false,
        };
        // A session that named no run is a run of its own.
        let run = run
            .filter(|r| r.id != 0)
            .unwrap_or(crate::wire::Run { id: 0, clients: 1 });
        let first = *self.run.get_or_insert(run);
        if run.id == first.id {
            self.served += 1;
        }
        self.served >= first.clients.max(1)
    }
}

/// Hands every `peer_done` among `pending` (each is there for one pass of
/// the finalising loop) to the metrics board.
fn record_finished(board: Option<&metrics::Board>, pending: &[ServerEvent]) {
    let Some(board) = board else { return };
    for event in pending {
        match event {
            ServerEvent::PeerDone(r) => board.finished(r),
            ServerEvent::StreamDone(r) => board.finished_sample(metrics::PeerSample::of_stream(
                r.peer.clone(),
                r.session.clone(),
                r.sent_bytes,
                r.received.as_ref().map(|c| (c.packets, c.bytes)),
                true,
            )),
            _ => {}
        }
    }
}

/// A reverse stream whose sending thread returned, and how its sending
/// ended.
type Sent = (SessionKey, StreamResult);

/// What the server adds to the receive engine: reverse streams, the
/// socket's totals and `--metrics`.
struct Server<'a, 'scope, 'env> {
    bound: &'scope Bound,
    board: Option<&'a metrics::Board>,
    cfg: &'a ServerConfig,
    /// Made when the engine starts, from its first figures.
    total: Option<TotalMeter>,
    /// Streams to start once the table's lock is released.
    launches: Vec<StreamOrder>,
    scope: &'scope Scope<'scope, 'env>,
    senders: Vec<ScopedJoinHandle<'scope, ()>>,
    /// Each sending thread hands its result here when it returns.
    sent: (mpsc::Sender<Sent>, mpsc::Receiver<Sent>),
}

impl Server<'_, '_, '_> {
    /// Hands the reverse streams' news to the table: threads that
    /// returned (their End goes out), deadlines passed (silence,
    /// --max-duration, End retries), reports finished.
    fn drive_streams(&mut self, pass: &mut Pass<'_, Reverse, ServerEvent>) {
        let reverse = &mut *pass.control;
        for (key, result) in self.sent.1.try_iter() {
            reverse.sent(key, result, pass.now, pass.replies);
        }
        reverse.tick(pass.now, pass.replies);
        pass.events.extend(
            reverse
                .take_last_intervals()
                .into_iter()
                .map(ServerEvent::StreamInterval),
        );
        pass.events
            .extend(reverse.take_done().into_iter().map(ServerEvent::StreamDone));
    }

    /// A `total` of the span since the last one, when it has something
    /// to say (`last`: the server's very last).
    fn total(&mut self, pass: &mut Pass<'_, Reverse, ServerEvent>) {
        let Some(meter) = self.total.as_mut() else {
            return;
        };
        meter.observe(pass.events);
        let active = if pass.last {
            0
        } else {
            pass.table.active_peers() as u64
        };
        let burst_end = pass.last || meter.burst_ended(active);
        let counters = Counters::of(
            &pass.table.totals,
            pass.gauges.socket_drops(pass.table),
            pass.gauges.receive_cpu(),
        );
        let due = if pass.last {
            meter.worth(0, &counters)
        } else {
            burst_end
                || (pass.ticked
                    && meter.worth(active, &counters)
                    && !meter.quiet(active, &counters))
        };
        if due {
            let at = total::Now {
                at: pass.now,
                active,
                counters,
                buffer_peak: pass.gauges.take_buffer_peak(),
            };
            pass.events
                .push(ServerEvent::Total(meter.take(at, burst_end)));
        }
    }

    /// A snapshot for `--metrics`, when a scrape asked for one.
    fn publish(&self, pass: &Pass<'_, Reverse, ServerEvent>) {
        let Some(board) = self.board.filter(|b| b.take_wanted()) else {
            return;
        };
        board.publish(metrics::Live {
            peers: pass
                .table
                .live_reports()
                .iter()
                .map(|r| metrics::PeerSample::of(r, false))
                .chain(pass.control.live().into_iter().map(|s| {
                    metrics::PeerSample::of_stream(
                        s.peer.to_string(),
                        format!("{:016x}", s.session),
                        s.sent_bytes,
                        Some((s.received_packets, s.received_bytes)),
                        false,
                    )
                }))
                .collect(),
            server: metrics::ServerSample {
                recv_buffer_most: pass.gauges.buffer_most(),
                ..metrics::ServerSample::of(
                    &pass.table.totals,
                    pass.gauges.socket_drops(pass.table),
                    pass.gauges.receive_cpu(),
                )
            },
        });
    }
}

impl<'scope> Role for Server<'_, 'scope, '_> {
    type Control = Reverse;
    type Event = ServerEvent;

    fn start(&mut self, epoch: std::time::Instant, gauges: &Gauges) {
        self.total = Some(
            TotalMeter::new(
                epoch,
                self.cfg.interval.is_some(),
                self.bound.buffer.granted as u64,
                Counters {
                    // Known to be counted (0 until the first report) where
                    // every socket has the counter.
                    drops: gauges.drops_supported().then_some(0),
                    cpu: gauges.receive_cpu(),
                    ..Counters::default()
                },
            )
            .on_threads(gauges.threads()),
        );
    }

    fn before_tick(&mut self, pass: &mut Pass<'_, Reverse, ServerEvent>) {
        if pass.stopping {
            pass.control.stop_all();
        }
        self.drive_streams(pass);
        let launches = pass.control.take_launches();
        // No stream starts once the server is stopping.
        if !pass.stopping {
            self.launches = launches;
        }
    }

    fn after_tick(&mut self, pass: &mut Pass<'_, Reverse, ServerEvent>) {
        let stream_intervals = if pass.ticked {
            pass.control.intervals(pass.now)
        } else {
            Vec::new()
        };
        self.total(pass);
        pass.events.extend(
            stream_intervals
                .into_iter()
                .map(ServerEvent::StreamInterval),
        );
        // A peer finished in this pass has left the live table: it joins
        // the retained set now, before any snapshot, so no scrape misses it.
        record_finished(self.board, pass.events);
        if !pass.last {
            self.publish(pass);
        }
    }

    fn next_due(&self, reverse: &Reverse) -> Option<std::time::Instant> {
        reverse.next_due()
    }

    /// Starts the threads that send the streams granted in this pass,
    /// each through a copy of the receive socket its Start came in on (the
    /// same port, so the stream leaves from where the client sent).
    fn after_pass(&mut self) {
        for order in self.launches.drain(..) {
            let main = std::thread::current();
            let done = self.sent.0.clone();
            let socket = self
                .bound
                .sockets
                .get(order.socket)
                .or(self.bound.sockets.first())
                .expect("at least one socket")
                .try_clone()
                .map(std::net::UdpSocket::from);
            self.senders.push(self.scope.spawn(move || {
                let result = match socket {
                    Ok(socket) => send::run(&socket, &order),
                    Err(e) => send::failed(format!("cannot share the server socket: {e}")),
                };
                order.control.stop.trigger();
                let _ = done.send((order.key, result));
                main.unpark();
            }));
        }
    }

    /// Every sending thread has returned (they were told to stop): their
    /// Ends go out once, and every stream left is reported.
    fn finish(&mut self, pass: &mut Pass<'_, Reverse, ServerEvent>) {
        for sender in self.senders.drain(..) {
            let _ = sender.join();
        }
        self.drive_streams(pass);
        pass.events.extend(
            pass.control
                .finish_all()
                .into_iter()
                .map(ServerEvent::StreamDone),
        );
    }
}

/// Receives and counts until `shutdown` is set, reporting through `events`
/// from the calling thread. Receive threads do the counting; this thread
/// writes interval lines, finalises sessions (sending their answers),
/// expires idle peers and passes events on.
pub fn run(
    bound: &Bound,
    cfg: &ServerConfig,
    shutdown: &Shutdown,
    events: &mut dyn FnMut(ServerEvent),
) -> Result<ServerSummary> {
    run_with(bound, cfg, shutdown, events, None)
}

/// [`run`], also publishing to `board` for `--metrics`: a snapshot when a
/// scrape asks for one (taken on the finalising thread, not on the
/// receive threads), and every `peer_done` report as it is passed on.
pub fn run_with(
    bound: &Bound,
    cfg: &ServerConfig,
    shutdown: &Shutdown,
    events: &mut dyn FnMut(ServerEvent),
    board: Option<&metrics::Board>,
) -> Result<ServerSummary> {
    if let Some(board) = board {
        board.attach();
    }
    let start = std::time::Instant::now();
    let reverse =
        Reverse::with_fresh_cookies(cfg.streams, cfg.psk.clone(), start, cfg.interval.is_some());
    let receiver_cfg = ReceiverConfig {
        method: cfg.method,
        interval: cfg.interval,
        max_peers: cfg.max_peers,
        idle_timeout: cfg.idle_timeout,
        end_grace: cfg.end_grace,
        psk: cfg.psk.clone(),
        expected: Vec::new(),
    };
    let summary = std::thread::scope(|scope| {
        let mut server = Server {
            bound,
            board,
            cfg,
            total: None,
            launches: Vec::new(),
            scope,
            senders: Vec::new(),
            sent: mpsc::channel(),
        };
        let mut one_off = OneOff::default();
        receiver::run(
            bound,
            &receiver_cfg,
            reverse,
            &mut server,
            shutdown,
            &mut |event| {
                // --one-off stops through the same flag as Ctrl-C, once the
                // run's last answer is sent and its summary out.
                let served = cfg.one_off && one_off.completes(&event);
                events(event);
                if served {
                    shutdown.trigger();
                }
            },
        )
    });
    if let Some(board) = board {
        board.detach();
    }
    summary
}
