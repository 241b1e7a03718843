//! One run (upload, reverse or both directions) as an SVG timeline:
//! throughput above, loss in the middle, delay below, on one shared time
//! axis.
//!
//! Why this shape: the queue filling as the rate climbs is what to see,
//! and it shows only with the three lined up in time: where what arrived
//! falls behind what was sent, the loss starts and the delay rises. Each
//! direction draws what was sent (where this client knows it: an
//! upload's), what arrived and the share lost, per interval, so the gap
//! between two lines reads as loss straight off the picture. The delay
//! panel draws the queue delay's median and its 99th percentile because
//! the tail is what calls and games feel; a low median can hide a p99 of
//! hundreds of milliseconds. The probes' round trips are dots, set
//! against the idle round trip measured before the load, so the delay
//! the load added reads straight off the picture. A missing value is a
//! gap, never a zero.
//!
//! Why the legends stand beside the panels, not on them: a legend inside
//! a panel covers the data wherever it is placed (the delay line of a
//! filling queue ran under it), so the picture is wider instead, and
//! each panel's legend and notes sit to its right. The conventions
//! (colours, ranges, labels, the error) are [`super::sockbench::plot`]'s.

use super::plot::{err, range, COLORS};
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
    /// What was sent in this interval, Gbit/s; None when unknown (this
    /// client knows only its own sending).
    pub sent_gbps: Option<f64>,
    /// What arrived, Gbit/s (of what was sent in the interval, for an
    /// upload: the server's count; in the interval, for a reverse
    /// stream: this client's); None when unknown.
    pub received_gbps: Option<f64>,
    /// The share of the interval's datagrams lost, in percent; None when
    /// unknown.
    pub loss_percent: Option<f64>,
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
    /// What the reader should know about what is missing (e.g. why an
    /// upload has no received line), written under the first legend.
    pub notes: Vec<String>,
}

/// The picture, and the column at its right that holds the legends.
const SIZE: (u32, u32) = (1300, 900);
const LEGEND_WIDTH: u32 = 300;
/// The panels' shares of the height (the rest is the delay panel's), in
/// percent.
const THROUGHPUT_SHARE: u32 = 38;
const LOSS_SHARE: u32 = 22;
/// The probes' dots are grey, and directions take the seven colours
/// before it: a direction's received, loss and delay lines one colour,
/// its sent line the next.
const RTT_COLOR: RGBColor = COLORS[7];
const DIRECTION_COLORS: usize = 7;

type Panel<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;
type Area<'b> = DrawingArea<SVGBackend<'b>, Shift>;

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

/// A direction's colour: its received, loss and delay lines; `sent`,
/// its sent line.
fn color(direction: usize, sent: bool) -> RGBColor {
    COLORS[(2 * direction + usize::from(sent)) % DIRECTION_COLORS]
}

/// `value`'s lines, one per direction that has one known value at least.
fn lines(t: &Timeline, value: Value, sent: bool, suffix: &str) -> Lines {
    let line = |(i, d): (usize, &TimelineSeries)| {
        let label = format!("{}, {suffix}", d.label);
        (color(i, sent), label, runs(&d.points, value))
    };
    let known = |l: &(RGBColor, String, Runs)| !l.2.is_empty();
    t.directions
        .iter()
        .enumerate()
        .map(line)
        .filter(known)
        .collect()
}

fn points(lines: &Lines) -> impl Iterator<Item = (f64, f64)> + '_ {
    lines.iter().flat_map(|l| l.2.iter().flatten().copied())
}

/// How a legend entry shows its series.
#[derive(Debug, Clone, Copy)]
enum Mark {
    Line(ShapeStyle),
    Dashed(ShapeStyle),
    Dot(RGBColor),
}

/// The legend entries of one panel, in the order drawn.
type Legend = Vec<(String, Mark)>;

