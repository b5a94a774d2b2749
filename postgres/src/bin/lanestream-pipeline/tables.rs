//! Live mode's check: every sink's whole output, replayed, against the tables of the
//! publication as they are now (what the publication publishes of them: its column lists and row
//! filters), row for row and value for value. Run only when the run ended at `--end-lsn` (the
//! caller stopped writing before): a run stopped mid-stream cannot be compared with tables that
//! moved on.
//!
//! Independent of the decoder: a table's values are read as PostgreSQL's text (`col::text`), an
//! output's values taken from the document's JSON as it was written (a number's digits, a
//! string unescaped, `true` / `false`), and rows compared as multisets per table (ids are not
//! used). A `bytea`'s text loses its `\x`, as the decoder writes it. The output is replayed by
//! the sink rules of `lanestream_postgres::pipeline` (*Applying changes*): an upsert replaces the
//! row, except a partial update's `unchanged` columns, kept from the row held at its `old_id` (a
//! key change) or its id; deletes remove it, a truncate empties its index.

use serde_json::value::RawValue;

use crate::prelude::*;

/// One row as text values in column order (`None`: SQL NULL).
type Row = Vec<Option<String>>;

/// A sink's output replayed: index → id → column → the value's JSON text.
type Replayed = HashMap<String, HashMap<String, HashMap<String, String>>>;

struct Table {
    index: IndexName,
    name: String,
    columns: Vec<String>,
    rows: Vec<Row>,
}

/// The publication's tables as the sinks should hold them.
fn tables(url: &str, publication: &str) -> Result<Vec<Table>, BoxError> {
    let mut c = postgres::Client::connect(url, postgres::NoTls)?;
    let version: i32 = c.query_one("SELECT current_setting('server_version_num')::int", &[])?.get(0);
    let listed = c.query(
        if version >= 150000 {
            "SELECT schemaname::text, tablename::text, attnames::text[], rowfilter FROM pg_publication_tables \
             WHERE pubname = $1::text ORDER BY 1, 2"
        } else {
            "SELECT schemaname::text, tablename::text, NULL::text[], NULL::text FROM pg_publication_tables \
             WHERE pubname = $1::text ORDER BY 1, 2"
        },
        &[&publication],
    )?;
    let mut out = Vec::with_capacity(listed.len());
    for t in listed {
        let (schema, table): (String, String) = (t.get(0), t.get(1));
        let list: Option<Vec<String>> = t.get(2);
        let filter: Option<String> = t.get(3);
        let quoted = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
        let columns: Vec<(String, u32)> = c
            .query(
                "SELECT a.attname::text, a.atttypid FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
                 JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1::text AND c.relname = $2::text \
                 AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
                &[&schema, &table],
            )?
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, u32>(1)))
            .filter(|(name, _)| list.as_ref().is_none_or(|l| l.contains(name)))
            .collect();
        let select: Vec<String> = columns.iter().map(|(n, _)| format!("{}::text", quoted(n))).collect();
        let sql = format!(
            "SELECT {} FROM {}.{}{}",
            select.join(", "),
            quoted(&schema),
            quoted(&table),
            filter.map(|f| format!(" WHERE ({f})")).unwrap_or_default()
        );
        let rows: Vec<Row> = c
            .query(&sql, &[])?
            .iter()
            .map(|r| {
                columns
                    .iter()
                    .enumerate()
                    .map(|(i, (_, oid))| {
                        let v: Option<String> = r.get(i);
                        // bytea: the decoder writes its hex digits without the `\x`.
                        if *oid == 17 {
                            v.map(|t| t.strip_prefix("\\x").map_or(t.clone(), str::to_owned))
                        } else {
                            v
                        }
                    })
                    .collect()
            })
            .collect();
        out.push(Table {
            index: lanestream_postgres::batch::index_name(&schema, &table),
            name: format!("{schema}.{table}"),
            columns: columns.into_iter().map(|(n, _)| n).collect(),
            rows,
        });
    }
    Ok(out)
}

