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
from warmpool.pool.claim import WaitReason
from warmpool.pool.decide import Plan
from warmpool.pool.health import PoolHealth

#: (field, version) pairs of guarded writes, as the queue's own-write tokens spell them.
Writes = list[tuple[str, str]]
#: A follow-up key and the versions its job must see before it decides (None: none named,
#: the job reconciles fully, as for a key a resync adds).
FollowUp = tuple[Key, dict[str, str] | None]
#: A key to run no sooner than this many seconds from now (a Session's deadline the pool's
#: job derives again: the queue's `add_after` only ever moves a waiting key earlier, so
#: naming one that already waits for that time changes nothing).
Later = tuple[Key, float]


class Outcome(StrEnum):
    """How a job ended. The values are metric and log vocabulary: never rename one."""

    #: An instance converged to its plan (which may have been empty).
    RECONCILED = "reconciled"
    #: Bad input left as it is, with a clear message: the AppDefinition is invalid (instance
    #: and pool jobs), or the Session was set to ERROR (a claim).
    REFUSED = "refused"
    #: A Session got an instance (`Record.start` says whether prewarmed or made for it).
    CLAIMED = "claimed"
    #: A Session already held its instance; the instance was reconciled for it.
    HELD = "held"
    #: No instance for the Session now (`Record.wait` says why, `Result.message` in words); a
    #: release or a new instance wakes it.
    WAITING = "waiting"
    #: Nothing to do for the Session (already being served elsewhere, or not ours; or, deleted,
    #: its release is left to the busy instance's own key: `reconcile._release`).
    SKIPPED = "skipped"
    #: A deleted Session's instances were released from its own key.
    RELEASED = "released"
    #: A deleted Session held nothing: nothing to release.
    GONE = "gone"
    #: A pool's resync listed the keys that have work (its follow-ups).
    RESYNCED = "resynced"
    #: A lease the job needs is busy: it runs again after its backoff (the run loop's).
    DEFERRED = "deferred"
    #: A Session past a limit was deleted by its timeout job (`message`: which limit).
    ENDED = "ended"
    #: A timer's job found nothing due: it runs again at its next time (`requeue_after`;
    #: None: never, unless an event queues it).
    SCHEDULED = "scheduled"
    #: A URL probe's attempt ran: the URL was written, the probe gave up, or its next
    #: attempt is due after `requeue_after`.
    PROBED = "probed"
    #: A namespace's ownerless pool objects were swept (`warmpool.controller.orphans`).
    SWEPT = "swept"
    #: The worker's cache has not yet seen the versions that caused the job: nothing was
    #: decided; it runs again shortly (`requeue_after`), here or on a worker whose watches
    #: are not behind.
    BEHIND = "behind"


class Start(StrEnum):
    """How a claimed instance came to be: prewarmed, or made for the claim (burst)."""

    WARM = "warm"
    COLD = "cold"


@dataclass(frozen=True, slots=True)
class Record:
    """What the metrics and the pool's records read of a job (`metrics.worker.JobMetrics`),
    as one typed record: nothing the run loop acts on.

    `plan`, `instance`, `fence`: the instance this job reconciled (its own key's, or one a
    claim or release reconciled under that instance's lease, whose fence is then `fence`);
    `attempts`: its observe-decide-execute rounds (more than one: a conflict); `appdef` and
    `session_created`: a claim's AppDefinition and its Session's creationTimestamp (claim
    latency); `start`: how a claimed instance came to be; `wait`: why a Session waits."""

    plan: Plan | None = None
    instance: InstanceKey | None = None
    fence: int | None = None
    attempts: int = 1
    appdef: str = ""
    session_created: str = ""
    start: Start | None = None
    wait: WaitReason | None = None
    # A resync's count of the pool's pods: warm, starting, failing (warmpool.pool.health).
    health: PoolHealth | None = None

    @property
    def instance_id(self) -> int | None:
        return self.instance.id if self.instance is not None else None


@dataclass
class Result:
    """One job's result: its outcome, the keys it names, when it runs again.

    `requeue_after`: run the key again after that many seconds (the one way a job waits for
    time: a schedule's edge, a Session's deadline, a probe's next attempt), keeping the
    versions it was triggered by. A `DEFERRED` outcome (a lease it needs is busy) is the
    one that backs off instead: the run loop puts the key back after its backoff
    (client-go's rate limiter: a few milliseconds, doubling while it keeps deferring), no
    sooner than `requeue_after` (controller-runtime: an error result is retried with
    backoff; its deprecated `Requeue` flag has no counterpart here). `follow_ups`: keys to
    run now; `later`: keys to run no sooner than a delay; `written`: its guarded writes, by
    the key whose lease they were made under; `message`: why (a wait, a refusal, a
    deferral), for the logs; `record`: what the metrics read.
    """

    outcome: Outcome
    follow_ups: list[FollowUp] = field(default_factory=list)
    requeue_after: float | None = None
    later: list[Later] = field(default_factory=list)
    written: dict[str, Writes] = field(default_factory=dict)
    message: str = ""
    record: Record = field(default_factory=Record)
    # A `DEFERRED` job that waits for one key's lease: it is parked until that lease is
    # released (and runs on its own after the lease TTL at the latest), not backed off.
    parked_on: Key | None = None

    @classmethod
    def deferred(cls, reason: str, after: float = 0.0, *, on: Key | None = None) -> Result:
        """A lease this job needs is busy: run it again after its backoff, no sooner than
        `after` seconds; or, `on` the one key whose lease it waits for, when that lease is
        released (issue #28: a claim parks instead of polling its busy instance)."""
        return cls(Outcome.DEFERRED, requeue_after=after or None, message=reason,
                   parked_on=on)

    def written_under(self, key: Key | str) -> Writes:
        """The guarded writes made under `key`'s lease."""
        return self.written.get(str(key), [])
