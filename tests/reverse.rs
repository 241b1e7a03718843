//! `udp_client -R` and `--bidir` on loopback, the real binaries on
//! ephemeral ports: every datagram the server says it sent is either
//! counted by the client or counted lost, at 64, 1460 and 65500 bytes; the
//! server's own `stream_done` agrees with the client; and requests over
//! the server's caps are refused with the reason.

mod common;

use common::udp::{args_to, client_outcome, stream, u, Server};
use serde_json::Value;

/// The server's `stream_done` for the client's session.
fn stream_done(server: &Server, session: &str) -> Value {
    server.find(&format!("stream_done for {session}"), |v| {
        v["event"] == "stream_done" && v["session"] == session
    })
}

/// Checks a reverse run of `packets` datagrams of `size` bytes: the sender
/// sent exactly that, the client counted every one as received or lost,
/// and the server's report says the same.
fn assert_reverse_exact(server: &Server, report: &Value, packets: u64, size: u64) {
    let s = stream(report, "server_to_client");
    let (sender, receiver) = (&s["sender"], &s["receiver"]);
    assert_eq!(u(sender, "packets"), packets, "server sent: {report}");
    assert_eq!(u(sender, "bytes"), packets * size, "server sent: {report}");
    assert_eq!(
        u(receiver, "packets") + u(receiver, "lost_packets"),
        packets,
        "received + lost = sent: {report}"
    );
    assert_eq!(u(receiver, "duplicates"), 0, "{report}");
    assert_eq!(
        u(receiver, "bytes"),
        u(receiver, "packets") * size,
        "{report}"
    );
    let d = &report["downloads"][0];
    assert_eq!(d["answered"], true, "the server's End arrived: {report}");
    let session = d["session"].as_str().expect("session");
    let done = stream_done(server, session);
    assert_eq!(done["reason"], "answered", "{done}");
    assert_eq!(done["direction"], "server_to_client", "{done}");
    assert_eq!(u(&done, "sent_packets"), packets, "{done}");
    assert_eq!(u(&done, "sent_bytes"), packets * size, "{done}");
    assert_eq!(
        u(&done["received"], "packets"),
        u(receiver, "packets"),
        "the server heard the client's count: {done}"
    );
    assert_eq!(
        u(&done["received"], "lost_packets"),
        u(receiver, "lost_packets")
    );
}

fn run(server: &Server, rest: &str) -> Value {
    let out = client_outcome(&args_to(&server.addr, rest));
    assert_eq!(out.code, Some(0), "udp_client {rest}: {}", out.stderr);
    out.report.expect("a JSON report")
}

#[test]
fn reverse_counts_every_datagram_at_each_size() {
    let server = Server::loopback();
    for (size, packets) in [(64u64, 20_000u64), (1460, 20_000), (65500, 2_000)] {
        let report = run(&server, &format!("-R -b {size} -n {packets}"));
        assert_reverse_exact(&server, &report, packets, size);
        assert_eq!(
            report["streams"].as_array().map(Vec::len),
            Some(1),
            "-R has one stream: {report}"
        );
        assert!(report["upload"].is_null(), "no upload in -R: {report}");
    }
    server.stop();
}

#[test]
fn reverse_paced_holds_the_rate_and_loses_nothing() {
    let server = Server::loopback();
    // 20,000 datagrams of 1000 bytes at 400 Mbit/s: 0.4 s.
    let report = run(&server, "-R -b 1000 -n 20000 --rate 400Mbit");
    assert_reverse_exact(&server, &report, 20_000, 1000);
    let receiver = &stream(&report, "server_to_client")["receiver"];
    assert_eq!(
        u(receiver, "lost_packets"),
        0,
        "paced on loopback: {report}"
    );
    let seconds = receiver["seconds"].as_f64().expect("seconds");
    assert!(
        (0.3..1.0).contains(&seconds),
        "20,000 × 1000 B at 400 Mbit/s take 0.4 s, not {seconds}: {report}"
    );
    assert_eq!(report["downloads"][0]["granted_rate_bps"], 400_000_000u64);
    server.stop();
}

