//! The crate's contract (`lanestream::contract`), one test (or a few) per rule, each named after what it shows.
//!
//! Most rules are checked through the port alone: those tests are generic over the backend, in
//! `tests/port_contract/mod.rs`, and instantiated here for [`MemoryStream`] by
//! `port_contract_tests!` under the same names (`cargo test l8_` runs them). The tests left in
//! this file need the in-memory backend's own API or internals; each says why.
//!
//! Not here: I3's rkyv part (`src/codec.rs` has its own tests), M2 (`tests/alloc.rs`), the
//! detailed drop accounting of M3 (`tests/lanes/drops.rs`), the async entry points
//! (`tests/lanes/async_waits.rs`) and the long multi-threaded run (`tests/stress.rs`).

use crate::{common, port_contract};
use lanestream::prelude::*;

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};
use std::thread;

use common::{backfill, batch, complete, envelope, pos, shared_envelopes, snapshot, stream, tracked};
use lanestream::{
    AckError, AckHandle, Batch, BuildError, Delivery, Envelope, IndexName, LaneItem, MemoryStream, NameError,
    Op, Position, PublishError, Request, SinkName, Stream, StreamError, TryRecvError,
};
use port_contract::{port_contract_tests, Backend, WorkerHandle};

// ----- The port's contract, on the in-memory backend ------------------------------------------

/// The in-memory backend under the generic contract tests.
struct Memory;

impl Backend for Memory {
    type Stream = MemoryStream;
    type Handle = AckHandle<LaneItem>;

    fn name(&self) -> &'static str {
        "memory"
    }

    fn build(&self, capacity: usize, request_capacity: usize, sinks: &[&str]) -> MemoryStream {
        MemoryStream::builder()
            .capacity(capacity)
            .request_capacity(request_capacity)
            .sinks(sinks.iter().copied())
            .build()
            .unwrap()
    }

    fn worker_handle(&self, delivery: Delivery<LaneItem>) -> AckHandle<LaneItem> {
        delivery.into_handle()
    }
}

impl WorkerHandle for AckHandle<LaneItem> {
    fn attempt(&self) -> u32 {
        AckHandle::attempt(self)
    }

    fn ack(self) -> Result<(), AckError> {
        AckHandle::ack(self)
    }
}

port_contract_tests!(Memory);

// ----- Items ---------------------------------------------------------------------------------

