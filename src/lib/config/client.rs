//! `udp_client`'s settings: its flags ([`ClientArgs`]) and its TOML file
//! ([`ClientFile`]), both as a [`ClientFile`] layer, merged
//! by [`super::layered`] (defaults < file < flags), then validated once
//! into a [`ClientConfig`]. `--local`, `--sweep`, `--plot`, a `--clients`
//! list and `--psk` are flags only.

use super::{
    check_between, check_tables, duration_arg, file_layer, layered, percent_arg, psk_from,
    rate_arg, resolve, sched_from, size_arg, DurationValue, Names, PskArgs, Sched, SchedArgs,
    SizeValue, MAX_SOCKET_BUFFER,
};
use crate::auth::Psk;
use crate::error::{Error, Result};
use crate::meter::plan::Volume;
use crate::meter::send::GsoRequest;
use crate::sys::SchedPolicy;
use crate::units;
use clap::Parser;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `udp_client`'s flags. The first three are seed 001's, with its defaults.
#[derive(Parser, Debug, Default)]
#[command(
    name = "udp_client",
    version = super::VERSION_TEXT,
    about = "Sends an exact volume of UDP data to a udp_server and reports both sides.",
    long_about = None,
    after_help = super::EXTRA_HELP
)]
// The help shows addresses such as [::]:35000 as they are typed, not as
// rustdoc links.
#[allow(rustdoc::broken_intra_doc_links)]
pub struct ClientArgs {
    /// Server address, HOST:PORT [default: 127.0.0.1:35000]; host names and [::1]:PORT work.
    #[arg(short = 's', long, value_name = "ADDR")]
    pub server_addr: Option<String>,
    /// Datagram payload size in bytes [default: 5000]. The OS caps it:
    /// 65507 over IPv4, 65527 over IPv6. By default macOS limits UDP datagrams
    /// to 9216 bytes; raise it with: sudo sysctl -w net.inet.udp.maxdgram=65535
    #[arg(short = 'b', long, value_name = "BYTES", value_parser = size_arg)]
    pub buffer_size: Option<u64>,
    /// Total payload bytes to send, exactly (e.g. 1000000, 64K, 1G, 1GiB)
    /// [default: 1000000; with --local and no volume, --duration 3s].
    /// The last datagram may be shorter than --buffer-size. Unlike iperf3's
    /// -t, a volume, not a time: for a time use --duration. A bare number
    /// under 1000 (iperf3's `-t 10`) is refused: write 10B for 10 bytes.
    #[arg(short = 't', long, value_name = "BYTES", value_parser = volume_text)]
    pub total_send: Option<String>,
    /// Send this many datagrams instead of a byte total (works with -b 0).
    /// With --stamp-reflector, this many test packets.
    #[arg(short = 'n', long, visible_alias = "count", value_name = "N")]
    pub packets: Option<u64>,
    /// Send for this long instead of a byte total (e.g. 10s).
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub duration: Option<Duration>,
    /// Pace sending to this payload rate (e.g. 500Mbit, 1G, 100MB/s); unpaced by default.
    /// What is due goes out in batches every 0.5 ms, the sender sleeping in
    /// between.
    #[arg(long, value_name = "RATE", value_parser = rate_arg)]
    pub rate: Option<u64>,
    /// With --rate: send each datagram at its exact time, spinning for the
    /// last 200 µs before it, instead of in 0.5 ms batches. Costs up to a
    /// whole core; the report says so.
    #[arg(long)]
    pub precise_pacing: bool,
    /// Send on a connected socket (send, sendmmsg). The default; kept for
    /// scripts that name it.
    #[arg(long)]
    pub connected: bool,
    /// The simplest send path, for comparisons: one sendto per datagram on an
    /// unconnected socket, no sendmmsg and no GSO. The report counts the
    /// calls.
    #[arg(long)]
    pub plain_send: bool,
    /// Run N independent client sockets at once; each is its own peer.
    /// With --sweep, a list: one column per value (e.g. 1,2).
    #[arg(short = 'P', long, value_name = "N[,N...]", value_delimiter = ',')]
    pub clients: Vec<usize>,
    /// A table of rate against datagram size: run once per size (e.g.
    /// 500,1000,1500,65500) and print the server's receive rate per size
    /// and --clients value. Give each run --duration (e.g. 1s).
    #[arg(long, value_name = "SIZE,SIZE,...", value_delimiter = ',', value_parser = size_arg)]
    pub sweep: Vec<u64>,
    /// The buffer-exhaustion probe: one run per client count (e.g.
    /// 1,2,4,8,16), each client sending the same volume or --duration at
    /// --buffer-size; prints the aggregate received rate, the loss and the
    /// server socket's drops per count, and where its buffer first
    /// overflowed (with --plot, as a chart). Give each run --duration
    /// (e.g. 1s) or a volume.
    #[arg(long, value_name = "N,N,...", value_delimiter = ',')]
    pub sweep_clients: Vec<usize>,
    /// Draw the run as an SVG chart, per --interval on one time axis: each
    /// direction's rate sent (an upload's) and received, the share of
    /// datagrams lost, and the queue delay p50 and p99 (an upload's as
    /// the server measured them), with the probes' round trips; legends
    /// beside the panels. With --sweep: the table. With --find-limit:
    /// received rate and loss against offered rate.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Find the highest rate the path carries within --loss-tolerance
    /// (RFC 2544 throughput): an unpaced trial, then paced trials of
    /// --trial-duration, bisected to --resolution and confirmed. Prints each
    /// trial, the rate found, and where the first losses above it were
    /// counted. With --json-stream, one `trial` event per trial, then
    /// `end` with the --json report.
    #[arg(long)]
    pub find_limit: bool,
    /// With --find-limit: the loss a passing trial may have, in percent
    /// [default: 0].
    #[arg(long, value_name = "PERCENT", value_parser = percent_arg)]
    pub loss_tolerance: Option<f64>,
    /// With --find-limit: a trial passes only if its data's 99th
    /// percentile queue delay stays under this too (e.g. 10ms): the
    /// highest rate a call or a game can use [default: no bound].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub max_delay: Option<Duration>,
    /// With --find-limit: each trial's length [default: 1s].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub trial_duration: Option<Duration>,
    /// With --find-limit: stop bisecting when the highest passing rate is
    /// within this many percent of the lowest failing one [default: 2].
    #[arg(long, value_name = "PERCENT", value_parser = percent_arg)]
    pub resolution: Option<f64>,
    /// With --find-limit: how many more trials the rate found must pass
    /// [default: 2].
    #[arg(long, value_name = "N")]
    pub confirm: Option<u32>,
    /// With --find-limit: the pause after each trial, for queues to drain
    /// and policers to refill [default: 0.5s].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub trial_pause: Option<Duration>,
    /// With --find-limit: the most trials, the unpaced one included
    /// [default: 40].
    #[arg(long, value_name = "N")]
    pub max_trials: Option<u32>,
    /// Print what was sent every this long (e.g. 1s, 500ms); 0 turns it
    /// off. The JSON report carries the same intervals [default: 1s].
    #[arg(short = 'i', long, value_name = "DURATION", value_parser = duration_arg)]
    pub interval: Option<Duration>,
    /// How long to wait for the server's end-of-test answer [default: 1s].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub end_timeout: Option<Duration>,
    /// Datagrams (or GSO buffers) per sendmmsg call [default: 32 on Linux;
    /// elsewhere one call per datagram].
    #[arg(long, value_name = "N")]
    pub batch: Option<usize>,
    /// UDP GSO: hand the kernel buffers of up to 64 KiB that it cuts into
    /// --buffer-size datagrams (UDP_SEGMENT). Falls back to plain sends if
    /// the kernel or the path refuses; the report says which path was used.
    /// On by default on Linux wherever a buffer holds two or more
    /// datagrams (--buffer-size up to half the largest UDP payload).
    #[arg(long, overrides_with = "no_gso")]
    pub gso: bool,
    /// No UDP GSO: one datagram per message.
    #[arg(long, overrides_with = "gso")]
    pub no_gso: bool,
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
    /// Send from this local address (iperf3 -B): an IP, or IP:PORT. The
    /// family must match the server's; a fixed port takes one client.
    #[arg(short = 'B', long, value_name = "ADDR")]
    pub bind: Option<String>,
    /// Start an in-process server on an ephemeral loopback port and test
    /// against it; without -t, -n or --duration it runs for 3 s.
    #[arg(long)]
    pub local: bool,
    /// The target is not a udp_server (nc, sockperf, a packet sink): skip
    /// the start probe and the end-of-test exchange; sender side only.
    #[arg(long)]
    pub no_server: bool,
    /// Reverse (iperf3 -R): the server sends, this client counts. Measures
    /// the reverse direction, through NAT too: the client speaks first.
    /// -b, -t, -n, --duration, --rate, -P, --gso/--no-gso and -i keep their
    /// meaning, for what the server sends.
    #[arg(short = 'R', long)]
    pub reverse: bool,
    /// Both directions at once (iperf3 --bidir): this client sends on one
    /// socket while the server sends to it on another; each direction is
    /// reported on its own.
    #[arg(long)]
    pub bidir: bool,
    /// Round-trip probes alone for this long before the load, for the idle
    /// round trip the loaded one is compared with; 0 skips it (probes
    /// still run during the load) [default: 1s].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub idle_probe: Option<Duration>,
    /// With -R or --bidir: SO_RCVBUF to ask for on the client's receive
    /// socket (e.g. 8M); the granted size is reported [default: 4M].
    #[arg(long, value_name = "BYTES", value_parser = size_arg)]
    pub recv_buffer_size: Option<u64>,
    /// With -R or --bidir: UDP_GRO on the client's receive socket, the
    /// kernel coalescing the datagrams it receives (each still counted).
    /// The default where supported (Linux).
    #[arg(long, overrides_with = "no_gro")]
    pub gro: bool,
    /// With -R or --bidir: turn UDP_GRO off on the client's receive
    /// socket: one datagram per read, as the kernel's per-datagram
    /// counters see them.
    #[arg(long, overrides_with = "gro")]
    pub no_gro: bool,
    /// Send the round-trip probes to a STAMP reflector (RFC 8762; udp_server
    /// --stamp, a router, stamp-suite) instead of udp_server: HOST or
    /// HOST:PORT [default port: 862]. The load still goes to --server; the
    /// rtt line, RPM and the verdict then tell the delay to that
    /// reflector. With --no-load: the round trip alone, --count test
    /// packets (or for --duration) every --stamp-interval, waiting
    /// --end-timeout for the last answers; round-trip percentiles and loss
    /// each way.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub stamp_reflector: Option<String>,
    /// With --stamp-reflector: measure the round trip alone, with no load
    /// beside it.
    #[arg(long)]
    pub no_load: bool,
    /// With --stamp-reflector: the time between test packets [default: 10ms
    /// with --no-load; 50ms, the probes' own rate, under a load].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub stamp_interval: Option<Duration>,
    /// With --stamp-reflector: bytes per test packet, the UDP payload; at
    /// least the 44-byte base packet, the rest an RFC 8972 Extra Padding
    /// TLV [default: 44].
    #[arg(long, value_name = "BYTES", value_parser = size_arg)]
    pub stamp_size: Option<u64>,
    /// With --stamp-reflector: the session identifier (RFC 8972), 1 to
    /// 65535 [default: random].
    #[arg(long, value_name = "N")]
    pub stamp_ssid: Option<u16>,
    /// With --stamp-reflector --no-load: the reflector numbers its answers itself,
    /// per session (RFC 8762's stateful mode, as udp_server --stamp does),
    /// so loss its numbers cannot place was on the way back. Without it,
    /// such loss is split only once the numbers prove the reflector
    /// stateful.
    #[arg(long)]
    pub stamp_stateful: bool,
    #[command(flatten)]
    pub stamp_clock: super::StampClockArgs,
    /// Write one JSON object with the final report to stdout.
    #[arg(short = 'J', long)]
    pub json: bool,
    /// Write NDJSON events to stdout as they happen (iperf3 3.17's name):
    /// `start`, one `interval` per client interval (and per server interval
    /// with --local), then `end` with the report --json would print.
    #[arg(long)]
    pub json_stream: bool,
    /// Write one JSON document in iperf3's -J shape for a UDP test (start,
    /// intervals, end), for tools that read iperf3; nothing else goes to
    /// stdout. Reports every second unless -i says otherwise. Not with
    /// --json, --json-stream, --sweep, --find-limit or --no-server.
    #[arg(long)]
    pub iperf3_json: bool,
    /// No progress bar.
    #[arg(short, long)]
    pub quiet: bool,
    /// Read settings from a TOML file; flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// `udp_client`'s settings as one layer: the TOML file's shape (keys are
/// the long flags with underscores), and what the flags and the defaults
/// are turned into, so that [`super::layered`] merges them in one way.
/// `packets`, `total_send` and `duration` are one choice: a layer that
/// names any of them replaces all three below it (a `--duration` flag
/// beats the file's `total_send`); so are `psk` and `psk_file`, and the
/// socket, `connected` and `plain_send` (`--plain-send` beats the file's
/// `connected = true`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientFile {
    pub server_addr: Option<String>,
    pub buffer_size: Option<SizeValue>,
    pub total_send: Option<SizeValue>,
    pub packets: Option<u64>,
    pub duration: Option<DurationValue>,
    pub rate: Option<RateValue>,
    pub precise_pacing: Option<bool>,
    pub connected: Option<bool>,
    pub plain_send: Option<bool>,
    pub clients: Option<usize>,
    pub end_timeout: Option<DurationValue>,
    pub interval: Option<DurationValue>,
    pub batch: Option<usize>,
    pub gso: Option<bool>,
    pub sndbuf: Option<SizeValue>,
    pub dont_fragment: Option<bool>,
    pub no_server: Option<bool>,
    pub bind: Option<String>,
    pub scheduler: Option<SchedPolicy>,
    pub priority: Option<i32>,
    pub psk_file: Option<PathBuf>,
    pub json: Option<bool>,
    pub iperf3_json: Option<bool>,
    pub quiet: Option<bool>,
    pub reverse: Option<bool>,
    pub bidir: Option<bool>,
    pub recv_buffer_size: Option<SizeValue>,
    pub gro: Option<bool>,
    pub idle_probe: Option<DurationValue>,
    pub stamp_reflector: Option<String>,
    pub no_load: Option<bool>,
    pub stamp_interval: Option<DurationValue>,
    pub stamp_size: Option<SizeValue>,
    pub stamp_ssid: Option<u16>,
    pub stamp_stateful: Option<bool>,
    pub stamp_synchronized: Option<bool>,
    pub stamp_clock_error: Option<DurationValue>,
    /// `--psk`: a flag only (a file names a key file), in the layer so
    /// that it and `psk_file` are one choice.
    #[serde(skip)]
    pub psk: Option<String>,
}

