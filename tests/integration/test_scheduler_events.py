"""The scheduler on the real control plane, adding to a real keyed queue (no workers, so what
it adds stays waiting in Redis): every event kind gives the right keys, and a watch that
resumes from a compacted resourceVersion (410 Gone) relists without losing a change.

The scheduler runs in this process (so a test can park its watches and read its caches),
with short watch timeouts so that a parked watch is closed within seconds.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from scheduler.app import Scheduler, SchedulerConfig
from scheduler.leader import LeaderConfig
from tests.producers import Recorder
from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo
from warmpool.kube.api import Kube, connect
from warmpool.pool import vocabulary as v
from warmpool.queue import KeyedQueue, Layout, QueueSettings
from warmpool.testing.world import USERS, create_appdef, create_session, delete_session

pytestmark = pytest.mark.redis


class Run:
    """A running in-process scheduler and what it added (keys, in order)."""

    def __init__(self, sched: Scheduler, rec: Recorder, client: redis.Redis,
                 settings: QueueSettings) -> None:
        self.sched, self.rec, self.client, self.settings = sched, rec, client, settings

    def mark(self) -> int:
        return self.rec.mark()

    def added_since(self, mark: int) -> list[str]:
        return self.rec.since(mark)

    def wait_added(self, mark: int, *keys: str, timeout: float = 20) -> list[str]:
        """Wait until every key in `keys` was added after `mark`; returns all added since."""
        def seen() -> list[str] | None:
            got = self.added_since(mark)
            return got if set(keys) <= set(got) else None
        return wait_for(seen, timeout=timeout, interval=0.05,
                        message=lambda: f"keys {keys}; added: {self.added_since(mark)}")

    def waiting_in_redis(self) -> set[str]:
        return {m.decode() for m in self.client.smembers(Layout.of(self.settings).dirty)}


@pytest.fixture
def run(request: pytest.FixtureRequest, cluster: ClusterInfo, namespace: str) -> Iterator[Run]:
    settings: QueueSettings = request.getfixturevalue("queue_settings")
    client: redis.Redis = request.getfixturevalue("redis_client")
    rec = Recorder(KeyedQueue(client, settings))
    config = SchedulerConfig(
        namespaces=[namespace], watch_timeout=(2, 3),
        leader=LeaderConfig(namespace=namespace, identity=f"test-{namespace}"))
    sched = Scheduler(lambda: Kube(connect(str(cluster.kubeconfig))), rec, config).start()
    try:
        assert sched.wait_synced(30)
        wait_for(lambda: sched.is_leader() and sched.stats.resyncs >= 1, timeout=30,
                 message="leadership and the startup resync")
        yield Run(sched, rec, client, settings)
    finally:
        sched.stop()
    assert not sched.elector or not sched.elector.is_leader()


def appdef_uid(kube: Kube, ns: str, name: str = "java") -> str:
    obj = kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, name)
    assert obj is not None
    return str(obj["metadata"]["uid"])


def owner(kind: str, name: str, uid: str) -> dict[str, str]:
    api_version = v.APPDEF_API_VERSION if kind == "AppDefinition" else v.SESSION_API_VERSION
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid}


def pool_configmap(ns: str, name: str, owners: list[dict[str, str]],
                   labelled: bool = True) -> dict[str, Any]:
    labels = {v.LABEL_GENERATION: "1", v.LABEL_TEMPLATE_PURPOSE: v.PURPOSE_EMAILS}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "labels": labels if labelled else {},
                         "ownerReferences": owners},
            "data": {v.EMAILS_KEY: ""}}


def annotate(kube: Kube, ns: str, session: str, instance: int) -> None:
    kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, session,
                     {"metadata": {"annotations": {v.ANNOTATION_INSTANCE_ID: str(instance)}}})


def marker(kube: Kube, ns: str, name: str) -> str:
    """An AppDefinition whose ADDED event comes after everything done before on that kind."""
    create_appdef(kube, ns, name, min_instances=0)
    return f"pool/{ns}/{name}"


def test_appdefinition_events(run: Run, kube: Kube, namespace: str) -> None:
    ns = namespace
    m = run.mark()
    create_appdef(kube, ns, "java", min_instances=2)
    run.wait_added(m, f"pool/{ns}/java")

    m = run.mark()
    kube.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java",
                     {"metadata": {"labels": {"team": "a"}}})  # no new generation
    run.wait_added(m, marker(kube, ns, "marker1"))
    assert f"pool/{ns}/java" not in run.added_since(m)

    m = run.mark()
    kube.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java",
                     {"spec": {"minInstances": 1}})  # generation 2
    run.wait_added(m, f"pool/{ns}/java")

    m = run.mark()
    kube.delete(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java")
    run.wait_added(m, f"pool/{ns}/java")
    assert {f"pool/{ns}/java", f"pool/{ns}/marker1"} <= run.waiting_in_redis()


def test_session_events(run: Run, kube: Kube, namespace: str) -> None:
    ns = namespace
    create_appdef(kube, ns, "java", min_instances=2)
    m = run.mark()
    create_session(kube, ns, "s1", USERS[1])
    got = run.wait_added(m, f"session/{ns}/s1")
    assert not [k for k in got if k.startswith("instance/")]

    m = run.mark()
    kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s1",
                     {"status": {"operatorStatus": "HANDLING", "lastActivity": 1}}, status=True)
    run.wait_added(m, marker(kube, ns, "m1"))
    create_session(kube, ns, "m2", USERS[9])  # a marker on the Session watch itself
    got = run.wait_added(m, f"session/{ns}/m2")
    assert f"session/{ns}/s1" not in got, "a status-only change must add nothing"

    m = run.mark()
    annotate(kube, ns, "s1", 2)  # what a claim writes
    run.wait_added(m, f"session/{ns}/s1", f"instance/{ns}/java/2")

    m = run.mark()
    kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s1",
                     {"spec": {"user": USERS[2]}})
    run.wait_added(m, f"session/{ns}/s1", f"instance/{ns}/java/2")

    # Deleted (annotated): the release, from its own key (the claims queue) and its instance's.
    m = run.mark()
    delete_session(kube, ns, "s1")
    run.wait_added(m, f"session/{ns}/s1", f"instance/{ns}/java/2")

    # Deleted while not annotated: a claim may be in flight, so the whole pool.
    create_session(kube, ns, "s2", USERS[3])
    m = run.mark()
    delete_session(kube, ns, "s2")
    run.wait_added(m, f"session/{ns}/s2", f"pool/{ns}/java")

    # With a finalizer: the deletionTimestamp is the release already.
    create_session(kube, ns, "s3", USERS[4])
    kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s3",
                     {"metadata": {"finalizers": ["test/hold"],
                                   "annotations": {v.ANNOTATION_INSTANCE_ID: "1"}}})
    m = run.mark()
    delete_session(kube, ns, "s3")
    run.wait_added(m, f"session/{ns}/s3", f"instance/{ns}/java/1")
    s3 = kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s3")
    assert s3 is not None and s3["metadata"].get("deletionTimestamp")
    m = run.mark()
    kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s3",
                     {"metadata": {"finalizers": None}})
    run.wait_added(m, f"session/{ns}/s3", f"instance/{ns}/java/1")


def test_pool_object_events(run: Run, kube: Kube, namespace: str) -> None:
    ns = namespace
    create_appdef(kube, ns, "java", min_instances=2)
    uid = appdef_uid(kube, ns)
    uid12 = uid[-12:]
    ad = owner("AppDefinition", "java", uid)

    # ConfigMap: added, data edited by hand, deleted.
    name = f"instance-2-emails-java-app-{uid12}"
    m = run.mark()
    kube.create(pool_configmap(ns, name, [ad]))
    run.wait_added(m, f"instance/{ns}/java/2")
    m = run.mark()
    kube.merge_patch("v1", "ConfigMap", ns, name, {"data": {v.EMAILS_KEY: "x@example.com"}})
    run.wait_added(m, f"instance/{ns}/java/2")
    m = run.mark()
    kube.delete("v1", "ConfigMap", ns, name)
    run.wait_added(m, f"instance/{ns}/java/2")

    # Service.
    svc = f"instance-3-java-app-{uid12}"
    m = run.mark()
    kube.create({"apiVersion": "v1", "kind": "Service",
                 "metadata": {"name": svc, "namespace": ns,
                              "labels": {v.LABEL_GENERATION: "1"}, "ownerReferences": [ad]},
                 "spec": {"ports": [{"name": "http", "port": 3000}],
                          "selector": {"app": "java-app-3"}}})
    run.wait_added(m, f"instance/{ns}/java/3")

    # Deployment (its status is then written by the controllers and the fake kubelet).
    dep = f"instance-4-java-app-{uid12}"
    m = run.mark()
    kube.create({"apiVersion": "apps/v1", "kind": "Deployment",
                 "metadata": {"name": dep, "namespace": ns,
                              "labels": {v.LABEL_GENERATION: "1"}, "ownerReferences": [ad]},
                 "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "java-app-4"}},
                          "template": {"metadata": {"labels": {"app": "java-app-4"}},
                                       "spec": {"containers": [{"name": "app",
                                                                "image": "busybox"}]}}}})
    run.wait_added(m, f"instance/{ns}/java/4")
    m = run.mark()
    kube.delete("apps/v1", "Deployment", ns, dep)
    run.wait_added(m, f"instance/{ns}/java/4")

    # Owned only by a Session (the Java operator stripped the AppDefinition's reference):
    # the pool of that Session's AppDefinition.
    create_session(kube, ns, "s1", USERS[1], appdef="java")
    s1 = kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s1")
    assert s1 is not None
    wait_for(lambda: run.sched.reflector("Session", ns).get(ns, "s1"), timeout=10)
    m = run.mark()
    kube.create(pool_configmap(ns, f"instance-5-proxy-java-app-{uid12}",
                               [owner("Session", "s1", s1["metadata"]["uid"])]))
    run.wait_added(m, f"pool/{ns}/java")

    # Not labelled as a pool object: not watched at all.
    m = run.mark()
    kube.create(pool_configmap(ns, f"instance-6-emails-java-app-{uid12}", [ad],
                               labelled=False))
    kube.create(pool_configmap(ns, f"instance-7-emails-java-app-{uid12}", [ad]))
    got = run.wait_added(m, f"instance/{ns}/java/7")
    assert f"instance/{ns}/java/6" not in got
    assert {f"instance/{ns}/java/{k}" for k in (2, 3, 4, 7)} <= run.waiting_in_redis()


# --- 410 Gone ------------------------------------------------------------------------------


def _etcd_post(etcd_url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(f"{etcd_url}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return dict(json.loads(resp.read()))


def compact_etcd(etcd_url: str) -> int:
    rev = int(_etcd_post(etcd_url, "/v3/kv/range", {"key": "AA=="})["header"]["revision"])
    _etcd_post(etcd_url, "/v3/kv/compaction", {"revision": rev, "physical": True})
    return rev


def test_watch_resumed_from_a_compacted_revision_relists_and_loses_nothing(
    run: Run, kube: Kube, namespace: str, cluster: ClusterInfo
) -> None:
    if not cluster.etcd_url:
        pytest.skip("external cluster without WARMPOOL_TEST_ETCD_URL: cannot compact etcd")
    ns = namespace
    create_appdef(kube, ns, "java", min_instances=2)
    uid = appdef_uid(kube, ns)
    ad = owner("AppDefinition", "java", uid)
    cm2 = f"instance-2-emails-java-app-{uid[-12:]}"
    kube.create(pool_configmap(ns, cm2, [ad]))
    create_session(kube, ns, "gone", USERS[1])
    annotate(kube, ns, "gone", 1)
    create_session(kube, ns, "pending", USERS[2])
    m = run.mark()
    create_session(kube, ns, "ready", USERS[3])
    run.wait_added(m, f"session/{ns}/ready")
    wait_for(lambda: run.sched.reflector("ConfigMap", ns).get(ns, cm2), timeout=10)
    wait_for(lambda: (run.sched.reflector("Session", ns).get(ns, "gone") or {})
             .get("metadata", {}).get("annotations"), timeout=10)

    # Disconnect every watch (each parks when its current watch ends) ...
    reflectors = run.sched.reflectors
    before = {r.name: (r.last_rv, r.stats.relists_after_gone) for r in reflectors}
    for r in reflectors:
        r.hold()
    for r in reflectors:
        assert r.hold(wait=15), f"{r.name} did not park"
    m = run.mark()
    # ... change things while nobody watches, including deletions ...
    delete_session(kube, ns, "gone")  # annotated with instance 1: its release
    delete_session(kube, ns, "pending")  # not annotated: its pool
    create_session(kube, ns, "new", USERS[4])
    kube.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java",
                     {"spec": {"minInstances": 3}})
    kube.delete("v1", "ConfigMap", ns, cm2)
    wait_for(lambda: kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "gone") is None,
             timeout=10)
    # ... and compact etcd past every resourceVersion the watches know.
    rev = compact_etcd(cluster.etcd_url)
    assert all(int(rv) < rev for rv, _ in before.values() if rv)
    assert run.added_since(m) == []  # nothing was seen while parked
    for r in reflectors:
        r.resume()

    for r in reflectors:
        wait_for(lambda r=r: r.stats.relists_after_gone > before[r.name][1], timeout=20,
                 message=f"{r.name} to get 410 and relist")
    got = run.wait_added(m, f"instance/{ns}/java/1", f"pool/{ns}/java", f"session/{ns}/new",
                         f"instance/{ns}/java/2")
    session_keys = {k for k in got if k.startswith("session/")}
    # The two deleted ones found by the relist are releases, from their own keys too.
    assert session_keys == {f"session/{ns}/{n}" for n in ("new", "gone", "pending")}, got
    assert run.sched.reflector("Session", ns).get(ns, "gone") is None
    assert run.sched.reflector("ConfigMap", ns).get(ns, cm2) is None
    # Watching goes on from the relist: a later change is seen as usual.
    m = run.mark()
    create_session(kube, ns, "after", USERS[5])
    run.wait_added(m, f"session/{ns}/after")


@pytest.mark.parametrize("mode", ["two-namespaces", "all-namespaces"])
def test_several_namespaces_or_all(
    request: pytest.FixtureRequest, cluster: ClusterInfo, kube: Kube, namespace: str,
    core_v1: Any, mode: str,
) -> None:
    settings: QueueSettings = request.getfixturevalue("queue_settings")
    client: redis.Redis = request.getfixturevalue("redis_client")
    other = f"{namespace}-b"
    core_v1.create_namespace({"metadata": {"name": other, "labels": {"warmpool-test": "true"}}})
    rec = Recorder(KeyedQueue(client, settings))
    namespaces = [namespace, other] if mode == "two-namespaces" else None
    sched = Scheduler(lambda: Kube(connect(str(cluster.kubeconfig))), rec,
                      SchedulerConfig(namespaces=namespaces, watch_timeout=(2, 3))).start()
    try:
        assert sched.wait_synced(30)
        # five kinds and the PoolSchedules, per namespace (or once for all)
        assert len(sched.reflectors) == (12 if namespaces else 6)
        r = Run(sched, rec, client, settings)
        m = r.mark()
        create_appdef(kube, namespace, "java", min_instances=0)
        create_appdef(kube, other, "python", min_instances=0)
        create_session(kube, other, "s1", USERS[1], appdef="python")
        r.wait_added(m, f"pool/{namespace}/java", f"pool/{other}/python",
                     f"session/{other}/s1")
        if namespaces is None:
            assert {rf.namespace for rf in sched.reflectors} == {None}
    finally:
        sched.stop()
        core_v1.delete_namespace(other)
