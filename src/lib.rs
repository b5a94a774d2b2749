//! lanestream: the lock-free, in-process stream port of a change-processing pipeline.
#![warn(missing_docs)]

mod envelope;
mod item;
mod name;
mod position;

pub use envelope::{Envelope, Op};
pub use item::{Batch, Item, LaneItem, Request};
pub use name::{IndexName, NameError, SinkName, MAX_NAME_LEN};
pub use position::{ParseLsnError, Position};
