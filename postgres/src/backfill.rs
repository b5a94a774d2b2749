//! Backfill from the tables, served while the live stream flows: Netflix DBLog's watermark
//! technique on the pgoutput stream of the [live source](crate::live).
//!
//! A sink asks for a snapshot of some indexes ([`Request::Backfill`]); the live source reads
//! the tables behind them in key order, one chunk at a time, and interleaves each chunk with the
//! change stream so that a snapshot row never overwrites a newer change in the sink.
//!
//! # Which table, which key
//! An index is the live reader's `schema_table` name ([`index_name`]) of a table of the
//! source's publication (`pg_publication_tables`); a name that two tables share after
//! normalisation is refused ([`LiveError::BackfillRefused`]). A name no published table has (any
//! more: its table dropped, renamed or removed from the publication since a sink came to owe it)
//! has nothing to backfill: it is left out of the request, whose `SnapshotComplete` still names
//! it, so the sink stops owing it (a renamed table's new name is backfilled as a table of its
//! own). A caller's explicit backfill of a name the source does not have is refused at start by
//! the [`Pipeline`](crate::pipeline::Pipeline). Rows are read
//! in the order of the table's **key index** — its replica identity index under `REPLICA
//! IDENTITY USING INDEX`, else its primary key — and their ids are built from the same columns
//! the live stream keys that table's changes by (in column order, the reader's one id encoding:
//! [`crate::batch`], *Ids*), so a snapshot row and a change of the same row carry one id.
//! **A table without a primary key** (and without an identity index), or under `REPLICA
//! IDENTITY NOTHING`, **is refused**, naming the table: its live ids are every column (or it
//! sends no updates and deletes), so neither keyset pagination nor reconciliation by id can be
//! right. Give it a primary key. Documents are the rows as the decoder writes a change's new row
//! (every column but generated ones, each text value typed by its column's type OID, by the
//! decoder's own typing: [`crate::pgoutput`], *Output*), read in text format on a connection of
//! the source's reader.
//!
//! **What the publication publishes, and nothing else** ([P4](crate::pipeline::state#the-rules)):
//! the tables of `pg_publication_tables`, and, from PostgreSQL 15, each table's **column list**
//! (`attnames`: a column the publication leaves out is never selected, so it never leaves the
//! database — the way to keep a PII column out of replication) and its **row filter**
//! (`rowfilter`: only the rows it admits are read, as pgoutput publishes only the changes it
//! admits; a row it does not admit, NULL included, is not sent). A key column left out of the
//! column list is refused ([`LiveError::BackfillRefused`]): PostgreSQL cannot publish that
//! table's updates and deletes either.
//!
//! # One chunk
//! In a reader thread of the live source, on a connection of its own (the synchronous
//! [`postgres`] client), per chunk, in one round trip (a simple query of three transactions):
//! 1. the **low mark**: `SELECT pg_logical_emit_message(true, 'lanestream.backfill',
//!    '<source>:<chunk>:low')`, in a transaction of its own, committed;
//! 2. in a `REPEATABLE READ READ ONLY` transaction: `pg_current_snapshot()` (the snapshot the
//!    chunk is read in), then `SELECT <columns> FROM <table> WHERE (<key>) > (<after>) ORDER BY
//!    <key> LIMIT <chunk rows>` (keyset pagination: the key index reads only the chunk);
//! 3. the **high mark**, as the low one.
//!
//! (One round trip is what makes the reads fast: `COPY (SELECT ...) TO STDOUT` was tried, and
//! its rows are cheaper to take apart, but it needs its own round trips — the client prepares
//! it, and the marks and the snapshot cannot share its query — and at a thousand rows a chunk
//! those cost more than they save.)
//!
//! A second thread turns each chunk's rows into snapshot envelopes while the first reads the
//! next chunk; the first is handed the next chunks of a table before it finished the one
//! before (it continues after that one's last key), up to [`CHUNKS_HELD`] chunks held at a time
//! (read and waiting for their high marks, or being read). So neither the server, nor the
//! conversion, nor the stream waits for the others, and the ingest thread that serves the
//! stream only moves finished chunks (their envelopes are published as the reader built them).
//!
//! The stream does not wait for the reads: it goes on while the reader reads. The rows then
//! wait, in the source, for the stream to reach the high mark; if the stream gets there first,
//! it goes on too, and the chunk is published when it is taken in: every change handed over
//! meanwhile committed after the chunk's snapshot, so it is not visible there and drops its key
//! from the chunk (below). Every change the stream hands over for the table removes its
//! key from the chunk when its **transaction is not visible in the chunk's snapshot** (its xid
//! in the snapshot's in-progress list or past its `xmax`) — the row read is then older than the
//! change — and, once the chunk is read, **every change between the low and the high mark**
//! (DBLog's rule, which needs no xids; the snapshot check is what makes it exact: a transaction
//! whose commit record precedes the low mark may still be finishing, not yet visible, when the
//! snapshot is taken). The source keeps, per table being backfilled, the keys of the
//! transactions handed over since the request was taken until a chunk's snapshot sees them, so
//! changes handed over while the chunk was being read count too. A `TRUNCATE` of the table
//! empties the chunk. At the high mark the rows left become one snapshot batch (position `None`, envelopes
//! [`Op::Upsert`] without a position, W2) for the requesting sink only, then the next chunk is
//! read. So a snapshot row is never older than a change the sink applied before it: a sink
//! applies snapshot rows as plain upserts. After the last chunk of the last index comes
//! `LaneItem::SnapshotComplete { indexes }` (the request's indexes), after which the driver acks
//! the request ([R2](lanestream::contract#r2)).
//!
//! **Why transactional marks.** A non-transactional message is decoded at its place in the WAL
//! but PostgreSQL 15 does not flush it (`pg_logical_emit_message` has no `flush` argument before
//! 17): the stream would see each mark only when the WAL writer flushes, up to
//! `wal_writer_delay` (200 ms) later — per mark, per chunk. A transactional message commits
//! (and, with `synchronous_commit`, flushes) at once, and comes in the stream at its commit,
//! in the same order as every other transaction. The cost: each mark is a transaction of its
//! own, which the stream hands over as an empty positioned batch (a genuine commit: acking it
//! moves the watermark, [I2](lanestream::contract#i2)).
//!
//! Marks carry the source's random instance id and the chunk's number: marks of another source
//! on the same database, or re-sent ones after a reconnect, are ignored.
//!
//! # Resuming
//! `after: Some(id)` resumes the **first** index after the row whose id is `id`: the id is
//! decoded back into its key values ([`decode_id`](crate::batch::decode_id)) (split at the `:` that are not escaped, `\:` and `\\`
//! unescaped; a `bytea` value gets its `\x` back), which is unambiguous because ids put every
//! string value escaped and no other value (numbers, booleans) holds a `:`. An id with another
//! number of values than the key has, or with a NULL (`\N`), is refused
//! ([`LiveError::BackfillRefused`]). A sink that records the id of the last snapshot row it
//! applied and asks again with it is never handed a row twice beyond those it was handed and did
//! not make durable; the source reads again at most the chunks it held ([`CHUNKS_HELD`]).
//!
//! # Progress
//! [`LiveSource::backfill_progress`](crate::live::LiveSource::backfill_progress): per table,
//! rows read so far and the estimate `pg_class.reltuples` (`-1` when the table was never
//! analysed); [`LiveMetrics`](crate::live::LiveMetrics) counts snapshot batches and rows.
//!
//! # How a driver serves it (the call sequence)
//! The live source is a pipeline [`Source`](crate::pipeline::Source); the
//! [`Pipeline`](crate::pipeline::Pipeline) drives it so:
//! ```text
//! loop {
//!     // a Request::Backfill taken from the request lane:
//!     source.backfill(request)?;            // Err(BackfillRefused): never servable
//!     match source.next(timeout)? {
//!         Some(SourceItem::Change(batch)) => publish to every lane,
//!         Some(SourceItem::Snapshot { sink, item }) => publish_to(sink, item);
//!             if item is SnapshotComplete: ack the request (R2),
//!         _ => {}
//!     }
//!     source.confirm(watermark)?;
//! }
//! ```
//! Several requests are served one after the other, in the order given.
//!
//! [`Request::Backfill`]: lanestream::Request::Backfill
//! [`index_name`]: crate::batch::index_name
//! [`LiveError::BackfillRefused`]: crate::live::LiveError::BackfillRefused
//! [`Op::Upsert`]: lanestream::Op::Upsert

