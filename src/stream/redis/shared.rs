//! [`Shared`]: what every end of one stream holds on to (the connections and the lanes' keys),
//! and the claims of a lane's ends (attaching a consumer, claiming the producer).
//!
//! The ends (`producer`, `consumer`) and the stream (`stream`) depend on this module, never the
//! other way round.

use std::sync::{Arc, Mutex};

use super::conn::{Budget, Pool};
use super::lane::LaneDef;
use crate::error::StreamError;
use crate::lane::LaneStats;
use crate::name::SinkName;
use crate::position::Position;

/// What every end of one stream shares: the connections and the lanes' keys.
pub(crate) struct Shared {
    pub(crate) pool: Pool,
    pub(crate) sinks: Box<[SinkName]>,
    pub(crate) lanes: Box<[Arc<LaneDef>]>,
    pub(crate) requests: Arc<LaneDef>,
    /// The highest watermark read, returned while Redis cannot be reached.
    pub(crate) watermark: Mutex<Option<Position>>,
    /// The last request-lane stats read, returned while Redis cannot be reached.
    pub(crate) request_stats: Mutex<Option<LaneStats>>,
    /// Built with `fanout(true)`: the lanes are published to only through the fan-out.
    pub(crate) fanout: bool,
}

impl Shared {
    /// Attaches (`polite`) or re-attaches a consumer of `lane` under claim `token`.
    pub(crate) fn attach_lane(&self, lane: &LaneDef, polite: bool, token: u64) -> Result<u64, StreamError> {
        let busy = || match &lane.sink {
            Some(sink) => StreamError::ConsumerAttached(sink.clone()),
            None => StreamError::RequestConsumerAttached,
        };
        let claim = self.pool.claim(token, &lane.base, "holder").map_err(StreamError::Backend)?;
        let result = (|| {
            for _ in 0..8 {
                let expected = if polite {
                    let holder =
                        lane.field(&self.pool, Budget::Retry, "holder").map_err(StreamError::Backend)?;
                    let holder = holder.unwrap_or_default();
                    if holder == claim {
                        holder
                    } else if self.pool.holder_alive(&holder).map_err(StreamError::Backend)? {
                        return Err(busy());
                    } else {
                        holder
                    }
                } else {
                    String::new()
                };
                match lane.attach(&self.pool, polite, &expected, &claim).map_err(StreamError::Backend)? {
                    Ok(epoch) => return Ok(epoch),
                    Err(_) => continue, // the holder changed under us: look again
                }
            }
            Err(busy())
        })();
        if result.is_err() {
            self.pool.forget(token);
        }
        result
    }

    /// Claims the producer of `lane` under claim `token`: its epoch, publish count and last
    /// published position.
    pub(crate) fn claim_producer(
        &self,
        lane: &LaneDef,
        token: u64,
    ) -> Result<(u64, u64, Option<Position>), StreamError> {
        let sink = lane.sink.clone().expect("sink lanes have producers");
        let claim = self.pool.claim(token, &lane.base, "ph").map_err(StreamError::Backend)?;
        let result = (|| {
            for _ in 0..8 {
                let holder = lane.field(&self.pool, Budget::Retry, "ph").map_err(StreamError::Backend)?;
                let holder = holder.unwrap_or_default();
                if holder != claim && self.pool.holder_alive(&holder).map_err(StreamError::Backend)? {
                    return Err(StreamError::ProducerBusy(sink.clone()));
                }
                match lane.claim_producer(&self.pool, &holder, &claim).map_err(StreamError::Backend)? {
                    Ok(claimed) => return Ok(claimed),
                    Err(_) => continue,
                }
            }
            Err(StreamError::ProducerBusy(sink.clone()))
        })();
        if result.is_err() {
            self.pool.forget(token);
        }
        result
    }
}
