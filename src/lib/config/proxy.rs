//! `tcp_proxy`'s and `tcp_proxy bench`'s settings. Each has one struct that
//! is both its flags (clap) and its TOML file (serde; keys are the long
//! flags with underscores), merged once with [`layered`] (defaults < file
//! < flags) and validated once, on the merged layer, into a
//! [`ProxyConfig`] or a [`BenchConfig`].
//!
//! The value types of the two binaries ([`Mode`], [`Test`]) live here too,
//! so that the settings need nothing from the proxy that reads them.

use crate::config::{
    check_threads, file_layer, layered, resolve, DurationValue, SizeValue, MAX_PROXY_THREADS,
};
use crate::congestion::Congestion;
use crate::error::{Error, Result};
use clap::Parser;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The six ways to move bytes between the two legs of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Our own tokio read/write loop with --buffer-size.
    Tokio,
    /// `tokio::io::copy`, one per direction (its own 8 KiB buffer).
    TokioCopy,
    /// `tokio::io::copy_bidirectional` (its own 8 KiB buffers).
    CopyBidirectional,
    /// Blocking std sockets, a thread per direction, --buffer-size.
    Std,
    /// `std::io::copy`, a thread per direction (its own 8 KiB buffer).
    StdCopy,
    /// Linux splice(2) through a pipe per direction (bursts under --splice-after are copied); --buffer-size is the pipe size.
    Splice,
}

impl Mode {
    pub const ALL: [Mode; 6] = [
        Mode::Tokio,
        Mode::TokioCopy,
        Mode::CopyBidirectional,
        Mode::Std,
        Mode::StdCopy,
        Mode::Splice,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Tokio => "tokio",
            Mode::TokioCopy => "tokio-copy",
            Mode::CopyBidirectional => "copy-bidirectional",
            Mode::Std => "std",
            Mode::StdCopy => "std-copy",
            Mode::Splice => "splice",
        }
    }

    /// Whether `--buffer-size` changes anything in this mode.
    pub fn takes_buffer_size(self) -> bool {
        matches!(self, Mode::Tokio | Mode::Std | Mode::Splice)
    }

    /// Whether the data path runs on the tokio runtime (so `--threads`
    /// matters); the std modes run a thread per direction.
    pub fn uses_runtime(self) -> bool {
        !matches!(self, Mode::Std | Mode::StdCopy)
    }

    /// Whether this platform has the mode (splice(2) is Linux's).
    pub fn available(self) -> bool {
        self != Mode::Splice || crate::sys::HAS_SPLICE
    }

    /// Splice where the platform has it: it moves the most bytes per CPU.
    pub fn default_for_platform() -> Mode {
        if crate::sys::HAS_SPLICE {
            Mode::Splice
        } else {
            Mode::Tokio
        }
    }
}

impl Mode {
    /// `--buffer-size` when none is given: for splice the most a pipe may
    /// grow to ([`DEFAULT_PIPE_MAX`]; it starts at 64 KiB), else the buffer
    /// per direction.
    pub fn default_buffer_size(self) -> usize {
        match self {
            Mode::Splice => DEFAULT_PIPE_MAX,
            _ => DEFAULT_BUFFER_SIZE,
        }
    }
}

/// How far a splice pipe grows by default: 1 MiB, Linux's default
/// /proc/sys/fs/pipe-max-size. With a 1 MiB pipe one splice moved about
/// 600 KB of a bulk stream; docs/benchmarks.md has the throughput.
pub const DEFAULT_PIPE_MAX: usize = 1 << 20;

/// One of the two requests of `tcp_proxy bench` (what they fetch is in
/// `crate::proxy::http`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Test {
    /// GET /test1: a 64 KiB body.
    Test1,
    /// GET /test2: `Hello, world!`.
    Test2,
}

impl Test {
    pub fn label(self) -> &'static str {
        match self {
            Test::Test1 => "Test 1",
            Test::Test2 => "Test 2",
        }
    }
}

/// clap's parser for `--congestion`: the name's shape is checked as the
/// flag is read; the file's `congestion` key is checked with the rest.
fn congestion_name_arg(s: &str) -> Result<String> {
    Congestion::parse(s).map(|_| s.to_string())
}

