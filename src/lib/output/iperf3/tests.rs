//! The iperf3 document on constructed reports: every field, its JSON type
//! and its unit, and iperf3's quirks that its readers rely on.

use super::client::{duplex, duplex_test, failed, upload};
use super::server::ServerTest;
use super::*;
use crate::client::duplex::{reverse_stream, upload_stream, DuplexReport};
use crate::client::reverse::ReverseStream;
use crate::client::{ClientReport, Interrupted, RunReport, ServerView};
use crate::meter::account::{DoneReason, PeerReport};
use crate::server::reverse::{ClientReceived, StreamEnd, StreamInterval, StreamReport};
use crate::server::ServerEvent;
use crate::stats::{CpuCost, SendInterval};
use crate::wire::{Direction, End, SenderStats};
use std::time::Duration;

fn meta() -> Meta {
    let cfg = crate::config::testing::client(&[
        "-s",
        "127.0.0.1:5201",
        "-b",
        "1400",
        "--duration",
        "2s",
        "--rate",
        "100M",
    ])
    .unwrap();
    Meta::client(&cfg, UNIX_EPOCH + Duration::from_secs(1_795_803_258))
}

fn cpu(user: f64, system: f64, span: f64) -> CpuCost {
    CpuCost {
        user_seconds: Some(user),
        system_seconds: Some(system),
        seconds: user + system,
        percent_of_core: Some((user + system) * 100.0 / span),
        seconds_per_gb: None,
        shared: None,
    }
}

/// One client that sent 17850 datagrams of 1400 bytes over 2 s in two
/// intervals; the server lost 3 of them.
fn client(port: u16, jitter_ms: f64) -> ClientReport {
    let mut c = ClientReport::default();
    c.session = format!("{port:016x}");
    c.local_addr = format!("127.0.0.1:{port}");
    c.sent_packets = 17850;
    c.sent_bytes = 17850 * 1400;
    c.seconds = 2.0;
    c.gbps = Some(0.0999);
    c.intervals = vec![
        SendInterval {
            start: 0.0,
            end: 1.0,
            packets: 8922,
            bytes: 8922 * 1400,
            gbps: Some(0.0999),
        },
        SendInterval {
            start: 1.0,
            end: 2.0,
            packets: 8928,
            bytes: 8928 * 1400,
            gbps: Some(0.1),
        },
    ];
    c.server = Some(ServerView {
        received_packets: 17847,
        received_bytes: 17847 * 1400,
        lost_packets: 3,
        reordered: 2,
        jitter_ms,
        gbps: Some(0.0998),
        seconds: 2.001,
        ..ServerView::default()
    });
    c
}

fn run(clients: Vec<ClientReport>) -> RunReport {
    let n = clients.len() as u64;
    RunReport {
        server_addr: "127.0.0.1:5201".into(),
        sent_packets: 17850 * n,
        sent_bytes: 17850 * 1400 * n,
        seconds: 2.0,
        gbps: Some(0.0999 * n as f64),
        cpu: Some(cpu(0.02, 0.18, 2.0)),
        server: Some(ServerView {
            received_packets: 17847 * n,
            received_bytes: 17847 * 1400 * n,
            lost_packets: 3 * n,
            gbps: Some(0.0998 * n as f64),
            seconds: 2.001,
            cpu: Some(CpuCost {
                user_seconds: None,
                system_seconds: None,
                seconds: 0.1,
                percent_of_core: Some(5.0),
                seconds_per_gb: None,
                shared: None,
            }),
            ..ServerView::default()
        }),
        clients_answered: clients.len(),
        complete: true,
        clients,
        ..RunReport::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1.0)
}

fn f(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

/// An integer, as Go's `int` and pScheduler's schema want it.
fn int(v: &Value, key: &str) -> i64 {
    assert!(
        v[key].is_i64() || v[key].is_u64(),
        "{key} is not an integer in {v}"
    );
    v[key].as_i64().unwrap()
}

fn no_nulls(v: &Value, at: &str) {
    match v {
        Value::Null => panic!("null at {at}"),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, x)| no_nulls(x, &format!("{at}[{i}]"))),
        Value::Object(o) => o
            .iter()
            .for_each(|(k, x)| no_nulls(x, &format!("{at}.{k}"))),
        _ => {}
    }
}