/// A sink's output replayed: index → id → column → the value's JSON text. Read a line at a
/// time (the output can be larger than memory would like; what it holds is its rows, once).
fn replay(path: &Path) -> Result<Replayed, BoxError> {
    use std::io::BufRead;
    #[derive(serde::Deserialize)]
    struct Line<'a> {
        index: String,
        id: String,
        op: String,
        #[serde(default)]
        old_id: Option<String>,
        #[serde(default)]
        unchanged: Vec<String>,
        #[serde(borrow)]
        document: Option<HashMap<String, &'a RawValue>>,
    }
    let cannot = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
    let mut reader = std::io::BufReader::new(std::fs::File::open(path).map_err(cannot)?);
    let mut indexes = Replayed::new();
    let mut l = String::new();
    for i in 1.. {
        l.clear();
        if reader.read_line(&mut l).map_err(cannot)? == 0 {
            break;
        }
        let line: Line<'_> = serde_json::from_str(l.trim_end_matches('\n'))
            .map_err(|e| format!("{}:{i}: {e}", path.display()))?;
        let rows = indexes.entry(line.index).or_default();
        match line.op.as_str() {
            "upsert" => {
                let mut row = HashMap::new();
                let held = rows.get(line.old_id.as_ref().unwrap_or(&line.id));
                for column in &line.unchanged {
                    // A value the sink does not hold stays missing: the comparison names it.
                    if let Some(value) = held.and_then(|h| h.get(column)) {
                        row.insert(column.clone(), value.clone());
                    }
                }
                for (column, value) in line.document.unwrap_or_default() {
                    row.insert(column, value.get().to_owned());
                }
                rows.insert(line.id, row);
            }
            "delete" => {
                rows.remove(&line.id);
            }
            _ => rows.clear(),
        }
    }
    Ok(indexes)
}

/// A JSON value's text as PostgreSQL's `::text` of it would read (see the module docs).
fn as_text(json: &str) -> Option<String> {
    match json {
        "null" => None,
        s if s.starts_with('"') => serde_json::from_str::<String>(s).ok(),
        other => Some(other.to_owned()),
    }
}

/// Compares every sink's output in `out` with the tables; returns one sentence per sink and
/// table that differs (missing and extra rows, with an example), and the rows compared.
pub(crate) fn compare(
    url: &str,
    publication: &str,
    out: &Path,
    sinks: &[String],
) -> Result<(Vec<String>, u64), BoxError> {
    let tables = tables(url, publication)?;
    let mut failures = Vec::new();
    for sink in sinks {
        let mut held = replay(&out.join(format!("{sink}.ndjson")))?;
        for table in &tables {
            let rows = held.remove(table.index.as_str()).unwrap_or_default();
            let mut got: Vec<Row> = rows
                .values()
                .map(|doc| table.columns.iter().map(|c| doc.get(c).and_then(|v| as_text(v))).collect())
                .collect();
            let mut want = table.rows.clone();
            got.sort();
            want.sort();
            if got != want {
                let (missing, extra) = difference(&want, &got);
                failures.push(format!(
                    "sink {sink}: {} holds {} rows, the table {} {} ({} missing, {} extra or different; e.g. {})",
                    table.index,
                    got.len(),
                    table.name,
                    want.len(),
                    missing.len(),
                    extra.len(),
                    missing.first().or(extra.first()).map_or_else(String::new, |r| format!("{r:?}")),
                ));
            }
        }
    }
    Ok((failures, tables.iter().map(|t| t.rows.len() as u64).sum()))
}

/// The rows of `want` not in `got`, and of `got` not in `want` (both sorted), as multisets.
fn difference(want: &[Row], got: &[Row]) -> (Vec<Row>, Vec<Row>) {
    let (mut i, mut j) = (0, 0);
    let (mut missing, mut extra) = (Vec::new(), Vec::new());
    while i < want.len() || j < got.len() {
        match (want.get(i), got.get(j)) {
            (Some(a), Some(b)) if a == b => (i, j) = (i + 1, j + 1),
            (Some(a), Some(b)) if a < b => {
                missing.push(a.clone());
                i += 1;
            }
            (Some(_), Some(b)) => {
                extra.push(b.clone());
                j += 1;
            }
            (Some(a), None) => {
                missing.push(a.clone());
                i += 1;
            }
            (None, Some(b)) => {
                extra.push(b.clone());
                j += 1;
            }
            (None, None) => break,
        }
    }
    (missing, extra)
}
