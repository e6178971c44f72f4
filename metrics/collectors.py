"""Collectors that compute their series at scrape time.

- `ClusterCollector`: what all hosts share, read from Redis: the queue (depth, delayed,
  running, dead letters, oldest wait, live worker processes: the `Inspector`'s census, by
  kind) and the pool (instances by state, waiting Sessions). Every process that exports it
  exports the same numbers, so it is exported by the scheduler's endpoint only (see
  metrics/README.md).
- `SchedulerCollector`: a `scheduler.app.Scheduler`'s own counters and state, and the keys
  its producer added (`AddCounter`).
- `WorkerPoolCollector`: the worker parent's view of its children.

The roles these collectors read (the scheduler, `workers.process.WorkerPool`) import this
package to export their series; so the collectors name what they read of them as protocols
(`SchedulerView`, `WorkerPoolView`) instead of importing them back.

None of them uses prometheus-client's value classes, so they are right whether or not
``PROMETHEUS_MULTIPROC_DIR`` is set in the process that serves them.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from metrics.labels import (
    EVENT_TYPES,
    KINDS,
    POOL_STATES,
    RESYNC_REASONS,
    WATCHED_KINDS,
    kind_of,
    reason_label,
)
from metrics.poolstate import PoolSnapshot, PoolState
from warmpool.queue.inspect import Inspector, longest_wait
from warmpool.queue.observer import NullObserver
from warmpool.queue.settings import QueueSettings

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from warmpool.kube.reflector import Reflector

log = logging.getLogger(__name__)


class SchedulerStatsView(Protocol):
    """The counters `SchedulerCollector` reads (`scheduler.app.SchedulerStats`)."""

    @property
    def last_resync(self) -> float | None: ...
    @property
    def dropped_not_leader(self) -> int: ...
    @property
    def enqueue_errors(self) -> int: ...
    @property
    def redis_losses(self) -> int: ...


class SchedulerView(Protocol):
    """What `SchedulerCollector` reads of a scheduler (`scheduler.app.Scheduler`)."""

    @property
    def stats(self) -> SchedulerStatsView: ...
    @property
    def reflectors(self) -> Sequence[Reflector]: ...
    def event_counts(self) -> Mapping[tuple[str, str], int]: ...
    def resync_counts(self) -> Mapping[str, int]: ...
    def is_leader(self) -> bool: ...
    def synced(self) -> bool: ...


class WorkerPoolView(Protocol):
    """What `WorkerPoolCollector` reads of the worker parent (`workers.process.WorkerPool`)."""

    @property
    def procs(self) -> Sequence[BaseProcess | None]: ...
    @property
    def restarts(self) -> int: ...


def _by_kind(keys: Iterable[str]) -> dict[str, int]:
    counts = dict.fromkeys(KINDS, 0)
    for key in keys:
        kind = kind_of(key)
        if kind in counts:
            counts[kind] += 1
    return counts


@dataclass
class QueueSnapshot:
    depth: dict[str, int] = field(default_factory=dict)  # ready keys
    delayed: dict[str, int] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)
    dead: dict[str, int] = field(default_factory=dict)
    oldest_waiting: dict[str, float] = field(default_factory=dict)  # 0.0: none waiting
    workers: int = 0


def read_queue(client: redis.Redis, settings: QueueSettings) -> QueueSnapshot:
    """The queue's keys by kind, as the `Inspector` defines their states (one pipelined
    read, O(keys waiting + running + delayed + dead))."""
    census = Inspector(client, settings).census()
    waits: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for key, seconds in census.waited.items():
        waits.get(kind_of(key), []).append(seconds)
    return QueueSnapshot(
        depth=_by_kind(census.ready),
        delayed=_by_kind(census.delayed),
        running=_by_kind(census.running),
        dead=_by_kind(census.dead),
        oldest_waiting={kind: longest_wait(w) or 0.0 for kind, w in waits.items()},
        workers=census.workers_alive,
    )


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)


class ClusterCollector(Collector):
    """The queue and the pool as Redis holds them: the same from every process."""

    def __init__(self, client: redis.Redis, settings: QueueSettings) -> None:
        self.client = client
        self.settings = settings
        self.pool = PoolState(client, settings)

    def _families(self) -> dict[str, GaugeMetricFamily]:
        k = ["kind"]
        a = ["appdefinition"]
        return {
            "up": _gauge("warmpool_metrics_redis_up", "1 if the last scrape read the queue and "
                         "pool state from Redis, 0 if that failed"),
            "depth": _gauge("warmpool_workqueue_depth", "Keys waiting to run (added, not "
                            "running), cluster-wide", k),
            "delayed": _gauge("warmpool_workqueue_delayed", "Keys scheduled to run later "
                              "(deferred or backing off), cluster-wide", k),
            "running": _gauge("warmpool_workqueue_running", "Keys whose lease is held, "
                              "cluster-wide (a crashed holder's until taken back)", k),
            "dead": _gauge("warmpool_workqueue_dead_letters", "Dead-lettered keys now "
                           "(queue.list_dead)", k),
            "oldest": _gauge("warmpool_workqueue_oldest_waiting_seconds", "Seconds the "
                             "longest-waiting key has waited since its first add (0: none)",
                             k),
            "workers": _gauge("warmpool_workqueue_workers", "Worker processes whose heartbeat "
                              "is fresh, cluster-wide"),
            "instances": _gauge("warmpool_pool_instances", "Instances of the pool by the state "
                                "their last reconcile left them in", [*a, "state"]),
            "waiting": _gauge("warmpool_sessions_waiting", "Sessions waiting for a free "
                              "instance", a),
            "waiting_oldest": _gauge("warmpool_sessions_waiting_oldest_seconds", "Seconds the "
                                     "longest-waiting Session has waited since its claim "
                                     "first found no instance (0: none)", a),
        }

    def describe(self) -> Iterator[Metric]:
        yield from self._families().values()

    def collect(self) -> Iterator[Metric]:
        f = self._families()
        try:
            queue = read_queue(self.client, self.settings)
            pool = self.pool.snapshot()
        except redis.RedisError as exc:
            log.warning("metrics: reading the queue state from Redis failed: %s", exc)
            f["up"].add_metric([], 0)
            yield f["up"]
            return
        f["up"].add_metric([], 1)
        for kind in KINDS:
            f["depth"].add_metric([kind], queue.depth[kind])
            f["delayed"].add_metric([kind], queue.delayed[kind])
            f["running"].add_metric([kind], queue.running[kind])
            f["dead"].add_metric([kind], queue.dead[kind])
            f["oldest"].add_metric([kind], queue.oldest_waiting[kind])
        f["workers"].add_metric([], queue.workers)
        self._pool(f, pool)
        yield from f.values()

    @staticmethod
    def _pool(f: dict[str, GaugeMetricFamily], pool: PoolSnapshot) -> None:
        for appdef in sorted(pool.appdefs):
            for state in POOL_STATES:
                f["instances"].add_metric([appdef, state], pool.instances.get((appdef, state), 0))
            f["waiting"].add_metric([appdef], pool.waiting.get(appdef, 0))
            f["waiting_oldest"].add_metric([appdef], pool.oldest_waiting.get(appdef, 0.0))


class AddCounter(NullObserver):
    """A producer's adds by kind and result (the scheduler's queue observer)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[tuple[str, str], int] = defaultdict(int)

    def on_add(self, key: str, result: str) -> None:
        with self._lock:
            self.counts[(kind_of(key), str(result))] += 1

    def total(self, kind: str, *results: str) -> int:
        with self._lock:
            return sum(self.counts.get((kind, r), 0) for r in results)


