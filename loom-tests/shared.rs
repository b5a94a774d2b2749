//! Loom models 18-19: the seat-held run ack (a run's items acked with plain stores while the
//! ack holds the consumer's seat and no stale handle lives) and the shared ring (one array of
//! cells written once per item by the fan-out, read in place by every lane).

use lanestream::prelude::*;
use lanestream::{LaneItem, MemoryStream, Position, PublishError, Stream, TryRecvError};
use loom::thread;

use crate::support::{self, batch, check};

/// Model 18a: a stale handle ending while the redelivery of its item is acked as a run.
///
/// Capacity 2, one lane: the old consumer receives item 1 and keeps the delivery; a re-attach
/// takes it back (the handle is now stale: one holder on the item's word, `stale == 1`). A
/// second thread reads the stale handle's item and drops it (its nack is refused, and it ends:
/// a holder RMW on the word, then `stale` lowered) while the new consumer receives the
/// redelivery as a run of one and acks it — by plain stores under the seat if it reads
/// `stale == 0`, else by compare-and-swap. Checked:
/// - the stale handle reads item 1 whatever the order (its slot is not emptied under it);
/// - neither the stale handle's holder RMW nor the run's ack is lost: item 1's slot is emptied,
///   so items 2 and 3 both fit in the ring afterwards (a lost holder decrement would pin the slot
///   for ever; a plain store overwriting the RMW's result would underflow the holder count, which
///   the engine's debug assertion reports);
/// - the acked position and idleness at the end.
///
/// Fails when its protection is removed (section 9 of the memory-ordering chapter, rows 44 and
/// 45): without the `stale` check the plain store races the stale holder's RMW; with a Relaxed
/// load of `stale` the RMW need not happen before the store.
///
/// Why the bound suffices: two threads; the race is the stale handle's two RMWs (word, then
/// `stale`) against the ack's seat-take, `stale` load and store; one preemption places the
/// handle's end anywhere in the ack's window, and bound 3 also covers it being preempted between
/// its own two RMWs.
#[test]
fn stale_handle_ending_while_its_redelivery_is_acked_as_a_run() {
    support::model("stale_handle_ending_while_its_redelivery_is_acked_as_a_run", 3, stale_handle_run);
}

fn stale_handle_run() {
    let stream = MemoryStream::builder().capacity(2).request_capacity(1).sink("a").build().unwrap();
    let lane = stream.lane("a").unwrap();
    let mut fanout = stream.fanout().unwrap();
    let mut old = lane.reattach();
    fanout.try_publish(batch(1)).unwrap();
    let stale = old.try_recv().unwrap();
    let mut new = lane.reattach();
    let t = thread::spawn(move || {
        check(stale.item(), 1);
        drop(stale);
    });
    let run = new.try_recv_run(2).unwrap();
    assert_eq!((run.len(), run.attempt()), (1, 2));
    check(run.get(0).unwrap(), 1);
    run.ack().unwrap();
    t.join().unwrap();
    assert_eq!(lane.acked(), Some(Position(1)));
    fanout.try_publish(batch(2)).unwrap();
    match fanout.try_publish(batch(3)) {
        Ok(()) => {}
        Err(PublishError::Full(_)) => panic!("item 1's slot was never emptied"),
        Err(e) => panic!("publish: {e:?}"),
    }
    let r = new.try_recv_run(2).unwrap();
    assert_eq!(r.len(), 2);
    r.ack().unwrap();
    assert!(stream.is_idle());
    drop(old);
}

