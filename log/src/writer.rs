//! The single writer: one thread behind the bounded request queue, committing in groups.
//!
//! Each round it drains up to a budget of requests (count and bytes) and, in queue order, decides
//! each one against the log **plus the appends accepted earlier in the same round** (those are
//! already in the event slots and the index, above the published head): a refused condition's
//! `Conflict { at }` is the real lowest matching position, never a conservative "maybe". Accepted
//! appends get dense positions and their records go into one buffer; in file mode the buffer is
//! written and fsynced once. Then the new snapshot is published (arc-swap) and only then does
//! anyone get a reply, so a caller holding `Ok(range)` — and every thread it tells — can read
//! `range` at once.
//!
//! A failed write or fsync fails every request of that round with `Io`, publishes nothing, and
//! leaves the log refusing writes (`Failed`): the fsync is never retried, since after a failure
//! the kernel may have dropped the dirty pages, and a retry that succeeds would lie.
//!
//! **Inline commits.** The writer's state sits behind a mutex. A blocking append that finds the
//! writer idle — nothing queued, no group being committed, the state's lock free — commits its
//! own request on its own thread ([`Writer::commit_inline`]): the same decide / write / fsync /
//! publish / reply steps, without the two thread hand-offs (queue to writer, reply to appender)
//! that otherwise cost more than the commit itself. A lone appender never waits for another
//! thread; as soon as appends overlap, they queue and the writer thread commits them in groups.
//! The writer thread ending takes the lock and marks the state stopped, so no inline commit runs
//! after it (nor after `close`: a closed queue is never idle).

use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::thread;

use crate::sync::{JoinHandle, Mutex, Ordering, ThreadBuilder, lock};

use super::disk::file::Loc;
use super::error::AppendError;
use super::event::Event;
use super::event::Payloads;
use super::position::{LogPosition, PositionRange, raw};
use super::queue::{AppendResult, Queue, ReplySender, Request};
use super::segment_writer::{SegmentWriter, encode_record};
use super::snapshot::{IndexWriter, Shared, Snapshot, View};

/// The writer thread's state.
#[derive(Debug)]
pub(crate) struct Writer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) queue: Arc<Queue>,
    pub(crate) index: IndexWriter,
    /// The published head.
    pub(crate) head: u64,
    /// `None` in memory.
    pub(crate) segments: Option<SegmentWriter>,
    pub(crate) max_drain_requests: usize,
    pub(crate) max_drain_bytes: usize,
    /// The writer thread has ended: no inline commit may run.
    pub(crate) stopped: bool,
    /// Scratch buffers of [`Writer::commit`], kept between rounds.
    pub(crate) scratch: Scratch,
}

/// The buffers one commit fills and empties (kept to avoid an allocation per round).
#[derive(Default)]
pub(crate) struct Scratch {
    batch: Vec<Request>,
    records: Vec<u8>,
    outcomes: Vec<(ReplySender, AppendResult)>,
    events: Vec<Event>,
    /// Where each staged event's payload lands in `records` (then in its segment).
    locs: Vec<Loc>,
}

/// Ends the log when the writer thread stops, however it stops: refuses new requests, answers
/// the ones still queued, marks the log closed (after its last publish) and wakes every waiter.
struct EndGuard {
    shared: Arc<Shared>,
    queue: Arc<Queue>,
    state: Arc<Mutex<Writer>>,
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        if thread::panicking() {
            let _ = self.shared.failure.set(Arc::new(io::Error::other("the log's writer thread panicked")));
        }
        // Under the state's lock: an inline commit in progress finishes first, none starts after.
        // Dropping the segment writer closes the files and releases the directory's claim, so
        // the log can be opened again once `close` returns.
        {
            let mut w = lock(&self.state);
            w.stopped = true;
            w.segments = None;
        }
        self.queue.close();
        let mut rest = Vec::new();
        while self.queue.drain(usize::MAX, usize::MAX, &mut rest) {
            for r in rest.drain(..) {
                let err = match self.shared.failure.get() {
                    Some(cause) => AppendError::Failed(cause.clone()),
                    None => AppendError::Shutdown,
                };
                r.reply.send(Err(err));
            }
        }
        // Release: pairs with `is_closed`'s Acquire; every reply and snapshot above comes first.
        self.shared.closed.store(true, Ordering::Release);
        self.shared.signal.notify();
    }
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch").field("batch", &self.batch).finish_non_exhaustive()
    }
}

impl Writer {
    /// Starts the writer thread; returns the state, shared with inline commits.
    pub(crate) fn spawn(self) -> io::Result<(Arc<Mutex<Writer>>, JoinHandle<()>)> {
        let (shared, queue) = (self.shared.clone(), self.queue.clone());
        let (max_requests, max_bytes) = (self.max_drain_requests, self.max_drain_bytes);
        let state = Arc::new(Mutex::new(self));
        let end = EndGuard { shared, queue, state: state.clone() };
        let thread = ThreadBuilder::new().name("lanestream-log-writer".into()).spawn(move || {
            let mut batch = Vec::new();
            while end.queue.drain(max_requests, max_bytes, &mut batch) {
                let wake = lock(&end.state).commit(&mut batch);
                end.queue.committed();
                if wake {
                    end.shared.signal.notify();
                }
            }
        })?;
        Ok((state, thread))
    }

