//! udp_server's lines: the listening line, every event as it comes
//! (interval, total, a peer's summary, a reverse stream's), and its last
//! words.

use super::{
    cpu_text, direction_label, drops_in_datagrams, interval_counts, json_event, lost_text,
    peer_label, plural, queue_suffix, rate, rate_phrase, spread_text, Shown,
};
use crate::config::ServerConfig;
use crate::meter::account::{ConflictReport, DoneReason, LateReport, PeerReport, VersionReport};
use crate::meter::receiver::Bound;
use crate::output::iperf3::server::ServerTest;
use crate::server::reverse::{StreamEnd, StreamInterval, StreamReport};
use crate::server::total::TotalReport;
use crate::server::{ServerEvent, ServerSummary};
use crate::stats::RateSpan;
use crate::units::HumanBytes;
use serde_json::json;
use std::io::Write;
use std::time::Duration;

/// How udp_server writes what happens, chosen once from the flags: each
/// line as it comes, as text or NDJSON; or (`--iperf3-json`) one iperf3
/// document of the test when it stops, with the listening line on stderr
/// so that a port 0 can still be read.
pub enum ServerOutput {
    Lines(super::Format),
    Iperf3(Box<ServerTest>),
}

impl ServerOutput {
    /// `--json`, `--iperf3-json` (with its `--interval`) as given.
    pub fn from_flags(json: bool, iperf3_json: bool, interval: Option<Duration>) -> ServerOutput {
        if iperf3_json {
            ServerOutput::Iperf3(Box::new(ServerTest::new(interval)))
        } else {
            ServerOutput::Lines(super::Format::from_flags(json))
        }
    }

    /// The listening line.
    pub fn listening(&mut self, out: &mut dyn Write, line: &Listening) {
        match self {
            ServerOutput::Lines(format) => {
                let _ = writeln!(out, "{}", format.show(line));
                let _ = out.flush();
            }
            ServerOutput::Iperf3(test) => {
                test.listening_on(line.bound.addr);
                eprintln!("{}", line.text());
            }
        }
    }

    /// One event as it happens.
    pub fn event(&mut self, out: &mut dyn Write, event: ServerEvent) {
        match self {
            ServerOutput::Lines(super::Format::Text) if matches!(&event, ServerEvent::Total(t) if t.says_nothing()) =>
                {}
            ServerOutput::Lines(format) => {
                let _ = writeln!(out, "{}", format.show(&event));
                let _ = out.flush();
            }
            ServerOutput::Iperf3(test) => test.observe(&event),
        }
    }

    /// The server's last words: its summary, or the iperf3 document; the
    /// exit code they ask for.
    pub fn last(&self, out: &mut dyn Write, summary: &ServerSummary) -> i32 {
        let (text, code) = match self {
            ServerOutput::Lines(format) => (format.show(summary), 0),
            ServerOutput::Iperf3(test) => (test.document().to_string(), test.exit_code()),
        };
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
        code
    }

    /// A line from beside the server (the `--stamp` reflector's reports):
    /// on stdout with the others, or on stderr while stdout is kept for
    /// the iperf3 document.
    pub fn aside(&self, out: &mut dyn Write, item: &dyn Shown) {
        match self {
            ServerOutput::Lines(format) => {
                let _ = writeln!(out, "{}", format.show(item));
                let _ = out.flush();
            }
            ServerOutput::Iperf3(_) => eprintln!("{}", item.text()),
        }
    }

    /// The server failed: the iperf3 error document (the one-line error
    /// goes to stderr, as always).
    pub fn failed(&self, out: &mut dyn Write, message: &str) {
        if let ServerOutput::Iperf3(test) = self {
            let _ = writeln!(out, "{}", test.failed(message));
            let _ = out.flush();
        }
    }
}

/// The `listening` event, naming the `--metrics` endpoint when it serves.
pub struct Listening<'a> {
    pub bound: &'a Bound,
    pub cfg: &'a ServerConfig,
    pub metrics: Option<std::net::SocketAddr>,
    /// `--stamp`: the STAMP reflector's socket.
    pub stamp: Option<&'a crate::server::stamp::StampListener>,
}

