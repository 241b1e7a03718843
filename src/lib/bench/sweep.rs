//! `udp_client --sweep`: seed 001's table, buffer size against speed with
//! one and with two clients, against a running `udp_server`.
//!
//! Why the server's figure: seed 001's 63.5 Gbit/s headline was a sender
//! rate measured while the server's buffer overflowed. Every cell here
//! takes the receive rate from the server's end-of-test answers
//! (`report.server.gbps`: all clients' bytes over the union of their
//! spans); a cell whose answer never came shows as missing rather than as
//! the send rate, and makes the run exit with code 3.
//!
//! The sweep is a loop around [`crate::client::run`] with the caller's
//! validated config, overriding only the buffer size and the client count,
//! so every other flag (`--duration`, `--connected`, `--batch`, ...) means
//! what it always means.

use super::plot::{self, Series};
use super::Bar;
use crate::client;
use crate::config::ClientConfig;
use crate::error::{Error, Result};
use crate::shutdown::Shutdown;
use serde::Serialize;
use std::path::Path;

/// One cell: one buffer size at one client count.
#[derive(Debug, Clone, Serialize)]
pub struct SweepCell {
    pub buffer_size: usize,
    pub clients: usize,
    /// Receive rate from the server's answers (over the clients' union of
    /// spans); None when no client got an answer, or the run was too short
    /// for a rate.
    pub server_gbps: Option<f64>,
    /// Send rate (sender side), for comparison only.
    pub sent_gbps: Option<f64>,
    pub sent_packets: u64,
    pub received_packets: Option<u64>,
    pub loss_percent: Option<f64>,
    /// Every client of the cell got the server's answer.
    pub complete: bool,
}

impl SweepReport {
    /// 0, or `client::EXIT_NO_ANSWER` when a cell lacks the server's answer.
    pub fn exit_code(&self) -> i32 {
        if self.cells.iter().all(|c| c.complete) {
            0
        } else {
            client::EXIT_NO_ANSWER
        }
    }
}

/// The whole sweep, row-major: for each size, each client count.
#[derive(Debug, Clone, Serialize)]
pub struct SweepReport {
    pub server: String,
    pub sizes: Vec<usize>,
    pub clients: Vec<usize>,
    pub cells: Vec<SweepCell>,
}

impl SweepReport {
    pub fn cell(&self, size: usize, clients: usize) -> Option<&SweepCell> {
        self.cells
            .iter()
            .find(|c| c.buffer_size == size && c.clients == clients)
    }
}

/// Checks the lists against the server's address family.
pub fn validate(base: &ClientConfig, sizes: &[usize], clients: &[usize]) -> Result<()> {
    if sizes.is_empty() || clients.is_empty() {
        return Err(Error::usage(
            "--sweep needs at least one size and one client count",
        ));
    }
    let limit = if base.server.is_ipv4() {
        crate::sys::MAX_UDP_PAYLOAD_V4
    } else {
        crate::sys::MAX_UDP_PAYLOAD_V6
    };
    for &s in sizes {
        if s == 0 || s > limit {
            return Err(Error::usage(format!(
                "--sweep {s}: buffer sizes must be between 1 and {limit} bytes"
            )));
        }
    }
    for &c in clients {
        if c == 0 || c > crate::config::MAX_CLIENTS {
            return Err(Error::usage(format!(
                "--clients {c}: must be between 1 and {}",
                crate::config::MAX_CLIENTS
            )));
        }
    }
    Ok(())
}

/// Runs `udp_client` once per (size, client count) against `base.server`,
/// with everything else from `base`. A progress bar counts cells unless
/// `base.quiet` or `base.json`.
pub fn run(
    base: &ClientConfig,
    sizes: &[usize],
    clients: &[usize],
    shutdown: &Shutdown,
) -> Result<SweepReport> {
    validate(base, sizes, clients)?;
    let bar = Bar::new(sizes.len() * clients.len(), base.quiet || base.json);
    let mut cells = Vec::new();
    let mut result = Ok(());
    'outer: for &size in sizes {
        for &n in clients {
            if shutdown.is_triggered() {
                break 'outer;
            }
            bar.message(&format!("buffer {size}, {n} client(s)"));
            let mut cfg = base.clone();
            cfg.buffer_size = size;
            cfg.clients = n;
            cfg.quiet = true;
            cfg.json = false;
            match client::run(&cfg, shutdown) {
                Ok(r) => cells.push(SweepCell {
                    buffer_size: size,
                    clients: n,
                    server_gbps: r.server.as_ref().and_then(|s| s.gbps),
                    sent_gbps: r.gbps,
                    sent_packets: r.sent_packets,
                    received_packets: r.server.as_ref().map(|s| s.received_packets),
                    loss_percent: r.server.as_ref().map(|s| s.loss_percent),
                    complete: r.complete,
                }),
                Err(e) => {
                    result = Err(Error::runtime(format!(
                        "sweep at buffer {size} with {n} client(s): {e}"
                    )));
                    break 'outer;
                }
            }
            bar.inc();
        }
    }
    bar.finish();
    result?;
    Ok(SweepReport {
        server: base.server.to_string(),
        sizes: sizes.to_vec(),
        clients: clients.to_vec(),
        cells,
    })
}

/// Seed 001's markdown table: one row per buffer size, one speed column
/// per client count, receiver-side Gbit/s ("-" where the server did not
/// answer).
pub fn table(r: &SweepReport) -> String {
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

/// The table as a chart: Gbit/s received against buffer size, one line
/// per client count.
pub fn plot(r: &SweepReport, path: &Path) -> Result<()> {
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
    plot::draw(
        path,
        &plot::Chart {
            title: "udp_client sweep: receive rate at the server",
            x_label: "buffer size (bytes per datagram)",
            y_label: "Gbit/s received",
            log_x: false,
            series: &series,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
        };
        let t = table(&r);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("1 client |") && lines[0].contains("2 clients |"));
        assert!(lines[2].contains("1.10 Gbps") && lines[2].trim_end().ends_with("- |"));
        assert!(lines[3].contains("2.40 Gbps") && lines[3].contains("3.00 Gbps"));
    }
}
