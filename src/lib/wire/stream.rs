//! The reverse stream's messages: the client's Start (what to send, with
//! the address cookie), the server's StartAck, and the receiver's
//! Feedback; and the sender's figures an End carries back. Byte layouts in
//! `docs/protocol.md`.

use super::*;

/// Which way a session's data flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// The client sends, the server counts (an upload; the default).
    #[default]
    ClientToServer,
    /// The server sends, the client counts (`udp_client -R`).
    ServerToClient,
}

impl Direction {
    fn code(self) -> u64 {
        match self {
            Direction::ClientToServer => 0,
            Direction::ServerToClient => 1,
        }
    }

    fn from_code(code: u64) -> Option<Self> {
        match code {
            0 => Some(Direction::ClientToServer),
            1 => Some(Direction::ServerToClient),
            _ => None,
        }
    }

    /// `client_to_server` or `server_to_client`, as in the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Direction::ClientToServer => "client_to_server",
            Direction::ServerToClient => "server_to_client",
        }
    }
}

/// How much a stream sends, as a Start asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    /// Exactly this many payload bytes.
    Bytes(u64),
    /// Exactly this many datagrams.
    Packets(u64),
    /// Full datagrams for this many nanoseconds.
    Nanos(u64),
}

impl Default for Amount {
    fn default() -> Self {
        Amount::Bytes(0)
    }
}

impl Amount {
    fn encode(self) -> (u64, u64) {
        match self {
            Amount::Bytes(n) => (0, n),
            Amount::Packets(n) => (1, n),
            Amount::Nanos(n) => (2, n),
        }
    }

    fn decode(kind: u64, value: u64) -> Option<Self> {
        match kind {
            0 => Some(Amount::Bytes(value)),
            1 => Some(Amount::Packets(value)),
            2 => Some(Amount::Nanos(value)),
            _ => None,
        }
    }
}

/// [`StreamRequest::flags`]: GSO off (`--no-gso`, `--plain-send`).
pub const SEND_GSO_OFF: u64 = 1;
/// [`StreamRequest::flags`]: GSO on even where auto would not use it.
pub const SEND_GSO_ON: u64 = 2;
/// [`StreamRequest::flags`]: each datagram at its own time (`--precise-pacing`).
pub const SEND_PRECISE: u64 = 4;

/// What a reverse stream should send: the client's traffic flags, carried
/// to the server that sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamRequest {
    /// Datagram payload size (`-b`).
    pub buffer_size: u64,
    pub amount: Amount,
    /// Payload bits per second; 0 for as fast as it goes.
    pub rate_bps: u64,
    /// `SEND_*` bits.
    pub flags: u64,
    /// Datagrams (or GSO buffers) per sendmmsg call; 1 for one per call.
    pub batch: u64,
}

/// The client's start of a session, echoing the HelloAck's cookie: the
/// proof that it receives at the address it sends from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Start {
    pub header: Header,
    /// Fresh per attempt; the answer echoes it.
    pub nonce: u64,
    /// From the HelloAck.
    pub cookie: u64,
    pub direction: Direction,
    /// For [`Direction::ServerToClient`]: what to send.
    pub request: StreamRequest,
    /// How long the client waits for the stream's End after the data.
    pub answer_wait_ns: u64,
    pub run: Run,
    /// HMAC-SHA256 over the other bytes with `--psk`, else zero.
    pub tag: [u8; TAG_LEN],
}

