//! Command-line flags and TOML files, merged into one validated config per
//! role: defaults, then the file, then the flags.
//!
//! Why every field is an `Option` in both the flags and the file: that is
//! what lets a flag override a file value and a file value override a
//! default, without a flag's default silently winning over the file.
//! Unknown TOML keys are errors that name the key (`deny_unknown_fields`).

pub mod client;
mod client_tables;
pub mod proxy;
pub mod server;
pub mod sockbench;
pub mod stamp;

pub use client::*;
pub use server::*;
pub use stamp::{
    StampClientKeys, StampClock, StampClockArgs, StampSender, StampServerKeys, StampSettings,
};

/// What `--version` prints on every binary: the release, and the wire
/// protocol version its UDP client and server speak (two hosts must
/// speak the same; a mismatch says so at once).
/// Every binary's `--help` ends with the two flags [`crate::output::manual`]
/// reads before clap does (so they are not in the flag list).
pub const EXTRA_HELP: &str = "Also: --completions SHELL prints a completion script (bash, zsh, fish, elvish, powershell); --man prints the man page.";

pub const VERSION_TEXT: &str = concat!(env!("CARGO_PKG_VERSION"), " (wire protocol version 4)");

use crate::auth::Psk;
use crate::error::{Error, Result};
use crate::sys::SchedPolicy;
use crate::units;
use clap::Parser;
use serde::Deserialize;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A size in a TOML file: `4194304` or `"4M"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum SizeValue {
    Number(u64),
    Text(String),
}

impl SizeValue {
    /// A flag's value: checked as it is parsed, like the file's is when
    /// read.
    pub fn from_arg(s: &str) -> std::result::Result<SizeValue, units::UnitError> {
        size_arg(s).map(SizeValue::Number)
    }

    pub fn bytes(&self, key: &str) -> Result<u64> {
        match self {
            SizeValue::Number(n) => Ok(*n),
            SizeValue::Text(s) => {
                units::parse_size(s).map_err(|e| Error::usage(format!("{key}: {e}")))
            }
        }
    }
}

/// A duration in a TOML file: `2` (seconds) or `"250ms"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum DurationValue {
    Seconds(f64),
    Text(String),
    /// From a flag, already parsed.
    #[serde(skip)]
    Parsed(Duration),
}

impl DurationValue {
    /// A flag's value: checked as it is parsed.
    pub fn from_arg(s: &str) -> std::result::Result<DurationValue, units::UnitError> {
        duration_arg(s).map(DurationValue::Parsed)
    }

    pub fn duration(&self, key: &str) -> Result<Duration> {
        let text = match self {
            DurationValue::Parsed(d) => return Ok(*d),
            DurationValue::Seconds(s) => s.to_string(),
            DurationValue::Text(t) => t.clone(),
        };
        units::parse_duration(&text).map_err(|e| Error::usage(format!("{key}: {e}")))
    }
}

/// One layer of settings (defaults, a config file, or the flags), every
/// field optional: what a layer leaves out, the layer below decides.
///
/// A binary's flags and its TOML file share one type per role (clap and
/// serde derive on the same struct; TOML keys are the long flags with
/// underscores), so the merge is one line per field, written once by
/// [`impl_layer!`](crate::impl_layer), and validation runs once, on the
/// merged layer.
pub trait Layer: Sized {
    /// The groups of keys that are one choice (`listen` or `port`): a
    /// layer that sets any of them replaces the whole group below it.
    const GROUPS: &'static [&'static [&'static str]] = &[];

    /// `self` over `lower`: each field of `self` wins where it is set.
    fn over(self, lower: Self) -> Self;
}

/// `a` and `b` are keys of one group of `L` ([`Layer::GROUPS`]): two ways
/// of making one choice, so a flag naming one replaces the file's other.
pub fn one_choice<L: Layer>(a: &str, b: &str) -> bool {
    L::GROUPS
        .iter()
        .any(|group| group.contains(&a) && group.contains(&b))
}

/// Two settings that cannot go together, named by their keys (the long
/// flags with underscores), and why: a line of a binary's table
/// ([`ClientFile::CONFLICTS`], [`ServerFile::CONFLICTS`]). The table is checked
/// once, on the file's and the flags' settings merged, so two keys
/// conflict wherever each came from: both flags, both in the file, or one
/// of each. Only keys of one [`Layer::GROUPS`] group (`packets`,
/// `total_send`, `duration`) are also one choice: there a flag replaces
/// the file's choice, as a flag replaces the file's value of its own key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conflict {
    pub a: &'static str,
    pub b: &'static str,
    pub why: &'static str,
}

