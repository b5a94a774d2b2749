//! [`EventLog`] (opening a log), [`WriteHandle`] (appending) and [`AppendFuture`].

use std::fmt;
use std::fs;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::condition::AppendCondition;
use super::disk::file::{FrameCache, SegmentFile};
use super::disk::format::{FORMAT_VERSION, HEADER_LEN, header};
use super::disk::marker::MarkerFile;
use super::disk::storage::{DirClaim, FileStorage, Storage, segment_name, sync_dir};
use super::error::{AppendError, OpenError, ReadError};
use super::event::Event;
use super::follow::{self, Follower};
use super::options::LogOptions;
use super::position::{LogPosition, PositionRange};
use super::query::Query;
use super::queue::{AppendResult, Queue, ReplySlot, Request};
use super::read::{ReadHandle, Reads};
use super::recovery::recover;
use super::segment_writer::{Files, SegmentWriter};
use super::slots::EventSlots;
use super::snapshot::{IndexWriter, Shared, Snapshot};
use super::subscription::Subscription;
use super::writer::Writer;
use crate::sync::{JoinHandle, Mutex, lock};

/// Opens logs: [`EventLog::open`] for a durable log in a directory, [`EventLog::in_memory`] for
/// one that lives as long as the process. Both start the log's writer thread and hand out its
/// [`WriteHandle`].
///
/// ```
/// use lanestream_log::{AppendCondition, AppendError, Event, EventLog, LogOptions, Query};
///
/// let log = EventLog::in_memory(LogOptions::default())?;
/// let course = Query::tags(["course:3"]);
/// // Decide on what the log says about course 3 ...
/// let seen = log.read(&course, None, usize::MAX)?;
/// assert!(seen.events().is_empty());
/// // ... and append only if nothing about it was appended since.
/// let guard = AppendCondition::new(course.clone(), seen.head());
/// let defined = Event::new("CourseDefined", ["course:3"], &b"{\"capacity\":10}"[..])?;
/// let range = log.append(vec![defined.clone()], Some(guard.clone()))?;
/// assert_eq!(range.first.get(), 1);
/// // The same decision again now conflicts, naming the event that got in first.
/// let again = log.append(vec![defined], Some(guard)).unwrap_err();
/// assert!(matches!(again, AppendError::Conflict { at } if at.get() == 1));
/// log.close();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct EventLog {
    _private: (),
}

impl EventLog {
    /// A log held in memory only: an append is acknowledged once it is published.
    ///
    /// # Errors
    /// [`OpenError::InvalidOption`]; [`OpenError::Io`] if the writer thread cannot be started.
    pub fn in_memory(options: LogOptions) -> Result<WriteHandle, OpenError> {
        options.validate()?;
        start(options, EventSlots::new(), IndexWriter::new(), 0, None)
    }

    /// Opens (creating it if needed) the durable log in `dir`: recovers every valid record (see
    /// [the format](super#on-disk)), truncates a torn tail, rebuilds the index, and resumes at
    /// the recovered head + 1. An append is acknowledged once its group commit is fsynced.
    ///
    /// One writer per directory: while a log is open its directory is claimed in this process
    /// and, against other processes, by an exclusive advisory lock (`flock(2)`) on the file
    /// `LOCK` in it, taken before recovery reads anything and held until the log's writer stops
    /// (or the process ends, however). Advisory: only lanestream logs honour it, and it is as
    /// good as the file system's `flock` (local file systems; not every network one).
    ///
    /// # Errors
    /// [`OpenError::InvalidOption`], [`OpenError::AlreadyOpen`] (open in this process),
    /// [`OpenError::Locked`] (open in another process), [`OpenError::Io`],
    /// [`OpenError::Corrupt`], [`OpenError::UnsupportedVersion`], [`OpenError::StrayFile`]. An
    /// open that fails changes nothing on disk (but for the directory and its `LOCK` file,
    /// created if missing): recovery decides first, and its repairs (a torn tail truncated,
    /// index files rebuilt or removed) are made only once nothing is left to refuse; only an
    /// [`OpenError::Io`] in the middle of them leaves some made (see [`OpenError`]).
    pub fn open(dir: impl AsRef<Path>, options: LogOptions) -> Result<WriteHandle, OpenError> {
        EventLog::open_with(dir.as_ref(), options, |s| s)
    }

