//! The ingest thread: reads the input (a wal2json file or the live slot), publishes each batch to every lane, serves the backfill requests (--chaos), confirms the live slot at the watermark.

use crate::prelude::*;

/// Where the ingest reads: a wal2json file (or stdin), or a live slot.
pub(crate) enum Input {
    File(Box<dyn BufRead + Send>),
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

// ---------------------------------------------------------------------------------------------
// Shared counters, read by the progress bar.

/// What the ingest thread has done so far. Statistics only: written by the ingest thread and
/// read by the progress bar and the summary with Relaxed (the summary reads them after joining
/// the ingest thread, which orders them).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) transactions: AtomicU64,
    /// Unpositioned chunks of large transactions published.
    pub(crate) chunks: AtomicU64,
    pub(crate) changes: AtomicU64,
    pub(crate) envelopes: AtomicU64,
    pub(crate) bad_lines: AtomicU64,
    /// Transactions discarded whole because of bad lines (`--skip-bad-lines`), and their changes
    /// (bad lines included).
    pub(crate) transactions_discarded: AtomicU64,
    pub(crate) changes_discarded: AtomicU64,
    /// Live mode: the source's backfill progress per table
    /// ([`LiveSource::backfill_progress`]), as of the last snapshot item published (a copy of
    /// the source's own counts for the progress bars; empty when no backfill was asked).
    pub(crate) backfill: std::sync::Mutex<Vec<BackfillProgress>>,
}

/// What the ingest thread did.
#[derive(Default)]
pub(crate) struct IngestReport {
    /// Every positioned batch published: (position, envelope count).
    pub(crate) published: Vec<(u64, u32)>,
    pub(crate) last_commit: Option<Position>,
    pub(crate) error: Option<String>,
    pub(crate) backfills_served: u64,
    pub(crate) snapshot_envelopes: u64,
    /// Live mode: from each transaction's commit to its positioned batch decoded, before the
    /// publish (the source's share of the commit → ack latency).
    pub(crate) commit_to_decode: CommitLatency,
    /// The live source, handed back for the final confirm.
    pub(crate) source: Option<Box<LiveSource>>,
}

/// The rows the ingest has seen, per index, to answer backfill requests (kept only with --chaos).
pub(crate) type State = HashMap<IndexName, HashMap<String, Bytes>>;

pub(crate) fn apply_to_state(state: &mut State, batch: &Batch) {
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
            other => unreachable!("an op this harness does not know: {other:?}"),
        }
    }
}

pub(crate) struct Ingest {
    pub(crate) stream: MemoryStream,
    pub(crate) stop: lanestream_postgres::pipeline::StopHandle,
    pub(crate) bad_shown: u32,
    /// Envelopes of the chunks published of the transaction being published.
    pub(crate) chunk_envelopes: u32,
    /// The stream's one publisher: each batch written once, read in place by every lane.
    pub(crate) fanout: Fanout,
    pub(crate) names: Vec<SinkName>,
    pub(crate) requests: lanestream::Consumer<Request>,
    pub(crate) state: Option<State>,
    pub(crate) report: IngestReport,
}

