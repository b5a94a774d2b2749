//! Loom model 5: blocking waits without lost wake-ups (the "nobody is waiting" shortcut racing
//! a thread about to park), for the consumer (items) and for the producer (room).

use lanestream::prelude::*;
use lanestream::{MemoryStream, Position, Stream};
use loom::thread;

use crate::support::{self, batch, check};

/// Model 5a: a blocking consumer about to park while the producer publishes.
///
/// The consumer finds the lane empty and goes through register -> re-check -> park while the
/// producer updates `tail` (a compare-and-swap) and notifies. A lost wake-up leaves the consumer parked forever and
/// loom reports the deadlock. (Under loom the spin phase is skipped, so the consumer parks at
/// once; the spin only delays the same protocol.)
///
/// Why the bound suffices: the race is the store-buffer pattern between two threads (the
/// producer's `tail` compare-and-swap then `waiting` RMW, the consumer's `waiting` RMW then
/// `tail` load); one preemption puts either side between its two steps. Bound 3 is cheap here
/// and also covers the wait-list lock being held across the race.
#[test]
fn consumer_about_to_park_while_producer_publishes() {
    support::model("consumer_about_to_park_while_producer_publishes", 3, || {
        let stream = MemoryStream::builder().capacity(1).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let mut producer = stream.fanout().unwrap();
        let mut consumer = lane.reattach();
        let p = thread::spawn(move || producer.publish(batch(1)).unwrap());
        let d = consumer.recv().unwrap().expect("not closed");
        check(&d, 1);
        d.ack().unwrap();
        p.join().unwrap();
        assert_eq!(lane.acked(), Some(Position(1)));
    });
}

/// Model 5b: a blocking producer waiting for room while the consumer acks.
///
/// The lane (capacity 1) holds delivered item 1; the producer blocks publishing item 2 while
/// another thread acks item 1 (advancing `free`, then notifying the room list). A lost wake-up
/// leaves the producer parked forever: loom reports the deadlock.
///
/// Why the bound suffices: as 5a, with `free` in place of `tail`: one store-buffer race between
/// two threads. Bound 3 is cheap.
#[test]
fn producer_waiting_for_room_while_consumer_acks() {
    support::model("producer_waiting_for_room_while_consumer_acks", 3, || {
        let stream = MemoryStream::builder().capacity(1).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let mut producer = stream.fanout().unwrap();
        let mut consumer = lane.reattach();
        producer.try_publish(batch(1)).unwrap();
        let d1 = consumer.try_recv().unwrap();
        let acker = thread::spawn(move || d1.ack().unwrap());
        producer.publish(batch(2)).unwrap();
        acker.join().unwrap();
        let d2 = consumer.try_recv().unwrap();
        check(&d2, 2);
        d2.ack().unwrap();
        assert_eq!(lane.acked(), Some(Position(2)));
    });
}