    /// As [`open`](EventLog::open), with the segment storage wrapped by `wrap` (tests inject
    /// faults this way).
    pub(crate) fn open_with(
        dir: &Path,
        options: LogOptions,
        wrap: impl FnOnce(Box<dyn Storage>) -> Box<dyn Storage>,
    ) -> Result<WriteHandle, OpenError> {
        options.validate()?;
        let io = |op, path: &Path| {
            let path = path.to_path_buf();
            move |source| OpenError::Io { op, path, source }
        };
        let existed = dir.exists();
        fs::create_dir_all(dir).map_err(io("creating", dir))?;
        let dir = fs::canonicalize(dir).map_err(io("resolving", dir))?;
        if !existed {
            // The new directory's own entry must survive a crash too, or so would nothing in it.
            if let Some(parent) = dir.parent() {
                sync_dir(parent).map_err(io("syncing", parent))?;
            }
        }
        let claim = DirClaim::claim(&dir)?;
        let events = EventSlots::new();
        let mut index = IndexWriter::new();
        let cache = (options.cache_bytes > 0).then(|| Arc::new(FrameCache::new(options.cache_bytes)));
        let recovery =
            recover(&dir, cache.clone(), |segment, file| index.add_segment(&events, segment, file))?;
        // Recovery has decided and changed nothing: from here on only I/O can fail the open, and
        // only now are the log's files repaired (an open that fails changes nothing on disk).
        let recovered = recovery.repair()?;
        index.shrink_scratch();
        let marker = MarkerFile::open(&dir).map_err(io("opening the commit marker in", &dir))?;
        let (storage, current_len, files) = match recovered.last {
            Some(last) => {
                let storage =
                    FileStorage::resume(&dir, &last.path, claim).map_err(io("opening", &last.path))?;
                let files = Files {
                    dir: dir.clone(),
                    cache,
                    first: last.first,
                    file: last.file,
                    blocks: last.blocks,
                    marker,
                };
                (storage, last.len, files)
            }
            None => {
                let storage = FileStorage::create(&dir, 1, &header(1), claim)
                    .map_err(io("creating a segment in", &dir))?;
                let path = dir.join(segment_name(1));
                let file = SegmentFile::open(&path, 1, FORMAT_VERSION, cache.clone())
                    .map_err(io("opening", &path))?;
                let files = Files {
                    dir: dir.clone(),
                    cache,
                    first: 1,
                    file: Arc::new(file),
                    blocks: Vec::new(),
                    marker,
                };
                (storage, HEADER_LEN as u64, files)
            }
        };
        // Followers in other processes see what recovery kept from here on.
        let mut files = files;
        files.publish(current_len);
        let segments =
            SegmentWriter::new(wrap(Box::new(storage)), current_len, options.segment_bytes, Some(files));
        start(options, events, index, recovered.next - 1, Some(segments))
    }