#[test]
fn an_upload_has_every_field_in_iperf3s_types_and_units() {
    let doc = upload(&run(vec![client(40001, 0.0065)]), &meta());
    no_nulls(&doc, "");
    assert!(doc.get("error").is_none(), "{doc}");
    let start = &doc["start"];
    assert_eq!(start["version"], version());
    assert_eq!(start["timestamp"]["time"], "Fri, 27 Nov 2026 18:14:18 GMT");
    assert_eq!(int(&start["timestamp"], "timesecs"), 1_795_803_258);
    assert_eq!(start["connecting_to"]["host"], "127.0.0.1");
    assert_eq!(int(&start["connecting_to"], "port"), 5201);
    assert!(start.get("accepted_connection").is_none());
    let c = &start["connected"][0];
    assert_eq!(int(c, "socket"), 1);
    assert_eq!(
        (c["local_host"].as_str(), int(c, "local_port")),
        (Some("127.0.0.1"), 40001)
    );
    assert_eq!(
        (c["remote_host"].as_str(), int(c, "remote_port")),
        (Some("127.0.0.1"), 5201)
    );
    let t = &start["test_start"];
    assert_eq!(t["protocol"], "UDP");
    for (key, want) in [
        ("num_streams", 1),
        ("blksize", 1400),
        ("omit", 0),
        ("duration", 2),
        ("bytes", 0),
        ("blocks", 0),
        ("reverse", 0),
        ("bidir", 0),
        ("tos", 0),
        ("target_bitrate", 100_000_000),
    ] {
        assert_eq!(int(t, key), want, "test_start.{key}");
    }
    assert_eq!(f(t, "interval"), 1.0);
    assert_eq!(int(start, "target_bitrate"), 100_000_000);

    // Intervals: the sender's shape, no jitter or loss.
    let ivs = doc["intervals"].as_array().unwrap();
    assert_eq!(ivs.len(), 2);
    let s = &ivs[1]["streams"][0];
    assert_eq!(int(s, "socket"), 1);
    assert_eq!(
        (f(s, "start"), f(s, "end"), f(s, "seconds")),
        (1.0, 2.0, 1.0)
    );
    assert_eq!(int(s, "bytes"), 8928 * 1400);
    assert_eq!(int(s, "packets"), 8928);
    assert!(close(f(s, "bits_per_second"), 1e8));
    assert_eq!(
        (s["omitted"].as_bool(), s["sender"].as_bool()),
        (Some(false), Some(true))
    );
    assert!(s.get("jitter_ms").is_none() && s.get("lost_packets").is_none());
    let sum = &ivs[1]["sum"];
    assert!(sum.get("socket").is_none());
    assert_eq!(int(sum, "bytes"), 8928 * 1400);
    assert!(close(f(sum, "bits_per_second"), 8928.0 * 1400.0 * 8.0));

    let end = &doc["end"];
    let udp = &end["streams"][0]["udp"];
    assert_eq!(int(udp, "socket"), 1);
    assert_eq!(
        (f(udp, "start"), f(udp, "end"), f(udp, "seconds")),
        (0.0, 2.0, 2.0)
    );
    assert_eq!(int(udp, "bytes"), 17850 * 1400);
    assert!(close(f(udp, "bits_per_second"), 0.0999e9));
    assert_eq!(f(udp, "jitter_ms"), 0.0065);
    assert_eq!(int(udp, "lost_packets"), 3);
    assert_eq!(int(udp, "packets"), 17850);
    assert!(close(f(udp, "lost_percent"), 300.0 / 17850.0));
    assert_eq!(int(udp, "out_of_order"), 2);
    assert_eq!(udp["sender"], true);

    // end.sum: the sender's bytes and rate, the receiver's span, jitter
    // and loss.
    let sum = &end["sum"];
    assert_eq!(int(sum, "bytes"), 17850 * 1400);
    assert!(close(f(sum, "bits_per_second"), 0.0999e9));
    assert_eq!(f(sum, "seconds"), 2.001);
    assert_eq!(f(sum, "jitter_ms"), 0.0065);
    assert_eq!(int(sum, "lost_packets"), 3);
    assert_eq!(int(sum, "packets"), 17850);
    assert_eq!(sum["sender"], true);
    assert!(sum.get("out_of_order").is_none());
    // sum_sent: zeros for jitter and loss, always sender.
    let sent = &end["sum_sent"];
    assert_eq!((f(sent, "seconds"), int(sent, "packets")), (2.0, 17850));
    assert_eq!(
        (
            f(sent, "jitter_ms"),
            int(sent, "lost_packets"),
            f(sent, "lost_percent")
        ),
        (0.0, 0, 0.0)
    );
    assert_eq!(sent["sender"], true);
    // sum_received: the receiver's own count and rate, never sender.
    let got = &end["sum_received"];
    assert_eq!(int(got, "bytes"), 17847 * 1400);
    assert_eq!(int(got, "packets"), 17847);
    assert_eq!(int(got, "lost_packets"), 3);
    assert!(close(f(got, "bits_per_second"), 0.0998e9));
    assert_eq!(f(got, "seconds"), 2.001);
    assert_eq!(got["sender"], false);
    assert!(end.get("sum_bidir_reverse").is_none());

    // CPU in percent of one core: the sending threads, the server's
    // receive threads (no user/system split there: 0).
    let c = &end["cpu_utilization_percent"];
    assert!(close(f(c, "host_total"), 10.0));
    assert!(close(f(c, "host_user"), 1.0));
    assert!(close(f(c, "host_system"), 9.0));
    assert!(close(f(c, "remote_total"), 5.0));
    assert_eq!((f(c, "remote_user"), f(c, "remote_system")), (0.0, 0.0));
}

