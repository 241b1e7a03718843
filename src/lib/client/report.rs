//! What a run reports: the sender's figures per client, the receiver's
//! as the server answered ([`ServerView`]), the run's totals
//! ([`RunReport`]), and the host and settings that ran. Built by
//! `summary.rs`; printed by [`crate::output`].

use super::*;

/// What the server said it received for one session, or for all of them.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize, Default)]
pub struct ServerView {
    pub received_packets: u64,
    pub received_bytes: u64,
    /// Datagrams lost (at most this many, see `lost_fewest`).
    pub lost_packets: u64,
    /// Present when some arrivals could not be classified: the loss is then
    /// between this and `lost_packets`.
    pub lost_fewest: Option<u64>,
    pub loss_percent: f64,
    pub duplicates: u64,
    pub reordered: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub uncertain: u64,
    /// Datagrams that reached the server after it had finished the session.
    #[serde(skip_serializing_if = "is_zero")]
    pub late: u64,
    /// Datagrams whose sequence numbers this client never sent.
    #[serde(skip_serializing_if = "is_zero")]
    pub unexpected: u64,
    pub jitter_ms: f64,
    /// The queue delay the server measured (`stats::delay`); with several
    /// clients, the worst of their sessions'. Absent from an older server.
    #[serde(skip)]
    pub queue: Option<QueueFigures>,
    /// The server's arrival times were the kernel's receive timestamps
    /// (every session's answer said so).
    #[serde(skip)]
    pub kernel_times: bool,
    /// Receive rate: what arrived after the first arrival, over the longer
    /// of `seconds` and the senders' own span (`rate_span` says which);
    /// null only when both are under 1 ms.
    #[serialize_always]
    pub gbps: Option<f64>,
    /// From the first arrival to the last (server's clock).
    pub seconds: f64,
    pub rate_span: RateSpan,
    /// Drops on the server's socket(s) while the session(s) ran.
    #[serde(flatten)]
    pub drops: KernelDrops,
    /// The loss split by where it happened.
    #[serde(flatten)]
    pub split: stats::LossSplit,
    /// Buffers the server received that held several datagrams (GRO).
    pub gro_buffers: u64,
    /// The datagrams those held (None from a server that does not say).
    #[serde(skip)]
    pub gro_datagrams: Option<u64>,
    /// Buffers the server's kernel cut short (MSG_TRUNC).
    #[serde(skip_serializing_if = "is_zero")]
    pub truncated: u64,
    /// The server had finished the session as idle before the End came.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub idle_finished: bool,
    /// Transit times the server left out of the jitter as implausible.
    #[serde(skip_serializing_if = "is_zero")]
    pub transit_discarded: u64,
    /// The server saw another End for the session, or data after it that
    /// its total does not cover: these figures cannot be trusted.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub disputed: bool,
    /// The server's receive threads' CPU while the session(s) ran (shared
    /// with anything else it received meanwhile); absent where unknown.
    pub cpu: Option<CpuCost>,
}

pub(super) fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How a paced sender held its rate.
#[derive(Debug, Clone, Serialize)]
pub struct PacingReport {
    /// `batches` (what is due goes out every 0.5 ms, sleeping in between)
    /// or `precise` (each datagram at its time, spinning before it).
    pub mode: &'static str,
    /// The most datagrams one release sends back to back.
    pub burst_bound: u64,
    /// Time the sender fell behind its schedule beyond what one burst
    /// catches up (descheduled, or a full queue): the rate was not held
    /// for that long.
    pub behind_seconds: f64,
}

/// A run a signal cut short: its figures cover the run until then.
#[derive(Debug, Clone, Serialize)]
pub struct Interrupted {
    /// `SIGINT` or `SIGTERM`.
    pub signal: &'static str,
    /// From the start of the program to its report.
    pub after_seconds: f64,
}

impl Interrupted {
    /// The interruption, if a signal set `shutdown` (not an in-process
    /// stop).
    pub fn of(shutdown: &Shutdown) -> Option<Self> {
        shutdown.signal().map(|signal| Interrupted {
            signal: signal.name(),
            after_seconds: shutdown.elapsed().as_secs_f64(),
        })
    }

