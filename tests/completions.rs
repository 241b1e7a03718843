//! Each binary's hidden `--completions SHELL` and `--man` (issue 16): run
//! the real binaries, check that the output is for that binary and knows
//! its real flags, that `--help` keeps the two flags hidden, and that an
//! unknown shell is one line and exit 2.

mod common;

use common::run_bounded;
use std::process::{Command, Output};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// Each binary, and long flags or subcommands of its own that its
/// completions and man page must name.
const BINARIES: &[(&str, &str, &[&str])] = &[
    (
        "udp_client",
        env!("CARGO_BIN_EXE_udp_client"),
        &["--buffer-size", "--server-addr"],
    ),
    (
        "udp_server",
        env!("CARGO_BIN_EXE_udp_server"),
        &["--recv-buffer-size"],
    ),
    (
        "tcp_proxy",
        env!("CARGO_BIN_EXE_tcp_proxy"),
        &["--upstream", "bench"],
    ),
    (
        "sockbench",
        env!("CARGO_BIN_EXE_sockbench"),
        &["mux", "ceiling"],
    ),
];

fn run(bin: &str, args: &[&str]) -> Output {
    run_bounded(Command::new(bin).args(args), WAIT)
}

fn stdout_ok(bin: &str, args: &[&str]) -> String {
    let out = run(bin, args);
    assert!(
        out.status.success(),
        "{bin} {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{bin} {args:?} wrote to stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("output is UTF-8")
}

/// `--completions` or `--man` appears: they are kept out of `--help` and
/// out of the completions.
fn names_a_hidden_flag(text: &str) -> bool {
    text.contains("--completions") || text.contains("--man")
}

/// A flag in a man page may be written with roff's escaped hyphens.
fn mentions(text: &str, word: &str) -> bool {
    text.contains(word) || text.contains(&word.replace('-', "\\-"))
}

#[test]
fn completions_name_the_binary_and_its_flags() {
    for (name, bin, words) in BINARIES {
        for shell in ["bash", "zsh", "fish"] {
            let script = stdout_ok(bin, &["--completions", shell]);
            assert!(script.contains(name), "{name} {shell}: no name:\n{script}");
            for word in *words {
                // fish lists long flags without their dashes (`-l buffer-size`).
                let word = if shell == "fish" {
                    word.trim_start_matches('-')
                } else {
                    word
                };
                assert!(
                    script.contains(word),
                    "{name} {shell}: no {word}:\n{script}"
                );
            }
        }
    }
}

#[test]
fn man_pages_are_roff_for_the_binary() {
    for (name, bin, words) in BINARIES {
        let page = stdout_ok(bin, &["--man"]);
        // clap_mangen puts two lines defining the apostrophe string (`.ie`,
        // `.el`) before the title; `.TH` is the first line that is not.
        let first = page
            .lines()
            .find(|l| !l.starts_with(".ie") && !l.starts_with(".el"))
            .unwrap_or_default();
        assert!(
            first.starts_with(&format!(".TH {name} 1")),
            "{name}: no .TH header first: {first:?}"
        );
        assert!(page.contains(".SH NAME"), "{name}: no NAME section");
        for word in *words {
            assert!(mentions(&page, word), "{name}: man page lacks {word}");
        }
    }
}

#[test]
fn the_flags_work_after_other_arguments_and_subcommands() {
    let (_, sockbench, _) = BINARIES[3];
    // The parent's page names sockbench-mux(1); this is that page.
    let page = stdout_ok(sockbench, &["mux", "--man"]);
    assert!(page.contains("\n.TH sockbench-mux 1"), "{page}");
    assert!(mentions(&page, "--rcvbuf"), "{page}");
    // Its synopsis is the command as typed.
    assert!(page.contains("\\fBsockbench mux\\fR"), "{page}");
    let root = stdout_ok(sockbench, &["--man"]);
    assert!(mentions(&root, "sockbench-mux(1)"), "{root}");
    // clap's `help` subcommand has no page, so the listing names none.
    assert!(!mentions(&root, "sockbench-help"), "{root}");
    // A flag's value is not a subcommand: this is tcp_proxy's own page.
    let (_, proxy, _) = BINARIES[2];
    let page = stdout_ok(proxy, &["--config", "bench", "--man"]);
    assert!(page.contains("\n.TH tcp_proxy 1"), "{page}");
    let page = stdout_ok(proxy, &["bench", "--man"]);
    assert!(page.contains("\n.TH tcp_proxy-bench 1"), "{page}");
    assert!(mentions(&page, "--requests"), "{page}");
    let script = stdout_ok(proxy, &["bench", "--completions=zsh"]);
    assert!(script.contains("tcp_proxy"));
}

/// `--completions` and `--man` are read before clap parses (output::manual):
/// no completion script offers them and `--help`'s list of flags does not
/// hold them, but `--help` names them once, in its closing line, so that
/// a user can find them (issue 42).
#[test]
fn help_names_the_hidden_flags_once_and_the_completions_never() {
    for (name, bin, _) in BINARIES {
        for shell in ["bash", "zsh", "fish"] {
            let text = stdout_ok(bin, &["--completions", shell]);
            assert!(
                !names_a_hidden_flag(&text),
                "{name} --completions {shell} names a hidden flag:\n{text}"
            );
        }
        let help = stdout_ok(bin, &["--help"]);
        let (flags, closing) = help
            .split_once("Also: --completions SHELL")
            .unwrap_or_else(|| panic!("{name} --help does not name --completions:\n{help}"));
        assert!(
            !names_a_hidden_flag(flags),
            "{name}: in the flag list:\n{help}"
        );
        assert!(
            closing.contains("--man"),
            "{name}: --man not named:\n{help}"
        );
    }
}

#[test]
fn an_unknown_shell_is_one_line_and_exit_2() {
    for (name, bin, _) in BINARIES {
        for args in [&["--completions", "nosuchshell"][..], &["--completions"]] {
            let out = run(bin, args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{name} {args:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{name} {args:?}: {err}");
            assert!(err.starts_with(&format!("{name}: error: ")), "{err}");
            assert!(
                err.contains("bash"),
                "{name}: valid shells not listed: {err}"
            );
            assert!(out.stdout.is_empty(), "{name} {args:?} wrote to stdout");
        }
    }
}