#[test]
fn several_streams_add_up_and_average_their_jitter() {
    let doc = upload(
        &run(vec![client(40001, 0.01), client(40002, 0.03)]),
        &meta(),
    );
    let start = &doc["start"];
    assert_eq!(start["connected"].as_array().unwrap().len(), 2);
    assert_eq!(int(&start["connected"][1], "socket"), 2);
    let iv = &doc["intervals"][0];
    assert_eq!(iv["streams"].as_array().unwrap().len(), 2);
    assert_eq!(int(&iv["sum"], "packets"), 2 * 8922);
    assert_eq!(int(&iv["sum"], "bytes"), 2 * 8922 * 1400);
    let end = &doc["end"];
    assert_eq!(end["streams"].as_array().unwrap().len(), 2);
    assert_eq!(int(&end["sum"], "lost_packets"), 6);
    assert_eq!(int(&end["sum"], "packets"), 2 * 17850);
    assert!(close(f(&end["sum"], "jitter_ms"), 0.02));
    assert_eq!(int(&end["sum_received"], "packets"), 2 * 17847);
    assert_eq!(int(&end["sum_received"], "bytes"), 2 * 17847 * 1400);
    assert!(close(
        f(&end["sum_received"], "bits_per_second"),
        2.0 * 0.0998e9
    ));
    assert!(close(f(&end["sum"], "lost_percent"), 600.0 / 35700.0));
}

/// One reverse stream: the server declared 2500 datagrams over 1 s; this
/// client counted 2497, two intervals.
fn reverse(port: u16) -> (ReverseStream, Vec<PeerReport>) {
    let session = format!("{port:016x}");
    let line = |packets: u64, lost: u64, jitter: f64| PeerReport {
        session: Some(session.clone()),
        tagged: true,
        packets,
        bytes: packets * 1000,
        seconds: 0.5,
        gbps: Some(packets as f64 * 8000.0 / 0.5 / 1e9),
        lost: Some(lost),
        jitter_ms: Some(jitter),
        ..PeerReport::default()
    };
    let lines = vec![line(1248, 2, 0.004), line(1249, 3, 0.005)];
    let received = PeerReport {
        peer: "127.0.0.1:5201".into(),
        tagged: true,
        session: Some(session.clone()),
        packets: 2497,
        bytes: 2_497_000,
        seconds: 0.999,
        gbps: Some(0.01998),
        lost: Some(3),
        reordered: Some(1),
        jitter_ms: Some(0.005),
        reason: Some(DoneReason::End),
        declared: Some(End {
            sent_packets: 2500,
            sent_bytes: 2_500_000,
            duration_ns: 1_000_000_000,
            sender: Some(SenderStats {
                cpu_user_ns: 10_000_000,
                cpu_system_ns: 30_000_000,
                first_call_bytes: 1000,
                ..SenderStats::default()
            }),
            ..End::default()
        }),
        ..PeerReport::default()
    };
    let stream = ReverseStream {
        session,
        local_addr: format!("127.0.0.1:{port}"),
        received,
        granted_rate_bps: Some(20_000_000),
        recv_buffer: 4 << 20,
        gro: true,
        answered: true,
        receive_cpu: Some(cpu(0.005, 0.015, 1.0)),
        server_breaker: None,
        server_send: None,
    };
    (stream, lines)
}

