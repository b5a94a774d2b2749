//! The reference model of a [`MemoryStream`]'s sink lanes and its one fan-out, and the harness
//! that applies one operation to the real stream and to the model and compares them.
//!
//! Shared, by path, by `tests/lanes/model_proptest.rs`, `tests/fuzz_corpus_replay.rs` and the cargo-fuzz
//! target `fuzz/fuzz_targets/lane_ops.rs`, so the property test, the fuzzer and the corpus replay
//! run exactly the same logic.
//!
//! The model is deliberately naive: per lane one `VecDeque` of the items not yet freed, each
//! with a plain state (queued, delivered, released, acked), its attempt count and how many live
//! handles read it. It follows the crate's contract (`lanestream::contract`):
//! - L2/L6: a receive takes the lowest released item first, else the next queued one.
//! - L3/L4: a publish goes to every lane or to none; it refuses the reserved position, a regressed
//!   position, a stream with a closed lane, a full lane (checked in that order: the engine's) and
//!   hands the item back.
//! - L9: one fan-out at a time (`ProducerBusy` naming the first lane); a new one continues after
//!   the last position published; a stream's lane has no producer of its own.
//! - L5: the acked position is the last positioned item of the contiguous acked prefix.
//! - L8: a re-attach releases every delivered item; the old consumer's handles go stale: their
//!   ack is refused with `Detached`, their nack or drop does nothing but end the handle.
//! - L10: a close of any lane stops the fan-out (every publish is refused with `Closed`); a
//!   closed lane still delivers what is queued or released, then `Closed`; the other lanes' own
//!   consumers drain and wait, not closed.
//! - W1/W3/W5: watermark = min of the lanes' acked positions; never decreases; idle = nothing
//!   queued, released or unacked.
//!
//! An item acked while a detached consumer's stale handle still reads it counts as acked at
//! once (L5/W1/W5); only its slot waits for the stale handle to end.
#![allow(dead_code)]

use lanestream::prelude::*;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use lanestream::{
    AckError, Batch, Consumer, Delivery, Fanout, IndexName, Lane, LaneItem, LaneStats, MemoryStream,
    Position, PublishError, RecvTimeoutError, Stream, StreamError, TryRecvError,
};

/// The capacities a scenario may pick: powers of two and not (the contract's hazards: 1, 2, 3, 5).
pub const CAPACITIES: [usize; 4] = [1, 2, 3, 5];
/// At most this many lanes.
pub const MAX_LANES: usize = 3;
/// Detached consumers kept around to check that they stay detached.
const MAX_DETACHED: usize = 3;

/// A small position (0..=15): positions collide and regress often.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmallPos(pub u8);

impl SmallPos {
    /// The position value, 0..=15.
    pub fn get(self) -> u64 {
        u64::from(self.0 % 16)
    }
}

/// What to publish.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemSpec {
    /// A batch at an absolute small position (may collide with or regress below the last one).
    At(SmallPos),
    /// A batch at `last published + 1 + k % 4` (0 if nothing was published): usually accepted.
    Ahead(u8),
    /// A snapshot batch (no position).
    Snapshot,
    /// `SnapshotComplete` (no position).
    SnapshotComplete,
    /// A batch at the reserved position `u64::MAX`.
    Reserved,
}

/// A lane, by index modulo the number of lanes.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneIx(pub u8);

/// A held delivery, by index modulo the number of held deliveries.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldIx(pub u8);

