//! [`RedisRequestSender`] (the request lane's senders), and what every publisher of this
//! backend shares: the item's check and encoding, the blocking loop, the errors' mapping.

use std::fmt;
use std::future::{poll_fn, Future};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use super::conn::Budget;
use super::item::RedisItem;
use super::lane::{LaneDef, Published};
use super::shared::Shared;
use super::waiter::{wait_until, Waiter};
use crate::codec::AlignedVec;
use crate::error::{BackendError, PublishError};
use crate::item::Request;
use crate::port::RequestPublisher;
use crate::position::Position;

/// An item checked and encoded for a publish: its position and its payload.
pub(super) struct Encoded {
    pub(super) position: Option<Position>,
    pub(super) bytes: AlignedVec,
}

/// Checks and encodes `item`; hands it back if it cannot be published.
fn encode<T: RedisItem>(shared: &Shared, item: &T) -> Result<Encoded, Option<BackendError>> {
    let position = item.position();
    if position == Some(Position::RESERVED) {
        return Err(None);
    }
    match item.encode() {
        Ok(bytes) => Ok(Encoded { position, bytes }),
        Err(e) => {
            shared.pool.record(format!("lanestream: could not encode: {e}"));
            Err(Some(BackendError::Server(crate::error::ServerReason::Other(crate::error::ErrorCode::new(
                "ENCODE",
            )))))
        }
    }
}

/// [`encode`], mapping a refusal to the error that hands `item` back.
pub(super) fn encoded<T: RedisItem>(shared: &Shared, item: T) -> Result<(T, Encoded), PublishError<T>> {
    match encode(shared, &item) {
        Ok(e) => Ok((item, e)),
        Err(None) => Err(PublishError::InvalidPosition(item)),
        Err(Some(error)) => Err(PublishError::Backend { item, error }),
    }
}

/// The error of a waiting publish for the never-waiting step's `e` (`Full` at the deadline is
/// the timeout).
pub(super) fn timeout_error<T>(e: PublishError<T>) -> PublishError<T> {
    match e {
        PublishError::Full(t) => PublishError::Timeout(t),
        other => other,
    }
}

/// The one blocking body of this backend's publishes (`publish`, `publish_timeout`,
/// `publish_deadline`, runs, senders and the fan-out alike): runs `step` (one never-waiting
/// attempt) until it is not `Full`, waiting between attempts on the wake-up key `step` names
/// with its refusal (each wait lasts at most the stream's wait slice), until `deadline` if any.
/// `Full` at the deadline is `Timeout`.
pub(super) fn publish_until<T>(
    shared: &Shared,
    item: T,
    deadline: Option<Instant>,
    mut step: impl FnMut(T) -> Result<(), (PublishError<T>, String)>,
) -> Result<(), PublishError<T>> {
    let mut waiting = Some(item);
    let answer = wait_until(shared, deadline, || {
        let item = waiting.take().expect("the item is back after every Full");
        match step(item) {
            Err((PublishError::Full(back), bell)) => {
                waiting = Some(back);
                ControlFlow::Continue(Some(bell))
            }
            other => ControlFlow::Break(other.map_err(|(e, _)| timeout_error(e))),
        }
    });
    answer.unwrap_or_else(|| Err(PublishError::Timeout(waiting.take().expect("the item is back"))))
}

/// Publishes requests on the request lane over Redis; any number, in any process
/// ([R1](crate::contract#r1)). Cheap to clone.
///
/// A send retried after a lost connection may land twice: requests are at-least-once
/// ([R2](crate::contract#r2)).
#[derive(Clone)]
pub struct RedisRequestSender {
    shared: Arc<Shared>,
    lane: Arc<LaneDef>,
}

impl RedisRequestSender {
    pub(crate) fn new(shared: Arc<Shared>, lane: Arc<LaneDef>) -> Self {
        RedisRequestSender { shared, lane }
    }

    fn step(&self, request: Request, budget: Budget) -> Result<(), PublishError<Request>> {
        let (request, encoded) = encoded(&self.shared, request)?;
        let position = encoded.position;
        match self.lane.publish(&self.shared.pool, budget, &encoded.bytes, position) {
            Ok(Published::Done | Published::Duplicate) => Ok(()),
            Ok(Published::Full) => Err(PublishError::Full(request)),
            Ok(Published::Closed) => Err(PublishError::Closed(request)),
            Ok(Published::Regressed(last)) => Err(PublishError::PositionRegressed {
                position: position.expect("only positioned items regress"),
                last,
                item: request,
            }),
            Ok(Published::Fenced) => {
                Err(PublishError::Backend { item: request, error: BackendError::Fenced })
            }
            Err(error) => Err(PublishError::Backend { item: request, error }),
        }
    }

    fn until(&self, request: Request, deadline: Option<Instant>) -> Result<(), PublishError<Request>> {
        let bell = self.lane.pbell();
        publish_until(&self.shared, request, deadline, |r| {
            self.step(r, Budget::Retry).map_err(|e| (e, bell.clone()))
        })
    }
}

impl RequestPublisher for RedisRequestSender {
    fn try_publish(&self, request: Request) -> Result<(), PublishError<Request>> {
        self.step(request, Budget::Once)
    }

    fn publish_deadline(
        &self,
        request: Request,
        deadline: Option<Instant>,
    ) -> Result<(), PublishError<Request>> {
        self.until(request, deadline)
    }

    fn publish_async(
        &self,
        request: Request,
    ) -> impl Future<Output = Result<(), PublishError<Request>>> + Send + '_ {
        // Senders are shared, so each waiting future has a waiter of its own.
        let mut request = Some(request);
        let mut waiter: Option<Waiter> = None;
        poll_fn(move |cx| {
            let Some(r) = request.take() else { return Poll::Ready(Ok(())) };
            match self.step(r, Budget::Retry) {
                Ok(()) => Poll::Ready(Ok(())),
                Err(PublishError::Full(back)) => {
                    request = Some(back);
                    let shared = self.shared.clone();
                    waiter
                        .get_or_insert_with(|| Waiter::new(shared, Waiter::REQUEST))
                        .arm(self.lane.pbell(), cx.waker());
                    Poll::Pending
                }
                Err(e) => Poll::Ready(Err(e)),
            }
        })
    }
}

impl fmt::Debug for RedisRequestSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRequestSender").field("lane", &self.lane.base).finish()
    }
}
