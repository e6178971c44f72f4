"""The three jobs of the pool, as a controller-runtime style reconciler would write them.

Each is observe → decide (pure, ``warmpool.pool``) → execute, retried from a fresh observation
when the API server reports a conflict. They are called by the queue's workers under the lease
of their key, and by tests directly; they never decide which key runs where or when.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from warmpool.controller.guard import Guard, Leases, Unguarded
from warmpool.keys import InstanceKey, Key, PoolKey, SessionKey
from warmpool.kube import observe
from warmpool.kube.api import Conflict, Kube
from warmpool.kube.executor import Executor, check_fence
from warmpool.pool import builders
from warmpool.pool import vocabulary as v
from warmpool.pool.actions import Report, SetSessionStatus
from warmpool.pool.builders import PoolSettings
from warmpool.pool.claim import (
    ClaimError,
    ClaimHeld,
    ClaimSkip,
    ClaimTry,
    ClaimWait,
    decide_claim,
    is_free,
    waiting_sessions,
)
from warmpool.pool.decide import HolderIndex, InstanceView, Plan, decide_instance
from warmpool.pool.model import AppDefinition, Invalid, Session
from warmpool.pool.parts import Part

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5


class Deferred(Exception):
    """The job could not take a lease it needs: run it again in `after` seconds."""

    def __init__(self, reason: str, after: float = 0.02) -> None:
        super().__init__(reason)
        self.after = after


@dataclass
class InstanceResult:
    plan: Plan
    writes: int
    attempts: int
    # Claims to offer capacity to: waiting Sessions, when this instance ends up free.
    follow_ups: list[Key] = field(default_factory=list)


def reconcile_instance(
    kube: Kube, key: InstanceKey, guard: Guard, settings: PoolSettings
) -> InstanceResult:
    """Converge instance `key` to its desired state (pool-spec §4), including a release."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        appdef = observe.read_appdef(kube, key.namespace, key.appdef)
        if isinstance(appdef, Invalid):
            # Bad input never deletes anything: leave the instance exactly as it is.
            return InstanceResult(Plan("invalid", None), 0, attempt)
        sessions = observe.list_sessions(kube, key.namespace, key.appdef)
        if appdef is not None:
            view = observe.observe_instance(kube, appdef, key.id)
        else:
            pool = observe.observe_pool(kube, key.namespace, key.appdef, None, sessions)
            view = pool.get(key.id, InstanceView(key.id, {}))
        check_fence(view, guard)
        template = observe.proxy_template(kube, key.namespace) if appdef is not None else None
        plan = decide_instance(view, key.appdef, appdef, sessions, proxy_template=template,
                               settings=settings)
        try:
            writes = Executor(kube, key.namespace, guard).apply(plan.actions)
        except Conflict as exc:
            log.info("instance %s: conflict (%s), observing again", key, exc)
            continue
        follow_ups: list[Key] = []
        if plan.state in ("free", "outdated") and appdef is not None:
            follow_ups = [SessionKey(key.namespace, s.name)
                          for s in waiting_sessions({}, HolderIndex(key.appdef, sessions))
                          if s.instance_id is None]
        return InstanceResult(plan, writes, attempt, follow_ups)
    raise Conflict(f"instance {key}: still conflicting after {MAX_ATTEMPTS} attempts")


@dataclass
class ClaimResult:
    outcome: str  # "claimed" | "held" | "waiting" | "error" | "skipped" | "gone"
    instance_id: int | None = None
    message: str = ""
    # The Session's metadata.creationTimestamp, for "Session created -> HANDLED" latency.
    session_created: str = ""
    appdef: str = ""


def _set_status(kube: Kube, session: Session, status: str, message: str) -> None:
    """Write a Session's status only when it changes: a waiting Session must not churn."""
    if session.status == status and session.message == message:
        return
    Executor(kube, session.namespace, Unguarded()).apply(
        [SetSessionStatus(session.name, {"operatorStatus": status, "operatorMessage": message})]
    )


def _deciding_write(
    kube: Kube, appdef: AppDefinition, k: int, session: Session, sessions: list[Session],
    guard: Guard,
) -> bool:
    """Under k's lease: put the Session's reference on k's external Service if k is still free.

    The write carries the Service's resourceVersion, so if anything touched the Service since we
    read it (another claim, a release, a person) the server refuses it and we try the next id.
    """
    view = observe.observe_instance(kube, appdef, k)
    if not is_free(view, appdef, HolderIndex(appdef.name, sessions)):
        return False
    check_fence(view, guard)
    ext = view.get(Part.EXTERNAL_SERVICE)
    assert ext is not None
    meta = ext["metadata"]
    owners = [*meta.get("ownerReferences", []), session.owner_reference()]
    patch = {"metadata": {"ownerReferences": owners,
                          "labels": builders.session_labels(appdef, session),
                          "annotations": {v.ANNOTATION_FENCE: str(guard.fence)}}}
    try:
        kube.merge_patch("v1", "Service", appdef.namespace, meta["name"], patch,
                         resource_version=meta["resourceVersion"])
    except Conflict:
        return False
    log.info("Session %s claimed instance %s of %s", session.name, k, appdef.name)
    return True


