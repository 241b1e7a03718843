//! `udp_client -R` and `--bidir`: the server sends, this client counts.
//!
//! Why the client runs the meter's receive engine: a reverse stream must
//! be counted exactly as an upload is (batching, GRO, the socket's drop
//! counter, loss, duplicates, reordering, jitter, data after the End),
//! and [`crate::meter::receiver`] does all of it for both roles,
//! including the end-of-test exchange from the receiving side: the
//! server's End comes in, the table waits its grace period for datagrams
//! still in flight, and answers with an EndAck of what it counted. So the
//! client opens its socket, asks for the stream ([`super::start`]), and
//! runs the engine on that socket with what only this side adds: the
//! Feedback it sends every [`wire::FEEDBACK_EVERY_MS`] ms (which keeps the
//! stream, and any NAT mapping, alive), and when it stops (the End
//! answered, a stall, a signal). The roles then differ only in who speaks
//! first.

use super::start::{self, Granted};
use super::SendProgress;
use crate::config::ClientConfig;
use crate::error::{Error, Result};
use crate::meter::account::{Event, NoControl, PeerReport};
use crate::meter::receiver::{self, Pass, ReceiverConfig, Role};
use crate::shutdown::Shutdown;
use crate::stats::CpuCost;
use crate::wire;
use serde::Serialize;
use socket2::Socket;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// What the receiving client reports as it runs, to whoever shows it.
pub type ReceiveEvents<'a> = &'a (dyn Fn(&PeerReport) + Sync);

/// How long the client keeps answering after its answer to the server's
/// End: a lost EndAck makes the server ask again, every 200 ms.
pub const LINGER: Duration = Duration::from_millis(450);
/// How long the client waits for the first datagram of the stream.
pub const FIRST_DATA_WAIT: Duration = Duration::from_secs(3);
/// How long the client waits, once data has come, for more data or the
/// server's End before it gives up.
pub const STALL: Duration = Duration::from_secs(3);

/// One client's reverse stream: what it counted and what the server says
/// it sent.
#[derive(Debug, Clone, Serialize)]
pub struct ReverseStream {
    pub session: String,
    pub local_addr: String,
    /// This client's count of the stream (the receiver side).
    pub received: PeerReport,
    /// The rate the server paced at, bit/s, if any.
    pub granted_rate_bps: Option<u64>,
    /// SO_RCVBUF the kernel granted the client's socket.
    pub recv_buffer: usize,
    pub gro: bool,
    /// The server's End arrived: the sender's totals are known.
    pub answered: bool,
    /// The client's receive thread's CPU over the stream.
    pub receive_cpu: Option<CpuCost>,
    /// What the server's circuit breaker did to this stream, as its End
    /// says (absent when it did nothing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_breaker: Option<ServerBreaker>,
    /// How the server sent the stream, as its End says (absent when its
    /// End never came).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_send: Option<ServerSend>,
}

/// The server's send path for a reverse stream: the same figures as the
/// client's own `path` and `back-off` lines for an upload.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ServerSend {
    /// Data send calls ...
    pub calls: u64,
    /// ... of up to this many messages each ...
    pub batch: u64,
    /// ... each a GSO buffer of up to this many datagrams (absent: GSO off).
    pub gso_segments: Option<u64>,
    pub enobufs_retries: u64,
    pub backoff_seconds: f64,
}

impl ServerSend {
    /// What the server's End says of its sending.
    pub fn of(end: &wire::End) -> Option<ServerSend> {
        let s = end.sender?;
        Some(ServerSend {
            calls: s.calls,
            batch: s.batch,
            gso_segments: (s.gso_segments > 0).then_some(s.gso_segments),
            enobufs_retries: s.enobufs_retries,
            backoff_seconds: s.backoff_ns as f64 / 1e9,
        })
    }
}

/// The server's circuit breaker slowed the stream (this client took in
/// less than half of what was sent for a while), or stopped it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ServerBreaker {
    pub backoffs: u64,
    /// The rate it ended at, bit/s.
    pub rate_bps: Option<u64>,
    pub stopped: bool,
}