impl Conflict {
    /// The one-line usage error, the same words wherever `a` and `b` came
    /// from, each named as the user gave it ([`Names`]).
    pub fn message(&self, names: &Names) -> String {
        format!(
            "{} cannot be used with {}: {}",
            names.of(self.a),
            names.of(self.b),
            self.why
        )
    }
}

/// A setting that means nothing without another (`key` needs `needs`),
/// and why: a line of a binary's table ([`ClientFile::REQUIREMENTS`],
/// [`ServerFile::REQUIREMENTS`]), checked like [`Conflict`]s, on the merged
/// settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requirement {
    pub key: &'static str,
    pub needs: &'static str,
    pub why: &'static str,
}

impl Requirement {
    /// The one-line usage error, the same words wherever `key` came from;
    /// `key` named as the user gave it, `needs` as a flag unless the file
    /// gave it ([`Names`]).
    pub fn message(&self, names: &Names) -> String {
        format!(
            "{} needs {}: {}",
            names.of(self.key),
            names.of(self.needs),
            self.why
        )
    }
}

/// The long flag of a config key: `--total-send` for `total_send`.
pub fn flag_of(key: &str) -> String {
    format!("--{}", key.replace('_', "-"))
}

/// Every key that a binary's tables name, once each, in table order.
pub fn table_keys(conflicts: &[Conflict], requirements: &[Requirement]) -> Vec<&'static str> {
    let mut keys = Vec::new();
    let all = conflicts.iter().flat_map(|c| [c.a, c.b]);
    for key in all.chain(requirements.iter().flat_map(|r| [r.key, r.needs])) {
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys
}

/// How a message names the keys of the tables: as the user wrote each. A
/// flag (`--total-send`), unless only the config file gave the key: then
/// as the file spells it (`total_send`, or udp_client's `connected =
/// false` for the `plain_send` it means). [`Names::default`] names every
/// key as its flag.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Names {
    /// The keys that the file gave and the flags did not, with the file's
    /// spelling of each.
    from_file: Vec<(&'static str, String)>,
}

impl Names {
    /// Names for `keys`: a key that `in_file` gives (as the file spells it)
    /// and `in_flags` does not is the file's.
    pub fn new(
        keys: &[&'static str],
        in_file: impl Fn(&str) -> Option<String>,
        in_flags: impl Fn(&str) -> bool,
    ) -> Names {
        let from_file = keys
            .iter()
            .filter(|key| !in_flags(key))
            .filter_map(|&key| in_file(key).map(|spelled| (key, spelled)))
            .collect();
        Names { from_file }
    }

    /// `key` as the user wrote it.
    pub fn of(&self, key: &str) -> String {
        match self.from_file.iter().find(|(k, _)| *k == key) {
            Some((_, spelled)) => spelled.clone(),
            None => flag_of(key),
        }
    }
}

/// Refuses the first pair of `conflicts` that are both given, then the
/// first of `requirements` given without what it needs, naming each key
/// as `names` says the user wrote it. `given(key)` says whether the
/// merged settings (the file's and the flags', before the defaults) set
/// `key`; None for a key the binary does not have, which a table must
/// never name (each binary's tests ask for every key).
pub fn check_tables(
    conflicts: &[Conflict],
    requirements: &[Requirement],
    given: impl Fn(&str) -> Option<bool>,
    names: &Names,
) -> Result<()> {
    let given = |key: &str| given(key).unwrap_or_else(|| panic!("{key}: not a key of this table"));
    if let Some(c) = conflicts.iter().find(|c| given(c.a) && given(c.b)) {
        return Err(Error::usage(c.message(names)));
    }
    if let Some(r) = requirements
        .iter()
        .find(|r| given(r.key) && !given(r.needs))
    {
        return Err(Error::usage(r.message(names)));
    }
    Ok(())
}

/// The one way settings are merged, for every binary: defaults < file <
/// flags.
pub fn layered<L: Layer>(defaults: L, file: Option<L>, flags: L) -> L {
    let below = match file {
        Some(file) => file.over(defaults),
        None => defaults,
    };
    flags.over(below)
}

/// Reads the file layer named by `--config`, if any.
pub fn file_layer<L: serde::de::DeserializeOwned>(path: Option<&Path>) -> Result<Option<L>> {
    path.map(read_toml).transpose()
}

/// Implements [`Layer`] for a struct: `option` fields (`Option<T>`) take
/// the upper layer's value when set; `switch` fields (`bool` flags) are on
/// when any layer turns them on; `nested` fields are layers themselves;
/// each `group` is one choice made with several fields (`listen` or
/// `port`; `packets`, `total_send` or `duration`): a layer that sets any
/// of them replaces the whole group below it.
#[macro_export]
macro_rules! impl_layer {
    ($ty:ident {
        $(option: [$($opt:ident),* $(,)?])?
        $(switch: [$($sw:ident),* $(,)?])?
        $(nested: [$($nest:ident),* $(,)?])?
        $(group: [$([$($g:ident),+ $(,)?]),* $(,)?])?
    }) => {
        impl $crate::config::Layer for $ty {
            const GROUPS: &'static [&'static [&'static str]] =
                &[$($(&[$(stringify!($g)),+]),*)?];

            fn over(self, lower: Self) -> Self {
                $($(
                    let upper_chose = false $(|| self.$g.is_some())+;
                    let ($($g,)+) = if upper_chose {
                        ($(self.$g,)+)
                    } else {
                        ($(lower.$g,)+)
                    };
                )*)?
                $ty {
                    $($($opt: self.$opt.or(lower.$opt),)*)?
                    $($($sw: self.$sw || lower.$sw,)*)?
                    $($($nest: $crate::config::Layer::over(self.$nest, lower.$nest),)*)?
                    $($($($g,)+)*)?
                }
            }
        }
    };
}

/// The largest config file read. Real ones are a few hundred bytes; the
/// bound keeps `--config /dev/zero` or a huge file from eating memory.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads and parses a TOML config file: a regular file of at most
/// [`MAX_CONFIG_BYTES`], or a one-line usage error.
pub fn read_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    use std::io::Read;
    let shown = path.display();
    let fail = |why: String| Error::usage(clip(&format!("config {shown}: {why}")));
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::usage(clip(&format!("cannot read config {shown}: {e}"))))?;
    if !meta.is_file() {
        return Err(fail("not a regular file".into()));
    }
    let too_big = || fail(format!("larger than {} KiB", MAX_CONFIG_BYTES >> 10));
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(too_big());
    }
    let mut text = String::new();
    std::fs::File::open(path)
        // Never more than the bound, even if the file grows meanwhile.
        .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| Error::usage(clip(&format!("cannot read config {shown}: {e}"))))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(too_big());
    }
    parse_toml(&text).map_err(fail)
}

