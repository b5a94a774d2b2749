//! The log feeding the lanes (`lanestream_log::LogSource`, a source of the pipeline driver): one
//! append = one batch on every lane, exactly once and in order; a restarted source resumes after
//! the stream's watermark without publishing anything twice or losing anything; backfills
//! answered from the index. The tests' consumers are the sinks; the driver runs on a thread
//! ([`drive`]: until what the test waits for is published, then a stop, which leaves the lanes
//! open).

use crate::log_support;
use lanestream::prelude::*;

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use lanestream::pipeline::Pipeline;
use lanestream::{
    Consumer, IndexName, LaneItem, MemoryStream, Op, Position, Request, SinkName, Stream, TryRecvError,
};
use lanestream_log::{
    Event, EventLog, LogOptions, LogPosition, LogSource, PositionRange, Query, SourceError, WriteHandle,
};
use log_support::{drive, ev, ev_data, pos, spawn_sinks, spawn_source};

fn index(name: &str) -> IndexName {
    IndexName::new(name).unwrap()
}

fn memory_log() -> WriteHandle {
    EventLog::in_memory(LogOptions::default()).unwrap()
}

/// Takes every item queued on `consumer` now, acking each.
fn take_all(consumer: &mut Consumer<LaneItem>) -> Vec<LaneItem> {
    let mut out = Vec::new();
    loop {
        match consumer.try_recv() {
            Ok(d) => {
                out.push(d.item().clone());
                d.ack().unwrap();
            }
            Err(TryRecvError::Empty | TryRecvError::Closed) => return out,
            Err(e) => panic!("{e}"),
        }
    }
}

/// The last position published on `sink`'s lane, as a number.
fn last_published(stream: &MemoryStream, sink: &str) -> Option<u64> {
    stream.stats(sink).unwrap().last_published.map(|p| p.0)
}

/// The positions of the live batches among `items`.
fn live_positions(items: &[LaneItem]) -> Vec<u64> {
    items.iter().filter_map(|i| i.position()).map(|p| p.0).collect()
}

/// Checks that `batch` is exactly the append `range` of `log` with the default index: one
/// envelope per event, id = the event's position, the payload shared with the log (not copied).
fn assert_is_append(log: &WriteHandle, item: &LaneItem, range: PositionRange) {
    let LaneItem::Batch(batch) = item else { panic!("expected a batch, got {item:?}") };
    assert_eq!(batch.position, Some(Position(range.last.get())));
    assert_eq!(batch.changes, range.len());
    assert_eq!(batch.envelopes.len() as u64, range.len());
    for (envelope, p) in batch.envelopes.iter().zip(range.iter()) {
        let event = log.reader().get(p).unwrap().unwrap().event;
        assert_eq!(envelope.index.as_str(), "events");
        assert_eq!(envelope.id, p.get().to_string());
        assert_eq!(envelope.op, Op::Upsert);
        assert_eq!(envelope.position, batch.position);
        assert_eq!(envelope.document, *event.data());
        assert_eq!(envelope.document.as_ptr(), event.data().as_ptr(), "the payload is shared, not copied");
    }
}

#[test]
fn every_appended_event_reaches_every_lane_exactly_once_in_order() {
    every_appended_event_reaches_every_lane();
}

