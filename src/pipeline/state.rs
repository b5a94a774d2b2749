//! A sink's durable state ([P7](self#the-rules)): what a sink stores with its data, in the same
//! atomic step, so that a restarted sink resumes exactly where its data stands.
//!
//! The sink engine ([`Pipeline::sink`](super::Pipeline::sink), [`run_sink`](super::run_sink))
//! keeps the [`SinkState`] for its sink: it hands the sink only what the state does not cover
//! yet ([`SinkState::uncovered`]), advances the state with what the sink applied
//! ([`SinkState::advance`]), and gives it to [`Sink::commit`](super::Sink::commit), which stores
//! it with the data. At the next start the engine reads it back
//! ([`Sink::state`](super::Sink::state)). A sink never interprets it: it stores
//! [`SinkState::to_text`] (one line of JSON, under 1 KiB plus the names of the indexes it holds)
//! and gives back [`SinkState::parse`] of it.
//!
//! # What it records
//! - [`position`](SinkState::position): the last whole transaction applied (its commit
//!   position), and [`in_transaction`](SinkState::in_transaction): how many envelopes of a large
//!   transaction (published in chunks) are applied, so that a transaction the source sends again
//!   from its start after a restart is skipped up to there (contract
//!   [C1](crate::contract#c1)).
//! - [`owed`](SinkState::owed): the backfills the sink was promised and has not completed, in
//!   order, each with the id of the last snapshot row applied: the engine asks for them again
//!   after a restart, resuming after that row.
//! - [`indexes`](SinkState::indexes): the indexes the sink holds whole (backfilled, or followed
//!   since before they had rows); a change of any other index makes the engine owe a backfill of
//!   it (a table that joined the publication), and an [`Op::Resync`] of one it holds makes it
//!   owe one again (a table that rejoined: [`SinkState::resync`]).
//! - [`origin`](SinkState::origin): the source the sink was filled from (for a replication slot,
//!   the database and the slot): a pipeline refuses to feed the sink from another.
//!
//! # The rules
//! - **P1**: at start the pipeline reads every local sink's state and the source refuses to
//!   resume past one (a slot re-created or advanced after the sink's position), naming both.
//! - **P2**: a sink with no state on a source with history (a joiner), and a table that joins
//!   later (or rejoins: [`Op::Resync`]), get a backfill of what they miss before the pipeline
//!   relies on them, or the pipeline refuses to start ([`Joiners`](super::Joiners)).
//! - **P3**: a backfill is owed in the state, and the state committed, before its request is
//!   published; a restarted engine asks again, after the last row applied.
//! - **P7**: the state is this type, stored by the sink with its data in one atomic step.
//!
//! ```
//! use lanestream::{Batch, Envelope, IndexName, LaneItem, Op, Position};
//! use lanestream::pipeline::{SinkState, Uncovered};
//!
//! let envelope = |id: &str| Envelope {
//!     index: IndexName::new("public_users").unwrap(),
//!     id: id.into(),
//!     op: Op::Upsert,
//!     position: Some(Position(0x20)),
//!     document: bytes::Bytes::from_static(b"{}"),
//!     built_at_micros: None,
//!     relation: None,
//!     old_id: None,
//!     unchanged: Vec::new(),
//! };
//! let txn = LaneItem::Batch(Batch::new(Some(Position(0x20)), vec![envelope("1"), envelope("2")].into()));
//! let mut state = SinkState::new();
//! assert_eq!(state.uncovered(&txn)?, Uncovered::All);
//! state.advance(&txn);
//! // Stored with the data, read back after a restart: the re-sent transaction is covered.
//! let text = state.to_text();
//! let state = SinkState::parse(&text)?;
//! assert_eq!(state.position, Some(Position(0x20)));
//! assert_eq!(state.uncovered(&txn)?, Uncovered::Nothing);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::{Batch, IndexName, LaneItem, Op, Position, Request, SinkName};
use serde::{Deserialize, Serialize};

/// The version of [`SinkState::to_text`]'s form; [`SinkState::parse`] refuses others.
pub const STATE_VERSION: u32 = 1;

/// What a sink stores durably with its data; see the [module docs](self).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SinkState {
    /// The source the sink was filled from ([`SourceStart::origin`](super::SourceStart::origin));
    /// `None` before the engine first committed it, or for a source that has none.
    pub origin: Option<String>,
    /// The last whole transaction applied (its commit position); `None` before the first.
    pub position: Option<Position>,
    /// A large transaction of which some chunks are applied, if any.
    pub in_transaction: Option<InTransaction>,
    /// Backfills owed to this sink, oldest first (asked for, not complete).
    pub owed: Vec<OwedBackfill>,
    /// The indexes the sink holds whole; `None`: not tracked (the source does not list its
    /// indexes, or the state predates tracking).
    pub indexes: Option<BTreeSet<IndexName>>,
}

