//! `tcp_proxy`'s lines: its events as text or NDJSON, and `tcp_proxy
//! bench`'s progress, rows and table.
//!
//! Where each line goes is part of the interface: the listening line is
//! always the first line on stdout (a script reads the bound port from it);
//! with `--json` every event is an NDJSON object on stdout; otherwise the
//! other events are `tcp_proxy: ...` lines on stderr. JSON objects are
//! built as `serde_json::Value`s, whose keys come out sorted: that is the
//! order the proxy has always printed them in.
//!
//! Sizes in the text lines read as people write them: bytes moved as
//! [`HumanBytes`] (`1.07 GB`), with the exact count beside it in the
//! summary, whose totals a reader compares with what the peers received;
//! sizes that a flag sets or that pipes grow to as the flags take them
//! ([`size_label`]: `16KiB`, `1MiB`), exact. The JSON keeps every count in
//! bytes.

use super::Format;
use crate::proxy::events::{End, FdLimitAt, Listening, ProxyEvent, Summary};
use crate::proxy::latency_bench::Row;
use crate::units::{size_label, HumanBytes};
use std::io::Write;

/// Prints one proxy event, as text or as one NDJSON line.
pub fn proxy_event(event: &ProxyEvent, format: Format) {
    if format == Format::Json {
        let value = serde_json::to_value(event).unwrap_or_default();
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{value}");
        let _ = out.flush();
        return;
    }
    let line = text_line(event);
    if let ProxyEvent::Listening(_) = event {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
        return;
    }
    // One write(2) per line: stderr is unbuffered, and `writeln!` would
    // make three of them, one per piece, for every connection that closes.
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// A size a flag sets, or a pipe grows to, as the flags take it (`16KiB`,
/// `1MiB`, `64K`), exact; in bytes when no unit fits it (`8193 B`).
fn size(bytes: usize) -> String {
    let label = size_label(bytes as u64);
    if label.bytes().all(|b| b.is_ascii_digit()) {
        format!("{label} B")
    } else {
        label
    }
}

/// A byte count for the summary: `9.13 GB (9133096997 B)`, or `512 B`
/// where the two would say the same.
fn exact_bytes(bytes: u64) -> String {
    if bytes < 1000 {
        format!("{bytes} B")
    } else {
        format!("{} ({bytes} B)", HumanBytes(bytes))
    }
}

/// One event's text line: `tcp_proxy listening on ...` (for stdout), or
/// `tcp_proxy: ...` (for stderr).
fn text_line(event: &ProxyEvent) -> String {
    let line = match event {
        ProxyEvent::Listening(l) => return listening_text(l),
        ProxyEvent::ConnClosed(r) => format!(
            "conn {} from {} {} after {:.3} s: {} client->upstream, {} upstream->client{}",
            r.id,
            r.client,
            End::text(&r.end),
            r.seconds,
            HumanBytes(r.client_to_upstream),
            HumanBytes(r.upstream_to_client),
            match (r.pipe_client_to_upstream, r.pipe_upstream_to_client) {
                (None, None) => String::new(),
                (up, down) => {
                    let pipe = |p: Option<usize>| p.map_or("none".to_string(), size);
                    format!("; pipes {} and {}", pipe(up), pipe(down))
                }
            }
        ),
        ProxyEvent::PipeGrowthRefused {
            id,
            direction,
            from,
            to,
            refused_by,
            pipe_budget,
            pipes_grown,
        } => format!(
            "conn {id}: the {direction} pipe stays at {}: growing it to {} was refused by {} \
             (pipes have grown by {} of the {} budget); said once, the summary counts them all",
            size(*from),
            size(*to),
            refused_by.text(),
            size(*pipes_grown),
            size(*pipe_budget)
        ),
        ProxyEvent::UpstreamFailed {
            id,
            client,
            upstream,
            error,
        } => format!(
            "conn {id} from {client}: cannot reach upstream {upstream}: {error}; closed the client"
        ),
        ProxyEvent::Rejected {
            client,
            max_conns,
            limited_by,
        } => {
            if *limited_by == "fd_limit" {
                format!(
                    "rejected {client}: {max_conns} connections are already open, the most the descriptor limit allows"
                )
            } else {
                format!("rejected {client}: --max-conns {max_conns} connections are already open")
            }
        }
        ProxyEvent::MaxConnsCapped { message, .. } => message.clone(),
        ProxyEvent::AcceptFailed { error } => format!("accept failed: {error}"),
        ProxyEvent::PipeUnavailable {
            id,
            direction,
            pipes_max,
            error,
        } => format!(
            "conn {id}: no pipe for {direction} ({}): it copies through a buffer instead; said once, the summary counts them all",
            match error {
                Some(e) => format!("the kernel refused one: {e}"),
                None => format!("all {pipes_max} pipes the descriptor limit allows are open"),
            }
        ),
        ProxyEvent::FdLimitReached {
            at,
            id,
            client,
            error,
            open,
            fd_limit,
        } => {
            let limit = fd_limit.map_or(String::new(), |l| format!(" (RLIMIT_NOFILE {l})"));
            let what = match (at, id, client) {
                (FdLimitAt::Upstream, Some(id), Some(client)) => format!(
                    "conn {id} from {client}: no descriptor for its upstream leg, closed the client"
                ),
                _ => "accept: connections wait in the backlog".to_string(),
            };
            format!(
                "out of descriptors{limit} with {open} connections open: {what} ({error}); pausing accept for 100 ms"
            )
        }
        ProxyEvent::Draining {
            open,
            deadline_seconds,
        } => format!(
            "stopping: no new connections; draining {open} open for up to {deadline_seconds:.3} s"
        ),
        ProxyEvent::Stopped(s) => stopped_text(s),
    };
    format!("tcp_proxy: {line}")
}

fn listening_text(l: &Listening) -> String {
    format!(
        "tcp_proxy listening on {}, upstream {}, mode {}, {}, threads {}, TCP_NODELAY {}, congestion {}, {}",
        l.addr,
        l.upstream,
        l.mode,
        match (l.pipe_budget, l.splice_after) {
            (Some(budget), after) => format!(
                "{}, pipes {} growing to {} each, {} of growth in all",
                match after {
                    Some(after) if after > 0 => {
                        format!("bursts copied until a read fills {}", size(after))
                    }
                    _ => "every byte spliced".to_string(),
                },
                size(crate::proxy::pipes::START_SIZE),
                size(l.buffer_size),
                size(budget)
            ),
            (None, _) => format!("buffer {}", size(l.buffer_size)),
        },
        l.threads,
        if l.nodelay { "on" } else { "OFF" },
        match (l.congestion_is_system_default, &l.congestion) {
            (false, Some(name)) => name.clone(),
            (true, Some(name)) => format!("{name} (system default)"),
            (_, None) => "system default".to_string(),
        },
        capacity_text(l)
    )
}

/// `descriptors: limit 20000 (raised from 1024): at most 4096 connections,
/// 2 descriptors each (their sockets); pipes from the 11782 descriptors
/// left: at most 5891, 2 descriptors each`: the limit, then the plan.
fn capacity_text(l: &Listening) -> String {
    let c = &l.capacity;
    let limit = match (c.fd_limit, c.fd_limit_before, c.fd_hard_limit_before) {
        (Some(now), Some(before), Some(hard)) => {
            format!("limit {now} (raised from {before}, and the hard limit from {hard})")
        }
        (Some(now), Some(before), None) if before < now => {
            format!("limit {now} (raised from {before})")
        }
        (Some(now), _, _) => format!("limit {now}"),
        (None, _, _) => "limit unknown on this platform".to_string(),
    };
    format!("descriptors: {limit}: {}", l.capacity_plan)
}

fn stopped_text(s: &Summary) -> String {
    let pipes = if s.pipes_created > 0 {
        format!(
            "; pipes: {} made, {} reused, {} in use, {} pooled, {} times none free",
            s.pipes_created, s.pipes_reused, s.pipes_in_use, s.pipes_pooled, s.pipes_unavailable
        )
    } else {
        String::new()
    };
    format!(
        "stopped: {} connections accepted, {} rejected, {} upstream failures, {} refused at the descriptor limit (accept paused {} times), {} reset by a peer, {} errors, {} cut at the drain deadline, {} pipe growths refused; {} client->upstream, {} upstream->client{pipes}",
        s.accepted,
        s.rejected,
        s.upstream_failures,
        s.fd_limit_refused,
        s.accept_paused,
        s.resets,
        s.errors,
        s.cut_at_deadline,
        s.pipe_growths_refused,
        exact_bytes(s.client_to_upstream),
        exact_bytes(s.upstream_to_client)
    )
}

/// One measured row of `tcp_proxy bench`: with `--json` the row itself on
/// stdout; otherwise a progress line on stderr (the table comes at the end).
pub fn bench_row(row: &Row, format: Format) {
    if format == Format::Json {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", serde_json::to_string(row).unwrap_or_default());
        let _ = out.flush();
    } else {
        eprintln!("tcp_proxy bench: {} {} done", row.test.label(), row.case);
    }
}

/// The table on stdout, shaped like seed 004's with the tail added.
pub fn bench_table(rows: &[Row]) {
    let mut out = std::io::stdout().lock();
    let _ = write_bench_table(&mut out, rows);
}

/// The table, shaped like seed 004's with the tail added.
pub fn write_bench_table(out: &mut dyn Write, rows: &[Row]) -> std::io::Result<()> {
    let case_w = rows.iter().map(|r| r.case.len()).max().unwrap_or(4).max(4);
    writeln!(
        out,
        "| Test   | {:case_w$} | {:>10} | {:>10} | {:>10} | {:>10} | {:>10} | {:>10} | {:>11} |",
        "Case", "Mean", "p50", "p99", "p99.9", "Max", "Req/s", "+p50 vs direct"
    )?;
    writeln!(
        out,
        "| ------ | {} | ---------: | ---------: | ---------: | ---------: | ---------: | ---------: | ----------: |",
        "-".repeat(case_w)
    )?;
    for r in rows {
        if let Some(e) = &r.error {
            writeln!(
                out,
                "| {} | {:case_w$} | FAILED: {e}",
                r.test.label(),
                r.case
            )?;
            continue;
        }
        let l = &r.latency;
        writeln!(
            out,
            "| {} | {:case_w$} | {:>10} | {:>10} | {:>10} | {:>10} | {:>10} | {:>10.0} | {:>11} |",
            r.test.label(),
            r.case,
            format_us(l.mean_us),
            format_us(l.p50_us),
            format_us(l.p99_us),
            format_us(l.p999_us),
            format_us(l.max_us),
            r.requests_per_second,
            r.added_p50_us
                .map(|a| format!("{}{}", if a < 0.0 { "-" } else { "+" }, format_us(a.abs())))
                .unwrap_or_default()
        )?;
    }
    Ok(())
}

/// A latency for the table: `87.3 us`, `1.204 ms`, `40.11 ms`.
pub fn format_us(us: f64) -> String {
    if us >= 1000.0 {
        format!("{:.3} ms", us / 1000.0)
    } else {
        format!("{us:.1} us")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting() {
        assert_eq!(format_us(87.34), "87.3 us");
        assert_eq!(format_us(40110.0), "40.110 ms");
    }

    #[test]
    fn listening_line_names_the_congestion_source() {
        let mut l = Listening {
            addr: "127.0.0.1:1".parse().unwrap(),
            upstream: "127.0.0.1:2".parse().unwrap(),
            mode: "tokio",
            buffer_size: 8,
            threads: 1,
            nodelay: false,
            congestion: Some("bbr".into()),
            congestion_is_system_default: true,
            capacity: crate::proxy::Capacity::compute(crate::config::proxy::Mode::Tokio, 3, None)
                .unwrap(),
            capacity_plan: String::new(),
            pipe_budget: None,
            splice_after: None,
        };
        l.capacity_plan = l.capacity.plan_text();
        let fds = ", descriptors: limit unknown on this platform: at most 3 connections, 2 \
                   descriptors each (their sockets)";
        assert!(listening_text(&l).ends_with(&format!(
            "TCP_NODELAY OFF, congestion bbr (system default){fds}"
        )));
        l.congestion_is_system_default = false;
        assert!(listening_text(&l).ends_with(&format!("congestion bbr{fds}")));
        l.congestion = None;
        assert!(listening_text(&l).ends_with(&format!("congestion system default{fds}")));
        let json = serde_json::to_value(ProxyEvent::Listening(Box::new(l.clone()))).unwrap();
        assert_eq!(json["event"], "listening");
        assert_eq!(json["addr"], "127.0.0.1:1");
        // splice says how it moves small bursts: --splice-after, or 0.
        l.mode = "splice";
        l.pipe_budget = Some(1 << 20);
        l.splice_after = Some(16384);
        assert!(listening_text(&l).contains(
            "mode splice, bursts copied until a read fills 16KiB, pipes 64KiB growing to 8 B each, \
             1MiB of growth in all"
        ));
        l.splice_after = Some(0);
        assert!(listening_text(&l).contains("mode splice, every byte spliced, pipes"));
        l.mode = "tokio";
        l.pipe_budget = None;
        l.splice_after = None;
        l.buffer_size = 64 << 10;
        assert!(listening_text(&l).contains("mode tokio, buffer 64KiB, threads 1"));
        l.buffer_size = 8193;
        assert!(listening_text(&l).contains("mode tokio, buffer 8193 B, threads 1"));
    }

    /// Golden lines: a connection's bytes for people, its pipes as the
    /// flags take sizes; the summary's totals with the exact count too.
    #[test]
    fn byte_counts_read_as_people_write_them() {
        let conn = crate::proxy::ConnReport {
            id: 7,
            client: "127.0.0.1:50412".parse().unwrap(),
            client_to_upstream: 9_133_096_997,
            upstream_to_client: 512,
            seconds: 0.412,
            end: End::Closed,
            pipe_client_to_upstream: Some(1 << 20),
            pipe_upstream_to_client: None,
        };
        assert_eq!(
            text_line(&ProxyEvent::ConnClosed(conn.clone())),
            "tcp_proxy: conn 7 from 127.0.0.1:50412 closed after 0.412 s: 9.13 GB \
             client->upstream, 512 B upstream->client; pipes 1MiB and none"
        );
        let plain = crate::proxy::ConnReport {
            pipe_client_to_upstream: None,
            upstream_to_client: 1_500_000,
            ..conn
        };
        assert!(text_line(&ProxyEvent::ConnClosed(plain))
            .ends_with(": 9.13 GB client->upstream, 1.50 MB upstream->client"));
        let summary = Summary {
            accepted: 3,
            client_to_upstream: 9_133_096_997,
            upstream_to_client: 999,
            ..Summary::default()
        };
        let line = text_line(&ProxyEvent::Stopped(summary));
        assert!(
            line.ends_with(
                "0 pipe growths refused; 9.13 GB (9133096997 B) client->upstream, 999 B \
                 upstream->client"
            ),
            "{line}"
        );
        let refused = ProxyEvent::PipeGrowthRefused {
            id: 4,
            direction: "upstream_to_client",
            from: 128 << 10,
            to: 256 << 10,
            refused_by: crate::proxy::events::RefusedBy::Budget,
            pipe_budget: 128 << 10,
            pipes_grown: 64 << 10,
        };
        assert_eq!(
            text_line(&refused),
            "tcp_proxy: conn 4: the upstream_to_client pipe stays at 128KiB: growing it to \
             256KiB was refused by --pipe-budget (pipes have grown by 64KiB of the 128KiB \
             budget); said once, the summary counts them all"
        );
        // The JSON keeps the counts in bytes.
        let json = serde_json::to_value(ProxyEvent::Stopped(Summary {
            client_to_upstream: 9_133_096_997,
            ..Summary::default()
        }))
        .unwrap();
        assert_eq!(json["client_to_upstream"], 9_133_096_997u64);
    }
}
