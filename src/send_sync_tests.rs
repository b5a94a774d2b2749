//! Compile-time checks (doctests only; wired in with `#[cfg(doctest)] mod send_sync_tests;`).
//!
//! # `Send` / `Sync` follow the item's bounds
//!
//! The lane ends and handles share the item between threads (handles read it in place, the
//! advancer moves it out), so `Producer<T>`, `Consumer<T>`, `Delivery<T>` and `AckHandle<T>`
//! are `Send` only when `T: Send + Sync`. With such an item, all four are `Send` and `Sync`:
//!
//! ```
//! use lanestream::{AckHandle, Consumer, Delivery, Item, Position, Producer};
//! struct Fine(u64);
//! impl Item for Fine {
//!     fn position(&self) -> Option<Position> { Some(Position(self.0)) }
//! }
//! fn send_sync<T: Send + Sync>() {}
//! send_sync::<Producer<Fine>>();
//! send_sync::<Consumer<Fine>>();
//! send_sync::<Delivery<Fine>>();
//! send_sync::<AckHandle<Fine>>();
//! send_sync::<lanestream::Lane<Fine>>();
//! send_sync::<lanestream::Run<Fine>>();
//! send_sync::<lanestream::Fanout>();
//! ```
//!
//! An item holding an `Rc` (neither `Send` nor `Sync`) makes each of them `!Send`:
//!
//! ```compile_fail,E0277
//! use lanestream::{Item, Position, Producer};
//! struct Shared(std::rc::Rc<u64>);
//! impl Item for Shared {
//!     fn position(&self) -> Option<Position> { None }
//! }
//! fn send<T: Send>() {}
//! send::<Producer<Shared>>();
//! ```
//!
//! ```compile_fail,E0277
//! use lanestream::{Consumer, Item, Position};
//! struct Shared(std::rc::Rc<u64>);
//! impl Item for Shared {
//!     fn position(&self) -> Option<Position> { None }
//! }
//! fn send<T: Send>() {}
//! send::<Consumer<Shared>>();
//! ```
//!
//! ```compile_fail,E0277
//! use lanestream::{Delivery, Item, Position};
//! struct Shared(std::rc::Rc<u64>);
//! impl Item for Shared {
//!     fn position(&self) -> Option<Position> { None }
//! }
//! fn send<T: Send>() {}
//! send::<Delivery<Shared>>();
//! ```
//!
//! ```compile_fail,E0277
//! use lanestream::{AckHandle, Item, Position};
//! struct Shared(std::rc::Rc<u64>);
//! impl Item for Shared {
//!     fn position(&self) -> Option<Position> { None }
//! }
//! fn send<T: Send>() {}
//! send::<AckHandle<Shared>>();
//! ```
//!
//! A [`Run`](crate::Run) follows the same bounds (it reads its items in place and its ack or
//! drop may let the advancer move them out on its thread):
//!
//! ```compile_fail,E0277
//! use lanestream::{Item, Position, Run};
//! struct Shared(std::rc::Rc<u64>);
//! impl Item for Shared {
//!     fn position(&self) -> Option<Position> { None }
//! }
//! fn send<T: Send>() {}
//! send::<Run<Shared>>();
//! ```
//!
//! ```compile_fail,E0277
//! use lanestream::{Item, Position, Run};
//! struct Counter(std::cell::Cell<u64>);
//! impl Item for Counter {
//!     fn position(&self) -> Option<Position> { None }
//! }
//! fn send<T: Send>() {}
//! send::<Run<Counter>>();
//! ```
//!
//! An item holding a `Cell` is `Send` but not `Sync`: handles on other threads would read it
//! through `&T` while the owner's thread may write it, so each of them is `!Send` too:
//!
//! ```compile_fail,E0277
//! use lanestream::{Item, Position, Producer};
//! struct Counter(std::cell::Cell<u64>);
//! impl Item for Counter {
//!     fn position(&self) -> Option<Position> { None }
//! }
//! fn send<T: Send>() {}
//! send::<Producer<Counter>>();
//! ```
//!
//! ```compile_fail,E0277
//! use lanestream::{Consumer, Item, Position};
//! struct Counter(std::cell::Cell<u64>);
//! impl Item for Counter {
//!     fn position(&self) -> Option<Position> { None }
//! }
//! fn send<T: Send>() {}
//! send::<Consumer<Counter>>();
//! ```
//!
//! ```compile_fail,E0277
//! use lanestream::{Delivery, Item, Position};
//! struct Counter(std::cell::Cell<u64>);
//! impl Item for Counter {
//!     fn position(&self) -> Option<Position> { None }
//! }
//! fn send<T: Send>() {}
//! send::<Delivery<Counter>>();
//! ```
//!
//! ```compile_fail,E0277
//! use lanestream::{AckHandle, Item, Position};
//! struct Counter(std::cell::Cell<u64>);
//! impl Item for Counter {
//!     fn position(&self) -> Option<Position> { None }
//! }
//! fn send<T: Send>() {}
//! send::<AckHandle<Counter>>();
//! ```
//!
//! A `Cell` item's delivery cannot be sent to a worker thread to be acked there:
//!
//! ```compile_fail,E0277
//! use lanestream::{Item, Lane, Position, SinkName};
//! struct Counter(std::cell::Cell<u64>);
//! impl Item for Counter {
//!     fn position(&self) -> Option<Position> { None }
//! }
//! let lane = Lane::standalone(SinkName::new("cells").unwrap(), 1).unwrap();
//! lane.producer().unwrap().publish(Counter(std::cell::Cell::new(0))).unwrap();
//! let handle = lane.reattach().try_recv().unwrap().into_handle();
//! std::thread::spawn(move || handle.ack());
//! ```
//!
//! # [L7](crate::contract#l7): acking twice is impossible by construction
//!
//! Acking consumes the delivery (and the handle), so a second ack, or a nack after an ack, does
//! not compile. The single ack does:
//!
//! ```
//! use lanestream::{Batch, LaneItem, MemoryStream, Position, Stream, StreamFanout};
//! let stream = MemoryStream::builder().capacity(1).sink("s").build().unwrap();
//! let lane = stream.lane("s").unwrap();
//! stream.fanout().unwrap().publish(LaneItem::Batch(Batch::new(Some(Position(1)), Vec::new().into()))).unwrap();
//! let delivery = lane.reattach().try_recv().unwrap();
//! delivery.ack().unwrap();
//! ```
//!
//! ```compile_fail,E0382
//! use lanestream::{Batch, LaneItem, MemoryStream, Position, Stream, StreamFanout};
//! let stream = MemoryStream::builder().capacity(1).sink("s").build().unwrap();
//! let lane = stream.lane("s").unwrap();
//! stream.fanout().unwrap().publish(LaneItem::Batch(Batch::new(Some(Position(1)), Vec::new().into()))).unwrap();
//! let delivery = lane.reattach().try_recv().unwrap();
//! delivery.ack().unwrap();
//! delivery.ack().unwrap();
//! ```
//!
//! ```compile_fail,E0382
//! use lanestream::{Batch, LaneItem, MemoryStream, Position, Stream, StreamFanout};
//! let stream = MemoryStream::builder().capacity(1).sink("s").build().unwrap();
//! let lane = stream.lane("s").unwrap();
//! stream.fanout().unwrap().publish(LaneItem::Batch(Batch::new(Some(Position(1)), Vec::new().into()))).unwrap();
//! let handle = lane.reattach().try_recv().unwrap().into_handle();
//! handle.ack().unwrap();
//! handle.nack();
//! ```
//!
//! ```compile_fail,E0599
//! use lanestream::{Batch, LaneItem, MemoryStream, Position, Stream, StreamFanout};
//! let stream = MemoryStream::builder().capacity(1).sink("s").build().unwrap();
//! let lane = stream.lane("s").unwrap();
//! stream.fanout().unwrap().publish(LaneItem::Batch(Batch::new(Some(Position(1)), Vec::new().into()))).unwrap();
//! let handle = lane.reattach().try_recv().unwrap().into_handle();
//! let copy = handle.clone(); // a handle cannot be duplicated either
//! ```