/// How far into a large transaction (published in chunks) a sink got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InTransaction {
    /// The transaction's commit position (carried by its chunks' envelopes).
    pub position: Position,
    /// Its envelopes applied: the [`Batch::offset`] the next chunk starts at.
    pub envelopes: u64,
}

/// A backfill owed to a sink.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwedBackfill {
    /// The indexes still to be served, the one in progress first (never empty).
    pub indexes: Vec<IndexName>,
    /// The id of the last snapshot row of the first index the sink applied; `None` before its
    /// first row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

/// What of a lane item a [`SinkState`] does not cover yet ([`SinkState::uncovered`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uncovered {
    /// The whole item is new: apply it.
    All,
    /// The item is applied already (a transaction at or before the state's position, or
    /// chunks the state's in-transaction count covers): skip it.
    Nothing,
    /// The batch's first `n` envelopes are applied already: apply the rest
    /// ([`SinkState::trim`] makes that batch).
    From(usize),
}

/// Why a state or an item cannot be taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// The stored text is not a state of this version (the sink's storage holds something
    /// else, or a newer lanestream wrote it).
    #[error("a sink state reads {{\"v\":{STATE_VERSION},...}}; this one does not ({reason}): {text:?}")]
    Unreadable {
        /// What the text holds (cut to 200 bytes).
        text: String,
        /// Why it was refused.
        reason: String,
    },
    /// A batch of a large transaction starts after envelopes never applied: a chunk is missing
    /// (the lanes deliver in order, so the source skipped one).
    #[error("transaction {position}: a batch starts at envelope {offset}, but only {applied} of its envelopes were applied: a chunk is missing")]
    ChunkGap {
        /// The transaction's commit position.
        position: Position,
        /// The batch's [`Batch::offset`].
        offset: u64,
        /// Envelopes of the transaction applied so far.
        applied: u64,
    },
}

/// The serialized form: positions in [`Position`]'s text form (`"0/16B3748"`), a version first.
#[derive(Serialize, Deserialize)]
struct Stored {
    v: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    origin: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    position: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    in_transaction: Option<(String, u64)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    owed: Vec<OwedBackfill>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    indexes: Option<BTreeSet<IndexName>>,
}

impl SinkState {
    /// The state of a sink that holds nothing.
    pub fn new() -> Self {
        SinkState::default()
    }

    /// The stored form: one line of JSON (no newline), `{"v":1,...}`, positions in [`Position`]'s text form (`"X/Y"`).
    pub fn to_text(&self) -> String {
        let stored = Stored {
            v: STATE_VERSION,
            origin: self.origin.clone(),
            position: self.position.map(|p| p.to_string()),
            in_transaction: self.in_transaction.map(|t| (t.position.to_string(), t.envelopes)),
            owed: self.owed.clone(),
            indexes: self.indexes.clone(),
        };
        // Strings, numbers and names always serialize.
        serde_json::to_string(&stored).expect("a sink state serializes")
    }

    /// Reads what [`to_text`](Self::to_text) wrote (surrounding whitespace allowed).
    ///
    /// # Errors
    /// [`StateError::Unreadable`] for any other text, another version, an invalid position or index
    /// name, or an owed backfill with no index.
    pub fn parse(text: &str) -> Result<SinkState, StateError> {
        let unreadable =
            |reason: String| StateError::Unreadable { text: text.chars().take(200).collect(), reason };
        let stored: Stored = serde_json::from_str(text.trim()).map_err(|e| unreadable(e.to_string()))?;
        if stored.v != STATE_VERSION {
            return Err(unreadable(format!("version {}", stored.v)));
        }
        let lsn = |t: &str| Position::from_lsn(t).map_err(|e| unreadable(format!("{t:?}: {e}")));
        let position = stored.position.as_deref().map(lsn).transpose()?;
        let in_transaction = match &stored.in_transaction {
            Some((p, envelopes)) => Some(InTransaction { position: lsn(p)?, envelopes: *envelopes }),
            None => None,
        };
        if stored.owed.iter().any(|o| o.indexes.is_empty()) {
            return Err(unreadable("an owed backfill with no index".into()));
        }
        Ok(SinkState {
            origin: stored.origin,
            position,
            in_transaction,
            owed: stored.owed,
            indexes: stored.indexes,
        })
    }

