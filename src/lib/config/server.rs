//! `udp_server`'s settings: its flags ([`ServerArgs`]) and its TOML file
//! ([`ServerFile`]), both as a [`ServerFile`] layer, merged
//! by [`super::layered`] (defaults < file < flags), then validated once
//! into a [`ServerConfig`].

use super::{
    check_between, check_tables, check_threads, duration_arg, file_layer, layered, psk_from,
    sched_from, size_arg, table_keys, Conflict, DurationValue, Names, PskArgs, RateValue,
    Requirement, Sched, SchedArgs, SizeValue, MAX_SOCKET_BUFFER, MAX_THREADS,
};
use crate::auth::Psk;
use crate::error::{Error, Result};
use crate::meter::recv::Method;
use crate::sys::SchedPolicy;
use clap::Parser;
use serde::Deserialize;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// `--method NAME`: clap reads the names and their help from the engine's
/// own list ([`Method::ALL`], [`Method::name`], [`Method::about`]), so the
/// receive loops need not know about flags.
impl clap::ValueEnum for Method {
    fn value_variants<'a>() -> &'a [Self] {
        &Method::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()).help(self.about()))
    }
}

/// `udp_server`'s flags.
#[derive(Parser, Debug, Default)]
#[command(
    name = "udp_server",
    version = super::VERSION_TEXT,
    about = "Counts the UDP datagrams and bytes each peer sends, and reports exact rates.",
    long_about = None,
    after_help = super::EXTRA_HELP
)]
// The help shows addresses such as [::]:35000 as they are typed, not as
// rustdoc links.
#[allow(rustdoc::broken_intra_doc_links)]
pub struct ServerArgs {
    /// Address to listen on [default: [::]:35000, dual-stack (IPv4 and
    /// IPv6); 0.0.0.0:35000 where IPv6 is unavailable]. Port 0 picks a free
    /// port; the real address is printed at start.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Shorthand for --listen [::]:PORT.
    #[arg(short = 'p', long, value_name = "PORT")]
    pub port: Option<u16>,
    /// Report every active peer at this interval (e.g. 1s, 500ms); 0 turns it off [default: 1s].
    #[arg(short = 'i', long, value_name = "DURATION", value_parser = duration_arg)]
    pub interval: Option<Duration>,
    /// A peer with no datagram for this long is finished and summarised [default: 2s].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub idle_timeout: Option<Duration>,
    /// After a client's end-of-test message, keep counting its datagrams
    /// still in flight for this long before answering [default: 100ms].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub end_grace: Option<Duration>,
    /// SO_RCVBUF to ask for (e.g. 4M). The size the kernel granted is printed
    /// [default: 16M, forced as root, else as much as net.core.rmem_max allows].
    #[arg(long, value_name = "BYTES", value_parser = size_arg)]
    pub recv_buffer_size: Option<u64>,
    /// Most peers tracked at once; traffic from more is counted in one
    /// overflow bucket. Bounds memory under a flood of spoofed sources
    /// [default: 4096].
    #[arg(long, value_name = "N")]
    pub max_peers: Option<usize>,
    /// How to wait for and read datagrams [default: mmsg on Linux, else thread].
    #[arg(long, value_enum)]
    pub method: Option<Method>,
    /// Receive sockets (and threads) sharing the address with SO_REUSEPORT
    /// [default: 1].
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
    #[arg(short = 'J', long)]
    pub json: bool,
    /// Serve one test and exit 0 (iperf3 -1): stop once the first session
    /// whose client sent its end-of-test message is answered and
    /// summarised. Foreign traffic and idle sessions do not end it.
    #[arg(short = '1', long)]
    pub one_off: bool,
    /// With --one-off: write one JSON document in iperf3's -J shape for
    /// the test it served, from the server's side (what it received, or
    /// sent), and nothing else to stdout; the listening line goes to
    /// stderr. Reports every second unless -i says otherwise. Not with
    /// --json.
    #[arg(long)]
    pub iperf3_json: bool,
    /// Serve Prometheus metrics over HTTP at this address (e.g.
    /// 127.0.0.1:9477; port 0 picks a free port, printed at start): GET
    /// /metrics. Bind it to localhost or a management network [default: off].
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// How long --metrics keeps a finished peer's final figures (at most
    /// --max-peers of them), so a scrape sees them [default: 5m].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub metrics_retain: Option<Duration>,
    /// The longest the server sends any reverse stream (udp_client -R,
    /// --bidir); a longer request is refused [default: 60s].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub max_duration: Option<Duration>,
    /// The highest rate per reverse stream, e.g. 1G; a faster request is
    /// refused, an unpaced one is paced at it [default: unlimited for
    /// clients on this host, 10Gbit for others].
    #[arg(long, value_name = "RATE", value_parser = super::rate_arg)]
    pub max_rate: Option<u64>,
    /// Send reverse streams (udp_client -R, --bidir) without UDP GSO,
    /// one buffer per datagram, whatever the client asks (its --gso,
    /// --no-gso): for a path or a middlebox that mishandles GSO, or to
    /// compare [default: GSO where the client's datagrams allow it].
    #[arg(long)]
    pub no_gso: bool,
    /// Reverse streams sent at once; more are refused with the reason; 0
    /// refuses them all [default: 32].
    #[arg(long, value_name = "N")]
    pub max_reverse_streams: Option<usize>,
    /// Reverse streams one source (an IPv4 address, an IPv6 /64) may have
    /// at once, granted or sending, so that no host can take every slot
    /// [default: a quarter of --max-reverse-streams, at least 1].
    #[arg(long, value_name = "N")]
    pub max_reverse_streams_per_source: Option<usize>,
    /// Answer STAMP test packets (RFC 8762, with RFC 8972's session
    /// identifier) on this UDP port, or at ADDR:PORT: a stateful,
    /// unauthenticated reflector on a socket and a thread of its own; 862
    /// is STAMP's port [default: off].
    #[arg(long, value_name = "[ADDR:]PORT")]
    pub stamp: Option<String>,
    /// With --stamp: the most answers per second to one source address
    /// and port [default: 10000].
    #[arg(long, value_name = "N")]
    pub stamp_max_per_source: Option<u32>,
    /// With --stamp: the most answers per second to one IPv4 address or
    /// IPv6 /64 [default: 20000].
    #[arg(long, value_name = "N")]
    pub stamp_max_per_prefix: Option<u32>,
    /// With --stamp: the most answers per second in all [default: 1000000].
    #[arg(long, value_name = "N")]
    pub stamp_max_total: Option<u32>,
    /// With --stamp: the most sessions (source address, port and SSID)
    /// numbered at once; a new session beyond them is answered
    /// statelessly, its own numbers echoed [default: 4096].
    #[arg(long, value_name = "N")]
    pub stamp_max_sessions: Option<usize>,
    /// With --stamp: a session with no test packet for this long is
    /// forgotten; its next packet starts a new one [default: 60s].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub stamp_session_timeout: Option<Duration>,
    #[command(flatten)]
    pub stamp_clock: super::StampClockArgs,
    /// Read settings from a TOML file; flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// `udp_server`'s settings as one layer: the TOML file's shape (keys are
/// the long flags with underscores), and what the flags and the defaults
/// are turned into, so that [`super::layered`] merges them in one way.
/// `listen` and `port` are one choice: a layer that names either replaces
/// both below it (`--port` beats the file's `listen`).
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
    pub one_off: Option<bool>,
    pub iperf3_json: Option<bool>,
    pub metrics: Option<String>,
    pub metrics_retain: Option<DurationValue>,
    pub max_duration: Option<DurationValue>,
    pub max_rate: Option<RateValue>,
    pub no_gso: Option<bool>,
    pub max_reverse_streams: Option<usize>,
    pub max_reverse_streams_per_source: Option<usize>,
    pub stamp: Option<super::stamp::StampListen>,
    pub stamp_max_per_source: Option<u32>,
    pub stamp_max_per_prefix: Option<u32>,
    pub stamp_max_total: Option<u32>,
    pub stamp_max_sessions: Option<usize>,
    pub stamp_session_timeout: Option<DurationValue>,
    pub stamp_synchronized: Option<bool>,
    pub stamp_clock_error: Option<DurationValue>,
    /// `--psk`: a flag only (a file names a key file), in the layer so
    /// that it and `psk_file` are one choice.
    #[serde(skip)]
    pub psk: Option<String>,
}

