//! The child and the checker of the log's crash test (`scripts/log-crash.sh`).
//!
//! ```text
//! log_crash_child append DIR CYCLE     open DIR, print "open HEAD", then append forever (4
//!                                      threads, some appends conditional), printing
//!                                      "ack CYCLE THREAD SEQ FIRST LAST" for each acknowledged
//!                                      append, until killed
//! log_crash_child verify DIR ACKS      reopen DIR and check it against every complete ack line
//! log_crash_child follow DIR OUT       a read-only follower of DIR (in its own process, across
//!                                      every writer's kill and restart): print "POSITION KEY" to
//!                                      OUT for every event its subscription delivers, for ever
//! log_crash_child follow-check DIR OUT wait until OUT covers the log in DIR and check that it is
//!                                      exactly the log: positions 1, 2, ... in order, each event's
//!                                      key the log's at that position (nothing the writer had not
//!                                      made durable, nothing missed, no repeat)
//! ```
//!
//! Every event is a pure function of the prefix of its payload (`cycle:thread:seq:i:n:kind:param|`),
//! so the checker can rebuild each one and compare it byte for byte. Kinds: `p` plain, `u` claims
//! a unique slot (condition: no event tagged `slot:K` anywhere), `k` a counter increment
//! (condition: no `counter` event after the head the count was read at; param = the count).

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::thread;

use lanestream_log::{
    AppendCondition, AppendError, Event, EventLog, LogOptions, LogPosition, Query, SequencedEvent,
};

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The identity of one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    cycle: u64,
    thread: u64,
    seq: u64,
    i: u64,
    n: u64,
    kind: char,
    param: u64,
}

/// The one event `key` stands for.
fn make(key: Key) -> Event {
    let Key { cycle, thread, seq, i, n, kind, param } = key;
    let h = mix(cycle << 40 ^ thread << 32 ^ seq << 8 ^ i);
    let mut data = format!("{cycle}:{thread}:{seq}:{i}:{n}:{kind}:{param}|").into_bytes();
    data.extend((0..h % 300).map(|j| (mix(h ^ j) & 0xFF) as u8));
    let ty = ["Created", "Updated", "Removed"][(h % 3) as usize];
    let mut tags = vec![format!("thread:{thread}"), format!("bucket:{}", h % 5)];
    match kind {
        'u' if i == 0 => tags.push(format!("slot:{param}")),
        'k' => tags.push("counter".into()),
        _ => {}
    }
    Event::new(ty, tags, data).expect("valid event")
}

fn parse(e: &Event) -> Option<Key> {
    let data = e.data();
    let end = data.iter().position(|&b| b == b'|')?;
    let text = std::str::from_utf8(&data[..end]).ok()?;
    let f: Vec<&str> = text.split(':').collect();
    if f.len() != 7 {
        return None;
    }
    let num = |s: &str| s.parse::<u64>().ok();
    Some(Key {
        cycle: num(f[0])?,
        thread: num(f[1])?,
        seq: num(f[2])?,
        i: num(f[3])?,
        n: num(f[4])?,
        kind: f[5].chars().next()?,
        param: num(f[6])?,
    })
}

/// Small segments, so that segments are sealed (their index files written: a temporary file,
/// fsynced, renamed) every few dozen appends and a kill lands in an index write often.
fn options() -> LogOptions {
    LogOptions::default().segment_bytes(16 << 10)
}