// Memory-specific: `Delivery::position` (and the deref to the item) is the in-memory delivery's own accessor.
#[test]
fn i1_a_memory_delivery_reports_its_items_position() {
    let s = stream(3, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (s.fanout().unwrap(), lane.reattach());
    for item in [batch(7), snapshot(), complete("users")] {
        p.publish(item).unwrap();
    }
    let got: Vec<_> = (0..3).map(|_| c.try_recv().unwrap()).collect();
    assert_eq!(got.iter().map(|d| d.position()).collect::<Vec<_>>(), [Some(Position(7)), None, None]);
    assert_eq!(got.iter().map(|d| (**d).position()).collect::<Vec<_>>(), [Some(Position(7)), None, None]);
}

// Backend-independent: a chunk's offset travels with it through serde and the codec (I4), and
// a batch written before the field existed reads as offset 0.
#[test]
fn i4_a_chunks_offset_travels_with_it() {
    let chunk = LaneItem::Batch(Batch {
        position: None,
        changes: 2,
        offset: 6,
        envelopes: vec![envelope("public_users", "7", Some(9), br#"{"id":7}"#)].into(),
    });
    let json = serde_json::to_value(&chunk).unwrap();
    assert_eq!(json["batch"]["offset"], 6);
    assert_eq!(serde_json::from_value::<LaneItem>(json).unwrap(), chunk);
    let bytes = lanestream::codec::encode_item(&chunk).unwrap();
    assert_eq!(lanestream::codec::decode_item(&bytes).unwrap(), chunk);
    assert_eq!(lanestream::codec::view_batch(&bytes).unwrap().offset(), 6);
    let older: LaneItem =
        serde_json::from_str(r#"{"batch":{"position":3,"changes":0,"envelopes":[]}}"#).unwrap();
    assert!(matches!(older, LaneItem::Batch(Batch { offset: 0, .. })));
}

// Backend-independent: no stream, only the items' serde form.
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
    // `after` is written only when set, and JSON without it reads as `None`.
    let Request::Backfill { sink, indexes, .. } = request else { unreachable!() };
    let resumed = Request::Backfill { sink, indexes, after: Some("7:a\\:b".into()) };
    let text = serde_json::to_string(&resumed).unwrap();
    assert_eq!(text, r#"{"backfill":{"sink":"search","indexes":["users"],"after":"7:a\\:b"}}"#);
    assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), resumed);

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

// Memory-specific: `BuildError` comes from `MemoryStream::builder()`, and `lane`/`lanes` are its own API
// (the port's half of L1 is the generic `l1_the_sinks_are_the_built_ones_...`).
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

// Memory-specific: splitting a delivery (`into_handle`, `into_parts`, `AckHandle`) is not in the port.
#[test]
fn l6_nack_dropped_handle_and_dropped_delivery_each_release_for_redelivery_first() {
    let s = stream(7, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (s.fanout().unwrap(), lane.reattach());
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

// Memory-specific: pins the by-value `ack` of `Delivery` and `AckHandle`, and `into_parts` (not in the port).
#[test]
fn l7_ack_consumes_the_handle_so_each_delivery_is_acked_at_most_once() {
    // `ack` takes the handle by value (the compile-fail half is in src/send_sync_tests.rs).
    let ack_delivery: fn(Delivery<LaneItem>) -> Result<(), AckError> = Delivery::ack;
    let ack_handle: fn(AckHandle<LaneItem>) -> Result<(), AckError> = AckHandle::ack;
    let s = stream(3, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (s.fanout().unwrap(), lane.reattach());
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

// Memory-specific: watches the item in its slot through `Arc::strong_count` (the generic
// `l8_an_ack_counts_at_once_while_a_detached_delivery_still_holds_the_slot` checks the port's part).
#[test]
fn l8_slot_is_not_reused_while_a_detached_delivery_still_reads_it() {
    let s = stream(1, &["search"]);
    let lane = s.lane("search").unwrap();
    let mut p = s.fanout().unwrap();
    let env = shared_envelopes(1);
    p.publish(tracked(Some(1), &env)).unwrap();
    let stale = lane.reattach().try_recv().unwrap();
    let mut c2 = lane.reattach();
    c2.try_recv().unwrap().ack().unwrap();
    // Acked, but the detached delivery still reads the item in place: the slot stays taken.
    assert!(matches!(p.try_publish(batch(2)), Err(PublishError::Full(_))));
    assert_eq!(stale.item(), &tracked(Some(1), &env));
    // Only the slot waits for the stale reader: the ack counts at once (L5, W1, W5).
    assert_eq!(lane.acked(), Some(Position(1)), "an acked item moves the acked position at once");
    assert!(s.is_idle(), "everything published is acked");
    assert_eq!(Arc::strong_count(&env), 2, "the item is still in its slot");
    drop(stale);
    assert_eq!(lane.acked(), Some(Position(1)));
    // Freed once the last reader left; dropped by the fan-out's next publish (M3).
    assert_eq!(Arc::strong_count(&env), 2, "kept until the fan-out's next publish");
    p.try_publish(batch(2)).unwrap();
    assert_eq!(Arc::strong_count(&env), 1, "dropped by the next publish, which took the cell");
    assert_eq!(pos(&c2.try_recv().unwrap()), 2);
}

// Memory-specific: `Lane` handles (`MemoryStream::lane`) and clones of a `MemoryStream` are the
// in-memory backend's own API.
#[test]
fn l9_every_clone_of_the_stream_shares_the_one_fanout_claim_and_a_lane_has_no_producer_of_its_own() {
    let s = stream(8, &["search", "cache"]);
    let busy = StreamError::ProducerBusy(SinkName::new("search").unwrap());
    let lane = s.lane("cache").unwrap();
    // A stream's lane is published to by the fan-out only: its own producer is refused, with or
    // without a fan-out alive.
    assert_eq!(lane.producer().unwrap_err(), StreamError::ProducerBusy(SinkName::new("cache").unwrap()));
    let f1 = s.fanout().unwrap();
    assert_eq!(s.fanout().unwrap_err(), busy);
    // Through a clone of the stream, and from another thread: still busy.
    let other = s.clone();
    assert_eq!(other.fanout().unwrap_err(), busy);
    let s2 = s.clone();
    assert!(thread::spawn(move || s2.fanout().is_err()).join().unwrap());
    assert!(matches!(lane.producer(), Err(StreamError::ProducerBusy(_))));
    drop(f1);
    other.fanout().expect("a restarted fan-out gets the stream at once, through any clone");
    assert!(matches!(lane.producer(), Err(StreamError::ProducerBusy(_))), "still no lane producer");
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

// Memory-specific: M1 is about the in-memory rings (`Producer::capacity`, the wait lists' wakers,
// counted in process-wide statics).
#[test]
fn m1_lane_memory_is_fixed_at_build_and_repolling_keeps_one_waker() {
    // Capacity is fixed: after heavy traffic the lane still holds `capacity` items, no more.
    let s = stream(3, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (s.fanout().unwrap(), lane.reattach());
    for i in 1..=3_000 {
        p.publish(batch(i)).unwrap();
        c.try_recv().unwrap().ack().unwrap();
    }
    for i in 3_001..=3_003 {
        p.try_publish(batch(i)).unwrap();
    }
    assert!(matches!(p.try_publish(batch(3_004)), Err(PublishError::Full(_))));
    assert_eq!(lane.stats().capacity, 3);
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

// Memory-specific: counts the in-memory stream's item copies with `Arc::strong_count`, and cells
// kept alive by deliveries alone.
#[test]
fn m3_every_item_is_dropped_exactly_once_at_the_publish_after_its_last_ack_or_with_the_stream() {
    let envs: Vec<Arc<[Envelope]>> = (0..5).map(shared_envelopes).collect();
    let s = stream(5, &["a", "b"]);
    let mut p = s.fanout().unwrap();
    let mut cs: Vec<_> = s.lanes().map(|l| l.reattach()).collect();
    for (i, env) in envs.iter().enumerate() {
        p.publish(tracked(Some(i as u64 + 1), env)).unwrap();
    }
    let count = |i: usize| Arc::strong_count(&envs[i]) - 1;
    assert!((0..5).all(|i| count(i) == 1), "one copy for every lane, none per delivery");
    // Item 0: acked on lane a only, then on lane b too: dropped at the fan-out's next publish.
    cs[0].try_recv().unwrap().ack().unwrap();
    assert_eq!(count(0), 1, "lane b still holds it");
    cs[1].try_recv().unwrap().ack().unwrap();
    assert_eq!(count(0), 1, "acked everywhere, dropped at the next publish");
    p.publish(batch(6)).unwrap();
    assert_eq!(count(0), 0, "dropped by the publish after its last ack");
    // Lane a: nack 1 and redeliver (not dropped), hold 2.
    cs[0].try_recv().unwrap().nack();
    let r1 = cs[0].try_recv().unwrap();
    assert_eq!((count(1), r1.attempt()), (1, 2), "redelivery reads the same copy");
    let held = cs[0].try_recv().unwrap();
    // Stream, fan-out and consumers gone: the held deliveries keep the cells alive.
    drop((s, p, cs));
    assert!((1..5).all(|i| count(i) == 1), "{:?}", (0..5).map(count).collect::<Vec<_>>());
    drop(r1);
    assert_eq!(count(1), 1, "the cells are still alive through `held`");
    drop(held);
    assert!((0..5).all(|i| count(i) == 0), "{:?}", (0..5).map(count).collect::<Vec<_>>());
}
