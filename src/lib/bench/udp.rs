//! `sockbench udp`: seed 000's matrix of UDP socket libraries, finished.
//!
//! Each configuration runs unpaced senders, each on its own socket, into
//! receivers that share one address. Why each backend is written out: the
//! point of the suite is the cost of each library's own calls, so `std`
//! uses `std::net::UdpSocket`, `socket2` uses `socket2::Socket`, `nix` uses
//! `nix::sys::socket::{send, sendto, recv}` on an `OwnedFd`, `tokio` uses
//! `tokio::net::UdpSocket` on a multi-thread runtime, and `async` uses
//! smol's `Async<UdpSocket>` (async-io's reactor, no tokio). Only the
//! reuse options of `std` and `tokio` are set with socket2 before binding,
//! because those libraries have no call for them.
//!
//! How a datagram is counted: its first byte says whether it was sent in
//! the warm-up (0) or the measured window (1). Senders count what they
//! sent in the window; receivers count what they received that was sent in
//! the window, including stragglers read just after it closed. So the loss
//! `(sent − received) / sent` compares like with like, and the bandwidth
//! is payload bytes actually returned by `recv` (never the configured size)
//! over the window's length.
//!
//! With `--threads 1` there is no second thread to receive while one
//! sends: the row is a ping-pong (send one datagram, read it back, one in
//! flight) and is labelled so, with its mean round-trip time.
//!
//! Every loop is bounded: receive timeouts of [`POLL`], send timeouts,
//! and a drain of at most [`DRAIN_MAX`] after the window. Any error fails
//! the configuration (and the run) with a message naming the backend.

use super::output::{self, Format, Table};
use super::plot::{self, Series};
use super::{Bar, OutputArgs};
use crate::error::{Error, Result};
use crate::shutdown::Shutdown;
use crate::units;
use serde::Serialize;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a waiting receiver wakes up to look at the phase.
pub const POLL: Duration = Duration::from_millis(20);
/// Longest time receivers keep draining after the window closes.
pub const DRAIN_MAX: Duration = Duration::from_millis(300);
/// Most threads in one configuration.
pub const MAX_THREADS: usize = 64;

const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const DONE: u8 = 2;

/// The socket library under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SocketKind {
    Std,
    Socket2,
    Nix,
    Tokio,
    /// smol / async-io: a futures runtime other than tokio.
    Async,
}

impl SocketKind {
    pub fn name(self) -> &'static str {
        match self {
            SocketKind::Std => "std",
            SocketKind::Socket2 => "socket2",
            SocketKind::Nix => "nix",
            SocketKind::Tokio => "tokio",
            SocketKind::Async => "async",
        }
    }
}

/// Whether senders `connect` and `send`, or `send_to` every datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Conn {
    Unconnected,
    Connected,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Ip {
    V4,
    V6,
}

impl Ip {
    /// The loopback address: 127.0.0.1 or ::1 (seed 000 sent to ::).
    pub fn loopback(self, port: u16) -> SocketAddr {
        match self {
            Ip::V4 => (Ipv4Addr::LOCALHOST, port).into(),
            Ip::V6 => (Ipv6Addr::LOCALHOST, port).into(),
        }
    }
}

/// How receivers share the address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Reuse {
    /// One receiving socket, read by every receiver thread.
    None,
    /// One socket per receiver, all bound with SO_REUSEADDR.
    Addr,
    /// One socket per receiver, all bound with SO_REUSEPORT (the kernel
    /// spreads flows over them by a hash of the addresses).
    Port,
}

/// What a row measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Senders and receivers in parallel: throughput.
    Stream,
    /// One thread, one datagram in flight: latency-bound.
    PingPong,
}

/// `sockbench udp` flags.
#[derive(clap::Args, Debug)]
pub struct UdpArgs {
    /// Socket libraries to test.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "std,socket2,nix,tokio,async"
    )]
    pub socket: Vec<SocketKind>,
    /// Threads per configuration, split between senders and receivers
    /// (1 is a ping-pong row; 3 is 2 senders and 1 receiver).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<usize>,
    /// Sender socket mode.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "unconnected,connected"
    )]
    pub conn: Vec<Conn>,
    /// IP version (loopback 127.0.0.1 or ::1).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "v4,v6")]
    pub ip: Vec<Ip>,
    /// UDP payload sizes in bytes (at least 1).
    #[arg(long, value_delimiter = ',', default_value = "26,300,1460", value_parser = super::size_arg)]
    pub payload: Vec<u64>,
    /// How receivers share the address.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "port")]
    pub reuse: Vec<Reuse>,
    /// Measured time per configuration.
    #[arg(long, default_value = "1s", value_parser = super::duration_arg)]
    pub duration: Duration,
    /// Unmeasured time before it.
    #[arg(long, default_value = "100ms", value_parser = super::duration_arg)]
    pub warmup: Duration,
    #[command(flatten)]
    pub out: OutputArgs,
}

/// One configuration of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpCase {
    pub socket: SocketKind,
    pub threads: usize,
    pub conn: Conn,
    pub ip: Ip,
    pub payload: usize,
    pub reuse: Reuse,
}

impl UdpCase {
    /// Senders and receivers for `threads`: receivers get the smaller half
    /// (3 is 2 + 1), and 1 thread is a ping-pong (one of each role, in
    /// turn, on the same thread).
    pub fn split(threads: usize) -> (usize, usize) {
        if threads <= 1 {
            return (1, 1);
        }
        let receivers = threads / 2;
        (threads - receivers, receivers)
    }

    pub fn mode(&self) -> Mode {
        if self.threads <= 1 {
            Mode::PingPong
        } else {
            Mode::Stream
        }
    }

    /// Receiving sockets: one with `--reuse none`, else one per receiver.
    pub fn rx_sockets(&self) -> usize {
        match self.reuse {
            Reuse::None => 1,
            _ => Self::split(self.threads).1,
        }
    }
}

/// The validated matrix.
#[derive(Debug, Clone)]
pub struct UdpMatrix {
    pub cases: Vec<UdpCase>,
    pub duration: Duration,
    pub warmup: Duration,
}

