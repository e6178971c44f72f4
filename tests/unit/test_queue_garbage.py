"""Redis contents someone else wrote are repaired, never fatal (issue #27, points 1 and 3).

Fences are exact integers end to end: the scripts never turn the counter into a Lua number
(a double prints 10^14 as "1e+14", which `Scripts.start` then failed to parse for every key).
A lease value, fence counter, failure count or queued time that is not one of ours is
repaired by the script that meets it, logged, and the job goes on. On fakeredis (real Lua);
tests/integration/test_queue_fence_exact.py runs the poisoning on a real Redis.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import redis

from warmpool.queue.inspect import Inspector
from warmpool.queue.jobs import JobContext, Jobs
from warmpool.queue.maintenance import Maintenance
from warmpool.queue.scripts import FENCE_CEILING, Skip, parse_lease, reply_int

KEY = "instance/ns/java/3"


def lease_of(jobs: Jobs, key: str = KEY) -> bytes | None:
    value: bytes | None = jobs.client.get(jobs.queue.layout.lease(key))
    return value


def test_a_fence_lifted_past_1e14_stays_an_exact_decimal(
    jobs: Jobs, started_job: Callable[[str], JobContext],
) -> None:
    assert jobs.scripts.lift_fence(99_999_999_999_999) == 99_999_999_999_999
    ctx = started_job(KEY)
    assert ctx.fence == 100_000_000_000_000
    assert ctx.lease.value.startswith("100000000000000|")
    assert lease_of(jobs) == ctx.lease.value.encode()
    # Above 2^53 a double is no longer exact: the counter still is.
    jobs.scripts.lift_fence(2**53 + 1)
    other = jobs.acquire("instance/ns/java/4")
    assert other is not None and other.fence == 2**53 + 2


def test_a_lift_is_capped_at_the_ceiling_and_never_lowers(jobs: Jobs) -> None:
    assert jobs.scripts.lift_fence(10**30) == FENCE_CEILING
    assert jobs.client.get(jobs.queue.layout.fence) == str(FENCE_CEILING).encode()
    assert jobs.scripts.lift_fence(5) == FENCE_CEILING
    lease = jobs.acquire(KEY)
    assert lease is not None and lease.fence == FENCE_CEILING + 1  # INCR far from int64's end


@pytest.mark.parametrize("garbage", [b"1e+14", b"abc", b"", b"9223372036854775807",
                                     b"99999999999999999999999"])
def test_an_unusable_counter_is_reset_and_logged(
    jobs: Jobs, started_job: Callable[[str], JobContext], garbage: bytes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    jobs.client.set(jobs.queue.layout.fence, garbage)
    with caplog.at_level(logging.WARNING, logger="warmpool.queue.scripts"):
        ctx = started_job(KEY)
    assert ctx.fence == 1  # as after a Redis that lost the counter: objects lift it back
    assert "fence counter deleted" in caplog.text


def test_a_counter_of_another_type_is_reset(
    jobs: Jobs, started_job: Callable[[str], JobContext],
) -> None:
    jobs.client.hset(jobs.queue.layout.fence, "x", "1")
    assert started_job(KEY).fence == 1
    jobs.client.delete(jobs.queue.layout.fence)
    jobs.client.rpush(jobs.queue.layout.fence, "1")
    assert jobs.scripts.lift_fence(40) == 40


@pytest.mark.parametrize("garbage", [b"1e+14|old-holder", b"nonsense", b"|token", b"12|",
                                     b"012|t", b"1" * 20 + b"|t", b"5|" + b"x" * 2000])
def test_an_unreadable_lease_value_is_repaired_and_the_job_runs(
    jobs: Jobs, started_job: Callable[[str], JobContext], garbage: bytes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    jobs.client.set(jobs.queue.layout.lease(KEY), garbage)  # no TTL: it would block for good
    with caplog.at_level(logging.WARNING, logger="warmpool.queue.scripts"):
        ctx = started_job(KEY)
    assert lease_of(jobs) == ctx.lease.value.encode()
    assert "unreadable lease value deleted" in caplog.text and KEY in caplog.text


def test_a_repair_on_a_skipped_delivery_is_logged_too(
    jobs: Jobs, caplog: pytest.LogCaptureFixture,
) -> None:
    jobs.client.set(jobs.queue.layout.lease(KEY), "garbage")  # the key is not waiting
    with caplog.at_level(logging.WARNING, logger="warmpool.queue.scripts"):
        assert jobs.begin(KEY) is Skip.STALE
    assert lease_of(jobs) is None and "unreadable lease value deleted" in caplog.text


def test_a_lease_key_of_another_type_stops_no_one(jobs: Jobs) -> None:
    held = jobs.acquire("instance/ns/java/1")
    assert held is not None
    jobs.client.hset(jobs.queue.layout.lease(KEY), "x", "y")
    # One renewal call covers every lease of the process: the foreign key fails none of them.
    assert jobs.scripts.renew(5000, [(KEY, "1|t"), (held.key, held.value)]) == [False, True]
    lease = jobs.acquire(KEY)
    assert lease is not None and lease_of(jobs) == lease.value.encode()


def test_a_garbage_failure_count_and_queued_time_are_dropped(
    jobs: Jobs, started_job: Callable[[str], JobContext], caplog: pytest.LogCaptureFixture,
) -> None:
    lo = jobs.queue.layout
    jobs.queue.add(KEY)
    jobs.client.hset(lo.failures, KEY, "lots")
    jobs.client.hset(lo.added_at, KEY, "yesterday")
    with caplog.at_level(logging.WARNING, logger="warmpool.queue.scripts"):
        ctx = started_job(KEY)
    assert ctx.attempt == 1 and ctx.queued_seconds is None
    assert "unreadable failure count dropped" in caplog.text
    # A failure is counted from there, not refused by HINCRBY on text.
    jobs.client.hset(lo.failures, KEY, "9" * 30)
    done = jobs.finish(ctx, RuntimeError("boom"))
    assert done.failures == 1


def test_the_inspector_reads_garbage_as_unknown(jobs: Jobs) -> None:
    lo = jobs.queue.layout
    jobs.queue.add(KEY)
    jobs.client.set(lo.lease(KEY), "1e+14|x")
    jobs.client.hset(lo.added_at, KEY, "²")
    jobs.client.hset(lo.failures, KEY, "many")
    inspector = Inspector(jobs.client, jobs.settings)
    state = inspector.key(KEY)
    assert state.fence is None and state.failures == 0
    assert inspector.stats().waiting == 1
    assert [lock.fence for lock in inspector.locks()] == [None]
    jobs.client.set(lo.lease(KEY), b"\xff\xfe|not utf-8")
    assert inspector.key(KEY).fence is None and inspector.reruns() == []
    assert [lock.holder for lock in inspector.locks()] == ["not utf-8"]


def test_the_python_side_parses_bounded() -> None:
    assert parse_lease("12|host:1:2:n.3") == (12, "host:1:2:n.3")
    for bad in ("1e+14|x", "²|x", "12", "12|", "|x", "9" * 20 + "|x", "-1|x"):
        assert parse_lease(bad) is None, bad
    assert reply_int(b"-1") == -1 and reply_int(7) == 7 and reply_int(b"9" * 5000, 3) == 3
    assert reply_int(b"\xb2", 5) == 5 and reply_int(None, 4) == 4


def test_redis_errors_still_surface(jobs: Jobs) -> None:
    """Only garbage is repaired: a lift with a non-number is a caller's bug, refused."""
    with pytest.raises(redis.ResponseError, match="not a fence"):
        jobs.scripts._call("lift_fence", "1e14")


