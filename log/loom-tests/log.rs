//! Loom models 11-12: the event log's subscriber waits (issue 10, semantics 5).
//!
//! The whole log runs under the model: its writer thread, its request queue, the reply slots and
//! the subscribers' signal (each waiting on the core's wait list, `lanestream::wait`) and the
//! close flag are loom's under `--cfg lanestream_loom` (`src/sync.rs` and the core's `sync`); the snapshot that
//! `arc-swap` publishes is stood in for by a loom mutex around the `Arc` (loom cannot see
//! `arc-swap`'s own atomics), so a publish is a Release and a load an Acquire, no stronger than
//! `arc-swap` gives. Every log is in memory; model 12b's fsync failure comes from a storage that
//! fails every sync (`EventLog::loom_failing_sync`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use lanestream_log::{
    AppendError, Event, EventLog, LogOptions, Query, SequencedEvent, Subscription, SubscriptionError,
    WriteHandle,
};
use loom::thread;

use crate::support::{self, Flag};

fn event(data: &'static [u8]) -> Event {
    Event::untagged("T", data).unwrap()
}

fn positions(batch: &[SequencedEvent]) -> Vec<u64> {
    batch.iter().map(|e| e.position.get()).collect()
}

/// Polls `sub.next_batch_async()` to completion on this loom thread, parking between polls.
/// Each poll gets a fresh waker (a flag that stays raised once woken): a wake-up left over from
/// an earlier publish (the writer's notify may run after the appender's reply) then costs one
/// extra poll instead of a spin, and every re-poll replaces the waker registered before.
fn next_async(sub: &mut Subscription) -> Result<Option<Vec<SequencedEvent>>, SubscriptionError> {
    let mut fut = sub.next_batch_async();
    loop {
        let (flag, waker) = Flag::new();
        let mut cx = Context::from_waker(&waker);
        match Pin::new(&mut fut).poll(&mut cx) {
            Poll::Ready(r) => return r,
            Poll::Pending => flag.wait(),
        }
    }
}

/// Polls `log.append_async(..)` to completion on this loom thread (an async append always goes
/// through the queue to the writer thread), parking between polls as [`next_async`] does.
fn append_async(log: &WriteHandle, data: &'static [u8]) -> u64 {
    let mut fut = log.append_async(vec![event(data)], None);
    loop {
        let (flag, waker) = Flag::new();
        let mut cx = Context::from_waker(&waker);
        match Pin::new(&mut fut).poll(&mut cx) {
            Poll::Ready(r) => return r.unwrap().first.get(),
            Poll::Pending => flag.wait(),
        }
    }
}

/// Model 11: a subscriber crossing from catch-up to the live tail while an append is published.
///
/// The log holds position 1; a subscription (main thread) takes it as its catch-up batch and
/// then waits in `next_batch` for position 2, which an appender thread appends meanwhile with a
/// blocking append (committed on the appender's own thread when it finds the writer idle, else
/// queued); then a second subscription catches up to `[1, 2]` and waits in `next_batch_async`
/// for position 3, which an appender thread appends with `append_async` (through the queue and
/// the writer thread). Checked: each wait gets the live
/// append — no lost wake-up whichever side of the
/// subscriber's check the writer's publish and notify land (the check runs after the
/// subscriber registered with the signal's wait list, the notify after the publish), no
/// duplicate, no gap — and `None` once the log is closed.
///
/// Fails when its protection is removed (`src/docs/memory_ordering.md`, rows 31, 32, 35):
/// checking only before registering (`Signal::wait` or `Signal::poll` without the check after
/// registering), or notifying before the snapshot is stored, each deadlock it.
///
/// Why the bound suffices: the race is the subscriber's register-check-sleep against the
/// writer's publish-then-notify; putting the publish between the check and the sleep takes one
/// preemption, a second covers the appender's queue push racing the writer's wait for work, and
/// a third the writer's notify for position 2 landing during the async wait. Bound 3: about
/// 26,000 executions, 9 s.
#[test]
fn log_subscriber_at_the_catch_up_live_boundary_while_an_append_is_published() {
    support::model("log_subscriber_at_the_catch_up_live_boundary_while_an_append_is_published", 3, || {
        let log = EventLog::in_memory(LogOptions::default()).unwrap();
        log.append(vec![event(b"1")], None).unwrap();
        let mut blocking = log.subscribe(Query::All, None);
        let mut pending = log.subscribe(Query::All, None);
        // Blocking: catch-up, then the live append racing the wait.
        assert_eq!(positions(&blocking.next_batch().unwrap().unwrap()), [1], "catch-up");
        let appender = {
            let log = log.clone();
            thread::spawn(move || log.append(vec![event(b"2")], None).unwrap().first.get())
        };
        assert_eq!(positions(&blocking.next_batch().unwrap().expect("live")), [2]);
        assert_eq!(appender.join().unwrap(), 2);
        // Async: the same, with a registered waker.
        assert_eq!(positions(&pending.try_next_batch().unwrap()), [1, 2], "catch-up");
        let appender = {
            let log = log.clone();
            thread::spawn(move || append_async(&log, b"3"))
        };
        assert_eq!(positions(&next_async(&mut pending).unwrap().expect("live")), [3]);
        assert_eq!(appender.join().unwrap(), 3);
        log.close();
        assert!(blocking.next_batch().unwrap().unwrap().len() == 1, "3, then the end");
        assert!(blocking.next_batch().unwrap().is_none());
        assert!(next_async(&mut pending).unwrap().is_none());
    });
}