/// One operation, applied to the real stream and to the model. (The lane of a publish, a close
/// of the fan-out, a drop and a claim of it is left over from per-lane producers: a publish goes
/// to every lane, and the fan-out is the stream's; the bytes of the fuzz corpus still decode.)
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `Fanout::try_publish` (to every lane; the lane is not used).
    TryPublish(LaneIx, ItemSpec),
    /// `Fanout::publish` when the model says it would not wait, else `publish_timeout(0)`.
    Publish(LaneIx, ItemSpec),
    /// `Consumer::try_recv` on the lane's current consumer.
    TryRecv(LaneIx),
    /// `Consumer::recv` when the model says it would not wait, else `recv_timeout(0)`.
    Recv(LaneIx),
    /// `try_recv` on a detached consumer of the lane (if any): always `Detached`.
    TryRecvDetached(LaneIx, u8),
    /// `Delivery::ack` of a held delivery.
    Ack(HeldIx),
    /// `Delivery::nack` of a held delivery.
    Nack(HeldIx),
    /// Drop a held delivery un-acked.
    Drop(HeldIx),
    /// Split a held delivery into its item and its `AckHandle`, then ack the handle.
    SplitAck(HeldIx),
    /// Ask the lane for its consumer again (re-attach, L8).
    Reattach(LaneIx),
    /// `Lane::close` of the lane (L10: it stops the fan-out).
    Close(LaneIx),
    /// Drop the fan-out (if live).
    DropProducer(LaneIx),
    /// `MemoryStream::fanout()`: `ProducerBusy` while one is live, else a fresh fan-out (L9); and
    /// the lane's own `Lane::producer()`, always `ProducerBusy`.
    ClaimProducer(LaneIx),
    /// Read watermark, is_idle and every lane's stats (also done after every operation).
    Check,
}

/// A whole run: the stream's shape and the operations.
#[derive(Arbitrary, Clone, Debug)]
pub struct Scenario {
    /// 1 + lanes % MAX_LANES lanes.
    pub lanes: u8,
    /// `CAPACITIES[capacity % 4]` slots per lane.
    pub capacity: u8,
    /// The operations, in order.
    pub ops: Vec<Op>,
}

impl Scenario {
    /// The number of lanes, 1..=MAX_LANES.
    pub fn lane_count(&self) -> usize {
        1 + usize::from(self.lanes) % MAX_LANES
    }

    /// The lane capacity.
    pub fn lane_capacity(&self) -> usize {
        CAPACITIES[usize::from(self.capacity) % CAPACITIES.len()]
    }
}

// ----- the model ---------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Queued,
    Delivered,
    Released,
    Acked,
}

#[derive(Clone, Debug)]
struct MItem {
    seq: u64,
    serial: u64,
    position: Option<u64>,
    state: State,
    attempts: u32,
    /// Which delivery of the item is current (a stale handle holds an older one).
    generation: u64,
    /// Live handles (current or stale) on the item.
    holders: u32,
}

/// One lane of the model.
#[derive(Clone, Debug)]
pub struct ModelLane {
    capacity: u64,
    /// Items `free..tail`, in sequence order.
    items: VecDeque<MItem>,
    free: u64,
    next: u64,
    tail: u64,
    acked_mark: Option<u64>,
    last_published: Option<u64>,
    closed: bool,
    delivered: u64,
    redelivered: u64,
}

/// A held handle in the model: which delivery of which item.
#[derive(Clone, Copy, Debug)]
struct MHeld {
    lane: usize,
    seq: u64,
    generation: u64,
    serial: u64,
}

/// The reference model: one [`ModelLane`] per sink, the held handles in the same order as the
/// harness holds the real deliveries, and the fan-out's state.
#[derive(Clone, Debug)]
pub struct Model {
    lanes: Vec<ModelLane>,
    held: Vec<MHeld>,
    next_serial: u64,
    /// Whether a fan-out of the stream is live.
    producer_live: bool,
    /// The last position published (L4), the same for every lane.
    last_published: Option<u64>,
}

/// The observable result of one operation; both sides must give the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing to do (no producer, no held handle, no detached consumer).
    Skipped,
    /// Published.
    Published,
    /// `PublishError::Full`, with the item's serial handed back.
    Full(u64),
    /// `PublishError::Closed`.
    Closed(u64),
    /// `PublishError::PositionRegressed`.
    Regressed { serial: u64, position: u64, last: u64 },
    /// `PublishError::InvalidPosition`.
    InvalidPosition(u64),
    /// `PublishError::Timeout`.
    Timeout(u64),
    /// A delivery: the item's serial, position and attempt.
    Delivered { serial: u64, position: Option<u64>, attempt: u32 },
    /// `Empty` from `try_recv` or `Timeout` from `recv_timeout`.
    Empty,
    /// Closed and drained: `Closed` from `try_recv`, `None` from `recv`.
    Drained,
    /// `Detached` from a receive.
    Detached,
    /// The ack landed.
    Acked,
    /// The ack was refused with `AckError::Detached`.
    AckRefused,
    /// A nack or drop ended the handle.
    Ended,
    /// A re-attach or close happened.
    Done,
    /// `Lane::producer()` succeeded.
    Claimed,
    /// `StreamError::ProducerBusy`.
    ProducerBusy,
}

