//! STAMP, the Simple Two-way Active Measurement Protocol (RFC 8762), with
//! RFC 8972's session identifier (SSID) and TLVs: the unauthenticated test
//! packets as netspeed sends and answers them. Pure encode and decode,
//! like [`crate::wire`]; the byte tables are in `docs/protocol.md`.
//!
//! Why a second format beside netspeed's own probe: any STAMP reflector
//! (a router, stamp-suite, another netspeed) answers it, so a round trip
//! can be measured against hosts that run no udp_server, and other
//! senders can measure against ours.
//!
//! Decoding is total: any byte slice gives a packet or a [`StampError`],
//! never a panic. Only unauthenticated mode is spoken: an authenticated
//! request (112 bytes) cannot be told from a base packet with 68 bytes of
//! trailer, and is answered as one (RFC 8972 §4: the mode is configured,
//! not detected).

pub mod time;
pub mod tlv;

pub use time::ErrorEstimate;

/// The base packet, both ways, in unauthenticated mode (RFC 8762 §4.2.1,
/// §4.3.1).
pub const BASE_LEN: usize = 44;
/// The port IANA assigned to STAMP (RFC 8762 §4.1).
pub const DEFAULT_PORT: u16 = 862;
/// The TTL byte of an answer when the reflector cannot read the
/// request's (the platform gives no IP_RECVTTL): a received packet never
/// has TTL 0, so 0 means unknown.
pub const TTL_UNKNOWN: u8 = 0;

/// The error a clock is off by when nothing says better: the kernel's
/// bound for a clock no daemon steers (it grows to 16 s and stays).
pub const UNKNOWN_CLOCK_ERROR_NS: u64 = 16_000_000_000;

/// This host's error estimate, for the packets it sends or answers: S
/// only when the user says the clock is synchronised to UTC from an
/// external source (`synchronized`), never on a guess; the error the
/// user gives, else the kernel's own bound on it (adjtimex's maxerror),
/// else [`UNKNOWN_CLOCK_ERROR_NS`]. NTP format.
pub fn local_estimate(synchronized: bool, error: Option<std::time::Duration>) -> ErrorEstimate {
    let error_ns = error
        .map(|e| u64::try_from(e.as_nanos()).unwrap_or(u64::MAX))
        .or_else(|| crate::sys::clock_status().map(|c| c.max_error_ns))
        .unwrap_or(UNKNOWN_CLOCK_ERROR_NS);
    ErrorEstimate::at_least(error_ns, synchronized)
}

/// An error estimate as a report shows it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Clock {
    /// The S bit: the clock says it is synchronised to UTC.
    pub synchronized: bool,
    /// The error it claims, in ms.
    pub error_ms: f64,
    /// `NTP` or `PTP` (the Z bit).
    pub format: &'static str,
    /// The multiplier is not 0 (RFC 4656 calls a packet with 0 corrupt).
    pub valid: bool,
}

impl Clock {
    pub fn of(e: ErrorEstimate) -> Clock {
        Clock {
            synchronized: e.synchronized,
            error_ms: e.seconds() * 1e3,
            format: if e.ptp { "PTP" } else { "NTP" },
            valid: e.is_valid(),
        }
    }
}

/// Why bytes are not a STAMP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StampError {
    /// Shorter than the 44-byte base packet. (A TWAMP Light reflector
    /// would answer with 44 bytes; netspeed's answers are never larger
    /// than their request, so it does not answer.)
    #[error("{0} bytes: shorter than the {BASE_LEN}-byte STAMP base packet")]
    TooShort(usize),
}

/// A Session-Sender test packet (RFC 8762 §4.2.1, the SSID from RFC 8972
/// §3). Bytes 16–43 are zero; anything after 44 is the trailer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestPacket {
    /// Starts at 0 with each session and counts the sender's packets.
    pub seq: u32,
    /// T1, in the format the error estimate's Z bit says.
    pub timestamp: u64,
    pub error: ErrorEstimate,
    /// 0: none (a sender without RFC 8972).
    pub ssid: u16,
}

