//! The ordered event log: an in-process, immutable, globally ordered log of events with Dynamic
//! Consistency Boundary (DCB) append conditions, durable on disk or in memory, lock-free for
//! readers.
//!
//! The log is the other half of a change pipeline: the lanes carry change streams, and the log is
//! where such streams can come from. Its vocabulary is the DCB specification's:
//!
//! | Term | Here |
//! |---|---|
//! | Event | [`Event`]: a type, a set of tags, an opaque payload (`bytes::Bytes`). |
//! | Sequenced event | [`SequencedEvent`]: an event and its [`LogPosition`]. |
//! | Position | [`LogPosition`]: 1, 2, 3, ... dense, assigned by the single writer. |
//! | Query / query item | [`Query`] (`All`, or OR'd [`QueryItem`]s: one of the types **and** all the tags). |
//! | Append condition | [`AppendCondition`] `{ fail_if_events_match, after }`. |
//! | Position range | [`PositionRange`]: where one append went, `first..=last`. |
//!
//! # Guarantees
//! - **Dense, atomic, read-your-writes.** Positions start at 1 and have no gaps; a refused append
//!   ([`AppendError`]: `Empty`, `Conflict`, `AfterBeyondHead`, `TooLarge`, `Failed`, `Shutdown`)
//!   consumes none. No reader ever sees part of an append. When `append` returns `Ok(range)` the
//!   snapshot holding `range` is already published, so every thread can read it at once.
//! - **Exact conditions.** An append with a condition fails iff some event at a position above
//!   `after` (anywhere, for `None`) matches the condition's query — counting events accepted
//!   earlier in the same group commit — and `Conflict { at }` names the lowest such position.
//!   Of N appends racing with one guard exactly one succeeds; every other one's `at` is the
//!   winner's position. An `after` above the head is refused (`AfterBeyondHead`).
//! - **One match rule.** A query selects the same events in [`ReadHandle::read`],
//!   [`ReadHandle::subscribe`] and [`AppendCondition`]; matching never looks at the payload. A
//!   query with no items cannot be built ([`QueryError::NoItems`]); use [`Query::All`].
//! - **Subscriptions** deliver every matching event after their start exactly once, ascending,
//!   across catch-up and the live tail; they end (`Ok(None)`) after a close, having delivered
//!   everything published before it, and with an error after a writer failure. Close and failure
//!   wake every waiting subscriber, blocking or async.
//! - **Backpressure.** The writer's request queue is bounded
//!   ([`LogOptions::queue_capacity`]); a full queue blocks `append` (a brief spin, then the
//!   thread parks: the lanes' wait list, `lanestream::wait`) and parks `append_async`'s task. Appends queued before [`close`](WriteHandle::close) are served; later
//!   ones get `Shutdown`.
//! - **Durability** (file mode). A reply means the append's bytes were fsynced. A failed write
//!   or fsync fails every append of that group commit with `Io` and stops the log taking writes
//!   (`Failed`); it is never retried.
//!
//! # Engine
//! One writer thread behind the bounded queue commits in groups (up to
//! [`max_drain_requests`](LogOptions::max_drain_requests) /
//! [`max_drain_bytes`](LogOptions::max_drain_bytes) per round, one fsync per round) and then
//! publishes an immutable snapshot with `arc-swap`. Readers load the snapshot and read on their
//! own thread, never taking a lock or touching the writer. A type/tag index (a posting list of
//! positions per type and per tag, persistent maps from names to lists) makes a selective read
//! or a condition check cost O(log n + candidates of the most selective list) rather than O(n).
//! An in-memory log holds every event, payloads included (shared, never copied). A durable log
//! holds only the index in memory and reads payloads back from its segment files (see
//! [Memory](#memory)), so it can be far larger than RAM.
//!
//! A blocking [`append`](WriteHandle::append) that finds the writer idle (nothing queued, no
//! group being committed) commits on its own thread instead, under the writer's lock and with
//! the same steps: a lone appender pays no thread hand-off (two futex wake-ups, which cost more
//! than a commit to a fast disk). Appends that overlap queue as above; async appends always do.
//!
//! # Feeding the lanes
//! [`LogSource`] is the log as a [`Source`](lanestream::pipeline::Source) of the one pipeline
//! driver ([`lanestream::pipeline::Pipeline`]), over any stream backend (in-process
//! [`MemoryStream`](lanestream::MemoryStream), or a Redis stream for sinks in other processes):
//! each append becomes one [`Batch`](lanestream::Batch) on every lane, positioned at the append's
//! last position (so the watermark is always the end of an append; [`ReadHandle::append_at`]
//! finds the append holding any position); it resumes after the stream's watermark (the driver
//! skips what the lanes hold already) and serves
//! [`Request::Backfill`](lanestream::Request::Backfill) from the index (the driver consumes the
//! request lane and acks each request after its `SnapshotComplete`).
//!
//! # On disk
//! Segment files of length-prefixed, CRC32C-checked records, one record per append, each event
//! in it with a CRC32C of its own (over its position and its bytes), each file starting with a
//! header that carries the format's version (2). Version 1 (no per-event checksum) still opens:
//! its last segment is sealed and appends go on in a new segment of version 2, nothing written
//! is rewritten. A file of a version this build does not read fails the open with
//! [`OpenError::UnsupportedVersion`]. When the writer seals a segment (starts
//! the next one) it writes the segment's **index file** beside it (`<first position>.idx`: per
//! event its type, tags and payload location, with its own CRC32C), so an open reads a sealed
//! segment's index instead of every record in it. An index file is never trusted over its
//! segment: a missing, torn, corrupt, foreign or stale one is rebuilt from the segment (every
//! record checked) and written again; what an open does not read — a payload byte damaged since
//! — is checked by every read instead (each event read is checked against its own CRC32C — in
//! a segment of version 1, its whole record against the record's — [`ReadError::Corrupt`]
//! naming the file and the offset, never a wrong event). A cold read of one event therefore
//! reads that event's bytes (one `pread` of a few hundred bytes for a 256-byte payload), not the
//! append it came in.
//!
//! Recovery scans the last segment (and any sealed one without a trusted index): it validates
//! every record, truncates a torn tail (never acknowledged), never exposes a phantom and resumes
//! at the recovered head + 1, with the index — and so every condition's view — rebuilt from the
//! records. A damaged record that is not a torn tail (one followed by a whole, CRC-valid record,
//! which a crash never leaves) fails the open with [`OpenError::Corrupt`] and truncates nothing.
//! An open that fails changes nothing on disk: recovery only reads, and its repairs (the torn
//! tail truncated, index files rebuilt or removed) are made once nothing is left to refuse (see
//! [`OpenError`]). A directory holding anything but the log's files fails with
//! [`OpenError::StrayFile`]. One
//! writer per directory: an open log holds an exclusive lock on the directory's `LOCK` file, and
//! an open from another process fails with [`OpenError::Locked`]. The formats are described in
//! the source of `disk/format.rs`, `disk/segindex.rs` and `disk/marker.rs` (see
//! [Layout](#layout)).
//!
//! # Across processes
//! One writer per directory, in any process: [`EventLog::open`] takes an exclusive advisory lock
//! (`flock`, through `fs4`) on the directory's `LOCK` file, released when the process ends,
//! SIGKILL included, and a second writer gets [`OpenError::Locked`] (or
//! [`OpenError::AlreadyOpen`] in the same process). Any number of **read-only followers**, in
//! any process, open the directory with [`EventLog::open_read_only`]: they read and subscribe,
//! and see each append once the writer has fsynced it, never before — the writer publishes a
//! commit marker (`COMMIT`: the durable length of its segment; a copy into a shared memory map,
//! no system call) after each group commit's fsync,
//! and a follower polls it every [`LogOptions::follow_interval`] (1 ms by default: the wake-up
//! latency is at most that, plus the read of the new records: measured from an append's return
//! to a follower's delivery, median 0.57 ms, p99 4.2 ms on a loaded 2-core machine). Followers
//! go on across the writer's crashes and restarts with no gap and no repeat.
//!
//! # Memory
//! A durable log keeps in memory, per event: its slot (24 bytes), its record in a block (its
//! type and tag name ids: 8 bytes, plus 4 per tag), where it is on disk (20 bytes), its
//! position in its type's and each tag's posting list (8 bytes each) and, per append, where the
//! append ends (8 bytes); lists and slots grow in chunks of doubling size. Per distinct type or
//! tag it keeps the name once (one allocation shared by the maps that know it), an entry in the
//! readers' name map and in the writer's, and a posting list of at least 4 positions — so the
//! figure per event depends on how many events share a tag. Measured (`tests/footprint.rs`,
//! the heap the open holds; one of four types and one tag per event, 256-byte payloads, the
//! same whatever the payload size):
//!
//! | shape | bytes per event |
//! |---|---|
//! | 2,000,000 events, one per append, 10,000 tags (200 events per tag) | **86** (115 at 200,000 events, where the chunks that double are emptier) |
//! | 2,000,000 events in appends of 512, 200,000 tags (10 events per tag) | **105** |
//! | 8,000,000 events in appends of 512, 800,000 tags (10 per tag: the peer bench's cold row) | **106** |
//!
//! Plus the record cache, at most [`LogOptions::cache_bytes`] (each cached frame counted with
//! 192 bytes of bookkeeping beside its bytes). An open holds more while it runs: one sealed
//! segment's index decoded at a time and the staging of 65,536 events (at the 2,000,000-event,
//! 200,000-tag shape: a heap peak of 263 MiB for 200 MiB held). Payloads are read with
//! positioned reads (`pread`), one event per read (its whole record in a segment of version 1),
//! not through a memory map: see the source of `disk/file.rs` for why.
//!
//! ```
//! use lanestream_log::{Event, EventLog, LogOptions, Query, QueryItem};
//!
//! let log = EventLog::in_memory(LogOptions::default())?;
//! let e = |ty: &str, tags: &[&str]| Event::new(ty, tags.iter().copied(), bytes::Bytes::new());
//! log.append(vec![e("CourseDefined", &["course:1"])?, e("CourseDefined", &["course:2"])?], None)?;
//! log.append(vec![e("StudentSubscribed", &["course:1", "student:9"])?], None)?;
//!
//! let q = Query::items([QueryItem::new(["StudentSubscribed"], ["course:1"])])?;
//! let reads = log.read(&q, None, 100)?;
//! assert_eq!(reads.events().iter().map(|s| s.position.get()).collect::<Vec<_>>(), [3]);
//! assert_eq!(reads.head().map(|p| p.get()), Some(3));
//! assert!(!reads.is_cut_short());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Layout
//! One row per file, from the top floor down. A file imports only from the rows below it (the
//! files of its own layer listed after it, and the layers below), never upward: the crate has
//! no import circle. The files (`disk/`) stand below the vocabulary because an event stored on
//! disk reads its payload back through `disk/file.rs`; recovery and the segment writer stand
//! above it because they store and encode events.
//!
//! | layer | file | what it holds |
//! |---|---|---|
//! | ends | `handle.rs` | [`EventLog`] (opening a log: durable, a read-only follower, in memory), [`WriteHandle`] (appending: inline when the writer is idle, queued otherwise) and [`AppendFuture`] |
//! | ends | `source.rs` | [`LogSource`]: the log as a source of the pipeline driver (`lanestream::pipeline`), one batch per append, backfills served from the index |
//! | ends | `read.rs` | [`ReadHandle`] and [`Reads`]: reads on the caller's thread over the published snapshot |
//! | ends | `subscription.rs` | [`Subscription`] and [`NextBatch`]: every matching event after a position, across catch-up and the live tail |
//! | engine | `writer.rs` | the single writer: each group commit decided, written, fsynced, published and answered, on its thread or inline |
//! | engine | `follow.rs` | read-only followers: a thread that polls the commit marker and indexes and publishes what the writer made durable |
//! | engine | `queue.rs` | the writer's bounded request queue and the reply slot each append waits on |
//! | engine | `snapshot.rs` | what readers see: the published snapshot and the state every handle shares, the views that answer queries, and the index the writer (or recovery, or a follower) builds |
//! | engine | `slots.rs` | the events by position: write-once slots the readers share with the writer |
//! | durability | `recovery.rs` | opening a directory: each segment scanned or taken from its index file, a torn tail told from damage, the repairs decided, then made |
//! | durability | `segment_writer.rs` | the writer's side of the segments: records encoded, a group commit appended with one fsync, the commit marker moved, a full segment sealed |
//! | vocabulary | `condition.rs` | [`AppendCondition`]: the guard an append may carry |
//! | vocabulary | `query.rs` | [`Query`], [`QueryItem`]: the one match rule of reads, subscriptions and conditions |
//! | vocabulary | `event.rs` | [`Event`] and [`SequencedEvent`]; how the log keeps events (a block per group commit or segment, payloads in memory or read back from a segment) and a segment's index built from its blocks |
//! | vocabulary | `options.rs` | [`LogOptions`]: the sizes of the queue, the group commit, the segments, the batches and the cache |
//! | files | `disk/record.rs` | a segment's records read back and checked, and the test that tells a torn tail from damage |
//! | files | `disk/segindex.rs` | a sealed segment's index file: its layout, its write, and the read that trusts it only where it matches its segment |
//! | files | `disk/file.rs` | one segment open for positioned reads (an event's frame read and checked) and the log's frame cache |
//! | files | `disk/storage.rs` | the directory: file names, the writer's claim (`LOCK`), the listing that refuses stray files, and the file operations the segment writer writes with |
//! | files | `disk/marker.rs` | the commit marker (`COMMIT`): what the writer has made durable, for followers |
//! | files | `disk/format.rs` | a segment's layout (header, records, events, checksums, versions) and its header built, checked and read |
//! | ground | `error.rs` | the error enums: one per operation, one variant per cause |
//! | ground | `names.rs` | the limits on names ([`MAX_NAME_LEN`], [`MAX_TAGS`]) and the table that interns them |
//! | ground | `position.rs` | [`LogPosition`] and [`PositionRange`] |
//! | ground | `index.rs` | the type/tag index's parts: append-only posting lists, persistent maps from names to lists |
//! | ground | `signal.rs` | what subscribers wait on and the writer wakes: the core's wait list |
//! | ground | `sync.rs` | the shim: `std`, or loom under `--cfg lanestream_loom` |
//! | — | `disk/mod.rs`, `tests.rs`, `docs/` | the `disk` folder's own map; unit tests with a storage that fails or stalls on command; the memory-ordering chapter ([`docs::memory_ordering`]) |

