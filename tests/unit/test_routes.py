"""session-lifecycle §1 and §3 as pure decisions: the holder's route in an instance's plan."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from tests.unit.pool_fixtures import appdef, instance, observed, session
from warmpool.kube.executor import _waves
from warmpool.pool import routes
from warmpool.pool import vocabulary as v
from warmpool.pool.actions import (
    AnnotateSession,
    Create,
    Delete,
    Patch,
    ProbeUrl,
    RefreshPods,
    Report,
    SetSessionStatus,
)
from warmpool.pool.builders import PoolSettings
from warmpool.pool.claim import ClaimWait, decide_claim
from warmpool.pool.decide import decide_instance
from warmpool.pool.parts import Part

ROUTING = PoolSettings(instances_host="ide.example.org", url_probe=False)
PROBED = PoolSettings(instances_host="ide.example.org")
SHARED: dict[str, Any] = observed({
    "apiVersion": v.ROUTE_API_VERSION, "kind": v.ROUTE_KIND,
    "metadata": {"name": "shared", "namespace": "ns"},
    # as stored: the server's defaults on parentRefs, its default rule
    "spec": {"parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                             "name": "gw", "namespace": "infra"}],
             "hostnames": [], "rules": [{"matches": [{"path": {"type": "PathPrefix",
                                                               "value": "/"}}]}]}})


def _stored(route: dict[str, Any]) -> dict[str, Any]:
    """`route` as the API server stores it: with the CRD's defaults filled in."""
    obj = observed(route)
    for rule in obj["spec"]["rules"]:
        for ref in rule.get("backendRefs", []):
            ref.setdefault("group", "")
            ref.setdefault("kind", "Service")
            ref.setdefault("weight", 1)
    return obj


def _decide(view, holders, **kw):  # type: ignore[no-untyped-def]
    return decide_instance(view, "java", appdef(), holders, proxy_template=None,
                           settings=kw.pop("settings", ROUTING), shared_route=kw.pop(
                               "shared", SHARED), **kw)


def _writes(plan: Any) -> list[Any]:
    """The plan's actions but its events (a claim's `Claimed` follows its status)."""
    return [a for a in plan.actions if not isinstance(a, Report)]


def test_the_route_comes_after_the_allow_list_and_before_handled() -> None:
    s1 = session("s1", instance=None, status="HANDLING")
    view = instance(appdef(), 1, holder=s1)
    plan = _decide(view, [s1])
    kinds = [type(a).__name__ for a in plan.actions]
    route = next(a for a in plan.actions if isinstance(a, Create) and a.part is Part.ROUTE)
    assert kinds.index("Create") > kinds.index("AnnotateSession")
    assert isinstance(_writes(plan)[-1], SetSessionStatus)
    assert _writes(plan)[-1].status["operatorStatus"] == v.STATUS_HANDLED
    assert _writes(plan)[-1].status["url"] == "ide.example.org/java-17-1/"  # no scheme
    body = route.body
    assert body["metadata"]["name"] == "uid-s1-route"
    assert body["spec"]["parentRefs"] == SHARED["spec"]["parentRefs"]
    # The shared route has no hostnames: the instances host, then each prefix before it.
    assert body["spec"]["hostnames"] == ["ide.example.org"]
    # The executor sends it once the allow-list's write has been answered, with the
    # annotation (and the pod refresh, if any), and before the status.
    waves = _waves(plan.actions)
    with_route = next(i for i, w in enumerate(waves) if route in w)
    allow_list = next((i for i, w in enumerate(waves)
                       if any(getattr(a, "part", None) is Part.EMAIL_CONFIGMAP for a in w)), -1)
    assert allow_list < with_route < next(i for i, w in enumerate(waves)
                                          if any(isinstance(a, SetSessionStatus) for a in w))
    assert all(isinstance(a, AnnotateSession | RefreshPods) for a in waves[with_route]
               if a is not route)


def test_paths_keep_the_raw_name_and_follow_use_paths() -> None:
    a = dataclasses.replace(appdef(), spec_name="Java_17")
    assert ROUTING.session_path(a, 3) == "/Java_17-3"
    with_paths = PoolSettings(instances_host="h", use_paths=True, instances_path=" instances ")
    assert with_paths.session_path(a, 3) == "/instances/Java_17-3"
    assert with_paths.session_url(a, 3) == "h/instances/Java_17-3/"
    prefixed = dataclasses.replace(a, ingress_hostname_prefixes=("*.", "x-"))
    assert routes.hostnames(prefixed, {"spec": {}}, with_paths) == ["h", "*.h", "x-h"]
    assert routes.hostnames(prefixed, {"spec": {"hostnames": ["a.b"]}}, with_paths) == ["a.b"]


