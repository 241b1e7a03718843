//! `udp_client --plot` on an upload (issue 42): the picture has what was
//! sent, what arrived, the loss and the queue delay (p50 and p99) per
//! interval, and its legends cover no data.
//!
//! The real binaries on loopback, through the scripted relay of
//! `common::impair`: it drops a block of data datagrams in one interval
//! and holds another block 12 ms in a later one, and says which sequence
//! numbers it dropped. The witnesses are independent of the plot: what
//! the client sent per interval (its JSON), which datagrams the relay
//! dropped, and the server's own JSON (its `interval` lines, which add
//! up to its `peer_done`, and the `peer_done` itself). The SVG is read
//! back into numbers through its own axis labels.

mod common;

use common::impair::{kind, Action, Pick};
use common::udp::{args_to, client, u, Server};
use common::TempDir;
use serde_json::Value;
use std::time::Duration;

/// Every `<tag ...>` element's attributes, and its text (for `<text>`).
fn elements<'s>(svg: &'s str, tag: &str) -> Vec<(&'s str, &'s str)> {
    let open = format!("<{tag} ");
    svg.split(&open)
        .skip(1)
        .map(|e| {
            let end = e.find('>').expect("a whole element");
            let body = e[end + 1..].split('<').next().unwrap_or("").trim();
            (&e[..end], body)
        })
        .collect()
}

fn attr<'e>(element: &'e str, name: &str) -> Option<&'e str> {
    let key = format!(" {name}=\"");
    let at = format!(" {element}").find(&key)?;
    let rest = &element[at + key.len() - 1..];
    Some(&rest[..rest.find('"')?])
}

