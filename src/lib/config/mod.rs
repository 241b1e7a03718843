//! Command-line flags and TOML files, merged into one validated config per
//! role: defaults, then the file, then the flags.
//!
//! Why every field is an `Option` in both the flags and the file: that is
//! what lets a flag override a file value and a file value override a
//! default, without a flag's default silently winning over the file.
//! Unknown TOML keys are errors that name the key (`deny_unknown_fields`).

pub mod bench;
pub mod proxy;

use crate::auth::Psk;
use crate::error::{Error, Result};
use crate::server::recv::Method;
use crate::sys::SchedPolicy;
use crate::units;
use clap::Parser;
use serde::Deserialize;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A size in a TOML file: `4194304` or `"4M"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum SizeValue {
    Number(u64),
    Text(String),
}

impl SizeValue {
    /// A flag's value: checked as it is parsed, like the file's is when
    /// read.
    pub fn from_arg(s: &str) -> std::result::Result<SizeValue, String> {
        size_arg(s).map(SizeValue::Number)
    }

    pub fn bytes(&self, key: &str) -> Result<u64> {
        match self {
            SizeValue::Number(n) => Ok(*n),
            SizeValue::Text(s) => {
                units::parse_size(s).map_err(|e| Error::usage(format!("{key}: {e}")))
            }
        }
    }
}

/// A duration in a TOML file: `2` (seconds) or `"250ms"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum DurationValue {
    Seconds(f64),
    Text(String),
    /// From a flag, already parsed.
    #[serde(skip)]
    Parsed(Duration),
}

impl DurationValue {
    /// A flag's value: checked as it is parsed.
    pub fn from_arg(s: &str) -> std::result::Result<DurationValue, String> {
        duration_arg(s).map(DurationValue::Parsed)
    }

    pub fn duration(&self, key: &str) -> Result<Duration> {
        let text = match self {
            DurationValue::Parsed(d) => return Ok(*d),
            DurationValue::Seconds(s) => s.to_string(),
            DurationValue::Text(t) => t.clone(),
        };
        units::parse_duration(&text).map_err(|e| Error::usage(format!("{key}: {e}")))
    }
}

/// One layer of settings (defaults, a config file, or the flags), every
/// field optional: what a layer leaves out, the layer below decides.
///
/// A binary's flags and its TOML file share one type per role (clap and
/// serde derive on the same struct; TOML keys are the long flags with
/// underscores), so the merge is one line per field, written once by
/// [`impl_layer!`](crate::impl_layer), and validation runs once, on the
/// merged layer.
pub trait Layer: Sized {
    /// `self` over `lower`: each field of `self` wins where it is set.
    fn over(self, lower: Self) -> Self;
}

/// The one way settings are merged, for every binary: defaults < file <
/// flags.
pub fn layered<L: Layer>(defaults: L, file: Option<L>, flags: L) -> L {
    let below = match file {
        Some(file) => file.over(defaults),
        None => defaults,
    };
    flags.over(below)
}

/// Reads the file layer named by `--config`, if any.
pub fn file_layer<L: serde::de::DeserializeOwned>(path: Option<&Path>) -> Result<Option<L>> {
    path.map(read_toml).transpose()
}

/// Implements [`Layer`] for a struct: `option` fields (`Option<T>`) take
/// the upper layer's value when set; `switch` fields (`bool` flags) are on
/// when any layer turns them on; `nested` fields are layers themselves.
#[macro_export]
macro_rules! impl_layer {
    ($ty:ident { $(option: [$($opt:ident),* $(,)?])? $(switch: [$($sw:ident),* $(,)?])? $(nested: [$($nest:ident),* $(,)?])? }) => {
        impl $crate::config::Layer for $ty {
            fn over(self, lower: Self) -> Self {
                $ty {
                    $($($opt: self.$opt.or(lower.$opt),)*)?
                    $($($sw: self.$sw || lower.$sw,)*)?
                    $($($nest: $crate::config::Layer::over(self.$nest, lower.$nest),)*)?
                }
            }
        }
    };
}

/// The largest config file read. Real ones are a few hundred bytes; the
/// bound keeps `--config /dev/zero` or a huge file from eating memory.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads and parses a TOML config file: a regular file of at most
/// [`MAX_CONFIG_BYTES`], or a one-line usage error.
pub fn read_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    use std::io::Read;
    let shown = path.display();
    let fail = |why: String| Error::usage(clip(&format!("config {shown}: {why}")));
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::usage(clip(&format!("cannot read config {shown}: {e}"))))?;
    if !meta.is_file() {
        return Err(fail("not a regular file".into()));
    }
    let too_big = || fail(format!("larger than {} KiB", MAX_CONFIG_BYTES >> 10));
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(too_big());
    }
    let mut text = String::new();
    std::fs::File::open(path)
        // Never more than the bound, even if the file grows meanwhile.
        .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| Error::usage(clip(&format!("cannot read config {shown}: {e}"))))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(too_big());
    }
    parse_toml(&text).map_err(fail)
}