impl ModelLane {
    fn new(capacity: usize) -> ModelLane {
        ModelLane {
            capacity: capacity as u64,
            items: VecDeque::new(),
            free: 0,
            next: 0,
            tail: 0,
            acked_mark: None,
            last_published: None,
            closed: false,
            delivered: 0,
            redelivered: 0,
        }
    }

    fn item_mut(&mut self, seq: u64) -> Option<&mut MItem> {
        let i = seq.checked_sub(self.free)?;
        self.items.get_mut(usize::try_from(i).ok()?)
    }

    fn released(&self) -> u64 {
        self.items.iter().filter(|i| i.state == State::Released).count() as u64
    }

    /// L5 as written: the last positioned item of the contiguous acked prefix, whether or not a
    /// stale handle still reads it.
    fn design_acked(&self) -> Option<u64> {
        let mut mark = self.acked_mark;
        for item in self.items.iter().take_while(|i| i.state == State::Acked) {
            if item.position.is_some() {
                mark = item.position;
            }
        }
        mark
    }

    /// Reclaims the acked prefix whose items no handle reads.
    fn advance(&mut self) {
        while let Some(front) = self.items.front() {
            if front.state != State::Acked || front.holders != 0 {
                break;
            }
            if front.position.is_some() {
                self.acked_mark = front.position;
            }
            self.items.pop_front();
            self.free += 1;
        }
    }

    fn is_full(&self) -> bool {
        self.tail - self.free >= self.capacity
    }

    /// Appends an item the fan-out published (to every lane).
    fn push(&mut self, serial: u64, position: Option<u64>) {
        self.items.push_back(MItem {
            seq: self.tail,
            serial,
            position,
            state: State::Queued,
            attempts: 0,
            generation: 0,
            holders: 0,
        });
        self.tail += 1;
        if position.is_some() {
            self.last_published = position;
        }
    }

    /// Whether a receive would find nothing (so a blocking receive would wait).
    fn would_wait(&self) -> bool {
        self.released() == 0 && self.next == self.tail && !self.closed
    }

    /// One receive step: (outcome, the new held handle if any).
    fn take(&mut self, lane: usize) -> (Outcome, Option<MHeld>) {
        let pick = self
            .items
            .iter()
            .position(|i| i.state == State::Released)
            .map(|i| (i, true))
            .or_else(|| (self.next < self.tail).then(|| ((self.next - self.free) as usize, false)));
        let Some((i, redelivery)) = pick else {
            return (if self.closed { Outcome::Drained } else { Outcome::Empty }, None);
        };
        let item = &mut self.items[i];
        item.state = State::Delivered;
        item.attempts = item.attempts.saturating_add(1).min(0xFFFF);
        item.generation += 1;
        item.holders += 1;
        let out = Outcome::Delivered { serial: item.serial, position: item.position, attempt: item.attempts };
        let held = MHeld { lane, seq: item.seq, generation: item.generation, serial: item.serial };
        self.delivered += 1;
        if redelivery {
            self.redelivered += 1;
        } else {
            self.next += 1;
        }
        (out, Some(held))
    }

    fn reattach(&mut self) {
        for item in self.items.iter_mut() {
            if item.state == State::Delivered {
                item.state = State::Released;
            }
        }
    }

    /// Ends handle `h`: `ack` true to ack it, false to nack (or drop) it.
    fn end(&mut self, h: MHeld, ack: bool) -> Outcome {
        let item = self.item_mut(h.seq).expect("a held item is never reclaimed");
        let current = item.state == State::Delivered && item.generation == h.generation;
        item.holders -= 1;
        let out = match (ack, current) {
            (true, true) => {
                item.state = State::Acked;
                Outcome::Acked
            }
            (true, false) => Outcome::AckRefused,
            (false, true) => {
                item.state = State::Released;
                Outcome::Ended
            }
            (false, false) => Outcome::Ended,
        };
        self.advance();
        out
    }

