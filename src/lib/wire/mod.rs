//! The datagram format: a fixed 32-byte header on every tagged datagram,
//! the start probe (Hello) and the end-of-test exchange (End).
//!
//! Why a header at all: without sequence numbers and a declared total (seed
//! 001 sent raw random bytes) loss cannot be known. The byte layout is in
//! `docs/protocol.md`; all integers are big-endian (seed 002 used native
//! byte order and could not talk across architectures).
//!
//! Why a nonce in every End and Hello, echoed by the answer: a client must
//! never accept an answer to a question it did not ask, so an answer forged
//! from elsewhere, or a stale answer to an earlier End, is ignored.
//!
//! Why a cookie in the HelloAck, echoed by a second Hello (an upload) or
//! a Start (a reverse stream) before the server keeps anything: a Hello
//! proves nothing about its source, so the server must neither keep state
//! for it nor send more to its address than it received from it until
//! that address has shown it can hear the server (QUIC's Retry, DTLS's
//! HelloVerifyRequest). The cookie is a MAC over the address, port,
//! session and a time slot ([`crate::auth::CookieKey`]), so checking it
//! needs no state: a flood of Hellos from forged addresses creates none.
//!
//! Why a version negotiation answer: two hosts on different releases must
//! see "another version", not "no server". The magic, the version byte
//! (offset 4) and the answer's layout ([`Versions`]) are fixed for good.
//!
//! Split by concern: this file holds the header, the Hello, End and
//! probe exchanges, the tags and [`decode`]; [`stream`] the reverse
//! stream's Start, StartAck and Feedback; [`intervals`] the pages of an
//! upload's figures per interval, asked for after the End; [`versions`]
//! the version negotiation answer, fixed for good.
//!
//! Decoding is pure and total: any byte slice gives a [`Message`] or a
//! [`WireError`], never a panic. Datagrams too short for a header, or that
//! do not start with the magic, are not errors for the server: they are
//! counted as untagged traffic from their source address.

pub mod intervals;
pub mod stream;
pub mod versions;

pub use intervals::*;
pub use stream::*;
pub use versions::*;

/// The four bytes every tagged datagram starts with, in every version,
/// past and future: fixed for good.
pub const MAGIC: [u8; 4] = *b"NSPD";
/// The only version this code speaks. Versions 1 (no probe, no nonce), 2
/// (no queue delay in the EndAck, no round-trip probes) and 3 (a Hello
/// that created a session, no version negotiation) decode as
/// [`WireError::BadVersion`], and are answered with a [`Versions`].
pub const VERSION: u8 = 4;
/// Every version this code speaks, newest first: what a [`Versions`]
/// answer lists.
pub const VERSIONS_SPOKEN: [u8; 1] = [VERSION];
/// The version byte of a version negotiation answer, in every version:
/// fixed for good (QUIC's version 0). No version of netspeed is 0.
pub const NEGOTIATION: u8 = 0;
/// Bytes of a version negotiation answer before its list of versions.
pub const VERSIONS_HEAD_LEN: usize = 16;
/// Bytes in the header of every tagged datagram.
pub const HEADER_LEN: usize = 32;
/// Size of an End and of its answer. The answer is never larger than the
/// message that caused it, so the server cannot amplify.
pub const END_LEN: usize = 320;
/// Size of a Hello and of its answer.
pub const HELLO_LEN: usize = 64;
/// Size of a Start and of its answer.
pub const START_LEN: usize = 256;
/// Size of a round-trip Probe and of its answer: the answer is never
/// larger, so probes cannot amplify.
pub const PROBE_LEN: usize = 64;
/// Size of the receiver's Feedback during a reverse stream. Never answered.
pub const FEEDBACK_LEN: usize = 128;
/// Bytes of the authentication tag at the end of an End and an EndAck
/// (HMAC-SHA256 with `--psk`; zero without).
pub const TAG_LEN: usize = crate::auth::TAG_LEN;
/// Where the tag of an End or an EndAck starts ...
pub const TAG_AT: usize = END_LEN - TAG_LEN;
/// ... and that of a Start or a StartAck.
const START_TAG_AT: usize = START_LEN - TAG_LEN;
/// In an answer, a figure the server cannot know.
pub const UNKNOWN: u64 = u64::MAX;

/// [`EndAck::flags`]: the server had UDP_GRO on.
pub const ACK_GRO: u16 = 1;
/// [`EndAck::flags`]: other traffic shared the server socket while this
/// session ran, so its kernel drops are the socket's, not only this
/// session's.
pub const ACK_DROPS_SHARED: u16 = 2;
/// [`EndAck::flags`]: the server had already finished this session as idle
/// (no datagram for its `--idle-timeout`) when the End arrived.
pub const ACK_IDLE_FINISHED: u16 = 4;
/// [`EndAck::flags`]: the server received Ends for this session that
/// disagree (different totals), or data after an End that its total does
/// not cover: a forged End, or a confused client.
pub const ACK_CONFLICT: u16 = 8;
/// [`EndAck::flags`]: the answer carries a tag made with the pre-shared
/// key. [`HelloAck::flags`]: the server has a pre-shared key, and answers
/// only Ends tagged with it.
pub const ACK_AUTH: u16 = 16;
/// [`HelloAck::flags`]: the server's session table is full; the session was
/// not created.
pub const ACK_BUSY: u16 = 32;
/// [`EndAck::flags`]: the server had no record of the session when the End
/// came (no Hello, no data: it restarted, or forgot it): its figures are
/// not the session's.
pub const ACK_NO_RECORD: u16 = 64;
/// [`EndAck::flags`]: the server's arrival times (and so its queue delay)
/// are the kernel's receive timestamps, not the times it read datagrams.
pub const ACK_KERNEL_TIMES: u16 = 128;
/// [`HelloAck::flags`]: the Hello echoed this address's cookie: the
/// session is created (proven), and the server counts its data as the
/// session's. Without it, a HelloAck only carries the cookie to echo.
pub const ACK_PROVEN: u16 = 256;
/// [`EndAck::flags`]: the server kept the session's figures per interval,
/// as its Hello asked ([`Hello::keep_intervals_ns`]): ask for them with
/// [`IntervalsAsk`]. Never set for a session that did not ask.
pub const ACK_INTERVALS: u16 = 512;