def claim_session(
    kube: Kube, key: SessionKey, leases: Leases, settings: PoolSettings
) -> ClaimResult:
    """Give Session `key` the lowest free instance, or say why it waits or fails."""
    for _ in range(MAX_ATTEMPTS):
        session = observe.read_session(kube, key.namespace, key.session)
        if session is None:
            return ClaimResult("gone")
        appdef = (observe.read_appdef(kube, key.namespace, session.appdef)
                  if session.appdef else None)
        sessions = observe.list_sessions(kube, key.namespace, session.appdef)
        pool = observe.observe_pool(kube, key.namespace, session.appdef,
                                    appdef if isinstance(appdef, AppDefinition) else None,
                                    sessions)
        decision = decide_claim(session, appdef, pool, sessions)
        match decision:
            case ClaimSkip(reason=reason):
                return ClaimResult("skipped", message=reason)
            case ClaimError(message=message):
                if session.status != v.STATUS_ERROR:
                    _set_status(kube, session, v.STATUS_ERROR, message)
                    Executor(kube, key.namespace, Unguarded()).apply([Report(
                        "InvalidSession", f"Session {session.name}: {message}",
                        regarding={"kind": v.SESSION_KIND, "name": session.name,
                                   "apiVersion": v.SESSION_API_VERSION})])
                return ClaimResult("error", message=message, appdef=session.appdef)
            case ClaimWait(message=message):
                _set_status(kube, session, v.STATUS_HANDLING, message)
                return ClaimResult("waiting", message=message, appdef=session.appdef)
            case ClaimHeld(instance_id=k):
                with leases.try_lease(str(InstanceKey(key.namespace, session.appdef, k))) as g:
                    if g is None:
                        raise Deferred(f"instance {k} is busy")
                    reconcile_instance(kube, InstanceKey(key.namespace, session.appdef, k), g,
                                       settings)
                return ClaimResult("held", k, session_created=session.created,
                                   appdef=session.appdef)
            case ClaimTry(candidates=candidates):
                assert isinstance(appdef, AppDefinition)
                busy = False
                for i, k in enumerate(candidates):
                    ikey = InstanceKey(key.namespace, appdef.name, k)
                    with leases.try_lease(str(ikey)) as g:
                        if g is None and i == 0:
                            # Our target is being reconciled (or claimed): wait for it rather
                            # than take a higher id than ours.
                            raise Deferred(f"instance {k} is busy")
                        if g is None:
                            busy = True
                            continue
                        if _deciding_write(kube, appdef, k, session, sessions, g):
                            reconcile_instance(kube, ikey, g, settings)
                            return ClaimResult("claimed", k, session_created=session.created,
                                               appdef=session.appdef)
                if busy:
                    raise Deferred("every free instance was busy")
                # Every candidate was taken under our feet: look again.
    raise Deferred("the pool kept changing under the claim", after=0.2)


def resync_pool(kube: Kube, key: PoolKey) -> list[Key]:
    """Every key of one pool: each id that exists, is held or should exist; each waiting claim."""
    appdef = observe.read_appdef(kube, key.namespace, key.appdef)
    if isinstance(appdef, Invalid):
        Executor(kube, key.namespace, Unguarded()).apply([Report(
            "InvalidAppDefinition", f"AppDefinition {key.appdef} is left as it is: "
            f"{appdef.message}",
            regarding={"kind": v.APPDEF_KIND, "name": key.appdef,
                       "apiVersion": v.APPDEF_API_VERSION})])
        return []
    sessions = observe.list_sessions(kube, key.namespace, key.appdef)
    pool = observe.observe_pool(kube, key.namespace, key.appdef,
                                appdef if isinstance(appdef, AppDefinition) else None, sessions)
    ids = set(pool) | {s.instance_id for s in sessions if s.instance_id}
    if appdef is not None:
        ids |= set(range(1, appdef.min_instances + 1))
    keys: list[Key] = [InstanceKey(key.namespace, key.appdef, k) for k in sorted(ids)]
    keys += [SessionKey(key.namespace, s.name) for s in sessions
             if s.live and s.instance_id is None and s.status != v.STATUS_ERROR]
    return keys
