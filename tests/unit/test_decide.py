"""pool-spec.md §4, rule by rule, on the pure decision function (no server)."""

from __future__ import annotations

import copy
import tomllib

from tests.unit.pool_fixtures import SETTINGS, appdef, instance, observed, session, with_objects
from warmpool.pool import builders, naming
from warmpool.pool.actions import (
    AnnotateSession,
    Create,
    Delete,
    Patch,
    ProbeUrl,
    RefreshPods,
    Report,
    ResetPods,
    SetSessionStatus,
)
from warmpool.pool.decide import decide_instance, unguarded_deletes
from warmpool.pool.instances import InstanceView
from warmpool.pool.parts import PARTS, Part


def plan(view, a, sessions=(), name="java"):
    return decide_instance(view, name, a, list(sessions), proxy_template=None, settings=SETTINGS)


def of(actions, kind):
    return [x for x in actions if isinstance(x, kind)]


def test_empty_slot_within_pool_creates_five_free_objects() -> None:
    a = appdef(min_instances=2)
    p = plan(InstanceView(1, {}), a)
    assert p.state == "free"
    creates = of(p.actions, Create)
    assert [c.part for c in creates] == list(PARTS)
    for c in creates:
        assert [r["uid"] for r in c.body["metadata"]["ownerReferences"]] == [a.uid]
    email = creates[0].body
    assert email["data"] == {"authenticated-emails-list": ""}


def test_converged_free_instance_needs_nothing() -> None:
    a = appdef(min_instances=2)
    p = plan(instance(a, 2), a)
    assert p.actions == [] and not p.released


def test_claimed_instance_above_min_is_kept_whole_the_defect() -> None:
    a = appdef(min_instances=2)
    s = session(instance=5, status="HANDLED")
    p = plan(instance(a, 5, holder=s), a, [s])
    assert p.state == "claimed" and not p.released
    assert p.actions == []  # nothing deleted, nothing stripped


def test_missing_configmaps_of_claimed_instance_are_recreated_with_the_holders_email() -> None:
    a = appdef(min_instances=2)
    s = session(instance=5, status="HANDLED")
    view = instance(a, 5, holder=s, missing=(Part.EMAIL_CONFIGMAP, Part.PROXY_CONFIGMAP))
    p = plan(view, a, [s])
    creates = {c.part: c.body for c in of(p.actions, Create)}
    assert set(creates) == {Part.EMAIL_CONFIGMAP, Part.PROXY_CONFIGMAP}
    assert creates[Part.EMAIL_CONFIGMAP]["data"]["authenticated-emails-list"] == s.user
    for body in creates.values():
        assert {r["uid"] for r in body["metadata"]["ownerReferences"]} == {a.uid, s.uid}
    assert of(p.actions, RefreshPods)
    assert not of(p.actions, Delete)


def test_claim_in_flight_is_completed_from_the_external_service_reference() -> None:
    a = appdef(min_instances=2)
    # Not annotated yet: the claimer crashed right after its deciding write.
    s = session(status="HANDLING")
    view = instance(a, 1)
    ext = copy.deepcopy(view.get(Part.EXTERNAL_SERVICE))
    ext["metadata"]["ownerReferences"].append(s.owner_reference())
    p = plan(with_objects(view, EXTERNAL_SERVICE=ext), a, [s])
    assert p.state == "claimed" and p.holder == s
    patched = {x.part for x in of(p.actions, Patch)}
    assert patched == set(PARTS)  # Session reference everywhere, labels on the external Service
    email = next(x for x in of(p.actions, Patch) if x.part is Part.EMAIL_CONFIGMAP)
    assert email.patch["data"] == {"authenticated-emails-list": s.user}
    assert of(p.actions, AnnotateSession)[0].annotations["theia-cloud.io/instance-id"] == "1"
    assert of(p.actions, SetSessionStatus)[0].status["operatorStatus"] == "HANDLED"


