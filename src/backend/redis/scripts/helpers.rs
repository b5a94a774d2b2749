//! The Lua helpers the scripts share ([`HELPERS`]) and [`source`], which prepends to a script
//! those it calls.

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
        "ring_watermark",
        r#"
-- Rings every watermark waiter registered in set `W` (see "Watermark waiters") and empties it;
-- a key no waiter takes (its waiter gone) expires.
local function ring_watermark(W)
  for _, k in ipairs(redis.call('SMEMBERS', W)) do
    ring(k)
    redis.call('PEXPIRE', k, 60000)
  end
  redis.call('DEL', W)
end
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
-- A sink lane (`fan` set): the log's own entries record its publishes (see "The fan-out"). The
-- newest entry's `p` is the last position published (whichever lanes it went to), so one entry
-- moves `pub` and `last` to its number and `lp` to its `p`. Every reader of those fields folds
-- first. (The request lane's `PUBLISH` writes them itself.)
local function fold_pl(H)
  local f = redis.call('HMGET', H, 'fan', 'last')
  if f[1] ~= '1' then return end
  local L = string.match(H, '^({.*}):l:') .. ':log'
  local top = redis.call('XREVRANGE', L, '+', '-', 'COUNT', 1)[1]
  if not top or entry_n(top[1]) <= num(f[2]) then return end
  local n, p = entry_n(top[1]), top[2][4]
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
-- The deliveries recorded in lane `H`'s delivery log `H:dl` (the receive of the new entry a
-- consumer expects is a plain `XADD H:dl <epoch>-<n>`: see "The delivery log") move `rd` (and
-- `nread`, equal on every lane) up to the newest of them, but not above the
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
-- Applies the acks recorded in lane `H`'s ack log `H:al` (an in-order ack of a first delivery is a plain `XADD H:al <epoch>-<n> p <position>`, fenced by the epoch and
-- refused when not above the last one: see "The ack log") to the acked prefix, as `ACK`
-- would have one by one, and empties the log (its last id, the fence, stays). A record of
-- another epoch than the lane's (possible only on a log deleted and written again) is dropped.
-- Every reader of a lane's acked prefix folds first.
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
-- The ack fence of `ACK`: the lane hash's `ep an ai oo pw ww` for an ack of entry
-- `n` by the holder of `epoch`, or (nil and) the reply when the ack is settled already: a
-- detached holder's (`unknown` if its retried ack had landed), or an entry acked before.
local function ack_fence(H, A, epoch, n, retry)
  local h = redis.call('HMGET', H, 'ep', 'an', 'ai', 'oo', 'pw', 'ww')
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
-- Trims log `L` below every lane's acked prefix (never above): the entries up to the least `an`
-- of the lanes whose hashes are ARGV[first..] (each of them owns every entry of the log; the
-- sink lanes' publish record is the log itself, folded before any of it goes). `trimf`: the
-- meta field of the log's trim floor. Returns the floor.
local function trim(L, M, trimf, first)
  local floor
  for i = first, #ARGV do
    fold_pl(ARGV[i])
    fold(ARGV[i])
    local an = num(redis.call('HGET', ARGV[i], 'an'))
    if not floor or an < floor then floor = an end
  end
  floor = floor or 0
  if floor > num(redis.call('HGET', M, trimf)) then
    redis.call('XTRIM', L, 'MINID', s(floor + 1) .. '-0')
    redis.call('HSET', M, trimf, floor)
  end
  return floor
end
"#,
    ),
];

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