    /// The stats the engine reports, as the model sees them.
    fn stats(&self) -> Stats {
        let released = self.released();
        let acked_items = self.acked_items();
        Stats {
            capacity: self.capacity as usize,
            queued: self.tail - self.next,
            released,
            in_flight: self.next - acked_items - released,
            delivered: self.delivered,
            redelivered: self.redelivered,
            published: self.tail,
            acked_items,
            last_published: self.last_published.map(Position),
            acked: self.acked().map(Position),
            closed: self.closed,
            pinned: acked_items - self.free,
        }
    }

    /// L5: the contiguous acked prefix, in items (acked items whose slot a stale handle keeps
    /// included).
    fn acked_items(&self) -> u64 {
        self.free + self.items.iter().take_while(|i| i.state == State::Acked).count() as u64
    }

    fn acked(&self) -> Option<u64> {
        self.design_acked()
    }

    fn is_idle(&self) -> bool {
        self.items.iter().all(|i| i.state == State::Acked)
    }

    fn is_empty(&self) -> bool {
        self.released() == 0 && self.next == self.tail
    }
}

impl Model {
    /// A model of `lanes` lanes of `capacity` slots, each with a live producer and a consumer.
    pub fn new(lanes: usize, capacity: usize) -> Model {
        Model {
            lanes: (0..lanes).map(|_| ModelLane::new(capacity)).collect(),
            held: Vec::new(),
            next_serial: 0,
            producer_live: true,
            last_published: None,
        }
    }

    /// A publish by the fan-out, to every lane or none (L3, L4, L10), checked in the engine's
    /// order: the position, then a closed lane, then a full one.
    fn publish(&mut self, serial: u64, position: Option<u64>) -> Outcome {
        if position == Some(u64::MAX) {
            return Outcome::InvalidPosition(serial);
        }
        if let (Some(p), Some(last)) = (position, self.last_published) {
            if p <= last {
                return Outcome::Regressed { serial, position: p, last };
            }
        }
        if self.lanes.iter().any(|l| l.closed) {
            return Outcome::Closed(serial);
        }
        if self.lanes.iter().any(ModelLane::is_full) {
            return Outcome::Full(serial);
        }
        for lane in &mut self.lanes {
            lane.push(serial, position);
        }
        if position.is_some() {
            self.last_published = position;
        }
        Outcome::Published
    }

    /// Whether a publish of an item at `position` would find a lane full (and nothing else wrong).
    fn publish_would_wait(&self, position: Option<u64>) -> bool {
        position != Some(u64::MAX)
            && !matches!((position, self.last_published), (Some(p), Some(l)) if p <= l)
            && !self.lanes.iter().any(|l| l.closed)
            && self.lanes.iter().any(ModelLane::is_full)
    }

    /// Whether a lane was closed: the fan-out is stopped (L10).
    fn any_closed(&self) -> bool {
        self.lanes.iter().any(|l| l.closed)
    }

    /// W1: the minimum acked position over the lanes; `None` until every lane has one.
    pub fn watermark(&self) -> Option<Position> {
        let mut min: Option<u64> = None;
        for lane in &self.lanes {
            let p = lane.acked()?;
            min = Some(min.map_or(p, |m| m.min(p)));
        }
        min.map(Position)
    }

    /// W5 (the request lane is never used here, so it is idle).
    pub fn is_idle(&self) -> bool {
        self.lanes.iter().all(|l| l.is_idle())
    }
}

// ----- the real side -----------------------------------------------------------------------------

struct RealLane {
    lane: Lane,
    consumer: Consumer<LaneItem>,
    detached: VecDeque<Consumer<LaneItem>>,
}

/// The real stream and the ends the harness holds.
pub struct Real {
    stream: MemoryStream,
    fanout: Option<Fanout>,
    lanes: Vec<RealLane>,
    held: Vec<Delivery<LaneItem>>,
}

