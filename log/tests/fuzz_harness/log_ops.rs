//! `log_ops`: sequences of appends (some conditional, some queued together so that they meet in
//! one group commit), reads, backward reads, point reads, subscriptions, close and reopen,
//! applied to a real log (in memory, or durable on tmpfs) and to a reference model — a `Vec` of
//! events whose conditions and queries are evaluated by a full scan — and compared after every
//! step: every answer equal.
//!
//! The model follows the log's documentation (`lanestream_log`): positions dense from 1; an
//! append is refused as `Empty`, then `TooLarge`, on the caller's thread, then `Shutdown` once the
//! log is closed, then `AfterBeyondHead`, then `Conflict { at }` naming the lowest matching
//! position after `after`; a read covers `(after, W]` ascending, a backward read `[1, before)`
//! descending, both with the documented `is_cut_short` and `resume`; a subscription batch is the
//! next (at most `batch_limit`) matching events after its cursor, the cursor moving to the last
//! one delivered or, when there is none, to the head.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use lanestream_log::{
    AppendCondition, AppendError, Event, EventLog, LogOptions, LogPosition, PositionRange, Query, QueryError,
    QueryItem, ReadHandle, Reads, SequencedEvent, Subscription, TryNextError, WriteHandle,
};

use super::log_segment::TempDir;

/// Event types: the events use the first three; queries may name the fourth, which never occurs.
const TYPES: [&str; 4] = ["A", "B", "C", "Dx"];
/// Tags: the events use the first four; queries may name the fifth, which never occurs.
const TAGS: [&str; 5] = ["t0", "t1", "t2", "t3", "t9"];
/// At most this many live subscriptions.
const MAX_SUBS: usize = 4;

/// One event: a type (of three), a set of tags (of four), a payload of up to 47 bytes.
#[derive(Arbitrary, Clone, Debug)]
pub struct EventSpec {
    ty: u8,
    tags: u8,
    data: u8,
}

/// One query item: a set of types (empty: any) and a set of required tags.
#[derive(Arbitrary, Clone, Debug)]
pub struct ItemSpec {
    types: u8,
    tags: u8,
}

/// `Query::All`, or the items (no items: `Query::items` must refuse them; `All` is used instead).
#[derive(Arbitrary, Clone, Debug)]
pub struct QuerySpec {
    all: bool,
    items: Vec<ItemSpec>,
}

/// An append condition; `after` is taken modulo head + 2 (0: `None`), so it reaches one past
/// the head.
#[derive(Arbitrary, Clone, Debug)]
pub struct CondSpec {
    query: QuerySpec,
    after: u8,
}

/// One append: up to four events (none: refused as `Empty`) and an optional condition.
#[derive(Arbitrary, Clone, Debug)]
pub struct AppendSpec {
    events: Vec<EventSpec>,
    condition: Option<CondSpec>,
}

/// One step.
#[derive(Arbitrary, Clone, Debug)]
pub enum Op {
    /// `append`, blocking.
    Append(AppendSpec),
    /// `append_async`, driven to completion.
    AppendAsync(AppendSpec),
    /// Up to six `append_async` queued in order before any is awaited, so that they meet in a
    /// group commit; their conditions' `after` is at most the head before the group (what a
    /// client can have read).
    Group(Vec<AppendSpec>),
    /// `read(query, after, limit)`.
    Read { query: QuerySpec, after: u8, limit: u8 },
    /// `read_back(query, before, limit)`.
    ReadBack { query: QuerySpec, before: Option<u8>, limit: u8 },
    /// `ReadHandle::get(position)`.
    Get { position: u8 },
    /// `subscribe(query, after)` with a batch limit of 1-4.
    Subscribe { query: QuerySpec, after: u8, batch: u8 },
    /// The next batch of one subscription: `try_next_batch`, `next_batch_timeout` or
    /// `next_batch_async` (`try_next_batch` whenever the model says nothing is ready).
    Next { sub: u8, how: u8 },
    /// `close()`.
    Close,
    /// Close and open the same directory again (durable logs only; otherwise nothing).
    Reopen,
}

