"""Hooks for metrics: the queue reports what happens, the metrics package decides what to
count. Keys are passed for logging and tracing; do not use them as metric labels."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class QueueObserver(Protocol):
    def on_add(self, key: str, result: str) -> None:
        """result: enqueued | deduplicated | rerun | delayed | parked | own."""

    def on_start(self, key: str, queue_seconds: float | None) -> None:
        """A job took the key's lease; queue_seconds since its first add (None if unknown)."""

    def on_skip(self, key: str, reason: str) -> None:
        """A delivered message did not run: a `scripts.Skip` (a str), busy (another holder) |
        stale (already done) | own (every trigger was a version the key's own last run
        wrote)."""

    def on_done(self, key: str, result: str, work_seconds: float) -> None:
        """result: a `scripts.DoneOutcome` (a str), success | retry | dead | lost | released."""

    def on_retry(self, key: str, delay_seconds: float, failures: int) -> None: ...

    def on_dead_letter(self, key: str, error: str) -> None: ...

    def on_lease_lost(self, key: str) -> None:
        """A held lease was found taken or expired (renewal failed or release refused)."""

    def on_contention(self, key: str, holder: str) -> None:
        """try_lease found the key held by someone else."""

    def on_recovered(self, key: str, result: str) -> None:
        """A crashed holder's key was taken back by maintenance: recovered | dead."""

    def on_redis_lost(self, previous: str | None, current: str | None) -> None:
        """The Redis epoch this process knew is missing (`current` None) or replaced: Redis
        lost its data (see `warmpool.queue.epoch`)."""


class NullObserver:
    """No-op base: subclass and override what you count."""

    def on_add(self, key: str, result: str) -> None:
        pass

    def on_start(self, key: str, queue_seconds: float | None) -> None:
        pass

    def on_skip(self, key: str, reason: str) -> None:
        pass

    def on_done(self, key: str, result: str, work_seconds: float) -> None:
        pass

    def on_retry(self, key: str, delay_seconds: float, failures: int) -> None:
        pass

    def on_dead_letter(self, key: str, error: str) -> None:
        pass

    def on_lease_lost(self, key: str) -> None:
        pass

    def on_contention(self, key: str, holder: str) -> None:
        pass

    def on_recovered(self, key: str, result: str) -> None:
        pass

    def on_redis_lost(self, previous: str | None, current: str | None) -> None:
        pass


_default: QueueObserver = NullObserver()


def set_observer(observer: QueueObserver) -> None:
    """Install the process-wide default observer (what queues and workers built without an
    explicit one use)."""
    global _default
    _default = observer


def get_observer() -> QueueObserver:
    return _default
