//! The client's side of starting a reverse stream (`-R`, and the reverse
//! half of `--bidir`): the Hello that fetches this address's cookie, the
//! Start that echoes it with what to send, and the first Feedback that
//! tells the server the client is there.
//!
//! Why here and not with the receiving: starting is a control exchange
//! like the probe and the End, with the same retries, nonces and `--psk`
//! rules (`client::exchange`); receiving is the server's own engine run
//! on the client's socket, which lives above both roles
//! ([`super::reverse`]).

use super::{exchange, probe, Exchange};
use crate::config::ClientConfig;
use crate::error::{Error, Result};
use crate::meter::plan::Volume;
use crate::meter::send::{GsoChoice, GsoRequest, Transmitter};
use crate::shutdown::Shutdown;
use crate::wire::{self, Amount, Direction, Feedback, Header, Message, Start, StreamRequest};
use std::net::UdpSocket;
use std::time::Duration;

/// What the server granted.
#[derive(Debug, Clone, Copy)]
pub struct Granted {
    /// The rate the server sends at, bit/s; None unpaced.
    pub rate_bps: Option<u64>,
    /// The server's `--max-duration`.
    pub max_duration: Duration,
    /// Every Feedback echoes it.
    pub stream_nonce: u64,
}

/// What `cfg` asks the server to send.
pub fn request(cfg: &ClientConfig) -> StreamRequest {
    let mut flags = 0;
    match cfg.gso {
        GsoRequest::Off => flags |= wire::SEND_GSO_OFF,
        GsoRequest::On => flags |= wire::SEND_GSO_ON,
        GsoRequest::Auto => {}
    }
    if cfg.precise_pacing {
        flags |= wire::SEND_PRECISE;
    }
    StreamRequest {
        buffer_size: cfg.buffer_size as u64,
        amount: match cfg.volume {
            Volume::Bytes(n) => Amount::Bytes(n),
            Volume::Packets(n) => Amount::Packets(n),
            Volume::Time(d) => Amount::Nanos(d.as_nanos().min(u128::from(u64::MAX)) as u64),
        },
        rate_bps: cfg.rate_bps.unwrap_or(0),
        flags,
        batch: cfg.batch as u64,
    }
}

/// Why the server refused, in words a user can act on. `asked` is what
/// this client asked for, and `ack` the refusal.
pub fn refusal(
    server: std::net::SocketAddr,
    asked: &StreamRequest,
    ack: &wire::StartAck,
) -> String {
    let (status, limit) = (ack.status, ack.limit);
    let why = match status {
        wire::START_BAD_COOKIE => {
            "it did not accept this address's cookie (the address changed between the Hello and the Start: a NAT that remaps ports?)".to_string()
        }
        wire::START_BUSY => "its session table is full; try again later".to_string(),
        wire::START_TOO_MANY_STREAMS => format!(
            "it already sends its most reverse streams at once ({limit}, --max-reverse-streams); try again later"
        ),
        wire::START_TOO_LONG => {
            let most = Duration::from_nanos(limit).as_secs_f64();
            let bytes = match asked.amount {
                Amount::Bytes(n) => Some(n),
                Amount::Packets(n) => Some(n.saturating_mul(asked.buffer_size)),
                Amount::Nanos(_) => None,
            };
            match (bytes, ack.rate_bps) {
                (Some(bytes), rate) if rate > 0 => format!(
                    "{} at {} takes {} s, longer than it sends any stream ({most} s, --max-duration): ask for less (-t, --duration) or a higher --rate",
                    crate::units::HumanBytes(bytes),
                    crate::units::HumanRate(rate),
                    fmt_seconds(bytes as f64 * 8.0 / rate as f64),
                ),
                _ => format!(
                    "the stream would run longer than it allows ({most} s, --max-duration): ask for less (-t, --duration) or a higher --rate"
                ),
            }
        }
        wire::START_TOO_SMALL => format!(
            "datagrams under {limit} bytes have no room for a sequence number, so their loss could not be counted: use -b {limit} or more"
        ),
        wire::START_SOURCE_SHARE => format!(
            "this address (its IPv4 address, or its IPv6 /64) already has its share of the server's reverse streams ({limit}, --max-reverse-streams-per-source): fewer -P, or try again later"
        ),
        wire::START_TOO_FAST => format!(
            "--rate is above its --max-rate ({}): ask for at most that",
            crate::units::HumanRate(limit)
        ),
        wire::START_BAD_REQUEST if limit > 0 => format!(
            "it cannot send datagrams of that size (at most {limit} bytes to this client)"
        ),
        _ => "it cannot send what was asked".to_string(),
    };
    format!("the udp_server at {server} refused to send: {why}")
}