/// A scenario: the log's sizes, durable or not, and the steps.
#[derive(Arbitrary, Debug)]
pub struct Scenario {
    durable: bool,
    queue_capacity: u8,
    max_drain_requests: u8,
    max_append_bytes: u8,
    ops: Vec<Op>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct ModelEvent {
    ty: usize,
    tags: u8,
    data: Vec<u8>,
}

impl EventSpec {
    fn model(&self, salt: usize) -> ModelEvent {
        let len = (self.data % 48) as usize;
        let data = (0..len).map(|i| self.data.wrapping_add((i + salt) as u8)).collect();
        ModelEvent { ty: (self.ty % 3) as usize, tags: self.tags & 0b1111, data }
    }
}

impl ModelEvent {
    fn real(&self) -> Event {
        let tags = (0..4).filter(|i| self.tags >> i & 1 != 0).map(|i| TAGS[i]);
        Event::new(TYPES[self.ty], tags, Bytes::from(self.data.clone())).expect("valid event")
    }
    /// The encoded size as documented: type, tags and payload with their length prefixes.
    fn encoded_len(&self) -> usize {
        let tags = (0..4).filter(|i| self.tags >> i & 1 != 0).map(|i| 2 + TAGS[i].len()).sum::<usize>();
        2 + TYPES[self.ty].len() + 2 + tags + 4 + self.data.len()
    }
    fn same_as(&self, e: &Event) -> bool {
        e.event_type() == TYPES[self.ty]
            && e.tags().eq((0..4).filter(|i| self.tags >> i & 1 != 0).map(|i| TAGS[i]))
            && e.data()[..] == self.data[..]
    }
}

/// The model's form of a query: `None` = every event.
type ModelQuery = Option<Vec<(u8, u8)>>;

impl QuerySpec {
    fn items(&self) -> Vec<(u8, u8)> {
        self.items.iter().take(3).map(|i| (i.types & 0b1111, i.tags & 0b11111)).collect()
    }

    /// The real query, and its model.
    fn build(&self) -> (Query, ModelQuery) {
        if self.all {
            return (Query::All, None);
        }
        let items = self.items();
        let real = Query::items(items.iter().map(|&(types, tags)| {
            QueryItem::new(
                (0..4).filter(|i| types >> i & 1 != 0).map(|i| TYPES[i]),
                (0..5).filter(|i| tags >> i & 1 != 0).map(|i| TAGS[i]),
            )
        }));
        match real {
            Ok(q) => (q, Some(items)),
            Err(QueryError::NoItems) => {
                assert!(items.is_empty(), "a query of {} items refused", items.len());
                (Query::All, None)
            }
            Err(e) => panic!("unexpected query error {e}"),
        }
    }
}

fn matches(q: &ModelQuery, e: &ModelEvent) -> bool {
    match q {
        None => true,
        Some(items) => items.iter().any(|&(types, tags)| {
            (types == 0 || types >> e.ty & 1 != 0) && (tags & 0b10000 == 0) && (e.tags & tags) == tags
        }),
    }
}

/// One append in both forms: the real events and condition, the model's events and condition.
type Prepared = (Vec<Event>, Option<AppendCondition>, Vec<ModelEvent>, Option<(ModelQuery, u64)>);

/// What an append answered, in comparable form.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Ok(u64, u64),
    Empty,
    TooLarge(usize, usize),
    Shutdown,
    AfterBeyondHead(u64, u64),
    Conflict(u64),
}

fn outcome(r: Result<PositionRange, AppendError>) -> Outcome {
    match r {
        Ok(range) => Outcome::Ok(range.first.get(), range.last.get()),
        Err(AppendError::Empty) => Outcome::Empty,
        Err(AppendError::TooLarge { bytes, max }) => Outcome::TooLarge(bytes, max),
        Err(AppendError::Shutdown) => Outcome::Shutdown,
        Err(AppendError::AfterBeyondHead { after, head }) => {
            Outcome::AfterBeyondHead(after.get(), head.map_or(0, LogPosition::get))
        }
        Err(AppendError::Conflict { at }) => Outcome::Conflict(at.get()),
        Err(e) => panic!("unexpected append error: {e}"),
    }
}

