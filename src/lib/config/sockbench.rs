//! sockbench's settings: one struct per suite that is both its flags
//! (clap) and its `--config` TOML file (serde), layered by
//! [`super::layered`]: defaults < file < flags. The TOML keys are the long
//! flags with underscores (`impl` for `--impl`); list flags take TOML
//! arrays (`payload = [64, "8K"]`). Output flags (`--json`, `--csv`,
//! `--plot`, `--quiet`) are flags only.
//!
//! Also here: the values of the matrix axes (socket library, connection
//! mode, IP version, reuse option, TCP implementation, duplex), because a
//! setting's type belongs with the setting; [`crate::sockbench`] re-exports
//! them.

use super::{file_layer, layered, rate_arg, DurationValue, SizeValue};
use crate::congestion::{congestion_arg, Congestion};
use crate::error::Result;
use crate::meter::recv::Method;
use crate::sys::SchedPolicy;
use clap::{Parser, Subcommand};
use serde::{Deserialize, Deserializer, Serialize};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// `sockbench`'s command line.
#[derive(Parser, Debug)]
#[command(
    name = "sockbench",
    version = super::VERSION_TEXT,
    about = "Socket benchmark matrices over loopback: UDP socket libraries, TCP transfers, and receive methods.",
    long_about = None,
    after_help = super::EXTRA_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub suite: Suite,
}

#[derive(Subcommand, Debug)]
pub enum Suite {
    /// UDP throughput across socket libraries, threads, connected or not, IPv4/IPv6 and payload sizes.
    Udp(UdpArgs),
    /// TCP transfers, half and full duplex, repeated with statistics.
    Tcp(TcpArgs),
    /// One receiver waiting on K UDP sockets, per receive method and buffer size.
    Mux(MuxArgs),
    /// netspeed's default UDP path with no accounting, and one core's memcpy: the ceiling
    /// that udp_client and udp_server are measured against.
    Ceiling(CeilingArgs),
}

impl Suite {
    /// The output flags every suite has.
    pub fn out(&self) -> &OutputArgs {
        match self {
            Suite::Udp(a) => &a.out,
            Suite::Tcp(a) => &a.out,
            Suite::Mux(a) => &a.out,
            Suite::Ceiling(a) => &a.out,
        }
    }
}

/// Output flags shared by every suite (flags only, never in the file).
#[derive(clap::Args, Debug, Default, Clone)]
pub struct OutputArgs {
    /// Print the rows as JSON.
    #[arg(long)]
    pub json: bool,
    /// Print the rows as CSV.
    #[arg(long)]
    pub csv: bool,
    /// Also draw the results into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// No progress bar and no estimate line.
    #[arg(short, long)]
    pub quiet: bool,
    /// Read the suite's settings from a TOML file; flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

crate::impl_layer!(OutputArgs {
    option: [plot, config]
    switch: [json, csv, quiet]
});

/// The socket library under test.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum SocketKind {
    Std,
    Socket2,
    Nix,
    Tokio,
    /// smol / async-io: a futures runtime other than tokio.
    Async,
}

impl SocketKind {
    pub fn name(self) -> &'static str {
        match self {
            SocketKind::Std => "std",
            SocketKind::Socket2 => "socket2",
            SocketKind::Nix => "nix",
            SocketKind::Tokio => "tokio",
            SocketKind::Async => "async",
        }
    }
}

/// Whether senders `connect` and `send`, or `send_to` every datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Conn {
    Unconnected,
    Connected,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ip {
    V4,
    V6,
}

impl Ip {
    /// The loopback address: 127.0.0.1 or ::1 (seed 000 sent to ::).
    pub fn loopback(self, port: u16) -> SocketAddr {
        match self {
            Ip::V4 => (Ipv4Addr::LOCALHOST, port).into(),
            Ip::V6 => (Ipv6Addr::LOCALHOST, port).into(),
        }
    }

    /// The largest UDP payload over this IP version.
    pub fn max_payload(self) -> usize {
        match self {
            Ip::V4 => crate::sys::MAX_UDP_PAYLOAD_V4,
            Ip::V6 => crate::sys::MAX_UDP_PAYLOAD_V6,
        }
    }
}

