//! The ingest side: the harness's source for the library's driver (the wal2json file or the live slot, through the library's `FileSource` / `LiveSource`), counting what it hands over for the progress bar and the checks, skipping bad lines (--skip-bad-lines), and holding the end back until the --chaos sinks' backfills were asked.

use lanestream_postgres::pipeline::{
    FileSource, FileSourceError, SinkStart, Source, SourceItem, SourceStart,
};

use crate::prelude::*;

/// Where the ingest reads: a wal2json file (or stdin), or a live slot.
pub(crate) enum Input {
    File(Box<FileSource<Wal2JsonReader<Box<dyn BufRead + Send>>>>),
    Live(Box<LiveSource>),
}

/// Opens the input: `-` is stdin; gzip is recognised by its magic bytes.
pub(crate) fn open_input(path: &Path, preload: bool) -> Result<Box<dyn BufRead + Send>, BoxError> {
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

/// What the source has handed to the driver so far. Statistics only: written by the ingest
/// (the driver's thread) and read by the progress bar with Relaxed; the summary reads them after
/// joining that thread, which orders them.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) transactions: AtomicU64,
    /// Unpositioned chunks of large transactions.
    pub(crate) chunks: AtomicU64,
    pub(crate) changes: AtomicU64,
    pub(crate) envelopes: AtomicU64,
    pub(crate) bad_lines: AtomicU64,
    /// Transactions discarded whole because of bad lines (`--skip-bad-lines`), and their changes
    /// (bad lines included).
    pub(crate) transactions_discarded: AtomicU64,
    pub(crate) changes_discarded: AtomicU64,
    /// Live mode: the source's backfill progress per table
    /// ([`LiveSource::backfill_progress`]), as of the last snapshot item handed over (a copy of
    /// the source's own counts for the progress bars; empty when no backfill was asked).
    pub(crate) backfill: Mutex<Vec<BackfillProgress>>,
}

/// An input error, as the summary shows it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct InputError(pub(crate) String);

/// The harness's source: the input, and what it handed over.
pub(crate) struct HarnessSource {
    pub(crate) input: Input,
    pub(crate) counters: Arc<Counters>,
    pub(crate) args: Args,
    bad_shown: u32,
    /// Envelopes of the chunks handed over of the transaction being read.
    chunk_envelopes: u32,
    /// Every positioned batch handed over: (position, envelope count, its chunks' included).
    pub(crate) published: Vec<(u64, u32)>,
    /// Live mode: from each transaction's commit to its positioned batch decoded, before the
    /// publish (the source's share of the commit → ack latency).
    pub(crate) commit_to_decode: CommitLatency,
    /// --chaos: every sink asks one backfill; the end waits (at most 30 s) until they were asked.
    expected_backfills: u64,
    backfills_asked: u64,
    end_deadline: Option<Instant>,
}

impl HarnessSource {
    pub(crate) fn new(input: Input, args: &Args, counters: Arc<Counters>, expected_backfills: u64) -> Self {
        HarnessSource {
            input,
            counters,
            args: args.clone(),
            bad_shown: 0,
            chunk_envelopes: 0,
            published: Vec::new(),
            commit_to_decode: CommitLatency::new(),
            expected_backfills,
            backfills_asked: 0,
            end_deadline: None,
        }
    }

    pub(crate) fn builder(args: &Args) -> Result<TransactionBuilder, BoxError> {
        let max = (args.max_batch_changes > 0).then_some(args.max_batch_changes);
        let mut builder = TransactionBuilder::new().with_max_batch_changes(max);
        for (table, columns) in key_columns(&args.key_columns)? {
            builder.set_key_columns(&table.0, &table.1, Some(columns));
        }
        Ok(builder)
    }

    /// The last transaction handed over.
    pub(crate) fn last_commit(&self) -> Option<Position> {
        self.published.last().map(|&(p, _)| Position(p))
    }

    /// Counts a bad line skipped (--skip-bad-lines), or says why the input cannot go on.
    fn bad_line(&mut self, e: &Wal2JsonError) -> Result<(), InputError> {
        if !(self.args.skip_bad_lines && e.is_recoverable()) {
            return Err(InputError(input_error(e, &self.args).to_string()));
        }
        if e.open_transaction_discarded() {
            self.chunk_envelopes = 0; // its chunks are out, but it is lost
        }
        if e.lost_changes() > 0 {
            self.counters.transactions_discarded.fetch_add(1, Ordering::Relaxed);
            self.counters.changes_discarded.fetch_add(e.lost_changes(), Ordering::Relaxed);
        } else {
            self.counters.bad_lines.fetch_add(1, Ordering::Relaxed);
        }
        if self.bad_shown < 10 {
            eprintln!("warning: skipped: {e}");
            self.bad_shown += 1;
        }
        Ok(())
    }

