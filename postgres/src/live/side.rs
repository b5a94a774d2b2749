//! The live source's second connection ([`Side`]: checks, catalog look-ups, heartbeats, the
//! slot's advisory lock), reconnected and its statement retried when it is lost, and the
//! catalog key look-up the decoder's builder asks through it.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use lanestream::Position;
use postgres::{Client, NoTls};

use super::config::LiveConfig;
use super::error::{classify, describe, describe_full, LiveError};
use super::{LiveSource, SIDE_RETRY_BUDGET};
use crate::batch::{CatalogKey, KeyLookup};

/// The second connection, reconnected when lost; it holds the advisory lock that keeps a
/// second lanestream source off the slot, taken again on every reconnect (`lock`; the backfill
/// reader's connection, which only reads chunks, takes none).
pub(super) struct Side {
    pub(super) config: LiveConfig,
    pub(super) client: Option<Client>,
    pub(super) lock: bool,
}

impl Side {
    /// Runs `f` on the connection; when the connection is lost (or the server ends the session,
    /// SQLSTATE class 57P or 08), reconnects and tries again, within `budget`.
    pub(super) fn run<T>(
        &mut self,
        budget: Duration,
        what: impl FnOnce() -> String,
        mut f: impl FnMut(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, LiveError> {
        let deadline = Instant::now() + budget;
        let mut attempts = 0u32;
        let mut backoff = Duration::from_millis(50);
        loop {
            attempts += 1;
            let last = match self.client.as_mut() {
                Some(client) => match f(client) {
                    Ok(v) => return Ok(v),
                    Err(e) if lost(&e) || client.is_closed() => {
                        self.client = None;
                        describe_full(&e)
                    }
                    Err(e) => return Err(classify(e, &self.config.slot)),
                },
                None => match self.reconnect() {
                    Ok(()) => {
                        attempts -= 1; // connecting is not an attempt of the statement
                        continue;
                    }
                    Err(e @ LiveError::SlotBusy { .. }) => return Err(e),
                    Err(e) => e.to_string(),
                },
            };
            if Instant::now() + backoff > deadline {
                return Err(LiveError::Side { what: what(), attempts, budget, last });
            }
            thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    pub(super) fn reconnect(&mut self) -> Result<(), LiveError> {
        let mut client = connect_one(&self.config, "lanestream side")?;
        if self.lock && !try_lock(&mut client, &self.config.slot)? {
            return Err(LiveError::SlotBusy {
                slot: self.config.slot.clone(),
                holder: "another lanestream source (it took the slot while this one reconnected)".into(),
            });
        }
        self.client = Some(client);
        Ok(())
    }
}

/// Names the database: its system identifier (`pg_control_system()`, which a server may keep
/// from a user without `pg_monitor`: then the server's host and port are not part of it) and
/// its name.
pub(super) fn origin_of(client: &mut Client) -> Result<String, LiveError> {
    let database: String = client.query_one("SELECT current_database()::text", &[])?.get(0);
    let system = client
        .query_one("SELECT system_identifier::text FROM pg_control_system()", &[])
        .ok()
        .map(|r| r.get::<_, String>(0));
    Ok(match system {
        Some(system) => format!("PostgreSQL system {system}, database {database:?}"),
        None => format!("PostgreSQL database {database:?}"),
    })
}

/// Takes the session advisory lock of `slot` (one lanestream source per slot), without waiting.
pub(super) fn try_lock(client: &mut Client, slot: &str) -> Result<bool, postgres::Error> {
    Ok(client
        .query_one("SELECT pg_try_advisory_lock(hashtext('lanestream slot ' || $1::text))", &[&slot])?
        .get(0))
}

/// Whether an error means the connection is gone (rather than the statement failed).
fn lost(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => code.code().starts_with("57P") || code.code().starts_with("08"),
        // A client-side error without a server code: I/O on the socket.
        None => e.as_db_error().is_none(),
    }
}

pub(super) fn lsn_of(text: Option<String>) -> Option<Position> {
    text.and_then(|t| Position::from_lsn(&t).ok())
}

pub(super) fn connect_one(config: &LiveConfig, application_name: &str) -> Result<Client, LiveError> {
    let mut pg: postgres::Config =
        config.url.parse().map_err(|e: postgres::Error| LiveError::Connect(e.to_string()))?;
    if pg.get_application_name().is_none() {
        pg.application_name(application_name);
    }
    pg.connect(NoTls).map_err(|e| match classify(e, &config.slot) {
        LiveError::Db(e) => LiveError::Connect(describe(&e)),
        other => other,
    })
}

impl LiveSource {
    pub(super) fn side(&self) -> Result<std::sync::MutexGuard<'_, Side>, LiveError> {
        self.side
            .lock()
            .map_err(|_| LiveError::Internal("the live source's second connection: lock poisoned".into()))
    }

    /// A key lookup for [`TransactionBuilder::with_key_lookup`](crate::batch::TransactionBuilder::with_key_lookup)
    /// that reads a table's replica identity from the catalog (on the second connection):
    /// [`CatalogKey::IdentityIndex`] with the columns of its identity index under
    /// `REPLICA IDENTITY USING INDEX`, else [`CatalogKey::PrimaryKey`] with those of its primary
    /// key, in column order; `None` for a table without either. With pgoutput the builder asks
    /// it only for tables under `REPLICA IDENTITY FULL` (see the module docs).
    ///
    /// # Errors
    /// The look-up fails with [`LiveError::Side`] when the second connection is lost and cannot
    /// be restored within [`SIDE_RETRY_BUDGET`], or with another [`LiveError`] from the server:
    /// never `Ok(None)` for a look-up that did not happen.
    pub fn key_lookup(&self) -> KeyLookup {
        // Weak: the look-up does not keep the second connection (and the slot's advisory lock)
        // alive after the source is dropped.
        let side = Arc::downgrade(&self.side);
        Box::new(move |schema, table| {
            let side = side.upgrade().ok_or("the live source was dropped: its catalog look-up is gone")?;
            let mut side = side.lock().map_err(|_| "the live source's second connection: lock poisoned")?;
            let row = side.run(
                SIDE_RETRY_BUDGET,
                || format!("the catalog key look-up of {schema}.{table}"),
                |client| {
                    client.query_opt(
                        "SELECT array_agg(a.attname::text ORDER BY a.attnum), bool_or(c.relreplident = 'i') \
                         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                         JOIN pg_index i ON i.indrelid = c.oid \
                         JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY (i.indkey) \
                         WHERE n.nspname = $1::text AND c.relname = $2::text \
                         AND CASE WHEN c.relreplident = 'i' THEN i.indisreplident ELSE i.indisprimary END",
                        &[&schema, &table],
                    )
                },
            )?;
            let Some(row) = row else { return Ok(None) };
            let columns = row.get::<_, Option<Vec<String>>>(0).filter(|c| !c.is_empty());
            let index: Option<bool> = row.get(1);
            Ok(columns.map(|c| {
                if index == Some(true) {
                    CatalogKey::IdentityIndex(c)
                } else {
                    CatalogKey::PrimaryKey(c)
                }
            }))
        })
    }
}
