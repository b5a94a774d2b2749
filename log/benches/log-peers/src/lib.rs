//! The contenders of the event log's benchmarks (`benches/log.rs`, criterion; `benches/alternate.rs`,
//! interleaved rounds), each behind one [`Store`] trait in its own API, and the workloads they
//! run. See `benches/log.rs` for what each contender is and how it is set up.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use lanestream_log::{self as ls, EventLog, LogOptions, LogPosition, WriteHandle};

/// The payload of every event, in bytes.
pub const PAYLOAD: usize = 256;
pub static DATA: [u8; PAYLOAD] = [0x5a; PAYLOAD];
/// Distinct `acct:` tags: a selective read by one of them reads 1% of the log.
pub const ACCOUNTS: usize = 100;
/// Events in the log the read groups read.
pub const READ_LOG: usize = 50_000;
pub const SUBSCRIBERS: usize = 4;
pub const FANOUT_BATCH: usize = 64;

pub fn accounts() -> &'static [String] {
    static A: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    A.get_or_init(|| (0..ACCOUNTS).map(|i| format!("acct:{i}")).collect())
}

/// A fresh directory on tmpfs, removed on drop.
pub struct Dir(PathBuf);

/// Where a contender keeps its files: a fresh tmpfs directory removed on drop ([`Dir`]), or a
/// directory of the caller's that outlives it (the cold row's logs on the real disk).
pub enum Place {
    Temp(Dir),
    Kept(PathBuf),
}

impl Place {
    pub fn path(&self) -> &std::path::Path {
        match self {
            Place::Temp(d) => &d.0,
            Place::Kept(p) => p,
        }
    }
}

