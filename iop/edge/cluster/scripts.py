# -*- test-case-name: tests.test_cluster_leases -*-
"""
The lease table's server-side Lua scripts: each operation is one script, so it is atomic and one
round trip, and every time inside it is the Redis server's (``TIME``), the one clock all Edges
share.

Data model (``P`` is ``cluster.key_prefix``; ``{P}`` is a Redis Cluster hash tag, so every key of
a cluster's table lives in one slot and the scripts may touch them together):

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

A lease whose expiry has passed counts nowhere: every script first drops the expired members of
the ZSETs it reads (``ZREMRANGEBYSCORE -inf now``), and the lease's own key expires with it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = ["ACQUIRE", "IN_FLIGHT", "RELEASE", "RENEW", "Script"]


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

# KEYS: seq, rr, then per candidate: held, long.
# ARGV: edge_id, ttl_ms, ring size, lease key prefix, candidate count, then per candidate
#       (6 each): provider_id, capacity, long_capacity, priority, position, long (0/1).
# Returns nil (every candidate full) or {provider_id, lease_id, long, expires_at_ms}.
ACQUIRE = Script(
    "acquire",
    _NOW
    + """
local edge, ttl, ring = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local lease_prefix, n = ARGV[4], tonumber(ARGV[5])
local start = tonumber(redis.call('GET', KEYS[2]) or '0') % ring
local best, best_used, best_priority, best_turn
for i = 0, n - 1 do
  local a = 6 + i * 6
  local held, long = KEYS[3 + i * 2], KEYS[4 + i * 2]
  local capacity, long_capacity = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local priority, position = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  redis.call('ZREMRANGEBYSCORE', held, '-inf', now)
  redis.call('ZREMRANGEBYSCORE', long, '-inf', now)
  local used = redis.call('ZCARD', held)
  local room = used < capacity
  if room and ARGV[a + 5] == '1' and long_capacity > 0 then
    room = redis.call('ZCARD', long) < long_capacity
  end
  if room then
    local turn = (position - start) % ring
    if best == nil or used < best_used
        or (used == best_used and (priority < best_priority
            or (priority == best_priority and turn < best_turn))) then
      best, best_used, best_priority, best_turn = i, used, priority, turn
    end
  end
end
if best == nil then
  return nil
end
local a = 6 + best * 6
local provider, position, long = ARGV[a], tonumber(ARGV[a + 4]), ARGV[a + 5] == '1'
local id = edge .. ':' .. redis.call('INCR', KEYS[1])
local expires = now + ttl
redis.call('ZADD', KEYS[3 + best * 2], expires, id)
if long then
  redis.call('ZADD', KEYS[4 + best * 2], expires, id)
end
local record = cjson.encode({p = provider, e = edge, l = long and 1 or 0})
redis.call('SET', lease_prefix .. id, record, 'PX', ttl)
redis.call('SET', KEYS[2], (position + 1) % ring)
return {provider, id, long and 1 or 0, expires}
""",
)

# KEYS: the lease's key. ARGV: held key prefix, long key prefix, lease id.
# Returns 1 when this call returned the lease's slot(s), else 0 (unknown, released, expired).
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
return returned
""",
)

# KEYS: the leases' keys. ARGV: held key prefix, long key prefix, ttl_ms, then the lease ids.
# Returns one 0/1 per lease: 1 when it was still held and now expires ttl_ms from now.
RENEW = Script(
    "renew",
    _NOW
    + """
local ttl = tonumber(ARGV[3])
local expires = now + ttl
local renewed = {}
for i, key in ipairs(KEYS) do
  local id = ARGV[3 + i]
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
