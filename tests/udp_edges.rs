//! The numbers at the edges (issue 11), with the real binaries on loopback:
//! a silent or vanishing server, unbiased rates, totals over several
//! clients, interval lines that add up, what GRO really did, and, through
//! the impairment relay, lost answers, late, delayed and repeated data.
//! Every expected figure comes from the relay's own counts or from what the
//! client was told to send.

mod common;

use common::impair::{Action, Dir, Pick};
use common::udp::{args_to, client, client_outcome, u, Server, CLIENT};
use common::{args, run_bounded};
use serde_json::Value;
use std::net::UdpSocket;
use std::process::Command;
use std::time::{Duration, Instant};

const DATA: Option<u8> = Some(0);
const END_ACK: Option<u8> = Some(2);

fn session(report: &Value) -> String {
    report["clients"][0]["session"]
        .as_str()
        .expect("session")
        .to_string()
}

fn peer_dones<'a>(events: &'a [Value], session: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|v| v["event"] == "peer_done" && v["session"] == session)
        .collect()
}

fn pick(dir: Dir, kind: Option<u8>, nth: u64) -> Pick {
    Pick { dir, kind, nth }
}

// ---------------------------------------------------------------- probe

#[test]
fn a_silent_server_is_found_before_any_data_is_sent() {
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    // 10 GB at 900 Mbit/s would take 89 s.
    let out = client_outcome(&["-s", &addr, "-t", "10G", "--rate", "900Mbit"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.elapsed < Duration::from_secs(5),
        "took {:?}",
        out.elapsed
    );
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("no udp_server answered"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("--no-server"), "{}", out.stderr);
    // Only Hellos (64 bytes each) reached the silent socket, never data:
    // the load's (which name its run, bytes 40..48), and the round-trip
    // prober's, which says Hello until it has a cookie to probe with.
    silent.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 65536];
    let (mut hellos, mut round_trips) = (0, 0);
    while let Ok(n) = silent.recv(&mut buf) {
        match (n, buf[5]) {
            (64, 3) if buf[40..48] != [0; 8] => hellos += 1,
            (64, 3) => round_trips += 1,
            other => panic!("only 64-byte Hellos (kind 3): {other:?}"),
        }
    }
    assert!((1..=5).contains(&hellos), "{hellos} Hellos");
    // 20 a second, for the idle second and the Hello's wait.
    assert!(round_trips <= 50, "{round_trips} round-trip probes");
}

#[test]
fn a_server_that_dies_mid_test_is_reported_with_the_sender_side() {
    // Interval lines on, so that the server says when the test is under way.
    let server = Server::start_args(&args("--listen 127.0.0.1:0 --interval 100ms"));
    let addr = server.addr.clone();
    let run = std::thread::spawn(move || {
        client_outcome(&args_to(&addr, "-b 1000 --duration 8s --rate 20Mbit"))
    });
    server.find("an interval line: data is arriving", |v| {
        v["event"] == "interval"
    });
    drop(server); // SIGKILL: it vanishes without a word
    let out = run.join().unwrap();
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(
        out.elapsed < Duration::from_secs(6),
        "kept sending: {:?}",
        out.elapsed
    );
    let report = out.report.expect("the report is still printed");
    let c = &report["clients"][0];
    assert_eq!(c["answer"], "server_gone", "{report}");
    assert!(u(c, "sent_packets") > 0);
    assert!(report["server"].is_null());
    assert_eq!(report["complete"], false);
    assert!(
        report["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("went away")),
        "{report}"
    );
}

#[test]
fn a_name_that_does_not_resolve_is_a_runtime_failure() {
    let out = run_bounded(
        Command::new(CLIENT).args(["-s", "no-such-host.invalid:80"]),
        common::udp::WAIT,
    );
    common::one_line_error(
        &out,
        1,
        "cannot resolve 'no-such-host.invalid'",
        "unresolvable name",
    );
}

// ---------------------------------------------------------------- rates

#[test]
fn rates_count_the_gaps_not_the_datagrams() {
    // 10 datagrams of 1250 bytes at 100 kbit/s: 100 ms apart, 900 ms from
    // the first to the last. Counting all 10 over 9 gaps reads 111 kbit/s.
    // (Gaps this long keep scheduling noise far below the 3 % allowed.)
    let server = Server::start("127.0.0.1:0", &[]);
    let report = server.client("-b 1250 -n 10 --rate 100kbit");
    let done = server.done_for(&session(&report));
    for (side, gbps) in [
        ("receiver", done["gbps"].as_f64()),
        ("answer", report["server"]["gbps"].as_f64()),
        ("sender", report["gbps"].as_f64()),
    ] {
        let gbps = gbps.unwrap_or_else(|| panic!("{side}: no rate in {report}"));
        assert!(
            (gbps / 0.0001 - 1.0).abs() < 0.03,
            "{side}: {gbps} Gbit/s for 100 kbit/s"
        );
    }
}

#[test]
fn a_burst_too_short_for_a_rate_has_none() {
    let server = Server::start("127.0.0.1:0", &[]);
    let report = client(&["-s", &server.addr, "-b", "1000", "-n", "3"]);
    let done = server.done_for(&session(&report));
    assert_eq!(u(&done, "packets"), 3);
    // Unknown exactly when the span is under 1 ms (a client preempted
    // between its three sends can make it longer): a receive rate's span
    // is the longer of the arrivals' and the sender's.
    let short = |v: &Value| v["seconds"].as_f64().unwrap() < 0.001;
    let both_short = |v: &Value| short(v) && short(&report);
    assert_eq!(done["gbps"].is_null(), both_short(&done), "{done}");
    assert_eq!(done["pps"].is_null(), both_short(&done), "{done}");
    let answer = &report["server"];
    assert_eq!(answer["gbps"].is_null(), both_short(answer), "{report}");
    assert_eq!(report["gbps"].is_null(), short(&report), "{report}");
    // One datagram has no span at all: the text says the rate is unknown.
    let text = run_bounded(
        Command::new(CLIENT).args(["-s", &server.addr, "-b", "1000", "-n", "1"]),
        common::udp::WAIT,
    );
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("rate unknown"), "{text}");
}

