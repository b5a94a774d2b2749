//! Runs (`Consumer::recv_run` and its siblings, [`Run`]): the lane rules applied to a run and to
//! its un-acked remainder, one test per rule (named after it, as in `tests/lanes/contract.rs`).

use crate::common;
use lanestream::prelude::*;

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread;
use std::time::Duration;

use common::{
    batch, publish_range, run_positions, shared_envelopes, stream, tracked, within, CountingWaker, Tick,
};
use lanestream::{AckError, Item, Lane, MemoryStream, Position, SinkName, Stream, TryRecvError, MAX_RUN};

#[test]
fn runs_l2_a_run_is_the_queued_items_in_publish_order_up_to_max_across_wraps() {
    for capacity in [1usize, 2, 3, 5, 7, 8] {
        let s = stream(capacity, &["a"]);
        let lane = s.lane("a").unwrap();
        let mut producer = s.fanout().unwrap();
        let mut consumer = lane.attach().unwrap();
        let mut next = 1;
        let mut got = Vec::new();
        // Many laps, with runs of every size up to the capacity (and a max above it).
        for lap in 0..40u64 {
            let k = 1 + (lap as usize % capacity);
            for _ in 0..k {
                producer.try_publish(batch(next)).unwrap();
                next += 1;
            }
            let max = 1 + (lap as usize % (capacity + 2));
            while let Ok(run) = consumer.try_recv_run(max) {
                assert!(run.len() <= max.min(k), "run of {} for max {max}, {k} queued", run.len());
                assert_eq!(run.attempt(), 1);
                assert_eq!(run.sequences().end - run.sequences().start, run.len() as u64);
                got.extend(run_positions(&run));
                run.ack().unwrap();
            }
        }
        assert_eq!(got, (1..next).collect::<Vec<_>>(), "capacity {capacity}");
        assert_eq!(lane.acked(), Some(Position(next - 1)));
        assert!(lane.is_idle());
    }
}

#[test]
fn runs_max_is_clamped_to_1_and_max_run() {
    let s = stream(256, &["a"]);
    publish_range(&s, 1..=200);
    let mut consumer = s.attach("a").unwrap();
    let one = consumer.try_recv_run(0).unwrap();
    assert_eq!(run_positions(&one), [1]);
    let full = consumer.try_recv_run(10_000).unwrap();
    assert_eq!(full.len(), MAX_RUN);
    assert_eq!(full.sequences(), 1..1 + MAX_RUN as u64);
    one.ack().unwrap();
    full.ack().unwrap();
    assert_eq!(s.acked("a").unwrap(), Some(Position(1 + MAX_RUN as u64)));
}

#[test]
fn runs_l5_ack_through_is_cumulative_and_the_acked_position_follows_the_prefix() {
    let s = stream(8, &["a"]);
    publish_range(&s, 1..=6);
    let mut consumer = s.attach("a").unwrap();
    let single = consumer.try_recv().unwrap(); // item 1, outstanding
    let mut run = consumer.try_recv_run(8).unwrap();
    assert_eq!(run_positions(&run), [2, 3, 4, 5, 6]);
    assert_eq!(run.sequences(), 1..6);
    // Below the run: nothing; through sequence 2 (items 2 and 3).
    assert_eq!(run.ack_through(0).unwrap(), 0);
    assert_eq!(run.ack_through(2).unwrap(), 2);
    assert_eq!(run_positions(&run), [4, 5, 6]);
    assert_eq!(run.get(0).unwrap().position(), Some(Position(4)));
    assert!(run.get(3).is_none());
    // Item 1 is still out: the acked position has not moved (L5).
    assert_eq!(s.acked("a").unwrap(), None);
    single.ack().unwrap();
    assert_eq!(s.acked("a").unwrap(), Some(Position(3)));
    // By position: through the last item at or below 5.
    assert_eq!(run.ack_through_position(Position(5)).unwrap(), 2);
    assert_eq!(s.acked("a").unwrap(), Some(Position(5)));
    assert_eq!(run.last_position(), Some(Position(6)));
    // Past the end: the rest.
    assert_eq!(run.ack_through(100).unwrap(), 1);
    assert!(run.is_empty());
    assert_eq!(run.ack_through(100).unwrap(), 0);
    drop(run); // nothing left to release
    assert_eq!(s.acked("a").unwrap(), Some(Position(6)));
    assert!(s.is_idle());
}

