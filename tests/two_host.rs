//! Two-host end-to-end tests: `udp_server` and `udp_client` run in separate
//! network namespaces joined by a veth pair, so the traffic crosses a real
//! (virtual) link with distinct addresses instead of loopback, and both ends'
//! counts must agree exactly.
//!
//! The `harness_*` tests check the namespace harness itself (connectivity,
//! per-namespace counters, signals, cleanup on drop and on panic) without any
//! netspeed binary: `cargo test --test two_host harness`.
//!
//! Needs root (CAP_NET_ADMIN) and iproute2; without them the tests fail
//! loudly rather than skip.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::Stdio;
use std::time::Duration;

use common::netns::{
    eventually, list_netns, netns_exists, require_root_and_ip, veth_pair, Bridge, Netns,
};
use common::{run_bounded, wait_deadline, ChildGuard, LineReader};
use serde_json::Value;

/// Timeout for any single expected line or short exchange.
const STEP: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// Tiny UDP peers in python3, so the harness can be tested without netspeed.
// ---------------------------------------------------------------------------

/// `python3 -c ECHO_SERVER IP PORT N`: prints "ready", then answers N
/// datagrams with their upper-cased payload, printing "SENDER_IP PAYLOAD"
/// for each. Gives up after 10 s of silence.
const ECHO_SERVER: &str = r#"
import socket, sys
ip, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((ip, port))
s.settimeout(10)
print("ready", flush=True)
for _ in range(n):
    d, a = s.recvfrom(2048)
    s.sendto(d.upper(), a)
    print(a[0], d.decode(), flush=True)
"#;

/// `python3 -c ECHO_CLIENT IP PORT MSG`: sends MSG, prints the reply.
const ECHO_CLIENT: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.sendto(sys.argv[3].encode(), (sys.argv[1], int(sys.argv[2])))
print(s.recvfrom(2048)[0].decode())
"#;

const ECHO_PORT: &str = "40000";

