//! `udp_server --stamp`: a STAMP Session-Reflector (RFC 8762, with RFC
//! 8972's SSID) on a socket and a thread of its own, beside the server.
//!
//! What it answers: unauthenticated test packets of 44 bytes or more, at
//! their own size (symmetrical), statefully ([`sessions`]: its own
//! sequence number per session), with the SSID and the trailer's TLVs as
//! RFC 8972 asks of a reflector that interprets none
//! ([`crate::stamp::tlv`]), T2 from the kernel's receive timestamp where
//! the platform gives one, the request's TTL or hop limit where it gives
//! that, and an error estimate that claims synchronisation only when told
//! to ([`crate::stamp::local_estimate`]).
//!
//! What it never does: answer with more bytes than the request brought
//! (a shorter request is not answered: see [`crate::stamp::StampError`]),
//! or answer a source beyond its budget ([`budget`]): per source address,
//! per IPv4 address or IPv6 /64, and for the server, counted without
//! state per source.
//!
//! Why its own receive loop, not the meter's: the answer is written into
//! the buffer the request arrived in and sent back from it
//! ([`crate::sys::ReplyBatch`]), a batch of answers per sendmmsg, so a
//! request costs no copy and no allocation. The loop blocks in recvmmsg
//! (`MSG_WAITFORONE`) and takes up to [`RECV_BATCH`] requests per wake-up.

pub mod budget;
pub mod sessions;

use crate::config::StampSettings;
use crate::error::{Error, Result};
use crate::shutdown::{Shutdown, POLL};
use crate::stamp::{self, ErrorEstimate, Reflection, TTL_UNKNOWN};
use crate::stats::CpuTime;
use crate::sys::{self, BufferGrant, RecvBatch, ReplyBatch};
use budget::{Budget, Limits, Refusal};
use serde::Serialize;
use sessions::{Numbered, SessionKey, Sessions};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant, SystemTime};

/// Requests per recvmmsg call, and answers per sendmmsg.
pub const RECV_BATCH: usize = 32;
/// Each request's buffer: the largest UDP payload fits.
const RECV_BUF_SIZE: usize = 65536;
/// The receive buffer asked for: about 5000 small requests, 50 ms at
/// 100 000 a second, so a burst is answered rather than dropped.
pub const RECV_BUFFER: usize = 4 << 20;
/// How often the session table is swept and the clock's bound re-read.
const HOUSEKEEPING: Duration = Duration::from_secs(1);

/// The reflector's socket, bound, and what the platform gives it.
pub struct StampListener {
    pub socket: Socket,
    pub addr: SocketAddr,
    pub buffer: BufferGrant,
    /// T2 is the kernel's receive time (SO_TIMESTAMPNS); else the time
    /// the request was read.
    pub kernel_timestamps: bool,
    /// The request's TTL or hop limit is read (IP_RECVTTL); else the
    /// answer says 0, unknown.
    pub ttl: bool,
    /// Answers leave from the address the request was sent to
    /// (IP_PKTINFO), for a socket bound to a wildcard address.
    pub from_local: bool,
    /// The error estimate it starts with.
    pub error: ErrorEstimate,
}

fn bind_socket(addr: SocketAddr) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        socket.set_only_v6(false)?;
    }
    socket.bind(&SockAddr::from(addr))?;
    Ok(socket)
}

/// Binds the reflector's socket (dual-stack for `[::]`, falling back to
/// IPv4 when only a port was given and IPv6 is unavailable) and turns on
/// what the platform has: kernel timestamps, TTLs, local addresses, the
/// kernel's drop counter.
pub fn bind(cfg: &StampSettings) -> Result<StampListener> {
    let socket = match bind_socket(cfg.listen) {
        Ok(s) => s,
        Err(e) if cfg.listen_is_port_only && e.kind() != io::ErrorKind::AddrInUse => {
            let v4 = SocketAddr::from((Ipv4Addr::UNSPECIFIED, cfg.listen.port()));
            bind_socket(v4)
                .map_err(|e| Error::runtime(format!("--stamp: cannot bind {v4}: {e}")))?
        }
        Err(e) => {
            return Err(Error::runtime(format!(
                "--stamp: cannot bind {}: {e}",
                cfg.listen
            )))
        }
    };
    let addr = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or_else(|| Error::runtime("--stamp: cannot read the bound address"))?;
    let buffer = sys::size_buffer(&socket, sys::BufferSide::Receive, Some(RECV_BUFFER))?;
    let kernel_timestamps = sys::enable_rx_timestamps(&socket).is_ok();
    let ttl = sys::enable_rx_ttl(&socket).is_ok();
    let from_local = addr.ip().is_unspecified() && sys::enable_local_address(&socket).is_ok();
    // Where the platform has no drop counter, none is reported.
    let _ = sys::enable_kernel_drop_counter(&socket);
    socket
        .set_nonblocking(false)
        .and_then(|()| socket.set_read_timeout(Some(POLL)))
        .map_err(|e| Error::io("--stamp: cannot set the socket's time-out", e))?;
    Ok(StampListener {
        socket,
        addr,
        buffer,
        kernel_timestamps,
        ttl,
        from_local,
        error: stamp::local_estimate(cfg.clock.synchronized, cfg.clock.error),
    })
}

