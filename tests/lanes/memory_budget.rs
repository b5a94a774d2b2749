//! The memory budget (M4) and prompt drops (M3): what a stream holds is what is unacked.

use crate::common;
use lanestream::prelude::*;

use std::future::Future;
use std::sync::Arc;
use std::task::Context;
use std::time::Duration;

use bytes::Bytes;
use common::{batch, envelope, within, CountingWaker};
use lanestream::{
    Batch, BuildError, Envelope, Item, LaneItem, MemoryStream, Position, PublishError, Stream,
    ENVELOPE_OVERHEAD, MAX_BUDGET,
};

/// A positioned batch of `n` envelopes whose documents are `size` bytes each.
fn sized(position: u64, n: usize, size: usize) -> LaneItem {
    let envelopes: Vec<Envelope> = (0..n)
        .map(|i| Envelope {
            document: Bytes::from(vec![b'x'; size]),
            ..envelope("t", &i.to_string(), Some(position), b"")
        })
        .collect();
    LaneItem::Batch(Batch::new(Some(Position(position)), envelopes.into()))
}

fn budgeted(capacity: usize, sinks: &[&str], budget: u64) -> MemoryStream {
    MemoryStream::builder()
        .capacity(capacity)
        .sinks(sinks.iter().copied())
        .memory_budget(budget)
        .build()
        .unwrap()
}

#[test]
fn m4_a_budget_of_zero_or_past_the_limit_is_refused_at_build() {
    let zero = MemoryStream::builder().sink("a").memory_budget(0).build();
    assert!(matches!(zero, Err(BuildError::ZeroBudget)), "{zero:?}");
    let huge = MemoryStream::builder().sink("a").memory_budget(MAX_BUDGET + 1).build();
    assert!(
        matches!(huge, Err(BuildError::BudgetTooLarge { bytes, max }) if bytes == MAX_BUDGET + 1 && max == MAX_BUDGET),
        "{huge:?}"
    );
    assert!(MemoryStream::builder().sink("a").memory_budget(MAX_BUDGET).build().is_ok());
}

#[test]
fn m4_a_batch_is_charged_its_documents_ids_and_overhead_once_however_many_lanes_hold_it() {
    let item = sized(1, 3, 100);
    let expected = std::mem::size_of::<LaneItem>() as u64 + 3 * (100 + 1 + ENVELOPE_OVERHEAD);
    assert_eq!(item.charge(), expected);
    let stream = budgeted(8, &["a", "b", "c"], 1 << 20);
    stream.fanout().unwrap().publish(item).unwrap();
    let memory = stream.memory();
    assert_eq!((memory.held_items, memory.held_bytes, memory.budget), (1, expected, Some(1 << 20)));
}

#[test]
fn m4_a_spent_budget_refuses_with_full_while_slots_are_free_and_hands_the_item_back() {
    let one = sized(1, 1, 1000).charge();
    let stream = budgeted(16, &["a"], one + one / 2);
    let mut fanout = stream.fanout().unwrap();
    fanout.try_publish(sized(1, 1, 1000)).unwrap();
    match fanout.try_publish(sized(2, 1, 1000)) {
        Err(PublishError::Full(back)) => assert_eq!(back.position(), Some(Position(2))),
        other => panic!("expected Full, got {other:?}"),
    }
    assert_eq!(stream.stats("a").unwrap().published, 1);
    // A smaller batch still fits beside the first.
    fanout.try_publish(sized(2, 1, 10)).unwrap();
}

#[test]
fn m4_an_ack_on_every_lane_releases_the_charge_at_the_next_publish() {
    let one = sized(1, 1, 1000).charge();
    let stream = budgeted(16, &["a", "b"], one);
    let mut consumers: Vec<_> = stream.lanes().map(|lane| lane.attach().unwrap()).collect();
    let mut fanout = stream.fanout().unwrap();
    fanout.try_publish(sized(1, 1, 1000)).unwrap();
    consumers[0].try_recv().unwrap().ack().unwrap();
    assert!(fanout.try_publish(sized(2, 1, 1000)).unwrap_err().is_full(), "lane b still holds item 1");
    consumers[1].try_recv().unwrap().ack().unwrap();
    fanout.try_publish(sized(2, 1, 1000)).expect("both lanes acked item 1: its charge is released");
    assert_eq!(stream.memory().held_items, 1);
    assert_eq!(stream.memory().held_bytes, one);
}

