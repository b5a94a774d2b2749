//! The wire form of lane items and requests: [rkyv] archives, validated on read (feature `codec`).
//!
//! - [`encode_item`] / [`encode_request`] write a [`LaneItem`] / [`Request`] into an aligned buffer
//!   ([`AlignedVec`]). Envelope documents are written straight from their [`Bytes`]; nothing else is
//!   copied but names and ids.
//! - [`decode_item`] / [`decode_request`] validate the bytes (every offset, length, UTF-8 string and
//!   enum tag with `bytecheck`, then every [`SinkName`] / [`IndexName`] against its rules) and build
//!   the owned value. Corrupt, truncated, misaligned or foreign bytes give a [`CodecError`]; no input
//!   makes them panic or read out of bounds ([I3](crate::contract#i3)).
//! - [`view_item`] / [`view_batch`] validate the same way, then read the archive in place, without
//!   deserializing: a [`BatchView`]'s envelopes hand out `&str` and `&[u8]` borrowed from the buffer.
//!
//! # Format
//! The root is a small frame: a 4-byte magic (`LSI3` for a lane item, `LSR2` for a request; the
//! digit is the format version: `LSI2` added [`Batch::offset`], `LSI3` the envelopes'
//! [`relation`](Envelope::relation), [`old_id`](Envelope::old_id) and
//! [`unchanged`](Envelope::unchanged), and `LSR2` added [`Request::Backfill`]'s `after`, so older
//! bytes are refused rather than misread: a validation error, or [`CodecError::WrongMagic`];
//! items and requests still queued in a Redis stream of an old format are not read, so drain it
//! before upgrading) and the value, in rkyv
//! 0.8's default layout (little-endian, 32-bit
//! relative pointers, aligned). Names travel as strings and are re-validated on read; positions as
//! `u64`; an envelope's document as a byte vector; each distinct [`Relation`] of a batch once, in a
//! table the envelopes point into (decoding gives the envelopes of one relation one shared `Arc`). The buffer must start at an address aligned to
//! [`REQUIRED_ALIGN`] bytes (an [`AlignedVec`] is); copy unaligned input into an [`AlignedVec`]
//! first.
//!
//! Validation checks structure, not integrity: the format carries no checksum, so a flipped bit
//! inside a document, an id or a position decodes into a different but well-formed value. Frame
//! the bytes with a checksum of your own (or rely on the transport's) where corruption matters.
//! A request's bytes decoded as a lane item usually fail the layout check before the magic is
//! read, so expect [`CodecError::Invalid`] rather than [`CodecError::WrongMagic`] for them.
//!
//! ```
//! use bytes::Bytes;
//! use lanestream::codec::{decode_item, encode_item, view_batch};
//! use lanestream::{Batch, Envelope, IndexName, LaneItem, Op, Position};
//!
//! let envelope = Envelope {
//!     index: IndexName::new("public_users").unwrap(),
//!     id: "42".into(),
//!     op: Op::Upsert,
//!     position: Some(Position(7)),
//!     document: Bytes::from_static(br#"{"id":42}"#),
//!     built_at_micros: None,
//!     relation: None,
//!     old_id: None,
//!     unchanged: Vec::new(),
//! };
//! let item = LaneItem::Batch(Batch::new(Some(Position(7)), vec![envelope].into()));
//! let bytes = encode_item(&item)?;
//!
//! // Zero-copy: read the archive in place.
//! let view = view_batch(&bytes)?;
//! assert_eq!(view.position(), Some(Position(7)));
//! let e = view.envelopes().next().unwrap();
//! assert_eq!((e.index(), e.id(), e.op()), ("public_users", "42", Op::Upsert));
//! assert_eq!(e.document(), br#"{"id":42}"#);
//!
//! // Or build the owned value back.
//! assert_eq!(decode_item(&bytes)?, item);
//!
//! // Hostile bytes are an error, never a panic.
//! assert!(decode_item(&bytes[..bytes.len() - 1]).is_err());
//! # Ok::<(), lanestream::codec::CodecError>(())
//! ```

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use rkyv::rancor;
pub use rkyv::util::AlignedVec;

use crate::envelope::{Envelope, Op};
use crate::item::{Batch, LaneItem, Request};
use crate::name::{IndexName, NameError, SinkName};
use crate::position::Position;
use crate::relation::{Relation, RelationColumn};

/// The alignment, in bytes, the start of an encoded buffer must have. [`AlignedVec`] has it.
pub const REQUIRED_ALIGN: usize = 8;

