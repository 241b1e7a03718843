//! `--iperf3-json`: one document in the shape of iperf3's `-J` output for
//! a UDP test, for the tools that already read iperf3 (perfSONAR's
//! pScheduler, the iperf3 Python module, iperf3_exporter, Kubernetes'
//! netperf tests). `docs/output.md` ("iperf3's JSON") maps every field to
//! the netspeed figure it comes from.
//!
//! Why a model of its own ([`Test`]): the client's reports
//! ([`client`]: an upload's `RunReport`, `-R` and `--bidir`'s
//! `DuplexReport`) and the server's events ([`server`]) say the same
//! things in different shapes. Each is turned into one model of flows,
//! streams and intervals, and [`document`] writes that model the one way
//! iperf3 does, with iperf3's quirks that its readers rely on: `end.sum`
//! has the sender's bytes and rate beside the receiver's jitter and loss,
//! `sum_sent` carries zeros for jitter and loss, `sum_received` is the
//! receiver's own count, `sender` is the local end's role except in
//! `sum_sent` (always true) and `sum_received` (always false), counts are
//! integers, and no number is NaN or infinite.
//!
//! Pure: no sockets, no clock (the wall-clock time of the test is an
//! input), so every field is unit-tested on constructed reports.

pub mod client;
pub mod server;

use serde_json::{json, Map, Value};
use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

/// Which end writes the document: iperf3 names the other end
/// `connecting_to` on the client and `accepted_connection` on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// `start`: who ran the test, when, and with what settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    /// `netspeed 0.1.0`: iperf3 writes `iperf 3.12`; no reader parses it.
    pub version: String,
    /// uname's system, release and machine: `Linux 6.1.0-18-amd64 x86_64`.
    pub system_info: String,
    /// When the test started, on the wall clock.
    pub started: SystemTime,
    pub role: Role,
    /// The other end: the server the client sent to, or the client the
    /// server served.
    pub peer: Option<SocketAddr>,
    pub test_start: TestStart,
}

/// `start.test_start`. What an end does not know (the server does not
/// know the client's `-t`) is `None`, and left out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TestStart {
    /// Streams per direction (`-P`).
    pub num_streams: u64,
    /// The datagram size (`-b`, iperf3's `-l`).
    pub blksize: Option<u64>,
    /// `--duration` in whole seconds (rounded up), 0 for a volume.
    pub duration: Option<u64>,
    /// `-t`: bytes, 0 unless the run is a byte total.
    pub bytes: Option<u64>,
    /// `-n`: datagrams, 0 unless the run is a datagram count.
    pub blocks: Option<u64>,
    pub reverse: bool,
    pub bidir: bool,
    /// `--rate` per stream, bit/s; 0 unpaced (iperf3's `-b 0`).
    pub target_bitrate: Option<u64>,
    /// `--interval` in seconds; 0 when off.
    pub interval: f64,
}

/// One direction of the test and its streams, as one end saw it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Flow {
    /// Client to server (an upload) or server to client (a reverse
    /// stream). With `--bidir` the client-to-server flow is `sum` and the
    /// other `sum_bidir_reverse`, on both ends, as iperf3 names them.
    pub client_to_server: bool,
    /// The end writing the document sends on this flow (`sender`).
    pub local_sends: bool,
    pub streams: Vec<Stream>,
    /// The flow's sender span and rate over all its streams, as netspeed
    /// reports them (`None` when not known).
    pub sent_total: Option<Span>,
    /// The same on the receiver's side.
    pub received_total: Option<Span>,
}

/// A span and the rate over it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Span {
    pub seconds: f64,
    pub bits_per_second: f64,
}

/// One stream: one client socket, one netspeed session.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stream {
    /// iperf3's socket number; netspeed numbers the streams from 1.
    pub socket: u64,
    pub local: Endpoint,
    pub remote: Endpoint,
    /// What its sender sent, when this end knows it.
    pub sent: Option<Side>,
    /// What its receiver counted, when this end knows it.
    pub received: Option<Received>,
    /// Its interval lines, in order.
    pub intervals: Vec<Tick>,
}

