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
//! | `B` | hash | `cap` capacity; `about` a text longer than 64 bytes (keeps the hash in the hashtable encoding: see `stream.rs`); `pub` items published; `last` the lane's newest entry number; `lp` last published position; `rd` newest entry read by the group; `nread` items read; `an` newest entry of the contiguous acked prefix; `ai` items in it; `ap` its position; `rdl` redeliveries (deliveries are `nread + rdl`); `closed`; `ep` consumer epoch, `holder` its claim; `pe` producer epoch, `ph` its claim; `lq` the last receive, for a retried one: its request number when it delivered a new entry (entry `rd`, attempt 1), `request:entry:attempt` when it redelivered one |
//! | `B:ids` | sorted set | the lane's unacked entries (and acked ones after an unacked one): score = entry number, member = `n:position`; not kept for a lane alone on its log (below) |
//! | `B:rel` | sorted set | released entries, waiting for redelivery (score = member = entry number) |
//! | `B:ack` | sorted set | entries acked while an earlier one is out: score = entry number, member = `n` (`n:position` for a lane alone on its log) |
//! | `B:bell:<epoch>` | list | a wake-up token for the consumer of that epoch (at most one) |
//! | `B:pbell` | list | a wake-up token for waiting publishers (at most one) |
//! | `B:att` | hash | a lane alone on its log: entry number → its redeliveries so far (only for entries released at least once, until acked) |
//! | `B:al` | stream | a lane alone on its log: acks not folded yet, id `<epoch>-<n>`, field `p` the position (see "The ack log") |
//! | `B:dl` | stream | a lane alone on its log: deliveries of new entries not folded yet, id `<epoch>-<n>` (see "The delivery log") |
//! | `B:pl` | stream | a sink lane alone on its log: publishes not folded yet, id `<n>-<producer epoch>`, field `p` the position (see "The publish log") |
//!
//! Entries live in the log stream (`{P}:log` for the sink lanes, all sharing it: one consumer
//! group per sink lane; `{P}:req` for the request lane, group `ingest`), with id `n-0` for entry
//! number `n` (`n-<producer epoch>` for a sink lane alone on its log: see "The publish log"; an
//! entry is read by its number, `XRANGE L n n`) and fields `d` (the codec's bytes) and `p` (the
//! position, or empty). Positions are
//! stored as 20-digit zero-padded decimals, so that Lua (whose numbers are doubles) compares
//! them as strings, exactly.
//!
//! # A lane alone on its log
//! The sink lane of a stream with one sink, and the request lane, own every entry of their log:
//! entry numbers have no gaps, so the lane's next entry is `rd + 1`, its first unacked one
//! `an + 1`, and its newest `last` is the log's newest. Such a lane keeps no `B:ids` (the
//! scripts' `alone` argument): a publish numbers its entry `last + 1` (no shared counter), a
//! receive reads on without looking its entry up, an ack knows whether it is in order from `an`
//! and takes the position from the acker (the delivered item's own), and the trim floor is the
//! lane's `an`. Three of the hot path's thirteen commands fewer (`INFO commandstats` showed the
//! scripts' time to grow with every command they run); a lane that shares its log with other
//! lanes keeps `B:ids`, which tells its entries apart.
//!
//! Such a lane does not use its consumer group's pending list either: its delivered, unacked
//! entries are those after `an` up to `rd` that are not in `B:ack`, so the hash already holds
//! what the pending list would. A new entry's delivery writes nothing to the log (no
//! `XREADGROUP`, no `XCLAIM`), an ack no `XACK`; a released entry counts its redeliveries in
//! `B:att` (attempt = 1 + that count), which a nack checks for staleness, and an attach
//! releases the entries after `an` up to `rd` that are not acked. A stream command inside a
//! script whose reply is an array (`XREADGROUP`, `XCLAIM`, `XRANGE`) was the costliest step
//! of the hot path (2 to 6 µs each, against about 1 µs for the same command sent plainly);
//! payloads are read by a plain `XRANGE` pipelined after the receive script (`RECEIVE`).
//!
//! # The ack log
//! A lane alone on its log acks a first delivery without a script: a plain
//! `XADD B:al <epoch>-<n> p <position>` to its ack log (a stream), with `HGET B pw` in the same
//! round trip (a waiting publisher is rung by the acker). Redis refuses an `XADD` whose id is
//! not above the stream's last id, which makes it the epoch fence: an attach first folds the
//! log (below) and then sets its last id to `<new epoch>-0` (`XSETID`), so an ack of the old
//! epoch either landed before, and counts, or is refused after; never both. An ack of an entry
//! below one acked earlier in the epoch (out of order) is refused too. A refused `XADD`, a
//! retried ack and a redelivery's ack run `ACK_ALONE`, which tells them apart (and answers
//! `detached` to the first kind). The log's records are applied to the acked prefix (`an`, `ai`,
//! `ap`, `oo`, `B:ack`) by `fold`, which every script and read of that prefix runs first: the
//! publish that finds the lane full by its last fold, an attach, a nack, `ACK_ALONE`, the trim,
//! the stats, the watermark, `acked`, `is_idle`. The ids grow, so k records of this epoch from
//! `an + 1` to `an + k` are exactly those entries: the common fold reads two records, however
//! many there are. (`SLOWLOG`: the ack script took 4.6-6.2 µs per batch, the `XADD` takes
//! 0.7-0.8 µs.)
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
//! # The publish log
//! The claimed producer of a sink lane alone on its log publishes entry `n` with one `MULTI` of
//! two plain `XADD`s of id `<n>-<producer epoch>` (the entry, with its payload, to the log; its
//! record `p <position>` to the publish log `B:pl`) and an `HMGET` of `w` and `ep` (a receive
//! waiting is rung after). Both logs' last ids move together, and the id is the fence: claiming
//! the producer (a new epoch `E`) sets them to `<pub + 1>-<E - 1>`, so the live producer's
//! `<pub + 1>-E` lands while an older producer's next, `<c + 1>-e` with `c <= pub`, `e < E`, is
//! refused (its count never moves again: all its publishes are refused); closing the lane sets
//! them to [`LOG_FENCE_ID`], so none lands. An entry lands once (its id again is refused). The
//! producer runs the gate script (`PUBLISH_ALONE`) first when it does not know the lane has room
//! (past `ai + cap` as the gate last reported: the acked prefix only grows), when the position
//! may not rise, on every 64th entry (the gate trims the log), after an error, and after a
//! refused `XADD` (the gate tells a newer producer, a closed lane, and a retry of a publish that
//! landed apart). `fold_pl` moves `pub` and `last` to the newest record and `lp` to the newest
//! position, before every reader of them: the gate, the claim, the receive script (through
//! `fold_dl`), an attach, a nack, the stats, `is_idle`. A capacity lowered by another process's
//! build applies to a producer from its next gate (at most 64 publishes later).

