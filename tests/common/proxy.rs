//! Helpers for tests that run `tcp_proxy`: start it on port 0 and read the
//! address it really bound from its `listening` event, wait for its events,
//! watch its fds, and move byte-exact patterns through it.
//!
//! Why one copy: the loopback tests (`proxy_modes`, `proxy_resources`) and
//! the namespace tests (`netns_proxy`) start the proxy the same way; only
//! the command (plain, or inside a namespace) and the flags differ.

use super::{ChildGuard, LineReader};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The binary under test. `NETSPEED_TCP_PROXY` overrides it, e.g. to run the
/// loopback tests against an older build.
pub fn bin() -> String {
    std::env::var("NETSPEED_TCP_PROXY").unwrap_or_else(|_| env!("CARGO_BIN_EXE_tcp_proxy").into())
}

/// Every `--mode` of `tcp_proxy`.
pub const MODES: [&str; 6] = [
    "tokio",
    "tokio-copy",
    "copy-bidirectional",
    "std",
    "std-copy",
    "splice",
];

/// Bound for the `listening` event and for any single event or socket wait.
pub const WAIT: Duration = Duration::from_secs(20);

/// A running `tcp_proxy --json` and the address it really bound. Inside a
/// namespace its pid is still the proxy's: `ip netns exec` execs.
pub struct Proxy {
    pub guard: ChildGuard,
    pub events: LineReader,
    pub addr: SocketAddr,
}

impl Proxy {
    /// `tcp_proxy` on 127.0.0.1:0 forwarding to `upstream` in `mode`.
    pub fn start(upstream: SocketAddr, mode: &str, extra: &[&str]) -> Proxy {
        Proxy::start_with(
            Command::new(bin()),
            "127.0.0.1",
            upstream,
            mode,
            extra,
            WAIT,
        )
    }

    /// Runs `cmd` (the proxy binary, perhaps inside a namespace) listening
    /// on `ip`:0, with `--json --threads 2`, and waits up to `wait` for its
    /// `listening` event, which must name `mode`.
    pub fn start_with(
        mut cmd: Command,
        ip: &str,
        upstream: SocketAddr,
        mode: &str,
        extra: &[&str],
        wait: Duration,
    ) -> Proxy {
        cmd.arg("--listen")
            .arg(format!("{ip}:0"))
            .arg("--upstream")
            .arg(upstream.to_string())
            .args(["--mode", mode, "--json", "--threads", "2"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut guard = ChildGuard::spawn(&mut cmd, &format!("tcp_proxy --mode {mode}"));
        // Every event is read, so that the proxy never blocks on a full pipe.
        let events = guard.stdout_lines();
        let listening = events.listening(wait, "tcp_proxy");
        assert_eq!(listening["mode"], mode, "{listening}");
        let addr = listening["addr"].as_str().unwrap().parse().unwrap();
        Proxy {
            guard,
            events,
            addr,
        }
    }

    /// The first event, already seen or arriving within `timeout`, matching
    /// `pred`.
    pub fn event_within(&self, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Option<Value> {
        for line in self.events.seen() {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if pred(&v) {
                    return Some(v);
                }
            }
        }
        self.events.wait_for_json(timeout, &pred)
    }

    /// Like [`Proxy::event_within`] with [`WAIT`]; panics with the
    /// transcript when the event does not come.
    pub fn event(&self, pred: impl Fn(&Value) -> bool) -> Value {
        self.event_within(WAIT, pred)
            .unwrap_or_else(|| panic!("event not seen:\n{}", self.events.transcript()))
    }

    /// A connection to the proxy, every operation on it bounded by [`WAIT`].
    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect_timeout(&self.addr, WAIT).expect("connect to the proxy");
        timeouts(&s, WAIT);
        s
    }

    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.guard.id()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// Panics, with everything the proxy said, if it has exited.
    pub fn assert_running(&mut self) {
        let status = self.guard.child_mut().try_wait().expect("try_wait");
        assert!(
            status.is_none(),
            "PRODUCT BUG? tcp_proxy exited ({status:?}):\n{}",
            self.events.transcript()
        );
    }
}

/// Bounds every read and write on `s` by `t`.
pub fn timeouts(s: &TcpStream, t: Duration) {
    s.set_read_timeout(Some(t)).unwrap();
    s.set_write_timeout(Some(t)).unwrap();
}

/// Deterministic, incompressible-looking bytes (xorshift64).
pub struct Pattern(pub u64);

impl Pattern {
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            chunk.copy_from_slice(&self.0.to_le_bytes()[..chunk.len()]);
        }
    }
}

pub fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Sends `total` pattern bytes, then shuts down writing; returns their
/// sha256 (hex). Every write is bounded by the socket's write time-out.
pub fn send_pattern(mut s: &TcpStream, seed: u64, total: u64) -> Result<String, String> {
    let mut p = Pattern(seed);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut left = total;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        p.fill(&mut buf[..n]);
        h.update(&buf[..n]);
        s.write_all(&buf[..n])
            .map_err(|e| format!("write after {} B: {e}", total - left))?;
        left -= n as u64;
    }
    s.shutdown(Shutdown::Write)
        .map_err(|e| format!("shutdown(Write): {e}"))?;
    Ok(hex(&h.finalize()))
}

/// Reads to EOF; returns the byte count and sha256 (hex). Every read is
/// bounded by the socket's read time-out.
pub fn receive_all(mut s: &TcpStream) -> Result<(u64, String), String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok((total, hex(&h.finalize()))),
            Ok(n) => {
                h.update(&buf[..n]);
                total += n as u64;
            }
            Err(e) => return Err(format!("read after {total} B: {e}")),
        }
    }
}

/// An upstream on 127.0.0.1:0 that accepts and holds every connection
/// (reading nothing, writing nothing) until told to let them go.
pub struct HoldingUpstream {
    pub addr: SocketAddr,
    pub held: std::sync::Arc<std::sync::Mutex<Vec<TcpStream>>>,
}

impl HoldingUpstream {
    pub fn start() -> HoldingUpstream {
        // A backlog deep enough for the proxy's burst of connects: with
        // std's 128 the kernel drops SYNs, and a dropped SYN is retried
        // only after 1, 3, 7, 15 s.
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        socket
            .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        socket.listen(4096).unwrap();
        let listener: std::net::TcpListener = socket.into();
        let addr = listener.local_addr().unwrap();
        let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let keep = std::sync::Arc::clone(&held);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                keep.lock().unwrap().push(conn);
            }
        });
        HoldingUpstream { addr, held }
    }

    /// Connections accepted and held so far.
    pub fn count(&self) -> usize {
        self.held.lock().unwrap().len()
    }

    /// Lets every held connection go (closes them).
    #[allow(dead_code)]
    pub fn close_all(&self) {
        self.held.lock().unwrap().clear();
    }

    /// Hands over every held connection.
    #[allow(dead_code)]
    pub fn take_all(&self) -> Vec<TcpStream> {
        std::mem::take(&mut *self.held.lock().unwrap())
    }
}
