//! netspeed: how fast data really moves between two sockets, and why it
//! does not move faster.
//!
//! The binaries in `src/bin/` are thin: they parse flags, build a validated
//! config, call a role's `run`, print its report and map errors to exit
//! codes (2 for usage and config mistakes, 1 for runtime failures).
//!
//! # Layout
//! Binaries parse flags, call a role, hand its report or events to
//! `output`, and map errors to exit codes. Below them, four layers; a
//! module imports only from its own layer or the ones below:
//!
//! - **Presentation**: [`output`], the only code that writes to stdout or
//!   stderr and the only user of indicatif and plotters: [`output::report`]
//!   (UDP text and JSON, and the `limit` verdict line),
//!   [`output::limit`] (`--find-limit`'s trial lines and result; its
//!   chart is in `output/bench/plot.rs`),
//!   [`output::timeline`] (`udp_client --plot` on an ordinary run: rate
//!   and delay on one time axis, gathered from a run's reports by
//!   [`output::timeline_of`]),
//!   [`output::progress`], [`output::bench`] (sockbench tables, CSV and
//!   charts: `output/bench/table.rs`, `output/bench/plot.rs`),
//!   [`output::proxy`] (tcp_proxy's event lines and benchmark tables),
//!   [`output::metrics`] (`udp_server --metrics`: the Prometheus
//!   exposition) and [`output::metrics_http`] (its HTTP endpoint: slots,
//!   per-source shares and deadlines), [`output::manual`] (completions
//!   and man pages from the clap definitions), and process start and end
//!   for the binaries ([`output::start`]: flags, config, signal flag,
//!   scheduler; [`output::exit_with`]).
//! - **Roles**, which compute and return report structs or send typed
//!   events to a sink; they never print and never exit:
//!   - [`server`]: bind, receive with the meter's `--method` loops and
//!     count per peer with the meter's accounting; send reverse streams
//!     ([`server::stream`]) for the sessions that proved their address
//!     ([`server::reverse`]: Start to EndAck, bounded; the accounting
//!     hands it what it does not handle itself);
//!     what `--metrics` exposes ([`server::metrics`]); the socket as a
//!     whole, each interval and at a burst's end ([`server::total`]);
//!   - [`client`]: send an exact volume with the meter's send path,
//!     the clients of a run sharing a few threads (`client/fleet.rs`)
//!     behind one start gate (`client/sender.rs`), ask for the server's
//!     count (`client/exchange.rs`), sum the clients' reports
//!     (`client/summary.rs` into `client/report.rs`); ask for a reverse stream
//!     ([`client::start`]); read the sender's own egress queue around a
//!     run and watch it for GSO's unheard drops ([`client::egress`]); say
//!     why a run was not faster ([`client::verdict`]); search for the highest
//!     rate the path carries ([`client::limit`]);
//!   - [`download`]: `udp_client -R` and `--bidir`, the client's start
//!     of a reverse stream with the server's own receive engine on the
//!     client's socket (above both, so neither imports the other);
//!   - [`latency`]: delay under load on every run: round-trip probes
//!     beside the load (`client/rtt.rs`, answered by [`server::probe`])
//!     and each direction's queue delay ([`stats::delay`]), joined above
//!     both roles;
//!   - [`local`]: `udp_client --local`, a client and a server in one
//!     process (above both, so neither imports the other);
//!   - [`proxy`]: tcp_proxy's relay modes (`proxy/relay.rs`,
//!     `proxy/blocking.rs`, splice pipes pooled under one budget in
//!     `proxy/pipes.rs`, the descriptor limit's capacity in
//!     `proxy/capacity.rs`), its typed events ([`proxy::events`]) and its
//!     latency benchmark ([`proxy::bench`], with its HTTP ends in
//!     `proxy/http.rs`);
//!   - [`bench`](mod@bench): sockbench's matrices ([`bench::udp`] with one driver
//!     (`bench/udp/driver.rs`) and a backend per socket library
//!     (`bench/udp/blocking.rs`, `bench/udp/runtimes.rs`), [`bench::tcp`], [`bench::mux`]),
//!     the bare-path ceiling ([`bench::ceiling`]) and udp_client's
//!     `--sweep` (`bench/sweep.rs`). Roles may call the roles above them in this list
//!     (bench runs the server and the client);
//!     never the other way.
//! - **Settings**: [`config`], flags and TOML files layered once
//!   (defaults < file < flags) into one validated config per role
//!   ([`config::server`], [`config::client`], [`config::proxy`],
//!   [`config::bench`]), and [`congestion`] (`--congestion ALGO`).
//! - **Engines**: [`meter`], what moves and counts datagrams whichever
//!   role runs it: the send paths ([`meter::send`]), pacing and back-off
//!   ([`meter::pace`]), the receive loops ([`meter::recv`]), the
//!   receive accounting per peer ([`meter::account`], split by concern:
//!   `meter/account/admission.rs` slots and answers,
//!   `meter/account/peer.rs` one peer's figures,
//!   `meter/account/exchange.rs` the Hello/End exchange,
//!   `meter/account/expiry.rs` time, `meter/account/report.rs` reports,
//!   with its unit tests in `meter/account/tests.rs`), the datagram plan
//!   of each call ([`meter::plan`]) and the one send loop
//!   ([`meter::stream`]). It imports only the leaves.
//! - **Leaves**, which import nothing above them:
//!   - [`units`]: sizes, rates and durations as people write them;
//!   - [`wire`]: the datagram header, the start probe and the end-of-test
//!     messages; pure encode/decode; [`auth`]: `--psk`'s HMAC;
//!   - [`stats`]: pure statistics (sequence sets, jitter, rates, CPU cost;
//!     [`stats::samples`] summaries, [`stats::histogram`] latencies,
//!     [`stats::delay`] queue delay and round trips, [`stats::drops`]
//!     kernel drops in datagrams and loss split by where it happened);
//!   - [`sys`]: every platform syscall and errno, and the only `unsafe`
//!     code (`sys/linux.rs` with the process's calls in `sys/linux_process.rs`,
//!     RLIMIT_NOFILE for Linux and macOS in `sys/rlimit.rs`, and the egress
//!     device, its qdisc's counters over rtnetlink and SndbufErrors in
//!     `sys/linux_qdisc.rs`,
//!     `sys/splice.rs`, POSIX poll(2) for every backend in `sys/poll.rs`;
//!     in `sys/fallback.rs`, a non-blocking receive), with stubs in
//!     `sys/fallback.rs` where a platform lacks a call; no CLI wording;
//!   - [`shutdown`]: the one stop flag every role polls; [`error`]: typed
//!     failures and their exit codes.

#![deny(unsafe_code)]

pub mod auth;
pub mod bench;
pub mod client;
pub mod config;
pub mod congestion;
pub mod download;
pub mod error;
pub mod latency;
pub mod local;
pub mod meter;
pub mod output;
pub mod proxy;
pub mod server;
pub mod shutdown;
pub mod stats;
#[allow(unsafe_code)]
pub mod sys;
pub mod units;
pub mod wire;