#[test]
fn runs_l5_ack_through_position_skips_unpositioned_items_after_the_position() {
    let s = stream(8, &["a"]);
    let mut producer = s.fanout().unwrap();
    for item in [batch(1), common::snapshot(), batch(5), common::snapshot(), batch(9)] {
        producer.publish(item).unwrap();
    }
    let mut consumer = s.attach("a").unwrap();
    let mut run = consumer.try_recv_run(8).unwrap();
    assert_eq!(run.len(), 5);
    // Through 5: items 1, snapshot, 5; the snapshot after 5 stays.
    assert_eq!(run.ack_through_position(Position(7)).unwrap(), 3);
    assert_eq!(run.len(), 2);
    assert_eq!(run.get(0).unwrap().position(), None);
    assert_eq!(s.acked("a").unwrap(), Some(Position(5)));
    run.ack().unwrap();
    assert_eq!(s.acked("a").unwrap(), Some(Position(9)));
}

#[test]
fn runs_l6_nack_releases_the_remainder_which_comes_back_first_one_item_per_run() {
    let s = stream(8, &["a"]);
    publish_range(&s, 1..=4);
    let mut consumer = s.attach("a").unwrap();
    let mut run = consumer.try_recv_run(3).unwrap();
    assert_eq!(run.ack_through(0).unwrap(), 1); // item 1
    run.nack(); // items 2 and 3 released
    assert_eq!(s.stats("a").unwrap().released, 2);
    assert!(!consumer.is_empty());
    let mut got = Vec::new();
    while let Ok(run) = consumer.try_recv_run(8) {
        got.push((run_positions(&run), run.attempt()));
        run.ack().unwrap();
    }
    // Redeliveries first, each in a run of its own with attempt 2; then item 4 (never delivered).
    assert_eq!(got, [(vec![2], 2), (vec![3], 2), (vec![4], 1)]);
    assert_eq!(s.acked("a").unwrap(), Some(Position(4)));
    assert!(s.is_idle());
}

#[test]
fn runs_l6_dropping_a_run_releases_it_and_single_receives_see_the_redeliveries() {
    let s = stream(4, &["a"]);
    publish_range(&s, 1..=3);
    let mut consumer = s.attach("a").unwrap();
    drop(consumer.try_recv_run(8).unwrap());
    let stats = s.stats("a").unwrap();
    assert_eq!((stats.released, stats.in_flight, stats.redelivered), (3, 0, 0));
    for p in 1..=3 {
        let d = consumer.try_recv().unwrap();
        assert_eq!((d.position(), d.attempt()), (Some(Position(p)), 2));
        d.ack().unwrap();
    }
    assert_eq!(consumer.try_recv().unwrap_err(), TryRecvError::Empty);
    assert!(s.is_idle());
}

