//! The [`TransactionBuilder`]: begin, changes and commit in, one [`Batch`] per committed
//! transaction (large ones in chunks) out.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use lanestream::{Batch, Envelope, IndexName, Op, ParseLsnError, Position, Relation};

use super::error::{BuildError, BuildErrorKind};
use super::keys::{KeyLookup, Tables};
use super::row::{filled_row, row_id, write_row, Change, Column, KeyRef};
use super::value::json_str;

/// An envelope to add for a change: id, op, and the row for its document.
type Planned<'r, 'a> = Option<(String, Op, Option<&'r [Column<'a>]>)>;

struct Pending {
    index: IndexName,
    id: String,
    op: Op,
    doc: Range<usize>,
    relation: Option<Arc<Relation>>,
    old_id: Option<String>,
    unchanged: Vec<String>,
}

/// The open transaction: what it gathered, and what it lost.
struct OpenTxn {
    begun: u64,
    xid: Option<u64>,
    /// The begin's LSN (the commit LSN: wal2json format-version 2's `B`, pgoutput's Begin): the
    /// position of the envelopes of the transaction's unpositioned chunks.
    begin_lsn: Option<Position>,
    /// Changes not yet returned in a chunk.
    changes: u64,
    /// All changes read so far.
    total_changes: u64,
    /// Unpositioned chunks returned so far.
    chunks: u64,
    /// Envelopes returned in those chunks: the next batch's [`Batch::offset`].
    offset: u64,
    /// Bad records inside the transaction; the first one's number.
    bad_lines: u64,
    first_bad: u64,
    pending: Vec<Pending>,
    docs: Vec<u8>,
    /// The commit time, µs since the Unix epoch, when the decoder knows it
    /// ([`TransactionBuilder::set_commit_time`]): recorded on every envelope.
    commit_micros: Option<u64>,
}

impl OpenTxn {
    /// `hint`: the previous batch's envelopes and document bytes, to size the buffers (at most
    /// 1,024 envelopes and 64 KiB).
    fn new(begun: u64, xid: Option<u64>, begin_lsn: Option<Position>, hint: (usize, usize)) -> Self {
        OpenTxn {
            begun,
            xid,
            begin_lsn,
            changes: 0,
            total_changes: 0,
            chunks: 0,
            offset: 0,
            bad_lines: 0,
            first_bad: 0,
            pending: Vec::with_capacity(hint.0.min(1 << 10)),
            docs: Vec::with_capacity(hint.1.min(1 << 16)),
            commit_micros: None,
        }
    }

    /// Changes lost if the transaction is discarded now: its changes and its bad records.
    fn lost(&self) -> u64 {
        self.total_changes + self.bad_lines
    }

    /// The error of a commit (at `lsn`) of this transaction when it had bad records.
    fn damaged(&self, lsn: String) -> BuildErrorKind {
        BuildErrorKind::DamagedTransaction {
            begun: self.begun,
            lsn,
            first_bad: self.first_bad,
            bad_lines: self.bad_lines,
            changes: self.total_changes,
            chunks: self.chunks,
        }
    }

    /// The envelopes gathered so far, at `position`, as one batch; the transaction goes on empty.
    fn take_envelopes(&mut self, position: Option<Position>) -> Arc<[Envelope]> {
        let mut docs = std::mem::take(&mut self.docs);
        // The batch keeps this allocation while it is in a lane: not much more than it uses (a
        // buffer sized after a larger transaction is cut down).
        if docs.capacity() > 2 * docs.len() + (1 << 12) {
            docs.shrink_to_fit();
        }
        let docs = Bytes::from(docs);
        // Collected straight into the batch's allocation (no intermediate Vec to copy); the
        // pending list keeps its allocation for the next chunk.
        self.pending
            .drain(..)
            .map(|p| Envelope {
                index: p.index,
                id: p.id,
                op: p.op,
                position,
                document: if p.doc.is_empty() || p.doc.end > docs.len() {
                    Bytes::new()
                } else {
                    docs.slice(p.doc)
                },
                built_at_micros: self.commit_micros,
                relation: p.relation,
                old_id: p.old_id,
                unchanged: p.unchanged,
            })
            .collect()
    }
}

/// A commit as the builder takes it (see [`TransactionBuilder::push_commit`]): each field as the
/// record gives it, or why it cannot, in the order the builder checks them.
pub(crate) struct Commit<'a> {
    /// The commit LSN, or why the record gives none.
    pub(crate) position: Result<Position, BuildErrorKind>,
    /// The LSN as the record wrote it, for the errors that name it (`None`: the position's).
    pub(crate) lsn: Option<&'a str>,
    /// The commit's xid (checked against the begin's), or why it is unreadable.
    pub(crate) xid: Result<Option<u64>, BuildErrorKind>,
}

