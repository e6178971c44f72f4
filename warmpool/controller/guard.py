"""What a reconcile needs from the lock it runs under, whatever implements the lock.

The Redis keyed queue gives a job its lease (``ensure_held`` checks it has not expired, ``fence``
grows with every acquisition); tests of the pool core without Redis use the in-process versions
below. Keeping the contract this small is what lets the same reconcile code run in both.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol


class Guard(Protocol):
    fence: int

    def ensure_held(self) -> None:
        """Raise (the lease implementation's LeaseLost) if the lease is no longer this job's."""


class Leases(Protocol):
    def try_lease(self, key: str) -> AbstractContextManager[Guard | None]:
        """Take another key's lease without waiting; None when someone else holds it."""


class Unguarded:
    """For a single caller that needs no lock (tools, tests of the sequential path)."""

    fence = 0

    def ensure_held(self) -> None:
        return None


class LocalLeases:
    """Per-key locks within one process: the same contract as the Redis leases, no server."""

    def __init__(self) -> None:
        self._locks: dict[str, threading.Lock] = {}
        self._fences: dict[str, int] = {}
        self._mutex = threading.Lock()

    @contextmanager
    def _lease(self, key: str) -> Iterator[Guard | None]:
        with self._mutex:
            lock = self._locks.setdefault(key, threading.Lock())
        if not lock.acquire(blocking=False):
            yield None
            return
        try:
            with self._mutex:
                self._fences[key] = self._fences.get(key, 0) + 1
                guard = Unguarded()
                guard.fence = self._fences[key]
            yield guard
        finally:
            lock.release()

    def try_lease(self, key: str) -> AbstractContextManager[Guard | None]:
        return self._lease(key)
