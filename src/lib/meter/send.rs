//! The send paths: one datagram per call, `--batch N` datagrams per
//! sendmmsg call, `--gso` super-buffers cut by the kernel (UDP_SEGMENT),
//! or both. Whatever the path, a datagram is never skipped: a full queue
//! (ENOBUFS, EAGAIN) means back off and send the same message again.
//!
//! The default is the fastest exact path the platform has: on Linux a
//! connected socket, sendmmsg batches and GSO wherever a buffer holds two
//! or more datagrams ([`GsoRequest::Auto`]). `--plain-send` restores seed
//! 001's one `sendto` per datagram, for comparisons.
//!
//! GSO is probed on the first real send: 128 segments per call (newer
//! kernels), then 64 on EINVAL, then plain sends on EINVAL (an old
//! kernel), EMSGSIZE (a segment larger than the path MTU) or EIO (IPsec, or a device
//! without checksum offload on kernels before 6.11). The message that failed is re-sent in
//! smaller pieces, so the probe costs no datagram. The report says which
//! path was really used.

use super::pace::Backoff;
use crate::error::{Error, Result};
use crate::shutdown::Shutdown;
use crate::sys::{self, SendFailure};
use serde::Serialize;
use socket2::SockRef;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

/// What the user asked of UDP GSO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GsoRequest {
    /// The default: on where the platform has it and a buffer holds two
    /// or more datagrams; off, with the reason in the report, elsewhere.
    #[default]
    Auto,
    /// `--gso`: on, or off with the kernel's reason.
    On,
    /// `--no-gso` or `--plain-send`.
    Off,
}

/// ECONNREFUSED answers (ICMP port unreachable, surfaced by IP_RECVERR)
/// after which we conclude that nobody is listening and stop sending.
pub const MAX_REFUSED: u64 = 3;
/// The segment count newer kernels accept per GSO send (UDP_MAX_SEGMENTS).
pub const GSO_SEGMENTS_NEW: usize = 128;
/// The count older kernels accept.
pub const GSO_SEGMENTS_OLD: usize = 64;

/// Whether to try UDP_SEGMENT for `size`-byte datagrams, or why not.
fn decide_gso(choice: GsoChoice, size: usize) -> std::result::Result<(), Gso> {
    let GsoChoice {
        request,
        max_payload,
        precise_pacing,
    } = choice;
    match request {
        GsoRequest::Off => Err(Gso::NotRequested),
        GsoRequest::On => Ok(()),
        GsoRequest::Auto if !sys::LINUX_SOCKETS => Err(Gso::Off("UDP GSO is Linux-only".into())),
        GsoRequest::Auto if size == 0 => Err(Gso::Off("0-byte datagrams".into())),
        GsoRequest::Auto if size.saturating_mul(2) > max_payload => Err(Gso::Off(format!(
            "one {size}-byte datagram fills a buffer; GSO would not save a call"
        ))),
        GsoRequest::Auto if precise_pacing => Err(Gso::Off(
            "--precise-pacing sends each datagram at its own time".into(),
        )),
        GsoRequest::Auto => Ok(()),
    }
}

/// What the GSO path is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gso {
    NotRequested,
    /// On, with at most this many segments per send.
    On(usize),
    /// Asked for, but off, for this reason.
    Off(String),
}

/// How the datagrams were really sent, for the report.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, Serialize)]
pub struct SendPath {
    /// The system call and offload, in a word: `sendto`, `send`,
    /// `sendmmsg`, `send+gso` or `sendmmsg+gso`.
    pub name: String,
    /// Datagrams (or GSO buffers) handed to the kernel per call.
    pub batch: usize,
    /// "on", "off" or "not requested".
    pub gso: String,
    /// Segments per GSO buffer, when on.
    pub gso_segments: Option<usize>,
    /// Why a requested feature is off.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Data send calls (sendmsg/sendto/sendmmsg) that the kernel accepted;
    /// the start probe and the End are not data.
    pub calls: u64,
}

/// The GSO part of a send path: what was asked, and what decides `Auto`.
#[derive(Debug, Clone, Copy)]
pub struct GsoChoice {
    pub request: GsoRequest,
    /// The largest UDP payload of the address family.
    pub max_payload: usize,
    pub precise_pacing: bool,
}