/// Seconds in words: `81 s`, `2.3 h`.
fn fmt_seconds(s: f64) -> String {
    if s >= 7200.0 {
        format!("{:.1} h", s / 3600.0)
    } else {
        format!("{s:.0}")
    }
}

/// Asks the server at `cfg.server` to send session `session` to this
/// socket, and sends the first Feedback. Errors say why the server
/// refused.
pub fn request_stream(
    socket: &UdpSocket,
    cfg: &ClientConfig,
    session: u64,
    shutdown: &Shutdown,
) -> Result<Granted> {
    let server = cfg.server;
    let mut tx = Transmitter::new(socket, server, cfg.connected, 64, 1, GsoChoice::OFF);
    let info = probe(socket, &mut tx, cfg, session, false, shutdown)?;
    if info.cookie == 0 {
        return Err(Error::runtime(format!(
            "the udp_server at {server} cannot send (-R, --bidir): it is an older version; upgrade it"
        )));
    }
    let psk = cfg.psk.as_ref();
    let start = Start {
        header: Header {
            session,
            ..Header::default()
        },
        nonce: 0,
        cookie: info.cookie,
        direction: Direction::ServerToClient,
        request: request(cfg),
        answer_wait_ns: (cfg.end_timeout + info.end_grace).as_nanos() as u64,
        run: super::run_of(cfg),
        tag: [0; wire::TAG_LEN],
    };
    let ask = |nonce| {
        let mut this = start;
        this.nonce = nonce;
        let bytes = wire::encode_start(&this);
        match psk {
            Some(psk) => wire::encode_tagged(bytes, psk).to_vec(),
            None => bytes.to_vec(),
        }
    };
    let accept = |message, raw: &[u8], nonces: &[u64]| match message {
        Message::StartAck(ack)
            if ack.session == session
                && nonces.contains(&ack.nonce)
                && psk.is_none_or(|psk| wire::verify_tag(raw, psk)) =>
        {
            Some(ack)
        }
        _ => None,
    };
    let ack = match exchange(
        socket,
        &mut tx,
        server,
        super::PROBE_TIMEOUT,
        shutdown,
        ask,
        accept,
    ) {
        Exchange::Answered(ack) => ack,
        Exchange::Refused => return Err(tx.nobody_listening()),
        Exchange::Interrupted => return Err(Error::runtime("interrupted before the test began")),
        Exchange::Silent => {
            return Err(Error::runtime(format!(
            "the udp_server at {server} answered the probe but not the start of a reverse stream"
        )))
        }
    };
    if ack.status != wire::START_OK {
        return Err(Error::runtime(refusal(server, &start.request, &ack)));
    }
    let granted = Granted {
        rate_bps: (ack.rate_bps > 0).then_some(ack.rate_bps),
        max_duration: Duration::from_nanos(ack.max_duration_ns),
        stream_nonce: ack.stream_nonce,
    };
    // The first Feedback starts the stream; the receiver sends the rest.
    let _ = tx.send_control(&feedback(cfg, session, granted.stream_nonce, 0, (0, 0, 0)));
    Ok(granted)
}

/// Feedback number `seq` for session `session`: what has arrived so far
/// (`counts`: datagrams, bytes, one more than the highest sequence
/// number), tagged with `--psk`.
pub fn feedback(
    cfg: &ClientConfig,
    session: u64,
    stream_nonce: u64,
    seq: u64,
    counts: (u64, u64, u64),
) -> Vec<u8> {
    let fb = Feedback {
        header: Header {
            session,
            seq,
            send_time_ns: 0,
        },
        received_packets: counts.0,
        received_bytes: counts.1,
        next_seq: counts.2,
        kernel_drops: wire::UNKNOWN,
        stream_nonce,
        tag: [0; wire::TAG_LEN],
    };
    let bytes = wire::encode_feedback(&fb);
    match &cfg.psk {
        Some(psk) => wire::encode_tagged(bytes, psk).to_vec(),
        None => bytes.to_vec(),
    }
}
