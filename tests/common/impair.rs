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
//!   ([`SwapRelay`]), because this kernel has no netem;
//! * a scripted UDP relay on loopback ([`Relay`]) that drops, delays or
//!   repeats chosen datagrams (the nth of a direction and kind) and counts
//!   what it did, so end-to-end tests take their expected figures from it.
//!
//! Everything is bounded in time, and everything lives in namespaces the
//! test created (or on loopback), so dropping the namespaces cleans it up.

use super::netns::Netns;
use super::run_bounded;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
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

/// A tbf root qdisc on `dev` in `ns` (`rate`, `burst`, `limit` in tc's
/// units), on a host with IPv6 off: router and neighbour solicitations
/// must not land in (or be dropped by) the tiny qdisc and skew its drop
/// counter, which tests compare with ENOBUFS back-offs.
pub fn tbf_alone(ns: &Netns, dev: &str, rate: &str, burst: &str, limit: &str) {
    sysctl(
        ns,
        &[
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
        ],
    );
    tc(
        ns,
        &[
            "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", burst, "limit", limit,
        ],
    );
}

/// The root qdisc on `dev` with its counters (`tc -s -j qdisc show`).
pub fn root_qdisc(ns: &Netns, dev: &str) -> Value {
    let json = tc(ns, &["-s", "-j", "qdisc", "show", "dev", dev]);
    let v: Value = serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("bad `tc -s -j qdisc` output ({e}): {json}"));
    v.as_array()
        .and_then(|a| a.iter().find(|q| q["root"] == true))
        .cloned()
        .unwrap_or_else(|| panic!("no root qdisc on {dev}: {json}"))
}

/// The root qdisc's `drops` counter on `dev`.
pub fn tc_drops(ns: &Netns, dev: &str) -> u64 {
    let root = root_qdisc(ns, dev);
    root["drops"]
        .as_u64()
        .unwrap_or_else(|| panic!("no drops counter on {dev}: {root}"))
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
    d.len() >= 32 && kind_of(d) == kind::DATA
}

fn big_buffers(s: &UdpSocket) {
    let s = socket2::SockRef::from(s);
    let _ = s.set_recv_buffer_size(4 << 20);
    let _ = s.set_send_buffer_size(4 << 20);
}

/// A relay's two non-blocking loopback sockets with big buffers: the front
/// that clients send to (and its address), and the back, connected to
/// `server`.
fn relay_sockets(server: SocketAddr) -> (UdpSocket, UdpSocket, SocketAddr) {
    let front = UdpSocket::bind("127.0.0.1:0").expect("bind relay front");
    let back = UdpSocket::bind("127.0.0.1:0").expect("bind relay back");
    back.connect(server).expect("connect relay back");
    big_buffers(&front);
    big_buffers(&back);
    front.set_nonblocking(true).unwrap();
    back.set_nonblocking(true).unwrap();
    let addr = front.local_addr().unwrap();
    (front, back, addr)
}

