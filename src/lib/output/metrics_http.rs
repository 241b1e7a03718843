//! `udp_server --metrics ADDR`'s HTTP endpoint: hyper (HTTP/1.1) on a
//! current-thread tokio runtime of its own thread. It never touches the
//! receive threads, and it stops through the server's [`Shutdown`] flag
//! like everything else.
//!
//! # Limits
//!
//! The endpoint must keep answering scrapes while someone opens
//! connections and sends nothing (or dribbles a header), and it must not
//! spend the server's CPU doing so. So:
//!
//! - **Slots**: at most [`SLOTS`] connections are open at once, and one
//!   source (an IPv4 address, or an IPv6 /64, which one host usually
//!   holds whole) holds at most [`PER_SOURCE`] of them. A source over its
//!   share is refused: its new connection is reset at once, unread. So a
//!   single source can never take the slots a scraper needs.
//! - **Deadlines**: a connection must deliver its first complete request
//!   header within [`HEADER_DEADLINE`] of being accepted, and each later
//!   one within [`IDLE`] of the last byte of the previous response, or it
//!   is closed; none lives longer than [`CONNECTION_LIFE`]. These are the
//!   endpoint's own timers, not hyper's `header_read_timeout`: hyper
//!   starts that timer as soon as a response is handed to it, while the
//!   bytes may still be on their way to a slow reader, so it would cut a
//!   large scrape short. Ours counts from the last byte the peer took.
//! - **Eviction**: when every slot is taken, a newcomer whose source
//!   holds fewer slots than some other source evicts that source's
//!   connection that has been quiet longest (waiting for a header, or idle
//!   between requests), never one being answered; otherwise it is
//!   refused. Without this, sources that each stay within their share
//!   could still fill the table together (eight addresses are easy to
//!   come by) and keep a new scraper out until a deadline frees a slot.
//!   With it, a source with no connection gets in whenever any connection
//!   is quiet, and the cost falls on whoever holds the most.
//! - **No churn**: after every [`BURST`] refusals or evictions the accept
//!   loop pauses [`PAUSE`]. Connections arriving meanwhile wait in the
//!   kernel's backlog, so a source that reconnects as fast as it is
//!   refused gets about 500 refusals a second, each an accept and a reset,
//!   not a busy loop (forty such connections cost the server about 3% of
//!   a core, against a quarter of one before). Pausing per burst rather
//!   than per refusal: on the runtime, the wake-up after a pause costs
//!   more than the refusal. A scraper from another source waits behind
//!   the connections queued before it: four pauses behind thirty-two.
//!
//! What was refused or closed to keep the slots is counted in
//! `netspeed_metrics_connections_refused_total{reason}` (see
//! [`Refusal`]); idle keep-alive connections closed after [`IDLE`] and
//! connections at the end of their life are ordinary, and not counted.

use super::metrics::{exposition_with, CONTENT_TYPE_OPENMETRICS, PATH};
use crate::error::{Error, Result};
use crate::server::metrics::{Board, SNAPSHOT_WAIT};
use crate::shutdown::{Shutdown, POLL};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;
use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// Connections open at once. A scraper uses one.
pub const SLOTS: usize = 64;
/// Connections one source may hold: an eighth of [`SLOTS`], so that
/// at least eight sources fit however greedy each is.
pub const PER_SOURCE: usize = 8;
/// The first complete request header is due this long after the accept.
/// A scraper sends its request at once; two seconds leave room for a
/// loaded host and a long round trip, and free a slot held by a silent
/// connection five times sooner than the ten seconds before.
pub const HEADER_DEADLINE: Duration = Duration::from_secs(2);
/// A later request's complete header is due this long after the previous
/// response's last byte: keep-alive for a client that scrapes again at
/// once, not a slot held between scrapes (Prometheus's interval is 15 s
/// by default; it reconnects, which costs a loopback or LAN round trip).
pub const IDLE: Duration = Duration::from_secs(5);
/// No connection lives longer, however busy.
pub const CONNECTION_LIFE: Duration = Duration::from_secs(300);
/// The accept loop pauses [`PAUSE`] after every [`BURST`] refusals and
/// evictions: at most about 500 a second, whatever a client tries.
pub const BURST: u32 = 8;
/// See [`BURST`]: one wake-up per burst rather than one per refusal,
/// which costs more than the refusal itself.
pub const PAUSE: Duration = Duration::from_millis(16);

