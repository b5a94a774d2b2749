//! The contract tests that hold for every backend of the port: generic functions over a
//! [`Backend`], written against [`Stream`] and the lane-end traits only, and
//! [`port_contract_tests!`], which instantiates each of them as a `#[test]` for one backend.
//!
//! A backend's test file declares `mod common;` and `mod port_contract;` (this module uses the
//! item builders and the watchdog of `tests/common`), implements [`Backend`] and invokes the
//! macro once:
//!
//! ```ignore
//! mod common;
//! mod port_contract;
//! use port_contract::{port_contract_tests, Backend, WorkerHandle};
//! struct Redis;
//! impl Backend for Redis { /* ... */ }
//! port_contract_tests!(Redis);
//! ```
//!
//! Each test is named after the rule it checks (`l8_...`), so `cargo test l8_` runs a rule on every
//! backend. The contract is `lanestream::contract` (src/docs/contract.md).
//!
//! Everything goes through the port (`Stream` and the lane-end traits, stats included), except
//! one port gap taken from the backend's [`Backend::worker_handle`]: the split of a delivery into
//! a worker's ack handle (a backend without one hands over the delivery itself).
//!
//! Adding a test: write `pub fn rule_what<B: Backend>(b: &B)` and add its name to the list in
//! [`port_contract_tests!`]; a function left out of the list is never called, which fails
//! `cargo clippy --all-targets -- -D warnings` (dead code).

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use lanestream::{
    AckError, Batch, Envelope, Item, LaneConsumer, LaneDelivery, LaneItem, LaneRun, Position, PublishError,
    RecvError, RecvTimeoutError, Request, RequestPublisher, SinkName, Stream, StreamError, StreamFanout,
    TryRecvError,
};

use crate::common::{backfill, batch, complete, envelope, shared_envelopes, snapshot, tracked, within};

/// Capacities, powers of two or not, over which the wrap-around tests run.
const WRAP_CAPACITIES: [usize; 5] = [1, 2, 3, 5, 7];

/// Slots in the request lane of the streams built by [`stream`].
const REQUEST_CAPACITY: usize = 64;

/// A backend under test: how to build its streams, and what the port cannot tell.
pub trait Backend: Sized {
    /// The backend's stream; `'static`, so that it (in an `Arc`) and its ends can move to threads.
    type Stream: Stream + 'static;
    /// What a worker thread holds to ack a delivery: the backend's split-off ack right (the memory
    /// backend's `AckHandle`), or the delivery itself for a backend that has no split.
    type Handle: WorkerHandle;

    /// The backend's name, for messages.
    fn name(&self) -> &'static str;

    /// A fresh stream, sharing nothing with any other: `capacity` slots per sink lane,
    /// `request_capacity` in the request lane, one lane per sink, in order. Panics if it cannot.
    fn build(&self, capacity: usize, request_capacity: usize, sinks: &[&str]) -> Self::Stream;

    /// Port gap: `LaneDelivery` has no split into an ack handle.
    fn worker_handle(&self, delivery: DeliveryOf<Self>) -> Self::Handle;

    /// The factor applied to the item counts of the long-running tests (l12's 20,000 items,
    /// w3/w4's thousands per lane, the racing rounds): 1 in memory; a backend whose every
    /// operation is a network round trip runs them smaller, never skips them.
    fn scale(&self) -> f64 {
        1.0
    }

    /// Whether a detached consumer's stale delivery keeps its item's slot taken after the new
    /// consumer acked it ([L8](lanestream::contract): the memory backend reads items in place).
    /// A backend whose deliveries hold their own copy frees the room at the ack, and says so
    /// here; the test then checks that instead.
    fn stale_deliveries_pin_slots(&self) -> bool {
        true
    }
}

/// `n` scaled by the backend's [`Backend::scale`], at least `min`.
fn scaled<B: Backend>(b: &B, n: u64, min: u64) -> u64 {
    ((n as f64 * b.scale()) as u64).max(min)
}

/// The ack right a worker thread holds (see [`Backend::Handle`]); dropping it nacks.
pub trait WorkerHandle: Send + fmt::Debug + 'static {
    /// Which delivery of the item this is: 1 for the first.
    fn attempt(&self) -> u32;
    /// Acknowledges the item.
    fn ack(self) -> Result<(), AckError>;
}

/// A backend's sink-lane delivery.
pub type DeliveryOf<B> = <<<B as Backend>::Stream as Stream>::Consumer as LaneConsumer<LaneItem>>::Delivery;

/// Instantiates every generic contract test of this module as a `#[test]` of the same name for
/// the backend `$backend` (an expression, evaluated once per test). Invoke it at the top of a test
/// file, or inside a `mod` to keep two backends apart in one file.
macro_rules! port_contract_tests {
    ($backend:expr) => {
        $crate::port_contract::port_contract_tests!(@each $backend;
            i1_position_is_the_batchs_and_none_for_snapshot_rows_and_snapshot_complete,
            i2_empty_batch_keeps_its_position_and_acking_it_counts,
            l1_the_sinks_are_the_built_ones_and_any_other_name_is_an_unknown_lane,
            l2_delivery_is_in_publish_order_with_redeliveries_first,
            l2_wraparound_keeps_publish_order_for_capacities_1_2_3_5_7,
            l3_try_publish_on_a_full_lane_hands_the_item_back_with_full,
            l3_publish_on_a_full_lane_waits_until_an_ack_makes_room,
            l3_publishing_to_a_closed_lane_hands_the_item_back_with_closed,
            l4_publish_to_reaches_one_lane_and_panics_past_the_last,
            l4_regressed_position_is_refused_and_item_handed_back,
            l5_acked_position_follows_the_contiguous_acked_prefix,
            l5_acks_from_other_threads_in_any_order_count,
            l6_only_released_items_are_redelivered_and_attempt_counts_deliveries,
            l8_reattach_redelivers_unacked_in_order_and_detaches_old,
            l8_reattached_consumer_that_caught_up_sees_empty_not_a_phantom_item,
            l8_late_ack_before_reattach_lands_and_is_not_redelivered,
            l8_late_ack_after_reattach_is_detached_and_the_item_redelivered,
            l8_late_ack_racing_a_reattach_lands_xor_is_redelivered,
            l8_an_ack_counts_at_once_while_a_detached_delivery_still_holds_the_slot,
            l8_reattach_wakes_a_detached_consumer_blocked_in_recv,
            l8_attach_refuses_while_a_consumer_is_attached_and_takes_back_a_dropped_ones_deliveries,
            l9_a_second_live_fanout_is_busy_and_a_restarted_fanout_continues,
            l9_racing_fanout_claims_exactly_one_wins,
            l10_close_drains_queued_and_released_items_then_recv_returns_none,
            l10_close_wakes_a_blocked_recv,
            l10_lane_close_wakes_a_blocked_publish_which_hands_the_item_back,
            l10_request_lane_close_refuses_senders_and_drains_then_ends,
            l10_close_racing_a_last_publish_still_delivers_the_item,
            l10_close_takes_no_slot_even_on_a_full_lane,
            l11_is_empty_means_nothing_queued_and_nothing_released,
            l12_try_recv_returns_promptly_while_a_publish_is_blocked_on_a_full_lane,
            l12_try_recv_never_blocks_against_a_publisher_in_full_flight,
            w1_watermark_is_the_min_over_lanes_and_none_until_every_lane_acked,
            w2_snapshot_batches_snapshot_complete_and_requests_never_move_the_watermark,
            w3_watermark_never_decreases_seen_from_one_thread,
            w4_a_reader_that_sees_watermark_p_sees_the_sinks_writes_up_to_p,
            w5_is_idle_only_when_nothing_is_queued_released_or_unacked_anywhere,
            w6_wait_watermark_returns_at_the_target_at_the_deadline_or_once_closed_and_drained,
            l3_runs_publish_what_fits_now_or_every_item_waiting_for_room,
            r1_many_senders_publish_requests_concurrently_and_one_ingest_engine_consumes,
            r1_attach_requests_refuses_while_an_ingest_engine_is_attached,
            r2_requests_follow_the_lane_rules_for_nack_redelivery_and_reattach,
            r2_backfill_is_acked_after_snapshot_complete_and_redelivered_after_a_crash_mid_snapshot,
            runs_are_consecutive_acked_together_released_whole_and_end_with_the_lane,
        );
    };
    (@each $backend:expr; $($test:ident,)*) => {
        $(
            #[test]
            fn $test() {
                $crate::port_contract::$test(&$backend);
            }
        )*
    };
}
pub(crate) use port_contract_tests;

