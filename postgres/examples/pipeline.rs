//! The main job: PostgreSQL changes (wal2json format-version 2) through lanestream into sinks.
//!
//! One ingest thread reads wal2json lines (`--input`, plain or gzip, `-` for stdin; by default
//! the bundled capture `data/wal2json-sample.jsonl.gz`), builds each transaction into one
//! [`Batch`] and publishes it to every sink's lane. Each sink thread appends the envelopes as
//! NDJSON to `--out DIR/<sink>.ndjson` (or discards them with `--discard`), flushes, then acks.
//! `--slow-sink` makes one sink sleep per batch; `--chaos` makes the sinks nack, drop handles,
//! hold several deliveries and ack them out of order, re-attach their consumer, and ask the ingest
//! thread once for a backfill (answered on their lane with snapshot batches and
//! `SnapshotComplete`). The main thread draws a progress bar (changes/s, watermark, per-lane lag).
//!
//! At the end it checks that every sink received every change at least once — tracked in memory
//! per sink as how many envelopes of each batch position arrived, so it also holds with
//! `--discard` — and that the final watermark is the last commit LSN. It prints a summary whose
//! last line is `PASS: <reason>` or `FAIL: <reason>` (and writes the same summary as JSON with
//! `--summary-json`: both come from one [`Summary`]), and exits non-zero on FAIL: a check failed,
//! or the input (or a sink) had an error.
//!
//! **Live mode** (`--source postgres://... --slot NAME [--create-slot]`, `--create-slot` for the
//! first run of a new pipeline only: a slot created after the sinks' checkpoints is refused as a
//! gap, see [`LiveSource::check_resume`]): the ingest reads the
//! logical replication slot (pgoutput, `--publication`) through [`lanestream_postgres::live`]
//! (streaming replication) instead of a file, and confirms it up to the stream's watermark, never
//! more, after each batch, while a full lane keeps it waiting, while idle and at shutdown
//! (SIGTERM/SIGINT, or `--end-lsn`). `--create-slot` also creates the publication, `FOR ALL
//! TABLES`, when it is missing. Its sinks are durable
//! ([`lanestream_postgres::ndjson::DurableNdjson`]): before acking they fsync `<sink>.ndjson` and
//! atomically replace `<sink>.checkpoint` (last applied commit LSN, output length, and the
//! progress inside a transaction still in chunks); at start they cut the output back to the
//! checkpoint and skip what it covers, so however the process dies the outputs hold every
//! committed change exactly once (`scripts/e2e-postgres.sh` SIGKILLs it). With
//! `--kill-sink-after` the file input's sinks are durable too, and the summary reads every output
//! back against what was published.
//!
//! **Over Redis** (`--backend redis://... --role ingest|sink|delete`): the ingest and each sink
//! run as separate processes on a [`lanestream::RedisStream`]; see `pipeline/redis.rs` and
//! `scripts/e2e-redis.sh`, which SIGKILLs a sink mid-run.
//!
//! Without `--out` or `--discard` the sinks write `target/pipeline-out/<sink>.ndjson` under the
//! workspace root (the parent of this crate's `postgres/` directory, where the workspace's
//! `Cargo.toml` is), whatever the working directory or `CARGO_TARGET_DIR`.
//!
//! ```text
//! cargo run --release -p lanestream-postgres --example pipeline -- --discard --summary-json target/summary.json
//! cargo run --release -p lanestream-postgres --example pipeline -- --chaos --slow-sink
//! pg_recvlogical ... -f - | cargo run --release -p lanestream-postgres --example pipeline -- --input -
//! cargo run --release -p lanestream-postgres --example pipeline -- --source postgres://u:p@host/db --slot s --create-slot --out DIR
//! ```

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use lanestream::{
    AckError, AckHandle, Batch, Envelope, Fanout, IndexName, Lane, LaneItem, MemoryStream, Op, Position,
    PublishError, PublishTimeoutError, Request, SinkName, Stream, TryRecvError,
};
use lanestream_postgres::live::{LiveConfig, LiveError, LiveSource};
use lanestream_postgres::ndjson::{write_line, Checkpoint, DurableNdjson};
use lanestream_postgres::pgoutput::PgOutputDecoder;
use lanestream_postgres::wal2json::{TransactionBuilder, Wal2JsonError, Wal2JsonReader};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The workspace root, one level above this crate (the workspace's `postgres/` member): the
/// bundled capture and the default output directory are there.
fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

fn default_input() -> PathBuf {
    workspace_root().join("data").join("wal2json-sample.jsonl.gz")
}

fn default_out() -> PathBuf {
    workspace_root().join("target").join("pipeline-out")
}

/// `--help`'s description (`-h` shows only the first line, from the doc comment of [`Args`]).
const LONG_ABOUT: &str = concat!(
    "wal2json (format-version 2) → lanestream → NDJSON sinks, with an at-least-once check.\n",
    "\n",
    "The lanestream-postgres crate's pipeline example. One ingest thread reads PostgreSQL changes in ",
    "wal2json format-version 2 (--input; by default the bundled capture data/wal2json-sample.jsonl.gz ",
    "at the workspace root), publishes each transaction as one batch to every sink's lane, and each ",
    "sink thread appends the batch's envelopes as NDJSON to <--out>/<sink>.ndjson, flushes, then acks.\n",
    "\n",
    "Output: by default the sinks write <sink>.ndjson (search.ndjson, cache.ndjson, archive.ndjson) ",
    "in the workspace's own target/pipeline-out directory (--out's default below), whatever the ",
    "working directory or CARGO_TARGET_DIR; the files are truncated at start. --out DIR writes them to DIR instead, --discard writes nothing.\n",
    "\n",
    "At the end it checks that every sink received every change at least once and that the final ",
    "watermark is the last commit LSN, prints a summary to stdout (and writes the same summary as ",
    "JSON with --summary-json) whose last line is `PASS: <reason>` or `FAIL: <reason>`, and exits ",
    "0 on PASS, non-zero on FAIL (a check failed, or the input or a sink had an error).\n",
    "\n",
    "Live mode: --source postgres://... streams the logical replication slot --slot (pgoutput plugin, ",
    "publication --publication) instead of --input and confirms it only up to the watermark. --create-slot ",
    "creates the slot (and the publication, FOR ALL TABLES, if it is missing) for a ",
    "new pipeline (empty --out); a slot created after the sinks' checkpoints (one that was dropped) is ",
    "refused, since what was committed in between is in no slot: such sinks need a backfill. Its ",
    "sinks are durable: they fsync the output and a checkpoint before acking and, after a restart, ",
    "skip what they already applied, so a crash anywhere loses nothing and applies nothing twice.\n",
    "\n",
    "Over Redis: --backend redis://... --role ingest|sink|delete runs one part of the pipeline per ",
    "process on the Redis stream --stream-name: the ingest publishes the input and, once the ",
    "watermark reaches the last commit LSN, checks each sink's output; each sink (--lane NAME) ",
    "applies its lane durably to <--out>/NAME.ndjson and survives being killed and restarted.",
);

/// wal2json (format-version 2) → lanestream → NDJSON sinks, with an at-least-once check.
#[derive(Parser, Debug, Clone)]
#[command(version, long_about = LONG_ABOUT)]
struct Args {
    /// wal2json v2 input: a file (gzip is detected), or `-` for stdin.
    #[arg(long, default_value_os_t = default_input(), conflicts_with = "source")]
    input: PathBuf,
    /// Live mode: stream the logical replication slot --slot (pgoutput plugin) of this server
    /// (`postgres://user:password@host:port/db`, or a libpq key=value string) instead of --input,
    /// and confirm it up to the watermark; runs until SIGTERM/SIGINT or --end-lsn. The sinks
    /// (with --out) are durable: fsync and checkpoint before acking, resume after a restart.
    #[arg(long, value_name = "URL")]
    source: Option<String>,
    /// The logical replication slot of --source.
    #[arg(long, default_value = "lanestream")]
    slot: String,
    /// Create --slot (with the pgoutput plugin) if it does not exist, and before it
    /// --publication (FOR ALL TABLES) if that does not exist: for a new pipeline, whose
    /// sinks (--out) have no checkpoints. A slot created after the sinks' checkpoints (one that
    /// was dropped) is refused and dropped again: what was committed in between is in no slot,
    /// and the sinks need a backfill.
    #[arg(long, requires = "source")]
    create_slot: bool,
    /// Live mode: stop once every transaction committed before this LSN (e.g. 0/1D84F00) is
    /// published and acked.
    #[arg(long, value_name = "LSN", requires = "source")]
    end_lsn: Option<String>,
    /// Live mode: the publication naming the tables to stream.
    #[arg(long, default_value = "lanestream", requires = "source")]
    publication: String,
    /// Live mode: how long one wait for the stream lasts before the ingest confirms again and
    /// checks for a stop.
    #[arg(long, default_value_t = 100)]
    poll_interval_ms: u64,
    /// Live mode: how often standby status updates carry the confirmed position to the server
    /// (at most this long after the watermark moves, and at least this often).
    #[arg(long, default_value_t = 1000, requires = "source")]
    status_interval_ms: u64,
    /// Live mode: write a heartbeat (`pg_logical_emit_message`) this often, so that the slot
    /// follows the server's WAL even while nothing of this database changes.
    #[arg(long, value_name = "SECS", requires = "source")]
    heartbeat_secs: Option<u64>,
    /// Live mode: how long to wait for a slot that another client holds before giving up.
    #[arg(long, default_value_t = 30)]
    slot_wait_secs: u64,
    /// Number of sinks (lanes).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=256))]
    sinks: u16,
    /// Directory for the sinks' `<sink>.ndjson` files (truncated at start).
    #[arg(long, default_value_os_t = default_out())]
    out: PathBuf,
    /// Do not write anything: sinks only record what they received, then ack.
    #[arg(long)]
    discard: bool,
    /// Read (and decompress) the whole input file into memory before the clock starts, so that
    /// `changes_per_second` measures the pipeline rather than gunzip (which alone takes about as
    /// long as parsing the bundled capture). Files only; the input must fit in memory.
    #[arg(long, conflicts_with = "source")]
    preload: bool,
    /// Slots per lane, in batches.
    #[arg(long, default_value_t = 1024)]
    capacity: usize,
    /// Bounds the bytes held by published batches not yet acked by every sink (documents, ids
    /// and a fixed overhead per envelope, each batch charged once: `StreamBuilder::memory_budget`);
    /// the ingest waits while it is spent, as for a full lane. Default: none (the capacity alone).
    #[arg(long)]
    memory_budget: Option<u64>,
    /// A transaction of more changes than this is published as several batches (chunks); only
    /// the last one carries the commit position. 0: one batch per transaction.
    #[arg(long, default_value_t = 10_000)]
    max_batch_changes: u64,
    /// The last sink sleeps this long per batch (see --slow-sink-micros).
    #[arg(long)]
    slow_sink: bool,
    /// How long the slow sink sleeps per batch, in microseconds.
    #[arg(long, default_value_t = 200)]
    slow_sink_micros: u64,
    /// Sinks randomly nack, drop handles, ack out of order, re-attach, and ask for one backfill.
    /// File input only: the live source's sinks are durable, and their checkpoints assume
    /// in-order acks.
    #[arg(long, conflicts_with = "source")]
    chaos: bool,
    /// The first sink's engine dies after processing this many batches: it drops its consumer
    /// and every delivery it holds without acking (and, with durable sinks, the output it wrote
    /// but did not checkpoint); --sink-down-ms later a new engine re-attaches to the lane and
    /// reopens the output from the checkpoint. Its unacked batches must come again, and the
    /// watermark must not pass its last ack meanwhile (both in the summary: the sink's `sink_kill`).
    /// In-process stream only (over Redis, kill a `--role sink` process instead).
    #[arg(long, value_name = "BATCHES", conflicts_with_all = ["chaos", "backend"])]
    kill_sink_after: Option<u64>,
    /// How long the engine killed by --kill-sink-after stays dead, in milliseconds.
    #[arg(long, default_value_t = 1000, requires = "kill_sink_after")]
    sink_down_ms: u64,
    /// Seed of the --chaos randomness.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Skip and count malformed input lines instead of stopping at the first one. A transaction
    /// with a bad line is discarded whole and its changes counted as lost: the run FAILs.
    #[arg(long)]
    skip_bad_lines: bool,
    /// Key columns of a table whose replica identity is an index (`schema.table=col1,col2`;
    /// repeatable). Without it such a table's rows are keyed by every column until its first
    /// identity shows the index, which is an error.
    #[arg(long = "key-columns", value_name = "SCHEMA.TABLE=COLS")]
    key_columns: Vec<String>,
    /// Write the summary as a JSON object to this file.
    #[arg(long)]
    summary_json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Run over the Redis backend at this URL (`redis://host:port`, `redis+unix:///path`), as
    /// separate processes: one `--role` per process (see `pipeline/redis.rs`).
    #[arg(long, value_name = "URL", requires = "role")]
    backend: Option<String>,
    /// With --backend: what this process does: `ingest`, `sink` (with --lane), or `delete`.
    #[arg(long, value_enum, requires = "backend")]
    role: Option<redis_roles::Role>,
    /// With --role sink: the lane (sink) this process applies.
    #[arg(long, value_name = "SINK")]
    lane: Option<String>,
    /// With --backend: the Redis stream's name (every process of one pipeline uses the same).
    #[arg(long, default_value = "pipeline")]
    stream_name: String,
    /// With --role ingest: how long to wait for the sinks to ack the last commit LSN.
    #[arg(long, default_value_t = 300)]
    wait_secs: u64,
}

/// `--backend redis://...`: the ingest and each sink as separate processes.
#[path = "pipeline/redis.rs"]
mod redis_roles;

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn sink_names(n: u16) -> Vec<String> {
    const NAMED: [&str; 3] = ["search", "cache", "archive"];
    (0..usize::from(n))
        .map(|i| NAMED.get(i).map_or_else(|| format!("sink_{i}"), |s| (*s).to_owned()))
        .collect()
}

/// Where the ingest reads: a wal2json file (or stdin), or a live slot.
enum Input {
    File(Box<dyn BufRead + Send>),
    Live(Box<LiveSource>),
}

/// Opens the input: `-` is stdin; gzip is recognised by its magic bytes.
fn open_input(path: &Path, preload: bool) -> Result<Box<dyn BufRead + Send>, BoxError> {
    const BUF: usize = 1 << 20;
    let raw: Box<dyn Read + Send> = if path == Path::new("-") {
        Box::new(io::stdin())
    } else {
        Box::new(File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?)
    };
    let mut reader = BufReader::with_capacity(BUF, raw);
    let head = reader.fill_buf()?;
    let mut input: Box<dyn BufRead + Send> = if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(BufReader::with_capacity(BUF, flate2::bufread::MultiGzDecoder::new(reader)))
    } else {
        Box::new(reader)
    };
    if preload {
        let mut all = Vec::new();
        input.read_to_end(&mut all).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        input = Box::new(io::Cursor::new(all));
    }
    Ok(input)
}

