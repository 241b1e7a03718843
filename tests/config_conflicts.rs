//! Issue 42: a config file behaves exactly as the flags. Every pair of
//! `udp_client`'s and `udp_server`'s tables of conflicts
//! (`ClientFile::CONFLICTS`, `ServerFile::CONFLICTS`) is run through the
//! real binary four ways: both as flags, the first in the file and the
//! second as a flag, the other way round, and both in the file; each says
//! the same one line, naming each setting as the user wrote it
//! (`--total-send` as a flag, `total_send` in the file), exits 2, and
//! sends nothing (udp_client's server and reflector are a socket of the
//! test's that must stay empty). The tables cannot make this pass by
//! being short: the pairs clap refused before issue 42 are written out
//! here and must each be in them. Keys that are one choice (the volume's
//! `packets`, `total_send` and `duration`; `listen` and `port`; `psk` and
//! `psk_file`) are refused in one place, and a flag replaces the file's
//! choice. The tables of requirements are run the same way. A pair or a
//! requirement added to a table is tested here without a line more (a
//! key new to the tables needs its example in [`client_example`] or
//! [`server_example`]).
//!
//! And `connected = false` in a file is `--plain-send`'s path, in the
//! header, the path line and the JSON alike.

mod common;

use common::udp::{Server, CLIENT, SERVER, WAIT};
use common::{run_bounded, TempDir};
use netspeed::config::{
    flag_of, one_choice, parse_toml, ClientFile, Conflict, Requirement, ServerFile,
};
use serde_json::Value;
use std::net::UdpSocket;
use std::process::{Command, Output};
use std::sync::OnceLock;

/// One key as a flag and as a line of a config file (None: a flag only).
struct Example {
    flag: Vec<String>,
    toml: Option<String>,
}

fn example(flag: &[&str], toml: Option<&str>) -> Example {
    Example {
        flag: flag.iter().map(|s| s.to_string()).collect(),
        toml: toml.map(str::to_string),
    }
}

/// Where udp_client sends in these runs: a socket of the test's, which
/// no refused run may send a datagram to ([`assert_nothing_sent`]).
fn sink() -> &'static UdpSocket {
    static SINK: OnceLock<UdpSocket> = OnceLock::new();
    SINK.get_or_init(|| {
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        sink.set_nonblocking(true).unwrap();
        sink
    })
}

fn sink_addr() -> String {
    sink().local_addr().unwrap().to_string()
}

/// Nothing reached the sink: every refused run sent nothing. (Tests of
/// this file that share the sink are refused runs only.)
fn assert_nothing_sent() {
    let mut buf = [0u8; 2048];
    match sink().recv_from(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("a refused run sent a datagram: {other:?}"),
    }
}

