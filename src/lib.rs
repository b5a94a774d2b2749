//! lanestream: the lock-free, in-process stream port of a change-processing pipeline.
//!
//! An ingest engine builds each committed source transaction into one [`Batch`] (an
//! `Arc<[Envelope]>`, built once, shared zero-copy) and publishes it with the stream's one
//! [`Fanout`]: written once into one bounded array that every sink's [`Lane`] reads in place,
//! with one publication step for every lane. Sink engines receive a [`Delivery`] (or a [`Run`]
//! of them, the fast path), apply it and ack it; each ack advances that lane's acked position,
//! and the [`watermark`] — the minimum acked position over all lanes, computed lock-free on read
//! and waitable with [`wait_watermark`] — is what the source may confirm, so nothing is lost when
//! anything crashes. A [`RequestLane`] carries backfill requests back up.
//!
//! [`watermark`]: Stream::watermark
//! [`wait_watermark`]: Stream::wait_watermark
//!
//! ```
//! use lanestream::prelude::*;
//! use lanestream::{Batch, LaneItem, MemoryStream, Position};
//! use std::thread;
//!
//! let stream = MemoryStream::builder().capacity(64).sinks(["search", "cache"]).build()?;
//! let sinks: Vec<_> = stream
//!     .lanes()
//!     .map(|lane| {
//!         let mut consumer = lane.attach()?;
//!         Ok(thread::spawn(move || {
//!             while let Some(run) = consumer.recv_run(64).unwrap() {
//!                 // apply the run of batches to the sink, then:
//!                 run.ack().unwrap();
//!             }
//!         }))
//!     })
//!     .collect::<Result<_, lanestream::StreamError>>()?;
//! let mut fanout = stream.fanout()?;
//! let mut batches: Vec<LaneItem> =
//!     (1..=100).map(|lsn| LaneItem::Batch(Batch::new(Some(Position(lsn)), Vec::new().into()))).collect();
//! fanout.publish_run(&mut batches)?; // each batch moved in once, read by both lanes
//! assert_eq!(stream.wait_watermark(Position(100), None), Some(Position(100)));
//! fanout.close();
//! sinks.into_iter().for_each(|t| t.join().unwrap());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Ends, waiting and errors
//! Every call comes in a blocking form, one that never blocks, one with a bounded wait and an
//! async one (any executor: the crate depends on no runtime). Every publish error hands the item
//! back (`into_inner()`); nothing was enqueued.
//!
//! The ends' surface is the port's traits ([`StreamFanout`], [`LaneConsumer`], [`LaneDelivery`],
//! [`LaneRun`], [`RequestPublisher`]; `use lanestream::prelude::*;` brings them into scope), the
//! same on every backend. Each backend implements a few primitives (the `try_` form, the
//! deadline form with `Option<Instant>`, the async form, the run pair); the blocking and timed
//! forms are provided over the deadline form: `publish(item)` is
//! `publish_deadline(item, None)`, `recv()` is `recv_deadline(None)`.
//!
//! | | blocking | never blocks | bounded wait | async |
//! |---|---|---|---|---|
//! | publish → [`PublishError`] | `publish` | `try_publish` (only it returns `Full`) | `publish_timeout`, `publish_deadline(item, Some(deadline))` (only they return `Timeout`) | `publish_async` |
//! | receive | `recv` → `RecvError` | `try_recv` → `TryRecvError` (`Empty`, `Closed`, `Detached`) | `recv_timeout`, `recv_deadline(Some(deadline))` → `RecvTimeoutError` | `recv_async`, `poll_recv`, `into_stream` (feature `futures`) |
//! | receive a run | `recv_run(max)` | `try_recv_run(max)` | `recv_run_timeout`, `recv_run_deadline(max, Some(deadline))` | `recv_run_async(max)` |
//! | publish to every lane (`Stream::fanout()`) | `publish`, `publish_run`, `publish_to` | `try_publish`, `try_publish_run`, `try_publish_to` | `publish_timeout`, `publish_deadline` | `publish_async` |
//! | wait for the watermark | `wait_watermark(at_least, None)` | `watermark()` | `wait_watermark(at_least, Some(deadline))` | `wait_watermark_async(at_least)` |
//!
//! **Runs are the fast path**: a run publishes or receives up to [`MAX_RUN`] items in one step
//! and acks them with one store each and one advance; the per-item calls are the run of one
//! (contract, section Runs).
//!
//! # Layout
//! | where | what |
//! |---|---|
//! | `lane/` | the engine and the ends users hold: `publisher.rs` (the one publishing engine behind [`Fanout`], [`Producer`] and the request senders; the one blocking body), `fanout.rs` ([`Fanout`]: its `StreamFanout` impl is its surface), `producer.rs`, `consumer.rs`, `delivery.rs` ([`Delivery`], [`AckHandle`]), `run.rs` ([`Run`]), `marks.rs` (the acked marks and their lock-free minimum, the watermark), `stats.rs` ([`LaneStats`]), `limits.rs` ([`MAX_CAPACITY`], [`MAX_BUDGET`] and their checks), `adapter.rs` (the `futures` stream) |
//! | `lane/ring/` | the cells every lane reads in place, one file per side: `slot.rs` (the state word, the cells and their cursor), `room.rs` (the lane's part in publishing), `receive.rs` (the consumer side and the seat), `ack.rs` (acks, nacks, the advancer), `take_run.rs` (runs), `counters.rs` (lock-free reads) |
//! | `port.rs` | the backend-neutral port: [`Stream`], [`StreamFanout`], [`LaneConsumer`], [`LaneDelivery`], [`LaneRun`], [`RequestPublisher`] (each requires a few primitives and provides the other forms); [`prelude`] re-exports them |
//! | `backend/memory/` | [`MemoryStream`] and its builder; `requests.rs`, the request lane |
//! | `backend/redis/` | the Redis Streams backend (feature `redis`; its guide is the `redis` module page) |
//! | `wait.rs` | [`wait`]: the one wait list (spin, then park the thread or register the waker) |
//! | `sync.rs` | the shim: `std`, or loom under `--cfg lanestream_loom` |
//! | `item.rs`, `envelope.rs`, `relation.rs`, `name.rs`, `position.rs`, `error.rs` | the vocabulary: [`LaneItem`], [`Batch`], [`Request`], [`Envelope`] and its [`Relation`], names, [`Position`], the error enums |
//! | `codec/` | the rkyv wire form (feature `codec`) |
//! | `pipeline/` | the one ingest driver (feature `pipeline`, on by default; see [`pipeline`]): `source.rs` (the [`Source`](pipeline::Source) trait), `driver.rs` ([`Pipeline`](pipeline::Pipeline): a source into any [`Stream`] into sink engines; the start-up checks), `ingest.rs` (its ingest loop: publishing per lane, confirms, the request lane, the drain), `engine.rs` (the sink engine, [`run_sink`](pipeline::run_sink)), `sink.rs` ([`Sink`](pipeline::Sink), [`RetryPolicy`](pipeline::RetryPolicy), [`MemorySink`](pipeline::MemorySink)), `state.rs` ([`SinkState`](pipeline::SinkState)), `error.rs` ([`PipelineError`](pipeline::PipelineError)), `stop.rs` ([`StopHandle`](pipeline::StopHandle)), `metrics.rs` (figures while it runs, [`PipelineReport`](pipeline::PipelineReport) after) |
//! | `contract.rs`, `docs/` | the contract and the memory-ordering chapter, as doc-only modules |
//!
//! # Features
//! `pipeline` (the [`pipeline`] module: the ingest driver, sink engines and sink state; turns on
//! `serde`; the one on by default), `serde` (serde for items, envelopes, names, positions,
//! stats), `codec` (the rkyv wire form, validated on read), `futures` (`Consumer::into_stream`),
//! `redis` (the `redis` module, turns on `codec`).
#![warn(missing_docs)]
#![deny(missing_debug_implementations)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
#[cfg(feature = "codec")]
pub mod codec;
pub mod contract;
pub mod docs;
mod envelope;
mod error;
mod item;
mod lane;
mod name;
#[cfg(feature = "pipeline")]
#[cfg_attr(docsrs, doc(cfg(feature = "pipeline")))]
pub mod pipeline;
mod port;
mod position;
mod relation;
mod sync;
pub mod wait;

