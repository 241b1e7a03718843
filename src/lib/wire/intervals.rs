//! What a server kept of an upload per interval (`udp_client --plot`),
//! fetched after the End a page at a time: the ask (kind 10) and its
//! answer (kind 11).
//!
//! Why the receiver's figures per interval at all: the client knows what
//! it sent each interval, but only the server knows what arrived and how
//! long it queued; without them an upload's picture is the sender's line
//! alone. Why by the datagrams' send time (`send_time_ns`, in intervals
//! of the length the confirming Hello asked for): the figures then are
//! those of the datagrams the client sent in each of its own intervals,
//! so sent minus arrived is that interval's loss, exactly; arrival-time
//! intervals would mix two of the client's and drift by the queue delay.
//! Each interval says its lowest sequence number that arrived, and the
//! client matches it to the interval that sent it.
//!
//! Why asked for after the End, not carried in a longer EndAck: a peer of
//! version 4 takes an End or an EndAck of exactly 320 bytes and nothing
//! else, so a longer answer would be no answer at all to a client of an
//! earlier release, and an hour's figures do not fit in one datagram
//! anyway. Nothing here reaches a peer that did not ask: the Hello's
//! `seq` (zero in every earlier release, and ignored by it) asks the
//! server to keep the figures, the EndAck's [`ACK_INTERVALS`] says it
//! did (a server of an earlier release never sets it), and only then
//! does the client send kind 10, which such a server never sees.
//!
//! Why an ask as long as its answer ([`INTERVALS_LEN`], 1200 bytes: QUIC's
//! size, which crosses any IPv6 path unfragmented): the server never
//! sends more than it received, even to an address that proved itself.

use super::*;

/// Size of an ask for a page of intervals and of its answer.
pub const INTERVALS_LEN: usize = 1200;
/// Intervals in one page.
pub const INTERVALS_PER_PAGE: usize = 27;
/// Where the first interval of a page starts, and each one's bytes.
const RECORDS_AT: usize = 80;
const RECORD_LEN: usize = 40;
/// Where the tag of an ask or a page starts.
pub(super) const INTERVALS_TAG_AT: usize = INTERVALS_LEN - TAG_LEN;
const _: () = assert!(RECORDS_AT + INTERVALS_PER_PAGE * RECORD_LEN <= INTERVALS_TAG_AT);

/// In a page's word at offset 72: no datagram of the session was left
/// out of the intervals kept (none beyond the most a session keeps, or
/// the table's room for them).
const PAGE_COMPLETE: u64 = 1;

/// The client asks for the page of intervals from `first` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IntervalsAsk {
    pub session: u64,
    /// Fresh per attempt; the answer echoes it.
    pub nonce: u64,
    /// The index of the first interval wanted (0, then each page's end).
    pub first: u64,
}

/// A page of intervals: its figures are read from the datagram with
/// [`page_intervals`] (a [`Message`] stays small and `Copy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IntervalsPage {
    pub session: u64,
    /// `ACK_AUTH` when tagged.
    pub flags: u16,
    /// The ask's nonce.
    pub nonce: u64,
    /// The intervals' length: the Hello's ask.
    pub every_ns: u64,
    /// Intervals kept, from the one that starts at send time 0.
    pub total: u64,
    /// This page's first interval, and how many it holds.
    pub first: u64,
    pub count: u64,
    /// No datagram was left out of the intervals kept.
    pub complete: bool,
}

/// What arrived of the datagrams sent in one interval (send time in
/// `[i × every, (i + 1) × every)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IntervalFigures {
    /// Distinct datagrams (duplicates are not counted again) and bytes.
    pub packets: u64,
    pub bytes: u64,
    /// The lowest sequence number among them; [`UNKNOWN`] when none
    /// arrived.
    pub lowest_seq: u64,
    /// Their queue delay's median and 99th percentile (ns above the
    /// session's floor known as each arrived); [`UNKNOWN`] without one.
    pub queue_p50_ns: u64,
    pub queue_p99_ns: u64,
}