// ----- Helpers ---------------------------------------------------------------------------------

/// A stream of `capacity` slots per lane over `sinks` (and a request lane of 64 slots).
fn stream<B: Backend>(b: &B, capacity: usize, sinks: &[&str]) -> B::Stream {
    b.build(capacity, REQUEST_CAPACITY, sinks)
}

/// The sinks' names, owned (to move to threads).
fn sink_names<S: Stream>(s: &S) -> Vec<String> {
    s.sinks().iter().map(|n| n.as_str().to_owned()).collect()
}

/// The position of a delivered positioned item (panics if it has none).
fn pos<D: LaneDelivery<LaneItem>>(delivery: &D) -> u64 {
    delivery.item().position().expect("a positioned item").0
}

/// The error of a result that must have failed (the port's ends and deliveries need not be
/// `Debug`, so `unwrap_err` is not available on them).
fn err<T, E>(result: Result<T, E>) -> E {
    match result {
        Ok(_) => panic!("expected an error, got Ok"),
        Err(e) => e,
    }
}

/// Receives with `try_recv` until the lane has nothing more, acking each delivery; returns the
/// positions in delivery order.
fn drain_try<T: Item, C: LaneConsumer<T>>(consumer: &mut C) -> Vec<Option<u64>> {
    let mut got = Vec::new();
    while let Ok(d) = consumer.try_recv() {
        got.push(d.item().position().map(|p| p.0));
        d.ack().unwrap();
    }
    got
}

/// Receives with `recv` until it returns `None` (closed and drained), acking each delivery;
/// returns the positions and attempts in delivery order.
fn drain_closed<T: Item, C: LaneConsumer<T>>(consumer: &mut C) -> Vec<(Option<u64>, u32)> {
    let mut got = Vec::new();
    while let Some(d) = consumer.recv().unwrap() {
        got.push((d.item().position().map(|p| p.0), d.attempt()));
        d.ack().unwrap();
    }
    got
}

/// Asserts the lane's idleness ([W5](lanestream::contract): nothing queued, released or unacked).
fn assert_lane_idle<B: Backend>(b: &B, s: &B::Stream, sink: &str, idle: bool, what: &str) {
    let st = s.stats(sink).unwrap();
    assert_eq!(st.acked_items == st.published, idle, "{}: lane {sink} idle: {what}", b.name());
}

// ----- Items ---------------------------------------------------------------------------------

pub fn i1_position_is_the_batchs_and_none_for_snapshot_rows_and_snapshot_complete<B: Backend>(b: &B) {
    assert_eq!(batch(42).position(), Some(Position(42)));
    assert_eq!(snapshot().position(), None);
    assert_eq!(complete("users").position(), None);
    assert_eq!(Item::position(&backfill("search", "users")), None);
    // The same through a lane: a delivery reports its item's position.
    let s = stream(b, 3, &["search"]);
    let (mut p, mut c) = (s.fanout().unwrap(), s.reattach("search").unwrap());
    for item in [batch(7), snapshot(), complete("users")] {
        p.publish(item).unwrap();
    }
    let got: Vec<_> = (0..3).map(|_| c.try_recv().unwrap()).collect();
    assert_eq!(got.iter().map(|d| d.item().position()).collect::<Vec<_>>(), [Some(Position(7)), None, None]);
}

pub fn i2_empty_batch_keeps_its_position_and_acking_it_counts<B: Backend>(b: &B) {
    let empty = Batch::new(Some(Position(9)), Vec::new().into());
    assert_eq!((empty.position, empty.changes, empty.envelopes.len()), (Some(Position(9)), 0, 0));
    let s = stream(b, 2, &["search", "cache"]);
    s.fanout().unwrap().publish(LaneItem::Batch(empty.clone())).unwrap();
    for sink in sink_names(&s) {
        let d = s.reattach(&sink).unwrap().try_recv().unwrap();
        assert_eq!(d.item().position(), Some(Position(9)));
        d.ack().unwrap();
        assert_eq!(s.acked(&sink).unwrap(), Some(Position(9)));
    }
    assert_eq!(s.watermark(), Some(Position(9)));
}

// ----- Lanes ---------------------------------------------------------------------------------

pub fn l1_the_sinks_are_the_built_ones_and_any_other_name_is_an_unknown_lane<B: Backend>(b: &B) {
    let s = stream(b, 4, &["search", "cache", "archive"]);
    let names = sink_names(&s);
    assert_eq!(names, ["search", "cache", "archive"], "in build order");
    for sink in &names {
        assert_eq!(s.acked(sink).unwrap(), None);
    }
    let unknown = StreamError::UnknownLane("nope".into());
    assert_eq!(err(s.attach("nope")), unknown);
    assert_eq!(err(s.reattach("nope")), unknown);
    assert_eq!(s.close("nope"), Err(unknown.clone()));
    assert_eq!(s.acked("nope"), Err(unknown.clone()));
    assert!(unknown.to_string().contains("nope"));
    // Nothing was added by asking.
    assert_eq!(sink_names(&s), names);
}

pub fn l2_delivery_is_in_publish_order_with_redeliveries_first<B: Backend>(b: &B) {
    let s = stream(b, 7, &["search"]);
    let (mut p, mut c) = (s.fanout().unwrap(), s.reattach("search").unwrap());
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
    assert_eq!(err(c.try_recv()), TryRecvError::Empty);
    drop(d2);
}

pub fn l2_wraparound_keeps_publish_order_for_capacities_1_2_3_5_7<B: Backend>(b: &B) {
    let name = b.name();
    for cap in WRAP_CAPACITIES {
        let s = stream(b, cap, &["search"]);
        let (mut p, mut c) = (s.fanout().unwrap(), s.reattach("search").unwrap());
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
                    assert_eq!(pos(&d), expected, "{name}: capacity {cap}, lap {lap}");
                    expected += 1;
                }
                if deliveries % 3 == 0 && d.attempt() == 1 {
                    let again = pos(&d);
                    d.nack();
                    let r = c.try_recv().unwrap();
                    deliveries += 1;
                    assert_eq!(
                        (pos(&r), r.attempt()),
                        (again, 2),
                        "{name}: capacity {cap}: redelivery comes first"
                    );
                    held.push(r);
                } else {
                    held.push(d);
                }
            }
            assert_eq!(held.len(), fill);
            while let Some(d) = held.pop() {
                d.ack().unwrap();
            }
            assert_eq!(
                s.acked("search").unwrap(),
                Some(Position(next_pos - 1)),
                "{name}: capacity {cap}, lap {lap}"
            );
            {
                let st = s.stats("search").unwrap();
                assert_eq!((st.capacity, st.queued, st.released, st.in_flight), (cap, 0, 0, 0));
                assert_eq!((st.published, st.acked_items), (next_pos - 1, next_pos - 1));
            }
        }
        assert!(next_pos > 3 * cap as u64, "several laps");
    }
}

pub fn l3_try_publish_on_a_full_lane_hands_the_item_back_with_full<B: Backend>(b: &B) {
    let s = stream(b, 2, &["search"]);
    let mut p = s.fanout().unwrap();
    let env = shared_envelopes(3);
    p.try_publish(batch(1)).unwrap();
    p.try_publish(batch(2)).unwrap();
    match p.try_publish(tracked(Some(3), &env)) {
        Err(PublishError::Full(item)) => assert_eq!(item, tracked(Some(3), &env)),
        other => panic!("{}: expected Full, got {other:?}", b.name()),
    }
    assert_eq!(Arc::strong_count(&env), 1, "the handed-back item was dropped by us, not kept");
    {
        let st = s.stats("search").unwrap();
        assert_eq!((st.published, st.queued, st.last_published), (2, 2, Some(Position(2))));
    }
    let err = p.publish_timeout(batch(3), Duration::from_millis(20)).unwrap_err();
    assert!(matches!(err, PublishError::Timeout(_)));
    assert_eq!(err.into_inner().position(), Some(Position(3)));
}

