//! Many clients on one server (issue 27): the server's `total` events add
//! up to its peers and agree with the kernel's own counters; kernel drops
//! are put in datagrams (counted without GRO, estimated with it) and a
//! session's loss is split by where it happened; a burst of arrivals still
//! gets a rate.
//!
//! The witnesses are independent of netspeed: /proc/net/snmp's UDP
//! counters of a namespace of the test's own (InDatagrams: every datagram
//! read; RcvbufErrors: every datagram a full buffer dropped), and what the
//! clients themselves sent.

mod common;

use common::impair::{delta, require_nft, Action, Pick};
use common::netns::two_hosts;
use common::udp::{args_to, client, u, Server, CLIENT};
use common::{run_bounded, ChildGuard};
use serde_json::Value;
use std::process::Stdio;
use std::time::Duration;

/// Prints a figure for docs/testing.md (visible with `--nocapture`).
macro_rules! figure {
    ($($arg:tt)*) => { eprintln!("FIGURE {}", format!($($arg)*)) };
}

fn events_of<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == name).collect()
}

fn sum(events: &[&Value], key: &str) -> u64 {
    events.iter().map(|e| u(e, key)).sum()
}

#[test]
fn sixteen_clients_add_up_in_the_total_events_and_the_kernels_counters() {
    require_nft();
    let (srv, cli, _) = two_hosts("mc1", "10.71.1");
    // GRO off: the kernel then counts (InDatagrams, RcvbufErrors) and the
    // server reads one datagram at a time, so every figure is exact.
    let server = Server::start_args_in(
        &srv,
        &[
            "--listen",
            "0.0.0.0:0",
            "--interval",
            "0.2s",
            "--recv-buffer-size",
            "8M",
            "--no-gro",
        ],
    );
    let target = format!("10.71.1.1:{}", server.port());
    let before = srv.read_snmp_udp();
    // Sixteen processes at once, paced (320 Mbit/s in all), so the test
    // does not depend on how fast this host is.
    let clients: Vec<ChildGuard> = (0..16)
        .map(|_| {
            let mut cmd = cli.cmd(CLIENT);
            cmd.args(args_to(
                &target,
                "-b 1000 --rate 20Mbit --duration 1s --idle-probe 0 --json -q",
            ))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
            ChildGuard::spawn(&mut cmd, "udp_client")
        })
        .collect();
    let mut sent_minus_lost = 0;
    for mut c in clients {
        let lines = c.stdout_lines();
        let status = c
            .wait_timeout(Duration::from_secs(30))
            .expect("a client finished within 30 s");
        assert!(status.success(), "a client failed: {status}");
        let report: Value = serde_json::from_str(&lines.drain(Duration::from_secs(5)).join("\n"))
            .expect("one JSON report");
        assert_eq!(u(&report, "clients_answered"), 1, "{report}");
        sent_minus_lost += u(&report, "sent_packets") - u(&report["server"], "lost_packets");
    }
    let events = server.stop();
    let after = srv.read_snmp_udp();
    let totals = events_of(&events, "total");
    let done = events_of(&events, "peer_done");
    assert_eq!(done.len(), 16, "one summary per client");
    let total_packets = sum(&totals, "packets");
    let peer_packets = sum(&done, "packets");
    let read = sum(&totals, "datagrams_read");
    let drops = sum(&totals, "kernel_drops");
    let (in_datagrams, rcvbuf) = (
        delta(&before, &after, "InDatagrams"),
        delta(&before, &after, "RcvbufErrors"),
    );
    figure!(
        "16 clients: {} total events; packets {total_packets} (peers {peer_packets}, clients' sent - lost {sent_minus_lost}); read {read} (InDatagrams {in_datagrams}); drops {drops} (RcvbufErrors {rcvbuf})",
        totals.len()
    );
    assert!(totals.len() >= 5, "a total per interval: {totals:?}");
    assert_eq!(total_packets, peer_packets, "totals = peers");
    assert_eq!(peer_packets, sent_minus_lost, "peers = sent - lost");
    assert_eq!(read, in_datagrams, "every datagram read is in a total");
    assert_eq!(drops, rcvbuf, "every drop is in a total");
    assert_eq!(sum(&totals, "peers_started"), 16);
    assert_eq!(sum(&totals, "peers_finished"), 16);
    assert!(
        totals.iter().any(|t| u(t, "peers_active") == 16),
        "all sixteen were active at once: {totals:?}"
    );
    // The burst's end is marked; after it only stray control datagrams
    // (a repeated End, a probe) may come, each in a total of no data.
    let end = totals
        .iter()
        .rposition(|t| t["burst_end"] == true)
        .unwrap_or_else(|| panic!("no burst_end: {totals:?}"));
    let last = &totals[end];
    assert_eq!(u(last, "peers_active"), 0, "{last}");
    for t in &totals[end + 1..] {
        assert_eq!((u(t, "packets"), u(t, "peers_active")), (0, 0), "{t}");
    }
    for t in &totals {
        assert!(u(t, "recv_buffer_bytes") >= 8 << 20, "{t}");
        assert!(t["recv_buffer_peak_bytes"].is_u64(), "{t}");
    }
}