/// A Session-Reflector test packet (RFC 8762 §4.3.1, RFC 8972 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reflected {
    /// The reflector's own count in a stateful session; the sender's
    /// sequence number, copied, in a stateless one.
    pub seq: u32,
    /// T3: when the reflector sent it.
    pub timestamp: u64,
    /// The reflector's; its Z bit gives the format of T2 and T3.
    pub error: ErrorEstimate,
    /// Copied from the request (0 from a reflector without RFC 8972).
    pub ssid: u16,
    /// T2: when the reflector received the request.
    pub receive_timestamp: u64,
    /// Copied from the request: what a sender matches answers on.
    pub sender_seq: u32,
    /// T1, copied.
    pub sender_timestamp: u64,
    /// The sender's error estimate, copied.
    pub sender_error: ErrorEstimate,
    /// The TTL (IPv4) or hop limit (IPv6) the request arrived with.
    pub sender_ttl: u8,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn base(bytes: &[u8]) -> Result<&[u8; BASE_LEN], StampError> {
    bytes
        .first_chunk::<BASE_LEN>()
        .ok_or(StampError::TooShort(bytes.len()))
}

/// Reads a sender's test packet. The MBZ bytes and the trailer are not
/// looked at (RFC 8762: "MUST be ignored on receipt"), and a multiplier
/// of 0 is accepted (the reflector answers anyway; the sender sees its
/// estimate echoed).
pub fn decode_test(bytes: &[u8]) -> Result<TestPacket, StampError> {
    let b = base(bytes)?;
    Ok(TestPacket {
        seq: u32_at(b, 0),
        timestamp: u64_at(b, 4),
        error: ErrorEstimate::from_bits(u16_at(b, 12)),
        ssid: u16_at(b, 14),
    })
}

/// Writes a sender's test packet over the whole of `out` (at least
/// [`BASE_LEN`] bytes): the base packet, then the trailer as
/// [`tlv::pad`] writes it. Returns the length, or None when `out` is
/// shorter than the base packet.
pub fn encode_test(packet: &TestPacket, out: &mut [u8]) -> Option<usize> {
    if out.len() < BASE_LEN {
        return None;
    }
    out[..BASE_LEN].fill(0);
    out[0..4].copy_from_slice(&packet.seq.to_be_bytes());
    out[4..12].copy_from_slice(&packet.timestamp.to_be_bytes());
    out[12..14].copy_from_slice(&packet.error.bits().to_be_bytes());
    out[14..16].copy_from_slice(&packet.ssid.to_be_bytes());
    tlv::pad(&mut out[BASE_LEN..]);
    Some(out.len())
}

/// Reads a reflector's answer. MBZ bytes are ignored; the trailer is not
/// looked at.
pub fn decode_reflected(bytes: &[u8]) -> Result<Reflected, StampError> {
    let b = base(bytes)?;
    Ok(Reflected {
        seq: u32_at(b, 0),
        timestamp: u64_at(b, 4),
        error: ErrorEstimate::from_bits(u16_at(b, 12)),
        ssid: u16_at(b, 14),
        receive_timestamp: u64_at(b, 16),
        sender_seq: u32_at(b, 24),
        sender_timestamp: u64_at(b, 28),
        sender_error: ErrorEstimate::from_bits(u16_at(b, 36)),
        sender_ttl: b[40],
    })
}

/// What the reflector writes into an answer that the request does not
/// give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reflection {
    /// The reflector's sequence number (its own count, or the sender's).
    pub seq: u32,
    /// T2.
    pub receive_timestamp: u64,
    /// T3.
    pub timestamp: u64,
    pub error: ErrorEstimate,
    /// The request's TTL or hop limit, or [`TTL_UNKNOWN`].
    pub ttl: u8,
}

