"""The pool's state as the jobs last saw it, kept in Redis so that any process on any host can
export it at scrape time (a per-process gauge would only know what its own jobs touched).

Keys, under the queue settings' prefix (``warmpool:`` by default), named by
``warmpool.queue.layout.Layout``:

  pool:state     hash  instance key -> "<appdef>|<state>|<fence>", written by the instance
                       reconcile job under the instance's lease at the end of each run;
                       the field is deleted when the instance is retired (state "retired").
                       A write carrying a lower fence than the stored one is refused, so a
                       holder that lost its lease cannot overwrite a newer holder's record.
  pool:waiting   hash  session key -> "<appdef>|<ms since epoch, Redis clock>" of the first run
                       that found no instance; removed when the claim job ends any other way,
                       and by the pool's resync for Sessions it no longer lists (deleted).
  metrics:contended:<job key>  str  Redis time (ms) a job first found a lease it needs busy;
                       read and deleted when it gets one (10 min TTL).

Every value is written by a job under its own key's lease and read by collectors; none is
needed for the pool to work (losing them costs accuracy of the gauges until the next run).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol

import redis

from warmpool.keys import SessionKey, parse_key
from warmpool.queue.clock import ServerClock
from warmpool.queue.layout import Layout
from warmpool.queue.settings import QueueSettings

CONTENTION_TTL_MS = 600_000

# KEYS[1] pool:state; ARGV: field, "<appdef>|<state>" ("" deletes), fence.
# Returns {1 written | 0 refused (stored fence is newer), previous value or ""}.
# Fences are compared as decimal strings (length, then text), never as Lua numbers: a double
# is not exact above 2^53, and a lift may take the counter to 10^18 (issue #27).
_RECORD = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local f, mine = string.match(cur, '|0*(%d+)$'), string.match(ARGV[3], '^0*(%d+)$')
  if f and mine and (#f > #mine or (#f == #mine and f > mine)) then return {0, cur} end
end
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. '|' .. ARGV[3])
end
return {1, cur or ''}
"""

# Times: ARGV `now` is the Redis server's clock in ms, as `PoolState.clock` reads it (one
# reading of the server's clock per process, not a TIME per script: the same clock the
# queue's heartbeats carry, and one a test can set).

# KEYS[1] pool:waiting; ARGV: field, appdef, now. Keeps the first time (and updates the appdef).
_WAIT = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local since
if cur then since = string.match(cur, '|(%d+)$') end
if not since then since = ARGV[3] end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. '|' .. since)
if cur then return 0 end
return 1
"""

# KEYS[1] the contention marker; ARGV: ttl ms, now. Sets it to now unless set.
_CONTENDED = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[1])
end
return 1
"""

# KEYS[1] the contention marker; ARGV: now. Returns ms since it was set and deletes it, or -1.
_ACQUIRED = """
local v = redis.call('GET', KEYS[1])
if not v then return -1 end
redis.call('DEL', KEYS[1])
return tonumber(ARGV[1]) - tonumber(v)
"""


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class PoolSnapshot:
    """What the collectors export: counts by AppDefinition, from one read of Redis."""

    instances: dict[tuple[str, str], int] = field(default_factory=dict)  # (appdef, state)
    waiting: dict[str, int] = field(default_factory=dict)
    oldest_waiting: dict[str, float] = field(default_factory=dict)  # seconds
    appdefs: set[str] = field(default_factory=set)


class Clock(Protocol):
    def now_ms(self) -> int: ...


