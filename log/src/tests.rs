//! Unit tests of the log that need its insides: a storage that fails or stalls on command, to
//! pin what a failed fsync, a short write, a full queue and a close do, and which appends share
//! a group commit.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::disk::storage::Storage;
use super::queue::AppendResult;
use super::*;

/// A fresh, empty directory, removed with everything in it when the value drops.
fn temp_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("lanestream-log-unit-{name}-")).tempdir().unwrap()
}

fn ev(ty: &str, tags: &[&str]) -> Event {
    Event::new(ty, tags.iter().copied(), Bytes::from(format!("{ty}{tags:?}"))).unwrap()
}

fn pos(n: u64) -> LogPosition {
    LogPosition::new(n).unwrap()
}

/// What the faulty storage does, set by the test while the log runs.
#[derive(Default)]
struct Plan {
    /// Syncs wait while this is set.
    hold_syncs: bool,
    /// How many syncs have started.
    syncs_started: usize,
    /// The sync with this (0-based) number fails.
    fail_sync: Option<usize>,
    /// The next write writes this many bytes, then the following write fails.
    short_write: Option<usize>,
    short_written: bool,
    /// The next sync panics (a bug in the writer's path, as far as the log can tell).
    panic_sync: bool,
    /// The thread each sync ran on, in order.
    sync_threads: Vec<thread::ThreadId>,
}

#[derive(Default)]
struct Control {
    plan: Mutex<Plan>,
    changed: Condvar,
}

impl Control {
    fn set(&self, f: impl FnOnce(&mut Plan)) {
        f(&mut self.plan.lock().unwrap());
        self.changed.notify_all();
    }

    /// Waits until `n` syncs have started (the writer is inside its `n`-th group commit).
    fn await_syncs(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut p = self.plan.lock().unwrap();
        while p.syncs_started < n {
            assert!(Instant::now() < deadline, "the writer never reached sync {n}");
            p = self.changed.wait_timeout(p, Duration::from_millis(50)).unwrap().0;
        }
    }
}

struct Faulty {
    inner: Box<dyn Storage>,
    control: Arc<Control>,
}

impl fmt::Debug for Faulty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Faulty").finish_non_exhaustive()
    }
}

impl Storage for Faulty {
    fn create_segment(&mut self, first: u64, header: &[u8]) -> io::Result<()> {
        self.inner.create_segment(first, header)
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let mut p = self.control.plan.lock().unwrap();
        if p.short_written {
            p.short_written = false;
            return Err(io::Error::other("injected: disk full after a short write"));
        }
        if let Some(n) = p.short_write.take() {
            p.short_written = true;
            return self.inner.write(&bytes[..n.min(bytes.len())]);
        }
        drop(p);
        self.inner.write(bytes)
    }

    fn sync(&mut self) -> io::Result<()> {
        let number = {
            let mut p = self.control.plan.lock().unwrap();
            let n = p.syncs_started;
            p.syncs_started += 1;
            p.sync_threads.push(thread::current().id());
            self.control.changed.notify_all();
            while p.hold_syncs {
                p = self.control.changed.wait(p).unwrap();
            }
            n
        };
        if std::mem::take(&mut self.control.plan.lock().unwrap().panic_sync) {
            panic!("injected: the storage panicked");
        }
        if self.control.plan.lock().unwrap().fail_sync == Some(number) {
            return Err(io::Error::other("injected: fsync failed"));
        }
        self.inner.sync()
    }
}

fn open_faulty(dir: &std::path::Path, options: LogOptions) -> (WriteHandle, Arc<Control>) {
    let control = Arc::new(Control::default());
    let c = control.clone();
    let log = EventLog::open_with(dir, options, move |inner| Box::new(Faulty { inner, control: c })).unwrap();
    (log, control)
}

/// Appends one event of type `ty` from a new thread through the writer thread: async appends
/// always queue, while a blocking append to an idle writer commits on its own thread. With
/// `hold_syncs` set, the writer thread then stays inside that group commit, and what is appended
/// meanwhile queues behind it (and shares the next group commit).
fn via_writer_thread(log: &WriteHandle, ty: &'static str) -> thread::JoinHandle<AppendResult> {
    let log = log.clone();
    thread::spawn(move || futures_executor::block_on(log.append_async(vec![ev(ty, &[])], None)))
}

/// A waker that counts its wake-ups.
#[derive(Default)]
struct Counting(AtomicUsize);