impl Real {
    /// A stream of `lanes` lanes named `s0`, `s1`, ... of `capacity` slots, with its fan-out and
    /// a consumer for each lane.
    pub fn new(lanes: usize, capacity: usize) -> Real {
        let stream = MemoryStream::builder()
            .capacity(capacity)
            .sinks((0..lanes).map(|i| format!("s{i}")))
            .build()
            .expect("valid stream");
        let fanout = Some(stream.fanout().expect("a fresh stream has no fan-out"));
        let lanes = stream
            .lanes()
            .map(|lane| RealLane { consumer: lane.reattach(), detached: VecDeque::new(), lane })
            .collect();
        Real { stream, fanout, lanes, held: Vec::new() }
    }
}

/// The item's serial: batches carry it in `changes`, `SnapshotComplete` in its index name `i<serial>`.
pub fn serial_of(item: &LaneItem) -> u64 {
    match item {
        LaneItem::Batch(b) => b.changes,
        LaneItem::SnapshotComplete { indexes } => {
            indexes[0].as_str()[1..].parse().expect("harness index names are i<serial>")
        }
        other => unreachable!("{other:?}"),
    }
}

fn make_item(spec: ItemSpec, last_published: Option<u64>, serial: u64) -> LaneItem {
    let batch = |position: Option<u64>| {
        LaneItem::Batch(Batch {
            position: position.map(Position),
            changes: serial,
            offset: 0,
            envelopes: Arc::from([]),
        })
    };
    match spec {
        ItemSpec::At(p) => batch(Some(p.get())),
        ItemSpec::Ahead(k) => {
            batch(Some(last_published.map_or(0, |l| l.saturating_add(1 + u64::from(k % 4)))))
        }
        ItemSpec::Snapshot => batch(None),
        ItemSpec::SnapshotComplete => LaneItem::SnapshotComplete {
            indexes: vec![IndexName::new(format!("i{serial}")).expect("valid index name")],
        },
        ItemSpec::Reserved => batch(Some(u64::MAX)),
    }
}

/// A publish's result, whichever form made it: `Full` only from `try_publish`, `Timeout` only
/// from the timed forms.
enum Published {
    Try(Result<(), PublishError<LaneItem>>),
    Wait(Result<(), PublishError<LaneItem>>),
    Timed(Result<(), PublishError<LaneItem>>),
}

fn publish_outcome(r: Published) -> Outcome {
    let (full, timeout, refused) = match r {
        Published::Try(Ok(())) | Published::Wait(Ok(())) | Published::Timed(Ok(())) => {
            return Outcome::Published
        }
        Published::Try(Err(PublishError::Full(i))) => (Some(i), None, None),
        Published::Try(Err(e)) => (None, None, Some(e)),
        Published::Wait(Err(e)) => (None, None, Some(e)),
        Published::Timed(Err(PublishError::Timeout(i))) => (None, Some(i), None),
        Published::Timed(Err(e)) => (
            None,
            None,
            Some(match e {
                PublishError::Closed(i) => PublishError::Closed(i),
                PublishError::InvalidPosition(i) => PublishError::InvalidPosition(i),
                PublishError::PositionRegressed { item, position, last } => {
                    PublishError::PositionRegressed { item, position, last }
                }
                other => unreachable!("{other:?}"),
            }),
        ),
    };
    if let Some(i) = full {
        return Outcome::Full(serial_of(&i));
    }
    if let Some(i) = timeout {
        return Outcome::Timeout(serial_of(&i));
    }
    match refused.expect("a refused publish") {
        PublishError::Closed(i) => Outcome::Closed(serial_of(&i)),
        PublishError::InvalidPosition(i) => Outcome::InvalidPosition(serial_of(&i)),
        PublishError::PositionRegressed { item, position, last } => {
            Outcome::Regressed { serial: serial_of(&item), position: position.0, last: last.0 }
        }
        other => unreachable!("{other:?}"),
    }
}

fn delivered(d: &Delivery<LaneItem>) -> Outcome {
    Outcome::Delivered {
        serial: serial_of(d.item()),
        position: d.position().map(|p| p.0),
        attempt: d.attempt(),
    }
}