/// Magic of an encoded [`LaneItem`] (`LSI3`, format version 3: version 1 had no
/// [`Batch::offset`], version 2 no relations, old ids or unchanged columns).
const ITEM_MAGIC: u32 = u32::from_le_bytes(*b"LSI3");
/// Magic of an encoded [`Request`] (`LSR2`, format version 2: version 1 had no
/// `Request::Backfill::after`).
const REQUEST_MAGIC: u32 = u32::from_le_bytes(*b"LSR2");

/// Why bytes could not be encoded, decoded or viewed. Decoding and viewing never change anything;
/// the input is left as it was.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The buffer does not start at an address aligned to [`REQUIRED_ALIGN`]; copy it into an
    /// [`AlignedVec`] and retry.
    #[error("buffer at {address:#x} is not aligned to {required} bytes (copy it into an AlignedVec)")]
    Misaligned {
        /// The buffer's start address.
        address: usize,
        /// The alignment needed.
        required: usize,
    },
    /// The bytes are not a valid archive: truncated, corrupt (an offset or length out of bounds,
    /// invalid UTF-8, an unknown enum tag...), or of another type.
    #[error("invalid archive of {len} bytes: {source}")]
    Invalid {
        /// The buffer's length.
        len: usize,
        /// What the validator found.
        #[source]
        source: rancor::Error,
    },
    /// The archive is valid but is not the kind asked for: a request where a lane item was
    /// expected, another format version, or something else altogether.
    #[error("not a lanestream {expected} archive (magic {found:#010x})")]
    WrongMagic {
        /// What was expected: `"lane item"` or `"request"`.
        expected: &'static str,
        /// The magic found.
        found: u32,
    },
    /// A decoded sink or index name breaks the name rules (`^[a-z_][a-z0-9_]*$`, at most 63
    /// bytes).
    #[error("invalid {field} name in archive: {source}")]
    InvalidName {
        /// Which name: `"sink"` or `"index"`.
        field: &'static str,
        /// Why it was refused.
        #[source]
        source: NameError,
    },
    /// An envelope points at a relation the batch does not have.
    #[error("an archived envelope names relation {index} of a batch with {relations}")]
    BadRelation {
        /// The index the envelope names.
        index: u32,
        /// How many relations the batch has.
        relations: usize,
    },
    /// [`view_batch`] was given a `SnapshotComplete`.
    #[error("archived lane item is a snapshot_complete, not a batch")]
    NotABatch,
    /// Encoding failed (the archive would exceed rkyv's 32-bit relative pointers, about 2 GiB).
    #[error("could not encode: {0}")]
    Encode(#[source] rancor::Error),
}

// ----- wire mirrors --------------------------------------------------------------------------------
//
// The public types derive serde only; these mirrors carry the rkyv derives, so the archived layout
// is defined here, in one place, and names are re-validated when read back.

#[derive(rkyv::Archive, rkyv::Serialize)]
struct ItemFrame {
    magic: u32,
    item: WireItem,
}

#[derive(rkyv::Archive, rkyv::Serialize)]
struct RequestFrame {
    magic: u32,
    request: WireRequest,
}

#[derive(rkyv::Archive, rkyv::Serialize)]
enum WireItem {
    Batch(WireBatch),
    SnapshotComplete { indexes: Vec<String> },
}

#[derive(rkyv::Archive, rkyv::Serialize)]
struct WireBatch {
    position: Option<u64>,
    changes: u64,
    offset: u64,
    relations: Vec<WireRelation>,
    envelopes: Vec<WireEnvelope>,
}

#[derive(rkyv::Archive, rkyv::Serialize)]
struct WireRelation {
    id: u32,
    namespace: String,
    name: String,
    columns: Vec<WireColumn>,
    key: Vec<u16>,
}

#[derive(rkyv::Archive, rkyv::Serialize)]
struct WireColumn {
    name: String,
    type_id: u32,
    type_name: String,
    type_modifier: i32,
}

#[derive(rkyv::Archive, rkyv::Serialize)]
struct WireEnvelope {
    index: String,
    id: String,
    op: WireOp,
    position: Option<u64>,
    document: Bytes,
    built_at_micros: Option<u64>,
    /// An index into the batch's `relations`.
    relation: Option<u32>,
    old_id: Option<String>,
    unchanged: Vec<String>,
}

