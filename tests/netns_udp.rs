//! UDP tests across network namespaces: real links, real devices, and
//! impairments whose effect is known exactly.

mod common;

use common::netns::two_hosts;
use common::udp::{args_to, assert_exact, client_in, u, Server};

#[test]
fn gso_falls_back_when_segments_exceed_the_mtu() {
    let (srv, cli, _) = two_hosts("gso", "10.77.2");
    let server = Server::start_in(&srv, "0.0.0.0:0", &["--recv-buffer-size", "4M"]);
    let target = format!("10.77.2.1:{}", server.port());
    let args = args_to(&target, "-b 1400 -t 1400000 --rate 100Mbit --gso --batch 4");

    // Segments that fit the 1500-byte MTU: the veth takes GSO buffers.
    let report = client_in(&cli, &args);
    let c = &report["clients"][0];
    assert_eq!(c["send_path"]["gso"], "on", "{report}");
    assert_exact(&report, c, &server.done_for(c["session"].as_str().unwrap()));

    // 2000-byte segments do not fit: the kernel answers EMSGSIZE, and the
    // client falls back to plain (fragmented) sends, loses nothing, and
    // says so.
    let args = args_to(&target, "-b 2000 -t 2000000 --rate 100Mbit --gso --batch 4");
    let report = client_in(&cli, &args);
    let c = &report["clients"][0];
    let path = &c["send_path"];
    assert_eq!(path["gso"], "off", "{report}");
    let notes = path["notes"].to_string();
    assert!(
        notes.contains("gso: off") && notes.contains("EMSGSIZE"),
        "{notes}"
    );
    assert_eq!(u(c, "sent_packets"), 1000);
    assert_eq!(u(c, "sent_bytes"), 2_000_000);
    assert_exact(&report, c, &server.done_for(c["session"].as_str().unwrap()));
}

#[test]
fn a_multi_homed_server_answers_from_the_address_it_was_asked_on() {
    // The server host has two addresses on one link; the client asks the
    // second. The client accepts answers only from the address it sent to
    // (a forged answer from elsewhere must not count), so the server must
    // answer from that address, not the one routing would pick (the first).
    let (srv, cli, (srv_dev, cli_dev)) = two_hosts("mh", "10.77.3");
    srv.ip(&["addr", "add", "10.77.3.9/24", "dev", &srv_dev]);
    cli.pin_neighbor(&cli_dev, "10.77.3.9", &srv.mac(&srv_dev));
    for listen in ["0.0.0.0:0", "[::]:0"] {
        let server = Server::start_in(&srv, listen, &["--recv-buffer-size", "4M"]);
        let target = format!("10.77.3.9:{}", server.port());
        let report = client_in(&cli, &args_to(&target, "-b 1000 -t 100K --rate 50Mbit"));
        let c = &report["clients"][0];
        assert_exact(&report, c, &server.done_for(c["session"].as_str().unwrap()));
    }
}