#[test]
fn bidir_reports_each_direction_exactly() {
    let server = Server::loopback();
    for (size, packets) in [(64u64, 10_000u64), (1460, 10_000), (65500, 1_000)] {
        let report = run(&server, &format!("--bidir -b {size} -n {packets}"));
        assert_eq!(
            report["streams"].as_array().map(Vec::len),
            Some(2),
            "{report}"
        );
        assert_reverse_exact(&server, &report, packets, size);
        let up = stream(&report, "client_to_server");
        assert_eq!(u(&up["sender"], "packets"), packets, "{report}");
        assert_eq!(
            u(&up["receiver"], "packets") + u(&up["receiver"], "lost_packets"),
            packets,
            "upload: received + lost = sent: {report}"
        );
        // The upload's session is the server's ordinary peer.
        let upload_session = report["upload"]["clients"][0]["session"]
            .as_str()
            .expect("upload session");
        let done = server.done_for(upload_session);
        assert_eq!(u(&done, "packets"), u(&up["receiver"], "packets"), "{done}");
    }
    server.stop();
}

#[test]
fn several_reverse_clients_each_count_exactly() {
    let server = Server::loopback();
    let report = run(&server, "-R -P 4 -b 1200 -n 5000 --rate 200Mbit");
    let downloads = report["downloads"].as_array().expect("downloads");
    assert_eq!(downloads.len(), 4, "{report}");
    for d in downloads {
        let r = &d["received"];
        assert_eq!(u(r, "packets") + u(r, "lost"), 5000, "{d}");
        let done = stream_done(&server, d["session"].as_str().expect("session"));
        assert_eq!(u(&done, "sent_packets"), 5000, "{done}");
        assert_eq!(u(&done["received"], "packets"), u(r, "packets"), "{done}");
    }
    let s = stream(&report, "server_to_client");
    assert_eq!(
        u(&s["sender"], "packets"),
        20_000,
        "summed over clients: {report}"
    );
    server.stop();
}

#[test]
fn requests_over_the_caps_are_refused_with_the_reason() {
    let server = Server::start(
        "127.0.0.1:0",
        &[
            "--max-duration",
            "2s",
            "--max-rate",
            "100Mbit",
            "--max-reverse-streams",
            "1",
        ],
    );
    let cases = [
        ("-R --duration 5s --rate 10Mbit", "--max-duration"),
        ("-R -t 100M --rate 10Mbit", "--max-duration"),
        ("-R -n 100 --rate 200Mbit", "--max-rate"),
        (
            "-R -P 2 -b 100 -n 2000 --rate 10Mbit",
            "--max-reverse-streams",
        ),
    ];
    for (rest, says) in cases {
        let out = client_outcome(&args_to(&server.addr, rest));
        assert_eq!(out.code, Some(1), "udp_client {rest}: {}", out.stderr);
        assert!(
            out.stderr.contains("refused to send") && out.stderr.contains(says),
            "udp_client {rest} should say why, naming {says}: {}",
            out.stderr
        );
        assert!(
            out.elapsed.as_secs() < 10,
            "refused at once: {:?}",
            out.elapsed
        );
    }
    // Within the caps it runs, and an unpaced request is paced at the cap.
    let report = run(&server, "-R -b 1000 -n 2000");
    assert_eq!(report["downloads"][0]["granted_rate_bps"], 100_000_000u64);
    assert_reverse_exact(&server, &report, 2000, 1000);
    server.stop();
}

#[test]
fn with_a_key_both_directions_work_and_a_keyless_client_is_told() {
    let key = "correct-horse-battery";
    let server = Server::start("127.0.0.1:0", &["--recv-buffer-size", "4M", "--psk", key]);
    let report = run(&server, &format!("--bidir -b 1400 -n 5000 --psk {key}"));
    assert_reverse_exact(&server, &report, 5000, 1400);
    let out = client_outcome(&args_to(&server.addr, "-R -n 10"));
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("requires a pre-shared key"),
        "{}",
        out.stderr
    );
    server.stop();
}

