//! Pure statistics: which sequence numbers arrived (loss, duplicates,
//! reordering), RFC 3550 jitter, unbiased rates, and the on-wire size of a
//! datagram.
//!
//! Why a set of received sequence numbers and declared totals instead of
//! iperf3's gap heuristic: a gap in sequence numbers is not loss until the
//! sender says how many it sent. iperf3 counts gaps as loss and takes one
//! back per late arrival, which produces negative loss and loss above 100%.
//! Here loss is `declared - distinct received`, and duplicates are detected
//! exactly at any reordering depth: [`SeqSet`] remembers every sequence
//! number received, as ranges, so its memory grows with the number of holes
//! (lost datagrams), not with the volume. Where its bound is hit, it says
//! how many arrivals it could not classify ([`SeqSet::uncertain`]) rather
//! than guessing.

pub mod cpu;
pub mod delay;
pub mod drops;
pub mod histogram;
pub mod samples;

pub use cpu::{CpuCost, CpuTime, SharedCpu};
pub use drops::{split_loss, Arrivals, KernelDrops, LossSplit};

use std::collections::VecDeque;
use std::time::Duration;

/// A sequence number further than this ahead of the highest one seen (or
/// of 0, for the first datagram) cannot come from a real sender: at 30
/// million datagrams a second it would take ten hours of unbroken loss.
/// Such datagrams (forged, or from a confused sender) are counted in
/// [`SeqSet::implausible`] and change nothing else.
pub const MAX_SEQ_JUMP: u64 = 1 << 40;
/// No sequence number at or above this is plausible, however the ones
/// before it climbed: a forger cannot walk the set up to `u64::MAX`.
pub const MAX_SEQ: u64 = 1 << 62;

/// The default bound on the ranges one [`SeqSet`] keeps (16 bytes each).
pub const DEFAULT_RANGES: usize = 4096;

/// What one arrival was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Its sequence number had not arrived before. `reordered` when a
    /// higher one had.
    New { reordered: bool },
    /// A copy of a datagram already received.
    Duplicate,
    /// It falls in a hole the set had to forget (its bound was hit): it is
    /// either a late original or a copy, and cannot be told apart.
    Uncertain,
    /// Its sequence number is impossibly far ahead ([`MAX_SEQ_JUMP`]).
    Implausible,
}

/// The sequence numbers received in one session, as sorted, disjoint,
/// non-adjacent ranges `[start, end)`. In-order arrival extends the last
/// range (constant time); a late arrival is a binary search.
///
/// Bounded: once it holds more than its bound of ranges, the oldest hole is
/// forgotten (the two first ranges merge). Arrivals below
/// [`SeqSet::forgotten_end`] can then no longer be classified and are
/// counted as [`Arrival::Uncertain`]; [`SeqSet::lost_range`] turns that
/// into an honest interval instead of a wrong number.
#[derive(Clone, Debug)]
pub struct SeqSet {
    ranges: VecDeque<(u64, u64)>,
    bound: usize,
    /// Every sequence number in `[forgotten_from, forgotten_end)` was
    /// either received or lies in a forgotten hole (an empty interval while
    /// nothing was forgotten).
    forgotten_from: u64,
    forgotten_end: u64,
    /// Sequence numbers in forgotten holes.
    forgotten: u64,
    /// The highest plausible sequence number received.
    highest: Option<u64>,
    /// Distinct datagrams recorded (Arrival::New).
    pub unique: u64,
    /// Copies of datagrams already received.
    pub duplicates: u64,
    /// New datagrams that arrived after one with a higher sequence number.
    pub reordered: u64,
    /// Arrivals in forgotten holes: late originals or copies, unknown which.
    pub uncertain: u64,
    /// Arrivals with an impossible sequence number ([`MAX_SEQ_JUMP`]).
    pub implausible: u64,
}

impl Default for SeqSet {
    fn default() -> Self {
        SeqSet::with_bound(DEFAULT_RANGES)
    }
}

impl SeqSet {
    /// A set that keeps at most `bound` ranges (at least 2).
    pub fn with_bound(bound: usize) -> Self {
        SeqSet {
            ranges: VecDeque::new(),
            bound: bound.max(2),
            forgotten_from: 0,
            forgotten_end: 0,
            forgotten: 0,
            highest: None,
            unique: 0,
            duplicates: 0,
            reordered: 0,
            uncertain: 0,
            implausible: 0,
        }
    }

