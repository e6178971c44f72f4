"""Issue #28: what the cache keeps derived for a claim (each AppDefinition's Sessions as a
tuple, each instance's combined pod warmth, the pool's sets remembered per change) answers
exactly as a computation from scratch would, after every event of a seeded random sequence
of pool objects, pods and Sessions coming, changing and going."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

import pytest

from tests.unit.pool_fixtures import SETTINGS, appdef
from tests.unit.pool_fixtures import session as model_session
from warmpool.kube.cache import ClusterCache
from warmpool.kube.observe import group_pool
from warmpool.kube.reader import CachedReader, _name_rests
from warmpool.pool import builders
from warmpool.pool import vocabulary as v
from warmpool.pool.claim import PoolFacts, pool_facts
from warmpool.pool.instances import is_session_ref, refs
from warmpool.pool.meta import uid_of
from warmpool.pool.model import AppDefinition, Session, parse_session
from warmpool.pool.parts import PARTS, Part
from warmpool.pool.pods import combine, warmth_by_instance
from warmpool.testing.world import session_body, session_spec

NS = "ns1"
#: Ids from 1 to 12 cross a digit boundary, where the long name below is cut differently.
IDS = range(1, 13)
SESSION_NAMES = [f"s{i}" for i in range(8)]
TIMES = ["2026-01-01T00:00:01Z", "2026-01-01T00:00:02Z", "2026-01-01T00:00:03Z"]


class World:
    """A cache fed by hand (no watch started), and the versions it is fed at."""

    def __init__(self, a: AppDefinition) -> None:
        self.a = a
        self.cache = ClusterCache(lambda: None, [NS])  # type: ignore[arg-type,return-value]
        self.reader = CachedReader(self.cache, None, server_clock=object())  # type: ignore[arg-type]
        self.rv = 1000

    def put(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        meta = {**obj["metadata"], "namespace": NS, "resourceVersion": str(self.rv)}
        self.cache.offer({**obj, "metadata": meta})

    def drop(self, kind: str, name: str) -> None:
        cached = self.cache.get(kind, NS, name)
        if cached is not None:
            self.cache.offer_gone(kind, NS, name, uid_of(cached))


def _holder(rng: random.Random) -> Session | None:
    if rng.random() < 0.8:
        return None
    return dataclasses.replace(model_session(rng.choice(SESSION_NAMES)), namespace=NS)


def _pool_event(w: World, rng: random.Random) -> None:
    k, part = rng.choice(IDS), rng.choice(PARTS)
    if rng.random() < 0.1:
        w.drop(part.kind, builders.object_name(w.a, part, k))
        return
    obj = builders.build(part, w.a, k, holder=_holder(rng), proxy_template=None,
                         settings=SETTINGS)
    w.put({**obj, "kind": part.kind,
           "metadata": {**obj["metadata"], "uid": f"u-{part.name}-{k}"}})


def _pod_event(w: World, rng: random.Random) -> None:
    k = rng.choice(IDS)
    deployment = builders.object_name(w.a, Part.DEPLOYMENT, k)
    name = f"{deployment}-h-{rng.randrange(2)}"
    if rng.random() < 0.25:
        w.drop("Pod", name)
        return
    meta: dict[str, Any] = {
        "name": name, "uid": f"pod-{name}",
        "labels": {v.LABEL_APP: f"app-{k}", "pod-template-hash": "h", v.LABEL_GENERATION: "1"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": f"{deployment}-h", "uid": "rs",
                             "controller": True}]}
    if rng.random() < 0.2:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    waiting = rng.choice(["", "", "ImagePullBackOff", "CrashLoopBackOff"])
    state = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    w.put({"kind": "Pod", "apiVersion": "v1", "metadata": meta, "status": {
        "conditions": [{"type": "Ready", "status": rng.choice(["True", "False"])}],
        "containerStatuses": [{"name": "c", "state": state}]}})


def _session_event(w: World, rng: random.Random) -> None:
    name = rng.choice(SESSION_NAMES)
    if rng.random() < 0.25:
        w.drop(v.SESSION_KIND, name)
        return
    meta: dict[str, Any] = {"uid": f"uid-{name}", "creationTimestamp": rng.choice(TIMES)}
    if rng.random() < 0.2:
        meta["deletionTimestamp"] = "2026-01-01T00:00:09Z"
    body = session_body(NS, name, session_spec(name, "jane@example.com",
                                               rng.choice(["java", "other"]), workspace=None),
                        metadata=meta)
    w.put({**body, "kind": v.SESSION_KIND})


def _check_sessions(w: World) -> None:
    """`sessions_of` is every cached Session of the AppDefinition, in claim order, as a new
    list each time (changing it changes nothing the cache hands out next)."""
    cached = [parse_session(o) for o in w.cache.items(v.SESSION_KIND, NS)]
    for name in ("java", "other", "none"):
        want = sorted((s for s in cached if s.appdef == name), key=lambda s: (s.created, s.name))
        got = w.cache.sessions_of(NS, name)
        assert got == want
        got.clear()
        assert w.cache.sessions_of(NS, name) == want


def _combined_per_read(
    cache: ClusterCache, names: Sequence[tuple[int | None, str]],
) -> dict[int, tuple[str, str]]:
    """`ClusterCache.pod_warmth` as it was computed before `_warmth` kept it: the oracle."""
    out: dict[int, tuple[str, str]] = {}
    for digits, rest in names:
        for k, pods in cache._pod_states.get((NS, rest), {}).items():
            if digits is None or len(str(k)) == digits:
                out[k] = combine(pods.values())
    return out


def _check_facts(w: World) -> PoolFacts:
    """`pool_facts` from the indexes (and the memo) is what grouping every cached object and
    pod into instances gives, for the pool's Sessions and for none."""
    a = w.a
    rests = _name_rests(a, Part.DEPLOYMENT)
    states = warmth_by_instance(w.cache.items("Pod", NS), rests)
    kept = w.cache.pod_warmth(NS, rests)
    # Combined as before the index kept it (per read, over the same pods in the same order:
    # of two failing pods, the first one's reason), and the same Warmth as from the pods.
    assert kept == _combined_per_read(w.cache, rests)
    assert {k: s[0] for k, s in kept.items()} == {k: s[0] for k, s in states.items()}
    for sessions in (w.cache.sessions_of(NS, a.name), []):
        views = group_pool(w.cache.pool_objects(NS), a.name, a, sessions)
        want = pool_facts(views)
        free = {k for k in want.clean if k <= a.min_instances}
        want = dataclasses.replace(
            want, warm={k for k in free if states.get(k, ("", ""))[0] == "warm"},
            failing={k for k in free if states.get(k, ("", ""))[0] == "failing"})
        uids = {s.uid for s in sessions}
        held = frozenset(k for k, view in views.items()
                         if any(is_session_ref(r) and r.get("uid") in uids
                                for r in refs(view.get(Part.EXTERNAL_SERVICE))))
        got = w.reader.pool_facts(NS, a.name, a, sessions)
        assert (got.existing, got.clean) == (want.existing, want.clean)
        assert (got.warm, got.failing) == (want.warm, want.failing)
        assert got.referenced == want.referenced & uids
        assert got.held == held
    return w.reader.pool_facts(NS, a.name, a, w.cache.sessions_of(NS, a.name))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_what_the_cache_keeps_derived_matches_a_computation_from_scratch(seed: int) -> None:
    rng = random.Random(seed)
    a = dataclasses.replace(appdef(min_instances=10, max_instances=14), namespace=NS,
                            spec_name="a-rather-long-application-definition")
    w = World(a)
    events = [_pool_event, _pod_event, _session_event]
    seen: set[str] = set()
    for _ in range(1000):
        rng.choice(events)(w, rng)
        _check_sessions(w)
        facts = _check_facts(w)
        seen |= {field for field in ("clean", "held", "warm", "failing")
                 if getattr(facts, field)}
    assert seen == {"clean", "held", "warm", "failing"}  # the sequence reached each case


