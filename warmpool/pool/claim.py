"""Which instance a Session should get, or why it waits or fails. Pure, like ``decide``.

Fairness is decided here rather than by queue order: a Session may take a free instance only if
fewer Sessions older than it are waiting than there are free instances. Claim jobs may run in
any order on any worker; the oldest waiting Sessions are still the ones served.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from enum import StrEnum
from operator import attrgetter

from warmpool.pool import vocabulary as v
from warmpool.pool.emails import same_user
from warmpool.pool.instances import (
    HolderIndex,
    InstanceView,
    is_session_ref,
    refs,
    release_markers,
)
from warmpool.pool.model import AppDefinition, Invalid, Session, session_error
from warmpool.pool.parts import Part
from warmpool.pool.routes import ROUTE_MISSING


@dataclass(frozen=True, slots=True)
class ClaimError:
    """The Session can never be served as it is: status ERROR with this message."""

    message: str
    #: status.error where Theia Cloud writes one: "<code>:<reason>".
    code: str = ""


class WaitReason(StrEnum):
    """Why a Session waits for an instance. The values are the metric's label vocabulary
    (`warmpool_claims_waited_total{limit}`): never rename one."""

    #: Burst at its cap: every instance the AppDefinition may have is taken or starting.
    MAX_INSTANCES = "maxInstances"
    #: Burst off: every prewarmed instance is taken or starting.
    MIN_INSTANCES = "minInstances"
    #: Anything else: an invalid AppDefinition, a missing or invalid shared route.
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class ClaimWait:
    """No instance for now: status HANDLING with this message; re-offered when one frees.
    `reason`: why, as the metrics read it (never the message's text). `behind`: where some
    instance is free but older Sessions come first, who and which (`queue_note`), for the
    log only: it changes with every claim around it, so it never goes into the status."""

    message: str
    reason: WaitReason = WaitReason.OTHER
    behind: str = ""


@dataclass(frozen=True, slots=True)
class ClaimHeld:
    """The Session already holds this instance (perhaps half-claimed): reconcile it."""

    instance_id: int


@dataclass(frozen=True, slots=True)
class ClaimTry:
    """Try these free ids in order; the first deciding write that succeeds wins.

    The first is this Session's own target: if its lease is busy the claim waits for it
    (milliseconds) rather than taking a higher id; the rest are fallbacks once it is taken.
    """

    candidates: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ClaimBurst:
    """No free instance within the target: make instance `instance_id` (above it, below
    maxInstances, with no object) for this Session. The deciding write is the creation of
    its external Service with the Session's reference (refused if the name exists)."""

    instance_id: int


@dataclass(frozen=True, slots=True)
class ClaimSkip:
    """Nothing to do (being deleted, or already in ERROR)."""

    reason: str


ClaimDecision = ClaimError | ClaimWait | ClaimHeld | ClaimTry | ClaimBurst | ClaimSkip


@dataclass(frozen=True, slots=True)
class PoolFacts:
    """What a claim must know of the whole pool, without looking at each instance's objects.

    A worker's cache keeps these as indexes (`ClusterCache`), so a claim costs the same in a
    pool of ten instances as in one of thousands; `pool_facts` derives them from views, for
    readers that read the objects anyway and for tests.
    """

    #: Ids of the instances with any object.
    existing: frozenset[int]
    #: Ids whose five objects all exist and carry no trace of a holder (`holder_trace`).
    clean: frozenset[int]
    #: Uids of the Sessions an external Service of the pool references (deciding writes made).
    referenced: frozenset[str]
    #: Ids whose external Service references a Session: claimed (or being released).
    held: frozenset[int] = frozenset()
    #: Among the free ids, those whose pod is Ready (`warmpool.pool.pods.warmth`); None when
    #: the reader does not know the pods (every free instance then counts as warm).
    warm: frozenset[int] | None = None
    #: Among the free ids, those whose pod cannot start (image pull error, crash loop).
    failing: frozenset[int] = frozenset()


def pool_facts(instances: Mapping[int, InstanceView]) -> PoolFacts:
    return PoolFacts(
        existing=frozenset(k for k, inst in instances.items() if inst.existing()),
        clean=frozenset(k for k, inst in instances.items()
                        if inst.complete and not release_markers(inst)),
        referenced=frozenset(str(r.get("uid")) for inst in instances.values()
                             for r in refs(inst.get(Part.EXTERNAL_SERVICE))
                             if is_session_ref(r)),
        held=frozenset(k for k, inst in instances.items()
                       if any(is_session_ref(r) for r in refs(inst.get(Part.EXTERNAL_SERVICE)))),
    )


def held_instance(
    session: Session, instances: Mapping[int, InstanceView], index: HolderIndex
) -> int | None:
    """The id `session` holds, by the same rule the instance reconcile uses, or None.
    `instances` must include those it is annotated with and whose Service references it."""
    for k, inst in sorted(instances.items()):
        found = index.of(inst)
        if found and found[0].uid == session.uid:
            return k
    return None


def is_free(inst: InstanceView, appdef: AppDefinition, index: HolderIndex) -> bool:
    """Claimable: within the pool, all five objects there, no holder and no trace of one."""
    return (
        inst.id <= appdef.min_instances
        and inst.complete
        and not index.of(inst)
        and not release_markers(inst)
    )


def free_ids(appdef: AppDefinition, facts: PoolFacts) -> list[int]:
    """The ids `is_free` accepts, lowest first: a clean instance's Service references no one,
    so it has no holder."""
    return sorted(k for k in facts.clean if k <= appdef.min_instances)


def is_warm(k: int, facts: PoolFacts) -> bool:
    """Whether free instance k's pod is Ready (unknown pods count as Ready)."""
    return facts.warm is None or k in facts.warm


def claimable_ids(appdef: AppDefinition, facts: PoolFacts) -> list[int]:
    """The free ids a claim may take, in the order claims take them: every warm one (its
    pod Ready: the user waits for nothing), lowest first, then the starting ones (a pod
    being made or reset: the user waits for it to start), lowest first. A Session falls
    back to a starting instance only when the warm ones are all some older Session's
    target, so the instance just released, whose pod is being reset, is never taken while a
    warm one is free for it. Instances whose pods cannot start are never handed out."""
    free = free_ids(appdef, facts)
    warm = [k for k in free if is_warm(k, facts)]
    return warm + [k for k in free if not is_warm(k, facts) and k not in facts.failing]


def coming_ids(appdef: AppDefinition, facts: PoolFacts) -> list[int]:
    """Ids within the target that are neither free nor held: being made, replaced or
    released. They will be free in moments, so a burst does not make instances for the
    Sessions they will serve (a Session that comes just after its pool waits for it)."""
    free = set(free_ids(appdef, facts))
    return [k for k in range(1, appdef.min_instances + 1)
            if k not in free and k not in facts.held]


def burst_ids(appdef: AppDefinition, facts: PoolFacts) -> list[int]:
    """Ids above the target and up to maxInstances that no object uses, lowest first: where
    a burst may make an instance (an id still being retired is not one of them)."""
    return [k for k in range(appdef.min_instances + 1, appdef.max_instances + 1)
            if k not in facts.existing]


def capacity(appdef: AppDefinition, facts: PoolFacts, burst: bool) -> int:
    """How many waiting Sessions can be served now: free instances, and with `burst` the
    instances that may still be made (past those the coming ones will serve)."""
    free = len(claimable_ids(appdef, facts))
    if not burst:
        return free
    return free + len(coming_ids(appdef, facts)) + len(burst_ids(appdef, facts))


def waiting_sessions(facts: PoolFacts, index: HolderIndex) -> list[Session]:
    """Live, valid Sessions of the pool that hold nothing yet, oldest first.

    A Session holds something when an external Service references it (`HolderIndex.of`);
    its annotation does not count. One the Java operator started lazily waits for nothing.
    A worker's cache hands the Sessions over in this order already (`ClusterCache.
    sessions_of` keeps each AppDefinition's sorted as they change), so the sort is a
    linear pass there; other readers' lists are sorted here.
    """
    return sorted(
        (s for s in index.live.values()
         if s.uid not in facts.referenced and not s.started_lazily
         and s.status != v.STATUS_ERROR and session_error(s) is None),
        key=_CLAIM_ORDER,
    )


#: The waiting order, (creationTimestamp, name), read without a Python call per Session.
_CLAIM_ORDER = attrgetter("created", "name")


MAX_SESSIONS_MESSAGE = "Max sessions reached."
NO_SESSIONS_ERROR = "554:No sessions allowed for this user."
MORE_SESSIONS_ERROR = "553:No more sessions allowed for this user, you reached your limit."


def claim_order(session: Session) -> tuple[str, str]:
    """The total order of the sessions-per-user limit: creationTimestamp, then uid.

    Two Sessions of one user created in the same second have equal timestamps (the API
    server keeps seconds); ordered by name as well, each could see the other as the younger
    when names differ only by what a second claim renamed, and both claim. A uid is unique
    and never changes, so every worker, whichever Session's claim it runs, puts the two in
    the same order. creationTimestamp is the API server's RFC 3339 text in one fixed form
    (``YYYY-MM-DDTHH:MM:SSZ``), so comparing the strings compares the instants."""
    return (session.created, session.uid)


@dataclass(frozen=True, slots=True)
class UserRivals:
    """The Sessions that count against `session` under sessionsPerUser, and why.

    `older`: the same user's (`emails.user_key`) live Sessions not in ERROR that come before
    it in `claim_order`. `holding`: those after it that already hold an instance: a
    younger Session served first (its claim ran before the older one was visible to it)
    is not taken back, so the older one is the one refused, and the limit still holds."""

    older: tuple[str, ...]
    holding: tuple[str, ...]

    @property
    def count(self) -> int:
        return len(self.older) + len(self.holding)


def user_rivals(
    session: Session, user_sessions: Sequence[Session], holding: Set[str] = frozenset()
) -> UserRivals:
    """`UserRivals` of `session` among `user_sessions` (any AppDefinition); `holding`: the
    uids of Sessions known to hold an instance (an external Service references them)."""
    mine = claim_order(session)
    counted = [s for s in user_sessions
               if s.uid != session.uid and same_user(s.user, session.user) and s.live
               and s.status != v.STATUS_ERROR]
    return UserRivals(
        older=tuple(s.name for s in counted if claim_order(s) < mine),
        holding=tuple(s.name for s in counted if claim_order(s) > mine and s.uid in holding))


def younger_rivals(session: Session, user_sessions: Sequence[Session]) -> list[Session]:
    """The same user's live Sessions not in ERROR after `session` in `claim_order`: the ones
    whose holdings `user_rivals` needs to know (usually none, so nothing is asked)."""
    mine = claim_order(session)
    return [s for s in user_sessions
            if s.uid != session.uid and same_user(s.user, session.user) and s.live
            and s.status != v.STATUS_ERROR and claim_order(s) > mine]


def over_user_limit(
    session: Session, user_sessions: Sequence[Session], limit: int | None,
    holding: Set[str] = frozenset(),
) -> ClaimError | None:
    """session-lifecycle §6: Theia Cloud's `sessionsPerUser`, with its exact strings.

    None or negative: no limit. The count is the user's Sessions of any AppDefinition that
    are neither being deleted nor in ERROR (so a failed Session cannot lock its user out),
    this one included, and only those before it in `claim_order` or already holding an
    instance (`UserRivals`): of two Sessions made at once under a limit of one, the older is
    served and the younger refused, whichever claim runs first. Users are compared as
    oauth2-proxy compares them (`emails.user_key`): ``U@X.IO`` and ``u@x.io`` are one user.
    """
    if limit is None or limit < 0:
        return None
    if limit == 0:
        return ClaimError(MAX_SESSIONS_MESSAGE, NO_SESSIONS_ERROR)
    if user_rivals(session, user_sessions, holding).count + 1 > limit:
        return ClaimError(MAX_SESSIONS_MESSAGE, MORE_SESSIONS_ERROR)
    return None


def needs_user_recheck(decision: ClaimDecision, limit: int | None) -> bool:
    """Whether a claim must ask the server for its user's Sessions before its deciding write.

    Only a decision to write (a free instance to try, or one to make) under a positive limit:
    the cache it was decided on may lag, and miss an older Session of the user (or one
    served since), and nothing on the server refuses the second deciding write. A Session
    that waits or is refused writes nothing that holds an instance, so it asks nothing."""
    return (limit is not None and limit > 0
            and isinstance(decision, ClaimTry | ClaimBurst))


def decide_claim(
    session: Session,
    appdef: AppDefinition | Invalid | None,
    instances: Mapping[int, InstanceView],
    sessions: Sequence[Session],
    facts: PoolFacts | None = None,
    *,
    user_sessions: Sequence[Session] = (),
    sessions_per_user: int | None = None,
    holding: Set[str] = frozenset(),
    routable: bool = True,
    unroutable: str = ROUTE_MISSING,
    burst: bool = False,
) -> ClaimDecision:
    """`instances`: the pool's instances, or, with `facts` (the whole pool's), at least the
    ones `session` may hold (annotated with it, or whose Service references it).
    `user_sessions`: the user's Sessions of the namespace, when `sessions_per_user` is set;
    `holding`: the uids among them known to hold an instance (`over_user_limit`).
    `routable`: False while routes are in use and the AppDefinition's shared route does not
    exist: nothing is claimed then (session-lifecycle §1, Ours), the Session waits with Java's
    message, and the route's creation queues the claim again. `burst`: with no free
    instance, make one above the target, up to maxInstances (session-lifecycle §6, Ours)."""
    if session.deleting:
        return ClaimSkip("Session is being deleted")
    if (error := session_error(session)) is not None:
        return ClaimError(error)
    # A Session that holds an instance keeps it and its status, whatever has happened to its
    # AppDefinition since (turned invalid, being deleted, gone): its instance is reconciled.
    index = HolderIndex(session.appdef, sessions)
    if (k := held_instance(session, instances, index)) is not None:
        return ClaimHeld(k)
    if session.started_lazily:
        return ClaimSkip("started lazily by the Java operator: it runs on its own Deployment")
    if appdef is None:
        return ClaimError(f"AppDefinition {session.appdef!r} not found in namespace "
                          f"{session.namespace!r}")
    if isinstance(appdef, Invalid):
        return ClaimWait(f"AppDefinition {session.appdef!r} is invalid ({appdef.message}); "
                         "waiting until it is fixed")
    if appdef.deleting:
        return ClaimError(f"AppDefinition {appdef.name!r} is being deleted")
    if session.status == v.STATUS_ERROR:
        return ClaimSkip("Session is in ERROR")
    # Before a claim, never after: a Session that holds an instance is not limited.
    if (limited := over_user_limit(session, user_sessions, sessions_per_user,
                                      holding)) is not None:
        return limited
    if not routable:
        return ClaimWait(unroutable)
    facts = facts or pool_facts(instances)
    free = claimable_ids(appdef, facts)
    queue = waiting_sessions(facts, index)
    position = next((i for i, s in enumerate(queue) if s.uid == session.uid), len(queue))
    if position < len(free):
        # The r-th oldest waiting Session targets the r-th free id in claim order (warm
        # ones first, `claimable_ids`): the oldest gets the lowest warm one, and claims
        # running at once do not all collide on the same instance. The others follow, in
        # case the target is taken under our feet.
        target = free[position]
        return ClaimTry((target, *(k for k in free if k != target)))
    coming = coming_ids(appdef, facts)
    behind = queue_note(queue[:position], free, coming) if free else ""
    if not burst:
        return ClaimWait(_waiting_message(appdef, facts), WaitReason.MIN_INSTANCES, behind)
    # The same fairness past the free ones: the next ones wait for the instances about to be
    # free; the r-th of the rest makes the r-th spare id, so claims running at once do not
    # collide, and ids never pass maxInstances.
    if position < len(free) + len(coming):
        return ClaimWait(_waiting_message(appdef, facts), WaitReason.MIN_INSTANCES, behind)
    spare = burst_ids(appdef, facts)
    if position - len(free) - len(coming) < len(spare):
        return ClaimBurst(spare[position - len(free) - len(coming)])
    return ClaimWait(f"Waiting for a free instance of {appdef.name}: all "
                     f"{appdef.max_instances} instances it may have (maxInstances) are taken "
                     "or starting", WaitReason.MAX_INSTANCES, behind)


def queue_note(
    ahead: Sequence[Session], free: Sequence[int], coming: Sequence[int], shown: int = 5,
) -> str:
    """Why a Session waits while an instance is free: the older waiting Sessions it reads as
    ahead of it (each has a free, coming or spare id first), by name, never by user."""
    names = ", ".join(s.name for s in ahead[:shown]) + (", ..." if len(ahead) > shown else "")
    return (f"behind {len(ahead)} older waiting Sessions ({names}); free {list(free)}, "
            f"coming {list(coming)}")


def _waiting_message(appdef: AppDefinition, facts: PoolFacts) -> str:
    """Why a Session waits within the target: every instance taken or starting, or (said
    apart, so a user is not left guessing) some whose pods cannot start."""
    failing = len(facts.failing & set(free_ids(appdef, facts)))
    if failing:
        return (f"Waiting for a free instance of {appdef.name} ({failing} of its "
                f"{appdef.min_instances} prewarmed instances cannot start their pod; the "
                "others are taken or starting)")
    return (f"Waiting for a free instance of {appdef.name} "
            f"(all {appdef.min_instances} prewarmed instances are taken or starting)")