/// A `--thing` / `--no-thing` flag pair as a layer value: `Some(true)`,
/// `Some(false)`, or `None` when neither was given (a lower layer decides).
pub fn on_off(on: bool, off: bool) -> Option<bool> {
    if on {
        Some(true)
    } else if off {
        Some(false)
    } else {
        None
    }
}

/// Parses a config text; the error is one line naming the bad key, with
/// any echo of the file's text cut short.
pub fn parse_toml<T: serde::de::DeserializeOwned>(text: &str) -> std::result::Result<T, String> {
    toml::from_str(text).map_err(|e| {
        let place = e
            .span()
            .and_then(|span| text.get(..span.start))
            .map(|before| {
                let line = before.matches('\n').count() + 1;
                let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                format!("line {line}, column {column}: ")
            })
            .unwrap_or_default();
        clip(&format!("{place}{}", e.message().replace('\n', " ").trim()))
    })
}

/// The longest error line: anything the user typed is echoed at most this
/// long.
pub const MAX_MESSAGE: usize = 300;

/// `text` on one line, cut to [`MAX_MESSAGE`] characters.
pub fn clip(text: &str) -> String {
    let line = text.replace(['\n', '\r'], " ");
    match line.char_indices().nth(MAX_MESSAGE) {
        Some((cut, _)) => format!("{}… (cut)", &line[..cut]),
        None => line,
    }
}

/// The clap parser for every size flag: [`units::parse_size`].
pub fn size_arg(s: &str) -> std::result::Result<u64, units::UnitError> {
    units::parse_size(s)
}

/// The clap parser for every rate flag: [`units::parse_rate`].
pub fn rate_arg(s: &str) -> std::result::Result<u64, units::UnitError> {
    units::parse_rate(s)
}

/// The clap parser for every duration flag: [`units::parse_duration`].
pub fn duration_arg(s: &str) -> std::result::Result<Duration, units::UnitError> {
    units::parse_duration(s)
}

/// The clap parser for every percentage flag: [`units::parse_percent`].
pub fn percent_arg(s: &str) -> std::result::Result<f64, units::UnitError> {
    units::parse_percent(s)
}

