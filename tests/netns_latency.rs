//! Latency under load (delay-under-load reporting), checked against two
//! witnesses netspeed does not control:
//!
//! - the arithmetic of a tbf qdisc on the router: a queue of
//!   [`LIMIT_BYTES`] drained at [`RATE_BPS`] holds a datagram at its tail
//!   for `LIMIT_BYTES * 8 / RATE_BPS` seconds (100 ms), and its `backlog`
//!   and `drops` counters show whether the load kept it full;
//! - `ping` from the client host to the server through the same queue,
//!   idle before the load (~0.1 ms) and during it (~100 ms when the queue
//!   is full).
//!
//! Three namespaces in a row, client — router — server (no NAT). The tbf
//! sits on the router's egress toward the receiver of the load: toward the
//! server for an upload, toward the client for `-R` (ping's echo replies
//! then go through it). The load is a little above the link (115 Mbit/s
//! against 100), so the queue fills and stays full; a paced load at 40
//! Mbit/s keeps it short.
//!
//! The runs go one at a time ([`one_at_a_time`]): each measures delays on
//! this machine, and another run's load would add to them.

mod common;

use common::impair::{require_tc, require_tool, root_qdisc, run_capture, tbf_alone, tc_drops};
use common::netns::{require_root_and_ip, routed, Netns, Routed};
use common::stamp_suite::stamp_suite;
use common::udp::{args_to, client_json, f, stream, u, Server, CLIENT, WAIT};
use common::ChildGuard;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// The tbf on the router: its rate (bit/s), its bucket (bytes) and its
/// queue (bytes). `limit` is 100 ms of `rate`.
const RATE_BPS: u64 = 100_000_000;
const BURST_BYTES: u64 = 32 * 1024;
const LIMIT_BYTES: u64 = 1_250_000;

/// How long a datagram at the tail of a full tbf queue waits, in ms.
fn full_queue_ms() -> f64 {
    LIMIT_BYTES as f64 * 8.0 / RATE_BPS as f64 * 1000.0
}

/// The tolerance on every comparison with a witness.
const WITHIN: f64 = 0.15;

/// What is "short" for a queue and a round trip, in ms.
const SHORT_MS: f64 = 2.0;
/// What is "idle" for a round trip between namespaces, in ms.
const IDLE_MS: f64 = 1.0;

/// The loads: above the link (fills the queue) and under it (paced).
const OVERLOAD: &str = "--rate 115Mbit --duration 6s -b 1400";
const UNDERLOAD: &str = "--rate 40Mbit --duration 6s -b 1400";

/// How the load's sender runs, the client's for an upload and the
/// server's for `-R`: SCHED_FIFO, so that a CPU burner or a build beside
/// the test cannot deschedule it. A CFS sender beside two burners fell
/// behind its pacing (108 of 115 Mbit/s sent) and the full queue drained
/// to 24 % while ping ran; a `--find-limit --max-delay` search stopped
/// at 69 Mbit/s on trials the sender could not hold.
const FIFO: [&str; 4] = ["--scheduler", "fifo", "--priority", "10"];

/// ping's settings: 25 echo requests of 56 bytes, every 100 ms.
const PINGS: u32 = 25;
const PING_ARGS: &str = "-n -i 0.1 -s 56 -W 2";
/// When ping starts after the load does.
const PING_AFTER: Duration = Duration::from_secs(2);

/// The sentences of the verdict (`limited_by.text`).
const QUEUE_FILLED: &str = "a queue on the path filled";
const QUEUE_SHORT: &str = "the queue stayed short";

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Holds [`ONE_AT_A_TIME`] for the test's length (a failed test does not
/// poison it for the others).
fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every tool the tests need, or a loud failure.
fn require_tools() {
    require_root_and_ip();
    require_tc();
    require_tool("ping", "-V", "iputils-ping");
}

/// Which way the load goes, and so where the tbf sits.
#[derive(Clone, Copy, PartialEq)]
enum Way {
    Upload,
    Reverse,
}

