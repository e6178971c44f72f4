"""Read-only views of the queue, for tools (`warmpool queue ...`), the metrics and tests.

This module is the one place that says what a key's state is and reads it from Redis; the
CLI formats what it returns, the metrics' `ClusterCollector` exports it by kind:

  waiting  in `dirty`: runs (again) as soon as it can
  running  in `inflight`: its lease is held (a crashed holder's, until maintenance takes it
           back)
  ready    waiting and not running: a worker may take it now
  rerun    waiting and running: runs once more after the current run
  delayed  in `delayed`: runs at its ready time (never also waiting)
  dead     has a dead letter in `.XQ` (`QueueStats.dead` counts the letters, plain dramatiq
           messages' included)
  wait     the time since the first add of a waiting key's current wait (`added_at`; the
           scripts set and clear it with `dirty`, so it holds exactly the waiting keys)

Times stored by the scripts are the Redis server's, so ages are computed against the
server's TIME too (`ServerClock`, read afresh for each view).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

import redis
from dramatiq.message import Message

from warmpool.queue.clock import ServerClock
from warmpool.queue.layout import Layout
from warmpool.queue.lease import fence_of, holder_of, process_of
from warmpool.queue.replies import members, raw, scored, text
from warmpool.queue.scripts import reply_int
from warmpool.queue.settings import QueueSettings

#: Most keys read from one set or key pattern by a listing (the counts stay exact beyond it).
SCAN_CAP = 10_000


@dataclass(frozen=True, slots=True)
class QueueStats:
    waiting: int  # keys waiting (ready + rerun)
    rerun: int  # of `waiting`, those running now
    messages: int  # message ids in both dramatiq lists (>= waiting keys not yet fetched)
    running: int  # keys whose lease is held (inflight entries)
    delayed: int
    dead: int  # dead letters in `.XQ`
    failing: int  # keys with at least one consecutive failure
    oldest_wait_seconds: float | None  # the longest wait of a waiting key
    workers_alive: int
    claim_messages: int = 0  # of `messages`, those on the claims queue

    @property
    def ready(self) -> int:
        """Waiting keys not running now: a worker may take them."""
        return max(0, self.waiting - self.rerun)

    @property
    def idle(self) -> bool:
        """Nothing waiting, running or delayed: no run is owed (dead letters stay dead)."""
        return self.waiting == 0 and self.running == 0 and self.delayed == 0


@dataclass(frozen=True, slots=True)
class QueueCensus:
    """The keys behind `QueueStats`' counts (by the module's definitions), for a breakdown
    by kind: O(keys the queue holds), where `stats` reads counts."""

    waiting: frozenset[str]
    running: frozenset[str]
    delayed: frozenset[str]
    dead: frozenset[str]  # keys with a dead letter
    waited: Mapping[str, float]  # waiting key -> seconds waited
    workers_alive: int

    @property
    def ready(self) -> frozenset[str]:
        return self.waiting - self.running

    @property
    def rerun(self) -> frozenset[str]:
        return self.waiting & self.running


@dataclass(frozen=True, slots=True)
class KeyState:
    key: str
    state: str  # running | waiting | delayed | dead | idle (first that applies)
    waiting: bool  # dirty: runs (again) as soon as possible
    running: bool
    delayed_seconds: float | None  # time until its delayed run
    dead: bool
    failures: int  # consecutive failed runs (a dead key's: those its dead letter records)
    last_error: str | None  # the last failed run's (a dead key's: its dead letter's)
    holder: str | None  # host:pid:thread:nonce of the lease holder
    fence: int | None
    lease_ttl_seconds: float | None
    waiting_seconds: float | None
    dead_letter_id: str | None = None  # the member of `.XQ`, when dead

    @property
    def rerun(self) -> bool:
        """Running now, and runs once more after."""
        return self.running and self.waiting


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    worker_id: str
    last_seen_seconds: float
    alive: bool
    unacked: int
    process: str | None = None  # "host:pid", the prefix of the lease holders it runs


@dataclass(frozen=True, slots=True)
class LockInfo:
    key: str  # the work key (a lease) or the maintenance task
    kind: str  # lease | maintenance
    holder: str  # a lease's holder token, or a maintenance lock's value
    fence: int | None
    ttl_seconds: float | None


def longest_wait(waits: Iterable[float]) -> float | None:
    """The wait `QueueStats.oldest_wait_seconds` reports of a set of waits (None: none)."""
    return max(waits, default=None)


def lease_text(value: bytes | str) -> str:
    """A lease (or lock) value as text: bytes that are not UTF-8 (someone else's write; ours
    are ASCII) are replaced, so a tool reading them shows them instead of failing."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _glob_escape(pattern: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", pattern)


