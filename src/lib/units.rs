//! Sizes, rates and durations as people write them: `64K`, `1GiB`,
//! `500Mbit`, `250ms`.
//!
//! Decimal suffixes (`K`, `M`, `G`, `T`) are powers of 1000 and binary ones
//! (`Ki`, `Mi`, `Gi`, `Ti`, optionally followed by `B`) are powers of 1024,
//! as in iperf3's documentation and the SI. Parsing is pure and total: any
//! input gives a value or a [`UnitError`] naming what was wrong.

use std::fmt;
use std::time::Duration;

/// Why a size, rate or duration could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} '{input}': {why}")]
pub struct UnitError {
    what: &'static str,
    input: String,
    why: &'static str,
}

impl UnitError {
    fn new(what: &'static str, input: &str, why: &'static str) -> Self {
        UnitError {
            what,
            input: input.to_string(),
            why,
        }
    }
}

/// `-1`, `-5M`: a number below zero, which no size, rate, duration or
/// percentage is. Said so, rather than "expected a number".
fn negative(input: &str) -> bool {
    input
        .trim()
        .strip_prefix('-')
        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit() || c == '.'))
}

/// Splits `"1.5GiB"` into `(1.5, "GiB")`.
fn split_number(s: &str) -> Option<(f64, &str)> {
    let s = s.trim();
    let end = s
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.'))
        .map(|(i, _)| i)
        .unwrap_or(s.len());
    if end == 0 {
        return None;
    }
    let number: f64 = s[..end].parse().ok()?;
    if !number.is_finite() {
        return None;
    }
    Some((number, s[end..].trim()))
}

