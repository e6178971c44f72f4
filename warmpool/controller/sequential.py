"""Run the pool's jobs one at a time in this thread until nothing changes.

This is the Java operator's execution model (one thread, no queue) on warmpool's reconcile
logic. It exists for two callers: tests of the pool core that must not depend on the queue, and
the convergence benchmark, where it is the baseline the scaled-out workers are measured against.
"""

from __future__ import annotations

import logging
from collections import Counter, deque

from warmpool.controller.guard import LocalLeases
from warmpool.controller.reconcile import claim_session, reconcile_instance, resync_pool
from warmpool.controller.result import Outcome, Result
from warmpool.keys import InstanceKey, Key, PoolKey, SessionKey
from warmpool.kube.api import Kube
from warmpool.kube.executor import FenceRegression
from warmpool.kube.reader import Clock, LiveReader
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings
from warmpool.pool.parts import POOL_KINDS

log = logging.getLogger(__name__)


def pool_keys(kube: Kube, namespace: str) -> list[PoolKey]:
    """One key per AppDefinition named by an AppDefinition or by a Session."""
    appdefs, _ = kube.list(v.APPDEF_API_VERSION, v.APPDEF_KIND, namespace)
    sessions, _ = kube.list(v.SESSION_API_VERSION, v.SESSION_KIND, namespace)
    names = {a["metadata"]["name"] for a in appdefs}
    names |= {(s.get("spec") or {}).get("appDefinition") for s in sessions} - {None, ""}
    return [PoolKey(namespace, n) for n in sorted(names)]


def _fingerprint(
    kube: Kube, namespace: str, routes: bool = False
) -> frozenset[tuple[str, str, str]]:
    seen = set()
    kinds = [*POOL_KINDS, (v.SESSION_API_VERSION, v.SESSION_KIND)]
    if routes:
        kinds.append((v.ROUTE_API_VERSION, v.ROUTE_KIND))
    for api_version, kind in kinds:
        items, _ = kube.list(api_version, kind, namespace)
        seen |= {(kind, i["metadata"]["name"], i["metadata"]["resourceVersion"]) for i in items}
    return frozenset(seen)


def run_until_quiet(
    kube: Kube, namespace: str, settings: PoolSettings | None = None, max_rounds: int = 20,
    *, clock: Clock | None = None,
) -> int:
    """Resync every pool and run every job, round after round, until a round changes nothing.

    `clock`: what time the PoolSchedules are read at (a test fixes it to a window's edge;
    None: the API server's clock).

    Returns the number of rounds. Raises RuntimeError if the namespace never settles, which in
    a test means a reconcile that keeps rewriting what it wrote (a level-triggering bug).
    """
    settings = settings or PoolSettings()
    leases = LocalLeases()
    # the Java operator's model: every read asks the API server
    reader = LiveReader(kube, max_instances_ceiling=settings.max_instances_ceiling,
                        routes=settings.routing, clock=clock)
    before = _fingerprint(kube, namespace, settings.routing)
    for round_no in range(1, max_rounds + 1):
        queue: deque[Key] = deque(pool_keys(kube, namespace))
        done: set[Key] = set()
        fenced: Counter[Key] = Counter()
        while queue:
            key = queue.popleft()
            if key in done:
                continue
            done.add(key)
            try:
                result: Result
                match key:
                    case PoolKey():
                        result = resync_pool(reader, kube, key, settings, every_instance=True)
                    case InstanceKey():
                        with leases.try_lease(str(key)) as guard:
                            assert guard is not None
                            result = reconcile_instance(reader, kube, key, guard, settings)
                    case SessionKey():
                        result = claim_session(reader, kube, key, leases, settings,
                                               hand_on=False)
                    case _:
                        raise TypeError(f"no job for {key}")
                if result.outcome is Outcome.DEFERRED:
                    # single-threaded: nothing else can hold a lease. (A `requeue_after`
                    # alone is a timer, a schedule's next edge: the caller moves the clock.)
                    raise RuntimeError(f"{key} deferred in a sequential run: {result.message}")
                queue.extend(k for k, _ in result.follow_ups)
            except FenceRegression:
                # Written under a higher fence than ours (a worker's, or an earlier run's):
                # the abort lifted the counter, so the key's next lease is above it.
                if fenced[key] >= 1:
                    raise
                fenced[key] += 1
                done.discard(key)
                queue.appendleft(key)
        after = _fingerprint(kube, namespace, settings.routing)
        if after == before:
            return round_no
        before = after
    raise RuntimeError(f"namespace {namespace} did not settle in {max_rounds} rounds")
