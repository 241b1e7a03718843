//! `-R` and `--bidir`: each direction printed under its label, its
//! sender's side and its receiver's, and the receiving client's interval
//! lines.

use super::{
    cpu_text, direction_label, interval_counts, json_event, latency_lines, plural, queue_suffix,
    rate_phrase, Shown,
};
use crate::client::duplex::{DuplexReport, Stream};
use crate::client::reverse::ServerSend;
use crate::meter::account::PeerReport;
use crate::units::HumanBytes;
use crate::wire::Direction;
use serde_json::{json, Value};

impl Shown for DuplexReport {
    fn text(&self) -> String {
        report_text(self)
    }

    fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".into())
    }
}

/// One interval line of a reverse stream, as the receiving client counted.
pub struct ReverseInterval<'a>(pub &'a PeerReport);

impl Shown for ReverseInterval<'_> {
    fn text(&self) -> String {
        let r = self.0;
        format!(
            "{} {} (receiver side){}",
            direction_label(Direction::ServerToClient),
            interval_counts(r),
            queue_suffix(r.queue_delay_ms.as_ref()),
        )
    }

    fn json(&self) -> String {
        let r = self.0;
        let mut value = serde_json::to_value(r).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.insert("direction".into(), json!(Direction::ServerToClient.name()));
        }
        json_event("interval", &value)
    }
}

