//! Shared helpers for the integration tests.
//!
//! Why this exists: the end-to-end tests start real `udp_server` /
//! `udp_client` processes and talk to them over pipes. A test that waits on a
//! child without a deadline can hang CI forever, and a test that forgets to
//! reap a child leaks processes (and keeps network namespaces alive). So:
//!
//! * [`LineReader`] reads a child's stdout/stderr on a background thread and
//!   hands lines over a channel, so every wait has a timeout.
//! * [`ChildGuard`] owns a spawned child and kills + reaps it on `Drop`, also
//!   when the test panics.
//! * [`run_bounded`] runs a command to completion with a deadline, draining
//!   both pipes so the child can never block on a full pipe.
//!
//! Everything here is generic (used by loopback tests as well); the network
//! namespace harness lives in [`netns`], the UDP pair's in [`udp`] and
//! `tcp_proxy`'s in [`proxy`].

// Each test binary includes this module with `mod common;` and uses only a
// part of it.
#![allow(dead_code)]

pub mod forge;
pub mod impair;
pub mod netns;
pub mod proxy;
pub mod stamp_suite;
pub mod udp;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

/// How often the bounded waits poll a child for exit.
const POLL: Duration = Duration::from_millis(10);

/// Reads lines from a pipe on a background thread, so callers can wait for
/// the next line with a timeout instead of blocking forever.
///
/// Every received line is also remembered (see [`LineReader::seen`]) so a
/// failing test can print what the child actually said.
pub struct LineReader {
    rx: Receiver<String>,
    seen: Mutex<Vec<String>>,
    eof: Mutex<bool>,
}

impl LineReader {
    /// Starts a thread that forwards each line of `pipe` (without the
    /// trailing newline). The thread ends at EOF, i.e. when the child exits
    /// or closes the pipe, so it never outlives the child.
    pub fn new(pipe: impl Read + Send + 'static) -> LineReader {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        LineReader {
            rx,
            seen: Mutex::new(Vec::new()),
            eof: Mutex::new(false),
        }
    }

    /// The next line, or `None` if none arrived within `timeout` or the pipe
    /// reached EOF (see [`LineReader::is_eof`] to tell the two apart).
    pub fn next_line(&self, timeout: Duration) -> Option<String> {
        match self.rx.recv_timeout(timeout) {
            Ok(line) => {
                self.seen.lock().unwrap().push(line.clone());
                Some(line)
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                *self.eof.lock().unwrap() = true;
                None
            }
        }
    }

    /// Skips lines until one satisfies `pred`, within an overall `timeout`.
    /// Returns `None` on timeout or EOF; skipped lines stay in
    /// [`LineReader::seen`].
    pub fn wait_for(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&str) -> bool,
    ) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let line = self.next_line(left)?;
            if pred(&line) {
                return Some(line);
            }
        }
    }

    /// Like [`LineReader::wait_for`] for NDJSON output: lines that are not
    /// JSON are skipped; returns the first parsed value satisfying `pred`.
    pub fn wait_for_json(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&serde_json::Value) -> bool,
    ) -> Option<serde_json::Value> {
        let mut found = None;
        self.wait_for(timeout, |line| {
            match serde_json::from_str::<serde_json::Value>(line) {
                Ok(v) if pred(&v) => {
                    found = Some(v);
                    true
                }
                _ => false,
            }
        })?;
        found
    }

    /// The `listening` event that every role writes first with `--json`,
    /// within `timeout`; panics with what `what` said instead.
    pub fn listening(&self, timeout: Duration, what: &str) -> serde_json::Value {
        self.wait_for_json(timeout, |v| v["event"] == "listening")
            .unwrap_or_else(|| panic!("no listening event; {what} said:\n{}", self.transcript()))
    }

    /// Collects the remaining lines until EOF or until `timeout` has passed.
    pub fn drain(&self, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut lines = Vec::new();
        while let Some(line) = self.next_line(deadline.saturating_duration_since(Instant::now())) {
            lines.push(line);
        }
        lines
    }

    /// True once the writer side closed the pipe and all lines were read.
    pub fn is_eof(&self) -> bool {
        *self.eof.lock().unwrap()
    }

    /// All lines received so far, for failure messages.
    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    /// [`LineReader::seen`] joined for printing in a panic message.
    pub fn transcript(&self) -> String {
        self.seen().join("\n")
    }
}

