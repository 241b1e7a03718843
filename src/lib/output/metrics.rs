//! `udp_server --metrics ADDR`: the Prometheus (OpenMetrics) text
//! exposition of a [`View`], served over HTTP by [`super::metrics_http`].
//!
//! The text is written by the Prometheus project's own client
//! (`prometheus-client`): a [`Collector`] reads the view a scrape took, so
//! there are no metric families to keep in step with the peer table, and
//! a peer that ages out simply is not in the next view. Names carry the
//! `netspeed_` prefix and their unit; `docs/metrics.md` defines each.

use crate::server::metrics::{PeerSample, View};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::fmt;

/// What `prometheus-client`'s text encoder writes.
pub const CONTENT_TYPE_OPENMETRICS: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The one path served.
pub const PATH: &str = "/metrics";

/// The exposition of `view`, `# EOF` included.
pub fn exposition(view: &View) -> String {
    exposition_with(view, None)
}

/// [`exposition`] with `endpoint`'s families (the HTTP endpoint's own
/// counts) after the server's.
pub fn exposition_with(view: &View, endpoint: Option<Box<dyn Collector>>) -> String {
    let mut registry = Registry::with_prefix("netspeed");
    registry.register_collector(Box::new(Exposition(view.clone())));
    if let Some(endpoint) = endpoint {
        registry.register_collector(endpoint);
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)
        .expect("writing to a String cannot fail");
    text
}

#[derive(Debug)]
struct Exposition(View);

/// One unlabelled sample.
fn single(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    metric: impl EncodeMetric,
) -> fmt::Result {
    let family = encoder.encode_descriptor(name, help, unit.as_ref(), metric.metric_type())?;
    metric.encode(family)
}

