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
from warmpool import logs
from warmpool.controller.availability import (
    Fetch,
    ProbeKeys,
    SessionWrites,
    fetch_status,
    probe_url,
    ssl_context,
)
from warmpool.controller.orphans import sweep_orphans
from warmpool.controller.reconcile import claim_session, reconcile_instance, resync_pool
from warmpool.controller.result import Outcome, Result
from warmpool.controller.timeouts import TimeoutRunner, TimeoutSettings, session_timeout
from warmpool.keys import (
    InstanceKey,
    PoolKey,
    ProbeKey,
    SessionKey,
    SweepKey,
    TimeoutKey,
    parse_key,
)
from warmpool.kube import kinds
from warmpool.kube.api import REQUEST_TIMEOUT, Kube, bounded_timeout, connect
from warmpool.kube.cache import ClusterCache
from warmpool.kube.clock import ApiServerClock
from warmpool.kube.guard import Guard
from warmpool.kube.pacing import ClaimWatch, Pacer, PacingSettings
from warmpool.kube.reader import CachedReader, LiveReader, Reader
from warmpool.pool.availability import ProbeSettings
from warmpool.pool.builders import ROUTES_SETTING, PoolSettings
from warmpool.queue.claims import ClaimCount
from warmpool.queue.jobs import JobContext
from warmpool.queue.layout import Layout
from warmpool.queue.settings import QueueSettings
from workers.probe_states import RedisProbeStates
from workers.runtime import job_threads, on_broker, register, registered

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
#: How old this process's reading of the API server's clock may get: a step of the server's
#: clock (NTP) reaches the deadlines within this; a GET /version per 5 s per process is free.
CLOCK_MAX_AGE = 5.0
#: A claim whose instance is leased by another job retries after 5 ms, doubling to this cap.
DEFER_BASE, DEFER_CAP = 0.005, 0.5

_kube: Kube | None = None
_cache: ClusterCache | None = None
_lock = threading.Lock()


_request_timeout = REQUEST_TIMEOUT  # the jobs' (connect, read) timeouts: `bound_requests`


def bound_requests(settings: QueueSettings) -> None:
    """Bound the jobs' API calls by the lease TTL (before the first job makes its client).

    A job's thread blocked on an API server that stopped answering (a stalled link) keeps
    its key: the lease renews from another thread. With each wait for the server at most one
    lease TTL, the call fails within that, the job fails, and the key runs again (on this
    host or another) after its backoff, instead of waiting the default 60 s per call. A
    write that was sent and is still in flight when the call gives up is guarded as every
    write is: its fence and preconditions refuse it if another holder has written since."""
    global _request_timeout
    _request_timeout = bounded_timeout(settings.lease_ttl)


def kube() -> Kube:
    """This process's API client: KUBECONFIG if set, else the in-cluster ServiceAccount."""
    global _kube
    with _lock:
        if _kube is None:
            _kube = Kube(connect(os.environ.get("KUBECONFIG") or None),
                         request_timeout=_request_timeout)
        return _kube


def served_namespaces() -> list[str] | None:
    raw = os.environ.get("WARMPOOL_NAMESPACE") or ""
    names = [n.strip() for n in raw.split(",") if n.strip()]
    return names or None


def cache() -> ClusterCache:
    """This process's cache, started (not necessarily synced) on first use."""
    global _cache
    # Settled before taking the lock: settling the routing asks kube(), which takes it too.
    routing = pool_settings()
    with _lock:
        if _cache is None:
            url = os.environ.get("KUBECONFIG") or None
            schedules = Kube(connect(url)).serves(*kinds.SCHEDULES[:2])
            if not schedules:
                log.warning("no PoolSchedule CRD on this cluster: scheduled pool sizes are off "
                            "(%s)", kinds.SCHEDULES[2])
            _cache = ClusterCache(lambda: Kube(connect(url)), served_namespaces(),
                                  watch_routes=routing.routing,
                                  watch_ingresses=routing.ingress,
                                  watch_schedules=schedules).start()
        return _cache


