//! Errors: one enum per operation, one variant per cause, only the causes that operation can
//! meet; the publish forms share one, [`PublishError`], whose docs list the variants each form
//! returns. Each variant says what state it leaves, and every error of a publish hands the item
//! back untouched ([`into_inner`](PublishError::into_inner)).

use std::fmt;

use crate::name::{NameError, SinkName};
use crate::position::Position;

/// Why a backend outside this process (the Redis backend, feature `redis`) could not carry out
/// an operation. The in-memory backend never returns it. `Copy`, so that the receive and ack
/// errors stay `Copy`; the backend's own message is kept by the backend (the Redis backend's
/// `RedisStream::last_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The connection to the backend was lost or could not be made, and retrying (with backoff)
    /// within the backend's retry budget did not bring it back. The next call reconnects. For an
    /// ack, the outcome is unknown: it may have landed.
    #[error("lost the connection to the backend (the next call reconnects)")]
    Connection,
    /// The backend refused the command, for the server's reason given ([`ServerReason`]; the
    /// server's whole message is the Redis backend's `RedisStream::last_error`). The command
    /// did not run. A transient refusal (the server still loading its data after a restart,
    /// busy with a script, refusing writes at its `maxmemory`) is retried within the backend's
    /// retry budget first.
    #[error("the backend refused the command: {0}")]
    Server(ServerReason),
    /// A newer end of the lane, from another process, took it over while this one's claim
    /// looked dead (its connection had dropped): this end is fenced off and must be dropped.
    #[error("a newer end in another process took the lane over; this end is fenced off")]
    Fenced,
    /// The stream's state in the backend is gone: its keys were deleted, or the server
    /// restarted without persistence (or a new stream of that name was built since). Nothing
    /// took the lane over; what this end held (deliveries, acks, publish counts) is lost with
    /// it. Drop every end and the stream, rebuild it, and publish again from the source's
    /// confirmed position (for the Redis backend: configure the server with `appendonly yes`
    /// so that a restart keeps the stream).
    #[error(
        "the stream's state in the backend is gone (its keys were deleted or the server restarted without persistence): rebuild the stream and publish again from the source's confirmed position"
    )]
    StateLost,
    /// The backend holds an entry that does not decode (validated decode failed); it was
    /// released again, untouched.
    #[error("the backend holds an entry that does not decode")]
    Corrupt,
}

/// Why the backend's server refused a command ([`BackendError::Server`]): the server's error
/// code, sorted into the causes a caller can act on. `Copy`, as [`BackendError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerReason {
    /// `OOM`: the server reached its `maxmemory` (with a policy that refuses writes), and the
    /// refusal outlasted the retry budget (it is retried within it, as a lost connection is).
    /// Free memory (let the sinks ack, so the log is trimmed) or raise `maxmemory`, then retry.
    OutOfMemory,
    /// `LOADING`: the server was still loading its data after a restart when the retry budget
    /// ran out (or the call never waits). Retry later.
    Loading,
    /// `BUSY`, `TRYAGAIN`, `MASTERDOWN`, `CLUSTERDOWN`: a transient server state (a script
    /// running too long, a failover) that outlasted the retry budget. Retry later.
    Busy,
    /// `READONLY`: the server is a read-only replica. Point the stream at the primary.
    ReadOnly,
    /// `NOPERM`, `NOAUTH`, `WRONGPASS`: the connection's user may not run the command. Grant
    /// the user the stream's keys and the scripting and stream commands, or fix the URL's
    /// credentials.
    NoPermission,
    /// `WRONGTYPE`: a key of the stream holds a value of another type (something else writes
    /// under the stream's `{name}:` prefix). Use another stream name or remove those keys.
    WrongType,
    /// The server answered something this version does not expect (a stream written by an
    /// incompatible version?). The backend's last error has the reply.
    UnexpectedReply,
    /// Another server error; its code (the first word of the server's message, at most 16
    /// bytes).
    Other(ErrorCode),
}

impl ServerReason {
    /// The reason for a server error `code` (the first word of a Redis error reply, such as
    /// `OOM` or `LOADING`).
    ///
    /// ```
    /// use lanestream::ServerReason;
    /// assert_eq!(ServerReason::from_code("OOM"), ServerReason::OutOfMemory);
    /// assert_eq!(ServerReason::from_code("NOSCRIPT").to_string(), "NOSCRIPT");
    /// ```
    pub fn from_code(code: &str) -> ServerReason {
        match code {
            "OOM" => ServerReason::OutOfMemory,
            "LOADING" => ServerReason::Loading,
            "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "CLUSTERDOWN" => ServerReason::Busy,
            "READONLY" => ServerReason::ReadOnly,
            "NOPERM" | "NOAUTH" | "WRONGPASS" => ServerReason::NoPermission,
            "WRONGTYPE" => ServerReason::WrongType,
            other => ServerReason::Other(ErrorCode::new(other)),
        }
    }
}