impl Way {
    fn direction(self) -> &'static str {
        match self {
            Way::Upload => "client_to_server",
            Way::Reverse => "server_to_client",
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Way::Upload => "",
            Way::Reverse => "-R",
        }
    }

    /// The router's interface toward the receiver of the load.
    fn queue_dev(self, net: &Routed) -> &str {
        match self {
            Way::Upload => &net.server_link.0,
            Way::Reverse => &net.client_link.1,
        }
    }
}

/// The round trips of one ping run, in ms, in the order they came back.
struct Ping {
    rtts: Vec<f64>,
    output: String,
}

impl Ping {
    fn median(&self) -> f64 {
        assert!(!self.rtts.is_empty(), "no ping replies:\n{}", self.output);
        let mut v = self.rtts.clone();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }

    fn figure(&self) -> String {
        let max = self.rtts.iter().copied().fold(f64::NAN, f64::max);
        let min = self.rtts.iter().copied().fold(f64::NAN, f64::min);
        format!(
            "{}/{PINGS} replies, median {:.3} ms (min {min:.3}, max {max:.3})",
            self.rtts.len(),
            self.median()
        )
    }
}

/// `ping` from `ns` to `addr`, [`PINGS`] echo requests.
fn ping_cmd(ns: &Netns, addr: &str) -> Command {
    let mut cmd = ns.cmd("ping");
    cmd.args(common::args(PING_ARGS))
        .args(["-c", &PINGS.to_string(), addr]);
    cmd
}

/// Runs `cmd` (a [`ping_cmd`]), killed after 20 s: every round trip it
/// printed, whatever its exit code (a reply lost in a full queue makes it
/// exit 1).
fn run_ping(mut cmd: Command) -> Ping {
    let (code, output, err) = run_capture(&mut cmd, Duration::from_secs(20));
    assert!(
        matches!(code, Some(0 | 1)),
        "{cmd:?} failed ({code:?}): {err}\n{output}"
    );
    let rtts = output
        .lines()
        .filter_map(|l| l.split("time=").nth(1))
        .map(|t| {
            let ms = t.trim_end_matches("ms").trim();
            ms.parse()
                .unwrap_or_else(|e| panic!("bad ping time {t:?} ({e}):\n{output}"))
        })
        .collect();
    Ping { rtts, output }
}

/// The tbf's `backlog` (bytes) on `dev` of `ns`.
fn backlog(ns: &Netns, dev: &str) -> u64 {
    let root = root_qdisc(ns, dev);
    assert_eq!(root["kind"], "tbf", "{root}");
    root["backlog"]
        .as_u64()
        .unwrap_or_else(|| panic!("no backlog on {dev}: {root}"))
}

/// The three hosts, a udp_server on the server host, and the tbf on the
/// router's interface toward the receiver of a load going one [`Way`].
/// The server is the first field, so it is stopped before the namespaces
/// it runs in are deleted.
struct Shaped {
    server: Server,
    /// The server's address as the client host reaches it.
    target: String,
    /// The router's interface that holds the tbf.
    dev: String,
    net: Routed,
}

/// Builds the topology (`net_id` picks the subnets 10.`net_id`.1/2.0/24),
/// starts the server and puts the tbf on the router toward the load's
/// receiver.
fn shaped(tag: &str, net_id: u8, way: Way) -> Shaped {
    shaped_with(tag, net_id, way, &[])
}

/// [`shaped`], the server started with `extra` arguments too.
fn shaped_with(tag: &str, net_id: u8, way: Way, extra: &[&str]) -> Shaped {
    require_tools();
    let net = routed(tag, net_id, false);
    let mut args = vec!["--recv-buffer-size", "4M"];
    args.extend_from_slice(&FIFO);
    args.extend_from_slice(extra);
    let server = Server::start_in(&net.server, "0.0.0.0:0", &args);
    let dev = way.queue_dev(&net).to_string();
    tbf_alone(
        &net.router,
        &dev,
        &format!("{RATE_BPS}bit"),
        &BURST_BYTES.to_string(),
        &LIMIT_BYTES.to_string(),
    );
    let target = format!("{}:{}", net.server_ip, server.port());
    Shaped {
        server,
        target,
        dev,
        net,
    }
}

