//! The server's reverse sessions: from a client's Start to its EndAck.
//!
//! Why a table of its own: a reverse session is the one place the server
//! sends on a stranger's request, so its state is created only for an
//! address that has proven it receives there (a Start echoing the cookie
//! of a HelloAck sent to it), it is bounded by `--max-reverse-streams`,
//! and every step that sends is bounded in bytes and time:
//!
//! ```text
//! client                          server
//! Hello ------------------------>  (no state)
//!       <------------------------ HelloAck {cookie}
//! Start {cookie, request} ------>  cookie checked; caps checked
//!       <------------------------ StartAck {status, stream nonce}  (Awaiting)
//! Feedback {stream nonce} ------>  first one launches the stream   (Sending)
//!       <======================== Data ... (bounded by volume, --max-duration)
//! Feedback every 100 ms -------->  silence for SILENCE stops it
//!       <------------------------ End {sent, sender figures}       (Ending)
//! EndAck {received} ------------>  the stream's report             (done)
//! ```
//!
//! Answers before the address is proven (a refused Start, a Start with a
//! bad cookie) are never larger than the Start (both are
//! [`wire::START_LEN`] bytes), and count against the source's answer
//! budget like HelloAcks. The stream nonce defeats a Start replayed from
//! a forged address: the StartAck goes to the forged address, whose owner
//! never echoes its nonce, so no stream starts.
//!
//! This table is pure: time comes in as arguments, answers go out into a
//! `Vec<Reply>`, streams to launch into [`Reverse::take_launches`]. The
//! server's main loop runs the sending threads ([`send::run`]),
//! watches the deadlines ([`Reverse::tick`]) and hands each thread's
//! result back ([`Reverse::sent`]).

use crate::auth::{CookieKey, Psk, COOKIE_SLOT};
use crate::config::StreamCaps;
use crate::meter::account::{source_prefix, Asker, Control, ControlRequest, Reply, ReplyBytes};
use crate::stats::{self, CpuCost};
use crate::wire::{
    self, Direction, End, EndAck, Feedback, Header, SenderStats, Start, StartAck, START_LEN,
};
use breaker::{Breaker, Trip};
pub use breaker::{BREAKER_HALVINGS, BREAKER_WINDOW, BREAKER_WINDOWS};
use send::{grant, StreamControl, StreamOrder, StreamResult, END_ATTEMPTS, END_EVERY, SILENCE};
use serde::Serialize;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod breaker;
pub mod send;

/// A session's key: the client's canonical address and its session id.
pub type SessionKey = (SocketAddr, u64);

/// How long a granted stream waits for the client's first Feedback: a
/// client that never answers its StartAck (a replayed Start, a client
/// that died, a source that asks and never confirms) holds a stream slot
/// no longer than this. The client sends its first Feedback as soon as
/// the StartAck arrives, so this is a few round trips of any real path.
pub const AWAIT_FEEDBACK: Duration = Duration::from_secs(1);

/// How a reverse session is set up.
#[derive(Debug)]
pub struct ReverseConfig {
    pub caps: StreamCaps,
    /// `--psk`: Starts, Feedback and EndAcks must carry its tag, and what
    /// the server sends carries it.
    pub psk: Option<Psk>,
    pub cookies: CookieKey,
    /// The server's clock origin: cookie slots count from it.
    pub epoch: Instant,
    /// Interval lines are written: a stream's last partial interval is
    /// written when it ends, so that its lines add up to its total.
    pub intervals: bool,
}

/// Why a stream's sending ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamEnd {
    /// The client's EndAck arrived: both sides' figures are known.
    Answered,
    /// Sent, but the client never answered the End.
    NoAnswer,
    /// The client's Feedback stopped (killed, unplugged, NAT mapping gone).
    Silent,
    /// The client never confirmed the StartAck: nothing was sent.
    NeverConfirmed,
    /// The server's `--max-duration` cut it short.
    MaxDuration,
    /// The server was stopping.
    Shutdown,
    /// A send failed for good.
    Failed,
    /// The circuit breaker stopped it: the client kept taking in less than
    /// half of what was sent, after the rate had been halved (RFC 8084).
    CircuitBreaker,
}

/// What the client said it received, from its EndAck.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize)]
pub struct ClientReceived {
    pub packets: u64,
    pub bytes: u64,
    pub lost_packets: u64,
    pub duplicates: u64,
    pub reordered: u64,
    /// Drops on the client's socket while the stream arrived.
    pub kernel_drops: Option<u64>,
    pub jitter_ms: f64,
}

/// One reverse stream's report, as the server sees it.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize)]
pub struct StreamReport {
    pub peer: String,
    pub session: String,
    pub direction: Direction,
    /// Payload datagrams and bytes sent.
    pub sent_packets: u64,
    pub sent_bytes: u64,
    /// From the first send call's return to the last one's.
    pub seconds: f64,
    /// Send rate over `seconds`, of what was sent after the first call.
    #[serialize_always]
    pub gbps: Option<f64>,
    /// The rate the stream was paced at (bit/s), if any.
    pub rate_bps: Option<u64>,
    /// The sending thread's CPU.
    pub cpu: Option<CpuCost>,
    pub enobufs_retries: u64,
    /// The send path: `sendmmsg`, `gso` and its segments.
    pub send_path: String,
    /// What the client counted, once it answered.
    pub received: Option<ClientReceived>,
    pub reason: StreamEnd,
    /// Why a send failed, for [`StreamEnd::Failed`].
    pub error: Option<String>,
    /// The circuit breaker's doing, when it tripped: how often it slowed
    /// the stream, and the rate it ended at (bit/s).
    pub breaker: Option<Breaker>,
    /// The udp_client run the stream belongs to (`--one-off`).
    #[serde(skip)]
    pub run: Option<wire::Run>,
}