impl SwapRelay {
    pub fn start(server: SocketAddr, every: u64, max_life: Duration) -> SwapRelay {
        assert!(every >= 2);
        let (front, back, addr) = relay_sockets(server);
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
                        // A held datagram goes out before an End (the
                        // data's last word); a round-trip probe, which
                        // travels beside the data, does not release it.
                        if kind_of(d) != kind::PROBE {
                            if let Some(h) = held.take() {
                                send(&h);
                            }
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

// ---------------------------------------------------------------------------
// Relay: a scripted UDP relay whose counts are the expected figures.

/// Message kinds (byte 5 of a datagram that starts with `NSPD`), as the
/// `kind` of a [`Pick`] or of a count.
pub mod kind {
    /// Client → server, many.
    pub const DATA: Option<u8> = Some(0);
    /// Client → server, the end-of-test message.
    pub const END: Option<u8> = Some(1);
    /// Server → client, the answer to an End.
    pub const END_ACK: Option<u8> = Some(2);
    /// Client → server, the start probe.
    pub const HELLO: Option<u8> = Some(3);
    /// Server → client, the answer to a Hello.
    pub const HELLO_ACK: Option<u8> = Some(4);
    /// Client → server, a round-trip probe (it travels beside the data).
    pub const PROBE: Option<u8> = Some(8);
    /// Datagrams without the magic, or shorter than 6 bytes.
    pub const OTHER: Option<u8> = None;
}

/// The kind of a datagram: byte 5 if it starts with the magic, `None`
/// otherwise. The version byte (4) is deliberately not looked at.
pub fn kind_of(d: &[u8]) -> Option<u8> {
    if d.len() >= 6 && d[..4] == *b"NSPD" {
        Some(d[5])
    } else {
        None
    }
}

/// The sequence number (bytes 16..24, big-endian) of a Data datagram.
pub fn data_seq(d: &[u8]) -> Option<u64> {
    if kind_of(d) == kind::DATA && d.len() >= 24 {
        Some(u64::from_be_bytes(d[16..24].try_into().unwrap()))
    } else {
        None
    }
}

/// Which way a datagram travels through a [`Relay`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dir {
    /// From the client (to the relay's front socket) to the server.
    ToServer,
    /// From the server (to the relay's back socket) to the client.
    ToClient,
}

/// Which datagram a rule applies to: the `nth` (counting from 0, in arrival
/// order at the relay) datagram travelling in `dir` whose kind is `kind`
/// (see [`kind`]; `None` = datagrams without the magic).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pick {
    pub dir: Dir,
    pub kind: Option<u8>,
    pub nth: u64,
}

impl Pick {
    /// The `nth` client → server datagram of `kind`.
    pub fn to_server(kind: Option<u8>, nth: u64) -> Pick {
        Pick {
            dir: Dir::ToServer,
            kind,
            nth,
        }
    }

    /// The `nth` server → client datagram of `kind`.
    pub fn to_client(kind: Option<u8>, nth: u64) -> Pick {
        Pick {
            dir: Dir::ToClient,
            kind,
            nth,
        }
    }
}

/// What a [`Relay`] does with the datagram a [`Pick`] matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Never forward it.
    Drop,
    /// Forward it this much later (counted from its arrival at the relay);
    /// datagrams behind it are not held up.
    Delay(Duration),
    /// Forward it now, and forward an identical second copy right after the
    /// K-th later datagram of the same dir and kind has been forwarded (or
    /// when the relay stops, if fewer come). "Later" means arrived later;
    /// a later datagram that is dropped does not count, a delayed one counts
    /// when it is released. K = 0 sends the copy right after the original.
    RepeatAfter(u64),
}

/// What a [`Relay`] did with one class (direction and kind) of datagrams.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassCounts {
    /// Datagrams that arrived at the relay (injected ones are not counted).
    pub seen: u64,
    /// Copies sent on, repeats included.
    pub forwarded: u64,
    /// Datagrams never forwarded, by a [`Action::Drop`] rule.
    pub dropped: u64,
    /// Datagrams held back by a [`Action::Delay`] rule (counted when held;
    /// they count as forwarded when released).
    pub delayed: u64,
    /// Extra copies sent by a [`Action::RepeatAfter`] rule.
    pub repeated: u64,
    /// Sends toward the client that failed (no client seen yet, or the
    /// client's socket is gone). Sends toward the server never fail: the
    /// relay panics instead.
    pub failed: u64,
}

/// The counters of [`ClassCounts`], listed once: their sum (for
/// [`RelayCounts::total`]) and one [`RelayCounts`] accessor per counter,
/// e.g. `counts.dropped(dir, kind)`, are generated from the list.
macro_rules! class_counters {
    ($($counter:ident),*) => {
        impl std::ops::AddAssign for ClassCounts {
            fn add_assign(&mut self, other: ClassCounts) {
                $(self.$counter += other.$counter;)*
            }
        }

        impl RelayCounts {
            $(
                #[doc = concat!("`", stringify!($counter), "` of one class.")]
                pub fn $counter(&self, dir: Dir, kind: Option<u8>) -> u64 {
                    self.class(dir, kind).$counter
                }
            )*
        }
    };
}

