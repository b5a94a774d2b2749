//! The replication stream: opened (`START_REPLICATION`), read and decoded into the items the
//! source hands over, confirmed, reopened after it broke.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::thread;
use std::time::{Duration, Instant};

use lanestream::{Batch, Position};
use pgwire_replication::{Lsn, PgWireError, ReplicationClient, ReplicationEvent, ReplicationMetrics};
use tokio::sync::mpsc::UnboundedReceiver;

use super::config::{replication_config, LiveConfig};
use super::error::LiveError;
use super::fill::Hold;
use super::reader::{ChunkReader, Woken};
use super::{LiveSource, REJOIN_PREFIX};
use crate::backfill::ReadChunk;
use crate::pipeline::SourceItem;

/// How long the ingest thread sleeps when it finds the replication client's queue empty while
/// the stream is busy, instead of parking until the client's worker wakes it. Parking costs a
/// wake-up per event or few, on both threads: draining a backlog on a unix socket, about 370
/// context switches per 1,000 changes, and 2.95 us of CPU per change (the worker's kernel time,
/// mostly scheduling). Napping lets events gather: about 30 switches per 1,000 and 2.3 us per
/// change, the drain 0.75x -> 0.86x of `pg_recvlogical` at 2M changes, and the live p99 commit
/// -> ack latency at 5,000 transactions/s 15 -> 6 ms (2026-12-05, BENCHMARKS.md). A nap adds
/// at most its length (about 120 us on Linux with the default timer slack) to an event that
/// arrives during it.
const NAP: Duration = Duration::from_micros(50);

/// Naps after the last event before the next wait parks (a quiet stream costs no wake-ups).
const NAPS: u32 = 4;

/// Queued events taken in a row without `poll`'s checks (the heartbeat, the deadline).
const TAKEN: u32 = 256;

/// The reader's next chunk if one is read, or the stream's next event if one is queued,
/// without waiting (a no-op-waker poll of each).
///
/// The stream is polled only when its worker has forwarded more events than were taken
/// (`forwarded`: the client's metrics and the count taken): then its channel holds one, and the
/// receive is a channel receive that returns it. Polled with an empty channel, the receive would
/// be dropped unfinished, which loses nothing while the channel is open, but once the worker
/// ended and closed it, the receive has taken the worker's join handle and its result (why it
/// ended: an administrator's termination, say) goes with it. The parking wait finds out that
/// the worker ended.
fn take_queued(
    stream: &mut ReplicationClient,
    forwarded: &mut Option<(Arc<ReplicationMetrics>, u64)>,
    done: Option<&mut UnboundedReceiver<Result<ReadChunk, LiveError>>>,
) -> Option<Woken<Result<Option<ReplicationEvent>, PgWireError>>> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    if let Some(done) = done {
        if let Poll::Ready(read) = done.poll_recv(&mut cx) {
            return Some(Woken::Read(read));
        }
    }
    let (metrics, taken) = forwarded.as_mut()?;
    // Relaxed is enough: the worker counts an event after sending it, and the channel's own
    // synchronisation hands the event over; a count read early only means a poll later.
    if metrics.events_forwarded() <= *taken {
        return None;
    }
    match std::pin::pin!(stream.recv()).poll(&mut cx) {
        Poll::Ready(event) => {
            *taken += 1;
            Some(Woken::Stream(event))
        }
        Poll::Pending => None,
    }
}

impl LiveSource {
    /// Opens the replication stream (`START_REPLICATION SLOT ... LOGICAL 0/0 (proto_version
    /// '1', publication_names '...', messages 'true')`) from the slot's confirmed position.
    ///
    /// The first [`Source::next`](crate::pipeline::Source::next) does it; call it yourself to
    /// see its errors before.
    ///
    /// # Errors
    /// A [`LiveError`]: the slot held by another client, the permission missing, the
    /// publication missing, or the server's error.
    pub fn open(&mut self) -> Result<(), LiveError> {
        let config = replication_config(&self.config, self.confirmed)?;
        let started = self.runtime.block_on(async {
            let mut client = ReplicationClient::connect(config).await?;
            match tokio::time::timeout(Duration::from_secs(30), client.wait_started()).await {
                Ok(Ok(())) => Ok(client),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(PgWireError::Task("START_REPLICATION not accepted within 30 s".into())),
            }
        });
        match started {
            Ok(client) => {
                self.forwarded = Some((client.metrics(), 0));
                self.stream = Some(client);
                self.opened = true;
                Ok(())
            }
            Err(e) => Err(match classify_stream(&e, &self.config) {
                StreamFault::Fatal(e) => e,
                StreamFault::Lost { cause, .. } => LiveError::Connect(cause),
            }),
        }
    }