/// `tcp_proxy`'s flags and TOML file (keys: the long flags with
/// underscores; `nodelay = false` is `--no-nodelay`).
#[derive(Parser, Debug, Default, Deserialize)]
#[command(
    name = "tcp_proxy",
    version = super::VERSION_TEXT,
    about = "Forwards TCP connections to one upstream, six ways, with per-connection byte counts.",
    long_about = None,
    after_help = concat!(
        "The latency benchmark is a subcommand: tcp_proxy bench --help\n",
        "Also: --completions SHELL prints a completion script (bash, zsh, fish, elvish, powershell); --man prints the man page."
    )
)]
#[serde(deny_unknown_fields)]
pub struct ProxyArgs {
    /// Address to listen on, e.g. 127.0.0.1:8080. Port 0 picks a free port;
    /// the real address is printed at start.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Where to forward each connection, HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    pub upstream: Option<String>,
    /// How to move the bytes [default: splice on Linux, else tokio].
    #[arg(long, value_enum)]
    pub mode: Option<Mode>,
    /// Buffer per direction for the tokio and std modes; for splice, the
    /// size each pipe may grow to from 64 KiB (e.g. 8K, 64KiB, 1MiB)
    /// [default: 1MiB for splice, else 64KiB].
    #[arg(long, value_name = "BYTES", value_parser = SizeValue::from_arg)]
    pub buffer_size: Option<SizeValue>,
    /// Tokio worker threads; 1 means a current-thread runtime
    /// [default: the number of CPUs].
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Leave Nagle's algorithm on (no TCP_NODELAY on either leg). Only for
    /// reproducing the 20-40 ms stalls Nagle's algorithm causes; see docs/proxy.md.
    #[arg(long)]
    #[serde(skip)]
    pub no_nodelay: bool,
    /// The file's `nodelay`; `--no-nodelay` sets it to false before the
    /// layers are merged.
    #[arg(skip)]
    pub nodelay: Option<bool>,
    /// TCP congestion control for both legs of every connection (e.g. cubic,
    /// bbr, reno; TCP_CONGESTION) [default: the system's,
    /// net.ipv4.tcp_congestion_control]. BBR paces with a timer when the
    /// device has no fq qdisc (loopback); see docs/proxy.md for what that
    /// costs a proxy on a VM.
    #[arg(long, value_name = "ALGO", value_parser = congestion_name_arg)]
    pub congestion: Option<String>,
    /// Most connections open at once; a connection beyond it is accepted and
    /// closed at once, with a log line [default: 4096].
    #[arg(long, value_name = "N")]
    pub max_conns: Option<usize>,
    /// Give up connecting to the upstream after this long [default: 5s].
    #[arg(long, value_name = "DURATION", value_parser = DurationValue::from_arg)]
    pub connect_timeout: Option<DurationValue>,
    /// Close a connection with no bytes in either direction for this long;
    /// 0 turns it off [default: off].
    #[arg(long, value_name = "DURATION", value_parser = DurationValue::from_arg)]
    pub idle_timeout: Option<DurationValue>,
    /// After SIGINT/SIGTERM, let open connections finish for at most this
    /// long, then exit [default: 5s].
    #[arg(long, value_name = "DURATION", value_parser = DurationValue::from_arg)]
    pub drain_timeout: Option<DurationValue>,
    /// Write NDJSON events to stdout, one object per line.
    #[arg(long)]
    #[serde(default)]
    pub json: bool,
    /// Read settings from a TOML file; flags override it.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// splice: how many bytes all connections' pipes may grow by, together.
    /// Each pipe starts at 64 KiB and doubles while it runs full, up to
    /// --buffer-size; a growth over this budget (or one the kernel refuses)
    /// keeps the pipe at its size and is reported [default: 256MiB].
    #[arg(long, value_name = "BYTES", value_parser = SizeValue::from_arg)]
    pub pipe_budget: Option<SizeValue>,
    /// splice: each direction copies its bursts until one read fills this
    /// many bytes, then splices the rest (HAProxy's splice-auto idea);
    /// 0 splices every byte. Small exchanges cost less copied
    /// [default: 16KiB; at most 1MiB].
    #[arg(long, value_name = "BYTES", value_parser = SizeValue::from_arg)]
    pub splice_after: Option<SizeValue>,
}