//!
//! # A fan-out stream
//! A stream built with `fanout(true)` is published to only through its one fan-out
//! (`RedisFanout`): every entry of the log goes to every lane (an entry published to one lane is
//! a *gap* for the others), so every lane owns every entry of the log as a lane alone on its log
//! does, and runs that lane's hot path unchanged (the delivery log, the ack log, no ids set, no
//! group pending list). Only the publishing and the trim differ:
//! - The fan-out publishes entry `n` with one plain `XADD` of id `<n>-<fan-out epoch>` of the
//!   entry (with its payload, once) to the log, pipelined with `HMGET`s of each lane's `w` and
//!   `ep` (a receive waiting is rung after). The log is also the lanes' publish record: a lane of
//!   a fan-out stream (its hash's `fan` is `1`) has no publish log, and `fold_pl` moves its
//!   `pub` and `last` to the log's newest entry and `lp` to that entry's `p`, which is the last
//!   position published as of that entry (the item's own, or for an unpositioned item the one
//!   before it: positions rise across the log), so the newest entry alone tells all. Every trim
//!   folds the lanes first. (`INFO commandstats`: a record per lane in the publish's `MULTI`
//!   cost three `XADD`s of about 1.2 µs each per batch with three sinks; looking back for the
//!   last positioned entry read every unpositioned entry's payload into Lua, about 50 ms for
//!   sixty chunks of 256 KB in one script.)
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

