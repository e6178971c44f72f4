"""Jobs that read from a worker's watch-fed cache, on the real control plane.

The cache may be behind the API server; these tests freeze it on purpose (a stopped cache
applies no more events) and check that a decision taken on what it holds is refused by the
server instead of applied, and that a claim read from it makes no read request at all.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from tests.pool_world import assert_invariants, instance_objects
from tests.waiting import wait_for
from warmpool.controller.guard import LocalLeases
from warmpool.controller.reconcile import claim_session, reconcile_instance
from warmpool.controller.result import Result
from warmpool.controller.sequential import run_until_quiet
from warmpool.keys import InstanceKey, SessionKey
from warmpool.kube.api import Kube
from warmpool.kube.cache import ClusterCache
from warmpool.kube.reader import CachedReader
from warmpool.pool import builders, naming
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings
from warmpool.pool.model import parse_appdefinition, parse_session
from warmpool.pool.parts import PARTS, Part
from warmpool.testing.world import USERS, create_appdef, create_session, patch_appdef_spec


class CountingKube(Kube):
    """Counts the requests the controller makes, by verb."""

    def __init__(self, api_client: Any) -> None:
        super().__init__(api_client)
        self.calls: Counter[str] = Counter()
        self._count_lock = threading.Lock()

    def _n(self, verb: str) -> None:
        with self._count_lock:
            self.calls[verb] += 1

    def get(self, *a: Any, **kw: Any) -> Any:
        self._n("get")
        return super().get(*a, **kw)

    def list(self, *a: Any, **kw: Any) -> Any:
        # Where the API server answers from (`Kube.list`): etcd without a resourceVersion.
        self._n(f"list {a[1]}" + ("" if kw.get("resource_version") is None else " (cached)"))
        return super().list(*a, **kw)

    def create(self, *a: Any, **kw: Any) -> Any:
        self._n("create")
        return super().create(*a, **kw)

    def merge_patch(self, *a: Any, **kw: Any) -> Any:
        self._n("patch")
        return super().merge_patch(*a, **kw)

    def delete(self, *a: Any, **kw: Any) -> Any:
        self._n("delete")
        return super().delete(*a, **kw)


def _appdef(kube: Kube, ns: str):
    parsed = parse_appdefinition(kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java"))
    assert not isinstance(parsed, str)
    return parsed


def _claim_behind_the_caches_back(kube: Kube, ns: str, k: int, session: dict[str, Any]) -> None:
    """What a claim's deciding write does to instance k (and nothing more: its job died): the
    Session's reference and labels on the external Service, in one patch."""
    appdef = _appdef(kube, ns)
    name = builders.object_name(appdef, Part.EXTERNAL_SERVICE, k)
    ext = kube.get("v1", "Service", ns, name)
    assert ext is not None
    meta = session["metadata"]
    ref = {"apiVersion": v.SESSION_API_VERSION, "kind": v.SESSION_KIND,
           "name": meta["name"], "uid": meta["uid"]}
    kube.merge_patch("v1", "Service", ns, name, {"metadata": {
        "ownerReferences": [*ext["metadata"]["ownerReferences"], ref],
        "labels": builders.session_labels(appdef, parse_session(session))}},
        resource_version=ext["metadata"]["resourceVersion"])


def _pool_with_a_session_seen(kube: Kube, ns: str, cache: ClusterCache, min_instances: int,
                              objects: int = 15) -> dict[str, Any]:
    """A converged pool and a new Session s1, both as the cache has them; returns s1."""
    create_appdef(kube, ns, min_instances=min_instances)
    run_until_quiet(kube, ns)
    created = create_session(kube, ns, "s1", USERS[1])
    assert cache.wait_fresh(ns, {f"{v.SESSION_KIND}/s1": created["metadata"]["resourceVersion"]},
                            30)
    _wait_caught_up(kube, ns, cache, objects=objects)
    return created


def _wait_caught_up(kube: Kube, ns: str, cache: ClusterCache, objects: int = 15) -> None:
    """Until the cache holds every pool object of `ns` at the server's current version."""
    def caught_up() -> bool:
        for api_version, kind in (("v1", "Service"), ("apps/v1", "Deployment"),
                                  ("v1", "ConfigMap")):
            items, _ = kube.list(api_version, kind, ns, label_selector=v.LABEL_GENERATION)
            for item in items:
                meta = item["metadata"]
                cached = cache.get(kind, ns, meta["name"])
                if cached is None or (cached["metadata"]["resourceVersion"]
                                      != meta["resourceVersion"]):
                    return False
        return len(cache.pool_objects(ns)) == objects
    wait_for(caught_up, timeout=30, message="the cache to hold the pool as the server has it")


