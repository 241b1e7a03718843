//! `--iperf3-json`: the real binaries on loopback, ephemeral ports. The
//! client's document for a plain run, `-R`, `--bidir` and `-P 4`, and the
//! `--one-off` server's, parse as one JSON document with the fields
//! iperf3's readers take, in the JSON types they decode them into; their
//! `sum_received` counts are netspeed's own for the same run.
//!
//! Why the server's `--json` log is the witness for the client's document:
//! the client writes one document and nothing else, and the server that
//! served the run wrote its own counts as it went (`peer_done` for each
//! upload session, `stream_done` for each reverse stream, with the
//! client's count from its answer). Each test has a server of its own, so
//! every count in its log is this run's. For the server's document it is
//! the other way round: the client's `--json` report of the same run.
//!
//! The readers' fields are those of pScheduler's `iperf3_parser.py`, the
//! iperf3 Python module's `TestResult`, iperf3_exporter and Kubernetes'
//! netperf parsers (`docs/output.md`, "iperf3's JSON"). The iperf3 Python
//! module's `TestResult` reads each document too (`.ci/run` installs it
//! from PyPI; without it the test fails).

mod common;

use common::udp::{Server, CLIENT, SERVER, WAIT};
use common::{run_bounded, ChildGuard};
use serde_json::Value;
use std::process::{Command, Output, Stdio};

/// A short paced run: two one-second intervals and a little.
const RUN: &str = "--duration 2s --rate 50Mbit -b 1400 --idle-probe 0";

fn client(server: &str, extra: &str) -> Output {
    let mut cmd = Command::new(CLIENT);
    cmd.args(["-s", server, "--iperf3-json"])
        .args(common::args(RUN))
        .args(common::args(extra));
    run_bounded(&mut cmd, WAIT)
}

/// stdout as exactly one JSON document.
fn document(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}):\n{}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Runs the client against a server of its own; returns its document and
/// every event the server wrote.
fn run(extra: &str) -> (Value, Vec<Value>) {
    let server = Server::start("127.0.0.1:0", &["--recv-buffer-size", "4M"]);
    let out = client(&server.addr, extra);
    assert_eq!(
        out.status.code(),
        Some(0),
        "udp_client --iperf3-json {extra}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = document(&out);
    (doc, server.stop())
}

fn obj<'a>(v: &'a Value, key: &str) -> &'a Value {
    assert!(v[key].is_object(), "{key} is not an object in {v}");
    &v[key]
}

fn arr<'a>(v: &'a Value, key: &str) -> &'a Vec<Value> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} is not an array in {v}"))
}

fn int(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not an integer in {v}"))
}

/// A signed integer: a receiving interval's loss can shrink.
fn signed(v: &Value, key: &str) -> i64 {
    v[key]
        .as_i64()
        .unwrap_or_else(|| panic!("{key} is not an integer in {v}"))
}

fn num(v: &Value, key: &str) -> f64 {
    let x = v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"));
    assert!(x.is_finite() && x >= 0.0, "{key} = {x} in {v}");
    x
}

fn boolean(v: &Value, key: &str) -> bool {
    v[key]
        .as_bool()
        .unwrap_or_else(|| panic!("{key} is not a boolean in {v}"))
}

fn string<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} is not a string in {v}"))
}

fn no_nulls(v: &Value, at: &str) {
    match v {
        Value::Null => panic!("null at {at}"),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, x)| no_nulls(x, &format!("{at}[{i}]"))),
        Value::Object(o) => o
            .iter()
            .for_each(|(k, x)| no_nulls(x, &format!("{at}.{k}"))),
        _ => {}
    }
}

/// What the run looked like, for the shape checks.
struct Shape {
    streams: u64,
    reverse: bool,
    bidir: bool,
    /// The document is the server's (`accepted_connection`).
    server: bool,
}

/// An interval object (a stream's or a sum): the fields pScheduler renames
/// and Kubernetes' parsers decode, in their types.
fn check_interval(v: &Value, stream: bool) {
    if stream {
        int(v, "socket");
    }
    num(v, "start");
    num(v, "end");
    num(v, "seconds");
    int(v, "bytes");
    num(v, "bits_per_second");
    assert!(!boolean(v, "omitted"), "{v}");
    if boolean(v, "sender") {
        assert!(v.get("jitter_ms").is_none(), "{v}");
    } else {
        num(v, "jitter_ms");
        signed(v, "lost_packets");
        int(v, "packets");
    }
}