/// Requests that got no answer, by why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Unanswered {
    /// Shorter than the 44-byte base packet.
    pub too_short: u64,
    /// Over their source's budget, their prefix's, or the server's.
    pub over_source_budget: u64,
    pub over_prefix_budget: u64,
    pub over_total_budget: u64,
    /// The answer could not be sent (the kernel refused it).
    pub send_failed: u64,
}

/// What the reflector counted, from its start or over an interval.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ReflectorCounts {
    /// The span counted, in seconds.
    pub seconds: f64,
    /// Datagrams read from the socket.
    pub received: u64,
    /// Answers sent.
    pub answered: u64,
    /// Of these, answered statelessly: their session found the table full.
    pub answered_stateless: u64,
    pub unanswered: Unanswered,
    /// Requests whose error estimate had a multiplier of 0 (answered all
    /// the same; RFC 4656 only says such a packet "SHOULD" be discarded).
    pub invalid_error_estimates: u64,
    /// Requests with a TLV that ran past the packet (marked U and M).
    pub malformed_tlvs: u64,
    /// Datagrams the kernel dropped because the socket's buffer was full
    /// (SO_RXQ_OVFL); absent where the platform does not count them.
    pub kernel_drops: Option<u64>,
}

/// The reflector's figures: each interval's, and its whole run's with its
/// sessions and its CPU.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReflectorReport {
    pub addr: String,
    #[serde(flatten)]
    pub counts: ReflectorCounts,
    /// Sessions in the table now, at most at once, begun, and forgotten
    /// after the timeout.
    pub sessions: u64,
    pub sessions_peak: u64,
    pub sessions_started: u64,
    pub sessions_expired: u64,
    /// The reflector thread's CPU, in seconds (absent where unknown).
    pub cpu_seconds: Option<f64>,
    /// The same per million answers.
    pub cpu_seconds_per_million: Option<f64>,
    /// Whether this is the run's last report.
    pub last: bool,
}

/// The whole run's counts, and the interval's start.
struct Tally {
    run: ReflectorCounts,
    /// `run` when the interval began.
    mark: ReflectorCounts,
    /// The socket's drop counter when the reflector began, and now (a u32
    /// that wraps).
    drops_first: Option<u32>,
    drops_now: Option<u32>,
}

impl Tally {
    fn note_drops(&mut self, drops: Option<u32>) {
        if let Some(d) = drops {
            self.drops_first.get_or_insert(d);
            self.drops_now = Some(d);
        }
    }

    fn drops(&self) -> Option<u64> {
        match (self.drops_first, self.drops_now) {
            (Some(first), Some(now)) => Some(u64::from(now.wrapping_sub(first))),
            _ => None,
        }
    }
}

fn since(now: &ReflectorCounts, then: &ReflectorCounts, seconds: f64) -> ReflectorCounts {
    let u = &now.unanswered;
    let t = &then.unanswered;
    ReflectorCounts {
        seconds,
        received: now.received - then.received,
        answered: now.answered - then.answered,
        answered_stateless: now.answered_stateless - then.answered_stateless,
        unanswered: Unanswered {
            too_short: u.too_short - t.too_short,
            over_source_budget: u.over_source_budget - t.over_source_budget,
            over_prefix_budget: u.over_prefix_budget - t.over_prefix_budget,
            over_total_budget: u.over_total_budget - t.over_total_budget,
            send_failed: u.send_failed - t.send_failed,
        },
        invalid_error_estimates: now.invalid_error_estimates - then.invalid_error_estimates,
        malformed_tlvs: now.malformed_tlvs - then.malformed_tlvs,
        kernel_drops: match (now.kernel_drops, then.kernel_drops) {
            (Some(a), Some(b)) => Some(a.saturating_sub(b)),
            (a, _) => a,
        },
    }
}

/// The wall clock, as Unix nanoseconds.
fn unix_ns_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Everything the loop keeps between batches.
struct Reflector<'a> {
    cfg: &'a StampSettings,
    listener: &'a StampListener,
    budget: Budget,
    sessions: Sessions,
    error: ErrorEstimate,
    tally: Tally,
    /// (slot, length) of this batch's answers.
    answers: Vec<(usize, usize)>,
}