crate::impl_layer!(ClientFile {
    option: [
        server_addr, buffer_size, rate, precise_pacing, clients, end_timeout, interval, batch,
        gso, sndbuf, dont_fragment, no_server, bind, scheduler, priority, json,
        iperf3_json, quiet, reverse, bidir, recv_buffer_size, gro, idle_probe, stamp_reflector, no_load,
        stamp_interval, stamp_size, stamp_ssid, stamp_stateful, stamp_synchronized,
        stamp_clock_error,
    ]
    group: [[packets, total_send, duration], [psk, psk_file], [connected, plain_send]]
});

impl ClientFile {
    /// Seed 001's defaults, as a layer: none of them a key of
    /// [`Self::CONFLICTS`] or [`Self::REQUIREMENTS`], which look at what was given
    /// (the server address and the client count default in validation).
    pub fn defaults() -> Self {
        ClientFile {
            buffer_size: Some(SizeValue::Number(DEFAULT_BUFFER_SIZE)),
            end_timeout: Some(DurationValue::Parsed(Duration::from_secs(1))),
            ..ClientFile::default()
        }
    }

    /// The flags that were given.
    fn from_flags(args: &ClientArgs) -> Self {
        ClientFile {
            server_addr: args.server_addr.clone(),
            buffer_size: args.buffer_size.map(SizeValue::Number),
            packets: args.packets,
            total_send: args.total_send.clone().map(SizeValue::Text),
            duration: args.duration.map(DurationValue::Parsed),
            rate: args.rate.map(RateValue::Parsed),
            precise_pacing: args.precise_pacing.then_some(true),
            connected: args.connected.then_some(true),
            plain_send: args.plain_send.then_some(true),
            clients: args.clients.first().copied(),
            end_timeout: args.end_timeout.map(DurationValue::Parsed),
            interval: args.interval.map(DurationValue::Parsed),
            batch: args.batch,
            gso: super::on_off(args.gso, args.no_gso),
            sndbuf: args.sndbuf.map(SizeValue::Number),
            dont_fragment: args.dont_fragment.then_some(true),
            no_server: args.no_server.then_some(true),
            bind: args.bind.clone(),
            scheduler: args.sched.scheduler,
            priority: args.sched.priority,
            psk: args.psk.psk.clone(),
            psk_file: args.psk.psk_file.clone(),
            json: args.json.then_some(true),
            iperf3_json: args.iperf3_json.then_some(true),
            quiet: args.quiet.then_some(true),
            reverse: args.reverse.then_some(true),
            bidir: args.bidir.then_some(true),
            recv_buffer_size: args.recv_buffer_size.map(SizeValue::Number),
            gro: super::on_off(args.gro, args.no_gro),
            idle_probe: args.idle_probe.map(DurationValue::Parsed),
            stamp_reflector: args.stamp_reflector.clone(),
            no_load: args.no_load.then_some(true),
            stamp_interval: args.stamp_interval.map(DurationValue::Parsed),
            stamp_size: args.stamp_size.map(SizeValue::Number),
            stamp_ssid: args.stamp_ssid,
            stamp_stateful: args.stamp_stateful.then_some(true),
            stamp_synchronized: args.stamp_clock.stamp_synchronized.then_some(true),
            stamp_clock_error: args
                .stamp_clock
                .stamp_clock_error
                .map(DurationValue::Parsed),
        }
    }
}