// ---------------------------------------------------------------- totals

#[test]
fn totals_are_total_bytes_over_the_time_they_span() {
    let server = Server::loopback();
    // --no-gso: the first arrival per client is one datagram (with GRO it
    // would be a buffer of up to 46), which the slack below relies on.
    let report = server.client("-b 1400 -t 5M --clients 3 --no-gso");
    let total = &report["server"];
    let received = u(total, "received_bytes");
    let seconds = total["seconds"].as_f64().unwrap();
    let gbps = total["gbps"].as_f64().expect("a rate over the run");
    // bytes after the first arrival = rate × span: at most one datagram
    // per client arrived at the first instant.
    let after_first = gbps * 1e9 / 8.0 * seconds;
    let slack = 3.0 * 1400.0 + 1.0;
    assert!(
        after_first <= received as f64 + 1.0 && after_first >= received as f64 - slack,
        "{gbps} Gbit/s × {seconds} s = {after_first} bytes, received {received}: {report}"
    );
    let clients = report["clients"].as_array().unwrap();
    let longest = clients
        .iter()
        .map(|c| c["server"]["seconds"].as_f64().unwrap())
        .fold(0.0, f64::max);
    // The union of the spans: never shorter than any one of them (equal
    // when one session started first and ended last).
    assert!(seconds >= longest, "{seconds} < {longest}");
    // Sender side: the same definition over send calls; a client's first
    // call is one sendmmsg batch of at most 32 datagrams.
    let sent = u(&report, "sent_bytes") as f64;
    let sent_after =
        report["gbps"].as_f64().unwrap() * 1e9 / 8.0 * report["seconds"].as_f64().unwrap();
    let first_calls = 3.0 * 32.0 * 1400.0 + 1.0;
    assert!(
        sent_after <= sent + 1.0 && sent_after >= sent - first_calls,
        "{report}"
    );
    // Kernel drops: the socket's, once, at the top; none per client.
    for c in clients {
        assert!(c["server"].get("kernel_drops").is_none(), "{c}");
        assert!(c["server"]["socket_wide_kernel_drops"].is_u64(), "{c}");
    }
    assert!(total.get("kernel_drops").is_none(), "{total}");
    assert!(total["socket_wide_kernel_drops"].is_u64(), "{total}");
}

// ---------------------------------------------------------------- intervals