    /// The note that says so, first among a report's notes.
    pub fn note(&self) -> String {
        format!(
            "interrupted by {} after {:.2} s: the figures cover the run until then",
            self.signal, self.after_seconds
        )
    }
}

/// The exit code of a run that ended with `code`: a run a signal cut short
/// ends as the shell expects of one ended by that signal (130 for SIGINT,
/// 143 for SIGTERM), unless its answer was disputed (4), which matters more.
pub fn exit_code_after(code: i32, shutdown: &Shutdown) -> i32 {
    match shutdown.signal() {
        Some(signal) if code != EXIT_DISPUTED => signal.exit_code(),
        _ => code,
    }
}

/// What became of asking the server for its figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// The server answered the End.
    Answered,
    /// It answered the probe, but not the End.
    #[default]
    NoAnswer,
    /// The host said "port unreachable" while data was being sent.
    ServerGone,
    /// `--no-server`: the target is not a udp_server; nothing was asked.
    NotAsked,
    /// The server answered, but had no record of the session (it
    /// restarted, or forgot it): its figures are not this session's.
    NoRecord,
}

/// One client socket's result.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClientReport {
    pub session: String,
    pub local_addr: String,
    pub sent_packets: u64,
    pub sent_bytes: u64,
    /// Datagrams too short to carry a header (counted, not sequence-checked).
    pub untagged_packets: u64,
    /// From the return of the first send call to the return of the last.
    pub seconds: f64,
    /// Send rate over `seconds` of what the calls after the first sent;
    /// null under 1 ms.
    #[serialize_always]
    pub gbps: Option<f64>,
    pub enobufs_retries: u64,
    pub backoff_seconds: f64,
    /// At least this long, the sending thread was blocked in send calls
    /// (the socket's send buffer full: the qdisc or device held the data);
    /// this client's share of its thread's. Absent where unknown.
    pub send_blocked_seconds: Option<f64>,
    /// How the datagrams were really sent: batch, GSO, fallbacks.
    pub send_path: SendPath,
    /// SO_SNDBUF as granted, when --sndbuf was given.
    pub sndbuf: Option<sys::BufferGrant>,
    /// The sending thread's CPU over the send loop (getrusage
    /// RUSAGE_THREAD); absent where the platform cannot tell.
    pub cpu: Option<CpuCost>,
    /// How the rate was held, with --rate.
    pub pacing: Option<PacingReport>,
    /// What was sent per `--interval` (sender side); empty when off.
    pub intervals: Vec<SendInterval>,
    pub answer: Answer,
    #[serialize_always]
    pub server: Option<ServerView>,
    #[serde(skip)]
    pub(super) timing: SendTiming,
    #[serde(skip)]
    pub(super) cpu_used: Option<CpuTime>,
    #[serde(skip)]
    pub(super) loop_time: Duration,
    #[serde(skip)]
    pub(super) ack: Option<EndAck>,
    /// The receive buffer the server's kernel granted (its HelloAck), for
    /// advice that does not ask for what it already has.
    #[serde(skip)]
    pub(super) server_recv_buffer: Option<u64>,
    /// What the server kept of this upload per interval (`--plot`), when
    /// it did: [`intervals::received_per_interval`] matches it to
    /// `intervals`.
    #[serde(skip)]
    pub server_intervals: Option<intervals::ServerIntervals>,
}