fn append(dir: &str, cycle: u64) -> ExitCode {
    let log = match EventLog::open(dir, options()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("open: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Tell the script recovery is over (the checker skips every line but "ack ...").
    println!("open {}", log.head().map_or(0, LogPosition::get));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let log = log.clone();
            thread::spawn(move || {
                let out = std::io::stdout();
                for seq in 0.. {
                    let h = mix(cycle << 40 ^ t << 32 ^ seq);
                    let (kind, param, condition) = match (t, h % 4) {
                        (0, 0) => {
                            let slot = (h >> 16) % 2048;
                            (
                                'u',
                                slot,
                                Some(AppendCondition::new(Query::tags([format!("slot:{slot}")]), None)),
                            )
                        }
                        (1, _) => {
                            let seen = log.read(&Query::tags(["counter"]), None, usize::MAX).unwrap();
                            (
                                'k',
                                seen.len() as u64,
                                Some(AppendCondition::new(Query::tags(["counter"]), seen.head())),
                            )
                        }
                        _ => ('p', 0, None),
                    };
                    let n = if kind == 'k' { 1 } else { h % 4 + 1 };
                    let events =
                        (0..n).map(|i| make(Key { cycle, thread: t, seq, i, n, kind, param })).collect();
                    match log.append(events, condition) {
                        Ok(r) => {
                            let mut o = out.lock();
                            writeln!(o, "ack {cycle} {t} {seq} {} {}", r.first, r.last).expect("stdout");
                        }
                        Err(AppendError::Conflict { .. }) => {}
                        Err(e) => panic!("append failed: {e}"),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("appender");
    }
    ExitCode::SUCCESS
}

fn verify(dir: &str, acks: &str) -> Result<String, String> {
    let log = EventLog::open(dir, options()).map_err(|e| format!("open: {e}"))?;
    let events: Vec<SequencedEvent> =
        log.read(&Query::All, None, usize::MAX).map_err(|e| format!("read: {e}"))?.into_events();
    log.close();
    drop(log);
    // The sealed segments' index files (as the kill left them, then as the open above rebuilt
    // any it did not trust) give the same log as a scan of every segment.
    let mut indexes = 0;
    for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_some_and(|x| x == "idx") {
            std::fs::remove_file(&path).map_err(|e| e.to_string())?;
            indexes += 1;
        }
    }
    let log = EventLog::open(dir, options()).map_err(|e| format!("open without index files: {e}"))?;
    let scanned = log.read(&Query::All, None, usize::MAX).map_err(|e| format!("read: {e}"))?.into_events();
    if scanned != events {
        return Err(format!(
            "the log read through {indexes} index files ({} events) differs from a scan of its segments ({} events)",
            events.len(),
            scanned.len()
        ));
    }
    let head = log.head().map_or(0, LogPosition::get);
    if events.len() as u64 != head {
        return Err(format!("{} events read, head {head}", events.len()));
    }
    // Every event is one of ours, byte for byte, and appends are whole and contiguous.
    let mut groups: HashMap<(u64, u64, u64), (u64, u64)> = HashMap::new();
    let mut slots: HashMap<u64, (u64, u64, u64)> = HashMap::new();
    let mut counter = 0u64;
    let mut at = 0usize;
    while at < events.len() {
        let first = &events[at];
        if first.position.get() != at as u64 + 1 {
            return Err(format!("position {} at index {at}: not dense", first.position));
        }
        let key =
            parse(&first.event).ok_or_else(|| format!("event at {} is not one of ours", first.position))?;
        if key.i != 0 {
            return Err(format!("append at {} starts with event {} of {}", first.position, key.i, key.n));
        }
        for i in 0..key.n {
            let e = events
                .get(at + i as usize)
                .ok_or_else(|| format!("append at {} is cut short", first.position))?;
            let want = make(Key { i, ..key });
            if e.event != want || e.position.get() != first.position.get() + i {
                return Err(format!(
                    "event at {} differs from what was appended ({:?})",
                    e.position,
                    Key { i, ..key }
                ));
            }
        }
        let id = (key.cycle, key.thread, key.seq);
        let range = (first.position.get(), first.position.get() + key.n - 1);
        if groups.insert(id, range).is_some() {
            return Err(format!("append {id:?} appears twice"));
        }
        match key.kind {
            'u' => {
                if let Some(prev) = slots.insert(key.param, id) {
                    return Err(format!("slot {} claimed twice: {prev:?} and {id:?}", key.param));
                }
            }
            'k' => {
                if key.param != counter {
                    return Err(format!(
                        "counter event at {} counted {} but {counter} came before",
                        first.position, key.param
                    ));
                }
                counter += 1;
            }
            _ => {}
        }
        at += key.n as usize;
    }
    // Every acknowledged append is there, at its position.
    let file = std::fs::File::open(acks).map_err(|e| format!("{acks}: {e}"))?;
    let mut acked = 0;
    let mut seen = HashSet::new();
    for line in std::io::BufReader::new(file).split(b'\n') {
        let line = line.map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&line);
        let f: Vec<u64> = text.split(' ').skip(1).filter_map(|s| s.parse().ok()).collect();
        if !text.starts_with("ack ") || f.len() != 5 {
            continue; // a line the kill cut short (only ever the last of a cycle)
        }
        let (id, range) = ((f[0], f[1], f[2]), (f[3], f[4]));
        if !seen.insert(id) {
            return Err(format!("ack {id:?} printed twice"));
        }
        match groups.get(&id) {
            Some(r) if *r == range => acked += 1,
            Some(r) => return Err(format!("acknowledged append {id:?} at {range:?} sits at {r:?}")),
            None => return Err(format!("acknowledged append {id:?} at {range:?} is missing")),
        }
    }
    Ok(format!(
        "{head} events, {} appends ({acked} acknowledged, {} durable without an ack), {} slots, counter {counter}, {indexes} index files",
        groups.len(),
        groups.len() - acked,
        slots.len()
    ))
}

/// An event's key: its payload up to the `|`.
fn key_text(e: &Event) -> String {
    let data = e.data();
    let end = data.iter().position(|&b| b == b'|').unwrap_or(data.len());
    String::from_utf8_lossy(&data[..end]).into_owned()
}

fn follow(dir: &str, out: &str) -> ExitCode {
    let log = match EventLog::open_read_only(dir, options()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("follow: open: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut file = std::io::BufWriter::new(std::fs::File::create(out).expect("follower output"));
    let mut sub = log.subscribe(Query::All, None);
    loop {
        match sub.next_batch() {
            Ok(Some(batch)) => {
                for e in batch {
                    writeln!(file, "{} {}", e.position.get(), key_text(&e.event)).expect("write");
                }
                file.flush().expect("flush");
            }
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("follow: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
}

fn follow_check(dir: &str, out: &str) -> Result<String, String> {
    let log = EventLog::open_read_only(dir, options()).map_err(|e| format!("open: {e}"))?;
    let events = log.read(&Query::All, None, usize::MAX).map_err(|e| format!("read: {e}"))?.into_events();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let lines = loop {
        let text = std::fs::read_to_string(out).unwrap_or_default();
        // Only whole lines: the follower may be writing the last one.
        let lines: Vec<String> = text
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .map(|l| l.trim_end().to_owned())
            .collect();
        if lines.len() >= events.len() {
            break lines;
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "the follower delivered {} events of the log's {}",
                lines.len(),
                events.len()
            ));
        }
        thread::sleep(std::time::Duration::from_millis(20));
    };
    if lines.len() != events.len() {
        return Err(format!("the follower delivered {} events, the log holds {}", lines.len(), events.len()));
    }
    for (line, e) in lines.iter().zip(&events) {
        let want = format!("{} {}", e.position.get(), key_text(&e.event));
        if *line != want {
            return Err(format!("the follower delivered {line:?} where the log holds {want:?}"));
        }
    }
    Ok(format!("the follower delivered exactly the log's {} events", events.len()))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[1..] {
        ["append", dir, cycle] => append(dir, cycle.parse().expect("cycle number")),
        ["verify", dir, acks] => match verify(dir, acks) {
            Ok(summary) => {
                println!("ok: {summary}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                println!("FAIL: {e}");
                ExitCode::FAILURE
            }
        },
        ["follow", dir, out] => follow(dir, out),
        ["follow-check", dir, out] => match follow_check(dir, out) {
            Ok(summary) => {
                println!("ok: {summary}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                println!("FAIL: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!(
                "usage: log_crash_child append DIR CYCLE | verify DIR ACKS | follow DIR OUT | follow-check DIR OUT"
            );
            ExitCode::from(2)
        }
    }
}
