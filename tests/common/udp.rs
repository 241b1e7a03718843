//! Helpers for tests that run `udp_server` and `udp_client`: start a server
//! on port 0 and read its events, run a client and parse its JSON, and
//! check that counts are exact at both ends.

use super::impair::{Action, Pick, Relay};
use super::netns::{two_hosts, Netns};
use super::{run_bounded, ChildGuard, LineReader};
use serde_json::Value;
use std::cell::RefCell;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const SERVER: &str = env!("CARGO_BIN_EXE_udp_server");
pub const CLIENT: &str = env!("CARGO_BIN_EXE_udp_client");
pub const WAIT: Duration = Duration::from_secs(20);

/// A running `udp_server --json` and the address it really bound.
pub struct Server {
    pub guard: ChildGuard,
    pub lines: LineReader,
    pub addr: String,
    /// Every event read so far: waiting for one must not lose the others.
    pub events: RefCell<Vec<Value>>,
}

impl Server {
    pub fn start(listen: &str, extra: &[&str]) -> Server {
        Self::start_with(Command::new(SERVER), listen, extra)
    }

    /// A server on a free loopback port, with a 4 MB receive buffer: room
    /// for the bursts a loopback test sends.
    pub fn loopback() -> Server {
        Self::start("127.0.0.1:0", &["--recv-buffer-size", "4M"])
    }

    /// Starts the server inside a network namespace.
    pub fn start_in(ns: &Netns, listen: &str, extra: &[&str]) -> Server {
        Self::start_with(ns.cmd(SERVER), listen, extra)
    }

    fn start_with(mut cmd: Command, listen: &str, extra: &[&str]) -> Server {
        cmd.args(["--listen", listen, "--interval", "0"])
            .args(extra);
        Self::spawn(cmd)
    }

    /// Starts a server with exactly these flags (plus `--json`), e.g. to
    /// choose its `--interval`.
    pub fn start_args(args: &[&str]) -> Server {
        let mut cmd = Command::new(SERVER);
        cmd.args(args);
        Self::spawn(cmd)
    }

    /// Starts a server inside a network namespace with exactly these
    /// flags (plus `--json`).
    pub fn start_args_in(ns: &Netns, args: &[&str]) -> Server {
        let mut cmd = ns.cmd(SERVER);
        cmd.args(args);
        Self::spawn(cmd)
    }

    fn spawn(mut cmd: Command) -> Server {
        cmd.arg("--json")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut guard = ChildGuard::spawn(&mut cmd, "udp_server");
        let lines = guard.stdout_lines();
        let listening = lines.listening(WAIT, "udp_server");
        let addr = listening["addr"].as_str().expect("addr").to_string();
        Server {
            guard,
            lines,
            addr,
            events: RefCell::new(vec![listening]),
        }
    }

    /// The port the server bound.
    pub fn port(&self) -> u16 {
        let port = self.addr.rsplit(':').next().expect("addr has a port");
        port.parse().expect("a port number")
    }

    /// The first event, read so far or arriving within [`WAIT`], that
    /// matches `pred`.
    pub fn find(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(v) = self.events.borrow().iter().find(|v| pred(v)) {
            return v.clone();
        }
        let deadline = Instant::now() + WAIT;
        while let Some(line) = self
            .lines
            .next_line(deadline.saturating_duration_since(Instant::now()))
        {
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                panic!("server wrote a line that is not JSON: {line}")
            };
            self.events.borrow_mut().push(v.clone());
            if pred(&v) {
                return v;
            }
        }
        panic!("no {what}; server said:\n{}", self.lines.transcript())
    }

    /// The `peer_done` event for `session`.
    pub fn done_for(&self, session: &str) -> Value {
        self.find(&format!("peer_done for {session}"), |v| {
            v["event"] == "peer_done" && v["session"] == session
        })
    }

    /// Stops the server (SIGTERM) and returns every event it wrote, from
    /// `listening` to `shutdown`.
    pub fn stop(self) -> Vec<Value> {
        self.guard.signal(libc::SIGTERM);
        for line in self.lines.drain(WAIT) {
            let v = serde_json::from_str::<Value>(&line)
                .unwrap_or_else(|e| panic!("server wrote a line that is not JSON ({e}): {line}"));
            self.events.borrow_mut().push(v);
        }
        let events = self.events.borrow().clone();
        assert!(
            events.last().is_some_and(|v| v["event"] == "shutdown"),
            "the server did not finish with a shutdown event: {events:?}"
        );
        events
    }

    /// A relay in front of this server applying `rules`, for at most a
    /// minute; clients send to its [`Relay::addr`].
    pub fn relay(&self, rules: &[(Pick, Action)]) -> Relay {
        let addr = self.addr.parse().expect("server address");
        Relay::start(addr, rules, Duration::from_secs(60))
    }

    /// Runs `udp_client --json` against this server with `rest` (split at
    /// whitespace, see [`args_to`]); returns its JSON report.
    pub fn client(&self, rest: &str) -> Value {
        client(&args_to(&self.addr, rest))
    }

    pub fn done_for_peer(&self, peer: &str) -> Value {
        self.find(&format!("peer_done for {peer}"), |v| {
            v["event"] == "peer_done" && v["peer"] == peer
        })
    }
}

