"""Issue #27, point 5, on the pure decisions: pod resets and refreshes name the Deployment
they were decided on and touch only its pods; status writes carry the Session's version; a
user change while the external Service is missing never hands the old user's pod on."""

from __future__ import annotations

import copy
import dataclasses

from tests.unit.pool_fixtures import SETTINGS, appdef, instance, session, with_objects
from warmpool.controller.guard import Unguarded
from warmpool.kube.executor import Executor
from warmpool.pool.actions import Patch, RefreshPods, ResetPods, SetSessionStatus
from warmpool.pool.decide import decide_instance
from warmpool.pool.meta import meta_of
from warmpool.pool.parts import Part
from warmpool.pool.pods import POD_TEMPLATE_HASH, foreign_pod_message, split_pods


def plan(view, a, sessions=()):
    return decide_instance(view, "java", a, list(sessions), proxy_template=None,
                           settings=SETTINGS)


def of(actions, kind):
    return [x for x in actions if isinstance(x, kind)]


# --- which pods are the instance's ---------------------------------------------------------

def _rs(name, uid, deployment, deployment_uid, template_hash):
    return {"metadata": {"name": name, "uid": uid, "labels": {POD_TEMPLATE_HASH: template_hash},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                              "name": deployment, "uid": deployment_uid,
                                              "controller": True}]}}


def _pod(name, rs_name, rs_uid, template_hash, **meta):
    refs = [] if rs_uid is None else [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                       "name": rs_name, "uid": rs_uid, "controller": True}]
    return {"metadata": {"name": name, "uid": f"uid-{name}",
                         "labels": {"app": "java-app-1", POD_TEMPLATE_HASH: template_hash},
                         "ownerReferences": refs, **meta}}


def test_only_pods_of_the_decided_deployment_by_uid_and_template_hash_are_its_own() -> None:
    mine = _rs("dep-abc", "rs-1", "dep", "dep-uid", "abc")
    older = _rs("dep-old", "rs-0", "dep", "dep-uid", "old")
    other = _rs("dep-xyz", "rs-9", "dep", "another-deployment-uid", "xyz")  # re-created since
    pods = [
        _pod("p-own", "dep-abc", "rs-1", "abc"),
        _pod("p-own-old-template", "dep-old", "rs-0", "old"),
        _pod("p-colliding-label", "", None, "abc"),  # someone's pod with the same labels
        _pod("p-forged-hash", "dep-abc", "rs-1", "zzz"),
        _pod("p-other-deployment", "dep-xyz", "rs-9", "xyz"),
        _pod("p-going", "dep-abc", "rs-1", "abc", deletionTimestamp="2026-01-01T00:00:00Z"),
    ]
    split = split_pods(pods, [mine, older, other], "dep", "dep-uid")
    assert [meta_of(p)["name"] for p in split.own] == ["p-own", "p-own-old-template"]
    assert [meta_of(p)["name"] for p in split.foreign] == [
        "p-colliding-label", "p-forged-hash", "p-other-deployment"]
    # Without the Deployment's uid no chain can be checked: nothing is the instance's.
    assert split_pods(pods, [mine], "dep", "").own == ()
    message = foreign_pod_message(pods[2], "java-app-1", "dep")
    assert "p-colliding-label" in message and "app=java-app-1" in message
    assert "left alone" in message


def test_a_ref_that_is_not_the_controller_owns_nothing() -> None:
    rs = _rs("dep-abc", "rs-1", "dep", "dep-uid", "abc")
    pod = _pod("p", "dep-abc", "rs-1", "abc")
    pod["metadata"]["ownerReferences"][0]["controller"] = False
    assert split_pods([pod], [rs], "dep", "dep-uid").foreign == (pod,)


# --- the decisions name the Deployment -----------------------------------------------------

def test_a_release_resets_the_pods_of_the_deployment_it_read() -> None:
    a = appdef()
    gone = session(instance=1, deleting=True)
    view = instance(a, 1, holder=gone)
    p = plan(view, a, [gone])
    (reset,) = of(p.actions, ResetPods)
    dep = meta_of(view.get(Part.DEPLOYMENT))
    assert (reset.deployment, reset.deployment_uid) == (dep["name"], dep["uid"])


