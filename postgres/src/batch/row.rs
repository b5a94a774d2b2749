//! Rows as the builder takes them ([`Column`], [`Key`], [`Change`]) and what it makes of them:
//! ids ([`row_id`]: the [module docs](super), *Ids*), documents ([`write_row`]) and index names
//! ([`index_name`]).

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use lanestream::{IndexName, Relation};

use super::error::BuildErrorKind;
use super::value::{json_str, push_json_string};

/// One change (`I`, `U`, `D`, `T`) as the builder takes it: read from a wal2json line
/// ([`crate::wal2json`]), or handed over by the pgoutput decoder ([`crate::pgoutput`]) from a
/// binary message, so that both go through the one
/// [`TransactionBuilder`](super::TransactionBuilder).
#[derive(Clone, Copy)]
pub(crate) struct Change<'r, 'a> {
    /// `I`, `U`, `D` or `T`.
    pub(crate) action: char,
    /// The schema and table names (unescaped).
    pub(crate) schema: &'r str,
    pub(crate) table: &'r str,
    pub(crate) pk: Option<&'r [Key<'a>]>,
    pub(crate) columns: Option<&'r [Column<'a>]>,
    pub(crate) identity: Option<&'r [Column<'a>]>,
    /// The `pk` is the table's replica identity as the stream knew it at this change (pgoutput's
    /// Relation message), so the catalog is not asked: it tells the key as it is now, which may
    /// be later DDL's. Only columns given with
    /// [`TransactionBuilder::set_key_columns`](super::TransactionBuilder::set_key_columns) beat
    /// it. Never set for a wal2json line (whose `pk` is the primary key only).
    pub(crate) key_from_stream: bool,
    /// The change's own LSN as JSON text (a wal2json line's `lsn`, unescaped only if an error
    /// names it), if it has one: named in a [`BuildErrorKind::NullKey`].
    pub(crate) lsn: Option<&'r str>,
    /// The table's shape, when the decoder knows it (pgoutput's Relation message): every
    /// envelope of the change carries it.
    pub(crate) relation: Option<&'r Arc<Relation>>,
    /// The new row's columns left out as unchanged (pgoutput's `u` values): indexes into
    /// `relation`'s columns.
    pub(crate) unchanged: &'r [usize],
}

/// One column of a row: its name and its value as JSON text (`1`, `"text"`, `null`, `true`).
/// The name is borrowed only when it needs no JSON escaping (a wal2json name written without
/// escapes; a pgoutput or table name without `"`, `\` or control characters): [`write_row`]
/// writes a borrowed name as it is.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Column<'a> {
    pub(crate) name: Cow<'a, str>,
    pub(crate) value: &'a str,
}

/// One column of a key (wal2json's `pk`, pgoutput's key columns).
#[derive(Debug, PartialEq)]
pub(crate) struct Key<'a> {
    pub(crate) name: Cow<'a, str>,
}

/// Appends one id component (see the module docs, *Ids*): a string value unescaped, with `\` and
/// `:` escaped as `\\` and `\:`; SQL NULL as `\N`; any other value as its JSON text.
fn push_id_part(id: &mut String, text: &str) -> Result<(), BuildErrorKind> {
    if text == "null" {
        id.push_str("\\N");
        return Ok(());
    }
    if !text.starts_with('"') {
        id.push_str(text);
        return Ok(());
    }
    let Some(s) = json_str(text) else {
        return Err(BuildErrorKind::WrongType { field: "value", expected: "a valid string" });
    };
    let mut rest = s.as_ref();
    while let Some(i) = memchr::memchr2(b'\\', b':', rest.as_bytes()) {
        // `\` and `:` are ASCII: `i` and `i + 1` are character boundaries.
        id.push_str(&rest[..i]);
        id.push('\\');
        id.push_str(&rest[i..=i]);
        rest = &rest[i + 1..];
    }
    id.push_str(rest);
    Ok(())
}

/// Which columns make a row's id.
#[derive(Clone, Copy)]
pub(crate) enum KeyRef<'k, 'a> {
    /// Columns given to the builder (the table's replica identity, from the catalog).
    Named(&'k [String]),
    /// The change's `pk`.
    Pk(&'k [Key<'a>]),
    /// Every column of the row (no key known).
    All,
}

/// The id of a row: its key values (or all its values without a key), joined with `:`. A key
/// column holding NULL is [`BuildErrorKind::NullKey`] (its table and LSN left empty).
pub(crate) fn row_id(
    row: &[Column<'_>],
    key: KeyRef<'_, '_>,
    side: &'static str,
) -> Result<String, BuildErrorKind> {
    let mut id = String::new();
    let mut push = |i: usize, value: &str| {
        if i > 0 {
            id.push(':');
        }
        push_id_part(&mut id, value)
    };
    let mut by_name = |i: usize, name: &str| {
        let col = row
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| BuildErrorKind::MissingKeyColumn { column: name.to_owned(), side })?;
        if col.value == "null" {
            // Filled in by the caller, which knows the table and the LSN.
            return Err(BuildErrorKind::NullKey {
                table: String::new(),
                column: name.to_owned(),
                lsn: String::new(),
            });
        }
        push(i, col.value)
    };
    match key {
        KeyRef::Named(names) => {
            for (i, name) in names.iter().enumerate() {
                by_name(i, name)?;
            }
        }
        KeyRef::Pk(pk) => {
            for (i, k) in pk.iter().enumerate() {
                by_name(i, &k.name)?;
            }
        }
        KeyRef::All => {
            for (i, col) in row.iter().enumerate() {
                push(i, col.value)?;
            }
        }
    }
    Ok(id)
}