#[test]
fn runs_l8_reattach_mid_run_the_acked_part_counts_the_rest_is_redelivered_in_order() {
    let s = stream(8, &["a"]);
    publish_range(&s, 1..=5);
    let mut old = s.attach("a").unwrap();
    let mut run = old.try_recv_run(8).unwrap();
    assert_eq!(run.ack_through(1).unwrap(), 2); // items 1, 2 land
    let mut new = s.reattach("a").unwrap();
    // The run's items stay readable in place (their slots are pinned while it lives).
    assert_eq!(run_positions(&run), [3, 4, 5]);
    assert_eq!(run.ack_through(2).unwrap_err(), AckError::Detached);
    assert_eq!(run.len(), 2);
    assert_eq!(old.try_recv_run(8).unwrap_err(), TryRecvError::Detached);
    let mut got = Vec::new();
    while let Ok(d) = new.try_recv_run(8) {
        got.push((run_positions(&d), d.attempt()));
        d.ack().unwrap();
    }
    assert_eq!(got, [(vec![3], 2), (vec![4], 2), (vec![5], 2)]);
    assert_eq!(s.acked("a").unwrap(), Some(Position(5)));
    // The stale run still reads items 4 and 5 in place: their slots are pinned, not reused.
    assert_eq!(s.stats("a").unwrap().pinned, 2);
    assert_eq!(run_positions(&run), [4, 5]);
    assert_eq!(run.ack().unwrap_err(), AckError::Detached);
    assert_eq!(s.stats("a").unwrap().pinned, 0);
    assert!(s.is_idle());
}

#[test]
fn runs_l8_a_stale_run_dropped_releases_nothing_more() {
    let s = stream(4, &["a"]);
    publish_range(&s, 1..=2);
    let mut old = s.attach("a").unwrap();
    let run = old.try_recv_run(4).unwrap();
    let mut new = s.reattach("a").unwrap();
    assert_eq!(s.stats("a").unwrap().released, 2);
    drop(run);
    assert_eq!(s.stats("a").unwrap().released, 2, "a stale run released its items again");
    let redelivered = new.try_recv_run(4).unwrap();
    assert_eq!((run_positions(&redelivered), redelivered.attempt()), (vec![1], 2));
    redelivered.ack().unwrap();
    new.try_recv_run(4).unwrap().ack().unwrap();
    assert_eq!(new.try_recv_run(4).unwrap_err(), TryRecvError::Empty);
    assert!(s.is_idle());
}

/// The holder bound applies to redeliveries through runs as to single receives: at 65,535 live
/// deliveries of one item, the next redelivery (by `try_recv_run` too) waits and nothing
/// overtakes it.
#[test]
fn runs_l8_the_holder_bound_holds_for_redeliveries_in_runs() {
    const BOUND: usize = 0xFFFF;
    let lane: Lane<Tick> = Lane::standalone(SinkName::new("ticks").unwrap(), 2).unwrap();
    let mut producer = lane.producer().unwrap();
    producer.publish(Tick(1)).unwrap();
    let mut kept = Vec::with_capacity(BOUND);
    for _ in 0..BOUND {
        let run = lane.reattach().try_recv_run(4).unwrap();
        assert_eq!(run.get(0), Some(&Tick(1)));
        kept.push(run);
    }
    assert_eq!(kept[BOUND - 1].attempt(), BOUND as u32);
    let mut consumer = lane.reattach();
    producer.publish(Tick(2)).unwrap();
    assert_eq!(consumer.try_recv_run(4).unwrap_err(), TryRecvError::Empty);
    assert!(consumer.recv_run_timeout(4, Duration::from_millis(20)).unwrap_err().is_timeout());
    drop(kept.pop());
    let again = consumer.try_recv_run(4).unwrap();
    assert_eq!((again.len(), again.get(0)), (1, Some(&Tick(1))));
    again.ack().unwrap();
    drop(kept);
    let rest = consumer.try_recv_run(4).unwrap();
    assert_eq!(rest.iter().collect::<Vec<_>>(), [&Tick(2)]);
    rest.ack().unwrap();
    assert!(lane.is_idle());
}

#[test]
fn runs_l10_recv_run_drains_then_returns_none_and_none_is_not_final_while_a_run_is_out() {
    let s = stream(4, &["a"]);
    publish_range(&s, 1..=3);
    s.close("a").unwrap();
    let mut consumer = s.attach("a").unwrap();
    let run = consumer.recv_run(2).unwrap().unwrap();
    assert_eq!(run_positions(&run), [1, 2]);
    let last = consumer.recv_run(2).unwrap().unwrap();
    assert_eq!(run_positions(&last), [3]);
    assert!(consumer.recv_run(2).unwrap().is_none());
    assert_eq!(consumer.try_recv_run(2).unwrap_err(), TryRecvError::Closed);
    drop(run); // released after the end: comes back
    let again = consumer.recv_run(8).unwrap().unwrap();
    assert_eq!((run_positions(&again), again.attempt()), (vec![1], 2));
    again.ack().unwrap();
    consumer.recv_run(8).unwrap().unwrap().ack().unwrap();
    last.ack().unwrap();
    assert!(consumer.recv_run(8).unwrap().is_none());
    assert!(s.is_idle());
}

