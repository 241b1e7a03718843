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
//! Decoding is pure and total: any byte slice gives a [`Message`] or a
//! [`WireError`], never a panic. Datagrams too short for a header, or that
//! do not start with the magic, are not errors for the server: they are
//! counted as untagged traffic from their source address.

/// The four bytes every tagged datagram starts with.
pub const MAGIC: [u8; 4] = *b"NSPD";
/// The only version this code speaks. Version 1 (no probe, no nonce)
/// decodes as [`WireError::BadVersion`].
pub const VERSION: u8 = 2;
/// Bytes in the header of every tagged datagram.
pub const HEADER_LEN: usize = 32;
/// Size of an End and of its answer. The answer is never larger than the
/// message that caused it, so the server cannot amplify.
pub const END_LEN: usize = 256;
/// Size of a Hello and of its answer.
pub const HELLO_LEN: usize = 64;
/// Bytes of the authentication tag at the end of an End and an EndAck
/// (HMAC-SHA256 with `--psk`; zero without).
pub const TAG_LEN: usize = crate::auth::TAG_LEN;
/// Where the tag starts.
pub const TAG_AT: usize = END_LEN - TAG_LEN;
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

const KIND_DATA: u8 = 0;
const KIND_END: u8 = 1;
const KIND_END_ACK: u8 = 2;
const KIND_HELLO: u8 = 3;
const KIND_HELLO_ACK: u8 = 4;

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

/// The client's start probe: is a udp_server there?
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hello {
    pub header: Header,
    /// Fresh per attempt; the answer echoes it.
    pub nonce: u64,
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
}

/// The client's declared totals, sent when it has finished sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    pub header: Header,
    pub sent_packets: u64,
    pub sent_bytes: u64,
    /// Time from the first to the last data datagram sent.
    pub duration_ns: u64,
    /// Fresh per attempt; the answer echoes it.
    pub nonce: u64,
    /// How long the client keeps asking: the server keeps the session's
    /// answer at least this long.
    pub answer_wait_ns: u64,
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
    /// Buffers received that held more than one datagram (UDP GRO).
    pub gro_buffers: u64,
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
    pub tag: [u8; TAG_LEN],
}

/// A decoded datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    Data(Header),
    End(End),
    EndAck(EndAck),
    Hello(Hello),
    HelloAck(HelloAck),
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
    buf
}

/// Encodes the answer to a start probe.
pub fn encode_hello_ack(ack: &HelloAck) -> [u8; HELLO_LEN] {
    let mut buf = [0u8; HELLO_LEN];
    put_answer_header(&mut buf, KIND_HELLO_ACK, ack.flags, ack.session);
    put_u64(&mut buf, 32, ack.nonce);
    put_u64(&mut buf, 40, ack.end_grace_ns);
    put_u64(&mut buf, 48, ack.recv_buffer);
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
    buf[TAG_AT..].copy_from_slice(&end.tag);
    buf
}

/// The figures of an EndAck, in wire order from offset 32.
fn end_ack_fields(ack: &EndAck) -> [u64; 24] {
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
        tag,
    }
}

/// The bytes an End's or EndAck's tag covers: all but the tag itself.
pub fn tagged_bytes(message: &[u8; END_LEN]) -> &[u8] {
    &message[..TAG_AT]
}

/// Encodes an End with its tag made by `psk`.
pub fn encode_end_tagged(end: &End, psk: &crate::auth::Psk) -> [u8; END_LEN] {
    let mut bytes = encode_end(end);
    let tag = psk.tag(tagged_bytes(&bytes));
    bytes[TAG_AT..].copy_from_slice(&tag);
    bytes
}

/// Encodes an EndAck with its tag made by `psk` (setting [`ACK_AUTH`]).
pub fn encode_end_ack_tagged(ack: &EndAck, psk: &crate::auth::Psk) -> [u8; END_LEN] {
    let mut ack = *ack;
    ack.flags |= ACK_AUTH;
    let mut bytes = encode_end_ack(&ack);
    let tag = psk.tag(tagged_bytes(&bytes));
    bytes[TAG_AT..].copy_from_slice(&tag);
    bytes
}

/// Whether an End or EndAck as received carries `psk`'s tag.
pub fn verify_tag(message: &[u8], psk: &crate::auth::Psk) -> bool {
    message.len() == END_LEN && psk.verify(&message[..TAG_AT], &message[TAG_AT..])
}

/// Decodes any datagram. Total: never panics, whatever `buf` holds.
pub fn decode(buf: &[u8]) -> Result<Message, WireError> {
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
                tag,
            })
        }
        KIND_END_ACK => Message::EndAck(decode_end_ack(buf, header)),
        KIND_HELLO => Message::Hello(Hello {
            header,
            nonce: u64_at(buf, 32),
        }),
        _ => Message::HelloAck(HelloAck {
            session: header.session,
            nonce: u64_at(buf, 32),
            flags,
            end_grace_ns: u64_at(buf, 40),
            recv_buffer: u64_at(buf, 48),
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
            tag: [7; TAG_LEN],
        }
    }

    #[test]
    fn data_header_exact_bytes() {
        let mut buf = [0xAAu8; 40];
        assert!(write_data_header(&mut buf, &header()));
        assert_eq!(&buf[0..8], b"NSPD\x02\x00\x00\x00");
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
        assert_eq!(&bytes[0..8], b"NSPD\x02\x01\x00\x00");
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
            truncated: 14,
            cpu_user_ns: 15,
            cpu_system_ns: 16,
            transit_discarded: 17,
            cpu_start_ns: 18,
            tag: [9; TAG_LEN],
        };
        let bytes = encode_end_ack(&ack);
        assert!(bytes.len() <= encode_end(&end()).len());
        assert_eq!(
            u16::from_be_bytes([bytes[6], bytes[7]]),
            ACK_GRO | ACK_CONFLICT
        );
        assert_eq!(&bytes[32..40], &3u64.to_be_bytes(), "the nonce comes first");
        assert_eq!(decode(&bytes), Ok(Message::EndAck(ack)));
    }

    #[test]
    fn hello_round_trip_and_no_amplification() {
        let hello = Hello {
            header: header(),
            nonce: 77,
        };
        let bytes = encode_hello(&hello);
        assert_eq!(&bytes[0..8], b"NSPD\x02\x03\x00\x00");
        assert_eq!(decode(&bytes), Ok(Message::Hello(hello)));
        let ack = HelloAck {
            session: 1,
            nonce: 77,
            flags: ACK_AUTH,
            end_grace_ns: 100_000_000,
            recv_buffer: 212_992,
        };
        let answer = encode_hello_ack(&ack);
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
            let end = End { header: Header { session, seq, send_time_ns: t }, sent_packets: p, sent_bytes: b, duration_ns: d, nonce: n, answer_wait_ns: w, tag: [0; TAG_LEN] };
            prop_assert_eq!(decode(&encode_end(&end)), Ok(Message::End(end)));
        }
    }
}