/// stamp-suite's reflector in `ns`, on `ip`:[`STAMP_PORT`], running
/// until dropped.
/// At SCHED_FIFO (`chrt -f 10`, util-linux) as our own ends: beside two
/// CPU burners a CFS reflector answered the idle probes 4.1 ms late.
fn stamp_suite_reflector(ns: &Netns, ip: &str) -> ChildGuard {
    require_tool("chrt", "--version", "util-linux");
    let mut cmd = ns.cmd("chrt");
    cmd.args(["-f", "10"]).arg(stamp_suite());
    cmd.env("NO_COLOR", "1")
        .args(["--is-reflector", "--local-addr", ip, "--local-port"])
        .arg(STAMP_PORT.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut guard = ChildGuard::spawn(&mut cmd, "stamp-suite reflector");
    let stderr = guard.stderr_lines();
    assert!(
        stderr
            .wait_for(WAIT, |l| l.contains("STAMP Reflector listening on"))
            .is_some(),
        "stamp-suite's reflector did not start in {}: {}",
        ns.name(),
        stderr.transcript()
    );
    guard
}

/// Everything one run measured.
struct Measured {
    report: Value,
    idle: Ping,
    loaded: Ping,
    /// The tbf's backlog (bytes), sampled every 50 ms while ping ran.
    backlog_min: u64,
    backlog_max: u64,
    /// Datagrams the tbf dropped during the run.
    drops: u64,
}

/// Builds the [`shaped`] topology, pings idle, then runs `udp_client
/// SERVER [-R] load` and pings through the queue [`PING_AFTER`] it
/// started, sampling the tbf's backlog meanwhile; prints the figures
/// ([`show`]) under `tag`.
fn measure(tag: &str, net_id: u8, way: Way, load: &str) -> Measured {
    measure_probed(tag, net_id, way, load, ProbedBy::Server)
}

/// Who answers the round-trip probes, and so where ping goes too.
#[derive(Clone, Copy)]
enum ProbedBy {
    /// udp_server (the default); ping goes to the server host.
    Server,
    /// `udp_server --stamp` on the server host, port [`STAMP_PORT`].
    OurReflector,
    /// stamp-suite's reflector on the router (the first hop), port
    /// [`STAMP_PORT`]; ping goes to the router.
    StampSuiteOnTheRouter,
}

/// STAMP's standard port, free in a namespace of our own.
const STAMP_PORT: u16 = 862;

/// [`measure`], the probes (and ping) answered by `probed`.
fn measure_probed(tag: &str, net_id: u8, way: Way, load: &str, probed: ProbedBy) -> Measured {
    let stamp_listen = format!("0.0.0.0:{STAMP_PORT}");
    let server_extra: &[&str] = match probed {
        ProbedBy::OurReflector => &["--stamp", &stamp_listen],
        _ => &[],
    };
    let Shaped {
        server,
        target,
        dev,
        net,
    } = shaped_with(tag, net_id, way, server_extra);
    // The router's address on the client's link: 10.N.1.1.
    let router_ip = format!("10.{net_id}.1.1");
    let (ping_to, load) = match probed {
        ProbedBy::Server => (net.server_ip.clone(), load.to_string()),
        ProbedBy::OurReflector => (
            net.server_ip.clone(),
            format!("{load} --stamp-reflector {}:{STAMP_PORT}", net.server_ip),
        ),
        ProbedBy::StampSuiteOnTheRouter => (
            router_ip.clone(),
            format!("{load} --stamp-reflector {router_ip}:{STAMP_PORT}"),
        ),
    };
    let _their_reflector = matches!(probed, ProbedBy::StampSuiteOnTheRouter)
        .then(|| stamp_suite_reflector(&net.router, &router_ip));
    let load = load.as_str();
    let idle = run_ping(ping_cmd(&net.client, &ping_to));
    let drops_before = tc_drops(&net.router, &dev);

    let rest = format!("{} {load} {}", way.flag(), FIFO.join(" "));
    let args: Vec<String> = args_to(&target, &rest)
        .into_iter()
        .map(String::from)
        .collect();
    let shown = format!("udp_client {}", args.join(" "));
    let cmd = net.client.cmd(CLIENT);
    let started = Instant::now();
    let client = thread::spawn(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let report = client_json(cmd, &args, Duration::from_secs(40));
        (report, started.elapsed())
    });
    thread::sleep(PING_AFTER);

    let pinger = ping_cmd(&net.client, &ping_to);
    let pinging = thread::spawn(move || run_ping(pinger));
    let (mut backlog_min, mut backlog_max) = (u64::MAX, 0);
    while !pinging.is_finished() {
        let b = backlog(&net.router, &dev);
        backlog_min = backlog_min.min(b);
        backlog_max = backlog_max.max(b);
        thread::sleep(Duration::from_millis(50));
    }
    let loaded = pinging
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p));
    let ping_done = started.elapsed();

    let (report, client_ran) = client
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p));
    let drops = tc_drops(&net.router, &dev) - drops_before;
    eprintln!("{shown}: ran {client_ran:.2?}, ping done {ping_done:.2?} after its start");
    // The load's last second is still ahead when ping is done (the client
    // runs the load's 6 s, plus the idle probes before it).
    assert!(
        ping_done + Duration::from_secs(1) < client_ran,
        "ping must finish while the load runs: ping done after {ping_done:?}, \
         the client ran {client_ran:?}: {report}"
    );
    server.stop();
    let m = Measured {
        report,
        idle,
        loaded,
        backlog_min,
        backlog_max,
        drops,
    };
    show(tag, &m, way.direction());
    m
}