// ----- the harness -------------------------------------------------------------------------------

/// The real stream and the model side by side.
pub struct Harness {
    /// The real stream.
    pub real: Real,
    /// The model.
    pub model: Model,
    /// The highest watermark seen so far (W3).
    last_watermark: Option<Position>,
    /// Every operation applied, for failure messages.
    trace: Vec<Op>,
}

impl Harness {
    /// A stream and a model of `lanes` lanes of `capacity` slots.
    pub fn new(lanes: usize, capacity: usize) -> Harness {
        Harness {
            real: Real::new(lanes, capacity),
            model: Model::new(lanes, capacity),
            last_watermark: None,
            trace: Vec::new(),
        }
    }

    fn lane(&self, ix: LaneIx) -> usize {
        usize::from(ix.0) % self.model.lanes.len()
    }

    fn held(&self, ix: HeldIx) -> Option<usize> {
        (!self.model.held.is_empty()).then(|| usize::from(ix.0) % self.model.held.len())
    }

    /// Applies `op` to both sides and compares the outcome, then the whole observable state.
    ///
    /// # Panics
    /// On any difference between the engine and the model, with the trace of operations.
    pub fn apply(&mut self, op: Op) {
        self.trace.push(op);
        let (real, model) = self.apply_both(op);
        assert_eq!(
            real, model,
            "outcome of {op:?} differs (engine left, model right); trace: {:?}",
            self.trace
        );
        self.check_held();
        self.compare();
    }