/// One client against a small buffer, GRO off: the drops are datagrams,
/// counted, and they are the loss.
#[test]
fn without_gro_kernel_drops_are_datagrams_and_equal_rcvbuferrors() {
    require_nft();
    let (srv, cli, _) = two_hosts("mc2", "10.71.2");
    let server = Server::start_in(
        &srv,
        "0.0.0.0:0",
        &["--recv-buffer-size", "64K", "--no-gro"],
    );
    let target = format!("10.71.2.1:{}", server.port());
    let before = srv.read_snmp_udp();
    let mut cmd = cli.cmd(CLIENT);
    let out = run_bounded(
        cmd.args(args_to(&target, "-b 1400 -n 20000 --idle-probe 0 --json")),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let session = report["clients"][0]["session"]
        .as_str()
        .unwrap()
        .to_string();
    let done = server.done_for(&session);
    let events = server.stop();
    let rcvbuf = delta(&before, &srv.read_snmp_udp(), "RcvbufErrors");
    let totals = events_of(&events, "total");
    let lost = u(&done, "lost");
    figure!(
        "no GRO, 64K: lost {lost}, kernel_drops {}, RcvbufErrors {rcvbuf}, split {} in / {} before",
        done["kernel_drops"],
        done["lost_in_socket"],
        done["lost_before_socket"]
    );
    assert!(rcvbuf > 0, "64K never overflowed: {done}");
    assert_eq!(done["kernel_drops_unit"], "datagrams", "{done}");
    assert_eq!(done["kernel_drops_basis"], "counted", "{done}");
    assert_eq!(sum(&totals, "kernel_drops"), rcvbuf, "{totals:?}");
    assert_eq!(sum(&totals, "kernel_drops_datagrams"), rcvbuf);
    // Nothing is lost on a veth: the socket dropped all of it.
    assert_eq!(done["loss_split"], "exact", "{done}");
    assert_eq!(u(&done, "lost_in_socket"), lost, "{done}");
    assert_eq!(u(&done, "lost_before_socket"), 0, "{done}");
    // The client's view says the same.
    let view = &report["server"];
    assert_eq!(u(view, "lost_in_socket"), lost, "{view}");
    assert_eq!(view["kernel_drops_basis"], "counted", "{view}");
}

/// GRO on: the drops are buffers, put in datagrams with the basis said,
/// and the split never exceeds the loss.
#[test]
fn with_gro_the_drops_estimate_states_its_basis() {
    let server = Server::start("127.0.0.1:0", &["--recv-buffer-size", "64K", "--gro"]);
    let report = client(&args_to(&server.addr, "-b 1400 -t 100M --idle-probe 0"));
    let session = report["clients"][0]["session"].as_str().unwrap();
    let done = server.done_for(session);
    let lost = u(&done, "lost");
    figure!(
        "GRO, 64K: lost {lost}, {} {} = {} datagrams ({}), split {} in / {} before",
        done["kernel_drops"],
        done["kernel_drops_unit"],
        done["kernel_drops_datagrams"],
        done["kernel_drops_basis"],
        done["lost_in_socket"],
        done["lost_before_socket"]
    );
    assert!(lost > 0, "100M into 64K lost nothing: {done}");
    assert!(u(&done, "gro_buffers") > 0, "nothing coalesced: {done}");
    assert_eq!(done["kernel_drops_unit"], "buffers", "{done}");
    let basis = done["kernel_drops_basis"].as_str().unwrap();
    assert!(
        basis.starts_with("estimate: ") && basis.contains("datagrams per buffer received"),
        "{basis}"
    );
    assert_eq!(done["loss_split"], "estimate", "{done}");
    let (inside, before) = (u(&done, "lost_in_socket"), u(&done, "lost_before_socket"));
    assert_eq!(inside + before, lost, "{done}");
    assert!(inside <= lost);
    // The text report says it in words too.
    let text = String::from_utf8(
        run_bounded(
            std::process::Command::new(CLIENT)
                .args(args_to(&server.addr, "-b 1400 -t 50M --idle-probe 0 -q")),
            Duration::from_secs(30),
        )
        .stdout,
    )
    .unwrap();
    assert!(text.contains("datagrams per buffer received"), "{text}");
    assert!(!text.contains("most of"), "{text}");
}

/// Datagrams a relay holds back and lets go together arrive in one burst:
/// the rate is over the sender's span, never null, and no faster than
/// the sender sent.
#[test]
fn a_burst_of_arrivals_is_timed_over_the_senders_span() {
    let server = Server::loopback();
    // 40 datagrams, one every 2 ms (4 Mbit/s of 1000 bytes); the n-th is
    // held 120 - 2n ms, so all leave the relay at about 120 ms. (1 ms
    // apart, a relay thread descheduled on a busy machine spread the
    // "burst" over more than a quarter of the send.)
    let rules: Vec<(Pick, Action)> = (0..40u64)
        .map(|n| {
            (
                Pick::to_server(common::impair::kind::DATA, n),
                Action::Delay(Duration::from_millis(120 - 2 * n)),
            )
        })
        .collect();
    let relay = server.relay(&rules);
    let report = client(&args_to(
        &relay.addr().to_string(),
        "-b 1000 -n 40 --rate 4Mbit --idle-probe 0 --precise-pacing",
    ));
    let session = report["clients"][0]["session"].as_str().unwrap();
    let done = server.done_for(session);
    let sender_seconds = report["seconds"].as_f64().unwrap();
    let arrivals = done["seconds"].as_f64().unwrap();
    let gbps = done["gbps"].as_f64().expect("a rate, not null");
    figure!(
        "burst: arrived within {:.3} ms of a {:.3} ms send; {gbps:.4} Gbit/s over the {}",
        arrivals * 1e3,
        sender_seconds * 1e3,
        done["rate_span"]
    );
    assert_eq!(u(&done, "packets"), 40, "{done}");
    assert!(arrivals < sender_seconds / 3.0, "not a burst: {done}");
    assert_eq!(done["rate_span"], "sender", "{done}");
    // 39 datagrams after the first over the sender's span.
    let expected = 39.0 * 1000.0 * 8.0 / sender_seconds / 1e9;
    assert!(
        (gbps - expected).abs() / expected < 0.05,
        "{gbps} vs {expected}: {done}"
    );
    let view_gbps = report["server"]["gbps"]
        .as_f64()
        .expect("the client's view has a rate");
    assert!(
        view_gbps <= report["gbps"].as_f64().unwrap() * 1.05,
        "{report}"
    );
}

/// `--sweep-clients`: one run per client count; its table's figures are
/// the server's own summaries of each run, and `--plot` draws them.
#[test]
fn the_client_sweep_reports_what_the_server_counted_per_run() {
    let server = Server::loopback();
    let dir = std::env::temp_dir().join(format!("netspeed-sweep-clients-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("clients.svg");
    let svg_arg = svg.to_str().unwrap().to_string();
    let mut args = args_to(
        &server.addr,
        "--sweep-clients 1,2,3 -b 1000 -n 500 --rate 50Mbit --idle-probe 0 --plot",
    );
    args.push(&svg_arg);
    let report = client(&args);
    let events = server.stop();
    let done = events_of(&events, "peer_done");
    let cells = report["cells"].as_array().expect("cells");
    assert_eq!(cells.len(), 3, "{report}");
    // The runs are one after another: their summaries come in that order.
    let mut summaries = done.iter();
    for cell in cells {
        let n = u(cell, "clients") as usize;
        let run: Vec<&&Value> = summaries.by_ref().take(n).collect();
        assert_eq!(run.len(), n, "{n} summaries for the run of {n}");
        let sum = |key: &str| run.iter().map(|d| u(d, key)).sum::<u64>();
        assert_eq!(u(cell, "received_packets"), sum("packets"), "{cell}");
        assert_eq!(u(cell, "sent_packets"), sum("sent_packets"), "{cell}");
        assert_eq!(u(cell, "sent_packets"), 500 * n as u64, "{cell}");
        assert_eq!(u(cell, "lost_packets"), sum("lost"), "{cell}");
        assert!(cell["server_gbps"].is_f64(), "{cell}");
    }
    let drawn = std::fs::read_to_string(&svg).expect("the chart was written");
    assert!(
        drawn.contains("<svg") && drawn.contains("clients"),
        "{drawn}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Sixteen unpaced clients into one server (issue 41): the receive CPU
/// each client reports is its share, so together they come to no more
/// than the server process used (its kernel figure, within 1.5×), each
/// says whom it shared with, and a client that lost everything to the
/// full buffer has a rate of 0 bit/s, not none.
#[test]
fn sixteen_clients_receiver_cpu_adds_up_to_the_servers_own_and_every_rate_is_known() {
    let server = Server::loopback();
    let target = server.addr.clone();
    let clients: Vec<ChildGuard> = (0..16)
        .map(|_| {
            let mut cmd = std::process::Command::new(CLIENT);
            cmd.args(args_to(
                &target,
                "-b 1400 -t 30M --idle-probe 0 --end-timeout 3s --json -q",
            ))
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
            ChildGuard::spawn(&mut cmd, "udp_client")
        })
        .collect();
    let mut reports = Vec::new();
    for mut c in clients {
        let lines = c.stdout_lines();
        c.wait_timeout(Duration::from_secs(60))
            .expect("a client finished within 60 s");
        let report: Value = serde_json::from_str(&lines.drain(Duration::from_secs(5)).join("\n"))
            .expect("one JSON report");
        reports.push(report);
    }
    let server_cpu = common::cpu_seconds(server.guard.id());
    let events = server.stop();
    let receive_cpu = events
        .iter()
        .find(|e| e["event"] == "shutdown")
        .and_then(|e| e["cpu"]["seconds"].as_f64())
        .expect("the server's own receive CPU");
    let mut sum = 0.0;
    let mut shared = 0;
    let mut nothing_received = 0;
    for r in &reports {
        let view = &r["server"];
        assert_eq!(u(r, "clients_answered"), 1, "{r}");
        let gbps = view["gbps"]
            .as_f64()
            .unwrap_or_else(|| panic!("a receive rate, even of nothing: {view}"));
        if u(view, "received_packets") == 0 {
            nothing_received += 1;
            assert_eq!(gbps, 0.0, "{view}");
            assert_eq!(view["rate_span"], "sender", "{view}");
        }
        let cpu = &view["cpu"];
        sum += cpu["seconds"].as_f64().expect("the server's CPU is known");
        if let Some(others) = cpu["shared"]["other_peers"].as_u64() {
            assert!((1..=15).contains(&others), "{cpu}");
            let whole = cpu["shared"]["whole_seconds"].as_f64().unwrap();
            assert!(cpu["seconds"].as_f64().unwrap() <= whole + 1e-9, "{cpu}");
            shared += 1;
        }
    }
    figure!(
        "16 unpaced clients: their receiver CPU adds up to {sum:.3} s; the server's receive threads {receive_cpu:.3} s, its process {server_cpu:.3} s; {shared} said shared; {nothing_received} received nothing"
    );
    assert!(
        shared > 0,
        "sixteen clients at once, none shared: {reports:?}"
    );
    assert!(
        sum <= 1.5 * server_cpu.max(receive_cpu),
        "the clients' shares ({sum:.3} s) exceed the server's own CPU ({server_cpu:.3} s process, {receive_cpu:.3} s receive threads)"
    );
}

/// A client whose every datagram was lost on the way received nothing
/// over a known span: 0 bit/s, not an unknown rate (issue 41).
#[test]
fn nothing_received_over_a_known_span_is_zero_bits_per_second() {
    let server = Server::loopback();
    let rules: Vec<(Pick, Action)> = (0..100u64)
        .map(|n| (Pick::to_server(common::impair::kind::DATA, n), Action::Drop))
        .collect();
    let relay = server.relay(&rules);
    // 100 datagrams at 10 Mbit/s: sent over about 110 ms.
    let outcome = common::udp::client_outcome(&args_to(
        &relay.addr().to_string(),
        "-b 1400 -n 100 --rate 10Mbit --idle-probe 0",
    ));
    let report = outcome.report.expect("a JSON report");
    let view = &report["server"];
    assert_eq!(u(view, "received_packets"), 0, "{view}");
    assert_eq!(u(view, "lost_packets"), 100, "{view}");
    assert_eq!(view["gbps"].as_f64(), Some(0.0), "{view}");
    assert_eq!(view["rate_span"], "sender", "{view}");
    assert_eq!(
        relay
            .finish()
            .dropped(common::impair::Dir::ToServer, common::impair::kind::DATA),
        100
    );
}