/// Parses a config text; the error is one line naming the bad key, with
/// any echo of the file's text cut short.
pub fn parse_toml<T: serde::de::DeserializeOwned>(text: &str) -> std::result::Result<T, String> {
    toml::from_str(text).map_err(|e| clip(e.message().replace('\n', " ").trim()))
}

/// The longest error line: anything the user typed is echoed at most this
/// long.
pub const MAX_MESSAGE: usize = 300;

/// `text` on one line, cut to [`MAX_MESSAGE`] characters.
pub fn clip(text: &str) -> String {
    let line = text.replace(['\n', '\r'], " ");
    match line.char_indices().nth(MAX_MESSAGE) {
        Some((cut, _)) => format!("{}… (cut)", &line[..cut]),
        None => line,
    }
}

/// The clap parser for every size flag: [`units::parse_size`].
pub fn size_arg(s: &str) -> std::result::Result<u64, String> {
    units::parse_size(s).map_err(|e| e.to_string())
}

/// The clap parser for every rate flag: [`units::parse_rate`].
pub fn rate_arg(s: &str) -> std::result::Result<u64, String> {
    units::parse_rate(s).map_err(|e| e.to_string())
}

/// The clap parser for every duration flag: [`units::parse_duration`].
pub fn duration_arg(s: &str) -> std::result::Result<Duration, String> {
    units::parse_duration(s).map_err(|e| e.to_string())
}

/// Resolves `host:port`, `[::1]:35000` or `localhost:35000`. A malformed
/// address is a usage error (exit 2); a well-formed name that does not
/// resolve is a runtime failure (exit 1): the same command may work later.
pub fn resolve(addr: &str) -> Result<SocketAddr> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(a);
    }
    let malformed = || {
        Error::usage(format!(
            "invalid address '{addr}': expected HOST:PORT, e.g. 127.0.0.1:35000 or [::1]:35000"
        ))
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(malformed)?;
    // An IPv6 literal needs brackets: `::1:80` is ambiguous.
    let bare_ipv6 = host.contains(':') && !(host.starts_with('[') && host.ends_with(']'));
    if host.is_empty() || bare_ipv6 || port.parse::<u16>().is_err() {
        return Err(malformed());
    }
    let mut found = addr
        .to_socket_addrs()
        .map_err(|e| Error::runtime(format!("cannot resolve '{host}': {e}")))?;
    found
        .next()
        .ok_or_else(|| Error::runtime(format!("cannot resolve '{host}': no addresses found")))
}

// ---------------------------------------------------------------- server

