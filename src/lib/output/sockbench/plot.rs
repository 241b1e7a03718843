//! `sockbench`'s charts: one line per socket type, implementation or
//! receive method, drawn with [`crate::output::plot`].

use crate::config::sockbench::SocketKind;
use crate::error::Result;
use crate::meter::recv::Method;
use crate::output::plot::{draw, Chart, Series};
use crate::sockbench::mux::MuxRow;
use crate::sockbench::tcp::TcpRow;
use crate::sockbench::udp::{Mode, UdpRow};
use crate::sockbench::Report;
use std::path::Path;

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