pub fn l3_publish_on_a_full_lane_waits_until_an_ack_makes_room<B: Backend>(b: &B) {
    let s = stream(b, 1, &["search"]);
    let mut c = s.reattach("search").unwrap();
    let mut p = s.fanout().unwrap();
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

pub fn l3_publishing_to_a_closed_lane_hands_the_item_back_with_closed<B: Backend>(b: &B) {
    let s = stream(b, 2, &["search"]);
    let mut p = s.fanout().unwrap();
    p.publish(batch(1)).unwrap();
    p.close();
    {
        let st = s.stats("search").unwrap();
        assert!(st.closed, "the fan-out's close closed the lane");
    }
    let env = shared_envelopes(2);
    for result in [
        p.try_publish(tracked(Some(2), &env)),
        p.publish(tracked(Some(2), &env)),
        p.publish_timeout(tracked(Some(2), &env), Duration::from_millis(1)).map_err(|e| {
            assert!(e.is_closed());
            PublishError::Closed(e.into_inner())
        }),
    ] {
        match result {
            Err(PublishError::Closed(item)) => assert_eq!(item.position(), Some(Position(2))),
            other => panic!("{}: expected Closed, got {other:?}", b.name()),
        }
    }
    // Also for a later fan-out of the stream.
    drop(p);
    let mut p2 = s.fanout().unwrap();
    assert!(matches!(p2.try_publish(batch(3)), Err(PublishError::Closed(_))));
    assert_eq!(Arc::strong_count(&env), 1);
    {
        let st = s.stats("search").unwrap();
        assert_eq!(st.published, 1);
    }
}

/// L4 and the port's `publish_to`: an item to one lane reaches that lane only (the others skip
/// it), its position counts on every lane (a later item must rise above it), and a lane index
/// past the last panics.
pub fn l4_publish_to_reaches_one_lane_and_panics_past_the_last<B: Backend>(b: &B) {
    let s = stream(b, 4, &["a", "b"]);
    let mut f = s.fanout().unwrap();
    let (mut ca, mut cb) = (s.reattach("a").unwrap(), s.reattach("b").unwrap());
    f.publish(batch(1)).unwrap();
    f.publish_to(1, batch(2)).unwrap();
    f.try_publish_to(0, batch(3)).unwrap();
    assert!(matches!(f.try_publish(batch(3)), Err(PublishError::PositionRegressed { .. })));
    f.publish(batch(4)).unwrap();
    assert_eq!(drain_try(&mut ca), [Some(1), Some(3), Some(4)]);
    assert_eq!(drain_try(&mut cb), [Some(1), Some(2), Some(4)]);
    assert_eq!(f.lanes(), 2);
    let past = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f.publish_to(2, batch(5))));
    assert!(past.is_err(), "{}: publish_to past the last lane must panic", b.name());
}

