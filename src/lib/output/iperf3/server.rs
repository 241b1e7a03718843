//! The server's document (`udp_server --one-off --iperf3-json`): the test
//! from the server's side, gathered from its events as they come
//! ([`ServerTest::observe`]) and written once the server stops.
//!
//! iperf3's server writes its document before the two ends exchange their
//! results, so it has zeros for what only the client knows. netspeed's
//! server knows more, and says it: the client's declared totals (its End)
//! for an upload, the client's count (its EndAck) for a reverse stream.
//! The client's CPU it does not know: `remote_*` are 0, as in iperf3's.

use super::client::{received_side, received_ticks};
use super::{
    document, system_info, version, Cpu, CpuPercent, Endpoint, Flow, Meta, Received, Role, Side,
    Span, Stream, Test, TestStart, Tick,
};
use crate::meter::account::{DoneReason, PeerReport};
use crate::server::reverse::{StreamEnd, StreamInterval, StreamReport};
use crate::server::ServerEvent;
use serde_json::Value;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

/// One upload session the server received.
#[derive(Debug, Clone, Default)]
struct Upload {
    session: String,
    intervals: Vec<PeerReport>,
    done: Option<PeerReport>,
}

/// One reverse stream the server sent.
#[derive(Debug, Clone, Default)]
struct Sent {
    session: String,
    intervals: Vec<StreamInterval>,
    done: Option<StreamReport>,
}

/// The test a `--one-off` server serves, as its events tell it.
#[derive(Debug, Clone)]
pub struct ServerTest {
    /// The address the server listens on: the local end of every stream.
    local: Option<SocketAddr>,
    interval: f64,
    /// The wall-clock time of the test's first datagram, as the first
    /// event dates it.
    started: Option<SystemTime>,
    uploads: Vec<Upload>,
    sent: Vec<Sent>,
    conflict: Option<String>,
}

impl ServerTest {
    /// A server writing interval lines every `interval` (None: off).
    pub fn new(interval: Option<Duration>) -> ServerTest {
        ServerTest {
            local: None,
            interval: interval.map_or(0.0, |i| i.as_secs_f64()),
            started: None,
            uploads: Vec::new(),
            sent: Vec::new(),
            conflict: None,
        }
    }

    /// The address the server bound: the local end of every stream.
    pub fn listening_on(&mut self, addr: SocketAddr) {
        self.local = Some(addr);
    }

    /// Takes in one event, dated now.
    pub fn observe(&mut self, event: &ServerEvent) {
        self.observe_at(event, SystemTime::now());
    }

    /// Takes in one event that was written at `now`. Foreign (untagged)
    /// traffic and the socket's totals are not part of the test.
    pub fn observe_at(&mut self, event: &ServerEvent, now: SystemTime) {
        // How long before `now` the test began, by this event's span.
        let began = match event {
            ServerEvent::Interval(r) | ServerEvent::PeerDone(r) if r.tagged => Some(r.seconds),
            ServerEvent::StreamInterval(i) => Some(i.end),
            ServerEvent::StreamDone(r) => Some(r.seconds),
            _ => None,
        };
        if let (None, Some(ago)) = (self.started, began) {
            self.started = now.checked_sub(Duration::from_secs_f64(ago.max(0.0)));
        }
        match event {
            ServerEvent::Interval(r) if r.tagged => self.upload(r).intervals.push(r.clone()),
            ServerEvent::PeerDone(r) if r.tagged => self.upload(r).done = Some(r.clone()),
            ServerEvent::StreamInterval(i) => self.stream(&i.session).intervals.push(i.clone()),
            ServerEvent::StreamDone(r) => self.stream(&r.session).done = Some(r.clone()),
            ServerEvent::Conflict(c) => {
                self.conflict.get_or_insert(format!(
                    "session {} is disputed ({}): its figures cannot be trusted",
                    c.session, c.conflict
                ));
            }
            _ => {}
        }
    }

    fn upload(&mut self, r: &PeerReport) -> &mut Upload {
        let session = r.session.clone().unwrap_or_default();
        let at = match self.uploads.iter().position(|u| u.session == session) {
            Some(at) => at,
            None => {
                self.uploads.push(Upload {
                    session,
                    ..Upload::default()
                });
                self.uploads.len() - 1
            }
        };
        &mut self.uploads[at]
    }

