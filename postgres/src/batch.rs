//! Batches from PostgreSQL's changes: the one [`TransactionBuilder`] that the wal2json reader
//! ([`crate::wal2json`]) and the pgoutput decoder ([`crate::pgoutput`]) feed, the one id
//! encoding and document writer that the backfill ([`crate::backfill`]) writes its rows with
//! too, and the one value codec that types pgoutput's and the backfill's text values.
//!
//! | file | what |
//! |---|---|
//! | `batch/builder.rs` | [`TransactionBuilder`]: a begin, changes and a commit in, batches out |
//! | `batch/keys.rs` | which columns key a table's rows: [`CatalogKey`], [`KeyLookup`] |
//! | `batch/row.rs` | a row's columns, its id, its document, [`index_name`] |
//! | `batch/value.rs` | the value codec: text-format values as JSON, JSON strings |
//! | `batch/error.rs` | [`BuildError`], [`BuildErrorKind`] |
//!
//! # Batches
//! Each transaction (a begin, its changes, a commit) becomes one positioned [`Batch`]:
//!
//! - **position**: its commit LSN (parsed with [`Position::from_lsn`] from wal2json's `C` line;
//!   pgoutput's Commit message). Commit LSNs strictly increase in commit order, which is the
//!   order both plugins emit transactions in, so batch positions strictly increase (a regression
//!   is refused with [`BuildErrorKind::LsnRegressed`]).
//! - **changes**: the number of its changes (inserts, updates, deletes, and a truncate per
//!   table).
//! - **envelopes**, one per change, all carrying the batch's position:
//!   - `index`: `schema_table` as an [`IndexName`](lanestream::IndexName). When that is not a
//!     valid name it is normalised: ASCII letters are lower-cased, every other character outside
//!     `[a-z0-9_]` becomes `_`, a leading digit gets a `_` prefix, and the result is cut to
//!     [`MAX_NAME_LEN`](lanestream::MAX_NAME_LEN) bytes (so `"Inventory"."Stock Items"` becomes
//!     `inventory_stock_items`). Distinct tables may collide after normalisation.
//!   - `id`: the row's key values joined with `:` (see [Ids](#ids) for which columns and how
//!     values are written).
//!   - `op`: [`Op::Upsert`](lanestream::Op::Upsert) for inserts and updates,
//!     [`Op::Delete`](lanestream::Op::Delete) for deletes, [`Op::Truncate`](lanestream::Op::Truncate)
//!     for truncates (empty id and document).
//!   - `document`: the row as a JSON object `{"column":value,…}` whose values are the decoder's
//!     JSON text (the wal2json reader copies them byte for byte from the line; the pgoutput
//!     decoder types them by their columns' types). Inserts and updates give the new row; a
//!     delete gives the old key (or the whole old row under `REPLICA IDENTITY FULL`), or empty
//!     bytes if the change has none. An update that leaves a TOASTed value unchanged does not
//!     carry that column: under `REPLICA IDENTITY FULL` the builder takes it from the update's
//!     old row, so the document is the whole new row; under any other identity the document
//!     lacks it and the envelope names it in [`unchanged`](lanestream::Envelope::unchanged) (a
//!     **partial update**: pgoutput's `u` values; the wal2json reader cannot tell, and names
//!     none), so a sink keeps those values from the row it holds (the sink rules:
//!     [`crate::pipeline`], *Applying changes*).
//!   - `relation`: the table's shape ([`lanestream::Relation`]) from the pgoutput decoder's
//!     Relation messages (one `Arc` per message) with `key` the columns the id was built from
//!     (below); `None` from the wal2json reader.
//!
//!   Every document of a transaction is written into one buffer, frozen into a
//!   [`Bytes`](bytes::Bytes) at the commit; each envelope's document is a
//!   [`Bytes::slice`](bytes::Bytes::slice) of it, so a transaction costs one allocation for all
//!   its documents and lanes share them without copying.
//! - An **update that changes the key** (its old row gives a different id than its new one)
//!   yields two envelopes: an [`Op::Upsert`](lanestream::Op::Upsert) of the new id whose
//!   [`old_id`](lanestream::Envelope::old_id) is the old id (a sink moves the old row's unchanged
//!   values), then an [`Op::Delete`](lanestream::Op::Delete) of the old id (document: the old
//!   key, or row). It still counts as
//!   **one** change, so `changes` is always the number of changes while `envelopes.len()` may be
//!   larger.
//! - An **empty transaction** (a begin then a commit, e.g. a DDL-only transaction) gives a
//!   positioned batch with no envelopes; acking it still moves the watermark.
//! - A **huge transaction**, with [`TransactionBuilder::with_max_batch_changes`]`(Some(n))`: every
//!   `n` changes give an **unpositioned** chunk (`position: None`, `changes` its share), whose
//!   envelopes carry the begin's LSN (the commit LSN); the commit gives the positioned batch with
//!   the rest. Only that last batch moves the watermark, so the watermark never passes a
//!   half-delivered transaction, and the builder holds at most `n` changes. Summed over a
//!   transaction's batches, `changes` is its number of changes. Each batch's
//!   [`Batch::offset`] is the number of envelopes of the transaction in the chunks before it, so
//!   a sink that acked some chunks before a restart resumes at the right envelope
//!   ([I4, C1](lanestream::contract#c1)).
//!
//! # Ids
//! **Which columns.** The key columns of a row are, in this order of preference:
//! 1. the columns given for its table with [`TransactionBuilder::set_key_columns`];
//! 2. the columns of its replica identity index (`REPLICA IDENTITY USING INDEX`) as the
//!    [key lookup](TransactionBuilder::with_key_lookup) returns them
//!    ([`CatalogKey::IdentityIndex`]; the live source ([`crate::live`]) reads the catalog);
//! 3. the change's own key: wal2json's `pk` (`include-pk=true`: the primary key *as it was at
//!    that change*, so keys follow the stream across a renamed key column or a redefined key,
//!    whenever the reader reads that change), pgoutput's key columns (its Relation message's,
//!    which also name an index identity);
//! 4. the key lookup's primary key ([`CatalogKey::PrimaryKey`]), for changes without one;
//! 5. every column of the row, in order.
//!
//! The key lookup is asked when a table is first met and again when a change shows its answer
//! stale (a different `pk`, an old row other than the looked-up index, a key column missing
//! from the row). A key column holding NULL fails the transaction ([`BuildErrorKind::NullKey`]:
//! wal2json writes numeric and float `NaN`, `Infinity` and `-Infinity` as `null`, so such rows
//! would share one id); a failed look-up fails it too ([`BuildErrorKind::KeyLookupFailed`]),
//! never keying rows by every column instead.
//!
//! The new row and the old one are keyed by the same columns, so a row keeps one id across
//! insert, update and delete, and a key change gives a delete of the old id after the upsert of
//! the new one.
//!
//! **How values are written.** A string value is its text with `\` written `\\` and `:` written
//! `\:`; SQL NULL is `\N`; any other value (numbers, booleans) is its JSON text. A column's
//! values are all strings or all JSON numbers/booleans (by the column's type; `json` and `jsonb`
//! values are strings holding the JSON text), so two different rows never get one id: NULL
//! (`\N`) and the text `'null'` (`null`) differ, and `\N` cannot come from a string, whose `\`
//! would be doubled.
//!
//! # Errors and recovery
//! Every error is a [`BuildError`] naming the record (the line or message number the decoder
//! gave) and a [`BuildErrorKind`]; the decoders wrap it in their own errors. After an error the
//! [`TransactionBuilder`] stays usable. **A transaction is never published without some of its
//! changes**:
//!
//! - a bad record inside a transaction (one the decoder could not read, or a change the builder
//!   refuses: a key column missing, say) is reported at once, and the transaction is then
//!   **discarded whole** at its commit, which reports [`BuildErrorKind::DamagedTransaction`]
//!   (with [`BuildError::lost_changes`] = its readable changes + its bad records). A caller that
//!   stops at the first error never sees it; a caller that skips bad records adds up
//!   `lost_changes` and reports them as lost. (With chunks, the chunks returned before the bad
//!   record are out already: the error says how many, and their envelopes' position tells a
//!   sink which pending chunks to drop.)
//! - a change or a commit outside a transaction is dropped;
//! - a begin inside an open transaction (its commit was lost) discards the open transaction and
//!   begins the new one ([`BuildErrorKind::BeginInsideTransaction`], its changes lost);
//! - a commit that cannot position its transaction (missing or invalid LSN, LSN not after the
//!   previous commit, xid different from its begin's) discards the transaction.
//!
//! So a caller that wants to skip bad records logs the error, adds up
//! [`lost_changes`](BuildError::lost_changes) and keeps feeding; a caller that wants to stop
//! (the default of the pipeline example) just stops. No input makes the builder panic.
//!
//! [`Position::from_lsn`]: lanestream::Position::from_lsn
//! [`Batch`]: lanestream::Batch
//! [`Batch::offset`]: lanestream::Batch::offset

mod builder;
mod error;
mod keys;
mod row;
pub(crate) mod value;

pub(crate) use builder::Commit;
pub use builder::TransactionBuilder;
pub use error::{BuildError, BuildErrorKind};
pub use keys::{CatalogKey, KeyLookup};
pub use row::{decode_id, index_name};
pub(crate) use row::{snapshot_row, Change, Column, Key};

#[cfg(test)]
mod change_tests;
#[cfg(test)]
pub(crate) mod tests;