/// [`StartAck::status`]: the session is started.
pub const START_OK: u64 = 0;
/// The cookie is not this address's, or too old: say Hello again.
pub const START_BAD_COOKIE: u64 = 1;
/// The session table, or this address's share of it, is full.
pub const START_BUSY: u64 = 2;
/// The server already sends its most reverse streams (`limit`).
pub const START_TOO_MANY_STREAMS: u64 = 3;
/// The stream would run longer than the server allows (`limit`, ns).
pub const START_TOO_LONG: u64 = 4;
/// The stream asks for a higher rate than the server allows (`limit`, bit/s).
pub const START_TOO_FAST: u64 = 5;
/// The request cannot be sent as asked (a datagram size the server's
/// socket cannot send, an unknown amount or direction).
pub const START_BAD_REQUEST: u64 = 6;
/// Datagrams shorter than a header carry no sequence number, so the
/// receiver could not count their loss (`limit`: the least size).
pub const START_TOO_SMALL: u64 = 7;
/// This source (an IPv4 address, an IPv6 /64) already has its share of
/// the reverse streams (`limit`).
pub const START_SOURCE_SHARE: u64 = 8;

/// The server's answer to a [`Start`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StartAck {
    pub session: u64,
    pub flags: u16,
    /// The Start's nonce.
    pub nonce: u64,
    /// `START_*`.
    pub status: u64,
    /// The cap behind a refusal (see the status), else 0.
    pub limit: u64,
    /// The rate the stream is sent at (bit/s; 0 unpaced): the asked rate,
    /// or the server's `--max-rate` where none was asked. With
    /// [`START_TOO_LONG`], the rate the refusal's arithmetic used.
    pub rate_bps: u64,
    /// The longest the server sends any stream (`--max-duration`), ns.
    pub max_duration_ns: u64,
    /// Fresh per session: a reverse stream sends nothing until a Feedback
    /// echoes it, and only Feedback that echoes it keeps the stream going.
    /// Only the address the StartAck went to can know it, so a replayed
    /// Start (from a forged address) never starts a stream.
    pub stream_nonce: u64,
    pub tag: [u8; TAG_LEN],
}

/// What the receiver of a reverse stream has counted so far, sent at
/// least every [`crate::wire::FEEDBACK_EVERY_MS`] ms: it keeps NAT mappings
/// open and tells the sender the receiver is still there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Feedback {
    /// `seq` counts the feedback datagrams of the session.
    pub header: Header,
    pub received_packets: u64,
    pub received_bytes: u64,
    /// One more than the highest sequence number seen (0: none yet).
    pub next_seq: u64,
    /// Drops on the receiver's socket so far; [`UNKNOWN`] where unknown.
    pub kernel_drops: u64,
    /// The StartAck's `stream_nonce`.
    pub stream_nonce: u64,
    pub tag: [u8; TAG_LEN],
}

/// How often a receiver sends [`Feedback`] (ms).
pub const FEEDBACK_EVERY_MS: u64 = 100;

/// The sender's own figures, in the End of a reverse stream: the client
/// cannot see the server's CPU or send path otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SenderStats {
    /// `STOPPED_*` bits: why the stream ended before its amount.
    pub stopped: u64,
    pub cpu_user_ns: u64,
    pub cpu_system_ns: u64,
    pub enobufs_retries: u64,
    pub backoff_ns: u64,
    /// Data send calls.
    pub calls: u64,
    /// Datagrams per GSO buffer, 0 when GSO was off.
    pub gso_segments: u64,
    /// Messages per send call.
    pub batch: u64,
    /// What the first send call sent: the send rate counts what came after.
    pub first_call_packets: u64,
    pub first_call_bytes: u64,
    /// The circuit breaker slowed the stream this many times ...
    pub breaker_backoffs: u64,
    /// ... to this rate, bit/s (0: it did not).
    pub breaker_rate_bps: u64,
}

/// [`SenderStats::stopped`]: the server's `--max-duration` ended it.
pub const STOPPED_MAX_DURATION: u64 = 1;
/// The server was stopping.
pub const STOPPED_SHUTDOWN: u64 = 2;
/// The stream's circuit breaker: the receiver's Feedback showed it took
/// in less than half of what was sent, for long enough, after the rate
/// was already halved (RFC 8084).
pub const STOPPED_BREAKER: u64 = 4;