/// A rate in a TOML file: `"500Mbit"` (a string, as a number would leave
/// the unit unclear), or a flag's value, already parsed.
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "String")]
pub enum RateValue {
    Text(String),
    Parsed(u64),
}

impl From<String> for RateValue {
    fn from(text: String) -> Self {
        RateValue::Text(text)
    }
}

impl RateValue {
    /// Bits per second.
    pub fn bps(&self, key: &str) -> Result<u64> {
        match self {
            RateValue::Parsed(r) => Ok(*r),
            RateValue::Text(t) => {
                units::parse_rate(t).map_err(|e| Error::usage(format!("{key}: {e}")))
            }
        }
    }
}

/// A validated client configuration.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub server: SocketAddr,
    pub local: bool,
    /// The target is not a udp_server: no probe, no end-of-test exchange.
    pub no_server: bool,
    /// `--bind`: the local address to send from.
    pub bind: Option<SocketAddr>,
    pub buffer_size: usize,
    pub volume: Volume,
    pub rate_bps: Option<u64>,
    /// Spin to each datagram's exact time instead of sending in batches.
    pub precise_pacing: bool,
    pub connected: bool,
    pub clients: usize,
    pub end_timeout: Duration,
    /// `--interval`: print what was sent this often; None for off.
    pub interval: Option<Duration>,
    pub batch: usize,
    pub gso: GsoRequest,
    pub sndbuf: Option<usize>,
    pub dont_fragment: bool,
    pub sched: Option<Sched>,
    /// `--psk`: the End is tagged, and only tagged answers are taken.
    pub psk: Option<Psk>,
    /// The run the sessions belong to, as the Hello and the Start say it
    /// (`udp_server --one-off` waits for every session of a run): set by
    /// the run itself; None until then.
    pub run: Option<crate::wire::Run>,
    /// A JSON report (also set by `--json-stream`).
    pub json: bool,
    /// `--json-stream`: NDJSON events as they happen.
    pub json_stream: bool,
    /// `--iperf3-json`: one document in iperf3's `-J` shape.
    pub iperf3_json: bool,
    pub quiet: bool,
    /// One run, a sweep, or a search.
    pub mode: ClientMode,
    /// Which way the data flows (`-R`, `--bidir`).
    pub traffic: Traffic,
    /// With -R or --bidir: SO_RCVBUF for the client's receive socket ...
    pub recv_buffer_size: usize,
    /// ... and whether UDP_GRO is asked for on it (`--no-gro`: not).
    pub gro: bool,
    /// `--idle-probe`: round-trip probes alone before the load.
    pub idle_probe: Duration,
    /// `--stamp-reflector` beside a load: the round-trip probes go to that
    /// reflector as STAMP test packets (its `count` and `duration` unused:
    /// the load's are).
    pub stamp_probes: Option<super::StampSender>,
    /// `--plot` on an ordinary run: the timeline's SVG file.
    pub timeline_plot: Option<PathBuf>,
}