def _uids(kube: Kube, ns: str, k: int) -> dict[str, str]:
    """Instance k's objects by name: their uids (a deleted and recreated object changes it)."""
    return {name: obj["metadata"]["uid"]
            for name, obj in instance_objects(kube, ns, "java", k).items()}


def _reconcile_from_cache(cache: ClusterCache, kube: Kube, ns: str, k: int) -> Result:
    """Instance k's job, once, reading from `cache`, under a lease above every fence written
    so far; its Result."""
    key = InstanceKey(ns, "java", k)
    with LocalLeases().try_lease(str(key)) as guard:
        assert guard is not None
        return reconcile_instance(CachedReader(cache, kube), kube, key, guard, PoolSettings())


def test_a_scale_down_decided_on_a_stale_cache_deletes_nothing_of_a_claimed_instance(
    kube: Kube, namespace: str, cache: ClusterCache
) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=3)
    run_until_quiet(kube, ns)
    _wait_caught_up(kube, ns, cache)
    cache.stop()  # frozen from here: it never sees the claim below
    session = create_session(kube, ns, "s1", USERS[1])
    _claim_behind_the_caches_back(kube, ns, 3, session)
    uids = _uids(kube, ns, 3)
    # The AppDefinition watch is current (the scale-down is what caused the job), the
    # Service watch is behind: it still shows instance 3 free.
    cache.offer(patch_appdef_spec(kube, ns, "java", minInstances=1))

    result = _reconcile_from_cache(cache, kube, ns, 3)

    assert result.record.attempts >= 2, "the stale decision must have been refused once"
    assert result.record.plan.state == "claimed"
    # Not one object of the claimed instance was deleted (and recreated): the holder keeps
    # its pod and its allow-list.
    after = _uids(kube, ns, 3)
    assert after == uids
    run_until_quiet(kube, ns)
    assert_invariants(kube, ns)


def test_a_retirement_decided_on_a_cache_without_the_services_deletes_nothing_of_a_claim(
    kube: Kube, namespace: str, cache: ClusterCache
) -> None:
    """The cache's watches lag each other: it holds instance 1's ConfigMaps as the claim left
    them, but neither its Services nor its Deployment, nor the Session's annotation, nor the
    AppDefinition's new minInstances. Nothing there says the instance is held; the server does.
    """
    ns = namespace
    _pool_with_a_session_seen(kube, ns, cache, min_instances=1, objects=5)
    cache.stop()  # frozen: s1 unannotated, instance 1 free at generation 1
    run_until_quiet(kube, ns)  # the claim, decided and completed on the server
    appdef = _appdef(kube, ns)
    objects = instance_objects(kube, ns, "java", 1)
    uids = {name: obj["metadata"]["uid"] for name, obj in objects.items()}
    for part in PARTS:
        name = builders.object_name(appdef, part, 1)
        if part.kind == "ConfigMap":
            cache.offer({**objects[f"ConfigMap/{name}"], "kind": part.kind})  # as claimed
        else:
            cached = cache.get(part.kind, ns, name)
            assert cached is not None
            cache.offer_gone(part.kind, ns, name, cached["metadata"]["uid"])
    cache.offer(patch_appdef_spec(kube, ns, "java", minInstances=0))

    result = _reconcile_from_cache(cache, kube, ns, 1)

    assert result.record.plan.state == "claimed"
    after = _uids(kube, ns, 1)
    assert after == uids  # the holder keeps its allow-list and its proxy configuration
    run_until_quiet(kube, ns)
    assert_invariants(kube, ns)