#[test]
fn interval_lines_add_up_to_the_summary() {
    let server = Server::start_args(&args(
        "--listen 127.0.0.1:0 --interval 300ms --recv-buffer-size 4M",
    ));
    let report = server.client("-b 1000 --duration 1s --rate 50Mbit");
    let session = session(&report);
    let done = server.done_for(&session);
    let events = server.stop();
    let intervals: Vec<&Value> = events
        .iter()
        .filter(|v| v["event"] == "interval" && v["session"] == session.as_str())
        .collect();
    assert!(intervals.len() >= 3, "{intervals:?}");
    let packets: u64 = intervals.iter().map(|v| u(v, "packets")).sum();
    let bytes: u64 = intervals.iter().map(|v| u(v, "bytes")).sum();
    assert_eq!((packets, bytes), (u(&done, "packets"), u(&done, "bytes")));
    assert_eq!(packets, u(&report, "sent_packets"));
}

// ---------------------------------------------------------------- GRO

#[test]
fn the_gro_label_says_what_was_observed() {
    // GRO is on (the default), but a sender without GSO sends datagrams the
    // kernel never coalesces: its drops are datagrams.
    let server = Server::loopback();
    let plain = server.client("-b 1400 -n 2000 --rate 200Mbit --no-gso");
    let done = server.done_for(&session(&plain));
    assert_eq!(u(&done, "gro_buffers"), 0, "{done}");
    assert_eq!(done["kernel_drops_unit"], "datagrams", "{done}");
    assert_eq!(plain["server"]["kernel_drops_unit"], "datagrams");
    // A GSO sender's buffers arrive whole: its drops are buffers.
    let gso = server.client("-b 1400 -n 2000 --rate 200Mbit --gso");
    let done = server.done_for(&session(&gso));
    assert!(u(&done, "gro_buffers") > 0, "{done}");
    assert_eq!(done["kernel_drops_unit"], "buffers", "{done}");
    assert_eq!(u(&done, "packets"), 2000);
}

// ---------------------------------------------------------------- relay

#[test]
fn a_lost_first_answer_is_answered_again_from_the_record() {
    // The first answer is lost and a data datagram arrives 400 ms late;
    // the retry comes 3 s later (--end-timeout 15s). Before, the session
    // had been forgotten after 2 s and the retry read "received 0".
    let server = Server::loopback();
    let relay = server.relay(&[
        (pick(Dir::ToClient, END_ACK, 0), Action::Drop),
        (
            pick(Dir::ToServer, DATA, 100),
            Action::Delay(Duration::from_millis(400)),
        ),
    ]);
    let target = relay.addr().to_string();
    let report = client(&args_to(&target, "-b 1000 -n 200 --end-timeout 15s"));
    let counts = relay.finish();
    let session = session(&report);
    let events = server.stop();
    let dones = peer_dones(&events, &session);
    assert_eq!(dones.len(), 1, "one summary per session: {dones:?}");
    let done = dones[0];
    let answer = &report["server"];
    assert_eq!(counts.dropped(Dir::ToClient, END_ACK), 1);
    assert_eq!(counts.delayed_seqs(), [100]);
    // The answer to the retry is the summary's, and the delayed datagram is
    // late in both.
    assert_eq!(u(answer, "received_packets"), u(done, "packets"));
    assert_eq!(u(answer, "lost_packets"), u(done, "lost"));
    assert_eq!(
        answer.get("kernel_drops"),
        done.get("kernel_drops"),
        "the retry's answer says what the summary said, drops included"
    );
    assert_eq!(u(answer, "received_packets"), 199, "{report}");
    assert_eq!(u(answer, "lost_packets"), 1);
    assert_eq!(u(answer, "late"), 1, "{report}");
    let late: Vec<&Value> = events
        .iter()
        .filter(|v| v["event"] == "late" && v["session"] == session.as_str())
        .collect();
    assert_eq!(u(late.last().expect("a late event"), "late_packets"), 1);
}

