//! Text and JSON views of what the server and client measured. Nothing here
//! measures anything; it only formats the structs the roles return.
//!
//! JSON is always one valid object per line on stdout (NDJSON); errors go
//! to stderr. Every number is finite: a rate that cannot be known (a span
//! under 1 ms) is null.

use crate::client::{Answer, ClientReport, RunReport, ServerView};
use crate::config::ServerConfig;
use crate::download::{upload_stream, DuplexReport, Stream};
use crate::latency::{ms, Latency};
use crate::meter::account::{ConflictReport, DoneReason, LateReport, PeerReport};
use crate::server::reverse::{StreamEnd, StreamInterval, StreamReport};
use crate::server::total::TotalReport;
use crate::server::{Bound, ServerSummary};
use crate::stats::delay::Spread;
use crate::stats::{CpuCost, KernelDrops, LossSplit, RateSpan, SendInterval};
use crate::units::HumanBytes;
use crate::wire::Direction;
use serde::Serialize;
use serde_json::{json, Value};

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

/// The `listening` event, naming the `--metrics` endpoint when it serves.
pub fn listening(
    bound: &Bound,
    cfg: &ServerConfig,
    metrics: Option<std::net::SocketAddr>,
    json_out: bool,
) -> String {
    let addr = bound.addr;
    let buffer = &bound.buffer;
    if json_out {
        let mut line = json!({
            "event": "listening",
            "addr": addr.to_string(),
            "recv_buffer": buffer,
            "method": cfg.method.name(),
            "threads": bound.sockets.len(),
            "gro": bound.gro,
        });
        if let Some(m) = metrics {
            line["metrics"] = json!(m.to_string());
        }
        return line.to_string();
    }
    let metrics = metrics.map_or_else(String::new, |m| {
        format!("; metrics at http://{m}{}", super::metrics::PATH)
    });
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

fn peer_label(r: &PeerReport) -> String {
    match &r.session {
        Some(s) => format!("{} session {s}", r.peer),
        None => format!("{} (untagged)", r.peer),
    }
}

/// A rate with three decimals, or "unknown" when the span was too short.
fn rate(gbps: Option<f64>) -> String {
    gbps.map_or_else(|| "unknown".to_string(), |g| format!("{g:.3}"))
}

/// `= 1.234 Gbit/s`, or why there is no rate.
fn rate_phrase(gbps: Option<f64>) -> String {
    match gbps {
        Some(g) => format!("= {g:.3} Gbit/s"),
        None => format!(
            "(rate unknown: under {} ms)",
            crate::stats::MIN_RATE_SPAN.as_millis()
        ),
    }
}

/// `0.140 s (0.010 user + 0.130 sys) = 7.0% of a core, 2.80 CPU-s/GB`.
fn cpu_text(c: &CpuCost) -> String {
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
    format!("{:.3} s{split}{core}{per_gb}", c.seconds)
}

/// `1 peer`, `2 peers`.
pub fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// One interval line.
pub fn interval(r: &PeerReport, json_out: bool) -> String {
    if json_out {
        return json_event("interval", r);
    }
    let cpu = r
        .cpu
        .and_then(|c| c.percent_of_core)
        .map_or_else(String::new, |p| format!(" cpu {p:5.1}%"));
    format!(
        "[{}] {:6.2} s {:>10} pkts {:>11} {:>8} Gbit/s {:>9} pps{cpu}{}",
        peer_label(r),
        r.seconds,
        r.packets,
        HumanBytes(r.bytes).to_string(),
        rate(r.gbps),
        r.pps
            .map_or_else(|| "unknown".to_string(), |p| format!("{p:.0}")),
        queue_suffix(r.queue_delay_ms.as_ref()),
    )
}

/// The server's `total` line: the socket(s) as a whole over an interval,
/// or to the end of a burst.
pub fn total(t: &TotalReport, json_out: bool) -> String {
    if json_out {
        return json_event("total", t);
    }
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
    let span = format!("{:.2}-{:.2}", t.start, t.end);
    format!(
        "[total] {span:>13} s {} active (+{} -{}) {:>10} pkts {:>11} {:>8} Gbit/s {:>9} pps{drops}{buffer}{cpu}{}",
        plural(t.peers_active, "peer", "peers"),
        t.peers_started,
        t.peers_finished,
        t.packets,
        HumanBytes(t.bytes).to_string(),
        rate(t.gbps),
        t.pps
            .map_or_else(|| "unknown".to_string(), |p| format!("{p:.0}")),
        if t.burst_end { " (burst ended)" } else { "" },
    )
}

/// An interval's queue delay, for the end of its line.
fn queue_suffix(q: Option<&Spread>) -> String {
    q.map_or_else(String::new, |s| {
        format!(" queue p50 {} p99 {}", ms(s.p50), ms(s.p99))
    })
}

/// A spread of delays in words.
fn spread_text(s: &Spread) -> String {
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
fn latency_lines(l: &Latency, label: &str) -> String {
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
        out += &format!(
            "\n{label}rtt       {idle}, {loaded}; {} of {} probes lost",
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

/// One client interval (`udp_client --interval`): what the kernel took
/// from `start` to `end` seconds after the client started. `session`
/// prefixes it when several clients run.
pub fn send_interval(session: Option<&str>, i: &SendInterval) -> String {
    let who = session.map_or_else(String::new, |s| format!("[{s}] "));
    // Milliseconds where hundredths would print "0.00-0.00 s" beside a
    // rate.
    let span = if i.end - i.start < 0.05 {
        format!("{:.3}-{:.3}", i.start, i.end)
    } else {
        format!("{:.2}-{:.2}", i.start, i.end)
    };
    let rate = i.gbps.map_or_else(
        || "rate unknown (under 1 ms)".into(),
        |g| format!("{g:>8.3} Gbit/s"),
    );
    format!(
        "{who}{span:>13} s {:>10} pkts {:>11} {rate} (sender side)",
        i.packets,
        HumanBytes(i.bytes).to_string(),
    )
}

/// A client interval as an NDJSON event (`--json-stream`): `side` is
/// `sender`, beside the in-process server's own `interval` events.
pub fn send_interval_event(session: &str, i: &SendInterval) -> String {
    #[derive(Serialize)]
    struct Line<'a> {
        side: &'static str,
        session: &'a str,
        #[serde(flatten)]
        interval: &'a SendInterval,
    }
    json_event(
        "interval",
        &Line {
            side: "sender",
            session,
            interval: i,
        },
    )
}

/// Loss as a number, or as a range when some arrivals were uncertain.
fn lost_text(lost: u64, fewest: Option<u64>) -> String {
    match fewest {
        Some(f) => format!("{f} to {lost}"),
        None => lost.to_string(),
    }
}

/// A peer's final summary.
pub fn peer_done(r: &PeerReport, json_out: bool) -> String {
    if json_out {
        return json_event("peer_done", r);
    }
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
            format!("{g:.3} Gbit/s payload, {w:.3} Gbit/s on the wire (est.), {p:.0} pps{over}")
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
            out += &format!("\n  queue     {}", spread_text(q));
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
        out += &format!(
            "\n  cpu       {} (receive threads, shared with any other active peer)",
            cpu_text(c)
        );
    }
    if let Some(why) = r.conflict {
        out += &format!(
            "\n  DISPUTED  {why}: a forged End, or a confused client; these figures cannot be trusted"
        );
    }
    out
}

/// One interval of a reverse stream the server is sending.
pub fn stream_interval(i: &StreamInterval, json_out: bool) -> String {
    if json_out {
        return json_event("interval", i);
    }
    format!(
        "[{} session {}] {} {:6.2}-{:<6.2} s sent {:>11} {:>8.3} Gbit/s (client has {} so far)",
        i.peer,
        i.session,
        direction_label(i.direction),
        i.start,
        i.end,
        HumanBytes(i.sent_bytes).to_string(),
        i.gbps,
        HumanBytes(i.received_bytes),
    )
}

/// A reverse stream the server sent, finished.
pub fn stream_done(r: &StreamReport, json_out: bool) -> String {
    if json_out {
        return json_event("stream_done", r);
    }
    let reason = match r.reason {
        StreamEnd::Answered => "end of test",
        StreamEnd::NoAnswer => "the client never answered its End",
        StreamEnd::Silent => "the client went silent: its feedback stopped, so did the stream",
        StreamEnd::NeverConfirmed => "the client never confirmed the start: nothing sent",
        StreamEnd::MaxDuration => "cut short at --max-duration",
        StreamEnd::Shutdown => "server stopping",
        StreamEnd::Failed => "a send failed",
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
    if let Some(c) = &r.cpu {
        out += &format!("\n  cpu       {} (the sending thread)", cpu_text(c));
    }
    if let Some(e) = &r.error {
        out += &format!("\n  error     {e}");
    }
    out
}

/// A session whose End is contradicted.
pub fn conflict(r: &ConflictReport, json_out: bool) -> String {
    if json_out {
        return json_event("conflict", r);
    }
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
pub fn late(r: &LateReport, json_out: bool) -> String {
    if json_out {
        return json_event("late", r);
    }
    format!(
        "peer {} session {}: {} ({}) arrived after the session had finished, the last {:.3} s after; not in its figures",
        r.peer,
        r.session,
        plural(r.late_packets, "datagram", "datagrams"),
        HumanBytes(r.late_bytes),
        r.seconds_after_end
    )
}

/// The server's last words.
pub fn server_summary(s: &ServerSummary, json_out: bool) -> String {
    if json_out {
        return json_event("shutdown", s);
    }
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

fn drops_text(v: &ServerView, total: bool) -> String {
    let unit = match v.drops.kernel_drops_unit {
        Some("buffers") => " GRO buffers",
        _ => "",
    };
    match (v.drops.kernel_drops, v.drops.socket_wide_kernel_drops) {
        (Some(d), _) if !total => format!(", kernel drops {d}{unit}"),
        (_, Some(d)) => {
            format!(", kernel drops {d}{unit} on the server socket (all traffic on it)")
        }
        _ => String::new(),
    }
}

/// Kernel drops in datagrams and the loss split, in words: `58834
/// datagrams (estimate: 1279 buffers × 46.0 datagrams per buffer
/// received); of the loss, 58834 in the socket and 0 before it`.
fn drops_in_datagrams(drops: &KernelDrops, split: &LossSplit) -> Option<String> {
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

fn server_line(v: &ServerView, sent_packets: u64, total: bool) -> String {
    let mut out = format!(
        "received  {} packets, {} in {:.3} s {} (server side); lost {} of {} ({:.3}%), {} duplicates, {} reordered, jitter {:.3} ms{}",
        v.received_packets,
        HumanBytes(v.received_bytes),
        v.seconds,
        rate_phrase(v.gbps),
        lost_text(v.lost_packets, v.lost_fewest),
        sent_packets,
        v.loss_percent,
        v.duplicates,
        v.reordered,
        v.jitter_ms,
        drops_text(v, total),
    );
    for (n, what) in [
        (v.late, "late (after the server finished the session)"),
        (v.unexpected, "unexpected (sequence numbers never sent)"),
        (v.uncertain, "uncertain (could not be classified)"),
    ] {
        if n > 0 {
            out += &format!(", {n} {what}");
        }
    }
    if let Some(text) = drops_in_datagrams(&v.drops, &v.split) {
        out += &format!("\n          {text}");
    }
    if v.rate_span == RateSpan::Sender {
        out += &format!(
            "\n          the datagrams arrived within {:.3} s: the rate is over the sender's span",
            v.seconds
        );
    }
    out
}

fn sent_line(packets: u64, bytes: u64, seconds: f64, gbps: Option<f64>) -> String {
    format!(
        "sent      {packets} packets, {} in {seconds:.3} s {} (sender side)",
        HumanBytes(bytes),
        rate_phrase(gbps)
    )
}

/// `cpu  sender …; receiver …`, both ends of the same run.
fn cpu_line(sender: Option<&CpuCost>, server: Option<&ServerView>) -> Option<String> {
    let receiver = server.and_then(|v| v.cpu.as_ref());
    if sender.is_none() && receiver.is_none() {
        return None;
    }
    let side = |c: Option<&CpuCost>| c.map_or_else(|| "unknown".to_string(), cpu_text);
    Some(format!(
        "\ncpu       sender {}; receiver {}",
        side(sender),
        side(receiver)
    ))
}

/// `; blocked in send ≥ 1.234 s`, when known and not nothing.
fn blocked_text(seconds: Option<f64>) -> String {
    match seconds {
        Some(s) if s >= 0.0005 => format!("; blocked in send calls at least {s:.3} s"),
        _ => String::new(),
    }
}

/// The sender's own egress queue over the run, its counts in their units.
fn sender_queue_line(q: &crate::client::egress::SenderQueue) -> String {
    let Some(drops) = q.qdisc_drops else {
        return format!(
            "\negress    {}: {}",
            q.device,
            q.note
                .as_deref()
                .unwrap_or("its qdisc's counters are unknown")
        );
    };
    let mut line = format!(
        "\negress    {} ({}, this host's egress; device-wide counts): {drops} {} dropped, {} overlimits, {} requeues during the run",
        q.device,
        q.qdisc.as_deref().unwrap_or("?"),
        q.unit_words(),
        q.qdisc_overlimits.unwrap_or(0),
        q.qdisc_requeues.unwrap_or(0),
    );
    if let Some(n) = q.sndbuf_errors {
        line += &format!("; UDP SndbufErrors +{n} (send calls)");
    }
    if let Some(n) = q.lost_in_sender_queue_at_most {
        line += &format!("; at most {n} of the lost datagrams were these drops");
    }
    line
}

fn client_lines(c: &ClientReport) -> String {
    let mut out = sent_line(c.sent_packets, c.sent_bytes, c.seconds, c.gbps) + "\n";
    match (&c.server, c.answer) {
        (Some(v), _) => out += &server_line(v, c.sent_packets, false),
        (None, Answer::NotAsked) => out += "received  not asked (--no-server)",
        (None, Answer::ServerGone) => {
            out += "received  unknown: the server went away during the test (port unreachable)"
        }
        (None, _) => out += "received  unknown: the server did not answer the end-of-test message",
    }
    out += &format!(
        "\nback-off  {} ENOBUFS/EAGAIN retries, {:.3} s waiting{}",
        c.enobufs_retries,
        c.backoff_seconds,
        blocked_text(c.send_blocked_seconds)
    );
    if let Some(cpu) = cpu_line(c.cpu.as_ref(), c.server.as_ref()) {
        out += &cpu;
    }
    let p = &c.send_path;
    let gso = match p.gso_segments {
        Some(n) => format!("gso: on (up to {n} datagrams per buffer)"),
        None => format!("gso: {}", p.gso),
    };
    out += &format!(
        "\npath      {}: {} per call, {gso}, {} calls",
        p.name, p.batch, p.calls
    );
    if let Some(pace) = &c.pacing {
        let mode = match pace.mode {
            "precise" => "each datagram at its time (spinning: costs up to a core)".to_string(),
            _ => format!(
                "in batches every 0.5 ms, at most {} back to back",
                pace.burst_bound
            ),
        };
        out += &format!("\npacing    {mode}");
        // Under a millisecond in all is the schedule's own jitter, and
        // would print as "0.000 s".
        if pace.behind_seconds >= 0.001 {
            out += &format!(
                "; fell behind by {:.3} s in all (the rate was not held then)",
                pace.behind_seconds
            );
        }
    }
    for note in &p.notes {
        out += &format!("\n          {note}");
    }
    if let Some(b) = &c.sndbuf {
        out += &format!("\nsndbuf    {} bytes granted", b.granted);
        if let Some(w) = &b.warning {
            out += &format!(" ({w})");
        }
    }
    out
}

/// `--json-stream`'s first event: what is about to run, and where.
pub fn client_start(cfg: &crate::config::ClientConfig) -> String {
    let mut settings = crate::client::Settings::of(cfg);
    if cfg.local {
        settings.server = "local (in-process, ephemeral port)".into();
    }
    json_event(
        "start",
        &json!({
            "version": env!("CARGO_PKG_VERSION"),
            "start": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            "host": crate::client::Host::this(),
            "settings": settings,
        }),
    )
}

/// `[C->S]` or `[S->C]`: which way a line's data flowed.
pub fn direction_label(d: Direction) -> &'static str {
    match d {
        Direction::ClientToServer => "[C->S]",
        Direction::ServerToClient => "[S->C]",
    }
}

/// One interval line of a reverse stream, as the receiving client counted.
pub fn reverse_interval(r: &PeerReport, json_out: bool) -> String {
    if json_out {
        let mut value = serde_json::to_value(r).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.insert("direction".into(), json!(Direction::ServerToClient.name()));
        }
        return json_event("interval", &value);
    }
    format!(
        "{} {:6.2} s {:>10} pkts {:>11} {:>8} Gbit/s {:>9} pps (receiver side){}",
        direction_label(Direction::ServerToClient),
        r.seconds,
        r.packets,
        HumanBytes(r.bytes).to_string(),
        rate(r.gbps),
        r.pps
            .map_or_else(|| "unknown".to_string(), |p| format!("{p:.0}")),
        queue_suffix(r.queue_delay_ms.as_ref()),
    )
}

/// The lines of one direction: its sender's side and its receiver's.
fn stream_lines(st: &Stream, sender: &str, receiver: &str) -> String {
    let label = direction_label(st.direction);
    let s = &st.sender;
    let mut out = format!(
        "{label} sent      {}, {} in {:.3} s {} ({sender})",
        plural(s.packets, "packet", "packets"),
        HumanBytes(s.bytes),
        s.seconds,
        rate_phrase(s.gbps),
    );
    match &st.receiver {
        Some(r) => {
            let lost = r.lost_packets.unwrap_or(0);
            out += &format!(
                "\n{label} received  {}, {} in {:.3} s {} ({receiver})\n{label} loss      {} lost ({:.3}%), {} duplicates, {} reordered, jitter {:.3} ms",
                plural(r.packets, "packet", "packets"),
                HumanBytes(r.bytes),
                r.seconds,
                rate_phrase(r.gbps),
                lost,
                crate::stats::percent(lost, s.packets),
                r.duplicates.unwrap_or(0),
                r.reordered.unwrap_or(0),
                r.jitter_ms.unwrap_or(0.0),
            );
            if let Some(d) = r.kernel_drops.filter(|&d| d > 0) {
                out += &format!(
                    "\n{label} kernel    {d} dropped by the {receiver}'s socket (receive buffer full)"
                );
            }
        }
        None => out += &format!("\n{label} received  unknown: the {receiver} never answered"),
    }
    for (who, cpu) in [
        (sender, &s.cpu),
        (receiver, &st.receiver.as_ref().and_then(|r| r.cpu)),
    ] {
        if let Some(c) = cpu {
            out += &format!("\n{label} cpu       {who}: {}", cpu_text(c));
        }
    }
    out += &latency_lines(&st.latency, &format!("{label} "));
    out += &format!("\n{label} limit     {}", st.limited_by.text);
    out
}

/// The final report of a `-R` or `--bidir` run.
pub fn duplex_report(r: &DuplexReport, json_out: bool) -> String {
    if json_out {
        return serde_json::to_string(r).unwrap_or_else(|_| "{}".into());
    }
    let mut out = String::new();
    if let Some(i) = r.interrupted.as_ref().filter(|_| r.upload.is_none()) {
        out += &format!("note: {}\n", i.note());
    }
    if let Some(upload) = &r.upload {
        out += &client_report(upload, false);
        out += "\n\n";
    }
    let Some(first) = r.downloads.first() else {
        return out;
    };
    out += &format!(
        "udp_client from {}: the server sent to {}, {} client{}{}; receive buffer {}{}\n",
        first.received.peer,
        first.local_addr,
        r.downloads.len(),
        if r.downloads.len() == 1 { "" } else { "s" },
        match first.granted_rate_bps {
            Some(b) => format!(", paced at {:.3} Gbit/s", b as f64 / 1e9),
            None => String::new(),
        },
        HumanBytes(first.recv_buffer as u64),
        if first.gro { ", GRO on" } else { "" },
    );
    let lines: Vec<String> = r
        .streams
        .iter()
        .map(|st| match st.direction {
            Direction::ClientToServer => stream_lines(st, "client", "server"),
            Direction::ServerToClient => stream_lines(st, "server", "client"),
        })
        .collect();
    out += &lines.join("\n");
    for d in r.downloads.iter().filter(|d| !d.answered) {
        out += &format!(
            "\nnote: session {}: the server's End never arrived; its sent figures are missing and loss is estimated from sequence numbers",
            d.session
        );
    }
    out
}

/// An upload's report as JSON: its fields, and `streams` (every run
/// carries it, one per direction: an upload has one).
fn client_json(r: &RunReport) -> Value {
    let mut value = serde_json::to_value(r).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        map.insert("streams".into(), json!([upload_stream(r)]));
    }
    value
}

/// The `end` event of an upload's `--json-stream`: the report `--json`
/// prints.
pub fn client_end_event(r: &RunReport) -> String {
    json_event("end", &client_json(r))
}

/// The client's final report.
pub fn client_report(r: &RunReport, json_out: bool) -> String {
    if json_out {
        return client_json(r).to_string();
    }
    let clients = r.clients.len();
    let mut out = format!(
        "udp_client to {}: {}-byte datagrams, {} client{}, {}{}\n",
        r.server_addr,
        r.buffer_size,
        clients,
        if clients == 1 { "" } else { "s" },
        if r.connected {
            "connected"
        } else {
            "unconnected (sendto)"
        },
        match r.rate_bps {
            Some(b) => format!(", paced at {:.3} Gbit/s", b as f64 / 1e9),
            None => String::new(),
        }
    );
    if clients == 1 {
        out += &client_lines(&r.clients[0]);
    } else {
        for (i, c) in r.clients.iter().enumerate() {
            out += &format!(
                "client {} (session {}, {})\n",
                i + 1,
                c.session,
                c.local_addr
            );
            for line in client_lines(c).lines() {
                out += &format!("  {line}\n");
            }
        }
        out += "total\n";
        out += &sent_line(r.sent_packets, r.sent_bytes, r.seconds, r.gbps);
        out += "\n";
        match &r.server {
            Some(v) => out += &server_line(v, r.sent_packets, true),
            None => out += "received  unknown: the server answered for no client",
        }
        out += &format!(
            "\nback-off  {} ENOBUFS/EAGAIN retries, {:.3} s waiting{}",
            r.enobufs_retries,
            r.backoff_seconds,
            blocked_text(r.send_blocked_seconds)
        );
        if let Some(cpu) = cpu_line(r.cpu.as_ref(), r.server.as_ref()) {
            out += &cpu;
        }
    }
    if let Some(q) = &r.sender_queue {
        out += &sender_queue_line(q);
    }
    for note in &r.notes {
        out += &format!("\nnote: {note}");
    }
    out += &latency_lines(&upload_stream(r).latency, "");
    out += &format!("\nlimit     {}", r.limited_by.text);
    out
}
