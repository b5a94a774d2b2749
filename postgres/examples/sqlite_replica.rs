//! A SQL replica: SQLite tables kept equal to the PostgreSQL tables of a publication, through the
//! library as a user would write it — the live source, a pipeline, and one [`Sink`] that applies
//! each run of changes by the sink rules (`lanestream_postgres::pipeline`, *Applying changes*).
//!
//! ```text
//! cargo run --release -p lanestream-postgres --example sqlite_replica -- \
//!     <postgres-url> <publication> <slot> <sqlite-file> [<end-lsn>]
//! ```
//!
//! - A new SQLite file is **backfilled** by the pipeline itself (`Joiners::Backfill`, the
//!   default), beside the stream; then every transaction follows, live. The slot is created if
//!   missing (and the publication, for every table, if missing).
//! - Each table `schema.name` is the SQLite table `schema_name` (the change's index name), made at
//!   its first row from the relation: `int2/int4/int8/bool` → INTEGER, `float4/float8` → REAL,
//!   anything else (numeric included, so values stay exact) → TEXT; its primary key the
//!   relation's key. A relation that differs from the table's columns is DDL: a column renamed
//!   (same position, new name), dropped or added is renamed, dropped or added in SQLite too.
//! - Each run of the lane is applied **and** its `SinkState` checkpoint stored in **one SQLite
//!   transaction**: killed at any point (SIGKILL), the replica resumes exactly after what it
//!   committed. Every transaction applied inserts its commit position into `_lanestream_applied`
//!   (the primary key): a transaction applied twice fails loudly.
//!   A large transaction comes in parts of 1,000 changes (`Batch::kind` `Chunk`), each part
//!   committed with the checkpoint that says how far into it the replica got.
//! - With `<end-lsn>` it stops once everything committed before it is applied (a final catch-up);
//!   without, it runs until killed.
//! - A partial update (unchanged TOASTed values) of a row the replica does not hold stops it,
//!   loudly (the pipeline gives up after its retries): it never writes those values as NULL.
//!   (While a table is owed a backfill, the live source hands its partial updates over whole:
//!   `scripts/e2e-sqlite.sh` writes during the backfill.)

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use lanestream_postgres::batch::{decode_id, TransactionBuilder};
use lanestream_postgres::lanestream::{
    Envelope, LaneItem, MemoryStream, Op, Position, Relation, RelationColumn,
};
use lanestream_postgres::live::{LiveConfig, LiveSource};
use lanestream_postgres::pipeline::{BoxError, Pipeline, Sink, SinkState};
use rusqlite::types::Value;
use rusqlite::{params_from_iter, Connection, OptionalExtension};
use serde_json::value::RawValue;

/// The sink: one SQLite connection, always inside a transaction (committed by `commit` only), and
/// the relation each table was last made equal to.
struct Replica {
    db: Connection,
    shapes: HashMap<String, Arc<Relation>>,
}