/// A summary in `end`: what the Python module, the exporter and
/// Kubernetes' parsers read.
fn check_summary(v: &Value) {
    for key in [
        "start",
        "end",
        "seconds",
        "bits_per_second",
        "jitter_ms",
        "lost_percent",
    ] {
        num(v, key);
    }
    for key in ["bytes", "lost_packets", "packets"] {
        int(v, key);
    }
    boolean(v, "sender");
}

/// Every field the readers take, with its JSON type; the flags and the
/// `sender` booleans where iperf3 puts them.
fn check_shape(doc: &Value, s: &Shape) {
    no_nulls(doc, "");
    assert!(doc.get("error").is_none(), "an error: {doc}");
    let start = obj(doc, "start");
    let per_direction = if s.bidir { 2 } else { 1 };
    let connected = arr(start, "connected");
    assert_eq!(connected.len() as u64, s.streams * per_direction, "{start}");
    for c in connected {
        int(c, "socket");
        string(c, "local_host");
        int(c, "local_port");
        string(c, "remote_host");
        int(c, "remote_port");
    }
    assert!(string(start, "version").starts_with("netspeed "));
    string(start, "system_info");
    let ts = obj(start, "timestamp");
    string(ts, "time");
    int(ts, "timesecs");
    let (peer, absent) = if s.server {
        ("accepted_connection", "connecting_to")
    } else {
        ("connecting_to", "accepted_connection")
    };
    string(obj(start, peer), "host");
    int(&start[peer], "port");
    assert!(start.get(absent).is_none(), "{start}");
    let t = obj(start, "test_start");
    assert_eq!(string(t, "protocol"), "UDP");
    assert_eq!(int(t, "num_streams"), s.streams);
    assert_eq!(int(t, "reverse"), u64::from(s.reverse));
    assert_eq!(int(t, "bidir"), u64::from(s.bidir));
    assert_eq!((int(t, "omit"), int(t, "tos")), (0, 0));
    if !s.server {
        for key in ["blksize", "duration", "bytes", "blocks", "target_bitrate"] {
            int(t, key);
        }
        assert_eq!(int(t, "blksize"), 1400);
        assert_eq!(int(t, "duration"), 2);
    }

    let intervals = arr(doc, "intervals");
    assert!(intervals.len() >= 2, "one a second: {intervals:?}");
    for iv in intervals {
        for st in arr(iv, "streams") {
            check_interval(st, true);
        }
        for key in ["sum", "sum_bidir_reverse"] {
            if let Some(sum) = iv.get(key) {
                check_interval(sum, false);
            }
        }
    }
    assert!(intervals[0].get("sum").is_some(), "{}", intervals[0]);
    assert_eq!(intervals[0].get("sum_bidir_reverse").is_some(), s.bidir);

    let end = obj(doc, "end");
    let streams = arr(end, "streams");
    assert_eq!(streams.len(), connected.len());
    for st in streams {
        let udp = obj(st, "udp");
        check_summary(udp);
        int(udp, "socket");
        int(udp, "out_of_order");
    }
    // The client's first streams are those it sends on (plain,
    // --bidir); the server's, those it receives on (but with -R it only
    // sends).
    let local_sends_first = s.reverse == s.server;
    assert_eq!(boolean(&streams[0]["udp"], "sender"), local_sends_first);
    let suffixes: &[&str] = if s.bidir {
        &["", "_bidir_reverse"]
    } else {
        &[""]
    };
    for suffix in suffixes {
        let sum = obj(end, &format!("sum{suffix}"));
        let sent = obj(end, &format!("sum_sent{suffix}"));
        let received = obj(end, &format!("sum_received{suffix}"));
        for v in [sum, sent, received] {
            check_summary(v);
        }
        // sum_sent: always the sender, never any jitter or loss.
        assert!(boolean(sent, "sender"));
        assert_eq!(num(sent, "jitter_ms"), 0.0);
        assert_eq!(int(sent, "lost_packets"), 0);
        assert!(!boolean(received, "sender"));
        // end.sum: the sender's bytes beside the receiver's loss.
        assert_eq!(int(sum, "bytes"), int(sent, "bytes"));
        assert_eq!(int(sum, "lost_packets"), int(received, "lost_packets"));
        assert!(int(received, "packets") > 0, "{received}");
    }
    if !s.bidir {
        assert!(end.get("sum_bidir_reverse").is_none());
    }
    let cpu = obj(end, "cpu_utilization_percent");
    for key in [
        "host_total",
        "host_user",
        "host_system",
        "remote_total",
        "remote_user",
        "remote_system",
    ] {
        num(cpu, key);
    }
}