fn dedup<T: PartialEq + Copy>(v: &[T]) -> Vec<T> {
    let mut out = Vec::new();
    for &x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

impl UdpMatrix {
    /// Checks every axis and expands them in seed 000's order: payload
    /// outermost, then threads, IP version, connection mode, reuse, and
    /// socket type innermost.
    pub fn from_args(args: &UdpArgs) -> Result<Self> {
        if args.duration.is_zero() {
            return Err(Error::usage("--duration must be greater than 0"));
        }
        if args.duration > Duration::from_secs(3600) || args.warmup > Duration::from_secs(3600) {
            return Err(Error::usage("--duration and --warmup must be at most 1h"));
        }
        for &t in &args.threads {
            if t == 0 || t > MAX_THREADS {
                return Err(Error::usage(format!(
                    "--threads {t}: must be between 1 and {MAX_THREADS}"
                )));
            }
        }
        let ips = dedup(&args.ip);
        for &p in &args.payload {
            let limit = if ips.contains(&Ip::V4) {
                crate::sys::MAX_UDP_PAYLOAD_V4
            } else {
                crate::sys::MAX_UDP_PAYLOAD_V6
            };
            if p == 0 || p > limit as u64 {
                return Err(Error::usage(format!(
                    "--payload {p}: must be between 1 and {limit} bytes (the largest UDP datagram{})",
                    if ips.contains(&Ip::V4) { " over IPv4" } else { " over IPv6" }
                )));
            }
        }
        let mut cases = Vec::new();
        for &payload in &dedup(&args.payload) {
            for &threads in &dedup(&args.threads) {
                for &ip in &ips {
                    for &conn in &dedup(&args.conn) {
                        for &reuse in &dedup(&args.reuse) {
                            for &socket in &dedup(&args.socket) {
                                cases.push(UdpCase {
                                    socket,
                                    threads,
                                    conn,
                                    ip,
                                    payload: payload as usize,
                                    reuse,
                                });
                            }
                        }
                    }
                }
            }
        }
        Ok(UdpMatrix {
            cases,
            duration: args.duration,
            warmup: args.warmup,
        })
    }

    /// A fair estimate of the run time: the window, the warm-up, and about
    /// 30 ms of set-up and drain per configuration.
    pub fn estimate(&self) -> Duration {
        (self.duration + self.warmup + Duration::from_millis(30)) * self.cases.len() as u32
    }
}

/// One row of results.
#[derive(Debug, Clone, Serialize)]
pub struct UdpRow {
    pub socket: SocketKind,
    pub mode: Mode,
    pub threads: usize,
    pub senders: usize,
    pub receivers: usize,
    /// Receiving sockets (1 with `--reuse none`).
    pub rx_sockets: usize,
    pub conn: Conn,
    pub ip: Ip,
    pub payload: usize,
    pub reuse: Reuse,
    /// Length of the measured window.
    pub seconds: f64,
    pub sent_packets: u64,
    pub received_packets: u64,
    /// Payload bytes returned by recv for datagrams sent in the window.
    pub received_bytes: u64,
    /// received_bytes × 8 / seconds / 1e6.
    pub mbit_per_s: f64,
    pub packets_per_s: f64,
    /// (sent − received) / sent × 100.
    pub loss_percent: f64,
    /// Receiver threads that got at least one datagram.
    pub active_receivers: usize,
    /// Ping-pong rows: mean round trip in microseconds.
    pub rtt_us: Option<f64>,
}

/// Per-receiver counts.
#[derive(Debug, Clone, Copy, Default)]
struct RxCount {
    packets: u64,
    bytes: u64,
}

impl RxCount {
    fn add(&mut self, n: usize, buf: &[u8]) {
        if n > 0 && buf[0] == MEASURE {
            self.packets += 1;
            self.bytes += n as u64;
        }
    }
}

/// What the threads of one configuration share: the phase and the first
/// error.
struct Ctl {
    phase: AtomicU8,
    error: Mutex<Option<String>>,
}

impl Ctl {
    fn new() -> Self {
        Ctl {
            phase: AtomicU8::new(WARMUP),
            error: Mutex::new(None),
        }
    }

    fn phase(&self) -> u8 {
        self.phase.load(Ordering::Relaxed)
    }

    /// Records the first failure and ends the configuration.
    fn fail(&self, msg: String) {
        if let Ok(mut e) = self.error.lock() {
            e.get_or_insert(msg);
        }
        self.phase.store(DONE, Ordering::Relaxed);
    }

    fn failed(&self) -> bool {
        self.error.lock().map(|e| e.is_some()).unwrap_or(true)
    }

    fn take_error(&self) -> Option<String> {
        self.error.lock().ok().and_then(|mut e| e.take())
    }

    /// Runs the clock on the calling thread: warm-up, then the window.
    /// Returns the window's length in seconds.
    fn drive(&self, warmup: Duration, duration: Duration, shutdown: &Shutdown) -> f64 {
        let sleep_until = |deadline: Instant| {
            while !self.failed() && !shutdown.is_triggered() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                std::thread::sleep(left.min(Duration::from_millis(10)));
            }
        };
        sleep_until(Instant::now() + warmup);
        let t0 = Instant::now();
        let _ = self
            .phase
            .compare_exchange(WARMUP, MEASURE, Ordering::Relaxed, Ordering::Relaxed);
        sleep_until(t0 + duration);
        self.phase.store(DONE, Ordering::Relaxed);
        t0.elapsed().as_secs_f64()
    }
}

/// Errors that mean "try again": a timeout, a full queue, a signal.
fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    ) || e.raw_os_error() == Some(libc::ENOBUFS)
}

fn any_addr(ip: Ip) -> SocketAddr {
    ip.loopback(0)
}

// ------------------------------------------------------------ blocking

/// A sending socket of a blocking library.
trait Tx: Send {
    fn send(&mut self, buf: &[u8]) -> io::Result<usize>;
}