/// The verdict's sentence for the `direction` stream.
fn verdict(report: &Value, direction: &str) -> String {
    stream(report, direction)["limited_by"]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no limited_by.text in the {direction} stream: {report}"))
        .to_string()
}

/// The stream's `latency` object (delay-under-load reporting), checked
/// for the shape the interface promises.
fn latency<'a>(report: &'a Value, direction: &str) -> &'a Value {
    let lat = &stream(report, direction)["latency"];
    assert!(
        lat.is_object(),
        "no `latency` object in the {direction} stream (delay-under-load reporting): {report}"
    );
    assert!(u(lat, "delay_samples") > 0, "no delay samples: {lat}");
    let sent = u(lat, "probes_sent");
    assert!(sent > 0, "no probes sent: {lat}");
    assert!(u(lat, "probes_lost") <= sent, "{lat}");
    assert!(f(lat, "drift_bound_ms") >= 0.0, "{lat}");
    for key in ["loaded_rtt_ms", "queue_delay_ms"] {
        let p = &lat[key];
        assert!(p.is_object(), "{key} is {p}: {lat}");
        let q = ["p50", "p90", "p99", "max"].map(|k| f(p, k));
        assert!(
            q.windows(2).all(|w| w[0] <= w[1]),
            "{key}: p50 <= p90 <= p99 <= max: {lat}"
        );
    }
    lat
}

/// `lat[key][pct]` in ms.
fn ms(lat: &Value, key: &str, pct: &str) -> f64 {
    f(&lat[key], pct)
}

/// The `direction` stream's verdict says `sentence`.
fn verdict_says(report: &Value, direction: &str, sentence: &str) {
    let text = verdict(report, direction);
    assert!(
        text.contains(sentence),
        "the verdict should say {sentence:?}: {text}"
    );
}

/// Whether `got` is within [`WITHIN`] of `want`.
fn near(got: f64, want: f64) -> bool {
    (got - want).abs() <= WITHIN * want
}

