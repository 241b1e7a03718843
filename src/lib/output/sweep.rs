//! `udp_client --sweep` and `--sweep-clients`: the table of receive rates
//! per buffer size and client count, and its chart.

use crate::client::sweep::SweepReport;
use crate::error::Result;
use crate::output::plot::{draw, err, finish, range, two_axes, Chart, Series, TwoAxes, COLORS};
use crate::output::table::Table;
use plotters::prelude::*;
use std::path::Path;

pub fn sweep_table(r: &SweepReport) -> String {
    let mut table = sweep_cells(r);
    if let Some(i) = &r.interrupted {
        table += &format!("\nnote: {}", i.note());
    }
    table
}

fn sweep_cells(r: &SweepReport) -> String {
    if r.by_clients() {
        return clients_table(r);
    }
    let mut out = String::from("| Buffer |");
    for &n in &r.clients {
        out.push_str(&format!(
            " Speed<br>{n} client{} |",
            if n == 1 { "" } else { "s" }
        ));
    }
    out.push_str("\n|-------:|");
    for _ in &r.clients {
        out.push_str("-------------------:|");
    }
    out.push('\n');
    for &size in &r.sizes {
        if !r.cells.iter().any(|c| c.buffer_size == size) {
            continue;
        }
        out.push_str(&format!("| {size:>6} |"));
        for &n in &r.clients {
            let cell = match r.cell(size, n).and_then(|c| c.server_gbps) {
                Some(g) => format!("{g:.2} Gbps"),
                None => "-".into(),
            };
            out.push_str(&format!(" {cell:>18} |"));
        }
        out.push('\n');
    }
    out.push_str("\nSpeeds are receive rates from the server's answers (receiver side).\n");
    out
}

/// `--sweep-clients`: one row per client count, with the loss and the
/// server socket's drops, and the row where its buffer first overflowed.
fn clients_table(r: &SweepReport) -> String {
    let size = r.sizes.first().copied().unwrap_or(0);
    let mut t = Table::new(&[
        "clients",
        "received Gbit/s",
        "sent Gbit/s",
        "lost",
        "loss %",
        "kernel drops",
        "",
    ]);
    let dash = || "-".to_string();
    for &n in &r.clients {
        let Some(c) = r.cell(size, n) else { continue };
        let drops = match (
            c.kernel_drops,
            c.kernel_drops_unit,
            c.kernel_drops_datagrams,
        ) {
            (Some(0), _, _) => "none".into(),
            (Some(b), Some("buffers"), Some(d)) => format!("{b} GRO buffers (~{d} datagrams)"),
            (Some(d), _, _) => format!("{d} datagrams"),
            _ => "unknown".into(),
        };
        t.push(vec![
            n.to_string(),
            c.server_gbps.map_or_else(dash, |g| format!("{g:.3}")),
            c.sent_gbps.map_or_else(dash, |g| format!("{g:.3}")),
            c.lost_packets.map_or_else(dash, |l| l.to_string()),
            c.loss_percent.map_or_else(dash, |l| format!("{l:.3}")),
            drops,
            if r.first_overflow == Some(n) {
                "<- the server's buffer first overflowed".into()
            } else {
                String::new()
            },
        ]);
    }
    let mut out = format!(
        "udp_client --sweep-clients to {}: {size}-byte datagrams, every client {}\n\n",
        r.server, r.each_client
    );
    out += &t.render();
    out += "\nReceived rates and losses are from the server's answers; kernel drops are its socket's while each run went on (anyone's).";
    if r.first_overflow.is_none() {
        out += "\nThe server's buffer never overflowed at these client counts.";
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::sweep::SweepCell;

    #[test]
    fn table_has_a_column_per_client_count_and_dashes_for_no_answer() {
        let cell = |b, c, g| SweepCell {
            buffer_size: b,
            clients: c,
            server_gbps: g,
            sent_gbps: Some(1.0),
            sent_packets: 1,
            received_packets: None,
            loss_percent: None,
            lost_packets: None,
            kernel_drops: None,
            kernel_drops_unit: None,
            kernel_drops_datagrams: None,
            complete: true,
        };
        let r = SweepReport {
            server: "127.0.0.1:1".into(),
            sizes: vec![500, 1000],
            clients: vec![1, 2],
            cells: vec![
                cell(500, 1, Some(1.1)),
                cell(500, 2, None),
                cell(1000, 1, Some(2.4)),
                cell(1000, 2, Some(3.0)),
            ],
            first_overflow: None,
            interrupted: None,
            each_client: "1.00 MB each".into(),
        };
        let t = sweep_table(&r);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("1 client |") && lines[0].contains("2 clients |"));
        assert!(lines[2].contains("1.10 Gbps") && lines[2].trim_end().ends_with("- |"));
        assert!(lines[3].contains("2.40 Gbps") && lines[3].contains("3.00 Gbps"));
    }
}