impl Dir {
    pub fn new(what: &str) -> Dir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let shm = std::path::Path::new("/dev/shm");
        let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        let dir = base.join(format!(
            "lanestream-bench-{what}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One contender: appends, reads and subscriptions in its own API.
pub trait Store: Send + Sync + 'static {
    /// Appends `batch` events (event `i` tagged `acct:{(seq + i) % 100}` and `w:{writer}`);
    /// with `guard`, under the condition "nothing tagged `guard` after `after`". Returns the
    /// last position.
    fn append(&self, writer: usize, seq: u64, batch: usize, guard: Option<(&str, u64)>) -> u64;
    /// Reads every event tagged `tag` (every event for `None`); returns how many.
    fn read(&self, tag: Option<&str>) -> usize;
    /// Starts a live subscription to every event after `after` (`None`: the store has none);
    /// the returned function blocks until it has received `n` more events.
    fn subscriber(&self, after: u64) -> Option<Box<dyn FnMut(usize) + Send + '_>>;
    /// Appends `batch` events for the cold row, event `first + i` tagged [`entity`]`((first + i)
    /// % entities)` only, so one entity's events lie `entities` events apart in the log.
    fn append_entities(&self, first: u64, batch: usize, entities: u64);
}

/// The cold row's tag of entity `k`.
pub fn entity(k: u64) -> String {
    format!("entity:{k}")
}

// ---- lanestream ----

/// The log, and the directory it lives in (removed when the bench ends).
pub struct Ours(pub WriteHandle, #[allow(dead_code)] Option<Place>);

impl Ours {
    pub fn durable() -> Ours {
        let dir = Dir::new("ours");
        Ours(EventLog::open(&dir.0, LogOptions::default()).unwrap(), Some(Place::Temp(dir)))
    }
    /// The log in `dir` (kept), with a record cache of `cache_bytes`.
    pub fn at(dir: &std::path::Path, cache_bytes: u64) -> Ours {
        let options = LogOptions::default().cache_bytes(cache_bytes);
        Ours(EventLog::open(dir, options).unwrap(), Some(Place::Kept(dir.to_path_buf())))
    }
    pub fn memory() -> Ours {
        Ours(EventLog::in_memory(LogOptions::default()).unwrap(), None)
    }
}

impl Drop for Ours {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl Store for Ours {
    fn append(&self, writer: usize, seq: u64, batch: usize, guard: Option<(&str, u64)>) -> u64 {
        let w = format!("w:{writer}");
        let events = (0..batch)
            .map(|i| {
                let acct = &accounts()[(seq as usize + i) % ACCOUNTS];
                ls::Event::new("Deposited", [acct.as_str(), w.as_str()], Bytes::from_static(&DATA)).unwrap()
            })
            .collect();
        let condition =
            guard.map(|(g, after)| ls::AppendCondition::new(ls::Query::tags([g]), LogPosition::new(after)));
        self.0.append(events, condition).unwrap().last.get()
    }

    fn read(&self, tag: Option<&str>) -> usize {
        let q = tag.map_or(ls::Query::All, |t| ls::Query::tags([t]));
        let reads = self.0.read(&q, None, usize::MAX).unwrap();
        reads.events().iter().map(|s| s.event.data().len()).sum::<usize>() / PAYLOAD
    }

    fn subscriber(&self, after: u64) -> Option<Box<dyn FnMut(usize) + Send + '_>> {
        let mut sub = self.0.subscribe(ls::Query::All, LogPosition::new(after));
        Some(Box::new(move |n| {
            let mut got = 0;
            while got < n {
                got += black_box(sub.next_batch().unwrap().unwrap()).len();
            }
        }))
    }

    fn append_entities(&self, first: u64, batch: usize, entities: u64) {
        let events = (first..first + batch as u64)
            .map(|j| ls::Event::new("Deposited", [entity(j % entities)], Bytes::from_static(&DATA)).unwrap())
            .collect();
        self.0.append(events, None).unwrap();
    }
}

// ---- tephra 0.4 ----
// WriterConfig::default() in 0.4.1 is what a user gets: group commits of up to 2,048 records,
// a queue of 16,384, exact same-batch conditions. Reads run on the caller's thread (the async
// read pool is for async servers; this bench reads synchronously, as ours does).

pub struct Tephra {
    handle: tephra::WriteHandle,
    coordinator: Mutex<Option<tephra::WriteCoordinator>>,
    _dir: Place,
}

impl Default for Tephra {
    fn default() -> Tephra {
        Tephra::new()
    }
}

impl Tephra {
    pub fn new() -> Tephra {
        Tephra::in_place(Place::Temp(Dir::new("tephra")))
    }
    /// The log in `dir` (kept). tephra has no record cache of its own: its reads go to the
    /// segment files through the operating system's page cache.
    pub fn at(dir: &std::path::Path) -> Tephra {
        Tephra::in_place(Place::Kept(dir.to_path_buf()))
    }
    fn in_place(dir: Place) -> Tephra {
        let set =
            tephra::SegmentSet::open(dir.path(), tephra::SegmentConfig::new(256 * 1024 * 1024)).unwrap();
        let (coordinator, handle) =
            tephra::WriteCoordinator::start(set, tephra::WriterConfig::default()).unwrap();
        Tephra { handle, coordinator: Mutex::new(Some(coordinator)), _dir: dir }
    }

    fn query(tag: Option<&str>) -> tephra::Query {
        match tag {
            None => tephra::Query::all(),
            Some(t) => tephra::Query::item(tephra::QueryItem::with_tags(
                tephra::Tags::new([tephra::Tag::new(t).unwrap()]).unwrap(),
            )),
        }
    }
}

impl Drop for Tephra {
    fn drop(&mut self) {
        if let Some(c) = self.coordinator.lock().unwrap().take() {
            c.shutdown();
        }
    }
}

impl Store for Tephra {
    fn append(&self, writer: usize, seq: u64, batch: usize, guard: Option<(&str, u64)>) -> u64 {
        let ty = tephra::EventType::new("Deposited").unwrap();
        let w = tephra::Tag::new(format!("w:{writer}")).unwrap();
        let events = (0..batch)
            .map(|i| {
                let acct = tephra::Tag::new(accounts()[(seq as usize + i) % ACCOUNTS].as_str()).unwrap();
                let tags = tephra::Tags::new([acct, w.clone()]).unwrap();
                tephra::Event::new(&ty, &tags, &DATA).unwrap()
            })
            .collect();
        let condition = guard.map(|(g, after)| {
            tephra::AppendCondition::new(Tephra::query(Some(g))).after(tephra::Position::new(after))
        });
        self.handle.append(events, condition).unwrap().last.get()
    }

    fn read(&self, tag: Option<&str>) -> usize {
        let mut reads = self.handle.read(&Tephra::query(tag), tephra::Position::ZERO, None);
        let mut bytes = 0;
        while let Some(item) = reads.next() {
            bytes += item.unwrap().event.data().len();
        }
        bytes / PAYLOAD
    }

    fn subscriber(&self, after: u64) -> Option<Box<dyn FnMut(usize) + Send + '_>> {
        let mut sub = self.handle.subscribe(tephra::Query::all(), tephra::Position::new(after));
        Some(Box::new(move |n| {
            let mut got = 0;
            while got < n {
                got += black_box(sub.next_batch().unwrap().unwrap()).len();
            }
        }))
    }

    fn append_entities(&self, first: u64, batch: usize, entities: u64) {
        let ty = tephra::EventType::new("Deposited").unwrap();
        let events = (first..first + batch as u64)
            .map(|j| {
                let tags = tephra::Tags::new([tephra::Tag::new(entity(j % entities)).unwrap()]).unwrap();
                tephra::Event::new(&ty, &tags, &DATA).unwrap()
            })
            .collect();
        self.handle.append(events, None).unwrap();
    }
}

// ---- umadb-core 0.7 ----

use umadb_dcb::{DcbAppendCondition, DcbEvent, DcbEventStoreSync, DcbQuery, DcbQueryItem, DcbResult};

pub type UmaRequest = umadb_core::writer_thread_request::WriterThreadRequest;

pub struct Uma {
    db: umadb_core::db::UmaDb,
    requests: Mutex<Option<tokio::sync::mpsc::Sender<UmaRequest>>>,
    writer: Mutex<Option<thread::JoinHandle<()>>>,
    _dir: Place,
}

impl Default for Uma {
    fn default() -> Uma {
        Uma::new()
    }
}

impl Uma {
    pub fn new() -> Uma {
        Uma::in_place(Place::Temp(Dir::new("umadb")), 0)
    }
    /// The store in `dir` (kept), with a page cache of its own of `cache_mb` MB (its
    /// `page_cache_max_mb`; 0: none, its default).
    pub fn at(dir: &std::path::Path, cache_mb: usize) -> Uma {
        Uma::in_place(Place::Kept(dir.to_path_buf()), cache_mb)
    }
    fn in_place(dir: Place, cache_mb: usize) -> Uma {
        let options =
            umadb_core::mvcc::StorageOptions::default().db_path(dir.path()).page_cache_max_mb(cache_mb);
        let mvcc = Arc::new(umadb_core::mvcc::Mvcc::new(false, options).unwrap());
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        let (head_tx, _head_rx) = tokio::sync::watch::channel(None);
        let m = mvcc.clone();
        let writer = thread::spawn(move || {
            umadb_core::writer_thread_blocking::writer_thread_blocking(m, rx, head_tx, 1 << 20)
        });
        Uma {
            db: umadb_core::db::UmaDb::from_arc(mvcc),
            requests: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
            _dir: dir,
        }
    }

    fn query(tag: Option<&str>) -> Option<DcbQuery> {
        tag.map(|t| DcbQuery { items: vec![DcbQueryItem { types: vec![], tags: vec![t.to_owned()] }] })
    }
}

impl Uma {
    /// One append through umadb's writer thread; the last position.
    fn send(&self, events: Vec<DcbEvent>, condition: Option<DcbAppendCondition>) -> u64 {
        let (response_tx, response) = tokio::sync::oneshot::channel::<DcbResult<u64>>();
        let tx = self.requests.lock().unwrap().clone().unwrap();
        let request =
            UmaRequest::Append { events, condition, tracking_info: None, response_tx, cancel: None };
        assert!(tx.blocking_send(request).is_ok(), "umadb writer gone");
        response.blocking_recv().unwrap().unwrap()
    }
}

impl Drop for Uma {
    fn drop(&mut self) {
        if let Some(tx) = self.requests.lock().unwrap().take() {
            let _ = tx.blocking_send(UmaRequest::Shutdown);
        }
        if let Some(w) = self.writer.lock().unwrap().take() {
            let _ = w.join();
        }
    }
}

impl Store for Uma {
    fn append(&self, writer: usize, seq: u64, batch: usize, guard: Option<(&str, u64)>) -> u64 {
        let w = format!("w:{writer}");
        let events = (0..batch)
            .map(|i| DcbEvent {
                event_type: "Deposited".to_owned(),
                tags: vec![accounts()[(seq as usize + i) % ACCOUNTS].clone(), w.clone()],
                data: DATA.to_vec(),
                uuid: None,
                metadata: Vec::new(),
            })
            .collect();
        let condition = guard.map(|(g, after)| DcbAppendCondition {
            fail_if_events_match: Uma::query(Some(g)).unwrap(),
            after: (after > 0).then_some(after),
        });
        self.send(events, condition)
    }

    fn read(&self, tag: Option<&str>) -> usize {
        let mut bytes = 0;
        for e in self.db.read(Uma::query(tag), None, false, None).unwrap() {
            bytes += e.unwrap().event.data.len();
        }
        bytes / PAYLOAD
    }

    fn subscriber(&self, _after: u64) -> Option<Box<dyn FnMut(usize) + Send + '_>> {
        None
    }

    fn append_entities(&self, first: u64, batch: usize, entities: u64) {
        let events = (first..first + batch as u64)
            .map(|j| DcbEvent {
                event_type: "Deposited".to_owned(),
                tags: vec![entity(j % entities)],
                data: DATA.to_vec(),
                uuid: None,
                metadata: Vec::new(),
            })
            .collect();
        self.send(events, None);
    }
}

// ---- Mutex<Vec> + Condvar ----

pub struct BaseEvent {
    _event_type: Box<str>,
    tags: Vec<Box<str>>,
    data: Bytes,
}

#[derive(Default)]
pub struct MutexVec {
    events: Mutex<Vec<Arc<BaseEvent>>>,
    appended: Condvar,
}

impl Store for MutexVec {
    fn append(&self, writer: usize, seq: u64, batch: usize, guard: Option<(&str, u64)>) -> u64 {
        let w: Box<str> = format!("w:{writer}").into();
        let new: Vec<Arc<BaseEvent>> = (0..batch)
            .map(|i| {
                Arc::new(BaseEvent {
                    _event_type: "Deposited".into(),
                    tags: vec![accounts()[(seq as usize + i) % ACCOUNTS].as_str().into(), w.clone()],
                    data: Bytes::from_static(&DATA),
                })
            })
            .collect();
        let mut events = self.events.lock().unwrap();
        if let Some((g, after)) = guard {
            let hit = events[after as usize..].iter().any(|e| e.tags.iter().any(|t| &**t == g));
            assert!(!hit, "the guard never matches");
        }
        events.extend(new);
        let last = events.len() as u64;
        drop(events);
        self.appended.notify_all();
        last
    }

