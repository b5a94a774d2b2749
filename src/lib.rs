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
//! use lanestream::{Batch, LaneItem, MemoryStream, Position, Stream};
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
//! let batches: Vec<LaneItem> =
//!     (1..=100).map(|lsn| LaneItem::Batch(Batch::new(Some(Position(lsn)), Vec::new().into()))).collect();
//! fanout.publish_run(&batches)?; // each batch written once, read by both lanes
//! assert_eq!(stream.wait_watermark(Position(100), None), Some(Position(100)));
//! fanout.close();
//! sinks.into_iter().for_each(|t| t.join().unwrap());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]
#![deny(missing_debug_implementations)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "codec")]
pub mod codec;
pub mod contract;
pub mod docs;
mod envelope;
mod error;
mod item;
mod lane;
mod name;
mod position;
mod stream;
mod sync;
pub mod wait;

pub use envelope::{Envelope, Op};
pub use error::{
    AckError, BackendError, BuildError, ErrorCode, PublishError, PublishTimeoutError, RecvError,
    RecvTimeoutError, ServerReason, StreamError, TryPublishError, TryRecvError,
};
pub use item::{Batch, Item, LaneItem, Request, ENVELOPE_OVERHEAD};
#[cfg(feature = "futures")]
pub use lane::ConsumerStream;
pub use lane::{
    AckHandle, Consumer, Delivery, Fanout, FanoutPublish, Lane, LaneStats, MemoryStats, Producer, Publish,
    Recv, RecvRun, Run, RunIter, MAX_BUDGET, MAX_CAPACITY, MAX_RUN,
};
pub use name::{IndexName, NameError, SinkName, MAX_NAME_LEN};
pub use position::{ParseLsnError, Position};
// The Redis backend never runs under loom (its mutexes are std's): left out of loom builds.
#[cfg(all(feature = "redis", not(lanestream_loom)))]
pub use stream::redis::{
    RedisConsumer, RedisDelivery, RedisFanout, RedisItem, RedisRequestSender, RedisStream, RedisStreamBuilder,
};

/// The Redis Streams backend (feature `redis`): its guide — layout on the server, fences,
/// where it differs from the in-memory backend — and its types (also re-exported at the
/// crate root).
#[cfg(all(feature = "redis", not(lanestream_loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis {
    #![doc = include_str!("stream/redis/GUIDE.md")]
    pub use crate::stream::redis::{
        RedisConsumer, RedisDelivery, RedisFanout, RedisItem, RedisRequestSender, RedisStream,
        RedisStreamBuilder,
    };
}
pub use stream::{
    LaneConsumer, LaneDelivery, MemoryStream, RequestLane, RequestPublisher, RequestSender, Stream,
    StreamBuilder, StreamFanout,
};

/// `Send`/`Sync` bounds and consume-on-ack, pinned by `compile_fail` doctests.
#[cfg(doctest)]
mod send_sync_tests;

/// The README's examples, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