/// Resolves `host:port`, `[::1]:35000` or `localhost:35000`. A malformed
/// address is a usage error (exit 2); a well-formed name that does not
/// resolve is a runtime failure (exit 1): the same command may work later.
pub fn resolve(addr: &str) -> Result<SocketAddr> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(a);
    }
    let malformed = || {
        Error::usage(format!(
            "invalid address '{addr}': expected HOST:PORT, e.g. 127.0.0.1:35000 or [::1]:35000"
        ))
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(malformed)?;
    // An IPv6 literal needs brackets: `::1:80` is ambiguous.
    let bare_ipv6 = host.contains(':') && !(host.starts_with('[') && host.ends_with(']'));
    if host.is_empty() || bare_ipv6 || port.parse::<u16>().is_err() {
        return Err(malformed());
    }
    let mut found = addr
        .to_socket_addrs()
        .map_err(|e| Error::runtime(format!("cannot resolve '{host}': {e}")))?;
    found
        .next()
        .ok_or_else(|| Error::runtime(format!("cannot resolve '{host}': no addresses found")))
}

/// `--psk` and `--psk-file`, shared by both binaries.
#[derive(clap::Args, Debug, Default)]
pub struct PskArgs {
    /// A pre-shared key (at least 8 bytes) that both ends know: the End
    /// and its answer then carry an HMAC-SHA256, and an answer or End
    /// without it is refused. Visible in `ps`; prefer --psk-file.
    #[arg(long, value_name = "KEY")]
    pub psk: Option<String>,
    /// Read the pre-shared key from this file (one line; trailing
    /// newline ignored).
    #[arg(long, value_name = "FILE")]
    pub psk_file: Option<PathBuf>,
}

/// The key from `--psk`, `--psk-file` or the config file's `psk_file`.
pub fn psk_from(args: &PskArgs, file_psk: Option<&Path>) -> Result<Option<Psk>> {
    let key = match (&args.psk, args.psk_file.as_deref().or(file_psk)) {
        (Some(k), _) => k.as_bytes().to_vec(),
        (None, Some(path)) => {
            let meta = std::fs::metadata(path).map_err(|e| {
                Error::usage(clip(&format!(
                    "cannot read --psk-file {}: {e}",
                    path.display()
                )))
            })?;
            if !meta.is_file() || meta.len() > 4096 {
                return Err(Error::usage(clip(&format!(
                    "--psk-file {}: not a regular file of at most 4 KiB",
                    path.display()
                ))));
            }
            let mut key = std::fs::read(path).map_err(|e| {
                Error::usage(clip(&format!(
                    "cannot read --psk-file {}: {e}",
                    path.display()
                )))
            })?;
            while key.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                key.pop();
            }
            key
        }
        (None, None) => return Ok(None),
    };
    Psk::new(&key).map(Some).ok_or_else(|| {
        Error::usage(format!(
            "the pre-shared key must be at least {} bytes",
            crate::auth::MIN_KEY_LEN
        ))
    })
}

/// `--scheduler` and `--priority`, shared by both binaries (seed 002's -S, -P).
#[derive(clap::Args, Debug, Default)]
pub struct SchedArgs {
    /// Scheduling policy for this process (sched_setscheduler).
    #[arg(long, value_enum)]
    pub scheduler: Option<SchedPolicy>,
    /// Priority for --scheduler: 1..=99 for fifo and rr, 0 otherwise.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub priority: Option<i32>,
}

/// A validated scheduling request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sched {
    pub policy: SchedPolicy,
    pub priority: i32,
}

