//! One run (upload, reverse or both directions) as an SVG timeline:
//! throughput above, delay below, on one shared time axis.
//!
//! Why this shape: the queue filling as the rate climbs is what to see,
//! and it shows only with the two lined up in time: where the throughput
//! flattens, the delay starts to rise. The delay panel draws the queue
//! delay's median and its 99th percentile because the tail is what calls
//! and games feel; a low median can hide a p99 of hundreds of
//! milliseconds. The probes' round trips are dots, set against the idle
//! round trip measured before the load, so the delay the load added reads
//! straight off the picture. A missing value is a gap, never a zero. The
//! conventions (colours, ranges, labels, the error) are [`super::sockbench::plot`]'s.

use super::plot::{err, range, trim_number, COLORS};
use crate::error::Result;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use std::path::Path;

/// One interval of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TimelinePoint {
    /// Seconds since the run started, at the interval's end.
    pub t: f64,
    /// Received (or, for an upload seen from the client, sent) rate in Gbit/s; None when unknown.
    pub gbps: Option<f64>,
    /// Queue delay of the data in this interval (ms): median and 99th percentile; None when unknown.
    pub queue_p50_ms: Option<f64>,
    pub queue_p99_ms: Option<f64>,
}

/// One direction's intervals, labelled e.g. "client to server" or "server to client".
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TimelineSeries {
    pub label: String,
    pub points: Vec<TimelinePoint>,
}

/// Round trips of the probes: (seconds since the run started, RTT in ms), one per answered probe.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Timeline {
    pub title: String,
    pub directions: Vec<TimelineSeries>,
    pub rtt: Vec<(f64, f64)>,
    /// The median idle round trip before the load (ms), drawn as a dashed horizontal reference line when known.
    pub idle_rtt_ms: Option<f64>,
    /// Seconds since the run started when the load began (after the idle probe phase); drawn as a vertical marker when > 0.
    pub load_start: f64,
}

const SIZE: (u32, u32) = (1000, 700);
/// The probes' dots are grey, and directions take the seven colours before it.
const RTT_COLOR: RGBColor = COLORS[7];
const DIRECTION_COLORS: usize = 7;

type Panel<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Writes [`render_svg`]'s picture to `path`.
pub fn write_svg(path: &Path, timeline: &Timeline) -> Result<()> {
    let svg = render(timeline).map_err(|e| err(path, e))?;
    std::fs::write(path, svg).map_err(|e| err(path, e))
}

/// The same picture as an SVG string (write_svg writes this to the file).
pub fn render_svg(timeline: &Timeline) -> Result<String> {
    render(timeline).map_err(|e| err(Path::new("the timeline"), e))
}

/// A drawing error, as text: [`write_svg`] and [`render_svg`] put
/// `cannot draw WHAT: ` in front.
type Drawn<T> = std::result::Result<T, String>;

fn fail(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn render(timeline: &Timeline) -> Drawn<String> {
    let mut svg = String::new();
    draw(
        SVGBackend::with_string(&mut svg, SIZE).into_drawing_area(),
        timeline,
    )?;
    Ok(svg)
}

type Value = fn(&TimelinePoint) -> Option<f64>;
type Runs = Vec<Vec<(f64, f64)>>;
/// One value's runs in every direction, with each direction's colour and label.
type Lines = Vec<(RGBColor, String, Runs)>;

/// The runs of consecutive known values, in time order: a None or a
/// value that is not finite ends a run (a gap in the line), and a point
/// whose time is not finite is left out.
fn runs(points: &[TimelinePoint], value: Value) -> Runs {
    let mut all: Vec<_> = points.iter().filter(|p| p.t.is_finite()).collect();
    all.sort_by(|a, b| a.t.total_cmp(&b.t));
    let known = |p: &&TimelinePoint| value(p).filter(|v| v.is_finite());
    let runs = all.split(|p| known(p).is_none()).filter(|r| !r.is_empty());
    runs.map(|r| r.iter().filter_map(|p| Some((p.t, known(p)?))).collect())
        .collect()
}

fn lines(t: &Timeline, value: Value, suffix: &str) -> Lines {
    let line = |(i, d): (usize, &TimelineSeries)| {
        let label = format!("{}{suffix}", d.label);
        (COLORS[i % DIRECTION_COLORS], label, runs(&d.points, value))
    };
    t.directions.iter().enumerate().map(line).collect()
}

fn points(lines: &Lines) -> impl Iterator<Item = (f64, f64)> + '_ {
    lines.iter().flat_map(|l| l.2.iter().flatten().copied())
}

