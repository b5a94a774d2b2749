//! Loom model 7: close racing the last publish, and close waking waiters (L10).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use lanestream::{MemoryStream, Position, PublishError, TryPublishError};
use loom::thread;

use crate::support::{self, batch, check, Flag};

/// Model 7a: close racing the last publish.
///
/// The producer publishes item 1 and closes at once; the consumer receives in a blocking loop.
/// Checked: the consumer gets item 1 and only then `None` — a close it sees brings every item
/// published before it (`close`'s Release store of `closed`, acquired by the consumer before it
/// re-reads `tail`); publishing after close fails with `Closed`, item handed back.
///
/// Why the bound suffices: two threads; the race is the consumer's `tail` / `closed` / `tail`
/// reads against the producer's `tail` store and `closed` store, a window one preemption
/// enters. Bound 3 is cheap and also covers the consumer parking between the two.
#[test]
fn close_racing_the_last_publish() {
    support::model("close_racing_the_last_publish", 3, || {
        let stream = MemoryStream::builder().capacity(1).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let mut producer = lane.producer().unwrap();
        let mut consumer = lane.reattach();
        let p = thread::spawn(move || {
            producer.publish(batch(1)).unwrap();
            producer.close();
            assert!(matches!(producer.try_publish(batch(2)), Err(TryPublishError::Closed(_))));
        });
        let d = consumer.recv().unwrap().expect("item 1 is delivered before the end");
        check(&d, 1);
        d.ack().unwrap();
        assert!(consumer.recv().unwrap().is_none());
        p.join().unwrap();
        assert_eq!(lane.acked(), Some(Position(1)));
        assert!(lane.stats().closed);
    });
}

/// Model 7b: closing wakes every waiter: a blocked `recv` (thread), a pending `recv_async`, and
/// a producer blocked in `publish` on a full lane, each woken by a close, each returning the end
/// (`None`, or `Closed` with the item handed back).
///
/// A lane has one consumer and one producer, so the three waiters are three runs of the same
/// scenario inside one model (one `#[test]` each would add builds and nothing else). The
/// producer is closed through `Lane::close` (a supervisor's close), since `Producer::close`
/// cannot overlap a publish (which holds `&mut Producer`).
///
/// Why the bound suffices: two threads per run and one store-buffer race each (the `closed`
/// store and notification against the waiter's register -> re-check); bound 3 is cheap here.
#[test]
fn close_wakes_blocked_and_async_consumers() {
    support::model("close_wakes_blocked_and_async_consumers", 3, || {
        // Blocking waiter.
        let stream = MemoryStream::builder().capacity(1).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let producer = lane.producer().unwrap();
        let mut consumer = lane.reattach();
        let c = thread::spawn(move || assert!(consumer.recv().unwrap().is_none()));
        producer.close();
        c.join().unwrap();

        // Async waiter.
        let stream = MemoryStream::builder().capacity(1).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let producer = lane.producer().unwrap();
        let mut consumer = lane.reattach();
        let closer = thread::spawn(move || producer.close());
        let (flag, waker) = Flag::new();
        let mut cx = Context::from_waker(&waker);
        let mut fut = consumer.recv_async();
        loop {
            match Pin::new(&mut fut).poll(&mut cx) {
                Poll::Ready(r) => {
                    assert!(r.unwrap().is_none());
                    break;
                }
                Poll::Pending => flag.wait(),
            }
        }
        closer.join().unwrap();

        // Producer blocked on a full lane.
        let stream = MemoryStream::builder().capacity(1).request_capacity(1).sink("a").build().unwrap();
        let lane = stream.lane("a").unwrap();
        let mut producer = lane.producer().unwrap();
        producer.try_publish(batch(1)).unwrap();
        let p = thread::spawn(move || match producer.publish(batch(2)) {
            Err(PublishError::Closed(item)) => check(&item, 2),
            other => panic!("expected Closed with the item back, got {other:?}"),
        });
        lane.close();
        p.join().unwrap();
    });
}
