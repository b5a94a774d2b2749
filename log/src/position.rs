//! [`LogPosition`]: where an event sits in the log, and [`PositionRange`]: where one append went.

use std::fmt;
use std::num::NonZeroU64;

use lanestream::Position;

/// The position of an event in the log: 1 for the first event ever appended, then dense (no gaps)
/// and strictly increasing, assigned by the log's single writer.
///
/// # Why not [`lanestream::Position`](lanestream::Position)
/// A stream [`Position`] is whatever a source assigns (a PostgreSQL LSN, say): 0 is a value, it
/// prints as `"X/Y"`, and `u64::MAX` is reserved. A log position is a counter that starts at 1, so
/// it is a `NonZeroU64`: "before the first event" is `None` rather than a sentinel (and
/// `Option<LogPosition>` is still 8 bytes), it prints in decimal, and the compiler keeps the two
/// units apart. Feeding a log into the lanes converts losslessly with `Position::from` (the log
/// never assigns `u64::MAX`, the reserved stream position: it would take 2^64 - 1 appended events).
///
/// ```
/// use lanestream_log::LogPosition;
/// let p = LogPosition::new(7).unwrap();
/// assert_eq!(p.get(), 7);
/// assert_eq!(p.to_string(), "7");
/// assert_eq!(LogPosition::new(0), None);
/// assert_eq!(lanestream::Position::from(p), lanestream::Position(7));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogPosition(NonZeroU64);

impl LogPosition {
    /// The position of the first event of every log.
    pub const FIRST: LogPosition = LogPosition(NonZeroU64::MIN);

    /// The position `n`, or `None` for 0 (no event sits at 0).
    pub const fn new(n: u64) -> Option<LogPosition> {
        match NonZeroU64::new(n) {
            Some(n) => Some(LogPosition(n)),
            None => None,
        }
    }

    /// The position as a number (at least 1).
    pub const fn get(self) -> u64 {
        self.0.get()
    }

    /// `Some(n)` as a position, `None` for 0: the form `after`/`head` values take internally.
    pub(crate) fn from_raw(n: u64) -> Option<LogPosition> {
        LogPosition::new(n)
    }
}

/// `None` (before the first event) as 0, else the position's number.
pub(crate) fn raw(p: Option<LogPosition>) -> u64 {
    p.map_or(0, LogPosition::get)
}

impl fmt::Display for LogPosition {
    /// The position in decimal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<LogPosition> for u64 {
    fn from(p: LogPosition) -> u64 {
        p.get()
    }
}

impl From<LogPosition> for Position {
    /// The same number as a stream position (for a log feeding the lanes).
    fn from(p: LogPosition) -> Position {
        Position(p.get())
    }
}

impl From<LogPosition> for NonZeroU64 {
    fn from(p: LogPosition) -> NonZeroU64 {
        p.0
    }
}

impl From<NonZeroU64> for LogPosition {
    fn from(n: NonZeroU64) -> LogPosition {
        LogPosition(n)
    }
}

/// The positions one successful append was given: `first..=last`, inclusive, dense, in the order
/// the events were passed (event `i` of the append sits at `first + i`). Never empty.
///
/// ```
/// use lanestream_log::{LogPosition, PositionRange};
/// let r = PositionRange::new(LogPosition::new(3).unwrap(), LogPosition::new(5).unwrap()).unwrap();
/// assert_eq!(r.len(), 3);
/// assert!(r.contains(LogPosition::new(4).unwrap()));
/// assert_eq!(r.iter().map(|p| p.get()).collect::<Vec<_>>(), [3, 4, 5]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PositionRange {
    /// The position of the append's first event.
    pub first: LogPosition,
    /// The position of the append's last event (equal to `first` for a single event).
    pub last: LogPosition,
}

impl PositionRange {
    /// `first..=last`, or `None` when `last < first`.
    pub fn new(first: LogPosition, last: LogPosition) -> Option<PositionRange> {
        (first <= last).then_some(PositionRange { first, last })
    }

    /// `first..=first + len - 1` for a non-empty append of `len` events starting at `first`
    /// (a raw position, at least 1).
    pub(crate) fn from_raw(first: u64, len: u64) -> PositionRange {
        let first_p = LogPosition::new(first).expect("positions start at 1");
        let last = LogPosition::new(first + len - 1).expect("non-empty");
        PositionRange { first: first_p, last }
    }

    /// How many events the range holds (at least 1).
    pub fn len(&self) -> u64 {
        self.last.get() - self.first.get() + 1
    }

    /// Always `false`: a range holds at least one position (here for clippy's `len` rule).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether `p` lies within `first..=last`.
    pub fn contains(&self, p: LogPosition) -> bool {
        self.first <= p && p <= self.last
    }

    /// The positions, ascending.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = LogPosition> + use<> {
        (self.first.get()..=self.last.get()).map(|n| LogPosition::new(n).expect("at least first"))
    }
}

impl fmt::Display for PositionRange {
    /// `first..=last` in decimal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..={}", self.first, self.last)
    }
}
