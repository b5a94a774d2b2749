//! Adversarial tests of the log's inline commit: a blocking `append` that finds the writer idle
//! commits on its own thread, everything else queues and the writer thread group-commits. These
//! tests mix both paths (blocking and async appends, from many threads, with and without
//! conditions) and check the contract of `lanestream_log` (module docs, semantics 1-7) from
//! the public API only: dense unique positions, exact conflicts, read-your-writes from every
//! thread, exactly-once subscriptions, backpressure, close racing appends (and the directory's
//! claim released when `close` returns), and durability of every acknowledged append.
//!
//! Nothing here can observe which path an append took; the workloads vary contention (bursts,
//! gaps, lone appenders, async appends in flight) so that both paths, and their hand-over, run.

use crate::log_support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use lanestream_log::{
    AppendCondition, AppendError, AppendFuture, Event, EventLog, LogOptions, LogPosition, PositionRange,
    Query, ReadHandle, SequencedEvent, WriteHandle,
};
use log_support::{LIMIT, all, pos, temp_dir};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// An event whose payload is unique (`id`), so every event of a test can be traced.
fn uev(ty: &str, tags: &[&str], id: u64, pad: usize) -> Event {
    let mut data = format!("{id}:").into_bytes();
    data.extend((0..pad).map(|i| (id as usize + i) as u8));
    Event::new(ty, tags.iter().copied(), Bytes::from(data)).unwrap()
}

/// The event's parts, compared byte for byte.
fn parts(e: &Event) -> (String, Vec<String>, Bytes) {
    (e.event_type().to_owned(), e.tags().map(str::to_owned).collect(), e.data().clone())
}

/// Reads `range` on this thread and checks that it holds exactly `events`.
fn assert_reads_back(log: &ReadHandle, range: PositionRange, events: &[Event], who: &str) {
    let after = before(range.first);
    let got = log.read(&Query::All, after, events.len()).unwrap();
    assert_eq!(
        got.events().iter().map(|s| s.position.get()).collect::<Vec<_>>(),
        range.iter().map(|p| p.get()).collect::<Vec<_>>(),
        "{who}: Ok({range:?}) is not (wholly) readable at once"
    );
    for (s, e) in got.events().iter().zip(events) {
        assert_eq!(parts(&s.event), parts(e), "{who}: position {} holds another event", s.position.get());
    }
}

/// The position before `p` (`None` before 1).
fn before(p: LogPosition) -> Option<LogPosition> {
    LogPosition::new(p.get() - 1)
}

/// Wakes a parked thread.
struct Unpark(thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Drives several append futures at once on this thread (so many are in flight together);
/// panics if they are not all done within [`LIMIT`].
fn join_all(futures: Vec<AppendFuture>) -> Vec<Result<PositionRange, AppendError>> {
    let out = futures.iter().map(|_| None).collect();
    join_rest(futures, out)
}

/// As [`join_all`], for futures some of which already completed (`Some` in `out`).
fn join_rest(
    mut futures: Vec<AppendFuture>,
    mut out: Vec<Option<Result<PositionRange, AppendError>>>,
) -> Vec<Result<PositionRange, AppendError>> {
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let deadline = Instant::now() + LIMIT;
    loop {
        let mut pending = 0;
        for (f, o) in futures.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match Pin::new(f).poll(&mut cx) {
                    Poll::Ready(r) => *o = Some(r),
                    Poll::Pending => pending += 1,
                }
            }
        }
        if pending == 0 {
            return out.into_iter().map(Option::unwrap).collect();
        }
        assert!(Instant::now() < deadline, "{pending} append futures never completed");
        thread::park_timeout(Duration::from_millis(50));
    }
}

/// Runs `f` on its own thread and panics if it has not returned within [`LIMIT`] (a hang).
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(LIMIT) {
        Ok(v) => v,
        Err(_) => panic!("{what} did not return within {LIMIT:?}"),
    }
}

/// What one thread did: each acknowledged append with the events it was given.
type Acked = Vec<(PositionRange, Vec<Event>)>;

/// Checks that `acked` (from every thread) covers `1..=head` exactly once, in dense disjoint
/// ranges, and that the log holds exactly those events there.
fn assert_dense_and_exact(log: &ReadHandle, acked: &Acked) {
    let mut by_first: BTreeMap<u64, (PositionRange, &[Event])> = BTreeMap::new();
    for (r, evs) in acked {
        assert_eq!(r.len(), evs.len() as u64, "range {r:?} has the wrong length");
        assert!(
            by_first.insert(r.first.get(), (*r, evs)).is_none(),
            "two appends got position {}",
            r.first.get()
        );
    }
    let mut next = 1;
    for (first, (r, _)) in &by_first {
        assert_eq!(*first, next, "positions not dense: expected an append at {next}, next is {r:?}");
        next = r.last.get() + 1;
    }
    let events = all(log);
    assert_eq!(events.len() as u64, next - 1, "the log holds events nobody was acknowledged for");
    assert_eq!(log.head().map_or(0, |p| p.get()), next - 1);
    for (r, evs) in by_first.values() {
        // The append boundaries agree, whichever path committed it.
        assert_eq!(log.append_at(r.first), Some(*r), "append_at({:?})", r.first);
        assert_eq!(log.append_at(r.last), Some(*r), "append_at({:?})", r.last);
        for (p, e) in r.iter().zip(evs.iter()) {
            let got = &events[p.get() as usize - 1];
            assert_eq!(got.position, p);
            assert_eq!(parts(&got.event), parts(e), "position {} holds another event", p.get());
        }
    }
}

fn opts() -> LogOptions {
    LogOptions::default()
}

// ---------------------------------------------------------------------------------------------
// Density, exactness, read-your-writes
// ---------------------------------------------------------------------------------------------