def _start_cache(broker: RedisBroker, settings: QueueSettings) -> None:
    """Fill the cache before the worker takes jobs (its readiness waits for this); only in a
    worker that runs these handlers (a test may register others after importing this)."""
    bound_requests(settings)
    handler = registered().get("instance")  # unwrapped: a benchmark's wrapper counts too
    if handler is None or inspect.unwrap(handler) is not run:
        return
    c = cache()
    _ready_for_jobs()
    if not c.wait_synced(SYNC_WAIT):
        log.warning("the worker cache has not listed everything after %.0fs; jobs wait for it",
                    SYNC_WAIT)


def _ready_for_jobs() -> None:
    """What a process's first jobs would each do first, done before it takes any: every kind
    a job uses looked up (`Kube.resolve`: else the first claim sends one discovery GET per
    API group, ~200 ms on the test control plane), and the server's clock read once."""
    try:
        missing = kube().resolve(kinds.used_by_jobs(pool_settings()))
        server_clock().now()
    except Exception as exc:  # an API server down at start: the jobs look up and read later
        log.warning("could not prepare for jobs (they look kinds up and read the clock "
                    "themselves): %s", exc)
        return
    if missing:
        log.info("not served by the API server (the jobs that need one fail): %s",
                 ", ".join(f"{kind} ({api_version})" for api_version, kind in missing))


@functools.cache
def server_clock() -> ApiServerClock:
    """This process's reading of the API server's clock (a Session's HANDLED time, the
    schedules, the timeouts' deadlines), shared by every job: one `GET /version` every
    `CLOCK_MAX_AGE` seconds at most, carried forward on the monotonic clock in between."""
    return ApiServerClock(kube(), max_age=CLOCK_MAX_AGE)


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
def timeout_settings() -> TimeoutSettings:
    """The Session timeouts' settings (`TimeoutSettings.from_env`), read once."""
    return TimeoutSettings.from_env(os.environ)


@functools.cache
def timeout_runner() -> TimeoutRunner:
    """This process's Session timeouts (session-lifecycle §5), on the cluster's clock; its
    Warning events are recorded once per finding per process."""
    return TimeoutRunner(kube(), [], timeout_settings(), clock=server_clock())


@functools.cache
def pool_settings() -> PoolSettings:
    """The deployment's settings from the environment (`PoolSettings.from_env`), read once:
    `check_settings` has refused a bad value before any process started. The routing, where
    WARMPOOL_ROUTES is unset, is what the cluster's install has (`kinds.settle_routes`), as
    the scheduler's."""
    settings, said = kinds.settle_routes(kube(), PoolSettings.from_env(os.environ), os.environ)
    log.info("%s", said)
    return settings


@functools.cache
def pacing_settings() -> PacingSettings:
    """How bulk writes yield to claims (`PacingSettings.from_env`), read once."""
    return PacingSettings.from_env(os.environ)


_pacer: Pacer | None = None


def pacer(ctx: JobContext) -> Pacer | None:
    """This process's pacer of bulk writes (`warmpool.kube.pacing`), made on first use from
    the job's queue (its Redis, its layout); None when pacing is off."""
    global _pacer
    settings = pacing_settings()
    if settings.rate is None:
        return None
    with _lock:
        if _pacer is None:
            jobs = ctx.jobs
            count = ClaimCount(jobs.client, Layout.of(jobs.settings),
                               jobs.settings.heartbeat_timeout)
            _pacer = Pacer(settings, ClaimWatch(count, settings.poll))
        return _pacer


def check_settings() -> None:
    """Raise ValueError naming the variable if a pool setting is malformed (`warmpool worker`
    calls it at start, so a typo is one clear line, not every job failing)."""
    PoolSettings.from_env(os.environ)
    PacingSettings.from_env(os.environ)
    TimeoutSettings.from_env(os.environ)
    probe = ProbeSettings.from_env(os.environ)
    if probe.enabled:
        ssl_context(probe.ca_bundle)  # an unreadable CA bundle: one clear error at start


