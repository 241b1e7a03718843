//! Line charts as SVG files, drawn with plotters.
//!
//! Why SVG only: plotters is built without a font backend, so text is
//! written as plain `<text>` elements that any browser renders; no font
//! files, no system libraries. One function serves every suite: named
//! series of (x, y) points, optionally on a logarithmic x axis.

use crate::bench::mux::MuxRow;
use crate::bench::sweep::SweepReport;
use crate::bench::tcp::TcpRow;
use crate::bench::udp::{Mode, UdpRow};
use crate::bench::Report;
use crate::client::limit::LimitReport;
use crate::config::bench::SocketKind;
use crate::error::{Error, Result};
use crate::meter::recv::Method;
use plotters::prelude::*;
use std::path::Path;

/// One line on the chart.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// What to draw and how to label it.
pub struct Chart {
    pub title: String,
    pub x_label: &'static str,
    pub y_label: &'static str,
    pub log_x: bool,
    pub series: Vec<Series>,
}

/// Tableau's ten colours plus four darker ones: twelve lines (tcp's
/// default matrix) stay distinguishable.
pub(crate) const COLORS: [RGBColor; 14] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 0),
    RGBColor(0, 80, 0),
    RGBColor(120, 0, 120),
    RGBColor(0, 0, 140),
];

pub(crate) fn err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::runtime(format!("cannot draw {}: {e}", path.display()))
}

/// The axis range over all points, padded so that lines do not touch the
/// frame; a single value still gives a non-empty range.
pub(crate) fn range(values: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    if hi <= lo {
        hi = lo + lo.abs().max(1.0);
    }
    (lo, hi + (hi - lo) * 0.05)
}

/// Axis labels without needless decimals: `1460`, `0.25`, `64K`-free.
pub(crate) fn trim_number(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The legend goes in the upper corner the lines leave empty: upper left
/// when they mostly rise, upper right when they mostly fall.
fn legend_position(series: &[Series]) -> SeriesLabelPosition {
    let mut rise = 0.0;
    for s in series {
        let first = s.points.iter().min_by(|a, b| a.0.total_cmp(&b.0));
        let last = s.points.iter().max_by(|a, b| a.0.total_cmp(&b.0));
        if let (Some(a), Some(b)) = (first, last) {
            rise += b.1 - a.1;
        }
    }
    if rise < 0.0 {
        SeriesLabelPosition::UpperRight
    } else {
        SeriesLabelPosition::UpperLeft
    }
}

/// Writes `chart` to `path` as an SVG of 900×560 pixels.
pub fn draw(path: &Path, chart: &Chart) -> Result<()> {
    let points = || chart.series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = range(points().map(|p| p.0), false);
    let (y0, y1) = range(points().map(|p| p.1), true);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(&chart.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72);
    macro_rules! finish {
        ($ctx:expr) => {{
            let mut ctx = $ctx;
            ctx.configure_mesh()
                .light_line_style(WHITE)
                .x_labels(8)
                .y_labels(8)
                .x_label_formatter(&|x| trim_number(*x))
                .y_label_formatter(&|y| trim_number(*y))
                .x_desc(chart.x_label)
                .y_desc(chart.y_label)
                .draw()
                .map_err(|e| err(path, e))?;
            for (i, s) in chart.series.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                let mut pts = s.points.clone();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                ctx.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                    .map_err(|e| err(path, e))?
                    .label(s.name.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                ctx.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| err(path, e))?;
            }
            ctx.configure_series_labels()
                .position(legend_position(&chart.series))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(path, e))?;
        }};
    }
    if chart.log_x && x0 > 0.0 {
        finish!(builder
            .build_cartesian_2d((x0..x1).log_scale(), y0..y1)
            .map_err(|e| err(path, e))?);
    } else {
        finish!(builder
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| err(path, e))?);
    }
    root.present().map_err(|e| err(path, e))?;
    Ok(())
}

/// One line per key of `keys`, in that order and named by `name`: the
/// best `y` at each `x` over the rows on that line (the other axes
/// collapsed). `point` says which line a row is on, and where.
fn best_per_x<R, K: PartialEq + Copy>(
    rows: &[R],
    keys: Vec<K>,
    name: fn(K) -> &'static str,
    point: impl Fn(&R) -> (K, f64, f64),
) -> Vec<Series> {
    keys.into_iter()
        .map(|k| {
            let mut points: Vec<(f64, f64)> = Vec::new();
            for (_, x, y) in rows.iter().map(&point).filter(|p| p.0 == k) {
                match points.iter_mut().find(|p| p.0 == x) {
                    Some(p) => p.1 = p.1.max(y),
                    None => points.push((x, y)),
                }
            }
            Series {
                name: name(k).to_string(),
                points,
            }
        })
        .collect()
}