def test_the_appdefinition_reference_is_restored_never_stripped() -> None:
    a = appdef(min_instances=1)
    s = session(instance=3, status="HANDLED")
    view = instance(a, 3, holder=s)
    dep = copy.deepcopy(view.get(Part.DEPLOYMENT))
    dep["metadata"]["ownerReferences"] = [s.owner_reference()]  # what the Java operator left
    p = plan(with_objects(view, DEPLOYMENT=dep), a, [s])
    (fix,) = of(p.actions, Patch)
    assert {r["uid"] for r in fix.patch["metadata"]["ownerReferences"]} == {a.uid, s.uid}
    assert fix.resource_version == dep["metadata"]["resourceVersion"]


def test_outdated_generation_is_not_replaced_while_claimed() -> None:
    s = session(instance=1, status="HANDLED")
    view = instance(appdef(generation=1), 1, holder=s)
    p = plan(view, appdef(generation=2), [s])
    assert not of(p.actions, Delete) and not of(p.actions, Create)


def test_free_instance_at_an_old_generation_with_the_same_shape_is_only_relabelled() -> None:
    view = instance(appdef(generation=1, min_instances=2), 1)
    p = plan(view, appdef(generation=2, min_instances=3))  # a scale-up bumps the generation
    assert p.state == "free"
    assert not of(p.actions, Delete) and not of(p.actions, Create)
    patches = of(p.actions, Patch)
    assert len(patches) == 5
    for x in patches:
        assert x.patch["metadata"]["labels"] == {"theia-cloud.io/appdefinition-generation": "2"}
    dep = next(x for x in patches if x.part is Part.DEPLOYMENT)
    assert "spec" not in dep.patch  # the pod template keeps its label: no rollout


def test_object_without_a_shape_annotation_is_replaced_on_a_new_generation() -> None:
    view = instance(appdef(generation=1), 1)
    dep = copy.deepcopy(view.get(Part.DEPLOYMENT))
    del dep["metadata"]["annotations"]  # made by the Java operator
    p = plan(with_objects(view, DEPLOYMENT=dep), appdef(generation=2))
    assert [d.part for d in of(p.actions, Delete)] == [Part.DEPLOYMENT]


def test_outdated_free_instance_replaces_only_what_changed_shape() -> None:
    view = instance(appdef(generation=1), 1)
    p = plan(view, appdef(generation=2, image="img:2"))  # only the Deployment depends on it
    assert p.state == "outdated"
    assert [d.part for d in of(p.actions, Delete)] == [Part.DEPLOYMENT]
    (create,) = of(p.actions, Create)
    assert create.part is Part.DEPLOYMENT
    assert create.body["metadata"]["labels"]["theia-cloud.io/appdefinition-generation"] == "2"
    assert create.body["spec"]["template"]["spec"]["containers"][0]["image"] == "img:2"
    assert {x.part for x in of(p.actions, Patch)} == set(PARTS) - {Part.DEPLOYMENT}


def test_free_instance_above_min_is_deleted_with_preconditions() -> None:
    a = appdef(min_instances=1)
    view = instance(a, 2)
    p = plan(view, a)
    assert p.state == "retired"
    deletes = of(p.actions, Delete)
    assert len(deletes) == 5
    assert all(d.uid and d.resource_version for d in deletes)
    # The object a claim's deciding write touches goes first: a claim that got in since the
    # read makes this first delete fail, before anything of the claimed instance is gone.
    assert deletes[0].part is Part.EXTERNAL_SERVICE


def test_outdated_free_instance_writes_its_external_service_before_any_delete() -> None:
    view = instance(appdef(generation=1), 1)
    p = plan(view, appdef(generation=2, image="img:2"))
    first = p.actions[0]
    assert isinstance(first, Patch) and first.part is Part.EXTERNAL_SERVICE
    assert first.resource_version == view.get(Part.EXTERNAL_SERVICE)["metadata"][
        "resourceVersion"]
    assert len(of(p.actions, Patch)) == len({x.part for x in of(p.actions, Patch)})