fn num(element: &str, name: &str) -> f64 {
    attr(element, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number {name} in {element}"))
}

/// One panel of the picture: its vertical extent (pixels, from its
/// caption to the next one's) and its y axis (value = a + b × pixel),
/// read off its tick labels.
#[derive(Debug)]
struct Panel {
    top: f64,
    bottom: f64,
    a: f64,
    b: f64,
    /// One pixel, in the axis's unit.
    px: f64,
}

fn panels(svg: &str, captions: &[&str]) -> Vec<Panel> {
    let texts = elements(svg, "text");
    let caption_y = |c: &str| {
        let (e, _) = texts
            .iter()
            .find(|(_, t)| *t == c)
            .unwrap_or_else(|| panic!("no panel {c:?}"));
        num(e, "y")
    };
    let tops: Vec<f64> = captions.iter().map(|c| caption_y(c)).collect();
    (0..tops.len())
        .map(|i| {
            let (top, bottom) = (tops[i], tops.get(i + 1).copied().unwrap_or(f64::MAX));
            // The y axis's labels: right-aligned numbers in the panel.
            let ticks: Vec<(f64, f64)> = texts
                .iter()
                .filter(|(e, _)| attr(e, "text-anchor") == Some("end"))
                .filter_map(|(e, t)| Some((num(e, "y"), t.parse::<f64>().ok()?)))
                .filter(|&(y, _)| y > top && y < bottom)
                .collect();
            assert!(ticks.len() >= 2, "{:?}: ticks {ticks:?}", captions[i]);
            let (lo, hi) = (ticks[0], ticks[ticks.len() - 1]);
            let b = (hi.1 - lo.1) / (hi.0 - lo.0);
            Panel {
                top,
                bottom,
                a: lo.1 - b * lo.0,
                b,
                px: b.abs(),
            }
        })
        .collect()
}

/// The polylines drawn with this stroke colour and width.
fn polylines(svg: &str, stroke: &str, width: &str) -> Vec<Vec<(f64, f64)>> {
    elements(svg, "polyline")
        .iter()
        .filter(|(e, _)| {
            attr(e, "stroke") == Some(stroke) && attr(e, "stroke-width") == Some(width)
        })
        .map(|(e, _)| {
            attr(e, "points")
                .unwrap()
                .split_whitespace()
                .map(|p| {
                    let (x, y) = p.split_once(',').unwrap();
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect()
        })
        .collect()
}

/// The one line of `lines` (of more than two points: not a legend's
/// sample) inside `panel`, as values.
fn series(lines: &[Vec<(f64, f64)>], panel: &Panel, what: &str) -> Vec<f64> {
    let inside: Vec<&Vec<(f64, f64)>> = lines
        .iter()
        .filter(|l| l.len() > 2 && l.iter().all(|p| p.1 > panel.top && p.1 < panel.bottom))
        .collect();
    assert_eq!(inside.len(), 1, "{what}: {lines:?}");
    inside[0].iter().map(|p| panel.a + panel.b * p.1).collect()
}

/// The legends' boxes (black, unfilled): [left, top, right, bottom].
fn legend_boxes(svg: &str) -> Vec<[f64; 4]> {
    elements(svg, "rect")
        .iter()
        .filter(|(e, _)| attr(e, "stroke") == Some("#000000") && attr(e, "fill") == Some("none"))
        .map(|(e, _)| {
            let (x, y) = (num(e, "x"), num(e, "y"));
            [x, y, x + num(e, "width"), y + num(e, "height")]
        })
        .collect()
}

/// The first colour of the plots' palette: the upload's received, loss
/// and delay lines; its sent line takes the second.
const MINE: &str = "#1F77B4";
const SENT: &str = "#FF7F0E";

#[test]
fn an_upload_plot_draws_what_arrived_the_loss_and_the_queue_delay_per_interval() {
    let server = Server::start_args(&[
        "--listen",
        "127.0.0.1:0",
        "--interval",
        "250ms",
        "--recv-buffer-size",
        "4M",
    ]);
    // 500 datagrams a second, intervals of 250 ms (about 125 each): 75
    // dropped in the second interval; 93 held 12 ms in the third (most
    // of it, wherever its edges fall within a few datagrams, and let go
    // before the fourth begins).
    let mut rules: Vec<(Pick, Action)> = (150..225)
        .map(|n| (Pick::to_server(kind::DATA, n), Action::Drop))
        .collect();
    rules.extend((262..355).map(|n| {
        (
            Pick::to_server(kind::DATA, n),
            Action::Delay(Duration::from_millis(12)),
        )
    }));
    let relay = server.relay(&rules);
    let dir = TempDir::new("upload-plot");
    let svg_path = dir.path().join("up.svg");
    let rest = format!(
        "-b 1000 -n 600 --rate 4Mbit -i 250ms --idle-probe 200ms --plot {}",
        svg_path.display()
    );
    let report = client(&args_to(&relay.addr().to_string(), &rest));
    let counts = relay.finish();
    let c = &report["clients"][0];
    let session = c["session"].as_str().unwrap();
    let done = server.done_for(session);
    let events = server.stop();

    // The witnesses agree with each other: the relay dropped 75, the
    // server counted the rest, and its interval lines add up to it.
    let dropped = counts.dropped_seqs().to_vec();
    assert_eq!(dropped.len(), 75, "{counts:?}");
    assert_eq!(u(&done, "packets"), 600 - 75, "{done}");
    let server_intervals: Vec<&Value> = events
        .iter()
        .filter(|v| v["event"] == "interval" && v["session"] == session)
        .collect();
    let by_intervals: u64 = server_intervals.iter().map(|v| u(v, "packets")).sum();
    assert_eq!(by_intervals, u(&done, "packets"), "{server_intervals:?}");

    // What each of the client's intervals sent (sequence numbers from 0
    // in order), and what of it arrived: sent less the relay's drops.
    let sent: Vec<(u64, f64)> = c["intervals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|iv| {
            let span = iv["end"].as_f64().unwrap() - iv["start"].as_f64().unwrap();
            (u(iv, "packets"), span)
        })
        .collect();
    let mut first = 0;
    let expected: Vec<(u64, u64, f64)> = sent
        .iter()
        .map(|&(packets, span)| {
            let range = first..first + packets;
            first += packets;
            let lost = dropped.iter().filter(|s| range.contains(s)).count() as u64;
            (packets, packets - lost, span)
        })
        .collect();
    let arrived: u64 = expected.iter().map(|e| e.1).sum();
    assert_eq!(
        arrived,
        u(&done, "packets"),
        "the server's count, interval by interval"
    );
    assert!(
        expected.iter().any(|e| e.1 < e.0 / 2),
        "one interval lost most of its datagrams: {expected:?}"
    );

    let svg = std::fs::read_to_string(&svg_path).expect("the plot was written");
    let texts: Vec<&str> = elements(&svg, "text").iter().map(|t| t.1).collect();
    for label in [
        "client to server, sent",
        "client to server, received",
        "client to server, lost",
        "client to server, queue delay p50",
        "client to server, queue delay p99",
        "round trip (probes)",
    ] {
        assert!(texts.contains(&label), "no {label:?} in {texts:?}");
    }
    let captions = [
        "throughput (Gbit/s)",
        "datagrams lost (% per interval)",
        "delay (ms)",
    ];
    let [rates, losses, delays]: [Panel; 3] = panels(&svg, &captions).try_into().unwrap();

    // Received and lost, per interval, within a pixel and a half of the
    // witnesses' figures. (An interval too short for a rate has none:
    // the last, when sending stopped just past a boundary.)
    let received = series(&polylines(&svg, MINE, "2"), &rates, "received");
    let with_rate: Vec<&(u64, u64, f64)> = expected.iter().filter(|e| e.2 >= 0.001).collect();
    assert_eq!(
        received.len(),
        with_rate.len(),
        "{received:?} vs {expected:?}"
    );
    for (got, &&(_, arrived, span)) in received.iter().zip(&with_rate) {
        let want = arrived as f64 * 1000.0 * 8.0 / span / 1e9;
        assert!(
            (got - want).abs() <= 1.5 * rates.px,
            "received {got} Gbit/s, the server counted {want}: {received:?} vs {expected:?}"
        );
    }
    let sent_line = series(&polylines(&svg, SENT, "1"), &rates, "sent");
    assert_eq!(sent_line.len(), received.len());
    let loss = series(&polylines(&svg, MINE, "2"), &losses, "lost");
    assert_eq!(loss.len(), expected.len());
    for (got, &(packets, arrived, _)) in loss.iter().zip(&expected) {
        let want = (packets - arrived) as f64 * 100.0 / packets as f64;
        assert!(
            (got - want).abs() <= 1.5 * losses.px,
            "lost {got} %, expected {want}: {loss:?} vs {expected:?}"
        );
    }

    // The queue delay: a p50 point for every interval; 12 ms where the
    // relay held most of an interval's datagrams (and p99 at least
    // that), little elsewhere; nothing above the server's own maximum.
    let p50 = series(&polylines(&svg, MINE, "2"), &delays, "queue delay p50");
    assert_eq!(p50.len(), expected.len(), "{p50:?}");
    let held = 2;
    assert!(
        (8.0..30.0).contains(&p50[held]),
        "the held interval's p50: {p50:?}"
    );
    assert!(p50[0] < 5.0, "nothing held in the first: {p50:?}");
    let column = legend_boxes(&svg)
        .iter()
        .map(|b| b[0])
        .fold(f64::MAX, f64::min);
    let p99_dashes = polylines(&svg, MINE, "1");
    let p99_top = p99_dashes
        .iter()
        .flatten()
        .filter(|p| p.0 < column && p.1 > delays.top && p.1 < delays.bottom)
        .map(|p| delays.a + delays.b * p.1)
        .fold(f64::MIN, f64::max);
    assert!(
        p99_top >= p50[held] - 1.5 * delays.px,
        "p99 drawn: {p99_top}"
    );
    let server_max = done["queue_delay_ms"]["max"]
        .as_f64()
        .expect("a queue delay");
    assert!(
        p99_top <= server_max + 1.5 * delays.px,
        "p99 {p99_top} ms above the server's max {server_max} ms"
    );

    // The legends: boxes to the right of every point drawn, none inside.
    let boxes = legend_boxes(&svg);
    assert_eq!(boxes.len(), 3, "a legend per panel");
    let data: Vec<(f64, f64)> = [MINE, SENT]
        .iter()
        .flat_map(|c| [polylines(&svg, c, "1"), polylines(&svg, c, "2")])
        .flatten()
        .filter(|l| l.len() > 2)
        .flatten()
        .collect();
    let rightmost = data.iter().map(|p| p.0).fold(f64::MIN, f64::max);
    for b in &boxes {
        assert!(
            b[0] > rightmost,
            "legend {b:?} left of a point at x {rightmost}"
        );
    }
}