/// Appends from `threads` threads, each mixing blocking appends (sometimes after a pause, so the
/// writer is idle and the append commits inline), single async appends and bursts of async
/// appends in flight together. Every `Ok` range is read back at once by the appender and by a
/// checker thread it hands the range to.
fn mixed_workload(log: &WriteHandle, threads: usize, per_thread: usize, seed: u64) -> Acked {
    let (tx, rx) = mpsc::channel::<(PositionRange, Vec<Event>)>();
    let checker = {
        let reader = log.reader();
        thread::spawn(move || {
            let mut n = 0;
            for (r, evs) in rx {
                assert_reads_back(&reader, r, &evs, "checker thread");
                n += 1;
            }
            n
        })
    };
    let start = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (log, tx, start) = (log.clone(), tx.clone(), start.clone());
            thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (t as u64).wrapping_mul(0x9e37_79b9));
                let mut acked = Acked::new();
                let mut id = (t as u64) << 32;
                let mut make = |rng: &mut StdRng| -> Vec<Event> {
                    (0..rng.gen_range(1..=3))
                        .map(|_| {
                            id += 1;
                            let tag = format!("t:{t}");
                            uev("E", &[tag.as_str(), "all"], id, rng.gen_range(0..40))
                        })
                        .collect()
                };
                start.wait();
                let mut done = 0;
                let mut last = 0;
                while done < per_thread {
                    match rng.gen_range(0..10) {
                        0..=4 => {
                            if rng.gen_bool(0.3) {
                                thread::yield_now();
                            }
                            if rng.gen_bool(0.05) {
                                thread::sleep(Duration::from_micros(200));
                            }
                            let evs = make(&mut rng);
                            let r = log.append(evs.clone(), None).unwrap();
                            assert_reads_back(&log.reader(), r, &evs, "blocking appender");
                            assert!(r.first.get() > last, "thread {t}: {r:?} not after its previous append");
                            last = r.last.get();
                            tx.send((r, evs.clone())).unwrap();
                            acked.push((r, evs));
                            done += 1;
                        }
                        5..=6 => {
                            let evs = make(&mut rng);
                            let r = futures_executor::block_on(log.append_async(evs.clone(), None)).unwrap();
                            assert_reads_back(&log.reader(), r, &evs, "async appender");
                            assert!(r.first.get() > last, "thread {t}: {r:?} not after its previous append");
                            last = r.last.get();
                            tx.send((r, evs.clone())).unwrap();
                            acked.push((r, evs));
                            done += 1;
                        }
                        _ => {
                            // A burst in flight at once, then a blocking append that must come
                            // after all of them (it never overtakes what is queued).
                            let batch: Vec<Vec<Event>> = (0..rng.gen_range(2..6)).map(|_| make(&mut rng)).collect();
                            let mut futs: Vec<AppendFuture> =
                                batch.iter().map(|evs| log.append_async(evs.clone(), None)).collect();
                            // Poll each once: with the default queue (1,024) there is room, so
                            // all are queued (or already answered) before the blocking append.
                            let early: Vec<_> = {
                                let waker = Waker::from(Arc::new(Unpark(thread::current())));
                                let mut cx = Context::from_waker(&waker);
                                futs.iter_mut()
                                    .map(|f| match Pin::new(f).poll(&mut cx) {
                                        Poll::Ready(r) => Some(r),
                                        Poll::Pending => None,
                                    })
                                    .collect()
                            };
                            let tail = make(&mut rng);
                            let tail_r = log.append(tail.clone(), None).unwrap();
                            let results = join_rest(futs, early);
                            for (r, evs) in results.into_iter().zip(batch) {
                                let r = r.unwrap();
                                assert!(r.first.get() > last, "thread {t}: {r:?} not after its previous append");
                                assert!(
                                    r.last < tail_r.first,
                                    "thread {t}: the blocking append {tail_r:?} overtook its queued async append {r:?}"
                                );
                                tx.send((r, evs.clone())).unwrap();
                                acked.push((r, evs));
                            }
                            assert_reads_back(&log.reader(), tail_r, &tail, "blocking after a burst");
                            last = tail_r.last.get();
                            tx.send((tail_r, tail.clone())).unwrap();
                            acked.push((tail_r, tail));
                            done += 1;
                        }
                    }
                }
                acked
            })
        })
        .collect();
    drop(tx);
    let mut acked = Acked::new();
    for w in workers {
        acked.extend(w.join().unwrap());
    }
    let checked = checker.join().unwrap();
    assert_eq!(checked, acked.len());
    acked
}

#[test]
fn blocking_and_async_appends_racing_from_8_threads_get_dense_unique_positions_read_back_exactly() {
    for round in 0..3 {
        let log = EventLog::in_memory(opts()).unwrap();
        let acked = mixed_workload(&log, 8, 150, 0xA11CE + round);
        assert_dense_and_exact(&log.reader(), &acked);
        within("close", move || log.close());
    }
}

#[test]
fn two_threads_alternating_blocking_appends_mostly_inline_stay_dense_and_readable() {
    // Two lone-ish appenders: the writer is often idle, so most appends commit inline, and the
    // two threads' inline commits and queued appends hand over to each other constantly.
    let log = EventLog::in_memory(opts()).unwrap();
    let acked = mixed_workload(&log, 2, 800, 7);
    assert_dense_and_exact(&log.reader(), &acked);
    log.close();
}

#[test]
fn file_mode_mixed_paths_with_tiny_segments_dense_and_exact_after_reopen() {
    let dir = temp_dir("inline-adv-file");
    let options = opts().segment_bytes(512);
    let log = EventLog::open(&dir, options.clone()).unwrap();
    let acked = mixed_workload(&log, 4, 40, 99);
    assert_dense_and_exact(&log.reader(), &acked);
    within("close", move || log.close());
    let log = EventLog::open(&dir, options).expect("reopening right after close");
    assert_dense_and_exact(&log.reader(), &acked);
    log.close();
}

// ---------------------------------------------------------------------------------------------
// Conditions
// ---------------------------------------------------------------------------------------------