def test_a_cache_that_missed_its_appdefinitions_deletion_rebuilds_nothing(
    kube: Kube, namespace: str, cache: ClusterCache
) -> None:
    """The server refuses no create whose owner is gone: a worker whose cache has not seen the
    AppDefinition deleted would rebuild an instance the garbage collector is removing (and a
    claim could take it, then see its parts collected under it: found by the long chaos
    tier, seed 7). The plan's first create waits for the AppDefinition read from the server."""
    ns = namespace
    create_appdef(kube, ns, min_instances=2)
    run_until_quiet(kube, ns)
    _wait_caught_up(kube, ns, cache, objects=10)
    cache.stop()  # frozen: the AppDefinition and instance 2 as they were
    appdef = _appdef(kube, ns)
    for part in PARTS:  # instance 2 half gone, as the collector leaves it mid-way
        if part is not Part.EXTERNAL_SERVICE:
            kube.delete(part.api_version, part.kind, ns, builders.object_name(appdef, part, 2))
    kube.delete(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java")
    wait_for(lambda: kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java") is None,
             timeout=30, message="the AppDefinition to be gone")
    for part in PARTS:
        if part is not Part.EXTERNAL_SERVICE:
            name = builders.object_name(appdef, part, 2)
            cached = cache.get(part.kind, ns, name)
            assert cached is not None
            cache.offer_gone(part.kind, ns, name, cached["metadata"]["uid"])
    assert cache.get(v.APPDEF_KIND, ns, "java") is not None  # the cache still has it

    counting = CountingKube(kube.api_client)
    reader = CachedReader(cache, counting)
    key = InstanceKey(ns, "java", 2)
    with LocalLeases().try_lease(str(key)) as guard:  # above every fence written so far
        assert guard is not None
        result = reconcile_instance(reader, counting, key, guard, PoolSettings())

    assert counting.calls["create"] == 0, counting.calls
    assert result.record.plan.state == "retired"  # what is left goes, with its AppDefinition
    assert cache.get(v.APPDEF_KIND, ns, "java") is None  # and the cache learnt it


def test_a_retried_claim_on_a_lagging_cache_takes_the_held_path_not_a_second_instance(
    kube: Kube, namespace: str, cache: ClusterCache
) -> None:
    """Finding 11: a claim's deciding write landed on instance 2 and its answer was lost; the
    retry runs on a cache behind on the Services, which shows the Session holding nothing and
    instance 1 free. Nothing on the server refuses a deciding write on instance 1: the claim
    must ask the server what the Session holds first."""
    ns = namespace
    created = _pool_with_a_session_seen(kube, ns, cache, min_instances=3)
    cache.stop()  # frozen: s1 holds nothing, instances 1-3 free
    _claim_behind_the_caches_back(kube, ns, 2, created)
    appdef, meta = _appdef(kube, ns), created["metadata"]

    result = claim_session(CachedReader(cache, kube), kube, SessionKey(ns, "s1"), LocalLeases(),
                           PoolSettings())

    assert (result.outcome, result.record.instance_id) == ("held", 2)
    one = kube.get("v1", "Service", ns, builders.object_name(appdef, Part.EXTERNAL_SERVICE, 1))
    assert one is not None
    assert not [r for r in one["metadata"].get("ownerReferences", [])
                if r.get("uid") == meta["uid"]], "a second deciding write was made"
    run_until_quiet(kube, ns)
    assert_invariants(kube, ns)


def test_a_double_claim_settled_behind_the_caches_back_releases_nothing(
    kube: Kube, namespace: str, cache: ClusterCache
) -> None:
    """The chaos tier (CI, seed 2): a claim in flight had landed on two instances, the double
    claim settled on the server (instance 1 let the Session go), and a cache behind on the
    Services still showed both references. Instance 3's job read the Session as held
    elsewhere, released it and, above the lowered minInstances, deleted the Session's only
    instance: nothing on the server guarded that decision, which was about instance 1's
    Service. The references it is based on must come from the server."""
    ns = namespace
    created = _pool_with_a_session_seen(kube, ns, cache, min_instances=3)
    for k in (1, 3):  # the double claim, s1 not yet annotated with either
        _claim_behind_the_caches_back(kube, ns, k, created)
    _wait_caught_up(kube, ns, cache)
    cache.stop()  # frozen: both references
    appdef = _appdef(kube, ns)
    one = builders.object_name(appdef, Part.EXTERNAL_SERVICE, 1)
    ext = kube.get("v1", "Service", ns, one)
    assert ext is not None
    kube.merge_patch("v1", "Service", ns, one, {"metadata": {"ownerReferences": [
        r for r in ext["metadata"]["ownerReferences"]
        if r.get("uid") != created["metadata"]["uid"]]}},
        resource_version=ext["metadata"]["resourceVersion"])  # settled: 3 is the one
    uids = _uids(kube, ns, 3)
    cache.offer(patch_appdef_spec(kube, ns, "java", minInstances=2))

    stale = CachedReader(cache, kube).referencing(ns, "java", parse_session(created))
    assert stale == {1, 3}  # the stale view
    result = _reconcile_from_cache(cache, kube, ns, 3)

    assert result.record.plan.state == "claimed"
    after = _uids(kube, ns, 3)
    assert after == uids, "the Session's only instance was deleted"
    run_until_quiet(kube, ns)
    assert_invariants(kube, ns)


def test_a_claim_read_from_the_cache_makes_no_read_requests(
    kube: Kube, kube_api: Any, namespace: str, cache: ClusterCache
) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=20, max_instances=30)
    run_until_quiet(kube, ns)
    created = create_session(kube, ns, "s1", USERS[1])
    trigger = {f"{v.SESSION_KIND}/s1": created["metadata"]["resourceVersion"]}
    assert cache.wait_fresh(ns, trigger, 30)
    wait_for(lambda: len(cache.pool_objects(ns)) == 100, timeout=30,
             message="the cache to see the pool")
    app = naming.app_selector(_appdef(kube, ns).spec_name, 1)
    wait_for(lambda: cache.pods_of(ns, app) and cache.replica_sets_of(ns, app), timeout=60,
             message="the cache to see instance 1's pod and its ReplicaSet")
    counting = CountingKube(kube_api)

    result = claim_session(CachedReader(cache, counting), counting, SessionKey(ns, "s1"),
                           LocalLeases(), PoolSettings(), retried=False)

    assert result.outcome == "claimed" and result.record.instance_id == 1
    reads = {verb: n for verb, n in counting.calls.items()
             if verb == "get" or verb.startswith("list")}
    # No reads: not the instance's pods and ReplicaSets for its refresh (the cache's, the
    # pod still stamped only as its Deployment's own: issue #27), and no Services by the
    # Session's uid (a first run: it has claimed nothing the cache could have missed). The
    # writes are the claim's: 10 (issue #28).
    assert reads == {}, counting.calls
    assert sum(counting.calls.values()) <= 10, counting.calls
    pods, _ = kube.list("v1", "Pod", ns, label_selector=f"{v.LABEL_APP}={app}")
    assert [v.ANNOTATION_REFRESH in (p["metadata"].get("annotations") or {})
            for p in pods] == [True], "the refresh stamped the instance's one pod"
    run_until_quiet(kube, ns)
    assert_invariants(kube, ns)


