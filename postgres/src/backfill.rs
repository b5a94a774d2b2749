//! Backfill from the tables, served while the live stream flows: Netflix DBLog's watermark
//! technique on the pgoutput stream of the [live source](crate::live).
//!
//! A sink asks for a snapshot of some indexes ([`Request::Backfill`]); the live source reads
//! the tables behind them in key order, one chunk at a time, and interleaves each chunk with the
//! change stream so that a snapshot row never overwrites a newer change in the sink.
//!
//! # Which table, which key
//! An index is the live reader's `schema_table` name ([`index_name`]) of a table of the
//! source's publication (`pg_publication_tables`); a name no published table has, or that two
//! tables share after normalisation, is refused ([`LiveError::BackfillRefused`]). Rows are read
//! in the order of the table's **key index** — its replica identity index under `REPLICA
//! IDENTITY USING INDEX`, else its primary key — and their ids are built from the same columns
//! the live stream keys that table's changes by (in column order, the reader's one id encoding:
//! [`crate::wal2json`], *Ids*), so a snapshot row and a change of the same row carry one id.
//! **A table without a primary key** (and without an identity index), or under `REPLICA
//! IDENTITY NOTHING`, **is refused**, naming the table: its live ids are every column (or it
//! sends no updates and deletes), so neither keyset pagination nor reconciliation by id can be
//! right. Give it a primary key. Documents are the rows as the decoder writes a change's new row
//! (every column but generated ones, each text value typed by its column's type OID:
//! [`crate::pgoutput`], *Output*), read in text format on the source's second connection.
//! (Publication column lists, PostgreSQL 15, are not applied: the snapshot has every column.)
//!
//! # One chunk
//! On the live source's second connection (the synchronous [`postgres`] client), per chunk, in
//! one round trip (a simple query of three transactions):
//! 1. the **low mark**: `SELECT pg_logical_emit_message(true, 'lanestream.backfill',
//!    '<source>:<chunk>:low')`, in a transaction of its own, committed;
//! 2. in a `REPEATABLE READ READ ONLY` transaction: `pg_current_snapshot()` (the snapshot the
//!    chunk is read in), then `SELECT <columns> FROM <table> WHERE (<key>) > (<after>) ORDER BY
//!    <key> LIMIT <chunk rows>` (keyset pagination: the key index reads only the chunk);
//! 3. the **high mark**, as the low one.
//!
//! The rows wait, in the source, for the stream to reach the high mark; the stream never waits
//! for more than one chunk's `SELECT` (which a lock on the table, `ACCESS EXCLUSIVE`, can hold
//! up). Every change the stream hands over for the table removes
//! its key from the waiting chunk when it comes **between the low and the high mark** (DBLog's
//! rule: the change may be newer than the row read), and also **before the low mark when its
//! transaction is not visible in the chunk's snapshot** (its xid in the snapshot's in-progress
//! list or past its `xmax`): a transaction whose commit record precedes the low mark may still
//! be finishing (not yet visible to others) when the snapshot is taken, and its change would
//! otherwise be older in the lane than the row read (the source keeps, per table being
//! backfilled, the keys of the transactions handed over since the request was taken until a
//! chunk's snapshot sees them). A `TRUNCATE` of the table empties the
//! chunk. At the high mark the rows left become one snapshot batch (position `None`, envelopes
//! [`Op::Upsert`] without a position, W2) for the requesting sink only, then the next chunk is
//! read. So a snapshot row is never older than a change the sink applied before it: a sink
//! applies snapshot rows as plain upserts. After the last chunk of the last index comes
//! `LaneItem::SnapshotComplete { indexes }` (the request's indexes), after which the driver acks
//! the request ([R2](lanestream::contract#r2)).
//!
//! **Why transactional marks.** A non-transactional message is decoded at its place in the WAL
//! but PostgreSQL 15 does not flush it (`pg_logical_emit_message` has no `flush` argument before
//! 17): the stream would see each mark only when the WAL writer flushes, up to
//! `wal_writer_delay` (200 ms) later — per mark, per chunk. A transactional message commits
//! (and, with `synchronous_commit`, flushes) at once, and comes in the stream at its commit,
//! in the same order as every other transaction. The cost: each mark is a transaction of its
//! own, which the stream hands over as an empty positioned batch (a genuine commit: acking it
//! moves the watermark, [I2](lanestream::contract#i2)).
//!
//! Marks carry the source's random instance id and the chunk's number: marks of another source
//! on the same database, or re-sent ones after a reconnect, are ignored.
//!
//! # Resuming
//! `after: Some(id)` resumes the **first** index after the row whose id is `id`: the id is
//! decoded back into its key values (split at the `:` that are not escaped, `\:` and `\\`
//! unescaped; a `bytea` value gets its `\x` back), which is unambiguous because ids put every
//! string value escaped and no other value (numbers, booleans) holds a `:`. An id with another
//! number of values than the key has, or with a NULL (`\N`), is refused
//! ([`LiveError::BackfillRefused`]). A sink that records the id of the last snapshot row it
//! applied and asks again with it re-reads at most the chunk that was in flight.
//!
//! # Progress
//! [`LiveSource::backfill_progress`](crate::live::LiveSource::backfill_progress): per table,
//! rows read so far and the estimate `pg_class.reltuples` (`-1` when the table was never
//! analysed); [`LiveMetrics`](crate::live::LiveMetrics) counts snapshot batches and rows.
//!
//! # How a driver serves it (the call sequence)
//! ```text
//! source.start()?;
//! loop {
//!     // a Request::Backfill taken from the request lane:
//!     source.backfill(request)?;            // Err(BackfillRefused): ack it unanswered (never servable)
//!     match source.next_item(&mut decoder, timeout)? {
//!         Some(LiveItem::Change(batch)) => publish to every lane,
//!         Some(LiveItem::Snapshot { sink, item }) => publish_to(sink, item);
//!             if item is SnapshotComplete: ack the request (R2),
//!         None => {}
//!     }
//!     source.confirm(watermark)?;
//! }
//! ```
//! An `impl Source for` a struct holding the source and its decoder is then `next` =
//! [`next_item`](crate::live::LiveSource::next_item) mapped one to one onto `SourceItem::Change`
//! / `SourceItem::Snapshot`, `backfill` = [`LiveSource::backfill`](crate::live::LiveSource::backfill),
//! `confirm(p)` = `confirm(Some(p))`. Several requests are served one after the other, in the
//! order given.
//!
//! [`Request::Backfill`]: lanestream::Request::Backfill
//! [`index_name`]: crate::wal2json::index_name
//! [`LiveError::BackfillRefused`]: crate::live::LiveError::BackfillRefused
//! [`Op::Upsert`]: lanestream::Op::Upsert

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;