/// The lines of one direction: its sender's side and its receiver's.
fn stream_lines(st: &Stream, sender: &str, receiver: &str) -> String {
    let label = direction_label(st.direction);
    let s = &st.sender;
    let mut out = match (s.packets, s.bytes, s.seconds) {
        (Some(packets), Some(bytes), Some(seconds)) => format!(
            "{label} sent      {}, {} in {:.3} s {} ({sender})",
            plural(packets, "packet", "packets"),
            HumanBytes(bytes),
            seconds,
            rate_phrase(s.gbps),
        ),
        _ => format!("{label} sent      unknown: the {sender}'s count never came"),
    };
    match &st.receiver {
        Some(r) => {
            let lost = r.lost_packets.unwrap_or(0);
            let loss = s.packets.map_or_else(
                || "of an unknown number sent".to_string(),
                |sent| format!("({:.3}%)", crate::stats::percent(lost, sent)),
            );
            out += &format!(
                "\n{label} received  {}, {} in {:.3} s {} ({receiver})\n{label} loss      {} lost {loss}, {} duplicates, {} reordered, jitter {:.3} ms",
                plural(r.packets.unwrap_or(0), "packet", "packets"),
                HumanBytes(r.bytes.unwrap_or(0)),
                r.seconds.unwrap_or(0.0),
                rate_phrase(r.gbps),
                lost,
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

/// `[S->C] path …`: how the server sent the reverse streams (its End
/// says) and how this client received them.
fn reverse_path_lines(r: &DuplexReport) -> String {
    let label = direction_label(Direction::ServerToClient);
    let Some(first) = r.reverse.first() else {
        return String::new();
    };
    let receive = format!(
        "client received with GRO {} into a {} buffer",
        if first.gro { "on" } else { "off" },
        HumanBytes(first.recv_buffer as u64)
    );
    let sends: Vec<&ServerSend> = r
        .reverse
        .iter()
        .filter_map(|d| d.server_send.as_ref())
        .collect();
    let send = match sends.as_slice() {
        [] => "server's send path unknown (its End never came)".to_string(),
        [first_send, ..] => {
            let calls: u64 = sends.iter().map(|s| s.calls).sum();
            let gso = match first_send.gso_segments {
                Some(n) => format!("gso: on (up to {n} datagrams per buffer)"),
                None => "gso: off".to_string(),
            };
            format!(
                "server sent with {}: {} per call, {gso}, {}",
                match (first_send.batch > 1, first_send.gso_segments.is_some()) {
                    (true, true) => "sendmmsg+gso",
                    (true, false) => "sendmmsg",
                    (false, true) => "send+gso",
                    (false, false) => "send",
                },
                first_send.batch,
                plural(calls, "call", "calls")
            )
        }
    };
    let mut out = format!("\n{label} path      {send}; {receive}");
    if !sends.is_empty() {
        let retries: u64 = sends.iter().map(|s| s.enobufs_retries).sum();
        let waiting: f64 = sends.iter().map(|s| s.backoff_seconds).sum();
        out += &format!(
            "\n{label} back-off  server: {retries} ENOBUFS/EAGAIN retries, {waiting:.3} s waiting"
        );
    }
    out
}

/// The final report of a `-R` or `--bidir` run: one header, then each
/// direction once, under its label.
fn report_text(r: &DuplexReport) -> String {
    let mut out = String::new();
    if let Some(i) = r.interrupted.as_ref().filter(|_| r.upload.is_none()) {
        out += &format!("note: {}\n", i.note());
    }
    let first = r.reverse.first();
    let from = first.map(|first| {
        format!(
            "the server sent to {}, {}{}",
            first.local_addr,
            plural(r.reverse.len() as u64, "client", "clients"),
            super::client::paced_text(first.granted_rate_bps, r.reverse.len()),
        )
    });
    match (&r.upload, from) {
        (Some(upload), Some(from)) => {
            out += &format!(
                "{} (both ways); {from}\n",
                super::client::upload_header(upload)
            )
        }
        (Some(upload), None) => out += &format!("{}\n", super::client::upload_header(upload)),
        (None, Some(from)) => {
            let peer = first.map_or("", |f| f.received.peer.as_str());
            out += &format!("udp_client from {peer}: {from}\n");
        }
        (None, None) => return out,
    }
    let lines: Vec<String> = r
        .streams
        .iter()
        .map(|st| match st.direction {
            Direction::ClientToServer => {
                let mut lines = stream_lines(st, "client", "server");
                if let Some(upload) = &r.upload {
                    let label = direction_label(st.direction);
                    for line in super::client::upload_detail(upload).lines().skip(1) {
                        lines += &format!("\n{label} {line}");
                    }
                }
                lines
            }
            Direction::ServerToClient => {
                stream_lines(st, "server", "client") + &reverse_path_lines(r)
            }
        })
        .collect();
    out += &lines.join("\n");
    for d in r.reverse.iter().filter(|d| !d.answered) {
        out += &format!(
            "\nnote: session {}: the server's End never arrived; its sent figures are missing and loss is estimated from sequence numbers",
            d.session
        );
    }
    out
}

#[cfg(test)]
mod tests {
    //! Golden lines of a `-R` report, to the character.
    use super::*;
    use crate::client::duplex::Side;
    use crate::client::latency::Latency;
    use crate::client::reverse::ReverseStream;
    use crate::client::verdict::{Cap, Verdict};
    use crate::stats::delay::Spread;

    fn reverse() -> DuplexReport {
        let received = PeerReport {
            peer: "192.0.2.1:35000".into(),
            tagged: true,
            session: Some("00000000000000cd".into()),
            packets: 7143,
            bytes: 10_000_200,
            seconds: 0.5,
            gbps: Some(0.16),
            ..PeerReport::default()
        };
        let stream = Stream {
            direction: Direction::ServerToClient,
            sender: Side {
                packets: Some(7150),
                bytes: Some(10_010_000),
                seconds: Some(0.5),
                gbps: Some(0.16),
                ..Side::default()
            },
            receiver: Some(Side {
                packets: Some(7143),
                bytes: Some(10_000_200),
                seconds: Some(0.5),
                gbps: Some(0.16),
                lost_packets: Some(7),
                duplicates: Some(0),
                reordered: Some(0),
                kernel_drops: Some(7),
                jitter_ms: Some(0.02),
                ..Side::default()
            }),
            limited_by: Verdict {
                cause: Cap::Paced,
                text: "paced: the server held the granted 0.160 Gbit/s".into(),
            },
            latency: Latency {
                idle_rtt_ms: Some(0.25),
                loaded_rtt_ms: Some(Spread {
                    p50: 0.3,
                    p90: 0.5,
                    p99: 0.9,
                    max: 1.0,
                }),
                probes_sent: 20,
                probes_lost: 0,
                rpm: Some(200_000.0),
                ..Latency::default()
            },
        };
        DuplexReport {
            streams: vec![stream],
            upload: None,
            reverse: vec![ReverseStream {
                session: "00000000000000cd".into(),
                local_addr: "192.0.2.7:40000".into(),
                received,
                granted_rate_bps: Some(160_000_000),
                recv_buffer: 4_194_304,
                gro: true,
                answered: true,
                receive_cpu: None,
                server_breaker: None,
                server_send: Some(ServerSend {
                    calls: 155,
                    batch: 32,
                    gso_segments: Some(46),
                    enobufs_retries: 3,
                    backoff_seconds: 0.002,
                }),
            }],
            interrupted: None,
        }
    }

    #[test]
    fn a_reverse_report() {
        assert_eq!(
            reverse().text(),
            "udp_client from 192.0.2.1:35000: the server sent to 192.0.2.7:40000, 1 client, paced at 160.0 Mbit/s
[S->C] sent      7150 packets, 10.01 MB in 0.500 s = 160.0 Mbit/s (server)
[S->C] received  7143 packets, 10.00 MB in 0.500 s = 160.0 Mbit/s (client)
[S->C] loss      7 lost (0.098%), 0 duplicates, 0 reordered, jitter 0.020 ms
[S->C] kernel    7 dropped by the client's socket (receive buffer full)
[S->C] rtt       0.25 ms idle, 0.30 ms under load (p90 0.50 ms, p99 0.90 ms; 200000 RPM); 0 of 20 probes lost
[S->C] limit     paced: the server held the granted 0.160 Gbit/s
[S->C] path      server sent with sendmmsg+gso: 32 per call, gso: on (up to 46 datagrams per buffer), 155 calls; client received with GRO on into a 4.19 MB buffer
[S->C] back-off  server: 3 ENOBUFS/EAGAIN retries, 0.002 s waiting"
        );
    }

    /// Issue 41: a sender whose count never came is unknown, not 0.
    #[test]
    fn an_unknown_sender_is_said_unknown_not_zero() {
        let mut r = reverse();
        r.streams[0].sender = Side::default();
        let text = r.text();
        assert!(
            text.contains("[S->C] sent      unknown: the server's count never came"),
            "{text}"
        );
        assert!(text.contains("7 lost of an unknown number sent"), "{text}");
        assert!(!text.contains("sent      0 packets"), "{text}");
        let json: Value = serde_json::from_str(&r.json()).unwrap();
        let sender = &json["streams"][0]["sender"];
        for key in ["packets", "bytes", "seconds", "gbps"] {
            assert!(sender[key].is_null(), "{key}: {sender}");
        }
    }

    #[test]
    fn a_reverse_interval_line() {
        let r = PeerReport {
            packets: 1000,
            bytes: 1_400_000,
            seconds: 0.1,
            start_seconds: Some(2.0),
            gbps: Some(0.112),
            pps: Some(10_000.0),
            ..PeerReport::default()
        };
        assert_eq!(
            ReverseInterval(&r).text(),
            "[S->C]     2.00-2.10 s       1000 pkts     1.40 MB  112.0 Mbit/s     10000 pps (receiver side)"
        );
        let v: Value = serde_json::from_str(&ReverseInterval(&r).json()).unwrap();
        assert_eq!(
            (v["event"].as_str(), v["direction"].as_str()),
            (Some("interval"), Some("server_to_client"))
        );
    }
}