pub fn l4_regressed_position_is_refused_and_item_handed_back<B: Backend>(b: &B) {
    let s = stream(b, 8, &["search"]);
    let (mut p, mut c) = (s.fanout().unwrap(), s.reattach("search").unwrap());
    p.publish(batch(10)).unwrap();
    let env = shared_envelopes(0);
    for bad in [10, 9, 0] {
        match p.try_publish(tracked(Some(bad), &env)) {
            Err(PublishError::PositionRegressed { item, position, last }) => {
                assert_eq!(
                    (item.position(), position, last),
                    (Some(Position(bad)), Position(bad), Position(10))
                );
            }
            other => panic!("{}: position {bad} after 10: {other:?}", b.name()),
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
    {
        let st = s.stats("search").unwrap();
        assert_eq!(st.published, 3);
    }
}

pub fn l5_acked_position_follows_the_contiguous_acked_prefix<B: Backend>(b: &B) {
    let s = stream(b, 5, &["search"]);
    let (mut p, mut c) = (s.fanout().unwrap(), s.reattach("search").unwrap());
    for item in [batch(10), batch(20), snapshot(), batch(30), batch(40)] {
        p.publish(item).unwrap();
    }
    let acked_items = || Some(s.stats("search").unwrap().acked_items);
    let mut d: Vec<_> = (0..5).map(|_| Some(c.try_recv().unwrap())).collect();
    let mut ack = |i: usize| d[i].take().unwrap().ack().unwrap();
    ack(1);
    assert_eq!(s.acked("search").unwrap(), None, "item 2 acked while 1 is outstanding");
    ack(4);
    assert_eq!(s.acked("search").unwrap(), None);
    if let Some(n) = acked_items() {
        assert_eq!(n, 0);
    }
    ack(0);
    assert_eq!(s.acked("search").unwrap(), Some(Position(20)), "prefix = items 1, 2");
    ack(2);
    assert_eq!(s.acked("search").unwrap(), Some(Position(20)), "the snapshot row has no position");
    if let Some(n) = acked_items() {
        assert_eq!(n, 3);
    }
    ack(3);
    assert_eq!(s.acked("search").unwrap(), Some(Position(40)));
    assert_lane_idle(b, &s, "search", true, "everything acked");
    assert!(s.is_idle());
}

pub fn l5_acks_from_other_threads_in_any_order_count<B: Backend>(b: &B) {
    let s = stream(b, 5, &["search"]);
    let (mut p, mut c) = (s.fanout().unwrap(), s.reattach("search").unwrap());
    let mut next = 1;
    for round in 0..40 {
        for _ in 0..5 {
            p.publish(batch(next)).unwrap();
            next += 1;
        }
        let handles: Vec<B::Handle> = (0..5).map(|_| b.worker_handle(c.try_recv().unwrap())).collect();
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
        assert_eq!(s.acked("search").unwrap(), Some(Position(next - 1)));
    }
}

pub fn l6_only_released_items_are_redelivered_and_attempt_counts_deliveries<B: Backend>(b: &B) {
    let s = stream(b, 5, &["search"]);
    let (mut p, mut c) = (s.fanout().unwrap(), s.reattach("search").unwrap());
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
    assert_eq!(err(c.try_recv()), TryRecvError::Empty);
    // attempt counts every delivery of that item.
    let mut d = again;
    for n in 2..10 {
        assert_eq!(d.attempt(), n);
        assert_eq!(b.worker_handle(d).attempt(), n); // dropped: released again
        d = c.try_recv().unwrap();
    }
    assert_eq!((pos(&d), d.attempt()), (2, 10));
    {
        let st = s.stats("search").unwrap();
        assert_eq!(st.redelivered, 10);
    }
    for x in [d1, d, d3, r4] {
        x.ack().unwrap();
    }
    assert_lane_idle(b, &s, "search", true, "everything acked");
    assert!(s.is_idle());
}

/// The positions of a run's items, in order.
fn run_positions<R: LaneRun<LaneItem>>(run: &R) -> Vec<u64> {
    (0..run.len()).map(|i| run.get(i).and_then(Item::position).expect("a positioned item").0).collect()
}

/// [Runs](lanestream::contract#runs) through the port: a run holds consecutive items in publish
/// order (at most `max`); its ack counts for every item; dropping it releases every item, which
/// come again (as redeliveries) before anything new; `recv_run` ends with the closed lane.
pub fn runs_are_consecutive_acked_together_released_whole_and_end_with_the_lane<B: Backend>(b: &B) {
    let s = stream(b, 8, &["search"]);
    let (mut p, mut c) = (s.fanout().unwrap(), s.reattach("search").unwrap());
    assert_eq!(err(c.try_recv_run(4)), TryRecvError::Empty);
    for i in 1..=6 {
        p.publish(batch(i)).unwrap();
    }
    let first = c.try_recv_run(4).unwrap();
    assert_eq!(run_positions(&first), [1, 2, 3, 4], "the first 4 of what is queued, in order");
    assert_eq!(first.redelivered(), 0);
    let second = c.recv_run_timeout(4, Duration::from_secs(5)).unwrap().expect("items 5 and 6");
    assert_eq!(run_positions(&second), [5, 6], "what is queued, not waiting for a full run");
    assert_eq!(err(c.try_recv_run(4)), TryRecvError::Empty, "nothing is delivered twice");
    first.ack().unwrap();
    assert_eq!(s.acked("search").unwrap(), Some(Position(4)), "the run's ack counts for each item");
    drop(second); // released whole
    let mut again = Vec::new();
    while again.len() < 2 {
        let run = c.try_recv_run(4).unwrap();
        assert_eq!(run.redelivered(), run.len(), "every released item comes again as a redelivery");
        again.extend(run_positions(&run));
        run.ack().unwrap();
    }
    assert_eq!(again, [5, 6]);
    assert_eq!(s.watermark(), Some(Position(6)));
    p.publish(batch(7)).unwrap();
    p.close();
    let last = c.recv_run(4).unwrap().expect("item 7 is drained after the close");
    assert_eq!(run_positions(&last), [7]);
    last.ack().unwrap();
    assert!(c.recv_run(4).unwrap().is_none(), "closed and drained: the end");
    assert!(s.is_idle());
}

pub fn l8_reattach_redelivers_unacked_in_order_and_detaches_old<B: Backend>(b: &B) {
    let s = stream(b, 7, &["search"]);
    let mut p = s.fanout().unwrap();
    let mut c1 = s.reattach("search").unwrap();
    for i in 1..=6 {
        p.publish(batch(i)).unwrap();
    }
    let d: Vec<_> = (0..4).map(|_| c1.try_recv().unwrap()).collect();
    let mut d = d.into_iter();
    let (d1, d2, d3, d4) = (d.next().unwrap(), d.next().unwrap(), d.next().unwrap(), d.next().unwrap());
    d2.ack().unwrap();
    d3.nack();
    let mut c2 = s.reattach("search").unwrap();
    assert!(c1.is_detached() && !c2.is_detached());
    assert_eq!(err(c1.try_recv()), TryRecvError::Detached);
    assert_eq!(err(c1.recv()), RecvError::Detached);
    assert_eq!(err(c1.recv_timeout(Duration::from_millis(1))), RecvTimeoutError::Detached);
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
    assert_eq!(err(c2.try_recv()), TryRecvError::Empty, "a stale nack releases nothing");
    p.publish(batch(7)).unwrap();
    assert_eq!(pos(&c2.try_recv().unwrap()), 7);
    for x in got.into_iter().chain([d6]) {
        x.ack().unwrap();
    }
    assert_eq!(s.acked("search").unwrap(), Some(Position(6)));
}

pub fn l8_reattached_consumer_that_caught_up_sees_empty_not_a_phantom_item<B: Backend>(b: &B) {
    // Regression (fixed in d14a2a9): a re-attached consumer's cached tail started at 0, behind
    // `next`, so once caught up it "delivered" the unpublished slot at `next`.
    let name = b.name();
    for cap in WRAP_CAPACITIES {
        let s = stream(b, cap, &["search"]);
        let mut p = s.fanout().unwrap();
        p.publish(batch(1)).unwrap();
        s.reattach("search").unwrap().try_recv().unwrap().ack().unwrap();
        let mut c2 = s.reattach("search").unwrap();
        match c2.try_recv() {
            Err(TryRecvError::Empty) => {}
            Ok(phantom) => {
                // Not read: the handle's Debug names the item without touching its slot.
                let handle = b.worker_handle(phantom);
                panic!("{name}: capacity {cap}: phantom delivery of an unpublished item: {handle:?}");
            }
            Err(e) => panic!("{name}: capacity {cap}: {e:?}"),
        }
        p.publish(batch(2)).unwrap();
        let d2 = c2.try_recv().unwrap();
        assert_eq!((pos(&d2), d2.attempt()), (2, 1));
        d2.ack().unwrap();
        assert!(matches!(c2.try_recv(), Err(TryRecvError::Empty)));
        {
            let st = s.stats("search").unwrap();
            assert_eq!(st.queued, 0);
        }
    }
}

pub fn l8_late_ack_before_reattach_lands_and_is_not_redelivered<B: Backend>(b: &B) {
    let s = stream(b, 3, &["search"]);
    let mut p = s.fanout().unwrap();
    let mut c1 = s.reattach("search").unwrap();
    p.publish(batch(1)).unwrap();
    p.publish(batch(2)).unwrap();
    let h1 = b.worker_handle(c1.try_recv().unwrap());
    let h2 = b.worker_handle(c1.try_recv().unwrap());
    // The worker acks item 1 before the sink engine restarts: it lands.
    assert_eq!(h1.ack(), Ok(()));
    let mut c2 = s.reattach("search").unwrap();
    let r = c2.try_recv().unwrap();
    assert_eq!((pos(&r), r.attempt()), (2, 2), "only the unacked item comes back");
    assert_eq!(err(c2.try_recv()), TryRecvError::Empty);
    assert_eq!(s.acked("search").unwrap(), Some(Position(1)));
    r.ack().unwrap();
    assert_eq!(h2.ack(), Err(AckError::Detached));
    assert_eq!(s.acked("search").unwrap(), Some(Position(2)));
}

pub fn l8_late_ack_after_reattach_is_detached_and_the_item_redelivered<B: Backend>(b: &B) {
    let s = stream(b, 3, &["search"]);
    let mut p = s.fanout().unwrap();
    let mut c1 = s.reattach("search").unwrap();
    p.publish(batch(1)).unwrap();
    let h1 = b.worker_handle(c1.try_recv().unwrap());
    let mut c2 = s.reattach("search").unwrap();
    // Late ack before the new consumer took the redelivery.
    assert_eq!(h1.ack(), Err(AckError::Detached));
    assert_eq!(s.acked("search").unwrap(), None, "a refused ack does not count");
    let r = c2.try_recv().unwrap();
    assert_eq!((pos(&r), r.attempt()), (1, 2));
    // And a late ack after the redelivery was handed out.
    let mut c3 = s.reattach("search").unwrap();
    assert_eq!(r.ack(), Err(AckError::Detached));
    let r = c3.try_recv().unwrap();
    assert_eq!((pos(&r), r.attempt()), (1, 3));
    r.ack().unwrap();
    assert_eq!(s.acked("search").unwrap(), Some(Position(1)));
    assert_lane_idle(b, &s, "search", true, "everything acked");
    assert!(s.is_idle());
}

pub fn l8_late_ack_racing_a_reattach_lands_xor_is_redelivered<B: Backend>(b: &B) {
    let s = stream(b, 1, &["search"]);
    let mut p = s.fanout().unwrap();
    let (mut landed, mut refused) = (0, 0);
    let rounds = scaled(b, 300, 50);
    for i in 1..=rounds {
        p.publish(batch(i)).unwrap();
        let h = b.worker_handle(s.reattach("search").unwrap().try_recv().unwrap());
        let start = Arc::new(Barrier::new(2));
        let acker = {
            let start = start.clone();
            thread::spawn(move || {
                start.wait();
                h.ack()
            })
        };
        start.wait();
        let mut c = s.reattach("search").unwrap();
        let result = acker.join().unwrap();
        match (result, c.try_recv()) {
            (Ok(()), Err(TryRecvError::Empty)) => landed += 1,
            (Err(AckError::Detached), Ok(r)) => {
                assert_eq!((pos(&r), r.attempt()), (i, 2));
                r.ack().unwrap();
                refused += 1;
            }
            (result, other) => {
                panic!("{}: item {i}: ack {result:?} but receive {:?}", b.name(), other.map(|d| pos(&d)))
            }
        }
        assert_eq!(s.acked("search").unwrap(), Some(Position(i)));
    }
    assert_eq!(landed + refused, rounds);
    eprintln!("{}: late acks: {landed} landed, {refused} refused", b.name());
}

pub fn l8_an_ack_counts_at_once_while_a_detached_delivery_still_holds_the_slot<B: Backend>(b: &B) {
    let s = stream(b, 1, &["search"]);
    let mut p = s.fanout().unwrap();
    p.publish(batch(1)).unwrap();
    let stale = s.reattach("search").unwrap().try_recv().unwrap();
    let mut c2 = s.reattach("search").unwrap();
    c2.try_recv().unwrap().ack().unwrap();
    if !b.stale_deliveries_pin_slots() {
        // The stale delivery holds its own copy: the ack made room at once, and it counts.
        assert_eq!(stale.item(), &batch(1));
        assert_eq!(s.acked("search").unwrap(), Some(Position(1)));
        assert_eq!(s.watermark(), Some(Position(1)));
        assert!(s.is_idle(), "everything published is acked");
        {
            let st = s.stats("search").unwrap();
            assert_eq!((st.pinned, st.free_slots()), (0, 1), "{}: nothing pinned", b.name());
        }
        p.try_publish(batch(2)).unwrap();
        assert_eq!(stale.ack(), Err(AckError::Detached), "still stale");
        assert_eq!(pos(&c2.try_recv().unwrap()), 2);
        return;
    }
    // Acked, but the detached delivery still reads the item: its slot stays taken (L3).
    assert!(matches!(p.try_publish(batch(2)), Err(PublishError::Full(_))));
    assert_eq!(stale.item(), &batch(1));
    // Only the slot waits for the stale reader: the ack counts at once (L5, W1, W5).
    assert_eq!(
        s.acked("search").unwrap(),
        Some(Position(1)),
        "an acked item moves the acked position at once"
    );
    assert_eq!(s.watermark(), Some(Position(1)));
    assert!(s.is_idle(), "everything published is acked");
    {
        let st = s.stats("search").unwrap();
        assert_eq!((st.pinned, st.free_slots()), (1, 0), "the stale delivery pins the slot");
    }
    drop(stale);
    assert_eq!(s.acked("search").unwrap(), Some(Position(1)));
    {
        let st = s.stats("search").unwrap();
        assert_eq!((st.pinned, st.free_slots()), (0, 1), "released once the last reader left");
    }
    p.try_publish(batch(2)).unwrap();
    assert_eq!(pos(&c2.try_recv().unwrap()), 2);
}

pub fn l8_reattach_wakes_a_detached_consumer_blocked_in_recv<B: Backend>(b: &B) {
    let s = stream(b, 2, &["search"]);
    let mut c1 = s.reattach("search").unwrap();
    let blocked = thread::spawn(move || c1.recv().map(|d| d.is_some()));
    thread::sleep(Duration::from_millis(30));
    let _c2 = s.reattach("search").unwrap();
    let r = within(10, "detached recv", move || blocked.join().unwrap());
    assert_eq!(r, Err(RecvError::Detached));
}

pub fn l8_attach_refuses_while_a_consumer_is_attached_and_takes_back_a_dropped_ones_deliveries<B: Backend>(
    b: &B,
) {
    let s = stream(b, 4, &["search"]);
    let mut p = s.fanout().unwrap();
    for i in 1..=3 {
        p.publish(batch(i)).unwrap();
    }
    let mut c1 = s.attach("search").unwrap();
    assert_eq!(err(s.attach("search")), StreamError::ConsumerAttached(SinkName::new("search").unwrap()));
    let d1 = c1.try_recv().unwrap();
    let d2 = c1.try_recv().unwrap();
    d1.ack().unwrap();
    assert!(matches!(s.attach("search"), Err(StreamError::ConsumerAttached(_))), "still attached");
    // Once the consumer is dropped, the next attach succeeds and takes its outstanding delivery back.
    drop(c1);
    let mut c2 = s.attach("search").unwrap();
    assert!(!c2.is_detached());
    assert_eq!(d2.ack(), Err(AckError::Detached), "taken back by the attach");
    let got: Vec<_> = (0..2).map(|_| c2.try_recv().unwrap()).collect();
    assert_eq!(got.iter().map(|d| (pos(d), d.attempt())).collect::<Vec<_>>(), [(2, 2), (3, 1)]);
    got.into_iter().for_each(|d| d.ack().unwrap());
    assert_eq!(s.acked("search").unwrap(), Some(Position(3)));
    // `reattach` is not refused: it detaches the attached consumer.
    let c3 = s.reattach("search").unwrap();
    assert!(c2.is_detached() && !c3.is_detached());
    assert!(matches!(s.attach("search"), Err(StreamError::ConsumerAttached(_))));
}

pub fn l9_a_second_live_fanout_is_busy_and_a_restarted_fanout_continues<B: Backend>(b: &B) {
    let s = Arc::new(stream(b, 8, &["search"]));
    let mut p1 = s.fanout().unwrap();
    assert_eq!(err(s.fanout()), StreamError::ProducerBusy(SinkName::new("search").unwrap()));
    // Through another reference to the stream, and from another thread: still busy.
    let other = s.clone();
    assert!(matches!(other.fanout(), Err(StreamError::ProducerBusy(_))));
    let s2 = s.clone();
    assert!(thread::spawn(move || s2.fanout().is_err()).join().unwrap());
    // The other side never blocks asking for a lane.
    let mut c = s.reattach("search").unwrap();
    for i in 1..=3 {
        p1.publish(batch(i)).unwrap();
    }
    drop(p1);
    let mut p2 = other.fanout().expect("a restarted producer gets the lane at once");
    assert!(matches!(
        p2.try_publish(batch(3)),
        Err(PublishError::PositionRegressed { last: Position(3), .. })
    ));
    p2.publish(batch(4)).unwrap();
    assert_eq!(drain_try(&mut c), [Some(1), Some(2), Some(3), Some(4)]);
    {
        let st = s.stats("search").unwrap();
        assert_eq!(st.last_published, Some(Position(4)));
    }
}

pub fn l9_racing_fanout_claims_exactly_one_wins<B: Backend>(b: &B) {
    let s = Arc::new(stream(b, 2, &["search"]));
    for _ in 0..100 {
        let barrier = Arc::new(Barrier::new(3));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (s, barrier) = (s.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    s.fanout()
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
        // all dropped here: the next round can claim again
    }
}

pub fn l10_close_drains_queued_and_released_items_then_recv_returns_none<B: Backend>(b: &B) {
    let s = stream(b, 5, &["search"]);
    let (mut p, mut c) = (s.fanout().unwrap(), s.reattach("search").unwrap());
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
    assert_eq!(err(c.try_recv()), TryRecvError::Closed);
    // An item still held when the lane closed is not lost: released later, it comes back.
    held.nack();
    let r = c.recv().unwrap().expect("released after close");
    assert_eq!((pos(&r), r.attempt()), (2, 2));
    r.ack().unwrap();
    assert!(c.recv().unwrap().is_none());
}

pub fn l10_close_wakes_a_blocked_recv<B: Backend>(b: &B) {
    let s = stream(b, 2, &["search"]);
    let p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    let blocked = thread::spawn(move || c.recv().map(|d| d.is_none()));
    thread::sleep(Duration::from_millis(30));
    p.close();
    assert_eq!(within(10, "recv after close", move || blocked.join().unwrap()), Ok(true));
}

pub fn l10_lane_close_wakes_a_blocked_publish_which_hands_the_item_back<B: Backend>(b: &B) {
    let s = stream(b, 1, &["search"]);
    let mut p = s.fanout().unwrap();
    let mut c = s.reattach("search").unwrap();
    p.publish(batch(1)).unwrap();
    // The lane is full: this publish waits, holding the only fan-out (L9), so the supervisor
    // closes through the stream.
    let blocked = thread::spawn(move || p.publish(batch(2)).map_err(|e| e.into_inner().position()));
    thread::sleep(Duration::from_millis(30));
    s.close("search").unwrap();
    let back = within(10, "publish after close", move || blocked.join().unwrap());
    assert_eq!(back, Err(Some(Position(2))), "the waiting publish fails with Closed and hands back its item");
    let d = c.try_recv().unwrap();
    assert_eq!(pos(&d), 1, "what was queued before the close is still delivered");
    d.ack().unwrap();
    assert_eq!(c.try_recv().map(|d| pos(&d)), Err(TryRecvError::Closed));
}

pub fn l10_request_lane_close_refuses_senders_and_drains_then_ends<B: Backend>(b: &B) {
    let s = stream(b, 2, &["search"]);
    let sender = s.request_sender();
    let mut ingest = s.reattach_requests();
    sender.publish(backfill("search", "users")).unwrap();
    s.close_requests();
    match sender.try_publish(backfill("search", "orders")) {
        Err(PublishError::Closed(back)) => assert_eq!(back, backfill("search", "orders")),
        other => panic!("{}: expected Closed with the request handed back, got {other:?}", b.name()),
    }
    let d = ingest.recv().unwrap().expect("the queued request is still delivered");
    assert_eq!(d.item(), &backfill("search", "users"));
    d.ack().unwrap();
    assert!(ingest.recv().unwrap().is_none(), "closed and drained");
}

pub fn l10_close_racing_a_last_publish_still_delivers_the_item<B: Backend>(b: &B) {
    for round in 0..200u64 {
        let s = stream(b, 2, &["search"]);
        let mut p = s.fanout().unwrap();
        let mut c = s.reattach("search").unwrap();
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
        assert_eq!(got, (1..=n).collect::<Vec<_>>(), "{}: round {round}", b.name());
    }
}

pub fn l10_close_takes_no_slot_even_on_a_full_lane<B: Backend>(b: &B) {
    for cap in WRAP_CAPACITIES {
        let s = stream(b, cap, &["search"]);
        let (mut p, mut c) = (s.fanout().unwrap(), s.reattach("search").unwrap());
        for i in 1..=cap as u64 {
            p.try_publish(batch(i)).unwrap();
        }
        p.close();
        {
            let st = s.stats("search").unwrap();
            assert_eq!((st.published, st.queued, st.closed), (cap as u64, cap as u64, true));
        }
        let got = drain_closed(&mut c);
        assert_eq!(
            got,
            (1..=cap as u64).map(|i| (Some(i), 1)).collect::<Vec<_>>(),
            "{}: capacity {cap}",
            b.name()
        );
    }
}

pub fn l11_is_empty_means_nothing_queued_and_nothing_released<B: Backend>(b: &B) {
    let s = stream(b, 3, &["search"]);
    let (mut p, mut c) = (s.fanout().unwrap(), s.reattach("search").unwrap());
    assert!(c.is_empty());
    p.publish(batch(1)).unwrap();
    assert!(!c.is_empty(), "queued");
    let d = c.try_recv().unwrap();
    assert!(c.is_empty(), "delivered but unacked does not count");
    d.nack();
    assert!(!c.is_empty(), "released");
    let d = c.try_recv().unwrap();
    assert!(c.is_empty());
    let mut c2 = s.reattach("search").unwrap();
    assert!(!c2.is_empty(), "taken back by a re-attach");
    let r = c2.try_recv().unwrap();
    assert!(c2.is_empty());
    r.ack().unwrap();
    drop(d);
    assert!(c2.is_empty());
    assert_lane_idle(b, &s, "search", true, "everything acked");
    assert!(s.is_idle());
}

pub fn l12_try_recv_returns_promptly_while_a_publish_is_blocked_on_a_full_lane<B: Backend>(b: &B) {
    let s = stream(b, 1, &["search"]);
    let (mut p, mut c) = (s.fanout().unwrap(), s.reattach("search").unwrap());
    p.publish(batch(1)).unwrap();
    let d1 = c.try_recv().unwrap();
    let publisher = thread::spawn(move || p.publish(batch(2)).map_err(|e| format!("{e:?}")));
    thread::sleep(Duration::from_millis(30));
    // Each call returns at once: the slowest is bounded, generously (a preempted call on a loaded
    // 2-core machine, or a round trip to a server, may take a while; a blocked one, forever).
    let mut slowest = Duration::ZERO;
    for _ in 0..scaled(b, 10_000, 1_000) {
        let t = Instant::now();
        assert_eq!(err(c.try_recv()), TryRecvError::Empty);
        slowest = slowest.max(t.elapsed());
    }
    assert!(slowest < Duration::from_secs(2), "{}: a try_recv waited {slowest:?}", b.name());
    assert!(c.recv_timeout(Duration::from_millis(5)).is_err());
    d1.ack().unwrap();
    within(10, "publish after ack", move || publisher.join().unwrap()).unwrap();
    assert_eq!(pos(&c.try_recv().unwrap()), 2);
}

pub fn l12_try_recv_never_blocks_against_a_publisher_in_full_flight<B: Backend>(b: &B) {
    let s = stream(b, 3, &["search"]);
    let (mut p, mut c) = (s.fanout().unwrap(), s.reattach("search").unwrap());
    let n = scaled(b, 20_000, 500);
    let publisher = thread::spawn(move || {
        for i in 1..=n {
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
    assert_eq!(expected, n + 1);
    // Generous: a preempted call on a loaded 2-core machine may take a while, a blocked one forever.
    assert!(slowest < Duration::from_secs(2), "{}: slowest try_recv {slowest:?}", b.name());
}

// ----- Watermark and idleness ------------------------------------------------------------------

/// Receives `from..=upto` (published before) and acks each at once.
fn ack_to<C: LaneConsumer<LaneItem>>(c: &mut C, from: u64, upto: u64) {
    for i in from..=upto {
        let d = c.try_recv().unwrap();
        assert_eq!(d.item().position(), Some(Position(i)));
        d.ack().unwrap();
    }
}

pub fn w1_watermark_is_the_min_over_lanes_and_none_until_every_lane_acked<B: Backend>(b: &B) {
    assert_eq!(stream(b, 4, &[]).watermark(), None, "no lanes");
    let s = stream(b, 16, &["a", "b", "c"]);
    let names = sink_names(&s);
    let mut f = s.fanout().unwrap();
    let mut cs: Vec<_> = names.iter().map(|n| s.reattach(n).unwrap()).collect();
    assert_eq!(s.watermark(), None);
    f.publish(snapshot()).unwrap();
    for i in 1..=9 {
        f.publish(batch(i)).unwrap();
    }
    for c in &mut cs[..2] {
        c.try_recv().unwrap().ack().unwrap(); // the snapshot row
    }
    ack_to(&mut cs[0], 1, 5);
    ack_to(&mut cs[1], 1, 3);
    assert_eq!(s.watermark(), None, "lane c has acked nothing");
    cs[2].try_recv().unwrap().ack().unwrap();
    assert_eq!(s.watermark(), None, "a snapshot row is not a position");
    ack_to(&mut cs[2], 1, 9);
    assert_eq!(s.watermark(), Some(Position(3)));
    ack_to(&mut cs[1], 4, 7);
    assert_eq!(s.watermark(), Some(Position(5)));
    assert_eq!(names.iter().map(|n| s.acked(n).unwrap().unwrap().0).collect::<Vec<_>>(), [5, 7, 9]);
}

pub fn w2_snapshot_batches_snapshot_complete_and_requests_never_move_the_watermark<B: Backend>(b: &B) {
    let s = stream(b, 8, &["search"]);
    let (mut p, mut c) = (s.fanout().unwrap(), s.reattach("search").unwrap());
    p.publish(batch(5)).unwrap();
    c.try_recv().unwrap().ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(5)));
    for item in [snapshot(), snapshot(), complete("users")] {
        p.publish(item).unwrap();
        assert_eq!(s.watermark(), Some(Position(5)), "publishing moves nothing");
        c.try_recv().unwrap().ack().unwrap();
        assert_eq!(s.watermark(), Some(Position(5)));
    }
    s.request_sender().publish(backfill("search", "users")).unwrap();
    s.reattach_requests().try_recv().unwrap().ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(5)));
    {
        let st = s.request_stats();
        assert_eq!(st.acked, None, "the request lane has no position");
    }
    // Publishing a positioned batch does not move it either; only its ack does.
    p.publish(batch(6)).unwrap();
    assert_eq!(s.watermark(), Some(Position(5)));
    c.try_recv().unwrap().ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(6)));
}

