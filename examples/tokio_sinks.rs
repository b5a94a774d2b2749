//! Async sinks on tokio: `recv_async`, `publish_async`, and a watermark reader on a timer.
//!
//! Each sink engine is a tokio task that awaits `recv_async`, "applies" the batch (a short
//! `tokio::time::sleep`, slower for one sink) and acks. The ingest engine is a task too: it awaits
//! `publish_async`, which waits without blocking a worker thread while a lane is full. A third
//! kind of task reads the watermark on a `tokio::time::interval` and prints it whenever it moves,
//! until it reaches the last published position. The lanes need no runtime of their own: the
//! async forms work on any executor.
//!
//! Exits non-zero if the watermark does not reach the last position within 10 seconds, if it
//! ever goes backwards, or if a sink misses a batch.
//!
//! ```text
//! cargo run --example tokio_sinks
//! ```

use lanestream::prelude::*;
use std::process::ExitCode;
use std::time::Duration;

use lanestream::{Batch, LaneItem, MemoryStream, Position, Stream};
use tokio::time::{interval, sleep, timeout};

const BATCHES: u64 = 40;
const LAST: Position = Position(BATCHES);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    // Capacity 8: the ingest task runs ahead of the sinks and then waits (asynchronously).
    let stream = MemoryStream::builder().capacity(8).sinks(["search", "cache"]).build()?;

    // Sink engines: one task per lane.
    let mut sinks = Vec::new();
    for (i, lane) in stream.lanes().enumerate() {
        let mut consumer = lane.attach()?;
        let apply_time = Duration::from_millis(1 + 2 * i as u64); // the second sink is slower
        sinks.push(tokio::spawn(async move {
            let mut received = 0u64;
            while let Some(delivery) = consumer.recv_async().await.expect("not detached") {
                sleep(apply_time).await; // apply the batch
                received += 1;
                delivery.ack().expect("not detached");
            }
            received
        }));
    }

    // The ingest engine: one batch per transaction (positions 1, 2, ...), published to every lane.
    let mut fanout = stream.fanout()?;
    let ingest = tokio::spawn(async move {
        for n in 1..=BATCHES {
            let batch = LaneItem::Batch(Batch::new(Some(Position(n)), Vec::new().into()));
            fanout.publish_async(batch).await.expect("lanes open, positions increase");
        }
        fanout.close(); // the sinks drain, then recv_async gives None
    });

    // The watermark reader: what the source may confirm, polled every 10 ms.
    let reader_stream = stream.clone(); // a clone is the same stream (a reference count)
    let reader = tokio::spawn(async move {
        let mut tick = interval(Duration::from_millis(10));
        let mut seen = None;
        loop {
            tick.tick().await;
            let watermark = reader_stream.watermark();
            assert!(watermark >= seen, "the watermark went backwards: {watermark:?} < {seen:?}");
            if watermark != seen {
                let lag: Vec<u64> = reader_stream.lanes().map(|l| l.stats().lag()).collect();
                println!(
                    "watermark {} (unacked per lane: {lag:?})",
                    watermark.map_or("none".into(), |p| p.0.to_string())
                );
                seen = watermark;
            }
            if watermark == Some(LAST) {
                return watermark;
            }
        }
    });

    let watermark = match timeout(Duration::from_secs(10), reader).await {
        Ok(joined) => joined?,
        Err(_) => {
            eprintln!("FAILED: the watermark did not reach {} in 10 s: {:?}", LAST.0, stream.watermark());
            return Ok(ExitCode::FAILURE);
        }
    };
    ingest.await?;
    let mut received = Vec::new();
    for sink in sinks {
        received.push(sink.await?);
    }
    println!("sinks received {received:?} batches");
    if watermark == Some(LAST) && received.iter().all(|&n| n == BATCHES) && stream.is_idle() {
        println!("ok: the watermark reached the last position");
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("FAILED: watermark {watermark:?}, received {received:?}, idle {}", stream.is_idle());
        Ok(ExitCode::FAILURE)
    }
}
