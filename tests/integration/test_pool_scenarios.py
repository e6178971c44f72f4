"""pool-spec.md scenarios S1, S2, S4 (sequential), S5 and bad input on the real control plane.

The controller runs in-process and sequentially here (``run_until_quiet``): these tests are about
what the reconcile logic does to a real API server with a real garbage collector. Concurrency
(S3, S6) is tested through the queue's workers.
"""

from __future__ import annotations

import pytest

from tests.crd_sets import BOTH_CRD_SETS
from tests.pool_world import (
    assert_invariants,
    emails,
    held_instance,
    instance_objects,
    owner_kinds,
    session,
    snapshot,
)
from tests.waiting import wait_for
from warmpool.controller.sequential import run_until_quiet
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings
from warmpool.pool.model import parse_session
from warmpool.testing.world import (
    USERS,
    create_appdef,
    create_session,
    delete_session,
    patch_appdef_spec,
)


def _claim_all(kube, ns, count, appdef="java"):
    for i in range(1, count + 1):
        create_session(kube, ns, f"s{i}", USERS[i], appdef)
    run_until_quiet(kube, ns)
    return {f"s{i}": held_instance(kube, ns, f"s{i}") for i in range(1, count + 1)}


@BOTH_CRD_SETS
@pytest.mark.parametrize("release", ["before-gc", "after-gc"])
def test_s1_lowering_min_below_claimed_ids_keeps_them_and_release_deletes_them(
    kube, namespace, release
) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=5)
    run_until_quiet(kube, ns)
    held = _claim_all(kube, ns, 5)
    assert sorted(held.values()) == [1, 2, 3, 4, 5]
    assert_invariants(kube, ns)
    untouched = {k: snapshot(kube, ns, "java", k) for k in (1, 2)}

    patch_appdef_spec(kube, ns, "java", minInstances=2)
    run_until_quiet(kube, ns)

    for name, k in held.items():
        objs = instance_objects(kube, ns, "java", k)
        assert len(objs) == 5, f"instance {k} lost objects: {sorted(objs)}"
        assert emails(kube, ns, "java", k) == USERS[int(name[1:])]
        for obj in objs.values():
            assert owner_kinds(obj) == ["AppDefinition", "Session"]
    for k in (1, 2):
        assert snapshot(kube, ns, "java", k) == untouched[k], f"instance {k} was touched"
    assert_invariants(kube, ns)

    released = [n for n, k in held.items() if k > 2]
    for name in released:
        delete_session(kube, ns, name)
    if release == "after-gc":
        # The controller is "stopped": let the garbage collector strip the Session references.
        def gc_done() -> bool:
            return all("Session" not in owner_kinds(o)
                       for k in (3, 4, 5) for o in instance_objects(kube, ns, "java", k).values())
        wait_for(gc_done, timeout=90, message="GC to drop the Session owner references")
    run_until_quiet(kube, ns)

    for k in (3, 4, 5):
        wait_for(lambda k=k: not instance_objects(kube, ns, "java", k), timeout=30,
                 message=f"instance {k} to be deleted")
    assert_invariants(kube, ns)


@BOTH_CRD_SETS
def test_s2_spec_change_replaces_free_instances_and_claimed_ones_after_release(
    kube, namespace
) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=3)
    run_until_quiet(kube, ns)
    held = _claim_all(kube, ns, 2)
    assert sorted(held.values()) == [1, 2]
    patch_appdef_spec(kube, ns, "java", image="theiacloud/theia-cloud-demo:2.0")
    run_until_quiet(kube, ns)

    def gens(k):
        return {o["metadata"]["labels"][v.LABEL_GENERATION]
                for o in instance_objects(kube, ns, "java", k).values()}
    assert gens(1) == {"1"} and gens(2) == {"1"}  # claimed: kept as they were
    assert gens(3) == {"2"}  # free: replaced
    assert emails(kube, ns, "java", held["s1"]) == USERS[1]
    assert_invariants(kube, ns)

    delete_session(kube, ns, "s1")
    run_until_quiet(kube, ns)
    assert gens(held["s1"]) == {"2"}
    assert emails(kube, ns, "java", held["s1"]) == ""
    assert_invariants(kube, ns)