/// Draws the picture and presents it (the SVG is complete when this returns).
fn draw(root: DrawingArea<SVGBackend, Shift>, t: &Timeline) -> Drawn<()> {
    root.fill(&WHITE).map_err(fail)?;
    let gbps = lines(t, |p| p.gbps, "");
    let p50 = lines(t, |p| p.queue_p50_ms, " queue delay p50");
    let p99 = lines(t, |p| p.queue_p99_ms, " queue delay p99");
    let finite = |p: &&(f64, f64)| p.0.is_finite() && p.1.is_finite();
    let rtt: Vec<(f64, f64)> = t.rtt.iter().filter(finite).copied().collect();
    let idle = t.idle_rtt_ms.filter(|v| v.is_finite());
    let load_start = Some(t.load_start).filter(|s| s.is_finite() && *s > 0.0);
    let title = if t.title.is_empty() {
        "timeline"
    } else {
        &t.title
    };
    let area = root.titled(title, ("sans-serif", 22)).map_err(fail)?;
    let delays = || points(&p50).chain(points(&p99)).chain(rtt.iter().copied());
    if points(&gbps).chain(delays()).next().is_none() {
        let (w, h) = area.dim_in_pixel();
        let at = (w as i32 / 2 - 40, h as i32 / 2 - 12);
        let text = Text::new("no data", at, ("sans-serif", 24));
        area.draw(&text).map_err(fail)?;
        return root.present().map_err(fail);
    }
    // The time axis spans every point of either panel, from the start.
    let times = points(&gbps).chain(delays()).map(|p| p.0);
    let x = range(times.chain(load_start), true);
    let (top, bottom) = area.split_vertically(area.dim_in_pixel().1 * 9 / 20);
    let y = headroom(range(points(&gbps).map(|p| p.1), true));
    let mut panel = new_panel(&top, "throughput (Gbit/s)", "Gbit/s", None, x, y)?;
    for (color, label, runs) in &gbps {
        line(&mut panel, runs, color.stroke_width(2), false, Some(label))?;
    }
    let thin = BLACK.stroke_width(1);
    if let Some(s) = load_start {
        let runs = [vec![(s, y.0), (s, y.1)]];
        line(&mut panel, &runs, thin, false, Some("load starts"))?;
    }
    legend(&mut panel)?;
    let y = headroom(range(delays().map(|p| p.1).chain(idle), true));
    let x_desc = Some("seconds since the run started");
    let mut panel = new_panel(&bottom, "delay (ms)", "ms", x_desc, x, y)?;
    // p99 thinner and dashed, in the same colour as its p50.
    for ((color, label, p50), (_, label99, p99)) in p50.iter().zip(&p99) {
        line(&mut panel, p50, color.stroke_width(2), false, Some(label))?;
        line(&mut panel, p99, color.stroke_width(1), true, Some(label99))?;
    }
    if !rtt.is_empty() {
        let dots = rtt.iter().map(|&p| Circle::new(p, 2, RTT_COLOR.filled()));
        panel
            .draw_series(dots)
            .map_err(fail)?
            .label("round trip (probes)")
            .legend(|(x, y)| Circle::new((x + 10, y), 3, RTT_COLOR.filled()));
    }
    if let Some(ms) = idle {
        let runs = [vec![(x.0, ms), (x.1, ms)]];
        line(&mut panel, &runs, thin, true, Some("idle round trip"))?;
    }
    if let Some(s) = load_start {
        // Labelled once, in the upper panel.
        line(&mut panel, &[vec![(s, y.0), (s, y.1)]], thin, false, None)?;
    }
    legend(&mut panel)?;
    root.present().map_err(fail)
}