// ---------------------------------------------------------------------------------------------
// Shared counters, read by the progress bar.

#[derive(Default)]
struct Counters {
    transactions: AtomicU64,
    /// Unpositioned chunks of large transactions published.
    chunks: AtomicU64,
    changes: AtomicU64,
    envelopes: AtomicU64,
    bad_lines: AtomicU64,
    /// Transactions discarded whole because of bad lines (`--skip-bad-lines`), and their changes
    /// (bad lines included).
    transactions_discarded: AtomicU64,
    changes_discarded: AtomicU64,
    ingest_done: AtomicBool,
}

/// What the ingest thread did.
#[derive(Default)]
struct IngestReport {
    /// Every positioned batch published: (position, envelope count).
    published: Vec<(u64, u32)>,
    last_commit: Option<Position>,
    error: Option<String>,
    backfills_served: u64,
    snapshot_envelopes: u64,
    /// The live source, handed back for the final confirm.
    source: Option<Box<LiveSource>>,
}

/// The positioned batches one sink received: for each position, how many of its envelopes.
///
/// A batch delivers all its envelopes, so envelopes `0..n` of a batch were received iff a receipt
/// had at least `n`. Transactions are published in strictly increasing position order, so a
/// first receipt is almost always a push at the end; a redelivery is found by binary search.
#[derive(Default)]
struct Received {
    /// Positions of the batches received (empty transactions included), strictly increasing.
    positions: Vec<u64>,
    /// Per entry of `positions`: the most envelopes one receipt of it held (with the envelopes
    /// of the transaction's chunks).
    envelopes: Vec<u32>,
    /// Lane sequence numbers of the unpositioned chunks of large transactions processed.
    chunks: std::collections::HashSet<u64>,
    /// Envelopes of those chunks, by their envelopes' position (the transaction's commit LSN).
    chunk_envelopes: HashMap<u64, u32>,
}

impl Received {
    /// Records a receipt of `envelopes` envelopes at `position`; returns how many of them had
    /// been received before (duplicates).
    fn record(&mut self, position: u64, envelopes: u32) -> u64 {
        let i = match self.positions.last() {
            Some(&last) if last >= position => self.positions.partition_point(|&p| p < position),
            _ => self.positions.len(),
        };
        if self.positions.get(i) != Some(&position) {
            self.positions.insert(i, position);
            self.envelopes.insert(i, 0);
        }
        let seen = &mut self.envelopes[i];
        let duplicates = (*seen).min(envelopes);
        *seen = (*seen).max(envelopes);
        u64::from(duplicates)
    }

    /// Records a receipt of a chunk of a large transaction (lane sequence `sequence`) holding
    /// `envelopes` envelopes at `position`; returns how many had been received before.
    fn record_chunk(&mut self, sequence: u64, position: u64, envelopes: u32) -> u64 {
        if !self.chunks.insert(sequence) {
            return u64::from(envelopes);
        }
        *self.chunk_envelopes.entry(position).or_default() += envelopes;
        0
    }

    /// Records a receipt of the positioned (last) batch of a transaction, adding the envelopes
    /// of its chunks received before.
    fn record_last(&mut self, position: u64, envelopes: u32) -> u64 {
        let chunks = self.chunk_envelopes.get(&position).copied().unwrap_or(0);
        self.record(position, envelopes.saturating_add(chunks))
    }

    /// How many positioned batches (transactions) were received at least once.
    fn transactions(&self) -> u64 {
        self.positions.len() as u64
    }

    /// How many of their envelopes were received at least once.
    fn envelopes(&self) -> u64 {
        self.envelopes.iter().map(|&n| u64::from(n)).sum()
    }

    /// How many of the `published` (position, envelope count) batches, and how many of their
    /// envelopes (a lost batch's included), were never received: (transactions, envelopes).
    /// `published` is in increasing position order.
    fn lost(&self, published: &[(u64, u32)]) -> (u64, u64) {
        let (mut transactions, mut envelopes) = (0, 0);
        let mut j = 0;
        for &(p, n) in published {
            while self.positions.get(j).is_some_and(|&q| q < p) {
                j += 1;
            }
            let got = if self.positions.get(j) == Some(&p) {
                self.envelopes[j]
            } else {
                transactions += 1;
                0
            };
            envelopes += u64::from(n.saturating_sub(got));
        }
        (transactions, envelopes)
    }
}