/// An address as iperf3 writes it: host and port apart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    /// `127.0.0.1:5201` or `[::1]:5201` as netspeed's reports write it.
    pub fn parse(text: &str) -> Endpoint {
        match text.parse::<SocketAddr>() {
            Ok(a) => Endpoint::of(a),
            Err(_) => Endpoint {
                host: text.to_string(),
                port: 0,
            },
        }
    }

    pub fn of(addr: SocketAddr) -> Endpoint {
        Endpoint {
            host: addr.ip().to_canonical().to_string(),
            port: addr.port(),
        }
    }
}

/// Datagrams, bytes, the span and the rate of one side of a stream.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Side {
    pub packets: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub bits_per_second: f64,
}

/// The receiver's side: its count, and what it found missing or out of
/// order.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Received {
    pub side: Side,
    /// The exact loss (from the sender's declared total).
    pub lost: u64,
    /// Datagrams that arrived after one with a higher sequence number.
    pub out_of_order: u64,
    pub jitter_ms: f64,
}

/// One interval of one stream, seconds from the stream's start.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tick {
    pub start: f64,
    pub end: f64,
    pub bytes: u64,
    /// Datagrams, where the end that writes the line counts them.
    pub packets: Option<u64>,
    pub bits_per_second: f64,
    /// On the receiving end: the running jitter and the loss in this
    /// interval.
    pub loss: Option<TickLoss>,
}

/// A receiving interval's jitter and loss.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TickLoss {
    pub jitter_ms: f64,
    /// Lost in this interval: the growth of the running loss, which
    /// shrinks when a late datagram fills a hole (so it can be negative,
    /// as iperf3's can).
    pub lost: i64,
}

/// `cpu_utilization_percent`: percent of one core, iperf3's unit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuPercent {
    pub total: f64,
    pub user: f64,
    pub system: f64,
}

impl CpuPercent {
    /// A netspeed CPU figure in iperf3's terms: its share of one core
    /// over its span, split into user and system in the proportion of
    /// their CPU seconds (0 where netspeed does not split them).
    pub fn of(cost: &crate::stats::CpuCost) -> CpuPercent {
        let total = cost.percent_of_core.unwrap_or(0.0);
        let part = |s: Option<f64>| match s {
            Some(s) if cost.seconds > 0.0 => total * s / cost.seconds,
            _ => 0.0,
        };
        CpuPercent {
            total,
            user: part(cost.user_seconds),
            system: part(cost.system_seconds),
        }
    }

    /// Two figures of threads that ran side by side.
    pub fn plus(self, other: CpuPercent) -> CpuPercent {
        CpuPercent {
            total: self.total + other.total,
            user: self.user + other.user,
            system: self.system + other.system,
        }
    }
}

/// Both ends' CPU: this end's (`host_*`) and the other's (`remote_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Cpu {
    pub host: CpuPercent,
    pub remote: CpuPercent,
}

/// A whole test as iperf3 would report it.
#[derive(Debug, Clone, PartialEq)]
pub struct Test {
    pub meta: Meta,
    /// Client to server first. Empty when the test never ran (an error
    /// document).
    pub flows: Vec<Flow>,
    pub cpu: Cpu,
    /// Why the test failed, was cut short or cannot be trusted: iperf3's
    /// top-level `error`.
    pub error: Option<String>,
}

/// The document: `start`, `intervals`, `end`, and `error` when there is
/// one.
pub fn document(test: &Test) -> Value {
    let mut doc = Map::new();
    doc.insert("start".into(), start(test));
    doc.insert("intervals".into(), Value::Array(intervals(test)));
    doc.insert("end".into(), end(test));
    if let Some(e) = &test.error {
        doc.insert("error".into(), json!(e));
    }
    Value::Object(doc)
}

/// A finite number; 0 for what would be NaN or infinite (iperf3 guards
/// its divisions the same way: `sender_time > 0 ? ... : 0.0`).
fn num(x: f64) -> Value {
    json!(if x.is_finite() { x } else { 0.0 })
}

/// `x × 8 / seconds`, 0 over no time.
fn bits_per_second(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 * 8.0 / seconds
    } else {
        0.0
    }
}

/// `part × 100 / whole`, 0 of nothing.
fn percent(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        part * 100.0 / whole
    } else {
        0.0
    }
}

