//! Durability (issue 10, semantics 7): what survives a reopen, torn tails, corruption, segment
//! rolling, and the conflict state across recovery. (Failed fsyncs and short writes are injected
//! in the unit tests of `lanestream_log`, which can wrap the storage.)

use crate::log_support;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;

use lanestream_log::{AppendCondition, AppendError, EventLog, LogOptions, OpenError, Query, ReadError};
use log_support::{all, ev, ev_data, pos, positions, temp_dir};

fn segments(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    v.sort();
    v
}

#[test]
fn reopen_recovers_every_acknowledged_append_byte_exact_and_resumes_at_max_plus_one() {
    let dir = temp_dir("reopen");
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    let mut written = Vec::new();
    for i in 0..200u32 {
        let n = i % 4 + 1;
        let events: Vec<_> = (0..n)
            .map(|k| {
                ev_data(
                    &format!("T{}", i % 3),
                    &[&format!("a:{i}"), "all"],
                    vec![k as u8; (i * 7 % 300) as usize],
                )
            })
            .collect();
        let r = log.append(events.clone(), None).unwrap();
        written.push((r, events));
    }
    let before = all(&log.reader());
    log.close();
    drop(log);
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    assert_eq!(all(&log.reader()), before);
    for (r, events) in &written {
        let got = log
            .read(
                &Query::All,
                pos(r.first.get()).get().checked_sub(1).and_then(lanestream_log::LogPosition::new),
                events.len(),
            )
            .unwrap();
        assert_eq!(got.events().iter().map(|s| s.event.clone()).collect::<Vec<_>>(), *events);
    }
    let head = log.head().unwrap();
    assert_eq!(log.append(vec![ev("Next", &[])], None).unwrap().first.get(), head.get() + 1);
    // the index is rebuilt: a selective read answers the same
    assert_eq!(log.read(&Query::tags(["a:17"]), None, 100).unwrap().len(), 2);
}

#[test]
fn conflict_state_survives_recovery() {
    let dir = temp_dir("conflict");
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    log.append(vec![ev("Noise", &[])], None).unwrap();
    let claimed = log
        .append(vec![ev("Claimed", &["seat:7"])], Some(AppendCondition::new(Query::tags(["seat:7"]), None)))
        .unwrap();
    drop(log);
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    let r = log
        .append(vec![ev("Claimed", &["seat:7"])], Some(AppendCondition::new(Query::tags(["seat:7"]), None)));
    assert!(matches!(r, Err(AppendError::Conflict { at }) if at == claimed.first), "{r:?}");
    // and `after` is checked against the recovered head
    let r = log.append(vec![ev("X", &[])], Some(AppendCondition::new(Query::All, Some(pos(3)))));
    assert!(matches!(r, Err(AppendError::AfterBeyondHead { head: Some(h), .. }) if h == pos(2)), "{r:?}");
    assert!(
        log.append(
            vec![ev("Claimed", &["seat:7"])],
            Some(AppendCondition::new(Query::tags(["seat:7"]), Some(pos(2))))
        )
        .is_ok()
    );
}

