//! What the proxy tells its operator: one line per event, as text on stderr
//! or, with `--json`, one NDJSON object per line on stdout. The listening
//! line always goes to stdout first, so a script can read the bound port.

use super::config::ProxyConfig;
use serde_json::json;
use std::io::Write;
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
    /// A socket error (reset, broken pipe, ...).
    Error(String),
}

impl End {
    fn text(&self) -> String {
        match self {
            End::Closed => "closed".into(),
            End::Idle => "idle-timeout".into(),
            End::Cut => "drain-deadline".into(),
            End::Error(e) => format!("error: {e}"),
        }
    }
}

/// One finished connection.
#[derive(Debug, Clone)]
pub struct ConnReport {
    pub id: u64,
    pub client: SocketAddr,
    /// Bytes read from the client and written upstream.
    pub client_to_upstream: u64,
    /// Bytes read from the upstream and written to the client.
    pub upstream_to_client: u64,
    pub seconds: f64,
    pub end: End,
}

/// The totals printed at exit.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub accepted: u64,
    pub rejected: u64,
    pub upstream_failures: u64,
    /// Connections still open at the drain deadline, cut by the exit. Their
    /// bytes are in the totals, as every connection's are.
    pub cut_at_deadline: usize,
    pub client_to_upstream: u64,
    pub upstream_to_client: u64,
}

/// Writes events as text or NDJSON.
#[derive(Debug, Clone, Copy)]
pub struct EventLog {
    pub json: bool,
}

impl EventLog {
    fn out(&self, value: serde_json::Value) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{value}");
        let _ = out.flush();
    }

    fn err(&self, line: String) {
        let _ = writeln!(std::io::stderr().lock(), "tcp_proxy: {line}");
    }

    /// The first line on stdout, in both formats.
    pub fn listening(&self, addr: SocketAddr, cfg: &ProxyConfig) {
        let congestion = crate::congestion::Congestion::effective(cfg.congestion);
        if self.json {
            self.out(json!({
                "event": "listening",
                "addr": addr.to_string(),
                "upstream": cfg.upstream.to_string(),
                "mode": cfg.mode.name(),
                "buffer_size": cfg.buffer_size,
                "threads": cfg.threads,
                "nodelay": cfg.nodelay,
                "congestion": congestion.as_deref(),
                "congestion_is_system_default": cfg.congestion.is_none(),
                "max_conns": cfg.max_conns,
            }));
        } else {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "tcp_proxy listening on {addr}, upstream {}, mode {}, buffer {} B, threads {}, TCP_NODELAY {}, congestion {}",
                cfg.upstream,
                cfg.mode.name(),
                cfg.buffer_size,
                cfg.threads,
                if cfg.nodelay { "on" } else { "OFF" },
                match (&cfg.congestion, &congestion) {
                    (Some(name), _) => name.to_string(),
                    (None, Some(name)) => format!("{name} (system default)"),
                    (None, None) => "system default".to_string(),
                }
            );
            let _ = out.flush();
        }
    }

    pub fn conn_closed(&self, r: &ConnReport) {
        if self.json {
            self.out(json!({
                "event": "conn_closed",
                "id": r.id,
                "client": r.client.to_string(),
                "client_to_upstream": r.client_to_upstream,
                "upstream_to_client": r.upstream_to_client,
                "seconds": r.seconds,
                "end": r.end.text(),
            }));
        } else {
            self.err(format!(
                "conn {} from {} {} after {:.3} s: {} B client->upstream, {} B upstream->client",
                r.id,
                r.client,
                r.end.text(),
                r.seconds,
                r.client_to_upstream,
                r.upstream_to_client
            ));
        }
    }

    pub fn upstream_failed(&self, id: u64, client: SocketAddr, upstream: SocketAddr, why: &str) {
        if self.json {
            self.out(json!({
                "event": "upstream_failed",
                "id": id,
                "client": client.to_string(),
                "upstream": upstream.to_string(),
                "error": why,
            }));
        } else {
            self.err(format!(
                "conn {id} from {client}: cannot reach upstream {upstream}: {why}; closed the client"
            ));
        }
    }

    pub fn rejected(&self, client: SocketAddr, max_conns: usize) {
        if self.json {
            self.out(json!({
                "event": "rejected",
                "client": client.to_string(),
                "max_conns": max_conns,
            }));
        } else {
            self.err(format!(
                "rejected {client}: --max-conns {max_conns} connections are already open"
            ));
        }
    }

    pub fn accept_failed(&self, why: &str) {
        if self.json {
            self.out(json!({"event": "accept_failed", "error": why}));
        } else {
            self.err(format!("accept failed: {why}"));
        }
    }

    pub fn draining(&self, open: usize, deadline_secs: f64) {
        if self.json {
            self.out(json!({"event": "draining", "open": open, "deadline_seconds": deadline_secs}));
        } else {
            self.err(format!(
                "stopping: no new connections; draining {open} open for up to {deadline_secs:.3} s"
            ));
        }
    }

    pub fn stopped(&self, s: &Summary) {
        if self.json {
            self.out(json!({
                "event": "stopped",
                "accepted": s.accepted,
                "rejected": s.rejected,
                "upstream_failures": s.upstream_failures,
                "cut_at_deadline": s.cut_at_deadline,
                "client_to_upstream": s.client_to_upstream,
                "upstream_to_client": s.upstream_to_client,
            }));
        } else {
            self.err(format!(
                "stopped: {} connections accepted, {} rejected, {} upstream failures, {} cut at the drain deadline; {} B client->upstream, {} B upstream->client",
                s.accepted,
                s.rejected,
                s.upstream_failures,
                s.cut_at_deadline,
                s.client_to_upstream,
                s.upstream_to_client
            ));
        }
    }
}
