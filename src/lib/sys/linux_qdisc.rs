//! The sender's own egress queue on Linux: which device a destination
//! leaves by (RTM_GETROUTE), that device's root qdisc and its counters
//! (RTM_GETQDISC), the kernel's UDP SndbufErrors, and the thread's
//! scheduler times. Part of `sys/linux.rs`'s backend, split off by concern.
//!
//! Why raw rtnetlink and not a crate: two requests and three attributes
//! (the route's output device; the qdisc's kind, its queue statistics and
//! tbf's parameters) are about a hundred lines of plain byte parsing, and
//! the parser is a pure function over `&[u8]` that the tests feed fixtures.
//! `netlink-packet-route` would bring a tree of crates for those.
//!
//! The netlink wire format (all in host byte order, attributes 4-aligned):
//! ```text
//! nlmsghdr  len u32 | type u16 | flags u16 | seq u32 | pid u32   (16 bytes)
//! rtmsg     family dst_len src_len tos table protocol scope type u8 | flags u32  (12)
//! tcmsg     family u8 | pad u8 | pad u16 | ifindex i32 | handle u32 | parent u32 | info u32  (20)
//! rtattr    len u16 | type u16 | payload, padded to 4
//! ```

use super::super::{EgressDevice, QdiscStats, TbfParams};
use std::io;
use std::mem::size_of;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

const NLMSG_HDR: usize = 16;
const RTMSG_LEN: usize = 12;
const TCMSG_LEN: usize = 20;

const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWQDISC: u16 = 36;
const RTM_GETQDISC: u16 = 38;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;

const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;

const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_STATS: u16 = 3;
const TCA_STATS2: u16 = 7;
const TCA_STATS_BASIC: u16 = 1;
const TCA_STATS_QUEUE: u16 = 3;
const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
/// The root of a device's qdisc tree (TC_H_ROOT).
const TC_H_ROOT: u32 = 0xFFFF_FFFF;
/// One psched tick in ns (PSCHED_SHIFT = 6).
const PSCHED_TICK_NS: u64 = 64;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The attributes in `b`, as (type, payload); stops at the first that
/// does not fit (a truncated message yields what is whole).
fn attributes(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = u16_at(b, 0)? as usize;
        let kind = u16_at(b, 2)? & 0x3FFF; // NLA_F_NESTED, NLA_F_NET_BYTEORDER
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        b = &b[align4(len).min(b.len())..];
        Some((kind, payload))
    })
}

/// The netlink messages in one datagram, as (type, payload after the
/// header).
fn messages(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = u32_at(b, 0)? as usize;
        let kind = u16_at(b, 4)?;
        if len < NLMSG_HDR || len > b.len() {
            return None;
        }
        let payload = &b[NLMSG_HDR..len];
        b = &b[align4(len).min(b.len())..];
        Some((kind, payload))
    })
}

/// What one datagram of an answer held.
#[derive(Debug, Default)]
struct Answer {
    found: Option<QdiscStats>,
    oif: Option<u32>,
    /// NLMSG_DONE, or an NLMSG_ERROR (0 is an acknowledgement).
    done: bool,
    error: Option<i32>,
}

/// Parses one datagram of an RTM_GETROUTE or RTM_GETQDISC answer: the
/// route's output device, or the root qdisc of `ifindex`.
fn parse_answer(b: &[u8], ifindex: u32) -> Answer {
    let mut out = Answer::default();
    for (kind, payload) in messages(b) {
        match kind {
            NLMSG_DONE => out.done = true,
            NLMSG_ERROR => {
                out.done = true;
                let errno = u32_at(payload, 0).map_or(0, |e| e as i32);
                if errno != 0 {
                    out.error = Some(-errno);
                }
            }
            RTM_NEWROUTE if payload.len() >= RTMSG_LEN => {
                for (t, v) in attributes(&payload[RTMSG_LEN..]) {
                    if t == RTA_OIF {
                        out.oif = u32_at(v, 0);
                    }
                }
            }
            RTM_NEWQDISC if out.found.is_none() => out.found = parse_qdisc(payload, ifindex),
            _ => {}
        }
    }
    out
}

