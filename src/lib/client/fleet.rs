//! The clients of a run (`-P N`) on a few threads: each thread opens its
//! share of the sockets, probes the server on all of them at once, waits
//! at the [`StartGate`], sends every stream from one schedule and one
//! staging buffer, and asks for every End at once.
//!
//! Why not a thread per client, as before: a hundred clients at 10 Mbit/s
//! were a hundred threads each waking 2000 times a second, each with its
//! own 2 MB staging buffer. They cost 209 MB and 7.7 CPU-seconds where
//! iperf3 took 4.4 MB and 3.1, and still fell 3 % short of their rate; a
//! thousand took 1.6 GB and lost half their datagrams. On one thread per
//! core a thread wakes at most 2000 times a second however many clients
//! it serves ([`crate::meter::pace::Schedule`]), and the clients cost a
//! socket and a few hundred bytes each.
//!
//! A single client is a thread with one client on it: one path through
//! the code whatever `-P` is. Each client is still its own socket and its
//! own session at the server, with its own report.

use super::*;
use crate::meter::stream::{send_streams, Sent, StreamSpec};

/// Worker threads for `clients` clients on a host with `cores` cores: no
/// more than the cores, never more than the clients.
pub fn workers_for(clients: usize, cores: usize) -> usize {
    clients.min(cores).max(1)
}

/// How many clients each of `workers` threads runs: as even as it goes,
/// the larger shares first.
pub fn shares(clients: usize, workers: usize) -> Vec<usize> {
    let workers = workers.max(1);
    (0..workers)
        .map(|w| clients / workers + usize::from(w < clients % workers))
        .filter(|&n| n > 0)
        .collect()
}

/// The thread's CPU over its send loop, `cpu`, shared among its streams in
/// proportion to the payload bytes each sent (equally when none sent
/// any): the shares add up to the thread's CPU, and each stream's CPU per
/// byte is the thread's.
pub fn apportion(cpu: CpuTime, bytes: &[u64]) -> Vec<CpuTime> {
    let total: u64 = bytes.iter().sum();
    bytes
        .iter()
        .map(|&b| {
            let share = if total == 0 {
                1.0 / bytes.len() as f64
            } else {
                b as f64 / total as f64
            };
            CpuTime {
                user: cpu.user.mul_f64(share),
                system: cpu.system.mul_f64(share),
            }
        })
        .collect()
}

/// Files a run opens besides its client sockets, at most: the round-trip
/// prober's socket, an in-process server's (`--local`), a signal pipe.
const OTHER_FILES: u64 = 16;

/// Makes room for `clients` sockets in the process's open-file limit
/// (RLIMIT_NOFILE): raises the soft limit to the hard one when needed, and
/// refuses a run whose sockets cannot fit at all, with the arithmetic: a
/// usage error when fewer clients would fit, a runtime one when not even
/// one would (the limit, not `--clients`, is the mistake).
pub(super) fn make_room(clients: usize) -> Result<()> {
    let sockets = clients as u64;
    let Ok(budget) = sys::make_room_for_files(sockets + OTHER_FILES) else {
        // A platform that does not tell: go ahead.
        return Ok(());
    };
    let sys::FileBudget { hard, open, .. } = budget;
    if open + sockets <= hard {
        return Ok(());
    }
    let arithmetic = format!(
        "this process may open {hard} files (the hard limit, ulimit -Hn) and has {open} open already: {open} + {sockets} > {hard}"
    );
    let raise = "raise the hard limit (ulimit -Hn, LimitNOFILE= in a systemd unit)";
    match hard.checked_sub(open + OTHER_FILES) {
        Some(fit) if fit > 0 => Err(Error::usage(format!(
            "--clients {clients} needs {sockets} sockets, but {arithmetic}; use at most --clients {fit}, or {raise}"
        ))),
        _ => Err(Error::runtime(format!(
            "no room for {sockets} client sockets: {arithmetic}; {raise}"
        ))),
    }
}

