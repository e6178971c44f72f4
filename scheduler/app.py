"""The scheduler's run loop: watches -> keys -> the queue, while (and only while) leading.

Threads: one reflector per watched kind and namespace, the leader elector, a dispatcher that
adds keys to the queue, and a resync timer. Every replica watches (its caches stay warm, so
a standby that takes over resyncs from memory at once and its readiness means "can take
over"); only the leader adds keys, and it asks ``is_leader()`` right before every add, which
turns false by itself a renew deadline after the last successful renewal.

Resyncs (a ``PoolKey`` for every AppDefinition named by an AppDefinition, a Session or a pool
object's owner reference, from the caches): once every watch has its first list and this
process leads (startup, and every new leadership), then every ``resync_period``, and at once
when Redis lost its data: an epoch thread reads the Redis epoch every ``epoch_period``
(``warmpool.queue.epoch``; every replica re-creates a missing one, only the leader resyncs).

Nothing here waits for a time (issue #29): a PoolSchedule's edges are its pool's job's
``requeue_after``, a Session's deadlines its ``timeout/`` key's, a URL probe's attempts its
``probe/`` key's; the resync re-adds those keys (through the pool's job) after Redis lost them.
PoolSchedule events map to their pool's key like any other event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from scheduler import mapping
from scheduler.leader import LeaderConfig, LeaderElector, call_timeout
from warmpool.keys import Key, PoolKey, SweepKey
from warmpool.kube.api import Kube
from warmpool.kube.cache import ANY_OBJECT
from warmpool.kube.observe import POOL_WATCHES
from warmpool.kube.reflector import Backoff, Handler, Reflector, Watched, rv_int
from warmpool.pool import vocabulary as v
from warmpool.pool.meta import name_of, namespace_of, owner_refs, resource_version_of
from warmpool.pool.parts import POOL_KIND_NAMES
from warmpool.queue.epoch import Epoch
from warmpool.queue.scripts import UNTRIGGERED as QUEUE_UNTRIGGERED

log = logging.getLogger(__name__)

WATCHED: tuple[Watched, ...] = (
    Watched(v.APPDEF_KIND, v.APPDEF_API_VERSION),
    Watched(v.SESSION_KIND, v.SESSION_API_VERSION),
    *POOL_WATCHES,
)
#: Watched too with `SchedulerConfig.schedules` (the PoolSchedule CRD must exist).
SCHEDULES = Watched(v.SCHEDULE_KIND, v.SCHEDULE_API_VERSION)
#: Watched too where Session routes are in use (the HTTPRoute CRD must exist).
ROUTES = Watched(v.ROUTE_KIND, v.ROUTE_API_VERSION)
#: Watched instead in upstream's mode (PoolSettings.ingress).
INGRESSES = Watched("Ingress", "networking.k8s.io/v1")


def _unset_handler(event_type: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """A reflector's handler until `Scheduler._handler` replaces it (it needs the reflector)."""
    raise AssertionError("the scheduler's reflector was started before its handler was set")


def _kept_digest(reflector: Reflector, event_type: str, obj: dict[str, Any]) -> str | None:
    """The digest of the stub `reflector` has just kept for this event's `obj`, if it is that
    version's: a status-only change is told by it (`mapping.changed`) without hashing the
    object a second time. The JSON of a Deployment's spec, for each of the deployment
    controller's status writes, was a tenth of the scheduler's CPU under churn (issue #28)."""
    if event_type != mapping.MODIFIED:
        return None
    stub = reflector.get(namespace_of(obj), name_of(obj))
    if stub is None or resource_version_of(stub) != resource_version_of(obj):
        return None
    kept = stub.get("digest")
    return kept if isinstance(kept, str) else None


class Producer(Protocol):
    """What the scheduler needs of the queue (``KeyedQueue`` is one)."""

    def add_many(self, keys: Iterable[str | tuple[str, Mapping[str, str]]]) -> Any:
        """Add keys, each a key string or (key, triggers)."""