/// A counter or gauge family with one sample per peer that has a value.
fn per_peer<N: Copy>(
    encoder: &mut DescriptorEncoder,
    peers: &[PeerSample],
    (name, help, unit, kind): (&str, &str, Option<Unit>, MetricType),
    value: impl Fn(&PeerSample) -> Option<N>,
    encode: impl Fn(N, prometheus_client::encoding::MetricEncoder) -> fmt::Result,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, unit.as_ref(), kind)?;
    for peer in peers {
        if let Some(v) = value(peer) {
            let labels = [
                ("peer", peer.peer.as_str()),
                ("session", peer.session.as_str()),
            ];
            encode(v, family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

fn counter_u64(v: u64, e: prometheus_client::encoding::MetricEncoder) -> fmt::Result {
    ConstCounter::new(v).encode(e)
}

fn counter_f64(v: f64, e: prometheus_client::encoding::MetricEncoder) -> fmt::Result {
    ConstCounter::new(v).encode(e)
}

fn gauge_u64(v: u64, e: prometheus_client::encoding::MetricEncoder) -> fmt::Result {
    ConstGauge::new(v).encode(e)
}

fn gauge_f64(v: f64, e: prometheus_client::encoding::MetricEncoder) -> fmt::Result {
    ConstGauge::new(v).encode(e)
}

impl Collector for Exposition {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let v = &self.0;
        let s = &v.server;
        let info = Info::new([
            ("version", v.info.version.to_string()),
            ("method", v.info.method.to_string()),
            ("threads", v.info.threads.to_string()),
        ]);
        single(
            &mut e,
            "build",
            "udp_server's version and receive setup.",
            None,
            info,
        )?;
        single(
            &mut e,
            "receive_buffer",
            "SO_RCVBUF of each receive socket, as the kernel granted it.",
            Some(Unit::Bytes),
            ConstGauge::new(v.info.recv_buffer),
        )?;
        single(
            &mut e,
            "max_peers",
            "--max-peers: unfinished peers tracked at once, and finished peers kept here.",
            None,
            ConstGauge::new(v.info.max_peers as u64),
        )?;
        single(
            &mut e,
            "received_packets",
            "Datagrams counted: data (duplicates included), untagged, late and overflow.",
            None,
            ConstCounter::new(s.packets),
        )?;
        single(
            &mut e,
            "received",
            "Payload bytes of those datagrams.",
            Some(Unit::Bytes),
            ConstCounter::new(s.bytes),
        )?;
        single(
            &mut e,
            "peers",
            "Peers seen (sessions and untagged sources).",
            None,
            ConstCounter::new(s.peers),
        )?;
        single(
            &mut e,
            "peers_finished",
            "Peers and reverse streams finished (a peer_done or stream_done written).",
            None,
            ConstCounter::new(v.peers_finished),
        )?;
        single(
            &mut e,
            "peers_active",
            "Peers not yet finished.",
            None,
            ConstGauge::new(v.active() as u64),
        )?;
        single(
            &mut e,
            "overflow_packets",
            "Datagrams that found the peer table full (--max-peers), counted in bulk.",
            None,
            ConstCounter::new(s.overflow_packets),
        )?;
        single(
            &mut e,
            "late_packets",
            "Datagrams for sessions already finished, in no peer's figures.",
            None,
            ConstCounter::new(s.late_packets),
        )?;
        if let Some(drops) = s.kernel_drops {
            single(
                &mut e,
                "kernel_drops",
                "Drops on the receive socket(s), receive buffer full: datagrams, or GRO buffers of several when GRO is on.",
                None,
                ConstCounter::new(drops),
            )?;
        }
        single(
            &mut e,
            "control_packets",
            "Control messages read (Hello, End, round-trip probes, a reverse stream's Start and Feedback): not in received_packets.",
            None,
            ConstCounter::new(s.control_packets),
        )?;
        {
            let n = &s.not_proven;
            let mut family = e.encode_descriptor(
                "not_proven",
                "Datagrams of sessions never proven (their source never echoed its address cookie), by reason: answered without state, or counted in bulk, never reported one by one.",
                None,
                MetricType::Counter,
            )?;
            for (reason, count) in [
                ("hello", n.hellos),
                ("end_unknown", n.ends_unknown),
                ("end_unproven", n.ends_unproven),
                ("data", n.unproven_packets),
                ("probe", n.probes_unproven),
                ("wrong_version", n.wrong_version),
            ] {
                ConstCounter::new(count).encode(family.encode_family(&[("reason", reason)])?)?;
            }
        }
        single(
            &mut e,
            "answers_limited",
            "Answers refused by a budget (per proven session, per flow, per source address, per source, server-wide).",
            None,
            ConstCounter::new(s.answers_limited),
        )?;
        if let Some(most) = s.recv_buffer_most {
            single(
                &mut e,
                "receive_buffer_peak",
                "The most any receive socket's buffer was seen holding since the server started (SO_MEMINFO rmem_alloc, looked at every millisecond while receiving): against receive_buffer, how close it came to dropping.",
                Some(Unit::Bytes),
                ConstGauge::new(most),
            )?;
        }
        if let Some(cpu) = s.receive_cpu_seconds {
            single(
                &mut e,
                "receive_cpu",
                "CPU time of the receive threads (user and system).",
                Some(Unit::Seconds),
                ConstCounter::new(cpu),
            )?;
        }
        let peers = &v.peers;
        use MetricType::{Counter, Gauge};
        let families = [
            ("peer_packets", "Distinct datagrams received from the peer (peer_done packets).", None, Counter, (|p| Some(p.packets)) as fn(&PeerSample) -> Option<u64>),
            ("peer", "Payload bytes of those datagrams (peer_done bytes).", Some(Unit::Bytes), Counter, |p| Some(p.bytes)),
            ("peer_duplicates", "Datagrams received more than once (peer_done duplicates).", None, Counter, |p| p.duplicates),
            ("peer_reordered", "Datagrams that arrived after a later one (peer_done reordered).", None, Counter, |p| p.reordered),
            ("peer_kernel_drops", "Drops on the peer's receive socket while it was active (peer_done socket_wide_kernel_drops).", None, Counter, |p| p.kernel_drops),
            ("peer_sent", "Payload bytes the server sent the peer in a reverse stream (udp_client -R, --bidir; stream_done sent_bytes).", Some(Unit::Bytes), Counter, |p| p.sent_bytes),
        ];
        for (name, help, unit, kind, value) in families {
            per_peer(&mut e, peers, (name, help, unit, kind), value, counter_u64)?;
        }
        per_peer(
            &mut e,
            peers,
            (
                "peer_cpu",
                "Receive threads' CPU time while the peer was active: its share by datagrams where other peers were active too (peer_done cpu.seconds).",
                Some(Unit::Seconds),
                Counter,
            ),
            |p| p.cpu_seconds,
            counter_f64,
        )?;
        per_peer(
            &mut e,
            peers,
            (
                "peer_lost_packets",
                "Datagrams lost: estimated from sequence numbers until the End arrives (can fall as late datagrams fill holes), then against the sender's total (peer_done lost).",
                None,
                Gauge,
            ),
            |p| p.lost,
            gauge_u64,
        )?;
        for (name, help, value) in [
            (
                "peer_queue_delay_p50",
                "Median time the peer's datagrams waited in queues beyond its fastest datagram, so far (peer_done queue_delay_ms.p50).",
                (|p| p.queue_delay_p50) as fn(&PeerSample) -> Option<f64>,
            ),
            (
                "peer_queue_delay_p99",
                "99th percentile of that wait, so far (peer_done queue_delay_ms.p99).",
                |p| p.queue_delay_p99,
            ),
        ] {
            per_peer(&mut e, peers, (name, help, Some(Unit::Seconds), Gauge), value, gauge_f64)?;
        }
        per_peer(
            &mut e,
            peers,
            (
                "peer_kernel_drops_shared",
                "1 when other traffic shared the peer's receive socket: its kernel drops are not all its own.",
                None,
                Gauge,
            ),
            |p| p.kernel_drops.map(|_| u64::from(p.kernel_drops_shared)),
            gauge_u64,
        )?;
        per_peer(
            &mut e,
            peers,
            (
                "peer_finished",
                "1 once the peer's peer_done was written: its figures are final.",
                None,
                Gauge,
            ),
            |p| Some(u64::from(p.finished)),
            gauge_u64,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::metrics::{ServerInfo, ServerSample};

    fn view() -> View {
        let peer = |peer: &str, session: &str, finished| PeerSample {
            peer: peer.into(),
            session: session.into(),
            packets: 1000,
            bytes: 1_460_000,
            lost: (!session.is_empty()).then_some(3),
            duplicates: (!session.is_empty()).then_some(1),
            reordered: (!session.is_empty()).then_some(2),
            kernel_drops: Some(4),
            kernel_drops_shared: false,
            cpu_seconds: Some(0.012),
            finished,
            sent_bytes: None,
            queue_delay_p50: (!session.is_empty()).then_some(0.0985),
            queue_delay_p99: (!session.is_empty()).then_some(0.1012),
        };
        View {
            info: ServerInfo {
                version: "0.1.0",
                method: "mmsg",
                threads: 1,
                recv_buffer: 425_984,
                max_peers: 4096,
            },
            server: ServerSample {
                packets: 2000,
                bytes: 2_920_000,
                peers: 2,
                overflow_packets: 0,
                late_packets: 0,
                kernel_drops: Some(4),
                receive_cpu_seconds: Some(0.5),
                control_packets: 7,
                recv_buffer_most: Some(150_000),
                not_proven: crate::meter::account::NotProven {
                    hellos: 9,
                    ..Default::default()
                },
                answers_limited: 3,
            },
            peers_finished: 1,
            peers: vec![
                peer("127.0.0.1:5000", "", false),
                peer("127.0.0.1:5001", "00000000000000ab", true),
            ],
        }
    }

    fn line<'a>(text: &'a str, start: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line starting {start}:\n{text}"))
    }

    #[test]
    fn the_exposition_names_each_series_with_prefix_unit_and_labels() {
        let text = exposition(&view());
        assert!(text.ends_with("# EOF\n"), "{text}");
        let tagged = r#"{peer="127.0.0.1:5001",session="00000000000000ab"}"#;
        let untagged = r#"{peer="127.0.0.1:5000",session=""}"#;
        for (series, value) in [
            (format!("netspeed_peer_packets_total{tagged}"), "1000"),
            (format!("netspeed_peer_bytes_total{tagged}"), "1460000"),
            (format!("netspeed_peer_duplicates_total{tagged}"), "1"),
            (format!("netspeed_peer_reordered_total{tagged}"), "2"),
            (format!("netspeed_peer_kernel_drops_total{tagged}"), "4"),
            (format!("netspeed_peer_cpu_seconds_total{tagged}"), "0.012"),
            (format!("netspeed_peer_lost_packets{tagged}"), "3"),
            (
                format!("netspeed_peer_queue_delay_p50_seconds{tagged}"),
                "0.0985",
            ),
            (
                format!("netspeed_peer_queue_delay_p99_seconds{tagged}"),
                "0.1012",
            ),
            (format!("netspeed_peer_finished{tagged}"), "1"),
            (format!("netspeed_peer_finished{untagged}"), "0"),
            (format!("netspeed_peer_bytes_total{untagged}"), "1460000"),
            ("netspeed_receive_buffer_bytes".into(), "425984"),
            ("netspeed_received_packets_total".into(), "2000"),
            ("netspeed_received_bytes_total".into(), "2920000"),
            ("netspeed_peers_total".into(), "2"),
            ("netspeed_peers_finished_total".into(), "1"),
            ("netspeed_peers_active".into(), "1"),
            ("netspeed_kernel_drops_total".into(), "4"),
            ("netspeed_receive_cpu_seconds_total".into(), "0.5"),
            ("netspeed_control_packets_total".into(), "7"),
            ("netspeed_receive_buffer_peak_bytes".into(), "150000"),
            (r#"netspeed_not_proven_total{reason="hello"}"#.into(), "9"),
            (
                r#"netspeed_not_proven_total{reason="end_unknown"}"#.into(),
                "0",
            ),
            ("netspeed_answers_limited_total".into(), "3"),
        ] {
            assert_eq!(
                line(&text, &format!("{series} ")),
                format!("{series} {value}")
            );
        }
        assert!(
            text.contains("# TYPE netspeed_peer_bytes counter\n"),
            "{text}"
        );
        assert!(
            text.contains("# UNIT netspeed_peer_bytes bytes\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE netspeed_peer_lost_packets gauge\n"),
            "{text}"
        );
        assert!(
            text.contains(r#"netspeed_build_info{version="0.1.0",method="mmsg",threads="1"} 1"#)
        );
        // Only reverse streams have bytes sent.
        assert!(!text.contains("netspeed_peer_sent_bytes_total{"), "{text}");
        // Untagged peers have no sequence figures: no sample, not a zero.
        assert!(!text.contains(&format!("netspeed_peer_duplicates_total{untagged}")));
        assert!(!text.contains(&format!("netspeed_peer_lost_packets{untagged}")));
    }

    #[test]
    fn figures_the_kernel_does_not_give_are_left_out() {
        let mut v = view();
        v.server.kernel_drops = None;
        v.server.receive_cpu_seconds = None;
        v.peers.clear();
        let text = exposition(&v);
        assert!(!text.contains("netspeed_kernel_drops"), "{text}");
        assert!(!text.contains("netspeed_receive_cpu"), "{text}");
        assert!(!text.contains("netspeed_peer_bytes_total{"), "{text}");
        assert!(text.contains("netspeed_peers_active 0\n"), "{text}");
    }

    #[test]
    fn a_reverse_stream_shows_what_was_sent() {
        let mut v = view();
        v.peers.push(PeerSample::of_stream(
            "127.0.0.1:5002".into(),
            "00000000000000ac".into(),
            2_000_000,
            Some((1990, 1_990_000)),
            true,
        ));
        let text = exposition(&v);
        let stream = r#"{peer="127.0.0.1:5002",session="00000000000000ac"}"#;
        assert_eq!(
            line(&text, &format!("netspeed_peer_sent_bytes_total{stream} ")),
            format!("netspeed_peer_sent_bytes_total{stream} 2000000")
        );
        assert_eq!(
            line(&text, &format!("netspeed_peer_bytes_total{stream} ")),
            format!("netspeed_peer_bytes_total{stream} 1990000")
        );
        assert!(
            text.contains("# UNIT netspeed_peer_sent_bytes bytes\n"),
            "{text}"
        );
    }
}