/// One interval of a reverse stream, as the server sent it.
#[derive(Debug, Clone, Serialize)]
pub struct StreamInterval {
    pub peer: String,
    pub session: String,
    pub direction: Direction,
    /// Seconds since the stream started, at the interval's start and end.
    pub start: f64,
    pub end: f64,
    /// Payload bytes sent in the interval, and their rate.
    pub sent_bytes: u64,
    pub gbps: f64,
    /// What the client had said it received, in all, by the interval's end
    /// (its latest Feedback).
    pub received_bytes: u64,
}

/// A stream still sending, for intervals and `--metrics`.
#[derive(Debug, Clone)]
pub struct LiveStream {
    pub peer: SocketAddr,
    pub session: u64,
    pub sent_bytes: u64,
    /// The client's latest Feedback: what it has received so far.
    pub received_packets: u64,
    pub received_bytes: u64,
}

enum Phase {
    /// StartAck sent; no Feedback echoing its nonce yet.
    Awaiting { since: Instant },
    /// Launched; the main loop's thread sends.
    Sending {
        started: Instant,
        last_feedback: Instant,
        /// Why it was told to stop early, if it was.
        stopping: Option<StreamEnd>,
    },
    /// Sent; the End goes out every [`END_EVERY`] until the EndAck.
    Ending(Box<Ending>),
}

struct Ending {
    end: End,
    bytes: [u8; wire::END_LEN],
    attempts: u32,
    next_at: Instant,
    report: StreamReport,
}

struct Session {
    /// As received (v4-mapped on a dual-stack socket), local address the
    /// client sent to, and the receive socket it came in on.
    to: SocketAddr,
    local: Option<IpAddr>,
    socket: usize,
    /// The StartAck as sent, re-sent (with the retry's nonce) when the
    /// client asks again.
    ack: StartAck,
    order: StreamOrder,
    last: Option<Feedback>,
    /// Where the current interval opened: when, and the bytes sent by then.
    mark: Option<(Instant, u64)>,
    phase: Phase,
    breaker: Breaker,
}

/// The reverse sessions.
pub struct Reverse {
    cfg: ReverseConfig,
    sessions: HashMap<SessionKey, Session>,
    launches: Vec<StreamOrder>,
    done: Vec<StreamReport>,
    /// Streams' last partial intervals, written before their reports.
    last_intervals: Vec<StreamInterval>,
    /// Starts, Feedback and EndAcks ignored: bad tag, unknown session, or
    /// a stream nonce that is not the session's.
    pub rejected: u64,
    /// Starts refused (caps, stream count, bad cookie).
    pub refused: u64,
}

impl Reverse {
    pub fn new(cfg: ReverseConfig) -> Self {
        Reverse {
            cfg,
            sessions: HashMap::new(),
            launches: Vec::new(),
            done: Vec::new(),
            last_intervals: Vec::new(),
            rejected: 0,
            refused: 0,
        }
    }

