//! lanestream: the lock-free, in-process stream port of a change-processing pipeline.
//!
//! An ingest engine builds each committed source transaction into one [`Batch`] (an
//! `Arc<[Envelope]>`, built once, shared zero-copy) and publishes it into one bounded
//! single-producer/single-consumer [`Lane`] per sink. Sink engines receive a [`Delivery`], apply
//! it and ack it; each ack advances that lane's acked position, and the [`watermark`] — the
//! minimum acked position over all lanes, computed lock-free on read — is what the source may
//! confirm, so nothing is lost when anything crashes. A [`RequestLane`] carries backfill
//! requests back up.
//!
//! [`watermark`]: Stream::watermark
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
//!             while let Some(delivery) = consumer.recv().unwrap() {
//!                 // apply the batch to the sink, then:
//!                 delivery.ack().unwrap();
//!             }
//!         }))
//!     })
//!     .collect::<Result<_, lanestream::StreamError>>()?;
//! let mut producers = stream.lanes().map(|l| l.producer()).collect::<Result<Vec<_>, _>>()?;
//! for lsn in 1..=100 {
//!     let batch = LaneItem::Batch(Batch::new(Some(Position(lsn)), Vec::new().into()));
//!     for p in &mut producers {
//!         p.publish(batch.clone())?; // moves a reference count, not the envelopes
//!     }
//! }
//! producers.iter().for_each(|p| p.close());
//! sinks.into_iter().for_each(|t| t.join().unwrap());
//! assert_eq!(stream.watermark(), Some(Position(100)));
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

pub use envelope::{Envelope, Op};
pub use error::{
    AckError, BackendError, BuildError, ErrorCode, PublishError, PublishTimeoutError, RecvError,
    RecvTimeoutError, ServerReason, StreamError, TryPublishError, TryRecvError,
};
pub use item::{Batch, Item, LaneItem, Request};
#[cfg(feature = "futures")]
pub use lane::ConsumerStream;
pub use lane::{
    AckHandle, Consumer, Delivery, Fanout, FanoutPublish, Lane, LaneStats, Producer, Publish, Recv, RecvRun,
    Run, RunIter, MAX_CAPACITY, MAX_RUN,
};
pub use name::{IndexName, NameError, SinkName, MAX_NAME_LEN};
pub use position::{ParseLsnError, Position};
#[cfg(feature = "redis")]
pub use stream::redis::{
    RedisConsumer, RedisDelivery, RedisFanout, RedisItem, RedisProducer, RedisRequestSender, RedisStream,
    RedisStreamBuilder,
};
pub use stream::{
    LaneConsumer, LaneDelivery, LaneProducer, MemoryStream, RequestLane, RequestPublisher, RequestSender,
    Stream, StreamBuilder,
};

/// `Send`/`Sync` bounds and consume-on-ack, pinned by `compile_fail` doctests.
#[cfg(doctest)]
mod send_sync_tests;

/// The README's examples, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