def test_a_stored_route_with_the_servers_defaults_is_left_alone() -> None:
    s1 = session("s1", instance=1, status=v.STATUS_HANDLED)
    desired = routes.desired_route(appdef(), 1, s1, SHARED, ROUTING)
    view = dataclasses.replace(instance(appdef(), 1, holder=s1), routes=(_stored(desired),))
    assert _decide(view, [s1]).actions == []


def test_an_edited_route_converges_and_keeps_foreign_labels_and_annotations() -> None:
    s1 = session("s1", instance=1, status=v.STATUS_HANDLED)
    live = _stored(routes.desired_route(appdef(), 1, s1, SHARED, ROUTING))
    live["metadata"]["labels"]["team"] = "kept"
    live["metadata"]["labels"][v.LABEL_USER] = "someone"
    live["metadata"]["annotations"] = {"note": "kept"}
    live["spec"]["hostnames"] = ["evil.example.com"]
    view = dataclasses.replace(instance(appdef(), 1, holder=s1), routes=(live,))
    (patch,) = _decide(view, [s1]).actions
    assert isinstance(patch, Patch) and patch.part is Part.ROUTE
    assert patch.resource_version == live["metadata"]["resourceVersion"]
    assert patch.patch["spec"]["hostnames"] == ["ide.example.org"]
    assert patch.patch["metadata"]["labels"] == {v.LABEL_USER: "jane_at_example_com"}
    assert "annotations" not in patch.patch["metadata"]


def test_while_the_shared_route_is_missing_no_route_is_made_and_nothing_is_handled() -> None:
    s1 = session("s1", instance=None, status="HANDLING")
    plan = _decide(instance(appdef(), 1, holder=s1), [s1], shared=None)
    assert not any(isinstance(a, Create) and a.part is Part.ROUTE for a in plan.actions)
    status = [a for a in plan.actions if isinstance(a, SetSessionStatus)]
    assert [s.status for s in status] == [{"operatorStatus": v.STATUS_HANDLING,
                                           "operatorMessage": "HTTPRoute not available."}]
    # A route made before the shared one went is left as it is: it names its Gateway itself.
    held = session("s1", instance=1, status=v.STATUS_HANDLED)
    live = _stored(routes.desired_route(appdef(), 1, held, SHARED, ROUTING))
    view = dataclasses.replace(instance(appdef(), 1, holder=held), routes=(live,))
    assert _decide(view, [held], shared=None).actions == []


def test_no_claim_while_the_shared_route_is_missing() -> None:
    s1 = session("s1")
    pool = {k: instance(appdef(), k) for k in (1, 2)}
    decision = decide_claim(s1, appdef(), pool, [s1], routable=False)
    assert decision == ClaimWait("HTTPRoute not available.")


def test_release_deletes_the_route_first_guarded_by_the_external_service() -> None:
    gone = session("s1", instance=1, deleting=True)
    held = instance(appdef(), 1, holder=gone)
    route = _stored(routes.desired_route(appdef(), 1, gone, SHARED, ROUTING))
    view = dataclasses.replace(held, routes=(route,))
    plan = _decide(view, [gone])
    guard, delete, *rest = _writes(plan)
    ext = view.get(Part.EXTERNAL_SERVICE)
    assert isinstance(guard, Patch) and guard.part is Part.EXTERNAL_SERVICE
    assert guard.resource_version == ext["metadata"]["resourceVersion"] and guard.patch == {}
    assert isinstance(delete, Delete) and delete.part is Part.ROUTE
    assert (delete.uid, delete.resource_version) == (route["metadata"]["uid"],
                                                     route["metadata"]["resourceVersion"])
    email = next(i for i, a in enumerate(rest)
                 if isinstance(a, Patch) and a.part is Part.EMAIL_CONFIGMAP)
    assert email >= 0  # the allow-list is cleared after the route is gone
    # The external Service's own release patch still comes last, on the guard's version.
    assert isinstance(rest[-1], Patch) and rest[-1].part is Part.EXTERNAL_SERVICE


