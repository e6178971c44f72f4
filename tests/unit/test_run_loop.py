"""The worker's one run loop (`workers.handlers.run`): whatever job made a `Result`, the loop
records its guarded writes under the keys they were made under, puts the key back when it
asks (a `DEFERRED` outcome after the key's backoff; a timer after exactly `requeue_after`),
and adds the follow-ups, now or (`later`) after their delay.
The jobs here are stand-ins returning chosen results; the queue is the real keyed queue on
fakeredis (tests/unit/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from warmpool.controller.result import Outcome, Result
from warmpool.keys import InstanceKey, SessionKey, TimeoutKey
from warmpool.pool.builders import PoolSettings
from warmpool.queue.inspect import Inspector
from warmpool.queue.jobs import JobContext, Jobs

StartJob = Callable[[str], JobContext]
READER = object()  # what the loop hands the job once the cache has seen the triggers


@pytest.fixture
def defers(monkeypatch: pytest.MonkeyPatch, handlers: ModuleType) -> list[float]:
    """The delays the loop puts keys back with (JobContext.defer, recorded)."""
    seen: list[float] = []
    monkeypatch.setattr(JobContext, "defer", lambda self, seconds: seen.append(seconds))
    monkeypatch.setattr(handlers, "_backoff", handlers.Backoff(0.005, 0.5))
    return seen


def job_returning(monkeypatch: pytest.MonkeyPatch, handlers: ModuleType, kind: str,
                  *results: Result) -> list[object]:
    """Make `kind`'s job return `results` in turn; returns the readers it was called with."""
    calls: list[object] = []
    pending = list(results)

    def call(ctx: JobContext, key: object, reader: object) -> Result:
        calls.append(reader)
        return pending.pop(0)

    job = handlers.JOBS[kind]
    monkeypatch.setitem(handlers.JOBS, kind, handlers.Job(job.key_type, call))
    monkeypatch.setattr(handlers, "_ready_reader", lambda ctx, namespace: READER)
    return calls


def test_writes_are_noted_under_the_key_they_were_made_under(
    monkeypatch: pytest.MonkeyPatch, handlers: ModuleType, started_job: StartJob,
    defers: list[float],
) -> None:
    ctx = started_job("session/ns1/alice")
    instance = "instance/ns1/java/2"
    assert ctx.try_lease(instance) is not None  # the claim's lease on the instance
    job_returning(monkeypatch, handlers, "session", Result(
        Outcome.WAITING, written={ctx.key: [("Session/alice", "7")],
                                  instance: [("Service/java-2", "12")]}))
    handlers.run(ctx)
    assert ctx.writes[ctx.key] == {"Session/alice": "7"}
    assert ctx.writes[instance] == {"Service/java-2": "12"}
    assert defers == []


def test_a_deferred_job_backs_off_and_a_finished_one_forgets(
    monkeypatch: pytest.MonkeyPatch, handlers: ModuleType, started_job: StartJob,
    defers: list[float],
) -> None:
    key = "session/ns1/bob"
    job_returning(monkeypatch, handlers, "session",
                  Result.deferred("instance 1 is busy"), Result.deferred("instance 1 is busy"),
                  Result.deferred("the pool kept changing", after=0.2),
                  Result(Outcome.CLAIMED), Result.deferred("instance 1 is busy"))
    for _ in range(5):
        ctx = started_job(key)
        handlers.run(ctx)
        ctx.jobs.finish(ctx)
    # 5 ms doubling; never sooner than the job asked; a claim that got through starts over.
    assert defers == [0.005, 0.01, 0.2, 0.005]


def test_a_job_waiting_for_one_lease_parks_on_it_instead_of_backing_off(
    monkeypatch: pytest.MonkeyPatch, handlers: ModuleType, started_job: StartJob,
    defers: list[float],
) -> None:
    """Issue #28: a claim whose instance is busy waits for that lease's release (parked,
    with the lease TTL as its fallback), not a backoff's polls."""
    parked: list[tuple[str, str, float]] = []
    monkeypatch.setattr(JobContext, "park", lambda self, on, fallback: parked.append(
        (self.key, on, fallback)))
    busy = InstanceKey("ns1", "java", 1)
    job_returning(monkeypatch, handlers, "session",
                  Result.deferred("instance 1 is busy", on=busy),
                  Result.deferred("every free instance was busy"))
    for _ in range(2):
        ctx = started_job("session/ns1/carol")
        handlers.run(ctx)
        ctx.jobs.finish(ctx)
    ttl = ctx.jobs.settings.lease_ttl
    assert parked == [("session/ns1/carol", str(busy), ttl)]
    assert defers == [0.005]  # no single lease to wait for: backed off, from the start