/// A value for each key of udp_client's tables; the server and the
/// reflector are the sink.
fn client_example(key: &str) -> Example {
    let sink = sink_addr();
    let sink_toml = |key: &str| format!("{key} = \"{sink}\"");
    match key {
        "packets" => example(&["--packets", "10"], Some("packets = 10")),
        "total_send" => example(&["--total-send", "1M"], Some("total_send = \"1M\"")),
        "duration" => example(&["--duration", "2s"], Some("duration = \"2s\"")),
        "rate" => example(&["--rate", "1G"], Some("rate = \"1G\"")),
        "precise_pacing" => example(&["--precise-pacing"], Some("precise_pacing = true")),
        "connected" => example(&["--connected"], Some("connected = true")),
        "plain_send" => example(&["--plain-send"], Some("plain_send = true")),
        "batch" => example(&["--batch", "8"], Some("batch = 8")),
        "gso" => example(&["--gso"], Some("gso = true")),
        "clients" => example(&["--clients", "2"], Some("clients = 2")),
        "sweep" => example(&["--sweep", "1000"], None),
        "sweep_clients" => example(&["--sweep-clients", "1,2"], None),
        "plot" => example(&["--plot", "/nonexistent/plot.svg"], None),
        "find_limit" => example(&["--find-limit"], None),
        "loss_tolerance" => example(&["--loss-tolerance", "1"], None),
        "max_delay" => example(&["--max-delay", "10ms"], None),
        "trial_duration" => example(&["--trial-duration", "1s"], None),
        "resolution" => example(&["--resolution", "2"], None),
        "confirm" => example(&["--confirm", "2"], None),
        "trial_pause" => example(&["--trial-pause", "1s"], None),
        "max_trials" => example(&["--max-trials", "10"], None),
        "psk" => example(&["--psk", "0123456789"], None),
        "psk_file" => example(
            &["--psk-file", "/nonexistent/key"],
            Some("psk_file = \"/nonexistent/key\""),
        ),
        "local" => example(&["--local"], None),
        "server_addr" => example(&["--server-addr", &sink], Some(&sink_toml(key))),
        "no_server" => example(&["--no-server"], Some("no_server = true")),
        "reverse" => example(&["--reverse"], Some("reverse = true")),
        "bidir" => example(&["--bidir"], Some("bidir = true")),
        "json" => example(&["--json"], Some("json = true")),
        "json_stream" => example(&["--json-stream"], None),
        "iperf3_json" => example(&["--iperf3-json"], Some("iperf3_json = true")),
        "stamp_reflector" => example(&["--stamp-reflector", &sink], Some(&sink_toml(key))),
        "no_load" => example(&["--no-load"], Some("no_load = true")),
        "stamp_interval" => example(
            &["--stamp-interval", "20ms"],
            Some("stamp_interval = \"20ms\""),
        ),
        "stamp_size" => example(&["--stamp-size", "100"], Some("stamp_size = 100")),
        "stamp_ssid" => example(&["--stamp-ssid", "7"], Some("stamp_ssid = 7")),
        "stamp_stateful" => example(&["--stamp-stateful"], Some("stamp_stateful = true")),
        "stamp_synchronized" => {
            example(&["--stamp-synchronized"], Some("stamp_synchronized = true"))
        }
        "stamp_clock_error" => example(
            &["--stamp-clock-error", "1ms"],
            Some("stamp_clock_error = \"1ms\""),
        ),
        _ => panic!("udp_client's tables name {key}: give it an example here"),
    }
}

/// A value for each key of udp_server's tables.
fn server_example(key: &str) -> Example {
    match key {
        "listen" => example(
            &["--listen", "127.0.0.1:0"],
            Some("listen = \"127.0.0.1:0\""),
        ),
        "port" => example(&["--port", "0"], Some("port = 0")),
        "psk" => example(&["--psk", "0123456789"], None),
        "psk_file" => example(
            &["--psk-file", "/nonexistent/key"],
            Some("psk_file = \"/nonexistent/key\""),
        ),
        "json" => example(&["--json"], Some("json = true")),
        "one_off" => example(&["--one-off"], Some("one_off = true")),
        "iperf3_json" => example(&["--iperf3-json"], Some("iperf3_json = true")),
        "metrics" => example(
            &["--metrics", "127.0.0.1:0"],
            Some("metrics = \"127.0.0.1:0\""),
        ),
        "metrics_retain" => example(&["--metrics-retain", "1m"], Some("metrics_retain = \"1m\"")),
        "stamp" => example(&["--stamp", "127.0.0.1:0"], Some("stamp = \"127.0.0.1:0\"")),
        "stamp_max_per_source" => example(
            &["--stamp-max-per-source", "5"],
            Some("stamp_max_per_source = 5"),
        ),
        "stamp_max_per_prefix" => example(
            &["--stamp-max-per-prefix", "5"],
            Some("stamp_max_per_prefix = 5"),
        ),
        "stamp_max_total" => example(&["--stamp-max-total", "5"], Some("stamp_max_total = 5")),
        "stamp_max_sessions" => example(
            &["--stamp-max-sessions", "5"],
            Some("stamp_max_sessions = 5"),
        ),
        "stamp_session_timeout" => example(
            &["--stamp-session-timeout", "5s"],
            Some("stamp_session_timeout = \"5s\""),
        ),
        "stamp_synchronized" => {
            example(&["--stamp-synchronized"], Some("stamp_synchronized = true"))
        }
        "stamp_clock_error" => example(
            &["--stamp-clock-error", "1ms"],
            Some("stamp_clock_error = \"1ms\""),
        ),
        _ => panic!("udp_server's tables name {key}: give it an example here"),
    }
}

/// One binary, its tables, and a usage error that validation finds only
/// after the tables: a run that says it got past them.
struct Binary {
    name: &'static str,
    exe: &'static str,
    conflicts: &'static [Conflict],
    requirements: &'static [Requirement],
    example: fn(&str) -> Example,
    /// A file may hold the key: its line parses.
    parses: fn(&str) -> Result<(), String>,
    one_choice: fn(&str, &str) -> bool,
    past_the_tables: &'static [&'static str],
    past_says: &'static str,
}