    /// Where the sink's data stands in the source's order: its last whole transaction, or,
    /// while a large transaction is applied in part, just before it (its commit position − 1).
    /// `None` for a sink that applied no change.
    pub fn applied(&self) -> Option<Position> {
        let partial = self.in_transaction.map(|t| Position(t.position.0.saturating_sub(1)));
        self.position.max(partial)
    }

    /// Whether the sink holds anything: a change, or a snapshot row (an owed backfill begun).
    pub fn holds_data(&self) -> bool {
        self.applied().is_some() || self.owed.iter().any(|o| o.after.is_some())
    }

    /// What of `item` this state does not cover. Snapshot batches (no position anywhere) and
    /// `SnapshotComplete` are never covered (snapshot rows are applied at least once: an upsert
    /// by id applied twice leaves the same row).
    ///
    /// # Errors
    /// [`StateError::ChunkGap`]: the batch starts past the envelopes applied of its
    /// transaction.
    pub fn uncovered(&self, item: &LaneItem) -> Result<Uncovered, StateError> {
        let LaneItem::Batch(batch) = item else { return Ok(Uncovered::All) };
        let Some(position) = transaction_of(batch) else { return Ok(Uncovered::All) };
        if self.position.is_some_and(|p| position <= p) {
            return Ok(Uncovered::Nothing);
        }
        let done = match self.in_transaction {
            Some(t) if t.position == position => t.envelopes,
            _ => 0,
        };
        if batch.offset > done {
            return Err(StateError::ChunkGap { position, offset: batch.offset, applied: done });
        }
        let len = batch.envelopes.len() as u64;
        let skip = (done - batch.offset).min(len);
        Ok(match skip {
            0 => Uncovered::All,
            // A chunk wholly applied; a transaction's last batch still moves the position.
            s if s == len && batch.position.is_none() => Uncovered::Nothing,
            s => Uncovered::From(s as usize),
        })
    }

    /// The batch of `item` without its first `from` envelopes (for [`Uncovered::From`]): its
    /// offset moved on by as many. Allocates the shorter envelope list (only a transaction the
    /// source sent again after a restart is cut so).
    pub fn trim(item: &LaneItem, from: usize) -> LaneItem {
        match item {
            LaneItem::Batch(b) => {
                let from = from.min(b.envelopes.len());
                LaneItem::Batch(Batch {
                    position: b.position,
                    changes: b.changes,
                    offset: b.offset + from as u64,
                    envelopes: Arc::from(&b.envelopes[from..]),
                })
            }
            other => other.clone(),
        }
    }

    /// Records that the sink applied `item` (what [`uncovered`](Self::uncovered) left of it): a
    /// transaction moves the position (and its [`Op::Resync`] envelopes
    /// [`resync`](Self::resync) their indexes); a chunk the in-transaction count; a snapshot batch the
    /// progress of the backfill it belongs to (a snapshot of an index no owed backfill names
    /// starts one, so that a crash resumes it); `SnapshotComplete` ends what it completes and
    /// adds its indexes to those held.
    pub fn advance(&mut self, item: &LaneItem) {
        self.advance_resyncing(item);
    }

    /// [`advance`](Self::advance), saying whether `item` resynced an index (the sink engine
    /// then hands its sink truncates in their place: one look at the envelopes for both).
    pub(crate) fn advance_resyncing(&mut self, item: &LaneItem) -> bool {
        let mut resynced = false;
        match item {
            LaneItem::Batch(batch) => match (batch.position, transaction_of(batch)) {
                (Some(p), _) => {
                    self.position = self.position.max(Some(p));
                    self.in_transaction = None;
                    for e in batch.envelopes.iter().filter(|e| e.op == Op::Resync) {
                        self.resync(&e.index);
                        resynced = true;
                    }
                }
                (None, Some(p)) => {
                    let envelopes = batch.offset + batch.envelopes.len() as u64;
                    let done = self.in_transaction.filter(|t| t.position == p).map_or(0, |t| t.envelopes);
                    self.in_transaction = Some(InTransaction { position: p, envelopes: envelopes.max(done) });
                }
                (None, None) => {
                    if let Some(last) = batch.envelopes.last() {
                        self.snapshot_row(&last.index, &last.id);
                    }
                }
            },
            LaneItem::SnapshotComplete { indexes } => self.complete(indexes),
        }
        resynced
    }