use std::collections::VecDeque;
use std::sync::Arc;

use ahash::AHashMap as HashMap;
use lanestream::{Batch, Envelope, IndexName, LaneItem, Op, Position, SinkName};

use crate::mark::{Mark, MarkKind};

mod snapshot;
mod table;
pub(crate) use snapshot::XidSnapshot;
pub(crate) use table::{chunk_end, chunk_rows, query_chunk, ReadChunk, TablePlan};

/// How many chunks a backfill holds at a time, read and waiting for their high marks or being
/// read: while one waits, the reader reads the next ones, so that its reads follow one another
/// without waiting for the stream. A source serving a backfill holds at most this many times
/// [`LiveConfig::backfill_chunk_rows`](crate::live::LiveConfig::backfill_chunk_rows) rows.
pub const CHUNKS_HELD: usize = 3;

/// The default number of rows per chunk ([`LiveConfig::backfill_chunk_rows`](crate::live::LiveConfig::backfill_chunk_rows)).
///
/// Each chunk costs a fixed amount besides its rows: two mark transactions (written, then
/// decoded and handed over by the stream), a snapshot, a query planned and a round trip. At
/// 4,096 rows these are a small share of a chunk's time (`scripts/backfill-bench.sh`, 1M rows,
/// quiet machine: 1.59-1.90M rows/s, 0.58-0.69x of `COPY ... TO STDOUT`; 1,024-row chunks
/// 1.39M rows/s, 0.45x), while what
/// a backfill holds ([`CHUNKS_HELD`] chunks) and what a resumed one reads again stay a few MB at
/// most for rows of a few hundred bytes. Smaller chunks shorten each chunk's window, in which a
/// change drops its row from the chunk.
pub const DEFAULT_CHUNK_ROWS: usize = 4096;