fn duplex_report(upload: Option<RunReport>, reverse: Vec<ReverseStream>) -> DuplexReport {
    let cfg = crate::config::testing::client(&["-s", "127.0.0.1:5201", "-R"]).unwrap();
    let mut streams = Vec::new();
    if let Some(u) = &upload {
        streams.push(upload_stream(u));
    }
    streams.push(reverse_stream(&cfg, &reverse));
    DuplexReport {
        streams,
        upload,
        reverse,
        interrupted: None,
    }
}

#[test]
fn a_reverse_stream_is_the_receivers_shape_with_the_servers_end() {
    let (stream, lines) = reverse(40010);
    let report = duplex_report(None, vec![stream]);
    let mut m = meta();
    m.test_start.reverse = true;
    let doc = duplex(&report, &lines, &m);
    no_nulls(&doc, "");
    assert!(doc.get("error").is_none(), "{doc}");
    assert_eq!(int(&doc["start"]["test_start"], "reverse"), 1);
    let ivs = doc["intervals"].as_array().unwrap();
    assert_eq!(ivs.len(), 2);
    let s = &ivs[1]["streams"][0];
    assert_eq!((f(s, "start"), f(s, "end")), (0.5, 1.0));
    assert_eq!(int(s, "packets"), 1249);
    // The loss in the interval, not the running total.
    assert_eq!(int(s, "lost_packets"), 1);
    assert!(close(f(s, "lost_percent"), 100.0 / 1250.0));
    assert_eq!(f(s, "jitter_ms"), 0.005);
    assert_eq!(s["sender"], false);
    assert_eq!(ivs[1]["sum"]["sender"], false);
    assert_eq!(int(&ivs[1]["sum"], "lost_packets"), 1);
    assert!(ivs[1].get("sum_bidir_reverse").is_none());

    let end = &doc["end"];
    let udp = &end["streams"][0]["udp"];
    assert_eq!(udp["sender"], false);
    assert_eq!(int(udp, "bytes"), 2_500_000);
    assert_eq!(int(udp, "packets"), 2500);
    assert_eq!(int(udp, "lost_packets"), 3);
    assert_eq!(int(udp, "out_of_order"), 1);
    // The server's rate: what it sent after its first call, over its span.
    assert!(close(f(udp, "bits_per_second"), 2_499_000.0 * 8.0));
    assert_eq!(end["sum"]["sender"], false);
    assert_eq!(int(&end["sum"], "bytes"), 2_500_000);
    assert_eq!(end["sum_sent"]["sender"], true);
    assert_eq!(int(&end["sum_sent"], "packets"), 2500);
    assert_eq!(end["sum_received"]["sender"], false);
    assert_eq!(int(&end["sum_received"], "packets"), 2497);
    assert_eq!(int(&end["sum_received"], "bytes"), 2_497_000);
    assert_eq!(int(&end["sum_received"], "lost_packets"), 3);
    assert!(close(f(&end["sum_received"], "bits_per_second"), 0.01998e9));
    let c = &end["cpu_utilization_percent"];
    assert!(close(f(c, "host_total"), 2.0));
    assert!(close(f(c, "host_system"), 1.5));
    // The server's sending thread: 40 ms over its 1 s.
    assert!(close(f(c, "remote_total"), 4.0));
    assert!(close(f(c, "remote_user"), 1.0));
}

