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
//! `--discard` — and that the final
//! watermark is the last commit LSN, prints a summary (and writes it as JSON with
//! `--summary-json`), and exits non-zero if either check fails or the input had an error.
//!
//! ```text
//! cargo run --release --example pipeline -- --discard --summary-json target/summary.json
//! cargo run --release --example pipeline -- --chaos --slow-sink
//! pg_recvlogical ... -f - | cargo run --release --example pipeline -- --input -
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
use lanestream::wal2json::{Wal2JsonError, Wal2JsonReader};
use lanestream::{
    AckError, AckHandle, Batch, Envelope, IndexName, Lane, LaneItem, MemoryStream, Op, Position, Producer,
    Request, SinkName, Stream, TryRecvError,
};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const DEFAULT_INPUT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/wal2json-sample.jsonl.gz");
const DEFAULT_OUT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/target/pipeline-out");

/// wal2json (format-version 2) → lanestream → NDJSON sinks, with an at-least-once check.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
struct Args {
    /// wal2json v2 input: a file (gzip is detected), or `-` for stdin.
    #[arg(long, default_value = DEFAULT_INPUT)]
    input: PathBuf,
    /// Number of sinks (lanes).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=256))]
    sinks: u16,
    /// Directory for the sinks' `<sink>.ndjson` files (truncated at start).
    #[arg(long, default_value = DEFAULT_OUT)]
    out: PathBuf,
    /// Do not write anything: sinks only record what they received, then ack.
    #[arg(long)]
    discard: bool,
    /// Slots per lane, in batches.
    #[arg(long, default_value_t = 1024)]
    capacity: usize,
    /// The last sink sleeps this long per batch (see --slow-sink-micros).
    #[arg(long)]
    slow_sink: bool,
    /// How long the slow sink sleeps per batch, in microseconds.
    #[arg(long, default_value_t = 200)]
    slow_sink_micros: u64,
    /// Sinks randomly nack, drop handles, ack out of order, re-attach, and ask for one backfill.
    #[arg(long)]
    chaos: bool,
    /// Seed of the --chaos randomness.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Skip and count malformed input lines instead of stopping at the first one.
    #[arg(long)]
    skip_bad_lines: bool,
    /// Write the summary as a JSON object to this file.
    #[arg(long)]
    summary_json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

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

/// Opens the input: `-` is stdin; gzip is recognised by its magic bytes.
fn open_input(path: &Path) -> Result<Box<dyn BufRead + Send>, BoxError> {
    const BUF: usize = 1 << 20;
    let raw: Box<dyn Read + Send> = if path == Path::new("-") {
        Box::new(io::stdin())
    } else {
        Box::new(File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?)
    };
    let mut reader = BufReader::with_capacity(BUF, raw);
    let head = reader.fill_buf()?;
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(BufReader::with_capacity(BUF, flate2::bufread::MultiGzDecoder::new(reader))))
    } else {
        Ok(Box::new(reader))
    }
}

// ---------------------------------------------------------------------------------------------
// Shared counters, read by the progress bar.

#[derive(Default)]
struct Counters {
    transactions: AtomicU64,
    changes: AtomicU64,
    envelopes: AtomicU64,
    bad_lines: AtomicU64,
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
    /// Per entry of `positions`: the most envelopes one receipt of it held.
    envelopes: Vec<u32>,
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

    /// How many of the `published` (position, envelope count) batches and envelopes were never
    /// received; `published` is in increasing position order.
    fn lost(&self, published: &[(u64, u32)]) -> u64 {
        let mut lost = 0;
        let mut j = 0;
        for &(p, n) in published {
            while self.positions.get(j).is_some_and(|&q| q < p) {
                j += 1;
            }
            let got = if self.positions.get(j) == Some(&p) {
                self.envelopes[j]
            } else {
                lost += 1; // the batch itself
                0
            };
            lost += u64::from(n.saturating_sub(got));
        }
        lost
    }
}

