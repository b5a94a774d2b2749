//! Waiting: spin briefly, then park the thread or register the task's waker — the one waiting
//! mechanism of the workspace.
//!
//! The lanes wait with it (each lane has two [`WaitList`]s: consumers wait on one for items,
//! producers on the other for room), and so does the event log, `lanestream-log` (its
//! subscribers' signal, its bounded request queue and its append replies). A list holds any
//! number of waiters — parked threads and registered task wakers side by side — and wakes them
//! all on every notification, so a woken waiter that goes away (a dropped future) never swallows
//! a wake-up another waiter needed.
//!
//! Its protocol has two sides:
//! - a **waiter** waits for a condition with [`block_until`] (a thread: check, spin briefly, then
//!   register, re-check and park, with an optional deadline) or [`poll_until`] (a future's
//!   `poll`: check, register the task's waker, re-check), and cancels its key when it stops
//!   waiting (both functions do so when the condition holds);
//! - a **notifier** first changes the state the condition reads — with any synchronization at
//!   all: an atomic store, a mutex, an `arc-swap` — and then calls [`WaitList::notify`].
//!
//! # Memory ordering: register-then-check against change-then-notify
//! A waiter registers, then re-checks its condition, then sleeps. A notifier changes the state,
//! then notifies. Both sides touch the list's `waiting` count with a read-modify-write (`AcqRel`):
//! RMWs on one atomic are totally ordered, so one of the two comes first.
//!
//! ```text
//!  waiter                              notifier
//!  register: RMW waiting (AcqRel) ─┐   change the state
//!  re-check the condition          │   notify: RMW waiting (AcqRel) ─┐
//!  park / return Pending           │                                 │
//!  either the notifier's RMW is later: it reads waiting > 0 and wakes the entry;
//!  or the waiter's RMW is later: it reads from the notifier's Release, so the
//!     re-check (after it) sees the change (before that Release).
//! ```
//!
//! No `SeqCst` is needed, and loom checks this exactly: under `--cfg lanestream_loom` the list's
//! atomics, mutex and parking are loom's (the crate's `sync` module), in the core's models and
//! in the log's. An `unpark` that lands before the `park` makes the park return at once, and a
//! spurious return only costs one more check, so the loop in [`block_until`] is exact.
//!
//! # Example
//! ```
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use std::sync::Arc;
//! use std::thread;
//!
//! use lanestream::wait::{block_until, WaitList};
//!
//! let list = Arc::new(WaitList::new(1));
//! let done = Arc::new(AtomicBool::new(false));
//! let waiter = {
//!     let (list, done) = (list.clone(), done.clone());
//!     // Blocks until `done` is set; `None` would mean the deadline passed (there is none).
//!     thread::spawn(move || block_until(&list, || {}, None, || done.load(Ordering::Acquire).then_some(7)))
//! };
//! done.store(true, Ordering::Release); // change the state first,
//! list.notify(); // then notify
//! assert_eq!(waiter.join().unwrap(), Some(7));
//! ```

use std::fmt;
use std::task::Waker;
use std::time::Instant;

use crossbeam_utils::Backoff;

use crate::sync::{self, current, lock, AtomicUsize, Mutex, Ordering, Thread};

/// What to wake.
enum Waiter {
    Thread(Thread),
    Task(Waker),
}

impl Waiter {
    fn wake(self) {
        match self {
            Waiter::Thread(t) => t.unpark(),
            Waiter::Task(w) => w.wake(),
        }
    }
}

struct Entry {
    key: u64,
    waiter: Waiter,
}

struct Entries {
    next_key: u64,
    list: Vec<Entry>,
}

/// A set of waiters, woken all at once by [`notify`](WaitList::notify). See the
/// [module docs](self) for the protocol and its ordering argument.
///
/// A waiter is known by a key, an `Option<u64>` it keeps (in its future, for an async wait):
/// `None` while not registered, set by [`register`](WaitList::register), cleared by
/// [`cancel`](WaitList::cancel).
pub struct WaitList {
    /// How many entries are registered. Touched only by RMWs (see the module docs).
    waiting: AtomicUsize,
    entries: Mutex<Entries>,
}

/// How many waiters one locked round of `notify` takes out before waking them outside the lock.
const WAKE_BATCH: usize = 8;

impl fmt::Debug for WaitList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Relaxed: a snapshot for display only.
        f.debug_struct("WaitList").field("waiting", &self.waiting.load(Ordering::Relaxed)).finish()
    }
}

impl WaitList {
    /// An empty list with room for `expected` waiters before it allocates again
    /// ([M1](crate::contract#m1): a lane has at most two live waiters in normal use, and
    /// re-polling replaces an entry instead of adding one).
    pub fn new(expected: usize) -> WaitList {
        WaitList {
            waiting: AtomicUsize::new(0),
            entries: Mutex::new(Entries { next_key: 0, list: Vec::with_capacity(expected) }),
        }
    }

    /// Registers (or, if `key` is still registered, replaces) a waiter: the task of `waker`, or
    /// the current thread for `None`. `waker` is cloned only when it would not wake the task
    /// already registered under `key`. The caller re-checks its condition afterwards (module
    /// docs) and cancels the key when it stops waiting.
    ///
    /// [`block_until`] and [`poll_until`] call this; call it directly only to wait on several
    /// lists at once (from their `arm`).
    pub fn register(&self, key: &mut Option<u64>, waker: Option<&Waker>) {
        let make = || match waker {
            Some(w) => Waiter::Task(w.clone()),
            None => Waiter::Thread(current()),
        };
        let mut entries = lock(&self.entries);
        if let Some(k) = *key {
            if let Some(e) = entries.list.iter_mut().find(|e| e.key == k) {
                let same = matches!((&e.waiter, waker), (Waiter::Task(a), Some(b)) if a.will_wake(b));
                if !same {
                    e.waiter = make();
                }
                // AcqRel RMW: orders this registration against a notifier's RMW (module docs).
                self.waiting.fetch_add(0, Ordering::AcqRel);
                return;
            }
        }
        let k = entries.next_key;
        entries.next_key += 1;
        entries.list.push(Entry { key: k, waiter: make() });
        *key = Some(k);
        // AcqRel RMW: orders this registration against a notifier's RMW (module docs).
        self.waiting.fetch_add(1, Ordering::AcqRel);
    }

