//! What `udp_client --plot` draws, gathered from a finished run: per
//! interval, what each direction sent (where this client knows it), what
//! arrived, the share lost and the queue delay, and the probes' round
//! trips, on the probes' clock (0 when probing began; the load starts
//! after the idle phase).
//!
//! Why both plots have the same lines: an upload's received side is the
//! server's count of what arrived of each interval this client sent
//! ([`crate::client::intervals`]), a reverse stream's is this client's
//! own count; either way a direction is sent, received, lost, and
//! queue delay p50 and p99. A reverse stream's sending is the server's,
//! not known per interval here, so it has no sent line.

use super::timeline::{Timeline, TimelinePoint, TimelineSeries};
use crate::client::duplex::DuplexReport;
use crate::client::intervals::{received_per_interval, Received};
use crate::client::rtt::RttRecord;
use crate::client::RunReport;
use crate::meter::account::PeerReport;
use crate::stats::{SendInterval, MIN_RATE_SPAN};
use std::collections::HashMap;

/// One client interval: what it sent, and what arrived of it when known.
type Sent = (SendInterval, Option<Received>);

/// A rate over `span` seconds, unknown under [`MIN_RATE_SPAN`].
fn gbps(bytes: u64, span: f64) -> Option<f64> {
    (span >= MIN_RATE_SPAN.as_secs_f64()).then(|| crate::units::gbps(bytes, span))
}

/// An upload: every client's intervals, with what arrived of each as its
/// server counted it, summed by their index (the clients' intervals
/// close together). What arrived of an index is known only when it is
/// for every client that has one; its queue delay is the worst any
/// client's data saw.
fn upload_series(r: &RunReport, load_start: f64) -> TimelineSeries {
    let mut sums: Vec<Sent> = Vec::new();
    for c in &r.clients {
        let received = match &c.server_intervals {
            Some(server) => received_per_interval(&c.intervals, server),
            None => vec![None; c.intervals.len()],
        };
        for (i, (iv, got)) in c.intervals.iter().zip(received).enumerate() {
            let Some((s, sum)) = sums.get_mut(i) else {
                sums.push((*iv, got));
                continue;
            };
            s.end = s.end.max(iv.end);
            s.packets += iv.packets;
            s.bytes += iv.bytes;
            s.gbps = either(s.gbps, iv.gbps, |a, b| a + b);
            *sum = sum.zip(got).map(|(a, b)| Received {
                packets: a.packets + b.packets,
                bytes: a.bytes + b.bytes,
                queue_p50_ms: either(a.queue_p50_ms, b.queue_p50_ms, f64::max),
                queue_p99_ms: either(a.queue_p99_ms, b.queue_p99_ms, f64::max),
            });
        }
    }
    let point = |(s, got): &Sent| TimelinePoint {
        t: load_start + s.end,
        sent_gbps: s.gbps,
        received_gbps: got.and_then(|g| gbps(g.bytes, s.end - s.start)),
        loss_percent: got.filter(|_| s.packets > 0).map(|g| {
            let lost = s.packets.saturating_sub(g.packets);
            lost as f64 * 100.0 / s.packets as f64
        }),
        queue_p50_ms: got.and_then(|g| g.queue_p50_ms),
        queue_p99_ms: got.and_then(|g| g.queue_p99_ms),
    };
    TimelineSeries {
        label: "client to server".into(),
        points: sums.iter().map(point).collect(),
    }
}

/// Both combined with `both`, or whichever is known.
fn either<T>(a: Option<T>, b: Option<T>, both: impl FnOnce(T, T) -> T) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(both(a, b)),
        (a, b) => a.or(b),
    }
}

/// Why an upload has no received line, when it has none.
fn upload_note(r: &RunReport) -> Option<String> {
    let kept = |c: &crate::client::ClientReport| c.server_intervals.is_some();
    if r.clients.is_empty() || r.clients.iter().any(kept) {
        return None;
    }
    let why = if r.settings.no_server {
        "--no-server: nothing asked the receiver"
    } else if r.server.is_none() {
        "the server did not answer"
    } else if r.settings.interval.is_none_or(|i| i < 0.01) {
        "a server keeps intervals of 10 ms or more (--interval)"
    } else {
        "the server kept none: a udp_server of an earlier release?"
    };
    Some(format!(
        "client to server: what arrived per interval is unknown ({why}); the sent line is this client's count"
    ))
}