/// Model 12a: closing the log wakes every waiting subscriber, blocking and async.
///
/// One subscriber thread blocks in `next_batch` and the main thread waits in
/// `next_batch_async`, both with nothing to read, while a third thread closes the log. Checked:
/// both end with `Ok(None)` (the writer's end guard sets `closed` and then notifies; a waiter
/// checks `closed` after registering).
///
/// Fails when its protection is removed (rows 31, 33, 35): without the end guard's notify, or
/// with either wait checking only before registering, a waiter sleeps for ever (deadlock).
///
/// Why the bound suffices: two waiters and the closer (plus the writer, which the close joins);
/// each waiter's window is its register-check-sleep, entered by one preemption. Bound 2 (about
/// 9,000 executions, 2 s).
#[test]
fn log_close_wakes_every_waiting_subscriber() {
    support::model("log_close_wakes_every_waiting_subscriber", 2, || {
        let log = EventLog::in_memory(LogOptions::default()).unwrap();
        let mut blocking = log.subscribe(Query::All, None);
        let mut pending = log.subscribe(Query::All, None);
        let waiter = thread::spawn(move || blocking.next_batch().unwrap().is_none());
        let closer = {
            let log = log.clone();
            thread::spawn(move || log.close())
        };
        assert!(next_async(&mut pending).unwrap().is_none(), "the async waiter sees the end");
        assert!(waiter.join().unwrap(), "the blocked waiter sees the end");
        closer.join().unwrap();
    });
}

/// Model 12b: a writer failure wakes every waiting subscriber, and nobody hangs on the dead
/// writer.
///
/// The log's every fsync fails. A subscriber thread blocks in `next_batch` while the main
/// thread appends; the append fails with `Io`, and the subscriber must end with
/// `SubscriptionError::Failed` **before** the log is closed (the main thread joins it first, so
/// only the failure's own notify can wake it). A later append is refused with `Failed`.
///
/// Fails when its protection is removed (row 34): without the failure path's notify the
/// subscriber sleeps until a close that never comes (deadlock).
///
/// Why the bound suffices: the race is the subscriber's register-check-sleep against the
/// writer's set-failure-then-notify; one preemption places the failure inside the window.
/// Bound 3 (about 270 executions).
#[test]
fn log_writer_failure_wakes_every_waiting_subscriber() {
    support::model("log_writer_failure_wakes_every_waiting_subscriber", 3, || {
        let log = EventLog::loom_failing_sync(LogOptions::default()).unwrap();
        let mut sub = log.subscribe(Query::All, None);
        let waiter = thread::spawn(move || match sub.next_batch() {
            Err(SubscriptionError::Failed(_)) => true,
            other => panic!("expected the failure, got {other:?}"),
        });
        assert!(matches!(log.append(vec![event(b"1")], None), Err(AppendError::Io(_))));
        assert!(waiter.join().unwrap(), "woken by the failure, before any close");
        assert!(matches!(log.append(vec![event(b"2")], None), Err(AppendError::Failed(_))));
        assert_eq!(log.head(), None, "nothing of the failed append is visible");
    });
}