/// `sockbench udp`: bandwidth against payload, one line per socket type:
/// for each socket and payload, the best row over the other axes.
pub fn udp_series(rows: &[UdpRow]) -> Vec<Series> {
    let mut kinds: Vec<SocketKind> = rows.iter().map(|r| r.socket).collect();
    kinds.sort();
    kinds.dedup();
    best_per_x(rows, kinds, SocketKind::name, |r| {
        (r.socket, r.payload as f64, r.mbit_per_s)
    })
}

fn axes_varied(rows: &[UdpRow]) -> bool {
    let first = match rows.first() {
        Some(r) => r,
        None => return false,
    };
    rows.iter().any(|r| {
        (r.threads, r.conn, r.ip, r.reuse) != (first.threads, first.conn, first.ip, first.reuse)
    })
}

/// `sockbench tcp`: throughput against chunk size, one line per
/// implementation, duplex and concurrency.
pub fn tcp_series(rows: &[TcpRow]) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for r in rows {
        let name = format!(
            "{} {:?} x{}",
            r.implementation.name(),
            r.duplex,
            r.concurrency
        )
        .to_lowercase();
        let point = (r.chunk as f64, r.gbit_per_s);
        match out.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push(point),
            None => out.push(Series {
                name,
                points: vec![point],
            }),
        }
    }
    out
}

/// `sockbench mux`: loss against receive buffer, one line per method.
pub fn mux_series(rows: &[MuxRow]) -> Vec<Series> {
    let mut methods: Vec<Method> = Vec::new();
    for r in rows {
        if !methods.contains(&r.method) {
            methods.push(r.method);
        }
    }
    best_per_x(rows, methods, Method::name, |r| {
        (r.method, r.rcvbuf as f64, r.loss_percent)
    })
}

/// Draws a suite's chart.
pub fn draw_report(path: &Path, report: &Report) -> Result<()> {
    let chart = match report {
        Report::Udp(r) => {
            // Throughput rows only: a ping-pong row measures latency. Plot
            // ping-pong rows only when nothing else ran.
            let rows = &r.rows;
            let streams: Vec<UdpRow> = rows
                .iter()
                .filter(|r| r.mode == Mode::Stream)
                .cloned()
                .collect();
            let plotted: &[UdpRow] = if streams.is_empty() { rows } else { &streams };
            let title = if plotted.is_empty() {
                "UDP bandwidth received (no rows)".to_string()
            } else if axes_varied(plotted) {
                "UDP bandwidth received, streams (best over threads, conn, ip, reuse)".to_string()
            } else {
                let r = &plotted[0];
                format!(
                    "UDP bandwidth received ({}, {} threads, {:?}, {:?}, reuse {:?})",
                    if r.mode == Mode::Stream {
                        "stream"
                    } else {
                        "ping-pong"
                    },
                    r.threads,
                    r.conn,
                    r.ip,
                    r.reuse
                )
                .to_lowercase()
                .replace("udp", "UDP")
            };
            Chart {
                title,
                x_label: "payload (bytes)",
                y_label: "Mbit/s received",
                log_x: false,
                series: udp_series(plotted),
            }
        }
        Report::Tcp(r) => Chart {
            title: "TCP loopback throughput (mean over samples)".into(),
            x_label: "chunk (bytes per write)",
            y_label: "Gbit/s",
            log_x: true,
            series: tcp_series(&r.rows),
        },
        Report::Mux(r) => Chart {
            title: "UDP loss against receive buffer (worst over other axes)".into(),
            x_label: "SO_RCVBUF requested (bytes)",
            y_label: "loss %",
            log_x: true,
            series: mux_series(&r.rows),
        },
        Report::Ceiling(r) => Chart {
            title: "netspeed's UDP path without accounting (ceiling)".into(),
            x_label: "datagram size (bytes)",
            y_label: "Gbit/s received",
            log_x: true,
            series: vec![Series {
                name: "ceiling".into(),
                points: r.rows.iter().map(|c| (c.size as f64, c.gbps)).collect(),
            }],
        },
    };
    draw(path, &chart)
}

