"""The Redis epoch: how every process notices, within seconds, that Redis lost its data.

The queue lives in Redis only: a Redis restarted without persistence, a FLUSHALL, a managed
Redis evicting keys or a failover to an empty replica forgets every waiting key, lease and
fence at once, and nothing else would notice until the scheduler's next periodic resync. So
the scheduler keeps one key, `<prefix>epoch`, holding a random value it created; it and every
worker process read it every `QueueSettings.epoch_period`. A key that is missing, or holds
another value than the one last seen, means the data this process knew of is gone: the
scheduler creates the key again (SET NX: with two replicas one value wins and the other adopts
it) and resyncs everything at once; workers log it and count it.

A first sight is never a loss: a new process has nothing to compare with, and the scheduler's
startup resync covers whatever happened before it ran.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import redis

from warmpool.queue.layout import Layout

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EpochCheck:
    lost: bool  # the epoch this process knew is gone (missing, or replaced)
    previous: str | None  # the epoch known before this check
    current: str | None  # the epoch now (None: missing, and this process does not create it)


def new_token() -> str:
    return uuid.uuid4().hex


class Epoch:
    """One process's view of the epoch. `create`: this process (a scheduler) creates the key
    when it is missing; others (workers) only read it."""

    def __init__(
        self,
        client: redis.Redis,
        layout: Layout,
        *,
        create: bool,
        token: Callable[[], str] = new_token,
    ) -> None:
        self.client = client
        self.key = layout.epoch
        self.create = create
        self.token = token
        self.known: str | None = None
        self._lock = threading.Lock()

    def _read(self) -> str | None:
        raw = self.client.get(self.key)
        if raw is None and self.create:
            mine = self.token()
            # No TTL: the key must outlive everything else, or it would report a loss itself.
            if self.client.set(self.key, mine, nx=True):
                return mine
            raw = self.client.get(self.key)  # another scheduler's, made just now
        if raw is None:
            return None
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def check(self) -> EpochCheck:
        """Read (and, if this process creates it, re-create) the epoch; one or two round
        trips. Raises redis.RedisError when Redis does not answer: nothing is known then."""
        with self._lock:
            current = self._read()
            previous = self.known
            lost = previous is not None and current != previous
            if current is not None or lost:
                # A missing epoch is reported once: until the scheduler makes a new one there
                # is nothing more to lose, and the new one is not a second loss.
                self.known = current
            if lost:
                log.warning("Redis lost its data: epoch %s is %s", previous,
                            f"now {current}" if current else "missing")
            return EpochCheck(lost, previous, current)
