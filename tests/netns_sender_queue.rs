//! The sender's own egress queue (issue 28): a tbf on the **client's**
//! veth, and the client must blame that queue, not the network and not a
//! descheduled thread, with the qdisc's own drop count.
//!
//! Two hosts (network namespaces) on 10.83.N.0/24, a veth between them;
//! the witness is the kernel's: the root qdisc's `drops` from `tc -s -j
//! qdisc show` in the client's namespace, read before and after the run.
//! IPv6 is off on the client host (`tbf_alone`), so nothing but the run
//! passes the qdisc. What each test proves is in `docs/testing.md`.

mod common;

use common::impair::{require_tc, root_qdisc, tbf_alone, tc, tc_drops};
use common::udp::{client_in, served, u};
use serde_json::Value;

/// Prints a figure for docs/testing.md (visible with `--nocapture`).
macro_rules! figure {
    ($($arg:tt)*) => { eprintln!("FIGURE {}", format!($($arg)*)) };
}

fn text(v: &Value) -> &str {
    v["limited_by"]["text"].as_str().expect("limited_by.text")
}

/// GSO on (the default) into a tbf whose burst (32 KiB) is smaller than a
/// GSO buffer (46 × 1400-byte datagrams): tbf cuts each buffer and drops
/// the datagrams its 64 KiB queue has no room for, and the sends succeed.
/// The client's watch of its qdisc sees the drops and turns GSO off, and
/// says so. The verdict must name the sender's queue and print the
/// qdisc's drops, which must equal `tc -s`'s growth, in datagrams.
#[test]
fn gso_into_a_small_shaper_is_blamed_on_the_senders_queue_and_falls_back() {
    require_tc();
    let hosts = served("q1", "10.83.1", &["--recv-buffer-size", "8M"]);
    let (cli, dev, target) = (&hosts.cli, &hosts.cli_dev, &hosts.target);
    tbf_alone(cli, dev, "200mbit", "32kb", "64kb");
    let before = tc_drops(cli, dev);
    // A second of sending: the watch reads the qdisc every 10 ms.
    let report = client_in(cli, &["-s", target, "-b", "1400", "--duration", "1s"]);
    let drops = tc_drops(cli, dev) - before;
    let client = &report["clients"][0];
    // GSO was on (the default), and the watch turned it off.
    assert_eq!(report["settings"]["gso"], "auto", "{report}");
    assert_eq!(client["send_path"]["gso"], "off", "{report}");
    let why = format!("the tbf qdisc on {dev} cut GSO buffers");
    assert!(
        client["send_path"]["notes"][0]
            .as_str()
            .is_some_and(|n| n.contains(&why)),
        "{report}"
    );
    let notes = report["notes"].to_string();
    assert!(notes.contains("GSO fell back during the run"), "{notes}");
    assert!(notes.contains(&why), "{notes}");
    let q = &report["sender_queue"];
    let view = &report["server"];
    let lost = u(view, "lost_packets");
    figure!("gso into tbf: {notes}");
    figure!(
        "gso into tbf: sent {}, lost {lost}, qdisc drops (tc -s) {drops}, printed {}, unit {}, retries {}, SndbufErrors +{}",
        u(&report, "sent_packets"),
        q["qdisc_drops"],
        q["qdisc_drops_unit"],
        u(&report, "enobufs_retries"),
        q["sndbuf_errors"]
    );
    figure!("gso into tbf: {}", text(&report));
    assert!(drops > 0, "the tbf dropped nothing: {report}");
    assert_eq!(q["device"], dev.as_str(), "{report}");
    assert_eq!(q["qdisc"], "tbf", "{report}");
    assert_eq!(u(q, "qdisc_drops"), drops, "qdisc drops vs tc -s: {report}");
    assert_eq!(q["qdisc_drops_unit"], "datagrams", "{report}");
    assert_eq!(u(q, "tbf_burst_bytes"), 32768, "{report}");
    assert_eq!(u(q, "tbf_limit_bytes"), 65536, "{report}");
    // Nothing else drops on this path: the loss is the queue's.
    assert_eq!(u(view, "socket_wide_kernel_drops"), 0, "{report}");
    // Some drops were lost (before the fallback, unheard), later ones were
    // heard as ENOBUFS and sent again.
    assert!(u(&report, "enobufs_retries") > 0, "{report}");
    assert!(
        lost > 0 && lost < drops,
        "lost {lost}, drops {drops}: {report}"
    );
    assert_eq!(u(q, "lost_in_sender_queue_at_most"), lost, "{report}");
    assert_eq!(report["limited_by"]["cause"], "sender_queue", "{report}");
    let said = text(&report);
    for part in [
        format!("the tbf qdisc on {dev}"),
        format!("dropped {drops} datagrams"),
        format!("{lost} datagrams"),
        "GSO was turned off".to_string(),
        "--no-gso` from the start".to_string(),
        format!("other traffic on {dev}"),
    ] {
        assert!(said.contains(&part), "{part:?} not in: {said}");
    }
    assert!(!said.contains("lost on the way"), "{said}");
    // The kernel still agrees after the run (nothing else used the qdisc).
    assert_eq!(tc_drops(cli, dev) - before, drops);
}

