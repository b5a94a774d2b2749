//! The port's two backends: [`MemoryStream`] (in this process) and, with the feature `redis`,
//! [`RedisStream`](crate::RedisStream) (over Redis Streams, for engines in other processes).
//!
//! - `memory`: [`MemoryStream`] and its [`StreamBuilder`]: one array of cells every sink's lane
//!   reads in place, in this process; its `requests` module is the request lane
//!   ([`RequestLane`], [`RequestSender`]), sinks to ingest.
//! - `redis` (feature `redis`): the port over Redis Streams (its guide is the public
//!   [`crate::redis`] module).

mod memory;
// The Redis backend never runs under loom (its mutexes are std's): left out of loom builds.
#[cfg(all(feature = "redis", not(lanestream_loom)))]
pub(crate) mod redis;

pub use self::memory::{MemoryStream, RequestLane, RequestSender, StreamBuilder};
