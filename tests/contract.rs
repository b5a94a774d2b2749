//! The crate's contract (`lanestream::contract`), one test (or a few) per rule, each named after what it shows.
//!
//! Not here: I3's rkyv part (`src/codec.rs` has its own tests), M2 (`tests/alloc.rs`), the
//! detailed drop accounting of M3 (`tests/drops.rs`), the async entry points
//! (`tests/async_waits.rs`) and the long multi-threaded run (`tests/stress.rs`).

mod common;

use std::collections::HashSet;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};
use std::thread;
use std::time::{Duration, Instant};

use common::{
    backfill, batch, complete, drain_closed, drain_try, envelope, pos, shared_envelopes, snapshot, stream,
    tracked, within,
};
use lanestream::{
    AckError, AckHandle, Batch, BuildError, Consumer, Delivery, Envelope, IndexName, Item, LaneItem,
    MemoryStream, NameError, Op, Position, Producer, PublishError, PublishTimeoutError, RecvError,
    RecvTimeoutError, Request, SinkName, Stream, StreamError, TryPublishError, TryRecvError,
};

const WRAP_CAPACITIES: [usize; 5] = [1, 2, 3, 5, 7];

// ----- Items ---------------------------------------------------------------------------------

#[test]
fn i1_position_is_the_batchs_and_none_for_snapshot_rows_and_snapshot_complete() {
    assert_eq!(batch(42).position(), Some(Position(42)));
    assert_eq!(snapshot().position(), None);
    assert_eq!(complete("users").position(), None);
    assert_eq!(Item::position(&backfill("search", "users")), None);
    // The same through a lane: a delivery reports its item's position.
    let s = stream(3, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    for item in [batch(7), snapshot(), complete("users")] {
        p.publish(item).unwrap();
    }
    let got: Vec<_> = (0..3).map(|_| c.try_recv().unwrap()).collect();
    assert_eq!(got.iter().map(|d| d.position()).collect::<Vec<_>>(), [Some(Position(7)), None, None]);
}

#[test]
fn i2_empty_batch_keeps_its_position_and_acking_it_counts() {
    let empty = Batch::new(Some(Position(9)), Vec::new().into());
    assert_eq!((empty.position, empty.changes, empty.envelopes.len()), (Some(Position(9)), 0, 0));
    let s = stream(2, &["search", "cache"]);
    for lane in s.lanes() {
        lane.producer().unwrap().publish(LaneItem::Batch(empty.clone())).unwrap();
        let d = lane.reattach().try_recv().unwrap();
        assert_eq!(d.position(), Some(Position(9)));
        d.ack().unwrap();
        assert_eq!(lane.acked(), Some(Position(9)));
    }
    assert_eq!(s.watermark(), Some(Position(9)));
}

#[test]
fn i3_items_round_trip_through_externally_tagged_snake_case_json() {
    let mut delete = envelope("public_users", "42", Some(5), b"");
    delete.op = Op::Delete;
    let mut truncate = envelope("public_users", "", Some(5), b"");
    truncate.op = Op::Truncate;
    let mut upsert = envelope("public_users", "7", Some(5), br#"{"id":7}"#);
    upsert.built_at_micros = Some(123);
    let envelopes: Arc<[Envelope]> = vec![upsert, delete, truncate].into();
    let item = LaneItem::Batch(Batch::new(Some(Position(5)), envelopes.clone()));
    let json = serde_json::to_value(&item).unwrap();
    assert_eq!(json["batch"]["position"], 5);
    assert_eq!(json["batch"]["changes"], 3);
    let ops: Vec<_> =
        json["batch"]["envelopes"].as_array().unwrap().iter().map(|e| e["op"].clone()).collect();
    assert_eq!(ops, ["upsert", "delete", "truncate"]);
    assert_eq!(json["batch"]["envelopes"][0]["built_at_micros"], 123);
    assert!(json["batch"]["envelopes"][1].get("built_at_micros").is_none(), "None is skipped");
    assert_eq!(serde_json::from_value::<LaneItem>(json).unwrap(), item);

    let snap = LaneItem::Batch(Batch::new(None, envelopes));
    let json = serde_json::to_value(&snap).unwrap();
    assert!(json["batch"]["position"].is_null());
    assert_eq!(serde_json::from_value::<LaneItem>(json).unwrap(), snap);

    let done = LaneItem::SnapshotComplete {
        indexes: vec![IndexName::new("a").unwrap(), IndexName::new("b_2").unwrap()],
    };
    let text = serde_json::to_string(&done).unwrap();
    assert_eq!(text, r#"{"snapshot_complete":{"indexes":["a","b_2"]}}"#);
    assert_eq!(serde_json::from_str::<LaneItem>(&text).unwrap(), done);

    let request = backfill("search", "users");
    let text = serde_json::to_string(&request).unwrap();
    assert_eq!(text, r#"{"backfill":{"sink":"search","indexes":["users"]}}"#);
    assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), request);

    // Reading validates: bad names, unknown or wrongly cased tags are errors.
    for bad in [
        r#"{"backfill":{"sink":"Search","indexes":["users"]}}"#,
        r#"{"backfill":{"sink":"search","indexes":["9users"]}}"#,
        r#"{"Backfill":{"sink":"search","indexes":["users"]}}"#,
        r#"{"snapshotComplete":{"indexes":[]}}"#,
    ] {
        assert!(
            serde_json::from_str::<Request>(bad).is_err() && serde_json::from_str::<LaneItem>(bad).is_err(),
            "{bad} accepted"
        );
    }
}

// ----- Lanes ---------------------------------------------------------------------------------

#[test]
fn l1_sinks_are_fixed_at_build_and_bad_configurations_are_refused() {
    let s = stream(4, &["search", "cache", "archive"]);
    let names: Vec<_> = s.sinks().iter().map(|n| n.as_str()).collect();
    assert_eq!(names, ["search", "cache", "archive"]);
    assert_eq!(s.lanes().map(|l| l.name().as_str().to_owned()).collect::<Vec<_>>(), names);
    assert_eq!(s.lane("nope").unwrap_err(), StreamError::UnknownLane("nope".into()));
    assert!(s.lane("nope").unwrap_err().to_string().contains("nope"));

    let build = |b: lanestream::StreamBuilder| b.build().unwrap_err();
    assert!(matches!(build(MemoryStream::builder().capacity(0).sink("a")), BuildError::ZeroCapacity(_)));
    assert!(matches!(
        build(MemoryStream::builder().request_capacity(0).sink("a")),
        BuildError::ZeroCapacity(_)
    ));
    assert_eq!(
        build(MemoryStream::builder().sinks(["a", "b", "a"])),
        BuildError::DuplicateSink(SinkName::new("a").unwrap())
    );
    assert_eq!(
        build(MemoryStream::builder().sink("Search")),
        BuildError::InvalidSink(NameError::Invalid("Search".into()))
    );
    assert_eq!(build(MemoryStream::builder().sink("")), BuildError::InvalidSink(NameError::Empty));
    assert!(matches!(
        build(MemoryStream::builder().sink("x".repeat(64))),
        BuildError::InvalidSink(NameError::TooLong(_))
    ));
    let e = build(MemoryStream::builder().sinks(["ok", "a-b"]));
    assert!(e.to_string().contains("a-b"), "{e}");
    // The largest valid name is fine.
    assert!(MemoryStream::builder().sink("x".repeat(63)).build().is_ok());
}

#[test]
fn l2_delivery_is_in_publish_order_with_redeliveries_first() {
    let s = stream(7, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    for i in 1..=6 {
        p.publish(batch(i)).unwrap();
    }
    let d1 = c.try_recv().unwrap();
    let d2 = c.try_recv().unwrap();
    let d3 = c.try_recv().unwrap();
    assert_eq!([pos(&d1), pos(&d2), pos(&d3)], [1, 2, 3]);
    d3.nack();
    drop(d1);
    // Both released items come back before 4, lowest sequence first.
    let r1 = c.try_recv().unwrap();
    let r3 = c.try_recv().unwrap();
    assert_eq!([(pos(&r1), r1.attempt()), (pos(&r3), r3.attempt())], [(1, 2), (3, 2)]);
    let rest: Vec<_> = (0..3).map(|_| c.try_recv().unwrap()).collect();
    assert_eq!(rest.iter().map(pos).collect::<Vec<_>>(), [4, 5, 6]);
    assert!(rest.iter().all(|d| d.attempt() == 1));
    assert_eq!(c.try_recv().unwrap_err(), TryRecvError::Empty);
    drop(d2);
}

#[test]
fn l2_wraparound_keeps_publish_order_for_capacities_1_2_3_5_7() {
    for cap in WRAP_CAPACITIES {
        let s = stream(cap, &["search"]);
        let lane = s.lane("search").unwrap();
        let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
        let mut next_pos = 1u64;
        let mut expected = 1u64;
        let mut deliveries = 0u64;
        // Many laps: fill the ring, drain it, nack some, ack in reverse order.
        for lap in 0..60u64 {
            let fill = 1 + (lap as usize % cap);
            for _ in 0..fill {
                p.try_publish(batch(next_pos)).unwrap();
                next_pos += 1;
            }
            let mut held = Vec::new();
            while let Ok(d) = c.try_recv() {
                deliveries += 1;
                if d.attempt() == 1 {
                    assert_eq!(pos(&d), expected, "capacity {cap}, lap {lap}");
                    expected += 1;
                }
                if deliveries % 3 == 0 && d.attempt() == 1 {
                    let again = pos(&d);
                    d.nack();
                    let r = c.try_recv().unwrap();
                    deliveries += 1;
                    assert_eq!((pos(&r), r.attempt()), (again, 2), "capacity {cap}: redelivery comes first");
                    held.push(r);
                } else {
                    held.push(d);
                }
            }
            assert_eq!(held.len(), fill);
            while let Some(d) = held.pop() {
                d.ack().unwrap();
            }
            assert_eq!(lane.acked(), Some(Position(next_pos - 1)), "capacity {cap}, lap {lap}");
            let st = lane.stats();
            assert_eq!((st.capacity, st.queued, st.released, st.in_flight), (cap, 0, 0, 0));
            assert_eq!((st.published, st.acked_items), (next_pos - 1, next_pos - 1));
        }
        assert!(next_pos > 3 * cap as u64, "several laps");
    }
}

#[test]
fn l3_try_publish_on_a_full_lane_hands_the_item_back_with_full() {
    let s = stream(2, &["search"]);
    let lane = s.lane("search").unwrap();
    let mut p = lane.producer().unwrap();
    let env = shared_envelopes(3);
    p.try_publish(batch(1)).unwrap();
    p.try_publish(batch(2)).unwrap();
    match p.try_publish(tracked(Some(3), &env)) {
        Err(TryPublishError::Full(item)) => assert_eq!(item, tracked(Some(3), &env)),
        other => panic!("expected Full, got {other:?}"),
    }
    assert_eq!(Arc::strong_count(&env), 1, "the handed-back item was dropped by us, not kept");
    let st = lane.stats();
    assert_eq!((st.published, st.queued, st.last_published), (2, 2, Some(Position(2))));
    let err = p.publish_timeout(batch(3), Duration::from_millis(20)).unwrap_err();
    assert!(matches!(err, PublishTimeoutError::Timeout(_)));
    assert_eq!(err.into_inner().position(), Some(Position(3)));
}

#[test]
fn l3_publish_on_a_full_lane_waits_until_an_ack_makes_room() {
    let s = stream(1, &["search"]);
    let lane = s.lane("search").unwrap();
    let mut c = lane.reattach();
    let mut p = lane.producer().unwrap();
    p.publish(batch(1)).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let publisher = {
        let done = done.clone();
        thread::spawn(move || {
            p.publish(batch(2)).unwrap();
            done.store(true, Ordering::SeqCst);
        })
    };
    let d1 = c.try_recv().unwrap();
    thread::sleep(Duration::from_millis(50));
    assert!(!done.load(Ordering::SeqCst), "publish returned while the lane was full");
    // A nack does not make room: the item stays in its slot for redelivery.
    d1.nack();
    thread::sleep(Duration::from_millis(20));
    assert!(!done.load(Ordering::SeqCst));
    c.try_recv().unwrap().ack().unwrap();
    within(10, "publish after the ack", move || publisher.join().unwrap());
    assert_eq!(pos(&c.try_recv().unwrap()), 2);
}

#[test]
fn l3_publishing_to_a_closed_lane_hands_the_item_back_with_closed() {
    let s = stream(2, &["search"]);
    let lane = s.lane("search").unwrap();
    let mut p = lane.producer().unwrap();
    p.publish(batch(1)).unwrap();
    p.close();
    assert!(p.is_closed() && lane.stats().closed);
    let env = shared_envelopes(2);
    for result in [
        p.try_publish(tracked(Some(2), &env)),
        p.publish(tracked(Some(2), &env)).map_err(Into::into),
        p.publish_timeout(tracked(Some(2), &env), Duration::from_millis(1)).map_err(|e| {
            assert!(e.is_closed());
            TryPublishError::Closed(e.into_inner())
        }),
    ] {
        match result {
            Err(TryPublishError::Closed(item)) => assert_eq!(item.position(), Some(Position(2))),
            other => panic!("expected Closed, got {other:?}"),
        }
    }
    // Also for a later producer of the same lane.
    drop(p);
    let mut p2 = lane.producer().unwrap();
    assert!(matches!(p2.try_publish(batch(3)), Err(TryPublishError::Closed(_))));
    assert_eq!(Arc::strong_count(&env), 1);
    assert_eq!(lane.stats().published, 1);
}

#[test]
fn l4_regressed_position_is_refused_and_item_handed_back() {
    let s = stream(8, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    p.publish(batch(10)).unwrap();
    let env = shared_envelopes(0);
    for bad in [10, 9, 0] {
        match p.try_publish(tracked(Some(bad), &env)) {
            Err(TryPublishError::PositionRegressed { item, position, last }) => {
                assert_eq!(
                    (item.position(), position, last),
                    (Some(Position(bad)), Position(bad), Position(10))
                );
            }
            other => panic!("position {bad} after 10: {other:?}"),
        }
    }
    // Also through the waiting forms.
    assert!(matches!(p.publish(batch(10)), Err(PublishError::PositionRegressed { .. })));
    // Unpositioned items do not reset the last position.
    p.publish(snapshot()).unwrap();
    assert!(matches!(p.publish(batch(10)), Err(PublishError::PositionRegressed { .. })));
    assert!(matches!(
        p.publish(LaneItem::Batch(Batch::new(Some(Position::RESERVED), Vec::new().into()))),
        Err(PublishError::InvalidPosition(_))
    ));
    p.publish(batch(11)).unwrap();
    assert_eq!(Arc::strong_count(&env), 1, "refused items were handed back, not kept");
    assert_eq!(drain_try(&mut c), [Some(10), None, Some(11)], "nothing refused was enqueued");
    assert_eq!(lane.stats().published, 3);
}

#[test]
fn l5_acked_position_follows_the_contiguous_acked_prefix() {
    let s = stream(5, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    for item in [batch(10), batch(20), snapshot(), batch(30), batch(40)] {
        p.publish(item).unwrap();
    }
    let mut d: Vec<_> = (0..5).map(|_| Some(c.try_recv().unwrap())).collect();
    let mut ack = |i: usize| d[i].take().unwrap().ack().unwrap();
    ack(1);
    assert_eq!(lane.acked(), None, "item 2 acked while 1 is outstanding");
    ack(4);
    assert_eq!(lane.acked(), None);
    assert_eq!(lane.stats().acked_items, 0);
    ack(0);
    assert_eq!(lane.acked(), Some(Position(20)), "prefix = items 1, 2");
    ack(2);
    assert_eq!(lane.acked(), Some(Position(20)), "the snapshot row has no position");
    assert_eq!(lane.stats().acked_items, 3);
    ack(3);
    assert_eq!(lane.acked(), Some(Position(40)));
    assert!(lane.is_idle());
}

#[test]
fn l5_acks_from_other_threads_in_any_order_count() {
    let s = stream(5, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    let mut next = 1;
    for round in 0..40 {
        for _ in 0..5 {
            p.publish(batch(next)).unwrap();
            next += 1;
        }
        let handles: Vec<AckHandle<LaneItem>> = (0..5).map(|_| c.try_recv().unwrap().into_handle()).collect();
        // Each handle acked on its own thread, released in a rotating order.
        let barrier = Arc::new(Barrier::new(5));
        let threads: Vec<_> = handles
            .into_iter()
            .enumerate()
            .map(|(i, h)| {
                let barrier = barrier.clone();
                thread::spawn(move || {
                    barrier.wait();
                    if (i + round) % 2 == 0 {
                        thread::yield_now();
                    }
                    h.ack().unwrap();
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(lane.acked(), Some(Position(next - 1)));
    }
}

#[test]
fn l6_nack_dropped_handle_and_dropped_delivery_each_release_for_redelivery_first() {
    let s = stream(7, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    for i in 1..=6 {
        p.publish(batch(i)).unwrap();
    }
    let (d1, d2, d3) = (c.try_recv().unwrap(), c.try_recv().unwrap(), c.try_recv().unwrap());
    d1.nack();
    let r = c.try_recv().unwrap();
    assert_eq!((pos(&r), r.attempt()), (1, 2), "nack releases");
    drop(d2.into_handle());
    let r2 = c.try_recv().unwrap();
    assert_eq!((pos(&r2), r2.attempt()), (2, 2), "dropping an AckHandle releases");
    drop(d3);
    let r3 = c.try_recv().unwrap();
    assert_eq!((pos(&r3), r3.attempt()), (3, 2), "dropping an un-split Delivery releases");
    // Splitting: dropping the item part releases nothing, dropping the handle part does.
    let (item, handle) = c.try_recv().unwrap().into_parts();
    assert_eq!(item.position(), Some(Position(4)));
    drop(item);
    assert_eq!(pos(&c.try_recv().unwrap()), 5, "the clone of the item is not the delivery");
    // (item 5 was released again just now by the drop of its delivery)
    let r5 = c.try_recv().unwrap();
    assert_eq!((pos(&r5), r5.attempt()), (5, 2));
    drop(handle);
    let r4 = c.try_recv().unwrap();
    assert_eq!((pos(&r4), r4.attempt()), (4, 2));
    for d in [r, r2, r3, r4, r5] {
        d.ack().unwrap();
    }
    let d6 = c.try_recv().unwrap();
    assert_eq!((pos(&d6), d6.attempt()), (6, 1));
    d6.ack().unwrap();
    assert_eq!(lane.acked(), Some(Position(6)));
}

#[test]
fn l6_only_released_items_are_redelivered_and_attempt_counts_deliveries() {
    let s = stream(5, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    for i in 1..=4 {
        p.publish(batch(i)).unwrap();
    }
    let (d1, d2, d3) = (c.try_recv().unwrap(), c.try_recv().unwrap(), c.try_recv().unwrap());
    d2.nack();
    let again = c.try_recv().unwrap();
    assert_eq!(pos(&again), 2);
    assert_eq!(pos(&c.try_recv().unwrap()), 4, "live handles 1 and 3 are not replayed");
    let r4 = c.try_recv().unwrap(); // item 4 was released by the drop just above
    assert_eq!((pos(&r4), r4.attempt()), (4, 2));
    assert_eq!(c.try_recv().unwrap_err(), TryRecvError::Empty);
    // attempt counts every delivery of that item.
    let mut d = again;
    for n in 2..10 {
        assert_eq!(d.attempt(), n);
        assert_eq!(d.into_handle().attempt(), n); // dropped: released again
        d = c.try_recv().unwrap();
    }
    assert_eq!((pos(&d), d.attempt()), (2, 10));
    assert_eq!(lane.stats().redelivered, 10);
    for x in [d1, d, d3, r4] {
        x.ack().unwrap();
    }
    assert!(lane.is_idle());
}

#[test]
fn l7_ack_consumes_the_handle_so_each_delivery_is_acked_at_most_once() {
    // `ack` takes the handle by value (the compile-fail half is in src/send_sync_tests.rs).
    let ack_delivery: fn(Delivery<LaneItem>) -> Result<(), AckError> = Delivery::ack;
    let ack_handle: fn(AckHandle<LaneItem>) -> Result<(), AckError> = AckHandle::ack;
    let s = stream(3, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    p.publish(batch(1)).unwrap();
    p.publish(batch(2)).unwrap();
    ack_delivery(c.try_recv().unwrap()).unwrap();
    let (item, handle) = c.try_recv().unwrap().into_parts();
    ack_handle(handle).unwrap();
    let st = lane.stats();
    assert_eq!((st.acked_items, st.delivered, st.acked), (2, 2, Some(Position(2))));
    // The split-off item is only a value: dropping it now changes nothing.
    drop(item);
    assert_eq!(c.try_recv().unwrap_err(), TryRecvError::Empty);
    assert!(lane.is_idle());
}

#[test]
fn l8_reattach_redelivers_unacked_in_order_and_detaches_old() {
    let s = stream(7, &["search"]);
    let lane = s.lane("search").unwrap();
    let mut p = lane.producer().unwrap();
    let mut c1 = lane.reattach();
    for i in 1..=6 {
        p.publish(batch(i)).unwrap();
    }
    let d: Vec<_> = (0..4).map(|_| c1.try_recv().unwrap()).collect();
    let mut d = d.into_iter();
    let (d1, d2, d3, d4) = (d.next().unwrap(), d.next().unwrap(), d.next().unwrap(), d.next().unwrap());
    d2.ack().unwrap();
    d3.nack();
    let mut c2 = lane.reattach();
    assert!(c1.is_detached() && !c2.is_detached());
    assert_eq!(c1.try_recv().unwrap_err(), TryRecvError::Detached);
    assert_eq!(c1.recv().unwrap_err(), RecvError::Detached);
    assert_eq!(c1.recv_timeout(Duration::from_millis(1)).unwrap_err(), RecvTimeoutError::Detached);
    let got: Vec<_> = (0..4).map(|_| c2.try_recv().unwrap()).collect();
    assert_eq!(
        got.iter().map(|d| (pos(d), d.attempt())).collect::<Vec<_>>(),
        [(1, 2), (3, 2), (4, 2), (5, 1)]
    );
    let d6 = c2.try_recv().unwrap();
    assert_eq!(pos(&d6), 6);
    // Caught up: the re-attached consumer must not run past what was published (`matches!`, not
    // `unwrap_err`: a phantom delivery must not be read, its slot is uninitialised).
    assert!(matches!(c2.try_recv(), Err(TryRecvError::Empty)));
    assert!(c2.recv_timeout(Duration::from_millis(5)).is_err());
    // The old consumer's handles are stale now: acks refused, nacks no-ops.
    assert_eq!(d1.ack(), Err(AckError::Detached));
    drop(d4);
    assert_eq!(c2.try_recv().unwrap_err(), TryRecvError::Empty, "a stale nack releases nothing");
    p.publish(batch(7)).unwrap();
    assert_eq!(pos(&c2.try_recv().unwrap()), 7);
    for x in got.into_iter().chain([d6]) {
        x.ack().unwrap();
    }
    assert_eq!(lane.acked(), Some(Position(6)));
}

#[test]
fn l8_reattached_consumer_that_caught_up_sees_empty_not_a_phantom_item() {
    // Regression (fixed in d14a2a9): a re-attached consumer's cached tail started at 0, behind
    // `next`, so once caught up it "delivered" the unpublished slot at `next`.
    for cap in WRAP_CAPACITIES {
        let s = stream(cap, &["search"]);
        let lane = s.lane("search").unwrap();
        let mut p = lane.producer().unwrap();
        p.publish(batch(1)).unwrap();
        lane.reattach().try_recv().unwrap().ack().unwrap();
        let mut c2 = lane.reattach();
        match c2.try_recv() {
            Err(TryRecvError::Empty) => {}
            Ok(phantom) => {
                let seq = phantom.into_handle().sequence();
                panic!("capacity {cap}: phantom delivery of unpublished item {seq}");
            }
            Err(e) => panic!("capacity {cap}: {e:?}"),
        }
        p.publish(batch(2)).unwrap();
        let d2 = c2.try_recv().unwrap();
        assert_eq!((pos(&d2), d2.attempt()), (2, 1));
        d2.ack().unwrap();
        assert!(matches!(c2.try_recv(), Err(TryRecvError::Empty)));
        assert_eq!(lane.stats().queued, 0);
    }
}

#[test]
fn l8_late_ack_before_reattach_lands_and_is_not_redelivered() {
    let s = stream(3, &["search"]);
    let lane = s.lane("search").unwrap();
    let mut p = lane.producer().unwrap();
    let mut c1 = lane.reattach();
    p.publish(batch(1)).unwrap();
    p.publish(batch(2)).unwrap();
    let h1 = c1.try_recv().unwrap().into_handle();
    let h2 = c1.try_recv().unwrap().into_handle();
    // The worker acks item 1 before the sink engine restarts: it lands.
    assert_eq!(h1.ack(), Ok(()));
    let mut c2 = lane.reattach();
    let r = c2.try_recv().unwrap();
    assert_eq!((pos(&r), r.attempt()), (2, 2), "only the unacked item comes back");
    assert_eq!(c2.try_recv().unwrap_err(), TryRecvError::Empty);
    assert_eq!(lane.acked(), Some(Position(1)));
    r.ack().unwrap();
    assert_eq!(h2.ack(), Err(AckError::Detached));
    assert_eq!(lane.acked(), Some(Position(2)));
}

#[test]
fn l8_late_ack_after_reattach_is_detached_and_the_item_redelivered() {
    let s = stream(3, &["search"]);
    let lane = s.lane("search").unwrap();
    let mut p = lane.producer().unwrap();
    let mut c1 = lane.reattach();
    p.publish(batch(1)).unwrap();
    let h1 = c1.try_recv().unwrap().into_handle();
    let mut c2 = lane.reattach();
    // Late ack before the new consumer took the redelivery.
    assert_eq!(h1.ack(), Err(AckError::Detached));
    assert_eq!(lane.acked(), None, "a refused ack does not count");
    let r = c2.try_recv().unwrap();
    assert_eq!((pos(&r), r.attempt()), (1, 2));
    // And a late ack after the redelivery was handed out.
    let mut c3 = lane.reattach();
    assert_eq!(r.ack(), Err(AckError::Detached));
    let r = c3.try_recv().unwrap();
    assert_eq!((pos(&r), r.attempt()), (1, 3));
    r.ack().unwrap();
    assert_eq!(lane.acked(), Some(Position(1)));
    assert!(lane.is_idle());
}

#[test]
fn l8_late_ack_racing_a_reattach_lands_xor_is_redelivered() {
    let s = stream(1, &["search"]);
    let lane = s.lane("search").unwrap();
    let mut p = lane.producer().unwrap();
    let (mut landed, mut refused) = (0, 0);
    for i in 1..=300u64 {
        p.publish(batch(i)).unwrap();
        let h = lane.reattach().try_recv().unwrap().into_handle();
        let start = Arc::new(Barrier::new(2));
        let acker = {
            let start = start.clone();
            thread::spawn(move || {
                start.wait();
                h.ack()
            })
        };
        start.wait();
        let mut c = lane.reattach();
        let result = acker.join().unwrap();
        match (result, c.try_recv()) {
            (Ok(()), Err(TryRecvError::Empty)) => landed += 1,
            (Err(AckError::Detached), Ok(r)) => {
                assert_eq!((pos(&r), r.attempt()), (i, 2));
                r.ack().unwrap();
                refused += 1;
            }
            (result, other) => panic!("item {i}: ack {result:?} but receive {:?}", other.map(|d| pos(&d))),
        }
        assert_eq!(lane.acked(), Some(Position(i)));
    }
    assert_eq!(landed + refused, 300);
    eprintln!("late acks: {landed} landed, {refused} refused");
}

#[test]
fn l8_slot_is_not_reused_while_a_detached_delivery_still_reads_it() {
    let s = stream(1, &["search"]);
    let lane = s.lane("search").unwrap();
    let mut p = lane.producer().unwrap();
    let env = shared_envelopes(1);
    p.publish(tracked(Some(1), &env)).unwrap();
    let stale = lane.reattach().try_recv().unwrap();
    let mut c2 = lane.reattach();
    c2.try_recv().unwrap().ack().unwrap();
    // Acked, but the detached delivery still reads the item in place: the slot stays taken.
    assert!(matches!(p.try_publish(batch(2)), Err(TryPublishError::Full(_))));
    assert_eq!(stale.item(), &tracked(Some(1), &env));
    // Only the slot waits for the stale reader: the ack counts at once (L5, W1, W5).
    assert_eq!(lane.acked(), Some(Position(1)), "an acked item moves the acked position at once");
    assert!(s.is_idle(), "everything published is acked");
    assert_eq!(Arc::strong_count(&env), 2, "the item is still in its slot");
    drop(stale);
    assert_eq!(lane.acked(), Some(Position(1)));
    assert_eq!(Arc::strong_count(&env), 1, "emptied once the last reader left");
    p.try_publish(batch(2)).unwrap();
    assert_eq!(pos(&c2.try_recv().unwrap()), 2);
}

#[test]
fn l8_reattach_wakes_a_detached_consumer_blocked_in_recv() {
    let s = stream(2, &["search"]);
    let lane = s.lane("search").unwrap();
    let mut c1 = lane.reattach();
    let blocked = thread::spawn(move || c1.recv().map(|d| d.is_some()));
    thread::sleep(Duration::from_millis(30));
    let _c2 = lane.reattach();
    let r = within(10, "detached recv", move || blocked.join().unwrap());
    assert_eq!(r, Err(RecvError::Detached));
}

#[test]
fn l9_second_live_producer_is_busy_and_a_restarted_producer_continues() {
    let s = stream(8, &["search"]);
    let lane = s.lane("search").unwrap();
    let mut p1 = lane.producer().unwrap();
    assert_eq!(lane.producer().unwrap_err(), StreamError::ProducerBusy(SinkName::new("search").unwrap()));
    // Through another handle on the same lane, and from another thread: still busy.
    let other = s.lane("search").unwrap();
    assert!(matches!(other.producer(), Err(StreamError::ProducerBusy(_))));
    let s2 = s.clone();
    assert!(thread::spawn(move || s2.lane("search").unwrap().producer().is_err()).join().unwrap());
    // The other side never blocks asking for a lane.
    let mut c = s.lane("search").unwrap().reattach();
    for i in 1..=3 {
        p1.publish(batch(i)).unwrap();
    }
    drop(p1);
    let mut p2 = other.producer().expect("a restarted producer gets the lane at once");
    assert!(matches!(
        p2.try_publish(batch(3)),
        Err(TryPublishError::PositionRegressed { last: Position(3), .. })
    ));
    p2.publish(batch(4)).unwrap();
    assert_eq!(drain_try(&mut c), [Some(1), Some(2), Some(3), Some(4)]);
    assert_eq!(lane.stats().last_published, Some(Position(4)));
}

#[test]
fn l9_racing_producer_claims_exactly_one_wins() {
    let s = stream(2, &["search"]);
    for _ in 0..100 {
        let barrier = Arc::new(Barrier::new(3));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (lane, barrier) = (s.lane("search").unwrap(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    lane.producer()
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
        // all dropped here: the next round can claim again
    }
}

#[test]
fn l10_close_drains_queued_and_released_items_then_recv_returns_none() {
    let s = stream(5, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    for i in 1..=4 {
        p.publish(batch(i)).unwrap();
    }
    let d1 = c.try_recv().unwrap();
    let held = c.try_recv().unwrap();
    d1.nack();
    p.close();
    p.close(); // idempotent
    assert_eq!(
        drain_closed(&mut c),
        [(Some(1), 2), (Some(3), 1), (Some(4), 1)],
        "released first, then queued"
    );
    assert!(c.recv().unwrap().is_none());
    assert_eq!(c.try_recv().unwrap_err(), TryRecvError::Closed);
    // An item still held when the lane closed is not lost: released later, it comes back.
    held.nack();
    let r = c.recv().unwrap().expect("released after close");
    assert_eq!((pos(&r), r.attempt()), (2, 2));
    r.ack().unwrap();
    assert!(c.recv().unwrap().is_none());
}

#[test]
fn l10_close_wakes_a_blocked_recv() {
    let s = stream(2, &["search"]);
    let lane = s.lane("search").unwrap();
    let p = lane.producer().unwrap();
    let mut c = lane.reattach();
    let blocked = thread::spawn(move || c.recv().map(|d| d.is_none()));
    thread::sleep(Duration::from_millis(30));
    p.close();
    assert_eq!(within(10, "recv after close", move || blocked.join().unwrap()), Ok(true));
}

#[test]
fn l10_lane_close_wakes_a_blocked_publish_which_hands_the_item_back() {
    let s = stream(1, &["search"]);
    let lane = s.lane("search").unwrap();
    let mut p = lane.producer().unwrap();
    let mut c = lane.reattach();
    p.publish(batch(1)).unwrap();
    // The lane is full: this publish waits, holding the only producer (L9), so the supervisor
    // closes through the lane handle.
    let blocked = thread::spawn(move || p.publish(batch(2)).map_err(|e| e.into_inner().position()));
    thread::sleep(Duration::from_millis(30));
    lane.close();
    let back = within(10, "publish after close", move || blocked.join().unwrap());
    assert_eq!(back, Err(Some(Position(2))), "the waiting publish fails with Closed and hands back its item");
    let d = c.try_recv().unwrap();
    assert_eq!(pos(&d), 1, "what was queued before the close is still delivered");
    d.ack().unwrap();
    assert_eq!(c.try_recv().map(|d| pos(&d)), Err(TryRecvError::Closed));
}

#[test]
fn l10_request_lane_close_refuses_senders_and_drains_then_ends() {
    let s = stream(2, &["search"]);
    let requests = s.requests();
    let sender = requests.sender();
    let mut ingest = requests.reattach();
    sender.publish(backfill("search", "users")).unwrap();
    requests.close();
    match sender.try_publish(backfill("search", "orders")) {
        Err(TryPublishError::Closed(back)) => assert_eq!(back, backfill("search", "orders")),
        other => panic!("expected Closed with the request handed back, got {other:?}"),
    }
    let d = ingest.recv().unwrap().expect("the queued request is still delivered");
    assert_eq!(d.item(), &backfill("search", "users"));
    d.ack().unwrap();
    assert!(ingest.recv().unwrap().is_none(), "closed and drained");
}

#[test]
fn l10_close_racing_a_last_publish_still_delivers_the_item() {
    for round in 0..200u64 {
        let s = stream(2, &["search"]);
        let lane = s.lane("search").unwrap();
        let mut p = lane.producer().unwrap();
        let mut c = lane.reattach();
        let n = 1 + round % 3;
        let consumer = thread::spawn(move || {
            let mut got = Vec::new();
            while let Some(d) = c.recv().unwrap() {
                got.push(pos(&d));
                d.ack().unwrap();
            }
            got
        });
        for i in 1..=n {
            p.publish(batch(i)).unwrap();
        }
        p.close();
        let got = within(10, "consumer draining a closed lane", move || consumer.join().unwrap());
        assert_eq!(got, (1..=n).collect::<Vec<_>>(), "round {round}");
    }
}

#[test]
fn l10_close_takes_no_slot_even_on_a_full_lane() {
    for cap in WRAP_CAPACITIES {
        let s = stream(cap, &["search"]);
        let lane = s.lane("search").unwrap();
        let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
        for i in 1..=cap as u64 {
            p.try_publish(batch(i)).unwrap();
        }
        p.close();
        let st = lane.stats();
        assert_eq!((st.published, st.queued, st.closed), (cap as u64, cap as u64, true));
        let got = drain_closed(&mut c);
        assert_eq!(got, (1..=cap as u64).map(|i| (Some(i), 1)).collect::<Vec<_>>());
    }
}

#[test]
fn l11_is_empty_means_nothing_queued_and_nothing_released() {
    let s = stream(3, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    assert!(c.is_empty());
    p.publish(batch(1)).unwrap();
    assert!(!c.is_empty(), "queued");
    let d = c.try_recv().unwrap();
    assert!(c.is_empty(), "delivered but unacked does not count");
    d.nack();
    assert!(!c.is_empty(), "released");
    let d = c.try_recv().unwrap();
    assert!(c.is_empty());
    let mut c2 = lane.reattach();
    assert!(!c2.is_empty(), "taken back by a re-attach");
    let r = c2.try_recv().unwrap();
    assert!(c2.is_empty());
    r.ack().unwrap();
    drop(d);
    assert!(c2.is_empty() && lane.is_idle());
}

#[test]
fn l12_try_recv_returns_promptly_while_a_publish_is_blocked_on_a_full_lane() {
    let s = stream(1, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    p.publish(batch(1)).unwrap();
    let d1 = c.try_recv().unwrap();
    let publisher = thread::spawn(move || p.publish(batch(2)).map_err(|e| format!("{e:?}")));
    thread::sleep(Duration::from_millis(30));
    let start = Instant::now();
    for _ in 0..10_000 {
        assert_eq!(c.try_recv().unwrap_err(), TryRecvError::Empty);
    }
    assert!(start.elapsed() < Duration::from_secs(5), "try_recv waited: {:?}", start.elapsed());
    assert!(c.recv_timeout(Duration::from_millis(5)).is_err());
    d1.ack().unwrap();
    within(10, "publish after ack", move || publisher.join().unwrap()).unwrap();
    assert_eq!(pos(&c.try_recv().unwrap()), 2);
}

#[test]
fn l12_try_recv_never_blocks_against_a_publisher_in_full_flight() {
    let s = stream(3, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    const N: u64 = 20_000;
    let publisher = thread::spawn(move || {
        for i in 1..=N {
            p.publish(batch(i)).unwrap();
        }
        p.close();
    });
    let (mut expected, mut slowest) = (1, Duration::ZERO);
    loop {
        let t = Instant::now();
        let r = c.try_recv();
        slowest = slowest.max(t.elapsed());
        match r {
            Ok(d) => {
                assert_eq!(pos(&d), expected);
                expected += 1;
                d.ack().unwrap();
            }
            Err(TryRecvError::Empty) => thread::yield_now(),
            Err(TryRecvError::Closed) => break,
            Err(e) => unreachable!("{e}"),
        }
    }
    publisher.join().unwrap();
    assert_eq!(expected, N + 1);
    // Generous: a preempted call on a loaded 2-core machine may take a while, a blocked one forever.
    assert!(slowest < Duration::from_secs(2), "slowest try_recv {slowest:?}");
}

// ----- Watermark and idleness ------------------------------------------------------------------

#[test]
fn w1_watermark_is_the_min_over_lanes_and_none_until_every_lane_acked() {
    assert_eq!(MemoryStream::builder().build().unwrap().watermark(), None, "no lanes");
    let s = stream(4, &["a", "b", "c"]);
    let lanes: Vec<_> = s.lanes().collect();
    let mut ps: Vec<_> = lanes.iter().map(|l| l.producer().unwrap()).collect();
    let mut cs: Vec<_> = lanes.iter().map(|l| l.reattach()).collect();
    fn ack_to(p: &mut Producer<LaneItem>, c: &mut Consumer<LaneItem>, from: u64, upto: u64) {
        for i in from..=upto {
            p.publish(batch(i)).unwrap();
            c.try_recv().unwrap().ack().unwrap();
        }
    }
    assert_eq!(s.watermark(), None);
    ack_to(&mut ps[0], &mut cs[0], 1, 5);
    ack_to(&mut ps[1], &mut cs[1], 1, 3);
    assert_eq!(s.watermark(), None, "lane c has acked nothing");
    ps[2].publish(snapshot()).unwrap();
    cs[2].try_recv().unwrap().ack().unwrap();
    assert_eq!(s.watermark(), None, "a snapshot row is not a position");
    ack_to(&mut ps[2], &mut cs[2], 1, 9);
    assert_eq!(s.watermark(), Some(Position(3)));
    ack_to(&mut ps[1], &mut cs[1], 4, 7);
    assert_eq!(s.watermark(), Some(Position(5)));
    assert_eq!(lanes.iter().map(|l| l.acked().unwrap().0).collect::<Vec<_>>(), [5, 7, 9]);
}

#[test]
fn w2_snapshot_batches_snapshot_complete_and_requests_never_move_the_watermark() {
    let s = stream(8, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    p.publish(batch(5)).unwrap();
    c.try_recv().unwrap().ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(5)));
    for item in [snapshot(), snapshot(), complete("users")] {
        p.publish(item).unwrap();
        assert_eq!(s.watermark(), Some(Position(5)), "publishing moves nothing");
        c.try_recv().unwrap().ack().unwrap();
        assert_eq!(s.watermark(), Some(Position(5)));
    }
    s.requests().sender().publish(backfill("search", "users")).unwrap();
    s.requests().reattach().try_recv().unwrap().ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(5)));
    assert_eq!(s.requests().stats().acked, None, "the request lane has no position");
    // Publishing a positioned batch does not move it either; only its ack does.
    p.publish(batch(6)).unwrap();
    assert_eq!(s.watermark(), Some(Position(5)));
    c.try_recv().unwrap().ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(6)));
}

#[test]
fn w3_watermark_never_decreases_seen_from_one_thread() {
    let n: u64 = if cfg!(debug_assertions) { 3_000 } else { 20_000 };
    let s = stream(3, &["a", "b"]);
    let done = Arc::new(AtomicBool::new(false));
    let sinks: Vec<_> = s
        .lanes()
        .enumerate()
        .map(|(k, lane)| {
            thread::spawn(move || {
                let mut c = lane.reattach();
                let mut received = 0u64;
                loop {
                    let d = match c.recv() {
                        Ok(Some(d)) => d,
                        Ok(None) => break,
                        Err(e) => unreachable!("only this thread re-attaches: {e}"),
                    };
                    received += 1;
                    if received % 97 == (k as u64) * 13 {
                        // Re-attach with a delivery outstanding, then ack it late: refused.
                        let c2 = lane.reattach();
                        assert_eq!(d.ack(), Err(AckError::Detached));
                        c = c2;
                    } else if received % 7 == 0 {
                        d.nack();
                    } else {
                        d.ack().unwrap();
                    }
                }
            })
        })
        .collect();
    let reader = {
        let (s, done) = (s.clone(), done.clone());
        thread::spawn(move || {
            let (mut last, mut reads) = (None, 0u64);
            while !done.load(Ordering::Acquire) {
                let w = s.watermark();
                assert!(w >= last, "watermark went from {last:?} to {w:?}");
                last = w;
                reads += 1;
                if reads % 64 == 0 {
                    thread::yield_now();
                }
            }
            (last, reads)
        })
    };
    let mut ps: Vec<_> = s.lanes().map(|l| l.producer().unwrap()).collect();
    for i in 1..=n {
        for p in &mut ps {
            p.publish(batch(i)).unwrap();
        }
    }
    ps.iter().for_each(|p| p.close());
    within(60, "sinks", move || sinks.into_iter().for_each(|t| t.join().unwrap()));
    done.store(true, Ordering::Release);
    let (last, reads) = reader.join().unwrap();
    assert!(reads > 0 && last <= Some(Position(n)));
    assert_eq!(s.watermark(), Some(Position(n)));
}

#[test]
fn w4_a_reader_that_sees_watermark_p_sees_the_sinks_writes_up_to_p() {
    let n: usize = if cfg!(debug_assertions) { 3_000 } else { 30_000 };
    let s = stream(5, &["a", "b"]);
    // What each sink "applied": slot p holds p * 3 once position p was applied.
    let applied: Arc<Vec<Vec<AtomicU64>>> =
        Arc::new((0..2).map(|_| (0..=n).map(|_| AtomicU64::new(0)).collect()).collect());
    let sinks: Vec<_> = s
        .lanes()
        .enumerate()
        .map(|(k, lane)| {
            let applied = applied.clone();
            thread::spawn(move || {
                let mut c = lane.reattach();
                while let Some(d) = c.recv().unwrap() {
                    let p = pos(&d) as usize;
                    // Relaxed on purpose: only the ack (Release) and the watermark (Acquire) order it.
                    applied[k][p].store(p as u64 * 3, Ordering::Relaxed);
                    d.ack().unwrap();
                }
            })
        })
        .collect();
    let reader = {
        let (s, applied) = (s.clone(), applied.clone());
        thread::spawn(move || {
            let mut checked = 0u64;
            loop {
                if let Some(Position(p)) = s.watermark() {
                    for lane in applied.iter() {
                        for q in [p, p.saturating_sub(1).max(1), p / 2 + 1] {
                            let q = q.min(p) as usize;
                            assert_eq!(lane[q].load(Ordering::Relaxed), q as u64 * 3, "watermark {p}");
                        }
                    }
                    checked += 1;
                    if p as usize == n {
                        return checked;
                    }
                }
                thread::yield_now();
            }
        })
    };
    let mut ps: Vec<_> = s.lanes().map(|l| l.producer().unwrap()).collect();
    for i in 1..=n as u64 {
        for p in &mut ps {
            p.publish(batch(i)).unwrap();
        }
    }
    ps.iter().for_each(|p| p.close());
    sinks.into_iter().for_each(|t| t.join().unwrap());
    let checked = within(30, "reader", move || reader.join().unwrap());
    assert!(checked > 0);
}

#[test]
fn w5_is_idle_only_when_nothing_is_queued_released_or_unacked_anywhere() {
    let s = stream(4, &["a", "b"]);
    assert!(s.is_idle());
    let lane = s.lane("b").unwrap();
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    p.publish(batch(1)).unwrap();
    p.publish(batch(2)).unwrap();
    assert!(!s.is_idle(), "queued");
    let d1 = c.try_recv().unwrap();
    let d2 = c.try_recv().unwrap();
    assert!(!s.is_idle(), "delivered, unacked");
    d2.ack().unwrap();
    assert!(!s.is_idle() && !lane.is_idle(), "acked out of order: item 1 still out");
    d1.nack();
    assert!(!s.is_idle(), "released");
    c.try_recv().unwrap().ack().unwrap();
    assert!(s.is_idle() && lane.is_idle());
    // The request lane counts too.
    s.requests().sender().publish(backfill("b", "users")).unwrap();
    assert!(!s.is_idle());
    let mut ingest = s.requests().reattach();
    let r = ingest.try_recv().unwrap();
    assert!(!s.is_idle());
    r.ack().unwrap();
    assert!(s.is_idle());
    // Closing does not make a busy lane idle.
    p.publish(batch(3)).unwrap();
    p.close();
    assert!(!s.is_idle());
    c.recv().unwrap().unwrap().ack().unwrap();
    assert!(s.is_idle());
}

// ----- Requests --------------------------------------------------------------------------------

#[test]
fn r1_many_senders_publish_requests_concurrently_and_one_ingest_engine_consumes() {
    let s = MemoryStream::builder().request_capacity(3).sinks(["s0", "s1", "s2", "s3"]).build().unwrap();
    const PER_SENDER: usize = 60;
    let senders: Vec<_> = (0..4)
        .map(|k| {
            let sender = s.requests().sender();
            thread::spawn(move || {
                for i in 0..PER_SENDER {
                    sender.publish(backfill(&format!("s{k}"), &format!("i{i}"))).unwrap();
                }
            })
        })
        .collect();
    let mut ingest = s.requests().reattach();
    let mut seen = HashSet::new();
    let mut per_sink_last = [None::<usize>; 4];
    while seen.len() < 4 * PER_SENDER {
        let d = ingest.recv_timeout(Duration::from_secs(10)).expect("requests keep coming").unwrap();
        let Request::Backfill { sink, indexes } = d.item() else { unreachable!() };
        let k: usize = sink.as_str()[1..].parse().unwrap();
        let i: usize = indexes[0].as_str()[1..].parse().unwrap();
        if let Some(last) = per_sink_last[k] {
            assert!(i > last, "one sender's requests stay in order");
        }
        per_sink_last[k] = Some(i);
        assert!(seen.insert((k, i)), "duplicate request {k} {i}");
        d.ack().unwrap();
    }
    senders.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(ingest.try_recv().unwrap_err(), TryRecvError::Empty);
    assert!(s.is_idle());
}

#[test]
fn r2_requests_follow_the_lane_rules_for_nack_redelivery_and_reattach() {
    let s = stream(2, &["search"]);
    let sender = s.requests().sender();
    sender.publish(backfill("search", "a")).unwrap();
    sender.publish(backfill("search", "b")).unwrap();
    let mut ingest = s.requests().reattach();
    let ra = ingest.try_recv().unwrap();
    ra.nack();
    let ra = ingest.try_recv().unwrap();
    assert_eq!((ra.item(), ra.attempt()), (&backfill("search", "a"), 2));
    let rb = ingest.try_recv().unwrap();
    let mut ingest2 = s.requests().reattach();
    assert_eq!(ingest.try_recv().unwrap_err(), TryRecvError::Detached);
    assert_eq!(rb.ack(), Err(AckError::Detached));
    let got: Vec<_> = (0..2).map(|_| ingest2.try_recv().unwrap()).collect();
    assert_eq!(got[0].item(), &backfill("search", "a"));
    assert_eq!((got[1].item(), got[1].attempt()), (&backfill("search", "b"), 2));
    assert_eq!(ra.ack(), Err(AckError::Detached));
    for d in got {
        d.ack().unwrap();
    }
    assert!(s.is_idle());
}

/// One ingest engine step for a backfill: snapshot rows, then `SnapshotComplete`, then the ack.
/// `crash_after` rows, it stops (returns without acking; its delivery is dropped).
fn serve_backfill(
    ingest: &mut lanestream::Consumer<Request>,
    s: &MemoryStream,
    rows: usize,
    crash_after: Option<usize>,
) -> Option<u32> {
    let d = ingest.recv_timeout(Duration::from_secs(5)).unwrap().unwrap();
    let attempt = d.attempt();
    let Request::Backfill { sink, indexes } = d.item().clone() else { unreachable!() };
    let lane = s.lane(sink.as_str()).unwrap();
    let mut p = lane.producer().unwrap();
    for row in 0..rows {
        if crash_after == Some(row) {
            return None; // crash: delivery and producer dropped un-acked
        }
        let env: Arc<[Envelope]> = vec![envelope(indexes[0].as_str(), &row.to_string(), None, b"{}")].into();
        p.publish(LaneItem::Batch(Batch::new(None, env))).unwrap();
    }
    p.publish(LaneItem::SnapshotComplete { indexes }).unwrap();
    let published = lane.stats().published;
    d.ack().unwrap();
    assert_eq!(lane.stats().published, published, "nothing after the ack");
    Some(attempt)
}

#[test]
fn r2_backfill_is_acked_after_snapshot_complete_and_redelivered_after_a_crash_mid_snapshot() {
    let s = stream(16, &["search"]);
    s.requests().sender().publish(backfill("search", "users")).unwrap();
    // Ingest engine 1 crashes after two rows: its request delivery is dropped un-acked.
    let mut ingest = s.requests().reattach();
    assert_eq!(serve_backfill(&mut ingest, &s, 4, Some(2)), None);
    assert_eq!(s.requests().stats().released, 1, "the crashed engine's delivery was released");
    // Ingest engine 2 (restarted: re-attached request consumer, new producer) gets it again.
    let mut ingest2 = s.requests().reattach();
    assert_eq!(serve_backfill(&mut ingest2, &s, 4, None), Some(2));
    assert_eq!(s.requests().stats().lag(), 0);
    // A hung ingest engine replaced while it still holds the request: its late ack is refused
    // and the new engine serves the request again.
    s.requests().sender().publish(backfill("search", "orders")).unwrap();
    let hung = ingest2.try_recv().unwrap();
    let mut ingest3 = s.requests().reattach();
    assert_eq!(serve_backfill(&mut ingest3, &s, 1, None), Some(2));
    assert_eq!(hung.ack(), Err(AckError::Detached));
    // The sink saw: 2 rows (crashed run), 4 rows + complete, 1 row + complete.
    let mut c = s.lane("search").unwrap().reattach();
    let mut kinds = Vec::new();
    while let Ok(d) = c.try_recv() {
        kinds.push(match d.item() {
            LaneItem::Batch(b) => {
                assert_eq!(b.position, None);
                'r'
            }
            LaneItem::SnapshotComplete { indexes } => {
                indexes[0].as_str().chars().next().unwrap().to_ascii_uppercase()
            }
            other => unreachable!("{other:?}"),
        });
        d.ack().unwrap();
    }
    assert_eq!(kinds.iter().collect::<String>(), "rrrrrrUrO");
    assert!(s.is_idle());
    assert_eq!(s.watermark(), None, "snapshot traffic moves no watermark");
}

// ----- Memory ----------------------------------------------------------------------------------

static LIVE_WAKERS: AtomicIsize = AtomicIsize::new(0);
static WAKES: AtomicUsize = AtomicUsize::new(0);

fn raw_waker(data: *const ()) -> RawWaker {
    const VTABLE: RawWakerVTable = RawWakerVTable::new(
        |d| {
            LIVE_WAKERS.fetch_add(1, Ordering::SeqCst);
            raw_waker(d)
        },
        |_| {
            WAKES.fetch_add(1, Ordering::SeqCst);
            LIVE_WAKERS.fetch_sub(1, Ordering::SeqCst);
        },
        |_| {
            WAKES.fetch_add(1, Ordering::SeqCst);
        },
        |_| {
            LIVE_WAKERS.fetch_sub(1, Ordering::SeqCst);
        },
    );
    RawWaker::new(data, &VTABLE)
}

/// A waker that never equals (`will_wake`) one with another `id`, and whose live copies are
/// counted in `LIVE_WAKERS`.
fn fresh_waker(id: usize) -> Waker {
    LIVE_WAKERS.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the vtable's functions only touch the counters; `data` is never dereferenced.
    unsafe { Waker::from_raw(raw_waker(id as *const ())) }
}

#[test]
fn m1_lane_memory_is_fixed_at_build_and_repolling_keeps_one_waker() {
    // Capacity is fixed: after heavy traffic the lane still holds `capacity` items, no more.
    let s = stream(3, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (lane.producer().unwrap(), lane.reattach());
    for i in 1..=3_000 {
        p.publish(batch(i)).unwrap();
        c.try_recv().unwrap().ack().unwrap();
    }
    for i in 3_001..=3_003 {
        p.try_publish(batch(i)).unwrap();
    }
    assert!(matches!(p.try_publish(batch(3_004)), Err(TryPublishError::Full(_))));
    assert_eq!((lane.stats().capacity, p.capacity()), (3, 3));
    let drained: Vec<_> = (0..3).map(|_| c.try_recv().unwrap()).collect();
    drained.into_iter().for_each(|d| d.ack().unwrap());

    // The wait lists are private; what is observable is how many wakers the lane keeps alive.
    // Re-polling one pending receive 10 000 times with a fresh waker each time must keep exactly
    // one (the latest), not one per poll.
    let base = LIVE_WAKERS.load(Ordering::SeqCst);
    {
        let mut fut = pin!(c.recv_async());
        for id in 1..=10_000 {
            let waker = fresh_waker(id);
            assert!(fut.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        }
        assert_eq!(
            LIVE_WAKERS.load(Ordering::SeqCst) - base,
            1,
            "the lane keeps one waker, not one per poll"
        );
        let wakes = WAKES.load(Ordering::SeqCst);
        p.publish(batch(5_000)).unwrap();
        assert_eq!(WAKES.load(Ordering::SeqCst) - wakes, 1, "the latest waker was woken, once");
        assert_eq!(LIVE_WAKERS.load(Ordering::SeqCst) - base, 0, "and released");
        let waker = fresh_waker(0);
        match fut.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(Ok(Some(d))) => {
                assert_eq!(pos(&d), 5_000);
                d.ack().unwrap();
            }
            _ => panic!("woken receive not ready"),
        }
    }
    // A pending receive that is dropped leaves no waker behind.
    {
        let mut fut = pin!(c.recv_async());
        let waker = fresh_waker(1);
        assert!(fut.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        assert_eq!(LIVE_WAKERS.load(Ordering::SeqCst) - base, 2);
    }
    assert_eq!(LIVE_WAKERS.load(Ordering::SeqCst) - base, 0, "a dropped future deregisters");
}

#[test]
fn m3_every_item_is_dropped_exactly_once_on_final_ack_or_stream_drop() {
    let envs: Vec<Arc<[Envelope]>> = (0..5).map(shared_envelopes).collect();
    let s = stream(5, &["a", "b"]);
    let mut ps: Vec<_> = s.lanes().map(|l| l.producer().unwrap()).collect();
    let mut cs: Vec<_> = s.lanes().map(|l| l.reattach()).collect();
    for (i, env) in envs.iter().enumerate() {
        for p in &mut ps {
            p.publish(tracked(Some(i as u64 + 1), env)).unwrap();
        }
    }
    let count = |i: usize| Arc::strong_count(&envs[i]) - 1;
    assert!((0..5).all(|i| count(i) == 2), "one copy per lane, none per delivery");
    // Lane a: ack item 0 (dropped), nack 1 and redeliver (not dropped), hold 2.
    cs[0].try_recv().unwrap().ack().unwrap();
    assert_eq!(count(0), 1);
    cs[0].try_recv().unwrap().nack();
    let r1 = cs[0].try_recv().unwrap();
    assert_eq!((count(1), r1.attempt()), (2, 2), "redelivery reads the same copy");
    let held = cs[0].try_recv().unwrap();
    // Stream, producers and consumers gone: the held deliveries keep their lane alive.
    drop((s, ps, cs));
    assert!((1..5).all(|i| count(i) >= 1));
    drop(r1);
    assert_eq!(count(1), 1, "lane a is still alive through `held`");
    drop(held);
    assert!((0..5).all(|i| count(i) == 0), "{:?}", (0..5).map(count).collect::<Vec<_>>());
}
