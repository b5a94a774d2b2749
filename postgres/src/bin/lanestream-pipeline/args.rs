//! The command line: `--help`'s text and the flags.

use crate::prelude::*;

/// The workspace root, one level above this crate (the workspace's `postgres/` member): the
/// bundled capture and the default output directory are there.
pub(crate) fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

pub(crate) fn default_input() -> PathBuf {
    workspace_root().join("data").join("wal2json-sample.jsonl.gz")
}

pub(crate) fn default_out() -> PathBuf {
    workspace_root().join("target").join("pipeline-out")
}

/// `--help`'s description (`-h` shows only the first line, from the doc comment of [`Args`]).
pub(crate) const LONG_ABOUT: &str = concat!(
    "wal2json (format-version 2) → lanestream → NDJSON sinks, with an at-least-once check.\n",
    "\n",
    "The lanestream-postgres crate's pipeline harness (the binary lanestream-pipeline). One ingest thread reads PostgreSQL changes in ",
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
    "creates the slot (and the publication, for every table that can be published, if it is missing) for a ",
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
pub(crate) struct Args {
    /// wal2json v2 input: a file (gzip is detected), or `-` for stdin.
    #[arg(long, default_value_os_t = default_input(), conflicts_with = "source")]
    pub(crate) input: PathBuf,
    /// Live mode: stream the logical replication slot --slot (pgoutput plugin) of this server
    /// (`postgres://user:password@host:port/db`, or a libpq key=value string) instead of --input,
    /// and confirm it up to the watermark; runs until SIGTERM/SIGINT or --end-lsn. The sinks
    /// (with --out) are durable: fsync and checkpoint before acking, resume after a restart.
    #[arg(long, value_name = "URL")]
    pub(crate) source: Option<String>,
    /// The logical replication slot of --source.
    #[arg(long, default_value = "lanestream")]
    pub(crate) slot: String,
    /// Create --slot (with the pgoutput plugin) if it does not exist, and before it
    /// --publication if that does not exist (for every table that can be published; refused,
    /// naming them, while a table has no replica identity): for a new pipeline, whose sinks
    /// (--out) hold nothing. A slot created over sinks that hold data (one that was dropped)
    /// is refused and dropped again: what was committed in between is in no slot, and the sinks
    /// need a backfill (remove their outputs: the pipeline backfills new sinks).
    #[arg(long, requires = "source")]
    pub(crate) create_slot: bool,
    /// Live mode: stop once every transaction committed before this LSN (e.g. 0/1D84F00) is
    /// published and acked.
    #[arg(long, value_name = "LSN", requires = "source")]
    pub(crate) end_lsn: Option<String>,
    /// Live mode: the publication naming the tables to stream.
    #[arg(long, default_value = "lanestream", requires = "source")]
    pub(crate) publication: String,
    /// Live mode: how long one wait for the stream lasts before the ingest confirms again and
    /// checks for a stop.
    #[arg(long, default_value_t = 100)]
    pub(crate) poll_interval_ms: u64,
    /// Live mode: how often standby status updates carry the confirmed position to the server
    /// (at most this long after the watermark moves, and at least this often).
    #[arg(long, default_value_t = 1000, requires = "source")]
    pub(crate) status_interval_ms: u64,
    /// Live mode: write a heartbeat (`pg_logical_emit_message`) this often, so that the slot
    /// follows the server's WAL even while nothing of this database changes.
    #[arg(long, value_name = "SECS", requires = "source")]
    pub(crate) heartbeat_secs: Option<u64>,
    /// Live mode: read the publication's tables this often, to find a table that rejoined it
    /// (removed and added again, dropped and created again, its row filter or column list
    /// changed), which every sink then empties and gets backfilled
    /// (`LiveConfig::publication_check`); 0: never.
    #[arg(long, value_name = "MS", default_value_t = 5000, requires = "source")]
    pub(crate) publication_check_ms: u64,
    /// Live mode: rows per chunk of a backfill a sink asks for (each chunk is read between a low
    /// and a high mark in the WAL; also the most a resumed backfill reads again). Default: the
    /// library's, 4096 rows (`lanestream_postgres::backfill::DEFAULT_CHUNK_ROWS`).
    #[arg(long, value_name = "N", requires = "source", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) backfill_chunk_rows: Option<u64>,
    /// Live mode: every sink asks at start for a backfill of these indexes (the live reader's
    /// `schema_table` names, comma separated): their tables' rows are read in key order, in
    /// chunks interleaved with the stream (`lanestream_postgres::backfill`), and published to
    /// each sink's lane. While it runs, a bar per table shows the rows read against the table's
    /// estimate (`pg_class.reltuples`), on stderr when it is a terminal (not with --quiet).
    #[arg(long, value_name = "INDEXES", value_delimiter = ',', requires = "source")]
    pub(crate) backfill: Vec<String>,
    /// What the pipeline does with a sink that starts with no state (a new sink, or one whose
    /// output was removed) on the live source, whose slot resumes mid-stream and whose tables may
    /// hold rows: `backfill` it with every table of the publication (beside the stream), `refuse`
    /// to start, or start it `live-only` (it needs nothing from before: the tables were empty
    /// when the slot was created).
    #[arg(long, value_enum, default_value_t = JoinersArg::Backfill)]
    pub(crate) joiners: JoinersArg,
    /// Live mode: how long to wait for a slot that another client holds before giving up.
    #[arg(long, default_value_t = 30)]
    pub(crate) slot_wait_secs: u64,
    /// Number of sinks (lanes).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub(crate) sinks: u16,
    /// Directory for the sinks' `<sink>.ndjson` files (truncated at start).
    #[arg(long, default_value_os_t = default_out())]
    pub(crate) out: PathBuf,
    /// Do not write anything: sinks only record what they received, then ack.
    #[arg(long)]
    pub(crate) discard: bool,
    /// Read (and decompress) the whole input file into memory before the clock starts, so that
    /// `changes_per_second` measures the pipeline rather than gunzip (which alone takes about as
    /// long as parsing the bundled capture). Files only; the input must fit in memory.
    #[arg(long, conflicts_with = "source")]
    pub(crate) preload: bool,
    /// Slots per lane, in batches.
    #[arg(long, default_value_t = 1024)]
    pub(crate) capacity: usize,
    /// Bounds the bytes held by published batches not yet acked by every sink (documents, ids
    /// and a fixed overhead per envelope, each batch charged once: `StreamBuilder::memory_budget`);
    /// the ingest waits while it is spent, as for a full lane. Default: none (the capacity alone).
    #[arg(long)]
    pub(crate) memory_budget: Option<u64>,
    /// A transaction of more changes than this is published as several batches (chunks); only
    /// the last one carries the commit position. 0: one batch per transaction.
    #[arg(long, default_value_t = lanestream_postgres::live::MAX_BATCH_CHANGES)]
    pub(crate) max_batch_changes: u64,
    /// The last sink sleeps this long per batch (see --slow-sink-micros).
    #[arg(long)]
    pub(crate) slow_sink: bool,
    /// How long the slow sink sleeps per batch, in microseconds.
    #[arg(long, default_value_t = 200)]
    pub(crate) slow_sink_micros: u64,
    /// Sinks fail runs at random (one in 20, never two in a row: the sink engine releases the
    /// run, reopens the sink, re-attaches and gets the run again) and ask for one backfill each
    /// (answered from the rows the file source has seen). File input only.
    #[arg(long, conflicts_with = "source")]
    pub(crate) chaos: bool,
    /// The first sink's engine dies after processing this many batches: its sink fails the run
    /// in hand (applied, not committed, unacked), the engine drops it and the output it wrote
    /// but did not checkpoint; --sink-down-ms later a new instance reopens the output from the
    /// checkpoint and the engine re-attaches to the lane. Its unacked batches must come again, and the
    /// watermark must not pass its last ack meanwhile (both in the summary: the sink's `sink_kill`).
    /// In-process stream only (over Redis, kill a `--role sink` process instead).
    #[arg(long, value_name = "BATCHES", conflicts_with_all = ["chaos", "backend"])]
    pub(crate) kill_sink_after: Option<u64>,
    /// How long the engine killed by --kill-sink-after stays dead, in milliseconds.
    #[arg(long, default_value_t = 1000, requires = "kill_sink_after")]
    pub(crate) sink_down_ms: u64,
    /// Seed of the --chaos randomness.
    #[arg(long, default_value_t = 42)]
    pub(crate) seed: u64,
    /// Skip and count malformed input lines instead of stopping at the first one. A transaction
    /// with a bad line is discarded whole and its changes counted as lost: the run FAILs.
    #[arg(long)]
    pub(crate) skip_bad_lines: bool,
    /// Key columns of a table whose replica identity is an index (`schema.table=col1,col2`;
    /// repeatable). Without it such a table's rows are keyed by every column until its first
    /// identity shows the index, which is an error.
    #[arg(long = "key-columns", value_name = "SCHEMA.TABLE=COLS")]
    pub(crate) key_columns: Vec<String>,
    /// Write the summary as a JSON object to this file.
    #[arg(long)]
    pub(crate) summary_json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Run over the Redis backend at this URL (`redis://host:port`, `redis+unix:///path`), as
    /// separate processes: one `--role` per process (ingest, sink with `--lane`, delete).
    #[arg(long, value_name = "URL", requires = "role")]
    pub(crate) backend: Option<String>,
    /// With --backend: what this process does: `ingest`, `sink` (with --lane), or `delete`.
    #[arg(long, value_enum, requires = "backend")]
    pub(crate) role: Option<crate::redis::Role>,
    /// With --role sink: the lane (sink) this process applies.
    #[arg(long, value_name = "SINK")]
    pub(crate) lane: Option<String>,
    /// With --backend: the Redis stream's name (every process of one pipeline uses the same).
    #[arg(long, default_value = "pipeline")]
    pub(crate) stream_name: String,
    /// With --role ingest: how long to wait for the sinks to ack the last commit LSN.
    #[arg(long, default_value_t = 300)]
    pub(crate) wait_secs: u64,
}

/// `--joiners`: [`Joiners`](lanestream_postgres::pipeline::Joiners).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JoinersArg {
    /// `Joiners::Backfill`.
    Backfill,
    /// `Joiners::Refuse`.
    Refuse,
    /// `Joiners::LiveOnly`.
    LiveOnly,
}

impl From<JoinersArg> for lanestream_postgres::pipeline::Joiners {
    fn from(j: JoinersArg) -> Self {
        match j {
            JoinersArg::Backfill => Self::Backfill,
            JoinersArg::Refuse => Self::Refuse,
            JoinersArg::LiveOnly => Self::LiveOnly,
        }
    }
}
