//! Bounds and edges of the engine: every counter packed into a state word has a real bound and a
//! defined answer at it; publishing and closing are one atomic step; capacities are bounded at
//! build time; a slot pinned by a stale delivery is visible; an item's drop panic never aborts.

use crate::common;
use lanestream::prelude::*;

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::Duration;

use common::{batch, stream, Tick};
use lanestream::{
    BuildError, Item, Lane, MemoryStream, Position, PublishError, SinkName, Stream, StreamError,
    TryRecvError, MAX_CAPACITY,
};

fn ticks(capacity: usize) -> Lane<Tick> {
    Lane::standalone(SinkName::new("ticks").unwrap(), capacity).unwrap()
}

/// 65,535 live deliveries of one item (each re-attach leaves the detached consumer's delivery
/// alive and redelivers the item) is the bound: the next redelivery waits until one of them
/// ends, the slot is never reused while any of them reads it, and the item is acked once.
#[test]
fn l8_live_deliveries_of_one_item_are_bounded_and_the_next_redelivery_waits() {
    const BOUND: usize = 0xFFFF;
    let lane = ticks(2);
    let mut producer = lane.producer().unwrap();
    producer.publish(Tick(1)).unwrap();
    let mut kept = Vec::with_capacity(BOUND);
    for _ in 0..BOUND {
        let delivery = lane.reattach().try_recv().unwrap();
        assert_eq!(*delivery.item(), Tick(1));
        kept.push(delivery);
    }
    assert_eq!(kept[BOUND - 1].attempt(), BOUND as u32);
    // At the bound: the item is released (the last re-attach took it back) but not redelivered,
    // and nothing overtakes it.
    let mut consumer = lane.reattach();
    producer.publish(Tick(2)).unwrap();
    assert_eq!(consumer.try_recv().unwrap_err(), TryRecvError::Empty);
    assert_eq!(lane.stats().released, 1);
    // The waiting forms wait as on an empty lane: a deadline is kept, a poll returns `Pending`
    // (nothing here would end a stale delivery, so a wait that never gave up would hang).
    assert!(consumer.recv_timeout(Duration::from_millis(20)).unwrap_err().is_timeout());
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    assert!(consumer.poll_recv(&mut cx).is_pending());
    // One delivery ends: the redelivery goes through, in order.
    drop(kept.pop());
    let again = consumer.try_recv().unwrap();
    assert_eq!(*again.item(), Tick(1));
    again.ack().unwrap();
    assert_eq!(lane.acked(), Some(Position(1)));
    // Item 1's slot stays pinned while the stale deliveries read it; item 2 fills the other slot
    // and item 3 finds no room.
    let stats = lane.stats();
    assert_eq!((stats.pinned, stats.free_slots()), (1, 0));
    assert!(producer.try_publish(Tick(3)).unwrap_err().is_full());
    assert!(kept.iter().all(|d| *d.item() == Tick(1)), "a stale delivery reads another item");
    assert!(kept.iter().all(|d| d.attempt() >= 1));
    drop(kept);
    assert_eq!(lane.stats().pinned, 0);
    producer.try_publish(Tick(3)).unwrap();
    for expected in [2, 3] {
        let d = consumer.try_recv().unwrap();
        assert_eq!(*d.item(), Tick(expected));
        d.ack().unwrap();
    }
    assert!(lane.is_idle());
}

/// An item whose `position()` blocks in the middle of a publish: the lane is closed meanwhile.
#[derive(Debug)]
struct Gate {
    position: u64,
    entered: mpsc::Sender<()>,
    release: Arc<Barrier>,
}

impl Item for Gate {
    fn position(&self) -> Option<Position> {
        let _ = self.entered.send(());
        self.release.wait();
        Some(Position(self.position))
    }
}