const KIND_DATA: u8 = 0;
const KIND_END: u8 = 1;
const KIND_END_ACK: u8 = 2;
const KIND_HELLO: u8 = 3;
const KIND_HELLO_ACK: u8 = 4;
const KIND_START: u8 = 5;
const KIND_START_ACK: u8 = 6;
const KIND_FEEDBACK: u8 = 7;
const KIND_PROBE: u8 = 8;
const KIND_PROBE_ACK: u8 = 9;
const KIND_INTERVALS_ASK: u8 = 10;
const KIND_INTERVALS: u8 = 11;

/// [`ProbeAck::flags`]: the probe's cookie was good: this answer echoes it
/// at once, and its round trip counts. Without it, the answer only carries
/// a fresh cookie for the next probe.
pub const PROBE_ECHOED: u16 = 1;

/// What a header says about the datagram it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// Random per client socket; tells concurrent tests apart.
    pub session: u64,
    /// For data: the datagram's sequence number, from 0.
    /// For an End: the number of data datagrams sent.
    pub seq: u64,
    /// Nanoseconds since the session started, on the sender's clock.
    pub send_time_ns: u64,
}

/// Which run of a udp_client a session belongs to, and how many sessions
/// that run has (`-P N`): `udp_server --one-off` waits for all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Run {
    /// Random per udp_client run; 0 when not said.
    pub id: u64,
    /// Sessions in the run (clients, or reverse streams).
    pub clients: u64,
}

/// The client's start probe: is a udp_server there? With a cookie, the
/// confirmation that proves the session's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hello {
    /// Its `seq` is [`Hello::keep_intervals_ns`].
    pub header: Header,
    /// Fresh per attempt; the answer echoes it.
    pub nonce: u64,
    pub run: Run,
    /// 0 to ask for a cookie; the HelloAck's cookie to confirm.
    pub cookie: u64,
}

impl Hello {
    /// The header's `seq`: the interval (ns) at which the client asks the
    /// server to keep the session's figures for it ([`IntervalsAsk`]); 0
    /// for none. Zero in every earlier release, which ignores it.
    pub fn keep_intervals_ns(&self) -> u64 {
        self.header.seq
    }
}

/// The server's answer to a [`Hello`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HelloAck {
    pub session: u64,
    /// The Hello's nonce.
    pub nonce: u64,
    /// [`ACK_GRO`], [`ACK_AUTH`] (the server wants tagged Ends).
    pub flags: u16,
    /// How long the server waits after an End for datagrams still in
    /// flight before it answers.
    pub end_grace_ns: u64,
    /// The receive buffer the kernel granted the server (SO_RCVBUF).
    pub recv_buffer: u64,
    /// A MAC over the Hello's address, port and session: a [`Start`]
    /// must echo it. 0 from a server older than the Start.
    pub cookie: u64,
}

/// The client's declared totals, sent when it has finished sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct End {
    pub header: Header,
    pub sent_packets: u64,
    pub sent_bytes: u64,
    /// Time from the first to the last data datagram sent.
    pub duration_ns: u64,
    /// Fresh per attempt; the answer echoes it.
    pub nonce: u64,
    /// How long the sender keeps asking: the receiver keeps the session's
    /// answer at least this long.
    pub answer_wait_ns: u64,
    /// The sender's own figures, when it sends them (the server's End of a
    /// reverse stream does).
    pub sender: Option<SenderStats>,
    /// HMAC-SHA256 over the other bytes with `--psk`, else zero.
    pub tag: [u8; TAG_LEN],
}

/// The server's answer to an [`End`]: what it received for that session.
/// Times are on the server's clock, in nanoseconds since it started, so
/// that a client can combine the answers for several sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EndAck {
    pub session: u64,
    /// `ACK_*` flags.
    pub flags: u16,
    /// The End's nonce.
    pub nonce: u64,
    /// Distinct datagrams received (merged untagged ones included).
    pub received_packets: u64,
    pub received_bytes: u64,
    /// Datagrams lost: at most this many ...
    pub lost: u64,
    /// ... and at least this many (equal unless arrivals were uncertain).
    pub lost_fewest: u64,
    pub duplicates: u64,
    pub reordered: u64,
    /// Arrivals the server could not classify (see `stats::SeqSet`).
    pub uncertain: u64,
    /// Datagrams that arrived after the session was finished.
    pub late: u64,
    /// Datagrams with sequence numbers the sender never declared.
    pub unexpected: u64,
    pub first_arrival_ns: u64,
    pub last_arrival_ns: u64,
    /// Datagrams and bytes that arrived at `first_arrival_ns` (a GRO buffer
    /// arrives whole): rates count what came after them.
    pub first_arrival_packets: u64,
    pub first_arrival_bytes: u64,
    pub jitter_ns: u64,
    /// The server socket's drop counter at the session's first and last
    /// datagram ([`UNKNOWN`] where the platform cannot tell), and which
    /// receive socket that was.
    pub drops_start: u64,
    pub drops_end: u64,
    pub drop_socket: u64,
    /// Buffers received that held more than one datagram (UDP GRO) ...
    pub gro_buffers: u64,
    /// ... and the datagrams they held (0 from a server that did not say).
    pub gro_datagrams: u64,
    /// Buffers the kernel cut short (MSG_TRUNC).
    pub truncated: u64,
    /// The server's receive threads' CPU while the session ran
    /// ([`UNKNOWN`] where the platform cannot tell) ...
    pub cpu_user_ns: u64,
    pub cpu_system_ns: u64,
    /// ... and their total CPU (user + system) when it began, on a counter
    /// that runs from the server's start: a client can then take the
    /// server's CPU over several sessions without counting it twice.
    pub cpu_start_ns: u64,
    /// Transit times discarded as implausible for jitter.
    pub transit_discarded: u64,
    /// The session's queue delay (`stats::delay`), in ns: median, 90th and
    /// 99th percentile and largest ([`UNKNOWN`] without data) ...
    pub queue_p50_ns: u64,
    pub queue_p90_ns: u64,
    pub queue_p99_ns: u64,
    pub queue_max_ns: u64,
    /// ... over this many datagrams ...
    pub delay_samples: u64,
    /// ... and the floor's slope in parts per billion, as an i64 in two's
    /// complement ([`UNKNOWN`] when it could not be estimated).
    pub clock_skew_ppb: u64,
    /// Whom the receive threads' CPU above was shared with
    /// ([`CpuSharing::encode`]); 0 from a server that does not say.
    pub cpu_sharing: u64,
    pub tag: [u8; TAG_LEN],
}