impl Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn poll_once<F: std::future::Future + Unpin>(f: &mut F, waker: &Waker) -> Poll<F::Output> {
    std::pin::Pin::new(f).poll(&mut Context::from_waker(waker))
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn staged_after_equal_head_conflicts_with_a_match_earlier_in_the_same_drain() {
    let dir = temp_dir("staged");
    let (log, control) = open_faulty(dir.path(), LogOptions::default());
    log.append(vec![ev("Seed", &[])], None).unwrap(); // head 1
    control.set(|p| p.hold_syncs = true);
    let blocker = via_writer_thread(&log, "Blocker");
    control.await_syncs(2); // the writer is stuck in the blocker's group commit (head 2 staged)
    // Queued behind it, in this order, so they share the next group commit:
    let waker = Waker::from(Arc::new(Counting::default()));
    let mut winner = log.append_async(vec![ev("Reserved", &["seat:1"])], None);
    assert!(poll_once(&mut winner, &waker).is_pending()); // queued
    let guard = AppendCondition::new(Query::tags(["seat:1"]), Some(pos(2)));
    let mut loser = log.append_async(vec![ev("Reserved", &["seat:1"])], Some(guard));
    assert!(poll_once(&mut loser, &waker).is_pending());
    control.set(|p| p.hold_syncs = false);
    assert_eq!(blocker.join().unwrap().unwrap().first, pos(2));
    let winner = futures_executor::block_on(winner).unwrap();
    assert_eq!(winner.first, pos(3));
    let err = futures_executor::block_on(loser).unwrap_err();
    assert!(matches!(err, AppendError::Conflict { at } if at == pos(3)), "{err:?}");
    assert_eq!(log.head(), Some(pos(3)));
    log.close();
}

#[test]
fn loser_in_the_same_drain_gets_the_winners_position() {
    let dir = temp_dir("same-drain");
    let (log, control) = open_faulty(dir.path(), LogOptions::default());
    control.set(|p| p.hold_syncs = true);
    let blocker = via_writer_thread(&log, "Blocker");
    control.await_syncs(1);
    let waker = Waker::from(Arc::new(Counting::default()));
    let guard = AppendCondition::new(Query::tags(["user:ann"]), None);
    let mut futures: Vec<_> = (0..5)
        .map(|_| {
            let mut f = log.append_async(vec![ev("Registered", &["user:ann"])], Some(guard.clone()));
            assert!(poll_once(&mut f, &waker).is_pending());
            f
        })
        .collect();
    control.set(|p| p.hold_syncs = false);
    blocker.join().unwrap().unwrap();
    let results: Vec<_> = futures.drain(..).map(futures_executor::block_on).collect();
    let first = results[0].as_ref().unwrap().first;
    assert_eq!(first, pos(2)); // the blocker took 1
    for r in &results[1..] {
        assert!(matches!(r, Err(AppendError::Conflict { at }) if *at == first), "{r:?}");
    }
    log.close();
}

#[test]
fn failed_fsync_fails_every_request_of_the_drain_and_refuses_further_writes() {
    let dir = temp_dir("fsync");
    let (log, control) = open_faulty(dir.path(), LogOptions::default());
    let acked = log.append(vec![ev("Before", &["k"])], None).unwrap();
    control.set(|p| {
        p.hold_syncs = true;
        p.fail_sync = Some(2);
    });
    let blocker = via_writer_thread(&log, "Blocker");
    control.await_syncs(2);
    // Three requests of one group commit: two plain, one whose condition fails.
    let waker = Waker::from(Arc::new(Counting::default()));
    let guard = AppendCondition::new(Query::tags(["k"]), None);
    let mut doomed = vec![
        log.append_async(vec![ev("A", &[])], None),
        log.append_async(vec![ev("B", &["k"])], Some(guard)),
        log.append_async(vec![ev("C", &[]), ev("C", &[])], None),
    ];
    for f in &mut doomed {
        assert!(poll_once(f, &waker).is_pending());
    }
    let mut sub = log.subscribe(Query::All, Some(acked.last));
    control.set(|p| p.hold_syncs = false);
    assert_eq!(blocker.join().unwrap().unwrap().first, pos(2));
    for f in doomed {
        let r = futures_executor::block_on(f);
        assert!(matches!(r, Err(AppendError::Io(_))), "every request of the failed drain fails: {r:?}");
    }
    // Nothing of the failed drain was published; the log refuses writes, clearly, without trying.
    assert_eq!(log.head(), Some(pos(2)));
    let syncs = control.plan.lock().unwrap().syncs_started;
    let later = log.append(vec![ev("Later", &[])], None).unwrap_err();
    assert!(matches!(later, AppendError::Failed(_)), "{later:?}");
    assert!(later.to_string().contains("injected: fsync failed"), "{later}");
    assert_eq!(control.plan.lock().unwrap().syncs_started, syncs, "no fsync retry");
    assert!(log.reader().failure().is_some());
    // The subscriber gets what was published, then the failure.
    assert_eq!(sub.next_batch().unwrap().unwrap().len(), 1);
    assert!(matches!(sub.next_batch(), Err(SubscriptionError::Failed(_))));
    log.close();
    drop(log);
    // After reopening: the acknowledged appends are there; the failed ones whole or not at all.
    let log = EventLog::open(dir.path(), LogOptions::default()).unwrap();
    let all = log.read(&Query::All, None, usize::MAX).unwrap().into_events();
    assert_eq!(all[0].event, ev("Before", &["k"]));
    assert_eq!(all[1].event, ev("Blocker", &[]));
    let tail: Vec<_> = all[2..].iter().map(|s| s.event.event_type().to_owned()).collect();
    assert!(tail.is_empty() || tail == ["A", "C", "C"], "a failed drain is whole or absent: {tail:?}");
    log.close();
}

#[test]
fn short_write_then_failure_leaves_a_torn_tail_that_recovery_truncates() {
    let dir = temp_dir("short");
    let (log, control) = open_faulty(dir.path(), LogOptions::default());
    let ok = log.append(vec![ev("Kept", &["a"])], None).unwrap();
    control.set(|p| p.short_write = Some(11));
    let r = log.append(vec![ev("Torn", &["a"]), ev("Torn", &["b"])], None);
    assert!(matches!(r, Err(AppendError::Io(_))), "{r:?}");
    assert!(matches!(log.append(vec![ev("X", &[])], None), Err(AppendError::Failed(_))));
    drop(log);
    let seg = dir.path().join(format!("{:020}.seg", 1));
    let len_before = std::fs::metadata(&seg).unwrap().len();
    let log = EventLog::open(dir.path(), LogOptions::default()).unwrap();
    assert!(std::fs::metadata(&seg).unwrap().len() < len_before, "the torn record was truncated");
    let all = log.read(&Query::All, None, usize::MAX).unwrap().into_events();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].position, ok.first);
    assert_eq!(log.append(vec![ev("Next", &[])], None).unwrap().first, pos(2));
    log.close();
}