/// Builds batches from the transactions a decoder reads: a begin, changes, a commit.
///
/// The [wal2json reader](crate::wal2json) feeds it lines
/// ([`push_line`](Self::push_line)), the [pgoutput decoder](crate::pgoutput) messages: a commit
/// returns the finished transaction's [`Batch`] (and, with
/// [`with_max_batch_changes`](Self::with_max_batch_changes), a change may return an unpositioned
/// chunk of a large transaction). At the end of the input call [`finish`](Self::finish) to learn
/// whether a transaction was left open. See the [module docs](super) for the mapping and for how
/// the builder recovers after an error; no input makes it panic.
///
/// ```
/// use lanestream_postgres::batch::TransactionBuilder;
/// let mut b = TransactionBuilder::new();
/// assert!(b.push_line(1, br#"{"action":"B"}"#)?.is_none());
/// let batch = b.push_line(2, br#"{"action":"C","lsn":"0/10"}"#)?.expect("a batch");
/// assert_eq!(batch.changes, 0); // an empty transaction still gives a positioned batch
/// assert_eq!(batch.position.map(|p| p.0), Some(0x10));
/// b.finish(2)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TransactionBuilder {
    open: Option<OpenTxn>,
    last_commit: Option<Position>,
    tables: Tables,
    transactions: u64,
    max_batch_changes: Option<u64>,
    /// Changes discarded by the error being returned (see [`BuildError::lost_changes`]).
    discarded: u64,
    /// The last batch's envelopes and document bytes: the next transaction's buffer sizes.
    hint: (usize, usize),
    /// Relations whose key the builder keys by other columns than the decoder flagged (a key
    /// looked up under `REPLICA IDENTITY FULL`, columns given with `set_key_columns`): the
    /// decoder's `Arc` and the one with the key used (see [`keyed`]).
    rekeyed: Vec<(Arc<Relation>, Arc<Relation>)>,
}

impl fmt::Debug for TransactionBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionBuilder")
            .field("open_since_line", &self.open.as_ref().map(|t| t.begun))
            .field("last_commit", &self.last_commit)
            .field("transactions", &self.transactions)
            .field("max_batch_changes", &self.max_batch_changes)
            .finish_non_exhaustive()
    }
}

impl Default for TransactionBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl TransactionBuilder {
    /// A builder with no open transaction and no previous commit.
    pub fn new() -> Self {
        TransactionBuilder {
            open: None,
            last_commit: None,
            tables: Tables::default(),
            transactions: 0,
            max_batch_changes: None,
            discarded: 0,
            hint: (0, 0),
            rekeyed: Vec::new(),
        }
    }

    /// Records `micros` (the open transaction's commit time, µs since the Unix epoch) on the
    /// [`Envelope::built_at_micros`] of every envelope of the transaction, its chunks included:
    /// what the pipeline measures commit → ack latency from. No effect without an open
    /// transaction. (The pgoutput decoder calls it from each Begin; wal2json input has none.)
    pub fn set_commit_time(&mut self, micros: Option<u64>) {
        if let Some(txn) = &mut self.open {
            txn.commit_micros = micros;
        }
    }

    /// Publishes a transaction of more than `max` changes as several batches: every `max`
    /// changes an **unpositioned** chunk ([`Batch::position`] `None`, its envelopes positioned at
    /// the begin's LSN, which is the commit LSN), and at the commit the positioned batch with the
    /// rest. So memory stays bounded by what the lanes hold, and since only the last batch
    /// carries the position, the watermark cannot pass a half-delivered transaction. `None` (the
    /// default) or 0: one batch per transaction. A transaction whose begin gave no LSN (a
    /// wal2json `B` line without `lsn`: run wal2json with `include-lsn=true`) is held whole, since
    /// its chunks could not be positioned.
    pub fn with_max_batch_changes(mut self, max: Option<u64>) -> Self {
        self.max_batch_changes = max.filter(|&m| m > 0);
        self
    }

    /// Sets the key columns of `schema.table`: the columns of its replica identity (a primary
    /// key, or the unique index of `REPLICA IDENTITY USING INDEX`), which make its rows' ids
    /// whatever the change's `pk` says. `None` forgets them. See the [module docs](super), *Ids*.
    pub fn set_key_columns(&mut self, schema: &str, table: &str, columns: Option<Vec<String>>) {
        self.tables.set_key_columns(schema, table, columns);
    }

