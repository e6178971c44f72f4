"""The hostile-edit fault's bookkeeping and the liveness obligations, on hand-made snapshots.

What the checks conclude from an edit (masked, touching, in effect for how long) and which
obligations a snapshot holds decide whether a chaos run reports a violation; these pin them
down without a cluster. The fault and the check themselves run in the CI tier
(`test_chaos.py::test_chaos_ci_hostile_edits`).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.chaos.config import ChaosConfig
from tests.chaos.history import History
from tests.chaos.hostile import Edit, HostileEdits
from tests.chaos.liveness import obligations
from tests.chaos.watchdog import of_its_pool
from tests.chaos.world import World
from warmpool.pool import builders, naming, routes
from warmpool.pool import vocabulary as v
from warmpool.pool.model import AppDefinition, parse_appdefinition
from warmpool.pool.parts import Part
from warmpool.testing.world import appdef_body, appdef_spec, session_body, session_spec

pytestmark = pytest.mark.chaos

NS = "ns-a"


def _session(name: str, uid: str, appdef: str = "app", instance: str | None = None,
             user: str = "u@example.com") -> dict[str, Any]:
    meta: dict[str, Any] = {"uid": uid, "creationTimestamp": "2026-12-04T10:00:00Z"}
    if instance is not None:
        meta["annotations"] = {v.ANNOTATION_INSTANCE_ID: instance}
    return session_body(NS, name, session_spec(name, user, appdef), metadata=meta)


def _appdef(name: str = "app", max_instances: int = 2) -> dict[str, Any]:
    return appdef_body(NS, name, appdef_spec(name, min_instances=1,
                                             max_instances=max_instances),
                       metadata={"uid": f"{name}-uid-0000-0000", "generation": 1})


def _email_cm(appdef: dict[str, Any], k: int, emails: str,
              owners: list[dict[str, Any]]) -> dict[str, Any]:
    parsed = parse_appdefinition(appdef)
    assert isinstance(parsed, AppDefinition)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": builders.object_name(parsed, Part.EMAIL_CONFIGMAP, k),
                         "namespace": NS, "uid": f"cm-{k}",
                         "labels": {v.LABEL_TEMPLATE_PURPOSE: v.PURPOSE_EMAILS,
                                    v.LABEL_GENERATION: "1"},
                         "ownerReferences": owners},
            "data": {v.EMAILS_KEY: emails}}


def _world(appdefs: list[dict[str, Any]], sessions: list[dict[str, Any]],
           objects: list[dict[str, Any]] | None = None,
           route_items: list[dict[str, Any]] | None = None) -> World:
    return World("1", {NS: appdefs}, {NS: sessions}, {NS: objects or []}, {NS: route_items or []})


def _hostile() -> HostileEdits:
    return HostileEdits(None, [NS], ChaosConfig(seed=1), History(10))  # type: ignore[arg-type]


def _edit(**kw: Any) -> Edit:
    base: dict[str, Any] = dict(n=1, ns=NS, api_version=v.SESSION_API_VERSION,
                                kind=v.SESSION_KIND, name="s1", uid="uid-1",
                                field="annotation", key=v.ANNOTATION_INSTANCE_ID,
                                category="plausible", before="1", after="2", at=0.0,
                                tokens=("Session s1", "'s1'", "instance 1 of app"), pool="app")
    base.update(kw)
    return Edit(**base)


def test_a_hostile_instance_id_is_masked_only_while_it_is_in_effect() -> None:
    hostile = _hostile()
    edit = _edit()
    hostile.edits.append(edit)
    world = _world([_appdef()], [_session("s1", "uid-1", instance="2"),
                                 _session("s2", "uid-2", instance="2")])
    masked = hostile.mask(world)
    ids = {s["metadata"]["name"]: s["metadata"]["annotations"][v.ANNOTATION_INSTANCE_ID]
           for s in masked.sessions[NS]}
    # s1's hostile "2" reads as the "1" it replaced; s2's own "2" is untouched
    assert ids == {"s1": "1", "s2": "2"}
    # once the controller wrote another value, the truth is read as it is
    rewritten = _world([_appdef()], [_session("s1", "uid-1", instance="3")])
    assert hostile.mask(rewritten).sessions[NS][0]["metadata"]["annotations"][
        v.ANNOTATION_INSTANCE_ID] == "3"
    # and once the edit is over (healed or overwritten), nothing is masked
    edit.ended, edit.outcome = 5.0, "healed by the fault"
    assert hostile.mask(world) is world


def test_a_removed_annotation_is_masked_back_and_an_owner_edit_is_tracked() -> None:
    hostile = _hostile()
    hostile.edits.append(_edit(category="removed", after=None))
    world = _world([_appdef()], [_session("s1", "uid-1")])
    assert hostile.mask(world).sessions[NS][0]["metadata"]["annotations"] == {
        v.ANNOTATION_INSTANCE_ID: "1"}
    ref = {"apiVersion": v.SESSION_API_VERSION, "kind": v.SESSION_KIND, "name": "s9",
           "uid": "uid-9"}
    added = _edit(kind="Service", name="svc", uid="svc-uid", field="ownerReferences",
                  key="add", before=None, after=ref)
    svc = {"metadata": {"uid": "svc-uid", "ownerReferences": [ref]}}
    assert added.current(svc)
    assert not added.current({"metadata": {"uid": "svc-uid", "ownerReferences": []}})
    assert not added.current({"metadata": {"uid": "other", "ownerReferences": [ref]}})


def test_a_report_touches_an_edit_only_by_its_own_names() -> None:
    hostile = _hostile()
    hostile.edits.append(_edit())
    assert hostile.touching(f"{NS}: I3: instance 1 of app is held by ['s1', 's2']")
    assert hostile.touching(f"{NS}: I1: Session s1 holds instance 4 of app but ...")
    # another Session, instance, pool or namespace is judged as without the fault
    assert not hostile.touching(f"{NS}: I1: Session s12 holds instance 4 of app but ...")
    assert not hostile.touching(f"{NS}: I3: instance 1 of app2 is held by ['s3', 's4']")
    assert not hostile.touching(f"{NS}: I3: instance 11 of app is held by ['s3', 's4']")
    assert not hostile.touching("ns-b: I1: Session s1 holds instance 1 of app but ...")


def test_only_the_window_of_an_edit_is_covered() -> None:
    hostile = _hostile()
    first = _edit(at=2.0, ended=4.0)
    second = _edit(n=2, at=3.0, ended=6.0)
    assert hostile.covered([first, second], 0.0, 10.0) == pytest.approx(4.0)
    assert hostile.covered([first], 3.0, 10.0) == pytest.approx(1.0)
    assert hostile.covered([], 0.0, 10.0) == 0.0


def test_a_reference_to_another_pools_session_makes_no_holder() -> None:
    """pool-spec §4: a claimant is a Session of the instance's own AppDefinition. A hostile
    edit's plausible owner (a live Session of another pool) must not make the watchdog judge
    the controller's release of that instance a deletion of a held object (CI, stop 43)."""
    app, app2 = _appdef("app"), _appdef("app2")
    app["metadata"]["uid"] = "0d5a3c1e-0000-4000-8000-034e9528e140"
    app2["metadata"]["uid"] = "0d5a3c1e-0000-4000-8000-f57e419c34d7"
    uid12 = naming.short_uid(app["metadata"]["uid"])
    assert of_its_pool("app", uid12, [app, app2])
    assert not of_its_pool("app2", uid12, [app, app2])
    # its own AppDefinition deleted: the uid cannot be compared, the reference is believed
    assert of_its_pool("gone", uid12, [app, app2])