/// A close that lands while a publish is half-way either comes after the item (which is then
/// received before the end) or hands the item back with `Closed`; here it deterministically
/// lands in the middle, so the item comes back.
#[test]
fn l10_close_in_the_middle_of_a_publish_hands_the_item_back() {
    let lane: Lane<Gate> = Lane::standalone(SinkName::new("gate").unwrap(), 4).unwrap();
    let (entered_tx, entered) = mpsc::channel();
    let release = Arc::new(Barrier::new(2));
    let publisher = {
        let (lane, release) = (lane.clone(), release.clone());
        thread::spawn(move || {
            let mut producer = lane.producer().unwrap();
            match producer.try_publish(Gate { position: 1, entered: entered_tx, release }) {
                Err(PublishError::Closed(item)) => item.position,
                other => panic!("publish racing a close: {:?}", other.map_err(|e| e.to_string())),
            }
        })
    };
    entered.recv().unwrap();
    lane.close();
    release.wait();
    assert_eq!(publisher.join().unwrap(), 1);
    let mut consumer = lane.attach().unwrap();
    assert!(consumer.recv().unwrap().is_none());
    assert_eq!(consumer.try_recv().unwrap_err(), TryRecvError::Closed);
    assert_eq!(lane.stats().published, 0);
}

/// Closing from another thread while a producer publishes as fast as it can: every publish that
/// returned `Ok` is received before the end, nothing arrives after it.
#[test]
fn l10_close_racing_a_publish_loop_never_loses_nor_resurrects_an_item() {
    let rounds = if cfg!(debug_assertions) { 300 } else { 3_000 };
    for round in 0..rounds {
        let s = stream(8, &["a"]);
        let lane = s.lane("a").unwrap();
        let published = Arc::new(AtomicU64::new(0));
        let start = Arc::new(Barrier::new(2));
        let producer = {
            let (mut p, published, start) = (s.fanout().unwrap(), published.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                let mut lsn = 1;
                loop {
                    match p.try_publish(batch(lsn)) {
                        Ok(()) => {
                            published.store(lsn, Ordering::Release);
                            lsn += 1;
                        }
                        Err(PublishError::Full(_)) => thread::yield_now(),
                        Err(e) => {
                            assert!(e.is_closed());
                            return;
                        }
                    }
                }
            })
        };
        let mut consumer = lane.attach().unwrap();
        start.wait();
        let mut received = 0;
        let closer = {
            let lane = lane.clone();
            thread::spawn(move || {
                for _ in 0..(round % 50) {
                    thread::yield_now();
                }
                lane.close();
            })
        };
        while let Some(d) = consumer.recv().unwrap() {
            received += 1;
            assert_eq!(d.position(), Some(Position(received)));
            d.ack().unwrap();
        }
        closer.join().unwrap();
        producer.join().unwrap();
        assert_eq!(received, published.load(Ordering::Acquire), "round {round}: an Ok publish was lost");
        assert_eq!(
            consumer.try_recv().unwrap_err(),
            TryRecvError::Closed,
            "round {round}: item after the end"
        );
    }
}

/// Counts drops, and panics in the first one.
#[derive(Debug)]
struct PanicsOnDrop(Arc<AtomicUsize>);

impl Item for PanicsOnDrop {
    fn position(&self) -> Option<Position> {
        None
    }
}

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("item drop panics");
        }
    }
}

/// A stale delivery and the producer dropped while their thread unwinds, after the item's last
/// holder was that stale delivery: the unwind frees the item but drops nothing (an item's `Drop`
/// that panics while the thread unwinds would abort), so the process goes on and the panic that
/// unwinds is the thread's own; the lane's drop drops the item later, once.
#[test]
fn m3_a_stale_delivery_and_the_producer_dropped_during_unwinding_do_not_abort_on_an_item_drop_panic() {
    let lane: Lane<PanicsOnDrop> = Lane::standalone(SinkName::new("p").unwrap(), 2).unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    let mut producer = lane.producer().unwrap();
    producer.publish(PanicsOnDrop(drops.clone())).unwrap();
    let stale = lane.attach().unwrap().try_recv().unwrap();
    let mut consumer = lane.reattach();
    consumer.try_recv().unwrap().ack().unwrap();
    assert_eq!(lane.stats().pinned, 1);
    let unwound = panic::catch_unwind(AssertUnwindSafe(move || {
        let _producer = producer;
        let _held = stale;
        panic!("the worker holding the stale delivery fails");
    }));
    let message = unwound.unwrap_err();
    assert_eq!(message.downcast_ref::<&str>(), Some(&"the worker holding the stale delivery fails"));
    assert_eq!(drops.load(Ordering::SeqCst), 0, "nothing is dropped while the thread unwinds");
    assert_eq!(lane.stats().pinned, 0);
    let dropped = panic::catch_unwind(AssertUnwindSafe(move || drop((consumer, lane))));
    assert!(dropped.is_err(), "the lane's drop drops the item, whose drop panic surfaces");
    assert_eq!(drops.load(Ordering::SeqCst), 1, "the item is dropped exactly once");
}