    /// Asks `lookup(schema, table)` for the key of each table the first time the builder meets
    /// it, and again whenever its shape changes (the column names of its rows, or the change's
    /// `pk`) or a key column is missing from a row (the live source reads the catalog). An
    /// [`CatalogKey::IdentityIndex`](super::CatalogKey::IdentityIndex) keys the table's rows; a
    /// [`CatalogKey::PrimaryKey`](super::CatalogKey::PrimaryKey) only changes without a `pk` (a
    /// wal2json line's `pk` is the key as it was at that change, where the catalog tells how it
    /// is now). A failed look-up fails the change with [`BuildErrorKind::KeyLookupFailed`] and is
    /// asked again at the next change. Columns given with
    /// [`set_key_columns`](Self::set_key_columns) come first.
    pub fn with_key_lookup(mut self, lookup: KeyLookup) -> Self {
        self.tables.lookup = Some(lookup);
        self
    }

    /// The record number of the open transaction's begin, if a transaction is open.
    pub fn open_since(&self) -> Option<u64> {
        self.open.as_ref().map(|t| t.begun)
    }

    /// The position of the last batch returned, if any.
    pub fn last_commit(&self) -> Option<Position> {
        self.last_commit
    }

    /// How many positioned batches (committed transactions) were returned so far.
    pub fn transactions(&self) -> u64 {
        self.transactions
    }

    /// Opens a transaction (what wal2json's `B` line, pgoutput's Begin does): `xid`, and
    /// `begin_lsn` (the commit LSN: the position of its unpositioned chunks). `seq` numbers the
    /// record in errors.
    pub(crate) fn push_begin(
        &mut self,
        seq: u64,
        xid: Option<u64>,
        begin_lsn: Option<Position>,
    ) -> Result<(), BuildError> {
        self.record(seq, |b| b.begin(seq, xid, begin_lsn.filter(|&p| p != Position::RESERVED)))
    }

    /// Feeds one change (see [`push_begin`](Self::push_begin)).
    pub(crate) fn push_change(
        &mut self,
        seq: u64,
        change: &Change<'_, '_>,
    ) -> Result<Option<Batch>, BuildError> {
        self.record(seq, |b| b.change(change))
    }

    /// Commits the open transaction (see [`push_begin`](Self::push_begin)): its positioned batch.
    /// An error discards the transaction.
    pub(crate) fn push_commit(&mut self, seq: u64, commit: Commit<'_>) -> Result<Option<Batch>, BuildError> {
        self.record(seq, |b| b.commit(commit))
    }

    /// Runs `f`, one record's work: its error counts the record as a bad one of the open
    /// transaction (but a begin's, which discarded that transaction), and says what it
    /// discarded.
    fn record<T>(
        &mut self,
        seq: u64,
        f: impl FnOnce(&mut Self) -> Result<T, BuildErrorKind>,
    ) -> Result<T, BuildError> {
        self.discarded = 0;
        f(self).map_err(|kind| {
            if !matches!(kind, BuildErrorKind::BeginInsideTransaction { .. }) {
                self.damage(seq);
            }
            BuildError::discarding(seq, kind, std::mem::take(&mut self.discarded))
        })
    }

    /// Counts record `seq` as a bad record of the open transaction, if one is open: a record the
    /// caller could not read (a line over its length limit, a malformed message, say). The
    /// transaction will be discarded at its commit with [`BuildErrorKind::DamagedTransaction`].
    pub fn skip_line(&mut self, seq: u64) {
        self.damage(seq);
    }

    fn damage(&mut self, seq: u64) {
        if let Some(t) = self.open.as_mut() {
            if t.bad_lines == 0 {
                t.first_bad = seq;
                // Nothing of it will be published: free what it holds.
                t.pending = Vec::new();
                t.docs = Vec::new();
            }
            t.bad_lines += 1;
        }
    }

    /// Ends the input at record `seq`.
    ///
    /// # Errors
    /// [`BuildErrorKind::Truncated`] when a transaction is still open; it is discarded, and the
    /// builder can be used again. (Its changes never committed in the input, so they count as
    /// no loss.)
    pub fn finish(&mut self, seq: u64) -> Result<(), BuildError> {
        match self.open.take() {
            Some(t) => Err(BuildError::new(seq, BuildErrorKind::Truncated { begun: t.begun })),
            None => Ok(()),
        }
    }

    fn begin(
        &mut self,
        seq: u64,
        xid: Option<u64>,
        begin_lsn: Option<Position>,
    ) -> Result<(), BuildErrorKind> {
        match self.open.replace(OpenTxn::new(seq, xid, begin_lsn, self.hint)) {
            Some(old) => {
                self.discarded = old.lost();
                Err(BuildErrorKind::BeginInsideTransaction { begun: old.begun, dropped: old.lost() })
            }
            None => Ok(()),
        }
    }

