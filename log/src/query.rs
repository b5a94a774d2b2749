//! [`Query`] and [`QueryItem`]: which events a read, a subscription or an append condition is
//! about, and the one match rule all three share.

use std::fmt;

use super::error::QueryError;
use super::event::Event;

/// Which events to select: all of them, or those matching at least one of a non-empty list of
/// [`QueryItem`]s.
///
/// One query means the same thing everywhere it is used: in
/// [`read`](super::ReadHandle::read), [`subscribe`](super::ReadHandle::subscribe) and an
/// [`AppendCondition`](super::AppendCondition). A query with no items is not a query: it cannot be
/// built ([`Query::items`] refuses it with [`QueryError::NoItems`]); say [`Query::All`] for every
/// event.
///
/// ```
/// use lanestream_log::{Event, Query, QueryItem};
/// let q = Query::items([
///     QueryItem::new(["CourseDefined", "CourseCapacityChanged"], ["course:3"]),
///     QueryItem::new(["StudentSubscribed"], ["course:3"]),
/// ])?;
/// let e = Event::new("StudentSubscribed", ["course:3", "student:7"], bytes::Bytes::new()).unwrap();
/// assert!(q.matches(&e));
/// assert!(Query::All.matches(&e));
/// assert!(Query::items([]).is_err());
/// # Ok::<(), lanestream_log::QueryError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Query {
    /// Every event.
    All,
    /// The events matching at least one item (items are OR'd).
    Items(QueryItems),
}

impl Query {
    /// A query of `items`, OR'd.
    ///
    /// # Errors
    /// [`QueryError::NoItems`] when `items` is empty (use [`Query::All`] for every event).
    pub fn items(items: impl IntoIterator<Item = QueryItem>) -> Result<Query, QueryError> {
        QueryItems::new(items).map(Query::Items)
    }

    /// A query of one item.
    pub fn item(item: QueryItem) -> Query {
        Query::Items(QueryItems(vec![item].into_boxed_slice()))
    }

    /// The events of any of `types` (and any tags).
    pub fn types<T: Into<String>>(types: impl IntoIterator<Item = T>) -> Query {
        Query::item(QueryItem::new(types, std::iter::empty::<String>()))
    }

    /// The events carrying every one of `tags` (any type).
    pub fn tags<T: Into<String>>(tags: impl IntoIterator<Item = T>) -> Query {
        Query::item(QueryItem::new(std::iter::empty::<String>(), tags))
    }

    /// Whether `event` matches: always for [`Query::All`], else when it matches at least one item
    /// ([`QueryItem::matches`]). Never looks at the payload.
    pub fn matches(&self, event: &Event) -> bool {
        match self {
            Query::All => true,
            Query::Items(items) => items.iter().any(|i| i.matches(event)),
        }
    }

    /// Whether the query matches every event: [`Query::All`], or an item with no types and no
    /// tags.
    pub fn is_all(&self) -> bool {
        match self {
            Query::All => true,
            Query::Items(items) => items.iter().any(QueryItem::is_any),
        }
    }
}

/// The items of a [`Query::Items`]: at least one, in the order given.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct QueryItems(Box<[QueryItem]>);

impl QueryItems {
    /// The items, refusing none.
    ///
    /// # Errors
    /// [`QueryError::NoItems`] when `items` is empty.
    pub fn new(items: impl IntoIterator<Item = QueryItem>) -> Result<QueryItems, QueryError> {
        let items: Box<[QueryItem]> = items.into_iter().collect();
        if items.is_empty() { Err(QueryError::NoItems) } else { Ok(QueryItems(items)) }
    }

    /// The items, in the order given (never empty).
    pub fn as_slice(&self) -> &[QueryItem] {
        &self.0
    }
}

impl std::ops::Deref for QueryItems {
    type Target = [QueryItem];
    fn deref(&self) -> &[QueryItem] {
        &self.0
    }
}

impl fmt::Debug for QueryItems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

/// One item of a query: an event matches it when its type is one of `types` (an empty `types`
/// allows any type) **and** it carries every tag in `tags` (an empty `tags` asks for none).
///
/// Types are OR'd within an item, tags AND'd, and items OR'd within a query. Strings are compared
/// exactly. An item with neither types nor tags matches every event. The lists are kept sorted
/// and without duplicates (the order they were given in does not matter).
///
/// ```
/// use lanestream_log::{Event, QueryItem};
/// let item = QueryItem::new(["A", "B"], ["t1", "t2"]);
/// let ev = |ty: &str, tags: &[&str]| Event::new(ty, tags.iter().copied(), bytes::Bytes::new()).unwrap();
/// assert!(item.matches(&ev("B", &["t2", "t1", "t3"])));
/// assert!(!item.matches(&ev("B", &["t1"])));       // lacks t2
/// assert!(!item.matches(&ev("C", &["t1", "t2"]))); // type not listed
/// assert!(QueryItem::tagged(["t1"]).matches(&ev("C", &["t1"])));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct QueryItem {
    types: Box<[Box<str>]>,
    tags: Box<[Box<str>]>,
}

fn sorted_unique<T: Into<String>>(it: impl IntoIterator<Item = T>) -> Box<[Box<str>]> {
    let mut v: Vec<Box<str>> = it.into_iter().map(|s| s.into().into_boxed_str()).collect();
    v.sort_unstable();
    v.dedup();
    v.into_boxed_slice()
}

impl QueryItem {
    /// An item over `types` (empty: any type) and `tags` (all required).
    pub fn new<T: Into<String>, G: Into<String>>(
        types: impl IntoIterator<Item = T>,
        tags: impl IntoIterator<Item = G>,
    ) -> QueryItem {
        QueryItem { types: sorted_unique(types), tags: sorted_unique(tags) }
    }

    /// An item over `types`, any tags.
    pub fn of_types<T: Into<String>>(types: impl IntoIterator<Item = T>) -> QueryItem {
        QueryItem::new(types, std::iter::empty::<String>())
    }

    /// An item asking for every one of `tags`, any type.
    pub fn tagged<T: Into<String>>(tags: impl IntoIterator<Item = T>) -> QueryItem {
        QueryItem::new(std::iter::empty::<String>(), tags)
    }

    /// The types (sorted, unique; empty: any type).
    pub fn types(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.types.iter().map(|t| &**t)
    }

    /// The required tags (sorted, unique).
    pub fn tags(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.tags.iter().map(|t| &**t)
    }

    pub(crate) fn type_slice(&self) -> &[Box<str>] {
        &self.types
    }

    pub(crate) fn tag_slice(&self) -> &[Box<str>] {
        &self.tags
    }

    /// Whether the item has neither types nor tags, so matches every event.
    pub fn is_any(&self) -> bool {
        self.types.is_empty() && self.tags.is_empty()
    }

    /// Whether `event` matches this item (see the type's docs). Never looks at the payload.
    pub fn matches(&self, event: &Event) -> bool {
        let type_ok =
            self.types.is_empty() || self.types.binary_search_by(|t| (**t).cmp(event.event_type())).is_ok();
        type_ok && contains_all(event.tag_slice(), &self.tags)
    }
}

/// Whether sorted `have` contains every element of sorted `want` (a merge walk).
fn contains_all(have: super::event::TagSlice<'_>, want: &[Box<str>]) -> bool {
    let mut h = have.iter();
    'next: for w in want {
        for x in h.by_ref() {
            match x.cmp(&**w) {
                std::cmp::Ordering::Less => continue,
                std::cmp::Ordering::Equal => continue 'next,
                std::cmp::Ordering::Greater => return false,
            }
        }
        return false;
    }
    true
}