impl Reflector<'_> {
    /// Turns each request of the batch into its answer, in place, and
    /// notes which to send.
    fn answer_batch(&mut self, batch: &mut RecvBatch, count: usize) {
        let now = Instant::now();
        // One clock read per batch: T3 of every answer built now (they go
        // out together, in one call), and T2 where the kernel gave none.
        let wall = unix_ns_now();
        let t3 = stamp::time::ntp_from_unix_ns(wall);
        self.answers.clear();
        for i in 0..count {
            let datagram = batch.datagram(i);
            self.tally.note_drops(datagram.kernel_drops);
            let counts = &mut self.tally.run;
            counts.received += 1;
            let Some(from) = datagram.from else { continue };
            let request = match stamp::decode_test(datagram.data) {
                Ok(r) if !datagram.truncated => r,
                _ => {
                    counts.unanswered.too_short += 1;
                    continue;
                }
            };
            match self.budget.charge(from, now) {
                Ok(()) => {}
                Err(Refusal::Source) => {
                    counts.unanswered.over_source_budget += 1;
                    continue;
                }
                Err(Refusal::Prefix) => {
                    counts.unanswered.over_prefix_budget += 1;
                    continue;
                }
                Err(Refusal::Total) => {
                    counts.unanswered.over_total_budget += 1;
                    continue;
                }
            }
            let numbered =
                self.sessions
                    .number(SessionKey::new(from, request.ssid), request.seq, now);
            if let Numbered::Echoed(_) = numbered {
                counts.answered_stateless += 1;
            }
            let reflection = Reflection {
                seq: numbered.seq(),
                receive_timestamp: stamp::time::ntp_from_unix_ns(
                    datagram.rx_time_ns.unwrap_or(wall),
                ),
                timestamp: t3,
                error: self.error,
                ttl: datagram.ttl.unwrap_or(TTL_UNKNOWN),
            };
            let length = datagram.data.len();
            if !request.error.is_valid() {
                counts.invalid_error_estimates += 1;
            }
            match stamp::reflect_in_place(batch.datagram_mut(i), &reflection) {
                Ok((_, walk)) => {
                    if walk.malformed {
                        counts.malformed_tlvs += 1;
                    }
                    self.answers.push((i, length));
                }
                Err(_) => counts.unanswered.too_short += 1,
            }
        }
    }

    /// Sends the batch's answers; what the kernel refuses is dropped and
    /// counted.
    fn send_answers(&mut self, replies: &mut ReplyBatch, batch: &RecvBatch) {
        let mut sent = 0;
        while sent < self.answers.len() {
            match replies.send(
                &self.listener.socket,
                batch,
                &self.answers[sent..],
                self.listener.from_local,
            ) {
                Ok(0) => break,
                Ok(n) => {
                    self.tally.run.answered += n as u64;
                    sent += n;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    // One answer the kernel will not take (an address it
                    // cannot reach): skip it, send the others.
                    self.tally.run.unanswered.send_failed += 1;
                    sent += 1;
                }
            }
        }
    }

    fn report(
        &mut self,
        started: Instant,
        interval_start: Instant,
        cpu: Option<Duration>,
        last: bool,
    ) -> ReflectorReport {
        let now = Instant::now();
        self.tally.run.kernel_drops = self.tally.drops();
        self.tally.run.seconds = now.duration_since(started).as_secs_f64();
        let counts = if last {
            self.tally.run.clone()
        } else {
            let span = now.duration_since(interval_start).as_secs_f64();
            since(&self.tally.run, &self.tally.mark, span)
        };
        self.tally.mark = self.tally.run.clone();
        let cpu_seconds = cpu.map(|c| c.as_secs_f64());
        ReflectorReport {
            addr: self.listener.addr.to_string(),
            sessions: self.sessions.len() as u64,
            sessions_peak: self.sessions.peak as u64,
            sessions_started: self.sessions.started,
            sessions_expired: self.sessions.expired,
            cpu_seconds_per_million: cpu_seconds
                .filter(|_| counts.answered > 0)
                .map(|c| c * 1e6 / counts.answered as f64),
            cpu_seconds: cpu_seconds.filter(|_| last),
            counts,
            last,
        }
    }
}