#![deny(missing_debug_implementations)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod condition;
mod disk;
mod error;
mod event;
mod follow;
mod handle;
mod index;
mod names;
mod options;
mod position;
mod query;
mod queue;
mod read;
mod recovery;
mod segment_writer;
mod signal;
mod slots;
mod snapshot;
mod source;
mod subscription;
mod sync;
mod writer;

pub mod docs {
    //! Documentation-only modules: how the log is built and why it is correct.
    //!
    //! - [`memory_ordering`]: the log's waits (subscribers, close, writer failure, inline
    //!   commits), which Release pairs with which Acquire, and what the loom models report when a
    //!   protection is removed.

    pub mod memory_ordering {
        #![doc = include_str!("docs/memory_ordering.md")]
    }
}

// Not under Miri: these tests drive the writer thread against real directories (Miri's
// isolation refuses `mkdir`, and interpreted they would take hours); the log's one `unsafe`
// block is the commit marker's memory map (`disk/marker.rs`, a file Miri cannot map either), and
// its waits are checked by the loom models instead.
#[cfg(all(test, not(miri)))]
mod tests;

pub use condition::AppendCondition;
pub use error::{
    AppendError, EventError, NextTimeoutError, OpenError, QueryError, ReadError, SubscriptionError,
    TryNextError,
};
pub use event::{Event, SequencedEvent};
pub use handle::{AppendFuture, EventLog, WriteHandle};
pub use names::{MAX_NAME_LEN, MAX_TAGS};
pub use options::LogOptions;
pub use position::{LogPosition, PositionRange};
pub use query::{Query, QueryItem, QueryItems};
pub use read::{ReadHandle, Reads};
pub use source::{DEFAULT_SNAPSHOT_BATCH, LogSource, LogSourceBuilder, SourceError, SourceStats};
pub use subscription::{NextBatch, Subscription};