crate::impl_layer!(ProxyArgs {
    option: [listen, upstream, mode, buffer_size, threads, nodelay, congestion, max_conns,
             connect_timeout, idle_timeout, drain_timeout, config, pipe_budget, splice_after]
    switch: [no_nodelay, json]
});

/// A validated proxy configuration.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub listen: SocketAddr,
    pub upstream: SocketAddr,
    pub mode: Mode,
    pub buffer_size: usize,
    pub threads: usize,
    pub nodelay: bool,
    /// TCP_CONGESTION for both legs; None keeps the system default.
    pub congestion: Option<Congestion>,
    pub max_conns: usize,
    pub connect_timeout: Duration,
    pub idle_timeout: Option<Duration>,
    pub drain_timeout: Duration,
    pub json: bool,
    /// splice: how many bytes every connection's pipes may grow by, together.
    pub pipe_budget: usize,
    /// splice: a direction copies until one read fills this many bytes,
    /// then splices; 0 splices every byte.
    pub splice_after: usize,
}

/// `--pipe-budget`'s default: the growth of about 136 connections with
/// both pipes at 1 MiB. The starting 64 KiB pipes are not charged, so the
/// pipes of the default 4,096 connections hold at most 512 MiB + 256 MiB.
pub const DEFAULT_PIPE_BUDGET: usize = 256 << 20;

/// `--splice-after`'s default: HAProxy's `tune.bufsize`. For a 1 KiB
/// response, splice cost 35 µs of kernel time per connection where a read
/// and a write cost 24 (docs/proxy.md).
pub const DEFAULT_SPLICE_AFTER: usize = 16 << 10;

/// `--splice-after`'s most: each worker thread keeps a buffer this size.
pub const MAX_SPLICE_AFTER: u64 = 1 << 20;

pub const DEFAULT_BUFFER_SIZE: usize = 64 * 1024;
pub const MAX_BUFFER_SIZE: u64 = 64 * 1024 * 1024;
pub const DEFAULT_MAX_CONNS: usize = 4096;
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The number of CPUs, the default `--threads`.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

impl ProxyArgs {
    /// The bottom layer. `--threads` is not in it: its default, the number
    /// of CPUs, is taken as it is, not held to `--threads`' limit.
    fn defaults() -> ProxyArgs {
        ProxyArgs {
            mode: Some(Mode::default_for_platform()),
            nodelay: Some(true),
            max_conns: Some(DEFAULT_MAX_CONNS),
            connect_timeout: Some(DurationValue::Parsed(DEFAULT_CONNECT_TIMEOUT)),
            drain_timeout: Some(DurationValue::Parsed(DEFAULT_DRAIN_TIMEOUT)),
            ..ProxyArgs::default()
        }
    }
}

impl ProxyConfig {
    /// A config with the defaults for the two addresses.
    pub fn new(listen: SocketAddr, upstream: SocketAddr) -> ProxyConfig {
        ProxyConfig {
            listen,
            upstream,
            mode: Mode::default_for_platform(),
            buffer_size: Mode::default_for_platform().default_buffer_size(),
            threads: default_threads(),
            nodelay: true,
            congestion: None,
            max_conns: DEFAULT_MAX_CONNS,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            idle_timeout: None,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            json: false,
            pipe_budget: DEFAULT_PIPE_BUDGET,
            splice_after: DEFAULT_SPLICE_AFTER,
        }
    }

    /// Merges defaults, the config file named by `--config`, and the flags,
    /// then validates the result.
    pub fn from_args(mut flags: ProxyArgs) -> Result<Self> {
        if flags.no_nodelay {
            flags.nodelay = Some(false);
        }
        let file = file_layer(flags.config.as_deref())?;
        Self::from_layer(layered(ProxyArgs::defaults(), file, flags))
    }

