//! Many clients in one process (`udp_client -P N`, issue 27): N sockets on
//! a few threads, each still its own session with exact counts at both
//! ends; and the open-file limit that N sockets need.

mod common;

use common::udp::{u, Server, CLIENT, WAIT};
use common::{one_line_error, run_bounded};
use serde_json::Value;
use std::collections::HashSet;
use std::process::Command;

/// 200 paced clients of 200 datagrams each (40,000 in all, 0.8 s at
/// 2 Mbit/s each): every one answered, and for each session the server's
/// count is what that client sent.
#[test]
fn two_hundred_paced_clients_are_two_hundred_exact_sessions() {
    let server = Server::start("127.0.0.1:0", &["--recv-buffer-size", "8M"]);
    let report = server.client("-P 200 --rate 2Mbit -b 1000 -n 200 --interval 0");
    let clients = report["clients"].as_array().expect("clients");
    assert_eq!(clients.len(), 200);
    assert_eq!(report["clients_answered"], 200, "{}", report["notes"]);
    assert_eq!(report["complete"], true);
    let sessions: HashSet<&str> = clients
        .iter()
        .map(|c| c["session"].as_str().expect("session"))
        .collect();
    assert_eq!(sessions.len(), 200, "distinct sessions");
    let ports: HashSet<&str> = clients
        .iter()
        .map(|c| c["local_addr"].as_str().expect("local_addr"))
        .collect();
    assert_eq!(ports.len(), 200, "a socket each");
    for c in clients {
        assert_eq!(c["answer"], "answered", "{c}");
        assert_eq!(u(c, "sent_packets"), 200);
        assert_eq!(u(c, "sent_bytes"), 200_000);
        let answer = &c["server"];
        assert_eq!(u(answer, "received_packets"), 200, "{c}");
        assert_eq!(u(answer, "received_bytes"), 200_000, "{c}");
        assert_eq!(u(answer, "lost_packets"), 0, "{c}");
        assert_eq!(u(answer, "duplicates"), 0, "{c}");
        // The server's own line for the session says the same.
        let done = server.done_for(c["session"].as_str().unwrap());
        assert_eq!(u(&done, "packets"), 200, "{done}");
        assert_eq!(u(&done, "sent_packets"), 200, "{done}");
        assert_eq!(done["reason"], "end");
        // A share of its thread's CPU, by bytes (docs/output.md).
        if let Some(cpu) = c.get("cpu") {
            assert!(cpu["seconds"].as_f64().unwrap() >= 0.0, "{cpu}");
        }
    }
    assert_eq!(u(&report, "sent_packets"), 40_000);
    assert_eq!(u(&report["server"], "received_packets"), 40_000);
    assert_eq!(u(&report["server"], "lost_packets"), 0);
}

/// Runs `udp_client ARGS --json` under `prlimit --nofile=SOFT:HARD`.
fn client_under_limit(soft: u32, hard: u32, args: &[&str]) -> std::process::Output {
    common::impair::require_tool("prlimit", "--version", "util-linux");
    let mut cmd = Command::new("prlimit");
    cmd.arg(format!("--nofile={soft}:{hard}"))
        .arg(CLIENT)
        .args(args)
        .arg("--json");
    run_bounded(&mut cmd, WAIT)
}

#[test]
fn the_open_file_limit_is_raised_or_the_run_refused_with_the_arithmetic() {
    let server = Server::start("127.0.0.1:0", &["--recv-buffer-size", "8M"]);
    let args = [
        "-s",
        &server.addr,
        "-P",
        "300",
        "-n",
        "2",
        "--idle-probe",
        "0",
    ];
    // A soft limit below 300 sockets and a hard one above: raised, and run.
    let out = client_under_limit(64, 4096, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    assert_eq!(report["clients_answered"], 300);
    // A hard limit below 300 sockets: refused before any socket is opened,
    // with the numbers.
    let out = client_under_limit(100, 100, &args);
    let line = one_line_error(&out, 2, "--clients 300 needs 300 sockets", "hard limit 100");
    assert!(line.contains("ulimit -Hn"), "{line}");
    assert!(line.contains("> 100"), "{line}");
    let events = server.stop();
    let sessions = events.iter().filter(|e| e["event"] == "peer_done").count();
    assert_eq!(sessions, 300, "only the run that fitted reached the server");
}