/// What else the server's receive threads handled while a session ran, so
/// that a client can give its own share of their CPU instead of the whole
/// (the threads serve every peer; their CPU cannot be split exactly).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuSharing {
    /// Other peers whose datagrams the receive threads handled during the
    /// session (at most 65,535 said).
    pub other_peers: u64,
    /// Every datagram the receive threads handled during the session, this
    /// session's included (at most 2^48 − 1 said).
    pub datagrams: u64,
}

impl CpuSharing {
    const DATAGRAM_BITS: u32 = 48;

    /// Other peers in the top 16 bits, datagrams in the low 48; 0 (never a
    /// session's value: it handled at least its own) means unknown.
    pub fn encode(self) -> u64 {
        let most = (1u64 << Self::DATAGRAM_BITS) - 1;
        (self.other_peers.min(0xffff) << Self::DATAGRAM_BITS) | self.datagrams.min(most)
    }

    /// None for 0: a server that does not say.
    pub fn decode(value: u64) -> Option<Self> {
        (value != 0).then_some(CpuSharing {
            other_peers: value >> Self::DATAGRAM_BITS,
            datagrams: value & ((1u64 << Self::DATAGRAM_BITS) - 1),
        })
    }
}

/// A round-trip probe (client to server), sent at a steady rate before
/// and during the load. The header's `seq` numbers the probes and its
/// `send_time_ns` is the client's; the answer echoes both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Probe {
    pub header: Header,
    /// The latest cookie a [`ProbeAck`] carried; 0 for the first probe.
    pub cookie: u64,
}

/// The server's answer to a [`Probe`], of the same size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProbeAck {
    /// The probe's header, echoed.
    pub header: Header,
    /// [`PROBE_ECHOED`] when the probe's cookie was good.
    pub flags: u16,
    /// A cookie for the probes to come (the address proof: a MAC over the
    /// probe's source address, port and session).
    pub cookie: u64,
}

/// A decoded datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// A version negotiation answer ([`Versions`]).
    Versions(Versions),
    Data(Header),
    End(End),
    EndAck(EndAck),
    Hello(Hello),
    HelloAck(HelloAck),
    Start(Start),
    StartAck(StartAck),
    Feedback(Feedback),
    Probe(Probe),
    ProbeAck(ProbeAck),
    IntervalsAsk(IntervalsAsk),
    Intervals(IntervalsPage),
}

/// Why a datagram is not a netspeed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("shorter than a header ({0} bytes)")]
    TooShort(usize),
    #[error("no netspeed magic")]
    BadMagic,
    #[error("unsupported version {0}")]
    BadVersion(u8),
    #[error("unknown message kind {0}")]
    BadKind(u8),
    #[error("control message of {0} bytes, expected {1}")]
    BadControlLength(usize, usize),
    #[error("a field holds a value no sender writes")]
    BadField,
}

fn u64_at(buf: &[u8], offset: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&buf[offset..offset + 8]);
    u64::from_be_bytes(bytes)
}

fn put_u64(buf: &mut [u8], offset: usize, value: u64) {
    buf[offset..offset + 8].copy_from_slice(&value.to_be_bytes());
}

fn put_header(buf: &mut [u8], kind: u8, flags: u16, header: &Header) {
    buf[0..4].copy_from_slice(&MAGIC);
    buf[4] = VERSION;
    buf[5] = kind;
    buf[6..8].copy_from_slice(&flags.to_be_bytes());
    put_u64(buf, 8, header.session);
    put_u64(buf, 16, header.seq);
    put_u64(buf, 24, header.send_time_ns);
}

/// Writes a data header into the first [`HEADER_LEN`] bytes of `buf`.
/// Returns false, writing nothing, when `buf` is too short to be tagged.
pub fn write_data_header(buf: &mut [u8], header: &Header) -> bool {
    if buf.len() < HEADER_LEN {
        return false;
    }
    put_header(buf, KIND_DATA, 0, header);
    true
}

/// The header of a server's answer: only the session is set (an answer
/// has no sequence number or send time of its own).
fn put_answer_header(buf: &mut [u8], kind: u8, flags: u16, session: u64) {
    let header = Header {
        session,
        ..Header::default()
    };
    put_header(buf, kind, flags, &header);
}

/// Encodes a start probe.
pub fn encode_hello(hello: &Hello) -> [u8; HELLO_LEN] {
    let mut buf = [0u8; HELLO_LEN];
    put_header(&mut buf, KIND_HELLO, 0, &hello.header);
    put_u64(&mut buf, 32, hello.nonce);
    put_u64(&mut buf, 40, hello.run.id);
    put_u64(&mut buf, 48, hello.run.clients);
    put_u64(&mut buf, 56, hello.cookie);
    buf
}

