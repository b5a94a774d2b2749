//! The log's append and read semantics, one test per rule (issue 10, semantics 1-4): the
//! `after` boundary, the match rule, density and atomic visibility, and concurrency.

use crate::log_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::thread;

use bytes::Bytes;
use lanestream_log::{
    AppendCondition, AppendError, Event, EventError, EventLog, LogOptions, Query, QueryError, QueryItem,
};
use log_support::{all, ev, ev_data, pos, positions};

fn log() -> lanestream_log::WriteHandle {
    EventLog::in_memory(LogOptions::default()).unwrap()
}

// 1. The `after` boundary.

#[test]
fn after_boundary_match_at_after_does_not_conflict_at_after_plus_one_does() {
    let log = log();
    log.append(vec![ev("Other", &["x"])], None).unwrap(); // 1
    log.append(vec![ev("Hit", &["k"])], None).unwrap(); // 2: the match
    log.append(vec![ev("Other", &["y"])], None).unwrap(); // 3
    let q = Query::tags(["k"]);
    // A match at `after` (2) or earlier never conflicts ...
    for after in [2, 3] {
        let r = log.append(vec![ev("Ok", &[])], Some(AppendCondition::new(q.clone(), Some(pos(after)))));
        assert!(r.is_ok(), "after = {after}: {r:?}");
    }
    // ... one at `after + 1` does, and names it.
    let r = log.append(vec![ev("No", &[])], Some(AppendCondition::new(q.clone(), Some(pos(1)))));
    assert!(matches!(r, Err(AppendError::Conflict { at }) if at == pos(2)), "{r:?}");
    // `None` is the whole log.
    let r = log.append(vec![ev("No", &[])], Some(AppendCondition::new(q, None)));
    assert!(matches!(r, Err(AppendError::Conflict { at }) if at == pos(2)), "{r:?}");
    // The lowest match after `after` is named, not the newest.
    log.append(vec![ev("Hit", &["k"])], None).unwrap(); // 6
    let r = log.append(vec![ev("No", &[])], Some(AppendCondition::new(Query::tags(["k"]), Some(pos(2)))));
    assert!(matches!(r, Err(AppendError::Conflict { at }) if at == pos(6)), "{r:?}");
}

#[test]
fn after_none_on_an_empty_log_and_no_match_succeeds() {
    let log = log();
    let guard = AppendCondition::new(Query::tags(["k"]), None);
    assert_eq!(log.append(vec![ev("A", &["k"])], Some(guard.clone())).unwrap().first, pos(1));
    assert!(log.append(vec![ev("A", &["k"])], Some(guard)).unwrap_err().is_conflict());
}

#[test]
fn after_beyond_head_is_refused_and_consumes_no_position() {
    let log = log();
    let r = log.append(vec![ev("A", &[])], Some(AppendCondition::new(Query::All, Some(pos(1)))));
    assert!(matches!(r, Err(AppendError::AfterBeyondHead { after, head: None }) if after == pos(1)), "{r:?}");
    log.append(vec![ev("A", &[])], None).unwrap();
    let r = log.append(vec![ev("A", &[])], Some(AppendCondition::new(Query::All, Some(pos(5)))));
    assert!(
        matches!(r, Err(AppendError::AfterBeyondHead { after, head: Some(h) }) if after == pos(5) && h == pos(1))
    );
    assert_eq!(log.append(vec![ev("A", &[])], None).unwrap().first, pos(2));
}

// 2. The match rule.