    /// Removes the waiter registered under `key`, if a notification has not already taken it,
    /// and clears `key`. Does nothing for `None`.
    pub fn cancel(&self, key: &mut Option<u64>) {
        let Some(k) = key.take() else { return };
        let mut entries = lock(&self.entries);
        if let Some(i) = entries.list.iter().position(|e| e.key == k) {
            entries.list.swap_remove(i);
            // Relaxed: the lock orders the list; the count only has to stay in step with it.
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether `key` is still in the list (no notify has taken it): the loom build's guard
    /// against loom's lost unpark tokens (see [`block_until`]).
    #[cfg(lanestream_loom)]
    fn is_registered(&self, key: Option<u64>) -> bool {
        key.is_some_and(|k| lock(&self.entries).list.iter().any(|e| e.key == k))
    }

    /// Wakes every registered waiter (each is woken once and leaves the list; a waiter that
    /// keeps waiting registers again). Call it after changing the state the waiters check.
    /// Costs one uncontended RMW when nobody waits; wakers run outside the list's lock.
    pub fn notify(&self) {
        // AcqRel RMW: pairs with `register`'s RMW (module docs). A plain load could miss a waiter
        // that registered just before our state change became visible to it.
        if self.waiting.fetch_add(0, Ordering::AcqRel) == 0 {
            return;
        }
        loop {
            let mut batch: [Option<Waiter>; WAKE_BATCH] = Default::default();
            let mut n = 0;
            let more = {
                let mut entries = lock(&self.entries);
                while n < WAKE_BATCH {
                    match entries.list.pop() {
                        Some(e) => {
                            batch[n] = Some(e.waiter);
                            n += 1;
                        }
                        None => break,
                    }
                }
                // Relaxed: the lock orders the list; the count only has to stay in step with it.
                self.waiting.fetch_sub(n, Ordering::Relaxed);
                !entries.list.is_empty()
            };
            // Wake outside the lock: a waker may run arbitrary executor code.
            for w in batch.into_iter().flatten() {
                w.wake();
            }
            if !more {
                return;
            }
        }
    }
}

/// Blocks the current thread until `ready` gives a value: checks, spins briefly (crossbeam's
/// `Backoff`; not under loom), then registers the thread on `list`, re-checks and parks until
/// notified, in a loop. `None` if `deadline` passed first (`ready` is checked once more after
/// each wake-up, so a value that came with the deadline is still returned).
///
/// `ready` may be called many times and must not block; it reads the state a notifier changes
/// before calling [`WaitList::notify`] on `list`. `arm` runs after each registration and before the re-check: it raises the ring's own
/// "someone waits" bit (an RMW), so the hot-path notifier can skip the list when nobody waits
/// (and may register the thread on further lists, whose notifiers then wake it too).
pub fn block_until<R>(
    list: &WaitList,
    mut arm: impl FnMut(),
    deadline: Option<Instant>,
    mut ready: impl FnMut() -> Option<R>,
) -> Option<R> {
    if let Some(r) = ready() {
        return Some(r);
    }
    if sync::SPIN {
        let backoff = Backoff::new();
        while !backoff.is_completed() {
            backoff.snooze();
            if let Some(r) = ready() {
                return Some(r);
            }
        }
    }
    let mut key = None;
    loop {
        list.register(&mut key, None);
        arm();
        if let Some(r) = ready() {
            list.cancel(&mut key);
            return Some(r);
        }
        // Under loom only: loom keeps no unpark token for a thread that is blocked on something
        // else when the unpark comes (its `set_unparked` unblocks the thread whatever it waits
        // on: tokio-rs/loom#249), where std keeps the token and the park below returns at once.
        // A `ready` that takes a lock (the event log's) can be blocked so while a notify takes
        // this entry and unparks us; the park would then sleep with its wake-up spent. A
        // notify that took the entry has unparked us, or will, once we are runnable, which
        // loom does keep: so look again instead of parking.
        #[cfg(lanestream_loom)]
        if !list.is_registered(key) {
            continue;
        }
        match deadline {
            None => sync::park(),
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    list.cancel(&mut key);
                    return None;
                }
                sync::park_timeout(d - now);
            }
        }
    }
}

/// One poll of an async wait: `Some` if `ready` gives a value now (and `key` is cancelled), else
/// `None` with `waker` registered on `list` under `key` and the condition re-checked. The
/// caller keeps `key` in its future, returns `Pending` on `None`, and calls
/// [`WaitList::cancel`] when the future is dropped. `arm` runs after the registration, as in
/// [`block_until`].
pub fn poll_until<R>(
    list: &WaitList,
    arm: impl Fn(),
    key: &mut Option<u64>,
    waker: &Waker,
    mut ready: impl FnMut() -> Option<R>,
) -> Option<R> {
    if let Some(r) = ready() {
        list.cancel(key);
        return Some(r);
    }
    list.register(key, Some(waker));
    arm();
    if let Some(r) = ready() {
        list.cancel(key);
        return Some(r);
    }
    None
}