/// `udp_client --sweep`: Gbit/s received against buffer size, one line
/// per client count.
pub fn sweep_plot(r: &SweepReport, path: &Path) -> Result<()> {
    if r.by_clients() {
        return clients_plot(r, path);
    }
    let series: Vec<Series> = r
        .clients
        .iter()
        .map(|&n| Series {
            name: format!("{n} client{}", if n == 1 { "" } else { "s" }),
            points: r
                .cells
                .iter()
                .filter(|c| c.clients == n)
                .filter_map(|c| c.server_gbps.map(|g| (c.buffer_size as f64, g)))
                .collect(),
        })
        .collect();
    draw(
        path,
        &Chart {
            title: "udp_client sweep: receive rate at the server".into(),
            x_label: "buffer size (bytes per datagram)",
            y_label: "Gbit/s received",
            log_x: false,
            series,
        },
    )
}

/// A chart's axes: a rate on the left and a share (or loss) on the right,
/// over one x axis.
struct TwoAxes<'t> {
    title: &'t str,
    x: (f64, f64, &'t str),
    left: (f64, &'t str),
    right: (f64, &'t str),
}

type DualChart<'a, 'b> = plotters::chart::DualCoordChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// Draws `axes` (both y axes from 0) on `root`, ready for series.
fn two_axes<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    path: &Path,
    axes: TwoAxes,
) -> Result<DualChart<'a, 'b>> {
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let (lo_x, hi_x, x_desc) = axes.x;
    let mut ctx = ChartBuilder::on(root)
        .caption(axes.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .right_y_label_area_size(72)
        .build_cartesian_2d(lo_x..hi_x, 0.0..axes.left.0)
        .map_err(|e| err(path, e))?
        .set_secondary_coord(lo_x..hi_x, 0.0..axes.right.0);
    ctx.configure_mesh()
        .light_line_style(WHITE)
        .x_label_formatter(&|x| trim_number(*x))
        .y_label_formatter(&|y| trim_number(*y))
        .x_desc(x_desc)
        .y_desc(axes.left.1)
        .draw()
        .map_err(|e| err(path, e))?;
    ctx.configure_secondary_axes()
        .y_desc(axes.right.1)
        .y_label_formatter(&|y| trim_number(*y))
        .draw()
        .map_err(|e| err(path, e))?;
    Ok(ctx)
}

/// Draws the legend and writes the file.
fn finish<'a, 'b: 'a>(
    mut ctx: DualChart<'a, 'b>,
    root: &DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    path: &Path,
) -> Result<()> {
    ctx.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(path, e))?;
    root.present().map_err(|e| err(path, e))?;
    Ok(())
}

/// `udp_client --sweep-clients --plot`: the aggregate received rate (left
/// axis), the loss and the server socket's drops as shares of what was
/// sent (right axis) against the number of clients, and a line where the
/// server's buffer first overflowed.
fn clients_plot(r: &SweepReport, path: &Path) -> Result<()> {
    let rows: Vec<(f64, f64, f64, Option<f64>)> = r
        .cells
        .iter()
        .map(|c| {
            let sent = c.sent_packets.max(1) as f64;
            (
                c.clients as f64,
                c.server_gbps.unwrap_or(0.0),
                c.loss_percent.unwrap_or(0.0),
                c.kernel_drops_datagrams.map(|d| d as f64 * 100.0 / sent),
            )
        })
        .collect();
    let right = rows
        .iter()
        .flat_map(|p| [p.2, p.3.unwrap_or(0.0)])
        .fold(1.0f64, f64::max)
        * 1.1;
    let (_, top) = range(rows.iter().map(|p| p.1), true);
    let (lo_x, hi_x) = (0.0, rows.iter().map(|p| p.0).fold(1.0f64, f64::max) * 1.05);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    let title = format!("udp_client --sweep-clients: {}-byte datagrams", r.sizes[0]);
    let mut ctx = two_axes(
        &root,
        path,
        TwoAxes {
            title: &title,
            x: (lo_x, hi_x, "clients"),
            left: (top, "received Gbit/s (all clients)"),
            right: (right, "% of the datagrams sent"),
        },
    )?;
    let (blue, red, orange, green) = (COLORS[0], COLORS[3], COLORS[1], COLORS[2]);
    ctx.draw_series(LineSeries::new(
        rows.iter().map(|p| (p.0, p.1)),
        blue.stroke_width(2),
    ))
    .map_err(|e| err(path, e))?
    .label("received Gbit/s")
    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], blue.stroke_width(2)));
    ctx.draw_secondary_series(LineSeries::new(
        rows.iter().map(|p| (p.0, p.2)),
        red.stroke_width(2),
    ))
    .map_err(|e| err(path, e))?
    .label("loss % (right axis)")
    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red.stroke_width(2)));
    ctx.draw_secondary_series(
        rows.iter()
            .filter_map(|p| p.3.map(|d| Cross::new((p.0, d), 5, orange.stroke_width(2)))),
    )
    .map_err(|e| err(path, e))?
    .label("kernel drops, % of sent (right axis)")
    .legend(move |(x, y)| Cross::new((x + 10, y), 5, orange.stroke_width(2)));
    if let Some(n) = r.first_overflow {
        let x = n as f64;
        ctx.draw_series(LineSeries::new([(x, 0.0), (x, top)], green.stroke_width(2)))
            .map_err(|e| err(path, e))?
            .label(format!("buffer first overflowed at {n} clients"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], green.stroke_width(2))
            });
    }
    finish(ctx, &root, path)
}

