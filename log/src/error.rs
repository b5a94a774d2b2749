//! The log's errors: one enum per operation, one variant per cause, each saying what state it
//! leaves.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::position::LogPosition;

/// Why an [`Event`](super::Event) could not be built. Nothing is built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventError {
    /// The event type is the empty string.
    #[error("an event type must not be empty")]
    EmptyType,
    /// A tag is the empty string.
    #[error("a tag must not be empty")]
    EmptyTag,
    /// A type or tag is longer than [`MAX_NAME_LEN`](super::MAX_NAME_LEN) bytes.
    #[error("type or tag {name:?}... is {len} bytes long, above the limit of {max} bytes", max = super::names::MAX_NAME_LEN)]
    NameTooLong {
        /// The first 32 characters of the name.
        name: String,
        /// Its length, in bytes.
        len: usize,
    },
    /// More than [`MAX_TAGS`](super::MAX_TAGS) tags.
    #[error("an event carries at most {max} tags")]
    TooManyTags {
        /// The limit, in tags.
        max: usize,
    },
    /// The same tag was given twice; tags are a set, and a duplicate is refused rather than
    /// silently merged.
    #[error("tag {0:?} is given twice")]
    DuplicateTag(String),
}

/// Why a [`Query`](super::Query) could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// A query of no items: not allowed, so that "no items" never has to mean either "nothing"
    /// or "everything". Use [`Query::All`](super::Query::All) for every event.
    #[error("a query needs at least one item (use Query::All to select every event)")]
    NoItems,
}

/// Why an append did not happen (or, for [`Io`](AppendError::Io), may not have).
///
/// Every variant but `Io` means no event of the append was written and no position was used.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    /// The append held no events. Refused on the caller's thread; never queued.
    #[error("an append needs at least one event")]
    Empty,
    /// The condition failed: the event at `at` matches `fail_if_events_match` and lies after
    /// `after`. `at` is the lowest such position, including events accepted earlier in the same
    /// group commit (never a conservative guess).
    #[error("append condition failed: the event at position {at} matches")]
    Conflict {
        /// The lowest position after `after` whose event matches the condition's query.
        at: LogPosition,
    },
    /// The condition's `after` lies beyond the log's head: no client can have read up to it.
    #[error("append condition's after ({after}) is beyond the log's head ({})", head.map_or(0, LogPosition::get))]
    AfterBeyondHead {
        /// The condition's `after`.
        after: LogPosition,
        /// The head the writer saw (`None`: the log was empty).
        head: Option<LogPosition>,
    },
    /// The append's events take more than the log's
    /// [`max_append_bytes`](super::LogOptions::max_append_bytes) (by
    /// [`Event::encoded_len`](super::Event::encoded_len)). Refused on the caller's thread.
    #[error("append of {bytes} bytes is above the limit of {max} bytes")]
    TooLarge {
        /// The append's size, in bytes.
        bytes: usize,
        /// The limit, in bytes.
        max: usize,
    },
    /// Writing or syncing the group commit this append was in failed, or the commit panicked
    /// (a bug in the writer or its storage). The outcome is unknown: the events were not
    /// acknowledged, yet a later open may find them whole (never in part). The log has stopped
    /// accepting writes ([`Failed`](AppendError::Failed) from now on).
    #[error("writing the log failed; the append may or may not be durable: {0}")]
    Io(#[source] Arc<io::Error>),
    /// An earlier write or sync failed and the log refuses writes since (a failed fsync is
    /// never retried: the kernel may have dropped the pages it could not write). Nothing was
    /// written. Reopen the log to go on; recovery keeps every valid record.
    #[error("the log refuses writes since an earlier write failed: {0}")]
    Failed(#[source] Arc<io::Error>),
    /// The log was closed before this append was queued. Nothing was written.
    #[error("the log is closed")]
    Shutdown,
}

impl AppendError {
    /// Whether this is a [`Conflict`](AppendError::Conflict).
    pub fn is_conflict(&self) -> bool {
        matches!(self, AppendError::Conflict { .. })
    }

    /// The conflicting position, for a [`Conflict`](AppendError::Conflict).
    pub fn conflict_at(&self) -> Option<LogPosition> {
        match self {
            AppendError::Conflict { at } => Some(*at),
            _ => None,
        }
    }
}

/// Why a log could not be opened. Nothing is running and nothing stays claimed, and nothing in the
/// directory was changed: an open decides first and acts after — the repairs recovery finds
/// needed (a torn tail truncated away, index files a crash left half-written (`.idx.tmp`) or
/// stale removed, missing or untrusted ones rebuilt) are made only once nothing is left to
/// refuse, and a read-only follower writes nothing at all. Two exceptions: a writer's open
/// creates the directory and its `LOCK` file if they are missing (it takes the lock before
/// reading anything), and an [`Io`](OpenError::Io) error that comes while the repairs are being
/// made (or after them) leaves those made before it (each is one the next open makes too).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// An option is out of range; the message says which.
    #[error("invalid log option: {0}")]
    InvalidOption(&'static str),
    /// This process already has the log in `path` open (two writers would interleave records).
    /// Nothing was read or changed; close the other handle first.
    #[error("the log in {0} is already open in this process; close it before opening it again")]
    AlreadyOpen(PathBuf),
    /// Another process has the log in `dir` open: it holds the exclusive advisory lock on the
    /// directory's `LOCK` file (two writers would interleave records). Nothing was read or
    /// changed. Close the log in that process first; the lock goes with the process however it
    /// ends, killed included, so a stale lock is never left behind.
    #[error(
        "the log in {} is open in another process (it holds the lock on {}); close it there first",
        .dir.display(),
        .lock_file.display()
    )]
    Locked {
        /// The log directory (canonical).
        dir: PathBuf,
        /// The file whose lock the other process holds (`LOCK` in `dir`).
        lock_file: PathBuf,
    },
    /// A file or directory operation failed: `op` on `path`. If it failed while the open was
    /// making its repairs (see above), the repairs before it stay made; opening again makes
    /// the rest.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A file of the log was written by a version of its format this build does not read (a
    /// newer lanestream-log). Nothing was read or changed; open the log with that version.
    #[error("{file} is in log format version {found}; this build reads versions 1 to {supported}")]
    UnsupportedVersion {
        /// The segment or index file.
        file: PathBuf,
        /// The version the file says it is in.
        found: u8,
        /// The version this build writes, the newest it reads (it reads every one from 1).
        supported: u8,
    },
    /// The log directory holds a file that is not one of the log's (a segment
    /// `<20 digits>.seg`, its index `<20 digits>.idx`, `LOCK` or `COMMIT`): the directory may not be a
    /// log's, or something was put there or renamed. Nothing was read or changed; move the file
    /// out (or open the right directory).
    #[error(
        "{0} is not a file of a lanestream log (segments are <20 digits>.seg, their indexes <20 digits>.idx); move it out of the log directory"
    )]
    StrayFile(PathBuf),
    /// A segment holds bytes recovery will not drop: a damaged record that is not a torn tail
    /// (in a segment other than the last, or followed by a whole CRC-valid record, which a
    /// crash never leaves after a torn one), a foreign header, or records out of sequence.
    /// Nothing was truncated or otherwise changed: the acknowledged records after the damage
    /// are still on disk. Restore the segment from a backup or a replica; `offset` is where
    /// the damaged record starts.
    #[error("corrupt log segment {segment} at byte {offset}: {reason}")]
    Corrupt {
        /// The segment file.
        segment: PathBuf,
        /// Where in it, in bytes from its start.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
}

