//! `tcp_proxy bench`: seed 004's latency benchmark, reproduced and extended.
//!
//! One process runs the HTTP test server ([`super::http`]) on an ephemeral
//! loopback port, then, for each case of the matrix, starts a proxy as a
//! child process (this same binary, `--listen 127.0.0.1:0`, its bound
//! address read back from its first NDJSON line), measures `/test1` and
//! `/test2` over one keep-alive connection each, and kills and reaps the
//! proxy before the next case. The matrix: the direct connection, every
//! mode × buffer sizes (where the mode takes one) × threads 1 and N, and
//! the outside peers that are installed (HAProxy, socat, the Go `io.Copy`
//! proxy from bench/peers/).
//!
//! Every wait is bounded: the proxy must print its address within 10 s, a
//! request must answer within `--request-timeout`, a row lasts at most
//! `--duration` or `--requests`. A failed request fails its row loudly
//! (status, length and body are checked) instead of being counted.

use super::http::{Client, TestServer};
use crate::config::proxy::Test;
use crate::config::proxy::{BenchConfig, Mode};
use crate::error::{Error, Result};
use crate::shutdown::Shutdown;
use crate::stats::histogram::{Latencies, LatencySummary};
use crate::units;
use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What a row measured through.
#[derive(Debug, Clone, PartialEq)]
pub enum Case {
    Direct,
    Proxy {
        mode: Mode,
        buffer_size: Option<usize>,
        threads: Option<usize>,
    },
    Go(PathBuf),
    HaProxy(PathBuf),
    Socat(PathBuf),
}

/// A size in a row label: `8K`, `64KiB`, or `1500 B` when no unit
/// divides it (see [`crate::units::size_label`]).
fn size_label(b: usize) -> String {
    let label = crate::units::size_label(b as u64);
    if label.bytes().all(|c| c.is_ascii_digit()) {
        format!("{label} B")
    } else {
        label
    }
}

impl Case {
    /// The row label, shaped like seed 004's.
    pub fn label(&self) -> String {
        match self {
            Case::Direct => "Direct connection".into(),
            Case::Go(_) => "Go io.Copy proxy".into(),
            Case::HaProxy(_) => "HAProxy (mode tcp)".into(),
            Case::Socat(_) => "socat (fork, nodelay)".into(),
            Case::Proxy {
                mode,
                buffer_size,
                threads,
            } => {
                let mut parts = Vec::new();
                if let Some(b) = buffer_size {
                    let what = if *mode == Mode::Splice {
                        "pipe"
                    } else {
                        "buffer"
                    };
                    parts.push(format!("{} {what}", size_label(*b)));
                }
                match threads {
                    Some(1) => parts.push("1 thread".into()),
                    Some(n) => parts.push(format!("{n} threads")),
                    None => parts.push("thread per direction".into()),
                }
                format!("{} ({})", mode.name(), parts.join(", "))
            }
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Case::Direct => "direct",
            Case::Proxy { .. } => "proxy",
            _ => "peer",
        }
    }
}

/// The matrix, in the order it runs.
pub fn cases(cfg: &BenchConfig) -> Vec<Case> {
    let mut out = Vec::new();
    if cfg.peers {
        out.push(Case::Direct);
        if let Some(go) = &cfg.go_proxy {
            out.push(Case::Go(go.clone()));
        }
        if let Some(p) = find_in_path("haproxy") {
            out.push(Case::HaProxy(p));
        }
        if let Some(p) = find_in_path("socat") {
            out.push(Case::Socat(p));
        }
    }
    let mut threads = vec![1];
    if cfg.threads > 1 {
        threads.push(cfg.threads);
    }
    for &mode in &cfg.modes {
        let buffers: Vec<Option<usize>> = if mode.takes_buffer_size() {
            cfg.buffer_sizes.iter().map(|&b| Some(b)).collect()
        } else {
            vec![None]
        };
        let threads: Vec<Option<usize>> = if mode.uses_runtime() {
            threads.iter().map(|&t| Some(t)).collect()
        } else {
            vec![None]
        };
        for &buffer_size in &buffers {
            for &t in &threads {
                out.push(Case::Proxy {
                    mode,
                    buffer_size,
                    threads: t,
                });
            }
        }
    }
    out
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// One row of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub test: Test,
    pub case: String,
    pub kind: &'static str,
    pub mode: Option<&'static str>,
    pub buffer_size: Option<usize>,
    pub threads: Option<usize>,
    pub nodelay: bool,
    #[serde(flatten)]
    pub latency: LatencySummary,
    pub requests_per_second: f64,
    /// p50 minus the direct connection's p50 for the same test.
    pub added_p50_us: Option<f64>,
    pub error: Option<String>,
}

