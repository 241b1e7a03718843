//! `udp_client -R` and `--bidir`: the server sends, this client counts.
//!
//! Why the client runs the server's own receive engine: a reverse stream
//! must be counted exactly as an upload is (batching, GRO, the socket's
//! drop counter, loss, duplicates, reordering, jitter, data after the
//! End), and the server's table already does all of it, including the
//! end-of-test exchange from the receiving side: the server's End comes
//! in, the table waits its grace period for datagrams still in flight,
//! and answers with an EndAck of what it counted. So the client opens its
//! socket, asks for the stream ([`crate::client::start`]), and hands the
//! socket to [`crate::server::run_with`], whose finalising thread sends
//! the Feedback (every [`wire::FEEDBACK_EVERY_MS`] ms) that keeps the
//! stream, and any NAT mapping, alive. The roles then differ only in who
//! speaks first. This module composes the two, so it lives above both
//! (as [`crate::local`] does).

use crate::client::limit::TrialRun;
use crate::client::start::{self, Granted};
use crate::client::verdict::{self, Cap, ReceiverFacts, Verdict};
use crate::client::{self, NoProgress, RunReport, SendProgress};
use crate::config::{ClientConfig, ServerConfig, StreamCaps, Traffic};
use crate::error::{Error, Result};
use crate::latency::Latency;
use crate::meter::account::PeerReport;
use crate::server::{self, ServerEvent};
use crate::shutdown::Shutdown;
use crate::stats::delay::QueueFigures;
use crate::stats::{self, CpuCost, CpuTime};
use crate::wire::{self, Direction};
use serde::Serialize;
use socket2::Socket;
use std::cell::RefCell;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// What the receiving client reports as it runs, to whoever shows it.
pub type ReceiveEvents<'a> = &'a (dyn Fn(&ServerEvent) + Sync);

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
pub struct Download {
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
}

/// One side of a stream, as the `streams` array shows it.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, Serialize)]
pub struct Side {
    pub packets: u64,
    pub bytes: u64,
    pub seconds: f64,
    #[serialize_always]
    pub gbps: Option<f64>,
    pub lost_packets: Option<u64>,
    pub duplicates: Option<u64>,
    pub reordered: Option<u64>,
    pub kernel_drops: Option<u64>,
    pub jitter_ms: Option<f64>,
    pub cpu: Option<CpuCost>,
}

/// One direction of a run, its sender's side and its receiver's.
#[derive(Debug, Clone, Serialize)]
pub struct Stream {
    pub direction: Direction,
    pub sender: Side,
    /// None when the receiver's count never came (no answer).
    pub receiver: Option<Side>,
    /// What capped this direction, and what to try.
    pub limited_by: Verdict,
    /// Delay under load: this direction's queue delay, and the round
    /// trips of the probes beside the load (`crate::latency`).
    pub latency: Latency,
}

/// A run with `-R` or `--bidir`.
#[derive(Debug, Clone, Serialize)]
pub struct DuplexReport {
    /// One per direction: `client_to_server` first.
    pub streams: Vec<Stream>,
    /// The upload half of `--bidir`, as a plain upload reports it.
    pub upload: Option<RunReport>,
    /// Each client's reverse stream.
    pub downloads: Vec<Download>,
    /// A signal cut the run short (absent when it ran to its end).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<client::Interrupted>,
}

impl DuplexReport {
    /// 0, or [`client::EXIT_NO_ANSWER`] when a side's count is missing.
    pub fn exit_code(&self) -> i32 {
        let upload = self.upload.as_ref().map_or(0, |u| u.exit_code());
        if upload != 0 {
            upload
        } else if self.downloads.iter().any(|d| !d.answered) {
            client::EXIT_NO_ANSWER
        } else {
            0
        }
    }
}

const NOTHING_ARRIVED: &str = "nothing arrived";