/// A receiving socket of a blocking library, shared by reference.
trait Rx: Send + Sync {
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize>;
}

/// How a blocking library makes its sockets.
trait Blocking {
    type Tx: Tx;
    type Rx: Rx;
    fn bind_rx(addr: SocketAddr, reuse: Reuse) -> io::Result<Self::Rx>;
    fn local_addr(rx: &Self::Rx) -> io::Result<SocketAddr>;
    fn open_tx(bind: SocketAddr, dest: SocketAddr, connected: bool) -> io::Result<Self::Tx>;
}

/// A socket2 socket with the reuse option set and bound: how `std` and
/// `tokio` get SO_REUSEADDR/SO_REUSEPORT, which they have no call for.
fn socket2_reuse_bound(addr: SocketAddr, reuse: Reuse) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    match reuse {
        Reuse::None => {}
        Reuse::Addr => s.set_reuse_address(true)?,
        Reuse::Port => s.set_reuse_port(true)?,
    }
    s.bind(&addr.into())?;
    Ok(s)
}

fn std_bind(addr: SocketAddr, reuse: Reuse) -> io::Result<UdpSocket> {
    match reuse {
        Reuse::None => UdpSocket::bind(addr),
        _ => Ok(socket2_reuse_bound(addr, reuse)?.into()),
    }
}

struct StdLib;
struct StdTx {
    sock: UdpSocket,
    dest: Option<SocketAddr>,
}

impl Tx for StdTx {
    fn send(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.dest {
            Some(d) => self.sock.send_to(buf, d),
            None => self.sock.send(buf),
        }
    }
}

impl Rx for UdpSocket {
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        UdpSocket::recv(self, buf)
    }
}

impl Blocking for StdLib {
    type Tx = StdTx;
    type Rx = UdpSocket;
    fn bind_rx(addr: SocketAddr, reuse: Reuse) -> io::Result<UdpSocket> {
        let s = std_bind(addr, reuse)?;
        s.set_read_timeout(Some(POLL))?;
        Ok(s)
    }
    fn local_addr(rx: &UdpSocket) -> io::Result<SocketAddr> {
        rx.local_addr()
    }
    fn open_tx(bind: SocketAddr, dest: SocketAddr, connected: bool) -> io::Result<StdTx> {
        let sock = UdpSocket::bind(bind)?;
        sock.set_write_timeout(Some(POLL))?;
        if connected {
            sock.connect(dest)?;
        }
        Ok(StdTx {
            sock,
            dest: (!connected).then_some(dest),
        })
    }
}

struct Socket2Lib;
struct Socket2Tx {
    sock: Socket,
    dest: Option<SockAddr>,
}

impl Tx for Socket2Tx {
    fn send(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &self.dest {
            Some(d) => self.sock.send_to(buf, d),
            None => self.sock.send(buf),
        }
    }
}

struct Socket2Rx(Socket);

impl Rx for Socket2Rx {
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        // socket2's safe recv: `Read for &Socket` is recv(2) into `buf`.
        io::Read::read(&mut &self.0, buf)
    }
}

impl Blocking for Socket2Lib {
    type Tx = Socket2Tx;
    type Rx = Socket2Rx;
    fn bind_rx(addr: SocketAddr, reuse: Reuse) -> io::Result<Socket2Rx> {
        let s = socket2_reuse_bound(addr, reuse)?;
        s.set_read_timeout(Some(POLL))?;
        Ok(Socket2Rx(s))
    }
    fn local_addr(rx: &Socket2Rx) -> io::Result<SocketAddr> {
        rx.0.local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("not an IP socket"))
    }
    fn open_tx(bind: SocketAddr, dest: SocketAddr, connected: bool) -> io::Result<Socket2Tx> {
        let sock = Socket::new(Domain::for_address(bind), Type::DGRAM, Some(Protocol::UDP))?;
        sock.bind(&bind.into())?;
        sock.set_write_timeout(Some(POLL))?;
        if connected {
            sock.connect(&dest.into())?;
        }
        Ok(Socket2Tx {
            sock,
            dest: (!connected).then(|| dest.into()),
        })
    }
}

mod nixlib {
    //! The nix backend: `OwnedFd` sockets and nix's send/sendto/recv.
    use super::{Blocking, Reuse, Rx, Tx, POLL};
    use nix::sys::socket::{
        bind, connect, getsockname, recv, send, sendto, setsockopt, socket, sockopt, AddressFamily,
        MsgFlags, SockFlag, SockProtocol, SockType, SockaddrLike, SockaddrStorage,
    };
    use nix::sys::time::TimeVal;
    use std::io;
    use std::net::SocketAddr;
    use std::os::fd::{AsRawFd, OwnedFd};

    pub struct NixLib;
    pub struct NixTx {
        fd: OwnedFd,
        dest: Option<SockaddrStorage>,
    }
    pub struct NixRx(OwnedFd);

    fn timeval() -> TimeVal {
        TimeVal::new(0, POLL.as_micros() as _)
    }

    fn udp_socket(addr: SocketAddr) -> io::Result<OwnedFd> {
        let family = if addr.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        Ok(socket(
            family,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::Udp,
        )?)
    }

    impl Tx for NixTx {
        fn send(&mut self, buf: &[u8]) -> io::Result<usize> {
            let fd = self.fd.as_raw_fd();
            Ok(match &self.dest {
                Some(d) => sendto(fd, buf, d, MsgFlags::empty())?,
                None => send(fd, buf, MsgFlags::empty())?,
            })
        }
    }

