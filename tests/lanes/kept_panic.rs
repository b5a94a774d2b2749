//! M3, attacked: a drop panic caught by a publish step that is then refused is kept by the
//! publisher (the refused item goes back to the caller) and resumed after the next step that
//! publishes, or by the fan-out's (producer's) drop — never while the thread is unwinding.
//!
//! Every form is tried: the blocking, timed and async publishes, runs (whole and partial),
//! `publish_to`, a standalone lane's producer refused `Closed` by an item whose drop closes its
//! lane, two panics caught by two refused steps, a kept panic at a drop while unwinding (also
//! with a payload whose own drop panics, and with the last reference to the cells), and the
//! ends' `Send`/`Sync`.

use crate::common;
use lanestream::prelude::*;

use std::future::Future;
use std::panic::{catch_unwind, panic_any, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use common::{bomb, bomb_with, payload, shared_envelopes, tracked, CountingWaker};
use lanestream::{
    Batch, Consumer, Delivery, Envelope, Fanout, FanoutPublish, IndexName, Item, Lane, LaneItem,
    MemoryStream, Op, Position, Producer, Publish, PublishError, Request, RequestLane, RequestSender,
    SinkName, Stream,
};

/// `k` copies of one envelope: a batch of them is charged about `k` times a batch of one.
fn envelopes(k: usize, tag: u64) -> Arc<[Envelope]> {
    let one = shared_envelopes(tag);
    vec![one[0].clone(); k].into()
}

/// A budgeted one-lane stream, the budget spent exactly by `bomb "one"` (position 1, acked) and
/// `kept` (position 2, delivered, not acked): the next publish of an item charged more than the
/// bomb drops the bomb (its drop panics) and is refused `Full` in that same step.
struct Spent {
    s: MemoryStream,
    p: Fanout,
    c: Consumer<LaneItem>,
    held: Delivery<LaneItem>,
    dropped: Arc<AtomicUsize>,
    /// Shared by the refused item(s) ([`Spent::big`]): its strong count counts their live copies.
    refused: Arc<[Envelope]>,
}

fn spent() -> Spent {
    let dropped = Arc::new(AtomicUsize::new(0));
    let kept = shared_envelopes(2);
    let first = bomb(1, "one", &dropped);
    let budget = first.charge() + tracked(Some(2), &kept).charge();
    let refused = envelopes(2, 3);
    assert!(tracked(Some(3), &refused).charge() > first.charge());
    let s = MemoryStream::builder().capacity(8).sink("a").memory_budget(budget).build().unwrap();
    let mut p = s.fanout().unwrap();
    let mut c = s.lane("a").unwrap().reattach();
    p.try_publish(first).unwrap();
    p.try_publish(tracked(Some(2), &kept)).unwrap();
    c.try_recv().unwrap().ack().unwrap();
    let held = c.try_recv().unwrap();
    assert_eq!(dropped.load(Ordering::SeqCst), 0);
    Spent { s, p, c, held, dropped, refused }
}

impl Spent {
    /// An item charged more than the bomb, at `position`.
    fn big(&self, position: u64) -> LaneItem {
        tracked(Some(position), &self.refused)
    }
}

/// A budgeted one-lane stream whose budget holds bombs "one" (position 1) and "two" (position 2)
/// exactly, both published, "one" acked and "two" delivered (`second`), not acked.
struct TwoBombs {
    s: MemoryStream,
    p: Fanout,
    c: Consumer<LaneItem>,
    one: Arc<AtomicUsize>,
    two: Arc<AtomicUsize>,
    second: Delivery<LaneItem>,
}

fn two_bombs() -> TwoBombs {
    let (one, two) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (b1, b2) = (bomb(1, "one", &one), bomb(2, "two", &two));
    let budget = b1.charge() + b2.charge();
    let s = MemoryStream::builder().capacity(8).sink("a").memory_budget(budget).build().unwrap();
    let mut p = s.fanout().unwrap();
    let mut c = s.lane("a").unwrap().reattach();
    p.try_publish(b1).unwrap();
    p.try_publish(b2).unwrap();
    c.try_recv().unwrap().ack().unwrap();
    let second = c.try_recv().unwrap();
    TwoBombs { s, p, c, one, two, second }
}

/// Polls `fut` once with `waker`, catching a panic.
fn poll_once<F: Future + Unpin>(
    fut: &mut F,
    waker: &std::task::Waker,
) -> std::thread::Result<Poll<F::Output>> {
    let mut cx = Context::from_waker(waker);
    catch_unwind(AssertUnwindSafe(|| Pin::new(&mut *fut).poll(&mut cx)))
}

#[test]
fn m3_a_publish_refused_in_the_step_that_caught_a_drop_panic_hands_its_item_back() {
    let sp = spent();
    let item = sp.big(3);
    let Spent { s, mut p, mut c, held, dropped, refused } = sp;
    let attempt = catch_unwind(AssertUnwindSafe(|| p.try_publish(item)));
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "the step dropped the acked bomb");
    let back = match attempt {
        Ok(Err(PublishError::Full(back))) => back,
        Ok(other) => panic!("expected Full with the item, got {other:?}"),
        Err(_) => panic!("the drop panic was resumed by a refused publish: its item was lost"),
    };
    assert_eq!(Arc::strong_count(&refused), 2, "the refused item is handed back whole");
    // The panic is kept for the next publish that goes through, resumed once it is done.
    held.ack().unwrap();
    let again = catch_unwind(AssertUnwindSafe(|| p.try_publish(back)));
    assert_eq!(payload(&again.expect_err("the kept panic surfaces after the next publish that goes")), "one");
    assert_eq!(s.lane("a").unwrap().stats().published, 3, "that publish was done first");
    let third = c.try_recv().unwrap();
    assert_eq!(third.position(), Some(Position(3)));
    third.ack().unwrap();
    // Surfaced once: the stream keeps working.
    p.try_publish(tracked(Some(4), &shared_envelopes(4))).unwrap();
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
}