struct ModelSub {
    query: ModelQuery,
    cursor: u64,
    batch: usize,
}

struct Model {
    events: Vec<ModelEvent>,
    closed: bool,
    max_append_bytes: usize,
}

impl Model {
    fn head(&self) -> u64 {
        self.events.len() as u64
    }

    /// Matching positions in `lo..=hi`, ascending.
    fn matching(&self, q: &ModelQuery, lo: u64, hi: u64) -> Vec<u64> {
        (lo.max(1)..=hi.min(self.head())).filter(|&p| matches(q, &self.events[p as usize - 1])).collect()
    }

    fn append(&mut self, events: &[ModelEvent], condition: Option<(&ModelQuery, u64)>) -> Outcome {
        if events.is_empty() {
            return Outcome::Empty;
        }
        let bytes = events.iter().map(ModelEvent::encoded_len).sum();
        if bytes > self.max_append_bytes {
            return Outcome::TooLarge(bytes, self.max_append_bytes);
        }
        if self.closed {
            return Outcome::Shutdown;
        }
        if let Some((q, after)) = condition {
            if after > self.head() {
                return Outcome::AfterBeyondHead(after, self.head());
            }
            if let Some(&at) = self.matching(q, after + 1, self.head()).first() {
                return Outcome::Conflict(at);
            }
        }
        let first = self.head() + 1;
        self.events.extend_from_slice(events);
        Outcome::Ok(first, self.head())
    }
}

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn waker() -> Waker {
    Waker::from(Arc::new(ThreadWaker(std::thread::current())))
}

/// Drives `f` to completion on this thread (no runtime).
fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let waker = waker();
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park_timeout(Duration::from_millis(50));
    }
}

struct Harness {
    log: WriteHandle,
    model: Model,
    subs: Vec<(Subscription, ModelSub)>,
    dir: Option<TempDir>,
    options: LogOptions,
    salt: usize,
}

fn positions(events: &[SequencedEvent]) -> Vec<u64> {
    events.iter().map(|s| s.position.get()).collect()
}

impl Harness {
    fn check_events(&self, got: &[SequencedEvent]) {
        for s in got {
            let m = &self.model.events[s.position.get() as usize - 1];
            assert!(m.same_as(&s.event), "event at {} is {:?}, the model has {m:?}", s.position, s.event);
        }
    }

    fn check_reads(&self, what: &str, got: &Reads, want: &[u64], cut_short: bool, resume: u64) {
        assert_eq!(positions(got.events()), want, "{what}: positions");
        self.check_events(got.events());
        assert_eq!(got.head().map_or(0, LogPosition::get), self.model.head(), "{what}: head");
        assert_eq!(got.is_cut_short(), cut_short, "{what}: is_cut_short");
        assert_eq!(got.resume().map_or(0, LogPosition::get), resume, "{what}: resume");
    }

    /// The spec's events and condition, in real and model form; `after` is taken modulo
    /// `modulus`.
    fn prepare(&mut self, spec: &AppendSpec, modulus: u64) -> Prepared {
        let model: Vec<ModelEvent> = spec
            .events
            .iter()
            .take(4)
            .map(|e| {
                self.salt += 1;
                e.model(self.salt)
            })
            .collect();
        let real = model.iter().map(ModelEvent::real).collect();
        let (cond, model_cond) = match &spec.condition {
            None => (None, None),
            Some(c) => {
                let (q, mq) = c.query.build();
                let after = c.after as u64 % modulus;
                (Some(AppendCondition::new(q, LogPosition::new(after))), Some((mq, after)))
            }
        };
        (real, cond, model, model_cond)
    }

