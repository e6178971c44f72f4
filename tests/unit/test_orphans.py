"""Pool objects nothing owns (reliability.md, finding 18): the sweep's decision and the
scheduler's mapping of their events. The real garbage collector's part is in
tests/integration/test_orphan_sweep.py."""

from __future__ import annotations

from typing import Any

from scheduler import mapping
from warmpool.keys import InstanceKey, SweepKey
from warmpool.pool import vocabulary as v
from warmpool.pool.model import parse_session
from warmpool.pool.orphans import decide_orphans
from warmpool.pool.parts import Part
from warmpool.testing.world import session_body, session_spec

NS = "ns1"
GONE_UID = "0f1e2d3c-0000-4000-8000-aaaaaaaaaaaa"
LIVE_UID = "0f1e2d3c-0000-4000-8000-bbbbbbbbbbbb"


def pool_object(part: Part, k: int, appdef_uid: str, *, refs: list[dict[str, Any]] | None = None,
                labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": part.api_version, "kind": part.kind, "metadata": {
        "name": part.object_name("java", appdef_uid, k), "namespace": NS,
        "uid": f"obj-{part.name}-{k}", "resourceVersion": "42",
        "labels": {v.LABEL_GENERATION: "1", **(labels or {})},
        **({"ownerReferences": refs} if refs else {})}}


def appdef(name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": v.APPDEF_API_VERSION, "kind": v.APPDEF_KIND,
            "metadata": {"name": name, "namespace": NS, "uid": uid}}


def session(name: str, uid: str, *, appdef_name: str = "java",
            instance: int | None = None, deleting: bool = False) -> Any:
    meta: dict[str, Any] = {"uid": uid}
    if instance is not None:
        meta["annotations"] = {v.ANNOTATION_INSTANCE_ID: str(instance)}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    return parse_session(session_body(NS, name, session_spec(name, "a@example.com", appdef_name),
                                      metadata=meta))


def test_an_ownerless_object_of_a_deleted_appdefinition_is_deleted_on_its_uid_and_version() -> None:
    obj = pool_object(Part.PROXY_CONFIGMAP, 3, GONE_UID)
    plan = decide_orphans([(Part.PROXY_CONFIGMAP, obj)], [appdef("java", LIVE_UID)], [])
    [delete] = plan.deletes
    assert (delete.part, delete.name, delete.uid, delete.resource_version) == (
        Part.PROXY_CONFIGMAP, obj["metadata"]["name"], "obj-PROXY_CONFIGMAP-3", "42")
    assert plan.instances == [] and plan.kept == []


def test_an_ownerless_object_of_a_living_appdefinition_goes_to_its_instance_job() -> None:
    obj = pool_object(Part.INTERNAL_SERVICE, 12, LIVE_UID)
    plan = decide_orphans([(Part.INTERNAL_SERVICE, obj)], [appdef("java", LIVE_UID)], [])
    assert plan.deletes == [] and plan.instances == [("java", 12)]


def test_an_object_with_any_owner_is_not_the_sweeps() -> None:
    foreign = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u"}]
    obj = pool_object(Part.EMAIL_CONFIGMAP, 1, GONE_UID, refs=foreign)
    plan = decide_orphans([(Part.EMAIL_CONFIGMAP, obj)], [], [])
    assert plan.deletes == [] and plan.instances == [] and plan.kept == []


def test_an_object_a_live_session_may_hold_is_kept_and_said() -> None:
    by_label = pool_object(Part.EXTERNAL_SERVICE, 2, GONE_UID,
                           labels={v.LABEL_SESSION_UUID: "s-uid-1"})
    by_id = pool_object(Part.DEPLOYMENT, 5, GONE_UID)
    sessions = [session("s1", "s-uid-1"),
                # Holds instance 5 of an AppDefinition that is gone too.
                session("s2", "s-uid-2", appdef_name="gone", instance=5)]
    plan = decide_orphans([(Part.EXTERNAL_SERVICE, by_label), (Part.DEPLOYMENT, by_id)],
                          [appdef("java", LIVE_UID)], sessions)
    assert plan.deletes == []
    assert [name for name, _ in plan.kept] == [by_label["metadata"]["name"],
                                                by_id["metadata"]["name"]]


def test_an_ended_sessions_marks_keep_nothing() -> None:
    obj = pool_object(Part.EXTERNAL_SERVICE, 2, GONE_UID, labels={v.LABEL_SESSION_UUID: "s-uid-1"})
    plan = decide_orphans([(Part.EXTERNAL_SERVICE, obj)], [],
                          [session("s1", "s-uid-1", instance=2, appdef_name="gone",
                                   deleting=True)])
    assert [d.name for d in plan.deletes] == [obj["metadata"]["name"]]


def test_a_uid_inside_another_segment_is_no_match() -> None:
    # The living AppDefinition's short uid must be a whole segment of the name.
    obj = pool_object(Part.PROXY_CONFIGMAP, 1, GONE_UID)
    lookalike = "0f1e2d3c-0000-4000-8000-" + GONE_UID[-12:-1] + "f"
    plan = decide_orphans([(Part.PROXY_CONFIGMAP, obj)], [appdef("java", lookalike)], [])
    assert len(plan.deletes) == 1


def test_the_scheduler_maps_an_ownerless_pool_object_to_its_namespaces_sweep() -> None:
    obj = pool_object(Part.PROXY_CONFIGMAP, 3, GONE_UID)
    assert mapping.keys_for("ConfigMap", "MODIFIED", obj, None) == [SweepKey(NS)]
    assert mapping.keys_for("ConfigMap", "ADDED", obj, None) == [SweepKey(NS)]
    assert mapping.keys_for("ConfigMap", "DELETED", obj, None) == []


def test_an_owned_pool_object_still_maps_to_its_instance() -> None:
    ref = {"apiVersion": v.APPDEF_API_VERSION, "kind": v.APPDEF_KIND, "name": "java",
           "uid": LIVE_UID}
    obj = pool_object(Part.PROXY_CONFIGMAP, 3, LIVE_UID, refs=[ref])
    assert mapping.keys_for("ConfigMap", "MODIFIED", obj, None) == [InstanceKey(NS, "java", 3)]
