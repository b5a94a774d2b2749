//! The stream: the port ([`Stream`] and the end traits), the in-memory backend
//! ([`MemoryStream`]) and the request lane.
//!
//! - `port`: the traits any backend implements, with associated lane ends.
//! - `memory`: [`MemoryStream`] and its [`StreamBuilder`]: one array of cells every sink's lane
//!   reads in place, in this process.
//! - `requests`: the request lane ([`RequestLane`], [`RequestSender`]), sinks to ingest.
//! - `redis` (feature `redis`): [`RedisStream`](crate::RedisStream), the port over Redis Streams.

mod memory;
pub(crate) mod port;
// The Redis backend never runs under loom (its mutexes are std's): left out of loom builds.
#[cfg(all(feature = "redis", not(lanestream_loom)))]
pub(crate) mod redis;
mod requests;

pub use self::memory::{MemoryStream, StreamBuilder};
pub use self::port::{LaneConsumer, LaneDelivery, RequestPublisher, Stream, StreamFanout};
pub use self::requests::{RequestLane, RequestSender};

use crate::error::BuildError;
use crate::lane::check_capacity;
use crate::name::SinkName;

/// Checks what every backend's builder is given ([L1](crate::contract#l1)): both capacities
/// (`1..=MAX_CAPACITY`) and the sink names (valid, none twice), in that order.
pub(crate) fn checked_shape(
    capacity: usize,
    request_capacity: usize,
    names: Vec<String>,
) -> Result<Vec<SinkName>, BuildError> {
    check_capacity(capacity, "sink lanes")?;
    check_capacity(request_capacity, "the request lane")?;
    let mut sinks: Vec<SinkName> = Vec::with_capacity(names.len());
    for name in names {
        let name = SinkName::new(name)?;
        if sinks.contains(&name) {
            return Err(BuildError::DuplicateSink(name));
        }
        sinks.push(name);
    }
    Ok(sinks)
}
