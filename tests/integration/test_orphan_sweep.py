"""Pool objects nothing owns are swept (reliability.md, finding 18), with the real garbage
collector: one scheduler and one worker process on the local control plane.

Finding 18, as the long chaos tier met it: a foreign owner reference added by hand keeps a
free instance's ConfigMap alive through its AppDefinition's deletion (the garbage collector
strips the dangling AppDefinition reference and keeps the object for its live owner, as it
must); then the foreign reference is removed. Nothing owns the object, and before the sweep
nothing ever deleted it (I4). Shown here:
- that sequence ends with the object deleted, by the sweep its last event queues (the
  resync is an hour away);
- an ownerless pool object whose AppDefinition lives gets its owner back from its
  instance's job;
- an orphan made while no scheduler ran is swept by the next one's startup resync.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.redis_server import resolve_redis_url
from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo
from warmpool.harness import System
from warmpool.kube.api import Kube
from warmpool.pool import vocabulary as v
from warmpool.pool.meta import owner_refs
from warmpool.pool.parts import Part
from warmpool.testing.world import create_appdef

pytestmark = pytest.mark.redis

SETTLE = 60.0


def controller(cluster: ClusterInfo, namespace: str, log_dir: Path) -> System:
    """One scheduler (its periodic resync an hour away: only events and the startup resync
    queue the sweep) and one worker process."""
    return System(cluster, namespaces=[namespace], workers=1, threads=4, resync_period=3600,
                  redis=resolve_redis_url(), env={"WARMPOOL_URL_PROBE": "off"},
                  log_dir=log_dir)


@pytest.fixture
def system(cluster: ClusterInfo, namespace: str, tmp_path: Path) -> Iterator[System]:
    with controller(cluster, namespace, tmp_path) as system:
        yield system
        assert system.dead() == [], "a controller process died"


def proxy_configmap(kube: Kube, ns: str, appdef_uid: str) -> dict[str, Any] | None:
    items, _ = kube.list("v1", "ConfigMap", ns, label_selector=v.LABEL_GENERATION)
    return next((cm for cm in items if cm["metadata"]["name"].startswith("instance-1-proxy-")
                 and cm["metadata"]["name"].endswith(appdef_uid[-12:])), None)


def pool_of_one(kube: Kube, ns: str) -> tuple[str, dict[str, Any]]:
    """An AppDefinition `java` of one instance: its uid, and instance 1's proxy ConfigMap once
    the controller made it."""
    uid = create_appdef(kube, ns, "java", min_instances=1, max_instances=1)["metadata"]["uid"]
    wait_for(lambda: proxy_configmap(kube, ns, uid) is not None, timeout=SETTLE,
             message="instance 1's proxy ConfigMap")
    cm = proxy_configmap(kube, ns, uid)
    assert cm is not None
    return uid, cm


def set_owners(kube: Kube, obj: dict[str, Any], owners: list[Mapping[str, Any]]) -> None:
    meta = obj["metadata"]
    kube.merge_patch("v1", "ConfigMap", meta["namespace"], meta["name"],
                     {"metadata": {"ownerReferences": owners}},
                     resource_version=meta["resourceVersion"])


def test_an_object_a_foreign_owner_kept_past_its_appdefinition_is_swept_once_freed(
    system: System, kube: Kube, namespace: str,
) -> None:
    ns = namespace
    uid, cm = pool_of_one(kube, ns)
    anchor = kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "anchor", "namespace": ns}})
    set_owners(kube, cm, [*owner_refs(cm), {
        "apiVersion": "v1", "kind": "ConfigMap", "name": "anchor",
        "uid": anchor["metadata"]["uid"]}])

    kube.delete(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java")

    def kept_for_anchor() -> dict[str, Any] | None:
        now = proxy_configmap(kube, ns, uid)
        refs = owner_refs(now)
        return now if refs and all(r.get("name") == "anchor" for r in refs) else None
    wait_for(lambda: kept_for_anchor() is not None, timeout=SETTLE,
             message="the garbage collector to strip the AppDefinition's reference")
    kept = kept_for_anchor()
    assert kept is not None
    set_owners(kube, kept, [])

    wait_for(lambda: proxy_configmap(kube, ns, uid) is None, timeout=SETTLE,
             message=lambda: f"the ownerless proxy ConfigMap to be swept: "
                             f"{proxy_configmap(kube, ns, uid)}")
    assert kube.get("v1", "ConfigMap", ns, "anchor") is not None  # the foreign owner stays


def test_an_ownerless_object_of_a_living_appdefinition_gets_its_owner_back(
    system: System, kube: Kube, namespace: str,
) -> None:
    ns = namespace
    uid, cm = pool_of_one(kube, ns)
    set_owners(kube, cm, [])

    def owned() -> bool:
        refs = owner_refs(proxy_configmap(kube, ns, uid))
        return any(r.get("kind") == v.APPDEF_KIND and r.get("uid") == uid for r in refs)
    wait_for(owned, timeout=SETTLE, message="the AppDefinition's reference put back")


def test_an_orphan_made_while_no_scheduler_ran_is_swept_at_the_next_start(
    cluster: ClusterInfo, kube: Kube, namespace: str, tmp_path: Path,
) -> None:
    ns = namespace
    gone_uid = "6d1b0c4e-1111-4222-8333-0123456789ab"  # no AppDefinition has it
    name = Part.PROXY_CONFIGMAP.object_name("java", gone_uid, 1)
    kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": name, "namespace": ns,
        "labels": {v.LABEL_GENERATION: "1", v.LABEL_TEMPLATE_PURPOSE: v.PURPOSE_PROXY}}})
    with controller(cluster, ns, tmp_path) as system:
        wait_for(lambda: kube.get("v1", "ConfigMap", ns, name) is None, timeout=SETTLE,
                 message="the startup resync's sweep")
        assert system.dead() == []
