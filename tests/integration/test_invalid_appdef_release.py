"""Issue #27, point 3, on the real control plane: a release needs no valid AppDefinition.

A Session holds an instance; its AppDefinition is made invalid (`warmpool scale --min 5001`
as the CLI used to write it, `requestsCpu: "1 Gi"`); the Session is deleted. The ended user's
access must go at once all the same: the allow-list emptied, the pod reset, the Ingress rule
(upstream's mode) or the orphaned route removed, the Session's traces off the external
Service. Nothing else moves while the AppDefinition is invalid: no instance made or deleted,
the other holder served as before. Once it is fixed, the pool is managed as usual.

The controller runs in-process and sequentially (``run_until_quiet``, every read from the
API server); the worker processes and their caches are exercised by the bad-input catalogue
(tests/integration/test_bad_input.py, its issue #27 section).
"""

from __future__ import annotations

from typing import Any

from kubernetes.client import V1DeleteOptions

from tests.pool_world import (
    assert_invariants,
    emails,
    held_instance,
    instance_objects,
    session,
    session_routes,
)
from tests.waiting import wait_for
from warmpool.controller.sequential import run_until_quiet
from warmpool.kube.api import Kube
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings
from warmpool.testing.world import (
    SHARED_ROUTE,
    USERS,
    create_appdef,
    create_session,
    delete_session,
    patch_appdef_spec,
)

HOST = "ws.theia.example.org"
INGRESS_MODE = PoolSettings(routes="ingress", instances_host=HOST, url_probe=False)
ROUTE_MODE = PoolSettings(url_probe=False)


def _pods(kube: Kube, ns: str, k: int) -> set[str]:
    items, _ = kube.list("v1", "Pod", ns, label_selector=f"{v.LABEL_APP}=java-app-{k}")
    return {p["metadata"]["uid"] for p in items if not p["metadata"].get("deletionTimestamp")}


def _ingress_backends(kube: Kube, ns: str) -> list[str]:
    obj = kube.get("networking.k8s.io/v1", "Ingress", ns, SHARED_ROUTE)
    assert obj is not None
    return sorted(p["backend"]["service"]["name"] for r in obj["spec"].get("rules") or []
                  for p in (r.get("http") or {}).get("paths") or [])


def _external_service(kube: Kube, ns: str, k: int) -> dict[str, Any]:
    return next(o for key, o in instance_objects(kube, ns, "java", k).items()
                if key.startswith("Service/")
                and (o["metadata"].get("labels") or {}).get(v.LABEL_SERVICE_TYPE) is None)


def _holder_traces(kube: Kube, ns: str, k: int) -> list[str]:
    """What of a holder is left on instance k's objects (empty: released)."""
    left = []
    for key, obj in instance_objects(kube, ns, "java", k).items():
        meta = obj["metadata"]
        left += [f"{key}: owner Session" for r in meta.get("ownerReferences") or []
                 if r["kind"] == "Session"]
        left += [f"{key}: label {label}" for label in meta.get("labels") or {}
                 if label in v.SESSION_LABEL_KEYS]
        if v.ANNOTATION_CLAIMED_FOR in (meta.get("annotations") or {}):
            left.append(f"{key}: claimed-for")
    if emails(kube, ns, "java", k):
        left.append("allow-list")
    return left


def _ids(kube: Kube, ns: str) -> set[int]:
    return {k for k in range(1, 8) if instance_objects(kube, ns, "java", k)}


