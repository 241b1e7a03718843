//! STAMP's settings: the reflector's (`udp_server --stamp`, [`StampSettings`])
//! and the sender's (`udp_client --stamp-reflector`, [`StampSender`]),
//! validated from the merged layers of each binary. The flags themselves
//! are declared with the binary's others (`server.rs`, `client.rs`); what
//! both share (the clock's claim) is here.

use super::{check_between, duration_arg, resolve};
use crate::error::{Error, Result};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// What this host says of its clock in the error estimate of every STAMP
/// packet it sends or answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StampClock {
    /// `--stamp-synchronized`: the S bit. Off unless the user says so.
    pub synchronized: bool,
    /// `--stamp-clock-error`: the error claimed; None: the kernel's bound.
    pub error: Option<Duration>,
}

/// `--stamp-synchronized` and `--stamp-clock-error`, shared by both
/// binaries.
#[derive(clap::Args, Debug, Default)]
pub struct StampClockArgs {
    /// STAMP: say that this host's clock is synchronised to UTC from an
    /// external source (GPS, or NTP that says so): the S bit of the error
    /// estimate. One-way delays are shown only when both ends say so
    /// [default: not synchronised].
    #[arg(long)]
    pub stamp_synchronized: bool,
    /// STAMP: the error of this host's clock to claim (e.g. 1ms)
    /// [default: the kernel's bound (adjtimex), 16s where unknown].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub stamp_clock_error: Option<Duration>,
}

/// The most the error estimate can say: 255 × 2^31 s is more than any
/// clock is off; a day is more than enough and reads as a mistake past it.
pub const MAX_CLOCK_ERROR: Duration = Duration::from_secs(86_400);

fn clock(synchronized: Option<bool>, error: Option<Duration>) -> Result<StampClock> {
    if error.is_some_and(|e| e > MAX_CLOCK_ERROR) {
        return Err(Error::usage("--stamp-clock-error: at most 1 day"));
    }
    Ok(StampClock {
        synchronized: synchronized.unwrap_or(false),
        error,
    })
}

/// The reflector's settings (`udp_server --stamp`).
#[derive(Debug, Clone, PartialEq)]
pub struct StampSettings {
    pub listen: SocketAddr,
    /// Only a port was given: `[::]`, or `0.0.0.0` where IPv6 is
    /// unavailable.
    pub listen_is_port_only: bool,
    /// Answers per second to one source address and port, ...
    pub max_per_source: u32,
    /// ... to one IPv4 address or IPv6 /64, ...
    pub max_per_prefix: u32,
    /// ... and in all.
    pub max_total: u32,
    /// Sessions counted at once; more are answered statelessly.
    pub max_sessions: usize,
    /// A session with no packet for this long is forgotten.
    pub session_timeout: Duration,
    pub clock: StampClock,
    /// The server's `--interval`: the reflector's totals as often.
    pub interval: Option<Duration>,
}

/// `--stamp-max-per-source`'s default: 100 times a sender at STAMP's
/// usual 10 ms.
pub const DEFAULT_PER_SOURCE: u32 = 10_000;
/// `--stamp-max-per-prefix`'s default.
pub const DEFAULT_PER_PREFIX: u32 = 20_000;
/// `--stamp-max-total`'s default: more than one core answers.
pub const DEFAULT_TOTAL: u32 = 1_000_000;
/// `--stamp-max-sessions`'s default and its most.
pub const DEFAULT_SESSIONS: usize = 4096;
pub const MAX_SESSIONS: usize = 1 << 20;
/// `--stamp-session-timeout`'s default.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(60);

/// `stamp` in a TOML file: `862` or `"127.0.0.1:862"`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(untagged)]
pub enum StampListen {
    Port(u16),
    Text(String),
}

impl StampListen {
    pub fn into_text(self) -> String {
        match self {
            StampListen::Port(p) => p.to_string(),
            StampListen::Text(t) => t,
        }
    }
}

