//! The log's files, below the events that read their payloads back from them: how each file is
//! laid out, written and read back, every byte checked. Nothing here imports from outside this
//! folder but the errors (`error.rs`) and the limits on names (`names.rs`). From the ground up:
//!
//! - `format.rs`: the segment file's layout — its header, its records, each event's encoding
//!   and checksum — and the header built, checked and read.
//! - `marker.rs`: the commit marker (`COMMIT`): what the writer has made durable, for followers.
//! - `storage.rs`: the directory — file names, the writer's claim (`LOCK`), the listing that
//!   refuses stray files — and `Storage`, the file operations the segment writer writes with.
//! - `file.rs`: one segment open for positioned reads — an event's frame read and checked — and
//!   the log's frame cache.
//! - `segindex.rs`: a sealed segment's index file: its layout, its write (a temporary file,
//!   fsynced, renamed) and the read that trusts it only where it matches its segment.
//! - `record.rs`: a segment's records read back and checked, and the test that tells a torn
//!   tail from damage.
//!
//! One floor up they are used by recovery (`recovery.rs`), the segment writer
//! (`segment_writer.rs`), the followers (`follow.rs`) and the events themselves (`event.rs`: an
//! event stored on disk reads its payload through `file.rs`).

pub(crate) mod file;
pub(crate) mod format;
pub(crate) mod marker;
pub(crate) mod record;
pub(crate) mod segindex;
pub(crate) mod storage;