    fn change(&mut self, c: &Change<'_, '_>) -> Result<Option<Batch>, BuildErrorKind> {
        let action = c.action;
        if self.open.is_none() {
            return Err(BuildErrorKind::OutsideTransaction { action });
        }
        let (schema, table) = (c.schema, c.table);
        let (pk, columns, identity) = (c.pk, c.columns, c.identity);
        let row = if action == 'D' { identity } else { columns };
        let (index, known_key, primary) =
            self.tables.resolve(schema, table, pk, row, identity, !c.key_from_stream)?;
        // Compute everything that can fail before touching the transaction.
        let filled = match (action, columns, identity) {
            ('U', Some(new), Some(old)) => filled_row(new, old),
            _ => None,
        };
        let columns = filled.as_deref().or(columns);
        let key = match (&known_key, pk) {
            (Some(names), _) => KeyRef::Named(names),
            (None, Some(pk)) if !pk.is_empty() => KeyRef::Pk(pk),
            (None, _) => match &primary {
                Some(names) => KeyRef::Named(names),
                None => {
                    self.tables.learn_identity(schema, table, columns, identity)?;
                    KeyRef::All
                }
            },
        };
        let begin_lsn = self.open.as_ref().and_then(|t| t.begin_lsn);
        let named = |e: BuildErrorKind| match e {
            BuildErrorKind::NullKey { column, .. } => BuildErrorKind::NullKey {
                table: format!("{schema}.{table}"),
                column,
                lsn: c
                    .lsn
                    .and_then(json_str)
                    .map(Cow::into_owned)
                    .or_else(|| begin_lsn.map(|p| p.to_string()))
                    .unwrap_or_else(|| "unknown".to_owned()),
            },
            e => e,
        };
        let row_id = |row: &[Column<'_>], side| row_id(row, key, side).map_err(named);
        let relation = c.relation.map(|r| keyed(&mut self.rekeyed, r, key));
        // P5: the new row's columns the change left out (unchanged TOASTed values) that the
        // old row did not fill in.
        let unchanged: Vec<String> = match (action, relation.as_deref(), columns) {
            ('U', Some(rel), Some(row)) if !c.unchanged.is_empty() => c
                .unchanged
                .iter()
                .filter_map(|&i| rel.columns.get(i))
                .filter(|col| !row.iter().any(|have| have.name == col.name.as_str()))
                .map(|col| col.name.clone())
                .collect(),
            _ => Vec::new(),
        };
        let mut moved_from = None;
        let mut out: [Planned<'_, '_>; 2] = [None, None];
        match action {
            'T' => out[0] = Some((String::new(), Op::Truncate, None)),
            'D' => {
                let old = identity.ok_or(BuildErrorKind::MissingField {
                    action,
                    field: "identity",
                    hint: " (the table needs a primary key or REPLICA IDENTITY FULL)",
                })?;
                out[0] = Some((row_id(old, "identity")?, Op::Delete, Some(old)));
            }
            _ => {
                let new =
                    columns.ok_or(BuildErrorKind::MissingField { action, field: "columns", hint: "" })?;
                let new_id = row_id(new, "columns")?;
                // P5: a key change is the upsert of the new id naming the old one (a sink moves
                // the old row's unchanged values), then the delete of the old id.
                if let (Some(old), 'U') = (identity, action) {
                    let old_id = row_id(old, "identity")?;
                    if old_id != new_id {
                        moved_from = Some(old_id.clone());
                        out[1] = Some((old_id, Op::Delete, Some(old)));
                    }
                }
                out[0] = Some((new_id, Op::Upsert, Some(new)));
            }
        }
        let max = self.max_batch_changes;
        let Some(txn) = self.open.as_mut() else {
            return Err(BuildErrorKind::OutsideTransaction { action });
        };
        txn.changes += 1;
        txn.total_changes += 1;
        if txn.bad_lines > 0 {
            return Ok(None); // it will be discarded: keep nothing
        }
        // The index (an `Arc`) moves into the last envelope: one count change less per change.
        let planned = match out {
            [Some(a), Some(b)] => [Some((a, index.clone(), relation.clone())), Some((b, index, relation))],
            [a, b] => [a.or(b).map(|p| (p, index, relation)), None],
        };
        let mut unchanged = Some(unchanged);
        for ((id, op, row), index, relation) in planned.into_iter().flatten() {
            let doc = match row {
                Some(row) => write_row(&mut txn.docs, row),
                None => txn.docs.len()..txn.docs.len(),
            };
            let (old_id, unchanged) = match op {
                Op::Upsert => (moved_from.take(), unchanged.take().unwrap_or_default()),
                _ => (None, Vec::new()),
            };
            txn.pending.push(Pending { index, id, op, doc, relation, old_id, unchanged });
        }
        // A chunk's envelopes are positioned at the begin's LSN: without it (a wal2json `B` line
        // without `lsn`) they would read as snapshot rows, so such a transaction is held whole.
        if max.is_some_and(|m| txn.changes >= m) && txn.begin_lsn.is_some() {
            self.hint = (txn.pending.len(), txn.docs.len());
            let envelopes = txn.take_envelopes(txn.begin_lsn);
            // The next chunk is likely as large as this one (bounded by `max`): its documents'
            // buffer sized so, instead of grown from empty through a copy at each doubling.
            txn.docs = Vec::with_capacity(self.hint.1);
            let changes = std::mem::take(&mut txn.changes);
            txn.chunks += 1;
            let offset = txn.offset;
            txn.offset += envelopes.len() as u64;
            return Ok(Some(Batch { position: None, changes, offset, envelopes }));
        }
        Ok(None)
    }

    fn commit(&mut self, c: Commit<'_>) -> Result<Option<Batch>, BuildErrorKind> {
        let mut txn = self.open.take().ok_or(BuildErrorKind::OutsideTransaction { action: 'C' })?;
        // From here on, any error discards the transaction.
        self.discarded = txn.lost();
        if txn.bad_lines > 0 {
            let lsn = match (c.lsn, &c.position) {
                (Some(lsn), _) => lsn.to_owned(),
                (None, Ok(position)) => position.to_string(),
                (None, Err(_)) => "unknown".to_owned(),
            };
            return Err(txn.damaged(lsn));
        }
        let position = c.position?;
        if position == Position::RESERVED {
            let lsn = c.lsn.map_or_else(|| position.to_string(), str::to_owned);
            return Err(BuildErrorKind::BadLsn(ParseLsnError(lsn)));
        }
        if let Some(previous) = self.last_commit {
            if position <= previous {
                return Err(BuildErrorKind::LsnRegressed { lsn: position, previous });
            }
        }
        if let (Some(begin), Some(commit)) = (txn.xid, c.xid?) {
            if begin != commit {
                return Err(BuildErrorKind::XidMismatch { begin, commit });
            }
        }
        self.discarded = 0;
        self.hint = (txn.pending.len(), txn.docs.len());
        let envelopes = txn.take_envelopes(Some(position));
        self.last_commit = Some(position);
        self.transactions += 1;
        Ok(Some(Batch { position: Some(position), changes: txn.changes, offset: txn.offset, envelopes }))
    }
}

/// `relation` with [`Relation::key`] naming the columns the id was built from (`key`; empty for
/// every column): the decoder's own `Arc` when its flagged columns are those (the common case:
/// a count, no allocation), else one made once per relation and key and kept in `rekeyed`.
fn keyed(
    rekeyed: &mut Vec<(Arc<Relation>, Arc<Relation>)>,
    relation: &Arc<Relation>,
    key: KeyRef<'_, '_>,
) -> Arc<Relation> {
    // Compared in place: no allocation on the common path.
    let len = match key {
        KeyRef::Named(names) => names.len(),
        KeyRef::Pk(pk) => pk.len(),
        KeyRef::All => 0,
    };
    let name = |at: usize| match key {
        KeyRef::Named(names) => names[at].as_str(),
        KeyRef::Pk(pk) => pk[at].name.as_ref(),
        KeyRef::All => "",
    };
    let same = |r: &Relation| {
        r.key.len() == len
            && r.key
                .iter()
                .enumerate()
                .all(|(at, &i)| r.columns.get(usize::from(i)).is_some_and(|c| c.name == name(at)))
    };
    if same(relation) {
        return relation.clone();
    }
    if let Some((_, k)) = rekeyed.iter().find(|(from, k)| Arc::ptr_eq(from, relation) && same(k)) {
        return k.clone();
    }
    if rekeyed.len() >= 64 {
        rekeyed.clear();
    }
    let mut k = Relation::clone(relation);
    k.key = (0..len)
        .filter_map(|at| {
            k.columns.iter().position(|c| c.name == name(at)).and_then(|i| u16::try_from(i).ok())
        })
        .collect();
    let k = Arc::new(k);
    rekeyed.push((relation.clone(), k.clone()));
    k
}
