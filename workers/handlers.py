"""The pool's handlers on the keyed queue: which controller function runs for which key kind.

Importing this module registers them. The worker process owns one Kubernetes client (made on
first use from KUBECONFIG, else in-cluster config) and one watch-fed `ClusterCache` of the
namespaces it serves (`WARMPOOL_NAMESPACE`, comma-separated; all namespaces when unset),
both shared by its threads. The cache is filled before the process reports ready, and a job
decides only once the cache has seen the versions that caused it (the key's triggers): a
watch that lags makes a job wait or run elsewhere, never decide on a world older than its
cause. Jobs report their guarded writes back to the queue, so the watch events those writes
cause do not run the same key again.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from dramatiq.brokers.redis import RedisBroker

from metrics import worker as job_metrics
from warmpool.controller.availability import ProbeRunner, SessionWrites, ssl_context
from warmpool.controller.reconcile import claim_session, reconcile_instance, resync_pool
from warmpool.controller.result import Outcome, Result
from warmpool.keys import InstanceKey, PoolKey, SessionKey, parse_key
from warmpool.kube import kinds
from warmpool.kube.api import Kube, connect
from warmpool.kube.cache import ClusterCache
from warmpool.kube.clock import ApiServerClock
from warmpool.kube.guard import Guard
from warmpool.kube.reader import CachedReader, LiveReader, Reader
from warmpool.pool import naming
from warmpool.pool.availability import ProbeSettings, ProbeTarget
from warmpool.pool.builders import PoolSettings
from warmpool.queue.jobs import JobContext
from warmpool.queue.settings import QueueSettings
from workers.runtime import on_broker, register, registered

log = logging.getLogger(__name__)

#: `warmpool worker` checks, before starting any process, that the API server answers and
#: accepts the credentials: a worker that cannot reach it should say so once and exit, not
#: fail every job in a loop.
NEEDS_KUBERNETES = True

#: How long a job waits for its cache to see the versions that caused it before it gives the
#: key back (to run again shortly, here or on a worker whose watches are not behind).
FRESHNESS_WAIT = 2.0
#: How long a starting worker process waits for its cache's first lists.
SYNC_WAIT = float(os.environ.get("WARMPOOL_CACHE_SYNC_TIMEOUT", "120"))
#: A claim whose instance is leased by another job retries after 5 ms, doubling to this cap.
DEFER_BASE, DEFER_CAP = 0.005, 0.5

_kube: Kube | None = None
_cache: ClusterCache | None = None
_lock = threading.Lock()


def kube() -> Kube:
    """This process's API client: KUBECONFIG if set, else the in-cluster ServiceAccount."""
    global _kube
    with _lock:
        if _kube is None:
            _kube = Kube(connect(os.environ.get("KUBECONFIG") or None))
        return _kube


def served_namespaces() -> list[str] | None:
    raw = os.environ.get("WARMPOOL_NAMESPACE") or ""
    names = [n.strip() for n in raw.split(",") if n.strip()]
    return names or None


def cache() -> ClusterCache:
    """This process's cache, started (not necessarily synced) on first use."""
    global _cache
    with _lock:
        if _cache is None:
            url = os.environ.get("KUBECONFIG") or None
            schedules = Kube(connect(url)).serves(*kinds.SCHEDULES[:2])
            if not schedules:
                log.warning("no PoolSchedule CRD on this cluster: scheduled pool sizes are off "
                            "(%s)", kinds.SCHEDULES[2])
            _cache = ClusterCache(lambda: Kube(connect(url)), served_namespaces(),
                                  watch_routes=pool_settings().routing,
                                  watch_ingresses=pool_settings().ingress,
                                  watch_schedules=schedules).start()
        return _cache