impl fmt::Display for ServerReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ServerReason::OutOfMemory => "OOM, out of memory (free memory or raise maxmemory, then retry)",
            ServerReason::Loading => "LOADING, the server is still loading its data (retry later)",
            ServerReason::Busy => "the server is busy or failing over (retry later)",
            ServerReason::ReadOnly => "READONLY, a read-only replica (connect to the primary)",
            ServerReason::NoPermission => "no permission (check the user's ACL and the credentials)",
            ServerReason::WrongType => {
                "WRONGTYPE, a key of the stream holds another type (another writer under its prefix?)"
            }
            ServerReason::UnexpectedReply => "an unexpected reply (an incompatible version's stream?)",
            ServerReason::Other(code) => return write!(f, "{code}"),
        })
    }
}

/// A server error's code, kept inline (at most 16 bytes, longer ones cut) so that errors stay
/// `Copy`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode {
    len: u8,
    bytes: [u8; 16],
}

impl ErrorCode {
    /// The code `code`, cut to 16 bytes (at a character boundary).
    ///
    /// ```
    /// use lanestream::ErrorCode;
    /// assert_eq!(ErrorCode::new("EXECABORT").as_str(), "EXECABORT");
    /// assert_eq!(ErrorCode::new("A_VERY_LONG_ERROR_CODE").as_str(), "A_VERY_LONG_ERRO");
    /// ```
    pub fn new(code: &str) -> ErrorCode {
        let mut len = code.len().min(16);
        while !code.is_char_boundary(len) {
            len -= 1;
        }
        let mut bytes = [0u8; 16];
        bytes[..len].copy_from_slice(&code.as_bytes()[..len]);
        ErrorCode { len: len as u8, bytes }
    }

    /// The code as text.
    pub fn as_str(&self) -> &str {
        // Cut at a character boundary of a `&str` in `new`.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl fmt::Debug for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a stream or lane could not be built. Nothing is built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A capacity of 0 was asked for; every lane needs at least one slot.
    #[error("capacity must be at least 1 (got 0 for {0})")]
    ZeroCapacity(&'static str),
    /// A capacity above the limit ([`MAX_CAPACITY`](crate::MAX_CAPACITY)) was asked for.
    #[error("capacity {capacity} for {what} is above the limit of {max} slots")]
    CapacityTooLarge {
        /// Which lane(s) the capacity was for.
        what: &'static str,
        /// The capacity asked for, in slots.
        capacity: usize,
        /// The limit, in slots.
        max: usize,
    },
    /// A memory budget of 0 bytes was asked for ([`StreamBuilder::memory_budget`](crate::StreamBuilder::memory_budget)):
    /// nothing could ever be published. Leave the budget out for none.
    #[error("memory budget must be at least 1 byte (got 0)")]
    ZeroBudget,
    /// A memory budget above the limit ([`MAX_BUDGET`](crate::MAX_BUDGET)) was asked for.
    #[error("memory budget {bytes} bytes is above the limit of {max} bytes")]
    BudgetTooLarge {
        /// The budget asked for, in bytes.
        bytes: u64,
        /// The limit, in bytes.
        max: u64,
    },
    /// A sink name was given twice.
    #[error("sink {0} is named twice")]
    DuplicateSink(SinkName),
    /// A sink name is not valid (`^[a-z_][a-z0-9_]*$`, at most 63 bytes).
    #[error("invalid sink name: {0}")]
    InvalidSink(#[from] NameError),
    /// The backend could not be reached or refused to set the stream up.
    #[error("backend: {0}")]
    Backend(BackendError),
    /// A backend's URL does not parse (for Redis: `redis://host:port/db`,
    /// `redis+unix:///path/to/socket`...); the message says why.
    #[error("invalid backend URL {0}")]
    InvalidUrl(String),
    /// A backend's stream name is empty or holds a character the backend reserves (for Redis:
    /// `{` and `}`, which delimit the keys' hash tag).
    #[error("invalid stream name {0:?}")]
    InvalidStreamName(String),
    /// The backend already holds a stream under this name, built with other sinks.
    #[error("the backend's stream was built differently: {0}")]
    Mismatch(String),
    /// The backend holds the stream (named here) in a layout this version no longer writes
    /// or reads: over Redis, the retired per-lane-producer layout (a producer per lane on a
    /// shared log, with consumer groups), which every stream made before the fan-out became the
    /// only publisher of a stream has. Nothing was changed. Drain it with the version that
    /// wrote it, then delete it (`RedisStreamBuilder::delete`, or its `{name}:*` keys) and
    /// build it again: it is made in the current layout (one log written once by the fan-out, every
    /// lane reading it).
    #[error(
        "stream {0:?} is stored in the retired per-lane-producer layout, which this version no longer \
         reads: drain it with the version that wrote it, then delete it (RedisStreamBuilder::delete) and \
         build it again in the fan-out layout"
    )]
    RetiredLayout(String),
}

/// Why a lane end could not be had from a stream. The stream is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// No lane for this sink: the set of sinks is fixed when the stream is built
    /// ([L1](crate::contract#l1)).
    #[error("unknown lane {0:?}")]
    UnknownLane(String),
    /// Another producer of this lane is alive; at most one publishes at a time
    /// ([L9](crate::contract#l9)). Drop it first.
    #[error("lane {0} already has a live producer")]
    ProducerBusy(SinkName),
    /// Another consumer of this lane is attached (from `attach`; `reattach` takes the lane over
    /// instead). Drop it first.
    #[error("lane {0} already has an attached consumer")]
    ConsumerAttached(SinkName),
    /// Another consumer of the request lane is attached (from `attach_requests`;
    /// `reattach_requests` takes it over instead). Drop it first.
    #[error("the request lane already has an attached consumer")]
    RequestConsumerAttached,
    /// The backend failed ([`BackendError`]); nothing was claimed.
    #[error("backend: {0}")]
    Backend(BackendError),
}

