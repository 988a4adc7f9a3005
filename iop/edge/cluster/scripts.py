# -*- test-case-name: tests.test_cluster_leases -*-
"""
The lease table's server-side Lua scripts: each operation is one script, so it is atomic and one
round trip, and every time inside it is the Redis server's (``TIME``), the one clock all Edges
share.

Data model (``P`` is ``cluster.key_prefix``; ``{P}`` is a Redis Cluster hash tag, so every key of
a cluster's table lives in one slot: each script declares the key(s) it is called for, which
route it, and derives the provider keys from the prefix):

``{P}:held:<provider_id>``
    ZSET: one member per lease held on the provider (the lease id), scored by its expiry in
    milliseconds of server time. ``in_flight`` = the members whose score is in the future.
``{P}:long:<provider_id>``
    ZSET: the long-context leases among them, scored the same way.
``{P}:lease:<lease_id>``
    STRING, expiring with the lease: ``{"p": provider_id, "e": edge_id, "l": 0|1}`` (JSON), so
    that release and renew need only the lease id.
``{P}:rr:<model_key>``
    STRING: the configured position where the model key's next round-robin tie-break starts.
``{P}:seq``
    STRING: the counter that makes lease ids unique (``<edge_id>:<n>``).
``{P}:edges``
    ZSET: the Edges that reported their view lately (member: edge id), scored by the time of
    their last report; one that stopped reporting drops out after the report's lifetime.
``{P}:edge:<edge_id>``
    STRING, expiring: the Edge's last report, its waiters per model key (JSON).
``{P}:wake``
    Pub/sub channel: every returned slot is published (message: the provider id).
``{P}:epoch``
    STRING: when the table's last recovery period ends (ms). Absent means Redis lost the table
    (it started empty: a restart without persistence, a failover to an empty replica, a flush)
    or never had one; the first acquire or renewal then opens a recovery period of one lease
    TTL: acquire grants nothing (the caller waits) while every Edge's next renewal re-asserts
    the leases it still holds (each Edge renews every third of a TTL), so capacity held before
    the loss is counted again before anything new is granted. A fresh table costs the same
    wait once.

Cost per call: acquire O(k · (log N + E)) for k candidates, N leases held per provider and E
expired leases dropped (each lease is dropped once, so E is amortized O(1)); release and each
lease renewed O(log N); in_flight O(log N + E) per provider.

A lease whose expiry has passed counts nowhere: acquire, release and in_flight first drop the
expired members of the ZSETs they read (``ZREMRANGEBYSCORE -inf now``), renew refuses to extend
one, and the lease's own key expires with it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = ["ACQUIRE", "IN_FLIGHT", "RELEASE", "RENEW", "VIEW", "Script"]


@dataclass(frozen=True)
class Script:
    """A Lua script and its SHA1 (what EVALSHA names it by)."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# The table's epoch (see the module docstring): absent, the first call opens a recovery period
# of one lease TTL; true while it lasts.
_RECOVERING = """
local function recovering(key, ttl)
  local ends = redis.call('GET', key)
  if not ends then
    redis.call('SET', key, now + ttl)
    return true
  end
  return now < tonumber(ends)
end
"""

# A call its Edge has given up on (it timed out waiting: Redis hung, and runs the call only
# once it answers again) grants and renews nothing: ``deadline`` (ms of server time, from the
# Edge's estimate of the offset between its clock and Redis's; "0" or absent: none) is when the
# Edge stops waiting. Without it a hang left grants no Edge held, blocking their slots a TTL.
_LATE = """
local function late(deadline)
  deadline = tonumber(deadline or '0') or 0
  return deadline > 0 and now > deadline
end
"""

# KEYS: seq (declared for routing: every other key shares its hash tag, so its slot).
# ARGV: key prefix ("{P}:"), edge_id, ttl_ms, ring size, model key, then the candidates packed
#       in one string (one argument costs the client more than the server's parsing): a line
#       each, "provider_id capacity long_capacity priority position long(0/1)", then the
#       deadline (ms, server time; "0": none).
# Returns nil (every candidate full), -1 (the table is recovering: nothing is granted), -2 (run
# after its deadline: nothing is granted) or one string "provider_id lease_id long(0/1)
# expires_at_ms".
ACQUIRE = Script(
    "acquire",
    _NOW
    + _RECOVERING
    + _LATE
    + """
local prefix, edge, ttl, ring = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if late(ARGV[7]) then
  return -2
end
if recovering(prefix .. 'epoch', ttl) then
  return -1
end
local rr = prefix .. 'rr:' .. ARGV[5]
local start = tonumber(redis.call('GET', rr) or '0') % ring
local best, best_used, best_priority, best_turn
for line in string.gmatch(ARGV[6], '[^\\n]+') do
  local provider, capacity, long_capacity, priority, position, long =
    string.match(line, '^(%S+) (%d+) (%d+) (%-?%d+) (%d+) ([01])$')
  capacity, long_capacity = tonumber(capacity), tonumber(long_capacity)
  priority, position, long = tonumber(priority), tonumber(position), long == '1'
  local held, long_held = prefix .. 'held:' .. provider, prefix .. 'long:' .. provider
  redis.call('ZREMRANGEBYSCORE', held, '-inf', now)
  redis.call('ZREMRANGEBYSCORE', long_held, '-inf', now)
  local used = redis.call('ZCARD', held)
  local room = used < capacity
  if room and long and long_capacity > 0 then
    room = redis.call('ZCARD', long_held) < long_capacity
  end
  if room then
    local turn = (position - start) % ring
    if best == nil or used < best_used
        or (used == best_used and (priority < best_priority
            or (priority == best_priority and turn < best_turn))) then
      best = {provider = provider, position = position, long = long}
      best_used, best_priority, best_turn = used, priority, turn
    end
  end
end
if best == nil then
  return nil
end
local id = edge .. ':' .. redis.call('INCR', KEYS[1])
local expires = now + ttl
redis.call('ZADD', prefix .. 'held:' .. best.provider, expires, id)
if best.long then
  redis.call('ZADD', prefix .. 'long:' .. best.provider, expires, id)
end
local record = cjson.encode({p = best.provider, e = edge, l = best.long and 1 or 0})
redis.call('SET', prefix .. 'lease:' .. id, record, 'PX', ttl)
redis.call('SET', rr, (best.position + 1) % ring)
return string.format('%s %s %d %d', best.provider, id, best.long and 1 or 0, expires)
""",
)