// ----- reconciliation -----------------------------------------------------------------------------

/// A chunk waiting for its high mark (see the module docs, *One chunk*).
#[derive(Debug)]
pub(crate) struct PendingChunk {
    chunk: u64,
    index: IndexName,
    snapshot: XidSnapshot,
    /// The rows in key order, as the reader built them (published as they are when the stream
    /// changed none of them: no copy on the ingest thread).
    rows: Arc<[Envelope]>,
    /// Which rows were dropped, allocated at the first drop (most chunks see none).
    gone: Vec<bool>,
    /// Row by id, built when the stream first changes a row of the chunk's table (most chunks
    /// see none).
    by_id: Option<HashMap<String, usize>>,
    low_seen: bool,
    dropped: u64,
}

impl PendingChunk {
    pub(crate) fn new(
        chunk: u64,
        index: IndexName,
        snapshot: XidSnapshot,
        envelopes: impl Into<Arc<[Envelope]>>,
    ) -> Self {
        PendingChunk {
            chunk,
            index,
            snapshot,
            rows: envelopes.into(),
            gone: Vec::new(),
            by_id: None,
            low_seen: false,
            dropped: 0,
        }
    }

    fn drop_row(&mut self, i: usize) {
        if self.gone.is_empty() {
            self.gone = vec![false; self.rows.len()];
        }
        if !std::mem::replace(&mut self.gone[i], true) {
            self.dropped += 1;
        }
    }

    /// The stream handed over `envelopes` of the transaction `xid` (`None`: not known, taken
    /// as not visible): drops the keys they change from the chunk, after the low mark always,
    /// before it when the transaction is not visible in the chunk's snapshot.
    pub(crate) fn observe(&mut self, xid: Option<u32>, envelopes: &[Envelope]) {
        if !self.low_seen && xid.is_some_and(|x| self.snapshot.visible(x)) {
            return;
        }
        for e in envelopes {
            if e.index != self.index {
                continue;
            }
            if matches!(e.op, Op::Truncate | Op::Resync) {
                for i in 0..self.rows.len() {
                    self.drop_row(i);
                }
            } else {
                let rows = &self.rows;
                let by_id = self
                    .by_id
                    .get_or_insert_with(|| rows.iter().enumerate().map(|(i, r)| (r.id.clone(), i)).collect());
                if let Some(&i) = by_id.get(&e.id) {
                    self.drop_row(i);
                }
            }
        }
    }

    /// The stream reached the low mark.
    pub(crate) fn low(&mut self) {
        self.low_seen = true;
    }

    /// Rows dropped so far.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The rows left, as one snapshot batch (in key order).
    pub(crate) fn finish(self) -> Batch {
        if self.dropped == 0 {
            return Batch::new(None, self.rows);
        }
        let kept: Arc<[Envelope]> =
            self.rows.iter().zip(&self.gone).filter(|(_, &gone)| !gone).map(|(e, _)| e.clone()).collect();
        Batch::new(None, kept)
    }
}