/// What a sink thread did.
#[derive(Default)]
struct SinkReport {
    name: String,
    /// Every positioned batch received at least once, and how many of its envelopes.
    received: Received,
    deliveries: u64,
    redelivered_seen: u64,
    duplicates: u64,
    bytes_written: u64,
    nacks: u64,
    drops: u64,
    reattaches: u64,
    out_of_order_acks: u64,
    detached_acks: u64,
    backfill_requested: bool,
    snapshot_envelopes: u64,
    snapshot_completes: u64,
    error: Option<String>,
    /// When the sink saw the end of its lane.
    finished: Option<Instant>,
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
        }
    }
}

struct Ingest {
    producers: Vec<Producer<LaneItem>>,
    names: Vec<SinkName>,
    requests: lanestream::Consumer<Request>,
    state: Option<State>,
    report: IngestReport,
}

impl Ingest {
    /// Publishes to every lane; `to` restricts it to one lane (snapshot rows).
    fn publish(&mut self, item: LaneItem, to: Option<usize>) -> Result<(), BoxError> {
        for (i, p) in self.producers.iter_mut().enumerate() {
            if to.is_none_or(|t| t == i) {
                p.publish(item.clone()).map_err(|e| format!("publish to {}: {e}", self.names[i]))?;
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
            let Request::Backfill { sink, indexes } = delivery.item().clone();
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
        input: Box<dyn BufRead + Send>,
        args: &Args,
        counters: &Counters,
        expected_backfills: u64,
    ) -> IngestReport {
        let result = self.ingest(input, args, counters, expected_backfills);
        if let Err(e) = result {
            self.report.error = Some(e.to_string());
        }
        // Close every lane: the sinks drain what is queued, then see the end.
        for p in &self.producers {
            p.close();
        }
        counters.ingest_done.store(true, Ordering::Release);
        self.report
    }

    fn ingest(
        &mut self,
        input: Box<dyn BufRead + Send>,
        args: &Args,
        counters: &Counters,
        expected_backfills: u64,
    ) -> Result<(), BoxError> {
        let mut bad_shown = 0;
        for next in Wal2JsonReader::new(input) {
            let batch = match next {
                Ok(batch) => batch,
                Err(e) => {
                    if args.skip_bad_lines && e.is_recoverable() {
                        counters.bad_lines.fetch_add(1, Ordering::Relaxed);
                        if bad_shown < 10 {
                            eprintln!("warning: skipped: {e}");
                            bad_shown += 1;
                        }
                        continue;
                    }
                    return Err(input_error(&e, args));
                }
            };
            if let Some(state) = &mut self.state {
                apply_to_state(state, &batch);
            }
            let position = batch.position.ok_or("wal2json batch without a position")?;
            let (changes, envelopes) = (batch.changes, batch.envelopes.len());
            self.publish(LaneItem::Batch(batch), None)?;
            self.report.published.push((position.0, u32::try_from(envelopes)?));
            self.report.last_commit = Some(position);
            counters.transactions.fetch_add(1, Ordering::Relaxed);
            counters.changes.fetch_add(changes, Ordering::Relaxed);
            counters.envelopes.fetch_add(envelopes as u64, Ordering::Relaxed);
            if self.state.is_some() {
                self.serve_requests(None)?;
            }
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
}

fn input_error(e: &Wal2JsonError, args: &Args) -> BoxError {
    let hint = if e.is_recoverable() { " (use --skip-bad-lines to skip such lines)" } else { "" };
    format!("{}: {e}{hint}", args.input.display()).into()
}

// ---------------------------------------------------------------------------------------------
// Sinks.

struct Sink {
    lane: Lane,
    out: Option<BufWriter<File>>,
    slow: Option<Duration>,
    chaos: Option<StdRng>,
    requests: lanestream::RequestSender,
    report: SinkReport,
    line: Vec<u8>,
}

impl Sink {
    /// Records (and writes) one delivered item; returns whether this was its first receipt.
    fn apply(&mut self, item: &LaneItem, attempt: u32) -> Result<(), BoxError> {
        self.report.deliveries += 1;
        if attempt > 1 {
            self.report.redelivered_seen += 1;
        }
        let batch = match item {
            LaneItem::Batch(b) => b,
            LaneItem::SnapshotComplete { .. } => {
                self.report.snapshot_completes += 1;
                return Ok(());
            }
        };
        match batch.position {
            Some(p) => {
                let envelopes = u32::try_from(batch.envelopes.len())?;
                self.report.duplicates += self.report.received.record(p.0, envelopes);
            }
            None => self.report.snapshot_envelopes += batch.envelopes.len() as u64,
        }
        if let Some(out) = &mut self.out {
            for e in batch.envelopes.iter() {
                self.line.clear();
                write_ndjson(&mut self.line, e)?;
                out.write_all(&self.line)?;
                self.report.bytes_written += self.line.len() as u64;
            }
            out.flush()?; // flushed before the ack
        }
        if let Some(d) = self.slow {
            thread::sleep(d);
        }
        Ok(())
    }

    fn ack(&mut self, handle: AckHandle<LaneItem>) {
        if let Err(AckError::Detached) = handle.ack() {
            // A re-attach took it back first: it is redelivered to the new consumer (L8).
            self.report.detached_acks += 1;
        }
    }

    fn run(mut self) -> SinkReport {
        if let Err(e) = self.consume() {
            self.report.error = Some(e.to_string());
        }
        self.report.finished = Some(Instant::now());
        self.report
    }

    fn consume(&mut self) -> Result<(), BoxError> {
        let mut consumer = self.lane.reattach();
        let mut held: Vec<AckHandle<LaneItem>> = Vec::new();
        loop {
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
                        self.ack_held(&mut held);
                        continue;
                    }
                    Err(_detached) => {
                        self.ack_held(&mut held);
                        consumer = self.lane.reattach();
                        continue;
                    }
                }
            };
            let attempt = delivery.attempt();
            let Some(rng) = self.chaos.as_mut() else {
                self.apply(delivery.item(), attempt)?;
                let handle = delivery.into_handle();
                self.ack(handle);
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
                self.report.nacks += 1;
                delivery.nack(); // redelivered before anything new (L6)
                continue;
            }
            self.apply(delivery.item(), attempt)?;
            let handle = delivery.into_handle();
            if drop_after {
                self.report.drops += 1;
                drop(handle); // dropping an unacked handle nacks it: a duplicate will follow
            } else {
                held.push(handle);
            }
            if reattach {
                // Re-attach while holding deliveries: their acks below may land or be refused
                // with Detached (then they come again to the new consumer).
                self.report.reattaches += 1;
                consumer = self.lane.reattach();
                self.ack_held(&mut held);
            } else if held.len() >= hold_limit {
                self.ack_held(&mut held);
            }
        }
    }

    /// Acks the held deliveries in a random order (L5: any order is fine).
    fn ack_held(&mut self, held: &mut Vec<AckHandle<LaneItem>>) {
        if let Some(rng) = self.chaos.as_mut() {
            held.shuffle(rng);
            if held.windows(2).any(|w| w[0].sequence() > w[1].sequence()) {
                self.report.out_of_order_acks += 1;
            }
        }
        for h in held.drain(..) {
            self.ack(h);
        }
    }

    /// Asks once for a backfill of the first index this sink sees.
    fn request_backfill(&mut self, item: &LaneItem) -> Result<(), BoxError> {
        let LaneItem::Batch(b) = item else { return Ok(()) };
        let Some(e) = b.envelopes.first() else { return Ok(()) };
        let request = Request::Backfill { sink: self.lane.name().clone(), indexes: vec![e.index.clone()] };
        self.requests.publish(request).map_err(|e| format!("backfill request: {e}"))?;
        self.report.backfill_requested = true;
        Ok(())
    }
}

/// `{"position":"X/Y","index":…,"id":…,"op":…,"document":<the row JSON or null>}\n`
fn write_ndjson(line: &mut Vec<u8>, e: &Envelope) -> Result<(), BoxError> {
    line.extend_from_slice(b"{\"position\":");
    match e.position {
        Some(p) => write!(line, "\"{p}\"")?,
        None => line.extend_from_slice(b"null"),
    }
    write!(line, ",\"index\":\"{}\",\"id\":", e.index)?;
    serde_json::to_writer(&mut *line, &e.id)?;
    line.extend_from_slice(b",\"op\":");
    serde_json::to_writer(&mut *line, &e.op)?; // `Op`'s own serde name: "upsert", ...
    line.extend_from_slice(b",\"document\":");
    if e.document.is_empty() {
        line.extend_from_slice(b"null");
    } else {
        line.extend_from_slice(&e.document); // already JSON (the wal2json reader validated it)
    }
    line.extend_from_slice(b"}\n");
    Ok(())
}

// ---------------------------------------------------------------------------------------------

fn lsn(p: Option<Position>) -> serde_json::Value {
    p.map_or(serde_json::Value::Null, |p| p.to_string().into())
}

fn run(args: &Args) -> Result<bool, BoxError> {
    let names = sink_names(args.sinks);
    let stream = MemoryStream::builder()
        .capacity(args.capacity)
        .request_capacity(usize::from(args.sinks).max(1) * 2)
        .sinks(names.iter().cloned())
        .build()?;
    let lanes: Vec<Lane> = names.iter().map(|n| stream.lane(n)).collect::<Result<_, _>>()?;
    let input = open_input(&args.input)?;
    if !args.discard {
        std::fs::create_dir_all(&args.out)
            .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    }

    let counters = Arc::new(Counters::default());
    let started = Instant::now();

    // Sinks first, so that they are attached before anything is published.
    let mut sink_threads = Vec::new();
    for (i, lane) in lanes.iter().enumerate() {
        let out = if args.discard {
            None
        } else {
            let path = args.out.join(format!("{}.ndjson", lane.name()));
            let file = File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
            Some(BufWriter::with_capacity(1 << 16, file))
        };
        let sink = Sink {
            lane: lane.clone(),
            out,
            slow: (args.slow_sink && i + 1 == lanes.len())
                .then(|| Duration::from_micros(args.slow_sink_micros)),
            chaos: args.chaos.then(|| StdRng::seed_from_u64(args.seed.wrapping_add(i as u64))),
            requests: stream.requests().sender(),
            report: SinkReport { name: lane.name().to_string(), ..SinkReport::default() },
            line: Vec::with_capacity(4096),
        };
        sink_threads
            .push(thread::Builder::new().name(format!("sink-{}", lane.name())).spawn(move || sink.run())?);
    }

    let ingest = Ingest {
        producers: lanes.iter().map(Lane::producer).collect::<Result<_, _>>()?,
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

    let ingest = ingest_thread.join().map_err(|_| "the ingest thread panicked")?;
    let sinks: Vec<SinkReport> = sink_threads
        .into_iter()
        .map(|t| t.join().map_err(|_| "a sink thread panicked"))
        .collect::<Result<_, _>>()?;
    // Up to the last sink's end, not the progress loop's next tick.
    let ended = sinks.iter().filter_map(|s| s.finished).max().unwrap_or_else(Instant::now);
    let elapsed = ended.duration_since(started).as_secs_f64();

    // Every sink must have received every positioned batch and every envelope at least once.
    let mut lost = 0u64;
    for s in &sinks {
        let sink_lost = s.received.lost(&ingest.published);
        if sink_lost > 0 {
            eprintln!("error: sink {} never received {sink_lost} batches/envelopes", s.name);
        }
        lost += sink_lost;
    }
    let final_watermark = stream.watermark();
    let redeliveries: u64 = lanes.iter().map(|l| l.stats().redelivered).sum();
    let duplicates: u64 = sinks.iter().map(|s| s.duplicates).sum();
    let transactions = counters.transactions.load(Ordering::Relaxed);
    let changes = counters.changes.load(Ordering::Relaxed);
    let envelopes = counters.envelopes.load(Ordering::Relaxed);
    let changes_per_sec = if elapsed > 0.0 { changes as f64 / elapsed } else { 0.0 };

    let sink_json: Vec<serde_json::Value> = sinks
        .iter()
        .zip(&lanes)
        .map(|(s, l)| {
            let st = l.stats();
            serde_json::json!({
                "name": s.name, "deliveries": s.deliveries, "redelivered": st.redelivered,
                "duplicates": s.duplicates, "bytes_written": s.bytes_written, "nacks": s.nacks,
                "drops": s.drops, "reattaches": s.reattaches, "out_of_order_acks": s.out_of_order_acks,
                "detached_acks": s.detached_acks, "snapshot_envelopes": s.snapshot_envelopes,
                "snapshot_completes": s.snapshot_completes, "acked": lsn(st.acked), "error": s.error,
            })
        })
        .collect();
    let summary = serde_json::json!({
        "input": args.input.display().to_string(),
        "sinks": args.sinks,
        "discard": args.discard,
        "chaos": args.chaos,
        "slow_sink": args.slow_sink,
        "transactions": transactions,
        "changes": changes,
        "envelopes": envelopes,
        "bad_lines": counters.bad_lines.load(Ordering::Relaxed),
        "final_watermark": lsn(final_watermark),
        "last_commit_lsn": lsn(ingest.last_commit),
        "redeliveries": redeliveries,
        "duplicates": duplicates,
        "lost": lost,
        "backfills_served": ingest.backfills_served,
        "snapshot_envelopes": ingest.snapshot_envelopes,
        "elapsed_seconds": elapsed,
        "changes_per_sec": changes_per_sec,
        "idle": stream.is_idle(),
        "error": ingest.error,
        "per_sink": sink_json,
    });

    // The summary goes to stdout; a closed stdout (e.g. `| head`) is not an error of the run.
    let mut stdout = io::stdout().lock();
    let _ = writeln!(
        stdout,
        "{transactions} transactions, {changes} changes, {envelopes} envelopes -> {} sinks{} in {elapsed:.3}s: {changes_per_sec:.0} changes/s",
        args.sinks,
        if args.discard { " (discarded)".to_owned() } else { format!(" ({})", args.out.display()) },
    );
    let _ = writeln!(
        stdout,
        "last commit {}, final watermark {}, redeliveries {redeliveries}, duplicates {duplicates}, lost {lost}, bad lines {}",
        lsn(ingest.last_commit),
        lsn(final_watermark),
        counters.bad_lines.load(Ordering::Relaxed),
    );
    for s in &sinks {
        let _ = writeln!(
            stdout,
            "  {}: {} deliveries, {} redelivered, {} duplicates, {} bytes, nacks {}, drops {}, re-attaches {}, out-of-order ack rounds {}, detached acks {}, snapshot rows {}",
            s.name, s.deliveries, s.redelivered_seen, s.duplicates, s.bytes_written, s.nacks, s.drops,
            s.reattaches, s.out_of_order_acks, s.detached_acks, s.snapshot_envelopes,
        );
    }
    if args.chaos {
        let _ = writeln!(
            stdout,
            "  backfills served: {} ({} snapshot rows)",
            ingest.backfills_served, ingest.snapshot_envelopes
        );
    }
    if let Some(path) = &args.summary_json {
        let text = serde_json::to_string_pretty(&summary)?;
        std::fs::write(path, text + "\n").map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }

    let mut ok = true;
    if let Some(e) = &ingest.error {
        eprintln!("error: {e}");
        ok = false;
    }
    for s in &sinks {
        if let Some(e) = &s.error {
            eprintln!("error: sink {}: {e}", s.name);
            ok = false;
        }
    }
    if lost != 0 {
        eprintln!("error: {lost} changes were lost");
        ok = false;
    }
    if final_watermark != ingest.last_commit {
        eprintln!(
            "error: final watermark {} is not the last commit LSN {}",
            lsn(final_watermark),
            lsn(ingest.last_commit)
        );
        ok = false;
    }
    Ok(ok)
}
