//! Subscriptions (issue 10, semantics 5) and shutdown (6): hand-off between catch-up and live
//! tail under concurrent writers, close waking every waiter, a batch committed just before close.

use crate::log_support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::Duration;

use lanestream_log::{
    EventLog, LogOptions, NextTimeoutError, Query, QueryItem, SequencedEvent, Subscription, TryNextError,
};
use log_support::{LIMIT, all, ev, ev_data, pos, positions};

/// Drains a subscription until the log closes.
fn drain(mut sub: Subscription) -> Vec<SequencedEvent> {
    let mut got = Vec::new();
    while let Some(batch) = sub.next_batch().unwrap() {
        assert!(!batch.is_empty());
        got.extend(batch);
    }
    got
}

#[test]
fn subscription_hand_off_with_concurrent_writers_exactly_once_ascending_no_gap() {
    let log = EventLog::in_memory(LogOptions::default().subscription_batch(7)).unwrap();
    // Some history first, so subscribers start with a catch-up.
    for i in 0..100 {
        log.append(vec![ev("Old", &[&format!("w:{}", i % 4)])], None).unwrap();
    }
    let selective = Query::item(QueryItem::new(["New", "Old"], ["w:1"]));
    let writers = 4;
    let barrier = Arc::new(Barrier::new(writers + 3));
    let subscribers: Vec<_> =
        [(Query::All, None), (selective.clone(), None), (Query::types(["New"]), Some(pos(50)))]
            .into_iter()
            .map(|(q, after)| {
                let (r, barrier) = (log.reader(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait(); // subscribe while the writers start
                    let sub = r.subscribe(q.clone(), after).batch_limit(5);
                    (q, after, drain(sub))
                })
            })
            .collect();
    let writer_threads: Vec<_> = (0..writers)
        .map(|w| {
            let (log, barrier) = (log.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                for i in 0..300 {
                    let n = i % 3 + 1;
                    let events = (0..n)
                        .map(|k| ev_data("New", &[&format!("w:{w}")], format!("{w}:{i}:{k}")))
                        .collect();
                    log.append(events, None).unwrap();
                }
            })
        })
        .collect();
    writer_threads.into_iter().for_each(|t| t.join().unwrap());
    log.close();
    let everything = all(&log.reader());
    for s in subscribers {
        let (q, after, got) = s.join().unwrap();
        let after = after.map_or(0, |p| p.get());
        let want: Vec<u64> = everything
            .iter()
            .filter(|e| e.position.get() > after && q.matches(&e.event))
            .map(|e| e.position.get())
            .collect();
        assert_eq!(
            positions(&got),
            want,
            "{q:?} after {after}: exactly the matching positions, ascending, once"
        );
        let distinct: HashSet<u64> = positions(&got).into_iter().collect();
        assert_eq!(distinct.len(), got.len());
        for e in &got {
            assert_eq!(e, &everything[e.position.get() as usize - 1]);
        }
    }
}

#[test]
fn batch_committed_just_before_close_is_delivered_then_none() {
    for _ in 0..50 {
        let log = EventLog::in_memory(LogOptions::default()).unwrap();
        let sub = log.subscribe(Query::All, None);
        let t = thread::spawn(move || drain(sub));
        log.append(vec![ev("Last", &[]), ev("Last", &[])], None).unwrap();
        log.close();
        assert_eq!(positions(&t.join().unwrap()), [1, 2]);
    }
}

#[derive(Default)]
struct Counting(AtomicUsize);

impl Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn close_wakes_subscribers_blocking_and_async() {
    let log = EventLog::in_memory(LogOptions::default()).unwrap();
    let (tx, rx) = mpsc::channel();
    let blocking: Vec<_> = (0..3)
        .map(|_| {
            let (mut sub, tx) = (log.subscribe(Query::types(["Never"]), None), tx.clone());
            thread::spawn(move || {
                let r = sub.next_batch();
                tx.send(()).unwrap();
                r
            })
        })
        .collect();
    let mut asynch = log.subscribe(Query::All, None);
    let counting = Arc::new(Counting::default());
    let waker = Waker::from(counting.clone());
    let mut fut = asynch.next_batch_async();
    assert!(Pin::new(&mut fut).poll(&mut Context::from_waker(&waker)).is_pending());
    // A tokio task waiting too.
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let mut tokio_sub = log.subscribe(Query::All, None);
    let (ttx, trx) = mpsc::channel();
    let tokio_thread = thread::spawn(move || {
        rt.block_on(async move {
            let r = tokio::time::timeout(LIMIT, tokio_sub.next_batch_async()).await;
            ttx.send(()).unwrap();
            r.expect("woken by close").unwrap()
        })
    });
    thread::sleep(Duration::from_millis(50));
    assert!(rx.try_recv().is_err() && trx.try_recv().is_err(), "everyone waits before the close");
    log.append(vec![ev("Other", &[])], None).unwrap(); // wakes all; the selective ones sleep again
    thread::sleep(Duration::from_millis(20));
    log.close();
    for t in blocking {
        assert!(t.join().unwrap().unwrap().is_none());
    }
    assert!(counting.0.load(Ordering::SeqCst) > 0, "the async waiter was woken");
    let Poll::Ready(r) = Pin::new(&mut fut).poll(&mut Context::from_waker(&waker)) else {
        panic!("ready after close")
    };
    assert_eq!(positions(&r.unwrap().unwrap()), [1]);
    drop(fut);
    assert!(asynch.next_batch().unwrap().is_none());
    assert_eq!(tokio_thread.join().unwrap().map(|b| positions(&b)), Some(vec![1]));
}

use std::future::Future;
use std::pin::Pin;

#[test]
fn dropping_the_last_write_handle_ends_subscriptions() {
    let log = EventLog::in_memory(LogOptions::default()).unwrap();
    let mut sub = log.subscribe(Query::All, None);
    let reader = log.reader();
    log.append(vec![ev("A", &[])], None).unwrap();
    drop(log);
    assert!(reader.is_closed());
    assert_eq!(positions(&sub.next_batch().unwrap().unwrap()), [1]);
    assert!(sub.next_batch().unwrap().is_none());
    assert_eq!(reader.read(&Query::All, None, 10).unwrap().len(), 1, "reads work after the close");
}

#[test]
fn try_next_batch_and_timeout_forms() {
    let log = EventLog::in_memory(LogOptions::default()).unwrap();
    let mut sub = log.subscribe(Query::tags(["k"]), None);
    assert!(matches!(sub.try_next_batch(), Err(TryNextError::Empty)));
    assert!(matches!(sub.next_batch_timeout(Duration::from_millis(20)), Err(NextTimeoutError::Timeout)));
    log.append(vec![ev("A", &[])], None).unwrap();
    assert!(matches!(sub.try_next_batch(), Err(TryNextError::Empty)));
    assert_eq!(sub.position(), Some(pos(1)), "the cursor moves over what cannot match");
    log.append(vec![ev("A", &["k"])], None).unwrap();
    assert_eq!(positions(&sub.next_batch_timeout(LIMIT).unwrap().unwrap()), [2]);
    let l = log.clone();
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(30));
        l.append(vec![ev("B", &["k"])], None).unwrap();
    });
    assert_eq!(positions(&sub.next_batch_timeout(LIMIT).unwrap().unwrap()), [3]);
    t.join().unwrap();
    log.close();
    assert!(matches!(sub.try_next_batch(), Err(TryNextError::Closed)));
    assert!(sub.next_batch_timeout(LIMIT).unwrap().is_none());
}