#[test]
fn m3_a_run_refused_in_the_step_that_caught_a_drop_panic_stays_in_its_vec() {
    let sp = spent();
    let mut run = vec![sp.big(3), sp.big(4)];
    let Spent { s, mut p, held, dropped, refused, .. } = sp;
    let attempt = catch_unwind(AssertUnwindSafe(|| p.try_publish_run(&mut run)));
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    assert!(
        matches!(attempt, Ok(Err(PublishError::Full(0)))),
        "expected Full(0) with the run kept, got a panic or {:?}",
        attempt.as_ref().ok()
    );
    assert_eq!((run.len(), Arc::strong_count(&refused)), (2, 3), "both items still in the Vec");
    held.ack().unwrap();
    let again = catch_unwind(AssertUnwindSafe(|| p.try_publish_run(&mut run)));
    assert!(again.is_err(), "the kept drop panic surfaces after the next run step that goes");
    assert_eq!(s.lane("a").unwrap().stats().published, 3, "that step published the first item");
    assert_eq!((run.len(), Arc::strong_count(&refused)), (1, 3), "the second waits in the Vec");
}

#[test]
fn m3_a_drop_panic_kept_by_a_refused_publish_surfaces_when_the_fanout_is_dropped() {
    let sp = spent();
    let item = sp.big(3);
    let Spent { s, mut p, dropped, .. } = sp;
    assert!(matches!(p.try_publish(item), Err(PublishError::Full(_))));
    let dropping = catch_unwind(AssertUnwindSafe(|| drop(p)));
    assert_eq!(payload(&dropping.expect_err("the kept panic surfaces at the drop")), "one");
    // The role was given back before the panic: a new fan-out can be made.
    assert!(s.fanout().is_ok());
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
}

#[test]
fn m3_a_blocking_publish_refused_after_a_drop_panic_waits_publishes_then_surfaces_it_once() {
    let Spent { s, mut p, mut c, held, dropped, refused } = spent();
    let item = tracked(Some(3), &refused);
    let acker = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        held.ack().unwrap();
    });
    // The first step drops the bomb and is refused (Full): the panic is kept, the publish waits,
    // the ack lets the next step go, and then the panic comes.
    let attempt = catch_unwind(AssertUnwindSafe(|| p.publish(item)));
    acker.join().unwrap();
    let caught = attempt.expect_err("the kept drop panic surfaces after the publish that goes");
    assert_eq!(payload(&caught), "one");
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    assert_eq!(s.lane("a").unwrap().stats().published, 3, "the item was published before the panic");
    assert_eq!(Arc::strong_count(&refused), 2, "the item lives in the lane, once");
    let d = c.try_recv().unwrap();
    assert_eq!(d.position(), Some(Position(3)));
    d.ack().unwrap();
    // Surfaced once: neither the next publish nor the drop brings it again.
    p.try_publish(tracked(Some(4), &shared_envelopes(4))).unwrap();
    assert!(catch_unwind(AssertUnwindSafe(move || drop(p))).is_ok(), "not surfaced twice");
    assert_eq!(Arc::strong_count(&refused), 1, "the published item was dropped once");
}

