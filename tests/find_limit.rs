//! `udp_client --find-limit` and the `limited_by` verdict (issue 17), each
//! against a limit built on purpose between two hosts (network
//! namespaces joined by a veth pair), and checked against a witness that
//! netspeed does not control:
//!
//! - an nftables policer on the server host's input: the limit found must
//!   be the policer's rate net of the header bytes it counts, and the
//!   policer's own drop counter must equal the datagrams the trials lost;
//! - a tbf qdisc on the client's link: the cause must be the sender's
//!   queue, and the qdisc's drops must equal the ENOBUFS back-offs;
//! - a small receive buffer on the server: the cause must be the buffer,
//!   and `/proc/net/snmp`'s RcvbufErrors must equal the kernel drops.
//!
//! The searches run one at a time ([`ONE_AT_A_TIME`]): a search measures
//! the machine, and two at once would each see the other's load.

mod common;

use common::impair::{
    delta, nft_apply, nft_counter, read_snmp, require_nft, require_tc, tbf_alone, tc_drops,
};
use common::netns::Netns;
use common::run_bounded;
use common::udp::{args_to, client_in, client_json, f, u, Hosts, Server, CLIENT};
use serde_json::Value;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Holds [`ONE_AT_A_TIME`] for the test's length (a failed test does not
/// poison it for the others).
fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Two hosts on `subnet`.0/24 and a udp_server on the first (`.1`), with
/// `--recv-buffer-size recv_buffer`.
fn served(tag: &str, subnet: &str, recv_buffer: &str) -> Hosts {
    // SCHED_FIFO, as the searching clients below: a limit of the path,
    // not of the machine's load (a reverse trial's sender is the server).
    common::udp::served(
        tag,
        subnet,
        &[
            "--recv-buffer-size",
            recv_buffer,
            "--scheduler",
            "fifo",
            "--priority",
            "10",
        ],
    )
}

/// The searching client's scheduling: SCHED_FIFO, so that a CPU burner
/// (or a build) beside the test cannot deschedule the paced sender. A
/// CFS sender beside two burners fell behind its pacing by 10-25 % in
/// most trials, at 5-15 % of a core, and the search measured the
/// scheduler, not the path.
const FIFO: &str = "--scheduler fifo --priority 10";

/// Runs `udp_client -s TARGET --find-limit REST --scheduler fifo
/// --priority 10 --json` in `ns`; its JSON report, checked for a search
/// the machine's load stopped ([`not_descheduled`]).
fn find_limit_in(ns: &Netns, target: &str, rest: &str) -> Value {
    let mut cmd = ns.cmd(CLIENT);
    cmd.arg("--find-limit");
    let rest = format!("{rest} {FIFO}");
    let report = client_json(cmd, &args_to(target, &rest), Duration::from_secs(240));
    not_descheduled(&report);
    report
}

/// The search was not stopped by a sender that fell behind while
/// descheduled (`limit.descheduled_at_bps`): if it was, this machine was
/// too busy to produce the condition the test needs (a sender that holds
/// its pacing), even for a SCHED_FIFO sender, and the test fails saying
/// so rather than judging a search that measured the scheduler.
fn not_descheduled(report: &Value) {
    let at = &report["limit"]["descheduled_at_bps"];
    assert!(
        at.is_null(),
        "MACHINE TOO BUSY: the search stopped at {at} bit/s because the sender fell behind its \
         pacing there in every try while descheduled (see the trials' sent_bps and \
         sender_cpu_percent); the path was not measured: {report}"
    );
}

