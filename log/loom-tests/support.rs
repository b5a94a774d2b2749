//! Shared pieces of the log's loom models: the model runner and a waker that unparks a loom
//! thread.
//!
//! Test scaffolding; the code under test is the log, reached only through its public API (its
//! mutexes, wait lists, close flag and threads are loom's under `--cfg lanestream_loom`, through
//! `src/sync.rs` and the core's `sync`).
#![allow(dead_code)]

use std::sync::Arc as StdArc;
use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
use std::task::{Wake, Waker};
use std::time::Instant;

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