#[test]
fn writer_failure_wakes_subscribers_blocking_and_async() {
    let dir = temp_dir("fail-wakes");
    let (log, control) = open_faulty(dir.path(), LogOptions::default());
    let mut blocking = log.subscribe(Query::All, None);
    let (tx, rx) = mpsc::channel();
    let t = thread::spawn(move || {
        let r = blocking.next_batch();
        tx.send(()).unwrap();
        r
    });
    let mut asynch = log.subscribe(Query::All, None);
    let counting = Arc::new(Counting::default());
    let waker = Waker::from(counting.clone());
    let mut fut = asynch.next_batch_async();
    assert!(poll_once(&mut fut, &waker).is_pending());
    thread::sleep(Duration::from_millis(50));
    assert!(rx.try_recv().is_err(), "the blocking subscriber waits");
    control.set(|p| p.fail_sync = Some(0));
    assert!(log.append(vec![ev("A", &[])], None).is_err());
    assert!(rx.recv_timeout(Duration::from_secs(20)).is_ok(), "the blocking subscriber was woken");
    assert!(matches!(t.join().unwrap(), Err(SubscriptionError::Failed(_))));
    wait_until("the async subscriber is woken", || counting.0.load(Ordering::SeqCst) > 0);
    assert!(matches!(poll_once(&mut fut, &waker), Poll::Ready(Err(SubscriptionError::Failed(_)))));
    drop(fut);
    log.close();
}