/// How receivers share the address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reuse {
    /// One receiving socket, read by every receiver thread.
    None,
    /// One socket per receiver, all bound with SO_REUSEADDR.
    Addr,
    /// One socket per receiver, all bound with SO_REUSEPORT (the kernel
    /// spreads flows over them by a hash of the addresses).
    Port,
}

/// Which socket implementation moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Impl {
    /// std::net blocking sockets, a thread per connection and direction.
    Std,
    /// tokio, current-thread runtime.
    TokioCt,
    /// tokio, multi-thread runtime with two workers.
    TokioMt,
}

impl Impl {
    pub fn name(self) -> &'static str {
        match self {
            Impl::Std => "std",
            Impl::TokioCt => "tokio-ct",
            Impl::TokioMt => "tokio-mt",
        }
    }
}

/// One direction or both at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Duplex {
    Half,
    Full,
}

/// Sizes from a flag or the file, in bytes.
fn sizes(values: Option<Vec<SizeValue>>, key: &str) -> Result<Vec<u64>> {
    values
        .unwrap_or_default()
        .iter()
        .map(|v| v.bytes(key))
        .collect()
}

fn duration(value: Option<DurationValue>, key: &str) -> Result<Duration> {
    value.map_or(Ok(Duration::ZERO), |v| v.duration(key))
}

/// Reads the file named by `--config` and layers defaults < file < flags.
fn merge<L: super::Layer + serde::de::DeserializeOwned + Clone>(
    defaults: L,
    flags: &L,
    out: &OutputArgs,
) -> Result<L> {
    let file = file_layer(out.config.as_deref())?;
    Ok(layered(defaults, file, flags.clone()))
}

/// A value parsed from the file's text by the same parser as the flag's.
fn parsed<'de, D: Deserializer<'de>, T, E: std::fmt::Display>(
    d: D,
    parse: fn(&str) -> std::result::Result<T, E>,
) -> std::result::Result<Option<T>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Number(u64),
        Text(String),
    }
    let text = match Raw::deserialize(d)? {
        Raw::Number(n) => n.to_string(),
        Raw::Text(t) => t,
    };
    parse(&text).map(Some).map_err(serde::de::Error::custom)
}

// ------------------------------------------------------------------ udp

/// `sockbench udp` flags, and its `--config` file.
#[derive(clap::Args, Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UdpArgs {
    /// Socket libraries to test [default: std,socket2,nix,tokio,async].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub socket: Option<Vec<SocketKind>>,
    /// Threads per configuration, split between senders and receivers
    /// (1 is a ping-pong row; 3 is 2 senders and 1 receiver) [default: 1,2].
    #[arg(long, value_delimiter = ',')]
    pub threads: Option<Vec<usize>>,
    /// Sender socket mode [default: unconnected,connected].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub conn: Option<Vec<Conn>>,
    /// IP version (loopback 127.0.0.1 or ::1) [default: v4,v6].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub ip: Option<Vec<Ip>>,
    /// UDP payload sizes in bytes (at least 1) [default: 26,300,1460].
    #[arg(long, value_delimiter = ',', value_parser = SizeValue::from_arg)]
    pub payload: Option<Vec<SizeValue>>,
    /// How receivers share the address [default: port].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub reuse: Option<Vec<Reuse>>,
    /// Measured time per configuration [default: 1s].
    #[arg(long, value_parser = DurationValue::from_arg)]
    pub duration: Option<DurationValue>,
    /// Unmeasured time before it [default: 100ms].
    #[arg(long, value_parser = DurationValue::from_arg)]
    pub warmup: Option<DurationValue>,
    #[command(flatten)]
    #[serde(skip)]
    pub out: OutputArgs,
}

crate::impl_layer!(UdpArgs {
    option: [socket, threads, conn, ip, payload, reuse, duration, warmup]
    nested: [out]
});

/// `sockbench udp`'s merged settings (ranges are checked by the suite).
#[derive(Debug, Clone)]
pub struct UdpSettings {
    pub socket: Vec<SocketKind>,
    pub threads: Vec<usize>,
    pub conn: Vec<Conn>,
    pub ip: Vec<Ip>,
    pub payload: Vec<u64>,
    pub reuse: Vec<Reuse>,
    pub duration: Duration,
    pub warmup: Duration,
}

