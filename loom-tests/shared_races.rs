//! Loom models 21-22: more races of the shared ring and the seat-held run ack (models 18a-20 in
//! `shared.rs` are the first ones): a *blocking* fan-out publish waiting for a shared cell, and
//! a run's seat-held ack racing its consumer's drop and the take-back of an immediate `attach`.

use lanestream::prelude::*;
use lanestream::{MemoryStream, Position, Stream, StreamError, TryRecvError};
use loom::thread;

use crate::support::{self, batch, check};

/// Model 21: a blocking fan-out publish reusing a shared cell while two lanes read and ack its
/// item on their own threads (model 19 retries `try_publish`; this one parks).
///
/// One cell shared by lanes a and b; item 1 is published to both, each lane's consumer thread
/// receives it, reads it and acks it; the main thread publishes item 2 (blocking for room) into
/// the same cell. Checked:
/// - the fan-out writes the cell (and drops item 1) only after both lanes' reads: every lane's
///   `free` Release -> the fan-out's Acquire in its room check; loom checks the cell and the
///   canary's tracked allocation (a drop before a read is a causality violation; an item never
///   dropped is a leak);
/// - the fan-out's wait for room is woken by the slower lane's ack (else: deadlock);
/// - both lanes then receive item 2 intact, and the watermark is 2.
///
/// Why the bound suffices: each hand-off is one Release read by one Acquire; the fan-out's park
/// needs one preemption between its room check and its registration; with three threads, bound
/// 2 covers either lane's ack landing inside that window (3 and 4 pass too). From bound 5 on,
/// loom itself trips ("expected to be able to acquire lock" in `WaitList::register`): loom's
/// `unpark` makes a thread runnable even while it is blocked on a mutex (`set_unparked` in
/// loom 0.7.3), and a lane's advancer unparks the fan-out thread while it waits for the wait
/// list's lock; a real unpark only leaves a token.
#[test]
fn a_blocking_fanout_publish_reuses_a_shared_cell_after_both_lanes_acked() {
    support::model("a_blocking_fanout_publish_reuses_a_shared_cell_after_both_lanes_acked", 2, || {
        let stream =
            MemoryStream::builder().capacity(1).request_capacity(1).sinks(["a", "b"]).build().unwrap();
        let mut fanout = stream.fanout().unwrap();
        let mut consumers: Vec<_> = stream.lanes().map(|l| l.attach().unwrap()).collect();
        fanout.try_publish(batch(1)).unwrap();
        let threads: Vec<_> = consumers
            .drain(..)
            .map(|mut c| {
                thread::spawn(move || {
                    let d = c.try_recv().unwrap();
                    check(&d, 1);
                    d.ack().unwrap();
                    c
                })
            })
            .collect();
        fanout.publish(batch(2)).unwrap();
        for t in threads {
            let mut c = t.join().unwrap();
            let d = c.try_recv().unwrap();
            check(&d, 2);
            d.ack().unwrap();
        }
        assert_eq!(stream.watermark(), Some(Position(2)));
        drop(fanout);
    });
}

/// Model 22: a run acked on another thread (the seat-held ack) racing its consumer's drop and an
/// immediate `attach` (L8, L9 of the seat).
///
/// Capacity 2; the consumer receives items 1 and 2 as one run and hands it to a thread that
/// acks it; the main thread drops the consumer and attaches a new one at once. Checked:
/// - `attach` never finds the seat still taken (`ConsumerAttached`): the drop waits out a seat
///   held by the run's ack (as in model 18b, here with the ack still running when `attach`
///   takes back what it did not ack);
/// - the run's ack lands xor its items are redelivered to the new consumer (attempt 2), never
///   both, never neither; the acked position ends at 2 and nothing is left outstanding.
///
/// Why the bound suffices: two threads; the decisive orders are the ack's seat step before,
/// inside or after the drop's seat step and the attach's take-back, one preemption each. Bound 3.
#[test]
fn run_ack_holding_the_seat_racing_consumer_drop_and_attach() {
    support::model("run_ack_holding_the_seat_racing_consumer_drop_and_attach", 3, || {
        let stream = MemoryStream::builder().capacity(2).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let mut fanout = stream.fanout().unwrap();
        fanout.try_publish(batch(1)).unwrap();
        fanout.try_publish(batch(2)).unwrap();
        let mut old = lane.attach().unwrap();
        let run = old.try_recv_run(2).unwrap();
        assert_eq!(run.len(), 2);
        let t = thread::spawn(move || run.ack().is_ok());
        drop(old);
        let mut new = match lane.attach() {
            Ok(c) => c,
            Err(StreamError::ConsumerAttached(_)) => panic!("attach found the dropped consumer's seat taken"),
            Err(e) => panic!("{e:?}"),
        };
        let mut redelivered = 0;
        loop {
            match new.try_recv_run(2) {
                Ok(r) => {
                    assert_eq!(r.attempt(), 2);
                    redelivered += r.len();
                    r.ack().unwrap();
                }
                Err(TryRecvError::Empty) => break,
                Err(e) => panic!("{e:?}"),
            }
        }
        let landed = t.join().unwrap();
        if landed {
            assert_eq!(redelivered, 0, "a landed ack's items were redelivered");
        } else {
            assert!(redelivered > 0, "a refused ack's items were not redelivered");
        }
        // Items the ack landed before the take-back plus the redeliveries: both, each once.
        let stats = lane.stats();
        assert_eq!((stats.released, stats.in_flight, stats.acked_items), (0, 0, 2));
        assert_eq!(lane.acked(), Some(Position(2)));
        fanout.try_publish(batch(3)).unwrap();
    });
}
