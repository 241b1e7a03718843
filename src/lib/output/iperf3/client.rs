//! The client's document: an upload's [`RunReport`], or `-R` and
//! `--bidir`'s [`DuplexReport`] with the intervals the client received,
//! as one [`Test`].

use super::{
    document, system_info, version, Cpu, CpuPercent, Endpoint, Flow, Meta, Received, Role, Side,
    Span, Stream, Test, TestStart, Tick, TickLoss,
};
use crate::client::duplex::{self, DuplexReport};
use crate::client::reverse::ReverseStream;
use crate::client::{ClientReport, RunReport};
use crate::config::{ClientConfig, Traffic};
use crate::meter::account::PeerReport;
use crate::meter::plan::Volume;
use crate::wire::Direction;
use serde_json::Value;
use std::time::{Duration, SystemTime};

impl Meta {
    /// The client's `start`, from its settings, before it runs.
    pub fn client(cfg: &ClientConfig, started: SystemTime) -> Meta {
        let (duration, bytes, blocks) = match cfg.volume {
            Volume::Time(d) => (d.as_secs_f64().ceil() as u64, 0, 0),
            Volume::Bytes(n) => (0, n, 0),
            Volume::Packets(n) => (0, 0, n),
        };
        Meta {
            version: version(),
            system_info: system_info(),
            started,
            role: Role::Client,
            peer: Some(cfg.server),
            test_start: TestStart {
                num_streams: cfg.clients as u64,
                blksize: Some(cfg.buffer_size as u64),
                duration: Some(duration),
                bytes: Some(bytes),
                blocks: Some(blocks),
                reverse: cfg.traffic == Traffic::Reverse,
                bidir: cfg.traffic == Traffic::Bidir,
                target_bitrate: Some(cfg.rate_bps.unwrap_or(0)),
                interval: cfg.interval.map_or(0.0, |i| i.as_secs_f64()),
            },
        }
    }
}

/// A rate netspeed reports in Gbit/s, in bit/s; 0 where it is unknown
/// (a span under 1 ms).
fn bps(gbps: Option<f64>) -> f64 {
    gbps.map_or(0.0, |g| g * 1e9)
}

/// An upload's document.
pub fn upload(report: &RunReport, meta: &Meta) -> Value {
    document(&upload_test(report, meta))
}

/// `-R` or `--bidir`'s document; `received` is every interval the client
/// counted of its reverse streams, in order (the events `udp_client`
/// collects).
pub fn duplex(report: &DuplexReport, received: &[PeerReport], meta: &Meta) -> Value {
    document(&duplex_test(report, received, meta))
}

/// The document of a run that failed before it had figures: iperf3's
/// `{"start": …, "intervals": [], "end": {}, "error": …}`.
pub fn failed(meta: &Meta, message: &str) -> Value {
    document(&Test {
        meta: meta.clone(),
        flows: Vec::new(),
        cpu: Cpu::default(),
        error: Some(message.to_string()),
    })
}

/// The upload's streams: the client's own sending figures, and the
/// server's answers.
fn upload_flow(r: &RunReport, next_socket: &mut u64) -> Flow {
    let remote = Endpoint::parse(&r.server_addr);
    let streams = r
        .clients
        .iter()
        .map(|c| {
            *next_socket += 1;
            upload_stream(c, *next_socket, remote.clone())
        })
        .collect();
    Flow {
        client_to_server: true,
        local_sends: true,
        streams,
        sent_total: Some(Span {
            seconds: r.seconds,
            bits_per_second: bps(r.gbps),
        }),
        received_total: r.server.as_ref().map(|v| Span {
            seconds: v.seconds,
            bits_per_second: bps(v.gbps),
        }),
    }
}

fn upload_stream(c: &ClientReport, socket: u64, remote: Endpoint) -> Stream {
    Stream {
        socket,
        local: Endpoint::parse(&c.local_addr),
        remote,
        sent: Some(Side {
            packets: c.sent_packets,
            bytes: c.sent_bytes,
            seconds: c.seconds,
            bits_per_second: bps(c.gbps),
        }),
        received: c.server.as_ref().map(|v| Received {
            side: Side {
                packets: v.received_packets,
                bytes: v.received_bytes,
                seconds: v.seconds,
                bits_per_second: bps(v.gbps),
            },
            lost: v.lost_packets,
            out_of_order: v.reordered,
            jitter_ms: v.jitter_ms,
        }),
        intervals: c
            .intervals
            .iter()
            .map(|i| Tick {
                start: i.start,
                end: i.end,
                bytes: i.bytes,
                packets: Some(i.packets),
                bits_per_second: bps(i.gbps),
                loss: None,
            })
            .collect(),
    }
}

/// A receiving end's interval lines as iperf3's: each starts where the
/// last ended (the first at the stream's first datagram); the loss in
/// each is the growth of the running loss the lines carry.
pub fn received_ticks(lines: &[&PeerReport]) -> Vec<Tick> {
    let (mut at, mut lost_before) = (0.0, 0i64);
    lines
        .iter()
        .map(|r| {
            let lost = r.lost.unwrap_or(0) as i64;
            let tick = Tick {
                start: at,
                end: at + r.seconds,
                bytes: r.bytes,
                packets: Some(r.packets),
                bits_per_second: bps(r.gbps),
                loss: Some(TickLoss {
                    jitter_ms: r.jitter_ms.unwrap_or(0.0),
                    lost: lost - lost_before,
                }),
            };
            at += r.seconds;
            lost_before = lost;
            tick
        })
        .collect()
}

