//! What the proxy has to say while it runs, as typed events. The proxy
//! never prints: it hands each [`ProxyEvent`] to the [`EventSink`] it was
//! given, from whichever task or thread the event happened on, and the
//! binary's sink formats it (`crate::output::proxy`: text lines on stderr,
//! or NDJSON on stdout). Tests and embedders can collect the events
//! instead of parsing lines.

pub use super::pipes::RefusedBy;
use crate::config::proxy::ProxyConfig;
use serde::{Serialize, Serializer};
use std::net::SocketAddr;

/// How a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Both directions reached EOF.
    Closed,
    /// No bytes either way for `--idle-timeout`.
    Idle,
    /// Still open at the drain deadline, so the proxy cut it.
    Cut,
    /// A peer reset or abandoned the connection (ECONNRESET, EPIPE,
    /// ECONNABORTED on either leg). That is how many programs end a
    /// connection (iperf3's end, any close with unread data, SO_LINGER 0),
    /// and never a failure of the proxy's, so it is not an error.
    Reset,
    /// Any other socket error.
    Error(String),
}

impl End {
    /// How a relay that failed with `e` ended: [`End::Reset`] or
    /// [`End::Error`].
    pub fn from_io(e: &std::io::Error) -> End {
        if crate::sys::is_reset(e) {
            End::Reset
        } else {
            End::Error(e.to_string())
        }
    }

    /// The word the event lines use: `closed`, `idle-timeout`,
    /// `drain-deadline`, `reset` or `error: ...`.
    pub fn text(&self) -> String {
        match self {
            End::Closed => "closed".into(),
            End::Idle => "idle-timeout".into(),
            End::Cut => "drain-deadline".into(),
            End::Reset => "reset".into(),
            End::Error(e) => format!("error: {e}"),
        }
    }
}

impl Serialize for End {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text())
    }
}

/// One finished connection.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize)]
pub struct ConnReport {
    pub id: u64,
    pub client: SocketAddr,
    /// Bytes read from the client and written upstream.
    pub client_to_upstream: u64,
    /// Bytes read from the upstream and written to the client.
    pub upstream_to_client: u64,
    pub seconds: f64,
    pub end: End,
    /// `--mode splice`: the size each direction's pipe had reached when
    /// the connection closed (it starts at 64 KiB and grows up to
    /// `--buffer-size`). Absent in the other modes.
    pub pipe_client_to_upstream: Option<usize>,
    pub pipe_upstream_to_client: Option<usize>,
}

/// The totals at exit.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub accepted: u64,
    pub rejected: u64,
    /// Connections whose upstream refused or did not answer.
    pub upstream_failures: u64,
    /// Connections accepted and closed because the process had no
    /// descriptor left for their upstream leg (EMFILE, ENFILE): the local
    /// limit, never counted as upstream failures.
    pub fd_limit_refused: u64,
    /// Times the accept loop paused for 100 ms because the process was out
    /// of descriptors, at accept(2) or at an upstream connect (the
    /// connections waiting meanwhile stay in the backlog).
    pub accept_paused: u64,
    /// Connections that ended with `reset`: a peer reset them.
    pub resets: u64,
    /// Connections that ended with `error: ...`.
    pub errors: u64,
    /// Connections still open at the drain deadline, cut by the exit. Their
    /// bytes are in the totals, as every connection's are.
    pub cut_at_deadline: usize,
    pub client_to_upstream: u64,
    pub upstream_to_client: u64,
    /// `--mode splice`: how many times a pipe was refused a growth (by
    /// `--pipe-budget` or by the kernel) and stayed at its size.
    pub pipe_growths_refused: u64,
    /// `--mode splice`: pipes made, and times an empty pooled pipe was
    /// taken instead of making one.
    pub pipes_created: u64,
    pub pipes_reused: u64,
    /// `--mode splice`, at exit: pipes still in use (connections cut at the
    /// deadline), and empty pipes in the pool (each two descriptors).
    pub pipes_in_use: usize,
    pub pipes_pooled: usize,
    /// `--mode splice`: directions that found no pipe (all `pipes_max`
    /// open, or the kernel refused one) and copied a burst through a
    /// buffer; each counted once, however many bursts it copied.
    pub pipes_unavailable: u64,
}

/// The proxy is up: what it listens on and how it will relay.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize)]
pub struct Listening {
    pub addr: SocketAddr,
    pub upstream: SocketAddr,
    pub mode: &'static str,
    pub buffer_size: usize,
    pub threads: usize,
    pub nodelay: bool,
    /// The algorithm the proxy's sockets get: the configured one, or the
    /// system's default (None where the platform cannot tell).
    #[serialize_always]
    pub congestion: Option<String>,
    /// No `--congestion` was given.
    pub congestion_is_system_default: bool,
    /// The descriptor limit and what it allows; its `max_conns` is the
    /// most connections served at once (`--max-conns`, capped).
    #[serde(flatten)]
    pub capacity: super::Capacity,
    /// The capacity plan in words: how many connections fit, at two
    /// descriptors each, and in `splice` that the pipes come from the
    /// descriptors they leave ([`super::Capacity::plan_text`]).
    pub capacity_plan: String,
    /// `--mode splice`: the pipes may grow by this much in all (`--pipe-budget`);
    /// `buffer_size` is then each pipe's maximum. Absent in the other modes.
    pub pipe_budget: Option<usize>,
    /// `--mode splice`: a direction copies until one read fills this many
    /// bytes, then splices (`--splice-after`; 0: every byte spliced).
    /// Absent in the other modes.
    pub splice_after: Option<usize>,
}

