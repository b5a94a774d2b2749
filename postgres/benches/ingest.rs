//! Ingest speed on the bundled capture (`data/wal2json-sample.jsonl.gz`, gunzipped in memory
//! first: 60,412 lines, 27 MB, 48,373 changes), as changes per second, side by side in one
//! group so that the ratios come from one run on this shared machine:
//!
//! - `bare_parse/*`: a bare loop parsing each line into a value tree and dropping it (sonic-rs,
//!   a SIMD parser, and serde_json, which the reader parses with), and sonic-rs
//!   validating each line without building anything (`LazyValue`: the floor of any validating
//!   parse).
//! - `reader`: the wal2json reader ([`TransactionBuilder::push_line`] over the same lines): the
//!   batches with their ids and documents, chunks of 10,000 changes as the example makes them.
//! - `pipeline_discard_3_sinks`: what `pipeline --discard` does — the reader over the capture's
//!   bytes, every batch published to three lanes (capacity 1024) whose sink threads receive,
//!   count and ack (the stream built and the threads started in each iteration).
//!
//! A second group, `pgoutput_vs_wal2json`, decodes one run of the workload of
//! `scripts/pg-common.sh` captured from one server through both plugins
//! (`benches/data/workload.*.gz`, `scripts/capture-pgoutput.sh --workload`), as changes per
//! second: `pgoutput_decoder` ([`PgOutputDecoder::decode`] over the messages) against
//! `wal2json_reader` (the reader over the lines), both building the same batches (checked before
//! measuring), chunks of 10,000 changes. The goal: the decoder at least 1.5x the reader.
//! `DECODE_CPU=ROUNDS` measures the two by thread CPU time instead (as `INGEST_CPU` below), in
//! ROUNDS rounds, and prints each round's ratio and their median:
//!
//! `DECODE_CPU=5 cargo bench -p lanestream-postgres --bench ingest -- pgoutput_vs_wal2json`
//!
//! The goal was `pipeline_discard_3_sinks` within 1.3x of `bare_parse/sonic_rs_value` (met with
//! the reader's own scanner; with serde_json, which replaced it, about 2.6x). Every row
//! runs on mimalloc, the pipeline example's allocator.
//!
//! `cargo bench -p lanestream-postgres --bench ingest -- --warm-up-time 1 --measurement-time 3`
//!
//! On a shared machine the wall-clock rows drift with what else runs (a thread waiting for a
//! core counts as time). `INGEST_CPU=ROUNDS` (Linux) measures instead, in ROUNDS rounds, each
//! row's *thread CPU time* per pass over the capture (`/proc/thread-self/schedstat`, which does
//! not count waiting): the bare sonic-rs parse, the reader, and the pipeline's producer thread
//! (the reader plus publishing; its sinks run on other threads), and the pipeline's best wall
//! time of 20 passes beside the bare parse's; it prints each round's ratios and their medians:
//!
//! `INGEST_CPU=5 cargo bench -p lanestream-postgres --bench ingest`

use lanestream::prelude::*;
use std::hint::black_box;
use std::io::Read;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lanestream::{LaneItem, MemoryStream, Stream};
use lanestream_postgres::batch::TransactionBuilder;
use lanestream_postgres::pgoutput::PgOutputDecoder;
use lanestream_postgres::wal2json::Wal2JsonReader;

// The pipeline example's allocator, so that the pipeline row measures what the example runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Capture {
    bytes: Vec<u8>,
    changes: u64,
}

impl Capture {
    fn load() -> Capture {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/wal2json-sample.jsonl.gz");
        let file = std::fs::File::open(path).expect("data/wal2json-sample.jsonl.gz");
        let mut bytes = Vec::new();
        flate2::read::GzDecoder::new(file).read_to_end(&mut bytes).expect("gunzip");
        let changes = Capture::lines(&bytes)
            .filter(|l| {
                [&b"\"I\""[..], b"\"U\"", b"\"D\"", b"\"T\""]
                    .iter()
                    .any(|a| l.starts_with(&[b"{\"action\":", *a].concat()))
            })
            .count() as u64;
        Capture { bytes, changes }
    }

    fn lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
        bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty())
    }
}