/// Encodes the answer to a start probe.
pub fn encode_hello_ack(ack: &HelloAck) -> [u8; HELLO_LEN] {
    let mut buf = [0u8; HELLO_LEN];
    put_answer_header(&mut buf, KIND_HELLO_ACK, ack.flags, ack.session);
    put_u64(&mut buf, 32, ack.nonce);
    put_u64(&mut buf, 40, ack.end_grace_ns);
    put_u64(&mut buf, 48, ack.recv_buffer);
    put_u64(&mut buf, 56, ack.cookie);
    buf
}

/// Encodes an end-of-test message.
pub fn encode_end(end: &End) -> [u8; END_LEN] {
    let mut buf = [0u8; END_LEN];
    put_header(&mut buf, KIND_END, 0, &end.header);
    put_u64(&mut buf, 32, end.sent_packets);
    put_u64(&mut buf, 40, end.sent_bytes);
    put_u64(&mut buf, 48, end.duration_ns);
    put_u64(&mut buf, 56, end.nonce);
    put_u64(&mut buf, 64, end.answer_wait_ns);
    if let Some(s) = &end.sender {
        let fields = [
            SENDER_STATS_PRESENT | s.stopped << 1,
            s.cpu_user_ns,
            s.cpu_system_ns,
            s.enobufs_retries,
            s.backoff_ns,
            s.calls,
            s.gso_segments,
            s.batch,
            s.first_call_packets,
            s.first_call_bytes,
            s.breaker_backoffs,
            s.breaker_rate_bps,
        ];
        for (i, value) in fields.into_iter().enumerate() {
            put_u64(&mut buf, 72 + 8 * i, value);
        }
    }
    buf[TAG_AT..].copy_from_slice(&end.tag);
    buf
}

/// In an End's word at offset 72: the sender's figures follow.
const SENDER_STATS_PRESENT: u64 = 1;

fn decode_sender_stats(buf: &[u8]) -> Option<SenderStats> {
    let f = |i: usize| u64_at(buf, 72 + 8 * i);
    let word = f(0);
    (word & SENDER_STATS_PRESENT != 0).then(|| SenderStats {
        stopped: word >> 1,
        cpu_user_ns: f(1),
        cpu_system_ns: f(2),
        enobufs_retries: f(3),
        backoff_ns: f(4),
        calls: f(5),
        gso_segments: f(6),
        batch: f(7),
        first_call_packets: f(8),
        first_call_bytes: f(9),
        breaker_backoffs: f(10),
        breaker_rate_bps: f(11),
    })
}

/// The figures of an EndAck, in wire order from offset 32.
fn end_ack_fields(ack: &EndAck) -> [u64; 32] {
    [
        ack.nonce,
        ack.received_packets,
        ack.received_bytes,
        ack.lost,
        ack.lost_fewest,
        ack.duplicates,
        ack.reordered,
        ack.uncertain,
        ack.late,
        ack.unexpected,
        ack.first_arrival_ns,
        ack.last_arrival_ns,
        ack.first_arrival_packets,
        ack.first_arrival_bytes,
        ack.jitter_ns,
        ack.drops_start,
        ack.drops_end,
        ack.drop_socket,
        ack.gro_buffers,
        ack.truncated,
        ack.cpu_user_ns,
        ack.cpu_system_ns,
        ack.transit_discarded,
        ack.cpu_start_ns,
        ack.queue_p50_ns,
        ack.queue_p90_ns,
        ack.queue_p99_ns,
        ack.queue_max_ns,
        ack.delay_samples,
        ack.clock_skew_ppb,
        ack.gro_datagrams,
        ack.cpu_sharing,
    ]
}

/// Encodes the server's answer to an end-of-test message.
pub fn encode_end_ack(ack: &EndAck) -> [u8; END_LEN] {
    let mut buf = [0u8; END_LEN];
    put_answer_header(&mut buf, KIND_END_ACK, ack.flags, ack.session);
    for (i, value) in end_ack_fields(ack).into_iter().enumerate() {
        put_u64(&mut buf, 32 + 8 * i, value);
    }
    buf[TAG_AT..].copy_from_slice(&ack.tag);
    buf
}

fn decode_end_ack(buf: &[u8], header: Header) -> EndAck {
    let f = |i: usize| u64_at(buf, 32 + 8 * i);
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&buf[TAG_AT..]);
    EndAck {
        session: header.session,
        flags: u16::from_be_bytes([buf[6], buf[7]]),
        nonce: f(0),
        received_packets: f(1),
        received_bytes: f(2),
        lost: f(3),
        lost_fewest: f(4),
        duplicates: f(5),
        reordered: f(6),
        uncertain: f(7),
        late: f(8),
        unexpected: f(9),
        first_arrival_ns: f(10),
        last_arrival_ns: f(11),
        first_arrival_packets: f(12),
        first_arrival_bytes: f(13),
        jitter_ns: f(14),
        drops_start: f(15),
        drops_end: f(16),
        drop_socket: f(17),
        gro_buffers: f(18),
        truncated: f(19),
        cpu_user_ns: f(20),
        cpu_system_ns: f(21),
        transit_discarded: f(22),
        cpu_start_ns: f(23),
        queue_p50_ns: f(24),
        queue_p90_ns: f(25),
        queue_p99_ns: f(26),
        queue_max_ns: f(27),
        delay_samples: f(28),
        clock_skew_ppb: f(29),
        gro_datagrams: f(30),
        cpu_sharing: f(31),
        tag,
    }
}

/// Encodes a round-trip probe.
pub fn encode_probe(probe: &Probe) -> [u8; PROBE_LEN] {
    let mut buf = [0u8; PROBE_LEN];
    put_header(&mut buf, KIND_PROBE, 0, &probe.header);
    put_u64(&mut buf, 32, probe.cookie);
    buf
}