impl UdpArgs {
    pub fn defaults() -> Self {
        UdpArgs {
            socket: Some(vec![
                SocketKind::Std,
                SocketKind::Socket2,
                SocketKind::Nix,
                SocketKind::Tokio,
                SocketKind::Async,
            ]),
            threads: Some(vec![1, 2]),
            conn: Some(vec![Conn::Unconnected, Conn::Connected]),
            ip: Some(vec![Ip::V4, Ip::V6]),
            payload: Some([26, 300, 1460].map(SizeValue::Number).to_vec()),
            reuse: Some(vec![Reuse::Port]),
            duration: Some(DurationValue::Parsed(Duration::from_secs(1))),
            warmup: Some(DurationValue::Parsed(Duration::from_millis(100))),
            out: OutputArgs::default(),
        }
    }

    /// Defaults < `--config` file < flags.
    pub fn settings(&self) -> Result<UdpSettings> {
        let m = merge(Self::defaults(), self, &self.out)?;
        Ok(UdpSettings {
            socket: m.socket.unwrap_or_default(),
            threads: m.threads.unwrap_or_default(),
            conn: m.conn.unwrap_or_default(),
            ip: m.ip.unwrap_or_default(),
            payload: sizes(m.payload, "payload")?,
            reuse: m.reuse.unwrap_or_default(),
            duration: duration(m.duration, "duration")?,
            warmup: duration(m.warmup, "warmup")?,
        })
    }
}

// ------------------------------------------------------------------ tcp

fn congestion_de<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Congestion>, D::Error> {
    parsed(d, congestion_arg)
}

/// `sockbench tcp` flags, and its `--config` file.
#[derive(clap::Args, Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpArgs {
    /// Implementations to compare [default: std,tokio-ct,tokio-mt].
    #[arg(long = "impl", value_enum, value_delimiter = ',')]
    #[serde(rename = "impl")]
    pub implementation: Option<Vec<Impl>>,
    /// Half duplex (one direction) and/or full duplex (both at once)
    /// [default: half,full].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub duplex: Option<Vec<Duplex>>,
    /// Bytes per write [default: 40,4000].
    #[arg(long, value_delimiter = ',', value_parser = SizeValue::from_arg)]
    pub chunk: Option<Vec<SizeValue>>,
    /// Concurrent connections per sample [default: 1,5].
    #[arg(long, value_delimiter = ',')]
    pub concurrency: Option<Vec<usize>>,
    /// Bytes per connection and direction (e.g. 1M, 100MB) [default: 4M].
    #[arg(long, value_parser = SizeValue::from_arg)]
    pub bytes: Option<SizeValue>,
    /// Measured samples per cell (after one warm-up sample) [default: 10].
    #[arg(long)]
    pub samples: Option<usize>,
    /// Set TCP_NODELAY on both ends (off by default: small writes are
    /// then coalesced by Nagle's algorithm).
    #[arg(long)]
    #[serde(default)]
    pub nodelay: bool,
    /// TCP congestion control for every socket of the run (TCP_CONGESTION),
    /// e.g. cubic, bbr, reno [default: the system's]. With BBR and no fq
    /// qdisc on loopback, the kernel's pacing timer, not the socket API,
    /// can set the pace; see docs/sockbench.md.
    #[arg(long, value_name = "ALGO", value_parser = congestion_arg)]
    #[serde(default, deserialize_with = "congestion_de")]
    pub congestion: Option<Congestion>,
    #[command(flatten)]
    #[serde(skip)]
    pub out: OutputArgs,
}

crate::impl_layer!(TcpArgs {
    option: [implementation, duplex, chunk, concurrency, bytes, samples, congestion]
    switch: [nodelay]
    nested: [out]
});

/// `sockbench tcp`'s merged settings.
#[derive(Debug, Clone)]
pub struct TcpSettings {
    pub implementation: Vec<Impl>,
    pub duplex: Vec<Duplex>,
    pub chunk: Vec<u64>,
    pub concurrency: Vec<usize>,
    pub bytes: u64,
    pub samples: usize,
    pub nodelay: bool,
    pub congestion: Option<Congestion>,
}