/// One table's backfill progress ([`LiveSource::backfill_progress`](crate::live::LiveSource::backfill_progress)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackfillProgress {
    /// The sink that asked.
    pub sink: SinkName,
    /// The index.
    pub index: IndexName,
    /// Its table, `schema.table`.
    pub table: String,
    /// Rows read from the table so far (those dropped by the reconciliation included).
    pub rows_read: u64,
    /// The table's row estimate when the backfill was asked (`pg_class.reltuples`; `-1` when
    /// the table was never vacuumed or analysed).
    pub estimated_rows: i64,
    /// Every chunk of the table was published.
    pub done: bool,
}

/// One request being served.
#[derive(Debug)]
struct Job {
    sink: SinkName,
    indexes: Vec<IndexName>,
    plans: Vec<TablePlan>,
    /// The table being read (position in `plans`).
    current: usize,
    /// The key values the current table's first chunk starts after.
    cursor: Option<Vec<String>>,
    /// The current table's first chunk was handed to the reader (the next ones continue
    /// after the chunk before).
    started: bool,
    /// The current table's last chunk was read (it waits for its high mark).
    table_read: bool,
    /// The current table was resynced while being read ([`Backfiller::resync`]): its chunks
    /// still held are dropped, not published, and none is read after them.
    discard: bool,
    /// Where the job's tables are in [`Backfiller::progress`].
    progress_at: usize,
}

/// The transactions handed over since the last chunk was read, for the tables being
/// backfilled: (xid, their envelopes of those tables).
type Recent = Vec<(Option<u32>, Vec<Envelope>)>;

/// The backfill state of a live source: the requests queued, the chunk waiting for its high
/// mark, and what comes out.
#[derive(Debug)]
pub(crate) struct Backfiller {
    source_id: String,
    chunk_rows: usize,
    next_chunk: u64,
    jobs: VecDeque<Job>,
    /// The chunks read and waiting for their high marks, in chunk order, all of the first
    /// job's current table.
    pending: VecDeque<PendingChunk>,
    /// The chunks handed to the reader and not yet installed, in chunk order (with `pending`,
    /// at most [`CHUNKS_HELD`]).
    reading: VecDeque<u64>,
    /// The last chunk whose high mark came through the stream while it was being read (0:
    /// none): installing it publishes it at once.
    high_seen: u64,
    recent: Recent,
    /// The indexes resynced so far ([`resync`](Self::resync)): a request taken later is served
    /// each of them whole, whatever its `after`.
    resynced: ahash::AHashSet<IndexName>,
    progress: Vec<BackfillProgress>,
    /// Items ready for the sinks, in order.
    pub(crate) out: VecDeque<(SinkName, LaneItem)>,
    /// Snapshot batches and their rows published, rows dropped by the reconciliation.
    pub(crate) batches: u64,
    pub(crate) rows: u64,
    pub(crate) dropped: u64,
}

/// Where a chunk starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ReadFrom {
    /// The table's first chunk: after these key values (in the key's order), or at the start.
    First(Option<Vec<String>>),
    /// Right after the last row of the chunk the reader read before, of the same table (an
    /// empty chunk, without a query, when that one was the table's last).
    Continue,
}

/// What the source reads next: the table's plan, where it starts, the chunk's number.
pub(crate) struct NextRead {
    pub(crate) plan: TablePlan,
    pub(crate) from: ReadFrom,
    pub(crate) chunk: u64,
}

impl Backfiller {
    pub(crate) fn new(source_id: String, chunk_rows: usize) -> Self {
        Backfiller {
            source_id,
            chunk_rows: chunk_rows.max(1),
            next_chunk: 1,
            jobs: VecDeque::new(),
            pending: VecDeque::new(),
            reading: VecDeque::new(),
            high_seen: 0,
            recent: Vec::new(),
            resynced: Default::default(),
            progress: Vec::new(),
            out: VecDeque::new(),
            batches: 0,
            rows: 0,
            dropped: 0,
        }
    }

    pub(crate) fn source_id(&self) -> &str {
        &self.source_id
    }

    pub(crate) fn chunk_rows(&self) -> usize {
        self.chunk_rows
    }

    pub(crate) fn progress(&self) -> &[BackfillProgress] {
        &self.progress
    }