def test_liveness_obligations() -> None:
    app = _appdef(max_instances=1)
    holder = {"apiVersion": v.SESSION_API_VERSION, "kind": v.SESSION_KIND, "name": "gone",
              "uid": "uid-gone"}
    ended_list = _email_cm(app, 1, "old@example.com", [holder])
    route = {"apiVersion": v.ROUTE_API_VERSION, "kind": v.ROUTE_KIND,
             "metadata": {"name": routes.route_name("uid-gone"), "namespace": NS,
                          "labels": {v.LABEL_COMPONENT: "session",
                                     v.LABEL_PART_OF: "theia-cloud",
                                     v.LABEL_SESSION_UUID: "uid-gone"}},
             "spec": {}}
    waiting = _session("s1", "uid-1")
    invalid = _session("s2", "uid-2", user="not-an-address")
    found = obligations(_world([app], [waiting, invalid], [ended_list], [route]), [NS])
    assert set(found) == {(NS, "serve", "uid-1"), (NS, "revoke", ended_list["metadata"]["name"]),
                          (NS, "route", route["metadata"]["name"])}
    # a pool with no room owes nobody an instance: s1 waits rightly while s3 holds the one
    parsed = parse_appdefinition(app)
    assert isinstance(parsed, AppDefinition)
    ext_name = builders.object_name(parsed, Part.EXTERNAL_SERVICE, 1)
    held = {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": ext_name, "namespace": NS, "uid": "svc",
                         "labels": {v.LABEL_GENERATION: "1"},
                         "ownerReferences": [{"apiVersion": v.SESSION_API_VERSION,
                                              "kind": v.SESSION_KIND, "name": "s3",
                                              "uid": "uid-3"}]}}
    cm = _email_cm(app, 1, "u@example.com", held["metadata"]["ownerReferences"])
    full = _world([app], [waiting, _session("s3", "uid-3", instance="1")], [held, cm])
    assert obligations(full, [NS]) == {}
