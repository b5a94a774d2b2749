//! Loom model 9: every item is dropped exactly once — once acked on every lane, by the fan-out's
//! next publish, or when the last reference to the stream goes — with no leak (M3).

use lanestream::prelude::*;
use std::sync::Arc as StdArc;

use lanestream::{LaneItem, MemoryStream, Stream};
use loom::thread;

use crate::support::{self, batch, check, envelopes};

/// How many owners a batch's envelopes have.
fn owners(item: &LaneItem) -> usize {
    StdArc::strong_count(envelopes(item))
}

/// Model 9: drops under concurrent acks and teardown.
///
/// Items are loom-tracked allocations (their document's bytes live in a `loom::alloc::Track`,
/// see `support`), and the ring is a loom `Arc` (the engine's `Arc` is loom's under the cfg), so
/// loom fails the model with "Allocation leaked" / "Arc leaked" if an item or the ring outlives
/// the model. Double drops are caught by counting: the model keeps two clones of every batch
/// (owners = 2 + 1 while the ring holds it), so a second drop by the engine would leave 1
/// instead of 2 without freeing anything.
///
/// Scenario (capacity 2): items 1 and 2 published and delivered; an acker thread acks item 1
/// while the main thread drops delivery 2 (a nack: released, still owned by the stream), so the
/// ack's advance (which frees item 1's slot) races the nack. Then item 3 is published (queued,
/// never delivered): that publish drops item 1, which every lane freed. Item 2 is redelivered to
/// a reader thread, and the main thread drops every handle it has on the stream while the reader
/// still reads item 2. Whichever thread lets go of the cells last drops them, and with them items
/// 2 and 3. Item 1 must be dropped by the publish after its ack, items 2 and 3 by the teardown,
/// each exactly once.
///
/// Why the bound suffices: at most two threads run at once; each race (ack/advance vs nack,
/// reader vs teardown, which thread drops the ring last) is decided by one preemption; bound 3
/// is cheap here and interleaves them further.
#[test]
fn items_dropped_exactly_once_on_ack_and_teardown() {
    support::model("items_dropped_exactly_once_on_ack_and_teardown", 3, || {
        let keep: Vec<[LaneItem; 2]> = (1..=3)
            .map(|p| {
                let b = batch(p);
                [b.clone(), b]
            })
            .collect();
        {
            let stream = MemoryStream::builder().capacity(2).request_capacity(1).sink("a").build().unwrap();
            let lane = stream.lane("a").unwrap();
            let mut producer = stream.fanout().unwrap();
            let mut consumer = lane.reattach();
            producer.try_publish(keep[0][0].clone()).unwrap();
            producer.try_publish(keep[1][0].clone()).unwrap();
            let d1 = consumer.try_recv().unwrap();
            let d2 = consumer.try_recv().unwrap();
            // The ring holds items 1 and 2 (capacity 2); item 3 waits for room after item 1.
            let acker = thread::spawn(move || {
                check(&d1, 1);
                d1.ack().unwrap();
            });
            drop(d2);
            acker.join().unwrap();
            assert_eq!(owners(&keep[0][0]), 3, "item 1 acked, held until the next publish");
            producer.try_publish(keep[2][0].clone()).unwrap();
            assert_eq!(owners(&keep[0][0]), 2, "item 1 dropped exactly once, by the next publish");
            assert_eq!(owners(&keep[1][0]), 3, "item 2 released, still in the ring");
            assert_eq!(owners(&keep[2][0]), 3, "item 3 queued in the ring");

            // Tear down while a redelivery of item 2 is read on another thread.
            let d2 = consumer.try_recv().unwrap();
            assert_eq!(d2.attempt(), 2);
            let reader = thread::spawn(move || {
                check(&d2, 2);
                drop(d2);
            });
            drop((producer, consumer, lane, stream));
            reader.join().unwrap();
        }
        for (i, k) in keep.iter().enumerate() {
            assert_eq!(owners(&k[0]), 2, "item {} dropped exactly once", i + 1);
        }
    });
}