#[derive(rkyv::Archive, rkyv::Serialize)]
#[rkyv(derive(Clone, Copy))]
enum WireOp {
    Upsert,
    Delete,
    Truncate,
    // Appended: the variants before keep their discriminants.
    Resync,
}

#[derive(rkyv::Archive, rkyv::Serialize)]
enum WireRequest {
    Backfill { sink: String, indexes: Vec<String>, after: Option<String> },
}

// Every archived type needs at most `REQUIRED_ALIGN`; a buffer aligned to it places each of them
// where the serializer did.
const _: () = assert!(
    std::mem::align_of::<ArchivedItemFrame>() <= REQUIRED_ALIGN
        && std::mem::align_of::<ArchivedRequestFrame>() <= REQUIRED_ALIGN
        && std::mem::align_of::<ArchivedWireEnvelope>() <= REQUIRED_ALIGN
);

fn wire_names(names: &[IndexName]) -> Vec<String> {
    names.iter().map(|n| n.as_str().to_owned()).collect()
}

fn wire_op(op: Op) -> WireOp {
    match op {
        Op::Upsert => WireOp::Upsert,
        Op::Delete => WireOp::Delete,
        Op::Truncate => WireOp::Truncate,
        Op::Resync => WireOp::Resync,
    }
}

fn wire_envelope(e: &Envelope, relation: Option<u32>) -> WireEnvelope {
    WireEnvelope {
        index: e.index.as_str().to_owned(),
        id: e.id.clone(),
        op: wire_op(e.op),
        position: e.position.map(|p| p.0),
        document: e.document.clone(), // a reference count; the bytes are written from it
        built_at_micros: e.built_at_micros,
        relation,
        old_id: e.old_id.clone(),
        unchanged: e.unchanged.clone(),
    }
}

fn wire_relation(r: &Relation) -> WireRelation {
    WireRelation {
        id: r.id,
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        columns: r
            .columns
            .iter()
            .map(|c| WireColumn {
                name: c.name.clone(),
                type_id: c.type_id,
                type_name: c.type_name.clone(),
                type_modifier: c.type_modifier,
            })
            .collect(),
        key: r.key.clone(),
    }
}

/// A batch's wire form: each distinct relation once (by `Arc`, then by value), the envelopes
/// pointing into that table.
fn wire_batch(b: &Batch) -> WireBatch {
    let mut relations: Vec<(&Arc<Relation>, WireRelation)> = Vec::new();
    let mut last: Option<(&Arc<Relation>, u32)> = None;
    let envelopes = b
        .envelopes
        .iter()
        .map(|e| {
            let at = e.relation.as_ref().map(|r| match last {
                Some((l, i)) if Arc::ptr_eq(l, r) => i,
                _ => {
                    let i = match relations.iter().position(|(k, _)| Arc::ptr_eq(k, r) || k == &r) {
                        Some(i) => i as u32,
                        None => {
                            relations.push((r, wire_relation(r)));
                            (relations.len() - 1) as u32
                        }
                    };
                    last = Some((r, i));
                    i
                }
            });
            wire_envelope(e, at)
        })
        .collect();
    WireBatch {
        position: b.position.map(|p| p.0),
        changes: b.changes,
        offset: b.offset,
        relations: relations.into_iter().map(|(_, w)| w).collect(),
        envelopes,
    }
}

// ----- encoding ----------------------------------------------------------------------------------------

/// Encodes `item` into an aligned buffer (see the [module docs](self) for the format).
///
/// # Errors
/// [`CodecError::Encode`] only if the archive would not fit rkyv's 32-bit relative pointers.
pub fn encode_item(item: &LaneItem) -> Result<AlignedVec, CodecError> {
    let item = match item {
        LaneItem::Batch(b) => WireItem::Batch(wire_batch(b)),
        LaneItem::SnapshotComplete { indexes } => WireItem::SnapshotComplete { indexes: wire_names(indexes) },
    };
    rkyv::to_bytes::<rancor::Error>(&ItemFrame { magic: ITEM_MAGIC, item }).map_err(CodecError::Encode)
}