/// The running HTTP endpoint.
pub struct Endpoint {
    /// The address bound (port 0 resolved).
    pub addr: SocketAddr,
    thread: std::thread::JoinHandle<()>,
}

impl Endpoint {
    /// Waits for the endpoint's thread, which ends within
    /// [`crate::shutdown::POLL`] of the shutdown flag being set.
    pub fn join(self) {
        let _ = self.thread.join();
    }
}

/// Binds `addr` (a failure is an error now, before the server starts) and
/// serves `board` on a thread of its own until `shutdown` is set.
pub fn start(addr: SocketAddr, board: Arc<Board>, shutdown: Shutdown) -> Result<Endpoint> {
    let cannot =
        |e: std::io::Error| Error::runtime(format!("cannot serve --metrics on {addr}: {e}"));
    let listener = std::net::TcpListener::bind(addr).map_err(cannot)?;
    listener.set_nonblocking(true).map_err(cannot)?;
    let bound = listener.local_addr().map_err(cannot)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::runtime(format!("cannot start the --metrics runtime: {e}")))?;
    let thread = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || runtime.block_on(accept_loop(listener, board, shutdown)))
        .map_err(|e| Error::runtime(format!("cannot start the --metrics thread: {e}")))?;
    Ok(Endpoint {
        addr: bound,
        thread,
    })
}

/// Why the endpoint refused a connection or closed it to keep its slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Refused at accept: its source held [`PER_SOURCE`] connections.
    SourceShare = 0,
    /// Refused at accept: every slot taken, none to evict for it.
    Full = 1,
    /// Closed, quiet, to make room for a source holding fewer.
    Evicted = 2,
    /// Closed: no complete request header within [`HEADER_DEADLINE`].
    HeaderDeadline = 3,
}

impl Refusal {
    const ALL: [Refusal; 4] = [
        Refusal::SourceShare,
        Refusal::Full,
        Refusal::Evicted,
        Refusal::HeaderDeadline,
    ];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::SourceShare => "source_share",
            Refusal::Full => "full",
            Refusal::Evicted => "evicted",
            Refusal::HeaderDeadline => "header_deadline",
        }
    }
}

/// The refusals so far, by reason.
#[derive(Debug, Default)]
struct Refusals([AtomicU64; 4]);