    /// The highest plausible sequence number received.
    pub fn highest(&self) -> Option<u64> {
        self.highest
    }

    /// Ranges held now (memory is 16 bytes each).
    pub fn ranges(&self) -> usize {
        self.ranges.len()
    }

    /// Sequence numbers in holes the bound made the set forget.
    pub fn forgotten(&self) -> u64 {
        self.forgotten
    }

    /// Records one arrival and says what it was.
    pub fn record(&mut self, seq: u64) -> Arrival {
        let base = self.highest.unwrap_or(0);
        if seq >= MAX_SEQ || (seq > base && seq - base > MAX_SEQ_JUMP) {
            self.implausible += 1;
            return Arrival::Implausible;
        }
        if (self.forgotten_from..self.forgotten_end).contains(&seq) {
            self.uncertain += 1;
            return Arrival::Uncertain;
        }
        let reordered = self.highest.is_some_and(|h| seq < h);
        if !self.insert(seq) {
            self.duplicates += 1;
            return Arrival::Duplicate;
        }
        self.unique += 1;
        if reordered {
            self.reordered += 1;
        } else {
            self.highest = Some(seq);
        }
        Arrival::New { reordered }
    }

    /// Records `n` consecutive sequence numbers from `first`, all above
    /// the highest so far (what one GRO buffer from a GSO sender holds),
    /// exactly as [`Self::record`] would one by one, in one step. Returns
    /// false, changing nothing, when the run is not such an in-order append
    /// (a gap before it is fine); the caller then records one by one.
    pub fn record_run(&mut self, first: u64, n: u64) -> bool {
        let Some(end) = first.checked_add(n) else {
            return false;
        };
        let base = self.highest.unwrap_or(0);
        let in_order = self.highest.is_none_or(|h| first > h);
        let plausible = end <= MAX_SEQ && !(first > base && first - base > MAX_SEQ_JUMP);
        let remembered = end <= self.forgotten_from || first >= self.forgotten_end;
        if n == 0 || !in_order || !plausible || !remembered {
            return false;
        }
        match self.ranges.back_mut() {
            Some(last) if first == last.1 => last.1 = end,
            Some(last) if first < last.1 => return false,
            _ => {
                self.ranges.push_back((first, end));
                self.enforce_bound();
            }
        }
        self.unique += n;
        self.highest = Some(end - 1);
        true
    }

    /// Adds `seq`; false when it was already there.
    fn insert(&mut self, seq: u64) -> bool {
        // The common case: the next datagram in order.
        match self.ranges.back_mut() {
            None => {
                self.ranges.push_back((seq, seq + 1));
                return true;
            }
            Some(last) if seq == last.1 => {
                last.1 += 1;
                return true;
            }
            Some(last) if seq > last.1 => {
                self.ranges.push_back((seq, seq + 1));
                self.enforce_bound();
                return true;
            }
            Some(_) => {}
        }
        // The first range starting after `seq`; the one before may hold it.
        let after = self.ranges.partition_point(|&(start, _)| start <= seq);
        if after > 0 && seq < self.ranges[after - 1].1 {
            return false;
        }
        let joins_before = after > 0 && self.ranges[after - 1].1 == seq;
        let joins_after = after < self.ranges.len() && self.ranges[after].0 == seq + 1;
        match (joins_before, joins_after) {
            (true, true) => {
                self.ranges[after - 1].1 = self.ranges[after].1;
                self.ranges.remove(after);
            }
            (true, false) => self.ranges[after - 1].1 = seq + 1,
            (false, true) => self.ranges[after].0 = seq,
            (false, false) => {
                self.ranges.insert(after, (seq, seq + 1));
                self.enforce_bound();
            }
        }
        true
    }