use ahash::AHashMap as HashMap;
use bytes::Bytes;
use lanestream::{Batch, Envelope, IndexName, LaneItem, Op, Position, SinkName};
use postgres::{Client, SimpleQueryMessage};

use crate::pgoutput::{plain, push_json_value};
use crate::wal2json::{index_name, snapshot_row, Column};

/// The prefix of the low and high marks in the WAL (`pg_logical_emit_message`).
pub const MARK_PREFIX: &str = "lanestream.backfill";

/// The default number of rows per chunk ([`LiveConfig::backfill_chunk_rows`](crate::live::LiveConfig::backfill_chunk_rows)).
pub const DEFAULT_CHUNK_ROWS: usize = 1024;

/// Which mark of a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkKind {
    /// Written before the chunk's `SELECT`.
    Low,
    /// Written after it.
    High,
}

/// A backfill mark read from the stream (content `<source>:<chunk>:low|high`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    /// The writing source's instance id.
    pub source: String,
    /// The chunk's number within that source.
    pub chunk: u64,
    /// Low or high.
    pub kind: MarkKind,
    /// The message's LSN.
    pub lsn: Position,
}

impl Mark {
    /// Parses a mark's content; `None` for content that is no mark (another writer's message
    /// under the same prefix is ignored, never an error).
    pub fn parse(content: &[u8], lsn: Position) -> Option<Mark> {
        let text = std::str::from_utf8(content).ok()?;
        let mut parts = text.rsplitn(3, ':');
        let kind = match parts.next()? {
            "low" => MarkKind::Low,
            "high" => MarkKind::High,
            _ => return None,
        };
        let chunk = parts.next()?.parse().ok()?;
        let source = parts.next()?.to_owned();
        Some(Mark { source, chunk, kind, lsn })
    }

    /// The content of a mark.
    pub fn content(source: &str, chunk: u64, kind: MarkKind) -> String {
        let kind = match kind {
            MarkKind::Low => "low",
            MarkKind::High => "high",
        };
        format!("{source}:{chunk}:{kind}")
    }
}

/// A chunk's snapshot, as `pg_current_snapshot()` tells it (`xmin:xmax:xip,...`, 64-bit xids).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct XidSnapshot {
    xmin: u64,
    xmax: u64,
    xip: Vec<u64>,
}

impl XidSnapshot {
    pub(crate) fn parse(text: &str) -> Option<XidSnapshot> {
        let mut parts = text.split(':');
        let xmin = parts.next()?.parse().ok()?;
        let xmax = parts.next()?.parse().ok()?;
        let xip = match parts.next()? {
            "" => Vec::new(),
            list => list.split(',').map(|x| x.parse().ok()).collect::<Option<Vec<u64>>>()?,
        };
        parts.next().is_none().then_some(XidSnapshot { xmin, xmax, xip })
    }

    /// Whether the committed transaction `xid` (the stream's 32-bit xid, of a transaction
    /// within 2^31 of the snapshot, as every live one is) is visible in this snapshot.
    pub(crate) fn visible(&self, xid: u32) -> bool {
        // The epoch is the snapshot's: the xid as a 64-bit xid at most 2^31 around xmax.
        let base = self.xmax & !0xFFFF_FFFF;
        let mut full = base | u64::from(xid);
        if full > self.xmax.saturating_add(1 << 31) {
            full = full.saturating_sub(1 << 32);
        } else if full.saturating_add(1 << 31) < self.xmax {
            full = full.saturating_add(1 << 32);
        }
        full < self.xmin || (full < self.xmax && !self.xip.contains(&full))
    }
}