def test_object_with_a_foreign_owner_is_reported_not_deleted() -> None:
    a = appdef(min_instances=1)
    view = instance(a, 2)
    cm = copy.deepcopy(view.get(Part.PROXY_CONFIGMAP))
    cm["metadata"]["ownerReferences"].append(
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "u-other"})
    p = plan(with_objects(view, PROXY_CONFIGMAP=cm), a)
    assert Part.PROXY_CONFIGMAP not in {d.part for d in of(p.actions, Delete)}
    assert any(r.reason == "ForeignOwner" for r in of(p.actions, Report))


def test_retirement_keeping_a_foreign_owned_external_service_guards_with_it_first() -> None:
    # A claim writes that Service whoever else owns it: the deletes of the rest must be
    # refused by the server if a claim got there since the read.
    a = appdef(min_instances=1)
    view = instance(a, 2)
    ext = copy.deepcopy(view.get(Part.EXTERNAL_SERVICE))
    ext["metadata"]["ownerReferences"].append(
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "u-other"})
    p = plan(with_objects(view, EXTERNAL_SERVICE=ext), a)
    writes = [x for x in p.actions if isinstance(x, Patch | Delete)]
    assert isinstance(writes[0], Patch) and writes[0].part is Part.EXTERNAL_SERVICE
    assert writes[0].resource_version == ext["metadata"]["resourceVersion"]
    assert {d.part for d in of(p.actions, Delete)} == set(PARTS) - {Part.EXTERNAL_SERVICE}


def test_a_resumed_release_guards_its_pod_reset_with_the_external_service() -> None:
    # A crash after the allow-list was cleared: only the Services' session labels are left.
    # The reset must not be the plan's first write: on a stale read it would take the pod of
    # whoever claimed the instance since.
    a = appdef(min_instances=2)
    gone = session(instance=1, deleting=True)
    held = instance(a, 1, holder=gone)
    free = instance(a, 1)
    ext = copy.deepcopy(free.get(Part.EXTERNAL_SERVICE))
    ext["metadata"]["labels"] = held.get(Part.EXTERNAL_SERVICE)["metadata"]["labels"]
    p = plan(with_objects(free, EXTERNAL_SERVICE=ext), a, [gone])
    kinds = [type(x) for x in p.actions]
    assert ResetPods in kinds
    first = p.actions[0]
    assert isinstance(first, Patch) and first.part is Part.EXTERNAL_SERVICE
    assert first.resource_version == ext["metadata"]["resourceVersion"]
    assert kinds.index(Patch) < kinds.index(ResetPods)
    last = [x for x in p.actions if not isinstance(x, Report)][-1]  # the marker still goes last
    assert isinstance(last, Patch) and last.part is Part.EXTERNAL_SERVICE and last.patch


def test_deletes_without_an_external_service_in_the_read_ask_for_the_servers_view() -> None:
    a = appdef(min_instances=1)
    view = instance(a, 2, missing=(Part.EXTERNAL_SERVICE,))
    p = plan(view, a)
    assert of(p.actions, Delete) and unguarded_deletes(view, p)
    assert not unguarded_deletes(instance(a, 2), plan(instance(a, 2), a))


def test_release_clears_allow_list_first_resets_pod_and_unlabels_external_service_last() -> None:
    a = appdef(min_instances=2)
    gone = session(instance=1, deleting=True)
    p = plan(instance(a, 1, holder=gone), a, [gone])
    assert p.state == "free" and p.released  # the metrics count releases from the plan
    kinds = [type(x) for x in p.actions]
    assert kinds[0] is Patch and p.actions[0].part is Part.EMAIL_CONFIGMAP
    assert p.actions[0].patch["data"] == {"authenticated-emails-list": ""}
    reset = kinds.index(ResetPods)
    parts = [getattr(x, "part", None) for x in p.actions]
    assert parts.index(Part.DEPLOYMENT) < reset < parts.index(Part.EXTERNAL_SERVICE)
    writes = [x for x in p.actions if not isinstance(x, Report)]
    assert writes[-1].part is Part.EXTERNAL_SERVICE
    for x in of(p.actions, Patch):
        owners = x.patch["metadata"]["ownerReferences"]
        assert [r["uid"] for r in owners] == [a.uid]  # Session gone, AppDefinition kept
    ext = writes[-1].patch["metadata"]["labels"]
    assert ext["theia-cloud.io/session"] is None and ext["theia-cloud.io/user"] is None
    # After the writes: one Normal event on the Session released, naming the instance only.
    released = p.actions[-1]
    assert isinstance(released, Report) and released.reason == "Released"
    assert not released.warning and released.regarding["uid"] == gone.uid
    assert released.regarding["kind"] == "Session" and "@" not in released.message