#[test]
fn bidir_names_the_server_to_client_flow_bidir_reverse() {
    let (a, mut lines) = reverse(40010);
    let (b, more) = reverse(40011);
    lines.extend(more);
    let report = duplex_report(
        Some(run(vec![client(40001, 0.01), client(40002, 0.01)])),
        vec![a, b],
    );
    let test = duplex_test(&report, &lines, &meta());
    assert_eq!(test.flows.len(), 2);
    let doc = document(&test);
    no_nulls(&doc, "");
    let sockets: Vec<i64> = doc["start"]["connected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| int(c, "socket"))
        .collect();
    assert_eq!(sockets, [1, 2, 3, 4]);
    let iv = &doc["intervals"][0];
    let senders: Vec<bool> = iv["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sender"].as_bool().unwrap())
        .collect();
    // The client's sending streams first, then its receiving ones.
    assert_eq!(senders, [true, true, false, false]);
    assert_eq!(iv["sum"]["sender"], true);
    assert_eq!(iv["sum_bidir_reverse"]["sender"], false);
    assert_eq!(int(&iv["sum_bidir_reverse"], "packets"), 2 * 1248);
    let end = &doc["end"];
    assert_eq!(end["streams"].as_array().unwrap().len(), 4);
    for (name, sender) in [
        ("sum", true),
        ("sum_sent", true),
        ("sum_received", false),
        ("sum_bidir_reverse", false),
        ("sum_sent_bidir_reverse", true),
        ("sum_received_bidir_reverse", false),
    ] {
        assert_eq!(end[name]["sender"], sender, "{name}");
    }
    assert_eq!(int(&end["sum_received"], "packets"), 2 * 17847);
    assert_eq!(int(&end["sum_received_bidir_reverse"], "packets"), 2 * 2497);
    assert_eq!(int(&end["sum_received_bidir_reverse"], "lost_packets"), 6);
    assert_eq!(int(&end["sum_sent_bidir_reverse"], "bytes"), 5_000_000);
}

#[test]
fn unknown_rates_and_spans_are_zeros_never_null() {
    let mut c = client(40001, 0.0);
    c.gbps = None;
    c.seconds = 0.0;
    c.intervals[0].gbps = None;
    c.server.as_mut().unwrap().gbps = None;
    let mut r = run(vec![c]);
    r.gbps = None;
    r.seconds = 0.0;
    r.cpu = None;
    r.server.as_mut().unwrap().cpu = None;
    let doc = upload(&r, &meta());
    no_nulls(&doc, "");
    assert_eq!(f(&doc["end"]["sum_sent"], "bits_per_second"), 0.0);
    assert_eq!(f(&doc["end"]["cpu_utilization_percent"], "host_total"), 0.0);
    // And a document whose streams know nothing of each other's side.
    let doc = document(&Test {
        meta: meta(),
        flows: vec![Flow {
            streams: vec![Stream::default()],
            ..Flow::default()
        }],
        cpu: Cpu::default(),
        error: None,
    });
    no_nulls(&doc, "");
    assert_eq!(f(&doc["end"]["sum"], "lost_percent"), 0.0);
}

#[test]
fn a_run_without_every_answer_or_cut_short_says_so_in_error() {
    let mut r = run(vec![client(40001, 0.0), client(40002, 0.0)]);
    r.clients_answered = 1;
    r.complete = false;
    let doc = upload(&r, &meta());
    let error = doc["error"].as_str().expect("an error");
    assert!(error.contains("missing for 1 of 2 clients"), "{error}");
    // The figures are still there.
    assert_eq!(doc["end"]["streams"].as_array().unwrap().len(), 2);

    r.interrupted = Some(Interrupted {
        signal: "SIGINT",
        after_seconds: 1.5,
    });
    let doc = upload(&r, &meta());
    assert!(
        doc["error"].as_str().unwrap().starts_with("interrupt - "),
        "{doc}"
    );

    let (mut stream, lines) = reverse(40010);
    stream.answered = false;
    stream.received.declared = None;
    let doc = duplex(&duplex_report(None, vec![stream]), &lines, &meta());
    let error = doc["error"].as_str().expect("an error");
    assert!(error.contains("1 of 1 reverse streams"), "{error}");
    no_nulls(&doc, "");
    // Without the server's End, the expected datagrams are what arrived
    // and what was found missing.
    assert_eq!(int(&doc["end"]["streams"][0]["udp"], "packets"), 2500);
}

#[test]
fn a_failure_is_iperf3s_error_document() {
    let doc = failed(&meta(), "no udp_server answered at 127.0.0.1:5201");
    assert_eq!(doc["error"], "no udp_server answered at 127.0.0.1:5201");
    assert_eq!(doc["intervals"], json!([]));
    assert_eq!(doc["end"], json!({}));
    assert_eq!(doc["start"]["connected"], json!([]));
    assert!(doc["start"]["version"].is_string());
    no_nulls(&doc, "");
}