#: The periodic resync is the backstop for losses the epoch cannot see (a key evicted alone, a
#: failover that dropped only the last writes): a release whose key was lost waits for it. From
#: the caches, one pool key per AppDefinition, whose job decides each instance on the worker's
#: cache and queues only those with work: a quiet pool costs one run a minute.
RESYNC_PERIOD = 60.0


@dataclass
class SchedulerConfig:
    namespaces: Sequence[str] | None = None  # None: all namespaces
    resync_period: float = RESYNC_PERIOD
    epoch_period: float = 2.0  # how often the Redis epoch is read (with an `epoch` given)
    watch_timeout: tuple[float, float] = (300.0, 600.0)
    leader: LeaderConfig | None = None  # None: no election, always leading
    routes: bool = False  # watch HTTPRoutes (PoolSettings.routing)
    ingresses: bool = False  # watch Ingresses (PoolSettings.ingress)
    # PoolSchedules watched: their events queue their pool (the PoolSchedule CRD must exist).
    schedules: bool = True


@dataclass
class SchedulerStats:
    offered: int = 0
    dropped_not_leader: int = 0
    enqueued: int = 0
    enqueue_errors: int = 0
    resyncs: int = 0
    last_resync: float | None = None
    last_resync_reason: str | None = None
    leaderships: int = 0
    became_leader_at: float | None = None
    redis_losses: int = 0  # epochs found missing or replaced
    epoch_errors: int = 0  # epoch reads that failed (Redis unreachable)


