"""Every state change of a key, as one Lua script each, so no step is ever half done.

All scripts share `LIB`: KEYS are the project prefix, dramatiq's main queue key and the
claims queue key, from which every other key name is derived (as dramatiq's own
dispatch.lua derives its keys), and NOW is read from the server's clock, so lease TTLs
(PX), deadlines and ready times all use one clock whatever host calls.

Two dramatiq queues: session keys (claims, `CLAIM_PREFIX`) go to `<queue>-claims`, every
other key to `<queue>`, so a claim never waits behind a bulk fan-out; `queue_of` in LIB is
the only place that chooses, and everything that reads or repairs a key's message asks it.
Dead letters of both live in the main queue's `.XQ`: one place for the tools.

Invariants the scripts keep:
  * a key in `dirty` is waiting; it has a queued message unless its lease is held (the
    holder queues it right after `done`: `done` reports that one is needed and `requeue`
    writes it, so no body is built unless it is) -- the audit repairs any other case,
    including a holder that died between the two;
  * a key is never both dirty and delayed (an immediate add supersedes a delayed one, and
    inherits its "run whatever" obligation as the `*` trigger);
  * the lease is released only by the token that took it (compare-and-delete), and a
    release that finds another token touches nothing of the new holder's;
  * every add records why in `trig:<k>` (what the run must see; `*` for "no particular
    version": resync, delay, retry, recovery, repair, redrive), even a deduplicated or
    rerun add; `start` hands the hash to the job and deletes it in the step that takes the
    lease, so adds during a run accumulate for the next one;
  * a delivery is skipped as "own" only if its key's triggers are non-empty, hold no `*`,
    and each is covered by `own:<k>` (versions the key's own guarded writes produced):
    missing data never skips a run.

Message bodies are built in Python (dramatiq's encoder) and passed in, because Lua cannot
encode with whatever encoder dramatiq is configured with; scripts that may need a body for a
key not known in advance (promotion, recovery, repair, the rerun after `done`) come as a
cheap "which keys?" step followed by a script that re-checks each key atomically.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from warmpool.queue.layout import Layout
from warmpool.queue.routing import CLAIM_PREFIX

OWN_TTL_MS = 300_000  # how long a run's own-write record can still match a late trigger
UNTRIGGERED = "*"
GONE = "#gone"

LIB = r"""
local P, QUEUE, CLAIMS = KEYS[1], KEYS[2], KEYS[3]
local DIRTY, INFLIGHT, FAILURES = P .. "dirty", P .. "inflight", P .. "failures"
local DELAYED, ERRORS, ADDED_AT = P .. "delayed", P .. "errors", P .. "added_at"
local PENDING, DEAD, FENCE, LEASE = P .. "pending", P .. "dead", P .. "fence", P .. "lease:"
local TRIG, OWN = P .. "trig:", P .. "own:"
local XQ = QUEUE .. ".XQ"
local XQ_MSGS = XQ .. ".msgs"
local CLAIM_PREFIX, OWN_TTL = "@CLAIM_PREFIX@", @OWN_TTL@
local clock = redis.call("TIME")
local NOW = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

