//! STAMP's clocks on the wire: the 64-bit NTP timestamp (RFC 5905 §6),
//! the truncated PTPv2 one (RFC 8186 §2.3, when the Z bit is set), and the
//! Error Estimate that says how far either may be off (RFC 4656 §4.1.2).
//!
//! Why the receiver unfolds the NTP era itself: the seconds field has 32
//! bits and wraps on 2036-02-07 06:28:16 UTC; a timestamp is read as the
//! moment nearest to the reader's own clock, so a packet stamped a second
//! after the wrap is not read as 136 years early.

/// Seconds from the NTP epoch (1900-01-01) to the Unix epoch (1970-01-01).
pub const NTP_UNIX_OFFSET: u64 = 2_208_988_800;
/// TAI - UTC, in seconds, since 2017-01-01 (no leap second has been
/// announced since). A PTP timestamp counts TAI seconds from 1970.
pub const TAI_UTC_OFFSET: u64 = 37;

const NANOS: u64 = 1_000_000_000;
const ERA: i128 = 1 << 32;

/// The NTP timestamp of a Unix time in nanoseconds: seconds since 1900
/// (modulo the era) and the fraction of a second in units of 2^-32 s,
/// rounded down.
pub fn ntp_from_unix_ns(unix_ns: u64) -> u64 {
    let seconds = (unix_ns / NANOS + NTP_UNIX_OFFSET) & 0xFFFF_FFFF;
    let fraction = ((u128::from(unix_ns % NANOS) << 32) / u128::from(NANOS)) as u64;
    (seconds << 32) | fraction
}

/// The Unix time (ns) of an NTP timestamp, in the era that puts it
/// nearest `near_unix_ns` (the reader's clock); None before 1970.
pub fn unix_ns_from_ntp(ntp: u64, near_unix_ns: u64) -> Option<u64> {
    let seconds = i128::from(ntp >> 32);
    let fraction = u128::from(ntp & 0xFFFF_FFFF);
    // Rounded to the nearest nanosecond: an encode and a decode give the
    // time back exactly.
    let nanos = ((fraction * u128::from(NANOS) + (1 << 31)) >> 32) as i128;
    let near = i128::from(near_unix_ns / NANOS) + i128::from(NTP_UNIX_OFFSET);
    let era = (near - seconds + ERA / 2).div_euclid(ERA);
    let since_1900 = era * ERA + seconds;
    let unix = (since_1900 - i128::from(NTP_UNIX_OFFSET)) * i128::from(NANOS) + nanos;
    u64::try_from(unix).ok()
}

/// The truncated PTPv2 timestamp of a Unix time: TAI seconds since 1970
/// (low 32 bits) and nanoseconds.
pub fn ptp_from_unix_ns(unix_ns: u64) -> u64 {
    let seconds = (unix_ns / NANOS + TAI_UTC_OFFSET) & 0xFFFF_FFFF;
    (seconds << 32) | (unix_ns % NANOS)
}

/// The Unix time (ns) of a truncated PTPv2 timestamp, in the 2^32-second
/// era nearest `near_unix_ns`; None when its nanoseconds are out of range
/// or it falls before 1970.
pub fn unix_ns_from_ptp(ptp: u64, near_unix_ns: u64) -> Option<u64> {
    let seconds = i128::from(ptp >> 32);
    let nanos = ptp & 0xFFFF_FFFF;
    if nanos >= NANOS {
        return None;
    }
    let near = i128::from(near_unix_ns / NANOS) + i128::from(TAI_UTC_OFFSET);
    let era = (near - seconds + ERA / 2).div_euclid(ERA);
    let tai = era * ERA + seconds;
    let unix = (tai - i128::from(TAI_UTC_OFFSET)) * i128::from(NANOS) + i128::from(nanos);
    u64::try_from(unix).ok()
}

/// The Error Estimate (2 bytes): S (the clock is synchronised to UTC from
/// an external source), Z (the timestamps are PTPv2, not NTP), and an
/// error of `multiplier` × 2^(`scale` − 32) seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorEstimate {
    pub synchronized: bool,
    pub ptp: bool,
    /// 6 bits: 0 to 63.
    pub scale: u8,
    /// Never 0 in what netspeed sends (RFC 4656: a packet with 0 "SHOULD
    /// be considered corrupt").
    pub multiplier: u8,
}

