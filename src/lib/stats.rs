//! Pure statistics: duplicate and reordering detection over a sequence
//! window, RFC 3550 jitter, loss from declared totals, and the on-wire size
//! of a datagram.
//!
//! Why a window and declared totals instead of iperf3's gap heuristic: a gap
//! in sequence numbers is not loss until the sender says how many it sent.
//! iperf3 counts gaps as loss and takes one back per late arrival, which
//! produces negative loss and loss above 100%. Here loss is
//! `declared - unique received`, duplicates are detected exactly within the
//! window, and nothing is inferred from gaps.

/// How many sequence numbers behind the highest one seen are remembered.
/// A datagram older than that is counted as reordered but cannot be checked
/// for duplication (counted in [`SeqTracker::too_old`]).
pub const WINDOW: u64 = 4096;
const WORDS: usize = (WINDOW / 64) as usize;

/// Tracks which sequence numbers have arrived. Sequence arithmetic wraps
/// (RFC 1982 serial numbers over u64), so a sender may start anywhere.
#[derive(Clone, Debug)]
pub struct SeqTracker {
    highest: Option<u64>,
    /// Bit `seq % WINDOW` is set when `seq` (within the window) has arrived.
    seen: Box<[u64; WORDS]>,
    /// Datagrams received, duplicates included.
    pub received: u64,
    /// Copies of a datagram already received.
    pub duplicates: u64,
    /// Datagrams that arrived after one with a higher sequence number.
    pub reordered: u64,
    /// Reordered datagrams too old to check for duplication.
    pub too_old: u64,
}

impl Default for SeqTracker {
    fn default() -> Self {
        SeqTracker {
            highest: None,
            seen: Box::new([0; WORDS]),
            received: 0,
            duplicates: 0,
            reordered: 0,
            too_old: 0,
        }
    }
}

/// What one arrival was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    InOrder,
    Reordered,
    Duplicate,
}

impl SeqTracker {
    fn bit(seq: u64) -> (usize, u64) {
        let slot = seq % WINDOW;
        ((slot / 64) as usize, 1u64 << (slot % 64))
    }

    fn test_and_set(&mut self, seq: u64) -> bool {
        let (word, mask) = Self::bit(seq);
        let was = self.seen[word] & mask != 0;
        self.seen[word] |= mask;
        was
    }

    fn clear(&mut self, seq: u64) {
        let (word, mask) = Self::bit(seq);
        self.seen[word] &= !mask;
    }

    /// Records one datagram and says what it was.
    pub fn record(&mut self, seq: u64) -> Arrival {
        self.received += 1;
        let Some(highest) = self.highest else {
            self.highest = Some(seq);
            self.test_and_set(seq);
            return Arrival::InOrder;
        };
        let ahead = seq.wrapping_sub(highest);
        if ahead == 0 {
            self.duplicates += 1;
            return Arrival::Duplicate;
        }
        if ahead < 1 << 63 {
            // Forget the slots the window slides over, then mark this one.
            if ahead >= WINDOW {
                self.seen.fill(0);
            } else {
                for skipped in 1..ahead {
                    self.clear(highest.wrapping_add(skipped));
                }
                self.clear(seq);
            }
            self.highest = Some(seq);
            self.test_and_set(seq);
            return Arrival::InOrder;
        }
        let behind = highest.wrapping_sub(seq);
        if behind >= WINDOW {
            self.reordered += 1;
            self.too_old += 1;
            return Arrival::Reordered;
        }
        if self.test_and_set(seq) {
            self.duplicates += 1;
            Arrival::Duplicate
        } else {
            self.reordered += 1;
            Arrival::Reordered
        }
    }

    /// Distinct datagrams received.
    pub fn unique(&self) -> u64 {
        self.received - self.duplicates
    }

    /// Loss against the sender's declared count. Never negative: if more
    /// distinct datagrams arrived than were declared (a confused sender),
    /// loss is 0.
    pub fn lost(&self, declared: u64) -> u64 {
        declared.saturating_sub(self.unique())
    }

