//! The control exchanges with a udp_server: the socket a client sends
//! from, one question asked until answered (retries, nonces, the
//! server's address only, a signal ends the wait), the start probe, and
//! the end-of-test exchange.

use super::*;
use crate::wire::HelloAck;

/// Attempts of each control exchange (probe, End) within its time.
pub(super) const ATTEMPTS: u32 = 5;
/// Creates a client socket for `server`: bound (to `bind`, or any
/// address), send errors on, optionally don't-fragment, optionally
/// connected. `sockbench ceiling` opens its sender with it too.
pub fn open_socket(
    server: SocketAddr,
    connected: bool,
    dont_fragment: bool,
    bind: Option<SocketAddr>,
) -> Result<UdpSocket> {
    let socket = Socket::new(
        Domain::for_address(server),
        Type::DGRAM,
        Some(Protocol::UDP),
    )
    .map_err(|e| Error::runtime(format!("cannot create a UDP socket: {e}")))?;
    let local: SocketAddr = match bind {
        Some(addr) => addr,
        None if server.is_ipv6() => (Ipv6Addr::UNSPECIFIED, 0).into(),
        None => (Ipv4Addr::UNSPECIFIED, 0).into(),
    };
    socket.bind(&local.into()).map_err(|e| match bind {
        Some(addr) => Error::runtime(format!(
            "cannot bind a client socket to {addr} (--bind): {e}"
        )),
        None => Error::runtime(format!("cannot bind a client socket: {e}")),
    })?;
    // Without this, Linux silently drops datagrams its own queue refused.
    let _ = sys::enable_send_errors(&socket);
    if dont_fragment {
        sys::set_dont_fragment(&socket, server.is_ipv6())
            .map_err(|e| Error::runtime(format!("cannot set the don't-fragment option: {e}")))?;
    }
    if connected {
        socket
            .connect(&server.into())
            .map_err(|e| Error::runtime(format!("cannot connect to {server}: {e}")))?;
    }
    Ok(socket.into())
}

/// How a control exchange ended.
pub(super) enum Exchange<T> {
    Answered(T),
    /// The host said "port unreachable".
    Refused,
    Silent,
    /// A signal came while it waited.
    Interrupted,
}

/// How long one wait of an exchange may last before it looks at the
/// shutdown flag again.
pub(super) const WAKE: Duration = Duration::from_millis(50);

/// One control question on one socket, for [`exchange_all`]: `ask` lays
/// out the question with a nonce, `accept` takes an answer (the decoded
/// message, its bytes and the nonces sent so far) or ignores it.
pub(super) struct Question<'q, 'a, T> {
    pub(super) socket: &'q UdpSocket,
    pub(super) tx: &'q mut Transmitter<'a>,
    /// How long to ask, all attempts together.
    pub(super) wait: Duration,
    pub(super) ask: Box<dyn FnMut(u64) -> Vec<u8> + 'q>,
    #[allow(clippy::type_complexity)]
    pub(super) accept: Box<dyn FnMut(Message, &[u8], &[u64]) -> Option<T> + 'q>,
}

/// Asks the server one question ([`ATTEMPTS`] times within `wait`, each
/// with a fresh nonce) until `accept` takes an answer that came from
/// `server` and echoes one of the nonces sent (`accept` gets the decoded
/// message, its bytes and the nonces). A signal that arrives while it
/// waits ends it within [`WAKE`]. One socket's [`exchange_all`].
pub(super) fn exchange<T>(
    socket: &UdpSocket,
    tx: &mut Transmitter,
    server: SocketAddr,
    wait: Duration,
    shutdown: &Shutdown,
    ask: impl FnMut(u64) -> Vec<u8>,
    accept: impl FnMut(Message, &[u8], &[u64]) -> Option<T>,
) -> Exchange<T> {
    let question = Question {
        socket,
        tx,
        wait,
        ask: Box::new(ask),
        accept: Box::new(accept),
    };
    let mut outcomes = exchange_all(vec![question], server, shutdown);
    outcomes.pop().unwrap_or(Exchange::Silent)
}