#[test]
fn racing_guards_on_both_paths_exactly_one_wins_and_every_loser_names_its_matching_event() {
    let log = EventLog::in_memory(opts()).unwrap();
    // Unrelated traffic through both paths while the races run, so races land in group commits
    // and in inline commits alike.
    let stop = Arc::new(AtomicBool::new(false));
    let noise: Vec<_> = (0..2)
        .map(|i| {
            let (log, stop) = (log.clone(), stop.clone());
            thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let e = vec![uev("Noise", &["noise"], n, 0)];
                    if i == 0 {
                        log.append(e, None).unwrap();
                    } else {
                        futures_executor::block_on(log.append_async(e, None)).unwrap();
                    }
                    n += 1;
                }
            })
        })
        .collect();
    const RACERS: usize = 6;
    for round in 0..60u64 {
        let key = format!("k:{round}");
        let q = Query::tags([key.clone()]);
        // A match at or before `after` never conflicts: put one there on even rounds.
        if round % 2 == 0 {
            log.append(vec![uev("Old", &[key.as_str()], round, 0)], None).unwrap();
        }
        let seen = log.read(&q, None, usize::MAX).unwrap();
        let guard = AppendCondition::new(q.clone(), seen.head());
        let start = Arc::new(Barrier::new(RACERS));
        let racers: Vec<_> = (0..RACERS)
            .map(|i| {
                let (log, guard, start, key) = (log.clone(), guard.clone(), start.clone(), key.clone());
                thread::spawn(move || {
                    // The matching event is the second of the append: `at` must name it, not
                    // the append's first position.
                    let evs = vec![
                        uev("Filler", &["filler"], i as u64, 0),
                        uev("Claim", &[key.as_str()], i as u64, 0),
                    ];
                    start.wait();
                    if i % 2 == 0 {
                        log.append(evs, Some(guard))
                    } else {
                        futures_executor::block_on(log.append_async(evs, Some(guard)))
                    }
                })
            })
            .collect();
        let results: Vec<_> = racers.into_iter().map(|r| r.join().unwrap()).collect();
        let wins: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(wins.len(), 1, "round {round}: {results:?}");
        let claim_at = wins[0].last;
        for r in &results {
            match r {
                Ok(_) => {}
                Err(AppendError::Conflict { at }) => {
                    assert_eq!(
                        *at, claim_at,
                        "round {round}: a loser names {at:?}, the winner's claim is at {claim_at:?}"
                    )
                }
                Err(e) => panic!("round {round}: unexpected {e:?}"),
            }
        }
        // The claim is the only matching event above `after`, and the log agrees.
        let now = log.read(&q, guard.after, usize::MAX).unwrap();
        assert_eq!(now.events().iter().map(|s| s.position).collect::<Vec<_>>(), [claim_at], "round {round}");
    }
    stop.store(true, Ordering::Relaxed);
    noise.into_iter().for_each(|n| n.join().unwrap());
    log.close();
}

/// The DCB invariant under load: threads read, decide and append with a guard (at most `CAP`
/// events per key), retrying on conflict, mixing both paths. No key ever exceeds `CAP`, and
/// every conflict's `at` is a real matching event above the guard's `after`.
#[test]
fn read_decide_append_with_guards_on_both_paths_never_exceeds_a_capacity() {
    const KEYS: usize = 4;
    const CAP: usize = 25;
    let log = EventLog::in_memory(opts()).unwrap();
    let conflicts = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..6)
        .map(|t| {
            let (log, conflicts) = (log.clone(), conflicts.clone());
            thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(t);
                let mut full = [false; KEYS];
                let mut id = t << 32;
                while full.iter().any(|f| !f) {
                    let k = rng.gen_range(0..KEYS);
                    if full[k] {
                        continue;
                    }
                    let key = format!("cap:{k}");
                    let q = Query::tags([key.clone()]);
                    let seen = log.read(&q, None, usize::MAX).unwrap();
                    if seen.len() >= CAP {
                        full[k] = true;
                        continue;
                    }
                    id += 1;
                    let guard = AppendCondition::new(q.clone(), seen.head());
                    let evs = vec![uev("Seat", &[key.as_str()], id, 8)];
                    let r = if rng.gen_bool(0.5) {
                        log.append(evs, Some(guard.clone()))
                    } else {
                        futures_executor::block_on(log.append_async(evs, Some(guard.clone())))
                    };
                    match r {
                        Ok(range) => {
                            let mine =
                                log.reader().get(range.first).unwrap().expect("Ok range readable at once");
                            assert!(mine.event.has_tag(&key));
                        }
                        Err(AppendError::Conflict { at }) => {
                            conflicts.fetch_add(1, Ordering::Relaxed);
                            assert!(
                                guard.after.is_none_or(|a| at > a),
                                "at {at:?} not above after {:?}",
                                guard.after
                            );
                            let hit =
                                log.reader().get(at).unwrap().expect("the conflicting event is readable");
                            assert!(hit.event.has_tag(&key), "conflict at {at:?} names a non-matching event");
                            // And it is the lowest match above `after`.
                            let lowest = log.read(&q, guard.after, 1).unwrap();
                            assert_eq!(lowest.events()[0].position, at);
                        }
                        Err(e) => panic!("{e:?}"),
                    }
                }
            })
        })
        .collect();
    workers.into_iter().for_each(|w| w.join().unwrap());
    for k in 0..KEYS {
        let n = log.read(&Query::tags([format!("cap:{k}")]), None, usize::MAX).unwrap().len();
        assert_eq!(n, CAP, "key {k} holds {n} seats");
    }
    log.close();
}

// ---------------------------------------------------------------------------------------------
// Close racing appends; appends after close; the directory's claim
// ---------------------------------------------------------------------------------------------

/// What a close-race worker saw.
struct Outcome {
    acked: Acked,
    /// Payloads of appends answered `Shutdown`.
    refused: Vec<Bytes>,
}

/// Appenders on both paths until they are refused; returns each thread's outcome. The caller
/// closes (or drops) the log meanwhile.
/// `salt` keeps payloads unique across the rounds of one directory.
fn appenders_until_shutdown(
    log: &WriteHandle,
    threads: usize,
    started: Arc<Barrier>,
    salt: u64,
) -> Vec<thread::JoinHandle<Outcome>> {
    (0..threads)
        .map(|t| {
            let (log, started) = (log.clone(), started.clone());
            thread::spawn(move || {
                let mut out = Outcome { acked: Acked::new(), refused: Vec::new() };
                let mut id = (salt << 40) | ((t as u64) << 32);
                let mut shut = false;
                started.wait();
                for i in 0.. {
                    id += 1;
                    let evs = vec![uev("C", &["close"], id, 16), uev("C", &[], id | 1 << 31, 3)];
                    let r = if t % 3 == 2 && i % 2 == 0 {
                        futures_executor::block_on(log.append_async(evs.clone(), None))
                    } else {
                        log.append(evs.clone(), None)
                    };
                    match r {
                        Ok(range) => {
                            assert!(
                                !shut,
                                "thread {t}: an append succeeded after one was refused with Shutdown"
                            );
                            out.acked.push((range, evs));
                        }
                        Err(AppendError::Shutdown) => {
                            shut = true;
                            out.refused.push(evs[0].data().clone());
                            // A few more after the first refusal: all refused.
                            if out.refused.len() >= 3 {
                                break;
                            }
                        }
                        Err(e) => panic!("thread {t}: {e:?}"),
                    }
                    if i % 7 == 0 {
                        thread::yield_now();
                    }
                }
                out
            })
        })
        .collect()
}

