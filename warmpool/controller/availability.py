"""The session URL probe: GETs `https://<url>` on a schedule, then writes the URL.

session-lifecycle.md §2, as a keyed job (issue #29): an instance's plan for a holder without
its URL names the Session's key ``probe/<ns>/<session>`` (`ProbeKeys`, a follow-up of the
job); each run of that key makes one attempt and returns the schedule's next delay as its
`requeue_after`, so the queue, not a thread of one worker, holds the schedule: any worker
runs the next attempt, a restart loses nothing but the attempt in flight, and the writes go
through the same job machinery as every other. When `Readiness` says the instance answers,
`status.url` is written; after the schedule's last attempt the probe gives up (a Warning
event and `status.error: 551:...`). Every run first reads whether the Session still holds
the instance: a Session re-created under the same name, or one that no longer holds it, is
left alone and the probe ends silently. Both writes also test the Session's uid on the
server, so a re-creation between that read and the write is refused there (422).

Unlike Java's probe this one verifies TLS (system CAs plus an optional bundle, hostname
checked), has connect and read timeouts, and follows no redirect: a 302 from oauth2-proxy
already proves that the route and the pod answer.
"""

from __future__ import annotations

import functools
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import urllib3
from urllib3.exceptions import HTTPError

from warmpool.controller.guard import Unguarded
from warmpool.controller.result import FollowUp, Outcome, Result
from warmpool.keys import ProbeKey
from warmpool.kube.api import Kube
from warmpool.kube.executor import Executor
from warmpool.kube.reader import Reader
from warmpool.pool import vocabulary as v
from warmpool.pool.actions import SetSessionStatus
from warmpool.pool.availability import (
    GIVE_UP_ERROR,
    GIVE_UP_REASON,
    ProbeSettings,
    ProbeTarget,
    Readiness,
)
from warmpool.pool.builders import PoolSettings
from warmpool.pool.model import AppDefinition

log = logging.getLogger(__name__)

USER_AGENT = "warmpool-url-probe"

Fetch = Callable[[str], int | None]


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


@dataclass(frozen=True, slots=True)
class ProbeState:
    """A probe between its runs: the next attempt's number (1-based), Java's readiness flag
    (`Readiness.primed`), and when that attempt is due (ms, on the state store's clock)."""

    attempt: int
    primed: bool
    due_ms: int


class ProbeStates(Protocol):
    """Where a probe's state lives between the runs of its key (the worker keeps it in Redis,
    beside the key: any worker may run the next attempt). Keyed by the Session's uid, so a
    Session re-created under the name starts its own probe."""

    def now_ms(self) -> int:
        """The store's clock (ms): the one `due_ms` is compared with."""

    def get(self, namespace: str, uid: str) -> ProbeState | None: ...

    def put(self, namespace: str, uid: str, state: ProbeState, ttl: float) -> None: ...

    def drop(self, namespace: str, uid: str) -> None: ...


class ProbeWrites(Protocol):
    """The probe's two writes (`SessionWrites` has both, each uid-tested)."""

    def write_url(self, target: ProbeTarget) -> None: ...

    def give_up(self, target: ProbeTarget) -> None: ...


def probe_target(reader: Reader, key: ProbeKey, settings: PoolSettings
                 ) -> ProbeTarget | str:
    """What to probe for the Session of `key`: its URL at the instance it holds, or why there
    is nothing to probe (gone, being deleted, its URL or an error already written, no instance
    held: released since, or re-created)."""
    session = reader.session(key.namespace, key.session)
    if session is None or session.deleting:
        return "no such Session"
    if session.url or session.error:
        return "its URL (or an error) is written"
    held = sorted(k for appdef, k in reader.holdings(key.namespace, session.uid)
                  if appdef == session.appdef)
    if not held:
        return "it holds no instance"
    k = session.instance_id if session.instance_id in held else held[0]
    appdef = reader.appdef(key.namespace, session.appdef)
    if not isinstance(appdef, AppDefinition):
        return "its AppDefinition is missing or invalid"
    return ProbeTarget(key.namespace, key.session, session.uid, k,
                       settings.session_url(appdef, k), appdef.name)