def start_note() -> str:
    """What `warmpool worker` states at start: the Theia Cloud line and the routing its
    processes will run with (each process settles them the same way, `pool_settings`)."""
    return kinds.settle_routes(kube(), PoolSettings.from_env(os.environ), os.environ)[1]


def required_kinds() -> list[kinds.Kind]:
    """What `warmpool worker` checks the API server serves before it starts a process: Theia
    Cloud's kinds, and the HTTPRoute where WARMPOOL_ROUTES asks for it (unset, the routing
    follows what is served, `kinds.settle_routes`)."""
    if os.environ.get(ROUTES_SETTING, "").strip():
        return kinds.required(PoolSettings.from_env(os.environ))
    return kinds.theia()


@functools.cache
def probe_settings() -> ProbeSettings:
    """The URL probe's settings (`ProbeSettings.from_env`), read once."""
    return ProbeSettings.from_env(os.environ)


@functools.cache
def _fetch() -> Fetch:
    """`fetch_status` with the probe's CA bundle and timeout (the SSL context made once)."""
    settings = probe_settings()
    ssl_context(settings.ca_bundle)
    return functools.partial(fetch_status, ca_bundle=settings.ca_bundle,
                             timeout=settings.timeout)


def _ready_reader(ctx: JobContext, namespace: str) -> Reader | None:
    """The reader to decide from: the cache's once it has seen the key's triggers; the API
    server's (`LiveReader`) when the cache has not within `FRESHNESS_WAIT`; None only while
    the cache has not synced once (the job's outcome is then `BEHIND`, and the key runs
    again shortly with its triggers).

    Why read the server rather than wait longer: a cache is only ever a shortcut, every write
    carries its precondition whatever it was decided on, so a decision read from the server
    is as safe and is current. Waiting instead let a key land again and again on the one
    worker whose watches lagged (the chaos long tier, seed 26: a held instance's deleted
    ConfigMap came back 14 s later, after three 'not seen yet' rounds on that worker). The
    cost, a few reads per job, is paid only while a watch is behind."""
    reader = reader_for(namespace)
    if reader is not None and not isinstance(reader, CachedReader):
        return reader
    if reader is None:
        log.info("%s: the cache has not listed yet; running it again shortly", ctx.key)
        return None
    if reader.cache.wait_fresh(namespace, ctx.triggers, FRESHNESS_WAIT):
        return reader
    log.info("%s: the cache has not seen %s after %.0fs; deciding from the API server",
             ctx.key, sorted(ctx.triggers), FRESHNESS_WAIT)
    return LiveReader(kube(), max_instances_ceiling=pool_settings().max_instances_ceiling,
                      routes=pool_settings().routing, server_clock=server_clock())


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

K = TypeVar("K", InstanceKey, SessionKey, PoolKey, TimeoutKey, ProbeKey, SweepKey)


@dataclass(frozen=True)
class Job(Generic[K]):
    """A key kind's job: the key type it takes and the controller function it calls."""

    key_type: type[K]
    call: Callable[[JobContext, K, Reader], Result]


def _probes() -> ProbeKeys | None:
    """A job's URL probes, as probe keys (session-lifecycle §2); None when the probe is off
    (`WARMPOOL_URL_PROBE=off`: the URL then comes with HANDLED)."""
    return ProbeKeys() if pool_settings().url_probe else None


def _with_probes(result: Result, probes: ProbeKeys | None) -> Result:
    if probes is not None:
        result.follow_ups.extend(probes.follow_ups())
    return result


def _reconcile(ctx: JobContext, key: InstanceKey, reader: Reader) -> Result:
    probes = _probes()
    return _with_probes(reconcile_instance(reader, kube(), key, ctx.lease, pool_settings(),
                                           prober=probes, pacer=pacer(ctx)), probes)