    fn apply_both(&mut self, op: Op) -> (Outcome, Outcome) {
        match op {
            Op::TryPublish(_, spec) | Op::Publish(_, spec) => {
                let (real, model) = (&mut self.real, &mut self.model);
                let Some(producer) = real.fanout.as_mut() else {
                    return (Outcome::Skipped, Outcome::Skipped);
                };
                let serial = model.next_serial;
                model.next_serial += 1;
                let item = make_item(spec, model.last_published, serial);
                let position = item.position().map(|p| p.0);
                let waits = model.publish_would_wait(position);
                let r = match op {
                    Op::TryPublish(..) => Published::Try(producer.try_publish(item)),
                    _ if waits => Published::Timed(producer.publish_timeout(item, Duration::ZERO)),
                    _ => Published::Wait(producer.publish(item)),
                };
                let m = match model.publish(serial, position) {
                    Outcome::Full(s) if !matches!(op, Op::TryPublish(..)) => Outcome::Timeout(s),
                    m => m,
                };
                (publish_outcome(r), m)
            }
            Op::TryRecv(l) | Op::Recv(l) => {
                let l = self.lane_of(l);
                let (real, model) = (&mut self.real, &mut self.model);
                let waits = model.lanes[l].would_wait();
                let consumer = &mut real.lanes[l].consumer;
                let r = match op {
                    Op::TryRecv(_) => match consumer.try_recv() {
                        Ok(d) => Ok(d),
                        Err(TryRecvError::Empty) => Err(Outcome::Empty),
                        Err(TryRecvError::Closed) => Err(Outcome::Drained),
                        Err(e) => {
                            assert!(e.is_detached());
                            Err(Outcome::Detached)
                        }
                    },
                    _ => {
                        let r = if waits {
                            consumer.recv_timeout(Duration::ZERO)
                        } else {
                            consumer.recv().map_err(RecvTimeoutError::from)
                        };
                        match r {
                            Ok(Some(d)) => Ok(d),
                            Ok(None) => Err(Outcome::Drained),
                            Err(e) if e.is_timeout() => Err(Outcome::Empty),
                            Err(_detached) => Err(Outcome::Detached),
                        }
                    }
                };
                let real_out = match r {
                    Ok(d) => {
                        let out = delivered(&d);
                        real.held.push(d);
                        out
                    }
                    Err(o) => o,
                };
                let (m, held) = model.lanes[l].take(l);
                model.held.extend(held);
                (real_out, m)
            }
            Op::TryRecvDetached(l, k) => {
                let l = self.lane_of(l);
                let detached = &mut self.real.lanes[l].detached;
                if detached.is_empty() {
                    return (Outcome::Skipped, Outcome::Skipped);
                }
                let k = usize::from(k) % detached.len();
                let c = &mut detached[k];
                assert!(c.is_detached(), "a replaced consumer says it is not detached");
                let r = match c.try_recv() {
                    Ok(d) => delivered(&d), // dropped at once; the comparison fails anyway
                    Err(TryRecvError::Empty) => Outcome::Empty,
                    Err(TryRecvError::Closed) => Outcome::Drained,
                    Err(_detached) => Outcome::Detached,
                };
                (r, Outcome::Detached)
            }
            Op::Ack(h) | Op::Nack(h) | Op::Drop(h) | Op::SplitAck(h) => {
                let Some(i) = self.held(h) else {
                    return (Outcome::Skipped, Outcome::Skipped);
                };
                let (real, model) = (&mut self.real, &mut self.model);
                let d = real.held.remove(i);
                let mh = model.held.remove(i);
                assert_eq!(serial_of(d.item()), mh.serial, "held deliveries out of step");
                let r = match op {
                    Op::Ack(_) => ack_outcome(d.ack()),
                    Op::SplitAck(_) => {
                        let (item, handle) = d.into_parts();
                        assert_eq!(serial_of(&item), mh.serial);
                        ack_outcome(handle.ack())
                    }
                    Op::Nack(_) => {
                        d.nack();
                        Outcome::Ended
                    }
                    _ => {
                        drop(d);
                        Outcome::Ended
                    }
                };
                let ack = matches!(op, Op::Ack(_) | Op::SplitAck(_));
                (r, model.lanes[mh.lane].end(mh, ack))
            }
            Op::Reattach(l) => {
                let l = self.lane_of(l);
                let (real, model) = (&mut self.real, &mut self.model);
                let lane = &mut real.lanes[l];
                let old = std::mem::replace(&mut lane.consumer, lane.lane.reattach());
                lane.detached.push_back(old);
                if lane.detached.len() > MAX_DETACHED {
                    lane.detached.pop_front();
                }
                model.lanes[l].reattach();
                (Outcome::Done, Outcome::Done)
            }
            Op::Close(l) => {
                let l = self.lane_of(l);
                let (real, model) = (&mut self.real, &mut self.model);
                real.lanes[l].lane.close();
                assert!(real.lanes[l].lane.stats().closed);
                if let Some(fanout) = &real.fanout {
                    assert!(fanout.is_closed(), "a lane's close stops the fan-out (L10)");
                }
                model.lanes[l].closed = true;
                (Outcome::Done, Outcome::Done)
            }
            Op::DropProducer(_) => {
                let (real, model) = (&mut self.real, &mut self.model);
                let real_out = match real.fanout.take() {
                    Some(p) => {
                        drop(p);
                        Outcome::Done
                    }
                    None => Outcome::Skipped,
                };
                let model_out = if model.producer_live { Outcome::Done } else { Outcome::Skipped };
                model.producer_live = false;
                (real_out, model_out)
            }
            Op::ClaimProducer(l) => {
                let l = self.lane_of(l);
                let (real, model) = (&mut self.real, &mut self.model);
                let lane = &real.lanes[l];
                match lane.lane.producer() {
                    Err(StreamError::ProducerBusy(name)) => assert_eq!(&name, lane.lane.name()),
                    other => {
                        panic!("a stream's lane handed out a producer of its own: {:?}", other.map(|_| ()))
                    }
                }
                let real_out = match real.stream.fanout() {
                    Ok(p) => {
                        assert!(real.fanout.is_none(), "a second live fan-out was handed out (L9)");
                        assert_eq!(p.is_closed(), model.any_closed());
                        real.fanout = Some(p);
                        Outcome::Claimed
                    }
                    Err(StreamError::ProducerBusy(name)) => {
                        assert_eq!(name.as_str(), "s0", "the busy claim names the first lane");
                        Outcome::ProducerBusy
                    }
                    Err(e) => panic!("unexpected {e:?}"),
                };
                let model_out = if model.producer_live { Outcome::ProducerBusy } else { Outcome::Claimed };
                model.producer_live = true;
                (real_out, model_out)
            }
            Op::Check => (Outcome::Done, Outcome::Done),
        }
    }