impl GsoChoice {
    /// No GSO: control messages and the start probe.
    pub const OFF: GsoChoice = GsoChoice {
        request: GsoRequest::Off,
        max_payload: 0,
        precise_pacing: false,
    };
}

/// Sends messages (datagrams or GSO buffers) with retries and fallbacks.
pub struct Transmitter<'a> {
    socket: &'a UdpSocket,
    /// Where the datagrams go.
    dest: SocketAddr,
    connected: bool,
    /// The socket is shared with other senders (the server's, which also
    /// answers other peers): GSO goes per call, never as a socket option,
    /// and every call is a sendmmsg that names the source address.
    shared: bool,
    size: usize,
    batch: usize,
    /// The don't-fragment option is set (for error messages).
    pub dont_fragment: bool,
    mmsg: Option<sys::SendBatch>,
    pub gso: Gso,
    notes: Vec<String>,
    backoff: Backoff,
    pub enobufs_retries: u64,
    pub backoff_time: Duration,
    pub refused: u64,
    /// The host said "port unreachable" [`MAX_REFUSED`] times while data
    /// was being sent: nothing listens there (any more).
    pub gone: bool,
    calls: u64,
    /// Set by a watcher of the sender's own qdisc (`client::egress`): turn
    /// GSO off before the next data message, for this reason.
    gso_off: Option<&'a GsoOff>,
}

/// A request, from another thread, to stop using GSO: the sender's own
/// qdisc drops datagrams of the buffers it cuts, which no send hears of.
#[derive(Debug, Default)]
pub struct GsoOff {
    requested: std::sync::atomic::AtomicBool,
    why: std::sync::Mutex<Option<String>>,
}

