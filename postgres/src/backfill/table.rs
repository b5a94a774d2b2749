//! How to read one table: its plan (which table, which key, which columns) and a chunk read
//! between its two marks (see the [parent module](super), *Which table, which key* and *One
//! chunk*).

use std::borrow::Cow;
use std::io::Read;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use lanestream::{Envelope, IndexName, Op};
use postgres::{Client, SimpleQueryMessage};

use super::{decode_id, Mark, MarkKind, XidSnapshot, MARK_PREFIX};
use crate::pgoutput::{plain, push_json_value};
use crate::wal2json::{index_name, snapshot_row, Column};

const BYTEA_OID: u32 = 17;

/// One column of a table being read.
#[derive(Clone, Debug)]
pub(crate) struct PlanColumn {
    pub(crate) name: String,
    pub(crate) type_oid: u32,
    /// `format_type(...)`, to cast key literals.
    pub(crate) type_sql: String,
}

/// How to read one table.
#[derive(Clone, Debug)]
pub(crate) struct TablePlan {
    pub(crate) index: IndexName,
    /// `schema.table`, for messages.
    pub(crate) table: String,
    /// `"schema"."table"`.
    pub(crate) quoted: String,
    /// Every column but generated ones, in column order.
    pub(crate) columns: Vec<PlanColumn>,
    /// The key's columns (positions in `columns`) in the key index's order: the pagination.
    pub(crate) order: Vec<usize>,
    /// The key's column names in column order: what ids are built from.
    pub(crate) id_key: Vec<String>,
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
    pub(crate) fn select(&self, cursor: Option<&[String]>, rows: usize) -> String {
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
    /// The snapshot it was read in; `None` for a chunk after the table's end, answered without
    /// a query.
    pub(crate) snapshot: Option<XidSnapshot>,
    /// The rows as snapshot envelopes, in key order (built off the ingest thread, published as
    /// they are).
    pub(crate) envelopes: Arc<[Envelope]>,
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
/// docs, *One chunk*), in three round trips: the low mark's transaction, the chunk's
/// transaction begun and its snapshot (one simple query); the rows, as `COPY (<the chunk's
/// SELECT>) TO STDOUT` in text format, into `buf` (one line per row; turned into documents by
/// [`chunk_rows`], off this thread); the chunk's commit and the high mark's transaction (one
/// simple query). A failure rolls back what it left open, so the connection stays usable.
/// `Ok(Err(..))`: a sentence (the server gave no snapshot this source reads).
pub(crate) fn copy_chunk(
    client: &mut Client,
    plan: &TablePlan,
    source: &str,
    chunk: u64,
    cursor: Option<&[String]>,
    rows: usize,
    buf: &mut Vec<u8>,
) -> Result<Result<XidSnapshot, String>, postgres::Error> {
    let read = copy_chunk_once(client, plan, source, chunk, cursor, rows, buf);
    if read.is_err() && !client.is_closed() {
        // An error leaves the chunk's transaction aborted (or the rest of a query skipped).
        let _ = client.batch_execute("ROLLBACK");
    }
    read
}

fn copy_chunk_once(
    client: &mut Client,
    plan: &TablePlan,
    source: &str,
    chunk: u64,
    cursor: Option<&[String]>,
    rows: usize,
    buf: &mut Vec<u8>,
) -> Result<Result<XidSnapshot, String>, postgres::Error> {
    let begin = format!(
        "{}; BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT pg_current_snapshot()::text",
        mark_sql(source, chunk, MarkKind::Low)
    );
    let snapshot = client.simple_query(&begin)?.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => r.get(0).and_then(XidSnapshot::parse),
        _ => None,
    });
    buf.clear();
    let copied =
        client.copy_out(&format!("COPY ({}) TO STDOUT", plan.select(cursor, rows)))?.read_to_end(buf);
    if let Err(e) = copied {
        // The reader's errors are the client's, boxed.
        return match e.into_inner().map(|inner| inner.downcast::<postgres::Error>()) {
            Some(Ok(e)) => Err(*e),
            other => Ok(Err(format!("reading the chunk's rows: {other:?}"))),
        };
    }
    client.batch_execute(&format!("COMMIT; {}", mark_sql(source, chunk, MarkKind::High)))?;
    Ok(snapshot.ok_or_else(|| "pg_current_snapshot() gave no snapshot this source reads".to_owned()))
}