    impl Rx for NixRx {
        fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
            Ok(recv(self.0.as_raw_fd(), buf, MsgFlags::empty())?)
        }
    }

    impl Blocking for NixLib {
        type Tx = NixTx;
        type Rx = NixRx;
        fn bind_rx(addr: SocketAddr, reuse: Reuse) -> io::Result<NixRx> {
            let fd = udp_socket(addr)?;
            match reuse {
                Reuse::None => {}
                Reuse::Addr => setsockopt(&fd, sockopt::ReuseAddr, &true)?,
                Reuse::Port => setsockopt(&fd, sockopt::ReusePort, &true)?,
            }
            bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
            setsockopt(&fd, sockopt::ReceiveTimeout, &timeval())?;
            Ok(NixRx(fd))
        }
        fn local_addr(rx: &NixRx) -> io::Result<SocketAddr> {
            let a: SockaddrStorage = getsockname(rx.0.as_raw_fd())?;
            if let Some(v4) = a.as_sockaddr_in() {
                Ok(SocketAddr::V4((*v4).into()))
            } else if let Some(v6) = a.as_sockaddr_in6() {
                Ok(SocketAddr::V6((*v6).into()))
            } else {
                Err(io::Error::other(format!(
                    "unexpected address family {:?}",
                    a.family()
                )))
            }
        }
        fn open_tx(bind_to: SocketAddr, dest: SocketAddr, connected: bool) -> io::Result<NixTx> {
            let fd = udp_socket(bind_to)?;
            bind(fd.as_raw_fd(), &SockaddrStorage::from(bind_to))?;
            setsockopt(&fd, sockopt::SendTimeout, &timeval())?;
            let dest = SockaddrStorage::from(dest);
            if connected {
                connect(fd.as_raw_fd(), &dest)?;
            }
            Ok(NixTx {
                fd,
                dest: (!connected).then_some(dest),
            })
        }
    }
}

/// What a configuration's threads add up to.
struct Outcome {
    sent: u64,
    rx: Vec<RxCount>,
    seconds: f64,
}

fn send_loop<T: Tx>(tx: &mut T, payload: usize, ctl: &Ctl, lib: &str) -> u64 {
    let mut buf = vec![0xA5u8; payload];
    let mut sent = 0;
    loop {
        let phase = ctl.phase();
        if phase == DONE {
            break;
        }
        buf[0] = phase;
        match tx.send(&buf) {
            Ok(_) => sent += u64::from(phase == MEASURE),
            Err(e) if transient(&e) => std::thread::yield_now(),
            Err(e) => {
                ctl.fail(format!("{lib} send failed: {e}"));
                break;
            }
        }
    }
    sent
}

fn recv_loop<R: Rx>(rx: &R, ctl: &Ctl, lib: &str) -> RxCount {
    let mut buf = vec![0u8; 65536];
    let mut count = RxCount::default();
    let mut done_at = None;
    loop {
        match rx.recv(&mut buf) {
            Ok(n) => count.add(n, &buf),
            // Nothing for a whole POLL after the window: drained.
            Err(e) if transient(&e) => {
                if ctl.phase() == DONE {
                    break;
                }
                continue;
            }
            Err(e) => {
                ctl.fail(format!("{lib} recv failed: {e}"));
                break;
            }
        }
        if ctl.phase() == DONE && done_at.get_or_insert_with(Instant::now).elapsed() > DRAIN_MAX {
            break;
        }
    }
    count
}

fn ping_pong_loop<T: Tx, R: Rx>(
    tx: &mut T,
    rx: &R,
    payload: usize,
    ctl: &Ctl,
    lib: &str,
) -> (u64, RxCount) {
    let mut out = vec![0xA5u8; payload];
    let mut buf = vec![0u8; 65536];
    let (mut sent, mut count) = (0, RxCount::default());
    loop {
        let phase = ctl.phase();
        if phase == DONE {
            break;
        }
        out[0] = phase;
        match tx.send(&out) {
            Ok(_) => sent += u64::from(phase == MEASURE),
            Err(e) if transient(&e) => continue,
            Err(e) => {
                ctl.fail(format!("{lib} send failed: {e}"));
                break;
            }
        }
        // A lost datagram costs one POLL, then the next is sent.
        match rx.recv(&mut buf) {
            Ok(n) => count.add(n, &buf),
            Err(e) if transient(&e) => {}
            Err(e) => {
                ctl.fail(format!("{lib} recv failed: {e}"));
                break;
            }
        }
    }
    (sent, count)
}

fn open_err(lib: &str, what: &str, addr: SocketAddr, e: io::Error) -> Error {
    Error::runtime(format!(
        "{lib}: cannot open the {what} socket on {addr}: {e}"
    ))
}

/// Binds the receiving sockets: the first on port 0, the others on the
/// port it got. Returns them and the address senders aim at.
fn bind_receivers<B: Blocking>(case: &UdpCase, lib: &str) -> Result<(Vec<B::Rx>, SocketAddr)> {
    let any = any_addr(case.ip);
    let first = B::bind_rx(any, case.reuse).map_err(|e| open_err(lib, "receiving", any, e))?;
    let addr = B::local_addr(&first).map_err(|e| open_err(lib, "receiving", any, e))?;
    let mut sockets = vec![first];
    for _ in 1..case.rx_sockets() {
        sockets
            .push(B::bind_rx(addr, case.reuse).map_err(|e| open_err(lib, "receiving", addr, e))?);
    }
    Ok((sockets, addr))
}

fn run_blocking<B: Blocking>(
    case: &UdpCase,
    timing: &Timing,
    ctl: &Ctl,
    shutdown: &Shutdown,
) -> Result<Outcome> {
    let lib = case.socket.name();
    let (senders, receivers) = UdpCase::split(case.threads);
    let (rx_sockets, addr) = bind_receivers::<B>(case, lib)?;
    let connected = case.conn == Conn::Connected;
    let mut txs = (0..senders)
        .map(|_| {
            B::open_tx(any_addr(case.ip), addr, connected)
                .map_err(|e| open_err(lib, "sending", any_addr(case.ip), e))
        })
        .collect::<Result<Vec<_>>>()?;
    if case.mode() == Mode::PingPong {
        let (sent, count, seconds) = std::thread::scope(|s| {
            let tx = &mut txs[0];
            let rx = &rx_sockets[0];
            let h = s.spawn(move || ping_pong_loop(tx, rx, case.payload, ctl, lib));
            let seconds = ctl.drive(timing.warmup, timing.duration, shutdown);
            let (sent, count) = h.join().unwrap_or_default();
            (sent, count, seconds)
        });
        return Ok(Outcome {
            sent,
            rx: vec![count],
            seconds,
        });
    }
    std::thread::scope(|s| {
        let rx_handles: Vec<_> = (0..receivers)
            .map(|i| {
                let rx = &rx_sockets[i % rx_sockets.len()];
                s.spawn(move || recv_loop(rx, ctl, lib))
            })
            .collect();
        let tx_handles: Vec<_> = txs
            .iter_mut()
            .map(|tx| s.spawn(move || send_loop(tx, case.payload, ctl, lib)))
            .collect();
        let seconds = ctl.drive(timing.warmup, timing.duration, shutdown);
        let sent = tx_handles.into_iter().map(|h| h.join().unwrap_or(0)).sum();
        let rx = rx_handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect();
        Ok(Outcome { sent, rx, seconds })
    })
}

