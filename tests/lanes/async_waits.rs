//! The async entry points (`recv_async`, `publish_async`, `RequestSender::publish_async`) on
//! tokio (current-thread and multi-thread) and futures-executor, and the wake-up hazards:
//! a future re-polled with another waker, a future dropped right after being woken, close and
//! re-attach waking async waiters.

use crate::common;
use lanestream::prelude::*;

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::Duration;

use common::{backfill, batch, pos, shared_envelopes, stream, tracked, CountingWaker};
use lanestream::{PublishError, RecvError, Request, Stream};
use tokio::time::timeout;

fn poll<F: Future + ?Sized>(f: Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(waker))
}

const LIMIT: Duration = Duration::from_secs(20);

async fn pipe_tokio(items: u64) {
    let s = stream(2, &["search"]);
    let lane = s.lane("search").unwrap();
    let mut c = lane.reattach();
    let mut p = s.fanout().unwrap();
    let consumer = tokio::spawn(async move {
        let mut got = Vec::new();
        while let Some(d) = c.recv_async().await.unwrap() {
            got.push(pos(&d));
            if got.len() % 5 == 0 && d.attempt() == 1 {
                got.pop();
                d.nack(); // redelivered at once
            } else {
                d.ack().unwrap();
            }
        }
        got
    });
    let producer = tokio::spawn(async move {
        for i in 1..=items {
            p.publish_async(batch(i)).await.unwrap();
        }
        p.close();
    });
    timeout(LIMIT, producer).await.expect("producer finished").unwrap();
    let got = timeout(LIMIT, consumer).await.expect("consumer finished").unwrap();
    assert_eq!(got, (1..=items).collect::<Vec<_>>());
    assert_eq!(s.watermark(), Some(lanestream::Position(items)));
}

