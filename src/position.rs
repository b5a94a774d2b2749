//! [`Position`]: the source-assigned order of changes.

use std::fmt;
use std::str::FromStr;

/// A source-assigned position (unsigned 64-bit), strictly increasing per lane for positioned batches.
///
/// For PostgreSQL it is the commit LSN: the textual `"X/Y"` form (two hexadecimal halves) maps to
/// `X << 32 | Y`, see [`Position::from_lsn`]. `Position(u64::MAX)` is reserved (the lanes use it as
/// their "nothing acked yet" mark) and is refused at publish time with
/// [`PublishError::InvalidPosition`](crate::PublishError::InvalidPosition).
///
/// ```
/// use lanestream::Position;
/// let p = Position::from_lsn("16/B374D848").unwrap();
/// assert_eq!(p, Position(0x16 << 32 | 0xB374_D848));
/// assert_eq!(p.to_string(), "16/B374D848");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(transparent))]
pub struct Position(pub u64);

impl Position {
    /// The reserved value; never a valid batch position.
    pub const RESERVED: Position = Position(u64::MAX);

    /// Parses a PostgreSQL LSN in its textual form `"X/Y"` (X and Y hexadecimal, each at most 8
    /// digits) into `X << 32 | Y`.
    ///
    /// # Errors
    /// [`ParseLsnError`] when the text has no `/`, a half is empty, longer than 8 digits, or not
    /// hexadecimal.
    pub fn from_lsn(text: &str) -> Result<Position, ParseLsnError> {
        let err = || ParseLsnError(text.to_owned());
        let (hi, lo) = text.split_once('/').ok_or_else(err)?;
        let half = |s: &str| {
            if s.is_empty() || s.len() > 8 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
                None
            } else {
                u32::from_str_radix(s, 16).ok()
            }
        };
        let (hi, lo) = (half(hi).ok_or_else(err)?, half(lo).ok_or_else(err)?);
        Ok(Position(u64::from(hi) << 32 | u64::from(lo)))
    }
}

impl fmt::Display for Position {
    /// Formats as a PostgreSQL LSN, `"X/Y"` in upper-case hexadecimal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl FromStr for Position {
    type Err = ParseLsnError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Position::from_lsn(s)
    }
}

/// The text was not a PostgreSQL LSN of the form `"X/Y"` (hexadecimal halves of at most 8 digits).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid LSN {0:?}: expected \"X/Y\" with X and Y hexadecimal, at most 8 digits each")]
pub struct ParseLsnError(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsn_round_trips_and_rejects_garbage() {
        assert_eq!(Position::from_lsn("0/0"), Ok(Position(0)));
        assert_eq!(Position::from_lsn("1/2"), Ok(Position((1 << 32) | 2)));
        assert_eq!(Position::from_lsn("FFFFFFFF/FFFFFFFE").unwrap().to_string(), "FFFFFFFF/FFFFFFFE");
        for bad in ["", "/", "1/", "/1", "12", "G/1", "123456789/1", "1/2/3", "+1/2"] {
            assert!(Position::from_lsn(bad).is_err(), "{bad:?} accepted");
        }
    }
}