def _ready_pod(w: World, k: int, ready: bool) -> None:
    deployment = builders.object_name(w.a, Part.DEPLOYMENT, k)
    name = f"{deployment}-h-0"
    w.put({"kind": "Pod", "apiVersion": "v1", "metadata": {
        "name": name, "uid": f"pod-{name}",
        "labels": {v.LABEL_APP: f"app-{k}", "pod-template-hash": "h", v.LABEL_GENERATION: "1"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": f"{deployment}-h", "uid": "rs",
                             "controller": True}]},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                   "containerStatuses": [{"name": "c", "state": {"running": {}}}]}})


def test_pool_sets_are_derived_again_only_after_a_change_of_what_they_read() -> None:
    """The memo of `ClusterCache.derived`: the same value while neither a mark nor an
    instance's warmth changed (a Session's event, a Deployment's or a pod's status write
    that changes neither: most of a pool's events), a new one after a change of either."""
    a = dataclasses.replace(appdef(min_instances=3), namespace=NS)
    w = World(a)
    calls: list[int] = []

    def compute() -> frozenset[int]:
        calls.append(1)
        return frozenset(w.cache.instance_marks(NS, "Service", _name_rests(a, Part.DEPLOYMENT)))

    def deployment(replicas: int) -> None:
        obj = builders.build(Part.DEPLOYMENT, a, 1, holder=None, proxy_template=None,
                             settings=SETTINGS)
        w.put({**obj, "kind": "Deployment", "status": {"readyReplicas": replicas},
               "metadata": {**obj["metadata"], "uid": "u-deployment-1"}})

    deployment(0)
    _ready_pod(w, 1, ready=False)
    first = w.cache.derived(NS, "key", compute)
    assert w.cache.derived(NS, "key", compute) is first and len(calls) == 1
    _session_event(w, random.Random(0))
    deployment(1)  # the deployment controller's status write: no mark changes
    _ready_pod(w, 1, ready=False)  # the kubelet's, still not Ready: the same warmth
    assert w.cache.derived(NS, "key", compute) is first and len(calls) == 1
    _ready_pod(w, 1, ready=True)  # now warm
    w.cache.derived(NS, "key", compute)
    assert len(calls) == 2
    w.cache.offer_gone("Pod", NS, f"{builders.object_name(a, Part.DEPLOYMENT, 1)}-h-0",
                       "pod-" + f"{builders.object_name(a, Part.DEPLOYMENT, 1)}-h-0")
    w.cache.derived(NS, "key", compute)
    assert len(calls) == 3  # its pod gone: starting again
    w.drop("Deployment", builders.object_name(a, Part.DEPLOYMENT, 1))  # a mark gone
    w.cache.derived(NS, "key", compute)
    assert len(calls) == 4
    assert w.cache.derived("elsewhere", "key", compute) is not None and len(calls) == 5
