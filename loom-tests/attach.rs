//! Loom model 10: a plain `attach` racing a consumer's drop and a `reattach` (L8): the seat's
//! `ATTACHED` bit and the epoch-checked detach.

use lanestream::prelude::*;
use lanestream::{AckError, MemoryStream, Position, Stream, StreamError, TryRecvError};
use loom::sync::Arc;
use loom::thread;

use crate::support::{self, batch, check, Cells};

/// Model 10: attach racing a consumer drop and a re-attach.
///
/// Capacity 2, items 1 and 2 published; consumer 1 is attached and holds the delivery of
/// item 1. Then three threads race:
/// - the dropper drops consumer 1 (its detach clears `ATTACHED` only if its epoch is still
///   current), then acks its delivery of item 1 late;
/// - the attacher calls `Lane::attach` (refused while a consumer is attached); if it gets
///   consumer 2, it receives once and acks what it got;
/// - the main thread re-attaches (consumer 3, never refused), and after the others are done
///   drains the lane with it.
///
/// Checked:
/// - `attach` succeeds only after consumer 1's drop, and ordered after it: the dropper writes a
///   plain cell (standing for whatever the old consumer's thread did last) just before the drop,
///   and a successful attacher reads it (loom checks the cell: a read not ordered after the write
///   is a causality violation). Consumer 1's detach is the only step that clears `ATTACHED`, and
///   its Release compare-and-swap is read by `attach`'s Acquire one;
/// - at most one attached consumer at a time: consumer 3 (alive to the end) is never detached
///   by the plain `attach`, so a consumer 2 must have come before consumer 3 and is detached at
///   the end — consumer 1's drop landing after the re-attach must leave consumer 3's seat alone
///   (the detach compares the whole seat word, epoch included);
/// - no delivery lost or doubled: every item is acked exactly once, by whichever consumer ended
///   up holding it (a delivery taken back by an attach is refused with `Detached` and
///   redelivered); the lane ends acked at 2 and idle.
///
/// Why the bound suffices: the decisive races are three RMWs on the seat word (the drop's
/// compare-and-swap, `attach`'s and `reattach`'s), each of which one preemption can move inside
/// another thread's window; a late detach landing after a re-attach but before the attach takes
/// two. Bound 3 adds the late ack's take-back race (model 3) and the attacher's receive and ack
/// on top, at a few seconds (bound 4 passes too: about 400,000 executions, half a minute).
#[test]
fn attach_racing_a_consumer_drop_and_a_reattach() {
    support::model("attach_racing_a_consumer_drop_and_a_reattach", 3, || {
        let stream = MemoryStream::builder().capacity(2).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let mut producer = stream.fanout().unwrap();
        producer.try_publish(batch(1)).unwrap();
        producer.try_publish(batch(2)).unwrap();
        let mut c1 = lane.attach().unwrap();
        let d1 = c1.try_recv().unwrap();
        check(&d1, 1);
        // What consumer 1's thread did last before the drop (a sink's bookkeeping, say).
        let last_words = Arc::new(Cells::new(1));

        let written = last_words.clone();
        let dropper = thread::spawn(move || {
            written.write(0, 1);
            drop(c1);
            match d1.ack() {
                Ok(()) => vec![1],
                Err(AckError::Detached) => vec![],
                Err(e) => panic!("late ack: {e:?}"),
            }
        });

        let l2 = lane.clone();
        let attacher = thread::spawn(move || {
            let mut c2 = match l2.attach() {
                Ok(c2) => c2,
                Err(StreamError::ConsumerAttached(_)) => return (None, vec![]),
                Err(e) => panic!("attach: {e:?}"),
            };
            assert_eq!(
                last_words.read(0),
                1,
                "attach succeeded without being ordered after consumer 1's drop"
            );
            let acked = match c2.try_recv() {
                Ok(d) => {
                    let pos = d.position().unwrap().0;
                    check(&d, pos);
                    match d.ack() {
                        Ok(()) => vec![pos],
                        Err(AckError::Detached) => vec![],
                        Err(e) => panic!("consumer 2 ack: {e:?}"),
                    }
                }
                Err(TryRecvError::Detached) => vec![],
                Err(e) => panic!("consumer 2: {e:?}"),
            };
            (Some(c2), acked)
        });

        let mut c3 = lane.reattach();
        let mut acked = dropper.join().unwrap();
        let (c2, by_c2) = attacher.join().unwrap();
        acked.extend(by_c2);
        assert!(!c3.is_detached(), "the re-attached consumer was detached by a plain attach");
        if let Some(c2) = &c2 {
            assert!(c2.is_detached(), "two consumers attached at once");
        }
        loop {
            match c3.try_recv() {
                Ok(d) => {
                    let pos = d.position().unwrap().0;
                    check(&d, pos);
                    d.ack().unwrap();
                    acked.push(pos);
                }
                Err(TryRecvError::Empty) => break,
                Err(e) => panic!("consumer 3: {e:?}"),
            }
        }
        acked.sort_unstable();
        assert_eq!(acked, [1, 2], "every item acked exactly once");
        assert_eq!(lane.acked(), Some(Position(2)));
        assert!(lane.is_idle());
        drop(c2);
    });
}
