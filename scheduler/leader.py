"""Leader election on a ``coordination.k8s.io/v1`` Lease, the way client-go does it.

Why not ``kubernetes.leaderelection`` (shipped with the v37 client): it talks through the
global default configuration (``client.CoordinationV1Api()``), its ``run()`` can never be
stopped, it never releases the Lease, and it has no notion of "still leader" other than a
callback thread; so a holder that cannot renew keeps acting until its callback notices.
This is a small re-implementation of client-go's ``LeaderElector``:

- A candidate reads the Lease every ``retry_period`` (with a little jitter). It may take the
  Lease when it is free (no ``holderIdentity``) or when the record (holder, renewTime,
  leaseDurationSeconds, transitions) has not changed for the record's
  ``leaseDurationSeconds`` as measured on *this* process's monotonic clock since it first saw
  that record (no comparison of wall clocks between hosts).
- Every write is a merge patch preconditioned on the resourceVersion just read, so of two
  candidates exactly one wins (the other gets 409 and stays a candidate). Creation of a
  missing Lease is the same race, decided by AlreadyExists.
- The leader renews every ``retry_period``. ``is_leader()`` is true only while the last
  successful renewal *started* less than ``renew_deadline`` ago, so a leader that cannot
  renew stops acting by itself after the renew deadline, ``lease_duration - renew_deadline``
  (5 s by default) before anyone else may take over. Leadership is then given up
  (``on_stopped``) and the elector becomes a candidate again. A renewal that succeeds only
  after ``is_leader()`` had turned false (one slow attempt, or a retry right at the deadline)
  is a new term too: ``on_stopped`` then ``on_started``, so the scheduler resyncs what it
  dropped in the gap.
- ``release()`` (on SIGTERM) does what client-go does: clears ``holderIdentity``, sets
  ``leaseDurationSeconds`` to 1 and ``renewTime``/``acquireTime`` to now, so a standby takes
  over on its next retry instead of after the lease duration. Better than client-go, a
  candidate also watches the Lease (it carries the label ``warmpool.io/lease=<name>``, so a
  label-selected watch finds it) and retries the moment it sees it released or deleted: the
  hand-over after a SIGTERM takes one round trip, not up to a retry period. The watch also
  dates each renewal when it happens, and a candidate retries right when the holder's lease
  runs out, so a SIGKILLed leader is replaced after the lease duration, not up to two retry
  periods later.

A Lease does not fence: two processes may briefly both believe they lead (a pause longer than
the margin). The scheduler only adds keys to the queue, which deduplicates them and never runs
one key twice at once, so a short overlap costs at most some duplicate adds.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from warmpool.kube.api import Conflict, Kube, KubeError
from warmpool.pool.meta import resource_version_of

log = logging.getLogger(__name__)

LEASE_API_VERSION = "coordination.k8s.io/v1"
LEASE_KIND = "Lease"
DEFAULT_LEASE_NAME = "warmpool-scheduler"
LEASE_LABEL = "warmpool.io/lease"


def default_identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}"


def micro_time(now: datetime | None = None) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class LeaderConfig:
    namespace: str
    name: str = DEFAULT_LEASE_NAME
    identity: str = ""
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    jitter: float = 0.2  # a candidate waits retry_period * (1 + jitter * random)
    watch: bool = True  # candidates watch the Lease and retry as soon as it is released

    def __post_init__(self) -> None:
        if not self.identity:
            object.__setattr__(self, "identity", default_identity())
        if not self.lease_duration > self.renew_deadline > 0:
            raise ValueError("lease duration must be greater than the renew deadline (> 0)")
        if not self.renew_deadline > self.retry_period * (1 + self.jitter) > 0:
            raise ValueError("renew deadline must be greater than retry period x (1 + jitter)")
        if round(self.lease_duration) < 1:
            raise ValueError("lease duration must be at least 1 s")


@dataclass(frozen=True, slots=True)
class Record:
    holder: str
    lease_duration: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int

    @classmethod
    def of(cls, lease: dict[str, Any]) -> Record:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )


def call_timeout(config: LeaderConfig) -> float:
    """How long each API call of an attempt (a GET, then a PATCH) may wait: half the renew
    deadline, so a whole attempt ends within it. A leader whose link to the API server
    stalls stops acting at the renew deadline by its own clock whatever its calls do
    (`is_leader`); this bound makes the stalled attempt itself fail by then too, so the
    leader steps down (`on_stopped`) and is a candidate again, `lease_duration -
    renew_deadline` before any other candidate may take the Lease (the step-down margin,
    5 s by default), and a healed leader retries at once instead of after a 60 s read."""
    return config.renew_deadline / 2


class LeaderElector:
    """Run with ``run(stop)`` in a thread; ask ``is_leader()`` before every action."""

    def __init__(
        self,
        kube: Kube,
        config: LeaderConfig,
        *,
        on_started: Callable[[], None] | None = None,
        on_stopped: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[threading.Event, float], bool] = threading.Event.wait,
    ) -> None:
        """`clock` (seconds) dates every lease decision and `wait(event, seconds)` is every
        pause between attempts (True if the event was set): injected together, as client-go's
        clock is, a test runs the protocol on a fake time and asserts exact times on it."""
        self.kube = kube
        self.config = config
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.clock = clock
        self._wait = wait
        self._lock = threading.Lock()
        self._leading = False
        self._renewed_at = -float("inf")
        self._observed: Record | None = None
        self._observed_at = -float("inf")
        self.acquired_count = 0
        self.last_error: str | None = None
        self._wake = threading.Event()

    @property
    def identity(self) -> str:
        return self.config.identity

    def is_leader(self) -> bool:
        with self._lock:
            return self._leading and self.clock() - self._renewed_at < self.config.renew_deadline

    def observed_holder(self) -> str:
        return self._observed.holder if self._observed else ""

    # --- one step ---------------------------------------------------------------------------

    def _get(self) -> dict[str, Any] | None:
        c = self.config
        return self.kube.get(LEASE_API_VERSION, LEASE_KIND, c.namespace, c.name)

    def try_acquire_or_renew(self) -> bool:
        """One attempt (client-go's ``tryAcquireOrRenew``); True if we hold the Lease now."""
        c = self.config
        started = self.clock()
        now = micro_time()
        lease = self._get()
        if lease is None:
            body = {
                "apiVersion": LEASE_API_VERSION, "kind": LEASE_KIND,
                "metadata": {"name": c.name, "namespace": c.namespace,
                             "labels": {LEASE_LABEL: c.name}},
                "spec": {"holderIdentity": c.identity,
                         "leaseDurationSeconds": round(c.lease_duration),
                         "acquireTime": now, "renewTime": now, "leaseTransitions": 0},
            }
            try:
                created = self.kube.create(body)
            except Conflict:
                return False  # another candidate created it first
            self._observe(created, started)
            self._renewed(started)
            return True

        record = Record.of(lease)
        self._observe(lease, started)
        held_by_other = record.holder and record.holder != c.identity
        if held_by_other and self._observed_at + record.lease_duration > self.clock():
            return False
        if record.holder == c.identity:
            acquire_time, transitions = record.acquire_time or now, record.transitions
        else:
            acquire_time, transitions = now, record.transitions + 1
        spec = {"holderIdentity": c.identity, "leaseDurationSeconds": round(c.lease_duration),
                "acquireTime": acquire_time, "renewTime": now, "leaseTransitions": transitions}
        try:
            updated = self.kube.merge_patch(
                LEASE_API_VERSION, LEASE_KIND, c.namespace, c.name,
                {"metadata": {"labels": {LEASE_LABEL: c.name}}, "spec": spec},
                resource_version=resource_version_of(lease))
        except Conflict:
            return False  # someone wrote it since we read it: look again next time
        self._observe(updated, started)
        self._renewed(started)
        return True

    def _observe(self, lease: dict[str, Any], at: float) -> None:
        """Note the record and, if it changed, when we first saw it (our clock only)."""
        record = Record.of(lease)
        with self._lock:
            if record != self._observed:
                if self._observed is not None and record.holder != self._observed.holder:
                    log.info("lease %s/%s: holder %r -> %r", self.config.namespace,
                             self.config.name, self._observed.holder, record.holder)
                self._observed = record
                self._observed_at = at

    def _expires_in(self) -> float | None:
        """Seconds until another holder's lease expires as we observe it (None: not held by
        another)."""
        with self._lock:
            rec = self._observed
            if rec is None or not rec.holder or rec.holder == self.config.identity:
                return None
            return self._observed_at + rec.lease_duration - self.clock()

    def _renewed(self, started: float) -> None:
        with self._lock:
            self._renewed_at = started

    def release(self) -> bool:
        """Give the Lease up at once if we hold it (client-go's ``release``)."""
        c = self.config
        with self._lock:
            was_leading = self._leading
            self._leading = False
        try:
            lease = self._get()
            if lease is None or Record.of(lease).holder != c.identity:
                return False
            record = Record.of(lease)
            now = micro_time()
            self.kube.merge_patch(
                LEASE_API_VERSION, LEASE_KIND, c.namespace, c.name,
                {"spec": {"holderIdentity": None, "leaseDurationSeconds": 1,
                          "acquireTime": now, "renewTime": now,
                          "leaseTransitions": record.transitions}},
                resource_version=resource_version_of(lease))
            log.info("lease %s/%s released by %s", c.namespace, c.name, c.identity)
            return True
        except (Conflict, KubeError, OSError) as exc:
            log.warning("could not release lease %s/%s: %s", c.namespace, c.name, exc)
            return False
        finally:
            if was_leading and self.on_stopped is not None:
                self._call(self.on_stopped)

    # --- the loop ---------------------------------------------------------------------------

    def _attempt(self) -> bool:
        try:
            ok = self.try_acquire_or_renew()
            self.last_error = None
            return ok
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("lease %s/%s: %s", self.config.namespace, self.config.name,
                        self.last_error)
            return False

    def _sleep(self, stop: threading.Event, jitter: bool) -> None:
        """One retry period (jittered for candidates); a candidate wakes early when the
        Lease watch sees the Lease released."""
        c = self.config
        wait = c.retry_period * (1 + (c.jitter * random.random() if jitter else 0))
        expires = self._expires_in() if jitter else None
        if expires is not None and 0 <= expires < wait:
            wait = expires + 0.05  # retry right when the holder's lease runs out
        deadline = self.clock() + wait
        while not stop.is_set() and (left := deadline - self.clock()) > 0:
            if jitter and self._wait(self._wake, min(left, 0.1)):
                self._wake.clear()
                return
            if not jitter:
                self._wait(stop, min(left, 0.1))

    def watch_lease(self, stop: threading.Event) -> None:
        """Wake the candidate loop when the Lease is released (no holder) or deleted."""
        from warmpool.kube.reflector import Backoff, is_gone

        c = self.config
        backoff = Backoff()
        selector = f"{LEASE_LABEL}={c.name}"
        rv: str | None = None
        while not stop.is_set():
            try:
                if rv is None:
                    _, rv = self.kube.list(LEASE_API_VERSION, LEASE_KIND, c.namespace,
                                           label_selector=selector)
                for event in self.kube.watch(LEASE_API_VERSION, LEASE_KIND, c.namespace,
                                             resource_version=rv, label_selector=selector,
                                             timeout_seconds=random.randint(60, 120)):
                    if stop.is_set():
                        return
                    obj = event.get("object") or {}
                    rv = resource_version_of(obj) or rv
                    if event.get("type") == "BOOKMARK":
                        continue
                    if event.get("type") == "DELETED":
                        self._wake.set()
                        continue
                    # Seen now, not up to a retry period later: the expiry we wait for
                    # starts from the holder's real last renewal.
                    self._observe(obj, self.clock())
                    if not (obj.get("spec") or {}).get("holderIdentity"):
                        self._wake.set()
            except Exception as exc:
                if is_gone(exc):
                    rv = None
                    continue
                log.debug("lease watch: %s", exc)
                stop.wait(backoff.next())

    def run(self, stop: threading.Event) -> None:
        """Acquire, lead while renewing, fall back to candidate when a renewal deadline is
        missed; on `stop`, release the Lease if held."""
        c = self.config
        if c.watch:
            threading.Thread(target=self.watch_lease, args=(stop,), name="lease-watch",
                             daemon=True).start()
        try:
            while not stop.is_set():
                # Candidate.
                if not self._attempt():
                    self._sleep(stop, jitter=True)
                    continue
                with self._lock:
                    self._leading = True
                self.acquired_count += 1
                log.info("%s leads (lease %s/%s)", c.identity, c.namespace, c.name)
                self._call(self.on_started)
                # Leader: renew every retry period until a renewal deadline is missed.
                lapsed = False
                while not stop.is_set():
                    self._sleep(stop, jitter=False)
                    if stop.is_set():
                        break
                    before = self._renewed_at
                    if self._attempt():
                        # Renewed; but if `is_leader()` turned false meanwhile (the attempts
                        # failed until just before the deadline, or this one was slow),
                        # whatever the scheduler offered in that gap was dropped as a
                        # standby's. So that is a new term: end the old one and start the new
                        # one once it counts (`on_started`: the scheduler resyncs). The chaos
                        # long tier, seed 26: two Sessions' keys lost in such a gap waited
                        # for the periodic resync.
                        lapsed = lapsed or self.clock() - before >= c.renew_deadline
                        if lapsed and self.is_leader():
                            lapsed = False
                            log.warning("%s: renewed the lease only after the renew deadline "
                                        "(%.0fs) had passed: leading again as a new term",
                                        c.identity, c.renew_deadline)
                            self._call(self.on_stopped)
                            self._call(self.on_started)
                        continue
                    if self._observed and self._observed.holder not in ("", c.identity):
                        log.warning("%s: lease taken by %s", c.identity, self._observed.holder)
                        break
                    if not self.is_leader():
                        log.warning("%s: could not renew the lease within %.0fs", c.identity,
                                    c.renew_deadline)
                        break
                if stop.is_set():
                    break
                with self._lock:
                    self._leading = False
                self._call(self.on_stopped)
        finally:
            if stop.is_set():
                self.release()

    @staticmethod
    def _call(fn: Callable[[], None] | None) -> None:
        if fn is None:
            return
        try:
            fn()
        except Exception:
            log.exception("leader election callback failed")