    fn snapshot_row(&mut self, index: &IndexName, id: &str) {
        let found =
            self.owed.iter_mut().find_map(|o| o.indexes.iter().position(|i| i == index).map(|k| (o, k)));
        match found {
            Some((owed, k)) => {
                // The request's indexes are served in order: the ones before this are done.
                owed.indexes.drain(..k);
                owed.after = Some(id.to_owned());
            }
            None => self.owed.push(OwedBackfill { indexes: vec![index.clone()], after: Some(id.to_owned()) }),
        }
    }

    fn complete(&mut self, done: &[IndexName]) {
        for owed in &mut self.owed {
            if owed.indexes.first().is_some_and(|first| done.contains(first)) {
                owed.after = None;
            }
            owed.indexes.retain(|i| !done.contains(i));
        }
        self.owed.retain(|o| !o.indexes.is_empty());
        if let Some(held) = &mut self.indexes {
            held.extend(done.iter().cloned());
        }
    }

    /// Whether the sink holds `index` or is owed it (`true` for every index when indexes are
    /// not tracked).
    pub fn knows(&self, index: &IndexName) -> bool {
        self.indexes.as_ref().is_none_or(|held| held.contains(index))
            || self.owed.iter().any(|o| o.indexes.contains(index))
    }

    /// Owes a backfill of `indexes`, leaving out those already owed (and, with `held_too`,
    /// those held). Returns the backfill added, if any index was left.
    pub fn owe(&mut self, indexes: &[IndexName], held_too: bool) -> Option<OwedBackfill> {
        let mut missing: Vec<IndexName> = Vec::new();
        for index in indexes {
            let owed = self.owed.iter().any(|o| o.indexes.contains(index));
            let held = held_too && self.indexes.as_ref().is_some_and(|h| h.contains(index));
            if !owed && !held && !missing.contains(index) {
                missing.push(index.clone());
            }
        }
        if missing.is_empty() {
            return None;
        }
        let owed = OwedBackfill { indexes: missing, after: None };
        self.owed.push(owed.clone());
        Some(owed)
    }

    /// P2: `index`'s rows come again ([`Op::Resync`]: its table rejoined the source, and the
    /// sink emptied it, as for [`Op::Truncate`]). The sink no longer holds it; a backfill owed
    /// with it leaves it out (and resumes its next index from that index's first row, when
    /// `index` was the one in progress); a backfill of `index` alone, from its first row, is
    /// owed last, and returned.
    ///
    /// Why a backfill of its own: a request asked before the resync may be served, partly or
    /// whole, before the source saw the rejoin; rows of `index` it brought are emptied, and
    /// its `SnapshotComplete` must not make the sink hold `index` again. A source that
    /// resyncs an index drops it from the requests it serves at that point
    /// and serves it whole in those it takes later (the PostgreSQL source does), so whichever
    /// request names it next is the one that fills it.
    pub fn resync(&mut self, index: &IndexName) -> OwedBackfill {
        if let Some(held) = &mut self.indexes {
            held.remove(index);
        }
        for owed in &mut self.owed {
            if owed.indexes.first() == Some(index) {
                owed.after = None;
            }
            owed.indexes.retain(|i| i != index);
        }
        self.owed.retain(|o| !o.indexes.is_empty());
        let owed = OwedBackfill { indexes: vec![index.clone()], after: None };
        self.owed.push(owed.clone());
        owed
    }

    /// The request that asks for `owed` for `sink`, resuming after its last row.
    pub fn request(sink: &SinkName, owed: &OwedBackfill) -> Request {
        Request::Backfill { sink: sink.clone(), indexes: owed.indexes.clone(), after: owed.after.clone() }
    }
}

/// The transaction a batch belongs to: its position, or for a chunk its envelopes'; `None` for
/// snapshot rows.
pub fn transaction_of(batch: &Batch) -> Option<Position> {
    batch.position.or_else(|| batch.envelopes.first().and_then(|e| e.position))
}

#[cfg(test)]
mod tests {
    use crate::Envelope;

    use super::*;

    fn envelope(index: &str, id: u64, position: Option<Position>) -> Envelope {
        Envelope {
            index: IndexName::new(index).unwrap(),
            id: id.to_string(),
            op: Op::Upsert,
            position,
            document: bytes::Bytes::from(format!("{{\"id\":{id}}}")),
            built_at_micros: None,
            relation: None,
            old_id: None,
            unchanged: Vec::new(),
        }
    }