    fn read(&self, tag: Option<&str>) -> usize {
        let events = self.events.lock().unwrap();
        let out: Vec<Arc<BaseEvent>> = match tag {
            None => events.clone(),
            Some(t) => events.iter().filter(|e| e.tags.iter().any(|x| &**x == t)).cloned().collect(),
        };
        drop(events);
        out.iter().map(|e| e.data.len()).sum::<usize>() / PAYLOAD
    }

    fn subscriber(&self, after: u64) -> Option<Box<dyn FnMut(usize) + Send + '_>> {
        let me = self;
        let mut cursor = after as usize;
        Some(Box::new(move |n| {
            let mut got = 0;
            while got < n {
                let mut events = me.events.lock().unwrap();
                while events.len() <= cursor {
                    events = me.appended.wait(events).unwrap();
                }
                let batch: Vec<Arc<BaseEvent>> = events[cursor..].to_vec();
                drop(events);
                cursor += batch.len();
                got += black_box(batch).len();
            }
        }))
    }

    fn append_entities(&self, first: u64, batch: usize, entities: u64) {
        let new = (first..first + batch as u64).map(|j| {
            Arc::new(BaseEvent {
                _event_type: "Deposited".into(),
                tags: vec![entity(j % entities).into()],
                data: Bytes::from_static(&DATA),
            })
        });
        self.events.lock().unwrap().extend(new);
        self.appended.notify_all();
    }
}