/// The name of a flow's summary object: `sum`, `sum_sent`,
/// `sum_received`, with `_bidir_reverse` for the server-to-client flow of
/// a two-way test.
fn sum_name(test: &Test, flow: &Flow, kind: &str) -> String {
    let bidir = test.flows.len() > 1 && !flow.client_to_server;
    format!("sum{kind}{}", if bidir { "_bidir_reverse" } else { "" })
}

fn start(test: &Test) -> Value {
    let meta = &test.meta;
    let connected: Vec<Value> = test
        .flows
        .iter()
        .flat_map(|f| &f.streams)
        .map(|s| {
            json!({
                "socket": s.socket,
                "local_host": s.local.host,
                "local_port": s.local.port,
                "remote_host": s.remote.host,
                "remote_port": s.remote.port,
            })
        })
        .collect();
    let mut start = Map::new();
    start.insert("connected".into(), Value::Array(connected));
    start.insert("version".into(), json!(meta.version));
    start.insert("system_info".into(), json!(meta.system_info));
    let (time, secs, millis) = http_date(meta.started);
    start.insert(
        "timestamp".into(),
        json!({ "time": time, "timesecs": secs, "timemillisecs": millis }),
    );
    if let Some(peer) = meta.peer {
        let key = match meta.role {
            Role::Client => "connecting_to",
            Role::Server => "accepted_connection",
        };
        let peer = Endpoint::of(peer);
        start.insert(key.into(), json!({ "host": peer.host, "port": peer.port }));
    }
    let t = &meta.test_start;
    if let Some(rate) = t.target_bitrate {
        start.insert("target_bitrate".into(), json!(rate));
    }
    let mut test_start = Map::new();
    test_start.insert("protocol".into(), json!("UDP"));
    test_start.insert("num_streams".into(), json!(t.num_streams));
    let optional = [
        ("blksize", t.blksize),
        ("duration", t.duration),
        ("bytes", t.bytes),
        ("blocks", t.blocks),
        ("target_bitrate", t.target_bitrate),
    ];
    for (key, value) in optional {
        if let Some(v) = value {
            test_start.insert(key.into(), json!(v));
        }
    }
    test_start.insert("omit".into(), json!(0));
    test_start.insert("reverse".into(), json!(u8::from(t.reverse)));
    test_start.insert("bidir".into(), json!(u8::from(t.bidir)));
    test_start.insert("tos".into(), json!(0));
    test_start.insert("interval".into(), num(t.interval));
    start.insert("test_start".into(), Value::Object(test_start));
    Value::Object(start)
}

/// The wall-clock time as iperf3's `timestamp` has it: RFC 1123 in GMT
/// (`Fri, 27 Nov 2026 18:14:18 GMT`), Unix seconds and milliseconds.
pub fn http_date(t: SystemTime) -> (String, u64, u64) {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    // `2026-11-27T18:14:18Z`: the calendar is humantime's.
    let iso = humantime::format_rfc3339_seconds(t).to_string();
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = iso
        .get(5..7)
        .and_then(|m| m.parse::<usize>().ok())
        .and_then(|m| MONTHS.get(m.wrapping_sub(1)))
        .copied()
        .unwrap_or("Jan");
    let text = format!(
        "{}, {} {month} {} {} GMT",
        DAYS[((secs / 86_400) % 7) as usize],
        iso.get(8..10).unwrap_or("01"),
        iso.get(0..4).unwrap_or("1970"),
        iso.get(11..19).unwrap_or("00:00:00"),
    );
    (text, secs, since.as_millis() as u64)
}

