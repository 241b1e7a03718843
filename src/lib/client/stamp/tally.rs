//! What a STAMP sender's samples add up to: round-trip percentiles, loss,
//! and loss split by direction from a stateful reflector's numbers. Pure:
//! fed samples and a count of packets sent.
//!
//! How the split works (RFC 8762 §4: a stateful reflector numbers its
//! answers per session from 0). Of the answers received, take the highest
//! sender number `s` and the highest reflector number `r`. Of our packets
//! up to `s`, the reflector answered `r + 1`: the rest were lost on the way
//! there (forward). Of its `r + 1` answers, those we did not receive were
//! lost on the way back. Packets sent after `s` whose answers never came
//! cannot be placed: no later answer says whether the reflector saw them.
//!
//! A stateless reflector echoes our numbers, so its answers say nothing
//! of direction; and a stateful one whose answers were lost only on the
//! way back echoes them too, by coincidence. So the split is made when
//! an answer proves the reflector keeps its own numbers (one differs from
//! ours), when the user says it does (`--stamp-stateful`), or when there
//! is nothing to place; otherwise it is left unknown.

use super::session::Sample;
use crate::stats::histogram::Latencies;
use serde::Serialize;
use std::time::Duration;

/// Five figures of a distribution, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

fn percentiles(l: &Latencies) -> Option<Percentiles> {
    let at = |q| l.quantile(q).map(|d: Duration| d.as_secs_f64() * 1e3);
    Some(Percentiles {
        min: at(0.0)?,
        p50: at(0.5)?,
        p90: at(0.9)?,
        p99: at(0.99)?,
        max: at(1.0)?,
    })
}

/// Loss by direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LossSplit {
    /// Lost on the way to the reflector.
    pub forward: u64,
    /// Lost on the way back.
    pub backward: u64,
    /// Sent after the last packet answered, and never answered: the
    /// direction is unknown.
    pub after_last_answer: u64,
}

/// How the reflector numbered its answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Numbering {
    /// At least one answer carried a number other than ours: the
    /// reflector keeps its own (stateful).
    Own,
    /// Every answer carried our number back: a stateless reflector, or a
    /// stateful one that lost nothing on the way there.
    Echoed,
}

/// What the samples added up to.
#[derive(Debug, Default)]
pub struct Tally {
    pub answered: u64,
    rtt: Latencies,
    network: Latencies,
    forward: Latencies,
    backward: Latencies,
    highest_sender: Option<u32>,
    highest_reflector: Option<u32>,
    numbers_differ: bool,
    pub zero_ssid: u64,
    pub invalid_error_estimates: u64,
    /// The last answer's.
    pub last_ttl: Option<u8>,
    pub last_reflector_error: Option<crate::stamp::ErrorEstimate>,
}

impl Tally {
    pub fn add(&mut self, s: &Sample) {
        self.answered += 1;
        let ns = Duration::from_nanos;
        self.rtt.record(ns(s.rtt_ns));
        if let Some(held) = s.reflector_ns {
            self.network.record(ns(s.rtt_ns - held));
        }
        // A one-way delay below 0 (clocks off by more than it) counts as 0.
        if let Some(f) = s.forward_ns {
            self.forward.record(ns(f.max(0) as u64));
        }
        if let Some(b) = s.backward_ns {
            self.backward.record(ns(b.max(0) as u64));
        }
        self.highest_sender = self.highest_sender.max(Some(s.sender_seq));
        self.highest_reflector = self.highest_reflector.max(Some(s.reflector_seq));
        self.numbers_differ |= s.sender_seq != s.reflector_seq;
        self.zero_ssid += u64::from(s.zero_ssid);
        self.invalid_error_estimates += u64::from(!s.reflector_error.is_valid());
        self.last_ttl = Some(s.ttl);
        self.last_reflector_error = Some(s.reflector_error);
    }

    /// T4 − T1 of every answer.
    pub fn rtt(&self) -> Option<Percentiles> {
        percentiles(&self.rtt)
    }

    /// The same less the time the reflector held each packet (T3 − T2).
    pub fn network_rtt(&self) -> Option<Percentiles> {
        percentiles(&self.network)
    }

    /// T2 − T1 and T4 − T3, when both clocks said synchronised.
    pub fn one_way(&self) -> Option<(Percentiles, Percentiles)> {
        Some((percentiles(&self.forward)?, percentiles(&self.backward)?))
    }

    pub fn numbering(&self) -> Option<Numbering> {
        match (self.answered, self.numbers_differ) {
            (0, _) => None,
            (_, true) => Some(Numbering::Own),
            (_, false) => Some(Numbering::Echoed),
        }
    }

    pub fn last_reflector_seq(&self) -> Option<u32> {
        self.highest_reflector
    }

