//! netspeed: how fast data really moves between two sockets, and why it
//! does not move faster.
//!
//! The binaries in `src/bin/` are thin: they parse flags, build a validated
//! config, call a role's `run`, print its report and map errors to exit
//! codes (2 for usage and config mistakes, 1 for runtime failures).
//!
//! # Layout
//! - [`units`]: sizes, rates and durations as people write them (`64K`, `500Mbit`).
//! - [`config`]: flags and TOML files merged into one validated config per role.
//! - [`congestion`]: `--congestion ALGO`, TCP_CONGESTION for tcp_proxy and sockbench tcp.
//! - [`wire`]: the datagram header, the start probe and the end-of-test messages; pure encode/decode.
//! - [`auth`]: `--psk`, an HMAC over the End and its answer.
//! - [`stats`]: pure statistics: duplicates, reordering, loss, jitter, wire size.
//! - [`sys`]: the only `unsafe` code: recvmmsg, SO_RXQ_OVFL, IP_RECVERR, ...
//! - [`server`]: bind, receive, count per peer ([`server::peers`]).
//! - [`client`]: send an exact volume, pace, back off, ask for the server's count.
//! - [`proxy`]: tcp_proxy's six relay modes and its latency benchmark.
//! - [`bench`]: sockbench's matrices (udp, tcp, mux) and udp_client's --sweep.
//! - [`report`]: text and JSON views of the reports.
//! - [`progress`]: the progress bar (the only indicatif user).
//! - [`shutdown`]: the one stop flag every role polls.
//! - [`error`]: the two kinds of failure and their exit codes.
//!
//! Data flows one way: binaries → roles (server, client, proxy, bench) →
//! shared pieces (wire, stats, sys, units).

#![deny(unsafe_code)]

pub mod auth;
pub mod bench;
pub mod client;
pub mod config;
pub mod congestion;
pub mod error;
pub mod output;
pub mod proxy;
pub mod server;
pub mod shutdown;
pub mod stats;
#[allow(unsafe_code)]
pub mod sys;
pub mod units;
pub mod wire;
