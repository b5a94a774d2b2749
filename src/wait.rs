//! Waiting: spin briefly, then park the thread or register the task's waker.
//!
//! Each lane has two [`WaitList`]s: consumers wait on one for items, producers on the other for
//! room. A list holds any number of waiters (a detached consumer may still be parked, and the
//! request lane has many senders) and wakes them all on every notification, so a woken waiter
//! that goes away (a dropped future) never swallows a wake-up another waiter needed.
//!
//! # Memory ordering: register-then-check against change-then-notify
//! A waiter registers, then re-checks its condition, then sleeps. A notifier changes the state,
//! then notifies. Both sides touch `waiting` with a read-modify-write (`AcqRel`): RMWs on one
//! atomic are totally ordered, so either the notifier's RMW comes later and sees `waiting > 0`
//! (and wakes the waiter), or the waiter's RMW comes later, reads from the notifier's Release and
//! so its re-check sees the change. No `SeqCst` is needed, and loom checks this exactly.

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

/// A set of waiters, woken all at once by [`notify`](WaitList::notify).
pub(crate) struct WaitList {
    /// How many entries are registered. Touched only by RMWs (see the module docs).
    waiting: AtomicUsize,
    entries: Mutex<Entries>,
}

/// How many waiters one locked round of `notify` takes out before waking them outside the lock.
const WAKE_BATCH: usize = 8;

impl WaitList {
    /// An empty list with room for `expected` waiters before it grows ([M1](crate::contract#m1): a lane has at most two
    /// live waiters in normal use, and re-polling replaces an entry instead of adding one).
    pub(crate) fn new(expected: usize) -> WaitList {
        WaitList {
            waiting: AtomicUsize::new(0),
            entries: Mutex::new(Entries { next_key: 0, list: Vec::with_capacity(expected) }),
        }
    }

    /// Registers (or, if `key` is still registered, replaces) a waiter: the task of `waker`, or
    /// the current thread for `None`. `waker` is cloned only when it would not wake the task
    /// already registered under `key`. The caller re-checks its condition afterwards (module
    /// docs) and cancels the key when it stops waiting.
    pub(crate) fn register(&self, key: &mut Option<u64>, waker: Option<&Waker>) {
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

    /// Removes the waiter registered under `key`, if a notification has not already taken it.
    pub(crate) fn cancel(&self, key: &mut Option<u64>) {
        let Some(k) = key.take() else { return };
        let mut entries = lock(&self.entries);
        if let Some(i) = entries.list.iter().position(|e| e.key == k) {
            entries.list.swap_remove(i);
            // Relaxed: the lock orders the list; the count only has to stay in step with it.
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Wakes every registered waiter. Costs one uncontended RMW when nobody waits.
    pub(crate) fn notify(&self) {
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

/// Blocks until `ready` gives a value: checks, spins briefly (crossbeam's `Backoff`), then parks
/// until notified. `None` if `deadline` passed first.
///
/// `arm` runs after each registration and before the re-check: it raises the ring's own
/// "someone waits" bit (an RMW), so the hot-path notifier can skip the list when nobody waits
/// (and may register the thread on further lists, whose notifiers then wake it too).
pub(crate) fn block_until<R>(
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

/// One poll of an async wait: ready now, or registered with `waker` and re-checked. The caller
/// keeps `key` in its future and calls [`WaitList::cancel`] when the future is dropped.
pub(crate) fn poll_until<R>(
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