    /// The loss of `sent` packets split by direction, with what the split
    /// rests on; None with the reason when it cannot be made.
    pub fn split(
        &self,
        sent: u64,
        stateful: bool,
    ) -> Result<(LossSplit, &'static str), &'static str> {
        let (Some(s), Some(r)) = (self.highest_sender, self.highest_reflector) else {
            return Err("no answer came back");
        };
        let up_to_s = u64::from(s) + 1;
        let lost_placed = up_to_s.saturating_sub(self.answered);
        let after_last_answer = sent.saturating_sub(up_to_s);
        let basis = if self.numbers_differ {
            "the reflector's own numbers"
        } else if stateful {
            "--stamp-stateful"
        } else if lost_placed == 0 {
            "nothing lost before the last answer"
        } else {
            return Err("the reflector echoed our numbers: stateless, or stateful with loss only on the way back (--stamp-stateful says which)");
        };
        let forward = lost_placed.min(up_to_s.saturating_sub(u64::from(r) + 1));
        Ok((
            LossSplit {
                forward,
                backward: lost_placed - forward,
                after_last_answer,
            },
            basis,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stamp::ErrorEstimate;

    fn sample(sender_seq: u32, reflector_seq: u32, rtt_us: u64) -> Sample {
        Sample {
            sender_seq,
            reflector_seq,
            rtt_ns: rtt_us * 1000,
            reflector_ns: Some(10_000),
            forward_ns: None,
            backward_ns: None,
            ttl: 64,
            reflector_error: ErrorEstimate::from_bits(1),
            zero_ssid: false,
        }
    }

    /// 20 packets; the reflector saw all but 3 and 7 (forward), its
    /// answers to 10 and 12 were lost (backward), and nothing after 17
    /// came back.
    #[test]
    fn a_stateful_reflectors_numbers_place_each_loss() {
        let mut t = Tally::default();
        let mut own = 0;
        for s in 0..20u32 {
            if s == 3 || s == 7 {
                continue;
            }
            if s <= 17 && s != 10 && s != 12 {
                t.add(&sample(s, own, 100));
            }
            own += 1;
        }
        let (split, basis) = t.split(20, false).unwrap();
        assert_eq!(
            split,
            LossSplit {
                forward: 2,
                backward: 2,
                after_last_answer: 2
            }
        );
        assert_eq!(basis, "the reflector's own numbers");
        assert_eq!(t.numbering(), Some(Numbering::Own));
        assert_eq!(t.answered, 14);
        // Every loss is placed or said to be unplaceable.
        assert_eq!(
            split.forward + split.backward + split.after_last_answer,
            20 - 14
        );
    }

    #[test]
    fn echoed_numbers_split_only_when_told_or_when_nothing_is_lost() {
        let mut t = Tally::default();
        for s in [0u32, 1, 2, 4] {
            t.add(&sample(s, s, 100));
        }
        assert_eq!(t.numbering(), Some(Numbering::Echoed));
        assert!(t.split(5, false).is_err(), "3 is lost, which way unknown");
        let (split, basis) = t.split(5, true).unwrap();
        assert_eq!((split.forward, split.backward), (0, 1));
        assert_eq!(basis, "--stamp-stateful");
        let mut clean = Tally::default();
        for s in 0..5u32 {
            clean.add(&sample(s, s, 100));
        }
        let (split, _) = clean.split(6, false).unwrap();
        assert_eq!(
            (split.forward, split.backward, split.after_last_answer),
            (0, 0, 1)
        );
        assert!(Tally::default().split(3, true).is_err(), "no answers");
    }

    #[test]
    fn reordered_answers_never_make_a_negative_split() {
        // The reflector saw 1 before 0: answers (1, 0) and (0, 1).
        let mut t = Tally::default();
        t.add(&sample(1, 0, 100));
        t.add(&sample(0, 1, 100));
        let (split, _) = t.split(2, false).unwrap();
        assert_eq!(
            (split.forward, split.backward, split.after_last_answer),
            (0, 0, 0)
        );
    }

    #[test]
    fn percentiles_come_from_every_answer() {
        let mut t = Tally::default();
        for us in 1..=100u64 {
            t.add(&sample(us as u32, us as u32, us * 100));
        }
        let p = t.rtt().unwrap();
        let close = |got: f64, want: f64| (got - want).abs() <= want * 0.002;
        assert!(close(p.min, 0.1) && close(p.max, 10.0), "{p:?}");
        assert!(
            close(p.p50, 5.0) && close(p.p90, 9.0) && close(p.p99, 9.9),
            "{p:?}"
        );
        // Less the reflector's 10 µs each.
        let n = t.network_rtt().unwrap();
        assert!(close(n.min, 0.09), "{n:?}");
        assert_eq!(t.one_way(), None);
        assert_eq!(Tally::default().rtt(), None);
    }
}