/// Compares a sink's NDJSON output with what was published: envelopes per transaction,
/// counted by the `position` each line starts with. Returns ((transactions, envelopes) lost,
/// envelopes written more than once); transactions without envelopes are left out (they write
/// nothing; the watermark check covers their acks).
/// With `since`, lines at positions before it are left out (an earlier run's, on the live
/// source); snapshot rows (position null) and lines past the last published transaction (chunks
/// of a transaction the ingest stopped in) always are.
pub(crate) fn check_output(
    path: &Path,
    published: &[(u64, u32)],
    since: Option<u64>,
) -> Result<((u64, u64), u64), BoxError> {
    let file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut lines: HashMap<u64, u32> = HashMap::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.starts_with("{\"position\":null") {
            continue;
        }
        let bad = || format!("{}:{}: expected a line starting {{\"position\":\"X/Y\"", path.display(), i + 1);
        let rest = line.strip_prefix("{\"position\":\"").ok_or_else(bad)?;
        let lsn = rest.split_once('"').ok_or_else(bad)?.0;
        let p = Position::from_lsn(lsn).map_err(|_| bad())?.0;
        // Past the last transaction published: chunks of one the ingest stopped in the middle of.
        let unfinished = published.last().is_some_and(|&(last, _)| p > last);
        if since.is_none_or(|s| p >= s) && !unfinished {
            *lines.entry(p).or_default() += 1;
        }
    }
    let mut positions: Vec<(u64, u32)> = lines.into_iter().collect();
    positions.sort_unstable();
    // A transaction without envelopes leaves no line: only its ack (the watermark) shows it.
    let published: Vec<(u64, u32)> = published.iter().copied().filter(|&(_, n)| n > 0).collect();
    let published = published.as_slice();
    let mut received = Received::default();
    for &(p, n) in &positions {
        received.record(p, n);
    }
    let expected: HashMap<u64, u32> = published.iter().copied().collect();
    let duplicates = positions
        .iter()
        .map(|&(p, n)| u64::from(n.saturating_sub(expected.get(&p).copied().unwrap_or(0))))
        .sum();
    Ok((received.lost(published), duplicates))
}

/// The two kinds of lane item a sink is delivered.
#[derive(Clone, Copy)]
enum Kind {
    /// A [`Batch`]: a transaction (positioned) or a chunk of snapshot rows (unpositioned).
    Batch,
    /// A `SnapshotComplete` marker, ending a backfill.
    Marker,
}

impl Kind {
    fn of(item: &LaneItem) -> Kind {
        match item {
            LaneItem::Batch(_) => Kind::Batch,
            LaneItem::SnapshotComplete { .. } => Kind::Marker,
            other => unreachable!("a lane item this example does not know: {other:?}"),
        }
    }
}

/// What one sink did with the deliveries of one [`Kind`] of lane item. These count deliveries: an
/// item delivered three times (first delivery and two redeliveries) counts three times.
#[derive(Default, Clone, Copy)]
struct Deliveries {
    /// Received from the lane, redeliveries included.
    delivered: u64,
    /// Of `delivered`, redeliveries (attempt > 1) — every one the lane made.
    redelivered: u64,
    /// Of `delivered`, nacked on receipt (--chaos) without being processed.
    nacked: u64,
    /// Of `delivered`, processed (recorded, and written unless --discard): `delivered - nacked`.
    processed: u64,
    /// Of `processed`, redeliveries: items processed again.
    processed_again: u64,
    /// Of `processed`, whose handle was dropped un-acked (--chaos): redelivered.
    dropped: u64,
    /// Of `processed`, whose ack was refused because a consumer re-attach took the item back
    /// first (`AckError::Detached`): redelivered.
    acks_refused: u64,
}

/// What a sink thread did.
#[derive(Default)]
struct SinkReport {
    name: String,
    /// Every positioned batch received at least once, and how many of its envelopes.
    received: Received,
    /// Envelopes of positioned batches received again after a first receipt.
    envelopes_received_again: u64,
    batches: Deliveries,
    markers: Deliveries,
    bytes_written: u64,
    reattaches: u64,
    /// Rounds of held acks sent in an order other than the delivery order.
    out_of_order_ack_rounds: u64,
    backfill_requested: bool,
    /// Envelopes of unpositioned (snapshot) batches processed, per processed delivery.
    snapshot_envelopes: u64,
    error: Option<String>,
    /// When the sink saw the end of its lane.
    finished: Option<Instant>,
    /// Live mode: transactions received again after a restart and skipped, being at or before
    /// the sink's checkpoint.
    transactions_skipped: u64,
    /// Live mode: the sink's checkpoint at the end.
    checkpoint: Option<Position>,
    /// --kill-sink-after: what the engine's death showed.
    kill: Option<KillReport>,
}

/// One kill of a sink engine (--kill-sink-after) and its re-attach.
#[derive(Debug, Clone, Copy, Default, Serialize)]
struct KillReport {
    /// Deliveries the dead engine held without acking (taken back by the re-attach).
    held_unacked: u64,
    /// The lane's acked position when the engine died.
    #[serde(serialize_with = "ser_lsn")]
    acked_at_death: Option<Position>,
    /// The highest watermark read while it was dead (every 5 ms): never past `acked_at_death`.
    #[serde(serialize_with = "ser_lsn")]
    max_watermark_while_down: Option<Position>,
    /// The highest acked position of another lane read meanwhile: past `acked_at_death` when
    /// the other sinks went on, so the dead sink is what held the watermark back.
    #[serde(serialize_with = "ser_lsn")]
    others_acked_while_down: Option<Position>,
    /// Batches delivered again to the new engine (attempt > 1).
    redelivered_after_reattach: u64,
}

fn ser_lsn<S: serde::Serializer>(p: &Option<Position>, s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&p.map(|p| p.to_string()), s)
}

/// What the sink engine to kill needs: when, for how long, and the stream to watch meanwhile.
struct Kill {
    after: u64,
    down: Duration,
    stream: MemoryStream,
    lanes: Vec<Lane>,
    /// The live-mode output directory, to reopen the durable output from its checkpoint.
    out_dir: Option<PathBuf>,
}

// ---------------------------------------------------------------------------------------------
// Ingest.

/// The rows the ingest has seen, per index, to answer backfill requests (kept only with --chaos).
type State = HashMap<IndexName, HashMap<String, Bytes>>;

fn apply_to_state(state: &mut State, batch: &Batch) {
    for e in batch.envelopes.iter() {
        let rows = state.entry(e.index.clone()).or_default();
        match e.op {
            Op::Upsert => {
                rows.insert(e.id.clone(), e.document.clone());
            }
            Op::Delete => {
                rows.remove(&e.id);
            }
            Op::Truncate => rows.clear(),
            other => unreachable!("an op this example does not know: {other:?}"),
        }
    }
}

struct Ingest {
    stream: MemoryStream,
    stop: Arc<AtomicBool>,
    bad_shown: u32,
    /// Envelopes of the chunks published of the transaction being published.
    chunk_envelopes: u32,
    /// The stream's one publisher: each batch written once, read in place by every lane.
    fanout: Fanout,
    names: Vec<SinkName>,
    requests: lanestream::Consumer<Request>,
    state: Option<State>,
    report: IngestReport,
}

impl Ingest {
    /// Publishes to every lane; `to` restricts it to one lane (snapshot rows).
    fn publish(&mut self, item: LaneItem, to: Option<usize>) -> Result<(), BoxError> {
        match to {
            // A sink engine that stopped with an error closed its lane (Sink::run): a publish
            // waiting for that lane's room returns Closed, and the run ends with FAIL.
            None => self.fanout.publish(item).map_err(|e| match e {
                PublishError::Closed(_) => {
                    "publish: a lane was closed by its sink engine, which stopped with an error (see below)"
                        .to_owned()
                }
                e => format!("publish: {e}"),
            })?,
            Some(i) => {
                self.fanout.publish_to(i, item).map_err(|e| format!("publish to {}: {e}", self.names[i]))?
            }
        }
        Ok(())
    }

    /// Answers the pending backfill requests (snapshot rows, then SnapshotComplete, then ack).
    fn serve_requests(&mut self, wait: Option<Duration>) -> Result<u64, BoxError> {
        let mut served = 0;
        loop {
            let delivery = match wait {
                None => match self.requests.try_recv() {
                    Ok(d) => d,
                    Err(TryRecvError::Empty | TryRecvError::Closed) => return Ok(served),
                    Err(e) => return Err(e.into()),
                },
                Some(t) => match self.requests.recv_timeout(t) {
                    Ok(Some(d)) => d,
                    Ok(None) => return Ok(served),
                    Err(e) if e.is_timeout() => return Ok(served),
                    Err(e) => return Err(e.into()),
                },
            };
            // `after` is not used: this example answers from the rows it holds, whole.
            let Request::Backfill { sink, indexes, .. } = delivery.item().clone() else {
                return Err(format!("a request this example does not serve: {:?}", delivery.item()).into());
            };
            let lane = self
                .names
                .iter()
                .position(|n| *n == sink)
                .ok_or_else(|| format!("backfill for unknown sink {sink}"))?;
            let empty = HashMap::new();
            for index in &indexes {
                let rows = self.state.as_ref().and_then(|s| s.get(index)).unwrap_or(&empty);
                let envelopes: Vec<Envelope> = rows
                    .iter()
                    .map(|(id, doc)| Envelope {
                        index: index.clone(),
                        id: id.clone(),
                        op: Op::Upsert,
                        position: None,
                        document: doc.clone(),
                        built_at_micros: None,
                    })
                    .collect();
                for chunk in envelopes.chunks(512) {
                    self.report.snapshot_envelopes += chunk.len() as u64;
                    self.publish(LaneItem::Batch(Batch::new(None, Arc::from(chunk))), Some(lane))?;
                }
            }
            self.publish(LaneItem::SnapshotComplete { indexes }, Some(lane))?;
            // Acked only once SnapshotComplete is published (R2).
            if delivery.ack().is_ok() {
                self.report.backfills_served += 1;
                served += 1;
            }
        }
    }