/// Splits an id into its key values (see the module docs, *Resuming*).
///
/// # Errors
/// A sentence saying why, for [`LiveError::BackfillRefused`](crate::live::LiveError::BackfillRefused).
pub fn decode_id(id: &str, columns: usize) -> Result<Vec<String>, String> {
    let mut values = vec![String::new()];
    let mut chars = id.chars();
    let mut null = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ':')) => values.last_mut().map_or((), |v| v.push(e)),
                Some('N') => null = true,
                other => {
                    return Err(format!(
                        "the id {id:?} has a backslash before {other:?} (ids escape only \\ and :)"
                    ))
                }
            },
            ':' => values.push(String::new()),
            c => values.last_mut().map_or((), |v| v.push(c)),
        }
    }
    if null {
        return Err(format!("the id {id:?} holds a NULL (\\N), which no key value is"));
    }
    if values.len() != columns {
        return Err(format!(
            "the id {id:?} has {} key values but the table's key has {columns} columns",
            values.len()
        ));
    }
    Ok(values)
}

// ----- the table's plan ---------------------------------------------------------------------------

const BYTEA_OID: u32 = 17;

/// One column of a table being read.
#[derive(Clone, Debug)]
struct PlanColumn {
    name: String,
    type_oid: u32,
    /// `format_type(...)`, to cast key literals.
    type_sql: String,
}