// ---- workloads ----

/// `writers` threads each append `ceil(n / writers)` times; returns the time normalised to `n`
/// appends.
pub fn run_appends(store: &dyn Store, writers: usize, batch: usize, conditional: bool, n: u64) -> Duration {
    let per = n.div_ceil(writers as u64);
    static GUARDS: AtomicUsize = AtomicUsize::new(0);
    let start = Instant::now();
    thread::scope(|s| {
        for w in 0..writers {
            s.spawn(move || {
                let mut after = 0;
                let guard_base = GUARDS.fetch_add(1, Ordering::Relaxed);
                for i in 0..per {
                    let guard = conditional.then(|| format!("decision:{guard_base}:{i}"));
                    after = store.append(w, i * batch as u64, batch, guard.as_deref().map(|g| (g, after)));
                }
            });
        }
    });
    start.elapsed().mul_f64(n as f64 / (per * writers as u64) as f64)
}

/// Builds one contender; it is dropped (closed, its directory removed) when its bench ends.
pub type Make = fn() -> Box<dyn Store>;

pub fn durable_contenders() -> Vec<(&'static str, Make)> {
    vec![
        ("lanestream[durable]", || Box::new(Ours::durable())),
        ("tephra[durable]", || Box::new(Tephra::new())),
        ("umadb-core[durable]", || Box::new(Uma::new())),
        ("lanestream[memory]", || Box::new(Ours::memory())),
        ("mutex-vec[memory]", || Box::<MutexVec>::default()),
    ]
}