class_counters!(seen, forwarded, dropped, delayed, repeated, failed);

/// How many non-Data datagrams per direction a [`Relay`] keeps.
pub const CAPTURE_MAX: usize = 64;

/// Everything a [`Relay`] counted; see [`Relay::stats`] and
/// [`Relay::finish`]. Once the relay has finished, every class toward the
/// server has `forwarded == seen - dropped + repeated` (sends there never
/// fail: the relay panics instead); toward the client the same holds
/// whenever `failed` is 0.
#[derive(Clone, Debug, Default)]
pub struct RelayCounts {
    classes: BTreeMap<(Dir, Option<u8>), ClassCounts>,
    dropped_seqs: Vec<u64>,
    delayed_seqs: Vec<u64>,
    repeated_seqs: Vec<u64>,
    /// Per direction (see [`dir_index`]): the first non-Data datagrams
    /// and when each arrived.
    captured: [Vec<Vec<u8>>; 2],
    captured_at: [Vec<Instant>; 2],
    injected_to_server: u64,
    injected_to_client: u64,
}

impl RelayCounts {
    /// The counts of one class (all zero if none of it came).
    pub fn class(&self, dir: Dir, kind: Option<u8>) -> ClassCounts {
        self.classes.get(&(dir, kind)).copied().unwrap_or_default()
    }

    /// Every class that had traffic, in a fixed order.
    pub fn classes(&self) -> impl Iterator<Item = (Dir, Option<u8>, ClassCounts)> + '_ {
        self.classes.iter().map(|(&(d, k), &c)| (d, k, c))
    }

    /// The sum over all kinds of one direction.
    pub fn total(&self, dir: Dir) -> ClassCounts {
        let mut t = ClassCounts::default();
        for (_, _, c) in self.classes().filter(|(d, _, _)| *d == dir) {
            t += c;
        }
        t
    }

    /// Sequence numbers of the client → server Data datagrams dropped, in
    /// arrival order.
    pub fn dropped_seqs(&self) -> &[u64] {
        &self.dropped_seqs
    }

    /// Sequence numbers of the client → server Data datagrams delayed, in
    /// arrival order.
    pub fn delayed_seqs(&self) -> &[u64] {
        &self.delayed_seqs
    }

    /// Sequence numbers of the client → server Data datagrams whose extra
    /// copy was sent, in the order the copies were sent.
    pub fn repeated_seqs(&self) -> &[u64] {
        &self.repeated_seqs
    }

    /// The first [`CAPTURE_MAX`] non-Data datagrams (any kind but Data,
    /// untagged ones too) that arrived travelling in `dir`, whatever the
    /// relay then did with them, in arrival order.
    pub fn captured(&self, dir: Dir) -> &[Vec<u8>] {
        &self.captured[dir_index(dir)]
    }

    /// When each of [`RelayCounts::captured`] arrived at the relay (same
    /// indices).
    pub fn captured_at(&self, dir: Dir) -> &[Instant] {
        &self.captured_at[dir_index(dir)]
    }

    /// The captured datagrams of one kind, in arrival order.
    pub fn captured_kind(&self, dir: Dir, kind: Option<u8>) -> Vec<&[u8]> {
        self.captured(dir)
            .iter()
            .filter(|b| kind_of(b) == kind)
            .map(|b| b.as_slice())
            .collect()
    }

    /// The first Hello of the load's session: the one that names its run
    /// (bytes 40..48). The round-trip prober says Hello too, from a socket
    /// and session of its own, naming none.
    pub fn load_hello(&self) -> Option<&[u8]> {
        self.captured_kind(Dir::ToServer, kind::HELLO)
            .into_iter()
            .find(|h| h.len() >= 48 && h[40..48] != [0; 8])
    }

    /// Datagrams sent with [`Relay::inject_to_server`] /
    /// [`Relay::inject_to_client`].
    pub fn injected(&self, dir: Dir) -> u64 {
        match dir {
            Dir::ToServer => self.injected_to_server,
            Dir::ToClient => self.injected_to_client,
        }
    }

    fn class_mut(&mut self, dir: Dir, kind: Option<u8>) -> &mut ClassCounts {
        self.classes.entry((dir, kind)).or_default()
    }
}

