//! `udp_server --metrics`: the real binaries on loopback ephemeral ports,
//! scraped with a real HTTP client (ureq) and, in the last test, by a real
//! Prometheus. The counters must be the `peer_done` figures of the same
//! sessions, exactly; finished peers must age out, and at most
//! `--max-peers` of them be kept.

mod common;

use common::impair::{kind, Action, Pick};
use common::udp::{args_to, client, u, Server, SERVER, WAIT};
use common::{one_line_error, poll_every, run_bounded, wait_until, ChildGuard, TempDir};
use netspeed::config::{parse_args, ServerArgs, ServerConfig};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A `udp_server --json --metrics 127.0.0.1:0` and the address its
/// listening event says the endpoint bound.
fn start(extra: &[&str]) -> (Server, String) {
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--interval",
        "0",
        "--metrics",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let server = Server::start_args(&args);
    let listening = server.events.borrow()[0].clone();
    let metrics = listening["metrics"]
        .as_str()
        .unwrap_or_else(|| panic!("no metrics address in {listening}"))
        .to_string();
    (server, metrics)
}

/// Waits for `done`, scraping at most ten times a second.
fn poll_until(timeout: Duration, what: &str, done: impl FnMut() -> bool) {
    assert!(
        poll_every(Duration::from_millis(100), timeout, done),
        "timed out after {timeout:?} waiting for {what}"
    );
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into()
}

/// GET `url`: status, content type and body.
fn get(url: &str) -> (u16, String, String) {
    let mut response = agent()
        .get(url)
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = response
        .body_mut()
        .read_to_string()
        .unwrap_or_else(|e| panic!("GET {url}: body: {e}"));
    (response.status().as_u16(), content_type, body)
}

/// One sample of the exposition.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: String,
}

/// The samples of an OpenMetrics text exposition (our label values hold
/// no quotes, commas or braces).
fn parse(text: &str) -> Vec<Sample> {
    assert!(text.ends_with("# EOF\n"), "no # EOF:\n{text}");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("series and value");
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let inner = rest.strip_suffix('}').expect("closing brace");
                    let labels = inner
                        .split(',')
                        .map(|kv| {
                            let (k, v) = kv.split_once('=').expect("label=value");
                            (k.to_string(), v.trim_matches('"').to_string())
                        })
                        .collect();
                    (name, labels)
                }
                None => (series, BTreeMap::new()),
            };
            Sample {
                name: name.to_string(),
                labels,
                value: value.to_string(),
            }
        })
        .collect()
}

/// Scrapes `/metrics` and parses it, checking the status and type.
fn scrape(metrics: &str) -> Vec<Sample> {
    let (status, content_type, body) = get(&format!("http://{metrics}/metrics"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        content_type, "application/openmetrics-text; version=1.0.0; charset=utf-8",
        "what prometheus-client encodes"
    );
    parse(&body)
}

/// The value of `name` for `session`, if that series exists.
fn of_session<'a>(samples: &'a [Sample], name: &str, session: &str) -> Option<&'a str> {
    samples
        .iter()
        .find(|s| s.name == name && s.labels.get("session").map(String::as_str) == Some(session))
        .map(|s| s.value.as_str())
}

fn server_wide<'a>(samples: &'a [Sample], name: &str) -> &'a str {
    samples
        .iter()
        .find(|s| s.name == name && s.labels.is_empty())
        .map(|s| s.value.as_str())
        .unwrap_or_else(|| panic!("no {name}"))
}

/// The sessions that have series.
fn sessions(samples: &[Sample]) -> Vec<String> {
    let mut all: Vec<String> = samples
        .iter()
        .filter(|s| s.name == "netspeed_peer_packets_total")
        .map(|s| s.labels["session"].clone())
        .collect();
    all.sort();
    all
}

fn session_of(report: &Value) -> String {
    report["clients"][0]["session"]
        .as_str()
        .unwrap_or_else(|| panic!("no session in {report}"))
        .to_string()
}