    /// Validates merged settings, in the order the flags are listed.
    fn from_layer(s: ProxyArgs) -> Result<Self> {
        let listen_text = s.listen.ok_or_else(|| {
            Error::usage(
                "--listen ADDR is required, e.g. --listen 127.0.0.1:8080 (port 0 picks one)",
            )
        })?;
        let listen: SocketAddr = listen_text.parse().map_err(|_| {
            Error::usage(format!(
                "invalid --listen address '{listen_text}': expected IP:PORT, e.g. 127.0.0.1:8080"
            ))
        })?;
        let upstream_text = s
            .upstream
            .ok_or_else(|| Error::usage("--upstream HOST:PORT is required"))?;
        let upstream = resolve(&upstream_text)?;
        if upstream.port() == 0 {
            return Err(Error::usage(format!(
                "invalid --upstream '{upstream_text}': port 0 cannot be connected to"
            )));
        }
        let mut cfg = ProxyConfig::new(listen, upstream);
        // Whether this platform has the mode is the proxy's to check, when
        // it runs.
        if let Some(mode) = s.mode {
            cfg.mode = mode;
        }
        cfg.buffer_size = cfg.mode.default_buffer_size();
        if let Some(b) = s.buffer_size.map(|v| v.bytes("buffer_size")).transpose()? {
            if b == 0 || b > MAX_BUFFER_SIZE {
                return Err(Error::usage(format!(
                    "--buffer-size {b}: must be between 1 and {MAX_BUFFER_SIZE} bytes"
                )));
            }
            cfg.buffer_size = b as usize;
        }
        if let Some(n) = s.threads {
            cfg.threads = check_threads(n, MAX_PROXY_THREADS)?;
        }
        cfg.nodelay = s.nodelay.unwrap_or(true);
        cfg.congestion = s.congestion.as_deref().map(Congestion::parse).transpose()?;
        if let Some(n) = s.max_conns {
            if n == 0 {
                return Err(Error::usage("--max-conns must be at least 1"));
            }
            cfg.max_conns = n;
        }
        let duration = |v: Option<DurationValue>, key: &str| v.map(|v| v.duration(key)).transpose();
        if let Some(d) = duration(s.connect_timeout, "connect_timeout")? {
            if d < Duration::from_millis(1) {
                return Err(Error::usage("--connect-timeout must be at least 1ms"));
            }
            cfg.connect_timeout = d;
        }
        if let Some(d) = duration(s.idle_timeout, "idle_timeout")? {
            if !d.is_zero() && d < Duration::from_millis(10) {
                return Err(Error::usage(
                    "--idle-timeout must be 0 (off) or at least 10ms",
                ));
            }
            cfg.idle_timeout = (!d.is_zero()).then_some(d);
        }
        if let Some(d) = duration(s.drain_timeout, "drain_timeout")? {
            cfg.drain_timeout = d;
        }
        cfg.json = s.json;
        if let Some(b) = s.pipe_budget.map(|v| v.bytes("pipe_budget")).transpose()? {
            cfg.pipe_budget = usize::try_from(b).unwrap_or(usize::MAX);
        }
        if let Some(b) = s
            .splice_after
            .map(|v| v.bytes("splice_after"))
            .transpose()?
        {
            if b > MAX_SPLICE_AFTER {
                return Err(Error::usage(format!(
                    "--splice-after {b} is more than 1MiB (each worker thread keeps a buffer that size); 0 splices every byte"
                )));
            }
            cfg.splice_after = b as usize;
        }
        Ok(cfg)
    }
}

// ---------------------------------------------------------------- bench

