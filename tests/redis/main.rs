//! The Redis backend's tests, one binary (one link of the crate with every feature), a module per
//! subject:
//!
//! - [`contract`]: the port's contract on Redis (every generic test of `tests/port_contract`,
//!   plus the Redis-only behaviour); under `CI=true` it fails when no server is configured;
//! - [`fanout`]: the fan-out's rules shared with the in-memory one;
//! - [`lane_faults`]: a sink lane's hot path attacked (out-of-order acks, nacks, stale acks,
//!   fenced producers, trims, restarts, a flushed script cache, killed connections);
//! - [`fanout_faults`]: the fan-out attacked (lost replies on its `XADD` and gate, zombie
//!   fan-outs at the fence, closes racing publishes, gaps);
//! - [`fanout_publish_record`]: the log as every lane's publish record (the fold racing
//!   publishes and trims, the watermark across gaps and restarts, the random-sequence model
//!   against the in-memory fan-out);
//! - [`server_restart`]: a restart of the server itself (persisted claims, `LOADING`);
//! - [`outages`]: the pipeline's rule P8 on the backend (outages and refused writes inside the
//!   retry budget, acks whose outcome an outage hid).
//!
//! Every test needs a server: `LANESTREAM_REDIS_URL`, or else a throwaway `redis-server` the
//! binary starts at the first test (`support/mod.rs`, `url`); without either they say `SKIPPED`
//! (a failure under `CI=true`).
#![cfg(feature = "redis")]

#[path = "../common/mod.rs"]
mod common;
#[path = "../port_contract/mod.rs"]
mod port_contract;
#[macro_use]
#[path = "support/mod.rs"]
mod redis_support;

mod contract;
mod fanout;
mod fanout_faults;
mod fanout_publish_record;
mod lane_faults;
mod outages;
mod pipeline_restart;
mod server_restart;