/// The multiplier of a size prefix: `""`, `k`, `Mi`, ...
fn prefix_multiplier(prefix: &str) -> Option<f64> {
    let lower = prefix.to_ascii_lowercase();
    Some(match lower.as_str() {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        "t" => 1e12,
        "ki" => 1024.0,
        "mi" => 1024.0 * 1024.0,
        "gi" => 1024.0 * 1024.0 * 1024.0,
        "ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    })
}

fn to_u64(value: f64, what: &'static str, input: &str) -> Result<u64, UnitError> {
    if value > u64::MAX as f64 {
        return Err(UnitError::new(what, input, "too large"));
    }
    let rounded = value.round();
    if (rounded - value).abs() > 1e-6 * value.max(1.0) {
        return Err(UnitError::new(what, input, "not a whole number of bytes"));
    }
    Ok(rounded as u64)
}

/// Parses a byte count: `1000000`, `64K`, `1G`, `1GiB`, `1.5MB`.
pub fn parse_size(input: &str) -> Result<u64, UnitError> {
    const WHAT: &str = "size";
    if negative(input) {
        return Err(UnitError::new(WHAT, input, "cannot be negative"));
    }
    let (number, unit) = split_number(input)
        .ok_or_else(|| UnitError::new(WHAT, input, "expected a number such as 64K or 1GiB"))?;
    let prefix = unit
        .strip_suffix('B')
        .or_else(|| unit.strip_suffix('b').filter(|p| p.is_empty()))
        .unwrap_or(unit);
    let multiplier = prefix_multiplier(prefix).ok_or_else(|| {
        UnitError::new(
            WHAT,
            input,
            "unknown unit (use K, M, G, T for powers of 1000 or KiB, MiB, GiB, TiB)",
        )
    })?;
    to_u64(number * multiplier, WHAT, input)
}

/// A byte count the way [`parse_size`] reads it back, in the shortest
/// exact form: `64K` is 64000, `8M` is 8000000, `8KiB` is 8192, `1MiB` is
/// 1048576, and anything else is a bare number of bytes. Tables and
/// progress bars label sizes with this, so a label can be pasted back into
/// a flag.
pub fn size_label(bytes: u64) -> String {
    const DECIMAL: [(u64, &str); 4] = [
        (1_000_000_000_000, "T"),
        (1_000_000_000, "G"),
        (1_000_000, "M"),
        (1_000, "K"),
    ];
    const BINARY: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    if bytes == 0 {
        return "0".into();
    }
    for (unit, suffix) in DECIMAL {
        if bytes % unit == 0 {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    for (unit, suffix) in BINARY {
        if bytes % unit == 0 {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// Parses a rate in bits per second: `500Mbit`, `1G`, `10Gbps`,
/// `2.5Gbit/s`, or bytes per second with a capital `B`: `100MB/s`.
pub fn parse_rate(input: &str) -> Result<u64, UnitError> {
    const WHAT: &str = "rate";
    if negative(input) {
        return Err(UnitError::new(WHAT, input, "a rate cannot be negative"));
    }
    let (number, unit) = split_number(input)
        .ok_or_else(|| UnitError::new(WHAT, input, "expected a number such as 500Mbit"))?;
    let unit = unit.strip_suffix("/s").unwrap_or(unit);
    let (prefix, bits_per_unit) = if let Some(p) = unit.strip_suffix("bit") {
        (p, 1.0)
    } else if let Some(p) = unit.strip_suffix("bps") {
        (p, 1.0)
    } else if let Some(p) = unit.strip_suffix('B') {
        (p, 8.0)
    } else {
        (unit, 1.0)
    };
    let multiplier = prefix_multiplier(prefix).ok_or_else(|| {
        UnitError::new(
            WHAT,
            input,
            "unknown unit (examples: 500Mbit, 1Gbit/s, 100MB/s)",
        )
    })?;
    let bits = to_u64((number * multiplier * bits_per_unit).round(), WHAT, input)?;
    if bits == 0 {
        return Err(UnitError::new(WHAT, input, "must be greater than zero"));
    }
    Ok(bits)
}

/// Parses a duration: `2s`, `250ms`, `1.5m`, `100us`; a bare number is seconds.
pub fn parse_duration(input: &str) -> Result<Duration, UnitError> {
    let fail = |why| UnitError::new("duration", input, why);
    if negative(input) {
        return Err(fail("cannot be negative"));
    }
    let (number, unit) =
        split_number(input).ok_or_else(|| fail("expected a number such as 2s or 250ms"))?;
    let seconds = match unit {
        "" | "s" | "sec" => number,
        "ms" => number / 1e3,
        "us" | "µs" => number / 1e6,
        "ns" => number / 1e9,
        "m" | "min" => number * 60.0,
        "h" => number * 3600.0,
        _ => return Err(fail("unknown unit (use s, ms, us, m, h)")),
    };
    if seconds > 1e9 {
        return Err(fail("too long"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Parses a percentage from 0 to 100: `2`, `0.5%`, `2 %`.
pub fn parse_percent(input: &str) -> Result<f64, UnitError> {
    let fail = |why| UnitError::new("percentage", input, why);
    let not_a_percentage = || fail("expected a number such as 2 or 0.5%");
    if negative(input) {
        return Err(fail("cannot be negative"));
    }
    let (number, unit) = split_number(input).ok_or_else(not_a_percentage)?;
    if !(unit.is_empty() || unit == "%") {
        return Err(not_a_percentage());
    }
    if number > 100.0 {
        return Err(fail("more than 100%"));
    }
    Ok(number)
}

/// Gigabits per second for `bytes` moved in `seconds`; 0 when no time passed,
/// so that reports never contain NaN or infinity.
pub fn gbps(bytes: u64, seconds: f64) -> f64 {
    per_second(bytes as f64 * 8.0, seconds) / 1e9
}

/// `count / seconds`, or 0 when no time passed.
pub fn per_second(count: f64, seconds: f64) -> f64 {
    if seconds > 0.0 && seconds.is_finite() {
        count / seconds
    } else {
        0.0
    }
}

/// A byte count for people: `1.00 GB`, `64.0 KiB` is not used; decimal only.
pub struct HumanBytes(pub u64);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0 as f64;
        if b >= 1e12 {
            write!(f, "{:.2} TB", b / 1e12)
        } else if b >= 1e9 {
            write!(f, "{:.2} GB", b / 1e9)
        } else if b >= 1e6 {
            write!(f, "{:.2} MB", b / 1e6)
        } else if b >= 1e3 {
            write!(f, "{:.2} kB", b / 1e3)
        } else {
            write!(f, "{} B", self.0)
        }
    }
}

/// [`HumanRate`] of a rate in bit/s kept as a float.
pub fn bps_text(bps: f64) -> String {
    HumanRate(bps.round().max(0.0) as u64).to_string()
}

/// [`HumanRate`] of a rate in Gbit/s, the unit the figures are kept in.
pub fn gbps_text(gbps: f64) -> String {
    bps_text(gbps * 1e9)
}

/// A rate in bits per second as a person reads it, scaled: `97.3 Mbit/s`,
/// `1.234 Gbit/s`, `512 kbit/s`, `800 bit/s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanRate(pub u64);

impl fmt::Display for HumanRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.0 as f64;
        if r >= 1e9 {
            write!(f, "{:.3} Gbit/s", r / 1e9)
        } else if r >= 1e6 {
            write!(f, "{:.1} Mbit/s", r / 1e6)
        } else if r >= 1e3 {
            write!(f, "{:.1} kbit/s", r / 1e3)
        } else {
            write!(f, "{} bit/s", self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rates_read_as_people_write_them() {
        use super::HumanRate;
        assert_eq!(HumanRate(1_234_000_000).to_string(), "1.234 Gbit/s");
        assert_eq!(HumanRate(97_300_000).to_string(), "97.3 Mbit/s");
        assert_eq!(HumanRate(512_000).to_string(), "512.0 kbit/s");
        assert_eq!(HumanRate(800).to_string(), "800 bit/s");
    }

    #[test]
    fn percentages() {
        assert_eq!(parse_percent("2"), Ok(2.0));
        assert_eq!(parse_percent("0.5%"), Ok(0.5));
        assert_eq!(parse_percent(" 2 % "), Ok(2.0));
        assert_eq!(parse_percent("0"), Ok(0.0));
        assert!(parse_percent("101").is_err());
        assert!(parse_percent("-1").is_err());
        assert!(parse_percent("-1")
            .unwrap_err()
            .to_string()
            .contains("negative"));
        assert!(parse_percent("2x").is_err());
        assert!(parse_percent("").is_err());
    }

    use super::*;

    /// A number below zero is named as one, not as "expected a number".
    #[test]
    fn negative_numbers_are_said_to_be_negative() {
        let says = |e: UnitError| e.to_string();
        assert_eq!(
            says(parse_rate("-1").unwrap_err()),
            "invalid rate '-1': a rate cannot be negative"
        );
        assert!(says(parse_rate("-5M").unwrap_err()).contains("cannot be negative"));
        assert!(says(parse_size("-1").unwrap_err()).contains("cannot be negative"));
        assert!(says(parse_duration("-.5s").unwrap_err()).contains("cannot be negative"));
        // Not a number at all is still said so.
        assert!(says(parse_rate("-x").unwrap_err()).contains("expected a number"));
    }

    #[test]
    fn size_labels_read_back_as_the_same_value() {
        for (bytes, label) in [
            (0, "0"),
            (1234, "1234"),
            (64_000, "64K"),
            (8_000_000, "8M"),
            (2_000_000_000, "2G"),
            (8192, "8KiB"),
            (65_536, "64KiB"),
            (1 << 20, "1MiB"),
            (1_024_000, "1024K"),
            (65_500, "65500"),
        ] {
            assert_eq!(size_label(bytes), label);
            assert_eq!(parse_size(label).unwrap(), bytes);
        }
    }

    #[test]
    fn sizes() {
        for (text, bytes) in [
            ("1000000", 1_000_000),
            ("64K", 64_000),
            ("64k", 64_000),
            ("64KB", 64_000),
            ("64KiB", 65_536),
            ("1G", 1_000_000_000),
            ("1GiB", 1 << 30),
            ("1Gi", 1 << 30),
            ("1.5M", 1_500_000),
            (" 7 ", 7),
            ("0", 0),
            ("12b", 12),
        ] {
            assert_eq!(parse_size(text).unwrap(), bytes, "{text}");
        }
    }

    #[test]
    fn bad_sizes() {
        for bad in [
            "",
            "K",
            "-1",
            "1X",
            "1.2.3",
            "1e3",
            "0.5",
            "99999999999T",
            "NaN",
            "inf",
        ] {
            assert!(parse_size(bad).is_err(), "{bad} should fail");
        }
        let err = parse_size("12Q").unwrap_err().to_string();
        assert!(err.contains("'12Q'"), "{err}");
    }

    #[test]
    fn rates() {
        for (text, bits_per_s) in [
            ("500Mbit", 500_000_000),
            ("1G", 1_000_000_000),
            ("1Gbit/s", 1_000_000_000),
            ("10Gbps", 10_000_000_000),
            ("100MB/s", 800_000_000),
            ("2.5Gbit", 2_500_000_000),
            ("1000", 1000),
        ] {
            assert_eq!(parse_rate(text).unwrap(), bits_per_s, "{text}");
        }
        for bad in ["", "0", "0Mbit", "fast", "1Xbit", "-5M"] {
            assert!(parse_rate(bad).is_err(), "{bad} should fail");
        }
    }

    #[test]
    fn durations() {
        for (text, duration) in [
            ("2", Duration::from_secs(2)),
            ("2s", Duration::from_secs(2)),
            ("250ms", Duration::from_millis(250)),
            ("1.5m", Duration::from_secs(90)),
            ("100us", Duration::from_micros(100)),
        ] {
            assert_eq!(parse_duration(text).unwrap(), duration, "{text}");
        }
        for bad in ["", "s", "3 days", "-1s", "1e99"] {
            assert!(parse_duration(bad).is_err(), "{bad} should fail");
        }
    }

    #[test]
    fn rates_never_nan() {
        assert_eq!(gbps(1000, 0.0), 0.0);
        assert_eq!(gbps(1000, f64::NAN), 0.0);
        assert_eq!(gbps(125_000_000, 1.0), 1.0);
        assert_eq!(per_second(10.0, 2.0), 5.0);
    }

    #[test]
    fn human_bytes() {
        assert_eq!(HumanBytes(999).to_string(), "999 B");
        assert_eq!(HumanBytes(1_500_000).to_string(), "1.50 MB");
        assert_eq!(HumanBytes(2_000_000_000).to_string(), "2.00 GB");
    }
}