    fn run(
        mut self,
        input: Input,
        args: &Args,
        counters: &Counters,
        expected_backfills: u64,
    ) -> IngestReport {
        let result = match input {
            Input::File(input) => self.ingest(input, args, counters, expected_backfills),
            Input::Live(mut source) => {
                let result = self.ingest_live(&mut source, args, counters);
                self.report.source = Some(source);
                result
            }
        };
        if let Err(e) = result {
            self.report.error = Some(e.to_string());
        }
        // Close every lane: the sinks drain what is queued, then see the end.
        self.fanout.close();
        counters.ingest_done.store(true, Ordering::Release);
        self.report
    }

    fn builder(args: &Args) -> Result<TransactionBuilder, BoxError> {
        let max = (args.max_batch_changes > 0).then_some(args.max_batch_changes);
        let mut builder = TransactionBuilder::new().with_max_batch_changes(max);
        for (table, columns) in key_columns(&args.key_columns)? {
            builder.set_key_columns(&table.0, &table.1, Some(columns));
        }
        Ok(builder)
    }

    fn ingest(
        &mut self,
        input: Box<dyn BufRead + Send>,
        args: &Args,
        counters: &Counters,
        expected_backfills: u64,
    ) -> Result<(), BoxError> {
        for next in Wal2JsonReader::new(input).with_builder(Self::builder(args)?) {
            self.handle(next, args, counters, None)?;
        }
        // Every sink asks for its backfill at its first delivery: wait for the ones not served
        // yet (bounded), so that no request is left behind the closed lanes.
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.report.backfills_served < expected_backfills && !self.report.published.is_empty() {
            if Instant::now() > deadline {
                eprintln!(
                    "warning: only {} of {expected_backfills} backfill requests arrived",
                    self.report.backfills_served
                );
                break;
            }
            self.serve_requests(Some(Duration::from_millis(50)))?;
        }
        Ok(())
    }

    /// The live source: stream the slot, publish, confirm the watermark; until SIGTERM/SIGINT
    /// or, with --end-lsn, until everything committed before it was published.
    fn ingest_live(
        &mut self,
        source: &mut LiveSource,
        args: &Args,
        counters: &Counters,
    ) -> Result<(), BoxError> {
        let mut decoder = PgOutputDecoder::new(Self::builder(args)?.with_key_lookup(source.key_lookup()));
        let end = args.end_lsn.as_deref().map(Position::from_lsn).transpose()?;
        let wait = Duration::from_millis(args.poll_interval_ms.max(1));
        source.start()?;
        while !self.stop.load(Ordering::Relaxed) {
            source.confirm(self.stream.watermark())?;
            match source.next(&mut decoder, wait)? {
                Some(batch) => self.handle(Ok(batch), args, counters, Some(&mut *source))?,
                None if end.is_some_and(|end| source.decoded().is_some_and(|d| d >= end)) => break,
                None => {}
            }
        }
        Ok(())
    }

    /// Publishes one batch (or counts one bad line). `confirmer`: the live source's, to confirm
    /// the watermark while a full lane keeps the publish waiting.
    fn handle(
        &mut self,
        next: Result<Batch, Wal2JsonError>,
        args: &Args,
        counters: &Counters,
        confirmer: Option<&mut LiveSource>,
    ) -> Result<(), BoxError> {
        let batch = match next {
            Ok(batch) => batch,
            Err(e) => {
                if args.skip_bad_lines && e.is_recoverable() {
                    if e.open_transaction_discarded() {
                        self.chunk_envelopes = 0; // its chunks are out, but it is lost
                    }
                    if e.lost_changes() > 0 {
                        counters.transactions_discarded.fetch_add(1, Ordering::Relaxed);
                        counters.changes_discarded.fetch_add(e.lost_changes(), Ordering::Relaxed);
                    } else {
                        counters.bad_lines.fetch_add(1, Ordering::Relaxed);
                    }
                    if self.bad_shown < 10 {
                        eprintln!("warning: skipped: {e}");
                        self.bad_shown += 1;
                    }
                    return Ok(());
                }
                return Err(input_error(&e, args));
            }
        };
        if let Some(state) = &mut self.state {
            apply_to_state(state, &batch);
        }
        let (position, changes, envelopes) = (batch.position, batch.changes, batch.envelopes.len());
        match confirmer {
            None => self.publish(LaneItem::Batch(batch), None)?,
            Some(c) => self.publish_confirming(LaneItem::Batch(batch), c)?,
        }
        counters.changes.fetch_add(changes, Ordering::Relaxed);
        counters.envelopes.fetch_add(envelopes as u64, Ordering::Relaxed);
        let Some(position) = position else {
            // A chunk of a large transaction (--max-batch-changes): counted at its last batch.
            self.chunk_envelopes += u32::try_from(envelopes)?;
            counters.chunks.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        let envelopes = u32::try_from(envelopes)?.saturating_add(std::mem::take(&mut self.chunk_envelopes));
        self.report.published.push((position.0, envelopes));
        self.report.last_commit = Some(position);
        counters.transactions.fetch_add(1, Ordering::Relaxed);
        if self.state.is_some() {
            self.serve_requests(None)?;
        }
        Ok(())
    }

    /// Publishes to every lane, confirming the watermark to the slot every 100 ms while a full
    /// lane keeps it waiting (so the slow sinks' progress reaches PostgreSQL meanwhile).
    fn publish_confirming(&mut self, mut item: LaneItem, confirmer: &mut LiveSource) -> Result<(), BoxError> {
        loop {
            match self.fanout.publish_timeout(item, Duration::from_millis(100)) {
                Ok(()) => return Ok(()),
                Err(PublishTimeoutError::Timeout(back)) => {
                    item = back;
                    confirmer.confirm(self.stream.watermark())?;
                }
                Err(e) => return Err(format!("publish: {e}").into()),
            }
        }
    }
}

/// `--key-columns schema.table=col1,col2` → ((schema, table), columns).
/// (schema, table) and its key columns.
type KeyColumns = ((String, String), Vec<String>);

fn key_columns(specs: &[String]) -> Result<Vec<KeyColumns>, BoxError> {
    specs
        .iter()
        .map(|spec| {
            let bad = || format!("--key-columns {spec:?}: expected SCHEMA.TABLE=COL[,COL...]");
            let (table, columns) = spec.split_once('=').ok_or_else(bad)?;
            let (schema, table) = table.split_once('.').ok_or_else(bad)?;
            let columns: Vec<String> = columns.split(',').map(str::to_owned).collect();
            if schema.is_empty() || table.is_empty() || columns.iter().any(String::is_empty) {
                return Err(bad().into());
            }
            Ok(((schema.to_owned(), table.to_owned()), columns))
        })
        .collect()
}

fn input_error(e: &Wal2JsonError, args: &Args) -> BoxError {
    let hint = if e.is_recoverable() { " (use --skip-bad-lines to skip such lines)" } else { "" };
    match &args.source {
        // Line numbers count the lines read from the slot in this run.
        Some(url) => format!("the live source (slot {:?} of {}): {e}{hint}", args.slot, redact(url)).into(),
        None => format!("{}: {e}{hint}", args.input.display()).into(),
    }
}

/// The sinks' durable checkpoints in `out` (`<sink>.checkpoint`, first field the last applied
/// commit LSN), for the sinks that have one.
fn sink_checkpoints(out: &Path, names: &[String]) -> Result<Vec<(String, Position)>, BoxError> {
    let mut found = Vec::new();
    for name in names {
        let checkpoint = Checkpoint::read(out, name)?;
        // Applied up to: the last whole transaction, or (a transaction half applied and none
        // whole yet) just before that transaction.
        let applied = checkpoint
            .committed
            .or_else(|| checkpoint.partial.map(|t| Position(t.position.0.saturating_sub(1))));
        if let Some(p) = applied {
            found.push((name.clone(), p));
        }
    }
    Ok(found)
}

// ---------------------------------------------------------------------------------------------
// Sinks.

struct Sink {
    lane: Lane,
    /// File mode: the output, flushed before each ack (no checkpoint).
    out: Option<BufWriter<File>>,
    /// Live mode (and file mode with --kill-sink-after): the durable output (fsync and
    /// checkpoint before ack, resume after a restart; contract C1).
    durable: Option<DurableNdjson>,
    slow: Option<Duration>,
    chaos: Option<StdRng>,
    requests: lanestream::RequestSender,
    report: SinkReport,
    line: Vec<u8>,
    /// --kill-sink-after (the first sink only); taken when it fires.
    kill: Option<Kill>,
}

impl Sink {
    fn counts(&mut self, kind: Kind) -> &mut Deliveries {
        match kind {
            Kind::Batch => &mut self.report.batches,
            Kind::Marker => &mut self.report.markers,
        }
    }

    /// Counts one delivery received from the lane.
    fn delivered(&mut self, kind: Kind, attempt: u32) {
        let counts = self.counts(kind);
        counts.delivered += 1;
        if attempt > 1 {
            counts.redelivered += 1;
        }
    }

    /// After a --kill-sink-after re-attach: counts a delivery that came again.
    fn redelivered_after_kill(&mut self, attempt: u32) {
        if let (Some(k), true) = (self.report.kill.as_mut(), attempt > 1) {
            k.redelivered_after_reattach += 1;
        }
    }