/// `--scheduler NAME`: the flag's names for [`SchedPolicy`] (sys knows
/// the policies, not the flags).
impl clap::ValueEnum for SchedPolicy {
    fn value_variants<'a>() -> &'a [Self] {
        &SchedPolicy::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

pub fn sched_from(policy: Option<SchedPolicy>, priority: Option<i32>) -> Result<Option<Sched>> {
    let Some(policy) = policy else {
        if priority.is_some() {
            return Err(Error::usage("--priority needs --scheduler"));
        }
        return Ok(None);
    };
    let range = policy.priority_range();
    let priority = priority.unwrap_or(*range.start());
    if !range.contains(&priority) {
        return Err(Error::usage(format!(
            "--priority {priority} is not valid for --scheduler {}: use {}..={}",
            policy.name(),
            range.start(),
            range.end()
        )));
    }
    Ok(Some(Sched { policy, priority }))
}

/// Most threads a UDP role or a sockbench cell runs: receive threads,
/// client sockets' threads, benchmark threads.
pub const MAX_THREADS: usize = 64;
/// Most tcp_proxy worker threads.
pub const MAX_PROXY_THREADS: usize = 256;

/// `--threads N`, checked the same way by every binary.
pub fn check_threads(n: usize, max: usize) -> Result<usize> {
    check_between("--threads", n, max)
}

/// The largest socket buffer size to ask for (`--recv-buffer-size`,
/// `--sndbuf`): the kernel takes an `int`.
pub const MAX_SOCKET_BUFFER: u64 = i32::MAX as u64;

/// `FLAG N` checked to be between 1 and `max`, with the one wording every
/// count and size limit uses.
pub fn check_between<T>(flag: &str, n: T, max: T) -> Result<T>
where
    T: Copy + PartialOrd + From<u8> + std::fmt::Display,
{
    if n < T::from(1) || n > max {
        return Err(Error::usage(format!(
            "{flag} {n}: must be between 1 and {max}"
        )));
    }
    Ok(n)
}

/// What an iperf3 user types by reflex that `program` spells differently:
/// the netspeed spelling of the iperf3 flag `arg`, for the one-line error.
/// Seed 001's `-b` (datagram size), `-s` (server address) and `-t` (a
/// volume) keep their meanings, so those are answered where their values
/// fail, not here.
pub fn iperf3_spelling(program: &str, arg: &str) -> Option<&'static str> {
    let client = program == "udp_client";
    Some(match arg {
        "-c" | "--client" if client => "iperf3's `-c HOST -p PORT` is `-s HOST:PORT` here",
        "-p" | "--port" if client => "iperf3's `-c HOST -p PORT` is `-s HOST:PORT` here",
        "-u" | "--udp" if client => "-u is not needed: udp_client always sends UDP",
        "-l" | "--length" if client => "iperf3's -l (datagram length) is -b here, e.g. `-b 1400`",
        "-1" | "--one-off" if client => {
            "-1 (one-off) belongs to the server: `udp_server --one-off`"
        }
        "--bidir" | "-R" | "--reverse" if !client => {
            "-R and --bidir are udp_client's: the client asks the server to send"
        }
        _ => return None,
    })
}

/// Parses flags the way the binaries do: `--help` and `--version` print and
/// exit 0; any other mistake becomes a one-line [`Error::Usage`], naming
/// the netspeed spelling of an iperf3 flag ([`iperf3_spelling`]).
pub fn parse_args<T: Parser>(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<T> {
    let mut cmd = T::command();
    let args = join_negative_values(&cmd, args.into_iter().collect());
    let parsed = cmd
        .try_get_matches_from_mut(args)
        .and_then(|mut m| T::from_arg_matches_mut(&mut m))
        .map_err(|e| e.format(&mut cmd));
    match parsed {
        Ok(parsed) => Ok(parsed),
        Err(e) => match e.kind() {
            clap::error::ErrorKind::DisplayHelp
            | clap::error::ErrorKind::DisplayVersion
            | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
            _ => {
                let text = e.render().to_string();
                let line = text.lines().next().unwrap_or("invalid arguments");
                let line = line.strip_prefix("error: ").unwrap_or(line);
                // An invalid choice names the valid ones on the same line.
                use clap::error::{ContextKind, ContextValue};
                let valid = match e.get(ContextKind::ValidValue) {
                    Some(ContextValue::Strings(v)) if !v.is_empty() => {
                        format!("; valid values: {}", v.join(", "))
                    }
                    _ => String::new(),
                };
                // A missing argument (`--loss-tolerance` without
                // `--find-limit`) is named on the next lines: bring it up.
                let valid = match e.get(ContextKind::InvalidArg) {
                    Some(ContextValue::Strings(v))
                        if e.kind() == clap::error::ErrorKind::MissingRequiredArgument
                            && !v.is_empty() =>
                    {
                        format!(" {}{valid}", v.join(", "))
                    }
                    _ => valid,
                };
                let program = cmd.get_name().to_string();
                let hint = match e.get(ContextKind::InvalidArg) {
                    Some(ContextValue::String(arg))
                        if e.kind() == clap::error::ErrorKind::UnknownArgument =>
                    {
                        iperf3_spelling(&program, arg).map(|h| format!(": {h}"))
                    }
                    _ => None,
                };
                let hint = hint.unwrap_or_default();
                Err(Error::usage(format!(
                    "{}{hint}{valid} (see --help)",
                    clip(line)
                )))
            }
        },
    }
}

/// `args` with a negative number after an option that takes a value
/// (`--rate -1`, `-t -5M`) joined to it (`--rate=-1`, `-t-5M`): it is the
/// option's value, which the option's own parser judges ("cannot be
/// negative"), not a flag (udp_server's `-1`) or an unknown one (clap's
/// "unexpected argument '-5'", or udp_client's hint that -1 is the
/// server's). Options of a subcommand are left as they are.
fn join_negative_values(
    cmd: &clap::Command,
    args: Vec<std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let takes_value = |option: &str| {
        let arg = match option.strip_prefix("--") {
            Some(long) => cmd.get_arguments().find(|a| {
                a.get_long() == Some(long) || a.get_all_aliases().is_some_and(|v| v.contains(&long))
            }),
            None => {
                let mut chars = option.strip_prefix('-').unwrap_or_default().chars();
                match (chars.next(), chars.next()) {
                    (Some(short), None) => {
                        cmd.get_arguments().find(|a| a.get_short() == Some(short))
                    }
                    _ => None,
                }
            }
        };
        arg.is_some_and(|a| a.get_action().takes_values())
    };
    let negative = |value: &str| {
        value
            .strip_prefix('-')
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit() || c == '.'))
    };
    let mut joined = Vec::with_capacity(args.len());
    let mut args = args.into_iter().peekable();
    while let Some(arg) = args.next() {
        if arg == "--" {
            joined.push(arg);
            joined.extend(args);
            break;
        }
        let next_negative = args.peek().and_then(|n| n.to_str()).is_some_and(negative);
        match arg.to_str() {
            Some(option) if next_negative && takes_value(option) => {
                let mut option = std::ffi::OsString::from(option);
                if option.to_str().is_some_and(|o| o.starts_with("--")) {
                    option.push("=");
                }
                option.push(args.next().expect("peeked"));
                joined.push(option);
            }
            _ => joined.push(arg),
        }
    }
    joined
}