    /// The cookie slot at `now`.
    fn slot(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.cfg.epoch).as_secs() / COOKIE_SLOT.as_secs()) + 1
    }

    /// The cookie for a Hello from `addr` (canonical) with `session`.
    pub fn cookie(&self, addr: SocketAddr, session: u64, now: Instant) -> u64 {
        self.cfg.cookies.cookie(addr, session, self.slot(now))
    }

    fn tagged<const N: usize>(&self, bytes: [u8; N]) -> [u8; N] {
        match &self.cfg.psk {
            Some(psk) => wire::encode_tagged(bytes, psk),
            None => bytes,
        }
    }

    fn verified(&mut self, raw: &[u8]) -> bool {
        let ok = self
            .cfg
            .psk
            .as_ref()
            .is_none_or(|psk| wire::verify_tag(raw, psk));
        if !ok {
            self.rejected += 1;
        }
        ok
    }

    /// Streams granted and not yet answered for: those that count against
    /// `--max-reverse-streams`.
    pub fn streams(&self) -> usize {
        self.sessions.len()
    }

    /// Those of them from `addr`'s source (an IPv4 address, an IPv6 /64):
    /// they count against `--max-reverse-streams-per-source`.
    pub fn from_source(&self, addr: SocketAddr) -> usize {
        let source = source_prefix(addr.ip());
        self.sessions
            .keys()
            .filter(|k| source_prefix(k.0.ip()) == source)
            .count()
    }

    /// A Start from `addr` (canonical; `to` as received). The caller has
    /// checked the source's answer budget.
    #[allow(clippy::too_many_arguments)]
    pub fn on_start(
        &mut self,
        start: Start,
        raw: &[u8],
        addr: SocketAddr,
        to: SocketAddr,
        local: Option<IpAddr>,
        socket: usize,
        now: Instant,
        replies: &mut Vec<Reply>,
    ) {
        if !self.verified(raw) {
            return;
        }
        let key = (addr, start.header.session);
        let reply = |bytes: [u8; START_LEN]| Reply {
            bytes: ReplyBytes::Start(bytes),
            to,
            from: local,
            socket,
        };
        if let Some(s) = self.sessions.get(&key) {
            // A retry (its StartAck was lost): the same answer, for this ask.
            let ack = StartAck {
                nonce: start.nonce,
                ..s.ack
            };
            replies.push(reply(self.tagged(wire::encode_start_ack(&ack))));
            return;
        }
        let mut ack = StartAck {
            session: start.header.session,
            nonce: start.nonce,
            max_duration_ns: self.cfg.caps.max_duration.as_nanos() as u64,
            ..StartAck::default()
        };
        let refusal =
            if !self
                .cfg
                .cookies
                .check(addr, start.header.session, start.cookie, self.slot(now))
            {
                Some((wire::START_BAD_COOKIE, 0))
            } else if start.direction != Direction::ServerToClient {
                Some((wire::START_BAD_REQUEST, 0))
            } else if self.sessions.len() >= self.cfg.caps.max_streams {
                Some((
                    wire::START_TOO_MANY_STREAMS,
                    self.cfg.caps.max_streams as u64,
                ))
            } else if self.from_source(addr) >= self.cfg.caps.max_per_source {
                Some((
                    wire::START_SOURCE_SHARE,
                    self.cfg.caps.max_per_source as u64,
                ))
            } else {
                None
            };
        let granted = match refusal {
            Some((status, limit)) => Err((status, limit, None)),
            None => grant(
                &start.request,
                &self.cfg.caps,
                addr.ip(),
                crate::sys::max_udp_payload(&to),
            )
            .map_err(|r| (r.status, r.limit, r.rate_bps)),
        };
        let granted = match granted {
            Ok(g) => g,
            Err((status, limit, rate)) => {
                // No state for a refusal: the answer is all there is.
                self.refused += 1;
                ack.status = status;
                ack.limit = limit;
                ack.rate_bps = rate.unwrap_or(0);
                replies.push(reply(self.tagged(wire::encode_start_ack(&ack))));
                return;
            }
        };
        ack.rate_bps = granted.rate_bps.unwrap_or(0);
        ack.stream_nonce = crate::auth::random_u64();
        let order = StreamOrder {
            key,
            to,
            from: local,
            socket,
            granted,
            control: Arc::new(StreamControl::default()),
            run: start.run,
        };
        replies.push(reply(self.tagged(wire::encode_start_ack(&ack))));
        self.sessions.insert(
            key,
            Session {
                to,
                local,
                socket,
                ack,
                order,
                last: None,
                mark: None,
                phase: Phase::Awaiting { since: now },
                breaker: Breaker::default(),
            },
        );
    }

    /// A Feedback: the first that echoes the stream nonce launches the
    /// stream; each one keeps it going.
    pub fn on_feedback(&mut self, feedback: Feedback, raw: &[u8], addr: SocketAddr, now: Instant) {
        if !self.verified(raw) {
            return;
        }
        let key = (addr, feedback.header.session);
        let Some(s) = self.sessions.get_mut(&key) else {
            self.rejected += 1;
            return;
        };
        if feedback.stream_nonce != s.ack.stream_nonce {
            self.rejected += 1;
            return;
        }
        s.last = Some(feedback);
        match &mut s.phase {
            Phase::Awaiting { .. } => {
                s.phase = Phase::Sending {
                    started: now,
                    last_feedback: now,
                    stopping: None,
                };
                self.launches.push(s.order.clone());
            }
            Phase::Sending {
                last_feedback,
                stopping,
                ..
            } => {
                *last_feedback = now;
                if stopping.is_some() {
                    return;
                }
                let control = &s.order.control;
                let sent = control
                    .sent_bytes
                    .load(std::sync::atomic::Ordering::Relaxed);
                let rate = s.breaker.rate_bps.or(s.order.granted.rate_bps);
                match s.breaker.feedback(now, sent, feedback.received_bytes, rate) {
                    Some(Trip::Slow(rate)) => control
                        .rate_bps
                        .store(rate, std::sync::atomic::Ordering::Relaxed),
                    Some(Trip::Stop) => {
                        *stopping = Some(StreamEnd::CircuitBreaker);
                        control.stop.trigger();
                    }
                    None => {}
                }
            }
            Phase::Ending(_) => {}
        }
    }

    /// The client's answer to the stream's End: the stream is done.
    pub fn on_end_ack(&mut self, ack: EndAck, raw: &[u8], addr: SocketAddr) {
        if !self.verified(raw) {
            return;
        }
        let key = (addr, ack.session);
        let answered = matches!(
            self.sessions.get(&key),
            Some(Session { phase: Phase::Ending(e), .. }) if e.end.nonce == ack.nonce
        );
        if !answered {
            self.rejected += 1;
            return;
        }
        let Some(Session {
            phase: Phase::Ending(ending),
            ..
        }) = self.sessions.remove(&key)
        else {
            unreachable!("checked above");
        };
        let mut report = ending.report;
        let drops = (ack.drops_start != wire::UNKNOWN && ack.drops_end != wire::UNKNOWN)
            .then(|| ack.drops_end.saturating_sub(ack.drops_start));
        report.received = Some(ClientReceived {
            packets: ack.received_packets,
            bytes: ack.received_bytes,
            lost_packets: ack.lost,
            duplicates: ack.duplicates,
            reordered: ack.reordered,
            kernel_drops: drops,
            jitter_ms: ack.jitter_ns as f64 / 1e6,
        });
        if report.reason == StreamEnd::NoAnswer {
            report.reason = StreamEnd::Answered;
        }
        self.done.push(report);
    }

    /// Whether a stream waits to be launched.
    pub fn has_launches(&self) -> bool {
        !self.launches.is_empty()
    }

    /// Whether a finished stream's report waits.
    pub fn has_done(&self) -> bool {
        !self.done.is_empty()
    }

    /// A reverse session table that keeps its own secret for cookies.
    pub fn with_fresh_cookies(
        caps: StreamCaps,
        psk: Option<Psk>,
        epoch: Instant,
        intervals: bool,
    ) -> Self {
        let cookies = CookieKey::random().unwrap_or_else(|| {
            // No OS randomness (never seen on Linux): random_u64 falls
            // back to a keyed hash of the time.
            let mut key = [0u8; 32];
            for chunk in key.chunks_mut(8) {
                chunk.copy_from_slice(&crate::auth::random_u64().to_be_bytes());
            }
            CookieKey::from_bytes(key)
        });
        Reverse::new(ReverseConfig {
            caps,
            psk,
            cookies,
            epoch,
            intervals,
        })
    }

    /// Streams to start sending now.
    pub fn take_launches(&mut self) -> Vec<StreamOrder> {
        std::mem::take(&mut self.launches)
    }

    /// Streams finished since the last call.
    pub fn take_done(&mut self) -> Vec<StreamReport> {
        std::mem::take(&mut self.done)
    }

    /// A sending thread returned: send the End (unless the client went
    /// silent: there is nobody to tell).
    pub fn sent(
        &mut self,
        key: SessionKey,
        result: StreamResult,
        now: Instant,
        replies: &mut Vec<Reply>,
    ) {
        let Some(mut s) = self.sessions.remove(&key) else {
            return;
        };
        if self.cfg.intervals {
            // What was sent since the last interval line: all of it has
            // been counted now that the thread returned.
            self.last_intervals.extend(close_interval(key, &mut s, now));
        }
        let stopping = match s.phase {
            Phase::Sending { stopping, .. } => stopping,
            _ => None,
        };
        let sent = &result.sent;
        let span = sent.timing.span();
        let cpu = sent
            .cpu
            .map(|c| CpuCost::of(c, sent.loop_time, sent.bytes).on_threads(1));
        let path = &result.path;
        let report = StreamReport {
            peer: key.0.to_string(),
            session: format!("{:016x}", key.1),
            direction: Direction::ServerToClient,
            sent_packets: sent.packets,
            sent_bytes: sent.bytes,
            seconds: span.as_secs_f64(),
            gbps: stats::rate_gbps(sent.bytes.saturating_sub(sent.timing.first_bytes), span),
            rate_bps: s.order.granted.rate_bps,
            cpu,
            enobufs_retries: result.enobufs_retries,
            send_path: match path.gso_segments {
                Some(n) => format!("{}, up to {n} datagrams per GSO buffer", path.name),
                None => path.name.clone(),
            },
            received: None,
            reason: match (&result.error, stopping) {
                (Some(_), _) => StreamEnd::Failed,
                (None, Some(why)) => why,
                (None, None) => StreamEnd::NoAnswer,
            },
            error: result.error.clone(),
            breaker: (s.breaker.backoffs > 0
                || matches!(stopping, Some(StreamEnd::CircuitBreaker)))
            .then_some(s.breaker),
            run: Some(s.order.run),
        };
        if matches!(report.reason, StreamEnd::Silent) {
            self.done.push(report);
            return;
        }
        let stopped = match report.reason {
            StreamEnd::MaxDuration => wire::STOPPED_MAX_DURATION,
            StreamEnd::Shutdown => wire::STOPPED_SHUTDOWN,
            StreamEnd::CircuitBreaker => wire::STOPPED_BREAKER,
            _ => 0,
        };
        let end = End {
            header: Header {
                session: key.1,
                seq: sent.packets,
                send_time_ns: sent.loop_time.as_nanos() as u64,
            },
            sent_packets: sent.packets,
            sent_bytes: sent.bytes,
            duration_ns: span.as_nanos() as u64,
            nonce: crate::auth::random_u64(),
            answer_wait_ns: (END_EVERY * END_ATTEMPTS).as_nanos() as u64,
            sender: Some(SenderStats {
                stopped,
                cpu_user_ns: sent.cpu.map_or(wire::UNKNOWN, |c| c.user.as_nanos() as u64),
                cpu_system_ns: sent
                    .cpu
                    .map_or(wire::UNKNOWN, |c| c.system.as_nanos() as u64),
                enobufs_retries: result.enobufs_retries,
                backoff_ns: result.backoff.as_nanos() as u64,
                calls: path.calls,
                gso_segments: path.gso_segments.unwrap_or(0) as u64,
                batch: path.batch as u64,
                first_call_packets: sent.timing.first_packets,
                first_call_bytes: sent.timing.first_bytes,
                breaker_backoffs: u64::from(s.breaker.backoffs),
                breaker_rate_bps: s.breaker.rate_bps.unwrap_or(0),
            }),
            tag: [0; wire::TAG_LEN],
        };
        let bytes = self.tagged(wire::encode_end(&end));
        replies.push(Reply {
            bytes: ReplyBytes::End(bytes),
            to: s.to,
            from: s.local,
            socket: s.socket,
        });
        s.phase = Phase::Ending(Box::new(Ending {
            end,
            bytes,
            attempts: 1,
            next_at: now + END_EVERY,
            report,
        }));
        self.sessions.insert(key, s);
    }

    /// Deadlines: a StartAck never confirmed, a client gone silent, a
    /// stream at `--max-duration`, an End to send again or give up on.
    pub fn tick(&mut self, now: Instant, replies: &mut Vec<Reply>) {
        let max = self.cfg.caps.max_duration;
        let mut forget = Vec::new();
        for (key, s) in self.sessions.iter_mut() {
            match &mut s.phase {
                Phase::Awaiting { since } => {
                    if now.saturating_duration_since(*since) >= AWAIT_FEEDBACK {
                        forget.push(*key);
                    }
                }
                Phase::Sending {
                    started,
                    last_feedback,
                    stopping,
                } => {
                    if stopping.is_some() {
                        continue;
                    }
                    if now.saturating_duration_since(*last_feedback) >= SILENCE {
                        *stopping = Some(StreamEnd::Silent);
                    } else if now.saturating_duration_since(*started) >= max {
                        *stopping = Some(StreamEnd::MaxDuration);
                    }
                    if stopping.is_some() {
                        s.order.control.stop.trigger();
                    }
                }
                Phase::Ending(e) => {
                    if now < e.next_at {
                        continue;
                    }
                    if e.attempts >= END_ATTEMPTS {
                        forget.push(*key);
                        continue;
                    }
                    e.attempts += 1;
                    e.next_at = now + END_EVERY;
                    replies.push(Reply {
                        bytes: ReplyBytes::End(e.bytes),
                        to: s.to,
                        from: s.local,
                        socket: s.socket,
                    });
                }
            }
        }
        for key in forget {
            let Some(s) = self.sessions.remove(&key) else {
                continue;
            };
            match s.phase {
                Phase::Ending(e) => self.done.push(e.report),
                _ => self
                    .done
                    .push(never_sent(key, &s.order, StreamEnd::NeverConfirmed)),
            }
        }
    }

    /// When [`Self::tick`] next has something to do.
    pub fn next_due(&self) -> Option<Instant> {
        self.sessions
            .values()
            .filter_map(|s| match &s.phase {
                Phase::Awaiting { since } => Some(*since + AWAIT_FEEDBACK),
                Phase::Sending {
                    started,
                    last_feedback,
                    stopping: None,
                } => Some((*last_feedback + SILENCE).min(*started + self.cfg.caps.max_duration)),
                Phase::Sending { .. } => None,
                Phase::Ending(e) => Some(e.next_at),
            })
            .min()
    }

    /// The server is stopping: every stream stops, and says so in its End.
    pub fn stop_all(&mut self) {
        for s in self.sessions.values_mut() {
            if let Phase::Sending { stopping, .. } = &mut s.phase {
                stopping.get_or_insert(StreamEnd::Shutdown);
                s.order.control.stop.trigger();
            }
        }
    }

    /// The server has stopped: every session left is reported as it
    /// stands (a stream stopped by [`Self::stop_all`] has had its End).
    pub fn finish_all(&mut self) -> Vec<StreamReport> {
        let mut done = self.take_done();
        for (key, s) in self.sessions.drain() {
            done.push(match s.phase {
                Phase::Ending(e) => e.report,
                _ => never_sent(key, &s.order, StreamEnd::Shutdown),
            });
        }
        done
    }

    /// Closes an interval of every stream that is sending (`--interval`):
    /// what each sent since the last one.
    pub fn intervals(&mut self, now: Instant) -> Vec<StreamInterval> {
        let mut out = Vec::new();
        for (key, s) in self.sessions.iter_mut() {
            if matches!(s.phase, Phase::Sending { .. }) {
                out.extend(close_interval(*key, s, now));
            }
        }
        out
    }

    /// Last partial intervals of streams that ended since the last call.
    pub fn take_last_intervals(&mut self) -> Vec<StreamInterval> {
        std::mem::take(&mut self.last_intervals)
    }

    /// Streams that are sending, with what they have sent so far.
    pub fn live(&self) -> Vec<LiveStream> {
        self.sessions
            .iter()
            .filter(|(_, s)| matches!(s.phase, Phase::Sending { .. }))
            .map(|(key, s)| LiveStream {
                peer: key.0,
                session: key.1,
                sent_bytes: s
                    .order
                    .control
                    .sent_bytes
                    .load(std::sync::atomic::Ordering::Relaxed),
                received_packets: s.last.map_or(0, |f| f.received_packets),
                received_bytes: s.last.map_or(0, |f| f.received_bytes),
            })
            .collect()
    }
}