    /// Records (and writes) one delivered item.
    fn apply(&mut self, item: &LaneItem, attempt: u32, sequence: u64) -> Result<(), BoxError> {
        let counts = self.counts(Kind::of(item));
        counts.processed += 1;
        if attempt > 1 {
            counts.processed_again += 1;
        }
        let LaneItem::Batch(batch) = item else { return Ok(()) };
        let envelopes = u32::try_from(batch.envelopes.len())?;
        match (batch.position, batch.envelopes.first().and_then(|e| e.position)) {
            (Some(p), _) => {
                self.report.envelopes_received_again += self.report.received.record_last(p.0, envelopes);
            }
            // A chunk of a large transaction: its envelopes carry the commit LSN.
            (None, Some(p)) => {
                self.report.envelopes_received_again +=
                    self.report.received.record_chunk(sequence, p.0, envelopes);
            }
            (None, None) => self.report.snapshot_envelopes += batch.envelopes.len() as u64,
        }
        if let Some(d) = &mut self.durable {
            let applied = d.apply(batch)?;
            self.report.bytes_written += applied.bytes;
            if batch.position.is_some() && applied.written == 0 && applied.skipped > 0 {
                // Applied before a restart (PostgreSQL re-sends from the confirmed position).
                self.report.transactions_skipped += 1;
            }
        } else if let Some(out) = &mut self.out {
            let mut written = 0;
            for e in batch.envelopes.iter() {
                self.line.clear();
                write_line(&mut self.line, e);
                out.write_all(&self.line)?;
                written += self.line.len() as u64;
            }
            self.report.bytes_written += written;
            out.flush()?; // flushed before the ack
        }
        if let Some(d) = self.slow {
            thread::sleep(d);
        }
        Ok(())
    }

    fn ack(&mut self, (handle, kind): (AckHandle<LaneItem>, Kind)) {
        if let Err(AckError::Detached) = handle.ack() {
            // A re-attach took it back first: it is redelivered to the new consumer (L8).
            self.counts(kind).acks_refused += 1;
        }
    }

    fn run(mut self) -> SinkReport {
        if let Err(e) = self.consume() {
            self.report.error = Some(e.to_string());
            // Nobody will drain this lane now: closing it wakes the ingest's waiting publish
            // (Closed, L10) instead of leaving it waiting for room forever.
            self.lane.close();
        }
        self.report.checkpoint = self.durable.as_ref().and_then(|d| d.checkpoint().committed);
        self.report.finished = Some(Instant::now());
        self.report
    }

    fn consume(&mut self) -> Result<(), BoxError> {
        let mut consumer = self.lane.reattach();
        let mut held: Vec<(AckHandle<LaneItem>, Kind)> = Vec::new();
        loop {
            if self.chaos.is_none() && self.durable.is_none() && self.kill.is_none() {
                // The fast path (no chaos, not durable, no --kill-sink-after pending): receive
                // in runs, apply each item in order, ack the run with one pass of the lane's
                // advancer.
                let run = match consumer.recv_run(lanestream::MAX_RUN) {
                    Ok(Some(run)) => run,
                    Ok(None) => return Ok(()),
                    Err(_detached) => {
                        consumer = self.lane.reattach();
                        continue;
                    }
                };
                let (attempt, first) = (run.attempt(), run.sequences().start);
                let mut kinds = [0u64; 2];
                for (k, item) in run.iter().enumerate() {
                    let kind = Kind::of(item);
                    kinds[kind as usize] += 1;
                    self.delivered(kind, attempt);
                    self.redelivered_after_kill(attempt);
                    self.apply(item, attempt, first + k as u64)?;
                }
                if let Err(AckError::Detached) = run.ack() {
                    // A re-attach took (some of) the run back first: redelivered (L8). Which
                    // items is not known here; count the run's.
                    self.counts(Kind::Batch).acks_refused += kinds[Kind::Batch as usize];
                    self.counts(Kind::Marker).acks_refused += kinds[Kind::Marker as usize];
                }
                continue;
            }
            // Never wait while holding deliveries: the producer may be waiting for their slots.
            let delivery = if held.is_empty() {
                match consumer.recv() {
                    Ok(Some(d)) => d,
                    Ok(None) => return Ok(()),
                    Err(_detached) => {
                        consumer = self.lane.reattach();
                        continue;
                    }
                }
            } else {
                match consumer.try_recv() {
                    Ok(d) => d,
                    Err(TryRecvError::Empty | TryRecvError::Closed) => {
                        self.ack_held(&mut held)?;
                        continue;
                    }
                    Err(_detached) => {
                        self.ack_held(&mut held)?;
                        consumer = self.lane.reattach();
                        continue;
                    }
                }
            };
            let attempt = delivery.attempt();
            let kind = Kind::of(delivery.item());
            self.delivered(kind, attempt);
            self.redelivered_after_kill(attempt);
            let Some(rng) = self.chaos.as_mut() else {
                let (item, handle) = delivery.into_parts();
                self.apply(&item, attempt, handle.sequence())?;
                if self.kill.as_ref().is_some_and(|k| self.report.batches.processed >= k.after) {
                    held.push((handle, kind));
                    consumer = self.die_and_reattach(consumer, std::mem::take(&mut held))?;
                    continue;
                }
                if self.durable.is_some() {
                    // Group commit: one fsync and checkpoint for what arrived together.
                    held.push((handle, kind));
                    if held.len() >= 256 {
                        self.ack_held(&mut held)?;
                    }
                } else {
                    self.ack((handle, kind));
                }
                continue;
            };
            // --chaos
            let roll: f64 = rng.gen();
            let hold_limit = rng.gen_range(1..=4usize);
            let reattach = rng.gen_bool(0.01);
            let drop_after = rng.gen_bool(0.02);
            if !self.report.backfill_requested {
                self.request_backfill(delivery.item())?;
            }
            if roll < 0.03 {
                self.counts(kind).nacked += 1;
                delivery.nack(); // redelivered before anything new (L6)
                continue;
            }
            let (item, handle) = delivery.into_parts();
            self.apply(&item, attempt, handle.sequence())?;
            if drop_after {
                self.counts(kind).dropped += 1;
                drop(handle); // dropping an unacked handle nacks it: a duplicate will follow
            } else {
                held.push((handle, kind));
            }
            if reattach {
                // Re-attach while holding deliveries: their acks below may land or be refused
                // with Detached (then they come again to the new consumer).
                self.report.reattaches += 1;
                consumer = self.lane.reattach();
                self.ack_held(&mut held)?;
            } else if held.len() >= hold_limit {
                self.ack_held(&mut held)?;
            }
        }
    }

    /// --kill-sink-after: the engine dies holding `held` (processed, written, not acked) and
    /// `consumer`; a new engine re-attaches after the down time and gets every unacked batch
    /// again (L8). Meanwhile the watermark is watched: it must not pass this lane's last ack.
    fn die_and_reattach(
        &mut self,
        consumer: lanestream::Consumer<LaneItem>,
        held: Vec<(AckHandle<LaneItem>, Kind)>,
    ) -> Result<lanestream::Consumer<LaneItem>, BoxError> {
        let Some(kill) = self.kill.take() else { return Ok(consumer) };
        let mine = self.lane.name().clone();
        let acked_at_death = self.lane.stats().acked;
        let mut report =
            KillReport { held_unacked: held.len() as u64, acked_at_death, ..KillReport::default() };
        // A crashed process loses its unflushed output and never acks: keep the handles (and
        // the consumer) un-dropped until the new engine has re-attached, so that nothing is
        // released by a drop; the re-attach takes every unacked batch back.
        let unflushed = self.out.take().map(BufWriter::into_parts);
        // Its durable output dies with it: unflushed lines lost, the output's lock released.
        let had_durable = self.durable.take().is_some();
        let zombie = (consumer, held, unflushed);
        let until = Instant::now() + kill.down;
        while Instant::now() < until {
            let watermark = kill.stream.watermark();
            report.max_watermark_while_down = report.max_watermark_while_down.max(watermark);
            let others =
                kill.lanes.iter().filter(|l| *l.name() != mine).filter_map(|l| l.stats().acked).max();
            report.others_acked_while_down = report.others_acked_while_down.max(others);
            thread::sleep(Duration::from_millis(5));
        }
        // The new engine: the durable output reopened from its checkpoint (what was written
        // after it is cut off and comes again), then a fresh consumer over the same lane.
        match (&kill.out_dir, had_durable) {
            (Some(dir), true) => {
                self.durable = Some(DurableNdjson::open(dir, mine.as_str(), Duration::ZERO)?)
            }
            _ => self.out = zombie.2.map(|(file, _lost)| BufWriter::with_capacity(1 << 16, file)),
        }
        let consumer = self.lane.reattach();
        drop((zombie.0, zombie.1)); // late drops of a detached consumer's handles: refused, no release
        self.report.reattaches += 1;
        self.report.kill = Some(report);
        Ok(consumer)
    }

    /// Acks the held deliveries in a random order (L5: any order is fine), after making their
    /// output durable (live mode).
    fn ack_held(&mut self, held: &mut Vec<(AckHandle<LaneItem>, Kind)>) -> Result<(), BoxError> {
        if let Some(d) = &mut self.durable {
            d.commit()?;
        }
        if let Some(rng) = self.chaos.as_mut() {
            held.shuffle(rng);
            if held.windows(2).any(|w| w[0].0.sequence() > w[1].0.sequence()) {
                self.report.out_of_order_ack_rounds += 1;
            }
        }
        for h in held.drain(..) {
            self.ack(h);
        }
        Ok(())
    }