#[cfg(test)]
mod iperf3_tests {
    use super::iperf3_spelling;

    #[test]
    fn iperf3_flags_are_named_in_netspeed_spelling_only_where_they_differ() {
        assert!(iperf3_spelling("udp_client", "-c")
            .unwrap()
            .contains("-s HOST:PORT"));
        assert!(iperf3_spelling("udp_client", "-l")
            .unwrap()
            .contains("-b 1400"));
        assert!(iperf3_spelling("udp_client", "-1")
            .unwrap()
            .contains("--one-off"));
        // udp_server has -p and -1 of its own; udp_client has -R.
        assert_eq!(iperf3_spelling("udp_server", "-p"), None);
        assert_eq!(iperf3_spelling("udp_server", "-1"), None);
        assert_eq!(iperf3_spelling("udp_client", "-R"), None);
        assert_eq!(iperf3_spelling("udp_client", "--nonsense"), None);
    }
}

/// What the config tests of every role share: a command line parsed the
/// way the binaries parse it, and a config file to point `--config` at.
#[cfg(test)]
pub(crate) mod testing {
    use super::proxy::{BenchConfig, ProxyConfig};
    use super::{parse_args, ClientConfig, Result, ServerConfig};
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// `program args...` through [`parse_args`].
    pub(crate) fn parse<T: clap::Parser>(program: &str, args: &[&str]) -> Result<T> {
        let argv = std::iter::once(program).chain(args.iter().copied());
        parse_args(argv.map(Into::into))
    }

    /// `fn NAME(args)`: the program's flags `args`, validated into its
    /// config the way its binary does it.
    macro_rules! config_from_flags {
        ($($name:ident: $config:ty = $program:literal),* $(,)?) => {$(
            pub(crate) fn $name(args: &[&str]) -> Result<$config> {
                <$config>::from_args(parse($program, args)?)
            }
        )*};
    }

    config_from_flags! {
        client: ClientConfig = "udp_client",
        server: ServerConfig = "udp_server",
        proxy: ProxyConfig = "tcp_proxy",
        bench: BenchConfig = "tcp_proxy bench",
    }

    /// A config file in a directory of its own, removed on drop.
    pub(crate) struct TempConfig {
        dir: PathBuf,
        pub path: PathBuf,
    }

    impl TempConfig {
        /// A file holding `text`, in a fresh directory (one per file, so
        /// that tests running at once never share one).
        pub(crate) fn new(text: &str) -> TempConfig {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("netspeed-cfg-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let config = TempConfig {
                path: dir.join("config.toml"),
                dir,
            };
            config.write(text);
            config
        }

        /// Replaces the file's text.
        pub(crate) fn write(&self, text: &str) {
            std::fs::write(&self.path, text).unwrap();
        }