    /// Loss estimated from sequence numbers alone, for a sender that never
    /// declared its totals: datagrams between the first and the highest seen
    /// that did not arrive.
    pub fn lost_estimate(&self, first: u64) -> u64 {
        match self.highest {
            Some(h) => (u128::from(h.wrapping_sub(first)) + 1)
                .saturating_sub(u128::from(self.unique()))
                .min(u128::from(u64::MAX)) as u64,
            None => 0,
        }
    }
}

/// Interarrival jitter as RFC 3550 section 6.4.1 defines it: a running
/// mean of |D|, the change in transit time, with gain 1/16.
#[derive(Clone, Debug, Default)]
pub struct Jitter {
    last_transit_ns: Option<i64>,
    jitter_ns: f64,
}

impl Jitter {
    /// Records a datagram sent at `send_ns` (sender clock) and received at
    /// `recv_ns` (receiver clock). The clocks need not agree: only
    /// differences of transit times are used.
    pub fn record(&mut self, send_ns: u64, recv_ns: u64) {
        // Wrapping i64 arithmetic: transit times differ by far less than
        // 2^63 ns, and i128 would cost a software conversion per datagram.
        let transit = (recv_ns as i64).wrapping_sub(send_ns as i64);
        if let Some(last) = self.last_transit_ns {
            let d = transit.wrapping_sub(last).unsigned_abs() as f64;
            self.jitter_ns += (d - self.jitter_ns) / 16.0;
        }
        self.last_transit_ns = Some(transit);
    }

    pub fn nanos(&self) -> f64 {
        self.jitter_ns
    }
}

/// Bytes of Ethernet framing per frame beyond the IP packet: header 14,
/// FCS 4, preamble and start delimiter 8, inter-frame gap 12.
pub const ETHERNET_OVERHEAD: u64 = 38;
/// The smallest Ethernet payload; shorter IP packets are padded.
pub const ETHERNET_MIN_PAYLOAD: u64 = 46;
/// The MTU assumed for the on-wire estimate.
pub const MTU: u64 = 1500;

