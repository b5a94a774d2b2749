//! Which columns key a table's rows: the key columns a caller gives, the catalog's answer
//! ([`KeyLookup`], [`CatalogKey`]), the change's own `pk`, or an index identity learned from the
//! stream (the [module docs](super), *Ids*).

use std::fmt;
use std::sync::Arc;

use ahash::AHashMap as HashMap;
use lanestream::IndexName;

use super::error::BuildErrorKind;
use super::row::{index_name, Column, Key};

/// A table's key as the catalog gives it (see
/// [`TransactionBuilder::with_key_lookup`](super::TransactionBuilder::with_key_lookup)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CatalogKey {
    /// The primary key's columns, in column order (what wal2json's `pk` gives each change).
    PrimaryKey(Vec<String>),
    /// The columns of the index of `REPLICA IDENTITY USING INDEX`, in column order: the
    /// `identity` of updates and deletes, which wal2json's `pk` does not give.
    IdentityIndex(Vec<String>),
}

/// Looks up a table's key (schema, table) in the catalog: `Ok(None)` for a table without a
/// primary key or identity index, `Err` when the look-up failed (which fails the change's
/// transaction with [`BuildErrorKind::KeyLookupFailed`]); see
/// [`TransactionBuilder::with_key_lookup`](super::TransactionBuilder::with_key_lookup).
pub type KeyLookup =
    Box<dyn FnMut(&str, &str) -> Result<Option<CatalogKey>, Box<dyn std::error::Error + Send + Sync>> + Send>;

/// What the builder knows of one table.
struct Table {
    index: IndexName,
    /// Its key columns when they beat the change's `pk`: given by the caller
    /// ([`Tables::set_key_columns`]), the identity index of the key lookup
    /// ([`CatalogKey::IdentityIndex`]), or learned from an identity
    /// ([`BuildErrorKind::UnknownReplicaIdentity`]).
    key: Option<Arc<[String]>>,
    /// The key lookup's primary key ([`CatalogKey::PrimaryKey`]): used only for changes without
    /// a `pk` (wal2json run without `include-pk`).
    primary: Option<Arc<[String]>>,
    /// Whether `key` came from the key lookup (then it is asked again when the shape changes).
    looked_up: bool,
    /// The column names of its last row (a table without any key: to recognise an index
    /// identity; with a key lookup: to see its shape change).
    columns: Vec<String>,
    /// With a key lookup: the `pk` names of its last change (its shape, with `columns`).
    pk: Vec<String>,
}

/// A table's index name, its key when that beats the change's `pk`, and the catalog's primary
/// key.
pub(crate) type TableKeys = (IndexName, Option<Arc<[String]>>, Option<Arc<[String]>>);

/// The table cache is cleared when it grows past this many tables (hostile input).
const MAX_CACHED_NAMES: usize = 4096;

/// The builder's tables: their index names and keys, by `schema\0table`.
#[derive(Default)]
pub(crate) struct Tables {
    tables: HashMap<Vec<u8>, Table>,
    /// Key columns given by the caller.
    keys: HashMap<Vec<u8>, Option<Arc<[String]>>>,
    pub(crate) lookup: Option<KeyLookup>,
    /// The key of the table met last (`schema\0table`), reused to spare an allocation per change.
    name_key: Vec<u8>,
}

impl fmt::Debug for Tables {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tables")
            .field("tables", &self.tables.len())
            .field("key_lookup", &self.lookup.is_some())
            .finish_non_exhaustive()
    }
}

impl Tables {
    /// See [`TransactionBuilder::set_key_columns`](super::TransactionBuilder::set_key_columns).
    pub(crate) fn set_key_columns(&mut self, schema: &str, table: &str, columns: Option<Vec<String>>) {
        let key = table_key(schema, table);
        self.tables.remove(&key);
        match columns {
            Some(c) if !c.is_empty() => {
                self.keys.insert(key, Some(Arc::from(c)));
            }
            _ => {
                self.keys.remove(&key);
            }
        }
    }