/// Shared helpers: each script gets those it calls prepended, not the rest (every `local
/// function` is a closure made on every run of a script). See [`source`].
const HELPERS: &[(&str, &str)] = &[
    (
        "s",
        r#"
local function s(x) return string.format('%d', x) end
"#,
    ),
    (
        "clock_base",
        r#"
-- The server's clock in microseconds, as digits: where a new lane's epochs start (below 2^53, so
-- exact in Lua's numbers).
local function clock_base()
  local t = redis.call('TIME')
  return s(tonumber(t[1]) * 1000000 + tonumber(t[2]))
end
"#,
    ),
    (
        "num",
        r#"
local function num(x) if x then return tonumber(x) else return 0 end end
"#,
    ),
    (
        "entry_n",
        r#"
local function entry_n(id) return tonumber(string.match(id, '^(%d+)')) end
"#,
    ),
    (
        "ring",
        r#"
local function ring(key) redis.call('LPUSH', key, '1'); redis.call('LTRIM', key, 0, 0) end
"#,
    ),
    (
        "is_acked",
        r#"
local function is_acked(A, an, oo, n)
  if n <= an then return true end
  if oo == 0 then return false end
  return redis.call('ZCOUNT', A, n, n) > 0
end
"#,
    ),
    (
        "fence",
        r#"
-- Sets the last id of stream `K` (made if missing) to `id`, which must not be below its newest
-- entry: an `XADD` of an id not above it is refused from now on.
local function fence(K, id)
  if redis.call('EXISTS', K) == 1 then
    redis.call('XSETID', K, id)
  else
    redis.call('XADD', K, id, 'p', '')
    redis.call('XTRIM', K, 'MAXLEN', 0)
  end
end
"#,
    ),
    (
        "fold_pl",
        r#"
-- A sink lane alone on its log: the publishes recorded in its publish log `H:pl` (a publish is
-- a `MULTI` of two plain `XADD`s of id `<n>-<producer epoch>`, the entry and its record: see
-- "The publish log") move `pub` and `last` up to the newest, and `lp` to the newest position
-- among them; for a lane of a fan-out stream (`fan` set), the log's own entries do. Every
-- reader of those fields folds first.
local function fold_pl(H)
  local f = redis.call('HMGET', H, 'fan', 'last')
  local n, p
  if f[1] == '1' then
    -- A lane of a fan-out stream: the log itself records the publishes (see "A fan-out
    -- stream"); the newest entry's `p` is the last position published (whichever lanes it
    -- went to), so one entry tells all.
    local L = string.match(H, '^({.*}):l:') .. ':log'
    local top = redis.call('XREVRANGE', L, '+', '-', 'COUNT', 1)[1]
    if not top or entry_n(top[1]) <= num(f[2]) then return end
    n, p = entry_n(top[1]), top[2][4]
  else
    local P = H .. ':pl'
    local top = redis.call('XREVRANGE', P, '+', '-', 'COUNT', 1)[1]
    if not top then return end
    n, p = entry_n(top[1]), top[2][2]
    if p == '' then
      for _, e in ipairs(redis.call('XREVRANGE', P, '+', '-')) do
        if e[2][2] ~= '' then
          p = e[2][2]
          break
        end
      end
    end
    redis.call('XTRIM', P, 'MAXLEN', 0)
  end
  if p ~= '' then
    redis.call('HSET', H, 'pub', n, 'last', n, 'lp', p)
  else
    redis.call('HSET', H, 'pub', n, 'last', n)
  end
end
"#,
    ),
    (
        "fold_dl",
        r#"
-- A lane alone on its log: the deliveries recorded in its delivery log `H:dl` (the receive of
-- the new entry a consumer expects is a plain `XADD H:dl <epoch>-<n>`: see "The delivery log")
-- move `rd` (and `nread`, equal on such a lane) up to the newest of them, but not above the
-- lane's newest entry: a record of an entry not published yet is dropped (its receive found
-- nothing, and the consumer asks for that entry again). Every reader of `rd` folds first.
local function fold_dl(H)
  fold_pl(H)
  local K = H .. ':dl'
  local top = redis.call('XREVRANGE', K, '+', '-', 'COUNT', 1)[1]
  if not top then return end
  redis.call('XTRIM', K, 'MAXLEN', 0)
  local e, n = string.match(top[1], '^(%d+)-(%d+)$')
  local h = redis.call('HMGET', H, 'ep', 'rd', 'last')
  if e ~= (h[1] or '0') then return end
  n = math.min(tonumber(n), tonumber(h[3] or 0))
  if n > tonumber(h[2] or 0) then redis.call('HSET', H, 'rd', n, 'nread', n) end
end
"#,
    ),
    (
        "absorb",
        r#"
-- Entry `an` was just acked at position `ap` (or `''`): moves the acked prefix on over the
-- out-of-order acks in `A` that follow it (`oo` of them are recorded). Returns the new `an` and
-- `oo`, how many it moved over, and the last position among them (else `ap`).
local function absorb(A, an, oo, ap)
  local moved = 0
  while oo > 0 do
    local m = redis.call('ZRANGEBYSCORE', A, an + 1, an + 1)
    if not m[1] then break end
    redis.call('ZREM', A, m[1])
    oo, an, moved = oo - 1, an + 1, moved + 1
    local p = string.match(m[1], ':(.*)$')
    if p ~= '' then ap = p end
  end
  return an, oo, moved, ap
end
"#,
    ),
    (
        "fold",
        r#"
-- A lane alone on its log: applies the acks recorded in its ack log `H:al` (an in-order ack
-- of a first delivery is a plain `XADD H:al <epoch>-<n> p <position>`, fenced by the epoch and
-- refused when not above the last one: see "The ack log") to the acked prefix, as `ACK_ALONE`
-- would have one by one, and empties the log (its last id, the fence, stays). A record of
-- another epoch than the lane's (possible only on a log deleted and written again) is dropped.
-- Every reader of the acked prefix of such a lane folds first.
local function fold(H)
  local K = H .. ':al'
  local k = redis.call('XLEN', K)
  if k == 0 then return end
  local h = redis.call('HMGET', H, 'ep', 'an', 'ai', 'oo', 'ap')
  local ep = h[1] or '0'
  local an, ai, oo, ap = tonumber(h[2] or 0), tonumber(h[3] or 0), tonumber(h[4] or 0), h[5] or ''
  -- The ids grow: k records from `an + 1` to `an + k` of this epoch are exactly those entries.
  local first = redis.call('XRANGE', K, '-', '+', 'COUNT', 1)[1]
  local last = redis.call('XREVRANGE', K, '+', '-', 'COUNT', 1)[1]
  local e1, n1 = string.match(first[1], '^(%d+)-(%d+)$')
  local e2, n2 = string.match(last[1], '^(%d+)-(%d+)$')
  if oo == 0 and e1 == ep and e2 == ep and tonumber(n1) == an + 1 and tonumber(n2) == an + k
    and last[2][2] ~= '' then
    redis.call('XTRIM', K, 'MAXLEN', 0)
    redis.call('HSET', H, 'an', an + k, 'ai', ai + k, 'ap', last[2][2])
    return
  end
  local es = k == 1 and {first} or redis.call('XRANGE', K, '-', '+')
  redis.call('XTRIM', K, 'MAXLEN', 0)
  local A = H .. ':ack'
  for _, e in ipairs(es) do
    local ee, en = string.match(e[1], '^(%d+)-(%d+)$')
    local n, p = tonumber(en), e[2][2]
    if ee ~= ep or n <= an then
      -- another epoch's (dropped), or acked before
    elseif n == an + 1 then
      if p == '' then p = ap end
      local moved
      an, oo, moved, ap = absorb(A, n, oo, p)
      ai = ai + 1 + moved
    elseif redis.call('ZCOUNT', A, n, n) == 0 then
      redis.call('ZADD', A, n, en .. ':' .. p)
      oo = oo + 1
    end
  end
  if ap ~= '' then
    redis.call('HSET', H, 'an', an, 'ai', ai, 'oo', oo, 'ap', ap)
  else
    redis.call('HSET', H, 'an', an, 'ai', ai, 'oo', oo)
  end
end
"#,
    ),
    (
        "ack_fence",
        r#"
-- The ack fence of `ACK` and `ACK_ALONE`: the lane hash's `ep an ai oo pw` for an ack of entry
-- `n` by the holder of `epoch`, or (nil and) the reply when the ack is settled already: a
-- detached holder's (`unknown` if its retried ack had landed), or an entry acked before.
local function ack_fence(H, A, epoch, n, retry)
  local h = redis.call('HMGET', H, 'ep', 'an', 'ai', 'oo', 'pw')
  local an, oo = num(h[2]), num(h[4])
  if (h[1] or '0') ~= epoch then
    if retry == '1' and is_acked(A, an, oo, n) then return nil, {'unknown'} end
    return nil, {'detached'}
  end
  if is_acked(A, an, oo, n) then return nil, {'ok'} end
  return h
end
"#,
    ),
    (
        "trim",
        r#"
-- Trims the log below every lane's acked prefix (never above): the entries before each lane's
-- first unacked one. ARGV[first..] are the ids keys of every lane sharing the log, or (`alone`)
-- the hash of the one lane that owns it, whose first unacked entry is `an + 1` (the hashes of
-- every lane of a fan-out stream, each of which sees every entry).
local function trim(L, M, seqf, trimf, alone, first)
  local floor
  if alone then
    -- (A fan-out stream's lanes each see every entry: the lowest acked prefix of them all. Their
    -- publish record is the log itself, folded before any of it goes.)
    for i = first, #ARGV do
      fold_pl(ARGV[i])
      fold(ARGV[i])
      local an = num(redis.call('HGET', ARGV[i], 'an'))
      if not floor or an < floor then floor = an end
    end
    floor = floor or 0
  else
    floor = num(redis.call('HGET', M, seqf))
    for i = first, #ARGV do
      local f = redis.call('ZRANGE', ARGV[i], 0, 0, 'WITHSCORES')
      if f[1] then floor = math.min(floor, tonumber(f[2]) - 1) end
    end
  end
  if floor > num(redis.call('HGET', M, trimf)) then
    redis.call('XTRIM', L, 'MINID', s(floor + 1) .. '-0')
    redis.call('HSET', M, trimf, floor)
  end
  return floor
end
"#,
    ),
];

