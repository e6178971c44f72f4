"""Every state change of a key, as one Lua script each, so no step is ever half done.

All scripts share `LIB`: KEYS are the project prefix and dramatiq's queue key, from which
every other key name is derived (as dramatiq's own dispatch.lua derives its keys), and NOW
is read from the server's clock, so lease TTLs (PX), deadlines and ready times all use one
clock whatever host calls.

Invariants the scripts keep:
  * a key in `dirty` is waiting; it has a queued message unless its lease is held (the
    holder's `done` enqueues it) -- the audit repairs any other case;
  * a key is never both dirty and delayed (an immediate add supersedes a delayed one);
  * the lease is released only by the token that took it (compare-and-delete), and a
    release that finds another token touches nothing of the new holder's.

Message bodies are built in Python (dramatiq's encoder) and passed in, because Lua cannot
encode with whatever encoder dramatiq is configured with; scripts that may need a body for a
key not known in advance (promotion, recovery, repair) come as a cheap "which keys?" read
followed by a script that re-checks each key atomically.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from warmpool.queue.layout import Layout

LIB = r"""
local P, QUEUE = KEYS[1], KEYS[2]
local DIRTY, INFLIGHT, FAILURES = P .. "dirty", P .. "inflight", P .. "failures"
local DELAYED, ERRORS, ADDED_AT = P .. "delayed", P .. "errors", P .. "added_at"
local PENDING, DEAD, FENCE, LEASE = P .. "pending", P .. "dead", P .. "fence", P .. "lease:"
local MSGS, XQ = QUEUE .. ".msgs", QUEUE .. ".XQ"
local XQ_MSGS = XQ .. ".msgs"
local clock = redis.call("TIME")
local NOW = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

-- Exactly what dramatiq's dispatch.lua "enqueue" writes, plus our pending pointer.
local function enqueue(key, rid, body)
  redis.call("HSET", MSGS, rid, body)
  redis.call("RPUSH", QUEUE, rid)
  redis.call("HSET", PENDING, key, rid)
end

-- What dispatch.lua's "ack" writes: forget the delivery and its body.
local function ack(acks, rid)
  if acks ~= "" and redis.call("SREM", acks, rid) > 0 then redis.call("HDEL", MSGS, rid) end
end

local function has_message(key)
  local rid = redis.call("HGET", PENDING, key)
  return rid and redis.call("HEXISTS", MSGS, rid) == 1
end

local function is_dirty(key)
  return redis.call("SISMEMBER", DIRTY, key) == 1
end

local function leased(key)
  return redis.call("EXISTS", LEASE .. key) == 1
end

-- Returns true if the key was not dirty before.
local function mark_dirty(key)
  redis.call("ZREM", DELAYED, key)
  if redis.call("SADD", DIRTY, key) == 0 then return false end
  redis.call("HSETNX", ADDED_AT, key, NOW)
  return true
end

local function add(key, rid, body)
  if not mark_dirty(key) then return "deduplicated" end
  if leased(key) then return "rerun" end
  enqueue(key, rid, body)
  return "enqueued"
end

local function acquire(key, token, ttl)
  local fence = redis.call("INCR", FENCE)
  local value = fence .. "|" .. token
  redis.call("SET", LEASE .. key, value, "PX", ttl)
  redis.call("ZADD", INFLIGHT, NOW + tonumber(ttl), key)
  return value, fence
end

local function clear_dead(key)
  local old = redis.call("HGET", DEAD, key)
  if old then
    redis.call("ZREM", XQ, old)
    redis.call("HDEL", XQ_MSGS, old)
    redis.call("HDEL", DEAD, key)
  end
end

-- One dead letter per key, in dramatiq's own dead-letter queue.
local function dead_letter(key, rid, body)
  clear_dead(key)
  redis.call("ZADD", XQ, NOW, rid)
  redis.call("HSET", XQ_MSGS, rid, body)
  redis.call("HSET", DEAD, key, rid)
  redis.call("HDEL", FAILURES, key)
  redis.call("ZREM", DELAYED, key)
end

-- Count a failure; dead-letter at max. Returns failures, dead?
local function fail(key, err, max, dead_rid, dead_body)
  local n = redis.call("HINCRBY", FAILURES, key, 1)
  redis.call("HSET", ERRORS, key, err)
  if n >= tonumber(max) then
    dead_letter(key, dead_rid, dead_body)
    return n, true
  end
  return n, false
