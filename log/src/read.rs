//! [`ReadHandle`] and [`Reads`]: reads on the caller's thread over the published snapshot.

use std::fmt;
use std::io;
use std::sync::Arc;

use super::error::ReadError;
use super::event::SequencedEvent;
use super::position::{LogPosition, PositionRange, raw};
use super::query::Query;
use super::snapshot::{Dir, Shared, View};
use super::subscription::Subscription;

/// Reads and subscriptions of one log; cheap to clone, `Send + Sync`.
///
/// Every read runs on the caller's thread over the snapshot published last: it takes no lock,
/// never touches the writer and is never held up by it. A read is consistent: it sees a prefix
/// `1..=W` of the log, `W` being the head published when it started ([`Reads::head`]), and each
/// append in that prefix whole. A read handle stays usable after the log is closed (the
/// events are still there); it does not keep the writer running.
#[derive(Clone)]
pub struct ReadHandle {
    pub(crate) shared: Arc<Shared>,
}

impl ReadHandle {
    /// Up to `limit` events matching `query` at positions `(after, W]`, ascending, `W` being the
    /// head at the call (`after == None`: from the first event).
    ///
    /// Costs O(log n) plus the candidates of the most selective posting list of each query item
    /// ([`Query::All`] walks positions directly); in a durable log, plus one read of each
    /// matching record not in the cache ([`LogOptions::cache_bytes`](crate::LogOptions::cache_bytes)).
    ///
    /// # Errors
    /// [`ReadError`] when a durable log's record cannot be read back (a failing disk, a
    /// damaged segment); nothing changed, the read can be tried again. An in-memory log never
    /// fails a read.
    pub fn read(&self, query: &Query, after: Option<LogPosition>, limit: usize) -> Result<Reads, ReadError> {
        let snap = self.shared.snapshot.load();
        let view = View::published(snap.head, &snap.types, &snap.tags, &self.shared.events);
        let after_raw = raw(after);
        let (events, cut_short) = view.collect(query, after_raw, snap.head, Dir::Up, limit)?;
        let resume = if cut_short {
            events.last().map_or(after_raw, |e| e.position.get())
        } else {
            snap.head.max(after_raw)
        };
        Ok(Reads {
            events,
            head: LogPosition::from_raw(snap.head),
            cut_short,
            resume: LogPosition::from_raw(resume),
        })
    }

    /// Up to `limit` events matching `query` at positions below `before` (below and at `W`, the
    /// head at the call, when `before` is `None`), descending: the newest first.
    ///
    /// [`Reads::resume`] is the position to pass as `before` to go on, or `None` when the read
    /// reached the start of the log.
    ///
    /// # Errors
    /// As [`read`](ReadHandle::read).
    pub fn read_back(
        &self,
        query: &Query,
        before: Option<LogPosition>,
        limit: usize,
    ) -> Result<Reads, ReadError> {
        let snap = self.shared.snapshot.load();
        let view = View::published(snap.head, &snap.types, &snap.tags, &self.shared.events);
        let hi = before.map_or(snap.head, |b| (b.get() - 1).min(snap.head));
        let (events, cut_short) = view.collect(query, 0, hi, Dir::Down, limit)?;
        let resume = if cut_short {
            LogPosition::from_raw(events.last().map_or(hi + 1, |e| e.position.get()))
        } else {
            None
        };
        Ok(Reads { events, head: LogPosition::from_raw(snap.head), cut_short, resume })
    }

    /// A subscription to every event matching `query` after `after` (`None`: from the first
    /// event); see [`Subscription`].
    pub fn subscribe(&self, query: Query, after: Option<LogPosition>) -> Subscription {
        Subscription::new(self.shared.clone(), query, after)
    }

    /// The published head: the position of the newest event readers can see (`None`: the log
    /// is empty).
    pub fn head(&self) -> Option<LogPosition> {
        LogPosition::from_raw(self.shared.head())
    }

    /// The event at `position`, if the published head covers it.
    ///
    /// # Errors
    /// As [`read`](ReadHandle::read).
    pub fn get(&self, position: LogPosition) -> Result<Option<SequencedEvent>, ReadError> {
        let head = self.shared.head();
        if position.get() > head {
            return Ok(None);
        }
        let event = self.shared.events.at(position.get()).load(position.get())?;
        Ok(Some(SequencedEvent { position, event }))
    }

    /// The append that put the event at `position` there: every position it was given, if the
    /// published head covers `position`. Appends are atomic, so this is where the writer's
    /// `Ok(range)` put it.
    ///
    /// ```
    /// use lanestream_log::{Event, EventLog, LogOptions, LogPosition};
    /// let log = EventLog::in_memory(LogOptions::default())?;
    /// let e = || Event::untagged("T", bytes::Bytes::new());
    /// log.append(vec![e()?], None)?;
    /// let range = log.append(vec![e()?, e()?, e()?], None)?;
    /// assert_eq!(log.reader().append_at(LogPosition::new(3).unwrap()), Some(range));
    /// assert_eq!(log.reader().append_at(LogPosition::new(5).unwrap()), None); // beyond the head
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn append_at(&self, position: LogPosition) -> Option<PositionRange> {
        let (first, last) = self.shared.append_at(position.get(), self.shared.head())?;
        Some(PositionRange::from_raw(first, last - first + 1))
    }

    /// Whether the log's writer has stopped (closed, or every write handle dropped).
    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }

    /// The write or sync failure that stopped the log taking writes, if any.
    pub fn failure(&self) -> Option<Arc<io::Error>> {
        self.shared.failure.get().cloned()
    }
}

impl fmt::Debug for ReadHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadHandle").field("log", &self.shared).finish()
    }
}

/// What one read returned: the events, the head `W` it was pinned to, whether `limit` cut it
/// short, and where to resume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reads {
    events: Vec<SequencedEvent>,
    head: Option<LogPosition>,
    cut_short: bool,
    resume: Option<LogPosition>,
}

impl Reads {
    /// The events, in read order.
    pub fn events(&self) -> &[SequencedEvent] {
        &self.events
    }

    /// The events, owned.
    pub fn into_events(self) -> Vec<SequencedEvent> {
        self.events
    }

    /// `W`: the head the read was pinned to (`None`: the log was empty). For a decision, this
    /// is the `after` of its [`AppendCondition`](super::AppendCondition) — provided the read was
    /// not cut short.
    pub fn head(&self) -> Option<LogPosition> {
        self.head
    }

    /// Whether `limit` stopped the read while more matching events lay within `W`.
    pub fn is_cut_short(&self) -> bool {
        self.cut_short
    }

    /// Where to go on. For [`read`](ReadHandle::read), the `after` of the next read: the last
    /// delivered position when cut short, else `W` (or `after` itself, if it lay beyond `W`).
    /// For [`read_back`](ReadHandle::read_back), the `before` of the next read when cut short,
    /// else `None` (the start of the log was reached).
    pub fn resume(&self) -> Option<LogPosition> {
        self.resume
    }

    /// How many events were read.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether no event was read.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

impl IntoIterator for Reads {
    type Item = SequencedEvent;
    type IntoIter = std::vec::IntoIter<SequencedEvent>;
    fn into_iter(self) -> Self::IntoIter {
        self.events.into_iter()
    }
}
