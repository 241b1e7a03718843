//! Shell completions and man pages, from the same clap definitions that
//! parse the flags (clap_complete, clap_mangen), so they cannot drift from
//! `--help`.
//!
//! Every binary calls [`handle`] first thing in `main`. Two flags are
//! looked for in argv before clap parses it, which keeps them out of the
//! derive structs, out of `--help` and out of the completions themselves,
//! and lets them work with or without subcommands and without any
//! otherwise required argument:
//!
//! * `--completions SHELL` (bash, zsh, fish, elvish, powershell) prints the
//!   completion script;
//! * `--man` prints the roff man page (section 1); after a subcommand
//!   (`sockbench udp --man`), that subcommand's page (`sockbench-udp`),
//!   which the parent's page names.
//!
//! Either one writes to stdout and exits 0; a missing or unknown shell is a
//! one-line usage error (exit 2). With neither, [`handle`] returns and the
//! binary parses its flags as usual.

use crate::error::{Error, Result};
use clap::Command;
use clap_complete::Shell;
use std::ffi::OsString;
use std::io::Write;

/// The hidden flag that prints a completion script.
pub const COMPLETIONS: &str = "--completions";
/// The hidden flag that prints the man page.
pub const MAN: &str = "--man";

/// What argv asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    Completions(Shell),
    Man,
}

/// The shell names `--completions` accepts, for the error message.
fn shell_names() -> String {
    use clap::ValueEnum;
    Shell::value_variants()
        .iter()
        .filter_map(|s| s.to_possible_value())
        .map(|v| v.get_name().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn shell(name: Option<&OsString>) -> Result<Shell> {
    let Some(name) = name else {
        return Err(Error::usage(format!(
            "{COMPLETIONS} needs a shell: {} (see --help)",
            shell_names()
        )));
    };
    let name = name.to_string_lossy();
    name.parse::<Shell>().map_err(|_| {
        Error::usage(format!(
            "{COMPLETIONS}: unknown shell '{name}' (possible values: {})",
            shell_names()
        ))
    })
}

/// Looks for `--completions SHELL`, `--completions=SHELL` or `--man` in
/// `args` (argv without the program name), up to a `--`. The first one
/// found wins.
pub fn request(args: &[OsString]) -> Result<Option<Request>> {
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--" {
            break;
        }
        if arg == MAN {
            return Ok(Some(Request::Man));
        }
        if arg == COMPLETIONS {
            return shell(it.next()).map(|s| Some(Request::Completions(s)));
        }
        if let Some(name) = arg
            .to_str()
            .and_then(|a| a.strip_prefix(COMPLETIONS))
            .and_then(|rest| rest.strip_prefix('='))
        {
            return shell(Some(&OsString::from(name))).map(|s| Some(Request::Completions(s)));
        }
    }
    Ok(None)
}

/// The completion script or man page for `cmd`, named after `cmd`.
pub fn render(req: Request, mut cmd: Command) -> Vec<u8> {
    let mut buf = Vec::new();
    match req {
        Request::Completions(shell) => {
            let name = cmd.get_name().to_string();
            clap_complete::generate(shell, &mut cmd, name, &mut buf);
        }
        Request::Man => {
            // The footer's source: the page's name (`sockbench-udp`, not
            // `udp`) and this crate's version, which subcommands lack.
            let source = format!(
                "{} {}",
                cmd.get_display_name().unwrap_or(cmd.get_name()),
                env!("CARGO_PKG_VERSION")
            );
            // `help` is a subcommand in clap's parser but has no page of
            // its own; the listing must not name one.
            let cmd = cmd.disable_help_subcommand(true);
            // Writing into a Vec cannot fail.
            let _ = clap_mangen::Man::new(cmd).source(source).render(&mut buf);
        }
    }
    buf
}

