//! Impairments with known, countable effects, for the fault tests
//! (`tests/netns_faults.rs`, issue 6).
//!
//! * nftables rules inside a namespace ([`nft_apply`]) whose `counter`
//!   statements say exactly how many datagrams were dropped or duplicated
//!   ([`nft_counter`]);
//! * the drop counter of a qdisc ([`tc_drops`]);
//! * any `/proc/net/snmp` table of a namespace ([`read_snmp`]);
//! * code run *inside* a namespace on a thread of the test process
//!   ([`spawn_in`]), for raw-socket and control-message floods;
//! * a deterministic UDP relay that swaps chosen pairs of data datagrams
//!   ([`SwapRelay`]), because this kernel has no netem.
//!
//! Everything is bounded in time, and everything lives in namespaces the
//! test created (or on loopback), so dropping the namespaces cleans it up.

use super::netns::Netns;
use super::run_bounded;
use serde_json::Value;
use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const CMD_TIMEOUT: Duration = Duration::from_secs(30);
static FILE_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Panics loudly unless `program` runs (`program version_arg` exits 0).
/// Tests must fail, never skip, when a tool is missing.
pub fn require_tool(program: &str, version_arg: &str, package: &str) {
    let works = Command::new(program)
        .arg(version_arg)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        works,
        "\n\n*** `{program}` not found or not working: this test needs it; \
         apt-get install {package} (CI's .ci/run installs it) ***\n\n"
    );
}

/// `nft` from the nftables package.
pub fn require_nft() {
    require_tool("nft", "--version", "nftables");
}

/// `tc` from iproute2.
pub fn require_tc() {
    require_tool("tc", "-V", "iproute2");
}