fn dir_index(dir: Dir) -> usize {
    match dir {
        Dir::ToServer => 0,
        Dir::ToClient => 1,
    }
}

/// What the relay thread and the test thread share.
#[derive(Default)]
struct Shared {
    counts: RelayCounts,
    /// The client's last-seen address.
    client: Option<SocketAddr>,
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panicking relay thread poisons the lock; its counts are still what
    // they were, and the panic itself is reported by `finish`.
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sends with `f`, retrying for up to a second while the socket buffer is
/// full (never seen on loopback, but a retry is cheaper than a flaky test).
fn send_retrying(f: impl Fn() -> io::Result<usize>) -> io::Result<usize> {
    let give_up = Instant::now() + Duration::from_secs(1);
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < give_up => {
                std::thread::sleep(Duration::from_millis(1));
            }
            r => return r,
        }
    }
}

fn send_to_server(back: &UdpSocket, server: SocketAddr, bytes: &[u8]) {
    if let Err(e) = send_retrying(|| back.send(bytes)) {
        panic!(
            "relay: sending {} bytes to the server {server} failed: {e} \
             (the server is gone or not listening: a harness failure, not a netspeed result)",
            bytes.len()
        );
    }
}

/// A datagram held back by a Delay rule.
struct Held {
    due: Instant,
    order: u64,
    dir: Dir,
    kind: Option<u8>,
    index: u64,
    bytes: Vec<u8>,
}

/// A copy still to be sent by a RepeatAfter rule.
struct Repeat {
    dir: Dir,
    kind: Option<u8>,
    /// Index of the original in its class.
    index: u64,
    /// Later datagrams of the class still to be forwarded before the copy.
    left: u64,
    bytes: Vec<u8>,
}

/// The state of the relay thread.
struct Worker {
    front: Arc<UdpSocket>,
    back: Arc<UdpSocket>,
    server: SocketAddr,
    rules: HashMap<Pick, Action>,
    held: Vec<Held>,
    repeats: Vec<Repeat>,
    order: u64,
}