    fn lane_of(&self, ix: LaneIx) -> usize {
        self.lane(ix)
    }

    /// Every held delivery still reads its own item (no slot was reused under a handle).
    fn check_held(&self) {
        for (d, m) in self.real.held.iter().zip(&self.model.held) {
            assert_eq!(
                serial_of(d.item()),
                m.serial,
                "a held delivery reads another item; trace: {:?}",
                self.trace
            );
        }
    }

    /// Compares watermark (and W3), is_idle, and every lane's stats and consumer hints.
    pub fn compare(&mut self) {
        let trace = &self.trace;
        let watermark = self.real.stream.watermark();
        assert_eq!(
            watermark,
            self.model.watermark(),
            "watermark (engine left, model right); trace: {trace:?}"
        );
        assert!(watermark >= self.last_watermark, "watermark decreased (W3); trace: {trace:?}");
        self.last_watermark = watermark;
        assert_eq!(self.real.stream.is_idle(), self.model.is_idle(), "is_idle; trace: {trace:?}");
        for (i, (real, model)) in self.real.lanes.iter().zip(&self.model.lanes).enumerate() {
            let stats = real.lane.stats();
            assert_eq!(Stats::of(&stats), model.stats(), "lane {i} stats; trace: {trace:?}");
            assert_eq!(stats.lag(), stats.queued + stats.released + stats.in_flight);
            assert_eq!(real.lane.acked(), stats.acked);
            assert_eq!(real.lane.is_idle(), model.is_idle(), "lane {i} idle; trace: {trace:?}");
            assert_eq!(
                real.consumer.is_empty(),
                model.is_empty(),
                "lane {i} is_empty (L11); trace: {trace:?}"
            );
            assert!(!real.consumer.is_detached(), "current consumer detached; trace: {trace:?}");
        }
        if let Some(p) = &self.real.fanout {
            assert_eq!(p.is_closed(), self.model.any_closed(), "fan-out closed; trace: {trace:?}");
        }
    }

    /// Ends the run: drops every held delivery and the stream (M3: nothing panics or leaks).
    pub fn finish(mut self) {
        while !self.real.held.is_empty() {
            self.apply(Op::Drop(HeldIx(0)));
        }
    }
}

fn ack_outcome(r: Result<(), AckError>) -> Outcome {
    match r {
        Ok(()) => Outcome::Acked,
        Err(e) => {
            assert_eq!(e, AckError::Detached);
            Outcome::AckRefused
        }
    }
}

/// Runs a whole scenario.
pub fn run(scenario: &Scenario) {
    let mut h = Harness::new(scenario.lane_count(), scenario.lane_capacity());
    h.compare();
    for &op in &scenario.ops {
        h.apply(op);
    }
    h.finish();
}

/// The `lane_ops` fuzz target: bytes -> [`Scenario`] (via `arbitrary`) -> [`run`].
pub fn run_bytes(data: &[u8]) {
    if let Ok(scenario) = Scenario::arbitrary_take_rest(Unstructured::new(data)) {
        run(&scenario);
    }
}

/// Every counter of [`LaneStats`], as a struct the model can build (`LaneStats` is
/// `#[non_exhaustive]`).
#[derive(Debug, PartialEq, Eq)]
struct Stats {
    capacity: usize,
    queued: u64,
    released: u64,
    in_flight: u64,
    delivered: u64,
    redelivered: u64,
    published: u64,
    acked_items: u64,
    last_published: Option<Position>,
    acked: Option<Position>,
    closed: bool,
    pinned: u64,
}

impl Stats {
    fn of(s: &LaneStats) -> Stats {
        Stats {
            capacity: s.capacity,
            queued: s.queued,
            released: s.released,
            in_flight: s.in_flight,
            delivered: s.delivered,
            redelivered: s.redelivered,
            published: s.published,
            acked_items: s.acked_items,
            last_published: s.last_published,
            acked: s.acked,
            closed: s.closed,
            pinned: s.pinned,
        }
    }
}