/// After a close: every acked append is in the reopened log byte-exact, dense from 1, and no
/// append answered `Shutdown` left anything behind.
fn check_after_reopen(log: &ReadHandle, outcomes: &[Outcome], before_head: u64) {
    let acked: Acked = outcomes.iter().flat_map(|o| o.acked.iter().cloned()).collect();
    let events = all(log);
    let mut ranges: Vec<_> = acked.iter().map(|(r, _)| *r).collect();
    ranges.sort_by_key(|r| r.first);
    let mut next = before_head + 1;
    for r in &ranges {
        assert_eq!(r.first.get(), next, "acked ranges not dense above {before_head}: {ranges:?}");
        next = r.last.get() + 1;
    }
    assert_eq!(events.len() as u64, next - 1, "the reopened log's length differs from what was acked");
    for (r, evs) in &acked {
        for (p, e) in r.iter().zip(evs) {
            assert_eq!(parts(&events[p.get() as usize - 1].event), parts(e), "position {}", p.get());
        }
    }
    let refused: HashSet<&Bytes> = outcomes.iter().flat_map(|o| o.refused.iter()).collect();
    for s in &events {
        assert!(
            !refused.contains(s.event.data()),
            "an append answered Shutdown is in the log at {:?}",
            s.position
        );
    }
}

#[test]
fn close_racing_blocking_and_async_appends_loses_nothing_and_releases_the_directory() {
    let dir = temp_dir("inline-adv-close");
    let mut head = 0;
    for round in 0..12u64 {
        let log = EventLog::open(&dir, opts()).unwrap_or_else(|e| panic!("round {round}: reopen: {e}"));
        assert_eq!(log.head().map_or(0, |p| p.get()), head);
        let started = Arc::new(Barrier::new(5));
        let workers = appenders_until_shutdown(&log, 4, started.clone(), round);
        started.wait();
        thread::sleep(Duration::from_micros(300 * (round % 6)));
        let closer = log.clone();
        within("close racing appends", move || closer.close());
        assert!(log.is_closed());
        // Appends after close: refused, on both paths, and no position consumed.
        let h = log.head();
        assert!(matches!(log.append(vec![uev("Late", &[], 0, 0)], None), Err(AppendError::Shutdown)));
        let late = futures_executor::block_on(log.append_async(vec![uev("Late", &[], 1, 0)], None));
        assert!(matches!(late, Err(AppendError::Shutdown)), "{late:?}");
        assert_eq!(log.head(), h);
        let outcomes: Vec<Outcome> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        // The claim is released once `close` returned: open again at once, while this handle
        // (closed) still exists.
        let again =
            EventLog::open(&dir, opts()).unwrap_or_else(|e| panic!("round {round}: reopen after close: {e}"));
        check_after_reopen(&again.reader(), &outcomes, head);
        head = again.head().map_or(0, |p| p.get());
        again.close();
        drop(log);
    }
    assert!(head > 0, "no append ever got in before the close");
}

#[test]
fn dropping_the_last_handle_while_others_append_then_reopening_at_once_works() {
    let dir = temp_dir("inline-adv-drop");
    for round in 0..10u64 {
        let log = EventLog::open(&dir, opts()).unwrap_or_else(|e| panic!("round {round}: {e}"));
        let head = log.head().map_or(0, |p| p.get());
        // Each worker appends a few times and drops its clone; whichever drops last stops the
        // writer, on its own thread, possibly right after an inline commit.
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let log = log.clone();
                thread::spawn(move || {
                    let mut acked = Acked::new();
                    for i in 0..(3 + t + round as usize % 3) {
                        let evs = vec![uev("D", &[], (round << 40) | ((t as u64) << 20) | i as u64, 5)];
                        let r = if i % 3 == 1 {
                            futures_executor::block_on(log.append_async(evs.clone(), None))
                        } else {
                            log.append(evs.clone(), None)
                        };
                        acked.push((r.unwrap(), evs));
                    }
                    drop(log);
                    acked
                })
            })
            .collect();
        drop(log);
        let outcomes: Vec<Outcome> =
            workers.into_iter().map(|w| Outcome { acked: w.join().unwrap(), refused: Vec::new() }).collect();
        let again =
            EventLog::open(&dir, opts()).unwrap_or_else(|e| panic!("round {round}: reopen after drop: {e}"));
        check_after_reopen(&again.reader(), &outcomes, head);
        drop(again);
    }
}

#[test]
fn two_threads_closing_at_once_both_return_after_the_claim_is_released() {
    let dir = temp_dir("inline-adv-close2");
    for round in 0..20 {
        let log = EventLog::open(&dir, opts()).unwrap_or_else(|e| panic!("round {round}: {e}"));
        log.append(vec![uev("A", &[], round, 0)], None).unwrap();
        let start = Arc::new(Barrier::new(3));
        // Each closer reopens under this lock and closes again before releasing it, so the
        // other closer never holds the directory while one tries: every reopen must succeed.
        let turn = Arc::new(std::sync::Mutex::new(()));
        let closers: Vec<_> = (0..2)
            .map(|_| {
                let (log, start, dir, turn) = (log.clone(), start.clone(), dir.to_path_buf(), turn.clone());
                thread::spawn(move || {
                    start.wait();
                    log.close();
                    // Right after this thread's close returned — whichever thread did the
                    // stopping (the other may still be joining the writer) — the claim is gone.
                    let _turn = turn.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    match EventLog::open(&dir, LogOptions::default()) {
                        Ok(l) => l.close(),
                        Err(e) => panic!("round {round}: reopen right after close: {e}"),
                    }
                })
            })
            .collect();
        // A blocking append racing the two closes: Ok (and durable) or Shutdown.
        start.wait();
        let r = log.append(vec![uev("Race", &[], 1000 + round, 0)], None);
        closers.into_iter().for_each(|c| c.join().unwrap());
        drop(log);
        let again = EventLog::open(&dir, opts()).unwrap();
        let n = again.head().map_or(0, |p| p.get());
        match r {
            Ok(range) => assert_eq!(
                again.reader().get(range.first).unwrap().unwrap().event.data(),
                &Bytes::from(format!("{}:", 1000 + round))
            ),
            Err(AppendError::Shutdown) => {
                let mine = Bytes::from(format!("{}:", 1000 + round));
                assert!(
                    all(&again.reader()).iter().all(|s| s.event.data() != &mine),
                    "round {round}: a refused append is in the log"
                )
            }
            Err(e) => panic!("{e:?}"),
        }
        assert!(n > round);
        again.close();
    }
}