/// How the search is run (`--resolution`, `--confirm`, ...).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchSettings {
    /// Stop bisecting when the highest pass is within this share of the
    /// lowest failure (0.02 = 2 %).
    pub resolution: f64,
    /// Extra passes the result must make.
    pub confirmations: u32,
    /// The most trials, the unpaced one included.
    pub max_trials: u32,
    /// Loss (percent) a passing trial may have.
    pub loss_tolerance: f64,
    /// `--max-delay`: the most 99th-percentile queue delay a passing
    /// trial may have.
    pub max_delay: Option<Duration>,
    /// Each trial's length.
    pub trial: Duration,
    /// The pause after each trial, for queues to drain and policers to
    /// refill (RFC 2544 waits between trials too).
    pub pause: Duration,
}

/// The default `--resolution`, `--confirm`, `--max-trials`.
pub const DEFAULT_RESOLUTION: f64 = 0.02;
pub const DEFAULT_CONFIRMATIONS: u32 = 2;
pub const DEFAULT_MAX_TRIALS: u32 = 40;
/// Which way a run's data flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Traffic {
    /// The client sends, the server counts.
    #[default]
    Upload,
    /// `-R`: the server sends, the client counts.
    Reverse,
    /// `--bidir`: both at once.
    Bidir,
}