/// `tcp_proxy bench`'s flags and TOML file (keys: the long flags with
/// underscores). The defaults are written into the help by hand because
/// they live in the defaults layer, not in clap, so that a file can
/// change them.
#[derive(Parser, Debug, Default, Deserialize)]
#[command(
    name = "tcp_proxy bench",
    version = super::VERSION_TEXT,
    about = "Request latency through each proxy mode vs a direct connection.",
    long_about = None
)]
#[serde(deny_unknown_fields)]
pub struct BenchArgs {
    /// How long each row measures [default: 1s].
    #[arg(long, value_name = "DURATION", value_parser = DurationValue::from_arg)]
    pub duration: Option<DurationValue>,
    /// At most this many measured requests per row [default: 200000].
    #[arg(long, value_name = "N")]
    pub requests: Option<u64>,
    /// Requests sent before measuring, on the same connection [default: 20].
    #[arg(long, value_name = "N")]
    pub warmup: Option<u64>,
    /// Modes to run, comma-separated [default: all six on Linux].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub modes: Option<Vec<Mode>>,
    /// Buffer sizes for the modes that take one [default: 2KiB,8KiB,32KiB,64KiB,1MiB].
    #[arg(long, value_name = "BYTES", value_parser = SizeValue::from_arg, value_delimiter = ',')]
    pub buffer_sizes: Option<Vec<SizeValue>>,
    /// The "N" of threads 1 and N for the runtime modes [default: the number of CPUs].
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Tests to run, comma-separated [default: test1,test2].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub tests: Option<Vec<Test>>,
    /// Run the proxies with --no-nodelay, to reproduce Nagle's 20-40 ms stalls.
    #[arg(long)]
    #[serde(default)]
    pub no_nodelay: bool,
    /// Skip the direct connection and outside peers; only our modes.
    #[arg(long)]
    #[serde(default)]
    pub no_peers: bool,
    /// Also measure this Go io.Copy proxy (bench/peers/goproxy, built by
    /// bench/proxy-bench.sh).
    #[arg(long, value_name = "PATH")]
    pub go_proxy: Option<PathBuf>,
    /// A request with no complete answer within this long fails its row [default: 5s].
    #[arg(long, value_name = "DURATION", value_parser = DurationValue::from_arg)]
    pub request_timeout: Option<DurationValue>,
    /// The tcp_proxy binary to benchmark [default: this one].
    #[arg(long, value_name = "PATH")]
    pub proxy_bin: Option<PathBuf>,
    /// One JSON object per row on stdout instead of the table.
    #[arg(long)]
    #[serde(default)]
    pub json: bool,
    /// Read settings from a TOML file; flags override it.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
}

crate::impl_layer!(BenchArgs {
    option: [duration, requests, warmup, modes, buffer_sizes, threads, tests, go_proxy,
             request_timeout, proxy_bin, config]
    switch: [no_nodelay, no_peers, json]
});

/// A validated benchmark configuration.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub duration: Duration,
    pub requests: u64,
    pub warmup: u64,
    pub modes: Vec<Mode>,
    pub buffer_sizes: Vec<usize>,
    pub threads: usize,
    pub tests: Vec<Test>,
    pub nodelay: bool,
    pub peers: bool,
    pub go_proxy: Option<PathBuf>,
    pub request_timeout: Duration,
    pub proxy_bin: PathBuf,
    pub json: bool,
}

pub const DEFAULT_BUFFER_SIZES: [usize; 5] = [2 << 10, 8 << 10, 32 << 10, 64 << 10, 1 << 20];

impl BenchArgs {
    /// The bottom layer. `--threads` and `--proxy-bin` default to what
    /// this machine and this process are, after validation.
    fn defaults() -> BenchArgs {
        BenchArgs {
            duration: Some(DurationValue::Parsed(Duration::from_secs(1))),
            requests: Some(200_000),
            warmup: Some(20),
            // Every mode this platform has; one named that it lacks is
            // refused when the benchmark starts.
            modes: Some(Mode::ALL.into_iter().filter(|m| m.available()).collect()),
            buffer_sizes: Some(
                DEFAULT_BUFFER_SIZES
                    .iter()
                    .map(|&b| SizeValue::Number(b as u64))
                    .collect(),
            ),
            tests: Some(vec![Test::Test1, Test::Test2]),
            request_timeout: Some(DurationValue::Parsed(Duration::from_secs(5))),
            ..BenchArgs::default()
        }
    }
}

impl BenchConfig {
    /// Merges defaults, the config file named by `--config`, and the flags,
    /// then validates the result.
    pub fn from_args(flags: BenchArgs) -> Result<BenchConfig> {
        let file = file_layer(flags.config.as_deref())?;
        Self::from_layer(layered(BenchArgs::defaults(), file, flags))
    }