#[test]
fn full_queue_blocks_append_and_parks_append_async_without_spinning() {
    let dir = temp_dir("backpressure");
    let (log, control) =
        open_faulty(dir.path(), LogOptions::default().queue_capacity(2).max_drain_requests(1));
    control.set(|p| p.hold_syncs = true);
    let first = via_writer_thread(&log, "First");
    control.await_syncs(1); // the writer holds request 1; the queue (capacity 2) is empty
    let waker_count = Arc::new(Counting::default());
    let waker = Waker::from(waker_count.clone());
    let mut queued: Vec<_> = (0..2)
        .map(|i| {
            let mut f = log.append_async(vec![ev("Queued", &[&format!("n:{i}")])], None);
            assert!(poll_once(&mut f, &waker).is_pending());
            f
        })
        .collect();
    // The queue is full: an async append parks (registers its waker, polls do not spin) ...
    let mut parked = log.append_async(vec![ev("Parked", &[])], None);
    assert!(poll_once(&mut parked, &waker).is_pending());
    thread::sleep(Duration::from_millis(30));
    assert_eq!(waker_count.0.load(Ordering::SeqCst), 0, "no wake-up while the queue stays full");
    // ... and a blocking append blocks.
    let (tx, rx) = mpsc::channel();
    let blocked = {
        let log = log.clone();
        thread::spawn(move || {
            let r = log.append(vec![ev("Blocked", &[])], None);
            tx.send(()).unwrap();
            r
        })
    };
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err(), "append blocks while the queue is full");
    control.set(|p| p.hold_syncs = false);
    assert_eq!(first.join().unwrap().unwrap().first, pos(1));
    wait_until("the parked append is woken", || waker_count.0.load(Ordering::SeqCst) > 0);
    let mut results: Vec<_> = queued.drain(..).map(futures_executor::block_on).map(Result::unwrap).collect();
    results.push(futures_executor::block_on(parked).unwrap());
    results.push(blocked.join().unwrap().unwrap());
    let mut firsts: Vec<u64> = results.iter().map(|r| r.first.get()).collect();
    firsts.sort_unstable();
    assert_eq!(firsts, [2, 3, 4, 5]);
    log.close();
}

#[test]
fn requests_queued_before_close_are_served_later_ones_get_shutdown() {
    let dir = temp_dir("close-queue");
    let (log, control) = open_faulty(dir.path(), LogOptions::default().max_drain_requests(1));
    control.set(|p| p.hold_syncs = true);
    let first = via_writer_thread(&log, "First");
    control.await_syncs(1);
    let waker = Waker::from(Arc::new(Counting::default()));
    let mut queued: Vec<_> = (0..3)
        .map(|_| {
            let mut f = log.append_async(vec![ev("Queued", &[])], None);
            assert!(poll_once(&mut f, &waker).is_pending());
            f
        })
        .collect();
    let closer = {
        let log = log.clone();
        thread::spawn(move || log.close())
    };
    wait_until("close has closed the queue", || log.queue_closed());
    assert!(matches!(log.append(vec![ev("Late", &[])], None), Err(AppendError::Shutdown)));
    let mut late = log.append_async(vec![ev("LateAsync", &[])], None);
    assert!(matches!(poll_once(&mut late, &waker), Poll::Ready(Err(AppendError::Shutdown))));
    control.set(|p| p.hold_syncs = false);
    closer.join().unwrap();
    assert_eq!(first.join().unwrap().unwrap().first, pos(1));
    let served: Vec<u64> =
        queued.drain(..).map(|f| futures_executor::block_on(f).unwrap().first.get()).collect();
    assert_eq!(served, [2, 3, 4]);
    assert!(log.is_closed());
    assert_eq!(log.head(), Some(pos(4)));
}

#[test]
fn a_panicking_writer_answers_everyone_wakes_subscribers_and_refuses_writes() {
    let dir = temp_dir("panic");
    let (log, control) = open_faulty(dir.path(), LogOptions::default());
    log.append(vec![ev("Before", &[])], None).unwrap();
    let mut sub = log.subscribe(Query::All, None);
    assert_eq!(sub.next_batch().unwrap().unwrap().len(), 1);
    let waiting = thread::spawn(move || sub.next_batch());
    thread::sleep(Duration::from_millis(20));
    control.set(|p| p.panic_sync = true);
    let r = log.append(vec![ev("Boom", &[])], None);
    assert!(matches!(r, Err(AppendError::Io(_))), "the append in flight is answered, outcome unknown: {r:?}");
    let woken = waiting.join().unwrap();
    assert!(
        matches!(&woken, Err(SubscriptionError::Failed(e)) if e.to_string().contains("panicked")),
        "{woken:?}"
    );
    assert!(log.is_closed());
    assert!(matches!(log.append(vec![ev("After", &[])], None), Err(AppendError::Failed(_))));
    assert_eq!(log.head(), Some(pos(1)), "nothing of the panicked round was published");
    log.close();
}

