//! One STAMP test session as a sender sees it: send a test packet, match
//! an answer to it and turn the pair into a round-trip sample. Nothing
//! here owns a socket, paces or loops: the caller does (the `--no-load`
//! run in [`super`], or a prober beside a load), so the same two calls
//! serve both.
//!
//! Why answers are matched on the sender sequence number they echo
//! (bytes 24–27), not the first four: a stateful reflector writes its own
//! count there. Why the round trip is taken on the monotonic clock (the
//! send time kept here, per sequence number, in a ring): T1 on the wire
//! is the wall clock, which may be stepped between send and answer.

use crate::stamp::{self, time, ErrorEstimate, TestPacket};
use std::io;
use std::net::UdpSocket;
use std::time::{Instant, SystemTime};

/// Test packets remembered for matching: an answer that comes back more
/// than this many packets late is not matched (its packet is counted
/// lost). 65536 is 11 minutes at STAMP's usual 10 ms.
pub const WINDOW: usize = 1 << 16;

/// The wall clock, as Unix nanoseconds.
pub fn unix_ns_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    seq: u32,
    /// Since the session's epoch; 0 for a slot never used.
    sent_ns: u64,
    waiting: bool,
}

/// One round trip, from a test packet and its answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// The test packet's number (the session's own).
    pub sender_seq: u32,
    /// The answer's: the reflector's own count (stateful), or ours echoed.
    pub reflector_seq: u32,
    /// From sending the test packet to reading its answer (T4 − T1, on the
    /// monotonic clock), ns.
    pub rtt_ns: u64,
    /// The time the reflector held it (T3 − T2 by its clock), ns, when its
    /// timestamps make sense (T3 not before T2, and within the round trip).
    pub reflector_ns: Option<u64>,
    /// T2 − T1 and T4 − T3 (ns; negative when the clocks disagree by more
    /// than the delay), when both ends' error estimates say synchronised.
    pub forward_ns: Option<i64>,
    pub backward_ns: Option<i64>,
    /// The TTL or hop limit our packet reached the reflector with (0:
    /// unknown to it).
    pub ttl: u8,
    /// The reflector's error estimate.
    pub reflector_error: ErrorEstimate,
    /// The answer's SSID was 0: the reflector does not know RFC 8972.
    pub zero_ssid: bool,
}

/// Answers that matched no test packet, by why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stray {
    /// Shorter than a base packet.
    pub malformed: u64,
    /// Another session's SSID (not 0, not ours).
    pub other_session: u64,
    /// A sequence number we never sent, or sent so long ago it left the
    /// window.
    pub unknown: u64,
    /// A second answer to a packet already answered.
    pub duplicate: u64,
}

/// A sender's session: its SSID, the next sequence number, and the test
/// packets still waiting for answers.
pub struct StampSession {
    ssid: u16,
    next: u32,
    error: ErrorEstimate,
    epoch: Instant,
    slots: Vec<Slot>,
    /// The packet buffer, reused for every send.
    packet: Vec<u8>,
    pub stray: Stray,
}

impl StampSession {
    /// A session sending `size`-byte test packets (at least 44: the caller
    /// checks) with SSID `ssid` and this host's error estimate `error`.
    pub fn new(ssid: u16, size: usize, error: ErrorEstimate) -> StampSession {
        StampSession {
            ssid,
            next: 0,
            error,
            epoch: Instant::now(),
            slots: vec![Slot::default(); WINDOW],
            packet: vec![0; size.max(stamp::BASE_LEN)],
            stray: Stray::default(),
        }
    }

    pub fn ssid(&self) -> u16 {
        self.ssid
    }

    /// Test packets sent so far.
    pub fn sent(&self) -> u64 {
        u64::from(self.next)
    }