    /// Asks once for a backfill of the first index this sink sees.
    fn request_backfill(&mut self, item: &LaneItem) -> Result<(), BoxError> {
        let LaneItem::Batch(b) = item else { return Ok(()) };
        let Some(e) = b.envelopes.first() else { return Ok(()) };
        let request = Request::backfill(self.lane.name().clone(), vec![e.index.clone()]);
        self.requests.publish(request).map_err(|e| format!("backfill request: {e}"))?;
        self.report.backfill_requested = true;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------

fn run(args: &Args) -> Result<bool, BoxError> {
    if let Some(url) = &args.backend {
        return redis_roles::run(args, url);
    }
    let names = sink_names(args.sinks);
    let mut builder = MemoryStream::builder()
        .capacity(args.capacity)
        .request_capacity(usize::from(args.sinks).max(1) * 2)
        .sinks(names.iter().cloned());
    if let Some(bytes) = args.memory_budget {
        builder = builder.memory_budget(bytes);
    }
    let stream = builder.build()?;
    let lanes: Vec<Lane> = names.iter().map(|n| stream.lane(n)).collect::<Result<_, _>>()?;
    let live = args.source.is_some();
    let input = match &args.source {
        Some(url) => {
            if args.chaos {
                return Err("--chaos is for the file input; the live source's sinks are durable".into());
            }
            // The sinks' durable checkpoints: a slot that is missing, or created now after them,
            // would skip what was committed in between. So --create-slot creates nothing over
            // checkpoints: a new slot starts at the current WAL position, after every checkpoint
            // of this server (a slot created and then left behind by a crash before the check
            // below would pass it on the next run).
            let checkpoints = if args.discard { Vec::new() } else { sink_checkpoints(&args.out, &names)? };
            let mut config = LiveConfig::new(url.clone(), args.slot.clone());
            config.create_slot = args.create_slot && checkpoints.is_empty();
            config.slot_wait = Duration::from_secs(args.slot_wait_secs);
            config.publication = args.publication.clone();
            config.heartbeat = args.heartbeat_secs.map(Duration::from_secs);
            config.status_interval = Duration::from_millis(args.status_interval_ms.max(1));
            let mut source = LiveSource::connect(config).map_err(|e| -> BoxError {
                match e {
                    LiveError::NoSlot(slot) if !checkpoints.is_empty() => format!(
                        "replication slot {slot:?} does not exist, but the sinks in {} have checkpoints ({}): a \
                         previous run read it, so it was dropped, and what was committed after the checkpoints \
                         is in no slot. Do not re-create it for these sinks (a new slot starts at the current \
                         WAL position, and --create-slot refuses it over these checkpoints): backfill them \
                         (empty {} and load the tables' rows into the sinks), then start a new pipeline with \
                         --create-slot",
                        args.out.display(),
                        checkpoints.iter().map(|(s, p)| format!("{s} at {p}")).collect::<Vec<_>>().join(", "),
                        args.out.display(),
                    )
                    .into(),
                    e => e.into(),
                }
            })?;
            source.check_resume(checkpoints.iter().map(|(_, p)| *p).min())?;
            Input::Live(Box::new(source))
        }
        None => Input::File(open_input(&args.input, args.preload)?),
    };
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.clone())?;
    }
    if !args.discard {
        std::fs::create_dir_all(&args.out)
            .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    }

    // Durable sinks: always on the live source; on the file input with --kill-sink-after, so that
    // a sink engine killed mid-transaction resumes from its checkpoint (contract C1). A file
    // run starts afresh: an earlier run's checkpoints are for another input.
    let durable_sinks = live || args.kill_sink_after.is_some();
    if durable_sinks && !live && !args.discard {
        for name in &names {
            for file in [format!("{name}.ndjson"), format!("{name}.checkpoint")] {
                match std::fs::remove_file(args.out.join(&file)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e.into()),
                    _ => {}
                }
            }
        }
    }

    let counters = Arc::new(Counters::default());
    let started = Instant::now();

    // Sinks first, so that they are attached before anything is published.
    let mut sink_threads = Vec::new();
    for (i, lane) in lanes.iter().enumerate() {
        let (out, durable) = if args.discard {
            (None, None)
        } else if durable_sinks {
            // Durable: resume after the checkpoint, fsync before every ack.
            (None, Some(DurableNdjson::open(&args.out, lane.name().as_str(), Duration::ZERO)?))
        } else {
            let path = args.out.join(format!("{}.ndjson", lane.name()));
            let file = File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
            (Some(BufWriter::with_capacity(1 << 16, file)), None)
        };
        let sink = Sink {
            lane: lane.clone(),
            out,
            durable,
            slow: (args.slow_sink && i + 1 == lanes.len())
                .then(|| Duration::from_micros(args.slow_sink_micros)),
            chaos: args.chaos.then(|| StdRng::seed_from_u64(args.seed.wrapping_add(i as u64))),
            requests: stream.requests().sender(),
            report: SinkReport { name: lane.name().to_string(), ..SinkReport::default() },
            line: Vec::with_capacity(4096),
            kill: args.kill_sink_after.filter(|_| i == 0).map(|after| Kill {
                after,
                down: Duration::from_millis(args.sink_down_ms),
                stream: stream.clone(),
                lanes: lanes.clone(),
                out_dir: (durable_sinks && !args.discard).then(|| args.out.clone()),
            }),
        };
        sink_threads
            .push(thread::Builder::new().name(format!("sink-{}", lane.name())).spawn(move || sink.run())?);
    }

    let ingest = Ingest {
        stream: stream.clone(),
        stop: stop.clone(),
        bad_shown: 0,
        chunk_envelopes: 0,
        fanout: stream.fanout()?,
        names: lanes.iter().map(|l| l.name().clone()).collect(),
        requests: stream.requests().reattach(),
        state: args.chaos.then(State::new),
        report: IngestReport::default(),
    };
    let expected_backfills = if args.chaos { u64::from(args.sinks) } else { 0 };
    let ingest_thread = {
        let (args, counters) = (args.clone(), counters.clone());
        thread::Builder::new()
            .name("ingest".into())
            .spawn(move || ingest.run(input, &args, &counters, expected_backfills))?
    };

    // Progress until the ingest is done and every sink finished.
    let bar = if args.quiet { ProgressBar::hidden() } else { ProgressBar::new_spinner() };
    bar.set_style(ProgressStyle::with_template(
        "{spinner} {elapsed_precise} {human_pos} changes ({per_sec}) {msg}",
    )?);
    while !(ingest_thread.is_finished() && sink_threads.iter().all(|t| t.is_finished())) {
        bar.set_position(counters.changes.load(Ordering::Relaxed));
        let lags: Vec<String> = lanes.iter().map(|l| format!("{}:{}", l.name(), l.stats().lag())).collect();
        bar.set_message(format!(
            "{} txns, watermark {}, lag {}",
            counters.transactions.load(Ordering::Relaxed),
            stream.watermark().map_or_else(|| "-".to_owned(), |p| p.to_string()),
            lags.join(" ")
        ));
        bar.tick();
        thread::sleep(Duration::from_millis(20));
    }
    bar.finish_and_clear();

    let mut ingest = ingest_thread.join().map_err(|_| "the ingest thread panicked")?;
    let sinks: Vec<SinkReport> = sink_threads
        .into_iter()
        .map(|t| t.join().map_err(|_| "a sink thread panicked"))
        .collect::<Result<_, _>>()?;
    // The live source's last confirm: up to the final watermark, never more.
    let mut slot_confirmed = None;
    let mut live_metrics = None;
    if let Some(source) = ingest.source.as_mut() {
        match source.confirm(stream.watermark()).and_then(|_| source.read_confirmed()) {
            Ok(c) => {
                slot_confirmed = c;
                live_metrics = source.metrics().ok();
            }
            Err(e) => {
                if ingest.error.is_none() {
                    ingest.error = Some(format!("final confirm: {e}"));
                }
            }
        }
    }
    // Up to the last sink's end, not the progress loop's next tick.
    let ended = sinks.iter().filter_map(|s| s.finished).max().unwrap_or_else(Instant::now);
    let elapsed = ended.duration_since(started).as_secs_f64();