pub fn filled(make: Make) -> Box<dyn Store> {
    let s = make();
    let mut seq = 0;
    while (seq as usize) < READ_LOG {
        s.append(0, seq, 500, None);
        seq += 500;
    }
    s
}

/// One writer appends `n` batches of [`FANOUT_BATCH`] while [`SUBSCRIBERS`] live subscriptions
/// (every event) receive them; the time until all of them have every event. Panics if `store`
/// has no subscriptions.
pub fn fanout_run(s: &dyn Store, n: u64) -> Duration {
    let after = s.append(0, 0, 1, None);
    let total = n as usize * FANOUT_BATCH;
    let subs: Vec<_> =
        (0..SUBSCRIBERS).map(|_| s.subscriber(after).expect("a store with subscriptions")).collect();
    let start = Instant::now();
    thread::scope(|scope| {
        for mut sub in subs {
            scope.spawn(move || sub(total));
        }
        for i in 0..n {
            s.append(0, i * FANOUT_BATCH as u64, FANOUT_BATCH, None);
        }
    });
    start.elapsed()
}

// ---- the cold row ----

/// Events per entity in the cold row's log: entity `k`'s events are `k, k + E, k + 2E, ...` for
/// `E` entities, so they lie far apart in the log, as an aggregate's events do over time.
pub const COLD_EVENTS_PER_ENTITY: u64 = 10;
/// Reader threads in the cold row.
pub const COLD_READERS: usize = 16;
/// Threads writing the cold row's log.
pub const COLD_WRITERS: u64 = 16;

/// The cold row's log: how many events, and where each contender's copy lives (on the real
/// disk: a page cache that can be dropped is the point of the row).
#[derive(Clone, Debug)]
pub struct ColdSpec {
    pub events: u64,
    pub root: PathBuf,
    /// Events per append while the log is written.
    pub batch: u64,
}

/// Opens a contender's log in a kept directory with a cache budget of `cache_bytes`.
pub type MakeCold = fn(&std::path::Path, u64) -> Box<dyn Store>;

/// The cold row's contenders, each with its own cache set to the budget where it has one:
/// lanestream's `cache_bytes`; umadb's `page_cache_max_mb` (counted in 10^6 bytes); tephra has
/// no cache of its own (the page cache only).
pub fn cold_contenders() -> Vec<(&'static str, MakeCold)> {
    vec![
        ("lanestream[durable]", |dir, cache| Box::new(Ours::at(dir, cache))),
        ("tephra[durable]", |dir, _| Box::new(Tephra::at(dir))),
        ("umadb-core[durable]", |dir, cache| Box::new(Uma::at(dir, (cache / 1_000_000) as usize))),
    ]
}