#[test]
fn appends_after_close_are_refused_on_both_paths_and_consume_nothing() {
    let log = EventLog::in_memory(opts()).unwrap();
    log.append(vec![uev("A", &["k"], 1, 0)], None).unwrap();
    log.close();
    let g = AppendCondition::new(Query::tags(["k"]), None);
    for r in [
        log.append(vec![uev("B", &[], 2, 0)], None),
        log.append(vec![uev("B", &[], 3, 0)], Some(g.clone())),
        futures_executor::block_on(log.append_async(vec![uev("B", &[], 4, 0)], None)),
        futures_executor::block_on(log.append_async(vec![uev("B", &[], 5, 0)], Some(g))),
    ] {
        assert!(matches!(r, Err(AppendError::Shutdown)), "{r:?}");
    }
    // Checked on the caller's thread first: still refused as such.
    assert!(matches!(log.append(vec![], None), Err(AppendError::Empty)));
    assert_eq!(log.head(), Some(pos(1)));
    assert_eq!(all(&log.reader()).len(), 1);
    // A clone made after the close is closed too.
    let clone = log.clone();
    assert!(clone.is_closed());
    assert!(matches!(clone.append(vec![uev("C", &[], 6, 0)], None), Err(AppendError::Shutdown)));
    clone.close();
}

// ---------------------------------------------------------------------------------------------
// Subscriptions
// ---------------------------------------------------------------------------------------------