/// The whole run: every client socket, and their totals.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunReport {
    /// netspeed's version.
    pub version: &'static str,
    /// When the run started, RFC 3339 in UTC (to the millisecond).
    pub start: String,
    /// The sending host.
    pub host: Host,
    /// The settings that ran, after defaults, config file and flags.
    pub settings: Settings,
    pub server_addr: String,
    pub buffer_size: usize,
    pub connected: bool,
    pub rate_bps: Option<u64>,
    pub sent_packets: u64,
    pub sent_bytes: u64,
    /// From the first client's first send call to the last one's last.
    pub seconds: f64,
    /// Send rate over `seconds` (sender side); null under 1 ms.
    #[serialize_always]
    pub gbps: Option<f64>,
    pub enobufs_retries: u64,
    pub backoff_seconds: f64,
    /// Sum over the clients of `send_blocked_seconds`; absent where unknown.
    pub send_blocked_seconds: Option<f64>,
    /// What the sender's own egress queue (the device's root qdisc) did
    /// during the run; absent where it cannot be read.
    pub sender_queue: Option<egress::SenderQueue>,
    /// All sending threads' CPU, over the run's wall time.
    pub cpu: Option<CpuCost>,
    /// Combined over the clients the server answered for; null if none did.
    #[serialize_always]
    pub server: Option<ServerView>,
    pub clients_answered: usize,
    /// Every client that asked got its answer (or none asked: --no-server).
    pub complete: bool,
    pub clients: Vec<ClientReport>,
    /// A signal cut the run short (absent when it ran to its end).
    pub interrupted: Option<Interrupted>,
    /// Things the user should know about how the run went.
    pub notes: Vec<String>,
    /// What capped the run, and what to try (`docs/output.md`).
    pub limited_by: verdict::Verdict,
    /// The round-trip probes beside the load ([`super::latency`]), once
    /// they are attached; shown in `streams[].latency`.
    #[serde(skip)]
    pub rtt: Option<RoundTripFigures>,
}

impl RunReport {
    /// 0; [`EXIT_DISPUTED`] when the server marked an answer as disputed;
    /// [`EXIT_NO_ANSWER`] when the receiver side is missing for a client
    /// that asked for it.
    pub fn exit_code(&self) -> i32 {
        if self.server.as_ref().is_some_and(|v| v.disputed) {
            EXIT_DISPUTED
        } else if self.complete {
            0
        } else {
            EXIT_NO_ANSWER
        }
    }
}

/// The sending host, for the record.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, Serialize)]
pub struct Host {
    /// `linux`, `macos`, ...
    pub os: &'static str,
    /// The kernel release, where the platform tells.
    pub kernel: Option<String>,
    /// CPUs this process may use.
    pub cpus: usize,
}

impl Host {
    pub fn this() -> Host {
        Host {
            os: std::env::consts::OS,
            kernel: sys::kernel_release(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// The settings a run used, resolved (see `docs/output.md`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Settings {
    pub server: String,
    pub buffer_size: usize,
    /// `{"bytes": N}`, `{"packets": N}` or `{"seconds": S}`.
    pub volume: serde_json::Value,
    pub rate_bps: Option<u64>,
    pub precise_pacing: bool,
    pub clients: usize,
    /// `--interval` in seconds; null when off.
    pub interval: Option<f64>,
    pub connected: bool,
    pub batch: usize,
    /// `auto`, `on` or `off`.
    pub gso: &'static str,
    pub sndbuf: Option<usize>,
    pub dont_fragment: bool,
    pub bind: Option<String>,
    pub end_timeout: f64,
    pub no_server: bool,
    pub psk: bool,
    /// `--idle-probe` in seconds.
    pub idle_probe: f64,
}

impl Settings {
    pub fn of(cfg: &ClientConfig) -> Settings {
        Settings {
            server: cfg.server.to_string(),
            buffer_size: cfg.buffer_size,
            volume: match cfg.volume {
                Volume::Bytes(n) => serde_json::json!({ "bytes": n }),
                Volume::Packets(n) => serde_json::json!({ "packets": n }),
                Volume::Time(d) => serde_json::json!({ "seconds": d.as_secs_f64() }),
            },
            rate_bps: cfg.rate_bps,
            precise_pacing: cfg.precise_pacing,
            clients: cfg.clients,
            interval: cfg.interval.map(|d| d.as_secs_f64()),
            connected: cfg.connected,
            batch: cfg.batch,
            gso: match cfg.gso {
                GsoRequest::Auto => "auto",
                GsoRequest::On => "on",
                GsoRequest::Off => "off",
            },
            sndbuf: cfg.sndbuf,
            dont_fragment: cfg.dont_fragment,
            bind: cfg.bind.map(|a| a.to_string()),
            end_timeout: cfg.end_timeout.as_secs_f64(),
            no_server: cfg.no_server,
            psk: cfg.psk.is_some(),
            idle_probe: cfg.idle_probe.as_secs_f64(),
        }
    }
}
