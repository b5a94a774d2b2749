//! [`LogOptions`]: the sizes of the queue, the group commit, the segments and the batches.

use super::disk::format::{FRAME_LEN, MAX_PAYLOAD, PAYLOAD_FIXED};
use super::error::OpenError;

/// How a log is sized. Every setter takes and returns the options, so they chain:
///
/// ```
/// use lanestream_log::LogOptions;
/// let options = LogOptions::default().queue_capacity(64).segment_bytes(64 << 20);
/// # let _ = options;
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogOptions {
    pub(crate) queue_capacity: usize,
    pub(crate) max_drain_requests: usize,
    pub(crate) max_drain_bytes: usize,
    pub(crate) max_append_bytes: usize,
    pub(crate) segment_bytes: u64,
    pub(crate) subscription_batch: usize,
    pub(crate) cache_bytes: u64,
    pub(crate) follow_interval: std::time::Duration,
}

impl Default for LogOptions {
    /// A queue of 1,024 appends; group commits of up to 1,024 appends or 8 MiB; appends of up to
    /// 16 MiB; 256 MiB segments; subscription batches of up to 1,024 events; a 64 MiB cache; a
    /// follower polling every millisecond.
    fn default() -> Self {
        LogOptions {
            queue_capacity: 1024,
            max_drain_requests: 1024,
            max_drain_bytes: 8 << 20,
            max_append_bytes: 16 << 20,
            segment_bytes: 256 << 20,
            subscription_batch: 1024,
            cache_bytes: 64 << 20,
            follow_interval: std::time::Duration::from_millis(1),
        }
    }
}

impl LogOptions {
    /// How many appends may wait for the writer (at least 1). A full queue makes `append` block
    /// and `append_async` wait: backpressure.
    pub fn queue_capacity(mut self, requests: usize) -> Self {
        self.queue_capacity = requests;
        self
    }

    /// At most how many appends one group commit takes (at least 1).
    pub fn max_drain_requests(mut self, requests: usize) -> Self {
        self.max_drain_requests = requests;
        self
    }

    /// About how many bytes one group commit takes, by
    /// [`Event::encoded_len`](super::Event::encoded_len) (at least 1; a group commit always takes
    /// at least one append, whatever its size).
    pub fn max_drain_bytes(mut self, bytes: usize) -> Self {
        self.max_drain_bytes = bytes;
        self
    }

    /// The largest append, in bytes by [`Event::encoded_len`](super::Event::encoded_len); larger
    /// ones are refused with [`AppendError::TooLarge`](super::AppendError::TooLarge). At least 1
    /// and at most about 4 GiB (one record's length field).
    pub fn max_append_bytes(mut self, bytes: usize) -> Self {
        self.max_append_bytes = bytes;
        self
    }

    /// The size, in bytes, at which a segment file is closed and the next group commit starts a
    /// new one (a segment can exceed it by one group commit). At least 1.
    pub fn segment_bytes(mut self, bytes: u64) -> Self {
        self.segment_bytes = bytes;
        self
    }

    /// The most events one subscription batch holds (at least 1).
    pub fn subscription_batch(mut self, events: usize) -> Self {
        self.subscription_batch = events;
        self
    }

    /// The most bytes of records a durable log keeps in memory for reads, in bytes (0: none).
    ///
    /// A durable log keeps in memory only its index — per event its type and tags (as ids of
    /// names stored once), its position in the type and tag posting lists, and where its payload
    /// is on disk (see the crate docs, "Memory", for the bytes per event) — and reads payloads
    /// back from the segment files, one whole record (append) per read, checked against its
    /// CRC32C. This cache keeps the records read most recently and most often (`quick_cache`'s
    /// CLOCK-Pro), up to this many bytes of them, so hot records cost no system call; beyond
    /// it the operating system's page cache still serves what it holds. An in-memory log holds
    /// every payload anyway and has no cache.
    pub fn cache_bytes(mut self, bytes: u64) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// How often a read-only follower ([`EventLog::open_read_only`](crate::EventLog::open_read_only))
    /// looks at the writer's commit marker for new durable records: its wake-up latency is at
    /// most this (half of it on average) plus the read of the new records. At least 1 µs.
    /// Ignored by the writer.
    pub fn follow_interval(mut self, interval: std::time::Duration) -> Self {
        self.follow_interval = interval;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), OpenError> {
        let bad = |what| Err(OpenError::InvalidOption(what));
        if self.queue_capacity == 0 {
            return bad("queue_capacity must be at least 1");
        }
        if self.max_drain_requests == 0 {
            return bad("max_drain_requests must be at least 1");
        }
        if self.max_drain_bytes == 0 {
            return bad("max_drain_bytes must be at least 1");
        }
        if self.max_append_bytes == 0 || self.max_append_bytes > MAX_PAYLOAD - PAYLOAD_FIXED - FRAME_LEN {
            return bad("max_append_bytes must be between 1 and 4 GiB - 20 bytes");
        }
        if self.segment_bytes == 0 {
            return bad("segment_bytes must be at least 1");
        }
        if self.subscription_batch == 0 {
            return bad("subscription_batch must be at least 1");
        }
        if self.follow_interval < std::time::Duration::from_micros(1) {
            return bad("follow_interval must be at least 1 µs");
        }
        Ok(())
    }
}