#: Shared by the scheduler's and the workers' series of the same name (metrics.worker).
REDIS_LOST_HELP = ("Times this process found the Redis epoch missing or replaced: Redis lost "
                   "its data (restart without persistence, FLUSHALL, eviction, failover); a "
                   "scheduler then resyncs every pool at once")


class SchedulerCollector(Collector):
    def __init__(self, app: SchedulerView, adds: AddCounter | None = None) -> None:
        self.app = app
        self.adds = adds

    def describe(self) -> Iterator[Metric]:
        """The families, without asking the scheduler anything (registration calls this)."""
        for name, kind in _SCHEDULER_FAMILIES:
            yield (_counter if kind == "counter" else _gauge)(name, "")
        if self.adds is not None:
            yield from add_families(AddCounter())

    def collect(self) -> Iterator[Metric]:
        app = self.app
        stats = app.stats
        k = ["kind"]
        events = _counter("warmpool_scheduler_watch_events", "Watch events handled (and "
                          "differences found by a relist), by object kind and event type",
                          ["kind", "type"])
        seen = app.event_counts()
        for kind in sorted({*WATCHED_KINDS, *(kk for kk, _ in seen)}):
            for etype in EVENT_TYPES:
                events.add_metric([kind, etype], seen.get((kind, etype), 0))
        yield events

        relists = _counter("warmpool_scheduler_relists", "LISTs after a watch's first: "
                           "after 410 Gone or repeated watch errors", k)
        errors = _counter("warmpool_scheduler_watch_errors", "Failed watches and lists", k)
        per_kind: dict[str, list[int]] = {kind: [0, 0] for kind in WATCHED_KINDS}
        for r in app.reflectors:
            counts = per_kind.setdefault(r.watched.kind, [0, 0])
            counts[0] += max(0, r.stats.lists - 1)
            counts[1] += r.stats.errors
        for kind, (lists, errs) in sorted(per_kind.items()):
            relists.add_metric([kind], lists)
            errors.add_metric([kind], errs)
        yield relists
        yield errors

        resyncs = _counter("warmpool_scheduler_resyncs", "Full resyncs (a pool key per "
                           "AppDefinition), by reason", ["reason"])
        by_reason = {reason_label(r): n for r, n in app.resync_counts().items()}
        for reason in sorted({*RESYNC_REASONS, *by_reason}):
            resyncs.add_metric([reason], by_reason.get(reason, 0))
        yield resyncs

        leader = _gauge("warmpool_scheduler_leader", "1 while this scheduler leads (adds "
                        "keys), else 0")
        leader.add_metric([], 1 if app.is_leader() else 0)
        yield leader
        synced = _gauge("warmpool_scheduler_synced", "1 once every watch has its first list")
        synced.add_metric([], 1 if app.synced() else 0)
        yield synced
        last = _gauge("warmpool_scheduler_last_resync_timestamp_seconds", "Unix time of this "
                      "scheduler's last resync (0: none yet)")
        last.add_metric([], stats.last_resync or 0.0)
        yield last
        dropped = _counter("warmpool_scheduler_dropped_keys", "Keys not added because this "
                           "scheduler was not leading")
        dropped.add_metric([], stats.dropped_not_leader)
        yield dropped
        enq_errors = _counter("warmpool_scheduler_enqueue_errors", "Failed batch adds to the "
                              "queue (retried)")
        enq_errors.add_metric([], stats.enqueue_errors)
        yield enq_errors
        lost = _counter("warmpool_redis_data_lost", REDIS_LOST_HELP)
        lost.add_metric([], stats.redis_losses)
        yield lost

        if self.adds is not None:
            yield from add_families(self.adds)