#[test]
fn dates_are_rfc_1123_in_gmt() {
    let at = |s: u64| http_date(UNIX_EPOCH + Duration::from_millis(s));
    assert_eq!(at(0).0, "Thu, 01 Jan 1970 00:00:00 GMT");
    let (text, secs, millis) = at(1_795_803_258_123);
    assert_eq!(text, "Fri, 27 Nov 2026 18:14:18 GMT");
    assert_eq!((secs, millis), (1_795_803_258, 1_795_803_258_123));
    assert_eq!(at(951_782_400_000).0, "Tue, 29 Feb 2000 00:00:00 GMT");
}

fn peer_line(session: &str, packets: u64, lost: u64, done: bool) -> PeerReport {
    PeerReport {
        peer: "127.0.0.1:40001".into(),
        tagged: true,
        session: Some(session.into()),
        packets,
        bytes: packets * 1400,
        seconds: 1.0,
        gbps: Some(packets as f64 * 1400.0 * 8.0 / 1e9),
        lost: Some(lost),
        reordered: Some(0),
        jitter_ms: Some(0.01),
        cpu: done.then(|| cpu(0.01, 0.04, 1.0)),
        reason: done.then_some(DoneReason::End),
        declared: done.then(|| End {
            sent_packets: 2000,
            sent_bytes: 2_800_000,
            duration_ns: 2_000_000_000,
            ..End::default()
        }),
        ..PeerReport::default()
    }
}

#[test]
fn the_servers_document_has_what_the_server_knows() {
    let mut t = ServerTest::new(Some(Duration::from_secs(1)));
    t.listening_on("127.0.0.1:5201".parse().unwrap());
    let at = UNIX_EPOCH + Duration::from_secs(1_795_803_260);
    // Foreign traffic is not the test.
    let foreign = PeerReport {
        peer: "127.0.0.1:9".into(),
        packets: 5,
        ..PeerReport::default()
    };
    t.observe_at(&ServerEvent::PeerDone(foreign), at);
    assert_eq!(t.exit_code(), 1, "nothing served yet");
    t.observe_at(&ServerEvent::Interval(peer_line("aa", 999, 1, false)), at);
    t.observe_at(&ServerEvent::Interval(peer_line("aa", 998, 2, false)), at);
    let mut done = peer_line("aa", 1997, 3, true);
    done.seconds = 2.0;
    t.observe_at(&ServerEvent::PeerDone(done), at);
    assert_eq!(t.exit_code(), 0);
    let doc = t.document();
    no_nulls(&doc, "");
    assert!(doc.get("error").is_none(), "{doc}");
    let start = &doc["start"];
    assert_eq!(start["accepted_connection"]["host"], "127.0.0.1");
    assert_eq!(int(&start["accepted_connection"], "port"), 40001);
    assert!(start.get("connecting_to").is_none());
    // Dated by the first line's span: 1 s before it was written.
    assert_eq!(int(&start["timestamp"], "timesecs"), 1_795_803_259);
    let c = &start["connected"][0];
    assert_eq!(
        (c["local_host"].as_str(), int(c, "local_port")),
        (Some("127.0.0.1"), 5201)
    );
    assert_eq!(int(c, "remote_port"), 40001);
    // What the server cannot know is left out.
    assert!(start["test_start"].get("blksize").is_none());
    assert_eq!(int(&start["test_start"], "num_streams"), 1);
    let ivs = doc["intervals"].as_array().unwrap();
    assert_eq!(ivs.len(), 2);
    assert_eq!(ivs[1]["streams"][0]["sender"], false);
    assert_eq!(int(&ivs[1]["streams"][0], "lost_packets"), 1);
    let end = &doc["end"];
    let udp = &end["streams"][0]["udp"];
    // The client's End: what it sent.
    assert_eq!((int(udp, "bytes"), int(udp, "packets")), (2_800_000, 2000));
    assert_eq!(int(udp, "lost_packets"), 3);
    assert_eq!(udp["sender"], false);
    assert_eq!(end["sum"]["sender"], false);
    assert_eq!(int(&end["sum_received"], "packets"), 1997);
    assert_eq!(int(&end["sum_sent"], "bytes"), 2_800_000);
    let cpu = &end["cpu_utilization_percent"];
    assert!(close(f(cpu, "host_total"), 5.0));
    assert_eq!(f(cpu, "remote_total"), 0.0);
}

