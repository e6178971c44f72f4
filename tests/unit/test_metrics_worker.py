"""The worker side of the metrics: the queue observer's gauges and counters, handler results,
and the pool records the handlers leave (fakeredis). Values are read from this process's
default registry, as deltas (the series are process-wide)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY

from metrics import worker as wm
from metrics.labels import kind_of, reason_label
from metrics.poolstate import PoolState
from warmpool.controller.result import Outcome, Record, Result, Start
from warmpool.keys import InstanceKey, PoolKey, SessionKey
from warmpool.kube.api import Conflict
from warmpool.kube.executor import FenceRegression
from warmpool.pool.claim import WaitReason
from warmpool.pool.decide import Plan, State
from warmpool.queue.jobs import JobContext, Jobs

StartJob = Callable[[str], JobContext]


def val(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def on_thread(fn, *args) -> None:  # type: ignore[no-untyped-def]
    t = threading.Thread(target=fn, args=args)
    t.start()
    t.join()


def test_kind_labels_never_carry_the_key() -> None:
    assert kind_of("instance/ns/java/3") == "instance"
    assert kind_of("session/ns/alice") == "session"
    assert kind_of("pool/ns/java") == "pool"
    assert kind_of("alice@example.com") == "other"
    assert reason_label("new leader") == "new_leader"


def test_adds_count_like_client_go() -> None:
    obs = wm.WorkerObserver()
    before = {n: val(f"warmpool_workqueue_{n}_total", kind="instance")
              for n in ("adds", "deduplicated", "delayed_adds")}
    for result in ("enqueued", "rerun", "deduplicated", "deduplicated", "delayed"):
        obs.on_add("instance/ns/java/1", result)
    after = {n: val(f"warmpool_workqueue_{n}_total", kind="instance")
             for n in ("adds", "deduplicated", "delayed_adds")}
    assert {n: after[n] - before[n] for n in after} == {
        "adds": 2, "deduplicated": 2, "delayed_adds": 1}


def test_running_work_gauges_follow_the_jobs_and_never_go_negative() -> None:
    clock = Clock()
    obs = wm.WorkerObserver(clock=clock)
    count0 = val("warmpool_workqueue_queue_duration_seconds_count", kind="session")
    # Two jobs on two threads (one per thread), one of them a session.
    t1 = threading.Thread(target=obs.on_start, args=("instance/ns/java/1", 0.5))
    t1.start()
    t1.join()
    clock.now = 103.0
    obs.on_start("session/ns/s1", 0.25)  # this thread
    clock.now = 110.0
    obs.tick()
    assert val("warmpool_workqueue_in_flight", kind="instance") == 1
    assert val("warmpool_workqueue_in_flight", kind="session") == 1
    assert val("warmpool_workqueue_unfinished_work_seconds", kind="instance") == 10
    assert val("warmpool_workqueue_unfinished_work_seconds", kind="session") == 7
    assert val("warmpool_workqueue_longest_running_processor_seconds", kind="instance") == 10
    assert val("warmpool_workqueue_queue_duration_seconds_count", kind="session") == count0 + 1

    obs.on_done("session/ns/s1", "success", 7.0)
    # A done reported twice (or for a thread with nothing running) cannot go below zero.
    obs.on_done("session/ns/s1", "success", 7.0)
    obs.tick()  # the gauges follow the jobs at each tick, not at every start and end
    assert val("warmpool_workqueue_in_flight", kind="session") == 0
    assert val("warmpool_workqueue_unfinished_work_seconds", kind="session") == 0
    assert obs.running() == 1
    on_thread(obs.on_done, "instance/ns/java/1", "success", 10.0)
    obs.tick()
    for kind in ("instance", "session", "pool"):
        assert val("warmpool_workqueue_in_flight", kind=kind) == 0
        assert val("warmpool_workqueue_unfinished_work_seconds", kind=kind) == 0
        assert val("warmpool_workqueue_longest_running_processor_seconds", kind=kind) == 0


def test_retries_dead_letters_and_leases() -> None:
    obs = wm.WorkerObserver()
    names = ("retries", "dead_lettered", "lease_expired", "lease_lost", "lease_contention")

    def snap() -> dict[str, float]:
        out = {}
        for n in names:
            prefix = "warmpool_lease_" if n.startswith("lease_") else "warmpool_workqueue_"
            out[n] = val(prefix + n.removeprefix("lease_") + "_total", kind="instance")
        return out

    before = snap()
    key = "instance/ns/java/2"
    obs.on_retry(key, 0.01, 1)
    obs.on_dead_letter(key, "boom")
    obs.on_recovered(key, "recovered")  # a crashed holder's key: expired, retried
    obs.on_recovered(key, "dead")  # ... and dead-lettered
    obs.on_lease_lost(key)
    obs.on_lease_lost(key)  # the same loss, reported again by the refused release
    obs.on_contention(key, "host:1:2:x")
    after = snap()
    assert {n: after[n] - before[n] for n in names} == {
        "retries": 2, "dead_lettered": 2, "lease_expired": 2, "lease_lost": 1,
        "lease_contention": 1}


def test_a_later_loss_of_the_same_key_counts_again() -> None:
    clock = Clock()
    obs = wm.WorkerObserver(clock=clock)
    before = val("warmpool_lease_lost_total", kind="session")
    obs.on_lease_lost("session/ns/s1")
    clock.now += wm.LOST_WINDOW + 1
    obs.on_lease_lost("session/ns/s1")
    obs.on_lease_lost("session/ns/s2")
    assert val("warmpool_lease_lost_total", kind="session") == before + 3


def test_skips_by_reason() -> None:
    obs = wm.WorkerObserver()
    before = val("warmpool_workqueue_skipped_total", kind="pool", result="busy")
    obs.on_skip("pool/ns/java", "busy")
    obs.on_skip("pool/ns/java", "weird")  # unknown reasons make no new series
    assert val("warmpool_workqueue_skipped_total", kind="pool", result="busy") == before + 1
    assert REGISTRY.get_sample_value("warmpool_workqueue_skipped_total",
                                     {"kind": "pool", "result": "weird"}) is None


@pytest.mark.parametrize(("exc", "outcome", "attempts", "result"), [
    (None, Outcome.RECONCILED, 1, "success"),
    (None, Outcome.RECONCILED, 3, "conflict"),
    (None, Outcome.DEFERRED, 1, "requeue"),
    (None, Outcome.BEHIND, 1, "requeue"),
    (Conflict("409"), None, 1, "conflict"),
    (FenceRegression("newer fence"), None, 1, "conflict"),
    (RuntimeError("boom"), None, 1, "error"),
])
def test_job_results(started_job: StartJob, exc: Exception | None, outcome: Outcome | None,
                     attempts: int, result: str) -> None:
    ctx = started_job("instance/ns1/java/9")
    before = val("warmpool_reconcile_total", kind="instance", result=result)
    fences = val("warmpool_fence_regressions_total", kind="instance")
    durations = val("warmpool_reconcile_duration_seconds_count", kind="instance")
    behind = val("warmpool_cache_behind_total", kind="instance")

    def go() -> None:
        with wm.JobMetrics(ctx) as m:
            if outcome is not None:
                m.record(Result(outcome, record=Record(attempts=attempts)))
            if exc is not None:
                raise exc

    if exc is None:
        go()
    else:
        with pytest.raises(type(exc)):
            go()
    assert val("warmpool_reconcile_total", kind="instance", result=result) == before + 1
    assert val("warmpool_reconcile_duration_seconds_count", kind="instance") == durations + 1
    assert val("warmpool_fence_regressions_total", kind="instance") == fences + (
        1 if isinstance(exc, FenceRegression) else 0)
    assert val("warmpool_cache_behind_total", kind="instance") == behind + (
        1 if outcome is Outcome.BEHIND else 0)


def test_every_known_label_value_starts_at_zero() -> None:
    for kind in ("instance", "session", "pool"):
        for result in ("success", "error", "requeue", "conflict"):
            assert REGISTRY.get_sample_value(
                "warmpool_reconcile_total", {"kind": kind, "result": result}) is not None
        assert REGISTRY.get_sample_value("warmpool_workqueue_in_flight", {"kind": kind}) \
            is not None
    for kind in ("session", "appdefinition"):
        assert REGISTRY.get_sample_value("warmpool_refused_inputs_total", {"kind": kind}) \
            is not None


# --- what the handlers record --------------------------------------------------------------------


def state_of(jobs: Jobs, key: str) -> str | None:
    raw = jobs.client.hget(jobs.settings.prefix + "pool:state", key)
    return raw.decode() if raw is not None else None


def result_of(state: State, released: bool = False) -> Plan:
    return Plan(state, None, [], released)


def test_instance_states_and_releases(jobs: Jobs, started_job: StartJob) -> None:
    key = "instance/ns1/java/1"
    releases = val("warmpool_releases_total", appdefinition="java")
    ctx = started_job(key)
    wm.instance_done(ctx, "java", result_of(State.FREE))
    assert state_of(jobs, key) == f"java|free|{ctx.fence}"
    jobs.finish(ctx)
    ctx = started_job(key)
    wm.instance_done(ctx, "java", result_of(State.CLAIMED))
    jobs.finish(ctx)
    assert val("warmpool_releases_total", appdefinition="java") == releases
    ctx = started_job(key)
    wm.instance_done(ctx, "java", result_of(State.FREE))  # was claimed: a release
    jobs.finish(ctx)
    assert val("warmpool_releases_total", appdefinition="java") == releases + 1
    ctx = started_job(key)
    wm.instance_done(ctx, "java", result_of(State.FREE, released=True))  # traces cleared
    jobs.finish(ctx)
    assert val("warmpool_releases_total", appdefinition="java") == releases + 2
    ctx = started_job(key)
    wm.instance_done(ctx, "java", result_of(State.FREE))  # free again: nothing released
    jobs.finish(ctx)
    assert val("warmpool_releases_total", appdefinition="java") == releases + 2
    ctx = started_job(key)
    wm.instance_done(ctx, "java", result_of(State.RETIRED))
    assert state_of(jobs, key) is None


def test_a_holder_that_lost_its_lease_records_nothing(jobs: Jobs, started_job: StartJob) -> None:
    key = "instance/ns1/java/2"
    ctx = started_job(key)
    ctx.lease.lost = True
    wm.instance_done(ctx, "java", result_of(State.CLAIMED))
    assert state_of(jobs, key) is None
    # A newer holder's record is never overwritten by an older fence.
    PoolState(jobs.client, jobs.settings).record_instance(key, "java", "free", ctx.fence + 100)
    ctx2 = started_job("instance/ns1/java/3")
    ctx2.key = key  # an older fence than the stored one
    wm.instance_done(ctx2, "java", result_of(State.CLAIMED))
    assert state_of(jobs, key) == f"java|free|{ctx.fence + 100}"


def test_invalid_appdefinition_leaves_the_record(jobs: Jobs, started_job: StartJob) -> None:
    key = "instance/ns1/java/4"
    ctx = started_job(key)
    wm.instance_done(ctx, "java", result_of(State.INVALID))
    assert state_of(jobs, key) is None


def test_claims_waiting_latency_and_refusals(jobs: Jobs, started_job: StartJob) -> None:
    key = "session/ns1/alice-session"
    waiting_key = jobs.settings.prefix + "pool:waiting"
    waited = val("warmpool_claims_waited_total", appdefinition="java", limit="maxInstances")
    # The label is the wait's reason (an enum), never read from the message: a message
    # naming another limit does not change it.
    for _ in range(2):  # a Session that waits on is counted once, when it begins
        ctx = started_job(key)
        wm.claim_done(ctx, Result(Outcome.WAITING, message="(prewarmed instances)",
                                  record=Record(appdef="java",
                                                wait=WaitReason.MAX_INSTANCES)))
        jobs.finish(ctx)
    assert jobs.client.hget(waiting_key, key).decode().startswith("java|")
    assert val("warmpool_claims_waited_total", appdefinition="java",
               limit="maxInstances") == waited + 1

    for start in ("warm", "cold"):
        count = val("warmpool_claim_duration_seconds_count", appdefinition="java", start=start)
        total = val("warmpool_claim_duration_seconds_sum", appdefinition="java", start=start)
        ctx = started_job(key)
        now = datetime(2024, 5, 1, 12, 0, 42, tzinfo=UTC)
        wm.claim_done(ctx, Result(Outcome.CLAIMED, record=Record(
            instance=InstanceKey("ns1", "java", 3), session_created="2024-05-01T12:00:00Z",
            appdef="java", start=Start(start))), now=now)
        jobs.finish(ctx)
        assert jobs.client.hget(waiting_key, key) is None
        assert val("warmpool_claim_duration_seconds_count", appdefinition="java",
                   start=start) == count + 1
        assert val("warmpool_claim_duration_seconds_sum", appdefinition="java",
                   start=start) == total + 42

    refused = val("warmpool_refused_inputs_total", kind="session")
    ctx = started_job("session/ns1/bad")
    wm.claim_done(ctx, Result(Outcome.REFUSED, message="not an e-mail address",
                              record=Record(appdef="java")))
    assert val("warmpool_refused_inputs_total", kind="session") == refused + 1


def test_resync_prunes_deleted_waiters_but_not_for_a_refused_appdefinition(
    jobs: Jobs, started_job: StartJob
) -> None:
    waiting_key = jobs.settings.prefix + "pool:waiting"
    jobs.client.hset(waiting_key, mapping={"session/ns1/gone": "java|1",
                                           "session/ns1/still": "java|1"})
    ctx = started_job("pool/ns1/java")
    started = wm.resync_started(ctx)
    refused = val("warmpool_refused_inputs_total", kind="appdefinition")
    wm.resync_done(ctx, PoolKey("ns1", "java"), [], started, refused=True)
    assert jobs.client.hlen(waiting_key) == 2
    assert val("warmpool_refused_inputs_total", kind="appdefinition") == refused + 1
    wm.resync_done(ctx, PoolKey("ns1", "java"), [SessionKey("ns1", "still")], started)
    assert {k.decode() for k in jobs.client.hkeys(waiting_key)} == {"session/ns1/still"}


def test_lease_acquire_wait(jobs: Jobs, started_job: StartJob) -> None:
    ctx = started_job("session/ns1/s1")
    count = val("warmpool_lease_acquire_wait_seconds_count", kind="instance")
    wm.lease_taken(ctx, "instance/ns1/java/1")  # never busy: nothing to observe
    assert val("warmpool_lease_acquire_wait_seconds_count", kind="instance") == count
    wm.lease_busy(ctx, "instance/ns1/java/1")
    wm.lease_busy(ctx, "instance/ns1/java/1")
    wm.lease_taken(ctx, "instance/ns1/java/1")
    assert val("warmpool_lease_acquire_wait_seconds_count", kind="instance") == count + 1


def test_seconds_since() -> None:
    now = datetime(2024, 1, 1, 0, 1, tzinfo=UTC)
    assert wm.seconds_since("2024-01-01T00:00:00Z", now) == 60
    assert wm.seconds_since("2024-01-01T00:02:00Z", now) == 0  # clock skew: never negative
    assert wm.seconds_since("", now) is None
    assert wm.seconds_since("yesterday", now) is None
