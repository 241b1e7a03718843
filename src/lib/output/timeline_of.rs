//! What `udp_client --plot` draws, gathered from a finished run: the
//! throughput of each direction per interval, the queue delay where this
//! client measured it, and the probes' round trips, on the probes' clock
//! (0 when probing began; the load starts after the idle phase).
//!
//! Why an upload shows no queue delay per interval: the server measures
//! it, and tells only its run's figures in its answer; the probes' round
//! trips show the queue filling all the same.

use super::timeline::{Timeline, TimelinePoint, TimelineSeries};
use crate::client::duplex::DuplexReport;
use crate::client::rtt::RttRecord;
use crate::client::RunReport;
use crate::meter::account::PeerReport;
use crate::stats::SendInterval;

/// An upload: the sending threads' intervals, summed by their index.
fn upload_series(r: &RunReport, load_start: f64) -> TimelineSeries {
    let mut sums: Vec<SendInterval> = Vec::new();
    for c in &r.clients {
        for (i, iv) in c.intervals.iter().enumerate() {
            if sums.len() <= i {
                sums.push(*iv);
            } else {
                let s = &mut sums[i];
                s.end = s.end.max(iv.end);
                s.bytes += iv.bytes;
                s.gbps = match (s.gbps, iv.gbps) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                };
            }
        }
    }
    TimelineSeries {
        label: "client to server (sent)".into(),
        points: sums
            .iter()
            .map(|s| TimelinePoint {
                t: load_start + s.end,
                gbps: s.gbps,
                ..TimelinePoint::default()
            })
            .collect(),
    }
}

/// A reverse stream: the intervals this client received, in order.
fn reverse_series(intervals: &[PeerReport], load_start: f64) -> TimelineSeries {
    let mut t = load_start;
    let points = intervals
        .iter()
        .map(|r| {
            t += r.seconds;
            TimelinePoint {
                t,
                gbps: r.gbps,
                queue_p50_ms: r.queue_delay_ms.map(|q| q.p50),
                queue_p99_ms: r.queue_delay_ms.map(|q| q.p99),
            }
        })
        .collect();
    TimelineSeries {
        label: "server to client (received)".into(),
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
    }
}

/// An upload run's timeline.
pub fn of_upload(r: &RunReport, probes: &RttRecord) -> Timeline {
    let title = format!("udp_client to {}: upload", r.server_addr);
    frame(title, probes, vec![upload_series(r, probes.load_start)])
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
    let merged: Vec<PeerReport> = received
        .chunks(streams)
        .map(|group| {
            let mut sum = group[0].clone();
            sum.gbps = group.iter().map(|g| g.gbps).sum();
            sum
        })
        .collect();
    directions.push(reverse_series(&merged, probes.load_start));
    let what = if r.upload.is_some() {
        "both directions"
    } else {
        "reverse (-R)"
    };
    let server = r
        .reverse
        .first()
        .map_or_else(String::new, |d| format!(" (session {})", d.session));
    frame(format!("udp_client{server}: {what}"), probes, directions)
}