impl TcpArgs {
    pub fn defaults() -> Self {
        TcpArgs {
            implementation: Some(vec![Impl::Std, Impl::TokioCt, Impl::TokioMt]),
            duplex: Some(vec![Duplex::Half, Duplex::Full]),
            chunk: Some([40, 4000].map(SizeValue::Number).to_vec()),
            concurrency: Some(vec![1, 5]),
            bytes: Some(SizeValue::Number(4_000_000)),
            samples: Some(10),
            nodelay: false,
            congestion: None,
            out: OutputArgs::default(),
        }
    }

    /// Defaults < `--config` file < flags.
    pub fn settings(&self) -> Result<TcpSettings> {
        let m = merge(Self::defaults(), self, &self.out)?;
        Ok(TcpSettings {
            implementation: m.implementation.unwrap_or_default(),
            duplex: m.duplex.unwrap_or_default(),
            chunk: sizes(m.chunk, "chunk")?,
            concurrency: m.concurrency.unwrap_or_default(),
            bytes: m.bytes.map_or(Ok(0), |b| b.bytes("bytes"))?,
            samples: m.samples.unwrap_or_default(),
            nodelay: m.nodelay,
            congestion: m.congestion,
        })
    }
}

// ------------------------------------------------------------------ mux

/// `--rate`: [`rate_arg`], or `0` for an unpaced sender.
pub fn rate_or_zero(s: &str) -> std::result::Result<u64, crate::units::UnitError> {
    if s.trim() == "0" {
        return Ok(0);
    }
    rate_arg(s)
}

fn rate_de<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<u64>, D::Error> {
    parsed(d, rate_or_zero)
}

/// `sockbench ceiling` flags, and its `--config` file.
#[derive(clap::Args, Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CeilingArgs {
    /// UDP payload sizes in bytes [default: 64,1460,8972,65500].
    #[arg(long, value_delimiter = ',', value_parser = SizeValue::from_arg)]
    pub size: Option<Vec<SizeValue>>,
    /// How long each size runs [default: 3s].
    #[arg(long, value_parser = DurationValue::from_arg)]
    pub duration: Option<DurationValue>,
    #[command(flatten)]
    #[serde(skip)]
    pub out: OutputArgs,
}

crate::impl_layer!(CeilingArgs {
    option: [size, duration]
    nested: [out]
});

impl CeilingArgs {
    pub fn defaults() -> Self {
        CeilingArgs {
            size: Some([64, 1460, 8972, 65500].map(SizeValue::Number).to_vec()),
            duration: Some(DurationValue::Parsed(Duration::from_secs(3))),
            out: OutputArgs::default(),
        }
    }

    /// Defaults < `--config` file < flags: the sizes and the time per size.
    pub fn settings(&self) -> Result<(Vec<usize>, Duration)> {
        let m = merge(Self::defaults(), self, &self.out)?;
        let sizes = sizes(m.size, "size")?;
        Ok((
            sizes.into_iter().map(|s| s as usize).collect(),
            duration(m.duration, "duration")?,
        ))
    }
}

/// `sockbench mux` flags, and its `--config` file.
#[derive(clap::Args, Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MuxArgs {
    /// Receive methods to compare [default: thread,select,poll,epoll,tokio,mmsg].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub method: Option<Vec<Method>>,
    /// UDP sockets the receiver waits on (K) [default: 4].
    #[arg(long)]
    pub sockets: Option<usize>,
    /// UDP payload sizes in bytes [default: 64].
    #[arg(long, value_delimiter = ',', value_parser = SizeValue::from_arg)]
    pub payload: Option<Vec<SizeValue>>,
    /// Packets per configuration, over all sockets [default: 100000].
    #[arg(long)]
    pub total: Option<u64>,
    /// Receive buffer sizes to ask for (SO_RCVBUF, forced past the sysctl
    /// limit when running as root) [default: 64K,256K,2M,8M].
    #[arg(long, value_delimiter = ',', value_parser = SizeValue::from_arg)]
    pub rcvbuf: Option<Vec<SizeValue>>,
    /// Receiver scheduling policies (fifo and rr need root or
    /// CAP_SYS_NICE) [default: other].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub scheduler: Option<Vec<SchedPolicy>>,
    /// Realtime priority for fifo and rr (1..=99) [default: 10].
    #[arg(long)]
    pub priority: Option<i32>,
    /// Sender socket mode (`connected` uses one connected socket per
    /// target) [default: unconnected].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub conn: Option<Vec<Conn>>,
    /// Pace the sender to this payload rate (e.g. 100Mbit); `0` is
    /// unpaced [default: 100Mbit].
    #[arg(long, value_parser = rate_or_zero)]
    #[serde(default, deserialize_with = "rate_de")]
    pub rate: Option<u64>,
    /// IP version (loopback) [default: v4].
    #[arg(long, value_enum)]
    pub ip: Option<Ip>,
    #[command(flatten)]
    #[serde(skip)]
    pub out: OutputArgs,
}