    /// A transaction of `n` envelopes at `lsn`, in chunks of `chunk` (only the last positioned).
    fn transaction(lsn: u64, n: u64, chunk: u64) -> Vec<LaneItem> {
        let p = Position(lsn);
        let ids: Vec<u64> = (0..n).collect();
        let parts: Vec<&[u64]> = ids.chunks(chunk as usize).collect();
        let mut offset = 0;
        let mut out = Vec::new();
        for (k, part) in parts.iter().enumerate() {
            let envelopes: Arc<[_]> = part.iter().map(|&i| envelope("t", i, Some(p))).collect();
            let len = envelopes.len() as u64;
            let position = (k + 1 == parts.len()).then_some(p);
            out.push(LaneItem::Batch(Batch { position, changes: len, offset, envelopes }));
            offset += len;
        }
        out
    }

    fn snapshot(index: &str, ids: std::ops::Range<u64>) -> LaneItem {
        LaneItem::Batch(Batch::new(None, ids.map(|i| envelope(index, i, None)).collect()))
    }

    fn names(n: &[&str]) -> Vec<IndexName> {
        n.iter().map(|i| IndexName::new(*i).unwrap()).collect()
    }

    /// C1: what the state covers after some chunks is skipped when the transaction comes again
    /// from its start, cut elsewhere; a transaction at or before the position is skipped whole.
    #[test]
    fn c1_a_resent_transaction_is_covered_up_to_the_envelopes_applied() {
        let mut state = SinkState::new();
        for item in &transaction(7, 10, 4)[..2] {
            assert_eq!(state.uncovered(item).unwrap(), Uncovered::All);
            state.advance(item); // envelopes 0..8
        }
        assert_eq!(state.in_transaction, Some(InTransaction { position: Position(7), envelopes: 8 }));
        assert_eq!(state.applied(), Some(Position(6)));
        // Sent again from its start, cut elsewhere: each batch is checked, then recorded.
        let mut again = Vec::new();
        for item in transaction(7, 10, 3) {
            let u = state.uncovered(&item).unwrap();
            again.push(u);
            match u {
                Uncovered::Nothing => {}
                Uncovered::All => state.advance(&item),
                Uncovered::From(n) => {
                    let LaneItem::Batch(cut) = SinkState::trim(&item, n) else { panic!() };
                    assert_eq!((cut.offset, cut.envelopes.len()), (8, 1));
                    state.advance(&LaneItem::Batch(cut));
                }
            }
        }
        assert_eq!(again, [Uncovered::Nothing, Uncovered::Nothing, Uncovered::From(2), Uncovered::All]);
        assert_eq!((state.position, state.in_transaction), (Some(Position(7)), None));
        for item in transaction(7, 10, 5) {
            assert_eq!(state.uncovered(&item).unwrap(), Uncovered::Nothing);
        }
        // A wholly covered last batch still moves the position.
        let mut state = SinkState::new();
        state.advance(&transaction(9, 4, 2)[0]);
        state.advance(&transaction(9, 4, 2)[1].clone());
        assert_eq!(state.position, Some(Position(9)));
        let mut half = SinkState::new();
        half.advance(&transaction(9, 4, 2)[0]);
        half.in_transaction = Some(InTransaction { position: Position(9), envelopes: 4 });
        assert_eq!(half.uncovered(&transaction(9, 4, 2)[1]).unwrap(), Uncovered::From(2));
    }

    /// A chunk past the envelopes applied is a gap.
    #[test]
    fn a_missing_chunk_is_a_gap() {
        let mut state = SinkState::new();
        let txn = transaction(9, 6, 2);
        state.advance(&txn[0]);
        let e = state.uncovered(&txn[2]).unwrap_err();
        assert!(matches!(e, StateError::ChunkGap { offset: 4, applied: 2, .. }), "{e}");
    }