/// Room above the highest point for the legend in the upper left corner.
fn headroom((lo, hi): (f64, f64)) -> (f64, f64) {
    (lo, hi + (hi - lo) * 0.3)
}

fn new_panel<'a, 'b>(
    area: &'a DrawingArea<SVGBackend<'b>, Shift>,
    caption: &str,
    y_desc: &str,
    x_desc: Option<&str>,
    x: (f64, f64),
    y: (f64, f64),
) -> Drawn<Panel<'a, 'b>> {
    let mut panel = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(if x_desc.is_some() { 44 } else { 28 })
        .y_label_area_size(72)
        .build_cartesian_2d(x.0..x.1, y.0..y.1)
        .map_err(fail)?;
    let mut mesh = panel.configure_mesh();
    mesh.light_line_style(WHITE)
        .x_labels(10)
        .y_labels(6)
        .x_label_formatter(&|v| trim_number(*v))
        .y_label_formatter(&|v| trim_number(*v))
        .y_desc(y_desc);
    if let Some(d) = x_desc {
        mesh.x_desc(d);
    }
    mesh.draw().map_err(fail)?;
    Ok(panel)
}

/// Runs as one line with gaps, labelled (when `label` is given) once in
/// the legend. A run of one point (a known interval between two unknown
/// ones) is a dot, else it would not show.
fn line<'a, 'b: 'a>(
    panel: &mut Panel<'a, 'b>,
    runs: &[Vec<(f64, f64)>],
    style: ShapeStyle,
    dashed: bool,
    label: Option<&str>,
) -> Drawn<()> {
    for (i, run) in runs.iter().enumerate() {
        let pts = run.iter().copied();
        let dot = style.color.filled();
        let anno = match (run.len(), dashed) {
            (1, _) => panel.draw_series(pts.map(|p| Circle::new(p, 2, dot))),
            (_, true) => panel.draw_series(DashedLineSeries::new(pts, 6, 4, style)),
            (_, false) => panel.draw_series(LineSeries::new(pts, style)),
        }
        .map_err(fail)?;
        let Some(label) = label.filter(|_| i == 0) else {
            continue;
        };
        let sample = move |(x, y)| vec![(x, y), (x + 20, y)];
        if dashed {
            anno.label(label)
                .legend(move |p| DashedPathElement::new(sample(p), 6, 4, style));
        } else {
            anno.label(label)
                .legend(move |p| PathElement::new(sample(p), style));
        }
    }
    Ok(())
}