#[test]
fn m3_a_timed_out_publish_hands_its_item_back_and_the_panic_waits_for_the_next_publish_that_goes() {
    let sp = spent();
    let item = sp.big(3);
    let Spent { s, mut p, held, dropped, refused, .. } = sp;
    let attempt = catch_unwind(AssertUnwindSafe(|| p.publish_timeout(item, Duration::from_millis(30))));
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "the first step dropped the bomb");
    let back = match attempt {
        Ok(Err(PublishError::Timeout(back))) => back,
        Ok(other) => panic!("expected Timeout with the item, got {other:?}"),
        Err(_) => panic!("the kept panic surfaced from a publish that timed out: its item is lost"),
    };
    assert_eq!(Arc::strong_count(&refused), 2, "the item came back whole");
    // A deadline already passed, still refused: still kept, item back.
    let attempt =
        catch_unwind(AssertUnwindSafe(|| p.publish_deadline(back, Some(std::time::Instant::now()))));
    let back = match attempt {
        Ok(Err(PublishError::Timeout(back))) => back,
        other => panic!("expected Timeout with the item again, got {:?}", other.map(|r| r.map_err(|_| ()))),
    };
    // A step refused before the drop pass (a regressed position) hands its item back too, and
    // keeps the panic.
    let regressed = catch_unwind(AssertUnwindSafe(|| p.try_publish(tracked(Some(1), &shared_envelopes(1)))));
    assert!(matches!(regressed, Ok(Err(PublishError::PositionRegressed { .. }))));
    held.ack().unwrap();
    let again = catch_unwind(AssertUnwindSafe(|| p.publish_timeout(back, Duration::from_millis(500))));
    assert_eq!(payload(&again.expect_err("the kept panic surfaces once the publish goes")), "one");
    assert_eq!(s.lane("a").unwrap().stats().published, 3);
    assert_eq!(Arc::strong_count(&refused), 2, "published, once");
    assert!(catch_unwind(AssertUnwindSafe(move || drop(p))).is_ok(), "not surfaced twice");
}

#[test]
fn m3_an_async_publish_refused_after_a_drop_panic_is_pending_then_publishes_and_surfaces_it() {
    let sp = spent();
    let item = sp.big(3);
    let Spent { s, mut p, held, dropped, refused, .. } = sp;
    let (wakes, waker) = CountingWaker::new();
    {
        let mut fut: FanoutPublish<'_> = p.publish_async(item);
        let first = poll_once(&mut fut, &waker);
        assert!(matches!(first, Ok(Poll::Pending)), "refused Full: pending, the panic kept");
        assert_eq!((dropped.load(Ordering::SeqCst), Arc::strong_count(&refused)), (1, 2));
        held.ack().unwrap();
        assert!(wakes.wakes() >= 1, "the ack wakes the waiting publish");
        let second = poll_once(&mut fut, &waker);
        assert_eq!(
            payload(&second.expect_err("the kept panic surfaces from the poll that publishes")),
            "one"
        );
        assert_eq!(s.lane("a").unwrap().stats().published, 3, "published before the panic");
        assert_eq!(Arc::strong_count(&refused), 2, "the item lives in the lane, once");
    }
    assert!(catch_unwind(AssertUnwindSafe(move || drop(p))).is_ok(), "not surfaced twice");
}