        /// The path, as a flag's value.
        pub(crate) fn arg(&self) -> &str {
            self.path.to_str().unwrap()
        }
    }

    impl Drop for TempConfig {
        fn drop(&mut self) {
            std::fs::remove_dir_all(&self.dir).ok();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{client, server, TempConfig};
    use super::*;

    #[test]
    fn the_version_names_the_wire_version_the_code_speaks() {
        assert!(
            VERSION_TEXT.ends_with(&format!("(wire protocol version {})", crate::wire::VERSION)),
            "{VERSION_TEXT}"
        );
        assert!(VERSION_TEXT.starts_with(env!("CARGO_PKG_VERSION")));
    }
    use crate::meter::plan::Volume;
    use crate::meter::send::GsoRequest;

    #[test]
    fn client_defaults_are_seed_001s() {
        let cfg = client(&[]).unwrap();
        assert_eq!(cfg.server, "127.0.0.1:35000".parse().unwrap());
        assert_eq!(cfg.buffer_size, 5000);
        assert_eq!(cfg.volume, Volume::Bytes(1_000_000));
        assert_eq!(cfg.clients, 1);
        // The send path is the platform's fastest; --plain-send is seed 001's.
        assert!(cfg.connected);
        assert_eq!(cfg.batch, DEFAULT_BATCH);
        assert_eq!(cfg.gso, GsoRequest::Auto);
        let plain = client(&["--plain-send"]).unwrap();
        assert!(!plain.connected);
        assert_eq!((plain.batch, plain.gso), (1, GsoRequest::Off));
        // A file cannot combine what the flags cannot.
        let file = TempConfig::new("plain_send = true\nbatch = 8\n");
        let err = client(&["--config", file.arg()]).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
        file.write("plain_send = true\n");
        let from_file = client(&["--config", file.arg(), "--no-gso"]).unwrap();
        assert!(!from_file.connected);
    }

    /// configs/udp_client.toml says it holds the defaults: it does.
    #[test]
    fn the_example_client_config_is_the_defaults() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/configs/udp_client.toml");
        let (file, none) = (client(&["--config", path]).unwrap(), client(&[]).unwrap());
        assert_eq!(file.server, none.server);
        assert_eq!(file.buffer_size, none.buffer_size);
        assert_eq!(file.volume, none.volume);
        assert_eq!(file.connected, none.connected);
        assert_eq!((file.batch, file.gso), (none.batch, none.gso));
        assert_eq!(file.clients, none.clients);
        assert_eq!(file.end_timeout, none.end_timeout);
    }

    #[test]
    fn client_flags() {
        let cfg = client(&[
            "-s", "[::1]:9", "-b", "1460", "-t", "1GiB", "--rate", "500Mbit",
        ])
        .unwrap();
        assert_eq!(cfg.server, "[::1]:9".parse().unwrap());
        assert_eq!(cfg.volume, Volume::Bytes(1 << 30));
        assert_eq!(cfg.rate_bps, Some(500_000_000));
        let cfg = client(&["--duration", "2s"]).unwrap();
        assert_eq!(cfg.volume, Volume::Time(Duration::from_secs(2)));
        let cfg = client(&["-b", "0", "-n", "10"]).unwrap();
        assert_eq!(cfg.volume, Volume::Packets(10));
    }

    #[test]
    fn client_bad_input_is_usage_error() {
        for bad in [
            &["-b", "0"][..],
            &["-b", "70000"],
            &["-s", "[::1]:9", "-b", "65528"],
            &["-t", "12Q"],
            &["-s", "nonsense"],
            &["-s", "::1:80"],
            &["--clients", "0"],
            &["--rate", "0"],
            &["--bogus"],
        ] {
            let err = client(bad).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad:?}: {err}");
            assert!(!err.to_string().contains('\n'), "{bad:?}: one line: {err}");
        }
        // 65507 is the IPv4 maximum and is accepted; IPv6 allows 65527.
        assert!(client(&["-b", "65507"]).is_ok());
        assert!(client(&["-s", "[::1]:9", "-b", "65527"]).is_ok());
    }

    #[test]
    fn server_flags() {
        let cfg = server(&[]).unwrap();
        assert_eq!(cfg.listen, "[::]:35000".parse().unwrap());
        assert!(cfg.listen_is_default);
        let cfg = server(&["-p", "0", "--interval", "0", "--recv-buffer-size", "4M"]).unwrap();
        assert_eq!(cfg.listen.port(), 0);
        assert_eq!(cfg.interval, None);
        assert_eq!(cfg.recv_buffer_size, Some(4_000_000));
        assert!(server(&["--listen", "nope"]).is_err());
        assert!(server(&["--max-peers", "0"]).is_err());
        assert!(server(&["-p", "1", "--listen", "[::]:2"]).is_err());
    }