/// Of a chunk's `COPY` text ([`copy_chunk`]): its number of rows and its last row's key values
/// (in the key's order: the next chunk's cursor), `None` for no row. `Err`: a sentence.
pub(crate) fn chunk_end(plan: &TablePlan, text: &[u8]) -> Result<(usize, Option<Vec<String>>), String> {
    let rows = memchr::memchr_iter(b'\n', text).count();
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    if body.is_empty() {
        return Ok((0, None));
    }
    let line = memchr::memrchr(b'\n', body).map_or(body, |at| &body[at + 1..]);
    let line = simdutf8::basic::from_utf8(line)
        .map_err(|_| format!("the rows of {} read are not UTF-8", plan.table))?;
    let width = plan.columns.len();
    let mut key = vec![None; width];
    copy_fields(line, width, &mut String::new(), |i, value| {
        if plan.order.contains(&i) {
            key[i] = value.map(str::to_owned);
        }
        Ok(())
    })?;
    Ok((rows, Some(plan.order.iter().map(|&i| key[i].take().unwrap_or_default()).collect())))
}

/// Undoes the backslash escapes `COPY ... TO STDOUT` writes in text format (`\\`, `\b`,
/// `\f`, `\n`, `\r`, `\t`, `\v`) into `out`; `Err`: another escape (a sentence).
fn unescape_copy(field: &str, out: &mut String) -> Result<(), String> {
    out.clear();
    let mut chars = field.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match chars.next() {
            Some('\\') => '\\',
            Some('b') => '\u{8}',
            Some('f') => '\u{c}',
            Some('n') => '\n',
            Some('r') => '\r',
            Some('t') => '\t',
            Some('v') => '\u{b}',
            other => {
                return Err(format!("the COPY field {field:?} has an escape COPY does not write ({other:?})"))
            }
        });
    }
    Ok(())
}

/// The fields of one line of `COPY ... TO STDOUT` in text format, in column order: `f(column,
/// value)` with `None` for NULL (`\N`), escapes undone (through `scratch`). `Err`: a line
/// with another number of fields than `columns`, or an escape COPY does not write.
fn copy_fields(
    line: &str,
    columns: usize,
    scratch: &mut String,
    mut f: impl FnMut(usize, Option<&str>) -> Result<(), String>,
) -> Result<(), String> {
    let mut n = 0;
    for field in line.split('\t') {
        if n == columns {
            n += 1;
            break;
        }
        if field == "\\N" {
            f(n, None)?;
        } else if field.contains('\\') {
            unescape_copy(field, scratch)?;
            f(n, Some(scratch))?;
        } else {
            f(n, Some(field))?;
        }
        n += 1;
    }
    if n != columns {
        return Err(format!("a COPY line has not the table's {columns} fields: {line:?}"));
    }
    Ok(())
}

/// The rows of a chunk (`COPY` text format, one line each) as snapshot envelopes, each value
/// typed by its column's type OID as the decoder types a change's ([`push_json_value`]);
/// `Err`: a row the conversion refused (a sentence).
pub(crate) fn chunk_rows(plan: &TablePlan, text: &[u8]) -> Result<Arc<[Envelope]>, String> {
    let text = simdutf8::basic::from_utf8(text)
        .map_err(|_| format!("the rows of {} read are not UTF-8", plan.table))?;
    let width = plan.columns.len();
    // Pass 1: every value as JSON text, one after the other, and where each is.
    let mut values = String::with_capacity(text.len() + text.len() / 4);
    let mut spans: Vec<(usize, usize)> = Vec::new();
    let mut scratch = String::new();
    for line in text.split_terminator('\n') {
        copy_fields(line, width, &mut scratch, |i, value| {
            let col = &plan.columns[i];
            let start = values.len();
            match value {
                None => values.push_str("null"),
                Some(text) => push_json_value(col.type_oid, text, &mut values).map_err(|expected| {
                    format!("column {} of {} holds {text:?}, not {expected}", col.name, plan.table)
                })?,
            }
            spans.push((start, values.len()));
            Ok(())
        })?;
    }
    // Pass 2: the documents and ids, by the reader's one row writer.
    let rows = spans.len() / width.max(1);
    let mut docs: Vec<u8> = Vec::with_capacity(
        values.len() + rows * (2 + plan.columns.iter().map(|c| c.name.len() + 4).sum::<usize>()),
    );
    let mut built: Vec<(String, Range<usize>)> = Vec::with_capacity(rows);
    let mut columns: Vec<Column<'_>> = Vec::with_capacity(width);
    for row in spans.chunks(width.max(1)) {
        columns.clear();
        columns.extend(plan.columns.iter().zip(row).map(|(c, &(a, b))| Column {
            name: if plain(&c.name) { Cow::Borrowed(c.name.as_str()) } else { Cow::Owned(c.name.clone()) },
            value: Cow::Borrowed(&values[a..b]),
        }));
        built.push(
            snapshot_row(&columns, &plan.id_key, &mut docs)
                .map_err(|e| format!("a row of {}: {e}", plan.table))?,
        );
    }
    let docs = Bytes::from(docs);
    let envelopes: Arc<[Envelope]> = built
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
    Ok(envelopes)
}
