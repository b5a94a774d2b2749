//! Quickstart: the per-item API (the README's usage shows the fast path, runs) as a program.
//!
//! Builds a [`MemoryStream`] with three sinks, runs each sink engine on its own thread (receive,
//! apply, ack, one item at a time), and plays the ingest engine on the main thread: it builds
//! each transaction into one [`Batch`] and publishes it with the stream's fan-out, which writes
//! it once for every lane to read in place. After
//! closing the lanes and joining the sinks it checks that every sink saw every transaction, that
//! the watermark is the last transaction's position and that the stream is idle; if not, it exits
//! non-zero.
//!
//! ```text
//! cargo run --example quickstart
//! ```

use lanestream::prelude::*;
use std::process::ExitCode;
use std::sync::Arc;
use std::thread;

use bytes::Bytes;
use lanestream::{Batch, Envelope, IndexName, LaneItem, MemoryStream, Op, Position, Stream};

const TRANSACTIONS: u64 = 5;

fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let stream = MemoryStream::builder().capacity(4).sinks(["search", "cache", "archive"]).build()?;

    // Sink engines: one thread per lane. `attach()` refuses if the lane already has a consumer
    // (use `reattach()` to take a lane over after a crash).
    let mut sinks = Vec::new();
    for lane in stream.lanes() {
        let mut consumer = lane.attach()?;
        let name = lane.name().clone();
        sinks.push(thread::spawn(move || {
            let mut envelopes = 0;
            // `Ok(None)` once the lane is closed and drained.
            while let Some(delivery) = consumer.recv().expect("nobody re-attaches this lane") {
                if let LaneItem::Batch(batch) = delivery.item() {
                    // "Apply" the batch: a real sink would write to its index here.
                    envelopes += batch.envelopes.len();
                }
                delivery.ack().expect("not detached"); // or nack(), or drop it: redelivered first
            }
            println!("sink {name}: applied {envelopes} envelopes");
            envelopes
        }));
    }

    // The ingest engine: the stream's one fan-out, one batch per transaction, built once.
    let mut fanout = stream.fanout()?;
    let mut last = None;
    for txn in 1..=TRANSACTIONS {
        let position = Position(0x16B_3700 + txn); // the commit LSN, strictly increasing
        let envelope = Envelope {
            index: IndexName::new("public_users")?,
            id: txn.to_string(),
            op: Op::Upsert,
            position: Some(position),
            document: Bytes::from(format!(r#"{{"id":{txn},"name":"user {txn}"}}"#)),
            built_at_micros: None,
            relation: None,
            old_id: None,
            unchanged: Vec::new(),
        };
        let batch = LaneItem::Batch(Batch::new(Some(position), Arc::from(vec![envelope])));
        // Written once, read in place by every lane; waits while a lane is full (capacity 4 here).
        fanout.publish(batch)?;
        last = Some(position);
        println!(
            "published transaction {txn} at {position} (watermark so far: {})",
            show(stream.watermark())
        );
    }

    // Close every lane: the sinks drain what is left, then `recv` returns `Ok(None)`.
    fanout.close();
    let applied: Vec<usize> = sinks.into_iter().map(|t| t.join().expect("sink thread panicked")).collect();

    // What the source may confirm: the last position every sink acked.
    let watermark = stream.watermark();
    println!("watermark: {} (last published: {})", show(watermark), show(last));
    let ok = watermark == last
        && stream.is_idle()
        && applied.iter().all(|&n| n as u64 == TRANSACTIONS)
        && stream.sinks().iter().all(|s| stream.acked(s.as_str()).ok().flatten() == last);
    if ok {
        println!("ok: every sink applied every transaction and the watermark reached the last position");
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("FAILED: watermark {watermark:?}, idle {}, applied {applied:?}", stream.is_idle());
        Ok(ExitCode::FAILURE)
    }
}

fn show(p: Option<Position>) -> String {
    p.map_or_else(|| "none".to_owned(), |p| p.to_string())
}