/// Starts the python echo server in `ns` on `ip`, answering `n` datagrams;
/// returns once it is listening.
fn start_echo_server(ns: &Netns, ip: &str, n: usize) -> (ChildGuard, LineReader) {
    let mut child = ChildGuard::spawn(
        ns.cmd("python3")
            .args(["-c", ECHO_SERVER, ip, ECHO_PORT, &n.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped()),
        "python3 echo server (python3 is needed by the harness self-tests)",
    );
    let lines = child.stdout_lines();
    assert_eq!(
        lines.next_line(STEP).as_deref(),
        Some("ready"),
        "echo server in {} did not start",
        ns.name()
    );
    (child, lines)
}

/// Sends `msg` from `ns` to the echo server at `ip` and returns the reply.
fn echo(ns: &Netns, ip: &str, msg: &str) -> String {
    ns.run(&["python3", "-c", ECHO_CLIENT, ip, ECHO_PORT, msg])
        .trim()
        .to_string()
}

/// Whether `dev` exists in namespace `ns` (false if the namespace is gone).
fn has_link(ns: &str, dev: &str) -> bool {
    let out = run_bounded(
        std::process::Command::new("ip").args(["-n", ns, "link", "show", "dev", dev]),
        STEP,
    );
    out.status.success()
}

/// Whether `dev` exists in the host (test runner's) namespace.
fn host_has_link(dev: &str) -> bool {
    let out = run_bounded(
        std::process::Command::new("ip").args(["link", "show", "dev", dev]),
        STEP,
    );
    out.status.success()
}

// ---------------------------------------------------------------------------
// Harness self-tests.
// ---------------------------------------------------------------------------

#[test]
fn harness_requirements_are_met() {
    require_root_and_ip();
}

#[test]
fn harness_veth_pair_carries_udp_and_is_cleaned_up() {
    let a = Netns::new("a");
    let b = Netns::new("b");
    let (ia, ib) = veth_pair(&a, "10.77.1.1/24", &b, "10.77.1.2/24");
    assert!(ia.len() <= 15 && ib.len() <= 15, "{ia} {ib}");
    assert!(has_link(a.name(), &ia) && has_link(b.name(), &ib));
    // The ends live only inside the namespaces.
    assert!(!host_has_link(&ia) && !host_has_link(&ib));

    let (mut server, lines) = start_echo_server(&b, "10.77.1.2", 1);
    assert_eq!(echo(&a, "10.77.1.2", "ping"), "PING");
    assert_eq!(lines.next_line(STEP).as_deref(), Some("10.77.1.1 ping"));
    let status = server.wait_timeout(STEP).expect("echo server did not exit");
    assert!(status.success(), "echo server: {status}");

    // UDP counters are per namespace: exactly our one datagram each way.
    let (sa, sb) = (a.read_snmp_udp(), b.read_snmp_udp());
    assert_eq!(
        (sa["OutDatagrams"], sa["InDatagrams"]),
        (1, 1),
        "client side {sa:?}"
    );
    assert_eq!(
        (sb["InDatagrams"], sb["OutDatagrams"]),
        (1, 1),
        "server side {sb:?}"
    );
    assert_eq!(sb["RcvbufErrors"], 0);

    // Cleanup proof: dropping one end's namespace removes its veth end and,
    // with it, the peer in the other namespace.
    let (na, nb) = (a.name().to_string(), b.name().to_string());
    drop(a);
    assert!(!netns_exists(&na), "{na} still listed after drop");
    assert!(
        eventually(STEP, || !has_link(&nb, &ib)),
        "peer {ib} in {nb} survived deleting {na}"
    );
    drop(b);
    let left = list_netns();
    assert!(
        !left.contains(&na) && !left.contains(&nb),
        "left over: {left:?}"
    );
    assert!(!host_has_link(&ia) && !host_has_link(&ib));
}

#[test]
fn harness_cleans_up_when_a_test_panics() {
    let mut names = Vec::new();
    let result = catch_unwind(AssertUnwindSafe(|| {
        let a = Netns::new("pa");
        let b = Netns::new("pb");
        names.push(a.name().to_string());
        names.push(b.name().to_string());
        veth_pair(&a, "10.77.1.1/24", &b, "10.77.1.2/24");
        assert!(netns_exists(a.name()) && netns_exists(b.name()));
        panic!("deliberate panic to prove Netns cleanup on unwind");
    }));
    assert!(result.is_err(), "the closure should have panicked");
    assert_eq!(names.len(), 2);
    let left = list_netns();
    for name in &names {
        assert!(
            !left.contains(name),
            "{name} leaked after a panic: {left:?}"
        );
    }
}

#[test]
fn harness_signals_reach_the_program_in_a_namespace() {
    let ns = Netns::new("sig");
    let sleeper = ChildGuard::spawn(ns.cmd("sleep").arg("30"), "sleep");
    // `ip netns exec` execs without forking, so the pid is the program's.
    let comm_path = format!("/proc/{}/comm", sleeper.id());
    assert!(
        eventually(STEP, || std::fs::read_to_string(&comm_path)
            .is_ok_and(|c| c.trim() == "sleep")),
        "pid {} never became `sleep`",
        sleeper.id()
    );
    let status = sleeper.terminate(STEP);
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");

    // A process left running inside is killed when the namespace is dropped.
    let mut leftover = ns
        .cmd("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep in netns");
    let comm_path = format!("/proc/{}/comm", leftover.id());
    assert!(eventually(STEP, || std::fs::read_to_string(&comm_path)
        .is_ok_and(|c| c.trim() == "sleep")));
    drop(ns);
    let status = wait_deadline(&mut leftover, STEP);
    if status.is_none() {
        let _ = leftover.kill();
        let _ = leftover.wait();
    }
    assert_eq!(
        status.and_then(|s| s.signal()),
        Some(libc::SIGKILL),
        "dropping the Netns did not kill the process inside"
    );
}

#[test]
fn harness_bridge_joins_several_hosts() {
    let bridge = Bridge::new("sw");
    let server = Netns::new("srv");
    bridge.attach(&server, "10.77.2.1/24");
    let clients: Vec<(Netns, String)> = (2..=4)
        .map(|i| {
            let ns = Netns::new(&format!("c{i}"));
            let (_, port) = bridge.attach(&ns, &format!("10.77.2.{i}/24"));
            (ns, port)
        })
        .collect();

    let (mut echo_server, lines) = start_echo_server(&server, "10.77.2.1", clients.len());
    for (i, (ns, _)) in clients.iter().enumerate() {
        let msg = format!("hello{i}");
        assert_eq!(echo(ns, "10.77.2.1", &msg), msg.to_uppercase());
        assert_eq!(
            lines.next_line(STEP),
            Some(format!("10.77.2.{} {msg}", i + 2)),
            "server should see each client's own address"
        );
    }
    assert!(echo_server.wait_timeout(STEP).is_some_and(|s| s.success()));
    assert_eq!(server.read_snmp_udp()["InDatagrams"], clients.len() as u64);

    // Unplugging a host (dropping it) removes its bridge port.
    let switch = bridge.switch().name().to_string();
    let mut names: Vec<String> = vec![switch.clone(), server.name().to_string()];
    for (ns, port) in clients {
        names.push(ns.name().to_string());
        assert!(has_link(&switch, &port));
        drop(ns);
        assert!(
            eventually(STEP, || !has_link(&switch, &port)),
            "bridge port {port} survived its host"
        );
    }
    drop(server);
    drop(bridge);
    let left = list_netns();
    for name in &names {
        assert!(!left.contains(name), "{name} leaked: {left:?}");
    }
}

// ---------------------------------------------------------------------------
// netspeed end to end.
// ---------------------------------------------------------------------------

/// `v[key]` as u64, panicking with the whole object if missing.
fn u64_at(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("missing/non-integer {key:?} in {v}"))
}

