"""Warm first, and no etcd scans on the claim and release paths (issue #28), on the real
control plane, with claims and releases read from a worker's watch-fed cache.

The fake kubelet plays a start delay for images named ``fake-kubelet.invalid/start-<N>s``
(`warmpool.cluster.fake_kubelet`): a released instance's reset pod is Pending for that long,
so a claim meanwhile must take a warm instance, not the one being reset. The API server's own
metrics (`warmpool.cluster.apimetrics`) say how many LISTs etcd answered around a claim and
a release: none for pods, ReplicaSets or Services. An AppDefinition whose image cannot be
pulled (``fake-kubelet.invalid/pull-error``) stops making instances at the cap, with a
condition and a Warning, until its template changes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import config

from scheduler import mapping
from tests.pool_world import assert_invariants, emails, held_instance, session
from tests.waiting import wait_for
from warmpool.cluster import apimetrics, local
from warmpool.controller.guard import LocalLeases
from warmpool.controller.reconcile import claim_session, reconcile_instance, resync_pool
from warmpool.controller.result import Outcome, Start
from warmpool.controller.sequential import run_until_quiet
from warmpool.keys import InstanceKey, PoolKey, SessionKey
from warmpool.kube.api import Kube
from warmpool.kube.cache import ClusterCache
from warmpool.kube.reader import CachedReader
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings
from warmpool.pool.decide import COLD_START_NOTE
from warmpool.pool.health import FAILURE_CAP, find_condition
from warmpool.pool.model import AppDefinition
from warmpool.pool.pods import Warmth
from warmpool.testing.world import (
    USERS,
    create_appdef,
    create_namespace,
    create_session,
    delete_session,
    patch_appdef_spec,
)

SETTINGS = PoolSettings(url_probe=False)
#: Long enough that the claims after a release all run while its pod is still starting.
SLOW_IMAGE = "fake-kubelet.invalid/start-15s"


def _cache(kube: Kube, ns: str) -> ClusterCache:
    c = ClusterCache(lambda: kube, [ns], timeout_range=(60.0, 90.0)).start()
    assert c.wait_synced(30)
    return c


def _wait_warm(reader: CachedReader, ns: str, ids: tuple[int, ...] = (1, 2, 3)) -> None:
    wait_for(lambda: all(_warmth(reader, ns, k) == Warmth.WARM for k in ids),
             timeout=60, message="the three pods to start")


def _appdef(reader: CachedReader, ns: str) -> AppDefinition:
    parsed = reader.appdef(ns, "java")
    assert isinstance(parsed, AppDefinition), parsed
    return parsed


def _warmth(reader: CachedReader, ns: str, k: int) -> str:
    return reader.warmth(ns, _appdef(reader, ns), k)[0]


def _claim(reader: CachedReader, kube: Kube, ns: str, name: str):
    created = create_session(kube, ns, name, USERS[int(name[1:])])
    assert reader.cache.wait_fresh(
        ns, {f"{v.SESSION_KIND}/{name}": created["metadata"]["resourceVersion"]}, 30)
    return claim_session(reader, kube, SessionKey(ns, name), LocalLeases(), SETTINGS,
                         retried=False)


def _release(reader: CachedReader, kube: Kube, ns: str, name: str, k: int) -> None:
    """Delete Session `name` and release its instance k from the cache, as the instance's
    key does (the scheduler queues it for the deletion; the Session's own key may find the
    garbage collector has already stripped its references, and leaves it to that key)."""
    uid = session(kube, ns, name)["metadata"]["uid"]
    delete_session(kube, ns, name)
    wait_for(lambda: reader.gone_session_uid(ns, name) == uid, timeout=30,
             message=f"the cache to see {name} deleted")
    key = InstanceKey(ns, "java", k)
    with LocalLeases().try_lease(str(key)) as guard:
        assert guard is not None
        result = reconcile_instance(reader, kube, key, guard, SETTINGS)
    assert result.record.plan is not None and result.record.plan.released, result


def test_after_a_release_a_claim_takes_a_warm_instance_not_the_one_being_reset(
    kube: Kube, namespace: str
) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=3, image=SLOW_IMAGE)
    run_until_quiet(kube, ns, SETTINGS)
    cache = _cache(kube, ns)
    try:
        reader = CachedReader(cache, kube)
        _wait_warm(reader, ns)
        first = _claim(reader, kube, ns, "s1")
        assert (first.outcome, first.record.instance_id, first.record.start) == (
            Outcome.CLAIMED, 1, Start.WARM)

        _release(reader, kube, ns, "s1", 1)
        # Instance 1 is free again (lowest id), its pod reset: starting for 15 s.
        wait_for(lambda: _warmth(reader, ns, 1) == Warmth.STARTING, timeout=30,
                 message="instance 1's reset pod to be seen starting")

        warm = _claim(reader, kube, ns, "s2")
        assert (warm.outcome, warm.record.instance_id, warm.record.start) == (
            Outcome.CLAIMED, 2, Start.WARM)
        assert not session(kube, ns, "s2")["status"]["operatorMessage"].endswith(
            COLD_START_NOTE)
        assert _claim(reader, kube, ns, "s3").record.instance_id == 3
        # No warm instance left: the fallback is the starting one, and the user is told.
        cold = _claim(reader, kube, ns, "s4")
        assert (cold.outcome, cold.record.instance_id, cold.record.start) == (
            Outcome.CLAIMED, 1, Start.COLD)
        status = session(kube, ns, "s4")["status"]
        assert status["operatorStatus"] == v.STATUS_HANDLED
        assert status["operatorMessage"].endswith(COLD_START_NOTE)
        assert held_instance(kube, ns, "s4") == 1
    finally:
        cache.stop()
    run_until_quiet(kube, ns, SETTINGS)
    assert_invariants(kube, ns)


def test_a_deleted_sessions_key_leaves_a_busy_instance_to_that_instances_own_key(
    kube: Kube, namespace: str
) -> None:
    """Issue #28: a release runs once. The Session's key releases what its uid holds when the
    instance's lease is free; when the instance's own key holds it (queued by the scheduler
    for the same deletion), it is left to that key, without parking for a second run. A
    finalizer keeps the Session (being deleted) and its references while the test runs."""
    ns = namespace
    create_appdef(kube, ns, min_instances=1)
    run_until_quiet(kube, ns, SETTINGS)
    cache = _cache(kube, ns)
    hold = {"metadata": {"finalizers": ["warmpool.test/hold"]}}
    try:
        reader = CachedReader(cache, kube)
        _wait_warm(reader, ns, (1,))
        assert _claim(reader, kube, ns, "s1").record.instance_id == 1
        kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s1", hold)
        delete_session(kube, ns, "s1")
        wait_for(lambda: (s := reader.session(ns, "s1")) is not None and s.deleting,
                 timeout=30, message="the cache to see s1 being deleted")
        leases, key, ikey = LocalLeases(), SessionKey(ns, "s1"), InstanceKey(ns, "java", 1)

        with leases.try_lease(str(ikey)) as held:  # the instance's own job, running
            assert held is not None
            busy = claim_session(reader, kube, key, leases, SETTINGS, retried=False)
        assert (busy.outcome, busy.parked_on, busy.requeue_after) == (
            Outcome.SKIPPED, None, None), busy
        assert "instance 1 is busy" in busy.message
        assert emails(kube, ns, "java", 1) == USERS[1], "the skipped run released something"

        # With the lease free, the Session's own key releases it.
        freed = claim_session(reader, kube, key, leases, SETTINGS, retried=False)
        assert (freed.outcome, freed.record.instance_id) == (Outcome.RELEASED, 1), freed
        assert not emails(kube, ns, "java", 1)
    finally:
        cache.stop()
        kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s1",
                         {"metadata": {"finalizers": None}})
    run_until_quiet(kube, ns, SETTINGS)
    assert_invariants(kube, ns)


# --- etcd LISTs, counted by the API server ------------------------------------------------------

@pytest.fixture(scope="module")
def cached_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local.ClusterInfo]:
    """A control plane of its own with the API server's watch cache on (the session's runs
    without it, where every LIST goes to etcd whatever it asks)."""
    if not local.binaries_present():
        local.build(progress=False)
    state_dir: Path = tmp_path_factory.mktemp("cached-cluster")
    info = local.up(state_dir, watch_cache=True, die_with_parent=True)
    try:
        yield info
    finally:
        local.down(state_dir)


def _pod_and_service_lists(counts: dict[str, int]) -> dict[str, int]:
    return {t: n for t, n in counts.items()
            if t.endswith((".Pod", ".Service", ".ReplicaSet"))}


def test_a_claim_and_a_release_send_no_list_of_pods_or_services_to_etcd(
    cached_cluster: local.ClusterInfo,
) -> None:
    api_client = config.new_client_from_config(config_file=str(cached_cluster.kubeconfig))
    kube = Kube(api_client)
    ns = "etcd-lists"
    create_namespace(kube, ns, timeout=60)
    create_appdef(kube, ns, min_instances=3)
    run_until_quiet(kube, ns, SETTINGS)
    cache = _cache(kube, ns)
    try:
        reader = CachedReader(cache, kube)
        _wait_warm(reader, ns)
        before = apimetrics.etcd_lists(cached_cluster)

        claimed = _claim(reader, kube, ns, "s1")
        assert (claimed.outcome, claimed.record.instance_id) == (Outcome.CLAIMED, 1)
        # The claim's pod refresh ran (its allow-list write made it list the pods).
        _release(reader, kube, ns, "s1", 1)
        wait_for(lambda: _warmth(reader, ns, 1) == Warmth.WARM, timeout=60,
                 message="instance 1's reset pod to start again")

        after = apimetrics.etcd_lists(cached_cluster)
    finally:
        cache.stop()
        api_client.close()
    lists = apimetrics.lists_between(before, after)
    assert _pod_and_service_lists(lists) == {}, lists
    # The measure is live: the counters move (the API server's own health checks, the
    # controllers' relists) and the pods' type is named as the filter expects.
    assert any(t.endswith(".Pod") for t in after), sorted(after)


def test_a_claims_session_writes_are_its_own_key_s_so_they_do_not_run_it_again(
    cached_cluster: local.ClusterInfo,
) -> None:
    """Issue #28: a claim runs once. Its Session writes (annotation, status) are made under
    the instance's lease; their versions must be noted under the claim's key too, or the
    Session's watch event of them (one the scheduler maps to the claim's key: not a
    status-only change) runs the claim a second time."""
    api_client = config.new_client_from_config(config_file=str(cached_cluster.kubeconfig))
    kube = Kube(api_client)
    ns = "claim-once"
    create_namespace(kube, ns, timeout=60)
    create_appdef(kube, ns, min_instances=2)
    run_until_quiet(kube, ns, SETTINGS)
    cache = _cache(kube, ns)
    created = create_session(kube, ns, "s1", USERS[1])
    try:
        reader = CachedReader(cache, kube)
        assert cache.wait_fresh(
            ns, {f"{v.SESSION_KIND}/s1": created["metadata"]["resourceVersion"]}, 30)
        claimed = claim_session(reader, kube, SessionKey(ns, "s1"), LocalLeases(), SETTINGS,
                                retried=False)
    finally:
        cache.stop()
    assert claimed.outcome == Outcome.CLAIMED
    own = dict(claimed.written_under(SessionKey(ns, "s1")))
    last = session(kube, ns, "s1")
    # Every version of the Session from its creation on, as the scheduler's watch sees them.
    seen: list[dict] = [created]
    for event in kube.watch(v.SESSION_API_VERSION, v.SESSION_KIND, ns,
                            resource_version=created["metadata"]["resourceVersion"],
                            timeout_seconds=5):
        if event["type"] in ("ADDED", "MODIFIED"):
            seen.append(event["object"])
        if seen and seen[-1]["metadata"]["resourceVersion"] == \
                last["metadata"]["resourceVersion"]:
            break
    api_client.close()
    mapped = [obj["metadata"]["resourceVersion"] for old, obj in itertools.pairwise(seen)
              if mapping.changed(obj, old)]
    assert mapped, "the claim's annotation is a change the scheduler maps to keys"
    mine = int(own.get(f"{v.SESSION_KIND}/s1", 0))
    assert all(int(rv) <= mine for rv in mapped), (mapped, own)


# --- a pool whose pods cannot start -------------------------------------------------------------

def _reconcile(reader: CachedReader, kube: Kube, leases: LocalLeases, ns: str, k: int) -> None:
    key = InstanceKey(ns, "java", k)
    with leases.try_lease(str(key)) as guard:
        assert guard is not None
        reconcile_instance(reader, kube, key, guard, SETTINGS)


def _objects(reader: CachedReader, ns: str, k: int) -> int:
    return len(reader.instance(ns, "java", _appdef(reader, ns), k, []).existing())


def test_a_pool_whose_image_cannot_be_pulled_stops_at_the_cap_and_says_so(
    kube: Kube, namespace: str
) -> None:
    ns = namespace
    created = create_appdef(kube, ns, min_instances=5, image="fake-kubelet.invalid/pull-error")
    cache = _cache(kube, ns)
    leases = LocalLeases()
    try:
        reader = CachedReader(cache, kube)
        wait_for(lambda: reader.appdef(ns, "java") is not None, timeout=30,
                 message="the cache to see the AppDefinition")
        for k in range(1, FAILURE_CAP + 1):
            _reconcile(reader, kube, leases, ns, k)
        wait_for(lambda: (found := reader.pool_health(ns, _appdef(reader, ns))) is not None
                 and found.failing == FAILURE_CAP, timeout=60,
                 message=f"{FAILURE_CAP} pods to fail to pull their image")

        # At the cap: a missing instance is not made.
        _reconcile(reader, kube, leases, ns, FAILURE_CAP + 1)
        assert _objects(reader, ns, FAILURE_CAP + 1) == 0
        result = resync_pool(reader, kube, PoolKey(ns, "java"), SETTINGS)
        assert result.record.health is not None and result.record.health.capped
        assert result.record.health.reasons == ("ImagePullBackOff",)
        status = kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java")["status"]
        condition = find_condition(status)
        assert condition is not None
        assert (condition["status"], condition["reason"], condition["observedGeneration"]) == (
            "True", "ImagePullBackOff", created["metadata"]["generation"])
        events, _ = kube.list("v1", "Event", ns)
        warnings = [e for e in events if e["reason"] == "PodsFailing"]
        assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
        assert warnings[0]["involvedObject"]["name"] == "java"
        # A second resync finds the condition as it is: no second write, no second Warning.
        resync_pool(reader, kube, PoolKey(ns, "java"), SETTINGS)
        events, _ = kube.list("v1", "Event", ns)
        assert len([e for e in events if e["reason"] == "PodsFailing"]) == 1

        # A new template: the failing Deployments are replaced, their pods start, and the
        # pool fills up again.
        patch_appdef_spec(kube, ns, "java", image="fake-kubelet.invalid/start-1s")
        wait_for(lambda: _appdef(reader, ns).generation == 2, timeout=30,
                 message="the cache to see the new template")
        for k in range(1, FAILURE_CAP + 1):
            _reconcile(reader, kube, leases, ns, k)
        wait_for(lambda: (found := reader.pool_health(ns, _appdef(reader, ns))) is not None
                 and found.failing == 0, timeout=60,
                 message="the new template's pods to start")
        _reconcile(reader, kube, leases, ns, FAILURE_CAP + 1)
        wait_for(lambda: _objects(reader, ns, FAILURE_CAP + 1) == 5, timeout=30,
                 message="the next instance to be made")
        resync_pool(reader, kube, PoolKey(ns, "java"), SETTINGS)
        condition = find_condition(
            kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java")["status"])
        assert condition is not None and condition["status"] == "False"
    finally:
        cache.stop()