/// Encodes `request` into an aligned buffer.
///
/// # Errors
/// [`CodecError::Encode`] only if the archive would not fit rkyv's 32-bit relative pointers.
///
/// ```
/// use lanestream::codec::{decode_request, encode_request};
/// use lanestream::{IndexName, Request, SinkName};
/// let r = Request::backfill(SinkName::new("search")?, vec![IndexName::new("users")?]);
/// assert_eq!(decode_request(&encode_request(&r)?)?, r);
/// let resumed = Request::Backfill { sink: SinkName::new("search")?, indexes: vec![], after: Some("7:a".into()) };
/// assert_eq!(decode_request(&encode_request(&resumed)?)?, resumed);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn encode_request(request: &Request) -> Result<AlignedVec, CodecError> {
    let request = match request {
        Request::Backfill { sink, indexes, after } => WireRequest::Backfill {
            sink: sink.as_str().to_owned(),
            indexes: wire_names(indexes),
            after: after.clone(),
        },
    };
    rkyv::to_bytes::<rancor::Error>(&RequestFrame { magic: REQUEST_MAGIC, request })
        .map_err(CodecError::Encode)
}

// ----- validation ------------------------------------------------------------------------------------

fn check_aligned(bytes: &[u8]) -> Result<(), CodecError> {
    let address = bytes.as_ptr() as usize;
    // An empty slice has a dangling address; it is refused as too short, not as misaligned.
    if !bytes.is_empty() && address % REQUIRED_ALIGN != 0 {
        return Err(CodecError::Misaligned { address, required: REQUIRED_ALIGN });
    }
    Ok(())
}

fn index_name(name: &rkyv::string::ArchivedString) -> Result<&str, CodecError> {
    check_name(name.as_str(), "index")
}