#[tokio::test(flavor = "current_thread")]
async fn recv_async_and_publish_async_on_tokio_current_thread() {
    pipe_tokio(2_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recv_async_and_publish_async_on_tokio_multi_thread() {
    pipe_tokio(5_000).await;
}

#[test]
fn recv_async_and_publish_async_on_futures_executor_against_blocking_threads() {
    let s = stream(3, &["search"]);
    let lane = s.lane("search").unwrap();
    // Async consumer, blocking producer.
    let mut p = s.fanout().unwrap();
    let producer = thread::spawn(move || {
        for i in 1..=1_000 {
            p.publish(batch(i)).unwrap();
        }
        p
    });
    let mut c = lane.reattach();
    let got = common::within(20, "async consumer", move || {
        futures_executor::block_on(async move {
            let mut got = Vec::new();
            while got.len() < 1_000 {
                let d = c.recv_async().await.unwrap().unwrap();
                got.push(pos(&d));
                d.ack().unwrap();
            }
            (got, c)
        })
    });
    let (got, mut c) = got;
    assert_eq!(got, (1..=1_000).collect::<Vec<_>>());
    // Async producer, blocking consumer.
    let mut p = producer.join().unwrap();
    let consumer = thread::spawn(move || common::drain_closed(&mut c).len());
    common::within(20, "async producer", move || {
        futures_executor::block_on(async move {
            for i in 1_001..=2_000 {
                p.publish_async(batch(i)).await.unwrap();
            }
            p.close();
        })
    });
    assert_eq!(consumer.join().unwrap(), 1_000);
}

#[test]
fn a_recv_repolled_with_a_different_waker_wakes_the_latest_waker() {
    let s = stream(2, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (s.fanout().unwrap(), lane.reattach());
    let (a, wa) = CountingWaker::new();
    let (b, wb) = CountingWaker::new();
    let mut fut = pin!(c.recv_async());
    assert!(poll(fut.as_mut(), &wa).is_pending());
    assert!(poll(fut.as_mut(), &wb).is_pending());
    p.publish(batch(1)).unwrap();
    assert_eq!(b.wakes(), 1, "the waker of the latest poll is woken");
    assert_eq!(a.wakes(), 0, "the replaced waker is not kept");
    match poll(fut.as_mut(), &wb) {
        Poll::Ready(Ok(Some(d))) => assert_eq!(pos(&d), 1),
        other => panic!("woken receive not ready: {:?}", other.map(|r| r.map(|o| o.is_some()))),
    }
}

#[test]
fn a_publish_repolled_with_a_different_waker_wakes_the_latest_waker() {
    let s = stream(1, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (s.fanout().unwrap(), lane.reattach());
    p.publish(batch(1)).unwrap();
    let d1 = c.try_recv().unwrap();
    let (a, wa) = CountingWaker::new();
    let (b, wb) = CountingWaker::new();
    {
        let mut fut = pin!(p.publish_async(batch(2)));
        assert!(poll(fut.as_mut(), &wa).is_pending());
        assert!(poll(fut.as_mut(), &wb).is_pending());
        d1.nack();
        assert_eq!((a.wakes(), b.wakes()), (0, 0), "a nack makes no room");
        c.try_recv().unwrap().ack().unwrap();
        assert_eq!((a.wakes(), b.wakes()), (0, 1));
        assert!(matches!(poll(fut.as_mut(), &wb), Poll::Ready(Ok(()))));
    }
    assert_eq!(pos(&c.try_recv().unwrap()), 2);
}

#[test]
fn a_recv_dropped_right_after_being_woken_loses_nothing() {
    let s = stream(2, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (s.fanout().unwrap(), lane.reattach());
    for i in 1..=2 {
        let (w, waker) = CountingWaker::new();
        {
            let mut fut = pin!(c.recv_async());
            assert!(poll(fut.as_mut(), &waker).is_pending());
            p.publish(batch(i)).unwrap();
            assert_eq!(w.wakes(), 1);
        } // dropped woken, never polled again
        if i == 1 {
            let d = c.try_recv().expect("the item is there at once");
            assert_eq!(pos(&d), 1);
            d.ack().unwrap();
        } else {
            let mut fut = pin!(c.recv_async());
            let (_, other) = CountingWaker::new();
            match poll(fut.as_mut(), &other) {
                Poll::Ready(Ok(Some(d))) => assert_eq!(pos(&d), 2),
                _ => panic!("a new receive must complete on its first poll"),
            }
        }
    }
}

#[test]
fn a_publish_dropped_right_after_being_woken_drops_its_item_and_leaves_the_lane_usable() {
    let s = stream(1, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (s.fanout().unwrap(), lane.reattach());
    p.publish(batch(1)).unwrap();
    let env = shared_envelopes(2);
    let (w, waker) = CountingWaker::new();
    {
        let mut fut = pin!(p.publish_async(tracked(Some(2), &env)));
        assert!(poll(fut.as_mut(), &waker).is_pending());
        c.try_recv().unwrap().ack().unwrap();
        assert_eq!(w.wakes(), 1);
    }
    assert_eq!(Arc::strong_count(&env), 1, "the unpublished item was dropped with its future");
    assert_eq!(c.try_recv().unwrap_err(), lanestream::TryRecvError::Empty);
    p.try_publish(batch(3)).expect("room is there at once");
    assert_eq!(pos(&c.try_recv().unwrap()), 3);
}

#[test]
fn close_wakes_an_async_recv_which_then_returns_none() {
    let s = stream(2, &["search"]);
    let lane = s.lane("search").unwrap();
    let (mut p, mut c) = (s.fanout().unwrap(), lane.reattach());
    p.publish(batch(1)).unwrap();
    let d1 = c.try_recv().unwrap();
    let (w, waker) = CountingWaker::new();
    let mut fut = pin!(c.recv_async());
    assert!(poll(fut.as_mut(), &waker).is_pending());
    p.close();
    assert_eq!(w.wakes(), 1, "close wakes the async waiter");
    assert!(matches!(poll(fut.as_mut(), &waker), Poll::Ready(Ok(None))));
    drop(d1);
}

#[tokio::test(flavor = "current_thread")]
async fn close_ends_an_async_recv_waiting_in_another_task() {
    let s = stream(2, &["search"]);
    let lane = s.lane("search").unwrap();
    let p = s.fanout().unwrap();
    let mut c = lane.reattach();
    let waiter = tokio::spawn(async move { c.recv_async().await.map(|d| d.is_none()) });
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    p.close();
    assert_eq!(timeout(LIMIT, waiter).await.expect("woken by close").unwrap(), Ok(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reattach_wakes_an_async_recv_with_detached() {
    let s = stream(2, &["search"]);
    let lane = s.lane("search").unwrap();
    let mut c = lane.reattach();
    let waiter = tokio::spawn(async move { c.recv_async().await.map(|d| d.is_some()) });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let _c2 = lane.reattach();
    assert_eq!(timeout(LIMIT, waiter).await.expect("woken by re-attach").unwrap(), Err(RecvError::Detached));
}

#[test]
fn an_async_publish_on_a_closed_lane_hands_the_item_back() {
    let s = stream(1, &["search"]);
    let mut p = s.fanout().unwrap();
    p.close();
    match futures_executor::block_on(p.publish_async(batch(1))) {
        Err(PublishError::Closed(item)) => assert_eq!(item, batch(1)),
        other => panic!("expected Closed, got {other:?}"),
    }
}

#[test]
fn request_sender_publish_async_waits_for_room_and_is_woken_by_the_ack() {
    let s = lanestream::MemoryStream::builder().request_capacity(1).sink("search").build().unwrap();
    let sender = s.requests().sender();
    sender.try_publish(backfill("search", "a")).unwrap();
    let mut ingest = s.requests().reattach();
    let (w, waker) = CountingWaker::new();
    let mut fut = pin!(sender.publish_async(backfill("search", "b")));
    assert!(poll(fut.as_mut(), &waker).is_pending());
    let (_, other) = CountingWaker::new();
    let (w2, waker2) = CountingWaker::new();
    assert!(poll(fut.as_mut(), &other).is_pending());
    assert!(poll(fut.as_mut(), &waker2).is_pending());
    ingest.try_recv().unwrap().ack().unwrap();
    assert_eq!(w2.wakes(), 1, "the latest waker is woken");
    assert_eq!(w.wakes(), 0);
    assert!(matches!(poll(fut.as_mut(), &waker2), Poll::Ready(Ok(()))));
    assert_eq!(ingest.try_recv().unwrap().item(), &backfill("search", "b"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_async_request_senders_and_one_async_ingest_engine() {
    let s = lanestream::MemoryStream::builder().request_capacity(2).sink("search").build().unwrap();
    let senders: Vec<_> = (0..4)
        .map(|k| {
            let sender = s.requests().sender();
            tokio::spawn(async move {
                for i in 0..50 {
                    sender.publish_async(backfill("search", &format!("k{k}_{i}"))).await.unwrap();
                }
            })
        })
        .collect();
    let mut ingest = s.requests().reattach();
    let consumer = tokio::spawn(async move {
        let mut seen = std::collections::HashSet::new();
        while seen.len() < 200 {
            let d = ingest.recv_async().await.unwrap().unwrap();
            let Request::Backfill { indexes, .. } = d.item() else { unreachable!() };
            assert!(seen.insert(indexes[0].clone()), "duplicate");
            d.ack().unwrap();
        }
        seen.len()
    });
    for t in senders {
        timeout(LIMIT, t).await.expect("sender finished").unwrap();
    }
    assert_eq!(timeout(LIMIT, consumer).await.expect("consumer finished").unwrap(), 200);
    assert!(s.is_idle());
}