#[test]
fn reverse_flags_that_cannot_apply_are_usage_errors() {
    for (rest, says) in [
        ("-R --no-server", "cannot be used with"),
        ("-R --bidir", "cannot be used with"),
        ("--recv-buffer-size 8M", "needs -R or --bidir"),
        ("--bidir --find-limit", "cannot be used with"),
    ] {
        let out = client_outcome(&args_to("127.0.0.1:9", rest));
        assert_eq!(out.code, Some(2), "udp_client {rest}: {}", out.stderr);
        assert!(
            out.stderr.contains(says),
            "udp_client {rest}: {}",
            out.stderr
        );
    }
}

#[test]
fn eight_reverse_clients_and_uploads_at_once_all_count_exactly() {
    let server = Server::loopback();
    let addr = server.addr.clone();
    // 8 processes receiving paced streams while 2 others upload.
    let reverse: Vec<_> = (0..8)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                client_outcome(&args_to(&addr, "-R -b 1200 -n 6000 --rate 100Mbit"))
            })
        })
        .collect();
    let uploads: Vec<_> = (0..2)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                client_outcome(&args_to(&addr, "-b 1200 -n 6000 --rate 100Mbit"))
            })
        })
        .collect();
    for h in reverse {
        let out = h.join().expect("a reverse client");
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        let report = out.report.expect("a report");
        assert_reverse_exact(&server, &report, 6000, 1200);
    }
    for h in uploads {
        let out = h.join().expect("an upload client");
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        let report = out.report.expect("a report");
        let c = &report["clients"][0];
        common::udp::assert_exact(&report, c, &server.done_for(c["session"].as_str().unwrap()));
    }
    server.stop();
}

#[test]
fn the_servers_interval_lines_of_a_stream_add_up_to_what_it_sent() {
    let server = Server::start_args(&["--listen", "127.0.0.1:0", "--interval", "200ms"]);
    let report = run(&server, "-R -b 1000 -n 12000 --rate 100Mbit");
    assert_reverse_exact(&server, &report, 12000, 1000);
    let session = report["downloads"][0]["session"].as_str().expect("session");
    let events = server.stop();
    let lines: Vec<&Value> = events
        .iter()
        .filter(|v| {
            v["event"] == "interval"
                && v["direction"] == "server_to_client"
                && v["session"] == session
        })
        .collect();
    // 12,000 × 1000 B at 100 Mbit/s: 0.96 s, so several 200 ms lines.
    assert!(lines.len() >= 3, "{lines:?}");
    let sent: u64 = lines.iter().map(|v| u(v, "sent_bytes")).sum();
    assert_eq!(
        sent, 12_000_000,
        "interval lines add up to the stream: {lines:?}"
    );
    for pair in lines.windows(2) {
        assert_eq!(pair[0]["end"], pair[1]["start"], "contiguous: {lines:?}");
    }
}

#[test]
fn a_small_client_buffer_is_named_as_the_cap_of_a_reverse_stream() {
    let server = Server::loopback();
    // An unpaced stream into a 64 KiB receive buffer on the client.
    let report = run(&server, "-R -b 1460 -t 300M --recv-buffer-size 64K");
    let s = stream(&report, "server_to_client");
    let receiver = &s["receiver"];
    assert!(u(receiver, "lost_packets") > 0, "{report}");
    if netspeed::sys::LINUX_SOCKETS {
        assert!(
            u(receiver, "kernel_drops") > 0,
            "the client's socket dropped: {report}"
        );
    } else {
        // The portable backend has no drop counter: unknown, not 0.
        assert!(receiver["kernel_drops"].is_null(), "{report}");
    }
    let cause = s["limited_by"]["cause"].as_str().unwrap_or_default();
    // Without a drop counter the loss cannot be placed (portable backend).
    let expected: &[&str] = if netspeed::sys::LINUX_SOCKETS {
        &["receive_buffer", "receiver_cpu"]
    } else {
        &["unknown"]
    };
    assert!(expected.contains(&cause), "{cause}: {report}");
    let text = s["limited_by"]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("this client's"),
        "the client is the receiver: {text}"
    );
    assert!(!text.contains("on the server"), "{text}");
    server.stop();
}

