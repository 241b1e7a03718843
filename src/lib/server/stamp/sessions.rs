//! The stateful reflector's sessions (RFC 8762 §4: its own sequence
//! number per session, so that a sender can tell loss on the way there
//! from loss on the way back). A session is a source address and port
//! with an SSID (RFC 8972 §3); its count starts at 0 and grows by one
//! with each answer.
//!
//! The table is bounded ([`Sessions::new`]'s `most`) and forgets a
//! session idle for the timeout. **When it is full, a new session is
//! answered statelessly** (its own sequence numbers echoed, which RFC
//! 8762 allows), not refused: a flood that fills the table costs the
//! newcomers the split of their loss by direction, never their answers,
//! and the sessions already in the table keep their counts. Why not
//! evict the oldest: under a flood of forged sources every real session
//! would be evicted in turn and restart its count mid-test.
//!
//! A session answered statelessly stays so for its life: a mark in a
//! fixed bitmap (by a keyed hash, like the budget's buckets, so it holds
//! no per-source state) keeps it out of the table when a slot frees, so
//! its sender never sees the numbering change mid-test. Marks are kept in
//! two generations that turn over every timeout: a session idle for two
//! timeouts is forgotten, like one in the table.

use crate::sys::canonical_addr;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// A session: where its packets come from, and the SSID they carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionKey {
    pub from: SocketAddr,
    pub ssid: u16,
}