crate::impl_layer!(ServerFile {
    option: [
        interval, idle_timeout, end_grace, recv_buffer_size, max_peers, method, threads, gro,
        scheduler, priority, json, one_off, iperf3_json, metrics, metrics_retain,
        max_duration, max_rate, no_gso, max_reverse_streams, max_reverse_streams_per_source, stamp,
        stamp_max_per_source, stamp_max_per_prefix, stamp_max_total, stamp_max_sessions,
        stamp_session_timeout, stamp_synchronized, stamp_clock_error,
    ]
    group: [[listen, port], [psk, psk_file]]
});

/// What the STAMP reflector's settings need.
const REFLECTOR: &str = "it sets up the STAMP reflector";

const fn needs(key: &'static str, needs: &'static str, why: &'static str) -> Requirement {
    Requirement { key, needs, why }
}

impl ServerFile {
    /// `udp_server`'s settings that cannot go together, by key (the long flags
    /// with underscores), wherever each comes from: the one list, checked on
    /// the merged settings ([`super::check_tables`]).
    pub const CONFLICTS: &'static [Conflict] = &[
        Conflict {
            a: "listen",
            b: "port",
            why: "--port PORT is --listen [::]:PORT: give one",
        },
        Conflict {
            a: "psk",
            b: "psk_file",
            why: "both give the pre-shared key: give one",
        },
        Conflict {
            a: "iperf3_json",
            b: "json",
            why: "it writes one iperf3 document",
        },
    ];

    /// `udp_server`'s settings that mean nothing without another, checked
    /// like [`Self::CONFLICTS`].
    pub const REQUIREMENTS: &'static [Requirement] = &[
        needs(
            "iperf3_json",
            "one_off",
            "it writes one document for one test",
        ),
        needs(
            "metrics_retain",
            "metrics",
            "it keeps finished peers in the metrics",
        ),
        needs("stamp_max_per_source", "stamp", REFLECTOR),
        needs("stamp_max_per_prefix", "stamp", REFLECTOR),
        needs("stamp_max_total", "stamp", REFLECTOR),
        needs("stamp_max_sessions", "stamp", REFLECTOR),
        needs("stamp_session_timeout", "stamp", REFLECTOR),
        needs("stamp_synchronized", "stamp", REFLECTOR),
        needs("stamp_clock_error", "stamp", REFLECTOR),
    ];

    /// Whether these merged settings set `key`, for [`Self::CONFLICTS`] and
    /// [`Self::REQUIREMENTS`]; None for a key udp_server does not have. A switch is
    /// set when on.
    pub fn given(&self, key: &str) -> Option<bool> {
        let on = |v: Option<bool>| v == Some(true);
        Some(match key {
            "listen" => self.listen.is_some(),
            "port" => self.port.is_some(),
            "psk" => self.psk.is_some(),
            "psk_file" => self.psk_file.is_some(),
            "json" => on(self.json),
            "one_off" => on(self.one_off),
            "iperf3_json" => on(self.iperf3_json),
            "metrics" => self.metrics.is_some(),
            "metrics_retain" => self.metrics_retain.is_some(),
            "stamp" => self.stamp.is_some(),
            "stamp_max_per_source" => self.stamp_max_per_source.is_some(),
            "stamp_max_per_prefix" => self.stamp_max_per_prefix.is_some(),
            "stamp_max_total" => self.stamp_max_total.is_some(),
            "stamp_max_sessions" => self.stamp_max_sessions.is_some(),
            "stamp_session_timeout" => self.stamp_session_timeout.is_some(),
            "stamp_synchronized" => on(self.stamp_synchronized),
            "stamp_clock_error" => self.stamp_clock_error.is_some(),
            _ => return None,
        })
    }
}

