//! What a durable log keeps in memory: no payloads (they stay in the segment files), a record
//! cache within its budget, and — printed by the ignored test, with what opening costs (not a
//! timed assertion: speed is the benches' job) — the bytes per event its index holds. Run the
//! ignored one by hand:
//!
//! ```text
//! cargo test --release -p lanestream-log --test footprint -- --ignored --nocapture
//! LANESTREAM_FOOTPRINT_EVENTS=8000000 LANESTREAM_FOOTPRINT_DIR=/dev/shm cargo test ...
//! ```
//!
//! The log: `LANESTREAM_FOOTPRINT_EVENTS` events (default 1,000,000), in appends of
//! `LANESTREAM_FOOTPRINT_BATCH` events (default 1), each of one of four types with one tag of
//! `LANESTREAM_FOOTPRINT_TAGS` (default 10,000; `entity:N`) and a 256-byte payload, in 8 MiB
//! segments, under `LANESTREAM_FOOTPRINT_DIR` (default the system's temp directory). The peer
//! bench's cold row has the shape `EVENTS=8000000 TAGS=800000 BATCH=512` (10 events per tag). The memory
//! figure is the heap the open allocated and still holds (a counting global allocator), divided
//! by the events; it excludes the cache, which this run never fills (no payload is read).

use std::alloc::{GlobalAlloc, Layout, System};
use std::fs;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::thread;
use std::time::Instant;

use lanestream_log::{Event, EventLog, LogOptions, Query};

/// Counts the bytes allocated and not yet freed.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
/// The most `LIVE` has been since the last [`reset_peak`].
static PEAK: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to `System` with the caller's own arguments; the counter
// only observes the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // Relaxed: a statistic read after the threads that allocate have been joined.
        let live = LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed) + layout.size() as isize;
        // Relaxed: as above.
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Relaxed: as above.
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this `layout`, i.e. from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Relaxed: as above.
        let grown = new_size as isize - layout.size() as isize;
        let live = LIVE.fetch_add(grown, Ordering::Relaxed) + grown;
        // Relaxed: as above. (`realloc` may hold both blocks at once; the peak counts the new
        // size only, as a lower bound.)
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: `ptr` came from `System` with `layout`; the caller's contract is `System`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> isize {
    // Relaxed: read after every allocating thread of interest has been joined or is idle.
    LIVE.load(Ordering::Relaxed)
}

/// Starts a new peak at what is live now.
fn reset_peak() {
    // Relaxed: as `live`.
    PEAK.store(live(), Ordering::Relaxed);
}

fn peak() -> isize {
    // Relaxed: as `live`.
    PEAK.load(Ordering::Relaxed)
}

/// The tests of this binary share the counter: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A closed durable log in `dir` of `n` one-event appends with `payload`-byte payloads.
fn write_log(dir: &std::path::Path, options: &LogOptions, n: u64, payload: usize) {
    let log = EventLog::open(dir, options.clone()).unwrap();
    for i in 0..n {
        let data: Vec<u8> = (0..payload).map(|b| (b as u64 ^ i) as u8).collect();
        log.append(vec![Event::new("T", [format!("k:{}", i % 10)], data).unwrap()], None).unwrap();
    }
    log.close();
}

#[test]
fn a_durable_log_keeps_its_payloads_on_disk_not_in_memory() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let options = LogOptions::default().segment_bytes(1 << 20).cache_bytes(0);
    let n = 2_000;
    write_log(dir.path(), &options, n, 4096);
    let before = live();
    let log = EventLog::open(dir.path(), options).unwrap();
    let held = live() - before;
    // 8 MiB of payloads; what the open holds is the index, about a hundred bytes per event.
    assert!(held < n as isize * 512, "the open holds {held} bytes for {n} events of 4 KiB");
    // And the payloads are read back byte for byte.
    let events = log.read(&Query::All, None, usize::MAX).unwrap();
    for (i, e) in events.events().iter().enumerate() {
        let want: Vec<u8> = (0..4096).map(|b| (b as u64 ^ i as u64) as u8).collect();
        assert_eq!(&e.event.data()[..], &want[..], "event {}", i + 1);
    }
}