/// `udp_server`'s flags.
#[derive(Parser, Debug, Default)]
#[command(
    name = "udp_server",
    version,
    about = "Counts the UDP datagrams and bytes each peer sends, and reports exact rates in Gbit/s.",
    long_about = None
)]
pub struct ServerArgs {
    /// Address to listen on. The default is dual-stack (IPv4 and IPv6); it
    /// falls back to 0.0.0.0:35000 where IPv6 is unavailable. Port 0 picks a
    /// free port; the real address is printed at start.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Shorthand for --listen [::]:PORT.
    #[arg(short = 'p', long, value_name = "PORT", conflicts_with = "listen")]
    pub port: Option<u16>,
    /// Report every active peer at this interval (e.g. 1s, 500ms); 0 turns it off.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub interval: Option<Duration>,
    /// A peer with no datagram for this long is finished and summarised.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub idle_timeout: Option<Duration>,
    /// After a client's end-of-test message, keep counting its datagrams
    /// still in flight for this long before answering [default: 100ms].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub end_grace: Option<Duration>,
    /// SO_RCVBUF to ask for (e.g. 4M). The size the kernel granted is printed.
    #[arg(long, value_name = "BYTES", value_parser = size_arg)]
    pub recv_buffer_size: Option<u64>,
    /// Most peers tracked at once; traffic from more is counted in one
    /// overflow bucket. Bounds memory under a flood of spoofed sources.
    #[arg(long, value_name = "N")]
    pub max_peers: Option<usize>,
    /// How to wait for and read datagrams [default: mmsg on Linux, else thread].
    #[arg(long, value_enum)]
    pub method: Option<Method>,
    /// Receive sockets (and threads) sharing the address with SO_REUSEPORT.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Turn on UDP_GRO: the kernel coalesces datagrams of a flow, the server
    /// counts each one. The default where supported (Linux).
    #[arg(long, overrides_with = "no_gro")]
    pub gro: bool,
    /// Turn UDP_GRO off.
    #[arg(long, overrides_with = "gro")]
    pub no_gro: bool,
    #[command(flatten)]
    pub sched: SchedArgs,
    #[command(flatten)]
    pub psk: PskArgs,
    /// Write NDJSON events to stdout, one object per line.
    #[arg(long)]
    pub json: bool,
    /// Read settings from a TOML file; flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// `--psk` and `--psk-file`, shared by both binaries.
#[derive(clap::Args, Debug, Default)]
pub struct PskArgs {
    /// A pre-shared key (at least 8 bytes) that both ends know: the End
    /// and its answer then carry an HMAC-SHA256, and an answer or End
    /// without it is refused. Visible in `ps`; prefer --psk-file.
    #[arg(long, value_name = "KEY", conflicts_with = "psk_file")]
    pub psk: Option<String>,
    /// Read the pre-shared key from this file (one line; trailing
    /// newline ignored).
    #[arg(long, value_name = "FILE")]
    pub psk_file: Option<PathBuf>,
}

/// The key from `--psk`, `--psk-file` or the config file's `psk_file`.
fn psk_from(args: &PskArgs, file_psk: Option<&Path>) -> Result<Option<Psk>> {
    let key = match (&args.psk, args.psk_file.as_deref().or(file_psk)) {
        (Some(k), _) => k.as_bytes().to_vec(),
        (None, Some(path)) => {
            let meta = std::fs::metadata(path).map_err(|e| {
                Error::usage(clip(&format!(
                    "cannot read --psk-file {}: {e}",
                    path.display()
                )))
            })?;
            if !meta.is_file() || meta.len() > 4096 {
                return Err(Error::usage(clip(&format!(
                    "--psk-file {}: not a regular file of at most 4 KiB",
                    path.display()
                ))));
            }
            let mut key = std::fs::read(path).map_err(|e| {
                Error::usage(clip(&format!(
                    "cannot read --psk-file {}: {e}",
                    path.display()
                )))
            })?;
            while key.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                key.pop();
            }
            key
        }
        (None, None) => return Ok(None),
    };
    Psk::new(&key).map(Some).ok_or_else(|| {
        Error::usage(format!(
            "the pre-shared key must be at least {} bytes",
            crate::auth::MIN_KEY_LEN
        ))
    })
}

/// `--scheduler` and `--priority`, shared by both binaries (seed 002's -S, -P).
#[derive(clap::Args, Debug, Default)]
pub struct SchedArgs {
    /// Scheduling policy for this process (sched_setscheduler).
    #[arg(long, value_enum)]
    pub scheduler: Option<SchedPolicy>,
    /// Priority for --scheduler: 1..=99 for fifo and rr, 0 otherwise.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub priority: Option<i32>,
}

/// A validated scheduling request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sched {
    pub policy: SchedPolicy,
    pub priority: i32,
}

pub fn sched_from(policy: Option<SchedPolicy>, priority: Option<i32>) -> Result<Option<Sched>> {
    let Some(policy) = policy else {
        if priority.is_some() {
            return Err(Error::usage("--priority needs --scheduler"));
        }
        return Ok(None);
    };
    let range = policy.priority_range();
    let priority = priority.unwrap_or(*range.start());
    if !range.contains(&priority) {
        return Err(Error::usage(format!(
            "--priority {priority} is not valid for --scheduler {}: use {}..={}",
            format!("{policy:?}").to_lowercase(),
            range.start(),
            range.end()
        )));
    }
    Ok(Some(Sched { policy, priority }))
}

/// `udp_server`'s TOML file. Keys are the long flags with underscores.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerFile {
    pub listen: Option<String>,
    pub port: Option<u16>,
    pub interval: Option<DurationValue>,
    pub idle_timeout: Option<DurationValue>,
    pub end_grace: Option<DurationValue>,
    pub recv_buffer_size: Option<SizeValue>,
    pub max_peers: Option<usize>,
    pub method: Option<Method>,
    pub threads: Option<usize>,
    pub gro: Option<bool>,
    pub scheduler: Option<SchedPolicy>,
    pub priority: Option<i32>,
    pub psk_file: Option<PathBuf>,
    pub json: Option<bool>,
}

/// A validated server configuration.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// True when the user named no address: fall back to IPv4 if IPv6 fails.
    pub listen_is_default: bool,
    pub interval: Option<Duration>,
    pub idle_timeout: Duration,
    /// How long after an End datagrams in flight are still counted.
    pub end_grace: Duration,
    pub recv_buffer_size: Option<usize>,
    pub max_peers: usize,
    pub method: Method,
    pub threads: usize,
    pub gro: bool,
    pub sched: Option<Sched>,
    /// `--psk`: Ends must carry its tag.
    pub psk: Option<Psk>,
    pub json: bool,
}

