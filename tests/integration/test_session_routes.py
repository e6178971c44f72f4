"""session-lifecycle §1 and §3 on the real control plane: each holder's HTTPRoute.

The controller runs in-process and sequentially (``run_until_quiet``), against kube-apiserver
with the vendored Gateway API CRD and a garbage collector that honours the route's owner
reference. Each test ends with the invariant checker, whose R1/R2 say "a Session holds k ⇔ its
route exists and sends to k's external Service".
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.crd_sets import BOTH_CRD_SETS
from tests.pool_world import (
    assert_invariants,
    held_instance,
    instance_objects,
    owner_kinds,
    session,
    session_routes,
)
from tests.waiting import wait_for
from warmpool.controller.sequential import run_until_quiet
from warmpool.kube.api import Kube
from warmpool.kube.reflector import Reflector, Watched, rv_int
from warmpool.pool import routes
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings
from warmpool.pool.model import AppDefinition, parse_appdefinition, parse_session
from warmpool.testing.gateway import GATEWAY
from warmpool.testing.world import (
    HOST,
    SHARED_ROUTE,
    USERS,
    create_appdef,
    create_session,
    create_shared_route,
    delete_session,
    patch_appdef_spec,
)

pytestmark = BOTH_CRD_SETS


def _route_of(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    uid = session(kube, ns, name)["metadata"]["uid"]
    return kube.get(v.ROUTE_API_VERSION, v.ROUTE_KIND, ns, f"{uid}-route")


def _external_service(kube: Kube, ns: str, k: int) -> str:
    return next(o["metadata"]["name"] for key, o in instance_objects(kube, ns, "java", k).items()
                if key.startswith("Service/")
                and (o["metadata"].get("labels") or {}).get(v.LABEL_SERVICE_TYPE) is None)


def _claim(kube: Kube, ns: str, count: int, settings: PoolSettings | None = None
           ) -> dict[str, int | None]:
    for i in range(1, count + 1):
        create_session(kube, ns, f"s{i}", USERS[i])
    run_until_quiet(kube, ns, settings)
    return {f"s{i}": held_instance(kube, ns, f"s{i}") for i in range(1, count + 1)}


def test_a_claimed_session_gets_theia_clouds_route_byte_for_byte(kube, namespace) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=2, spec_name="Java_17-latest")
    # The probe off (no gateway routes here): the URL comes with HANDLED.
    settings = PoolSettings(url_probe=False)
    run_until_quiet(kube, ns, settings)
    held = _claim(kube, ns, 1, settings)
    k = held["s1"]
    assert k == 1
    s1 = session(kube, ns, "s1")
    route = _route_of(kube, ns, "s1")
    assert route is not None
    meta = route["metadata"]
    assert meta["ownerReferences"] == [{"apiVersion": "theia.cloud/v1beta8", "kind": "Session",
                                        "name": "s1", "uid": s1["metadata"]["uid"]}]
    assert meta["labels"] == {
        "theia-cloud.io/session": "s1", "theia-cloud.io/session-uuid": s1["metadata"]["uid"],
        "theia-cloud.io/user": "user1_at_example_com",
        "theia-cloud.io/app-definition": "Java_17-latest",
        "app.kubernetes.io/component": "session", "app.kubernetes.io/part-of": "theia-cloud"}
    shared = kube.get(v.ROUTE_API_VERSION, v.ROUTE_KIND, ns, SHARED_ROUTE)
    assert shared is not None
    # The shared route as stored (the server's defaults included), verbatim.
    assert route["spec"]["parentRefs"] == shared["spec"]["parentRefs"]
    assert route["spec"]["parentRefs"][0]["name"] == GATEWAY
    assert route["spec"]["hostnames"] == [HOST]
    path = "/Java_17-latest-1"  # the raw spec.name: case and `_` kept
    redirect, prefix = route["spec"]["rules"]
    assert redirect["matches"] == [{"path": {"type": "Exact", "value": path}}]
    assert redirect["filters"] == [{"type": "RequestRedirect", "requestRedirect": {
        "statusCode": 302, "path": {"type": "ReplaceFullPath", "replaceFullPath": f"{path}/"}}}]
    assert prefix["matches"] == [{"path": {"type": "PathPrefix", "value": f"{path}/"}}]
    assert prefix["filters"] == [
        {"type": "RequestHeaderModifier", "requestHeaderModifier": {
            "set": [{"name": "X-Forwarded-Uri", "value": "%PATH(NQ)%"}]}},  # no query (#27)
        {"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch",
                                                       "replacePrefixMatch": "/"}}}]
    assert prefix["backendRefs"] == [{"group": "", "kind": "Service", "weight": 1,
                                      "name": _external_service(kube, ns, 1), "port": 3000}]
    # The allow-list was the holder's before the route existed: etcd's revisions order the
    # namespace's writes, and neither object has been written since.
    email = next(o for key, o in instance_objects(kube, ns, "java", 1).items()
                 if (o["metadata"].get("labels") or {}).get(v.LABEL_TEMPLATE_PURPOSE) == "emails")
    assert email["data"]["authenticated-emails-list"] == USERS[1]
    assert int(email["metadata"]["resourceVersion"]) < int(meta["resourceVersion"])
    status = s1["status"]
    assert status["operatorStatus"] == v.STATUS_HANDLED
    # No scheme, a trailing slash (clients open https://${url}).
    assert status["url"] == f"{HOST}{path}/"
    assert_invariants(kube, ns)


@pytest.mark.parametrize("release", ["before-gc", "after-gc"])
def test_s1_with_routes_claimed_routes_stay_and_released_ones_go(
    kube, namespace, release
) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=5)
    run_until_quiet(kube, ns)
    held = _claim(kube, ns, 5)
    assert sorted(held.values()) == [1, 2, 3, 4, 5]
    before = {n: _route_of(kube, ns, n) for n in held}
    assert all(before.values())

    patch_appdef_spec(kube, ns, "java", minInstances=2)
    run_until_quiet(kube, ns)
    for name in held:  # every claimed route intact
        route = _route_of(kube, ns, name)
        assert route is not None and route["metadata"]["uid"] == \
            before[name]["metadata"]["uid"]  # type: ignore[index]
        assert route["spec"] == before[name]["spec"]  # type: ignore[index]
    assert_invariants(kube, ns)

    released = [n for n, k in held.items() if k is not None and k > 2]
    uids = {n: session(kube, ns, n)["metadata"]["uid"] for n in released}
    for name in released:
        delete_session(kube, ns, name)
    if release == "after-gc":
        # The controller is "stopped": the garbage collector takes the routes (owned by their
        # Sessions) and strips the Session references from the pool objects.
        wait_for(lambda: not any(f"{u}-route" in session_routes(kube, ns)
                                 for u in uids.values()),
                 timeout=90, message="GC to delete the released Sessions' routes")
    run_until_quiet(kube, ns)
    routes = session_routes(kube, ns)
    assert not any(f"{u}-route" in routes for u in uids.values())
    assert len(routes) == 2
    for k in (3, 4, 5):
        wait_for(lambda k=k: not instance_objects(kube, ns, "java", k), timeout=30,
                 message=f"instance {k} to be deleted")
    assert_invariants(kube, ns)


def test_a_route_deleted_or_edited_by_hand_is_restored(kube, namespace) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=2)
    run_until_quiet(kube, ns)
    _claim(kube, ns, 1)
    route = _route_of(kube, ns, "s1")
    assert route is not None
    name, spec = route["metadata"]["name"], route["spec"]

    kube.merge_patch(v.ROUTE_API_VERSION, v.ROUTE_KIND, ns, name, {
        "metadata": {"labels": {"theia-cloud.io/user": "someone-else", "team": "kept"},
                     "annotations": {"note": "kept"}},
        "spec": {"hostnames": ["evil.example.com"],
                 "rules": [{"backendRefs": [{"name": "elsewhere", "port": 80}]}]}})
    run_until_quiet(kube, ns)
    edited = _route_of(kube, ns, "s1")
    assert edited is not None and edited["spec"] == spec
    assert edited["metadata"]["labels"]["theia-cloud.io/user"] == "user1_at_example_com"
    assert edited["metadata"]["labels"]["team"] == "kept"  # foreign labels left alone
    assert edited["metadata"]["annotations"]["note"] == "kept"  # foreign annotations too

    kube.delete(v.ROUTE_API_VERSION, v.ROUTE_KIND, ns, name)
    wait_for(lambda: _route_of(kube, ns, "s1") is None, timeout=30, message="route deleted")
    run_until_quiet(kube, ns)
    again = _route_of(kube, ns, "s1")
    assert again is not None and again["spec"] == spec
    assert_invariants(kube, ns)


def test_no_claim_while_the_shared_route_is_missing_and_served_once_it_appears(
    kube, namespace
) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=2, shared_route=False)
    run_until_quiet(kube, ns)
    create_session(kube, ns, "s1", USERS[1])
    run_until_quiet(kube, ns)
    status = session(kube, ns, "s1").get("status") or {}
    assert status.get("operatorStatus") == v.STATUS_HANDLING
    assert status.get("operatorMessage") == "HTTPRoute not available."
    assert held_instance(kube, ns, "s1") is None
    for k in (1, 2):  # nothing claimed: no Service references the Session
        assert all(owner_kinds(o) == ["AppDefinition"]
                   for o in instance_objects(kube, ns, "java", k).values())
    assert not session_routes(kube, ns)
    events, _ = kube.list("v1", "Event", ns)
    warned = [e for e in events if e.get("reason") == "RouteMissing"
              and e["involvedObject"]["kind"] == "AppDefinition"]
    assert warned and warned[0]["type"] == "Warning"
    assert_invariants(kube, ns)

    shared = create_shared_route(kube, ns)
    run_until_quiet(kube, ns)
    assert session(kube, ns, "s1")["status"]["operatorStatus"] == v.STATUS_HANDLED
    assert _route_of(kube, ns, "s1") is not None
    # The shared route is never written.
    now = kube.get(v.ROUTE_API_VERSION, v.ROUTE_KIND, ns, SHARED_ROUTE)
    assert now is not None
    assert now["metadata"]["resourceVersion"] == shared["metadata"]["resourceVersion"]
    assert_invariants(kube, ns)


def test_release_deletes_the_route_before_the_allow_list_is_cleared(kube, namespace) -> None:
    """In watch order: the route's deletion comes before the e-mail list's clearing (etcd's
    revisions order every write of the namespace)."""
    ns = namespace
    create_appdef(kube, ns, min_instances=2)
    run_until_quiet(kube, ns)
    _claim(kube, ns, 1)
    assert _route_of(kube, ns, "s1") is not None
    seen: list[tuple[int, str]] = []

    def on_route(etype: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if etype == "DELETED":
            seen.append((rv_int(obj), "route deleted"))

    def on_configmap(etype: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        data = obj.get("data") or {}
        if "authenticated-emails-list" in data and not data["authenticated-emails-list"]:
            seen.append((rv_int(obj), "allow-list cleared"))

    stop = threading.Event()
    watches = [Reflector(kube, Watched(kind, api_version), ns, handler,
                         summarize=lambda _kind, obj: obj)
               for kind, api_version, handler in ((v.ROUTE_KIND, v.ROUTE_API_VERSION, on_route),
                                                  ("ConfigMap", "v1", on_configmap))]
    for r in watches:
        r.start(stop)
    for r in watches:
        assert r.synced.wait(30), f"the {r.name} watch listed"
    # A finalizer keeps the Session (deletionTimestamp set) and so keeps the garbage
    # collector from taking its route: the deletion seen is the release's own.
    kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s1",
                     {"metadata": {"finalizers": ["test.warmpool.io/hold"]}})
    delete_session(kube, ns, "s1")
    run_until_quiet(kube, ns, settings=PoolSettings())
    kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s1",
                     {"metadata": {"finalizers": None}})
    try:
        wait_for(lambda: {w for _, w in seen} >= {"route deleted", "allow-list cleared"},
                 timeout=30, message="both writes seen on the watches")
    finally:
        stop.set()
    order = [what for _, what in sorted(seen)]
    assert order.index("route deleted") < order.index("allow-list cleared"), seen
    assert_invariants(kube, ns)


def test_a_route_the_server_refuses_puts_the_session_in_error_with_javas_message(
    kube, namespace
) -> None:
    """A path longer than the CRD allows (1024 characters; WARMPOOL_INSTANCES_PATH is the
    operator's): the server refuses the route with a 422, for good. (A bad hostname prefix,
    the trigger before issue #27, now makes the AppDefinition invalid before any claim.)"""
    ns = namespace
    settings = PoolSettings(use_paths=True, instances_path="p" * 1100)
    create_appdef(kube, ns, min_instances=1)
    run_until_quiet(kube, ns, settings)
    create_session(kube, ns, "s1", USERS[1])
    run_until_quiet(kube, ns, settings)
    status = session(kube, ns, "s1")["status"]
    assert (status["operatorStatus"], status["operatorMessage"]) == (
        v.STATUS_ERROR, "Failed to edit HTTPRoute.")
    assert held_instance(kube, ns, "s1") == 1  # stays claimed until the Session goes, as Java
    assert _route_of(kube, ns, "s1") is None
    events, _ = kube.list("v1", "Event", ns)
    assert any(e.get("reason") == "RouteRefused" and e["type"] == "Warning" for e in events)
    delete_session(kube, ns, "s1")
    run_until_quiet(kube, ns, settings)
    assert_invariants(kube, ns)


def test_a_bad_hostname_prefix_is_refused_at_its_appdefinition_not_at_each_claim(
    kube, namespace
) -> None:
    """No hostnames on the shared route: the prefixes make them, and "Bad_" is not a valid
    hostname. Before issue #27 every claim's route was refused (each Session ERROR); now the
    AppDefinition is invalid, naming the entry (its pool left as it is), and its Session is
    neither routed nor failed."""
    ns = namespace
    create_shared_route(kube, ns, hostnames=())
    create_appdef(kube, ns, min_instances=1)
    run_until_quiet(kube, ns)
    patch_appdef_spec(kube, ns, "java", ingressHostnamePrefixes=["Bad_"])
    create_session(kube, ns, "s1", USERS[1])
    run_until_quiet(kube, ns)
    assert (session(kube, ns, "s1").get("status") or {}).get("operatorStatus") != \
        v.STATUS_ERROR
    assert _route_of(kube, ns, "s1") is None
    events, _ = kube.list("v1", "Event", ns)
    assert any(e.get("reason") == "InvalidAppDefinition" and "spec.ingressHostnamePrefixes[0] "
               "must be hostname labels" in e.get("message", "") for e in events)
    assert not any(e.get("reason") == "RouteRefused" for e in events)


def test_a_route_orphaned_without_the_garbage_collector_is_swept(kube, namespace) -> None:
    """A Session deleted with propagationPolicy Orphan leaves its route behind (and its
    instance's references, which the release strips): the pool's resync deletes the route,
    and leaves alone a route that another owner holds too."""
    ns = namespace
    create_appdef(kube, ns, min_instances=2)
    run_until_quiet(kube, ns)
    _claim(kube, ns, 2)
    orphan = _route_of(kube, ns, "s1")
    kept = _route_of(kube, ns, "s2")
    assert orphan is not None and kept is not None
    # s2's route gets a second owner: it must survive its Session.
    cm = kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": "other-owner", "namespace": ns}})
    refs = [*kept["metadata"]["ownerReferences"],
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "other-owner",
             "uid": cm["metadata"]["uid"]}]
    kube.merge_patch(v.ROUTE_API_VERSION, v.ROUTE_KIND, ns, kept["metadata"]["name"],
                     {"metadata": {"ownerReferences": refs}})
    # Point both routes away from their instances, as a hand edit might: no instance's own
    # job leads to them any more, only the sweep does.
    for route in (orphan, kept):
        kube.merge_patch(v.ROUTE_API_VERSION, v.ROUTE_KIND, ns, route["metadata"]["name"],
                         {"spec": {"rules": [{"backendRefs": [{"name": "gone", "port": 80}]}]}})
    for name in ("s1", "s2"):
        uid = session(kube, ns, name)["metadata"]["uid"]
        kube.dyn.resources.get(api_version=v.SESSION_API_VERSION, kind=v.SESSION_KIND).delete(
            name=name, namespace=ns, body={"propagationPolicy": "Orphan",
                                           "preconditions": {"uid": uid}})
    wait_for(lambda: kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s1") is None
             and kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s2") is None,
             timeout=30, message="both Sessions gone")

    def orphaned() -> bool:  # the GC has taken the Sessions' references off everything
        objects = [*session_routes(kube, ns).values(),
                   *(o for k in (1, 2) for o in instance_objects(kube, ns, "java", k).values())]
        return all("Session" not in owner_kinds(o) for o in objects)
    wait_for(orphaned, timeout=90, message="the GC to orphan the routes and instances")
    run_until_quiet(kube, ns)
    left = session_routes(kube, ns)
    assert orphan["metadata"]["name"] not in left
    assert kept["metadata"]["name"] in left  # held by another owner too: never deleted