impl ColdSpec {
    pub fn entities(&self) -> u64 {
        (self.events / COLD_EVENTS_PER_ENTITY).max(1)
    }
    /// The cache budget: the 512 MiB for 8M events of 256 B, in proportion for other
    /// sizes (the log about 3.8x the budget).
    pub fn cache_bytes(&self) -> u64 {
        ((512u128 << 20) * u128::from(self.events) / 8_000_000) as u64
    }
    /// How many events entity `k` has.
    pub fn events_of(&self, k: u64) -> usize {
        let e = self.entities();
        (self.events / e + u64::from(k < self.events % e)) as usize
    }
    fn dir(&self, id: &str) -> PathBuf {
        let name: String = id.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
        self.root.join(format!("{name}-{}-{}", self.events, self.batch))
    }
    /// Whether `id`'s log was written to the end (a marker beside its directory).
    pub fn is_written(&self, id: &str) -> bool {
        self.dir(id).with_extension("complete").exists()
    }
    /// Opens `id`'s log, writing it first (and closing and reopening it) unless a complete one
    /// is there from an earlier run.
    pub fn open(&self, id: &str, make: MakeCold) -> Box<dyn Store> {
        let dir = self.dir(id);
        if !self.is_written(id) {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let start = Instant::now();
            let s = make(&dir, self.cache_bytes());
            // Writer w appends batches w, w + COLD_WRITERS, ... of `batch` events each.
            thread::scope(|scope| {
                for w in 0..COLD_WRITERS {
                    let s = &*s;
                    scope.spawn(move || {
                        let mut first = w * self.batch;
                        while first < self.events {
                            let n = self.batch.min(self.events - first);
                            s.append_entities(first, n as usize, self.entities());
                            first += COLD_WRITERS * self.batch;
                        }
                    });
                }
            });
            drop(s);
            std::fs::write(dir.with_extension("complete"), b"").unwrap();
            eprintln!(
                "cold row: {id} wrote {} events in {:.1} s",
                self.events,
                start.elapsed().as_secs_f64()
            );
        }
        let start = Instant::now();
        let s = make(&dir, self.cache_bytes());
        eprintln!("cold row: {id} opened in {:.2} s", start.elapsed().as_secs_f64());
        s
    }
    /// Removes every contender's copy.
    pub fn remove(&self) {
        for (id, _) in cold_contenders() {
            let _ = std::fs::remove_file(self.dir(id).with_extension("complete"));
            let _ = std::fs::remove_dir_all(self.dir(id));
        }
    }
}

/// Writes back dirty pages and drops the operating system's page cache (needs root); false if
/// it could not.
pub fn drop_page_cache() -> bool {
    let synced = std::process::Command::new("sync").status().is_ok_and(|s| s.success());
    synced && std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// [`COLD_READERS`] threads each read `reads` entities picked at random (from `seed`: the same
/// entities for every contender of a round), checking that each read returns every event of
/// its entity. Returns the time and the events read.
pub fn cold_reads(s: &dyn Store, spec: &ColdSpec, reads: usize, seed: u64) -> (Duration, u64) {
    let total = AtomicUsize::new(0);
    let start = Instant::now();
    thread::scope(|scope| {
        for r in 0..COLD_READERS {
            let total = &total;
            scope.spawn(move || {
                let mut rng = seed ^ (r as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let mut got = 0;
                for _ in 0..reads {
                    let k = splitmix64(&mut rng) % spec.entities();
                    let n = s.read(Some(&entity(k)));
                    assert_eq!(
                        n,
                        spec.events_of(k),
                        "a cold read of entity {k} returned the wrong number of events"
                    );
                    got += n;
                }
                total.fetch_add(got, Ordering::Relaxed);
            });
        }
    });
    (start.elapsed(), total.load(Ordering::Relaxed) as u64)
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// This process's peak resident set (`VmHWM` in `/proc/self/status`), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    proc_field("/proc/self/status", "VmHWM:").map(|kib| kib * 1024)
}

/// This process's resident set now (`VmRSS`), in bytes.
pub fn rss_bytes() -> Option<u64> {
    proc_field("/proc/self/status", "VmRSS:").map(|kib| kib * 1024)
}

/// The bytes this process has made the kernel read from the disk (`read_bytes` in
/// `/proc/self/io`).
pub fn disk_read_bytes() -> Option<u64> {
    proc_field("/proc/self/io", "read_bytes:")
}

fn proc_field(file: &str, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}