/// Runs `udp_client --local --find-limit ARGS... EXTRA` (a short search
/// on loopback) and returns its stdout; panics unless it exits 0.
fn local_search(args: &str, extra: &[&str]) -> String {
    let out = run_bounded(
        std::process::Command::new(CLIENT)
            .args(["--local", "--find-limit"])
            .args(common::args(args))
            .args(extra),
        Duration::from_secs(120),
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The limit found, printed for docs/testing.md and checked to lie
/// between `low` and `high` times `expected` (bit/s).
fn assert_found(report: &Value, what: &str, expected: f64, low: f64, high: f64) -> f64 {
    let found = f(&report["limit"], "rate_bps");
    eprintln!(
        "FIGURE {what}: expected {expected:.0} bit/s, {}",
        limit_figure(report)
    );
    assert!(
        found >= expected * low && found <= expected * high,
        "{what}: found {found} bit/s, expected {expected:.0} (x{low}..x{high}): {report}"
    );
    found
}

fn trials(report: &Value) -> &Vec<Value> {
    report["trials"].as_array().expect("trials")
}

/// The sum of `key` over all trials.
fn sum(report: &Value, key: &str) -> u64 {
    trials(report).iter().map(|t| u(t, key)).sum()
}

fn limit_figure(report: &Value) -> String {
    let l = &report["limit"];
    format!(
        "limit {} bit/s, first loss at {} ({}), {} trials",
        l["rate_bps"], l["first_loss_at_bps"], l["first_loss_cause"], l["trials"]
    )
}

/// Every trial's figures are consistent with its own verdict.
fn check_trials(report: &Value) {
    for t in trials(report) {
        let passed = t["passed"].as_bool().expect("passed");
        assert_eq!(passed, t["cause"].is_null(), "{t}");
        assert_eq!(
            u(t, "lost_packets") + u(t, "received_packets"),
            u(t, "sent_packets"),
            "a trial's datagrams are received or lost: {t}"
        );
        if passed {
            assert_eq!(f(t, "loss_percent"), 0.0, "{t}");
        }
    }
}

// ---------------------------------------------------------------------------
// An nftables policer on the server's input.
// ---------------------------------------------------------------------------

/// The policer's rate, 2 MiB/s (nft's "mbytes" are MiB), and its burst.
const RATE: f64 = 2.0 * 1024.0 * 1024.0;
const BURST: f64 = 16.0 * 1024.0;

/// Polices, on `ns`'s input, the 1400-byte datagrams (IP length 1428, UDP
/// length 1408) whose `dir` port ("dport" or "sport") is `port`, at
/// [`RATE`] with [`BURST`]: only data is policed, so a Hello or an End is
/// never dropped. Its counter counts the drops.
fn police(ns: &Netns, dir: &str, port: u16) {
    nft_apply(
        ns,
        &format!(
            "table inet pol {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    \
             udp {dir} {port} udp length 1408 limit rate over 2 mbytes/second burst 16 kbytes counter drop\n  }}\n}}\n"
        ),
    );
}

#[test]
fn policer_limit_is_found_and_its_drops_are_the_loss() {
    require_nft();
    let _one = one_at_a_time();
    let Hosts {
        srv,
        cli,
        server,
        target,
        ..
    } = served("fl1", "10.67.1", "8M");
    let port = server.port();
    police(&srv, "dport", port);
    // The verdict of an ordinary run at twice the policer's rate.
    let run = client_in(
        &cli,
        &args_to(&target, "-b 1400 --rate 40Mbit --duration 3s --no-gso"),
    );
    assert_eq!(run["limited_by"]["cause"], "network", "{run}");
    let (dropped_by_run, _) = nft_counter(&srv, "inet", "pol");
    assert_eq!(
        dropped_by_run,
        u(&run["server"], "lost_packets"),
        "the policer's drops are the run's loss: {run}"
    );
    // The search. --no-gso: one datagram per packet, so the policer's
    // packet counter counts datagrams.
    let report = find_limit_in(
        &cli,
        &target,
        // SCHED_FIFO (find_limit_in): the policer's limit, not the
        // machine's load. Beside a CPU burner and two builds a CFS sender
        // fell 3 % behind at 21.8 Mbit/s and the search stopped there
        // (0.65 of the limit).
        "-b 1400 --no-gso --trial-duration 1s --trial-pause 1.2s --resolution 3 --confirm 1",
    );
    check_trials(&report);
    let (dropped, _) = nft_counter(&srv, "inet", "pol");
    assert_eq!(
        dropped - dropped_by_run,
        sum(&report, "lost_packets"),
        "the policer's drop counter equals the datagrams the trials lost: {report}"
    );
    // nft's byte limit lets through, in a trial of T seconds after a full
    // refill, T seconds of its rate plus its bucket (one second of rate
    // plus the burst): the no-drop payload rate is that, net of the 28
    // header bytes per datagram it counts.
    let t = 1.0;
    let expected = 8.0 * (RATE * (t + 1.0) + BURST) / t * 1400.0 / 1428.0;
    // Within the resolution (3 %), and 3 % for the pacer's and the
    // bucket's granularity.
    let found = assert_found(&report, "policer", expected, 0.94, 1.02);
    let l = &report["limit"];
    assert!(f(l, "first_loss_at_bps") > found, "{report}");
    assert_eq!(l["confirmed"], true, "{report}");
    // Every loss was the policer's: no trial blamed the server's buffer or
    // the sender's queue (a try the sender fell behind in is `sender_cpu`,
    // and was repeated). The first failure above the limit is the
    // network's: a sender descheduled in every try stops the search
    // instead (find_limit_in fails on that, saying so), and never counts
    // as the path's failure.
    let causes: Vec<&str> = trials(&report)
        .iter()
        .filter_map(|t| t["cause"].as_str())
        .collect();
    assert!(causes.contains(&"network"), "{report}");
    assert!(
        causes.iter().all(|c| *c == "network" || *c == "sender_cpu"),
        "{causes:?}: {report}"
    );
    assert_eq!(l["first_loss_cause"], "network", "{report}");
}

#[test]
fn reverse_search_finds_a_downstream_policer() {
    // The same policer, on the client's input: only the download direction
    // (-R: the server sends) meets it.
    require_nft();
    let _one = one_at_a_time();
    let Hosts {
        srv: _srv,
        cli,
        server,
        target,
        ..
    } = served("fl5", "10.67.5", "8M");
    let port = server.port();
    police(&cli, "sport", port);
    let report = find_limit_in(
        &cli,
        &target,
        "-R -b 1400 --no-gso --trial-duration 1s --trial-pause 1.2s --resolution 3 --confirm 1",
    );
    check_trials(&report);
    let (dropped, _) = nft_counter(&cli, "inet", "pol");
    assert_eq!(
        dropped,
        sum(&report, "lost_packets"),
        "the policer's drops on the client's side are the loss the reverse trials counted: {report}"
    );
    let t = 1.0;
    let expected = 8.0 * (RATE * (t + 1.0) + BURST) / t * 1400.0 / 1428.0;
    let found = assert_found(&report, "downstream policer", expected, 0.94, 1.02);
    assert!(f(&report["limit"], "first_loss_at_bps") > found, "{report}");
}

// ---------------------------------------------------------------------------
// A tbf on the client's link: the sender's own queue is the limit.
// ---------------------------------------------------------------------------

#[test]
fn tbf_on_the_client_link_is_the_senders_queue() {
    require_tc();
    let _one = one_at_a_time();
    let Hosts {
        srv: _srv,
        cli,
        cli_dev,
        server: _server,
        target,
    } = served("fl2", "10.67.2", "8M");
    tbf_alone(&cli, &cli_dev, "50mbit", "16kb", "32kb");
    let before = tc_drops(&cli, &cli_dev);
    // An ordinary run paced above the shaper: the verdict.
    let run = client_in(
        &cli,
        &args_to(&target, "-b 1400 --rate 80Mbit --duration 2s --no-gso"),
    );
    assert_eq!(run["limited_by"]["cause"], "sender_queue", "{run}");
    assert_eq!(u(&run["server"], "lost_packets"), 0, "{run}");
    let after_run = tc_drops(&cli, &cli_dev);
    assert_eq!(after_run - before, u(&run, "enobufs_retries"), "{run}");
    // --no-gso: tbf drops a GSO buffer larger than its burst segment by
    // segment, without ENOBUFS; one datagram per packet keeps every drop
    // a back-off.
    let report = find_limit_in(
        &cli,
        &target,
        "-b 1400 --no-gso --trial-duration 1s --trial-pause 0.2s --resolution 3 --confirm 1",
    );
    check_trials(&report);
    assert_eq!(
        tc_drops(&cli, &cli_dev) - after_run,
        sum(&report, "enobufs_retries"),
        "the qdisc's drops are the trials' back-offs: {report}"
    );
    assert_eq!(
        sum(&report, "lost_packets"),
        0,
        "back-off loses nothing: {report}"
    );
    // tbf counts the Ethernet frame: 1400 + 28 + 14 bytes per datagram.
    let expected = 50e6 * 1400.0 / 1442.0;
    assert_found(&report, "tbf", expected, 0.94, 1.04);
    let l = &report["limit"];
    assert_eq!(l["first_loss_cause"], "sender_queue", "{report}");
    assert!(u(&l["first_loss"], "enobufs_retries") > 0, "{report}");
}

// ---------------------------------------------------------------------------
// A small receive buffer on the server: kernel drops.
// ---------------------------------------------------------------------------

#[test]
fn small_receive_buffer_is_the_kernel_drop_cause() {
    let _one = one_at_a_time();
    let Hosts {
        srv,
        cli,
        server: _server,
        target,
        ..
    } = served("fl3", "10.67.3", "64K");
    let snmp_before = read_snmp(&srv, "Udp");
    // An ordinary unpaced run overflows the buffer: the verdict.
    let run = client_in(&cli, &args_to(&target, "-b 1400 --duration 1s"));
    let cause = run["limited_by"]["cause"].as_str().unwrap_or("");
    assert!(
        cause == "receive_buffer" || cause == "receiver_cpu",
        "{cause}: {run}"
    );
    let run_drops = u(&run["server"], "kernel_drops");
    assert!(run_drops > 0, "{run}");
    let report = find_limit_in(
        &cli,
        &target,
        "-b 1400 --trial-duration 0.5s --trial-pause 0.2s --resolution 5 --confirm 1",
    );
    check_trials(&report);
    let snmp_after = read_snmp(&srv, "Udp");
    let drops: u64 = trials(&report)
        .iter()
        .map(|t| {
            t["kernel_drops"]
                .as_u64()
                .expect("kernel drops known on Linux")
        })
        .sum();
    assert_eq!(
        delta(&snmp_before, &snmp_after, "RcvbufErrors"),
        run_drops + drops,
        "the kernel's RcvbufErrors are the drops the server reported: {report}"
    );
    let l = &report["limit"];
    eprintln!("FIGURE small buffer: {}", limit_figure(&report));
    assert_eq!(l["first_loss_cause"], "receive_buffer", "{report}");
    assert!(u(&l["first_loss"], "kernel_drops") > 0, "{report}");
    assert!(l["rate_bps"].as_u64().is_some(), "{report}");
}

// ---------------------------------------------------------------------------
// Verdicts that need no special host: pacing, and an unpaced run.
// ---------------------------------------------------------------------------

#[test]
fn paced_and_unpaced_loopback_runs_name_their_cap() {
    let _one = one_at_a_time();
    let Hosts {
        srv: _srv,
        cli,
        server: _server,
        target,
        ..
    } = served("fl4", "10.67.4", "8M");
    // SCHED_FIFO: beside two burners a CFS sender fell 44 ms behind its
    // pacing, and the verdict rightly said "descheduled", not "paced".
    let paced = client_in(
        &cli,
        &args_to(
            &target,
            &format!("-b 1400 --rate 200Mbit --duration 1s {FIFO}"),
        ),
    );
    assert_eq!(paced["limited_by"]["cause"], "paced", "{paced}");
    assert!(
        paced["limited_by"]["text"]
            .as_str()
            .unwrap()
            .contains("200.0 Mbit/s"),
        "{paced}"
    );
    // Unpaced on loopback: whatever capped it, the verdict must match its
    // figures.
    let run = Server::loopback().client("-b 1400 --duration 2s");
    let v = &run["limited_by"];
    let cpu = |x: &Value| x["cpu"]["percent_of_core"].as_f64().unwrap_or(0.0);
    let lost = u(&run["server"], "lost_packets");
    match v["cause"].as_str().unwrap() {
        "sender_cpu" => {
            assert_eq!(lost, 0, "{run}");
            assert!(cpu(&run["clients"][0]) >= 90.0, "{run}");
        }
        "receiver_cpu" => assert!(cpu(&run["server"]) >= 90.0, "{run}"),
        "receive_buffer" => assert!(u(&run["server"], "kernel_drops") > 0, "{run}"),
        "unknown" => {
            assert_eq!(lost, 0, "{run}");
            assert!(
                cpu(&run["clients"][0]) < 90.0 && cpu(&run["server"]) < 90.0,
                "{run}"
            );
        }
        other => panic!("an unpaced run over a clean link capped by {other}: {run}"),
    }
    eprintln!("FIGURE unpaced loopback: {}", v["text"]);
}

// ---------------------------------------------------------------------------
// As a user meets it: --local, text, --plot, and bad input.
// ---------------------------------------------------------------------------

#[test]
fn local_find_limit_prints_every_trial_and_draws_the_plot() {
    let _one = one_at_a_time();
    let dir = common::TempDir::new("netspeed-findlimit");
    let svg = dir.path().join("limit.svg");
    // SCHED_FIFO: on loopback the CPU is the only limit, and beside two
    // burners a CFS sender fell behind at 6.8 Gbit/s in every try, so
    // the search stopped there (rightly) with no rate to print.
    let text = local_search(
        &format!("-b 1460 --trial-duration 0.2s --trial-pause 0s --resolution 10 --confirm 1 {FIFO} --plot"),
        &[svg.to_str().unwrap()],
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("find-limit to 127.0.0.1:"), "{text}");
    let trial_lines: Vec<&&str> = lines
        .iter()
        .filter(|l| {
            l.trim_start()
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        })
        .collect();
    assert!(trial_lines[0].contains("unpaced"), "{text}");
    let search = lines
        .iter()
        .find(|l| l.starts_with("search "))
        .unwrap_or_else(|| panic!("no search line: {text}"));
    // "search    N trials ...": one line per trial, repeats included,
    // numbered 1..=N in order.
    let n: usize = search.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_eq!(trial_lines.len(), n, "{text}");
    for (i, line) in trial_lines.iter().enumerate() {
        let index: usize = line.split_whitespace().next().unwrap().parse().unwrap();
        assert_eq!(index, i + 1, "{text}");
    }
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("limit     no-drop rate")),
        "{text}"
    );
    let drawn = std::fs::read_to_string(&svg).expect("the plot was written");
    assert!(
        drawn.contains("<svg") && drawn.contains("offered"),
        "{drawn}"
    );
}