fn legend<'a, 'b: 'a>(panel: &mut Panel<'a, 'b>) -> Drawn<()> {
    panel
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Row = (f64, Option<f64>, Option<f64>, Option<f64>);

    /// A direction from (t, gbps, p50, p99) rows.
    fn series(label: &str, rows: &[Row]) -> TimelineSeries {
        let point = |&(t, gbps, p50, p99)| TimelinePoint {
            t,
            gbps,
            queue_p50_ms: p50,
            queue_p99_ms: p99,
        };
        let points = rows.iter().map(point).collect();
        TimelineSeries {
            label: label.into(),
            points,
        }
    }

    /// One direction with these rates, one interval a second.
    fn rates(gbps: &[Option<f64>]) -> Timeline {
        let row = |(i, &g): (usize, &Option<f64>)| (i as f64, g, None, None);
        let rows: Vec<Row> = gbps.iter().enumerate().map(row).collect();
        let mut t = Timeline::default();
        t.directions.push(series("client to server", &rows));
        t
    }

    /// How many `<tag ...>` elements are drawn in colour `c` (`attr`: fill or stroke).
    fn count(svg: &str, tag: &str, attr: &str, c: RGBColor) -> usize {
        let needle = format!("{attr}=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
        let open = format!("<{tag} ");
        let elements = svg.split(&open).skip(1);
        elements
            .filter(|e| e[..e.find('>').unwrap()].contains(&needle))
            .count()
    }

    /// The text of every `<text>` element.
    fn texts(svg: &str) -> Vec<&str> {
        let bodies = svg.split("<text ").skip(1);
        bodies
            .map(|e| e[e.find('>').unwrap() + 1..e.find("</text>").unwrap()].trim())
            .collect()
    }

    #[test]
    fn two_directions_with_probes() {
        // The rate climbs, and past 3 s the queue fills.
        let row = |i: usize, k: f64| {
            let t = i as f64 * 0.5 + 1.0;
            let q = (t - 3.0).max(0.0) * k;
            (t, Some(t * k), Some(q), Some(q * 3.0 + 1.0))
        };
        let rows = |k| (1..=8).map(|i| row(i, k)).collect::<Vec<_>>();
        let up = series("client to server", &rows(2.0));
        let down = series("server to client", &rows(1.0));
        let t = Timeline {
            title: "udp_client --bidir".into(),
            directions: vec![up, down],
            rtt: (0..23).map(|i| (i as f64 * 0.2, 2.0 + i as f64)).collect(),
            idle_rtt_ms: Some(2.0),
            load_start: 1.0,
        };
        let svg = render_svg(&t).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        let expected = "udp_client --bidir|throughput (Gbit/s)|delay (ms)|\
            client to server|server to client|load starts|round trip (probes)|idle round trip|\
            client to server queue delay p50|client to server queue delay p99|\
            server to client queue delay p50|server to client queue delay p99";
        let texts = texts(&svg);
        for text in expected.split('|') {
            assert!(texts.contains(&text), "no {text:?} in the SVG");
        }
        assert!(!texts.contains(&"no data"));
        // One dot per probe, and one more in the legend.
        assert_eq!(count(&svg, "circle", "fill", RTT_COLOR), t.rtt.len() + 1);
    }

    #[test]
    fn an_unknown_value_splits_the_line() {
        let svg = render_svg(&rates(&[Some(1.0), Some(2.0), None, Some(3.0), Some(4.0)])).unwrap();
        // Two segments and the legend's sample; drawn through the gap (or
        // with a zero there) it would be one segment.
        assert_eq!(count(&svg, "polyline", "stroke", COLORS[0]), 3);
        assert_eq!(count(&svg, "circle", "fill", COLORS[0]), 0);
        // NaN and infinity are unknown too: three lone intervals, each a
        // dot, and the legend's line; the probes' dots skip them as well.
        let mut t = rates(&[1.0, f64::NAN, 2.0, f64::INFINITY, 3.0].map(Some));
        t.rtt = [(0.5, 1.0), (f64::NAN, 2.0), (1.5, f64::INFINITY)].to_vec();
        let svg = render_svg(&t).unwrap();
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        assert_eq!(count(&svg, "circle", "fill", COLORS[0]), 3);
        assert_eq!(count(&svg, "polyline", "stroke", COLORS[0]), 1);
        assert_eq!(count(&svg, "circle", "fill", RTT_COLOR), 1 + 1);
    }

    #[test]
    fn no_points_draws_no_data() {
        let mut unknown = rates(&[None, None]);
        (unknown.idle_rtt_ms, unknown.load_start) = (Some(1.0), 1.0);
        for t in [Timeline::default(), unknown] {
            let svg = render_svg(&t).unwrap();
            assert!(svg.starts_with("<svg") && texts(&svg).contains(&"no data"));
            assert!(!texts(&svg).contains(&"throughput (Gbit/s)"));
        }
    }

    #[test]
    fn writes_the_file_or_says_why_not() {
        let t = rates(&[Some(1.0), Some(2.0)]);
        let e = write_svg(Path::new("/nonexistent-dir/x.svg"), &t)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("cannot draw /nonexistent-dir/x.svg: "), "{e}");
        let path = std::env::temp_dir().join(format!("timeline-{}.svg", std::process::id()));
        write_svg(&path, &t).unwrap();
        let written = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).ok();
        assert_eq!(written, render_svg(&t).unwrap());
    }
}
