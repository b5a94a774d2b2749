//! The file source of this crate ([`FileSource`]: a wal2json or pgoutput capture, or any
//! iterator of batches), a [`Source`] of the core's driver ([`Pipeline`](super::Pipeline)). The
//! live replication slot, [`LiveSource`](crate::live::LiveSource), is a `Source` of its own.

use std::collections::{HashMap, VecDeque};
use std::io::BufRead;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use lanestream::{Batch, Envelope, IndexName, LaneItem, Op, Position, Request, SinkName};

use super::{SinkStart, Source, SourceItem, SourceStart};
use crate::batch::TransactionBuilder;
use crate::pgoutput::PgOutputReader;
use crate::wal2json::{Wal2JsonError, Wal2JsonReader};

/// Why a [`FileSource`] stopped; `E` is its reader's error ([`Wal2JsonError`] for a wal2json
/// input, [`PgOutputError`](crate::pgoutput::PgOutputError) for a pgoutput capture).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileSourceError<E: std::error::Error + 'static = Wal2JsonError> {
    /// A line or message of the input could not be read or made into a batch (it is named
    /// inside).
    #[error(transparent)]
    Input(E),
    /// A backfill was asked of a source built without [`FileSource::serve_backfills`]: it keeps
    /// no rows to answer it from.
    #[error("backfill of {indexes:?} for sink {sink}: this file source keeps no rows to answer it from (build it with FileSource::serve_backfills)")]
    BackfillRefused {
        /// The sink that asked.
        sink: SinkName,
        /// The indexes it asked for.
        indexes: Vec<IndexName>,
    },
    /// A request this source does not know.
    #[error("a request the file source does not serve: {0:?}")]
    UnknownRequest(Request),
}

/// How many rows one snapshot batch of a [`FileSource`] backfill holds.
const SNAPSHOT_BATCH_ROWS: usize = 512;

/// The latest row of each id, per index: what a [`FileSource`] answers backfills from.
type Rows = HashMap<IndexName, HashMap<String, Bytes>>;

/// A finite input of batches — a wal2json (format-version 2) capture or `pg_recvlogical` pipe
/// ([`FileSource::new`]), a pgoutput capture ([`FileSource::pgoutput`]), or any iterator of
/// batches ([`FileSource::from_batches`]) — as a [`Source`]: one [`SourceItem::Change`] per
/// transaction (or chunk of a large one), then [`SourceItem::End`]. A file is read from its
/// start, so a new sink gets everything by reading it ([`Source::start`] has nothing to check).
///
/// [`confirm`](Source::confirm) records the position (a file has nothing to confirm to; read it
/// with [`confirmed`](FileSource::confirmed)). Backfills are refused unless the source was built
/// with [`serve_backfills`](FileSource::serve_backfills), which keeps the latest row of each id
/// it has read (memory grows with the tables) and answers a request from those rows: what the
/// input showed so far, which for a capture is not a table's whole content.
pub struct FileSource<I> {
    reader: I,
    rows: Option<Rows>,
    snapshots: VecDeque<SourceItem>,
    confirmed: Option<Position>,
    ended: bool,
}

impl<I> std::fmt::Debug for FileSource<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSource")
            .field("serve_backfills", &self.rows.is_some())
            .field("confirmed", &self.confirmed)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl<R: BufRead + Send> FileSource<Wal2JsonReader<R>> {
    /// A source reading `input` (plain wal2json lines; decompress first) with `builder` (its
    /// chunk size, key columns).
    pub fn new(input: R, builder: TransactionBuilder) -> Self {
        FileSource::from_batches(Wal2JsonReader::new(input).with_builder(builder))
    }
}

impl<R: BufRead + Send> FileSource<PgOutputReader<R>> {
    /// A source reading a pgoutput capture (each message a 4-byte big-endian length, then its
    /// bytes; decompress first: [`PgOutputReader`]) with `builder`.
    pub fn pgoutput(input: R, builder: TransactionBuilder) -> Self {
        FileSource::from_batches(PgOutputReader::new(input, builder))
    }
}

impl<I, E> FileSource<I>
where
    I: Iterator<Item = Result<Batch, E>> + Send,
    E: std::error::Error + Send + Sync + 'static,
{
    /// A source of the batches `reader` yields, in order (positions strictly increasing).
    pub fn from_batches(reader: I) -> Self {
        FileSource { reader, rows: None, snapshots: VecDeque::new(), confirmed: None, ended: false }
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
    pub fn reader(&self) -> &I {
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

impl<I, E> Source for FileSource<I>
where
    I: Iterator<Item = Result<Batch, E>> + Send,
    E: std::error::Error + Send + Sync + 'static,
{
    type Error = FileSourceError<E>;

    /// Never waits: a file either has the next line or has ended.
    fn next(&mut self, _timeout: Duration) -> Result<Option<SourceItem>, FileSourceError<E>> {
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
            Some(Err(e)) => Err(FileSourceError::Input(e)),
            None => {
                self.ended = true;
                Ok(Some(SourceItem::End))
            }
        }
    }

    fn confirm(&mut self, position: Position) -> Result<(), FileSourceError<E>> {
        self.confirmed = self.confirmed.max(Some(position));
        Ok(())
    }

    /// Nothing to check: a file is read from its first line, so a new sink gets everything
    /// by reading it (no history); no origin, indexes not listed.
    fn start(&mut self, _sinks: &[SinkStart<'_>]) -> Result<SourceStart, FileSourceError<E>> {
        Ok(SourceStart::default())
    }

    fn backfill(&mut self, request: Request) -> Result<(), FileSourceError<E>> {
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
                    relation: None,
                    old_id: None,
                    unchanged: Vec::new(),
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