/// Every per-peer series of `session` equals its `peer_done` figure.
fn assert_series_are_peer_done(samples: &[Sample], session: &str, done: &Value) {
    let series = |name: &str| {
        of_session(samples, name, session)
            .unwrap_or_else(|| panic!("no {name} for {session}"))
            .to_string()
    };
    let int = |name: &str| -> u64 {
        series(name)
            .parse()
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    assert_eq!(
        int("netspeed_peer_packets_total"),
        u(done, "packets"),
        "{done}"
    );
    assert_eq!(int("netspeed_peer_bytes_total"), u(done, "bytes"), "{done}");
    assert_eq!(int("netspeed_peer_lost_packets"), u(done, "lost"), "{done}");
    assert_eq!(int("netspeed_peer_duplicates_total"), u(done, "duplicates"));
    assert_eq!(int("netspeed_peer_reordered_total"), u(done, "reordered"));
    match done.get("socket_wide_kernel_drops") {
        Some(d) => assert_eq!(int("netspeed_peer_kernel_drops_total"), d.as_u64().unwrap()),
        None => assert!(of_session(samples, "netspeed_peer_kernel_drops_total", session).is_none()),
    }
    match done["cpu"]["seconds"].as_f64() {
        // Both sides print the shortest decimal that reads back as the same
        // f64: equal as numbers, exactly.
        Some(cpu) => assert_eq!(
            series("netspeed_peer_cpu_seconds_total")
                .parse::<f64>()
                .unwrap(),
            cpu,
            "{done}"
        ),
        None => assert!(of_session(samples, "netspeed_peer_cpu_seconds_total", session).is_none()),
    }
    assert_eq!(series("netspeed_peer_finished"), "1");
}

#[test]
fn counters_are_the_peer_done_figures_of_the_same_sessions() {
    let (server, metrics) = start(&["--recv-buffer-size", "4M"]);
    // One session straight to the server, one through a relay that loses
    // two datagrams, repeats one and delays another, so that loss,
    // duplicates and reordering are not all zero.
    let plain = client(&args_to(&server.addr, "-t 2M"));
    let relay = server.relay(&[
        (Pick::to_server(kind::DATA, 10), Action::Drop),
        (Pick::to_server(kind::DATA, 11), Action::Drop),
        (Pick::to_server(kind::DATA, 20), Action::RepeatAfter(0)),
        (
            Pick::to_server(kind::DATA, 30),
            Action::Delay(Duration::from_millis(50)),
        ),
    ]);
    let impaired = client(&args_to(
        &relay.addr().to_string(),
        "-b 1000 -n 2000 --rate 100Mbit",
    ));
    relay.finish();
    let (plain, impaired) = (session_of(&plain), session_of(&impaired));
    let done_plain = server.done_for(&plain);
    let done_impaired = server.done_for(&impaired);
    assert_eq!(u(&done_impaired, "lost"), 2, "{done_impaired}");
    assert_eq!(u(&done_impaired, "duplicates"), 1, "{done_impaired}");
    assert!(u(&done_impaired, "reordered") >= 1, "{done_impaired}");
    let samples = scrape(&metrics);
    assert_series_are_peer_done(&samples, &plain, &done_plain);
    assert_series_are_peer_done(&samples, &impaired, &done_impaired);
    // The relay's address is the peer.
    let peer = samples
        .iter()
        .find(|s| s.labels.get("session") == Some(&impaired))
        .map(|s| s.labels["peer"].clone());
    assert_eq!(peer.as_deref(), done_impaired["peer"].as_str());
    assert_eq!(server_wide(&samples, "netspeed_peers_finished_total"), "2");
    assert_eq!(server_wide(&samples, "netspeed_peers_active"), "0");
    let listening = server.events.borrow()[0].clone();
    assert_eq!(
        server_wide(&samples, "netspeed_receive_buffer_bytes"),
        listening["recv_buffer"]["granted"].to_string(),
        "{listening}"
    );
    let events = server.stop();
    let down = events.last().unwrap();
    // Every datagram the server counted, the repeated one included.
    let counted = u(&done_plain, "packets") + u(&done_impaired, "packets") + 1;
    assert_eq!(u(down, "packets"), counted, "{down}");
    assert_eq!(
        server_wide(&samples, "netspeed_received_packets_total"),
        counted.to_string()
    );
}

#[test]
fn an_active_peer_is_shown_while_it_sends_then_its_final_figures() {
    let (server, metrics) = start(&[]);
    let target = server.addr.clone();
    // About 3 s at a low rate, so that scrapes fall inside the session.
    let sender =
        std::thread::spawn(move || client(&args_to(&target, "-b 1000 -n 3000 --rate 8Mbit")));
    let mut live = None;
    poll_until(WAIT, "the session's live series", || {
        let samples = scrape(&metrics);
        let active = samples.iter().find(|s| {
            s.name == "netspeed_peer_finished" && s.value == "0" && !s.labels["session"].is_empty()
        });
        live = active.map(|s| (s.labels["session"].clone(), samples.clone()));
        live.is_some()
    });
    let (session, samples) = live.unwrap();
    let packets: u64 = of_session(&samples, "netspeed_peer_packets_total", &session)
        .unwrap()
        .parse()
        .unwrap();
    assert!(packets > 0 && packets < 3000, "{packets}");
    assert_eq!(server_wide(&samples, "netspeed_peers_active"), "1");
    // Every counter only grows, scrape after scrape, while the peer sends
    // and after it finished: a decrease would read as a reset to rate().
    let mut seen: BTreeMap<String, f64> = BTreeMap::new();
    let mut never_down = |samples: &[Sample]| {
        for s in samples.iter().filter(|s| s.name.ends_with("_total")) {
            let key = format!("{}{:?}", s.name, s.labels);
            let value: f64 = s.value.parse().expect("a number");
            if let Some(&before) = seen.get(&key) {
                assert!(value >= before, "{key} went down: {before} -> {value}");
            }
            seen.insert(key, value);
        }
    };
    never_down(&samples);
    let mut scrapes = 1;
    while !sender.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
        never_down(&scrape(&metrics));
        scrapes += 1;
    }
    let report = sender.join().expect("the client thread");
    assert_eq!(session_of(&report), session);
    let done = server.done_for(&session);
    let last = scrape(&metrics);
    never_down(&last);
    assert!(scrapes >= 3, "only {scrapes} scrapes while the peer sent");
    assert_series_are_peer_done(&last, &session, &done);
    server.stop();
}

