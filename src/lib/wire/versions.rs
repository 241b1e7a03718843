//! The version negotiation answer: what a server says to a datagram of a
//! version it does not speak. Its layout is fixed for good (QUIC's
//! version negotiation), so that every release, past and future, can
//! tell "another version" from "no server".

use super::*;

/// A version negotiation answer: the server does not speak the version
/// of a datagram it received, and lists the versions it does. Its layout
/// is fixed for good, whatever versions come:
///
/// ```text
/// 0  magic "NSPD"      4  version byte 0       5  the refused version
/// 6  n, versions        7  zero                8  the refused datagram's
/// 16 n bytes: the versions spoken, newest first   bytes 8..16 (its session)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Versions {
    /// The request's bytes 8..16: its session in every version so far.
    pub session: u64,
    pub refused: u8,
    spoken: [u8; 8],
    count: u8,
}

impl Versions {
    /// The versions the answering server speaks, newest first.
    pub fn spoken(&self) -> &[u8] {
        &self.spoken[..self.count as usize]
    }
}

/// The version negotiation answer to `request`, a datagram with
/// netspeed's magic and a version this code does not speak; None when
/// the answer would be larger than the request (the server never sends
/// more than it received) or the request is not such a datagram.
pub fn encode_versions(request: &[u8]) -> Option<Vec<u8>> {
    let len = VERSIONS_HEAD_LEN + VERSIONS_SPOKEN.len();
    if request.len() < len
        || request[0..4] != MAGIC
        || request[4] == VERSION
        || request[4] == NEGOTIATION
    {
        return None;
    }
    let mut buf = vec![0u8; len];
    buf[0..4].copy_from_slice(&MAGIC);
    buf[4] = NEGOTIATION;
    buf[5] = request[4];
    buf[6] = VERSIONS_SPOKEN.len() as u8;
    buf[8..16].copy_from_slice(&request[8..16]);
    buf[VERSIONS_HEAD_LEN..].copy_from_slice(&VERSIONS_SPOKEN);
    Some(buf)
}

pub(super) fn decode_versions(buf: &[u8]) -> Result<Versions, WireError> {
    if buf.len() < VERSIONS_HEAD_LEN {
        return Err(WireError::TooShort(buf.len()));
    }
    let count = buf[6] as usize;
    if count == 0 || count > 8 || buf.len() < VERSIONS_HEAD_LEN + count {
        return Err(WireError::BadField);
    }
    let mut spoken = [0u8; 8];
    spoken[..count].copy_from_slice(&buf[VERSIONS_HEAD_LEN..VERSIONS_HEAD_LEN + count]);
    Ok(Versions {
        session: u64_at(buf, 8),
        refused: buf[5],
        spoken,
        count: count as u8,
    })
}