def test_another_sessions_route_is_deleted_but_not_one_someone_else_also_owns() -> None:
    s1 = session("s1", instance=1, status=v.STATUS_HANDLED)
    old = session("s0", user="old@example.com")
    mine = _stored(routes.desired_route(appdef(), 1, s1, SHARED, ROUTING))
    stray = _stored(routes.desired_route(appdef(), 1, old, SHARED, ROUTING))
    shared_owner = json.loads(json.dumps(stray))
    shared_owner["metadata"]["name"] = "uid-s9-route"
    shared_owner["metadata"]["labels"][v.LABEL_SESSION_UUID] = "uid-s9"
    shared_owner["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "x"}]
    view = dataclasses.replace(instance(appdef(), 1, holder=s1),
                               routes=(mine, stray, shared_owner))
    plan = _decide(view, [s1])
    deletes = [a for a in plan.actions if isinstance(a, Delete)]
    assert [d.name for d in deletes] == ["uid-s0-route"]
    assert isinstance(plan.actions[0], Patch) and plan.actions[0].part is Part.EXTERNAL_SERVICE


def test_a_claim_its_appdefinition_outlived_fails_then_loses_its_route() -> None:
    """A burst claim routes before its status; its AppDefinition is deleted in between (the
    CI chaos tier, seed 2): the instance job fails the claim, and the route must go with it,
    or it outlives its holder until the Session ends. After the ERROR, whose write tests the
    Session's version: a claim completed since refuses it, and keeps its route."""
    s1 = session("s1", status=v.STATUS_HANDLING)  # deciding write made, not yet annotated
    route = _stored(routes.desired_route(appdef(), 1, s1, SHARED, ROUTING))
    # A released Session's route too: not the holder's, so it goes first, as in a release.
    stray = _stored(routes.desired_route(appdef(), 1, session("s0"), SHARED, ROUTING))
    view = dataclasses.replace(instance(appdef(), 1, holder=s1), routes=(route, stray))
    for gone in (None, dataclasses.replace(appdef(), deleting=True)):
        plan = decide_instance(view, "java", gone, [s1], proxy_template=None,
                               settings=ROUTING, shared_route=SHARED)
        guard, first, *rest, status, delete = _writes(plan)
        assert isinstance(guard, Patch) and guard.part is Part.EXTERNAL_SERVICE
        assert guard.patch == {}
        assert isinstance(first, Delete) and first.name == stray["metadata"]["name"]
        assert isinstance(status, SetSessionStatus)
        assert status.status["operatorStatus"] == v.STATUS_ERROR
        assert status.resource_version == s1.resource_version
        assert isinstance(delete, Delete) and delete.name == route["metadata"]["name"]
        assert not any(isinstance(a, Delete | SetSessionStatus) for a in rest)
    # Already ERROR (its status written, the delete failed): the route still goes.
    failed = dataclasses.replace(s1, status=v.STATUS_ERROR)
    plan = decide_instance(view, "java", None, [failed], proxy_template=None,
                           settings=ROUTING, shared_route=SHARED)
    assert [d.name for d in plan.actions if isinstance(d, Delete)] == [
        stray["metadata"]["name"], route["metadata"]["name"]]
    # A holder whose claim completed keeps its route while it runs.
    done = session("s1", instance=1, status=v.STATUS_HANDLED)
    kept = dataclasses.replace(instance(appdef(), 1, holder=done), routes=(route, stray))
    plan = decide_instance(kept, "java", None, [done], proxy_template=None,
                           settings=ROUTING, shared_route=SHARED)
    assert [d.name for d in plan.actions if isinstance(d, Delete)] == [
        stray["metadata"]["name"]]


def test_without_routes_nothing_of_them_is_planned() -> None:
    s1 = session("s1", instance=None, status="HANDLING")
    plan = _decide(instance(appdef(), 1, holder=s1), [s1],
                   settings=PoolSettings(routes="none", url_probe=False), shared=None)
    assert not any(getattr(a, "part", None) is Part.ROUTE for a in plan.actions)
    assert isinstance(_writes(plan)[-1], SetSessionStatus)
    assert _writes(plan)[-1].status["operatorStatus"] == v.STATUS_HANDLED


def test_with_the_probe_on_handled_comes_without_the_url_and_a_probe_is_asked_for() -> None:
    s1 = session("s1", instance=None, status="HANDLING")
    plan = _decide(instance(appdef(), 1, holder=s1), [s1], settings=PROBED, now_ms=1234)
    status = next(a for a in plan.actions if isinstance(a, SetSessionStatus))
    assert status.status["operatorStatus"] == v.STATUS_HANDLED
    assert status.status["lastActivity"] == 1234 and "url" not in status.status
    probe = plan.actions[-1]
    assert isinstance(probe, ProbeUrl)
    assert (probe.target.uid, probe.target.instance, probe.target.url) == (
        "uid-s1", 1, "ide.example.org/java-17-1/")
    # Level-triggered: a HANDLED holder without its URL is probed again (a lost probe)...
    handled = session("s1", instance=1, status=v.STATUS_HANDLED)
    desired = _stored(routes.desired_route(appdef(), 1, handled, SHARED, ROUTING))
    view = dataclasses.replace(instance(appdef(), 1, holder=handled), routes=(desired,))
    assert [type(a) for a in _decide(view, [handled], settings=PROBED).actions] == [ProbeUrl]
    # ...and one with its URL, or with the probe's give-up, is not.
    for field, value in (("url", "ide.example.org/java-17-1/"), ("error", "551:x")):
        done = dataclasses.replace(handled, **{field: value})
        assert _decide(view, [done], settings=PROBED).actions == []