/// Answers STAMP test packets on `listener` until `shutdown`, reporting
/// every `cfg.interval` in which something arrived through `events`;
/// returns the whole run's report.
pub fn run(
    listener: &StampListener,
    cfg: &StampSettings,
    shutdown: &Shutdown,
    events: &mut dyn FnMut(ReflectorReport),
) -> ReflectorReport {
    let started = Instant::now();
    let cpu_at_start = sys::thread_cpu();
    let mut reflector = Reflector {
        cfg,
        listener,
        budget: Budget::new(
            Limits {
                per_source: cfg.max_per_source,
                per_prefix: cfg.max_per_prefix,
                total: cfg.max_total,
            },
            started,
        ),
        sessions: Sessions::new(cfg.max_sessions, cfg.session_timeout, started),
        error: listener.error,
        tally: Tally {
            run: ReflectorCounts::default(),
            mark: ReflectorCounts::default(),
            drops_first: None,
            drops_now: None,
        },
        answers: Vec::with_capacity(RECV_BATCH),
    };
    let mut batch = RecvBatch::new(RECV_BATCH, RECV_BUF_SIZE);
    let mut replies = ReplyBatch::new(RECV_BATCH);
    let mut housekeeping = started + HOUSEKEEPING;
    let mut interval_start = started;
    let mut next_report = cfg.interval.map(|i| started + i);
    while !shutdown.is_triggered() {
        match batch.recv(&listener.socket) {
            Ok(n) => {
                reflector.answer_batch(&mut batch, n);
                reflector.send_answers(&mut replies, &batch);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            // An error for one peer (an ICMP error queued by the kernel)
            // must not stop the reflector; a short pause, no busy loop.
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
        let now = Instant::now();
        if now >= housekeeping {
            reflector.sessions.expire(now);
            reflector.error = stamp::local_estimate(cfg.clock.synchronized, cfg.clock.error);
            housekeeping = now + HOUSEKEEPING;
        }
        if let Some(due) = next_report.filter(|&d| now >= d) {
            let quiet = reflector.tally.run.received == reflector.tally.mark.received;
            if !quiet {
                let cpu = cpu_used(cpu_at_start);
                events(reflector.report(started, interval_start, cpu, false));
            }
            interval_start = now;
            next_report = reflector.cfg.interval.map(|i| due.max(now - i) + i);
        }
    }
    let cpu = cpu_used(cpu_at_start);
    reflector.report(started, interval_start, cpu, true)
}

fn cpu_used(at_start: Option<CpuTime>) -> Option<Duration> {
    Some(sys::thread_cpu()?.since(at_start?).total())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StampClock;
    use crate::stamp::{decode_reflected, encode_test, TestPacket};
    use std::net::UdpSocket;

    fn settings() -> StampSettings {
        StampSettings {
            listen: "127.0.0.1:0".parse().unwrap(),
            listen_is_port_only: false,
            max_per_source: 1000,
            max_per_prefix: 1000,
            max_total: 10_000,
            max_sessions: 16,
            session_timeout: Duration::from_secs(60),
            clock: StampClock::default(),
            interval: None,
        }
    }

    #[test]
    fn it_answers_in_place_at_the_requests_size_and_counts_its_own_numbers() {
        let cfg = settings();
        let listener = bind(&cfg).unwrap();
        let shutdown = Shutdown::new();
        let to = listener.addr;
        let report = std::thread::scope(|scope| {
            let running = scope.spawn(|| run(&listener, &cfg, &shutdown, &mut |_| {}));
            let client = UdpSocket::bind("127.0.0.1:0").unwrap();
            client
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            client.set_ttl(42).unwrap();
            let mut buf = [0u8; 2000];
            for (own, (seq, size)) in [(5u32, 44usize), (6, 100), (9, 1400)]
                .into_iter()
                .enumerate()
            {
                let mut packet = vec![0u8; size];
                encode_test(
                    &TestPacket {
                        seq,
                        timestamp: 77,
                        error: ErrorEstimate::from_bits(1),
                        ssid: 0xBEEF,
                    },
                    &mut packet,
                )
                .unwrap();
                client.send_to(&packet, to).unwrap();
                let n = client.recv(&mut buf).unwrap();
                assert_eq!(n, size, "symmetrical");
                let a = decode_reflected(&buf[..n]).unwrap();
                assert_eq!(
                    (a.sender_seq, a.ssid, a.sender_timestamp),
                    (seq, 0xBEEF, 77)
                );
                assert_eq!(a.seq, own as u32, "its own count: 0, 1, 2");
                assert_eq!(a.sender_ttl, if sys::RX_TTL { 42 } else { 0 });
                assert!(a.error.is_valid() && !a.error.synchronized);
                assert!(a.timestamp >= a.receive_timestamp, "T3 after T2");
            }
            // Too short: never answered.
            client
                .set_read_timeout(Some(Duration::from_millis(300)))
                .unwrap();
            client.send_to(&[0u8; 43], to).unwrap();
            assert!(client.recv(&mut buf).is_err(), "no answer to 43 bytes");
            shutdown.trigger();
            running.join().unwrap()
        });
        assert_eq!(report.counts.received, 4);
        assert_eq!(report.counts.answered, 3);
        assert_eq!(report.counts.unanswered.too_short, 1);
        assert_eq!((report.sessions, report.sessions_started), (1, 1));
    }
}