/// Two clients paced at 150 Mbit/s each into a 200 Mbit/s tbf with a 20
/// ms queue: the queue holds the data, the sockets' send buffers fill,
/// and the blocking sends wait. The verdict must name the sender's queue
/// and the time blocked, never "descheduled".
#[test]
fn sends_blocked_on_a_shaper_are_not_called_descheduled() {
    require_tc();
    let hosts = served("q2", "10.83.2", &["--recv-buffer-size", "8M"]);
    let (cli, dev, target) = (&hosts.cli, &hosts.cli_dev, &hosts.target);
    tbf_alone(cli, dev, "200mbit", "32kb", "64kb");
    // Replace the limit with a latency bound, as issue 28's reporter did.
    tc(
        cli,
        &[
            "qdisc", "replace", "dev", dev, "root", "tbf", "rate", "200mbit", "burst", "32kb",
            "latency", "20ms",
        ],
    );
    let before = root_qdisc(cli, dev);
    let report = client_in(
        cli,
        &[
            "-s",
            target,
            "-b",
            "1400",
            "--clients",
            "2",
            "--rate",
            "150M",
            "--duration",
            "2s",
            // SCHED_FIFO: a burner beside the test cannot deschedule the
            // senders. A CFS sender woken from a blocked send waited on
            // the run queue instead (beside two burners: 0.081 s of 4 s
            // counted blocked, the rest run-queue time), and the verdict
            // said "descheduled", which it then was.
            "--scheduler",
            "fifo",
            "--priority",
            "10",
        ],
    );
    let after = root_qdisc(cli, dev);
    let grew = |k: &str| after[k].as_u64().unwrap_or(0) - before[k].as_u64().unwrap_or(0);
    let blocked = report["send_blocked_seconds"]
        .as_f64()
        .expect("send_blocked_seconds");
    let seconds = report["seconds"].as_f64().expect("seconds");
    figure!(
        "blocked on tbf: sent {:.3} Gbit/s of 0.300, blocked {blocked:.3} s over {seconds:.3} s x 2 clients, retries {}, tc drops +{}, overlimits +{}, printed drops {}",
        report["gbps"].as_f64().unwrap_or(0.0),
        u(&report, "enobufs_retries"),
        grew("drops"),
        grew("overlimits"),
        report["sender_queue"]["qdisc_drops"]
    );
    figure!("blocked on tbf: {}", text(&report));
    assert_eq!(report["limited_by"]["cause"], "sender_queue", "{report}");
    let said = text(&report);
    assert!(!said.contains("descheduled"), "{said}");
    assert!(said.contains("sends blocked for"), "{said}");
    assert!(said.contains(&format!("the tbf qdisc on {dev}")), "{said}");
    // The clients asked for 300 Mbit/s; the shaper passes 200 (194 of
    // payload): a third of each second, at least, is spent waiting.
    assert!(
        blocked >= 0.2 * seconds * 2.0,
        "blocked {blocked} s of {seconds} s x 2: {report}"
    );
    let per_client: f64 = report["clients"]
        .as_array()
        .expect("clients")
        .iter()
        .map(|c| c["send_blocked_seconds"].as_f64().expect("per client"))
        .sum();
    assert!((per_client - blocked).abs() < 1e-6, "{report}");
    assert_eq!(
        report["sender_queue"]["qdisc_drops"].as_u64(),
        Some(grew("drops")),
        "{report}"
    );
}