#[test]
fn m3_a_dropped_async_publish_drops_its_item_and_the_kept_panic_comes_with_the_next_publish() {
    let sp = spent();
    let item = sp.big(3);
    let Spent { s, mut p, held, dropped, refused, .. } = sp;
    let (_wakes, waker) = CountingWaker::new();
    let mut fut = p.publish_async(item);
    assert!(matches!(poll_once(&mut fut, &waker), Ok(Poll::Pending)));
    drop(fut);
    assert_eq!(Arc::strong_count(&refused), 1, "a dropped future drops the item it holds, once");
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    held.ack().unwrap();
    let next = catch_unwind(AssertUnwindSafe(|| p.try_publish(tracked(Some(3), &refused))));
    assert_eq!(payload(&next.expect_err("the kept panic was not lost with the future")), "one");
    assert_eq!(s.lane("a").unwrap().stats().published, 3);
    assert_eq!(Arc::strong_count(&refused), 2);
}

#[test]
fn m3_publish_to_refused_after_a_drop_panic_hands_its_item_back() {
    let sp = spent();
    let item = sp.big(3);
    let Spent { s, mut p, held, dropped, refused, .. } = sp;
    let attempt = catch_unwind(AssertUnwindSafe(|| p.try_publish_to(0, item)));
    let back = match attempt {
        Ok(Err(PublishError::Full(back))) => back,
        Ok(other) => panic!("expected Full with the item, got {other:?}"),
        Err(_) => panic!("the drop panic surfaced from a refused try_publish_to"),
    };
    assert_eq!((dropped.load(Ordering::SeqCst), Arc::strong_count(&refused)), (1, 2));
    held.ack().unwrap();
    let again = catch_unwind(AssertUnwindSafe(|| p.publish_to(0, back)));
    assert_eq!(payload(&again.expect_err("surfaces after the publish_to that goes")), "one");
    assert_eq!(s.lane("a").unwrap().stats().published, 3);
    assert_eq!(Arc::strong_count(&refused), 2);
}

#[test]
fn m3_a_run_partly_published_in_the_step_that_caught_a_drop_panic_surfaces_it_with_the_rest_kept() {
    // The budget lets one item as costly as the bomb go after the bomb is dropped: the step
    // publishes the run's first item (so the panic is resumed at once) and leaves the second.
    let Spent { s, mut p, held: _held, dropped, .. } = spent();
    let small = shared_envelopes(3);
    let mut run = vec![tracked(Some(3), &small), tracked(Some(4), &small)];
    let attempt = catch_unwind(AssertUnwindSafe(|| p.try_publish_run(&mut run)));
    assert_eq!(payload(&attempt.expect_err("a step that publishes resumes its drop panic")), "one");
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    assert_eq!(s.lane("a").unwrap().stats().published, 3, "the first item went");
    assert_eq!(run.len(), 1, "the second waits in the Vec");
    assert_eq!(Arc::strong_count(&small), 3, "each item alive once: one in the lane, one in the Vec");
    assert_eq!(run[0].position(), Some(Position(4)));
    // The rest is refused Full now (budget spent), with no panic left.
    assert!(matches!(p.try_publish_run(&mut run), Err(PublishError::Full(0))));
    assert_eq!(run.len(), 1);
}

#[test]
fn m3_a_blocking_run_refused_after_a_drop_panic_waits_then_surfaces_it_with_the_rest_in_its_vec() {
    let Spent { s, mut p, held, dropped, refused, .. } = spent();
    // Both of the run's items are each charged more than the bomb: the first step drops the bomb
    // and is refused, the publish waits, then publishes the first item alone (the budget holds
    // only one at a time once `held` is acked: the second is charged past it).
    let mut run = vec![tracked(Some(3), &refused), tracked(Some(4), &refused)];
    let acker = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        held.ack().unwrap();
    });
    let attempt = catch_unwind(AssertUnwindSafe(|| p.publish_run(&mut run)));
    acker.join().unwrap();
    assert_eq!(payload(&attempt.expect_err("the kept panic surfaces after the step that goes")), "one");
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    assert_eq!(s.lane("a").unwrap().stats().published, 3);
    assert_eq!(run.len(), 1, "the unpublished rest stays in the Vec");
    assert_eq!(Arc::strong_count(&refused), 3, "no item lost or doubled");
}