def _claim(ctx: JobContext, key: SessionKey, reader: Reader) -> Result:
    probes = _probes()
    # `retried`: a run that failed or died may have made a deciding write nobody saw.
    return _with_probes(claim_session(reader, kube(), key, JobLeases(ctx), pool_settings(),
                                      prober=probes,
                                      retried=ctx.attempt > 1), probes)


#: The share of a process's job threads that may run URL probes at once. An attempt at an
#: instance that does not answer waits up to the probe's timeout (5 s), and a burst of new
#: Sessions makes many attempts a second: without a cap they could hold every thread while
#: claims wait for one (issue #28: claims first). A probe that finds no slot runs again a
#: moment later, on this worker or another; its schedule is the queue's, so nothing is lost.
PROBE_SHARE = 0.5
#: When a probe that found no free slot runs again, at the soonest.
PROBE_SLOT_RETRY = 0.25


@functools.cache
def _probe_slots() -> threading.BoundedSemaphore:
    return threading.BoundedSemaphore(max(1, int(job_threads() * PROBE_SHARE)))


def _probe(ctx: JobContext, key: ProbeKey, reader: Reader) -> Result:
    slots = _probe_slots()
    if not slots.acquire(blocking=False):
        return Result.deferred("every URL probe slot of this worker is busy",
                               after=PROBE_SLOT_RETRY)
    try:
        return probe_url(reader, key, pool_settings(), probe_settings(),
                         states=RedisProbeStates(ctx.jobs.client, ctx.jobs.settings.prefix),
                         writes=SessionWrites(kube()), fetch=_fetch())
    finally:
        slots.release()


def _resync(ctx: JobContext, key: PoolKey, reader: Reader) -> Result:
    return resync_pool(reader, kube(), key, pool_settings(), timeouts=timeout_settings())


def _timeout(ctx: JobContext, key: TimeoutKey, reader: Reader) -> Result:
    return session_timeout(timeout_runner(), reader, key)


def _sweep(ctx: JobContext, key: SweepKey, reader: Reader) -> Result:
    return sweep_orphans(reader, kube(), key)


#: The table of jobs (controller-runtime: one reconciler per kind, one handler loop).
JOBS: dict[str, Job[Any]] = {
    "instance": Job(InstanceKey, _reconcile),
    "session": Job(SessionKey, _claim),
    "pool": Job(PoolKey, _resync),
    "timeout": Job(TimeoutKey, _timeout),
    "probe": Job(ProbeKey, _probe),
    "sweep": Job(SweepKey, _sweep),
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
        return min(self.cap, self.base * (1 << n))  # 2 ** n, as an int (n >= 0)

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
    # Every log line of the job names its key and fence (JSON: fields; text: key=... fence=...).
    with logs.job_context(ctx.key, ctx.lease.fence), job_metrics.JobMetrics(ctx) as metrics:
        reader = _ready_reader(ctx, key.namespace)
        result = (job.call(ctx, key, reader) if reader is not None
                  else Result(Outcome.BEHIND, requeue_after=BEHIND_RETRY))
        for under, writes in result.written.items():
            for field, value in writes:
                ctx.note_write(field, value, key=None if under == ctx.key else under)
        if result.outcome is Outcome.DEFERRED and result.parked_on is not None:
            # Waits for one lease: woken by its release, no polling (issue #28); its
            # fallback, the lease TTL, is when a dead holder's lease has expired.
            log.debug("%s parked on %s: %s", ctx.key, result.parked_on, result.message)
            _backoff.forget(ctx.key)
            ctx.park(str(result.parked_on), ctx.jobs.settings.lease_ttl)
        elif result.outcome is Outcome.DEFERRED:  # an error outcome: backed off
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
    for k, after in result.later:
        ctx.jobs.queue.add_after(str(k), after)


for _kind in JOBS:
    register(_kind, run)
on_broker(_start_cache)
