//! The main job on the pipeline library: a bundled capture of a real PostgreSQL 15 workload, in
//! the decoder production uses — **pgoutput**, `postgres/benches/data/workload.pgoutput.gz`
//! (inserts, updates with key changes, deletes, a two-table truncate, one large transaction,
//! TOASTed values, every replica identity: `scripts/capture-pgoutput.sh --workload`) — through a
//! `MemoryStream` into three sinks, checked against an independent reading of the same workload:
//! its wal2json capture (`workload.wal2json.jsonl.gz`), read as plain JSON, not by the crate.
//!
//! ```text
//! cargo run --release -p lanestream-postgres --example pipeline [-- --out DIR | --discard]
//!     [--pgoutput FILE --expect WAL2JSON-FILE | --wal2json FILE]
//! ```
//!
//! `--wal2json FILE` runs a wal2json (format-version 2) input instead (the second bundled input:
//! `data/wal2json-sample.jsonl.gz`), checked against itself read as plain JSON.
//!
//! Each sink is a [`DurableNdjson`] writing `<out>/<sink>.ndjson` (by default the workspace's
//! `target/pipeline-out`; fsync and checkpoint before each ack), or with `--discard` a sink that
//! only counts. The check: every transaction's changes must be in every sink (read back from the
//! files), nothing else, and the final watermark must be the last commit LSN. The last line is
//! `PASS: ...` or `FAIL: ...`, and so is the exit status. The harness with chaos, kill switches, the live source and the Redis
//! roles is the `lanestream-pipeline` binary (`cargo run --release -p lanestream-postgres --bin
//! lanestream-pipeline -- --help`).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lanestream::{LaneItem, MemoryStream, Position, Stream};
use lanestream_postgres::batch::TransactionBuilder;
use lanestream_postgres::ndjson::DurableNdjson;
use lanestream_postgres::pipeline::{FileSource, Pipeline, Sink, SinkState};

// The allocator the harness and the benches run on (a dev-dependency of the crate).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
const SINKS: [&str; 3] = ["search", "cache", "archive"];

/// The `--discard` sink: counts the envelopes it committed per transaction (commit position).
struct Counting {
    staged: Vec<(u64, u64)>,
    counts: Arc<Mutex<HashMap<u64, u64>>>,
}

impl Sink for Counting {
    type Error = std::convert::Infallible;

    /// Nothing durable: every run starts from nothing.
    fn state(&mut self) -> Result<Option<SinkState>, Self::Error> {
        Ok(None)
    }

    fn apply(&mut self, items: &[LaneItem]) -> Result<(), Self::Error> {
        for item in items {
            // A transaction, or a chunk of one (its envelopes carry the commit position).
            if let LaneItem::Batch(b) = item {
                if let Some(p) = b.position.or_else(|| b.envelopes.first().and_then(|e| e.position)) {
                    self.staged.push((p.0, b.envelopes.len() as u64));
                }
            }
        }
        Ok(())
    }

    fn commit(&mut self, _state: &SinkState) -> Result<(), Self::Error> {
        let mut counts = self.counts.lock().expect("a counting sink panicked");
        for (p, n) in self.staged.drain(..) {
            *counts.entry(p).or_default() += n;
        }
        Ok(())
    }
}

fn open(path: &Path) -> Result<Box<dyn BufRead + Send>, BoxError> {
    let mut file = BufReader::new(std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?);
    if file.fill_buf()?.starts_with(&[0x1f, 0x8b]) {
        return Ok(Box::new(BufReader::new(flate2::bufread::MultiGzDecoder::new(file))));
    }
    Ok(Box::new(file))
}

