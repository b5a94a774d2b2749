//! The ingest side: what the [driver](super::Pipeline) reads from ([`Source`]), and the two
//! sources of this crate: the wal2json file reader ([`FileSource`]) and the live replication
//! slot ([`PgLiveSource`]).

use std::collections::{HashMap, VecDeque};
use std::io::BufRead;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use lanestream::{Batch, Envelope, IndexName, LaneItem, Op, Position, Request, SinkName};

use crate::live::{LiveError, LiveItem, LiveSource};
use crate::pgoutput::PgOutputDecoder;
use crate::wal2json::{TransactionBuilder, Wal2JsonError, Wal2JsonReader};

/// Where a pipeline's changes come from: a replication slot, a file, an event log.
///
/// The [driver](super::Pipeline) calls [`next`](Source::next) in a loop from one thread,
/// publishes what it returns, calls [`confirm`](Source::confirm) with the stream's watermark (what
/// every sink has made durable and acked, never more), and hands each backfill request of the
/// request lane to [`backfill`](Source::backfill).
pub trait Source: Send {
    /// Why the source cannot go on; the driver stops with it ([`PipelineError::Source`](super::PipelineError::Source)).
    type Error: std::error::Error + Send + Sync + 'static;

    /// Waits up to `timeout` for the next thing to publish; `Ok(None)` on timeout; the end of a
    /// finite input is [`SourceItem::End`] (and stays so on later calls, except for snapshot
    /// items of a backfill asked for after it).
    ///
    /// # Errors
    /// The source's own; the driver stops.
    fn next(&mut self, timeout: Duration) -> Result<Option<SourceItem>, Self::Error>;

    /// The stream's watermark reached `position`: the source may confirm up to it, never more
    /// (everything at or before it is durable in every sink).
    ///
    /// # Errors
    /// The source's own; the driver stops.
    fn confirm(&mut self, position: Position) -> Result<(), Self::Error>;

    /// A sink asked for a backfill: start serving it. Its snapshot batches (position `None`) and
    /// then its `SnapshotComplete` come out of [`next`](Source::next) as
    /// [`SourceItem::Snapshot`], interleaved with the live changes. A source that cannot
    /// backfill returns an error naming the request (the driver then stops: a sink waiting for a
    /// snapshot that never comes would hold stale data silently).
    ///
    /// # Errors
    /// The source's own, or its refusal.
    fn backfill(&mut self, request: Request) -> Result<(), Self::Error>;

    /// How far the upstream is ahead of what was confirmed, in bytes, for
    /// [`PipelineMetrics::source_lag_bytes`](super::metrics::PipelineMetrics::source_lag_bytes)
    /// (PostgreSQL: the slot's WAL the server keeps beyond its confirmed position). The driver
    /// asks about once a second, on its own thread. Default: `None` (not known).
    fn lag_bytes(&mut self) -> Option<u64> {
        None
    }
}

/// What [`Source::next`] hands the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceItem {
    /// A committed transaction (or one chunk of it): published to every lane.
    Change(Batch),
    /// For one sink only (published with `publish_to`): a snapshot batch or the
    /// `LaneItem::SnapshotComplete { indexes }` that ends a backfill. The driver acks the
    /// request's delivery only after it published this `SnapshotComplete` ([R2](lanestream::contract#r2)).
    Snapshot {
        /// The sink that asked.
        sink: SinkName,
        /// The snapshot batch, or `SnapshotComplete`.
        item: LaneItem,
    },
    /// A finite input is exhausted.
    End,
}

/// Why a [`FileSource`] stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileSourceError {
    /// A line of the input could not be read or made into a batch (its line number inside).
    #[error(transparent)]
    Input(#[from] Wal2JsonError),
    /// A backfill was asked of a source built without [`FileSource::serve_backfills`]: it keeps
    /// no rows to answer it from.
    #[error("backfill of {indexes:?} for sink {sink}: this wal2json file source keeps no rows to answer it from (build it with FileSource::serve_backfills)")]
    BackfillRefused {
        /// The sink that asked.
        sink: SinkName,
        /// The indexes it asked for.
        indexes: Vec<IndexName>,
    },
    /// A request this source does not know.
    #[error("a request the wal2json file source does not serve: {0:?}")]
    UnknownRequest(Request),
}

