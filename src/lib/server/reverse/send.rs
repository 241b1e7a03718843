//! Reverse streams: the server sends to a client that asked for it
//! (`udp_client -R`, and the reverse half of `--bidir`).
//!
//! A stream is sent by the meter's one send loop
//! ([`crate::meter::stream::send_stream`]) on a thread of its own, through
//! the server's own socket: its datagrams then leave from the address and
//! port the client sent its Start to, which is what a NAT or a stateful
//! firewall in front of the client lets back in. The socket is shared with
//! the receive threads and the answers, so GSO is asked for per call
//! ([`Transmitter::shared`]), never as a socket option.
//!
//! Why a stream is always bounded: the table starts one only for a session
//! whose address answered (a Start that echoes the HelloAck's cookie, then
//! a Feedback that echoes the StartAck's stream nonce), and stops it when
//! the amount asked is sent, when the server's `--max-duration` is reached,
//! when the client's Feedback stops for [`SILENCE`], or when the server
//! stops: all through the stream's own [`Shutdown`], the one way a stream
//! ends early.

use crate::config::StreamCaps;
use crate::meter::plan::Volume;
use crate::meter::send::{GsoChoice, GsoRequest, SendPath, Transmitter};
use crate::meter::stream::{send_stream, SendProgress, Sent, StreamSpec};
use crate::shutdown::Shutdown;
use crate::wire::{self, StreamRequest};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A stream whose client sent no Feedback for this long is stopped: the
/// client was killed or unplugged, or its NAT mapping is gone. Feedback
/// comes every [`wire::FEEDBACK_EVERY_MS`] ms, so this is six missed in a
/// row; with the main loop's look every 100 ms at most, a stream stops
/// within 0.75 s of its client's last word.
pub const SILENCE: Duration = Duration::from_millis(600);
/// How often the server sends a finished stream's End until the client
/// answers, and how many times.
pub const END_EVERY: Duration = Duration::from_millis(200);
pub const END_ATTEMPTS: u32 = 6;

/// A request that passed the caps: what to send, and at what rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    pub size: usize,
    pub volume: Volume,
    /// The asked rate, or the cap where none was asked.
    pub rate_bps: Option<u64>,
    pub precise_pacing: bool,
    pub gso: GsoRequest,
    pub batch: usize,
}

/// `--max-rate` counts each datagram of a stream at no less than this
/// many bytes, so that it bounds the packets a second (the server's work)
/// as well as the bits: a stream of small datagrams is held to at most
/// `--max-rate / (8 × 512)` datagrams a second.
pub const MIN_CHARGED_BYTES: u64 = 512;

/// Why a request was refused: a `START_*` status and the cap behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub status: u64,
    pub limit: u64,
    /// With `START_TOO_LONG`: the rate the refusal's arithmetic used.
    pub rate_bps: Option<u64>,
}

/// Checks a Start's request against the caps (not the stream count: the
/// table knows that). Pure.
pub fn grant(
    request: &StreamRequest,
    caps: &StreamCaps,
    client: IpAddr,
    max_payload: usize,
) -> Result<Granted, Refusal> {
    let refuse = |status, limit| {
        Err(Refusal {
            status,
            limit,
            rate_bps: None,
        })
    };
    let size = request.buffer_size;
    if size > max_payload as u64 {
        return refuse(wire::START_BAD_REQUEST, max_payload as u64);
    }
    if size < wire::HEADER_LEN as u64 {
        // No room for a sequence number: the receiver could count nothing
        // but bytes.
        return refuse(wire::START_TOO_SMALL, wire::HEADER_LEN as u64);
    }
    let size = size as usize;
    // What the cap counts each datagram as.
    let charged = (size as u64).max(MIN_CHARGED_BYTES);
    let max_ns = caps.max_duration.as_nanos() as u64;
    let volume = match request.amount {
        wire::Amount::Bytes(0) | wire::Amount::Packets(0) | wire::Amount::Nanos(0) => {
            return refuse(wire::START_BAD_REQUEST, 0)
        }
        wire::Amount::Bytes(_) if size == 0 => return refuse(wire::START_BAD_REQUEST, 0),
        wire::Amount::Nanos(ns) if ns > max_ns => return refuse(wire::START_TOO_LONG, max_ns),
        wire::Amount::Bytes(n) => Volume::Bytes(n),
        wire::Amount::Packets(n) => Volume::Packets(n),
        wire::Amount::Nanos(ns) => Volume::Time(Duration::from_nanos(ns)),
    };
    // The cap on payload bits for this size: --max-rate counts each
    // datagram at no less than MIN_CHARGED_BYTES.
    let cap = caps
        .rate_for(client)
        .map(|c| (u128::from(c) * size as u128 / u128::from(charged)) as u64)
        .map(|c| c.max(1));
    let asked = (request.rate_bps > 0).then_some(request.rate_bps);
    let rate_bps = match (asked, cap) {
        (Some(r), Some(c)) if r > c => return refuse(wire::START_TOO_FAST, c),
        (Some(r), _) => Some(r),
        (None, c) => c,
    };
    // A paced volume that cannot be sent within the cap is refused up
    // front, rather than cut short at the end.
    if let Some(rate) = rate_bps {
        let bytes = match volume {
            Volume::Bytes(n) => Some(n),
            Volume::Packets(n) => Some(n.saturating_mul(size as u64)),
            Volume::Time(_) => None,
        };
        if let Some(bytes) = bytes {
            let ns = u128::from(bytes) * 8 * 1_000_000_000 / u128::from(rate.max(1));
            if ns > u128::from(max_ns) {
                // The StartAck carries the rate the arithmetic used.
                return Err(Refusal {
                    status: wire::START_TOO_LONG,
                    limit: max_ns,
                    rate_bps: Some(rate),
                });
            }
        }
    }
    let gso = if caps.no_gso || request.flags & wire::SEND_GSO_OFF != 0 {
        GsoRequest::Off
    } else if request.flags & wire::SEND_GSO_ON != 0 {
        GsoRequest::On
    } else {
        GsoRequest::Auto
    };
    Ok(Granted {
        size,
        volume,
        rate_bps,
        precise_pacing: request.flags & wire::SEND_PRECISE != 0,
        gso,
        batch: (request.batch as usize).clamp(1, MAX_STREAM_BATCH),
    })
}