/// Encodes the answer to a probe.
pub fn encode_probe_ack(ack: &ProbeAck) -> [u8; PROBE_LEN] {
    let mut buf = [0u8; PROBE_LEN];
    put_header(&mut buf, KIND_PROBE_ACK, ack.flags, &ack.header);
    put_u64(&mut buf, 32, ack.cookie);
    buf
}

/// The bytes an End's or EndAck's tag covers: all but the tag itself.
pub fn tagged_bytes(message: &[u8; END_LEN]) -> &[u8] {
    &message[..TAG_AT]
}

/// Puts `psk`'s tag over the other bytes into the last [`TAG_LEN`] bytes
/// of a control message (End, EndAck, Start, StartAck, Feedback) just
/// encoded; an answer also gets [`ACK_AUTH`] first, so the flag is covered.
pub fn encode_tagged<const N: usize>(mut bytes: [u8; N], psk: &crate::auth::Psk) -> [u8; N] {
    if matches!(bytes[5], KIND_END_ACK | KIND_START_ACK | KIND_INTERVALS) {
        let flags = u16::from_be_bytes([bytes[6], bytes[7]]) | ACK_AUTH;
        bytes[6..8].copy_from_slice(&flags.to_be_bytes());
    }
    let at = N - TAG_LEN;
    let tag = psk.tag(&bytes[..at]);
    bytes[at..].copy_from_slice(&tag);
    bytes
}

/// Encodes an End with its tag made by `psk`.
pub fn encode_end_tagged(end: &End, psk: &crate::auth::Psk) -> [u8; END_LEN] {
    encode_tagged(encode_end(end), psk)
}

/// Encodes an EndAck with its tag made by `psk` (setting [`ACK_AUTH`]).
pub fn encode_end_ack_tagged(ack: &EndAck, psk: &crate::auth::Psk) -> [u8; END_LEN] {
    encode_tagged(encode_end_ack(ack), psk)
}

/// Whether a tagged control message as received (End, EndAck, Start,
/// StartAck, Feedback, a page of intervals and its ask) carries `psk`'s
/// tag.
pub fn verify_tag(message: &[u8], psk: &crate::auth::Psk) -> bool {
    let at = match message.len() {
        END_LEN => TAG_AT,
        START_LEN => START_TAG_AT,
        FEEDBACK_LEN => FEEDBACK_TAG_AT,
        INTERVALS_LEN => INTERVALS_TAG_AT,
        _ => return false,
    };
    psk.verify(&message[..at], &message[at..])
}