impl ServerBreaker {
    /// What the server's End says of its breaker.
    pub fn of(end: &wire::End) -> Option<ServerBreaker> {
        let s = end.sender?;
        let stopped = s.stopped & wire::STOPPED_BREAKER != 0;
        (s.breaker_backoffs > 0 || stopped).then_some(ServerBreaker {
            backoffs: s.breaker_backoffs,
            rate_bps: (s.breaker_rate_bps > 0).then_some(s.breaker_rate_bps),
            stopped,
        })
    }

    /// In words, for the verdict.
    pub fn words(&self) -> String {
        let rate = self.rate_bps.map_or_else(String::new, |r| {
            format!(" to {}", crate::units::HumanRate(r))
        });
        let slowed = format!(
            "the server's circuit breaker slowed the stream {} time{}{rate}: this client took in less than half of what was sent",
            self.backoffs,
            if self.backoffs == 1 { "" } else { "s" },
        );
        if self.stopped {
            format!("{slowed}, and then it stopped the stream")
        } else {
            slowed
        }
    }
}

const NOTHING_ARRIVED: &str = "nothing arrived";

/// What the client adds to the receive engine for one reverse stream:
/// it watches its session's counts, sends the Feedback, and stops the
/// engine once the server's End is answered (and a little after), or the
/// stream stalls, or a signal comes.
struct Receiving<'a> {
    cfg: &'a ClientConfig,
    shutdown: &'a Shutdown,
    progress: &'a dyn SendProgress,
    /// The engine's own stop flag: set here.
    stop: &'a Shutdown,
    key: (SocketAddr, u64),
    session_text: String,
    granted: Granted,
    feedback_socket: UdpSocket,
    started: Instant,
    summary: Option<PeerReport>,
    done_at: Option<Instant>,
    first_data: Option<Instant>,
    last_change: Option<Instant>,
    last_counts: (u64, u64, u64),
    feedback_seq: u64,
    last_feedback: Option<Instant>,
    gave_up: Option<&'static str>,
}

impl Receiving<'_> {
    fn send_feedback(&mut self, now: Instant, counts: (u64, u64, u64)) {
        self.feedback_seq += 1;
        let cfg = self.cfg;
        let fb = start::feedback(
            cfg,
            self.key.1,
            self.granted.stream_nonce,
            self.feedback_seq,
            counts,
        );
        let _ = match cfg.connected {
            true => self.feedback_socket.send(&fb),
            false => self.feedback_socket.send_to(&fb, cfg.server),
        };
        self.last_feedback = Some(now);
    }
}

impl Role for Receiving<'_> {
    type Control = NoControl;
    type Event = Event;

    fn after_tick(&mut self, pass: &mut Pass<'_, NoControl, Event>) {
        let now = pass.now;
        for event in pass.events.iter() {
            if let Event::Done(r) = event {
                if r.session.as_deref() == Some(self.session_text.as_str()) {
                    self.summary = Some(r.clone());
                    self.done_at.get_or_insert(now);
                }
            }
        }
        if pass.last {
            return;
        }
        let counts = pass
            .table
            .session_counts(self.key)
            .unwrap_or(self.last_counts);
        if counts != self.last_counts {
            self.progress
                .add(counts.1.saturating_sub(self.last_counts.1));
            self.first_data.get_or_insert(now);
            self.last_change = Some(now);
            self.last_counts = counts;
        }
        let feedback_due = self
            .last_feedback
            .is_none_or(|at| now >= at + Duration::from_millis(wire::FEEDBACK_EVERY_MS * 9 / 10));
        if feedback_due && self.done_at.is_none() && !self.shutdown.is_triggered() {
            self.send_feedback(now, counts);
        }
        let stalled = match (self.first_data, self.last_change) {
            (None, _) => now >= self.started + FIRST_DATA_WAIT,
            (Some(_), Some(last)) => now >= last + STALL,
            _ => false,
        };
        if self.done_at.is_some_and(|at| now >= at + LINGER) {
            self.stop.trigger();
        } else if self.shutdown.is_triggered() {
            // The server stops within its silence cut-off once the
            // Feedback stops.
            self.gave_up.get_or_insert("interrupted");
            self.stop.trigger();
        } else if stalled && self.done_at.is_none() {
            let why = if self.first_data.is_none() {
                NOTHING_ARRIVED
            } else {
                "the stream stopped without the server's End"
            };
            self.gave_up.get_or_insert(why);
            self.stop.trigger();
        }
    }
}