/// Turns the test packet in `packet` into its answer, in place, at the
/// same length (symmetrical, RFC 8762 §4): the base fields as
/// [`Reflected`] has them, the SSID kept where it is, and the trailer's
/// TLVs marked ([`tlv::mark_unrecognized`]). Returns the request as it
/// was, and what the trailer walk found.
pub fn reflect_in_place(
    packet: &mut [u8],
    r: &Reflection,
) -> Result<(TestPacket, tlv::Walk), StampError> {
    let request = decode_test(packet)?;
    // Bytes 0..16 of the request (sequence number, T1, error estimate,
    // SSID) are all the answer copies; read them out before writing.
    let copied: [u8; 14] = packet[0..14].try_into().expect("14 bytes");
    packet[0..4].copy_from_slice(&r.seq.to_be_bytes());
    packet[4..12].copy_from_slice(&r.timestamp.to_be_bytes());
    packet[12..14].copy_from_slice(&r.error.bits().to_be_bytes());
    // 14..16: the SSID, already in place.
    packet[16..24].copy_from_slice(&r.receive_timestamp.to_be_bytes());
    packet[24..36].copy_from_slice(&copied[0..12]);
    packet[36..38].copy_from_slice(&copied[12..14]);
    packet[38..40].fill(0);
    packet[40] = r.ttl;
    packet[41..44].fill(0);
    let walk = tlv::mark_unrecognized(&mut packet[BASE_LEN..]);
    Ok((request, walk))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The research capture's request (stamp-suite 1.0.0's sender) and
    /// its answer from stamp-suite's reflector, UDP payloads.
    const REQUEST: [u8; 44] = hex44(
        "00000000eeb44b36f0b71c2d0001000000000000000000000000000000000000000000000000000000000000",
    );
    const ANSWER: [u8; 44] = hex44(
        "00000000eeb44b36f0c680fa00010000eeb44b36f0c60c3500000000eeb44b36f0b71c2d00010000ff000000",
    );

    const fn hex44(s: &str) -> [u8; 44] {
        let s = s.as_bytes();
        let mut out = [0u8; 44];
        let mut i = 0;
        while i < 44 {
            out[i] = (nibble(s[2 * i]) << 4) | nibble(s[2 * i + 1]);
            i += 1;
        }
        out
    }

    const fn nibble(c: u8) -> u8 {
        match c {
            b'0'..=b'9' => c - b'0',
            _ => c - b'a' + 10,
        }
    }

    #[test]
    fn the_captured_request_decodes_and_encodes_to_the_same_44_bytes() {
        let p = decode_test(&REQUEST).unwrap();
        assert_eq!(p.seq, 0);
        assert_eq!(p.timestamp, 0xeeb4_4b36_f0b7_1c2d);
        assert_eq!(p.error.bits(), 0x0001);
        assert_eq!(p.ssid, 0);
        let mut out = [0xAAu8; 44];
        assert_eq!(encode_test(&p, &mut out), Some(44));
        assert_eq!(out, REQUEST);
    }

    #[test]
    fn a_request_is_laid_out_as_rfc_8762_and_8972_say() {
        let p = TestPacket {
            seq: 0x0102_0304,
            timestamp: 0x1112_1314_1516_1718,
            error: ErrorEstimate::from_bits(0x8F84),
            ssid: 0xABCD,
        };
        let mut out = [0xEEu8; 44];
        encode_test(&p, &mut out).unwrap();
        let mut want = [0u8; 44];
        want[..16].copy_from_slice(&[
            1, 2, 3, 4, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x8F, 0x84, 0xAB, 0xCD,
        ]);
        assert_eq!(out, want, "28 bytes of MBZ after the SSID");
        assert_eq!(decode_test(&out), Ok(p));
        assert_eq!(encode_test(&p, &mut [0u8; 43]), None);
    }

    #[test]
    fn the_captured_answer_decodes_field_by_field() {
        let a = decode_reflected(&ANSWER).unwrap();
        assert_eq!(a.seq, 0);
        assert_eq!(a.timestamp, 0xeeb4_4b36_f0c6_80fa, "T3");
        assert_eq!(a.error.bits(), 0x0001);
        assert_eq!(a.ssid, 0);
        assert_eq!(a.receive_timestamp, 0xeeb4_4b36_f0c6_0c35, "T2");
        assert_eq!(a.sender_seq, 0);
        assert_eq!(a.sender_timestamp, 0xeeb4_4b36_f0b7_1c2d, "T1 echoed");
        assert_eq!(a.sender_error.bits(), 0x0001);
        assert_eq!(a.sender_ttl, 255);
    }

    #[test]
    fn the_reflector_writes_the_captured_answer_from_the_captured_request() {
        let mut packet = REQUEST;
        let r = Reflection {
            seq: 0,
            receive_timestamp: 0xeeb4_4b36_f0c6_0c35,
            timestamp: 0xeeb4_4b36_f0c6_80fa,
            error: ErrorEstimate::from_bits(0x0001),
            ttl: 255,
        };
        let (request, walk) = reflect_in_place(&mut packet, &r).unwrap();
        assert_eq!(request, decode_test(&REQUEST).unwrap());
        assert_eq!(walk, tlv::Walk::default());
        assert_eq!(packet, ANSWER);
    }

    #[test]
    fn an_answer_keeps_the_ssid_and_the_size_and_zeroes_its_mbz() {
        // 68 bytes: SSID 0x1234, an Extra Padding TLV of 20 bytes, and
        // garbage in the request's MBZ (ignored, not copied).
        let mut packet = vec![0u8; 68];
        encode_test(
            &TestPacket {
                seq: 7,
                timestamp: 42,
                error: ErrorEstimate::from_bits(0x0001),
                ssid: 0x1234,
            },
            &mut packet,
        )
        .unwrap();
        packet[20..44].fill(0xAA);
        packet[48..68].fill(0x5A);
        let r = Reflection {
            seq: 3,
            receive_timestamp: 100,
            timestamp: 200,
            error: ErrorEstimate::at_least(1_000_000, false),
            ttl: 64,
        };
        reflect_in_place(&mut packet, &r).unwrap();
        assert_eq!(packet.len(), 68, "symmetrical");
        let a = decode_reflected(&packet).unwrap();
        assert_eq!((a.seq, a.sender_seq, a.ssid), (3, 7, 0x1234));
        assert_eq!((a.receive_timestamp, a.timestamp), (100, 200));
        assert_eq!((a.sender_timestamp, a.sender_ttl), (42, 64));
        assert_eq!(a.error.bits(), 0x0F84);
        assert_eq!(packet[38..40], [0, 0]);
        assert_eq!(packet[41..44], [0, 0, 0]);
        // The padding TLV: understood, so U is cleared; its value copied.
        assert_eq!(packet[44..48], [0x00, 1, 0, 20]);
        assert!(packet[48..].iter().all(|&b| b == 0x5A));
    }

    #[test]
    fn decode_is_total_and_short_input_is_too_short() {
        for len in 0..BASE_LEN {
            let bytes = vec![0xFF; len];
            assert_eq!(decode_test(&bytes), Err(StampError::TooShort(len)));
            assert_eq!(decode_reflected(&bytes), Err(StampError::TooShort(len)));
            let mut copy = bytes.clone();
            assert!(reflect_in_place(&mut copy, &some_reflection()).is_err());
            assert_eq!(copy, bytes, "a short request is left alone");
        }
        // Any bytes of 44 or more decode, whatever they hold.
        for fill in [0u8, 0x55, 0xFF] {
            for len in [44, 45, 47, 48, 200] {
                let mut bytes = vec![fill; len];
                assert!(decode_test(&bytes).is_ok());
                assert!(decode_reflected(&bytes).is_ok());
                reflect_in_place(&mut bytes, &some_reflection()).unwrap();
                assert_eq!(bytes.len(), len);
            }
        }
    }

    fn some_reflection() -> Reflection {
        Reflection {
            seq: 1,
            receive_timestamp: 2,
            timestamp: 3,
            error: ErrorEstimate::from_bits(0x0001),
            ttl: TTL_UNKNOWN,
        }
    }

    proptest::proptest! {
        /// Any bytes: decode never panics, and an answer written in place
        /// keeps the request's length and copies what it must.
        #[test]
        fn any_bytes_decode_or_are_too_short(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let test = decode_test(&bytes);
            proptest::prop_assert_eq!(test.is_ok(), bytes.len() >= BASE_LEN);
            proptest::prop_assert_eq!(decode_reflected(&bytes).is_ok(), bytes.len() >= BASE_LEN);
            let mut answer = bytes.clone();
            let reflected = reflect_in_place(&mut answer, &some_reflection());
            proptest::prop_assert_eq!(answer.len(), bytes.len());
            if let Ok((request, _)) = reflected {
                let a = decode_reflected(&answer).unwrap();
                proptest::prop_assert_eq!(Ok(request), test);
                proptest::prop_assert_eq!(a.sender_seq, request.seq);
                proptest::prop_assert_eq!(a.sender_timestamp, request.timestamp);
                proptest::prop_assert_eq!(a.sender_error, request.error);
                proptest::prop_assert_eq!(a.ssid, request.ssid);
            } else {
                proptest::prop_assert_eq!(answer, bytes);
            }
        }
    }

    #[test]
    fn a_multiplier_of_0_is_read_and_echoed_not_refused() {
        let mut packet = REQUEST;
        packet[12..14].copy_from_slice(&[0, 0]);
        let (request, _) = reflect_in_place(&mut packet, &some_reflection()).unwrap();
        assert!(!request.error.is_valid());
        assert_eq!(packet[36..38], [0, 0], "echoed as sent");
    }
}