/// The events named `event` in a server's log.
fn events<'a>(log: &'a [Value], event: &str) -> Vec<&'a Value> {
    log.iter().filter(|v| v["event"] == event).collect()
}

/// netspeed's own counts of the uploads, from the server's `peer_done`
/// lines: (packets, bytes, lost), summed.
fn uploads_counted(log: &[Value]) -> (u64, u64, u64) {
    events(log, "peer_done")
        .iter()
        .filter(|v| v["tagged"] == true)
        .fold((0, 0, 0), |(p, b, l), v| {
            (
                p + int(v, "packets"),
                b + int(v, "bytes"),
                l + int(v, "lost"),
            )
        })
}

/// netspeed's own counts of the reverse streams, from the client's answers
/// in the server's `stream_done` lines.
fn reverse_counted(log: &[Value]) -> (u64, u64, u64) {
    events(log, "stream_done")
        .iter()
        .map(|v| obj(v, "received"))
        .fold((0, 0, 0), |(p, b, l), r| {
            (
                p + int(r, "packets"),
                b + int(r, "bytes"),
                l + int(r, "lost_packets"),
            )
        })
}

fn received(end: &Value, name: &str) -> (u64, u64, u64) {
    let r = obj(end, name);
    (int(r, "packets"), int(r, "bytes"), int(r, "lost_packets"))
}

/// Each upload stream's figures are its session's: the stream's local port
/// is the session's peer port at the server.
fn streams_match_sessions(doc: &Value, log: &[Value], streams: usize) {
    let connected = arr(&doc["start"], "connected");
    let dones = events(log, "peer_done");
    for (c, st) in connected
        .iter()
        .zip(arr(&doc["end"], "streams"))
        .take(streams)
    {
        let peer = format!("127.0.0.1:{}", int(c, "local_port"));
        let done = dones
            .iter()
            .find(|d| d["peer"] == peer.as_str())
            .unwrap_or_else(|| panic!("no peer_done for {peer}: {log:?}"));
        let udp = &st["udp"];
        assert_eq!(int(udp, "socket"), int(c, "socket"));
        assert_eq!(int(udp, "bytes"), int(done, "sent_bytes"), "{udp} {done}");
        assert_eq!(
            int(udp, "packets"),
            int(done, "sent_packets"),
            "{udp} {done}"
        );
        assert_eq!(int(udp, "lost_packets"), int(done, "lost"), "{udp} {done}");
        assert_eq!(
            int(udp, "out_of_order"),
            int(done, "reordered"),
            "{udp} {done}"
        );
    }
}

/// The iperf3 Python module's `TestResult` reads the document: what a
/// script that used it reads.
fn python_reads(doc: &Value, reverse: bool) {
    const SCRIPT: &str = r#"
import json, sys, iperf3
text = sys.stdin.read()
r = iperf3.TestResult(text)
assert r.error is None, r.error
print(json.dumps({
    "protocol": r.protocol, "type": r.type, "reverse": r.reverse,
    "num_streams": r.num_streams, "blksize": r.blksize,
    "bytes": r.bytes, "bps": r.bps, "Mbps": r.Mbps, "jitter_ms": r.jitter_ms,
    "packets": r.packets, "lost_packets": r.lost_packets,
    "lost_percent": r.lost_percent, "seconds": r.seconds,
    "local_host": r.local_host, "local_port": r.local_port,
    "local_cpu_total": r.local_cpu_total, "remote_cpu_total": r.remote_cpu_total,
}))
"#;
    let probe = Command::new("python3")
        .args(["-c", "import iperf3"])
        .stderr(Stdio::null())
        .status();
    // A reader that is not there fails the test: it is never skipped.
    assert!(
        probe.is_ok_and(|s| s.success()),
        "the iperf3 Python module is not importable: install it as .ci/run does (python3 -m pip install --target target/pylib iperf3==0.1.11, and PYTHONPATH=target/pylib)"
    );
    let mut child = ChildGuard::spawn(
        Command::new("python3")
            .args(["-c", SCRIPT])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        "python3",
    );
    {
        use std::io::Write;
        let mut stdin = child.child_mut().stdin.take().expect("stdin");
        stdin
            .write_all(doc.to_string().as_bytes())
            .expect("write the document");
    }
    let out = child.stdout_lines();
    let err = child.stderr_lines();
    let line = out.next_line(WAIT);
    let status = child.wait_timeout(WAIT).expect("python3 ends");
    let line = line.unwrap_or_else(|| {
        panic!(
            "TestResult did not read the document ({status}): {}",
            err.drain(WAIT).join("\n")
        )
    });
    let read: Value = serde_json::from_str(&line).expect("the script's JSON");
    let sum = &doc["end"]["sum"];
    assert_eq!(read["protocol"], "UDP");
    assert_eq!(read["type"], "client");
    assert_eq!(read["reverse"], reverse);
    assert_eq!(read["bytes"], sum["bytes"]);
    assert_eq!(read["bps"], sum["bits_per_second"]);
    assert_eq!(read["lost_packets"], sum["lost_packets"]);
    assert_eq!(read["packets"], sum["packets"]);
    assert_eq!(read["jitter_ms"], sum["jitter_ms"]);
    assert!(read["Mbps"].as_f64().is_some_and(|m| m > 1.0), "{read}");
    assert_eq!(
        read["local_port"],
        doc["start"]["connected"][0]["local_port"]
    );
}