    /// Sends the next test packet on `socket` (connected to the
    /// reflector). Returns its sequence number; on an error the number is
    /// not used and the next send tries it again.
    pub fn send(&mut self, socket: &UdpSocket) -> io::Result<u32> {
        let seq = self.next;
        let packet = TestPacket {
            seq,
            timestamp: time::ntp_from_unix_ns(unix_ns_now()),
            error: self.error,
            ssid: self.ssid,
        };
        stamp::encode_test(&packet, &mut self.packet);
        let sent = self.epoch.elapsed().as_nanos() as u64;
        socket.send(&self.packet)?;
        self.slots[seq as usize % WINDOW] = Slot {
            seq,
            sent_ns: sent.max(1),
            waiting: true,
        };
        self.next = seq.wrapping_add(1);
        Ok(seq)
    }

    /// Matches `datagram`, read at `arrived` (monotonic) and
    /// `arrived_unix_ns` (the wall clock, or the kernel's receive time),
    /// to its test packet and makes it a sample; None for anything else
    /// (counted in [`Self::stray`]).
    pub fn answer(
        &mut self,
        datagram: &[u8],
        arrived: Instant,
        arrived_unix_ns: u64,
    ) -> Option<Sample> {
        let Ok(a) = stamp::decode_reflected(datagram) else {
            self.stray.malformed += 1;
            return None;
        };
        if a.ssid != self.ssid && a.ssid != 0 {
            self.stray.other_session += 1;
            return None;
        }
        let slot = &mut self.slots[a.sender_seq as usize % WINDOW];
        if slot.sent_ns == 0 || slot.seq != a.sender_seq || a.sender_seq >= self.next {
            self.stray.unknown += 1;
            return None;
        }
        if !slot.waiting {
            self.stray.duplicate += 1;
            return None;
        }
        slot.waiting = false;
        let now_ns = arrived.saturating_duration_since(self.epoch).as_nanos() as u64;
        let rtt_ns = now_ns.saturating_sub(slot.sent_ns);
        // T2 and T3 in the reflector's format (its Z bit), near our clock.
        let t2 = a.error.unix_ns(a.receive_timestamp, arrived_unix_ns);
        let t3 = a.error.unix_ns(a.timestamp, arrived_unix_ns);
        let t1 = time::unix_ns_from_ntp(a.sender_timestamp, arrived_unix_ns);
        let reflector_ns = match (t2, t3) {
            (Some(t2), Some(t3)) if t3 >= t2 && t3 - t2 <= rtt_ns => Some(t3 - t2),
            _ => None,
        };
        let synchronized = self.error.synchronized && a.error.synchronized && a.error.is_valid();
        let diff = |later: Option<u64>, earlier: Option<u64>| match (later, earlier) {
            (Some(l), Some(e)) if synchronized => Some(l as i64 - e as i64),
            _ => None,
        };
        Some(Sample {
            sender_seq: a.sender_seq,
            reflector_seq: a.seq,
            rtt_ns,
            reflector_ns,
            forward_ns: diff(t2, t1),
            backward_ns: diff(Some(arrived_unix_ns), t3),
            ttl: a.sender_ttl,
            reflector_error: a.error,
            zero_ssid: a.ssid == 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stamp::{decode_test, reflect_in_place, Reflection};
    use std::time::Duration;

    /// A socket pair on loopback: ours (connected) and the reflector's.
    fn pair() -> (UdpSocket, UdpSocket) {
        let reflector = UdpSocket::bind("127.0.0.1:0").unwrap();
        reflector
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let ours = UdpSocket::bind("127.0.0.1:0").unwrap();
        ours.connect(reflector.local_addr().unwrap()).unwrap();
        (ours, reflector)
    }

    /// Reads one test packet at `reflector` and returns its answer, as a
    /// stateful reflector numbered `own` would write it.
    fn reflect(reflector: &UdpSocket, own: u32, error: u16) -> Vec<u8> {
        let mut buf = [0u8; 2000];
        let (n, _) = reflector.recv_from(&mut buf).unwrap();
        let mut packet = buf[..n].to_vec();
        let now = time::ntp_from_unix_ns(unix_ns_now());
        reflect_in_place(
            &mut packet,
            &Reflection {
                seq: own,
                receive_timestamp: now,
                timestamp: now,
                error: ErrorEstimate::from_bits(error),
                ttl: 64,
            },
        )
        .unwrap();
        packet
    }

    #[test]
    fn a_test_packet_goes_out_numbered_with_our_ssid_and_its_answer_matches() {
        let (ours, reflector) = pair();
        let mut s = StampSession::new(0x1234, 60, ErrorEstimate::at_least(1_000_000, false));
        assert_eq!(s.send(&ours).unwrap(), 0);
        assert_eq!(s.send(&ours).unwrap(), 1);
        let mut buf = [0u8; 100];
        let (n, _) = reflector.recv_from(&mut buf).unwrap();
        assert_eq!(n, 60, "the size asked for");
        let p = decode_test(&buf[..n]).unwrap();
        assert_eq!((p.seq, p.ssid, p.error.bits()), (0, 0x1234, 0x0F84));
        let answer = reflect(&reflector, 7, 0x0001);
        let sample = s
            .answer(&answer, Instant::now(), unix_ns_now())
            .expect("matches packet 1");
        assert_eq!((sample.sender_seq, sample.reflector_seq), (1, 7));
        assert!(sample.rtt_ns > 0 && sample.rtt_ns < 5_000_000_000);
        assert_eq!(sample.reflector_ns, Some(0));
        assert_eq!(sample.ttl, 64);
        // Neither clock says synchronised: no one-way delays.
        assert_eq!((sample.forward_ns, sample.backward_ns), (None, None));
        // The same answer again is a duplicate, not a second sample.
        assert!(s.answer(&answer, Instant::now(), unix_ns_now()).is_none());
        assert_eq!(s.stray.duplicate, 1);
    }

    #[test]
    fn one_way_delays_only_when_both_clocks_say_synchronised() {
        let (ours, reflector) = pair();
        let mut s = StampSession::new(9, 44, ErrorEstimate::at_least(1_000, true));
        s.send(&ours).unwrap();
        let answer = reflect(&reflector, 0, 0x8001);
        let sample = s.answer(&answer, Instant::now(), unix_ns_now()).unwrap();
        assert!(sample.forward_ns.is_some() && sample.backward_ns.is_some());
        // The reflector not synchronised: none.
        s.send(&ours).unwrap();
        let answer = reflect(&reflector, 1, 0x0001);
        let sample = s.answer(&answer, Instant::now(), unix_ns_now()).unwrap();
        assert_eq!(sample.forward_ns, None);
    }

    #[test]
    fn answers_that_are_not_ours_are_counted_and_dropped() {
        let (ours, reflector) = pair();
        let mut s = StampSession::new(5, 44, ErrorEstimate::at_least(0, false));
        s.send(&ours).unwrap();
        let mut answer = reflect(&reflector, 0, 1);
        let now = Instant::now();
        assert!(s.answer(&answer[..43], now, unix_ns_now()).is_none());
        // Another SSID.
        answer[14..16].copy_from_slice(&6u16.to_be_bytes());
        assert!(s.answer(&answer, now, unix_ns_now()).is_none());
        // A sequence number never sent.
        answer[14..16].copy_from_slice(&5u16.to_be_bytes());
        answer[24..28].copy_from_slice(&3u32.to_be_bytes());
        assert!(s.answer(&answer, now, unix_ns_now()).is_none());
        assert_eq!(
            s.stray,
            Stray {
                malformed: 1,
                other_session: 1,
                unknown: 1,
                duplicate: 0
            }
        );
        // A zeroed SSID (a reflector without RFC 8972) is still ours.
        answer[14..16].copy_from_slice(&[0, 0]);
        answer[24..28].copy_from_slice(&0u32.to_be_bytes());
        let sample = s.answer(&answer, now, unix_ns_now()).unwrap();
        assert!(sample.zero_ssid);
    }
}
