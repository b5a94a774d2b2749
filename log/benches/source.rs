//! `LogSource` (the log feeding the lanes, run by the pipeline driver) against the loop a user
//! would write without it, in
//! short interleaved rounds (ours, peer, peer, ours, ...), so both sides of each ratio are
//! measured within milliseconds of each other on a shared machine.
//!
//! Every round moves the same in-memory log (N appends of one 256-byte event) into a fresh
//! one-lane `MemoryStream` (capacity 1024) whose sink thread receives and acks every batch:
//! - **source**: `LogSource` run by `lanestream::pipeline::Pipeline` (one batch per append, the
//!   append found through the log's append ends, one envelope per event), timed until the sink
//!   received the last batch (the driver's stop and join after it are not timed);
//! - **hand loop**: a `Subscription` over `Query::All`, each event published as its own batch
//!   (correct here only because every append holds one event; a general loop must also find
//!   where each append ends);
//! - **subscription only**: the same subscription drained with no lanes (the floor: reading the
//!   log alone).
//!
//! Prints, per pair, the median of the per-round ratios (peer time / source time: above 1
//! means the source is faster) and the spread (10th-90th percentile).
//!
//! `cargo bench -p lanestream-log --bench source [-- --rounds N --appends M]`

use lanestream::prelude::*;
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use lanestream::pipeline::Pipeline;
use lanestream::{Batch, Envelope, IndexName, LaneItem, MemoryStream, Position, Stream};
use lanestream_log::{Event, EventLog, LogOptions, LogSource, Query, ReadHandle, TryNextError, WriteHandle};

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn filled_log(appends: u64) -> WriteHandle {
    let log = EventLog::in_memory(LogOptions::default()).unwrap();
    let payload = Bytes::from(vec![7u8; 256]);
    for i in 0..appends {
        log.append(vec![Event::new("T", [format!("k:{}", i % 64)], payload.clone()).unwrap()], None).unwrap();
    }
    log
}

/// A one-lane stream and its sink thread (receives and acks until the lane closes); returns the
/// batches it received.
fn stream_and_sink() -> (MemoryStream, thread::JoinHandle<u64>) {
    let stream = MemoryStream::builder().capacity(1024).sinks(["sink"]).build().unwrap();
    let mut consumer = stream.attach("sink").unwrap();
    let sink = thread::spawn(move || {
        let mut n = 0;
        while let Some(d) = consumer.recv().unwrap() {
            n += 1;
            d.ack().unwrap();
        }
        n
    });
    (stream, sink)
}

fn via_source(log: &ReadHandle, appends: u64) -> Duration {
    let stream = MemoryStream::builder().capacity(1024).sinks(["sink"]).build().unwrap();
    let mut consumer = stream.attach("sink").unwrap();
    let (all_in, all_in_rx) = mpsc::channel();
    let sink = thread::spawn(move || {
        let mut n = 0;
        while let Some(d) = consumer.recv().unwrap() {
            n += 1;
            d.ack().unwrap();
            if n == appends {
                let _ = all_in.send(());
            }
        }
        n
    });
    let start = Instant::now();
    let mut source = LogSource::builder(log.clone()).build(&stream).unwrap();
    let pipeline = Pipeline::new(stream.clone()).tick(Duration::from_millis(1)).drain_timeout(Duration::ZERO);
    let stop = pipeline.stop_handle();
    let driver = thread::spawn(move || pipeline.run(&mut source).unwrap());
    all_in_rx.recv().unwrap();
    let elapsed = start.elapsed();
    // The log stays open (the next round reads it again): stop the driver, then end the lane.
    stop.stop();
    driver.join().unwrap();
    stream.close("sink").unwrap();
    assert_eq!(sink.join().unwrap(), appends);
    elapsed
}

fn via_hand_loop(log: &ReadHandle, appends: u64) -> Duration {
    let (stream, sink) = stream_and_sink();
    let index = IndexName::new("events").unwrap();
    let start = Instant::now();
    let mut producer = stream.fanout().unwrap();
    let mut sub = log.subscribe(Query::All, None);
    loop {
        match sub.try_next_batch() {
            Ok(batch) => {
                for e in batch {
                    let position = Some(Position::from(e.position));
                    let envelope = Envelope {
                        index: index.clone(),
                        id: e.position.to_string(),
                        op: lanestream::Op::Upsert,
                        position,
                        document: e.event.data().clone(),
                        built_at_micros: None,
                        relation: None,
                        old_id: None,
                        unchanged: Vec::new(),
                    };
                    producer
                        .publish(LaneItem::Batch(Batch::new(position, Arc::from(vec![envelope]))))
                        .unwrap();
                }
            }
            Err(TryNextError::Empty) => break,
            Err(e) => panic!("{e}"),
        }
    }
    producer.close();
    assert_eq!(sink.join().unwrap(), appends);
    start.elapsed()
}

fn via_subscription_only(log: &ReadHandle, appends: u64) -> Duration {
    let start = Instant::now();
    let mut sub = log.subscribe(Query::All, None);
    let mut n = 0u64;
    while let Ok(batch) = sub.try_next_batch() {
        n += batch.len() as u64;
    }
    assert_eq!(n, appends);
    start.elapsed()
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

type Run = fn(&ReadHandle, u64) -> Duration;

fn pair(label: &str, rounds: u64, log: &ReadHandle, appends: u64, peer: Run) {
    via_source(log, appends);
    peer(log, appends);
    let mut ratios = Vec::new();
    let (mut ours_total, mut peer_total) = (Duration::ZERO, Duration::ZERO);
    for r in 0..rounds {
        let (o, p) = if r % 2 == 0 {
            let o = via_source(log, appends);
            (o, peer(log, appends))
        } else {
            let p = peer(log, appends);
            (via_source(log, appends), p)
        };
        ours_total += o;
        peer_total += p;
        ratios.push(p.as_secs_f64() / o.as_secs_f64());
    }
    ratios.sort_by(f64::total_cmp);
    let per = |d: Duration| d.as_nanos() as f64 / (rounds * appends) as f64;
    println!(
        "{label:<34} peer/source {:.2}x (p10 {:.2}, p90 {:.2}); source {:.0} ns/append, peer {:.0} ns/append",
        quantile(&ratios, 0.5),
        quantile(&ratios, 0.1),
        quantile(&ratios, 0.9),
        per(ours_total),
        per(peer_total),
    );
}

fn main() {
    let rounds = arg("--rounds", 21);
    let appends = arg("--appends", 20_000);
    let log = filled_log(appends);
    let reader = log.reader();
    println!("LogSource: {appends} appends of one 256-byte event, one lane, {rounds} interleaved rounds");
    pair("vs hand loop (subscription+publish)", rounds, &reader, appends, via_hand_loop);
    pair("vs subscription only (no lanes)", rounds, &reader, appends, via_subscription_only);
    log.close();
}