#[test]
fn a_plain_run_is_one_iperf3_document_with_netspeeds_counts() {
    let (doc, log) = run("");
    check_shape(
        &doc,
        &Shape {
            streams: 1,
            reverse: false,
            bidir: false,
            server: false,
        },
    );
    assert_eq!(received(&doc["end"], "sum_received"), uploads_counted(&log));
    streams_match_sessions(&doc, &log, 1);
    // The sender's intervals add up to what it sent.
    let sent: u64 = arr(&doc, "intervals")
        .iter()
        .map(|iv| int(&iv["sum"], "bytes"))
        .sum();
    assert_eq!(sent, int(&doc["end"]["sum_sent"], "bytes"));
    python_reads(&doc, false);
}

#[test]
fn four_streams_add_up_to_netspeeds_counts() {
    let (doc, log) = run("-P 4");
    check_shape(
        &doc,
        &Shape {
            streams: 4,
            reverse: false,
            bidir: false,
            server: false,
        },
    );
    assert_eq!(events(&log, "peer_done").len(), 4, "{log:?}");
    assert_eq!(received(&doc["end"], "sum_received"), uploads_counted(&log));
    streams_match_sessions(&doc, &log, 4);
    let sockets: Vec<u64> = arr(&doc["start"], "connected")
        .iter()
        .map(|c| int(c, "socket"))
        .collect();
    assert_eq!(sockets, [1, 2, 3, 4]);
    python_reads(&doc, false);
}

#[test]
fn a_reverse_run_is_the_receivers_document() {
    let (doc, log) = run("-R");
    check_shape(
        &doc,
        &Shape {
            streams: 1,
            reverse: true,
            bidir: false,
            server: false,
        },
    );
    let end = &doc["end"];
    assert_eq!(received(end, "sum_received"), reverse_counted(&log));
    let done = events(&log, "stream_done")[0];
    assert_eq!(int(&end["sum_sent"], "packets"), int(done, "sent_packets"));
    assert_eq!(int(&end["sum_sent"], "bytes"), int(done, "sent_bytes"));
    assert!(!boolean(&end["sum"], "sender"));
    // The receiver's intervals add up to what it received.
    let got: u64 = arr(&doc, "intervals")
        .iter()
        .map(|iv| int(&iv["sum"], "packets"))
        .sum();
    assert_eq!(got, int(&end["sum_received"], "packets"));
    python_reads(&doc, true);
}

#[test]
fn a_bidir_run_has_both_directions_under_iperf3s_names() {
    let (doc, log) = run("--bidir");
    check_shape(
        &doc,
        &Shape {
            streams: 1,
            reverse: false,
            bidir: true,
            server: false,
        },
    );
    let end = &doc["end"];
    assert_eq!(received(end, "sum_received"), uploads_counted(&log));
    assert_eq!(
        received(end, "sum_received_bidir_reverse"),
        reverse_counted(&log)
    );
    assert!(boolean(&end["sum"], "sender"));
    assert!(!boolean(&end["sum_bidir_reverse"], "sender"));
    streams_match_sessions(&doc, &log, 1);
    python_reads(&doc, false);
}