#[test]
fn finished_peers_age_out_and_at_most_max_peers_are_kept() {
    // Long enough that the second session is still kept when the third
    // has run, on a slow machine too.
    let (server, metrics) = start(&["--max-peers", "2", "--metrics-retain", "5s"]);
    let mut all = Vec::new();
    for _ in 0..3 {
        let session = session_of(&client(&args_to(&server.addr, "-t 100K")));
        server.done_for(&session);
        all.push(session);
    }
    // Three finished, two kept: the oldest went first.
    let samples = scrape(&metrics);
    let mut newest = all[1..].to_vec();
    newest.sort();
    assert_eq!(sessions(&samples), newest, "sessions seen: {all:?}");
    assert_eq!(server_wide(&samples, "netspeed_peers_finished_total"), "3");
    assert_eq!(server_wide(&samples, "netspeed_max_peers"), "2");
    // After --metrics-retain, none; the server-wide counters stay.
    poll_until(Duration::from_secs(30), "finished peers to age out", || {
        sessions(&scrape(&metrics)).is_empty()
    });
    let samples = scrape(&metrics);
    assert_eq!(server_wide(&samples, "netspeed_peers_finished_total"), "3");
    assert!(!samples.iter().any(|s| s.name.starts_with("netspeed_peer_")));
    server.stop();
}

#[test]
fn other_paths_are_not_found_and_other_methods_not_allowed() {
    let (server, metrics) = start(&[]);
    for path in ["/", "/metric", "/metrics/x", "/favicon.ico"] {
        let (status, _, body) = get(&format!("http://{metrics}{path}"));
        assert_eq!(status, 404, "{path}: {body}");
    }
    let response = agent()
        .post(&format!("http://{metrics}/metrics"))
        .send_empty()
        .expect("POST");
    assert_eq!(response.status().as_u16(), 405);
    assert_eq!(response.headers().get("allow").unwrap(), "GET, HEAD");
    server.stop();
}

#[test]
fn the_text_listening_line_names_the_endpoint() {
    let mut child = ChildGuard::spawn(
        Command::new(SERVER)
            .args(["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"])
            .stdout(Stdio::piped()),
        "udp_server",
    );
    let lines = child.stdout_lines();
    let first = lines.next_line(WAIT).expect("a listening line");
    let url = first
        .split("metrics at ")
        .nth(1)
        .unwrap_or_else(|| panic!("{first}"));
    assert!(url.starts_with("http://127.0.0.1:"), "{first}");
    let (status, _, _) = get(url);
    assert_eq!(status, 200);
}

