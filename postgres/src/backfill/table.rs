//! How to read one table: its plan (which table, which key, which columns) and a chunk read
//! between its two marks (see the [parent module](super), *Which table, which key* and *One
//! chunk*).

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use lanestream::{Envelope, IndexName, Op, Relation, RelationColumn};
use postgres::{Client, SimpleQueryMessage, SimpleQueryRow};

use super::snapshot::XidSnapshot;
use crate::batch::value::{plain, push_json_value, BYTEA_OID};
use crate::batch::{decode_id, index_name, snapshot_row, Column};
use crate::mark::{Mark, MarkKind, MARK_PREFIX};

/// One column of a table being read.
#[derive(Clone, Debug)]
pub(crate) struct PlanColumn {
    pub(crate) name: String,
    pub(crate) type_oid: u32,
    /// `format_type(...)`, to cast key literals.
    pub(crate) type_sql: String,
    /// `pg_type.typname` (qualified by its schema outside `pg_catalog` and `public`), as the
    /// live stream names it ([`Relation`]).
    pub(crate) type_name: String,
    /// `atttypmod`.
    pub(crate) type_modifier: i32,
}

/// How to read one table.
#[derive(Clone, Debug)]
pub(crate) struct TablePlan {
    pub(crate) index: IndexName,
    /// `schema.table`, for messages.
    pub(crate) table: String,
    /// `"schema"."table"`.
    pub(crate) quoted: String,
    /// Every column the publication publishes (its column list, or every column but generated
    /// ones), in column order.
    pub(crate) columns: Vec<PlanColumn>,
    /// The publication's row filter of the table (PostgreSQL 15+), as SQL: only rows it admits
    /// are read.
    pub(crate) filter: Option<String>,
    /// The key's columns (positions in `columns`) in the key index's order: the pagination.
    pub(crate) order: Vec<usize>,
    /// The key's column names in column order: what ids are built from.
    pub(crate) id_key: Vec<String>,
    /// `pg_class.reltuples` (-1: never analysed).
    pub(crate) estimated_rows: i64,
    /// The table's shape as the snapshot rows carry it (P6): as the live stream's, but only the
    /// published columns.
    pub(crate) relation: Arc<Relation>,
}

