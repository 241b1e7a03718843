//! `tcp_proxy`'s flags and TOML file, merged into one validated
//! [`ProxyConfig`]: defaults, then the file, then the flags (the same
//! layering as [`crate::config`]; every field is an `Option` so that a flag's
//! default never silently wins over the file).

use crate::config::read_toml;
use crate::congestion::Congestion;
use crate::error::{Error, Result};
use crate::units;
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
    /// Linux splice(2) through a pipe per direction; --buffer-size is the pipe size.
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

    /// Whether this platform has the mode.
    pub fn available(self) -> bool {
        self != Mode::Splice || cfg!(target_os = "linux")
    }

    /// Splice where the platform has it: it moves the most bytes per CPU.
    pub fn default_for_platform() -> Mode {
        if cfg!(target_os = "linux") {
            Mode::Splice
        } else {
            Mode::Tokio
        }
    }
}

fn size_arg(s: &str) -> std::result::Result<u64, String> {
    units::parse_size(s).map_err(|e| e.to_string())
}

fn duration_arg(s: &str) -> std::result::Result<Duration, String> {
    units::parse_duration(s).map_err(|e| e.to_string())
}

/// `tcp_proxy`'s flags.
#[derive(Parser, Debug, Default)]
#[command(
    name = "tcp_proxy",
    version,
    about = "Forwards TCP connections to one upstream, six ways, with per-connection byte counts.",
    long_about = None,
    after_help = "The latency benchmark is a subcommand: tcp_proxy bench --help"
)]
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
    /// Buffer per direction for the tokio and std modes, pipe size for
    /// splice (e.g. 8K, 64KiB, 1MiB) [default: 64KiB].
    #[arg(long, value_name = "BYTES", value_parser = size_arg)]
    pub buffer_size: Option<u64>,
    /// Tokio worker threads; 1 means a current-thread runtime
    /// [default: the number of CPUs].
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Leave Nagle's algorithm on (no TCP_NODELAY on either leg). Only for
    /// reproducing seed 004's 20-40 ms stalls; see docs/proxy.md.
    #[arg(long)]
    pub no_nodelay: bool,
    /// TCP congestion control for both legs of every connection (e.g. cubic,
    /// bbr, reno; TCP_CONGESTION) [default: the system's,
    /// net.ipv4.tcp_congestion_control]. BBR paces with a timer when the
    /// device has no fq qdisc (loopback); see docs/proxy.md for what that
    /// costs a proxy on a VM.
    #[arg(long, value_name = "ALGO", value_parser = crate::congestion::congestion_arg)]
    pub congestion: Option<Congestion>,
    /// Most connections open at once; a connection beyond it is accepted and
    /// closed at once, with a log line [default: 4096].
    #[arg(long, value_name = "N")]
    pub max_conns: Option<usize>,
    /// Give up connecting to the upstream after this long [default: 5s].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub connect_timeout: Option<Duration>,
    /// Close a connection with no bytes in either direction for this long;
    /// 0 turns it off [default: off].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub idle_timeout: Option<Duration>,
    /// After SIGINT/SIGTERM, let open connections finish for at most this
    /// long, then exit [default: 5s].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub drain_timeout: Option<Duration>,
    /// Write NDJSON events to stdout, one object per line.
    #[arg(long)]
    pub json: bool,
    /// Read settings from a TOML file; flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// A size in the TOML file: `65536` or `"64KiB"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum FileSize {
    Number(u64),
    Text(String),
}

/// A duration in the TOML file: `2` (seconds) or `"250ms"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum FileDuration {
    Seconds(f64),
    Text(String),
}

fn file_size(v: &FileSize, key: &str) -> Result<u64> {
    match v {
        FileSize::Number(n) => Ok(*n),
        FileSize::Text(t) => units::parse_size(t).map_err(|e| Error::usage(format!("{key}: {e}"))),
    }
}

fn file_duration(v: &FileDuration, key: &str) -> Result<Duration> {
    let text = match v {
        FileDuration::Seconds(s) => s.to_string(),
        FileDuration::Text(t) => t.clone(),
    };
    units::parse_duration(&text).map_err(|e| Error::usage(format!("{key}: {e}")))
}

/// `tcp_proxy`'s TOML file. Keys are the long flags with underscores;
/// `nodelay = false` is `--no-nodelay`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyFile {
    pub listen: Option<String>,
    pub upstream: Option<String>,
    pub mode: Option<Mode>,
    pub buffer_size: Option<FileSize>,
    pub threads: Option<usize>,
    pub nodelay: Option<bool>,
    pub congestion: Option<String>,
    pub max_conns: Option<usize>,
    pub connect_timeout: Option<FileDuration>,
    pub idle_timeout: Option<FileDuration>,
    pub drain_timeout: Option<FileDuration>,
    pub json: Option<bool>,
}

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
}

pub const DEFAULT_BUFFER_SIZE: usize = 64 * 1024;
pub const MAX_BUFFER_SIZE: u64 = 64 * 1024 * 1024;
pub const DEFAULT_MAX_CONNS: usize = 4096;
pub const MAX_THREADS: usize = 256;

/// The number of CPUs, the default `--threads`.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