/// Why events could not be read back from a durable log's segment files. Nothing changed: the
/// read (or the subscription's cursor) is where it was, and the same read can be tried again.
///
/// The log checks every record it reads (its length, its CRC32C, the positions it holds), so
/// a damaged segment gives this error, never a wrong event.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// Reading the segment failed (the disk, or a file cut short since the log opened it).
    #[error("reading log segment {segment} at byte {offset}: {source}")]
    Io {
        /// The segment file.
        segment: PathBuf,
        /// Where the record read starts, in bytes from the segment's start.
        offset: u64,
        /// The cause.
        #[source]
        source: Arc<io::Error>,
    },
    /// The bytes read are not the record the log's index says is there: the segment was
    /// damaged or changed since the log was opened. Restore it from a backup or a replica.
    #[error("corrupt log segment {segment} at byte {offset}: {reason}")]
    Corrupt {
        /// The segment file.
        segment: PathBuf,
        /// Where the record read starts, in bytes from the segment's start.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
}

/// Why a subscription ended other than by the log closing, or could not deliver its next batch.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SubscriptionError {
    /// The log's writer failed (see [`AppendError::Failed`]); every event published before it
    /// failed was delivered, and no more will come.
    #[error("the log's writer failed: {0}")]
    Failed(#[source] Arc<io::Error>),
    /// The next batch's events could not be read back from the segments; the subscription did
    /// not move (calling again retries the same batch).
    #[error(transparent)]
    Read(#[from] ReadError),
}

/// Why [`Subscription::try_next_batch`](super::Subscription::try_next_batch) returned nothing.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TryNextError {
    /// No matching event right now; try again later.
    #[error("no matching event yet")]
    Empty,
    /// The log is closed and every matching event was delivered.
    #[error("the log is closed and the subscription is drained")]
    Closed,
    /// As [`SubscriptionError::Failed`].
    #[error("the log's writer failed: {0}")]
    Failed(#[source] Arc<io::Error>),
    /// As [`SubscriptionError::Read`].
    #[error(transparent)]
    Read(#[from] ReadError),
}

/// Why [`Subscription::next_batch_timeout`](super::Subscription::next_batch_timeout) returned no
/// batch.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NextTimeoutError {
    /// No matching event arrived in time.
    #[error("no matching event before the deadline")]
    Timeout,
    /// As [`SubscriptionError::Failed`].
    #[error("the log's writer failed: {0}")]
    Failed(#[source] Arc<io::Error>),
    /// As [`SubscriptionError::Read`].
    #[error(transparent)]
    Read(#[from] ReadError),
}

/// Wraps the error of the I/O operation `op` on `path` as [`OpenError::Io`] (for `map_err`).
pub(crate) fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> OpenError + 'a {
    move |source| OpenError::Io { op, path: path.to_path_buf(), source }
}