pub use envelope::{Envelope, Op};
pub use error::{
    AckError, BackendError, BuildError, ErrorCode, PublishError, RecvError, RecvTimeoutError, ServerReason,
    StreamError, TryRecvError,
};
pub use item::{Batch, BatchKind, Item, LaneItem, Request, ENVELOPE_OVERHEAD};
#[cfg(feature = "futures")]
pub use lane::ConsumerStream;
pub use lane::{
    AckHandle, Consumer, Delivery, Fanout, FanoutPublish, Lane, LaneStats, MemoryStats, Producer, Publish,
    Recv, RecvRun, Run, RunIter, MAX_BUDGET, MAX_CAPACITY, MAX_RUN,
};
pub use name::{IndexName, NameError, SinkName, MAX_NAME_LEN};
pub use position::{ParseLsnError, Position};
pub use relation::{Relation, RelationColumn};
// The Redis backend never runs under loom (its mutexes are std's): left out of loom builds.
#[cfg(all(feature = "redis", not(lanestream_loom)))]
pub use backend::redis::{
    RedisConsumer, RedisDelivery, RedisFanout, RedisItem, RedisRequestSender, RedisStream, RedisStreamBuilder,
};

/// The Redis Streams backend (feature `redis`): its guide — layout on the server, fences,
/// where it differs from the in-memory backend — and its types (also re-exported at the
/// crate root).
#[cfg(all(feature = "redis", not(lanestream_loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis {
    #![doc = include_str!("backend/redis/GUIDE.md")]
    pub use crate::backend::redis::{
        RedisConsumer, RedisDelivery, RedisFanout, RedisItem, RedisRequestSender, RedisStream,
        RedisStreamBuilder,
    };
}
pub use backend::{MemoryStream, RequestLane, RequestSender, StreamBuilder};
pub use port::{DeliveryRun, LaneConsumer, LaneDelivery, LaneRun, RequestPublisher, Stream, StreamFanout};

/// The port's traits, whose methods are the ends' surface on every backend (`publish`, `recv`,
/// `recv_run`, their timed and deadline forms...): `use lanestream::prelude::*;` brings them
/// into scope.
pub mod prelude {
    pub use crate::port::{LaneConsumer, LaneDelivery, LaneRun, RequestPublisher, Stream, StreamFanout};
}

/// `Send`/`Sync` bounds and consume-on-ack, pinned by `compile_fail` doctests.
#[cfg(doctest)]
mod send_sync_tests;

/// The README's examples, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