#[test]
fn runs_l10_close_wakes_a_blocked_recv_run() {
    let s = stream(4, &["a"]);
    let mut consumer = s.attach("a").unwrap();
    let closer = s.clone();
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        closer.close("a").unwrap();
    });
    let end = within(10, "recv_run on a closed lane", move || consumer.recv_run(8).unwrap().is_none());
    assert!(end);
    t.join().unwrap();
}

#[test]
fn runs_a_blocked_recv_run_wakes_on_publish_and_an_async_one_is_woken() {
    let s = stream(4, &["a"]);
    let mut consumer = s.attach("a").unwrap();
    let publisher = s.clone();
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        publish_range(&publisher, 1..=1);
    });
    let got = within(10, "recv_run woken by a publish", move || {
        let run = consumer.recv_run(8).unwrap().unwrap();
        let p = run_positions(&run);
        run.ack().unwrap();
        (p, consumer)
    });
    assert_eq!(got.0, [1]);
    t.join().unwrap();
    let mut consumer = got.1;

    let (counter, waker) = CountingWaker::new();
    let mut cx = Context::from_waker(&waker);
    {
        let mut fut = std::pin::pin!(consumer.recv_run_async(8));
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        publish_range(&s, 2..=3);
        assert_eq!(counter.wakes(), 1, "the publish woke the pending recv_run_async");
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(Some(run))) => {
                assert_eq!(run_positions(&run), [2, 3]);
                run.ack().unwrap();
            }
            other => panic!("not ready: {other:?}"),
        }
    }
    // A dropped future took nothing.
    publish_all_from(&s, 4);
    drop(consumer.recv_run_async(8));
    assert_eq!(run_positions(&consumer.try_recv_run(8).unwrap()), [4]);
}

fn publish_all_from(s: &MemoryStream, p: u64) {
    s.fanout().unwrap().publish(batch(p)).unwrap();
}

#[test]
fn runs_l12_try_recv_run_never_blocks_and_reports_detached() {
    let s = stream(4, &["a"]);
    let mut consumer = s.attach("a").unwrap();
    assert_eq!(consumer.try_recv_run(4).unwrap_err(), TryRecvError::Empty);
    assert!(consumer.recv_run_timeout(4, Duration::from_millis(5)).unwrap_err().is_timeout());
    let _new = s.reattach("a").unwrap();
    assert_eq!(consumer.try_recv_run(4).unwrap_err(), TryRecvError::Detached);
    assert!(matches!(consumer.recv_run(4), Err(lanestream::RecvError::Detached)));
}

/// A run is acked on another thread (it is `Send`), with runs and single deliveries outstanding
/// together, and the watermark over two lanes follows.
#[test]
fn runs_w1_runs_acked_on_worker_threads_move_the_watermark() {
    let s = stream(16, &["a", "b"]);
    publish_range(&s, 1..=10); // to both lanes
    let mut a = s.attach("a").unwrap();
    let mut b = s.attach("b").unwrap();
    let first = a.try_recv_run(4).unwrap();
    let second = a.try_recv_run(16).unwrap();
    let single = b.try_recv().unwrap();
    let rest_b = b.try_recv_run(16).unwrap();
    assert_eq!((first.len(), second.len(), rest_b.len()), (4, 6, 9));
    let workers: Vec<_> =
        [second, rest_b].into_iter().map(|run| thread::spawn(move || run.ack().unwrap())).collect();
    workers.into_iter().for_each(|w| w.join().unwrap());
    assert_eq!(s.watermark(), None, "item 1 of each lane is still out");
    first.ack().unwrap();
    assert_eq!(s.watermark(), None);
    single.ack().unwrap();
    assert_eq!(s.watermark(), Some(Position(10)));
    assert!(s.is_idle());
}

