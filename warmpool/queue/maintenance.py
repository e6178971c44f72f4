"""Background upkeep in every worker process, on one thread.

Promote delayed keys whose time has come, so a deferred key runs milliseconds after it is
due (dramatiq's own retry path waits >= 15 s, and keeps delayed messages in worker memory).
With the doorbell (`warmpool.queue.doorbell`) the thread sleeps until the earliest ready time
in `delayed` (read after each promotion, on the server's clock) or a delayed add rung with
an earlier one, at most `idle_poll_timeout` and at least `maintenance_period` after the last
promotion; without it (or while it is not subscribed), every `maintenance_period` (~20 ms).

Every `recovery_period`, in one process at a time (a short SET NX PX lock):
  * keys whose holder died: deadline passed in `inflight` and the lease gone -> failure
    counted, key dirty again and a fresh message queued, so it reruns within the lease TTL;
  * messages fetched by dead workers: dramatiq's own maintenance (requeue the unacked
    messages of workers whose heartbeat is older than `heartbeat_timeout`), invoked directly
    instead of on dramatiq's 0.1 % of calls with a 60 s timeout, for both queues (claims and
    bulk) and their delay queues.

Also every `recovery_period`, likewise once: the queue's shared keys (`SHARED_KEY_TYPES`)
each of the Redis type the scripts use. One of another type (written by someone else: anyone
who can reach the Redis can) would make every script that touches it fail with WRONGTYPE, for
every key of every namespace; it is deleted and the epoch with it, so every process reads a
Redis that lost its data and the scheduler resyncs everything from the cluster
(`repair_shared_types`).

Every `audit_period`, likewise once: lease keys with no expiry (written by someone else, or
made to persist: every lease of ours has a TTL) are repaired, since nothing else would ever
free their key (`repair_unexpiring_leases`); then dirty keys with no lease and no queued
message (the message was purged, dead-lettered by dramatiq, or lost in a failover) get a new
one.

Every `epoch_period`, in every process: read the Redis epoch (`warmpool.queue.epoch`); a
missing or changed one is reported to the observer (logged, counted): Redis lost its data,
the leases of running jobs with it (their renewals fail, and they stop writing), and the
scheduler resyncs everything.
"""

from __future__ import annotations

import logging
import threading
import time
from itertools import islice

import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import dq_name

from warmpool.queue.doorbell import Doorbell
from warmpool.queue.epoch import Epoch
from warmpool.queue.jobs import Jobs
from warmpool.queue.replies import text

log = logging.getLogger(__name__)

#: The Redis type of each key every script shares (Layout's property -> TYPE's answer; "none",
#: a missing key, is always fine). The per-key prefixes (lease, triggers, own writes) are not
#: here: a wrong-typed lease is repaired by the script that meets it, triggers and own writes
#: are read with HGETALL/HGET inside scripts whose keys are the queue's own.
SHARED_KEY_TYPES: tuple[tuple[str, str], ...] = (
    ("dirty", "set"),
    ("inflight", "zset"),
    ("failures", "hash"),
    ("delayed", "zset"),
    ("errors", "hash"),
    ("added_at", "hash"),
    ("pending", "hash"),
    ("dead", "hash"),
    ("fence", "string"),
    ("messages_list", "list"),
    ("messages", "hash"),
    ("claims_messages_list", "list"),
    ("claims_messages", "hash"),
    ("xq", "zset"),
    ("xq_messages", "hash"),
)

#: Lease names one audit pass looks at, at most (a scan of the whole keyspace is bounded).
SCAN_LIMIT = 100_000
CRASH_ERROR = "lease expired: the worker holding this key stopped renewing it (crashed?)"