/// The receive engine hands Starts, Feedback and EndAcks here, and asks
/// here for the cookie of each HelloAck.
impl Control for Reverse {
    fn on_control(
        &mut self,
        request: ControlRequest,
        may_answer: &mut dyn FnMut(Asker) -> bool,
        replies: &mut Vec<Reply>,
    ) -> bool {
        // A request that echoes its address's cookie is answered from its
        // flow's own budget, which forged requests cannot spend.
        let asker = |this: &Self, session: u64, cookie: u64, unproven: fn(SocketAddr) -> Asker| {
            if this.cookie_is_good(request.addr, session, cookie, request.now) {
                Asker::Proven((request.addr, session))
            } else {
                unproven(request.from)
            }
        };
        let start_asker = match &request.message {
            wire::Message::Start(start) => Some(asker(
                self,
                start.header.session,
                start.cookie,
                Asker::Unproven,
            )),
            wire::Message::Probe(probe) => Some(asker(
                self,
                probe.header.session,
                probe.cookie,
                Asker::UnprovenProbe,
            )),
            _ => None,
        };
        let ControlRequest {
            message,
            raw,
            addr,
            from,
            local,
            socket,
            now,
        } = request;
        match message {
            wire::Message::Start(start) => {
                if start_asker.is_some_and(&mut *may_answer) {
                    self.on_start(start, raw, addr, from, local, socket, now, replies);
                }
                false
            }
            wire::Message::Feedback(feedback) => {
                self.on_feedback(feedback, raw, addr, now);
                self.has_launches()
            }
            wire::Message::EndAck(ack) => {
                self.on_end_ack(ack, raw, addr);
                self.has_done()
            }
            wire::Message::Probe(probe) => {
                if start_asker.is_some_and(may_answer) {
                    let slot = self.slot(now);
                    let ack = super::probe::answer(&self.cfg.cookies, slot, &probe, addr);
                    replies.push(Reply {
                        bytes: ReplyBytes::Probe(wire::encode_probe_ack(&ack)),
                        to: from,
                        from: local,
                        socket,
                    });
                }
                false
            }
            _ => false,
        }
    }

