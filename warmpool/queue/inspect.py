"""Read-only views of the queue for tools (`warmpool queue ...`) and tests.

Times stored by the scripts are the Redis server's, so ages are computed against the
server's TIME too; dramatiq's worker heartbeats are stamped by each worker's clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from warmpool.queue.clock import ServerClock
from warmpool.queue.layout import Layout
from warmpool.queue.lease import fence_of, holder_of
from warmpool.queue.replies import members, scored, text
from warmpool.queue.settings import QueueSettings


@dataclass(frozen=True, slots=True)
class QueueStats:
    waiting: int  # keys in dirty
    messages: int  # message ids in both dramatiq lists (>= waiting keys not yet fetched)
    running: int  # keys whose lease is held (inflight entries)
    delayed: int
    dead: int
    failing: int  # keys with at least one consecutive failure
    oldest_wait_seconds: float | None
    workers_alive: int
    claim_messages: int = 0  # of `messages`, those on the claims queue


@dataclass(frozen=True, slots=True)
class KeyState:
    key: str
    state: str  # running | waiting | delayed | dead | idle (first that applies)
    waiting: bool  # dirty: runs (again) as soon as possible
    running: bool
    delayed_seconds: float | None  # time until its delayed run
    dead: bool
    failures: int
    last_error: str | None
    holder: str | None  # host:pid:thread:nonce of the lease holder
    fence: int | None
    lease_ttl_seconds: float | None
    waiting_seconds: float | None


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    worker_id: str
    last_seen_seconds: float
    alive: bool
    unacked: int
    process: str | None = None  # "host:pid", the prefix of the lease holders it runs


class Inspector:
    def __init__(self, client: redis.Redis, settings: QueueSettings) -> None:
        self.client = client
        self.settings = settings
        self.layout = Layout.of(settings)
        self.clock = ServerClock(client, refresh=0.0)  # a tool's reading: fresh each time

    def _now_ms(self) -> int:
        return self.clock.now_ms()

    def stats(self) -> QueueStats:
        lo = self.layout
        now = self._now_ms()
        with self.client.pipeline(transaction=False) as p:
            p.scard(lo.dirty)
            p.llen(lo.messages_list)
            p.llen(lo.claims_messages_list)
            p.zcard(lo.inflight)
            p.zcard(lo.delayed)
            p.zcard(lo.xq)
            p.hlen(lo.failures)
            p.hvals(lo.added_at)
            p.zcount(lo.heartbeats, now - int(self.settings.heartbeat_timeout * 1000), "+inf")
            (waiting, messages, claims, running, delayed, dead, failing, added,
             alive) = p.execute()
        oldest = (now - min(int(a) for a in added)) / 1000 if added else None
        return QueueStats(waiting, messages + claims, running, delayed, dead, failing, oldest,
                          int(alive), claims)

    def key(self, key: str) -> KeyState:
        lo = self.layout
        now = self._now_ms()
        with self.client.pipeline(transaction=False) as p:
            p.sismember(lo.dirty, key)
            p.get(lo.lease(key))
            p.pttl(lo.lease(key))
            p.zscore(lo.delayed, key)
            p.hget(lo.dead, key)
            p.hget(lo.failures, key)
            p.hget(lo.errors, key)
            p.hget(lo.added_at, key)
            dirty, lease, pttl, ready, dead_rid, failures, error, added = p.execute()
        dead = dead_rid is not None and self.client.zscore(lo.xq, dead_rid) is not None
        value = lease.decode() if lease is not None else None
        delayed = None if ready is None else max(0.0, (ready - now) / 1000)
        state = (
            "running"
            if value
            else "waiting"
            if dirty
            else "delayed"
            if delayed is not None
            else "dead"
            if dead
            else "idle"
        )
        return KeyState(
            key=key,
            state=state,
            waiting=bool(dirty),
            running=value is not None,
            delayed_seconds=delayed,
            dead=dead,
            failures=int(failures or 0),
            last_error=error.decode() if error is not None else None,
            holder=holder_of(value) if value else None,
            fence=fence_of(value) if value else None,
            lease_ttl_seconds=pttl / 1000 if value and pttl >= 0 else None,
            waiting_seconds=(now - int(added)) / 1000 if added is not None and dirty else None,
        )

    def running(self, limit: int = 100) -> list[KeyState]:
        keys = members(self.client.zrange(self.layout.inflight, 0, limit - 1))
        return [self.key(k.decode()) for k in keys]

    def delayed(self, limit: int = 100) -> list[tuple[str, float]]:
        """(key, seconds until due), soonest first."""
        now = self._now_ms()
        entries = scored(self.client.zrange(self.layout.delayed, 0, limit - 1, withscores=True))
        return [(k.decode(), max(0.0, (score - now) / 1000)) for k, score in entries]

    def workers(self) -> list[WorkerInfo]:
        lo = self.layout
        now = self._now_ms()
        timeout = self.settings.heartbeat_timeout
        out = []
        for wid, seen in scored(self.client.zrange(lo.heartbeats, 0, -1, withscores=True)):
            worker_id = wid.decode()
            age = max(0.0, (now - seen) / 1000)
            with self.client.pipeline(transaction=False) as p:
                for queue in lo.queues:
                    p.scard(lo.acks(worker_id, queue))
                unacked = sum(p.execute())
            process = self.client.get(lo.worker(worker_id))
            out.append(WorkerInfo(worker_id, age, age < timeout, int(unacked),
                                  text(process) if process else None))
        return out