/// One interval object: iperf3's sender shape (`bytes`, `packets`) on a
/// sending end, its receiver shape (with `jitter_ms`, `lost_packets`,
/// `lost_percent`) on a receiving one; `socket` for a stream, none for a
/// sum.
fn tick_json(socket: Option<u64>, t: &Tick, sender: bool) -> Value {
    let mut o = Map::new();
    if let Some(s) = socket {
        o.insert("socket".into(), json!(s));
    }
    o.insert("start".into(), num(t.start));
    o.insert("end".into(), num(t.end));
    o.insert("seconds".into(), num(t.end - t.start));
    o.insert("bytes".into(), json!(t.bytes));
    o.insert("bits_per_second".into(), num(t.bits_per_second));
    if let (false, Some(loss)) = (sender, t.loss) {
        let expected = t.packets.unwrap_or(0) as f64 + loss.lost as f64;
        o.insert("jitter_ms".into(), num(loss.jitter_ms));
        o.insert("lost_packets".into(), json!(loss.lost));
        o.insert(
            "lost_percent".into(),
            num(percent(loss.lost as f64, expected)),
        );
    }
    if let Some(p) = t.packets {
        o.insert("packets".into(), json!(p));
    }
    o.insert("omitted".into(), json!(false));
    o.insert("sender".into(), json!(sender));
    Value::Object(o)
}

/// The streams' i-th intervals as one: bytes, datagrams and loss added,
/// jitter averaged (iperf3's `sum`), over the time they span together.
fn sum_ticks(ticks: &[&Tick]) -> Option<Tick> {
    let first = ticks.first()?;
    let start = ticks.iter().map(|t| t.start).fold(first.start, f64::min);
    let end = ticks.iter().map(|t| t.end).fold(first.end, f64::max);
    let bytes = ticks.iter().map(|t| t.bytes).sum();
    let packets = ticks.iter().map(|t| t.packets).sum::<Option<u64>>();
    let losses: Option<Vec<TickLoss>> = ticks.iter().map(|t| t.loss).collect();
    let loss = losses.map(|l| TickLoss {
        jitter_ms: l.iter().map(|x| x.jitter_ms).sum::<f64>() / l.len() as f64,
        lost: l.iter().map(|x| x.lost).sum(),
    });
    Some(Tick {
        start,
        end,
        bytes,
        packets,
        bits_per_second: bits_per_second(bytes, end - start),
        loss,
    })
}

fn intervals(test: &Test) -> Vec<Value> {
    let count = test
        .flows
        .iter()
        .flat_map(|f| &f.streams)
        .map(|s| s.intervals.len())
        .max()
        .unwrap_or(0);
    (0..count)
        .map(|i| {
            let mut streams = Vec::new();
            let mut line = Map::new();
            for flow in &test.flows {
                let mut ticks = Vec::new();
                for s in &flow.streams {
                    if let Some(t) = s.intervals.get(i) {
                        streams.push(tick_json(Some(s.socket), t, flow.local_sends));
                        ticks.push(t);
                    }
                }
                if let Some(sum) = sum_ticks(&ticks) {
                    line.insert(
                        sum_name(test, flow, ""),
                        tick_json(None, &sum, flow.local_sends),
                    );
                }
            }
            line.insert("streams".into(), Value::Array(streams));
            Value::Object(line)
        })
        .collect()
}

/// A summary object: every one in `end` has these keys.
#[allow(clippy::too_many_arguments)]
fn summary(
    seconds: f64,
    bytes: u64,
    bps: f64,
    jitter_ms: f64,
    lost: u64,
    packets: u64,
    lost_percent: f64,
    sender: bool,
) -> Value {
    json!({
        "start": 0,
        "end": num(seconds),
        "seconds": num(seconds),
        "bytes": bytes,
        "bits_per_second": num(bps),
        "jitter_ms": num(jitter_ms),
        "lost_packets": lost,
        "packets": packets,
        "lost_percent": num(lost_percent),
        "sender": sender,
    })
}

impl Stream {
    /// What the sender sent: its count where known, else what arrived
    /// and what was lost (the datagrams the receiver expected).
    fn expected(&self) -> u64 {
        match (&self.sent, &self.received) {
            (Some(s), _) => s.packets,
            (None, Some(r)) => r.side.packets + r.lost,
            (None, None) => 0,
        }
    }

