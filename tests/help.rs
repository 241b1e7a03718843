//! What a user reads when they ask for help or get something wrong: help
//! that says what a thing is (not which seed document it came from), an
//! invalid choice that names the valid ones, and a config error that says
//! where in the file it is.

mod common;

use common::{run_bounded, TempDir};
use std::process::{Command, Output};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

fn run(bin: &str, args: &[&str]) -> Output {
    run_bounded(Command::new(bin).args(args), WAIT)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const SERVER: &str = env!("CARGO_BIN_EXE_udp_server");
const CLIENT: &str = env!("CARGO_BIN_EXE_udp_client");
const PROXY: &str = env!("CARGO_BIN_EXE_tcp_proxy");
const SOCKBENCH: &str = env!("CARGO_BIN_EXE_sockbench");

#[test]
fn help_speaks_of_what_things_are_not_of_seeds() {
    let pages: &[(&str, &[&str])] = &[
        (SERVER, &["--help"]),
        (CLIENT, &["--help"]),
        (PROXY, &["--help"]),
        (PROXY, &["bench", "--help"]),
        (SOCKBENCH, &["--help"]),
        (SOCKBENCH, &["udp", "--help"]),
        (SOCKBENCH, &["tcp", "--help"]),
        (SOCKBENCH, &["mux", "--help"]),
        (SOCKBENCH, &["ceiling", "--help"]),
    ];
    for (bin, args) in pages {
        let out = run(bin, args);
        assert_eq!(out.status.code(), Some(0), "{bin} {args:?}");
        let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
        assert!(text.contains("usage:"), "{bin} {args:?}: {text}");
        assert!(
            !text.contains("seed"),
            "{bin} {args:?} talks of seeds:\n{text}"
        );
    }
}

#[test]
fn an_invalid_choice_names_the_valid_ones() {
    let cases: &[(&str, &[&str], &[&str])] = &[
        (
            PROXY,
            &[
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                "127.0.0.1:9",
                "--mode",
                "foo",
            ],
            &["tokio", "splice", "std-copy"],
        ),
        (SERVER, &["--method", "nope"], &["mmsg", "epoll", "thread"]),
        (SOCKBENCH, &["mux", "--method", "nope"], &["mmsg", "epoll"]),
        (CLIENT, &["--scheduler", "nope"], &["fifo", "rr", "other"]),
    ];
    for (bin, args, valid) in cases {
        let out = run(bin, args);
        let err = common::one_line_error(&out, 2, "valid values:", &format!("{bin} {args:?}"));
        for v in *valid {
            assert!(err.contains(v), "{bin} {args:?} does not name {v}: {err}");
        }
    }
}

#[test]
fn a_config_error_says_where_in_the_file() {
    let dir = TempDir::new("help-toml");
    // An unknown key on line 3; a string left open on line 2, found where
    // the line ends (column 18).
    let unknown = dir.file("unknown.toml", "buffer_size = 1460\n\nlisen = 3\n");
    let open = dir.file("open.toml", "# a comment\nbuffer_size = \"12\n");
    for (file, place) in [(&unknown, "line 3, column 1"), (&open, "line 2, column 18")] {
        let out = run(CLIENT, &["--config", file.to_str().unwrap()]);
        common::one_line_error(&out, 2, place, &format!("{file:?}"));
    }
}

#[test]
fn a_doubled_receive_buffer_is_explained() {
    // Linux reports twice what was asked (half is its bookkeeping): the
    // listening line says so, or `--recv-buffer-size 1M` reads as 2000000.
    let mut server = common::ChildGuard::spawn(
        Command::new(SERVER)
            .args(["--listen", "127.0.0.1:0", "--recv-buffer-size", "1M"])
            .stdout(std::process::Stdio::piped()),
        "udp_server",
    );
    let lines = server.stdout_lines();
    let first = lines.next_line(WAIT).expect("a listening line");
    assert!(first.contains("2000000 bytes granted"), "{first}");
    assert!(first.contains("Linux doubles the request"), "{first}");
}

#[test]
fn the_servers_help_shows_every_default() {
    let out = run(SERVER, &["--help"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // Each option's paragraph runs from its flag to the next blank line.
    for flag in [
        "--listen",
        "--interval",
        "--idle-timeout",
        "--end-grace",
        "--recv-buffer-size",
        "--max-peers",
        "--method",
        "--threads",
        "--metrics",
        "--metrics-retain",
    ] {
        let start = text
            .find(&format!("{flag} <"))
            .unwrap_or_else(|| panic!("{flag} not in help:\n{text}"));
        let paragraph = text[start..].split("\n\n").next().unwrap();
        assert!(
            paragraph.contains("[default:"),
            "no default for {flag}: {paragraph}"
        );
    }
}

#[test]
fn iperf3_short_flags_work_where_they_do_not_clash() {
    // -P clients and -J JSON on the client; -i interval and -J on the
    // server. -t stays the byte total, and its help says so.
    let out = run(CLIENT, &["--local", "-n", "100", "-P", "2", "-J"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("-J is JSON");
    assert_eq!(report["clients"].as_array().map(Vec::len), Some(2));
    let help = String::from_utf8_lossy(&run(CLIENT, &["--help"]).stdout).into_owned();
    assert!(help.contains("Unlike iperf3's -t"), "{help}");
    let mut server = common::ChildGuard::spawn(
        Command::new(SERVER)
            .args(["--listen", "127.0.0.1:0", "-i", "100ms", "-J"])
            .stdout(std::process::Stdio::piped()),
        "udp_server",
    );
    let lines = server.stdout_lines();
    let first = lines.next_line(WAIT).expect("a listening line");
    let v: serde_json::Value = serde_json::from_str(&first).expect("-J is NDJSON");
    assert_eq!(v["event"], "listening");
}

/// What an iperf3 user types by reflex gets the netspeed spelling in the
/// one-line error, with exit 2 (issue 28).
#[test]
fn iperf3_reflexes_are_answered_with_the_netspeed_spelling() {
    let client = env!("CARGO_BIN_EXE_udp_client");
    let server = env!("CARGO_BIN_EXE_udp_server");
    for (bin, args, says) in [
        (client, &["-c", "127.0.0.1"][..], "is `-s HOST:PORT` here"),
        (client, &["-p", "5201"], "is `-s HOST:PORT` here"),
        (client, &["-u"], "-u is not needed"),
        (client, &["-l", "1400"], "is -b here, e.g. `-b 1400`"),
        (client, &["-1"], "`udp_server --one-off`"),
        (
            client,
            &["-b", "100M"],
            "for a rate (iperf3's -b) use --rate",
        ),
        (server, &["-R"], "are udp_client's"),
    ] {
        common::one_line_error(&run(bin, args), 2, says, &format!("{args:?}"));
    }
}

/// `-t 5` means five seconds to an iperf3 user and five bytes here: it is
/// refused (exit 2) with the flag that means a time, as the README says
/// of iperf3 spellings; `-t 5B` is five bytes, and no per-GB figure of so
/// little (issue 42).
#[test]
fn a_small_unitless_total_is_refused_and_a_unit_says_bytes() {
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = sink.local_addr().unwrap().to_string();
    let out = run(CLIENT, &["-s", &to, "--no-server", "-t", "5", "--json"]);
    common::one_line_error(&out, 2, "--duration 5s", "-t 5");
    assert!(stderr(&out).contains("-t 5B"), "{}", stderr(&out));
    sink.set_nonblocking(true).unwrap();
    assert!(
        sink.recv(&mut [0u8; 64]).is_err(),
        "a refused run sent nothing"
    );
    let out = run(CLIENT, &["-s", &to, "--no-server", "-t", "5B", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["sent_bytes"], 5, "{report}");
    assert!(report["cpu"]["seconds_per_gb"].is_null(), "{report}");
}

#[test]
fn every_binary_says_its_release_and_wire_version() {
    // Two hosts on different releases compare these lines.
    let wanted = format!(
        "{} (wire protocol version {})",
        env!("CARGO_PKG_VERSION"),
        netspeed::wire::VERSION
    );
    for (bin, name) in [
        (SERVER, "udp_server"),
        (CLIENT, "udp_client"),
        (PROXY, "tcp_proxy"),
        (SOCKBENCH, "sockbench"),
    ] {
        let out = run(bin, &["--version"]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let line = String::from_utf8_lossy(&out.stdout);
        assert_eq!(line.trim(), format!("{name} {wanted}"));
    }
}