#[test]
fn bad_metrics_settings_are_one_line_errors() {
    for (args, code, says) in [
        (
            &["--metrics", "localhost"][..],
            2,
            "invalid --metrics address",
        ),
        (
            &["--metrics", "127.0.0.1"][..],
            2,
            "invalid --metrics address",
        ),
        (
            &["--metrics", "127.0.0.1:0", "--metrics-retain", "500ms"][..],
            2,
            "--metrics-retain",
        ),
        (
            &["--metrics", "127.0.0.1:0", "--metrics-retain", "soon"][..],
            2,
            "--metrics-retain",
        ),
        // Retention without an endpoint is a mistake, not a silent no-op.
        (
            &["--metrics-retain", "1m"][..],
            2,
            "--metrics-retain needs --metrics",
        ),
    ] {
        let out = run_bounded(
            Command::new(SERVER)
                .args(["--listen", "127.0.0.1:0"])
                .args(args),
            WAIT,
        );
        one_line_error(&out, code, says, &format!("{args:?}"));
    }
    // A port already taken: a runtime error at start, before any output.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = run_bounded(
        Command::new(SERVER).args(["--listen", "127.0.0.1:0", "--metrics", &addr]),
        WAIT,
    );
    one_line_error(
        &out,
        1,
        &format!("cannot serve --metrics on {addr}"),
        "a port already taken",
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn the_toml_keys_are_the_flags() {
    let dir = TempDir::new("metrics-toml");
    let file = dir.file(
        "server.toml",
        "metrics = \"127.0.0.1:9477\"\nmetrics_retain = \"90s\"\n",
    );
    let argv = |extra: &[&str]| {
        let mut v: Vec<std::ffi::OsString> =
            vec!["udp_server".into(), "--config".into(), file.clone().into()];
        v.extend(extra.iter().map(Into::into));
        v
    };
    let args: ServerArgs = parse_args(argv(&[])).unwrap();
    let cfg = ServerConfig::from_args(args).unwrap();
    assert_eq!(cfg.metrics, Some("127.0.0.1:9477".parse().unwrap()));
    assert_eq!(cfg.metrics_retain, Duration::from_secs(90));
    let args: ServerArgs = parse_args(argv(&["--metrics", "[::1]:0"])).unwrap();
    let cfg = ServerConfig::from_args(args).unwrap();
    assert_eq!(
        cfg.metrics,
        Some("[::1]:0".parse().unwrap()),
        "the flag wins"
    );
    let args: ServerArgs = parse_args(["udp_server"].map(Into::into)).unwrap();
    let cfg = ServerConfig::from_args(args).unwrap();
    assert_eq!(cfg.metrics, None, "off by default");
    assert_eq!(cfg.metrics_retain, Duration::from_secs(300));
}

// ------------------------------------------------- slow connections

/// A connection from `local` (any port) to `to`, within a second: loopback
/// is all of 127/8 on Linux, so a test can be two sources.
fn connect_from(local: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    let local: IpAddr = local.parse().expect("an address");
    socket.bind(&SocketAddr::new(local, 0).into())?;
    socket.connect_timeout(&to.into(), Duration::from_secs(1))?;
    Ok(socket.into())
}

/// `GET /metrics` on a fresh connection from 127.0.0.2, answered in
/// full within `within`: the body, or what went wrong.
fn scrape_from_elsewhere(to: SocketAddr, within: Duration) -> Result<String, String> {
    let start = Instant::now();
    let mut stream = connect_from("127.0.0.2", to).map_err(|e| format!("connect: {e}"))?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("send: {e}"))?;
    let mut response = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        let left = within.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(format!("no whole answer within {within:?}"));
        }
        stream.set_read_timeout(Some(left)).expect("a timeout");
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => response.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("read after {:?}: {e}", start.elapsed())),
        }
    }
    let text = String::from_utf8_lossy(&response).into_owned();
    if !text.starts_with("HTTP/1.1 200 ") || !text.ends_with("# EOF\n") {
        return Err(format!("not a 200 with the exposition: {text:?}"));
    }
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok(body.to_string())
}

/// The value of `name{reason=…}` in `samples`.
fn refused(samples: &[Sample], reason: &str) -> u64 {
    samples
        .iter()
        .find(|s| {
            s.name == "netspeed_metrics_connections_refused_total"
                && s.labels.get("reason").map(String::as_str) == Some(reason)
        })
        .unwrap_or_else(|| panic!("no refusals for {reason}"))
        .value
        .parse()
        .expect("a count")
}

/// What a slow client sends and then holds: a header never finished.
const PARTIAL: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: metrics\r\n";