impl ServerFile {
    /// The defaults, as a layer: none of them a key of [`Self::CONFLICTS`] or
    /// [`Self::REQUIREMENTS`], which look at what was given (the retention of
    /// finished peers defaults in validation).
    pub fn defaults() -> Self {
        ServerFile {
            interval: Some(DurationValue::Parsed(super::DEFAULT_INTERVAL)),
            idle_timeout: Some(DurationValue::Parsed(Duration::from_secs(2))),
            end_grace: Some(DurationValue::Parsed(DEFAULT_END_GRACE)),
            max_peers: Some(4096),
            method: Some(Method::default_for_platform()),
            threads: Some(1),
            gro: Some(crate::sys::LINUX_SOCKETS),
            json: Some(false),
            one_off: Some(false),
            max_duration: Some(DurationValue::Parsed(DEFAULT_MAX_DURATION)),
            max_reverse_streams: Some(DEFAULT_MAX_STREAMS),
            ..ServerFile::default()
        }
    }

    /// The flags that were given.
    fn from_flags(args: &ServerArgs) -> Self {
        ServerFile {
            listen: args.listen.clone(),
            port: args.port,
            interval: args.interval.map(DurationValue::Parsed),
            idle_timeout: args.idle_timeout.map(DurationValue::Parsed),
            end_grace: args.end_grace.map(DurationValue::Parsed),
            recv_buffer_size: args.recv_buffer_size.map(SizeValue::Number),
            max_peers: args.max_peers,
            method: args.method,
            threads: args.threads,
            gro: super::on_off(args.gro, args.no_gro),
            scheduler: args.sched.scheduler,
            priority: args.sched.priority,
            psk: args.psk.psk.clone(),
            psk_file: args.psk.psk_file.clone(),
            json: args.json.then_some(true),
            one_off: args.one_off.then_some(true),
            iperf3_json: args.iperf3_json.then_some(true),
            metrics: args.metrics.clone(),
            metrics_retain: args.metrics_retain.map(DurationValue::Parsed),
            max_duration: args.max_duration.map(DurationValue::Parsed),
            max_rate: args.max_rate.map(RateValue::Parsed),
            no_gso: args.no_gso.then_some(true),
            max_reverse_streams: args.max_reverse_streams,
            max_reverse_streams_per_source: args.max_reverse_streams_per_source,
            stamp: args.stamp.clone().map(super::stamp::StampListen::Text),
            stamp_max_per_source: args.stamp_max_per_source,
            stamp_max_per_prefix: args.stamp_max_per_prefix,
            stamp_max_total: args.stamp_max_total,
            stamp_max_sessions: args.stamp_max_sessions,
            stamp_session_timeout: args.stamp_session_timeout.map(DurationValue::Parsed),
            stamp_synchronized: args.stamp_clock.stamp_synchronized.then_some(true),
            stamp_clock_error: args
                .stamp_clock
                .stamp_clock_error
                .map(DurationValue::Parsed),
        }
    }
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
    /// `--one-off`: stop after the first session that ends with an End.
    pub one_off: bool,
    /// `--iperf3-json`: one document in iperf3's `-J` shape for the test
    /// served (with `one_off`).
    pub iperf3_json: bool,
    /// `--metrics`: where to serve Prometheus metrics, if anywhere.
    pub metrics: Option<SocketAddr>,
    /// `--metrics-retain`: how long finished peers stay in the metrics.
    pub metrics_retain: Duration,
    /// `--max-duration`, `--max-rate`, `--max-reverse-streams`.
    pub streams: StreamCaps,
    /// `--stamp`: the STAMP reflector, when it runs.
    pub stamp: Option<super::StampSettings>,
}