/// The most messages per sendmmsg call a client may ask a stream for (the
/// kernel's UIO_MAXIOV is 1024).
pub const MAX_STREAM_BATCH: usize = 1024;

/// What the table and the sending thread share about one stream.
#[derive(Debug, Default)]
pub struct StreamControl {
    /// Set to stop the stream early (silence, the cap, the server
    /// stopping); the thread also sets it when it is done.
    pub stop: Shutdown,
    /// Payload bytes sent so far (intervals, `--metrics`).
    pub sent_bytes: AtomicU64,
    /// The rate the circuit breaker set, bit/s; 0 while it has not.
    pub rate_bps: AtomicU64,
}

impl SendProgress for StreamControl {
    fn add(&self, bytes: u64) {
        self.sent_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn rate_bps(&self) -> Option<u64> {
        Some(self.rate_bps.load(Ordering::Relaxed)).filter(|&r| r > 0)
    }
}

/// Everything the sending thread needs.
#[derive(Debug, Clone)]
pub struct StreamOrder {
    /// The session's key in the table (canonical address, session id).
    pub key: (SocketAddr, u64),
    /// The client's address as received (v4-mapped on a dual-stack socket).
    pub to: SocketAddr,
    /// The local address the client sent to: the stream leaves from it.
    pub from: Option<IpAddr>,
    /// The receive socket the Start came in on.
    pub socket: usize,
    pub granted: Granted,
    pub control: Arc<StreamControl>,
    /// The udp_client run the stream belongs to, as its Start said.
    pub run: wire::Run,
}

/// How a stream's sending ended.
#[derive(Debug, Clone)]
pub struct StreamResult {
    pub sent: Sent,
    pub path: SendPath,
    pub enobufs_retries: u64,
    pub backoff: Duration,
    /// A send failed for good (the OS refused the datagram size, say).
    pub error: Option<String>,
}

/// Sends one stream on `socket` (the server's) until it is done or its
/// control says stop. Runs on the calling thread.
pub fn run(socket: &UdpSocket, order: &StreamOrder) -> StreamResult {
    let g = &order.granted;
    let max_payload = crate::sys::max_udp_payload(&order.to);
    let spec = StreamSpec {
        session: order.key.1,
        size: g.size,
        volume: g.volume,
        rate_bps: g.rate_bps,
        precise_pacing: g.precise_pacing,
        interval: None,
        max_payload,
    };
    let gso = GsoChoice {
        request: g.gso,
        max_payload,
        precise_pacing: g.precise_pacing,
    };
    let mut tx = Transmitter::shared(
        socket,
        order.to,
        order.from,
        g.size,
        spec.batch_for(g.batch),
        gso,
    );
    let (sent, error) = match send_stream(&mut tx, &spec, &order.control.stop, &*order.control) {
        Ok(sent) => (sent, None),
        Err(e) => (empty(), Some(e.to_string())),
    };
    tx.end_gso();
    StreamResult {
        sent,
        path: tx.path(),
        enobufs_retries: tx.enobufs_retries,
        backoff: tx.backoff_time,
        error,
    }
}

/// A stream that sent nothing.
/// The result of a stream that could not start sending.
pub fn failed(error: String) -> StreamResult {
    StreamResult {
        sent: empty(),
        path: crate::meter::send::SendPath {
            name: String::new(),
            batch: 0,
            gso: "off".into(),
            gso_segments: None,
            notes: Vec::new(),
            calls: 0,
        },
        enobufs_retries: 0,
        backoff: Duration::ZERO,
        error: Some(error),
    }
}

fn empty() -> Sent {
    let now = std::time::Instant::now();
    Sent {
        packets: 0,
        bytes: 0,
        untagged: 0,
        timing: crate::meter::stream::SendTiming::new(now),
        started: now,
        loop_time: Duration::ZERO,
        intervals: Vec::new(),
        cpu: None,
        paced: None,
        send_time: Duration::ZERO,
        send_blocked: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::{Amount, StreamRequest};

    fn request(amount: Amount, rate: u64) -> StreamRequest {
        StreamRequest {
            buffer_size: 1000,
            amount,
            rate_bps: rate,
            flags: 0,
            batch: 32,
        }
    }

    const LAN: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));
    const LOOP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn refused(r: Result<Granted, Refusal>) -> (u64, u64) {
        let e = r.expect_err("refused");
        (e.status, e.limit)
    }

