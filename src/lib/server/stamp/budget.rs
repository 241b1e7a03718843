//! How many STAMP answers a source may have: per second, per source
//! address and port, per IPv4 address or IPv6 /64, and for the whole
//! server.
//!
//! Why hashed buckets in arrays of a fixed size, not a map of sources: a
//! flood from forged source addresses must not create state per source.
//! Each source is counted in one bucket, picked by a hash keyed at random
//! when the server starts (so a sender cannot aim at another's bucket).
//! Sources that share a bucket share its budget: a collision can only
//! refuse an answer early, never give a source more than its own budget.
//! The arrays are zeroed when each one-second window begins.

use crate::sys::canonical_addr;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Buckets per array: 16384 × 4 bytes, two arrays, 128 KiB in all.
/// With a thousand busy sources, about 6 % share a bucket with another.
pub const BUCKETS: usize = 1 << 14;

/// The budgets, in answers per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub per_source: u32,
    pub per_prefix: u32,
    pub total: u32,
}

/// Why an answer was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The source address and port spent its budget.
    Source,
    /// Its IPv4 address or IPv6 /64 did.
    Prefix,
    /// The server did.
    Total,
}

/// Answers counted in the current window.
pub struct Budget {
    limits: Limits,
    keys: RandomState,
    sources: Vec<u32>,
    prefixes: Vec<u32>,
    total: u32,
    window: Instant,
}

/// What a source is counted as for its prefix: an IPv4 address whole, an
/// IPv6 address cut to its /64 (one host's addresses, usually).
fn prefix(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
    }
}

impl Budget {
    pub fn new(limits: Limits, now: Instant) -> Budget {
        Budget {
            limits,
            keys: RandomState::new(),
            sources: vec![0; BUCKETS],
            prefixes: vec![0; BUCKETS],
            total: 0,
            window: now,
        }
    }

    fn bucket(&self, key: impl std::hash::Hash) -> usize {
        (self.keys.hash_one(key) as usize) & (BUCKETS - 1)
    }

    /// Charges one answer to `from`, if each of its budgets has room left
    /// in this window; a refusal charges nothing.
    pub fn charge(&mut self, from: SocketAddr, now: Instant) -> Result<(), Refusal> {
        if now.saturating_duration_since(self.window) >= Duration::from_secs(1) {
            self.window = now;
            self.sources.fill(0);
            self.prefixes.fill(0);
            self.total = 0;
        }
        let from = canonical_addr(from);
        let source = self.bucket(from);
        let prefix = self.bucket(prefix(from.ip()));
        if self.total >= self.limits.total {
            return Err(Refusal::Total);
        }
        if self.sources[source] >= self.limits.per_source {
            return Err(Refusal::Source);
        }
        if self.prefixes[prefix] >= self.limits.per_prefix {
            return Err(Refusal::Prefix);
        }
        self.total += 1;
        self.sources[source] += 1;
        self.prefixes[prefix] += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    const LIMITS: Limits = Limits {
        per_source: 3,
        per_prefix: 5,
        total: 8,
    };

    #[test]
    fn each_budget_holds_within_a_window_and_refills_after_it() {
        let t0 = Instant::now();
        let mut b = Budget::new(LIMITS, t0);
        let a = addr("192.0.2.1:1000");
        for _ in 0..3 {
            assert_eq!(b.charge(a, t0), Ok(()));
        }
        assert_eq!(b.charge(a, t0), Err(Refusal::Source));
        // Another port of the same IP: its own source budget, but the
        // IP's budget (5) is shared.
        let a2 = addr("192.0.2.1:1001");
        assert_eq!(b.charge(a2, t0), Ok(()));
        assert_eq!(b.charge(a2, t0), Ok(()));
        assert_eq!(b.charge(a2, t0), Err(Refusal::Prefix));
        // Another IP: the server's total (8) is what is left.
        let c = addr("198.51.100.7:1");
        let d = addr("203.0.113.9:1");
        for _ in 0..3 {
            assert_eq!(b.charge(c, t0), Ok(()));
        }
        assert_eq!(b.charge(d, t0), Err(Refusal::Total));
        // A refusal charged nothing; a new window refills everything.
        let t1 = t0 + Duration::from_secs(1);
        for _ in 0..3 {
            assert_eq!(b.charge(a, t1), Ok(()));
        }
        assert_eq!(b.charge(d, t1), Ok(()));
    }

    #[test]
    fn an_ipv6_64_is_one_prefix_and_a_mapped_ipv4_address_its_own_ip() {
        let t0 = Instant::now();
        let mut b = Budget::new(
            Limits {
                per_source: 100,
                per_prefix: 4,
                total: 100,
            },
            t0,
        );
        // Four hosts of one /64: its budget.
        for host in 1..=4 {
            assert_eq!(b.charge(addr(&format!("[2001:db8::{host}]:5")), t0), Ok(()));
        }
        let same_64 = addr("[2001:db8::ffff:1:2:3]:5");
        assert_eq!(b.charge(same_64, t0), Err(Refusal::Prefix));
        assert_eq!(
            b.charge(addr("[2001:db8:0:1::1]:5"), t0),
            Ok(()),
            "next /64"
        );
        // ::ffff:192.0.2.1 (a dual-stack socket's view) is 192.0.2.1.
        for _ in 0..4 {
            assert_eq!(b.charge(addr("[::ffff:192.0.2.1]:9"), t0), Ok(()));
        }
        assert_eq!(b.charge(addr("192.0.2.1:10"), t0), Err(Refusal::Prefix));
    }

    #[test]
    fn a_flood_from_many_sources_never_passes_the_total_nor_grows_the_arrays() {
        let t0 = Instant::now();
        let mut b = Budget::new(
            Limits {
                per_source: 2,
                per_prefix: 1_000_000,
                total: 1000,
            },
            t0,
        );
        let mut answered = 0;
        for i in 0..100_000u32 {
            let ip = std::net::Ipv4Addr::from(0x0A00_0000 | i);
            if b.charge(SocketAddr::from((ip, 1)), t0).is_ok() {
                answered += 1;
            }
        }
        assert_eq!(answered, 1000);
        assert_eq!((b.sources.len(), b.prefixes.len()), (BUCKETS, BUCKETS));
        // One source, many times: never more than its budget, whichever
        // bucket it shares.
        let one = addr("10.9.9.9:9");
        let t1 = t0 + Duration::from_secs(5);
        let ok = (0..50).filter(|_| b.charge(one, t1).is_ok()).count();
        assert_eq!(ok, 2);
    }
}