/// How long the server counts datagrams still in flight after an End: a
/// datagram reordered behind the End on a real path is late by well under
/// this.
pub const DEFAULT_END_GRACE: Duration = Duration::from_millis(100);
/// The longest `--end-grace`: the client waits this long on top of its own
/// `--end-timeout`.
pub const MAX_END_GRACE: Duration = Duration::from_secs(5);

/// The largest `--max-peers`: the server's table, its records and their
/// sequence sets stay within a few hundred MiB even then.
pub const MAX_PEERS_LIMIT: usize = 65536;

/// How long `--metrics` keeps a finished peer: several scrapes at the
/// usual 15-60 s interval see its final figures.
pub const DEFAULT_METRICS_RETAIN: Duration = Duration::from_secs(300);

/// The server's caps on what a reverse stream may ask for
/// (`udp_client -R`, `--bidir`); the server's stream engine applies them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamCaps {
    /// The longest any stream runs (`--max-duration`).
    pub max_duration: Duration,
    /// The highest rate per stream (`--max-rate`, bit/s); None: unlimited
    /// for clients on loopback, and [`MAX_RATE_OFF_LOOPBACK`] otherwise.
    pub max_rate_bps: Option<u64>,
    /// Streams sent at once (`--max-reverse-streams`); 0 refuses them all.
    pub max_streams: usize,
    /// ... and from one source (`--max-reverse-streams-per-source`).
    pub max_per_source: usize,
    /// `--no-gso`: streams are sent without GSO, whatever the client asks.
    pub no_gso: bool,
}