/// The command a man page is asked of: `cmd` itself, or the subcommand
/// that `args` name first (`sockbench udp --man`), as the binaries read a
/// subcommand: only as the first argument at its level, so `tcp_proxy
/// --config bench --man` is tcp_proxy's page. Its page is named as the
/// parent's page lists it (`sockbench-udp`, after git's pages); its
/// synopsis keeps the command as typed (`sockbench udp`).
pub fn man_subject(mut cmd: Command, args: &[OsString]) -> Command {
    for arg in args {
        let Some(sub) = arg
            .to_str()
            .and_then(|word| cmd.find_subcommand(word))
            .cloned()
        else {
            break;
        };
        let page = format!(
            "{}-{}",
            cmd.get_display_name().unwrap_or(cmd.get_name()),
            sub.get_name()
        );
        let typed = format!(
            "{} {}",
            cmd.get_bin_name().unwrap_or(cmd.get_name()),
            sub.get_name()
        );
        cmd = sub.display_name(page).bin_name(typed);
    }
    cmd
}

/// If argv (`args`, program name first) holds `--completions SHELL` or
/// `--man`, prints what it asks for about `cmd()` to stdout and exits 0;
/// a bad shell name prints a one-line error and exits 2. Otherwise
/// returns, having built nothing.
pub fn handle(args: &[OsString], cmd: impl FnOnce() -> Command) {
    let rest = args.get(1..).unwrap_or_default();
    let req = match request(rest) {
        Ok(Some(req)) => req,
        Ok(None) => return,
        Err(e) => super::exit_with(&e),
    };
    let cmd = match req {
        Request::Man => man_subject(cmd(), rest),
        Request::Completions(_) => cmd(),
    };
    let out = render(req, cmd);
    let mut stdout = std::io::stdout().lock();
    // A closed pipe (`--man | head`) is not an error worth a message.
    let _ = stdout.write_all(&out).and_then(|()| stdout.flush());
    std::process::exit(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(args: &[&str]) -> Result<Option<Request>> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        request(&args)
    }

    #[test]
    fn finds_the_flags_anywhere_before_double_dash() {
        assert_eq!(req(&[]).unwrap(), None);
        assert_eq!(req(&["-b", "100"]).unwrap(), None);
        assert_eq!(req(&["--man"]).unwrap(), Some(Request::Man));
        assert_eq!(req(&["mux", "--man"]).unwrap(), Some(Request::Man));
        assert_eq!(
            req(&["--completions", "zsh"]).unwrap(),
            Some(Request::Completions(Shell::Zsh))
        );
        assert_eq!(
            req(&["--completions=powershell"]).unwrap(),
            Some(Request::Completions(Shell::PowerShell))
        );
        assert_eq!(req(&["--", "--man"]).unwrap(), None);
    }

    #[test]
    fn a_bad_or_missing_shell_is_a_usage_error() {
        for args in [&["--completions", "nosuchshell"][..], &["--completions"]] {
            let err = req(args).unwrap_err();
            assert_eq!(err.exit_code(), 2);
            let msg = err.to_string();
            assert!(!msg.contains('\n'), "{msg}");
            assert!(msg.contains("bash, elvish, fish, powershell, zsh"), "{msg}");
        }
    }

    #[test]
    fn a_subcommand_before_man_gets_its_own_page() {
        let cmd = || {
            Command::new("demo")
                .subcommand(Command::new("run").arg(clap::Arg::new("speed").long("speed")))
        };
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        let sub = man_subject(cmd(), &args(&["run", "--man"]));
        assert_eq!(sub.get_display_name(), Some("demo-run"));
        let man = String::from_utf8(render(Request::Man, sub)).unwrap();
        assert!(
            man.contains("\n.TH demo\\-run 1") || man.contains("\n.TH demo-run 1"),
            "{man}"
        );
        assert!(man.contains("speed"), "{man}");
        // The synopsis is the command as typed.
        assert!(
            man.contains("demo run") || man.contains("demo\\ run"),
            "{man}"
        );
        // Only a first word names a subcommand: not a flag's value, not a
        // word after the flag.
        for rest in [&["x", "run", "--man"][..], &["--man", "run"]] {
            assert_eq!(man_subject(cmd(), &args(rest)).get_display_name(), None);
        }
    }

    #[test]
    fn renders_completions_and_a_man_page() {
        let cmd = || Command::new("demo").arg(clap::Arg::new("speed").long("speed"));
        let bash = String::from_utf8(render(Request::Completions(Shell::Bash), cmd())).unwrap();
        assert!(bash.contains("demo") && bash.contains("--speed"), "{bash}");
        let man = String::from_utf8(render(Request::Man, cmd())).unwrap();
        assert!(man.contains("\n.TH demo 1"), "{man}");
    }
}
