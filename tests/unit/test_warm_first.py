"""Warm first (issue #28): which instances are warm, and the order claims take them in.

Pure: `warmpool.pool.pods` (a pod's state, an instance's warmth), `warmpool.pool.claim`
(warm ids before starting ones, failing ones never), `warmpool.pool.decide` (a cold start is
told), and the fake kubelet's behaviours (`warmpool.cluster.fake_kubelet`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.unit.pool_fixtures import SETTINGS, appdef, instance, session
from warmpool.cluster import fake_kubelet as fk
from warmpool.kube.cache import strip
from warmpool.pool.actions import SetSessionStatus
from warmpool.pool.claim import ClaimTry, ClaimWait, PoolFacts, claimable_ids, decide_claim
from warmpool.pool.decide import COLD_START_NOTE, decide_instance
from warmpool.pool.health import (
    CONDITION,
    FAILURE_CAP,
    PoolHealth,
    condition,
    find_condition,
    may_create,
    needs_write,
    pool_health,
    starts_failing,
)
from warmpool.pool.pods import Warmth, pod_state, strip_pod_status, warmth

DEPLOYMENT = "ws-java-3"


def pod(name: str = "p", *, ready: bool = True, waiting: str = "", rs: str = f"{DEPLOYMENT}-abc",
        template_hash: str = "abc", deleting: bool = False) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    containers = ([{"name": "c", "state": {"waiting": {"reason": waiting}}}] if waiting
                  else [{"name": "c", "state": {"running": {}}}])
    meta: dict[str, Any] = {
        "name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "7",
        "labels": {"app": "java-17-3", "pod-template-hash": template_hash},
        "ownerReferences": [{"kind": "ReplicaSet", "name": rs, "uid": "rs-uid",
                             "controller": True}]}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "c", "image": "img"}]},
            "status": {"phase": "Running" if ready else "Pending", "conditions": conditions,
                       "containerStatuses": containers}}


# --- pods ------------------------------------------------------------------------------------

def test_a_ready_pod_of_the_deployment_makes_the_instance_warm() -> None:
    assert warmth([pod()], DEPLOYMENT) == (Warmth.WARM, "")


def test_no_pod_a_pod_being_reset_or_someone_elses_pod_is_not_warm() -> None:
    assert warmth([], DEPLOYMENT) == (Warmth.STARTING, "")
    assert warmth([pod(deleting=True)], DEPLOYMENT) == (Warmth.STARTING, "")
    assert warmth([pod(ready=False)], DEPLOYMENT) == (Warmth.STARTING, "")
    # A pod whose chain names another ReplicaSet, or whose hash is not its ReplicaSet's.
    assert warmth([pod(rs="other-abc")], DEPLOYMENT) == (Warmth.STARTING, "")
    assert warmth([pod(template_hash="xyz")], DEPLOYMENT) == (Warmth.STARTING, "")


def test_a_pod_that_cannot_start_makes_it_failing_with_its_reason() -> None:
    assert warmth([pod(ready=False, waiting="ImagePullBackOff")], DEPLOYMENT) == (
        Warmth.FAILING, "ImagePullBackOff")
    # One Ready pod is enough, whatever the others do.
    assert warmth([pod("a", ready=False, waiting="CrashLoopBackOff"), pod("b")],
                  DEPLOYMENT) == (Warmth.WARM, "")


def test_a_reason_outside_the_known_failures_is_not_shown_or_counted() -> None:
    """A waiting reason is anyone's text with `patch` on pods/status: compared, never shown."""
    assert warmth([pod(ready=False, waiting="ContainerCreating")], DEPLOYMENT) == (
        Warmth.STARTING, "")
    assert pod_state(pod(ready=False, waiting="x" * 10_000)).failure == ""


