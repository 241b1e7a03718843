//! The datagram format: a fixed 32-byte header on every tagged datagram,
//! plus the end-of-test exchange.
//!
//! Why a header at all: without sequence numbers and a declared total (seed
//! 001 sent raw random bytes) loss cannot be known. The byte layout is in
//! `docs/protocol.md`; all integers are big-endian (seed 002 used native
//! byte order and could not talk across architectures).
//!
//! Decoding is pure and total: any byte slice gives a [`Message`] or a
//! [`WireError`], never a panic. Datagrams too short for a header, or that
//! do not start with the magic, are not errors for the server: they are
//! counted as untagged traffic from their source address.

/// The four bytes every tagged datagram starts with.
pub const MAGIC: [u8; 4] = *b"NSPD";
/// The only version this code speaks.
pub const VERSION: u8 = 1;
/// Bytes in the header of every tagged datagram.
pub const HEADER_LEN: usize = 32;
/// Size of an end-of-test message and of its answer. The answer is never
/// larger than the message that caused it, so the server cannot amplify.
pub const END_LEN: usize = 96;
/// In an [`EndAck`], the value of `kernel_drops` when the server cannot know.
pub const UNKNOWN: u64 = u64::MAX;

/// In an [`EndAck`]'s flags: the server had UDP_GRO on, so its
/// `kernel_drops` counts dropped buffers, each of up to 64 KiB of datagrams.
pub const ACK_FLAG_GRO: u16 = 1;

const KIND_DATA: u8 = 0;
const KIND_END: u8 = 1;
const KIND_END_ACK: u8 = 2;

/// What a header says about the datagram it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Random per client socket; tells concurrent tests apart.
    pub session: u64,
    /// For data: the datagram's sequence number, from 0.
    /// For control messages: the number of data datagrams sent so far.
    pub seq: u64,
    /// Nanoseconds since the session started, on the sender's clock.
    pub send_time_ns: u64,
}

/// The client's declared totals, sent when it has finished sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    pub header: Header,
    pub sent_packets: u64,
    pub sent_bytes: u64,
    /// Time from the first to the last data datagram sent.
    pub duration_ns: u64,
}

/// The server's answer to an [`End`]: what it received for that session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EndAck {
    pub session: u64,
    pub received_packets: u64,
    pub received_bytes: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub reordered: u64,
    /// Time from the first to the last datagram received.
    pub first_to_last_ns: u64,
    pub jitter_ns: u64,
    /// Datagrams the kernel dropped on the server's socket while this
    /// session ran, or [`UNKNOWN`].
    pub kernel_drops: u64,
    /// [`ACK_FLAG_GRO`], or 0.
    pub flags: u16,
}

/// A decoded datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    Data(Header),
    End(End),
    EndAck(EndAck),
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
    #[error("control message of {0} bytes, expected {END_LEN}")]
    BadControlLength(usize),
}

fn u64_at(buf: &[u8], offset: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&buf[offset..offset + 8]);
    u64::from_be_bytes(bytes)
}

fn put_u64(buf: &mut [u8], offset: usize, value: u64) {
    buf[offset..offset + 8].copy_from_slice(&value.to_be_bytes());
}

fn put_header(buf: &mut [u8], kind: u8, header: &Header) {
    buf[0..4].copy_from_slice(&MAGIC);
    buf[4] = VERSION;
    buf[5] = kind;
    // Flags: 0 except in an EndAck (set by encode_end_ack).
    buf[6] = 0;
    buf[7] = 0;
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
    put_header(buf, KIND_DATA, header);
    true
}

/// Encodes an end-of-test message.
pub fn encode_end(end: &End) -> [u8; END_LEN] {
    let mut buf = [0u8; END_LEN];
    put_header(&mut buf, KIND_END, &end.header);
    put_u64(&mut buf, 32, end.sent_packets);
    put_u64(&mut buf, 40, end.sent_bytes);
    put_u64(&mut buf, 48, end.duration_ns);
    buf
}