impl IntervalFigures {
    /// Nothing arrived.
    pub const NONE: IntervalFigures = IntervalFigures {
        packets: 0,
        bytes: 0,
        lowest_seq: UNKNOWN,
        queue_p50_ns: UNKNOWN,
        queue_p99_ns: UNKNOWN,
    };
}

/// Encodes an ask for a page (tag it with [`encode_tagged`] under `--psk`).
pub fn encode_intervals_ask(ask: &IntervalsAsk) -> [u8; INTERVALS_LEN] {
    let mut buf = [0u8; INTERVALS_LEN];
    put_answer_header(&mut buf, KIND_INTERVALS_ASK, 0, ask.session);
    put_u64(&mut buf, 32, ask.nonce);
    put_u64(&mut buf, 40, ask.first);
    buf
}

/// Encodes a page: `page.count` is taken from `intervals` (at most
/// [`INTERVALS_PER_PAGE`] of them are written).
pub fn encode_intervals_page(
    page: &IntervalsPage,
    intervals: &[IntervalFigures],
) -> [u8; INTERVALS_LEN] {
    let mut buf = [0u8; INTERVALS_LEN];
    let intervals = &intervals[..intervals.len().min(INTERVALS_PER_PAGE)];
    put_answer_header(&mut buf, KIND_INTERVALS, page.flags, page.session);
    put_u64(&mut buf, 32, page.nonce);
    put_u64(&mut buf, 40, page.every_ns);
    put_u64(&mut buf, 48, page.total);
    put_u64(&mut buf, 56, page.first);
    put_u64(&mut buf, 64, intervals.len() as u64);
    put_u64(&mut buf, 72, if page.complete { PAGE_COMPLETE } else { 0 });
    for (i, f) in intervals.iter().enumerate() {
        let at = RECORDS_AT + i * RECORD_LEN;
        let fields = [
            f.packets,
            f.bytes,
            f.lowest_seq,
            f.queue_p50_ns,
            f.queue_p99_ns,
        ];
        for (k, value) in fields.into_iter().enumerate() {
            put_u64(&mut buf, at + 8 * k, value);
        }
    }
    buf
}

pub(super) fn decode_intervals_ask(buf: &[u8], header: Header) -> IntervalsAsk {
    IntervalsAsk {
        session: header.session,
        nonce: u64_at(buf, 32),
        first: u64_at(buf, 40),
    }
}

pub(super) fn decode_intervals_page(
    buf: &[u8],
    header: Header,
) -> Result<IntervalsPage, WireError> {
    let count = u64_at(buf, 64);
    if count > INTERVALS_PER_PAGE as u64 {
        return Err(WireError::BadField);
    }
    Ok(IntervalsPage {
        session: header.session,
        flags: u16::from_be_bytes([buf[6], buf[7]]),
        nonce: u64_at(buf, 32),
        every_ns: u64_at(buf, 40),
        total: u64_at(buf, 48),
        first: u64_at(buf, 56),
        count,
        complete: u64_at(buf, 72) & PAGE_COMPLETE != 0,
    })
}