/// How to read one table.
#[derive(Clone, Debug)]
pub(crate) struct TablePlan {
    pub(crate) index: IndexName,
    /// `schema.table`, for messages.
    pub(crate) table: String,
    /// `"schema"."table"`.
    quoted: String,
    /// Every column but generated ones, in column order.
    columns: Vec<PlanColumn>,
    /// The key's columns (positions in `columns`) in the key index's order: the pagination.
    order: Vec<usize>,
    /// The key's column names in column order: what ids are built from.
    id_key: Vec<String>,
    /// `pg_class.reltuples` (-1: never analysed).
    pub(crate) estimated_rows: i64,
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A string literal whatever `standard_conforming_strings` says (`E'...'`).
fn quote_literal(text: &str) -> String {
    format!("E'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

impl TablePlan {
    /// Finds the published table of `index` and how to read it.
    pub(crate) fn resolve(
        client: &mut Client,
        publication: &str,
        index: &IndexName,
    ) -> Result<Result<TablePlan, String>, postgres::Error> {
        let tables = client.query(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1::text",
            &[&publication],
        )?;
        let matching: Vec<(String, String)> = tables
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
            .filter(|(s, t)| index_name(s, t) == *index)
            .collect();
        let (schema, table) = match matching.as_slice() {
            [one] => one.clone(),
            [] => return Ok(Err(format!("no table of publication {publication:?} has this index name"))),
            many => {
                let names: Vec<String> = many.iter().map(|(s, t)| format!("{s}.{t}")).collect();
                return Ok(Err(format!("the tables {} share this index name", names.join(", "))));
            }
        };
        let name = format!("{schema}.{table}");
        let row = client.query_one(
            "SELECT c.oid, c.relreplident::text, c.reltuples::int8, \
             (SELECT array_agg(a.attname::text ORDER BY k.ord) FROM pg_index i \
              CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) \
              JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum \
              WHERE i.indrelid = c.oid AND CASE WHEN c.relreplident = 'i' THEN i.indisreplident ELSE i.indisprimary END) \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1::text AND c.relname = $2::text",
            &[&schema, &table],
        )?;
        let oid: u32 = row.get(0);
        let identity: String = row.get(1);
        let estimated_rows: i64 = row.get(2);
        let key: Option<Vec<String>> = row.get(3);
        if identity == "n" {
            return Ok(Err(format!(
                "the table {name} has REPLICA IDENTITY NOTHING: its updates and deletes are not streamed"
            )));
        }
        let Some(key) = key.filter(|k| !k.is_empty()) else {
            return Ok(Err(format!(
                "the table {name} has no primary key (nor replica identity index): its rows have no key to read them in order and to match them with its changes by (add a primary key)"
            )));
        };
        let columns: Vec<PlanColumn> = client
            .query(
                "SELECT attname::text, atttypid, format_type(atttypid, atttypmod) FROM pg_attribute \
                 WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
                &[&oid],
            )?
            .iter()
            .map(|r| PlanColumn { name: r.get(0), type_oid: r.get(1), type_sql: r.get(2) })
            .collect();
        let mut order = Vec::with_capacity(key.len());
        for k in &key {
            match columns.iter().position(|c| c.name == *k) {
                Some(i) => order.push(i),
                None => return Ok(Err(format!("the key column {k:?} of {name} is a generated column"))),
            }
        }
        let mut by_position = order.clone();
        by_position.sort_unstable();
        let id_key = by_position.iter().map(|&i| columns[i].name.clone()).collect();
        Ok(Ok(TablePlan {
            index: index.clone(),
            table: name,
            quoted: format!("{}.{}", quote_ident(&schema), quote_ident(&table)),
            columns,
            order,
            id_key,
            estimated_rows,
        }))
    }

    /// The key values (text, in the key index's order) of the row whose id is `id`.
    pub(crate) fn cursor_of_id(&self, id: &str) -> Result<Vec<String>, String> {
        let values = decode_id(id, self.id_key.len())?;
        let mut by_position = self.order.clone();
        by_position.sort_unstable();
        let mut cursor = vec![String::new(); self.order.len()];
        for (value, position) in values.into_iter().zip(by_position) {
            let value =
                if self.columns[position].type_oid == BYTEA_OID { format!("\\x{value}") } else { value };
            let slot = self.order.iter().position(|&o| o == position).unwrap_or(0);
            cursor[slot] = value;
        }
        Ok(cursor)
    }

    /// The chunk's `SELECT`: rows after `cursor` (key values as text, in the key's order).
    fn select(&self, cursor: Option<&[String]>, rows: usize) -> String {
        let columns: Vec<String> = self.columns.iter().map(|c| quote_ident(&c.name)).collect();
        let key: Vec<String> = self.order.iter().map(|&i| quote_ident(&self.columns[i].name)).collect();
        let key = key.join(", ");
        let filter = match cursor {
            None => String::new(),
            Some(values) => {
                let literals: Vec<String> = values
                    .iter()
                    .zip(&self.order)
                    .map(|(v, &i)| format!("{}::{}", quote_literal(v), self.columns[i].type_sql))
                    .collect();
                format!(" WHERE ({key}) > ({})", literals.join(", "))
            }
        };
        format!("SELECT {} FROM {}{filter} ORDER BY {key} LIMIT {rows}", columns.join(", "), self.quoted)
    }
}

// ----- reading a chunk ------------------------------------------------------------------------------

/// A chunk read from the table, its marks written.
#[derive(Debug)]
pub(crate) struct ReadChunk {
    pub(crate) chunk: u64,
    pub(crate) snapshot: XidSnapshot,
    pub(crate) envelopes: Vec<Envelope>,
    /// The last row's key values (the next chunk's cursor); `None` for an empty chunk.
    pub(crate) last: Option<Vec<String>>,
    /// Rows read (`envelopes.len()`): fewer than asked means the table's end.
    pub(crate) rows: usize,
}

/// A mark's transaction, as SQL.
fn mark_sql(source: &str, chunk: u64, kind: MarkKind) -> String {
    format!(
        "BEGIN; SELECT pg_logical_emit_message(true, {}, {}); COMMIT",
        quote_literal(MARK_PREFIX),
        quote_literal(&Mark::content(source, chunk, kind))
    )
}

/// Writes the low mark, reads the chunk in its snapshot, writes the high mark (see the module
/// docs, *One chunk*): three transactions in one round trip (one simple query). A failure
/// rolls back what it left open, so the connection stays usable. `Ok(Err(..))`: a row the
/// conversion refused (a sentence).
pub(crate) fn read_chunk(
    client: &mut Client,
    plan: &TablePlan,
    source: &str,
    chunk: u64,
    cursor: Option<&[String]>,
    rows: usize,
) -> Result<Result<ReadChunk, String>, postgres::Error> {
    let sql = format!(
        "{}; BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT pg_current_snapshot()::text; {}; COMMIT; {}",
        mark_sql(source, chunk, MarkKind::Low),
        plan.select(cursor, rows),
        mark_sql(source, chunk, MarkKind::High),
    );
    let messages = match client.simple_query(&sql) {
        Ok(m) => m,
        Err(e) => {
            // An error leaves the rest of the query skipped and its transaction aborted.
            if !client.is_closed() {
                let _ = client.batch_execute("ROLLBACK");
            }
            return Err(e);
        }
    };
    // The result sets, by their row descriptions: the low mark's, the snapshot, the rows, the
    // high mark's.
    let mut sets: Vec<Vec<&postgres::SimpleQueryRow>> = Vec::with_capacity(4);
    for m in &messages {
        match m {
            SimpleQueryMessage::RowDescription(_) => sets.push(Vec::new()),
            SimpleQueryMessage::Row(r) => {
                if let Some(set) = sets.last_mut() {
                    set.push(r);
                }
            }
            _ => {}
        }
    }
    let [_, snapshot, rows_out, _] = sets.as_slice() else {
        return Ok(Err(format!("the chunk's query gave {} result sets, not 4", sets.len())));
    };
    let Some(snapshot) = snapshot.first().and_then(|r| r.get(0)).and_then(XidSnapshot::parse) else {
        return Ok(Err("pg_current_snapshot() gave no snapshot this source reads".into()));
    };
    let mut docs: Vec<u8> = Vec::new();
    let mut built: Vec<(String, std::ops::Range<usize>)> = Vec::new();
    let mut last_row = None;
    let mut values = String::new();
    let mut spans: Vec<(usize, usize)> = Vec::with_capacity(plan.columns.len());
    for &row in rows_out {
        values.clear();
        spans.clear();
        for (i, col) in plan.columns.iter().enumerate() {
            let start = values.len();
            match row.get(i) {
                None => values.push_str("null"),
                Some(text) => {
                    if let Err(expected) = push_json_value(col.type_oid, text, &mut values) {
                        return Ok(Err(format!(
                            "column {} of {} holds {text:?}, not {expected}",
                            col.name, plan.table
                        )));
                    }
                }
            }
            spans.push((start, values.len()));
        }
        let columns: Vec<Column<'_>> = plan
            .columns
            .iter()
            .zip(&spans)
            .map(|(c, &(a, b))| Column {
                name: if plain(&c.name) {
                    Cow::Borrowed(c.name.as_str())
                } else {
                    Cow::Owned(c.name.clone())
                },
                value: Cow::Borrowed(&values[a..b]),
            })
            .collect();
        match snapshot_row(&columns, &plan.id_key, &mut docs) {
            Ok(b) => built.push(b),
            Err(e) => return Ok(Err(format!("a row of {}: {e}", plan.table))),
        }
        last_row = Some(row);
    }
    let last =
        last_row.map(|row| plan.order.iter().map(|&i| row.get(i).unwrap_or_default().to_owned()).collect());
    let docs = Bytes::from(docs);
    let envelopes: Vec<Envelope> = built
        .into_iter()
        .map(|(id, range)| Envelope {
            index: plan.index.clone(),
            id,
            op: Op::Upsert,
            position: None,
            document: docs.slice(range),
            built_at_micros: None,
        })
        .collect();
    let rows = envelopes.len();
    Ok(Ok(ReadChunk { chunk, snapshot, envelopes, last, rows }))
}

// ----- reconciliation -----------------------------------------------------------------------------

/// A chunk waiting for its high mark (see the module docs, *One chunk*).
#[derive(Debug)]
pub(crate) struct PendingChunk {
    chunk: u64,
    index: IndexName,
    snapshot: XidSnapshot,
    /// The rows in key order; `None` once dropped.
    rows: Vec<Option<Envelope>>,
    /// Row by id, built when the stream first changes a row of the chunk's table (most chunks
    /// see none).
    by_id: Option<HashMap<String, usize>>,
    low_seen: bool,
    dropped: u64,
}

impl PendingChunk {
    pub(crate) fn new(chunk: u64, index: IndexName, snapshot: XidSnapshot, envelopes: Vec<Envelope>) -> Self {
        PendingChunk {
            chunk,
            index,
            snapshot,
            rows: envelopes.into_iter().map(Some).collect(),
            by_id: None,
            low_seen: false,
            dropped: 0,
        }
    }

    /// The stream handed over `envelopes` of the transaction `xid` (`None`: not known, taken
    /// as not visible): drops the keys they change from the chunk, after the low mark always,
    /// before it when the transaction is not visible in the chunk's snapshot.
    pub(crate) fn observe(&mut self, xid: Option<u32>, envelopes: &[Envelope]) {
        if !self.low_seen && xid.is_some_and(|x| self.snapshot.visible(x)) {
            return;
        }
        for e in envelopes.iter().filter(|e| e.index == self.index) {
            if e.op == Op::Truncate {
                for row in self.rows.iter_mut().filter(|r| r.is_some()) {
                    *row = None;
                    self.dropped += 1;
                }
            } else {
                let rows = &self.rows;
                let by_id = self.by_id.get_or_insert_with(|| {
                    rows.iter().enumerate().filter_map(|(i, r)| Some((r.as_ref()?.id.clone(), i))).collect()
                });
                if let Some(&i) = by_id.get(&e.id) {
                    if self.rows[i].take().is_some() {
                        self.dropped += 1;
                    }
                }
            }
        }
    }

    /// The stream reached the low mark.
    pub(crate) fn low(&mut self) {
        self.low_seen = true;
    }

    /// Rows dropped so far.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The rows left, as one snapshot batch (in key order).
    pub(crate) fn finish(self) -> Batch {
        let envelopes: Arc<[Envelope]> = self.rows.into_iter().flatten().collect();
        Batch::new(None, envelopes)
    }
}

/// One table's backfill progress ([`LiveSource::backfill_progress`](crate::live::LiveSource::backfill_progress)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackfillProgress {
    /// The sink that asked.
    pub sink: SinkName,
    /// The index.
    pub index: IndexName,
    /// Its table, `schema.table`.
    pub table: String,
    /// Rows read from the table so far (those dropped by the reconciliation included).
    pub rows_read: u64,
    /// The table's row estimate when the backfill was asked (`pg_class.reltuples`; `-1` when
    /// the table was never vacuumed or analysed).
    pub estimated_rows: i64,
    /// Every chunk of the table was published.
    pub done: bool,
}

/// One request being served.
#[derive(Debug)]
struct Job {
    sink: SinkName,
    indexes: Vec<IndexName>,
    plans: Vec<TablePlan>,
    /// The table being read (position in `plans`).
    current: usize,
    /// The key values the next chunk starts after.
    cursor: Option<Vec<String>>,
    /// The current table's last chunk was read (it waits for its high mark).
    table_read: bool,
    /// Where the job's tables are in [`Backfiller::progress`].
    progress_at: usize,
}

/// The transactions handed over since the last chunk was read, for the tables being
/// backfilled: (xid, their envelopes of those tables).
type Recent = Vec<(Option<u32>, Vec<Envelope>)>;

/// The backfill state of a live source: the requests queued, the chunk waiting for its high
/// mark, and what comes out.
#[derive(Debug)]
pub(crate) struct Backfiller {
    source_id: String,
    chunk_rows: usize,
    next_chunk: u64,
    jobs: VecDeque<Job>,
    pending: Option<PendingChunk>,
    recent: Recent,
    progress: Vec<BackfillProgress>,
    /// Items ready for the sinks, in order.
    pub(crate) out: VecDeque<(SinkName, LaneItem)>,
    /// Snapshot batches and their rows published, rows dropped by the reconciliation.
    pub(crate) batches: u64,
    pub(crate) rows: u64,
    pub(crate) dropped: u64,
}

/// What the source reads next: the table's plan, where it starts, the chunk's number.
pub(crate) struct NextRead {
    pub(crate) plan: TablePlan,
    pub(crate) cursor: Option<Vec<String>>,
    pub(crate) chunk: u64,
}

impl Backfiller {
    pub(crate) fn new(source_id: String, chunk_rows: usize) -> Self {
        Backfiller {
            source_id,
            chunk_rows: chunk_rows.max(1),
            next_chunk: 1,
            jobs: VecDeque::new(),
            pending: None,
            recent: Vec::new(),
            progress: Vec::new(),
            out: VecDeque::new(),
            batches: 0,
            rows: 0,
            dropped: 0,
        }
    }

    pub(crate) fn source_id(&self) -> &str {
        &self.source_id
    }

    pub(crate) fn chunk_rows(&self) -> usize {
        self.chunk_rows
    }

    pub(crate) fn progress(&self) -> &[BackfillProgress] {
        &self.progress
    }

    /// Queues a request whose tables were resolved; `cursor`: where its first table starts.
    pub(crate) fn push(
        &mut self,
        sink: SinkName,
        indexes: Vec<IndexName>,
        plans: Vec<TablePlan>,
        cursor: Option<Vec<String>>,
    ) {
        if plans.is_empty() {
            self.out.push_back((sink, LaneItem::SnapshotComplete { indexes }));
            return;
        }
        let progress_at = self.progress.len();
        self.progress.extend(plans.iter().map(|p| BackfillProgress {
            sink: sink.clone(),
            index: p.index.clone(),
            table: p.table.clone(),
            rows_read: 0,
            estimated_rows: p.estimated_rows,
            done: false,
        }));
        self.jobs.push_back(Job { sink, indexes, plans, current: 0, cursor, table_read: false, progress_at });
    }

    /// The next chunk to read, when none waits for its high mark.
    pub(crate) fn next_read(&mut self) -> Option<NextRead> {
        if self.pending.is_some() {
            return None;
        }
        let job = self.jobs.front()?;
        if job.table_read {
            return None;
        }
        let chunk = self.next_chunk;
        self.next_chunk += 1;
        Some(NextRead { plan: job.plans[job.current].clone(), cursor: job.cursor.clone(), chunk })
    }

    /// A chunk was read: it waits for its high mark (the transactions handed over since the
    /// last one and not visible in its snapshot already dropped from it).
    pub(crate) fn install(&mut self, read: ReadChunk) {
        let chunk_rows = self.chunk_rows;
        let Some(job) = self.jobs.front_mut() else { return };
        let index = job.plans[job.current].index.clone();
        let progress = &mut self.progress[job.progress_at + job.current];
        progress.rows_read += read.rows as u64;
        if read.rows < chunk_rows {
            job.table_read = true;
        }
        if read.last.is_some() {
            job.cursor = read.last;
        }
        let mut pending = PendingChunk::new(read.chunk, index, read.snapshot, read.envelopes);
        for (xid, envelopes) in &self.recent {
            pending.observe(*xid, envelopes);
        }
        let snapshot = &pending.snapshot;
        self.recent.retain(|(xid, _)| xid.is_none_or(|x| !snapshot.visible(x)));
        if read.rows == 0 {
            self.table_finished();
        } else {
            self.pending = Some(pending);
        }
    }

    /// The stream handed over `batch`, of the transaction `xid`.
    pub(crate) fn observe(&mut self, xid: Option<u32>, batch: &Batch) {
        if self.jobs.is_empty() {
            return;
        }
        let jobs = &self.jobs;
        let wanted = |e: &&Envelope| jobs.iter().any(|j| j.indexes.contains(&e.index));
        let mine: Vec<Envelope> = batch.envelopes.iter().filter(wanted).cloned().collect();
        if mine.is_empty() {
            return;
        }
        if let Some(p) = self.pending.as_mut() {
            p.observe(xid, &mine);
        }
        self.recent.push((xid, mine));
    }

    /// The stream reached a mark: the waiting chunk's low mark opens its window, its high mark
    /// publishes it.
    pub(crate) fn on_mark(&mut self, mark: &Mark) {
        if mark.source != self.source_id {
            return;
        }
        let Some(pending) = self.pending.as_mut() else { return };
        if pending.chunk != mark.chunk {
            return;
        }
        match mark.kind {
            MarkKind::Low => pending.low(),
            MarkKind::High => {
                let Some(pending) = self.pending.take() else { return };
                let Some(job) = self.jobs.front() else { return };
                self.dropped += pending.dropped();
                let batch = pending.finish();
                if !batch.envelopes.is_empty() {
                    self.batches += 1;
                    self.rows += batch.envelopes.len() as u64;
                    self.out.push_back((job.sink.clone(), LaneItem::Batch(batch)));
                }
                if job.table_read {
                    self.table_finished();
                }
            }
        }
    }

    /// The current table is done: on to the job's next, or its `SnapshotComplete`.
    fn table_finished(&mut self) {
        let Some(job) = self.jobs.front_mut() else { return };
        self.progress[job.progress_at + job.current].done = true;
        job.current += 1;
        job.cursor = None;
        job.table_read = false;
        if job.current == job.plans.len() {
            if let Some(job) = self.jobs.pop_front() {
                self.out.push_back((job.sink, LaneItem::SnapshotComplete { indexes: job.indexes }));
            }
            if self.jobs.is_empty() {
                self.recent.clear();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(name: &str) -> IndexName {
        IndexName::new(name).unwrap()
    }

    fn env(ix: &str, id: &str, op: Op) -> Envelope {
        Envelope {
            index: index(ix),
            id: id.into(),
            op,
            position: None,
            document: Bytes::from(format!("{{\"id\":{id}}}")),
            built_at_micros: None,
        }
    }

    fn ids(batch: &Batch) -> Vec<&str> {
        batch.envelopes.iter().map(|e| e.id.as_str()).collect()
    }

    /// xmin 100, xmax 110, 103 and 107 in progress.
    fn snapshot() -> XidSnapshot {
        XidSnapshot::parse("100:110:103,107").unwrap()
    }

    #[test]
    fn snapshots_parse_and_tell_visibility() {
        let s = snapshot();
        assert!(s.visible(99) && s.visible(100) && s.visible(109));
        assert!(!s.visible(103) && !s.visible(107) && !s.visible(110) && !s.visible(4000));
        assert_eq!(XidSnapshot::parse("5:5:"), Some(XidSnapshot { xmin: 5, xmax: 5, xip: vec![] }));
        assert_eq!(XidSnapshot::parse("5:x:"), None);
        assert_eq!(XidSnapshot::parse("5:6"), None);
        // Epoch 1: a 32-bit xid just below the wrap is of epoch 0, visible; one just past xmax is not.
        let s = XidSnapshot::parse("4294967396:4294967396:").unwrap(); // 2^32 + 100
        assert!(s.visible(u32::MAX - 5));
        assert!(s.visible(99));
        assert!(!s.visible(100));
    }

    #[test]
    fn changes_between_the_marks_drop_their_keys_from_the_chunk() {
        let rows = ["1", "2", "3", "4", "5"].map(|id| env("t", id, Op::Upsert)).to_vec();
        let mut c = PendingChunk::new(1, index("t"), snapshot(), rows);
        // Before the low mark: a visible transaction's change is in the rows read: kept.
        c.observe(Some(105), &[env("t", "1", Op::Upsert)]);
        // ...one not visible (in progress at the snapshot) is not: dropped.
        c.observe(Some(103), &[env("t", "2", Op::Delete)]);
        c.observe(Some(120), &[env("t", "3", Op::Upsert)]);
        c.low();
        // Between the marks: any change drops its key, another table's does not.
        c.observe(
            Some(50),
            &[env("t", "4", Op::Delete), env("u", "5", Op::Delete), env("t", "9", Op::Upsert)],
        );
        assert_eq!(c.dropped(), 3);
        assert_eq!(ids(&c.finish()), ["1", "5"]);
    }

    #[test]
    fn a_truncate_empties_the_chunk_and_unknown_xids_count_as_not_visible() {
        let rows = ["1", "2"].map(|id| env("t", id, Op::Upsert)).to_vec();
        let mut c = PendingChunk::new(1, index("t"), snapshot(), rows.clone());
        c.observe(None, &[env("t", "1", Op::Upsert)]);
        assert_eq!(ids(&c.finish()), ["2"]);
        let mut c = PendingChunk::new(1, index("t"), snapshot(), rows);
        c.low();
        c.observe(Some(1), &[env("t", "", Op::Truncate)]);
        let b = c.finish();
        assert!(b.envelopes.is_empty() && b.position.is_none());
    }

    fn plan(name: &str) -> TablePlan {
        TablePlan {
            index: index(name),
            table: format!("public.{name}"),
            quoted: format!("\"public\".\"{name}\""),
            columns: vec![
                PlanColumn { name: "a".into(), type_oid: 25, type_sql: "text".into() },
                PlanColumn { name: "b".into(), type_oid: 23, type_sql: "integer".into() },
                PlanColumn { name: "c".into(), type_oid: 17, type_sql: "bytea".into() },
            ],
            // PRIMARY KEY (b, a): the key index's order, while ids are in column order (a:b).
            order: vec![1, 0],
            id_key: vec!["a".into(), "b".into()],
            estimated_rows: 10,
        }
    }

    fn read(chunk: u64, snapshot: &str, ids: &[&str], last: Option<&str>) -> ReadChunk {
        ReadChunk {
            chunk,
            snapshot: XidSnapshot::parse(snapshot).unwrap(),
            envelopes: ids.iter().map(|id| env("t", id, Op::Upsert)).collect(),
            last: last.map(|l| vec![l.to_owned()]),
            rows: ids.len(),
        }
    }

    fn mark(b: &Backfiller, chunk: u64, kind: MarkKind) -> Mark {
        Mark { source: b.source_id().to_owned(), chunk, kind, lsn: Position(1) }
    }

    /// The whole state machine without a server: history before a chunk was read, marks of
    /// another source ignored, the table's end, SnapshotComplete after the last batch.
    #[test]
    fn the_backfiller_publishes_reconciled_chunks_at_their_high_marks_then_snapshot_complete() {
        let sink = SinkName::new("search").unwrap();
        let mut b = Backfiller::new("src1".into(), 3);
        b.push(sink.clone(), vec![index("t")], vec![plan("t")], None);
        // A transaction handed over before the chunk is read, still finishing at its snapshot.
        b.observe(Some(103), &Batch::new(Some(Position(9)), vec![env("t", "2", Op::Delete)].into()));
        let next = b.next_read().unwrap();
        assert_eq!((next.chunk, next.cursor.is_none()), (1, true));
        b.install(read(1, "100:110:103", &["1", "2", "3"], Some("3")));
        assert!(b.next_read().is_none(), "one chunk at a time");
        b.on_mark(&Mark { source: "other".into(), ..mark(&b, 1, MarkKind::High) });
        assert!(b.out.is_empty(), "another source's mark is ignored");
        b.on_mark(&mark(&b, 1, MarkKind::Low));
        b.observe(Some(111), &Batch::new(Some(Position(10)), vec![env("t", "3", Op::Upsert)].into()));
        b.on_mark(&mark(&b, 1, MarkKind::High));
        let (to, item) = b.out.pop_front().unwrap();
        assert_eq!(to, sink);
        let LaneItem::Batch(batch) = item else { panic!("{item:?}") };
        assert_eq!(ids(&batch), ["1"]);
        assert_eq!((b.rows, b.dropped, b.batches), (1, 2, 1));
        // The second chunk is the table's last (fewer rows than asked).
        let next = b.next_read().unwrap();
        assert_eq!(next.cursor, Some(vec!["3".to_owned()]));
        b.install(read(next.chunk, "120:120:", &["4"], Some("4")));
        assert!(b.next_read().is_none());
        b.on_mark(&mark(&b, next.chunk, MarkKind::Low));
        b.on_mark(&mark(&b, next.chunk, MarkKind::High));
        let (_, item) = b.out.pop_front().unwrap();
        assert!(matches!(item, LaneItem::Batch(ref x) if ids(x) == ["4"]), "{item:?}");
        let (_, item) = b.out.pop_front().unwrap();
        assert_eq!(item, LaneItem::SnapshotComplete { indexes: vec![index("t")] });
        assert!(b.next_read().is_none() && b.out.is_empty());
        assert_eq!(b.progress()[0].rows_read, 4);
        assert!(b.progress()[0].done);
    }

    #[test]
    fn an_empty_request_completes_at_once_and_an_empty_last_chunk_needs_no_mark() {
        let sink = SinkName::new("s").unwrap();
        let mut b = Backfiller::new("x".into(), 2);
        b.push(sink.clone(), vec![], vec![], None);
        assert_eq!(b.out.pop_front(), Some((sink.clone(), LaneItem::SnapshotComplete { indexes: vec![] })));
        b.push(sink, vec![index("t")], vec![plan("t")], None);
        let next = b.next_read().unwrap();
        b.install(read(next.chunk, "1:1:", &[], None));
        assert!(matches!(b.out.pop_front(), Some((_, LaneItem::SnapshotComplete { .. }))));
    }

    #[test]
    fn ids_decode_into_key_values_in_the_key_order() {
        assert_eq!(decode_id("a\\:b\\\\:c", 2).unwrap(), ["a:b\\", "c"]);
        assert_eq!(decode_id("7", 1).unwrap(), ["7"]);
        assert!(decode_id("7:8", 1).unwrap_err().contains("2 key values"));
        assert!(decode_id("\\N", 1).unwrap_err().contains("NULL"));
        assert!(decode_id("a\\x", 1).unwrap_err().contains("backslash"));
        // Column order a:b, key order (b, a); a bytea value gets its \x back.
        let p = plan("t");
        assert_eq!(p.cursor_of_id("x\\:y:42").unwrap(), ["42", "x:y"]);
        let sql = p.select(Some(&["42".to_owned(), "it's".to_owned()]), 5);
        assert_eq!(
            sql,
            "SELECT \"a\", \"b\", \"c\" FROM \"public\".\"t\" WHERE (\"b\", \"a\") > (E'42'::integer, E'it\\'s'::text) ORDER BY \"b\", \"a\" LIMIT 5"
        );
    }

    #[test]
    fn ids_built_by_the_reader_decode_back() {
        // The reader's encoding (wal2json::snapshot_row) and decode_id are inverse.
        let values = ["plain", "with:colon", "back\\slash", "both\\:"];
        for a in values {
            let text = serde_json::to_string(a).unwrap();
            let row = [
                Column { name: Cow::Borrowed("a"), value: Cow::Owned(text) },
                Column { name: Cow::Borrowed("b"), value: Cow::Borrowed("12") },
            ];
            let (id, _) = snapshot_row(&row, &["a".into(), "b".into()], &mut Vec::new()).unwrap();
            assert_eq!(decode_id(&id, 2).unwrap(), [a, "12"], "{id}");
        }
    }

    #[test]
    fn marks_round_trip_and_foreign_content_is_no_mark() {
        let content = Mark::content("ab:c", 7, MarkKind::High);
        let m = Mark::parse(content.as_bytes(), Position(5)).unwrap();
        assert_eq!(m, Mark { source: "ab:c".into(), chunk: 7, kind: MarkKind::High, lsn: Position(5) });
        assert_eq!(Mark::parse(b"x:1:middle", Position(1)), None);
        assert_eq!(Mark::parse(b"x:y:low", Position(1)), None);
        assert_eq!(Mark::parse(&[0xff, b':', b'1', b':', b'l'], Position(1)), None);
    }
}