#[test]
fn a_log_source_publishes_everything_before_a_writer_failure_then_run_reports_it() {
    use lanestream::pipeline::{Pipeline, PipelineError};
    use lanestream::{LaneItem, MemoryStream, Position, Stream};

    let dir = temp_dir("source-fails");
    let (log, control) = open_faulty(dir.path(), LogOptions::default());
    log.append(vec![ev("A", &[]), ev("A", &[])], None).unwrap();
    log.append(vec![ev("A", &[])], None).unwrap();
    let stream = MemoryStream::builder().capacity(8).sinks(["search"]).build().unwrap();
    let mut sink = stream.attach("search").unwrap();
    let mut source = LogSource::builder(log.reader()).build(&stream).unwrap();
    let pipeline = Pipeline::new(stream.clone());
    let runner = thread::spawn(move || pipeline.run(&mut source));
    control.set(|p| p.fail_sync = Some(2));
    assert!(matches!(log.append(vec![ev("A", &[])], None), Err(AppendError::Io(_))));
    // The run ends with the failure (it does not wait for a close), after both appends.
    let err = runner.join().unwrap().unwrap_err();
    let PipelineError::Source(err) = err else { panic!("{err:?}") };
    assert!(matches!(err.downcast_ref::<SourceError>(), Some(SourceError::LogFailed(_))), "{err:?}");
    let mut got = Vec::new();
    while let Ok(d) = sink.try_recv() {
        if let LaneItem::Batch(b) = d.item() {
            got.push((b.position, b.envelopes.len()));
        }
        d.ack().unwrap();
    }
    assert_eq!(got, [(Some(Position(2)), 2), (Some(Position(3)), 1)]);
    log.close();
}

#[test]
fn a_blocking_append_to_an_idle_writer_commits_on_its_own_thread() {
    let dir = temp_dir("inline");
    let (log, control) = open_faulty(dir.path(), LogOptions::default());
    let me = thread::current().id();
    assert_eq!(log.append(vec![ev("A", &[])], None).unwrap().first, pos(1));
    let other = {
        let log = log.clone();
        thread::spawn(move || (thread::current().id(), log.append(vec![ev("B", &[])], None)))
    };
    let (them, r) = other.join().unwrap();
    assert_eq!(r.unwrap().first, pos(2));
    // An async append always goes to the writer thread.
    futures_executor::block_on(log.append_async(vec![ev("C", &[])], None)).unwrap();
    let threads = control.plan.lock().unwrap().sync_threads.clone();
    assert_eq!(threads[..2], [me, them], "each blocking append fsynced on its own thread");
    assert!(threads[2] != me && threads[2] != them, "the async append was committed by the writer thread");
    assert_eq!(log.read(&Query::All, None, usize::MAX).unwrap().events().len(), 3);
    log.close();
}

#[test]
fn a_blocking_append_never_overtakes_what_is_queued_or_being_committed() {
    let dir = temp_dir("no-overtake");
    let (log, control) = open_faulty(dir.path(), LogOptions::default());
    control.set(|p| p.hold_syncs = true);
    let blocker = via_writer_thread(&log, "Blocker");
    control.await_syncs(1); // the writer thread is committing position 1
    let waker = Waker::from(Arc::new(Counting::default()));
    let mut queued = log.append_async(vec![ev("Queued", &[])], None);
    assert!(poll_once(&mut queued, &waker).is_pending());
    // The writer is busy and a request waits: this append queues behind it, it does not commit
    // on its own thread.
    let blocking = {
        let log = log.clone();
        thread::spawn(move || log.append(vec![ev("Blocking", &[])], None))
    };
    thread::sleep(Duration::from_millis(30));
    assert_eq!(control.plan.lock().unwrap().syncs_started, 1, "nothing else was committed meanwhile");
    control.set(|p| p.hold_syncs = false);
    assert_eq!(blocker.join().unwrap().unwrap().first, pos(1));
    assert_eq!(futures_executor::block_on(queued).unwrap().first, pos(2));
    assert_eq!(blocking.join().unwrap().unwrap().first, pos(3));
    log.close();
}