    fn cookie(&self, addr: SocketAddr, session: u64, now: Instant) -> u64 {
        Reverse::cookie(self, addr, session, now)
    }

    fn cookie_is_good(&self, addr: SocketAddr, session: u64, cookie: u64, now: Instant) -> bool {
        cookie != 0
            && self
                .cfg
                .cookies
                .check(addr, session, cookie, self.slot(now))
    }
}

/// Closes session `s`'s current interval at `now` (None when it is not
/// sending, or the interval is empty and zero long).
fn close_interval(key: SessionKey, s: &mut Session, now: Instant) -> Option<StreamInterval> {
    let Phase::Sending { started, .. } = s.phase else {
        return None;
    };
    let sent = s
        .order
        .control
        .sent_bytes
        .load(std::sync::atomic::Ordering::Relaxed);
    let (from, before) = s.mark.unwrap_or((started, 0));
    s.mark = Some((now, sent));
    let span = now.saturating_duration_since(from);
    let bytes = sent.saturating_sub(before);
    Some(StreamInterval {
        peer: key.0.to_string(),
        session: format!("{:016x}", key.1),
        direction: Direction::ServerToClient,
        start: from.saturating_duration_since(started).as_secs_f64(),
        end: now.saturating_duration_since(started).as_secs_f64(),
        sent_bytes: bytes,
        gbps: if span.is_zero() {
            0.0
        } else {
            bytes as f64 * 8.0 / span.as_secs_f64() / 1e9
        },
        received_bytes: s.last.map_or(0, |f| f.received_bytes),
    })
}

