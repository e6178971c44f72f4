"""Burst as a pure decision: past the free instances, the r-th waiting Session makes the r-th
spare id above the target; at maxInstances it waits, saying so."""

from __future__ import annotations

from tests.unit.pool_fixtures import appdef, instance, session
from warmpool.pool.claim import (
    ClaimBurst,
    ClaimTry,
    ClaimWait,
    WaitReason,
    capacity,
    decide_claim,
    pool_facts,
)
from warmpool.pool.parts import Part


def test_the_oldest_take_the_free_ones_and_the_rest_make_spare_ids_in_age_order() -> None:
    a = appdef(min_instances=2, max_instances=5)
    waiting = [session(f"s{i}", created=f"2026-01-01T00:00:0{i}Z") for i in range(1, 7)]
    pool = {k: instance(a, k) for k in (1, 2)}
    decisions = [decide_claim(s, a, pool, waiting, burst=True) for s in waiting]
    assert decisions[:2] == [ClaimTry((1, 2)), ClaimTry((2, 1))]
    assert decisions[2:5] == [ClaimBurst(3), ClaimBurst(4), ClaimBurst(5)]
    last = decisions[5]
    assert isinstance(last, ClaimWait) and "all 5 instances" in last.message
    assert last.reason is WaitReason.MAX_INSTANCES
    assert "maxInstances" in last.message
    # Free instances, yet it waits: the log (never the status) names who it read as ahead.
    assert last.behind == ("behind 5 older waiting Sessions (s1, s2, s3, s4, s5); "
                           "free [1, 2], coming []")
    assert all(last.behind not in d.message for d in decisions if isinstance(d, ClaimWait))
    assert capacity(a, pool_facts(pool), burst=True) == 5
    assert capacity(a, pool_facts(pool), burst=False) == 2


def test_an_id_still_being_retired_is_not_made_again() -> None:
    a = appdef(min_instances=1, max_instances=3)
    holder = session("h", instance=1, status="HANDLED")
    s = session("s", created="2026-01-01T00:00:05Z")
    pool = {1: instance(a, 1, holder=holder),
            2: instance(a, 2, missing=(Part.EXTERNAL_SERVICE,))}  # its retirement under way
    assert decide_claim(s, a, pool, [holder, s], burst=True) == ClaimBurst(3)


def test_without_burst_the_session_waits_at_min_instances() -> None:
    a = appdef(min_instances=1, max_instances=3)
    holder = session("h", instance=1, status="HANDLED")
    s = session("s", created="2026-01-01T00:00:05Z")
    pool = {1: instance(a, 1, holder=holder)}
    decision = decide_claim(s, a, pool, [holder, s])
    assert isinstance(decision, ClaimWait) and "prewarmed" in decision.message
    assert decision.reason is WaitReason.MIN_INSTANCES


def test_instances_being_made_or_released_within_the_target_are_waited_for() -> None:
    """A Session that comes just after its pool was made (or while a release finishes) waits
    for the prewarmed instance rather than have a cold one made."""
    a = appdef(min_instances=2, max_instances=5)
    early = session("s1")
    starting = {1: instance(a, 1, missing=(Part.DEPLOYMENT,))}  # 2 not even started
    decision = decide_claim(early, a, starting, [early], burst=True)
    assert isinstance(decision, ClaimWait) and "prewarmed" in decision.message
    assert decision.reason is WaitReason.MIN_INSTANCES
    # Two holders: the third Session past them makes an instance.
    h1, h2 = session("h1", instance=1, status="HANDLED"), session("h2", instance=2,
                                                                   status="HANDLED")
    full = {1: instance(a, 1, holder=h1), 2: instance(a, 2, holder=h2)}
    assert decide_claim(early, a, full, [h1, h2, early], burst=True) == ClaimBurst(3)