-- The dramatiq queue a key's messages go to: claims ahead of bulk work.
local function queue_of(key)
  if string.sub(key, 1, #CLAIM_PREFIX) == CLAIM_PREFIX then return CLAIMS end
  return QUEUE
end

-- Exactly what dramatiq's dispatch.lua "enqueue" writes, plus our pending pointer.
local function enqueue(key, rid, body)
  local q = queue_of(key)
  redis.call("HSET", q .. ".msgs", rid, body)
  redis.call("RPUSH", q, rid)
  redis.call("HSET", PENDING, key, rid)
end

-- What dispatch.lua's "ack" writes: forget the delivery and its body (in the key's queue;
-- the other one too, for a message queued before its key's kind moved queues).
local function ack(key, acks, rid)
  if acks ~= "" and redis.call("SREM", acks, rid) > 0 then
    local q = queue_of(key)
    if redis.call("HDEL", q .. ".msgs", rid) == 0 then
      if q == QUEUE then q = CLAIMS else q = QUEUE end
      redis.call("HDEL", q .. ".msgs", rid)
    end
  end
end

local function has_message(key)
  local rid = redis.call("HGET", PENDING, key)
  return rid and redis.call("HEXISTS", queue_of(key) .. ".msgs", rid) == 1
end

local function is_dirty(key)
  return redis.call("SISMEMBER", DIRTY, key) == 1
end

local function leased(key)
  return redis.call("EXISTS", LEASE .. key) == 1
end

-- a >= b for resourceVersions (decimal strings of any length); other text only if equal.
local function rv_ge(a, b)
  local x, y = string.match(a, "^0*(%d+)$"), string.match(b, "^0*(%d+)$")
  if not (x and y) then return a == b end
  if #x ~= #y then return #x > #y end
  return x >= y
end

-- Merge one trigger (or own write) into a hash: "Kind/name" keeps the highest version,
-- "Kind/name#gone" (a uid) and "*" the last written.
local function note(hash, field, value)
  if field ~= "*" and string.sub(field, -5) ~= "#gone" then
    local old = redis.call("HGET", hash, field)
    if old and rv_ge(old, value) then return end
  end
  redis.call("HSET", hash, field, value)
end

local function untriggered(key)
  redis.call("HSET", TRIG .. key, "*", "1")
end

-- ARGV[i] = n, then n (field, value) pairs: the add's triggers; n = 0 records "*".
-- Returns the index after them.
local function record(key, i)
  local n = tonumber(ARGV[i])
  if n == 0 then
    untriggered(key)
  else
    local hash = TRIG .. key
    for j = i + 1, i + 2 * n, 2 do note(hash, ARGV[j], ARGV[j + 1]) end
  end
  return i + 1 + 2 * n
end

-- Returns true if the key was not dirty before. A delayed run it supersedes was owed
-- whatever the versions (a retry, a defer): it carries over as "*".
local function mark_dirty(key)
  if redis.call("ZREM", DELAYED, key) == 1 then untriggered(key) end
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

-- Every trigger ({field, value, ...}) matched by the key's own writes, and no "*"?
local function own_covers(key, trig)
  for i = 1, #trig, 2 do
    if trig[i] == "*" then return false end
  end
  local own = OWN .. key
  for i = 1, #trig, 2 do
    local field, want = trig[i], trig[i + 1]
    local mine = redis.call("HGET", own, field)
    if not mine then return false end
    if string.sub(field, -5) == "#gone" then
      if mine ~= want then return false end
    elseif not rv_ge(mine, want) then
      return false
    end
  end
  return true
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

-- One dead letter per key, in dramatiq's own dead-letter queue (the main queue's).
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

local function orphaned(key)
  return is_dirty(key) and not leased(key) and not has_message(key)
