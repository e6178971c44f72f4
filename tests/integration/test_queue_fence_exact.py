"""The fence poisoning of issue #27 (point 1), end to end on a real Redis.

Before the fix: a `warmpool.io/fence: "99999999999999"` annotation on one pool object made
the job that read it lift the shared counter; Redis's Lua then rendered the next lease value
as "1e+14|<token>" and `Scripts.start` raised ValueError for every key of every namespace.
Here the annotation is read by the real `check_fence` under a real lease, and the next start
of an unrelated key (another namespace) must work, with exact fences above 10^14 and at the
ceiling; a foreign value must not move the counter at all; garbage written into the lease
and counter keys by someone else is repaired by the next start.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis

from warmpool.kube.executor import FenceRegression, check_fence
from warmpool.pool import vocabulary as v
from warmpool.pool.actions import Report
from warmpool.pool.instances import InstanceView
from warmpool.pool.parts import PARTS, Part
from warmpool.queue.jobs import JobContext, Jobs
from warmpool.queue.maintenance import Maintenance
from warmpool.queue.scripts import FENCE_CEILING
from warmpool.queue.settings import QueueSettings

pytestmark = pytest.mark.redis

POISONED = "instance/ns-a/java/3"
UNRELATED = "instance/ns-b/python/7"


def annotated(value: str) -> InstanceView:
    """An instance whose external Service carries `value` as its fence annotation."""
    objects: dict[Part, dict[str, Any] | None] = dict.fromkeys(PARTS)
    objects[Part.EXTERNAL_SERVICE] = {"metadata": {
        "name": "java-3-ext", "annotations": {v.ANNOTATION_FENCE: value}}}
    return InstanceView(3, objects)


@pytest.fixture
def jobs(redis_client: redis.Redis, queue_settings: QueueSettings) -> Jobs:
    return Jobs(redis_client, queue_settings, router=lambda key: "job")


def run(jobs: Jobs, key: str) -> JobContext:
    """Add `key` and start it as a worker does (the delivered message's id acked)."""
    jobs.queue.add(key)
    lo = jobs.queue.layout
    rid = jobs.client.lpop(lo.messages_list_of(lo.queue_of(key)))
    assert rid is not None
    ctx = jobs.begin(key, "m", ("", rid.decode()))
    assert isinstance(ctx, JobContext), ctx
    return ctx


def test_a_high_valid_fence_lifts_and_every_other_key_still_starts_exactly(jobs: Jobs) -> None:
    lo = jobs.queue.layout
    ctx = run(jobs, POISONED)
    with pytest.raises(FenceRegression):
        check_fence(annotated("99999999999999"), ctx.lease)
    jobs.finish(ctx, FenceRegression("stale"))
    assert jobs.client.get(lo.fence) == b"99999999999999"

    other = run(jobs, UNRELATED)  # raised ValueError ('1e+14') before the fix
    assert other.fence == 100_000_000_000_000
    assert jobs.client.get(lo.lease(UNRELATED)) == other.lease.value.encode()
    assert other.lease.value.startswith("100000000000000|")
    jobs.finish(other)
    # The poisoned instance's own retry is above the annotation and goes on.
    again = run(jobs, POISONED)
    assert again.fence == 100_000_000_000_001
    check_fence(annotated("99999999999999"), again.lease)
    jobs.finish(again)


def test_near_the_ceiling_fences_stay_exact_and_incr_never_overflows(jobs: Jobs) -> None:
    lo = jobs.queue.layout
    ctx = run(jobs, POISONED)
    with pytest.raises(FenceRegression):
        check_fence(annotated(str(FENCE_CEILING)), ctx.lease)
    jobs.finish(ctx, FenceRegression("stale"))
    assert jobs.client.get(lo.fence) == str(FENCE_CEILING).encode()
    fences = []
    for key in (UNRELATED, POISONED, "session/ns-c/s1"):
        started = run(jobs, key)
        fences.append(started.fence)
        jobs.finish(started)
    assert fences == [FENCE_CEILING + 1, FENCE_CEILING + 2, FENCE_CEILING + 3]
    # A lift asked past the ceiling is capped; the counter never goes down.
    assert jobs.scripts.lift_fence(2**63 - 1) == FENCE_CEILING + 3


@pytest.mark.parametrize("foreign", ["²", "9" * 5000, "-1", "1e14", str(10**19)])
def test_a_foreign_fence_moves_nothing_and_is_reported(jobs: Jobs, foreign: str) -> None:
    lo = jobs.queue.layout
    ctx = run(jobs, POISONED)
    before = jobs.client.get(lo.fence)
    reports: list[list[Report]] = []
    check_fence(annotated(foreign), ctx.lease, reports.append)  # no refusal, no lift
    assert jobs.client.get(lo.fence) == before
    (report,) = reports[0]
    assert report.reason == "ForeignFence" and report.regarding["name"] == "java-3-ext"
    jobs.finish(ctx)
    assert run(jobs, UNRELATED).fence == int(before or 0) + 1


def test_garbage_in_the_lease_and_counter_keys_is_repaired_by_the_next_start(
    jobs: Jobs, caplog: pytest.LogCaptureFixture,
) -> None:
    lo = jobs.queue.layout
    # What the defect left behind, and what anyone with access to Redis could write.
    jobs.client.set(lo.lease(POISONED), "1e+14|old-holder")  # no TTL
    jobs.client.set(lo.fence, "1e+14")
    with caplog.at_level(logging.WARNING, logger="warmpool.queue.scripts"):
        ctx = run(jobs, POISONED)
    assert ctx.fence == 1 and jobs.client.pttl(lo.lease(POISONED)) > 0
    assert "unreadable lease value deleted" in caplog.text
    assert "unusable fence counter deleted" in caplog.text
    jobs.finish(ctx)
    assert run(jobs, UNRELATED).fence == 2


def test_a_lease_written_without_expiry_is_found_and_repaired_by_the_audit(jobs: Jobs) -> None:
    """Issue #27, point 6: a lease key with no TTL blocked its key forever, unnoticed."""
    lo = jobs.queue.layout
    jobs.queue.add(POISONED)
    rid = jobs.client.lpop(lo.messages_list)
    jobs.client.hdel(lo.messages, rid)  # its message taken by a holder that never ran
    jobs.client.set(lo.lease(POISONED), "5|elsewhere:1:2:n.1")  # no PX
    held = run(jobs, UNRELATED)
    maintenance = Maintenance(jobs)
    assert maintenance.repair_unexpiring_leases() == 1
    assert jobs.client.exists(lo.lease(POISONED)) == 0
    assert jobs.client.get(lo.lease(UNRELATED)) == held.lease.value.encode()
    assert maintenance.audit() == 1
    assert run(jobs, POISONED).fence > held.fence


@pytest.mark.parametrize("attr", ["dirty", "pending", "messages_list", "inflight"])
def test_a_shared_key_of_another_type_is_repaired_and_every_key_runs_again(
    jobs: Jobs, attr: str,
) -> None:
    """A string where the scripts keep a set, hash, list or sorted set: every script that
    touches it failed with WRONGTYPE, for every key. The recovery pass deletes it and the
    epoch (so the scheduler resyncs from the cluster), and keys start again."""
    lo = jobs.queue.layout
    name = getattr(lo, attr)
    jobs.client.set(lo.epoch, "known")
    jobs.client.set(name, "not ours")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        run(jobs, UNRELATED)
    jobs.client.delete(lo.lease(UNRELATED))  # whatever the failed start left, as a crash would
    assert Maintenance(jobs).repair_shared_types() == [name]
    assert jobs.client.get(lo.epoch) is None
    assert run(jobs, POISONED).key == POISONED