/// One RTM_NEWQDISC payload (tcmsg and attributes): its counters, if it is
/// `ifindex`'s root qdisc.
fn parse_qdisc(payload: &[u8], ifindex: u32) -> Option<QdiscStats> {
    let index = u32_at(payload, 4)?;
    let parent = u32_at(payload, 12)?;
    if index != ifindex || parent != TC_H_ROOT || payload.len() < TCMSG_LEN {
        return None;
    }
    let mut q = QdiscStats {
        ifindex,
        ..QdiscStats::default()
    };
    let mut queue_seen = false;
    let mut legacy = None;
    let mut rate64 = None;
    let mut buffer_ticks = None;
    for (t, v) in attributes(&payload[TCMSG_LEN..]) {
        match t {
            TCA_KIND => {
                q.kind =
                    String::from_utf8_lossy(v.split(|&c| c == 0).next().unwrap_or(&[])).into_owned()
            }
            TCA_STATS2 => {
                for (s, w) in attributes(v) {
                    match s {
                        // gnet_stats_basic: bytes u64, packets u32.
                        TCA_STATS_BASIC => {
                            q.bytes = u64_at(w, 0).unwrap_or(0);
                            q.packets = u32_at(w, 8).map_or(0, u64::from);
                        }
                        // gnet_stats_queue: qlen, backlog, drops, requeues,
                        // overlimits, all u32.
                        TCA_STATS_QUEUE => {
                            let field = |i: usize| u32_at(w, 4 * i).unwrap_or(0);
                            q.qlen = field(0);
                            q.backlog_bytes = field(1);
                            q.drops = field(2);
                            q.requeues = field(3);
                            q.overlimits = field(4);
                            queue_seen = true;
                        }
                        _ => {}
                    }
                }
            }
            // tc_stats: bytes u64, packets, drops, overlimits, bps, pps,
            // qlen, backlog (u32): the older form, kept as a fallback.
            TCA_STATS => legacy = Some(v),
            TCA_OPTIONS => {
                for (o, w) in attributes(v) {
                    match o {
                        // tc_tbf_qopt: rate (tc_ratespec, 12 bytes, its
                        // rate u32 at 8), peakrate (12), limit, buffer
                        // (psched ticks), mtu.
                        TCA_TBF_PARMS if w.len() >= 36 => {
                            q.tbf = Some(TbfParams {
                                rate_bytes_per_s: u32_at(w, 8).map_or(0, u64::from),
                                limit_bytes: u32_at(w, 24).unwrap_or(0),
                                burst_bytes: 0,
                            });
                            buffer_ticks = u32_at(w, 28);
                        }
                        TCA_TBF_RATE64 => rate64 = u64_at(w, 0),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    if !queue_seen {
        let v = legacy?;
        q.bytes = u64_at(v, 0).unwrap_or(0);
        q.packets = u32_at(v, 8).map_or(0, u64::from);
        q.drops = u32_at(v, 12).unwrap_or(0);
        q.overlimits = u32_at(v, 16).unwrap_or(0);
        q.qlen = u32_at(v, 28).unwrap_or(0);
        q.backlog_bytes = u32_at(v, 32).unwrap_or(0);
    }
    if q.kind != "tbf" {
        q.tbf = None;
    }
    if let Some(tbf) = q.tbf.as_mut() {
        if let Some(r) = rate64 {
            tbf.rate_bytes_per_s = r;
        }
        // The burst is the bucket's depth, which tbf keeps as a time at
        // the rate (psched_ns_t2l).
        let ns = u64::from(buffer_ticks.unwrap_or(0)) * PSCHED_TICK_NS;
        tbf.burst_bytes = (u128::from(ns) * u128::from(tbf.rate_bytes_per_s) / 1_000_000_000)
            .min(u128::from(u64::MAX)) as u64;
    }
    Some(q)
}

/// A NETLINK_ROUTE socket that answers within a second.
fn route_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) with constant arguments; the fd it returns is
    // owned at once below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let timeout = libc::timeval {
        tv_sec: 1,
        tv_usec: 0,
    };
    // SAFETY: `timeout` lives across the call and its size is passed
    // exactly; the fd is open.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Sends `request` (a whole netlink message) and reads the answer, one
/// datagram at a time, until `parse` says it is done. Bounded: at most
/// 4096 datagrams, each within the socket's one-second timeout.
fn ask(request: &[u8], ifindex: u32) -> io::Result<Answer> {
    // A request that is not a dump is answered in one datagram.
    let dump = u16_at(request, 6).is_some_and(|f| f & NLM_F_DUMP != 0);
    let fd = route_socket()?;
    // SAFETY: `request` is valid for its length during the call; the fd
    // is open. The kernel is the default destination of a netlink socket.
    let rc = unsafe { libc::send(fd.as_raw_fd(), request.as_ptr().cast(), request.len(), 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 64 * 1024];
    let mut all = Answer::default();
    for _ in 0..4096 {
        // SAFETY: `buf` is valid and writable for its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let part = parse_answer(&buf[..n as usize], ifindex);
        if let Some(errno) = part.error {
            return Err(io::Error::from_raw_os_error(errno));
        }
        all.found = all.found.or(part.found);
        all.oif = all.oif.or(part.oif);
        if part.done || !dump {
            return Ok(all);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "the kernel's netlink answer did not end",
    ))
}

/// A netlink request: header, fixed part, attributes.
fn request(kind: u16, flags: u16, fixed: &[u8], attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut b = vec![0u8; NLMSG_HDR];
    b.extend_from_slice(fixed);
    for (t, v) in attrs {
        let len = 4 + v.len();
        b.extend_from_slice(&(len as u16).to_ne_bytes());
        b.extend_from_slice(&t.to_ne_bytes());
        b.extend_from_slice(v);
        b.resize(align4(b.len()), 0);
    }
    let len = b.len() as u32;
    b[0..4].copy_from_slice(&len.to_ne_bytes());
    b[4..6].copy_from_slice(&kind.to_ne_bytes());
    b[6..8].copy_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
    b[8..12].copy_from_slice(&1u32.to_ne_bytes());
    b
}

/// The device a datagram to `dest` leaves by (the kernel's route for it,
/// as `ip route get` asks), with its name and MTU.
pub fn egress_device(dest: IpAddr) -> io::Result<EgressDevice> {
    let (family, bytes): (u8, Vec<u8>) = match dest {
        IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec()),
        IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec()),
    };
    let mut rtmsg = [0u8; RTMSG_LEN];
    rtmsg[0] = family;
    rtmsg[1] = (bytes.len() * 8) as u8;
    let answer = ask(&request(RTM_GETROUTE, 0, &rtmsg, &[(RTA_DST, &bytes)]), 0)?;
    let ifindex = answer
        .oif
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no route to {dest}")))?;
    let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `name` holds IF_NAMESIZE bytes, as if_indextoname requires.
    let named = unsafe { libc::if_indextoname(ifindex, name.as_mut_ptr()) };
    if named.is_null() {
        return Err(io::Error::last_os_error());
    }
    let name: Vec<u8> = name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let name = String::from_utf8_lossy(&name).into_owned();
    Ok(EgressDevice {
        mtu: device_mtu(&name),
        ifindex,
        name,
    })
}

/// SIOCGIFMTU on a throwaway datagram socket.
fn device_mtu(name: &str) -> Option<u32> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0")
        .or_else(|_| std::net::UdpSocket::bind("[::]:0"))
        .ok()?;
    // SAFETY: ifreq is plain old data; all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= req.ifr_name.len() {
        return None;
    }
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq with a NUL-terminated name, writable
    // for the call; the fd is open.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFMTU, &mut req) };
    if rc != 0 {
        return None;
    }
    // SAFETY: after a successful SIOCGIFMTU the union holds the MTU.
    Some(unsafe { req.ifr_ifru.ifru_mtu } as u32)
}

