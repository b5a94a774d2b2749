//! [`Shared`]: what every end of one stream holds on to (the connections and the lanes' keys),
//! and the claims of the ends that one holder has at a time (a lane's attached consumer, the
//! stream's fan-out).
//!
//! The ends (`sender`, `fanout`, `consumer`) and the stream (`stream`) depend on this module,
//! never the other way round.

use std::sync::{Arc, Mutex};

use super::conn::{Budget, Pool};
use super::lane::LaneDef;
use crate::error::{BackendError, StreamError};
use crate::lane::LaneStats;
use crate::name::SinkName;
use crate::position::Position;

/// What every end of one stream shares: the connections and the lanes' keys.
pub(crate) struct Shared {
    pub(crate) pool: Pool,
    pub(crate) sinks: Box<[SinkName]>,
    pub(crate) lanes: Box<[Arc<LaneDef>]>,
    pub(crate) requests: Arc<LaneDef>,
    /// The sink log (`{P}:log`), written by the fan-out.
    pub(crate) log: String,
    /// The meta hash (`{P}:meta`): the shape, the fan-out's epoch and claim, the trim floors.
    pub(crate) meta: String,
    /// The watermark waiters' set (`{P}:ww`, see "Watermark waiters" in `scripts`).
    pub(crate) watermark_waiters: String,
    /// The highest watermark read, returned while Redis cannot be reached.
    pub(crate) watermark: Mutex<Option<Position>>,
    /// The last request-lane stats read, returned while Redis cannot be reached.
    pub(crate) request_stats: Mutex<Option<LaneStats>>,
}

impl Shared {
    /// Takes claim `token` (registered under `key`'s `field`) of an end that one holder has at a
    /// time. `polite`: reads the holder first and refuses with `busy()` while it is alive and not
    /// this claim; else (a take-over) expects no holder in particular. `take(expected, claim)`
    /// runs the claim script, which claims only while the holder is still `expected` (`None`
    /// when it changed under us: look again, 8 times at most). Forgets the token on failure.
    fn claim_end<R>(
        &self,
        token: u64,
        key: &str,
        field: &'static str,
        polite: bool,
        busy: impl Fn() -> StreamError,
        mut take: impl FnMut(&str, &str) -> Result<Option<R>, BackendError>,
    ) -> Result<R, StreamError> {
        let claim = self.pool.claim(token, key, field).map_err(StreamError::Backend)?;
        let result = (|| {
            for _ in 0..8 {
                let expected = if polite {
                    let holder: Option<String> = self
                        .pool
                        .run(Budget::Retry, |c, _| ::redis::cmd("HGET").arg(key).arg(field).query(c))
                        .map_err(StreamError::Backend)?;
                    let holder = holder.unwrap_or_default();
                    if holder != claim && self.pool.holder_alive(&holder).map_err(StreamError::Backend)? {
                        return Err(busy());
                    }
                    holder
                } else {
                    String::new()
                };
                if let Some(claimed) = take(&expected, &claim).map_err(StreamError::Backend)? {
                    return Ok(claimed);
                }
            }
            Err(busy())
        })();
        if result.is_err() {
            self.pool.forget(token);
        }
        result
    }

    /// Attaches (`polite`) or re-attaches a consumer of `lane` under claim `token`.
    pub(crate) fn attach_lane(&self, lane: &LaneDef, polite: bool, token: u64) -> Result<u64, StreamError> {
        let busy = || match &lane.sink {
            Some(sink) => StreamError::ConsumerAttached(sink.clone()),
            None => StreamError::RequestConsumerAttached,
        };
        self.claim_end(token, &lane.base, "holder", polite, busy, |expected, claim| {
            Ok(lane.attach(&self.pool, polite, expected, claim)?.ok())
        })
    }

    /// Claims the stream's fan-out (its claim `fh` in the meta hash `meta`) under claim `token`,
    /// with `take` the claim script's run (see [`claim_end`](Shared::claim_end)). The stream has
    /// at least one sink (the busy error names the first).
    pub(crate) fn claim_fanout<R>(
        &self,
        token: u64,
        meta: &str,
        take: impl FnMut(&str, &str) -> Result<Option<R>, BackendError>,
    ) -> Result<R, StreamError> {
        let busy = || StreamError::ProducerBusy(self.sinks[0].clone());
        self.claim_end(token, meta, "fh", true, busy, take)
    }
}