/// Draws the picture and presents it (the SVG is complete when this returns).
fn draw(root: DrawingArea<SVGBackend, Shift>, t: &Timeline) -> Drawn<()> {
    root.fill(&WHITE).map_err(fail)?;
    let received = lines(t, |p| p.received_gbps, false, "received");
    let sent = lines(t, |p| p.sent_gbps, true, "sent");
    let loss = lines(t, |p| p.loss_percent, false, "lost");
    let p50 = lines(t, |p| p.queue_p50_ms, false, "queue delay p50");
    let p99 = lines(t, |p| p.queue_p99_ms, false, "queue delay p99");
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
    let rates = || points(&sent).chain(points(&received));
    let delays = || points(&p50).chain(points(&p99)).chain(rtt.iter().copied());
    let all = || rates().chain(points(&loss)).chain(delays());
    if all().next().is_none() {
        let (w, h) = area.dim_in_pixel();
        let at = (w as i32 / 2 - 40, h as i32 / 2 - 12);
        let text = Text::new("no data", at, ("sans-serif", 24));
        area.draw(&text).map_err(fail)?;
        return root.present().map_err(fail);
    }
    // The time axis spans every point of every panel, from the start.
    let x = range(all().map(|p| p.0).chain(load_start), true);
    let (w, h) = area.dim_in_pixel();
    let (plots, side) = area.split_horizontally(w.saturating_sub(LEGEND_WIDTH));
    let (top, rest) = plots.split_vertically(h * THROUGHPUT_SHARE / 100);
    let (middle, bottom) = rest.split_vertically(h * LOSS_SHARE / 100);
    let (side_top, side_rest) = side.split_vertically(h * THROUGHPUT_SHARE / 100);
    let (side_middle, side_bottom) = side_rest.split_vertically(h * LOSS_SHARE / 100);
    let thin = BLACK.stroke_width(1);

    let mut legend = Legend::new();
    let y = range(rates().map(|p| p.1), true);
    let mut panel = new_panel(&top, "throughput (Gbit/s)", "Gbit/s", None, x, y)?;
    // Each direction's sent line, then what arrived of it.
    for (color, label, runs) in &sent {
        legend.extend(line(&mut panel, runs, color.stroke_width(1), false, label)?);
    }
    for (color, label, runs) in &received {
        legend.extend(line(&mut panel, runs, color.stroke_width(2), false, label)?);
    }
    if let Some(s) = load_start {
        let runs = [vec![(s, y.0), (s, y.1)]];
        legend.extend(line(&mut panel, &runs, thin, false, "load starts")?);
    }
    draw_legend(&side_top, &legend, &t.notes)?;

    let mut legend = Legend::new();
    let y = range(points(&loss).map(|p| p.1), true);
    let mut panel = new_panel(&middle, "datagrams lost (% per interval)", "%", None, x, y)?;
    for (color, label, runs) in &loss {
        legend.extend(line(&mut panel, runs, color.stroke_width(2), false, label)?);
    }
    if let Some(s) = load_start {
        // Labelled once, in the upper panel.
        line(&mut panel, &[vec![(s, y.0), (s, y.1)]], thin, false, "")?;
    }
    draw_legend(&side_middle, &legend, &[])?;

    let mut legend = Legend::new();
    let y = range(delays().map(|p| p.1).chain(idle), true);
    let x_desc = Some("seconds since the run started");
    let mut panel = new_panel(&bottom, "delay (ms)", "ms", x_desc, x, y)?;
    // p99 thinner and dashed, in the same colour as its p50.
    for (color, label, runs) in &p50 {
        legend.extend(line(&mut panel, runs, color.stroke_width(2), false, label)?);
    }
    for (color, label, runs) in &p99 {
        legend.extend(line(&mut panel, runs, color.stroke_width(1), true, label)?);
    }
    if !rtt.is_empty() {
        let dots = rtt.iter().map(|&p| Circle::new(p, 2, RTT_COLOR.filled()));
        panel.draw_series(dots).map_err(fail)?;
        legend.push(("round trip (probes)".into(), Mark::Dot(RTT_COLOR)));
    }
    if let Some(ms) = idle {
        let runs = [vec![(x.0, ms), (x.1, ms)]];
        legend.extend(line(&mut panel, &runs, thin, true, "idle round trip")?);
    }
    if let Some(s) = load_start {
        line(&mut panel, &[vec![(s, y.0), (s, y.1)]], thin, false, "")?;
    }
    draw_legend(&side_bottom, &legend, &[])?;
    root.present().map_err(fail)
}

fn new_panel<'a, 'b>(
    area: &'a Area<'b>,
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
        .x_label_formatter(&|v| tick_label(*v))
        .y_label_formatter(&|v| tick_label(*v))
        .y_desc(y_desc);
    if let Some(d) = x_desc {
        mesh.x_desc(d);
    }
    mesh.draw().map_err(fail)?;
    Ok(panel)
}