/// The root qdisc of device `ifindex` and its counters, or None when the
/// device has none.
///
/// Why a dump of every device's qdiscs and not a request for this one's:
/// the kernel answers a single RTM_GETQDISC only to the multicast group
/// (and to the asker only with NLM_F_ECHO, which also tells every `tc
/// monitor` and daemon listening that the qdisc changed). A dump is
/// answered to the asker alone: reading the counters changes nothing.
pub fn root_qdisc(ifindex: u32) -> io::Result<Option<QdiscStats>> {
    let mut tcmsg = [0u8; TCMSG_LEN];
    tcmsg[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    let answer = ask(&request(RTM_GETQDISC, NLM_F_DUMP, &tcmsg, &[]), ifindex)?;
    Ok(answer.found)
}

/// One counter of a `/proc/net/snmp`-style table: the header line that
/// starts with `prefix` names the fields, the next line holds the values.
fn snmp_field(text: &str, prefix: &str, field: &str) -> Option<u64> {
    let mut lines = text.lines().filter(|l| l.starts_with(prefix));
    let names = lines.next()?;
    let values = lines.next()?;
    let at = names.split_whitespace().position(|n| n == field)?;
    values.split_whitespace().nth(at)?.parse().ok()
}

/// `/proc/net/snmp6` is one `name value` per line.
fn snmp6_field(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut parts = l.split_whitespace();
        (parts.next()? == field).then_some(())?;
        parts.next()?.parse().ok()
    })
}

