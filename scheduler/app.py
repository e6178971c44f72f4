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

Scheduled pool sizes (PoolSchedules, ``warmpool.pool.schedule``): the leader's schedule loop
sleeps until the next instant any pool's target changes (over every schedule, recomputed
whenever a PoolSchedule or an AppDefinition event arrives), then offers that pool's
``PoolKey``, a ``schedule_margin`` after the edge so that a worker whose clock is a little
behind already sees the new target. Each pass writes every schedule's status
(``effectiveTarget``, ``nextChange``, ``message``) where it changed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from scheduler import mapping
from scheduler.leader import LeaderConfig, LeaderElector
from warmpool.controller.timeouts import TimeoutRunner, TimeoutSettings
from warmpool.keys import Key, PoolKey
from warmpool.kube.api import Kube, KubeError
from warmpool.kube.clock import ClockUnavailable
from warmpool.kube.observe import POOL_WATCHES
from warmpool.kube.reflector import Backoff, Reflector, Watched
from warmpool.pool import vocabulary as v
from warmpool.pool.meta import namespace_of
from warmpool.pool.model import AppDefinition, Invalid, parse_appdefinition
from warmpool.pool.schedule import (
    effective_target,
    next_change,
    schedule_status,
    valid_schedules,
)
from warmpool.queue.epoch import Epoch

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
    # Session timeouts (session-lifecycle §5), run by the leader every `interval`; None or
    # not enabled: none (the CLI passes TimeoutSettings.from_env(), on by default).
    timeouts: TimeoutSettings | None = None
    # PoolSchedules: watched, their boundaries acted on and their status written (leader).
    schedules: bool = True
    # How long after a schedule's edge its pool is queued (worker clocks a little behind).
    schedule_margin: float = 1.0
    # The longest the schedule loop sleeps without looking again (a clock that jumped).
    schedule_recheck: float = 60.0
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))


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
    timeout_passes: int = 0
    timeout_deletions: int = 0  # Sessions deleted for a timeout or inactivity
    timeout_errors: int = 0  # Sessions (or namespaces) a timeout pass failed on
    schedule_passes: int = 0
    schedule_offers: int = 0  # pools queued because a schedule's window opened or closed
    schedule_status_writes: int = 0
    schedule_errors: int = 0  # passes (or status writes) that failed
    next_schedule_change: str | None = None  # RFC 3339, over every schedule


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
        self._wake_schedules = threading.Event()
        # (namespace, AppDefinition) -> its target at the last schedule pass.
        self._targets: dict[tuple[str, str], int] = {}
        # (namespace, PoolSchedule, uid) -> the status last written to it.
        self._written: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._status_kube: Kube | None = None
        self._kube_factory = kube_factory
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
        self._schedules: list[Reflector] = []
        for ns in namespaces:
            kube = kube_factory()  # one client per namespace: its watches hold connections
            for watched in (*WATCHED, *((ROUTES,) if config.routes else ()),
                            *((INGRESSES,) if config.ingresses else ()),
                            *((SCHEDULES,) if config.schedules else ())):
                r = Reflector(kube, watched, ns, self._handler(watched.kind),
                              summarize=mapping.summarize,
                              timeout_range=config.watch_timeout, backoff=Backoff())
                self.reflectors.append(r)
                if watched.kind == v.SESSION_KIND:
                    self._sessions.append(r)
                if watched.kind == v.APPDEF_KIND:
                    self._appdefs.append(r)
                if watched.kind == v.SCHEDULE_KIND:
                    self._schedules.append(r)
        self.timeouts: TimeoutRunner | None = None
        if config.timeouts is not None and config.timeouts.enabled:
            self.timeouts = TimeoutRunner(kube_factory(), namespaces, config.timeouts,
                                          active=self.is_leader)
        self.elector: LeaderElector | None = None
        if config.leader is not None:
            self.elector = LeaderElector(kube_factory(), config.leader,
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

    def _handler(self, kind: str) -> Callable[[str, dict[str, Any], dict[str, Any] | None], None]:
        def handle(event_type: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
            with self._counts_lock:
                self._events[(kind, event_type)] = self._events.get((kind, event_type), 0) + 1
            if kind in (v.SCHEDULE_KIND, v.APPDEF_KIND):
                self._wake_schedules.set()  # the next edge may have moved
            keys = mapping.keys_for(kind, event_type, obj, old,
                                    session_appdef_of=self._session_appdef,
                                    routed_by=self._routed_by)
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
        self.offer(keys)
        self.stats.resyncs += 1
        with self._counts_lock:
            self._resyncs[reason] = self._resyncs.get(reason, 0) + 1
        self.stats.last_resync = time.time()
        self.stats.last_resync_reason = reason
        return keys

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

    # --- scheduled pool sizes ---------------------------------------------------------------

    def _stubs(self, reflectors: Sequence[Reflector]) -> dict[str, list[dict[str, Any]]]:
        """The cached stubs of these reflectors by namespace."""
        out: dict[str, list[dict[str, Any]]] = {}
        for r in reflectors:
            for stub in r.items():
                ns = namespace_of(stub)
                if ns:
                    out.setdefault(str(ns), []).append(stub)
        return out

    def schedule_pass(self, now: datetime | None = None) -> datetime | None:
        """Queue each pool whose target changed since the last pass, write each schedule's
        status where it changed, and return the next instant any target changes (None:
        none ahead). Leader only; from the watch caches, no read of the API server."""
        now = now or self.config.clock()
        appdefs = self._stubs(self._appdefs)
        earliest: datetime | None = None
        offers: list[Key] = []
        for ns, schedules in sorted(self._stubs(self._schedules).items()):
            by_name = {str(a["metadata"].get("name")): a for a in appdefs.get(ns, [])}
            for name in sorted({n for s in schedules
                                if (n := mapping.schedule_appdef(s)) is not None}):
                stub = by_name.get(name)
                appdef: AppDefinition | Invalid | None = (
                    None if stub is None else parse_appdefinition(stub))
                if isinstance(appdef, AppDefinition):
                    valid = valid_schedules(appdef, schedules)
                    target = effective_target(appdef, valid, now)
                    if self._targets.get((ns, name), target) != target:
                        offers.append(PoolKey(ns, name))
                    self._targets[(ns, name)] = target
                    edge = next_change(appdef, valid, now)
                    if edge is not None and (earliest is None or edge < earliest):
                        earliest = edge
                for obj in schedules:
                    if mapping.schedule_appdef(obj) == name:
                        self._write_status(ns, obj, schedule_status(obj, appdef, schedules, now))
        if offers:
            log.info("schedules: the target of %s changed", ", ".join(map(str, offers)))
            self.stats.schedule_offers += len(offers)
            self.offer(offers)
        self.stats.schedule_passes += 1
        self.stats.next_schedule_change = (None if earliest is None
                                           else earliest.strftime("%Y-%m-%dT%H:%M:%SZ"))
        return earliest

    def _write_status(self, ns: str, obj: Mapping[str, Any], status: dict[str, Any]) -> None:
        """Merge-patch the schedule's status, only where it differs from what the cache shows
        (or this process last wrote: its event may not be here yet)."""
        meta = obj.get("metadata") or {}
        name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
        shown = obj.get("status") or {}
        ident = (ns, name, uid)
        if (all(shown.get(k) == val for k, val in status.items())
                or self._written.get(ident) == status):
            return
        if self._status_kube is None:
            self._status_kube = self._kube_factory()
        # Safe on a stale read: the patch first tests the uid the status was computed for, so
        # a schedule re-created under the name since is not told its predecessor's target (a
        # 422; the next pass writes the new one's). The status is wholly ours, so it is set whole.
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "add", "path": "/status", "value": {**shown, **status}}]
        try:
            self._status_kube.json_patch(v.SCHEDULE_API_VERSION, v.SCHEDULE_KIND, ns, name, ops,
                                         status=True)
        except KubeError as exc:
            self.stats.schedule_errors += 1
            log.warning("PoolSchedule %s/%s: writing its status failed: %s", ns, name, exc)
            return
        self._written[ident] = status
        self.stats.schedule_status_writes += 1

    def _schedule_loop(self) -> None:
        """While leading: a pass, then sleep until the next edge (plus the margin), an event
        of a PoolSchedule or AppDefinition, or `schedule_recheck`, whichever comes first."""
        cfg = self.config
        while not self._stop.is_set():
            delay = cfg.schedule_recheck
            self._wake_schedules.clear()
            if self.synced() and self.is_leader():
                try:
                    edge = self.schedule_pass()
                except Exception:
                    self.stats.schedule_errors += 1
                    log.exception("schedule pass failed")
                else:
                    if edge is not None:
                        left = (edge - cfg.clock()).total_seconds() + cfg.schedule_margin
                        delay = min(delay, max(0.05, left))
            else:
                delay = min(delay, 0.5)  # not leading or not synced yet: look again soon
            self._wake_schedules.wait(delay)

    def _timeouts_loop(self) -> None:
        """A timeout pass every interval while leading (the first one interval after start,
        as Java's); a pass that raises is logged and the next one runs on schedule."""
        runner = self.timeouts
        assert runner is not None
        while not self._stop.wait(runner.settings.interval):
            if not self.is_leader():
                continue
            try:
                report = runner.run_once()
            except ClockUnavailable as exc:  # no cluster time, no decision: try next interval
                self.stats.timeout_errors += 1
                log.warning("timeout pass skipped: %s", exc)
                continue
            except Exception:
                self.stats.timeout_errors += 1
                log.exception("timeout pass failed")
                continue
            self.stats.timeout_passes += 1
            self.stats.timeout_deletions += len(report.deleted)
            self.stats.timeout_errors += len(report.errors)

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
        if self.timeouts is not None:
            self._spawn(self._timeouts_loop, "timeouts")
        if self.config.schedules:
            self._spawn(self._schedule_loop, "schedules")
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
        self._wake_schedules.set()
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
    """The queue's add items for pending entries: (key, triggers), and the bare key as well
    where an untriggered add was merged in, so the queue records both."""
    for k, triggers in batch:
        fields = {f: val for f, val in triggers.items() if f != UNTRIGGERED}
        if fields:
            yield str(k), fields
        if UNTRIGGERED in triggers or not fields:
            yield str(k)