// ------------------------------------------------------------ tokio

mod tokiolib {
    //! The tokio backend: `tokio::net::UdpSocket` tasks on a multi-thread
    //! runtime with one worker per sender and receiver.
    use super::*;
    use tokio::net::UdpSocket as TokioUdp;

    async fn send_task(
        sock: TokioUdp,
        dest: Option<SocketAddr>,
        payload: usize,
        ctl: Arc<Ctl>,
    ) -> u64 {
        let mut buf = vec![0xA5u8; payload];
        let mut sent = 0;
        loop {
            let phase = ctl.phase();
            if phase == DONE {
                break;
            }
            buf[0] = phase;
            let r = match dest {
                Some(d) => sock.send_to(&buf, d).await,
                None => sock.send(&buf).await,
            };
            match r {
                Ok(_) => sent += u64::from(phase == MEASURE),
                Err(e) if transient(&e) => tokio::task::yield_now().await,
                Err(e) => {
                    ctl.fail(format!("tokio send failed: {e}"));
                    break;
                }
            }
        }
        sent
    }

    /// Reads what is queued with try_recv; waits for readiness (bounded
    /// by POLL) only when the socket is empty.
    async fn recv_one(sock: &TokioUdp, buf: &mut [u8]) -> io::Result<usize> {
        match sock.try_recv(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                match tokio::time::timeout(POLL, sock.readable()).await {
                    Err(_) => Err(io::ErrorKind::TimedOut.into()),
                    Ok(Err(e)) => Err(e),
                    Ok(Ok(())) => sock.try_recv(buf),
                }
            }
            other => other,
        }
    }

    async fn recv_task(sock: Arc<TokioUdp>, ctl: Arc<Ctl>) -> RxCount {
        let mut buf = vec![0u8; 65536];
        let mut count = RxCount::default();
        let mut done_at = None;
        let mut idle = false;
        loop {
            match recv_one(&sock, &mut buf).await {
                Ok(n) => {
                    idle = false;
                    count.add(n, &buf)
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => idle = true,
                Err(e) if transient(&e) => {}
                Err(e) => {
                    ctl.fail(format!("tokio recv failed: {e}"));
                    break;
                }
            }
            if ctl.phase() == DONE
                && (idle || done_at.get_or_insert_with(Instant::now).elapsed() > DRAIN_MAX)
            {
                break;
            }
        }
        count
    }

    async fn ping_pong_task(
        tx: TokioUdp,
        dest: Option<SocketAddr>,
        rx: Arc<TokioUdp>,
        payload: usize,
        ctl: Arc<Ctl>,
    ) -> (u64, RxCount) {
        let mut out = vec![0xA5u8; payload];
        let mut buf = vec![0u8; 65536];
        let (mut sent, mut count) = (0, RxCount::default());
        loop {
            let phase = ctl.phase();
            if phase == DONE {
                break;
            }
            out[0] = phase;
            let r = match dest {
                Some(d) => tx.send_to(&out, d).await,
                None => tx.send(&out).await,
            };
            match r {
                Ok(_) => sent += u64::from(phase == MEASURE),
                Err(e) if transient(&e) => continue,
                Err(e) => {
                    ctl.fail(format!("tokio send failed: {e}"));
                    break;
                }
            }
            match recv_one(&rx, &mut buf).await {
                Ok(n) => count.add(n, &buf),
                Err(e) if transient(&e) => {}
                Err(e) => {
                    ctl.fail(format!("tokio recv failed: {e}"));
                    break;
                }
            }
        }
        (sent, count)
    }

    pub(super) fn run(
        case: &UdpCase,
        timing: &Timing,
        ctl: Arc<Ctl>,
        shutdown: &Shutdown,
    ) -> Result<Outcome> {
        let (senders, receivers) = UdpCase::split(case.threads);
        let workers = if case.mode() == Mode::PingPong {
            1
        } else {
            senders + receivers
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| Error::runtime(format!("tokio: cannot start a runtime: {e}")))?;
        let any = any_addr(case.ip);
        let connected = case.conn == Conn::Connected;
        // Sockets are made on this thread, so that a bind error fails the
        // configuration before any task starts.
        let (rx, addr, txs) = rt.block_on(async {
            let mut rx = Vec::new();
            let first = match case.reuse {
                Reuse::None => TokioUdp::bind(any).await,
                r => socket2_reuse_bound(any, r).and_then(|s| {
                    s.set_nonblocking(true)?;
                    TokioUdp::from_std(s.into())
                }),
            }
            .map_err(|e| open_err("tokio", "receiving", any, e))?;
            let addr = first
                .local_addr()
                .map_err(|e| open_err("tokio", "receiving", any, e))?;
            rx.push(Arc::new(first));
            for _ in 1..case.rx_sockets() {
                let s = socket2_reuse_bound(addr, case.reuse)
                    .and_then(|s| {
                        s.set_nonblocking(true)?;
                        TokioUdp::from_std(s.into())
                    })
                    .map_err(|e| open_err("tokio", "receiving", addr, e))?;
                rx.push(Arc::new(s));
            }
            let mut txs = Vec::new();
            for _ in 0..senders {
                let s = TokioUdp::bind(any)
                    .await
                    .map_err(|e| open_err("tokio", "sending", any, e))?;
                if connected {
                    s.connect(addr)
                        .await
                        .map_err(|e| open_err("tokio", "sending", any, e))?;
                }
                txs.push(s);
            }
            Ok::<_, Error>((rx, addr, txs))
        })?;
        let dest = (!connected).then_some(addr);
        if case.mode() == Mode::PingPong {
            let tx = txs
                .into_iter()
                .next()
                .ok_or_else(|| Error::runtime("tokio: no sender"))?;
            let h = rt.spawn(ping_pong_task(
                tx,
                dest,
                Arc::clone(&rx[0]),
                case.payload,
                Arc::clone(&ctl),
            ));
            let seconds = ctl.drive(timing.warmup, timing.duration, shutdown);
            let (sent, count) = rt.block_on(h).unwrap_or_default();
            return Ok(Outcome {
                sent,
                rx: vec![count],
                seconds,
            });
        }
        let rx_handles: Vec<_> = (0..receivers)
            .map(|i| rt.spawn(recv_task(Arc::clone(&rx[i % rx.len()]), Arc::clone(&ctl))))
            .collect();
        let tx_handles: Vec<_> = txs
            .into_iter()
            .map(|s| rt.spawn(send_task(s, dest, case.payload, Arc::clone(&ctl))))
            .collect();
        let seconds = ctl.drive(timing.warmup, timing.duration, shutdown);
        let (sent, rx) = rt.block_on(async {
            let mut sent = 0;
            for h in tx_handles {
                sent += h.await.unwrap_or(0);
            }
            let mut rx = Vec::new();
            for h in rx_handles {
                rx.push(h.await.unwrap_or_default());
            }
            (sent, rx)
        });
        rt.shutdown_timeout(Duration::from_millis(100));
        Ok(Outcome { sent, rx, seconds })
    }
}