    fn step(&mut self, op: &Op) {
        match op {
            Op::Append(spec) | Op::AppendAsync(spec) => {
                let (events, cond, model, model_cond) = self.prepare(spec, self.model.head() + 2);
                let got = if matches!(op, Op::Append(_)) {
                    self.log.append(events, cond)
                } else {
                    block_on(self.log.append_async(events, cond))
                };
                let want = self.model.append(&model, model_cond.as_ref().map(|(q, a)| (q, *a)));
                assert_eq!(outcome(got), want, "{op:?}");
            }
            Op::Group(specs) => {
                let head = self.model.head();
                let waker = waker();
                let mut cx = Context::from_waker(&waker);
                let mut pending = Vec::new();
                for spec in specs.iter().take(6) {
                    let (events, cond, model, model_cond) = self.prepare(spec, head + 1);
                    let mut f = self.log.append_async(events, cond);
                    // Queue this one before the next (a full queue holds it back until the writer
                    // drains), so that the queue order is the order of the specs.
                    let mut ready = None;
                    loop {
                        match std::pin::Pin::new(&mut f).poll(&mut cx) {
                            Poll::Ready(r) => {
                                ready = Some(r);
                                break;
                            }
                            Poll::Pending if format!("{f:?}").contains("queueing") => {
                                std::thread::park_timeout(Duration::from_millis(50));
                            }
                            Poll::Pending => break,
                        }
                    }
                    let want = self.model.append(&model, model_cond.as_ref().map(|(q, a)| (q, *a)));
                    pending.push((f, ready, want));
                }
                for (f, ready, want) in pending {
                    let got = match ready {
                        Some(r) => r,
                        None => block_on(f),
                    };
                    assert_eq!(outcome(got), want, "{op:?}");
                }
            }
            Op::Read { query, after, limit } => {
                let (q, mq) = query.build();
                let head = self.model.head();
                let after = *after as u64 % (head + 2);
                let limit = (*limit % 8) as usize;
                let all = self.model.matching(&mq, after + 1, head);
                let want: Vec<u64> = all.iter().copied().take(limit).collect();
                let cut_short = all.len() > limit;
                let resume = if cut_short { want.last().copied().unwrap_or(after) } else { head.max(after) };
                let got = self.log.read(&q, LogPosition::new(after), limit).unwrap();
                self.check_reads(&format!("{op:?}"), &got, &want, cut_short, resume);
            }
            Op::ReadBack { query, before, limit } => {
                let (q, mq) = query.build();
                let head = self.model.head();
                let before = before.map(|b| 1 + b as u64 % (head + 2));
                let hi = before.map_or(head, |b| (b - 1).min(head));
                let limit = (*limit % 8) as usize;
                let mut all = self.model.matching(&mq, 1, hi);
                all.reverse();
                let want: Vec<u64> = all.iter().copied().take(limit).collect();
                let cut_short = all.len() > limit;
                let resume = if cut_short { want.last().copied().unwrap_or(hi + 1) } else { 0 };
                let got = self.log.read_back(&q, before.and_then(LogPosition::new), limit).unwrap();
                self.check_reads(&format!("{op:?}"), &got, &want, cut_short, resume);
            }
            Op::Get { position } => {
                let p = 1 + *position as u64 % (self.model.head() + 2);
                let got = self.log.reader().get(LogPosition::new(p).unwrap()).unwrap();
                assert_eq!(got.is_some(), p <= self.model.head(), "get({p})");
                if let Some(s) = got {
                    assert_eq!(s.position.get(), p);
                    self.check_events(&[s]);
                }
            }
            Op::Subscribe { query, after, batch } => {
                if self.subs.len() < MAX_SUBS {
                    let (q, query) = query.build();
                    let after = *after as u64 % (self.model.head() + 2);
                    let batch = 1 + (*batch % 4) as usize;
                    let sub = self.log.subscribe(q, LogPosition::new(after)).batch_limit(batch);
                    assert_eq!(sub.position().map_or(0, LogPosition::get), after);
                    self.subs.push((sub, ModelSub { query, cursor: after, batch }));
                }
            }
            Op::Next { sub, how } => {
                if self.subs.is_empty() {
                    return;
                }
                let i = *sub as usize % self.subs.len();
                let head = self.model.head();
                let closed = self.model.closed;
                let (real, m) = &mut self.subs[i];
                let want: Vec<u64> = self.model.matching(&m.query, m.cursor + 1, head);
                let want: Vec<u64> = want.into_iter().take(m.batch).collect();
                m.cursor = want.last().copied().unwrap_or(m.cursor.max(head));
                let got: Option<Vec<SequencedEvent>> = if want.is_empty() && !closed {
                    match real.try_next_batch() {
                        Err(TryNextError::Empty) => None,
                        other => panic!("{op:?}: expected Empty, got {other:?}"),
                    }
                } else {
                    match how % 3 {
                        0 => match real.try_next_batch() {
                            Ok(b) => Some(b),
                            Err(TryNextError::Closed) => None,
                            Err(e) => panic!("{op:?}: {e}"),
                        },
                        1 => real.next_batch_timeout(Duration::from_secs(20)).expect("next_batch_timeout"),
                        _ => block_on(real.next_batch_async()).expect("next_batch_async"),
                    }
                };
                assert_eq!(got.as_deref().map(positions).unwrap_or_default(), want, "{op:?}");
                assert_eq!(got.is_none(), want.is_empty(), "{op:?}: an empty batch");
                assert_eq!(real.position().map_or(0, LogPosition::get), m.cursor, "{op:?}: cursor");
                if let Some(b) = got {
                    self.check_events(&b);
                }
            }
            Op::Close => {
                self.log.close();
                assert!(self.log.is_closed());
                self.model.closed = true;
            }
            Op::Reopen => {
                let Some(dir) = &self.dir else { return };
                self.log.close();
                self.subs.clear();
                self.log = EventLog::open(&dir.0, self.options.clone()).expect("reopening");
                self.model.closed = false;
                self.check_all();
            }
        }
        assert_eq!(self.log.head().map_or(0, LogPosition::get), self.model.head(), "head after {op:?}");
    }