/// Most threads a UDP role or a sockbench cell runs: receive threads,
/// client sockets' threads, benchmark threads.
pub const MAX_THREADS: usize = 64;
/// Most tcp_proxy worker threads.
pub const MAX_PROXY_THREADS: usize = 256;

/// `--threads N`, checked the same way by every binary.
pub fn check_threads(n: usize, max: usize) -> Result<usize> {
    if n == 0 || n > max {
        return Err(Error::usage(format!(
            "--threads {n}: must be between 1 and {max}"
        )));
    }
    Ok(n)
}

/// How long the server counts datagrams still in flight after an End: a
/// datagram reordered behind the End on a real path is late by well under
/// this.
pub const DEFAULT_END_GRACE: Duration = Duration::from_millis(100);
/// The longest `--end-grace`: the client waits this long on top of its own
/// `--end-timeout`.
pub const MAX_END_GRACE: Duration = Duration::from_secs(5);

/// The port seed 001 used, kept as our default.
pub const DEFAULT_PORT: u16 = 35000;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([0u16; 8], DEFAULT_PORT)),
            listen_is_default: true,
            interval: Some(Duration::from_secs(1)),
            idle_timeout: Duration::from_secs(2),
            end_grace: DEFAULT_END_GRACE,
            recv_buffer_size: None,
            max_peers: 4096,
            method: Method::default_for_platform(),
            threads: 1,
            gro: cfg!(target_os = "linux"),
            sched: None,
            psk: None,
            json: false,
        }
    }
}

impl ServerConfig {
    /// Merges defaults, the config file named by `--config`, and the flags.
    pub fn from_args(args: ServerArgs) -> Result<Self> {
        let file: ServerFile = match &args.config {
            Some(path) => read_toml(path)?,
            None => ServerFile::default(),
        };
        let mut cfg = ServerConfig::default();
        // --listen, then -p, then the file's listen, then the file's port.
        let listen = args.listen.or(if args.port.is_some() {
            None
        } else {
            file.listen
        });
        let port = if listen.is_some() {
            None
        } else {
            args.port.or(file.port)
        };
        if let Some(listen) = listen {
            cfg.listen = listen.parse().map_err(|_| {
                Error::usage(format!(
                    "invalid --listen address '{listen}': expected IP:PORT, e.g. [::]:35000"
                ))
            })?;
            cfg.listen_is_default = false;
        } else if let Some(port) = port {
            cfg.listen.set_port(port);
        }
        let interval = match args.interval {
            Some(d) => Some(d),
            None => file.interval.map(|v| v.duration("interval")).transpose()?,
        };
        if let Some(interval) = interval {
            cfg.interval = (!interval.is_zero()).then_some(interval);
        }
        if let Some(d) = args.idle_timeout {
            cfg.idle_timeout = d;
        } else if let Some(v) = file.idle_timeout {
            cfg.idle_timeout = v.duration("idle_timeout")?;
        }
        if cfg.idle_timeout < Duration::from_millis(10) {
            return Err(Error::usage("--idle-timeout must be at least 10ms"));
        }
        if let Some(d) = args.end_grace {
            cfg.end_grace = d;
        } else if let Some(v) = file.end_grace {
            cfg.end_grace = v.duration("end_grace")?;
        }
        if cfg.end_grace > MAX_END_GRACE {
            return Err(Error::usage(format!(
                "--end-grace must be at most {}s",
                MAX_END_GRACE.as_secs()
            )));
        }
        let rcvbuf = match args.recv_buffer_size {
            Some(b) => Some(b),
            None => file
                .recv_buffer_size
                .map(|v| v.bytes("recv_buffer_size"))
                .transpose()?,
        };
        if let Some(b) = rcvbuf {
            if b == 0 || b > i32::MAX as u64 {
                return Err(Error::usage(format!(
                    "--recv-buffer-size {b}: must be between 1 and {}",
                    i32::MAX
                )));
            }
            cfg.recv_buffer_size = Some(b as usize);
        }
        if let Some(n) = args.max_peers.or(file.max_peers) {
            let limit = crate::server::peers::MAX_PEERS_LIMIT;
            if n == 0 || n > limit {
                return Err(Error::usage(format!(
                    "--max-peers {n}: must be between 1 and {limit}"
                )));
            }
            cfg.max_peers = n;
        }
        if let Some(m) = args.method.or(file.method) {
            m.check_available().map_err(Error::usage)?;
            cfg.method = m;
        }
        if let Some(n) = args.threads.or(file.threads) {
            cfg.threads = check_threads(n, MAX_THREADS)?;
        }
        if args.gro {
            cfg.gro = true;
        } else if args.no_gro {
            cfg.gro = false;
        } else if let Some(g) = file.gro {
            cfg.gro = g;
        }
        cfg.sched = sched_from(
            args.sched.scheduler.or(file.scheduler),
            args.sched.priority.or(file.priority),
        )?;
        cfg.psk = psk_from(&args.psk, file.psk_file.as_deref())?;
        cfg.json = args.json || file.json.unwrap_or(false);
        Ok(cfg)
    }
}

