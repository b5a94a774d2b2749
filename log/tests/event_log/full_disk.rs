//! A full disk: the append that does not fit fails with `Io`, the log stops taking writes
//! (`Failed`), and nothing acknowledged is lost — every acknowledged append reads back, and a
//! reopen on the still-full file system recovers every one of them.
//!
//! Needs a tiny file system: ignored by default; `scripts/log-full-disk.sh` mounts a 512 KiB
//! tmpfs (as root) and runs it with `LANESTREAM_TINY_TMPFS` pointing there.

use crate::log_support;

use lanestream_log::{AppendError, EventLog, LogOptions, LogPosition};
use log_support::ev_data;

#[test]
#[ignore = "needs a tiny tmpfs: scripts/log-full-disk.sh"]
fn a_full_disk_fails_the_append_with_io_stops_the_log_and_loses_nothing_acknowledged() {
    let base = std::env::var("LANESTREAM_TINY_TMPFS").expect("LANESTREAM_TINY_TMPFS: a tiny mounted tmpfs");
    let dir = std::path::Path::new(&base).join("log");
    let _ = std::fs::remove_dir_all(&dir);
    let options = LogOptions::default().segment_bytes(32 << 10);
    let log = EventLog::open(&dir, options.clone()).unwrap();
    let payload = |i: u32| -> Vec<u8> { (0..1000u32).map(|b| (b ^ i) as u8).collect() };
    let mut acked = Vec::new();
    let err = loop {
        let i = acked.len() as u32;
        assert!(i < 100_000, "the file system never filled up");
        match log.append(vec![ev_data("T", &["full"], payload(i))], None) {
            Ok(range) => acked.push(range.first.get()),
            Err(e) => break e,
        }
    };
    assert!(matches!(&err, AppendError::Io(e) if e.raw_os_error() == Some(28)), "ENOSPC expected: {err:?}");
    assert!(acked.len() > 100, "only {} appends fit", acked.len());
    // The log stops taking writes: the fsync is never retried.
    let again = log.append(vec![ev_data("T", &[], &b"x"[..])], None);
    assert!(matches!(again, Err(AppendError::Failed(_))), "{again:?}");
    let check = |log: &lanestream_log::ReadHandle| {
        for (i, p) in acked.iter().enumerate() {
            let e = log.get(LogPosition::new(*p).unwrap()).unwrap().expect("an acknowledged append");
            assert_eq!(&e.event.data()[..], &payload(i as u32)[..], "position {p}");
        }
    };
    check(&log.reader());
    log.close();
    drop(log);
    // Reopened on the still-full file system: the torn tail goes, every acknowledged append stays.
    let log = EventLog::open(&dir, options).unwrap();
    let head = log.head().map_or(0, |h| h.get());
    assert!(head >= *acked.last().unwrap(), "head {head} below the last acknowledged append");
    check(&log.reader());
    log.close();
}