#[test]
fn a_straggler_after_the_end_is_late_not_a_new_peer() {
    let server = Server::loopback();
    let relay = server.relay(&[(
        pick(Dir::ToServer, DATA, 50),
        Action::Delay(Duration::from_secs(3)),
    )]);
    let report = client(&["-s", &relay.addr().to_string(), "-b", "1000", "-n", "150"]);
    // The delayed datagram goes out last; the counts below say if it did not.
    common::poll_every(Duration::from_millis(50), Duration::from_secs(10), || {
        relay.stats().forwarded(Dir::ToServer, DATA) >= 150
    });
    let counts = relay.finish();
    assert_eq!(counts.delayed_seqs(), [50]);
    let session = session(&report);
    let late = server.find("late event", |v| {
        v["event"] == "late" && v["session"] == session.as_str()
    });
    assert_eq!(u(&late, "late_packets"), 1, "{late}");
    assert_eq!(u(&report["server"], "lost_packets"), 1);
    let events = server.stop();
    assert_eq!(peer_dones(&events, &session).len(), 1);
    assert_eq!(
        events.iter().filter(|v| v["event"] == "peer_done").count(),
        1,
        "no other peer appeared: {events:?}"
    );
    let down = events.last().unwrap();
    assert_eq!(u(down, "late_packets"), 1, "{down}");
}

#[test]
fn a_late_duplicate_cannot_hide_a_loss() {
    // The relay drops seq 10 and repeats seq 20 after 4980 more datagrams:
    // a 4096-datagram window took the copy for the lost one.
    let server = Server::loopback();
    let relay = server.relay(&[
        (pick(Dir::ToServer, DATA, 10), Action::Drop),
        (pick(Dir::ToServer, DATA, 20), Action::RepeatAfter(4980)),
    ]);
    let report = client(&args_to(
        &relay.addr().to_string(),
        "-b 200 -n 6000 --rate 100Mbit",
    ));
    let counts = relay.finish();
    assert_eq!(counts.dropped_seqs(), [10]);
    assert_eq!(counts.repeated_seqs(), [20]);
    let answer = &report["server"];
    let done = server.done_for(&session(&report));
    for v in [answer, &done] {
        assert_eq!(v["duplicates"], 1, "{v}");
        assert_eq!(v["reordered"], 0, "{v}");
    }
    assert_eq!(u(answer, "lost_packets"), 1);
    assert_eq!(u(&done, "lost"), 1);
    assert_eq!(u(answer, "received_packets"), 5999);
}

#[test]
fn data_just_behind_the_end_is_counted() {
    // The last datagram reaches the server 50 ms after the End (a grace
    // period of 1 s keeps a loaded machine from making this a race).
    let server = Server::start(
        "127.0.0.1:0",
        &["--recv-buffer-size", "4M", "--end-grace", "1s"],
    );
    let relay = server.relay(&[(
        pick(Dir::ToServer, DATA, 199),
        Action::Delay(Duration::from_millis(50)),
    )]);
    let report = client(&["-s", &relay.addr().to_string(), "-b", "1000", "-n", "200"]);
    let counts = relay.finish();
    assert_eq!(counts.delayed_seqs(), [199]);
    let done = server.done_for(&session(&report));
    assert_eq!(u(&report["server"], "lost_packets"), 0, "{report}");
    assert_eq!(u(&report["server"], "received_packets"), 200);
    assert_eq!(u(&done, "packets"), 200);
    assert_eq!(u(&done, "lost"), 0);
}

#[test]
fn a_test_without_an_answer_exits_3_with_the_sender_side() {
    let server = Server::start("127.0.0.1:0", &[]);
    let rules: Vec<(Pick, Action)> = (0..10)
        .map(|n| (pick(Dir::ToClient, END_ACK, n), Action::Drop))
        .collect();
    let relay = server.relay(&rules);
    let out = client_outcome(&args_to(
        &relay.addr().to_string(),
        "-b 1000 -n 100 --end-timeout 500ms",
    ));
    let counts = relay.finish();
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    let report = out.report.expect("a report");
    assert_eq!(u(&report, "sent_packets"), 100);
    assert_eq!(report["clients"][0]["answer"], "no_answer");
    assert!(report["server"].is_null());
    assert!(counts.dropped(Dir::ToClient, END_ACK) >= 1);
    assert_eq!(counts.forwarded(Dir::ToClient, END_ACK), 0);
}

