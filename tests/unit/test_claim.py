"""Claim choice and input validation (pool-spec.md §4 'Claim' and 'Bad input')."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from tests.unit.pool_fixtures import appdef, instance, session, with_objects
from warmpool.pool import naming
from warmpool.pool.builders import PoolSettings
from warmpool.pool.claim import (
    ClaimError,
    ClaimHeld,
    ClaimSkip,
    ClaimTry,
    ClaimWait,
    decide_claim,
)
from warmpool.pool.model import AppDefinition, Invalid, parse_appdefinition, session_error
from warmpool.pool.parts import Part


def pool(a, holders=None, missing=None):
    holders, missing = holders or {}, missing or {}
    return {k: instance(a, k, holder=holders.get(k), missing=missing.get(k, ()))
            for k in range(1, a.min_instances + 1)}


def test_lowest_free_complete_instance_is_tried_first() -> None:
    a = appdef(min_instances=4)
    s_held = session("held", instance=1, status="HANDLED")
    instances = pool(a, holders={1: s_held}, missing={2: (Part.DEPLOYMENT,)})
    new = session("new", created="2026-01-01T00:00:09Z")
    assert decide_claim(new, a, instances, [s_held, new]) == ClaimTry((3, 4))


def test_concurrent_waiting_sessions_target_different_instances() -> None:
    a = appdef(min_instances=3)
    old = session("old", created="2026-01-01T00:00:01Z")
    mid = session("mid", user="bob@example.com", created="2026-01-01T00:00:02Z")
    young = session("young", user="eve@example.com", created="2026-01-01T00:00:03Z")
    everyone = [old, mid, young]
    instances = pool(a)
    assert decide_claim(old, a, instances, everyone) == ClaimTry((1, 2, 3))
    assert decide_claim(mid, a, instances, everyone) == ClaimTry((2, 1, 3))
    assert decide_claim(young, a, instances, everyone) == ClaimTry((3, 1, 2))


def test_no_free_instance_waits_with_a_reason() -> None:
    a = appdef(min_instances=1)
    held = session("held", instance=1, status="HANDLED")
    new = session("new", created="2026-01-01T00:00:09Z")
    decision = decide_claim(new, a, pool(a, holders={1: held}), [held, new])
    assert isinstance(decision, ClaimWait) and "free instance" in decision.message
    assert decision.behind == ""  # nothing free: nothing unusual to log


def test_oldest_waiting_session_is_served_first() -> None:
    a = appdef(min_instances=1)
    old = session("old", created="2026-01-01T00:00:01Z")
    young = session("young", user="bob@example.com", created="2026-01-01T00:00:05Z")
    instances = pool(a)
    assert isinstance(decide_claim(young, a, instances, [old, young]), ClaimWait)
    assert decide_claim(old, a, instances, [old, young]) == ClaimTry((1,))


def test_instance_with_release_traces_is_not_free() -> None:
    a = appdef(min_instances=1)
    view = instance(a, 1)
    email = copy.deepcopy(view.get(Part.EMAIL_CONFIGMAP))
    email["data"]["authenticated-emails-list"] = "previous@example.com"
    s = session()
    assert isinstance(decide_claim(s, a, {1: with_objects(view, EMAIL_CONFIGMAP=email)}, [s]),
                      ClaimWait)


def test_a_session_that_already_holds_reconciles_its_instance() -> None:
    a = appdef(min_instances=2)
    s = session(instance=2, status="HANDLING")
    assert decide_claim(s, a, pool(a, holders={2: s}), [s]) == ClaimHeld(2)


@pytest.mark.parametrize("appdef_state", ["invalid", "deleting", "gone"])
def test_a_holder_keeps_its_instance_whatever_happens_to_its_appdefinition(appdef_state) -> None:
    a = appdef(min_instances=2)
    s = session(instance=1, status="HANDLED")
    instances = pool(a, holders={1: s})
    now = {"invalid": Invalid("bad"), "deleting": appdef(min_instances=2, deleting=True),
           "gone": None}[appdef_state]
    assert decide_claim(s, now, instances, [s]) == ClaimHeld(1)


def test_unknown_appdefinition_is_an_error() -> None:
    s = session(appdef_name="nope")
    decision = decide_claim(s, None, {}, [s])
    assert isinstance(decision, ClaimError) and "'nope' not found" in decision.message


def test_invalid_appdefinition_makes_the_session_wait() -> None:
    s = session()
    assert isinstance(decide_claim(s, Invalid("bad"), {}, [s]), ClaimWait)


def test_deleting_session_is_skipped() -> None:
    s = session(deleting=True)
    assert isinstance(decide_claim(s, appdef(), {}, [s]), ClaimSkip)


@pytest.mark.parametrize(
    "user",
    ["", "   ", "jane@example.com\nbob@example.com", "jane@example.com,bob@example.com",
     "jane @example.com", "no-at-sign", "two@@example.com", "a@b@c.com", " jane@example.com",
     "jane@example.com\n"],
)
def test_bad_users_are_errors_and_never_claim(user: str) -> None:
    s = session(user=user)
    assert session_error(s) is not None
    decision = decide_claim(s, appdef(), pool(appdef()), [s])
    assert isinstance(decision, ClaimError)
    assert user.strip() == "" or user.strip() not in decision.message  # no address in messages


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"minInstances": -1}, ">= 0"),
        ({"minInstances": 5, "maxInstances": 2}, "must not exceed"),
        ({"minInstances": "3"}, "must be an integer"),
        ({"minInstances": 2.5}, "must be an integer"),
        ({"minInstances": True}, "must be an integer"),
        ({"minInstances": None}, "is missing"),
        ({"port": None}, "spec.port is missing"),
        ({"port": 70000}, "TCP port"),
        ({"image": ""}, "spec.image"),
        ({"name": "bad name!"}, "spec.name"),
        ({"name": "x" * 70}, "spec.name is 70 characters"),
        ({"name": "y" * 61}, "at most 60 fit"),
        ({"name": "z" * 58, "maxInstances": 1000}, "maxInstances (1000) at most 57 fit"),
    ],
)
def test_invalid_appdefinitions_are_refused_with_a_precise_message(spec, fragment) -> None:
    base = {"name": "ok", "image": "img", "port": 3000, "minInstances": 1, "maxInstances": 3}
    base.update(spec)
    base = {k: val for k, val in base.items() if val is not None}
    parsed = parse_appdefinition({"metadata": {"name": "a", "uid": "u" * 20}, "spec": base})
    assert isinstance(parsed, Invalid) and fragment in parsed.message


@pytest.mark.parametrize(("name", "max_instances"), [("y" * 60, 3), ("z" * 57, 1000),
                                                     ("_edge_", 3)])
def test_the_longest_spec_names_that_keep_each_instances_selector_apart(
    name, max_instances
) -> None:
    spec = {"name": name, "image": "img", "port": 3000, "minInstances": 1,
            "maxInstances": max_instances}
    parsed = parse_appdefinition({"metadata": {"name": "a", "uid": "u" * 20}, "spec": spec})
    assert isinstance(parsed, AppDefinition), parsed
    selectors = {naming.app_selector(name, k) for k in range(1, max_instances + 1)}
    assert len(selectors) == max_instances


# --- sessionsPerUser (session-lifecycle §6) -------------------------------------------------

def _limited(s, everyone, limit, a=None):
    a = a or appdef(min_instances=3)
    return decide_claim(s, a, pool(a), [x for x in everyone if x.appdef == a.name],
                        user_sessions=[x for x in everyone if x.user == s.user],
                        sessions_per_user=limit)


def test_the_users_second_session_gets_theia_clouds_exact_error_and_holds_nothing() -> None:
    first = session("s1", created="2026-01-01T00:00:01Z")
    second = session("s2", created="2026-01-01T00:00:02Z", appdef_name="other")
    someone_else = session("s3", user="bob@example.com", created="2026-01-01T00:00:00Z")
    everyone = [first, second, someone_else]
    assert _limited(first, everyone, 1) == ClaimTry((2, 1, 3))  # s3 waits before it
    other = parse_appdefinition({"metadata": {"name": "other", "namespace": "ns", "uid": "u-o",
                                              "generation": 1},
                                 "spec": {"name": "other-app", "image": "img", "port": 3000,
                                          "uid": 101, "minInstances": 3, "maxInstances": 3}})
    assert isinstance(other, AppDefinition)
    assert _limited(second, everyone, 1, other) == ClaimError(
        "Max sessions reached.",
        "553:No more sessions allowed for this user, you reached your limit.")
    assert _limited(second, everyone, 2, other) == ClaimTry((1, 2, 3))


def test_no_limit_zero_and_what_counts() -> None:
    s = session("s2", created="2026-01-01T00:00:02Z")
    failed = session("s0", created="2026-01-01T00:00:00Z", status="ERROR")
    leaving = session("s1", created="2026-01-01T00:00:01Z", deleting=True)
    # A failed or departing Session does not lock its user out.
    assert isinstance(_limited(s, [s, failed, leaving], 1), ClaimTry)
    for unlimited in (None, -1):
        assert isinstance(_limited(s, [s, session("s1")], unlimited), ClaimTry)
    assert _limited(s, [s], 0) == ClaimError("Max sessions reached.",
                                             "554:No sessions allowed for this user.")


def test_a_session_that_holds_an_instance_is_never_limited_afterwards() -> None:
    a = appdef(min_instances=3)
    held = session("s2", instance=2, status="HANDLED", created="2026-01-01T00:00:02Z")
    older = session("s1", created="2026-01-01T00:00:01Z")
    decision = decide_claim(held, a, pool(a, holders={2: held}), [held, older],
                            user_sessions=[held, older], sessions_per_user=1)
    assert decision == ClaimHeld(2)


def test_the_limit_comes_from_the_environment_and_a_bad_value_names_the_variable() -> None:
    assert PoolSettings.from_env({}).sessions_per_user is None
    assert PoolSettings.from_env({"WARMPOOL_SESSIONS_PER_USER": "1"}).sessions_per_user == 1
    assert PoolSettings.from_env({"WARMPOOL_SESSIONS_PER_USER": "-1"}).sessions_per_user == -1
    with pytest.raises(ValueError, match="WARMPOOL_SESSIONS_PER_USER must be an integer"):
        PoolSettings.from_env({"WARMPOOL_SESSIONS_PER_USER": "one"})


# --- sessionsPerUser: one total order, users as oauth2-proxy compares them (issue #27) ------

def _as(s, uid=None, user=None):
    import dataclasses
    return dataclasses.replace(s, uid=uid or s.uid, user=user or s.user)


def test_two_sessions_of_one_second_agree_on_which_is_older_by_uid_not_name() -> None:
    from warmpool.pool.claim import claim_order
    same_second = "2026-01-01T00:00:05Z"
    # Names and uids in opposite orders: the name would make each the older of the other
    # for some pair; the uid decides, and both claims see the same order.
    a = _as(session("zz", created=same_second), uid="0000-a")
    b = _as(session("aa", created=same_second), uid="ffff-b")
    assert claim_order(a) < claim_order(b)
    everyone = [a, b]
    assert isinstance(_limited(a, everyone, 1), ClaimTry)
    assert _limited(b, everyone, 1) == ClaimError(
        "Max sessions reached.",
        "553:No more sessions allowed for this user, you reached your limit.")
    # Whichever claim runs first, exactly one of the two is let through.
    verdicts = [isinstance(_limited(s, everyone, 1), ClaimTry) for s in (b, a)]
    assert verdicts.count(True) == 1


def test_the_timestamp_comes_before_the_uid() -> None:
    from warmpool.pool.claim import claim_order
    early = _as(session("s1", created="2026-01-01T00:00:01Z"), uid="ffff")
    late = _as(session("s2", created="2026-01-01T00:00:02Z"), uid="0000")
    assert claim_order(early) < claim_order(late)
    assert isinstance(_limited(early, [early, late], 1), ClaimTry)
    assert isinstance(_limited(late, [early, late], 1), ClaimError)


def test_addresses_that_differ_only_in_case_are_one_user() -> None:
    from warmpool.pool.emails import same_user, user_key
    assert user_key("Jane.Doe@Example.COM") == "jane.doe@example.com"
    assert same_user("U@X.IO", "u@x.io")
    assert not same_user("u@x.io", "v@x.io")
    first = session("s1", user="Jane@Example.com", created="2026-01-01T00:00:01Z")
    second = session("s2", user="jane@example.COM", created="2026-01-01T00:00:02Z")
    a = appdef(min_instances=3)
    assert decide_claim(second, a, pool(a), [first, second], user_sessions=[first, second],
                        sessions_per_user=1) == ClaimError(
        "Max sessions reached.",
        "553:No more sessions allowed for this user, you reached your limit.")
    assert isinstance(decide_claim(first, a, pool(a), [first, second],
                                   user_sessions=[first, second], sessions_per_user=1),
                      ClaimTry)
    # Someone else entirely is not counted.
    other = session("s0", user="jane@example.org", created="2026-01-01T00:00:00Z")
    assert isinstance(_limited(first, [other, first], 1), ClaimTry)


def test_a_younger_session_that_holds_an_instance_counts_against_an_older_one() -> None:
    from warmpool.pool.claim import user_rivals, younger_rivals
    older = session("s1", created="2026-01-01T00:00:01Z")
    younger = session("s2", created="2026-01-01T00:00:02Z")
    # The younger was served first (its claim could not see the older yet): the older is
    # the one refused, so the user still holds one instance.
    assert younger_rivals(older, [older, younger]) == [younger]
    assert user_rivals(older, [older, younger], {younger.uid}).holding == ("s2",)
    a = appdef(min_instances=3)
    assert decide_claim(older, a, pool(a), [older, younger], user_sessions=[older, younger],
                        sessions_per_user=1, holding={younger.uid}) == ClaimError(
        "Max sessions reached.",
        "553:No more sessions allowed for this user, you reached your limit.")
    # Not holding: the older goes first, as ever.
    assert isinstance(_limited(older, [older, younger], 1), ClaimTry)


def test_only_a_claim_about_to_write_under_a_limit_asks_the_server() -> None:
    from warmpool.pool.claim import ClaimBurst, needs_user_recheck
    assert needs_user_recheck(ClaimTry((1,)), 1)
    assert needs_user_recheck(ClaimBurst(4), 2)
    for decision in (ClaimWait("w"), ClaimError("e"), ClaimHeld(1), ClaimSkip("s")):
        assert not needs_user_recheck(decision, 1)
    for unlimited in (None, -1, 0):  # 0 refuses everyone without asking anything
        assert not needs_user_recheck(ClaimTry((1,)), unlimited)


def test_a_session_the_java_operator_started_lazily_is_never_claimed_nor_waited_for() -> None:
    """On a cluster migrated from the Java operator (docs/operating.md), a Session its lazy
    fallback started runs on a Deployment of its own: no pool instance for it, and it takes
    no place in the queue of waiting Sessions."""
    a = appdef(min_instances=1)
    lazy = session("lazy", status="HANDLED", created="2026-01-01T00:00:01Z")
    lazy = dataclasses.replace(lazy, annotations={
        "theia-cloud.io/session-start-strategy": "lazy-fallback"})
    young = session("young", user="bob@example.com", created="2026-01-01T00:00:02Z")
    instances = pool(a)
    assert isinstance(decide_claim(lazy, a, instances, [lazy, young]), ClaimSkip)
    assert decide_claim(young, a, instances, [lazy, young]) == ClaimTry((1,))