    /// Opens the log in `dir` read-only, as a **follower** of its writer, which may be running
    /// in another process (or this one) or not at all: reads and subscriptions see every append
    /// once the writer has made it durable (fsynced), never before, and go on across the
    /// writer's crashes and restarts without a gap or a repeat. A follower takes no lock, writes
    /// nothing and never truncates: what it reads is what the writer's commit marker (the
    /// directory's `COMMIT` file) says is durable.
    ///
    /// A thread polls the marker every [`LogOptions::follow_interval`] (1 ms by default: the
    /// wake-up latency is at most that, plus the read of the new records) and stops when the
    /// last handle to the follower's log is dropped. The returned handle reads and subscribes
    /// as any [`ReadHandle`]; [`ReadHandle::is_closed`] stays `false` (a follower does not know
    /// whether the writer will come back). If what the marker covers turns out damaged, the
    /// follower stops and its subscriptions end with [`SubscriptionError::Failed`](crate::SubscriptionError::Failed).
    ///
    /// A directory no writer of this version has opened yet (no marker) reads as empty until
    /// one does.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lanestream_log::{Event, EventLog, LogOptions, Query};
    ///
    /// let dir = std::env::temp_dir().join(format!("lanestream-log-doc-follow-{}", std::process::id()));
    /// let log = EventLog::open(&dir, LogOptions::default())?;
    /// // Typically in another process:
    /// let follower = EventLog::open_read_only(&dir, LogOptions::default())?;
    /// let mut sub = follower.subscribe(Query::All, None);
    /// log.append(vec![Event::untagged("Paid", &b"1"[..])?], None)?;
    /// let batch = sub.next_batch_timeout(Duration::from_secs(10))?.expect("a follower never closes");
    /// assert_eq!(batch[0].position.get(), 1);
    /// assert_eq!(&batch[0].event.data()[..], b"1");
    /// log.close();
    /// # drop((sub, follower));
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`OpenError::InvalidOption`]; [`OpenError::Io`] (the directory does not exist or cannot
    /// be read, or the thread cannot be started); [`OpenError::Corrupt`] and
    /// [`OpenError::UnsupportedVersion`] for what the marker covers, as [`open`](EventLog::open).
    pub fn open_read_only(dir: impl AsRef<Path>, options: LogOptions) -> Result<ReadHandle, OpenError> {
        options.validate()?;
        let dir = dir.as_ref();
        let dir = fs::canonicalize(dir).map_err(|source| OpenError::Io {
            op: "resolving",
            path: dir.to_path_buf(),
            source,
        })?;
        let cache = (options.cache_bytes > 0).then(|| Arc::new(FrameCache::new(options.cache_bytes)));
        let events = EventSlots::new();
        let mut follower = Follower::new(dir, cache);
        follower.catch_up(&events)?;
        follower.index.shrink_scratch();
        let index = &follower.index;
        let snapshot = Snapshot { head: follower.head, types: index.types.clone(), tags: index.tags.clone() };
        let shared =
            Arc::new(Shared::new(snapshot, events, index.appends.clone(), options.subscription_batch));
        follow::spawn(follower, Arc::downgrade(&shared), options.follow_interval).map_err(|source| {
            OpenError::Io { op: "starting the follower thread for", path: "the log".into(), source }
        })?;
        Ok(ReadHandle { shared })
    }
}

#[cfg(lanestream_loom)]
impl EventLog {
    /// Loom models only: an in-memory log whose every fsync fails, so the models reach the
    /// writer's failure path (fail the group commit with `Io`, refuse writes from then on, wake
    /// every waiter) without files.
    #[doc(hidden)]
    pub fn loom_failing_sync(options: LogOptions) -> Result<WriteHandle, OpenError> {
        /// Accepts every write and fails every sync.
        #[derive(Debug)]
        struct SyncFails;
        impl Storage for SyncFails {
            fn create_segment(&mut self, _: u64, _: &[u8]) -> std::io::Result<()> {
                Ok(())
            }
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                Ok(bytes.len())
            }
            fn sync(&mut self) -> std::io::Result<()> {
                Err(std::io::Error::other("loom model: injected fsync failure"))
            }
        }
        options.validate()?;
        let segments =
            SegmentWriter::new(Box::new(SyncFails), HEADER_LEN as u64, options.segment_bytes, None);
        start(options, EventSlots::new(), IndexWriter::new(), 0, Some(segments))
    }
}

fn start(
    options: LogOptions,
    events: EventSlots,
    index: IndexWriter,
    head: u64,
    segments: Option<SegmentWriter>,
) -> Result<WriteHandle, OpenError> {
    let snapshot = Snapshot { head, types: index.types.clone(), tags: index.tags.clone() };
    let shared = Arc::new(Shared::new(snapshot, events, index.appends.clone(), options.subscription_batch));
    let queue = Arc::new(Queue::new(options.queue_capacity));
    let writer = Writer {
        shared: shared.clone(),
        queue: queue.clone(),
        index,
        head,
        segments,
        max_drain_requests: options.max_drain_requests,
        max_drain_bytes: options.max_drain_bytes,
        stopped: false,
        scratch: Default::default(),
    };
    let (writer, thread) = writer.spawn().map_err(|source| OpenError::Io {
        op: "starting the writer thread for",
        path: "the log".into(),
        source,
    })?;
    let link = WriterLink {
        queue,
        writer,
        thread: Mutex::new(Some(thread)),
        shared: shared.clone(),
        max_append_bytes: options.max_append_bytes,
    };
    Ok(WriteHandle { link: Arc::new(link), reader: ReadHandle { shared } })
}

