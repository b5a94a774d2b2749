//! Connections: a small pool of sync `redis` connections, retries with backoff after a lost
//! connection or a transient server state, and the anchor connection that marks this process's
//! claims alive.
//!
//! # Retries
//! Every script the backend runs is safe to run twice (a retried publish is recognised by the
//! stream's publish count, a retried receive by its request number, a retried ack by the acked
//! set, a retried nack by the attempt, a retried claim by its token), so after a lost
//! connection [`Pool::run`] reconnects and runs it again, waiting between tries with an
//! exponential backoff (from 10 ms, doubling, at most 1 s) for as long as its budget allows.
//! A transient refusal is retried the same way, on the same connection: a server still loading
//! its data after a restart (`LOADING`), busy with a script (`BUSY`), failing over (`TRYAGAIN`,
//! `MASTERDOWN`, `CLUSTERDOWN`), or at its `maxmemory` with a policy that refuses writes (`OOM`:
//! it passes once acks let the log be trimmed, or the limit is raised); the command did not run
//! (Redis refuses a script's first write before the script changed anything, and a `MULTI`
//! whose command it refused runs nothing). When the budget runs out it is
//! [`BackendError::Server`] with its [`ServerReason`] (the pipeline's rule P8: a transient error
//! inside the retry budget is retried, never surfaced).
//! The one exception is a request sender's publish, which may land twice (requests are
//! at-least-once, [R2](crate::contract#r2)). When the budget runs out the caller gets
//! [`BackendError::Connection`]; the next call starts reconnecting again, after the backoff.
//!
//! # Claims and the anchor
//! A claim (a lane's attached consumer, the stream's fan-out) is stored in Redis as
//! `<client id>:<nonce>:<token>`: the client id is that of this stream's anchor connection,
//! which does nothing but stay open while the stream or any of its ends lives; the nonce is
//! 128 random bits drawn when the stream is built, carried in the name of every connection of
//! the stream (`CLIENT SETNAME lanestream:<stream>{<nonce>}`). Another process may take a claim
//! over only once no connection with that client id *and* that nonce in its name is connected
//! (`CLIENT LIST ID`), which Redis sees as soon as the holder's process dies, with no lease to
//! time out. The id alone would not do: Redis numbers clients from 1 again after a restart, so
//! a dead holder's id is soon some unrelated connection's; the nonce is never reused. If the
//! anchor's connection drops and comes back with a new id, this process moves its live claims
//! over.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

/// How many times [`Pool::run`] sends a call again that failed with `NOSCRIPT` although it had
/// just loaded its script (the server's script cache flushed in between).
const SCRIPT_RELOADS: u32 = 3;

use ::redis::{Client, Connection, RedisError, RedisResult};

use crate::error::{BackendError, ServerReason};
use crate::sync::lock;

/// How long to keep retrying, and the timeouts, of one stream's connections.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    /// How long a blocking operation keeps reconnecting after a lost connection before it
    /// returns [`BackendError::Connection`].
    pub(crate) retry_for: Duration,
    /// The first wait between reconnects; it doubles up to `backoff_max`.
    pub(crate) backoff_min: Duration,
    /// The longest wait between reconnects.
    pub(crate) backoff_max: Duration,
    /// Socket read and write timeout (longer than any blocking wait the backend sends).
    pub(crate) io_timeout: Duration,
    /// The longest single blocking wait for a wake-up token; a lost token costs at most this.
    pub(crate) wait_slice: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            retry_for: Duration::from_secs(5),
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_secs(1),
            io_timeout: Duration::from_secs(10),
            wait_slice: Duration::from_millis(500),
        }
    }
}

/// How long [`Pool::run`] may keep retrying.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Budget {
    /// One try on a pooled connection, and one more on a fresh one if the pooled one was dead
    /// (the never-waiting forms: `try_publish`, `try_recv`, drops).
    Once,
    /// Retry with backoff until the stream's `retry_for` has passed.
    Retry,
}

struct Backoff {
    delay: Duration,
    /// No new connection is attempted before this instant (after a failure).
    not_before: Option<Instant>,
}