const S_BIT: u16 = 0x8000;
const Z_BIT: u16 = 0x4000;
/// The largest scale the 6 bits hold.
pub const MAX_SCALE: u8 = 63;

impl ErrorEstimate {
    /// The field as it is on the wire (big-endian u16).
    pub fn from_bits(bits: u16) -> ErrorEstimate {
        ErrorEstimate {
            synchronized: bits & S_BIT != 0,
            ptp: bits & Z_BIT != 0,
            scale: ((bits >> 8) & 0x3F) as u8,
            multiplier: (bits & 0xFF) as u8,
        }
    }

    pub fn bits(self) -> u16 {
        let mut bits = (u16::from(self.scale & 0x3F) << 8) | u16::from(self.multiplier);
        if self.synchronized {
            bits |= S_BIT;
        }
        if self.ptp {
            bits |= Z_BIT;
        }
        bits
    }

    /// The smallest estimate at least `error_ns` nanoseconds, in NTP
    /// format: the multiplier is never 0 (a 0 ns error is sent as the
    /// smallest one the field holds, 2^-32 s). The field reaches
    /// 255 × 2^31 s, beyond any u64 of nanoseconds.
    pub fn at_least(error_ns: u64, synchronized: bool) -> ErrorEstimate {
        // The error in units of 2^-32 s, rounded up.
        let units = (u128::from(error_ns) << 32).div_ceil(u128::from(NANOS));
        let mut scale = 0u8;
        while scale < MAX_SCALE && units.div_ceil(1u128 << scale) > 255 {
            scale += 1;
        }
        let multiplier = units.div_ceil(1u128 << scale).clamp(1, 255) as u8;
        ErrorEstimate {
            synchronized,
            ptp: false,
            scale,
            multiplier,
        }
    }

    /// Whether the field is one RFC 4656 allows: a non-zero multiplier.
    pub fn is_valid(self) -> bool {
        self.multiplier != 0
    }

    /// The error it states, in seconds.
    pub fn seconds(self) -> f64 {
        f64::from(self.multiplier) * 2f64.powi(i32::from(self.scale) - 32)
    }

