//! netspeed: how fast data really moves between two sockets, and why it
//! does not move faster.
//!
//! The binaries in `src/bin/` are thin: they parse flags, build a validated
//! config, call a role's `run`, print its report and map errors to exit
//! codes (2 for usage and config mistakes, 1 for runtime failures).
//!
//! # Layout
//! Binaries parse flags, call a role, hand its report or events to
//! `output`, and map errors to exit codes. Below them, six layers; a
//! module imports only from its own layer or the ones below, no role
//! imports another, and no modules import each other in a circle
//! (tests/layout.rs checks all three):
//!
//! - **Presentation**: [`output`], the only code that writes to stdout or
//!   stderr and the only user of indicatif and plotters. The format is
//!   chosen once ([`output::Format`]) and every report knows how it looks
//!   in each: [`output::report`] (UDP text and JSON, by role:
//!   [`output::report::server`], [`output::report::client`],
//!   [`output::report::duplex`]), [`output::iperf3`] (`--iperf3-json`:
//!   one document in iperf3's `-J` shape, a pure mapping from the
//!   client's reports, [`output::iperf3::client`], and from the server's
//!   events, [`output::iperf3::server`], unit-tested in
//!   `output/iperf3/tests.rs`), [`output::limit`] (`--find-limit`'s
//!   trial lines, result and chart), [`output::sweep`] (`--sweep`'s table
//!   and chart), [`output::timeline`] (`udp_client --plot` on an ordinary
//!   run: rate and delay on one time axis, gathered from a run's reports
//!   by [`output::timeline_of`]), [`output::plot`] (the SVG helper every
//!   chart uses) and [`output::table`] (the aligned text table),
//!   [`output::progress`] (the byte bar and the cell bar),
//!   [`output::sockbench`] (sockbench's tables, CSV and charts:
//!   `output/sockbench/table.rs`, `output/sockbench/plot.rs`),
//!   [`output::proxy`] (tcp_proxy's event lines and benchmark tables),
//!   [`output::stamp`] (the STAMP sender's report and the reflector's
//!   lines),
//!   [`output::metrics`] (`udp_server --metrics`: the Prometheus
//!   exposition) and [`output::metrics_http`] (its HTTP endpoint: slots,
//!   per-source shares and deadlines), [`output::manual`] (completions
//!   and man pages from the clap definitions), and process start and end
//!   for the binaries ([`output::start`]: flags, config, signal flag,
//!   scheduler; [`output::exit_with`]).
//! - **What composes roles**: [`local`] (`udp_client --local`: a client
//!   and a silent server in one process) and [`sockbench`] (sockbench's
//!   matrices: [`sockbench::udp`] with one driver
//!   (`sockbench/udp/driver.rs`) and a backend per socket library
//!   (`sockbench/udp/blocking.rs`, `sockbench/udp/runtimes.rs`),
//!   [`sockbench::tcp`], [`sockbench::mux`], and the bare-path ceiling
//!   [`sockbench::ceiling`]), which run the server and the client.
//! - **Roles**, which compute and return report structs or send typed
//!   events to a sink; they never print and never exit:
//!   - [`server`]: bind, and compose the meter's receive engine with what
//!     only a server does: send reverse streams ([`server::reverse::send`])
//!     for the sessions that proved their address ([`server::reverse`]:
//!     Start to EndAck, bounded, each watched by a circuit breaker,
//!     [`server::reverse::breaker`]), answer probes ([`server::probe`]), what
//!     `--metrics` exposes ([`server::metrics`]), the socket as a
//!     whole, each interval and at a burst's end ([`server::total`]), and
//!     `--stamp`'s reflector on a socket and a thread of its own
//!     ([`server::stamp`]: answers in place, a batch per sendmmsg), with
//!     its per-source budgets in hashed buckets
//!     ([`server::stamp::budget`]) and its bounded session table
//!     ([`server::stamp::sessions`]);
//!   - [`client`]: send an exact volume with the meter's send path, the
//!     clients of a run sharing a few threads (`client/fleet.rs`) behind
//!     one start gate (`client/sender.rs`), ask for the server's count
//!     (`client/exchange.rs`) and, for `--plot`, what it kept of each
//!     interval ([`client::intervals`]), sum the clients' reports
//!     (`client/summary.rs` into `client/report.rs`); ask for a reverse
//!     stream ([`client::start`]) and receive it with the meter's receive
//!     engine and the client's Feedback ([`client::reverse`]); `-R` and
//!     `--bidir` as one report ([`client::duplex`]); delay under load,
//!     the round-trip probes beside the load (`client/rtt.rs`) joined with
//!     each direction's queue delay ([`client::latency`]); read the
//!     sender's own egress queue around a run and watch it for GSO's
//!     unheard drops ([`client::egress`]); say why a run was not faster
//!     ([`client::verdict`]); search for the highest rate the path carries
//!     ([`client::limit`]); `--sweep`'s table ([`client::sweep`]);
//!     STAMP round trips alone (`--stamp-reflector --no-load`,
//!     [`client::stamp`]): one test packet sent and one answer matched
//!     into a sample on a socket the caller owns
//!     ([`client::stamp::session`]), the samples added up
//!     ([`client::stamp::tally`]: percentiles, loss by direction);
//!   - [`proxy`]: tcp_proxy's relay modes (`proxy/relay.rs`,
//!     `proxy/blocking.rs`, splice pipes pooled under one budget in
//!     `proxy/pipes.rs`, the descriptor limit's capacity in
//!     `proxy/capacity.rs`), its typed events ([`proxy::events`]) and its
//!     latency benchmark ([`proxy::latency_bench`], with its HTTP ends in
//!     `proxy/http.rs`).
//! - **Settings**: [`config`], flags and TOML files layered once
//!   (defaults < file < flags) into one validated config per role
//!   ([`config::server`], [`config::client`], [`config::proxy`],
//!   [`config::sockbench`], and STAMP's settings of both UDP binaries in
//!   [`config::stamp`]); udp_client's table of settings that cannot go
//!   together, checked alike for flags and files, in
//!   `config/client_tables.rs`; and [`congestion`] (`--congestion ALGO`).
//! - **Engines**: [`meter`], what moves and counts datagrams whichever
//!   role runs it: the send paths ([`meter::send`]), pacing and back-off
//!   ([`meter::pace`]), the receive loops ([`meter::recv`]), the receive
//!   engine both roles run ([`meter::receiver`]: the receive threads, the
//!   finalising thread and a role's hooks), the receive accounting per
//!   peer ([`meter::account`], split by concern:
//!   `meter/account/admission.rs` slots and answers,
//!   `meter/account/peer.rs` one peer's figures,
//!   `meter/account/exchange.rs` the Hello/End exchange,
//!   `meter/account/expiry.rs` time, `meter/account/report.rs` reports,
//!   `meter/account/history.rs` a session's figures per interval,
//!   with its unit tests in `meter/account/tests.rs`), the datagram plan
//!   of each call ([`meter::plan`]) and the one send loop
//!   ([`meter::stream`]). It imports only the leaves.
//! - **Leaves**, which import nothing above them:
//!   - [`units`]: sizes, rates and durations as people write them;
//!   - [`wire`]: the datagram header, the start probe and the end-of-test
//!     messages, the reverse stream's ([`wire::stream`]), an upload's
//!     figures per interval ([`wire::intervals`]) and the version
//!     negotiation answer ([`wire::versions`]); pure encode/decode;
//!     [`auth`]: `--psk`'s HMAC;
//!   - [`stamp`]: STAMP's test packets (RFC 8762, RFC 8972's SSID);
//!     pure encode/decode, the answer written in place, NTP and PTP
//!     timestamps and the error estimate ([`stamp::time`]), the TLVs a
//!     reflector copies and marks ([`stamp::tlv`]);
//!   - [`stats`]: pure statistics (sequence sets, jitter, rates, CPU cost;
//!     [`stats::samples`] summaries, [`stats::histogram`] latencies,
//!     [`stats::delay`] queue delay and round trips, [`stats::drops`]
//!     kernel drops in datagrams and loss split by where it happened,
//!     [`stats::cpu`] CPU cost and a shared CPU's share);
//!   - [`matrix`]: the one loop over a benchmark's cells (sockbench's
//!     suites and `--sweep`);
//!   - [`sys`]: every platform syscall and errno, the only `unsafe` code
//!     and the only user of the Unix API besides sockbench
//!     (`sys/linux.rs` with the process's calls in `sys/linux_process.rs`,
//!     RLIMIT_NOFILE for Linux and macOS in `sys/rlimit.rs`, answers sent
//!     back from the buffers their requests arrived in, received TTLs and
//!     the kernel's clock state in `sys/linux_reply.rs`, and the egress
//!     device, its qdisc's counters over rtnetlink and SndbufErrors in
//!     `sys/linux_qdisc.rs`, a receive queue's bytes and drop counter
//!     read directly (SO_MEMINFO) in `sys/linux_meminfo.rs`,
//!     `sys/splice.rs`, POSIX poll(2) for every
//!     backend in `sys/poll.rs`; `sys/fallback.rs` is the backend of
//!     macOS and the BSDs, with a non-blocking receive and stubs where a
//!     platform lacks a call, built on Linux with `--features portable`);
//!     no CLI wording;
//!   - [`shutdown`]: the one stop flag every role polls; [`error`]: typed
//!     failures and their exit codes.

#![deny(unsafe_code)]

pub mod auth;
pub mod client;
pub mod config;
pub mod congestion;
pub mod error;
pub mod local;
pub mod matrix;
pub mod meter;
pub mod output;
pub mod proxy;
pub mod server;
pub mod shutdown;
pub mod sockbench;
pub mod stamp;
pub mod stats;
#[allow(unsafe_code)]
pub mod sys;
pub mod units;
pub mod wire;