    /// Forgets the oldest hole while there are too many ranges, and keeps
    /// the memory at the bound (a growing VecDeque would double it).
    fn enforce_bound(&mut self) {
        if self.ranges.len() > self.bound / 2 && self.ranges.capacity() <= self.bound {
            self.ranges
                .reserve_exact(self.bound + 1 - self.ranges.len());
        }
        while self.ranges.len() > self.bound {
            let (start, hole_start) = self.ranges.pop_front().expect("over the bound");
            let next = self.ranges.front_mut().expect("over the bound");
            self.forgotten += next.0 - hole_start;
            if self.forgotten_end == self.forgotten_from {
                self.forgotten_from = hole_start;
            }
            // Holes forgotten earlier lie inside the front range too.
            self.forgotten_from = self.forgotten_from.min(hole_start);
            self.forgotten_end = self.forgotten_end.max(next.0);
            next.0 = start;
        }
    }

    /// Frees what the set holds beyond its ranges.
    pub fn shrink(&mut self) {
        self.ranges.shrink_to_fit();
    }

    /// Distinct datagrams recorded with a sequence number at or above
    /// `limit`. Exact for every `limit` at or above
    /// [`SeqSet::forgotten_end`].
    pub fn count_from(&self, limit: u64) -> u64 {
        let mut count = 0;
        for &(start, end) in self.ranges.iter().rev() {
            if end <= limit {
                break;
            }
            count += end - start.max(limit);
        }
        count
    }

    /// Where forgotten holes end (see [`SeqSet::record`]).
    pub fn forgotten_end(&self) -> u64 {
        self.forgotten_end
    }

    /// Loss against a sender that declared `sent` datagrams, numbered from
    /// 0: `(fewest, most)`. The two are equal unless arrivals fell in
    /// forgotten holes; then the truth lies between them. Datagrams with a
    /// sequence number of `sent` or more are not the sender's (see
    /// [`SeqSet::unexpected`]) and cannot hide a loss.
    pub fn lost_range(&self, sent: u64) -> (u64, u64) {
        let in_range = self.unique.saturating_sub(self.count_from(sent));
        let most = sent.saturating_sub(in_range);
        // Forgotten holes at or beyond `sent` made `count_from` count them
        // as received: widen the range by them too.
        let unknowable = if sent < self.forgotten_end {
            self.forgotten
        } else {
            self.uncertain.min(self.forgotten)
        };
        (most.saturating_sub(unknowable), most)
    }

    /// Datagrams that cannot be from a sender that declared `sent`:
    /// sequence numbers of `sent` or more, and implausible ones.
    pub fn unexpected(&self, sent: u64) -> u64 {
        self.count_from(sent) + self.implausible
    }

    /// The sender's count, as far as sequence numbers tell when it never
    /// declared one: everything up to the highest plausible number.
    pub fn expected_from_sequence(&self) -> u64 {
        self.highest.map_or(0, |h| h.saturating_add(1))
    }
}

/// A rate is reported only over at least this span: below it, the time of
/// one datagram's arrival is a large part of the span, and a 3-datagram
/// burst would read as several Gbit/s. Shorter runs report the rate as
/// unknown.
pub const MIN_RATE_SPAN: Duration = Duration::from_millis(1);

/// A rate from a stream of arrivals (or sends): the amount that came
/// *after* the first one, over the time from the first to the last. N
/// datagrams have N-1 gaps between them; counting the first datagram's
/// bytes over those gaps overstates the rate by N/(N-1). `None` below
/// [`MIN_RATE_SPAN`].
pub fn rate_per_second(amount_after_first: u64, span: Duration) -> Option<f64> {
    (span >= MIN_RATE_SPAN).then(|| amount_after_first as f64 / span.as_secs_f64())
}

/// [`rate_per_second`] of bytes, in Gbit/s.
pub fn rate_gbps(bytes_after_first: u64, span: Duration) -> Option<f64> {
    rate_per_second(bytes_after_first, span).map(|bytes| bytes * 8.0 / 1e9)
}

/// Which span a receive rate is taken over (see [`receive_span`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RateSpan {
    /// From the first arrival to the last.
    #[default]
    Arrivals,
    /// The sender's own span (first to last send call), declared in its
    /// End: longer than the arrivals' when they came in a burst.
    Sender,
    /// An interval line's span.
    Interval,
}