impl Traffic {
    /// The client sends in this run.
    pub fn uploads(self) -> bool {
        self != Traffic::Reverse
    }

    /// The server sends in this run.
    pub fn has_reverse(self) -> bool {
        self != Traffic::Upload
    }
}

/// `--recv-buffer-size`'s default for -R and --bidir: room for a burst at
/// tens of Gbit/s while the receive thread is descheduled for a moment.
pub const DEFAULT_CLIENT_RECV_BUFFER: u64 = 4 << 20;
/// `--idle-probe`'s default and its most.
pub const DEFAULT_IDLE_PROBE: Duration = Duration::from_secs(1);
pub const MAX_IDLE_PROBE: Duration = Duration::from_secs(60);

/// What udp_client does with its settings. The flags make these
/// exclusive; one enum says so, where three optional fields did not.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientMode {
    /// Send the volume once and report both ends.
    Run,
    /// `--sweep`: one run per size and per `--clients` value.
    Sweep {
        sizes: Vec<usize>,
        clients: Vec<usize>,
        /// `--plot`: the table as an SVG chart.
        plot: Option<PathBuf>,
    },
    /// `--find-limit`: the highest rate the path carries.
    FindLimit {
        search: SearchSettings,
        /// `--plot`: received rate and loss against offered rate.
        plot: Option<PathBuf>,
    },
    /// `--stamp-reflector ... --no-load`: STAMP round trips alone.
    Stamp(super::StampSender),
}

