//! The control exchanges with a udp_server: the socket a client sends
//! from, one question asked until answered (retries, nonces, the
//! server's address only, a signal ends the wait), the start probe, and
//! the end-of-test exchange.

use super::*;

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

/// Asks the server one question ([`ATTEMPTS`] times within `wait`, each
/// with a fresh nonce) until `accept` takes an answer that came from
/// `server` and echoes one of the nonces sent (`accept` gets the decoded
/// message, its bytes and the nonces). A signal that arrives while it
/// waits ends it within [`WAKE`].
pub(super) fn exchange<T>(
    socket: &UdpSocket,
    tx: &mut Transmitter,
    server: SocketAddr,
    wait: Duration,
    shutdown: &Shutdown,
    mut ask: impl FnMut(u64) -> Vec<u8>,
    mut accept: impl FnMut(Message, &[u8], &[u64]) -> Option<T>,
) -> Exchange<T> {
    let per_attempt = wait / ATTEMPTS;
    let mut nonces = Vec::with_capacity(ATTEMPTS as usize);
    let mut refused = false;
    let mut buf = [0u8; 512];
    // A signal that already came (it ended the test) does not cut the
    // exchange short: the caller gave it a short `wait` instead.
    let signalled_before = shutdown.is_triggered();
    for _ in 0..ATTEMPTS {
        let nonce = random_u64();
        nonces.push(nonce);
        // A refusal here is counted by the transmitter; keep listening.
        if let Ok(0) = tx.send_control(&ask(nonce)) {
            refused = true;
        }
        let deadline = Instant::now() + per_attempt;
        loop {
            if !signalled_before && shutdown.is_triggered() {
                return Exchange::Interrupted;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let _ = socket.set_read_timeout(Some(left.min(WAKE)));
            let (n, from) = match socket.recv_from(&mut buf) {
                Ok(got) => got,
                Err(e) if sys::is_refused(&e) => {
                    refused = true;
                    continue;
                }
                Err(_) => continue,
            };
            // Only the address asked answers; anything else is not ours.
            if sys::canonical_addr(from) != sys::canonical_addr(server) {
                continue;
            }
            if let Ok(message) = wire::decode(&buf[..n]) {
                if let Some(answer) = accept(message, &buf[..n], &nonces) {
                    return Exchange::Answered(answer);
                }
            }
        }
    }
    if refused {
        Exchange::Refused
    } else {
        Exchange::Silent
    }
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
/// we agree about the pre-shared key?
pub(super) fn probe(
    socket: &UdpSocket,
    tx: &mut Transmitter,
    cfg: &ClientConfig,
    session: u64,
    shutdown: &Shutdown,
) -> Result<ServerInfo> {
    let server = cfg.server;
    let started = Instant::now();
    let ask = |nonce| {
        wire::encode_hello(&Hello {
            header: Header {
                session,
                seq: 0,
                send_time_ns: started.elapsed().as_nanos() as u64,
            },
            nonce,
        })
        .to_vec()
    };
    let accept = |message, _: &[u8], nonces: &[u64]| match message {
        Message::HelloAck(ack) if ack.session == session && nonces.contains(&ack.nonce) => {
            Some(ack)
        }
        _ => None,
    };
    let ack = match exchange(socket, tx, server, PROBE_TIMEOUT, shutdown, ask, accept) {
        Exchange::Answered(ack) => ack,
        Exchange::Refused => return Err(tx.nobody_listening()),
        Exchange::Interrupted => {
            return Err(Error::runtime("interrupted before the test began"))
        }
        Exchange::Silent => {
            return Err(Error::runtime(format!(
                "no udp_server answered at {server} within {} s: check the address, that udp_server runs there, and that UDP is not filtered on the way (to send to something that is not udp_server, such as nc or sockperf, add --no-server)",
                PROBE_TIMEOUT.as_secs()
            )))
        }
    };
    if ack.flags & wire::ACK_BUSY != 0 {
        return Err(Error::runtime(format!(
            "the udp_server at {server} is full: its session table (--max-peers), or this address's share of it, is in use; try again later"
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

/// Sends End messages until the server answers one of them, or `wait`
/// passes. With a pre-shared key, the End is tagged and only a tagged
/// answer counts.
pub(super) fn end_of_test(
    socket: &UdpSocket,
    tx: &mut Transmitter,
    cfg: &ClientConfig,
    end: End,
    wait: Duration,
    shutdown: &Shutdown,
) -> Option<EndAck> {
    tx.end_gso();
    let session = end.header.session;
    let psk = cfg.psk.as_ref();
    let ask = |nonce| {
        let mut this = end;
        this.nonce = nonce;
        this.answer_wait_ns = wait.as_nanos() as u64;
        match psk {
            Some(psk) => wire::encode_end_tagged(&this, psk).to_vec(),
            None => wire::encode_end(&this).to_vec(),
        }
    };
    let accept = |message, raw: &[u8], nonces: &[u64]| match message {
        Message::EndAck(ack)
            if ack.session == session
                && nonces.contains(&ack.nonce)
                && psk.is_none_or(|psk| wire::verify_tag(raw, psk)) =>
        {
            Some(ack)
        }
        _ => None,
    };
    match exchange(socket, tx, cfg.server, wait, shutdown, ask, accept) {
        Exchange::Answered(ack) => Some(ack),
        Exchange::Refused | Exchange::Silent | Exchange::Interrupted => None,
    }
}
