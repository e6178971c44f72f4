"""The lock a guarded write runs under, as the executor sees it.

The executor stamps every guarded write with the lease's fence and checks the lease before it
writes; it needs no more than this protocol, whatever implements the lock: the Redis keyed
queue's lease (``ensure_held`` checks it has not expired, ``fence`` grows with every
acquisition, ``lift_fence`` raises the counter past a fence seen on an object), or the
in-process leases of ``warmpool.controller.guard``. It lives here, with its consumer, so that
the Kubernetes layer does not reach up into the controller for it.
"""

from __future__ import annotations

from typing import Protocol


class Guard(Protocol):
    fence: int

    def ensure_held(self) -> None:
        """Raise (the lease implementation's LeaseLost) if the lease is no longer this job's."""

    def lift_fence(self, seen: int) -> None:
        """An object carries fence `seen`, above ours: make every later acquisition's fence
        exceed it, so the next holder is not refused for what earlier holders wrote."""