#[test]
fn m4_a_batch_over_the_whole_budget_is_admitted_alone() {
    let big = sized(1, 4, 4096);
    let stream = budgeted(16, &["a"], 100);
    let mut consumer = stream.attach("a").unwrap();
    let mut fanout = stream.fanout().unwrap();
    fanout.try_publish(big).expect("nothing is held: admitted alone");
    assert!(fanout.try_publish(sized(2, 1, 1)).unwrap_err().is_full(), "something is held now");
    consumer.try_recv().unwrap().ack().unwrap();
    fanout.try_publish(sized(2, 4, 4096)).expect("held nothing again");
}

#[test]
fn m4_a_blocking_publish_waits_on_the_budget_and_is_woken_by_the_ack() {
    let one = sized(1, 1, 1000).charge();
    let stream = budgeted(16, &["a"], one);
    let mut consumer = stream.attach("a").unwrap();
    let mut fanout = stream.fanout().unwrap();
    fanout.publish(sized(1, 1, 1000)).unwrap();
    let publisher = std::thread::spawn(move || {
        fanout.publish(sized(2, 1, 1000)).unwrap();
        fanout
    });
    let d = consumer.recv().unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(20)); // let the publish park on the budget
    assert_eq!(stream.stats("a").unwrap().published, 1, "the budget held item 2 back");
    d.ack().unwrap();
    let _fanout = within(10, "publish waiting on the budget", move || publisher.join().unwrap());
    assert_eq!(consumer.try_recv().unwrap().position(), Some(Position(2)));
}

#[test]
fn m4_a_publish_that_can_never_fit_times_out_with_its_item() {
    let stream = budgeted(16, &["a"], 10);
    let _consumer = stream.attach("a").unwrap(); // holds item 1 for ever, never acks
    let mut fanout = stream.fanout().unwrap();
    fanout.publish(sized(1, 1, 100)).unwrap();
    match fanout.publish_timeout(sized(2, 1, 100), Duration::from_millis(30)) {
        Err(PublishError::Timeout(back)) => assert_eq!(back.position(), Some(Position(2))),
        other => panic!("expected Timeout, got {other:?}"),
    }
}

#[test]
fn m4_an_async_publish_waiting_on_the_budget_is_woken_by_the_ack() {
    let stream = budgeted(16, &["a"], 10);
    let mut consumer = stream.attach("a").unwrap();
    let mut fanout = stream.fanout().unwrap();
    fanout.publish(sized(1, 1, 100)).unwrap();
    let (counter, waker) = CountingWaker::new();
    let mut cx = Context::from_waker(&waker);
    let mut publish = std::pin::pin!(fanout.publish_async(sized(2, 1, 100)));
    assert!(publish.as_mut().poll(&mut cx).is_pending());
    consumer.try_recv().unwrap().ack().unwrap();
    assert!(counter.wakes() >= 1, "the ack that frees the budget wakes the task");
    assert!(publish.as_mut().poll(&mut cx).is_ready());
}

#[test]
fn m3_an_item_acked_on_every_lane_is_dropped_at_the_next_publish_without_a_budget() {
    let envelopes: Arc<[Envelope]> = vec![envelope("t", "1", Some(1), b"doc")].into();
    let stream = MemoryStream::builder().capacity(64).sinks(["a", "b"]).build().unwrap();
    let mut consumers: Vec<_> = stream.lanes().map(|lane| lane.attach().unwrap()).collect();
    let mut fanout = stream.fanout().unwrap();
    fanout.publish(LaneItem::Batch(Batch::new(Some(Position(1)), envelopes.clone()))).unwrap();
    assert_eq!(Arc::strong_count(&envelopes), 2, "one copy in the stream, however many lanes");
    for c in &mut consumers {
        c.try_recv().unwrap().ack().unwrap();
    }
    fanout.publish(batch(2)).unwrap();
    assert_eq!(Arc::strong_count(&envelopes), 1, "acked everywhere: dropped at the next publish");
    assert_eq!(stream.memory().held_items, 1);
}

#[test]
fn m3_a_dropped_fanout_drops_what_every_lane_acked() {
    let envelopes: Arc<[Envelope]> = vec![envelope("t", "1", Some(1), b"doc")].into();
    let stream = MemoryStream::builder().capacity(64).sink("a").build().unwrap();
    let mut consumer = stream.attach("a").unwrap();
    let mut fanout = stream.fanout().unwrap();
    fanout.publish(LaneItem::Batch(Batch::new(Some(Position(1)), envelopes.clone()))).unwrap();
    consumer.try_recv().unwrap().ack().unwrap();
    drop(fanout);
    assert_eq!(Arc::strong_count(&envelopes), 1);
}