impl Ingest {
    /// Publishes to every lane; `to` restricts it to one lane (snapshot rows).
    pub(crate) fn publish(&mut self, item: LaneItem, to: Option<usize>) -> Result<(), BoxError> {
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
    pub(crate) fn serve_requests(&mut self, wait: Option<Duration>) -> Result<u64, BoxError> {
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
            let Request::Backfill { sink, indexes, .. } = delivery.item().clone() else {
                return Err(format!("a request this harness does not serve: {:?}", delivery.item()).into());
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

    pub(crate) fn run(
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
        self.report
    }

    pub(crate) fn builder(args: &Args) -> Result<TransactionBuilder, BoxError> {
        let max = (args.max_batch_changes > 0).then_some(args.max_batch_changes);
        let mut builder = TransactionBuilder::new().with_max_batch_changes(max);
        for (table, columns) in key_columns(&args.key_columns)? {
            builder.set_key_columns(&table.0, &table.1, Some(columns));
        }
        Ok(builder)
    }

    pub(crate) fn ingest(
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
    pub(crate) fn ingest_live(
        &mut self,
        source: &mut LiveSource,
        args: &Args,
        counters: &Counters,
    ) -> Result<(), BoxError> {
        let mut decoder = PgOutputDecoder::new(Self::builder(args)?.with_key_lookup(source.key_lookup()));
        let end = args.end_lsn.as_deref().map(Position::from_lsn).transpose()?;
        let wait = Duration::from_millis(args.poll_interval_ms.max(1));
        source.start()?;
        // The backfill requests being served, in order (each acked after its SnapshotComplete).
        let mut serving: VecDeque<Delivery<Request>> = VecDeque::new();
        while !self.stop.is_stopped() {
            source.confirm(self.stream.watermark())?;
            self.take_backfills(source, &mut serving)?;
            match source.next_item(&mut decoder, wait)? {
                Some(LiveItem::Change(batch)) => {
                    self.handle(Ok(batch), args, counters, Some(&mut *source))?
                }
                Some(LiveItem::Snapshot { sink, item }) => {
                    let lane = self
                        .names
                        .iter()
                        .position(|n| *n == sink)
                        .ok_or_else(|| format!("a backfill for unknown sink {sink}"))?;
                    let complete = matches!(item, LaneItem::SnapshotComplete { .. });
                    if let LaneItem::Batch(b) = &item {
                        self.report.snapshot_envelopes += b.envelopes.len() as u64;
                    }
                    self.publish(item, Some(lane))?;
                    if let Ok(mut progress) = counters.backfill.lock() {
                        *progress = source.backfill_progress();
                    }
                    // Acked only once SnapshotComplete is published (R2).
                    if complete && serving.pop_front().is_some_and(|d| d.ack().is_ok()) {
                        self.report.backfills_served += 1;
                    }
                }
                // --end-lsn: a backfill being served is finished first.
                None if serving.is_empty()
                    && end.is_some_and(|end| source.decoded().is_some_and(|d| d >= end)) =>
                {
                    break
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Live mode: hands the backfill requests the sinks sent to the source (served in order,
    /// interleaved with the stream). A request the source can never serve (an index no
    /// published table has, a table without a primary key) is acked unanswered, with a warning.
    pub(crate) fn take_backfills(
        &mut self,
        source: &mut LiveSource,
        serving: &mut VecDeque<Delivery<Request>>,
    ) -> Result<(), BoxError> {
        loop {
            let delivery = match self.requests.try_recv() {
                Ok(d) => d,
                Err(TryRecvError::Empty | TryRecvError::Closed) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            match source.backfill(delivery.item().clone()) {
                Ok(()) => serving.push_back(delivery),
                Err(e @ LiveError::BackfillRefused { .. }) => {
                    eprintln!("warning: {e}");
                    let _ = delivery.ack();
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Publishes one batch (or counts one bad line). `confirmer`: the live source's, to confirm
    /// the watermark while a full lane keeps the publish waiting.
    pub(crate) fn handle(
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
        let item = LaneItem::Batch(batch);
        if let Some(commit) = commit_micros(&item) {
            self.report.commit_to_decode.record(commit, unix_micros_now());
        }
        match confirmer {
            None => self.publish(item, None)?,
            Some(c) => self.publish_confirming(item, c)?,
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
    pub(crate) fn publish_confirming(
        &mut self,
        mut item: LaneItem,
        confirmer: &mut LiveSource,
    ) -> Result<(), BoxError> {
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

/// The sinks' durable checkpoints in `out` (`<sink>.checkpoint`, first field the last applied
/// commit LSN), for the sinks that have one.
pub(crate) fn sink_checkpoints(out: &Path, names: &[String]) -> Result<Vec<(String, Position)>, BoxError> {
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