/// Why a publish did not publish its item: the one error of every publish form, of every
/// publishing end. Every variant holds the item, untouched; nothing was enqueued.
///
/// Each form returns only the causes it can meet:
///
/// | form | `Full` | `Timeout` | `Closed`, `PositionRegressed`, `InvalidPosition`, `Backend` |
/// |---|---|---|---|
/// | `try_publish`, `try_publish_to`, `try_publish_run` (never waits) | yes | — | yes |
/// | `publish_deadline(item, Some(deadline))`, `publish_timeout` | — | yes | yes |
/// | `publish`, `publish_deadline(item, None)`, `publish_to`, `publish_run`, `publish_async` (wait for room) | — | — | yes |
///
/// For a run (`try_publish_run`, `publish_run`) the payload is how many items were published
/// instead of the item: the refused items stay in the caller's `Vec`.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError<T> {
    /// The lane holds `capacity` unacked items, or the memory budget is spent
    /// ([L3](crate::contract#l3)); try again after an ack. Only from the forms that never wait.
    #[error("lane is full")]
    Full(T),
    /// The deadline passed while the lane stayed full. Only from the forms with a deadline.
    #[error("timed out waiting for room in the lane")]
    Timeout(T),
    /// The lane was closed ([L10](crate::contract#l10)); it accepts nothing more.
    #[error("lane is closed")]
    Closed(T),
    /// The item's position is not greater than the last positioned item on this lane
    /// ([L4](crate::contract#l4)).
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
    /// The backend failed ([`BackendError`]); the item is handed back. After
    /// [`BackendError::Connection`] it may have been published all the same (at least once).
    #[error("backend: {error}")]
    Backend {
        /// The item, handed back.
        item: T,
        /// What failed.
        error: BackendError,
    },
}

impl<T> PublishError<T> {
    /// The item that was not published.
    pub fn into_inner(self) -> T {
        match self {
            PublishError::Full(t)
            | PublishError::Timeout(t)
            | PublishError::Closed(t)
            | PublishError::InvalidPosition(t) => t,
            PublishError::PositionRegressed { item, .. } | PublishError::Backend { item, .. } => item,
        }
    }

    /// Whether the lane was full (a form that never waits).
    pub fn is_full(&self) -> bool {
        matches!(self, PublishError::Full(_))
    }

    /// Whether the deadline passed (a form with a deadline).
    pub fn is_timeout(&self) -> bool {
        matches!(self, PublishError::Timeout(_))
    }

    /// Whether the lane was closed.
    pub fn is_closed(&self) -> bool {
        matches!(self, PublishError::Closed(_))
    }

    /// The same cause, carrying `f(item)` instead of the item (for a run's index).
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> PublishError<U> {
        match self {
            PublishError::Full(t) => PublishError::Full(f(t)),
            PublishError::Timeout(t) => PublishError::Timeout(f(t)),
            PublishError::Closed(t) => PublishError::Closed(f(t)),
            PublishError::InvalidPosition(t) => PublishError::InvalidPosition(f(t)),
            PublishError::PositionRegressed { item, position, last } => {
                PublishError::PositionRegressed { item: f(item), position, last }
            }
            PublishError::Backend { item, error } => PublishError::Backend { item: f(item), error },
        }
    }
}

