"""Leases held by this process, and the heartbeat thread that keeps them (and the worker's
dramatiq heartbeat) alive.

A lease is valid locally until `valid_until`: the monotonic time *before* the request that
took or last renewed it, plus the TTL, minus a margin. The server's expiry is always later
than that, so `ensure_held()` never claims a lease the server has already let go, and it
needs no round trip. A renewal that finds another token (or none) marks the lease lost for
good: the job must stop writing; its fence (or Kubernetes' resourceVersion) guards the rest.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from warmpool.queue.clock import ServerClock
from warmpool.queue.observer import QueueObserver
from warmpool.queue.scripts import Scripts, parse_lease
from warmpool.queue.settings import QueueSettings

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """The job no longer holds this key: another worker may be running it now."""

    def __init__(self, key: str) -> None:
        super().__init__(f"lease lost on {key!r}")
        self.key = key


@dataclass(eq=False)
class Lease:
    key: str
    value: str  # "<fence>|<holder token>", exactly what the lease key holds
    fence: int
    valid_until: float  # time.monotonic()
    primary: bool = True
    lost: bool = False
    released: bool = False
    _book: LeaseBook | None = field(default=None, repr=False)

    @property
    def holder(self) -> str:
        return holder_of(self.value)

    def held(self) -> bool:
        return not (self.lost or self.released) and time.monotonic() < self.valid_until

    def ensure_held(self) -> None:
        """Raise LeaseLost unless this lease is still ours; call before every write."""
        if not self.held():
            raise LeaseLost(self.key)

    def ttl_left(self) -> float:
        return max(0.0, self.valid_until - time.monotonic())

    def lift_fence(self, seen: int) -> None:
        """An object carries fence `seen`, above ours: make every later acquisition's fence
        exceed it (the counter may have been reset by a Redis that lost its data, and the next
        holder must not look stale next to what the previous ones wrote)."""
        if self._book is None:
            raise RuntimeError(f"lease on {self.key!r} is not tracked by a LeaseBook")
        counter = self._book.scripts.lift_fence(seen)
        log.warning("lease on %s: an object carries fence %d above ours (%d); fence counter "
                    "now %d", self.key, seen, self.fence, counter)


def holder_of(value: str) -> str:
    """The holder part ("host:pid:thread:nonce") of a lease value."""
    return value.split("|", 1)[-1]


def fence_of(value: str) -> int | None:
    """The fence of a lease value, or None when it is not one (Redis contents are not
    trusted: `scripts.parse_lease` bounds the parse)."""
    parsed = parse_lease(value)
    return parsed[0] if parsed is not None else None


def process_of(holder: str) -> str:
    """The process ("host:pid") of a holder token ("host:pid:thread:nonce.n"), as a
    worker names itself (`Layout.worker`): how a lease is matched to its worker."""
    parts = holder.split(":")
    return ":".join(parts[:2]) if len(parts) >= 2 else holder


class LeaseBook:
    """The leases this process holds; renews them all every `settings.renew_period`."""

    def __init__(
        self,
        client: redis.Redis,
        scripts: Scripts,
        settings: QueueSettings,
        observer: Callable[[], QueueObserver],
        clock: ServerClock | None = None,
    ) -> None:
        self.client = client
        # The heartbeat's score is compared with other hosts' clocks: the server's is used.
        self.clock = clock or ServerClock(client)
        self.scripts = scripts
        self.settings = settings
        self._observer = observer
        self._leases: dict[int, Lease] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._heartbeat: tuple[str, str, str] | None = None
        # host:pid names the holder for humans; a per-book nonce and a counter make every
        # token unique without a syscall per token.
        self._identity = f"{socket.gethostname()}:{os.getpid()}"
        self._nonce = uuid.uuid4().hex[:8]
        self._counter = itertools.count(1)
        ttl = settings.lease_ttl
        # The write margin: a holder whose renewals stop getting through (Redis down, its link
        # partitioned or stalled) stops writing at least this long before its lease can expire
        # in Redis -- more, by the renewal's round trip, since validity counts from when the
        # request was sent and Redis counts from when it arrived. It covers the two clocks'
        # rates; a write checked just before and still in flight is refused by its fence or
        # precondition if another holder has written since.
        self.margin = min(0.5, ttl / 10)

    def new_token(self) -> str:
        return f"{self._identity}:{threading.get_ident()}:{self._nonce}.{next(self._counter)}"

    def valid_until(self, sent_at: float) -> float:
        return sent_at + self.settings.lease_ttl - self.margin

    def track(self, lease: Lease) -> Lease:
        lease._book = self
        with self._lock:
            self._leases[id(lease)] = lease
        return lease

    def untrack(self, lease: Lease) -> None:
        lease.released = True
        with self._lock:
            self._leases.pop(id(lease), None)

    def held(self) -> list[Lease]:
        with self._lock:
            return list(self._leases.values())

    def renew_once(self) -> None:
        """One renewal pass over every held lease, plus the dramatiq worker heartbeat."""
        if self._heartbeat is not None:
            key, worker_id, name_key = self._heartbeat
            with self.client.pipeline(transaction=False) as p:
                p.zadd(key, {worker_id: self.clock.now_ms()})
                # Which process this worker id is, for tools: a killed worker's entry expires.
                p.set(name_key, self._identity,
                      ex=max(1, int(3 * self.settings.heartbeat_timeout)))
                p.execute()
        leases = [lease for lease in self.held() if not lease.lost]
        if not leases:
            return
        sent_at = time.monotonic()
        results = self.scripts.renew(
            self.settings.lease_ttl_ms, [(lease.key, lease.value) for lease in leases]
        )
        for lease, ok in zip(leases, results, strict=True):
            if ok:
                lease.valid_until = self.valid_until(sent_at)
            elif not lease.released:
                lease.lost = True
                log.warning("lease on %s lost (renewal refused)", lease.key)
                self._observer().on_lease_lost(lease.key)

    def _run(self) -> None:
        while not self._stop.wait(self.settings.renew_period):
            try:
                self.renew_once()
            except Exception:
                # Leases lapse locally (valid_until) if this keeps failing; jobs then stop.
                log.exception("lease renewal failed")

    def start(self, heartbeat: tuple[str, str, str] | None = None) -> None:
        """Start renewing; `heartbeat` = (dramatiq heartbeats key, worker id) to keep the
        worker alive in dramatiq's eyes even while every thread runs a long job."""
        self._heartbeat = heartbeat
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