/// A wal2json input read on its own: changes (I/U/D/T) per commit LSN, in commit order
/// (transactions without changes too: a pgoutput input has none of those).
fn expected(path: &Path) -> Result<Vec<(u64, u64)>, BoxError> {
    let (mut out, mut changes) = (Vec::new(), 0);
    for line in open(path)?.lines() {
        let v: serde_json::Value = serde_json::from_str(&line?)?;
        match v["action"].as_str() {
            Some("B") => changes = 0,
            Some("I" | "U" | "D" | "T") => changes += 1,
            Some("C") => {
                out.push((Position::from_lsn(v["lsn"].as_str().ok_or("a C without lsn")?)?.0, changes))
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Envelopes per commit position in a sink's NDJSON output (snapshot rows have none).
fn read_back(path: &Path) -> Result<HashMap<u64, u64>, BoxError> {
    let mut counts = HashMap::new();
    let mut text = String::new();
    std::fs::File::open(path)?.read_to_string(&mut text)?;
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line)?;
        if let Some(lsn) = v["position"].as_str() {
            *counts.entry(Position::from_lsn(lsn)?.0).or_default() += 1;
        }
    }
    Ok(counts)
}

fn run() -> Result<bool, BoxError> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/data");
    let (mut pgoutput, mut expect, mut wal2json) =
        (Some(data.join("workload.pgoutput.gz")), data.join("workload.wal2json.jsonl.gz"), None);
    let (mut out, mut discard) = (Some(root.join("target/pipeline-out")), false);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |what: &str| args.next().map(PathBuf::from).ok_or_else(|| format!("{arg} {what}"));
        match arg.as_str() {
            "--pgoutput" => pgoutput = Some(value("FILE")?),
            "--expect" => expect = value("WAL2JSON-FILE")?,
            "--wal2json" | "--input" => {
                wal2json = Some(value("FILE")?);
                pgoutput = None;
            }
            "--out" => out = Some(value("DIR")?),
            "--discard" => discard = true,
            other => {
                return Err(format!(
                    "unknown argument {other:?} (--pgoutput FILE --expect WAL2JSON-FILE, --wal2json FILE, --out DIR, --discard)"
                )
                .into())
            }
        }
    }
    let out = out.filter(|_| !discard);
    let stream = MemoryStream::builder().capacity(1024).sinks(SINKS).build()?;
    let mut pipeline = Pipeline::new(stream.clone());
    let counts: Vec<Arc<Mutex<HashMap<u64, u64>>>> = SINKS.iter().map(|_| Arc::default()).collect();
    for (name, counts) in SINKS.into_iter().zip(&counts) {
        match &out {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                for old in [format!("{name}.ndjson"), format!("{name}.checkpoint")] {
                    let _ = std::fs::remove_file(dir.join(old)); // a fresh run: the input starts over
                }
                let dir = dir.clone();
                pipeline = pipeline.sink(name, move || DurableNdjson::open(&dir, name, Duration::ZERO));
            }
            None => {
                let counts = counts.clone();
                pipeline =
                    pipeline.sink(name, move || Ok(Counting { staged: Vec::new(), counts: counts.clone() }));
            }
        }
    }
    let started = Instant::now();
    let (report, input, expected) = match (&pgoutput, &wal2json) {
        (Some(capture), _) => {
            let report =
                pipeline.run(&mut FileSource::pgoutput(open(capture)?, TransactionBuilder::new()))?;
            // pgoutput sends no transaction without a change of a published table.
            let expected: Vec<(u64, u64)> = expected(&expect)?.into_iter().filter(|&(_, n)| n > 0).collect();
            (
                report,
                format!("{} (pgoutput; expected from {})", capture.display(), expect.display()),
                expected,
            )
        }
        (None, Some(input)) => {
            let report = pipeline.run(&mut FileSource::new(open(input)?, TransactionBuilder::new()))?;
            (report, format!("{} (wal2json)", input.display()), expected(input)?)
        }
        (None, None) => return Err("no input".into()),
    };
    let elapsed = started.elapsed().as_secs_f64();

    let (changes, last) =
        (expected.iter().map(|&(_, n)| n).sum::<u64>(), expected.last().map(|&(p, _)| Position(p)));
    println!("input: {input} ({} transactions, {changes} changes)", expected.len());
    println!(
        "published: {} transactions, {} envelopes in {elapsed:.3} s",
        report.transactions, report.envelopes
    );
    let mut failures = Vec::new();
    for (name, counts) in SINKS.iter().zip(&counts) {
        let got = match &out {
            Some(dir) => read_back(&dir.join(format!("{name}.ndjson")))?,
            None => counts.lock().expect("a counting sink panicked").clone(),
        };
        // A change is one envelope, two for an update that changes the key; each exactly once.
        let wrong =
            expected.iter().filter(|&&(p, n)| !(n..=2 * n).contains(&got.get(&p).copied().unwrap_or(0)));
        let stray = got.keys().filter(|p| expected.binary_search_by_key(*p, |&(q, _)| q).is_err()).count();
        let (wrong, envelopes) = (wrong.count(), got.values().sum::<u64>());
        println!("sink {name}: {envelopes} envelopes; transactions wrong {wrong}, unknown {stray}");
        if wrong > 0 || stray > 0 {
            failures
                .push(format!("sink {name} holds {wrong} transactions wrongly and {stray} not in the input"));
        }
    }
    let watermark = stream.watermark();
    println!("final watermark {}, last commit LSN {}", fmt(watermark), fmt(last));
    if watermark != last || report.confirmed != last {
        failures.push(format!(
            "final watermark {} / confirmed {} is not the last commit LSN {}",
            fmt(watermark),
            fmt(report.confirmed),
            fmt(last)
        ));
    }
    if failures.is_empty() {
        println!("PASS: each of the {} sinks holds all {} transactions' {changes} changes (1 envelope each, 2 for a key-changing update; none beyond), and the final watermark is the last commit LSN", SINKS.len(), expected.len());
    } else {
        println!("FAIL: {}", failures.join("; "));
    }
    Ok(failures.is_empty())
}

fn fmt(p: Option<Position>) -> String {
    p.map_or_else(|| "none".to_owned(), |p| p.to_string())
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            println!("FAIL: {e}");
            ExitCode::FAILURE
        }
    }
}