def test_a_completed_claim_reports_claimed_once_on_the_session_after_its_status() -> None:
    a = appdef(min_instances=2)
    s = session(instance=1)
    p = plan(instance(a, 1, holder=s), a, [s])
    claimed = [x for x in of(p.actions, Report) if x.reason == "Claimed"]
    assert len(claimed) == 1 and not claimed[0].warning
    assert claimed[0].regarding == s.owner_reference()
    assert "instance 1 of java" in claimed[0].message and "@" not in claimed[0].message
    assert p.actions.index(claimed[0]) > max(
        i for i, x in enumerate(p.actions) if isinstance(x, SetSessionStatus))
    # Once HANDLED, the next run reports nothing: one event per claim.
    handled = session(instance=1, status="HANDLED")
    again = plan(instance(a, 1, holder=handled), a, [handled])
    assert not [x for x in of(again.actions, Report) if x.reason == "Claimed"]


def test_no_write_to_the_deployment_follows_the_reset_of_its_pods() -> None:
    """Deleting the pods moves the Deployment's status and so its resourceVersion: a Deployment
    write after the reset, with the observed resourceVersion as precondition, conflicted on
    every attempt (a chaos finding: a released, outdated instance that never converged)."""
    a = appdef(min_instances=2)
    gone = session(instance=1, deleting=True)
    view = instance(a, 1, holder=gone)
    for newer in (appdef(min_instances=3, generation=2),  # same shape: relabel
                  appdef(min_instances=2, generation=2, image="img:2")):  # new shape
        p = plan(view, newer, [gone])
        resets = [i for i, x in enumerate(p.actions) if isinstance(x, ResetPods)]
        writes = [i for i, x in enumerate(p.actions)
                  if isinstance(x, Patch | Delete | Create) and x.part is Part.DEPLOYMENT]
        assert writes and all(w < r for w in writes for r in resets), p.actions
        if newer.image != a.image:
            assert resets == [], "a replaced Deployment starts fresh pods: nothing to reset"
        else:
            assert len(resets) == 1


def test_release_after_the_garbage_collector_still_cleans_labels_and_allow_list() -> None:
    a = appdef(min_instances=2)
    gone = session(instance=1, deleting=True)
    view = instance(a, 1, holder=gone)
    objects = {}
    for part, obj in view.existing():  # the GC has already removed the Session references
        obj = copy.deepcopy(obj)
        obj["metadata"]["ownerReferences"] = [a.owner_reference()]
        objects[part] = obj
    p = plan(InstanceView(1, objects), a, [])
    assert of(p.actions, ResetPods)
    assert of(p.actions, Patch)[0].patch["data"] == {"authenticated-emails-list": ""}


def test_released_instance_above_min_is_deleted() -> None:
    a = appdef(min_instances=1)
    gone = session(instance=4, deleting=True)
    p = plan(instance(a, 4, holder=gone), a, [gone])
    assert p.state == "retired" and len(of(p.actions, Delete)) == 5 and p.released


def test_appdefinition_deleted_keeps_claimed_instance_and_deletes_it_on_release() -> None:
    a = appdef(min_instances=2)
    s = session(instance=1, status="HANDLED")
    view = instance(a, 1, holder=s)
    assert plan(view, None, [s]).actions == []
    gone = session(instance=1, deleting=True)
    p = plan(view, None, [gone])
    assert len(of(p.actions, Delete)) == 5