#[test]
fn the_record_cache_holds_at_most_its_budget() {
    let _serial = serial();
    // Large frames, and frames of a 256-byte payload, where what each cached frame costs
    // beyond its bytes is a third of the whole.
    for (payload, n) in [(4096, 2_000), (256, 8_000)] {
        let dir = tempfile::tempdir().unwrap();
        let budget = 256 << 10;
        let options = LogOptions::default().segment_bytes(1 << 20).cache_bytes(budget);
        write_log(dir.path(), &options, n, payload);
        let log = EventLog::open(dir.path(), options).unwrap();
        let opened = live();
        // Read every event twice, one at a time, dropping each: only the cache keeps anything.
        for _ in 0..2 {
            for p in 1..=n {
                let e = log.reader().get(lanestream_log::LogPosition::new(p).unwrap()).unwrap().unwrap();
                assert_eq!(e.event.data().len(), payload);
            }
        }
        let grown = live() - opened;
        // Several times the budget read; the cache keeps at most its budget (plus its own
        // small bookkeeping).
        assert!(
            grown <= budget as isize + (64 << 10),
            "reads of {payload}-byte payloads left {grown} bytes held, budget {budget}"
        );
        assert!(grown > 0, "the cache kept nothing");
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
#[ignore = "builds a log of a million events and prints figures; run by hand (module docs)"]
fn bytes_per_event_held_by_the_index_and_the_open_cost() {
    let _serial = serial();
    let n = env_u64("LANESTREAM_FOOTPRINT_EVENTS", 1_000_000);
    let tags = env_u64("LANESTREAM_FOOTPRINT_TAGS", 10_000);
    let batch = env_u64("LANESTREAM_FOOTPRINT_BATCH", 1).max(1);
    let base = std::env::var("LANESTREAM_FOOTPRINT_DIR")
        .unwrap_or_else(|_| std::env::temp_dir().display().to_string());
    let dir = tempfile::Builder::new().prefix("lanestream-footprint-").tempdir_in(base).unwrap();
    // No cache: its budget is accounted for apart (and this run reads no payload).
    let options = LogOptions::default().segment_bytes(8 << 20).cache_bytes(0);
    // `LANESTREAM_FOOTPRINT_OPEN_ONLY=DIR`: only open (and profile) the log already in DIR (the
    // peer bench's cold log, say), and print what its index holds.
    if let Ok(only) = std::env::var("LANESTREAM_FOOTPRINT_OPEN_ONLY") {
        let before = live();
        reset_peak();
        let started = Instant::now();
        let log = EventLog::open(&only, options).unwrap();
        let held = live() - before;
        let events = log.head().map_or(0, |h| h.get());
        eprintln!(
            "opened {events} events in {:.2?}: the open holds {:.1} MiB = {:.1} bytes per event, \
             {:.1} MiB at its peak",
            started.elapsed(),
            held as f64 / 1048576.0,
            held as f64 / events.max(1) as f64,
            (peak() - before) as f64 / 1048576.0,
        );
        return;
    }
    {
        let log = EventLog::open(dir.path(), options.clone()).unwrap();
        let threads = 8u64;
        let started = Instant::now();
        thread::scope(|s| {
            for t in 0..threads {
                let log = log.clone();
                s.spawn(move || {
                    let payload = bytes::Bytes::from(vec![b'x'; 256]);
                    // Thread `t` writes the batches `t`, `t + threads`, ... of `batch` events each.
                    let mut start = t * batch;
                    while start < n {
                        let events = (start..n.min(start + batch))
                            .map(|i| {
                                let ty = ["Opened", "Deposited", "Withdrawn", "Closed"][(i % 4) as usize];
                                Event::new(ty, [format!("entity:{}", i % tags)], payload.clone()).unwrap()
                            })
                            .collect();
                        log.append(events, None).unwrap();
                        start += threads * batch;
                    }
                });
            }
        });
        eprintln!("wrote {n} events ({tags} tags, appends of {batch}) in {:.1?}", started.elapsed());
        log.close();
    }
    let seg_bytes: u64 = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .map(|p| fs::metadata(p).unwrap().len())
        .sum();

    // Open with every sealed segment's index file (the page cache warm: the files were just
    // written).
    let before = live();
    let started = Instant::now();
    let log = EventLog::open(dir.path(), options.clone()).unwrap();
    let with_index = started.elapsed();
    let held = live() - before;
    assert_eq!(log.head().map(|h| h.get()), Some(n));
    let of_7 = n / tags + u64::from(n % tags > 7);
    assert_eq!(log.read(&Query::tags(["entity:7"]), None, usize::MAX).unwrap().len() as u64, of_7);
    log.close();
    drop(log);

    // Open with no index file: every segment scanned (every record read and checked), as every
    // open did before the index files; the indexes are written again on the way.
    for p in fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()) {
        if p.extension().is_some_and(|x| x == "idx") {
            fs::remove_file(p).unwrap();
        }
    }
    let started = Instant::now();
    let log = EventLog::open(dir.path(), options).unwrap();
    let scanning = started.elapsed();
    log.close();

    if std::env::var_os("LANESTREAM_FOOTPRINT_KEEP").is_some() {
        eprintln!("kept {}", dir.keep().display());
    }
    // The process's resident set now (the open log above dropped; this one holds the index)
    // and at its peak (which includes the writing phase), from /proc where there is one.
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .map_or("n/a".to_owned(), |l| l[name.len()..].trim().to_owned())
    };
    eprintln!("resident set after the opens: VmRSS {}, peak VmHWM {}", field("VmRSS:"), field("VmHWM:"));
    let per_million = |d: std::time::Duration| d.as_secs_f64() * 1e6 / n as f64 * 1000.0;
    let per_event = held as f64 / n as f64;
    eprintln!(
        "{n} events ({tags} tags, appends of {batch}), {:.1} MiB of segments: the open holds {:.1} MiB = {per_event:.1} bytes per event; \
         open with index files {with_index:.2?} ({:.0} ms per million events), scanning every \
         record {scanning:.2?} ({:.0} ms per million)",
        seg_bytes as f64 / 1048576.0,
        held as f64 / 1048576.0,
        per_million(with_index),
        per_million(scanning),
    );
    // The documented bounds (crate docs, "Memory"): under 128 bytes per event with 100 events
    // per tag or more (the default shape), under 160 at the cold row's 10 events per tag.
    let bound = if n / tags >= 100 { 128.0 } else { 160.0 };
    assert!(per_event < bound, "{per_event:.1} bytes per event");
}