#[test]
fn a_panic_in_an_inline_commit_fails_the_log_and_answers_the_appender() {
    let dir = temp_dir("inline-panic");
    let (log, control) = open_faulty(dir.path(), LogOptions::default());
    log.append(vec![ev("Before", &[])], None).unwrap();
    control.set(|p| p.panic_sync = true);
    // Committed inline (the writer is idle): the panic is caught, not passed to the caller.
    let r = log.append(vec![ev("Boom", &[])], None);
    assert!(matches!(r, Err(AppendError::Io(_))), "{r:?}");
    let threads = control.plan.lock().unwrap().sync_threads.clone();
    assert_eq!(threads[1], thread::current().id(), "the panicking commit ran inline");
    assert!(log.is_closed());
    let later = log.append(vec![ev("After", &[])], None).unwrap_err();
    assert!(matches!(&later, AppendError::Failed(e) if e.to_string().contains("panicked")), "{later:?}");
    assert_eq!(log.head(), Some(pos(1)));
    log.close();
}

#[test]
fn a_request_queued_behind_a_panicking_inline_commit_is_refused_not_committed_on_its_remains() {
    // The writer thread waits for the state's lock with a queued request while an inline commit
    // panics: the log must be failed before that lock is released, or the writer thread commits
    // the request on the half-updated state (here: the panicked round's event slots are filled,
    // so it panicked in turn, "log position 2 written twice", and answered `Shutdown`; it did
    // so in the first round of every run before the fix).
    for round in 0..20 {
        let dir = temp_dir("inline-panic-window");
        let (log, control) = open_faulty(dir.path(), LogOptions::default());
        log.append(vec![ev("Before", &[])], None).unwrap();
        control.set(|p| {
            p.hold_syncs = true;
            p.panic_sync = true;
        });
        let boom = {
            let log = log.clone();
            thread::spawn(move || log.append(vec![ev("Boom", &[])], None))
        };
        control.await_syncs(2); // the inline commit is inside its sync, holding the lock
        let queued = via_writer_thread(&log, "Queued");
        thread::sleep(Duration::from_millis(2)); // the writer thread drained it, waits for the lock
        control.set(|p| p.hold_syncs = false);
        assert!(matches!(boom.join().unwrap(), Err(AppendError::Io(_))));
        let r = queued.join().unwrap();
        assert!(
            matches!(&r, Err(AppendError::Failed(e)) if e.to_string().contains("inline")),
            "round {round}: {r:?}"
        );
        assert_eq!(log.head(), Some(pos(1)));
        log.close();
    }
}

/// Found by the inline-commit review: a commit that panics after its record was written (here:
/// in the fsync) answered its appender `Shutdown` ("nothing was written"), yet recovery brought
/// the record back on reopen. A request dropped in a panic's unwinding is now answered `Io`
/// (outcome unknown), on the inline path and on the writer thread alike.
#[test]
fn an_append_whose_commit_panicked_is_answered_io_and_may_be_back_after_reopen() {
    let reopened_types = |dir: &std::path::Path| {
        let again = EventLog::open(dir, LogOptions::default()).unwrap();
        let types: Vec<String> = again
            .read(&Query::All, None, usize::MAX)
            .unwrap()
            .events()
            .iter()
            .map(|s| s.event.event_type().to_owned())
            .collect();
        again.close();
        types
    };
    // Inline: the panic comes in the fsync, after the record was written.
    let dir = temp_dir("inline-panic-reopen");
    let (log, control) = open_faulty(dir.path(), LogOptions::default());
    log.append(vec![ev("Before", &[])], None).unwrap();
    control.set(|p| p.panic_sync = true);
    let r = log.append(vec![ev("Boom", &[])], None);
    assert!(
        matches!(&r, Err(AppendError::Io(e)) if e.to_string().contains("may have been written")),
        "{r:?}"
    );
    log.close();
    drop(log);
    assert_eq!(
        reopened_types(dir.path()),
        ["Before", "Boom"],
        "the record was written: it may come back, as Io says"
    );
    // The writer thread's path: the same answer.
    let dir = temp_dir("writer-panic-reopen");
    let (log, control) = open_faulty(dir.path(), LogOptions::default());
    control.set(|p| p.panic_sync = true);
    let r = futures_executor::block_on(log.append_async(vec![ev("Boom", &[])], None));
    assert!(
        matches!(&r, Err(AppendError::Io(e)) if e.to_string().contains("may have been written")),
        "{r:?}"
    );
    let threads = control.plan.lock().unwrap().sync_threads.clone();
    assert_ne!(threads[0], thread::current().id(), "committed by the writer thread");
    log.close();
    drop(log);
    assert_eq!(reopened_types(dir.path()), ["Boom"]);
}