/// Runs the matrix; each row goes to `emit` as soon as it is measured.
pub fn run(cfg: &BenchConfig, shutdown: &Shutdown, emit: &mut dyn FnMut(&Row)) -> Result<Vec<Row>> {
    if let Some(m) = cfg.modes.iter().find(|m| !m.available()) {
        return Err(Error::usage(format!("--modes {}: needs Linux", m.name())));
    }
    let server = TestServer::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .map_err(|e| Error::io("cannot start the HTTP test server", e))?;
    let mut rows: Vec<Row> = Vec::new();
    for case in cases(cfg) {
        if shutdown.is_triggered() {
            break;
        }
        let started = start_case(&case, cfg, server.addr());
        for &test in &cfg.tests {
            if shutdown.is_triggered() {
                break;
            }
            // A row keeps its failure as the message it shows.
            let measured = match &started {
                Ok(target) => measure(target.addr, test, cfg, shutdown).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            let direct_p50 = rows
                .iter()
                .find(|r| r.test == test && r.kind == "direct" && r.error.is_none())
                .map(|r| r.latency.p50_us);
            let (latency, rps, error) = match measured {
                Ok((l, secs)) => {
                    let s = l.summary();
                    (s, units::per_second(s.count as f64, secs), None)
                }
                Err(e) => (LatencySummary::default(), 0.0, Some(e)),
            };
            let (mode, buffer_size, threads) = match &case {
                Case::Proxy {
                    mode,
                    buffer_size,
                    threads,
                } => (Some(mode.name()), *buffer_size, *threads),
                _ => (None, None, None),
            };
            let row = Row {
                test,
                case: case.label(),
                kind: case.kind(),
                mode,
                buffer_size,
                threads,
                nodelay: cfg.nodelay || !matches!(case, Case::Proxy { .. }),
                latency,
                requests_per_second: rps,
                added_p50_us: match (&error, direct_p50, &case) {
                    (None, Some(d), c) if *c != Case::Direct => Some(latency.p50_us - d),
                    _ => None,
                },
                error,
            };
            emit(&row);
            rows.push(row);
        }
        // `started` drops here: the proxy is killed and reaped.
    }
    Ok(rows)
}

/// A proxy under test, killed and reaped on drop.
struct Target {
    addr: SocketAddr,
    child: Option<Child>,
    _tempdir: Option<TempDir>,
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const START_TIMEOUT: Duration = Duration::from_secs(10);

fn start_case(case: &Case, cfg: &BenchConfig, upstream: SocketAddr) -> Result<Target> {
    let up = upstream.to_string();
    match case {
        Case::Direct => Ok(Target {
            addr: upstream,
            child: None,
            _tempdir: None,
        }),
        Case::Proxy {
            mode,
            buffer_size,
            threads,
        } => {
            let mut cmd = Command::new(&cfg.proxy_bin);
            cmd.args([
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                &up,
                "--mode",
                mode.name(),
                "--json",
            ]);
            if let Some(b) = buffer_size {
                cmd.args(["--buffer-size", &b.to_string()]);
            }
            if *mode == Mode::Splice {
                // The seed's matrix measures splice at each pipe size: every
                // byte through the pipe, not the default's copied small
                // bursts (those are what the tokio rows measure).
                cmd.args(["--splice-after", "0"]);
            }
            cmd.args(["--threads", &threads.unwrap_or(1).to_string()]);
            if !cfg.nodelay {
                cmd.arg("--no-nodelay");
            }
            spawn_reading_addr(cmd, "tcp_proxy", |line| {
                let v: serde_json::Value = serde_json::from_str(line).ok()?;
                (v["event"] == "listening").then(|| v["addr"].as_str()?.parse().ok())?
            })
        }
        Case::Go(path) => {
            let mut cmd = Command::new(path);
            cmd.args(["-listen", "127.0.0.1:0", "-upstream", &up]);
            spawn_reading_addr(cmd, "Go proxy", |line| {
                line.strip_prefix("listening on ")?.trim().parse().ok()
            })
        }
        Case::HaProxy(path) => {
            let port = free_port()?;
            let dir = std::env::temp_dir().join(format!(
                "tcp_proxy-bench-haproxy-{}-{port}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).map_err(bare)?;
            let tmp = TempDir(dir.clone());
            let conf = dir.join("haproxy.cfg");
            std::fs::write(&conf, haproxy_config(port, upstream)).map_err(bare)?;
            let mut cmd = Command::new(path);
            cmd.arg("-db").arg("-f").arg(&conf);
            let mut t = spawn_connectable(cmd, "haproxy", port)?;
            t._tempdir = Some(tmp);
            Ok(t)
        }
        Case::Socat(path) => {
            let port = free_port()?;
            let mut cmd = Command::new(path);
            cmd.arg(format!(
                "TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,nodelay"
            ))
            .arg(format!("TCP:{up},nodelay"));
            spawn_connectable(cmd, "socat", port)
        }
    }
}

/// HAProxy in its default TCP mode: no tuning beyond time-outs it requires.
pub fn haproxy_config(port: u16, upstream: SocketAddr) -> String {
    format!(
        "global\n    maxconn 4096\n\ndefaults\n    mode tcp\n    timeout connect 5s\n    timeout client 60s\n    timeout server 60s\n\nlisten bench\n    bind 127.0.0.1:{port}\n    server upstream {upstream}\n"
    )
}

/// A free loopback port, for the peers that cannot report one they picked.
/// Another process could take it before the peer binds; the peer then
/// fails to start and its row says so.
fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(bare)?;
    l.local_addr().map(|a| a.port()).map_err(bare)
}

/// Starts `cmd` and reads its stdout until `parse` finds the bound address;
/// the rest of its stdout is drained on a thread so it never blocks.
fn spawn_reading_addr(
    mut cmd: Command,
    what: &str,
    parse: impl Fn(&str) -> Option<SocketAddr> + Send + 'static,
) -> Result<Target> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::io(format!("cannot start {what}"), e))?;
    let Some(out) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(Error::runtime(format!("{what}: no stdout")));
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if !sent {
                if let Some(a) = parse(&line) {
                    let _ = tx.send(a);
                    sent = true;
                }
            }
        }
    });
    let mut target = Target {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        child: Some(child),
        _tempdir: None,
    };
    match rx.recv_timeout(START_TIMEOUT) {
        Ok(addr) => {
            target.addr = addr;
            Ok(target)
        }
        Err(_) => Err(Error::runtime(format!(
            "{what} did not print its address within {START_TIMEOUT:?}"
        ))),
    }
}