/// What a receiving end counted of a session, as iperf3's receiver side.
pub fn received_side(r: &PeerReport) -> Received {
    Received {
        side: Side {
            packets: r.packets,
            bytes: r.bytes,
            seconds: r.seconds,
            bits_per_second: bps(r.gbps),
        },
        lost: r.lost.unwrap_or(0),
        out_of_order: r.reordered.unwrap_or(0),
        jitter_ms: r.jitter_ms.unwrap_or(0.0),
    }
}

/// The reverse streams: this client's counts, the server's Ends, and the
/// direction's totals as the duplex report has them.
fn reverse_flow(
    streams: &[ReverseStream],
    totals: Option<&duplex::Stream>,
    received: &[PeerReport],
    next_socket: &mut u64,
) -> Flow {
    let streams = streams
        .iter()
        .map(|d| {
            *next_socket += 1;
            let r = &d.received;
            let lines: Vec<&PeerReport> = received
                .iter()
                .filter(|l| l.session.as_deref() == Some(d.session.as_str()))
                .collect();
            Stream {
                socket: *next_socket,
                local: Endpoint::parse(&d.local_addr),
                remote: Endpoint::parse(&r.peer),
                // The server's End: what it sent, over its own span.
                sent: r.declared.map(|end| {
                    let span = Duration::from_nanos(end.duration_ns);
                    let first = end.sender.map_or(0, |s| s.first_call_bytes);
                    Side {
                        packets: end.sent_packets,
                        bytes: end.sent_bytes,
                        seconds: span.as_secs_f64(),
                        bits_per_second: bps(crate::stats::rate_gbps(
                            end.sent_bytes.saturating_sub(first),
                            span,
                        )),
                    }
                }),
                received: Some(received_side(r)),
                intervals: received_ticks(&lines),
            }
        })
        .collect();
    Flow {
        client_to_server: false,
        local_sends: false,
        streams,
        // Unknown (the server's Ends never came) is left out, not 0.
        sent_total: totals.and_then(|t| {
            Some(Span {
                seconds: t.sender.seconds?,
                bits_per_second: bps(t.sender.gbps),
            })
        }),
        received_total: totals.and_then(|t| t.receiver.as_ref()).and_then(|r| {
            Some(Span {
                seconds: r.seconds?,
                bits_per_second: bps(r.gbps),
            })
        }),
    }
}

/// Why an upload's figures are incomplete or cannot be trusted, if they
/// are: the run's exit code says the same (3, 4, 130, 143).
fn upload_error(r: &RunReport) -> Option<String> {
    if let Some(i) = &r.interrupted {
        return Some(interrupted(i));
    }
    if r.server.as_ref().is_some_and(|v| v.disputed) {
        return Some(
            "the server's answer is disputed (another End for the session, or data after it): its figures cannot be trusted".into(),
        );
    }
    (!r.complete).then(|| {
        format!(
            "the server's answer is missing for {} of {} clients: their receiver-side figures are unknown",
            r.clients.len() - r.clients_answered,
            r.clients.len()
        )
    })
}

fn interrupted(i: &crate::client::Interrupted) -> String {
    format!(
        "interrupt - the client has terminated ({} after {:.2} s): the figures cover the run until then",
        i.signal, i.after_seconds
    )
}

/// This client's sending threads and the server's receive threads.
fn upload_cpu(r: &RunReport) -> Cpu {
    Cpu {
        host: r.cpu.as_ref().map(CpuPercent::of).unwrap_or_default(),
        remote: r
            .server
            .as_ref()
            .and_then(|v| v.cpu.as_ref())
            .map(CpuPercent::of)
            .unwrap_or_default(),
    }
}

/// An upload as one [`Test`].
pub fn upload_test(report: &RunReport, meta: &Meta) -> Test {
    let mut meta = meta.clone();
    // With --local the server is the in-process one: its address is the
    // report's.
    meta.peer = report.server_addr.parse().ok().or(meta.peer);
    Test {
        meta,
        flows: vec![upload_flow(report, &mut 0)],
        cpu: upload_cpu(report),
        error: upload_error(report),
    }
}

/// `-R` or `--bidir` as one [`Test`]: the upload first (with `--bidir`),
/// then the reverse streams.
pub fn duplex_test(report: &DuplexReport, received: &[PeerReport], meta: &Meta) -> Test {
    let mut meta = meta.clone();
    let mut next_socket = 0;
    let mut flows = Vec::new();
    let mut cpu = Cpu::default();
    let mut error = report.interrupted.as_ref().map(interrupted);
    if let Some(u) = &report.upload {
        meta.peer = u.server_addr.parse().ok().or(meta.peer);
        flows.push(upload_flow(u, &mut next_socket));
        cpu = upload_cpu(u);
        error = error.or_else(|| upload_error(u));
    }
    if let Some(peer) = report
        .reverse
        .first()
        .and_then(|d| d.received.peer.parse().ok())
    {
        meta.peer = Some(peer);
    }
    let totals = report
        .streams
        .iter()
        .find(|s| s.direction == Direction::ServerToClient);
    flows.push(reverse_flow(
        &report.reverse,
        totals,
        received,
        &mut next_socket,
    ));
    // Each reverse stream has a receive thread of its own; the server's
    // sending threads are the direction's sender CPU.
    for d in &report.reverse {
        if let Some(c) = &d.receive_cpu {
            cpu.host = cpu.host.plus(CpuPercent::of(c));
        }
    }
    if let Some(c) = totals.and_then(|t| t.sender.cpu.as_ref()) {
        cpu.remote = cpu.remote.plus(CpuPercent::of(c));
    }
    let unanswered = report.reverse.iter().filter(|d| !d.answered).count();
    if error.is_none() && unanswered > 0 {
        error = Some(format!(
            "the server's End never arrived for {unanswered} of {} reverse streams: their sender-side figures are unknown",
            report.reverse.len()
        ));
    }
    Test {
        meta,
        flows,
        cpu,
        error,
    }
}