/// The intervals of a page as received (`raw`, which decoded as `page`).
pub fn page_intervals(raw: &[u8], page: &IntervalsPage) -> Vec<IntervalFigures> {
    let count = (page.count as usize).min(INTERVALS_PER_PAGE);
    if raw.len() != INTERVALS_LEN {
        return Vec::new();
    }
    (0..count)
        .map(|i| {
            let f = |k: usize| u64_at(raw, RECORDS_AT + i * RECORD_LEN + 8 * k);
            IntervalFigures {
                packets: f(0),
                bytes: f(1),
                lowest_seq: f(2),
                queue_p50_ns: f(3),
                queue_p99_ns: f(4),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(i: u64) -> IntervalFigures {
        IntervalFigures {
            packets: 100 + i,
            bytes: 146_000 + i,
            lowest_seq: 1000 * i,
            queue_p50_ns: 2_000_000 + i,
            queue_p99_ns: 9_000_000 + i,
        }
    }

    #[test]
    fn an_ask_round_trips_with_its_exact_bytes() {
        let ask = IntervalsAsk {
            session: 0x0102_0304_0506_0708,
            nonce: 0xDEAD_BEEF,
            first: 27,
        };
        let bytes = encode_intervals_ask(&ask);
        assert_eq!(bytes.len(), INTERVALS_LEN);
        assert_eq!(&bytes[0..8], b"NSPD\x04\x0a\x00\x00");
        assert_eq!(&bytes[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&bytes[16..32], &[0; 16], "seq and send time: 0");
        assert_eq!(&bytes[32..40], &0xDEAD_BEEFu64.to_be_bytes());
        assert_eq!(&bytes[40..48], &27u64.to_be_bytes());
        assert!(bytes[48..].iter().all(|&b| b == 0), "zero to the end");
        assert_eq!(decode(&bytes), Ok(Message::IntervalsAsk(ask)));
        // Only at its length.
        assert_eq!(
            decode(&bytes[..INTERVALS_LEN - 1]),
            Err(WireError::BadControlLength(
                INTERVALS_LEN - 1,
                INTERVALS_LEN
            ))
        );
    }

    #[test]
    fn a_page_round_trips_with_its_exact_bytes() {
        let page = IntervalsPage {
            session: 9,
            flags: 0,
            nonce: 77,
            every_ns: 1_000_000_000,
            total: 30,
            first: 27,
            count: 3,
            complete: true,
        };
        let kept: Vec<IntervalFigures> = (27..30).map(figures).collect();
        let bytes = encode_intervals_page(&page, &kept);
        assert_eq!(&bytes[0..8], b"NSPD\x04\x0b\x00\x00");
        assert_eq!(&bytes[40..48], &1_000_000_000u64.to_be_bytes());
        assert_eq!(&bytes[64..72], &3u64.to_be_bytes());
        assert_eq!(&bytes[72..80], &1u64.to_be_bytes(), "complete");
        assert_eq!(&bytes[80..88], &127u64.to_be_bytes(), "the first's packets");
        assert_eq!(&bytes[80 + 40 + 16..80 + 40 + 24], &28_000u64.to_be_bytes());
        assert!(bytes[80 + 3 * 40..].iter().all(|&b| b == 0));
        let Ok(Message::Intervals(decoded)) = decode(&bytes) else {
            panic!("a page decodes as one");
        };
        assert_eq!(decoded, page);
        assert_eq!(page_intervals(&bytes, &decoded), kept);
        // A full page, and no more than one page's worth written.
        let many: Vec<IntervalFigures> = (0..40).map(figures).collect();
        let full = encode_intervals_page(&page, &many);
        let Ok(Message::Intervals(p)) = decode(&full) else {
            panic!("a full page decodes");
        };
        assert_eq!(p.count, INTERVALS_PER_PAGE as u64);
        assert_eq!(page_intervals(&full, &p), many[..INTERVALS_PER_PAGE]);
        // A count beyond a page is no sender's.
        let mut bad = full;
        bad[64..72].copy_from_slice(&28u64.to_be_bytes());
        assert_eq!(decode(&bad), Err(WireError::BadField));
    }

    #[test]
    fn pages_are_tagged_and_checked_like_every_answer() {
        let psk = crate::auth::Psk::new(b"a shared key").unwrap();
        let ask = encode_tagged(encode_intervals_ask(&IntervalsAsk::default()), &psk);
        assert!(verify_tag(&ask, &psk));
        let page = encode_intervals_page(&IntervalsPage::default(), &[]);
        let page = encode_tagged(page, &psk);
        let Ok(Message::Intervals(p)) = decode(&page) else {
            panic!("a tagged page decodes");
        };
        assert_ne!(p.flags & ACK_AUTH, 0, "the answer says it is tagged");
        assert!(verify_tag(&page, &psk));
        let mut forged = page;
        forged[80] ^= 1;
        assert!(!verify_tag(&forged, &psk));
    }
}
