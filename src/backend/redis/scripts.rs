//! The Lua scripts: every step that reads and then writes a lane's state runs as one script, so
//! Redis runs it atomically (no other command interleaves), which is what makes the epoch fence
//! hold: an ack and a re-attach are each one script, so the ack lands before the take-back or
//! is refused after it, never both.
//!
//! # Keys of one lane
//! A lane's keys share its base `B` (`{P}:l:<sink>` for a sink lane, `{P}:r` for the request
//! lane; `{P}` is the stream's hash-tagged prefix, so every key of a stream is in one cluster
//! slot):
//!
//! | key | type | holds |
//! |---|---|---|
//! | `B` | hash | `cap` capacity; `about` a text longer than 64 bytes (keeps the hash in the hashtable encoding: see `stream.rs`); `fan` `1` for a sink lane (its publishes are the log's entries); `pub` items published; `last` the lane's newest entry number; `lp` last published position; `rd` newest entry read; `nread` items read; `an` newest entry of the contiguous acked prefix; `ai` items in it; `ap` its position; `oo` entries acked out of order; `rdl` redeliveries (deliveries are `nread + rdl`); `nrel` entries released; `closed`; `ep` consumer epoch, `holder` its claim; `w` a receive waits; `pw` a publisher waits; `ww` a watermark waiter waits (see "Watermark waiters"); `lq` the last receive, for a retried one: its request number when it delivered a new entry (entry `rd`, attempt 1), `request:entry:attempt` when it redelivered one |
//! | `B:rel` | sorted set | released entries, waiting for redelivery (score = member = entry number) |
//! | `B:ack` | sorted set | entries acked while an earlier one is out: score = entry number, member = `n:position` |
//! | `B:bell:<epoch>` | list | a wake-up token for the consumer of that epoch (at most one) |
//! | `B:pbell` | list | a wake-up token for waiting publishers (at most one) |
//! | `B:att` | hash | entry number → its redeliveries so far (only for entries released at least once, until acked) |
//! | `B:al` | stream | acks not folded yet, id `<epoch>-<n>`, field `p` the position (see "The ack log") |
//! | `B:dl` | stream | deliveries of new entries not folded yet, id `<epoch>-<n>` (see "The delivery log") |
//!
//! Entries live in a log stream: `{P}:log` for the sink lanes, written once by the stream's
//! fan-out and read by every sink lane (see "The fan-out"), id `<n>-<fan-out epoch>` for entry
//! number `n`; `{P}:req` for the request lane, id `n-0`. An entry is read by its number
//! (`XRANGE L n n`) and has fields `d` (the codec's bytes) and `p` (the position, or empty; on
//! the sink log, the last position published as of that entry). Positions are stored as
//! 20-digit zero-padded decimals, so that Lua (whose numbers are doubles) compares them as
//! strings, exactly. The meta hash `{P}:meta` holds the stream's shape (`sinks`, `mode`), its
//! incarnation `inc`, the fan-out's epoch `fe` and claim `fh`, and the logs' trim floors
//! (`trim`, `rtrim`). No consumer group is used: a lane's hash holds what a group's pending list
//! would.
//!
//! # Every lane owns every entry of its log
//! Each sink lane reads every entry of the sink log (an entry published to one lane is a gap
//! for the others, passed on the way: see "The fan-out"), and the request lane every entry of
//! its own log, so entry numbers have no gaps: a lane's next entry is `rd + 1`, its first
//! unacked one `an + 1`, and its newest `last` is the log's newest. A receive reads on without
//! looking its entry up, an ack knows whether it is in order from `an` and takes the position
//! from the acker (the delivered item's own), and the trim floor is the least `an` of the
//! log's lanes.
//!
//! A lane's delivered, unacked entries are those after `an` up to `rd` that are not in `B:ack`.
//! A new entry's delivery writes nothing to the log (no `XREADGROUP`, no `XCLAIM`), an ack no
//! `XACK`; a released entry counts its redeliveries in `B:att` (attempt = 1 + that count),
//! which a nack checks for staleness, and an attach releases the entries after `an` up to `rd`
//! that are not acked. A stream command inside a script whose reply is an array (`XRANGE`) was
//! the costliest step of the hot path (2 to 6 µs each, against about 1 µs for the same command
//! sent plainly); payloads are read by a plain `XRANGE` pipelined after the receive script
//! (`RECEIVE`).
//!
//! # The ack log
//! A first delivery's ack is not a script: a plain `XADD B:al <epoch>-<n> p <position>` to the
//! lane's ack log (a stream), with `HMGET B pw ww` in the same round trip (a waiting publisher,
//! and watermark waiters, are rung by the acker). Redis refuses an `XADD` whose id is not above
//! the stream's last id, which makes it the epoch fence: an attach first folds the log (below)
//! and then sets its last id to `<new epoch>-0` (`XSETID`), so an ack of the old epoch either
//! landed before, and counts, or is refused after; never both. An ack of an entry below one
//! acked earlier in the epoch (out of order) is refused too. A refused `XADD`, a retried ack and
//! a redelivery's ack run `ACK`, which tells them apart (and answers `detached` to the first
//! kind). The log's records are applied to the acked prefix (`an`, `ai`, `ap`, `oo`, `B:ack`) by
//! `fold`, which every script and read of that prefix runs first: the publish that finds the
//! lane full by its last fold, an attach, a nack, `ACK`, the trim, the stats, the watermark,
//! `acked`, `is_idle`. The ids grow, so k records of this epoch from `an + 1` to `an + k` are
//! exactly those entries: the common fold reads two records, however many there are.
//! (`SLOWLOG`: the ack script took 4.6-6.2 µs per batch, the `XADD` takes 0.7-0.8 µs.)
//!
//! # The delivery log
//! Likewise, the receive of the new entry the consumer expects (`rd + 1`, when no entry of its
//! epoch waits for redelivery as far as the consumer knows: no nack since its last new delivery)
//! is a plain `XADD B:dl <epoch>-<n> p ''` to the lane's delivery log with the entry's `XRANGE`,
//! in one round trip. The `XADD` is refused after a re-attach (the attach folds the log and
//! raises its last id to `<new epoch>-0`) and for an entry recorded before. `fold_dl` moves `rd`
//! (and `nread`) up to the newest record, never above the lane's newest entry: a record of an
//! entry not published yet (the `XRANGE` found nothing) is dropped, and the consumer asks for
//! that entry again. A refused record, or a missing entry, sends the consumer to `RECEIVE`
//! (which folds first, and delivers, once, an entry recorded but not received: a lost reply).
//! The receive script, an attach, a nack and the stats fold first.
//!
//! # The fan-out
//! The sink lanes are published to only through the stream's one fan-out (`RedisFanout`):
//! every entry of the log goes to every lane (an entry published to one lane is a *gap* for the
//! others), so every lane owns every entry of the log (above). Its publishing and the trim:
//! - The fan-out publishes entry `n` with one plain `XADD` of id `<n>-<fan-out epoch>` of the
//!   entry (with its payload, once) to the log, pipelined with `HMGET`s of each lane's `w` and
//!   `ep` (a receive waiting is rung after); a run of entries is one pipeline of their `XADD`s
//!   and those `HMGET`s once. The log is also the lanes' publish record: `fold_pl` moves a sink
//!   lane's `pub` and `last` to the log's newest entry and `lp` to that entry's `p`, which is
//!   the last position published as of that entry (the item's own, or for an unpositioned item
//!   the one before it: positions rise across the log), so the newest entry alone tells all.
//!   Every trim folds the lanes first. (`INFO commandstats`: a record per lane in the publish's
//!   `MULTI` cost three `XADD`s of about 1.2 µs each per batch with three sinks; looking back
//!   for the last positioned entry read every unpositioned entry's payload into Lua, about
//!   50 ms for sixty chunks of 256 KB in one script.)
//! - Claiming the fan-out (`CLAIM_FANOUT`) raises the fan-out epoch `fe` in the meta hash, and the
//!   log's last id to `<pub + 1>-<fe - 1>`: an older fan-out's next publish is refused. Closing
//!   any lane raises it to [`LOG_FENCE_ID`]: the fan-out publishes no more (as the in-memory
//!   fan-out, which refuses while any lane is closed), while the other lanes' consumers drain
//!   what was published.
//! - The gate (`PUBLISH_FANOUT`) checks every lane (and answers the room as the least `ai + cap`,
//!   and the last position); it runs when the fan-out cannot prove room or does not know the
//!   last position, on every 64th entry (it trims the log below the least acked prefix of all
//!   the lanes) and after a refused `XADD`.
//! - An entry published to one lane carries a field `t`, that lane's sink. Another lane's
//!   consumer that receives it acks it on its way past (a plain ack at the item's position) and
//!   receives on: the gap costs that lane one round trip and no delivery. A receive that would
//!   give an entry again (a retried request, a delivery recorded but not received) skips it if
//!   the lane has acked it since: only a gap is acked without being received (its ack's reply
//!   lost), and the entry may be trimmed by then.
//!
//! # The request lane
//! Any number of senders publish requests with `PUBLISH` (one script per request: the checks,
//! the entry `last + 1`, the rings); its consumer's path is a sink lane's.
//!
//! # Watermark waiters
//! A thread waiting for the watermark (`RedisStream::wait_watermark`) has a wake-up key of its
//! own, `{P}:wbell:<id>`. `WATERMARK` reads the watermark and, for a waiter, adds its key to the
//! set `{P}:ww` and sets every sink lane's `ww`, in the same script: an ack that lands after it
//! reads `ww` set (the ack log's `HMGET`, or `ACK`'s reply) and runs `RING_WATERMARK`, which
//! clears every lane's `ww`, pushes a token to every key in the set and empties it; an ack that
//! landed before it is in what it read. So no wake-up is lost; a waiter registers again before
//! each read. Closing a lane rings them too (the watermark may be final then).