#[test]
fn torn_tail_is_truncated_never_exposed_and_appends_resume() {
    let dir = temp_dir("torn");
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    for i in 0..5 {
        log.append(vec![ev_data("E", &["k"], format!("payload {i}"))], None).unwrap();
    }
    let acked = all(&log.reader());
    drop(log);
    let seg = segments(&dir).pop().unwrap();
    let full = fs::read(&seg).unwrap();
    // Every possible tear of one more record, and of garbage, at every length.
    let extra = {
        let log_dir = temp_dir("torn-source");
        let l = EventLog::open(&log_dir, LogOptions::default()).unwrap();
        for i in 0..5 {
            l.append(vec![ev_data("E", &["k"], format!("payload {i}"))], None).unwrap();
        }
        l.append(vec![ev_data("Torn", &["k", "z"], "never acknowledged"), ev("Torn", &[])], None).unwrap();
        drop(l);
        let bytes = fs::read(segments(&log_dir).pop().unwrap()).unwrap();
        bytes[full.len()..].to_vec()
    };
    for cut in (1..extra.len()).step_by(3).chain([extra.len() - 1]) {
        fs::write(&seg, [&full[..], &extra[..cut]].concat()).unwrap();
        let log = EventLog::open(&dir, LogOptions::default()).unwrap();
        assert_eq!(all(&log.reader()), acked, "cut at {cut}: no phantom, nothing lost");
        assert_eq!(fs::metadata(&seg).unwrap().len(), full.len() as u64, "torn tail truncated");
        drop(log);
    }
    // Garbage after the last record, and a flipped byte in the last record's CRC range.
    let mut garbage = full.clone();
    garbage.extend_from_slice(&[0xAB; 37]);
    fs::write(&seg, &garbage).unwrap();
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    assert_eq!(all(&log.reader()), acked);
    // The complete extra record is a valid, whole append (never acknowledged, but whole): it is kept.
    drop(log);
    fs::write(&seg, [&full[..], &extra[..]].concat()).unwrap();
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    assert_eq!(positions(&all(&log.reader())), [1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(log.append(vec![ev("Resumed", &[])], None).unwrap().first, pos(8));
}

#[test]
fn torn_last_record_with_a_bad_crc_is_truncated() {
    let dir = temp_dir("crc-tail");
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    log.append(vec![ev("A", &[])], None).unwrap();
    log.append(vec![ev("B", &[])], None).unwrap();
    drop(log);
    let seg = segments(&dir).pop().unwrap();
    let mut bytes = fs::read(&seg).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xFF; // the last record's payload
    fs::write(&seg, &bytes).unwrap();
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    assert_eq!(positions(&all(&log.reader())), [1]);
    assert_eq!(log.append(vec![ev("C", &[])], None).unwrap().first, pos(2));
}

#[test]
fn segments_roll_and_recover_across_files() {
    let dir = temp_dir("roll");
    let options = LogOptions::default().segment_bytes(512);
    let log = EventLog::open(&dir, options.clone()).unwrap();
    for i in 0..100 {
        log.append(vec![ev_data("E", &[&format!("n:{}", i % 10)], vec![i as u8; 40])], None).unwrap();
    }
    let before = all(&log.reader());
    drop(log);
    let segs = segments(&dir);
    assert!(segs.len() > 5, "rolled into {} segments", segs.len());
    let log = EventLog::open(&dir, options.clone()).unwrap();
    assert_eq!(all(&log.reader()), before);
    assert_eq!(log.read(&Query::tags(["n:3"]), None, 100).unwrap().len(), 10);
    assert_eq!(log.append(vec![ev("Next", &[])], None).unwrap().first, pos(101));
    drop(log);
    // A damaged event in a sealed segment (not the last) whose index file is whole: the open
    // takes the segment from its index (it does not read every record), and the read of the
    // damaged event is refused naming the file and the event's offset (its frame: 16 bytes of
    // header, 20 of record head); every other event reads, nothing is cut.
    let victim = &segs[1];
    let mut bytes = fs::read(victim).unwrap();
    bytes[60] ^= 0x01;
    fs::write(victim, &bytes).unwrap();
    let sizes: Vec<u64> = segs.iter().map(|p| fs::metadata(p).unwrap().len()).collect();
    let log = EventLog::open(&dir, options.clone()).unwrap();
    let err = log.read(&Query::All, None, usize::MAX).unwrap_err();
    assert!(
        matches!(&err, ReadError::Corrupt { segment, offset: 36, .. } if segment.ends_with(victim.file_name().unwrap())),
        "{err}"
    );
    let first_of_victim: u64 = victim.file_stem().unwrap().to_str().unwrap().parse().unwrap();
    let others = log.read(&Query::All, Some(pos(first_of_victim)), usize::MAX).unwrap();
    assert_eq!(others.events().first().map(|e| e.position.get()), Some(first_of_victim + 1));
    drop(log);
    // Without the index, the open scans the segment and refuses it: corruption, nothing cut.
    fs::remove_file(victim.with_extension("idx")).unwrap();
    let err = EventLog::open(&dir, options).unwrap_err();
    assert!(
        matches!(&err, OpenError::Corrupt { segment, offset: 16, .. } if segment.ends_with(victim.file_name().unwrap())),
        "{err}"
    );
    assert_eq!(
        segs.iter().map(|p| fs::metadata(p).unwrap().len()).collect::<Vec<_>>(),
        sizes,
        "nothing truncated"
    );
}

#[test]
fn a_missing_segment_is_corruption() {
    let dir = temp_dir("gap");
    let options = LogOptions::default().segment_bytes(200);
    let log = EventLog::open(&dir, options.clone()).unwrap();
    for _ in 0..30 {
        log.append(vec![ev_data("E", &[], vec![1; 50])], None).unwrap();
    }
    drop(log);
    let segs = segments(&dir);
    fs::remove_file(&segs[1]).unwrap();
    assert!(matches!(EventLog::open(&dir, options), Err(OpenError::Corrupt { .. })));
}

#[test]
fn a_foreign_file_is_refused_and_an_empty_torn_segment_header_is_rewritten() {
    let dir = temp_dir("foreign");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(format!("{:020}.seg", 1)), b"this is not a log segment at all").unwrap();
    assert!(matches!(EventLog::open(&dir, LogOptions::default()), Err(OpenError::Corrupt { .. })));
    // A header torn at creation (a prefix of the magic) is rewritten.
    fs::write(dir.join(format!("{:020}.seg", 1)), b"LSL").unwrap();
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    assert_eq!(log.head(), None);
    assert_eq!(log.append(vec![ev("A", &[])], None).unwrap().first, pos(1));
    drop(log);
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    assert_eq!(log.head(), Some(pos(1)));
}

#[test]
fn already_open_in_this_process_is_refused_until_closed() {
    let dir = temp_dir("twice");
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    assert!(matches!(EventLog::open(&dir, LogOptions::default()), Err(OpenError::AlreadyOpen(_))));
    log.close();
    let again = EventLog::open(&dir, LogOptions::default()).unwrap();
    again.close();
}

#[test]
fn invalid_options_are_refused() {
    for options in [
        LogOptions::default().queue_capacity(0),
        LogOptions::default().max_drain_requests(0),
        LogOptions::default().max_append_bytes(0),
        LogOptions::default().subscription_batch(0),
        LogOptions::default().segment_bytes(0),
    ] {
        assert!(matches!(EventLog::in_memory(options), Err(OpenError::InvalidOption(_))));
    }
}

#[test]
fn bytes_appended_to_the_last_segment_outside_the_log_are_garbage_tail() {
    let dir = temp_dir("append-outside");
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    log.append(vec![ev("A", &[])], None).unwrap();
    drop(log);
    let seg = segments(&dir).pop().unwrap();
    // a frame claiming a huge length
    OpenOptions::new()
        .append(true)
        .open(&seg)
        .unwrap()
        .write_all(&[0xFF, 0xFF, 0xFF, 0x7F, 0, 0, 0, 0, 1, 2])
        .unwrap();
    let log = EventLog::open(&dir, LogOptions::default()).unwrap();
    assert_eq!(positions(&all(&log.reader())), [1]);
}
