//! `udp_client`'s tables of settings that cannot go together
//! ([`ClientFile::CONFLICTS`]) and of settings that need another
//! ([`ClientFile::REQUIREMENTS`]): the one list, checked on the merged
//! settings whether each came from a flag or the config file (issue 42).

use super::client::{ClientArgs, ClientFile, ALONE};
use super::{table_keys, Conflict, Names, Requirement};

/// Why the volume's keys conflict.
const VOLUME: &str = "the volume is a packet count, a byte total or a time: give one";
/// Why `--plain-send` takes no other send path setting.
const PLAIN: &str = "it is one sendto per datagram on an unconnected socket";
/// Why a run cannot both sweep and search.
const ONE_TABLE: &str = "a run is one sweep or one search";
/// Why the search sets the volume.
const TRIALS: &str = "the search sets each trial's length (--trial-duration)";
/// Why the server's sending needs a server.
const SERVER_SENDS: &str = "the udp_server sends, so there must be one";
/// Why sweeps are uploads.
const UPLOADS: &str = "sweeps run uploads only";
/// Why `--iperf3-json` stands alone.
const IPERF3: &str = "it writes one iperf3 document of one run";
/// What the search's settings need.
const SEARCH: &str = "it sets up the search";
/// What the STAMP sender's settings need.
const STAMP: &str = "it measures round trips with STAMP";

const fn conflict(a: &'static str, b: &'static str, why: &'static str) -> Conflict {
    Conflict { a, b, why }
}

const fn needs(key: &'static str, needs: &'static str, why: &'static str) -> Requirement {
    Requirement { key, needs, why }
}

