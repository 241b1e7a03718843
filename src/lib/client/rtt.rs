//! Round trips under load: small probes at a steady rate from a socket of
//! their own, before the load (idle) and throughout it (loaded).
//!
//! Why a socket of its own: the probes then share the path's queues with
//! the load (a router's queue is per interface, not per flow) without
//! sharing the load's socket buffers, and a probe is never stuck behind
//! the client's own send queue. This is what crusader and networkQuality
//! do too. Behind a flow-fair queue (fq_codel), the probes measure what
//! other flows feel, which is also what a call beside a reverse stream feels.
//!
//! Why a Hello first: the server echoes only probes that carry a cookie
//! for their address (`server::probe`), and answers them from their own
//! budget, which forged probes cannot spend. The prober's Hello (sent at
//! the probe rate until answered) brings the cookie. Probes are counted
//! from the first one sent with a cookie; every answer carries a fresh
//! one. A probe unanswered when the run ends (after a last wait) is lost.

use super::open_socket;
use crate::error::Result;
use crate::stats::delay::{RoundTripFigures, RoundTrips};
use crate::wire::{self, Header, Hello, Message, Probe, PROBE_ECHOED};
use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Probes per second.
pub const PROBE_RATE: u32 = 20;
/// After the load, how long the last probes may take to come back.
pub const LAST_WAIT: Duration = Duration::from_millis(500);
/// Probes kept waiting for an answer; older ones are lost.
const OUTSTANDING: usize = 1024;
/// Round trips kept for the picture (20 per second for 30 minutes).
const MOST_POINTS: usize = 36_000;

/// What the probes found, with each answered probe's round trip for the
/// picture.
#[derive(Debug, Clone, Default)]
pub struct RttRecord {
    pub figures: Option<RoundTripFigures>,
    /// (seconds since probing began, round trip in ms), in order.
    pub points: Vec<(f64, f64)>,
    /// Seconds since probing began when the load started.
    pub load_start: f64,
}

/// Where the probing thread and the load meet.
#[derive(Default)]
pub struct Phases {
    /// Set when the load starts: probes sent from then on are loaded.
    pub loaded: AtomicBool,
    /// Set when the load is over: the prober waits [`LAST_WAIT`], stops.
    pub done: AtomicBool,
}

/// A socket for probing `server`.
pub fn open(server: SocketAddr, bind: Option<SocketAddr>) -> Result<UdpSocket> {
    let bind = bind.map(|b| SocketAddr::new(b.ip(), 0));
    open_socket(server, true, false, bind)
}

/// Probes `server` on `socket` until `phases.done`, then waits for the
/// last answers. Returns what it found.
pub fn run(socket: &UdpSocket, phases: &Phases) -> RttRecord {
    let session = crate::auth::random_u64();
    let started = Instant::now();
    let every = Duration::from_secs(1) / PROBE_RATE;
    let mut trips = RoundTrips::default();
    let mut points = Vec::new();
    let mut load_start = None;
    // seq -> sent under load
    let mut outstanding: BTreeMap<u64, bool> = BTreeMap::new();
    let (mut cookie, mut seq, mut answered) = (0u64, 0u64, false);
    let mut next_send = started;
    let mut done_at: Option<Instant> = None;
    let mut buf = [0u8; 2048];
    loop {
        let now = Instant::now();
        if done_at.is_none() && phases.done.load(Ordering::Acquire) {
            done_at = Some(now);
        }
        if let Some(done) = done_at {
            if outstanding.is_empty() || now.duration_since(done) >= LAST_WAIT {
                break;
            }
        }
        let loaded = phases.loaded.load(Ordering::Acquire);
        if loaded && load_start.is_none() {
            load_start = Some(now.duration_since(started).as_secs_f64());
        }
        if done_at.is_none() && now >= next_send {
            let header = Header {
                session,
                seq,
                send_time_ns: now.duration_since(started).as_nanos() as u64,
            };
            // Until a HelloAck brings the cookie, a Hello goes instead:
            // the server answers only probes that echo it from their
            // flow's own budget.
            let message = match cookie {
                0 => wire::encode_hello(&Hello {
                    header,
                    nonce: session,
                    ..Hello::default()
                })
                .to_vec(),
                _ => wire::encode_probe(&Probe { header, cookie }).to_vec(),
            };
            if socket.send(&message).is_ok() && cookie != 0 {
                trips.sent(loaded);
                outstanding.insert(seq, loaded);
                while outstanding.len() > OUTSTANDING {
                    outstanding.pop_first();
                }
            }
            seq += 1;
            next_send += every;
            if next_send < now {
                next_send = now + every;
            }
        }
        let wait = next_send
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_millis(1), every);
        let _ = socket.set_read_timeout(Some(wait));
        // A refused or timed-out read: look at the clock again.
        let Ok(n) = socket.recv(&mut buf) else {
            continue;
        };
        let arrived = Instant::now();
        let ack = match wire::decode(&buf[..n]) {
            Ok(Message::ProbeAck(ack)) => ack,
            Ok(Message::HelloAck(hello)) if hello.session == session && hello.cookie != 0 => {
                answered = true;
                cookie = hello.cookie;
                continue;
            }
            _ => continue,
        };
        if ack.header.session != session {
            continue;
        }
        answered = true;
        cookie = ack.cookie;
        if ack.flags & PROBE_ECHOED == 0 {
            continue;
        }
        let Some(was_loaded) = outstanding.remove(&ack.header.seq) else {
            continue;
        };
        let now_ns = arrived.duration_since(started).as_nanos() as u64;
        let rtt = now_ns.saturating_sub(ack.header.send_time_ns);
        trips.answered(was_loaded, rtt);
        if points.len() < MOST_POINTS {
            points.push((ack.header.send_time_ns as f64 / 1e9, rtt as f64 / 1e6));
        }
    }
    RttRecord {
        figures: answered.then(|| trips.figures()),
        points,
        load_start: load_start.unwrap_or(0.0),
    }
}
