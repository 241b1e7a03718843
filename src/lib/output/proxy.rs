//! `tcp_proxy`'s lines: its events as text or NDJSON, and `tcp_proxy
//! bench`'s progress, rows and table.
//!
//! Where each line goes is part of the interface: the listening line is
//! always the first line on stdout (a script reads the bound port from it);
//! with `--json` every event is an NDJSON object on stdout; otherwise the
//! other events are `tcp_proxy: ...` lines on stderr. JSON objects are
//! built as `serde_json::Value`s, whose keys come out sorted: that is the
//! order the proxy has always printed them in.

use super::Format;
use crate::proxy::events::{End, FdLimitAt, Listening, ProxyEvent, Summary};
use crate::proxy::latency_bench::Row;
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
    let line = match event {
        ProxyEvent::Listening(l) => {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", listening_text(l));
            let _ = out.flush();
            return;
        }
        ProxyEvent::ConnClosed(r) => format!(
            "conn {} from {} {} after {:.3} s: {} B client->upstream, {} B upstream->client{}",
            r.id,
            r.client,
            End::text(&r.end),
            r.seconds,
            r.client_to_upstream,
            r.upstream_to_client,
            match (r.pipe_client_to_upstream, r.pipe_upstream_to_client) {
                (None, None) => String::new(),
                (up, down) => {
                    let size = |p: Option<usize>| p.map_or("none".to_string(), |p| format!("{p} B"));
                    format!("; pipes {} and {}", size(up), size(down))
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
            "conn {id}: the {direction} pipe stays at {from} B: growing it to {to} B was refused by {} \
             (pipes have grown by {pipes_grown} B of the {pipe_budget} B budget); said once, the summary counts them all",
            refused_by.text()
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
    // One write(2) per line: stderr is unbuffered, and `writeln!` would
    // make three of them, one per piece, for every connection that closes.
    let _ = std::io::stderr().write_all(format!("tcp_proxy: {line}\n").as_bytes());
}

fn listening_text(l: &Listening) -> String {
    format!(
        "tcp_proxy listening on {}, upstream {}, mode {}, {}, threads {}, TCP_NODELAY {}, congestion {}, {}",
        l.addr,
        l.upstream,
        l.mode,
        match (l.pipe_budget, l.splice_after) {
            (Some(budget), after) => format!(
                "{}, pipes 64 KiB growing to {} B each, {budget} B of growth in all",
                match after {
                    Some(after) if after > 0 => {
                        format!("bursts copied until a read fills {after} B")
                    }
                    _ => "every byte spliced".to_string(),
                },
                l.buffer_size
            ),
            (None, _) => format!("buffer {} B", l.buffer_size),
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
        "stopped: {} connections accepted, {} rejected, {} upstream failures, {} refused at the descriptor limit (accept paused {} times), {} reset by a peer, {} errors, {} cut at the drain deadline, {} pipe growths refused; {} B client->upstream, {} B upstream->client{pipes}",
        s.accepted,
        s.rejected,
        s.upstream_failures,
        s.fd_limit_refused,
        s.accept_paused,
        s.resets,
        s.errors,
        s.cut_at_deadline,
        s.pipe_growths_refused,
        s.client_to_upstream,
        s.upstream_to_client
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
            "mode splice, bursts copied until a read fills 16384 B, pipes 64 KiB growing to 8 B each"
        ));
        l.splice_after = Some(0);
        assert!(listening_text(&l).contains("mode splice, every byte spliced, pipes"));
    }
}