#[test]
fn m3_two_drop_panics_kept_by_two_refused_publishes_only_the_first_surfaces() {
    // Budget: bombs "one" (1) and "two" (2) and `kept` (3), exactly. "one" acked: a publish of
    // `huge` drops it (panic kept) and is refused; "two" acked: the next drops it (a second
    // panic) and is refused again (`huge` is charged past both bombs). Then `kept` is acked and
    // `huge` goes alone (an item over the budget goes once nothing is held, M4).
    let (one, two) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let kept = shared_envelopes(3);
    let huge_envs = envelopes(8, 4);
    let (b1, b2) = (bomb(1, "one", &one), bomb(2, "two", &two));
    let budget = b1.charge() + b2.charge() + tracked(Some(3), &kept).charge();
    let huge = tracked(Some(4), &huge_envs);
    assert!(huge.charge() > b1.charge() + b2.charge());
    let s = MemoryStream::builder().capacity(8).sink("a").memory_budget(budget).build().unwrap();
    let mut p = s.fanout().unwrap();
    let mut c = s.lane("a").unwrap().reattach();
    p.try_publish(b1).unwrap();
    p.try_publish(b2).unwrap();
    p.try_publish(tracked(Some(3), &kept)).unwrap();
    c.try_recv().unwrap().ack().unwrap();
    let d2 = c.try_recv().unwrap();
    let d3 = c.try_recv().unwrap();

    let first = catch_unwind(AssertUnwindSafe(|| p.try_publish(huge)));
    let huge = match first {
        Ok(Err(PublishError::Full(back))) => back,
        other => panic!("expected Full, got {:?}", other.map(|r| r.map_err(|_| ()))),
    };
    assert_eq!(one.load(Ordering::SeqCst), 1);
    d2.ack().unwrap();
    let second = catch_unwind(AssertUnwindSafe(|| p.try_publish(huge)));
    let huge = match second {
        Ok(Err(PublishError::Full(back))) => back,
        other => panic!("expected Full, got {:?}", other.map(|r| r.map_err(|_| ()))),
    };
    assert_eq!(two.load(Ordering::SeqCst), 1);
    assert_eq!(Arc::strong_count(&huge_envs), 2, "handed back twice, whole");
    d3.ack().unwrap();
    let third = catch_unwind(AssertUnwindSafe(|| p.try_publish(huge)));
    assert_eq!(payload(&third.expect_err("the first kept panic surfaces")), "one");
    assert_eq!(s.lane("a").unwrap().stats().published, 4);
    c.try_recv().unwrap().ack().unwrap();
    // The second panic ("two") was discarded when the second refused step caught it: neither
    // the next publish nor the drop brings it.
    let fourth = catch_unwind(AssertUnwindSafe(|| p.try_publish(tracked(Some(5), &kept))));
    assert!(matches!(fourth, Ok(Ok(()))), "the second panic does not come with the next publish");
    assert!(catch_unwind(AssertUnwindSafe(move || drop(p))).is_ok(), "nor with the drop");
    assert_eq!((one.load(Ordering::SeqCst), two.load(Ordering::SeqCst)), (1, 1), "each bomb dropped once");
}

#[test]
fn m3_a_fanout_refused_closed_by_a_drop_that_closes_the_stream_hands_its_item_back() {
    // The bomb's drop closes the stream (between the drop pass and the cursor's compare-and-swap)
    // and panics: the step is refused Closed, the item comes back, the panic is kept until the
    // fan-out's drop (no publish goes any more).
    let dropped = Arc::new(AtomicUsize::new(0));
    let s = MemoryStream::builder().capacity(4).sink("a").build().unwrap();
    let lane = s.lane("a").unwrap();
    let closer = lane.clone();
    let mut p = s.fanout().unwrap();
    let mut c = lane.reattach();
    p.try_publish(bomb_with(1, "closer", &dropped, Some(Box::new(move || closer.close())))).unwrap();
    c.try_recv().unwrap().ack().unwrap();
    let envs = shared_envelopes(2);
    let attempt = catch_unwind(AssertUnwindSafe(|| p.try_publish(tracked(Some(2), &envs))));
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "the step dropped the bomb");
    let back = match attempt {
        Ok(Err(PublishError::Closed(back))) => back,
        Ok(other) => panic!("expected Closed with the item, got {other:?}"),
        Err(_) => panic!("the drop panic surfaced from a publish refused Closed: its item is lost"),
    };
    assert_eq!(Arc::strong_count(&envs), 2, "handed back whole");
    assert!(p.is_closed());
    // The blocking form is refused Closed too, the item back again; the panic still kept.
    let back = match catch_unwind(AssertUnwindSafe(|| p.publish(back))) {
        Ok(Err(PublishError::Closed(back))) => back,
        other => panic!("expected Closed, got {:?}", other.map(|r| r.map_err(|_| ()))),
    };
    drop(back);
    assert_eq!(Arc::strong_count(&envs), 1);
    assert_eq!(lane.stats().published, 1, "nothing else published");
    let at_drop = catch_unwind(AssertUnwindSafe(move || drop(p)));
    assert_eq!(payload(&at_drop.expect_err("the kept panic surfaces at the fan-out's drop")), "closer");
    assert!(s.fanout().is_ok(), "the role was given back before the panic");
}