/// Forty connections from 127.0.0.1 that send [`PARTIAL`] and hold it,
/// each reopened as soon as the server closes it, for `time` (and at most
/// `max_opens` tries in all). `opened` counts the tries.
fn slow_attack(to: SocketAddr, time: Duration, max_opens: usize, opened: &AtomicUsize) {
    let open = || {
        let mut stream = connect_from("127.0.0.1", to).ok()?;
        stream.write_all(PARTIAL).ok()?;
        stream.set_nonblocking(true).ok()?;
        Some(stream)
    };
    let mut held: Vec<Option<TcpStream>> = (0..40).map(|_| None).collect();
    let start = Instant::now();
    poll_every(Duration::from_millis(10), time, || {
        for slot in held.iter_mut() {
            // Closed (EOF or reset) or never opened: open again.
            let closed = slot.as_mut().is_none_or(|s| match s.read(&mut [0u8; 512]) {
                Ok(_) => true,
                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
            });
            if closed && opened.load(Ordering::Relaxed) < max_opens {
                *slot = open();
                opened.fetch_add(1, Ordering::Relaxed);
            }
        }
        start.elapsed() >= time
    });
}

#[test]
fn slow_connections_from_one_source_leave_scrapes_from_another_answered() {
    let (server, metrics) = start(&[]);
    let to: SocketAddr = metrics.parse().expect("the endpoint's address");
    // One slow connection first, which the endpoint admits: it must be
    // closed by the header deadline (2 s), neither at once nor much later.
    let mut probe = connect_from("127.0.0.1", to).expect("the probe connects");
    probe.write_all(PARTIAL).expect("the probe sends");
    let probed = Instant::now();
    let probe = std::thread::spawn(move || {
        probe
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let end = match probe.read(&mut [0u8; 512]) {
            Ok(0) => "closed".to_string(),
            Ok(n) => format!("{n} bytes"),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => "closed".into(),
            Err(e) => e.to_string(),
        };
        (end, probed.elapsed())
    });
    let opened = Arc::new(AtomicUsize::new(0));
    let attacker = {
        let opened = Arc::clone(&opened);
        std::thread::spawn(move || slow_attack(to, Duration::from_secs(4), 20_000, &opened))
    };
    wait_until(WAIT, "forty slow connections", || {
        opened.load(Ordering::Relaxed) >= 40
    });
    // While the attack runs, every fresh scrape from another source is
    // answered within a second.
    let mut scrapes = 0;
    poll_every(Duration::from_millis(100), WAIT, || {
        let answer = scrape_from_elsewhere(to, Duration::from_secs(1));
        scrapes += 1;
        if let Err(e) = answer {
            panic!("scrape {scrapes} during the attack: {e}");
        }
        attacker.is_finished()
    });
    attacker.join().expect("the attacker");
    assert!(scrapes >= 10, "only {scrapes} scrapes during the attack");
    let (end, after) = probe.join().expect("the probe");
    assert_eq!(end, "closed", "the probe's connection after {after:?}");
    assert!(
        after >= Duration::from_secs(1) && after <= Duration::from_millis(3500),
        "the probe's connection was closed after {after:?}, not at the 2 s header deadline"
    );
    // The attacker is gone: 127.0.0.1 scrapes again, and the endpoint
    // counted what it refused and closed.
    let samples = scrape(&metrics);
    assert!(refused(&samples, "source_share") > 0, "{samples:?}");
    assert!(refused(&samples, "header_deadline") > 0, "{samples:?}");
    assert_eq!(refused(&samples, "full"), 0, "one source cannot fill it");
    eprintln!(
        "{} slow connections opened, {scrapes} scrapes answered",
        opened.load(Ordering::Relaxed)
    );
    server.stop();
}

// ------------------------------------------------------ a real Prometheus

/// The Prometheus server binary (Debian's `prometheus` package), or a
/// failure that says how to get it: this test is never skipped.
fn prometheus_binary() -> String {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("prometheus"))
            .find(|p| p.is_file())
    });
    match found {
        Some(p) => p.to_string_lossy().into_owned(),
        None => panic!(
            "the prometheus binary is not installed: this test scrapes udp_server \
             through a real Prometheus. Install it (as .ci/run does): \
             apt-get install -y --no-install-recommends prometheus"
        ),
    }
}

