# -*- test-case-name: tests.test_cluster_quota -*-
"""
The quota table's server-side Lua scripts (:mod:`iop.edge.cluster.quota`): one script per
operation — reserve (every subject of a request at once), settle, renew, snapshot — so each is
atomic and one round trip, on Redis's clock (``TIME``), the one all Edges share. The rules are
the in-process table's (:mod:`iop.edge.quota`); the periods are computed here in milliseconds
as :mod:`iop.edge.quota.periods` computes them in seconds (civil dates from day numbers, UTC).

Data model (``Q`` is ``{P}:quota:``, ``{P}`` the cluster's hash tag; ``S`` a subject,
``key:<name>`` or ``team:<name>``, always last so that no two keys can collide):

``Q conc:S``
    ZSET: the reservations holding a concurrency slot (member: reservation id), scored by the
    slot's expiry (ms): renewed by its Edge every third of the TTL, so an Edge that dies frees
    its slots within the TTL. Expired members count nowhere and are dropped when read.
``Q req:S``
    ZSET: the requests-per-minute log, scored by admission time (ms).
``Q tok:S``, ``Q tokv:S``, ``Q tsum:S``
    The tokens-per-minute log: ZSET by admission time, HASH id → tokens (the worst case, then
    the charge), STRING the sum of the window (kept as entries come, leave and are settled,
    so a check never adds the whole window up). The window's keys expire one window after
    the last admission.
``Q budget:<period>:<start ms>:S``
    HASH ``t`` (tokens), ``c`` (cost micro-units): the period's running total of reserved
    worst cases and settled charges. Expires a week after the period ends (``total`` never).
``Q res:<id>``
    STRING (JSON), expiring with the concurrency slot and renewed with it: the reservation's
    subjects, budget keys and demand — what settle needs, and its exactly-once guard (settle
    deletes it; a reservation whose record is gone settles nothing, so its worst case stays
    charged: never undercounted).
``Q seq``
    STRING: the counter that makes reservation ids unique (``<edge_id>:<n>``).

Cost per call: O(s · (log N + E + b)) for s subjects, N entries per log, E entries leaving the
window (each once: amortized O(1)) and b budgets; a refusal for tokens per minute walks the
window once to say when the request would fit.
"""

from __future__ import annotations

from iop.edge.cluster.scripts import Script

__all__ = ["RENEW", "RESERVE", "SETTLE", "SNAPSHOT"]

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function fmt(x) return string.format('%.0f', x) end
"""

# Like the lease scripts: a call its Edge gave up on changes nothing.
_LATE = """
local function late(deadline)
  deadline = tonumber(deadline or '0') or 0
  return deadline > 0 and now > deadline