/// `--max-rate`'s default for a client that is not on this host.
pub const MAX_RATE_OFF_LOOPBACK: u64 = 10_000_000_000;
/// `--max-duration`'s default.
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(60);
/// `--max-reverse-streams`'s default.
pub const DEFAULT_MAX_STREAMS: usize = 32;

/// `--max-reverse-streams-per-source`'s default for `max_streams`: a
/// quarter, so that four sources at least always find room, but one.
pub fn default_per_source(max_streams: usize) -> usize {
    (max_streams / 4).max(1)
}

impl Default for StreamCaps {
    fn default() -> Self {
        StreamCaps {
            max_duration: DEFAULT_MAX_DURATION,
            max_rate_bps: None,
            max_streams: DEFAULT_MAX_STREAMS,
            max_per_source: default_per_source(DEFAULT_MAX_STREAMS),
            no_gso: false,
        }
    }
}

impl StreamCaps {
    /// The rate cap for a client at `ip`.
    pub fn rate_for(&self, ip: IpAddr) -> Option<u64> {
        match self.max_rate_bps {
            Some(cap) => Some(cap),
            None if ip.to_canonical().is_loopback() => None,
            None => Some(MAX_RATE_OFF_LOOPBACK),
        }
    }
}

/// The longest `--max-duration`: a day.
pub const MAX_STREAM_DURATION: Duration = Duration::from_secs(86_400);

/// The port seed 001 used, kept as our default.
pub const DEFAULT_PORT: u16 = 35000;

impl Default for ServerConfig {
    /// The defaults alone (what `udp_client --local` runs).
    fn default() -> Self {
        Self::from_layer(ServerFile::defaults(), &Names::default()).expect("the defaults are valid")
    }
}

impl ServerConfig {
    /// Merges defaults, the config file named by `--config`, and the flags.
    pub fn from_args(args: ServerArgs) -> Result<Self> {
        let file = file_layer::<ServerFile>(args.config.as_deref())?;
        let flags = ServerFile::from_flags(&args);
        // A key only the file gave is named as the file spells it.
        let names = match &file {
            Some(file) => Names::new(
                &table_keys(ServerFile::CONFLICTS, ServerFile::REQUIREMENTS),
                |key| (file.given(key) == Some(true)).then(|| key.to_string()),
                |key| flags.given(key) == Some(true),
            ),
            None => Names::default(),
        };
        Self::from_layer(layered(ServerFile::defaults(), file, flags), &names)
    }

