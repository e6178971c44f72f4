"""The worker's one run loop (`workers.handlers.run`): whatever job made a `Result`, the loop
records its guarded writes under the keys they were made under, puts the key back when it
asks (after the key's backoff, or after exactly `requeue_after`), and adds the follow-ups.
The jobs here are stand-ins returning chosen results; the queue is the real keyed queue on
fakeredis (tests/unit/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from warmpool.controller.result import Outcome, Result
from warmpool.keys import InstanceKey, SessionKey
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