// ------------------------------------------------------------ smol

mod smollib {
    //! The `async` backend: smol's `Async<UdpSocket>` (async-io's reactor),
    //! each task on its own thread with `smol::block_on`.
    use super::*;
    use smol::Async;

    async fn send_task(
        sock: &Async<UdpSocket>,
        dest: Option<SocketAddr>,
        payload: usize,
        ctl: &Ctl,
    ) -> u64 {
        let mut buf = vec![0xA5u8; payload];
        let mut sent = 0;
        loop {
            let phase = ctl.phase();
            if phase == DONE {
                break;
            }
            buf[0] = phase;
            let r = match dest {
                Some(d) => sock.send_to(&buf, d).await,
                None => sock.send(&buf).await,
            };
            match r {
                Ok(_) => sent += u64::from(phase == MEASURE),
                Err(e) if transient(&e) => smol::future::yield_now().await,
                Err(e) => {
                    ctl.fail(format!("async send failed: {e}"));
                    break;
                }
            }
        }
        sent
    }

    /// Like `Async::recv` (try the read, else wait for readiness), with
    /// the wait bounded by POLL.
    async fn recv_one(sock: &Async<UdpSocket>, buf: &mut [u8]) -> io::Result<usize> {
        match sock.get_ref().recv(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let ready =
                    smol::future::or(async { sock.readable().await.map(|_| true) }, async {
                        smol::Timer::after(POLL).await;
                        Ok(false)
                    })
                    .await?;
                if ready {
                    // Another receiver on a shared socket may have taken
                    // the datagram: try once, never wait unbounded.
                    sock.get_ref().recv(buf)
                } else {
                    Err(io::ErrorKind::TimedOut.into())
                }
            }
            other => other,
        }
    }

    async fn recv_task(sock: &Async<UdpSocket>, ctl: &Ctl) -> RxCount {
        let mut buf = vec![0u8; 65536];
        let mut count = RxCount::default();
        let mut done_at = None;
        let mut idle = false;
        loop {
            match recv_one(sock, &mut buf).await {
                Ok(n) => {
                    idle = false;
                    count.add(n, &buf)
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => idle = true,
                Err(e) if transient(&e) => {}
                Err(e) => {
                    ctl.fail(format!("async recv failed: {e}"));
                    break;
                }
            }
            if ctl.phase() == DONE
                && (idle || done_at.get_or_insert_with(Instant::now).elapsed() > DRAIN_MAX)
            {
                break;
            }
        }
        count
    }

    async fn ping_pong_task(
        tx: &Async<UdpSocket>,
        dest: Option<SocketAddr>,
        rx: &Async<UdpSocket>,
        payload: usize,
        ctl: &Ctl,
    ) -> (u64, RxCount) {
        let mut out = vec![0xA5u8; payload];
        let mut buf = vec![0u8; 65536];
        let (mut sent, mut count) = (0, RxCount::default());
        loop {
            let phase = ctl.phase();
            if phase == DONE {
                break;
            }
            out[0] = phase;
            let r = match dest {
                Some(d) => tx.send_to(&out, d).await,
                None => tx.send(&out).await,
            };
            match r {
                Ok(_) => sent += u64::from(phase == MEASURE),
                Err(e) if transient(&e) => continue,
                Err(e) => {
                    ctl.fail(format!("async send failed: {e}"));
                    break;
                }
            }
            match recv_one(rx, &mut buf).await {
                Ok(n) => count.add(n, &buf),
                Err(e) if transient(&e) => {}
                Err(e) => {
                    ctl.fail(format!("async recv failed: {e}"));
                    break;
                }
            }
        }
        (sent, count)
    }

    fn bind_rx(addr: SocketAddr, reuse: Reuse) -> io::Result<Async<UdpSocket>> {
        match reuse {
            Reuse::None => Async::<UdpSocket>::bind(addr),
            r => Async::new(socket2_reuse_bound(addr, r)?.into()),
        }
    }

    /// async-io's reactor starts on first use and panics when it cannot get
    /// its file descriptors (a small `ulimit -n`): make sure there is room
    /// for it and the first socket, so that such a limit is a one-line
    /// error like any other.
    fn reactor_room() -> io::Result<()> {
        let held = (0..4)
            .map(|_| std::fs::File::open("/dev/null"))
            .collect::<io::Result<Vec<_>>>()?;
        drop(held);
        Ok(())
    }

    pub(super) fn run(
        case: &UdpCase,
        timing: &Timing,
        ctl: &Ctl,
        shutdown: &Shutdown,
    ) -> Result<Outcome> {
        let (senders, receivers) = UdpCase::split(case.threads);
        let any = any_addr(case.ip);
        let connected = case.conn == Conn::Connected;
        reactor_room()
            .map_err(|e| Error::runtime(format!("async: cannot start the reactor: {e}")))?;
        let first = bind_rx(any, case.reuse).map_err(|e| open_err("async", "receiving", any, e))?;
        let addr = first
            .get_ref()
            .local_addr()
            .map_err(|e| open_err("async", "receiving", any, e))?;
        let mut rx = vec![first];
        for _ in 1..case.rx_sockets() {
            rx.push(
                bind_rx(addr, case.reuse).map_err(|e| open_err("async", "receiving", addr, e))?,
            );
        }
        let txs = (0..senders)
            .map(|_| {
                let s = Async::<UdpSocket>::bind(any)?;
                if connected {
                    // UDP connect only sets the default peer; it never waits.
                    s.get_ref().connect(addr)?;
                }
                Ok(s)
            })
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| open_err("async", "sending", any, e))?;
        let dest = (!connected).then_some(addr);
        let payload = case.payload;
        if case.mode() == Mode::PingPong {
            let (sent, count, seconds) = std::thread::scope(|s| {
                let (tx, r) = (&txs[0], &rx[0]);
                let h = s.spawn(move || smol::block_on(ping_pong_task(tx, dest, r, payload, ctl)));
                let seconds = ctl.drive(timing.warmup, timing.duration, shutdown);
                let (sent, count) = h.join().unwrap_or_default();
                (sent, count, seconds)
            });
            return Ok(Outcome {
                sent,
                rx: vec![count],
                seconds,
            });
        }
        std::thread::scope(|s| {
            let rx_handles: Vec<_> = (0..receivers)
                .map(|i| {
                    let sock = &rx[i % rx.len()];
                    s.spawn(move || smol::block_on(recv_task(sock, ctl)))
                })
                .collect();
            let tx_handles: Vec<_> = txs
                .iter()
                .map(|sock| s.spawn(move || smol::block_on(send_task(sock, dest, payload, ctl))))
                .collect();
            let seconds = ctl.drive(timing.warmup, timing.duration, shutdown);
            let sent = tx_handles.into_iter().map(|h| h.join().unwrap_or(0)).sum();
            let rx = rx_handles
                .into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect();
            Ok(Outcome { sent, rx, seconds })
        })
    }
}