impl Shown for Listening<'_> {
    fn json(&self) -> String {
        let Listening {
            bound,
            cfg,
            metrics,
            stamp,
        } = *self;
        let mut line = json!({
            "event": "listening",
            "addr": bound.addr.to_string(),
            "recv_buffer": &bound.buffer,
            "method": cfg.method.name(),
            "threads": bound.sockets.len(),
            "gro": bound.gro,
        });
        if let Some(m) = metrics {
            line["metrics"] = json!(m.to_string());
        }
        if let Some(s) = stamp {
            line["stamp"] = crate::output::stamp::StampListening(s).value();
        }
        line.to_string()
    }

    fn text(&self) -> String {
        let Listening {
            bound,
            cfg,
            metrics,
            stamp,
        } = *self;
        let addr = bound.addr;
        let buffer = &bound.buffer;
        let mut metrics = metrics.map_or_else(String::new, |m| {
            format!("; metrics at http://{m}{}", crate::output::metrics::PATH)
        });
        if let Some(s) = stamp {
            metrics += &crate::output::stamp::StampListening(s).phrase();
        }
        let dual = if addr.is_ipv6() && addr.ip().is_unspecified() {
            " (IPv4 and IPv6)"
        } else {
            ""
        };
        let forced = if buffer.forced {
            ", forced past the sysctl limit"
        } else {
            ""
        };
        // Linux doubles a request (half is for its own bookkeeping) and
        // getsockopt reports the double: say so, or 16M reads as 32000000.
        let doubled = match buffer.requested {
            Some(asked) if buffer.granted == 2 * asked => {
                " (Linux doubles the request: half is kernel bookkeeping)"
            }
            _ => "",
        };
        let gro = match (&bound.gro, &bound.gro_note) {
            (true, _) => "gro: on".to_string(),
            (false, Some(note)) => format!("gro: off ({note})"),
            (false, None) => "gro: off".to_string(),
        };
        format!(
        "udp_server listening on {addr}{dual}; receive buffer {} bytes granted{doubled}{forced}; method {}, {} thread{}, {gro}{metrics}",
        buffer.granted,
        cfg.method.name(),
        bound.sockets.len(),
        if bound.sockets.len() == 1 { "" } else { "s" },
    )
    }
}

impl Shown for ServerEvent {
    fn text(&self) -> String {
        match self {
            ServerEvent::Interval(r) => interval_line(r),
            ServerEvent::PeerDone(r) => peer_done_text(r),
            ServerEvent::Late(r) => late_line(r),
            ServerEvent::Conflict(r) => conflict_line(r),
            ServerEvent::StreamDone(r) => stream_done_text(r),
            ServerEvent::StreamInterval(i) => stream_interval_line(i),
            ServerEvent::Total(t) => total_line(t),
            ServerEvent::WrongVersion(r) => wrong_version_line(r),
        }
    }

    fn json(&self) -> String {
        match self {
            ServerEvent::Interval(r) => json_event("interval", r),
            ServerEvent::PeerDone(r) => json_event("peer_done", r),
            ServerEvent::Late(r) => json_event("late", r),
            ServerEvent::Conflict(r) => json_event("conflict", r),
            ServerEvent::StreamDone(r) => json_event("stream_done", r),
            ServerEvent::StreamInterval(i) => json_event("interval", i),
            ServerEvent::Total(t) => json_event("total", t),
            ServerEvent::WrongVersion(r) => json_event("wrong_version", r),
        }
    }
}

/// A source that spoke another version of the protocol.
fn wrong_version_line(r: &VersionReport) -> String {
    let list = |v: &[u8]| v.iter().map(u8::to_string).collect::<Vec<_>>().join(", ");
    format!(
        "peer {}: {} of wire version {} (this udp_server speaks {}): a netspeed of another release; each was answered with the versions spoken, so its side can say so",
        r.peer,
        plural(r.datagrams, "datagram", "datagrams"),
        list(&r.versions),
        list(&r.speaks),
    )
}

/// A receiver's interval line (the server's, or `udp_client --local`'s
/// in-process server's).
pub struct Interval<'a>(pub &'a PeerReport);