// ---------------------------------------------------------------- client

/// `udp_client`'s flags. The first three are seed 001's, with its defaults.
#[derive(Parser, Debug, Default)]
#[command(
    name = "udp_client",
    version,
    about = "Sends an exact volume of UDP data to a udp_server and reports both sides.",
    long_about = None
)]
pub struct ClientArgs {
    /// Server address, HOST:PORT [default: 127.0.0.1:35000]; host names and [::1]:PORT work.
    #[arg(short = 's', long, value_name = "ADDR")]
    pub server_addr: Option<String>,
    /// Datagram payload size in bytes [default: 5000]. The OS caps it:
    /// 65507 over IPv4, 65527 over IPv6. By default macOS limits UDP datagrams
    /// to 9216 bytes; raise it with: sudo sysctl -w net.inet.udp.maxdgram=65535
    #[arg(short = 'b', long, value_name = "BYTES", value_parser = size_arg)]
    pub buffer_size: Option<u64>,
    /// Total payload bytes to send, exactly (e.g. 1000000, 64K, 1G, 1GiB) [default: 1000000].
    /// The last datagram may be shorter than --buffer-size.
    #[arg(short = 't', long, value_name = "BYTES", value_parser = size_arg)]
    pub total_send: Option<u64>,
    /// Send this many datagrams instead of a byte total (works with -b 0).
    #[arg(short = 'n', long, value_name = "N", conflicts_with_all = ["total_send", "duration"])]
    pub packets: Option<u64>,
    /// Send for this long instead of a byte total (e.g. 10s).
    #[arg(long, value_name = "DURATION", value_parser = duration_arg, conflicts_with = "total_send")]
    pub duration: Option<Duration>,
    /// Pace sending to this payload rate (e.g. 500Mbit, 1G, 100MB/s); unpaced by default.
    /// What is due goes out in batches every 0.5 ms, the sender sleeping in
    /// between.
    #[arg(long, value_name = "RATE", value_parser = rate_arg)]
    pub rate: Option<u64>,
    /// With --rate: send each datagram at its exact time, spinning for the
    /// last 200 µs before it, instead of in 0.5 ms batches. Costs up to a
    /// whole core; the report says so.
    #[arg(long, requires = "rate")]
    pub precise_pacing: bool,
    /// Send on a connected socket (send) instead of sendto.
    #[arg(long)]
    pub connected: bool,
    /// Run N independent client sockets at once; each is its own peer.
    /// With --sweep, a list: one column per value (e.g. 1,2).
    #[arg(long, value_name = "N[,N...]", value_delimiter = ',')]
    pub clients: Vec<usize>,
    /// Seed 001's table: run once per datagram size (e.g.
    /// 500,1000,1500,65500) and print the server's receive rate per size
    /// and --clients value. Give each run --duration (e.g. 1s).
    #[arg(long, value_name = "SIZE,SIZE,...", value_delimiter = ',', value_parser = size_arg)]
    pub sweep: Vec<u64>,
    /// With --sweep: draw the table as an SVG chart.
    #[arg(long, value_name = "FILE.svg", requires = "sweep")]
    pub plot: Option<PathBuf>,
    /// How long to wait for the server's end-of-test answer [default: 1s].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub end_timeout: Option<Duration>,
    /// Datagrams per sendmmsg call (Linux; elsewhere one call per datagram).
    #[arg(long, value_name = "N")]
    pub batch: Option<usize>,
    /// UDP GSO: hand the kernel buffers of up to 64 KiB that it cuts into
    /// --buffer-size datagrams (UDP_SEGMENT). Falls back to plain sends if
    /// the kernel or the path refuses; the report says which path was used.
    #[arg(long)]
    pub gso: bool,
    /// SO_SNDBUF to ask for (e.g. 4M); the granted size is reported.
    #[arg(long, value_name = "BYTES", value_parser = size_arg)]
    pub sndbuf: Option<u64>,
    /// Set the don't-fragment option: a datagram larger than the path MTU
    /// is refused (EMSGSIZE) instead of being fragmented.
    #[arg(long)]
    pub dont_fragment: bool,
    #[command(flatten)]
    pub sched: SchedArgs,
    #[command(flatten)]
    pub psk: PskArgs,
    /// Start an in-process server on an ephemeral loopback port and test against it.
    #[arg(long, conflicts_with = "server_addr")]
    pub local: bool,
    /// The target is not a udp_server (nc, sockperf, a packet sink): skip
    /// the start probe and the end-of-test exchange; sender side only.
    #[arg(long, conflicts_with = "local")]
    pub no_server: bool,
    /// Write one JSON object with the final report to stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(short, long)]
    pub quiet: bool,
    /// Read settings from a TOML file; flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// `udp_client`'s TOML file. Keys are the long flags with underscores.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientFile {
    pub server_addr: Option<String>,
    pub buffer_size: Option<SizeValue>,
    pub total_send: Option<SizeValue>,
    pub packets: Option<u64>,
    pub duration: Option<DurationValue>,
    pub rate: Option<String>,
    pub precise_pacing: Option<bool>,
    pub connected: Option<bool>,
    pub clients: Option<usize>,
    pub end_timeout: Option<DurationValue>,
    pub batch: Option<usize>,
    pub gso: Option<bool>,
    pub sndbuf: Option<SizeValue>,
    pub dont_fragment: Option<bool>,
    pub no_server: Option<bool>,
    pub scheduler: Option<SchedPolicy>,
    pub priority: Option<i32>,
    pub psk_file: Option<PathBuf>,
    pub json: Option<bool>,
    pub quiet: Option<bool>,
}

