//! Sizes as people write them on a command line (`4096`, `64K`, `4M`, `1GiB`): the one
//! parser of the agent's options and the test and bench tools.

use core::fmt;

/// Why a size did not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeError {
    /// No digits before the unit (or none at all).
    NotANumber,
    /// A unit other than B, K, KB, KiB, M, MB, MiB, G, GB or GiB.
    UnknownUnit,
    /// The size does not fit in 64 bits.
    TooLarge,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NotANumber => "is not a size: write e.g. 4096, 64K, 4M or 1G",
            Self::UnknownUnit => "has an unknown unit: use K, M or G",
            Self::TooLarge => "is too large",
        })
    }
}

/// Parses a byte count: decimal digits, then an optional unit, case-insensitive and
/// optionally after spaces: none or `B` (bytes), `K`/`KB`/`KiB`, `M`/`MB`/`MiB`,
/// `G`/`GB`/`GiB`, all powers of 1024. Spaces around the whole are ignored.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(end);
    let n: u64 = match digits.parse() {
        Ok(n) => n,
        Err(e) if *e.kind() == core::num::IntErrorKind::PosOverflow => {
            return Err(SizeError::TooLarge);
        }
        Err(_) => return Err(SizeError::NotANumber),
    };
    let unit = unit.trim_start();
    let shift = if unit.is_empty() || unit.eq_ignore_ascii_case("B") {
        0
    } else if ["K", "KB", "KiB"]
        .iter()
        .any(|u| unit.eq_ignore_ascii_case(u))
    {
        10
    } else if ["M", "MB", "MiB"]
        .iter()
        .any(|u| unit.eq_ignore_ascii_case(u))
    {
        20
    } else if ["G", "GB", "GiB"]
        .iter()
        .any(|u| unit.eq_ignore_ascii_case(u))
    {
        30
    } else {
        return Err(SizeError::UnknownUnit);
    };
    n.checked_mul(1 << shift).ok_or(SizeError::TooLarge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_counts_and_every_unit() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4194304"), Ok(4 << 20));
        assert_eq!(parse_size("12B"), Ok(12));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("64KB"), Ok(64 << 10));
        assert_eq!(parse_size("64kib"), Ok(64 << 10));
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("2mb"), Ok(2 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("3GiB"), Ok(3 << 30));
        assert_eq!(parse_size("5GB"), Ok(5 << 30));
    }

    #[test]
    fn spaces_around_and_before_the_unit() {
        assert_eq!(parse_size(" 16K "), Ok(16 << 10));
        assert_eq!(parse_size("16 K"), Ok(16 << 10));
    }

    #[test]
    fn refusals() {
        assert_eq!(parse_size(""), Err(SizeError::NotANumber));
        assert_eq!(parse_size("x"), Err(SizeError::NotANumber));
        assert_eq!(parse_size("K"), Err(SizeError::NotANumber));
        assert_eq!(parse_size("-1"), Err(SizeError::NotANumber));
        assert_eq!(parse_size("1.5M"), Err(SizeError::UnknownUnit));
        assert_eq!(parse_size("1T"), Err(SizeError::UnknownUnit));
        assert_eq!(parse_size("4M4"), Err(SizeError::UnknownUnit));
        assert_eq!(parse_size("99999999999999999999"), Err(SizeError::TooLarge));
        assert_eq!(parse_size("17179869184G"), Err(SizeError::TooLarge));
        assert_eq!(parse_size("17179869183G"), Ok(17_179_869_183 << 30));
    }
}