impl Shown for Interval<'_> {
    fn text(&self) -> String {
        interval_line(self.0)
    }

    fn json(&self) -> String {
        json_event("interval", self.0)
    }
}

/// One interval line.
fn interval_line(r: &PeerReport) -> String {
    let cpu = r
        .cpu
        .and_then(|c| c.percent_of_core)
        .map_or_else(String::new, |p| format!(" cpu {p:5.1}%"));
    format!(
        "[{}] {}{cpu}{}",
        peer_label(r),
        interval_counts(r),
        queue_suffix(r.queue_delay_ms.as_ref()),
    )
}

/// The server's `total` line: the socket(s) as a whole over an interval,
/// or to the end of a burst.
fn total_line(t: &TotalReport) -> String {
    let drops = match (
        t.kernel_drops,
        t.kernel_drops_unit,
        t.kernel_drops_datagrams,
    ) {
        (Some(0), _, _) => ", no drops".to_string(),
        (Some(b), Some("buffers"), Some(d)) => {
            format!(", dropped {b} GRO buffers (about {d} datagrams)")
        }
        (Some(d), _, _) => format!(", dropped {d} datagrams"),
        _ => String::new(),
    };
    let buffer = match t.recv_buffer_peak_bytes {
        Some(peak) => format!(
            ", buffer peak {} of {}",
            HumanBytes(peak),
            HumanBytes(t.recv_buffer_bytes)
        ),
        None => String::new(),
    };
    let cpu = t
        .cpu
        .and_then(|c| c.percent_of_core)
        .map_or_else(String::new, |p| format!(", receive cpu {p:.1}%"));
    let span = super::time_range(t.start, t.end);
    format!(
        "[total] {span:>13} s {} active (+{} -{}) {:>10} pkts {:>11} {:>13} {:>9} pps{drops}{buffer}{cpu}{}",
        plural(t.peers_active, "peer", "peers"),
        t.peers_started,
        t.peers_finished,
        t.packets,
        HumanBytes(t.bytes).to_string(),
        rate(t.gbps),
        t.pps
            .map_or_else(|| "unknown".to_string(), |p| format!("{p:.0}")),
        if t.burst_end { " (burst ended)" } else { "" },
    ) + &not_proven_text(&t.not_proven, t.answers_limited)
}

/// What sessions never proven sent, by reason, when they sent anything:
/// `; not proven: 12000 Hellos, 300 probes; 15 answers refused`.
fn not_proven_text(n: &crate::meter::account::NotProven, limited: u64) -> String {
    let parts: Vec<String> = [
        (n.hellos, "Hello", "Hellos"),
        (n.ends_unknown, "End of no session", "Ends of no session"),
        (
            n.ends_unproven,
            "End of an unproven session",
            "Ends of unproven sessions",
        ),
        (
            n.unproven_packets,
            "datagram of unproven sessions",
            "datagrams of unproven sessions",
        ),
        (
            n.probes_unproven,
            "probe without its cookie",
            "probes without their cookie",
        ),
        (
            n.wrong_version,
            "datagram of another version",
            "datagrams of another version",
        ),
    ]
    .into_iter()
    .filter(|(count, _, _)| *count > 0)
    .map(|(count, one, many)| plural(count, one, many))
    .collect();
    let mut out = String::new();
    if !parts.is_empty() {
        out += &format!("; not proven: {}", parts.join(", "));
    }
    if limited > 0 {
        out += &format!(
            "; {} refused by the budgets",
            plural(limited, "answer", "answers")
        );
    }
    out
}

