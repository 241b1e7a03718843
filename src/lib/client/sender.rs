//! One client socket's run: probe, send the volume on the meter's
//! send path (paced or not), and ask for the server's count; and the gate
//! that holds every client back until all of them can start.

use super::*;
pub(super) use crate::meter::stream::SendTiming;
use crate::meter::stream::{send_stream, Sent, StreamSpec};
pub use crate::meter::stream::{NoProgress, SendProgress};

/// After a signal ended the test, how long (beyond the server's grace
/// period) the client still waits for the answer.
pub(super) const SIGNALLED_WAIT: Duration = Duration::from_millis(300);

/// Holds every client back until all of them have probed the server: if
/// one cannot start (no room for it, say), none sends, so that no data is
/// sent for a report that will not be printed.
pub struct StartGate {
    pub(super) state: Mutex<(usize, bool)>,
    pub(super) all_ready: Condvar,
    pub(super) clients: usize,
}

/// The message of a client that did not start because another could not.
pub(super) const HELD_BACK: &str = "held back: another client could not start";

impl StartGate {
    pub fn new(clients: usize) -> Self {
        StartGate {
            state: Mutex::new((0, false)),
            all_ready: Condvar::new(),
            clients,
        }
    }

    /// One client says whether it could start; returns whether all could,
    /// once every client has said.
    fn ready(&self, ok: bool) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.0 += 1;
        state.1 |= !ok;
        if state.0 >= self.clients {
            self.all_ready.notify_all();
        }
        while state.0 < self.clients {
            state = self
                .all_ready
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
        !state.1
    }
}

/// A client's place at the [`StartGate`]; says "could not start" if
/// dropped unused (an error or a panic before the probe ended).
pub(super) struct Ticket<'a> {
    pub(super) gate: &'a StartGate,
    pub(super) used: bool,
}

impl Ticket<'_> {
    fn ready(mut self, ok: bool) -> bool {
        self.used = true;
        self.gate.ready(ok)
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.used {
            self.gate.ready(false);
        }
    }
}

/// Runs one client socket to the end and asks the server for its figures.
/// `gate` holds it back until every client of the run has probed the
/// server.
pub fn run_one(
    cfg: &ClientConfig,
    shutdown: &Shutdown,
    progress: &dyn SendProgress,
    gate: &StartGate,
) -> Result<ClientReport> {
    let ticket = Ticket { gate, used: false };
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
    let session = random_u64();
    let size = cfg.buffer_size;
    // The probe goes out before GSO is set on the socket: a Hello longer
    // than -b would otherwise be cut into segments.
    let info = if cfg.no_server {
        None
    } else {
        let mut plain =
            Transmitter::new(&socket, cfg.server, cfg.connected, size, 1, GsoChoice::OFF);
        Some(probe(&socket, &mut plain, cfg, session, shutdown)?)
    };
    if !ticket.ready(true) {
        return Err(Error::runtime(HELD_BACK));
    }
    // The one send loop every sender runs (the server's reverse streams
    // too): pacing, the datagram plan, headers, back-off, intervals.
    let spec = StreamSpec {
        session,
        size,
        volume: cfg.volume,
        rate_bps: cfg.rate_bps,
        precise_pacing: cfg.precise_pacing,
        interval: cfg.interval,
        max_payload: sys::max_udp_payload(&cfg.server),
    };
    let gso = GsoChoice {
        request: cfg.gso,
        max_payload: spec.max_payload,
        precise_pacing: cfg.precise_pacing,
    };
    let batch = spec.batch_for(cfg.batch);
    let mut tx = Transmitter::new(&socket, cfg.server, cfg.connected, size, batch, gso);
    tx.dont_fragment = cfg.dont_fragment;
    let Sent {
        packets,
        bytes,
        untagged,
        timing,
        started: start,
        loop_time,
        intervals,
        cpu: cpu_used,
        paced,
    } = send_stream(&mut tx, &spec, shutdown, progress)?;
    let session_text = format!("{session:016x}");
    let span = timing.span();
    let end = End {
        header: Header {
            session,
            seq: packets,
            send_time_ns: start.elapsed().as_nanos() as u64,
        },
        sent_packets: packets,
        sent_bytes: bytes,
        duration_ns: span.as_nanos() as u64,
        nonce: 0,
        answer_wait_ns: 0,
        sender: None,
        tag: [0; wire::TAG_LEN],
    };
    let server_recv_buffer = info.map(|i| i.recv_buffer).filter(|&b| b > 0);
    let (answer, ack) = match info {
        None => (Answer::NotAsked, None),
        Some(_) if tx.gone => (Answer::ServerGone, None),
        Some(info) => {
            let mut wait = cfg.end_timeout + info.end_grace;
            if shutdown.is_triggered() {
                // Stopped by a signal: one quick question, not a long wait.
                wait = wait.min(info.end_grace + SIGNALLED_WAIT);
            }
            match end_of_test(&socket, &mut tx, cfg, end, wait, shutdown) {
                Some(ack) if ack.flags & wire::ACK_NO_RECORD != 0 => (Answer::NoRecord, None),
                Some(ack) => (Answer::Answered, Some(ack)),
                None => (Answer::NoAnswer, None),
            }
        }
    };
    let answer = if tx.gone && answer == Answer::NotAsked {
        Answer::ServerGone
    } else {
        answer
    };
    Ok(ClientReport {
        session: session_text,
        local_addr,
        sent_packets: packets,
        sent_bytes: bytes,
        untagged_packets: untagged,
        seconds: span.as_secs_f64(),
        gbps: stats::rate_gbps(bytes.saturating_sub(timing.first_bytes), span),
        enobufs_retries: tx.enobufs_retries,
        backoff_seconds: tx.backoff_time.as_secs_f64(),
        send_path: tx.path(),
        sndbuf,
        cpu: cpu_used.map(|c| CpuCost::of(c, loop_time, bytes)),
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
        cpu_used,
        loop_time,
        ack,
        server_recv_buffer,
    })
}

/// The payload bytes a run will send, when its volume is a size.
pub fn planned_bytes(cfg: &ClientConfig) -> Option<u64> {
    match cfg.volume {
        Volume::Bytes(t) => Some(t * cfg.clients as u64),
        Volume::Packets(n) => Some(n * cfg.buffer_size as u64 * cfg.clients as u64),
        Volume::Time(_) => None,
    }
}