impl Refusals {
    fn count(&self, why: Refusal) {
        self.0[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> RefusedFamily {
        RefusedFamily(self.0.each_ref().map(|n| n.load(Ordering::Relaxed)))
    }
}

/// `netspeed_metrics_connections_refused_total`, every reason always
/// present (a series that appears at its first increment hides that
/// increment from `rate()`).
#[derive(Debug)]
struct RefusedFamily([u64; 4]);

impl Collector for RefusedFamily {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let mut family = e.encode_descriptor(
            "metrics_connections_refused",
            "Connections the --metrics endpoint refused at accept or closed to keep its slots, by reason.",
            None,
            MetricType::Counter,
        )?;
        for why in Refusal::ALL {
            let labels = [("reason", why.label())];
            ConstCounter::new(self.0[why as usize]).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Who shares a slot quota: an IPv4 address, or an IPv6 /64 (a host
/// gets a whole /64 and can pick any address in it). IPv4-mapped IPv6
/// addresses count as the IPv4 address.
fn source_of(peer: SocketAddr) -> IpAddr {
    match peer.ip().to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// Where a connection is between requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Accepted; its first request header is not complete yet.
    Header,
    /// A request is being answered (its header is complete).
    Answering,
    /// A response was handed to hyper; the next header is not complete.
    Idle,
}

#[derive(Debug)]
struct State {
    phase: Phase,
    /// The response's last byte taken by the peer, or the end of the
    /// request's answer if that came later: when [`IDLE`] starts.
    quiet_since: Instant,
    /// The last write waited for the peer to read.
    stalled: bool,
}

/// One open connection, shared by the slot table, its task and its I/O.
#[derive(Debug)]
struct Conn {
    id: u64,
    source: IpAddr,
    opened: Instant,
    state: Mutex<State>,
    /// Set when the slot table evicted it: its task closes it.
    evict: Notify,
}

impl Conn {
    fn new(id: u64, source: IpAddr, opened: Instant) -> Conn {
        Conn {
            id,
            source,
            opened,
            state: Mutex::new(State {
                phase: Phase::Header,
                quiet_since: opened,
                stalled: false,
            }),
            evict: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request's header is complete.
    fn answering(&self) {
        self.state().phase = Phase::Answering;
    }

    /// Its response was handed to hyper, at `now`.
    fn answered(&self, now: Instant) {
        let mut s = self.state();
        s.phase = Phase::Idle;
        s.quiet_since = now;
    }

    /// A write returned at `now`: `done` if it took bytes, else it waits
    /// for the peer.
    fn wrote(&self, done: bool, now: Instant) {
        let mut s = self.state();
        s.stalled = !done;
        if done {
            s.quiet_since = s.quiet_since.max(now);
        }
    }

    /// Waiting for the peer to send, with nothing for it to read: may
    /// be evicted.
    fn quiet(&self) -> Option<Instant> {
        let s = self.state();
        match s.phase {
            Phase::Header => Some(self.opened),
            Phase::Idle if !s.stalled => Some(s.quiet_since),
            _ => None,
        }
    }

    /// When it is next due to be closed, unless it moves on by then.
    fn deadline(&self) -> Instant {
        let s = self.state();
        let life = self.opened + CONNECTION_LIFE;
        match s.phase {
            Phase::Header => life.min(self.opened + HEADER_DEADLINE),
            Phase::Answering => life,
            Phase::Idle => life.min(s.quiet_since + IDLE),
        }
    }
}

/// What the slot table says to a new connection.
#[derive(Debug)]
enum Admission {
    /// Served in a slot of its own, maybe one taken from `evicted`.
    Open {
        conn: Arc<Conn>,
        evicted: Option<Arc<Conn>>,
    },
    Refused(Refusal),
}

/// The open connections, bounded in all and per source.
#[derive(Debug)]
struct Slots {
    capacity: usize,
    per_source: usize,
    open: Vec<Arc<Conn>>,
    next_id: u64,
}

impl Slots {
    fn new(capacity: usize, per_source: usize) -> Slots {
        Slots {
            capacity,
            per_source,
            open: Vec::with_capacity(capacity),
            next_id: 0,
        }
    }

    fn held(&self) -> HashMap<IpAddr, usize> {
        let mut held = HashMap::new();
        for c in &self.open {
            *held.entry(c.source).or_insert(0) += 1;
        }
        held
    }

    /// A connection from `source`, accepted at `now`.
    fn admit(&mut self, source: IpAddr, now: Instant) -> Admission {
        let held = self.held();
        let mine = held.get(&source).copied().unwrap_or(0);
        if mine >= self.per_source {
            return Admission::Refused(Refusal::SourceShare);
        }
        let mut evicted = None;
        if self.open.len() >= self.capacity {
            // The quiet connection of the source holding the most (more
            // than the newcomer's), quiet longest.
            let victim = self
                .open
                .iter()
                .enumerate()
                .filter(|(_, c)| held[&c.source] > mine)
                .filter_map(|(i, c)| c.quiet().map(|since| (held[&c.source], since, i)))
                .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            match victim {
                Some((_, _, i)) => evicted = Some(self.open.swap_remove(i)),
                None => return Admission::Refused(Refusal::Full),
            }
        }
        self.next_id += 1;
        let conn = Arc::new(Conn::new(self.next_id, source, now));
        self.open.push(Arc::clone(&conn));
        Admission::Open { conn, evicted }
    }

    /// Frees `conn`'s slot (a no-op once it was evicted).
    fn release(&mut self, conn: &Conn) {
        self.open.retain(|c| c.id != conn.id);
    }
}

/// What every connection task shares.
struct Shared {
    board: Arc<Board>,
    slots: Mutex<Slots>,
    refusals: Refusals,
}

impl Shared {
    fn slots(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn accept_loop(listener: std::net::TcpListener, board: Arc<Board>, shutdown: Shutdown) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let shared = Arc::new(Shared {
        board,
        slots: Mutex::new(Slots::new(SLOTS, PER_SOURCE)),
        refusals: Refusals::default(),
    });
    let mut strikes = 0;
    while !shutdown.is_triggered() {
        if strikes >= BURST {
            strikes = 0;
            tokio::time::sleep(PAUSE).await;
        }
        let (stream, peer) = match tokio::time::timeout(POLL, listener.accept()).await {
            Err(_) => continue,
            Ok(Ok(accepted)) => accepted,
            // Out of descriptors, say: try again a little later.
            Ok(Err(_)) => {
                tokio::time::sleep(POLL).await;
                continue;
            }
        };
        let admission = shared.slots().admit(source_of(peer), Instant::now());
        match admission {
            Admission::Refused(why) => {
                shared.refusals.count(why);
                // A reset: no FIN handshake, no TIME_WAIT left behind.
                let _ = stream.set_zero_linger();
                drop(stream);
                strikes += 1;
            }
            Admission::Open { conn, evicted } => {
                tokio::spawn(serve(stream, conn, Arc::clone(&shared)));
                if let Some(old) = evicted {
                    shared.refusals.count(Refusal::Evicted);
                    old.evict.notify_one();
                    strikes += 1;
                }
            }
        }
    }
}

/// Serves `conn` until the peer closes it, hyper ends it, a deadline
/// passes or the slot table evicts it; then frees its slot.
async fn serve(stream: TcpStream, conn: Arc<Conn>, shared: Arc<Shared>) {
    let io = Watched {
        io: TokioIo::new(stream),
        conn: Arc::clone(&conn),
    };
    let service = {
        let (conn, shared) = (Arc::clone(&conn), Arc::clone(&shared));
        hyper::service::service_fn(move |req| {
            let (conn, shared) = (Arc::clone(&conn), Arc::clone(&shared));
            async move {
                conn.answering();
                let response = respond(req, &shared).await;
                conn.answered(Instant::now());
                response
            }
        })
    };
    // No hyper header timer: the deadlines are ours (see the module doc).
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(None);
    let connection = http.serve_connection(io, service);
    tokio::pin!(connection);
    loop {
        let deadline = conn.deadline();
        tokio::select! {
            biased;
            _ = &mut connection => break,
            () = conn.evict.notified() => break,
            () = tokio::time::sleep_until(deadline.into()) => {
                // Deadlines only move later: past the one slept to, the
                // connection is due.
                if Instant::now() >= conn.deadline() {
                    if conn.state().phase == Phase::Header {
                        shared.refusals.count(Refusal::HeaderDeadline);
                    }
                    break;
                }
            }
        }
    }
    shared.slots().release(&conn);
}

/// The connection's socket, telling its [`Conn`] when the peer takes
/// bytes (so that [`IDLE`] counts from the last byte of a response, and a
/// response being read is not evicted).
struct Watched {
    io: TokioIo<TcpStream>,
    conn: Arc<Conn>,
}

impl Watched {
    fn track<T>(&self, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        self.conn.wrote(polled.is_ready(), Instant::now());
        polled
    }
}

impl Read for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl Write for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.track(polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.track(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

async fn respond(
    req: Request<Incoming>,
    shared: &Shared,
) -> std::result::Result<Response<Full<Bytes>>, std::convert::Infallible> {
    if req.uri().path() != PATH {
        return Ok(plain(
            StatusCode::NOT_FOUND,
            "not found: udp_server serves its metrics at /metrics\n",
        ));
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Ok(response);
    }
    let board = Arc::clone(&shared.board);
    let refused = shared.refusals.snapshot();
    // Waiting for the server's snapshot blocks: not on the runtime's thread.
    let text = tokio::task::spawn_blocking(move || {
        exposition_with(&board.view(SNAPSHOT_WAIT), Some(Box::new(refused)))
    })
    .await;
    Ok(match text {
        Ok(text) => {
            let mut response = Response::new(Full::new(Bytes::from(text)));
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(CONTENT_TYPE_OPENMETRICS),
            );
            response
        }
        Err(_) => plain(StatusCode::INTERNAL_SERVER_ERROR, "no metrics\n"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn open(slots: &mut Slots, source: &str, now: Instant) -> Arc<Conn> {
        match slots.admit(ip(source), now) {
            Admission::Open {
                conn,
                evicted: None,
            } => conn,
            other => panic!("{source}: {other:?}"),
        }
    }

    #[test]
    fn a_source_over_its_share_is_refused_and_another_still_gets_in() {
        let now = Instant::now();
        let mut slots = Slots::new(8, 2);
        let a = open(&mut slots, "10.0.0.1", now);
        open(&mut slots, "10.0.0.1", now);
        assert!(matches!(
            slots.admit(ip("10.0.0.1"), now),
            Admission::Refused(Refusal::SourceShare)
        ));
        open(&mut slots, "10.0.0.2", now);
        // A freed slot is the source's again.
        slots.release(&a);
        open(&mut slots, "10.0.0.1", now);
        assert_eq!(slots.open.len(), 3);
    }

    #[test]
    fn a_full_table_evicts_the_longest_quiet_connection_of_the_source_holding_most() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut slots = Slots::new(5, 3);
        let a_answering = open(&mut slots, "10.0.0.1", at(0));
        let a_idle = open(&mut slots, "10.0.0.1", at(1));
        let a_header = open(&mut slots, "10.0.0.1", at(2));
        let b_header = open(&mut slots, "10.0.0.2", at(3));
        let b_idle = open(&mut slots, "10.0.0.2", at(4));
        a_answering.answering();
        a_idle.answering();
        a_idle.answered(at(10));
        b_idle.answering();
        b_idle.answered(at(5));
        // 10.0.0.1 holds three: its header-less connection has been quiet
        // since 2 ms, its idle one since 10 ms; the one answering is safe.
        let Admission::Open { evicted, .. } = slots.admit(ip("10.0.0.3"), at(20)) else {
            panic!("not admitted")
        };
        assert_eq!(evicted.map(|c| c.id), Some(a_header.id));
        // Now 10.0.0.1 and .2 hold two each and .3 one: .3 again takes from
        // a source holding more, the longest quiet first (b's header-less).
        let Admission::Open { evicted, .. } = slots.admit(ip("10.0.0.3"), at(21)) else {
            panic!("not admitted")
        };
        assert_eq!(evicted.map(|c| c.id), Some(b_header.id));
        // Everyone holds at most as many as .3 or is answering: a fourth
        // source still evicts (.1's idle one, quiet since 10 ms)...
        let Admission::Open { evicted, .. } = slots.admit(ip("10.0.0.4"), at(22)) else {
            panic!("not admitted")
        };
        assert_eq!(evicted.map(|c| c.id), Some(a_idle.id));
        // ... but .3, holding two, finds no source holding more.
        assert!(matches!(
            slots.admit(ip("10.0.0.3"), at(23)),
            Admission::Refused(Refusal::Full)
        ));
        assert_eq!(slots.open.len(), 5);
    }

    #[test]
    fn a_connection_answering_or_whose_reply_is_unread_is_never_evicted() {
        let now = Instant::now();
        let mut slots = Slots::new(2, 2);
        let answering = open(&mut slots, "10.0.0.1", now);
        let unread = open(&mut slots, "10.0.0.1", now);
        answering.answering();
        unread.answering();
        unread.answered(now);
        unread.wrote(false, now);
        assert!(matches!(
            slots.admit(ip("10.0.0.2"), now),
            Admission::Refused(Refusal::Full)
        ));
        // Once the peer took the bytes, it is idle and may go.
        unread.wrote(true, now);
        assert!(matches!(
            slots.admit(ip("10.0.0.2"), now),
            Admission::Open {
                evicted: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn deadlines_follow_the_phase() {
        let t0 = Instant::now();
        let conn = Conn::new(1, ip("10.0.0.1"), t0);
        assert_eq!(conn.deadline(), t0 + HEADER_DEADLINE);
        conn.answering();
        assert_eq!(conn.deadline(), t0 + CONNECTION_LIFE);
        let done = t0 + Duration::from_secs(1);
        conn.answered(done);
        assert_eq!(conn.deadline(), done + IDLE);
        // The peer reading the response moves it on.
        let read = done + Duration::from_millis(300);
        conn.wrote(true, read);
        assert_eq!(conn.deadline(), read + IDLE);
        let late = t0 + CONNECTION_LIFE - Duration::from_secs(1);
        conn.answered(late);
        assert_eq!(conn.deadline(), t0 + CONNECTION_LIFE, "life bounds idle");
    }

    #[test]
    fn a_source_is_an_ipv4_address_or_an_ipv6_64() {
        let source = |s: &str| source_of(s.parse().unwrap());
        assert_eq!(source("192.0.2.7:80"), ip("192.0.2.7"));
        assert_eq!(source("[::ffff:192.0.2.7]:80"), ip("192.0.2.7"));
        assert_eq!(source("[2001:db8:1:2:aaaa::1]:80"), ip("2001:db8:1:2::"));
        assert_eq!(
            source("[2001:db8:1:2:bbbb::9]:80"),
            source("[2001:db8:1:2::5]:80")
        );
        assert_ne!(source("[2001:db8:1:3::1]:80"), ip("2001:db8:1:2::"));
    }

    #[test]
    fn the_refusals_follow_the_server_families_every_reason_present() {
        use crate::server::metrics::{ServerInfo, ServerSample, View};
        let refusals = Refusals::default();
        refusals.count(Refusal::SourceShare);
        refusals.count(Refusal::SourceShare);
        refusals.count(Refusal::HeaderDeadline);
        let view = View {
            info: ServerInfo {
                version: "0.1.0",
                method: "mmsg",
                threads: 1,
                recv_buffer: 1,
                max_peers: 1,
            },
            server: ServerSample::default(),
            peers_finished: 0,
            peers: vec![],
        };
        let text = exposition_with(&view, Some(Box::new(refusals.snapshot())));
        let family = "netspeed_metrics_connections_refused";
        assert!(
            text.contains(&format!("# TYPE {family} counter\n")),
            "{text}"
        );
        for (reason, n) in [
            ("source_share", 2),
            ("full", 0),
            ("evicted", 0),
            ("header_deadline", 1),
        ] {
            let line = format!("{family}_total{{reason=\"{reason}\"}} {n}\n");
            assert!(text.contains(&line), "no {line}in\n{text}");
        }
        assert!(text.find("netspeed_build_info").unwrap() < text.find(family).unwrap());
        assert!(text.ends_with("# EOF\n"));
    }
}