/// Prints what the witnesses and netspeed said, so a failure is readable.
fn show(what: &str, m: &Measured, direction: &str) {
    let s = stream(&m.report, direction);
    eprintln!(
        "FIGURE {what}: tbf rate {RATE_BPS} bit/s, burst {BURST_BYTES} B, limit {LIMIT_BYTES} B \
         = {:.1} ms; backlog during ping {}..{} B, drops {}",
        full_queue_ms(),
        m.backlog_min,
        m.backlog_max,
        m.drops
    );
    eprintln!("FIGURE {what}: ping idle   {}", m.idle.figure());
    eprintln!("FIGURE {what}: ping loaded {}", m.loaded.figure());
    eprintln!(
        "FIGURE {what}: netspeed sent {} received {} lost {}; latency {}",
        s["sender"]["packets"],
        s["receiver"]["packets"],
        s["receiver"]["lost_packets"],
        s["latency"]
    );
    eprintln!("FIGURE {what}: verdict {}", s["limited_by"]);
}

/// The witnesses say the path was idle before the load.
fn idle_witness(m: &Measured) {
    quick_pings(&m.idle, IDLE_MS, "on an idle path");
}

/// Ping lost at most 2 of [`PINGS`] and its median is under `under_ms`.
fn quick_pings(p: &Ping, under_ms: f64, when: &str) {
    assert!(
        p.rtts.len() + 2 >= PINGS as usize,
        "ping lost more than 2 of {PINGS} {when}:\n{}",
        p.output
    );
    assert!(
        p.median() < under_ms,
        "ping {when}: {:.3} ms, not under {under_ms} ms:\n{}",
        p.median(),
        p.output
    );
}

/// The tbf's backlog stayed at 90 % of its limit or more while ping ran:
/// the condition every filled-queue comparison needs. When it did not,
/// the failure says whether the load's sender fell behind [`OVERLOAD`]'s
/// rate (its own count of datagrams sent: a sender this machine's load
/// descheduled, even at SCHED_FIFO) or held it (then the queue drained
/// for another reason, which is worth a look).
fn queue_kept_full(m: &Measured, direction: &str) {
    const ASKED_MBPS: f64 = 115.0;
    let sent = u(&stream(&m.report, direction)["sender"], "packets");
    let sent_mbps = sent as f64 * 1400.0 * 8.0 / 6.0 / 1e6;
    let why = if sent_mbps < ASKED_MBPS * 0.97 {
        "MACHINE TOO BUSY: the load's sender fell behind its pacing, "
    } else {
        "the load's sender held its pacing, "
    };
    assert!(
        m.backlog_min * 10 >= LIMIT_BYTES * 9,
        "the load did not keep the tbf queue full while ping ran: backlog {}..{} B of \
         {LIMIT_BYTES}; {why}{sent_mbps:.1} of {ASKED_MBPS} Mbit/s sent ({sent} datagrams in 6 s)",
        m.backlog_min,
        m.backlog_max
    );
}

/// Test 1 and 2: the load above the link fills the 100 ms queue, ping
/// and netspeed both read it.
fn a_filled_queue(tag: &str, net_id: u8, way: Way) {
    let _one = one_at_a_time();
    let direction = way.direction();
    let m = measure(tag, net_id, way, OVERLOAD);
    let full = full_queue_ms();

    // The witnesses (independent of the feature).
    idle_witness(&m);
    queue_kept_full(&m, direction);
    assert!(m.drops > 0, "a load above the link must overflow the tbf");
    assert!(
        m.loaded.rtts.len() >= 5,
        "fewer than 5 pings came back through the full queue:\n{}",
        m.loaded.output
    );
    assert!(
        near(m.loaded.median(), full),
        "ping under load {:.3} ms, expected {full:.1} ms ± {}%:\n{}",
        m.loaded.median(),
        WITHIN * 100.0,
        m.loaded.output
    );

    // netspeed's figures (delay-under-load reporting).
    let lat = latency(&m.report, direction);
    let queue = ms(lat, "queue_delay_ms", "p50");
    assert!(
        near(queue, full),
        "queue delay p50 {queue} ms, expected {full:.1} ms (the tbf's limit at its rate) \
         ± {}%: {lat}",
        WITHIN * 100.0
    );
    let rtt = ms(lat, "loaded_rtt_ms", "p50");
    assert!(
        near(rtt, m.loaded.median()),
        "loaded RTT p50 {rtt} ms, ping's median under load {:.3} ms ± {}%: {lat}",
        m.loaded.median(),
        WITHIN * 100.0
    );
    let idle = f(lat, "idle_rtt_ms");
    assert!(idle < IDLE_MS, "idle RTT {idle} ms: {lat}");
    verdict_says(&m.report, direction, QUEUE_FILLED);
}

