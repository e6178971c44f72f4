"""What a reconcile needs from the lock it runs under, whatever implements the lock.

The Redis keyed queue gives a job its lease (``ensure_held`` checks it has not expired, ``fence``
grows with every acquisition, ``lift_fence`` raises the counter past a fence seen on an object);
tests of the pool core without Redis use the in-process versions below. Keeping the contract
this small is what lets the same reconcile code run in both. The lease protocol itself,
`Guard`, is the executor's (``warmpool.kube.guard``); `Leases` is the reconcile's own.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

from warmpool.kube.guard import Guard


class Leases(Protocol):
    def try_lease(self, key: str) -> AbstractContextManager[Guard | None]:
        """Take another key's lease without waiting; None when someone else holds it."""


class Unguarded:
    """For a single caller that needs no lock (tools, tests of the sequential path)."""

    fence = 0

    def ensure_held(self) -> None:
        return None

    def lift_fence(self, seen: int) -> None:
        """Nothing to lift: an unguarded caller takes no leases."""
        return None


class _Fences:
    """One fence counter for every `LocalLeases` of the process, as Redis has one for every
    worker: each sequential run makes its own `LocalLeases`, and a run whose fences started
    over at 1 would find its predecessors' writes above its own and refuse to act."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        self._last = 0

    def next(self) -> int:
        with self._lock:
            self._last = next(self._counter)
            return self._last

    def lift(self, seen: int) -> None:
        with self._lock:
            if seen > self._last:
                self._counter = itertools.count(seen + 1)
                self._last = seen


_FENCES = _Fences()


class _LocalGuard:
    """A lease of `LocalLeases`: held until its block ends."""

    def __init__(self, fence: int) -> None:
        self.fence = fence

    def ensure_held(self) -> None:
        return None

    def lift_fence(self, seen: int) -> None:
        _FENCES.lift(seen)


class LocalLeases:
    """Per-key locks within one process: the same contract as the Redis leases, no server."""

    def __init__(self) -> None:
        self._locks: dict[str, threading.Lock] = {}
        self._mutex = threading.Lock()

    @contextmanager
    def _lease(self, key: str) -> Iterator[Guard | None]:
        with self._mutex:
            lock = self._locks.setdefault(key, threading.Lock())
        if not lock.acquire(blocking=False):
            yield None
            return
        try:
            yield _LocalGuard(_FENCES.next())
        finally:
            lock.release()

    def try_lease(self, key: str) -> AbstractContextManager[Guard | None]:
        return self._lease(key)