# KEYS: the lease's key. ARGV: held key prefix, long key prefix, lease id, and optionally the
# wake-up channel: a returned slot is published there (message: the provider id), so Edges with
# waiters retry at once. Returns 1 when this call returned the lease's slot(s), else 0 (unknown,
# released, expired).
RELEASE = Script(
    "release",
    _NOW
    + """
local record = redis.call('GET', KEYS[1])
if not record then
  return 0
end
local lease = cjson.decode(record)
redis.call('DEL', KEYS[1])
local held = ARGV[1] .. lease.p
redis.call('ZREMRANGEBYSCORE', held, '-inf', now)
local returned = redis.call('ZREM', held, ARGV[3])
redis.call('ZREM', ARGV[2] .. lease.p, ARGV[3])
if returned == 1 and ARGV[4] then
  redis.call('PUBLISH', ARGV[4], lease.p)
end
return returned
""",
)

# KEYS: the leases' keys. ARGV: held key prefix, long key prefix, ttl_ms, the epoch key ("":
# never re-assert), the renewing Edge's id, then one line per lease (in KEYS' order) packed in
# one string: "lease_id provider_id long(0/1)", then the deadline (ms, server time; "0": none).
# Returns one 0/1 per lease: 1 when it is held and now expires ttl_ms from now — still held,
# or (while the table recovers) re-asserted; or -2 (run after its deadline: nothing renewed).
RENEW = Script(
    "renew",
    _NOW
    + _RECOVERING
    + _LATE
    + """
if late(ARGV[7]) then
  return -2
end
local ttl = tonumber(ARGV[3])
local expires = now + ttl
local reassert = ARGV[4] ~= '' and recovering(ARGV[4], ttl)
local renewed = {}
local i = 0
for line in string.gmatch(ARGV[6], '[^\\n]+') do
  i = i + 1
  local id, provider, long = string.match(line, '^(%S+) (%S+) ([01])$')
  local key = KEYS[i]
  local record = redis.call('GET', key)
  local ok = 0
  if record then
    local lease = cjson.decode(record)
    local held = ARGV[1] .. lease.p
    local score = redis.call('ZSCORE', held, id)
    if score and tonumber(score) > now then
      redis.call('ZADD', held, 'XX', expires, id)
      if lease.l == 1 then
        redis.call('ZADD', ARGV[2] .. lease.p, 'XX', expires, id)
      end
      redis.call('PEXPIRE', key, ttl)
      ok = 1
    end
  elseif reassert then
    redis.call('ZADD', ARGV[1] .. provider, expires, id)
    if long == '1' then
      redis.call('ZADD', ARGV[2] .. provider, expires, id)
    end
    local lease = cjson.encode({p = provider, e = ARGV[5], l = tonumber(long)})
    redis.call('SET', key, lease, 'PX', ttl)
    ok = 1
  end
  renewed[i] = ok
end
return renewed
""",
)

# KEYS: per provider: held, long. Returns per provider: in_flight, long_in_flight.
IN_FLIGHT = Script(
    "in_flight",
    _NOW
    + """
local counts = {}
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  counts[i] = redis.call('ZCARD', key)
end
return counts
""",
)

# KEYS: edges. ARGV: key prefix ("{P}:"), edge_id, report lifetime (ms), this Edge's report
# (JSON), then the provider ids to count. Returns JSON: {"now": ms, "edges": [[id, seen_ms,
# report], ...], "held": [in_flight, long_in_flight, ...] in the providers' order}.
VIEW = Script(
    "view",
    _NOW
    + """
local prefix, edge, life = ARGV[1], ARGV[2], tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now, edge)
redis.call('SET', prefix .. 'edge:' .. edge, ARGV[4], 'PX', life)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - life)
local listed = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local edges = {}
for i = 1, #listed, 2 do
  local report = redis.call('GET', prefix .. 'edge:' .. listed[i]) or '{}'
  edges[#edges + 1] = {listed[i], tonumber(listed[i + 1]), report}
end
local held = {}
for i = 5, #ARGV do
  local key, long = prefix .. 'held:' .. ARGV[i], prefix .. 'long:' .. ARGV[i]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  redis.call('ZREMRANGEBYSCORE', long, '-inf', now)
  held[#held + 1] = redis.call('ZCARD', key)
  held[#held + 1] = redis.call('ZCARD', long)
end
if #edges == 0 then edges = nil end
if #held == 0 then held = nil end
return cjson.encode({now = now, edges = edges or cjson.null, held = held or cjson.null})
""",
)