/// The one rule for a receiver's rate over a whole session: the longer of
/// the arrivals' span and the span the sender declared it sent over. Why:
/// datagrams that wait in a socket buffer, or survive a full one in a few
/// GRO buffers, can arrive within a millisecond although the sender took
/// 86 ms to send them; over the arrivals alone that reads as 74 Gbit/s,
/// a figure no one can compare with the sender's. Over the longer span the
/// receive rate is never above what the sender's own timing allows, and it
/// is null only when neither span reaches [`MIN_RATE_SPAN`].
pub fn receive_span(arrivals: Duration, sender: Option<Duration>) -> (Duration, RateSpan) {
    match sender {
        Some(s) if s > arrivals => (s, RateSpan::Sender),
        _ => (arrivals, RateSpan::Arrivals),
    }
}

/// `part * 100 / whole`, 0 for an empty whole.
pub fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// A change in transit time larger than this between two datagrams is
/// not a path's jitter but a forged or corrupt send time: it is left out of
/// the estimate and counted ([`Jitter::discarded`]). One datagram can then
/// move the estimate by at most this / 16.
pub const MAX_TRANSIT_STEP_NS: u64 = 1_000_000_000;
/// After this many discarded transit times in a row, the latest becomes the
/// new reference: it is the old one that was wrong (a forged datagram came
/// first), or the path really changed.
const RESET_AFTER: u32 = 3;

/// Interarrival jitter as RFC 3550 section 6.4.1 defines it: a running
/// mean of |D|, the change in transit time, with gain 1/16; changes above
/// [`MAX_TRANSIT_STEP_NS`] are discarded and counted.
#[derive(Clone, Debug, Default)]
pub struct Jitter {
    last_transit_ns: Option<i64>,
    jitter_ns: f64,
    /// Transit times left out as implausible.
    pub discarded: u64,
    in_a_row: u32,
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
            let d = transit.wrapping_sub(last).unsigned_abs();
            if d > MAX_TRANSIT_STEP_NS {
                self.discarded += 1;
                self.in_a_row += 1;
                if self.in_a_row >= RESET_AFTER {
                    self.last_transit_ns = Some(transit);
                    self.in_a_row = 0;
                }
                return;
            }
            self.jitter_ns += (d as f64 - self.jitter_ns) / 16.0;
        }
        self.in_a_row = 0;
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

/// One interval of a sender's report: what the kernel accepted of the
/// send calls that started in it, from the first call that started at or
/// after one multiple of the interval to the first that started at or
/// after the next. Its datagrams are exactly those stamped with a send
/// time in it (a call's datagrams carry the time it started): what a
/// receiver that cuts by send time counts of it (`udp_client --plot`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SendInterval {
    /// Seconds since the sender started, at the call that opened it.
    pub start: f64,
    /// Seconds since the sender started, at the call that closed it.
    pub end: f64,
    pub packets: u64,
    pub bytes: u64,
    /// `bytes × 8 / (end − start)`, Gbit/s; null under [`MIN_RATE_SPAN`]
    /// (a rate over a few microseconds is noise: 45 Gbit/s for a 1 MB
    /// run, beside a summary that rightly says "rate unknown").
    pub gbps: Option<f64>,
}

/// Cuts a sender's running totals into intervals. Pure: the caller gives
/// the time of each send call and its totals after it.
#[derive(Debug, Clone)]
pub struct IntervalClock {
    every: Duration,
    /// Where the current interval opened: time since the start, totals.
    opened: (Duration, u64, u64),
    next: Duration,
}

impl IntervalClock {
    /// Intervals of `every` (not zero) from the sender's start.
    pub fn new(every: Duration) -> Self {
        IntervalClock {
            every,
            opened: (Duration::ZERO, 0, 0),
            next: every,
        }
    }

    fn close(&mut self, at: Duration, packets: u64, bytes: u64) -> SendInterval {
        let (start, p0, b0) = self.opened;
        let span = at.saturating_sub(start).as_secs_f64();
        let sent = bytes - b0;
        self.opened = (at, packets, bytes);
        SendInterval {
            start: start.as_secs_f64(),
            end: at.as_secs_f64(),
            packets: packets - p0,
            bytes: sent,
            gbps: (at.saturating_sub(start) >= MIN_RATE_SPAN)
                .then(|| crate::units::gbps(sent, span)),
        }
    }

