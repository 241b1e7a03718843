//! `--psk`: a pre-shared key that makes a result tamper-evident.
//!
//! Also the server's address cookies ([`CookieKey`]), which prove a
//! client receives at the address it sends from before the server sends it
//! anything larger than what it sent.
//!
//! Why only the End and its answer: they carry the result. An HMAC over the
//! End proves the totals come from a client that knows the key, and one over
//! the EndAck (which echoes the End's fresh nonce) proves the figures come
//! from the server, for this End, and are not a replay. Data datagrams stay
//! unauthenticated, which keeps the fast path free of per-datagram crypto;
//! what an on-path attacker can still do to them is written down in
//! `docs/protocol.md`.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of a tag: a full HMAC-SHA256.
pub const TAG_LEN: usize = 32;

/// A pre-shared key.
#[derive(Clone)]
pub struct Psk {
    key: Vec<u8>,
}

impl std::fmt::Debug for Psk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.write_str("Psk(..)")
    }
}

/// The fewest bytes a key may have: shorter keys are guessable.
pub const MIN_KEY_LEN: usize = 8;

impl Psk {
    /// A key from its bytes; None when it is too short.
    pub fn new(key: &[u8]) -> Option<Self> {
        (key.len() >= MIN_KEY_LEN).then(|| Psk { key: key.to_vec() })
    }

    fn mac(&self) -> Hmac<Sha256> {
        Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes keys of any length")
    }

    /// The tag of `bytes`.
    pub fn tag(&self, bytes: &[u8]) -> [u8; TAG_LEN] {
        let mut mac = self.mac();
        mac.update(bytes);
        mac.finalize().into_bytes().into()
    }

    /// Whether `tag` is the tag of `bytes`, compared in constant time.
    pub fn verify(&self, bytes: &[u8], tag: &[u8]) -> bool {
        let mut mac = self.mac();
        mac.update(bytes);
        mac.verify_slice(tag).is_ok()
    }
}

/// A random u64 from the OS: session ids and nonces must not be guessable
/// by anyone who cannot see the traffic.
pub fn random_u64() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        // No OS randomness (never seen on Linux): a keyed hash of the time
        // is still unique per call, if not secret.
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        h.finish()
    })
}

/// How long a cookie stays good: it is accepted in the slot it was made
/// in and the next, so 10 to 20 s after the HelloAck.
pub const COOKIE_SLOT: std::time::Duration = std::time::Duration::from_secs(10);

/// The server's secret for address cookies: a MAC over a client's address,
/// port and session in a time slot. Why a MAC and not a table of issued
/// cookies: checking it needs no state, so a flood of Hellos from forged
/// addresses creates none (QUIC's Retry token, DTLS's cookie). The secret
/// is made fresh from the OS's random source when the server starts.
pub struct CookieKey {
    key: [u8; 32],
}

impl std::fmt::Debug for CookieKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CookieKey(..)")
    }
}

impl CookieKey {
    /// A fresh secret; None only when the OS has no random source.
    pub fn random() -> Option<Self> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).ok()?;
        Some(CookieKey { key })
    }

    /// A key from known bytes (tests).
    pub fn from_bytes(key: [u8; 32]) -> Self {
        CookieKey { key }
    }

    /// The cookie for `addr` (as the peer sent from, canonical: an IPv4
    /// peer on a dual-stack socket by its IPv4 address) and `session`, in
    /// time slot `slot`. Never 0: 0 means "no cookie" on the wire.
    pub fn cookie(&self, addr: std::net::SocketAddr, session: u64, slot: u64) -> u64 {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length");
        let ip = match addr.ip().to_canonical() {
            std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            std::net::IpAddr::V6(v6) => v6,
        };
        mac.update(b"netspeed cookie 1");
        mac.update(&ip.octets());
        mac.update(&addr.port().to_be_bytes());
        mac.update(&session.to_be_bytes());
        mac.update(&slot.to_be_bytes());
        let tag = mac.finalize().into_bytes();
        let mut first = [0u8; 8];
        first.copy_from_slice(&tag[..8]);
        u64::from_be_bytes(first).max(1)
    }

    /// Whether `cookie` was made for `addr` and `session` in slot `now` or
    /// the one before. The comparison does not stop at the first differing
    /// bit.
    pub fn check(&self, addr: std::net::SocketAddr, session: u64, cookie: u64, now: u64) -> bool {
        let good = |slot: u64| (self.cookie(addr, session, slot) ^ cookie) == 0;
        let current = good(now);
        let previous = now > 0 && good(now - 1);
        cookie != 0 && (current | previous)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_verify_and_any_change_breaks_them() {
        let psk = Psk::new(b"correct horse").unwrap();
        let tag = psk.tag(b"the End");
        assert!(psk.verify(b"the End", &tag));
        assert!(!psk.verify(b"the end", &tag));
        let mut bad = tag;
        bad[31] ^= 1;
        assert!(!psk.verify(b"the End", &bad));
        let other = Psk::new(b"another key").unwrap();
        assert!(!other.verify(b"the End", &tag));
        assert!(Psk::new(b"short").is_none());
        assert_eq!(format!("{psk:?}"), "Psk(..)");
    }

    #[test]
    fn rfc_4231_test_case_2() {
        // HMAC-SHA256 with key "Jefe", "what do ya want for nothing?".
        let mac = Psk {
            key: b"Jefe".to_vec(),
        };
        let tag = mac.tag(b"what do ya want for nothing?");
        let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn cookies_bind_address_port_session_and_slot() {
        let key = CookieKey::from_bytes([5; 32]);
        let a: std::net::SocketAddr = "192.0.2.1:4000".parse().unwrap();
        let c = key.cookie(a, 7, 100);
        assert_ne!(c, 0);
        assert!(key.check(a, 7, c, 100), "its own slot");
        assert!(key.check(a, 7, c, 101), "the next slot");
        assert!(!key.check(a, 7, c, 102), "too old");
        assert!(!key.check(a, 7, c, 99), "not before it was made");
        assert!(
            !key.check("192.0.2.1:4001".parse().unwrap(), 7, c, 100),
            "port"
        );
        assert!(
            !key.check("192.0.2.2:4000".parse().unwrap(), 7, c, 100),
            "address"
        );
        assert!(!key.check(a, 8, c, 100), "session");
        assert!(!key.check(a, 7, c ^ 1, 100), "one bit off");
        assert!(!key.check(a, 7, 0, 100), "no cookie");
        // The same client seen through a dual-stack socket.
        let mapped: std::net::SocketAddr = "[::ffff:192.0.2.1]:4000".parse().unwrap();
        assert!(key.check(mapped, 7, c, 100));
        // Another server's secret makes other cookies.
        assert!(!CookieKey::from_bytes([6; 32]).check(a, 7, c, 100));
        assert_eq!(format!("{key:?}"), "CookieKey(..)");
    }
}