#[test]
fn match_rule_types_ored_tags_anded_items_ored_same_in_read_subscribe_and_condition_data_ignored() {
    let log = log();
    let events = [
        ev_data("A", &["t1", "t2"], &b"x"[..]),      // 1: A, t1 t2
        ev_data("B", &["t1"], &b"t1 t2"[..]),        // 2: B, t1 (the payload names t2: ignored)
        ev_data("C", &["t1", "t2", "t3"], &b""[..]), // 3: C, t1 t2 t3
        ev_data("B", &["t2", "t1"], &b""[..]),       // 4: B, t1 t2 (given out of order)
        ev_data("D", &[], &b"A"[..]),                // 5: D, no tags
    ];
    for e in &events {
        log.append(vec![e.clone()], None).unwrap();
    }
    let cases: Vec<(Query, Vec<u64>)> = vec![
        (Query::All, vec![1, 2, 3, 4, 5]),
        (Query::types(["A", "B"]), vec![1, 2, 4]),
        (Query::tags(["t1", "t2"]), vec![1, 3, 4]),
        (Query::item(QueryItem::new(["B", "C"], ["t2"])), vec![3, 4]),
        (Query::items([QueryItem::of_types(["D"]), QueryItem::tagged(["t3"])]).unwrap(), vec![3, 5]),
        (
            Query::item(QueryItem::new(std::iter::empty::<&str>(), std::iter::empty::<&str>())),
            vec![1, 2, 3, 4, 5],
        ),
        (Query::types(["a"]), vec![]), // exact: no case folding
        (Query::tags(["t"]), vec![]),  // exact: no prefixes
        (Query::types(["Missing"]), vec![]),
        (Query::item(QueryItem::new(["A"], ["missing"])), vec![]),
    ];
    for (q, want) in cases {
        // read
        assert_eq!(positions(log.read(&q, None, usize::MAX).unwrap().events()), want, "read {q:?}");
        // matches() agrees with the log
        let scanned: Vec<u64> = all(&log.reader())
            .into_iter()
            .filter(|s| q.matches(&s.event))
            .map(|s| s.position.get())
            .collect();
        assert_eq!(scanned, want, "matches {q:?}");
        // subscribe
        let mut sub = log.subscribe(q.clone(), None);
        let got = match sub.try_next_batch() {
            Ok(b) => positions(&b),
            Err(_) => vec![],
        };
        assert_eq!(got, want, "subscribe {q:?}");
        // condition: conflicts at the first match, or succeeds when none
        let head = log.head();
        let r = log.append(vec![ev("Probe", &["probe"])], Some(AppendCondition::new(q.clone(), None)));
        match want.first() {
            Some(&first) => {
                assert!(matches!(r, Err(AppendError::Conflict { at }) if at.get() == first), "{q:?}: {r:?}")
            }
            None => {
                assert!(r.is_ok(), "{q:?}: {r:?}");
                // take the probe out of later cases' way: the remaining cases never match "Probe"
                assert_eq!(r.unwrap().first.get(), head.unwrap().get() + 1);
            }
        }
    }
}

#[test]
fn query_with_no_items_is_refused_at_construction() {
    assert_eq!(Query::items([]), Err(QueryError::NoItems));
    assert!(Query::items([QueryItem::tagged(["a"])]).is_ok());
}

#[test]
fn event_tags_sorted_unique_and_a_duplicate_is_refused() {
    let e = Event::new("T", ["b", "a", "c"], Bytes::new()).unwrap();
    assert_eq!(e.tags().collect::<Vec<_>>(), ["a", "b", "c"]);
    assert_eq!(Event::new("T", ["a", "b", "a"], Bytes::new()), Err(EventError::DuplicateTag("a".into())));
    assert_eq!(Event::new("", ["a"], Bytes::new()), Err(EventError::EmptyType));
    assert_eq!(Event::new("T", [""], Bytes::new()), Err(EventError::EmptyTag));
    assert!(matches!(
        Event::new("x".repeat(1025), ["a"], Bytes::new()),
        Err(EventError::NameTooLong { len: 1025, .. })
    ));
    let many: Vec<String> = (0..257).map(|i| format!("t{i}")).collect();
    assert!(matches!(Event::new("T", many, Bytes::new()), Err(EventError::TooManyTags { .. })));
}

// 3. Density and atomic visibility.