const CLIENT_BIN: Binary = Binary {
    name: "udp_client",
    exe: CLIENT,
    conflicts: ClientFile::CONFLICTS,
    requirements: ClientFile::REQUIREMENTS,
    example: client_example,
    parses: |text| parse_toml::<ClientFile>(text).map(drop),
    one_choice: one_choice::<ClientFile>,
    past_the_tables: &["--sndbuf", "0"],
    past_says: "--sndbuf 0: must be between 1 and",
};

const SERVER_BIN: Binary = Binary {
    name: "udp_server",
    exe: SERVER,
    conflicts: ServerFile::CONFLICTS,
    requirements: ServerFile::REQUIREMENTS,
    example: server_example,
    parses: |text| parse_toml::<ServerFile>(text).map(drop),
    one_choice: one_choice::<ServerFile>,
    past_the_tables: &["--max-peers", "0"],
    past_says: "--max-peers 0: must be between 1 and",
};

/// Where a key is given.
#[derive(Debug, Clone, Copy, PartialEq)]
enum At {
    Flag,
    File,
}

impl Binary {
    /// The example of `key`, its file line checked against the file's
    /// keys: a key the example calls flag-only must be unknown to a file.
    fn example_of(&self, key: &str) -> Example {
        let ex = (self.example)(key);
        match &ex.toml {
            Some(line) => {
                (self.parses)(line).unwrap_or_else(|e| panic!("{}: {line}: {e}", self.name))
            }
            None => {
                let err = (self.parses)(&format!("{key} = 1")).unwrap_err();
                assert!(
                    err.contains("unknown field"),
                    "{}: {key} is a file key too: give its line ({err})",
                    self.name
                );
            }
        }
        ex
    }

    /// Runs the binary with `keys` given where each says (and the
    /// setting that fails after the tables); None when a key cannot be
    /// in a file.
    fn run(&self, dir: &TempDir, keys: &[(&str, At)]) -> Option<(String, Output)> {
        let mut flags: Vec<String> = Vec::new();
        let mut lines = Vec::new();
        for &(key, at) in keys {
            let ex = self.example_of(key);
            match at {
                At::Flag => flags.extend(ex.flag),
                At::File => lines.push(ex.toml?),
            }
        }
        flags.extend(self.past_the_tables.iter().map(|s| s.to_string()));
        // udp_client sends to the sink, whatever it was given.
        let addressed = keys
            .iter()
            .any(|(k, _)| ["local", "server_addr"].contains(k));
        if self.name == "udp_client" && !addressed {
            flags.extend(["--server-addr".to_string(), sink_addr()]);
        }
        if !lines.is_empty() {
            let file = dir.file("config.toml", lines.join("\n") + "\n");
            flags.extend(["--config".to_string(), file.to_str().unwrap().to_string()]);
        }
        let what = format!(
            "{} {} [file: {}]",
            self.name,
            flags.join(" "),
            lines.join("; ")
        );
        let out = run_bounded(Command::new(self.exe).args(&flags), WAIT);
        Some((what, out))
    }
}

/// The one line a refused run writes; panics unless it exited 2 with one
/// line to stderr and nothing to stdout.
fn usage_error(what: &str, out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).trim_end().to_string();
    assert_eq!(out.status.code(), Some(2), "{what}: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: not one line: {err}");
    assert!(out.stdout.is_empty(), "{what}: wrote to stdout");
    err
}

/// A key as the user wrote it where it was given: `--total-send` as a
/// flag, `total_send` in the file.
fn written(key: &str, at: At) -> String {
    match at {
        At::Flag => flag_of(key),
        At::File => key.to_string(),
    }
}

/// What a refused conflict says, written out here rather than taken from
/// the library.
fn conflict_says(bin: &str, c: &Conflict, at_a: At, at_b: At) -> String {
    let (a, b) = (written(c.a, at_a), written(c.b, at_b));
    format!("{bin}: error: {a} cannot be used with {b}: {}", c.why)
}

const BOTH_WAYS: [(At, At); 4] = [
    (At::Flag, At::Flag),
    (At::File, At::Flag),
    (At::Flag, At::File),
    (At::File, At::File),
];