    /// Records a transaction (or a chunk of one) handed over.
    fn handed_over(&mut self, batch: &Batch) {
        let envelopes = u32::try_from(batch.envelopes.len()).unwrap_or(u32::MAX);
        self.counters.changes.fetch_add(batch.changes, Ordering::Relaxed);
        self.counters.envelopes.fetch_add(u64::from(envelopes), Ordering::Relaxed);
        let Some(position) = batch.position else {
            self.counters.chunks.fetch_add(1, Ordering::Relaxed);
            // A chunk of a large transaction (--max-batch-changes): counted at its last batch.
            self.chunk_envelopes = self.chunk_envelopes.saturating_add(envelopes);
            return;
        };
        if let Some(commit) = batch.envelopes.first().and_then(|e| e.built_at_micros) {
            self.commit_to_decode.record(commit, unix_micros_now());
        }
        let envelopes = envelopes.saturating_add(std::mem::take(&mut self.chunk_envelopes));
        self.published.push((position.0, envelopes));
        self.counters.transactions.fetch_add(1, Ordering::Relaxed);
    }
}

impl Source for HarnessSource {
    type Error = InputError;

    fn next(&mut self, timeout: Duration) -> Result<Option<SourceItem>, InputError> {
        loop {
            let next = match &mut self.input {
                Input::File(f) => match f.next(timeout) {
                    Err(FileSourceError::Input(e)) => {
                        self.bad_line(&e)?;
                        continue;
                    }
                    other => other.map_err(|e| InputError(format!("{}: {e}", self.args.input.display()))),
                },
                Input::Live(l) => l.next(timeout).map_err(|e| InputError(e.to_string())),
            }?;
            match &next {
                Some(SourceItem::Change(batch)) => self.handed_over(batch),
                Some(SourceItem::Snapshot { .. }) => {
                    if let (Input::Live(l), Ok(mut progress)) =
                        (&mut self.input, self.counters.backfill.lock())
                    {
                        *progress = l.backfill_progress();
                    }
                }
                Some(SourceItem::End) if self.backfills_asked < self.expected_backfills => {
                    // Every --chaos sink asks its backfill at its first delivery: wait for the ones
                    // not asked yet (bounded), so that none is left behind the closed lanes.
                    let deadline =
                        *self.end_deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs(30));
                    if Instant::now() < deadline {
                        thread::sleep(timeout.min(Duration::from_millis(10)));
                        return Ok(None);
                    }
                    eprintln!(
                        "warning: only {} of {} backfill requests arrived",
                        self.backfills_asked, self.expected_backfills
                    );
                    self.expected_backfills = 0;
                }
                _ => {}
            }
            return Ok(next);
        }
    }

    fn confirm(&mut self, position: Position) -> Result<(), InputError> {
        match &mut self.input {
            Input::File(f) => f.confirm(position).map_err(|e| InputError(e.to_string())),
            Input::Live(l) => l.confirm(position).map_err(|e| InputError(format!("confirm: {e}"))),
        }
    }

    fn backfill(&mut self, request: Request) -> Result<(), InputError> {
        self.backfills_asked += 1;
        match &mut self.input {
            Input::File(f) => f.backfill(request).map_err(|e| InputError(e.to_string())),
            Input::Live(l) => l.backfill(request).map_err(|e| InputError(e.to_string())),
        }
    }

    fn lag_bytes(&mut self) -> Option<u64> {
        match &mut self.input {
            Input::File(_) => None,
            Input::Live(l) => l.lag_bytes(),
        }
    }

    fn start(&mut self, sinks: &[SinkStart<'_>]) -> Result<SourceStart, InputError> {
        match &mut self.input {
            Input::File(f) => f.start(sinks).map_err(|e| InputError(e.to_string())),
            Input::Live(l) => l.start(sinks).map_err(|e| InputError(e.to_string())),
        }
    }
}

/// `--key-columns schema.table=col1,col2` → ((schema, table), columns).
/// (schema, table) and its key columns.
pub(crate) type KeyColumns = ((String, String), Vec<String>);

pub(crate) fn key_columns(specs: &[String]) -> Result<Vec<KeyColumns>, BoxError> {
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

pub(crate) fn input_error(e: &Wal2JsonError, args: &Args) -> BoxError {
    let hint = if e.is_recoverable() { " (use --skip-bad-lines to skip such lines)" } else { "" };
    match &args.source {
        // Line numbers count the lines read from the slot in this run.
        Some(url) => format!("the live source (slot {:?} of {}): {e}{hint}", args.slot, redact(url)).into(),
        None => format!("{}: {e}{hint}", args.input.display()).into(),
    }
}
