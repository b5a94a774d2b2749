//! [`Relation`]: the shape of the table (or collection) a change belongs to, and its
//! [`RelationColumn`]s.
//!
//! The core stays source-agnostic: a relation is what a sink needs to apply a change to a typed
//! store — where it goes, its columns and their types, which columns make its id — in terms any
//! source can fill. A database source builds one `Arc<Relation>` per shape it meets (PostgreSQL:
//! one per pgoutput Relation message, so a shape changed by DDL is a new `Arc`) and every
//! [`Envelope`](crate::Envelope) of that shape shares it: typing a change costs a reference
//! count, not an allocation.

/// One column of a [`Relation`]: its name and its type as the source names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RelationColumn {
    /// The column's name, as the source spells it (not normalised).
    pub name: String,
    /// The source's id of the column's type (PostgreSQL: the type's OID, e.g. 23 for `int4`).
    pub type_id: u32,
    /// The source's name of the column's type (PostgreSQL: `pg_type.typname`, e.g. `int4`,
    /// `text`, `numeric`, `timestamptz`, `_int4` for `int4[]`); empty when the source does not
    /// know it.
    pub type_name: String,
    /// The type's modifier (PostgreSQL: `atttypmod`, e.g. the length of a `varchar(n)` plus 4);
    /// -1 for none.
    #[cfg_attr(feature = "serde", serde(default = "no_modifier"))]
    pub type_modifier: i32,
}

#[cfg(feature = "serde")]
fn no_modifier() -> i32 {
    -1
}

/// The shape of the table a change belongs to: its source id, namespace and name, its columns
/// in the table's order, and which columns make the change's [`Envelope::id`](crate::Envelope::id).
///
/// ```
/// use lanestream::{Relation, RelationColumn};
/// let col = |name: &str, type_id, type_name: &str| RelationColumn {
///     name: name.into(), type_id, type_name: type_name.into(), type_modifier: -1,
/// };
/// let users = Relation {
///     id: 16384,
///     namespace: "public".into(),
///     name: "users".into(),
///     columns: vec![col("id", 23, "int4"), col("email", 25, "text")],
///     key: vec![0],
/// };
/// assert_eq!(users.key_columns().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["id"]);
/// assert_eq!(users.column("email").map(|c| c.type_id), Some(25));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Relation {
    /// The source's id of the relation, stable across renames (PostgreSQL: the table's OID). A
    /// sink that sees a known id under a new name has seen a rename.
    pub id: u32,
    /// The namespace (PostgreSQL: the schema), as the source spells it.
    pub namespace: String,
    /// The relation's name, as the source spells it (the envelope's index is this normalised).
    pub name: String,
    /// The columns, in the table's order.
    pub columns: Vec<RelationColumn>,
    /// The key: indexes into [`columns`](Self::columns), in the order the id joins their values.
    /// Empty when the source keys rows by every column.
    pub key: Vec<u16>,
}

impl Relation {
    /// The column named `name`, if there is one.
    pub fn column(&self, name: &str) -> Option<&RelationColumn> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The key columns, in id order (every column when [`key`](Self::key) is empty). An index
    /// out of range is skipped.
    pub fn key_columns(&self) -> impl Iterator<Item = &RelationColumn> + '_ {
        let all = self.key.is_empty().then_some(self.columns.iter()).into_iter().flatten();
        all.chain(self.key.iter().filter_map(|&i| self.columns.get(usize::from(i))))
    }
}