/// Owns a spawned child process and kills + reaps it on `Drop`, so a
/// panicking test never leaves a server running (which would also keep its
/// network namespace alive).
pub struct ChildGuard {
    child: Option<Child>,
    what: String,
}

impl ChildGuard {
    /// Spawns `cmd`; `what` names the process in error messages.
    pub fn spawn(cmd: &mut Command, what: &str) -> ChildGuard {
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("failed to spawn {what} ({cmd:?}): {e}"));
        ChildGuard::new(child, what)
    }

    /// Takes ownership of an already spawned child.
    pub fn new(child: Child, what: &str) -> ChildGuard {
        ChildGuard {
            child: Some(child),
            what: what.to_string(),
        }
    }

    pub fn id(&self) -> u32 {
        self.child().id()
    }

    pub fn child(&self) -> &Child {
        self.child.as_ref().expect("child already reaped")
    }

    pub fn child_mut(&mut self) -> &mut Child {
        self.child.as_mut().expect("child already reaped")
    }

    /// Wraps the child's piped stdout in a [`LineReader`].
    /// Panics if stdout was not `Stdio::piped()` or was already taken.
    pub fn stdout_lines(&mut self) -> LineReader {
        let out = self
            .child_mut()
            .stdout
            .take()
            .expect("child stdout not piped or already taken");
        LineReader::new(out)
    }

    /// Wraps the child's piped stderr in a [`LineReader`].
    pub fn stderr_lines(&mut self) -> LineReader {
        let err = self
            .child_mut()
            .stderr
            .take()
            .expect("child stderr not piped or already taken");
        LineReader::new(err)
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`) to the child.
    pub fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our
        // own not-yet-reaped child, so it cannot have been recycled.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {signal}) for {} failed: {}",
            self.what,
            std::io::Error::last_os_error()
        );
    }

    /// Waits up to `timeout` for the child to exit; `None` if it is still
    /// running. After `Some`, the child is reaped and the guard is inert.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let status = wait_deadline(self.child_mut(), timeout)?;
        self.child = None;
        Some(status)
    }

    /// Graceful stop: SIGTERM, then wait up to `timeout`. Panics (after a
    /// SIGKILL, so nothing leaks) if the child ignores SIGTERM.
    pub fn terminate(mut self, timeout: Duration) -> ExitStatus {
        if let Ok(Some(status)) = self.child_mut().try_wait() {
            self.child = None;
            return status;
        }
        self.signal(libc::SIGTERM);
        match self.wait_timeout(timeout) {
            Some(status) => status,
            None => panic!(
                "{} did not exit within {timeout:?} after SIGTERM (killed it)",
                self.what
            ),
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            // SIGKILL cannot be ignored; the deadline only guards against an
            // uninterruptible kernel sleep.
            let _ = wait_deadline(&mut child, Duration::from_secs(10));
        }
    }
}

/// Polls `child` until it exits or `timeout` passes.
pub fn wait_deadline(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() >= deadline => return None,
            Ok(None) => thread::sleep(POLL),
            Err(e) => panic!("waiting for child {}: {e}", child.id()),
        }
    }
}

/// Runs `cmd` to completion with stdin closed and stdout/stderr captured.
/// Panics if it does not finish within `timeout` (after killing it). Does not
/// check the exit status; see [`run_ok`] for that.
pub fn run_bounded(cmd: &mut Command, timeout: Duration) -> Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = ChildGuard::spawn(cmd, &format!("{cmd:?}"));
    let out = read_all(child.child_mut().stdout.take().unwrap());
    let err = read_all(child.child_mut().stderr.take().unwrap());
    let Some(status) = child.wait_timeout(timeout) else {
        drop(child); // kills and reaps
        panic!("{cmd:?} did not finish within {timeout:?}; killed it");
    };
    // The pipes hit EOF when the child exits, unless it left a grandchild
    // holding them; don't wait for that forever.
    let grace = Duration::from_secs(5);
    Output {
        status,
        stdout: out.recv_timeout(grace).unwrap_or_default(),
        stderr: err.recv_timeout(grace).unwrap_or_default(),
    }
}

/// Like [`run_bounded`] but panics with the captured stderr unless the
/// command exits 0; returns stdout as a string.
pub fn run_ok(cmd: &mut Command, timeout: Duration) -> String {
    let out = run_bounded(cmd, timeout);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstderr: {}\nstdout: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `"-b 1000 -n 1"` as `["-b", "1000", "-n", "1"]`: a command line written
/// as one string, so that a test reads as the command it runs. For
/// arguments without spaces only.
pub fn args(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// NDJSON output, one value per line; panics on a line that is not JSON.
pub fn ndjson(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Asserts that `out` exited with `code` and wrote one line to stderr that
/// contains `says` (how every binary reports bad input and runtime
/// failures); returns that line. `what` names the case in a failure.
pub fn one_line_error(out: &Output, code: i32, says: &str, what: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).trim_end().to_string();
    assert_eq!(out.status.code(), Some(code), "{what}: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: not one line: {err}");
    assert!(err.contains(says), "{what}: should say {says:?}: {err}");
    err
}

/// Polls `done` every `period` until it holds or `timeout` has passed;
/// returns whether it held. The one polling loop of the tests.
pub fn poll_every(period: Duration, timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(period);
    }
}

/// Polls `done` every 10 ms until it holds; panics, naming `what`, once
/// `timeout` has passed.
pub fn wait_until(timeout: Duration, what: &str, done: impl FnMut() -> bool) {
    assert!(
        poll_every(Duration::from_millis(10), timeout, done),
        "timed out after {timeout:?} waiting for {what}"
    );
}

/// A directory for the files a test writes (configuration files, keys),
/// named after the test and this process so that parallel runs do not
/// collide, and removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `contents` to `name` in the directory; returns its path.
    pub fn file(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// Reads a pipe to EOF on a background thread.
fn read_all(mut pipe: impl Read + Send + 'static) -> Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
    rx
}

/// The system's default TCP congestion control, and another algorithm this
/// process may choose (reno is built into every kernel; cubic when reno is
/// the default). Panics with "cannot run" where there is none.
pub fn congestion_other_than_default() -> (String, &'static str) {
    let sysctl = |name: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))
            .unwrap_or_else(|e| panic!("cannot run: /proc/sys/net/ipv4/{name}: {e}"))
    };
    let default = sysctl("tcp_congestion_control").trim().to_string();
    // Without CAP_NET_ADMIN only the allowed list may be chosen.
    // SAFETY: geteuid(2) takes nothing, cannot fail and touches no memory.
    let root = unsafe { libc::geteuid() } == 0;
    let choosable = sysctl(if root {
        "tcp_available_congestion_control"
    } else {
        "tcp_allowed_congestion_control"
    });
    let algo = ["reno", "cubic"]
        .into_iter()
        .find(|a| *a != default && choosable.split_whitespace().any(|x| x == *a))
        .unwrap_or_else(|| panic!("cannot run: no algorithm other than {default} in {choosable}"));
    (default, algo)
}

/// The congestion control of each established TCP socket that `ss`
/// selects with `filter` and whose line contains `owner` (e.g. "pid=42,";
/// `ss -p` names the owning process), one entry per socket, as the kernel
/// reports it through sock_diag: the first of `names` among the words of
/// its `ss -i` line, or "?" for none.
pub fn congestion_of_sockets(filter: &[&str], owner: &str, names: &[&str]) -> Vec<String> {
    let text = run_ok(
        Command::new("ss")
            .args(["-tinpOH", "state", "established"])
            .args(filter),
        Duration::from_secs(30),
    );
    text.lines()
        .filter(|line| line.contains(owner))
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            names
                .iter()
                .find(|a| words.contains(a))
                .map_or("?".to_string(), |a| a.to_string())
        })
        .collect()
}

/// `pid`'s CPU time so far, in clock ticks (utime + stime of
/// /proc/PID/stat: the kernel's own figure).
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    let after = &stat[stat.rfind(')').expect("a command name") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of stat(5), counted from the state (field 3).
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// [`cpu_ticks`] in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    cpu_ticks(pid) as f64 / per_second
}