/// `--find-limit`'s settings from the flags.
fn search_settings(args: &ClientArgs) -> Result<Option<SearchSettings>> {
    if !args.find_limit {
        return Ok(None);
    }
    let resolution = args.resolution.unwrap_or(DEFAULT_RESOLUTION * 100.0);
    if !(0.1..=50.0).contains(&resolution) {
        return Err(Error::usage(format!(
            "--resolution {resolution}: give a percentage from 0.1 to 50"
        )));
    }
    let trial = args.trial_duration.unwrap_or(Duration::from_secs(1));
    if trial < Duration::from_millis(100) {
        return Err(Error::usage(
            "--trial-duration must be at least 100ms: shorter trials measure the start-up, not the rate",
        ));
    }
    let max_trials = args.max_trials.unwrap_or(DEFAULT_MAX_TRIALS);
    let confirmations = args.confirm.unwrap_or(DEFAULT_CONFIRMATIONS);
    check_between("--max-trials", max_trials, 1000)?;
    if confirmations > 100 {
        return Err(Error::usage(format!(
            "--confirm {confirmations}: must be between 0 and 100"
        )));
    }
    if max_trials < 2 {
        return Err(Error::usage(
            "--max-trials must be at least 2: the unpaced trial and one paced",
        ));
    }
    Ok(Some(SearchSettings {
        resolution: resolution / 100.0,
        confirmations,
        max_trials,
        loss_tolerance: args.loss_tolerance.unwrap_or(0.0),
        max_delay: args.max_delay,
        trial,
        pause: args.trial_pause.unwrap_or(Duration::from_millis(500)),
    }))
}

/// Why `--no-load` takes no load (nor more than one client): its
/// conflicts' reason.
pub(super) const ALONE: &str = "it measures round trips alone";

/// `--interval`'s default, and iperf3's: a line every second.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// `--bind`: an IP (any port) or IP:PORT, of the server's family; a fixed
/// port cannot serve several client sockets.
fn bind_addr(text: &str, server: &SocketAddr, clients: usize) -> Result<SocketAddr> {
    let addr = text
        .parse::<SocketAddr>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(|ip| SocketAddr::new(ip, 0)))
        .map_err(|_| {
            Error::usage(format!(
                "--bind {text}: expected an IP address or IP:PORT (e.g. 192.0.2.1 or [2001:db8::1]:5000)"
            ))
        })?;
    if addr.is_ipv4() != server.is_ipv4() {
        return Err(Error::usage(format!(
            "--bind {text}: not the address family of the server {server}"
        )));
    }
    if addr.port() != 0 && clients > 1 {
        return Err(Error::usage(format!(
            "--bind {text}: a fixed port takes one client; give an address without a port for --clients {clients}"
        )));
    }
    Ok(addr)
}

/// The STAMP sender's settings from the merged layer (None without
/// `--stamp-reflector`).
fn stamp_sender(l: &ClientFile) -> Result<Option<super::StampSender>> {
    let duration = |v: &Option<DurationValue>, key| v.as_ref().map(|v| v.duration(key)).transpose();
    let keys = super::StampClientKeys {
        reflector: l.stamp_reflector.clone(),
        no_load: l.no_load,
        interval: duration(&l.stamp_interval, "stamp_interval")?,
        size: l
            .stamp_size
            .as_ref()
            .map(|v| v.bytes("stamp_size"))
            .transpose()?,
        ssid: l.stamp_ssid,
        stateful: l.stamp_stateful,
        synchronized: l.stamp_synchronized,
        clock_error: duration(&l.stamp_clock_error, "stamp_clock_error")?,
    };
    let wait = duration(&l.end_timeout, "end_timeout")?.unwrap_or(Duration::from_secs(1));
    let Some(mut sender) =
        super::stamp::sender_settings(keys, l.packets, duration(&l.duration, "duration")?, wait)?
    else {
        return Ok(None);
    };
    sender.bind = l
        .bind
        .as_deref()
        .map(|text| bind_addr(text, &sender.reflector, 1))
        .transpose()?;
    Ok(Some(sender))
}

/// Most datagrams per sendmmsg call (the kernel's UIO_MAXIOV is 1024).
pub const MAX_BATCH: usize = 1024;
/// Datagrams per sendmmsg call by default: where sendmmsg exists, enough
/// to spread a call's entry cost thin; elsewhere one call per datagram.
pub const DEFAULT_BATCH: usize = if crate::sys::LINUX_SOCKETS { 32 } else { 1 };

/// Seed 001's defaults.
pub const DEFAULT_SERVER: &str = "127.0.0.1:35000";
pub const DEFAULT_BUFFER_SIZE: u64 = 5000;
pub const DEFAULT_TOTAL: u64 = 1_000_000;
/// `--local` without -t, -n or --duration runs this long.
pub const LOCAL_DURATION: Duration = Duration::from_secs(3);
/// At most this many client sockets in one process.
pub const MAX_CLIENTS: usize = 1024;