def test_claim_in_flight_when_its_appdefinition_goes_ends_in_error_and_keeps_the_objects(
) -> None:
    """Deciding write made (the Session's reference on the external Service), Session not
    yet annotated, then the AppDefinition is deleted and the garbage collector takes what did
    not carry the reference: the claim cannot be completed, so the Session must not go on
    waiting in silence, and what it holds stays until it ends."""
    a = appdef(min_instances=2)
    s = session(status="HANDLING")
    view = with_objects(instance(a, 1, holder=s), PROXY_CONFIGMAP=None)
    p = plan(view, None, [s])
    assert p.state == "claimed" and p.holder == s
    (status,) = of(p.actions, SetSessionStatus)
    assert status.status["operatorStatus"] == "ERROR"
    assert "deleted before the claim of instance 1 completed" in status.status["operatorMessage"]
    assert of(p.actions, Report) and not of(p.actions, Delete) and not of(p.actions, Create)
    errored = session(status="ERROR")
    assert not of(plan(view, None, [errored]).actions, SetSessionStatus)


def test_never_zero_owners_object_with_only_a_dead_sessions_reference_is_deleted() -> None:
    a = appdef(min_instances=2)
    gone = session(instance=1, deleting=True)
    view = instance(a, 1, holder=gone)
    dep = copy.deepcopy(view.get(Part.DEPLOYMENT))
    dep["metadata"]["ownerReferences"] = [gone.owner_reference()]
    p = plan(with_objects(view, DEPLOYMENT=dep), None, [gone])
    assert Part.DEPLOYMENT in {d.part for d in of(p.actions, Delete)}
    for x in of(p.actions, Patch):
        assert x.patch.get("metadata", {}).get("ownerReferences", [1])


def test_a_holder_whose_user_changed_is_released_and_the_new_user_never_gets_the_pod() -> None:
    a = appdef()
    s = session(instance=1, status="HANDLED")
    view = instance(a, 1, holder=s)
    for user in ("mallory@example.com", "jane@example.com\nmallory@evil.io"):
        edited = session(instance=1, status="HANDLED", user=user)
        p = plan(view, a, [edited])
        assert p.state == "free" and p.holder is None
        kinds = [type(x) for x in p.actions]
        email = p.actions[0]  # access ends first, for the old user and the new one
        assert isinstance(email, Patch) and email.part is Part.EMAIL_CONFIGMAP
        assert email.patch["data"] == {"authenticated-emails-list": ""}
        assert ResetPods in kinds  # the previous user's state goes with its pod
        assert not [x for x in of(p.actions, Patch) if x.patch.get("data", {}).get(
            "authenticated-emails-list")]
        last = [x for x in p.actions if not isinstance(x, Report)][-1]
        assert isinstance(last, Patch) and last.part is Part.EXTERNAL_SERVICE
        assert last.patch["metadata"]["annotations"] == {"warmpool.io/claimed-for": None}


def test_a_hand_edited_claimed_for_digest_releases_nothing_while_the_allow_list_agrees() -> None:
    """The long tier with hosts (seed 31): the digest in claimed-for edited by hand, the
    Session's user and its allow-list unchanged. The annotation is what changed, not the
    user: the holder keeps its instance (nothing deleted above minInstances) and the plan
    writes the annotation back. Without an allow-list to agree, it is a user change."""
    a = appdef(min_instances=0)
    s = session(instance=1, status="HANDLED")
    view = instance(a, 1, holder=s)
    ext = copy.deepcopy(view.get(Part.EXTERNAL_SERVICE))
    ext["metadata"]["annotations"]["warmpool.io/claimed-for"] = f"{s.uid}/0123456789abcdef"
    p = plan(with_objects(view, EXTERNAL_SERVICE=ext), a, [s])
    assert p.holder == s and not of(p.actions, Delete)
    (fix,) = [x for x in of(p.actions, Patch) if x.part is Part.EXTERNAL_SERVICE]
    assert fix.patch["metadata"]["annotations"]["warmpool.io/claimed-for"] == \
        naming.claimed_for(s.uid, s.user)
    email = copy.deepcopy(view.get(Part.EMAIL_CONFIGMAP))
    email["data"] = {"authenticated-emails-list": ""}
    p = plan(with_objects(view, EXTERNAL_SERVICE=ext, EMAIL_CONFIGMAP=email), a, [s])
    assert p.holder is None