    // Every sink must have received every positioned batch and every envelope at least once;
    // the checks' verdict is part of the summary, so the text and the JSON say the same.
    let mut failures: Vec<String> = Vec::new();
    if let Some(e) = &ingest.error {
        eprintln!("error: {e}");
        failures.push(format!("ingest: {e}"));
    }
    let mut per_sink = Vec::with_capacity(sinks.len());
    for (s, lane) in sinks.iter().zip(&lanes) {
        let (transactions_lost, envelopes_lost) = s.received.lost(&ingest.published);
        if let Some(e) = &s.error {
            eprintln!("error: sink {}: {e}", s.name);
            failures.push(format!("sink {}: {e}", s.name));
        }
        if transactions_lost > 0 || envelopes_lost > 0 {
            let what = format!(
                "sink {} never received {transactions_lost} transactions / {envelopes_lost} envelopes",
                s.name
            );
            eprintln!("error: {what}");
            failures.push(what);
        }
        if let Some(k) = &s.kill {
            if k.max_watermark_while_down > k.acked_at_death {
                failures.push(format!(
                    "sink {} was dead at {} and the watermark reached {} meanwhile",
                    s.name,
                    lsn_text(&lsn(k.acked_at_death)),
                    lsn_text(&lsn(k.max_watermark_while_down))
                ));
            }
            if k.redelivered_after_reattach < k.held_unacked {
                failures.push(format!(
                    "sink {} died holding {} unacked batches; only {} came again",
                    s.name, k.held_unacked, k.redelivered_after_reattach
                ));
            }
        }
        if durable_sinks && !args.discard {
            // The sink's output itself, read back, against what the source published: each
            // transaction's envelopes exactly once (what the sink says it received is not
            // enough: acked chunks were once cut off by a restart while the counts said PASS).
            let path = args.out.join(format!("{}.ndjson", s.name));
            let since = live.then(|| ingest.published.first().map_or(u64::MAX, |&(p, _)| p));
            let (lost, duplicates) = check_output(&path, &ingest.published, since)?;
            if lost.1 > 0 || duplicates > 0 {
                let what = format!(
                    "sink {}'s output lacks {} transactions / {} envelopes and holds {duplicates} envelopes twice",
                    s.name, lost.0, lost.1
                );
                eprintln!("error: {what}");
                failures.push(what);
            }
        }
        per_sink.push(SinkSummary::new(s, lsn(lane.stats().acked), transactions_lost, envelopes_lost));
    }
    let (transactions_discarded, changes_discarded) = (
        counters.transactions_discarded.load(Ordering::Relaxed),
        counters.changes_discarded.load(Ordering::Relaxed),
    );
    if changes_discarded > 0 || transactions_discarded > 0 {
        let what = format!(
            "{transactions_discarded} transactions ({changes_discarded} changes, bad lines included) were discarded whole because of bad input lines: lost"
        );
        eprintln!("error: {what}");
        failures.push(what);
    }
    if let Some(after) = args.kill_sink_after {
        if sinks.first().is_some_and(|s| s.kill.is_none()) {
            failures.push(format!("--kill-sink-after {after}: the sink never processed that many batches"));
        }
    }
    let final_watermark = stream.watermark();
    if final_watermark != ingest.last_commit {
        let what = format!(
            "final watermark {} is not the last commit LSN {}",
            lsn_text(&lsn(final_watermark)),
            lsn_text(&lsn(ingest.last_commit))
        );
        eprintln!("error: {what}");
        failures.push(what);
    }

    let transactions = counters.transactions.load(Ordering::Relaxed);
    let changes = counters.changes.load(Ordering::Relaxed);
    let envelopes = counters.envelopes.load(Ordering::Relaxed);
    let reason = if failures.is_empty() {
        format!(
            "each of the {} sinks received all {transactions} transactions ({envelopes} envelopes) at least once, and the final watermark {} is the last commit LSN",
            args.sinks,
            lsn_text(&lsn(final_watermark)),
        )
    } else {
        one_line(&failures.join("; "))
    };
    // Past the watermark only when idle: every transaction handed over acked, and the slot
    // confirmed no further than where the source last decoded (nothing of ours in between).
    let decoded = ingest.source.as_ref().and_then(|s| s.decoded());
    if let (Some(confirmed), Some(watermark)) = (slot_confirmed, final_watermark) {
        let idle_advance = final_watermark == ingest.last_commit && decoded.is_some_and(|d| confirmed <= d);
        if confirmed > watermark && !idle_advance {
            let what = format!(
                "the slot was confirmed at {confirmed}, past the final watermark {watermark} (decoded up to {})",
                lsn_text(&lsn(decoded))
            );
            eprintln!("error: {what}");
            failures.push(what);
        }
    }
    let mut summary = Summary {
        schema_version: 1,
        result: if failures.is_empty() { "PASS" } else { "FAIL" },
        reason,
        input: match &args.source {
            Some(url) => format!("slot {} on {}", args.slot, redact(url)),
            None => args.input.display().to_string(),
        },
        slot_confirmed_lsn: lsn(slot_confirmed),
        slot_lag_bytes: live_metrics.and_then(|m| m.slot_lag_bytes),
        reconnects: live_metrics.map(|m| m.reconnects),
        heartbeats: live_metrics.map(|m| m.heartbeats),
        output_dir: (!args.discard).then(|| args.out.display().to_string()),
        sink_count: args.sinks,
        discard: args.discard,
        preload: args.preload,
        chaos: args.chaos,
        slow_sink: args.slow_sink,
        transactions_published: transactions,
        chunks_published: counters.chunks.load(Ordering::Relaxed),
        changes_published: changes,
        envelopes_published: envelopes,
        bad_lines_skipped: counters.bad_lines.load(Ordering::Relaxed),
        transactions_discarded,
        changes_discarded,
        last_commit_lsn: lsn(ingest.last_commit),
        final_watermark_lsn: lsn(final_watermark),
        stream_idle: stream.is_idle(),
        backfill_requests_served: ingest.backfills_served,
        snapshot_envelopes_published: ingest.snapshot_envelopes,
        batches_redelivered: per_sink.iter().map(|s| s.batches_redelivered).sum(),
        envelopes_received_again: per_sink.iter().map(|s| s.envelopes_received_again).sum(),
        transactions_lost: per_sink.iter().map(|s| s.transactions_lost).sum(),
        envelopes_lost: per_sink.iter().map(|s| s.envelopes_lost).sum(),
        // Rounded to what the text shows, so that both show the same numbers.
        elapsed_seconds: (elapsed * 1000.0).round() / 1000.0,
        changes_per_second: if elapsed > 0.0 { (changes as f64 / elapsed).round() as u64 } else { 0 },
        ingest_error: ingest.error.as_deref().map(one_line),
        per_sink,
    };

    // The JSON first: if it cannot be written, the run fails and the text says so.
    if let Some(path) = &args.summary_json {
        let written = serde_json::to_string_pretty(&summary)
            .map_err(BoxError::from)
            .and_then(|text| std::fs::write(path, text + "\n").map_err(BoxError::from));
        if let Err(e) = written {
            let what = format!("cannot write {}: {e}", path.display());
            eprintln!("error: {what}");
            summary.fail(what);
        }
    }
    // The summary goes to stdout; a closed stdout (e.g. `| head`) is not an error of the run.
    let _ = write!(io::stdout().lock(), "{summary}");
    Ok(summary.result == "PASS")
}

// ---------------------------------------------------------------------------------------------
// The summary.

/// An LSN as PostgreSQL writes it (`0/1D84F00`); `None` when there is none.
fn lsn(p: Option<Position>) -> Option<String> {
    p.map(|p| p.to_string())
}

/// An LSN in the text: unquoted, `none` when there is none (`null` in the JSON).
fn lsn_text(lsn: &Option<String>) -> &str {
    lsn.as_deref().unwrap_or("none")
}

/// The run's summary. The text on stdout (`Display`) and the JSON of `--summary-json`
/// (`Serialize`) both render this one value: the same numbers under the same names.
///
/// Units: a *change* is one I/U/D/T action of the input; an *envelope* is one row operation
/// delivered to a sink (one per change, two for an update that changes the key); a *transaction*
/// is one positioned batch (its envelopes, at its commit LSN); a *batch* is a lane item carrying
/// envelopes: a transaction or a chunk of snapshot rows; a *snapshot marker* is the
/// `SnapshotComplete` lane item that ends a backfill.
#[derive(Serialize)]
struct Summary {
    /// The layout of this JSON: bumped when a field is renamed, removed or changes meaning.
    schema_version: u32,
    /// `PASS` or `FAIL`: the exit status is 0 on PASS, non-zero on FAIL.
    result: &'static str,
    /// Why, in one line.
    reason: String,
    input: String,
    /// Live mode: the slot's `confirmed_flush_lsn` after the final confirm (never past the
    /// final watermark).
    slot_confirmed_lsn: Option<String>,
    /// Live mode: `pg_current_wal_lsn() - confirmed_flush_lsn` of the slot after the final
    /// confirm, in bytes (the WAL the server still keeps for it).
    slot_lag_bytes: Option<u64>,
    /// Live mode: how many times the replication stream was opened again after it broke.
    reconnects: Option<u64>,
    /// Live mode: heartbeat messages written (`--heartbeat-secs`).
    heartbeats: Option<u64>,
    /// The directory of the sinks' `<sink>.ndjson` files; `null` with `--discard`.
    output_dir: Option<String>,
    sink_count: u16,
    discard: bool,
    /// The input was read into memory before the clock started (`--preload`).
    preload: bool,
    chaos: bool,
    slow_sink: bool,
    /// Published to every sink, each as one positioned batch (after its chunks, if any).
    transactions_published: u64,
    /// Unpositioned chunks of transactions over `--max-batch-changes` changes, published to every
    /// sink before their transaction's positioned batch.
    chunks_published: u64,
    changes_published: u64,
    /// Per sink: every sink's lane got all of them.
    envelopes_published: u64,
    /// Malformed input lines skipped (`--skip-bad-lines`).
    bad_lines_skipped: u64,
    /// Transactions discarded whole because they had bad lines (`--skip-bad-lines`): lost, so
    /// the run FAILs.
    transactions_discarded: u64,
    /// Their changes, each bad line counted as one lost change.
    changes_discarded: u64,
    last_commit_lsn: Option<String>,
    final_watermark_lsn: Option<String>,
    /// Nothing queued or unacked on any lane at the end.
    stream_idle: bool,
    backfill_requests_served: u64,
    /// Snapshot rows published in answer to the backfill requests (each to one sink).
    snapshot_envelopes_published: u64,
    /// The sinks' `batches_redelivered`, summed.
    batches_redelivered: u64,
    /// The sinks' `envelopes_received_again`, summed.
    envelopes_received_again: u64,
    /// The sinks' `transactions_lost`, summed.
    transactions_lost: u64,
    /// The sinks' `envelopes_lost`, summed.
    envelopes_lost: u64,
    /// From the start to the last sink's end, to the millisecond.
    elapsed_seconds: f64,
    changes_per_second: u64,
    /// Why the ingest stopped early (input or publish error), if it did.
    ingest_error: Option<String>,
    per_sink: Vec<SinkSummary>,
}