/// Warm-up and window lengths.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub warmup: Duration,
    pub duration: Duration,
}

/// Runs one configuration. Fails with a message naming the backend on any
/// socket error; never blocks longer than warm-up + window + drain.
pub fn run_case(case: &UdpCase, timing: &Timing, shutdown: &Shutdown) -> Result<UdpRow> {
    let ctl = Arc::new(Ctl::new());
    let outcome = match case.socket {
        SocketKind::Std => run_blocking::<StdLib>(case, timing, &ctl, shutdown),
        SocketKind::Socket2 => run_blocking::<Socket2Lib>(case, timing, &ctl, shutdown),
        SocketKind::Nix => run_blocking::<nixlib::NixLib>(case, timing, &ctl, shutdown),
        SocketKind::Tokio => tokiolib::run(case, timing, Arc::clone(&ctl), shutdown),
        SocketKind::Async => smollib::run(case, timing, &ctl, shutdown),
    }?;
    if let Some(e) = ctl.take_error() {
        return Err(Error::runtime(format!("{}: {e}", describe(case))));
    }
    Ok(row(case, &outcome))
}

/// A configuration in words, for error messages.
pub fn describe(case: &UdpCase) -> String {
    format!(
        "socket={} threads={} conn={:?} ip={:?} payload={} reuse={:?}",
        case.socket.name(),
        case.threads,
        case.conn,
        case.ip,
        case.payload,
        case.reuse
    )
    .to_lowercase()
}

fn row(case: &UdpCase, o: &Outcome) -> UdpRow {
    let (senders, receivers) = UdpCase::split(case.threads);
    let packets: u64 = o.rx.iter().map(|c| c.packets).sum();
    let bytes: u64 = o.rx.iter().map(|c| c.bytes).sum();
    UdpRow {
        socket: case.socket,
        mode: case.mode(),
        threads: case.threads,
        senders,
        receivers,
        rx_sockets: case.rx_sockets(),
        conn: case.conn,
        ip: case.ip,
        payload: case.payload,
        reuse: case.reuse,
        seconds: o.seconds,
        sent_packets: o.sent,
        received_packets: packets,
        received_bytes: bytes,
        mbit_per_s: units::per_second(bytes as f64 * 8.0, o.seconds) / 1e6,
        packets_per_s: units::per_second(packets as f64, o.seconds),
        loss_percent: loss_percent(o.sent, packets),
        active_receivers: o.rx.iter().filter(|c| c.packets > 0).count(),
        rtt_us: (case.mode() == Mode::PingPong && packets > 0)
            .then(|| o.seconds * 1e6 / packets as f64),
    }
}

/// Send-side loss in percent; 0 when nothing was sent, never negative.
pub fn loss_percent(sent: u64, received: u64) -> f64 {
    if sent == 0 {
        0.0
    } else {
        sent.saturating_sub(received) as f64 * 100.0 / sent as f64
    }
}

/// Runs the whole matrix, with a progress bar counting configurations.
pub fn run_matrix(m: &UdpMatrix, bar: &Bar, shutdown: &Shutdown) -> Result<Vec<UdpRow>> {
    let timing = Timing {
        warmup: m.warmup,
        duration: m.duration,
    };
    let mut rows = Vec::new();
    for case in &m.cases {
        if shutdown.is_triggered() {
            break;
        }
        bar.message(&describe(case));
        rows.push(run_case(case, &timing, shutdown)?);
        bar.inc();
    }
    Ok(rows)
}