/// Publish one item.
///
/// KEYS: lane hash, ids, log, meta. ARGV: base, mode (`p` a claimed producer, `s` a request
/// sender), producer epoch, the lane's `pub` after this publish (for `p`: a retried publish
/// that already landed answers `dup`), payload, position (padded, or empty), the meta field
/// that numbers the log's entries, how many entries after the lane's newest to look through
/// for the same payload (published on another lane: shared, not written again), the meta field
/// of the log's trim floor, `1` if the lane is alone on its log (no `ids`, entry `last + 1`),
/// then the ids keys of every lane sharing the log, or the lane's hash when alone (every 64th
/// entry trims the log).
///
/// A full lane sets `pw` (a publisher waits: the ack that makes room rings `B:pbell`); `w` set
/// by a receive that found nothing makes the publish ring the consumer's bell. The dedup scan
/// runs only when other lanes have published past this lane's newest entry.
pub(crate) const PUBLISH: &str = r#"
local H, I, L, M = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local base, mode, payload, pos = ARGV[1], ARGV[2], ARGV[5], ARGV[6]
local h = redis.call('HMGET', H, 'pe', 'pub', 'closed', 'lp', 'ai', 'cap', 'ep', 'last', 'w')
local pub, ai, cap, last = num(h[2]), num(h[5]), num(h[6]), num(h[8])
local lp = h[4] or ''
if mode == 'p' then
  if (h[1] or '') ~= ARGV[3] then return {'fenced'} end
  local want = tonumber(ARGV[4])
  if pub == want then return {'dup'} end
  if pub ~= want - 1 then return {'fenced'} end
end
if h[3] == '1' then return {'closed'} end
if pos ~= '' and lp ~= '' and pos <= lp then return {'regressed', lp} end
local alone = ARGV[10] == '1'
if alone and pub + 1 - ai >= cap then
  -- The acks since the last fold may have made room (for this publish, or for the next sender).
  fold(H)
  ai = num(redis.call('HGET', H, 'ai'))
end
if pub - ai >= cap then
  redis.call('HSET', H, 'pw', '1')
  return {'full'}
end
local n = nil
local scan = tonumber(ARGV[8])
if alone then
  n = last + 1
  redis.call('XADD', L, s(n) .. '-0', 'd', payload, 'p', pos)
elseif scan > 0 and last < num(redis.call('HGET', M, ARGV[7])) then
  local es = redis.call('XRANGE', L, '(' .. s(last) .. '-0', '+', 'COUNT', scan)
  for _, e in ipairs(es) do
    if e[2][2] == payload then n = entry_n(e[1]); break end
  end
end
if not n then
  n = redis.call('HINCRBY', M, ARGV[7], 1)
  redis.call('XADD', L, s(n) .. '-0', 'd', payload, 'p', pos)
end
if not alone then redis.call('ZADD', I, n, s(n) .. ':' .. pos) end
if pos ~= '' then
  redis.call('HSET', H, 'pub', s(pub + 1), 'last', s(n), 'lp', pos, 'w', '0')
else
  redis.call('HSET', H, 'pub', s(pub + 1), 'last', s(n), 'w', '0')
