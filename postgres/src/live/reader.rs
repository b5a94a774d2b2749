//! The backfill side of the live source: requests taken in, the reader threads that read the
//! tables' chunks ([`ChunkReader`]), the chunks installed and their items handed over in stream
//! order (see [`crate::backfill`]).

use std::sync::mpsc;
use std::thread;

use lanestream::Request;
use postgres::SimpleQueryRow;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::error::LiveError;
use super::side::Side;
use super::{LiveConfig, LiveSource, SIDE_RETRY_BUDGET};
use crate::backfill::{
    chunk_end, chunk_rows, query_chunk, BackfillProgress, NextRead, ReadChunk, ReadFrom, TablePlan,
    XidSnapshot,
};
use crate::pipeline::SourceItem;

impl LiveSource {
    /// Starts serving a backfill request (see [`crate::backfill`]): its indexes' tables are
    /// found in the publication and checked now; their chunks then come out of
    /// [`next`](crate::pipeline::Source::next) as [`SourceItem::Snapshot`], interleaved with the changes,
    /// then the request's `SnapshotComplete`. Requests are served one after the other. An index
    /// no table of the publication has (any more: its table dropped, renamed or removed from the
    /// publication since the backfill was owed) has nothing to backfill: it is left out, and the
    /// `SnapshotComplete` still names it, so a sink's state stops owing it.
    ///
    /// # Errors
    /// [`LiveError::BackfillRefused`] for a request that can never be served (a table without a
    /// key, an `after` id that does not fit the key; the request is not queued: ack it
    /// unanswered); [`LiveError::Side`] / [`LiveError::Db`] from the catalog
    /// look-up.
    pub(super) fn serve_backfill(&mut self, request: Request) -> Result<(), LiveError> {
        let Request::Backfill { sink, indexes, after } = request else {
            return Err(LiveError::BackfillRefused {
                index: String::new(),
                reason: format!("{request:?} is not a backfill request"),
            });
        };
        let publication = self.config.publication.clone();
        let published = self.published_indexes()?;
        let mut plans = Vec::with_capacity(indexes.len());
        for index in indexes.iter().filter(|i| published.contains(i)) {
            let plan = self.side()?.run(
                SIDE_RETRY_BUDGET,
                || format!("finding the table of index {index}"),
                |c| TablePlan::resolve(c, &publication, index),
            )?;
            let plan = plan
                .map_err(|reason| LiveError::BackfillRefused { index: index.as_str().to_owned(), reason })?;
            plans.push(plan);
        }
        // `after` resumes the request's first index (left out when it is gone).
        let cursor = match (after, plans.first()) {
            (Some(id), Some(first)) if Some(&first.index) == indexes.first() => {
                Some(first.cursor_of_id(&id).map_err(|reason| LiveError::BackfillRefused {
                    index: first.index.as_str().to_owned(),
                    reason,
                })?)
            }
            _ => None,
        };
        self.backfiller.push(sink, indexes, plans, cursor);
        self.drain_backfill();
        Ok(())
    }

    /// Per table of the backfills asked so far: rows read and the table's row estimate.
    pub fn backfill_progress(&self) -> Vec<BackfillProgress> {
        self.backfiller.progress().to_vec()
    }

    /// Installs the chunk the reader thread read, if it is there, and hands the reader the next
    /// chunk when one is due. Whether a chunk was installed.
    pub(super) fn backfill_reads(&mut self) -> Result<bool, LiveError> {
        let mut installed = false;
        if let Some(reader) = self.reader.as_mut() {
            let read = match reader.done.try_recv() {
                Ok(read) => Some(read),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => return Err(ChunkReader::gone()),
            };
            if let Some(read) = read {
                self.install(read)?;
                installed = true;
            }
        }
        self.next_read()?;
        Ok(installed)
    }

    /// A chunk the reader thread read (or its failure) is taken in: it waits for its high mark,
    /// or is published at once when the stream passed it.
    /// A failed read ends the request being served (its chunks read ahead are dropped with the
    /// reader, which is started again for the next request): the error is returned once, and
    /// the stream goes on.
    pub(super) fn install(&mut self, read: Result<ReadChunk, LiveError>) -> Result<(), LiveError> {
        match read {
            Ok(read) => {
                self.backfiller.install(read);
                self.drain_backfill();
                Ok(())
            }
            Err(e) => {
                self.reader = None;
                self.backfiller.abandon();
                self.drain_backfill();
                Err(e)
            }
        }
    }

    /// Hands the reader the next chunk when one is due (starting the reader with the first).
    pub(super) fn next_read(&mut self) -> Result<(), LiveError> {
        if let Some(next) = self.backfiller.next_read() {
            if self.reader.is_none() {
                let source = self.backfiller.source_id().to_owned();
                self.reader =
                    Some(ChunkReader::start(self.config.clone(), source, self.backfiller.chunk_rows())?);
            }
            if let Some(reader) = &self.reader {
                reader.jobs.send(next).map_err(|_| ChunkReader::gone())?;
            }
        }
        Ok(())
    }

