"""What every job returns: one `Result`, as controller-runtime's `Reconcile` returns one.

The three jobs (an instance's reconcile, a Session's claim, a pool's resync) used to return
three different things, and "run me again later" was an exception. Now each returns a
`Result`, and the worker's one run loop (`workers/handlers.py`) does the same with every one,
whichever job made it: it records the guarded writes with the keys they were made under, adds
the follow-up keys, puts the key back when the result asks to run again, and hands the result
to the one metrics hook. "Run again" is data, not control flow: a job that cannot take a lease
it needs returns `Result.deferred(...)` from wherever it is, and its `with` blocks give back
what it holds on the way out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from warmpool.keys import InstanceKey, Key
from warmpool.pool.decide import Plan

#: (field, version) pairs of guarded writes, as the queue's own-write tokens spell them.
Writes = list[tuple[str, str]]
#: A follow-up key and the versions its job must see before it decides (None: none named,
#: the job reconciles fully, as for a key a resync adds).
FollowUp = tuple[Key, dict[str, str] | None]


class Outcome(StrEnum):
    """How a job ended. The values are metric and log vocabulary: never rename one."""

    #: An instance converged to its plan (which may have been empty).
    RECONCILED = "reconciled"
    #: Bad input left as it is, with a clear message: the AppDefinition is invalid (instance
    #: and pool jobs), or the Session was set to ERROR (a claim).
    REFUSED = "refused"
    #: A Session got an instance (`Result.start` says whether prewarmed or made for it).
    CLAIMED = "claimed"
    #: A Session already held its instance; the instance was reconciled for it.
    HELD = "held"
    #: No instance for the Session now (`Result.message` says why); a release or a new
    #: instance wakes it.
    WAITING = "waiting"
    #: Nothing to do for the Session (already being served elsewhere, or not ours).
    SKIPPED = "skipped"
    #: A deleted Session's instances were released from its own key.
    RELEASED = "released"
    #: A deleted Session held nothing: nothing to release.
    GONE = "gone"
    #: A pool's resync listed the keys that have work (its follow-ups).
    RESYNCED = "resynced"
    #: A lease the job needs is busy: it runs again after its backoff (`requeue`).
    DEFERRED = "deferred"
    #: The worker's cache has not yet seen the versions that caused the job: nothing was
    #: decided; it runs again shortly (`requeue_after`), here or on a worker whose watches
    #: are not behind.
    BEHIND = "behind"


class Start(StrEnum):
    """How a claimed instance came to be: prewarmed, or made for the claim (burst)."""

    WARM = "warm"
    COLD = "cold"


@dataclass
class Result:
    """One job's result.

    `requeue`: run the key again after its backoff (client-go's rate limiter: a few
    milliseconds, doubling while it keeps deferring), no sooner than `requeue_after`;
    `requeue_after` alone: run it again after exactly that many seconds. Either way the key
    keeps the versions it was triggered by. `plan`, `instance`, `fence`: the instance this
    job reconciled (its own key's, or one a claim or release reconciled under that
    instance's lease, whose fence is then `fence`), for the pool's records and metrics.
    """

    outcome: Outcome
    follow_ups: list[FollowUp] = field(default_factory=list)
    requeue: bool = False
    requeue_after: float | None = None
    # Guarded writes, by the key whose lease they were made under.
    written: dict[str, Writes] = field(default_factory=dict)
    plan: Plan | None = None
    instance: InstanceKey | None = None
    fence: int | None = None
    # Observe-decide-execute rounds the instance took (more than one: a conflict).
    attempts: int = 1
    # Why a Session waits, was refused or skipped, or why the job deferred.
    message: str = ""
    # A claim's AppDefinition and the Session's creationTimestamp (claim latency).
    appdef: str = ""
    session_created: str = ""
    start: Start | None = None

    @classmethod
    def deferred(cls, reason: str, after: float = 0.0) -> Result:
        """A lease this job needs is busy: run it again after its backoff, no sooner than
        `after` seconds."""
        return cls(Outcome.DEFERRED, requeue=True, requeue_after=after or None, message=reason)

    @property
    def instance_id(self) -> int | None:
        return self.instance.id if self.instance is not None else None

    def written_under(self, key: Key | str) -> Writes:
        """The guarded writes made under `key`'s lease."""
        return self.written.get(str(key), [])
