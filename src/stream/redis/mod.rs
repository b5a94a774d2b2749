//! The Redis Streams backend of the [`Stream`](crate::Stream) port (feature `redis`):
//! [`RedisStream`] and its ends, over the sync `redis` client (no async runtime).
//!
//! - `conn`: the connection pool, retries with backoff, the anchor connection behind claims.
//! - `scripts`: the Lua scripts, one per state change, and the key layout they share.
//! - `lane`: one lane's keys and the operations on them.
//! - `stream`: [`RedisStream`], its builder and the port.
//! - `producer`: [`RedisProducer`] and [`RedisRequestSender`].
//! - `consumer`: [`RedisConsumer`], [`RedisDelivery`] and the async waits' helper thread.
//!
//! Items travel in the codec's wire form ([`crate::codec`]), decoded with validation on
//! receive. The README's "Redis backend" section lists where this backend differs from the
//! in-memory one.

mod conn;
mod consumer;
mod lane;
mod producer;
mod scripts;
mod stream;

use std::sync::{Mutex, MutexGuard};

pub use self::consumer::{RedisConsumer, RedisDelivery};
pub use self::producer::{RedisProducer, RedisRequestSender};
pub use self::stream::{RedisStream, RedisStreamBuilder};

use crate::codec::{AlignedVec, CodecError};
use crate::item::{Item, LaneItem, Request};

/// Locks `m`, ignoring poisoning (the backend's critical sections hold plain values).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::LaneItem {}
    impl Sealed for crate::Request {}
}

/// What the Redis backend's lanes carry: [`LaneItem`] and [`Request`], in the codec's wire
/// form. Sealed.
pub trait RedisItem: Item + Send + Sync + Sized + 'static + sealed::Sealed {
    /// The item's bytes.
    #[doc(hidden)]
    fn encode(&self) -> Result<AlignedVec, CodecError>;
    /// The item back from its bytes, validated.
    #[doc(hidden)]
    fn decode(bytes: &[u8]) -> Result<Self, CodecError>;
}

/// Copies `bytes` into an aligned buffer (the codec reads archives in place).
fn aligned(bytes: &[u8]) -> AlignedVec {
    let mut buf = AlignedVec::with_capacity(bytes.len());
    buf.extend_from_slice(bytes);
    buf
}

impl RedisItem for LaneItem {
    fn encode(&self) -> Result<AlignedVec, CodecError> {
        crate::codec::encode_item(self)
    }

    fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        crate::codec::decode_item(&aligned(bytes))
    }
}

impl RedisItem for Request {
    fn encode(&self) -> Result<AlignedVec, CodecError> {
        crate::codec::encode_request(self)
    }

    fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        crate::codec::decode_request(&aligned(bytes))
    }
}