/// Encodes the server's answer to an end-of-test message.
pub fn encode_end_ack(ack: &EndAck) -> [u8; END_LEN] {
    let mut buf = [0u8; END_LEN];
    let header = Header {
        session: ack.session,
        seq: 0,
        send_time_ns: 0,
    };
    put_header(&mut buf, KIND_END_ACK, &header);
    buf[6..8].copy_from_slice(&ack.flags.to_be_bytes());
    let fields = [
        ack.received_packets,
        ack.received_bytes,
        ack.lost,
        ack.duplicates,
        ack.reordered,
        ack.first_to_last_ns,
        ack.jitter_ns,
        ack.kernel_drops,
    ];
    for (i, value) in fields.into_iter().enumerate() {
        put_u64(&mut buf, 32 + 8 * i, value);
    }
    buf
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
    match buf[5] {
        KIND_DATA => Ok(Message::Data(header)),
        KIND_END | KIND_END_ACK if buf.len() != END_LEN => {
            Err(WireError::BadControlLength(buf.len()))
        }
        KIND_END => Ok(Message::End(End {
            header,
            sent_packets: u64_at(buf, 32),
            sent_bytes: u64_at(buf, 40),
            duration_ns: u64_at(buf, 48),
        })),
        KIND_END_ACK => Ok(Message::EndAck(EndAck {
            session: header.session,
            received_packets: u64_at(buf, 32),
            received_bytes: u64_at(buf, 40),
            lost: u64_at(buf, 48),
            duplicates: u64_at(buf, 56),
            reordered: u64_at(buf, 64),
            first_to_last_ns: u64_at(buf, 72),
            jitter_ns: u64_at(buf, 80),
            kernel_drops: u64_at(buf, 88),
            flags: u16::from_be_bytes([buf[6], buf[7]]),
        })),
        other => Err(WireError::BadKind(other)),
    }
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

    #[test]
    fn data_header_exact_bytes() {
        let mut buf = [0xAAu8; 40];
        assert!(write_data_header(&mut buf, &header()));
        assert_eq!(&buf[0..8], b"NSPD\x01\x00\x00\x00");
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
    fn end_round_trip() {
        let end = End {
            header: header(),
            sent_packets: 200,
            sent_bytes: 1_000_000,
            duration_ns: 5,
        };
        let bytes = encode_end(&end);
        assert_eq!(bytes.len(), END_LEN);
        assert_eq!(decode(&bytes), Ok(Message::End(end)));
    }

    #[test]
    fn end_ack_round_trip_and_no_amplification() {
        let ack = EndAck {
            session: 9,
            received_packets: 1,
            received_bytes: 2,
            lost: 3,
            duplicates: 4,
            reordered: 5,
            first_to_last_ns: 6,
            jitter_ns: 7,
            kernel_drops: UNKNOWN,
            flags: ACK_FLAG_GRO,
        };
        let bytes = encode_end_ack(&ack);
        assert!(
            bytes.len()
                <= encode_end(&End {
                    header: header(),
                    sent_packets: 0,
                    sent_bytes: 0,
                    duration_ns: 0
                })
                .len()
        );
        assert_eq!(decode(&bytes), Ok(Message::EndAck(ack)));
    }

    #[test]
    fn truncated_input() {
        let end = encode_end(&End {
            header: header(),
            sent_packets: 1,
            sent_bytes: 1,
            duration_ns: 1,
        });
        for len in 0..HEADER_LEN {
            assert_eq!(decode(&end[..len]), Err(WireError::TooShort(len)));
        }
        for len in HEADER_LEN..END_LEN {
            assert_eq!(decode(&end[..len]), Err(WireError::BadControlLength(len)));
        }
    }

    #[test]
    fn garbage_input() {
        assert_eq!(decode(&[0u8; 64]), Err(WireError::BadMagic));
        let mut buf = [0u8; 64];
        write_data_header(&mut buf, &header());
        buf[4] = 2;
        assert_eq!(decode(&buf), Err(WireError::BadVersion(2)));
        buf[4] = VERSION;
        buf[5] = 77;
        assert_eq!(decode(&buf), Err(WireError::BadKind(77)));
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
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
        fn end_round_trip_any(session: u64, seq: u64, t: u64, p: u64, b: u64, d: u64) {
            let end = End { header: Header { session, seq, send_time_ns: t }, sent_packets: p, sent_bytes: b, duration_ns: d };
            prop_assert_eq!(decode(&encode_end(&end)), Ok(Message::End(end)));
        }
    }
}
