//! Sizes and durations as operators write them ("512MiB", "30s").
//!
//! Every unit is 1024-based: "k", "M" and "G" mean KiB, MiB and GiB, because a
//! limit that is 2.4% smaller than the operator meant is a bug nobody notices.
//! Decimal units ("MB") are rejected rather than guessed.

use std::time::Duration;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// Why a size or a duration could not be read; each message is a complete
/// sentence that names the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("invalid size {0:?}: use a number of bytes or a number with a unit (KiB, MiB, GiB; k/M/G also mean 1024-based)")]
    Size(String),
    #[error("invalid size {0:?}: too large (at most {max} bytes)", max = u64::MAX)]
    SizeTooLarge(String),
    #[error("invalid duration {0:?}: use a number of seconds or a number with a unit (ms, s, m, h), e.g. \"500ms\", \"30s\", \"2m\"")]
    Duration(String),
    #[error("invalid duration {0:?}: too large")]
    DurationTooLarge(String),
    #[error("invalid size {0}: must not be negative")]
    NegativeSize(i64),
    #[error("invalid duration {0}: must not be negative")]
    NegativeDuration(i64),
}

/// Parses a size: an integer number of bytes, or an integer followed by a
/// unit among `k`, `K`, `KiB`, `M`, `MiB`, `G`, `GiB` (all 1024-based).
/// Spaces between number and unit are allowed.
///
/// The error is a complete sentence that names the input, e.g.
/// `invalid size "12XB": use a number of bytes or a number with a unit (KiB, MiB, GiB; k/M/G also mean 1024-based)`.
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let invalid = || UnitError::Size(s.to_string());
    let trimmed = s.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits_end);
    if number.is_empty() {
        return Err(invalid());
    }
    let multiplier = match unit.trim_start() {
        "" => 1,
        "k" | "K" | "KiB" => KIB,
        "M" | "MiB" => MIB,
        "G" | "GiB" => GIB,
        _ => return Err(invalid()),
    };
    let too_large = || UnitError::SizeTooLarge(s.to_string());
    let number: u64 = number.parse().map_err(|_| too_large())?;
    number.checked_mul(multiplier).ok_or_else(too_large)
}

/// Parses a duration: a number of seconds, or a number followed by one of the
/// units `ms`, `s`, `m` (minutes), `h`. The number may have a fractional part
/// ("2.5", "1.5h"); a bare number means seconds (so `--timeout 2.5` works).
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let invalid = || UnitError::Duration(s.to_string());
    let trimmed = s.trim();
    let number_end = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(number_end);
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (number, None),
    };
    let all_digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(whole) || fraction.is_some_and(|f| !all_digits(f)) {
        return Err(invalid());
    }
    let millis_per_unit: u64 = match unit.trim_start() {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60 * 1000,
        "h" => 60 * 60 * 1000,
        _ => return Err(invalid()),
    };
    let too_large = || UnitError::DurationTooLarge(s.to_string());
    match fraction {
        None => {
            let n: u64 = whole.parse().map_err(|_| too_large())?;
            let millis = n.checked_mul(millis_per_unit).ok_or_else(too_large)?;
            Ok(Duration::from_millis(millis))
        }
        Some(_) => {
            let n: f64 = number.parse().map_err(|_| invalid())?;
            Duration::try_from_secs_f64(n * millis_per_unit as f64 / 1000.0)
                .map_err(|_| too_large())
        }
    }
}

/// Formats a byte count the way an operator would write it: with the largest
/// unit that divides it exactly ("16MiB"), else in bytes ("1000 bytes").
pub fn format_size(bytes: u64) -> String {
    for (unit, name) in [(GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{name}", bytes / unit);
        }
    }
    if bytes == 1 {
        "1 byte".to_owned()
    } else {
        format!("{bytes} bytes")
    }
}

/// Formats a duration the way an operator would write it ("30s", "2m", "1.5s").
pub fn format_duration(d: Duration) -> String {
    let millis = d.as_millis();
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return format!("{}s", d.as_secs_f64());
    }
    if millis == 0 {
        "0s".to_owned()
    } else if millis.is_multiple_of(3_600_000) {
        format!("{}h", millis / 3_600_000)
    } else if millis.is_multiple_of(60_000) {
        format!("{}m", millis / 60_000)
    } else if millis.is_multiple_of(1000) {
        format!("{}s", millis / 1000)
    } else {
        format!("{millis}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(64 * 1024));
        assert_eq!(parse_size("64K"), Ok(64 * 1024));
        assert_eq!(parse_size("64KiB"), Ok(64 * 1024));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size(" 2GiB "), Ok(2 << 30));
    }

    #[test]
    fn bad_sizes() {
        assert_eq!(
            parse_size("12XB").unwrap_err().to_string(),
            "invalid size \"12XB\": use a number of bytes or a number with a unit \
             (KiB, MiB, GiB; k/M/G also mean 1024-based)"
        );
        for bad in [
            "", "MiB", "12MB", "12 mb", "1.5GiB", "-1", "+5", "5 M i B", "0x10", "12m",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be rejected");
        }
        assert_eq!(
            parse_size("99999999999999999999").unwrap_err().to_string(),
            "invalid size \"99999999999999999999\": too large (at most 18446744073709551615 bytes)"
        );
        assert!(parse_size("17179869184GiB").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration(" 10 s "), Ok(Duration::from_secs(10)));
    }

    #[test]
    fn bad_durations() {
        assert_eq!(
            parse_duration("5 days").unwrap_err().to_string(),
            "invalid duration \"5 days\": use a number of seconds or a number with a unit \
             (ms, s, m, h), e.g. \"500ms\", \"30s\", \"2m\""
        );
        for bad in [
            "", "s", "-1", "1.", ".5", "1..2", "1e3", "inf", "NaN", "10sec", "1d", "1h30m",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(parse_duration("99999999999999999999h").is_err());
        assert!(parse_duration("18446744073709551615h").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(format_size(16 << 20), "16MiB");
        assert_eq!(format_size(1024), "1KiB");
        assert_eq!(format_size(1000), "1000 bytes");
        assert_eq!(format_size(1), "1 byte");
        assert_eq!(format_size(0), "0 bytes");
        assert_eq!(format_duration(Duration::from_secs(90000)), "25h");
        assert_eq!(format_duration(Duration::from_secs(120)), "2m");
        assert_eq!(format_duration(Duration::from_millis(2500)), "2500ms");
        assert_eq!(format_duration(Duration::ZERO), "0s");
        assert_eq!(format_duration(Duration::from_micros(1500)), "0.0015s");
    }
}