    #[test]
    fn unknown_toml_key_is_named() {
        let err = parse_toml::<ServerFile>("listen = \"[::]:1\"\nlisen = 3\n").unwrap_err();
        assert!(err.contains("lisen"), "{err}");
        let err = parse_toml::<ClientFile>("buffer_sise = 3\n").unwrap_err();
        assert!(err.contains("buffer_sise"), "{err}");
    }

    #[test]
    fn flags_override_file() {
        let file = TempConfig::new("buffer_size = \"1K\"\ntotal_send = 5000\nrate = \"1Gbit\"\n");
        let p = file.arg();
        let cfg = client(&["--config", p]).unwrap();
        assert_eq!((cfg.buffer_size, cfg.volume), (1000, Volume::Bytes(5000)));
        let cfg = client(&["--config", p, "-b", "200", "--duration", "1s"]).unwrap();
        assert_eq!(
            (cfg.buffer_size, cfg.volume),
            (200, Volume::Time(Duration::from_secs(1)))
        );
    }

    #[test]
    fn a_layer_that_names_one_of_a_group_replaces_the_group() {
        let file = TempConfig::new("listen = \"127.0.0.1:7\"\ninterval = \"250ms\"\n");
        let p = file.arg();
        // The file's listen and interval beat the defaults.
        let cfg = server(&["--config", p]).unwrap();
        assert_eq!(cfg.listen, "127.0.0.1:7".parse().unwrap());
        assert!(!cfg.listen_is_default);
        assert_eq!(cfg.interval, Some(Duration::from_millis(250)));
        // -p beats the file's listen: the default address with that port,
        // and the other file keys still apply.
        let cfg = server(&["--config", p, "-p", "9"]).unwrap();
        assert_eq!(cfg.listen, "[::]:9".parse().unwrap());
        assert!(cfg.listen_is_default);
        assert_eq!(cfg.interval, Some(Duration::from_millis(250)));
    }

    #[test]
    fn iperf3_json_reports_every_second_and_stands_alone() {
        // A line a second, as iperf3's, unless an interval was given.
        let cfg = client(&["--iperf3-json"]).unwrap();
        assert!(cfg.iperf3_json);
        assert_eq!(cfg.interval, Some(Duration::from_secs(1)));
        let cfg = client(&["--iperf3-json", "-i", "500ms"]).unwrap();
        assert_eq!(cfg.interval, Some(Duration::from_millis(500)));
        let cfg = server(&["--one-off", "--iperf3-json"]).unwrap();
        assert!(cfg.iperf3_json);
        assert_eq!(cfg.interval, Some(Duration::from_secs(1)));
        // A config file's key is the flag.
        let file = TempConfig::new("iperf3_json = true\ninterval = \"2s\"\n");
        let cfg = client(&["--config", file.arg()]).unwrap();
        assert!(cfg.iperf3_json);
        assert_eq!(cfg.interval, Some(Duration::from_secs(2)));
        file.write("iperf3_json = true\none_off = true\n");
        assert!(server(&["--config", file.arg()]).unwrap().iperf3_json);
        // One document, of one run: nothing beside it.
        for (args, says) in [
            (&["--iperf3-json", "--json"][..], "--json"),
            (&["--iperf3-json", "--json-stream"], "--json-stream"),
            (&["--iperf3-json", "--find-limit"], "--find-limit"),
            (&["--iperf3-json", "--sweep", "100,200"], "--sweep"),
            (&["--iperf3-json", "--no-server"], "--no-server"),
        ] {
            let err = client(args).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{args:?}: {err}");
            assert!(err.to_string().contains(says), "{args:?}: {err}");
        }
        file.write("iperf3_json = true\njson = true\n");
        let err = client(&["--config", file.arg()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "iperf3_json cannot be used with json: it writes one iperf3 document of one run"
        );
        for args in [
            &["--iperf3-json"][..],
            &["--iperf3-json", "--one-off", "--json"],
        ] {
            let err = server(args).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{args:?}: {err}");
        }
    }

    #[test]
    fn the_defaults_alone_are_valid() {
        let cfg = ServerConfig::default();
        assert_eq!(cfg.listen, "[::]:35000".parse().unwrap());
        assert_eq!(cfg.interval, Some(Duration::from_secs(1)));
        assert_eq!(cfg.end_grace, DEFAULT_END_GRACE);
    }
}