_SCHEDULER_FAMILIES = (
    ("warmpool_scheduler_watch_events", "counter"),
    ("warmpool_scheduler_relists", "counter"),
    ("warmpool_scheduler_watch_errors", "counter"),
    ("warmpool_scheduler_resyncs", "counter"),
    ("warmpool_scheduler_leader", "gauge"),
    ("warmpool_scheduler_synced", "gauge"),
    ("warmpool_scheduler_last_resync_timestamp_seconds", "gauge"),
    ("warmpool_scheduler_dropped_keys", "counter"),
    ("warmpool_scheduler_enqueue_errors", "counter"),
    ("warmpool_redis_data_lost", "counter"),
)


def add_families(adds: AddCounter) -> Iterator[Metric]:
    """The producer's share of the workqueue add counters (workers export theirs)."""
    spec: list[tuple[str, str, tuple[str, ...]]] = [
        ("warmpool_workqueue_adds", "Keys added to the queue: enqueued, or re-added while "
         "running (runs once more); deduplicated adds are not counted", ("enqueued", "rerun")),
        ("warmpool_workqueue_deduplicated", "Adds of keys already waiting (nothing to do: the "
         "key runs once), or at rest whose every trigger is their own last run's write",
         ("deduplicated", "own")),
        ("warmpool_workqueue_delayed_adds", "Keys scheduled to run later (defer / add_after / "
         "park); counted in adds when they become due", ("delayed", "parked")),
    ]
    for name, doc, results in spec:
        fam = _counter(name, doc, ["kind"])
        for kind in KINDS:
            fam.add_metric([kind], adds.total(kind, *results))
        yield fam


class WorkerPoolCollector(Collector):
    """The worker parent's own series: its children, alive and restarted."""

    def __init__(self, pool: WorkerPoolView) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        procs: list[Any] = list(self.pool.procs)
        alive = _gauge("warmpool_worker_processes", "Worker processes of this host alive now")
        alive.add_metric([], sum(1 for p in procs if p is not None and p.is_alive()))
        yield alive
        wanted = _gauge("warmpool_worker_processes_desired", "Worker processes this host runs "
                        "(--processes)")
        wanted.add_metric([], len(procs))
        yield wanted
        restarts = _counter("warmpool_worker_restarts", "Worker processes restarted after "
                            "they exited")
        restarts.add_metric([], self.pool.restarts)
        yield restarts
