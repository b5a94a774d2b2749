//! The stream: the port ([`Stream`] and the lane-end traits), the in-memory backend
//! ([`MemoryStream`]), the request lane, and the watermark.
//!
//! - `port`: the traits any backend implements, with associated lane ends.
//! - `memory`: [`MemoryStream`] and its [`StreamBuilder`]: one lane per sink, in this process.
//! - `requests`: the request lane ([`RequestLane`], [`RequestSender`]), sinks to ingest.
//! - `redis` (feature `redis`): [`RedisStream`](crate::RedisStream), the port over Redis Streams.
//! - `watermark` (private): the lanes' acked marks and their lock-free minimum.

mod memory;
pub(crate) mod port;
#[cfg(feature = "redis")]
pub(crate) mod redis;
mod requests;
pub(crate) mod watermark;

pub use self::memory::{MemoryStream, StreamBuilder};
pub use self::port::{LaneConsumer, LaneDelivery, LaneProducer, RequestPublisher, Stream};
pub use self::requests::{RequestLane, RequestSender};