mod helpers;
pub(crate) use helpers::source;

/// Publish one request (any number of senders: see "The request lane"): entry `last + 1`.
///
/// KEYS: lane hash, log, meta. ARGV: base, payload, position (padded, or empty), the meta field
/// of the log's trim floor, then the lane's hash (every 64th entry trims the log below its
/// acked prefix).
///
/// A full lane sets `pw` (a publisher waits: the ack that makes room rings `B:pbell`); `w` set
/// by a receive that found nothing makes the publish ring the consumer's bell; a publish that
/// leaves room rings the next waiting sender.
pub(crate) const PUBLISH: &str = r#"
local H, L, M = KEYS[1], KEYS[2], KEYS[3]
local base, payload, pos = ARGV[1], ARGV[2], ARGV[3]
local h = redis.call('HMGET', H, 'pub', 'closed', 'lp', 'ai', 'cap', 'ep', 'last', 'w')
local pub, ai, cap, last = num(h[1]), num(h[4]), num(h[5]), num(h[7])
local lp = h[3] or ''
if h[2] == '1' then return {'closed'} end
if pos ~= '' and lp ~= '' and pos <= lp then return {'regressed', lp} end
if pub + 1 - ai >= cap then
  -- The acks since the last fold may have made room (for this publish, or for the next sender).
  fold(H)
  ai = num(redis.call('HGET', H, 'ai'))