/// One client's socket and what it knows before it sends.
struct Opened {
    socket: UdpSocket,
    sndbuf: Option<sys::BufferGrant>,
    local_addr: String,
    session: u64,
}

fn open_client(cfg: &ClientConfig) -> Result<Opened> {
    let socket = open_socket(cfg.server, cfg.connected, cfg.dont_fragment, cfg.bind)?;
    let sndbuf = match cfg.sndbuf {
        Some(want) => Some(sys::size_buffer(
            &socket2::SockRef::from(&socket),
            sys::BufferSide::Send,
            Some(want),
        )?),
        None => None,
    };
    let local_addr = socket
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    Ok(Opened {
        socket,
        sndbuf,
        local_addr,
        session: random_u64(),
    })
}

/// Probes the server from every socket at once; the first client's error
/// if any cannot start.
fn probe_all(
    opened: &[Opened],
    cfg: &ClientConfig,
    shutdown: &Shutdown,
) -> Result<Vec<ServerInfo>> {
    // The probe goes out before GSO is set on the socket: a Hello longer
    // than -b would otherwise be cut into segments.
    let mut plain: Vec<Transmitter> = opened
        .iter()
        .map(|o| {
            Transmitter::new(
                &o.socket,
                cfg.server,
                cfg.connected,
                cfg.buffer_size,
                1,
                GsoChoice::OFF,
            )
        })
        .collect();
    // Two round trips, every socket at once: the cookie, then the Hello
    // that echoes it and creates the session at the server.
    let run = run_of(cfg);
    let questions = opened
        .iter()
        .zip(plain.iter_mut())
        .map(|(o, tx)| probe_question(&o.socket, tx, o.session, run, 0, 0))
        .collect();
    let outcomes: Vec<Exchange<Hearing>> = exchange_all(questions, cfg.server, shutdown);
    let cookies = outcomes
        .into_iter()
        .zip(&plain)
        .map(|(outcome, tx)| probe_outcome(outcome, tx, cfg, false).map(|info| info.cookie))
        .collect::<Result<Vec<u64>>>()?;
    // The confirming Hello asks the server to keep what arrived per
    // interval, when the run draws it.
    let keep = intervals::keep_ns(cfg);
    let questions = opened
        .iter()
        .zip(plain.iter_mut())
        .zip(cookies)
        .map(|((o, tx), cookie)| probe_question(&o.socket, tx, o.session, run, cookie, keep))
        .collect();
    let outcomes: Vec<Exchange<Hearing>> = exchange_all(questions, cfg.server, shutdown);
    outcomes
        .into_iter()
        .zip(&plain)
        .map(|(outcome, tx)| probe_outcome(outcome, tx, cfg, true))
        .collect()
}

