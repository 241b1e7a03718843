//! Every example in `configs/` parses, with the binary's own parser, and
//! passes validation: a config we ship must never be rejected.

use netspeed::config::proxy::{ProxyArgs, ProxyConfig};
use netspeed::config::{parse_args, ClientArgs, ClientConfig, ServerArgs, ServerConfig};
use std::path::Path;

#[test]
fn every_example_config_is_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("configs/ exists") {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let argv = |bin: &str| vec![bin.into(), "--config".into(), path.clone().into_os_string()];
        if name.starts_with("udp_server") {
            let args: ServerArgs = parse_args(argv("udp_server")).unwrap();
            ServerConfig::from_args(args).unwrap_or_else(|e| panic!("{name}: {e}"));
        } else if name.starts_with("udp_client") {
            let args: ClientArgs = parse_args(argv("udp_client")).unwrap();
            ClientConfig::from_args(args).unwrap_or_else(|e| panic!("{name}: {e}"));
        } else if name.starts_with("tcp_proxy") {
            let args: ProxyArgs = parse_args(argv("tcp_proxy")).unwrap();
            ProxyConfig::from_args(args).unwrap_or_else(|e| panic!("{name}: {e}"));
        } else {
            panic!("{name}: no test knows which binary this config is for");
        }
        checked.push(name);
    }
    // A loop over files proves nothing if it found none.
    assert!(
        checked.iter().any(|n| n.starts_with("udp_server")),
        "{checked:?}"
    );
    assert!(
        checked
            .iter()
            .filter(|n| n.starts_with("udp_client"))
            .count()
            >= 2,
        "{checked:?}"
    );
}

/// The systemd unit we ship keeps its hardening, and its command line is
/// one udp_server accepts.
#[test]
fn the_service_unit_is_hardened_and_runs_a_valid_command() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/udp_server.service");
    let unit = std::fs::read_to_string(&path).expect("configs/udp_server.service");
    let settings: Vec<(&str, &str)> = unit
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .collect();
    let value = |key: &str| {
        settings
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("{key} missing from the unit"))
    };
    for (key, want) in [
        ("DynamicUser", "yes"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictNamespaces", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("CapabilityBoundingSet", ""),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("KillSignal", "SIGTERM"),
    ] {
        assert_eq!(value(key), want, "{key}");
    }
    let command: Vec<&str> = value("ExecStart").split_whitespace().collect();
    assert!(command[0].ends_with("/udp_server"), "{command:?}");
    let args: ServerArgs = parse_args(command.iter().map(|a| (*a).into()))
        .unwrap_or_else(|e| panic!("ExecStart {command:?}: {e}"));
    ServerConfig::from_args(args).unwrap_or_else(|e| panic!("ExecStart {command:?}: {e}"));
}