def test_the_cache_keeps_only_what_warmth_reads_and_reads_the_same() -> None:
    for p in (pod(), pod(ready=False, waiting="ErrImagePull"), pod(ready=False)):
        kept = strip("Pod", p)
        assert set(kept) == {"apiVersion", "kind", "metadata", "status"}
        assert kept["status"] == strip_pod_status(p["status"])
        assert pod_state(kept) == pod_state(p)
        assert warmth([kept], DEPLOYMENT) == warmth([p], DEPLOYMENT)
    assert strip_pod_status(None) == {"ready": False}
    assert strip_pod_status({"conditions": "garbage", "containerStatuses": [1, None]}) == {
        "ready": False}


# --- the claim's order -----------------------------------------------------------------------

def _facts(clean: set[int], warm: set[int] | None, failing: set[int] = frozenset()) -> PoolFacts:
    ids = frozenset(clean)
    return PoolFacts(existing=ids, clean=ids, referenced=frozenset(),
                     warm=None if warm is None else frozenset(warm),
                     failing=frozenset(failing))


def test_warm_ids_come_first_then_starting_ones_and_failing_ones_never() -> None:
    a = appdef(min_instances=5)
    assert claimable_ids(a, _facts({1, 2, 3, 4, 5}, {3, 5}, {4})) == [3, 5, 1, 2]
    # Pods unknown (a reader without them): the lowest free id, as before.
    assert claimable_ids(a, _facts({1, 2, 3}, None)) == [1, 2, 3]


def test_a_claim_takes_the_lowest_warm_instance_not_the_one_being_reset() -> None:
    """The instance just released (1) has the lowest id and a pod being reset: today's order
    would take it; warm first takes 2."""
    a = appdef(min_instances=3)
    new = session("new")
    views = {k: instance(a, k) for k in (1, 2, 3)}
    decision = decide_claim(new, a, views, [new], _facts({1, 2, 3}, {2, 3}))
    assert decision == ClaimTry((2, 3, 1))


def test_waiting_sessions_spread_over_warm_ids_first_then_fall_back_to_starting() -> None:
    a = appdef(min_instances=3)
    old = session("old", created="2026-01-01T00:00:01Z")
    mid = session("mid", user="bob@example.com", created="2026-01-01T00:00:02Z")
    everyone = [old, mid]
    facts = _facts({1, 2, 3}, {3})
    views = {k: instance(a, k) for k in (1, 2, 3)}
    assert decide_claim(old, a, views, everyone, facts) == ClaimTry((3, 1, 2))
    # The second oldest: the only warm one is the oldest's target, so it starts cold on 1.
    assert decide_claim(mid, a, views, everyone, facts) == ClaimTry((1, 3, 2))


def test_a_pool_whose_pods_cannot_start_makes_sessions_wait_and_says_why() -> None:
    a = appdef(min_instances=2)
    new = session("new")
    views = {k: instance(a, k) for k in (1, 2)}
    decision = decide_claim(new, a, views, [new], _facts({1, 2}, set(), {1, 2}))
    assert isinstance(decision, ClaimWait)
    assert "2 of its 2 prewarmed instances cannot start their pod" in decision.message


# --- a cold start is told --------------------------------------------------------------------

@pytest.mark.parametrize(("state", "told"), [(Warmth.WARM, False), (None, False),
                                             (Warmth.STARTING, True)])
def test_the_handled_message_says_when_the_pod_was_still_starting(state, told) -> None:
    a = appdef(min_instances=2)
    holder = session("s1", instance=1, status="HANDLING")
    view = dataclasses.replace(instance(a, 1, holder=holder), warmth=state)
    plan = decide_instance(view, "java", a, [holder], proxy_template=None, settings=SETTINGS)
    status = next(x for x in plan.actions if isinstance(x, SetSessionStatus))
    assert status.status["operatorStatus"] == "HANDLED"
    assert status.status["operatorMessage"].endswith(COLD_START_NOTE) is told


# --- the fake kubelet ------------------------------------------------------------------------

def _pod_with(image: str) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "side", "image": "proxy"},
                                    {"name": "ide", "image": image}]}}