/// An axis label: three significant digits, trailing zeros trimmed, so
/// that ticks 0.005 apart read 0.005, 0.01, 0.015 (two decimals would
/// print 0.01 three times).
fn tick_label(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return "0".into();
    }
    if v.abs() >= 100.0 || v == v.round() {
        return format!("{v:.0}");
    }
    let decimals = (2 - v.abs().log10().floor() as i32).clamp(0, 9) as usize;
    let text = format!("{v:.decimals$}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".into()
    } else {
        text.into()
    }
}

/// Runs as one line with gaps; its legend entry (none when `label` is
/// empty, or nothing was drawn). A run of one point (a known interval
/// between two unknown ones) is a dot, else it would not show.
fn line<'a, 'b: 'a>(
    panel: &mut Panel<'a, 'b>,
    runs: &[Vec<(f64, f64)>],
    style: ShapeStyle,
    dashed: bool,
    label: &str,
) -> Drawn<Option<(String, Mark)>> {
    for run in runs {
        let pts = run.iter().copied();
        let dot = style.color.filled();
        match (run.len(), dashed) {
            (1, _) => panel.draw_series(pts.map(|p| Circle::new(p, 2, dot))),
            (_, true) => panel.draw_series(DashedLineSeries::new(pts, 6, 4, style)),
            (_, false) => panel.draw_series(LineSeries::new(pts, style)),
        }
        .map_err(fail)?;
    }
    let mark = if dashed {
        Mark::Dashed(style)
    } else {
        Mark::Line(style)
    };
    Ok((!label.is_empty() && !runs.is_empty()).then(|| (label.to_string(), mark)))
}

/// Pixels from a legend column's top to its box: the panel's caption
/// above the plotting area.
const LEGEND_TOP: i32 = 40;
const LEGEND_ROW: i32 = 18;
/// Characters of a note per line (13-pixel sans-serif in the column).
const NOTE_WIDTH: usize = 40;

/// A panel's legend, boxed, in its slice of the column beside the
/// panels; then `notes`, wrapped.
fn draw_legend(area: &Area, legend: &Legend, notes: &[String]) -> Drawn<()> {
    let (w, _) = area.dim_in_pixel();
    let (x0, x1) = (8, w as i32 - 8);
    let mut y = LEGEND_TOP;
    if !legend.is_empty() {
        let bottom = y + 6 + LEGEND_ROW * legend.len() as i32;
        let corners = [(x0, y), (x1, bottom)];
        area.draw(&Rectangle::new(corners, WHITE.filled()))
            .map_err(fail)?;
        area.draw(&Rectangle::new(corners, BLACK.stroke_width(1)))
            .map_err(fail)?;
        for (i, (label, mark)) in legend.iter().enumerate() {
            let cy = y + 3 + LEGEND_ROW * i as i32 + LEGEND_ROW / 2;
            let sample = vec![(x0 + 8, cy), (x0 + 28, cy)];
            match *mark {
                Mark::Line(style) => area.draw(&PathElement::new(sample, style)),
                Mark::Dashed(style) => area.draw(&DashedPathElement::new(sample, 6, 4, style)),
                Mark::Dot(color) => area.draw(&Circle::new((x0 + 18, cy), 3, color.filled())),
            }
            .map_err(fail)?;
            let text = Text::new(label.as_str(), (x0 + 36, cy - 7), ("sans-serif", 13));
            area.draw(&text).map_err(fail)?;
        }
        y = bottom + 10;
    }
    for line in notes.iter().flat_map(|n| wrap(n, NOTE_WIDTH)) {
        let text = Text::new(line, (x0, y), ("sans-serif", 13));
        area.draw(&text).map_err(fail)?;
        y += LEGEND_ROW - 2;
    }
    Ok(())
}