/// The name rules (`^[a-z_][a-z0-9_]*$`, at most [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes),
/// checked without allocating; a refused name is handed to `IndexName::new` for the canonical
/// error (the unit tests pin that both agree).
fn name_is_valid(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= crate::name::MAX_NAME_LEN
        && !bytes[0].is_ascii_digit()
        && bytes.iter().all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn check_name<'a>(name: &'a str, field: &'static str) -> Result<&'a str, CodecError> {
    if name_is_valid(name) {
        return Ok(name);
    }
    match IndexName::new(name) {
        Err(source) => Err(CodecError::InvalidName { field, source }),
        Ok(_) => Ok(name),
    }
}

/// Validates the archive's structure, its magic and every name in it.
fn access_item(bytes: &[u8]) -> Result<&ArchivedWireItem, CodecError> {
    check_aligned(bytes)?;
    let frame = rkyv::access::<ArchivedItemFrame, rancor::Error>(bytes)
        .map_err(|source| CodecError::Invalid { len: bytes.len(), source })?;
    let found = frame.magic.to_native();
    if found != ITEM_MAGIC {
        return Err(CodecError::WrongMagic { expected: "lane item", found });
    }
    match &frame.item {
        ArchivedWireItem::Batch(b) => {
            let relations = b.relations.len();
            for e in b.envelopes.iter() {
                index_name(&e.index)?;
                if let Some(i) = e.relation.as_ref().map(|i| i.to_native()) {
                    if i as usize >= relations {
                        return Err(CodecError::BadRelation { index: i, relations });
                    }
                }
            }
        }
        ArchivedWireItem::SnapshotComplete { indexes } => {
            for n in indexes.iter() {
                index_name(n)?;
            }
        }
    }
    Ok(&frame.item)
}

fn access_request(bytes: &[u8]) -> Result<&ArchivedWireRequest, CodecError> {
    check_aligned(bytes)?;
    let frame = rkyv::access::<ArchivedRequestFrame, rancor::Error>(bytes)
        .map_err(|source| CodecError::Invalid { len: bytes.len(), source })?;
    let found = frame.magic.to_native();
    if found != REQUEST_MAGIC {
        return Err(CodecError::WrongMagic { expected: "request", found });
    }
    Ok(&frame.request)
}

// ----- decoding ----------------------------------------------------------------------------------------

fn owned_index(name: &rkyv::string::ArchivedString) -> Result<IndexName, CodecError> {
    IndexName::new(name.as_str()).map_err(|source| CodecError::InvalidName { field: "index", source })
}

fn owned_indexes(
    names: &rkyv::vec::ArchivedVec<rkyv::string::ArchivedString>,
) -> Result<Vec<IndexName>, CodecError> {
    names.iter().map(owned_index).collect()
}

/// Validates `bytes` and builds the [`LaneItem`] they encode. The envelopes' documents are copied
/// out of `bytes` into one shared buffer per batch.
///
/// # Errors
/// [`CodecError::Misaligned`], [`Invalid`](CodecError::Invalid) (truncated or corrupt),
/// [`WrongMagic`](CodecError::WrongMagic) (not a lane item),
/// [`InvalidName`](CodecError::InvalidName) (an index name breaks the rules).
pub fn decode_item(bytes: &[u8]) -> Result<LaneItem, CodecError> {
    Ok(match access_item(bytes)? {
        ArchivedWireItem::Batch(b) => {
            // One allocation for every document of the batch, sliced per envelope (as the
            // wal2json reader in lanestream-postgres does).
            let total = b.envelopes.iter().map(|e| e.document.len()).sum();
            let mut documents = Vec::with_capacity(total);
            for e in b.envelopes.iter() {
                documents.extend_from_slice(e.document.as_slice());
            }
            let documents = Bytes::from(documents);
            let relations: Vec<Arc<Relation>> = b.relations.iter().map(owned_relation).collect();
            let mut at = 0;
            let envelopes = b
                .envelopes
                .iter()
                .map(|e| {
                    let len = e.document.len();
                    let document = documents.slice(at..at + len);
                    at += len;
                    Ok(Envelope {
                        index: owned_index(&e.index)?,
                        id: e.id.as_str().to_owned(),
                        op: op_of(e.op),
                        position: e.position.as_ref().map(|p| Position(p.to_native())),
                        document,
                        built_at_micros: e.built_at_micros.as_ref().map(|t| t.to_native()),
                        // In range: checked by `access_item`.
                        relation: e
                            .relation
                            .as_ref()
                            .and_then(|i| relations.get(i.to_native() as usize).cloned()),
                        old_id: e.old_id.as_ref().map(|s| s.as_str().to_owned()),
                        unchanged: e.unchanged.iter().map(|s| s.as_str().to_owned()).collect(),
                    })
                })
                .collect::<Result<Arc<[Envelope]>, CodecError>>()?;
            LaneItem::Batch(Batch {
                position: b.position.as_ref().map(|p| Position(p.to_native())),
                changes: b.changes.to_native(),
                offset: b.offset.to_native(),
                envelopes,
            })
        }
        ArchivedWireItem::SnapshotComplete { indexes } => {
            LaneItem::SnapshotComplete { indexes: owned_indexes(indexes)? }
        }
    })
}

/// Validates `bytes` and builds the [`Request`] they encode.
///
/// # Errors
/// As [`decode_item`]; [`InvalidName`](CodecError::InvalidName) also for the sink name.
pub fn decode_request(bytes: &[u8]) -> Result<Request, CodecError> {
    match access_request(bytes)? {
        ArchivedWireRequest::Backfill { sink, indexes, after } => Ok(Request::Backfill {
            sink: SinkName::new(sink.as_str())
                .map_err(|source| CodecError::InvalidName { field: "sink", source })?,
            indexes: owned_indexes(indexes)?,
            after: after.as_ref().map(|a| a.as_str().to_owned()),
        }),
    }
}

fn owned_relation(r: &ArchivedWireRelation) -> Arc<Relation> {
    Arc::new(Relation {
        id: r.id.to_native(),
        namespace: r.namespace.as_str().to_owned(),
        name: r.name.as_str().to_owned(),
        columns: r
            .columns
            .iter()
            .map(|c| RelationColumn {
                name: c.name.as_str().to_owned(),
                type_id: c.type_id.to_native(),
                type_name: c.type_name.as_str().to_owned(),
                type_modifier: c.type_modifier.to_native(),
            })
            .collect(),
        key: r.key.iter().map(|k| k.to_native()).collect(),
    })
}

fn op_of(op: ArchivedWireOp) -> Op {
    match op {
        ArchivedWireOp::Upsert => Op::Upsert,
        ArchivedWireOp::Delete => Op::Delete,
        ArchivedWireOp::Truncate => Op::Truncate,
        ArchivedWireOp::Resync => Op::Resync,
    }
}

// ----- zero-copy views -----------------------------------------------------------------------------

/// A validated archived lane item, read in place ([`view_item`]).
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum ItemView<'a> {
    /// An archived batch.
    Batch(BatchView<'a>),
    /// An archived `SnapshotComplete`, with its index names.
    SnapshotComplete(NamesView<'a>),
}

/// Validates `bytes` (as [`decode_item`] does, names included) and reads the lane item in place.
///
/// # Errors
/// As [`decode_item`].
pub fn view_item(bytes: &[u8]) -> Result<ItemView<'_>, CodecError> {
    Ok(match access_item(bytes)? {
        ArchivedWireItem::Batch(b) => ItemView::Batch(BatchView { batch: b }),
        ArchivedWireItem::SnapshotComplete { indexes } => {
            ItemView::SnapshotComplete(NamesView { names: indexes })
        }
    })
}

/// Validates `bytes` and reads the batch they encode in place, without deserializing.
///
/// # Errors
/// As [`decode_item`], plus [`CodecError::NotABatch`] for a `SnapshotComplete`.
pub fn view_batch(bytes: &[u8]) -> Result<BatchView<'_>, CodecError> {
    match view_item(bytes)? {
        ItemView::Batch(b) => Ok(b),
        ItemView::SnapshotComplete(_) => Err(CodecError::NotABatch),
    }
}