#[test]
fn subscriptions_see_every_event_once_in_order_while_inline_and_queued_commits_interleave() {
    for round in 0..3u64 {
        let log = EventLog::in_memory(opts().subscription_batch(7)).unwrap();
        let subs: Vec<(Query, thread::JoinHandle<Vec<SequencedEvent>>)> =
            [Query::All, Query::tags(["t:1"]), Query::types(["Nothing"])]
                .into_iter()
                .enumerate()
                .map(|(i, q)| {
                    let mut sub = log.subscribe(q.clone(), None);
                    let h = thread::spawn(move || {
                        let mut got = Vec::new();
                        if i == 2 {
                            // The async flavour.
                            futures_executor::block_on(async {
                                while let Some(b) = sub.next_batch_async().await.unwrap() {
                                    got.extend(b);
                                }
                            });
                        } else {
                            while let Some(b) = sub.next_batch().unwrap() {
                                got.extend(b);
                            }
                        }
                        got
                    });
                    (q, h)
                })
                .collect();
        // One more that starts in the middle, and a try_next_batch poller.
        let late = {
            let log = log.clone();
            thread::spawn(move || {
                while log.head().is_none_or(|h| h.get() < 50) {
                    thread::yield_now();
                }
                let from = log.head();
                let mut sub = log.subscribe(Query::All, from);
                drop(log);
                let mut got = Vec::new();
                loop {
                    match sub.try_next_batch() {
                        Ok(b) => got.extend(b),
                        Err(lanestream_log::TryNextError::Empty) => thread::yield_now(),
                        Err(lanestream_log::TryNextError::Closed) => break,
                        Err(e) => panic!("{e:?}"),
                    }
                }
                (from, got)
            })
        };
        let acked = mixed_workload(&log, 4, 60, 1234 + round);
        let closer = log.clone();
        within("close", move || closer.close());
        let everything = all(&log.reader());
        assert_dense_and_exact(&log.reader(), &acked);
        for (q, h) in subs {
            let got = h.join().unwrap();
            let want: Vec<_> = everything.iter().filter(|s| q.matches(&s.event)).cloned().collect();
            assert_eq!(got.len(), want.len(), "{q:?}: {} delivered, {} match", got.len(), want.len());
            assert_eq!(got, want, "{q:?}");
        }
        let (from, got) = late.join().unwrap();
        let from = from.unwrap().get();
        assert_eq!(
            got.iter().map(|s| s.position.get()).collect::<Vec<_>>(),
            ((from + 1)..=everything.len() as u64).collect::<Vec<_>>()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Backpressure
// ---------------------------------------------------------------------------------------------

#[test]
fn tiny_queue_and_one_request_per_drain_with_inline_blocking_appends_never_hangs() {
    for (cap, drain) in [(1, 1), (2, 1), (1, 3)] {
        let log = EventLog::in_memory(opts().queue_capacity(cap).max_drain_requests(drain)).unwrap();
        let l = log.clone();
        let acked = within("a workload on a tiny queue", move || {
            let start = Arc::new(Barrier::new(6));
            let workers: Vec<_> = (0..6)
                .map(|t| {
                    let (log, start) = (l.clone(), start.clone());
                    thread::spawn(move || {
                        let mut acked = Acked::new();
                        start.wait();
                        for i in 0..120u64 {
                            let id = ((t as u64) << 32) | i;
                            if t < 3 {
                                let evs = vec![uev("B", &[], id, 4)];
                                acked.push((log.append(evs.clone(), None).unwrap(), evs));
                            } else if i % 4 == 0 {
                                // Several in flight against a queue of one or two.
                                let batch: Vec<Vec<Event>> =
                                    (0..4).map(|j| vec![uev("A", &[], id | (j << 24), 4)]).collect();
                                let rs = join_all(
                                    batch.iter().map(|e| log.append_async(e.clone(), None)).collect(),
                                );
                                for (r, e) in rs.into_iter().zip(batch) {
                                    acked.push((r.unwrap(), e));
                                }
                            }
                        }
                        acked
                    })
                })
                .collect();
            workers.into_iter().flat_map(|w| w.join().unwrap()).collect::<Acked>()
        });
        assert_dense_and_exact(&log.reader(), &acked);
        log.close();
    }
}

#[test]
fn close_while_blocking_appends_wait_for_room_in_a_full_queue_answers_every_one() {
    for round in 0..10u64 {
        let dir = temp_dir("inline-adv-full");
        let options = opts().queue_capacity(1).max_drain_requests(1);
        let log = EventLog::open(&dir, options.clone()).unwrap();
        let started = Arc::new(Barrier::new(7));
        let workers = appenders_until_shutdown(&log, 6, started.clone(), round);
        started.wait();
        thread::sleep(Duration::from_micros(200 * round));
        let closer = log.clone();
        within("close with a full queue", move || closer.close());
        let outcomes: Vec<Outcome> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        drop(log);
        let again = EventLog::open(&dir, options).unwrap();
        check_after_reopen(&again.reader(), &outcomes, 0);
        again.close();
    }
}

// ---------------------------------------------------------------------------------------------
// Durability
// ---------------------------------------------------------------------------------------------

#[test]
fn every_acked_append_of_both_paths_survives_reopen_byte_exact_across_sessions() {
    let dir = temp_dir("inline-adv-durable");
    let options = opts().segment_bytes(4096);
    let mut acked = Acked::new();
    let mut rng = StdRng::seed_from_u64(42);
    for session in 0..4u64 {
        let log = EventLog::open(&dir, options.clone()).unwrap();
        assert_dense_and_exact(&log.reader(), &acked);
        // Conflict state survives recovery: a guard over everything from before names the
        // lowest matching event, whichever path wrote it.
        if let Some((r, _)) = acked.iter().min_by_key(|(r, _)| r.first) {
            let c = log.append(vec![uev("No", &[], 0, 0)], Some(AppendCondition::new(Query::All, None)));
            assert!(matches!(c, Err(AppendError::Conflict { at }) if at == r.first), "{c:?}");
        }
        let sizes: Vec<usize> = (0..3).map(|_| rng.gen_range(0..3)).collect();
        let big = [0usize, 100, 20_000];
        let workers: Vec<_> = (0..3)
            .map(|t| {
                let log = log.clone();
                let pad = big[sizes[t]];
                thread::spawn(move || {
                    let mut acked = Acked::new();
                    for i in 0..25u64 {
                        let id = (session << 48) | ((t as u64) << 32) | i;
                        let evs: Vec<Event> = (0..1 + i % 3)
                            .map(|j| {
                                uev(
                                    &format!("T{t}"),
                                    &["d", &format!("s:{session}")],
                                    id | (j << 16),
                                    pad + j as usize,
                                )
                            })
                            .collect();
                        let r = if (i + t as u64) % 3 == 0 {
                            futures_executor::block_on(log.append_async(evs.clone(), None))
                        } else {
                            log.append(evs.clone(), None)
                        };
                        acked.push((r.unwrap(), evs));
                    }
                    acked
                })
            })
            .collect();
        for w in workers {
            acked.extend(w.join().unwrap());
        }
        if session % 2 == 0 {
            log.close();
        } else {
            drop(log);
        }
    }
    let log = EventLog::open(&dir, options).unwrap();
    assert_dense_and_exact(&log.reader(), &acked);
    log.close();
}

// ---------------------------------------------------------------------------------------------
// A model of random op sequences from 2-3 threads
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Cond {
    None,
    /// Guard on tag `k:{key}` over the whole log.
    Whole(u8),
    /// Guard on tag `k:{key}` after the head this thread last saw.
    AfterSeen(u8),
    /// Guard on everything after a fixed position (possibly beyond the head).
    AllAfter(u64),
}

#[derive(Clone, Debug)]
struct Op {
    blocking: bool,
    /// Tags (`k:{n}`) of the events, one event each.
    keys: Vec<u8>,
    cond: Cond,
    /// Pause before the op, so the writer is sometimes idle (inline) and sometimes not.
    pause: bool,
    /// For an async op: poll it once (queued), then append one event with a blocking append
    /// from the same thread, then await the async one. The blocking append must come after it
    /// (it may commit inline only when nothing is queued or being committed).
    chase: bool,
}

fn op() -> impl Strategy<Value = Op> {
    let cond = prop_oneof![
        3 => Just(Cond::None),
        2 => (0u8..3).prop_map(Cond::Whole),
        3 => (0u8..3).prop_map(Cond::AfterSeen),
        1 => (1u64..40).prop_map(Cond::AllAfter),
    ];
    (
        any::<bool>(),
        prop::collection::vec(0u8..3, 1..4),
        cond,
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(blocking, keys, cond, pause, chase)| Op { blocking, keys, cond, pause, chase })
}

/// One op's outcome, with what it was given.
#[derive(Debug)]
struct Done {
    thread: usize,
    events: Vec<Event>,
    condition: Option<AppendCondition>,
    result: Result<PositionRange, AppendError>,
    /// The head this thread had seen (its own appends or reads) before the op.
    seen: u64,
}

fn run_model(threads: Vec<Vec<Op>>) -> Result<(), TestCaseError> {
    // Room for every request in flight (3 threads, at most 2 each: a chased async append is
    // queued at its first poll), and small group commits.
    let log = EventLog::in_memory(LogOptions::default().queue_capacity(8).max_drain_requests(3)).unwrap();
    let start = Arc::new(Barrier::new(threads.len()));
    let handles: Vec<_> = threads
        .into_iter()
        .enumerate()
        .map(|(t, ops)| {
            let (log, start) = (log.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                let mut seen = 0u64;
                let mut out = Vec::new();
                for (i, op) in ops.into_iter().enumerate() {
                    if op.pause {
                        thread::sleep(Duration::from_micros(50));
                    }
                    let events: Vec<Event> = op
                        .keys
                        .iter()
                        .enumerate()
                        .map(|(j, k)| {
                            uev("M", &[format!("k:{k}").as_str()], ((t * 1000 + i) * 10 + j) as u64, 0)
                        })
                        .collect();
                    let condition = match op.cond {
                        Cond::None => None,
                        Cond::Whole(k) => Some(AppendCondition::new(Query::tags([format!("k:{k}")]), None)),
                        Cond::AfterSeen(k) => Some(AppendCondition::new(
                            Query::tags([format!("k:{k}")]),
                            LogPosition::new(seen),
                        )),
                        Cond::AllAfter(p) => Some(AppendCondition::new(Query::All, LogPosition::new(p))),
                    };
                    let mut chased = None;
                    let result = if op.blocking {
                        log.append(events.clone(), condition.clone())
                    } else if op.chase {
                        let mut f = log.append_async(events.clone(), condition.clone());
                        let waker = Waker::from(Arc::new(Unpark(thread::current())));
                        let early = match Pin::new(&mut f).poll(&mut Context::from_waker(&waker)) {
                            Poll::Ready(r) => Some(r),
                            Poll::Pending => None,
                        };
                        let chase = vec![uev("Chase", &["k:9"], ((t * 1000 + i) * 10 + 9) as u64, 0)];
                        let r = log.append(chase.clone(), None);
                        chased = Some(Done { thread: t, events: chase, condition: None, result: r, seen });
                        join_rest(vec![f], vec![early]).pop().unwrap()
                    } else {
                        futures_executor::block_on(log.append_async(events.clone(), condition.clone()))
                    };
                    if let Ok(r) = &result {
                        // Read-your-writes.
                        assert_eq!(log.reader().get(r.last).unwrap().map(|s| s.position), Some(r.last));
                    }
                    out.push(Done { thread: t, events, condition, result, seen });
                    // After the async append it chased: program order says it comes later.
                    out.extend(chased);
                    seen = seen.max(match &out.last().unwrap().result {
                        Ok(r) => r.last.get(),
                        _ => 0,
                    });
                    if i % 3 == 0 {
                        seen = seen.max(log.head().map_or(0, |p| p.get()));
                    }
                }
                out
            })
        })
        .collect();
    let done: Vec<Done> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    log.close();
    let events = all(&log.reader());
    let head = events.len() as u64;
    prop_assert_eq!(log.head().map_or(0, |p| p.get()), head);
    // Every Ok append is in the log at its range, exactly; together they cover 1..=head once.
    let mut covered = vec![false; head as usize];
    let mut last_of_thread: HashMap<usize, u64> = HashMap::new();
    for d in &done {
        match &d.result {
            Ok(r) => {
                prop_assert_eq!(r.len(), d.events.len() as u64);
                for (p, e) in r.iter().zip(&d.events) {
                    let i = p.get() as usize - 1;
                    prop_assert!(i < covered.len(), "{:?} beyond the head {}", r, head);
                    prop_assert!(!covered[i], "position {} given twice", p.get());
                    covered[i] = true;
                    prop_assert_eq!(parts(&events[i].event), parts(e));
                }
                // Program order: a thread's appends are ascending.
                let prev = last_of_thread.insert(d.thread, r.last.get()).unwrap_or(0);
                prop_assert!(r.first.get() > prev, "thread {}: {:?} not after {}", d.thread, r, prev);
                // The condition held at the decision: nothing matched in (after, first).
                if let Some(c) = &d.condition {
                    let after = c.after.map_or(0, |p| p.get());
                    prop_assert!(after < r.first.get());
                    for s in &events[after as usize..r.first.get() as usize - 1] {
                        prop_assert!(
                            !c.fail_if_events_match.matches(&s.event),
                            "{:?} succeeded although {:?} matches",
                            d,
                            s.position
                        );
                    }
                }
            }
            Err(AppendError::Conflict { at }) => {
                let c = d.condition.as_ref().expect("a conflict needs a condition");
                let after = c.after.map_or(0, |p| p.get());
                // `at` is the lowest match above `after` (everything below `at` existed when
                // the condition was decided, the log being append-only).
                let lowest =
                    events[after as usize..].iter().find(|s| c.fail_if_events_match.matches(&s.event));
                prop_assert_eq!(lowest.map(|s| s.position), Some(*at), "{:?}", d);
                prop_assert!(at.get() > after && at.get() <= head, "{:?}", d);
            }
            Err(AppendError::AfterBeyondHead { after, head: h }) => {
                let h = h.map_or(0, |p| p.get());
                prop_assert!(after.get() > h);
                // Read-your-writes: the head the writer judged by covers what this thread saw.
                prop_assert!(h >= d.seen, "{:?}: head {} below what the thread had seen ({})", d, h, d.seen);
                prop_assert!(h <= head);
            }
            Err(e) => prop_assert!(false, "unexpected {:?} for {:?}", e, d),
        }
    }
    prop_assert!(covered.iter().all(|&c| c), "a gap in the positions");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_mixed_ops_from_2_or_3_threads_match_a_serial_model(
        threads in prop::collection::vec(prop::collection::vec(op(), 1..25), 2..=3)
    ) {
        run_model(threads)?;
    }
}

// ---------------------------------------------------------------------------------------------
// A write failure on the inline path (through the public API: the directory moved away, so
// the next segment cannot be created)
// ---------------------------------------------------------------------------------------------

/// Moves a directory away and back (on drop, also when the test fails), so that the log's next
/// segment creation fails with `NotFound` while its open files keep working.
struct Moved {
    from: std::path::PathBuf,
    to: std::path::PathBuf,
}

impl Moved {
    fn away(dir: &std::path::Path) -> Moved {
        let to = dir.with_extension("moved");
        std::fs::rename(dir, &to).unwrap();
        Moved { from: dir.to_path_buf(), to }
    }
}

impl Drop for Moved {
    fn drop(&mut self) {
        let _ = std::fs::rename(&self.to, &self.from);
    }
}

#[test]
fn a_write_failure_in_an_inline_commit_fails_the_log_wakes_every_waiter_and_keeps_what_was_acked() {
    let dir = temp_dir("inline-adv-io");
    // One byte per segment: every commit after the first starts a new segment file.
    let options = opts().segment_bytes(1);
    let log = EventLog::open(&dir, options.clone()).unwrap();
    let mut acked = Acked::new();
    for i in 0..3 {
        let evs = vec![uev("A", &["k"], i, 10)];
        acked.push((log.append(evs.clone(), None).unwrap(), evs));
    }
    let blocking_sub = {
        let mut sub = log.subscribe(Query::All, None);
        thread::spawn(move || {
            let mut got = 0;
            loop {
                match sub.next_batch() {
                    Ok(Some(b)) => got += b.len(),
                    other => return (got, other.map(|_| ())),
                }
            }
        })
    };
    let async_sub = {
        let mut sub = log.subscribe(Query::tags(["k"]), Some(pos(3)));
        thread::spawn(move || futures_executor::block_on(sub.next_batch_async()).map(|b| b.map(|b| b.len())))
    };
    thread::sleep(Duration::from_millis(20)); // both subscribers are waiting
    let moved = Moved::away(&dir);
    // The writer is idle: this append commits inline, and its segment cannot be created.
    let r = log.append(vec![uev("B", &["k"], 10, 0)], None);
    assert!(matches!(r, Err(AppendError::Io(_))), "{r:?}");
    let cause = log.reader().failure().expect("the log records its failure");
    assert_eq!(cause.kind(), std::io::ErrorKind::NotFound, "{cause}");
    // From now on: refused on both paths, nothing published.
    assert!(matches!(log.append(vec![uev("C", &[], 11, 0)], None), Err(AppendError::Failed(_))));
    let late = futures_executor::block_on(log.append_async(vec![uev("C", &[], 12, 0)], None));
    assert!(matches!(late, Err(AppendError::Failed(_))), "{late:?}");
    assert_eq!(log.head(), Some(pos(3)));
    // Both subscribers were woken by the inline commit's failure, after what was published.
    let (got, end) = within("the blocking subscriber", move || blocking_sub.join().unwrap());
    assert_eq!(got, 3);
    assert!(matches!(end, Err(lanestream_log::SubscriptionError::Failed(_))), "{end:?}");
    let end = within("the async subscriber", move || async_sub.join().unwrap());
    assert!(matches!(end, Err(lanestream_log::SubscriptionError::Failed(_))), "{end:?}");
    let closer = log.clone();
    within("close after a failure", move || closer.close());
    drop(moved);
    let again = EventLog::open(&dir, options).unwrap();
    assert_dense_and_exact(&again.reader(), &acked);
    again.close();
}

#[test]
fn a_write_failure_while_both_paths_append_from_many_threads_answers_every_append_once() {
    for round in 0..6u64 {
        let dir = temp_dir("inline-adv-io-race");
        let options = opts().segment_bytes(1);
        let log = EventLog::open(&dir, options.clone()).unwrap();
        let started = Arc::new(Barrier::new(5));
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let (log, started) = (log.clone(), started.clone());
                thread::spawn(move || {
                    let mut acked = Acked::new();
                    let (mut io, mut failed) = (0, 0);
                    started.wait();
                    for i in 0u64.. {
                        let evs = vec![uev("W", &[], ((t as u64) << 32) | i, 8)];
                        let r = if t % 2 == 1 && i % 2 == 0 {
                            futures_executor::block_on(log.append_async(evs.clone(), None))
                        } else {
                            log.append(evs.clone(), None)
                        };
                        match r {
                            Ok(range) => acked.push((range, evs)),
                            Err(AppendError::Io(_)) => {
                                assert_eq!(failed, 0, "thread {t}: Io after Failed");
                                io += 1;
                            }
                            Err(AppendError::Failed(_)) => {
                                failed += 1;
                                if failed == 3 {
                                    break;
                                }
                            }
                            Err(e) => panic!("thread {t}: {e:?}"),
                        }
                    }
                    (acked, io)
                })
            })
            .collect();
        started.wait();
        thread::sleep(Duration::from_micros(500 + 300 * round));
        let moved = Moved::away(&dir);
        let results: Vec<(Acked, usize)> = within("appenders after a failure", move || {
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let ios: usize = results.iter().map(|(_, n)| n).sum();
        assert!(ios >= 1, "round {round}: no append saw the failing write itself");
        let acked: Acked = results.into_iter().flat_map(|(a, _)| a).collect();
        // What readers see is exactly what was acked (the failed group was never published).
        assert_dense_and_exact(&log.reader(), &acked);
        let closer = log.clone();
        within("close after a failure", move || closer.close());
        drop(log);
        drop(moved);
        let again = EventLog::open(&dir, options).unwrap();
        assert_dense_and_exact(&again.reader(), &acked);
        again.close();
    }
}

// ---------------------------------------------------------------------------------------------
// The log feeding the lanes while both paths commit
// ---------------------------------------------------------------------------------------------

#[test]
fn a_log_source_publishes_each_append_of_both_paths_once_in_order() {
    use lanestream::{LaneItem, MemoryStream, Position};

    let log = EventLog::in_memory(opts()).unwrap();
    let stream = MemoryStream::builder().capacity(4).sinks(["a", "b"]).build().unwrap();
    let source = log_support::spawn_source(&log.reader(), &stream);
    let sinks = log_support::spawn_sinks(&stream, |item| match item {
        LaneItem::Batch(b) => Some((b.position, b.envelopes.len() as u64)),
        _ => None,
    });
    let acked = mixed_workload(&log, 4, 80, 555);
    let closer = log.clone();
    within("close", move || closer.close());
    let stats = within("the source's run", move || source.join().unwrap());
    let mut ranges: Vec<PositionRange> = acked.iter().map(|(r, _)| *r).collect();
    ranges.sort_by_key(|r| r.first);
    assert_eq!(stats.appends, ranges.len() as u64);
    let want: Vec<_> = ranges.iter().map(|r| (Some(Position(r.last.get())), r.len())).collect();
    for sink in sinks {
        let got = within("a sink", move || sink.join().unwrap());
        assert_eq!(got, want, "one batch per append, at its last position, in order");
    }
}

#[test]
fn async_appends_queued_before_close_are_all_served_while_blocking_appends_race_the_close() {
    for round in 0..5u64 {
        let dir = temp_dir("inline-adv-queued-close");
        let log = EventLog::open(&dir, opts()).unwrap();
        let started = Arc::new(Barrier::new(3));
        let racers = appenders_until_shutdown(&log, 2, started.clone(), round);
        started.wait();
        // Queue 200 async appends (one poll each: the default queue has room, so each is queued
        // or already answered), and drop every other future once queued: a queued append is
        // not withdrawn by dropping its future.
        let waker = Waker::from(Arc::new(Unpark(thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut kept = Vec::new();
        let mut dropped = Vec::new();
        for i in 0..200u64 {
            let evs = vec![uev("Q", &["queued"], (round << 40) | (1 << 39) | i, 6)];
            let mut f = log.append_async(evs.clone(), None);
            let early = match Pin::new(&mut f).poll(&mut cx) {
                Poll::Ready(r) => Some(r),
                Poll::Pending => None,
            };
            if i % 2 == 0 {
                kept.push((f, early, evs));
            } else {
                drop(f);
                dropped.push(evs);
            }
        }
        let closer = log.clone();
        within("close with queued appends", move || closer.close());
        let mut acked = Acked::new();
        let (mut futs, mut early, mut given) = (Vec::new(), Vec::new(), Vec::new());
        for (f, e, evs) in kept {
            futs.push(f);
            early.push(e);
            given.push(evs);
        }
        for (r, evs) in join_rest(futs, early).into_iter().zip(given) {
            let r = r.unwrap_or_else(|e| panic!("round {round}: an append queued before close got {e:?}"));
            acked.push((r, evs));
        }
        let mut outcomes: Vec<Outcome> = racers.into_iter().map(|w| w.join().unwrap()).collect();
        outcomes.push(Outcome { acked, refused: Vec::new() });
        drop(log);
        let again = EventLog::open(&dir, opts()).unwrap();
        // The dropped futures' appends are in the log too: find them by payload.
        let events = all(&again.reader());
        let payloads: HashSet<&Bytes> = events.iter().map(|s| s.event.data()).collect();
        for evs in &dropped {
            assert!(
                payloads.contains(evs[0].data()),
                "round {round}: a queued append whose future was dropped is missing"
            );
        }
        // Everything else is exactly what was acked (the dropped ones fill the gaps).
        let mut ranges: Vec<PositionRange> =
            outcomes.iter().flat_map(|o| o.acked.iter().map(|(r, _)| *r)).collect();
        ranges.sort_by_key(|r| r.first);
        assert_eq!(events.len() as u64, ranges.iter().map(|r| r.len()).sum::<u64>() + dropped.len() as u64);
        for o in &outcomes {
            for (r, evs) in &o.acked {
                for (p, e) in r.iter().zip(evs) {
                    assert_eq!(parts(&events[p.get() as usize - 1].event), parts(e));
                }
            }
            for refused in &o.refused {
                assert!(
                    !payloads.contains(refused),
                    "round {round}: an append answered Shutdown is in the log"
                );
            }
        }
        again.close();
    }
}
