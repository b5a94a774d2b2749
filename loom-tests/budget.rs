//! Loom model 23: the memory budget ([M4](lanestream::contract#m4)) — a publish waiting on the
//! budget is woken by the ack that lets the fan-out drop what held it, and a batch over the whole
//! budget is admitted alone.

use lanestream::prelude::*;
use lanestream::{Item, MemoryStream, Position, PublishError, Stream};
use loom::thread;

use crate::support::{self, batch, check};

/// Model 23a: a blocking publish waiting on a spent budget while the only sink acks.
///
/// Capacity 2 (room for both items), a budget of exactly one batch's charge: item 1 is published
/// and delivered; a thread acks it while the main thread publishes item 2, which the budget
/// refuses until item 1 is dropped. The fan-out drops item 1 only once the lane freed it, so the
/// publish waits for the lane's advancer (its `ROOM_WANTED` wish on the lane it needs), then
/// drops item 1 and admits item 2. Checked: the publish returns (a lost wake-up is a loom
/// deadlock), item 1 is dropped exactly once (loom's leak tracking of its document) and the
/// budget holds one item's charge at the end.
///
/// Fails when its protection is removed (memory-ordering chapter, weakening row 52): a budget
/// wait that does not raise the wish on the lane holding the oldest item is never woken.
///
/// Why the bound suffices: two threads; the race is the store-buffer pattern between the acker's
/// `free` store and swap of `advance`, and the publisher's wish RMW and re-check of `free`; one
/// preemption puts either side between its two steps. Bound 3 also covers the wait list's lock.
#[test]
fn a_publish_waiting_on_the_budget_is_woken_by_the_ack_that_frees_it() {
    support::model("a_publish_waiting_on_the_budget_is_woken_by_the_ack_that_frees_it", 3, || {
        let one = batch(1).charge();
        let stream = MemoryStream::builder()
            .capacity(2)
            .request_capacity(1)
            .sink("a")
            .memory_budget(one)
            .build()
            .unwrap();
        let lane = stream.lane("a").unwrap();
        let mut fanout = stream.fanout().unwrap();
        let mut consumer = lane.reattach();
        fanout.try_publish(batch(1)).unwrap();
        let d1 = consumer.try_recv().unwrap();
        check(d1.item(), 1);
        let acker = thread::spawn(move || d1.ack().unwrap());
        fanout.publish(batch(2)).unwrap();
        acker.join().unwrap();
        assert_eq!(stream.memory().held_items, 1, "item 1 was dropped when item 2 was admitted");
        let d2 = consumer.try_recv().unwrap();
        check(d2.item(), 2);
        d2.ack().unwrap();
        assert_eq!(lane.acked(), Some(Position(2)));
    });
}

/// Model 23b: a batch larger than the whole budget goes alone, never deadlocking.
///
/// A budget of 1 byte (every batch is over it): item 1 is admitted because nothing is held;
/// item 2 is refused while item 1 is held, and admitted once a thread acked item 1 — here with
/// `try_publish` retried, so every interleaving of the ack with the fan-out's reclaim is seen.
///
/// Why the bound suffices: two threads (the acker and the publisher's retry loop); bound 2 places
/// the ack anywhere against the fan-out's loads of `free` and its drop of item 1.
#[test]
fn a_batch_over_the_budget_is_admitted_alone() {
    support::model("a_batch_over_the_budget_is_admitted_alone", 2, || {
        let stream = MemoryStream::builder()
            .capacity(2)
            .request_capacity(1)
            .sink("a")
            .memory_budget(1)
            .build()
            .unwrap();
        let lane = stream.lane("a").unwrap();
        let mut fanout = stream.fanout().unwrap();
        let mut consumer = lane.reattach();
        fanout.try_publish(batch(1)).expect("nothing held: admitted alone");
        let d1 = consumer.try_recv().unwrap();
        let acker = thread::spawn(move || d1.ack().unwrap());
        let mut item = batch(2);
        loop {
            match fanout.try_publish(item) {
                Ok(()) => break,
                Err(PublishError::Full(back)) => {
                    item = back;
                    thread::yield_now();
                }
                Err(e) => panic!("publish: {e:?}"),
            }
        }
        acker.join().unwrap();
        let d2 = consumer.try_recv().unwrap();
        check(d2.item(), 2);
        d2.ack().unwrap();
    });
}
