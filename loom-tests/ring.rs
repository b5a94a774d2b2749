//! Loom models 1 and 2: the ring itself — publish, receive and ack across a wrap, and acks out
//! of order from two threads while the producer waits for room.

use lanestream::prelude::*;
use lanestream::{MemoryStream, Position, Stream};
use loom::sync::Arc;
use loom::thread;

use crate::support::{self, batch, check, Cells};

/// Model 1: publish / recv / ack across a wrap of the ring.
///
/// Two runs of one scenario: capacity 1 with two items (item 2 reuses item 1's slot; the index
/// is masked) and capacity 3 with four items (item 4 reuses item 1's slot; capacity 3 is not a
/// power of two, so the index goes through `%`). The producer blocks for room, the consumer for
/// items, so both wait paths (register / re-check / park) run too. Checked:
/// - the consumer reads what the producer wrote into the slot (the `tail` Release -> consumer
///   Acquire pair; loom checks the slot cell) and the producer writes a slot only after the
///   advancer emptied it (the `free` Release -> producer Acquire pair);
/// - plain data the producer wrote before each publish (a loom cell, outside the ring) is
///   visible to the consumer after it receives the item: the user-visible promise;
/// - order, attempt 1, and at the end the acked position, the watermark and idleness.
///
/// Why the bound suffices: two threads, and every ordering question is one hand-off (a
/// Release write read by one Acquire load); a race needs one preemption on each side (between
/// the producer's slot write and its `tail` update, between the consumer's reads and its ack),
/// so bound 2 covers every placement of those (capacity 3, whose four items make the state space
/// grow fastest); capacity 1 is cheap enough for bound 3, which adds the waits. One wrap per run
/// suffices: a wrap only re-enters the same slot, and slot indices are `index % capacity` with no
/// other state.
#[test]
fn publish_recv_ack_across_a_wrap() {
    support::model("publish_recv_ack_across_a_wrap (capacity 1)", 3, || wrap(1, 2));
    support::model("publish_recv_ack_across_a_wrap (capacity 3)", 2, || wrap(3, 4));
}

fn wrap(capacity: u64, items: u64) {
    let stream =
        MemoryStream::builder().capacity(capacity as usize).request_capacity(1).sink("a").build().unwrap();
    let lane = stream.lane("a").unwrap();
    let mut producer = stream.fanout().unwrap();
    let mut consumer = lane.reattach();
    let cells = Arc::new(Cells::new(items as usize));

    let written = cells.clone();
    let t = thread::spawn(move || {
        for i in 0..items {
            written.write(i as usize, 100 + i);
            producer.publish(batch(i + 1)).unwrap();
        }
    });
    for i in 0..items {
        let d = consumer.recv().unwrap().expect("lane not closed");
        check(&d, i + 1);
        assert_eq!(cells.read(i as usize), 100 + i, "write before publish not visible");
        assert_eq!(d.attempt(), 1);
        d.ack().unwrap();
    }
    t.join().unwrap();
    assert_eq!(lane.acked(), Some(Position(items)));
    assert_eq!(stream.watermark(), Some(Position(items)));
    assert!(stream.is_idle());
}

/// Model 2: acks out of order from two threads while the producer waits for room.
///
/// Capacity 2, three items: the producer publishes 1 and 2, then blocks for room for 3, which
/// goes into item 1's slot. The consumer hands delivery 1 to an acker thread (which reads the
/// item, writes a plain cell — "the sink applied it" — and acks) and acks delivery 2 itself,
/// so the two acks race in both orders and either thread may end up the advancer. Checked:
/// - the producer never reuses a slot that is not acked: item 3's write into slot 0 would race
///   the acker's reads of item 1 (loom causality check on the slot cell), and item 1 must be
///   intact when read;
/// - the lane's acked position follows the contiguous acked prefix: right after acking item 2
///   the consumer may see `None` (item 1 not yet acked or not yet advanced), `Some(1)` or
///   `Some(2)`; whenever it sees `>= 1` the acker's cell write is visible (the ack's
///   Release chain to the mark), and once item 3 is received item 1 must have been acked;
/// - at the end the prefix is 3 and the lane idle.
///
/// Why the bound suffices: three threads; each race is a pair of operations (ack vs ack, ack
/// vs advance, advance vs the producer's re-check before parking) and needs one preemption
/// to land inside the other thread's window, two to interleave both windows; bound 2 covers
/// that; bound 3 still runs in seconds and is used. Capacity 2 is the smallest where two deliveries are outstanding at once.
#[test]
fn out_of_order_acks_while_the_producer_waits() {
    support::model("out_of_order_acks_while_the_producer_waits", 3, || {
        let stream = MemoryStream::builder().capacity(2).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let mut producer = stream.fanout().unwrap();
        let mut consumer = lane.reattach();
        let applied = Arc::new(Cells::new(1));

        let p = thread::spawn(move || {
            for pos in 1..=3 {
                producer.publish(batch(pos)).unwrap();
            }
        });
        let d1 = consumer.recv().unwrap().unwrap();
        let d2 = consumer.recv().unwrap().unwrap();
        check(&d1, 1);
        check(&d2, 2);

        let sink = applied.clone();
        let acker = thread::spawn(move || {
            check(&d1, 1);
            sink.write(0, 1);
            d1.ack().unwrap();
        });
        d2.ack().unwrap();
        match lane.acked() {
            None => {}
            Some(Position(p)) => {
                assert!(p == 1 || p == 2, "acked position {p} outside the prefix");
                assert_eq!(applied.read(0), 1, "acked position moved before item 1's ack");
            }
        }
        let d3 = consumer.recv().unwrap().unwrap();
        check(&d3, 3);
        // Item 3 sits in item 1's slot: item 1 was acked and emptied before the producer wrote.
        assert_eq!(applied.read(0), 1);
        d3.ack().unwrap();
        acker.join().unwrap();
        p.join().unwrap();
        assert_eq!(lane.acked(), Some(Position(3)));
        assert_eq!(lane.stats().acked_items, 3);
        assert!(lane.is_idle());
    });
}
