//! Text and JSON views of what the server and client measured. Nothing here
//! measures anything; it only formats the structs the roles return.
//!
//! JSON is always one valid object per line on stdout (NDJSON); errors go
//! to stderr. Every number is finite: rates over zero time are 0.

use crate::client::{ClientReport, RunReport, ServerView};
use crate::config::ServerConfig;
use crate::server::peers::{DoneReason, PeerReport};
use crate::server::{Bound, ServerSummary};
use crate::units::HumanBytes;
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

/// The `listening` event.
pub fn listening(bound: &Bound, cfg: &ServerConfig, json_out: bool) -> String {
    let addr = bound.addr;
    let buffer = &bound.buffer;
    if json_out {
        return json!({
            "event": "listening",
            "addr": addr.to_string(),
            "recv_buffer": buffer,
            "method": cfg.method.name(),
            "threads": bound.sockets.len(),
            "gro": bound.gro,
        })
        .to_string();
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
    let gro = match (&bound.gro, &bound.gro_note) {
        (true, _) => "gro: on".to_string(),
        (false, Some(note)) => format!("gro: off ({note})"),
        (false, None) => "gro: off".to_string(),
    };
    format!(
        "udp_server listening on {addr}{dual}; receive buffer {} bytes granted{forced}; method {}, {} thread{}, {gro}",
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

/// One interval line.
pub fn interval(r: &PeerReport, json_out: bool) -> String {
    if json_out {
        return json_event("interval", r);
    }
    format!(
        "[{}] {:6.2} s {:>10} pkts {:>11} {:8.3} Gbit/s {:9.0} pps",
        peer_label(r),
        r.seconds,
        r.packets,
        HumanBytes(r.bytes).to_string(),
        r.gbps,
        r.pps
    )
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
        None => "",
    };
    let mut out = format!(
        "peer {} finished ({reason})\n  received  {} packets, {} in {:.3} s\n  rate      {:.3} Gbit/s payload, {:.3} Gbit/s on the wire (est.), {:.0} pps",
        peer_label(r),
        r.packets,
        HumanBytes(r.bytes),
        r.seconds,
        r.gbps,
        r.wire_gbps,
        r.pps
    );
    if r.tagged {
        let sent = match (r.sent_packets, r.loss_basis) {
            (Some(p), _) => format!("{p} packets declared by the sender"),
            (None, _) => "no end-of-test message: loss estimated from sequence numbers".into(),
        };
        out += &format!(
            "\n  sender    {sent}\n  loss      {} lost ({:.3}%), {} duplicates, {} reordered, jitter {:.3} ms",
            r.lost.unwrap_or(0),
            r.loss_percent.unwrap_or(0.0),
            r.duplicates.unwrap_or(0),
            r.reordered.unwrap_or(0),
            r.jitter_ms.unwrap_or(0.0)
        );
    } else {
        out += "\n  loss      unknown: these datagrams carry no netspeed header";
    }
    if let Some(d) = r.kernel_drops {
        let what = if r.kernel_drops_are_buffers {
            "GRO buffers (each up to 64 KiB of datagrams)"
        } else {
            "datagrams"
        };
        out += &format!("\n  kernel    {d} {what} dropped on the server socket while this peer was active (receive buffer full)");
    }
    out
}

/// The server's last words.
pub fn server_summary(s: &ServerSummary, json_out: bool) -> String {
    if json_out {
        return json_event("shutdown", s);
    }
    let mut out = format!(
        "udp_server stopping: {} packets, {} from {} peers",
        s.packets,
        HumanBytes(s.bytes),
        s.peers
    );
    if s.overflow.packets > 0 {
        out += &format!(
            "; {} packets ({}) arrived while the peer table was full (--max-peers) and were counted in bulk",
            s.overflow.packets,
            HumanBytes(s.overflow.bytes)
        );
    }
    if let Some(d) = s.kernel_drops {
        out += &format!("; kernel drops on the socket: {d}");
    }
    out
}

fn server_line(v: &ServerView, sent_packets: u64) -> String {
    let drops = match (v.kernel_drops, v.kernel_drops_are_buffers) {
        (Some(d), true) if d > 0 => format!(", kernel drops {d} GRO buffers"),
        (Some(0), _) => ", kernel drops 0".to_string(),
        (Some(d), _) => format!(", kernel drops {d}"),
        (None, _) => String::new(),
    };
    format!(
        "received  {} packets, {} in {:.3} s = {:.3} Gbit/s (server side); lost {} of {} ({:.3}%), {} duplicates, {} reordered, jitter {:.3} ms{drops}",
        v.received_packets,
        HumanBytes(v.received_bytes),
        v.seconds,
        v.gbps,
        v.lost_packets,
        sent_packets,
        v.loss_percent,
        v.duplicates,
        v.reordered,
        v.jitter_ms,
    )
}

fn client_lines(c: &ClientReport) -> String {
    let mut out = format!(
        "sent      {} packets, {} in {:.3} s = {:.3} Gbit/s (sender side)\n",
        c.sent_packets,
        HumanBytes(c.sent_bytes),
        c.seconds,
        c.gbps
    );
    match &c.server {
        Some(v) => out += &server_line(v, c.sent_packets),
        None => out += "received  unknown: the server did not answer the end-of-test message",
    }
    out += &format!(
        "\nback-off  {} ENOBUFS/EAGAIN retries, {:.3} s waiting",
        c.enobufs_retries, c.backoff_seconds
    );
    let p = &c.send_path;
    let gso = match p.gso_segments {
        Some(n) => format!("gso: on (up to {n} datagrams per buffer)"),
        None => format!("gso: {}", p.gso),
    };
    out += &format!("\npath      {} per call, {gso}, {} calls", p.batch, p.calls);
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

/// The client's final report.
pub fn client_report(r: &RunReport, json_out: bool) -> String {
    if json_out {
        return serde_json::to_string(r).unwrap_or_else(|_| "{}".into());
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
        out += &format!(
            "total\nsent      {} packets, {} in {:.3} s = {:.3} Gbit/s (sender side)\n",
            r.sent_packets,
            HumanBytes(r.sent_bytes),
            r.seconds,
            r.gbps
        );
        match &r.server {
            Some(v) => out += &server_line(v, r.sent_packets),
            None => out += "received  unknown: the server answered for no client",
        }
        out += &format!(
            "\nback-off  {} ENOBUFS/EAGAIN retries, {:.3} s waiting",
            r.enobufs_retries, r.backoff_seconds
        );
    }
    for note in &r.notes {
        out += &format!("\nnote: {note}");
    }
    out
}