struct Anchor {
    conn: Option<Connection>,
    id: u64,
}

/// One registered live claim of this process: which hash field holds it, and its value.
struct Claim {
    key: String,
    field: &'static str,
    value: String,
}

/// The stream's connections.
pub(crate) struct Pool {
    client: Client,
    /// 32 hex digits drawn at random for this stream (see "Claims and the anchor").
    nonce: String,
    /// `CLIENT SETNAME` of every connection: `lanestream:<stream name>{<nonce>}`.
    client_name: String,
    pub(crate) settings: Settings,
    idle: Mutex<Vec<Connection>>,
    backoff: Mutex<Backoff>,
    anchor: Mutex<Anchor>,
    claims: Mutex<HashMap<u64, Claim>>,
    /// The stream's incarnation (the meta hash's `inc`) when it was built.
    incarnation: Mutex<Option<String>>,
    next_token: Mutex<u64>,
    last_error: Mutex<Option<String>>,
    /// Connections found lost or not made (see [`Pool::connection_errors`]).
    connection_errors: AtomicU64,
}

/// Whether `e` means the connection is gone (reconnect), rather than a refused command.
fn is_connection_error(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
}

/// The server's error code of `e`: for an aborted `MULTI`/`EXEC` (`EXECABORT`), that of the
/// queued command the server refused (the cause); `None` if `e` is no server error.
fn code(e: &RedisError) -> Option<String> {
    if e.kind() == ::redis::ErrorKind::Server(::redis::ServerErrorKind::ExecAbort) {
        let inner = e.clone().into_server_errors();
        if let Some((_, first)) = inner.as_deref().and_then(|errs| errs.first()) {
            return Some(first.code().to_owned());
        }
    }
    e.code().map(str::to_owned)
}