@BOTH_CRD_SETS
def test_scaling_keeps_free_instances_warm_and_relabels_them(kube, namespace) -> None:
    """Every spec change bumps the generation, minInstances included: only the label moves."""
    ns = namespace
    create_appdef(kube, ns, min_instances=2)
    run_until_quiet(kube, ns)
    uids = {k: {n: o["metadata"]["uid"] for n, o in instance_objects(kube, ns, "java", k).items()}
            for k in (1, 2)}
    patch_appdef_spec(kube, ns, "java", minInstances=3)
    run_until_quiet(kube, ns)
    patch_appdef_spec(kube, ns, "java", minInstances=2)
    run_until_quiet(kube, ns)
    for k in (1, 2):
        objs = instance_objects(kube, ns, "java", k)
        assert {n: o["metadata"]["uid"] for n, o in objs.items()} == uids[k]
        assert {o["metadata"]["labels"][v.LABEL_GENERATION] for o in objs.values()} == {"3"}
    assert not instance_objects(kube, ns, "java", 3)
    assert_invariants(kube, ns)


@BOTH_CRD_SETS
def test_s4_release_then_claim_of_the_same_instance_admits_only_the_new_user(
    kube, namespace
) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=1)
    run_until_quiet(kube, ns)
    create_session(kube, ns, "old", USERS[1])
    run_until_quiet(kube, ns)
    assert held_instance(kube, ns, "old") == 1
    delete_session(kube, ns, "old")
    create_session(kube, ns, "new", USERS[2])
    run_until_quiet(kube, ns)
    assert held_instance(kube, ns, "new") == 1
    assert emails(kube, ns, "java", 1) == USERS[2]
    assert_invariants(kube, ns)


@BOTH_CRD_SETS
def test_waiting_sessions_are_served_oldest_first_when_an_instance_frees(kube, namespace) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=1, max_instances=1)  # no room to burst
    run_until_quiet(kube, ns)
    for name, user in (("first", USERS[1]), ("second", USERS[2]), ("third", USERS[3])):
        create_session(kube, ns, name, user)
    run_until_quiet(kube, ns)
    assert held_instance(kube, ns, "first") == 1
    for name in ("second", "third"):
        status = session(kube, ns, name)["status"]
        assert status["operatorStatus"] == "HANDLING" and "Waiting" in status["operatorMessage"]
    assert_invariants(kube, ns)
    delete_session(kube, ns, "first")
    run_until_quiet(kube, ns)
    assert held_instance(kube, ns, "second") == 1
    assert held_instance(kube, ns, "third") is None
    assert_invariants(kube, ns)


@BOTH_CRD_SETS
@pytest.mark.parametrize("purpose", ["emails", "proxy"])
def test_s5_configmap_of_claimed_instance_deleted_by_hand_is_recreated(
    kube, namespace, purpose
) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=2)
    run_until_quiet(kube, ns)
    create_session(kube, ns, "s1", USERS[1])
    run_until_quiet(kube, ns)
    k = held_instance(kube, ns, "s1")
    (victim,) = [o for key, o in instance_objects(kube, ns, "java", k).items()
                 if key.startswith("ConfigMap/")
                 and o["metadata"]["labels"][v.LABEL_TEMPLATE_PURPOSE] == purpose]
    kube.delete("v1", "ConfigMap", ns, victim["metadata"]["name"])
    run_until_quiet(kube, ns)
    again = instance_objects(kube, ns, "java", k)
    assert f"ConfigMap/{victim['metadata']['name']}" in again
    assert emails(kube, ns, "java", k) == USERS[1]
    assert_invariants(kube, ns)


@BOTH_CRD_SETS
def test_adopts_the_java_operators_broken_state(kube, namespace) -> None:
    """The defect's aftermath: ConfigMaps deleted, AppDefinition reference stripped."""
    ns = namespace
    create_appdef(kube, ns, min_instances=3)
    run_until_quiet(kube, ns)
    create_session(kube, ns, "s1", USERS[1])
    create_session(kube, ns, "s2", USERS[2])
    create_session(kube, ns, "s3", USERS[3])
    run_until_quiet(kube, ns)
    objs = instance_objects(kube, ns, "java", 3)
    for key, obj in objs.items():
        kind, name = key.split("/")
        api = "apps/v1" if kind == "Deployment" else "v1"
        if kind == "ConfigMap":
            kube.delete(api, kind, ns, name)
        else:
            sess = [r for r in obj["metadata"]["ownerReferences"] if r["kind"] == "Session"]
            kube.merge_patch(api, kind, ns, name, {"metadata": {"ownerReferences": sess}})
    run_until_quiet(kube, ns)
    assert len(instance_objects(kube, ns, "java", 3)) == 5
    assert emails(kube, ns, "java", 3) == USERS[3]
    assert_invariants(kube, ns)