#[test]
fn upload_queue_delay_matches_the_tbf_queue_and_ping() {
    a_filled_queue("latup", 95, Way::Upload);
}

#[test]
fn reverse_queue_delay_matches_the_tbf_queue_and_ping() {
    a_filled_queue("latrv", 96, Way::Reverse);
}

/// Issue 40: the probes as STAMP test packets, under a load that fills
/// the queue, read the same round trip as ping through that queue (within
/// 10 %), whoever reflects them: `udp_server --stamp` on the far host for
/// an upload, stamp-suite's reflector on the first-hop router for `-R`
/// (its answers, and ping's replies, queue in the tbf toward the client).
fn stamp_probes_through_a_filled_queue(tag: &str, net_id: u8, way: Way, probed: ProbedBy) {
    let _one = one_at_a_time();
    let direction = way.direction();
    let m = measure_probed(tag, net_id, way, OVERLOAD, probed);
    idle_witness(&m);
    queue_kept_full(&m, direction);
    assert!(
        m.loaded.rtts.len() >= 5,
        "fewer than 5 pings came back through the full queue:\n{}",
        m.loaded.output
    );
    let lat = latency(&m.report, direction);
    assert!(
        lat["stamp_reflector"]
            .as_str()
            .is_some_and(|r| r.ends_with(&format!(":{STAMP_PORT}"))),
        "the probes went to the STAMP reflector: {lat}"
    );
    let rtt = ms(lat, "loaded_rtt_ms", "p50");
    let ping = m.loaded.median();
    assert!(
        (rtt - ping).abs() <= 0.10 * ping,
        "STAMP loaded RTT p50 {rtt} ms, ping's median through the same queue {ping:.3} ms ± 10%: {lat}"
    );
    let idle = f(lat, "idle_rtt_ms");
    assert!(idle < IDLE_MS, "idle STAMP RTT {idle} ms: {lat}");
    verdict_says(&m.report, direction, QUEUE_FILLED);
}

#[test]
fn stamp_probes_to_our_reflector_match_ping_through_a_filled_queue() {
    stamp_probes_through_a_filled_queue("latsu", 87, Way::Upload, ProbedBy::OurReflector);
}

#[test]
fn stamp_probes_to_stamp_suite_on_the_router_match_ping_through_a_filled_queue() {
    stamp_probes_through_a_filled_queue("latsr", 86, Way::Reverse, ProbedBy::StampSuiteOnTheRouter);
}

#[test]
fn a_paced_load_under_the_link_keeps_the_queue_short() {
    a_short_queue("latpc", 97, Way::Upload);
}

#[test]
fn a_paced_reverse_load_under_the_link_keeps_the_queue_short() {
    a_short_queue("latpr", 89, Way::Reverse);
}

/// A paced load well under the link, `way`: the queue stays short, and
/// netspeed says so.
fn a_short_queue(tag: &str, net_id: u8, way: Way) {
    let _one = one_at_a_time();
    let direction = way.direction();
    let m = measure(tag, net_id, way, UNDERLOAD);

    // The witnesses: the queue stayed short, nothing was dropped.
    idle_witness(&m);
    let short_bytes = (SHORT_MS / 1000.0 * RATE_BPS as f64 / 8.0) as u64;
    assert!(
        m.backlog_max <= short_bytes,
        "a load under the link queued {} B in the tbf (more than {SHORT_MS} ms)",
        m.backlog_max
    );
    assert_eq!(m.drops, 0, "a load under the link overflowed the tbf");
    quick_pings(&m.loaded, SHORT_MS, "under a paced load");

    // netspeed's figures.
    let lat = latency(&m.report, direction);
    let queue = ms(lat, "queue_delay_ms", "p99");
    assert!(queue < SHORT_MS, "queue delay p99 {queue} ms: {lat}");
    let rtt = ms(lat, "loaded_rtt_ms", "p50");
    assert!(rtt < SHORT_MS, "loaded RTT p50 {rtt} ms: {lat}");
    verdict_says(&m.report, direction, QUEUE_SHORT);
}

