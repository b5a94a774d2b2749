//! A standalone lane carrying your own item type: nack and redelivery, acks out of order, and
//! `LaneStats`.
//!
//! `Lane::standalone` builds one lane outside any stream, for any type that implements [`Item`]
//! (it only has to say what its position is). Here the items are sensor readings whose sequence
//! number is their position. The example publishes until the lane is full, nacks a reading and
//! receives it again (`attempt() == 2`), drops a delivery (which nacks it too), acks two
//! readings out of order (the acked position follows the contiguous acked prefix), acks one from
//! another thread, then closes and drains. It prints the lane's counters along the way and
//! asserts each step; a failed assertion exits non-zero.
//!
//! ```text
//! cargo run --example standalone_lane
//! ```

use lanestream::prelude::*;
use std::thread;

use lanestream::{Item, Lane, LaneStats, Position, PublishError, SinkName};

/// One reading of a thermometer; `seq` increases with every reading.
#[derive(Debug)]
struct Reading {
    seq: u64,
    celsius: f32,
}

impl Item for Reading {
    /// The lane refuses a reading whose position does not increase, and its acked position
    /// follows the acked readings' positions.
    fn position(&self) -> Option<Position> {
        Some(Position(self.seq))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let lane: Lane<Reading> = Lane::standalone(SinkName::new("thermometer")?, 4)?;
    let mut producer = lane.producer()?;
    let mut consumer = lane.attach()?;

    // Four slots: the fifth reading does not fit until something is acked.
    for seq in 1..=4 {
        producer.publish(Reading { seq, celsius: 20.0 + seq as f32 / 10.0 })?;
    }
    let refused = producer.try_publish(Reading { seq: 5, celsius: 20.5 }).unwrap_err();
    assert!(refused.is_full());
    let pending = refused.into_inner(); // the item comes back untouched
    println!("lane full, reading {} handed back; {}", pending.seq, counters(&lane.stats()));

    // Nack: the reading is released and comes back first, one attempt higher.
    let first = consumer.try_recv()?;
    println!("got {:?} (attempt {}): storage unavailable, nack", *first, first.attempt());
    first.nack();
    let again = consumer.try_recv()?;
    assert_eq!((again.seq, again.attempt()), (1, 2));
    println!(
        "got reading {} again (attempt {}), ack; {}",
        again.seq,
        again.attempt(),
        counters(&lane.stats())
    );
    again.ack()?;
    assert_eq!(lane.acked(), Some(Position(1)));

    // Dropping a delivery un-acked nacks it as well.
    drop(consumer.try_recv()?);
    let (second, third) = (consumer.try_recv()?, consumer.try_recv()?);
    assert_eq!((second.seq, second.attempt(), third.seq), (2, 2, 3));

    // Acks in any order: acking 3 before 2 leaves the acked position at 1 ...
    third.ack()?;
    assert_eq!(lane.acked(), Some(Position(1)));
    println!("acked 3 before 2: {}", counters(&lane.stats()));
    // ... and acking 2, here from a worker thread, moves it to the end of the run.
    let handle = second.into_handle();
    thread::spawn(move || handle.ack().expect("not detached")).join().unwrap();
    assert_eq!(lane.acked(), Some(Position(3)));
    println!("acked 2 on a worker: {}", counters(&lane.stats()));

    // There is room again; an old sequence number is refused (positions only move forward).
    producer.publish(pending)?;
    match producer.publish(Reading { seq: 2, celsius: 0.0 }) {
        Err(PublishError::PositionRegressed { item, last, .. }) => {
            println!("reading {} refused: the lane is already at {}", item.seq, last.0)
        }
        other => panic!("a regressed position must be refused, got {other:?}"),
    }

    // Close: the consumer drains what is left, then receives `None`.
    producer.close();
    while let Some(delivery) = consumer.recv()? {
        println!("drained reading {} ({:.1} C)", delivery.seq, delivery.celsius);
        delivery.ack()?;
    }

    let stats = lane.stats();
    println!("closed and drained: {}", counters(&stats));
    assert_eq!((stats.published, stats.delivered, stats.redelivered), (5, 7, 2));
    assert_eq!((stats.acked, stats.lag(), stats.closed), (Some(Position(5)), 0, true));
    assert!(lane.is_idle());
    println!("ok: every reading acked once, two redeliveries, acked position 5");
    Ok(())
}

/// The counters this example cares about, on one line (`LaneStats` also implements `Debug`, and
/// `Serialize` with the `serde` feature).
fn counters(s: &LaneStats) -> String {
    format!(
        "queued {} released {} in_flight {} delivered {} redelivered {} acked {}",
        s.queued,
        s.released,
        s.in_flight,
        s.delivered,
        s.redelivered,
        s.acked.map_or("none".to_owned(), |p| p.0.to_string())
    )
}