impl Listening {
    pub fn new(addr: SocketAddr, cfg: &ProxyConfig, capacity: &super::Capacity) -> Listening {
        let splice = cfg.mode == crate::config::proxy::Mode::Splice;
        Listening {
            addr,
            upstream: cfg.upstream,
            mode: cfg.mode.name(),
            buffer_size: cfg.buffer_size,
            threads: cfg.threads,
            nodelay: cfg.nodelay,
            congestion: crate::congestion::Congestion::effective(cfg.congestion),
            congestion_is_system_default: cfg.congestion.is_none(),
            capacity: capacity.clone(),
            capacity_plan: capacity.plan_text(),
            pipe_budget: splice.then_some(cfg.pipe_budget),
            splice_after: splice.then_some(cfg.splice_after),
        }
    }
}

/// Everything the proxy reports, in the order a run meets them. The JSON
/// form is the variant's fields with `"event": "<snake_case name>"`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ProxyEvent {
    /// The first event: the listener is registered and accepting. Boxed:
    /// it is by far the largest event, and sent once.
    Listening(Box<Listening>),
    /// A connection ended, however it ended.
    ConnClosed(ConnReport),
    /// The upstream refused or did not answer; the client was closed.
    UpstreamFailed {
        id: u64,
        client: SocketAddr,
        upstream: SocketAddr,
        error: String,
    },
    /// Over `--max-conns`: accepted and closed at once.
    Rejected {
        client: SocketAddr,
        max_conns: usize,
        /// `max_conns` (the flag) or `fd_limit` (the flag was capped to
        /// what the descriptor limit allows).
        limited_by: &'static str,
    },
    /// Sent once, after `listening`: `--max-conns` asks for more
    /// connections than the descriptor limit allows, so the proxy serves
    /// at most `max_conns`. `message` states the arithmetic.
    MaxConnsCapped {
        max_conns_asked: usize,
        max_conns: usize,
        fd_limit: u64,
        /// Descriptors `max_conns_asked` connections would need.
        fds_needed: u64,
        message: String,
    },
    /// The first time a splice pipe could not grow: the connection goes on
    /// with the pipe at `from` bytes. Sent once per run; the summary counts
    /// every refusal (`pipe_growths_refused`).
    PipeGrowthRefused {
        id: u64,
        /// `client_to_upstream` or `upstream_to_client`.
        direction: &'static str,
        from: usize,
        to: usize,
        refused_by: RefusedBy,
        /// `--pipe-budget`, and how much of it the open pipes' growth held
        /// when this one was refused.
        pipe_budget: usize,
        pipes_grown: usize,
    },
    /// The process is out of descriptors (EMFILE, ENFILE): at `accept`
    /// (the connection waits in the backlog) or at the `upstream` connect
    /// of connection `id` (its client is closed). Either way the accept
    /// loop pauses for 100 ms and the open connections are served on.
    FdLimitReached {
        at: FdLimitAt,
        id: Option<u64>,
        client: Option<SocketAddr>,
        error: String,
        /// Connections open at the time.
        open: usize,
        /// The soft RLIMIT_NOFILE, where the platform tells.
        fd_limit: Option<u64>,
    },
    /// The first time a splice direction found no pipe: all `pipes_max`
    /// pipes were open (0 when the connections take every descriptor), or
    /// the kernel refused one (`error`, e.g. EMFILE). That direction
    /// copies its burst through a 64 KiB buffer instead, and tries for a
    /// pipe again at its next burst; sent once per run, the summary counts
    /// every such direction (`pipes_unavailable`).
    PipeUnavailable {
        id: u64,
        direction: &'static str,
        pipes_max: usize,
        error: Option<String>,
    },
    /// accept(2) failed for another reason; the loop backs off 50 ms.
    AcceptFailed { error: String },
    /// A signal arrived: no new connections, the open ones may finish.
    Draining { open: usize, deadline_seconds: f64 },
    /// The last event: the totals.
    Stopped(Summary),
}

/// Where the process ran out of descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FdLimitAt {
    Accept,
    Upstream,
}

/// Where the proxy sends its events. Called from the accept loop and from
/// every connection's task or thread, so it must be `Send + Sync`.
pub type EventSink = Box<dyn Fn(ProxyEvent) + Send + Sync>;