/// What every clone of a write handle shares; the last one dropped stops the writer.
struct WriterLink {
    queue: Arc<Queue>,
    /// The writer's state, for inline commits.
    writer: Arc<Mutex<Writer>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    shared: Arc<Shared>,
    max_append_bytes: usize,
}

impl WriterLink {
    fn close(&self) {
        self.queue.close();
        let thread = lock(&self.thread).take();
        match thread {
            Some(t) => {
                // A panic of the writer was already turned into a failure by its end guard.
                let _ = t.join();
            }
            None => {
                self.shared.signal.wait(|| self.shared.is_closed(), None);
            }
        }
    }
}

impl Drop for WriterLink {
    fn drop(&mut self) {
        self.close();
    }
}

/// The handle that appends to a log (and reads it); cheap to clone, `Send + Sync`.
///
/// Every clone feeds the same single writer. [`close`](WriteHandle::close) stops it; so does
/// dropping the last clone (waiting for the writer to finish what is queued). A
/// [`ReadHandle`] or [`Subscription`] does not keep the writer running.
#[derive(Clone)]
pub struct WriteHandle {
    link: Arc<WriterLink>,
    reader: ReadHandle,
}

impl WriteHandle {
    /// Checks an append on the caller's thread and wraps it for the writer.
    fn prepare(
        &self,
        events: Vec<Event>,
        condition: Option<AppendCondition>,
    ) -> Result<(Request, Arc<ReplySlot>), AppendError> {
        if events.is_empty() {
            return Err(AppendError::Empty);
        }
        let bytes: usize = events.iter().map(Event::encoded_len).sum();
        if bytes > self.link.max_append_bytes {
            return Err(AppendError::TooLarge { bytes, max: self.link.max_append_bytes });
        }
        if let Some(cause) = self.link.shared.failure.get() {
            return Err(AppendError::Failed(cause.clone()));
        }
        let (slot, reply) = ReplySlot::pair();
        Ok((Request { events, condition, bytes, reply }, slot))
    }

    /// Appends `events` as one atomic unit at the next dense positions, in the order given, if
    /// `condition` (when given) holds; blocks while the request queue is full and until the
    /// events are durable (file mode: fsynced) or published (in memory). When it returns
    /// `Ok(range)`, every thread can already read `range`.
    ///
    /// When the writer is idle (nothing queued, no group being committed) the append is
    /// committed on the calling thread, fsync included, with no thread hand-off; otherwise it
    /// is queued and committed by the writer thread in a group with the others ([module
    /// docs](crate#engine)). Either way the outcome is the same.
    ///
    /// # Errors
    /// [`AppendError::Empty`] and [`AppendError::TooLarge`] (on the caller's thread, never
    /// queued), [`AppendError::Conflict`], [`AppendError::AfterBeyondHead`],
    /// [`AppendError::Io`], [`AppendError::Failed`], [`AppendError::Shutdown`]. No error but
    /// `Io` consumes a position.
    pub fn append(
        &self,
        events: Vec<Event>,
        condition: Option<AppendCondition>,
    ) -> Result<PositionRange, AppendError> {
        let (request, slot) = self.prepare(events, condition)?;
        let Err(request) =
            Writer::commit_inline(&self.link.writer, &self.link.queue, &self.link.shared, request)
        else {
            return slot.wait();
        };
        if self.link.queue.push(request).is_err() {
            return Err(AppendError::Shutdown);
        }
        slot.wait()
    }

    /// As [`append`](WriteHandle::append), awaiting instead of blocking; any executor, no
    /// runtime needed. The append is queued at the future's first poll that finds room; once
    /// queued, dropping the future does not withdraw it (only its reply is lost).
    pub fn append_async(&self, events: Vec<Event>, condition: Option<AppendCondition>) -> AppendFuture {
        let state = match self.prepare(events, condition) {
            Ok((request, slot)) => State::Queueing { request: Some(request), slot },
            Err(e) => State::Refused(Some(e)),
        };
        AppendFuture { link: self.link.clone(), state, key: None }
    }