    fn stream(&mut self, session: &str) -> &mut Sent {
        let at = match self.sent.iter().position(|s| s.session == session) {
            Some(at) => at,
            None => {
                self.sent.push(Sent {
                    session: session.to_string(),
                    ..Sent::default()
                });
                self.sent.len() - 1
            }
        };
        &mut self.sent[at]
    }

    /// A session ended as a test should: its End arrived and was
    /// answered (an upload), or the client answered the server's End (a
    /// reverse stream). What ends a `--one-off` server.
    fn served(&self) -> bool {
        self.uploads
            .iter()
            .filter_map(|u| u.done.as_ref())
            .any(|r| r.reason == Some(DoneReason::End))
            || self
                .sent
                .iter()
                .filter_map(|s| s.done.as_ref())
                .any(|r| r.reason == StreamEnd::Answered)
    }

    /// Why the document is not a test's whole story, if it is not.
    fn error(&self) -> Option<String> {
        if self.uploads.is_empty() && self.sent.is_empty() {
            return Some("interrupt - the server has terminated before a test came".into());
        }
        if let Some(c) = &self.conflict {
            return Some(c.clone());
        }
        (!self.served()).then(|| {
            "interrupt - the server has terminated before the test's end: the figures cover it until then".into()
        })
    }

    /// 0 when a test was served whole, else 1 (iperf3's exit code for a
    /// document with an `error`).
    pub fn exit_code(&self) -> i32 {
        if self.error().is_some() {
            1
        } else {
            0
        }
    }

    /// The document.
    pub fn document(&self) -> Value {
        document(&self.test())
    }

    /// The document of a server that failed (it could not bind, say):
    /// iperf3's error document, with what it had served until then.
    pub fn failed(&self, message: &str) -> Value {
        let mut test = self.test();
        test.error = Some(message.to_string());
        document(&test)
    }

    /// The test as one [`Test`].
    pub fn test(&self) -> Test {
        let mut next_socket = 0;
        let mut flows = Vec::new();
        if !self.uploads.is_empty() {
            flows.push(self.upload_flow(&mut next_socket));
        }
        if !self.sent.is_empty() {
            flows.push(self.sent_flow(&mut next_socket));
        }
        let peer = self
            .uploads
            .iter()
            .filter_map(|u| u.done.as_ref().or(u.intervals.first()))
            .map(|r| r.peer.as_str())
            .chain(self.sent.iter().filter_map(|s| {
                s.done
                    .as_ref()
                    .map(|r| r.peer.as_str())
                    .or(s.intervals.first().map(|i| i.peer.as_str()))
            }))
            .find_map(|p| p.parse().ok());
        let meta = Meta {
            version: version(),
            system_info: system_info(),
            started: self.started.unwrap_or_else(SystemTime::now),
            role: Role::Server,
            peer,
            test_start: TestStart {
                num_streams: self.uploads.len().max(self.sent.len()) as u64,
                reverse: self.uploads.is_empty() && !self.sent.is_empty(),
                bidir: !self.uploads.is_empty() && !self.sent.is_empty(),
                target_bitrate: self
                    .sent
                    .iter()
                    .filter_map(|s| s.done.as_ref())
                    .map(|r| r.rate_bps.unwrap_or(0))
                    .next(),
                interval: self.interval,
                ..TestStart::default()
            },
        };
        Test {
            meta,
            flows,
            cpu: self.cpu(),
            error: self.error(),
        }
    }

    /// The upload sessions: the server's own counts, and what each client
    /// declared it sent (its End).
    fn upload_flow(&self, next_socket: &mut u64) -> Flow {
        let streams: Vec<Stream> = self
            .uploads
            .iter()
            .map(|u| {
                *next_socket += 1;
                let lines: Vec<&PeerReport> = u.intervals.iter().collect();
                let done = u.done.as_ref();
                Stream {
                    socket: *next_socket,
                    local: self.local.map(Endpoint::of).unwrap_or_default(),
                    remote: Endpoint::parse(
                        done.or(u.intervals.first()).map_or("", |r| r.peer.as_str()),
                    ),
                    sent: done.and_then(|r| r.declared).map(|end| {
                        let seconds = Duration::from_nanos(end.duration_ns).as_secs_f64();
                        Side {
                            packets: end.sent_packets,
                            bytes: end.sent_bytes,
                            seconds,
                            bits_per_second: super::bits_per_second(end.sent_bytes, seconds),
                        }
                    }),
                    received: done.map(received_side),
                    intervals: received_ticks(&lines),
                }
            })
            .collect();
        let sent_total = total(streams.iter().filter_map(|s| s.sent));
        let received_total = match streams.as_slice() {
            [one] => one.received.map(|r| Span {
                seconds: r.side.seconds,
                bits_per_second: r.side.bits_per_second,
            }),
            _ => total(streams.iter().filter_map(|s| s.received.map(|r| r.side))),
        };
        Flow {
            client_to_server: true,
            local_sends: false,
            streams,
            sent_total,
            received_total,
        }
    }