    /// The Unix time (ns) of a timestamp written in this estimate's format
    /// (Z: PTP, else NTP), nearest `near_unix_ns`.
    pub fn unix_ns(self, timestamp: u64, near_unix_ns: u64) -> Option<u64> {
        if self.ptp {
            unix_ns_from_ptp(timestamp, near_unix_ns)
        } else {
            unix_ns_from_ntp(timestamp, near_unix_ns)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-11-27 18:32:22.940294 UTC, as the research capture has it.
    const CAPTURED: u64 = 0xeeb4_4b36_f0b7_1c2d;

    #[test]
    fn ntp_seconds_count_from_1900_and_the_fraction_is_binary() {
        // The Unix epoch is 2 208 988 800 s after the NTP epoch.
        assert_eq!(ntp_from_unix_ns(0), 2_208_988_800u64 << 32);
        // Half a second is 0x8000_0000 of a fraction.
        assert_eq!(
            ntp_from_unix_ns(500_000_000),
            (2_208_988_800u64 << 32) | 0x8000_0000
        );
        // One nanosecond is 4.29 units: rounded down, 4.
        assert_eq!(ntp_from_unix_ns(1) & 0xFFFF_FFFF, 4);
        // The capture decodes to the time tcpdump saw.
        let near = 1_795_804_342 * NANOS;
        let unix = unix_ns_from_ntp(CAPTURED, near).unwrap();
        assert_eq!(unix / NANOS, 1_795_804_342);
        assert_eq!((unix % NANOS) / 1000, 940_294);
    }

    #[test]
    fn a_timestamp_survives_encode_and_decode_to_the_nanosecond() {
        for unix_ns in [
            0,
            1,
            999_999_999,
            1_795_804_342_940_294_123,
            2_085_978_495_999_999_999, // the last ns of NTP era 0
            2_085_978_496_000_000_000, // the first of era 1
            4_000_000_000_123_456_789,
        ] {
            let ntp = ntp_from_unix_ns(unix_ns);
            assert_eq!(unix_ns_from_ntp(ntp, unix_ns), Some(unix_ns), "{unix_ns}");
            let ptp = ptp_from_unix_ns(unix_ns);
            assert_eq!(unix_ns_from_ptp(ptp, unix_ns), Some(unix_ns), "{unix_ns}");
        }
    }

    #[test]
    fn the_era_is_the_one_nearest_the_readers_clock() {
        // 2036-02-07 06:28:16 UTC: NTP seconds wrap to 0.
        let wrap = 2_085_978_496 * NANOS;
        let after = ntp_from_unix_ns(wrap + NANOS);
        assert_eq!(after >> 32, 1, "era 1 starts again at 0");
        // Read a second before the wrap, it is still a second after it.
        assert_eq!(unix_ns_from_ntp(after, wrap - NANOS), Some(wrap + NANOS));
        // And a stamp from just before the wrap, read just after it.
        let before = ntp_from_unix_ns(wrap - NANOS);
        assert_eq!(unix_ns_from_ntp(before, wrap + NANOS), Some(wrap - NANOS));
        // A stamp from 1969, read in 1970: no Unix time to give.
        assert_eq!(unix_ns_from_ntp((NTP_UNIX_OFFSET - 10) << 32, 0), None);
    }

    #[test]
    fn ptp_counts_tai_seconds_since_1970() {
        assert_eq!(ptp_from_unix_ns(0), 37 << 32);
        assert_eq!(ptp_from_unix_ns(1_500_000_000), (38 << 32) | 500_000_000);
        assert_eq!(unix_ns_from_ptp((38 << 32) | 1_000_000_000, 0), None);
    }

    #[test]
    fn the_error_estimate_packs_s_z_scale_and_multiplier() {
        let e = ErrorEstimate::from_bits(0xC000 | (5 << 8) | 7);
        assert!(e.synchronized && e.ptp);
        assert_eq!((e.scale, e.multiplier), (5, 7));
        assert_eq!(e.bits(), 0xC507);
        // The common "0.23 ns, not synchronised" of other senders.
        let common = ErrorEstimate::from_bits(0x0001);
        assert!(!common.synchronized && !common.ptp && common.is_valid());
        assert_eq!(common.seconds(), 2f64.powi(-32));
        // Every bit pattern decodes, and the 16 bits come back.
        for bits in [0u16, 0xFFFF, 0x3F00, 0x80FF] {
            assert_eq!(ErrorEstimate::from_bits(bits).bits(), bits);
        }
        assert!(!ErrorEstimate::from_bits(0x8000).is_valid(), "multiplier 0");
    }

    #[test]
    fn an_error_is_encoded_at_least_as_large_and_never_with_multiplier_0() {
        // 1 ms: 4 294 967.3 units = scale 15, multiplier 132 (131.07 up).
        let ms = ErrorEstimate::at_least(1_000_000, false);
        assert_eq!((ms.scale, ms.multiplier), (15, 132));
        assert_eq!(ms.bits(), 0x0F84);
        assert!(ms.seconds() >= 0.001 && ms.seconds() < 0.001 * 1.01);
        // 0 ns is still a valid field: the smallest error it holds.
        let zero = ErrorEstimate::at_least(0, true);
        assert_eq!(zero.bits(), 0x8001);
        // 1 ns: 4.29 units, up to 5.
        assert_eq!(ErrorEstimate::at_least(1, false).bits(), 0x0005);
        // 16 s (the kernel's bound for an unsynchronised clock).
        let unsync = ErrorEstimate::at_least(16 * NANOS, false);
        assert!(unsync.seconds() >= 16.0 && unsync.seconds() < 16.0 * 1.01);
        // The longest error a u64 of ns holds (584 years) still fits.
        let huge = ErrorEstimate::at_least(u64::MAX, false);
        assert_eq!((huge.scale, huge.multiplier), (59, 138));
        assert!(huge.seconds() >= u64::MAX as f64 / 1e9);
        for ns in (0..64).map(|shift| 1u64 << shift) {
            let e = ErrorEstimate::at_least(ns, false);
            assert!(e.is_valid(), "{ns}");
            assert!(e.seconds() * 1e9 >= ns as f64 * 0.999_999, "{ns}: {e:?}");
        }
    }
}