/// The reader over `bytes`, every batch published to `sinks` lanes whose threads count and ack
/// (in runs, as the pipeline example's sinks do).
/// Returns the envelopes the sinks received, all lanes together.
fn pipeline(bytes: &[u8], sinks: usize) -> u64 {
    let names: Vec<String> = (0..sinks).map(|i| format!("sink_{i}")).collect();
    let stream = MemoryStream::builder()
        .capacity(1024)
        .sinks(names.iter().map(String::as_str))
        .build()
        .expect("stream");
    let lanes: Vec<_> = stream.lanes().collect();
    let threads: Vec<_> = lanes
        .iter()
        .map(|lane| {
            let mut consumer = lane.attach().expect("attach");
            // As the example's sinks: a run of up to `MAX_RUN` batches per receive, one ack.
            thread::spawn(move || {
                let mut envelopes = 0u64;
                while let Some(run) = consumer.recv_run(lanestream::MAX_RUN).expect("recv_run") {
                    for item in &run {
                        if let LaneItem::Batch(batch) = item {
                            envelopes += batch.envelopes.len() as u64;
                        }
                    }
                    run.ack().expect("ack");
                }
                envelopes
            })
        })
        .collect();
    // The stream's one fan-out: each batch written once, read in place by every lane.
    let mut fanout = stream.fanout().expect("fan-out");
    let builder = TransactionBuilder::new().with_max_batch_changes(Some(10_000));
    for batch in Wal2JsonReader::new(bytes).with_builder(builder) {
        fanout.publish(LaneItem::Batch(batch.expect("the capture parses"))).expect("publish");
    }
    fanout.close();
    threads.into_iter().map(|t| t.join().expect("sink thread")).sum()
}