#[test]
fn the_servers_reverse_stream_is_the_senders_shape() {
    let mut t = ServerTest::new(Some(Duration::from_secs(1)));
    t.listening_on("127.0.0.1:5201".parse().unwrap());
    let at = UNIX_EPOCH + Duration::from_secs(1_795_803_260);
    let interval = |start: f64, bytes: u64| StreamInterval {
        peer: "127.0.0.1:40010".into(),
        session: "bb".into(),
        direction: Direction::ServerToClient,
        start,
        end: start + 1.0,
        sent_bytes: bytes,
        gbps: bytes as f64 * 8.0 / 1e9,
        received_bytes: 0,
    };
    t.observe_at(&ServerEvent::StreamInterval(interval(0.0, 1_000_000)), at);
    t.observe_at(&ServerEvent::StreamInterval(interval(1.0, 1_500_000)), at);
    t.observe_at(
        &ServerEvent::StreamDone(StreamReport {
            peer: "127.0.0.1:40010".into(),
            session: "bb".into(),
            direction: Direction::ServerToClient,
            sent_packets: 2500,
            sent_bytes: 2_500_000,
            seconds: 2.0,
            gbps: Some(0.01),
            rate_bps: Some(10_000_000),
            cpu: Some(cpu(0.01, 0.03, 2.0)),
            enobufs_retries: 0,
            send_path: "sendmmsg".into(),
            received: Some(ClientReceived {
                packets: 2490,
                bytes: 2_490_000,
                lost_packets: 10,
                duplicates: 0,
                reordered: 4,
                kernel_drops: None,
                jitter_ms: 0.02,
            }),
            breaker: None,
            run: None,
            reason: StreamEnd::Answered,
            error: None,
        }),
        at,
    );
    assert_eq!(t.exit_code(), 0);
    let doc = t.document();
    no_nulls(&doc, "");
    let ts = &doc["start"]["test_start"];
    assert_eq!((int(ts, "reverse"), int(ts, "bidir")), (1, 0));
    assert_eq!(int(ts, "target_bitrate"), 10_000_000);
    let s = &doc["intervals"][1]["streams"][0];
    assert_eq!(s["sender"], true);
    assert_eq!(int(s, "bytes"), 1_500_000);
    // The server counts bytes per interval, not datagrams.
    assert!(s.get("packets").is_none() && s.get("jitter_ms").is_none());
    let end = &doc["end"];
    // One direction: `sum`, sent by this end.
    assert_eq!(end["sum"]["sender"], true);
    assert!(end.get("sum_bidir_reverse").is_none());
    let udp = &end["streams"][0]["udp"];
    assert_eq!((int(udp, "packets"), int(udp, "lost_packets")), (2500, 10));
    assert_eq!(int(udp, "out_of_order"), 4);
    assert_eq!(f(udp, "jitter_ms"), 0.02);
    assert_eq!(int(&end["sum_received"], "packets"), 2490);
    assert!(close(f(&end["cpu_utilization_percent"], "host_total"), 2.0));
}

#[test]
fn a_server_stopped_before_a_test_writes_an_error_document() {
    let t = ServerTest::new(None);
    assert_eq!(t.exit_code(), 1);
    let doc = t.document();
    assert!(doc["error"].as_str().unwrap().starts_with("interrupt - "));
    assert_eq!(doc["end"], json!({}));
    assert_eq!(doc["intervals"], json!([]));
    no_nulls(&doc, "");
}

#[test]
fn cpu_is_split_in_proportion_to_user_and_system_seconds() {
    let p = CpuPercent::of(&cpu(0.25, 0.75, 2.0));
    assert!(close(p.total, 50.0) && close(p.user, 12.5) && close(p.system, 37.5));
    let whole_only = CpuCost {
        user_seconds: None,
        system_seconds: None,
        seconds: 1.0,
        percent_of_core: Some(50.0),
        seconds_per_gb: None,
        shared: None,
    };
    assert_eq!(
        CpuPercent::of(&whole_only),
        CpuPercent {
            total: 50.0,
            user: 0.0,
            system: 0.0
        }
    );
}
