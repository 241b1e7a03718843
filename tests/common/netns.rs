//! Network-namespace harness for multi-host tests on one machine.
//!
//! Why: loopback hides everything that makes a speed test interesting (a real
//! NIC, ARP, distinct source addresses, per-host kernel counters). Linux
//! network namespaces give each "host" its own interfaces, routing table,
//! sockets and `/proc/net/snmp`, and a veth pair (or a bridge) is the cable
//! between them. Only addresses inside namespaces created here are traffic
//! targets, so the tests never touch a real network.
//!
//! Rules the harness enforces:
//!
//! * Tests must never silently pass without the network: every entry point
//!   calls [`require_root_and_ip`], which panics loudly when root or `ip` is
//!   missing.
//! * Cleanup is RAII: dropping a [`Netns`] (also during a panic unwind) kills
//!   what still runs inside it and deletes it, which also deletes its veth
//!   ends and their peers.
//! * Names are unique per process *and* per test (pid + counter), so cargo's
//!   parallel test threads and concurrent test binaries don't collide.
//! * Interfaces are created directly inside their namespaces (never in the
//!   host namespace) and kept ≤ 15 chars (`IFNAMSIZ - 1`).
//! * Every command runs with a deadline (see [`super::run_bounded`]).
//!
//! Typical use:
//!
//! ```ignore
//! let srv = Netns::new("srv");
//! let cli = Netns::new("cli");
//! veth_pair(&srv, "10.77.1.1/24", &cli, "10.77.1.2/24");
//! let mut server = ChildGuard::spawn(srv.cmd(env!("CARGO_BIN_EXE_udp_server")).args([..]), "server");
//! ```

use std::collections::HashMap;
use std::ffi::OsStr;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::{run_bounded, run_ok};

/// Deadline for one `ip`/helper command; they normally take milliseconds.
const CMD_TIMEOUT: Duration = Duration::from_secs(30);

/// Linux interface names are at most `IFNAMSIZ - 1` bytes.
const IFNAME_MAX: usize = 15;

/// Source of unique suffixes for namespace and interface names.
static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Serializes namespace creation within this process: concurrent first-time
/// `ip netns add` calls race on setting up the `/run/netns` mount.
static CREATE_LOCK: Mutex<()> = Mutex::new(());

/// Panics with a clear message unless we can create network namespaces:
/// effective CAP_NET_ADMIN and CAP_SYS_ADMIN (i.e. root) and `ip` from
/// iproute2 on `PATH`. Tests must fail here, never skip.
pub fn require_root_and_ip() {
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_SYS_ADMIN: u32 = 21; // `ip netns add/exec` mount things
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |cap: u32| cap_eff & (1u64 << cap) != 0;
    assert!(
        has(CAP_NET_ADMIN) && has(CAP_SYS_ADMIN),
        "\n\n*** this test needs root (CAP_NET_ADMIN) to create network namespaces; \
         run as root, as CI does (effective caps: {cap_eff:#x}) ***\n\n"
    );
    let ip_works = Command::new("ip")
        .arg("-V")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ip_works,
        "\n\n*** `ip` from iproute2 not found: apt-get install iproute2 ***\n\n"
    );
}

/// Runs `ip ARGS...` in the host namespace; panics with stderr on failure.
pub fn ip(args: &[&str]) -> String {
    run_ok(Command::new("ip").args(args), CMD_TIMEOUT)
}