/// Decodes any datagram. Total: never panics, whatever `buf` holds.
pub fn decode(buf: &[u8]) -> Result<Message, WireError> {
    if buf.len() >= 5 && buf[0..4] == MAGIC && buf[4] == NEGOTIATION {
        return decode_versions(buf).map(Message::Versions);
    }
    if buf.len() < HEADER_LEN {
        return Err(WireError::TooShort(buf.len()));
    }
    if buf[0..4] != MAGIC {
        return Err(WireError::BadMagic);
    }
    if buf[4] != VERSION {
        return Err(WireError::BadVersion(buf[4]));
    }
    let header = Header {
        session: u64_at(buf, 8),
        seq: u64_at(buf, 16),
        send_time_ns: u64_at(buf, 24),
    };
    let kind = buf[5];
    let expected = match kind {
        KIND_DATA => return Ok(Message::Data(header)),
        KIND_END | KIND_END_ACK => END_LEN,
        KIND_HELLO | KIND_HELLO_ACK => HELLO_LEN,
        KIND_START | KIND_START_ACK => START_LEN,
        KIND_FEEDBACK => FEEDBACK_LEN,
        KIND_PROBE | KIND_PROBE_ACK => PROBE_LEN,
        KIND_INTERVALS_ASK | KIND_INTERVALS => INTERVALS_LEN,
        other => return Err(WireError::BadKind(other)),
    };
    if buf.len() != expected {
        return Err(WireError::BadControlLength(buf.len(), expected));
    }
    let flags = u16::from_be_bytes([buf[6], buf[7]]);
    Ok(match kind {
        KIND_END => {
            let mut tag = [0u8; TAG_LEN];
            tag.copy_from_slice(&buf[TAG_AT..]);
            Message::End(End {
                header,
                sent_packets: u64_at(buf, 32),
                sent_bytes: u64_at(buf, 40),
                duration_ns: u64_at(buf, 48),
                nonce: u64_at(buf, 56),
                answer_wait_ns: u64_at(buf, 64),
                sender: decode_sender_stats(buf),
                tag,
            })
        }
        KIND_END_ACK => Message::EndAck(decode_end_ack(buf, header)),
        KIND_START => Message::Start(decode_start(buf, header)?),
        KIND_START_ACK => Message::StartAck(decode_start_ack(buf, header)),
        KIND_INTERVALS_ASK => Message::IntervalsAsk(decode_intervals_ask(buf, header)),
        KIND_INTERVALS => Message::Intervals(decode_intervals_page(buf, header)?),
        KIND_FEEDBACK => Message::Feedback(decode_feedback(buf, header)),
        KIND_PROBE => Message::Probe(Probe {
            header,
            cookie: u64_at(buf, 32),
        }),
        KIND_PROBE_ACK => Message::ProbeAck(ProbeAck {
            header,
            flags,
            cookie: u64_at(buf, 32),
        }),
        KIND_HELLO => Message::Hello(Hello {
            header,
            nonce: u64_at(buf, 32),
            run: Run {
                id: u64_at(buf, 40),
                clients: u64_at(buf, 48),
            },
            cookie: u64_at(buf, 56),
        }),
        _ => Message::HelloAck(HelloAck {
            session: header.session,
            nonce: u64_at(buf, 32),
            flags,
            end_grace_ns: u64_at(buf, 40),
            recv_buffer: u64_at(buf, 48),
            cookie: u64_at(buf, 56),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header() -> Header {
        Header {
            session: 0x0102_0304_0506_0708,
            seq: 42,
            send_time_ns: 1_000_000_007,
        }
    }

    fn end() -> End {
        End {
            header: header(),
            sent_packets: 200,
            sent_bytes: 1_000_000,
            duration_ns: 5,
            nonce: 0xDEAD_BEEF,
            answer_wait_ns: 1_000_000_000,
            sender: None,
            tag: [7; TAG_LEN],
        }
    }

    #[test]
    fn data_header_exact_bytes() {
        let mut buf = [0xAAu8; 40];
        assert!(write_data_header(&mut buf, &header()));
        assert_eq!(&buf[0..8], b"NSPD\x04\x00\x00\x00");
        assert_eq!(&buf[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&buf[16..24], &42u64.to_be_bytes());
        assert_eq!(&buf[24..32], &1_000_000_007u64.to_be_bytes());
        assert_eq!(&buf[32..], &[0xAA; 8], "payload after the header untouched");
        assert_eq!(decode(&buf), Ok(Message::Data(header())));
    }

    #[test]
    fn short_buffers_are_not_tagged() {
        let mut buf = [0u8; HEADER_LEN - 1];
        assert!(!write_data_header(&mut buf, &header()));
        assert_eq!(buf, [0u8; HEADER_LEN - 1]);
    }

    #[test]
    fn end_round_trip_and_exact_bytes() {
        let bytes = encode_end(&end());
        assert_eq!(bytes.len(), END_LEN);
        assert_eq!(&bytes[0..8], b"NSPD\x04\x01\x00\x00");
        assert_eq!(&bytes[56..64], &0xDEAD_BEEFu64.to_be_bytes());
        assert_eq!(&bytes[64..72], &1_000_000_000u64.to_be_bytes());
        assert_eq!(
            &bytes[72..TAG_AT],
            &[0; TAG_AT - 72],
            "reserved bytes are zero"
        );
        assert_eq!(&bytes[TAG_AT..], &[7; TAG_LEN]);
        assert_eq!(tagged_bytes(&bytes).len(), TAG_AT);
        assert_eq!(decode(&bytes), Ok(Message::End(end())));
    }

    #[test]
    fn end_ack_round_trip_and_no_amplification() {
        let ack = EndAck {
            session: 9,
            flags: ACK_GRO | ACK_CONFLICT,
            nonce: 3,
            received_packets: 1,
            received_bytes: 2,
            lost: 3,
            lost_fewest: 2,
            duplicates: 4,
            reordered: 5,
            uncertain: 1,
            late: 6,
            unexpected: 7,
            first_arrival_ns: 8,
            last_arrival_ns: 9,
            first_arrival_packets: 10,
            first_arrival_bytes: 11,
            jitter_ns: 12,
            drops_start: UNKNOWN,
            drops_end: UNKNOWN,
            drop_socket: 1,
            gro_buffers: 13,
            gro_datagrams: 131,
            truncated: 14,
            cpu_user_ns: 15,
            cpu_system_ns: 16,
            transit_discarded: 17,
            cpu_start_ns: 18,
            queue_p50_ns: 19,
            queue_p90_ns: 20,
            queue_p99_ns: 21,
            queue_max_ns: 22,
            delay_samples: 23,
            clock_skew_ppb: -24i64 as u64,
            cpu_sharing: 25,
            tag: [9; TAG_LEN],
        };
        let bytes = encode_end_ack(&ack);
        assert_eq!(&bytes[280..288], &25u64.to_be_bytes(), "cpu_sharing last");
        assert!(bytes.len() <= encode_end(&end()).len());
        assert_eq!(
            u16::from_be_bytes([bytes[6], bytes[7]]),
            ACK_GRO | ACK_CONFLICT
        );
        assert_eq!(&bytes[32..40], &3u64.to_be_bytes(), "the nonce comes first");
        assert_eq!(decode(&bytes), Ok(Message::EndAck(ack)));
    }

    #[test]
    fn cpu_sharing_packs_both_counts_and_zero_is_unknown() {
        let s = CpuSharing {
            other_peers: 15,
            datagrams: 1_234_567,
        };
        assert_eq!(CpuSharing::decode(s.encode()), Some(s));
        assert_eq!(CpuSharing::decode(0), None, "an older server's zero");
        let huge = CpuSharing {
            other_peers: 1 << 20,
            datagrams: u64::MAX,
        };
        let back = CpuSharing::decode(huge.encode()).unwrap();
        assert_eq!(back.other_peers, 0xffff, "saturates, never wraps");
        assert_eq!(back.datagrams, (1 << 48) - 1);
    }

    #[test]
    fn probe_round_trip_and_no_amplification() {
        let probe = Probe {
            header: header(),
            cookie: 0xfeed,
        };
        let bytes = encode_probe(&probe);
        assert_eq!(&bytes[0..8], b"NSPD\x04\x08\x00\x00");
        assert_eq!(decode(&bytes), Ok(Message::Probe(probe)));
        let ack = ProbeAck {
            header: header(),
            flags: PROBE_ECHOED,
            cookie: 5,
        };
        let answer = encode_probe_ack(&ack);
        assert_eq!(
            answer.len(),
            bytes.len(),
            "an answer no larger than the probe"
        );
        assert_eq!(decode(&answer), Ok(Message::ProbeAck(ack)));
        assert_eq!(
            decode(&answer[..PROBE_LEN - 1]),
            Err(WireError::BadControlLength(PROBE_LEN - 1, PROBE_LEN))
        );
    }

    #[test]
    fn other_versions_get_the_versions_spoken_no_larger_than_they_were() {
        for version in [1u8, 2, 3, 5, 250] {
            let mut hello = [0u8; 64];
            hello[0..4].copy_from_slice(&MAGIC);
            hello[4] = version;
            hello[5] = KIND_HELLO;
            hello[8..16].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
            assert_eq!(decode(&hello), Err(WireError::BadVersion(version)));
            let answer = encode_versions(&hello).expect("answered");
            assert!(answer.len() <= hello.len());
            // Fixed for good: magic, version byte 0, the refused version,
            // the count, zero, the session, the versions.
            let mut head = *b"NSPD\x00\x00\x01\x00";
            head[5] = version;
            assert_eq!(&answer[..8], &head);
            assert_eq!(&answer[8..16], &0x0102_0304_0506_0708u64.to_be_bytes());
            assert_eq!(&answer[16..], &[VERSION]);
            let Ok(Message::Versions(v)) = decode(&answer) else {
                panic!("not a version negotiation: {answer:?}")
            };
            assert_eq!(
                (v.session, v.refused, v.spoken()),
                (0x0102_0304_0506_0708, version, &[VERSION][..])
            );
        }
        // Too short to answer without answering more than came; this
        // version and the negotiation itself are never answered.
        let mut short = [0u8; 16];
        short[..4].copy_from_slice(&MAGIC);
        short[4] = 3;
        assert_eq!(encode_versions(&short), None);
        let mut ours = [0u8; 64];
        ours[..4].copy_from_slice(&MAGIC);
        ours[4] = VERSION;
        assert_eq!(encode_versions(&ours), None);
        ours[4] = NEGOTIATION;
        assert_eq!(encode_versions(&ours), None);
        // A negotiation that lists nothing, or more than it holds.
        let mut bad = encode_versions(&{
            let mut h = [0u8; 64];
            h[..4].copy_from_slice(&MAGIC);
            h[4] = 2;
            h
        })
        .unwrap();
        bad[6] = 0;
        assert_eq!(decode(&bad), Err(WireError::BadField));
        bad[6] = 9;
        assert_eq!(decode(&bad), Err(WireError::BadField));
    }

    #[test]
    fn hello_round_trip_and_no_amplification() {
        let hello = Hello {
            header: header(),
            nonce: 77,
            run: Run {
                id: 0x1122,
                clients: 4,
            },
            cookie: 0x3344,
        };
        let bytes = encode_hello(&hello);
        assert_eq!(&bytes[0..8], b"NSPD\x04\x03\x00\x00");
        assert_eq!(&bytes[40..48], &0x1122u64.to_be_bytes());
        assert_eq!(&bytes[48..56], &4u64.to_be_bytes());
        assert_eq!(&bytes[56..64], &0x3344u64.to_be_bytes());
        assert_eq!(decode(&bytes), Ok(Message::Hello(hello)));
        let ack = HelloAck {
            session: 1,
            nonce: 77,
            flags: ACK_AUTH,
            end_grace_ns: 100_000_000,
            recv_buffer: 212_992,
            cookie: 0x0102_0304_0506_0708,
        };
        let answer = encode_hello_ack(&ack);
        assert_eq!(&answer[56..64], &[1, 2, 3, 4, 5, 6, 7, 8], "the cookie");
        assert!(answer.len() <= bytes.len());
        assert_eq!(decode(&answer), Ok(Message::HelloAck(ack)));
    }

    #[test]
    fn truncated_input() {
        let end = encode_end(&end());
        for len in 0..HEADER_LEN {
            assert_eq!(decode(&end[..len]), Err(WireError::TooShort(len)));
        }
        for len in HEADER_LEN..END_LEN {
            assert_eq!(
                decode(&end[..len]),
                Err(WireError::BadControlLength(len, END_LEN))
            );
        }
        let hello = encode_hello(&Hello::default());
        assert_eq!(
            decode(&hello[..HELLO_LEN - 1]),
            Err(WireError::BadControlLength(HELLO_LEN - 1, HELLO_LEN))
        );
    }

    #[test]
    fn garbage_input() {
        assert_eq!(decode(&[0u8; 64]), Err(WireError::BadMagic));
        let mut buf = [0u8; 64];
        write_data_header(&mut buf, &header());
        buf[4] = 1;
        assert_eq!(
            decode(&buf),
            Err(WireError::BadVersion(1)),
            "version 1 is not spoken"
        );
        buf[4] = VERSION;
        buf[5] = 77;
        assert_eq!(decode(&buf), Err(WireError::BadKind(77)));
    }

    fn start() -> Start {
        Start {
            header: header(),
            nonce: 11,
            cookie: 12,
            direction: Direction::ServerToClient,
            request: StreamRequest {
                buffer_size: 1460,
                amount: Amount::Nanos(3_000_000_000),
                rate_bps: 100_000_000,
                flags: SEND_GSO_OFF | SEND_PRECISE,
                batch: 32,
            },
            answer_wait_ns: 2_000_000_000,
            run: Run { id: 5, clients: 2 },
            tag: [0; TAG_LEN],
        }
    }

    #[test]
    fn start_exact_bytes_and_round_trip() {
        let bytes = encode_start(&start());
        assert_eq!(bytes.len(), START_LEN);
        assert_eq!(&bytes[0..8], b"NSPD\x04\x05\x00\x00");
        let word = |i: usize| u64::from_be_bytes(bytes[i..i + 8].try_into().unwrap());
        assert_eq!(
            [32, 40, 48, 56, 64, 72, 80, 88, 96, 104].map(word),
            [
                11,
                12,
                1,
                1460,
                2,
                3_000_000_000,
                100_000_000,
                5,
                32,
                2_000_000_000
            ]
        );
        assert_eq!(&bytes[112..120], &5u64.to_be_bytes(), "run id");
        assert_eq!(&bytes[120..128], &2u64.to_be_bytes(), "run clients");
        assert_eq!(
            &bytes[128..START_TAG_AT],
            &[0; START_TAG_AT - 128],
            "reserved"
        );
        assert_eq!(decode(&bytes), Ok(Message::Start(start())));
        for amount in [Amount::Bytes(9), Amount::Packets(8)] {
            let mut s = start();
            s.request.amount = amount;
            s.direction = Direction::ClientToServer;
            assert_eq!(decode(&encode_start(&s)), Ok(Message::Start(s)));
        }
    }

    #[test]
    fn a_start_with_an_unknown_field_value_is_not_a_start() {
        let mut bytes = encode_start(&start());
        bytes[48 + 7] = 2; // direction 2
        assert_eq!(decode(&bytes), Err(WireError::BadField));
        let mut bytes = encode_start(&start());
        bytes[64 + 7] = 3; // amount kind 3
        assert_eq!(decode(&bytes), Err(WireError::BadField));
    }

    #[test]
    fn start_ack_round_trip_and_no_amplification() {
        let ack = StartAck {
            session: 5,
            flags: ACK_AUTH,
            nonce: 11,
            status: START_TOO_LONG,
            limit: 60_000_000_000,
            rate_bps: 7,
            max_duration_ns: 60_000_000_000,
            stream_nonce: 99,
            tag: [3; TAG_LEN],
        };
        let bytes = encode_start_ack(&ack);
        assert!(bytes.len() <= encode_start(&start()).len());
        assert_eq!(
            &bytes[32..40],
            &11u64.to_be_bytes(),
            "the nonce comes first"
        );
        assert_eq!(decode(&bytes), Ok(Message::StartAck(ack)));
    }

    #[test]
    fn feedback_round_trip() {
        let feedback = Feedback {
            header: header(),
            received_packets: 1,
            received_bytes: 2,
            next_seq: 3,
            kernel_drops: UNKNOWN,
            stream_nonce: 8,
            tag: [4; TAG_LEN],
        };
        let bytes = encode_feedback(&feedback);
        assert_eq!(bytes.len(), FEEDBACK_LEN);
        assert_eq!(&bytes[0..8], b"NSPD\x04\x07\x00\x00");
        assert_eq!(&bytes[64..72], &8u64.to_be_bytes(), "the stream nonce");
        assert_eq!(&bytes[72..FEEDBACK_LEN - TAG_LEN], &[0; 56 - TAG_LEN]);
        assert_eq!(decode(&bytes), Ok(Message::Feedback(feedback)));
        assert_eq!(
            decode(&bytes[..FEEDBACK_LEN - 1]),
            Err(WireError::BadControlLength(FEEDBACK_LEN - 1, FEEDBACK_LEN))
        );
    }

    #[test]
    fn an_end_carries_the_senders_figures_when_it_has_them() {
        let mut e = end();
        e.sender = Some(SenderStats {
            stopped: STOPPED_MAX_DURATION,
            cpu_user_ns: 1,
            cpu_system_ns: 2,
            enobufs_retries: 3,
            backoff_ns: 4,
            calls: 5,
            gso_segments: 6,
            batch: 7,
            first_call_packets: 8,
            first_call_bytes: 9,
            breaker_backoffs: 2,
            breaker_rate_bps: 25_000_000,
        });
        let bytes = encode_end(&e);
        assert_eq!(&bytes[152..160], &2u64.to_be_bytes(), "breaker backoffs");
        assert_eq!(&bytes[160..168], &25_000_000u64.to_be_bytes(), "its rate");
        assert_eq!(
            &bytes[72..80],
            &3u64.to_be_bytes(),
            "present, stopped by the cap"
        );
        assert_eq!(decode(&bytes), Ok(Message::End(e)));
        // Without them the bytes are as an upload client has always sent.
        let plain = encode_end(&end());
        assert_eq!(&plain[72..TAG_AT], &[0; TAG_AT - 72]);
    }

    #[test]
    fn every_tagged_message_verifies_and_any_change_breaks_it() {
        let psk = crate::auth::Psk::new(b"a shared key").unwrap();
        let other = crate::auth::Psk::new(b"another key!").unwrap();
        let ack = StartAck::default();
        let messages: Vec<Vec<u8>> = vec![
            encode_tagged(encode_end(&end()), &psk).to_vec(),
            encode_tagged(encode_end_ack(&EndAck::default()), &psk).to_vec(),
            encode_tagged(encode_start(&start()), &psk).to_vec(),
            encode_tagged(encode_start_ack(&ack), &psk).to_vec(),
            encode_tagged(encode_feedback(&Feedback::default()), &psk).to_vec(),
        ];
        for m in &messages {
            assert!(verify_tag(m, &psk), "kind {}", m[5]);
            assert!(!verify_tag(m, &other), "kind {}", m[5]);
            let mut changed = m.clone();
            changed[40] ^= 1;
            assert!(!verify_tag(&changed, &psk), "kind {}", m[5]);
        }
        // Answers say they are tagged, inside what the tag covers.
        assert_eq!(messages[3][7] & ACK_AUTH as u8, ACK_AUTH as u8);
        assert_eq!(
            encode_end_tagged(&end(), &psk).to_vec(),
            messages[0],
            "one tagging rule"
        );
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn data_round_trip(session: u64, seq: u64, t: u64, extra in 0usize..100) {
            let h = Header { session, seq, send_time_ns: t };
            let mut buf = vec![0u8; HEADER_LEN + extra];
            prop_assert!(write_data_header(&mut buf, &h));
            prop_assert_eq!(decode(&buf), Ok(Message::Data(h)));
        }

        #[test]
        fn end_round_trip_any(session: u64, seq: u64, t: u64, p: u64, b: u64, d: u64, n: u64, w: u64) {
            let end = End { header: Header { session, seq, send_time_ns: t }, sent_packets: p, sent_bytes: b, duration_ns: d, nonce: n, answer_wait_ns: w, sender: None, tag: [0; TAG_LEN] };
            prop_assert_eq!(decode(&encode_end(&end)), Ok(Message::End(end)));
        }
    }
}