def test_a_claim_made_without_the_claimed_for_annotation_is_adopted() -> None:
    a = appdef()
    s = session(instance=1, status="HANDLED")
    view = instance(a, 1, holder=s)
    ext = copy.deepcopy(view.get(Part.EXTERNAL_SERVICE))
    del ext["metadata"]["annotations"]["warmpool.io/claimed-for"]
    p = plan(with_objects(view, EXTERNAL_SERVICE=ext), a, [s])
    assert p.holder == s
    (patch,) = of(p.actions, Patch)
    assert patch.part is Part.EXTERNAL_SERVICE
    assert patch.patch["metadata"]["annotations"]["warmpool.io/claimed-for"].startswith(s.uid)


def test_an_annotation_alone_makes_no_holder() -> None:
    # s2 is older and annotated with 1 (a hand edit, a Session re-created under a name):
    # the Service references s1, so s1 holds 1 and keeps its allow-list.
    a = appdef()
    s1 = session("s1", instance=1, status="HANDLED", created="2026-01-01T00:00:05Z")
    s2 = session("s2", user="bob@example.com", instance=1, created="2026-01-01T00:00:01Z")
    p = plan(instance(a, 1, holder=s1), a, [s1, s2])
    assert p.holder == s1
    assert p.actions == []  # nothing rewritten for s2 (its claim job removes the annotation)


def test_an_annotation_on_a_free_instance_or_past_the_pool_claims_nothing() -> None:
    a = appdef(min_instances=2, max_instances=3)
    s = session("s1", instance=2)
    p = plan(instance(a, 2), a, [s])
    assert p.state == "free" and p.holder is None
    assert not of(p.actions, Patch) and not of(p.actions, AnnotateSession)
    far = session("s2", instance=999999)
    p = plan(InstanceView(999999, {}), a, [far])
    assert p.state == "retired" and not of(p.actions, Create)


def test_two_references_the_annotated_one_wins() -> None:
    a = appdef()
    s1 = session("s1", instance=1, status="HANDLED", created="2026-01-01T00:00:05Z")
    s2 = session("s2", user="bob@example.com", created="2026-01-01T00:00:01Z")
    view = instance(a, 1, holder=s1)
    ext = copy.deepcopy(view.get(Part.EXTERNAL_SERVICE))
    ext["metadata"]["ownerReferences"].append(s2.owner_reference())
    p = plan(with_objects(view, EXTERNAL_SERVICE=ext), a, [s1, s2])
    assert p.holder == s1
    assert any(r.reason == "InstanceConflict" for r in of(p.actions, Report))


def test_proxy_config_fills_url_and_port() -> None:
    a = appdef()
    body = builders.build(Part.PROXY_CONFIGMAP, a, 3, holder=None,
                          proxy_template='u="https://placeholder/cb"\np="placeholder-port"',
                          settings=SETTINGS)
    text = body["data"]["oauth2-proxy.cfg"]
    assert tomllib.loads(text) == {"u": "https://instances.theia-cloud.local/java-17-3/cb",
                                   "p": "3000"}


def test_deployment_mounts_both_configmaps_not_optional() -> None:
    a = appdef()
    dep = observed(builders.build(Part.DEPLOYMENT, a, 1, holder=None, proxy_template=None,
                                  settings=SETTINGS))
    spec = dep["spec"]["template"]["spec"]
    names = {c["name"] for c in spec["containers"]}
    assert "oauth2-proxy" in names
    volumes = {vol["name"]: vol["configMap"] for vol in spec["volumes"]}
    assert all("optional" not in cm for cm in volumes.values())
    assert {cm["name"] for cm in volumes.values()} == {
        builders.object_name(a, Part.PROXY_CONFIGMAP, 1),
        builders.object_name(a, Part.EMAIL_CONFIGMAP, 1),
    }