/// A peer's final summary.
fn peer_done_text(r: &PeerReport) -> String {
    let reason = match r.reason {
        Some(DoneReason::End) => "end of test",
        Some(DoneReason::Idle) => "idle",
        Some(DoneReason::Shutdown) => "server stopping",
        Some(DoneReason::Evicted) => "evicted: a session that began with a Hello needed its slot",
        None => "",
    };
    let rates = match (r.gbps, r.wire_gbps, r.pps) {
        (Some(g), Some(w), Some(p)) => {
            let over = match (r.rate_span, r.declared) {
                (RateSpan::Sender, Some(end)) => format!(
                    " (over the sender's {:.3} s: the datagrams arrived in a burst)",
                    end.duration_ns as f64 / 1e9
                ),
                _ => String::new(),
            };
            format!(
                "{} payload, {} on the wire (est.), {p:.0} pps{over}",
                crate::units::gbps_text(g),
                crate::units::gbps_text(w)
            )
        }
        _ => format!(
            "unknown: sent and received within {} ms, too short to time; send more (-t 1G or --duration 10s)",
            crate::stats::MIN_RATE_SPAN.as_millis()
        ),
    };
    let mut out = format!(
        "peer {} finished ({reason})\n  received  {}, {} in {:.3} s\n  rate      {rates}",
        peer_label(r),
        plural(r.packets, "packet", "packets"),
        HumanBytes(r.bytes),
        r.seconds,
    );
    if r.tagged {
        let sent = match r.sent_packets {
            Some(p) => format!("{p} packets declared by the sender"),
            None => "no end-of-test message: loss estimated from sequence numbers".into(),
        };
        out += &format!(
            "\n  sender    {sent}\n  loss      {} lost ({:.3}%), {} duplicates, {} reordered, jitter {:.3} ms",
            lost_text(r.lost.unwrap_or(0), r.lost_fewest),
            r.loss_percent.unwrap_or(0.0),
            r.duplicates.unwrap_or(0),
            r.reordered.unwrap_or(0),
            r.jitter_ms.unwrap_or(0.0)
        );
        if let Some(q) = &r.queue_delay_ms {
            out += &format!(
                "\n  queue     {}{}",
                spread_text(q),
                super::baseline_drop_text(r.queue_baseline_drop_ms)
            );
        }
        if r.uncertain > 0 {
            out += &format!(
                "\n  uncertain {} arrivals fell in holes too old to remember: loss is a range",
                r.uncertain
            );
        }
        if r.unexpected > 0 {
            out += &format!(
                "\n  unexpected {} datagrams with sequence numbers the sender never sent (forged, or another sender)",
                r.unexpected
            );
        }
    } else {
        out += "\n  loss      unknown: these datagrams carry no netspeed header";
    }
    if let (Some(d), Some(unit)) = (r.drops.socket_wide_kernel_drops, r.drops.kernel_drops_unit) {
        let whose = if r.drops.kernel_drops.is_some() {
            "this peer's, the only traffic on it"
        } else {
            "shared with other traffic on it"
        };
        out += &format!(
            "\n  kernel    {d} {unit} dropped on the server socket (receive buffer full) while this peer was active; {whose}"
        );
    }
    if let Some(text) = drops_in_datagrams(&r.drops, &r.split) {
        out += &format!("\n  drops     {text}");
    }
    if r.truncated > 0 {
        out += &format!(
            "\n  truncated {} buffers were cut short by the kernel (MSG_TRUNC)",
            r.truncated
        );
    }
    if let Some(c) = &r.cpu {
        // A share says so itself; a whole served this peer alone.
        let whose = if c.shared.is_some() {
            "receive threads"
        } else {
            "receive threads, no other peer meanwhile"
        };
        out += &format!("\n  cpu       {} ({whose})", cpu_text(c));
    }
    if let Some(why) = r.conflict {
        out += &format!(
            "\n  DISPUTED  {why}: a forged End, or a confused client; these figures cannot be trusted"
        );
    }
    out
}

/// One interval of a reverse stream the server is sending.
fn stream_interval_line(i: &StreamInterval) -> String {
    format!(
        "[{} session {}] {} {:>13} s sent {:>11} {:>13} (client has {} so far)",
        i.peer,
        i.session,
        direction_label(i.direction),
        super::time_range(i.start, i.end),
        HumanBytes(i.sent_bytes).to_string(),
        crate::units::gbps_text(i.gbps),
        HumanBytes(i.received_bytes),
    )
}

