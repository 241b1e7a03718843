//! `-R` and `--bidir` as one report: each direction's sender and
//! receiver side, what capped it and its delay under load.
//!
//! The upload half of `--bidir` is the client's ordinary run
//! ([`super::run_with_progress`]); the reverse streams are received by
//! [`super::reverse`]. This module runs both at once and puts their
//! figures side by side: the sender's from whichever end sent (the
//! server's End for a reverse stream), the receiver's from whichever end
//! counted.

use super::latency::{self, Latency};
use super::limit::TrialRun;
use super::reverse::{self, ReceiveEvents, ReverseStream};
use super::rtt::RttRecord;
use super::verdict::{self, Cap, ReceiverFacts, Verdict};
use super::{NoProgress, RunReport, SendProgress};
use crate::config::{ClientConfig, Traffic};
use crate::error::{Error, Result};
use crate::meter::account::PeerReport;
use crate::shutdown::Shutdown;
use crate::stats::delay::QueueFigures;
use crate::stats::{self, CpuCost, CpuTime};
use crate::wire::{self, Direction};
use serde::Serialize;
use std::time::Duration;

/// One side of a stream, as the `streams` array shows it.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, Serialize)]
pub struct Side {
    /// What this side counted; null when its count never came (a reverse
    /// stream's sender whose End did not arrive: an interrupted run, a
    /// lost end exchange), never 0 for unknown.
    #[serialize_always]
    pub packets: Option<u64>,
    #[serialize_always]
    pub bytes: Option<u64>,
    #[serialize_always]
    pub seconds: Option<f64>,
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
    /// trips of the probes beside the load ([`super::latency`]).
    pub latency: Latency,
}

/// A run with `-R` or `--bidir`.
#[derive(Debug, Clone, Serialize)]
pub struct DuplexReport {
    /// One per direction: `client_to_server` first.
    pub streams: Vec<Stream>,
    /// The upload half of `--bidir`, as a plain upload reports it.
    pub upload: Option<RunReport>,
    /// Each client's reverse stream (`downloads` in JSON, the name it
    /// has always had there).
    #[serde(rename = "downloads")]
    pub reverse: Vec<ReverseStream>,
    /// A signal cut the run short (absent when it ran to its end).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<super::Interrupted>,
}

impl DuplexReport {
    /// 0, or [`super::EXIT_NO_ANSWER`] when a side's count is missing.
    pub fn exit_code(&self) -> i32 {
        let upload = self.upload.as_ref().map_or(0, |u| u.exit_code());
        if upload != 0 {
            upload
        } else if self.reverse.iter().any(|d| !d.answered) {
            super::EXIT_NO_ANSWER
        } else {
            0
        }
    }
}

/// `-R` or `--bidir`, as `cfg.traffic` says: the upload (with `--bidir`)
/// and the reverse streams run at once, each on sockets of its own.
pub fn run(
    cfg: &ClientConfig,
    shutdown: &Shutdown,
    progress: &dyn SendProgress,
    events: Option<ReceiveEvents>,
) -> Result<DuplexReport> {
    // One run: its uploads and its reverse streams (`--one-off` waits for
    // every one of them).
    let halves = if cfg.traffic == Traffic::Bidir { 2 } else { 1 };
    let cfg = &ClientConfig {
        run: Some(wire::Run {
            id: crate::auth::random_u64(),
            clients: (cfg.clients * halves) as u64,
        }),
        ..cfg.clone()
    };
    let (upload, received) = std::thread::scope(|scope| {
        let upload = (cfg.traffic == Traffic::Bidir)
            .then(|| scope.spawn(|| super::run_with_progress(cfg, shutdown, progress)));
        let received = reverse::receive(cfg, shutdown, progress, events);
        let upload = upload.map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(Error::runtime("the sending thread panicked")))
        });
        (upload.transpose(), received)
    });
    let upload = upload?;
    let reverse = received?;
    let mut streams = Vec::new();
    if let Some(u) = &upload {
        streams.push(upload_stream(u));
    }
    streams.push(reverse_stream(cfg, &reverse));
    Ok(DuplexReport {
        streams,
        upload,
        reverse,
        interrupted: super::Interrupted::of(shutdown),
    })
}