    #[test]
    fn the_caps_refuse_with_their_limit() {
        let caps = StreamCaps::default();
        let sixty = 60_000_000_000;
        // Longer than --max-duration.
        let r = grant(&request(Amount::Nanos(sixty + 1), 0), &caps, LAN, 65507);
        assert_eq!(refused(r), (wire::START_TOO_LONG, sixty));
        // A paced volume that would take longer: 1 GB at 100 Mbit/s is 80 s.
        let r = grant(
            &request(Amount::Bytes(1_000_000_000), 100_000_000),
            &caps,
            LAN,
            65507,
        );
        assert_eq!(refused(r), (wire::START_TOO_LONG, sixty));
        // Faster than the cap off loopback.
        let r = grant(
            &request(Amount::Nanos(1), 20_000_000_000),
            &caps,
            LAN,
            65507,
        );
        assert_eq!(
            refused(r),
            (wire::START_TOO_FAST, crate::config::MAX_RATE_OFF_LOOPBACK)
        );
        // A size the socket cannot send, nothing to send.
        let mut big = request(Amount::Nanos(1), 0);
        big.buffer_size = 65508;
        assert_eq!(
            refused(grant(&big, &caps, LAN, 65507)),
            (wire::START_BAD_REQUEST, 65507)
        );
        let r = grant(&request(Amount::Packets(0), 0), &caps, LAN, 65507);
        assert_eq!(refused(r).0, wire::START_BAD_REQUEST);
    }

    #[test]
    fn an_unpaced_stream_is_paced_at_the_cap_except_on_loopback() {
        let caps = StreamCaps::default();
        let g = grant(&request(Amount::Nanos(1_000_000_000), 0), &caps, LAN, 65507).unwrap();
        assert_eq!(g.rate_bps, Some(crate::config::MAX_RATE_OFF_LOOPBACK));
        let g = grant(
            &request(Amount::Nanos(1_000_000_000), 0),
            &caps,
            LOOP,
            65507,
        )
        .unwrap();
        assert_eq!(g.rate_bps, None);
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert_eq!(
            caps.rate_for(mapped),
            None,
            "loopback through a dual-stack socket"
        );
        // An explicit --max-rate applies on loopback too.
        let capped = StreamCaps {
            max_rate_bps: Some(1_000_000),
            ..caps
        };
        let g = grant(&request(Amount::Nanos(1_000_000), 0), &capped, LOOP, 65507).unwrap();
        assert_eq!(g.rate_bps, Some(1_000_000));
        // What was asked is kept when it fits.
        let g = grant(&request(Amount::Packets(10), 5_000_000), &caps, LAN, 65507).unwrap();
        assert_eq!(
            (g.rate_bps, g.volume),
            (Some(5_000_000), Volume::Packets(10))
        );
    }

    #[test]
    fn the_traffic_flags_carry_over() {
        let caps = StreamCaps::default();
        let mut r = request(Amount::Bytes(10), 0);
        r.flags = wire::SEND_GSO_OFF | wire::SEND_PRECISE;
        r.batch = 0;
        let g = grant(&r, &caps, LOOP, 65507).unwrap();
        assert_eq!(
            (g.gso, g.precise_pacing, g.batch),
            (GsoRequest::Off, true, 1)
        );
        r.flags = wire::SEND_GSO_ON;
        r.batch = 5000;
        let g = grant(&r, &caps, LOOP, 65507).unwrap();
        assert_eq!((g.gso, g.batch), (GsoRequest::On, MAX_STREAM_BATCH));
        // The server's --no-gso wins over the client's --gso.
        let no_gso = StreamCaps {
            no_gso: true,
            ..caps
        };
        let g = grant(&r, &no_gso, LOOP, 65507).unwrap();
        assert_eq!(g.gso, GsoRequest::Off);
    }
}