fn every_appended_event_reaches_every_lane() {
    let log = memory_log();
    // Small lanes: the source waits on full lanes (backpressure) while the sinks run.
    let stream = MemoryStream::builder().capacity(3).sinks(["search", "cache", "archive"]).build().unwrap();
    let source = spawn_source(&log.reader(), &stream);
    let sinks = spawn_sinks(&stream, |item| Some(item.clone()));
    let writers = 4;
    let barrier = Arc::new(Barrier::new(writers));
    let ranges: Vec<PositionRange> = (0..writers)
        .map(|w| {
            let (log, barrier) = (log.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                (0..150)
                    .map(|i| {
                        let n = 1 + (i + w) % 3;
                        let events = (0..n)
                            .map(|k| ev_data("T", &[&format!("w:{w}")], format!("{w}-{i}-{k}")))
                            .collect();
                        log.append(events, None).unwrap()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    log.close();
    let stats = source.join().unwrap();
    let mut ranges = ranges;
    ranges.sort_by_key(|r| r.first);
    let head = ranges.last().unwrap().last;
    assert_eq!(stats.appends, ranges.len() as u64);
    assert_eq!(stats.events, head.get());
    for sink in sinks {
        let got = sink.join().unwrap();
        assert_eq!(got.len(), ranges.len(), "one batch per append, no more, no fewer");
        for (item, range) in got.iter().zip(&ranges) {
            assert_is_append(&log, item, *range);
        }
    }
    assert_eq!(stream.watermark(), Some(Position(head.get())));
    assert!(stream.is_idle());
}

#[test]
fn indexes_are_named_queries_an_event_in_several_gets_an_envelope_in_each() {
    let log = memory_log();
    let stream = MemoryStream::builder().capacity(8).sinks(["projection"]).build().unwrap();
    let mut sink = stream.attach("projection").unwrap();
    let source = LogSource::builder(log.reader())
        .index(index("courses"), Query::types(["CourseDefined"]))
        .index(index("course_3"), Query::tags(["course:3"]))
        .build(&stream)
        .unwrap();
    log.append(vec![ev("CourseDefined", &["course:3"]), ev("CourseDefined", &["course:4"])], None).unwrap();
    log.append(vec![ev("Unrelated", &[])], None).unwrap();
    let (source, _) = drive(&stream, source, || last_published(&stream, "projection") == Some(3));
    assert_eq!(source.stats().appends, 2);
    let items = take_all(&mut sink);
    let LaneItem::Batch(first) = &items[0] else { panic!() };
    let envelopes: Vec<(&str, &str)> =
        first.envelopes.iter().map(|e| (e.index.as_str(), e.id.as_str())).collect();
    assert_eq!(envelopes, [("courses", "1"), ("course_3", "1"), ("courses", "2")]);
    assert_eq!(first.changes, 2, "changes counts the append's events");
    // An event no index matches: its append still gets a positioned batch (I2).
    let LaneItem::Batch(second) = &items[1] else { panic!() };
    assert_eq!((second.position, second.changes, second.envelopes.len()), (Some(Position(3)), 1, 0));
    assert_eq!(stream.watermark(), Some(Position(3)));
}

/// Appends `n` single-event appends; returns their ranges.
fn append_n(log: &WriteHandle, n: usize) -> Vec<PositionRange> {
    (0..n).map(|i| log.append(vec![ev_data("T", &[], format!("{i}"))], None).unwrap()).collect()
}

#[test]
fn a_restarted_source_resumes_after_the_watermark_publishing_nothing_twice_and_losing_nothing() {
    restarted_source_resumes();
}

fn restarted_source_resumes() {
    let log = memory_log();
    let stream = MemoryStream::builder().capacity(16).sinks(["fast", "slow"]).build().unwrap();
    let (mut fast, mut slow) = (stream.attach("fast").unwrap(), stream.attach("slow").unwrap());
    append_n(&log, 3);
    log.append(vec![ev("T", &[]), ev("T", &[])], None).unwrap(); // positions 4..=5: one batch
    let mut acked: BTreeMap<&str, Vec<u64>> = BTreeMap::new();

    // Source #1 publishes four batches (3 single-event appends, one of two events).
    {
        let source = LogSource::builder(log.reader()).build(&stream).unwrap();
        let (source, _) = drive(&stream, source, || last_published(&stream, "fast") == Some(5));
        assert_eq!(source.stats().appends, 4);
        // `fast` acks everything, `slow` only the first two; the rest stays in its lane.
        acked.insert("fast", live_positions(&take_all(&mut fast)));
        let mut slow_acked = Vec::new();
        for _ in 0..2 {
            let d = slow.try_recv().unwrap();
            slow_acked.push(d.position().unwrap().0);
            d.ack().unwrap();
        }
        let held = slow.try_recv().unwrap(); // delivered, then the sink crashes with it
        assert_eq!(held.position(), Some(Position(3)));
        drop(held);
        acked.insert("slow", slow_acked);
    } // the source stops (crashes): the driver's fan-out is dropped
    assert_eq!(stream.watermark(), Some(Position(2)));

    // The log goes on without a source.
    append_n(&log, 2); // positions 6 and 7

    // Source #2 starts after the watermark (2). The `slow` lane still holds 3 and 5 (one
    // released, one queued), the `fast` lane acked them; both lack 6 and 7.
    let source = LogSource::builder(log.reader()).build(&stream).unwrap();
    assert_eq!(source.position(), Some(pos(2)));
    // The appends ending at 3, 5 (each skipped: the lanes hold them), 6 and 7.
    let (source, report) = drive(&stream, source, || last_published(&stream, "slow") == Some(7));
    assert_eq!(source.stats().appends, 4);
    assert_eq!((report.skipped, report.transactions), (2, 2));
    let mut slow = stream.reattach("slow").unwrap(); // the slow sink restarts too
    for (sink, consumer) in [("fast", &mut fast), ("slow", &mut slow)] {
        acked.get_mut(sink).unwrap().extend(live_positions(&take_all(consumer)));
    }
    for (sink, positions) in &acked {
        assert_eq!(positions, &[1, 2, 3, 5, 6, 7], "{sink}: every batch acked exactly once, in order");
        let stats = stream.stats(sink).unwrap();
        assert_eq!(stats.published, 6, "{sink}: nothing published twice");
    }
    assert_eq!(stream.watermark(), Some(Position(7)));
    assert!(stream.is_idle());
}

#[test]
fn a_new_stream_starts_after_the_position_given() {
    let log = memory_log();
    let ranges = append_n(&log, 5);
    let stream = MemoryStream::builder().capacity(16).sinks(["search"]).build().unwrap();
    let mut sink = stream.attach("search").unwrap();
    // The stream is new (watermark None); the sink's durable checkpoint says 3.
    let source = LogSource::builder(log.reader()).after(Some(pos(3))).build(&stream).unwrap();
    drive(&stream, source, || last_published(&stream, "search") == Some(5));
    let items = take_all(&mut sink);
    assert_eq!(live_positions(&items), [4, 5]);
    assert_is_append(&log, &items[0], ranges[3]);
    // Without a position and with no watermark: from the first event.
    let stream = MemoryStream::builder().capacity(16).sinks(["search"]).build().unwrap();
    let mut sink = stream.attach("search").unwrap();
    let source = LogSource::builder(log.reader()).build(&stream).unwrap();
    drive(&stream, source, || last_published(&stream, "search") == Some(5));
    assert_eq!(live_positions(&take_all(&mut sink)), [1, 2, 3, 4, 5]);
}

#[test]
fn a_start_that_is_no_append_end_or_beyond_the_head_is_refused() {
    let log = memory_log();
    log.append(vec![ev("T", &[]), ev("T", &[]), ev("T", &[])], None).unwrap();
    let stream = MemoryStream::builder().capacity(4).sinks(["search"]).build().unwrap();
    let err = LogSource::builder(log.reader()).after(Some(pos(2))).build(&stream).unwrap_err();
    assert!(
        matches!(&err, SourceError::NotAnAppendEnd { after, append }
            if after.get() == 2 && append.first.get() == 1 && append.last.get() == 3),
        "{err:?}"
    );
    let err = LogSource::builder(log.reader()).after(Some(pos(9))).build(&stream).unwrap_err();
    assert!(
        matches!(&err, SourceError::StartBeyondHead { after, head } if after.get() == 9 && head.map(LogPosition::get) == Some(3)),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "cannot start after position 9: the log's head is 3");
    // A lane holding a batch the log does not have: a stream fed by another log.
    stream
        .fanout()
        .unwrap()
        .publish(LaneItem::Batch(lanestream::Batch::new(Some(Position(10)), Arc::from(vec![]))))
        .unwrap();
    let err = LogSource::builder(log.reader()).after(None).build(&stream).unwrap_err();
    assert!(
        matches!(&err, SourceError::LaneAhead { sink, last_published: Position(10), .. } if sink.as_str() == "search"),
        "{err:?}"
    );
    // A refused build leaves nothing claimed (a build claims nothing: the driver does).
    let stream = MemoryStream::builder().capacity(4).sinks(["search"]).build().unwrap();
    let _ = LogSource::builder(log.reader()).after(Some(pos(9))).build(&stream).unwrap_err();
    assert!(stream.fanout().is_ok() && stream.attach_requests().is_ok());
}

fn backfill(sink: &str, indexes: &[&str]) -> Request {
    Request::backfill(SinkName::new(sink).unwrap(), indexes.iter().map(|i| index(i)).collect())
}

#[test]
fn backfill_answers_with_the_matching_events_then_snapshot_complete_then_the_live_tail() {
    backfill_answers();
}

fn backfill_answers() {
    let log = memory_log();
    let stream = MemoryStream::builder().capacity(32).sinks(["search", "cache"]).build().unwrap();
    let (mut search, mut cache) = (stream.attach("search").unwrap(), stream.attach("cache").unwrap());
    let source = LogSource::builder(log.reader())
        .index(index("courses"), Query::types(["CourseDefined"]))
        .index(index("subscriptions"), Query::types(["StudentSubscribed"]))
        .snapshot_batch(2)
        .build(&stream)
        .unwrap();
    for c in 0..5 {
        log.append(
            vec![
                ev("CourseDefined", &[&format!("course:{c}")]),
                ev("StudentSubscribed", &[&format!("course:{c}")]),
            ],
            None,
        )
        .unwrap();
    }
    let (source, _) = drive(&stream, source, || last_published(&stream, "search") == Some(10));
    assert_eq!(live_positions(&take_all(&mut search)).len(), 5);
    take_all(&mut cache);
    let watermark = stream.watermark();

    stream.requests().sender().publish(backfill("search", &["courses"])).unwrap();
    let (source, _) = drive(&stream, source, || stream.requests().is_idle());
    assert_eq!((source.stats().backfills, source.stats().appends), (1, 5), "answered, no append");
    log.append(vec![ev("CourseDefined", &["course:9"])], None).unwrap();
    let (source, _) = drive(&stream, source, || last_published(&stream, "search") == Some(11));

    let items = take_all(&mut search);
    // 5 courses in snapshot batches of at most 2, SnapshotComplete, then the live append.
    let mut snapshot_ids = Vec::new();
    for item in &items[..3] {
        let LaneItem::Batch(b) = item else { panic!("{item:?}") };
        assert_eq!(b.position, None, "snapshot batches have no position");
        assert!(b.envelopes.len() <= 2);
        for e in b.envelopes.iter() {
            assert_eq!((e.index.as_str(), e.position), ("courses", None));
            let event = log.reader().get(pos(e.id.parse().unwrap())).unwrap().unwrap().event;
            assert_eq!(event.event_type(), "CourseDefined");
            assert_eq!(e.document, *event.data());
            snapshot_ids.push(e.id.parse::<u64>().unwrap());
        }
    }
    let expected: Vec<u64> = log
        .read(&Query::types(["CourseDefined"]), None, usize::MAX)
        .unwrap()
        .events()
        .iter()
        .map(|s| s.position.get())
        .filter(|p| *p <= 10)
        .collect();
    assert_eq!(snapshot_ids, expected, "the snapshot is every matching event up to the lane's last batch");
    assert_eq!(items[3], LaneItem::SnapshotComplete { indexes: vec![index("courses")] });
    assert_eq!(live_positions(&items[4..]), [11]);
    assert_eq!(items.len(), 5);
    // The cache lane got the live append only; snapshot items never moved the watermark.
    assert_eq!(live_positions(&take_all(&mut cache)), [11]);
    assert!(watermark < stream.watermark());
    assert!(stream.requests().is_idle(), "the request was acked");
    assert_eq!(source.stats().snapshot_rows, 5);
}

/// An index the source does not define has no event: its backfill is answered with its
/// `SnapshotComplete` alone (no rows). A request for a sink the stream has no lane for can never
/// be served: the driver acks it unanswered.
#[test]
fn a_backfill_of_an_unknown_index_gets_no_rows_and_one_for_an_unknown_sink_is_acked_unanswered() {
    let log = memory_log();
    append_n(&log, 2);
    let stream = MemoryStream::builder().capacity(8).sinks(["search"]).build().unwrap();
    let mut search = stream.attach("search").unwrap();
    let source = LogSource::builder(log.reader()).build(&stream).unwrap();
    stream.requests().sender().publish(backfill("search", &["nope"])).unwrap();
    stream.requests().sender().publish(backfill("nobody", &["events"])).unwrap();
    let (source, report) = drive(&stream, source, || {
        stream.requests().is_idle() && last_published(&stream, "search") == Some(2)
    });
    assert_eq!((source.stats().refused, source.stats().snapshot_rows), (1, 0));
    assert_eq!((report.backfills_served, report.requests_refused), (1, 1));
    let items = take_all(&mut search);
    assert_eq!(live_positions(&items), [1, 2], "only the live batches");
    assert!(
        !items.iter().any(|i| matches!(i, LaneItem::Batch(b) if b.position.is_none())),
        "no snapshot rows"
    );
    assert!(items.contains(&LaneItem::SnapshotComplete { indexes: vec![index("nope")] }));
    assert!(stream.requests().is_idle());
    // The default index is `events` (every event).
    stream.requests().sender().publish(backfill("search", &["events"])).unwrap();
    let (source, _) = drive(&stream, source, || stream.requests().is_idle());
    assert_eq!(source.stats().backfills, 2);
    let items = take_all(&mut search);
    let LaneItem::Batch(b) = &items[0] else { panic!() };
    assert_eq!(b.envelopes.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["1", "2"]);
    assert_eq!(items[1], LaneItem::SnapshotComplete { indexes: vec![index("events")] });
}

#[test]
fn the_driver_wakes_for_a_request_and_for_an_append_and_ends_when_the_log_closes() {
    let log = memory_log();
    let stream = MemoryStream::builder().capacity(8).sinks(["search"]).build().unwrap();
    let mut search = stream.attach("search").unwrap();
    let mut source = LogSource::builder(log.reader()).build(&stream).unwrap();
    let pipeline = Pipeline::new(stream.clone());
    let runner = thread::spawn(move || {
        let report = pipeline.run(&mut source);
        (report, source.stats().clone())
    });
    // The source waits with nothing to do; a request wakes the driver.
    stream.requests().sender().publish(backfill("search", &["events"])).unwrap();
    let recv = |c: &mut Consumer<LaneItem>| {
        let d = c.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
        let item = d.item().clone();
        d.ack().unwrap();
        item
    };
    assert_eq!(recv(&mut search), LaneItem::SnapshotComplete { indexes: vec![index("events")] });
    // An append wakes it.
    let range = log.append(vec![Event::untagged("T", &b"x"[..]).unwrap()], None).unwrap();
    assert_is_append(&log, &recv(&mut search), range);
    // Appends committed just before the close still get through; once they are acked the
    // driver closes the lanes and returns.
    append_n(&log, 3);
    log.close();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut rest = Vec::new();
    while let Some(d) = search.recv_deadline(Some(deadline)).unwrap() {
        rest.push(d.position().unwrap().0);
        d.ack().unwrap();
    }
    assert_eq!(rest, [2, 3, 4], "then the end: the driver closed the lane");
    let (report, stats) = runner.join().unwrap();
    assert_eq!((stats.appends, stats.backfills), (4, 1));
    assert_eq!(report.unwrap().confirmed, Some(Position(4)));
}

#[test]
fn append_ends_survive_recovery_so_a_reopened_log_still_feeds_one_batch_per_append() {
    let dir = log_support::temp_dir("source-recovery"); // removed on drop
    let ranges: Vec<PositionRange> = {
        let log = EventLog::open(&dir, LogOptions::default()).unwrap();
        let ranges = [1, 3, 2]
            .iter()
            .map(|n| log.append((0..*n).map(|_| ev("T", &[])).collect(), None).unwrap())
            .collect();
        log.close();
        ranges
    };
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    for r in &ranges {
        for p in r.iter() {
            assert_eq!(log.reader().append_at(p), Some(*r), "position {p} after recovery");
        }
    }
    let stream = MemoryStream::builder().capacity(8).sinks(["search"]).build().unwrap();
    let mut sink = stream.attach("search").unwrap();
    // Position 2 lies inside the second append: not a place a watermark can be.
    assert!(matches!(
        LogSource::builder(log.reader()).after(Some(pos(2))).build(&stream),
        Err(SourceError::NotAnAppendEnd { .. })
    ));
    let source = LogSource::builder(log.reader()).after(Some(pos(1))).build(&stream).unwrap();
    drive(&stream, source, || last_published(&stream, "search") == Some(6));
    let items = take_all(&mut sink);
    assert_eq!(live_positions(&items), [4, 6]);
    assert_is_append(&log, &items[0], ranges[1]);
    assert_is_append(&log, &items[1], ranges[2]);
    log.close();
}