def test_appdefinition_deleted_under_a_live_session_keeps_its_instance_and_allow_list(
    kube, namespace
) -> None:
    """The GC strips the deleted AppDefinition's reference from the held instance's objects:
    the controller must still see them (by the holder's reference) and keep the allow-list
    right, and the free instance goes with its AppDefinition."""
    ns = namespace
    create_appdef(kube, ns, min_instances=2)
    run_until_quiet(kube, ns)
    k = _claim_all(kube, ns, 1)["s1"]
    objects = instance_objects(kube, ns, "java", k)
    kept = {name: o["metadata"]["uid"] for name, o in objects.items()}

    kube.delete(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java")

    def gc_done() -> bool:
        objs = instance_objects(kube, ns, "java", k)
        return (len(objs) == 5 and all(owner_kinds(o) == ["Session"] for o in objs.values())
                and not instance_objects(kube, ns, "java", 3 - k))
    wait_for(gc_done, timeout=90, message="GC to strip the AppDefinition references")
    assert_invariants(kube, ns)  # before the fix: I1, all five objects "missing"

    (email_cm,) = [o["metadata"]["name"] for name, o in objects.items()
                   if name.startswith("ConfigMap/")
                   and o["metadata"]["labels"][v.LABEL_TEMPLATE_PURPOSE] == v.PURPOSE_EMAILS]
    kube.merge_patch("v1", "ConfigMap", ns, email_cm, {"data": {v.EMAILS_KEY: USERS[2]}})
    run_until_quiet(kube, ns)

    assert emails(kube, ns, "java", k) == USERS[1]
    assert {n: o["metadata"]["uid"] for n, o in instance_objects(kube, ns, "java", k).items()} \
        == kept
    assert_invariants(kube, ns)


def test_claim_in_flight_when_its_appdefinition_goes_ends_in_error_keeping_what_it_holds(
    kube, namespace
) -> None:
    """The claim's deciding write (the Session's reference on the external Service) lands, then
    the AppDefinition is deleted before the Session is annotated: the garbage collector takes
    the four objects without the reference. The claim cannot be completed; the Session must
    get ERROR with a message (not wait forever) and keep the Service until it ends."""
    ns = namespace
    create_appdef(kube, ns, min_instances=1)
    run_until_quiet(kube, ns)
    s1 = parse_session(create_session(kube, ns, "s1", USERS[1]))
    (ext,) = [o for name, o in instance_objects(kube, ns, "java", 1).items()
              if name.startswith("Service/")
              and v.LABEL_SERVICE_TYPE not in o["metadata"]["labels"]]
    ext_name = ext["metadata"]["name"]
    kube.merge_patch("v1", "Service", ns, ext_name, {"metadata": {
        "ownerReferences": [*ext["metadata"]["ownerReferences"], s1.owner_reference()]}},
        resource_version=ext["metadata"]["resourceVersion"])

    kube.delete(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java")

    def gc_done() -> bool:
        left = instance_objects(kube, ns, "java", 1)
        return (list(left) == [f"Service/{ext_name}"]
                and owner_kinds(left[f"Service/{ext_name}"]) == ["Session"])
    wait_for(gc_done, timeout=90,
             message="GC to take the objects without the Session's reference")
    run_until_quiet(kube, ns)

    status = session(kube, ns, "s1").get("status") or {}
    assert status.get("operatorStatus") == v.STATUS_ERROR
    assert "deleted before the claim of instance 1 completed" in status.get("operatorMessage", "")
    kept = kube.get("v1", "Service", ns, ext_name)
    assert kept is not None and kept["metadata"]["uid"] == ext["metadata"]["uid"]

    delete_session(kube, ns, "s1")
    wait_for(lambda: not instance_objects(kube, ns, "java", 1), timeout=90,
             message="the release (or the GC) to remove the Service once the Session ended")


BAD_USERS = {
    "empty": "",
    "multi-line": f"{USERS[1]}\n{USERS[2]}",
    "comma": f"{USERS[1]},{USERS[2]}",
    "whitespace": "user1 @example.com",
    "no-at": "not-an-address",
}


@pytest.mark.parametrize("case", sorted(BAD_USERS))
def test_bad_session_user_gets_error_status_and_takes_nothing(kube, namespace, case) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=1)
    run_until_quiet(kube, ns)
    before = snapshot(kube, ns, "java", 1)
    create_session(kube, ns, "bad", BAD_USERS[case])
    run_until_quiet(kube, ns)
    status = session(kube, ns, "bad")["status"]
    assert status["operatorStatus"] == "ERROR"
    assert "spec.user" in status["operatorMessage"]
    assert snapshot(kube, ns, "java", 1) == before
    assert_invariants(kube, ns)


def test_a_session_with_a_long_name_is_served(kube, namespace) -> None:
    """Session names may have 253 characters; label values only 63 (finding of the chaos work)."""
    ns, name = namespace, "s" + "-long" * 24  # 121 characters
    create_appdef(kube, ns, min_instances=1)
    run_until_quiet(kube, ns)
    create_session(kube, ns, name, USERS[1])
    run_until_quiet(kube, ns)
    assert held_instance(kube, ns, name) == 1
    assert session(kube, ns, name)["status"]["operatorStatus"] == "HANDLED"
    assert emails(kube, ns, "java", 1) == USERS[1]
    assert_invariants(kube, ns)


def test_session_for_unknown_appdefinition_gets_error(kube, namespace) -> None:
    ns = namespace
    create_session(kube, ns, "lost", USERS[1], appdef="does-not-exist")
    run_until_quiet(kube, ns)
    status = session(kube, ns, "lost")["status"]
    assert status["operatorStatus"] == "ERROR"
    assert "'does-not-exist' not found" in status["operatorMessage"]


@pytest.mark.parametrize("bad", [{"minInstances": -1}, {"minInstances": 9, "maxInstances": 3},
                                 {"minInstances": "abc"}])
def test_invalid_appdefinition_is_reported_and_its_pool_left_as_it_is(
    kube, namespace, bad
) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=2)
    run_until_quiet(kube, ns)
    create_session(kube, ns, "s1", USERS[1])
    run_until_quiet(kube, ns)
    before = {k: sorted(instance_objects(kube, ns, "java", k)) for k in (1, 2)}
    patch_appdef_spec(kube, ns, "java", **bad)
    run_until_quiet(kube, ns)
    assert {k: sorted(instance_objects(kube, ns, "java", k)) for k in (1, 2)} == before
    assert emails(kube, ns, "java", held_instance(kube, ns, "s1")) == USERS[1]
    events, _ = kube.list("v1", "Event", ns)
    assert any(e["reason"] == "InvalidAppDefinition" for e in events)