# --- sessionsPerUser on a cache (issue #27) ---------------------------------------------------

LIMIT_ONE = PoolSettings(sessions_per_user=1)


def test_under_a_limit_a_claim_on_a_current_cache_lists_no_sessions(
    kube: Kube, kube_api: Any, namespace: str, cache: ClusterCache
) -> None:
    """The re-check before a deciding write costs nothing when the cache's Session watch is
    past the claiming Session's version (the usual case: the Session came by that watch)."""
    ns = namespace
    created = _pool_with_a_session_seen(kube, ns, cache, min_instances=2, objects=10)
    counting = CountingKube(kube_api)

    result = claim_session(CachedReader(cache, counting), counting, SessionKey(ns, "s1"),
                           LocalLeases(), LIMIT_ONE)

    assert result.outcome == "claimed", result
    assert counting.calls["list Session"] == 0, counting.calls
    assert created["metadata"]["name"] == "s1"


def test_under_a_limit_a_claim_on_a_cache_that_missed_the_older_session_is_refused(
    kube: Kube, kube_api: Any, namespace: str, cache: ClusterCache
) -> None:
    """Issue #27: the cache stopped before either Session of the user was made; the younger's
    claim reads it directly (the cache had not seen it), so its version is past the watch: the
    user's Sessions come from the server, which has the older one. The younger is refused."""
    ns = namespace
    create_appdef(kube, ns, min_instances=2)
    run_until_quiet(kube, ns)
    _wait_caught_up(kube, ns, cache, objects=10)
    cache.stop()  # frozen: neither Session below is in it
    create_session(kube, ns, "older", USERS[1])
    create_session(kube, ns, "younger", USERS[1].upper())
    # Which is older is the total order's (creationTimestamp, then uid): one second may hold
    # both. Read here without the cache, which must learn of the second only by its claim.
    first, second = sorted(
        (parse_session(kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name))
         for name in ("older", "younger")), key=lambda s: (s.created, s.uid))
    counting = CountingKube(kube_api)
    reader = CachedReader(cache, counting)

    result = claim_session(reader, counting, SessionKey(ns, second.name), LocalLeases(),
                           LIMIT_ONE)

    assert result.outcome == "refused", result
    assert counting.calls["list Session (cached)"] == 1, counting.calls
    status = kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, second.name)["status"]
    assert (status["operatorStatus"], status["error"]) == (
        "ERROR", "553:No more sessions allowed for this user, you reached your limit.")
    run_until_quiet(kube, ns, LIMIT_ONE)
    first_status = kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, first.name)["status"]
    assert first_status["operatorStatus"] == "HANDLED"