/// A standalone lane's item: counts its drops, may close its lane (`closes`) and then panic.
struct Closer {
    id: usize,
    drops: Arc<Vec<AtomicUsize>>,
    closes: Option<Lane<Closer>>,
    panics: bool,
}

impl Item for Closer {
    fn position(&self) -> Option<Position> {
        Some(Position(self.id as u64 + 1))
    }
}

impl Drop for Closer {
    fn drop(&mut self) {
        self.drops[self.id].fetch_add(1, Ordering::SeqCst);
        if let Some(lane) = self.closes.take() {
            lane.close();
        }
        if self.panics {
            panic_any(format!("closer {}", self.id));
        }
    }
}

fn closer(id: usize, drops: &Arc<Vec<AtomicUsize>>) -> Closer {
    Closer { id, drops: drops.clone(), closes: None, panics: false }
}

#[test]
fn m3_a_producer_refused_closed_after_a_drop_panic_hands_its_item_back_and_surfaces_it_at_its_drop() {
    let drops = common::counters(3);
    let lane: Lane<Closer> = Lane::standalone(SinkName::new("closers").unwrap(), 4).unwrap();
    let mut p: Producer<Closer> = lane.producer().unwrap();
    let mut c = lane.attach().unwrap();
    let first = Closer { id: 0, drops: drops.clone(), closes: Some(lane.clone()), panics: true };
    p.try_publish(first).unwrap();
    c.try_recv().unwrap().ack().unwrap();
    let attempt = catch_unwind(AssertUnwindSafe(|| p.try_publish(closer(1, &drops))));
    assert_eq!(drops[0].load(Ordering::SeqCst), 1, "the step dropped the acked item");
    let back = match attempt {
        Ok(Err(PublishError::Closed(back))) => back,
        Ok(Err(other)) => panic!("expected Closed, got {:?}", other.to_string()),
        Ok(Ok(())) => panic!("published on a closed lane"),
        Err(_) => panic!("the drop panic surfaced from a publish refused Closed: its item is lost"),
    };
    assert_eq!((back.id, drops[1].load(Ordering::SeqCst)), (1, 0), "handed back, not dropped");
    // Every other form is refused too, each item handed back.
    let mut run = vec![back, closer(2, &drops)];
    assert!(matches!(p.try_publish_run(&mut run), Err(PublishError::Closed(0))));
    assert!(matches!(p.publish_run(&mut run), Err(PublishError::Closed(0))));
    assert_eq!(run.len(), 2);
    drop(run);
    assert_eq!((drops[1].load(Ordering::SeqCst), drops[2].load(Ordering::SeqCst)), (1, 1));
    let at_drop = catch_unwind(AssertUnwindSafe(move || drop(p)));
    assert_eq!(payload(&at_drop.expect_err("the kept panic surfaces at the producer's drop")), "closer 0");
    let again = lane.producer().expect("the role was given back before the panic");
    assert!(catch_unwind(AssertUnwindSafe(move || drop(again))).is_ok(), "surfaced once");
    assert_eq!(drops[0].load(Ordering::SeqCst), 1, "dropped once");
}

