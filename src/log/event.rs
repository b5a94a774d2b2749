//! [`Event`]: what an append carries, validated at construction; [`SequencedEvent`]: an event and
//! the position the log gave it.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use super::error::EventError;
use super::position::LogPosition;

/// The longest event type or tag, in bytes (UTF-8).
pub const MAX_NAME_LEN: usize = 1024;

/// The most tags one event may carry.
pub const MAX_TAGS: usize = 256;

/// One event: a type, a set of tags and an opaque payload.
///
/// The type and every tag are non-empty UTF-8 strings of at most [`MAX_NAME_LEN`] bytes, compared
/// byte for byte (no case folding, no trimming, no prefixes). The tags are a set: they are kept
/// sorted (byte order) with no duplicates, and a duplicate passed to [`Event::new`] is refused
/// rather than silently merged. The payload is never looked at by the log (queries match the type
/// and the tags only).
///
/// Cloning an event moves a reference count; the type, tags and payload are shared.
///
/// ```
/// use lanestream::log::Event;
/// let e = Event::new("StudentSubscribed", ["student:7", "course:3"], &b"{}"[..])?;
/// assert_eq!(e.event_type(), "StudentSubscribed");
/// assert_eq!(e.tags().collect::<Vec<_>>(), ["course:3", "student:7"]); // sorted
/// assert!(e.has_tag("student:7"));
/// assert!(Event::new("T", ["a", "a"], bytes::Bytes::new()).is_err()); // duplicate tag
/// # Ok::<(), lanestream::log::EventError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Event {
    inner: Arc<Inner>,
}

#[derive(PartialEq, Eq)]
struct Inner {
    event_type: Box<str>,
    /// Sorted, unique.
    tags: Box<[Box<str>]>,
    data: Bytes,
}

fn check_name(name: &str, what: fn(String) -> EventError) -> Result<(), EventError> {
    if name.is_empty() {
        return Err(what(String::new()));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(EventError::NameTooLong { name: name.chars().take(32).collect(), len: name.len() });
    }
    Ok(())
}

impl Event {
    /// An event of type `event_type` carrying `tags` (in any order) and `data`.
    ///
    /// # Errors
    /// [`EventError::EmptyType`], [`EventError::EmptyTag`], [`EventError::NameTooLong`] (a type or
    /// tag above [`MAX_NAME_LEN`] bytes), [`EventError::TooManyTags`] (above [`MAX_TAGS`]),
    /// [`EventError::DuplicateTag`].
    pub fn new<T, I>(
        event_type: impl Into<String>,
        tags: I,
        data: impl Into<Bytes>,
    ) -> Result<Event, EventError>
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        let event_type = event_type.into();
        check_name(&event_type, |_| EventError::EmptyType)?;
        let mut sorted: Vec<Box<str>> = Vec::new();
        for tag in tags {
            let tag: String = tag.into();
            check_name(&tag, |_| EventError::EmptyTag)?;
            sorted.push(tag.into_boxed_str());
            if sorted.len() > MAX_TAGS {
                return Err(EventError::TooManyTags { max: MAX_TAGS });
            }
        }
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(EventError::DuplicateTag(w[0].to_string()));
        }
        Ok(Event::from_parts(event_type.into_boxed_str(), sorted.into_boxed_slice(), data.into()))
    }

    /// An event with no tags.
    ///
    /// # Errors
    /// As [`Event::new`].
    pub fn untagged(event_type: impl Into<String>, data: impl Into<Bytes>) -> Result<Event, EventError> {
        Event::new(event_type, std::iter::empty::<String>(), data)
    }

    /// Builds an event from parts already validated (sorted unique tags).
    pub(crate) fn from_parts(event_type: Box<str>, tags: Box<[Box<str>]>, data: Bytes) -> Event {
        debug_assert!(tags.windows(2).all(|w| w[0] < w[1]));
        Event { inner: Arc::new(Inner { event_type, tags, data }) }
    }

    /// The event's type.
    pub fn event_type(&self) -> &str {
        &self.inner.event_type
    }

    /// The event's tags, sorted in byte order, each once.
    pub fn tags(&self) -> impl ExactSizeIterator<Item = &str> + DoubleEndedIterator + '_ {
        self.inner.tags.iter().map(|t| &**t)
    }

    /// The tags as stored (sorted, unique).
    pub(crate) fn tag_slice(&self) -> &[Box<str>] {
        &self.inner.tags
    }

    /// Whether the event carries `tag` (exact comparison; O(log tags)).
    pub fn has_tag(&self, tag: &str) -> bool {
        self.inner.tags.binary_search_by(|t| (**t).cmp(tag)).is_ok()
    }

    /// The payload, never interpreted by the log.
    pub fn data(&self) -> &Bytes {
        &self.inner.data
    }

    /// The bytes this event takes in an append's size budget (and, give or take a few bytes of
    /// framing, on disk): type, tags and payload plus their length prefixes — a `u16` before
    /// the type, a `u16` tag count, a `u16` before each tag and a `u32` before the payload, the
    /// layout a segment record stores each event in.
    pub fn encoded_len(&self) -> usize {
        2 + self.event_type().len()
            + 2
            + self.tag_slice().iter().map(|t| 2 + t.len()).sum::<usize>()
            + 4
            + self.data().len()
    }
}

impl fmt::Debug for Event {
    /// Type, tags and the payload's length (not its bytes).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("event_type", &self.event_type())
            .field("tags", &self.inner.tags)
            .field("data_len", &self.inner.data.len())
            .finish()
    }
}

/// An event as read from the log: the event and the position the log gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequencedEvent {
    /// Where the event sits in the log.
    pub position: LogPosition,
    /// The event, exactly as appended.
    pub event: Event,
}