/// Encodes a Start (untagged: see [`encode_tagged`]).
pub fn encode_start(start: &Start) -> [u8; START_LEN] {
    let mut buf = [0u8; START_LEN];
    put_header(&mut buf, KIND_START, 0, &start.header);
    let r = &start.request;
    let (amount_kind, amount) = r.amount.encode();
    let fields = [
        start.nonce,
        start.cookie,
        start.direction.code(),
        r.buffer_size,
        amount_kind,
        amount,
        r.rate_bps,
        r.flags,
        r.batch,
        start.answer_wait_ns,
        start.run.id,
        start.run.clients,
    ];
    for (i, value) in fields.into_iter().enumerate() {
        put_u64(&mut buf, 32 + 8 * i, value);
    }
    buf[START_TAG_AT..].copy_from_slice(&start.tag);
    buf
}

pub(super) fn decode_start(buf: &[u8], header: Header) -> Result<Start, WireError> {
    let f = |i: usize| u64_at(buf, 32 + 8 * i);
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&buf[START_TAG_AT..]);
    Ok(Start {
        header,
        nonce: f(0),
        cookie: f(1),
        direction: Direction::from_code(f(2)).ok_or(WireError::BadField)?,
        request: StreamRequest {
            buffer_size: f(3),
            amount: Amount::decode(f(4), f(5)).ok_or(WireError::BadField)?,
            rate_bps: f(6),
            flags: f(7),
            batch: f(8),
        },
        answer_wait_ns: f(9),
        run: Run {
            id: f(10),
            clients: f(11),
        },
        tag,
    })
}

/// Encodes the answer to a Start (untagged: see [`encode_tagged`]).
pub fn encode_start_ack(ack: &StartAck) -> [u8; START_LEN] {
    let mut buf = [0u8; START_LEN];
    put_answer_header(&mut buf, KIND_START_ACK, ack.flags, ack.session);
    let fields = [
        ack.nonce,
        ack.status,
        ack.limit,
        ack.rate_bps,
        ack.max_duration_ns,
        ack.stream_nonce,
    ];
    for (i, value) in fields.into_iter().enumerate() {
        put_u64(&mut buf, 32 + 8 * i, value);
    }
    buf[START_TAG_AT..].copy_from_slice(&ack.tag);
    buf
}

pub(super) fn decode_start_ack(buf: &[u8], header: Header) -> StartAck {
    let f = |i: usize| u64_at(buf, 32 + 8 * i);
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&buf[START_TAG_AT..]);
    StartAck {
        session: header.session,
        flags: u16::from_be_bytes([buf[6], buf[7]]),
        nonce: f(0),
        status: f(1),
        limit: f(2),
        rate_bps: f(3),
        max_duration_ns: f(4),
        stream_nonce: f(5),
        tag,
    }
}

/// Where a Feedback's tag starts.
pub(super) const FEEDBACK_TAG_AT: usize = FEEDBACK_LEN - TAG_LEN;

/// Encodes a Feedback (untagged: see [`encode_tagged`]).
pub fn encode_feedback(feedback: &Feedback) -> [u8; FEEDBACK_LEN] {
    let mut buf = [0u8; FEEDBACK_LEN];
    put_header(&mut buf, KIND_FEEDBACK, 0, &feedback.header);
    let fields = [
        feedback.received_packets,
        feedback.received_bytes,
        feedback.next_seq,
        feedback.kernel_drops,
        feedback.stream_nonce,
    ];
    for (i, value) in fields.into_iter().enumerate() {
        put_u64(&mut buf, 32 + 8 * i, value);
    }
    buf[FEEDBACK_TAG_AT..].copy_from_slice(&feedback.tag);
    buf
}

pub(super) fn decode_feedback(buf: &[u8], header: Header) -> Feedback {
    let f = |i: usize| u64_at(buf, 32 + 8 * i);
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&buf[FEEDBACK_TAG_AT..]);
    Feedback {
        header,
        received_packets: f(0),
        received_bytes: f(1),
        next_seq: f(2),
        kernel_drops: f(3),
        stream_nonce: f(4),
        tag,
    }
}