#[test]
fn m3_a_kept_panic_is_discarded_when_the_fanout_is_dropped_while_unwinding() {
    let sp = spent();
    let item = sp.big(3);
    let Spent { s, mut p, c, held, dropped, refused } = sp;
    let back = match p.try_publish(item) {
        Err(PublishError::Full(back)) => back,
        other => panic!("expected Full, got {other:?}"),
    };
    drop(back);
    // The fan-out is dropped by the unwinding of another panic: the kept one is not resumed
    // then (that would abort), the outer panic is the one caught.
    let outer = catch_unwind(AssertUnwindSafe(move || {
        let _p = p;
        panic!("outer");
    }));
    assert_eq!(payload(&outer.expect_err("the outer panic")), "outer");
    assert!(s.fanout().is_ok(), "the role was given back");
    assert_eq!((dropped.load(Ordering::SeqCst), Arc::strong_count(&refused)), (1, 1));
    drop((held, c));
}

/// A panic payload whose own drop panics.
struct NastyPayload(Arc<AtomicUsize>);

impl Drop for NastyPayload {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
        panic!("the payload panics in Drop (on purpose)");
    }
}

/// A document owner that panics with a [`NastyPayload`].
struct NastyBomb(Arc<AtomicUsize>);

impl AsRef<[u8]> for NastyBomb {
    fn as_ref(&self) -> &[u8] {
        b"{}"
    }
}

impl Drop for NastyBomb {
    fn drop(&mut self) {
        panic_any(NastyPayload(self.0.clone()));
    }
}

#[test]
fn m3_a_kept_payload_that_panics_when_dropped_is_discarded_while_unwinding_without_an_abort() {
    let payload_drops = Arc::new(AtomicUsize::new(0));
    let kept = shared_envelopes(2);
    let nasty = LaneItem::Batch(Batch::new(
        Some(Position(1)),
        vec![Envelope {
            index: IndexName::new("docs").unwrap(),
            id: "1".into(),
            op: Op::Upsert,
            position: Some(Position(1)),
            document: Bytes::from_owner(NastyBomb(payload_drops.clone())),
            built_at_micros: None,
            relation: None,
            old_id: None,
            unchanged: Vec::new(),
        }]
        .into(),
    ));
    let budget = nasty.charge() + tracked(Some(2), &kept).charge();
    let s = MemoryStream::builder().capacity(8).sink("a").memory_budget(budget).build().unwrap();
    let mut p = s.fanout().unwrap();
    let mut c = s.lane("a").unwrap().reattach();
    p.try_publish(nasty).unwrap();
    p.try_publish(tracked(Some(2), &kept)).unwrap();
    c.try_recv().unwrap().ack().unwrap();
    let _held = c.try_recv().unwrap();
    let refused = envelopes(2, 3);
    assert!(matches!(p.try_publish(tracked(Some(3), &refused)), Err(PublishError::Full(_))));
    assert_eq!(payload_drops.load(Ordering::SeqCst), 0, "the payload is kept");
    let outer = catch_unwind(AssertUnwindSafe(move || {
        let _p = p;
        panic!("outer");
    }));
    assert_eq!(payload(&outer.expect_err("the outer panic")), "outer");
    assert_eq!(payload_drops.load(Ordering::SeqCst), 1, "the kept payload was discarded (its panic caught)");
}

#[test]
fn m3_a_kept_panic_at_the_drop_of_the_last_reference_drops_every_item_once_without_an_abort() {
    // The fan-out outlives the stream, its lanes and deliveries: its drop resumes the kept panic,
    // and the unwinding drops the cells (the last reference) with a second bomb still unacked in
    // them, whose panic is then caught and discarded.
    let TwoBombs { s, mut p, c, one, two, second: held } = two_bombs();
    let refused = envelopes(2, 3);
    assert!(matches!(p.try_publish(tracked(Some(3), &refused)), Err(PublishError::Full(_))));
    assert_eq!((one.load(Ordering::SeqCst), two.load(Ordering::SeqCst)), (1, 0));
    assert_eq!(Arc::strong_count(&refused), 1, "the refused item came back and was dropped");
    drop(held);
    drop(c);
    drop(s);
    assert_eq!(two.load(Ordering::SeqCst), 0, "the fan-out still holds the cells");
    let at_drop = catch_unwind(AssertUnwindSafe(move || drop(p)));
    assert_eq!(payload(&at_drop.expect_err("the kept panic surfaces")), "one");
    assert_eq!((one.load(Ordering::SeqCst), two.load(Ordering::SeqCst)), (1, 1), "each dropped once");
}