/// Bytes a UDP datagram of `payload` bytes occupies on an Ethernet wire of
/// MTU 1500, counting fragmentation: each IP fragment is its own frame with
/// its own IP header (IPv6 adds an 8-byte fragment header to each).
pub fn wire_bytes(payload: u64, ipv6: bool) -> u64 {
    let udp = payload + 8;
    let ip_header = if ipv6 { 40 } else { 20 };
    if udp + ip_header <= MTU {
        return ETHERNET_OVERHEAD + (udp + ip_header).max(ETHERNET_MIN_PAYLOAD);
    }
    let frag_header = if ipv6 { 8 } else { 0 };
    // Fragment payloads are multiples of 8 bytes.
    let per_fragment = (MTU - ip_header - frag_header) / 8 * 8;
    let fragments = udp.div_ceil(per_fragment);
    let last = udp - (fragments - 1) * per_fragment;
    (fragments - 1) * (ETHERNET_OVERHEAD + MTU.min(per_fragment + ip_header + frag_header))
        + ETHERNET_OVERHEAD
        + (last + ip_header + frag_header).max(ETHERNET_MIN_PAYLOAD)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn track(seqs: &[u64]) -> SeqTracker {
        let mut t = SeqTracker::default();
        for &s in seqs {
            t.record(s);
        }
        t
    }

    #[test]
    fn in_order_no_loss() {
        let t = track(&[0, 1, 2, 3, 4]);
        assert_eq!((t.received, t.duplicates, t.reordered), (5, 0, 0));
        assert_eq!(t.lost(5), 0);
        assert_eq!(t.lost_estimate(0), 0);
    }

    #[test]
    fn loss_from_declared_total() {
        let t = track(&[0, 1, 3, 4]);
        assert_eq!(t.lost(5), 1);
        assert_eq!(
            t.lost(7),
            3,
            "trailing losses are only known from the total"
        );
        assert_eq!(t.lost_estimate(0), 1);
        assert_eq!(t.reordered, 0, "a gap is not reordering");
    }

    #[test]
    fn duplicates_are_not_data() {
        let t = track(&[0, 1, 1, 2, 0, 2]);
        assert_eq!(t.received, 6);
        assert_eq!(t.duplicates, 3);
        assert_eq!(t.unique(), 3);
        assert_eq!(t.lost(3), 0);
        assert_eq!(t.reordered, 0);
    }

    #[test]
    fn swapped_pairs_count_once_each() {
        // The impairment relay swaps (1,2) and (5,6).
        let t = track(&[0, 2, 1, 3, 4, 6, 5, 7]);
        assert_eq!(t.reordered, 2);
        assert_eq!(t.duplicates, 0);
        assert_eq!(t.lost(8), 0);
    }

    #[test]
    fn reordered_then_duplicated() {
        let t = track(&[0, 3, 1, 1, 2, 2]);
        assert_eq!(t.reordered, 2);
        assert_eq!(t.duplicates, 2);
        assert_eq!(t.lost(4), 0);
    }

    #[test]
    fn wrap_around() {
        let start = u64::MAX - 2;
        let seqs: Vec<u64> = (0..6).map(|i| start.wrapping_add(i)).collect();
        let t = track(&seqs);
        assert_eq!((t.reordered, t.duplicates), (0, 0));
        assert_eq!(t.lost_estimate(start), 0);
        // A late datagram from before the wrap, after it.
        let t = track(&[u64::MAX - 1, 1, u64::MAX, 0, u64::MAX]);
        assert_eq!(t.reordered, 2);
        assert_eq!(t.duplicates, 1);
        assert_eq!(t.lost_estimate(u64::MAX - 1), 0);
    }

    #[test]
    fn estimate_survives_a_forged_far_sequence() {
        // A single forged datagram with the highest sequence number: the
        // estimate saturates instead of overflowing.
        let t = track(&[u64::MAX]);
        assert_eq!(t.lost_estimate(0), u64::MAX);
    }

    #[test]
    fn window_slides_and_forgets() {
        let mut t = SeqTracker::default();
        t.record(0);
        t.record(WINDOW + 10);
        // Far behind the window: reordered, not checkable.
        assert_eq!(t.record(0), Arrival::Reordered);
        assert_eq!(t.too_old, 1);
        // Inside the window, never seen: reordered, then a duplicate.
        assert_eq!(t.record(WINDOW + 5), Arrival::Reordered);
        assert_eq!(t.record(WINDOW + 5), Arrival::Duplicate);
        // A slot reused after the window slid is not a stale duplicate.
        let mut t = SeqTracker::default();
        t.record(5);
        t.record(5 + WINDOW - 1);
        assert_eq!(t.record(5 + WINDOW), Arrival::InOrder);
        assert_eq!(t.record(6 + WINDOW), Arrival::InOrder);
        assert_eq!(t.duplicates, 0);
    }

    #[test]
    fn jitter_rfc3550() {
        let mut j = Jitter::default();
        // Constant transit: no jitter, whatever the clock offset.
        for i in 0..10u64 {
            j.record(i * 1000, 5_000_000 + i * 1000);
        }
        assert_eq!(j.nanos(), 0.0);
        // One datagram 1600 ns late: J = 1600/16 = 100, then the return
        // to normal transit adds (1600 - 100)/16.
        j.record(10_000, 5_000_000 + 10_000 + 1600);
        assert!((j.nanos() - 100.0).abs() < 1e-9);
        j.record(11_000, 5_000_000 + 11_000);
        assert!((j.nanos() - (100.0 + 1500.0 / 16.0)).abs() < 1e-9);
    }

    #[test]
    fn wire_sizes() {
        // Seed 002 counts 42 bytes; we add preamble, IFG and FCS (24).
        assert_eq!(wire_bytes(64, false), 64 + 8 + 20 + 38);
        assert_eq!(wire_bytes(1472, false), 1500 + 38);
        // 1473 needs two fragments: 1480 + 1 bytes of UDP, two IP headers.
        assert_eq!(wire_bytes(1473, false), (1500 + 38) + (38 + 46));
        // Tiny payloads are padded to the Ethernet minimum.
        assert_eq!(wire_bytes(0, false), 38 + 46);
        assert_eq!(wire_bytes(1452, true), 1500 + 38);
        assert_eq!(wire_bytes(1453, true), (1496 + 38) + (38 + 48 + 13));
        // 65500 over IPv4: 65508 UDP bytes in 45 fragments.
        let frags = 65508u64.div_ceil(1480);
        assert_eq!(frags, 45);
        assert_eq!(wire_bytes(65500, false), 65508 + frags * (20 + 38));
    }
}