impl GsoOff {
    /// Asks every transmitter watching this to turn GSO off, for `why`.
    pub fn request(&self, why: String) {
        *self.why.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        self.requested
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Why, once requested.
    pub fn why(&self) -> Option<String> {
        if !self.requested.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        self.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// What a send is for, which decides what a refusal means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Data messages: stop between messages once the host has refused
    /// [`MAX_REFUSED`] times.
    Data,
    /// A piece of a data message: sent whatever happens.
    Piece,
    /// A control message: give up on a refusal; the answer will not come.
    Control,
}

fn is_gso_refusal(e: &io::Error) -> bool {
    sys::gso_refusal(e).is_some()
}

impl<'a> Transmitter<'a> {
    /// `size` is the datagram payload size; `batch` messages per call;
    /// `gso` says whether to use UDP_SEGMENT; `max_payload` is the largest
    /// UDP payload of the address family.
    pub fn new(
        socket: &'a UdpSocket,
        server: SocketAddr,
        connected: bool,
        size: usize,
        batch: usize,
        gso: GsoChoice,
    ) -> Self {
        let mut notes = Vec::new();
        let mut batch = batch.max(1);
        if batch > 1 && !sys::LINUX_SOCKETS {
            notes.push("sendmmsg is Linux-only: one call per datagram".to_string());
            batch = 1;
        }
        let gso = match decide_gso(gso, size) {
            Ok(()) => enable_gso(socket, size),
            Err(off) => off,
        };
        let mmsg = (batch > 1).then(|| sys::SendBatch::new(batch, (!connected).then_some(server)));
        Transmitter {
            connected,
            mmsg,
            gso,
            notes,
            ..Self::unsent(socket, server, size, batch)
        }
    }

    /// A transmitter to `dest` that has sent nothing yet: no counts, no
    /// back-off, plain sends (the constructors set the path).
    fn unsent(socket: &'a UdpSocket, dest: SocketAddr, size: usize, batch: usize) -> Self {
        Transmitter {
            socket,
            dest,
            connected: false,
            shared: false,
            size,
            batch,
            dont_fragment: false,
            mmsg: None,
            gso: Gso::NotRequested,
            notes: Vec::new(),
            backoff: Backoff::default(),
            enobufs_retries: 0,
            backoff_time: Duration::ZERO,
            refused: 0,
            gone: false,
            calls: 0,
            gso_off: None,
        }
    }

    /// Turns GSO off before the next data message once `off` is requested
    /// (one atomic load per send turn while GSO is on).
    pub fn watch_gso(&mut self, off: &'a GsoOff) {
        self.gso_off = Some(off);
    }

    /// A transmitter on a socket that other senders share (the server's
    /// socket, which a reverse stream sends on so that its datagrams come
    /// from the address and port the client sent to, as a NAT expects):
    /// every call is a sendmmsg to `to` from `from`, and GSO is asked for
    /// per call, so the other senders' datagrams are never cut.
    pub fn shared(
        socket: &'a UdpSocket,
        to: SocketAddr,
        from: Option<std::net::IpAddr>,
        size: usize,
        batch: usize,
        gso: GsoChoice,
    ) -> Self {
        let mut notes = Vec::new();
        if !sys::LINUX_SOCKETS {
            // One sendto per datagram, from the address the OS picks.
            notes.push("sendmmsg is Linux-only: one call per datagram".to_string());
            return Transmitter {
                shared: true,
                gso: Gso::Off("UDP GSO is Linux-only".into()),
                notes,
                ..Self::unsent(socket, to, size, 1)
            };
        }
        let batch = batch.max(1);
        let mut mmsg = sys::SendBatch::new(batch, Some(to));
        mmsg.set_source(from);
        let gso = match decide_gso(gso, size) {
            Ok(()) => match u16::try_from(size) {
                Ok(segment) if segment > 0 => {
                    mmsg.set_gso_segment(Some(segment));
                    Gso::On(GSO_SEGMENTS_NEW)
                }
                _ => Gso::Off(format!("{size}-byte datagrams cannot be segmented")),
            },
            Err(off) => off,
        };
        Transmitter {
            shared: true,
            mmsg: Some(mmsg),
            gso,
            notes,
            ..Self::unsent(socket, to, size, batch)
        }
    }

    /// Messages per call.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Datagrams per message under the current GSO state, given the
    /// largest UDP payload the address family allows.
    pub fn segments_per_message(&self, max_payload: usize) -> usize {
        match self.gso {
            Gso::On(max) if self.size > 0 => (max_payload / self.size).clamp(1, max),
            _ => 1,
        }
    }

    pub fn path(&self) -> SendPath {
        let (gso, segments) = match &self.gso {
            Gso::NotRequested => ("not requested".to_string(), None),
            Gso::On(n) => ("on".to_string(), Some(*n)),
            Gso::Off(_) => ("off".to_string(), None),
        };
        let mut notes = self.notes.clone();
        if let Gso::Off(why) = &self.gso {
            notes.push(format!("gso: off ({why})"));
        }
        let call = match (self.mmsg.is_some(), self.connected) {
            (true, _) => "sendmmsg",
            (false, true) => "send",
            (false, false) => "sendto",
        };
        let name = match (&self.gso, call) {
            (Gso::On(_), "sendto") => "sendto+gso".to_string(),
            (Gso::On(_), "send") => "send+gso".to_string(),
            (Gso::On(_), _) => "sendmmsg+gso".to_string(),
            _ => call.to_string(),
        };
        SendPath {
            name,
            batch: self.batch,
            gso,
            gso_segments: segments,
            notes,
            calls: self.calls,
        }
    }

    pub fn nobody_listening(&self) -> Error {
        Error::runtime(format!(
            "nothing is listening at {}: the host answered 'port unreachable' (is udp_server running?)",
            self.dest
        ))
    }

    fn disable_gso(&mut self, why: String) {
        self.set_gso_segment(0);
        self.gso = Gso::Off(why);
    }

    /// UDP_SEGMENT for what follows: on the socket, or per call on a
    /// shared one. 0 turns it off.
    fn set_gso_segment(&mut self, segment: u16) {
        match (&mut self.mmsg, self.shared) {
            (Some(mmsg), true) => mmsg.set_gso_segment((segment > 0).then_some(segment)),
            _ => {
                let _ = sys::set_gso_segment(&SockRef::from(self.socket), segment);
            }
        }
    }

    /// Turns GSO off before control messages, which must not be segmented.
    pub fn end_gso(&mut self) {
        if let Gso::On(_) = self.gso {
            self.set_gso_segment(0);
        }
    }

    fn send_one(&self, message: &[u8]) -> io::Result<usize> {
        if self.connected {
            self.socket.send(message)
        } else {
            self.socket.send_to(message, self.dest)
        }
    }

    /// One call: returns how many of `messages` the kernel took (at least
    /// 1), and whether it stopped short of what it was given.
    fn try_send(&mut self, messages: &[&[u8]]) -> io::Result<(usize, bool)> {
        if let Some(mmsg) = &mut self.mmsg {
            if messages.len() > 1 || self.shared {
                let given = messages.len().min(self.batch);
                let n = mmsg.send(&SockRef::from(self.socket), &messages[..given])?;
                return if n == 0 {
                    Err(io::ErrorKind::WouldBlock.into())
                } else {
                    Ok((n, n < given))
                };
            }
        }
        self.send_one(messages[0]).map(|_| (1, false))
    }

    /// The longest message the current send path takes in one piece.
    fn message_limit(&self) -> usize {
        match self.gso {
            Gso::On(max) => self.size.max(1) * max,
            _ => self.size.max(1),
        }
    }

    /// Sends every message, in order. Returns how many were sent, which is
    /// fewer than `messages.len()` only when `shutdown` interrupted a
    /// back-off, or when the host kept answering "port unreachable"
    /// ([`Transmitter::gone`]).
    pub fn send_all(&mut self, messages: &[&[u8]], shutdown: &Shutdown) -> Result<usize> {
        if let (Some(off), Gso::On(_)) = (self.gso_off, &self.gso) {
            if let Some(why) = off.why() {
                self.disable_gso(why);
            }
        }
        self.send_messages(messages, shutdown, Mode::Data)
    }

    /// Sends a control message (Hello, End) whole, whatever the datagram
    /// size: it must never be cut into pieces. Call [`Self::end_gso`] first.
    /// Returns 0 when the host answered "port unreachable" instead; the
    /// caller, listening for the answer, sees the refusal too.
    pub fn send_control(&mut self, message: &[u8]) -> Result<usize> {
        self.send_messages(&[message], &Shutdown::new(), Mode::Control)
    }

    fn send_messages(
        &mut self,
        messages: &[&[u8]],
        shutdown: &Shutdown,
        mode: Mode,
    ) -> Result<usize> {
        let limit = self.message_limit();
        if mode == Mode::Data && messages.iter().any(|m| m.len() > limit) {
            // Laid out for a GSO state that has since changed: send each
            // message in pieces the current path takes. Pieces are never
            // interrupted, so a message is sent whole or not at all.
            for (i, message) in messages.iter().enumerate() {
                if self.gone || shutdown.is_triggered() {
                    return Ok(i);
                }
                for piece in message.chunks(limit) {
                    self.send_messages(&[piece], shutdown, Mode::Piece)?;
                }
            }
            return Ok(messages.len());
        }
        let mut sent = 0;
        while sent < messages.len() {
            match self.try_send(&messages[sent..]) {
                Ok((n, stopped_short)) => {
                    sent += n;
                    if mode != Mode::Control {
                        self.calls += 1;
                    }
                    if stopped_short {
                        // sendmmsg stopped at a message the kernel refused,
                        // and Linux drops that errno when earlier messages
                        // went out. On this blocking socket the refusal is a
                        // full queue (ENOBUFS) but for rare ICMP errors,
                        // which the next call reports as its own: count it
                        // and back off as for ENOBUFS, so retries still
                        // equal the queue's drops.
                        self.enobufs_retries += 1;
                        self.backoff_time += self.backoff.wait();
                        if mode == Mode::Data && shutdown.is_triggered() {
                            return Ok(sent);
                        }
                    } else {
                        self.backoff.reset();
                    }
                }
                Err(e) => {
                    if let (Gso::On(max), Mode::Data | Mode::Piece) = (&self.gso, mode) {
                        let max = *max;
                        if is_gso_refusal(&e) {
                            self.gso_refused(max, &e);
                            return Ok(
                                sent + self.send_messages(&messages[sent..], shutdown, mode)?
                            );
                        }
                    }
                    match sys::classify_send_error(&e) {
                        SendFailure::QueueFull => {
                            self.enobufs_retries += 1;
                            self.backoff_time += self.backoff.wait();
                            if mode == Mode::Data && shutdown.is_triggered() {
                                return Ok(sent);
                            }
                        }
                        SendFailure::Interrupted => {}
                        SendFailure::Refused => {
                            // The error belonged to an earlier datagram;
                            // this one was not sent.
                            self.refused += 1;
                            match mode {
                                Mode::Data if self.refused >= MAX_REFUSED => {
                                    self.gone = true;
                                    return Ok(sent);
                                }
                                // The caller listens for the answer, and
                                // sees the refusal there too.
                                Mode::Control => return Ok(sent),
                                // Sent again: a piece of a message that is
                                // sent whole or not at all.
                                Mode::Data | Mode::Piece => {}
                            }
                        }
                        SendFailure::TooBig => {
                            return Err(Error::runtime(too_big_message(
                                self.size,
                                self.dest,
                                &e,
                                self.dont_fragment,
                            )));
                        }
                        SendFailure::Other => {
                            return Err(Error::runtime(format!(
                                "cannot send to {}: {e}",
                                self.dest
                            )));
                        }
                    }
                }
            }
        }
        Ok(sent)
    }

    /// The kernel refused a GSO send (nothing was sent): use fewer
    /// segments, or turn GSO off.
    fn gso_refused(&mut self, max: usize, e: &io::Error) {
        let refusal = sys::gso_refusal(e);
        if refusal == Some(sys::GsoRefusal::Invalid) && max > GSO_SEGMENTS_OLD {
            self.gso = Gso::On(GSO_SEGMENTS_OLD);
            return;
        }
        let why = match refusal {
            Some(sys::GsoRefusal::NoChecksum) => {
                "EIO: the outgoing device cannot checksum UDP GSO buffers"
            }
            Some(sys::GsoRefusal::TooBig) => {
                "EMSGSIZE: a segment plus its headers exceeds the path MTU, and GSO does not fragment"
            }
            _ => "EINVAL: the kernel refused UDP_SEGMENT sends",
        };
        self.disable_gso(why.to_string());
    }
}

/// Turns on UDP_SEGMENT for `size`-byte segments, or says why not.
fn enable_gso(socket: &UdpSocket, size: usize) -> Gso {
    let Ok(segment) = u16::try_from(size) else {
        return Gso::Off(format!("{size}-byte datagrams are too large to segment"));
    };
    if size == 0 {
        return Gso::Off("0-byte datagrams cannot be segmented".into());
    }
    match sys::set_gso_segment(&SockRef::from(socket), segment) {
        Ok(()) => Gso::On(GSO_SEGMENTS_NEW),
        Err(e) if e.kind() == io::ErrorKind::Unsupported => Gso::Off(e.to_string()),
        Err(e) => Gso::Off(format!("UDP_SEGMENT unavailable: {e}")),
    }
}

/// The error for a datagram the OS refused as too large, with the fix.
pub fn too_big_message(
    size: usize,
    server: SocketAddr,
    err: &io::Error,
    dont_fragment: bool,
) -> String {
    let hint = if dont_fragment {
        "--dont-fragment forbids fragmentation, so a datagram must fit the path MTU: at most 1472 bytes over IPv4 (1452 over IPv6) on a 1500-byte Ethernet MTU; lower -b or drop --dont-fragment"
    } else {
        match sys::OS {
            sys::Os::MacOs => "macOS limits UDP datagrams to 9216 bytes by default; raise it with: sudo sysctl -w net.inet.udp.maxdgram=65535",
            sys::Os::Linux => "Linux allows 65507 bytes over IPv4 and 65527 over IPv6; a smaller limit means the don't-fragment option or the path MTU",
            sys::Os::Other => "lower --buffer-size or raise the OS's maximum UDP datagram size",
        }
    };
    format!("the OS refused a {size}-byte datagram to {server} ({err}); {hint}")
}
