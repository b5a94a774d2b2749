//! The log feeding a Redis stream through the pipeline driver: `LogSource` is a source of the
//! one driver (`lanestream::pipeline::Pipeline`), so it feeds any stream backend, a broker's
//! included. On a redis-server of the test's own (`appendonly yes`, a unix socket in a temp dir;
//! the root crate's `tests/redis/support/server.rs`), two sink engines of the driver apply every
//! append once, in order, and one of them gets a backfill it asked for on the request lane,
//! answered from the log's index with `publish_to` and acked after its `SnapshotComplete` (R2).
//!
//! Without `redis-server` on PATH the test says SKIPPED and passes, but under `CI=true`, where it
//! fails.

#[allow(dead_code)]
#[path = "../../tests/redis/support/server.rs"]
mod server;

use std::thread;
use std::time::{Duration, Instant};

use lanestream::pipeline::{MemorySink, Pipeline};
use lanestream::{IndexName, LaneItem, Position, RedisStream, Request, RequestPublisher, SinkName, Stream};
use lanestream_log::{Event, EventLog, LogOptions, LogSource};

/// Appends `n` appends of one to three events; returns the head.
fn append(log: &lanestream_log::WriteHandle, n: u64, from: u64) -> u64 {
    let mut head = 0;
    for i in from..from + n {
        let events =
            (0..1 + i % 3).map(|k| Event::untagged("T", format!("{i}-{k}").into_bytes()).unwrap()).collect();
        head = log.append(events, None).unwrap().last.get();
    }
    head
}

#[test]
fn the_log_feeds_a_redis_stream_through_the_driver_and_serves_a_backfill() {
    let Some(server) = server::Server::start() else { return };
    let stream = RedisStream::builder(&server.url, "log-source")
        .capacity(8)
        .request_capacity(4)
        .sinks(["search", "cache"])
        .build()
        .unwrap();
    let log = EventLog::in_memory(LogOptions::default()).unwrap();
    // More appends than a lane holds: the driver waits for the sinks' acks over Redis.
    let first = append(&log, 20, 0);
    let mut source = LogSource::builder(log.reader()).build(&stream).unwrap();
    let (search, cache) = (MemorySink::default(), MemorySink::default());
    let pipeline = Pipeline::new(stream.clone())
        .sink("search", {
            let r = search.clone();
            move || Ok::<_, std::convert::Infallible>(r.clone())
        })
        .sink("cache", {
            let r = cache.clone();
            move || Ok::<_, std::convert::Infallible>(r.clone())
        });
    // A guard: a wedged pipeline stops (and fails the assertions) instead of hanging the test.
    let stop = pipeline.stop_handle();
    thread::spawn(move || {
        thread::sleep(Duration::from_secs(60));
        stop.stop();
    });
    let runner = thread::spawn(move || {
        let report = pipeline.run(&mut source);
        (report, source.stats().clone())
    });
    assert_eq!(
        stream.wait_watermark(Position(first), Some(Instant::now() + Duration::from_secs(30))),
        Some(Position(first)),
        "every append acked by both sinks"
    );
    // `search` asks for a backfill of the default index (every event) on the request lane; the
    // log goes on, then closes: the driver serves the request, drains and closes the lanes.
    let events = IndexName::new("events").unwrap();
    stream
        .request_sender()
        .publish(Request::backfill(SinkName::new("search").unwrap(), vec![events.clone()]))
        .unwrap();
    let head = append(&log, 10, 20);
    log.close();
    let (report, stats) = runner.join().unwrap();
    let report = report.unwrap();
    assert!(!report.stopped, "the guard stopped it: {report:?}");
    assert_eq!((report.transactions, report.skipped), (30, 0));
    assert_eq!((report.backfills_served, stats.backfills), (1, 1));
    assert_eq!(report.confirmed, Some(Position(head)));
    assert_eq!(stream.watermark(), Some(Position(head)));

    let positions = |r: &MemorySink| -> Vec<u64> {
        r.applied().iter().filter_map(|i| i.position()).map(|p| p.0).collect()
    };
    let appends: Vec<u64> = (1..=head)
        .filter(|p| {
            log.reader().append_at(lanestream_log::LogPosition::new(*p).unwrap()).unwrap().last.get() == *p
        })
        .collect();
    assert_eq!(appends.len(), 30);
    for r in [&search, &cache] {
        assert_eq!(positions(r), appends, "every append applied once, in order");
    }
    // `search`: the snapshot is every event up to an append handed over before the request,
    // at least the first twenty, then its SnapshotComplete.
    let applied = search.applied().clone();
    let mut rows = Vec::new();
    for item in &applied {
        if let LaneItem::Batch(b) = item {
            if b.position.is_none() {
                rows.extend(b.envelopes.iter().map(|e| e.id.parse::<u64>().unwrap()));
            }
        }
    }
    assert!(rows.len() as u64 >= first && rows.iter().copied().eq(1..=rows.len() as u64), "{rows:?}");
    assert_eq!(
        applied
            .iter()
            .filter(|i| **i == LaneItem::SnapshotComplete { indexes: vec![events.clone()] })
            .count(),
        1
    );
    assert!(cache.applied().iter().all(|i| i.position().is_some()), "`cache` got no snapshot");
    drop(stream);
    drop(server);
}
