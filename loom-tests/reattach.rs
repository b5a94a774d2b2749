//! Loom model 3: a consumer re-attach racing a late ack from the detached consumer (L8).

use lanestream::prelude::*;
use lanestream::{MemoryStream, Position, PublishError, Stream, TryRecvError};
use loom::thread;

use crate::support::{self, batch, check};

/// Model 3: re-attach racing a late ack.
///
/// The old consumer's delivery of item 1 goes to a thread that reads the item and acks it late;
/// meanwhile the main thread re-attaches (a new consumer), receives whatever the re-attach
/// released, acks it, and tries to publish item 2 into the same slot (capacity 1). Checked:
/// - exactly one of "the late ack landed and the item is not redelivered" and "the late ack is
///   refused (`Detached`) and the item is redelivered (attempt 2)" happens, never both or
///   neither (the slot word's compare-and-swap decides: `ack` vs `attach`);
/// - no slot is reused while it is read: item 2 may go into the slot only once the stale
///   handle has ended (`holders`), else the producer's write races the late reader's reads (loom
///   causality check on the slot cell) and `try_publish` must say `Full`;
/// - the detached consumer's next step is `Detached`; the lane ends acked at 2 and idle.
///
/// Why the bound suffices: two threads, and the decisive race is one CAS against one CAS (the
/// ack's and the re-attach's), plus the stale reader against the reclaim; each needs one
/// preemption inside the other thread's window. Bound 3 (cheap here) also covers the late
/// reader being preempted between its read, its CAS and its holder decrement.
#[test]
fn reattach_racing_a_late_ack() {
    support::model("reattach_racing_a_late_ack", 3, || {
        let stream = MemoryStream::builder().capacity(1).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let mut producer = stream.fanout().unwrap();
        let mut old = lane.reattach();
        producer.try_publish(batch(1)).unwrap();
        let late = old.try_recv().unwrap();

        let t = thread::spawn(move || {
            // Reads item 1 in its slot while the re-attach may release it and the new consumer
            // may ack its redelivery.
            check(&late, 1);
            late.ack().is_ok()
        });

        let mut new = lane.reattach();
        let redelivered = match new.try_recv() {
            Ok(d) => {
                assert_eq!(d.attempt(), 2, "a redelivery counts its attempt");
                check(&d, 1);
                d.ack().unwrap();
                true
            }
            Err(TryRecvError::Empty) => false,
            Err(e) => panic!("new consumer: {e:?}"),
        };
        // Item 2 goes into item 1's slot only once nothing reads item 1 any more.
        let second = producer.try_publish(batch(2));
        let landed = t.join().unwrap();
        assert_ne!(landed, redelivered, "late ack landed: {landed}, redelivered: {redelivered}");
        assert!(matches!(old.try_recv(), Err(TryRecvError::Detached)));

        match second {
            Ok(()) => {}
            Err(PublishError::Full(item)) => producer.try_publish(item).unwrap(),
            Err(e) => panic!("publish: {e:?}"),
        }
        let d = new.try_recv().unwrap();
        check(&d, 2);
        assert_eq!(d.attempt(), 1);
        d.ack().unwrap();
        assert_eq!(lane.acked(), Some(Position(2)));
        assert!(stream.is_idle());
    });
}