#[test]
fn positions_start_at_1_dense_and_refused_appends_consume_none() {
    let log = EventLog::in_memory(LogOptions::default().max_append_bytes(1000)).unwrap();
    assert_eq!(log.head(), None);
    let r = log.append(vec![ev("A", &["k"]), ev("B", &[]), ev("C", &[])], None).unwrap();
    assert_eq!((r.first, r.last, r.len()), (pos(1), pos(3), 3));
    assert!(matches!(log.append(vec![], None), Err(AppendError::Empty)));
    assert!(
        log.append(vec![ev("A", &[])], Some(AppendCondition::new(Query::tags(["k"]), None)))
            .unwrap_err()
            .is_conflict()
    );
    assert!(matches!(
        log.append(vec![ev("A", &[])], Some(AppendCondition::new(Query::All, Some(pos(9))))),
        Err(AppendError::AfterBeyondHead { .. })
    ));
    let big = ev_data("Big", &[], vec![0u8; 2000]);
    assert!(matches!(log.append(vec![big], None), Err(AppendError::TooLarge { max: 1000, .. })));
    let r = log.append(vec![ev("D", &[])], None).unwrap();
    assert_eq!(r.first, pos(4), "no refused append consumed a position");
    assert_eq!(positions(&all(&log.reader())), [1, 2, 3, 4]);
    // The range is in input order.
    let got: Vec<String> = all(&log.reader()).iter().map(|s| s.event.event_type().to_owned()).collect();
    assert_eq!(got, ["A", "B", "C", "D"]);
}

#[test]
fn readers_never_see_part_of_an_append() {
    let log = log();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (r, stop) = (log.reader(), stop.clone());
            thread::spawn(move || {
                let mut checks = 0u64;
                while !stop.load(Ordering::Relaxed) || checks == 0 {
                    let reads = r.read(&Query::All, None, usize::MAX).unwrap();
                    // Each append of n events carries "i/n" payloads; the pinned head ends one.
                    if let Some(last) = reads.events().last() {
                        let text = std::str::from_utf8(last.event.data()).unwrap().to_owned();
                        let (i, n) = text.split_once('/').unwrap();
                        assert_eq!(
                            i.parse::<u64>().unwrap() + 1,
                            n.parse::<u64>().unwrap(),
                            "torn view at {}",
                            last.position
                        );
                    }
                    assert_eq!(reads.events().len() as u64, reads.head().map_or(0, |h| h.get()));
                    checks += 1;
                }
                checks
            })
        })
        .collect();
    for k in 0..400u64 {
        let n = k % 7 + 1;
        let events = (0..n).map(|i| ev_data("Part", &[], format!("{i}/{n}"))).collect();
        log.append(events, None).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
}

#[test]
fn ok_range_is_readable_at_once_from_every_thread() {
    let log = log();
    let (tx, rx) = mpsc::channel::<lanestream_log::PositionRange>();
    let reader = log.reader();
    let checker = thread::spawn(move || {
        let mut n = 0;
        for range in rx {
            // read-your-writes, from another thread: the reply came after the publish.
            let reads = reader.read(&Query::All, before(range.first), range.len() as usize).unwrap();
            assert_eq!(reads.events().len() as u64, range.len(), "{range} not visible");
            assert_eq!(reads.events()[0].position, range.first);
            n += 1;
        }
        n
    });
    for k in 0..500 {
        let range = log.append(vec![ev("E", &[]); k % 3 + 1], None).unwrap();
        tx.send(range).unwrap();
    }
    drop(tx);
    assert_eq!(checker.join().unwrap(), 500);
}

/// The position just before `p` (`None` before the first).
fn before(p: lanestream_log::LogPosition) -> Option<lanestream_log::LogPosition> {
    lanestream_log::LogPosition::new(p.get() - 1)
}

// 4. Concurrency.

