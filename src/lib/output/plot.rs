//! Line charts as SVG files, drawn with plotters.
//!
//! Why SVG only: plotters is built without a font backend, so text is
//! written as plain `<text>` elements that any browser renders; no font
//! files, no system libraries. One function serves every suite: named
//! series of (x, y) points, optionally on a logarithmic x axis.
//!
//! Every chart netspeed draws goes through here: sockbench's suites
//! ([`super::sockbench`]), `udp_client --sweep` ([`super::sweep`]),
//! `--find-limit` ([`super::limit`]) and an ordinary run's timeline
//! ([`super::timeline`]) share the colours, ranges, labels and the error.

use crate::error::{Error, Result};
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

/// A chart's axes: a rate on the left and a share (or loss) on the right,
/// over one x axis.
pub(crate) struct TwoAxes<'t> {
    pub title: &'t str,
    pub x: (f64, f64, &'t str),
    pub left: (f64, &'t str),
    pub right: (f64, &'t str),
}

pub(crate) type DualChart<'a, 'b> = plotters::chart::DualCoordChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// Draws `axes` (both y axes from 0) on `root`, ready for series.
pub(crate) fn two_axes<'a, 'b>(
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
pub(crate) fn finish<'a, 'b: 'a>(
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