/// `--bidir --plot`: the timeline has both directions, each with what
/// arrived, the loss and the queue delay per interval (the upload's as
/// its server kept them, the reverse one's as this client measured
/// them), and the probes;
/// each stream's `latency` has the round trips and its own queue delay,
/// and no probe is counted in the data.
#[test]
fn bidir_plot_and_latency_cover_both_directions() {
    let server = Server::loopback();
    let dir = common::TempDir::new("reverse-plot");
    let svg = dir.path().join("bidir.svg");
    let rest = format!(
        "--bidir -b 1000 --rate 200Mbit --duration 1500ms --idle-probe 300ms -i 250ms --plot {}",
        svg.display()
    );
    let report = run(&server, &rest);
    let chart = std::fs::read_to_string(&svg).expect("the timeline was written");
    for part in [
        "client to server, sent",
        "client to server, received",
        "client to server, lost",
        "client to server, queue delay p50",
        "client to server, queue delay p99",
        "server to client, received",
        "server to client, lost",
        "server to client, queue delay p50",
        "server to client, queue delay p99",
        "round trip (probes)",
        "idle round trip",
    ] {
        assert!(chart.contains(part), "the timeline shows {part:?}");
    }
    for direction in ["client_to_server", "server_to_client"] {
        let s = stream(&report, direction);
        let latency = &s["latency"];
        assert!(u(latency, "probes_sent") > 0, "{latency}");
        assert!(latency["idle_rtt_ms"].is_number(), "{latency}");
        assert!(latency["loaded_rtt_ms"]["p50"].is_number(), "{latency}");
        // Every datagram of the direction is in its queue delay, and
        // nothing else: the probes are not data.
        assert_eq!(
            u(latency, "delay_samples"),
            u(&s["receiver"], "packets"),
            "{direction}: {s}"
        );
        // The kernel's receive timestamps where the backend has them (the
        // portable one times datagrams when it reads them).
        let expected = if netspeed::sys::RX_TIMESTAMPS {
            "kernel"
        } else {
            "read"
        };
        assert_eq!(latency["arrival_times"], expected, "{latency}");
    }
    server.stop();
}

/// The server's `--no-gso` reaches the datagrams it sends (issue 41): a
/// client that asks for GSO gets a stream sent without it, and both the
/// server's `stream_done` and the client's `server_send` say so; a
/// default server on the same request uses GSO.
#[test]
fn the_servers_no_gso_reaches_its_reverse_sends() {
    let gso_segments = |server: &Server, report: &Value| {
        let session = report["downloads"][0]["session"].as_str().expect("session");
        let done = stream_done(server, session);
        let client_side = report["downloads"][0]["server_send"].clone();
        assert!(
            client_side.is_object(),
            "the server's End said how: {report}"
        );
        (client_side["gso_segments"].as_u64(), done)
    };
    let default = Server::loopback();
    let report = run(&default, "-R --gso -b 1400 -n 2000");
    let (segments, _) = gso_segments(&default, &report);
    if cfg!(feature = "portable") {
        // The portable backend has no GSO: the default is plain sends.
        assert_eq!(segments, None, "no GSO in the portable backend: {report}");
    } else {
        assert!(segments.is_some_and(|n| n > 1), "GSO by default: {report}");
    }
    default.stop();

    let server = Server::start("127.0.0.1:0", &["--recv-buffer-size", "4M", "--no-gso"]);
    let report = run(&server, "-R --gso -b 1400 -n 2000");
    let (segments, done) = gso_segments(&server, &report);
    assert_eq!(segments, None, "--no-gso on the server: {report}");
    let path = done["send_path"].as_str().expect("a send path");
    assert!(!path.contains("GSO") && !path.contains("gso"), "{done}");
    assert_reverse_exact(&server, &report, 2000, 1400);
    server.stop();
}
