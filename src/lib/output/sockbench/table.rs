//! Each sockbench suite's columns in the shared text table
//! ([`crate::output::table`]).

use crate::output::table::Columns;
use crate::sockbench::mux::MuxRow;
use crate::sockbench::tcp::TcpRow;
use crate::sockbench::udp::{Mode, UdpRow};
use crate::units::size_label;

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
impl Columns for crate::sockbench::ceiling::CeilingRow {
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