def test_ingress_mode_a_session_ended_while_the_appdefinition_is_above_the_ceiling(
    kube, namespace
) -> None:
    ns = namespace
    kube.create({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                 "metadata": {"name": SHARED_ROUTE, "namespace": ns},
                 "spec": {"rules": [{"host": HOST}]}})
    create_appdef(kube, ns, min_instances=2, max_instances=3, shared_route=False)
    run_until_quiet(kube, ns, INGRESS_MODE)
    for i in (1, 2):
        create_session(kube, ns, f"s{i}", USERS[i])
    run_until_quiet(kube, ns, INGRESS_MODE)
    k1, k2 = held_instance(kube, ns, "s1"), held_instance(kube, ns, "s2")
    assert {k1, k2} == {1, 2}
    assert k1 is not None and k2 is not None
    ext1 = _external_service(kube, ns, k1)["metadata"]["name"]
    ext2 = _external_service(kube, ns, k2)["metadata"]["name"]
    assert _ingress_backends(kube, ns) == sorted([ext1, ext2])
    old_pods = wait_for(lambda: _pods(kube, ns, k1), timeout=30, message="s1's pod")

    # What `warmpool scale java --min 5001 --max 5001` wrote before it checked the ceiling.
    patch_appdef_spec(kube, ns, "java", minInstances=5001, maxInstances=5001)
    run_until_quiet(kube, ns, INGRESS_MODE)
    delete_session(kube, ns, "s1")
    run_until_quiet(kube, ns, INGRESS_MODE)

    assert emails(kube, ns, "java", k1) == "", "the ended user is still on the allow-list"
    assert _ingress_backends(kube, ns) == [ext2], "the ended user's Ingress rule is still there"
    assert _holder_traces(kube, ns, k1) == []
    wait_for(lambda: _pods(kube, ns, k1), timeout=30, message="the reset pod's successor")
    assert not _pods(kube, ns, k1) & old_pods, "the ended user's pod was not reset"
    # Nothing made or deleted while invalid; the other holder served as before.
    assert _ids(kube, ns) == {1, 2} and len(instance_objects(kube, ns, "java", k1)) == 5
    assert emails(kube, ns, "java", k2) == USERS[2]
    assert session(kube, ns, "s2")["status"]["operatorStatus"] == v.STATUS_HANDLED
    events, _ = kube.list("v1", "Event", ns)
    assert any(e.get("reason") == "InvalidAppDefinition" and "ceiling" in e.get("message", "")
               for e in events)

    # Fixed: managed as usual, the released instance serves the next user.
    patch_appdef_spec(kube, ns, "java", minInstances=2, maxInstances=3)
    run_until_quiet(kube, ns, INGRESS_MODE)
    create_session(kube, ns, "s3", USERS[3])
    run_until_quiet(kube, ns, INGRESS_MODE)
    assert held_instance(kube, ns, "s3") == k1
    assert session(kube, ns, "s3")["status"]["operatorStatus"] == v.STATUS_HANDLED
    assert emails(kube, ns, "java", k1) == USERS[3]
    assert _ingress_backends(kube, ns) == sorted([ext1, ext2])
    assert_invariants(kube, ns)


def test_route_mode_an_orphaned_route_goes_and_the_pool_waits_for_the_fix(
    kube, namespace, custom_objects
) -> None:
    """`requestsCpu: "1 Gi"` and minInstances lowered in the same edit: the release runs, the
    scale-down waits for the fix. The Session is deleted with propagationPolicy Orphan, so its
    route outlives it (the garbage collector only strips its reference): the release removes
    it, or the next user of the instance would be reached by the ended user's path."""
    ns = namespace
    create_appdef(kube, ns, min_instances=3, max_instances=3)
    run_until_quiet(kube, ns, ROUTE_MODE)
    for i in (1, 2):
        create_session(kube, ns, f"s{i}", USERS[i])
    run_until_quiet(kube, ns, ROUTE_MODE)
    k1, k2 = held_instance(kube, ns, "s1"), held_instance(kube, ns, "s2")
    assert (k1, k2) == (1, 2)
    s1_uid = session(kube, ns, "s1")["metadata"]["uid"]
    assert f"{s1_uid}-route" in session_routes(kube, ns)
    old_pods = wait_for(lambda: _pods(kube, ns, 1), timeout=30, message="s1's pod")

    patch_appdef_spec(kube, ns, "java", requestsCpu="1 Gi", minInstances=1)
    run_until_quiet(kube, ns, ROUTE_MODE)
    custom_objects.delete_namespaced_custom_object(
        v.GROUP, v.SESSION_API_VERSION.split("/")[1], ns, "sessions", "s1",
        body=V1DeleteOptions(propagation_policy="Orphan"))
    wait_for(lambda: kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s1") is None,
             timeout=30, message="s1 deleted")
    run_until_quiet(kube, ns, ROUTE_MODE)

    assert emails(kube, ns, "java", 1) == ""
    assert f"{s1_uid}-route" not in session_routes(kube, ns), "the ended user's route stays"
    assert _holder_traces(kube, ns, 1) == []
    wait_for(lambda: _pods(kube, ns, 1), timeout=30, message="the reset pod's successor")
    assert not _pods(kube, ns, 1) & old_pods
    # minInstances 1 is not obeyed while the spec is invalid: instances 1 and 3 stay.
    assert _ids(kube, ns) == {1, 2, 3}
    assert emails(kube, ns, "java", 2) == USERS[2]
    assert f"{session(kube, ns, 's2')['metadata']['uid']}-route" in session_routes(kube, ns)

    patch_appdef_spec(kube, ns, "java", requestsCpu="100m")
    run_until_quiet(kube, ns, ROUTE_MODE)
    # Fixed: minInstances 1 now holds, instance 2 stays with its holder.
    assert _ids(kube, ns) == {1, 2}
    assert emails(kube, ns, "java", 2) == USERS[2]
    assert_invariants(kube, ns)