    /// The reverse streams: what the server sent, and the client's count
    /// from its EndAck (which carries no span of its own: the server's
    /// sending span stands in).
    fn sent_flow(&self, next_socket: &mut u64) -> Flow {
        let streams: Vec<Stream> = self
            .sent
            .iter()
            .map(|s| {
                *next_socket += 1;
                let done = s.done.as_ref();
                let peer = done
                    .map(|r| r.peer.as_str())
                    .or(s.intervals.first().map(|i| i.peer.as_str()))
                    .unwrap_or("");
                let sent = done.map(|r| Side {
                    packets: r.sent_packets,
                    bytes: r.sent_bytes,
                    seconds: r.seconds,
                    bits_per_second: r.gbps.map_or(0.0, |g| g * 1e9),
                });
                Stream {
                    socket: *next_socket,
                    local: self.local.map(Endpoint::of).unwrap_or_default(),
                    remote: Endpoint::parse(peer),
                    sent,
                    received: done.and_then(|r| {
                        let c = r.received.as_ref()?;
                        Some(Received {
                            side: Side {
                                packets: c.packets,
                                bytes: c.bytes,
                                seconds: r.seconds,
                                bits_per_second: super::bits_per_second(c.bytes, r.seconds),
                            },
                            lost: c.lost_packets,
                            out_of_order: c.reordered,
                            jitter_ms: c.jitter_ms,
                        })
                    }),
                    intervals: s
                        .intervals
                        .iter()
                        .map(|i| Tick {
                            start: i.start,
                            end: i.end,
                            bytes: i.sent_bytes,
                            packets: None,
                            bits_per_second: i.gbps * 1e9,
                            loss: None,
                        })
                        .collect(),
                }
            })
            .collect();
        let sent_total = match streams.as_slice() {
            [one] => one.sent.map(|s| Span {
                seconds: s.seconds,
                bits_per_second: s.bits_per_second,
            }),
            _ => total(streams.iter().filter_map(|s| s.sent)),
        };
        let received_total = total(streams.iter().filter_map(|s| s.received.map(|r| r.side)));
        Flow {
            client_to_server: false,
            local_sends: true,
            streams,
            sent_total,
            received_total,
        }
    }

    /// The server's threads that moved the test's data: the receive
    /// threads (one session's figure covers every session they served at
    /// the same time: the longest session's is taken) and each reverse
    /// stream's sending thread.
    fn cpu(&self) -> Cpu {
        let receive = self
            .uploads
            .iter()
            .filter_map(|u| u.done.as_ref())
            .filter(|r| r.cpu.is_some())
            .max_by(|a, b| a.seconds.total_cmp(&b.seconds))
            .and_then(|r| r.cpu.as_ref())
            .map(CpuPercent::of)
            .unwrap_or_default();
        let send = self
            .sent
            .iter()
            .filter_map(|s| s.done.as_ref()?.cpu.as_ref())
            .map(CpuPercent::of)
            .fold(CpuPercent::default(), CpuPercent::plus);
        Cpu {
            host: receive.plus(send),
            remote: CpuPercent::default(),
        }
    }
}

/// Several streams' sides as one: their bytes over the longest span.
fn total(sides: impl Iterator<Item = Side>) -> Option<Span> {
    let (mut bytes, mut seconds, mut any) = (0, 0.0f64, false);
    for s in sides {
        bytes += s.bytes;
        seconds = seconds.max(s.seconds);
        any = true;
    }
    any.then(|| Span {
        seconds,
        bits_per_second: super::bits_per_second(bytes, seconds),
    })
}