/// A reverse stream: the intervals this client received, in order, `per`
/// streams at a time (one reverse stream's, or several interleaved: they
/// are drawn as one line of their sum per interval). An interval's loss
/// is what its report's cumulative loss grew by, over that and what
/// arrived (RFC 3550's fraction lost, per interval).
fn reverse_series(intervals: &[PeerReport], per: usize, load_start: f64) -> TimelineSeries {
    let mut before: HashMap<Option<&str>, u64> = HashMap::new();
    let mut t = load_start;
    let points = intervals
        .chunks(per.max(1))
        .map(|group| {
            t += group[0].seconds;
            let (mut packets, mut lost, mut loss_known) = (0u64, 0u64, true);
            for r in group {
                packets += r.packets;
                match r.lost {
                    Some(now) => {
                        let was = before.insert(r.session.as_deref(), now).unwrap_or(0);
                        lost += now.saturating_sub(was);
                    }
                    None => loss_known = false,
                }
            }
            let sum = |f: fn(&PeerReport) -> Option<f64>| group.iter().map(f).sum();
            let worst =
                |f: fn(&PeerReport) -> Option<f64>| group.iter().filter_map(f).reduce(f64::max);
            TimelinePoint {
                t,
                sent_gbps: None,
                received_gbps: sum(|r| r.gbps),
                loss_percent: (loss_known && packets + lost > 0)
                    .then(|| lost as f64 * 100.0 / (packets + lost) as f64),
                queue_p50_ms: worst(|r| r.queue_delay_ms.map(|q| q.p50)),
                queue_p99_ms: worst(|r| r.queue_delay_ms.map(|q| q.p99)),
            }
        })
        .collect();
    TimelineSeries {
        label: "server to client".into(),
        points,
    }
}

fn frame(title: String, probes: &RttRecord, directions: Vec<TimelineSeries>) -> Timeline {
    Timeline {
        title,
        directions,
        rtt: probes.points.clone(),
        idle_rtt_ms: probes.figures.and_then(|f| f.idle_rtt_ms),
        load_start: probes.load_start,
        notes: Vec::new(),
    }
}

/// An upload run's timeline.
pub fn of_upload(r: &RunReport, probes: &RttRecord) -> Timeline {
    let title = format!("udp_client to {}: upload", r.server_addr);
    let mut t = frame(title, probes, vec![upload_series(r, probes.load_start)]);
    t.notes.extend(upload_note(r));
    t
}

