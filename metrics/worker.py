"""The series of worker processes, and what feeds them: a `QueueObserver` for the queue's
events, and `JobMetrics`, the one hook the run loop (`workers.handlers.run`) hands every job's
`Result` to: it counts and times the job, and leaves the pool-state records in Redis that the
scheduler's collectors export.

Worker processes run in prometheus-client's multiprocess mode: each process writes its
values to files in ``PROMETHEUS_MULTIPROC_DIR`` and the worker parent aggregates them per
host (``metrics.exposition.host_registry``). Counters and histograms are summed over every
process that ever ran since the parent started (a dead process's counts stay counted);
gauges are per live process only (``livesum`` / ``livemax``: the parent deletes a dead
child's gauge files, ``workers.process.WorkerPool``), so a SIGKILLed worker's running jobs
stop counting the moment it is reaped.

Importing this module creates the series; it chooses prometheus-client's value class from the
environment at that moment (not whenever prometheus-client was first imported), so a worker
process must have its ``PROMETHEUS_MULTIPROC_DIR`` set, or removed, before importing it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

import redis
from prometheus_client import Counter, Gauge, Histogram, values

from metrics.collectors import REDIS_LOST_HELP
from metrics.labels import (
    CLAIM_BUCKETS,
    CONFLICT,
    DURATION_BUCKETS,
    ERROR,
    KINDS,
    LEASE_WAIT_BUCKETS,
    REFUSED_KINDS,
    REQUEUE,
    RESULTS,
    SKIP_RESULTS,
    SUCCESS,
    kind_of,
)
from metrics.poolstate import PoolState, Stale
from warmpool.controller.result import Outcome, Result, Start
from warmpool.keys import Key, PoolKey, parse_key
from warmpool.pool.claim import WaitReason
from warmpool.pool.decide import Plan, State
from warmpool.pool.health import PoolHealth
from warmpool.queue.lease import LeaseLost
from warmpool.queue.observer import NullObserver, set_observer

if TYPE_CHECKING:
    from warmpool.queue.jobs import JobContext, Jobs

log = logging.getLogger(__name__)

# Chosen now, from this process's environment (see the module docstring).
values.ValueClass = values.get_value_class()

_kind = ["kind"]

# --- the workqueue vocabulary (client-go's names, under warmpool_workqueue_) -------------------

ADDS = Counter("warmpool_workqueue_adds", "Keys added to the queue: enqueued, or re-added "
               "while running (runs once more); deduplicated adds are not counted", _kind)
DEDUPLICATED = Counter("warmpool_workqueue_deduplicated", "Adds of keys already waiting "
                       "(nothing to do: the key runs once), or at rest whose every trigger is "
                       "their own last run's write", _kind)
DELAYED_ADDS = Counter("warmpool_workqueue_delayed_adds", "Keys scheduled to run later "
                       "(defer / add_after / park); counted in adds when they become due",
                       _kind)
QUEUE_DURATION = Histogram("warmpool_workqueue_queue_duration_seconds", "Seconds a key waited "
                           "from its first add until a worker took its lease", _kind,
                           buckets=DURATION_BUCKETS)
WORK_DURATION = Histogram("warmpool_workqueue_work_duration_seconds", "Seconds a worker held a "
                          "key's lease for one run (handler and release)", _kind,
                          buckets=DURATION_BUCKETS)
UNFINISHED = Gauge("warmpool_workqueue_unfinished_work_seconds", "Seconds of work done by "
                   "runs still in progress (large values indicate stuck threads)", _kind,
                   multiprocess_mode="livesum")
LONGEST = Gauge("warmpool_workqueue_longest_running_processor_seconds", "Seconds the longest "
                "run still in progress has been running", _kind, multiprocess_mode="livemax")
IN_FLIGHT = Gauge("warmpool_workqueue_in_flight", "Runs in progress in live worker processes",
                  _kind, multiprocess_mode="livesum")
RETRIES = Counter("warmpool_workqueue_retries", "Failed runs scheduled to run again after a "
                  "backoff (including keys taken back from a crashed holder)", _kind)
DEAD_LETTERED = Counter("warmpool_workqueue_dead_lettered", "Keys dead-lettered after "
                        "max_failures consecutive failures", _kind)
SKIPPED = Counter("warmpool_workqueue_skipped", "Delivered messages that did not run: busy "
                  "(another worker holds the key) or stale (nothing owed)", ["kind", "result"])

# --- jobs ------------------------------------------------------------------------------------

RECONCILE = Counter("warmpool_reconcile", "Handler runs by result: success; requeue (deferred: "
                    "a lease it needs was busy); conflict (ended in a 409 Conflict or a fence "
                    "regression, or succeeded only after re-observing); error (any other "
                    "exception)", ["kind", "result"])
RECONCILE_DURATION = Histogram("warmpool_reconcile_duration_seconds", "Seconds a handler ran",
                               _kind, buckets=DURATION_BUCKETS)

# --- leases ----------------------------------------------------------------------------------

CACHE_BEHIND = Counter("warmpool_cache_behind", "Jobs handed back because this worker's "
                       "watch-fed cache had not yet seen the versions that caused them",
                       ["kind"])
LEASE_WAIT = Histogram("warmpool_lease_acquire_wait_seconds", "Seconds from a job first finding "
                       "another key's lease busy (try_lease) until it got one; kind of the "
                       "lease", _kind, buckets=LEASE_WAIT_BUCKETS)
CONTENTION = Counter("warmpool_lease_contention", "try_lease calls that found the key held by "
                     "another job; kind of the lease", _kind)
LEASE_LOST = Counter("warmpool_lease_lost", "Leases a live holder found taken or expired "
                     "(renewal or release refused)", _kind)
LEASE_EXPIRED = Counter("warmpool_lease_expired", "Leases that expired because their holder "
                        "stopped renewing (crashed): the key was taken back by maintenance",
                        _kind)
REDIS_LOST = Counter("warmpool_redis_data_lost", REDIS_LOST_HELP)
FENCE_REGRESSIONS = Counter("warmpool_fence_regressions", "Jobs that refused to write because a "
                            "newer lease holder had written the instance", _kind)

# --- the pool --------------------------------------------------------------------------------

CLAIM_DURATION = Histogram("warmpool_claim_duration_seconds", "Seconds from a Session's "
                           "creationTimestamp to its claim completing (status HANDLED), by "
                           "start: warm (an instance whose pod was Ready) or cold (its pod "
                           "was starting, or made for it: burst)",
                           ["appdefinition", "start"], buckets=CLAIM_BUCKETS)
POOL_PODS = Gauge("warmpool_pool_instances_by_pod", "A pool's instances by their pod, as its "
                  "last resync counted them: warm (Ready), starting, failing (an image pull "
                  "error or a crash loop; at 3 the pool makes no new instance)",
                  ["appdefinition", "pod"], multiprocess_mode="mostrecent")
POOL_CAPPED = Gauge("warmpool_pool_start_failures_capped", "1 while a pool makes no new "
                    "instance because too many of its pods cannot start, else 0",
                    ["appdefinition"], multiprocess_mode="mostrecent")
CLAIMS_WAITED = Counter("warmpool_claims_waited", "Sessions that found no instance and began "
                        "to wait, by limit: maxInstances (burst at its cap), minInstances "
                        "(burst off), other (a missing shared route, an invalid AppDefinition)",
                        ["appdefinition", "limit"])
RELEASES = Counter("warmpool_releases", "Instances released: a reconcile ended with the "
                   "instance no longer claimed after it was recorded claimed, or cleared a "
                   "holder's traces", ["appdefinition"])
REFUSED = Counter("warmpool_refused_inputs", "Bad input left alone: Sessions set to ERROR by a "
                  "claim, AppDefinitions a resync refused to act on", _kind)


def _preinitialise() -> None:
    for kind in KINDS:
        for family in (ADDS, DEDUPLICATED, DELAYED_ADDS, QUEUE_DURATION, WORK_DURATION,
                       UNFINISHED, LONGEST, IN_FLIGHT, RETRIES, DEAD_LETTERED,
                       RECONCILE_DURATION, LEASE_WAIT, CONTENTION, LEASE_LOST, LEASE_EXPIRED,
                       FENCE_REGRESSIONS):
            family.labels(kind=kind)
        for result in RESULTS:
            RECONCILE.labels(kind=kind, result=result)
        for reason in SKIP_RESULTS:
            SKIPPED.labels(kind=kind, result=reason)
    for kind in REFUSED_KINDS:
        REFUSED.labels(kind=kind)


_preinitialise()


# --- the queue observer ----------------------------------------------------------------------

_children: dict[tuple[int, str], Any] = {}


def _child(metric: Any, kind: str) -> Any:
    """`metric.labels(kind=kind)`, looked up once per process (it takes a lock and builds a
    label tuple on every call: measurable at thousands of jobs a second)."""
    found = _children.get((id(metric), kind))
    if found is None:
        found = _children[(id(metric), kind)] = metric.labels(kind=kind)
    return found


LOST_WINDOW = 60.0  # seconds: reports of one key's lease loss within this are one loss

class WorkerObserver(NullObserver):
    """Counts the queue's events; tracks this process's running jobs for the gauges.

    A job starts and ends on the same worker thread (dramatiq's before/after hooks), so the
    running jobs are kept per thread: a thread runs one job at a time. The gauges are set from
    that table by `tick()` (each second, `install`), so the seconds of a long job keep growing
    between scrapes; they are never incremented or decremented, so they cannot drift or go
    negative. Setting them on every start and end as well cost a keyed job about a seventh of
    its throughput (nine multiprocess gauge writes per event) for a figure a scrape reads at
    most every few seconds anyway.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._running: dict[int, tuple[str, float]] = {}
        self._lost: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def on_add(self, key: str, result: str) -> None:
        kind = kind_of(key)
        if result in ("enqueued", "rerun"):
            ADDS.labels(kind=kind).inc()
        elif result in ("deduplicated", "own"):
            DEDUPLICATED.labels(kind=kind).inc()
        elif result in ("delayed", "parked"):
            DELAYED_ADDS.labels(kind=kind).inc()

    def on_start(self, key: str, queue_seconds: float | None) -> None:
        kind = kind_of(key)
        if queue_seconds is not None:
            _child(QUEUE_DURATION, kind).observe(max(0.0, queue_seconds))
        with self._lock:
            self._running[threading.get_ident()] = (kind, self.clock())

    def on_skip(self, key: str, reason: str) -> None:
        if reason in SKIP_RESULTS:
            SKIPPED.labels(kind=kind_of(key), result=reason).inc()

    def on_done(self, key: str, result: str, work_seconds: float) -> None:
        _child(WORK_DURATION, kind_of(key)).observe(max(0.0, work_seconds))
        with self._lock:
            self._running.pop(threading.get_ident(), None)

    def on_retry(self, key: str, delay_seconds: float, failures: int) -> None:
        RETRIES.labels(kind=kind_of(key)).inc()

    def on_dead_letter(self, key: str, error: str) -> None:
        DEAD_LETTERED.labels(kind=kind_of(key)).inc()

    def on_lease_lost(self, key: str) -> None:
        # One loss is reported twice when the renewal notices it first (then the release at
        # the job's end is refused too): count a key's loss once per LOST_WINDOW.
        now = self.clock()
        with self._lock:
            last = self._lost.get(key)
            if last is not None and now - last < LOST_WINDOW:
                return
            self._lost[key] = now
            if len(self._lost) > 1000:
                self._lost = {k: t for k, t in self._lost.items() if now - t < LOST_WINDOW}
        LEASE_LOST.labels(kind=kind_of(key)).inc()

    def on_contention(self, key: str, holder: str) -> None:
        CONTENTION.labels(kind=kind_of(key)).inc()

    def on_recovered(self, key: str, result: str) -> None:
        kind = kind_of(key)
        LEASE_EXPIRED.labels(kind=kind).inc()
        (DEAD_LETTERED if result == "dead" else RETRIES).labels(kind=kind).inc()

    def on_redis_lost(self, previous: str | None, current: str | None) -> None:
        # Logged by the epoch check; the series is what an alert and the chaos tier read.
        REDIS_LOST.inc()

    def _update(self) -> None:
        """Set the gauges from the running table (caller holds the lock)."""
        now = self.clock()
        total = dict.fromkeys(KINDS, 0.0)
        longest = dict.fromkeys(KINDS, 0.0)
        count = dict.fromkeys(KINDS, 0)
        for kind, started in self._running.values():
            if kind not in total:
                continue
            age = max(0.0, now - started)
            total[kind] += age
            longest[kind] = max(longest[kind], age)
            count[kind] += 1
        for kind in KINDS:
            UNFINISHED.labels(kind=kind).set(total[kind])
            LONGEST.labels(kind=kind).set(longest[kind])
            IN_FLIGHT.labels(kind=kind).set(count[kind])

    def tick(self) -> None:
        with self._lock:
            self._update()

    def running(self) -> int:
        with self._lock:
            return len(self._running)

    def start(self, period: float = 1.0) -> WorkerObserver:
        def run() -> None:
            while not self._stop.wait(period):
                try:
                    self.tick()
                except Exception:
                    log.exception("updating the running-work gauges failed")

        if self._thread is None:
            self._thread = threading.Thread(target=run, name="metrics-ticker", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None


def install() -> WorkerObserver:
    """Make this process's queues and workers report to a `WorkerObserver` (worker
    processes call it at start, before their broker is built)."""
    observer = WorkerObserver().start()
    set_observer(observer)
    return observer


# --- job runs: the run loop's one hook ------------------------------------------------------

class JobMetrics:
    """The one metrics hook of the run loop, around every job: times it and counts its
    result (see `RECONCILE`'s help); `record(result)` leaves what the job's `Result` says
    about the pool in Redis for the collectors (the instance's state, a Session waiting or
    not, the waiting Sessions a resync no longer lists), while the job still holds its
    leases, and counts releases, claim latency and refused inputs."""

    def __init__(self, ctx: JobContext, clock: Callable[[], float] = time.monotonic) -> None:
        self.ctx = ctx
        self.kind = kind_of(ctx.key)
        self.clock = clock
        self.result: Result | None = None
        self._resync_ms: int | None = None

    def __enter__(self) -> JobMetrics:
        self.started = self.clock()
        if self.kind == "pool":  # before the resync reads: see `resync_done`
            self._resync_ms = resync_started(self.ctx)
        return self

    def record(self, result: Result) -> None:
        self.result = result
        ctx = self.ctx
        if result.outcome is Outcome.BEHIND:
            CACHE_BEHIND.labels(kind=self.kind).inc()
            return
        if result.outcome is Outcome.DEFERRED:
            return
        record = result.record
        if record.plan is not None and record.instance is not None:
            own = str(record.instance) == ctx.key
            instance_done(ctx, record.instance.appdef, record.plan,
                          key=None if own else str(record.instance),
                          fence=None if own else record.fence)
        if self.kind == "session":
            claim_done(ctx, result)
        elif self.kind == "pool":
            key = parse_key(ctx.key)
            assert isinstance(key, PoolKey)
            resync_done(ctx, key, [k for k, _ in result.follow_ups], self._resync_ms,
                        refused=result.outcome is Outcome.REFUSED)
            if result.record.health is not None:
                pool_health_seen(key.appdef, result.record.health)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        RECONCILE_DURATION.labels(kind=self.kind).observe(max(0.0, self.clock() - self.started))
        RECONCILE.labels(kind=self.kind, result=classify(exc, self.result)).inc()
        if exc is not None and isinstance(exc, _conflicts()[1]):
            FENCE_REGRESSIONS.labels(kind=self.kind).inc()


@functools.cache
def _conflicts() -> tuple[type[Exception], type[Exception]]:
    """(Conflict, FenceRegression), imported on first use: they bring in the Kubernetes
    client, which a worker running other handlers need not load."""
    from warmpool.kube.api import Conflict
    from warmpool.kube.executor import FenceRegression

    return Conflict, FenceRegression


def classify(exc: BaseException | None, result: Result | None = None) -> str:
    """success | requeue | conflict | error, as `RECONCILE`'s help defines them."""
    if exc is not None:
        return CONFLICT if isinstance(exc, _conflicts()) else ERROR
    if result is None:
        return SUCCESS
    if result.outcome in (Outcome.DEFERRED, Outcome.BEHIND):
        return REQUEUE
    return CONFLICT if result.record.attempts > 1 else SUCCESS


# --- pool state, recorded by the handlers ----------------------------------------------------

_states: weakref.WeakKeyDictionary[Jobs, PoolState] = weakref.WeakKeyDictionary()
_states_lock = threading.Lock()


def pool_state(jobs: Jobs) -> PoolState:
    """The `PoolState` on this worker's connection and key prefix."""
    with _states_lock:
        state = _states.get(jobs)
        if state is None:
            state = _states[jobs] = PoolState(jobs.client, jobs.settings, jobs.book.clock)
        return state


def instance_done(ctx: JobContext, appdef: str, plan: Plan,
                  key: str | None = None, fence: int | None = None) -> None:
    """After an instance reconcile: record the instance's state, count a release (the plan
    says it cleared a holder's traces, or the instance was recorded claimed and is not now).

    `key`/`fence`: an instance a claim job reconciled under that instance's lease (taken and
    given back within the job): the record is fence-ordered, so a later holder's wins."""
    if plan.state is State.INVALID:
        return  # the AppDefinition is refused; the instance is left as it is
    try:
        ctx.ensure_held()  # a holder that lost its lease leaves the record to the new one
        previous = pool_state(ctx.jobs).record_instance(
            key or ctx.key, appdef, plan.state, fence if fence is not None else ctx.fence)
    except (Stale, LeaseLost):
        return
    except redis.RedisError as exc:
        log.warning("recording the state of %s failed: %s", ctx.key, exc)
        return
    if plan.state is not State.CLAIMED and (previous == State.CLAIMED or plan.released):
        RELEASES.labels(appdefinition=appdef).inc()


def claim_done(ctx: JobContext, result: Result, now: datetime | None = None) -> None:
    """After a claim: a waiting Session is recorded, any other outcome clears it; a claim's
    latency is observed; a refused Session counted."""
    state = pool_state(ctx.jobs)
    record = result.record
    try:
        if result.outcome is Outcome.WAITING and record.appdef:
            if state.waiting(ctx.key, record.appdef):
                CLAIMS_WAITED.labels(appdefinition=record.appdef,
                                     limit=str(record.wait or WaitReason.OTHER)).inc()
        else:
            state.not_waiting(ctx.key)
    except redis.RedisError as exc:
        log.warning("recording the claim of %s failed: %s", ctx.key, exc)
    if result.outcome is Outcome.CLAIMED and record.appdef:
        seconds = seconds_since(record.session_created, now)
        if seconds is not None:
            CLAIM_DURATION.labels(appdefinition=record.appdef,
                                  start=record.start or Start.WARM).observe(seconds)
    elif result.outcome is Outcome.REFUSED:
        REFUSED.labels(kind="session").inc()


def pool_health_seen(appdef: str, health: PoolHealth) -> None:
    """A resync counted the pool's pods: the pool's gauges."""
    for pod, n in (("warm", health.warm), ("starting", health.starting),
                   ("failing", health.failing)):
        POOL_PODS.labels(appdefinition=appdef, pod=pod).set(n)
    POOL_CAPPED.labels(appdefinition=appdef).set(1 if health.capped else 0)


def resync_started(ctx: JobContext) -> int | None:
    """Redis time (ms) before a resync reads the pool, for `resync_done`."""
    try:
        return pool_state(ctx.jobs).now_ms()
    except redis.RedisError:
        return None


def resync_done(ctx: JobContext, key: PoolKey, keys: list[Key], started_ms: int | None,
                refused: bool = False) -> None:
    """After a resync: forget waiting Sessions of the pool it no longer lists (deleted ones);
    count an AppDefinition it refused."""
    if refused:
        REFUSED.labels(kind="appdefinition").inc()
        return  # its Sessions wait for it to be fixed: they are still waiting
    if started_ms is None:
        return
    keep = {str(k) for k in keys if k.kind == "session"}
    try:
        pool_state(ctx.jobs).prune_waiting(key.namespace, key.appdef, keep, started_ms)
    except redis.RedisError as exc:
        log.warning("pruning waiting Sessions of %s failed: %s", key, exc)


def lease_busy(ctx: JobContext, key: str) -> None:
    """A job's try_lease(key) found it busy: remember when, for the acquire-wait series."""
    try:
        pool_state(ctx.jobs).contended(ctx.key)
    except redis.RedisError as exc:
        log.debug("recording contention of %s failed: %s", ctx.key, exc)


def lease_taken(ctx: JobContext, key: str) -> None:
    """A job's try_lease(key) got it: observe the wait if the job had found one busy."""
    try:
        waited = pool_state(ctx.jobs).acquired(ctx.key)
    except redis.RedisError as exc:
        log.debug("reading contention of %s failed: %s", ctx.key, exc)
        return
    if waited is not None:
        LEASE_WAIT.labels(kind=kind_of(key)).observe(waited)


def seconds_since(timestamp: str, now: datetime | None = None) -> float | None:
    """Seconds from an RFC 3339 timestamp (a creationTimestamp) until `now`."""
    if not timestamp:
        return None
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    return max(0.0, ((now or datetime.now(UTC)) - then).total_seconds())