fn gunzip(name: &str) -> Vec<u8> {
    let path = format!("{}/benches/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(file).read_to_end(&mut bytes).expect("gunzip");
    bytes
}

/// The pgoutput capture's messages (each a 4-byte big-endian length, then its bytes).
fn messages(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while let [a, b, c, d, tail @ ..] = rest {
        let (m, tail) = tail.split_at(u32::from_be_bytes([*a, *b, *c, *d]) as usize);
        out.push(m);
        rest = tail;
    }
    out
}

fn decode_all(messages: &[&[u8]]) -> Vec<lanestream::Batch> {
    let mut d = PgOutputDecoder::new(TransactionBuilder::new().with_max_batch_changes(Some(10_000)));
    messages.iter().filter_map(|m| d.decode(m).expect("the capture decodes")).collect()
}

fn read_all(lines: &[&[u8]]) -> Vec<lanestream::Batch> {
    let mut b = TransactionBuilder::new().with_max_batch_changes(Some(10_000));
    lines
        .iter()
        .enumerate()
        .filter_map(|(n, l)| b.push_line(n as u64 + 1, l).expect("the capture reads"))
        .collect()
}

/// pgoutput decode against the wal2json reader on the same changes (see the module docs).
fn decode(c: &mut Criterion) {
    if std::env::var_os("INGEST_CPU").is_some() {
        return;
    }
    let (pg, wj) = (gunzip("workload.pgoutput.gz"), gunzip("workload.wal2json.jsonl.gz"));
    let messages = messages(&pg);
    let lines: Vec<&[u8]> = Capture::lines(&wj).collect();
    // Like for like: the same batches (wal2json also sends the empty, DDL-only transactions),
    // but for the commit times pgoutput records on its envelopes (wal2json input has none).
    let ours = decode_all(&messages);
    let theirs: Vec<_> =
        read_all(&lines).into_iter().filter(|b| b.changes > 0 || !b.envelopes.is_empty()).collect();
    let without_commit_times = |b: &lanestream::Batch| lanestream::Batch {
        envelopes: b
            .envelopes
            .iter()
            .map(|e| lanestream::Envelope { built_at_micros: None, ..e.clone() })
            .collect(),
        ..b.clone()
    };
    assert!(
        ours.iter().all(|b| b.envelopes.iter().all(|e| e.built_at_micros.is_some())),
        "every pgoutput envelope carries its commit time"
    );
    assert_eq!(
        ours.iter().map(without_commit_times).collect::<Vec<_>>(),
        theirs,
        "both captures give the same batches"
    );
    let changes: u64 = ours.iter().map(|b| b.changes).sum();
    if let Some(rounds) = std::env::var_os("DECODE_CPU") {
        let rounds: usize = rounds.to_str().and_then(|r| r.parse().ok()).expect("DECODE_CPU=ROUNDS");
        let mut ratios = Vec::new();
        for round in 0..rounds.max(1) {
            let reader = cpu_ms(&|| {
                black_box(read_all(&lines));
            });
            let decoder = cpu_ms(&|| {
                black_box(decode_all(&messages));
            });
            println!(
                "round {round}: thread CPU per pass over {changes} changes: wal2json reader {reader:.2} ms, \
                 pgoutput decoder {decoder:.2} ms: the decoder {:.3}x the reader's changes/s",
                reader / decoder
            );
            ratios.push(reader / decoder);
        }
        ratios.sort_by(f64::total_cmp);
        println!(
            "median over {} rounds: the pgoutput decoder {:.3}x the wal2json reader's changes/s (thread CPU)",
            ratios.len(),
            ratios[ratios.len() / 2]
        );
        return;
    }
    let mut group = c.benchmark_group("pgoutput_vs_wal2json");
    group.sample_size(10).throughput(Throughput::Elements(changes));
    group.bench_function("wal2json_reader", |b| b.iter(|| black_box(read_all(&lines))));
    group.bench_function("pgoutput_decoder", |b| b.iter(|| black_box(decode_all(&messages))));
    group.finish();
}

fn ingest(c: &mut Criterion) {
    let capture = Capture::load();
    let lines: Vec<&[u8]> = Capture::lines(&capture.bytes).collect();
    if let Some(rounds) = std::env::var_os("INGEST_CPU") {
        let rounds = rounds.to_str().and_then(|r| r.parse().ok()).expect("INGEST_CPU=ROUNDS");
        cpu_time_ratios(&capture, &lines, rounds);
        return;
    }
    let mut group = c.benchmark_group("wal2json_capture");
    group.sample_size(10).throughput(Throughput::Elements(capture.changes));

    group.bench_function("bare_parse/sonic_rs_value", |b| {
        b.iter(|| {
            for line in &lines {
                black_box(sonic_rs::from_slice::<sonic_rs::Value>(line).expect("JSON"));
            }
        })
    });
    group.bench_function("bare_parse/sonic_rs_validate_only", |b| {
        b.iter(|| {
            for line in &lines {
                black_box(sonic_rs::from_slice::<sonic_rs::LazyValue<'_>>(line).expect("JSON"));
            }
        })
    });
    group.bench_function("bare_parse/serde_json_value", |b| {
        b.iter(|| {
            for line in &lines {
                black_box(serde_json::from_slice::<serde_json::Value>(line).expect("JSON"));
            }
        })
    });
    group.bench_function("reader", |b| {
        b.iter(|| {
            let mut builder = TransactionBuilder::new().with_max_batch_changes(Some(10_000));
            for (n, line) in lines.iter().enumerate() {
                black_box(builder.push_line(n as u64 + 1, line).expect("the capture parses"));
            }
        })
    });
    let envelopes = pipeline(&capture.bytes, 3);
    assert_eq!(envelopes % 3, 0);
    assert!(envelopes / 3 >= capture.changes, "every change reached every sink");
    group.bench_function("pipeline_discard_3_sinks", |b| b.iter(|| black_box(pipeline(&capture.bytes, 3))));
    group.finish();
}

/// This thread's CPU time so far, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let stat =
        std::fs::read_to_string("/proc/thread-self/schedstat").expect("/proc/thread-self/schedstat (Linux)");
    stat.split_whitespace().next().and_then(|ns| ns.parse().ok()).expect("schedstat: CPU time in ns")
}

/// `f`'s thread CPU time per call, in ms, over calls for 1.5 s of wall time (after one unmeasured).
fn cpu_ms(f: &dyn Fn()) -> f64 {
    f();
    let (start, cpu) = (Instant::now(), thread_cpu_ns());
    let mut calls = 0u32;
    while start.elapsed() < Duration::from_millis(1500) {
        f();
        calls += 1;
    }
    (thread_cpu_ns() - cpu) as f64 / 1e6 / f64::from(calls)
}

/// `f`'s best wall time of 20 calls, in ms.
fn best_wall_ms(f: &dyn Fn()) -> f64 {
    (0..20)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}

/// The `INGEST_CPU` mode (see the module docs).
fn cpu_time_ratios(capture: &Capture, lines: &[&[u8]], rounds: usize) {
    let bare = || {
        for line in lines {
            black_box(sonic_rs::from_slice::<sonic_rs::Value>(line).expect("JSON"));
        }
    };
    let reader = || {
        let mut builder = TransactionBuilder::new().with_max_batch_changes(Some(10_000));
        for (n, line) in lines.iter().enumerate() {
            black_box(builder.push_line(n as u64 + 1, line).expect("the capture parses"));
        }
    };
    let pipeline = || {
        black_box(pipeline(&capture.bytes, 3));
    };
    let per_s = |ms: f64| capture.changes as f64 / ms / 1e3;
    let mut ratios: [Vec<f64>; 3] = Default::default();
    for round in 0..rounds.max(1) {
        let (b, r, p) = (cpu_ms(&bare), cpu_ms(&reader), cpu_ms(&pipeline));
        let (wall_b, wall_p) = (best_wall_ms(&bare), best_wall_ms(&pipeline));
        println!(
            "round {round}: thread CPU per pass: bare parse {b:.2} ms, reader {r:.2} ms ({:.3}x), \
             pipeline producer {p:.2} ms ({:.3}x, {:.2}M changes/s) | best wall: bare parse {wall_b:.2} ms, \
             pipeline {wall_p:.2} ms ({:.3}x, {:.2}M changes/s)",
            r / b,
            p / b,
            per_s(p),
            wall_p / wall_b,
            per_s(wall_p),
        );
        for (all, ratio) in ratios.iter_mut().zip([r / b, p / b, wall_p / wall_b]) {
            all.push(ratio);
        }
    }
    let median = |all: &mut Vec<f64>| {
        all.sort_by(f64::total_cmp);
        all[all.len() / 2]
    };
    let [reader, producer, wall] = &mut ratios;
    println!(
        "median over {} rounds, as time over the bare parse: reader {:.3}x, pipeline producer {:.3}x (thread CPU), pipeline {:.3}x (best wall)",
        reader.len(),
        median(reader),
        median(producer),
        median(wall),
    );
}

criterion_group!(benches, ingest, decode);
criterion_main!(benches);