impl ClientFile {
    /// `udp_client`'s settings that cannot go together, by key (the long flags
    /// with underscores), wherever each comes from: the one list, checked on
    /// the merged settings ([`super::check_tables`]). `connected = false` in a
    /// file is `plain_send`.
    pub const CONFLICTS: &'static [Conflict] = &[
        conflict("packets", "total_send", VOLUME),
        conflict("packets", "duration", VOLUME),
        conflict("total_send", "duration", VOLUME),
        conflict("plain_send", "connected", PLAIN),
        conflict("plain_send", "batch", PLAIN),
        conflict("plain_send", "gso", PLAIN),
        conflict("psk", "psk_file", "both give the pre-shared key: give one"),
        conflict("sweep_clients", "sweep", ONE_TABLE),
        conflict(
            "sweep_clients",
            "clients",
            "it gives the client count of each run",
        ),
        conflict("sweep_clients", "find_limit", ONE_TABLE),
        conflict("find_limit", "sweep", ONE_TABLE),
        conflict("find_limit", "rate", "the search sets each trial's rate"),
        conflict("find_limit", "total_send", TRIALS),
        conflict("find_limit", "packets", TRIALS),
        conflict("find_limit", "duration", TRIALS),
        conflict(
            "find_limit",
            "no_server",
            "the search needs a udp_server's counts",
        ),
        conflict(
            "local",
            "server_addr",
            "--local tests against a server of its own",
        ),
        conflict("local", "no_server", "--local starts a udp_server of its own"),
        conflict(
            "reverse",
            "bidir",
            "-R has the server send, --bidir both: give one",
        ),
        conflict("reverse", "no_server", SERVER_SENDS),
        conflict("bidir", "no_server", SERVER_SENDS),
        conflict("reverse", "sweep", UPLOADS),
        conflict("reverse", "sweep_clients", UPLOADS),
        conflict("bidir", "sweep", UPLOADS),
        conflict("bidir", "sweep_clients", UPLOADS),
        conflict(
            "bidir",
            "find_limit",
            "the search measures one direction: give -R for the reverse one, or neither for the upload",
        ),
        conflict(
            "json_stream",
            "json",
            "--json-stream's end event is the --json report",
        ),
        conflict("iperf3_json", "json", IPERF3),
        conflict("iperf3_json", "json_stream", IPERF3),
        conflict("iperf3_json", "sweep", IPERF3),
        conflict("iperf3_json", "sweep_clients", IPERF3),
        conflict("iperf3_json", "find_limit", IPERF3),
        conflict("iperf3_json", "no_server", IPERF3),
        conflict("no_load", "local", ALONE),
        conflict("no_load", "reverse", ALONE),
        conflict("no_load", "bidir", ALONE),
        conflict("no_load", "sweep", ALONE),
        conflict("no_load", "sweep_clients", ALONE),
        conflict("no_load", "find_limit", ALONE),
        conflict("no_load", "rate", ALONE),
        conflict("no_load", "total_send", ALONE),
        conflict("no_load", "no_server", ALONE),
        conflict("no_load", "plot", ALONE),
    ];

    /// `udp_client`'s settings that mean nothing without another, checked
    /// like [`Self::CONFLICTS`].
    pub const REQUIREMENTS: &'static [Requirement] = &[
        needs(
            "precise_pacing",
            "rate",
            "it sends each datagram at its time at that rate",
        ),
        needs("loss_tolerance", "find_limit", SEARCH),
        needs("max_delay", "find_limit", SEARCH),
        needs("trial_duration", "find_limit", SEARCH),
        needs("resolution", "find_limit", SEARCH),
        needs("confirm", "find_limit", SEARCH),
        needs("trial_pause", "find_limit", SEARCH),
        needs("max_trials", "find_limit", SEARCH),
        needs("no_load", "stamp_reflector", STAMP),
        needs("stamp_interval", "stamp_reflector", STAMP),
        needs("stamp_size", "stamp_reflector", STAMP),
        needs("stamp_ssid", "stamp_reflector", STAMP),
        needs("stamp_stateful", "stamp_reflector", STAMP),
        needs(
            "stamp_stateful",
            "no_load",
            "it splits loss by direction, which only --no-load reports: beside a load the rtt line counts probes lost either way",
        ),
        needs("stamp_synchronized", "stamp_reflector", STAMP),
        needs("stamp_clock_error", "stamp_reflector", STAMP),
    ];

    /// Whether these merged settings (and the flags only a flag can give,
    /// `args`) set `key`, for [`Self::CONFLICTS`] and [`Self::REQUIREMENTS`]; None for a
    /// key udp_client does not have. A switch is set when on; `connected =
    /// false` sets `plain_send`, the one send path on an unconnected socket.
    pub fn given(&self, args: &ClientArgs, key: &str) -> Option<bool> {
        let on = |v: Option<bool>| v == Some(true);
        Some(match key {
            "packets" => self.packets.is_some(),
            "total_send" => self.total_send.is_some(),
            "duration" => self.duration.is_some(),
            "rate" => self.rate.is_some(),
            "precise_pacing" => on(self.precise_pacing),
            "connected" => on(self.connected),
            "plain_send" => on(self.plain_send) || self.connected == Some(false),
            "batch" => self.batch.is_some(),
            "gso" => on(self.gso),
            "clients" => self.clients.is_some(),
            "sweep" => !args.sweep.is_empty(),
            "sweep_clients" => !args.sweep_clients.is_empty(),
            "plot" => args.plot.is_some(),
            "find_limit" => args.find_limit,
            "loss_tolerance" => args.loss_tolerance.is_some(),
            "max_delay" => args.max_delay.is_some(),
            "trial_duration" => args.trial_duration.is_some(),
            "resolution" => args.resolution.is_some(),
            "confirm" => args.confirm.is_some(),
            "trial_pause" => args.trial_pause.is_some(),
            "max_trials" => args.max_trials.is_some(),
            "psk" => self.psk.is_some(),
            "psk_file" => self.psk_file.is_some(),
            "local" => args.local,
            "server_addr" => self.server_addr.is_some(),
            "no_server" => on(self.no_server),
            "reverse" => on(self.reverse),
            "bidir" => on(self.bidir),
            "json" => on(self.json),
            "json_stream" => args.json_stream,
            "iperf3_json" => on(self.iperf3_json),
            "stamp_reflector" => self.stamp_reflector.is_some(),
            "no_load" => on(self.no_load),
            "stamp_interval" => self.stamp_interval.is_some(),
            "stamp_size" => self.stamp_size.is_some(),
            "stamp_ssid" => self.stamp_ssid.is_some(),
            "stamp_stateful" => on(self.stamp_stateful),
            "stamp_synchronized" => on(self.stamp_synchronized),
            "stamp_clock_error" => self.stamp_clock_error.is_some(),
            _ => return None,
        })
    }

    /// How a message names each key of the tables: as the user wrote it.
    /// A key that only the config file (`file`) gave is the file's
    /// (`total_send`, and `connected = false` for the `plain_send` it
    /// means); any other is its flag (`--total-send`). `flags` is the
    /// flags' layer, `args` the flags themselves.
    pub fn names(file: Option<&ClientFile>, flags: &ClientFile, args: &ClientArgs) -> Names {
        let Some(file) = file else {
            return Names::default();
        };
        // The flags only a flag can give are never the file's.
        let none = ClientArgs::default();
        Names::new(
            &table_keys(Self::CONFLICTS, Self::REQUIREMENTS),
            |key| {
                let spelled = match key {
                    "plain_send" if file.plain_send != Some(true) => "connected = false",
                    _ => key,
                };
                (file.given(&none, key) == Some(true)).then(|| spelled.to_string())
            },
            |key| flags.given(args, key) == Some(true),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::client::DEFAULT_BATCH;
    use crate::config::testing::{client, TempConfig};
    use crate::config::{flag_of, one_choice, Layer};
    use crate::meter::plan::Volume;
    use crate::meter::send::GsoRequest;
    use clap::CommandFactory;
    use clap::Parser;
    use std::time::Duration;

    /// Every key the tables name is one udp_client has, spelled as its
    /// long flag; no pair is listed twice, and no key conflicts with or
    /// needs itself.
    #[test]
    fn the_tables_name_udp_clients_own_keys_once() {
        let cmd = ClientArgs::command();
        let (l, args) = (ClientFile::default(), ClientArgs::default());
        let keys = ClientFile::CONFLICTS.iter().flat_map(|c| [c.a, c.b]).chain(
            ClientFile::REQUIREMENTS
                .iter()
                .flat_map(|r| [r.key, r.needs]),
        );
        for key in keys {
            assert!(l.given(&args, key).is_some(), "{key}: not a key");
            let long = flag_of(key);
            assert!(
                cmd.get_arguments()
                    .any(|a| a.get_long() == long.strip_prefix("--")),
                "{key}: udp_client has no {long}"
            );
        }
        let mut pairs = std::collections::HashSet::new();
        for c in ClientFile::CONFLICTS {
            assert_ne!(c.a, c.b);
            let pair = if c.a < c.b { (c.a, c.b) } else { (c.b, c.a) };
            assert!(pairs.insert(pair), "{c:?} is listed twice");
        }
        for r in ClientFile::REQUIREMENTS {
            assert_ne!(r.key, r.needs);
            let conflicting = |x: &str, y: &str| pairs.contains(&(x.min(y), x.max(y)));
            assert!(!conflicting(r.key, r.needs), "{r:?} also conflicts");
        }
    }

    /// The defaults set none of the tables' keys: the tables look at what
    /// the user gave, and the defaults alone are valid.
    #[test]
    fn the_defaults_give_no_key_of_the_tables() {
        let (defaults, args) = (ClientFile::defaults(), ClientArgs::default());
        for c in ClientFile::CONFLICTS {
            assert!(!defaults.given(&args, c.a).unwrap(), "{}", c.a);
            assert!(!defaults.given(&args, c.b).unwrap(), "{}", c.b);
        }
        for r in ClientFile::REQUIREMENTS {
            assert!(!defaults.given(&args, r.key).unwrap(), "{}", r.key);
        }
    }

    /// clap no longer refuses a pair itself, with words and an order of
    /// its own: every pair reaches the table, whose message it is.
    #[test]
    fn two_conflicting_flags_get_the_tables_message() {
        for (args, c) in [
            (&["-n", "5", "-t", "1M"][..], ("packets", "total_send")),
            (&["--plain-send", "--batch", "1"], ("plain_send", "batch")),
            (&["--local", "-s", "127.0.0.1:9"], ("local", "server_addr")),
            (
                &["--psk", "0123456789", "--psk-file", "k"],
                ("psk", "psk_file"),
            ),
            (&["-R", "--bidir"], ("reverse", "bidir")),
        ] {
            assert!(ClientArgs::try_parse_from(
                std::iter::once("udp_client").chain(args.iter().copied())
            )
            .is_ok());
            let err = client(args).unwrap_err();
            let want = ClientFile::CONFLICTS
                .iter()
                .find(|x| (x.a, x.b) == c)
                .unwrap();
            assert_eq!(err.exit_code(), 2);
            assert_eq!(err.to_string(), want.message(&Names::default()), "{args:?}");
        }
    }

    /// Issue 42: two keys of a file conflict as the two flags do, with the
    /// same words, each key named as the user wrote it; a flag and a key
    /// of the file too, unless the two are one choice (the volume, the
    /// key), where the flag replaces the file's.
    #[test]
    fn a_config_file_conflicts_as_the_flags_do() {
        let says = |args: &[&str]| {
            let err = client(args).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{args:?}");
            err.to_string()
        };
        let volume = "the volume is a packet count, a byte total or a time: give one";
        let file = TempConfig::new("total_send = \"1M\"\nduration = \"2s\"\n");
        assert_eq!(
            says(&["-t", "1M", "--duration", "2s"]),
            format!("--total-send cannot be used with --duration: {volume}")
        );
        assert_eq!(
            says(&["--config", file.arg()]),
            format!("total_send cannot be used with duration: {volume}")
        );
        // One choice: the flag's volume replaces the file's.
        file.write("total_send = \"1M\"\n");
        let cfg = client(&["--config", file.arg(), "--duration", "2s"]).unwrap();
        assert_eq!(cfg.volume, Volume::Time(Duration::from_secs(2)));
        // Not one choice: refused wherever each came from.
        file.write("rate = \"1G\"\n");
        let why = "the search sets each trial's rate";
        assert_eq!(
            says(&["--config", file.arg(), "--find-limit"]),
            format!("--find-limit cannot be used with rate: {why}")
        );
        assert_eq!(
            says(&["--rate", "1G", "--find-limit"]),
            format!("--find-limit cannot be used with --rate: {why}")
        );
        // The flag given over the file's value of the same key is the flag.
        assert_eq!(
            says(&["--config", file.arg(), "--find-limit", "--rate", "2G"]),
            format!("--find-limit cannot be used with --rate: {why}")
        );
        file.write("server_addr = \"127.0.0.1:9\"\n");
        assert!(says(&["--config", file.arg(), "--local"])
            .starts_with("--local cannot be used with server_addr: "));
        // A requirement met by the other source is met.
        file.write("rate = \"1G\"\n");
        assert!(
            client(&["--config", file.arg(), "--precise-pacing"])
                .unwrap()
                .precise_pacing
        );
        file.write("precise_pacing = true\n");
        let why = "it sends each datagram at its time at that rate";
        assert_eq!(
            says(&["--config", file.arg()]),
            format!("precise_pacing needs --rate: {why}")
        );
        assert_eq!(
            says(&["--precise-pacing"]),
            format!("--precise-pacing needs --rate: {why}")
        );
        assert!(client(&["--config", file.arg(), "--rate", "1G"]).is_ok());
    }

    /// `--psk` and a file's `psk_file` are one choice: the flag's key wins.
    #[test]
    fn a_psk_flag_replaces_the_files_key_file() {
        assert!(one_choice::<ClientFile>("psk", "psk_file"));
        let file = TempConfig::new("psk_file = \"/nonexistent/key\"\n");
        let cfg = client(&["--config", file.arg(), "--psk", "0123456789"]).unwrap();
        assert!(cfg.psk.is_some());
        // The file alone names a key file that is not there.
        assert!(client(&["--config", file.arg()]).is_err());
        file.write("psk = \"0123456789\"\n");
        let err = client(&["--config", file.arg()]).unwrap_err();
        assert!(err.to_string().contains("unknown field `psk`"), "{err}");
    }

    /// `connected = false` is the one unconnected path, --plain-send's:
    /// one sendto per datagram, so the header's "unconnected (sendto)"
    /// and the path line agree; what --plain-send refuses, it refuses.
    #[test]
    fn connected_false_is_the_plain_send_path() {
        let file = TempConfig::new("connected = false\n");
        let from_file = client(&["--config", file.arg()]).unwrap();
        let plain = client(&["--plain-send"]).unwrap();
        for cfg in [&from_file, &plain] {
            assert!(!cfg.connected);
            assert_eq!((cfg.batch, cfg.gso), (1, GsoRequest::Off));
        }
        let why = "it is one sendto per datagram on an unconnected socket";
        let plain_batch = client(&["--plain-send", "--batch", "8"]).unwrap_err();
        assert_eq!(
            plain_batch.to_string(),
            format!("--plain-send cannot be used with --batch: {why}")
        );
        for (text, extra, said) in [
            ("connected = false\nbatch = 8\n", &[][..], "batch"),
            ("connected = false\n", &["--batch", "8"], "--batch"),
        ] {
            file.write(text);
            let args: Vec<&str> = ["--config", file.arg()]
                .iter()
                .chain(extra)
                .copied()
                .collect();
            let err = client(&args).unwrap_err();
            assert_eq!(err.exit_code(), 2);
            assert_eq!(
                err.to_string(),
                format!("connected = false cannot be used with {said}: {why}"),
                "{text:?} {extra:?}"
            );
        }
        // --connected over the file's `connected = false`: the same key,
        // the flag's value.
        file.write("connected = false\n");
        let cfg = client(&["--config", file.arg(), "--connected"]).unwrap();
        assert!(cfg.connected);
        assert_eq!(cfg.batch, DEFAULT_BATCH);
        // And --plain-send over the file's `connected = true` (the example
        // configs/udp_client.toml spells it): one choice, the flag's.
        file.write("connected = true\n");
        let cfg = client(&["--config", file.arg(), "--plain-send"]).unwrap();
        assert_eq!((cfg.connected, cfg.batch), (false, 1));
        // Whatever the settings, an unconnected socket is one sendto per
        // datagram.
        for text in [
            "plain_send = true\n",
            "connected = false\ngso = false\n",
            "plain_send = true\nconnected = false\n",
            "connected = true\n",
            "batch = 4\ngso = true\n",
        ] {
            file.write(text);
            let cfg = client(&["--config", file.arg()]).unwrap();
            if !cfg.connected {
                assert_eq!((cfg.batch, cfg.gso), (1, GsoRequest::Off), "{text:?}");
            }
        }
    }

    #[test]
    fn the_volume_is_one_group() {
        assert!(one_choice::<ClientFile>("packets", "duration"));
        assert!(!one_choice::<ClientFile>("find_limit", "duration"));
        assert_eq!(
            <ClientFile as Layer>::GROUPS,
            &[
                &["packets", "total_send", "duration"][..],
                &["psk", "psk_file"],
                &["connected", "plain_send"]
            ]
        );
    }
}
