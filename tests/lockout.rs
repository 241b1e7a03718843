//! Unproven traffic cannot take what a proven client needs: the real
//! binaries on loopback while another port of the client's own IP floods
//! the server with Data of 1,100 random sessions (every 0.5 s) and with
//! 40,000 Hellos of one session. The real client still gets a session,
//! its data counted exactly, and its answer (exit 0), upload and -R.

mod common;

use common::udp::{args_to, assert_exact, client_outcome, Server};
use netspeed::wire;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Floods `server` from one port of 127.0.0.1 until `stop` (at most 30 s):
/// each round, 64-byte Data of 1,100 random sessions and 4,000 Hellos of
/// one session; a round every 0.5 s. Returns the datagrams sent.
fn flood(server: String, stop: Arc<AtomicBool>) -> u64 {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("flood socket");
    socket.connect(&server).expect("connect");
    let mut sent = 0u64;
    let started = Instant::now();
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(30) {
        for i in 0..1100u64 {
            let mut d = [0u8; 64];
            let header = wire::Header {
                session: 0xf100_0000 + round * 10_000 + i,
                seq: 0,
                send_time_ns: 0,
            };
            wire::write_data_header(&mut d, &header);
            sent += u64::from(socket.send(&d).is_ok());
        }
        for i in 0..4000u64 {
            let hello = wire::encode_hello(&wire::Hello {
                header: wire::Header {
                    session: 0xbad,
                    ..Default::default()
                },
                nonce: i,
                ..Default::default()
            });
            sent += u64::from(socket.send(&hello).is_ok());
        }
        round += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    sent
}

#[test]
fn floods_from_the_clients_own_ip_cannot_lock_it_out() {
    let server = Server::loopback();
    let stop = Arc::new(AtomicBool::new(false));
    let flooder = {
        let (addr, stop) = (server.addr.clone(), stop.clone());
        std::thread::spawn(move || flood(addr, stop))
    };
    // Let the flood fill what it can first.
    std::thread::sleep(Duration::from_millis(1200));
    for rest in [
        "-b 1000 -n 5000 --rate 50Mbit",
        "-R -b 1000 -n 5000 --rate 50Mbit",
    ] {
        let out = client_outcome(&args_to(&server.addr, rest));
        assert_eq!(
            out.code,
            Some(0),
            "udp_client {rest} during the flood: {}",
            out.stderr
        );
        let report = out.report.expect("a report");
        if rest.starts_with("-R") {
            let s = &report["streams"][0];
            assert_eq!(s["sender"]["packets"], 5000, "{report}");
            assert_eq!(s["receiver"]["packets"], 5000, "{report}");
        } else {
            let c = &report["clients"][0];
            assert_exact(&report, c, &server.done_for(c["session"].as_str().unwrap()));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let sent = flooder.join().expect("the flood");
    assert!(sent > 10_000, "the flood ran: {sent} datagrams");
    let events = server.stop();
    let limited = events
        .last()
        .and_then(|v| v["answers_limited"].as_u64())
        .unwrap_or(0);
    assert!(
        limited > 0,
        "the flood's Hellos were limited, not the client's"
    );
}