    /// P2: a resync ([`Op::Resync`]) in an applied transaction drops the index from what the
    /// sink holds and from the backfills it is owed (the one in progress on it starts its next
    /// index from the first row), and owes it alone, from its first row, last.
    #[test]
    fn p2_a_resync_owes_the_index_alone_from_its_first_row() {
        let mut state = SinkState { indexes: Some(names(&["h"]).into_iter().collect()), ..SinkState::new() };
        state.owe(&names(&["a", "b"]), true);
        state.advance(&snapshot("a", 0..3));
        state.owe(&names(&["c"]), true);
        let resync = |index: &str| Envelope {
            op: Op::Resync,
            id: String::new(),
            ..envelope(index, 0, Some(Position(9)))
        };
        state.advance(&LaneItem::Batch(Batch::new(Some(Position(9)), vec![resync("a"), resync("h")].into())));
        assert_eq!(state.position, Some(Position(9)));
        assert_eq!(
            state.owed,
            [
                OwedBackfill { indexes: names(&["b"]), after: None },
                OwedBackfill { indexes: names(&["c"]), after: None },
                OwedBackfill { indexes: names(&["a"]), after: None },
                OwedBackfill { indexes: names(&["h"]), after: None },
            ]
        );
        assert_eq!(state.indexes, Some(BTreeSet::new()), "h is held no more");
        // A request the source served without `a` after the resync completes: `a` stays owed.
        state.advance(&LaneItem::SnapshotComplete { indexes: names(&["b"]) });
        assert_eq!(state.owed.len(), 3);
        assert!(!state.indexes.as_ref().unwrap().contains(&IndexName::new("a").unwrap()));
    }

    /// P3: snapshot rows move the owed backfill on (the indexes before theirs are done), a
    /// `SnapshotComplete` ends it and adds its indexes to those held; rows nobody asked for
    /// start a record.
    #[test]
    fn p3_owed_backfills_follow_their_rows_and_end_at_snapshot_complete() {
        let mut state = SinkState { indexes: Some(BTreeSet::new()), ..SinkState::new() };
        assert!(state.owe(&names(&["a", "b"]), true).is_some());
        assert!(state.owe(&names(&["b"]), true).is_none(), "owed already");
        assert!(!state.knows(&IndexName::new("c").unwrap()));
        assert!(state.knows(&IndexName::new("b").unwrap()));
        state.advance(&snapshot("a", 0..3));
        assert_eq!(state.owed, [OwedBackfill { indexes: names(&["a", "b"]), after: Some("2".into()) }]);
        state.advance(&snapshot("b", 0..2));
        assert_eq!(state.owed, [OwedBackfill { indexes: names(&["b"]), after: Some("1".into()) }]);
        assert!(state.holds_data());
        state.advance(&LaneItem::SnapshotComplete { indexes: names(&["c"]) });
        assert_eq!(state.owed.len(), 1, "another backfill's completion leaves it");
        state.advance(&LaneItem::SnapshotComplete { indexes: names(&["a", "b"]) });
        assert!(state.owed.is_empty());
        assert_eq!(state.indexes, Some(names(&["a", "b", "c"]).into_iter().collect()));
        assert!(state.owe(&names(&["a"]), true).is_none(), "held");
        state.advance(&snapshot("z", 0..1));
        assert_eq!(state.owed, [OwedBackfill { indexes: names(&["z"]), after: Some("0".into()) }]);
        let request = SinkState::request(&SinkName::new("s").unwrap(), &state.owed[0]);
        assert_eq!(
            request,
            Request::Backfill {
                sink: SinkName::new("s").unwrap(),
                indexes: names(&["z"]),
                after: Some("0".into())
            }
        );
    }

    /// P7: the stored form round-trips, names its version, and refuses anything else.
    #[test]
    fn p7_the_stored_form_round_trips_and_refuses_other_text() {
        let state = SinkState {
            origin: Some("pg db 'x' slot \"s\"".into()),
            position: Some(Position(0x1_0000_0020)),
            in_transaction: Some(InTransaction { position: Position(0x1_0000_0030), envelopes: 3 }),
            owed: vec![OwedBackfill { indexes: names(&["a", "b"]), after: Some("k\\:1 \"q\"".into()) }],
            indexes: Some(names(&["a"]).into_iter().collect()),
        };
        let text = state.to_text();
        assert!(text.starts_with(r#"{"v":1,"#) && text.contains(r#""position":"1/20""#), "{text}");
        assert!(!text.contains('\n'));
        assert_eq!(SinkState::parse(&text).unwrap(), state);
        assert_eq!(SinkState::parse(&SinkState::new().to_text()).unwrap(), SinkState::new());
        assert_eq!(SinkState::new().to_text(), r#"{"v":1}"#);
        for bad in [
            "",
            "{}",
            r#"{"v":2}"#,
            r#"{"v":1,"position":"x"}"#,
            r#"{"v":1,"owed":[{"indexes":[]}]}"#,
            r#"{"v":1,"indexes":["Not A Name"]}"#,
            "0/10 42",
        ] {
            assert!(SinkState::parse(bad).is_err(), "{bad:?}");
        }
    }
}
