"""`scheduler.mapping.keys_for`: every event kind of every watched kind, without any server."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from scheduler.mapping import appdef_names, changed, keys_for, summarize
from warmpool.keys import InstanceKey, PoolKey, SessionKey, TimeoutKey
from warmpool.pool import vocabulary as v
from warmpool.testing.world import appdef_body, session_body

NS = "ns1"
AD_UID = "0000-1111-381261d79c23"


def appdef(name: str = "java", generation: int = 1, **meta: Any) -> dict[str, Any]:
    return appdef_body(NS, name, {"name": f"{name}-app", "minInstances": 2}, metadata={
        "uid": AD_UID, "generation": generation, "resourceVersion": "10", **meta})


def session(name: str = "s1", appdef_name: str | None = "java", instance: str | None = None,
            deleting: bool = False, user: str = "a@example.com") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"uid-{name}",
                            "resourceVersion": "20", "generation": 1}
    if instance is not None:
        meta["annotations"] = {v.ANNOTATION_INSTANCE_ID: instance,
                               v.ANNOTATION_START_STRATEGY: "eager"}
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    spec: dict[str, Any] = {"name": name, "user": user}
    if appdef_name:
        spec["appDefinition"] = appdef_name
    return session_body(NS, name, spec, metadata=meta, status={"operatorStatus": "HANDLED"})


def ad_ref(name: str = "java", api_version: str = v.APPDEF_API_VERSION) -> dict[str, str]:
    return {"apiVersion": api_version, "kind": "AppDefinition", "name": name, "uid": AD_UID}


def s_ref(name: str = "s1") -> dict[str, str]:
    return {"apiVersion": v.SESSION_API_VERSION, "kind": "Session", "name": name,
            "uid": f"uid-{name}"}


def pool_obj(kind: str = "Service", k: int = 3, refs: list[dict[str, str]] | None = None,
             name: str | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "apps/v1" if kind == "Deployment" else "v1", "kind": kind,
        "metadata": {"name": name or f"instance-{k}-java-app-381261d79c23", "namespace": NS,
                     "resourceVersion": "30",
                     "labels": {v.LABEL_GENERATION: "1"},
                     "ownerReferences": refs if refs is not None else [ad_ref()]},
    }
    if kind == "ConfigMap":
        obj["data"] = {v.EMAILS_KEY: ""}
    else:
        obj["spec"] = {"replicas": 1} if kind == "Deployment" else {"ports": []}
    return obj


def bumped(obj: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A later version of `obj` with `changes` applied to metadata (rv bumped)."""
    new = copy.deepcopy(obj)
    new["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
    new["metadata"].update(changes)
    return new


# --- AppDefinition ------------------------------------------------------------------------


def test_appdef_added_and_deleted_give_its_pool_key() -> None:
    assert keys_for("AppDefinition", "ADDED", appdef()) == [PoolKey(NS, "java")]
    assert keys_for("AppDefinition", "DELETED", appdef()) == [PoolKey(NS, "java")]


def test_appdef_deleted_found_by_relist_maps_from_its_stub() -> None:
    stub = summarize("AppDefinition", appdef())
    assert keys_for("AppDefinition", "DELETED", stub, stub) == [PoolKey(NS, "java")]


def test_appdef_generation_change_gives_pool_key() -> None:
    old = appdef(generation=1)
    new = bumped(old, generation=2)
    new["spec"]["minInstances"] = 1
    assert keys_for("AppDefinition", "MODIFIED", new, summarize("AppDefinition", old)) == [
        PoolKey(NS, "java")]
    assert keys_for("AppDefinition", "MODIFIED", new, old) == [PoolKey(NS, "java")]


def test_appdef_label_or_status_change_without_new_generation_gives_nothing() -> None:
    old = appdef()
    labelled = bumped(old, labels={"team": "x"})
    assert keys_for("AppDefinition", "MODIFIED", labelled, summarize("AppDefinition", old)) == []
    status_only = bumped(old)
    status_only["status"] = {"operatorStatus": "HANDLED"}
    assert keys_for("AppDefinition", "MODIFIED", status_only,
                    summarize("AppDefinition", old)) == []


def test_appdef_modified_with_unknown_previous_state_gives_pool_key() -> None:
    assert keys_for("AppDefinition", "MODIFIED", appdef(), None) == [PoolKey(NS, "java")]


def test_appdef_deletion_timestamp_gives_pool_key() -> None:
    old = appdef()
    new = bumped(old, deletionTimestamp="2024-01-01T00:00:00Z")
    assert keys_for("AppDefinition", "MODIFIED", new, summarize("AppDefinition", old)) == [
        PoolKey(NS, "java")]


# --- Session ------------------------------------------------------------------------------


def test_session_added_gives_its_claim_key_and_its_timeout_key() -> None:
    assert keys_for("Session", "ADDED", session()) == [SessionKey(NS, "s1"),
                                                       TimeoutKey(NS, "s1")]


def test_session_added_already_annotated_also_gives_its_instance() -> None:
    assert keys_for("Session", "ADDED", session(instance="4")) == [
        SessionKey(NS, "s1"), TimeoutKey(NS, "s1"), InstanceKey(NS, "java", 4)]


def test_only_an_added_session_gives_its_timeout_key() -> None:
    """Its deadlines are its timeout job's own timer after that; its status writes (HANDLED,
    lastActivity) map to nothing."""
    old = session()
    assert TimeoutKey(NS, "s1") not in keys_for("Session", "MODIFIED", bumped(old, x="1"),
                                                summarize("Session", old))


def test_session_deleted_with_instance_gives_its_own_key_then_the_instance_key() -> None:
    # Its own key runs the release from the claims queue; the instance key is the rule
    # that needs no index.
    assert keys_for("Session", "DELETED", session(instance="3")) == [
        SessionKey(NS, "s1"), InstanceKey(NS, "java", 3)]


def test_session_deleted_without_instance_gives_its_own_key_and_the_pool_key() -> None:
    # A claim may be in flight (owner reference written, annotation not yet).
    assert keys_for("Session", "DELETED", session()) == [SessionKey(NS, "s1"), PoolKey(NS, "java")]


def test_session_deleted_found_by_relist_maps_from_its_stub() -> None:
    stub = summarize("Session", session(instance="2"))
    assert stub["metadata"]["annotations"] == {v.ANNOTATION_INSTANCE_ID: "2"}
    assert keys_for("Session", "DELETED", stub, stub) == [SessionKey(NS, "s1"),
                                                          InstanceKey(NS, "java", 2)]


def test_session_deletion_timestamp_set_is_the_release() -> None:
    old = session(instance="5")
    new = bumped(old, deletionTimestamp="2024-01-01T00:00:00Z")
    assert keys_for("Session", "MODIFIED", new, summarize("Session", old)) == [
        SessionKey(NS, "s1"), InstanceKey(NS, "java", 5)]
    unannotated = session(deleting=True)
    assert keys_for("Session", "MODIFIED", unannotated, None) == [SessionKey(NS, "s1"),
                                                                  PoolKey(NS, "java")]


def test_session_deleted_uses_the_cached_annotation_if_the_final_state_lacks_it() -> None:
    old = summarize("Session", session(instance="7"))
    assert keys_for("Session", "DELETED", session(), old) == [SessionKey(NS, "s1"),
                                                              InstanceKey(NS, "java", 7)]


def test_session_without_appdefinition_deleted_gives_nothing() -> None:
    assert keys_for("Session", "DELETED", session(appdef_name=None)) == []


def test_session_user_edited_gives_claim_and_instance_keys() -> None:
    old = session(instance="2")
    new = bumped(old, generation=2)
    new["spec"]["user"] = "b@example.com"
    assert keys_for("Session", "MODIFIED", new, summarize("Session", old)) == [
        SessionKey(NS, "s1"), InstanceKey(NS, "java", 2)]


def test_session_annotated_by_the_claim_gives_claim_and_instance_keys() -> None:
    old = session()
    new = bumped(old, annotations={v.ANNOTATION_INSTANCE_ID: "1"})
    assert keys_for("Session", "MODIFIED", new, summarize("Session", old)) == [
        SessionKey(NS, "s1"), InstanceKey(NS, "java", 1)]


def test_session_status_only_change_gives_nothing() -> None:
    old = session(instance="2")
    new = bumped(old)
    new["status"] = {"operatorStatus": "HANDLED", "lastActivity": 1700000000000}
    assert keys_for("Session", "MODIFIED", new, summarize("Session", old)) == []
    assert keys_for("Session", "MODIFIED", new, old) == []


def test_session_modified_without_appdefinition_gives_only_its_claim() -> None:
    old = session(appdef_name=None)
    new = bumped(old, labels={"x": "y"})
    assert keys_for("Session", "MODIFIED", new, summarize("Session", old)) == [
        SessionKey(NS, "s1")]


def test_session_bad_annotation_is_not_an_instance() -> None:
    for bad in ("0", "-1", "x", ""):
        assert keys_for("Session", "DELETED", session(instance=bad)) == [
            SessionKey(NS, "s1"), PoolKey(NS, "java")]


# --- pool objects -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["Service", "Deployment", "ConfigMap"])
@pytest.mark.parametrize("event", ["ADDED", "MODIFIED", "DELETED"])
def test_pool_object_gives_its_instance_key(kind: str, event: str) -> None:
    obj = pool_obj(kind, k=3, refs=[ad_ref(), s_ref()])
    assert keys_for(kind, event, obj, None) == [InstanceKey(NS, "java", 3)]


def test_pool_object_deleted_found_by_relist_maps_from_its_stub() -> None:
    stub = summarize("ConfigMap", pool_obj("ConfigMap", k=12))
    assert keys_for("ConfigMap", "DELETED", stub, stub) == [InstanceKey(NS, "java", 12)]


def test_pool_object_appdef_reference_of_another_version_counts() -> None:
    obj = pool_obj(refs=[ad_ref(api_version="theia.cloud/v1beta10")])
    assert keys_for("Service", "ADDED", obj) == [InstanceKey(NS, "java", 3)]


def test_pool_object_reference_of_other_group_or_kind_does_not_count() -> None:
    obj = pool_obj(refs=[{"apiVersion": "other.io/v1", "kind": "AppDefinition", "name": "java",
                          "uid": "u"},
                         {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                          "uid": "u"}])
    assert keys_for("Service", "ADDED", obj) == []


def test_deployment_status_only_change_gives_nothing() -> None:
    old = pool_obj("Deployment")
    new = bumped(old)
    new["status"] = {"readyReplicas": 1, "replicas": 1}
    assert keys_for("Deployment", "MODIFIED", new, summarize("Deployment", old)) == []


def test_configmap_data_change_gives_its_instance_key() -> None:
    old = pool_obj("ConfigMap", k=2)
    new = bumped(old)
    new["data"] = {v.EMAILS_KEY: "intruder@example.com"}
    assert keys_for("ConfigMap", "MODIFIED", new, summarize("ConfigMap", old)) == [
        InstanceKey(NS, "java", 2)]


def test_owner_reference_removed_by_gc_gives_the_instance_key() -> None:
    old = pool_obj(k=4, refs=[ad_ref(), s_ref()])
    new = bumped(old, ownerReferences=[ad_ref()])
    assert keys_for("Service", "MODIFIED", new, summarize("Service", old)) == [
        InstanceKey(NS, "java", 4)]


def test_appdef_reference_stripped_still_maps_through_the_old_state() -> None:
    old = pool_obj(k=4, refs=[ad_ref(), s_ref()])
    new = bumped(old, ownerReferences=[s_ref()])
    assert keys_for("Service", "MODIFIED", new, summarize("Service", old)) == [
        InstanceKey(NS, "java", 4)]


def test_pool_object_owned_only_by_a_session_gives_that_sessions_pool() -> None:
    obj = pool_obj(refs=[s_ref("s1"), s_ref("s2")])
    known = {(NS, "s1"): "java", (NS, "s2"): "python"}
    keys = keys_for("Service", "ADDED", obj, None,
                    session_appdef_of=lambda ns, name: known.get((ns, name)))
    assert keys == [PoolKey(NS, "java"), PoolKey(NS, "python")]


def test_pool_object_owned_only_by_an_unknown_session_is_ignored() -> None:
    obj = pool_obj(refs=[s_ref("gone")])
    assert keys_for("Service", "ADDED", obj, None, session_appdef_of=lambda ns, n: None) == []
    assert keys_for("Service", "ADDED", obj, None) == []


def test_pool_object_without_any_owner_is_ignored() -> None:
    assert keys_for("ConfigMap", "DELETED", pool_obj("ConfigMap", refs=[])) == []


def test_pool_object_whose_name_has_no_id_gives_the_pool_key() -> None:
    obj = pool_obj(name="someone-elses-configmap")
    assert keys_for("ConfigMap", "ADDED", obj) == [PoolKey(NS, "java")]


# --- events that are not changes ----------------------------------------------------------


@pytest.mark.parametrize("event", ["BOOKMARK", "ERROR", "SYNC"])
def test_non_change_events_give_nothing(event: str) -> None:
    assert keys_for("Session", event, session()) == []
    assert keys_for("AppDefinition", event, appdef()) == []


def test_unwatched_kind_gives_nothing() -> None:
    assert keys_for("Pod", "ADDED", {"metadata": {"name": "p", "namespace": NS}}) == []


def test_object_without_namespace_gives_nothing() -> None:
    obj = appdef()
    del obj["metadata"]["namespace"]
    assert keys_for("AppDefinition", "ADDED", obj) == []


# --- stubs --------------------------------------------------------------------------------


def test_stub_is_small_and_keeps_what_the_mapping_reads() -> None:
    full = session(instance="3")
    full["metadata"]["managedFields"] = [{"manager": "x" * 500}]
    stub = summarize("Session", full)
    assert stub["metadata"] == {"name": "s1", "namespace": NS, "uid": "uid-s1",
                                "resourceVersion": "20", "generation": 1,
                                "annotations": {v.ANNOTATION_INSTANCE_ID: "3"}}
    assert stub["spec"] == {"appDefinition": "java"}
    assert "status" not in stub and "user" not in str(stub)
    svc = summarize("Service", pool_obj(refs=[ad_ref(), s_ref(),
                                              {"apiVersion": "v1", "kind": "Other",
                                               "name": "o", "uid": "u"}]))
    assert [r["kind"] for r in svc["metadata"]["ownerReferences"]] == ["AppDefinition", "Session"]
    assert "labels" not in svc["metadata"] and "spec" not in svc


def test_changed_ignores_resource_version_managed_fields_and_status() -> None:
    a = pool_obj("Deployment")
    b = bumped(a, managedFields=[{"manager": "kubelet"}])
    b["status"] = {"replicas": 1}
    assert not changed(b, summarize("Deployment", a))
    assert changed(b, None)
    c = bumped(a, labels={v.LABEL_GENERATION: "2"})
    assert changed(c, summarize("Deployment", a))


def test_appdef_names_of_stubs() -> None:
    assert appdef_names("AppDefinition", summarize("AppDefinition", appdef("x"))) == {"x"}
    assert appdef_names("Session", summarize("Session", session(appdef_name="y"))) == {"y"}
    assert appdef_names("Session", summarize("Session", session(appdef_name=None))) == set()
    assert appdef_names("ConfigMap", summarize("ConfigMap", pool_obj(refs=[ad_ref("z"),
                                                                        s_ref()]))) == {"z"}


def session_route(session: str = "s1") -> dict[str, Any]:
    return {"kind": v.ROUTE_KIND, "metadata": {
        "name": f"{session}-route", "namespace": "ns1", "resourceVersion": "9",
        "labels": {v.LABEL_COMPONENT: "session", v.LABEL_PART_OF: "theia-cloud"},
        "ownerReferences": [{"apiVersion": v.SESSION_API_VERSION, "kind": v.SESSION_KIND,
                             "name": session, "uid": "u-1"}]},
        "spec": {"rules": [{"backendRefs": [{"name": "instance-2-java-ext"}]}]}}


@pytest.mark.parametrize("event", ["ADDED", "MODIFIED", "DELETED"])
def test_a_session_route_maps_to_the_instances_it_sends_to(event: str) -> None:
    keys = keys_for(v.ROUTE_KIND, event, session_route(), None,
                    session_appdef_of=lambda ns, n: "java")
    assert keys == [InstanceKey("ns1", "java", 2)]


def test_a_route_of_an_unknown_session_maps_to_its_claim_unless_deleted() -> None:
    """Issue #28: the garbage collector deletes a deleted Session's route after it; the
    Session's key had run for the deletion already, and a route holds nothing."""
    unknown = {"session_appdef_of": lambda ns, n: None}
    assert keys_for(v.ROUTE_KIND, "ADDED", session_route(), None, **unknown) == [
        SessionKey("ns1", "s1")]
    assert keys_for(v.ROUTE_KIND, "DELETED", session_route(), None, **unknown) == []
