//! The backfill's low and high marks in the WAL: logical messages (`pg_logical_emit_message`,
//! prefix [`MARK_PREFIX`]) that the backfill ([`crate::backfill`]) writes around each chunk it
//! reads and the pgoutput decoder ([`crate::pgoutput`]) reads back from the stream
//! ([`PgOutputDecoder::take_mark`](crate::pgoutput::PgOutputDecoder::take_mark)). See the
//! backfill's module docs, *One chunk*.

use lanestream::Position;

/// The prefix of the low and high marks in the WAL (`pg_logical_emit_message`).
pub const MARK_PREFIX: &str = "lanestream.backfill";

/// Which mark of a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkKind {
    /// Written before the chunk's `SELECT`.
    Low,
    /// Written after it.
    High,
}

/// A backfill mark read from the stream (content `<source>:<chunk>:low|high`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    /// The writing source's instance id.
    pub source: String,
    /// The chunk's number within that source.
    pub chunk: u64,
    /// Low or high.
    pub kind: MarkKind,
    /// The message's LSN.
    pub lsn: Position,
}

impl Mark {
    /// Parses a mark's content; `None` for content that is no mark (another writer's message
    /// under the same prefix is ignored, never an error).
    pub fn parse(content: &[u8], lsn: Position) -> Option<Mark> {
        let text = std::str::from_utf8(content).ok()?;
        let mut parts = text.rsplitn(3, ':');
        let kind = match parts.next()? {
            "low" => MarkKind::Low,
            "high" => MarkKind::High,
            _ => return None,
        };
        let chunk = parts.next()?.parse().ok()?;
        let source = parts.next()?.to_owned();
        Some(Mark { source, chunk, kind, lsn })
    }

    /// The content of a mark.
    pub fn content(source: &str, chunk: u64, kind: MarkKind) -> String {
        let kind = match kind {
            MarkKind::Low => "low",
            MarkKind::High => "high",
        };
        format!("{source}:{chunk}:{kind}")
    }
}