/// An SQL identifier, quoted.
fn q(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A column's SQLite declaration: its type's affinity (numeric and the rest TEXT: exact values).
fn declare(c: &RelationColumn) -> String {
    let affinity = match c.type_name.as_str() {
        "int2" | "int4" | "int8" | "bool" => "INTEGER",
        "float4" | "float8" => "REAL",
        _ => "TEXT",
    };
    format!("{} {affinity}", q(&c.name))
}

/// A document's JSON value as an SQLite value. Numbers go in as their text: the column's affinity
/// makes them INTEGER or REAL, and a TEXT (numeric) column keeps every digit.
fn value(raw: &RawValue) -> Result<Value, serde_json::Error> {
    Ok(match raw.get() {
        "null" => Value::Null,
        "true" => Value::Integer(1),
        "false" => Value::Integer(0),
        s if s.starts_with('"') => Value::Text(serde_json::from_str(s)?),
        number => Value::Text(number.to_owned()),
    })
}

impl Replica {
    fn open(path: &str) -> Result<Replica, BoxError> {
        let db = Connection::open(path)?;
        db.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;
             CREATE TABLE IF NOT EXISTS _lanestream_state (one INTEGER PRIMARY KEY, state TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS _lanestream_applied (position INTEGER PRIMARY KEY); BEGIN;",
        )?;
        Ok(Replica { db, shapes: HashMap::new() })
    }

    /// Makes the SQLite table have the relation's columns: creates it, or follows DDL (sink rule 3).
    fn shape(&mut self, table: &str, rel: &Arc<Relation>) -> Result<(), BoxError> {
        if self.shapes.get(table) == Some(rel) {
            return Ok(());
        }
        let mut columns = self.db.prepare("SELECT name FROM pragma_table_info(?1)")?;
        let mut have: Vec<String> = columns.query_map([table], |r| r.get(0))?.collect::<Result<_, _>>()?;
        let want: Vec<&str> = rel.columns.iter().map(|c| c.name.as_str()).collect();
        let t = q(table);
        let mut ddl = Vec::new();
        if have.is_empty() {
            let cols: Vec<String> = rel.columns.iter().map(declare).collect();
            let key: Vec<String> = rel.key_columns().map(|c| q(&c.name)).collect();
            ddl.push(format!("CREATE TABLE {t} ({}, PRIMARY KEY ({}))", cols.join(", "), key.join(", ")));
        } else {
            // A renamed column keeps its position: a name gone and a name new at the same place.
            for (i, new) in want.iter().enumerate().take(have.len()) {
                if !want.contains(&have[i].as_str()) && !have.iter().any(|h| h == new) {
                    ddl.push(format!("ALTER TABLE {t} RENAME COLUMN {} TO {}", q(&have[i]), q(new)));
                    have[i] = new.to_string();
                }
            }
            let gone = have.iter().filter(|h| !want.contains(&h.as_str()));
            ddl.extend(gone.map(|c| format!("ALTER TABLE {t} DROP COLUMN {}", q(c))));
            let added = rel.columns.iter().filter(|c| !have.contains(&c.name));
            ddl.extend(added.map(|c| format!("ALTER TABLE {t} ADD COLUMN {}", declare(c))));
        }
        for statement in ddl {
            eprintln!("sqlite_replica: {statement}");
            self.db.execute_batch(&statement)?;
        }
        self.shapes.insert(table.to_owned(), rel.clone());
        Ok(())
    }

    /// Applies one change by the sink rules (rules 1 and 2).
    fn change(&mut self, e: &Envelope) -> Result<(), BoxError> {
        let (table, rel) = (e.index.as_str(), e.relation.as_ref().ok_or("a change without its relation")?);
        self.shape(table, rel)?;
        let keys: Vec<String> = rel.key_columns().map(|c| format!("{} = ?", q(&c.name))).collect();
        let (t, by_key) = (q(table), keys.join(" AND "));
        match e.op {
            Op::Upsert => {
                let doc: BTreeMap<String, &RawValue> = serde_json::from_slice(&e.document)?;
                let mut cols: Vec<String> = doc.keys().map(|c| q(c)).collect();
                let mut vals = doc.values().map(|v| value(v)).collect::<Result<Vec<_>, _>>()?;
                if e.is_partial() {
                    // Unchanged TOASTed values: kept from the row held where the row was.
                    let from = e.old_id.as_deref().unwrap_or(&e.id);
                    let kept: Vec<String> = e.unchanged.iter().map(|c| q(c)).collect();
                    let sql = format!("SELECT {} FROM {t} WHERE {by_key}", kept.join(", "));
                    let held = self.db.query_row(&sql, params_from_iter(decode_id(from, keys.len())?), |r| {
                        (0..kept.len()).map(|i| r.get(i)).collect::<Result<Vec<Value>, _>>()
                    });
                    vals.extend(held.map_err(|err| format!("{table} {from}: no row held ({err})"))?);
                    cols.extend(kept);
                }
                let marks = vec!["?"; cols.len()].join(", ");
                let sql = format!("REPLACE INTO {t} ({}) VALUES ({marks})", cols.join(", "));
                self.db.prepare_cached(&sql)?.execute(params_from_iter(vals))?;
            }
            Op::Delete => {
                let sql = format!("DELETE FROM {t} WHERE {by_key}");
                self.db.prepare_cached(&sql)?.execute(params_from_iter(decode_id(&e.id, keys.len())?))?;
            }
            Op::Truncate => _ = self.db.execute(&format!("DELETE FROM {t}"), [])?,
            op => return Err(format!("{op:?}: not a change this replica knows").into()),
        }
        Ok(())
    }
}

impl Sink for Replica {
    type Error = BoxError;

    fn state(&mut self) -> Result<Option<SinkState>, BoxError> {
        let sql = "SELECT state FROM _lanestream_state";
        let text: Option<String> = self.db.query_row(sql, [], |r| r.get(0)).optional()?;
        Ok(text.as_deref().map(SinkState::parse).transpose()?)
    }

    /// Applies the items inside the open SQLite transaction.
    fn apply(&mut self, items: &[LaneItem]) -> Result<(), BoxError> {
        for item in items {
            let LaneItem::Batch(batch) = item else { continue }; // SnapshotComplete: the state says it
            batch.envelopes.iter().try_for_each(|e| self.change(e))?;
            if let Some(p) = batch.position {
                // A whole transaction (or a large one's last part): recorded once, or refused.
                self.db.execute("INSERT INTO _lanestream_applied VALUES (?1)", [i64::try_from(p.0)?])?;
            }
        }
        Ok(())
    }

    /// Stores the checkpoint with the data applied since the last commit: one SQLite commit.
    fn commit(&mut self, state: &SinkState) -> Result<(), BoxError> {
        self.db.execute("REPLACE INTO _lanestream_state (one, state) VALUES (1, ?1)", [state.to_text()])?;
        Ok(self.db.execute_batch("COMMIT; BEGIN")?)
    }
}

const USAGE: &str = "usage: sqlite_replica <postgres-url> <publication> <slot> <sqlite-file> [<end-lsn>]";

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, publication, slot, file, end @ ..] = &args[..] else {
        return Err(USAGE.into());
    };
    let end = end.first().map(|lsn| Position::from_lsn(lsn)).transpose()?;
    let mut config = LiveConfig::new(url, slot);
    config.publication = publication.clone();
    config.create_slot = true;
    let chunks = TransactionBuilder::new().with_max_batch_changes(Some(1_000)); // a large transaction in parts
    let mut source = LiveSource::connect(config)?.with_builder(chunks).until(end);
    let file = file.clone();
    let pipeline = Pipeline::in_memory(MemoryStream::builder()).sink("sqlite", move || Replica::open(&file));
    pipeline.run(&mut source)?;
    Ok(())
}
