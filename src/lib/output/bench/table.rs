//! The aligned text table every suite prints, and each suite's columns.
//!
//! Why one renderer: a suite only says which columns it has and how a
//! row fills them ([`Columns`]); widths, alignment and the rule under the
//! header are decided once, in [`Table::render`].

use crate::bench::mux::MuxRow;
use crate::bench::sweep::SweepReport;
use crate::bench::tcp::TcpRow;
use crate::bench::udp::{Mode, UdpRow};
use crate::units::size_label;

/// A text table: a header row and rows of already-formatted cells.
#[derive(Debug, Clone, Default)]
pub struct Table {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    /// Columns padded to their widest cell; cells that look like numbers
    /// are right-aligned so that digits line up.
    pub fn render(&self) -> String {
        let cols = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(cols) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        // A column whose cells are all numbers is right-aligned, header too.
        let numeric: Vec<bool> = (0..cols)
            .map(|i| {
                !self.rows.is_empty()
                    && self
                        .rows
                        .iter()
                        .all(|r| r.get(i).is_some_and(|c| looks_numeric(c) || c == "-"))
            })
            .collect();
        let line = |cells: &[String]| {
            let mut out = String::new();
            for (i, w) in widths.iter().enumerate() {
                let cell = cells.get(i).map(String::as_str).unwrap_or("");
                if i > 0 {
                    out.push_str("  ");
                }
                if numeric[i] || looks_numeric(cell) {
                    out.push_str(&format!("{cell:>w$}"));
                } else {
                    out.push_str(&format!("{cell:<w$}"));
                }
            }
            out.trim_end().to_string()
        };
        let mut out = line(&self.headers);
        out.push('\n');
        let total: usize = widths.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
        out.push_str(&"-".repeat(total));
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
            out.push('\n');
        }
        out
    }
}

fn looks_numeric(cell: &str) -> bool {
    let c = cell.trim_end_matches('%');
    !c.is_empty() && c.parse::<f64>().is_ok()
}

/// A row type's columns: the header and one row's cells.
pub trait Columns {
    const HEADERS: &'static [&'static str];
    fn cells(&self) -> Vec<String>;
}

/// The rows as a table.
pub fn table<R: Columns>(rows: &[R]) -> Table {
    let mut t = Table::new(R::HEADERS);
    for r in rows {
        t.push(r.cells());
    }
    t
}

/// `sockbench udp`: one row per configuration, the axes as columns.
impl Columns for UdpRow {
    const HEADERS: &'static [&'static str] = &[
        "socket",
        "mode",
        "threads",
        "tx+rx",
        "rx socks",
        "conn",
        "ip",
        "payload",
        "reuse",
        "Mbit/s",
        "kpkt/s",
        "loss %",
        "rx active",
        "rtt us",
    ];
    fn cells(&self) -> Vec<String> {
        let r = self;
        vec![
            r.socket.name().into(),
            match r.mode {
                Mode::Stream => "stream".into(),
                Mode::PingPong => "ping-pong".into(),
            },
            r.threads.to_string(),
            format!("{}+{}", r.senders, r.receivers),
            r.rx_sockets.to_string(),
            format!("{:?}", r.conn).to_lowercase(),
            format!("{:?}", r.ip).to_lowercase(),
            r.payload.to_string(),
            format!("{:?}", r.reuse).to_lowercase(),
            format!("{:.2}", r.mbit_per_s * 1e6 / 1e6),
            format!("{:.1}", r.packets_per_s / 1e3),
            format!("{:.2}", r.loss_percent),
            format!("{}/{}", r.active_receivers, r.receivers),
            r.rtt_us
                .map(|v| format!("{v:.1}"))
                .unwrap_or_else(|| "-".into()),
        ]
    }
}

/// `sockbench tcp`: times in ms and how noisy each cell was.
impl Columns for TcpRow {
    const HEADERS: &'static [&'static str] = &[
        "impl",
        "duplex",
        "chunk",
        "conns",
        "MB/sample",
        "mean ms",
        "std dev",
        "min",
        "median",
        "max",
        "outliers m/s",
        "outlier var",
        "Gbit/s",
    ];
    fn cells(&self) -> Vec<String> {
        let r = self;
        vec![
            r.implementation.name().into(),
            format!("{:?}", r.duplex).to_lowercase(),
            r.chunk.to_string(),
            r.concurrency.to_string(),
            format!("{:.1}", r.bytes_per_sample as f64 / 1e6),
            format!("{:.2}", r.mean_ms),
            format!("{:.2}", r.std_dev_ms),
            format!("{:.2}", r.min_ms),
            format!("{:.2}", r.median_ms),
            format!("{:.2}", r.max_ms),
            format!("{}/{}", r.outliers_mild, r.outliers_severe),
            format!("{:.0}% {}", r.outlier_variance_percent, r.noise.phrase()),
            format!("{:.2}", r.gbit_per_s),
        ]
    }
}

/// `sockbench ceiling`: the bare path per size.
impl Columns for crate::bench::ceiling::CeilingRow {
    const HEADERS: &'static [&'static str] =
        &["size", "path", "segments", "Gbit/s", "Mpps", "delivered %"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.size.to_string(),
            self.send_path.clone(),
            self.segments.to_string(),
            format!("{:.2}", self.gbps),
            format!("{:.3}", self.mpps),
            format!("{:.1}", self.delivered * 100.0),
        ]
    }
}

/// `sockbench mux`: seed 002's columns, plus the method and what the
/// kernel granted.
impl Columns for MuxRow {
    const HEADERS: &'static [&'static str] = &[
        "method",
        "K",
        "conn",
        "payload",
        "scheduler",
        "rate",
        "RcvBuf",
        "granted",
        "sent",
        "loss %",
        "Data Mbit/s",
        "Wire Mbit/s",
    ];
    fn cells(&self) -> Vec<String> {
        let r = self;
        vec![
            r.method.name().into(),
            r.sockets.to_string(),
            format!("{:?}", r.conn).to_lowercase(),
            r.payload.to_string(),
            format!("SCHED_{:?}", r.scheduler).to_uppercase(),
            if r.rate_mbit > 0.0 {
                format!("{:.0}M", r.rate_mbit)
            } else {
                "unpaced".into()
            },
            size_label(r.rcvbuf as u64),
            r.rcvbuf_granted.to_string(),
            r.sent_packets.to_string(),
            format!("{:.3}", r.loss_percent),
            format!("{:.1}", r.data_mbit_per_s),
            format!("{:.1}", r.wire_mbit_per_s),
        ]
    }
}

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
        "udp_client --sweep-clients to {}: {size}-byte datagrams, each client the same volume\n\n",
        r.server
    );
    out += &t.render();
    out += "\nReceived rates and losses are from the server's answers; kernel drops are its socket's while each run went on (anyone's).";
    if r.first_overflow.is_none() {
        out += "\nThe server's buffer never overflowed at these client counts.";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::sweep::SweepCell;

    #[test]
    fn table_aligns_numbers_right() {
        let mut t = Table::new(&["name", "rate"]);
        t.push(vec!["std".into(), "1.5".into()]);
        t.push(vec!["socket2".into(), "100.25".into()]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "name       rate");
        assert_eq!(lines[2], "std         1.5");
        assert_eq!(lines[3], "socket2  100.25");
    }

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
        };
        let t = sweep_table(&r);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("1 client |") && lines[0].contains("2 clients |"));
        assert!(lines[2].contains("1.10 Gbps") && lines[2].trim_end().ends_with("- |"));
        assert!(lines[3].contains("2.40 Gbps") && lines[3].contains("3.00 Gbps"));
    }
}