/// Outside an unwind, the same drop panic reaches the thread that drops the producer once the
/// stale delivery freed the item (the producer's drop drops what the lane freed).
#[test]
fn m3_a_producer_dropped_normally_after_a_stale_delivery_surfaces_the_item_drop_panic() {
    let lane: Lane<PanicsOnDrop> = Lane::standalone(SinkName::new("p").unwrap(), 2).unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    let mut producer = lane.producer().unwrap();
    producer.publish(PanicsOnDrop(drops.clone())).unwrap();
    let stale = lane.attach().unwrap().try_recv().unwrap();
    lane.reattach().try_recv().unwrap().ack().unwrap();
    drop(stale);
    assert_eq!(drops.load(Ordering::SeqCst), 0, "freed, not dropped: the producer drops it");
    assert!(lane.is_idle() && lane.stats().pinned == 0);
    let dropped = panic::catch_unwind(AssertUnwindSafe(move || drop(producer)));
    assert!(dropped.is_err(), "the drop panic surfaces");
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    lane.producer().expect("the panicking drop gave the producer role back");
}

#[test]
fn l1_capacities_above_the_limit_are_refused_at_build_with_the_limit_named() {
    for capacity in [MAX_CAPACITY + 1, 1 << 40, usize::MAX] {
        let err = MemoryStream::builder().capacity(capacity).sink("a").build().unwrap_err();
        assert_eq!(err, BuildError::CapacityTooLarge { what: "sink lanes", capacity, max: MAX_CAPACITY });
        assert!(err.to_string().contains(&MAX_CAPACITY.to_string()), "{err}");
        let err = MemoryStream::builder().request_capacity(capacity).sink("a").build().unwrap_err();
        assert_eq!(
            err,
            BuildError::CapacityTooLarge { what: "the request lane", capacity, max: MAX_CAPACITY }
        );
        let err = Lane::<Tick>::standalone(SinkName::new("a").unwrap(), capacity).unwrap_err();
        assert_eq!(
            err,
            BuildError::CapacityTooLarge { what: "a standalone lane", capacity, max: MAX_CAPACITY }
        );
    }
}

/// The capacity-1 case: the new consumer acked the item while the detached one still holds it.
/// The lane is idle with no lag, yet a publish must wait: `pinned` says why.
#[test]
fn l8_a_slot_pinned_by_a_stale_delivery_shows_in_the_stats() {
    let lane = ticks(1);
    let mut producer = lane.producer().unwrap();
    producer.publish(Tick(1)).unwrap();
    let stale = lane.attach().unwrap().try_recv().unwrap();
    lane.reattach().try_recv().unwrap().ack().unwrap();
    let stats = lane.stats();
    assert!(lane.is_idle());
    assert_eq!((stats.lag(), stats.pinned, stats.free_slots()), (0, 1, 0));
    assert!(producer.publish_timeout(Tick(2), Duration::from_millis(5)).unwrap_err().is_timeout());
    drop(stale);
    assert_eq!(lane.stats().free_slots(), 1);
    producer.try_publish(Tick(2)).unwrap();
}

/// `attach` refuses while a consumer is alive and succeeds once it is dropped; `reattach` always
/// takes the lane over.
#[test]
fn l8_attach_refuses_while_a_consumer_is_alive_and_reattach_takes_over() {
    let s = stream(4, &["a"]);
    let lane = s.lane("a").unwrap();
    let first = lane.attach().unwrap();
    assert_eq!(lane.attach().unwrap_err(), StreamError::ConsumerAttached(SinkName::new("a").unwrap()));
    let second = lane.reattach();
    assert!(first.is_detached());
    drop(first); // a detached consumer going away does not free the lane
    assert!(matches!(lane.attach(), Err(StreamError::ConsumerAttached(_))));
    drop(second);
    let third = lane.attach().unwrap();
    assert!(!third.is_detached());
    let requests = s.requests();
    let ingest = requests.attach().unwrap();
    assert_eq!(requests.attach().unwrap_err(), StreamError::RequestConsumerAttached);
    drop(ingest);
    requests.attach().unwrap();
}
