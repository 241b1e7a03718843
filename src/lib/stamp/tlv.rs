//! What follows the 44-byte base packet: RFC 8972 TLVs, or a TWAMP Light
//! sender's zero padding. netspeed's reflector interprets no TLV, so it
//! copies them all (the answer is as long as the request) and says so in
//! their flags, as RFC 8972 §4 asks of a reflector that does not know a
//! type:
//!
//! - a trailer of zeros is padding: copied unchanged;
//! - Extra Padding (type 1) is "understood" (there is nothing to do but
//!   copy it): its flags are 0, so the U it was sent with is cleared;
//! - any other type gets U (0x80) and nothing else (M, I and the reserved
//!   bits cleared: the whole byte is rewritten);
//! - a TLV whose length runs past the packet is malformed: U and M (0xC0),
//!   and the rest of the packet is copied as it is;
//! - fewer than 4 bytes left (no whole TLV header): copied as they are.
//!
//! The walk is in place and bounded by the packet: any bytes are a valid
//! input, and nothing is ever read or written past the end.

/// The TLV header: flags, type, length (2 bytes, of the value).
pub const TLV_HEADER: usize = 4;
/// Flags: the reflector did not recognise the type.
pub const U_FLAG: u8 = 0x80;
/// Flags: the TLV's length is wrong.
pub const M_FLAG: u8 = 0x40;
/// Flags: the extensions failed an integrity check.
pub const I_FLAG: u8 = 0x20;
/// RFC 8972 §4.1: Extra Padding.
pub const EXTRA_PADDING: u8 = 1;

/// What the walk found, for the reflector's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Walk {
    /// TLVs whose flags were written.
    pub tlvs: u32,
    /// A TLV ran past the packet (marked U and M).
    pub malformed: bool,
}

/// Marks the TLVs of `trailer` (the bytes after the base packet) in place,
/// as the module docs say.
pub fn mark_unrecognized(trailer: &mut [u8]) -> Walk {
    let mut walk = Walk::default();
    if trailer.iter().all(|&b| b == 0) {
        return walk;
    }
    let mut at = 0;
    while trailer.len() - at >= TLV_HEADER {
        let kind = trailer[at + 1];
        let length = usize::from(u16::from_be_bytes([trailer[at + 2], trailer[at + 3]]));
        walk.tlvs += 1;
        if length > trailer.len() - at - TLV_HEADER {
            trailer[at] = U_FLAG | M_FLAG;
            walk.malformed = true;
            break;
        }
        trailer[at] = if kind == EXTRA_PADDING { 0 } else { U_FLAG };
        at += TLV_HEADER + length;
    }
    walk
}

/// Writes the trailer of a test packet netspeed sends: an Extra Padding
/// TLV of zeros (flags U, as RFC 8972 has a sender set them) where there
/// is room for one, else zeros.
pub fn pad(trailer: &mut [u8]) {
    trailer.fill(0);
    if trailer.len() >= TLV_HEADER {
        let length = u16::try_from(trailer.len() - TLV_HEADER).unwrap_or(u16::MAX);
        trailer[0] = U_FLAG;
        trailer[1] = EXTRA_PADDING;
        trailer[2..4].copy_from_slice(&length.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marked(mut bytes: Vec<u8>) -> (Vec<u8>, Walk) {
        let walk = mark_unrecognized(&mut bytes);
        (bytes, walk)
    }

    #[test]
    fn zero_padding_and_short_tails_are_copied_unchanged() {
        for len in [0, 1, 3, 4, 56, 1400] {
            let (out, walk) = marked(vec![0; len]);
            assert_eq!(out, vec![0; len]);
            assert_eq!(walk, Walk::default());
        }
        // Fewer than 4 bytes: no whole header, nothing to mark.
        let (out, _) = marked(vec![0x80, 0xc8, 0x00]);
        assert_eq!(out, vec![0x80, 0xc8, 0x00]);
    }

    #[test]
    fn extra_padding_is_understood_and_other_types_get_u() {
        // Extra Padding sent with U: cleared. An unknown type 200 sent
        // with every flag: U only. An HMAC TLV (8): not verified here, U.
        let mut trailer = vec![0x80, 1, 0, 2, 0xAA, 0xBB];
        trailer.extend([0xFF, 200, 0, 1, 0x11]);
        trailer.extend([0x00, 8, 0, 0]);
        let (out, walk) = marked(trailer);
        assert_eq!(
            out,
            vec![0x00, 1, 0, 2, 0xAA, 0xBB, 0x80, 200, 0, 1, 0x11, 0x80, 8, 0, 0]
        );
        assert_eq!(
            walk,
            Walk {
                tlvs: 3,
                malformed: false
            }
        );
    }

    #[test]
    fn a_tlv_that_runs_past_the_packet_is_malformed_and_the_rest_copied() {
        // Type 200 claims 400 bytes but 8 follow.
        let mut trailer = vec![0x80, 200, 0x01, 0x90];
        trailer.extend([7; 8]);
        let (out, walk) = marked(trailer.clone());
        assert_eq!(out[0], U_FLAG | M_FLAG);
        assert_eq!(out[1..], trailer[1..]);
        assert!(walk.malformed);
        // After a good TLV, a truncated one: the first marked, then stop.
        let (out, walk) = marked(vec![0x80, 1, 0, 0, 0x00, 9, 0, 9, 1, 2]);
        assert_eq!(out, vec![0x00, 1, 0, 0, 0xC0, 9, 0, 9, 1, 2]);
        assert_eq!(
            walk,
            Walk {
                tlvs: 2,
                malformed: true
            }
        );
    }

    #[test]
    fn any_bytes_are_walked_without_a_panic() {
        // Every trailer length up to 70, filled with every byte value in
        // turn, and the research's garbage 0x01 0x02 ... 0x38.
        for len in 0..70 {
            for fill in [0x00u8, 0x01, 0x7F, 0xFF] {
                let (out, _) = marked(vec![fill; len]);
                assert_eq!(out.len(), len);
            }
        }
        let (out, walk) = marked((1..=56).collect());
        // Type 2 with length 0x0304 runs past 56 bytes: U and M.
        assert_eq!(out[0], 0xC0);
        assert!(walk.malformed);
    }

    #[test]
    fn a_sender_pads_with_one_extra_padding_tlv() {
        let mut t = vec![0xEE; 20];
        pad(&mut t);
        assert_eq!(t[..4], [0x80, 1, 0, 16]);
        assert!(t[4..].iter().all(|&b| b == 0));
        let mut short = vec![0xEE; 3];
        pad(&mut short);
        assert_eq!(short, vec![0, 0, 0]);
    }
}