def test_a_double_claim_is_released_on_the_instance_the_session_does_not_hold() -> None:
    """A claim retried after its deciding write's answer was lost can leave one Session
    referenced by two instances: it keeps its annotated one, the other is released."""
    a = appdef(min_instances=3)
    s = session("s1", instance=1)
    elsewhere = {s.uid: frozenset({1, 2})}
    double = decide_instance(instance(a, 2, holder=s), "java", a, [s], proxy_template=None,
                             settings=SETTINGS, held_elsewhere=elsewhere)
    assert double.state == "free" and double.holder is None
    ext_patch = next(p for p in of(double.actions, Patch) if p.part is Part.EXTERNAL_SERVICE)
    assert ext_patch.patch["metadata"]["ownerReferences"] == [a.owner_reference()]
    kept = decide_instance(instance(a, 1, holder=s), "java", a, [s], proxy_template=None,
                           settings=SETTINGS, held_elsewhere=elsewhere)
    assert kept.state == "claimed" and kept.holder == s


def test_a_double_claim_not_yet_annotated_keeps_the_lowest_id() -> None:
    a = appdef(min_instances=3)
    s = session("s1")
    elsewhere = {s.uid: frozenset({2, 3})}
    low = decide_instance(instance(a, 2, holder=s), "java", a, [s], proxy_template=None,
                          settings=SETTINGS, held_elsewhere=elsewhere)
    high = decide_instance(instance(a, 3, holder=s), "java", a, [s], proxy_template=None,
                           settings=SETTINGS, held_elsewhere=elsewhere)
    assert (low.state, high.state) == ("claimed", "free")


def test_an_instance_id_annotation_that_is_no_id_is_reported_and_replaced() -> None:
    import dataclasses

    from warmpool.pool.actions import AnnotateSession, Report

    a = appdef()
    s = session("s1")
    odd = dataclasses.replace(s, annotations={"theia-cloud.io/instance-id": "²"})
    assert odd.instance_id is None  # names no instance: not obeyed
    actions = plan(instance(a, 1, holder=odd), a, [odd]).actions
    (report,) = [x for x in actions if isinstance(x, Report) and x.warning]
    assert report.reason == "AnnotationIgnored" and "'²' is not an instance id" in report.message
    assert report.regarding["kind"] == "Session"
    (annotate,) = [x for x in actions if isinstance(x, AnnotateSession)]
    assert annotate.annotations["theia-cloud.io/instance-id"] == "1"


def test_a_claim_whose_status_write_failed_before_its_appdefinition_went_is_handled() -> None:
    """Everything of the claim done but its status (a 500), then the AppDefinition deleted:
    the Session holds a whole instance and is HANDLED, not left NEW (long tier, seed 12);
    with an object missing it cannot be completed: ERROR, and a HANDLED one is left alone."""
    from warmpool.pool.actions import SetSessionStatus

    a = appdef()
    s = session("s1", instance=1)  # annotated, status NEW
    view = instance(a, 1, holder=s)
    p = decide_instance(view, "java", None, [s], proxy_template=None, settings=SETTINGS)
    (status,) = [x for x in p.actions if isinstance(x, SetSessionStatus)]
    assert status.status["operatorStatus"] == "HANDLED"
    partial = instance(a, 1, holder=s, missing=(Part.DEPLOYMENT,))
    p = decide_instance(partial, "java", None, [s], proxy_template=None, settings=SETTINGS)
    (status,) = [x for x in p.actions if isinstance(x, SetSessionStatus)]
    assert status.status["operatorStatus"] == "ERROR"
    handled = session("s1", instance=1, status="HANDLED")
    p = decide_instance(instance(a, 1, holder=handled, missing=(Part.DEPLOYMENT,)), "java", None,
                        [handled], proxy_template=None, settings=SETTINGS)
    assert not [x for x in p.actions if isinstance(x, SetSessionStatus)]