/// The human table: one row per configuration, the axes as columns.
pub fn table(rows: &[UdpRow]) -> Table {
    let mut t = Table::new(&[
        "socket",
        "mode",
        "threads",
        "tx+rx",
        "rx socks",
        "conn",
        "ip",
        "payload",
        "reuse",
        "Mbit/s",
        "kpkt/s",
        "loss %",
        "rx active",
        "rtt us",
    ]);
    for r in rows {
        t.push(vec![
            r.socket.name().into(),
            match r.mode {
                Mode::Stream => "stream".into(),
                Mode::PingPong => "ping-pong".into(),
            },
            r.threads.to_string(),
            format!("{}+{}", r.senders, r.receivers),
            r.rx_sockets.to_string(),
            format!("{:?}", r.conn).to_lowercase(),
            format!("{:?}", r.ip).to_lowercase(),
            r.payload.to_string(),
            format!("{:?}", r.reuse).to_lowercase(),
            output::mbit(r.mbit_per_s * 1e6),
            format!("{:.1}", r.packets_per_s / 1e3),
            format!("{:.2}", r.loss_percent),
            format!("{}/{}", r.active_receivers, r.receivers),
            r.rtt_us
                .map(|v| format!("{v:.1}"))
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    t
}

/// Bandwidth against payload, one line per socket type: for each socket
/// and payload, the best row over the other axes (say so in the title when
/// other axes varied; filter them for a single slice).
pub fn series(rows: &[UdpRow]) -> Vec<Series> {
    let mut kinds: Vec<SocketKind> = rows.iter().map(|r| r.socket).collect();
    kinds.sort();
    kinds.dedup();
    kinds
        .into_iter()
        .map(|k| {
            let mut points: Vec<(f64, f64)> = Vec::new();
            for r in rows.iter().filter(|r| r.socket == k) {
                let x = r.payload as f64;
                match points.iter_mut().find(|p| p.0 == x) {
                    Some(p) => p.1 = p.1.max(r.mbit_per_s),
                    None => points.push((x, r.mbit_per_s)),
                }
            }
            Series {
                name: k.name().into(),
                points,
            }
        })
        .collect()
}

fn axes_varied(rows: &[UdpRow]) -> bool {
    let first = match rows.first() {
        Some(r) => r,
        None => return false,
    };
    rows.iter().any(|r| {
        (r.threads, r.conn, r.ip, r.reuse) != (first.threads, first.conn, first.ip, first.reuse)
    })
}

/// `sockbench udp`: validate, run, print, plot.
pub fn main(args: &UdpArgs, shutdown: &Shutdown) -> Result<()> {
    let format = Format::from_flags(args.out.json, args.out.csv)?;
    let m = UdpMatrix::from_args(args)?;
    let bar = Bar::new(m.cases.len(), args.out.quiet);
    if !args.out.quiet {
        eprintln!(
            "sockbench udp: {} configurations, about {:.0} s",
            m.cases.len(),
            m.estimate().as_secs_f64()
        );
    }
    let result = run_matrix(&m, &bar, shutdown);
    bar.finish();
    let rows = result?;
    #[derive(Serialize)]
    struct Settings {
        duration_s: f64,
        warmup_s: f64,
    }
    let text = match format {
        Format::Table => table(&rows).render(),
        Format::Json => {
            output::json(
                "udp",
                &Settings {
                    duration_s: m.duration.as_secs_f64(),
                    warmup_s: m.warmup.as_secs_f64(),
                },
                &rows,
            )? + "\n"
        }
        Format::Csv => output::csv(&rows)?,
    };
    print!("{text}");
    if let Some(path) = &args.out.plot {
        // Throughput rows only: a ping-pong row measures latency. Plot
        // ping-pong rows only when nothing else ran.
        let streams: Vec<UdpRow> = rows
            .iter()
            .filter(|r| r.mode == Mode::Stream)
            .cloned()
            .collect();
        let plotted: &[UdpRow] = if streams.is_empty() { &rows } else { &streams };
        let title = if plotted.is_empty() {
            "UDP bandwidth received (no rows)".to_string()
        } else if axes_varied(plotted) {
            "UDP bandwidth received, streams (best over threads, conn, ip, reuse)".to_string()
        } else {
            let r = &plotted[0];
            format!(
                "UDP bandwidth received ({}, {} threads, {:?}, {:?}, reuse {:?})",
                if r.mode == Mode::Stream {
                    "stream"
                } else {
                    "ping-pong"
                },
                r.threads,
                r.conn,
                r.ip,
                r.reuse
            )
            .to_lowercase()
            .replace("udp", "UDP")
        };
        plot::draw(
            path,
            &plot::Chart {
                title: &title,
                x_label: "payload (bytes)",
                y_label: "Mbit/s received",
                log_x: false,
                series: &series(plotted),
            },
        )?;
    }
    if shutdown.is_triggered() {
        return Err(Error::runtime(format!(
            "interrupted after {} of {} configurations",
            rows.len(),
            m.cases.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_split_has_no_idle_or_missing_role() {
        assert_eq!(UdpCase::split(1), (1, 1));
        assert_eq!(UdpCase::split(2), (1, 1));
        assert_eq!(UdpCase::split(3), (2, 1));
        assert_eq!(UdpCase::split(4), (2, 2));
        assert_eq!(UdpCase::split(5), (3, 2));
    }

    #[test]
    fn loss_is_never_negative() {
        assert_eq!(loss_percent(0, 0), 0.0);
        assert_eq!(loss_percent(100, 90), 10.0);
        assert_eq!(loss_percent(100, 120), 0.0);
    }

    #[test]
    fn counts_only_the_window() {
        let mut c = RxCount::default();
        c.add(10, &[WARMUP; 10]);
        c.add(10, &[MEASURE; 10]);
        c.add(0, &[MEASURE]);
        assert_eq!((c.packets, c.bytes), (1, 10));
    }
}
