//! `udp_client --stamp-reflector HOST[:PORT] --no-load`: round trips to a
//! STAMP reflector (RFC 8762, RFC 8972's SSID), with nothing else on the
//! path from this host.
//!
//! The pieces: [`session`] sends one test packet and turns an answer into
//! a sample, on a socket its caller owns (what a prober beside a load
//! would call as well); [`tally`] adds samples up (percentiles, loss, and
//! loss by direction from a stateful reflector's numbers); [`run`] paces
//! the test packets every `--stamp-interval` for `--count` packets or
//! `--duration`, reads answers in between, waits `--end-timeout` for the
//! last ones, and returns a [`StampReport`] for output to show.

pub mod session;
pub mod tally;

use super::{open_socket, Interrupted, EXIT_NO_ANSWER};
use crate::config::StampSender;
use crate::error::Result;
use crate::shutdown::Shutdown;
use crate::stamp::{self, Clock, ErrorEstimate};
use serde::Serialize;
use session::{unix_ns_now, StampSession, Stray};
use std::io;
use std::time::{Duration, Instant};
use tally::{LossSplit, Numbering, Percentiles, Tally};

/// One-way delays, each way.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OneWay {
    /// T2 − T1: to the reflector.
    pub forward_ms: Percentiles,
    /// T4 − T3: back.
    pub backward_ms: Percentiles,
}

/// What a `--no-load` STAMP run measured.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize)]
pub struct StampReport {
    pub reflector: String,
    /// Ours, sent in every test packet.
    pub ssid: u16,
    /// Bytes per test packet (UDP payload).
    pub size: usize,
    pub interval_ms: f64,
    /// From the first test packet to the end of the wait for answers.
    pub seconds: f64,
    pub sent: u64,
    /// Test packets whose answer came back (each counted once).
    pub answered: u64,
    pub lost: u64,
    /// `lost` in % of `sent`; null when nothing was sent.
    #[serialize_always]
    pub loss_percent: Option<f64>,
    /// Loss by direction, when the reflector's numbers allow it.
    #[serialize_always]
    pub loss_split: Option<LossSplit>,
    /// What the split rests on, or why there is none.
    pub loss_split_basis: &'static str,
    /// How the reflector numbered its answers (null without answers).
    #[serialize_always]
    pub reflector_numbering: Option<Numbering>,
    /// The highest number the reflector gave an answer.
    pub last_reflector_seq: Option<u32>,
    /// Round trips, T4 − T1 (what ping shows), in ms.
    #[serialize_always]
    pub rtt_ms: Option<Percentiles>,
    /// The same less the time the reflector held each packet (T3 − T2).
    #[serialize_always]
    pub network_rtt_ms: Option<Percentiles>,
    /// One-way delays, only when both clocks say they are synchronised.
    #[serialize_always]
    pub one_way: Option<OneWay>,
    /// Ours, as sent; the reflector's, from its last answer.
    pub clock: Clock,
    pub reflector_clock: Option<Clock>,
    /// The TTL or hop limit our last answered packet reached the
    /// reflector with (null when it did not say: 0).
    pub ttl_at_reflector: Option<u8>,
    /// Answers whose SSID was 0: a reflector without RFC 8972.
    pub zero_ssid_answers: u64,
    /// Answers whose error estimate had a multiplier of 0.
    pub invalid_error_estimates: u64,
    /// Answers matched to no test packet.
    pub stray: Stray,
    /// The host said "port unreachable" (ICMP) this many times.
    pub refused: u64,
    pub interrupted: Option<Interrupted>,
}

impl StampReport {
    /// 0, or [`EXIT_NO_ANSWER`] when no answer came back.
    pub fn exit_code(&self) -> i32 {
        if self.answered > 0 {
            0
        } else {
            EXIT_NO_ANSWER
        }
    }
}

/// A random SSID: any but 0, which means none.
pub(crate) fn random_ssid() -> u16 {
    loop {
        let ssid = crate::auth::random_u64() as u16;
        if ssid != 0 {
            return ssid;
        }
    }
}