    /// Queues a request whose tables were resolved; `cursor`: where its first table starts.
    pub(crate) fn push(
        &mut self,
        sink: SinkName,
        indexes: Vec<IndexName>,
        plans: Vec<TablePlan>,
        cursor: Option<Vec<String>>,
    ) {
        if plans.is_empty() {
            self.out.push_back((sink, LaneItem::SnapshotComplete { indexes }));
            return;
        }
        // A request asked before its first index was resynced resumes rows the sink emptied
        // since: served whole (a request asked after it reads again at most what it had).
        let cursor = cursor.filter(|_| !self.resynced.contains(&plans[0].index));
        let progress_at = self.progress.len();
        self.progress.extend(plans.iter().map(|p| BackfillProgress {
            sink: sink.clone(),
            index: p.index.clone(),
            table: p.table.clone(),
            rows_read: 0,
            estimated_rows: p.estimated_rows,
            done: false,
        }));
        self.jobs.push_back(Job {
            sink,
            indexes,
            plans,
            current: 0,
            cursor,
            started: false,
            table_read: false,
            discard: false,
            progress_at,
        });
    }

    /// The next chunk to read, while fewer than [`CHUNKS_HELD`] are being read or wait for their
    /// high marks: the reader is handed the chunks after the first of a table before it read
    /// the one before ([`ReadFrom::Continue`]), so that it reads one after the other without
    /// waiting for this side.
    pub(crate) fn next_read(&mut self) -> Option<NextRead> {
        if self.pending.len() + self.reading.len() >= CHUNKS_HELD {
            return None;
        }
        let job = self.jobs.front_mut()?;
        if job.table_read {
            return None;
        }
        let from = if job.started { ReadFrom::Continue } else { ReadFrom::First(job.cursor.clone()) };
        job.started = true;
        let chunk = self.next_chunk;
        self.next_chunk += 1;
        self.reading.push_back(chunk);
        Some(NextRead { plan: job.plans[job.current].clone(), from, chunk })
    }

    /// A chunk was read (they come in the order they were handed out): it waits for its high
    /// mark (the transactions handed over since the last one and not visible in its snapshot
    /// already dropped from it), or is published at once when the stream passed its high mark
    /// already.
    pub(crate) fn install(&mut self, read: ReadChunk) {
        self.reading.retain(|&c| c != read.chunk);
        let chunk_rows = self.chunk_rows;
        let Some(job) = self.jobs.front_mut() else { return };
        let index = job.plans[job.current].index.clone();
        let progress = &mut self.progress[job.progress_at + job.current];
        progress.rows_read += read.rows as u64;
        if read.rows < chunk_rows {
            job.table_read = true;
        }
        let Some(snapshot) = read.snapshot.filter(|_| read.rows > 0) else {
            // The table ended at a chunk before: done once the chunks read are published.
            self.finish_table_if_done();
            return;
        };
        let mut pending = PendingChunk::new(read.chunk, index, snapshot, read.envelopes);
        for (xid, envelopes) in &self.recent {
            pending.observe(*xid, envelopes);
        }
        let snapshot = &pending.snapshot;
        self.recent.retain(|(xid, _)| xid.is_none_or(|x| !snapshot.visible(x)));
        let chunk = pending.chunk;
        self.pending.push_back(pending);
        if self.high_seen >= chunk {
            // The stream passed the high mark: publish here.
            self.on_mark(&Mark {
                source: self.source_id.clone(),
                chunk,
                kind: MarkKind::High,
                lsn: Position::RESERVED,
            });
        }
    }

    /// The stream reached the high mark of a chunk still being read:
    /// [`install`](Self::install) publishes it at once (the changes handed over meanwhile are
    /// not visible in its snapshot, so they drop their keys from it: publishing it after its
    /// high mark is as exact as at it).
    #[cfg(test)]
    pub(crate) fn high_before_read(&self) -> bool {
        self.reading.front().is_some_and(|&c| self.high_seen >= c)
    }

    /// The stream handed over `batch`, of the transaction `xid`.
    /// The plan of `index` while its table is still to be backfilled (a table of a queued
    /// request, or the current one or a later one of the request being served): a partial
    /// update of it may reach the sink before its row does, so the live source fills it in
    /// first (P5).
    pub(crate) fn plan_of(&self, index: &IndexName) -> Option<&TablePlan> {
        self.jobs.iter().enumerate().find_map(|(at, job)| {
            let from = if at == 0 { job.current } else { 0 };
            job.plans.get(from..)?.iter().find(|p| p.index == *index)
        })
    }