/// A `-R` or `--bidir` run's timeline; `received` is every interval this
/// client counted, in order (one reverse stream's, or several
/// interleaved: they are drawn as one line of their sum per interval).
pub fn of_duplex(r: &DuplexReport, received: &[PeerReport], probes: &RttRecord) -> Timeline {
    let mut directions = Vec::new();
    if let Some(u) = &r.upload {
        directions.push(upload_series(u, probes.load_start));
    }
    let streams = r.reverse.len().max(1);
    directions.push(reverse_series(received, streams, probes.load_start));
    let what = if r.upload.is_some() {
        "both directions"
    } else {
        "reverse (-R)"
    };
    let server = r
        .reverse
        .first()
        .map_or_else(String::new, |d| format!(" (session {})", d.session));
    let mut t = frame(format!("udp_client{server}: {what}"), probes, directions);
    t.notes.extend(r.upload.as_ref().and_then(upload_note));
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::intervals::ServerIntervals;
    use crate::client::{ClientReport, ServerView};
    use crate::stats::delay::Spread;
    use crate::wire::IntervalFigures;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    /// Three intervals of one second, 1000 datagrams of 1000 bytes each.
    fn client(server: Option<Vec<IntervalFigures>>) -> ClientReport {
        let sent = |i: u64| SendInterval {
            start: i as f64,
            end: i as f64 + 1.0,
            packets: 1000,
            bytes: 1_000_000,
            gbps: Some(0.008),
        };
        let mut c = ClientReport::default();
        c.intervals = (0..3).map(sent).collect();
        c.server_intervals = server.map(|intervals| ServerIntervals {
            every: Duration::from_secs(1),
            intervals,
            complete: true,
        });
        c
    }

    /// What arrived of interval `i`: `packets` of its 1000, delayed.
    fn arrived(i: u64, packets: u64, p50_ms: u64, p99_ms: u64) -> IntervalFigures {
        IntervalFigures {
            packets,
            bytes: packets * 1000,
            lowest_seq: i * 1000,
            queue_p50_ns: p50_ms * MS,
            queue_p99_ns: p99_ms * MS,
        }
    }

    /// A run with one-second intervals, answered by its server.
    fn upload(clients: Vec<ClientReport>) -> RunReport {
        let mut r = RunReport {
            server_addr: "192.0.2.1:5201".into(),
            server: Some(ServerView::default()),
            clients,
            ..RunReport::default()
        };
        r.settings.interval = Some(1.0);
        r
    }

    fn probes() -> RttRecord {
        RttRecord {
            load_start: 0.5,
            ..RttRecord::default()
        }
    }

    #[test]
    fn an_upload_draws_what_arrived_the_loss_and_the_queue_delay() {
        // Two clients: the second lost a third of its second interval,
        // and its data queued longer then.
        let a = client(Some(vec![
            arrived(0, 1000, 1, 2),
            arrived(1, 1000, 1, 3),
            arrived(2, 1000, 1, 2),
        ]));
        let b = client(Some(vec![
            arrived(0, 1000, 1, 2),
            arrived(1, 658, 90, 100),
            arrived(2, 1000, 2, 4),
        ]));
        let t = of_upload(&upload(vec![a, b]), &probes());
        assert!(t.notes.is_empty(), "{:?}", t.notes);
        let up = &t.directions[0];
        assert_eq!(up.label, "client to server");
        let p = up.points[1];
        assert_eq!(p.t, 2.5, "the interval's end, on the probes' clock");
        assert_eq!(p.sent_gbps, Some(0.016));
        assert!((p.received_gbps.unwrap() - 0.013264).abs() < 1e-9, "{p:?}");
        assert!((p.loss_percent.unwrap() - 17.1).abs() < 1e-9, "{p:?}");
        assert_eq!((p.queue_p50_ms, p.queue_p99_ms), (Some(90.0), Some(100.0)));
        assert_eq!(up.points[0].loss_percent, Some(0.0));
        // Drawn: the received and queue delay series, a point per interval.
        let svg = super::super::timeline::render_svg(&t).unwrap();
        for label in [
            "client to server, sent",
            "client to server, received",
            "client to server, lost",
            "client to server, queue delay p50",
            "client to server, queue delay p99",
        ] {
            assert!(
                svg.contains(&format!(">{label}<")) || svg.contains(label),
                "no {label:?}"
            );
        }
        // The solid lines of the direction's colour (the dashed p99 is
        // drawn dash by dash, thinner).
        let received = svg
            .split("<polyline ")
            .skip(1)
            .map(|e| &e[..e.find('>').unwrap()])
            .filter(|e| e.contains("stroke=\"#1F77B4\"") && e.contains("stroke-width=\"2\""))
            .map(|e| {
                let points = e.split("points=\"").nth(1).unwrap();
                points[..points.find('"').unwrap()]
                    .split_whitespace()
                    .count()
            })
            .filter(|&n| n == 3)
            .count();
        assert_eq!(received, 3, "received, lost and p50: three points each");
    }

    #[test]
    fn an_upload_without_the_servers_intervals_says_why() {
        // One client kept none: the sum's received side is unknown.
        let a = client(Some(vec![arrived(0, 1000, 1, 2)]));
        let t = of_upload(&upload(vec![a, client(None)]), &probes());
        assert!(t.directions[0]
            .points
            .iter()
            .all(|p| p.received_gbps.is_none()));
        assert!(t.directions[0].points.iter().all(|p| p.sent_gbps.is_some()));
        assert!(t.notes.is_empty(), "one client's came");
        let t = of_upload(&upload(vec![client(None)]), &probes());
        assert_eq!(t.notes.len(), 1);
        assert!(t.notes[0].contains("earlier release"), "{:?}", t.notes);
        let mut silent = upload(vec![client(None)]);
        silent.server = None;
        let t = of_upload(&silent, &probes());
        assert!(t.notes[0].contains("did not answer"), "{:?}", t.notes);
    }

    #[test]
    fn a_reverse_streams_loss_is_what_its_count_of_lost_grew_by() {
        // Two streams, interleaved per interval: the second lost 10 of
        // 100 in the second interval (its cumulative loss 0, 10, 10).
        let report = |session: &str, packets: u64, lost: u64, p50: f64| PeerReport {
            session: Some(session.into()),
            packets,
            seconds: 1.0,
            gbps: Some(0.001),
            lost: Some(lost),
            queue_delay_ms: Some(Spread {
                p50,
                p90: p50,
                p99: p50 * 2.0,
                max: p50 * 2.0,
            }),
            ..PeerReport::default()
        };
        let received = [
            report("a", 100, 0, 1.0),
            report("b", 100, 0, 1.0),
            report("a", 100, 0, 1.0),
            report("b", 90, 10, 30.0),
            report("a", 100, 0, 2.0),
            report("b", 100, 10, 1.0),
        ];
        let s = reverse_series(&received, 2, 0.5);
        let loss: Vec<Option<f64>> = s.points.iter().map(|p| p.loss_percent).collect();
        assert_eq!(loss, [Some(0.0), Some(5.0), Some(0.0)]);
        let p = s.points[1];
        assert_eq!(
            (p.t, p.received_gbps, p.sent_gbps),
            (2.5, Some(0.002), None)
        );
        assert_eq!((p.queue_p50_ms, p.queue_p99_ms), (Some(30.0), Some(60.0)));
        // A -R plot and an upload's draw the same kinds of line.
        let duplex = DuplexReport {
            streams: Vec::new(),
            upload: Some(upload(vec![client(Some(vec![arrived(0, 1000, 1, 2)]))])),
            reverse: Vec::new(),
            interrupted: None,
        };
        let t = of_duplex(&duplex, &received[..2], &probes());
        assert_eq!(t.directions.len(), 2);
        assert!(t
            .directions
            .iter()
            .all(|d| d.points[0].received_gbps.is_some()));
        assert!(t
            .directions
            .iter()
            .all(|d| d.points[0].loss_percent.is_some()));
        assert!(t
            .directions
            .iter()
            .all(|d| d.points[0].queue_p99_ms.is_some()));
    }
}
