//! Datagrams with any source address, for the attacks in the namespace
//! tests: raw IPv4/UDP packets sent with IP_HDRINCL from an attacker's
//! namespace, at a steady rate, bounded in count and time.

use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

/// A raw IPv4/UDP datagram from `src` to `dst` (IP_HDRINCL: the kernel
/// fills in the total length, the id and the header checksum; a UDP
/// checksum of 0 means none).
pub fn forged(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; 28];
    p[0] = 0x45;
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src.ip().octets());
    p[16..20].copy_from_slice(&dst.ip().octets());
    p[20..22].copy_from_slice(&src.port().to_be_bytes());
    p[22..24].copy_from_slice(&dst.port().to_be_bytes());
    p[24..26].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    p.extend_from_slice(payload);
    p
}

/// A raw socket of the calling thread's namespace.
pub struct Raw(libc::c_int);

impl Raw {
    pub fn new() -> Raw {
        // SAFETY: socket(2) with constant arguments; the fd is checked and
        // closed on drop.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        Raw(fd)
    }

    /// Sends one raw IP packet toward `dst`; true when the kernel took it.
    pub fn send(&self, dst: SocketAddrV4, packet: &[u8]) -> bool {
        let to = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: dst.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(dst.ip().octets()),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: the buffer and the address are valid for the call.
        let n = unsafe {
            libc::sendto(
                self.0,
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&to as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        n == packet.len() as isize
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: the fd is ours and open.
        unsafe { libc::close(self.0) };
    }
}

/// Sends each of `datagrams` (raw IP packets) `times` times, 2 ms apart;
/// returns the IP bytes sent.
pub fn send_raw(dst: SocketAddrV4, datagrams: &[Vec<u8>], times: usize) -> u64 {
    let raw = Raw::new();
    let mut bytes = 0;
    for _ in 0..times {
        for d in datagrams {
            assert!(
                raw.send(dst, d),
                "sendto: {}",
                std::io::Error::last_os_error()
            );
            bytes += d.len() as u64;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    bytes
}

/// What a flood sent.
#[derive(Debug, Clone, Copy, Default)]
pub struct Flooded {
    pub packets: u64,
    /// IP bytes.
    pub bytes: u64,
    pub seconds: f64,
}

/// Sends `next(i)` (a raw IP packet) toward `dst` at `rate` a second for
/// `span` (`rate × span` in all, the last within a second more), or until
/// `stop` says so: paced in 1 ms steps.
pub fn flood(
    dst: SocketAddrV4,
    rate: u64,
    span: Duration,
    stop: &dyn Fn() -> bool,
    mut next: impl FnMut(u64) -> Vec<u8>,
) -> Flooded {
    let raw = Raw::new();
    let start = Instant::now();
    let most = rate * span.as_millis() as u64 / 1000;
    let mut out = Flooded::default();
    let deadline = span + Duration::from_secs(1);
    while out.packets < most && start.elapsed() < deadline && !stop() {
        let due = (rate as u128 * start.elapsed().as_micros() / 1_000_000) as u64;
        while out.packets < due.min(most) {
            let packet = next(out.packets);
            if raw.send(dst, &packet) {
                out.bytes += packet.len() as u64;
            }
            out.packets += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    out.seconds = start.elapsed().as_secs_f64();
    out
}

/// A small deterministic random source (xorshift64*).
pub struct Random(u64);

impl Random {
    pub fn new(seed: u64) -> Random {
        Random(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A port from 1024 up.
    pub fn port(&mut self) -> u16 {
        1024 + (self.next() % 64_000) as u16
    }

    /// An address anywhere in 100.64.0.0/10 (shared address space: never
    /// a real host's here).
    pub fn addr(&mut self) -> std::net::Ipv4Addr {
        let n = self.next() as u32;
        std::net::Ipv4Addr::from(0x6440_0000 | (n & 0x003f_ffff))
    }
}