#[test]
fn udp_client_and_server_in_two_namespaces_count_exactly() {
    const TOTAL_BYTES: u64 = 20_000_000; // `-t 20M`
    const PAYLOAD: u64 = 1400; // `-b 1400`
    const SERVER_IP: &str = "10.77.1.1";
    const CLIENT_IP: &str = "10.77.1.2";

    // Namespaces first: they are dropped last, after the processes.
    let srv_ns = Netns::new("srv");
    let cli_ns = Netns::new("cli");
    veth_pair(&srv_ns, "10.77.1.1/24", &cli_ns, "10.77.1.2/24");

    let mut server = ChildGuard::spawn(
        srv_ns
            .cmd(env!("CARGO_BIN_EXE_udp_server"))
            .args(["--listen", "0.0.0.0:0", "--json", "--interval", "0"])
            .args(["--recv-buffer-size", "4M"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        "udp_server",
    );
    let out = server.stdout_lines();
    let err = server.stderr_lines();
    let server_log = || {
        err.drain(Duration::from_millis(200));
        format!(
            "--- server stdout{} ---\n{}\n--- server stderr ---\n{}",
            if out.is_eof() {
                " (closed: server exited?)"
            } else {
                ""
            },
            out.transcript(),
            err.transcript()
        )
    };

    let listening = out
        .wait_for_json(STEP, |v| v["event"] == "listening")
        .unwrap_or_else(|| panic!("no `listening` event within {STEP:?}\n{}", server_log()));
    let addr: std::net::SocketAddr = listening["addr"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("bad listening addr in {listening}"));
    assert_ne!(addr.port(), 0, "server reported port 0: {listening}");

    let client = run_bounded(
        cli_ns
            .cmd(env!("CARGO_BIN_EXE_udp_client"))
            .args(["-s", &format!("{SERVER_IP}:{}", addr.port())])
            // --no-gso: compared below with the kernel's per-datagram
            // counters (a GSO buffer is one packet until the receiver).
            .args([
                "-b", "1400", "-t", "20M", "--rate", "200Mbit", "--json", "--no-gso",
            ]),
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&client.stdout);
    let stderr = String::from_utf8_lossy(&client.stderr);
    assert!(
        client.status.success(),
        "udp_client failed ({}):\nstdout: {stdout}\nstderr: {stderr}\n{}",
        client.status,
        server_log()
    );
    let report: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("client stdout is not one JSON object ({e}):\n{stdout}\nstderr: {stderr}")
    });

    // Client side.
    let sent_packets = u64_at(&report, "sent_packets");
    let sent_bytes = u64_at(&report, "sent_bytes");
    assert_eq!(sent_bytes, TOTAL_BYTES, "{report}");
    assert_eq!(sent_packets, TOTAL_BYTES.div_ceil(PAYLOAD), "{report}");

    // The server's reply, as relayed by the client.
    let reply = &report["server"];
    assert!(
        reply.is_object(),
        "no server reply in client report: {report}"
    );
    assert_eq!(u64_at(reply, "received_bytes"), sent_bytes, "{reply}");
    assert_eq!(u64_at(reply, "received_packets"), sent_packets, "{reply}");
    assert_eq!(u64_at(reply, "lost_packets"), 0, "{reply}");

    // The server's own record of this peer.
    let session = report["clients"]
        .as_array()
        .filter(|c| c.len() == 1)
        .and_then(|c| c[0]["session"].as_str())
        .map(str::to_string);
    let peer_ip = |v: &Value| {
        v["peer"]
            .as_str()
            .and_then(|p| p.parse::<std::net::SocketAddr>().ok())
            .map(|p| p.ip().to_string())
    };
    let done = out
        .wait_for_json(STEP, |v| {
            v["event"] == "peer_done"
                && match &session {
                    Some(s) => v["session"] == s.as_str(),
                    None => peer_ip(v).as_deref() == Some(CLIENT_IP),
                }
        })
        .unwrap_or_else(|| {
            panic!(
                "no peer_done for session {session:?} within {STEP:?}\nclient: {report}\n{}",
                server_log()
            )
        });
    assert_eq!(peer_ip(&done).as_deref(), Some(CLIENT_IP), "{done}");
    assert_eq!(u64_at(&done, "packets"), sent_packets, "{done}");
    assert_eq!(u64_at(&done, "bytes"), sent_bytes, "{done}");
    assert_eq!(u64_at(&done, "lost"), 0, "{done}");
    if session.is_some() {
        assert_eq!(done["tagged"], true, "{done}");
    }

    // Independent kernel view of the same traffic (fresh namespaces, so
    // only netspeed's datagrams; control packets make it `>=`).
    let srv_udp = srv_ns.read_snmp_udp();
    let cli_udp = cli_ns.read_snmp_udp();
    assert!(
        srv_udp["InDatagrams"] >= sent_packets,
        "server ns {srv_udp:?}"
    );
    assert!(
        cli_udp["OutDatagrams"] >= sent_packets,
        "client ns {cli_udp:?}"
    );

    let status = server.terminate(STEP);
    assert!(
        status.success() || status.signal() == Some(libc::SIGTERM),
        "udp_server exit: {status}\n{}",
        server_log()
    );
}