/// `--find-limit --max-delay`: the highest rate whose data's p99 queue
/// delay stays under the bound. Checked by the tbf's arithmetic: a trial
/// of `T` seconds at a payload rate `r` puts `(r × wire/payload − RATE) × T`
/// bits into the queue, which the tbf drains at RATE; its delay reaches
/// that over RATE. Under a 10 ms bound, 1 s trials pass only up to about
/// 1 % above the link, although the 100 ms queue would take 10 % more
/// before anything were lost: a loss-only search would read the queue as
/// capacity.
#[test]
fn max_delay_finds_the_rate_that_keeps_the_queue_short() {
    let _one = one_at_a_time();
    let Shaped {
        server,
        target,
        net,
        ..
    } = shaped("latfl", 88, Way::Upload);
    const BOUND_MS: f64 = 10.0;
    const TRIAL_S: f64 = 1.0;
    const SIZE: f64 = 1400.0;
    let rest = format!(
        "--find-limit --max-delay {BOUND_MS}ms --trial-duration {TRIAL_S}s -b {SIZE} {}",
        FIFO.join(" ")
    );
    let report = client_json(
        net.client.cmd(CLIENT),
        &args_to(&target, &rest),
        Duration::from_secs(150),
    );
    server.stop();
    let limit = &report["limit"];
    // A sender descheduled in every try at a rate stops the search there
    // (udp_client says so): this machine was too busy to measure the path.
    assert!(
        limit["descheduled_at_bps"].is_null(),
        "MACHINE TOO BUSY: the search stopped at {} bit/s, the sender descheduled in every try: {report}",
        limit["descheduled_at_bps"]
    );
    let found = u(limit, "rate_bps") as f64;
    // On the tbf's scale: IP, UDP and Ethernet headers on each datagram.
    let wire = (SIZE + 28.0 + 14.0) / SIZE;
    let resolution = f(limit, "resolution_percent") / 100.0;
    let most = RATE_BPS as f64 * (1.0 + BOUND_MS / 1e3 / TRIAL_S) / wire
        + BURST_BYTES as f64 * 8.0 / TRIAL_S;
    eprintln!(
        "FIGURE latfl: found {found:.0} bit/s (payload), at most {most:.0} by the tbf's arithmetic; limit {limit}"
    );
    assert!(
        found <= most * (1.0 + resolution),
        "found {found} bit/s, more than the {most:.0} a {BOUND_MS} ms bound allows: {limit}"
    );
    assert!(
        found >= 0.8 * RATE_BPS as f64 / wire,
        "found {found} bit/s, far under the link: {limit}"
    );
    assert!(
        f(&limit["queue_delay_ms"], "p99") <= BOUND_MS,
        "the rate found kept its p99 under the bound: {limit}"
    );
    assert_eq!(f(limit, "max_delay_ms"), BOUND_MS);
    // The bound did the work: some trial failed on delay alone, losing
    // nothing (the queue was not full), at a rate the link could not carry.
    let trials = report["trials"].as_array().expect("trials");
    let by_delay: Vec<&Value> = trials
        .iter()
        .filter(|t| t["cause"] == "queue_delay")
        .collect();
    assert!(
        by_delay.iter().any(|t| f(t, "loss_percent") == 0.0),
        "a trial failed on delay with no loss: {}",
        serde_json::to_string_pretty(trials).unwrap_or_default()
    );
    for t in &by_delay {
        assert!(
            f(&t["queue_delay_ms"], "p99") > BOUND_MS,
            "a trial failed on delay only over the bound: {t}"
        );
    }
}