/// A snapshot row's id and document, keyed by `key` (the table's key columns, in the order the
/// live stream builds its ids from them), exactly as the builder writes a change's: the one id
/// encoding and the one document writer, for rows read from the table rather than the stream
/// ([`crate::backfill`]). The document is appended to `docs`; its range is returned.
///
/// # Errors
/// [`BuildErrorKind::MissingKeyColumn`] / [`BuildErrorKind::NullKey`] (its table and LSN left
/// empty) as for a change.
pub(crate) fn snapshot_row(
    row: &[Column<'_>],
    key: &[String],
    docs: &mut Vec<u8>,
) -> Result<(String, Range<usize>), BuildErrorKind> {
    let id = row_id(row, KeyRef::Named(key), "columns")?;
    Ok((id, write_row(docs, row)))
}

/// Splits an id into its key values: the inverse of the id encoding (see the [module
/// docs](super), *Ids*), for a backfill that resumes after a row ([`crate::backfill`],
/// *Resuming*). `\` and `:` are unescaped, a value's other characters kept; an id holding a NULL
/// (`\N`), or with another number of values than `columns`, is refused.
///
/// ```
/// use lanestream_postgres::batch::decode_id;
/// assert_eq!(decode_id(r"a\:b:12", 2)?, ["a:b", "12"]);
/// assert!(decode_id(r"a:\N", 2).is_err());
/// # Ok::<(), String>(())
/// ```
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

/// An update's new row with the columns it left out (TOASTed values it did not change) taken
/// from its `identity` when that holds them (`REPLICA IDENTITY FULL`); `None` when nothing is
/// missing.
pub(crate) fn filled_row<'r, 'a>(
    columns: &'r [Column<'a>],
    identity: &'r [Column<'a>],
) -> Option<Vec<Column<'a>>> {
    let missing = |old: &&Column<'a>| !columns.iter().any(|c| c.name == old.name);
    if !identity.iter().any(|c| missing(&c)) {
        return None;
    }
    // In the identity's (the table's) order, then any new column the identity lacks.
    let mut row: Vec<Column<'a>> = identity
        .iter()
        .map(|old| columns.iter().find(|c| c.name == old.name).unwrap_or(old).clone())
        .collect();
    row.extend(columns.iter().filter(|c| !identity.iter().any(|old| old.name == c.name)).cloned());
    Some(row)
}

/// Writes `{"name":value,…}` into `buf`, returning the range written. Values are the input's
/// bytes; a name is too unless it needs escaping (then it is escaped by [`push_json_string`]).
pub(crate) fn write_row(buf: &mut Vec<u8>, row: &[Column<'_>]) -> Range<usize> {
    let start = buf.len();
    buf.push(b'{');
    for (i, col) in row.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        match &col.name {
            // Borrowed means nothing to escape, so this is the name's JSON text.
            Cow::Borrowed(name) => {
                buf.push(b'"');
                buf.extend_from_slice(name.as_bytes());
                buf.push(b'"');
            }
            Cow::Owned(name) => {
                let mut escaped = String::with_capacity(name.len() + 8);
                push_json_string(&mut escaped, name);
                buf.extend_from_slice(escaped.as_bytes());
            }
        }
        buf.push(b':');
        buf.extend_from_slice(col.value.as_bytes());
    }
    buf.push(b'}');
    start..buf.len()
}

/// `schema_table` as an index name, normalised when needed (see the [module docs](super),
/// *Batches*).
///
/// ```
/// use lanestream_postgres::batch::index_name;
/// assert_eq!(index_name("public", "users").as_str(), "public_users");
/// assert_eq!(index_name("Inventory", "Stock Items").as_str(), "inventory_stock_items");
/// ```
pub fn index_name(schema: &str, table: &str) -> IndexName {
    let joined = format!("{schema}_{table}");
    if let Ok(name) = IndexName::new(joined.as_str()) {
        return name;
    }
    let mut out = String::with_capacity(joined.len() + 1);
    if joined.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    for c in joined.chars() {
        let c = c.to_ascii_lowercase();
        out.push(if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' { c } else { '_' });
    }
    // All ASCII now, so any cut is a char boundary.
    out.truncate(lanestream::MAX_NAME_LEN);
    // `out` is non-empty, starts with [a-z_] and holds only [a-z0-9_]: always valid.
    IndexName::new(out).unwrap_or_else(|_| unreachable_index_name())
}

#[cold]
fn unreachable_index_name() -> IndexName {
    // Never reached (see `index_name`); a fixed valid name rather than a panic.
    IndexName::new("_").unwrap_or_else(|_| unreachable!("\"_\" is a valid index name"))
}