    pub(crate) fn observe(&mut self, xid: Option<u32>, batch: &Batch) {
        if self.jobs.is_empty() {
            return;
        }
        let jobs = &self.jobs;
        let wanted = |e: &&Envelope| jobs.iter().any(|j| j.indexes.contains(&e.index));
        let mine: Vec<Envelope> = batch.envelopes.iter().filter(wanted).cloned().collect();
        if mine.is_empty() {
            return;
        }
        for p in &mut self.pending {
            p.observe(xid, &mine);
        }
        self.recent.push((xid, mine));
    }

    /// The stream reached a mark: the waiting chunk's low mark opens its window, its high mark
    /// publishes it.
    pub(crate) fn on_mark(&mut self, mark: &Mark) {
        if mark.source != self.source_id {
            return;
        }
        let Some(at) = self.pending.iter().position(|p| p.chunk == mark.chunk) else {
            if self.reading.contains(&mark.chunk) && mark.kind == MarkKind::High {
                self.high_seen = self.high_seen.max(mark.chunk);
            }
            return;
        };
        match mark.kind {
            MarkKind::Low => self.pending[at].low(),
            MarkKind::High => {
                // Marks come in chunk order: `at` is 0 (a chunk before it would have passed
                // its own high mark first).
                let Some(pending) = self.pending.remove(at) else { return };
                let Some(job) = self.jobs.front() else { return };
                if job.discard {
                    self.dropped += pending.rows.len() as u64;
                    self.finish_table_if_done();
                    return;
                }
                self.dropped += pending.dropped();
                let batch = pending.finish();
                if !batch.envelopes.is_empty() {
                    self.batches += 1;
                    self.rows += batch.envelopes.len() as u64;
                    self.out.push_back((job.sink.clone(), LaneItem::Batch(batch)));
                }
                self.finish_table_if_done();
            }
        }
    }

    /// The stream handed over a resync of `index` ([`Op::Resync`]: its table rejoined the
    /// publication, see [`crate::live`], *A table that rejoins*): every sink emptied it there and
    /// owes a backfill of it alone ([`SinkState::resync`]). So no request served here may
    /// complete `index` unless it serves it whole from now on: a request that served rows of
    /// it before (or was resolved while it was gone) leaves it out of its `SnapshotComplete`
    /// (the rows of its chunks still held are dropped, and the request goes on with its next
    /// table); one that did not start it yet reads it from its first row; and a request
    /// taken later reads it whole too ([`push`](Self::push)).
    ///
    /// [`SinkState::resync`]: lanestream::pipeline::SinkState::resync
    ///
    /// The requests of the sinks in `except` are left as they are: those sinks applied this
    /// resync before (a check's message of an earlier source, sent again), so they skip it.
    pub(crate) fn resync(&mut self, index: &IndexName, except: &[SinkName]) {
        self.resynced.insert(index.clone());
        for (at, job) in self.jobs.iter_mut().enumerate() {
            if except.contains(&job.sink) {
                continue;
            }
            let current = if at == 0 { job.current } else { 0 };
            let planned = job.plans.iter().position(|p| p.index == *index);
            let whole = match planned {
                Some(p) if p > current => true,
                Some(p) if p == current && !job.started => {
                    job.cursor = None;
                    true
                }
                Some(p) if p == current => {
                    // Being read: what is held of it is dropped, and nothing more is read.
                    job.discard = true;
                    job.table_read = true;
                    false
                }
                _ => false,
            };
            if !whole {
                job.indexes.retain(|i| i != index);
            }
        }
        self.finish_table_if_done();
    }

    /// The request being served failed (a chunk could not be read): it is given up, with the
    /// chunks held for it; the next request starts afresh.
    pub(crate) fn abandon(&mut self) {
        self.pending.clear();
        self.reading.clear();
        self.jobs.pop_front();
        if self.jobs.is_empty() {
            self.recent.clear();
        }
    }

    /// When the current table was read to its end and every chunk read of it was published:
    /// on to the job's next table, or its `SnapshotComplete`.
    fn finish_table_if_done(&mut self) {
        let Some(job) = self.jobs.front_mut() else { return };
        if !job.table_read || !self.pending.is_empty() || !self.reading.is_empty() {
            return;
        }
        self.progress[job.progress_at + job.current].done = true;
        job.current += 1;
        job.cursor = None;
        job.started = false;
        job.table_read = false;
        job.discard = false;
        if job.current == job.plans.len() {
            if let Some(job) = self.jobs.pop_front() {
                self.out.push_back((job.sink, LaneItem::SnapshotComplete { indexes: job.indexes }));
            }
            if self.jobs.is_empty() {
                self.recent.clear();
            }
        }
    }
}

#[cfg(test)]
mod tests;
