//! The Redis Streams backend of the [`Stream`](crate::Stream) port (feature `redis`):
//! [`RedisStream`] and its ends, over the sync `redis` client (no async runtime).
//!
//! - `item`: [`RedisItem`], what the lanes carry, in the codec's wire form.
//! - `conn`: the connection pool, retries with backoff, the anchor connection behind claims.
//! - `scripts`: the Lua scripts, one per state change, and the key layout they share.
//! - `lane`: one lane's keys and the operations on them.
//! - `shared`: what every end of a stream holds (connections, lane keys) and the ends' claims.
//! - `waiter`: the helper thread behind the async waits.
//! - `sender`: [`RedisRequestSender`], and the publishers' shared steps (the blocking body).
//! - `fanout`: [`RedisFanout`], the one publisher of a stream's sink lanes.
//! - `consumer`: [`RedisConsumer`] and [`RedisDelivery`].
//! - `stream`: [`RedisStream`], its builder and the port (the watermark wait included).
//!
//! The modules depend on each other in that order (`stream` on the ends, the ends on `shared`
//! and `waiter`, those on `lane` and `conn`), without a cycle.
//!
//! Items travel in the codec's wire form ([`crate::codec`]), decoded with validation on
//! receive. The public module [`crate::redis`] carries the backend's guide: its layout on the
//! server, its fences, and where it differs from the in-memory backend.

// The backend's mutexes are `std::sync::Mutex`es, locked with `crate::sync::lock`, which takes
// the shim's: the two are one type except under loom, which models the in-memory engine only, so
// the backend is left out of loom builds (`backend/mod.rs`, `lib.rs`).

mod conn;
mod consumer;
mod fanout;
mod item;
mod lane;
mod scripts;
mod sender;
mod shared;
mod stream;
mod waiter;

pub use self::consumer::{RedisConsumer, RedisDelivery};
pub use self::fanout::RedisFanout;
pub use self::item::RedisItem;
pub use self::sender::RedisRequestSender;
pub use self::stream::{RedisStream, RedisStreamBuilder};