    fn from_layer(s: BenchArgs) -> Result<BenchConfig> {
        let duration = s
            .duration
            .map(|v| v.duration("duration"))
            .transpose()?
            .unwrap_or_default();
        let requests = s.requests.unwrap_or_default();
        if duration.is_zero() && requests == 0 {
            return Err(Error::usage("--duration and --requests cannot both be 0"));
        }
        if requests == 0 {
            return Err(Error::usage("--requests must be at least 1"));
        }
        let request_timeout = s
            .request_timeout
            .map(|v| v.duration("request_timeout"))
            .transpose()?
            .unwrap_or_default();
        if request_timeout < Duration::from_millis(10) {
            return Err(Error::usage("--request-timeout must be at least 10ms"));
        }
        let mut modes = match s.modes {
            Some(m) if !m.is_empty() => m,
            _ => Mode::ALL.to_vec(),
        };
        modes.dedup();
        let buffer_sizes: Vec<usize> = match s.buffer_sizes {
            Some(sizes) if !sizes.is_empty() => sizes
                .iter()
                .map(|v| v.bytes("buffer_sizes").map(|b| b as usize))
                .collect::<Result<_>>()?,
            _ => DEFAULT_BUFFER_SIZES.to_vec(),
        };
        if let Some(b) = buffer_sizes
            .iter()
            .find(|&&b| b == 0 || b as u64 > MAX_BUFFER_SIZE)
        {
            return Err(Error::usage(format!(
                "--buffer-sizes {b}: each must be between 1 and {MAX_BUFFER_SIZE} bytes"
            )));
        }
        let threads = s.threads.unwrap_or_else(default_threads);
        if threads == 0 || threads > MAX_PROXY_THREADS {
            return Err(Error::usage(format!(
                "--threads must be between 1 and {MAX_PROXY_THREADS}"
            )));
        }
        let tests = match s.tests {
            Some(t) if !t.is_empty() => t,
            _ => vec![Test::Test1, Test::Test2],
        };
        if let Some(go) = &s.go_proxy {
            if !go.is_file() {
                return Err(Error::usage(format!(
                    "--go-proxy {}: no such file (build it with bench/proxy-bench.sh)",
                    go.display()
                )));
            }
        }
        let proxy_bin = match s.proxy_bin {
            Some(p) => p,
            None => std::env::current_exe()
                .map_err(|e| Error::io("cannot find this program's path", e))?,
        };
        Ok(BenchConfig {
            duration,
            requests,
            warmup: s.warmup.unwrap_or_default(),
            modes,
            buffer_sizes,
            threads,
            tests,
            nodelay: !s.no_nodelay,
            peers: !s.no_peers,
            go_proxy: s.go_proxy,
            request_timeout,
            proxy_bin,
            json: s.json,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_toml;
    use crate::config::testing::{bench, parse, proxy};

    #[test]
    fn defaults_and_flags() {
        let cfg = proxy(&["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9"]).unwrap();
        assert!(cfg.nodelay);
        assert_eq!(
            cfg.buffer_size,
            Mode::default_for_platform().default_buffer_size()
        );
        assert_eq!(cfg.pipe_budget, DEFAULT_PIPE_BUDGET);
        assert_eq!(cfg.splice_after, DEFAULT_SPLICE_AFTER);
        let tokio = proxy(&[
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "127.0.0.1:9",
            "--mode",
            "tokio",
        ])
        .unwrap();
        assert_eq!(tokio.buffer_size, DEFAULT_BUFFER_SIZE);
        let splice = proxy(&[
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "127.0.0.1:9",
            "--mode",
            "splice",
            "--pipe-budget",
            "128KiB",
            "--splice-after",
            "0",
        ])
        .unwrap();
        assert_eq!(
            (splice.buffer_size, splice.pipe_budget, splice.splice_after),
            (DEFAULT_PIPE_MAX, 128 << 10, 0)
        );
        assert_eq!(cfg.idle_timeout, None);
        assert_eq!(cfg.congestion, None);
        let cfg = proxy(&[
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "localhost:9",
            "--mode",
            "tokio-copy",
            "--buffer-size",
            "2KiB",
            "--threads",
            "1",
            "--no-nodelay",
            "--idle-timeout",
            "0",
            "--congestion",
            "cubic",
        ])
        .unwrap();
        assert_eq!(
            cfg.congestion.map(|c| c.to_string()).as_deref(),
            Some("cubic")
        );
        assert_eq!(cfg.mode, Mode::TokioCopy);
        assert_eq!(cfg.buffer_size, 2048);
        assert_eq!(cfg.threads, 1);
        assert!(!cfg.nodelay);
        assert_eq!(cfg.idle_timeout, None);
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        let base = ["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9"];
        for extra in [
            &["--mode", "nope"][..],
            &["--buffer-size", "0"],
            &["--buffer-size", "1T"],
            &["--threads", "0"],
            &["--max-conns", "0"],
            &["--idle-timeout", "1ms"],
            &["--connect-timeout", "soon"],
            &["--congestion", ""],
            &["--congestion", "cubic;rm"],
            &["--congestion", "averyveryverylongname"],
            &["--splice-after", "2MiB"],
            &["--splice-after", "lots"],
        ] {
            let mut args = base.to_vec();
            args.extend_from_slice(extra);
            let err = proxy(&args).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{extra:?}");
            assert!(!err.to_string().contains('\n'));
        }
        assert!(proxy(&["--upstream", "127.0.0.1:9"]).is_err());
        assert!(proxy(&["--listen", "127.0.0.1:0"]).is_err());
        assert!(proxy(&["--listen", "nope", "--upstream", "127.0.0.1:9"]).is_err());
        assert!(proxy(&["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:0"]).is_err());
    }

    #[test]
    fn file_keys() {
        let f: ProxyArgs = parse_toml(
            "listen = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:9\"\nmode = \"copy-bidirectional\"\nbuffer_size = \"8KiB\"\nnodelay = false\nidle_timeout = \"30s\"\ncongestion = \"reno\"\nsplice_after = \"4KiB\"\n",
        )
        .unwrap();
        assert_eq!(
            f.splice_after.map(|v| v.bytes("splice_after").unwrap()),
            Some(4096)
        );
        assert_eq!(f.congestion.as_deref(), Some("reno"));
        assert_eq!(f.mode, Some(Mode::CopyBidirectional));
        assert_eq!(f.nodelay, Some(false));
        for bad in [
            "bufer_size = 3\n",
            "no_nodelay = true\n",
            "config = \"x\"\n",
        ] {
            let err = parse_toml::<ProxyArgs>(bad).unwrap_err();
            assert!(err.contains(bad.split(' ').next().unwrap()), "{err}");
        }
    }

    #[test]
    fn file_then_flags() {
        let file: ProxyArgs = parse_toml(
            "listen = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:9\"\nbuffer_size = 1000\nnodelay = false\nthreads = 3\n",
        )
        .unwrap();
        let flags: ProxyArgs = parse("tcp_proxy", &["--buffer-size", "2K"]).unwrap();
        let cfg =
            ProxyConfig::from_layer(layered(ProxyArgs::defaults(), Some(file), flags)).unwrap();
        assert_eq!(
            (cfg.buffer_size, cfg.threads, cfg.nodelay),
            (2000, 3, false)
        );
        let file: BenchArgs =
            parse_toml("duration = \"20ms\"\nmodes = [\"std\"]\nbuffer_sizes = [\"2K\", 4096]\nno_peers = true\n").unwrap();
        let flags: BenchArgs = parse("tcp_proxy bench", &["--requests", "5"]).unwrap();
        let cfg =
            BenchConfig::from_layer(layered(BenchArgs::defaults(), Some(file), flags)).unwrap();
        assert_eq!(cfg.duration, Duration::from_millis(20));
        assert_eq!((cfg.requests, cfg.warmup), (5, 20));
        assert_eq!(cfg.modes, vec![Mode::Std]);
        assert_eq!(cfg.buffer_sizes, vec![2000, 4096]);
        assert!(!cfg.peers && cfg.nodelay);
    }

    #[test]
    fn bad_bench_flags() {
        for bad in [
            &["--requests", "0"][..],
            &["--buffer-sizes", "0"],
            &["--threads", "0"],
            &["--modes", "nope"],
            &["--duration", "x"],
            &["--go-proxy", "/nonexistent/goproxy"],
        ] {
            let e = bench(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }
}