/// A server host and a client host joined by one veth link on
/// `subnet`.0/24 ([`two_hosts`]), with a `udp_server` on the server host.
/// The server is the first field, so it is stopped before the
/// namespaces it runs in are deleted.
pub struct Hosts {
    pub server: Server,
    /// The server's address as the client host reaches it.
    pub target: String,
    /// The client host's veth end, e.g. for a qdisc.
    pub cli_dev: String,
    pub cli: Netns,
    pub srv: Netns,
}

/// [`Hosts`] on `subnet` (e.g. `"10.61.5"`): the server is `subnet`.1,
/// listening on a free port with `server_args`; the client is
/// `subnet`.2. The namespaces are tagged `{tag}srv` and `{tag}cli`.
pub fn served(tag: &str, subnet: &str, server_args: &[&str]) -> Hosts {
    let (srv, cli, (_, cli_dev)) = two_hosts(tag, subnet);
    let server = Server::start_in(&srv, "0.0.0.0:0", server_args);
    let target = format!("{subnet}.1:{}", server.port());
    Hosts {
        server,
        target,
        cli_dev,
        cli,
        srv,
    }
}

/// `udp_client` arguments for a run against `server`: `-s server`, then
/// `rest` split at whitespace (see [`super::args`]).
pub fn args_to<'a>(server: &'a str, rest: &'a str) -> Vec<&'a str> {
    let mut all = vec!["-s", server];
    all.extend(super::args(rest));
    all
}

/// Runs `udp_client --json` with `args`; returns its JSON report.
pub fn client(args: &[&str]) -> Value {
    client_with(Command::new(CLIENT), args)
}

/// Runs `udp_client --json` inside a network namespace.
pub fn client_in(ns: &Netns, args: &[&str]) -> Value {
    client_with(ns.cmd(CLIENT), args)
}

fn client_with(cmd: Command, args: &[&str]) -> Value {
    client_json(cmd, args, WAIT)
}

/// Runs `cmd ARGS --json` (a udp_client command) within `timeout`, and
/// returns its JSON report; panics unless it exits 0 with one object.
pub fn client_json(mut cmd: Command, args: &[&str], timeout: Duration) -> Value {
    let out = run_bounded(cmd.args(args).arg("--json"), timeout);
    assert!(
        out.status.success(),
        "udp_client {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "client output is not one JSON object ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// What a `udp_client` run that may fail left behind.
pub struct Outcome {
    pub code: Option<i32>,
    /// The JSON report, when it wrote one.
    pub report: Option<Value>,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Runs `udp_client --json` with `args`, whatever its exit code.
pub fn client_outcome(args: &[&str]) -> Outcome {
    client_outcome_with(Command::new(CLIENT), args)
}

/// [`client_outcome`] inside a network namespace.
pub fn client_outcome_in(ns: &Netns, args: &[&str]) -> Outcome {
    client_outcome_with(ns.cmd(CLIENT), args)
}

fn client_outcome_with(mut cmd: Command, args: &[&str]) -> Outcome {
    let started = Instant::now();
    let out = run_bounded(cmd.args(args).arg("--json"), WAIT);
    Outcome {
        code: out.status.code(),
        report: serde_json::from_slice(&out.stdout).ok(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: started.elapsed(),
    }
}

/// `v[key]` as a number; panics, showing `v`, when it is not one.
pub fn f(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing or not a number in {v}"))
}

/// The one stream of `direction` (`client_to_server` or
/// `server_to_client`) in a client report's `streams`.
pub fn stream<'a>(report: &'a Value, direction: &str) -> &'a Value {
    report["streams"]
        .as_array()
        .unwrap_or_else(|| panic!("no streams array: {report}"))
        .iter()
        .find(|s| s["direction"] == direction)
        .unwrap_or_else(|| panic!("no {direction} stream: {report}"))
}

pub fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing or not an integer in {v}"))
}

/// The client's sent counts equal the request, the server's answer and its
/// own peer_done line equal what was sent.
pub fn assert_exact(report: &Value, client: &Value, server_done: &Value) {
    let (sent_p, sent_b) = (u(client, "sent_packets"), u(client, "sent_bytes"));
    let answer = &client["server"];
    assert_eq!(
        u(answer, "received_packets"),
        sent_p,
        "server answer: {report}"
    );
    assert_eq!(
        u(answer, "received_bytes"),
        sent_b,
        "server answer: {report}"
    );
    assert_eq!(u(answer, "lost_packets"), 0);
    assert_eq!(u(answer, "duplicates"), 0);
    assert_eq!(u(server_done, "packets"), sent_p, "{server_done}");
    assert_eq!(u(server_done, "bytes"), sent_b, "{server_done}");
    assert_eq!(u(server_done, "lost"), 0);
    assert_eq!(u(server_done, "sent_packets"), sent_p);
    assert_eq!(server_done["reason"], "end");
}