/// Where one question of [`exchange_all`] stands.
struct Asking {
    nonces: Vec<u64>,
    /// When the current attempt stops waiting (None before the first).
    deadline: Option<Instant>,
    refused: bool,
}

/// Asks every question at once, each on its own socket, as [`exchange`]
/// asks one: its attempts, fresh nonces, answers from `server` only. One
/// thread waits for all the sockets in one poll, so a thread with a
/// thousand clients asks a thousand questions in the time of one. Returns
/// each question's outcome, in order.
pub(super) fn exchange_all<T>(
    mut questions: Vec<Question<'_, '_, T>>,
    server: SocketAddr,
    shutdown: &Shutdown,
) -> Vec<Exchange<T>> {
    let mut outcomes: Vec<Option<Exchange<T>>> = questions.iter().map(|_| None).collect();
    let mut asking: Vec<Asking> = questions
        .iter()
        .map(|_| Asking {
            nonces: Vec::with_capacity(ATTEMPTS as usize),
            deadline: None,
            refused: false,
        })
        .collect();
    // Room for the largest answer: a page of intervals.
    let mut buf = [0u8; 2048];
    let (mut polled, mut waiting, mut ready, mut scratch) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // A signal that already came (it ended the test) does not cut the
    // exchange short: the caller gave it a short `wait` instead.
    let signalled_before = shutdown.is_triggered();
    loop {
        if !signalled_before && shutdown.is_triggered() {
            for outcome in outcomes.iter_mut().filter(|o| o.is_none()) {
                *outcome = Some(Exchange::Interrupted);
            }
            break;
        }
        // Send the attempts that are due; close the questions whose last
        // attempt has waited its time.
        let now = Instant::now();
        for (i, q) in questions.iter_mut().enumerate() {
            let a = &mut asking[i];
            if outcomes[i].is_some() || a.deadline.is_some_and(|d| d > now) {
                continue;
            }
            if a.nonces.len() as u32 >= ATTEMPTS {
                outcomes[i] = Some(if a.refused {
                    Exchange::Refused
                } else {
                    Exchange::Silent
                });
                continue;
            }
            let nonce = random_u64();
            a.nonces.push(nonce);
            // A refusal here is counted by the transmitter; keep listening.
            if let Ok(0) = q.tx.send_control(&(q.ask)(nonce)) {
                a.refused = true;
            }
            a.deadline = Some(Instant::now() + q.wait / ATTEMPTS);
        }
        polled.clear();
        waiting.clear();
        let mut next = now + WAKE;
        for (i, q) in questions.iter().enumerate() {
            if outcomes[i].is_none() {
                polled.push(q.socket);
                waiting.push(i);
                next = next.min(asking[i].deadline.unwrap_or(now));
            }
        }
        if waiting.is_empty() {
            break;
        }
        ready.clear();
        ready.resize(polled.len(), false);
        // poll(2) counts whole milliseconds: round up, or a wait of less
        // than one would return at once, again and again.
        let left = next.saturating_duration_since(Instant::now());
        let timeout = left.max(Duration::from_millis(1));
        match sys::poll_readable(&polled, timeout, &mut ready, &mut scratch) {
            Ok(_) => {}
            // A signal: look at the flag and the deadlines again.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // poll itself failed: look at every socket, a millisecond
            // apart, rather than not at all.
            Err(_) => {
                std::thread::sleep(timeout.min(Duration::from_millis(1)));
                ready.fill(true);
            }
        }
        for (k, &i) in waiting.iter().enumerate() {
            if !ready[k] {
                continue;
            }
            let q = &mut questions[i];
            let a = &mut asking[i];
            loop {
                let (n, from) = match sys::recv_from_nowait(q.socket, &mut buf) {
                    Ok(got) => got,
                    Err(e) if sys::is_refused(&e) => {
                        a.refused = true;
                        continue;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                // Only the address asked answers; anything else is not ours.
                if from.map(sys::canonical_addr) != Some(sys::canonical_addr(server)) {
                    continue;
                }
                if let Ok(message) = wire::decode(&buf[..n]) {
                    if let Some(answer) = (q.accept)(message, &buf[..n], &a.nonces) {
                        outcomes[i] = Some(Exchange::Answered(answer));
                        break;
                    }
                }
            }
            // Each ICMP error stays queued, and keeps the socket "ready",
            // until read.
            if sys::drain_error_queue(q.socket) > 0 {
                a.refused = true;
            }
        }
    }
    outcomes
        .into_iter()
        .map(|o| o.unwrap_or(Exchange::Silent))
        .collect()
}

/// What the probe learned about the server.
#[derive(Debug, Clone, Copy)]
pub(super) struct ServerInfo {
    pub(super) end_grace: Duration,
    /// The HelloAck's address cookie (0 from a server without reverse
    /// streams).
    pub(super) cookie: u64,
    /// The receive buffer the server's kernel granted (0: not said).
    pub(super) recv_buffer: u64,
}

/// The start probe: is a udp_server at `server`, with room for us, and do
/// we agree about the pre-shared key? Two round trips when `confirm`: a
/// Hello brings the address cookie, and a Hello that echoes it creates
/// the session at the server, proven (an upload's data counts only then);
/// one without (a reverse stream's Start echoes the cookie instead).
pub(super) fn probe(
    socket: &UdpSocket,
    tx: &mut Transmitter,
    cfg: &ClientConfig,
    session: u64,
    confirm: bool,
    shutdown: &Shutdown,
) -> Result<ServerInfo> {
    let run = run_of(cfg);
    let question = probe_question(socket, tx, session, run, 0, 0);
    let outcome = exchange_all(vec![question], cfg.server, shutdown).pop();
    let info = probe_outcome(outcome.unwrap_or(Exchange::Silent), tx, cfg, false)?;
    if !confirm {
        return Ok(info);
    }
    let question = probe_question(socket, tx, session, run, info.cookie, 0);
    let outcome = exchange_all(vec![question], cfg.server, shutdown).pop();
    probe_outcome(outcome.unwrap_or(Exchange::Silent), tx, cfg, true)
}

/// The run a Hello or a Start names: the configured one, or a run of
/// this config's clients that says no id.
pub(super) fn run_of(cfg: &ClientConfig) -> wire::Run {
    cfg.run.unwrap_or(wire::Run {
        id: 0,
        clients: cfg.clients as u64,
    })
}

/// The start probe's question (a Hello) for session `session`: with
/// `cookie` 0 it asks for the address cookie; with the cookie, it
/// confirms, and asks the server to keep the session's figures per
/// interval of `keep_intervals_ns` (0: none; [`intervals`]). A version
/// negotiation answer is taken too.
pub(super) fn probe_question<'q, 'a>(
    socket: &'q UdpSocket,
    tx: &'q mut Transmitter<'a>,
    session: u64,
    run: wire::Run,
    cookie: u64,
    keep_intervals_ns: u64,
) -> Question<'q, 'a, Hearing> {
    let started = Instant::now();
    let ask = move |nonce| {
        wire::encode_hello(&Hello {
            header: Header {
                session,
                seq: keep_intervals_ns,
                send_time_ns: started.elapsed().as_nanos() as u64,
            },
            nonce,
            run,
            cookie,
        })
        .to_vec()
    };
    let accept = move |message, _: &[u8], nonces: &[u64]| match message {
        Message::HelloAck(ack) if ack.session == session && nonces.contains(&ack.nonce) => {
            Some(Hearing::Ack(ack))
        }
        Message::Versions(v) if v.session == session => Some(Hearing::Versions(v)),
        _ => None,
    };
    Question {
        socket,
        tx,
        wait: PROBE_TIMEOUT,
        ask: Box::new(ask),
        accept: Box::new(accept),
    }
}

/// What a Hello heard back.
#[derive(Debug, Clone, Copy)]
pub(super) enum Hearing {
    Ack(HelloAck),
    /// The server speaks other versions of the protocol.
    Versions(wire::Versions),
}

/// What the probe's outcome means: what it learned about the server, or
/// why the run cannot start (`tx` is the transmitter it asked with).
/// `confirmed`: the Hello echoed the cookie, so the answer must say the
/// session exists.
pub(super) fn probe_outcome(
    outcome: Exchange<Hearing>,
    tx: &Transmitter,
    cfg: &ClientConfig,
    confirmed: bool,
) -> Result<ServerInfo> {
    let server = cfg.server;
    let ack = match outcome {
        Exchange::Answered(Hearing::Ack(ack)) => ack,
        Exchange::Answered(Hearing::Versions(v)) => {
            return Err(Error::runtime(other_version(server, &v)))
        }
        Exchange::Refused => return Err(tx.nobody_listening()),
        Exchange::Interrupted => {
            return Err(Error::runtime("interrupted before the test began"))
        }
        Exchange::Silent => {
            return Err(Error::runtime(format!(
                "no udp_server answered at {server} within {} s: check the address, that udp_server runs there (of this release or a later one: older ones do not answer other versions), and that UDP is not filtered on the way (to send to something that is not udp_server, such as nc or sockperf, add --no-server)",
                PROBE_TIMEOUT.as_secs()
            )))
        }
    };
    if ack.flags & wire::ACK_BUSY != 0 {
        return Err(Error::runtime(format!(
            "the udp_server at {server} is full: its session table (--max-peers), or this address's share of it, is in use; try again later"
        )));
    }
    if confirmed && ack.flags & wire::ACK_PROVEN == 0 {
        return Err(Error::runtime(format!(
            "the udp_server at {server} did not take this address's cookie back (the address changed between two Hellos: a NAT that remaps ports?)"
        )));
    }
    let server_has_key = ack.flags & wire::ACK_AUTH != 0;
    match (server_has_key, cfg.psk.is_some()) {
        (true, false) => {
            return Err(Error::usage(format!(
                "the udp_server at {server} requires a pre-shared key: add --psk or --psk-file"
            )))
        }
        (false, true) => {
            return Err(Error::usage(format!(
                "the udp_server at {server} has no pre-shared key, but --psk was given: start it with the same --psk"
            )))
        }
        _ => {}
    }
    Ok(ServerInfo {
        end_grace: Duration::from_nanos(ack.end_grace_ns).min(crate::config::MAX_END_GRACE),
        cookie: ack.cookie,
        recv_buffer: ack.recv_buffer,
    })
}

/// Why a server that answered with a version negotiation cannot be used.
pub fn other_version(server: SocketAddr, v: &wire::Versions) -> String {
    let spoken: Vec<String> = v.spoken().iter().map(u8::to_string).collect();
    format!(
        "the udp_server at {server} speaks wire version {}; this udp_client speaks {}: run the same release on both hosts (`udp_server --version`, `udp_client --version`)",
        spoken.join(", "),
        wire::VERSION
    )
}

/// The end-of-test question: `end`, asked until the server answers one of
/// its copies, for `wait`. With a pre-shared key, the End is tagged and
/// only a tagged answer counts. Turns GSO off on `tx` first.
pub(super) fn end_question<'q, 'a>(
    socket: &'q UdpSocket,
    tx: &'q mut Transmitter<'a>,
    cfg: &'q ClientConfig,
    end: End,
    wait: Duration,
) -> Question<'q, 'a, EndAck> {
    tx.end_gso();
    let session = end.header.session;
    let psk = cfg.psk.as_ref();
    let ask = move |nonce| {
        let mut this = end;
        this.nonce = nonce;
        this.answer_wait_ns = wait.as_nanos() as u64;
        match psk {
            Some(psk) => wire::encode_end_tagged(&this, psk).to_vec(),
            None => wire::encode_end(&this).to_vec(),
        }
    };
    let accept = move |message, raw: &[u8], nonces: &[u64]| match message {
        Message::EndAck(ack)
            if ack.session == session
                && nonces.contains(&ack.nonce)
                && psk.is_none_or(|psk| wire::verify_tag(raw, psk)) =>
        {
            Some(ack)
        }
        _ => None,
    };
    Question {
        socket,
        tx,
        wait,
        ask: Box::new(ask),
        accept: Box::new(accept),
    }
}

/// The server's answer to an End, if it came.
pub(super) fn end_answer(outcome: Exchange<EndAck>) -> Option<EndAck> {
    match outcome {
        Exchange::Answered(ack) => Some(ack),
        Exchange::Refused | Exchange::Silent | Exchange::Interrupted => None,
    }
}