/// Runs `count` clients of the run on the calling thread, from their
/// sockets to their reports; `gate` holds them back until every client
/// of the run has probed the server.
pub(super) fn run_worker(
    cfg: &ClientConfig,
    shutdown: &Shutdown,
    progress: &dyn SendProgress,
    gate: &StartGate,
    count: usize,
    gso_off: &GsoOff,
) -> Result<Vec<ClientReport>> {
    let ticket = Ticket {
        gate,
        clients: count,
        used: false,
    };
    let opened = (0..count)
        .map(|_| open_client(cfg))
        .collect::<Result<Vec<Opened>>>()?;
    let infos: Vec<Option<ServerInfo>> = if cfg.no_server {
        vec![None; count]
    } else {
        probe_all(&opened, cfg, shutdown)?
            .into_iter()
            .map(Some)
            .collect()
    };
    if !ticket.ready(true) {
        return Err(Error::runtime(HELD_BACK));
    }
    // The one send loop every sender runs (the server's reverse streams
    // too): pacing, the datagram plan, headers, back-off, intervals.
    let specs: Vec<StreamSpec> = opened
        .iter()
        .map(|o| StreamSpec {
            session: o.session,
            size: cfg.buffer_size,
            volume: cfg.volume,
            rate_bps: cfg.rate_bps,
            precise_pacing: cfg.precise_pacing,
            interval: cfg.interval,
            max_payload: sys::max_udp_payload(&cfg.server),
        })
        .collect();
    let Some(first) = specs.first() else {
        return Ok(Vec::new());
    };
    let gso = GsoChoice {
        request: cfg.gso,
        max_payload: first.max_payload,
        precise_pacing: cfg.precise_pacing,
    };
    let batch = first.batch_for(cfg.batch);
    let mut txs: Vec<Transmitter> = opened
        .iter()
        .map(|o| {
            let mut tx = Transmitter::new(
                &o.socket,
                cfg.server,
                cfg.connected,
                cfg.buffer_size,
                batch,
                gso,
            );
            tx.dont_fragment = cfg.dont_fragment;
            tx.watch_gso(gso_off);
            tx
        })
        .collect();
    let (sent, thread_cpu) = send_streams(&mut txs, &specs, shutdown, progress)?;
    let cpu: Vec<Option<CpuTime>> = match thread_cpu {
        Some(cpu) => apportion(cpu, &sent.iter().map(|s| s.bytes).collect::<Vec<_>>())
            .into_iter()
            .map(Some)
            .collect(),
        None => vec![None; count],
    };
    let answers = ask_for_counts(cfg, &opened, &mut txs, &infos, &sent, shutdown);
    let kept = {
        let asked: Vec<intervals::Asked> = opened
            .iter()
            .zip(&answers)
            .map(|(o, (_, ack))| intervals::Asked {
                socket: &o.socket,
                session: o.session,
                kept: ack.is_some_and(|a| a.flags & wire::ACK_INTERVALS != 0),
            })
            .collect();
        intervals::fetch_all(cfg, &asked, &mut txs, shutdown)
    };
    Ok(opened
        .iter()
        .zip(txs.iter())
        .zip(sent)
        .zip(cpu)
        .zip(answers)
        .zip(&infos)
        .zip(kept)
        .map(|((((((o, tx), sent), cpu), (answer, ack)), info), kept)| {
            let mut r = report(cfg, o, tx, sent, cpu, answer, ack);
            r.server_recv_buffer = info.map(|i| i.recv_buffer).filter(|&b| b > 0);
            r.server_intervals = kept;
            r
        })
        .collect())
}

/// Asks the server, for every client at once, what arrived: each End
/// with its own nonces, on its own socket, in one wait.
fn ask_for_counts(
    cfg: &ClientConfig,
    opened: &[Opened],
    txs: &mut [Transmitter],
    infos: &[Option<ServerInfo>],
    sent: &[Sent],
    shutdown: &Shutdown,
) -> Vec<(Answer, Option<EndAck>)> {
    let mut answers: Vec<(Answer, Option<EndAck>)> = txs
        .iter()
        .zip(infos)
        .map(|(tx, info)| match info {
            _ if tx.gone => (Answer::ServerGone, None),
            None => (Answer::NotAsked, None),
            Some(_) => (Answer::NoAnswer, None),
        })
        .collect();
    let mut asked = Vec::new();
    let mut questions = Vec::new();
    for (i, tx) in txs.iter_mut().enumerate() {
        let (Some(info), false) = (infos[i], tx.gone) else {
            continue;
        };
        let s = &sent[i];
        let end = End {
            header: Header {
                session: opened[i].session,
                seq: s.packets,
                send_time_ns: s.started.elapsed().as_nanos() as u64,
            },
            sent_packets: s.packets,
            sent_bytes: s.bytes,
            duration_ns: s.timing.span().as_nanos() as u64,
            nonce: 0,
            answer_wait_ns: 0,
            sender: None,
            tag: [0; wire::TAG_LEN],
        };
        let mut wait = cfg.end_timeout + info.end_grace;
        if shutdown.is_triggered() {
            // Stopped by a signal: one quick question, not a long wait.
            wait = wait.min(info.end_grace + SIGNALLED_WAIT);
        }
        questions.push(end_question(&opened[i].socket, tx, cfg, end, wait));
        asked.push(i);
    }
    for (i, outcome) in asked
        .into_iter()
        .zip(exchange_all(questions, cfg.server, shutdown))
    {
        answers[i] = match end_answer(outcome) {
            Some(ack) if ack.flags & wire::ACK_NO_RECORD != 0 => (Answer::NoRecord, None),
            Some(ack) => (Answer::Answered, Some(ack)),
            None => (Answer::NoAnswer, None),
        };
    }
    answers
}