/// How much a client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Volume {
    /// Exactly this many payload bytes; the last datagram may be short.
    Bytes(u64),
    /// Exactly this many datagrams of `buffer_size`.
    Packets(u64),
    /// Full datagrams until this much time has passed.
    Time(Duration),
}

/// A validated client configuration.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub server: SocketAddr,
    pub local: bool,
    /// The target is not a udp_server: no probe, no end-of-test exchange.
    pub no_server: bool,
    pub buffer_size: usize,
    pub volume: Volume,
    pub rate_bps: Option<u64>,
    /// Spin to each datagram's exact time instead of sending in batches.
    pub precise_pacing: bool,
    pub connected: bool,
    pub clients: usize,
    pub end_timeout: Duration,
    pub batch: usize,
    pub gso: bool,
    pub sndbuf: Option<usize>,
    pub dont_fragment: bool,
    pub sched: Option<Sched>,
    /// `--psk`: the End is tagged, and only tagged answers are taken.
    pub psk: Option<Psk>,
    pub json: bool,
    pub quiet: bool,
    /// `--sweep` sizes, empty for a normal run.
    pub sweep: Vec<usize>,
    /// `--clients` values for the sweep's columns.
    pub sweep_clients: Vec<usize>,
    pub plot: Option<PathBuf>,
}

/// Most datagrams per sendmmsg call (the kernel's UIO_MAXIOV is 1024).
pub const MAX_BATCH: usize = 1024;

/// Seed 001's defaults.
pub const DEFAULT_SERVER: &str = "127.0.0.1:35000";
pub const DEFAULT_BUFFER_SIZE: u64 = 5000;
pub const DEFAULT_TOTAL: u64 = 1_000_000;
/// At most this many client sockets in one process.
pub const MAX_CLIENTS: usize = 1024;