def test_a_java_double_claim_keeps_the_older_session_and_frees_the_younger() -> None:
    """The Java operator's double claim (docs/operating.md): both Sessions annotated with the
    instance, both referenced, the allow-list the younger one's (the last writer). The older
    keeps it, alone, with its own allow-list; the younger loses every reference."""
    a = appdef()
    older = session("bob", user="bob@example.com", instance=1, status="HANDLED",
                    created="2026-01-01T00:00:01Z")
    younger = session("carol", user="carol@example.com", instance=1, status="HANDLED",
                      created="2026-01-01T00:00:02Z")
    view = instance(a, 1, holder=older)
    objects = {}
    for part, obj in view.existing():
        obj = copy.deepcopy(obj)
        obj["metadata"]["ownerReferences"].append(younger.owner_reference())
        if part is Part.EMAIL_CONFIGMAP:
            obj["data"] = {"authenticated-emails-list": younger.user}
        objects[part.name] = obj
    p = plan(with_objects(view, **objects), a, [older, younger])
    assert p.holder == older
    assert any("also by carol" in r.message for r in of(p.actions, Report))
    for patch in of(p.actions, Patch):
        refs = patch.patch.get("metadata", {}).get("ownerReferences")
        if refs is not None:
            assert younger.uid not in [r["uid"] for r in refs]
    email = next(x for x in of(p.actions, Patch) if x.part is Part.EMAIL_CONFIGMAP)
    assert email.patch["data"] == {"authenticated-emails-list": older.user}
    assert of(p.actions, RefreshPods)


def test_a_holder_handled_with_another_instances_url_gets_this_ones() -> None:
    """The younger Session of a Java double claim stays HANDLED with the URL of the instance
    the older one keeps; served on instance 3, its status must name instance 3's URL."""
    a = appdef(min_instances=3)
    url_of = SETTINGS.session_url
    s = session("carol", instance=3, status="HANDLED", url=url_of(a, 2))
    p = plan(instance(a, 3, holder=s), a, [s])
    (status,) = of(p.actions, SetSessionStatus)
    assert status.status["url"] == url_of(a, 3)
    assert status.status["operatorStatus"] == "HANDLED"
    assert "Instance 3" in status.status["operatorMessage"]
    converged = session("carol", instance=3, status="HANDLED", url=url_of(a, 3))
    assert plan(instance(a, 3, holder=converged), a, [converged]).actions == []


def test_with_the_probe_a_stale_url_is_blanked_and_probed_again() -> None:
    a = appdef(min_instances=3)
    settings = builders.PoolSettings(routes="none", url_probe=True)
    s = session("carol", instance=3, status="HANDLED", url=settings.session_url(a, 2))
    p = decide_instance(instance(a, 3, holder=s), "java", a, [s], proxy_template=None,
                        settings=settings)
    (status,) = of(p.actions, SetSessionStatus)
    assert status.status["url"] == ""
    (probe,) = of(p.actions, ProbeUrl)
    assert probe.target.url == settings.session_url(a, 3)


def test_a_release_after_the_garbage_collector_dropped_the_reference_still_names_the_session(
) -> None:
    """The garbage collector removes a deleted Session's owner reference, often before the
    release runs: the Session is then read from the Service's labels and claimed-for."""
    a = appdef(min_instances=2)
    gone = session(instance=1, deleting=True)
    held = instance(a, 1, holder=gone)
    ext = copy.deepcopy(held.get(Part.EXTERNAL_SERVICE))
    ext["metadata"]["ownerReferences"] = [r for r in ext["metadata"]["ownerReferences"]
                                          if r["kind"] != "Session"]
    p = plan(with_objects(held, EXTERNAL_SERVICE=ext), a, [])
    (released,) = [x for x in of(p.actions, Report) if x.reason == "Released"]
    assert released.regarding["uid"] == gone.uid and released.regarding["name"] == gone.name
    # Nothing left of the claim on the Service: nothing to report.
    free = instance(a, 1)
    assert not [x for x in of(plan(free, a, []).actions, Report) if x.reason == "Released"]
