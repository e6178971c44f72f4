"""The fence refuses: a job that finds an instance written under a fence higher than its own
stops before writing, and lifts the Redis fence counter above what it saw, so the next lease
holder carries a higher fence and goes on (issue #15, item 1).

The Redis side runs on fakeredis (real Lua via lupa); the check itself on hand-made views.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from warmpool.controller.guard import LocalLeases, Unguarded
from warmpool.kube.executor import FenceRegression, check_fence, observed_fence
from warmpool.pool import vocabulary as v
from warmpool.pool.instances import InstanceView
from warmpool.pool.parts import PARTS, Part
from warmpool.queue.jobs import JobContext, Jobs
from warmpool.queue.settings import QueueSettings


def view_with_fences(*fences: int | str) -> InstanceView:
    """An instance whose objects carry these fence annotations (one object per value)."""
    objects: dict[Part, dict[str, Any] | None] = dict.fromkeys(PARTS)
    for part, fence in zip(PARTS, fences, strict=False):
        objects[part] = {"metadata": {"name": f"obj-{part.name}",
                                      "annotations": {v.ANNOTATION_FENCE: str(fence)}}}
    return InstanceView(3, objects)


class HeldGuard:
    """A lease that is still valid by its own clock: exactly the case the old check let pass
    (Redis lost the lease and the counter; nobody told this holder)."""

    def __init__(self, fence: int) -> None:
        self.fence = fence
        self.lifted: list[int] = []

    def ensure_held(self) -> None:
        return None

    def lift_fence(self, seen: int) -> None:
        self.lifted.append(seen)


@pytest.fixture
def jobs(client: redis.Redis) -> Jobs:
    return Jobs(client, QueueSettings(redis_url="redis://unused"), router=lambda key: "job")


def start(jobs: Jobs, key: str = "instance/ns/java/3") -> JobContext:
    jobs.queue.add(key)
    lo = jobs.queue.layout
    rid = jobs.client.lpop(lo.messages_list)
    assert rid is not None
    ctx = jobs.begin(key, "m", ("", rid.decode()))
    assert isinstance(ctx, JobContext)
    return ctx


# --- the check -------------------------------------------------------------------------------


def test_a_higher_fence_aborts_even_while_our_lease_still_holds() -> None:
    guard = HeldGuard(fence=4)
    with pytest.raises(FenceRegression, match="fence 9"):
        check_fence(view_with_fences(2, 9, 4), guard)
    assert guard.lifted == [9]  # the next holder gets a fence above 9


def test_an_equal_or_lower_fence_goes_on_and_lifts_nothing() -> None:
    guard = HeldGuard(fence=9)
    check_fence(view_with_fences(9, 3), guard)
    check_fence(view_with_fences(), guard)  # nothing exists yet
    check_fence(view_with_fences("", "garbage", "-5"), guard)  # unreadable: no fence
    assert guard.lifted == []
    assert observed_fence(view_with_fences("12", "x", 7)) == 12


def test_the_regression_is_raised_even_when_lifting_fails() -> None:
    class Unreachable(HeldGuard):
        def lift_fence(self, seen: int) -> None:
            raise redis.ConnectionError("Redis is down")

    with pytest.raises(FenceRegression):
        check_fence(view_with_fences(9), Unreachable(fence=4))


# --- the counter ---------------------------------------------------------------------------


def test_lifting_the_counter_never_lowers_it(jobs: Jobs) -> None:
    lo = jobs.queue.layout
    assert jobs.scripts.lift_fence(10) == 10  # no counter yet (Redis lost it): set
    assert int(jobs.client.get(lo.fence)) == 10
    assert jobs.scripts.lift_fence(4) == 10  # never lowered
    jobs.client.set(lo.fence, 20)
    assert jobs.scripts.lift_fence(15) == 20


def test_after_redis_forgot_a_stale_low_fence_aborts_once_then_the_next_holder_goes_on(
    jobs: Jobs, client: redis.Redis,
) -> None:
    # Objects written by holders before Redis lost its data carry fence 500.
    written = view_with_fences(500, 499)
    client.flushall()
    ctx = start(jobs)
    assert ctx.fence < 500
    with pytest.raises(FenceRegression):
        check_fence(written, ctx.lease)
    jobs.finish(ctx, FenceRegression("stale"))
    # The retry's lease is above every fence the instance carries: it acts.
    again = start(jobs)
    assert again.fence > 500
    check_fence(written, again.lease)
    # A secondary lease (a claim's instance) is lifted the same way.
    other = again.try_lease("instance/ns/java/4")
    assert other is not None
    with pytest.raises(FenceRegression):
        check_fence(view_with_fences(900), other)
    again.release(other)
    assert (third := again.try_lease("instance/ns/java/4")) is not None and third.fence > 900


# --- the in-process leases (sequential runs, tests of the pool core) -------------------------


def test_local_leases_issue_growing_fences_across_instances_and_can_be_lifted() -> None:
    first = LocalLeases()
    with first.try_lease("k") as a:
        assert a is not None
        seen = a.fence
    # A fresh LocalLeases (every sequential run makes one) must not start over below what the
    # previous run wrote: its writes would otherwise look stale to itself.
    with LocalLeases().try_lease("other") as b:
        assert b is not None and b.fence > seen
        b.lift_fence(b.fence + 1000)
        lifted = b.fence + 1000
    with LocalLeases().try_lease("k") as c:
        assert c is not None and c.fence > lifted


def test_unguarded_callers_have_nothing_to_lift() -> None:
    guard = Unguarded()
    guard.lift_fence(10)  # a no-op: tools that write unguarded hold no lease
    assert guard.fence == 0