def test_a_job_whose_cache_is_behind_is_not_called(
    monkeypatch: pytest.MonkeyPatch, handlers: ModuleType, started_job: StartJob,
    defers: list[float],
) -> None:
    calls = job_returning(monkeypatch, handlers, "instance", Result(Outcome.RECONCILED))
    monkeypatch.setattr(handlers, "_ready_reader", lambda ctx, namespace: None)
    handlers.run(started_job("instance/ns1/java/1"))
    assert calls == []
    assert defers == [handlers.BEHIND_RETRY]


def test_follow_ups_are_added_with_their_triggers(
    monkeypatch: pytest.MonkeyPatch, handlers: ModuleType, jobs: Jobs, started_job: StartJob,
    defers: list[float],
) -> None:
    calls = job_returning(monkeypatch, handlers, "instance", Result(Outcome.RECONCILED, follow_ups=[
        (SessionKey("ns1", "carol"), {"Service/java-1": "40"}),
        (InstanceKey("ns1", "java", 3), None)]))
    handlers.run(started_job("instance/ns1/java/1"))
    assert calls == [READER]
    pending = {k for k, _ in Inspector(jobs.client, jobs.settings).pending()}
    assert {"session/ns1/carol", "instance/ns1/java/3"} <= pending
    triggers = jobs.client.hgetall(jobs.queue.layout.triggers("session/ns1/carol"))
    assert triggers == {b"Service/java-1": b"40"}  # carol's job waits for the cache to see it


def test_a_timer_runs_again_after_exactly_its_time_and_does_not_back_off(
    monkeypatch: pytest.MonkeyPatch, handlers: ModuleType, started_job: StartJob,
    defers: list[float],
) -> None:
    """`requeue_after` without an error outcome is a timer (a schedule's edge, a deadline, a
    probe's next attempt): exactly that delay, and the key's backoff is forgotten."""
    key = "pool/ns1/java"
    job_returning(monkeypatch, handlers, "pool", Result.deferred("busy"),
                  Result(Outcome.RESYNCED, requeue_after=600.0), Result.deferred("busy"))
    for _ in range(3):
        ctx = started_job(key)
        handlers.run(ctx)
        ctx.jobs.finish(ctx)
    assert defers == [0.005, 600.0, 0.005]


def test_later_keys_are_added_after_their_delay_and_only_ever_earlier(
    monkeypatch: pytest.MonkeyPatch, handlers: ModuleType, jobs: Jobs, started_job: StartJob,
    defers: list[float],
) -> None:
    """A pool's job names its Sessions' timeout keys at their deadlines on every run: a key
    that already waits for an earlier time keeps it."""
    jobs.queue.add_after("timeout/ns1/dave", 30.0)
    job_returning(monkeypatch, handlers, "pool", Result(Outcome.RESYNCED, later=[
        (TimeoutKey("ns1", "dave"), 120.0), (TimeoutKey("ns1", "erin"), 60.0)]))
    handlers.run(started_job("pool/ns1/java"))
    delayed = dict(Inspector(jobs.client, jobs.settings).delayed())
    assert {k: round(seconds) for k, seconds in delayed.items()} == {
        "timeout/ns1/dave": 30, "timeout/ns1/erin": 60}


def test_a_cache_still_behind_after_the_wait_gives_the_servers_reader(
    monkeypatch: pytest.MonkeyPatch, handlers: ModuleType, started_job: StartJob,
) -> None:
    """A synced cache that has not seen the key's triggers within FRESHNESS_WAIT: the job
    decides from the API server (every write is guarded, so that is as safe, and current)
    instead of going round again, possibly on the same lagging worker."""
    from warmpool.kube.reader import CachedReader, LiveReader

    class Lagging:
        waited: list[float] = []

        def wait_fresh(self, namespace: str, triggers: object, timeout: float) -> bool:
            self.waited.append(timeout)
            return False

    lagging = Lagging()
    cached = CachedReader.__new__(CachedReader)
    cached.cache = lagging  # type: ignore[assignment]
    monkeypatch.setattr(handlers, "reader_for", lambda namespace: cached)
    monkeypatch.setattr(handlers, "kube", lambda: object())
    # The settings as the environment gives them (no cluster to settle the routing against).
    monkeypatch.setattr(handlers, "pool_settings", lambda: PoolSettings.from_env({}))
    monkeypatch.setattr(handlers, "server_clock", lambda: object())
    ctx = started_job("instance/ns1/java/1")
    reader = handlers._ready_reader(ctx, "ns1")
    assert isinstance(reader, LiveReader)
    assert lagging.waited == [handlers.FRESHNESS_WAIT]
    lagging.wait_fresh = lambda *a: True  # type: ignore[method-assign]
    assert handlers._ready_reader(ctx, "ns1") is cached
    monkeypatch.setattr(handlers, "reader_for", lambda namespace: None)  # not listed yet
    assert handlers._ready_reader(ctx, "ns1") is None