end
if pub - ai >= cap then
  redis.call('HSET', H, 'pw', '1')
  return {'full'}
end
local n = last + 1
redis.call('XADD', L, s(n) .. '-0', 'd', payload, 'p', pos)
if pos ~= '' then
  redis.call('HSET', H, 'pub', s(pub + 1), 'last', s(n), 'lp', pos, 'w', '0')
else
  redis.call('HSET', H, 'pub', s(pub + 1), 'last', s(n), 'w', '0')
end
if h[8] == '1' then ring(base .. ':bell:' .. (h[6] or '0')) end
if pub + 1 - ai < cap then ring(base .. ':pbell') end
if n % 64 == 0 then trim(L, M, ARGV[4], 5) end
return {'ok', n}
"#;

/// The last id of the sink log once a lane is closed: the highest millisecond part Redis takes,
/// above any entry, so that no `XADD` of the fan-out lands (see "The fan-out").
pub(crate) const LOG_FENCE_ID: &str = "18446744073709551615-0";

/// Receive one item: a released one first (lowest entry first), else the next new one, `rd + 1`.
///
/// KEYS: lane hash, released, log, attempts. ARGV: epoch, request number (a retried request
/// whose reply was lost gets the same delivery again), the entry number the client expects next
/// (`0`: none; an expected entry at or below `rd`, after the fold of the delivery log, was
/// recorded but not received, and is delivered now).
///
/// Replies `{'item', n, attempt, payload}` (with a fifth element, the entry's target sink, for
/// an entry of the sink log published to one lane: see "The fan-out"), or `{'item', n, 1}`
/// without the payload when it delivers the new entry the client expected: the client reads that
/// entry's payload with a plain `XRANGE` sent in the same round trip, after this script (entries
/// are never changed, and an unacked one is never trimmed), so the payload does not cross Lua.
/// A delivery writes nothing to the log.
pub(crate) const RECEIVE: &str = r#"
local H, R, L, T = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local rq = ARGV[2]
fold_dl(H)
local h = redis.call('HMGET', H, 'ep', 'lq', 'nrel', 'rd', 'last')
if (h[1] or '0') ~= ARGV[1] then return {'detached'} end
local lq = h[2]
-- Whether entry `n` was acked since it was delivered: a gap of the sink log, acked on the way
-- past with its reply lost (see "The fan-out"; the entry may be trimmed by now). Not delivered
-- again.
local function acked_since(n)
  fold(H)
  local a = redis.call('HMGET', H, 'an', 'oo')
  return is_acked(H .. ':ack', num(a[1]), num(a[2]), n)