#[test]
fn m3_the_ends_stay_send_and_sync_with_a_panic_kept() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Fanout>();
    send_sync::<Producer<common::Counted>>();
    send_sync::<RequestSender>();
    send_sync::<RequestLane>();
    send_sync::<FanoutPublish<'static>>();
    send::<Publish<'static, Request>>();
    send::<Publish<'static, common::Counted>>();
    // And a fan-out whose publisher keeps a panic still moves to another thread and publishes.
    let Spent { s, mut p, held, dropped, refused, .. } = spent();
    let back = match p.try_publish(tracked(Some(3), &refused)) {
        Err(PublishError::Full(back)) => back,
        other => panic!("expected Full, got {other:?}"),
    };
    held.ack().unwrap();
    let there = std::thread::spawn(move || catch_unwind(AssertUnwindSafe(|| p.try_publish(back))).is_err());
    assert!(there.join().unwrap(), "the kept panic surfaces on the thread the fan-out went to");
    assert_eq!((dropped.load(Ordering::SeqCst), s.lane("a").unwrap().stats().published), (1, 3));
}

#[test]
fn m3_a_drop_panic_caught_by_the_publish_that_goes_is_discarded_when_an_earlier_one_was_kept() {
    // Budget: bombs "one" (1, acked) and "two" (2, delivered) exactly. A publish of `big` drops
    // "one" (kept) and is refused; "two" is acked; the next publish drops "two" (its own panic)
    // and goes: the kept "one" surfaces, and "two", caught by the very publish that went, never
    // does (before the change it surfaced with that publish).
    let TwoBombs { s, mut p, mut c, one, two, second: d2 } = two_bombs();
    let refused = envelopes(2, 3);
    let back = match p.try_publish(tracked(Some(3), &refused)) {
        Err(PublishError::Full(back)) => back,
        other => panic!("expected Full, got {other:?}"),
    };
    d2.ack().unwrap();
    let went = catch_unwind(AssertUnwindSafe(|| p.try_publish(back)));
    assert_eq!(payload(&went.expect_err("a panic surfaces after the publish that goes")), "one");
    assert_eq!(s.lane("a").unwrap().stats().published, 3);
    assert_eq!((one.load(Ordering::SeqCst), two.load(Ordering::SeqCst)), (1, 1));
    c.try_recv().unwrap().ack().unwrap();
    let next = catch_unwind(AssertUnwindSafe(|| p.try_publish(tracked(Some(4), &refused))));
    assert!(matches!(next, Ok(Ok(()))), "\"two\" is not kept for a later publish");
    assert!(catch_unwind(AssertUnwindSafe(move || drop(p))).is_ok(), "nor for the drop");
}

#[test]
fn m3_a_fanout_dropped_by_the_unwinding_of_its_kept_panic_gives_the_role_back() {
    // The kept panic surfaces from a publish inside a scope that owns the fan-out: the unwinding
    // drops the fan-out (while panicking: nothing resumed again) and the role is free after.
    let Spent { s, p, held, dropped, refused, .. } = spent();
    let outcome = catch_unwind(AssertUnwindSafe(move || {
        let mut p = p;
        let back = match p.try_publish(tracked(Some(3), &refused)) {
            Err(PublishError::Full(back)) => back,
            other => panic!("expected Full, got {other:?}"),
        };
        held.ack().unwrap();
        let _ = p.try_publish(back);
        unreachable!("the kept panic surfaces from the publish that goes");
    }));
    assert_eq!(payload(&outcome.expect_err("the kept panic")), "one");
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    let mut again = s.fanout().expect("the role was given back by the unwinding");
    assert_eq!(s.lane("a").unwrap().stats().published, 3);
    // The new fan-out does not inherit anything: it publishes quietly once room is made.
    let mut c = s.lane("a").unwrap().reattach();
    while let Ok(d) = c.try_recv() {
        d.ack().unwrap();
    }
    assert!(matches!(
        catch_unwind(AssertUnwindSafe(|| again.try_publish(tracked(Some(4), &shared_envelopes(4))))),
        Ok(Ok(()))
    ));
}