/// An archived [`Batch`], read in place. Every name in it was validated when the view was made.
#[derive(Clone, Copy)]
pub struct BatchView<'a> {
    batch: &'a ArchivedWireBatch,
}

impl<'a> BatchView<'a> {
    /// The batch's position (`None` for snapshot rows).
    pub fn position(&self) -> Option<Position> {
        self.batch.position.as_ref().map(|p| Position(p.to_native()))
    }

    /// How many changes the source transaction held.
    pub fn changes(&self) -> u64 {
        self.batch.changes.to_native()
    }

    /// Where the batch's envelopes start within their transaction ([`Batch::offset`]).
    pub fn offset(&self) -> u64 {
        self.batch.offset.to_native()
    }

    /// The number of envelopes.
    pub fn len(&self) -> usize {
        self.batch.envelopes.len()
    }

    /// Whether the batch has no envelopes.
    pub fn is_empty(&self) -> bool {
        self.batch.envelopes.is_empty()
    }

    /// Envelope `i`, if there is one.
    pub fn envelope(&self, i: usize) -> Option<EnvelopeView<'a>> {
        self.batch.envelopes.get(i).map(|e| EnvelopeView { envelope: e })
    }

    /// The envelopes, in order.
    pub fn envelopes(&self) -> impl ExactSizeIterator<Item = EnvelopeView<'a>> + 'a {
        self.batch.envelopes.iter().map(|e| EnvelopeView { envelope: e })
    }
}

impl fmt::Debug for BatchView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchView")
            .field("position", &self.position())
            .field("changes", &self.changes())
            .field("offset", &self.offset())
            .field("envelopes", &self.len())
            .finish()
    }
}

/// An archived [`Envelope`], read in place.
#[derive(Clone, Copy)]
pub struct EnvelopeView<'a> {
    envelope: &'a ArchivedWireEnvelope,
}

impl<'a> EnvelopeView<'a> {
    /// The index name (validated when the view was made).
    pub fn index(&self) -> &'a str {
        self.envelope.index.as_str()
    }

    /// The document's id.
    pub fn id(&self) -> &'a str {
        self.envelope.id.as_str()
    }

    /// What the change does.
    pub fn op(&self) -> Op {
        op_of(self.envelope.op)
    }

    /// The change's position.
    pub fn position(&self) -> Option<Position> {
        self.envelope.position.as_ref().map(|p| Position(p.to_native()))
    }

    /// The document bytes, borrowed from the buffer.
    pub fn document(&self) -> &'a [u8] {
        self.envelope.document.as_slice()
    }

    /// When the envelope was built, in microseconds since the Unix epoch, if recorded.
    pub fn built_at_micros(&self) -> Option<u64> {
        self.envelope.built_at_micros.as_ref().map(|t| t.to_native())
    }

    /// The id an upsert moved its row from ([`Envelope::old_id`]).
    pub fn old_id(&self) -> Option<&'a str> {
        self.envelope.old_id.as_ref().map(|s| s.as_str())
    }

    /// The columns a partial update leaves out ([`Envelope::unchanged`]).
    pub fn unchanged(&self) -> impl ExactSizeIterator<Item = &'a str> + 'a {
        self.envelope.unchanged.iter().map(|s| s.as_str())
    }
}

impl fmt::Debug for EnvelopeView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnvelopeView")
            .field("index", &self.index())
            .field("id", &self.id())
            .field("op", &self.op())
            .field("position", &self.position())
            .field("document_len", &self.document().len())
            .finish()
    }
}

/// Archived index names, read in place (validated when the view was made).
#[derive(Clone, Copy)]
pub struct NamesView<'a> {
    names: &'a rkyv::vec::ArchivedVec<rkyv::string::ArchivedString>,
}

impl<'a> NamesView<'a> {
    /// The number of names.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The names, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &'a str> + 'a {
        self.names.iter().map(|n| n.as_str())
    }
}

impl fmt::Debug for NamesView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests;
