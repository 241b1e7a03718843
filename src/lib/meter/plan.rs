//! The datagrams of each send call: how many, how long, and what they hold.
//!
//! Why its own module: every sender (the client's upload, the server's
//! reverse stream, sockbench's bare pair) must lay out exactly the volume
//! asked for, with a short tail where a byte total does not divide, and
//! fill payloads that a compressing link cannot shrink. Pure: it reads only
//! the clock it is given.

use crate::wire;
use std::time::{Duration, Instant};

/// How much a client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Volume {
    /// Exactly this many payload bytes; the last datagram may be short.
    Bytes(u64),
    /// Exactly this many datagrams of `buffer_size`.
    Packets(u64),
    /// Full datagrams until this much time has passed.
    Time(Duration),
}

/// Fills `buf` with bytes that do not compress, so that a compressing link
/// cannot overstate the rate.
pub fn fill_incompressible(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for byte in buf {
        // xorshift64
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *byte = x as u8;
    }
}

/// The datagrams of one call: `whole` of `size` bytes, then at most one
/// shorter `tail`. Kept as three numbers rather than a length per datagram:
/// at 64 B a call carries 4096 datagrams, and the list cost more than the
/// headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Planned {
    whole: usize,
    size: usize,
    /// 0 for none.
    tail: usize,
}

impl Planned {
    pub fn len(&self) -> usize {
        self.whole + usize::from(self.tail > 0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The length of datagram `i`.
    pub fn get(&self, i: usize) -> usize {
        if i < self.whole {
            self.size
        } else {
            self.tail
        }
    }

    /// The bytes of the first `n` datagrams.
    pub fn bytes(&self, n: usize) -> u64 {
        let whole = n.min(self.whole);
        (whole * self.size + if n > self.whole { self.tail } else { 0 }) as u64
    }

    /// How many of the first `n` datagrams are too short for a header.
    pub fn untagged(&self, n: usize) -> u64 {
        (0..n.min(self.len()))
            .filter(|&i| self.get(i) < wire::HEADER_LEN)
            .count() as u64
    }
}

/// Plans the datagrams of the next call: up to `count` that `volume` still
/// allows.
pub fn plan(
    volume: Volume,
    size: usize,
    sent_packets: u64,
    sent_bytes: u64,
    started: Instant,
    count: usize,
) -> Planned {
    let none = Planned::default();
    if let Volume::Time(d) = volume {
        if started.elapsed() >= d {
            return none;
        }
    }
    let count = count as u64;
    let (whole, tail) = match volume {
        Volume::Time(_) => (count, 0),
        Volume::Packets(n) => (count.min(n.saturating_sub(sent_packets)), 0),
        Volume::Bytes(total) => {
            let left = total.saturating_sub(sent_bytes);
            match left.checked_div(size as u64) {
                // 0-byte datagrams never add up to a byte total.
                None => (if left > 0 { count } else { 0 }, 0),
                Some(n) if n >= count => (count, 0),
                Some(n) => (n, left % size as u64),
            }
        }
    };
    Planned {
        whole: whole as usize,
        size,
        tail: tail as usize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The planned lengths, one per datagram.
    fn lengths(p: Planned) -> Vec<usize> {
        (0..p.len()).map(|i| p.get(i)).collect()
    }

    #[test]
    fn plans_exact_totals_with_a_short_tail() {
        let t = Instant::now();
        let plan = |volume, size, packets, bytes, count| {
            lengths(plan(volume, size, packets, bytes, t, count))
        };
        assert_eq!(plan(Volume::Bytes(2500), 1000, 0, 0, 8), [1000, 1000, 500]);
        assert_eq!(plan(Volume::Bytes(2500), 1000, 2, 2000, 8), [500]);
        assert!(plan(Volume::Bytes(2500), 1000, 3, 2500, 8).is_empty());
        assert_eq!(plan(Volume::Packets(3), 0, 1, 0, 8), [0, 0]);
        // The call's room ends before the tail; an exact multiple has none.
        assert_eq!(plan(Volume::Bytes(2500), 1000, 0, 0, 2), [1000, 1000]);
        assert_eq!(plan(Volume::Bytes(3000), 1000, 0, 0, 8), [1000; 3]);
        assert_eq!(plan(Volume::Packets(10), 64, 4, 256, 4), [64; 4]);
        assert_eq!(
            plan(Volume::Time(Duration::from_secs(60)), 10, 0, 0, 4),
            [10; 4]
        );
        assert!(plan(Volume::Time(Duration::ZERO), 10, 0, 0, 4).is_empty());
    }

    #[test]
    fn a_plans_byte_and_header_sums_match_its_lengths() {
        let p = Planned {
            whole: 3,
            size: 1000,
            tail: 20,
        };
        assert_eq!(lengths(p), [1000, 1000, 1000, 20]);
        for n in 0..=4 {
            let l = &lengths(p)[..n];
            assert_eq!(p.bytes(n), l.iter().sum::<usize>() as u64);
            let short = l.iter().filter(|&&x| x < wire::HEADER_LEN).count() as u64;
            assert_eq!(p.untagged(n), short);
        }
    }

    #[test]
    fn payload_does_not_compress() {
        let mut buf = vec![0u8; 4096];
        fill_incompressible(&mut buf, 42);
        let distinct: std::collections::HashSet<u8> = buf.iter().copied().collect();
        assert!(distinct.len() > 200);
    }
}