/// The report of a stream that sent nothing.
fn never_sent(key: SessionKey, order: &StreamOrder, reason: StreamEnd) -> StreamReport {
    StreamReport {
        peer: key.0.to_string(),
        session: format!("{:016x}", key.1),
        direction: Direction::ServerToClient,
        sent_packets: 0,
        sent_bytes: 0,
        seconds: 0.0,
        gbps: None,
        rate_bps: order.granted.rate_bps,
        cpu: None,
        enobufs_retries: 0,
        send_path: String::new(),
        received: None,
        reason,
        error: None,
        breaker: None,
        run: Some(order.run),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::send::SendPath;
    use crate::meter::stream::{SendTiming, Sent};
    use crate::wire::{Amount, Message, StreamRequest};

    const SESSION: u64 = 0x5e55;

    fn table(max_streams: usize, psk: Option<Psk>, now: Instant) -> Reverse {
        Reverse::new(ReverseConfig {
            caps: StreamCaps {
                max_streams,
                max_per_source: max_streams.max(1),
                ..StreamCaps::default()
            },
            psk,
            cookies: CookieKey::from_bytes([7; 32]),
            epoch: now,
            intervals: false,
        })
    }

    fn client() -> SocketAddr {
        "127.0.0.1:40000".parse().unwrap()
    }

    fn start(cookie: u64, session: u64) -> Start {
        Start {
            header: Header {
                session,
                ..Header::default()
            },
            nonce: 11,
            cookie,
            direction: Direction::ServerToClient,
            request: StreamRequest {
                buffer_size: 1000,
                amount: Amount::Bytes(1_000_000),
                rate_bps: 0,
                flags: 0,
                batch: 32,
            },
            answer_wait_ns: 0,
            run: wire::Run::default(),
            tag: [0; wire::TAG_LEN],
        }
    }

    /// Sends `start` from `from` and returns the decoded answer.
    fn ask(t: &mut Reverse, start: &Start, from: SocketAddr, now: Instant) -> StartAck {
        let raw = match &t.cfg.psk {
            Some(psk) => wire::encode_tagged(wire::encode_start(start), psk),
            None => wire::encode_start(start),
        };
        let mut replies = Vec::new();
        t.on_start(*start, &raw, from, from, None, 0, now, &mut replies);
        assert_eq!(replies.len(), 1, "one answer per Start");
        assert!(
            replies[0].bytes.as_slice().len() <= raw.len(),
            "never larger than the ask"
        );
        match wire::decode(replies[0].bytes.as_slice()) {
            Ok(Message::StartAck(ack)) => ack,
            other => panic!("not a StartAck: {other:?}"),
        }
    }

    fn feedback(t: &mut Reverse, nonce: u64, session: u64, from: SocketAddr, now: Instant) {
        let fb = Feedback {
            header: Header {
                session,
                ..Header::default()
            },
            stream_nonce: nonce,
            ..Feedback::default()
        };
        let raw = match &t.cfg.psk {
            Some(psk) => wire::encode_tagged(wire::encode_feedback(&fb), psk),
            None => wire::encode_feedback(&fb),
        };
        t.on_feedback(fb, &raw, from, now);
    }

    /// A stream started the proper way (cookie, Start, first Feedback):
    /// its StartAck and the order the table launched.
    fn launched(t: &mut Reverse, now: Instant) -> (StartAck, StreamOrder) {
        let cookie = t.cookie(client(), SESSION, now);
        let ack = ask(t, &start(cookie, SESSION), client(), now);
        feedback(t, ack.stream_nonce, SESSION, client(), now);
        (ack, t.take_launches().remove(0))
    }

    #[test]
    fn a_source_holds_no_more_than_its_share_and_others_find_room() {
        let now = Instant::now();
        let mut t = table(8, None, now);
        t.cfg.caps.max_per_source = 2;
        let asks = |t: &mut Reverse, from: &str, session: u64| {
            let from: SocketAddr = from.parse().unwrap();
            let cookie = t.cookie(from, session, now);
            ask(t, &start(cookie, session), from, now)
        };
        assert_eq!(asks(&mut t, "10.0.0.1:1000", 1).status, wire::START_OK);
        assert_eq!(asks(&mut t, "10.0.0.1:1001", 2).status, wire::START_OK);
        let third = asks(&mut t, "10.0.0.1:1002", 3);
        assert_eq!((third.status, third.limit), (wire::START_SOURCE_SHARE, 2));
        // Another host is not held back.
        assert_eq!(asks(&mut t, "10.0.0.2:1000", 4).status, wire::START_OK);
        // An IPv6 /64 is one source.
        assert_eq!(asks(&mut t, "[2001:db8::1]:1000", 5).status, wire::START_OK);
        assert_eq!(asks(&mut t, "[2001:db8::2]:1000", 6).status, wire::START_OK);
        assert_eq!(
            asks(&mut t, "[2001:db8::3]:1000", 7).status,
            wire::START_SOURCE_SHARE
        );
        assert_eq!(
            asks(&mut t, "[2001:db8:0:1::3]:1000", 8).status,
            wire::START_OK
        );
    }

    #[test]
    fn an_unconfirmed_grant_gives_its_slot_back_within_a_second() {
        let now = Instant::now();
        let mut t = table(1, None, now);
        let cookie = t.cookie(client(), SESSION, now);
        assert_eq!(
            ask(&mut t, &start(cookie, SESSION), client(), now).status,
            wire::START_OK
        );
        let mut replies = Vec::new();
        t.tick(
            now + AWAIT_FEEDBACK - Duration::from_millis(1),
            &mut replies,
        );
        assert_eq!(t.streams(), 1, "still waiting for its Feedback");
        t.tick(now + AWAIT_FEEDBACK, &mut replies);
        assert_eq!(t.streams(), 0, "the slot is free");
        assert_eq!(t.take_done()[0].reason, StreamEnd::NeverConfirmed);
        assert!(AWAIT_FEEDBACK <= Duration::from_secs(1));
    }

    fn result(packets: u64, size: u64) -> StreamResult {
        let now = Instant::now();
        StreamResult {
            sent: Sent {
                packets,
                bytes: packets * size,
                untagged: 0,
                timing: SendTiming::new(now),
                started: now,
                loop_time: Duration::from_millis(5),
                intervals: Vec::new(),
                cpu: None,
                paced: None,
                send_time: Duration::ZERO,
                send_blocked: None,
            },
            path: SendPath {
                name: "sendmmsg".into(),
                batch: 32,
                gso: "off".into(),
                gso_segments: None,
                notes: Vec::new(),
                calls: 1,
            },
            enobufs_retries: 0,
            backoff: Duration::ZERO,
            error: None,
        }
    }

    #[test]
    fn no_stream_without_the_cookie_and_the_stream_nonce() {
        let now = Instant::now();
        let mut t = table(8, None, now);
        let ack = ask(&mut t, &start(0, SESSION), client(), now);
        assert_eq!(ack.status, wire::START_BAD_COOKIE);
        let other_port: SocketAddr = "127.0.0.1:40001".parse().unwrap();
        let cookie = t.cookie(other_port, SESSION, now);
        let ack = ask(&mut t, &start(cookie, SESSION), client(), now);
        assert_eq!(ack.status, wire::START_BAD_COOKIE, "a cookie is per port");
        assert_eq!(t.streams(), 0, "refusals leave no state");

        let cookie = t.cookie(client(), SESSION, now);
        let ack = ask(&mut t, &start(cookie, SESSION), client(), now);
        assert_eq!(ack.status, wire::START_OK);
        assert_ne!(ack.stream_nonce, 0);
        // A replayed Start gets the same answer; nothing is sent yet.
        let again = ask(&mut t, &start(cookie, SESSION), client(), now);
        assert_eq!(again.stream_nonce, ack.stream_nonce);
        assert!(t.take_launches().is_empty());
        // Feedback that does not echo the nonce starts nothing.
        feedback(&mut t, ack.stream_nonce ^ 1, SESSION, client(), now);
        assert!(t.take_launches().is_empty());
        assert_eq!(t.rejected, 1);
        feedback(&mut t, ack.stream_nonce, SESSION, client(), now);
        let launched = t.take_launches();
        assert_eq!(launched.len(), 1);
        assert_eq!(launched[0].granted.size, 1000);
        // Only once.
        feedback(&mut t, ack.stream_nonce, SESSION, client(), now);
        assert!(t.take_launches().is_empty());
    }

    #[test]
    fn a_cookie_expires_after_two_slots() {
        let now = Instant::now();
        let mut t = table(8, None, now);
        let cookie = t.cookie(client(), SESSION, now);
        let later = now + COOKIE_SLOT * 2 + Duration::from_secs(1);
        assert_eq!(
            ask(&mut t, &start(cookie, SESSION), client(), later).status,
            wire::START_BAD_COOKIE
        );
        let next_slot = now + COOKIE_SLOT + Duration::from_secs(1);
        assert_eq!(
            ask(&mut t, &start(cookie, SESSION), client(), next_slot).status,
            wire::START_OK
        );
    }

    #[test]
    fn streams_beyond_the_cap_are_refused_with_the_cap() {
        let now = Instant::now();
        let mut t = table(2, None, now);
        for session in 1..=2 {
            let cookie = t.cookie(client(), session, now);
            assert_eq!(
                ask(&mut t, &start(cookie, session), client(), now).status,
                wire::START_OK
            );
        }
        let cookie = t.cookie(client(), 3, now);
        let ack = ask(&mut t, &start(cookie, 3), client(), now);
        assert_eq!((ack.status, ack.limit), (wire::START_TOO_MANY_STREAMS, 2));
        // An unconfirmed stream frees its slot after AWAIT_FEEDBACK.
        let mut replies = Vec::new();
        t.tick(now + AWAIT_FEEDBACK, &mut replies);
        assert_eq!(t.streams(), 0);
        let reasons: Vec<_> = t.take_done().iter().map(|r| r.reason).collect();
        assert_eq!(reasons, [StreamEnd::NeverConfirmed; 2]);
        assert_eq!(
            ask(&mut t, &start(cookie, 3), client(), now + AWAIT_FEEDBACK).status,
            wire::START_OK
        );
    }

    #[test]
    fn silence_stops_the_stream_and_no_end_is_sent() {
        let now = Instant::now();
        let mut t = table(8, None, now);
        let (_, order) = launched(&mut t, now);
        let mut replies = Vec::new();
        assert_eq!(t.next_due(), Some(now + SILENCE));
        t.tick(now + SILENCE - Duration::from_millis(1), &mut replies);
        assert!(!order.control.stop.is_triggered());
        t.tick(now + SILENCE, &mut replies);
        assert!(order.control.stop.is_triggered(), "silence stops it");
        t.sent(order.key, result(10, 1000), now + SILENCE, &mut replies);
        assert!(replies.is_empty(), "nobody to send an End to");
        let done = t.take_done();
        assert_eq!(done[0].reason, StreamEnd::Silent);
        assert_eq!(done[0].sent_packets, 10);
        assert_eq!(t.streams(), 0);
    }

    #[test]
    fn the_end_is_repeated_until_answered_then_bounded() {
        let now = Instant::now();
        let psk = Psk::new(b"correct horse").unwrap();
        let mut t = table(8, Some(psk.clone()), now);
        let (_, order) = launched(&mut t, now);
        let mut replies = Vec::new();
        t.sent(order.key, result(1000, 1000), now, &mut replies);
        assert_eq!(replies.len(), 1);
        let raw = replies[0].bytes.as_slice().to_vec();
        assert!(wire::verify_tag(&raw, &psk), "the End carries the tag");
        let Ok(Message::End(end)) = wire::decode(&raw) else {
            panic!("not an End")
        };
        assert_eq!((end.sent_packets, end.sent_bytes), (1000, 1_000_000));
        assert!(end.sender.is_some());
        // Repeated every END_EVERY, END_ATTEMPTS times in all.
        let mut at = now;
        for _ in 1..END_ATTEMPTS {
            at += END_EVERY;
            t.tick(at, &mut replies);
        }
        assert_eq!(replies.len(), END_ATTEMPTS as usize);
        // An untagged or wrong-nonce EndAck changes nothing.
        let answer = EndAck {
            session: SESSION,
            nonce: end.nonce,
            received_packets: 990,
            received_bytes: 990_000,
            lost: 10,
            drops_start: 3,
            drops_end: 5,
            ..EndAck::default()
        };
        t.on_end_ack(answer, &wire::encode_end_ack(&answer), client());
        let wrong = EndAck {
            nonce: end.nonce ^ 1,
            ..answer
        };
        t.on_end_ack(wrong, &wire::encode_end_ack_tagged(&wrong, &psk), client());
        assert!(t.take_done().is_empty());
        t.on_end_ack(
            answer,
            &wire::encode_end_ack_tagged(&answer, &psk),
            client(),
        );
        let done = t.take_done();
        assert_eq!(done[0].reason, StreamEnd::Answered);
        let received = done[0].received.as_ref().unwrap();
        assert_eq!(
            (
                received.packets,
                received.lost_packets,
                received.kernel_drops
            ),
            (990, 10, Some(2))
        );
        assert_eq!(t.streams(), 0);
    }

    #[test]
    fn an_unanswered_end_is_given_up() {
        let now = Instant::now();
        let mut t = table(8, None, now);
        let (_, order) = launched(&mut t, now);
        let mut replies = Vec::new();
        t.sent(order.key, result(5, 1000), now, &mut replies);
        let mut at = now;
        for _ in 0..END_ATTEMPTS + 2 {
            at += END_EVERY;
            t.tick(at, &mut replies);
        }
        assert_eq!(replies.len(), END_ATTEMPTS as usize, "bounded");
        let done = t.take_done();
        assert_eq!(done[0].reason, StreamEnd::NoAnswer);
        assert_eq!(t.streams(), 0);
        assert_eq!(t.next_due(), None);
    }

    #[test]
    fn max_duration_stops_a_stream_that_overruns() {
        let now = Instant::now();
        let mut t = table(8, None, now);
        let cookie = t.cookie(client(), SESSION, now);
        let ack = ask(&mut t, &start(cookie, SESSION), client(), now);
        let max = t.cfg.caps.max_duration;
        let mut at = now;
        feedback(&mut t, ack.stream_nonce, SESSION, client(), at);
        let order = t.take_launches().remove(0);
        let mut replies = Vec::new();
        while at < now + max {
            at += Duration::from_millis(100);
            feedback(&mut t, ack.stream_nonce, SESSION, client(), at);
            t.tick(at, &mut replies);
        }
        assert!(order.control.stop.is_triggered());
        t.sent(order.key, result(5, 1000), at, &mut replies);
        let Ok(Message::End(end)) = wire::decode(replies[0].bytes.as_slice()) else {
            panic!("not an End")
        };
        assert_eq!(end.sender.unwrap().stopped, wire::STOPPED_MAX_DURATION);
    }
}