def test_an_annotation_alone_takes_no_instance_and_is_removed(kube, namespace) -> None:
    """pool-spec §4: the deciding write makes a holder, the annotation never does. s2 is
    annotated by hand with s1's instance, s3 with an id far past maxInstances."""
    ns = namespace
    create_appdef(kube, ns, min_instances=3, max_instances=4)
    run_until_quiet(kube, ns)
    _claim_all(kube, ns, 1)
    assert held_instance(kube, ns, "s1") == 1
    for name, k in (("s2", "1"), ("s3", "999999")):
        create_session(kube, ns, name, USERS[int(name[1:])])
        kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name,
                         {"metadata": {"annotations": {v.ANNOTATION_INSTANCE_ID: k}}})

    run_until_quiet(kube, ns)

    assert emails(kube, ns, "java", 1) == USERS[1]  # s1 keeps its instance
    assert {held_instance(kube, ns, "s2"), held_instance(kube, ns, "s3")} == {2, 3}
    assert instance_objects(kube, ns, "java", 999999) == {}
    events, _ = kube.list("v1", "Event", ns)
    ignored = {e["involvedObject"]["name"] for e in events
               if e.get("reason") == "AnnotationIgnored"}
    assert ignored == {"s2", "s3"}
    assert_invariants(kube, ns)


