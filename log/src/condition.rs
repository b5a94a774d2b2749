//! [`AppendCondition`]: the DCB guard an append may carry.

use super::position::LogPosition;
use super::query::Query;

/// The consistency guard of one append: the append fails if any event at a position greater
/// than `after` (anywhere in the log when `after` is `None`) matches `fail_if_events_match`.
///
/// A client reads the events its decision depends on with a query, remembers the head it read up
/// to ([`Reads::head`](super::Reads::head)), and appends with that query and that head as
/// `after`: the append succeeds only if nothing relevant was appended since. Events accepted
/// earlier in the same group commit count exactly like older ones, so a refused append's
/// [`Conflict { at }`](super::AppendError::Conflict) always names the real, lowest matching
/// position after `after`. An `after` beyond the log's head is refused with
/// [`AfterBeyondHead`](super::AppendError::AfterBeyondHead): no client can have read up to it.
///
/// ```
/// use lanestream_log::{AppendCondition, Query};
/// // "fail if any event tagged course:3 exists at all"
/// let guard = AppendCondition::new(Query::tags(["course:3"]), None);
/// assert_eq!(guard.after, None);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AppendCondition {
    /// The events that must not exist after `after` for the append to succeed.
    pub fail_if_events_match: Query,
    /// The position the decision was made at: matches at or before it are allowed; `None`
    /// checks the whole log.
    pub after: Option<LogPosition>,
}

impl AppendCondition {
    /// Fail if any event after `after` (the whole log when `None`) matches `query`.
    pub fn new(query: Query, after: Option<LogPosition>) -> AppendCondition {
        AppendCondition { fail_if_events_match: query, after }
    }
}