#[test]
fn a_forged_far_sequence_number_cannot_wrap_the_loss() {
    // One datagram with seq 2^64 - 1 in the client's session, sent from its
    // address (through the relay) in the middle of the run.
    let server = Server::start_args(&args(
        "--listen 127.0.0.1:0 --interval 100ms --recv-buffer-size 4M",
    ));
    let relay = server.relay(&[]);
    let target = relay.addr().to_string();
    let run = std::thread::spawn(move || {
        client(&[
            "-s", &target, "-b", "1000", "-n", "3000", "--rate", "40Mbit",
        ])
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while relay.stats().forwarded(Dir::ToServer, DATA) < 500 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    // The session's Hello (the round-trip probes come first, from a
    // socket and session of their own).
    let stats = relay.stats();
    let hello = stats.load_hello().expect("the load's Hello").to_vec();
    let mut forged = vec![0u8; 1000];
    forged[..16].copy_from_slice(&hello[..16]);
    forged[5] = 0; // Data
    forged[6..8].copy_from_slice(&[0, 0]);
    forged[16..24].copy_from_slice(&u64::MAX.to_be_bytes());
    relay.inject_to_server(&forged);
    let report = run.join().unwrap();
    relay.finish();
    let session = session(&report);
    let done = server.done_for(&session);
    let events = server.stop();
    for v in events
        .iter()
        .filter(|v| v["session"] == session.as_str() && v.get("lost").is_some())
    {
        assert!(u(v, "lost") <= 3000, "{v}");
    }
    assert_eq!(u(&done, "lost"), 0, "{done}");
    assert_eq!(u(&done, "unexpected"), 1, "{done}");
    assert_eq!(u(&report["server"], "unexpected"), 1, "{report}");
}

// ------------------------------------------------------- queue baseline

/// Issue 41: a delay that steps down mid-run (the relay holds the first
/// 2,500 data datagrams 2 ms, then none) is a minimum that comes late.
/// Every figure uses one baseline: the summary's percentiles lie within
/// its interval lines' (it is their datagrams taken together), the
/// summary's max is an interval's max, and the fall of the floor is said
/// (about the 2 ms the relay stopped holding).
#[test]
fn a_late_minimum_changes_no_figure_already_shown_and_is_said() {
    const HELD: u64 = 2500;
    // Interval lines every second (the test servers' default is none).
    let server = Server::start_args(&["--listen", "127.0.0.1:0", "--recv-buffer-size", "4M"]);
    let rules: Vec<(Pick, Action)> = (0..HELD)
        .map(|n| {
            (
                pick(Dir::ToServer, DATA, n),
                Action::Delay(Duration::from_millis(2)),
            )
        })
        .collect();
    let relay = server.relay(&rules);
    let target = relay.addr().to_string();
    // 1,250 datagrams a second for 4 s: two held seconds, two free.
    let report = client(&args_to(&target, "-b 1000 -n 5000 --rate 10Mbit"));
    let counts = relay.finish();
    assert_eq!(counts.delayed(Dir::ToServer, DATA), HELD);
    let session = session(&report);
    let events = server.stop();
    let intervals: Vec<&Value> = events
        .iter()
        .filter(|v| v["event"] == "interval" && v["session"] == session.as_str())
        .filter(|v| u(v, "packets") > 0)
        .collect();
    assert!(intervals.len() >= 3, "{intervals:?}");
    let done = peer_dones(&events, &session)[0];
    let q = |v: &Value, k: &str| {
        v["queue_delay_ms"][k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k}: {v}"))
    };
    let p50s: Vec<f64> = intervals.iter().map(|v| q(v, "p50")).collect();
    let lowest = p50s.iter().copied().fold(f64::MAX, f64::min);
    let highest = p50s.iter().copied().fold(0.0, f64::max);
    // Histogram buckets: exact to the microsecond below 256 us, 1 % above.
    let slack = 0.002 + 0.01 * highest;
    let summary = q(done, "p50");
    assert!(
        summary >= lowest - slack && summary <= highest + slack,
        "the summary's p50 {summary} ms lies within its intervals' {p50s:?}: {done}"
    );
    let max = intervals.iter().map(|v| q(v, "max")).fold(0.0, f64::max);
    assert!(
        (q(done, "max") - max).abs() <= slack.max(0.01 * max),
        "the summary's max is its intervals' largest ({max}): {done}"
    );
    let shown = q(&report["streams"][0]["latency"], "p50");
    assert!(
        (shown - summary).abs() < 0.001,
        "the client shows the server's summary ({shown}): {report}"
    );
    let fell = done["queue_baseline_drop_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("the fall of the floor is said: {done}"));
    assert!(
        (1.5..4.0).contains(&fell),
        "the floor fell by the 2 ms hold: {fell} {done}"
    );
}