class PoolState:
    """`clock`: the process's reading of the Redis server's clock (a worker passes its lease
    book's, the one it stamps heartbeats with; a test, one it sets); by default a fresh `TIME`
    at each reading."""

    def __init__(self, client: redis.Redis, settings: QueueSettings,
                 clock: Clock | None = None) -> None:
        self.client = client
        self.clock = clock or ServerClock(client, refresh=0.0)
        layout = Layout.of(settings)  # the key names' one definition
        self.state_key = layout.pool_state
        self.waiting_key = layout.pool_waiting
        self.contended_prefix = layout.contended_prefix
        self._record = client.register_script(_RECORD)
        self._wait = client.register_script(_WAIT)
        self._contended = client.register_script(_CONTENDED)
        self._acquired = client.register_script(_ACQUIRED)

    # --- written by jobs -------------------------------------------------------------------

    def record_instance(self, key: str, appdef: str, state: str, fence: int) -> str | None:
        """Record instance `key`'s state ("retired" deletes it); returns the state recorded
        before (None if none), or raises `Stale` if a newer lease holder recorded since."""
        value = "" if state == "retired" else f"{appdef}|{state}"
        written, previous = self._record(keys=[self.state_key], args=[key, value, fence])
        prev = _text(previous)
        if not int(written):
            raise Stale(f"{key}: recorded under fence {prev.rsplit('|', 1)[-1]} > {fence}")
        parts = prev.split("|")
        return parts[1] if len(parts) == 3 else None

    def waiting(self, session_key: str, appdef: str) -> bool:
        """Record the Session waiting (since when it first did); whether it just began."""
        return bool(self._wait(keys=[self.waiting_key],
                               args=[session_key, appdef, self.now_ms()]))

    def not_waiting(self, session_key: str) -> None:
        self.client.hdel(self.waiting_key, session_key)

    def now_ms(self) -> int:
        return self.clock.now_ms()

    def prune_waiting(
        self, namespace: str, appdef: str, keep: set[str], before_ms: int
    ) -> list[str]:
        """Forget waiting Sessions of this pool that are not in `keep` (the resync's list of
        Sessions still waiting) and were first seen waiting before `before_ms` (so a Session
        that started waiting after the resync listed the pool is not dropped)."""
        gone = []
        for raw_field, raw_value in self.client.hgetall(self.waiting_key).items():
            fld, value = _text(raw_field), _text(raw_value)
            if fld in keep:
                continue
            try:
                key = parse_key(fld)
            except ValueError:
                gone.append(fld)
                continue
            owner, _, since = value.rpartition("|")
            if (isinstance(key, SessionKey) and key.namespace == namespace and owner == appdef
                    and since.isdigit() and int(since) < before_ms):
                gone.append(fld)
        if gone:
            self.client.hdel(self.waiting_key, *gone)
        return gone

    def contended(self, job_key: str) -> None:
        """`job_key`'s job found a lease it needs busy (the first time counts)."""
        self._contended(keys=[self.contended_prefix + job_key],
                        args=[CONTENTION_TTL_MS, self.now_ms()])

    def acquired(self, job_key: str) -> float | None:
        """`job_key`'s job got a lease: seconds since it first found one busy, else None."""
        ms = int(self._acquired(keys=[self.contended_prefix + job_key], args=[self.now_ms()]))
        return None if ms < 0 else max(0.0, ms / 1000)

    # --- read by collectors ----------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        with self.client.pipeline(transaction=False) as p:
            p.hgetall(self.state_key)
            p.hgetall(self.waiting_key)
            states, waiting = p.execute()
        now = self.now_ms()
        snap = PoolSnapshot()
        instances: dict[tuple[str, str], int] = defaultdict(int)
        for raw in states.values():
            parts = _text(raw).split("|")
            if len(parts) != 3:
                continue
            appdef, state = parts[0], parts[1]
            snap.appdefs.add(appdef)
            instances[(appdef, state)] += 1
        counts: dict[str, int] = defaultdict(int)
        for raw in waiting.values():
            appdef, _, since = _text(raw).rpartition("|")
            if not appdef:
                continue
            snap.appdefs.add(appdef)
            counts[appdef] += 1
            if since.isdigit():
                age = max(0.0, (now - int(since)) / 1000)
                snap.oldest_waiting[appdef] = max(snap.oldest_waiting.get(appdef, 0.0), age)
        snap.instances = dict(instances)
        snap.waiting = dict(counts)
        return snap


class Stale(Exception):
    """A newer lease holder recorded this instance: this job's view is not the latest."""
