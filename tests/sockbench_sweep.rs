//! The `udp_client --sweep` library function against an in-process server:
//! every cell carries the server's receive figures.

use netspeed::client::sweep;
use netspeed::config::ClientConfig;
use netspeed::local::with_local_server;
use netspeed::matrix::NoProgress;
use netspeed::meter::plan::Volume;
use netspeed::output::sweep::{sweep_plot, sweep_table};
use netspeed::shutdown::Shutdown;

#[test]
fn sweep_reports_the_servers_rate_per_cell() {
    // Built the way udp_client builds it, so new fields get their defaults;
    // the server is the one `udp_client --local --sweep` starts, which
    // points `-s` at itself.
    let args: netspeed::config::ClientArgs = netspeed::config::parse_args(
        ["udp_client", "-n", "500", "--rate", "400Mbit", "--quiet"]
            .into_iter()
            .map(Into::into),
    )
    .unwrap();
    let cfg = ClientConfig::from_args(args).unwrap();
    assert_eq!(cfg.volume, Volume::Packets(500));
    let stop = Shutdown::new();
    let report = with_local_server(&cfg, None, |base| {
        sweep::run(base, &[500, 1460, 9000], &[1, 2], &stop, &mut NoProgress)
    })
    .unwrap();
    assert_eq!(report.cells.len(), 6);
    for c in &report.cells {
        assert_eq!(c.sent_packets, 500 * c.clients as u64, "{c:?}");
        let got = c.received_packets.expect("the server answered");
        assert!(got > 0 && got <= c.sent_packets, "{c:?}");
        assert!(c.server_gbps.unwrap() > 0.0, "{c:?}");
    }
    let table = sweep_table(&report);
    assert_eq!(table.lines().filter(|l| l.starts_with("|")).count(), 2 + 3);
    let dir = std::env::temp_dir().join(format!("sockbench-sweep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("sweep.svg");
    sweep_plot(&report, &svg).unwrap();
    assert!(std::fs::read_to_string(&svg).unwrap().contains("2 clients"));
    std::fs::remove_dir_all(dir).ok();
    // Bad sizes are usage errors, refused before anything is sent.
    let err = sweep::run(&cfg, &[0], &[1], &stop, &mut NoProgress).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    let err = sweep::run(&cfg, &[70_000], &[1], &stop, &mut NoProgress).unwrap_err();
    assert_eq!(err.exit_code(), 2);
}
