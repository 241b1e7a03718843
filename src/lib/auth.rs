//! `--psk`: a pre-shared key that makes a result tamper-evident.
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
}