fn free_tcp_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A query's single result value, if there is one.
fn query(prometheus: &str, promql: &str) -> Option<String> {
    let mut response = agent()
        .get(&format!("http://{prometheus}/api/v1/query"))
        .query("query", promql)
        .call()
        .ok()?;
    let body: Value = serde_json::from_str(&response.body_mut().read_to_string().ok()?).ok()?;
    let result = body["data"]["result"].as_array()?;
    match result.as_slice() {
        [one] => one["value"][1].as_str().map(str::to_string),
        _ => None,
    }
}

#[test]
fn a_real_prometheus_scrapes_the_counters() {
    let binary = prometheus_binary();
    let (server, metrics) = start(&[]);
    let dir = TempDir::new("metrics-prometheus");
    // The shipped scrape config, pointed at this server and scraping every
    // second, so the test reads what an operator would deploy.
    let shipped = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/prometheus.yml"),
    )
    .expect("configs/prometheus.yml");
    assert!(shipped.contains("127.0.0.1:9477"), "{shipped}");
    let config = shipped
        .replace("127.0.0.1:9477", &metrics)
        .replace("scrape_interval: 15s", "scrape_interval: 1s")
        .replace("scrape_timeout: 10s", "scrape_timeout: 1s");
    let config_file = dir.file("prometheus.yml", config);
    let listen = format!("127.0.0.1:{}", free_tcp_port());
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let _prometheus = ChildGuard::spawn(
        Command::new(&binary)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .stdout(Stdio::null())
            .stderr(log),
        "prometheus",
    );
    let transcript =
        || std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
    let ready = poll_every(Duration::from_millis(200), Duration::from_secs(60), || {
        agent()
            .get(&format!("http://{listen}/-/ready"))
            .call()
            .is_ok_and(|r| r.status() == 200)
    });
    assert!(ready, "prometheus not ready; it said:\n{}", transcript());
    let report = client(&args_to(&server.addr, "-t 2M"));
    let session = session_of(&report);
    let done = server.done_for(&session);
    let want = u(&done, "bytes").to_string();
    let promql = format!("netspeed_peer_bytes_total{{session=\"{session}\"}}");
    let mut seen = None;
    poll_every(Duration::from_millis(250), Duration::from_secs(60), || {
        seen = query(&listen, &promql);
        seen.as_deref() == Some(want.as_str())
    });
    assert_eq!(
        seen.as_deref(),
        Some(want.as_str()),
        "{promql} through Prometheus; it said:\n{}",
        transcript()
    );
    let up = query(&listen, "up{job=\"netspeed\"}");
    assert_eq!(up.as_deref(), Some("1"), "the target is up");
    let packets = query(
        &listen,
        &format!("netspeed_peer_packets_total{{session=\"{session}\"}}"),
    );
    assert_eq!(packets, Some(u(&done, "packets").to_string()));
    server.stop();
}

#[test]
fn reverse_streams_expose_the_bytes_sent_to_each_peer() {
    let (server, metrics) = start(&[]);
    // A paced stream long enough to be scraped while it runs, then done.
    let mut cmd = Command::new(common::udp::CLIENT);
    cmd.args(args_to(
        &server.addr,
        "-R -b 1000 -n 4000 --rate 20Mbit --json",
    ))
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    let mut client = ChildGuard::spawn(&mut cmd, "udp_client -R");
    let lines = client.stdout_lines();
    poll_until(WAIT, "a reverse stream's sent bytes while it runs", || {
        scrape(&metrics).iter().any(|s| {
            s.name == "netspeed_peer_sent_bytes_total"
                && s.value.parse::<u64>().is_ok_and(|v| v > 0 && v < 4_000_000)
        })
    });
    let status = client.wait_timeout(WAIT).expect("udp_client -R ends");
    assert!(status.success(), "udp_client -R failed: {status}");
    let report: Value = serde_json::from_str(&lines.drain(WAIT).join("\n")).expect("a JSON report");
    let session = report["downloads"][0]["session"].as_str().expect("session");
    let done = server.find("stream_done", |v| v["event"] == "stream_done");
    assert_eq!(u(&done, "sent_bytes"), 4_000_000);
    let samples = scrape(&metrics);
    assert_eq!(
        of_session(&samples, "netspeed_peer_sent_bytes_total", session),
        Some("4000000"),
        "the finished stream's sent bytes are its stream_done's"
    );
    assert_eq!(
        of_session(&samples, "netspeed_peer_bytes_total", session),
        Some(u(&done["received"], "bytes").to_string().as_str()),
        "and the bytes its client said it received"
    );
    server.stop();
}
