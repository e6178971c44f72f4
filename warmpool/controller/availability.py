"""The session URL probe's runner: GETs `https://<url>` on a schedule, then writes the URL.

session-lifecycle.md §2. A claim hands a `ProbeTarget` to `ProbeRunner.submit`, which returns at
once: one scheduler thread keeps a heap of due attempts and hands each to a small thread pool
for its GET, so no worker thread ever sleeps on the schedule. When `Readiness` says the
instance answers, the runner writes `status.url`; after the schedule's last attempt it gives up
(a Warning event and `status.error: 551:...`). Before either write it asks `still_holds`: a
Session re-created under the same name, or one that no longer holds the instance, is left
alone and the probe ends silently. Both default writes also test the Session's uid on the
server, so a re-creation between that check and the write is refused there (422).

Unlike Java's probe this one verifies TLS (system CAs plus an optional bundle, hostname
checked), has connect and read timeouts, and follows no redirect: a 302 from oauth2-proxy
already proves that the route and the pod answer.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import urllib3
from urllib3.exceptions import HTTPError

from warmpool.controller.guard import Unguarded
from warmpool.kube.api import Kube
from warmpool.kube.executor import Executor
from warmpool.pool import vocabulary as v
from warmpool.pool.actions import SetSessionStatus
from warmpool.pool.availability import (
    GIVE_UP_ERROR,
    GIVE_UP_REASON,
    ProbeSettings,
    ProbeTarget,
    Readiness,
)

log = logging.getLogger(__name__)

USER_AGENT = "warmpool-url-probe"

Fetch = Callable[[str], int | None]
TargetFn = Callable[[ProbeTarget], None]
HoldsFn = Callable[[ProbeTarget], bool]


@functools.lru_cache(maxsize=8)
def ssl_context(ca_bundle: str | None = None) -> ssl.SSLContext:
    """The system's CAs, plus those of the PEM file `ca_bundle`; hostnames checked. Made once
    per bundle path (loading the system store per GET would cost more than the GET); a bundle
    that cannot be read raises ValueError naming it."""
    context = ssl.create_default_context()
    if ca_bundle:
        try:
            context.load_verify_locations(cafile=ca_bundle)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"URL probe CA bundle {ca_bundle}: {exc}") from None
    return context


def fetch_status(url: str, *, ca_bundle: str | None = None, timeout: float = 5.0) -> int | None:
    """The HTTP status of `GET https://<url>`, or None if no status came (refused, timed out,
    TLS not trusted or not for this host). Redirects are not followed: a 302 is returned. The
    body is not read; the connection is closed after each attempt."""
    pool = urllib3.PoolManager(
        num_pools=1, ssl_context=ssl_context(ca_bundle), cert_reqs="CERT_REQUIRED",
        retries=False, timeout=urllib3.Timeout(connect=timeout, read=timeout),
        headers={"User-Agent": USER_AGENT},
    )
    try:
        response = pool.request("GET", f"https://{url}", redirect=False, preload_content=False)
        response.close()  # the status is all we need
        return response.status
    except (HTTPError, OSError, ValueError) as exc:  # ValueError: a URL that does not parse
        log.debug("probe of %s: no status (%s)", url, exc)
        return None
    finally:
        pool.clear()


class Clock(Protocol):
    """The runner's time: `now` in seconds, and `wait`, called with `cond` held, returning
    after `timeout` seconds of this clock (None: until notified) or when `cond` is notified."""

    def now(self) -> float: ...

    def wait(self, cond: threading.Condition, timeout: float | None) -> None: ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        cond.wait(timeout)


@dataclass
class _Probe:
    target: ProbeTarget
    attempt: int = 1  # the next attempt's number, 1-based
    readiness: Readiness = field(default_factory=Readiness)
    cancelled: bool = False


class ProbeRunner:
    """Runs one probe per (namespace, Session uid) on `settings.schedule`.

    `fetch(url)` gets a status (default: `fetch_status` with the settings' bundle and
    timeout). `still_holds(target)` is asked before every attempt and every write; False
    ends the probe without a write. `write_url(target)` and `give_up(target)` write
    (`SessionWrites(kube)` has both). A write that raises counts as an attempt that was not
    ready: the probe goes on with its schedule and tries again after the next GET.
    `workers` bounds the GETs (and writes) in flight; each probe has at most one attempt
    queued or running.
    """

    def __init__(
        self,
        settings: ProbeSettings,
        *,
        still_holds: HoldsFn,
        write_url: TargetFn,
        give_up: TargetFn,
        fetch: Fetch | None = None,
        clock: Clock | None = None,
        workers: int = 8,
    ) -> None:
        self.settings = settings
        self._still_holds = still_holds
        self._write_url = write_url
        self._give_up = give_up
        if fetch is None:
            ssl_context(settings.ca_bundle)  # an unreadable bundle fails here, not per GET
            fetch = functools.partial(fetch_status, ca_bundle=settings.ca_bundle,
                                      timeout=settings.timeout)
        self._fetch = fetch
        self._clock: Clock = clock or MonotonicClock()
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Probe]] = []
        self._order = itertools.count()  # ties in due time: first scheduled, first run
        self._probes: dict[tuple[str, str], _Probe] = {}
        self._in_flight = 0  # attempts handed to the pool and not yet over
        self._stopped = False
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="url-probe")
        self._thread = threading.Thread(target=self._run, name="url-probe-timer", daemon=True)
        self._thread.start()

    # -- the callers' side

    def submit(self, target: ProbeTarget) -> bool:
        """Start probing for `target` unless a probe for its (namespace, uid) runs; returns
        whether this started one. Never blocks on the probe."""
        with self._cond:
            if self._stopped or target.key in self._probes:
                return False
            probe = _Probe(target)
            self._probes[target.key] = probe
            self._schedule(probe)
            log.debug("probing %s for Session %s/%s", target.url, target.namespace,
                      target.session)
            return True

    def cancel(self, namespace: str, uid: str) -> bool:
        """Stop the probe of Session `uid` without a write (its Session released the
        instance, say); returns whether one ran. An attempt in flight finishes unheard."""
        with self._cond:
            probe = self._probes.pop((namespace, uid), None)
            if probe is None:
                return False
            probe.cancelled = True
            return True

    def probing(self, namespace: str, uid: str) -> bool:
        with self._cond:
            return (namespace, uid) in self._probes

    def __len__(self) -> int:
        """The probes running (waiting for their next attempt, or in one)."""
        with self._cond:
            return len(self._probes)

    def in_flight(self) -> int:
        """The attempts handed to the thread pool and not yet over."""
        with self._cond:
            return self._in_flight

    def stop(self, timeout: float | None = None) -> None:
        """End every probe without a write and wait (up to `timeout` s for the timer thread)
        for the attempts in flight; each is bounded by the fetch's own timeouts."""
        with self._cond:
            self._stopped = True
            for probe in self._probes.values():
                probe.cancelled = True
            self._probes.clear()
            self._heap.clear()
            self._cond.notify_all()
        self._thread.join(timeout)
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- the timer

    def _schedule(self, probe: _Probe) -> None:
        """Queue `probe`'s next attempt after its delay (with `_cond` held)."""
        due = self._clock.now() + self.settings.schedule.delay_before(probe.attempt)
        heapq.heappush(self._heap, (due, next(self._order), probe))
        self._cond.notify_all()

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                if not self._heap:
                    self._clock.wait(self._cond, None)
                    continue
                due = self._heap[0][0]
                now = self._clock.now()
                if due > now:
                    self._clock.wait(self._cond, due - now)
                    continue
                _, _, probe = heapq.heappop(self._heap)
                if probe.cancelled:
                    continue
                try:
                    self._pool.submit(self._attempt, probe)
                except RuntimeError:  # the pool shut down: stop() is under way
                    return
                self._in_flight += 1

    # -- one attempt, on a pool thread

    def _attempt(self, probe: _Probe) -> None:
        try:
            self._try(probe)
        finally:
            with self._cond:
                self._in_flight -= 1

    def _try(self, probe: _Probe) -> None:
        target = probe.target
        if not self._still_holds(target):
            # Released (or its URL written elsewhere) since the last attempt: no more GETs.
            self._end(probe)
            return
        try:
            status = self._fetch(target.url)
        except Exception:  # a fetch that raises is an attempt without a status
            log.exception("probe of %s failed", target.url)
            status = None
        ready, probe.readiness = probe.readiness.observe(status)
        last = probe.attempt >= self.settings.schedule.attempts
        if ready or last:
            if probe.cancelled:
                return
            try:
                self._finish(probe, ready)
                done = True
            except Exception:  # tried again after the next GET, unless this was the last
                log.exception("Session %s/%s: writing the probe's outcome failed",
                              target.namespace, target.session)
                done = last
            if done:
                self._end(probe)
                return
        with self._cond:
            if probe.cancelled or self._stopped:
                return
            probe.attempt += 1
            self._schedule(probe)

    def _finish(self, probe: _Probe, ready: bool) -> None:
        """The write for a ready URL or the give-up, if the Session still holds the instance."""
        target = probe.target
        if not self._still_holds(target):
            log.info("Session %s/%s no longer holds instance %s: its probe ends",
                     target.namespace, target.session, target.instance)
            return
        if ready:
            self._write_url(target)
            log.info("Session %s/%s: %s answers (attempt %d), its URL is written",
                     target.namespace, target.session, target.url, probe.attempt)
        else:
            self._give_up(target)
            log.warning("Session %s/%s: %s did not answer in %d attempts; gave up",
                        target.namespace, target.session, target.url, probe.attempt)

    def _end(self, probe: _Probe) -> None:
        with self._cond:
            if self._probes.get(probe.target.key) is probe:
                del self._probes[probe.target.key]
            probe.cancelled = True


class SessionWrites:
    """The runner's default writes, each a uid-tested status patch (`Executor._set_status`):
    a Session re-created under the same name since (a 422) or deleted (a 404) is not
    written, and the write ends quietly."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def _status(self, target: ProbeTarget, status: dict[str, str]) -> int:
        executor = Executor(self.kube, target.namespace, Unguarded())
        return executor.apply([SetSessionStatus(session=target.session, status=status,
                                                uid=target.uid)])

    def write_url(self, target: ProbeTarget) -> None:
        """`status.url` and nothing else."""
        self._status(target, {"url": target.url})

    def give_up(self, target: ProbeTarget) -> None:
        """`status.error: 551:...` (the REST service's own give-up), then a Warning event."""
        if not self._status(target, {"error": GIVE_UP_ERROR}):
            return  # re-created since: the event would name the new Session's name
        regarding = {"apiVersion": v.SESSION_API_VERSION, "kind": v.SESSION_KIND,
                     "name": target.session, "uid": target.uid}
        self.kube.event(target.namespace, regarding, GIVE_UP_REASON,
                        f"{target.url} did not answer in time: {GIVE_UP_ERROR}", warning=True)