pub fn w3_watermark_never_decreases_seen_from_one_thread<B: Backend>(b: &B) {
    let n = scaled(b, if cfg!(debug_assertions) { 3_000 } else { 20_000 }, 300);
    let s = Arc::new(stream(b, 3, &["a", "b"]));
    let done = Arc::new(AtomicBool::new(false));
    let sinks: Vec<_> = sink_names(&*s)
        .into_iter()
        .enumerate()
        .map(|(k, sink)| {
            let s = s.clone();
            thread::spawn(move || {
                let mut c = s.reattach(&sink).unwrap();
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
                        let c2 = s.reattach(&sink).unwrap();
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
    let mut f = s.fanout().unwrap();
    for i in 1..=n {
        f.publish(batch(i)).unwrap();
    }
    f.close();
    within(60, "sinks", move || sinks.into_iter().for_each(|t| t.join().unwrap()));
    done.store(true, Ordering::Release);
    let (last, reads) = reader.join().unwrap();
    assert!(reads > 0 && last <= Some(Position(n)));
    assert_eq!(s.watermark(), Some(Position(n)));
}

pub fn w4_a_reader_that_sees_watermark_p_sees_the_sinks_writes_up_to_p<B: Backend>(b: &B) {
    let n = scaled(b, if cfg!(debug_assertions) { 3_000 } else { 30_000 }, 300) as usize;
    let s = Arc::new(stream(b, 5, &["a", "b"]));
    // What each sink "applied": slot p holds p * 3 once position p was applied.
    let applied: Arc<Vec<Vec<AtomicU64>>> =
        Arc::new((0..2).map(|_| (0..=n).map(|_| AtomicU64::new(0)).collect()).collect());
    let sinks: Vec<_> = sink_names(&*s)
        .into_iter()
        .enumerate()
        .map(|(k, sink)| {
            let (s, applied) = (s.clone(), applied.clone());
            thread::spawn(move || {
                let mut c = s.reattach(&sink).unwrap();
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
    let mut f = s.fanout().unwrap();
    for i in 1..=n as u64 {
        f.publish(batch(i)).unwrap();
    }
    f.close();
    sinks.into_iter().for_each(|t| t.join().unwrap());
    let checked = within(30, "reader", move || reader.join().unwrap());
    assert!(checked > 0);
}

/// W6: `wait_watermark` returns at once once the watermark is there (and for a stream with no
/// lanes), at the deadline while it is not, woken by the ack that moves it (blocking and async,
/// from other threads), and once every lane is closed and acked (the watermark is final: it
/// returns what it is, below the target).
pub fn w6_wait_watermark_returns_at_the_target_at_the_deadline_or_once_closed_and_drained<B: Backend>(b: &B) {
    assert_eq!(stream(b, 4, &[]).wait_watermark(Position(1), None), None, "no lanes: at once");
    let s = Arc::new(stream(b, 8, &["a", "b"]));
    let mut f = s.fanout().unwrap();
    let (mut ca, mut cb) = (s.reattach("a").unwrap(), s.reattach("b").unwrap());
    let start = Instant::now();
    assert_eq!(s.wait_watermark(Position(1), Some(start + Duration::from_millis(50))), None);
    assert!(start.elapsed() >= Duration::from_millis(50), "{}: returned before the deadline", b.name());
    for i in 1..=4 {
        f.publish(batch(i)).unwrap();
    }
    ack_to(&mut ca, 1, 3);
    ack_to(&mut cb, 1, 1);
    assert_eq!(s.wait_watermark(Position(1), None), Some(Position(1)), "there already");
    let deadline = Instant::now() + Duration::from_millis(30);
    assert_eq!(s.wait_watermark(Position(2), Some(deadline)), Some(Position(1)), "the deadline");
    let waiter = {
        let s = s.clone();
        thread::spawn(move || s.wait_watermark(Position(2), None))
    };
    thread::sleep(Duration::from_millis(30));
    ack_to(&mut cb, 2, 2);
    assert_eq!(within(10, "wait_watermark", move || waiter.join().unwrap()), Some(Position(2)));
    ack_to(&mut cb, 3, 3);
    let waiter = {
        let s = s.clone();
        thread::spawn(move || futures_executor::block_on(s.wait_watermark_async(Position(4))))
    };
    thread::sleep(Duration::from_millis(30));
    ack_to(&mut ca, 4, 4);
    ack_to(&mut cb, 4, 4);
    assert_eq!(within(10, "wait_watermark_async", move || waiter.join().unwrap()), Some(Position(4)));
    // Every lane closed and drained: 10 can never come; the wait returns the final watermark.
    f.publish(batch(5)).unwrap();
    let waiter = {
        let s = s.clone();
        thread::spawn(move || s.wait_watermark(Position(10), None))
    };
    f.close();
    ack_to(&mut ca, 5, 5);
    thread::sleep(Duration::from_millis(30));
    assert!(!waiter.is_finished(), "{}: lane b still holds 5: the watermark may move", b.name());
    ack_to(&mut cb, 5, 5);
    assert_eq!(within(10, "wait_watermark once final", move || waiter.join().unwrap()), Some(Position(5)));
    assert_eq!(futures_executor::block_on(s.wait_watermark_async(Position(10))), Some(Position(5)));
}

/// L3 for runs: `try_publish_run` publishes the leading items every lane has room for now (at
/// least one, or the refusal of the first carrying 0), stopping before an item that would be
/// refused, and moves them out of the front of the caller's `Vec`; `publish_run` publishes every
/// item, in order, waiting for room, and leaves the `Vec` empty; on an error the `Vec` holds
/// exactly the items not published and the payload is how many were.
pub fn l3_runs_publish_what_fits_now_or_every_item_waiting_for_room<B: Backend>(b: &B) {
    let at = |v: &Vec<LaneItem>| v.iter().map(|i| i.position().unwrap().0).collect::<Vec<_>>();
    let s = Arc::new(stream(b, 4, &["a", "b"]));
    let mut f = s.fanout().unwrap();
    let (mut ca, mut cb) = (s.reattach("a").unwrap(), s.reattach("b").unwrap());
    let mut items: Vec<LaneItem> = (1..=10).map(batch).collect();
    assert_eq!(f.try_publish_run(&mut vec![]), Ok(0));
    assert_eq!(f.try_publish_run(&mut items), Ok(4), "{}: as many as every lane has room for", b.name());
    assert_eq!(at(&items), (5..=10).collect::<Vec<_>>(), "{}: the published prefix moved out", b.name());
    assert_eq!(f.try_publish_run(&mut items), Err(PublishError::Full(0)));
    assert_eq!(at(&items), (5..=10).collect::<Vec<_>>(), "{}: a refusal hands every item back", b.name());
    ack_to(&mut ca, 1, 4);
    ack_to(&mut cb, 1, 2);
    assert_eq!(f.try_publish_run(&mut items), Ok(2), "{}: lane b has room for 2", b.name());
    assert_eq!(at(&items), (7..=10).collect::<Vec<_>>());
    let mut old = vec![batch(1), batch(2)];
    assert!(matches!(
        f.try_publish_run(&mut old),
        Err(PublishError::PositionRegressed { item: 0, position: Position(1), last: Position(6) })
    ));
    assert_eq!(at(&old), [1, 2], "{}: a regressed run is handed back whole", b.name());
    ack_to(&mut ca, 5, 6);
    ack_to(&mut cb, 3, 6);
    let mut stops = vec![batch(7), batch(8), batch(3), batch(9)];
    assert_eq!(f.try_publish_run(&mut stops), Ok(2), "stops before 3");
    assert_eq!(at(&stops), [3, 9]);
    let sinks: Vec<_> = [ca, cb]
        .into_iter()
        .map(|mut c| {
            thread::spawn(move || {
                let mut got = Vec::new();
                while let Some(d) = c.recv().unwrap() {
                    got.push(pos(&d));
                    d.ack().unwrap();
                }
                got
            })
        })
        .collect();
    let mut rest: Vec<LaneItem> = (9..=40).map(batch).collect();
    f.publish_run(&mut rest).unwrap();
    assert!(rest.is_empty(), "{}: publish_run moves every item in", b.name());
    f.close();
    for (lane, t) in sinks.into_iter().enumerate() {
        let got = within(30, "sinks", move || t.join().unwrap());
        assert_eq!(got, (7..=40).collect::<Vec<_>>(), "{}: lane {lane}", b.name());
    }
    let mut late = vec![batch(41), batch(42)];
    assert_eq!(f.publish_run(&mut late), Err(PublishError::Closed(0)));
    assert_eq!(at(&late), [41, 42], "{}: a closed stream hands the run back", b.name());
    assert_eq!(s.watermark(), Some(Position(40)));
}

pub fn w5_is_idle_only_when_nothing_is_queued_released_or_unacked_anywhere<B: Backend>(b: &B) {
    let s = stream(b, 4, &["a", "b"]);
    assert!(s.is_idle());
    let (mut p, mut c) = (s.fanout().unwrap(), s.reattach("b").unwrap());
    p.publish(batch(1)).unwrap();
    p.publish(batch(2)).unwrap();
    assert!(!s.is_idle(), "queued");
    // Lane a takes both at once: from here on only lane b holds anything.
    let mut a = s.reattach("a").unwrap();
    ack_to(&mut a, 1, 2);
    assert_lane_idle(b, &s, "a", true, "lane a acked everything");
    assert!(!s.is_idle(), "queued on lane b");
    let d1 = c.try_recv().unwrap();
    let d2 = c.try_recv().unwrap();
    assert!(!s.is_idle(), "delivered, unacked");
    d2.ack().unwrap();
    assert!(!s.is_idle(), "acked out of order: item 1 still out");
    assert_lane_idle(b, &s, "b", false, "acked out of order: item 1 still out");
    d1.nack();
    assert!(!s.is_idle(), "released");
    c.try_recv().unwrap().ack().unwrap();
    assert!(s.is_idle());
    assert_lane_idle(b, &s, "b", true, "everything acked");
    // The request lane counts too.
    s.request_sender().publish(backfill("b", "users")).unwrap();
    assert!(!s.is_idle());
    let mut ingest = s.reattach_requests();
    let r = ingest.try_recv().unwrap();
    assert!(!s.is_idle());
    r.ack().unwrap();
    assert!(s.is_idle());
    // Closing does not make a busy lane idle.
    p.publish(batch(3)).unwrap();
    p.close();
    assert!(!s.is_idle());
    c.recv().unwrap().unwrap().ack().unwrap();
    assert!(!s.is_idle(), "lane a still holds 3");
    a.recv().unwrap().unwrap().ack().unwrap();
    assert!(s.is_idle());
}

// ----- Requests --------------------------------------------------------------------------------

pub fn r1_many_senders_publish_requests_concurrently_and_one_ingest_engine_consumes<B: Backend>(b: &B) {
    // Sink lanes at 1024 slots (unused here), the request lane at 3: the senders wait for room.
    let s = b.build(1024, 3, &["s0", "s1", "s2", "s3"]);
    const PER_SENDER: usize = 60;
    let senders: Vec<_> = (0..4)
        .map(|k| {
            let sender = s.request_sender();
            thread::spawn(move || {
                for i in 0..PER_SENDER {
                    sender.publish(backfill(&format!("s{k}"), &format!("i{i}"))).unwrap();
                }
            })
        })
        .collect();
    let mut ingest = s.reattach_requests();
    let mut seen = HashSet::new();
    let mut per_sink_last = [None::<usize>; 4];
    while seen.len() < 4 * PER_SENDER {
        let d = ingest.recv_timeout(Duration::from_secs(10)).expect("requests keep coming").unwrap();
        let Request::Backfill { sink, indexes, .. } = d.item() else { unreachable!() };
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
    assert_eq!(err(ingest.try_recv()), TryRecvError::Empty);
    assert!(s.is_idle());
}

pub fn r1_attach_requests_refuses_while_an_ingest_engine_is_attached<B: Backend>(b: &B) {
    let s = stream(b, 2, &["search"]);
    s.request_sender().publish(backfill("search", "users")).unwrap();
    let mut ingest = s.attach_requests().unwrap();
    assert_eq!(err(s.attach_requests()), StreamError::RequestConsumerAttached);
    let held = ingest.try_recv().unwrap();
    assert_eq!(err(s.attach_requests()), StreamError::RequestConsumerAttached, "still attached");
    // Dropped: the next attach succeeds and takes the outstanding delivery back.
    drop(ingest);
    let mut ingest2 = s.attach_requests().unwrap();
    assert_eq!(held.ack(), Err(AckError::Detached));
    let d = ingest2.try_recv().unwrap();
    assert_eq!((d.item(), d.attempt()), (&backfill("search", "users"), 2));
    d.ack().unwrap();
    // `reattach_requests` is never refused: it detaches the attached one.
    let ingest3 = s.reattach_requests();
    assert!(ingest2.is_detached() && !ingest3.is_detached());
    assert_eq!(err(s.attach_requests()), StreamError::RequestConsumerAttached);
    assert!(s.is_idle());
}

pub fn r2_requests_follow_the_lane_rules_for_nack_redelivery_and_reattach<B: Backend>(b: &B) {
    let s = stream(b, 2, &["search"]);
    let sender = s.request_sender();
    sender.publish(backfill("search", "a")).unwrap();
    sender.publish(backfill("search", "b")).unwrap();
    let mut ingest = s.reattach_requests();
    let ra = ingest.try_recv().unwrap();
    ra.nack();
    let ra = ingest.try_recv().unwrap();
    assert_eq!((ra.item(), ra.attempt()), (&backfill("search", "a"), 2));
    let rb = ingest.try_recv().unwrap();
    let mut ingest2 = s.reattach_requests();
    assert_eq!(err(ingest.try_recv()), TryRecvError::Detached);
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
fn serve_backfill<B: Backend>(
    ingest: &mut <B::Stream as Stream>::RequestConsumer,
    s: &B::Stream,
    rows: usize,
    crash_after: Option<usize>,
) -> Option<u32> {
    let d = ingest.recv_timeout(Duration::from_secs(5)).unwrap().unwrap();
    let attempt = d.attempt();
    let Request::Backfill { sink, indexes, .. } = d.item().clone() else { unreachable!() };
    let lane = s.sinks().iter().position(|n| *n == sink).expect("a backfill for a sink of the stream");
    let mut p = s.fanout().unwrap();
    for row in 0..rows {
        if crash_after == Some(row) {
            return None; // crash: delivery and fan-out dropped un-acked
        }
        let env: Arc<[Envelope]> = vec![envelope(indexes[0].as_str(), &row.to_string(), None, b"{}")].into();
        p.publish_to(lane, LaneItem::Batch(Batch::new(None, env))).unwrap();
    }
    p.publish_to(lane, LaneItem::SnapshotComplete { indexes }).unwrap();
    let published = s.stats(sink.as_str()).unwrap().published;
    d.ack().unwrap();
    assert_eq!(s.stats(sink.as_str()).unwrap().published, published, "nothing after the ack");
    Some(attempt)
}

pub fn r2_backfill_is_acked_after_snapshot_complete_and_redelivered_after_a_crash_mid_snapshot<B: Backend>(
    b: &B,
) {
    let s = stream(b, 16, &["search"]);
    s.request_sender().publish(backfill("search", "users")).unwrap();
    // Ingest engine 1 crashes after two rows: its request delivery is dropped un-acked.
    let mut ingest = s.reattach_requests();
    assert_eq!(serve_backfill::<B>(&mut ingest, &s, 4, Some(2)), None);
    {
        let st = s.request_stats();
        assert_eq!(st.released, 1, "the crashed engine's delivery was released");
    }
    // Ingest engine 2 (restarted: re-attached request consumer, new fan-out) gets it again.
    let mut ingest2 = s.reattach_requests();
    assert_eq!(serve_backfill::<B>(&mut ingest2, &s, 4, None), Some(2));
    {
        let st = s.request_stats();
        assert_eq!(st.lag(), 0);
    }
    // A hung ingest engine replaced while it still holds the request: its late ack is refused
    // and the new engine serves the request again.
    s.request_sender().publish(backfill("search", "orders")).unwrap();
    let hung = ingest2.try_recv().unwrap();
    let mut ingest3 = s.reattach_requests();
    assert_eq!(serve_backfill::<B>(&mut ingest3, &s, 1, None), Some(2));
    assert_eq!(hung.ack(), Err(AckError::Detached));
    // The sink saw: 2 rows (crashed run), 4 rows + complete, 1 row + complete.
    let mut c = s.reattach("search").unwrap();
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