/// Model 18b: a run acked on another thread while its consumer receives, then goes away.
///
/// Capacity 2, one lane, items 1 and 2: the consumer receives item 1 as a run and hands it to a
/// thread that acks it (taking the seat, storing, giving it back). Meanwhile the consumer
/// receives item 2 (a receive step that may find the seat held by the ack) and is dropped (its
/// detach may find the seat held too). Checked: the receive gets item 2 (never `Detached`: the
/// seat busy with our own epoch is waited out), and once both are done a plain `attach` succeeds
/// (the drop cleared the seat's attached flag rather than giving up on the busy seat).
///
/// Fails when its protection is removed (rows 46 and 47): a receive step or a detach that treats
/// a busy seat of its own epoch as a newer consumer reports `Detached`, or leaves the lane
/// refusing every `attach` with `ConsumerAttached`.
///
/// Why the bound suffices: two threads; each of the consumer's seat steps can meet the ack inside
/// its seat window with one preemption; bound 2 covers both steps meeting it, and bound 3 (331
/// executions) is used.
#[test]
fn a_run_acked_elsewhere_while_its_consumer_receives_and_detaches() {
    support::model("a_run_acked_elsewhere_while_its_consumer_receives_and_detaches", 3, || {
        let stream = MemoryStream::builder().capacity(2).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let mut producer = stream.fanout().unwrap();
        let mut consumer = lane.attach().unwrap();
        producer.try_publish(batch(1)).unwrap();
        producer.try_publish(batch(2)).unwrap();
        let run = consumer.try_recv_run(1).unwrap();
        let t = thread::spawn(move || run.ack().unwrap());
        let second = match consumer.try_recv() {
            Ok(d) => d,
            Err(e) => panic!("receive beside a run's ack: {e:?}"),
        };
        check(second.item(), 2);
        second.ack().unwrap();
        drop(consumer);
        t.join().unwrap();
        let mut again = lane.attach().expect("the dropped consumer's seat was cleared");
        assert!(matches!(again.try_recv(), Err(TryRecvError::Empty)));
        assert_eq!(lane.acked(), Some(Position(2)));
    });
}

/// Model 19: the fan-out reusing a shared cell while both lanes read and ack its item.
///
/// Capacity 1, lanes "a" and "b" on one shared ring: item 1 is written once and published to
/// both. Two threads each receive it as a run on their lane, read it and ack it; the main thread
/// meanwhile publishes item 2, retrying while it is refused for room — it may write the one cell
/// only once *both* lanes emptied their slot of item 1 (each lane's `free` Release, acquired by
/// the fan-out's room check), and it drops item 1 there. Checked:
/// - each lane reads item 1, then item 2, as published (the overwrite never races a read: loom
///   checks the cell);
/// - item 1 is dropped exactly once, by the fan-out, and item 2 with the stream (loom's leak
///   tracking of the documents; a double drop would be a use after free of the tracked bytes);
/// - the watermark and idleness at the end.
///
/// Fails when its protection is removed (row 48): a fan-out that checks the room of the first
/// lane only overwrites the cell while lane "b" still reads item 1.
///
/// Why the bound suffices: three threads; the race is each reader's read-then-ack against the
/// fan-out's room check and write; one preemption per reader puts each read anywhere against the
/// write, so bound 2 covers both readers; the model is small (46 executions at bound 4), and bound
/// 4 is used.
#[test]
fn fanout_reuses_a_shared_cell_only_after_every_lane_emptied_it() {
    support::model("fanout_reuses_a_shared_cell_only_after_every_lane_emptied_it", 4, || {
        let stream =
            MemoryStream::builder().capacity(1).request_capacity(1).sinks(["a", "b"]).build().unwrap();
        let mut fanout = stream.fanout().unwrap();
        let mut consumers: Vec<_> = stream.lanes().map(|lane| lane.reattach()).collect();
        fanout.try_publish(batch(1)).unwrap();
        let read_one = |mut c: lanestream::Consumer<LaneItem>| {
            thread::spawn(move || {
                let run = c.try_recv_run(1).unwrap();
                check(run.get(0).unwrap(), 1);
                run.ack().unwrap();
                c
            })
        };
        let tb = read_one(consumers.pop().unwrap());
        let ta = read_one(consumers.pop().unwrap());
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
        for t in [ta, tb] {
            let mut c = t.join().unwrap();
            let run = c.try_recv_run(1).unwrap();
            check(run.get(0).unwrap(), 2);
            run.ack().unwrap();
        }
        assert_eq!(stream.watermark(), Some(Position(2)));
        assert!(stream.is_idle());
    });
}