class Inspector:
    def __init__(self, client: redis.Redis, settings: QueueSettings) -> None:
        self.client = client
        self.settings = settings
        self.layout = Layout.of(settings)
        self.clock = ServerClock(client, refresh=0.0)  # a tool's reading: fresh each time

    def now_ms(self) -> int:
        """The Redis server's time: what every age here is measured against."""
        return self.clock.now_ms()

    def _waited(self, now: int, added_ms: Any) -> float:
        # Redis contents are not trusted: a time that is not a bounded integer reads as now.
        return max(0.0, (now - reply_int(added_ms, now)) / 1000)

    def _alive_since(self, now: int) -> int:
        return now - int(self.settings.heartbeat_timeout * 1000)

    def _rerun_of(self, running: list[str]) -> list[str]:
        """Of `running` (in flight), the keys waiting too, in the same order."""
        flags = self.client.smismember(self.layout.dirty, running) if running else []
        return [k for k, dirty in zip(running, flags, strict=True) if dirty]

    def _running(self) -> list[str]:
        """Every key in flight, soonest lease deadline first (bounded by the worker
        threads running)."""
        return [k.decode() for k in members(self.client.zrange(self.layout.inflight, 0, -1))]

    def stats(self) -> QueueStats:
        lo = self.layout
        now = self.now_ms()
        with self.client.pipeline(transaction=False) as p:
            p.scard(lo.dirty)
            p.llen(lo.messages_list)
            p.llen(lo.claims_messages_list)
            p.zrange(lo.inflight, 0, -1)
            p.zcard(lo.delayed)
            p.zcard(lo.xq)
            p.hlen(lo.failures)
            p.hvals(lo.added_at)
            p.zcount(lo.heartbeats, self._alive_since(now), "+inf")
            (waiting, messages, claims, inflight, delayed, dead, failing, added,
             alive) = p.execute()
        rerun = self._rerun_of([k.decode() for k in members(inflight)])
        return QueueStats(
            waiting=waiting,
            rerun=len(rerun),
            messages=messages + claims,
            running=len(inflight),
            delayed=delayed,
            dead=dead,
            failing=failing,
            oldest_wait_seconds=longest_wait(self._waited(now, a) for a in added),
            workers_alive=int(alive),
            claim_messages=claims,
        )

    def census(self) -> QueueCensus:
        """Every key of the queue by state, in one pipelined read."""
        lo = self.layout
        now = self.now_ms()
        with self.client.pipeline(transaction=False) as p:
            p.smembers(lo.dirty)
            p.zrange(lo.inflight, 0, -1)
            p.zrange(lo.delayed, 0, -1)
            p.hgetall(lo.dead)
            p.zrange(lo.xq, 0, -1)
            p.hgetall(lo.added_at)
            p.zcount(lo.heartbeats, self._alive_since(now), "+inf")
            dirty, inflight, delayed, dead, xq, added_at, alive = p.execute()
        waiting = frozenset(text(k) for k in dirty)
        in_xq = {text(r) for r in xq}
        waited = {text(k): self._waited(now, ms) for k, ms in added_at.items()
                  if text(k) in waiting}
        return QueueCensus(
            waiting=waiting,
            running=frozenset(text(k) for k in inflight),
            delayed=frozenset(text(k) for k in delayed),
            dead=frozenset(text(k) for k, rid in dead.items() if text(rid) in in_xq),
            waited=waited,
            workers_alive=int(alive),
        )

    def key(self, key: str) -> KeyState:
        lo = self.layout
        now = self.now_ms()
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
        value = lease_text(lease) if lease is not None else None
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
        count = reply_int(failures or 0)  # bounded: someone else's text counts 0
        last_error = error.decode() if error is not None else None
        letter = text(dead_rid) if dead else None
        if letter is not None:  # dead-lettering moves the count and the error into the letter
            body = self.client.hget(lo.xq_messages, letter)
            if body is not None:
                options = Message.decode(raw(body)).options
                count = max(count, int(options.get("retries") or 0))
                last_error = last_error or options.get("traceback")
        return KeyState(
            key=key,
            state=state,
            waiting=bool(dirty),
            running=value is not None,
            delayed_seconds=delayed,
            dead=dead,
            failures=count,
            last_error=last_error,
            holder=holder_of(value) if value else None,
            fence=fence_of(value) if value else None,
            lease_ttl_seconds=pttl / 1000 if value and pttl >= 0 else None,
            waiting_seconds=self._waited(now, added) if added is not None and dirty else None,
            dead_letter_id=letter,
        )

    def running(self, limit: int = 100) -> list[KeyState]:
        keys = members(self.client.zrange(self.layout.inflight, 0, limit - 1))
        return [self.key(k.decode()) for k in keys]

    def reruns(self, limit: int = 100) -> list[tuple[str, str | None]]:
        """(key, lease holder or None if just released) of up to `limit` rerun keys."""
        rerun = self._rerun_of(self._running())[:limit]
        holders = self.client.mget([self.layout.lease(k) for k in rerun]) if rerun else []
        return [(k, holder_of(lease_text(h)) if h else None)
                for k, h in zip(rerun, holders, strict=True)]

    def pending(self, limit: int = 100) -> list[tuple[str, float | None]]:
        """(key, seconds waited) of up to `limit` ready keys in the order they will run: the
        order of their messages in dramatiq's lists (the claims queue's first: workers take
        claims ahead of bulk work), then (fetched by a worker but not started, or being
        repaired) longest wait first."""
        client, lo = self.client, self.layout
        now = self.now_ms()
        running = set(self._running())
        bodies = []
        for queue in lo.queues:
            ids = client.lrange(lo.messages_list_of(queue), 0, 4 * limit - 1)
            bodies += client.hmget(lo.messages_of(queue), ids) if ids else []
        in_list = []
        for body in bodies:
            if body is None:
                continue
            args = Message.decode(raw(body)).args
            if len(args) == 1 and isinstance(args[0], str):
                in_list.append(args[0])
        flags = client.smismember(lo.dirty, in_list) if in_list else []
        ordered = list(dict.fromkeys(k for k, dirty in zip(in_list, flags, strict=True)
                                     if dirty and k not in running))[:limit]
        if len(ordered) < limit:  # ready keys whose message is not in the list right now
            seen = set(ordered) | running
            rest = [m.decode() for m in islice(client.sscan_iter(lo.dirty, count=1000),
                                               SCAN_CAP)]
            rest = [k for k in rest if k not in seen]
            added = client.hmget(lo.added_at, rest) if rest else []
            by_age = sorted(zip(rest, added, strict=True),
                            key=lambda ka: reply_int(ka[1] or now, now))
            ordered += [k for k, _ in by_age[: limit - len(ordered)]]
        added = client.hmget(lo.added_at, ordered) if ordered else []
        return [(k, self._waited(now, a) if a else None)
                for k, a in zip(ordered, added, strict=True)]

    def delayed(self, limit: int = 100) -> list[tuple[str, float]]:
        """(key, seconds until due), soonest first."""
        now = self.now_ms()
        entries = scored(self.client.zrange(self.layout.delayed, 0, limit - 1, withscores=True))
        return [(k.decode(), max(0.0, (score - now) / 1000)) for k, score in entries]

    def _scan(self, pattern: str) -> Iterator[str]:
        for key in islice(self.client.scan_iter(match=pattern, count=1000), SCAN_CAP):
            yield text(key)

    def locks(self) -> list[LockInfo]:
        """The leases held now, by key, then the maintenance locks."""
        lo = self.layout
        maintenance = lo.maintenance_lock("")
        names = [(n, "lease") for n in self._scan(_glob_escape(lo.lease_prefix) + "*")]
        names += [(n, "maintenance") for n in self._scan(_glob_escape(maintenance) + "*")]
        with self.client.pipeline(transaction=False) as p:
            for name, _ in names:
                p.get(name)
                p.pttl(name)
            replies = p.execute()
        out = []
        for i, (name, kind) in enumerate(names):
            found, pttl = replies[2 * i], replies[2 * i + 1]
            if found is None:  # released between the scan and the read
                continue
            value = lease_text(found)
            lease = kind == "lease"
            out.append(LockInfo(
                key=name[len(lo.lease_prefix if lease else maintenance):],
                kind=kind,
                holder=holder_of(value) if lease else value,
                fence=fence_of(value) if lease and "|" in value else None,
                ttl_seconds=pttl / 1000 if pttl is not None and pttl >= 0 else None,
            ))
        out.sort(key=lambda lk: (lk.kind != "lease", lk.key))
        return out

    def lease_holders(self) -> dict[str, list[str]]:
        """host:pid -> the keys whose lease that process holds (sorted), by process."""
        per_process: dict[str, list[str]] = {}
        for lock in self.locks():
            if lock.kind == "lease":
                per_process.setdefault(process_of(lock.holder), []).append(lock.key)
        return {proc: sorted(keys) for proc, keys in sorted(per_process.items())}

    def workers(self) -> list[WorkerInfo]:
        lo = self.layout
        now = self.now_ms()
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
