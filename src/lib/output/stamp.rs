//! STAMP's views: the sender's report (`udp_client --stamp-reflector`)
//! and the reflector's lines (`udp_server --stamp`), each as text and as
//! JSON, the format chosen once ([`super::Format`], [`Shown`]).

use super::report::{json_event, plural, Shown};
use crate::client::stamp::tally::{Numbering, Percentiles};
use crate::client::stamp::StampReport;
use crate::server::stamp::{ReflectorReport, StampListener};
use crate::stamp::Clock;
use serde_json::json;

/// A delay in ms as people read it: µs below a millisecond.
fn delay(ms: f64) -> String {
    if ms < 1.0 {
        format!("{:.0} us", ms * 1e3)
    } else if ms < 100.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

fn spread(p: &Percentiles) -> String {
    format!(
        "min {}, p50 {}, p90 {}, p99 {}, max {}",
        delay(p.min),
        delay(p.p50),
        delay(p.p90),
        delay(p.p99),
        delay(p.max)
    )
}

/// A clock's claim, in words.
fn clock(c: &Clock) -> String {
    let sync = if c.synchronized {
        "synchronised"
    } else {
        "not synchronised"
    };
    if !c.valid {
        return format!("{sync}, error estimate invalid (multiplier 0)");
    }
    let error = if c.error_ms >= 1000.0 {
        format!("{:.0} s", c.error_ms / 1e3)
    } else if c.error_ms >= 1e-3 {
        delay(c.error_ms)
    } else {
        format!("{:.2} ns", c.error_ms * 1e6)
    };
    format!("{sync}, error up to {error} ({})", c.format)
}

impl Shown for StampReport {
    fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".into())
    }

    fn text(&self) -> String {
        let r = self;
        let mut out = format!(
            "STAMP to {}, SSID {}, {}-byte test packets every {}: {} sent, {} answered, {} lost ({}) in {:.2} s",
            r.reflector,
            r.ssid,
            r.size,
            delay(r.interval_ms),
            r.sent,
            r.answered,
            r.lost,
            r.loss_percent
                .map_or_else(|| "n/a".into(), |p| format!("{p:.2}%")),
            r.seconds
        );
        if let Some(i) = &r.interrupted {
            out = format!("{}\n{out}", i.note());
        }
        match &r.rtt_ms {
            Some(p) => out += &format!("\nrtt          {}", spread(p)),
            None => out += "\nrtt          unknown: no answer came back",
        }
        if let Some(p) = &r.network_rtt_ms {
            out += &format!("\nnetwork rtt  {} (less the reflector's time)", spread(p));
        }
        out += &match &r.loss_split {
            Some(s) => format!(
                "\nloss         {} on the way there, {} on the way back, {} after the last answer ({})",
                s.forward, s.backward, s.after_last_answer, r.loss_split_basis
            ),
            None => format!("\nloss         not split by direction: {}", r.loss_split_basis),
        };
        match &r.one_way {
            Some(w) => {
                out += &format!("\none-way      there {}", spread(&w.forward_ms));
                out += &format!("\n             back  {}", spread(&w.backward_ms));
            }
            None if r.answered > 0 => {
                out += "\none-way      not shown: both clocks must say they are synchronised (--stamp-synchronized here; the S bit there)"
            }
            None => {}
        }
        out += &format!("\nclocks       ours {}", clock(&r.clock));
        if let Some(c) = &r.reflector_clock {
            out += &format!("; the reflector's {}", clock(c));
        }
        if let Some(n) = r.reflector_numbering {
            let how = match n {
                Numbering::Own => "numbers its answers itself (stateful)",
                Numbering::Echoed => "echoed our numbers",
            };
            let last = r
                .last_reflector_seq
                .map_or_else(String::new, |s| format!(", the last {s}"));
            let ttl = r.ttl_at_reflector.map_or_else(String::new, |t| {
                format!("; our packets reached it with TTL {t}")
            });
            out += &format!("\nreflector    {how}{last}{ttl}");
        }
        let mut notes = Vec::new();
        if r.zero_ssid_answers > 0 {
            notes.push(format!(
                "{} with SSID 0 (the reflector does not know RFC 8972)",
                plural(r.zero_ssid_answers, "answer", "answers")
            ));
        }
        if r.invalid_error_estimates > 0 {
            notes.push(format!(
                "{} with an invalid error estimate (multiplier 0)",
                plural(r.invalid_error_estimates, "answer", "answers")
            ));
        }
        let s = &r.stray;
        let stray = s.malformed + s.other_session + s.unknown + s.duplicate;
        if stray > 0 {
            notes.push(format!(
                "{} matched no test packet ({} too short, {} of another session, {} unknown, {} duplicate)",
                plural(stray, "answer", "answers"),
                s.malformed,
                s.other_session,
                s.unknown,
                s.duplicate
            ));
        }
        if r.refused > 0 {
            notes.push(format!(
                "port unreachable {}: is a reflector listening on {}?",
                plural(r.refused, "time", "times"),
                r.reflector
            ));
        }
        for note in notes {
            out += &format!("\nnote: {note}");
        }
        out
    }
}