class Maintenance:
    def __init__(self, jobs: Jobs, broker: RedisBroker | None = None, *,
                 doorbell: Doorbell | None = None) -> None:
        self.jobs = jobs
        self.broker = broker
        self.doorbell = doorbell or getattr(broker, "doorbell", None)
        self._next_due_ms: float | None = None  # earliest ready time in `delayed` (server)
        self._last_tick = 0.0
        self.settings = jobs.settings
        self.scripts = jobs.scripts
        self.messages = jobs.messages
        self.client = jobs.client
        self.identity = broker.broker_id if broker is not None else jobs.book.new_token()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_recovery = 0.0
        self._next_audit = 0.0
        self._next_epoch = 0.0
        self.epoch = Epoch(self.client, jobs.queue.layout, create=False)

    def promote_due(self) -> int:
        """Move due delayed keys into the queue (the add logic, atomically per key)."""
        keys = self.scripts.due("delayed", self.settings.batch)
        if not keys:
            return 0
        results = self.scripts.promote([(k, *self.messages.body(k)) for k in keys])
        moved = 0
        for key, result in zip(keys, results, strict=True):
            if result != "skip":
                moved += 1
                self.jobs.observer.on_add(key, result)
        return moved

    def recover_crashed(self) -> int:
        """Take back keys whose holder stopped renewing its lease."""
        keys = self.scripts.due("inflight", self.settings.batch)
        if not keys:
            return 0
        s = self.settings
        items = [
            (k, *self.messages.body(k), *self.messages.dead_body(k, CRASH_ERROR, s.max_failures))
            for k in keys
        ]
        results = self.scripts.recover(CRASH_ERROR, s.max_failures, items)
        count = 0
        for key, result in zip(keys, results, strict=True):
            if result != "skip":
                count += 1
                log.warning("recovered %s from a lost holder: %s", key, result)
                self.jobs.observer.on_recovered(key, result)
        return count

    def requeue_dead_workers(self) -> None:
        """Run dramatiq's own maintenance (dispatch.lua) now, with our heartbeat timeout, on
        the server's clock: the heartbeats it compares were stamped with it (`ServerClock`)."""
        broker = self.broker
        if broker is None:
            return
        clock = self.jobs.book.clock  # the one the heartbeats were stamped with
        dispatch = broker.scripts["dispatch"]
        queues = self.jobs.queue.layout.queues
        for name in (q for queue in queues for q in (queue, dq_name(queue))):
            args = [
                "qsize",  # a read-only command; maintenance runs before any command
                clock.now_ms(),
                name,
                broker.broker_id,
                broker.heartbeat_timeout,
                broker.dead_message_ttl,
                1,  # do_maintenance
                broker._max_unpack_size(),
            ]
            dispatch(keys=[broker.namespace], args=args)

    def repair_shared_types(self) -> list[str]:
        """Delete each shared key of a type the scripts do not use, and the epoch with it
        (every process then sees a Redis that lost its data, and the scheduler resyncs: every
        key is derived from the cluster again). Returns the names deleted. One round trip
        when all is well: TYPE of the 15 names in a pipeline."""
        layout = self.jobs.queue.layout
        names = [(str(getattr(layout, attr)), want) for attr, want in SHARED_KEY_TYPES]
        with self.client.pipeline(transaction=False) as p:
            for name, _ in names:
                p.type(name)
            types = [text(t) for t in p.execute()]
        wrong = [(name, want, got) for (name, want), got in zip(names, types, strict=True)
                 if got not in (want, "none")]
        if not wrong:
            return []
        with self.client.pipeline(transaction=True) as p:
            for name, _, _ in wrong:
                p.delete(name)
            p.delete(layout.epoch)
            p.execute()
        for name, want, got in wrong:
            log.warning("queue key %s was a Redis %s, not the %s the queue keeps there (not "
                        "written by warmpool): deleted, with the epoch, so the scheduler "
                        "resyncs every key from the cluster", name, got, want)
        return [name for name, _, _ in wrong]

    def repair_unexpiring_leases(self) -> int:
        """Find lease keys without an expiry (PTTL -1) and repair each (`unexpiring.lua`): a
        run in flight keeps it with the lease TTL, anything else loses it. Returns how many
        were repaired. The scan is bounded (`SCAN_LIMIT` names a pass); the rest waits for
        the next audit."""
        layout = self.jobs.queue.layout
        names = [text(n) for n in islice(
            self.client.scan_iter(match=layout.lease_pattern, count=1000), SCAN_LIMIT)]
        if not names:
            return 0
        with self.client.pipeline(transaction=False) as p:
            for name in names:
                p.pttl(name)
            ttls = p.execute()
        prefix = len(layout.lease_prefix)
        stuck = [name[prefix:] for name, ttl in zip(names, ttls, strict=True) if ttl == -1]
        repaired = 0
        for i in range(0, len(stuck), self.settings.batch):
            keys = stuck[i:i + self.settings.batch]
            for key, result in zip(keys, self.scripts.unexpiring(self.settings.lease_ttl_ms,
                                                                 keys), strict=True):
                if result != "ok":
                    repaired += 1
                    log.warning("lease of %s had no expiry (not written by a holder of ours) "
                                "and blocked it for good: %s", key,
                                "given the lease TTL (a run is in flight)"
                                if result == "expiring" else "deleted")
        return repaired

    def audit(self) -> int:
        """Give a message back to dirty keys that have neither a lease nor a message."""
        repaired = 0
        cursor = 0
        layout = self.jobs.queue.layout
        while True:
            cursor, raw = self.client.sscan(layout.dirty, cursor, count=self.settings.batch)
            keys = self.scripts.orphans([text(k) for k in raw])
            if keys:
                results = self.scripts.repair([(k, *self.messages.body(k)) for k in keys])
                repaired += results.count("repaired")
            if cursor == 0:
                break
        if repaired:
            log.warning("audit re-enqueued %d waiting keys that had lost their message", repaired)
        return repaired

    def check_epoch(self) -> bool:
        """Read the epoch; report a loss to the observer. True if Redis lost its data."""
        try:
            check = self.epoch.check()
        except redis.RedisError as exc:
            log.warning("reading the Redis epoch failed: %s", exc)
            return False
        if check.lost:
            self.jobs.observer.on_redis_lost(check.previous, check.current)
        return check.lost

    def _once(self, name: str, period: float) -> bool:
        """True for exactly one caller per `period` across all processes."""
        lock = self.jobs.queue.layout.maintenance_lock(name)
        return bool(self.client.set(lock, self.identity, nx=True, px=int(period * 1000)))

    def _promote(self) -> None:
        """Promote, then note the earliest ready time left (only with the doorbell: the
        sleep is planned on it). The delayed event is cleared before the read, so a delayed
        add after it still wakes the sleep."""
        bell = self.doorbell
        if bell is None or not bell.listening:
            self.promote_due()
            return
        bell.delayed.clear()
        bell.take_due()  # what was rung so far is in the set: the read below sees it
        self.promote_due()
        first = self.client.zrange(self.jobs.queue.layout.delayed, 0, 0, withscores=True)
        self._next_due_ms = float(first[0][1]) if first else None

    def tick(self) -> None:
        s = self.settings
        self._promote()
        now = time.monotonic()
        self._last_tick = now
        if now >= self._next_recovery:
            self._next_recovery = now + s.recovery_period
            if self._once("recovery", s.recovery_period):
                self.repair_shared_types()
                self.recover_crashed()
                self.requeue_dead_workers()
        if now >= self._next_audit:
            self._next_audit = now + s.audit_period
            if self._once("audit", s.audit_period):
                self.repair_unexpiring_leases()
                self.audit()
        if now >= self._next_epoch:
            self._next_epoch = now + s.epoch_period
            self.check_epoch()

    def _run(self) -> None:
        while not self._sleep():
            try:
                self.tick()
            except Exception:
                log.exception("queue maintenance failed")

    def _sleep(self) -> bool:
        """Wait for the next tick; True when stopped. Without a listening doorbell, every
        `maintenance_period`; with it, until `_deadline`, moved earlier by each delayed add
        rung meanwhile (its ready time is in the notification: no round trip)."""
        bell = self.doorbell
        if bell is None or not bell.listening:
            return self._stop.wait(self.settings.maintenance_period)
        deadline = self._deadline(self._next_due_ms)
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or not bell.delayed.wait(left):
                break
            bell.delayed.clear()
            due = bell.take_due()
            if due is None or not bell.listening:  # a gap in the subscription, or a stop
                break
            deadline = min(deadline, self._deadline(due))
        return self._stop.is_set()

    def _deadline(self, due_ms: float | None) -> float:
        """When to tick next (monotonic): at the ready time `due_ms` (server ms), the next
        periodic task or the fallback, whichever comes first, but not sooner than
        `maintenance_period` after the last tick (a due time already past, say a key the
        promotion skipped, must not spin)."""
        s = self.settings
        now = time.monotonic()
        at = min(now + s.idle_poll_timeout, self._next_recovery, self._next_audit,
                 self._next_epoch)
        if due_ms is not None:
            at = min(at, now + (due_ms - self.jobs.book.clock.now_ms()) / 1000)
        return max(at, self._last_tick + s.maintenance_period)

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="queue-maintenance", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.doorbell is not None:
            self.doorbell.delayed.set()  # end a sleep on it now
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
