"""A worker process fills its cache before it takes jobs, also when its handlers are wrapped
(the benchmarks' job counter wraps them): otherwise every first job finds the cache empty
and is handed back until it has listed, and each of those hand-backs counts as a run."""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import pytest

from warmpool.queue.jobs import JobContext
from warmpool.queue.settings import QueueSettings
from workers import runtime


class FakeCache:
    def __init__(self) -> None:
        self.waited: list[float] = []

    def wait_synced(self, timeout: float) -> bool:
        self.waited.append(timeout)
        return True


def _wrapped(fn: runtime.Handler) -> runtime.Handler:
    @functools.wraps(fn)
    def run(ctx: JobContext) -> None:
        fn(ctx)
    return run


@pytest.mark.parametrize("wrap", [False, True])
def test_the_cache_is_filled_before_jobs_when_the_pool_handlers_run(
    monkeypatch: pytest.MonkeyPatch, handlers: ModuleType, wrap: bool
) -> None:
    fake = FakeCache()
    monkeypatch.setattr(handlers, "cache", lambda: fake)
    readied: list[bool] = []
    monkeypatch.setattr(handlers, "_ready_for_jobs", lambda: readied.append(True))
    fn = _wrapped(handlers.run) if wrap else handlers.run
    with runtime.using({"instance": fn, "session": handlers.run}):
        handlers._start_cache(None, QueueSettings(lease_ttl=4.0))  # type: ignore[arg-type]
    assert fake.waited == [handlers.SYNC_WAIT]
    assert readied == [True]  # kinds looked up, clock read: before the first job


def test_a_worker_with_other_handlers_starts_no_cache(
    monkeypatch: pytest.MonkeyPatch, handlers: ModuleType
) -> None:
    fake = FakeCache()
    monkeypatch.setattr(handlers, "cache", lambda: fake)

    def other(ctx: Any) -> None:
        return None

    with runtime.using({"instance": other}):
        handlers._start_cache(None, QueueSettings(lease_ttl=4.0))  # type: ignore[arg-type]
    assert fake.waited == []


def test_the_jobs_api_calls_give_up_within_the_lease_ttl(
    monkeypatch: pytest.MonkeyPatch, handlers: ModuleType
) -> None:
    """A stalled API link fails a job's call within one lease TTL (then the key runs again,
    here or on another host), not after the default 60 s read timeout."""
    monkeypatch.setattr(handlers, "cache", lambda: FakeCache())
    monkeypatch.setattr(handlers, "_ready_for_jobs", lambda: None)
    monkeypatch.setattr(handlers, "_request_timeout", handlers.REQUEST_TIMEOUT)
    with runtime.using({"instance": handlers.run}):
        handlers._start_cache(None, QueueSettings(lease_ttl=4.0))  # type: ignore[arg-type]
    assert handlers._request_timeout == (4.0, 4.0)
