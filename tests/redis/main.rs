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
//! - [`server_restart`]: a restart of the server itself (persisted claims, `LOADING`).
//!
//! Every test needs a server at `LANESTREAM_REDIS_URL` (the helpers are in `support/`).
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
mod server_restart;
