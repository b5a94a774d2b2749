//! Shared pieces of the loom models: the model runner, loom-tracked items, plain cells and a
//! waker that unparks a loom thread.
//!
//! Everything here is test scaffolding; the code under test is the engine, reached only through
//! the public API (the engine's atomics, cells, mutexes, `Arc` and parking are loom's under
//! `--cfg lanestream_loom`, through `src/sync.rs`).
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
use std::sync::Arc as StdArc;
use std::task::{Wake, Waker};
use std::time::Instant;

use bytes::Bytes;
use lanestream::{
    Batch, Consumer, Envelope, Fanout, IndexName, LaneItem, MemoryStream, Op, Position, Stream,
};
use loom::alloc::Track;
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, Ordering};

/// Runs `f` under every interleaving loom reaches with at most `bound` preemptions per
/// execution. `LOOM_MAX_PREEMPTIONS` in the environment overrides `bound` (to search deeper by
/// hand). Prints how many executions were explored and how long it took.
pub fn model<F>(name: &str, bound: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    static EXECUTIONS: StdAtomicUsize = StdAtomicUsize::new(0);
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(bound);
    }
    // The blocking models take many scheduling decisions per execution (wait-list mutex, park,
    // unpark); the default of 1000 branches is too low for them, 20k is ample.
    builder.max_branches = builder.max_branches.max(20_000);
    let bound = builder.preemption_bound;
    let start = Instant::now();
    let before = EXECUTIONS.load(StdOrdering::Relaxed);
    builder.check(move || {
        EXECUTIONS.fetch_add(1, StdOrdering::Relaxed);
        f();
    });
    eprintln!(
        "loom model {name}: {} executions, preemption bound {:?}, {:.1?}",
        EXECUTIONS.load(StdOrdering::Relaxed) - before,
        bound,
        start.elapsed()
    );
}

/// A document whose bytes live in a loom-tracked allocation: if the item carrying it is never
/// dropped, loom fails the model with "Allocation leaked" (M3).
struct Tracked {
    bytes: [u8; 8],
    _track: Track<()>,
}

impl AsRef<[u8]> for Tracked {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// The document of the batch at `pos`: `pos` in little-endian bytes, leak-tracked.
pub fn document(pos: u64) -> Bytes {
    Bytes::from_owner(Tracked { bytes: pos.to_le_bytes(), _track: Track::new(()) })
}

/// A positioned batch with one envelope whose document is [`document`]`(pos)`.
pub fn batch(pos: u64) -> LaneItem {
    let envelope = Envelope {
        index: IndexName::new("t").unwrap(),
        id: pos.to_string(),
        op: Op::Upsert,
        position: Some(Position(pos)),
        document: document(pos),
        built_at_micros: None,
        relation: None,
        old_id: None,
        unchanged: Vec::new(),
    };
    LaneItem::Batch(Batch::new(Some(Position(pos)), StdArc::from(vec![envelope])))
}

/// Asserts that `item` is the batch built by [`batch`]`(pos)`, reading its document.
pub fn check(item: &LaneItem, pos: u64) {
    match item {
        LaneItem::Batch(b) => {
            assert_eq!(b.position, Some(Position(pos)));
            assert_eq!(b.envelopes.len(), 1);
            assert_eq!(b.envelopes[0].document.as_ref(), &pos.to_le_bytes()[..]);
        }
        other => panic!("expected batch {pos}, got {other:?}"),
    }
}

/// The envelopes `Arc` of a batch (to count how many owners it has).
pub fn envelopes(item: &LaneItem) -> &StdArc<[Envelope]> {
    match item {
        LaneItem::Batch(b) => &b.envelopes,
        other => panic!("expected a batch, got {other:?}"),
    }
}

/// Plain (non-atomic) memory that loom tracks: a read not ordered after the write it must see
/// (by some Release/Acquire chain) fails the model with a causality violation.
pub struct Cells(Vec<UnsafeCell<u64>>);

// SAFETY: every access goes through loom's `UnsafeCell`, which checks that no two accesses
// race; the models order them through the engine under test.
unsafe impl Sync for Cells {}
// SAFETY: as above.
unsafe impl Send for Cells {}

impl Cells {
    pub fn new(n: usize) -> Cells {
        Cells((0..n).map(|_| UnsafeCell::new(0)).collect())
    }

    pub fn write(&self, i: usize, v: u64) {
        // SAFETY: loom checks the access.
        self.0[i].with_mut(|p| unsafe { *p = v })
    }

    pub fn read(&self, i: usize) -> u64 {
        // SAFETY: loom checks the access.
        self.0[i].with(|p| unsafe { *p })
    }
}

/// A waker that records that it was woken and unparks the loom thread that made it.
pub struct Flag {
    woken: AtomicBool,
    thread: loom::thread::Thread,
}

impl Flag {
    /// A flag for the current (loom) thread, and a waker that raises it.
    pub fn new() -> (StdArc<Flag>, Waker) {
        let flag = StdArc::new(Flag { woken: AtomicBool::new(false), thread: loom::thread::current() });
        let waker = Waker::from(flag.clone());
        (flag, waker)
    }

    pub fn is_woken(&self) -> bool {
        self.woken.load(Ordering::Acquire)
    }

    /// Parks the current thread until the waker was woken. A lost wake-up makes every thread
    /// wait and loom reports the deadlock.
    pub fn wait(&self) {
        while !self.is_woken() {
            loom::thread::park();
        }
    }
}

impl Wake for Flag {
    fn wake(self: StdArc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &StdArc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// An unpositioned, empty batch (a snapshot chunk).
pub fn snapshot() -> LaneItem {
    LaneItem::Batch(Batch::new(None, StdArc::from(Vec::<Envelope>::new())))
}

/// A stream of `capacity` with lanes "a" and "b" (and a request lane of 1), its fan-out, and a
/// consumer re-attached to each lane ("a" first).
pub fn lanes_a_b(capacity: usize) -> (MemoryStream, Fanout, Consumer<LaneItem>, Consumer<LaneItem>) {
    let stream =
        MemoryStream::builder().capacity(capacity).request_capacity(1).sinks(["a", "b"]).build().unwrap();
    let fanout = stream.fanout().unwrap();
    let mut consumers: Vec<_> = stream.lanes().map(|lane| lane.reattach()).collect();
    let b = consumers.pop().unwrap();
    let a = consumers.pop().unwrap();
    (stream, fanout, a, b)
}
