"""The cluster's clock: "now" as the Kubernetes API server says it, never this host's.

Deadlines the controller enforces on objects (a Session's ``spec.timeout`` counted from its
``creationTimestamp``, its inactivity counted from ``status.lastActivity``) compare times the API
server stamped with "now". Taken from the host, "now" is as wrong as the host's clock: a leader
2 h fast would delete every Session 2 h early. So "now" is the API server's, read from the
``Date`` header of one of its responses (RFC 9110 §6.6.1: every origin server with a clock
sends it; the API server is a Go ``net/http`` server, which always does). Why this source:

- it is the clock that stamped ``creationTimestamp`` (same process, same host), so the two are
  compared on one clock;
- reading it is a cheap GET (``/version``) that needs no RBAC and writes nothing, unlike a
  Lease's ``renewTime`` (written by the *client*, so it is the client's clock) or a
  ``managedFields`` time (a write per sample).

Between samples the time is carried forward on this host's **monotonic** clock, which a wrong
wall clock does not move. The header has whole seconds (truncated) and the response left the
server somewhere during the request, so the estimate is never ahead of the server's clock and
lags it by less than 1 s plus one request's round trip: deadlines are met late by at most that,
never early. An answer without a usable ``Date`` raises (``ClockUnavailable``): no deadline is
decided on a time that could not be read, and the host's wall clock is never the fallback.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

from warmpool.kube.api import Kube

log = logging.getLogger(__name__)


class ServerClock(Protocol):
    """Where the controller's deadlines read "now" (epoch seconds, the API server's clock)."""

    def now(self) -> float:
        """The cluster's current time; raises ClockUnavailable when it cannot be read."""

    def sync(self) -> float:
        """Read the server's time afresh (a pass starts with it); raises ClockUnavailable."""


class ClockUnavailable(Exception):
    """The API server's time could not be read: decide nothing that depends on it."""


# RFC 9110 §5.6.7 IMF-fixdate, the only form a server may generate: "Sun, 06 Nov 1994
# 08:49:37 GMT". The obsolete forms are refused: the grammar is this one line, 29 characters.
_IMF_FIXDATE = re.compile(
    r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), ([0-9]{2}) "
    r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) ([0-9]{4}) "
    r"([0-9]{2}):([0-9]{2}):([0-9]{2}) GMT")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def parse_http_date(value: str | None) -> float | None:
    """An HTTP ``Date`` header in epoch seconds, or None unless it is exactly one IMF-fixdate
    (bounded: a fixed 29-character grammar, a real calendar date)."""
    if value is None or len(value) != 29:
        return None
    m = _IMF_FIXDATE.fullmatch(value)
    if m is None:
        return None
    day, month, year, hour, minute, second = m.groups()
    try:
        parsed = datetime(int(year), _MONTHS.index(month) + 1, int(day), int(hour),
                          int(minute), int(second), tzinfo=UTC)
    except ValueError:  # 31 Feb, 25:00, a leap second (60): not a time to decide on
        return None
    return parsed.timestamp()


class ApiServerClock:
    """`ServerClock` on the ``Date`` of an API response, sampled at most every `max_age`
    seconds (of this host's monotonic clock) and carried forward on it in between.

    A sample older than half of `max_age` is renewed ahead, off the caller's thread
    (`refresh_ahead`: a daemon thread unless told otherwise), while the caller gets the one it
    has: a busy worker's jobs then never wait for the GET, and no sample is ever older than
    `max_age` (past that, the caller samples itself, as before). Why: the read sat on a claim's
    path, between its deciding write and its completing writes, once per `max_age` per
    process, and two jobs that found it stale at once both sent it. Before either, the
    ``Date`` of the client's own last answer is taken when newer (`_overheard`): a busy
    worker needs no GET at all."""

    def __init__(self, kube: Kube, *, max_age: float = 30.0,
                 monotonic: Callable[[], float] = time.monotonic,
                 refresh_ahead: Callable[[Callable[[], None]], None] | None = None) -> None:
        self.kube = kube
        self.max_age = max_age
        self.monotonic = monotonic
        self._sample: tuple[float, float] | None = None  # (server epoch s, monotonic at receipt)
        self._ahead = refresh_ahead or _in_daemon_thread
        self._renewing = threading.Lock()  # held while a renewal ahead is under way

    def sync(self) -> float:
        """Read the server's time now (one GET), whatever the age of the last sample."""
        try:
            header = self.kube.date_header()
        except Exception as exc:
            raise ClockUnavailable(f"the API server's time could not be read: {exc}") from exc
        received = self.monotonic()
        server = parse_http_date(header)
        if server is None:
            shown = "none" if header is None else repr(header[:40])
            raise ClockUnavailable(f"the API server's Date header is not an HTTP date: {shown}")
        self._sample = (server, received)
        return server

    def _overheard(self) -> None:
        """Take the ``Date`` of the client's last answer (`Kube.latest_date`) as the sample
        when it arrived after ours: a busy worker's own requests keep its clock fresh, with
        no GET of its own. Used only where this clock runs on `time.monotonic` (the clock
        the client stamps arrivals with)."""
        if self.monotonic is not time.monotonic:
            return
        latest = getattr(self.kube, "latest_date", None)
        seen = latest() if latest is not None else None
        if seen is None or (self._sample is not None and seen[1] <= self._sample[1]):
            return
        server = parse_http_date(seen[0])
        if server is not None:
            self._sample = (server, seen[1])

    def now(self) -> float:
        if self._age() > self.max_age / 2:
            self._overheard()
        age = self._age()
        if age > self.max_age:
            self.sync()
        elif age > self.max_age / 2 and self._renewing.acquire(blocking=False):
            self._ahead(self._renew)
        sample = self._sample
        assert sample is not None
        server, received = sample
        return server + max(0.0, self.monotonic() - received)

    def _age(self) -> float:
        """Seconds since the sample's answer arrived; infinite before any."""
        sample = self._sample
        return float("inf") if sample is None else self.monotonic() - sample[1]

    def _renew(self) -> None:
        """A renewal ahead: a failure is left to the caller that finds the sample too old."""
        try:
            self.sync()
        except ClockUnavailable as exc:
            log.debug("renewing the API server's time ahead failed: %s", exc)
        finally:
            self._renewing.release()


def _in_daemon_thread(fn: Callable[[], None]) -> None:
    threading.Thread(target=fn, name="server-clock", daemon=True).start()


class FixedClock:
    """A `ServerClock` that says what it is told (tests, tools): ``clock.at = t``."""

    def __init__(self, at: float) -> None:
        self.at = at

    def now(self) -> float:
        return self.at

    def sync(self) -> float:
        return self.at
