//! An upload's report (`udp_client` without `-R`): each client's sender
//! side and the server's answer, their totals, the path, the delay under
//! load and the verdict; and the sender-side interval lines.

use super::{
    cpu_text, drops_in_datagrams, json_event, latency_lines, lost_text, plural, rate_phrase, Shown,
};
use crate::client::duplex::upload_stream;
use crate::client::{Answer, ClientReport, RunReport, ServerView};
use crate::stats::{CpuCost, RateSpan, SendInterval};
use crate::units::{HumanBytes, HumanRate};
use serde::Serialize;
use serde_json::{json, Value};

impl Shown for RunReport {
    fn text(&self) -> String {
        report_text(self)
    }

    fn json(&self) -> String {
        client_json(self).to_string()
    }
}

/// One client interval (`udp_client --interval`): what the kernel took
/// from `start` to `end` seconds after the client started. `session`
/// prefixes it when several clients run.
pub fn send_interval(session: Option<&str>, i: &SendInterval) -> String {
    let who = session.map_or_else(String::new, |s| format!("[{s}] "));
    let span = super::time_range(i.start, i.end);
    let rate = i.gbps.map_or_else(
        || "rate unknown (under 1 ms)".into(),
        |g| format!("{:>13}", crate::units::gbps_text(g)),
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

fn server_line(v: &ServerView, sent_packets: u64, total: bool) -> String {
    let mut out = format!(
        "received  {}, {} in {:.3} s {} (server side); lost {} of {} ({:.3}%), {} duplicates, {} reordered, jitter {:.3} ms{}",
        plural(v.received_packets, "packet", "packets"),
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
        "sent      {}, {} in {seconds:.3} s {} (sender side)",
        plural(packets, "packet", "packets"),
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
    out += &backoff_line(c);
    if let Some(cpu) = cpu_line(c.cpu.as_ref(), c.server.as_ref()) {
        out += &cpu;
    }
    out + &path_lines(c)
}

/// `back-off  …`: the sender's ENOBUFS retries and time blocked.
fn backoff_line(c: &ClientReport) -> String {
    format!(
        "\nback-off  {} ENOBUFS/EAGAIN retries, {:.3} s waiting{}",
        c.enobufs_retries,
        c.backoff_seconds,
        blocked_text(c.send_blocked_seconds)
    )
}

/// `path`, `pacing` and `sndbuf`: how one client sent.
fn path_lines(c: &ClientReport) -> String {
    let p = &c.send_path;
    let gso = match p.gso_segments {
        Some(n) => format!("gso: on (up to {n} datagrams per buffer)"),
        None => format!("gso: {}", p.gso),
    };
    let mut out = format!(
        "\npath      {}: {} per call, {gso}, {}",
        p.name,
        p.batch,
        plural(p.calls, "call", "calls")
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

/// How an upload was sent, for `--bidir`, whose `[C->S]` lines already
/// give what was sent, received and lost, the CPU, the delay and the
/// verdict: the back-off, the path and pacing, the sender's egress queue
/// and the notes (each client's lines with several).
pub(super) fn upload_detail(r: &RunReport) -> String {
    let mut out = String::new();
    if let [c] = r.clients.as_slice() {
        out += &backoff_line(c);
        out += &path_lines(c);
    } else {
        for (i, c) in r.clients.iter().enumerate() {
            out += &format!(
                "\nclient {} (session {}, {})",
                i + 1,
                c.session,
                c.local_addr
            );
            for line in client_lines(c).lines() {
                out += &format!("\n  {line}");
            }
        }
        out += &format!(
            "\nback-off  {} ENOBUFS/EAGAIN retries, {:.3} s waiting{} (all clients)",
            r.enobufs_retries,
            r.backoff_seconds,
            blocked_text(r.send_blocked_seconds)
        );
    }
    if let Some(q) = &r.sender_queue {
        out += &sender_queue_line(q);
    }
    for note in &r.notes {
        out += &format!("\nnote: {note}");
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

/// The header's socket: connected, or unconnected with the calls the
/// senders really made, as their path lines name them (issue 42: the
/// header said "sendto" whatever the path line said).
fn socket_text(r: &RunReport) -> String {
    if r.connected {
        return "connected".to_string();
    }
    let mut calls: Vec<&str> = Vec::new();
    for c in &r.clients {
        if !calls.contains(&c.send_path.name.as_str()) {
            calls.push(&c.send_path.name);
        }
    }
    match calls.is_empty() {
        true => "unconnected".to_string(),
        false => format!("unconnected ({})", calls.join(", ")),
    }
}

/// `udp_client to ADDR: …`: what the upload sent, and how.
pub(super) fn upload_header(r: &RunReport) -> String {
    let clients = r.clients.len();
    format!(
        "udp_client to {}: {}-byte datagrams, {}, {}{}",
        r.server_addr,
        r.buffer_size,
        plural(clients as u64, "client", "clients"),
        socket_text(r),
        paced_text(r.rate_bps, clients),
    )
}

/// `, paced at 0.800 Gbit/s` for one client; `, paced at 0.800 Gbit/s
/// each (12.800 Gbit/s in all)` for several: `--rate` is per client.
pub(super) fn paced_text(rate_bps: Option<u64>, clients: usize) -> String {
    match rate_bps {
        Some(b) if clients > 1 => format!(
            ", paced at {} each ({} in all)",
            HumanRate(b),
            HumanRate(b.saturating_mul(clients as u64))
        ),
        Some(b) => format!(", paced at {}", HumanRate(b)),
        None => String::new(),
    }
}

/// The client's final report.
fn report_text(r: &RunReport) -> String {
    let clients = r.clients.len();
    let mut out = upload_header(r) + "\n";
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

#[cfg(test)]
mod tests {
    //! Golden lines of an upload's report, to the character.
    use super::*;
    use crate::client::verdict::{Cap, Verdict};
    use crate::meter::send::SendPath;

    /// One client that sent 7150 datagrams of 1400 bytes and got the
    /// server's answer.
    #[allow(clippy::field_reassign_with_default)]
    pub(crate) fn upload() -> RunReport {
        let server = ServerView {
            received_packets: 7143,
            received_bytes: 10_000_200,
            lost_packets: 7,
            loss_percent: 0.0979,
            reordered: 2,
            jitter_ms: 0.012,
            gbps: Some(0.16),
            seconds: 0.5,
            ..ServerView::default()
        };
        // Built field by field: some of its fields are the client's own,
        // so struct-update syntax cannot reach them from here.
        let mut client = ClientReport::default();
        client.session = "00000000000000ab".into();
        client.local_addr = "192.0.2.7:40000".into();
        client.sent_packets = 7150;
        client.sent_bytes = 10_010_000;
        client.seconds = 0.5;
        client.gbps = Some(0.16);
        client.send_path = SendPath {
            name: "sendmmsg+gso".into(),
            batch: 8,
            gso: "on".into(),
            gso_segments: Some(46),
            notes: Vec::new(),
            calls: 20,
        };
        client.answer = Answer::Answered;
        client.server = Some(server.clone());
        RunReport {
            server_addr: "192.0.2.1:35000".into(),
            buffer_size: 1400,
            connected: true,
            rate_bps: Some(160_000_000),
            sent_packets: 7150,
            sent_bytes: 10_010_000,
            seconds: 0.5,
            gbps: Some(0.16),
            server: Some(server),
            clients_answered: 1,
            complete: true,
            clients: vec![client],
            limited_by: Verdict {
                cause: Cap::Paced,
                text: "paced: the sender held the requested 0.160 Gbit/s".into(),
            },
            ..RunReport::default()
        }
    }

    #[test]
    fn an_upload_report() {
        assert_eq!(
            upload().text(),
            "udp_client to 192.0.2.1:35000: 1400-byte datagrams, 1 client, connected, paced at 160.0 Mbit/s
sent      7150 packets, 10.01 MB in 0.500 s = 160.0 Mbit/s (sender side)
received  7143 packets, 10.00 MB in 0.500 s = 160.0 Mbit/s (server side); lost 7 of 7150 (0.098%), 0 duplicates, 2 reordered, jitter 0.012 ms
back-off  0 ENOBUFS/EAGAIN retries, 0.000 s waiting
path      sendmmsg+gso: 8 per call, gso: on (up to 46 datagrams per buffer), 20 calls
limit     paced: the sender held the requested 0.160 Gbit/s"
        );
    }

    /// Issue 42: an unconnected socket's header names the calls the path
    /// line names, never a "sendto" of its own.
    #[test]
    fn an_unconnected_header_names_the_paths_calls() {
        let mut r = upload();
        r.connected = false;
        let header = |r: &RunReport| r.text().lines().next().unwrap().to_string();
        assert!(
            header(&r).ends_with(", 1 client, unconnected (sendmmsg+gso), paced at 160.0 Mbit/s")
        );
        r.clients[0].send_path.name = "sendto".into();
        assert!(header(&r).contains(", unconnected (sendto), "));
        r.connected = true;
        assert!(header(&r).contains(", connected, "));
    }

    #[test]
    fn its_json_carries_one_stream() {
        let v: Value = serde_json::from_str(&upload().json()).unwrap();
        assert_eq!(v["streams"][0]["direction"], "client_to_server");
        assert_eq!(v["streams"][0]["receiver"]["packets"], 7143);
    }
}