    /// A send call starts `at` after the start, with these totals before
    /// it: the interval it closes, if it is the first call past a
    /// boundary (its datagrams are the next interval's). None too when
    /// nothing was sent since the last interval closed: that one goes on.
    pub fn on_call(&mut self, at: Duration, packets: u64, bytes: u64) -> Option<SendInterval> {
        if at < self.next {
            return None;
        }
        // A long sleep may pass several boundaries: the next is the first
        // one after this call.
        let passed = (at.as_nanos() / self.every.as_nanos()) as u32;
        self.next = self.every * (passed + 1);
        (packets > self.opened.1 || bytes > self.opened.2).then(|| self.close(at, packets, bytes))
    }

    /// The sender stopped `at`: the last, shorter interval, if anything
    /// was sent since the last one closed.
    pub fn finish(&mut self, at: Duration, packets: u64, bytes: u64) -> Option<SendInterval> {
        (packets > self.opened.1 || bytes > self.opened.2).then(|| self.close(at, packets, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_arrivals_is_timed_over_the_senders_span() {
        let ms = Duration::from_millis;
        // 14,398 datagrams arrived within 2 ms; the sender needed 86 ms.
        let (span, basis) = receive_span(ms(2), Some(ms(86)));
        assert_eq!((span, basis), (ms(86), RateSpan::Sender));
        let gbps = rate_gbps(14_397 * 1400, span).expect("a rate");
        assert!((gbps - 1.875).abs() < 0.001, "{gbps}");
        // Arrivals spread longer than the sending (a queue drained after
        // it): their span stands.
        assert_eq!(
            receive_span(ms(120), Some(ms(86))),
            (ms(120), RateSpan::Arrivals)
        );
        // No End yet: the arrivals alone.
        assert_eq!(receive_span(ms(5), None), (ms(5), RateSpan::Arrivals));
        // Neither long enough: no rate.
        let (span, _) = receive_span(Duration::from_micros(300), Some(Duration::from_micros(600)));
        assert_eq!(rate_gbps(1000, span), None);
    }

    #[test]
    fn intervals_add_up_to_the_totals_and_follow_the_calls() {
        let ms = Duration::from_millis;
        let mut clock = IntervalClock::new(ms(1000));
        // Calls every 300 ms, 10 datagrams of 100 bytes each; then a pause
        // over two boundaries; then the end.
        let mut seen = Vec::new();
        let mut total = (0, 0);
        for t in [300, 600, 900, 1200, 1500, 3400, 3700] {
            // The totals before the call: its datagrams are its interval's.
            seen.extend(clock.on_call(ms(t), total.0, total.1));
            total = (total.0 + 10, total.1 + 1000);
        }
        seen.extend(clock.finish(ms(3800), total.0, total.1));
        assert!(
            clock.finish(ms(3900), total.0, total.1).is_none(),
            "nothing new"
        );
        let spans: Vec<(f64, f64)> = seen.iter().map(|i| (i.start, i.end)).collect();
        assert_eq!(spans, [(0.0, 1.2), (1.2, 3.4), (3.4, 3.8)]);
        assert_eq!(seen.iter().map(|i| i.packets).sum::<u64>(), total.0);
        assert_eq!(seen.iter().map(|i| i.bytes).sum::<u64>(), total.1);
        // The calls that started before 1 s: 3000 bytes over 1.2 s.
        assert!((seen[0].gbps.unwrap() - 3000.0 * 8.0 / 1.2 / 1e9).abs() < 1e-12);
        assert_eq!(
            seen.iter().map(|i| i.packets).collect::<Vec<_>>(),
            [30, 20, 20]
        );
        // A first call that starts past a boundary closes nothing empty.
        let mut clock = IntervalClock::new(ms(1000));
        assert_eq!(clock.on_call(ms(1500), 0, 0), None);
        assert_eq!(
            clock
                .on_call(ms(2100), 10, 1000)
                .map(|i| (i.start, i.packets)),
            Some((0.0, 10))
        );
        // A last interval under a millisecond has no rate, not a huge one.
        let mut clock = IntervalClock::new(ms(1000));
        let short = clock
            .finish(Duration::from_micros(300), 200, 1_000_000)
            .unwrap();
        assert_eq!((short.packets, short.gbps), (200, None));
    }

    /// Everything a SeqSet reports, for comparing two of them.
    fn seq_figures(t: &SeqSet) -> [u64; 10] {
        let (low, high) = t.lost_range(t.highest().map_or(0, |h| h + 1));
        [
            t.unique,
            t.duplicates,
            t.reordered,
            t.uncertain,
            t.implausible,
            t.highest().map_or(u64::MAX, |h| h),
            t.ranges() as u64,
            t.forgotten(),
            low,
            high,
        ]
    }

    #[test]
    fn a_run_is_recorded_as_its_datagrams_would_be() {
        // Runs of GRO-buffer length, with gaps, repeats, reordering and
        // implausible jumps, against a small bound: whenever record_run
        // takes a run, the set is what recording one by one gives.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for bound in [2, 4, 64] {
            let (mut fast, mut slow) = (SeqSet::with_bound(bound), SeqSet::with_bound(bound));
            let (mut seq, mut taken) = (0u64, 0);
            for _ in 0..5000 {
                let n = 1 + next() % 44;
                let start = match next() % 10 {
                    0 => seq + next() % 100,              // a gap
                    1 => seq.saturating_sub(next() % 60), // back in time
                    2 => seq + MAX_SEQ_JUMP + 1,          // implausible, once
                    _ => seq,
                };
                if fast.record_run(start, n) {
                    taken += 1;
                } else {
                    for s in start..start + n {
                        fast.record(s);
                    }
                }
                for s in start..start + n {
                    slow.record(s);
                }
                assert_eq!(seq_figures(&fast), seq_figures(&slow), "bound {bound}");
                if start <= seq + 100 {
                    seq = start + n;
                }
            }
            assert!(taken > 200, "bound {bound}: only {taken} runs taken");
        }
    }

    fn track(seqs: &[u64]) -> SeqSet {
        let mut t = SeqSet::default();
        for &s in seqs {
            t.record(s);
        }
        t
    }

    #[test]
    fn counts_per_arrival_order() {
        // Arrivals, the declared total, (unique, duplicates, reordered),
        // the loss range against the total, and the ranges remembered.
        for (seqs, total, counts, lost, ranges) in [
            // In order, no loss.
            (&[0, 1, 2, 3, 4][..], 5, (5, 0, 0), (0, 0), 1),
            // A gap is loss, not reordering.
            (&[0, 1, 3, 4], 5, (4, 0, 0), (1, 1), 2),
            // Duplicates are not data.
            (&[0, 1, 1, 2, 0, 2], 3, (3, 3, 0), (0, 0), 1),
            // The impairment relay swaps (1,2) and (5,6): each pair counts
            // once, and holes that fill up merge their ranges.
            (&[0, 2, 1, 3, 4, 6, 5, 7], 8, (8, 0, 2), (0, 0), 1),
            // Reordered, then duplicated.
            (&[0, 3, 1, 1, 2, 2], 4, (4, 2, 2), (0, 0), 1),
        ] {
            let t = track(seqs);
            assert_eq!(
                (
                    (t.unique, t.duplicates, t.reordered),
                    t.lost_range(total),
                    t.ranges()
                ),
                (counts, lost, ranges),
                "{seqs:?}"
            );
        }
    }

    #[test]
    fn trailing_losses_are_only_known_from_the_total() {
        let t = track(&[0, 1, 3, 4]);
        assert_eq!(t.lost_range(7), (3, 3));
        assert_eq!(t.expected_from_sequence() - t.unique, 1);
        assert_eq!(track(&[0, 1, 2, 3, 4]).expected_from_sequence(), 5);
    }

    #[test]
    fn a_late_duplicate_at_any_depth_is_a_duplicate() {
        // Issue 11: a relay drops seq 10 and repeats seq 20 after seq 5000.
        // A 4096-datagram window called the copy new, and hid the loss.
        let mut t = SeqSet::default();
        for seq in (0..=5000).filter(|&s| s != 10) {
            t.record(seq);
        }
        assert_eq!(t.record(20), Arrival::Duplicate);
        assert_eq!(t.lost_range(5001), (1, 1));
        assert_eq!((t.duplicates, t.reordered), (1, 0));
        // And the lost one, arriving a million datagrams late, is new.
        for seq in 5001..1_000_000 {
            t.record(seq);
        }
        assert_eq!(t.record(10), Arrival::New { reordered: true });
        assert_eq!(t.lost_range(1_000_000), (0, 0));
        assert_eq!(t.ranges(), 1);
    }

    #[test]
    fn memory_grows_with_holes_and_is_bounded() {
        let mut t = SeqSet::with_bound(8);
        // Every third datagram lost: a hole per two arrivals.
        for seq in (0..300).filter(|s| s % 3 != 0) {
            t.record(seq);
        }
        assert_eq!(t.ranges(), 8, "bounded");
        assert!(t.forgotten() > 0);
        let (fewest, most) = t.lost_range(300);
        assert_eq!((fewest, most), (100, 100), "nothing uncertain yet");
        // A lost datagram from a forgotten hole arrives: it cannot be
        // classified, and loss becomes an honest range.
        assert_eq!(t.record(3), Arrival::Uncertain);
        assert_eq!(t.lost_range(300), (99, 100));
        // One from a hole still remembered is exact.
        assert_eq!(t.record(297), Arrival::New { reordered: true });
        assert_eq!(t.lost_range(300), (98, 99));
        // A copy of a remembered datagram is still a duplicate.
        assert_eq!(t.record(298), Arrival::Duplicate);
    }

    #[test]
    fn holes_forgotten_earlier_stay_uncertain() {
        // Found by proptest: forgetting a hole below the front range must
        // not make an older forgotten hole look remembered again.
        let mut t = SeqSet::with_bound(2);
        for seq in [53, 55, 57, 7] {
            t.record(seq);
        }
        assert_eq!(
            t.record(54),
            Arrival::Uncertain,
            "54 lay in a forgotten hole"
        );
        assert_eq!(t.record(50), Arrival::Uncertain);
    }

    #[test]
    fn a_new_front_below_a_forgotten_hole_stays_exact() {
        // Found in review: holes refill, then a datagram below the lowest
        // range becomes the front; the holes above it are remembered.
        let mut t = SeqSet::with_bound(3);
        for seq in [5, 7, 9, 11, 8, 0, 1, 2, 3, 4] {
            t.record(seq);
        }
        let (fewest, most) = t.lost_range(12);
        assert!(fewest <= 2 && 2 <= most, "({fewest}, {most})");
        assert_eq!(t.uncertain, 0, "1..4 lie below every forgotten hole");
    }

    #[test]
    fn forgotten_holes_beyond_the_total_cannot_underflow() {
        // Found in review: seqs beyond the declared total, with holes.
        let mut t = SeqSet::with_bound(2);
        for seq in (0..10).chain([1000, 1002, 1004]) {
            t.record(seq);
        }
        let (fewest, most) = t.lost_range(10);
        assert!(fewest == 0 && most <= 10, "({fewest}, {most})");
    }

    #[test]
    fn sequence_numbers_cannot_be_walked_up_to_the_top() {
        // Found in review: each forged datagram 2^40 ahead of the last.
        let mut t = SeqSet::default();
        let mut seq = 0u64;
        for _ in 0..10_000 {
            t.record(seq);
            seq = seq.saturating_add(MAX_SEQ_JUMP);
        }
        assert_eq!(t.record(u64::MAX), Arrival::Implausible);
        assert_eq!(t.record(MAX_SEQ), Arrival::Implausible);
        assert!(t.highest().unwrap() < MAX_SEQ);
    }

    #[test]
    fn memory_stays_at_the_bound() {
        let mut t = SeqSet::with_bound(1024);
        for seq in (0..10_000).step_by(2) {
            t.record(seq);
        }
        assert_eq!(t.ranges(), 1024);
        assert!(t.ranges.capacity() <= 1025, "{}", t.ranges.capacity());
    }

    #[test]
    fn a_lost_first_datagram_stays_exact_after_forgetting() {
        let mut t = SeqSet::with_bound(2);
        for seq in [1, 3, 5, 7] {
            t.record(seq);
        }
        assert!(t.forgotten() > 0);
        // Seq 0 lies before every range, not in a forgotten hole.
        assert_eq!(t.record(0), Arrival::New { reordered: true });
    }

    #[test]
    fn forged_far_sequence_numbers_change_nothing() {
        // Issue 11: one datagram with seq 2^64-1 made `lost` wrap.
        let mut t = track(&[0, 1, 2]);
        assert_eq!(t.record(u64::MAX), Arrival::Implausible);
        assert_eq!(t.record(u64::MAX), Arrival::Implausible);
        assert_eq!(t.expected_from_sequence(), 3);
        assert_eq!(t.lost_range(3), (0, 0));
        assert_eq!(t.unexpected(3), 2);
        // The first datagram is judged against 0.
        let mut t = SeqSet::default();
        assert_eq!(t.record(MAX_SEQ_JUMP + 1), Arrival::Implausible);
        assert_eq!(t.record(MAX_SEQ_JUMP), Arrival::New { reordered: false });
    }

    #[test]
    fn sequence_numbers_beyond_the_declared_total_are_unexpected() {
        let t = track(&[0, 1, 2, 7, 8]);
        assert_eq!(t.unexpected(5), 2);
        assert_eq!(t.lost_range(5), (2, 2), "seq 3 and 4; 7 and 8 hide nothing");
    }

    #[test]
    fn rates_count_the_gaps_not_the_datagrams() {
        // 10 datagrams of 1250 bytes paced at 10 Mbit/s: 1 ms apart, so
        // 9 ms from the first to the last. 9 datagrams came after the first.
        let span = Duration::from_millis(9);
        let gbps = rate_gbps(9 * 1250, span).unwrap();
        assert!((gbps - 0.01).abs() < 1e-12, "{gbps}");
        // A 3-datagram burst over 36 µs has no meaningful rate.
        assert_eq!(rate_gbps(2 * 1000, Duration::from_micros(36)), None);
        assert_eq!(rate_per_second(5, Duration::ZERO), None);
        assert_eq!(percent(1, 4), 25.0);
        assert_eq!(percent(1, 0), 0.0);
    }

    proptest::proptest! {
        #[test]
        fn matches_a_plain_set(seqs in proptest::collection::vec(0u64..200, 0..400), bound in 2usize..40) {
            let mut t = SeqSet::with_bound(bound);
            let mut seen = std::collections::HashSet::new();
            let mut uncertain = 0;
            for &s in &seqs {
                match t.record(s) {
                    Arrival::New { .. } => proptest::prop_assert!(seen.insert(s)),
                    Arrival::Duplicate => proptest::prop_assert!(seen.contains(&s)),
                    Arrival::Uncertain => uncertain += 1,
                    Arrival::Implausible => proptest::prop_assert!(false),
                }
            }
            proptest::prop_assert!(t.ranges() <= bound);
            // The true loss, from every distinct sequence number sent in.
            let distinct: std::collections::HashSet<u64> = seqs.iter().copied().collect();
            let truth = 200 - distinct.len() as u64;
            let (fewest, most) = t.lost_range(200);
            proptest::prop_assert!(fewest <= truth && truth <= most, "{} <= {} <= {}", fewest, truth, most);
            proptest::prop_assert_eq!(most, 200 - seen.len() as u64);
            if uncertain == 0 {
                proptest::prop_assert_eq!(fewest, most);
            }
        }
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
    fn forged_send_times_cannot_blow_up_jitter() {
        let mut j = Jitter::default();
        let mut t = 0u64;
        let mut step = |j: &mut Jitter, send: u64| {
            t += 1_000_000;
            j.record(send, 5_000_000_000 + t);
        };
        for i in 0..50u64 {
            step(&mut j, (i + 1) * 1_000_000);
        }
        assert_eq!(j.nanos(), 0.0);
        // Random send times, as a forger sends them.
        for forged in [u64::MAX / 3, 1 << 50, 1 << 62, 3 << 60, u64::MAX] {
            step(&mut j, forged);
        }
        for i in 55..100u64 {
            step(&mut j, (i + 1) * 1_000_000);
        }
        assert!(j.discarded >= 5, "{}", j.discarded);
        assert!(
            j.nanos() < MAX_TRANSIT_STEP_NS as f64 / 16.0,
            "one datagram moves jitter by at most a step / 16: {}",
            j.nanos()
        );
        // A forged datagram first: the real ones take over after 3.
        let mut j = Jitter::default();
        j.record(u64::MAX / 2, 1_000);
        for i in 1..10u64 {
            j.record(i * 1_000, 5_000 + i * 1_000);
        }
        assert_eq!(j.discarded, 3);
        assert_eq!(j.nanos(), 0.0);
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