/// A reverse stream the server sent, finished.
fn stream_done_text(r: &StreamReport) -> String {
    let reason = match r.reason {
        StreamEnd::Answered => "end of test",
        StreamEnd::NoAnswer => "the client never answered its End",
        StreamEnd::Silent => "the client went silent: its feedback stopped, so did the stream",
        StreamEnd::NeverConfirmed => "the client never confirmed the start: nothing sent",
        StreamEnd::MaxDuration => "cut short at --max-duration",
        StreamEnd::Shutdown => "server stopping",
        StreamEnd::Failed => "a send failed",
        StreamEnd::CircuitBreaker => {
            "stopped by its circuit breaker: the client kept taking in under half of what was sent"
        }
    };
    let mut out = format!(
        "peer {} session {} [S->C] finished ({reason})\n  sent      {}, {} in {:.3} s {} ({})",
        r.peer,
        r.session,
        plural(r.sent_packets, "packet", "packets"),
        HumanBytes(r.sent_bytes),
        r.seconds,
        rate_phrase(r.gbps),
        r.send_path,
    );
    if let Some(c) = &r.received {
        out += &format!(
            "\n  client    received {}, {}; {} lost ({:.3}%), {} duplicates, {} reordered, jitter {:.3} ms",
            plural(c.packets, "packet", "packets"),
            HumanBytes(c.bytes),
            c.lost_packets,
            crate::stats::percent(c.lost_packets, r.sent_packets),
            c.duplicates,
            c.reordered,
            c.jitter_ms,
        );
        if let Some(d) = c.kernel_drops {
            out += &format!(" ; {d} dropped by the client's socket");
        }
    }
    if let Some(b) = &r.breaker {
        out +=
            &format!(
            "\n  breaker   the client took in {:.0}% of what was sent for {:.1} s: slowed {} to {}",
            b.intake_percent,
            crate::server::reverse::BREAKER_WINDOW.as_secs_f64()
                * f64::from(crate::server::reverse::BREAKER_WINDOWS),
            plural(u64::from(b.backoffs), "time", "times"),
            b.rate_bps
                .map_or_else(|| "unknown".into(), |r| crate::units::HumanRate(r).to_string()),
        );
    }
    if let Some(c) = &r.cpu {
        out += &format!("\n  cpu       {} (the sending thread)", cpu_text(c));
    }
    if let Some(e) = &r.error {
        out += &format!("\n  error     {e}");
    }
    out
}

/// A session whose End is contradicted.
fn conflict_line(r: &ConflictReport) -> String {
    let other = match (r.other_sent_packets, r.seq) {
        (Some(p), _) => format!("another End declared {p} packets"),
        (None, Some(seq)) => format!("datagram {seq} arrived after it"),
        (None, None) => String::new(),
    };
    format!(
        "peer {} session {}: DISPUTED: {}: its End declared {} packets, {other}",
        r.peer, r.session, r.conflict, r.sent_packets
    )
}

/// Datagrams for a session that had already finished.
fn late_line(r: &LateReport) -> String {
    format!(
        "peer {} session {}: {} ({}) arrived after the session had finished, the last {:.3} s after; not in its figures",
        r.peer,
        r.session,
        plural(r.late_packets, "datagram", "datagrams"),
        HumanBytes(r.late_bytes),
        r.seconds_after_end
    )
}

impl Shown for ServerSummary {
    fn text(&self) -> String {
        summary_text(self)
    }

    fn json(&self) -> String {
        json_event("shutdown", self)
    }
}

/// The server's last words.
fn summary_text(s: &ServerSummary) -> String {
    let t = &s.totals;
    let mut out = format!(
        "udp_server stopping: {}, {} from {}",
        plural(t.packets, "packet", "packets"),
        HumanBytes(t.bytes),
        plural(t.peers, "peer", "peers")
    );
    if t.overflow.packets > 0 {
        out += &format!(
            "; {} packets ({}) arrived while the peer table was full (--max-peers) and were counted in bulk",
            t.overflow.packets,
            HumanBytes(t.overflow.bytes)
        );
    }
    if t.late_packets > 0 {
        out += &format!(
            "; {} arrived for sessions already finished (late)",
            plural(t.late_packets, "packet", "packets")
        );
    }
    if t.truncated > 0 {
        out += &format!("; {} buffers cut short (MSG_TRUNC)", t.truncated);
    }
    if let Some(d) = s.kernel_drops {
        out += &format!("; kernel drops on the socket: {d}");
    }
    if let Some(c) = &s.cpu {
        out += &format!("; cpu {}", cpu_text(c));
    }
    out
}

