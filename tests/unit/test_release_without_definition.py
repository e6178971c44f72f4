"""Issue #27, point 3, as pure decisions: a release while the AppDefinition is invalid.

`decide_release_without_definition` sees an instance's own objects and the Sessions, never the
spec; it must clear a gone holder's traces in a release's order, guard every write as a release
does, and never make, replace or delete a part (that waits for a valid spec).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, cast

from tests.unit.pool_fixtures import appdef, instance, observed, session, with_objects
from warmpool.controller.reconcile import _with_own_selector
from warmpool.kube.cache import strip
from warmpool.kube.reader import Reader
from warmpool.pool import builders
from warmpool.pool.actions import Create, Delete, Patch, Report, ResetPods
from warmpool.pool.decide import State, unguarded_deletes
from warmpool.pool.instances import InstanceView
from warmpool.pool.model import Invalid, ingress_name_of, parse_appdefinition
from warmpool.pool.parts import PARTS, Part
from warmpool.pool.release import decide_release_without_definition, own_facts
from warmpool.testing.world import appdef_body, appdef_spec

INVALID = Invalid("spec.minInstances (5001) is above the ceiling of 5000 instances",
                  ingress_name="shared")
NO_ROUTES = builders.PoolSettings(routes="none", url_probe=False)
INGRESS = builders.PoolSettings(routes="ingress", url_probe=False)
ROUTES = builders.PoolSettings(url_probe=False)


def decide(view, sessions=(), settings=NO_ROUTES, **kw):  # type: ignore[no-untyped-def]
    return decide_release_without_definition(view, "java", INVALID, list(sessions),
                                             settings=settings, **kw)


def released_view(gc_done: bool = False) -> InstanceView:
    """Instance 1 of a Session that is gone; `gc_done`: its references already stripped."""
    a = appdef(min_instances=2)
    view = instance(a, 1, holder=session(instance=1, deleting=True))
    if not gc_done:
        return view
    objects = {}
    for part, obj in view.existing():
        obj = copy.deepcopy(obj)
        obj["metadata"]["ownerReferences"] = [a.owner_reference()]
        objects[part] = obj
    return InstanceView(1, objects)


def test_a_gone_holder_is_released_in_order_without_the_spec() -> None:
    gone = session(instance=1, deleting=True)
    view = released_view()
    p = decide(view, [gone])
    assert p.state is State.INVALID and p.holder is None and p.released
    writes = [a for a in p.actions if not isinstance(a, Report)]
    assert isinstance(writes[0], Patch) and writes[0].part is Part.EMAIL_CONFIGMAP
    assert writes[0].patch["data"] == {"authenticated-emails-list": ""}
    parts = [getattr(a, "part", None) for a in writes]
    reset = next(i for i, a in enumerate(writes) if isinstance(a, ResetPods))
    # The Deployment's own selector, and only the pods of that very Deployment (issue #27.5).
    deployment = view.get(Part.DEPLOYMENT)
    assert deployment is not None
    assert writes[reset] == ResetPods("java-17-1", deployment["metadata"]["name"],
                                      deployment["metadata"].get("uid", ""))
    assert parts.index(Part.DEPLOYMENT) < reset < parts.index(Part.EXTERNAL_SERVICE)
    last = writes[-1]  # the Session's reference, the release's marker, goes last
    assert isinstance(last, Patch) and last.part is Part.EXTERNAL_SERVICE
    assert [r["kind"] for r in last.patch["metadata"]["ownerReferences"]] == ["AppDefinition"]
    assert last.patch["metadata"]["labels"]["theia-cloud.io/session"] is None
    # Every patch is guarded by the version it was decided on; nothing made or deleted.
    for a in writes:
        if isinstance(a, Patch):
            obj = view.get(a.part)
            assert a.resource_version == obj["metadata"]["resourceVersion"]
    assert not any(isinstance(a, Create | Delete) for a in p.actions)
    (report,) = [a for a in p.actions if isinstance(a, Report)]
    assert report.reason == "ReleasedWithoutDefinition" and not report.warning
    assert "5001" in report.message and report.regarding["name"] == "java"


def test_after_the_garbage_collector_the_labels_and_allow_list_still_say_release() -> None:
    p = decide(released_view(gc_done=True), [])
    assert p.released
    assert any(isinstance(a, ResetPods) for a in p.actions)
    emails = next(a for a in p.actions if isinstance(a, Patch))
    assert emails.part is Part.EMAIL_CONFIGMAP and emails.patch["data"] == {
        "authenticated-emails-list": ""}


def test_a_live_holder_keeps_its_instance_as_it_is() -> None:
    holder = session(instance=1)
    view = instance(appdef(), 1, holder=holder)
    p = decide(view, [holder])
    assert p == dataclasses.replace(p, actions=[]) and p.holder == holder
    assert p.state is State.INVALID and not p.released


def test_a_free_instance_is_left_alone_whatever_the_spec_would_say() -> None:
    # Above any minInstances, at an old generation: a valid spec would delete or replace it.
    p = decide(instance(appdef(min_instances=0), 7))
    assert p.actions == [] and not p.released


def test_a_missing_part_is_not_made_and_no_appdefinition_reference_is_invented() -> None:
    gone = session(instance=1, deleting=True)
    view = with_objects(released_view(), PROXY_CONFIGMAP=None)
    p = decide(view, [gone])
    assert not any(isinstance(a, Create) for a in p.actions)
    for a in p.actions:
        if isinstance(a, Patch) and "ownerReferences" in a.patch.get("metadata", {}):
            assert all(r["kind"] != "Session" for r in a.patch["metadata"]["ownerReferences"])


def test_the_released_sessions_route_goes_first_guarded_by_the_external_service() -> None:
    gone = session(instance=1, deleting=True)
    view = released_view()
    route = observed({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                      "metadata": {"name": "uid-s1-route", "labels": {
                          "app.kubernetes.io/component": "session",
                          "app.kubernetes.io/part-of": "theia-cloud",
                          "theia-cloud.io/session-uuid": "uid-s1"},
                          "ownerReferences": [gone.owner_reference()]},
                      "spec": {}})
    view = dataclasses.replace(view, routes=(route,))
    p = decide(view, [gone], settings=ROUTES)
    first, second = p.actions[:2]
    ext = view.get(Part.EXTERNAL_SERVICE)
    assert isinstance(first, Patch) and first.part is Part.EXTERNAL_SERVICE
    assert first.patch == {} and first.resource_version == ext["metadata"]["resourceVersion"]
    assert isinstance(second, Delete) and second.part is Part.ROUTE
    assert (second.uid, second.resource_version) == (
        route["metadata"]["uid"], route["metadata"]["resourceVersion"])
    emails = next(i for i, a in enumerate(p.actions)
                  if isinstance(a, Patch) and a.part is Part.EMAIL_CONFIGMAP)
    assert emails > 1


def test_the_ingress_rule_is_found_by_the_external_services_name() -> None:
    gone = session(instance=1, deleting=True)
    view = released_view()
    ext = view.get(Part.EXTERNAL_SERVICE)["metadata"]["name"]

    def path(service: str, at: str) -> dict[str, object]:
        return {"path": at, "pathType": "ImplementationSpecific",
                "backend": {"service": {"name": service, "port": {"number": 3000}}}}

    shared = {"metadata": {"name": "shared", "resourceVersion": "77"}, "spec": {"rules": [
        {"host": "h"},
        {"host": "h", "http": {"paths": [path(ext, "/java-17-1(/|$)(.*)")]}},
        {"host": "h", "http": {"paths": [path("other-svc", "/java-17-2(/|$)(.*)")]}}]}}
    p = decide(view, [gone], settings=INGRESS, shared_ingress=shared)
    rule = next(a for a in p.actions if isinstance(a, Patch) and a.part is Part.INGRESS)
    assert rule.resource_version == "77"
    assert rule.patch["spec"]["rules"] == [shared["spec"]["rules"][0],
                                           shared["spec"]["rules"][2]]
    order = [a.part for a in p.actions if isinstance(a, Patch)]
    assert order[0] is Part.EXTERNAL_SERVICE and order[1] is Part.INGRESS  # guard, then rule
    # Without the Ingress in the read, the allow-list still goes.
    p = decide(view, [gone], settings=INGRESS, shared_ingress=None)
    assert not any(isinstance(a, Patch) and a.part is Part.INGRESS for a in p.actions)
    assert any(isinstance(a, Patch) and a.part is Part.EMAIL_CONFIGMAP for a in p.actions)


def test_a_release_on_a_cached_view_reads_its_deployment_whole_from_the_server() -> None:
    """A worker's cache keeps a Deployment's metadata alone (issue #28), so the selector a
    release resets by is not in its view: it is read from the server, one GET of that
    Deployment, and only where a holder's trace is on the instance."""
    view = released_view()
    stripped = InstanceView(1, {part: strip(part.kind, {**obj, "kind": part.kind})
                                for part, obj in view.existing()})
    cached = stripped.get(Part.DEPLOYMENT)
    assert cached is not None and "spec" not in cached
    assert own_facts(stripped).pod_selector is None  # undecidable from the cache alone
    asked: list[tuple[str, str, bool]] = []

    class Server:
        def object(self, kind: str, namespace: str, name: str, *, fresh: bool = False
                   ) -> dict[str, Any] | None:
            asked.append((kind, name, fresh))
            return copy.deepcopy(dict(view.get(Part.DEPLOYMENT) or {}))

    whole = _with_own_selector(cast(Reader, Server()), "ns", stripped)
    assert asked == [("Deployment", cached["metadata"]["name"], True)]
    assert (own_facts(whole).pod_selector, own_facts(whole).problem) == ("java-17-1", None)
    reset = [a for a in decide(whole, [session(instance=1, deleting=True)]).actions
             if isinstance(a, ResetPods)]
    assert [a.app_selector for a in reset] == ["java-17-1"]
    # Read whole already, or nothing to release: nothing asked.
    asked.clear()
    _with_own_selector(cast(Reader, Server()), "ns", view)
    free = InstanceView(1, {part: strip(part.kind, {**obj, "kind": part.kind})
                            for part, obj in instance(appdef(min_instances=2), 1).existing()})
    assert _with_own_selector(cast(Reader, Server()), "ns", free) is free
    assert asked == []


def test_a_deployment_selector_that_is_not_the_instances_is_reported_not_used() -> None:
    gone = session(instance=1, deleting=True)
    view = released_view()
    dep = copy.deepcopy(view.get(Part.DEPLOYMENT))
    # Another pool's selector in the Deployment alone (its Services' labels disagree),
    # one that names another instance, too long, empty, no string, not a label value.
    for bad in ("control-1", "java-17-2", "x" * 70 + "-1", "", None, 5, "a b-1"):
        dep["spec"]["selector"]["matchLabels"]["app"] = bad
        p = decide(with_objects(view, DEPLOYMENT=dep), [gone])
        assert not any(isinstance(a, ResetPods) for a in p.actions), bad
        (warning,) = [a for a in p.actions if isinstance(a, Report) and a.warning]
        assert warning.reason == "PodsNotReset"
        assert warning.regarding == {"kind": "Deployment", "name": dep["metadata"]["name"]}
        assert "spec.selector.matchLabels.app" in warning.message and len(warning.message) < 400
        assert any(isinstance(a, Patch) and a.part is Part.EMAIL_CONFIGMAP for a in p.actions)


def test_a_services_app_label_edited_by_hand_stops_the_reset_not_the_release() -> None:
    gone = session(instance=1, deleting=True)
    view = released_view()
    svc = copy.deepcopy(view.get(Part.INTERNAL_SERVICE))
    svc["metadata"]["labels"]["app"] = "control-1"
    p = decide(with_objects(view, INTERNAL_SERVICE=svc), [gone])
    assert not any(isinstance(a, ResetPods) for a in p.actions)
    assert [a.reason for a in p.actions if isinstance(a, Report) and a.warning] == [
        "PodsNotReset"]
    assert p.actions[0].part is Part.EMAIL_CONFIGMAP


def test_without_the_external_service_in_the_read_the_server_is_asked_first() -> None:
    gone = session(instance=1, deleting=True)
    view = with_objects(released_view(), EXTERNAL_SERVICE=None)
    p = decide(view, [gone])
    assert any(isinstance(a, ResetPods) for a in p.actions)
    assert unguarded_deletes(view, p)  # the controller reads the server's view before it
    assert own_facts(view).external_service is None


def test_a_double_claim_on_this_instance_is_released_here_too() -> None:
    s = session(instance=2)
    view = instance(appdef(), 1, holder=s)
    p = decide(view, [s], held_elsewhere={s.uid: frozenset({1, 2})})
    assert p.released and any(isinstance(a, ResetPods) for a in p.actions)


def test_the_ingress_name_survives_an_otherwise_invalid_spec_within_its_grammar() -> None:
    def body(**spec: object) -> dict[str, object]:
        return appdef_body("ns", "java", appdef_spec("java", min_instances=5001,
                                                     max_instances=5001, **spec),
                           metadata={"uid": "aaaa-bbbb-381261d79c23"})

    parsed = parse_appdefinition(body())
    assert isinstance(parsed, Invalid) and parsed.ingress_name == "theia-cloud-demo-ws-ingress"
    for bad in ("Upper", "a_b", "-a", "a" * 254, "a\nb", 7, ["x"], ""):
        assert ingress_name_of(body(ingressname=bad)) == "", bad
    assert ingress_name_of(body(ingressname=" ws.ingress ")) == "ws.ingress"
    assert ingress_name_of({"spec": "nope"}) == "" and ingress_name_of({}) == ""


def test_every_part_of_a_held_instance_is_untouched_whatever_is_missing() -> None:
    holder = session(instance=1)
    full = instance(appdef(), 1, holder=holder)
    for part in PARTS:
        p = decide(with_objects(full, **{part.name: None}), [holder])
        assert p.actions == [], part