def _start_cache(broker: RedisBroker, settings: QueueSettings) -> None:
    """Fill the cache before the worker takes jobs (its readiness waits for this); only in a
    worker that runs these handlers (a test may register others after importing this)."""
    handler = registered().get("instance")  # unwrapped: a benchmark's wrapper counts too
    if handler is None or inspect.unwrap(handler) is not run:
        return
    c = cache()
    if not c.wait_synced(SYNC_WAIT):
        log.warning("the worker cache has not listed everything after %.0fs; jobs wait for it",
                    SYNC_WAIT)


@functools.cache
def server_clock() -> ApiServerClock:
    """This process's reading of the API server's clock (a Session's HANDLED time), shared by
    every job's reader: one `GET /version` a minute at most."""
    return ApiServerClock(kube(), max_age=60.0)


def reader_for(namespace: str) -> Reader | None:
    """The cache's reader, or None while it has not synced once (the job then waits)."""
    c = cache()
    ceiling = pool_settings().max_instances_ceiling
    if not c.serves(namespace):
        # a key outside the watched namespaces: ask directly
        return LiveReader(kube(), max_instances_ceiling=ceiling,
                          routes=pool_settings().routing, server_clock=server_clock())
    if not c.synced():
        return None
    return CachedReader(c, kube(), max_instances_ceiling=ceiling, server_clock=server_clock())


@functools.cache
def pool_settings() -> PoolSettings:
    """The deployment's settings from the environment (`PoolSettings.from_env`), read once:
    `check_settings` has refused a bad value before any process started."""
    return PoolSettings.from_env(os.environ)


def check_settings() -> None:
    """Raise ValueError naming the variable if a pool setting is malformed (`warmpool worker`
    calls it at start, so a typo is one clear line, not every job failing)."""
    PoolSettings.from_env(os.environ)
    probe = ProbeSettings.from_env(os.environ)
    if probe.enabled:
        ssl_context(probe.ca_bundle)  # an unreadable CA bundle: one clear error at start


def required_kinds() -> list[kinds.Kind]:
    """What `warmpool worker` checks the API server serves before it starts a process."""
    return kinds.required(pool_settings())


_prober: ProbeRunner | None = None


def prober() -> ProbeRunner | None:
    """This process's URL probe (session-lifecycle §2), started on first use; None when the
    probe is off (`WARMPOOL_URL_PROBE=off`: the URL then comes with HANDLED)."""
    global _prober
    if not pool_settings().url_probe:
        return None
    client = kube()  # before the lock, which kube() takes too
    with _lock:
        if _prober is None:
            writes = SessionWrites(client)
            _prober = ProbeRunner(ProbeSettings.from_env(os.environ), still_holds=_still_holds,
                                  write_url=writes.write_url, give_up=writes.give_up)
        return _prober


def _still_holds(target: ProbeTarget) -> bool:
    """Whether the probed Session, with its uid, still holds the instance and lacks its URL,
    as this process's cache sees it. Asked before every attempt and write: a stale yes is
    harmless (the write tests the uid, and a URL written for a Session released meanwhile
    names the instance it held until a moment ago, which its next holder's claim rewrites);
    a stale no ends a probe that the next reconcile of the instance starts again."""
    c = cache()
    s = c.session(target.namespace, target.session)
    if s is None or s.uid != target.uid or s.deleting or s.url or s.error:
        return False
    return any(ns == target.namespace and naming.instance_id_from_name(name) == target.instance
               for ns, name in c.referenced_by(target.uid))


def _ready_reader(ctx: JobContext, namespace: str) -> Reader | None:
    """The reader to decide from once it has seen the key's triggers; else None (the job's
    outcome is then `BEHIND`, and the key runs again shortly with its triggers)."""
    reader = reader_for(namespace)
    if isinstance(reader, CachedReader) and reader.cache.wait_fresh(
            namespace, ctx.triggers, FRESHNESS_WAIT):
        return reader
    if isinstance(reader, LiveReader):
        return reader
    log.info("%s: the cache has not seen %s yet; running it again shortly", ctx.key,
             sorted(ctx.triggers))
    return None