/// `udp_server --one-off --iperf3-json` and a client with `-R` or not:
/// the server's document, its exit code, and the client's report of the
/// same run.
fn served(extra: &str) -> (Value, Value) {
    let mut cmd = Command::new(SERVER);
    cmd.args(["--listen", "127.0.0.1:0", "--one-off", "--iperf3-json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut server = ChildGuard::spawn(&mut cmd, "udp_server");
    let out = server.stdout_lines();
    let err = server.stderr_lines();
    // The listening line goes to stderr, beside the document.
    let listening = err
        .wait_for(WAIT, |l| l.starts_with("udp_server listening on "))
        .expect("a listening line on stderr");
    let addr = listening["udp_server listening on ".len()..]
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let report = common::udp::client(&common::udp::args_to(&addr, &format!("{RUN} {extra}")));
    let lines = out.drain(WAIT);
    let status = server.wait_timeout(WAIT).expect("the one-off server ends");
    assert_eq!(status.code(), Some(0), "{}", err.drain(WAIT).join("\n"));
    assert_eq!(lines.len(), 1, "one document and nothing else: {lines:?}");
    let doc: Value = serde_json::from_str(&lines[0]).expect("a JSON document");
    (doc, report)
}

#[test]
fn a_one_off_server_writes_its_side_of_an_upload() {
    let (doc, report) = served("");
    check_shape(
        &doc,
        &Shape {
            streams: 1,
            reverse: false,
            bidir: false,
            server: true,
        },
    );
    let end = &doc["end"];
    let answer = obj(&report, "server");
    assert_eq!(
        received(end, "sum_received"),
        (
            int(answer, "received_packets"),
            int(answer, "received_bytes"),
            int(answer, "lost_packets")
        )
    );
    // What the client declared it sent.
    assert_eq!(
        int(&end["sum_sent"], "packets"),
        int(&report, "sent_packets")
    );
    assert!(!boolean(&end["sum"], "sender"));
    let client_port = int(&doc["start"]["accepted_connection"], "port");
    assert!(string(&report["clients"][0], "local_addr").ends_with(&format!(":{client_port}")));
}

#[test]
fn a_one_off_server_writes_its_side_of_a_reverse_stream() {
    let (doc, report) = served("-R");
    check_shape(
        &doc,
        &Shape {
            streams: 1,
            reverse: true,
            bidir: false,
            server: true,
        },
    );
    let end = &doc["end"];
    let got = &report["downloads"][0]["received"];
    assert_eq!(
        received(end, "sum_received"),
        (int(got, "packets"), int(got, "bytes"), int(got, "lost"))
    );
    assert_eq!(int(&end["sum_sent"], "packets"), int(got, "sent_packets"));
    assert!(boolean(&end["sum"], "sender"));
}

#[test]
fn a_failed_run_is_an_error_document_and_exit_1() {
    // Nothing listens on this port.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let out = client(&port, "");
    common::one_line_error(&out, 1, "udp_client: error:", "no server");
    let doc = document(&out);
    assert!(string(&doc, "error").len() > 10, "{doc}");
    assert_eq!(doc["intervals"], serde_json::json!([]));
    assert_eq!(doc["end"], serde_json::json!({}));
    assert!(arr(&doc["start"], "connected").is_empty());
}

#[test]
fn iperf3_json_beside_another_json_output_is_a_usage_error() {
    let dir = common::TempDir::new("iperf3-json");
    let file = dir.file("client.toml", "iperf3_json = true\njson = true\n");
    let file = file.to_str().unwrap();
    // The conflict's words, each setting named as it was written (issue
    // 42: a config file's keys conflict as the flags do).
    for (bin, args, says) in [
        (
            CLIENT,
            vec!["--iperf3-json", "--json"],
            "--iperf3-json cannot be used with --json",
        ),
        (
            CLIENT,
            vec!["--iperf3-json", "--json-stream"],
            "--iperf3-json cannot be used with --json-stream",
        ),
        (
            CLIENT,
            vec!["--config", file],
            "iperf3_json cannot be used with json",
        ),
        (
            CLIENT,
            vec!["--iperf3-json", "--sweep", "1000"],
            "--iperf3-json cannot be used with --sweep",
        ),
        (
            CLIENT,
            vec!["--iperf3-json", "--no-server"],
            "--iperf3-json cannot be used with --no-server",
        ),
        (
            SERVER,
            vec!["--iperf3-json", "--one-off", "--json"],
            "--iperf3-json cannot be used with --json",
        ),
    ] {
        let out = run_bounded(Command::new(bin).args(&args), WAIT);
        common::one_line_error(&out, 2, says, &format!("{args:?}"));
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = run_bounded(Command::new(SERVER).arg("--iperf3-json"), WAIT);
    common::one_line_error(
        &out,
        2,
        "--iperf3-json needs --one-off",
        "server without --one-off",
    );
}
