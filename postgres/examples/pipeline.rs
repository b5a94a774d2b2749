//! The main job on the pipeline library: the bundled capture of PostgreSQL changes (wal2json
//! format-version 2, `data/wal2json-sample.jsonl.gz`) through a `MemoryStream` into three sinks,
//! checked against the input.
//!
//! ```text
//! cargo run --release -p lanestream-postgres --example pipeline [-- --input FILE] [--out DIR | --discard]
//! ```
//!
//! Each sink is a [`DurableNdjson`] writing `<out>/<sink>.ndjson` (by default the workspace's
//! `target/pipeline-out`; fsync and checkpoint before each ack), or with `--discard` a sink that
//! only counts. The check reads the input again on its own (plain JSON, not the crate's reader):
//! every transaction's changes must be in every sink (read back from the files), and the final
//! watermark must be the input's last commit LSN. The last line is `PASS: ...` or `FAIL: ...`, and
//! so is the exit status. The harness with chaos, kill switches, the live source and the Redis
//! roles is the `lanestream-pipeline` binary (`cargo run --release -p lanestream-postgres --bin
//! lanestream-pipeline -- --help`).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lanestream::{LaneItem, MemoryStream, Position, Stream};
use lanestream_postgres::ndjson::DurableNdjson;
use lanestream_postgres::pipeline::{FileSource, Pipeline, Sink};
use lanestream_postgres::wal2json::TransactionBuilder;

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

    fn commit(&mut self) -> Result<(), Self::Error> {
        let mut counts = self.counts.lock().expect("a counting sink panicked");
        for (p, n) in self.staged.drain(..) {
            *counts.entry(p).or_default() += n;
        }
        Ok(())
    }

    fn checkpoint(&self) -> Option<Position> {
        None
    }
}

fn open(path: &Path) -> Result<Box<dyn BufRead + Send>, BoxError> {
    let mut file = BufReader::new(std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?);
    if file.fill_buf()?.starts_with(&[0x1f, 0x8b]) {
        return Ok(Box::new(BufReader::new(flate2::bufread::MultiGzDecoder::new(file))));
    }
    Ok(Box::new(file))
}

/// The input read on its own: changes (I/U/D/T) per commit LSN, in commit order.
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
    let (mut input, mut out, mut discard) =
        (root.join("data/wal2json-sample.jsonl.gz"), Some(root.join("target/pipeline-out")), false);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--input" => input = PathBuf::from(args.next().ok_or("--input FILE")?),
            "--out" => out = Some(PathBuf::from(args.next().ok_or("--out DIR")?)),
            "--discard" => discard = true,
            other => {
                return Err(format!("unknown argument {other:?} (--input FILE, --out DIR, --discard)").into())
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
    let report = pipeline.run(&mut FileSource::new(open(&input)?, TransactionBuilder::new()))?;
    let elapsed = started.elapsed().as_secs_f64();

    let expected = expected(&input)?;
    let (changes, last) =
        (expected.iter().map(|&(_, n)| n).sum::<u64>(), expected.last().map(|&(p, _)| Position(p)));
    println!("input: {} ({} transactions, {changes} changes)", input.display(), expected.len());
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
