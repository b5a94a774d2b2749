//! Read-only followers (`EventLog::open_read_only`): they see each append once the writer made it
//! durable, never what is beyond the writer's commit marker, wake their subscribers, and — in
//! another process than a writer that is SIGKILLed and restarted, again and again — end up with
//! exactly the writer's log: no record the recovered log does not hold, none of the acknowledged
//! ones missing, no gap, no repeat.

use crate::log_support;

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use lanestream_log::{Event, EventLog, LogOptions, Query, SequencedEvent};
use log_support::{LIMIT, all, ev_data, temp_dir};

fn options() -> LogOptions {
    LogOptions::default().segment_bytes(4 << 10)
}

/// Waits until `f` holds, failing the test after [`LIMIT`].
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !f() {
        assert!(Instant::now() < deadline, "not within {LIMIT:?}: {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_follower_sees_every_durable_append_and_wakes_its_subscribers() {
    let dir = temp_dir("follow-basic");
    let log = EventLog::open(&dir, options()).unwrap();
    log.append(vec![ev_data("A", &["k:1"], &b"before"[..])], None).unwrap();
    let follower = EventLog::open_read_only(&dir, options()).unwrap();
    assert_eq!(all(&follower), all(&log.reader()), "the follower opens to what is durable");
    let mut sub = follower.subscribe(Query::tags(["k:1"]), follower.head());
    let reader = thread::spawn(move || {
        let mut got = Vec::new();
        while got.len() < 100 {
            let batch = sub.next_batch_timeout(LIMIT).expect("a batch in time").expect("not closed");
            got.extend(batch);
        }
        got
    });
    for i in 0..200u32 {
        let tag = if i % 2 == 0 { "k:1" } else { "k:2" };
        // Across many small segments: the follower moves from each sealed one to the next.
        log.append(vec![ev_data("B", &[tag], i.to_le_bytes().to_vec())], None).unwrap();
    }
    let got = reader.join().unwrap();
    let want: Vec<SequencedEvent> = log
        .read(&Query::tags(["k:1"]), Some(lanestream_log::LogPosition::new(1).unwrap()), usize::MAX)
        .unwrap()
        .into_events();
    assert_eq!(got, want);
    eventually("the follower's head reaches the writer's", || follower.head() == log.head());
    assert_eq!(all(&follower), all(&log.reader()));
    assert!(!follower.is_closed(), "a follower does not end with its writer");
    log.close();
}

#[test]
fn a_follower_reads_nothing_beyond_the_commit_marker() {
    let dir = temp_dir("follow-marker");
    let log = EventLog::open(&dir, options()).unwrap();
    for i in 0..3u8 {
        log.append(vec![ev_data("A", &[], vec![i])], None).unwrap();
    }
    log.close();
    drop(log);
    let last = {
        let mut segs: Vec<_> = fs::read_dir(&*dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "seg"))
            .collect();
        segs.sort();
        segs.pop().unwrap()
    };
    // Bytes beyond the marker: the start of a record, cut short — what a writer killed in the
    // middle of a write leaves. A follower that read past the marker would fail on it (a torn
    // record where it takes everything to be durable) or wait for the rest.
    let bytes = fs::read(&last).unwrap();
    let mut f = fs::OpenOptions::new().append(true).open(&last).unwrap();
    let first_record = 8 + u32::from_le_bytes(bytes[16..20].try_into().unwrap()) as usize;
    f.write_all(&bytes[16..16 + first_record - 3]).unwrap();
    drop(f);
    let follower = EventLog::open_read_only(&dir, options()).unwrap();
    thread::sleep(Duration::from_millis(50)); // many polls
    assert_eq!(follower.head().map(|h| h.get()), Some(3));
    assert!(follower.failure().is_none(), "{:?}", follower.failure());
    // The writer comes back: recovery truncates the torn tail, and the follower sees what the
    // writer then says is durable.
    let log = EventLog::open(&dir, options()).unwrap();
    assert_eq!(log.head().map(|h| h.get()), Some(3));
    log.append(vec![ev_data("C", &[], &b"after"[..])], None).unwrap();
    eventually("the follower sees the appends after the restart", || follower.head() == log.head());
    assert_eq!(all(&follower), all(&log.reader()));
    log.close();
}

#[test]
fn a_follower_of_a_directory_no_writer_opened_yet_reads_empty() {
    let dir = temp_dir("follow-empty");
    let follower = EventLog::open_read_only(&dir, options()).unwrap();
    assert_eq!(follower.head(), None);
    let log = EventLog::open(&dir, options()).unwrap();
    log.append(vec![ev_data("A", &[], &b"x"[..])], None).unwrap();
    eventually("the follower sees the first append", || follower.head() == log.head());
    log.close();
}

/// The writer child of the cross-process test (run by it, never on its own): opens the log in
/// `LANESTREAM_FOLLOW_DIR` and appends for ever, printing `ack CYCLE SEQ FIRST LAST` for each
/// acknowledged append.
#[test]
#[ignore = "the writer child of a_follower_in_another_process_..."]
fn writer_child() {
    let Ok(dir) = std::env::var("LANESTREAM_FOLLOW_DIR") else { return };
    let cycle: u64 = std::env::var("LANESTREAM_FOLLOW_CYCLE").unwrap().parse().unwrap();
    let log = EventLog::open(&dir, options()).unwrap();
    let out = std::io::stdout();
    println!("open");
    for seq in 0u64.. {
        let n = 1 + (seq % 3);
        let events: Vec<Event> = (0..n)
            .map(|i| ev_data("W", &[&format!("c:{cycle}")], format!("{cycle}:{seq}:{i}").into_bytes()))
            .collect();
        let r = log.append(events, None).unwrap();
        writeln!(out.lock(), "ack {cycle} {seq} {} {}", r.first.get(), r.last.get()).unwrap();
    }
}