/// `[ADDR:]PORT`: a port alone is `[::]:PORT` (dual-stack).
pub fn stamp_listen(text: &str) -> Result<(SocketAddr, bool)> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok((SocketAddr::from(([0u16; 8], port)), true));
    }
    text.parse::<SocketAddr>().map(|a| (a, false)).map_err(|_| {
        Error::usage(super::clip(&format!(
            "--stamp {text}: expected a PORT or ADDR:PORT, e.g. 862 or 127.0.0.1:862"
        )))
    })
}

/// What the server's layer holds of STAMP, before validation.
#[derive(Debug, Default)]
pub struct StampServerKeys {
    pub stamp: Option<String>,
    pub max_per_source: Option<u32>,
    pub max_per_prefix: Option<u32>,
    pub max_total: Option<u32>,
    pub max_sessions: Option<usize>,
    pub session_timeout: Option<Duration>,
    pub synchronized: Option<bool>,
    pub clock_error: Option<Duration>,
}

/// The reflector's settings, or None without `--stamp`. A STAMP setting
/// without it is a mistake that udp_server's table of requirements
/// refused already (`ServerFile::REQUIREMENTS`).
pub fn server_settings(
    k: StampServerKeys,
    interval: Option<Duration>,
) -> Result<Option<StampSettings>> {
    let Some(text) = k.stamp else {
        return Ok(None);
    };
    let (listen, listen_is_port_only) = stamp_listen(&text)?;
    let per_source = k.max_per_source.unwrap_or(DEFAULT_PER_SOURCE);
    let per_prefix = k.max_per_prefix.unwrap_or(DEFAULT_PER_PREFIX);
    let total = k.max_total.unwrap_or(DEFAULT_TOTAL);
    check_between("--stamp-max-per-source", per_source, u32::MAX)?;
    check_between("--stamp-max-per-prefix", per_prefix, u32::MAX)?;
    check_between("--stamp-max-total", total, u32::MAX)?;
    let max_sessions = check_between(
        "--stamp-max-sessions",
        k.max_sessions.unwrap_or(DEFAULT_SESSIONS),
        MAX_SESSIONS,
    )?;
    let session_timeout = k.session_timeout.unwrap_or(DEFAULT_SESSION_TIMEOUT);
    if session_timeout < Duration::from_secs(1) || session_timeout > Duration::from_secs(86_400) {
        return Err(Error::usage(
            "--stamp-session-timeout: between 1s and 1 day",
        ));
    }
    Ok(Some(StampSettings {
        listen,
        listen_is_port_only,
        max_per_source: per_source,
        max_per_prefix: per_prefix,
        max_total: total,
        max_sessions,
        session_timeout,
        clock: clock(k.synchronized, k.clock_error)?,
        interval,
    }))
}

/// The sender's settings (`udp_client --stamp-reflector ...`).
#[derive(Debug, Clone, PartialEq)]
pub struct StampSender {
    pub reflector: SocketAddr,
    /// `--no-load`: the round trip alone. Otherwise the test packets are a
    /// load run's round-trip probes.
    pub alone: bool,
    /// Test packets to send; None: for `duration`.
    pub count: Option<u64>,
    pub duration: Option<Duration>,
    /// One test packet every this long.
    pub interval: Duration,
    /// Bytes per test packet (the UDP payload), at least 44.
    pub size: usize,
    /// None: a random non-zero one per run.
    pub ssid: Option<u16>,
    /// `--stamp-stateful`: the reflector keeps its own sequence numbers
    /// (as `udp_server --stamp` does), so loss its numbers cannot place
    /// is on the way back.
    pub stateful: bool,
    pub clock: StampClock,
    /// After the last test packet, how long answers are waited for.
    pub wait: Duration,
    /// Send from this address (`--bind`).
    pub bind: Option<SocketAddr>,
}