/// Receives one reverse stream on a socket of its own.
pub fn receive_one(
    cfg: &ClientConfig,
    shutdown: &Shutdown,
    progress: &dyn SendProgress,
    events: Option<ReceiveEvents>,
) -> Result<ReverseStream> {
    let socket = super::open_socket(cfg.server, cfg.connected, false, cfg.bind)?;
    let local_addr = socket
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let session = crate::auth::random_u64();
    let feedback_socket = socket
        .try_clone()
        .map_err(|e| Error::runtime(format!("cannot share the client socket: {e}")))?;
    let granted: Granted = start::request_stream(&socket, cfg, session, shutdown)?;
    let _ = socket.set_read_timeout(None);
    let bound = receiver::adopt(
        vec![Socket::from(socket)],
        Some(cfg.recv_buffer_size),
        cfg.gro && crate::sys::LINUX_SOCKETS,
    )?;
    let receiver_cfg = ReceiverConfig {
        method: crate::meter::recv::Method::default_for_platform(),
        interval: events.and(cfg.interval),
        // Longer than the server's silence cut-off and End retries: the
        // table must not give up on a stream the server still sends.
        idle_timeout: STALL,
        max_peers: 64,
        end_grace: crate::config::DEFAULT_END_GRACE,
        psk: cfg.psk.clone(),
        // The stream this client asked for: proven by asking.
        expected: vec![(cfg.server, session)],
    };
    let stop = Shutdown::new();
    let mut receiving = Receiving {
        cfg,
        shutdown,
        progress,
        stop: &stop,
        key: (crate::sys::canonical_addr(cfg.server), session),
        session_text: format!("{session:016x}"),
        granted,
        feedback_socket,
        started: Instant::now(),
        summary: None,
        done_at: None,
        first_data: None,
        last_change: None,
        last_counts: (0, 0, 0),
        feedback_seq: 0,
        last_feedback: None,
        gave_up: None,
    };
    let session_text = receiving.session_text.clone();
    let summary = receiver::run(
        &bound,
        &receiver_cfg,
        NoControl,
        &mut receiving,
        &stop,
        &mut |event| {
            if let (Event::Interval(r), Some(show)) = (&event, events) {
                if r.session.as_deref() == Some(session_text.as_str()) {
                    show(r);
                }
            }
        },
    )?;
    let received = match (receiving.summary, receiving.gave_up) {
        (Some(r), _) => r,
        (None, Some(NOTHING_ARRIVED)) => {
            return Err(Error::runtime(format!(
                "the udp_server at {} accepted the reverse stream, but nothing arrived within {} s: a firewall or NAT in front of this host may drop what the server sends",
                cfg.server,
                FIRST_DATA_WAIT.as_secs()
            )))
        }
        (None, why) => {
            return Err(Error::runtime(format!(
                "the reverse stream from {} ended without a count: {}",
                cfg.server,
                why.unwrap_or("no answer")
            )))
        }
    };
    let answered = received.declared.is_some();
    Ok(ReverseStream {
        session: session_text,
        local_addr,
        granted_rate_bps: granted.rate_bps,
        recv_buffer: bound.buffer.granted,
        gro: bound.gro,
        answered,
        // The receive thread's CPU over the stream, as the table measured
        // it for the session; over the whole run where it could not.
        receive_cpu: received.cpu.or(summary.receive_cpu),
        server_breaker: received.declared.as_ref().and_then(ServerBreaker::of),
        server_send: received.declared.as_ref().and_then(ServerSend::of),
        received,
    })
}

/// Runs `cfg.clients` reverse streams at once.
pub fn receive(
    cfg: &ClientConfig,
    shutdown: &Shutdown,
    progress: &dyn SendProgress,
    events: Option<ReceiveEvents>,
) -> Result<Vec<ReverseStream>> {
    let results: Vec<Result<ReverseStream>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..cfg.clients)
            .map(|_| scope.spawn(|| receive_one(cfg, shutdown, progress, events)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::runtime("a receiving thread panicked")))
            })
            .collect()
    });
    results.into_iter().collect()
}