    fn check_all(&self) {
        let reader: ReadHandle = self.log.reader();
        let all = reader.read(&Query::All, None, usize::MAX).unwrap();
        assert_eq!(positions(all.events()), (1..=self.model.head()).collect::<Vec<_>>());
        self.check_events(all.events());
    }
}

/// Runs one scenario.
pub fn run(s: &Scenario) {
    let options = LogOptions::default()
        .queue_capacity(1 + (s.queue_capacity % 8) as usize)
        .max_drain_requests(1 + (s.max_drain_requests % 4) as usize)
        .max_append_bytes(16 + s.max_append_bytes as usize * 2)
        .segment_bytes(512);
    let (log, dir) = if s.durable {
        let dir = TempDir::new("ops");
        (EventLog::open(&dir.0, options.clone()).expect("opening"), Some(dir))
    } else {
        (EventLog::in_memory(options.clone()).expect("opening"), None)
    };
    let max_append_bytes = 16 + s.max_append_bytes as usize * 2;
    let mut h = Harness {
        log,
        model: Model { events: Vec::new(), closed: false, max_append_bytes },
        subs: Vec::new(),
        dir,
        options,
        salt: 0,
    };
    for op in s.ops.iter().take(64) {
        h.step(op);
    }
    h.check_all();
    h.log.close();
    if let Some(dir) = &h.dir {
        h.subs.clear();
        let reopened = EventLog::open(&dir.0, h.options.clone()).expect("the final reopen");
        h.log = reopened;
        h.check_all();
        h.log.close();
    }
}

/// `log_ops`: the bytes as a [`Scenario`] (bytes that do not make one are skipped).
pub fn log_ops(data: &[u8]) {
    if let Ok(s) = Scenario::arbitrary_take_rest(Unstructured::new(data)) {
        run(&s);
    }
}