/// `udp_client --find-limit --plot`: each paced trial's receive rate
/// (left axis) and loss (right axis) against its offered rate, the line
/// where received equals offered, and the rate found.
pub fn limit_plot(r: &LimitReport, path: &Path) -> Result<()> {
    let paced: Vec<(f64, f64, f64)> = r
        .trials
        .iter()
        .filter_map(|t| {
            let offered = t.offered_bps? as f64 / 1e9;
            Some((offered, t.received_bps.unwrap_or(0.0) / 1e9, t.loss_percent))
        })
        .collect();
    let top = paced
        .iter()
        .flat_map(|p| [p.0, p.1])
        .fold(0.0f64, f64::max)
        .max(1e-6)
        * 1.05;
    let loss_top = paced.iter().map(|p| p.2).fold(1.0f64, f64::max) * 1.1;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    let mut ctx = two_axes(
        &root,
        path,
        TwoAxes {
            title: "udp_client --find-limit",
            x: (0.0, top, "offered Gbit/s"),
            left: (top, "received Gbit/s"),
            right: (loss_top, "loss %"),
        },
    )?;
    let grey = RGBColor(150, 150, 150);
    ctx.draw_series(LineSeries::new(
        [(0.0, 0.0), (top, top)],
        grey.stroke_width(1),
    ))
    .map_err(|e| err(path, e))?
    .label("received = offered")
    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], grey.stroke_width(1)));
    let (blue, red, green) = (COLORS[0], COLORS[3], COLORS[2]);
    ctx.draw_series(
        paced
            .iter()
            .map(|p| Circle::new((p.0, p.1), 4, blue.filled())),
    )
    .map_err(|e| err(path, e))?
    .label("received")
    .legend(move |(x, y)| Circle::new((x + 10, y), 4, blue.filled()));
    ctx.draw_secondary_series(
        paced
            .iter()
            .map(|p| Cross::new((p.0, p.2), 5, red.stroke_width(2))),
    )
    .map_err(|e| err(path, e))?
    .label("loss % (right axis)")
    .legend(move |(x, y)| Cross::new((x + 10, y), 5, red.stroke_width(2)));
    if let Some(rate) = r.limit.rate_bps {
        let x = rate as f64 / 1e9;
        ctx.draw_series(LineSeries::new([(x, 0.0), (x, top)], green.stroke_width(2)))
            .map_err(|e| err(path, e))?
            .label(format!("no-drop rate {x:.3} Gbit/s"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], green.stroke_width(2))
            });
    }
    finish(ctx, &root, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_never_empty() {
        assert_eq!(range([].into_iter(), false), (0.0, 1.0));
        let (lo, hi) = range([5.0].into_iter(), true);
        assert!(lo == 0.0 && hi > 5.0);
        let (lo, hi) = range([2.0, 4.0].into_iter(), false);
        assert!(lo == 2.0 && hi > 4.0);
    }

    #[test]
    fn draws_an_svg() {
        let dir = std::env::temp_dir().join(format!("sockbench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.svg");
        let series = vec![Series {
            name: "std".into(),
            points: vec![(26.0, 10.0), (1460.0, 900.0), (300.0, 100.0)],
        }];
        draw(
            &path,
            &Chart {
                title: "t".into(),
                x_label: "payload",
                y_label: "Mbit/s",
                log_x: true,
                series,
            },
        )
        .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("<svg") && svg.contains("std"));
        std::fs::remove_dir_all(dir).ok();
    }
}