impl ClientConfig {
    /// Merges defaults, the config file named by `--config`, and the flags.
    pub fn from_args(args: ClientArgs) -> Result<Self> {
        let file: ClientFile = match &args.config {
            Some(path) => read_toml(path)?,
            None => ClientFile::default(),
        };
        let server_text = args
            .server_addr
            .or(file.server_addr)
            .unwrap_or_else(|| DEFAULT_SERVER.to_string());
        let server = resolve(&server_text)?;
        let buffer_size = match args.buffer_size {
            Some(b) => b,
            None => file
                .buffer_size
                .map(|v| v.bytes("buffer_size"))
                .transpose()?
                .unwrap_or(DEFAULT_BUFFER_SIZE),
        };
        let limit = if server.is_ipv4() {
            crate::sys::MAX_UDP_PAYLOAD_V4
        } else {
            crate::sys::MAX_UDP_PAYLOAD_V6
        };
        if buffer_size > limit as u64 {
            return Err(Error::usage(format!(
                "--buffer-size {buffer_size} is larger than the largest UDP datagram over {} ({limit} bytes)",
                if server.is_ipv4() { "IPv4" } else { "IPv6" }
            )));
        }
        // Flags beat the file; among the file's keys, the same precedence.
        let file_total = file.total_send.map(|v| v.bytes("total_send")).transpose()?;
        let file_duration = file.duration.map(|v| v.duration("duration")).transpose()?;
        let volume = if let Some(n) = args.packets {
            Volume::Packets(n)
        } else if let Some(t) = args.total_send {
            Volume::Bytes(t)
        } else if let Some(d) = args.duration {
            Volume::Time(d)
        } else if let Some(n) = file.packets {
            Volume::Packets(n)
        } else if let Some(t) = file_total {
            Volume::Bytes(t)
        } else if let Some(d) = file_duration {
            Volume::Time(d)
        } else {
            Volume::Bytes(DEFAULT_TOTAL)
        };
        match volume {
            Volume::Bytes(0) => {
                return Err(Error::usage(
                    "--total-send 0 sends nothing: give a positive size",
                ))
            }
            Volume::Packets(0) => {
                return Err(Error::usage("--packets 0 sends nothing: give at least 1"))
            }
            Volume::Bytes(_) if buffer_size == 0 => {
                return Err(Error::usage(
                    "--buffer-size 0 sends empty datagrams, which never add up to --total-send; use --packets N",
                ))
            }
            Volume::Time(d) if d.is_zero() => return Err(Error::usage("--duration must be greater than 0")),
            _ => {}
        }
        let rate_bps = match args.rate {
            Some(r) => Some(r),
            None => file
                .rate
                .map(|r| units::parse_rate(&r).map_err(|e| Error::usage(format!("rate: {e}"))))
                .transpose()?,
        };
        let client_list = if args.clients.is_empty() {
            vec![file.clients.unwrap_or(1)]
        } else {
            args.clients.clone()
        };
        if client_list.len() > 1 && args.sweep.is_empty() {
            return Err(Error::usage(
                "--clients takes one value unless --sweep is given",
            ));
        }
        if let Some(&bad) = client_list.iter().find(|&&n| n == 0 || n > MAX_CLIENTS) {
            return Err(Error::usage(format!(
                "--clients {bad}: must be between 1 and {MAX_CLIENTS}"
            )));
        }
        let clients = client_list[0];
        let end_timeout = match args.end_timeout {
            Some(d) => d,
            None => file
                .end_timeout
                .map(|v| v.duration("end_timeout"))
                .transpose()?
                .unwrap_or(Duration::from_secs(1)),
        };
        let batch = args.batch.or(file.batch).unwrap_or(1);
        if batch == 0 || batch > MAX_BATCH {
            return Err(Error::usage(format!(
                "--batch {batch}: must be between 1 and {MAX_BATCH}"
            )));
        }
        let gso = args.gso || file.gso.unwrap_or(false);
        if gso && buffer_size == 0 {
            return Err(Error::usage("--gso needs --buffer-size of at least 1 byte"));
        }
        let sndbuf = match args.sndbuf {
            Some(b) => Some(b),
            None => file.sndbuf.map(|v| v.bytes("sndbuf")).transpose()?,
        };
        if let Some(b) = sndbuf {
            if b == 0 || b > i32::MAX as u64 {
                return Err(Error::usage(format!(
                    "--sndbuf {b}: must be between 1 and {}",
                    i32::MAX
                )));
            }
        }
        let sched = sched_from(
            args.sched.scheduler.or(file.scheduler),
            args.sched.priority.or(file.priority),
        )?;
        Ok(ClientConfig {
            server,
            local: args.local,
            no_server: args.no_server || file.no_server.unwrap_or(false),
            buffer_size: buffer_size as usize,
            volume,
            rate_bps,
            precise_pacing: args.precise_pacing || file.precise_pacing.unwrap_or(false),
            connected: args.connected || file.connected.unwrap_or(false),
            clients,
            end_timeout,
            batch,
            gso,
            sndbuf: sndbuf.map(|b| b as usize),
            dont_fragment: args.dont_fragment || file.dont_fragment.unwrap_or(false),
            sweep: args.sweep.iter().map(|&b| b as usize).collect(),
            sweep_clients: client_list,
            plot: args.plot.clone(),
            psk: psk_from(&args.psk, file.psk_file.as_deref())?,
            sched,
            json: args.json || file.json.unwrap_or(false),
            quiet: args.quiet || file.quiet.unwrap_or(false),
        })
    }
}