    /// Validates merged settings once. What cannot go together is refused
    /// first, by the tables, the same wherever each setting came from;
    /// `names` says how the user wrote each of their keys.
    fn from_layer(l: ServerFile, names: &Names) -> Result<Self> {
        let given = |key: &str| l.given(key);
        check_tables(
            ServerFile::CONFLICTS,
            ServerFile::REQUIREMENTS,
            given,
            names,
        )?;
        // Only the port named: still the default address, with its IPv4
        // fallback.
        let listen_is_default = l.listen.is_none();
        let listen = match (l.listen, l.port) {
            (Some(listen), _) => listen.parse().map_err(|_| {
                Error::usage(format!(
                    "invalid --listen address '{listen}': expected IP:PORT, e.g. [::]:35000"
                ))
            })?,
            (None, port) => SocketAddr::from(([0u16; 8], port.unwrap_or(DEFAULT_PORT))),
        };
        let duration = |v: Option<DurationValue>, key| v.map(|v| v.duration(key)).transpose();
        let one_off = l.one_off.unwrap_or(false);
        let iperf3_json = l.iperf3_json.unwrap_or(false);
        // iperf3 reports every second: so does --iperf3-json, unless an
        // interval was given (the defaults' layer gives one).
        let interval = duration(l.interval, "interval")?
            .or(iperf3_json.then_some(super::DEFAULT_INTERVAL))
            .filter(|i| !i.is_zero());
        let idle_timeout =
            duration(l.idle_timeout, "idle_timeout")?.unwrap_or(Duration::from_secs(2));
        if idle_timeout < Duration::from_millis(10) {
            return Err(Error::usage("--idle-timeout must be at least 10ms"));
        }
        let end_grace = duration(l.end_grace, "end_grace")?.unwrap_or(DEFAULT_END_GRACE);
        if end_grace > MAX_END_GRACE {
            return Err(Error::usage(format!(
                "--end-grace must be at most {}s",
                MAX_END_GRACE.as_secs()
            )));
        }
        let recv_buffer_size = l
            .recv_buffer_size
            .map(|v| v.bytes("recv_buffer_size"))
            .transpose()?
            .map(|b| check_between("--recv-buffer-size", b, MAX_SOCKET_BUFFER))
            .transpose()?;
        let max_peers = check_between("--max-peers", l.max_peers.unwrap_or(4096), MAX_PEERS_LIMIT)?;
        let metrics = l
            .metrics
            .map(|m| {
                m.parse::<SocketAddr>().map_err(|_| {
                    Error::usage(format!(
                        "invalid --metrics address '{m}': expected IP:PORT, e.g. 127.0.0.1:9477"
                    ))
                })
            })
            .transpose()?;
        let metrics_retain =
            duration(l.metrics_retain, "metrics_retain")?.unwrap_or(DEFAULT_METRICS_RETAIN);
        if metrics_retain < Duration::from_secs(1) {
            return Err(Error::usage("--metrics-retain must be at least 1s"));
        }
        let max_duration =
            duration(l.max_duration, "max_duration")?.unwrap_or(DEFAULT_MAX_DURATION);
        if max_duration.is_zero() || max_duration > MAX_STREAM_DURATION {
            return Err(Error::usage(format!(
                "--max-duration must be between 1ms and {}s",
                MAX_STREAM_DURATION.as_secs()
            )));
        }
        let max_rate_bps = l.max_rate.map(|r| r.bps("max_rate")).transpose()?;
        if max_rate_bps == Some(0) {
            return Err(Error::usage(
                "--max-rate must be above 0 (--max-reverse-streams 0 refuses reverse streams)",
            ));
        }
        let max_streams = l.max_reverse_streams.unwrap_or(DEFAULT_MAX_STREAMS);
        if max_streams > MAX_PEERS_LIMIT {
            return Err(Error::usage(format!(
                "--max-reverse-streams {max_streams}: must be between 0 and {MAX_PEERS_LIMIT}"
            )));
        }
        let max_per_source = l
            .max_reverse_streams_per_source
            .unwrap_or_else(|| default_per_source(max_streams));
        if max_per_source == 0 || max_per_source > max_streams.max(1) {
            return Err(Error::usage(format!(
                "--max-reverse-streams-per-source {max_per_source}: must be between 1 and --max-reverse-streams ({max_streams})"
            )));
        }
        let streams = StreamCaps {
            max_duration,
            max_rate_bps,
            max_streams,
            max_per_source,
            no_gso: l.no_gso.unwrap_or(false),
        };
        // Whether this platform has the method is the role's to say, at
        // bind (server::bind).
        let method = l.method.unwrap_or_else(Method::default_for_platform);
        let psk = psk_from(
            &PskArgs {
                psk: l.psk,
                psk_file: l.psk_file,
            },
            None,
        )?;
        let stamp = super::stamp::server_settings(
            super::StampServerKeys {
                stamp: l.stamp.map(super::stamp::StampListen::into_text),
                max_per_source: l.stamp_max_per_source,
                max_per_prefix: l.stamp_max_per_prefix,
                max_total: l.stamp_max_total,
                max_sessions: l.stamp_max_sessions,
                session_timeout: duration(l.stamp_session_timeout, "stamp_session_timeout")?,
                synchronized: l.stamp_synchronized,
                clock_error: duration(l.stamp_clock_error, "stamp_clock_error")?,
            },
            interval,
        )?;
        Ok(ServerConfig {
            listen,
            listen_is_default,
            interval,
            idle_timeout,
            end_grace,
            recv_buffer_size: recv_buffer_size.map(|b| b as usize),
            max_peers,
            method,
            threads: check_threads(l.threads.unwrap_or(1), MAX_THREADS)?,
            gro: l.gro.unwrap_or(crate::sys::LINUX_SOCKETS),
            sched: sched_from(l.scheduler, l.priority)?,
            psk,
            json: l.json.unwrap_or(false),
            one_off,
            iperf3_json,
            metrics,
            metrics_retain,
            streams,
            stamp,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{server, TempConfig};
    use crate::config::{flag_of, one_choice};
    use clap::CommandFactory;

    #[test]
    fn the_tables_name_udp_servers_own_keys() {
        let cmd = ServerArgs::command();
        let (l, defaults) = (ServerFile::default(), ServerFile::defaults());
        for key in table_keys() {
            assert!(l.given(key).is_some(), "{key}: not a key");
            assert!(!defaults.given(key).unwrap(), "{key}: set by the defaults");
            let long = flag_of(key);
            assert!(
                cmd.get_arguments()
                    .any(|a| a.get_long() == long.strip_prefix("--")),
                "{key}: udp_server has no {long}"
            );
        }
    }

    /// Every key the tables name.
    fn table_keys() -> Vec<&'static str> {
        ServerFile::CONFLICTS
            .iter()
            .flat_map(|c| [c.a, c.b])
            .chain(
                ServerFile::REQUIREMENTS
                    .iter()
                    .flat_map(|r| [r.key, r.needs]),
            )
            .collect()
    }

    /// A requirement met by the file or by a flag is met: `--metrics-retain`
    /// with the file's `metrics`, `--stamp-max-total` with the file's
    /// `stamp` (clap's own `requires` refused both).
    #[test]
    fn a_requirement_is_met_wherever_it_is_given() {
        let file = TempConfig::new("metrics = \"127.0.0.1:0\"\nstamp = \"127.0.0.1:0\"\n");
        let cfg = server(&[
            "--config",
            file.arg(),
            "--metrics-retain",
            "1m",
            "--stamp-max-total",
            "5",
        ])
        .unwrap();
        assert_eq!(cfg.metrics_retain, Duration::from_secs(60));
        assert_eq!(cfg.stamp.unwrap().max_total, 5);
        file.write("metrics_retain = \"1m\"\n");
        let why = "it keeps finished peers in the metrics";
        let err = server(&["--config", file.arg()]).unwrap_err();
        let flag = server(&["--metrics-retain", "1m"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        // The same words, each key as it was written.
        assert_eq!(
            err.to_string(),
            format!("metrics_retain needs --metrics: {why}")
        );
        assert_eq!(
            flag.to_string(),
            format!("--metrics-retain needs --metrics: {why}")
        );
        assert!(server(&["--config", file.arg(), "--metrics", "127.0.0.1:0"]).is_ok());
    }

    /// `listen` and `port` in one file conflict as the flags do (the file's
    /// `listen` used to win silently); a flag replaces the file's choice.
    #[test]
    fn listen_and_port_are_one_choice() {
        assert!(one_choice::<ServerFile>("listen", "port"));
        let file = TempConfig::new("listen = \"127.0.0.1:7\"\nport = 9\n");
        let why = "--port PORT is --listen [::]:PORT: give one";
        let err = server(&["--config", file.arg()]).unwrap_err();
        let flags = server(&["--listen", "127.0.0.1:7", "-p", "9"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert_eq!(
            err.to_string(),
            format!("listen cannot be used with port: {why}")
        );
        assert_eq!(
            flags.to_string(),
            format!("--listen cannot be used with --port: {why}")
        );
        file.write("port = 9\n");
        let cfg = server(&["--config", file.arg(), "--listen", "127.0.0.1:7"]).unwrap();
        assert_eq!(cfg.listen, "127.0.0.1:7".parse().unwrap());
    }
}