end
if h[9] == '1' then ring(base .. ':bell:' .. (h[7] or '0')) end
if mode == 's' and pub + 1 - ai < cap then ring(base .. ':pbell') end
if n % 64 == 0 then trim(L, M, ARGV[7], ARGV[9], alone, 11) end
return {'ok', n}
"#;

/// The gate of a publish of the claimed producer of a sink lane alone on its log: the checks
/// of `PUBLISH` (fenced, a duplicate, closed, a position that does not rise, full), the trim
/// every 64th entry, and the room (`{'ok', ai, cap}`: the lane takes publishes up to count
/// `ai + cap`). Writes nothing else: the publish itself is the client's `MULTI` of two plain
/// `XADD`s that follows (see "The publish log"), which the producer sends without this script
/// while it knows there is room.
///
/// KEYS: lane hash, log, meta. ARGV: base, producer epoch, the lane's `pub` after this publish
/// (= the entry number `n`), position (padded, or empty), the meta field that numbers the log's
/// entries, the meta field of the log's trim floor, the lane hash (for the trim floor).
pub(crate) const PUBLISH_ALONE: &str = r#"
local H, L = KEYS[1], KEYS[2]
local pos = ARGV[4]
fold_pl(H)
local h = redis.call('HMGET', H, 'pe', 'pub', 'closed', 'lp', 'ai', 'cap')
if (h[1] or '') ~= ARGV[2] then return {'fenced'} end
local pub, want = tonumber(h[2] or 0), tonumber(ARGV[3])
if pub == want then return {'dup'} end
if pub ~= want - 1 then return {'fenced'} end
if h[3] == '1' then return {'closed'} end
local lp = h[4]
if pos ~= '' and lp and lp ~= '' and pos <= lp then return {'regressed', lp} end
local ai, cap = tonumber(h[5] or 0), tonumber(h[6] or 0)
if pub - ai >= cap then
  -- The acks since the last fold may have made room.
  fold(H)
  ai = tonumber(redis.call('HGET', H, 'ai') or 0)
end
if pub - ai >= cap then
  redis.call('HSET', H, 'pw', '1')
  return {'full'}
end
if want % 64 == 0 then trim(L, KEYS[3], ARGV[5], ARGV[6], true, 7) end
return {'ok', ai, cap}
"#;

/// The last id of the log (and the publish log) of a closed sink lane alone on its log: the
/// highest millisecond part Redis takes, above any entry, so that no `XADD` lands (see "The
/// publish log").
pub(crate) const LOG_FENCE_ID: &str = "18446744073709551615-0";

/// Receive one item: a released one first (lowest entry first), else the next new one.
///
/// KEYS: lane hash, ids, released, log, attempts. ARGV: base, group, consumer name, epoch, request number
/// (a retried request whose reply was lost gets the same delivery again), `1` if the lane is
/// alone on its log (its next entry is `rd + 1`), the entry number the client expects next
/// (`0`: none; on a lane alone on its log an expected entry at or below `rd`, after the fold of
/// the delivery log, was recorded but not received, and is delivered now).
///
/// Replies `{'item', n, attempt, payload}` (with a fifth element, the entry's target sink, for
/// an entry of a fan-out stream published to one lane: see "A fan-out stream"), or
/// `{'item', n, 1}` without the payload when a lane alone on its log delivers the new entry the
/// client expected: the client reads that entry's
/// payload with a plain `XRANGE` sent in the same round trip, after this script (entries are
/// never changed, and an unacked one is never trimmed), so the payload does not cross Lua.
/// Such a lane writes nothing to the log on a delivery (see "A lane alone on its log").
pub(crate) const RECEIVE: &str = r#"
local H, I, R, L, T = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, consumer, rq, alone = ARGV[2], ARGV[3], ARGV[5], ARGV[6] == '1'
if alone then fold_dl(H) end
local h = redis.call('HMGET', H, 'ep', 'lq', 'nrel', 'rd', 'last')
if (h[1] or '0') ~= ARGV[4] then return {'detached'} end
local lq = h[2]
-- Whether entry `n` of a lane alone on its log was acked since it was delivered: a gap of a
-- fan-out stream, acked on the way past with its reply lost (see "A fan-out stream"; the entry
-- may be trimmed by now). Not delivered again.
local function acked_since(n)
  if not alone then return false end
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
  local payload, attempt, target
  if alone then
    local e = redis.call('XRANGE', L, s(n), s(n))
    if not e[1] then return redis.error_reply('lanestream: log entry ' .. s(n) .. ' is missing') end
    payload, target = e[1][2][2], e[1][2][6]
    attempt = 1 + redis.call('HINCRBY', T, s(n), 1)
  else
    local c = redis.call('XCLAIM', L, group, consumer, 0, s(n) .. '-0')
    payload = c[1][2][2]
    local p = redis.call('XPENDING', L, group, s(n) .. '-0', s(n) .. '-0', 1)
    attempt = p[1][4]
  end
  redis.call('HSET', H, 'nrel', nrel - 1, 'lq', rq .. ':' .. s(n) .. ':' .. s(attempt))
  redis.call('HINCRBY', H, 'rdl', 1)
  return {'item', n, attempt, payload, target}