crate::impl_layer!(MuxArgs {
    option: [method, sockets, payload, total, rcvbuf, scheduler, priority, conn, rate, ip]
    nested: [out]
});

/// `sockbench mux`'s merged settings.
#[derive(Debug, Clone)]
pub struct MuxSettings {
    pub method: Vec<Method>,
    pub sockets: usize,
    pub payload: Vec<u64>,
    pub total: u64,
    pub rcvbuf: Vec<u64>,
    pub scheduler: Vec<SchedPolicy>,
    pub priority: i32,
    pub conn: Vec<Conn>,
    /// Payload bits per second; 0 is unpaced.
    pub rate: u64,
    pub ip: Ip,
}

impl MuxArgs {
    pub fn defaults() -> Self {
        MuxArgs {
            method: Some(Method::ALL.to_vec()),
            sockets: Some(4),
            payload: Some(vec![SizeValue::Number(64)]),
            total: Some(100_000),
            rcvbuf: Some(
                [64_000, 256_000, 2_000_000, 8_000_000]
                    .map(SizeValue::Number)
                    .to_vec(),
            ),
            scheduler: Some(vec![SchedPolicy::Other]),
            priority: Some(10),
            conn: Some(vec![Conn::Unconnected]),
            rate: Some(100_000_000),
            ip: Some(Ip::V4),
            out: OutputArgs::default(),
        }
    }

    /// Defaults < `--config` file < flags.
    pub fn settings(&self) -> Result<MuxSettings> {
        let m = merge(Self::defaults(), self, &self.out)?;
        Ok(MuxSettings {
            method: m.method.unwrap_or_default(),
            sockets: m.sockets.unwrap_or_default(),
            payload: sizes(m.payload, "payload")?,
            total: m.total.unwrap_or_default(),
            rcvbuf: sizes(m.rcvbuf, "rcvbuf")?,
            scheduler: m.scheduler.unwrap_or_default(),
            priority: m.priority.unwrap_or_default(),
            conn: m.conn.unwrap_or_default(),
            rate: m.rate.unwrap_or_default(),
            ip: m.ip.unwrap_or(Ip::V4),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{self, TempConfig};

    fn parse(args: &[&str]) -> Suite {
        testing::parse::<Cli>("sockbench", args).unwrap().suite
    }

    #[test]
    fn defaults_file_and_flags_layer() {
        let file =
            TempConfig::new("payload = [64, \"8K\"]\nduration = \"50ms\"\nsocket = [\"nix\"]\n");
        let p = file.arg();
        let Suite::Udp(a) = parse(&["udp", "--config", p, "--socket", "std,tokio"]) else {
            panic!()
        };
        let s = a.settings().unwrap();
        assert_eq!(s.payload, [64, 8000]);
        assert_eq!(s.duration, Duration::from_millis(50));
        assert_eq!(s.warmup, Duration::from_millis(100));
        assert_eq!(s.socket, [SocketKind::Std, SocketKind::Tokio]);
        file.write("impl = [\"std\"]\nbytes = \"1K\"\nnodelay = true\n");
        let Suite::Tcp(a) = parse(&["tcp", "--config", p]) else {
            panic!()
        };
        let s = a.settings().unwrap();
        assert_eq!(
            (s.implementation, s.bytes, s.nodelay),
            (vec![Impl::Std], 1000, true)
        );
        file.write("rate = 0\nrcvbuf = [\"64K\"]\n");
        let Suite::Mux(a) = parse(&["mux", "--config", p]) else {
            panic!()
        };
        let s = a.settings().unwrap();
        assert_eq!((s.rate, s.rcvbuf, s.sockets), (0, vec![64_000], 4));
        file.write("sokcet = 1\n");
        let Suite::Udp(a) = parse(&["udp", "--config", p]) else {
            panic!()
        };
        assert!(a.settings().unwrap_err().to_string().contains("sokcet"));
    }
}
