//! The type/tag index against a full scan (proptest): for random logs and random queries, a
//! read, a read_back and a condition check answer exactly what filtering every event with
//! `Query::matches` answers.

use crate::log_support;

use lanestream_log::{
    AppendCondition, AppendError, Event, EventLog, LogOptions, LogPosition, Query, QueryItem,
};
use log_support::all;
use proptest::prelude::*;

const TYPES: [&str; 4] = ["A", "B", "C", "D"];
const TAGS: [&str; 6] = ["t0", "t1", "t2", "t3", "t4", "t5"];

fn event() -> impl Strategy<Value = Event> {
    (0..TYPES.len(), proptest::sample::subsequence(TAGS.to_vec(), 0..4), any::<u8>())
        .prop_map(|(t, tags, d)| Event::new(TYPES[t], tags, vec![d]).unwrap())
}

fn item() -> impl Strategy<Value = QueryItem> {
    (
        proptest::sample::subsequence([TYPES.to_vec(), vec!["Unknown"]].concat(), 0..3),
        proptest::sample::subsequence([TAGS.to_vec(), vec!["unknown"]].concat(), 0..3),
    )
        .prop_map(|(types, tags)| QueryItem::new(types, tags))
}

fn query() -> impl Strategy<Value = Query> {
    prop_oneof![
        1 => Just(Query::All),
        6 => proptest::collection::vec(item(), 1..4).prop_map(|items| Query::items(items).unwrap()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    #[test]
    fn index_answers_equal_full_scan_answers(
        appends in proptest::collection::vec(proptest::collection::vec(event(), 1..4), 0..40),
        queries in proptest::collection::vec((query(), 0u64..60, 0usize..12), 1..8),
    ) {
        let log = EventLog::in_memory(LogOptions::default()).unwrap();
        for a in appends {
            log.append(a, None).unwrap();
        }
        for (q, after, limit) in queries {
            // (re-read each time: a condition that holds appends its probe)
            let everything = all(&log.reader());
            let head = everything.len() as u64;
            let scan: Vec<u64> = everything.iter().filter(|e| q.matches(&e.event)).map(|e| e.position.get()).collect();
            let after_p = LogPosition::new(after.min(head));
            let a = after.min(head);
            // read
            let want: Vec<u64> = scan.iter().copied().filter(|&p| p > a).collect();
            let r = log.read(&q, after_p, limit).unwrap();
            let got: Vec<u64> = r.events().iter().map(|e| e.position.get()).collect();
            prop_assert_eq!(&got[..], &want[..want.len().min(limit)], "read {:?} after {}", q, a);
            prop_assert_eq!(r.is_cut_short(), want.len() > limit);
            // read_back below `after + 1`
            let before = LogPosition::new(a + 1);
            let want_back: Vec<u64> = scan.iter().rev().copied().filter(|&p| p <= a).collect();
            let b = log.read_back(&q, before, limit).unwrap();
            let got_back: Vec<u64> = b.events().iter().map(|e| e.position.get()).collect();
            prop_assert_eq!(&got_back[..], &want_back[..want_back.len().min(limit)], "read_back {:?} before {}", q, a + 1);
            // condition: the lowest match after `after`, or none
            let probe = Event::new("Probe", ["probe"], vec![]).unwrap();
            let cond = AppendCondition::new(q.clone(), after_p);
            match (log.append(vec![probe], Some(cond)), want.first()) {
                (Err(AppendError::Conflict { at }), Some(&first)) => prop_assert_eq!(at.get(), first),
                (Ok(r), None) => prop_assert_eq!(r.first.get(), head + 1),
                (r, w) => prop_assert!(false, "condition {:?} after {}: {:?}, expected {:?}", q, a, r, w),
            }
        }
    }
}