    /// A handle for reads and subscriptions only.
    pub fn reader(&self) -> ReadHandle {
        self.reader.clone()
    }

    /// As [`ReadHandle::read`].
    ///
    /// # Errors
    /// As [`ReadHandle::read`].
    pub fn read(&self, query: &Query, after: Option<LogPosition>, limit: usize) -> Result<Reads, ReadError> {
        self.reader.read(query, after, limit)
    }

    /// As [`ReadHandle::read_back`].
    ///
    /// # Errors
    /// As [`ReadHandle::read`].
    pub fn read_back(
        &self,
        query: &Query,
        before: Option<LogPosition>,
        limit: usize,
    ) -> Result<Reads, ReadError> {
        self.reader.read_back(query, before, limit)
    }

    /// As [`ReadHandle::subscribe`].
    pub fn subscribe(&self, query: Query, after: Option<LogPosition>) -> Subscription {
        self.reader.subscribe(query, after)
    }

    /// As [`ReadHandle::head`].
    pub fn head(&self) -> Option<LogPosition> {
        self.reader.head()
    }

    /// Closes the log: appends not yet queued get [`AppendError::Shutdown`], those already
    /// queued are still committed and answered; then the writer stops, subscriptions deliver
    /// what was published and end. Returns once the writer has stopped (its files closed).
    /// Idempotent; reads keep working.
    pub fn close(&self) {
        self.link.close();
    }

    /// Whether the writer has stopped.
    pub fn is_closed(&self) -> bool {
        self.reader.is_closed()
    }
}

#[cfg(test)]
impl WriteHandle {
    /// Whether the request queue was closed (tests).
    pub(crate) fn queue_closed(&self) -> bool {
        self.link.queue.is_closed()
    }
}

impl fmt::Debug for WriteHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteHandle")
            .field("queue", &self.link.queue)
            .field("log", &self.link.shared)
            .finish()
    }
}

enum State {
    Refused(Option<AppendError>),
    Queueing { request: Option<Request>, slot: Arc<ReplySlot> },
    Waiting(Arc<ReplySlot>),
    Done,
}

/// The future of [`WriteHandle::append_async`]: `Send`, `Unpin`, no runtime needed.
#[must_use = "futures do nothing unless polled; the append is queued at the first poll"]
pub struct AppendFuture {
    link: Arc<WriterLink>,
    state: State,
    /// Registered with the queue while waiting for room, then with the reply slot.
    key: Option<u64>,
}

impl Future for AppendFuture {
    type Output = AppendResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<AppendResult> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Refused(e) => {
                    let e = e.take().expect("polled after completion");
                    this.state = State::Done;
                    return Poll::Ready(Err(e));
                }
                State::Queueing { request, slot } => {
                    match this.link.queue.poll_push(request, &mut this.key, cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(true) => this.state = State::Waiting(slot.clone()),
                        Poll::Ready(false) => {
                            this.state = State::Done;
                            return Poll::Ready(Err(AppendError::Shutdown));
                        }
                    }
                }
                State::Waiting(slot) => {
                    let r = std::task::ready!(slot.poll(&mut this.key, cx));
                    this.state = State::Done;
                    return Poll::Ready(r);
                }
                State::Done => panic!("AppendFuture polled after completion"),
            }
        }
    }
}

impl Drop for AppendFuture {
    fn drop(&mut self) {
        match &self.state {
            State::Queueing { .. } => self.link.queue.cancel(&mut self.key),
            State::Waiting(slot) => slot.cancel(&mut self.key),
            State::Refused(_) | State::Done => {}
        }
    }
}

impl fmt::Debug for AppendFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Refused(_) => "refused",
            State::Queueing { .. } => "queueing",
            State::Waiting(_) => "waiting for the writer",
            State::Done => "done",
        };
        f.debug_struct("AppendFuture").field("state", &state).finish()
    }
}

impl fmt::Debug for WriterLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriterLink").field("queue", &self.queue).finish()
    }
}