    /// Receives from the stream for at most `timeout` and returns the first item: a committed
    /// transaction (positioned at its commit LSN) or a chunk of a large one, decoded by the
    /// source's decoder; or an item of a backfill being served
    /// ([`Source::backfill`](crate::pipeline::Source::backfill)) in stream order: a snapshot
    /// batch when the stream reaches its chunk's high mark, `SnapshotComplete` after a request's
    /// last one. `Ok(None)` when nothing came within `timeout`. Writes the heartbeat when it is
    /// due, and opens the stream again when it broke (see the module docs, *Reconnecting*).
    /// While a backfill is served, its reader thread reads the next chunk when none waits for
    /// its high mark; a chunk read is taken in here (waiting for it only when the stream reached
    /// its high mark first).
    ///
    /// # Errors
    /// [`LiveError::Decode`] for a message the decoder refused, the errors of *Reconnecting*, a
    /// failed heartbeat; [`LiveError::BackfillFailed`] for a chunk whose rows cannot be turned
    /// into documents; [`LiveError::Side`] when reading a chunk fails within
    /// [`SIDE_RETRY_BUDGET`](super::SIDE_RETRY_BUDGET) (the reader reconnects in between);
    /// [`LiveError::Internal`] when the reader thread could not start. After `BackfillFailed` or
    /// `Side` the request being served is given up (it gets no `SnapshotComplete`: ask again,
    /// with `after` set to the last row applied), the next one is served, and the stream goes
    /// on.
    pub(super) fn poll(&mut self, timeout: Duration) -> Result<Option<SourceItem>, LiveError> {
        let deadline = Instant::now() + timeout;
        let mut taken = 0;
        loop {
            if let Some(item) = self.out.pop_front() {
                return Ok(Some(item));
            }
            // A batch waiting for its transaction to be visible holds the stream up (nothing
            // after it is taken), within this call's timeout.
            match self.wait_visible(deadline)? {
                Hold::None => {}
                Hold::Released | Hold::Waiting => continue,
                Hold::Timeout => return Ok(None),
            }
            // While the stream is busy and no backfill chunk is being read, up to `TAKEN`
            // queued events in a row skip the checks below (which read the clock each).
            if self.naps > 0 && self.reader.is_none() && taken < TAKEN {
                let forwarded = &mut self.forwarded;
                if let Some(woken) =
                    self.stream.as_mut().and_then(|stream| take_queued(stream, forwarded, None))
                {
                    taken += 1;
                    self.on_woken(woken)?;
                    continue;
                }
            }
            taken = 0;
            self.heartbeat_if_due()?;
            self.check_publication_if_due()?;
            if self.stream.is_none() {
                return Err(LiveError::Internal("LiveSource read before it was opened".into()));
            }
            if self.backfill_reads()? {
                continue;
            }
            let Some(stream) = self.stream.as_mut() else {
                return Err(LiveError::Internal("LiveSource read before it was opened".into()));
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            // The stream's next event, or the reader's next chunk, whichever comes first (a
            // chunk read while the stream is quiet is installed at once, not at the next event).
            // While the stream is busy (an event came within the last `NAPS` naps), what is
            // queued is taken without parking, and an empty queue is a nap (see `NAP`).
            let mut done = self.reader.as_mut().map(|r| &mut r.done);
            let woken = if self.naps > 0 {
                match take_queued(stream, &mut self.forwarded, done) {
                    Some(woken) => woken,
                    None => {
                        self.naps -= 1;
                        thread::sleep(NAP);
                        continue;
                    }
                }
            } else {
                let received = self.runtime.block_on(async {
                    let mut recv = std::pin::pin!(stream.recv());
                    let next = std::future::poll_fn(|cx| {
                        if let Some(done) = done.as_mut() {
                            if let Poll::Ready(read) = done.poll_recv(cx) {
                                return Poll::Ready(Woken::Read(read));
                            }
                        }
                        recv.as_mut().poll(cx).map(Woken::Stream)
                    });
                    tokio::time::timeout(left, next).await
                });
                match received {
                    Ok(woken) => {
                        if let (Woken::Stream(Ok(Some(_))), Some((_, taken))) =
                            (&woken, self.forwarded.as_mut())
                        {
                            *taken += 1;
                        }
                        woken
                    }
                    Err(_elapsed) => return Ok(None),
                }
            };
            self.on_woken(woken)?;
        }
    }

    /// What woke [`poll`](Self::poll): a chunk the reader read is installed, an event decoded
    /// (the stream is busy again), a stream that ended or broke opened again.
    fn on_woken(
        &mut self,
        woken: Woken<Result<Option<ReplicationEvent>, PgWireError>>,
    ) -> Result<(), LiveError> {
        match woken {
            Woken::Read(Some(read)) => {
                self.install(read)?;
                self.next_read()
            }
            Woken::Read(None) => Err(ChunkReader::gone()),
            Woken::Stream(Ok(Some(event))) => {
                self.naps = NAPS;
                self.on_event(event)
            }
            Woken::Stream(Ok(None)) => self.recover(StreamFault::Lost {
                cause: "the server ended the replication stream".into(),
                admin: false,
            }),
            Woken::Stream(Err(e)) => {
                let fault = classify_stream(&e, &self.config);
                self.recover(fault)
            }
        }
    }

    /// The marks the decoder read reach the backfill, whose ready items are queued. A high mark
    /// of the chunk the reader is still reading (the stream got there first) does not hold the
    /// stream up: the chunk is published when it is installed (see
    /// [`Backfiller::install`](crate::backfill)).
    fn take_marks(&mut self) {
        let mut any = false;
        while let Some(mark) = self.decoder.take_mark() {
            self.backfiller.on_mark(&mark);
            any = true;
        }
        if any {
            self.drain_backfill();
        }
    }

    fn on_event(&mut self, event: ReplicationEvent) -> Result<(), LiveError> {
        // How far the server has sent, outside a transaction: `decoded` from any event that says
        // so, `sent` from a keepalive or a message only (see `sent_upto`).
        let idle = |source: &mut Self, upto: u64| {
            if !source.decoder.in_transaction() && upto != 0 {
                source.decoded = source.decoded.max(Some(Position(upto)));
            }
        };
        let sent = |source: &mut Self, upto: u64| {
            if !source.decoder.in_transaction() && upto != 0 {
                source.sent = source.sent.max(Some(Position(upto)));
            }
        };
        match event {
            ReplicationEvent::KeepAlive { wal_end, .. } => {
                idle(self, wal_end.0);
                sent(self, wal_end.0);
            }
            ReplicationEvent::Message { transactional, lsn, prefix, content } => {
                if transactional && prefix == REJOIN_PREFIX {
                    self.on_rejoin_message(&content);
                }
                self.decoder.message(lsn.0, &prefix, &content);
                self.take_marks();
                if !transactional {
                    idle(self, lsn.0);
                    sent(self, lsn.0);
                }
            }
            ReplicationEvent::StoppedAt { .. } => {}
            ReplicationEvent::Begin { final_lsn, xid, commit_time_micros } => {
                self.decoder.begin(final_lsn.0, xid, commit_time_micros)?;
                self.open_commit = Some(Position(final_lsn.0));
                self.open_xid = Some(xid);
            }
            ReplicationEvent::XLogData { data, .. } => {
                let chunk = self.decoder.decode(&data)?;
                self.take_marks();
                if let Some(chunk) = chunk {
                    self.chunks_out = true;
                    self.metrics.changes += chunk.changes;
                    self.hand_over(chunk)?;
                }
            }
            ReplicationEvent::Commit { lsn, end_lsn, .. } => {
                self.open_commit = None;
                let batch = self.decoder.commit(lsn.0)?;
                // A publication check's transaction (handed over now, once): its resyncs.
                let batch = match batch {
                    Some(b) if self.open_check.is_some() => b
                        .position
                        .and_then(|p| self.rejoined_at(p))
                        .map(|resync| Batch { changes: b.changes, ..resync })
                        .or(Some(b)),
                    batch => batch,
                };
                self.open_check = None;
                if let Some(b) = batch {
                    self.chunks_out = false;
                    self.handed_over = b.position;
                    self.metrics.transactions += 1;
                    self.metrics.changes += b.changes;
                    self.hand_over(b)?;
                }
                self.open_xid = None;
                idle(self, end_lsn.0);
            }
        }
        Ok(())
    }

    /// The stream broke: find out why, and open it again when that is right.
    fn recover(&mut self, fault: StreamFault) -> Result<(), LiveError> {
        if let Some(mut stream) = self.stream.take() {
            stream.abort();
        }
        let (cause, admin) = match fault {
            StreamFault::Fatal(e) => return Err(e),
            StreamFault::Lost { cause, admin } => (cause, admin),
        };
        if self.decoder.in_transaction() {
            if self.chunks_out {
                let commit_lsn = self.open_commit.map_or_else(|| "unknown".into(), |p| p.to_string());
                return Err(LiveError::LostInsideChunkedTransaction { cause, commit_lsn });
            }
            // Nothing of it was published: it comes again whole.
            let _ = self.decoder.finish();
        }
        self.decoder.resume_after(self.handed_over);
        // A check's message of a transaction not handed over comes again with it.
        self.open_check = None;
        let slot = self.config.slot.clone();
        let budget = self.config.retry_budget;
        let deadline = Instant::now() + budget;
        let mut attempts = 0u32;
        let mut backoff = Duration::from_millis(100);
        loop {
            attempts += 1;
            let last = match self.probe(budget, &slot) {
                Err(
                    e @ (LiveError::SlotDropped(_)
                    | LiveError::SlotBusy { .. }
                    | LiveError::SlotInvalidated { .. }),
                ) => return Err(e),
                Err(e) => e.to_string(),
                Ok(restarted) => {
                    if admin && !restarted {
                        return Err(LiveError::TerminatedByAdmin { slot, message: cause });
                    }
                    match self.open() {
                        Ok(()) => {
                            self.metrics.reconnects += 1;
                            return Ok(());
                        }
                        // Our previous walsender may hold the slot for a moment.
                        Err(LiveError::SlotBusy { holder, .. }) => holder,
                        Err(e @ (LiveError::Connect(_) | LiveError::Replication { .. })) => e.to_string(),
                        Err(e) => return Err(e),
                    }
                }
            };
            if Instant::now() + backoff > deadline {
                return Err(LiveError::ServerGone { slot, cause, budget, attempts, last });
            }
            thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// After the stream broke: whether the server restarted since last seen (its
    /// `pg_postmaster_start_time()` changed), reconnecting the second connection within `budget`.
    ///
    /// # Errors
    /// [`LiveError::SlotDropped`] when the slot is gone; [`LiveError::Side`] when the server
    /// does not answer within `budget`.
    fn probe(&mut self, budget: Duration, slot: &str) -> Result<bool, LiveError> {
        let row = self.side()?.run(
            budget,
            || "finding out why the replication stream broke".into(),
            |c| {
                c.query_one(
                    "SELECT pg_postmaster_start_time()::text, \
                     EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1::text), \
                     (SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1::text)",
                    &[&slot],
                )
            },
        )?;
        if !row.get::<_, bool>(1) {
            return Err(LiveError::SlotDropped(slot.to_owned()));
        }
        // A slot invalidated by max_slot_wal_keep_size: the checkpointer ends its walsender with
        // the administrator's SQLSTATE (57P01), but it can never resume.
        let wal_status: Option<String> = row.get(2);
        if wal_status.as_deref() == Some("lost") {
            return Err(LiveError::SlotInvalidated {
                slot: slot.to_owned(),
                message: "its wal_status is \"lost\": the WAL it needs was removed".into(),
            });
        }
        let start: String = row.get(0);
        let restarted = start != self.postmaster_start;
        self.postmaster_start = start;
        Ok(restarted)
    }

    /// [`Source::confirm`](crate::pipeline::Source::confirm) of the live source: confirms the
    /// slot up to `target` (the stream's watermark: never more) when that is past the confirmed
    /// position: hands it to the replication client, whose next standby status update (within
    /// [`LiveConfig::status_interval`](super::LiveConfig::status_interval)) carries it as the
    /// flush position. Cheap: call it as often as the watermark may have moved.
    pub(super) fn confirm_upto(&mut self, target: Position) {
        if self.confirmed.is_some_and(|c| c >= target) {
            return;
        }
        self.confirmed = Some(target);
        if let Some(stream) = &self.stream {
            stream.update_applied_lsn(Lsn(target.0));
        }
    }

    /// Ends the stream (a `CopyDone` to the server); the slot keeps the last position the
    /// server received. Dropping the source does the same.
    pub fn stop(&mut self) {
        if let Some(mut stream) = self.stream.take() {
            let _ = self
                .runtime
                .block_on(async { tokio::time::timeout(Duration::from_secs(2), stream.shutdown()).await });
        }
    }
}

/// What a replication client error means.
pub(super) enum StreamFault {
    /// The stream is gone (the server restarted, the network, an administrator): find out
    /// which, and reconnect if that is right. `admin` when the server said 57P01.
    Lost { cause: String, admin: bool },
    /// An error reconnecting does not cure.
    Fatal(LiveError),
}

/// The SQLSTATE in a pgwire-replication server error's text (`... (SQLSTATE 57P01)`).
fn sqlstate(message: &str) -> Option<&str> {
    let at = message.find("SQLSTATE ")? + "SQLSTATE ".len();
    message.get(at..at + 5)
}

/// What a replication client error means: a stream to open again, or an error reconnecting does not cure.
pub(super) fn classify_stream(e: &PgWireError, config: &LiveConfig) -> StreamFault {
    let slot = config.slot.clone();
    let message = e.to_string();
    let code = sqlstate(&message).unwrap_or("");
    let fatal = |e| StreamFault::Fatal(e);
    match e {
        PgWireError::Io(_) | PgWireError::Task(_) => StreamFault::Lost { cause: message, admin: false },
        // The client's worker ended, and the receive that was taking its result was dropped
        // unfinished (`poll` gives up a receive that found nothing: `take_queued`, the wait's
        // deadline), taking that result with it: what ended the worker is not known here, and
        // opening the stream again finds out (an error that lasts is the open's, then).
        PgWireError::Internal(m) if m.contains("already joined") => StreamFault::Lost {
            cause: format!("the replication client's worker ended ({message})"),
            admin: false,
        },
        PgWireError::Auth(m) => fatal(LiveError::Auth(m.clone())),
        _ if code.starts_with("57P") || code.starts_with("08") => {
            StreamFault::Lost { admin: code == "57P01", cause: message }
        }
        _ if code == "28P01" || code == "28000" => fatal(LiveError::Auth(message)),
        _ if code == "42501" && message.contains("output plugin") => {
            fatal(LiveError::PluginNotAllowed(message))
        }
        _ if code == "42501" => fatal(LiveError::NoReplicationPermission(user_of(config))),
        _ if code == "55006" => fatal(LiveError::SlotBusy { slot, holder: message }),
        _ if code == "42704" && message.contains("publication") => {
            fatal(LiveError::NoPublication(config.publication.clone()))
        }
        _ if code == "42704" => fatal(LiveError::SlotDropped(slot)),
        _ if code == "55000" && message.contains("cannot read from logical replication slot") => {
            fatal(LiveError::SlotInvalidated { slot, message })
        }
        _ => fatal(LiveError::Replication { slot, message }),
    }
}

pub(super) fn user_of(config: &LiveConfig) -> String {
    config
        .url
        .parse::<postgres::Config>()
        .ok()
        .and_then(|c| c.get_user().map(str::to_owned))
        .unwrap_or_else(|| "(unknown)".into())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// An idle batch goes just below where the server said it sent everything, past the last
    /// positioned batch, once an interval, and never inside an open transaction (between its
    /// chunks it would end the transaction for the sinks, which then refuse its next chunk).
    #[test]
    fn an_idle_batch_is_never_handed_over_inside_a_transaction() {
        use super::super::idle_position;
        let (p, second) = (|n: u64| Some(Position(n)), Duration::from_secs(1));
        let due = |sent, published, open, since: Option<Duration>| {
            idle_position(sent, published, open, since, second)
        };
        assert_eq!(due(p(100), p(50), false, None), p(99));
        assert_eq!(due(p(100), p(50), false, Some(second)), p(99), "an interval since the last");
        assert_eq!(due(p(100), None, false, None), p(99), "nothing handed over yet");
        // The case a 2M-row transaction met: `sent` (from a keepalive before its Begin) is past
        // the last commit, and the stream pauses between the transaction's chunks.
        assert_eq!(due(p(100), p(50), true, None), None, "a transaction is open");
        assert_eq!(due(p(100), p(99), false, None), None, "not past what was handed over");
        assert_eq!(due(p(100), p(50), false, Some(second / 2)), None, "within the interval");
        assert_eq!(due(None, p(50), false, None), None, "the server said nothing yet");
        assert_eq!(due(p(0), None, false, None), None, "nothing below 0");
    }

    #[test]
    fn server_errors_give_their_sqlstate() {
        assert_eq!(sqlstate("server error: FATAL: terminating connection (SQLSTATE 57P01)"), Some("57P01"));
        assert_eq!(sqlstate("no code"), None);
    }

    #[test]
    fn stream_errors_are_told_apart_by_sqlstate() {
        let config = LiveConfig::new("postgres://u@localhost/db", "s");
        let server = |m: &str| PgWireError::Server(m.to_owned());
        let fault = |e: PgWireError| classify_stream(&e, &config);
        assert!(matches!(
            fault(server("FATAL: terminating connection due to administrator command (SQLSTATE 57P01)")),
            StreamFault::Lost { admin: true, .. }
        ));
        assert!(matches!(
            fault(server("FATAL: crash (SQLSTATE 57P02)")),
            StreamFault::Lost { admin: false, .. }
        ));
        assert!(matches!(
            fault(PgWireError::Io(Arc::new(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)))),
            StreamFault::Lost { admin: false, .. }
        ));
        assert!(
            matches!(
                fault(PgWireError::Internal("replication worker already joined".into())),
                StreamFault::Lost { admin: false, .. }
            ),
            "a worker whose result a dropped receive took: reconnect, not stop"
        );
        assert!(matches!(
            fault(PgWireError::Internal("something else".into())),
            StreamFault::Fatal(LiveError::Replication { .. })
        ));
        assert!(matches!(
            fault(server("ERROR: replication slot \"s\" is active for PID 7 (SQLSTATE 55006)")),
            StreamFault::Fatal(LiveError::SlotBusy { .. })
        ));
        assert!(matches!(
            fault(server("ERROR: publication \"p\" does not exist (SQLSTATE 42704)")),
            StreamFault::Fatal(LiveError::NoPublication(_))
        ));
        assert!(matches!(
            fault(server("ERROR: replication slot \"s\" does not exist (SQLSTATE 42704)")),
            StreamFault::Fatal(LiveError::SlotDropped(_))
        ));
        assert!(matches!(
            fault(server("FATAL: must be superuser or replication role to start walsender (SQLSTATE 42501)")),
            StreamFault::Fatal(LiveError::NoReplicationPermission(u)) if u == "u"
        ));
    }
}