/// `--stamp-interval`'s default with `--no-load` (STAMP's usual) ...
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(10);
/// ... and beside a load: the round-trip probes' own rate, 20 a second,
/// so that a reflector sees no more than udp_server's probes would send.
pub const LOADED_INTERVAL: Duration = Duration::from_millis(50);
/// The shortest `--stamp-interval`, and the longest.
pub const MIN_INTERVAL: Duration = Duration::from_micros(10);
pub const MAX_INTERVAL: Duration = Duration::from_secs(60);
/// Test packets without `--count` or `--duration`.
pub const DEFAULT_COUNT: u64 = 100;

/// `HOST[:PORT]`, the port 862 when none is given: `192.0.2.1`, `::1`,
/// `[::1]`, `[::1]:8620`, `host.example`, `host.example:8620`.
pub fn reflector_addr(text: &str) -> Result<SocketAddr> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let bare = text.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, crate::stamp::DEFAULT_PORT));
    }
    let host = text.split(':').next().unwrap_or_default();
    let name_chars = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    if host.is_empty() || !host.chars().all(name_chars) {
        return Err(Error::usage(super::clip(&format!(
            "--stamp-reflector {text}: expected HOST or HOST:PORT, e.g. 192.0.2.1, [::1]:8620 or host.example"
        ))));
    }
    if text.contains(':') {
        resolve(text)
    } else {
        resolve(&format!("{text}:{}", crate::stamp::DEFAULT_PORT))
    }
}

/// What the client's layer holds of STAMP, before validation.
#[derive(Debug, Default)]
pub struct StampClientKeys {
    pub reflector: Option<String>,
    pub no_load: Option<bool>,
    pub interval: Option<Duration>,
    pub size: Option<u64>,
    pub ssid: Option<u16>,
    pub stateful: Option<bool>,
    pub synchronized: Option<bool>,
    pub clock_error: Option<Duration>,
}