/// How many rows one snapshot batch of a [`FileSource`] backfill holds.
const SNAPSHOT_BATCH_ROWS: usize = 512;

/// The latest row of each id, per index: what a [`FileSource`] answers backfills from.
type Rows = HashMap<IndexName, HashMap<String, Bytes>>;

/// A wal2json (format-version 2) input — a capture file, a `pg_recvlogical` pipe — as a
/// [`Source`]: one [`SourceItem::Change`] per transaction (or chunk of a large one), then
/// [`SourceItem::End`].
///
/// [`confirm`](Source::confirm) records the position (a file has nothing to confirm to; read it
/// with [`confirmed`](FileSource::confirmed)). Backfills are refused unless the source was built
/// with [`serve_backfills`](FileSource::serve_backfills), which keeps the latest row of each id
/// it has read (memory grows with the tables) and answers a request from those rows: what the
/// input showed so far, which for a capture is not a table's whole content.
pub struct FileSource<R> {
    reader: Wal2JsonReader<R>,
    rows: Option<Rows>,
    snapshots: VecDeque<SourceItem>,
    confirmed: Option<Position>,
    ended: bool,
}

impl<R> std::fmt::Debug for FileSource<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSource")
            .field("serve_backfills", &self.rows.is_some())
            .field("confirmed", &self.confirmed)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl<R: BufRead + Send> FileSource<R> {
    /// A source reading `input` (plain wal2json lines; decompress first) with `builder` (its
    /// chunk size, key columns).
    pub fn new(input: R, builder: TransactionBuilder) -> Self {
        FileSource {
            reader: Wal2JsonReader::new(input).with_builder(builder),
            rows: None,
            snapshots: VecDeque::new(),
            confirmed: None,
            ended: false,
        }
    }

    /// Keep the latest row of each id read, and answer backfills from them.
    pub fn serve_backfills(mut self) -> Self {
        self.rows = Some(Rows::new());
        self
    }

    /// The last position the driver confirmed.
    pub fn confirmed(&self) -> Option<Position> {
        self.confirmed
    }

    /// The reader (lines read, the builder's counters).
    pub fn reader(&self) -> &Wal2JsonReader<R> {
        &self.reader
    }

    fn remember(&mut self, batch: &Batch) {
        let Some(state) = &mut self.rows else { return };
        for e in batch.envelopes.iter() {
            let rows = state.entry(e.index.clone()).or_default();
            match e.op {
                Op::Upsert => {
                    rows.insert(e.id.clone(), e.document.clone());
                }
                Op::Delete => {
                    rows.remove(&e.id);
                }
                // Truncate, and any op added later that this source does not know: the index's
                // rows are no longer known, so none is served (never a stale one).
                _ => rows.clear(),
            }
        }
    }
}

impl<R: BufRead + Send> Source for FileSource<R> {
    type Error = FileSourceError;

    /// Never waits: a file either has the next line or has ended.
    fn next(&mut self, _timeout: Duration) -> Result<Option<SourceItem>, FileSourceError> {
        if let Some(item) = self.snapshots.pop_front() {
            return Ok(Some(item));
        }
        if self.ended {
            return Ok(Some(SourceItem::End));
        }
        match self.reader.next() {
            Some(Ok(batch)) => {
                self.remember(&batch);
                Ok(Some(SourceItem::Change(batch)))
            }
            Some(Err(e)) => Err(e.into()),
            None => {
                self.ended = true;
                Ok(Some(SourceItem::End))
            }
        }
    }

    fn confirm(&mut self, position: Position) -> Result<(), FileSourceError> {
        self.confirmed = self.confirmed.max(Some(position));
        Ok(())
    }

    fn backfill(&mut self, request: Request) -> Result<(), FileSourceError> {
        let (sink, indexes) = match request {
            Request::Backfill { sink, indexes, .. } => (sink, indexes),
            other => return Err(FileSourceError::UnknownRequest(other)),
        };
        let Some(state) = &self.rows else {
            return Err(FileSourceError::BackfillRefused { sink, indexes });
        };
        let empty = HashMap::new();
        for index in &indexes {
            let rows = state.get(index).unwrap_or(&empty);
            let envelopes: Vec<Envelope> = rows
                .iter()
                .map(|(id, document)| Envelope {
                    index: index.clone(),
                    id: id.clone(),
                    op: Op::Upsert,
                    position: None,
                    document: document.clone(),
                    built_at_micros: None,
                })
                .collect();
            for chunk in envelopes.chunks(SNAPSHOT_BATCH_ROWS) {
                let item = LaneItem::Batch(Batch::new(None, Arc::from(chunk)));
                self.snapshots.push_back(SourceItem::Snapshot { sink: sink.clone(), item });
            }
        }
        self.snapshots.push_back(SourceItem::Snapshot { sink, item: LaneItem::SnapshotComplete { indexes } });
        Ok(())
    }
}