/// Reads what is there until `until` (or a signal), folding answers into
/// `tally`.
fn read_until(
    socket: &std::net::UdpSocket,
    session: &mut StampSession,
    tally: &mut Tally,
    refused: &mut u64,
    buf: &mut [u8],
    until: Instant,
    shutdown: &Shutdown,
) {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || shutdown.is_triggered() {
            return;
        }
        let _ = socket.set_read_timeout(Some(left.min(crate::shutdown::POLL)));
        match socket.recv(buf) {
            Ok(n) => {
                let arrived = Instant::now();
                if let Some(sample) = session.answer(&buf[..n], arrived, unix_ns_now()) {
                    tally.add(&sample);
                }
            }
            Err(e) if crate::sys::is_refused(&e) => *refused += 1,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            // Anything else (an ICMP error other than "refused"): go on.
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// Sends test packets to `cfg.reflector` and measures their answers, until
/// the count is sent or the duration is over (or a signal), then waits
/// for the last answers.
pub fn run(cfg: &StampSender, shutdown: &Shutdown) -> Result<StampReport> {
    let socket = open_socket(cfg.reflector, true, false, cfg.bind)?;
    let error = stamp::local_estimate(cfg.clock.synchronized, cfg.clock.error);
    let mut session = StampSession::new(cfg.ssid.unwrap_or_else(random_ssid), cfg.size, error);
    let mut tally = Tally::default();
    let mut refused = 0;
    let mut buf = vec![0u8; 65536];
    let started = Instant::now();
    let mut next = started;
    let mut last_sent = started;
    let done = |sent: u64, now: Instant| {
        cfg.count.is_some_and(|c| sent >= c)
            || cfg
                .duration
                .is_some_and(|d| now.duration_since(started) >= d)
    };
    while !shutdown.is_triggered() {
        let now = Instant::now();
        if done(session.sent(), now) {
            break;
        }
        if now >= next {
            match session.send(&socket) {
                Ok(_) => last_sent = now,
                Err(e) if crate::sys::is_refused(&e) => refused += 1,
                // A full queue or the like: the packet is not sent, and
                // its number goes to the next.
                Err(_) => {}
            }
            next += cfg.interval;
            // Behind by more than a packet (descheduled): no burst to
            // catch up, the schedule moves on.
            if next < now {
                next = now + cfg.interval;
            }
            if done(session.sent(), now) {
                break;
            }
        }
        let until = match cfg.duration {
            Some(d) => next.min(started + d),
            None => next,
        };
        read_until(
            &socket,
            &mut session,
            &mut tally,
            &mut refused,
            &mut buf,
            until,
            shutdown,
        );
    }
    // The last answers: until each is in, or the wait is over.
    let wait_end = last_sent.max(Instant::now()) + cfg.wait;
    while tally.answered < session.sent() && Instant::now() < wait_end && !shutdown.is_triggered() {
        let step = wait_end.min(Instant::now() + Duration::from_millis(10));
        read_until(
            &socket,
            &mut session,
            &mut tally,
            &mut refused,
            &mut buf,
            step,
            shutdown,
        );
    }
    Ok(report(
        cfg, &session, &tally, refused, started, error, shutdown,
    ))
}

fn report(
    cfg: &StampSender,
    session: &StampSession,
    tally: &Tally,
    refused: u64,
    started: Instant,
    error: ErrorEstimate,
    shutdown: &Shutdown,
) -> StampReport {
    let sent = session.sent();
    let lost = sent.saturating_sub(tally.answered);
    let (loss_split, loss_split_basis) = match tally.split(sent, cfg.stateful) {
        Ok((split, basis)) => (Some(split), basis),
        Err(why) => (None, why),
    };
    StampReport {
        reflector: cfg.reflector.to_string(),
        ssid: session.ssid(),
        size: cfg.size,
        interval_ms: cfg.interval.as_secs_f64() * 1e3,
        seconds: started.elapsed().as_secs_f64(),
        sent,
        answered: tally.answered,
        lost,
        loss_percent: (sent > 0).then(|| lost as f64 * 100.0 / sent as f64),
        loss_split,
        loss_split_basis,
        reflector_numbering: tally.numbering(),
        last_reflector_seq: tally.last_reflector_seq(),
        rtt_ms: tally.rtt(),
        network_rtt_ms: tally.network_rtt(),
        one_way: tally.one_way().map(|(forward_ms, backward_ms)| OneWay {
            forward_ms,
            backward_ms,
        }),
        clock: Clock::of(error),
        reflector_clock: tally.last_reflector_error.map(Clock::of),
        ttl_at_reflector: tally.last_ttl.filter(|&t| t != stamp::TTL_UNKNOWN),
        zero_ssid_answers: tally.zero_ssid,
        invalid_error_estimates: tally.invalid_error_estimates,
        stray: session.stray,
        refused,
        interrupted: Interrupted::of(shutdown),
    }
}