#[test]
fn racing_guards_exactly_one_ok_others_conflict_at_the_winner() {
    for round in 0..20 {
        let log = log();
        log.append(vec![ev("Noise", &["other"])], None).unwrap();
        let head = log.head();
        let n = 8;
        let barrier = Arc::new(Barrier::new(n));
        let guard = AppendCondition::new(Query::item(QueryItem::new(["Claimed"], ["seat:1"])), head);
        let results: Vec<_> = (0..n)
            .map(|_| {
                let (log, barrier, guard) = (log.clone(), barrier.clone(), guard.clone());
                thread::spawn(move || {
                    barrier.wait();
                    log.append(vec![ev("Claimed", &["seat:1"])], Some(guard))
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        let winners: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        let at = winners[0].first;
        for r in results.iter().filter(|r| r.is_err()) {
            assert!(matches!(r, Err(AppendError::Conflict { at: a }) if *a == at), "round {round}: {r:?}");
        }
        assert_eq!(log.head(), Some(at), "losers consumed no position");
    }
}

#[test]
fn eight_threads_250_appends_positions_1_to_2000_dense_and_read_back_exact() {
    let log = log();
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (log, barrier) = (log.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                (0..250)
                    .map(|i| {
                        let e = ev_data("W", &[&format!("thread:{t}")], format!("{t}:{i}"));
                        (log.append(vec![e.clone()], None).unwrap(), e)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let acked: Vec<_> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let mut firsts: Vec<u64> = acked.iter().map(|(r, _)| r.first.get()).collect();
    firsts.sort_unstable();
    assert_eq!(firsts, (1..=2000).collect::<Vec<_>>());
    let everything = all(&log.reader());
    assert_eq!(positions(&everything), (1..=2000).collect::<Vec<_>>());
    for (range, e) in &acked {
        assert_eq!(
            &everything[range.first.get() as usize - 1].event,
            e,
            "Ok but missing or different at {range}"
        );
    }
    // per-thread order is preserved
    for t in 0..8 {
        let mine = log.read(&Query::tags([format!("thread:{t}")]), None, usize::MAX).unwrap();
        let seq: Vec<String> =
            mine.events().iter().map(|s| String::from_utf8(s.event.data().to_vec()).unwrap()).collect();
        assert_eq!(seq, (0..250).map(|i| format!("{t}:{i}")).collect::<Vec<_>>());
    }
}

#[test]
fn read_limit_cut_short_resume_token_and_read_back() {
    let log = log();
    for i in 0..10 {
        log.append(vec![ev("E", if i % 2 == 0 { &["even"] } else { &["odd"] })], None).unwrap();
    }
    let q = Query::tags(["even"]); // 1 3 5 7 9
    let r = log.read(&q, None, 2).unwrap();
    assert_eq!(
        (positions(r.events()), r.is_cut_short(), r.resume(), r.head()),
        (vec![1, 3], true, Some(pos(3)), Some(pos(10)))
    );
    let r = log.read(&q, r.resume(), 10).unwrap();
    assert_eq!((positions(r.events()), r.is_cut_short(), r.resume()), (vec![5, 7, 9], false, Some(pos(10))));
    let r = log.read(&q, Some(pos(9)), 1).unwrap();
    assert_eq!((r.len(), r.is_cut_short()), (0, false), "exactly at the limit is not cut short");
    let r = log.read(&q, Some(pos(6)), 2).unwrap();
    assert!(!r.is_cut_short(), "7 and 9 fill the limit exactly");
    let r = log.read(&q, None, 0).unwrap();
    assert_eq!((r.len(), r.is_cut_short(), r.resume()), (0, true, None));
    // read_back: newest first
    let b = log.read_back(&q, None, 2).unwrap();
    assert_eq!((positions(b.events()), b.is_cut_short(), b.resume()), (vec![9, 7], true, Some(pos(7))));
    let b = log.read_back(&q, b.resume(), 10).unwrap();
    assert_eq!((positions(b.events()), b.is_cut_short(), b.resume()), (vec![5, 3, 1], false, None));
    assert_eq!(positions(log.read_back(&Query::All, Some(pos(4)), 10).unwrap().events()), [3, 2, 1]);
    assert_eq!(positions(log.read_back(&Query::All, Some(pos(1)), 10).unwrap().events()), Vec::<u64>::new());
}

#[test]
fn append_async_on_tokio_and_futures_executor() {
    let log = log();
    let l = log.clone();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    let ranges = rt.block_on(async move {
        let tasks: Vec<_> = (0..50)
            .map(|i| {
                let l = l.clone();
                tokio::spawn(async move {
                    l.append_async(vec![ev_data("A", &[], format!("{i}"))], None).await.unwrap()
                })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap().first.get());
        }
        out
    });
    let mut sorted = ranges.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (1..=50).collect::<Vec<_>>());
    let r = futures_executor::block_on(log.append_async(vec![ev("B", &[])], None)).unwrap();
    assert_eq!(r.first, pos(51));
    assert!(matches!(futures_executor::block_on(log.append_async(vec![], None)), Err(AppendError::Empty)));
    log.close();
    assert!(matches!(
        futures_executor::block_on(log.append_async(vec![ev("C", &[])], None)),
        Err(AppendError::Shutdown)
    ));
    assert!(matches!(log.append(vec![ev("C", &[])], None), Err(AppendError::Shutdown)));
}