def test_the_fake_kubelet_plays_what_the_flags_and_the_image_ask() -> None:
    plain = fk.Behaviour()
    assert fk.behaviour_of(_pod_with("theia:1"), plain) == (0.0, "", "")
    assert fk.behaviour_of(_pod_with("fake-kubelet.invalid/start-5s"), plain) == (5.0, "", "")
    assert fk.behaviour_of(_pod_with("fake-kubelet.invalid/pull-error"), plain) == (
        0.0, "ImagePullBackOff", "ide")
    assert fk.behaviour_of(_pod_with("fake-kubelet.invalid/crash-loop:1"), plain) == (
        0.0, "CrashLoopBackOff", "ide")
    flagged = fk.Behaviour(start_delay=2.0, fail=fk.parse_fail("reg.example/*=ImagePullBackOff"))
    assert fk.behaviour_of(_pod_with("theia:1"), flagged) == (2.0, "", "")
    assert fk.behaviour_of(_pod_with("reg.example/bad:1"), flagged)[1] == "ImagePullBackOff"


@pytest.mark.parametrize("text", ["nothing", "x=Unknown", "=ImagePullBackOff"])
def test_a_bad_failure_rule_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="PATTERN=REASON"):
        fk.parse_fail(text)


def test_a_waiting_status_reads_as_starting_or_failing() -> None:
    body = {**pod(), "spec": {"containers": [{"name": "side"}, {"name": "ide"}]}}
    starting = {**body, "status": fk.waiting_status(body, "ContainerCreating")}
    assert warmth([starting], DEPLOYMENT) == (Warmth.STARTING, "")
    failing = {**body, "status": fk.waiting_status(body, "CrashLoopBackOff", "ide")}
    assert warmth([failing], DEPLOYMENT) == (Warmth.FAILING, "CrashLoopBackOff")
    running = {**body, "status": fk.running_status(body, "127.0.0.1")}
    assert warmth([running], DEPLOYMENT) == (Warmth.WARM, "")
    assert not fk.needs_status(running)


# --- a pool whose pods cannot start ----------------------------------------------------------

def test_pool_health_counts_and_caps() -> None:
    found = pool_health([(Warmth.WARM, ""), (Warmth.STARTING, ""),
                         (Warmth.FAILING, "ImagePullBackOff"), (Warmth.FAILING, "ErrImagePull")])
    assert found == PoolHealth(1, 1, 2, ("ErrImagePull", "ImagePullBackOff"))
    assert not found.capped and may_create(found) and may_create(None)
    capped = pool_health([(Warmth.FAILING, "CrashLoopBackOff")] * FAILURE_CAP)
    assert capped.capped and not may_create(capped)


def test_the_condition_keeps_its_transition_time_and_warns_once() -> None:
    capped = PoolHealth(0, 0, FAILURE_CAP, ("ImagePullBackOff",))
    first = condition(capped, 2, "2026-01-01T00:00:00Z", None)
    assert (first["type"], first["status"], first["reason"], first["observedGeneration"]) == (
        CONDITION, "True", "ImagePullBackOff", 2)
    assert starts_failing(None, first) and needs_write(None, first)
    again = condition(PoolHealth(1, 0, FAILURE_CAP + 1, ("ImagePullBackOff",)), 2,
                      "2026-01-01T00:05:00Z", first)
    assert again["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    # Other counts, the same story: no write (a status write wakes the pool's resync).
    assert not needs_write(first, again) and not starts_failing(first, again)
    # A pool that never failed gets no condition at all.
    assert not needs_write(None, condition(PoolHealth(3, 0, 0), 1, "t", None))
    healed = condition(PoolHealth(3, 0, 0), 3, "2026-01-01T00:09:00Z", first)
    assert (healed["status"], healed["lastTransitionTime"]) == ("False", "2026-01-01T00:09:00Z")
    assert needs_write(first, healed) and not starts_failing(first, healed)


def test_only_our_condition_is_read_from_a_status_anyone_can_write() -> None:
    ours = {"type": CONDITION, "status": "True"}
    assert find_condition({"conditions": [{"type": "Other"}, ours, "junk"]}) == ours
    for status in (None, "x", {"conditions": "x"}, {"conditions": [{"type": "Other"}]}):
        assert find_condition(status) is None