impl Worker {
    fn run(mut self, shared: &Mutex<Shared>, stop: &AtomicBool, max_life: Duration) {
        let deadline = Instant::now() + max_life;
        let mut buf = vec![0u8; 65536];
        loop {
            let now = Instant::now();
            if stop.load(Ordering::Relaxed) || now >= deadline {
                break;
            }
            let mut wait = Duration::from_millis(20).min(deadline - now);
            if let Some(due) = self.held.iter().map(|h| h.due).min() {
                wait = wait.min(due.saturating_duration_since(now));
            }
            // Round up, so a release due in 0.3 ms does not spin.
            let ms = i32::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(20);
            let mut fds = [
                libc::pollfd {
                    fd: self.front.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.back.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: fds is a valid array of 2 pollfd for the call.
            unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
            let mut sh = lock(shared);
            self.release(&mut sh, Some(Instant::now()));
            self.pump(&mut sh, &mut buf);
        }
        // Whatever is queued already was sent before the stop: pass it on,
        // then everything held back, then the copies still owed.
        let mut sh = lock(shared);
        self.pump(&mut sh, &mut buf);
        self.release(&mut sh, None);
        for r in std::mem::take(&mut self.repeats) {
            self.send_copy(&mut sh, r.dir, r.kind, &r.bytes);
        }
    }

    /// Reads both sockets, at most 4096 datagrams each.
    fn pump(&mut self, sh: &mut Shared, buf: &mut [u8]) {
        for _ in 0..4096 {
            let Ok((n, from)) = self.front.recv_from(buf) else {
                break;
            };
            sh.client = Some(from);
            self.arrive(sh, Dir::ToServer, &buf[..n]);
        }
        for _ in 0..4096 {
            // An error here is "would block", or the ICMP error of an earlier
            // send; either way there is nothing to read now.
            let Ok(n) = self.back.recv(buf) else { break };
            self.arrive(sh, Dir::ToClient, &buf[..n]);
        }
    }

    fn arrive(&mut self, sh: &mut Shared, dir: Dir, bytes: &[u8]) {
        let now = Instant::now();
        let kind = kind_of(bytes);
        let seq = match dir {
            Dir::ToServer => data_seq(bytes),
            Dir::ToClient => None,
        };
        let c = sh.counts.class_mut(dir, kind);
        let index = c.seen;
        c.seen += 1;
        let i = dir_index(dir);
        if kind != kind::DATA && sh.counts.captured[i].len() < CAPTURE_MAX {
            sh.counts.captured[i].push(bytes.to_vec());
            sh.counts.captured_at[i].push(now);
        }
        let pick = Pick {
            dir,
            kind,
            nth: index,
        };
        match self.rules.get(&pick).copied() {
            None => self.forward(sh, dir, kind, index, bytes),
            Some(Action::Drop) => {
                sh.counts.class_mut(dir, kind).dropped += 1;
                sh.counts.dropped_seqs.extend(seq);
            }
            Some(Action::Delay(d)) => {
                sh.counts.class_mut(dir, kind).delayed += 1;
                sh.counts.delayed_seqs.extend(seq);
                self.order += 1;
                self.held.push(Held {
                    due: now + d,
                    order: self.order,
                    dir,
                    kind,
                    index,
                    bytes: bytes.to_vec(),
                });
            }
            Some(Action::RepeatAfter(k)) => {
                self.forward(sh, dir, kind, index, bytes);
                if k == 0 {
                    self.send_copy(sh, dir, kind, bytes);
                } else {
                    self.repeats.push(Repeat {
                        dir,
                        kind,
                        index,
                        left: k,
                        bytes: bytes.to_vec(),
                    });
                }
            }
        }
    }

    /// Forwards the held datagrams due by `now` (all of them for `None`),
    /// earliest due first.
    fn release(&mut self, sh: &mut Shared, now: Option<Instant>) {
        loop {
            let next = self
                .held
                .iter()
                .enumerate()
                .filter(|(_, h)| now.is_none_or(|now| h.due <= now))
                .min_by_key(|(_, h)| (h.due, h.order))
                .map(|(i, _)| i);
            let Some(i) = next else { break };
            let h = self.held.swap_remove(i);
            self.forward(sh, h.dir, h.kind, h.index, &h.bytes);
        }
    }

    /// Sends an original datagram on, then any copy owed right after it.
    fn forward(&mut self, sh: &mut Shared, dir: Dir, kind: Option<u8>, index: u64, bytes: &[u8]) {
        let ok = self.emit(sh, dir, bytes);
        let c = sh.counts.class_mut(dir, kind);
        if ok {
            c.forwarded += 1;
        } else {
            c.failed += 1;
        }
        let mut i = 0;
        while i < self.repeats.len() {
            let r = &mut self.repeats[i];
            if r.dir == dir && r.kind == kind && index > r.index {
                r.left -= 1;
                if r.left == 0 {
                    let r = self.repeats.remove(i);
                    self.send_copy(sh, r.dir, r.kind, &r.bytes);
                    continue;
                }
            }
            i += 1;
        }
    }

    fn send_copy(&mut self, sh: &mut Shared, dir: Dir, kind: Option<u8>, bytes: &[u8]) {
        let ok = self.emit(sh, dir, bytes);
        let c = sh.counts.class_mut(dir, kind);
        if ok {
            c.forwarded += 1;
            c.repeated += 1;
            if dir == Dir::ToServer {
                sh.counts.repeated_seqs.extend(data_seq(bytes));
            }
        } else {
            c.failed += 1;
        }
    }

    /// Sends toward the server (panics on failure) or the client (false on
    /// failure).
    fn emit(&self, sh: &Shared, dir: Dir, bytes: &[u8]) -> bool {
        match dir {
            Dir::ToServer => {
                send_to_server(&self.back, self.server, bytes);
                true
            }
            Dir::ToClient => sh
                .client
                .is_some_and(|client| send_retrying(|| self.front.send_to(bytes, client)).is_ok()),
        }
    }
}

/// A loopback UDP relay with a script of impairments, for end-to-end tests
/// of the real binaries where every expected figure comes from the relay's
/// own counts ([`RelayCounts`]).
///
/// The client talks to [`Relay::addr`] (the front socket); the relay talks
/// to the server from its back socket ([`Relay::back_addr`]) and sends the
/// answers to the client's last-seen address. Each rule `(Pick, Action)`
/// applies to exactly one datagram, the `nth` of its direction and kind;
/// every other datagram is forwarded at once, so the order of everything
/// not impaired is kept. Datagrams are classified by the magic and the kind
/// byte only, never the version byte.
///
/// One background thread polls both sockets (at most 4096 datagrams per
/// wake-up and direction); it ends on [`Relay::finish`], on drop, or after
/// `max_life`, and then first passes on what is queued and everything still
/// held back or owed, so nothing is lost silently.
pub struct Relay {
    /// Where the client sends (the front socket).
    pub addr: SocketAddr,
    server: SocketAddr,
    front: Arc<UdpSocket>,
    back: Arc<UdpSocket>,
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Relay {
    /// Starts a relay to `server` (an IPv4 loopback address). Panics if two
    /// rules pick the same datagram.
    pub fn start(server: SocketAddr, rules: &[(Pick, Action)], max_life: Duration) -> Relay {
        let mut map = HashMap::new();
        for &(pick, action) in rules {
            if let Some(old) = map.insert(pick, action) {
                panic!("relay: two rules for {pick:?}: {old:?} and {action:?}");
            }
        }
        let (front, back, addr) = relay_sockets(server);
        let front = Arc::new(front);
        let back = Arc::new(back);
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            front: front.clone(),
            back: back.clone(),
            server,
            rules: map,
            held: Vec::new(),
            repeats: Vec::new(),
            order: 0,
        };
        let (shared2, stop2) = (shared.clone(), stop.clone());
        let handle = std::thread::Builder::new()
            .name("relay".into())
            .spawn(move || worker.run(&shared2, &stop2, max_life))
            .expect("spawn relay thread");
        Relay {
            addr,
            server,
            front,
            back,
            shared,
            stop,
            handle: Some(handle),
        }
    }

    /// Where the client sends (same as the `addr` field).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The source address the server sees for the relayed client.
    pub fn back_addr(&self) -> SocketAddr {
        self.back.local_addr().unwrap()
    }

    /// The client's last-seen address, once it sent something.
    pub fn client(&self) -> Option<SocketAddr> {
        lock(&self.shared).client
    }

    /// Sends raw bytes to the server from the back socket (the source
    /// address the server sees for the relayed client): a forged datagram
    /// "from the client". Not counted as seen or forwarded, only as
    /// injected. Panics if the send fails.
    pub fn inject_to_server(&self, bytes: &[u8]) {
        send_to_server(&self.back, self.server, bytes);
        lock(&self.shared).counts.injected_to_server += 1;
    }

    /// Sends raw bytes to the client's last-seen address from the front
    /// socket, as if from the server. Counted only as injected. Panics if
    /// no client was seen yet or the send fails.
    pub fn inject_to_client(&self, bytes: &[u8]) {
        let client = self
            .client()
            .expect("relay: inject_to_client before the client sent anything");
        if let Err(e) = send_retrying(|| self.front.send_to(bytes, client)) {
            panic!(
                "relay: injecting {} bytes to the client {client} failed: {e}",
                bytes.len()
            );
        }
        lock(&self.shared).counts.injected_to_client += 1;
    }

    /// A snapshot of the counts so far; the relay keeps running.
    pub fn stats(&self) -> RelayCounts {
        lock(&self.shared).counts.clone()
    }

    /// Stops the relay (after passing on what is queued, held back or owed
    /// as a copy) and returns the final counts. Re-raises a panic of the
    /// relay thread (a failed send to the server).
    pub fn finish(mut self) -> RelayCounts {
        self.stop.store(true, Ordering::Relaxed);
        if let Err(panic) = self.handle.take().unwrap().join() {
            std::panic::resume_unwind(panic);
        }
        self.stats()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