class Scheduler:
    def __init__(
        self,
        kube_factory: Callable[[], Kube],
        producer: Producer,
        config: SchedulerConfig,
        epoch: Epoch | None = None,
    ) -> None:
        self.config = config
        self.producer = producer
        self.epoch = epoch  # None: no loss detection (tests without Redis)
        self.stats = SchedulerStats()
        self._stop = threading.Event()
        self._lock = threading.Condition()
        self._pending: dict[str, tuple[Key, dict[str, str]]] = {}
        self._resync_due = True
        self._resync_reason = "startup"
        self._wake_resync = threading.Event()
        self._threads: list[threading.Thread] = []
        self._stopped = False
        # For metrics: events handled by (kind, type) and resyncs by reason.
        self._counts_lock = threading.Lock()
        self._events: dict[tuple[str, str], int] = {}
        self._resyncs: dict[str, int] = {}

        namespaces: list[str | None] = list(config.namespaces) if config.namespaces else [None]
        self.reflectors: list[Reflector] = []
        self._sessions: list[Reflector] = []
        self._appdefs: list[Reflector] = []
        for ns in namespaces:
            kube = kube_factory()  # one client per namespace: its watches hold connections
            for watched in (*WATCHED, *((ROUTES,) if config.routes else ()),
                            *((INGRESSES,) if config.ingresses else ()),
                            *((SCHEDULES,) if config.schedules else ())):
                r = Reflector(kube, watched, ns, _unset_handler, summarize=mapping.summarize,
                              timeout_range=config.watch_timeout, backoff=Backoff())
                r.handler = self._handler(r)
                self.reflectors.append(r)
                if watched.kind == v.SESSION_KIND:
                    self._sessions.append(r)
                if watched.kind == v.APPDEF_KIND:
                    self._appdefs.append(r)
        self.elector: LeaderElector | None = None
        if config.leader is not None:
            # Its calls bounded so that a stalled attempt ends within the renew deadline.
            self.elector = LeaderElector(kube_factory().bounded(call_timeout(config.leader)),
                                         config.leader,
                                         on_started=self._started_leading,
                                         on_stopped=self._stopped_leading)

    # --- state ------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        return self.elector.is_leader() if self.elector is not None else True

    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.reflectors)

    def healthy(self) -> bool:
        """Every thread runs and no watch hangs past its timeout."""
        return (bool(self._threads) and all(t.is_alive() for t in self._threads)
                and not any(r.stuck() for r in self.reflectors))

    def ready(self) -> bool:
        return self.synced()

    def status(self) -> dict[str, Any]:
        e = self.elector
        return {
            "healthy": self.healthy(),
            "ready": self.ready(),
            "leader": self.is_leader(),
            "identity": e.identity if e else None,
            "holder": e.observed_holder() if e else None,
            "leader_error": e.last_error if e else None,
            "stats": dict(self.stats.__dict__),
            "watches": {r.name: {"synced": r.synced.is_set(), "alive": r.alive(),
                                 "stuck": r.stuck(),
                                 "objects": len(r.cache), "resourceVersion": r.last_rv,
                                 **r.stats.__dict__} for r in self.reflectors},
        }

    def event_counts(self) -> dict[tuple[str, str], int]:
        """Events handled so far by (object kind, event type)."""
        with self._counts_lock:
            return dict(self._events)

    def resync_counts(self) -> dict[str, int]:
        """Resyncs so far by reason."""
        with self._counts_lock:
            return dict(self._resyncs)

    def reflector(self, kind: str, namespace: str | None = None) -> Reflector:
        for r in self.reflectors:
            if r.watched.kind == kind and (namespace is None or r.namespace in (namespace, None)):
                return r
        raise KeyError((kind, namespace))

    # --- events -> keys ---------------------------------------------------------------------

    def _session_appdef(self, namespace: str, name: str) -> str | None:
        for r in self._sessions:
            if r.namespace in (None, namespace):
                stub = r.get(namespace, name)
                if stub is not None:
                    return mapping.session_appdef(stub)
        return None

    def _routed_by(self, namespace: str, route: str) -> list[str]:
        """The AppDefinitions of `namespace` whose spec.ingressname is `route`."""
        return sorted(str(stub["metadata"]["name"]) for r in self._appdefs
                      if r.namespace in (None, namespace) for stub in r.items()
                      if namespace_of(stub) == namespace
                      and (stub.get("spec") or {}).get("ingressname") == route)

    def _handler(self, reflector: Reflector) -> Handler:
        kind = reflector.watched.kind

        def handle(event_type: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
            with self._counts_lock:
                self._events[(kind, event_type)] = self._events.get((kind, event_type), 0) + 1
            keys = mapping.keys_for(kind, event_type, obj, old,
                                    session_appdef_of=self._session_appdef,
                                    routed_by=self._routed_by,
                                    kept_digest=_kept_digest(reflector, event_type, obj))
            if log.isEnabledFor(logging.DEBUG):
                meta = obj.get("metadata") or {}
                log.debug("%s %s %s/%s -> %s", event_type, kind, meta.get("namespace"),
                          meta.get("name"), [str(k) for k in keys])
            if keys:
                self.offer(keys, mapping.trigger(kind, event_type, obj))
        return handle

    def offer(self, keys: Iterable[Key], trigger: Mapping[str, str] | None = None) -> None:
        """Queue keys for the dispatcher if leading; a standby drops them (it resyncs on
        taking over). `trigger`: the version of the object whose event caused them, which
        their jobs must see before deciding (merged per key until dispatched)."""
        keys = list(keys)
        if not keys:
            return
        if not self.is_leader():
            self.stats.dropped_not_leader += len(keys)
            return
        with self._lock:
            for k in keys:
                _, triggers = self._pending.setdefault(str(k), (k, {}))
                # No trigger (a resync): the job must run in full, whatever its triggers.
                mapping.merge_triggers(triggers, trigger or {UNTRIGGERED: ""})
            self.stats.offered += len(keys)
            self._lock.notify()

    def pool_keys(self) -> list[PoolKey]:
        """A PoolKey for every AppDefinition the caches know of (by object or by reference)."""
        found: set[PoolKey] = set()
        for r in self.reflectors:
            for stub in r.items():
                ns = namespace_of(stub)
                if ns:
                    found |= {PoolKey(ns, n) for n in mapping.appdef_names(r.watched.kind, stub)}
        return sorted(found, key=str)

    def resync(self, reason: str) -> list[PoolKey]:
        keys = self.pool_keys()
        log.info("resync (%s): %d pools", reason, len(keys))
        seen: dict[str, dict[str, str]] = {}
        for k in keys:
            if k.namespace not in seen:
                seen[k.namespace] = self.seen_versions(k.namespace)
            self.offer([k], {UNTRIGGERED: "", **seen[k.namespace]})
        # The backstop for a pool object nothing owns, whose event was missed (a scheduler
        # restarted, Redis lost the key): no pool's job looks at it. A stub keeps only the
        # AppDefinition and Session references, so one with a foreign owner is named too
        # (the sweep reads the object itself and leaves it).
        for ns in sorted({ns for r in self.reflectors if r.watched.kind in POOL_KIND_NAMES
                          for stub in r.items()
                          if not owner_refs(stub) and (ns := namespace_of(stub))}):
            if ns not in seen:
                seen[ns] = self.seen_versions(ns)
            self.offer([SweepKey(ns)], {UNTRIGGERED: "", **seen[ns]})
        self.stats.resyncs += 1
        with self._counts_lock:
            self._resyncs[reason] = self._resyncs.get(reason, 0) + 1
        self.stats.last_resync = time.time()
        self.stats.last_resync_reason = reason
        return keys

    def seen_versions(self, namespace: str) -> dict[str, str]:
        """Per kind watched in `namespace`, the newest resourceVersion among the objects
        this scheduler holds, as `"<Kind>/*"` triggers (`ClusterCache.fresh`).

        A resync key carries them, so the worker that runs it decides on a cache at least as
        new as what this resync saw. Without them a worker whose watch is behind (in its
        backoff after a flaky API server) would conclude, from a cache without a Session
        the scheduler already knows, that the pool has no work, and nothing would run that
        Session until the next resync (the chaos long tier, seed 26). The objects' own
        versions, not the watch's: a bookmark may move a watch on, and a worker whose watch
        got no bookmark yet would wait for one."""
        out: dict[str, str] = {}
        for r in self.reflectors:
            if r.namespace not in (None, namespace):
                continue
            newest = max((rv_int(o) for o in r.items() if namespace_of(o) == namespace),
                         default=0)
            if newest:
                mapping.merge_triggers(out, {f"{r.watched.kind}/{ANY_OBJECT}": str(newest)})
        return out

    def request_resync(self, reason: str) -> None:
        self._resync_due, self._resync_reason = True, reason
        self._wake_resync.set()

    def check_epoch(self) -> bool:
        """Read the Redis epoch (re-creating a missing one); if Redis lost its data, resync
        now: every waiting key, lease and record is gone, and nothing else would re-add the
        pools' keys before the next periodic resync. True if it was lost."""
        if self.epoch is None:
            return False
        try:
            check = self.epoch.check()
        except Exception as exc:
            self.stats.epoch_errors += 1
            log.warning("reading the Redis epoch failed: %s", exc)
            return False
        if check.lost:
            self.stats.redis_losses += 1
            log.warning("Redis lost its data (epoch %s -> %s): resyncing every pool now",
                        check.previous, check.current)
            self.request_resync(REDIS_LOST)
        return check.lost

    def _epoch_loop(self) -> None:
        while not self._stop.is_set():
            self.check_epoch()
            self._stop.wait(self.config.epoch_period)

    # --- leadership callbacks ---------------------------------------------------------------

    def _started_leading(self) -> None:
        self.stats.leaderships += 1
        self.stats.became_leader_at = time.time()
        self.request_resync("new leader")

    def _stopped_leading(self) -> None:
        with self._lock:
            self.stats.dropped_not_leader += len(self._pending)
            self._pending.clear()
        log.warning("no longer leading: not adding keys")

    # --- threads ----------------------------------------------------------------------------

    def _dispatch_loop(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
            with self._lock:
                if not self._pending:
                    self._lock.wait(0.5)
                batch = list(self._pending.values())
                self._pending.clear()
            if not batch:
                continue
            if not self.is_leader():
                self.stats.dropped_not_leader += len(batch)
                continue
            try:
                self.producer.add_many(_items(batch))
            except Exception as exc:
                self.stats.enqueue_errors += 1
                delay = backoff.next()
                log.warning("adding %d keys failed (%s); retrying in %.1fs", len(batch), exc,
                            delay)
                with self._lock:  # put them back in front, keeping later adds after them
                    later = self._pending
                    self._pending = {str(k): (k, dict(t)) for k, t in batch}
                    for name, (k, t) in later.items():
                        _, merged = self._pending.setdefault(name, (k, {}))
                        mapping.merge_triggers(merged, t)
                self._stop.wait(delay)
                continue
            self.stats.enqueued += len(batch)

    def _resync_loop(self) -> None:
        period = self.config.resync_period
        next_periodic = time.monotonic() + period
        while not self._stop.is_set():
            self._wake_resync.wait(max(0.0, min(next_periodic - time.monotonic(), 1.0)))
            self._wake_resync.clear()
            if self._stop.is_set():
                break
            if time.monotonic() >= next_periodic:
                next_periodic = time.monotonic() + period
                if not self._resync_due:
                    self._resync_due, self._resync_reason = True, "periodic"
            if self._resync_due and self.synced() and self.is_leader():
                self._resync_due = False
                self.resync(self._resync_reason)
                next_periodic = time.monotonic() + period

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def start(self) -> Scheduler:
        for r in self.reflectors:
            self._threads.append(r.start(self._stop))
        if self.elector is not None:
            elector = self.elector
            self._spawn(lambda: elector.run(self._stop), "leader-elector")
        self._spawn(self._dispatch_loop, "dispatcher")
        self._spawn(self._resync_loop, "resync")
        if self.epoch is not None:
            self._spawn(self._epoch_loop, "epoch")
        for r in self.reflectors:  # a resync waits for these; wake it when they are done
            threading.Thread(target=self._wake_when_synced, args=(r,), daemon=True).start()
        return self

    def _wake_when_synced(self, r: Reflector) -> None:
        while not self._stop.is_set():
            if r.synced.wait(0.5):
                self._wake_resync.set()
                return

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(r.synced.wait(max(0.0, deadline - time.monotonic())) for r in self.reflectors)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop adding keys at once, release the Lease, stop the threads (watch threads that
        are blocked reading a quiet watch are daemons: they end with the process)."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        self._wake_resync.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            if t.name.startswith("reflector-"):
                continue
            t.join(max(0.0, deadline - time.monotonic()))
        if self.elector is not None and self.elector.is_leader():
            self.elector.release()  # the elector thread did not get to it in time


#: The resync reason after the epoch showed Redis lost its data (label `redis_lost`).
REDIS_LOST = "redis lost"

#: Pending-entry marker for "added without a trigger too" (never sent as a trigger field).
UNTRIGGERED = "*untriggered"


def _items(
    batch: Iterable[tuple[Key, dict[str, str]]],
) -> Iterator[str | tuple[str, dict[str, str]]]:
    """The queue's add items for pending entries, one per key: (key, triggers), with the
    queue's own "run in full" trigger among them where an untriggered add (a resync) was
    merged in, so that run is never skipped as the key's own writes; a bare key when there
    are no versions to wait for."""
    for k, triggers in batch:
        fields = {f: val for f, val in triggers.items() if f != UNTRIGGERED}
        if not fields:
            yield str(k)
        elif UNTRIGGERED in triggers:
            yield str(k), {**fields, QUEUE_UNTRIGGERED: "1"}
        else:
            yield str(k), fields


def _timeless(status: Mapping[str, Any]) -> dict[str, Any]:
    """`status` without its conditions' lastTransitionTime: the verdict alone."""
    out = dict(status)
    conds = out.get("conditions")
    if isinstance(conds, list):
        out["conditions"] = [{k: val for k, val in c.items() if k != "lastTransitionTime"}
                             for c in conds if isinstance(c, Mapping)]
    return out