fn every_conflict_is_refused_the_same_four_ways(bin: &Binary) {
    let dir = TempDir::new(&format!("netspeed-conflicts-{}", bin.name));
    let mut runs = 0;
    for c in bin.conflicts {
        for (at_a, at_b) in BOTH_WAYS {
            let Some((what, out)) = bin.run(&dir, &[(c.a, at_a), (c.b, at_b)]) else {
                continue;
            };
            runs += 1;
            let said = usage_error(&what, &out);
            if (bin.one_choice)(c.a, c.b) && at_a != at_b {
                // One choice: the flag replaces the file's; validation
                // goes on to the setting after the tables.
                assert!(said.contains(bin.past_says), "{what}: {said}");
            } else {
                assert_eq!(said, conflict_says(bin.name, c, at_a, at_b), "{what}");
            }
        }
    }
    // Both as flags always runs, and so does a pair with a file key.
    assert!(runs > bin.conflicts.len(), "{runs} runs");
    assert_nothing_sent();
}

impl Binary {
    /// `keys` and every key they need, and those need in turn.
    fn closure(&self, keys: &[&'static str]) -> Vec<&'static str> {
        let mut all = keys.to_vec();
        let mut i = 0;
        while i < all.len() {
            let key = all[i];
            for r in self.requirements.iter().filter(|r| r.key == key) {
                if !all.contains(&r.needs) {
                    all.push(r.needs);
                }
            }
            i += 1;
        }
        all
    }

    /// The first requirement of the table that `given` leaves unmet.
    fn first_unmet(&self, given: &[&str]) -> Option<&'static Requirement> {
        self.requirements
            .iter()
            .find(|r| given.contains(&r.key) && !given.contains(&r.needs))
    }
}

fn every_requirement_is_met_or_refused_wherever_given(bin: &Binary) {
    let dir = TempDir::new(&format!("netspeed-requirements-{}", bin.name));
    for r in bin.requirements {
        // What the key needs besides `r.needs` (and what that needs), as
        // flags: alone, the key then misses `r.needs` (or first, what the
        // table lists before it); with it, nothing.
        let without: Vec<&str> = bin
            .closure(&[r.key])
            .into_iter()
            .filter(|&k| k != r.needs)
            .collect();
        let unmet = bin.first_unmet(&without).expect("unmet without it");
        let others = |keys: &[(&'static str, At)]| -> Vec<(&'static str, At)> {
            let mut all = keys.to_vec();
            for k in bin.closure(&[r.key, r.needs]) {
                if k != r.key && k != r.needs {
                    all.push((k, At::Flag));
                }
            }
            all
        };
        for at in [At::Flag, At::File] {
            // Without it: refused, the same words wherever it was given.
            let mut alone = vec![(r.key, at)];
            alone.extend(
                without
                    .iter()
                    .filter(|&&k| k != r.key)
                    .map(|&k| (k, At::Flag)),
            );
            if let Some((what, out)) = bin.run(&dir, &alone) {
                let key_at = if unmet.key == r.key { at } else { At::Flag };
                let want = format!(
                    "{}: error: {} needs {}: {}",
                    bin.name,
                    written(unmet.key, key_at),
                    flag_of(unmet.needs),
                    unmet.why
                );
                assert_eq!(usage_error(&what, &out), want, "{what}");
            }
            // With what it needs, from either place: past the tables.
            for needs_at in [At::Flag, At::File] {
                if let Some((what, out)) =
                    bin.run(&dir, &others(&[(r.key, at), (r.needs, needs_at)]))
                {
                    let said = usage_error(&what, &out);
                    assert!(said.contains(bin.past_says), "{what}: {said}");
                }
            }
        }
    }
    assert_nothing_sent();
}

#[test]
fn udp_client_refuses_every_conflict_the_same_four_ways() {
    every_conflict_is_refused_the_same_four_ways(&CLIENT_BIN);
}

#[test]
fn udp_server_refuses_every_conflict_the_same_four_ways() {
    every_conflict_is_refused_the_same_four_ways(&SERVER_BIN);
}

#[test]
fn udp_client_requirements_hold_wherever_given() {
    every_requirement_is_met_or_refused_wherever_given(&CLIENT_BIN);
}

#[test]
fn udp_server_requirements_hold_wherever_given() {
    every_requirement_is_met_or_refused_wherever_given(&SERVER_BIN);
}

/// The pairs clap refused before issue 42 (its `conflicts_with`), each
/// as (a, b) in either order: every one must be in the binary's table,
/// so that the runs above cannot pass by the table being short.
const CLIENT_PAIRS_BEFORE: &[(&str, &str)] = &[
    ("packets", "total_send"),
    ("packets", "duration"),
    ("total_send", "duration"),
    ("plain_send", "connected"),
    ("plain_send", "batch"),
    ("plain_send", "gso"),
    ("sweep_clients", "sweep"),
    ("sweep_clients", "clients"),
    ("sweep_clients", "find_limit"),
    ("find_limit", "sweep"),
    ("find_limit", "rate"),
    ("find_limit", "total_send"),
    ("find_limit", "packets"),
    ("find_limit", "duration"),
    ("find_limit", "no_server"),
    ("local", "server_addr"),
    ("local", "no_server"),
    ("reverse", "no_server"),
    ("reverse", "bidir"),
    ("reverse", "sweep"),
    ("bidir", "no_server"),
    ("bidir", "sweep"),
    ("bidir", "find_limit"),
    ("json_stream", "json"),
    ("psk", "psk_file"),
];

const SERVER_PAIRS_BEFORE: &[(&str, &str)] = &[("listen", "port"), ("psk", "psk_file")];

fn has_pair(table: &[Conflict], (a, b): (&str, &str)) -> bool {
    table
        .iter()
        .any(|c| (c.a, c.b) == (a, b) || (c.a, c.b) == (b, a))
}

#[test]
fn the_tables_hold_every_pair_clap_refused() {
    for (table, before) in [
        (ClientFile::CONFLICTS, CLIENT_PAIRS_BEFORE),
        (ServerFile::CONFLICTS, SERVER_PAIRS_BEFORE),
    ] {
        for &pair in before {
            assert!(has_pair(table, pair), "{pair:?} is not in the table");
        }
        assert!(table.len() >= before.len());
    }
    // And what the tables refuse that clap did not: the file's checks
    // of before (iperf3_json, --no-load, the STAMP sender's).
    assert!(
        ClientFile::CONFLICTS.len() >= 40,
        "{}",
        ClientFile::CONFLICTS.len()
    );
    assert!(has_pair(ClientFile::CONFLICTS, ("iperf3_json", "json")));
    assert!(has_pair(ServerFile::CONFLICTS, ("iperf3_json", "json")));
}

/// Runs udp_client with `args` and a config file holding `toml`, sending
/// to the sink; its one line of usage error.
fn client_refused(dir: &TempDir, toml: &str, args: &[&str]) -> String {
    let file = dir.file("config.toml", toml);
    let mut cmd = Command::new(CLIENT);
    cmd.args(["--server-addr", &sink_addr(), "--config"])
        .arg(&file)
        .args(args);
    let out = run_bounded(&mut cmd, WAIT);
    let said = usage_error(&format!("{toml:?} {args:?}"), &out);
    assert_nothing_sent();
    said
}

/// Issue 42's own example, written out: `total_send = "1M"` with
/// `duration = "2s"` in a file sent 1 MB; it is refused as the flags
/// are, in the same words, and nothing is sent. Nothing here comes from
/// the tables.
#[test]
fn the_issues_example_is_refused_as_the_flags_are() {
    let dir = TempDir::new("netspeed-conflicts-issue");
    let volume = "the volume is a packet count, a byte total or a time: give one";
    assert_eq!(
        client_refused(&dir, "total_send = \"1M\"\nduration = \"2s\"\n", &[]),
        format!("udp_client: error: total_send cannot be used with duration: {volume}")
    );
    assert_eq!(
        client_refused(&dir, "", &["--total-send", "1M", "--duration", "2s"]),
        format!("udp_client: error: --total-send cannot be used with --duration: {volume}")
    );
    assert_eq!(
        client_refused(&dir, "rate = \"1G\"\n", &["--find-limit"]),
        "udp_client: error: --find-limit cannot be used with rate: the search sets each trial's rate"
    );
    assert_eq!(
        client_refused(&dir, "reverse = true\nbidir = true\n", &[]),
        "udp_client: error: reverse cannot be used with bidir: -R has the server send, --bidir both: give one"
    );
    assert_eq!(
        client_refused(&dir, "no_server = true\n", &["--bidir"]),
        "udp_client: error: --bidir cannot be used with no_server: the udp_server sends, so there must be one"
    );
    assert_eq!(
        client_refused(&dir, "precise_pacing = true\n", &[]),
        "udp_client: error: precise_pacing needs --rate: it sends each datagram at its time at that rate"
    );
}

/// `connected = false` is `--plain-send`'s spelling in a file: refused
/// beside what --plain-send is refused beside, named as it was written.
#[test]
fn connected_false_in_a_file_conflicts_as_plain_send() {
    let dir = TempDir::new("netspeed-conflicts-unconnected");
    let why = "it is one sendto per datagram on an unconnected socket";
    for (toml, args, said) in [
        (
            "connected = false\n",
            &["--batch", "8"][..],
            "connected = false cannot be used with --batch",
        ),
        (
            "connected = false\nbatch = 8\n",
            &[],
            "connected = false cannot be used with batch",
        ),
        (
            "connected = false\n",
            &["--gso"],
            "connected = false cannot be used with --gso",
        ),
        (
            "connected = false\ngso = true\n",
            &[],
            "connected = false cannot be used with gso",
        ),
        (
            "",
            &["--plain-send", "--batch", "8"],
            "--plain-send cannot be used with --batch",
        ),
        (
            "plain_send = true\nconnected = true\n",
            &[],
            "plain_send cannot be used with connected",
        ),
    ] {
        assert_eq!(
            client_refused(&dir, toml, args),
            format!("udp_client: error: {said}: {why}")
        );
    }
}

/// `udp_client --rate -1`: the rate must be positive, not "-1 (one-off)
/// belongs to the server".
#[test]
fn a_negative_value_is_said_to_be_one() {
    for (args, says) in [
        (
            &["--rate", "-1"][..],
            "'--rate <RATE>': invalid rate '-1': a rate cannot be negative",
        ),
        (
            &["--rate", "-5M"],
            "invalid rate '-5M': a rate cannot be negative",
        ),
        (&["-t", "-1"], "invalid size '-1': cannot be negative"),
        (
            &["--duration", "-1"],
            "invalid duration '-1': cannot be negative",
        ),
    ] {
        let mut cmd = Command::new(CLIENT);
        let out = run_bounded(cmd.args(["-s", &sink_addr()]).args(args), WAIT);
        let said = usage_error(&format!("{args:?}"), &out);
        assert!(said.contains(says), "{args:?}: {said}");
        assert!(!said.contains("one-off"), "{args:?}: {said}");
    }
    assert_nothing_sent();
    // -1 alone is still iperf3's one-off, which is the server's.
    let out = run_bounded(Command::new(CLIENT).arg("-1"), WAIT);
    assert!(usage_error("-1", &out).contains("udp_server --one-off"));
    // udp_server's own -1 does not take the value of --interval.
    let out = run_bounded(Command::new(SERVER).args(["--interval", "-1"]), WAIT);
    let said = usage_error("udp_server --interval -1", &out);
    assert!(
        said.contains("invalid duration '-1': cannot be negative"),
        "{said}"
    );
}

/// The header's send path and the path line, in the text report.
fn header_and_path(text: &str) -> (String, String) {
    let header = text.lines().next().unwrap_or_default().to_string();
    let path = text
        .lines()
        .find(|l| l.starts_with("path "))
        .unwrap_or_else(|| panic!("no path line: {text}"))
        .to_string();
    (header, path)
}

/// Issue 42: `connected = false` in a config file printed "unconnected
/// (sendto)" in the header but "sendmmsg+gso: 32 per call" in the path
/// line. It is --plain-send's path now: one sendto per datagram, in the
/// header, the path line and the JSON alike; and a connected socket's
/// header and path line agree too, from a file or the flags.
#[test]
fn the_header_and_the_path_line_agree() {
    let server = Server::loopback();
    let dir = TempDir::new("netspeed-unconnected-run");
    let config = |name: &str, text: &str| dir.file(name, text).to_str().unwrap().to_string();
    let (unconnected, connected) = (
        config("unconnected.toml", "connected = false\n"),
        config("connected.toml", "connected = true\n"),
    );
    let run = |how: &[&str], json: bool| -> Output {
        let mut cmd = Command::new(CLIENT);
        cmd.args(["-s", &server.addr, "-n", "300", "-b", "1000", "-i", "0"])
            .args(["--idle-probe", "0"])
            .args(how);
        if json {
            cmd.arg("--json");
        }
        let out = run_bounded(&mut cmd, WAIT);
        assert!(out.status.success(), "{how:?}: {out:?}");
        out
    };
    let unconnected_runs: [&[&str]; 2] = [&["--config", &unconnected], &["--plain-send"]];
    let connected_runs: [&[&str]; 3] = [&["--config", &connected], &["--connected"], &[]];
    for (how, want_connected) in unconnected_runs
        .iter()
        .map(|h| (h, false))
        .chain(connected_runs.iter().map(|h| (h, true)))
    {
        let text = String::from_utf8_lossy(&run(how, false).stdout).into_owned();
        let (header, path) = header_and_path(&text);
        // The path line's calls, which the sender reports.
        let calls = path
            .strip_prefix("path      ")
            .and_then(|p| p.split(':').next())
            .unwrap_or_else(|| panic!("{how:?}: {path}"));
        let report: Value = serde_json::from_slice(&run(how, true).stdout).unwrap();
        let sent = &report["clients"][0]["send_path"];
        assert_eq!(sent["name"], calls, "{how:?}: {sent}");
        let n = sent["calls"].as_u64().unwrap();
        assert!((1..=300).contains(&n), "{how:?}: {sent}");
        let calls_said = if n == 1 {
            "1 call".to_string()
        } else {
            format!("{n} calls")
        };
        assert!(
            path.ends_with(&format!(", {calls_said}")),
            "{how:?}: {path}"
        );
        assert_eq!(report["connected"], want_connected, "{how:?}");
        if want_connected {
            assert!(header.ends_with(", connected"), "{how:?}: {header}");
            assert!(
                ["send", "sendmmsg", "send+gso", "sendmmsg+gso"].contains(&calls),
                "{how:?}: {path}"
            );
            continue;
        }
        assert!(
            header.ends_with(&format!(", unconnected ({calls})")),
            "{how:?}: {header}"
        );
        assert!(
            path.starts_with("path      sendto: 1 per call, gso: not requested, 300 calls"),
            "{how:?}: {path}"
        );
        let settings = &report["settings"];
        assert_eq!(settings["connected"], false, "{how:?}: {settings}");
        assert_eq!(settings["batch"], 1, "{how:?}: {settings}");
        assert_eq!(settings["gso"], "off", "{how:?}: {settings}");
        assert_eq!(sent["batch"], 1, "{how:?}: {sent}");
    }
    server.stop();
}

/// docs/config.md states every pair of the tables once, in the table of
/// its binary: a conflict as `a | b` (either way round), a requirement as
/// `key | needs`.
#[test]
fn the_docs_list_every_pair() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/config.md")).unwrap();
    // (binary, "cannot be used with" or "needs", first cell, second cell)
    let mut rows = Vec::new();
    let mut table = ("", "");
    for line in doc.lines() {
        let cells: Vec<&str> = line
            .split(" | ")
            .map(|c| c.trim_matches('|').trim())
            .collect();
        match cells.as_slice() {
            [bin @ ("udp_client" | "udp_server"), kind, _] => table = (bin, kind),
            [a, b, _] if a.starts_with('`') => rows.push((table.0, table.1, *a, *b)),
            _ => {}
        }
    }
    assert!(rows.len() > 20, "{} rows", rows.len());
    let listed = |bin: &str, kind: &str, a: &str, b: &str| {
        let (a, b) = (format!("`{}`", flag_of(a)), format!("`{}`", flag_of(b)));
        let has = |cell: &str, flag: &str| cell.split(", ").any(|f| f == flag);
        rows.iter()
            .filter(|r| r.0 == bin && r.1 == kind)
            .any(|r| has(r.2, &a) && has(r.3, &b))
    };
    for (bin, conflicts, requirements) in [
        (
            "udp_client",
            ClientFile::CONFLICTS,
            ClientFile::REQUIREMENTS,
        ),
        (
            "udp_server",
            ServerFile::CONFLICTS,
            ServerFile::REQUIREMENTS,
        ),
    ] {
        for c in conflicts {
            let kind = "cannot be used with";
            assert!(
                listed(bin, kind, c.a, c.b) || listed(bin, kind, c.b, c.a),
                "docs/config.md: {bin} {c:?}"
            );
        }
        for r in requirements {
            assert!(
                listed(bin, "needs", r.key, r.needs),
                "docs/config.md: {bin} {r:?}"
            );
        }
    }
}