/// Parses flags the way the binaries do: `--help` and `--version` print and
/// exit 0; any other mistake becomes a one-line [`Error::Usage`].
pub fn parse_args<T: Parser>(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<T> {
    match T::try_parse_from(args) {
        Ok(parsed) => Ok(parsed),
        Err(e) => match e.kind() {
            clap::error::ErrorKind::DisplayHelp
            | clap::error::ErrorKind::DisplayVersion
            | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
            _ => {
                let text = e.render().to_string();
                let line = text.lines().next().unwrap_or("invalid arguments");
                let line = line.strip_prefix("error: ").unwrap_or(line);
                Err(Error::usage(format!("{} (see --help)", clip(line))))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(args: &[&str]) -> Result<ClientConfig> {
        let mut argv = vec!["udp_client"];
        argv.extend_from_slice(args);
        ClientConfig::from_args(parse_args(argv.into_iter().map(Into::into))?)
    }

    fn server(args: &[&str]) -> Result<ServerConfig> {
        let mut argv = vec!["udp_server"];
        argv.extend_from_slice(args);
        ServerConfig::from_args(parse_args(argv.into_iter().map(Into::into))?)
    }

    #[test]
    fn client_defaults_are_seed_001s() {
        let cfg = client(&[]).unwrap();
        assert_eq!(cfg.server, "127.0.0.1:35000".parse().unwrap());
        assert_eq!(cfg.buffer_size, 5000);
        assert_eq!(cfg.volume, Volume::Bytes(1_000_000));
        assert!(!cfg.connected);
        assert_eq!(cfg.clients, 1);
    }

    #[test]
    fn client_flags() {
        let cfg = client(&[
            "-s", "[::1]:9", "-b", "1460", "-t", "1GiB", "--rate", "500Mbit",
        ])
        .unwrap();
        assert_eq!(cfg.server, "[::1]:9".parse().unwrap());
        assert_eq!(cfg.volume, Volume::Bytes(1 << 30));
        assert_eq!(cfg.rate_bps, Some(500_000_000));
        let cfg = client(&["--duration", "2s"]).unwrap();
        assert_eq!(cfg.volume, Volume::Time(Duration::from_secs(2)));
        let cfg = client(&["-b", "0", "-n", "10"]).unwrap();
        assert_eq!(cfg.volume, Volume::Packets(10));
    }

    #[test]
    fn client_bad_input_is_usage_error() {
        for bad in [
            &["-b", "0"][..],
            &["-b", "70000"],
            &["-s", "[::1]:9", "-b", "65528"],
            &["-t", "12Q"],
            &["-s", "nonsense"],
            &["-s", "::1:80"],
            &["--clients", "0"],
            &["--rate", "0"],
            &["--bogus"],
        ] {
            let err = client(bad).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad:?}: {err}");
            assert!(!err.to_string().contains('\n'), "{bad:?}: one line: {err}");
        }
        // 65507 is the IPv4 maximum and is accepted; IPv6 allows 65527.
        assert!(client(&["-b", "65507"]).is_ok());
        assert!(client(&["-s", "[::1]:9", "-b", "65527"]).is_ok());
    }

    #[test]
    fn server_flags() {
        let cfg = server(&[]).unwrap();
        assert_eq!(cfg.listen, "[::]:35000".parse().unwrap());
        assert!(cfg.listen_is_default);
        let cfg = server(&["-p", "0", "--interval", "0", "--recv-buffer-size", "4M"]).unwrap();
        assert_eq!(cfg.listen.port(), 0);
        assert_eq!(cfg.interval, None);
        assert_eq!(cfg.recv_buffer_size, Some(4_000_000));
        assert!(server(&["--listen", "nope"]).is_err());
        assert!(server(&["--max-peers", "0"]).is_err());
        assert!(server(&["-p", "1", "--listen", "[::]:2"]).is_err());
    }

    #[test]
    fn unknown_toml_key_is_named() {
        let err = parse_toml::<ServerFile>("listen = \"[::]:1\"\nlisen = 3\n").unwrap_err();
        assert!(err.contains("lisen"), "{err}");
        let err = parse_toml::<ClientFile>("buffer_sise = 3\n").unwrap_err();
        assert!(err.contains("buffer_sise"), "{err}");
    }

    #[test]
    fn flags_override_file() {
        let dir = std::env::temp_dir().join(format!("netspeed-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        std::fs::write(
            &path,
            "buffer_size = \"1K\"\ntotal_send = 5000\nrate = \"1Gbit\"\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        let cfg = client(&["--config", p]).unwrap();
        assert_eq!((cfg.buffer_size, cfg.volume), (1000, Volume::Bytes(5000)));
        let cfg = client(&["--config", p, "-b", "200", "--duration", "1s"]).unwrap();
        assert_eq!(
            (cfg.buffer_size, cfg.volume),
            (200, Volume::Time(Duration::from_secs(1)))
        );
        std::fs::remove_dir_all(dir).ok();
    }
}