/// The reflector's part of udp_server's listening line.
pub struct StampListening<'a>(pub &'a StampListener);

impl StampListening<'_> {
    /// The JSON object of the `listening` event's `stamp` key.
    pub fn value(&self) -> serde_json::Value {
        let l = self.0;
        json!({
            "addr": l.addr.to_string(),
            "recv_buffer": &l.buffer,
            "kernel_timestamps": l.kernel_timestamps,
            "ttl": l.ttl,
            "clock": Clock::of(l.error),
        })
    }

    /// The same in words, for the end of the listening line.
    pub fn phrase(&self) -> String {
        let l = self.0;
        let t2 = if l.kernel_timestamps {
            "kernel receive timestamps"
        } else {
            "receive times when read"
        };
        let ttl = if l.ttl { "TTL" } else { "no TTL (0 sent)" };
        format!(
            "; STAMP reflector on {} ({t2}, {ttl}, clock {})",
            l.addr,
            clock(&Clock::of(l.error))
        )
    }
}

fn counts_text(r: &ReflectorReport) -> String {
    let c = &r.counts;
    let u = &c.unanswered;
    let mut out = format!("{} received, {} answered", c.received, c.answered);
    if c.answered_stateless > 0 {
        out += &format!(
            " ({} statelessly: the session table was full)",
            c.answered_stateless
        );
    }
    let refused = u.over_source_budget + u.over_prefix_budget + u.over_total_budget;
    if u.too_short + refused + u.send_failed > 0 {
        out += &format!(
            "; not answered: {} too short, {} over a source's budget, {} over an address's or /64's, {} over the server's, {} not sent",
            u.too_short,
            u.over_source_budget,
            u.over_prefix_budget,
            u.over_total_budget,
            u.send_failed
        );
    }
    if let Some(d) = c.kernel_drops.filter(|&d| d > 0) {
        out += &format!("; {d} dropped by the kernel (receive buffer full)");
    }
    if c.malformed_tlvs > 0 {
        out += &format!("; {} with a malformed TLV", c.malformed_tlvs);
    }
    if c.invalid_error_estimates > 0 {
        out += &format!(
            "; {} with error estimate multiplier 0",
            c.invalid_error_estimates
        );
    }
    out
}

impl Shown for ReflectorReport {
    fn json(&self) -> String {
        json_event(
            if self.last {
                "stamp_done"
            } else {
                "stamp_interval"
            },
            self,
        )
    }

    fn text(&self) -> String {
        if !self.last {
            return format!(
                "[STAMP {}] {:6.2} s: {}; {}",
                self.addr,
                self.counts.seconds,
                counts_text(self),
                plural(self.sessions, "session", "sessions")
            );
        }
        let cpu = match (self.cpu_seconds, self.cpu_seconds_per_million) {
            (Some(c), Some(m)) => format!("; cpu {c:.3} s, {m:.2} s per million answers"),
            (Some(c), None) => format!("; cpu {c:.3} s"),
            _ => String::new(),
        };
        format!(
            "[STAMP {}] done after {:.2} s: {}; sessions {} now, {} at most, {} begun, {} forgotten idle{cpu}",
            self.addr,
            self.counts.seconds,
            counts_text(self),
            self.sessions,
            self.sessions_peak,
            self.sessions_started,
            self.sessions_expired
        )
    }
}