    /// The table's index name, its key when that beats the change's `pk` (given, the catalog's
    /// identity index, or learned), and the catalog's primary key; leaves `self.name_key` set to
    /// its key. With a key lookup, asks it the first time the table is met and again when the
    /// change shows the answer stale: its `pk` differs from the last change's, its `identity` is
    /// not the looked-up identity index, or a key column is missing from `row` (the row the id is
    /// built from).
    ///
    /// # Errors
    /// [`BuildErrorKind::KeyLookupFailed`] (nothing is cached: the next change asks again).
    #[inline]
    pub(crate) fn resolve(
        &mut self,
        schema: &str,
        table: &str,
        pk: Option<&[Key<'_>]>,
        row: Option<&[Column<'_>]>,
        identity: Option<&[Column<'_>]>,
        use_lookup: bool,
    ) -> Result<TableKeys, BuildErrorKind> {
        self.name_key.clear();
        self.name_key.extend_from_slice(schema.as_bytes());
        self.name_key.push(0);
        self.name_key.extend_from_slice(table.as_bytes());
        let pk = pk.unwrap_or(&[]);
        // A table met without the look-up (its key from the stream) that now needs it.
        let want_lookup =
            use_lookup && self.lookup.is_some() && !self.keys.contains_key(self.name_key.as_slice());
        if let Some(t) = self.tables.get(self.name_key.as_slice()) {
            let fresh = if t.looked_up { !use_lookup || !stale(t, pk, row, identity) } else { !want_lookup };
            if fresh {
                // The stream's key: the looked-up identity index is not used.
                let key = if use_lookup || !t.looked_up { t.key.clone() } else { None };
                return Ok((t.index.clone(), key, t.primary.clone()));
            }
        }
        if self.tables.len() >= MAX_CACHED_NAMES {
            self.tables.clear();
        }
        let (key, primary, looked_up) = match self.keys.get(self.name_key.as_slice()) {
            Some(k) => (k.clone(), None, false),
            None if !use_lookup => (None, None, false),
            None => match self.lookup.as_mut() {
                None => (None, None, false),
                Some(lookup) => match lookup(schema, table) {
                    Err(error) => {
                        self.tables.remove(self.name_key.as_slice());
                        return Err(BuildErrorKind::KeyLookupFailed {
                            table: format!("{schema}.{table}"),
                            error,
                        });
                    }
                    Ok(Some(CatalogKey::IdentityIndex(c))) if !c.is_empty() => {
                        (Some(Arc::from(c)), None, true)
                    }
                    Ok(Some(CatalogKey::PrimaryKey(c))) if !c.is_empty() => (None, Some(Arc::from(c)), true),
                    Ok(_) => (None, None, true),
                },
            },
        };
        let index = index_name(schema, table);
        let columns =
            row.map(|r| r.iter().map(|c| c.name.clone().into_owned()).collect()).unwrap_or_default();
        let pk = pk.iter().map(|k| k.name.clone().into_owned()).collect();
        self.tables.insert(
            self.name_key.clone(),
            Table {
                index: index.clone(),
                key: key.clone(),
                primary: primary.clone(),
                looked_up,
                columns,
                pk,
            },
        );
        Ok((index, key, primary))
    }

    /// For the table [`resolve`](Self::resolve)d last, with no key known: an `identity` with fewer
    /// columns than its rows means an index identity the builder was not told about. Learns it
    /// and reports it (once).
    pub(crate) fn learn_identity(
        &mut self,
        schema: &str,
        table: &str,
        columns: Option<&[Column<'_>]>,
        identity: Option<&[Column<'_>]>,
    ) -> Result<(), BuildErrorKind> {
        let Some(t) = self.tables.get_mut(self.name_key.as_slice()) else { return Ok(()) };
        if let Some(columns) = columns {
            if t.columns.len() != columns.len() || t.columns.iter().zip(columns).any(|(a, b)| *a != b.name) {
                t.columns = columns.iter().map(|c| c.name.clone().into_owned()).collect();
            }
        }
        let Some(identity) = identity else { return Ok(()) };
        let narrower = !identity.is_empty()
            && identity.len() < t.columns.len()
            && identity.iter().all(|c| t.columns.iter().any(|n| *n == c.name));
        if !narrower {
            return Ok(());
        }
        let names: Vec<String> = identity.iter().map(|c| c.name.clone().into_owned()).collect();
        t.key = Some(Arc::from(names.clone()));
        Err(BuildErrorKind::UnknownReplicaIdentity { table: format!("{schema}.{table}"), columns: names })
    }
}

/// Whether a change shows the key lookup's answer for table `t` stale (see
/// [`Tables::resolve`]).
fn stale(t: &Table, pk: &[Key<'_>], row: Option<&[Column<'_>]>, identity: Option<&[Column<'_>]>) -> bool {
    if t.pk.len() != pk.len() || t.pk.iter().zip(pk).any(|(a, b)| *a != b.name) {
        return true;
    }
    if let (Some(key), Some(identity)) = (&t.key, identity) {
        if key.len() != identity.len() || key.iter().zip(identity).any(|(a, b)| *a != b.name) {
            return true;
        }
    }
    let names: &[String] = match (&t.key, &t.primary) {
        (Some(k), _) => k,
        (None, _) if !pk.is_empty() => return false, // the change's own pk: nothing looked up
        (None, Some(p)) => p,
        (None, None) => return false,
    };
    row.is_some_and(|row| names.iter().any(|n| !row.iter().any(|c| c.name == n.as_str())))
}

fn table_key(schema: &str, table: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(schema.len() + table.len() + 1);
    key.extend_from_slice(schema.as_bytes());
    key.push(0);
    key.extend_from_slice(table.as_bytes());
    key
}
