//! Ingest speed on the bundled capture (`data/wal2json-sample.jsonl.gz`, gunzipped in memory
//! first: 60,412 lines, 27 MB, 48,373 changes), as changes per second, side by side in one
//! group so that the ratios come from one run on this shared machine:
//!
//! - `bare_parse/*`: a bare loop parsing each line into a value tree and dropping it (sonic-rs,
//!   the reader's parser; serde_json for reference), and sonic-rs validating each line without
//!   building anything (`LazyValue`: the floor of any validating parse).
//! - `reader`: the wal2json reader ([`TransactionBuilder::push_line`] over the same lines): the
//!   batches with their ids and documents, chunks of 10,000 changes as the example makes them.
//! - `pipeline_discard_3_sinks`: what `pipeline --discard` does — the reader over the capture's
//!   bytes, every batch published to three lanes (capacity 1024) whose sink threads receive,
//!   count and ack (the stream built and the threads started in each iteration).
//!
//! The goal: `pipeline_discard_3_sinks` within 1.3x of `bare_parse/sonic_rs_value`. Every row
//! runs on mimalloc, the pipeline example's allocator.
//!
//! `cargo bench -p lanestream-postgres --bench ingest -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::io::Read;
use std::thread;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lanestream::{LaneItem, MemoryStream};
use lanestream_postgres::wal2json::{TransactionBuilder, Wal2JsonReader};

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

/// The reader over `bytes`, every batch published to `sinks` lanes whose threads count and ack.
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
            thread::spawn(move || {
                let mut envelopes = 0u64;
                while let Some(delivery) = consumer.recv().expect("recv") {
                    if let LaneItem::Batch(batch) = delivery.item() {
                        envelopes += batch.envelopes.len() as u64;
                    }
                    delivery.ack().expect("ack");
                }
                envelopes
            })
        })
        .collect();
    let mut producers: Vec<_> = lanes.iter().map(|l| l.producer().expect("producer")).collect();
    let builder = TransactionBuilder::new().with_max_batch_changes(Some(10_000));
    for batch in Wal2JsonReader::new(bytes).with_builder(builder) {
        let item = LaneItem::Batch(batch.expect("the capture parses"));
        for p in &mut producers {
            p.publish(item.clone()).expect("publish");
        }
    }
    producers.iter().for_each(|p| p.close());
    threads.into_iter().map(|t| t.join().expect("sink thread")).sum()
}

fn ingest(c: &mut Criterion) {
    let capture = Capture::load();
    let lines: Vec<&[u8]> = Capture::lines(&capture.bytes).collect();
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

criterion_group!(benches, ingest);
criterion_main!(benches);