class JobLeases:
    """The controller's `Leases` on a job: other keys' leases, taken without waiting."""

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx

    @contextmanager
    def try_lease(self, key: str) -> Iterator[Guard | None]:
        lease = self.ctx.try_lease(key)
        if lease is None:
            job_metrics.lease_busy(self.ctx, key)
        elif lease is not self.ctx.lease:
            job_metrics.lease_taken(self.ctx, key)
        try:
            yield lease
        finally:
            if lease is not None and lease is not self.ctx.lease:
                self.ctx.release(lease)


# --- the jobs, by key kind, and the one loop that runs them --------------------------------

K = TypeVar("K", InstanceKey, SessionKey, PoolKey)


@dataclass(frozen=True)
class Job(Generic[K]):
    """A key kind's job: the key type it takes and the controller function it calls."""

    key_type: type[K]
    call: Callable[[JobContext, K, Reader], Result]


def _reconcile(ctx: JobContext, key: InstanceKey, reader: Reader) -> Result:
    return reconcile_instance(reader, kube(), key, ctx.lease, pool_settings(), prober=prober())


def _claim(ctx: JobContext, key: SessionKey, reader: Reader) -> Result:
    return claim_session(reader, kube(), key, JobLeases(ctx), pool_settings(), prober=prober())


def _resync(ctx: JobContext, key: PoolKey, reader: Reader) -> Result:
    return resync_pool(reader, kube(), key, pool_settings())


#: The table of jobs (controller-runtime: one reconciler per kind, one handler loop).
JOBS: dict[str, Job[Any]] = {
    "instance": Job(InstanceKey, _reconcile),
    "session": Job(SessionKey, _claim),
    "pool": Job(PoolKey, _resync),
}

#: A job whose cache is behind runs again after this many seconds.
BEHIND_RETRY = 0.1


class Backoff:
    """client-go's per-item exponential rate limiter, per process: a key that keeps
    deferring (a lease it needs is busy) runs again after `base`, doubling each time to
    `cap`; a run that does not defer forgets it. A key runs on one thread at a time, so no
    two threads touch one key's count."""

    def __init__(self, base: float, cap: float) -> None:
        self.base, self.cap = base, cap
        self._failures: dict[str, int] = {}

    def when(self, key: str) -> float:
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        return min(self.cap, self.base * 2 ** n)

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)


_backoff = Backoff(DEFER_BASE, DEFER_CAP)


def run(ctx: JobContext) -> None:
    """Run the job of `ctx.key` and do what its `Result` asks, the same for every job.

    In order: wait for the cache to see the key's triggers (else `BEHIND`); call the job;
    record its guarded writes with the keys they were made under, so the watch events of
    those writes do not run the keys again; put the key back if it asks (never by parking
    this thread); hand the result to the one metrics hook (the pool's records are written
    there, under the leases still held); add the follow-up keys.
    """
    key = parse_key(ctx.key)
    job = JOBS[key.kind]
    if not isinstance(key, job.key_type):
        raise TypeError(f"{ctx.key}: not a {job.key_type.__name__}")
    with job_metrics.JobMetrics(ctx) as metrics:
        reader = _ready_reader(ctx, key.namespace)
        result = (job.call(ctx, key, reader) if reader is not None
                  else Result(Outcome.BEHIND, requeue_after=BEHIND_RETRY))
        for under, writes in result.written.items():
            for field, value in writes:
                ctx.note_write(field, value, key=None if under == ctx.key else under)
        if result.requeue:
            log.debug("%s deferred: %s", ctx.key, result.message)
            ctx.defer(max(result.requeue_after or 0.0, _backoff.when(ctx.key)))
        else:
            _backoff.forget(ctx.key)
            if result.requeue_after is not None:
                ctx.defer(result.requeue_after)
        metrics.record(result)
    if result.follow_ups:
        ctx.jobs.queue.add_many((str(k), triggers) if triggers is not None else str(k)
                                for k, triggers in result.follow_ups)


for _kind in JOBS:
    register(_kind, run)
on_broker(_start_cache)