    /// Commits `request` on the calling thread if the writer is idle (see the module docs);
    /// hands it back otherwise, to be queued. Its reply is in its slot when this returns `Ok`.
    pub(crate) fn commit_inline(
        state: &Mutex<Writer>,
        queue: &Queue,
        shared: &Shared,
        request: Request,
    ) -> Result<(), Request> {
        // Busy (the writer thread or another inline commit) or poisoned: queue it.
        let Ok(mut w) = state.try_lock() else {
            return Err(request);
        };
        if w.stopped || !queue.is_idle() {
            return Err(request);
        }
        let mut batch = std::mem::take(&mut w.scratch.batch);
        batch.push(request);
        // A panic (a storage bug) fails the log as one on the writer thread does: the request
        // in flight is answered `Io` (its reply sender dropped in the unwinding: the outcome is
        // unknown), later writes get `Failed`, and the log ends. It does not reach the appender.
        let committed = panic::catch_unwind(AssertUnwindSafe(|| w.commit(&mut batch)));
        match committed {
            Ok(wake) => {
                w.scratch.batch = batch;
                drop(w);
                if wake {
                    shared.signal.notify();
                }
            }
            Err(_) => {
                // Failed before the lock is released: the state may be half-updated (slots
                // filled, postings pushed, the head not moved), and the next holder — the
                // writer thread, often already waiting with a queued group — must refuse its
                // requests (`Failed`), not commit them on what the panic left behind. (The
                // caught panic does not poison the lock, as one on the writer thread does.)
                let _ = shared
                    .failure
                    .set(Arc::new(io::Error::other("the log's writer panicked (inline commit)")));
                drop(w);
                // The writer thread ends (its end guard marks the log closed and wakes everyone).
                queue.close();
                shared.signal.wait(|| shared.is_closed(), None);
            }
        }
        Ok(())
    }

    /// Decides, writes, publishes and answers one group of requests. Returns whether the
    /// subscribers must be woken (something was published, or the log failed): the caller
    /// notifies them once it has released the writer's lock, so no waker runs under it (P13:
    /// the notify still follows the snapshot's store).
    #[must_use = "wake the subscribers when it says so"]
    fn commit(&mut self, batch: &mut Vec<Request>) -> bool {
        let mut scratch = std::mem::take(&mut self.scratch);
        let wake = self.commit_with(batch, &mut scratch);
        self.scratch = scratch;
        wake
    }

    fn commit_with(&mut self, batch: &mut Vec<Request>, scratch: &mut Scratch) -> bool {
        let Scratch { records, outcomes, events, locs, .. } = scratch;
        if let Some(cause) = self.shared.failure.get() {
            for r in batch.drain(..) {
                r.reply.send(Err(AppendError::Failed(cause.clone())));
            }
            return false;
        }
        records.clear();
        locs.clear();
        let mut staged = self.head;
        for r in batch.drain(..) {
            let result = self.decide(&r, staged, events);
            if result.is_ok() {
                let first = staged + 1;
                let n = r.events.len() as u64;
                if self.segments.is_some() {
                    encode_record(records, first, &r.events, locs);
                }
                self.index.stage_append(first, &r.events);
                events.extend(r.events);
                staged = first + n - 1;
            }
            outcomes.push((r.reply, result));
        }
        let published = staged > self.head;
        if published {
            // Index and store the group commit: one run per posting list, one block of events
            // with interned names (and, on disk, where each payload went); readers see none of
            // it until the snapshot below.
            self.index.flush();
            let first = self.head + 1;
            let written = match &mut self.segments {
                Some(segments) => match segments.commit(records, first) {
                    Ok(written) => written,
                    Err(e) => {
                        let cause = Arc::new(e);
                        let _ = self.shared.failure.set(cause.clone());
                        for (reply, _) in outcomes.drain(..) {
                            reply.send(Err(AppendError::Io(cause.clone())));
                        }
                        events.clear();
                        return true;
                    }
                },
                None => None,
            };
            let payloads = match written {
                Some((file, base)) => {
                    // The payloads are on disk now: the block keeps where, not the bytes.
                    locs.iter_mut().for_each(|l| l.shift(base));
                    Payloads::Disk { file, at: std::mem::take(locs) }
                }
                None => Payloads::Memory(events.iter().map(|e| e.data().clone()).collect()),
            };
            let block = Arc::new(self.index.take_block(first, payloads));
            if let Some(segments) = &mut self.segments {
                segments.add_block(block.clone());
            }
            for i in 0..events.len() {
                self.shared.events.set(first + i as u64, Event::stored(block.clone(), i as u32));
            }
            events.clear();
            self.shared.snapshot.store(Arc::new(Snapshot {
                head: staged,
                types: self.index.types.clone(),
                tags: self.index.tags.clone(),
            }));
            self.head = staged;
        }
        for (reply, result) in outcomes.drain(..) {
            reply.send(result);
        }
        published
    }

    /// The outcome of `r` against the log plus what this round accepted up to `staged` (the
    /// events at `head + 1..=staged`, not yet stored: `events`).
    fn decide(&mut self, r: &Request, staged: u64, events: &[Event]) -> AppendResult {
        let n = r.events.len() as u64;
        if let Some(c) = &r.condition {
            let after = raw(c.after);
            if after > self.head {
                return Err(AppendError::AfterBeyondHead {
                    after: c.after.expect("above 0"),
                    head: LogPosition::from_raw(self.head),
                });
            }
            if self.index.has_unflushed() {
                self.index.flush();
            }
            let view = View {
                head: staged,
                types: &self.index.types,
                tags: &self.index.tags,
                events: &self.shared.events,
                staged: events,
                staged_from: self.head + 1,
            };
            if let Some(at) = view.first_match(&c.fail_if_events_match, after) {
                return Err(AppendError::Conflict {
                    at: LogPosition::new(at).expect("positions start at 1"),
                });
            }
        }
        Ok(PositionRange::from_raw(staged + 1, n))
    }
}