/// Model 20: gaps — a shared ring's item published to one lane, passed by the other lane's
/// consumer while the fan-out waits to reuse its cell.
///
/// Capacity 1, lanes "a" and "b" on one shared ring: the fan-out publishes a snapshot to lane "b"
/// only (`try_publish_to`; a gap for lane "a"), and lane "b" receives and acks it. A thread then
/// receives on lane "a" (`recv`, blocking: its step passes the gap — an `ACKED` store and one
/// advancer request — and then waits for item 1) while the main thread publishes item 1 to both
/// lanes (`publish`, blocking for room: the one cell is free only once lane "a" passed the gap).
/// Checked:
/// - lane "a" is never given the snapshot, and both lanes receive item 1 as published (loom
///   checks the cell, rewritten only after both lanes emptied the snapshot's slot);
/// - the publish is woken: passing the gap frees the cell through the advancer, whose request
///   wakes a producer waiting for room (a lost wake-up or a gap never advanced over is a loom
///   deadlock);
/// - the watermark and idleness at the end.
///
/// Fails when its protection is removed (row 50): without the advancer request after a step that
/// passed a gap, the publish waits for ever.
///
/// Why the bound suffices: two threads; the race is the consumer's step (gap, then park) against
/// the fan-out's room check, park, write and `tail` update; one preemption places the step
/// anywhere against them, bound 3 also covers each side being preempted inside its wait.
#[test]
fn a_gap_is_passed_and_its_cell_reused() {
    support::model("a_gap_is_passed_and_its_cell_reused", 3, || {
        let (stream, mut fanout, mut a, mut b) = support::lanes_a_b(1);
        fanout.try_publish_to(1, support::snapshot()).unwrap();
        let d = b.try_recv().unwrap();
        assert_eq!(d.item().position(), None, "lane b gets the snapshot");
        d.ack().unwrap();
        let ta = thread::spawn(move || {
            let d = a.recv().unwrap().expect("not closed");
            check(d.item(), 1);
            d.ack().unwrap();
        });
        fanout.publish(batch(1)).unwrap();
        let d = b.try_recv().unwrap();
        check(d.item(), 1);
        d.ack().unwrap();
        ta.join().unwrap();
        assert_eq!(stream.watermark(), Some(Position(1)));
        assert!(stream.is_idle());
    });
}

/// Model 20b: a plain run received across a gap while the fan-out publishes (P27).
///
/// Capacity 4, lanes "a" and "b": a thread receives runs on lane "a" (`recv_run(4)`, blocking)
/// until it has item 2, acking each run, while the main thread publishes item 1 to both lanes, a
/// snapshot to lane "b" only (a gap for lane "a") and item 2 to both, then drains lane "b". A run
/// taken with nothing of its lane in flight is plain: it reads no state word unless the lane's
/// `gaps_end` (raised by the publisher before the cursor's Release that publishes the gap) says
/// a gap may lie in it. Checked:
/// - lane "a" receives items 1 and 2 and never the snapshot, whatever runs it takes them in;
/// - lane "b" receives all three in order; the watermark and idleness at the end.
///
/// Fails when its protection is removed (row 65): with `gaps_end` raised after the cursor's
/// compare-and-swap instead of before it, a run can read the cursor past the gap and the old
/// `gaps_end`, and deliver the snapshot to lane "a".
///
/// Why the bound suffices: two threads; the race is the consumer's run step (cursor, `gaps_end`,
/// words) against the three publishes; one preemption places the step between any two of them,
/// and bound 3 also covers the step being preempted between its loads.
#[test]
fn a_plain_run_stops_at_a_gap_published_meanwhile() {
    support::model("a_plain_run_stops_at_a_gap_published_meanwhile", 3, || {
        let (stream, mut fanout, mut a, mut b) = support::lanes_a_b(4);
        let ta = thread::spawn(move || {
            let mut got = Vec::new();
            while got.last() != Some(&Some(Position(2))) {
                let run = a.recv_run(4).unwrap().expect("not closed");
                got.extend(run.iter().map(|item| item.position()));
                run.ack().unwrap();
            }
            assert_eq!(got, [Some(Position(1)), Some(Position(2))], "lane a never gets the snapshot");
        });
        fanout.try_publish(batch(1)).unwrap();
        fanout.try_publish_to(1, support::snapshot()).unwrap();
        fanout.try_publish(batch(2)).unwrap();
        let mut got = Vec::new();
        while got.len() < 3 {
            let run = b.try_recv_run(4).unwrap();
            got.extend(run.iter().map(|item| item.position()));
            run.ack().unwrap();
        }
        assert_eq!(got, [Some(Position(1)), None, Some(Position(2))]);
        ta.join().unwrap();
        assert_eq!(stream.watermark(), Some(Position(2)));
        assert!(stream.is_idle());
    });
}