/// One client's report, from what it sent and what the server answered.
fn report(
    cfg: &ClientConfig,
    opened: &Opened,
    tx: &Transmitter,
    sent: Sent,
    cpu: Option<CpuTime>,
    answer: Answer,
    ack: Option<EndAck>,
) -> ClientReport {
    let Sent {
        packets,
        bytes,
        untagged,
        timing,
        loop_time,
        intervals,
        paced,
        send_blocked,
        ..
    } = sent;
    let span = timing.span();
    ClientReport {
        session: format!("{:016x}", opened.session),
        local_addr: opened.local_addr.clone(),
        sent_packets: packets,
        sent_bytes: bytes,
        untagged_packets: untagged,
        seconds: span.as_secs_f64(),
        gbps: stats::rate_gbps(bytes.saturating_sub(timing.first_bytes), span),
        enobufs_retries: tx.enobufs_retries,
        backoff_seconds: tx.backoff_time.as_secs_f64(),
        send_blocked_seconds: send_blocked.map(|d| d.as_secs_f64()),
        send_path: tx.path(),
        sndbuf: opened.sndbuf.clone(),
        cpu: cpu.map(|c| CpuCost::of(c, loop_time, bytes).on_threads(1)),
        pacing: paced.map(|p| PacingReport {
            mode: if cfg.precise_pacing {
                "precise"
            } else {
                "batches"
            },
            burst_bound: p.burst_bound,
            behind_seconds: p.behind.as_secs_f64(),
        }),
        intervals,
        answer,
        server: ack
            .as_ref()
            .map(|a| server_view(&[(a, packets)], timing.first_call.map(|_| span))),
        timing,
        cpu_used: cpu,
        loop_time,
        ack,
        server_recv_buffer: None,
        server_intervals: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_bounded_by_the_cores_and_the_clients() {
        assert_eq!(workers_for(1, 8), 1);
        assert_eq!(workers_for(100, 2), 2);
        assert_eq!(workers_for(3, 8), 3);
        assert_eq!(workers_for(5, 0), 1);
        assert_eq!(shares(100, 2), [50, 50]);
        assert_eq!(shares(7, 3), [3, 2, 2]);
        assert_eq!(shares(1, 1), [1]);
        assert_eq!(shares(2, 4), [1, 1]);
        assert_eq!(shares(1000, 2).iter().sum::<usize>(), 1000);
    }

    #[test]
    fn cpu_is_shared_by_bytes_and_adds_up() {
        let ms = Duration::from_millis;
        let cpu = CpuTime {
            user: ms(300),
            system: ms(900),
        };
        let parts = apportion(cpu, &[1000, 3000, 0]);
        assert_eq!(parts[0].user, ms(75));
        assert_eq!(parts[1].system, ms(675));
        assert_eq!(parts[2].total(), Duration::ZERO);
        let sum = parts.iter().fold(CpuTime::default(), |a, b| a.plus(*b));
        assert!(sum.total().abs_diff(cpu.total()) < Duration::from_micros(1));
        // Nothing sent: equal shares.
        let even = apportion(cpu, &[0, 0]);
        assert_eq!(even[0].total(), ms(600));
    }
}