/// Loads an nft script (`nft -f`) inside `ns`. The ruleset lives in the
/// namespace and disappears with it.
pub fn nft_apply(ns: &Netns, script: &str) {
    let path = std::env::temp_dir().join(format!(
        "netspeed-faults-{}-{}.nft",
        std::process::id(),
        FILE_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, script).expect("write nft script");
    let out = run_bounded(ns.cmd("nft").arg("-f").arg(&path), CMD_TIMEOUT);
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "nft -f in {} failed ({}): {}\nscript:\n{script}",
        ns.name(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Sum of the `counter` statements (packets, bytes) of all rules in the
/// nftables table `family table` of `ns`, read from `nft -j list ruleset`.
pub fn nft_counter(ns: &Netns, family: &str, table: &str) -> (u64, u64) {
    let json = ns.run(&["nft", "-j", "list", "ruleset"]);
    let v: Value = serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("bad `nft -j list ruleset` output ({e}): {json}"));
    let mut found = false;
    let (mut packets, mut bytes) = (0, 0);
    for item in v["nftables"].as_array().expect("nftables array") {
        let rule = &item["rule"];
        if rule["family"] != family || rule["table"] != table {
            continue;
        }
        for expr in rule["expr"].as_array().into_iter().flatten() {
            if let Some(c) = expr.get("counter") {
                found = true;
                packets += c["packets"].as_u64().expect("counter packets");
                bytes += c["bytes"].as_u64().expect("counter bytes");
            }
        }
    }
    assert!(found, "no counter in table {family} {table}: {json}");
    (packets, bytes)
}

/// `tc` inside `ns`.
pub fn tc(ns: &Netns, args: &[&str]) -> String {
    let mut full = vec!["tc"];
    full.extend_from_slice(args);
    ns.run(&full)
}

/// The root qdisc's `drops` counter on `dev` (`tc -s -j qdisc show`).
pub fn tc_drops(ns: &Netns, dev: &str) -> u64 {
    let json = tc(ns, &["-s", "-j", "qdisc", "show", "dev", dev]);
    let v: Value = serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("bad `tc -s -j qdisc` output ({e}): {json}"));
    let root = v
        .as_array()
        .and_then(|a| a.iter().find(|q| q["root"] == true))
        .unwrap_or_else(|| panic!("no root qdisc on {dev}: {json}"));
    root["drops"]
        .as_u64()
        .unwrap_or_else(|| panic!("no drops counter on {dev}: {json}"))
}

/// One table (`Ip`, `Udp`, `Icmp`, ...) of `/proc/net/snmp` in `ns`.
pub fn read_snmp(ns: &Netns, table: &str) -> HashMap<String, u64> {
    let snmp = ns.run(&["cat", "/proc/net/snmp"]);
    let prefix = format!("{table}:");
    let mut rows = snmp.lines().filter_map(|l| l.strip_prefix(prefix.as_str()));
    let (Some(names), Some(values)) = (rows.next(), rows.next()) else {
        panic!(
            "no {table}: lines in /proc/net/snmp of {}:\n{snmp}",
            ns.name()
        );
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .map(|(k, v)| (k.to_string(), v.parse().unwrap_or(0)))
        .collect()
}

/// Growth of each counter from `before` to `after`.
pub fn delta(before: &HashMap<String, u64>, after: &HashMap<String, u64>, key: &str) -> u64 {
    let (b, a) = (before[key], after[key]);
    assert!(a >= b, "{key} went backwards: {b} -> {a}");
    a - b
}

/// Runs `f` on a new thread that first moved into `ns`'s network namespace
/// (setns(2) changes only the calling thread). Sockets it creates belong to
/// that namespace; the test process itself stays in the root namespace.
pub fn spawn_in<T: Send + 'static>(
    ns: &Netns,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let path = format!("/run/netns/{}", ns.name());
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    std::thread::spawn(move || {
        // SAFETY: setns(2) on a valid namespace fd; it affects this thread
        // only, which is dedicated to `f` and ends with it.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns({path}): {}", std::io::Error::last_os_error());
        drop(file);
        f()
    })
}

/// VmRSS of a process, in KiB.
pub fn vm_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

/// What the relay did.
#[derive(Debug, Default, Clone)]
pub struct RelayStats {
    /// Data datagrams forwarded client → server.
    pub data: u64,
    /// Pairs of adjacent data datagrams sent in swapped order.
    pub swaps: u64,
    /// Other datagrams client → server (End messages).
    pub control: u64,
    /// Datagrams server → client (EndAck answers).
    pub answers: u64,
}

/// A UDP forwarder on loopback that swaps chosen pairs of *data* datagrams:
/// the data datagram with index i (counting from 0 in arrival order) where
/// `(i + 1) % every == 0` is held back and sent right after the next data
/// datagram. Each swap makes exactly one datagram arrive after one with a
/// higher sequence number. A held datagram is flushed (unswapped) before any
/// non-data datagram, so the End always comes after all data.
///
/// Everything else is forwarded as it is, both ways: the client talks to
/// [`SwapRelay::addr`], the relay talks to the server from its own socket
/// and sends the answers back to the client's last address. The thread ends
/// when the relay is stopped or after `max_life`, whichever comes first.
pub struct SwapRelay {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<RelayStats>>,
}

fn is_data(d: &[u8]) -> bool {
    d.len() >= 32 && &d[..4] == b"NSPD" && d[4] == 1 && d[5] == 0
}

fn big_buffers(s: &UdpSocket) {
    let s = socket2::SockRef::from(s);
    let _ = s.set_recv_buffer_size(4 << 20);
    let _ = s.set_send_buffer_size(4 << 20);
}

impl SwapRelay {
    pub fn start(server: SocketAddr, every: u64, max_life: Duration) -> SwapRelay {
        assert!(every >= 2);
        let front = UdpSocket::bind("127.0.0.1:0").expect("bind relay front");
        let back = UdpSocket::bind("127.0.0.1:0").expect("bind relay back");
        back.connect(server).expect("connect relay back");
        big_buffers(&front);
        big_buffers(&back);
        front.set_nonblocking(true).unwrap();
        back.set_nonblocking(true).unwrap();
        let addr = front.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let handle = std::thread::spawn(move || {
            let deadline = Instant::now() + max_life;
            let mut st = RelayStats::default();
            let mut client: Option<SocketAddr> = None;
            let mut held: Option<Vec<u8>> = None;
            let mut buf = vec![0u8; 65536];
            let send = |d: &[u8]| {
                // The server side is loopback with a 4 MiB buffer at a paced
                // rate; a failed send is a test-harness failure.
                back.send(d).expect("relay send to server");
            };
            while !stop2.load(Ordering::Relaxed) && Instant::now() < deadline {
                let mut fds = [
                    libc::pollfd {
                        fd: front.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: back.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                // SAFETY: fds is a valid array of 2 pollfd for the call.
                unsafe { libc::poll(fds.as_mut_ptr(), 2, 20) };
                // Bounded inner loops: at most 4096 datagrams per wake-up.
                for _ in 0..4096 {
                    let Ok((n, from)) = front.recv_from(&mut buf) else {
                        break;
                    };
                    client = Some(from);
                    let d = &buf[..n];
                    if is_data(d) {
                        let i = st.data;
                        st.data += 1;
                        if let Some(h) = held.take() {
                            send(d);
                            send(&h);
                            st.swaps += 1;
                        } else if (i + 1) % every == 0 {
                            held = Some(d.to_vec());
                        } else {
                            send(d);
                        }
                    } else {
                        if let Some(h) = held.take() {
                            send(&h);
                        }
                        st.control += 1;
                        send(d);
                    }
                }
                for _ in 0..4096 {
                    let Ok(n) = back.recv(&mut buf) else { break };
                    if let Some(c) = client {
                        let _ = front.send_to(&buf[..n], c);
                        st.answers += 1;
                    }
                }
            }
            if let Some(h) = held.take() {
                send(&h);
            }
            st
        });
        SwapRelay {
            addr,
            stop,
            handle: Some(handle),
        }
    }

    /// Stops the relay and returns what it did.
    pub fn finish(mut self) -> RelayStats {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .unwrap()
            .join()
            .expect("relay thread panicked")
    }
}

impl Drop for SwapRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Runs `cmd` with a deadline and returns (exit code, stdout, stderr).
pub fn run_capture(cmd: &mut Command, timeout: Duration) -> (Option<i32>, String, String) {
    let out = run_bounded(cmd, timeout);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `sysctl -w` inside `ns`.
pub fn sysctl(ns: &Netns, settings: &[&str]) {
    let mut args = vec!["sysctl", "-q", "-w"];
    args.extend_from_slice(settings);
    ns.run(&args);
}