impl<T> fmt::Debug for PublishError<T> {
    /// Shows the cause only; does not require `T: Debug`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PublishError::Full(_) => f.write_str("Full(..)"),
            PublishError::Timeout(_) => f.write_str("Timeout(..)"),
            PublishError::Closed(_) => f.write_str("Closed(..)"),
            PublishError::InvalidPosition(_) => f.write_str("InvalidPosition(..)"),
            PublishError::PositionRegressed { position, last, .. } => f
                .debug_struct("PositionRegressed")
                .field("position", position)
                .field("last", last)
                .finish_non_exhaustive(),
            PublishError::Backend { error, .. } => {
                f.debug_struct("Backend").field("error", error).finish_non_exhaustive()
            }
        }
    }
}

/// Why a blocking or async receive returned no delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecvError {
    /// A newer consumer was attached to this lane ([L8](crate::contract#l8)); this one will never
    /// receive again. Its outstanding deliveries were released to the new consumer (acks that
    /// race it may still land).
    #[error("consumer was detached by a newer consumer of the same lane")]
    Detached,
    /// The backend failed ([`BackendError`]); nothing was taken.
    #[error("backend: {0}")]
    Backend(BackendError),
}

/// Why `recv_timeout` / `recv_deadline` returned no delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecvTimeoutError {
    /// The deadline passed with nothing to receive. Nothing changed.
    #[error("timed out waiting for an item")]
    Timeout,
    /// As [`RecvError::Detached`].
    #[error("consumer was detached by a newer consumer of the same lane")]
    Detached,
    /// As [`RecvError::Backend`].
    #[error("backend: {0}")]
    Backend(BackendError),
}

impl RecvTimeoutError {
    /// Whether the deadline passed.
    pub fn is_timeout(&self) -> bool {
        matches!(self, RecvTimeoutError::Timeout)
    }

    /// Whether a newer consumer detached this one.
    pub fn is_detached(&self) -> bool {
        matches!(self, RecvTimeoutError::Detached)
    }

    /// The error of a receive without a deadline (`recv`, `recv_run`: the deadline form with
    /// `None`, which never times out).
    pub(crate) fn untimed(self) -> RecvError {
        match self {
            RecvTimeoutError::Detached => RecvError::Detached,
            RecvTimeoutError::Backend(e) => RecvError::Backend(e),
            RecvTimeoutError::Timeout => unreachable!("a wait without a deadline never times out"),
        }
    }
}

impl From<RecvError> for RecvTimeoutError {
    fn from(e: RecvError) -> Self {
        match e {
            RecvError::Detached => RecvTimeoutError::Detached,
            RecvError::Backend(e) => RecvTimeoutError::Backend(e),
        }
    }
}

/// Why `try_recv` returned no delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TryRecvError {
    /// Nothing queued or released right now; the lane is open.
    #[error("lane is empty")]
    Empty,
    /// The lane is closed and nothing queued or released is left.
    #[error("lane is closed and drained")]
    Closed,
    /// A newer consumer was attached to this lane ([L8](crate::contract#l8)).
    #[error("consumer was detached by a newer consumer of the same lane")]
    Detached,
    /// As [`RecvError::Backend`].
    #[error("backend: {0}")]
    Backend(BackendError),
}

impl TryRecvError {
    /// Whether nothing was queued or released.
    pub fn is_empty(&self) -> bool {
        matches!(self, TryRecvError::Empty)
    }

    /// Whether the lane is closed and drained.
    pub fn is_closed(&self) -> bool {
        matches!(self, TryRecvError::Closed)
    }

    /// Whether a newer consumer detached this one.
    pub fn is_detached(&self) -> bool {
        matches!(self, TryRecvError::Detached)
    }
}

/// Why an ack was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AckError {
    /// A re-attach took the item back before this ack landed ([L8](crate::contract#l8)): it was
    /// released and will be (or was) redelivered to the new consumer. The lane's acked position
    /// did not move.
    #[error("delivery was taken back by a consumer re-attach; the item is redelivered")]
    Detached,
    /// The backend failed ([`BackendError`]). With [`BackendError::Connection`] (or a transient
    /// [`BackendError::Server`] refusal that outlasted the retry budget) the outcome is unknown:
    /// the ack may have landed, or the item will be redelivered after a re-attach; never both.
    /// The Redis backend keeps such an ack and sends it again before its consumer's next
    /// receive, so nothing is left for the caller to do but receive on (a sink skips what its
    /// checkpoint holds, should the item come again).
    #[error("backend: {0}")]
    Backend(BackendError),
}