impl ProxyConfig {
    /// A config with the defaults for the two addresses.
    pub fn new(listen: SocketAddr, upstream: SocketAddr) -> ProxyConfig {
        ProxyConfig {
            listen,
            upstream,
            mode: Mode::default_for_platform(),
            buffer_size: DEFAULT_BUFFER_SIZE,
            threads: default_threads(),
            nodelay: true,
            congestion: None,
            max_conns: DEFAULT_MAX_CONNS,
            connect_timeout: Duration::from_secs(5),
            idle_timeout: None,
            drain_timeout: Duration::from_secs(5),
            json: false,
        }
    }

    /// Merges defaults, the config file named by `--config`, and the flags.
    pub fn from_args(args: ProxyArgs) -> Result<Self> {
        let file: ProxyFile = match &args.config {
            Some(path) => read_toml(path)?,
            None => ProxyFile::default(),
        };
        let listen_text = args.listen.or(file.listen).ok_or_else(|| {
            Error::usage(
                "--listen ADDR is required, e.g. --listen 127.0.0.1:8080 (port 0 picks one)",
            )
        })?;
        let listen: SocketAddr = listen_text.parse().map_err(|_| {
            Error::usage(format!(
                "invalid --listen address '{listen_text}': expected IP:PORT, e.g. 127.0.0.1:8080"
            ))
        })?;
        let upstream_text = args
            .upstream
            .or(file.upstream)
            .ok_or_else(|| Error::usage("--upstream HOST:PORT is required"))?;
        let upstream = crate::config::resolve(&upstream_text)?;
        if upstream.port() == 0 {
            return Err(Error::usage(format!(
                "invalid --upstream '{upstream_text}': port 0 cannot be connected to"
            )));
        }
        let mut cfg = ProxyConfig::new(listen, upstream);
        if let Some(mode) = args.mode.or(file.mode) {
            if !mode.available() {
                return Err(Error::usage(format!(
                    "--mode {} needs Linux (splice(2)); use --mode tokio or std here",
                    mode.name()
                )));
            }
            cfg.mode = mode;
        }
        let buffer = match args.buffer_size {
            Some(b) => Some(b),
            None => file
                .buffer_size
                .as_ref()
                .map(|v| file_size(v, "buffer_size"))
                .transpose()?,
        };
        if let Some(b) = buffer {
            if b == 0 || b > MAX_BUFFER_SIZE {
                return Err(Error::usage(format!(
                    "--buffer-size {b}: must be between 1 and {MAX_BUFFER_SIZE} bytes"
                )));
            }
            cfg.buffer_size = b as usize;
        }
        if let Some(n) = args.threads.or(file.threads) {
            if n == 0 || n > MAX_THREADS {
                return Err(Error::usage(format!(
                    "--threads {n}: must be between 1 and {MAX_THREADS}"
                )));
            }
            cfg.threads = n;
        }
        cfg.nodelay = if args.no_nodelay {
            false
        } else {
            file.nodelay.unwrap_or(true)
        };
        cfg.congestion = match (args.congestion, file.congestion) {
            (Some(c), _) => Some(c),
            (None, Some(name)) => Some(Congestion::parse(&name)?),
            (None, None) => None,
        };
        if let Some(n) = args.max_conns.or(file.max_conns) {
            if n == 0 {
                return Err(Error::usage("--max-conns must be at least 1"));
            }
            cfg.max_conns = n;
        }
        let pick = |flag: Option<Duration>, v: &Option<FileDuration>, key: &str| match flag {
            Some(d) => Ok(Some(d)),
            None => v.as_ref().map(|v| file_duration(v, key)).transpose(),
        };
        if let Some(d) = pick(
            args.connect_timeout,
            &file.connect_timeout,
            "connect_timeout",
        )? {
            if d < Duration::from_millis(1) {
                return Err(Error::usage("--connect-timeout must be at least 1ms"));
            }
            cfg.connect_timeout = d;
        }
        if let Some(d) = pick(args.idle_timeout, &file.idle_timeout, "idle_timeout")? {
            if !d.is_zero() && d < Duration::from_millis(10) {
                return Err(Error::usage(
                    "--idle-timeout must be 0 (off) or at least 10ms",
                ));
            }
            cfg.idle_timeout = (!d.is_zero()).then_some(d);
        }
        if let Some(d) = pick(args.drain_timeout, &file.drain_timeout, "drain_timeout")? {
            cfg.drain_timeout = d;
        }
        cfg.json = args.json || file.json.unwrap_or(false);
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_args;
    use crate::config::parse_toml;

    fn proxy(args: &[&str]) -> Result<ProxyConfig> {
        let mut argv = vec!["tcp_proxy"];
        argv.extend_from_slice(args);
        ProxyConfig::from_args(parse_args(argv.into_iter().map(Into::into))?)
    }

    #[test]
    fn defaults_and_flags() {
        let cfg = proxy(&["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9"]).unwrap();
        assert!(cfg.nodelay);
        assert_eq!(cfg.buffer_size, DEFAULT_BUFFER_SIZE);
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
        let f: ProxyFile = parse_toml(
            "listen = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:9\"\nmode = \"copy-bidirectional\"\nbuffer_size = \"8KiB\"\nnodelay = false\nidle_timeout = \"30s\"\ncongestion = \"reno\"\n",
        )
        .unwrap();
        assert_eq!(f.congestion.as_deref(), Some("reno"));
        assert_eq!(f.mode, Some(Mode::CopyBidirectional));
        let err = parse_toml::<ProxyFile>("bufer_size = 3\n").unwrap_err();
        assert!(err.contains("bufer_size"), "{err}");
    }
}