/// The sender's settings, or None without `--stamp-reflector`. `count`
/// and `duration` are the run's `--count` and `--duration` (the STAMP
/// run's with `--no-load`, the load's otherwise); `wait` its
/// `--end-timeout`; `bind` is the client's to fill. A STAMP setting
/// without a reflector is a mistake that udp_client's table of
/// requirements refused already (`ClientFile::REQUIREMENTS`), as it did
/// `--stamp-stateful` beside a load (only `--no-load` splits loss by
/// direction).
pub fn sender_settings(
    k: StampClientKeys,
    count: Option<u64>,
    duration: Option<Duration>,
    wait: Duration,
) -> Result<Option<StampSender>> {
    let Some(text) = k.reflector else {
        return Ok(None);
    };
    let alone = k.no_load == Some(true);
    let reflector = reflector_addr(&text)?;
    let interval = k.interval.unwrap_or(if alone {
        DEFAULT_INTERVAL
    } else {
        LOADED_INTERVAL
    });
    if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&interval) {
        return Err(Error::usage("--stamp-interval: between 10us and 60s"));
    }
    let limit = crate::sys::max_udp_payload(&reflector) as u64;
    let size = k.size.unwrap_or(crate::stamp::BASE_LEN as u64);
    if size < crate::stamp::BASE_LEN as u64 || size > limit {
        return Err(Error::usage(format!(
            "--stamp-size {size}: between {} (the base packet) and {limit}",
            crate::stamp::BASE_LEN
        )));
    }
    if k.ssid == Some(0) {
        return Err(Error::usage(
            "--stamp-ssid 0 means no SSID (RFC 8972): give 1 to 65535",
        ));
    }
    if alone && count == Some(0) {
        return Err(Error::usage("--count 0 sends nothing: give at least 1"));
    }
    if alone && duration.is_some_and(|d| d.is_zero()) {
        return Err(Error::usage("--duration must be greater than 0"));
    }
    let (count, duration) = match (alone, count, duration) {
        (false, _, _) => (None, None),
        (true, None, None) => (Some(DEFAULT_COUNT), None),
        (true, c, d) => (c, d),
    };
    Ok(Some(StampSender {
        reflector,
        alone,
        count,
        duration,
        interval,
        size: size as usize,
        ssid: k.ssid,
        stateful: k.stateful.unwrap_or(false),
        clock: clock(k.synchronized, k.clock_error)?,
        wait,
        bind: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{client, server, TempConfig};
    use crate::config::ClientMode;

    #[test]
    fn the_reflector_listens_on_a_port_or_an_address() {
        assert!(server(&[]).unwrap().stamp.is_none(), "off by default");
        let s = server(&["--stamp", "862"]).unwrap().stamp.unwrap();
        assert_eq!(s.listen, "[::]:862".parse().unwrap());
        assert!(s.listen_is_port_only);
        assert_eq!(s.max_per_source, DEFAULT_PER_SOURCE);
        assert_eq!(s.clock, StampClock::default());
        let s = server(&["--stamp", "127.0.0.1:0", "--stamp-max-per-source", "5"])
            .unwrap()
            .stamp
            .unwrap();
        assert_eq!(s.listen, "127.0.0.1:0".parse().unwrap());
        assert_eq!(s.max_per_source, 5);
        let s = server(&[
            "--stamp",
            "[::1]:8620",
            "--stamp-synchronized",
            "--stamp-clock-error",
            "1ms",
        ])
        .unwrap()
        .stamp
        .unwrap();
        assert!(s.clock.synchronized);
        assert_eq!(s.clock.error, Some(Duration::from_millis(1)));
    }

    #[test]
    fn bad_reflector_settings_are_usage_errors() {
        for bad in [
            &["--stamp", "nope"][..],
            &["--stamp", "70000"],
            &["--stamp", "862", "--stamp-max-per-source", "0"],
            &["--stamp", "862", "--stamp-max-sessions", "0"],
            &["--stamp", "862", "--stamp-session-timeout", "10ms"],
            &["--stamp", "862", "--stamp-clock-error", "2d"],
            &["--stamp-max-total", "5"],
            &["--stamp-synchronized"],
        ] {
            let err = server(bad).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad:?}: {err}");
        }
        // File keys are checked the same way.
        let file = TempConfig::new("stamp_max_sessions = 9\n");
        let err = server(&["--config", file.arg()]).unwrap_err();
        assert!(err.to_string().contains("needs --stamp"), "{err}");
        file.write(
            "stamp = \"127.0.0.1:0\"\nstamp_max_sessions = 9\nstamp_session_timeout = \"5s\"\n",
        );
        let s = server(&["--config", file.arg()]).unwrap().stamp.unwrap();
        assert_eq!(
            (s.max_sessions, s.session_timeout),
            (9, Duration::from_secs(5))
        );
        // A port alone may be a number; the flag beats the file.
        file.write("stamp = 8620\n");
        let s = server(&["--config", file.arg()]).unwrap().stamp.unwrap();
        assert_eq!(s.listen, "[::]:8620".parse().unwrap());
        let s = server(&["--config", file.arg(), "--stamp", "127.0.0.1:9"])
            .unwrap()
            .stamp
            .unwrap();
        assert_eq!(s.listen, "127.0.0.1:9".parse().unwrap());
    }

    fn sender(args: &[&str]) -> StampSender {
        match client(args).unwrap().mode {
            ClientMode::Stamp(s) => s,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    #[test]
    fn the_sender_needs_no_load_and_has_stamps_defaults() {
        let s = sender(&["--stamp-reflector", "127.0.0.1", "--no-load"]);
        assert_eq!(s.reflector, "127.0.0.1:862".parse().unwrap());
        assert_eq!((s.count, s.duration), (Some(DEFAULT_COUNT), None));
        assert_eq!((s.interval, s.size, s.ssid), (DEFAULT_INTERVAL, 44, None));
        let s = sender(&[
            "--stamp-reflector",
            "[::1]:8620",
            "--no-load",
            "--count",
            "7",
            "--stamp-interval",
            "1ms",
            "--stamp-size",
            "100",
            "--stamp-ssid",
            "4660",
            "--stamp-stateful",
        ]);
        assert_eq!(s.reflector, "[::1]:8620".parse().unwrap());
        assert_eq!((s.count, s.interval), (Some(7), Duration::from_millis(1)));
        assert_eq!((s.size, s.ssid, s.stateful), (100, Some(4660), true));
        let s = sender(&["--stamp-reflector", "::1", "--no-load", "--duration", "2s"]);
        assert_eq!(s.reflector, "[::1]:862".parse().unwrap());
        assert_eq!((s.count, s.duration), (None, Some(Duration::from_secs(2))));
        let s = sender(&["--stamp-reflector", "localhost:9", "--no-load"]);
        assert_eq!(s.reflector.port(), 9);
    }

    #[test]
    fn beside_a_load_the_sender_is_the_runs_prober() {
        let cfg = client(&["--stamp-reflector", "127.0.0.1", "-t", "1M", "-R"]).unwrap();
        assert!(matches!(cfg.mode, ClientMode::Run), "{:?}", cfg.mode);
        let s = cfg.stamp_probes.expect("the probes' settings");
        assert_eq!(s.reflector, "127.0.0.1:862".parse().unwrap());
        assert!(!s.alone);
        assert_eq!(
            (s.count, s.duration),
            (None, None),
            "the load's, not STAMP's"
        );
        assert_eq!(s.interval, LOADED_INTERVAL);
        let cfg = client(&["--stamp-reflector", "127.0.0.1", "--stamp-interval", "5ms"]).unwrap();
        assert_eq!(cfg.stamp_probes.unwrap().interval, Duration::from_millis(5));
        assert_eq!(client(&["-t", "1M"]).unwrap().stamp_probes, None);
        let cfg = client(&["--stamp-reflector", "127.0.0.1", "--no-load"]).unwrap();
        assert_eq!(cfg.stamp_probes, None, "--no-load: STAMP alone");
    }

    #[test]
    fn bad_sender_settings_are_usage_errors() {
        let err = client(&["--stamp-reflector", "127.0.0.1", "--stamp-stateful"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("only --no-load"), "{err}");
        for bad in [
            &["--no-load"][..],
            &["--stamp-interval", "1ms"],
            &[
                "--stamp-reflector",
                "127.0.0.1",
                "--no-load",
                "--stamp-size",
                "43",
            ],
            &[
                "--stamp-reflector",
                "127.0.0.1",
                "--no-load",
                "--stamp-interval",
                "1us",
            ],
            &[
                "--stamp-reflector",
                "127.0.0.1",
                "--no-load",
                "--stamp-ssid",
                "0",
            ],
            &[
                "--stamp-reflector",
                "127.0.0.1",
                "--no-load",
                "--count",
                "0",
            ],
            &["--stamp-reflector", "127.0.0.1", "--no-load", "-R"],
            &["--stamp-reflector", "127.0.0.1", "--no-load", "--local"],
            &["--stamp-reflector", "127.0.0.1", "--no-load", "-t", "1M"],
            &[
                "--stamp-reflector",
                "127.0.0.1",
                "--no-load",
                "--bind",
                "::1",
            ],
            &["--stamp-reflector", "not an address", "--no-load"],
        ] {
            let err = client(bad).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad:?}: {err}");
        }
        let file = TempConfig::new("stamp_reflector = \"127.0.0.1:9\"\nstamp_stateful = true\n");
        let err = client(&["--config", file.arg()]).unwrap_err();
        assert!(err.to_string().contains("only --no-load"), "{err}");
        file.write(
            "stamp_reflector = \"127.0.0.1:9\"\nno_load = true\nstamp_interval = \"20ms\"\n",
        );
        assert_eq!(
            sender(&["--config", file.arg()]).interval,
            Duration::from_millis(20)
        );
    }
}