/// `text` in lines of at most `width` characters, broken at spaces (a
/// longer word stands alone).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(l) if l.chars().count() + 1 + word.chars().count() <= width => {
                l.push(' ');
                l.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    type Row = (f64, Option<f64>, Option<f64>, Option<f64>);

    /// A direction from (t, received gbps, p50, p99) rows.
    fn series(label: &str, rows: &[Row]) -> TimelineSeries {
        let point = |&(t, gbps, p50, p99)| TimelinePoint {
            t,
            received_gbps: gbps,
            queue_p50_ms: p50,
            queue_p99_ms: p99,
            ..TimelinePoint::default()
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

    fn hex(c: RGBColor) -> String {
        format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
    }

    /// Every `<tag ...>` element's attributes.
    fn elements<'s>(svg: &'s str, tag: &str) -> Vec<&'s str> {
        let open = format!("<{tag} ");
        svg.split(&open)
            .skip(1)
            .map(|e| &e[..e.find('>').unwrap()])
            .collect()
    }

    /// An attribute's value.
    fn attr<'e>(element: &'e str, name: &str) -> Option<&'e str> {
        let key = format!("{name}=\"");
        let mut from = 0;
        while let Some(i) = element[from..].find(&key) {
            let at = from + i;
            // The whole name, not the end of a longer one.
            if at == 0 || element[..at].ends_with(char::is_whitespace) {
                let rest = &element[at + key.len()..];
                return Some(&rest[..rest.find('"')?]);
            }
            from = at + key.len();
        }
        None
    }

    fn number(element: &str, name: &str) -> f64 {
        attr(element, name).and_then(|v| v.parse().ok()).unwrap()
    }

    /// How many `<tag ...>` elements are drawn in colour `c` (`attr`: fill or stroke).
    fn count(svg: &str, tag: &str, name: &str, c: RGBColor) -> usize {
        let colour = hex(c);
        elements(svg, tag)
            .iter()
            .filter(|e| attr(e, name) == Some(colour.as_str()))
            .count()
    }

    /// The points of every polyline drawn in colour `c`, one list each.
    fn polylines(svg: &str, c: RGBColor) -> Vec<Vec<(f64, f64)>> {
        let colour = hex(c);
        let point = |p: &str| {
            let (x, y) = p.split_once(',').unwrap();
            (x.parse().unwrap(), y.parse().unwrap())
        };
        elements(svg, "polyline")
            .iter()
            .filter(|e| attr(e, "stroke") == Some(colour.as_str()))
            .map(|e| {
                attr(e, "points")
                    .unwrap()
                    .split_whitespace()
                    .map(point)
                    .collect()
            })
            .collect()
    }

    /// The text of every `<text>` element.
    fn texts(svg: &str) -> Vec<&str> {
        let bodies = svg.split("<text ").skip(1);
        bodies
            .map(|e| e[e.find('>').unwrap() + 1..e.find("</text>").unwrap()].trim())
            .collect()
    }

    /// An upload whose queue fills from 2 s on, and a reverse stream.
    fn both_directions() -> Timeline {
        let point = |i: usize, k: f64| {
            let t = i as f64 * 0.5 + 1.0;
            let q = (t - 3.0).max(0.0) * k;
            TimelinePoint {
                t,
                sent_gbps: Some(0.15 * k),
                received_gbps: Some(0.097 * k),
                loss_percent: Some(34.2),
                queue_p50_ms: Some(q),
                queue_p99_ms: Some(q * 3.0 + 1.0),
            }
        };
        let points = |k| (1..=8).map(|i| point(i, k)).collect::<Vec<_>>();
        let up = TimelineSeries {
            label: "client to server".into(),
            points: points(2.0),
        };
        let mut down = TimelineSeries {
            label: "server to client".into(),
            points: points(1.0),
        };
        down.points.iter_mut().for_each(|p| p.sent_gbps = None);
        Timeline {
            title: "udp_client --bidir".into(),
            directions: vec![up, down],
            rtt: (0..23).map(|i| (i as f64 * 0.2, 2.0 + i as f64)).collect(),
            idle_rtt_ms: Some(2.0),
            load_start: 1.0,
            notes: vec!["a note that is long enough to be wrapped over two lines or more".into()],
        }
    }

    #[test]
    fn two_directions_with_probes() {
        let t = both_directions();
        let svg = render_svg(&t).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        let expected = "udp_client --bidir|throughput (Gbit/s)|delay (ms)|\
            datagrams lost (% per interval)|\
            client to server, sent|client to server, received|server to client, received|\
            client to server, lost|server to client, lost|\
            load starts|round trip (probes)|idle round trip|\
            client to server, queue delay p50|client to server, queue delay p99|\
            server to client, queue delay p50|server to client, queue delay p99";
        let texts = texts(&svg);
        for text in expected.split('|') {
            assert!(texts.contains(&text), "no {text:?} in the SVG");
        }
        assert!(!texts.contains(&"no data"));
        assert!(
            !texts.contains(&"server to client, sent"),
            "not known: not drawn"
        );
        assert!(texts.contains(&"a note that is long enough to be wrapped"));
        // One dot per probe, and one more in the legend.
        assert_eq!(count(&svg, "circle", "fill", RTT_COLOR), t.rtt.len() + 1);
        // The upload's sent line (and its legend sample), apart from its
        // received, loss and p50 lines (and theirs): one point per
        // interval each.
        let sent = polylines(&svg, color(0, true));
        assert_eq!(sent.iter().map(Vec::len).collect::<Vec<_>>(), [8, 2]);
        let mine = polylines(&svg, color(0, false));
        // (The dashed p99 is drawn dash by dash.)
        let whole = mine.iter().filter(|l| l.len() == 8).count();
        assert_eq!(whole, 3, "received, lost, p50: {mine:?}");
        assert!(mine.iter().all(|l| l.len() <= 8));
    }

    #[test]
    fn legends_cover_no_data() {
        // Data in every corner of every panel, the probes' dots too.
        let mut t = both_directions();
        for p in t.directions.iter_mut().flat_map(|d| d.points.iter_mut()) {
            p.loss_percent = Some(if p.t < 2.0 { 100.0 } else { 0.0 });
        }
        t.rtt.push((0.0, 80.0));
        let svg = render_svg(&t).unwrap();
        let (width, _) = SIZE;
        // The legends' boxes: black, unfilled, in the column at the right.
        let boxes: Vec<[f64; 4]> = elements(&svg, "rect")
            .iter()
            .filter(|e| attr(e, "stroke") == Some("#000000") && attr(e, "fill") == Some("none"))
            .map(|e| {
                let (x, y) = (number(e, "x"), number(e, "y"));
                [x, y, x + number(e, "width"), y + number(e, "height")]
            })
            .collect();
        assert_eq!(boxes.len(), 3, "one legend per panel");
        assert!(boxes
            .iter()
            .all(|b| b[0] >= f64::from(width - LEGEND_WIDTH)));
        // Every drawn point and every segment between two (its bounding
        // box) of every series, and every dot: outside every box, but
        // for the legends' own samples (a short level line, or a dot, at
        // the box's left).
        let overlaps = |b: &[f64; 4], (x0, y0): (f64, f64), (x1, y1): (f64, f64)| {
            x0.min(x1) <= b[2] && x0.max(x1) >= b[0] && y0.min(y1) <= b[3] && y0.max(y1) >= b[1]
        };
        let sample = |b: &[f64; 4], line: &[(f64, f64)]| {
            let level = line.iter().all(|p| p.1 == line[0].1);
            level && line.iter().all(|p| p.0 >= b[0] + 8.0 && p.0 <= b[0] + 28.0)
        };
        let mut checked = 0;
        for c in (0..DIRECTION_COLORS).map(|i| COLORS[i]).chain([RTT_COLOR]) {
            for line in polylines(&svg, c) {
                for b in &boxes {
                    if sample(b, &line) {
                        continue;
                    }
                    for pair in line.windows(2) {
                        checked += 1;
                        assert!(!overlaps(b, pair[0], pair[1]), "{pair:?} under {b:?}");
                    }
                }
            }
            for dot in elements(&svg, "circle") {
                if attr(dot, "fill") != Some(hex(c).as_str()) {
                    continue;
                }
                let at = (number(dot, "cx"), number(dot, "cy"));
                for b in boxes.iter().filter(|b| at.0 != b[0] + 18.0) {
                    checked += 1;
                    assert!(!overlaps(b, at, at), "{at:?} under {b:?}");
                }
            }
        }
        assert!(checked > 100, "only {checked} checked");
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
    fn axis_labels_tell_their_ticks_apart() {
        let labels: Vec<String> = [
            0.0,
            0.005,
            0.01,
            0.015,
            0.30000000000000004,
            2.5,
            12.5,
            15.0,
            250.0,
        ]
        .into_iter()
        .map(tick_label)
        .collect();
        assert_eq!(
            labels,
            ["0", "0.005", "0.01", "0.015", "0.3", "2.5", "12.5", "15", "250"]
        );
        assert_eq!(tick_label(-0.0001234), "-0.000123");
        assert_eq!(tick_label(f64::NAN), "0");
    }

    #[test]
    fn notes_wrap_at_spaces() {
        assert_eq!(wrap("a bb ccc dddd", 6), ["a bb", "ccc", "dddd"]);
        assert_eq!(
            wrap("averyveryverylongword x", 4),
            ["averyveryverylongword", "x"]
        );
        assert!(wrap("  ", 10).is_empty());
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