/// The shape snapshot rows carry: the published `columns`, keyed by `id_key` (column order, as
/// the stream's ids).
pub(crate) fn plan_relation(
    oid: u32,
    schema: &str,
    table: &str,
    columns: &[PlanColumn],
    id_key: &[String],
) -> Arc<Relation> {
    Arc::new(Relation {
        id: oid,
        namespace: schema.to_owned(),
        name: table.to_owned(),
        columns: columns
            .iter()
            .map(|c| RelationColumn {
                name: c.name.clone(),
                type_id: c.type_oid,
                type_name: c.type_name.clone(),
                type_modifier: c.type_modifier,
            })
            .collect(),
        key: id_key
            .iter()
            .filter_map(|k| columns.iter().position(|c| c.name == *k).and_then(|i| u16::try_from(i).ok()))
            .collect(),
    })
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
        // PostgreSQL 15 added column lists and row filters (`attnames`, `rowfilter`).
        let version: i32 = client.query_one("SELECT current_setting('server_version_num')::int", &[])?.get(0);
        let tables = client.query(
            if version >= 150000 {
                "SELECT schemaname::text, tablename::text, attnames::text[], rowfilter FROM pg_publication_tables \
                 WHERE pubname = $1::text"
            } else {
                "SELECT schemaname::text, tablename::text, NULL::text[], NULL::text FROM pg_publication_tables \
                 WHERE pubname = $1::text"
            },
            &[&publication],
        )?;
        type Published = ((String, String), Option<Vec<String>>, Option<String>);
        let matching: Vec<Published> = tables
            .iter()
            .map(|r| ((r.get::<_, String>(0), r.get::<_, String>(1)), r.get(2), r.get(3)))
            .filter(|((s, t), _, _)| index_name(s, t) == *index)
            .collect();
        let ((schema, table), published_columns, filter) = match matching.as_slice() {
            [one] => one.clone(),
            [] => return Ok(Err(format!("no table of publication {publication:?} has this index name"))),
            many => {
                let names: Vec<String> = many.iter().map(|((s, t), _, _)| format!("{s}.{t}")).collect();
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
                "SELECT a.attname::text, a.atttypid, format_type(a.atttypid, a.atttypmod), \
                 CASE WHEN tn.nspname IN ('pg_catalog', 'public') THEN t.typname::text \
                 ELSE tn.nspname || '.' || t.typname END, a.atttypmod \
                 FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
                 JOIN pg_namespace tn ON tn.oid = t.typnamespace \
                 WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' \
                 ORDER BY a.attnum",
                &[&oid],
            )?
            .iter()
            .map(|r| PlanColumn {
                name: r.get(0),
                type_oid: r.get(1),
                type_sql: r.get(2),
                type_name: r.get(3),
                type_modifier: r.get(4),
            })
            // P4: a column the publication's column list leaves out never leaves the database.
            .filter(|c: &PlanColumn| published_columns.as_ref().is_none_or(|list| list.contains(&c.name)))
            .collect();
        let mut order = Vec::with_capacity(key.len());
        for k in &key {
            match columns.iter().position(|c| c.name == *k) {
                Some(i) => order.push(i),
                None if published_columns.as_ref().is_some_and(|list| !list.contains(k)) => {
                    return Ok(Err(format!(
                        "the key column {k:?} of {name} is not in the publication's column list: its rows cannot \
                         be keyed (add it to the list: PostgreSQL needs it there to publish updates and deletes)"
                    )))
                }
                None => return Ok(Err(format!("the key column {k:?} of {name} is a generated column"))),
            }
        }
        let mut by_position = order.clone();
        by_position.sort_unstable();
        let id_key: Vec<String> = by_position.iter().map(|&i| columns[i].name.clone()).collect();
        let relation = plan_relation(oid, &schema, &table, &columns, &id_key);
        Ok(Ok(TablePlan {
            index: index.clone(),
            table: name,
            quoted: format!("{}.{}", quote_ident(&schema), quote_ident(&table)),
            columns,
            filter,
            order,
            id_key,
            estimated_rows,
            relation,
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

    /// The `SELECT` of `columns` (those this plan reads) of the row whose id is `id`, in text
    /// format: a partial update's unchanged values, read while this table is backfilled (P5,
    /// [`super::Backfiller::plan_of`]). `None` when a column is not one this plan reads.
    ///
    /// # Errors
    /// `id` does not decode into the key (a sentence, as [`cursor_of_id`](Self::cursor_of_id)).
    pub(crate) fn select_row(&self, id: &str, columns: &[String]) -> Result<Option<String>, String> {
        let values = self.cursor_of_id(id)?;
        if !columns.iter().all(|c| self.columns.iter().any(|p| p.name == *c)) {
            return Ok(None);
        }
        let key: Vec<String> = self.order.iter().map(|&i| quote_ident(&self.columns[i].name)).collect();
        let literals: Vec<String> = values
            .iter()
            .zip(&self.order)
            .map(|(v, &i)| format!("{}::{}", quote_literal(v), self.columns[i].type_sql))
            .collect();
        let wanted: Vec<String> = columns.iter().map(|c| quote_ident(c)).collect();
        Ok(Some(format!(
            "SELECT {} FROM {} WHERE ({}) = ({})",
            wanted.join(", "),
            self.quoted,
            key.join(", "),
            literals.join(", ")
        )))
    }

    /// `document` (a JSON object) with `columns` added, their values the text-format `values`
    /// read by [`select_row`](Self::select_row), typed as the decoder types them. `None` when a
    /// value does not convert.
    pub(crate) fn fill_document(
        &self,
        document: &[u8],
        columns: &[String],
        values: &SimpleQueryRow,
    ) -> Option<Vec<u8>> {
        let mut extra = String::new();
        for (i, name) in columns.iter().enumerate() {
            let col = self.columns.iter().find(|c| c.name == *name)?;
            extra.push(',');
            crate::batch::value::push_json_string(&mut extra, name);
            extra.push(':');
            match values.get(i) {
                None => extra.push_str("null"),
                Some(text) => push_json_value(col.type_oid, text, &mut extra).ok()?,
            }
        }
        let body = document.strip_suffix(b"}")?;
        let mut out = Vec::with_capacity(document.len() + extra.len());
        out.extend_from_slice(body);
        // `{` alone: the first column needs no comma.
        out.extend_from_slice(if body == b"{" { &extra.as_bytes()[1..] } else { extra.as_bytes() });
        out.push(b'}');
        Some(out)
    }

    /// The chunk's `SELECT`: rows after `cursor` (key values as text, in the key's order).
    pub(crate) fn select(&self, cursor: Option<&[String]>, rows: usize) -> String {
        let columns: Vec<String> = self.columns.iter().map(|c| quote_ident(&c.name)).collect();
        let key: Vec<String> = self.order.iter().map(|&i| quote_ident(&self.columns[i].name)).collect();
        let key = key.join(", ");
        let mut conditions: Vec<String> = Vec::with_capacity(2);
        if let Some(filter) = &self.filter {
            // P4: the rows the publication's row filter admits (NULL: not admitted, as pgoutput).
            conditions.push(format!("({filter})"));
        }
        if let Some(values) = cursor {
            let literals: Vec<String> = values
                .iter()
                .zip(&self.order)
                .map(|(v, &i)| format!("{}::{}", quote_literal(v), self.columns[i].type_sql))
                .collect();
            conditions.push(format!("({key}) > ({})", literals.join(", ")));
        }
        let filter = if conditions.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", conditions.join(" AND "))
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
/// docs, *One chunk*): three transactions in one round trip (one simple query), the rows in text
/// format (turned into documents by [`chunk_rows`], off this thread). A failure rolls back what
/// it left open, so the connection stays usable. `Ok(Err(..))`: a sentence (the server's
/// answer is not the four result sets of the query, or has no snapshot this source reads).
pub(crate) fn query_chunk(
    client: &mut Client,
    plan: &TablePlan,
    source: &str,
    chunk: u64,
    cursor: Option<&[String]>,
    rows: usize,
) -> Result<Result<(XidSnapshot, Vec<SimpleQueryRow>), String>, postgres::Error> {
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
    let mut sets: Vec<Vec<SimpleQueryRow>> = Vec::with_capacity(4);
    for m in messages {
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
    if sets.len() != 4 {
        return Ok(Err(format!("the chunk's query gave {} result sets, not 4", sets.len())));
    }
    let read = sets.swap_remove(2);
    let Some(snapshot) = sets[1].first().and_then(|r| r.get(0)).and_then(XidSnapshot::parse) else {
        return Ok(Err("pg_current_snapshot() gave no snapshot this source reads".into()));
    };
    Ok(Ok((snapshot, read)))
}

/// The last row's key values of a chunk (in the key's order: the next chunk's cursor), `None`
/// for no row.
pub(crate) fn chunk_end(plan: &TablePlan, rows: &[SimpleQueryRow]) -> Option<Vec<String>> {
    let row = rows.last()?;
    Some(plan.order.iter().map(|&i| row.get(i).unwrap_or_default().to_owned()).collect())
}

/// The rows of a chunk ([`query_chunk`]) as snapshot envelopes, each value typed by its column's
/// type OID as the decoder types a change's ([`push_json_value`]); `Err`: a row the conversion
/// refused (a sentence).
pub(crate) fn chunk_rows(plan: &TablePlan, rows: &[SimpleQueryRow]) -> Result<Arc<[Envelope]>, String> {
    let width = plan.columns.len();
    // Pass 1: every value as JSON text, one after the other, and where each is.
    let mut values = String::new();
    let mut spans: Vec<(usize, usize)> = Vec::with_capacity(rows.len() * width);
    for row in rows {
        for (i, col) in plan.columns.iter().enumerate() {
            let start = values.len();
            match row.get(i) {
                None => values.push_str("null"),
                Some(text) => push_json_value(col.type_oid, text, &mut values).map_err(|expected| {
                    format!("column {} of {} holds {text:?}, not {expected}", col.name, plan.table)
                })?,
            }
            spans.push((start, values.len()));
        }
    }
    // Pass 2: the documents and ids, by the reader's one row writer.
    let mut docs: Vec<u8> = Vec::with_capacity(
        values.len() + rows.len() * (2 + plan.columns.iter().map(|c| c.name.len() + 4).sum::<usize>()),
    );
    let mut built: Vec<(String, Range<usize>)> = Vec::with_capacity(rows.len());
    let mut columns: Vec<Column<'_>> = Vec::with_capacity(width);
    for row in spans.chunks(width.max(1)) {
        columns.clear();
        columns.extend(plan.columns.iter().zip(row).map(|(c, &(a, b))| Column {
            name: if plain(&c.name) { Cow::Borrowed(c.name.as_str()) } else { Cow::Owned(c.name.clone()) },
            value: &values[a..b],
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
            relation: Some(plan.relation.clone()),
            old_id: None,
            unchanged: Vec::new(),
        })
        .collect();
    Ok(envelopes)
}