def _pods(kube, ns, k) -> set[str]:
    items, _ = kube.list("v1", "Pod", ns, label_selector=f"{v.LABEL_APP}=java-app-{k}")
    return {p["metadata"]["uid"] for p in items if not p["metadata"].get("deletionTimestamp")}


def test_a_held_sessions_user_changed_gets_a_clean_instance_never_the_old_pod(
    kube, namespace
) -> None:
    """The choice for issue #15's spec.user edit: release and re-claim (README, 'A Session's
    user'). The previous user's pod, and the state in it, never reach the new user."""
    ns = namespace
    create_appdef(kube, ns, min_instances=2)
    run_until_quiet(kube, ns)
    assert _claim_all(kube, ns, 1) == {"s1": 1}
    wait_for(lambda: _pods(kube, ns, 1), timeout=30, message="instance 1's pod")
    old_pods = _pods(kube, ns, 1)

    kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s1",
                     {"spec": {"user": USERS[2]}})
    run_until_quiet(kube, ns)

    k = held_instance(kube, ns, "s1")
    assert k is not None and emails(kube, ns, "java", k) == USERS[2]
    wait_for(lambda: _pods(kube, ns, k), timeout=30, message=f"instance {k}'s pod")
    assert not _pods(kube, ns, k) & old_pods
    assert USERS[1] not in {emails(kube, ns, "java", i) for i in (1, 2)}
    assert_invariants(kube, ns)


def test_sessions_per_user_one_the_second_session_gets_the_exact_error_and_holds_nothing(
    kube, namespace
) -> None:
    """session-lifecycle §6, the limit Theia Cloud's chart sets to 1."""
    ns = namespace
    create_appdef(kube, ns, min_instances=3)
    create_appdef(kube, ns, "other", min_instances=1)
    settings = PoolSettings(sessions_per_user=1)
    run_until_quiet(kube, ns, settings)
    create_session(kube, ns, "s1", USERS[1])
    run_until_quiet(kube, ns, settings)
    create_session(kube, ns, "s2", USERS[1], "other")  # same user, another AppDefinition
    create_session(kube, ns, "s3", USERS[2])

    run_until_quiet(kube, ns, settings)

    status = session(kube, ns, "s2").get("status") or {}
    assert status.get("operatorStatus") == "ERROR"
    assert status.get("operatorMessage") == "Max sessions reached."
    assert status.get("error") == ("553:No more sessions allowed for this user, "
                                   "you reached your limit.")
    assert held_instance(kube, ns, "s2") is None
    assert USERS[1] not in {emails(kube, ns, "other", 1)}
    assert held_instance(kube, ns, "s1") == 1 and held_instance(kube, ns, "s3") == 2


def test_a_status_decided_for_a_session_is_not_written_on_one_re_created_under_its_name(
    kube, namespace
) -> None:
    """Status writes carry the Session's uid (pool-spec §4): a Session deleted and made again
    under the same name is never told it holds its predecessor's instance."""
    from warmpool.controller.guard import Unguarded
    from warmpool.kube.executor import Executor
    from warmpool.pool.actions import SetSessionStatus

    ns = namespace
    old = create_session(kube, ns, "s1", USERS[1])
    delete_session(kube, ns, "s1")
    wait_for(lambda: kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s1") is None,
             timeout=30, message="s1 to be gone")
    new = create_session(kube, ns, "s1", USERS[2])
    executor = Executor(kube, ns, Unguarded())
    handled = {"operatorStatus": "HANDLED", "operatorMessage": "instance 1"}
    for first in (True, False):
        stale = SetSessionStatus("s1", handled, uid=old["metadata"]["uid"], first=first)
        assert executor.apply([stale]) == 0
        assert (session(kube, ns, "s1").get("status") or {}).get("operatorStatus") is None

    # The right uid: written whether the read knew the status was missing or not, and later
    # fields are merged into what is there.
    waits = {"operatorStatus": "HANDLING", "operatorMessage": "waits"}
    assert executor.apply([SetSessionStatus("s1", waits, uid=new["metadata"]["uid"])]) == 1
    assert session(kube, ns, "s1")["status"] == waits
    kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s1",
                     {"status": {"lastActivity": 7}}, status=True)
    assert executor.apply([SetSessionStatus("s1", handled, uid=new["metadata"]["uid"])]) == 1
    assert session(kube, ns, "s1")["status"] == {**handled, "lastActivity": 7}