    /// Moves the backfill's ready items to the output, in order.
    pub(super) fn drain_backfill(&mut self) {
        self.metrics.snapshot_batches = self.backfiller.batches;
        self.metrics.snapshot_rows = self.backfiller.rows;
        self.metrics.snapshot_rows_dropped = self.backfiller.dropped;
        while let Some((sink, item)) = self.backfiller.out.pop_front() {
            self.out.push_back(SourceItem::Snapshot { sink, item });
        }
    }
}

/// The backfill's reader: two threads. The first, on a connection of its own (reconnected
/// within [`SIDE_RETRY_BUDGET`] when lost), reads the chunks it is handed one after the other
/// (marks and rows, one round trip each: [`query_chunk`]), keeping where the table's last chunk ended for the
/// next ([`ReadFrom::Continue`]); the second turns each chunk's text into snapshot envelopes
/// ([`chunk_rows`]) while the first reads the next, and hands them over in order. So the stream
/// goes on while a chunk is read, and neither the server nor the conversion waits for the
/// other. Both end when the source is dropped (after the chunk in hand).
pub(super) struct ChunkReader {
    pub(super) jobs: mpsc::Sender<NextRead>,
    /// A Tokio channel, so that the stream's poll waits for the stream and for it at
    /// once (sent to from a plain thread: an unbounded send never blocks; what it holds is
    /// bounded by the chunks handed out, [`crate::backfill`]).
    pub(super) done: UnboundedReceiver<Result<ReadChunk, LiveError>>,
}

/// What woke the stream's poll up: the stream or the backfill's reader.
pub(super) enum Woken<S> {
    Stream(S),
    Read(Option<Result<ReadChunk, LiveError>>),
}

/// A chunk's rows on their way from the reading thread to the converting one.
struct Copied {
    next: NextRead,
    /// `None`: after the table's end (no query, no rows).
    snapshot: Option<XidSnapshot>,
    rows: Vec<SimpleQueryRow>,
}

impl ChunkReader {
    pub(super) fn start(config: LiveConfig, source: String, rows: usize) -> Result<ChunkReader, LiveError> {
        let (jobs, jobs_in) = mpsc::channel::<NextRead>();
        let (copied_out, copied_in) = mpsc::channel::<Result<Copied, LiveError>>();
        let (done_out, done) = unbounded_channel();
        thread::Builder::new()
            .name("lanestream-backfill".into())
            .spawn(move || {
                let mut side = Side { config, client: None, lock: false };
                // The key values the last chunk read ended at, and whether it was its table's last.
                let (mut last, mut ended): (Option<Vec<String>>, bool) = (None, false);
                for next in jobs_in {
                    let cursor = match &next.from {
                        ReadFrom::First(cursor) => {
                            ended = false;
                            cursor.clone()
                        }
                        ReadFrom::Continue if ended => {
                            let copied = Copied { next, snapshot: None, rows: Vec::new() };
                            if copied_out.send(Ok(copied)).is_err() {
                                break;
                            }
                            continue;
                        }
                        ReadFrom::Continue => last.clone(),
                    };
                    let index = next.plan.index.as_str().to_owned();
                    let copied = side
                        .run(
                            SIDE_RETRY_BUDGET,
                            || format!("reading a backfill chunk of {}", next.plan.table),
                            |c| query_chunk(c, &next.plan, &source, next.chunk, cursor.as_deref(), rows),
                        )
                        .and_then(|read| read.map_err(|reason| LiveError::BackfillFailed { index, reason }))
                        .map(|(snapshot, read)| {
                            ended = read.len() < rows;
                            if let Some(end) = chunk_end(&next.plan, &read) {
                                last = Some(end);
                            }
                            Copied { snapshot: Some(snapshot), rows: read, next }
                        });
                    let stop = copied.is_err();
                    if copied_out.send(copied).is_err() || stop {
                        break;
                    }
                }
            })
            .map_err(|e| LiveError::Internal(format!("the backfill reader thread: {e}")))?;
        thread::Builder::new()
            .name("lanestream-backfill-rows".into())
            .spawn(move || {
                for copied in copied_in {
                    let read = copied.and_then(|Copied { next, snapshot, rows }| {
                        let envelopes = chunk_rows(&next.plan, &rows).map_err(|reason| {
                            LiveError::BackfillFailed { index: next.plan.index.as_str().to_owned(), reason }
                        })?;
                        Ok(ReadChunk { chunk: next.chunk, snapshot, rows: envelopes.len(), envelopes })
                    });
                    if done_out.send(read).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| LiveError::Internal(format!("the backfill conversion thread: {e}")))?;
        Ok(ChunkReader { jobs, done })
    }

    pub(super) fn gone() -> LiveError {
        LiveError::Internal("the backfill reader thread ended".into())
    }
}

/// A random id for this source's backfill marks (so that marks of another source on the same
/// database, or of an earlier run, are never taken for this one's).
pub(super) fn instance_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}
