//! The server's answer to a round-trip probe: at once, and no larger than
//! the probe.
//!
//! Why a cookie in every answer: the issue is the same as a reverse
//! stream's, on a smaller scale. An answer of the probe's own size cannot
//! amplify, but answering a stranger at once would let anyone reflect
//! probes at an address they forge. So a probe is echoed (its round trip
//! counts) only when it carries a cookie made for its source address,
//! port and session ([`CookieKey`], stateless); a probe without one gets
//! only a cookie back. Every answer carries a fresh cookie, so a client
//! that probes for longer than a cookie lives never loses its proof. The
//! answer budget per source (the table's limiter) bounds both kinds.

use crate::auth::CookieKey;
use crate::wire::{Probe, ProbeAck, PROBE_ECHOED};
use std::net::SocketAddr;

/// The answer to `probe` from `addr` (canonical) in cookie slot `slot`.
pub fn answer(cookies: &CookieKey, slot: u64, probe: &Probe, addr: SocketAddr) -> ProbeAck {
    let session = probe.header.session;
    let proven = probe.cookie != 0 && cookies.check(addr, session, probe.cookie, slot);
    ProbeAck {
        header: probe.header,
        flags: if proven { PROBE_ECHOED } else { 0 },
        cookie: cookies.cookie(addr, session, slot),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Header;

    #[test]
    fn only_a_probe_with_its_own_cookie_is_echoed() {
        let key = CookieKey::from_bytes([9; 32]);
        let a: SocketAddr = "192.0.2.1:4000".parse().unwrap();
        let b: SocketAddr = "192.0.2.2:4000".parse().unwrap();
        let header = Header {
            session: 7,
            seq: 3,
            send_time_ns: 11,
        };
        let first = answer(&key, 100, &Probe { header, cookie: 0 }, a);
        assert_eq!(first.flags, 0, "no cookie yet: not echoed");
        assert_eq!(first.header, header, "the header comes back as sent");
        let again = answer(
            &key,
            100,
            &Probe {
                header,
                cookie: first.cookie,
            },
            a,
        );
        assert_eq!(again.flags, PROBE_ECHOED);
        let stolen = answer(
            &key,
            100,
            &Probe {
                header,
                cookie: first.cookie,
            },
            b,
        );
        assert_eq!(stolen.flags, 0, "another address cannot use it");
        let other_session = Probe {
            header: Header {
                session: 8,
                ..header
            },
            cookie: first.cookie,
        };
        assert_eq!(answer(&key, 100, &other_session, a).flags, 0);
        let next_slot = answer(
            &key,
            101,
            &Probe {
                header,
                cookie: first.cookie,
            },
            a,
        );
        assert_eq!(next_slot.flags, PROBE_ECHOED, "good in the next slot");
        assert_ne!(next_slot.cookie, first.cookie, "and renewed");
        let stale = answer(
            &key,
            103,
            &Probe {
                header,
                cookie: first.cookie,
            },
            a,
        );
        assert_eq!(stale.flags, 0, "expired");
    }
}