#[cfg(test)]
mod tests {
    //! Golden lines: what a user reads, to the character. A change here is
    //! a change to the interface scripts and eyes rely on.
    use super::*;
    use crate::stats::delay::Spread;
    use crate::stats::{CpuCost, KernelDrops};

    fn peer(packets: u64, bytes: u64, seconds: f64) -> PeerReport {
        PeerReport {
            peer: "192.0.2.7:40000".into(),
            tagged: true,
            session: Some("00000000000000ab".into()),
            packets,
            bytes,
            seconds,
            gbps: Some(bytes as f64 * 8.0 / seconds / 1e9),
            pps: Some(packets as f64 / seconds),
            ..PeerReport::default()
        }
    }

    #[test]
    fn an_interval_line() {
        let mut r = peer(71_429, 100_000_600, 1.0);
        r.start_seconds = Some(1.0);
        r.queue_delay_ms = Some(Spread {
            p50: 0.031,
            p90: 0.2,
            p99: 1.25,
            max: 3.0,
        });
        r.cpu = Some(CpuCost {
            user_seconds: None,
            system_seconds: None,
            seconds: 0.12,
            percent_of_core: Some(12.0),
            seconds_per_gb: Some(1.2),
            shared: None,
        });
        assert_eq!(
            ServerEvent::Interval(r).text(),
            "[192.0.2.7:40000 session 00000000000000ab]     1.00-2.00 s      71429 pkts   100.00 MB  800.0 Mbit/s     71429 pps cpu  12.0% queue p50 0.03 ms p99 1.2 ms"
        );
    }

    #[test]
    fn a_total_line() {
        let t = TotalReport {
            start: 1.0,
            end: 2.0,
            seconds: 1.0,
            peers_active: 2,
            peers_started: 1,
            peers_finished: 0,
            packets: 142_858,
            bytes: 200_001_200,
            gbps: Some(1.6),
            pps: Some(142_858.0),
            kernel_drops: Some(12),
            kernel_drops_unit: Some("datagrams"),
            kernel_drops_datagrams: Some(12),
            recv_buffer_bytes: 33_554_432,
            recv_buffer_peak_bytes: Some(1_048_576),
            ..TotalReport::default()
        };
        assert_eq!(
            ServerEvent::Total(t).text(),
            "[total]     1.00-2.00 s 2 peers active (+1 -0)     142858 pkts   200.00 MB  1.600 Gbit/s    142858 pps, dropped 12 datagrams, buffer peak 1.05 MB of 33.55 MB"
        );
    }

    #[test]
    fn a_peer_summary() {
        let mut r = peer(7143, 10_000_200, 0.5);
        r.reason = Some(DoneReason::End);
        r.wire_gbps = Some(0.165);
        r.sent_packets = Some(7150);
        r.lost = Some(7);
        r.loss_percent = Some(0.0979);
        r.duplicates = Some(0);
        r.reordered = Some(2);
        r.jitter_ms = Some(0.012);
        r.drops = KernelDrops {
            kernel_drops: Some(7),
            socket_wide_kernel_drops: Some(7),
            kernel_drops_unit: Some("datagrams"),
            kernel_drops_datagrams: Some(7),
            kernel_drops_basis: Some("counted".into()),
        };
        assert_eq!(
            ServerEvent::PeerDone(r).text(),
            "peer 192.0.2.7:40000 session 00000000000000ab finished (end of test)
  received  7143 packets, 10.00 MB in 0.500 s
  rate      160.0 Mbit/s payload, 165.0 Mbit/s on the wire (est.), 14286 pps
  sender    7150 packets declared by the sender
  loss      7 lost (0.098%), 0 duplicates, 2 reordered, jitter 0.012 ms
  kernel    7 datagrams dropped on the server socket (receive buffer full) while this peer was active; this peer's, the only traffic on it
  drops     7 datagrams dropped (counted)"
        );
    }

    #[test]
    fn json_is_one_event_line_with_the_reports_fields() {
        let line = ServerEvent::Interval(peer(10, 14_000, 1.0)).json();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["event"], "interval");
        assert_eq!(v["packets"], 10);
        assert!(!line.contains('\n'));
    }
}