def test_a_claim_refreshes_the_pods_of_the_deployment_it_read_and_none_of_a_new_one() -> None:
    a = appdef()
    s = session(instance=1, status="HANDLED")
    view = instance(a, 1, holder=s, missing=(Part.EMAIL_CONFIGMAP,))
    (refresh,) = of(plan(view, a, [s]).actions, RefreshPods)
    assert refresh.deployment_uid == meta_of(view.get(Part.DEPLOYMENT))["uid"]
    # A Deployment made by this plan starts its pods with the allow-list written.
    view = instance(a, 1, holder=s, missing=(Part.EMAIL_CONFIGMAP, Part.DEPLOYMENT))
    assert not of(plan(view, a, [s]).actions, RefreshPods)


def test_every_status_a_decision_writes_carries_the_version_it_read() -> None:
    a = appdef()
    s = session(instance=1, status="HANDLING")
    s = dataclasses.replace(s, resource_version="42")
    view = instance(a, 1, holder=s)
    (status,) = of(plan(view, a, [s]).actions, SetSessionStatus)
    assert status.resource_version == "42" and status.uid == s.uid
    # The AppDefinition gone before the claim completed: the ERROR is versioned too.
    (status,) = of(plan(instance(a, 1, holder=s, missing=(Part.DEPLOYMENT,)), None,
                        [s]).actions, SetSessionStatus)
    assert status.resource_version == "42"


# --- a user change while the external Service is missing -----------------------------------

def test_a_user_change_while_the_service_is_missing_releases_and_resets_the_pod() -> None:
    """The corner: no claimed-for to read, so the allow-list says whom the pod served."""
    a = appdef()
    s = session(instance=1, status="HANDLED")
    view = instance(a, 1, holder=s, missing=(Part.EXTERNAL_SERVICE,))
    edited = session(instance=1, status="HANDLED", user="mallory@example.com")
    p = plan(view, a, [edited])
    assert p.holder is None
    assert of(p.actions, ResetPods)
    assert not [x for x in of(p.actions, Patch)
                if "mallory" in str(x.patch.get("data", {}))], "the new user got the old pod"


def test_with_the_service_and_the_allow_list_gone_the_holder_keeps_a_reset_instance() -> None:
    """An empty allow-list names no one: the pod may have served anybody. The Session its
    references name keeps the instance (nothing of a live Session's is released or deleted),
    and the pod is reset before the allow-list names it again."""
    a = appdef()
    s = session(instance=1, status="HANDLED")
    view = instance(a, 1, holder=s, missing=(Part.EXTERNAL_SERVICE,))
    email = copy.deepcopy(view.get(Part.EMAIL_CONFIGMAP))
    email["data"]["authenticated-emails-list"] = ""
    p = plan(with_objects(view, EMAIL_CONFIGMAP=email), a, [s])
    assert p.holder == s and not p.released
    reset = next(i for i, x in enumerate(p.actions) if isinstance(x, ResetPods))
    allow = next(i for i, x in enumerate(p.actions) if isinstance(x, Patch)
                 and x.part is Part.EMAIL_CONFIGMAP)
    assert reset < allow
    assert p.actions[allow].patch["data"]["authenticated-emails-list"] == s.user
    # With the allow-list ConfigMap deleted too: the same, it is created after the reset.
    p = plan(with_objects(view, EMAIL_CONFIGMAP=None), a, [s])
    assert p.holder == s and of(p.actions, ResetPods)


def test_the_holder_the_allow_list_names_keeps_its_instance_and_gets_its_service_back() -> None:
    a = appdef()
    s = session(instance=1, status="HANDLED")
    view = instance(a, 1, holder=s, missing=(Part.EXTERNAL_SERVICE,))
    p = plan(view, a, [s])
    assert p.holder == s and not of(p.actions, ResetPods)
    # The same person in another case (oauth2-proxy lower-cases both): still the holder.
    shouted = session(instance=1, status="HANDLED", user=s.user.upper())
    assert plan(view, a, [shouted]).holder == shouted


def test_a_change_of_case_only_keeps_the_instance_while_the_service_is_there() -> None:
    a = appdef()
    s = session(instance=1, status="HANDLED")
    shouted = session(instance=1, status="HANDLED", user=s.user.upper())
    p = plan(instance(a, 1, holder=s), a, [shouted])
    assert p.holder == shouted and not of(p.actions, ResetPods)