end
local rd = tonumber(h[4] or 0)
local expect = tonumber(ARGV[7])
if alone and expect > 0 and expect <= rd and not acked_since(expect) then
  -- Recorded in the delivery log, not received: a receive whose reply was lost, or whose entry
  -- was not published yet. Delivered now (its payload from the client's `XRANGE`).
  redis.call('HSET', H, 'lq', rq .. ':' .. ARGV[7] .. ':1')
  return {'item', expect, 1}
end
if rd >= tonumber(h[5] or 0) then
  local c = redis.call('HMGET', H, 'closed', 'w')
  if c[1] == '1' then return {'closed'} end
  if c[2] ~= '1' then redis.call('HSET', H, 'w', '1') end
  return {'empty'}
end
local n = rd + 1
if alone then
  -- Entry numbers have no gaps: items read = `rd` (`nread` is kept for `STATS`).
  local payload, target
  if tonumber(ARGV[7]) ~= n then
    local e = redis.call('XRANGE', L, s(n), s(n))
    if not e[1] then return redis.error_reply('lanestream: log entry ' .. s(n) .. ' is missing') end
    payload, target = e[1][2][2], e[1][2][6]
  end
  redis.call('HSET', H, 'rd', n, 'nread', n, 'lq', rq .. ':' .. s(n) .. ':1')
  return {'item', n, 1, payload, target}
end
-- A log shared with other lanes: the lane's next entry is the first of its ids after `rd`.
local nx = redis.call('ZRANGEBYSCORE', I, '(' .. s(rd), '+inf', 'LIMIT', 0, 1)
n = entry_n(nx[1])
if n > rd + 1 then redis.call('XGROUP', 'SETID', L, group, s(n - 1) .. '-0') end
local e = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', 1, 'STREAMS', L, '>')
local entry = e and e[1][2][1]
if not entry or entry_n(entry[1]) ~= n then return redis.error_reply('lanestream: log entry ' .. s(n) .. ' is missing') end
redis.call('HSET', H, 'rd', n, 'lq', rq .. ':' .. s(n) .. ':1')
redis.call('HINCRBY', H, 'nread', 1)
return {'item', n, 1, entry[2][2]}
"#;

/// Ack entry `n`: fenced by the epoch; advances the contiguous acked prefix (`oo` counts the
/// entries acked out of order, in `B:ack`).
///
/// For a lane that shares its log with other lanes (a lane alone on its log: `ACK_ALONE`).
///
/// KEYS: lane hash, ids, released, acked, log, meta. ARGV: base, group, epoch, n, retry (`1`
/// when the first try's reply was lost).
pub(crate) const ACK: &str = r#"
local H, I, R, A, L, M = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local base, group, n = ARGV[1], ARGV[2], tonumber(ARGV[4])
local h, settled = ack_fence(H, A, ARGV[3], n, ARGV[5])
if settled then return settled end
local an, ai, oo = num(h[2]), num(h[3]), num(h[4])
-- The acked prefix moved to `an` (by `moved` entries, `oo` still out of order; `ap` its last
-- position, if any): recorded, and a publisher waiting for room rung.
local function advanced(an, moved, oo, ap)
  if ap then
    redis.call('HSET', H, 'an', s(an), 'ai', s(ai + moved), 'oo', s(oo), 'ap', ap, 'pw', '0')
  else
    redis.call('HSET', H, 'an', s(an), 'ai', s(ai + moved), 'oo', s(oo), 'pw', '0')
  end
  if h[5] == '1' then ring(base .. ':pbell') end
  return {'ok'}
end
redis.call('XACK', L, group, s(n) .. '-0')
-- In order (the common case): `n` is the lane's first unacked entry, the head of `ids`.
local first = redis.call('ZPOPMIN', I)
if not first[1] or entry_n(first[1]) ~= n then
  -- Out of order: an earlier entry is still out.
  if first[1] then redis.call('ZADD', I, first[2], first[1]) end
  redis.call('ZADD', A, n, s(n))
  redis.call('HSET', H, 'oo', s(oo + 1))
  return {'ok'}
end
an = n
local moved = 1
local ap = string.match(first[1], ':(.*)$')
if ap == '' then ap = nil end
while oo > 0 do
  local nx = redis.call('ZRANGE', I, 0, 0)
  if not nx[1] then break end
  local k = entry_n(nx[1])
  if redis.call('ZREM', A, s(k)) == 0 then break end
  redis.call('ZREM', I, nx[1])
  oo = oo - 1
  an = k
  moved = moved + 1
  local p = string.match(nx[1], ':(.*)$')
  if p ~= '' then ap = p end
end
return advanced(an, moved, oo, ap)
"#;

/// Ack entry `n` of a lane alone on its log: `ACK`'s fence and acked prefix, for a lane with no
/// pending list (its entries are `an + 1 ..= rd`, less `B:ack`) whose first unacked entry is
/// `an + 1` and whose positions come with the acks. Its own script, with eight keys and arguments
/// (`ACK` needs eleven, and took fifteen when it served both): each costs a run about 0.1 µs.
/// A first delivery's first ack try is a record in the ack log instead; this script (which
/// folds that log first) takes the ones the log refused, retries and redeliveries.
///
/// KEYS: lane hash (also the base of its keys), acked, attempts. ARGV: epoch, n, the entry's
/// position (padded, or empty), retry (`1` when the first try's reply was lost), the delivery's
/// attempt (a redelivered entry's count in `B:att` goes with its ack).
pub(crate) const ACK_ALONE: &str = r#"
local H, A = KEYS[1], KEYS[2]
local n = tonumber(ARGV[2])
fold(H)
local h, settled = ack_fence(H, A, ARGV[1], n, ARGV[4])
if not h then return settled end
local an, oo = num(h[2]), num(h[4])
if ARGV[5] ~= '1' then redis.call('HDEL', KEYS[3], s(n)) end
if n ~= an + 1 then
  redis.call('ZADD', A, n, s(n) .. ':' .. ARGV[3])
  redis.call('HSET', H, 'oo', oo + 1)
  return {'ok'}
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
return {'ok'}
"#;

/// Nack entry `n` (delivered as `attempt`): releases it for redelivery before anything new. A
/// stale (other epoch), repeated or out-of-date nack releases nothing.
///
/// KEYS: lane hash, released, acked, log, attempts. ARGV: base, group, epoch, n, attempt, `1` if
/// the lane is alone on its log (the attempt is `1 +` its count in `B:att`, not the pending
/// list's).
pub(crate) const NACK: &str = r#"
local H, R, A, L = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local base, group, n = ARGV[1], ARGV[2], tonumber(ARGV[4])
if ARGV[6] == '1' then
  fold(H)
  fold_dl(H)
end
local h = redis.call('HMGET', H, 'ep', 'an', 'oo', 'rd')
if (h[1] or '0') ~= ARGV[3] then return {'detached'} end
if is_acked(A, num(h[2]), num(h[3]), n) then return {'acked'} end
if redis.call('ZSCORE', R, s(n)) then return {'released'} end
if ARGV[6] == '1' then
  if n > num(h[4]) then return {'stale'} end
  if s(1 + num(redis.call('HGET', KEYS[5], s(n)))) ~= ARGV[5] then return {'stale'} end
else
  local p = redis.call('XPENDING', L, group, s(n) .. '-0', s(n) .. '-0', 1)
  if not p[1] or s(p[1][4]) ~= ARGV[5] then return {'stale'} end
end
redis.call('ZADD', R, n, s(n))
redis.call('HINCRBY', H, 'nrel', 1)
ring(base .. ':bell:' .. h[1])
return {'ok'}
"#;

/// Attach (`attach`: only if the claim is still `expected`) or re-attach (`reattach`: always) a
/// consumer: a new epoch, every pending entry released (taken back from the previous consumer,
/// whose acks are refused from now on), the previous consumer woken.
///
/// KEYS: lane hash, released, log, acked. ARGV: base, group, mode, expected claim, new claim, `1`
/// if the lane is alone on its log (its delivered, unacked entries are `an + 1 ..= rd` less
/// `B:ack`, not the pending list; its ack and delivery logs are folded, and their last ids
/// raised to `<new epoch>-0`: the old epoch's records are refused from now on).
pub(crate) const ATTACH: &str = r#"
local H, R, L, A = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local base, group, mode = ARGV[1], ARGV[2], ARGV[3]
local cur = redis.call('HGET', H, 'holder') or ''
if cur == ARGV[5] then return {'ok', tonumber(redis.call('HGET', H, 'ep'))} end
if mode == 'attach' and cur ~= ARGV[4] then return {'busy', cur} end
local old = redis.call('HGET', H, 'ep') or '0'
if ARGV[6] == '1' then
  fold(H)
  fold_dl(H)
end
if old == '0' then
  -- A lane's first epoch starts at the server's clock in microseconds, not at 1: the ends of a
  -- stream deleted and built again under this name hold smaller epochs, so their acks and
  -- receives are refused here (by the epoch checks and by the logs' fences).
  redis.call('HSET', H, 'ep', clock_base())
end
local ep = redis.call('HINCRBY', H, 'ep', 1)
if ARGV[6] == '1' then
  -- The old epoch's acks were folded above: from here on they are refused (an `XADD` of an id
  -- below the log's last id fails).
  fence(H .. ':al', s(ep) .. '-0')
  fence(H .. ':dl', s(ep) .. '-0')
  local st = redis.call('HMGET', H, 'an', 'rd', 'oo')
  local oo = num(st[3])
  for n = num(st[1]) + 1, num(st[2]) do
    if not is_acked(A, 0, oo, n) then redis.call('ZADD', R, n, s(n)) end
  end
else
  local start = '-'
  while true do
    local p = redis.call('XPENDING', L, group, start, '+', 1000)
    if not p[1] then break end
    for _, e in ipairs(p) do
      local n = entry_n(e[1])
      redis.call('ZADD', R, n, s(n))
      start = '(' .. e[1]
    end
  end
end
redis.call('HSET', H, 'holder', ARGV[5], 'lq', '', 'nrel', redis.call('ZCARD', R))
local oldbell = base .. ':bell:' .. old
ring(oldbell)
redis.call('PEXPIRE', oldbell, 60000)
return {'ok', ep}
"#;

/// Claim the producer of a lane (only if the claim is still `expected`): a new producer epoch
/// that fences the previous producer's publishes off.
///
/// KEYS: lane hash, log. ARGV: expected claim, new claim, `1` if the lane is alone on its log
/// (its log's and publish log's last ids are set to `<pub + 1>-<new epoch - 1>`, or to
/// `LOG_FENCE_ID`, the fourth argument, when closed: see "The publish log").
pub(crate) const CLAIM_PRODUCER: &str = r#"
local H = KEYS[1]
local cur = redis.call('HGET', H, 'ph') or ''
local h
if cur ~= ARGV[2] then
  if cur ~= ARGV[1] then return {'busy', cur} end
  -- As the consumer epoch in `ATTACH`: the first producer epoch starts at the clock.
  if not redis.call('HGET', H, 'pe') then redis.call('HSET', H, 'pe', clock_base()) end
  redis.call('HINCRBY', H, 'pe', 1)
  redis.call('HSET', H, 'ph', ARGV[2])
end
if ARGV[3] == '1' then
  fold_pl(H)
  local f = redis.call('HMGET', H, 'pe', 'pub', 'closed')
  local id = ARGV[4]
  if f[3] ~= '1' then id = s(num(f[2]) + 1) .. '-' .. s(num(f[1]) - 1) end
  fence(KEYS[2], id)
  fence(H .. ':pl', id)
end
h = redis.call('HMGET', H, 'pe', 'pub', 'lp')
return {'ok', tonumber(h[1]), num(h[2]), h[3] or ''}
"#;

/// Claim the fan-out of a fan-out stream (only if the claim is still `expected`): a new
/// fan-out epoch `fe` (in the meta hash) that fences the previous fan-out's publishes off, as
/// `CLAIM_PRODUCER` does for one lane (see "A fan-out stream").
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

/// The gate of a fan-out's publish (see "A fan-out stream"): for every lane, the checks of
/// `PUBLISH_ALONE` (fenced, a duplicate, a position that does not rise above every lane's last,
/// closed, full), the trim every 64th entry, and the room (`{'ok', room, lp}`: every lane
/// takes publishes up to count `room`, the least `ai + cap`, and the last position published,
/// padded or empty). Writes nothing else: the publish
/// is the client's plain `XADD` that follows.
///
/// KEYS: meta, log, then every lane's hash. ARGV: fan-out epoch, the count after this publish
/// (= the entry number `n`), position (padded, or empty), the lane the entry goes to (1-based;
/// 0: every lane; not used by the checks), the meta field numbering the entries, the meta field of the log's trim floor,
/// then every lane's hash again (for the trim floor). Replies `{'full', lane}` (1-based) for
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
if want % 64 == 0 then trim(L, M, ARGV[5], ARGV[6], true, 7) end
return {'ok', room, lp}
"#;

/// Record the stream's shape when it is new, and read it back: its sinks and how it is published
/// to (`lanes`: a producer per lane; `fanout`: its one fan-out). A stream made before the mode was
/// recorded was published to per lane. Its incarnation `inc` (random, set once): an end refused
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
/// KEYS: lane hash, log, then (a lane of a fan-out stream) every lane's hash. ARGV: base, `1`
/// for a sink lane alone on its log (its log's and publish log's last ids are raised to
/// `LOG_FENCE_ID`, the third argument: no `XADD` of its producer lands any more), `f` for a lane
/// of a fan-out stream (the log's last id is: no `XADD` of the fan-out lands any more; and
/// every lane's publishers are rung, since a waiting fan-out waits on the full lane's bell).
pub(crate) const CLOSE: &str = r#"
redis.call('HSET', KEYS[1], 'closed', '1')
if ARGV[2] == '1' then
  fence(KEYS[2], ARGV[3])
  fence(KEYS[1] .. ':pl', ARGV[3])
elseif ARGV[2] == 'f' then
  fence(KEYS[2], ARGV[3])
  for i = 3, #KEYS do ring(KEYS[i] .. ':pbell') end
end
ring(ARGV[1] .. ':bell:' .. (redis.call('HGET', KEYS[1], 'ep') or '0'))
ring(ARGV[1] .. ':pbell')
return 1
"#;

/// A lane's counters, read together (deliveries are `nread + rdl`: items read, and redelivered).
///
/// KEYS: lane hash, released. ARGV: `1` if the lane is alone on its log (its ack log is folded
/// first). Returns the hash fields then the number released.
pub(crate) const STATS: &str = r#"
if ARGV[1] == '1' then
  fold(KEYS[1])
  fold_dl(KEYS[1])
end
local h = redis.call('HMGET', KEYS[1], 'cap', 'pub', 'nread', 'ai', 'rdl', 'lp', 'ap', 'closed', 'ep')
table.insert(h, redis.call('ZCARD', KEYS[2]))
return h
"#;

/// Fold the ack log of each lane alone on its log given (KEYS: their hashes) into its acked
/// prefix, before a plain read of it (`acked`, the watermark, `is_idle`).
pub(crate) const FOLD: &str = r#"
for _, H in ipairs(KEYS) do
  fold_pl(H)
  fold(H)
end
return 1
"#;

/// Trim the log now (below every lane's acked prefix); returns the floor.
///
/// KEYS: log, meta. ARGV: the meta field numbering the entries, the trim-floor field, `1` if one
/// lane is alone on the log, then the ids keys of every lane sharing the log (or the lone lane's
/// hash).
pub(crate) const TRIM: &str = r#"
return trim(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3] == '1', 4)
"#;

/// Each script with the helpers it calls (directly or through another helper), in their order.
pub(crate) fn source(body: &str) -> String {
    let calls = |text: &str, name: &str| {
        text.match_indices(name).any(|(i, _)| {
            let before = text[..i].chars().next_back();
            let after = text[i + name.len()..].chars().next();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && after == Some('(')
        })
    };
    // A helper calls only helpers before it: one pass from the last.
    let mut used = vec![false; HELPERS.len()];
    for i in (0..HELPERS.len()).rev() {
        let name = HELPERS[i].0;
        used[i] = calls(body, name)
            || HELPERS[i + 1..].iter().zip(&used[i + 1..]).any(|((_, code), u)| *u && calls(code, name));
    }
    let mut out: String =
        HELPERS.iter().zip(&used).filter(|(_, u)| **u).map(|((_, code), _)| *code).collect();
    out.push_str(body);
    out
}