/// M3: every item of a run is dropped once: acked ones (through `ack_through`, or released and
/// acked again) at the fan-out's next publish, the rest with the stream.
#[test]
fn runs_m3_items_of_runs_are_dropped_exactly_once() {
    let envelopes = shared_envelopes(7);
    {
        let s = stream(8, &["a"]);
        let mut producer = s.fanout().unwrap();
        for p in 1..=8 {
            producer.publish(tracked(Some(p), &envelopes)).unwrap();
        }
        assert_eq!(Arc::strong_count(&envelopes), 9);
        let mut consumer = s.attach("a").unwrap();
        let mut run = consumer.try_recv_run(5).unwrap();
        run.ack_through(1).unwrap();
        assert_eq!(Arc::strong_count(&envelopes), 9, "acked, dropped at the next publish");
        producer.publish(batch(9)).unwrap();
        assert_eq!(Arc::strong_count(&envelopes), 7, "the publish dropped the two acked items");
        drop(run); // 3 released
        consumer.try_recv_run(1).unwrap().ack().unwrap();
        assert_eq!(Arc::strong_count(&envelopes), 7);
        producer.publish(batch(10)).unwrap();
        assert_eq!(Arc::strong_count(&envelopes), 6, "the re-acked item went at the next publish");
        let _outstanding = consumer.try_recv_run(8).unwrap();
    }
    assert_eq!(Arc::strong_count(&envelopes), 1);
}

/// An item whose `Drop` panics (for item `1`), counting its drops.
#[derive(Debug)]
struct Boom(u64, Arc<std::sync::atomic::AtomicUsize>);

impl Item for Boom {
    fn position(&self) -> Option<Position> {
        Some(Position(self.0))
    }
}

impl Drop for Boom {
    fn drop(&mut self) {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.0 == 1 && !thread::panicking() {
            panic!("item 1's drop panics");
        }
    }
}

/// M3 with runs: dropping a stale run whose first item's last holder it was frees that item and
/// ends the run's other items (no slot stays pinned) without dropping any; the producer's next
/// publish drops it, its `Drop` panics, and the panic reaches the publishing thread once the
/// publish is done; every item is dropped once.
#[test]
fn runs_m3_a_stale_run_dropped_frees_its_items_and_a_panicking_drop_reaches_the_next_publish() {
    let drops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let lane: Lane<Boom> = Lane::standalone(SinkName::new("boom").unwrap(), 4).unwrap();
    let mut producer = lane.producer().unwrap();
    for p in 1..=3 {
        producer.publish(Boom(p, drops.clone())).unwrap();
    }
    let mut old = lane.attach().unwrap();
    let stale = old.try_recv_run(4).unwrap();
    let mut new = lane.reattach();
    // The new consumer acks item 1: it counts, its slot stays pinned by the stale run.
    new.try_recv_run(4).unwrap().ack().unwrap();
    assert_eq!(lane.stats().pinned, 1);
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(stale)));
    assert!(dropped.is_ok(), "dropping the run drops no item: the producer's next publish does");
    assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 0);
    let stats = lane.stats();
    assert_eq!((stats.pinned, stats.released), (0, 2), "the run's other items were ended");
    let published = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        producer.publish(Boom(4, drops.clone())).unwrap();
    }));
    assert!(published.is_err(), "item 1's drop panic reaches the thread that published next");
    assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(lane.stats().published, 4, "the publish was done before the panic reached it");
    for _ in 0..3 {
        new.try_recv_run(4).unwrap().ack().unwrap();
    }
    assert!(lane.is_idle());
    drop(producer);
    assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 4, "the producer's drop dropped the rest");
}