def test_a_session_left_with_no_instance_loses_its_route(kube, namespace) -> None:
    """Its AppDefinition deleted while it holds an instance, then that instance's objects
    deleted by hand (they are not rebuilt without an AppDefinition): the Session holds
    nothing, goes to ERROR, and its route goes too (R2: no route without a holder)."""
    ns = namespace
    create_appdef(kube, ns, min_instances=1)
    run_until_quiet(kube, ns)
    _claim(kube, ns, 1)
    assert _route_of(kube, ns, "s1") is not None
    kube.delete(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java")
    wait_for(lambda: kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java") is None,
             timeout=30, message="the AppDefinition gone")
    for key, obj in instance_objects(kube, ns, "java", 1).items():
        kind = key.split("/")[0]
        kube.delete("apps/v1" if kind == "Deployment" else "v1", kind, ns,
                    obj["metadata"]["name"])
    wait_for(lambda: not instance_objects(kube, ns, "java", 1), timeout=30,
             message="instance 1's objects gone")
    run_until_quiet(kube, ns)
    assert session(kube, ns, "s1")["status"]["operatorStatus"] == v.STATUS_ERROR
    assert _route_of(kube, ns, "s1") is None
    # I1 names the objects deleted by hand (nothing can rebuild them without an
    # AppDefinition); the routes' invariants hold.
    from warmpool.invariants import check

    assert [str(x) for x in check(kube, ns) if x.invariant.startswith("R")] == []


def test_a_claim_its_appdefinition_outlived_loses_its_route(kube, namespace) -> None:
    """A burst claim creates its route before its status; its AppDefinition is deleted in
    between (the CI chaos tier, seed 2, left such a route for good). Replayed here as the
    claim leaves it: the deciding write (the Session's reference on the external Service) and
    the route made, the Session not yet annotated. The instance's job fails the claim (ERROR)
    and deletes the route with it (R2: no route without a holder)."""
    ns = namespace
    appdef = parse_appdefinition(create_appdef(kube, ns, min_instances=1))
    assert isinstance(appdef, AppDefinition)
    run_until_quiet(kube, ns)
    s1 = parse_session(create_session(kube, ns, "s1", USERS[1]))
    ext_name = _external_service(kube, ns, 1)
    ext = kube.get("v1", "Service", ns, ext_name)
    assert ext is not None
    kube.merge_patch("v1", "Service", ns, ext_name, {"metadata": {
        "ownerReferences": [*ext["metadata"]["ownerReferences"], s1.owner_reference()]}},
        resource_version=ext["metadata"]["resourceVersion"])
    shared = kube.get(v.ROUTE_API_VERSION, v.ROUTE_KIND, ns, SHARED_ROUTE)
    assert shared is not None
    kube.create(routes.desired_route(appdef, 1, s1, shared, PoolSettings()))
    assert _route_of(kube, ns, "s1") is not None

    kube.delete(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java")
    wait_for(lambda: list(instance_objects(kube, ns, "java", 1)) == [f"Service/{ext_name}"],
             timeout=90, message="GC to take the objects without the Session's reference")
    run_until_quiet(kube, ns)

    status = session(kube, ns, "s1").get("status") or {}
    assert status.get("operatorStatus") == v.STATUS_ERROR
    assert "deleted before the claim of instance 1 completed" in status.get("operatorMessage", "")
    assert _route_of(kube, ns, "s1") is None
    from warmpool.invariants import check

    assert [str(x) for x in check(kube, ns) if x.invariant.startswith("R")] == []