def test_a_claim_annotated_before_the_normalisation_is_still_its_users() -> None:
    from warmpool.pool import naming
    a = appdef()
    s = session(instance=1, status="HANDLED", user="Jane@Example.com")
    view = instance(a, 1, holder=s)
    ext = copy.deepcopy(view.get(Part.EXTERNAL_SERVICE))
    ext["metadata"]["annotations"]["warmpool.io/claimed-for"] = naming.claimed_for_as_spelt(
        s.uid, s.user)
    p = plan(with_objects(view, EXTERNAL_SERVICE=ext), a, [s])
    assert p.holder == s and not of(p.actions, ResetPods)
    # ... and is brought to the current form (the user as oauth2-proxy compares it).
    (patch,) = of(p.actions, Patch)
    assert patch.patch["metadata"]["annotations"]["warmpool.io/claimed-for"] == (
        naming.claimed_for(s.uid, "jane@example.com"))


# --- a holder's reference removed by hand from the external Service (issue #27) -------------

def _without_session_refs(view, part_name="EXTERNAL_SERVICE"):
    obj = copy.deepcopy(view.get(Part[part_name]))
    obj["metadata"]["ownerReferences"] = [r for r in obj["metadata"]["ownerReferences"]
                                          if r.get("kind") != "Session"]
    return with_objects(view, **{part_name: obj})


def test_a_reference_removed_by_hand_is_put_back_not_released() -> None:
    a = appdef()
    s = session(instance=1, status="HANDLED")
    p = plan(_without_session_refs(instance(a, 1, holder=s)), a, [s])
    assert p.holder == s and p.state.name == "CLAIMED" and not p.released
    assert not of(p.actions, ResetPods)
    (patch,) = of(p.actions, Patch)
    assert patch.part is Part.EXTERNAL_SERVICE
    assert s.owner_reference() in patch.patch["metadata"]["ownerReferences"]


def test_without_the_annotation_or_with_a_forged_claimed_for_the_session_holds_nothing() -> None:
    from warmpool.pool import naming
    a = appdef()
    s = session(instance=1, status="HANDLED")
    bare = _without_session_refs(instance(a, 1, holder=s))
    # Not annotated with this instance: the Service's word alone makes no holder.
    elsewhere = session(instance=2, status="HANDLED")
    assert plan(bare, a, [elsewhere]).holder is None
    # A claimed-for naming the Session but another user (a forgery, or a user change).
    ext = copy.deepcopy(bare.get(Part.EXTERNAL_SERVICE))
    ext["metadata"]["annotations"]["warmpool.io/claimed-for"] = naming.claimed_for(
        s.uid, "mallory@example.com")
    assert plan(with_objects(bare, EXTERNAL_SERVICE=ext), a, [s]).holder is None


class _ListingKube:
    """Answers the executor's pod and ReplicaSet LISTs; the watch cache's ReplicaSets (any
    resourceVersion but None) lag behind etcd's; records each LIST and each pod patch."""

    def __init__(self, pods, cached_sets, etcd_sets) -> None:
        self.pods, self.cached_sets, self.etcd_sets = pods, cached_sets, etcd_sets
        self.lists: list[tuple[str, str | None]] = []
        self.patched: list[str] = []

    def list(self, api_version, kind, namespace, label_selector=None, resource_version=None):
        self.lists.append((kind, resource_version))
        if kind == "Pod":
            return self.pods, "9"
        return (self.etcd_sets if resource_version is None else self.cached_sets), "9"

    def merge_patch(self, api_version, kind, namespace, name, patch, resource_version=None):
        self.patched.append(name)
        return {"metadata": {"name": name, "resourceVersion": "10"}}


def test_a_pod_whose_replicaset_the_watch_cache_lacks_yet_is_still_refreshed() -> None:
    new_rs = _rs("dep-new", "rs-2", "dep", "dep-uid", "new")
    pod = _pod("p-new", "dep-new", "rs-2", "new")
    kube = _ListingKube([pod], cached_sets=[], etcd_sets=[new_rs])
    Executor(kube, "ns", Unguarded()).apply([RefreshPods("java-app-1", "dep", "dep-uid")])
    # Not taken for a foreign pod (no Warning, no skip): the owners read again from etcd.
    assert kube.patched == ["p-new"]
    assert sorted(kube.lists, key=str) == sorted(
        [("Pod", "0"), ("ReplicaSet", "0"), ("ReplicaSet", None)], key=str)
    # With every owner in the cached list, nothing more is read.
    kube = _ListingKube([pod], cached_sets=[new_rs], etcd_sets=[new_rs])
    Executor(kube, "ns", Unguarded()).apply([RefreshPods("java-app-1", "dep", "dep-uid")])
    assert kube.patched == ["p-new"] and len(kube.lists) == 2