/// Names of all named network namespaces (`ip netns list`).
pub fn list_netns() -> Vec<String> {
    ip(&["netns", "list"])
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Whether a named network namespace exists.
pub fn netns_exists(name: &str) -> bool {
    list_netns().iter().any(|n| n == name)
}

/// Next unique number for names in this process.
fn next_id() -> usize {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// A unique interface name `v{pid%100000}{n}{side}`, ≤ 15 chars.
fn ifname(n: usize, side: char) -> String {
    let name = format!("v{}{n}{side}", std::process::id() % 100_000);
    assert!(name.len() <= IFNAME_MAX, "interface name too long: {name}");
    name
}

/// A named network namespace, i.e. one simulated host; deleted on drop.
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates namespace `ns-{tag}-{pid}-{n}` with `lo` up.
    /// `tag` is for humans reading `ip netns list`: ASCII alphanumerics only.
    pub fn new(tag: &str) -> Netns {
        require_root_and_ip();
        assert!(
            !tag.is_empty() && tag.chars().all(|c| c.is_ascii_alphanumeric()),
            "netns tag must be ASCII alphanumeric: {tag:?}"
        );
        let name = format!("ns-{tag}-{}-{}", std::process::id(), next_id());
        {
            let _lock = CREATE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
            let out = run_bounded(
                Command::new("ip").args(["netns", "add", &name]),
                CMD_TIMEOUT,
            );
            if !out.status.success() {
                // Only a killed earlier process with our (recycled) pid can
                // have left this name behind: remove the leftover, retry once.
                let _ = run_bounded(
                    Command::new("ip").args(["netns", "del", &name]),
                    CMD_TIMEOUT,
                );
                ip(&["netns", "add", &name]);
            }
        }
        // From here on `Drop` cleans up even if a later step panics.
        let ns = Netns { name };
        ns.run(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    /// The namespace name, as accepted by `ip netns exec` / `ip -n`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip netns exec NAME program`: add args/stdio, then spawn (ideally
    /// through [`super::ChildGuard`]). `ip netns exec` execs the program
    /// without forking, so the child's pid is the program's pid and signals
    /// sent to it reach the program.
    pub fn cmd(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Runs `args[0] args[1..]` inside the namespace with a deadline; panics
    /// with stderr if it fails; returns stdout.
    pub fn run(&self, args: &[&str]) -> String {
        let (program, rest) = args.split_first().expect("Netns::run needs a program");
        run_ok(self.cmd(program).args(rest), CMD_TIMEOUT)
    }

    /// `ip -n NAME ARGS...`: iproute2 commands against this namespace.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// The `Udp:` counters of this namespace's `/proc/net/snmp`
    /// (`InDatagrams`, `NoPorts`, `InErrors`, `OutDatagrams`, `RcvbufErrors`,
    /// `SndbufErrors`, ...). They are per network namespace, so they count
    /// exactly this simulated host's IPv4 UDP traffic.
    pub fn read_snmp_udp(&self) -> HashMap<String, u64> {
        let snmp = self.run(&["cat", "/proc/net/snmp"]);
        // Two lines start with "Udp:": the field names, then the values.
        let mut rows = snmp.lines().filter_map(|l| l.strip_prefix("Udp:"));
        let (Some(names), Some(values)) = (rows.next(), rows.next()) else {
            panic!("no Udp: lines in /proc/net/snmp of {}:\n{snmp}", self.name);
        };
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .map(|(k, v)| {
                let v = v
                    .parse()
                    .unwrap_or_else(|e| panic!("bad snmp Udp value {k}={v}: {e}"));
                (k.to_string(), v)
            })
            .collect()
    }

    /// MAC address of interface `dev` in this namespace.
    pub fn mac(&self, dev: &str) -> String {
        let json = self.ip(&["-j", "link", "show", "dev", dev]);
        let v: serde_json::Value = serde_json::from_str(&json)
            .unwrap_or_else(|e| panic!("bad `ip -j link` output {json:?}: {e}"));
        v[0]["address"]
            .as_str()
            .unwrap_or_else(|| panic!("no address for {dev} in {json}"))
            .to_string()
    }

    /// Adds a permanent ARP entry `ip -> mac` on `dev`.
    pub fn pin_neighbor(&self, dev: &str, ip: &str, mac: &str) {
        self.ip(&[
            "neigh",
            "replace",
            ip,
            "lladdr",
            mac,
            "dev",
            dev,
            "nud",
            "permanent",
        ]);
    }

    /// Pids of processes still running inside the namespace.
    fn pids(&self) -> Vec<libc::pid_t> {
        let out = run_bounded(
            Command::new("ip").args(["netns", "pids", &self.name]),
            CMD_TIMEOUT,
        );
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }
}

impl Drop for Netns {
    /// Kills leftover processes inside the namespace (only ever ones the test
    /// started there; they would otherwise keep it and its interfaces alive),
    /// then deletes it. Errors are ignored: this runs during panics too.
    fn drop(&mut self) {
        for pid in self.pids() {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = run_bounded(
            Command::new("ip").args(["netns", "del", &self.name]),
            CMD_TIMEOUT,
        );
    }
}

/// The host address of an `a.b.c.d/len` string.
fn host_addr(cidr: &str) -> &str {
    cidr.split('/').next().unwrap()
}

/// Connects `a` and `b` with a veth pair ("a cable"): one end in each
/// namespace, addresses assigned (CIDR form, e.g. `"10.77.1.1/24"`), both
/// up. Returns the interface names `(in a, in b)`.
///
/// Both sides also get permanent ARP entries for each other: a blast of
/// datagrams sent before ARP resolves would otherwise overflow the
/// neighbour queue and be dropped silently, which exact-count tests must not
/// confuse with the tool losing packets. (`ip -n NS neigh flush dev IF nud
/// permanent` undoes it for a test that wants ARP.)
pub fn veth_pair(a: &Netns, a_addr: &str, b: &Netns, b_addr: &str) -> (String, String) {
    let n = next_id();
    let (ia, ib) = (ifname(n, 'a'), ifname(n, 'b'));
    // Created directly in the namespaces, so the names never exist in (and
    // can't collide in) the host namespace.
    let netns = b.name();
    a.ip(&super::args(&format!(
        "link add {ia} type veth peer name {ib} netns {netns}"
    )));
    a.ip(&["addr", "add", a_addr, "dev", &ia]);
    b.ip(&["addr", "add", b_addr, "dev", &ib]);
    a.ip(&["link", "set", &ia, "up"]);
    b.ip(&["link", "set", &ib, "up"]);
    a.pin_neighbor(&ia, host_addr(b_addr), &b.mac(&ib));
    b.pin_neighbor(&ib, host_addr(a_addr), &a.mac(&ia));
    (ia, ib)
}

/// A server host and a client host joined by one veth link on
/// `subnet`.0/24 (e.g. `"10.61.2"`): the server is `subnet`.1 and the
/// client `subnet`.2. The namespaces are tagged `{tag}srv` and `{tag}cli`.
/// Returns them and the link's interfaces, (server side, client side).
pub fn two_hosts(tag: &str, subnet: &str) -> (Netns, Netns, (String, String)) {
    let srv = Netns::new(&format!("{tag}srv"));
    let cli = Netns::new(&format!("{tag}cli"));
    let devs = veth_pair(
        &srv,
        &format!("{subnet}.1/24"),
        &cli,
        &format!("{subnet}.2/24"),
    );
    (srv, cli, devs)
}

/// Three hosts in a row, client — router — server, on two subnets:
/// `10.{net}.1.0/24` between the client (`.2`) and the router (`.1`), and
/// `10.{net}.2.0/24` between the router (`.1`) and the server (`.2`). The
/// router forwards (with reverse-path filtering off, so a test can forge
/// source addresses through it). With `nat`, it is a home router: it
/// masquerades the client behind its own server-side address and drops
/// every datagram from the server side that does not belong to a flow the
/// client began (`ct state`), and the server has no route to the client's
/// subnet at all, so whatever reaches the client came through the NAT.
pub struct Routed {
    pub client: Netns,
    pub router: Netns,
    pub server: Netns,
    /// (client side, router side) of the client's link.
    pub client_link: (String, String),
    /// (router side, server side) of the server's link.
    pub server_link: (String, String),
    pub client_ip: String,
    pub server_ip: String,
    /// The address the server sees the client as: the router's with NAT.
    pub client_seen_as: String,
}

pub fn routed(tag: &str, net: u8, nat: bool) -> Routed {
    let client = Netns::new(&format!("{tag}cli"));
    let router = Netns::new(&format!("{tag}rtr"));
    let server = Netns::new(&format!("{tag}srv"));
    let client_link = veth_pair(
        &client,
        &format!("10.{net}.1.2/24"),
        &router,
        &format!("10.{net}.1.1/24"),
    );
    let server_link = veth_pair(
        &router,
        &format!("10.{net}.2.1/24"),
        &server,
        &format!("10.{net}.2.2/24"),
    );
    for setting in [
        "net.ipv4.ip_forward=1",
        "net.ipv4.conf.all.rp_filter=0",
        "net.ipv4.conf.default.rp_filter=0",
    ] {
        router.run(&["sysctl", "-q", "-w", setting]);
    }
    for dev in [&client_link.1, &server_link.0] {
        router.run(&[
            "sysctl",
            "-q",
            "-w",
            &format!("net.ipv4.conf.{dev}.rp_filter=0"),
        ]);
    }
    client.ip(&["route", "add", "default", "via", &format!("10.{net}.1.1")]);
    if nat {
        let out = &server_link.0;
        let script = format!(
            r#"table ip home {{
    chain post {{ type nat hook postrouting priority 100; oifname "{out}" masquerade; }}
    chain guard {{
        type filter hook forward priority 0; policy accept;
        ct state established,related accept
        iifname "{out}" counter drop
    }}
}}
"#
        );
        super::impair::require_nft();
        super::impair::nft_apply(&router, &script);
    } else {
        server.ip(&["route", "add", "default", "via", &format!("10.{net}.2.1")]);
    }
    Routed {
        client_ip: format!("10.{net}.1.2"),
        server_ip: format!("10.{net}.2.2"),
        client_seen_as: if nat {
            format!("10.{net}.2.1")
        } else {
            format!("10.{net}.1.2")
        },
        client,
        router,
        server,
        client_link,
        server_link,
    }
}

/// One host attached to a [`Bridge`].
struct Port {
    netns: String,
    dev: String,
    ip: String,
    mac: String,
}

/// An L2 switch: a namespace holding bridge `br0`, to join N hosts on one
/// subnet (e.g. three clients and a server). Hosts are attached with
/// [`Bridge::attach`]; the switch namespace itself has no addresses.
///
/// Dropping the bridge deletes the switch namespace; dropping a host deletes
/// its veth end, whose peer (the bridge port) then disappears too.
pub struct Bridge {
    switch: Netns,
    ports: Mutex<Vec<Port>>,
}

impl Bridge {
    /// Creates the switch namespace and its bridge `br0` (STP off, so ports
    /// forward immediately).
    pub fn new(tag: &str) -> Bridge {
        let switch = Netns::new(tag);
        switch.ip(&["link", "add", "br0", "type", "bridge", "stp_state", "0"]);
        switch.ip(&["link", "set", "br0", "up"]);
        Bridge {
            switch,
            ports: Mutex::new(Vec::new()),
        }
    }

    /// The switch namespace (e.g. to inspect or shape bridge ports).
    pub fn switch(&self) -> &Netns {
        &self.switch
    }

    /// Plugs `host` into the switch with address `addr` (CIDR form). Returns
    /// `(host-side interface, switch-side port)`. As in [`veth_pair`], ARP
    /// entries between all attached hosts are pinned.
    pub fn attach(&self, host: &Netns, addr: &str) -> (String, String) {
        let n = next_id();
        let (dev, port) = (ifname(n, 'h'), ifname(n, 's'));
        let switch = self.switch.name();
        host.ip(&super::args(&format!(
            "link add {dev} type veth peer name {port} netns {switch}"
        )));
        self.switch.ip(&["link", "set", &port, "master", "br0"]);
        self.switch.ip(&["link", "set", &port, "up"]);
        host.ip(&["addr", "add", addr, "dev", &dev]);
        host.ip(&["link", "set", &dev, "up"]);

        let me = Port {
            netns: host.name().to_string(),
            dev: dev.clone(),
            ip: host_addr(addr).to_string(),
            mac: host.mac(&dev),
        };
        let mut ports = self.ports.lock().unwrap_or_else(|e| e.into_inner());
        for other in ports.iter() {
            host.pin_neighbor(&me.dev, &other.ip, &other.mac);
            let out = run_bounded(
                Command::new("ip").args([
                    "-n",
                    &other.netns,
                    "neigh",
                    "replace",
                    &me.ip,
                    "lladdr",
                    &me.mac,
                    "dev",
                    &other.dev,
                    "nud",
                    "permanent",
                ]),
                CMD_TIMEOUT,
            );
            // A host dropped earlier is gone along with its interface; any
            // other failure is a harness bug.
            assert!(
                out.status.success() || !netns_exists(&other.netns),
                "pinning ARP entry in {}: {}",
                other.netns,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        ports.push(me);
        (dev, port)
    }
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes; returns
/// whether it held. (Namespace teardown in the kernel is asynchronous.)
pub fn eventually(timeout: Duration, cond: impl FnMut() -> bool) -> bool {
    super::poll_every(Duration::from_millis(20), timeout, cond)
}