def probe_url(
    reader: Reader, key: ProbeKey, settings: PoolSettings, probe: ProbeSettings, *,
    states: ProbeStates, writes: ProbeWrites, fetch: Fetch,
) -> Result:
    """The job of ``probe/<ns>/<session>`` (issue #29: the URL probe is a keyed job): one
    attempt a run, the next one the schedule's delay later as `requeue_after`.

    Asked again before every attempt (level-triggered, from the job's reader) whether the
    Session still holds its instance and lacks its URL: a released or re-created Session's
    probe ends without a write. A run before its attempt is due (an instance's reconcile
    queues the key again) only waits the rest. When `Readiness` says the instance answers,
    `status.url` is written; after the schedule's last attempt, the give-up. A write that
    raises counts as an attempt that was not ready (tried again after the next GET, unless it
    was the last). Both writes test the Session's uid on the server."""
    target = probe_target(reader, key, settings)
    if isinstance(target, str):
        return Result(Outcome.SKIPPED, message=target)
    now = states.now_ms()
    schedule = probe.schedule
    ttl = schedule.total + STATE_SLACK
    state = states.get(key.namespace, target.uid)
    if state is None:  # a new probe: its first attempt after the first delay
        first = schedule.delay_before(1)
        states.put(key.namespace, target.uid,
                   ProbeState(1, False, now + int(first * 1000)), ttl)
        log.debug("probing %s for Session %s/%s", target.url, key.namespace, key.session)
        return Result(Outcome.PROBED, requeue_after=first, message="started")
    if now < state.due_ms:
        return Result(Outcome.SCHEDULED, requeue_after=(state.due_ms - now) / 1000)
    try:
        status = fetch(target.url)
    except Exception:  # a fetch that raises is an attempt without a status
        log.exception("probe of %s failed", target.url)
        status = None
    ready, readiness = Readiness(state.primed).observe(status)
    last = state.attempt >= schedule.attempts
    if ready or last:
        try:
            if ready:
                writes.write_url(target)
                log.info("Session %s/%s: %s answers (attempt %d), its URL is written",
                         key.namespace, key.session, target.url, state.attempt)
            else:
                writes.give_up(target)
                log.warning("Session %s/%s: %s did not answer in %d attempts; gave up",
                            key.namespace, key.session, target.url, state.attempt)
            done = True
        except Exception:
            log.exception("Session %s/%s: writing the probe's outcome failed",
                          key.namespace, key.session)
            done = last
        if done:
            states.drop(key.namespace, target.uid)
            return Result(Outcome.PROBED, message="answered" if ready else "gave up")
    delay = schedule.delay_before(state.attempt + 1)
    states.put(key.namespace, target.uid,
               ProbeState(state.attempt + 1, readiness.primed, now + int(delay * 1000)), ttl)
    return Result(Outcome.PROBED, requeue_after=delay,
                  message=f"attempt {state.attempt}: not ready")


#: How long a probe's state outlives its schedule (a key delayed by a busy queue).
STATE_SLACK = 3600.0


class ProbeKeys:
    """The executor's `Prober` in a job: each URL to probe becomes its Session's probe key,
    a follow-up of the job (`follow_ups`). Re-adding a waiting probe key only runs it early,
    which waits the rest (`probe_url`)."""

    def __init__(self) -> None:
        self.keys: list[ProbeKey] = []

    def submit(self, target: ProbeTarget) -> bool:
        key = ProbeKey(target.namespace, target.session)
        if key not in self.keys:
            self.keys.append(key)
        return True

    def follow_ups(self) -> list[FollowUp]:
        return [(k, None) for k in self.keys]


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