/// What the watch over one reverse stream has seen.
#[derive(Default)]
struct Watched {
    summary: Option<PeerReport>,
    done_at: Option<Instant>,
    first_data: Option<Instant>,
    last_change: Option<Instant>,
    last_counts: (u64, u64, u64),
    feedback_seq: u64,
    last_feedback: Option<Instant>,
    gave_up: Option<&'static str>,
}

/// Receives one reverse stream on a socket of its own.
pub fn receive_one(
    cfg: &ClientConfig,
    shutdown: &Shutdown,
    progress: &dyn SendProgress,
    events: Option<ReceiveEvents>,
) -> Result<Download> {
    let socket = client::open_socket(cfg.server, cfg.connected, false, cfg.bind)?;
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
    let bound = server::adopt(
        vec![Socket::from(socket)],
        Some(cfg.recv_buffer_size),
        crate::sys::LINUX_SOCKETS,
    )?;
    let receiver_cfg = ServerConfig {
        listen: bound.addr,
        listen_is_default: false,
        interval: events.and(cfg.interval),
        // Longer than the server's silence cut-off and End retries: the
        // table must not give up on a stream the server still sends.
        idle_timeout: STALL,
        max_peers: 64,
        psk: cfg.psk.clone(),
        gro: bound.gro,
        streams: StreamCaps {
            max_streams: 0,
            ..StreamCaps::default()
        },
        ..ServerConfig::default()
    };
    let key: (SocketAddr, u64) = (crate::sys::canonical_addr(cfg.server), session);
    let session_text = format!("{session:016x}");
    let stop = Shutdown::new();
    let started = Instant::now();
    let watched = RefCell::new(Watched::default());
    let mut on_event = |event: ServerEvent| {
        let ours = |r: &PeerReport| r.session.as_deref() == Some(session_text.as_str());
        match &event {
            ServerEvent::PeerDone(r) if ours(r) => {
                let mut w = watched.borrow_mut();
                w.summary = Some(r.clone());
                w.done_at.get_or_insert(Instant::now());
            }
            ServerEvent::Interval(r) if ours(r) => {
                if let Some(show) = events {
                    show(&event);
                }
            }
            _ => {}
        }
    };
    let mut watch = |table: &crate::meter::account::PeerTable, now: Instant| {
        let mut w = watched.borrow_mut();
        let counts = table.session_counts(key).unwrap_or(w.last_counts);
        if counts != w.last_counts {
            progress.add(counts.1.saturating_sub(w.last_counts.1));
            w.first_data.get_or_insert(now);
            w.last_change = Some(now);
            w.last_counts = counts;
        }
        let feedback_due = w
            .last_feedback
            .is_none_or(|at| now >= at + Duration::from_millis(wire::FEEDBACK_EVERY_MS * 9 / 10));
        if feedback_due && w.done_at.is_none() && !shutdown.is_triggered() {
            w.feedback_seq += 1;
            let fb = start::feedback(cfg, session, granted.stream_nonce, w.feedback_seq, counts);
            let _ = match cfg.connected {
                true => feedback_socket.send(&fb),
                false => feedback_socket.send_to(&fb, cfg.server),
            };
            w.last_feedback = Some(now);
        }
        let stalled = match (w.first_data, w.last_change) {
            (None, _) => now >= started + FIRST_DATA_WAIT,
            (Some(_), Some(last)) => now >= last + STALL,
            _ => false,
        };
        if w.done_at.is_some_and(|at| now >= at + LINGER) {
            stop.trigger();
        } else if shutdown.is_triggered() {
            // The server stops within its silence cut-off once the
            // Feedback stops.
            w.gave_up.get_or_insert("interrupted");
            stop.trigger();
        } else if stalled && w.done_at.is_none() {
            let why = if w.first_data.is_none() {
                NOTHING_ARRIVED
            } else {
                "the stream stopped without the server's End"
            };
            w.gave_up.get_or_insert(why);
            stop.trigger();
        }
    };
    let summary = server::run_with(
        &bound,
        &receiver_cfg,
        &stop,
        &mut on_event,
        None,
        Some(&mut watch),
    )?;
    let w = watched.into_inner();
    let received = match (w.summary, w.gave_up) {
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
    Ok(Download {
        session: session_text,
        local_addr,
        granted_rate_bps: granted.rate_bps,
        recv_buffer: bound.buffer.granted,
        gro: bound.gro,
        answered,
        // The receive thread's CPU over the stream, as the table measured
        // it for the session; over the whole run where it could not.
        receive_cpu: received.cpu.or(summary.receive_cpu),
        received,
    })
}

/// Runs `cfg.clients` reverse streams at once.
pub fn receive(
    cfg: &ClientConfig,
    shutdown: &Shutdown,
    progress: &dyn SendProgress,
    events: Option<ReceiveEvents>,
) -> Result<Vec<Download>> {
    let results: Vec<Result<Download>> = std::thread::scope(|scope| {
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

/// `-R` or `--bidir`, as `cfg.traffic` says: the upload (with `--bidir`)
/// and the reverse streams run at once, each on sockets of its own.
pub fn run(
    cfg: &ClientConfig,
    shutdown: &Shutdown,
    progress: &dyn SendProgress,
    events: Option<ReceiveEvents>,
) -> Result<DuplexReport> {
    let (upload, downloads) = std::thread::scope(|scope| {
        let upload = (cfg.traffic == Traffic::Bidir)
            .then(|| scope.spawn(|| client::run_with_progress(cfg, shutdown, progress)));
        let downloads = receive(cfg, shutdown, progress, events);
        let upload = upload.map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(Error::runtime("the sending thread panicked")))
        });
        (upload.transpose(), downloads)
    });
    let upload = upload?;
    let downloads = downloads?;
    let mut streams = Vec::new();
    if let Some(u) = &upload {
        streams.push(upload_stream(u));
    }
    streams.push(download_stream(cfg, &downloads));
    Ok(DuplexReport {
        streams,
        upload,
        downloads,
        interrupted: client::Interrupted::of(shutdown),
    })
}

/// The upload's sides, from the client's report.
pub fn upload_stream(r: &RunReport) -> Stream {
    Stream {
        direction: Direction::ClientToServer,
        sender: Side {
            packets: r.sent_packets,
            bytes: r.sent_bytes,
            seconds: r.seconds,
            gbps: r.gbps,
            cpu: r.cpu,
            ..Side::default()
        },
        receiver: r.server.as_ref().map(|v| Side {
            packets: v.received_packets,
            bytes: v.received_bytes,
            seconds: v.seconds,
            gbps: v.gbps,
            lost_packets: Some(v.lost_packets),
            duplicates: Some(v.duplicates),
            reordered: Some(v.reordered),
            kernel_drops: v.drops.socket_wide_kernel_drops,
            jitter_ms: Some(v.jitter_ms),
            cpu: v.cpu,
        }),
        limited_by: r.limited_by.clone(),
        latency: Latency::new(r.server.as_ref().and_then(|v| v.queue), r.rtt.as_ref())
            .with_arrival(r.server.as_ref().is_some_and(|v| v.kernel_times)),
    }
}

/// The reverse streams' sides, summed over the clients: the sender's from
/// the server's Ends, the receiver's from this client's counts.
pub fn download_stream(cfg: &ClientConfig, downloads: &[Download]) -> Stream {
    let mut sender = Side::default();
    let mut receiver = Side {
        lost_packets: Some(0),
        duplicates: Some(0),
        reordered: Some(0),
        jitter_ms: Some(0.0),
        ..Side::default()
    };
    let (mut sender_cpu, mut sender_cpu_known) = (CpuTime::default(), true);
    let (mut first_bytes, mut longest_send, mut longest_receive) = (0, Duration::ZERO, 0.0f64);
    let mut all_answered = true;
    for d in downloads {
        let r = &d.received;
        receiver.packets += r.packets;
        receiver.bytes += r.bytes;
        longest_receive = longest_receive.max(r.seconds);
        *receiver.lost_packets.get_or_insert(0) += r.lost.unwrap_or(0);
        *receiver.duplicates.get_or_insert(0) += r.duplicates.unwrap_or(0);
        *receiver.reordered.get_or_insert(0) += r.reordered.unwrap_or(0);
        if let Some(drops) = r.drops.socket_wide_kernel_drops {
            *receiver.kernel_drops.get_or_insert(0) += drops;
        }
        receiver.jitter_ms = Some(
            receiver
                .jitter_ms
                .unwrap_or(0.0)
                .max(r.jitter_ms.unwrap_or(0.0)),
        );
        match &r.declared {
            Some(end) => {
                sender.packets += end.sent_packets;
                sender.bytes += end.sent_bytes;
                longest_send = longest_send.max(Duration::from_nanos(end.duration_ns));
                match end.sender {
                    Some(s) if s.cpu_user_ns != wire::UNKNOWN => {
                        first_bytes += s.first_call_bytes;
                        sender_cpu = sender_cpu.plus(CpuTime {
                            user: Duration::from_nanos(s.cpu_user_ns),
                            system: Duration::from_nanos(s.cpu_system_ns),
                        });
                    }
                    _ => sender_cpu_known = false,
                }
            }
            None => all_answered = false,
        }
    }
    sender.seconds = longest_send.as_secs_f64();
    sender.gbps = stats::rate_gbps(sender.bytes.saturating_sub(first_bytes), longest_send);
    sender.cpu = (sender_cpu_known && all_answered && !downloads.is_empty())
        .then(|| CpuCost::of(sender_cpu, longest_send, sender.bytes));
    receiver.seconds = longest_receive;
    receiver.gbps = match downloads {
        [one] => one.received.gbps,
        _ => stats::rate_gbps(receiver.bytes, Duration::from_secs_f64(longest_receive)),
    };
    receiver.cpu = match downloads {
        [one] => one.receive_cpu,
        _ => None,
    };
    Stream {
        direction: Direction::ServerToClient,
        sender,
        receiver: Some(receiver),
        limited_by: reverse_verdict(cfg, downloads),
        latency: Latency::new(worst_queue(downloads), None).with_arrival(crate::sys::RX_TIMESTAMPS),
    }
}

/// The queue delay of several reverse streams: the worst of theirs.
fn worst_queue(downloads: &[Download]) -> Option<QueueFigures> {
    downloads
        .iter()
        .filter_map(|d| queue_of(&d.received))
        .reduce(QueueFigures::worst)
}

/// The queue delay this client counted for one reverse stream.
fn queue_of(r: &PeerReport) -> Option<QueueFigures> {
    Some(QueueFigures {
        spread: r.queue_delay_ms?,
        samples: r.delay_samples.unwrap_or(0),
        skew_ppm: r.clock_skew_ppm,
        drift_bound_ms: r.drift_bound_ms.unwrap_or(0.0),
    })
}

/// What capped the reverse streams: the verdict's rules with the ends
/// swapped (the server sent, this client received).
fn reverse_verdict(cfg: &ClientConfig, downloads: &[Download]) -> Verdict {
    let run = match trial_run(cfg, downloads) {
        Ok(run) => run,
        Err(_) => {
            return Verdict {
                cause: Cap::Unknown,
                text: "unknown: the server's End never arrived, so its side cannot be judged"
                    .into(),
            }
        }
    };
    let granted = downloads.first().and_then(|d| d.granted_rate_bps);
    verdict::judge(&verdict::Facts {
        offered_bps: granted.map(|r| r.saturating_mul(downloads.len() as u64)),
        sent_bps: run.sent_bps,
        seconds: run.seconds,
        sender_cpu_percent: run.sender_cpu_percent,
        enobufs_retries: run.enobufs_retries,
        backoff_seconds: run.backoff_seconds,
        clients: downloads.len(),
        gso: downloads.iter().any(|d| {
            d.received
                .declared
                .and_then(|e| e.sender)
                .is_some_and(|s| s.gso_segments > 0)
        }),
        local: cfg.local,
        receiver: run.receiver,
        reverse: true,
        // The server's queue is on its host: not read from here.
        ..verdict::Facts::default()
    })
}

/// One `--find-limit -R` trial: `cfg.clients` reverse streams, judged by
/// what the server said it sent and what this client counted.
pub fn trial(cfg: &ClientConfig, shutdown: &Shutdown) -> Result<TrialRun> {
    let downloads = receive(cfg, shutdown, &NoProgress, None)?;
    trial_run(cfg, &downloads)
}

/// A trial's figures from its reverse streams.
fn trial_run(cfg: &ClientConfig, downloads: &[Download]) -> Result<TrialRun> {
    let mut run = TrialRun {
        buffer_size: cfg.buffer_size,
        reverse: true,
        queue_delay: worst_queue(downloads).map(|q| q.spread),
        ..TrialRun::default()
    };
    let mut rx = ReceiverFacts {
        drops_own: true,
        gro_datagrams: Some(0),
        ..ReceiverFacts::default()
    };
    let (mut sent_bps, mut received_bps) = (0.0, 0.0);
    for d in downloads {
        let r = &d.received;
        let Some(end) = r.declared.as_ref() else {
            return Err(Error::runtime(format!(
                "the server's End never arrived for session {}: the search needs the sender's counts",
                d.session
            )));
        };
        let span = Duration::from_nanos(end.duration_ns);
        run.sent_packets += end.sent_packets;
        run.sent_bytes += end.sent_bytes;
        run.seconds = run.seconds.max(span.as_secs_f64());
        if let Some(s) = end.sender {
            run.enobufs_retries += s.enobufs_retries;
            run.backoff_seconds += Duration::from_nanos(s.backoff_ns).as_secs_f64();
            sent_bps += stats::rate_gbps(end.sent_bytes.saturating_sub(s.first_call_bytes), span)
                .unwrap_or(0.0)
                * 1e9;
            if s.cpu_user_ns != wire::UNKNOWN && !span.is_zero() {
                let cpu = (s.cpu_user_ns + s.cpu_system_ns) as f64 / span.as_nanos() as f64 * 100.0;
                run.sender_cpu_percent = Some(run.sender_cpu_percent.unwrap_or(0.0).max(cpu));
            }
        }
        received_bps += r.gbps.unwrap_or(0.0) * 1e9;
        rx.lost += r.lost.unwrap_or(0);
        rx.received += r.packets;
        rx.gro_buffers += r.gro_buffers;
        rx.gro_datagrams = rx.gro_datagrams.map(|g| g + r.gro_datagrams);
        rx.drops_own &= r.drops.kernel_drops.is_some();
        if let Some(drops) = r.drops.kernel_drops.or(r.drops.socket_wide_kernel_drops) {
            *rx.kernel_drops.get_or_insert(0) += drops;
        }
        rx.drops_in_buffers |= r.drops.kernel_drops_unit == Some("buffers");
        run.drops_unit = run.drops_unit.or(r.drops.kernel_drops_unit);
        if let Some(p) = r.cpu.and_then(|c| c.percent_of_core) {
            rx.cpu_percent = Some(rx.cpu_percent.unwrap_or(0.0).max(p));
        }
    }
    rx.loss_percent = stats::percent(rx.lost, run.sent_packets);
    run.sent_bps = Some(sent_bps);
    run.received_bps = Some(received_bps);
    run.receiver = Some(rx);
    Ok(run)
}