/// Whether `e` is a transient refusal: a server state that passes (loading its data after a
/// restart, a long script, a failover, writes refused at `maxmemory`), the command not run;
/// retried like a lost connection, on the same connection.
pub(crate) fn is_transient(e: &RedisError) -> bool {
    code(e).is_some_and(|c| {
        matches!(c.as_str(), "LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "CLUSTERDOWN" | "OOM")
    })
}

/// The reason to give for server error `e`.
pub(crate) fn reason(e: &RedisError) -> ServerReason {
    code(e).map_or(ServerReason::UnexpectedReply, |c| ServerReason::from_code(&c))
}

/// 128 random bits as 32 hex digits, from the OS; from the clock and the process id should the
/// OS have none to give (still unique in practice, as no two processes share both).
fn nonce() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::getrandom(&mut bytes).is_err() {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        bytes = (nanos ^ (u128::from(std::process::id()) << 96)).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The longest a new connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Idle connections kept for reuse; more are closed when handed back.
const MAX_IDLE: usize = 16;

impl Pool {
    pub(crate) fn new(client: Client, settings: Settings, stream: &str) -> Pool {
        let name: String = stream.chars().map(|c| if c.is_ascii_graphic() { c } else { '_' }).collect();
        let nonce = nonce();
        Pool {
            client,
            client_name: format!("lanestream:{name}{{{nonce}}}"),
            nonce,
            settings,
            idle: Mutex::new(Vec::new()),
            backoff: Mutex::new(Backoff { delay: settings.backoff_min, not_before: None }),
            anchor: Mutex::new(Anchor { conn: None, id: 0 }),
            claims: Mutex::new(HashMap::new()),
            incarnation: Mutex::new(None),
            next_token: Mutex::new(0),
            last_error: Mutex::new(None),
            connection_errors: AtomicU64::new(0),
        }
    }

    /// The message of the last error any operation of the stream met.
    pub(crate) fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }

    pub(crate) fn record(&self, message: String) {
        *lock(&self.last_error) = Some(message);
    }

    /// How many times a connection of the stream was found lost or could not be made, the
    /// ones a retry recovered from included.
    pub(crate) fn connection_errors(&self) -> u64 {
        // Relaxed: a monotonic statistics counter; nothing is published through it.
        self.connection_errors.load(Ordering::Relaxed)
    }

    /// Records a lost (or not made) connection: the message, and one more in the count.
    fn record_connection_error(&self, message: String) {
        // Relaxed: see `connection_errors`.
        self.connection_errors.fetch_add(1, Ordering::Relaxed);
        self.record(message);
    }

    fn connect(&self) -> RedisResult<Connection> {
        // Connecting gives up sooner than a command: an unreachable server should not hold a
        // drop or a `try_` call for the whole I/O timeout.
        let connect_timeout = CONNECT_TIMEOUT.min(self.settings.io_timeout);
        let conn = self.client.get_connection_with_timeout(connect_timeout)?;
        conn.set_read_timeout(Some(self.settings.io_timeout))?;
        conn.set_write_timeout(Some(self.settings.io_timeout))?;
        let mut conn = conn;
        ::redis::cmd("CLIENT").arg("SETNAME").arg(&self.client_name).query::<()>(&mut conn)?;
        Ok(conn)
    }

    /// A pooled connection, or a new one. `Err` (after recording why) if none could be made.
    fn take(&self) -> Result<(Connection, bool), RedisError> {
        if let Some(conn) = lock(&self.idle).pop() {
            return Ok((conn, true));
        }
        self.connect().map(|c| (c, false))
    }

    fn put(&self, conn: Connection) {
        let mut idle = lock(&self.idle);
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }

    /// After a lost connection: every idle connection is suspect (a restarted server drops them
    /// all); the next reconnect waits for the backoff, which doubles.
    fn failed(&self) -> Duration {
        lock(&self.idle).clear();
        let mut b = lock(&self.backoff);
        let wait = b.delay;
        b.not_before = Some(Instant::now() + wait);
        b.delay = (b.delay * 2).min(self.settings.backoff_max);
        wait
    }

    /// After a transient refusal: the connections are fine, but the next try waits for the
    /// backoff, which doubles (the backoff's instant is not set: a pooled connection may be
    /// used at once by another call, and meets the same refusal).
    fn failed_transient(&self) -> Duration {
        let mut b = lock(&self.backoff);
        let wait = b.delay;
        b.delay = (b.delay * 2).min(self.settings.backoff_max);
        wait
    }

    fn succeeded(&self) {
        let mut b = lock(&self.backoff);
        b.delay = self.settings.backoff_min;
        b.not_before = None;
    }

    /// How long to wait before the next connection attempt (zero if none is pending).
    fn backoff_left(&self) -> Duration {
        lock(&self.backoff).not_before.map_or(Duration::ZERO, |t| t.saturating_duration_since(Instant::now()))
    }

    /// Runs `f` on a connection (`f` gets the try number, 0 first), reconnecting and retrying
    /// after a lost connection within `budget`. A server error is returned at once, but for
    /// `NOSCRIPT` after a reload: `f` runs again, up to [`SCRIPT_RELOADS`] times.
    pub(crate) fn run<R>(
        &self,
        budget: Budget,
        mut f: impl FnMut(&mut Connection, u32) -> RedisResult<R>,
    ) -> Result<R, BackendError> {
        let give_up = match budget {
            Budget::Once => Instant::now(),
            Budget::Retry => Instant::now() + self.settings.retry_for,
        };
        let mut tries = 0u32;
        let mut fresh_retry_used = false;
        let mut script_reloads = 0u32;
        loop {
            // Respect the backoff of an earlier failure before connecting again.
            let wait = self.backoff_left();
            if !wait.is_zero() && lock(&self.idle).is_empty() {
                if Instant::now() + wait > give_up {
                    return Err(BackendError::Connection);
                }
                thread::sleep(wait);
            }
            let outcome = match self.take() {
                Ok((mut conn, pooled)) => match f(&mut conn, tries) {
                    Ok(r) => {
                        self.put(conn);
                        self.succeeded();
                        if tries > 0 {
                            // The server may have dropped every client, the anchor too.
                            let _ = self.anchor_id();
                        }
                        return Ok(r);
                    }
                    // `NOSCRIPT` right after the call loaded the script: the server's script
                    // cache was flushed in between (`SCRIPT FLUSH`, a failover). The script did
                    // not run, so the call is sent again (it loads the script again), a few times.
                    Err(e)
                        if e.kind() == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript)
                            && script_reloads < SCRIPT_RELOADS =>
                    {
                        script_reloads += 1;
                        self.put(conn);
                        continue;
                    }
                    // A transient refusal (`LOADING` after a restart...): the command did not run;
                    // the connection is fine. Wait (the backoff) and send it again.
                    Err(e) if is_transient(&e) => {
                        self.record(format!("redis: {e}"));
                        self.put(conn);
                        tries += 1;
                        let wait = self.failed_transient();
                        if Instant::now() + wait > give_up {
                            return Err(BackendError::Server(reason(&e)));
                        }
                        thread::sleep(wait);
                        continue;
                    }
                    Err(e) if !is_connection_error(&e) => {
                        self.record(format!("redis: {e}"));
                        self.put(conn);
                        return Err(BackendError::Server(reason(&e)));
                    }
                    Err(e) => (e, pooled),
                },
                Err(e) => (e, false),
            };
            let (e, pooled) = outcome;
            self.record_connection_error(format!("redis connection: {e}"));
            tries += 1;
            if pooled && !fresh_retry_used {
                // A pooled connection may have died while idle: one more try on a fresh one.
                fresh_retry_used = true;
                lock(&self.idle).clear();
                continue;
            }
            let wait = self.failed();
            if Instant::now() + wait > give_up {
                return Err(BackendError::Connection);
            }
            thread::sleep(wait);
        }
    }

    /// A fresh incarnation for a stream this build may create (random, as the nonce).
    pub(crate) fn fresh_incarnation(&self) -> String {
        nonce()
    }

    /// Records the stream's incarnation, as its build read it.
    pub(crate) fn set_incarnation(&self, incarnation: String) {
        *lock(&self.incarnation) = Some(incarnation);
    }

    /// After an epoch check refused an end (fenced, detached): [`BackendError::StateLost`] if
    /// the stream's incarnation in meta hash `meta` is gone or another one (the state this end
    /// knew is lost: nobody took the lane over), else `Ok` (a real take-over; also when the
    /// incarnation cannot be read).
    pub(crate) fn check_state(&self, meta: &str) -> Result<(), BackendError> {
        let Some(ours) = lock(&self.incarnation).clone() else { return Ok(()) };
        let now = self
            .run(Budget::Retry, |c, _| ::redis::cmd("HGET").arg(meta).arg("inc").query::<Option<String>>(c));
        match now {
            Ok(now) if now.as_deref() != Some(ours.as_str()) => {
                self.record(format!(
                    "lanestream: the stream's state is gone ({meta} holds incarnation {now:?}, built as {ours:?})"
                ));
                Err(BackendError::StateLost)
            }
            _ => Ok(()),
        }
    }

    /// The stream's nonce (32 hex digits, unique to this build of the stream in this process):
    /// with a [`token`](Pool::token), a key name no other waiter anywhere uses.
    pub(crate) fn nonce(&self) -> &str {
        &self.nonce
    }

    /// A fresh claim token, unique in this process.
    pub(crate) fn token(&self) -> u64 {
        let mut t = lock(&self.next_token);
        *t += 1;
        *t
    }

    /// The anchor connection's client id, reconnecting it (and moving this process's claims to
    /// the new id) if it was lost.
    pub(crate) fn anchor_id(&self) -> Result<u64, BackendError> {
        let mut anchor = lock(&self.anchor);
        if let Some(conn) = anchor.conn.as_mut() {
            match ::redis::cmd("PING").query::<String>(conn) {
                Ok(_) => return Ok(anchor.id),
                // A refusal (`LOADING`...) came over the connection: it is alive.
                Err(e) if !is_connection_error(&e) => return Ok(anchor.id),
                Err(e) => self.record_connection_error(format!("redis connection (anchor): {e}")),
            }
        }
        anchor.conn = None;
        let mut conn = self.connect().map_err(|e| {
            self.record_connection_error(format!("redis connection: {e}"));
            BackendError::Connection
        })?;
        let id: u64 = ::redis::cmd("CLIENT").arg("ID").query(&mut conn).map_err(|e| {
            self.record(format!("redis: CLIENT ID: {e}"));
            BackendError::Connection
        })?;
        let old = std::mem::replace(&mut anchor.id, id);
        anchor.conn = Some(conn);
        drop(anchor);
        if old != 0 && old != id {
            self.move_claims(old, id);
        }
        Ok(id)
    }

    /// Moves every registered claim from client id `old` to `new`, where Redis still holds it.
    fn move_claims(&self, old: u64, new: u64) {
        let script = ::redis::Script::new(&super::scripts::source(super::scripts::MOVE_CLAIM));
        let claims: Vec<(u64, String, &'static str, String)> = lock(&self.claims)
            .iter()
            .filter(|(_, c)| c.value.starts_with(&format!("{old}:{}:", self.nonce)))
            .map(|(t, c)| (*t, c.key.clone(), c.field, c.value.clone()))
            .collect();
        for (token, key, field, value) in claims {
            let moved_to = format!("{new}:{}:{token}", self.nonce);
            let moved = self.run(Budget::Once, |c, _| {
                script.key(&key).arg(field).arg(&value).arg(&moved_to).invoke::<i64>(c)
            });
            if moved == Ok(1) {
                if let Some(claim) = lock(&self.claims).get_mut(&token) {
                    claim.value = moved_to;
                }
            }
        }
    }

    /// The claim value for `token`, registered as live (under `key`'s `field`) until
    /// [`forget`](Pool::forget).
    pub(crate) fn claim(&self, token: u64, key: &str, field: &'static str) -> Result<String, BackendError> {
        let value = format!("{}:{}:{token}", self.anchor_id()?, self.nonce);
        lock(&self.claims).insert(token, Claim { key: key.to_owned(), field, value: value.clone() });
        Ok(value)
    }

    /// The current value of a registered claim.
    pub(crate) fn claim_value(&self, token: u64) -> Option<String> {
        lock(&self.claims).get(&token).map(|c| c.value.clone())
    }

    /// Forgets a claim (its end was dropped, or the claim failed).
    pub(crate) fn forget(&self, token: u64) {
        lock(&self.claims).remove(&token);
    }

    /// Whether the end holding claim `holder` (`<client id>:<nonce>:<token>`) is alive: ours
    /// (our nonce) if it is registered here, another process's if a connection with its client
    /// id and its nonce in its name is connected. A claim of an earlier version
    /// (`<client id>:<token>`) is alive while its client id is connected.
    pub(crate) fn holder_alive(&self, holder: &str) -> Result<bool, BackendError> {
        let parts: Vec<&str> = holder.split(':').collect();
        let (id, nonce) = match parts[..] {
            [id, nonce, _token] => (id, Some(nonce)),
            [id, _token] => (id, None),
            _ => return Ok(false),
        };
        let Ok(id) = id.parse::<u64>() else { return Ok(false) };
        if nonce == Some(self.nonce.as_str()) {
            return Ok(lock(&self.claims).values().any(|c| c.value == holder));
        }
        let listed: String =
            self.run(Budget::Retry, |c, _| ::redis::cmd("CLIENT").arg("LIST").arg("ID").arg(id).query(c))?;
        let Some(line) = listed.lines().find(|l| !l.trim().is_empty()) else { return Ok(false) };
        Ok(match nonce {
            Some(nonce) => {
                let tag = format!("{{{nonce}}}");
                line.split(' ').any(|f| f.strip_prefix("name=").is_some_and(|name| name.ends_with(&tag)))
            }
            None => true,
        })
    }

    /// Blocks until a token arrives on `key` (consumed) or `timeout` passes; `Ok(true)` if one
    /// came.
    pub(crate) fn wait_token(&self, key: &str, timeout: Duration) -> Result<bool, BackendError> {
        let secs = timeout.as_secs_f64().max(0.001);
        self.run(Budget::Once, |c, _| {
            let got: Option<(String, String)> = ::redis::cmd("BLPOP").arg(key).arg(secs).query(c)?;
            Ok(got.is_some())
        })
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Closing the anchor tells every other process that this one's claims are gone.
        lock(&self.anchor).conn = None;
    }
}