# --- lease keys without an expiry (issue #27, point 6) ---------------------------------------


def test_a_lease_without_expiry_is_deleted_and_its_waiting_key_runs_again(
    jobs: Jobs, caplog: pytest.LogCaptureFixture,
) -> None:
    lo = jobs.queue.layout
    jobs.queue.add(KEY)
    rid = jobs.client.lpop(lo.messages_list)  # taken (and acked) by a holder that never ran
    jobs.client.hdel(lo.messages, rid)
    jobs.client.set(lo.lease(KEY), "7|someone:1:2:n.1")  # a sound value, but no TTL
    assert jobs.queue.add(KEY) == "deduplicated"  # blocked: add sees it leased
    maintenance = Maintenance(jobs)
    assert maintenance.audit() == 0  # leased: the orphan audit alone would never help
    with caplog.at_level(logging.WARNING, logger="warmpool.queue.maintenance"):
        assert maintenance.repair_unexpiring_leases() == 1
    assert lease_of(jobs) is None and "had no expiry" in caplog.text and KEY in caplog.text
    assert maintenance.audit() == 1  # the waiting key gets its message back
    assert isinstance(jobs.begin(KEY), JobContext)


def test_a_run_in_flight_keeps_its_lease_with_the_lease_ttl(
    jobs: Jobs, started_job: Callable[[str], JobContext],
) -> None:
    lo = jobs.queue.layout
    ctx = started_job(KEY)
    other = started_job("instance/ns/java/4")
    jobs.client.persist(lo.lease(KEY))
    maintenance = Maintenance(jobs)
    assert maintenance.repair_unexpiring_leases() == 1
    assert lease_of(jobs) == ctx.lease.value.encode()
    assert 0 < jobs.client.pttl(lo.lease(KEY)) <= jobs.settings.lease_ttl_ms
    assert jobs.client.pttl(lo.lease(other.key)) > 0  # leases with a TTL are not touched
    assert maintenance.repair_unexpiring_leases() == 0


# --- shared keys of another type (issue #27: Redis contents are not trusted) -----------------


def test_every_shared_key_of_the_scripts_has_its_type_checked() -> None:
    from warmpool.queue.maintenance import SHARED_KEY_TYPES
    from warmpool.queue.scripts import KEY_NAMES
    # prefixes name no key of their own, a channel is no key at all
    shared = {attr for _, attr in KEY_NAMES if not attr.endswith(("_prefix", "_channel"))}
    assert {attr for attr, _ in SHARED_KEY_TYPES} == shared


def test_a_shared_key_of_another_type_is_deleted_with_the_epoch_and_keys_run_again(
    jobs: Jobs, caplog: pytest.LogCaptureFixture,
) -> None:
    lo = jobs.queue.layout
    jobs.client.set(lo.epoch, "e1")
    jobs.client.set(lo.dirty, "garbage")  # a string where the scripts keep a set
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        jobs.queue.add(KEY)  # every add of every key fails while it stays
    maintenance = Maintenance(jobs)
    with caplog.at_level(logging.WARNING, logger="warmpool.queue.maintenance"):
        assert maintenance.repair_shared_types() == [lo.dirty]
    assert lo.dirty in caplog.text and "resyncs" in caplog.text
    assert jobs.client.get(lo.epoch) is None  # every process now sees a loss: a resync
    assert jobs.queue.add(KEY) == "enqueued"
    assert isinstance(jobs.begin(KEY), JobContext)
    jobs.queue.add("instance/ns/java/9")
    assert maintenance.repair_shared_types() == []  # sound keys are left alone
    assert jobs.client.sismember(lo.dirty, "instance/ns/java/9")