impl SessionKey {
    pub fn new(from: SocketAddr, ssid: u16) -> Self {
        SessionKey {
            from: canonical_addr(from),
            ssid,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Session {
    /// The sequence number of its next answer.
    next: u32,
    last_seen: Instant,
}

/// Bits in each generation of stateless marks (8 KiB each).
const MARK_BITS: usize = 1 << 16;

/// How an answer is numbered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numbered {
    /// The session's own count.
    Own(u32),
    /// The sender's number, echoed: the table was full.
    Echoed(u32),
}

impl Numbered {
    pub fn seq(self) -> u32 {
        match self {
            Numbered::Own(n) | Numbered::Echoed(n) => n,
        }
    }
}

pub struct Sessions {
    table: HashMap<SessionKey, Session>,
    most: usize,
    timeout: Duration,
    marks: [Vec<u64>; 2],
    /// Which generation new marks go to, and when it began.
    current: usize,
    turned: Instant,
    keys: RandomState,
    /// Sessions the table has held at once, at most.
    pub peak: usize,
    /// Sessions forgotten after the timeout.
    pub expired: u64,
    /// Sessions that began: counted into the table, or marked stateless.
    pub started: u64,
}

impl Sessions {
    /// Room for `most` sessions, allocated now: no answer allocates.
    pub fn new(most: usize, timeout: Duration, now: Instant) -> Sessions {
        Sessions {
            table: HashMap::with_capacity(most),
            most,
            timeout,
            marks: [vec![0; MARK_BITS / 64], vec![0; MARK_BITS / 64]],
            current: 0,
            turned: now,
            keys: RandomState::new(),
            peak: 0,
            expired: 0,
            started: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    fn mark_bit(&self, key: &SessionKey) -> (usize, u64) {
        let bit = (self.keys.hash_one(key) as usize) & (MARK_BITS - 1);
        (bit / 64, 1u64 << (bit % 64))
    }

    /// The number of the answer to `sender_seq` in session `key`.
    pub fn number(&mut self, key: SessionKey, sender_seq: u32, now: Instant) -> Numbered {
        if let Some(session) = self.table.get_mut(&key) {
            let seq = session.next;
            session.next = seq.wrapping_add(1);
            session.last_seen = now;
            return Numbered::Own(seq);
        }
        let (word, bit) = self.mark_bit(&key);
        let marked = self.marks.iter().any(|m| m[word] & bit != 0);
        if marked || self.table.len() >= self.most {
            if !marked {
                self.started += 1;
            }
            self.marks[self.current][word] |= bit;
            return Numbered::Echoed(sender_seq);
        }
        self.started += 1;
        self.table.insert(
            key,
            Session {
                next: 1,
                last_seen: now,
            },
        );
        self.peak = self.peak.max(self.table.len());
        Numbered::Own(0)
    }

    /// Forgets sessions idle for the timeout, and turns the marks over
    /// once a timeout has passed since the last turn.
    pub fn expire(&mut self, now: Instant) {
        let timeout = self.timeout;
        let before = self.table.len();
        self.table
            .retain(|_, s| now.saturating_duration_since(s.last_seen) < timeout);
        self.expired += (before - self.table.len()) as u64;
        if now.saturating_duration_since(self.turned) >= timeout {
            self.current ^= 1;
            self.marks[self.current].fill(0);
            self.turned = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(port: u16, ssid: u16) -> SessionKey {
        SessionKey::new(SocketAddr::from(([192, 0, 2, 1], port)), ssid)
    }

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn each_session_counts_its_own_answers_from_0() {
        let t0 = Instant::now();
        let mut s = Sessions::new(10, MINUTE, t0);
        // The sender's numbers do not matter: 100, 101, 105 are answered
        // 0, 1, 2 (the reflector counts what it answers).
        assert_eq!(s.number(key(1, 7), 100, t0), Numbered::Own(0));
        assert_eq!(s.number(key(1, 7), 101, t0), Numbered::Own(1));
        assert_eq!(s.number(key(1, 7), 105, t0), Numbered::Own(2));
        // Another SSID from the same socket, another port: new sessions.
        assert_eq!(s.number(key(1, 8), 0, t0), Numbered::Own(0));
        assert_eq!(s.number(key(2, 7), 0, t0), Numbered::Own(0));
        assert_eq!(s.number(key(1, 7), 106, t0), Numbered::Own(3));
        // ::ffff:192.0.2.1 is the same source.
        let mapped: SocketAddr = "[::ffff:192.0.2.1]:1".parse().unwrap();
        assert_eq!(
            s.number(SessionKey::new(mapped, 7), 107, t0),
            Numbered::Own(4)
        );
        assert_eq!((s.len(), s.peak, s.started), (3, 3, 3));
    }

    #[test]
    fn when_full_a_new_session_is_echoed_for_its_whole_life() {
        let t0 = Instant::now();
        let mut s = Sessions::new(2, MINUTE, t0);
        s.number(key(1, 1), 0, t0);
        s.number(key(2, 1), 0, t0);
        assert_eq!(s.number(key(3, 1), 40, t0), Numbered::Echoed(40));
        // Session 1 goes idle and is forgotten: a slot frees, but
        // session 3 keeps being echoed (no change of numbering mid-test).
        let t1 = t0 + Duration::from_secs(30);
        s.number(key(2, 1), 1, t1);
        s.number(key(3, 1), 41, t1);
        let t2 = t0 + Duration::from_secs(61);
        s.expire(t2);
        assert_eq!(s.len(), 1);
        assert_eq!(s.expired, 1);
        assert_eq!(s.number(key(3, 1), 42, t2), Numbered::Echoed(42));
        // A newcomer gets the slot and its own count.
        assert_eq!(s.number(key(4, 1), 9, t2), Numbered::Own(0));
        assert_eq!(s.started, 4);
        // Session 3 idle for two timeouts: its mark is gone too.
        s.expire(t2 + MINUTE);
        s.expire(t2 + 2 * MINUTE);
        assert_eq!(s.len(), 0);
        assert_eq!(s.number(key(3, 1), 43, t2 + 2 * MINUTE), Numbered::Own(0));
    }

    #[test]
    fn a_session_that_comes_back_after_its_timeout_starts_again() {
        let t0 = Instant::now();
        let mut s = Sessions::new(4, MINUTE, t0);
        s.number(key(1, 1), 0, t0);
        s.number(key(1, 1), 1, t0);
        s.expire(t0 + MINUTE);
        assert_eq!(s.number(key(1, 1), 2, t0 + MINUTE), Numbered::Own(0));
    }

    #[test]
    fn a_flood_of_sessions_holds_no_more_than_the_table() {
        let t0 = Instant::now();
        let mut s = Sessions::new(100, MINUTE, t0);
        let mut own = 0;
        for port in 0..10_000u16 {
            if let Numbered::Own(_) = s.number(key(port, 1), 0, t0) {
                own += 1;
            }
        }
        assert_eq!((own, s.len(), s.peak), (100, 100, 100));
        assert!(s.table.capacity() < 1000, "the table did not grow");
    }
}