end
"""

# ARGV: per key: key, rid, body, n, n x (trigger field, value) -> one result per key.
# The triggers are recorded whatever the result: a deduplicated add still names versions the
# coming run must see, and a rerun add those the run after the current one must.
ADD = r"""
local out = {}
local i = 1
while i <= #ARGV do
  local key, rid, body = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  i = record(key, i + 3)
  out[#out + 1] = add(key, rid, body)
end
return out
"""

# ARGV: key, delay_ms, n, n x (field, value). A dirty key already runs as soon as it can:
# moving it later would break "re-adding only moves the ready time earlier", so that is a
# no-op (the triggers still count), as is a later time for a key already delayed (ZADD LT).
ADD_AFTER = r"""
local key = ARGV[1]
record(key, 3)
if is_dirty(key) then return "deduplicated" end
local changed = redis.call("ZADD", DELAYED, "LT", "CH", NOW + tonumber(ARGV[2]), key)
if changed == 1 then return "delayed" end
return "deduplicated"
"""

# ARGV: key, token, ttl_ms, acks key, delivered rid -> {"busy", holder} | "stale" | "own" |
#   {"started", lease value, queued ms or -1, failures so far, trigger field, value, ...}
# (the fence is the lease value's head; replies are flat, as few elements as will do: each
# one is parsed in Python on every job)
# A skipped delivery (busy, stale, own) is acked here; a busy one also stops counting as the
# key's queued message, so the holder's `done` queues a fresh one. The triggers (a flat
# field/value list) are handed over and deleted with the lease taken: adds from now on are
# the next run's. "own": every trigger is a version this key's own runs wrote, so the run
# would only read back its own writes: the key is done waiting without running.
START = r"""
local key, token, ttl, acks, rid = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local holder = redis.call("GET", LEASE .. key)
if holder then
  if rid ~= "" and redis.call("HGET", PENDING, key) == rid then redis.call("HDEL", PENDING, key) end
  ack(key, acks, rid)
  return {"busy", holder}
end
if not is_dirty(key) then
  ack(key, acks, rid)
  return "stale"
end
redis.call("SREM", DIRTY, key)
redis.call("HDEL", PENDING, key)
local added = redis.call("HGET", ADDED_AT, key)
redis.call("HDEL", ADDED_AT, key)
local trig = redis.call("HGETALL", TRIG .. key)
if #trig > 0 then
  redis.call("DEL", TRIG .. key)
  if own_covers(key, trig) then
    ack(key, acks, rid)
    return "own"
  end
end
local value = acquire(key, token, ttl)
local queued = -1
if added then queued = NOW - tonumber(added) end
local out = {"started", value, queued, tonumber(redis.call("HGET", FAILURES, key) or "0")}
for i = 1, #trig do out[i + 4] = trig[i] end
return out
"""

# ARGV: key, token, ttl_ms -> {"busy", holder} | {"acquired", value, fence}.
# A secondary lease: the key's dirty state is left alone, so work waiting for it still runs
# (its release re-enqueues it).
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

# ARGV: key, value, mode (ok|fail|release), acks key, acked rid, g, g x own-write groups
#   (target key, n, n x (field, value))
#   [, error, base_ms, cap_ms, max_failures, dead_rid, dead_body  -- mode "fail" only]
#   -> {outcome, rerun 0/1, retry delay ms or -1, failures, message needed 0/1}, or just
#   the outcome when the rest is {0, -1, 0, 0} (the common case: one element to parse)
# With an acks key, the delivered message is acked here exactly as dispatch.lua's "ack" does
# it, which saves the worker a round trip per job. A run (ok, fail) replaces the key's own
# writes record; every group is merged into its target's (a secondary lease's key: written
# under that lease). No body comes in: when the key was re-added and has no message on its
# way, "message needed" says so, and the caller builds one and calls `requeue` -- on reruns
# only.
DONE = r"""
local key, value, mode = ARGV[1], ARGV[2], ARGV[3]
ack(key, ARGV[4], ARGV[5])
if redis.call("GET", LEASE .. key) ~= value then return {"lost", 0, -1, 0, 0} end
redis.call("DEL", LEASE .. key)
redis.call("ZREM", INFLIGHT, key)
if mode ~= "release" then redis.call("DEL", OWN .. key) end
local x = 7
for _ = 1, tonumber(ARGV[6]) do
  local own, n = OWN .. ARGV[x], tonumber(ARGV[x + 1])
  for j = x + 2, x + 1 + 2 * n, 2 do note(own, ARGV[j], ARGV[j + 1]) end
  redis.call("PEXPIRE", own, OWN_TTL)
  x = x + 2 + 2 * n
end
local outcome, delay, failures = "released", -1, 0
if mode == "ok" then
  redis.call("HDEL", FAILURES, key)
  redis.call("HDEL", ERRORS, key)
  clear_dead(key)
  outcome = "success"
elseif mode == "fail" then
  local dead
  failures, dead = fail(key, ARGV[x], ARGV[x + 3], ARGV[x + 4], ARGV[x + 5])
  if dead then
    outcome = "dead"
  else
    outcome = "retry"
    if is_dirty(key) then
      delay = 0
      untriggered(key)  -- the retry is owed whatever the triggers say
    else
      local backoff = tonumber(ARGV[x + 1]) * 2 ^ (failures - 1)
      delay = math.floor(math.min(backoff, tonumber(ARGV[x + 2])))
      redis.call("ZADD", DELAYED, "LT", NOW + delay, key)
    end
  end
end
local rerun, needed = 0, 0
if is_dirty(key) then
  rerun = 1
  -- A message may still be on its way (delivered while we held the key, not yet skipped):
  -- it will find the key free. Otherwise the caller queues one.
  if not has_message(key) then needed = 1 end
end
if rerun == 0 and delay == -1 and failures == 0 then return outcome end
return {outcome, rerun, delay, failures, needed}
"""

# ARGV: (key, rid, body) -> "enqueued" | "ok", per key: the message a `done` said was needed,
# if it still is (the key may have been taken, run or repaired meanwhile).
REQUEUE = r"""
local out = {}
for i = 1, #ARGV, 3 do
  local key = ARGV[i]
  if orphaned(key) then
    enqueue(key, ARGV[i + 1], ARGV[i + 2])
    out[#out + 1] = "enqueued"
  else
    out[#out + 1] = "ok"
  end
end
return out
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
    untriggered(key)
    out[#out + 1] = add(key, ARGV[i + 1], ARGV[i + 2])
  else
    out[#out + 1] = "skip"
  end
end
return out
"""

# ARGV: error text, max_failures, then (key, rid, body, dead_rid, dead_body) ->
#   "recovered" | "dead" | "skip", per key. A holder that died mid-run counts as a failure
# (so a key that kills its workers ends up dead-lettered) but reruns at once, no backoff,
# untriggered: what the dead run wrote is unknown.
RECOVER = r"""
local err, max = ARGV[1], ARGV[2]
local out = {}
for i = 3, #ARGV, 5 do
  local key, rid, body = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local deadline = redis.call("ZSCORE", INFLIGHT, key)
  if deadline and tonumber(deadline) <= NOW and not leased(key) then
    redis.call("ZREM", INFLIGHT, key)
    local _, dead = fail(key, err, max, ARGV[i + 3], ARGV[i + 4])
    if not dead then
      untriggered(key)
      mark_dirty(key)
    end
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
  if orphaned(ARGV[i]) then out[#out + 1] = ARGV[i] end
end
return out
"""

# ARGV: (key, rid, body) -> "repaired" | "ok". A repaired key runs untriggered: whatever
# lost its message may have lost its triggers too.
REPAIR = r"""
local out = {}
for i = 1, #ARGV, 3 do
  local key = ARGV[i]
  if orphaned(key) then
    untriggered(key)
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
  redis.call("HSET", QUEUE .. ".msgs", rid, body)
  redis.call("RPUSH", QUEUE, rid)
  return "enqueued"
end
if redis.call("HGET", DEAD, key) == drid then redis.call("HDEL", DEAD, key) end
redis.call("HDEL", FAILURES, key)
untriggered(key)
return add(key, rid, body)
"""

# ARGV: acks key, rid, the delivering queue's messages hash -> 1 moved | 0.
# dispatch.lua's "nack", except that the dead letter goes to the main queue's `.XQ` whatever
# queue the message came from: one dead-letter place (for dramatiq's own rejections of
# claims messages, e.g. an unknown actor).
NACK = r"""
local acks, rid, msgs = ARGV[1], ARGV[2], ARGV[3]
if redis.call("SREM", acks, rid) == 0 then return 0 end
local body = redis.call("HGET", msgs, rid)
if not body then return 0 end
redis.call("ZADD", XQ, NOW, rid)
redis.call("HSET", XQ_MSGS, rid, body)
redis.call("HDEL", msgs, rid)
return 1
"""

# ARGV: acks, queue list, msgs, rid... -> how many went back. The deliveries of a live
# worker's ack set that its consumer does not hold (a fetch whose reply was lost: the fetch ran,
# its ids moved to the ack set, the bodies never arrived), back at the head of their queue:
# they have waited longest. Each only if still in the ack set, so a late ack or requeue that
# got there first wins and nothing is queued twice; a message whose body is gone (acked by a
# duplicate delivery's skip) is only forgotten, as in dispatch.lua's "requeue". A keyed key
# keeps its `pending` pointer (same id), so it has a message again; a duplicate delivery, if
# the consumer did hold it after all, is skipped by `start` (busy or stale) and acked.
RECLAIM = r"""
local acks, list, msgs = ARGV[1], ARGV[2], ARGV[3]
local moved = 0
for i = #ARGV, 4, -1 do
  local rid = ARGV[i]
  if redis.call("SREM", acks, rid) > 0 and redis.call("HEXISTS", msgs, rid) == 1 then
    redis.call("LPUSH", list, rid)
    moved = moved + 1
  end
end
return moved
"""

# ARGV: seen -> the counter after: max(counter, seen). A job found an object written under a
# fence above ours: either we are a stale holder (the counter is already past `seen`: nothing
# changes) or Redis lost the counter and restarted it low. Raising it to `seen` makes the next
# acquisition's INCR issue seen + 1, so the next holder's writes stand above everything the
# objects carry. Never lowers it: fences only grow.
LIFT_FENCE = r"""
local seen = tonumber(ARGV[1])
local current = tonumber(redis.call("GET", FENCE) or "0") or 0
if seen > current then
  redis.call("SET", FENCE, seen)
  return seen
end
return current
"""

_BODIES = {
    "add": ADD,
    "add_after": ADD_AFTER,
    "start": START,
    "acquire": ACQUIRE,
    "renew": RENEW,
    "done": DONE,
    "requeue": REQUEUE,
    "due": DUE,
    "promote": PROMOTE,
    "recover": RECOVER,
    "orphans": ORPHANS,
    "repair": REPAIR,
    "redrive": REDRIVE,
    "nack": NACK,
    "reclaim": RECLAIM,
    "lift_fence": LIFT_FENCE,
}

_LIB = LIB.replace("@CLAIM_PREFIX@", CLAIM_PREFIX).replace("@OWN_TTL@", str(OWN_TTL_MS))

Triggers = Mapping[str, str]


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def flat_triggers(triggers: Triggers | None) -> list[str]:
    """[n, field, value, ...] as the scripts take a trigger (or own-write) map; n = 0 (no
    triggers) records `*` on an add."""
    if not triggers:
        return ["0"]
    out = [str(len(triggers))]
    for name, value in triggers.items():
        out += (name, str(value))
    return out


def merge_trigger(into: dict[str, str], name: str, value: str) -> None:
    """The scripts' merge rule, in Python: a version keeps the highest (numerically), a
    `#gone` uid or `*` the last."""
    old = into.get(name)
    if old is not None and name != UNTRIGGERED and not name.endswith(GONE):
        try:
            if int(old) >= int(value):
                return
        except ValueError:
            pass
    into[name] = value


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {_s(flat[i]): _s(flat[i + 1]) for i in range(0, len(flat), 2)}


@dataclass(frozen=True, slots=True)
class Started:
    value: str
    fence: int
    queued_ms: int | None
    failures: int
    triggers: dict[str, str] = field(default_factory=dict)  # as recorded, `*` included


@dataclass(frozen=True, slots=True)
class Busy:
    holder: str


@dataclass(frozen=True, slots=True)
class Done:
    outcome: str  # success | retry | dead | released | lost
    rerun: bool
    delay_ms: int | None
    failures: int
    message_needed: bool = False  # re-added with no message on its way: call `requeue`


STALE = "stale"
OWN = "own"


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
        self._keys = [layout.prefix, layout.messages_list, layout.claims_messages_list]
        self._scripts = {
            name: client.register_script(_LIB + body) for name, body in _BODIES.items()
        }
        self._head = {name: self._head_of(s.sha) for name, s in self._scripts.items()}
        self._local = threading.local()

    def _thread_client(self) -> redis.Redis:
        conn: redis.Redis | None = getattr(self._local, "client", None)
        if conn is None:
            pool = self.client.connection_pool
            conn = redis.Redis(connection_pool=pool, single_connection_client=True)
            self._local.client = conn
        return conn

    def _call(self, name: str, *args: Any, client: Any = None) -> Any:
        script = self._scripts[name]
        if client is not None:  # a pipeline: it loads the script itself
            return script(keys=self._keys, args=args, client=client)
        # EVALSHA straight through (no Script.__call__ layers), its constant head encoded
        # once: two of these per job, and redis-py encodes every argument of every call.
        conn = self._thread_client()
        try:
            return conn.execute_command("EVALSHA", *self._head[name], *args)
        except redis.exceptions.NoScriptError:
            script.sha = conn.script_load(script.script)
            self._head[name] = self._head_of(script.sha)
            return conn.execute_command("EVALSHA", *self._head[name], *args)

    def _head_of(self, sha: str) -> tuple[bytes, ...]:
        return (sha.encode(), str(len(self._keys)).encode(), *(k.encode() for k in self._keys))

    def add(
        self,
        items: Sequence[tuple[str, str, bytes] | tuple[str, str, bytes, Triggers | None]],
        client: Any = None,
    ) -> list[str]:
        """(key, rid, body[, triggers]) per key; no triggers records `*`."""
        flat: list[Any] = []
        for item in items:
            flat += (item[0], item[1], item[2], *flat_triggers(item[3] if len(item) > 3 else None))
        result = self._call("add", *flat, client=client)
        return result if client is not None else [_s(r) for r in result]

    def add_after(self, key: str, delay_ms: int, triggers: Triggers | None = None) -> str:
        return _s(self._call("add_after", key, delay_ms, *flat_triggers(triggers)))

    def start(
        self, key: str, token: str, ttl_ms: int, ack: tuple[str, str] = ("", "")
    ) -> Started | Busy | str:
        """`ack`: (dramatiq acks key or "", redis message id) of the delivery: acked here if
        it is skipped. A str is the reason of a skip: STALE or OWN."""
        r = self._call("start", key, token, ttl_ms, *ack)
        if not isinstance(r, list):
            return _s(r)  # stale | own
        if _s(r[0]) == "busy":
            return Busy(_s(r[1]))
        value = _s(r[1])
        queued = int(r[2])
        trig = _pairs(r[4:]) if len(r) > 4 else {}
        return Started(value, int(value.split("|", 1)[0]), None if queued < 0 else queued,
                       int(r[3]), trig)

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
        *,
        ack: tuple[str, str] = ("", ""),
        writes: Mapping[str, Triggers] | None = None,
        error: str = "",
        base_ms: int = 5,
        cap_ms: int = 60_000,
        max_failures: int = 8,
        dead: tuple[str, bytes] = ("", b""),
    ) -> Done:
        """`ack`: (dramatiq acks key, redis message id) of the delivered message to ack;
        `writes`: key -> own writes (field -> version or uid): this run's record for `key`
        (replaced on ok/fail, merged on release), merged for other keys."""
        if mode == "fail":
            extra: tuple[Any, ...] = (error, base_ms, cap_ms, max_failures, *dead)
        else:
            extra = ()
        groups = [(k, w) for k, w in (writes or {}).items() if w]
        own: list[Any] = [len(groups)]
        for target, fields in groups:
            own += (target, *flat_triggers(fields))
        r = self._call("done", key, value, mode, *ack, *own, *extra)
        if not isinstance(r, list):
            return Done(_s(r), False, None, 0)
        delay = int(r[2])
        return Done(
            _s(r[0]), bool(int(r[1])), None if delay < 0 else delay, int(r[3]), bool(int(r[4]))
        )

    def requeue(self, triples: Sequence[tuple[str, str, bytes]]) -> list[str]:
        flat = [x for t in triples for x in t]
        return [_s(r) for r in self._call("requeue", *flat)]

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

    def lift_fence(self, seen: int) -> int:
        """Raise the fence counter to at least `seen` (atomically; never lowers it); returns
        the counter, so the next acquisition's fence is above it."""
        return int(self._call("lift_fence", int(seen)))

    def nack(self, acks: str, rid: str, messages: str) -> bool:
        """Dead-letter a delivery dramatiq rejected, into the main queue's `.XQ`."""
        return bool(self._call("nack", acks, rid, messages))

    def reclaim(self, acks: str, queue: str, rids: Sequence[str]) -> int:
        """Put deliveries of `acks` (a live worker's, on dramatiq queue `queue`) that its
        consumer does not hold back on their queue, each only if still unacked."""
        if not rids:
            return 0
        layout = self.layout
        return int(self._call("reclaim", acks, layout.messages_list_of(queue),
                              layout.messages_of(queue), *rids))