/// The live source ([`LiveSource`], a pgoutput replication slot) with its decoder, as a
/// [`Source`]: started at the first [`next`](Source::next), confirmed with
/// [`LiveSource::confirm`]. Each `next` confirms again the last position the driver confirmed
/// (cheap when nothing changed): while every transaction handed over is acked, that lets the
/// slot follow the server's WAL past what is not ours (another database's writes), as
/// [`LiveSource::confirm`] describes, though the watermark does not move. It ends only at [`until`](PgLiveSource::until)'s position, if set
/// (otherwise the driver runs until stopped).
///
/// Backfills are served from the tables themselves, while the live stream keeps flowing
/// ([`LiveSource::backfill`]: keyset chunks between low and high marks written into the WAL, as
/// Netflix's DBLog does): their snapshot batches and then their `SnapshotComplete` come out of
/// [`next`](Source::next) as [`SourceItem::Snapshot`]. A request that can never be served (no
/// such table in the publication, no primary key) is [`LiveError::BackfillRefused`].
#[derive(Debug)]
pub struct PgLiveSource {
    source: LiveSource,
    decoder: PgOutputDecoder,
    started: bool,
    end: Option<Position>,
    /// The last position the driver confirmed.
    confirmed: Option<Position>,
}

impl PgLiveSource {
    /// Wraps a connected source; `builder` is the decoder's batch builder (its chunk size, key
    /// columns), given the source's catalog key look-up here.
    pub fn new(source: LiveSource, builder: TransactionBuilder) -> Self {
        let decoder = PgOutputDecoder::new(builder.with_key_lookup(source.key_lookup()));
        PgLiveSource { source, decoder, started: false, end: None, confirmed: None }
    }

    /// End (return [`SourceItem::End`]) once every transaction committed before `end` was
    /// decoded and no more arrive within one `next` timeout.
    pub fn until(mut self, end: Option<Position>) -> Self {
        self.end = end;
        self
    }

    /// The live source (metrics, the slot's confirmed position).
    pub fn live(&mut self) -> &mut LiveSource {
        &mut self.source
    }

    /// The live source, for the last confirm and metrics after the driver returned it.
    pub fn into_inner(self) -> LiveSource {
        self.source
    }
}

impl Source for PgLiveSource {
    type Error = LiveError;

    fn next(&mut self, timeout: Duration) -> Result<Option<SourceItem>, LiveError> {
        if !self.started {
            self.source.start()?;
            self.started = true;
        }
        // The idle advance: past the watermark only where nothing of ours was committed.
        self.source.confirm(self.confirmed)?;
        match self.source.next_item(&mut self.decoder, timeout)? {
            Some(LiveItem::Change(batch)) => Ok(Some(SourceItem::Change(batch))),
            Some(LiveItem::Snapshot { sink, item }) => Ok(Some(SourceItem::Snapshot { sink, item })),
            None if self.end.is_some_and(|end| self.source.decoded().is_some_and(|d| d >= end)) => {
                Ok(Some(SourceItem::End))
            }
            None => Ok(None),
        }
    }

    fn confirm(&mut self, position: Position) -> Result<(), LiveError> {
        self.confirmed = self.confirmed.max(Some(position));
        self.source.confirm(self.confirmed).map(|_| ())
    }

    fn backfill(&mut self, request: Request) -> Result<(), LiveError> {
        self.source.backfill(request)
    }

    /// The slot's byte lag (`pg_current_wal_lsn() - confirmed_flush_lsn`, one query on the
    /// source's second connection); `None` when it cannot be read now.
    fn lag_bytes(&mut self) -> Option<u64> {
        self.source.metrics().ok().and_then(|m| m.slot_lag_bytes)
    }
}
