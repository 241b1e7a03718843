//! The text reports as a person reads them (issue 42), from the real
//! binaries on loopback: `--bidir` prints each direction once, under its
//! label, with time ranges on every interval line; `-P N --rate R` says
//! the rate is per client and gives the sum; the server's `[total]` lines
//! cover only the time a peer was active.

mod common;

use common::udp::{args_to, Server, CLIENT, SERVER};
use common::{run_bounded, ChildGuard};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Runs `udp_client` (text) against `target`; its stdout.
fn client_text(target: &str, rest: &str) -> String {
    let mut cmd = Command::new(CLIENT);
    cmd.args(args_to(target, rest));
    let out = run_bounded(&mut cmd, Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "udp_client {rest}: {}\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn count(text: &str, prefix: &str) -> usize {
    text.lines().filter(|l| l.starts_with(prefix)).count()
}

/// `a-b` of an interval line's range (`… 0.00-1.00 s …`), if it has one.
fn range(line: &str) -> Option<(f64, f64)> {
    line.split_whitespace()
        .zip(line.split_whitespace().skip(1))
        .find(|(_, unit)| *unit == "s")
        .and_then(|(r, _)| r.split_once('-'))
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
}

#[test]
fn bidir_prints_each_direction_once_under_its_label() {
    let server = Server::loopback();
    let text = client_text(
        &server.addr,
        "--bidir -b 1400 --rate 50Mbit --duration 1.2s --interval 0.5s",
    );
    // One header, then every figure once per direction.
    assert_eq!(count(&text, "udp_client "), 1, "{text}");
    assert!(text.contains("(both ways)"), "{text}");
    for unlabelled in ["sent ", "received ", "back-off ", "path ", "cpu ", "limit "] {
        assert_eq!(
            count(&text, unlabelled),
            0,
            "{unlabelled:?} unlabelled:\n{text}"
        );
    }
    for label in ["[C->S]", "[S->C]"] {
        for figure in [
            "sent ",
            "received ",
            "loss ",
            "limit ",
            "path ",
            "back-off ",
        ] {
            assert_eq!(
                count(&text, &format!("{label} {figure}")),
                1,
                "{label} {figure} once:\n{text}"
            );
        }
    }
    // Interval lines: a direction each, and a time range, never a length.
    let intervals: Vec<&str> = text.lines().filter(|l| l.contains(" pkts ")).collect();
    assert!(intervals.len() >= 4, "both directions' intervals:\n{text}");
    for line in &intervals {
        assert!(
            line.starts_with("[C->S]") || line.starts_with("[S->C]"),
            "no direction: {line}"
        );
        let (a, b) = range(line).unwrap_or_else(|| panic!("no time range: {line}"));
        assert!(a < b, "{line}");
    }
    server.stop();
}

#[test]
fn a_per_client_rate_is_said_per_client_with_the_sum() {
    let server = Server::loopback();
    let text = client_text(
        &server.addr,
        "-P 4 --rate 100Mbit -b 1400 --duration 0.3s --interval 0",
    );
    let header = text.lines().next().unwrap_or_default();
    assert!(
        header.contains("4 clients")
            && header.contains("paced at 100.0 Mbit/s each (400.0 Mbit/s in all)"),
        "{header}"
    );
    // Under a gigabit, rates read in Mbit/s everywhere.
    for line in text.lines() {
        assert!(!line.contains("Gbit/s"), "an unscaled rate: {line}");
    }
    server.stop();
}

/// Two bursts a second apart: no `[total]` line says nothing (`0 peers
/// active`, no data), and the second burst's first line starts at the
/// burst, not at the end of the first.
#[test]
fn total_lines_cover_only_the_time_a_peer_was_active() {
    let mut cmd = Command::new(SERVER);
    cmd.args(["--listen", "127.0.0.1:0", "--interval", "0.2s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut guard = ChildGuard::spawn(&mut cmd, "udp_server");
    let lines = guard.stdout_lines();
    let listening = lines
        .wait_for(Duration::from_secs(10), |l| {
            l.starts_with("udp_server listening on")
        })
        .expect("a listening line");
    let addr = listening
        .split_whitespace()
        .nth(3)
        .map(|a| a.trim_end_matches(';').to_string())
        .expect("an address");
    for _ in 0..2 {
        client_text(&addr, "-b 1400 --rate 20Mbit --duration 0.5s -q");
        std::thread::sleep(Duration::from_secs(1));
    }
    guard.signal(libc::SIGTERM);
    let rest = lines.drain(Duration::from_secs(10));
    let totals: Vec<&String> = rest.iter().filter(|l| l.starts_with("[total]")).collect();
    assert!(totals.len() >= 4, "{}", rest.join("\n"));
    for t in &totals {
        assert!(
            !(t.contains("0 peers active (+0 -0)") && t.contains(" 0 pkts")),
            "a line of nothing: {t}"
        );
    }
    let ended = totals
        .iter()
        .position(|t| t.contains("(burst ended)"))
        .unwrap_or_else(|| panic!("no burst end: {totals:?}"));
    let (_, first_end) = range(totals[ended]).expect("a range");
    let (second_start, _) = range(totals[ended + 1]).expect("a range");
    assert!(
        second_start - first_end >= 0.5,
        "the second burst's line starts at {second_start}, the first ended at {first_end}: idle time folded in:\n{}",
        rest.join("\n")
    );
}