end
"""

# ARGV: (key, rid, body) triples -> one result per key.
ADD = r"""
local out = {}
for i = 1, #ARGV, 3 do
  out[#out + 1] = add(ARGV[i], ARGV[i + 1], ARGV[i + 2])
end
return out
"""

# ARGV: key, delay_ms. A dirty key already runs as soon as it can: moving it later would
# break "re-adding only moves the ready time earlier", so that is a no-op, as is a later
# time for a key already delayed (ZADD LT).
ADD_AFTER = r"""
local key = ARGV[1]
if is_dirty(key) then return "deduplicated" end
local changed = redis.call("ZADD", DELAYED, "LT", "CH", NOW + tonumber(ARGV[2]), key)
if changed == 1 then return "delayed" end
return "deduplicated"
"""

# ARGV: key, token, ttl_ms, acks key, delivered rid -> {"busy", holder} | {"stale"} |
#   {"started", lease value, fence, queued ms or -1, failures so far}
# A skipped delivery (busy, stale) is acked here; a busy one also stops counting as the key's
# queued message, so the holder's `done` queues a fresh one.
START = r"""
local key, token, ttl, acks, rid = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local holder = redis.call("GET", LEASE .. key)
if holder then
  if rid ~= "" and redis.call("HGET", PENDING, key) == rid then redis.call("HDEL", PENDING, key) end
  ack(acks, rid)
  return {"busy", holder}
end
if not is_dirty(key) then
  ack(acks, rid)
  return {"stale"}
end
redis.call("SREM", DIRTY, key)
redis.call("HDEL", PENDING, key)
local added = redis.call("HGET", ADDED_AT, key)
redis.call("HDEL", ADDED_AT, key)
local value, fence = acquire(key, token, ttl)
local queued = -1
if added then queued = NOW - tonumber(added) end
local failures = tonumber(redis.call("HGET", FAILURES, key) or "0")
return {"started", value, fence, queued, failures}
"""

# ARGV: key, token, ttl_ms -> {"busy", holder} | {"acquired", value, fence}.
# A secondary lease: the key's dirty state is left alone, so work waiting for it still runs
# (its `done` re-enqueues it).
ACQUIRE = r"""
local key, token, ttl = ARGV[1], ARGV[2], ARGV[3]
local holder = redis.call("GET", LEASE .. key)
if holder then return {"busy", holder} end
local value, fence = acquire(key, token, ttl)
return {"acquired", value, fence}
"""

# ARGV: ttl_ms, then (key, value) pairs -> 1 renewed / 0 lost, per pair.
RENEW = r"""
local ttl = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV, 2 do
  local key, value = ARGV[i], ARGV[i + 1]
  if redis.call("GET", LEASE .. key) == value then
    redis.call("PEXPIRE", LEASE .. key, ttl)
    redis.call("ZADD", INFLIGHT, "XX", NOW + ttl, key)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"""

# ARGV: key, value, mode (ok|fail|release), rerun rid, rerun body, acks key, acked rid
#   [, error, base_ms, cap_ms, max_failures, dead_rid, dead_body  -- mode "fail" only]
#   -> {outcome, rerun 0/1, retry delay ms or -1, failures}
# With an acks key, the delivered message is acked here exactly as dispatch.lua's "ack" does
# it, which saves the worker a round trip per job.
DONE = r"""
local key, value, mode = ARGV[1], ARGV[2], ARGV[3]
ack(ARGV[6], ARGV[7])
if redis.call("GET", LEASE .. key) ~= value then return {"lost", 0, -1, 0} end
redis.call("DEL", LEASE .. key)
redis.call("ZREM", INFLIGHT, key)
local outcome, delay, failures = "released", -1, 0
if mode == "ok" then
  redis.call("HDEL", FAILURES, key)
  redis.call("HDEL", ERRORS, key)
  clear_dead(key)
  outcome = "success"
elseif mode == "fail" then
  local dead
  failures, dead = fail(key, ARGV[8], ARGV[11], ARGV[12], ARGV[13])
  if dead then
    outcome = "dead"
  else
    outcome = "retry"
    if is_dirty(key) then
      delay = 0
    else
      local backoff = tonumber(ARGV[9]) * 2 ^ (failures - 1)
      delay = math.floor(math.min(backoff, tonumber(ARGV[10])))
      redis.call("ZADD", DELAYED, "LT", NOW + delay, key)
    end
  end
end
local rerun = 0
if is_dirty(key) then
  rerun = 1
  -- A message may still be on its way (delivered while we held the key, not yet skipped):
  -- it will find the key free. Otherwise queue one.
  if not has_message(key) then enqueue(key, ARGV[4], ARGV[5]) end
end
return {outcome, rerun, delay, failures}
"""

# ARGV: which ("delayed" | "inflight"), limit -> keys that are due.
# inflight: deadline passed and the lease is really gone (holder died or stalled).
DUE = r"""
local which, limit = ARGV[1], tonumber(ARGV[2])
if which == "delayed" then
  return redis.call("ZRANGEBYSCORE", DELAYED, "-inf", NOW, "LIMIT", 0, limit)
end
local out = {}
for _, key in ipairs(redis.call("ZRANGEBYSCORE", INFLIGHT, "-inf", NOW, "LIMIT", 0, limit)) do
  if not leased(key) then out[#out + 1] = key end
end
return out
"""

# ARGV: (key, rid, body) -> add() result for keys whose ready time has come, else "skip".
PROMOTE = r"""
local out = {}
for i = 1, #ARGV, 3 do
  local key = ARGV[i]
  local ready = redis.call("ZSCORE", DELAYED, key)
  if ready and tonumber(ready) <= NOW then
    out[#out + 1] = add(key, ARGV[i + 1], ARGV[i + 2])
  else
    out[#out + 1] = "skip"
  end
end
return out
"""

# ARGV: error text, max_failures, then (key, rid, body, dead_rid, dead_body) ->
#   "recovered" | "dead" | "skip", per key. A holder that died mid-run counts as a failure
# (so a key that kills its workers ends up dead-lettered) but reruns at once, no backoff.
RECOVER = r"""
local err, max = ARGV[1], ARGV[2]
local out = {}
for i = 3, #ARGV, 5 do
  local key, rid, body = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local deadline = redis.call("ZSCORE", INFLIGHT, key)
  if deadline and tonumber(deadline) <= NOW and not leased(key) then
    redis.call("ZREM", INFLIGHT, key)
    local _, dead = fail(key, err, max, ARGV[i + 3], ARGV[i + 4])
    if not dead then mark_dirty(key) end
    if is_dirty(key) and not has_message(key) then enqueue(key, rid, body) end
    if dead then out[#out + 1] = "dead" else out[#out + 1] = "recovered" end
  else
    out[#out + 1] = "skip"
  end
end
return out
"""

# ARGV: keys -> those dirty, not leased, and whose queued message is gone.
ORPHANS = r"""
local out = {}
for i = 1, #ARGV do
  local key = ARGV[i]
  if is_dirty(key) and not leased(key) and not has_message(key) then out[#out + 1] = key end
end
return out
"""

# ARGV: (key, rid, body) -> "repaired" | "ok"
REPAIR = r"""
local out = {}
for i = 1, #ARGV, 3 do
  local key = ARGV[i]
  if is_dirty(key) and not leased(key) and not has_message(key) then
    enqueue(key, ARGV[i + 1], ARGV[i + 2])
    out[#out + 1] = "repaired"
  else
    out[#out + 1] = "ok"
  end
end
return out
"""

# ARGV: dead rid, key ("" for a message that is not keyed), new rid, new body ->
#   "missing" | add() result | "enqueued"
REDRIVE = r"""
local drid, key, rid, body = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if not redis.call("ZSCORE", XQ, drid) then return "missing" end
redis.call("ZREM", XQ, drid)
redis.call("HDEL", XQ_MSGS, drid)
if key == "" then
  redis.call("HSET", MSGS, rid, body)
  redis.call("RPUSH", QUEUE, rid)
  return "enqueued"
end
if redis.call("HGET", DEAD, key) == drid then redis.call("HDEL", DEAD, key) end
redis.call("HDEL", FAILURES, key)
return add(key, rid, body)
"""

_BODIES = {
    "add": ADD,
    "add_after": ADD_AFTER,
    "start": START,
    "acquire": ACQUIRE,
    "renew": RENEW,
    "done": DONE,
    "due": DUE,
    "promote": PROMOTE,
    "recover": RECOVER,
    "orphans": ORPHANS,
    "repair": REPAIR,
    "redrive": REDRIVE,
}


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class Started:
    value: str
    fence: int
    queued_ms: int | None
    failures: int


@dataclass(frozen=True, slots=True)
class Busy:
    holder: str


@dataclass(frozen=True, slots=True)
class Done:
    outcome: str  # success | retry | dead | released | lost
    rerun: bool
    delay_ms: int | None
    failures: int


STALE = "stale"


class Scripts:
    """Typed Python entry points to the scripts, bound to one client and layout.

    Each thread calls through its own single-connection client on the shared pool: a worker
    thread makes two script calls per job, and skipping the pool's per-command checkout
    (a lock and a poll() syscall to check the connection is clean) is a measured ~10 % of
    keyed throughput.
    """

    def __init__(self, client: redis.Redis, layout: Layout) -> None:
        self.client = client
        self.layout = layout
        self._keys = [layout.prefix, layout.messages_list]
        self._scripts = {name: client.register_script(LIB + body) for name, body in _BODIES.items()}
        self._local = threading.local()

    def _thread_client(self) -> redis.Redis:
        conn: redis.Redis | None = getattr(self._local, "client", None)
        if conn is None:
            pool = self.client.connection_pool
            conn = redis.Redis(connection_pool=pool, single_connection_client=True)
            self._local.client = conn
        return conn

    def _call(self, name: str, *args: Any, client: Any = None) -> Any:
        return self._scripts[name](
            keys=self._keys,
            args=args,
            client=self._thread_client() if client is None else client,
        )

    def add(self, triples: Sequence[tuple[str, str, bytes]], client: Any = None) -> list[str]:
        flat = [x for t in triples for x in t]
        result = self._call("add", *flat, client=client)
        return result if client is not None else [_s(r) for r in result]

    def add_after(self, key: str, delay_ms: int) -> str:
        return _s(self._call("add_after", key, delay_ms))

    def start(
        self, key: str, token: str, ttl_ms: int, ack: tuple[str, str] = ("", "")
    ) -> Started | Busy | str:
        """`ack`: (dramatiq acks key or "", redis message id) of the delivery: acked here if
        it is skipped."""
        r = self._call("start", key, token, ttl_ms, *ack)
        tag = _s(r[0])
        if tag == "busy":
            return Busy(_s(r[1]))
        if tag == STALE:
            return STALE
        queued = int(r[3])
        return Started(_s(r[1]), int(r[2]), None if queued < 0 else queued, int(r[4]))

    def acquire(self, key: str, token: str, ttl_ms: int) -> tuple[str, int] | Busy:
        r = self._call("acquire", key, token, ttl_ms)
        if _s(r[0]) == "busy":
            return Busy(_s(r[1]))
        return _s(r[1]), int(r[2])

    def renew(self, ttl_ms: int, pairs: Sequence[tuple[str, str]]) -> list[bool]:
        if not pairs:
            return []
        flat = [x for p in pairs for x in p]
        return [bool(x) for x in self._call("renew", ttl_ms, *flat)]

    def done(
        self,
        key: str,
        value: str,
        mode: str,
        rerun: tuple[str, bytes],
        *,
        ack: tuple[str, str] = ("", ""),
        error: str = "",
        base_ms: int = 5,
        cap_ms: int = 60_000,
        max_failures: int = 8,
        dead: tuple[str, bytes] = ("", b""),
    ) -> Done:
        """`ack`: (dramatiq acks key, redis message id) of the delivered message to ack."""
        if mode == "fail":
            extra: tuple[Any, ...] = (error, base_ms, cap_ms, max_failures, *dead)
        else:
            extra = ()
        r = self._call("done", key, value, mode, *rerun, *ack, *extra)
        delay = int(r[2])
        return Done(_s(r[0]), bool(int(r[1])), None if delay < 0 else delay, int(r[3]))

    def due(self, which: str, limit: int) -> list[str]:
        return [_s(k) for k in self._call("due", which, limit)]

    def promote(self, triples: Sequence[tuple[str, str, bytes]]) -> list[str]:
        flat = [x for t in triples for x in t]
        return [_s(r) for r in self._call("promote", *flat)]

    def recover(
        self, error: str, max_failures: int, items: Sequence[tuple[str, str, bytes, str, bytes]]
    ) -> list[str]:
        flat = [x for t in items for x in t]
        return [_s(r) for r in self._call("recover", error, max_failures, *flat)]

    def orphans(self, keys: Sequence[str]) -> list[str]:
        if not keys:
            return []
        return [_s(k) for k in self._call("orphans", *keys)]

    def repair(self, triples: Sequence[tuple[str, str, bytes]]) -> list[str]:
        flat = [x for t in triples for x in t]
        return [_s(r) for r in self._call("repair", *flat)]

    def redrive(self, dead_rid: str, key: str | None, rid: str, body: bytes) -> str:
        return _s(self._call("redrive", dead_rid, key or "", rid, body))