end
"""

# Calendar periods in UTC, in ms: start and end (-1: none). Days ↔ civil dates by
# Howard Hinnant's algorithms (proleptic Gregorian, exact in doubles for any date here).
_PERIODS = """
local DAY = 86400000
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * ((m + 9) % 12) + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end
local function civil_from_days(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  if m <= 2 then y = y + 1 end
  return y, m
end
local function bounds(period, at)
  if period == 'total' then return 0, -1 end
  local days = math.floor(at / DAY)
  if period == 'day' then return days * DAY, (days + 1) * DAY end
  if period == 'week' then
    local monday = days - (days + 3) % 7
    return monday * DAY, (monday + 7) * DAY
  end
  local y, m = civil_from_days(days)
  local ny, nm = y, m + 1
  if nm > 12 then ny, nm = y + 1, 1 end
  return days_from_civil(y, m, 1) * DAY, days_from_civil(ny, nm, 1) * DAY
end
"""

# A subject's windows without what left them (every entry at or before ``cutoff``); the request
# count, the token sum and the concurrency slots held.
_PRUNE = """
local function prune(q, name, cutoff)
  local req, tok = q .. 'req:' .. name, q .. 'tok:' .. name
  local vals, sum = q .. 'tokv:' .. name, q .. 'tsum:' .. name
  redis.call('ZREMRANGEBYSCORE', req, '-inf', cutoff)
  while true do
    local old = redis.call('ZRANGEBYSCORE', tok, '-inf', cutoff, 'LIMIT', 0, 500)
    if #old == 0 then break end
    local amounts = redis.call('HMGET', vals, unpack(old))
    local total = 0
    for j = 1, #old do total = total + (tonumber(amounts[j]) or 0) end
    redis.call('HDEL', vals, unpack(old))
    redis.call('ZREM', tok, unpack(old))
    redis.call('DECRBY', sum, fmt(total))
  end
  local conc = q .. 'conc:' .. name
  redis.call('ZREMRANGEBYSCORE', conc, '-inf', now)
  return {
    req = redis.call('ZCARD', req),
    tok = tonumber(redis.call('GET', sum) or '0'),
    conc = redis.call('ZCARD', conc),
  }
end
"""

# KEYS: seq (declared for routing). ARGV: Q, edge_id, ttl_ms, window_ms, demand tokens, demand
# cost (-1: unknown), the subjects as JSON [[subject, rpm, tpm, concurrency, [[period, tokens,
# cost], ...]], ...] (0: no such limit), deadline (ms; "0": none).
# Returns "OK <id> <now>", or "NO <kind> <subject index, 1-based> <limit> <remaining>
# <retry_after_ms|-1> <reset_after_ms|-1> <period|-> <unit|->", or -2 (run after its deadline).
RESERVE = Script(
    "quota_reserve",
    _NOW
    + _LATE
    + _PERIODS
    + _PRUNE
    + """
local q, edge = ARGV[1], ARGV[2]
local ttl, window = tonumber(ARGV[3]), tonumber(ARGV[4])
local tokens, cost = tonumber(ARGV[5]), tonumber(ARGV[6])
if late(ARGV[8]) then
  return -2
end
local subjects = cjson.decode(ARGV[7])
local cutoff = now - window
local GRACE = 7 * DAY

local function no(kind, i, limit, remaining, retry, reset, period, unit)
  return table.concat({'NO', kind, i, fmt(limit), fmt(math.max(0, remaining)),
    retry and fmt(retry) or '-1', reset and fmt(reset) or '-1', period or '-', unit or '-'}, ' ')
end

local state = {}
for i, s in ipairs(subjects) do
  state[i] = prune(q, s[1], cutoff)
end

for i, s in ipairs(subjects) do
  for _, b in ipairs(s[5]) do
    local period, btok, bcost = b[1], b[2], b[3]
    local start, finish = bounds(period, now)
    local used = redis.call('HMGET', q .. 'budget:' .. period .. ':' .. fmt(start) .. ':' .. s[1],
      't', 'c')
    local ut, uc = tonumber(used[1] or '0'), tonumber(used[2] or '0')
    local reset = nil
    if finish >= 0 then reset = finish - now end
    if btok > 0 and ut + tokens > btok then
      local retry = nil
      if tokens <= btok then retry = reset end
      return no('budget', i, btok, btok - ut, retry, reset, period, 'tokens')
    end
    if bcost > 0 and (cost < 0 or uc + cost > bcost) then
      local retry = nil
      if cost >= 0 and cost <= bcost then retry = reset end
      return no('budget', i, bcost, bcost - uc, retry, reset, period, 'cost')
    end
  end
end

for i, s in ipairs(subjects) do
  local rpm, count = s[2], state[i].req
  if rpm > 0 and count + 1 > rpm then
    local retry, reset = nil, nil
    if count > 0 then
      local req = q .. 'req:' .. s[1]
      local leaving = redis.call('ZRANGE', req, count - rpm, count - rpm, 'WITHSCORES')
      retry = tonumber(leaving[2]) + window - now
      local last = redis.call('ZRANGE', req, -1, -1, 'WITHSCORES')
      reset = tonumber(last[2]) + window - now
    end
    return no('requests_per_minute', i, rpm, rpm - count, retry, reset)
  end
end

for i, s in ipairs(subjects) do
  local tpm, sum = s[3], state[i].tok
  if tpm > 0 and sum + tokens > tpm then
    local tok, vals = q .. 'tok:' .. s[1], q .. 'tokv:' .. s[1]
    local retry, reset = nil, nil
    local last = redis.call('ZRANGE', tok, -1, -1, 'WITHSCORES')
    if #last > 0 then reset = tonumber(last[2]) + window - now end
    if tokens <= tpm then
      local entries = redis.call('ZRANGE', tok, 0, -1, 'WITHSCORES')
      local total = sum
      for j = 1, #entries, 2 do
        total = total - tonumber(redis.call('HGET', vals, entries[j]) or '0')
        if total + tokens <= tpm then
          retry = tonumber(entries[j + 1]) + window - now
          break
        end
      end
    end
    return no('tokens_per_minute', i, tpm, tpm - sum, retry, reset)
  end
end

for i, s in ipairs(subjects) do
  local cap = s[4]
  if cap > 0 and state[i].conc + 1 > cap then
    return no('concurrent_requests', i, cap, cap - state[i].conc, 1000, nil)
  end
end

local id = edge .. ':' .. redis.call('INCR', KEYS[1])
local names, buckets = {}, {}
for i, s in ipairs(subjects) do
  local name = s[1]
  names[i] = name
  local conc = q .. 'conc:' .. name
  redis.call('ZADD', conc, now + ttl, id)
  redis.call('PEXPIRE', conc, ttl)
  local req, tok = q .. 'req:' .. name, q .. 'tok:' .. name
  local vals, sum = q .. 'tokv:' .. name, q .. 'tsum:' .. name
  redis.call('ZADD', req, now, id)
  redis.call('ZADD', tok, now, id)
  redis.call('HSET', vals, id, fmt(tokens))
  redis.call('INCRBY', sum, fmt(tokens))
  for _, key in ipairs({req, tok, vals, sum}) do
    redis.call('PEXPIRE', key, window)
  end
  for _, b in ipairs(s[5]) do
    local start, finish = bounds(b[1], now)
    local key = q .. 'budget:' .. b[1] .. ':' .. fmt(start) .. ':' .. name
    redis.call('HINCRBY', key, 't', fmt(tokens))
    if cost >= 0 then
      redis.call('HINCRBY', key, 'c', fmt(cost))
    end
    if finish >= 0 then
      redis.call('PEXPIREAT', key, fmt(finish + GRACE))
    end
    buckets[#buckets + 1] = key
  end
end
local record = cjson.encode({s = names, b = buckets, t = fmt(tokens), c = fmt(cost)})
redis.call('SET', q .. 'res:' .. id, record, 'PX', ttl)
return 'OK ' .. id .. ' ' .. fmt(now)
""",
)

# KEYS: the reservation's record. ARGV: Q, reservation id, charge tokens, charge cost (-1:
# unknown). Returns 1 when this call settled it, 0 when it was already settled, or its record
# expired (its Edge could not renew it: the worst case stays charged).
SETTLE = Script(
    "quota_settle",
    _NOW
    + """
local record = redis.call('GET', KEYS[1])
if not record then
  return 0
end
redis.call('DEL', KEYS[1])
local r = cjson.decode(record)
local q, id = ARGV[1], ARGV[2]
local charged, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local reserved, reserved_cost = tonumber(r.t), tonumber(r.c)
for _, name in ipairs(r.s) do
  redis.call('ZREM', q .. 'conc:' .. name, id)
  local vals = q .. 'tokv:' .. name
  local held = redis.call('HGET', vals, id)
  if held then
    redis.call('HSET', vals, id, fmt(charged))
    redis.call('INCRBY', q .. 'tsum:' .. name, fmt(charged - tonumber(held)))
  end
end
for _, key in ipairs(r.b) do
  if redis.call('EXISTS', key) == 1 then
    redis.call('HINCRBY', key, 't', fmt(charged - reserved))
    if reserved_cost >= 0 and cost >= 0 then
      redis.call('HINCRBY', key, 'c', fmt(cost - reserved_cost))
    end
  end
end
return 1
""",
)

# KEYS: the reservations' records. ARGV: Q, ttl_ms, the reservation ids (one per line, in KEYS'
# order), deadline (ms; "0": none). Returns one 0/1 per reservation: 1 when its record and every
# concurrency slot it holds now expire ttl_ms from now; or -2 (run after its deadline).
RENEW = Script(
    "quota_renew",
    _NOW
    + _LATE
    + """
if late(ARGV[4]) then
  return -2
end
local q, ttl = ARGV[1], tonumber(ARGV[2])
local renewed = {}
local i = 0
for id in string.gmatch(ARGV[3], '[^\\n]+') do
  i = i + 1
  local ok = 0
  local record = redis.call('GET', KEYS[i])
  if record then
    ok = 1
    for _, name in ipairs(cjson.decode(record).s) do
      local conc = q .. 'conc:' .. name
      local score = redis.call('ZSCORE', conc, id)
      if score and tonumber(score) > now then
        redis.call('ZADD', conc, 'XX', now + ttl, id)
        redis.call('PEXPIRE', conc, ttl)
      else
        ok = 0
      end
    end
    if ok == 1 then
      redis.call('PEXPIRE', KEYS[i], ttl)
    end
  end
  renewed[i] = ok
end
return renewed
""",
)

# KEYS: seq (routing). ARGV: Q, subject, window_ms, then one period per budget asked about.
# Returns "<now> <concurrent> <requests> <tokens>" then, per period, " <start> <end|-1> <tokens>
# <cost>". Changes nothing but dropping what has left the windows or expired.
SNAPSHOT = Script(
    "quota_snapshot",
    _NOW
    + _PERIODS
    + _PRUNE
    + """
local q, name, window = ARGV[1], ARGV[2], tonumber(ARGV[3])
local held = prune(q, name, now - window)
local out = {fmt(now), held.conc, held.req, fmt(held.tok)}
for j = 4, #ARGV do
  local start, finish = bounds(ARGV[j], now)
  local used = redis.call('HMGET', q .. 'budget:' .. ARGV[j] .. ':' .. fmt(start) .. ':' .. name,
    't', 'c')
  out[#out + 1] = table.concat({fmt(start), fmt(finish), used[1] or '0', used[2] or '0'}, ' ')
end
return table.concat(out, ' ')
""",
)