/// One sink's part of the [`Summary`]. The `batches_*` and `snapshot_markers_*` counts are of
/// deliveries (see [`Deliveries`]): an item delivered twice counts twice.
#[derive(Serialize)]
struct SinkSummary {
    name: String,
    /// The lane's acked position: the last transaction of its contiguous acked prefix.
    acked_lsn: Option<String>,
    /// NDJSON bytes appended to `<sink>.ndjson` (redelivered envelopes written again included).
    bytes_written: u64,
    /// Distinct transactions received at least once.
    transactions_received: u64,
    /// Distinct envelopes of transactions received at least once.
    envelopes_received: u64,
    /// Envelopes of transactions received again after their first receipt.
    envelopes_received_again: u64,
    /// Transactions published and never received.
    transactions_lost: u64,
    /// Envelopes of transactions published and never received (a lost transaction's included).
    envelopes_lost: u64,
    /// Batch deliveries received from the lane, redeliveries included.
    batches_delivered: u64,
    /// Of `batches_delivered`, redeliveries (every one the lane made).
    batches_redelivered: u64,
    /// Of `batches_delivered`, nacked on receipt without being processed (`--chaos`).
    batches_nacked: u64,
    /// Of `batches_delivered`, processed: recorded, and written unless `--discard`.
    batches_processed: u64,
    /// Of `batches_processed`, redeliveries: batches processed again.
    batches_processed_again: u64,
    /// Of `batches_processed`, whose handle was dropped un-acked (`--chaos`): redelivered.
    batches_dropped: u64,
    /// Of `batches_processed`, whose ack was refused because a re-attach took the batch back
    /// first: redelivered.
    batch_acks_refused: u64,
    /// Snapshot rows in the processed snapshot batches (redeliveries included).
    snapshot_envelopes_processed: u64,
    /// As the `batches_*` counts, for `SnapshotComplete` markers.
    snapshot_markers_delivered: u64,
    snapshot_markers_redelivered: u64,
    snapshot_markers_nacked: u64,
    snapshot_markers_processed: u64,
    snapshot_markers_processed_again: u64,
    snapshot_markers_dropped: u64,
    snapshot_marker_acks_refused: u64,
    /// Consumer re-attaches (`--chaos`).
    consumer_reattaches: u64,
    /// Rounds of held acks sent in an order other than the delivery order (`--chaos`).
    out_of_order_ack_rounds: u64,
    /// Live mode: transactions at or before the sink's checkpoint, received again after a
    /// restart and skipped (not written twice).
    transactions_skipped: u64,
    /// Live mode: the sink's durable checkpoint at the end (last applied commit LSN).
    checkpoint_lsn: Option<String>,
    /// --kill-sink-after: the engine's death and re-attach, if it happened to this sink.
    sink_kill: Option<KillReport>,
    /// Why the sink stopped early, if it did.
    error: Option<String>,
}

impl SinkSummary {
    fn new(s: &SinkReport, acked_lsn: Option<String>, transactions_lost: u64, envelopes_lost: u64) -> Self {
        let (b, m) = (s.batches, s.markers);
        SinkSummary {
            name: s.name.clone(),
            acked_lsn,
            bytes_written: s.bytes_written,
            transactions_received: s.received.transactions(),
            envelopes_received: s.received.envelopes(),
            envelopes_received_again: s.envelopes_received_again,
            transactions_lost,
            envelopes_lost,
            batches_delivered: b.delivered,
            batches_redelivered: b.redelivered,
            batches_nacked: b.nacked,
            batches_processed: b.processed,
            batches_processed_again: b.processed_again,
            batches_dropped: b.dropped,
            batch_acks_refused: b.acks_refused,
            snapshot_envelopes_processed: s.snapshot_envelopes,
            snapshot_markers_delivered: m.delivered,
            snapshot_markers_redelivered: m.redelivered,
            snapshot_markers_nacked: m.nacked,
            snapshot_markers_processed: m.processed,
            snapshot_markers_processed_again: m.processed_again,
            snapshot_markers_dropped: m.dropped,
            snapshot_marker_acks_refused: m.acks_refused,
            consumer_reattaches: s.reattaches,
            out_of_order_ack_rounds: s.out_of_order_ack_rounds,
            transactions_skipped: s.transactions_skipped,
            checkpoint_lsn: lsn(s.checkpoint),
            sink_kill: s.kill,
            error: s.error.as_deref().map(one_line),
        }
    }
}

impl Summary {
    /// Turns the verdict into FAIL for `why` (added in front of the reason if it already failed).
    fn fail(&mut self, why: String) {
        let why = one_line(&why);
        self.reason = if self.result == "PASS" { why } else { format!("{why}; {}", self.reason) };
        self.result = "FAIL";
    }
}

/// A connection string without its password.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}://…@{}", &url[..scheme], &url[at + 1..]),
        _ => url.split_whitespace().filter(|kv| !kv.starts_with("password=")).collect::<Vec<_>>().join(" "),
    }
}

/// One line of text, whatever the error message held (the summary's reason and errors).
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self;
        writeln!(
            f,
            "input {}: {} transactions, {} changes, {} envelopes published to each of {} sinks, {} bad lines skipped",
            s.input, s.transactions_published, s.changes_published, s.envelopes_published, s.sink_count,
            s.bad_lines_skipped,
        )?;
        if s.transactions_discarded > 0 || s.changes_discarded > 0 {
            writeln!(
                f,
                "lost to bad lines: {} transactions discarded whole, {} changes",
                s.transactions_discarded, s.changes_discarded
            )?;
        }
        match &s.output_dir {
            Some(dir) => write!(f, "output {dir}/<sink>.ndjson")?,
            None => write!(f, "output discarded")?,
        }
        writeln!(
            f,
            "; chaos {}, slow sink {}; {:.3} s, {} changes/s",
            yes_no(s.chaos),
            yes_no(s.slow_sink),
            s.elapsed_seconds,
            s.changes_per_second,
        )?;
        if s.chunks_published > 0 {
            writeln!(
                f,
                "large transactions: {} chunks published before their last batch",
                s.chunks_published
            )?;
        }
        writeln!(
            f,
            "last commit LSN {}, final watermark LSN {}, stream idle {}",
            lsn_text(&s.last_commit_lsn),
            lsn_text(&s.final_watermark_lsn),
            yes_no(s.stream_idle),
        )?;
        if s.slot_confirmed_lsn.is_some() {
            writeln!(
                f,
                "slot confirmed at LSN {}, slot lag {} bytes, {} reconnects, {} heartbeats",
                lsn_text(&s.slot_confirmed_lsn),
                s.slot_lag_bytes.map_or_else(|| "-".to_owned(), |l| l.to_string()),
                s.reconnects.unwrap_or(0),
                s.heartbeats.unwrap_or(0),
            )?;
        }
        writeln!(
            f,
            "backfills: {} requests served, {} snapshot envelopes published",
            s.backfill_requests_served, s.snapshot_envelopes_published,
        )?;
        writeln!(
            f,
            "all sinks: {} batches redelivered, {} envelopes received again, {} transactions lost, {} envelopes lost",
            s.batches_redelivered, s.envelopes_received_again, s.transactions_lost, s.envelopes_lost,
        )?;
        for k in &s.per_sink {
            if let Some(d) = &k.sink_kill {
                let at = |p: Option<Position>| p.map_or_else(|| "none".to_owned(), |p| p.to_string());
                writeln!(
                    f,
                    "sink {} killed holding {} unacked batches at acked LSN {}: watermark at most {} while down (other sinks acked up to {}), {} batches redelivered after the re-attach",
                    k.name,
                    d.held_unacked,
                    at(d.acked_at_death),
                    at(d.max_watermark_while_down),
                    at(d.others_acked_while_down),
                    d.redelivered_after_reattach,
                )?;
            }
            writeln!(
                f,
                "sink {}: acked LSN {}, {} bytes written, {} consumer re-attaches, {} out-of-order ack rounds",
                k.name,
                lsn_text(&k.acked_lsn),
                k.bytes_written,
                k.consumer_reattaches,
                k.out_of_order_ack_rounds,
            )?;
            writeln!(
                f,
                "  transactions: {} received, {} lost; their envelopes: {} received, {} received again, {} lost",
                k.transactions_received,
                k.transactions_lost,
                k.envelopes_received,
                k.envelopes_received_again,
                k.envelopes_lost,
            )?;
            writeln!(
                f,
                "  batches: {} delivered ({} redelivered), {} nacked, {} processed ({} again), {} dropped, {} acks refused",
                k.batches_delivered,
                k.batches_redelivered,
                k.batches_nacked,
                k.batches_processed,
                k.batches_processed_again,
                k.batches_dropped,
                k.batch_acks_refused,
            )?;
            writeln!(
                f,
                "  snapshot: {} envelopes processed; markers: {} delivered ({} redelivered), {} nacked, {} processed ({} again), {} dropped, {} acks refused",
                k.snapshot_envelopes_processed,
                k.snapshot_markers_delivered,
                k.snapshot_markers_redelivered,
                k.snapshot_markers_nacked,
                k.snapshot_markers_processed,
                k.snapshot_markers_processed_again,
                k.snapshot_markers_dropped,
                k.snapshot_marker_acks_refused,
            )?;
            if k.checkpoint_lsn.is_some() {
                writeln!(
                    f,
                    "  durable: checkpoint LSN {}, {} transactions already applied before a restart skipped",
                    lsn_text(&k.checkpoint_lsn),
                    k.transactions_skipped
                )?;
            }
            if let Some(e) = &k.error {
                writeln!(f, "  error: {e}")?;
            }
        }
        if let Some(e) = &s.ingest_error {
            writeln!(f, "ingest error: {e}")?;
        }
        writeln!(f, "{}: {}", s.result, s.reason)
    }
}