end
if lq and string.sub(lq, 1, #rq + 1) == rq .. ':' then
  -- A retried request (`lq` is `request:entry:attempt`): the same delivery again.
  local m, a = string.match(lq, ':(%d+):(%d+)$')
  if not acked_since(tonumber(m)) then
    local e = redis.call('XRANGE', L, m, m)
    return {'item', tonumber(m), tonumber(a), e[1][2][2], e[1][2][6]}
  end
end
local nrel = tonumber(h[3] or 0)
if nrel > 0 then
  local r = redis.call('ZRANGE', R, 0, 0)
  local n = tonumber(r[1])
  redis.call('ZREM', R, r[1])
  local e = redis.call('XRANGE', L, s(n), s(n))
  if not e[1] then return redis.error_reply('lanestream: log entry ' .. s(n) .. ' is missing') end
  local attempt = 1 + redis.call('HINCRBY', T, s(n), 1)
  redis.call('HSET', H, 'nrel', nrel - 1, 'lq', rq .. ':' .. s(n) .. ':' .. s(attempt))
  redis.call('HINCRBY', H, 'rdl', 1)
  return {'item', n, attempt, e[1][2][2], e[1][2][6]}
end
local rd = tonumber(h[4] or 0)
local expect = tonumber(ARGV[3])
if expect > 0 and expect <= rd and not acked_since(expect) then
  -- Recorded in the delivery log, not received: a receive whose reply was lost, or whose entry
  -- was not published yet. Delivered now (its payload from the client's `XRANGE`).
  redis.call('HSET', H, 'lq', rq .. ':' .. ARGV[3] .. ':1')
  return {'item', expect, 1}
end
if rd >= tonumber(h[5] or 0) then
  local c = redis.call('HMGET', H, 'closed', 'w')
  if c[1] == '1' then return {'closed'} end
  if c[2] ~= '1' then redis.call('HSET', H, 'w', '1') end
  return {'empty'}
end
-- Entry numbers have no gaps: items read = `rd` (`nread` is kept for `STATS`).
local n = rd + 1
local payload, target
if expect ~= n then
  local e = redis.call('XRANGE', L, s(n), s(n))
  if not e[1] then return redis.error_reply('lanestream: log entry ' .. s(n) .. ' is missing') end
  payload, target = e[1][2][2], e[1][2][6]
end
redis.call('HSET', H, 'rd', n, 'nread', n, 'lq', rq .. ':' .. s(n) .. ':1')
return {'item', n, 1, payload, target}
"#;

/// Ack entry `n`: fenced by the epoch; advances the contiguous acked prefix (`oo` counts the
/// entries acked out of order, in `B:ack`), whose first unacked entry is `an + 1`, with the
/// position the acker gives. A first delivery's first ack try is a record in the ack log
/// instead; this script (which folds that log first) takes the ones the log refused, retries
/// and redeliveries. Eight keys and arguments: each costs a run about 0.1 µs.
///
/// KEYS: lane hash (also the base of its keys), acked, attempts. ARGV: epoch, n, the entry's
/// position (padded, or empty), retry (`1` when the first try's reply was lost), the delivery's
/// attempt (a redelivered entry's count in `B:att` goes with its ack). Replies `{'ok'}`,
/// `{'ok', 'ww'}` (acked, and a watermark waiter waits: the client runs `RING_WATERMARK`),
/// `{'detached'}` or `{'unknown'}`.
pub(crate) const ACK: &str = r#"
local H, A = KEYS[1], KEYS[2]
local n = tonumber(ARGV[2])
fold(H)
local h, settled = ack_fence(H, A, ARGV[1], n, ARGV[4])
if not h then return settled end
local an, oo = num(h[2]), num(h[4])
local reply = {'ok'}
if h[6] == '1' then reply = {'ok', 'ww'} end
if ARGV[5] ~= '1' then redis.call('HDEL', KEYS[3], s(n)) end
if n ~= an + 1 then
  redis.call('ZADD', A, n, s(n) .. ':' .. ARGV[3])
  redis.call('HSET', H, 'oo', oo + 1)
  return reply
end
local oo0 = oo
local moved, ap
an, oo, moved, ap = absorb(A, n, oo, ARGV[3])
local ai = num(h[3]) + 1 + moved
-- Only the fields that change (each costs): the common in-order ack of a positioned item
-- writes three.
if oo == oo0 and h[5] ~= '1' and ap ~= '' then
  redis.call('HSET', H, 'an', an, 'ai', ai, 'ap', ap)
else
  local args = {'HSET', H, 'an', an, 'ai', ai, 'oo', oo, 'pw', '0'}
  if ap ~= '' then
    table.insert(args, 'ap')
    table.insert(args, ap)
  end
  redis.call(unpack(args))
end
if h[5] == '1' then ring(H .. ':pbell') end
return reply
"#;

/// Nack entry `n` (delivered as `attempt`, which is `1 +` its count in `B:att`): releases it for
/// redelivery before anything new. A stale (other epoch), repeated or out-of-date nack releases
/// nothing.
///
/// KEYS: lane hash, released, acked, attempts. ARGV: base, epoch, n, attempt.
pub(crate) const NACK: &str = r#"
local H, R, A = KEYS[1], KEYS[2], KEYS[3]
local base, n = ARGV[1], tonumber(ARGV[3])
fold(H)
fold_dl(H)
local h = redis.call('HMGET', H, 'ep', 'an', 'oo', 'rd')
if (h[1] or '0') ~= ARGV[2] then return {'detached'} end
if is_acked(A, num(h[2]), num(h[3]), n) then return {'acked'} end
if redis.call('ZSCORE', R, s(n)) then return {'released'} end
if n > num(h[4]) then return {'stale'} end
if s(1 + num(redis.call('HGET', KEYS[4], s(n)))) ~= ARGV[4] then return {'stale'} end
redis.call('ZADD', R, n, s(n))
redis.call('HINCRBY', H, 'nrel', 1)
ring(base .. ':bell:' .. h[1])
return {'ok'}
"#;

/// Attach (`attach`: only if the claim is still `expected`) or re-attach (`reattach`: always) a
/// consumer: a new epoch, every delivered, unacked entry (`an + 1 ..= rd` less `B:ack`) released
/// (taken back from the previous consumer, whose acks are refused from now on), the previous
/// consumer woken. The ack and delivery logs are folded, and their last ids raised to
/// `<new epoch>-0`: the old epoch's records are refused from now on.
///
/// KEYS: lane hash, released, acked. ARGV: base, mode, expected claim, new claim.
pub(crate) const ATTACH: &str = r#"
local H, R, A = KEYS[1], KEYS[2], KEYS[3]
local base, mode = ARGV[1], ARGV[2]
local cur = redis.call('HGET', H, 'holder') or ''
if cur == ARGV[4] then return {'ok', tonumber(redis.call('HGET', H, 'ep'))} end
if mode == 'attach' and cur ~= ARGV[3] then return {'busy', cur} end
local old = redis.call('HGET', H, 'ep') or '0'
fold(H)
fold_dl(H)
if old == '0' then
  -- A lane's first epoch starts at the server's clock in microseconds, not at 1: the ends of a
  -- stream deleted and built again under this name hold smaller epochs, so their acks and
  -- receives are refused here (by the epoch checks and by the logs' fences).
  redis.call('HSET', H, 'ep', clock_base())
end
local ep = redis.call('HINCRBY', H, 'ep', 1)
-- The old epoch's acks were folded above: from here on they are refused (an `XADD` of an id
-- below the log's last id fails).
fence(H .. ':al', s(ep) .. '-0')
fence(H .. ':dl', s(ep) .. '-0')
local st = redis.call('HMGET', H, 'an', 'rd', 'oo')
local oo = num(st[3])
for n = num(st[1]) + 1, num(st[2]) do
  if not is_acked(A, 0, oo, n) then redis.call('ZADD', R, n, s(n)) end
end
redis.call('HSET', H, 'holder', ARGV[4], 'lq', '', 'nrel', redis.call('ZCARD', R))
local oldbell = base .. ':bell:' .. old
ring(oldbell)
redis.call('PEXPIRE', oldbell, 60000)
return {'ok', ep}
"#;

/// Claim the stream's fan-out (only if the claim is still `expected`): a new fan-out epoch `fe`
/// (in the meta hash) that fences the previous fan-out's publishes off: the log's last id is
/// raised to `<pub + 1>-<fe - 1>`, or to `LOG_FENCE_ID` while a lane is closed (see "The
/// fan-out").
///
/// KEYS: meta, log, then every lane's hash. ARGV: expected claim, new claim, `LOG_FENCE_ID`.
/// Replies `{'ok', epoch, published, lp of each lane...}`, or `{'busy', holder}`.
pub(crate) const CLAIM_FANOUT: &str = r#"
local M = KEYS[1]
local cur = redis.call('HGET', M, 'fh') or ''
if cur ~= ARGV[2] then
  if cur ~= ARGV[1] then return {'busy', cur} end
  if not redis.call('HGET', M, 'fe') then redis.call('HSET', M, 'fe', clock_base()) end
  redis.call('HINCRBY', M, 'fe', 1)
  redis.call('HSET', M, 'fh', ARGV[2])
end
local fe = num(redis.call('HGET', M, 'fe'))
local pub, closed, lps = 0, false, {}
for i = 3, #KEYS do
  fold_pl(KEYS[i])
  local h = redis.call('HMGET', KEYS[i], 'pub', 'closed', 'lp')
  pub = math.max(pub, num(h[1]))
  if h[2] == '1' then closed = true end
  lps[#lps + 1] = h[3] or ''
end
local id = ARGV[3]
if not closed then id = s(pub + 1) .. '-' .. s(fe - 1) end
fence(KEYS[2], id)
local r = {'ok', fe, pub}
for _, lp in ipairs(lps) do r[#r + 1] = lp end
return r
"#;

/// The gate of a fan-out's publish (see "The fan-out"): for every lane, the checks (fenced, a
/// duplicate, a position that does not rise above every lane's last, closed, full), the trim
/// every 64th entry, and the room (`{'ok', room, lp}`: every lane
/// takes publishes up to count `room`, the least `ai + cap`, and the last position published,
/// padded or empty). Writes nothing else: the publish
/// is the client's plain `XADD` that follows.
///
/// KEYS: meta, log, then every lane's hash. ARGV: fan-out epoch, the count after this publish
/// (= the entry number `n`), position (padded, or empty), the lane the entry goes to (1-based;
/// 0: every lane; not used by the checks), the meta field of the log's trim floor, then every
/// lane's hash again (for the trim floor). Replies `{'full', lane}` (1-based) for
/// the first full lane, whose publishers' bell the publisher waits on.
pub(crate) const PUBLISH_FANOUT: &str = r#"
local M, L = KEYS[1], KEYS[2]
local want, pos = tonumber(ARGV[2]), ARGV[3]
if (redis.call('HGET', M, 'fe') or '') ~= ARGV[1] then return {'fenced'} end
-- As the in-memory fan-out, in its order: the position (against the highest of every lane's,
-- for an entry to one lane too: the others ack its gap at its position), any lane closed (even
-- while another is full), then room on every lane.
local hs, lp, closed = {}, '', false
for i = 3, #KEYS do
  fold_pl(KEYS[i])
  local h = redis.call('HMGET', KEYS[i], 'pub', 'closed', 'lp', 'ai', 'cap')
  local pub = num(h[1])
  if pub == want then return {'dup'} end
  if pub ~= want - 1 then return {'fenced'} end
  if h[3] and h[3] > lp then lp = h[3] end
  if h[2] == '1' then closed = true end
  hs[i] = h
end
if pos ~= '' and lp ~= '' and pos <= lp then return {'regressed', lp} end
if closed then return {'closed'} end
local room = nil
for i = 3, #KEYS do
  local H, h = KEYS[i], hs[i]
  local pub, ai, cap = num(h[1]), num(h[4]), num(h[5])
  if pub - ai >= cap then
    fold(H)
    ai = num(redis.call('HGET', H, 'ai'))
  end
  if pub - ai >= cap then
    redis.call('HSET', H, 'pw', '1')
    return {'full', i - 2}
  end
  if not room or ai + cap < room then room = ai + cap end
end
if want % 64 == 0 then trim(L, M, ARGV[5], 6) end
return {'ok', room, lp}
"#;

/// A run of entries from the fan-out (`RedisFanout::try_publish_run`), all to every lane, in
/// one script: the gate's checks for the first (fenced, a position that does not rise, closed,
/// full), then as many entries as every lane has room for, stopping before one whose position
/// does not rise; each entry's `XADD` of id `<n>-<fan-out epoch>` with its `p` (the last
/// position as of it), the trim on every 64th, and the waiting receives rung. The payloads pass
/// through Lua here (one script per run, against one plain `XADD` per item).
///
/// KEYS: meta, log, then every lane's hash. ARGV: fan-out epoch, the first entry's number `n`,
/// how many entries `k`, then `k` pairs (payload, position padded or empty), then every lane's
/// hash again (for the trim floor, the meta field `trim`). Replies
/// `{'ok', published, room, lp}` (room: the count up to which every lane takes publishes),
/// `{'landed', m}` (entries from `n` on are in the log already: the first `m` of them, a try
/// whose reply was lost, or an earlier call's), `{'full', lane}` (1-based), `{'closed'}`,
/// `{'regressed', lp}`, `{'fenced'}`.
pub(crate) const PUBLISH_RUN: &str = r#"
local M, L = KEYS[1], KEYS[2]
local first, k = tonumber(ARGV[2]), tonumber(ARGV[3])
local hashes = 4 + 2 * k
if (redis.call('HGET', M, 'fe') or '') ~= ARGV[1] then return {'fenced'} end
local hs, lp, closed = {}, '', false
for i = 3, #KEYS do
  fold_pl(KEYS[i])
  local h = redis.call('HMGET', KEYS[i], 'pub', 'closed', 'lp', 'ai', 'cap')
  if h[3] and h[3] > lp then lp = h[3] end
  if h[2] == '1' then closed = true end
  hs[i] = h
end
local pub = num(hs[3][1])
if pub >= first then return {'landed', math.min(pub - first + 1, k)} end
if pub ~= first - 1 then return {'fenced'} end
local pos = ARGV[5]
if pos ~= '' and lp ~= '' and pos <= lp then return {'regressed', lp} end
if closed then return {'closed'} end
local room = nil
for i = 3, #KEYS do
  local H, h = KEYS[i], hs[i]
  local ai, cap = num(h[4]), num(h[5])
  if pub - ai >= cap then
    fold(H)
    ai = num(redis.call('HGET', H, 'ai'))
  end
  if pub - ai >= cap then
    redis.call('HSET', H, 'pw', '1')
    return {'full', i - 2}
  end
  if not room or ai + cap < room then room = ai + cap end
end
local n = 0
while n < k and pub + n + 1 <= room do
  pos = ARGV[5 + 2 * n]
  if pos ~= '' then
    if lp ~= '' and pos <= lp then break end
    lp = pos
  end
  local id = s(pub + n + 1) .. '-' .. ARGV[1]
  local added = redis.pcall('XADD', L, 'NOMKSTREAM', id, 'd', ARGV[4 + 2 * n], 'p', lp)
  if type(added) ~= 'string' then break end
  n = n + 1
  if (pub + n) % 64 == 0 then trim(L, M, 'trim', hashes) end
end
for i = 3, #KEYS do
  local w = redis.call('HMGET', KEYS[i], 'w', 'ep')
  if w[1] == '1' then
    redis.call('HSET', KEYS[i], 'w', '0')
    ring(KEYS[i] .. ':bell:' .. (w[2] or '0'))
  end
end
return {'ok', n, room, lp}
"#;

/// Record the stream's shape when it is new, and read it back: its sinks and its layout
/// (`fanout`: its one fan-out, the only layout this version writes; `lanes`: the retired
/// per-lane-producer layout, which the build refuses). A stream made before the layout was
/// recorded is in the retired one. Its incarnation `inc` (random, set once): an end refused
/// by an epoch check tells from it whether the stream's state is gone (`inc` missing, or another
/// one: the keys deleted, the server restarted without persistence) rather than taken over.
///
/// KEYS: meta. ARGV: the sinks (comma-separated), the mode, a fresh incarnation. Replies
/// `{sinks, mode, inc}` as stored.
pub(crate) const DESCRIBE: &str = r#"
local M = KEYS[1]
if redis.call('HSETNX', M, 'sinks', ARGV[1]) == 1 then
  redis.call('HSET', M, 'mode', ARGV[2])
elseif not redis.call('HGET', M, 'mode') then
  redis.call('HSET', M, 'mode', 'lanes')
end
redis.call('HSETNX', M, 'inc', ARGV[3])
return redis.call('HMGET', M, 'sinks', 'mode', 'inc')
"#;

/// Give a claim up (a dropped end), if it is still ours.
///
/// KEYS: lane hash. ARGV: field, our claim.
pub(crate) const RELEASE_CLAIM: &str = r#"
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then redis.call('HSET', KEYS[1], ARGV[1], '') return 1 end
return 0
"#;

/// Move a claim from a dead connection's id to a new one (after a reconnect), if still ours.
///
/// KEYS: lane hash. ARGV: field, old claim, new claim.
pub(crate) const MOVE_CLAIM: &str = r#"
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) return 1 end
return 0
"#;

/// Close a lane and wake everyone waiting on it.
///
/// KEYS: lane hash, log, then for a sink lane the watermark waiters' set and every sink lane's
/// hash. ARGV: base, `f` for a sink lane (the log's last id is raised to `LOG_FENCE_ID`, the
/// third argument: no `XADD` of the fan-out lands any more; every lane's publishers are rung,
/// since a waiting fan-out waits on the full lane's bell; and the watermark waiters, whose
/// watermark may be final now), `r` for the request lane.
pub(crate) const CLOSE: &str = r#"
redis.call('HSET', KEYS[1], 'closed', '1')
if ARGV[2] == 'f' then
  fence(KEYS[2], ARGV[3])
  for i = 4, #KEYS do ring(KEYS[i] .. ':pbell') end
  ring_watermark(KEYS[3])
end
ring(ARGV[1] .. ':bell:' .. (redis.call('HGET', KEYS[1], 'ep') or '0'))
ring(ARGV[1] .. ':pbell')
return 1
"#;

/// A lane's counters, read together (deliveries are `nread + rdl`: items read, and redelivered),
/// its logs folded first.
///
/// KEYS: lane hash, released. Returns the hash fields then the number released.
pub(crate) const STATS: &str = r#"
fold(KEYS[1])
fold_dl(KEYS[1])
local h = redis.call('HMGET', KEYS[1], 'cap', 'pub', 'nread', 'ai', 'rdl', 'lp', 'ap', 'closed', 'ep')
table.insert(h, redis.call('ZCARD', KEYS[2]))
return h
"#;

/// Fold the publish record and the ack log of each lane given (KEYS: their hashes) into its
/// counters and acked prefix, before a plain read of them (`acked`, `is_idle`).
pub(crate) const FOLD: &str = r#"
for _, H in ipairs(KEYS) do
  fold_pl(H)
  fold(H)
end
return 1
"#;

/// Trim a log now (below every lane's acked prefix); returns the floor.
///
/// KEYS: log, meta. ARGV: the meta field of the log's trim floor, then the hashes of every lane
/// that reads the log.
pub(crate) const TRIM: &str = r#"
return trim(KEYS[1], KEYS[2], ARGV[1], 2)
"#;

/// Read the watermark (the least `ap` over the sink lanes, each folded first; empty while a lane
/// has none) and whether it is final (every lane closed, with everything published acked), and
/// for a waiter (see "Watermark waiters") register its key first, in the same script. A stream
/// whose meta hash is gone (deleted) registers nothing and answers final.
///
/// KEYS: meta, the watermark waiters' set, then every sink lane's hash. ARGV: the waiter's key,
/// or empty for a plain read. Replies `{watermark (padded, or empty), '1' if final else '0'}`.
pub(crate) const WATERMARK: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return {'', '1'} end
if ARGV[1] ~= '' then
  redis.call('SADD', KEYS[2], ARGV[1])
  for i = 3, #KEYS do redis.call('HSET', KEYS[i], 'ww', '1') end
end
local min, none, final = nil, false, true
for i = 3, #KEYS do
  local H = KEYS[i]
  fold_pl(H)
  fold(H)
  local h = redis.call('HMGET', H, 'ap', 'closed', 'pub', 'ai')
  if not h[1] or h[1] == '' then
    none = true
  elseif not min or h[1] < min then
    min = h[1]
  end
  if h[2] ~= '1' or num(h[3]) ~= num(h[4]) then final = false end
end
if none or not min then min = '' end
if final then return {min, '1'} end
return {min, '0'}
"#;

/// Ring every watermark waiter (an ack found `ww` set: see "Watermark waiters"), clearing every
/// sink lane's `ww` (where it is set: a hash of a deleted stream is not made again).
///
/// KEYS: the watermark waiters' set, then every sink lane's hash.
pub(crate) const RING_WATERMARK: &str = r#"
for i = 2, #KEYS do
  if redis.call('HGET', KEYS[i], 'ww') == '1' then redis.call('HSET', KEYS[i], 'ww', '0') end
end
ring_watermark(KEYS[1])
return 1
"#;
