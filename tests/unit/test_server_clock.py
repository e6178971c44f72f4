"""The cluster's clock (`warmpool.kube.clock`): the API server's Date, bounded, carried forward
on the monotonic clock, never the host's wall clock (issue #29)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from warmpool.kube.clock import ApiServerClock, ClockUnavailable, parse_http_date

DATE = "Fri, 04 Dec 2026 10:17:16 GMT"
EPOCH = datetime(2026, 12, 4, 10, 17, 16, tzinfo=UTC).timestamp()


class DateKube:
    """Answers `date_header` with what it is told; counts the requests."""

    def __init__(self, header: str | None) -> None:
        self.header: str | Exception | None = header
        self.requests = 0

    def date_header(self) -> str | None:
        self.requests += 1
        if isinstance(self.header, Exception):
            raise self.header
        return self.header


class Monotonic:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_an_imf_fixdate_is_read_exactly() -> None:
    assert parse_http_date(DATE) == EPOCH
    assert parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT") == 784111777.0


@pytest.mark.parametrize("header", [
    None, "", "yesterday", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994",
    "Fri, 04 Dec 2026 10:17:16 UTC", "Fri, 31 Feb 2026 10:17:16 GMT",
    "Fri, 04 Dec 2026 25:17:16 GMT", "Fri, 04 Dec 2026 10:17:60 GMT",
    "Fri, 04 Dec 2026 10:17:16 GMT, Fri, 04 Dec 2026 10:17:17 GMT", "x" * 100_000,
    "Fri, \u06604 Dec 2026 10:17:16 GMT",
])
def test_anything_else_is_no_date(header: str | None) -> None:
    assert parse_http_date(header) is None


def test_the_clock_is_the_servers_carried_on_the_monotonic_clock_not_the_wall_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = DateKube(DATE)
    mono = Monotonic()
    clock = ApiServerClock(kube, max_age=30, monotonic=mono)  # type: ignore[arg-type]
    # A host whose wall clock is 2 h fast changes nothing.
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 7200)
    assert clock.now() == EPOCH
    mono.t += 12.5
    assert clock.now() == EPOCH + 12.5 and kube.requests == 1  # carried forward, no request
    mono.t += 18.0  # older than max_age: sampled again
    kube.header = "Fri, 04 Dec 2026 10:17:47 GMT"
    assert clock.now() == EPOCH + 31 and kube.requests == 2


def test_a_sample_past_half_its_age_is_renewed_ahead_once_and_the_caller_does_not_wait(
) -> None:
    kube = DateKube(DATE)
    mono = Monotonic()
    queued: list[Callable[[], None]] = []
    clock = ApiServerClock(kube, max_age=10, monotonic=mono,  # type: ignore[arg-type]
                           refresh_ahead=queued.append)
    assert clock.now() == EPOCH and kube.requests == 1
    mono.t += 4.0
    assert clock.now() == EPOCH + 4 and not queued  # younger than half: nothing
    mono.t += 2.0
    # Past half: the caller gets the carried time, one renewal is queued, however many ask.
    assert clock.now() == EPOCH + 6 and clock.now() == EPOCH + 6
    assert kube.requests == 1 and len(queued) == 1
    kube.header = "Fri, 04 Dec 2026 10:17:23 GMT"
    queued.pop()()
    assert kube.requests == 2 and clock.now() == EPOCH + 7
    # A renewal that fails changes nothing and lets the next one be queued.
    mono.t += 6.0
    kube.header = RuntimeError("connection refused")
    assert clock.now() == EPOCH + 13
    queued.pop()()
    assert clock.now() == EPOCH + 13 and len(queued) == 1


class OverhearingKube(DateKube):
    """A client that has received answers: `latest_date` as `Kube` keeps it."""

    def __init__(self, header: str | None) -> None:
        super().__init__(header)
        self.latest: tuple[str, float] | None = None

    def latest_date(self) -> tuple[str, float] | None:
        return self.latest


def test_a_busy_clients_own_answers_keep_the_clock_fresh_without_a_get() -> None:
    kube = OverhearingKube(DATE)
    queued: list[Callable[[], None]] = []
    clock = ApiServerClock(kube, max_age=3600, refresh_ahead=queued.append)  # type: ignore[arg-type]
    # An answer that arrived 2,000 s ago (of this host's monotonic clock): carried forward.
    kube.latest = (DATE, time.monotonic() - 2000)
    assert EPOCH + 2000 <= clock.now() < EPOCH + 2001 and kube.requests == 0
    assert len(queued) == 1  # older than half its age: a renewal ahead was queued
    # One that arrived before the sample changes nothing; nor does one that is no date.
    kube.latest = ("Fri, 04 Dec 2026 11:00:00 GMT", time.monotonic() - 2500)
    assert EPOCH + 2000 <= clock.now() < EPOCH + 2001
    kube.latest = ("not a date", time.monotonic())
    assert EPOCH + 2000 <= clock.now() < EPOCH + 2001
    # A fresher answer is taken as it is, with no request and nothing more queued.
    kube.latest = ("Fri, 04 Dec 2026 10:17:17 GMT", time.monotonic())
    assert EPOCH + 1 <= clock.now() < EPOCH + 2 and kube.requests == 0 and len(queued) == 1


@pytest.mark.parametrize("answer", ["not a date", None, RuntimeError("connection refused")])
def test_no_usable_date_is_no_time_at_all(answer: str | Exception | None) -> None:
    kube = DateKube(DATE)
    kube.header = answer
    clock = ApiServerClock(kube, monotonic=Monotonic())  # type: ignore[arg-type]
    with pytest.raises(ClockUnavailable):
        clock.now()


def test_a_worker_stamps_handled_with_the_servers_time_not_its_own() -> None:
    """The readers' `server_now_ms` (a Session marked HANDLED records it as lastActivity):
    the API server's Date, whatever this host's wall clock says (issue #29)."""
    from typing import Any, cast

    from warmpool.kube.cache import ClusterCache
    from warmpool.kube.reader import CachedReader, LiveReader
    kube = cast(Any, DateKube("Fri, 04 Dec 2026 10:17:16 GMT"))
    for reader in (LiveReader(kube), CachedReader(cast(ClusterCache, None), kube)):
        stamped = reader.server_now_ms()
        # The sample is carried forward on the monotonic clock (< 1 s in this test); the
        # wall clock, hours past EPOCH whenever this runs, is not read.
        assert EPOCH * 1000 <= stamped < (EPOCH + 60) * 1000
    kube.header = "not a date"
    with pytest.raises(ClockUnavailable):
        LiveReader(kube).server_now_ms()  # never the host's clock instead
