//! Errors: one enum per operation, one variant per cause. Each variant says what state it leaves,
//! and every error of a publish hands the item back.

use std::fmt;

use crate::{NameError, Position, SinkName};

/// Why a stream could not be built ([`StreamBuilder::build`](crate::StreamBuilder::build)).
/// Nothing is built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// A capacity (lane or request lane) of 0 was asked for; every lane needs at least one slot.
    #[error("capacity must be at least 1 (got 0 for {0})")]
    ZeroCapacity(&'static str),
    /// A sink name was given twice.
    #[error("sink {0} is named twice")]
    DuplicateSink(SinkName),
    /// A sink name is not valid (`^[a-z_][a-z0-9_]*$`, at most 63 bytes).
    #[error("invalid sink name: {0}")]
    InvalidSink(#[from] NameError),
}

/// Why a lane end could not be had from a stream. The stream is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// No lane for this sink: the set of sinks is fixed when the stream is built (L1).
    #[error("unknown lane {0:?}")]
    UnknownLane(String),
    /// Another producer of this lane is alive; at most one publishes at a time (L9). Drop it first.
    #[error("lane {0} already has a live producer")]
    ProducerBusy(SinkName),
}

/// Why an item was not published. Every variant holds the item, untouched; nothing was enqueued.
/// [`into_inner`](PublishError::into_inner) takes it back.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError<T> {
    /// The lane is full (only from `try_publish`; the waiting forms wait instead).
    #[error("lane is full")]
    Full(T),
    /// The lane was closed; it accepts nothing more.
    #[error("lane is closed")]
    Closed(T),
    /// The item's position is not greater than the last positioned item on this lane (L4).
    #[error("position {position} is not greater than the lane's last position {last}")]
    PositionRegressed {
        /// The refused item.
        item: T,
        /// Its position.
        position: Position,
        /// The last positioned item's position on the lane.
        last: Position,
    },
    /// The item carries the reserved position [`Position::RESERVED`] (`u64::MAX`).
    #[error("position u64::MAX is reserved")]
    InvalidPosition(T),
    /// The deadline passed while the lane stayed full (only from `publish_timeout`).
    #[error("timed out waiting for room in the lane")]
    Timeout(T),
}

impl<T> PublishError<T> {
    /// The item that was not published.
    pub fn into_inner(self) -> T {
        match self {
            PublishError::Full(t)
            | PublishError::Closed(t)
            | PublishError::InvalidPosition(t)
            | PublishError::Timeout(t) => t,
            PublishError::PositionRegressed { item, .. } => item,
        }
    }
}

impl<T> fmt::Debug for PublishError<T> {
    /// Does not require `T: Debug`; shows the cause only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PublishError::Full(_) => f.write_str("Full(..)"),
            PublishError::Closed(_) => f.write_str("Closed(..)"),
            PublishError::InvalidPosition(_) => f.write_str("InvalidPosition(..)"),
            PublishError::Timeout(_) => f.write_str("Timeout(..)"),
            PublishError::PositionRegressed { position, last, .. } => f
                .debug_struct("PositionRegressed")
                .field("position", position)
                .field("last", last)
                .finish_non_exhaustive(),
        }
    }
}

/// Why a blocking or async receive returned no delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// A newer consumer was attached to this lane (L8); this one will never receive again. Its
    /// outstanding deliveries were released to the new consumer (acks that race it may still land).
    #[error("consumer was detached by a newer consumer of the same lane")]
    Detached,
    /// The deadline passed with nothing to receive (only from `recv_timeout`). Nothing changed.
    #[error("timed out waiting for an item")]
    Timeout,
}

/// Why [`Consumer::try_recv`](crate::Consumer::try_recv) returned no delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TryRecvError {
    /// Nothing queued or released right now; the lane is open.
    #[error("lane is empty")]
    Empty,
    /// The lane is closed and nothing queued or released is left.
    #[error("lane is closed and drained")]
    Closed,
    /// A newer consumer was attached to this lane (L8).
    #[error("consumer was detached by a newer consumer of the same lane")]
    Detached,
}

/// Why an ack was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    /// A re-attach took the item back before this ack landed (L8): it was released and will be
    /// (or was) redelivered to the new consumer. The lane's acked position did not move.
    #[error("delivery was taken back by a consumer re-attach; the item is redelivered")]
    Detached,
}
