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
//!
//! With `--stamp-reflector`, the probes are STAMP test packets to that
//! reflector instead (a router, `udp_server --stamp`, any RFC 8762
//! reflector), built and matched by [`super::stamp::session`]: no Hello,
//! since a reflector answers every test packet. Everything else (the
//! schedule, the phases, what counts as lost) is the same loop, so the
//! rtt line, RPM and the verdict mean the same whichever answers.

use super::open_socket;
use super::stamp::session::{unix_ns_now, StampSession};
use crate::config::StampSender;
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

/// Who answers the probes: udp_server, or a STAMP reflector.
pub enum Target<'a> {
    Server(SocketAddr),
    Stamp(&'a StampSender),
}

impl Target<'_> {
    fn addr(&self) -> SocketAddr {
        match self {
            Target::Server(addr) => *addr,
            Target::Stamp(s) => s.reflector,
        }
    }

    fn every(&self) -> Duration {
        match self {
            Target::Server(_) => Duration::from_secs(1) / PROBE_RATE,
            Target::Stamp(s) => s.interval,
        }
    }
}

/// A socket for probing `target`, from `bind`'s address when given.
pub fn open(target: &Target, bind: Option<SocketAddr>) -> Result<UdpSocket> {
    let bind = match target {
        Target::Stamp(s) => s.bind,
        Target::Server(_) => bind,
    };
    let bind = bind.map(|b| SocketAddr::new(b.ip(), 0));
    open_socket(target.addr(), true, false, bind)
}

/// One kind of probe: how it is sent and how its answer is known.
trait Probes {
    /// Sends the next probe at `now`; Some(its key) when it counts (a
    /// netspeed probe counts once it carries a cookie).
    fn send(&mut self, socket: &UdpSocket, now: Instant) -> Option<u64>;
    /// A datagram read at `arrived`: Some((its probe's key, round trip in
    /// ns)) for an answer to a probe.
    fn answer(&mut self, datagram: &[u8], arrived: Instant) -> Option<(u64, u64)>;
    /// Whether the far end has answered anything.
    fn heard(&self) -> bool;
}

/// udp_server's probes: a Hello until the cookie comes, then probes that
/// echo it.
struct ServerProbes {
    session: u64,
    started: Instant,
    seq: u64,
    cookie: u64,
    heard: bool,
}

impl Probes for ServerProbes {
    fn send(&mut self, socket: &UdpSocket, now: Instant) -> Option<u64> {
        let seq = self.seq;
        self.seq += 1;
        let header = Header {
            session: self.session,
            seq,
            send_time_ns: now.duration_since(self.started).as_nanos() as u64,
        };
        // Until a HelloAck brings the cookie, a Hello goes instead: the
        // server answers only probes that echo it from their flow's own
        // budget.
        let message = match self.cookie {
            0 => wire::encode_hello(&Hello {
                header,
                nonce: self.session,
                ..Hello::default()
            })
            .to_vec(),
            cookie => wire::encode_probe(&Probe { header, cookie }).to_vec(),
        };
        (socket.send(&message).is_ok() && self.cookie != 0).then_some(seq)
    }

    fn answer(&mut self, datagram: &[u8], arrived: Instant) -> Option<(u64, u64)> {
        let ack = match wire::decode(datagram) {
            Ok(Message::ProbeAck(ack)) => ack,
            Ok(Message::HelloAck(hello)) if hello.session == self.session && hello.cookie != 0 => {
                self.heard = true;
                self.cookie = hello.cookie;
                return None;
            }
            _ => return None,
        };
        if ack.header.session != self.session {
            return None;
        }
        self.heard = true;
        self.cookie = ack.cookie;
        if ack.flags & PROBE_ECHOED == 0 {
            return None;
        }
        let now_ns = arrived.duration_since(self.started).as_nanos() as u64;
        Some((
            ack.header.seq,
            now_ns.saturating_sub(ack.header.send_time_ns),
        ))
    }

    fn heard(&self) -> bool {
        self.heard
    }
}

/// STAMP test packets: each counts from the first.
struct StampProbes {
    session: StampSession,
    heard: bool,
}

impl Probes for StampProbes {
    fn send(&mut self, socket: &UdpSocket, _now: Instant) -> Option<u64> {
        self.session.send(socket).ok().map(u64::from)
    }

    fn answer(&mut self, datagram: &[u8], arrived: Instant) -> Option<(u64, u64)> {
        let sample = self.session.answer(datagram, arrived, unix_ns_now())?;
        self.heard = true;
        Some((u64::from(sample.sender_seq), sample.rtt_ns))
    }

    fn heard(&self) -> bool {
        self.heard
    }
}

/// Probes `target` on `socket` until `phases.done`, then waits for the
/// last answers. Returns what it found.
pub fn run(socket: &UdpSocket, target: &Target, phases: &Phases) -> RttRecord {
    let started = Instant::now();
    match target {
        Target::Server(_) => {
            let session = crate::auth::random_u64();
            let mut probes = ServerProbes {
                session,
                started,
                seq: 0,
                cookie: 0,
                heard: false,
            };
            probe(socket, &mut probes, target.every(), started, phases)
        }
        Target::Stamp(s) => {
            let error = crate::stamp::local_estimate(s.clock.synchronized, s.clock.error);
            let ssid = s.ssid.unwrap_or_else(super::stamp::random_ssid);
            let mut probes = StampProbes {
                session: StampSession::new(ssid, s.size, error),
                heard: false,
            };
            let mut record = probe(socket, &mut probes, target.every(), started, phases);
            if let Some(f) = &mut record.figures {
                f.stamp_reflector = Some(s.reflector);
            }
            record
        }
    }
}

fn probe(
    socket: &UdpSocket,
    probes: &mut dyn Probes,
    every: Duration,
    started: Instant,
    phases: &Phases,
) -> RttRecord {
    let mut trips = RoundTrips::default();
    let mut points = Vec::new();
    let mut load_start = None;
    // key -> sent under load
    let mut outstanding: BTreeMap<u64, bool> = BTreeMap::new();
    let mut next_send = started;
    let mut done_at: Option<Instant> = None;
    let mut buf = vec![0u8; 65536];
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
            if let Some(key) = probes.send(socket, now) {
                trips.sent(loaded);
                outstanding.insert(key, loaded);
                while outstanding.len() > OUTSTANDING {
                    outstanding.pop_first();
                }
            }
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
        let Some((key, rtt)) = probes.answer(&buf[..n], arrived) else {
            continue;
        };
        let Some(was_loaded) = outstanding.remove(&key) else {
            continue;
        };
        trips.answered(was_loaded, rtt);
        if points.len() < MOST_POINTS {
            let sent_at = arrived.duration_since(started).as_nanos() as u64;
            let sent_at = sent_at.saturating_sub(rtt);
            points.push((sent_at as f64 / 1e9, rtt as f64 / 1e6));
        }
    }
    RttRecord {
        figures: probes.heard().then(|| trips.figures()),
        points,
        load_start: load_start.unwrap_or(0.0),
    }
}