/// The upload's sides, from the client's report.
pub fn upload_stream(r: &RunReport) -> Stream {
    Stream {
        direction: Direction::ClientToServer,
        sender: Side {
            packets: Some(r.sent_packets),
            bytes: Some(r.sent_bytes),
            seconds: Some(r.seconds),
            gbps: r.gbps,
            cpu: r.cpu,
            ..Side::default()
        },
        receiver: r.server.as_ref().map(|v| Side {
            packets: Some(v.received_packets),
            bytes: Some(v.received_bytes),
            seconds: Some(v.seconds),
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
pub fn reverse_stream(cfg: &ClientConfig, streams: &[ReverseStream]) -> Stream {
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
    let (mut sent_packets, mut sent_bytes, mut got_packets, mut got_bytes) = (0, 0, 0, 0);
    for d in streams {
        let r = &d.received;
        got_packets += r.packets;
        got_bytes += r.bytes;
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
                sent_packets += end.sent_packets;
                sent_bytes += end.sent_bytes;
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
    // The sender's side is the server's Ends: unknown (not 0) unless
    // every stream's came.
    let known = all_answered && !streams.is_empty();
    sender.packets = known.then_some(sent_packets);
    sender.bytes = known.then_some(sent_bytes);
    sender.seconds = known.then_some(longest_send.as_secs_f64());
    sender.gbps =
        stats::rate_gbps(sent_bytes.saturating_sub(first_bytes), longest_send).filter(|_| known);
    sender.cpu =
        (sender_cpu_known && known).then(|| CpuCost::of(sender_cpu, longest_send, sent_bytes));
    receiver.packets = Some(got_packets);
    receiver.bytes = Some(got_bytes);
    receiver.seconds = Some(longest_receive);
    receiver.gbps = match streams {
        [one] => one.received.gbps,
        _ => stats::rate_gbps(got_bytes, Duration::from_secs_f64(longest_receive)),
    };
    receiver.cpu = match streams {
        [one] => one.receive_cpu,
        _ => None,
    };
    Stream {
        direction: Direction::ServerToClient,
        sender,
        receiver: Some(receiver),
        limited_by: reverse_verdict(cfg, streams),
        latency: Latency {
            queue_baseline_drop_ms: streams
                .iter()
                .filter_map(|d| d.received.queue_baseline_drop_ms)
                .reduce(f64::max),
            ..Latency::new(worst_queue(streams), None)
        }
        .with_arrival(crate::sys::RX_TIMESTAMPS),
    }
}

/// The queue delay of several reverse streams: the worst of theirs.
fn worst_queue(streams: &[ReverseStream]) -> Option<QueueFigures> {
    streams
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
fn reverse_verdict(cfg: &ClientConfig, streams: &[ReverseStream]) -> Verdict {
    let mut verdict = judge_reverse(cfg, streams);
    if let Some(b) = streams.iter().find_map(|d| d.server_breaker) {
        verdict.text = format!("{}; {}", verdict.text, b.words());
    }
    verdict
}

/// The verdict's rules with the ends swapped.
fn judge_reverse(cfg: &ClientConfig, streams: &[ReverseStream]) -> Verdict {
    let run = match trial_run(cfg, streams) {
        Ok(run) => run,
        Err(_) => {
            return Verdict {
                cause: Cap::Unknown,
                text: "unknown: the server's End never arrived, so its side cannot be judged"
                    .into(),
            }
        }
    };
    let granted = streams.first().and_then(|d| d.granted_rate_bps);
    verdict::judge(&verdict::Facts {
        offered_bps: granted.map(|r| r.saturating_mul(streams.len() as u64)),
        sent_bps: run.sent_bps,
        seconds: run.seconds,
        sender_cpu_percent: run.sender_cpu_percent,
        enobufs_retries: run.enobufs_retries,
        backoff_seconds: run.backoff_seconds,
        clients: streams.len(),
        gso: streams.iter().any(|d| {
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
    let streams = reverse::receive(cfg, shutdown, &NoProgress, None)?;
    trial_run(cfg, &streams)
}

/// A trial's figures from its reverse streams.
fn trial_run(cfg: &ClientConfig, streams: &[ReverseStream]) -> Result<TrialRun> {
    let mut run = TrialRun {
        buffer_size: cfg.buffer_size,
        reverse: true,
        queue_delay: worst_queue(streams).map(|q| q.spread),
        ..TrialRun::default()
    };
    let mut rx = ReceiverFacts {
        drops_own: true,
        gro_datagrams: Some(0),
        ..ReceiverFacts::default()
    };
    let (mut sent_bps, mut received_bps) = (0.0, 0.0);
    for d in streams {
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

/// Gives each direction of a `-R` or `--bidir` run the probes' round
/// trips, and its verdict what the queue did.
pub fn attach_round_trips(report: &mut DuplexReport, record: &RttRecord) {
    if let Some(upload) = report.upload.as_mut() {
        latency::attach_upload(upload, record);
    }
    for stream in &mut report.streams {
        stream.latency = stream.latency.with_round_trips(record.figures.as_ref());
        let latency = stream.latency;
        latency::speak_of_the_queue(&mut stream.limited_by, &latency);
    }
}