#[cfg(unix)]
#[test]
fn a_follower_in_another_process_than_a_sigkilled_and_restarted_writer_misses_nothing_and_sees_nothing_undurable()
 {
    let dir = temp_dir("follow-kill");
    fs::create_dir_all(&*dir).unwrap();
    let follower = EventLog::open_read_only(&dir, options()).unwrap();
    let mut sub = follower.subscribe(Query::All, None);
    let seen = thread::spawn(move || {
        let mut seen: Vec<SequencedEvent> = Vec::new();
        loop {
            match sub.next_batch_timeout(Duration::from_secs(3)) {
                Ok(Some(batch)) => seen.extend(batch),
                Ok(None) => unreachable!("a follower's subscription does not close"),
                Err(lanestream_log::NextTimeoutError::Timeout) => return seen,
                Err(e) => panic!("follower: {e}"),
            }
        }
    });
    let exe = std::env::current_exe().unwrap();
    let mut acks: Vec<(u64, u64, u64, u64)> = Vec::new();
    for cycle in 0..6u64 {
        let mut child = Command::new(&exe)
            .args(["--ignored", "--exact", log_support::test_name(module_path!(), "writer_child").as_str()])
            .args(["--nocapture", "--test-threads", "1"])
            .env("LANESTREAM_FOLLOW_DIR", &*dir)
            .env("LANESTREAM_FOLLOW_CYCLE", cycle.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        // Read its acks on a thread; kill it after a while of appending (mid-append, mid-fsync,
        // mid-seal: wherever it is).
        let reader = thread::spawn(move || {
            let mut acks = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let f: Vec<u64> = line.split(' ').skip(1).filter_map(|s| s.parse().ok()).collect();
                if line.starts_with("ack ") && f.len() == 4 {
                    acks.push((f[0], f[1], f[2], f[3]));
                }
            }
            acks
        });
        thread::sleep(Duration::from_millis(150 + 70 * cycle));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        acks.extend(reader.join().unwrap());
    }
    // The writer restarted once more, to recover and say what is durable; the follower then
    // catches up to it.
    let log = EventLog::open(&dir, options()).unwrap();
    let log_events = all(&log.reader());
    log.close();
    let seen = seen.join().unwrap();
    assert!(acks.len() > 50, "the writers acknowledged only {} appends", acks.len());
    // The follower saw exactly the recovered log: dense from 1, in order, byte for byte — no
    // record the log does not hold (nothing beyond a durable marker), none missing.
    assert_eq!(
        seen.len(),
        log_events.len(),
        "the follower saw {} events, the log holds {}",
        seen.len(),
        log_events.len()
    );
    assert!(seen == log_events, "the follower's events differ from the log's");
    // Every acknowledged append is there, at its acknowledged positions.
    let by_position: HashMap<u64, &SequencedEvent> = seen.iter().map(|e| (e.position.get(), e)).collect();
    for (cycle, seq, first, last) in &acks {
        for (i, p) in (*first..=*last).enumerate() {
            let e = by_position.get(&p).unwrap_or_else(|| panic!("acknowledged position {p} missing"));
            assert_eq!(&e.event.data()[..], format!("{cycle}:{seq}:{i}").as_bytes(), "position {p}");
        }
    }
}

/// Prints a follower's wake-up latency: from an append's return on the writer to its delivery
/// by a follower's blocking subscription, 300 appends one at a time (not a timed assertion:
/// run by hand, `cargo test --release -p lanestream-log --test event_log follow:: -- --ignored --nocapture`).
#[test]
#[ignore = "prints the wake-up latency; run by hand"]
fn follower_wake_up_latency() {
    let dir = temp_dir("follow-latency");
    let log = EventLog::open(&dir, options()).unwrap();
    let follower = EventLog::open_read_only(&dir, options()).unwrap();
    let mut sub = follower.subscribe(Query::All, None);
    let n = 300usize;
    // Per event, when the follower's subscription delivered it.
    let waiter = thread::spawn(move || {
        let mut delivered = Vec::new();
        while delivered.len() < n {
            let batch = sub.next_batch_timeout(LIMIT).unwrap().unwrap();
            let now = Instant::now();
            delivered.extend(batch.iter().map(|_| now));
        }
        delivered
    });
    // Per event, when its append returned on the writer.
    let mut acked = Vec::new();
    for i in 0..n as u32 {
        log.append(vec![ev_data("L", &[], i.to_le_bytes().to_vec())], None).unwrap();
        acked.push(Instant::now());
        thread::sleep(Duration::from_millis(3));
    }
    let delivered = waiter.join().unwrap();
    let mut lat: Vec<Duration> =
        acked.iter().zip(&delivered).map(|(a, d)| d.saturating_duration_since(*a)).collect();
    lat.sort();
    let q = |f: f64| lat[((lat.len() - 1) as f64 * f) as usize];
    eprintln!(
        "follower wake-up after an append returned (poll interval {:?}): median {:?}, p90 {:?}, p99 {:?}, max {:?}",
        Duration::from_millis(1),
        q(0.5),
        q(0.9),
        q(0.99),
        lat[lat.len() - 1]
    );
    log.close();
}