#[test]
fn find_limit_bad_input_exits_2_with_one_line() {
    let dir = common::TempDir::new("netspeed-findlimit-bad");
    let no_server = dir.file("no-server.toml", "no_server = true\n");
    let no_server = no_server.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--loss-tolerance", "1"], "--find-limit"),
        (&["--find-limit", "--rate", "1G"], "--rate"),
        (&["--find-limit", "-t", "1G"], "--total-send"),
        (&["--find-limit", "--loss-tolerance", "101"], "101"),
        (&["--find-limit", "--resolution", "0"], "--resolution"),
        (
            &["--find-limit", "--trial-duration", "10ms"],
            "--trial-duration",
        ),
        (&["--find-limit", "--max-trials", "1"], "--max-trials"),
        (&["--find-limit", "--confirm", "500"], "--confirm"),
        (&["--max-delay", "10ms"], "--find-limit"),
        (&["--idle-probe", "2h"], "--idle-probe"),
        (&["--find-limit", "-b", "0"], "--buffer-size"),
        (&["--find-limit", "--config", no_server], "no_server"),
    ];
    for (args, mention) in cases {
        let out = run_bounded(
            std::process::Command::new(CLIENT).args(*args),
            Duration::from_secs(20),
        );
        common::one_line_error(&out, 2, mention, &format!("{args:?}"));
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn json_stream_gives_one_event_per_trial_then_the_report() {
    let _one = one_at_a_time();
    let text = local_search(
        "--json-stream -b 1460 --trial-duration 0.2s --trial-pause 0s --resolution 10 --confirm 1",
        &[],
    );
    let events = common::ndjson(&text);
    let (end, trial_events) = events.split_last().expect("events");
    assert_eq!(end["event"], "end", "{end}");
    assert_eq!(trial_events.len() as u64, u(&end["limit"], "trials"));
    for (i, t) in trial_events.iter().enumerate() {
        assert_eq!(t["event"], "trial", "{t}");
        assert_eq!(u(t, "index"), i as u64 + 1, "{t}");
        // The streamed trial is the one in the final report, but for
        // `repeated`, which is known only once its repeat has run.
        let mut streamed = t.clone();
        let streamed = streamed.as_object_mut().unwrap();
        streamed.remove("event");
        streamed.remove("repeated");
        let mut kept = end["trials"][i].clone();
        kept.as_object_mut().unwrap().remove("repeated");
        assert_eq!(Value::Object(streamed.clone()), kept, "trial {i}");
    }
}

#[test]
fn several_clients_split_the_rate_and_max_trials_bounds_repeats_too() {
    require_tc();
    let _one = one_at_a_time();
    // A limit the machine's load cannot move: a 50 Mbit/s tbf on the
    // clients' link (their own queue: ENOBUFS back-offs, nothing lost),
    // and a SCHED_FIFO sender (find_limit_in). On loopback the only limit
    // was the CPU: beside two burners every paced trial from 8 Gbit/s down
    // fell behind at 5-15 % of a core, and 8 trials found no rate.
    let Hosts {
        srv: _srv,
        cli,
        cli_dev,
        server: _server,
        target,
    } = served("fl6", "10.67.6", "8M");
    tbf_alone(&cli, &cli_dev, "50mbit", "16kb", "32kb");
    // Three clients start a few ms apart: a 200 ms trial must still count
    // as holding its rate when every client sent its share.
    let report = find_limit_in(
        &cli,
        &target,
        "--clients 3 -b 1400 --no-gso --trial-duration 0.2s --trial-pause 0.05s --max-trials 8",
    );
    eprintln!("FIGURE three clients: {}", limit_figure(&report));
    check_trials(&report);
    let all = trials(&report);
    assert!(all.len() <= 8, "--max-trials 8 ran {}: {report}", all.len());
    assert_eq!(u(&report["limit"], "trials"), all.len() as u64);
    assert_eq!(u(&report["limit"], "clients"), 3);
    let passed: Vec<&Value> = all
        .iter()
        .filter(|t| t["passed"] == true && !t["offered_bps"].is_null())
        .collect();
    assert!(!passed.is_empty(), "no paced trial passed: {report}");
    for t in passed {
        // The offered rate is split evenly: a multiple of the client count.
        assert_eq!(u(t, "offered_bps") % 3, 0, "{t}");
        let sent = u(t, "sent_packets") as f64 * 1400.0 * 8.0;
        assert!(sent >= f(t, "offered_bps") * 0.2 * 0.99, "{t}");
    }
    assert!(report["limit"]["rate_bps"].as_u64().is_some(), "{report}");
}

#[test]
fn ctrl_c_ends_the_search_with_the_result_so_far() {
    let _one = one_at_a_time();
    let mut cmd = std::process::Command::new(CLIENT);
    cmd.args(common::args(
        "--local --find-limit --json-stream -b 1400 --trial-duration 0.5s --trial-pause 0.1s",
    ))
    .stdout(std::process::Stdio::piped());
    let mut child = common::ChildGuard::spawn(&mut cmd, "udp_client --find-limit");
    let lines = child.stdout_lines();
    // Past the unpaced trial and into the search: the second trial's event.
    lines
        .wait_for_json(Duration::from_secs(30), |v| {
            v["event"] == "trial" && v["index"] == 2
        })
        .unwrap_or_else(|| panic!("no second trial:\n{}", lines.transcript()));
    child.signal(libc::SIGINT);
    let status = child
        .wait_timeout(Duration::from_secs(10))
        .expect("stopped within 10 s of Ctrl-C");
    // Ctrl-C's exit code, after the report.
    assert_eq!(status.code(), Some(130), "{status}");
    let text = lines.drain(Duration::from_secs(5)).join("\n");
    let mut events = common::ndjson(&text);
    let report = events.pop().expect("an end event after Ctrl-C");
    assert_eq!(report["event"], "end", "{report}");
    assert_eq!(report["limit"]["interrupted"], true, "{report}");
    assert!(
        report["notes"][0]
            .as_str()
            .unwrap()
            .starts_with("interrupted"),
        "{report}"
    );
    assert!(trials(&report).len() >= 2, "{report}");
    assert_eq!(report["limit"]["confirmed"], false, "{report}");
}