impl ClientConfig {
    /// Merges defaults, the config file named by `--config`, and the flags.
    pub fn from_args(args: ClientArgs) -> Result<Self> {
        let file = file_layer::<ClientFile>(args.config.as_deref())?;
        let flags = ClientFile::from_flags(&args);
        let names = ClientFile::names(file.as_ref(), &flags, &args);
        Self::from_layer(layered(ClientFile::defaults(), file, flags), args, &names)
    }

    /// Validates merged settings once; `args` gives the flag-only ones.
    /// What cannot go together is refused first, by the tables, the same
    /// wherever each setting came from.
    /// `names` says how the user wrote each key of the tables.
    fn from_layer(l: ClientFile, args: ClientArgs, names: &Names) -> Result<Self> {
        let given = |key: &str| l.given(&args, key);
        check_tables(
            ClientFile::CONFLICTS,
            ClientFile::REQUIREMENTS,
            given,
            names,
        )?;
        let stamp = stamp_sender(&l)?;
        let server_text = l.server_addr.unwrap_or_else(|| DEFAULT_SERVER.to_string());
        let server = resolve(&server_text)?;
        let duration = |v: Option<DurationValue>, key| v.map(|v| v.duration(key)).transpose();
        let size = |v: Option<SizeValue>, key| v.map(|v| v.bytes(key)).transpose();
        let buffer_size = size(l.buffer_size, "buffer_size")?.unwrap_or(DEFAULT_BUFFER_SIZE);
        let limit = crate::sys::max_udp_payload(&server);
        if buffer_size > limit as u64 {
            return Err(Error::usage(format!(
                "--buffer-size {buffer_size} is larger than the largest UDP datagram over {} ({limit} bytes); -b is the datagram size here: for a rate (iperf3's -b) use --rate",
                if server.is_ipv4() { "IPv4" } else { "IPv6" }
            )));
        }
        let volume = if let Some(n) = l.packets {
            Volume::Packets(n)
        } else if let Some(t) = l.total_send {
            if let Some(n) = seconds_like(&t) {
                return Err(Error::usage(format!(
                    "-t {n} is a volume here, {n} bytes (iperf3's -t is a time): for {n} seconds use --duration {n}s; for {n} bytes write -t {n}B"
                )));
            }
            Volume::Bytes(t.bytes("total_send")?)
        } else if let Some(d) = duration(l.duration, "duration")? {
            Volume::Time(d)
        } else if args.local {
            // The first thing a newcomer runs: long enough for a rate and
            // a few interval lines, not seed 001's 1 MB (a millisecond).
            Volume::Time(LOCAL_DURATION)
        } else {
            Volume::Bytes(DEFAULT_TOTAL)
        };
        if args.find_limit && buffer_size == 0 {
            return Err(Error::usage(
                "--find-limit paces datagrams of --buffer-size bytes: give at least 1",
            ));
        }
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
        let client_list = if !args.sweep_clients.is_empty() {
            args.sweep_clients.clone()
        } else if args.clients.is_empty() {
            vec![l.clients.unwrap_or(1)]
        } else {
            args.clients.clone()
        };
        let sweep_sizes: Vec<usize> = if args.sweep_clients.is_empty() {
            args.sweep.iter().map(|&b| b as usize).collect()
        } else {
            vec![buffer_size as usize]
        };
        if client_list.len() > 1 && sweep_sizes.is_empty() {
            return Err(Error::usage(
                "--clients takes one value unless --sweep is given",
            ));
        }
        for &n in &client_list {
            check_between("--clients", n, MAX_CLIENTS)?;
        }
        // `connected = false` is the unconnected socket's one path, as
        // --plain-send's: one sendto per datagram (the tables refused
        // connected, batch and gso beside either). The sender's path, and
        // so the header and the path line, follow from this one decision.
        let plain_send = l.plain_send == Some(true) || l.connected == Some(false);
        let batch = match l.batch {
            Some(b) => b,
            None if plain_send => 1,
            None => DEFAULT_BATCH,
        };
        let batch = check_between("--batch", batch, MAX_BATCH)?;
        let gso = match l.gso {
            Some(true) => GsoRequest::On,
            Some(false) => GsoRequest::Off,
            None if plain_send => GsoRequest::Off,
            None => GsoRequest::Auto,
        };
        if gso == GsoRequest::On && buffer_size == 0 {
            return Err(Error::usage("--gso needs --buffer-size of at least 1 byte"));
        }
        let sndbuf = size(l.sndbuf, "sndbuf")?
            .map(|b| check_between("--sndbuf", b, MAX_SOCKET_BUFFER))
            .transpose()?;
        let sched = sched_from(l.scheduler, l.priority)?;
        // One of the two at most (the tables).
        let traffic = if l.reverse == Some(true) {
            Traffic::Reverse
        } else if l.bidir == Some(true) {
            Traffic::Bidir
        } else {
            Traffic::Upload
        };
        let recv_buffer_size = size(l.recv_buffer_size, "recv_buffer_size")?;
        if recv_buffer_size.is_some() && !traffic.has_reverse() {
            return Err(Error::usage(
                "--recv-buffer-size sizes the client's receive socket: it needs -R or --bidir",
            ));
        }
        if l.gro.is_some() && !traffic.has_reverse() {
            return Err(Error::usage(
                "--gro and --no-gro set the client's receive socket: they need -R or --bidir (the server's --no-gro sets an upload's)",
            ));
        }
        let recv_buffer_size = check_between(
            "--recv-buffer-size",
            recv_buffer_size.unwrap_or(DEFAULT_CLIENT_RECV_BUFFER),
            MAX_SOCKET_BUFFER,
        )? as usize;
        let find_limit = search_settings(&args)?;
        let psk: Option<Psk> = psk_from(
            &PskArgs {
                psk: l.psk,
                psk_file: l.psk_file,
            },
            None,
        )?;
        // The tables refused the rest of a load beside --no-load; one
        // client is no load.
        let stamp_alone = stamp.as_ref().is_some_and(|s| s.alone);
        if stamp_alone && client_list[0] > 1 {
            return Err(Error::usage(format!(
                "{} cannot be used with {} {}: {}",
                names.of("no_load"),
                names.of("clients"),
                client_list[0],
                ALONE
            )));
        }
        let mode = match find_limit {
            _ if stamp_alone => ClientMode::Stamp(stamp.clone().expect("checked")),
            Some(search) => ClientMode::FindLimit {
                search,
                plot: args.plot.clone(),
            },
            None if !sweep_sizes.is_empty() => ClientMode::Sweep {
                sizes: sweep_sizes,
                clients: client_list.clone(),
                plot: args.plot.clone(),
            },
            None => ClientMode::Run,
        };
        let timeline_plot = matches!(mode, ClientMode::Run)
            .then_some(args.plot)
            .flatten();
        let iperf3_json = l.iperf3_json.unwrap_or(false);
        let idle_probe = duration(l.idle_probe, "idle_probe")?.unwrap_or(DEFAULT_IDLE_PROBE);
        if idle_probe > MAX_IDLE_PROBE {
            return Err(Error::usage(format!(
                "--idle-probe: at most {} s",
                MAX_IDLE_PROBE.as_secs()
            )));
        }
        Ok(ClientConfig {
            mode,
            server,
            local: args.local,
            no_server: l.no_server.unwrap_or(false),
            bind: l
                .bind
                .as_deref()
                .map(|text| bind_addr(text, &server, client_list[0]))
                .transpose()?,
            buffer_size: buffer_size as usize,
            volume,
            rate_bps: l.rate.map(|r| r.bps("rate")).transpose()?,
            precise_pacing: l.precise_pacing.unwrap_or(false),
            connected: !plain_send,
            clients: client_list[0],
            end_timeout: duration(l.end_timeout, "end_timeout")?.unwrap_or(Duration::from_secs(1)),
            // iperf3 reports every second: so does --iperf3-json, unless
            // an interval was given.
            interval: Some(duration(l.interval, "interval")?.unwrap_or(DEFAULT_INTERVAL))
                .filter(|d| !d.is_zero()),
            batch,
            gso,
            sndbuf: sndbuf.map(|b| b as usize),
            dont_fragment: l.dont_fragment.unwrap_or(false),
            psk,
            run: None,
            sched,
            json: l.json.unwrap_or(false) || args.json_stream,
            json_stream: args.json_stream,
            iperf3_json,
            quiet: l.quiet.unwrap_or(false),
            traffic,
            recv_buffer_size,
            gro: l.gro.unwrap_or(true),
            idle_probe,
            stamp_probes: stamp.filter(|s| !s.alone),
            timeline_plot,
        })
    }
}

/// `-t`'s value, checked as it is parsed and kept as written, so that a
/// bare number can be told from one with a unit.
fn volume_text(s: &str) -> std::result::Result<String, crate::units::UnitError> {
    crate::units::parse_size(s).map(|_| s.to_string())
}

/// A volume written as a bare number under 1000 (`-t 10`, `total_send =
/// 10`): iperf3's reflex for seconds, refused rather than sending 10
/// bytes. With a unit (`10B`) it is the volume it says.
fn seconds_like(v: &SizeValue) -> Option<u64> {
    match v {
        SizeValue::Number(n) => (1..1000).contains(n).then_some(*n),
        SizeValue::Text(t) => t
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|n| (1..1000).contains(n)),
    }
}
