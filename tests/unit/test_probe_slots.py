"""URL probes take at most a share of a worker's job threads (issue #28: claims first).

An attempt at an instance that does not answer waits up to the probe's timeout; a burst of
new Sessions makes many a second. A probe that finds every slot busy defers (its schedule is
the queue's) without a request; one that runs gives its slot back however it ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from warmpool.controller.result import Outcome, Result
from warmpool.keys import ProbeKey
from workers import handlers

KEY = ProbeKey("ns", "s1")


@pytest.fixture
def four_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    handlers._probe_slots.cache_clear()
    monkeypatch.setattr(handlers, "job_threads", lambda: 4)
    yield
    handlers._probe_slots.cache_clear()


def test_half_the_threads_probe_at_once_and_the_next_probe_defers(
    four_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_attempt(*_: Any, **__: Any) -> Result:
        raise AssertionError("a probe without a slot made an attempt")

    monkeypatch.setattr(handlers, "probe_url", no_attempt)
    slots = handlers._probe_slots()
    assert slots.acquire(blocking=False) and slots.acquire(blocking=False)  # two probing
    result = handlers._probe(None, KEY, None)  # type: ignore[arg-type]
    assert result.outcome is Outcome.DEFERRED
    assert result.requeue_after == handlers.PROBE_SLOT_RETRY
    slots.release()
    slots.release()


def test_a_probe_gives_its_slot_back_however_it_ends(
    four_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def failing_attempt(*_: Any, **__: Any) -> Result:
        calls.append(1)
        raise TimeoutError("the instance did not answer")

    monkeypatch.setattr(handlers, "probe_url", failing_attempt)
    monkeypatch.setattr(handlers, "RedisProbeStates", lambda *_: None)
    monkeypatch.setattr(handlers, "SessionWrites", lambda *_: None)
    monkeypatch.setattr(handlers, "kube", lambda: None)
    monkeypatch.setattr(handlers, "_fetch", lambda: None)
    monkeypatch.setattr(handlers, "pool_settings", lambda: None)

    # The shape of JobContext the probe reads: ctx.jobs.client and ctx.jobs.settings.prefix.
    ctx = SimpleNamespace(jobs=SimpleNamespace(client=None,
                                               settings=SimpleNamespace(prefix="p:")))
    for _ in range(3):  # more runs than slots: each gave its slot back
        with pytest.raises(TimeoutError):
            handlers._probe(ctx, KEY, None)  # type: ignore[arg-type]
    assert len(calls) == 3
