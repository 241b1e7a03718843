//! Text and JSON views of what the server and client measured. Nothing here
//! measures anything; it only formats the structs the roles return.
//!
//! The format is chosen once, from the flags ([`Format`]); every report
//! knows how it looks in each ([`Shown`]), so no view asks "JSON or
//! text?" at every line. JSON is always one valid object per line on
//! stdout (NDJSON); errors go to stderr. Every number is finite: a rate
//! that cannot be known (a span under 1 ms) is null.
//!
//! By role: [`server`] (udp_server's events and last words), [`client`]
//! (an upload's report and its sender-side intervals), [`duplex`] (`-R`
//! and `--bidir`); the phrases they share are here.

pub mod client;
pub mod duplex;
pub mod server;

use crate::client::latency::{ms, Latency};
use crate::meter::account::PeerReport;
use crate::stats::delay::Spread;
use crate::stats::{CpuCost, KernelDrops, LossSplit};
use crate::wire::Direction;
use serde::Serialize;
use serde_json::Value;

pub use super::Format;

/// Something a binary prints: as text, or as one JSON line.
pub trait Shown {
    fn text(&self) -> String;
    fn json(&self) -> String;
}

impl Format {
    /// `item` as this format shows it.
    pub fn show(self, item: &dyn Shown) -> String {
        match self {
            Format::Text => item.text(),
            Format::Json => item.json(),
        }
    }
}

/// One NDJSON line: `{"event": name, ...fields}`.
pub fn json_event(event: &str, fields: &impl Serialize) -> String {
    let mut value = serde_json::to_value(fields).unwrap_or(Value::Null);
    let mut line = serde_json::Map::new();
    line.insert("event".into(), Value::String(event.into()));
    if let Value::Object(map) = &mut value {
        line.append(map);
    }
    Value::Object(line).to_string()
}

pub(super) fn peer_label(r: &PeerReport) -> String {
    match &r.session {
        Some(s) => format!("{} session {s}", r.peer),
        None => format!("{} (untagged)", r.peer),
    }
}

/// A rate with three decimals, or "unknown" when the span was too short.
pub(super) fn rate(gbps: Option<f64>) -> String {
    gbps.map_or_else(|| "rate unknown".to_string(), crate::units::gbps_text)
}

/// `= 1.234 Gbit/s`, or why there is no rate.
pub(super) fn rate_phrase(gbps: Option<f64>) -> String {
    match gbps {
        Some(g) => format!("= {}", crate::units::gbps_text(g)),
        None => format!(
            "(rate unknown: under {} ms)",
            crate::stats::MIN_RATE_SPAN.as_millis()
        ),
    }
}

/// `0.140 s (0.010 user + 0.130 sys) = 7.0% of a core, 2.80 CPU-s/GB`.
pub(super) fn cpu_text(c: &CpuCost) -> String {
    let split = match (c.user_seconds, c.system_seconds) {
        (Some(u), Some(s)) => format!(" ({u:.3} user + {s:.3} sys)"),
        _ => String::new(),
    };
    let core = c
        .percent_of_core
        .map_or_else(String::new, |p| format!(" = {p:.1}% of a core"));
    let per_gb = c
        .seconds_per_gb
        .map_or_else(String::new, |g| format!(", {g:.2} CPU-s/GB"));
    let shared = c.shared.map_or_else(String::new, |s| {
        format!(
            " (its share by datagrams, {:.1} %, of {:.3} s shared with {})",
            s.share * 100.0,
            s.whole_seconds,
            plural(s.other_peers, "other peer", "other peers")
        )
    });
    format!("{:.3} s{split}{core}{per_gb}{shared}", c.seconds)
}

/// An interval's time range, `start-end` in seconds (milliseconds where
/// hundredths would print `0.00-0.00`), one format for every line: the
/// client's, the server's peers' and its totals.
pub fn time_range(start: f64, end: f64) -> String {
    if end - start < 0.05 {
        format!("{start:.3}-{end:.3}")
    } else {
        format!("{start:.2}-{end:.2}")
    }
}

/// What an interval line counts: its time range (its length, where its
/// start is unknown), packets, bytes, rate and packets per second, in
/// aligned columns (`  0.00-1.00 s      71429 pkts ...`).
pub(super) fn interval_counts(r: &PeerReport) -> String {
    let span = r.start_seconds.map_or_else(
        || format!("{:.2}", r.seconds),
        |start| time_range(start, start + r.seconds),
    );
    format!(
        "{span:>13} s {:>10} pkts {:>11} {:>13} {:>9} pps",
        r.packets,
        crate::units::HumanBytes(r.bytes).to_string(),
        rate(r.gbps),
        r.pps
            .map_or_else(|| "unknown".to_string(), |p| format!("{p:.0}")),
    )
}