    /// `end.streams[].udp`: the sender's bytes, rate and span, the
    /// receiver's jitter, loss and reordering.
    fn end_json(&self, sender: bool) -> Value {
        let sent = self.sent.unwrap_or_default();
        let r = self.received.unwrap_or_default();
        let seconds = match (&self.sent, &self.received) {
            (Some(s), _) => s.seconds,
            (None, Some(r)) => r.side.seconds,
            (None, None) => 0.0,
        };
        let expected = self.expected();
        json!({
            "udp": {
                "socket": self.socket,
                "start": 0,
                "end": num(seconds),
                "seconds": num(seconds),
                "bytes": sent.bytes,
                "bits_per_second": num(sent.bits_per_second),
                "jitter_ms": num(r.jitter_ms),
                "lost_packets": r.lost,
                "packets": expected,
                "lost_percent": num(percent(r.lost as f64, expected as f64)),
                "out_of_order": r.out_of_order,
                "sender": sender,
            }
        })
    }
}

/// `sum`, `sum_sent` and `sum_received` of one flow, by name.
fn flow_sums(test: &Test, flow: &Flow) -> Vec<(String, Value)> {
    let streams = &flow.streams;
    let sent_bytes: u64 = streams.iter().filter_map(|s| s.sent).map(|s| s.bytes).sum();
    let sent_packets: u64 = streams
        .iter()
        .filter_map(|s| s.sent)
        .map(|s| s.packets)
        .sum();
    let expected: u64 = streams.iter().map(Stream::expected).sum();
    let received: Vec<&Received> = streams.iter().filter_map(|s| s.received.as_ref()).collect();
    let lost: u64 = received.iter().map(|r| r.lost).sum();
    let jitter = if received.is_empty() {
        0.0
    } else {
        received.iter().map(|r| r.jitter_ms).sum::<f64>() / received.len() as f64
    };
    let sent_span = flow.sent_total.unwrap_or_default();
    let received_span = flow.received_total.unwrap_or_default();
    let loss_percent = percent(lost as f64, expected as f64);
    let receiver_seconds = flow.received_total.map_or(sent_span.seconds, |s| s.seconds);
    vec![
        (
            sum_name(test, flow, ""),
            summary(
                receiver_seconds,
                sent_bytes,
                sent_span.bits_per_second,
                jitter,
                lost,
                expected,
                loss_percent,
                flow.local_sends,
            ),
        ),
        (
            sum_name(test, flow, "_sent"),
            summary(
                sent_span.seconds,
                sent_bytes,
                sent_span.bits_per_second,
                0.0,
                0,
                sent_packets,
                0.0,
                true,
            ),
        ),
        (
            sum_name(test, flow, "_received"),
            summary(
                received_span.seconds,
                received.iter().map(|r| r.side.bytes).sum(),
                received_span.bits_per_second,
                jitter,
                lost,
                received.iter().map(|r| r.side.packets).sum(),
                loss_percent,
                false,
            ),
        ),
    ]
}

fn end(test: &Test) -> Value {
    if test.flows.is_empty() {
        return json!({});
    }
    let mut end = Map::new();
    let streams: Vec<Value> = test
        .flows
        .iter()
        .flat_map(|f| f.streams.iter().map(|s| s.end_json(f.local_sends)))
        .collect();
    end.insert("streams".into(), Value::Array(streams));
    for flow in &test.flows {
        for (name, value) in flow_sums(test, flow) {
            end.insert(name, value);
        }
    }
    let Cpu { host, remote } = test.cpu;
    end.insert(
        "cpu_utilization_percent".into(),
        json!({
            "host_total": num(host.total),
            "host_user": num(host.user),
            "host_system": num(host.system),
            "remote_total": num(remote.total),
            "remote_user": num(remote.user),
            "remote_system": num(remote.system),
        }),
    );
    Value::Object(end)
}

/// `uname`'s system, release and machine, as iperf3's `system_info`
/// begins (the node name and the kernel's build string are left out).
pub fn system_info() -> String {
    let os = match std::env::consts::OS {
        "linux" => "Linux",
        "macos" => "Darwin",
        "freebsd" => "FreeBSD",
        "openbsd" => "OpenBSD",
        "netbsd" => "NetBSD",
        other => other,
    };
    let release = crate::sys::kernel_release().unwrap_or_default();
    [os, release.as_str(), std::env::consts::ARCH]
        .iter()
        .filter(|s| !s.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ")
}

/// `netspeed 0.1.0`.
pub fn version() -> String {
    format!("netspeed {}", env!("CARGO_PKG_VERSION"))
}

#[cfg(test)]
mod tests;