/// The network namespace's UDP SndbufErrors, IPv4 and IPv6 summed (the
/// IPv6 table may be absent).
pub fn udp_sndbuf_errors() -> io::Result<u64> {
    let v4 = std::fs::read_to_string("/proc/net/snmp")?;
    let v4 = snmp_field(&v4, "Udp:", "SndbufErrors").ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "no Udp SndbufErrors in /proc/net/snmp",
        )
    })?;
    let v6 = std::fs::read_to_string("/proc/net/snmp6")
        .ok()
        .and_then(|t| snmp6_field(&t, "Udp6SndbufErrors"))
        .unwrap_or(0);
    Ok(v4 + v6)
}

/// The calling thread's time on a CPU and waiting on a run queue, from
/// /proc/thread-self/schedstat.
pub fn thread_sched() -> Option<(Duration, Duration)> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
    let on_cpu = fields.next()??;
    let waiting = fields.next()??;
    Some((Duration::from_nanos(on_cpu), Duration::from_nanos(waiting)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut b = ((4 + payload.len()) as u16).to_ne_bytes().to_vec();
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(payload);
        b.resize(align4(b.len()), 0);
        b
    }

    fn message(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut b = ((NLMSG_HDR + payload.len()) as u32).to_ne_bytes().to_vec();
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(&[0; 10]);
        b.extend_from_slice(payload);
        b.resize(align4(b.len()), 0);
        b
    }

    fn words(ws: &[u32]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    /// A qdisc as the kernel dumps it: tcmsg, kind, options, stats2.
    fn qdisc(ifindex: u32, parent: u32, kind: &str, queue: [u32; 5], tbf: bool) -> Vec<u8> {
        let mut tc = vec![0u8; 4];
        tc.extend(words(&[ifindex, 0x8001_0000, parent, 1]));
        let mut name = kind.as_bytes().to_vec();
        name.push(0);
        tc.extend(attr(TCA_KIND, &name));
        if tbf {
            // rate 25,000,000 B/s (200 Mbit/s), limit 65536, buffer 20480
            // ticks (1.31 ms: 32768 bytes at that rate), mtu 1514.
            let mut parms = words(&[0, 0, 25_000_000]);
            parms.extend(words(&[0, 0, 0]));
            parms.extend(words(&[65536, 20480, 1514]));
            tc.extend(attr(TCA_OPTIONS, &attr(TCA_TBF_PARMS, &parms)));
        }
        let mut basic = 123_456u64.to_ne_bytes().to_vec();
        basic.extend(words(&[789, 0]));
        let mut stats = attr(TCA_STATS_BASIC, &basic);
        stats.extend(attr(TCA_STATS_QUEUE, &words(&queue)));
        tc.extend(attr(TCA_STATS2, &stats));
        message(RTM_NEWQDISC, &tc)
    }

    #[test]
    fn the_root_qdisc_of_the_device_is_found_among_others() {
        let mut dump = qdisc(3, 0x0001_0000, "bfifo", [9, 9, 999, 9, 9], false);
        dump.extend(qdisc(2, TC_H_ROOT, "noqueue", [0; 5], false));
        dump.extend(qdisc(3, TC_H_ROOT, "tbf", [1, 1442, 4242, 2, 77], true));
        dump.extend(message(NLMSG_DONE, &[0; 4]));
        let a = parse_answer(&dump, 3);
        assert!(a.done);
        let q = a.found.expect("the root qdisc of 3");
        assert_eq!(q.kind, "tbf");
        assert_eq!((q.drops, q.requeues, q.overlimits), (4242, 2, 77));
        assert_eq!((q.qlen, q.backlog_bytes), (1, 1442));
        assert_eq!((q.bytes, q.packets), (123_456, 789));
        let tbf = q.tbf.expect("tbf parameters");
        assert_eq!(tbf.rate_bytes_per_s, 25_000_000);
        assert_eq!(tbf.limit_bytes, 65536);
        assert_eq!(tbf.burst_bytes, 32768);
        // Another device's root is not this one's.
        assert_eq!(parse_answer(&dump, 2).found.unwrap().kind, "noqueue");
        assert!(parse_answer(&dump, 7).found.is_none());
    }

    #[test]
    fn the_old_stats_serve_when_stats2_is_missing() {
        let mut tc = vec![0u8; 4];
        tc.extend(words(&[5, 0, TC_H_ROOT, 1]));
        tc.extend(attr(TCA_KIND, b"pfifo\0"));
        let mut st = 1000u64.to_ne_bytes().to_vec();
        st.extend(words(&[10, 3, 4, 0, 0, 2, 2800]));
        tc.extend(attr(TCA_STATS, &st));
        let q = parse_answer(&message(RTM_NEWQDISC, &tc), 5).found.unwrap();
        assert_eq!((q.kind.as_str(), q.drops, q.overlimits), ("pfifo", 3, 4));
        assert_eq!((q.packets, q.qlen, q.backlog_bytes), (10, 2, 2800));
        assert!(q.tbf.is_none());
    }

    #[test]
    fn truncated_or_garbage_answers_do_not_panic() {
        let full = qdisc(3, TC_H_ROOT, "tbf", [1, 2, 3, 4, 5], true);
        for cut in 0..full.len() {
            let _ = parse_answer(&full[..cut], 3);
        }
        let mut noise = 0x9E37_79B9u32;
        for _ in 0..2000 {
            let b: Vec<u8> = (0..64)
                .map(|_| {
                    noise = noise.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (noise >> 24) as u8
                })
                .collect();
            let _ = parse_answer(&b, 3);
        }
    }

    #[test]
    fn routes_and_errors_are_read() {
        let mut rt = vec![0u8; RTMSG_LEN];
        rt.extend(attr(RTA_DST, &[10, 83, 1, 2]));
        rt.extend(attr(RTA_OIF, &words(&[9])));
        assert_eq!(parse_answer(&message(RTM_NEWROUTE, &rt), 0).oif, Some(9));
        let err = message(NLMSG_ERROR, &words(&[(-libc::ENETUNREACH) as u32]));
        assert_eq!(parse_answer(&err, 0).error, Some(libc::ENETUNREACH));
        assert_eq!(parse_answer(&message(NLMSG_ERROR, &[0; 4]), 0).error, None);
    }

    #[test]
    fn snmp_tables_are_read_by_name() {
        let v4 = "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
                  Udp: 10 0 0 20 3 17\nUdpLite: InDatagrams\nUdpLite: 0\n";
        assert_eq!(snmp_field(v4, "Udp:", "SndbufErrors"), Some(17));
        assert_eq!(snmp_field(v4, "Udp:", "Nope"), None);
        let v6 = "Udp6InDatagrams                 \t5\nUdp6SndbufErrors \t4\n";
        assert_eq!(snmp6_field(v6, "Udp6SndbufErrors"), Some(4));
    }

    #[test]
    fn loopback_has_a_route_and_a_root_qdisc() {
        let dev = egress_device("127.0.0.1".parse().unwrap()).unwrap();
        assert_eq!(dev.name, "lo");
        assert!(dev.mtu.is_some_and(|m| m > 0));
        // lo's root is `noqueue` by default; whatever it is, it is there,
        // and the dump is answered at once.
        let asked = std::time::Instant::now();
        assert!(root_qdisc(dev.ifindex).unwrap().is_some());
        assert!(asked.elapsed() < Duration::from_millis(500));
        assert!(udp_sndbuf_errors().is_ok());
        assert!(thread_sched().is_some());
    }
}