/// Starts `cmd` and waits until 127.0.0.1:`port` accepts a connection.
fn spawn_connectable(mut cmd: Command, what: &str, port: u16) -> Result<Target> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = cmd
        .spawn()
        .map_err(|e| Error::io(format!("cannot start {what}"), e))?;
    let mut target = Target {
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        child: Some(child),
        _tempdir: None,
    };
    let deadline = Instant::now() + START_TIMEOUT;
    while Instant::now() < deadline {
        if let Some(c) = target.child.as_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                target.child = None;
                return Err(Error::runtime(format!("{what} exited at start: {status}")));
            }
        }
        if TcpStream::connect_timeout(&target.addr, Duration::from_millis(200)).is_ok() {
            return Ok(target);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(Error::runtime(format!(
        "{what} did not listen on port {port} within {START_TIMEOUT:?}"
    )))
}

/// A failure whose message is the system's own, as the row shows it.
fn bare(e: std::io::Error) -> Error {
    Error::runtime(e.to_string())
}

/// Warms up, then times requests one after another on one connection for
/// `--duration` or `--requests`, whichever comes first. Returns the
/// histogram and the seconds the measured requests took.
fn measure(
    addr: SocketAddr,
    test: Test,
    cfg: &BenchConfig,
    shutdown: &Shutdown,
) -> Result<(Latencies, f64)> {
    let mut client = Client::connect(addr, cfg.request_timeout)
        .map_err(|e| Error::io(format!("cannot connect to {addr}"), e))?;
    for i in 0..cfg.warmup {
        client
            .request(test)
            .map_err(|e| e.context(format!("warm-up request {}", i + 1)))?;
    }
    let mut lat = Latencies::new();
    let start = Instant::now();
    while lat.count() < cfg.requests && !shutdown.is_triggered() {
        let d = client
            .request(test)
            .map_err(|e| e.context(format!("request {}", lat.count() + 1)))?;
        lat.record(d);
        if start.elapsed() >= cfg.duration {
            break;
        }
    }
    Ok((lat, start.elapsed().as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(args: &[&str]) -> crate::error::Result<BenchConfig> {
        let mut argv = vec!["tcp_proxy bench"];
        argv.extend_from_slice(args);
        BenchConfig::from_args(crate::config::parse_args(argv.into_iter().map(Into::into))?)
    }

    #[test]
    fn matrix_shape() {
        let c = cfg(&["--threads", "4", "--no-peers"]).unwrap();
        let all = cases(&c);
        // tokio and splice: 5 sizes x 2 thread counts; the copy modes: 2
        // thread counts each; std: 5 sizes; std-copy: 1.
        let expect = if crate::sys::HAS_SPLICE {
            10 + 2 + 2 + 5 + 1 + 10
        } else {
            10 + 2 + 2 + 5 + 1
        };
        assert_eq!(all.len(), expect);
        assert!(all
            .iter()
            .any(|c| c.label() == "tokio (8KiB buffer, 4 threads)"));
        assert!(all
            .iter()
            .any(|c| c.label() == "std (1MiB buffer, thread per direction)"));
        assert!(all.iter().any(|c| c.label() == "tokio-copy (1 thread)"));
        let c = cfg(&["--threads", "1", "--modes", "tokio", "--buffer-sizes", "8K"]).unwrap();
        assert_eq!(cases(&c)[0], Case::Direct);
        assert!(cases(&c)
            .iter()
            .any(|c| c.label() == "tokio (8K buffer, 1 thread)"));
    }

    #[test]
    fn labels() {
        assert_eq!(size_label(2048), "2KiB");
        assert_eq!(size_label(8000), "8K");
        assert_eq!(size_label(1 << 20), "1MiB");
        assert_eq!(size_label(1500), "1500 B");
        assert!(haproxy_config(5, "127.0.0.1:9".parse().unwrap()).contains("mode tcp"));
    }
}