/// `1 peer`, `2 peers`.
pub fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// An interval's queue delay, for the end of its line.
pub(super) fn queue_suffix(q: Option<&Spread>) -> String {
    q.map_or_else(String::new, |s| {
        format!(" queue p50 {} p99 {}", ms(s.p50), ms(s.p99))
    })
}

/// A fall of the queue delay's floor during the run, in words (nothing
/// when it did not fall).
pub(super) fn baseline_drop_text(drop_ms: Option<f64>) -> String {
    drop_ms.map_or_else(String::new, |d| {
        format!(
            " (the floor fell {} after the first 0.25 s: datagrams before were measured from the higher one)",
            ms(d)
        )
    })
}

/// A spread of delays in words.
pub(super) fn spread_text(s: &Spread) -> String {
    format!(
        "p50 {}, p90 {}, p99 {}, max {}",
        ms(s.p50),
        ms(s.p90),
        ms(s.p99),
        ms(s.max)
    )
}

/// A direction's delay under load: the probes' round trips and the data's
/// queue delay, one line each (`label` starts each line); nothing unknown
/// is shown.
pub(super) fn latency_lines(l: &Latency, label: &str) -> String {
    let mut out = String::new();
    if l.probes_sent > 0 || l.idle_rtt_ms.is_some() {
        let idle = l
            .idle_rtt_ms
            .map_or_else(|| "unknown idle".into(), |i| format!("{} idle", ms(i)));
        let loaded = match l.loaded_rtt_ms {
            Some(s) => format!(
                "{} under load (p90 {}, p99 {}{})",
                ms(s.p50),
                ms(s.p90),
                ms(s.p99),
                l.rpm.map_or_else(String::new, |r| format!("; {r:.0} RPM"))
            ),
            None => "unknown under load".into(),
        };
        let to = l
            .stamp_reflector
            .map_or_else(String::new, |r| format!(" (STAMP, to {r})"));
        out += &format!(
            "\n{label}rtt       {idle}, {loaded}; {} of {} probes lost{to}",
            l.probes_lost, l.probes_sent
        );
    }
    if let Some(q) = &l.queue_delay_ms {
        let when = match l.arrival_times {
            Some("kernel") => "arrival times: the kernel's receive timestamps",
            _ => "arrival times: when read (no kernel timestamps)",
        };
        out += &format!(
            "\n{label}queue     {} over {} datagrams ({when})",
            spread_text(q),
            l.delay_samples
        );
        out += &baseline_drop_text(l.queue_baseline_drop_ms);
        if l.drift_bound_ms >= 0.05 {
            out += &format!(
                " (clock drift {:+.1} ppm: each within {})",
                l.clock_skew_ppm.unwrap_or(0.0),
                ms(l.drift_bound_ms)
            );
        }
    }
    out
}

/// Loss as a number, or as a range when some arrivals were uncertain.
pub(super) fn lost_text(lost: u64, fewest: Option<u64>) -> String {
    match fewest {
        Some(f) => format!("{f} to {lost}"),
        None => lost.to_string(),
    }
}

/// Kernel drops in datagrams and the loss split, in words: `58834
/// datagrams (estimate: 1279 buffers × 46.0 datagrams per buffer
/// received); of the loss, 58834 in the socket and 0 before it`.
pub(super) fn drops_in_datagrams(drops: &KernelDrops, split: &LossSplit) -> Option<String> {
    let mut out = match (
        drops.kernel_drops_datagrams,
        drops.kernel_drops_basis.as_deref(),
    ) {
        // Nothing dropped needs no estimate ("about 0 … 0 buffers × …").
        (Some(0), _) => String::new(),
        (Some(d), Some("counted")) => format!("{d} datagrams dropped (counted)"),
        (Some(d), Some(basis)) => format!("about {d} datagrams dropped ({basis})"),
        _ => String::new(),
    };
    match (
        split.lost_in_socket,
        split.lost_before_socket,
        split.loss_split.as_deref(),
    ) {
        (Some(inside), Some(before), Some(how)) => {
            if !out.is_empty() {
                out += "; ";
            }
            out += &format!(
                "of the loss, {inside} in the receive socket and {before} before it ({how})"
            );
        }
        (_, _, Some(why)) => {
            if !out.is_empty() {
                out += "; ";
            }
            out += &format!(
                "the loss {}",
                why.replace("cannot split", "cannot be split")
            );
        }
        _ => {}
    }
    (!out.is_empty()).then_some(out)
}

/// `[C->S]` or `[S->C]`: which way a line's data flowed.
pub fn direction_label(d: Direction) -> &'static str {
    match d {
        Direction::ClientToServer => "[C->S]",
        Direction::ServerToClient => "[S->C]",
    }
}
