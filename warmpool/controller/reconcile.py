"""The three jobs of the pool, as a controller-runtime style reconciler would write them.

Each is observe → decide (pure, ``warmpool.pool``) → execute, and returns one `Result`
(`warmpool.controller.result`): its outcome, the keys to run next, whether to run again.
Reads go through a `Reader`: a worker's watch-fed cache, or the API server itself (the
sequential driver, tools). Either may be behind; every write is guarded so that a decision
on a stale read is refused, and after a refusal (409) the next attempt reads the instance
straight from the API server. The jobs are called by the queue's workers under the lease of
their key, and by tests directly; they never decide which key runs where or when.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from warmpool.controller.guard import Leases, Unguarded
from warmpool.controller.health import may_create_instances, report_pool_health
from warmpool.controller.result import FollowUp, Outcome, Record, Result, Start, Writes
from warmpool.controller.schedules import keep_schedules
from warmpool.controller.timeouts import TimeoutSettings, session_timers
from warmpool.keys import InstanceKey, Key, PoolKey, SessionKey
from warmpool.kube.api import Conflict, Kube, KubeError
from warmpool.kube.executor import Executor, Prober, RouteWriteFailed, check_fence
from warmpool.kube.guard import Guard
from warmpool.kube.observe import holder_uids
from warmpool.kube.pacing import Pacer
from warmpool.kube.reader import Reader
from warmpool.pool import builders, naming, routes
from warmpool.pool import vocabulary as v
from warmpool.pool.actions import (
    Action,
    AnnotateSession,
    Create,
    Delete,
    Report,
    ResetPods,
    SetSessionStatus,
)
from warmpool.pool.builders import PoolSettings
from warmpool.pool.claim import (
    ClaimBurst,
    ClaimDecision,
    ClaimError,
    ClaimHeld,
    ClaimSkip,
    ClaimTry,
    ClaimWait,
    PoolFacts,
    WaitReason,
    capacity,
    decide_claim,
    is_free,
    is_warm,
    needs_user_recheck,
    pool_facts,
    waiting_sessions,
    younger_rivals,
)
from warmpool.pool.decide import (
    Plan,
    State,
    decide_instance,
    rightful_instance,
    unguarded_deletes,
)
from warmpool.pool.emails import user_key
from warmpool.pool.ingress import INGRESS_MISSING
from warmpool.pool.instances import (
    HolderIndex,
    InstanceView,
    holders,
    is_session_ref,
    refs,
    release_markers,
)
from warmpool.pool.meta import (
    labels_of,
    name_of,
    owner_refs,
    resource_version_of,
    uid_of,
)
from warmpool.pool.model import AppDefinition, Invalid, Session
from warmpool.pool.parts import Part
from warmpool.pool.release import decide_release_without_definition
from warmpool.pool.routes import ROUTE_FAILED, ROUTE_MISSING

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5


def _known_holders(
    reader: Reader, namespace: str, view: InstanceView, sessions: list[Session]
) -> list[Session]:
    """`sessions`, plus any live Session the instance references that the read missed.

    A lagging cache may hold an object's reference to a Session it has not seen created
    (the claim was decided elsewhere). Taken as stale, that reference would be stripped and
    the claim undone; so a reference to an unknown Session is checked by name first.
    """
    known: set[str | None] = {s.uid for s in sessions}  # a reference may lack a uid
    found = list(sessions)
    for _, obj in view.existing():
        for ref in refs(obj):
            if not is_session_ref(ref) or ref.get("uid") in known:
                continue
            known.add(ref.get("uid"))
            if reader.session_gone(namespace, str(ref.get("name")), str(ref.get("uid"))):
                continue  # its deletion is what this release is about: no need to ask
            session = reader.session(namespace, str(ref.get("name")), fresh=True)
            if session is not None and session.uid == ref.get("uid"):
                found.append(session)
    return found


def _bulk(plan: Plan) -> bool:
    """Whether a plan is bulk work, the kind that yields to claims: nobody holds or held the
    instance (see `reconcile_instance`'s `pacer`)."""
    return plan.holder is None and not plan.released


def reconcile_instance(
    reader: Reader, kube: Kube, key: InstanceKey, guard: Guard, settings: PoolSettings,
    *, prober: Prober | None = None, pacer: Pacer | None = None,
) -> Result:
    """Converge instance `key` to its desired state (pool-spec §4), including a release.
    `prober`: the process's URL probe, handed the holder's URL to watch (session-lifecycle
    §2); None: no probe is started from here (tools, the sequential driver). `pacer`: where
    the writes of bulk plans (a create, a scale-down's deletes, a generation refresh) wait
    while claims do (`warmpool.kube.pacing`). A plan for a holder (completing or repairing a
    claim) is a claim's work, and a release comes at the claims' own rate and gives an
    instance back: neither is paced.

    The result's follow-ups are the claims to offer capacity to: the oldest waiting
    Sessions, as many as are free now."""
    ns = key.namespace

    def result(plan: Plan, attempts: int, follow_ups: list[FollowUp] | None = None,
               outcome: Outcome = Outcome.RECONCILED) -> Result:
        return Result(outcome, follow_ups or [], written={str(key): written},
                      record=Record(plan=plan, instance=key, attempts=attempts))

    written: Writes = []
    fresh = False
    # Pods this job has reset already. A plan decided again after a conflict (with the garbage
    # collector stripping a deleted Session's references, typically) would reset them again,
    # deleting the clean pod the first reset made room for: under this lease no claim can have
    # come in since, so the pods are still clean.
    reset: set[str] = set()
    appdef_confirmed = False
    report_fences = _fence_reporter(kube, ns)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        plan, appdef, invalid, view, sessions = _observe_and_decide(
            reader, key, guard, settings, report_fences, fresh=fresh,
            appdef_confirmed=appdef_confirmed)
        if (appdef is not None and not view.existing() and plan.holder is None
                and plan.actions and not may_create_instances(reader, appdef)):
            # Too many of the pool's pods cannot start: no new instance until fewer fail or
            # the template changes (warmpool.pool.health); the resync says so on the pool.
            return result(dataclasses.replace(plan, actions=[]), attempt)
        if not fresh and unguarded_deletes(view, plan):
            fresh = True  # nothing on the server would refuse these deletes: read it first
            continue
        if (not appdef_confirmed and appdef is not None
                and any(isinstance(a, Create) and a.part is not Part.ROUTE
                        for a in plan.actions)):
            # Nothing on the server refuses a create whose owner is gone: a cache that has not
            # seen its AppDefinition deleted would rebuild the instance the garbage collector
            # is removing (and a claim could take it, only to see its parts collected under
            # it). The AppDefinition is read from the server once before the first create;
            # if it is gone, deleting, or another one now, the plan is decided again on that.
            # A route is the Session's, not the pool's: the garbage collector takes it with
            # its Session, whatever becomes of the AppDefinition.
            appdef_confirmed = True
            now = reader.appdef(ns, key.appdef, fresh=True)
            if not (isinstance(now, AppDefinition) and now.uid == appdef.uid
                    and not now.deleting):
                continue
        if reset:
            plan = dataclasses.replace(plan, actions=[
                a for a in plan.actions
                if not (isinstance(a, ResetPods) and a.app_selector in reset)])
        executor = Executor(kube, ns, guard, sink=reader, prober=prober,
                            pacer=pacer if _bulk(plan) else None, pods=reader)
        try:
            executor.apply(plan.actions)
        except RouteWriteFailed as exc:
            written += executor.written
            try:
                _route_failed(kube, plan, exc, executor.session_version(plan.holder), reader)
            except Conflict:
                # The holder changed since the plan was decided: its status is not this
                # plan's to write. Read again and decide again (the route write with it).
                log.info("instance %s: the holder changed before its route failure was "
                         "reported, reading it again", key)
                reset |= executor.reset
                fresh = True
                continue
            if not _permanent(exc.status):
                raise  # the job fails and its key is retried with backoff
            return result(plan, attempt)
        except Conflict as exc:
            log.info("instance %s: conflict (%s), reading it again", key, exc)
            written += executor.written
            reset |= executor.reset
            fresh = True
            continue
        written += executor.written
        if invalid is not None:
            # Refused as before (nothing made or removed): the release, if any, is done.
            return result(plan, attempt, outcome=Outcome.REFUSED)
        follow_ups: list[FollowUp] = []
        if appdef is not None and (plan.state in (State.FREE, State.OUTDATED)
                                   or (settings.burst and plan.state is State.RETIRED)):
            # A retirement leaves room for a burst: someone waiting at maxInstances may go.
            follow_ups = _wake_waiting(reader, ns, appdef, sessions, dict(written),
                                       settings.burst)
        return result(plan, attempt, follow_ups)
    raise Conflict(f"instance {key}: still conflicting after {MAX_ATTEMPTS} attempts")


def _observe_and_decide(
    reader: Reader, key: InstanceKey, guard: Guard, settings: PoolSettings,
    report_fences: Callable[[list[Report]], None], *, fresh: bool, appdef_confirmed: bool,
) -> tuple[Plan, AppDefinition | None, Invalid | None, InstanceView, list[Session]]:
    """One attempt of `reconcile_instance`: read the instance (`fresh`: from the server) and
    what decides it, refuse it if a newer holder's fence is on it (`check_fence`), and decide
    its plan. Also returns what was read: the AppDefinition (None if gone or invalid), why it
    is invalid, the instance, the pool's Sessions."""
    ns = key.namespace
    read = reader.appdef(ns, key.appdef, fresh=appdef_confirmed)
    # An invalid AppDefinition: nothing is made or removed until it is fixed, but a
    # release still runs (issue #27): it is decided from the instance's own objects,
    # which are then found by their owner references, as for a deleted AppDefinition.
    invalid = read if isinstance(read, Invalid) else None
    appdef = None if isinstance(read, Invalid) else read
    sessions = reader.sessions(ns, key.appdef)
    view = reader.instance(ns, key.appdef, appdef, key.id, sessions, fresh=fresh)
    if invalid is not None:
        view = _with_own_selector(reader, ns, view)
    if appdef is None and settings.routing:  # invalid or gone: read without routes
        view = _routes_by_service(reader, ns, view, fresh=fresh)
    if fresh:
        for s in holders(view, key.appdef, sessions):
            reader.session(ns, s.name, fresh=True)
        sessions = reader.sessions(ns, key.appdef)
    sessions = _known_holders(reader, ns, view, sessions)
    check_fence(view, guard, report_fences)
    template = reader.proxy_template(ns) if appdef is not None else None
    elsewhere, sessions = _claims_elsewhere(reader, ns, key.appdef, view, sessions,
                                            confirm=True)
    if invalid is not None:
        # Every write of this plan is guarded as any release's is: each patch carries
        # the resourceVersion read (and the lease's fence), route deletes their uid and
        # version, and the pod reset comes after a guarded write (`_guard_reset`); a
        # plan without the external Service in its read is decided again on the
        # server's view first (`unguarded_deletes`, in the caller). A claim meanwhile is
        # impossible anyway: a claim of an invalid AppDefinition is refused.
        plan = decide_release_without_definition(
            view, key.appdef, invalid, sessions, settings=settings,
            held_elsewhere=elsewhere,
            shared_ingress=_invalid_ingress(reader, ns, invalid, settings, fresh=fresh))
    else:
        plan = decide_instance(view, key.appdef, appdef, sessions,
                               proxy_template=template, settings=settings,
                               held_elsewhere=elsewhere,
                               shared_route=_shared_route(reader, appdef, settings,
                                                          fresh=fresh),
                               now_ms=reader.server_now_ms())
    return plan, appdef, invalid, view, sessions


def _with_own_selector(reader: Reader, ns: str, view: InstanceView) -> InstanceView:
    """`view` with its Deployment as the server has it, where a release without the
    AppDefinition may reset its pods: `release.own_facts` reads the Deployment's selector,
    which a worker's cache does not keep (it watches a Deployment's metadata alone, issue
    #28). One GET, only while a holder's trace is on the instance (`release_markers`) of an
    invalid AppDefinition; every other read goes without.

    Safe although the Deployment may now be newer than the rest of the view: the plan's
    writes are guarded as before (a patch of the Deployment carries the version read here),
    and the reset deletes only the pods of the Deployment with the uid read here, after a
    guarded write (`decide._guard_reset`)."""
    deployment = view.get(Part.DEPLOYMENT)
    if deployment is None or "spec" in deployment or not release_markers(view):
        return view
    whole = reader.object(Part.DEPLOYMENT.kind, ns, name_of(deployment), fresh=True)
    return dataclasses.replace(view, objects={**view.objects, Part.DEPLOYMENT: whole})


def _claims_elsewhere(
    reader: Reader, ns: str, appdef_name: str, view: InstanceView, sessions: list[Session],
    *, confirm: bool = False,
) -> tuple[dict[str, frozenset[int]], list[Session]]:
    """For each holder of `view` not annotated with it (a claim in flight, or a double
    claim), the ids of every instance whose external Service references it: what
    `decide_instance` needs to tell a Session's one rightful instance from a double claim.
    Returns them with `sessions`, re-read where they were confirmed.

    `confirm`: a job that will act on it. The ids come from the cache, where they may be
    stale, and nothing on the server would refuse what they decide: the release of a double
    claim is guarded by this instance's own Service, not by the other instance's reference
    it is based on. A cache still showing a reference that has since gone (a double claim
    already settled, say) would make this instance release the Session's only one. So when
    the cached ids would take a holder off this instance, its Session and those ids are read
    from the API server first, and decide alone. (What could still change after that read:
    the other instance's reference, which only that instance's job removes, and only when
    this instance is the rightful one on the same facts; and the Session's annotation,
    which names the instance that serves it.)
    """
    def ids(among: list[Session], fresh: bool) -> dict[str, frozenset[int]]:
        return {s.uid: reader.referencing(ns, appdef_name, s, fresh=fresh)
                for s in holders(view, appdef_name, among) if s.instance_id != view.id}

    elsewhere = ids(sessions, fresh=False)
    doubted = [s for s in holders(view, appdef_name, sessions) if s.uid in elsewhere
               and rightful_instance(s, elsewhere[s.uid], view.id) != view.id]
    if not confirm or not doubted:
        return elsewhere, sessions
    # Each doubted holder as the server has it now: its annotation may name this instance
    # by now; gone (or re-created under its name), it holds nothing.
    now = {s.uid: reader.session(ns, s.name, fresh=True) for s in doubted}
    confirmed: list[Session] = []
    for s in sessions:
        if s.uid not in now:
            confirmed.append(s)
        elif (again := now[s.uid]) is not None and again.uid == s.uid:
            confirmed.append(again)
    return ids(confirmed, fresh=True), confirmed


def _fence_reporter(kube: Kube, namespace: str) -> Callable[[list[Report]], None]:
    """How `check_fence` reports a foreign or far-lifted fence annotation: Warning events
    through the executor's one event path, each message once per job (a job that decides
    again after a conflict reads the same annotation again). Events are not guarded writes:
    a stale one only repeats what the object still shows."""
    sent: set[str] = set()

    def report(reports: list[Report]) -> None:
        new = [r for r in reports if r.message not in sent]
        sent.update(r.message for r in new)
        if new:
            Executor(kube, namespace, Unguarded()).apply(new)

    return report

def _routes_by_service(
    reader: Reader, namespace: str, view: InstanceView, *, fresh: bool
) -> InstanceView:
    """`view` (read without its AppDefinition, invalid or gone, so without routes) with its
    session routes (`Reader.instance_routes`), found by the name its external Service has.
    `fresh`: each read again from the server (a route delete carries its uid and version,
    so a stale one is refused all the same; the fresh read is what the retry decides on)."""
    ext = view.get(Part.EXTERNAL_SERVICE)
    if ext is None:
        return view
    return dataclasses.replace(view, routes=reader.instance_routes(
        namespace, name_of(ext), holder_uids(view), fresh=fresh))


def _invalid_ingress(
    reader: Reader, namespace: str, invalid: Invalid, settings: PoolSettings, *, fresh: bool
) -> dict[str, Any] | None:
    """In Ingress mode, the shared Ingress an invalid AppDefinition's spec.ingressname still
    names (`Invalid.ingress_name`, bounded by `model.ingress_name_of`), as read. Its patch
    carries the resourceVersion read: a stale read is refused, and the retry reads it
    `fresh`."""
    if not settings.ingress or not invalid.ingress_name:
        return None
    return reader.ingress(namespace, invalid.ingress_name, fresh=fresh)


def _permanent(status: int | None) -> bool:
    """A 4xx other than a timeout or throttling: the same write would fail again."""
    return status is not None and 400 <= status < 500 and status not in (408, 429)


def _route_failed(
    kube: Kube, plan: Plan, exc: RouteWriteFailed, session_version: str | None = None,
    reader: Reader | None = None,
) -> None:
    """Tell the holder its route could not be written (session-lifecycle §1, Ours): HANDLING
    while the failure may pass, ERROR (with a Warning) when the server refused the route
    itself. The instance stays claimed until the Session is deleted, as in Java.

    `session_version`: the holder's resourceVersion after the plan's own writes of it (its
    annotation), else the one the plan was decided on: the status write tests it, and a
    Conflict (the Session changed since: a later run made it HANDLED) reaches the caller,
    which reads again and decides again (`_set_status`)."""
    holder = plan.holder
    if holder is None:
        return
    permanent = _permanent(exc.status)
    log.warning("Session %s: its route could not be written (%s)", holder.name, exc)
    _set_status(kube, holder, v.STATUS_ERROR if permanent else v.STATUS_HANDLING,
                ROUTE_FAILED, reader=reader, resource_version=session_version)
    if permanent:
        Executor(kube, holder.namespace, Unguarded()).apply([Report(
            "RouteRefused", f"Session {holder.name}: the API server refused its HTTPRoute "
            f"({exc.status}): {str(exc)[:300]}",
            regarding={"kind": v.SESSION_KIND, "name": holder.name,
                       "apiVersion": v.SESSION_API_VERSION})])


def _shared_route(
    reader: Reader, appdef: AppDefinition | None, settings: PoolSettings, *,
    fresh: bool = False,
) -> dict[str, Any] | None:
    """The HTTPRoute `spec.ingressname` names (session-lifecycle §1: by name, never written),
    where routes are in use; in upstream's mode, the Ingress it names (§4). A stale read is
    harmless: read missing, nothing is claimed or routed until its creation's event queues
    the pool again; read present after a deletion, a route copies the parentRefs it last
    had, which is what a route made a moment earlier would carry too; an Ingress read stale
    makes its patch (resourceVersion-guarded) fail, and the retry reads it `fresh`."""
    if appdef is None or not appdef.ingress_name:
        return None
    if settings.routing:
        return reader.route(appdef.namespace, appdef.ingress_name, fresh=fresh)
    if settings.ingress:
        return reader.ingress(appdef.namespace, appdef.ingress_name, fresh=fresh)
    return None


def _wake_waiting(
    reader: Reader, namespace: str, appdef: AppDefinition, sessions: list[Session],
    triggers: dict[str, str], burst: bool,
) -> list[FollowUp]:
    """Claims for the oldest waiting Sessions, one per free instance (not every waiter), and
    with `burst` one per instance that may still be made.

    Each carries this job's writes as versions to see first, so a worker whose cache has
    not yet seen the instance freed waits for it instead of finding nothing free.
    """
    index = HolderIndex(appdef.name, sessions)
    if not any(s.status != v.STATUS_ERROR and not s.annotations.get(v.ANNOTATION_INSTANCE_ID)
               for s in index.live.values()):
        return []  # every live Session has made its claim: nobody to wake
    facts = reader.pool_facts(namespace, appdef.name, appdef, sessions)
    waiting = waiting_sessions(facts, index)
    room = capacity(appdef, facts, burst)
    return [(SessionKey(namespace, s.name), triggers) for s in waiting[:room]]


def _set_status(
    kube: Kube, session: Session, status: str, message: str, error: str = "", *,
    reader: Reader | None = None, resource_version: str | None = None,
) -> None:
    """Write a Session's status only when it changes: a waiting Session must not churn.
    `error`: status.error as Theia Cloud writes it ("<code>:<reason>"), where it has one.

    Safe on a stale read: the write tests the Session's uid and the resourceVersion the
    decision read (`resource_version`, else the Session's as read), so a claim decided
    before the Session became HANDLED cannot write HANDLING or ERROR over it: it gets a
    Conflict, and its caller reads the Session again and decides again. `reader` hears of the
    write, so the job's next decision is made on the version it left."""
    if session.status == status and session.message == message:
        return
    body = {"operatorStatus": status, "operatorMessage": message}
    if error:
        body["error"] = error
    rv = session.resource_version if resource_version is None else resource_version
    Executor(kube, session.namespace, Unguarded(), sink=reader).apply(
        [SetSessionStatus(session.name, body, uid=session.uid,
                          first=session.status == v.STATUS_NEW, resource_version=rv)])


def _holding(
    reader: Reader, namespace: str, session: Session, user_sessions: list[Session], *,
    on_server: bool,
) -> frozenset[str]:
    """The uids of `session`'s younger rivals under sessionsPerUser that hold an instance
    (`claim.user_rivals`): from the cache's index, or, once the user's Sessions were read
    from the server (`on_server`), from the server's labelled Services (one LIST per younger
    rival, whose answer is that Session's claims; there is usually no younger rival)."""
    held = reader.claimed_on_server if on_server else reader.holdings
    return frozenset(s.uid for s in younger_rivals(session, user_sessions)
                     if held(namespace, s.uid))


def _hold_younger_rivals(
    leases: Leases, held: contextlib.ExitStack, session: Session, user_sessions: list[Session],
) -> str | None:
    """Take the lease of each younger Session of `session`'s user (`claim.younger_rivals`,
    the server's list) into `held`; the name of the first one busy (its claim is running),
    else None."""
    for rival in younger_rivals(session, user_sessions):
        if held.enter_context(leases.try_lease(str(SessionKey(session.namespace,
                                                                rival.name)))) is None:
            return rival.name
    return None


def _disown_annotation(reader: Reader, kube: Kube, session: Session) -> None:
    """Report and remove an `instance-id` annotation the owner references do not back.

    It is not obeyed (pool-spec §4: the deciding write makes a holder), and left in place it
    would point Theia Cloud's other components at someone else's instance. The patch is
    guarded by the Session's resourceVersion: if the Session changed since the read (its own
    claim annotated it meanwhile), the removal is refused and the claim decides again.
    """
    message = (f"Session {session.name} is annotated with instance {session.instance_id}, "
               "which does not hold it (the instance's Service does not reference the "
               "Session): the annotation is removed and the Session claims like any other")
    Executor(kube, session.namespace, Unguarded(), sink=reader).apply([
        AnnotateSession(session.name, {v.ANNOTATION_INSTANCE_ID: None},
                        resource_version=session.resource_version),
        Report("AnnotationIgnored", message,
               regarding={"kind": v.SESSION_KIND, "name": session.name,
                          "apiVersion": v.SESSION_API_VERSION}),
    ])


def _deciding_write(
    reader: Reader, kube: Kube, appdef: AppDefinition, k: int, session: Session,
    sessions: list[Session], guard: Guard, written: Writes,
) -> bool:
    """Under k's lease: put the Session's reference on k's external Service if k is still free.

    Safe on a stale read: the write carries the Service's resourceVersion as read, so if
    anything touched the Service since (another claim, a release, a retirement deleting it
    first, a person) the server refuses it; the Service is then read again and we try the
    next id.
    """
    view = reader.instance(appdef.namespace, appdef.name, appdef, k, sessions)
    if not is_free(view, appdef, HolderIndex(appdef.name, sessions)):
        return False
    check_fence(view, guard, _fence_reporter(kube, appdef.namespace))
    ext = view.get(Part.EXTERNAL_SERVICE)
    assert ext is not None
    owners = [*owner_refs(ext), session.owner_reference()]
    patch = {"metadata": {"ownerReferences": owners,
                          "labels": builders.session_labels(appdef, session),
                          "annotations": {v.ANNOTATION_FENCE: str(guard.fence),
                                          v.ANNOTATION_CLAIMED_FOR: naming.claimed_for(
                                              session.uid, session.user)}}}
    guard.ensure_held()  # as the executor does before every write: a holder past its TTL stops
    try:
        updated = kube.merge_patch("v1", "Service", appdef.namespace, name_of(ext), patch,
                                   resource_version=resource_version_of(ext))
    except (Conflict, KubeError) as exc:
        if isinstance(exc, KubeError) and exc.status != 404:
            raise
        reader.instance(appdef.namespace, appdef.name, appdef, k, sessions, fresh=True)
        return False
    updated.setdefault("kind", "Service")
    reader.wrote(updated)
    written.append((f"Service/{name_of(ext)}", resource_version_of(updated)))
    log.info("Session %s claimed instance %s of %s", session.name, k, appdef.name,
             extra={"session_uid": session.uid})
    return True


def _drop_route(
    reader: Reader, kube: Kube, session: Session, settings: PoolSettings
) -> None:
    """A Session that holds no instance has no route (session-lifecycle §1): delete one it
    still has, which no instance's job leads to any more (its instance gone with its
    AppDefinition and then by hand, the long chaos tier, seed 13; the garbage collector takes
    it only when the Session ends).

    Safe on a stale read: the server is asked first which instances the Session holds (its
    labelled Services), and the delete carries the route's uid and resourceVersion; a route
    another owner holds too is left alone. The route is looked up in the cache only (this
    runs for every waiting Session, whose route does not exist: asking the server each time
    was 1.4 requests per Session served under churn): a route the cache has not seen yet was
    made a moment ago by the job of an instance the Session holds, so there is nothing to
    drop; one left over is dropped by the next of this Session's jobs or the resync's sweep.
    """
    if not settings.routing:
        return
    route = reader.route(session.namespace, routes.route_name(session.uid), ask_on_miss=False)
    if route is None or not routes.only_owned_by_its_session(route):
        return
    if reader.claimed_on_server(session.namespace, session.uid):
        return  # it holds something after all: that instance's job keeps the route
    with contextlib.suppress(Conflict, KubeError):  # changed or gone meanwhile: fine
        Executor(kube, session.namespace, Unguarded(), sink=reader).apply([Delete(
            Part.ROUTE, name_of(route), uid_of(route), resource_version_of(route),
            "its Session holds no instance")])


def _burst_write(
    reader: Reader, kube: Kube, appdef: AppDefinition, k: int, session: Session,
    sessions: list[Session], guard: Guard, settings: PoolSettings, written: Writes,
) -> bool:
    """Under k's lease: make instance k for the Session, its external Service first, created
    with the Session's reference (the burst's deciding write); the instance's reconcile
    then makes the other four for its holder.

    Safe on a stale read: a create is refused (409) if the name exists, so two claims (or a
    claim and anything else) can never both make k's Service; k is above the target, so no
    job but this one (holding k's lease) makes it otherwise. A refusal reads k from the
    server, and the claim decides again.
    """
    ns = appdef.namespace
    if reader.instance(ns, appdef.name, appdef, k, sessions).existing():
        return False  # in use or still being retired: not a spare id after all
    body = builders.build(Part.EXTERNAL_SERVICE, appdef, k, holder=session,
                          proxy_template=None, settings=settings)
    executor = Executor(kube, ns, guard, sink=reader)
    try:
        executor.apply([Create(Part.EXTERNAL_SERVICE, body)])
    except Conflict:
        reader.instance(ns, appdef.name, appdef, k, sessions, fresh=True)
        return False
    written += executor.written
    log.info("Session %s made instance %s of %s (burst)", session.name, k, appdef.name,
             extra={"session_uid": session.uid})
    return True


def _release(
    reader: Reader, kube: Kube, key: SessionKey, session: Session | None, leases: Leases,
    settings: PoolSettings, prober: Prober | None,
) -> Result:
    """A Session deleted (or being deleted): release what it holds, from its own key.

    The release is a reconcile of each instance its uid still holds, under that instance's
    lease, exactly as the instance's own job would run it; it runs here so that a user's
    instance is freed (and the next waiting Session served) from the claims queue, not after
    the bulk work ahead of it in the main one (a 900-instance scale-down). The instance key
    is still queued for it too (the scheduler's release rule): started after this release,
    it is skipped (the deletion is noted as accounted for on it); started before, it did the
    release and this run finds nothing left to do. Safe on a stale read like every instance
    reconcile: a reference the cache still shows but the server no longer has makes a write
    that the server refuses.

    An instance whose lease is busy is left to its own key, without waiting: the scheduler
    queued that key (or, for a Session deleted mid-claim, its pool's, whose resync queues
    every instance that references a Session it does not know) for the same deletion, with
    the deletion as the version its job must see, so a run of it starts after the holder
    is done and releases what this one would have. Parking here instead ran every such
    release twice: the instance's job, on the bulk queue, usually took the lease first, and
    this key's rerun found nothing left (72 of 81 releases in a traced churn, issue #28).
    """
    ns = key.namespace
    uid = session.uid if session is not None else reader.gone_session_uid(ns, key.session)
    if not uid:
        return Result(Outcome.GONE)
    out = Result(Outcome.RELEASED)
    busy: list[int] = []
    for appdef_name, k in reader.holdings(ns, uid):
        ikey = InstanceKey(ns, appdef_name, k)
        with leases.try_lease(str(ikey)) as g:
            if g is None:
                busy.append(k)
                continue
            result = reconcile_instance(reader, kube, ikey, g, settings, prober=prober)
            out.record = Record(plan=result.record.plan, instance=ikey, fence=g.fence,
                                appdef=appdef_name)
        # The Session's deletion is accounted for on the instance too: this run began after
        # the cache had seen it (the claim job's trigger), so the instance key the scheduler
        # queued for the same deletion need not run again for it.
        cause = ((f"{v.SESSION_KIND}/{key.session}#gone", uid) if session is None
                 else (f"{v.SESSION_KIND}/{key.session}", session.resource_version))
        out.written[str(ikey)] = [*result.written_under(ikey), cause]
        out.follow_ups += result.follow_ups
    if out.record.instance is not None:
        return out
    if busy:
        return Result(Outcome.SKIPPED, message=f"instance {', '.join(map(str, busy))} is busy: "
                      "its own key, queued for the same deletion, releases it")
    return Result(Outcome.GONE)


def claim_session(
    reader: Reader, kube: Kube, key: SessionKey, leases: Leases, settings: PoolSettings,
    *, hand_on: bool = True, prober: Prober | None = None, retried: bool = True,
) -> Result:
    """Give Session `key` the lowest free instance, or say why it waits or fails.

    Reads come from `reader` (for a worker, its cache: no request); the requests a claim
    makes are its writes: the deciding write, the instance's reconcile, the Session's
    annotation and status. `hand_on`: name the next waiting Sessions to wake (`follow_ups`);
    a caller that runs every key anyway (the sequential driver) does not need them.
    `retried`: an earlier run of this key failed or died (its writes unknown): the server is
    asked whether the Session already holds an instance before a deciding write.
    """
    with contextlib.ExitStack() as rivals:
        result = _claim(reader, kube, key, leases, settings, rivals, hand_on=hand_on,
                        prober=prober, retried=retried)
    return _own_session_writes(result, key)


def _own_session_writes(result: Result, key: SessionKey) -> Result:
    """The Session's own writes, noted under the claim's key too.

    A claim writes the Session (its annotation, its status) inside the instance's reconcile,
    under the instance's lease, so they were recorded as that key's own writes only. The
    Session's watch event maps to its claim key as well, whose record did not cover it: every
    claim ran twice (issue #28). The versions are this claim's own, decided from what it read,
    so the rule of own writes holds for its key as for the instance's."""
    mine = f"{v.SESSION_KIND}/{key.session}"
    own = str(key)
    for under, writes in list(result.written.items()):
        if under != own:
            session_writes = [(f, rv) for f, rv in writes if f == mine]
            if session_writes:
                result.written.setdefault(own, []).extend(session_writes)
    return result


@dataclasses.dataclass
class _ClaimChecks:
    """What `_claim`'s attempts have asked of the server so far: each question once a claim.

    `confirmed`: the instances its annotation names, and the Session, read from the server.
    `asked_server`: whether the Session already holds an instance, asked of the server.
    `users_on_server`: the user's Sessions as the server had them, once a claim under
    sessionsPerUser was about to write (`needs_user_recheck`): (the user as compared, the
    Sessions). `rivals_held`: the leases of the user's younger Sessions taken."""

    confirmed: bool = False
    asked_server: bool = False
    users_on_server: tuple[str, list[Session]] | None = None
    rivals_held: bool = False


@dataclasses.dataclass(frozen=True)
class _ClaimRead:
    """One attempt's read of a claim, and what `decide_claim` made of it."""

    namespace: str  # the claim key's
    session: Session
    appdef: AppDefinition | Invalid | None
    sessions: list[Session]
    facts: PoolFacts
    own: frozenset[int]  # the instances the Session may already hold
    limit: int | None  # sessionsPerUser
    route_error: str | None  # what is wrong with the shared route, if it is there
    decision: ClaimDecision

    @property
    def pool_appdef(self) -> AppDefinition | None:
        return self.appdef if isinstance(self.appdef, AppDefinition) else None


def _claim(
    reader: Reader, kube: Kube, key: SessionKey, leases: Leases, settings: PoolSettings,
    rivals: contextlib.ExitStack, *, hand_on: bool, prober: Prober | None, retried: bool,
) -> Result:
    """`claim_session`'s attempts. `rivals` holds, until the claim returns, the leases of the
    user's younger Sessions (`_hold_younger_rivals`)."""
    checks = _ClaimChecks()
    for _ in range(MAX_ATTEMPTS):
        session = reader.session(key.namespace, key.session)
        if session is None or session.deleting:
            return _release(reader, kube, key, session, leases, settings, prober)
        read = _read_claim(reader, key.namespace, session, settings, checks.users_on_server)
        if _look_again(reader, kube, read, checks, retried=retried):
            continue
        if needs_user_recheck(read.decision, read.limit) and not checks.rivals_held:
            # Serialized with the claims of the user's younger Sessions: the limit is
            # decided on their holdings, which their claims could change between this read
            # and our deciding write (both would then be served). Their keys' leases are held
            # until this claim returns, so their holdings are read once more, and stay. Only
            # the older waits for the younger (an older Session refuses a younger one without
            # waiting), so two claims never wait for each other.
            checks.rivals_held = True
            users = checks.users_on_server
            claiming = _hold_younger_rivals(leases, rivals, session,
                                            users[1] if users is not None else [])
            if claiming is not None:
                return Result.deferred(f"Session {claiming} of the same user is being claimed")
            continue
        result = _carry_out(reader, kube, key, leases, settings, read, hand_on=hand_on,
                            prober=prober)
        if result is not None:
            return result
    return Result.deferred("the pool kept changing under the claim", after=0.2)


def _read_claim(
    reader: Reader, ns: str, session: Session, settings: PoolSettings,
    users_on_server: tuple[str, list[Session]] | None,
) -> _ClaimRead:
    """Read what a claim of `session` (in namespace `ns`) is decided on, and decide it
    (`decide_claim`)."""
    appdef = reader.appdef(ns, session.appdef) if session.appdef else None
    sessions = reader.sessions(ns, session.appdef)
    if all(s.uid != session.uid for s in sessions):
        sessions = [*sessions, session]  # read directly: the cache has not seen it yet
    pool_appdef = appdef if isinstance(appdef, AppDefinition) else None
    # The whole pool only as the cache's indexes know it; objects only of the instances
    # this Session may already hold.
    facts = reader.pool_facts(ns, session.appdef, pool_appdef, sessions)
    own = reader.referencing(ns, session.appdef, session)
    if session.instance_id is not None:
        own |= {session.instance_id}
    mine = reader.instances(ns, session.appdef, pool_appdef, own, sessions)
    limit = settings.sessions_per_user
    user_sessions: list[Session] = []
    holding: frozenset[str] = frozenset()
    if limit is not None and limit > 0:
        on_server = (users_on_server is not None
                     and users_on_server[0] == user_key(session.user))
        user_sessions = (users_on_server[1] if users_on_server is not None and on_server
                         else reader.user_sessions(ns, session.user))
        holding = _holding(reader, ns, session, user_sessions, on_server=on_server)
    shared = _shared_route(reader, pool_appdef, settings)
    # The shared route's parentRefs and hostnames are copied into the holder's route:
    # bounded by the Gateway API's grammar (routes.shared_route_error) before a claim.
    route_error = (routes.shared_route_error(pool_appdef, shared, settings)
                   if settings.routing and shared is not None and pool_appdef is not None
                   else None)
    unroutable = (routes.invalid_shared_route(pool_appdef, route_error)
                  if route_error is not None and pool_appdef is not None
                  else ROUTE_MISSING if settings.routing else INGRESS_MISSING)
    decision = decide_claim(
        session, appdef, mine, sessions, facts, sessions_per_user=limit,
        user_sessions=user_sessions, holding=holding,
        routable=not (settings.routing or settings.ingress)
        or (shared is not None and route_error is None),
        unroutable=unroutable, burst=settings.burst)
    return _ClaimRead(ns, session, appdef, sessions, facts, own, limit, route_error, decision)


def _look_again(
    reader: Reader, kube: Kube, read: _ClaimRead, checks: _ClaimChecks, *, retried: bool,
) -> bool:
    """Whether the claim must be decided again, on a read more current than `read`: after
    asking the server what a lagging cache may have missed (each question once, `checks`),
    or after removing an instance-id annotation the server does not back."""
    session, decision, ns = read.session, read.decision, read.namespace
    if (session.instance_id is not None and read.pool_appdef is not None
            and isinstance(decision, ClaimTry | ClaimWait)):
        # Annotated with an instance it does not hold. Before calling the annotation
        # wrong, ask the server: a cache behind on the Services may not have seen the
        # deciding write yet.
        if not checks.confirmed:
            checks.confirmed = True
            for k in read.own:
                reader.instance(ns, session.appdef, read.pool_appdef, k, read.sessions,
                                fresh=True)
            reader.session(ns, session.name, fresh=True)
            return True
        # On a 409 the Session changed meanwhile: decide again on what it is now.
        with contextlib.suppress(Conflict):
            _disown_annotation(reader, kube, session)
        return True
    if isinstance(decision, ClaimTry | ClaimBurst) and retried and not checks.asked_server:
        # The read says this Session holds nothing; a cache behind on the Services may
        # have missed its own earlier deciding write (a retry after a lost answer, finding
        # 11), and nothing on the server refuses a second one on another instance. Ask the
        # server once (etcd: the one read that must be current); what it shows is now in
        # the cache, and the claim decides again (the held path). Only after a run that
        # failed or died: a run that returned recorded its writes, and its Session writes
        # (annotation, status) follow its deciding write, so a rerun they cause sees the
        # annotation and confirms it by name (above); anything else costs an etcd scan of
        # the namespace's Services per claim, where it cannot change the answer.
        checks.asked_server = True
        if reader.claimed_on_server(ns, session.uid):
            return True
    users = checks.users_on_server
    if needs_user_recheck(decision, read.limit) and (
            users is None or users[0] != user_key(session.user)):
        # About to make a deciding write under sessionsPerUser, on a read that may lag:
        # an older Session of the user it has not seen would let both claim, and nothing
        # on the server refuses the second deciding write. So the user's Sessions are
        # confirmed as the server had them at this Session's version (from a cache whose
        # Session watch is past it, else one LIST of the namespace's Sessions), the
        # younger ones' holdings are asked of the server, and the claim decides again.
        # Only where a limit is set; a waiting or refused Session asks nothing.
        checks.users_on_server = (user_key(session.user), reader.user_sessions_as_of(
            ns, session.user, session.resource_version))
        return True
    return False


def _carry_out(
    reader: Reader, kube: Kube, key: SessionKey, leases: Leases, settings: PoolSettings,
    read: _ClaimRead, *, hand_on: bool, prober: Prober | None,
) -> Result | None:
    """Do what the claim's decision says; None: decide again (the read was stale)."""
    match read.decision:
        case ClaimSkip(reason=reason):
            return Result(Outcome.SKIPPED, message=reason)
        case ClaimError(message=message, code=code):
            return _refuse(reader, kube, key, settings, read.session, message, code)
        case ClaimWait(message=message, reason=wait, behind=behind):
            if behind:  # a free instance, yet it waits: who it read as ahead of it
                log.info("Session %s waits %s", key.session, behind)
            return _wait(reader, kube, key, settings, read, message, wait)
        case ClaimHeld(instance_id=k):
            return _serve_held(reader, kube, leases, settings, read, k, prober)
        case ClaimBurst(instance_id=k):
            return _burst(reader, kube, leases, settings, read, k, prober)
        case ClaimTry(candidates=candidates):
            return _try_candidates(reader, kube, leases, settings, read, candidates,
                                   hand_on=hand_on, prober=prober)
    return None


def _refuse(
    reader: Reader, kube: Kube, key: SessionKey, settings: PoolSettings, session: Session,
    message: str, code: str,
) -> Result | None:
    """A Session that cannot be served: ERROR with why (and a Warning), its route dropped."""
    ns = key.namespace
    if session.status != v.STATUS_ERROR:
        try:
            _set_status(kube, session, v.STATUS_ERROR, message, code, reader=reader)
        except Conflict:
            # Changed since the read (served meanwhile, say): decide again.
            reader.session(ns, key.session, fresh=True)
            return None
        Executor(kube, ns, Unguarded()).apply([Report(
            "SessionLimit" if code else "InvalidSession",
            f"Session {session.name}: {message}" + (f" ({code})" if code else ""),
            regarding={"kind": v.SESSION_KIND, "name": session.name,
                       "apiVersion": v.SESSION_API_VERSION})])
    _drop_route(reader, kube, session, settings)
    return Result(Outcome.REFUSED, message=message, record=Record(appdef=session.appdef))


def _wait(
    reader: Reader, kube: Kube, key: SessionKey, settings: PoolSettings, read: _ClaimRead,
    message: str, wait: WaitReason,
) -> Result | None:
    """A Session that waits: HANDLING with why (a Warning where the shared route is missing
    or unusable), its route dropped."""
    session, appdef, ns = read.session, read.appdef, key.namespace
    if message in (ROUTE_MISSING, INGRESS_MISSING) and session.message != message:
        assert isinstance(appdef, AppDefinition)
        Executor(kube, ns, Unguarded()).apply([Report(
            "RouteMissing", f"{'HTTPRoute' if settings.routing else 'Ingress'} "
            f"{appdef.ingress_name!r} (spec.ingressname "
            f"of AppDefinition {appdef.name}) does not exist: Session "
            f"{session.name} waits for it",
            regarding={"kind": v.APPDEF_KIND, "name": appdef.name,
                       "apiVersion": v.APPDEF_API_VERSION})])
    elif read.route_error is not None and session.message != message:
        assert isinstance(appdef, AppDefinition)
        # The Warning names the object and the field: the shared HTTPRoute.
        Executor(kube, ns, Unguarded()).apply([Report(
            "InvalidSharedRoute", f"{message}; Session {session.name} waits",
            regarding={"kind": v.ROUTE_KIND, "name": appdef.ingress_name,
                       "apiVersion": v.ROUTE_API_VERSION})])
    try:
        _set_status(kube, session, v.STATUS_HANDLING, message, reader=reader)
    except Conflict:
        # Changed since the read (served meanwhile, say): decide again.
        reader.session(ns, key.session, fresh=True)
        return None
    _drop_route(reader, kube, session, settings)
    return Result(Outcome.WAITING, message=message,
                  record=Record(appdef=session.appdef, wait=wait))


def _serve_held(
    reader: Reader, kube: Kube, leases: Leases, settings: PoolSettings, read: _ClaimRead,
    k: int, prober: Prober | None,
) -> Result:
    """A Session that holds instance `k` already: that instance's reconcile, under its lease."""
    session = read.session
    ikey = InstanceKey(read.namespace, session.appdef, k)
    with leases.try_lease(str(ikey)) as g:
        if g is None:
            return Result.deferred(f"instance {k} is busy", on=ikey)
        result = reconcile_instance(reader, kube, ikey, g, settings, prober=prober)
        fence = g.fence
    # The instance's follow-ups are the claim's: a reconcile that finds the holder no longer
    # valid frees the instance and names the waiting Sessions to wake. Its writes are noted
    # as the instance key's own, so no run of that key would name them again.
    return Result(Outcome.HELD, result.follow_ups, written=result.written, record=Record(
        plan=result.record.plan, instance=ikey, fence=fence,
        attempts=result.record.attempts, appdef=session.appdef,
        session_created=session.created))


def _burst(
    reader: Reader, kube: Kube, leases: Leases, settings: PoolSettings, read: _ClaimRead,
    k: int, prober: Prober | None,
) -> Result | None:
    """No free instance: make instance `k` above minInstances for the Session (a burst), and
    give it to it; None when it was made or used meanwhile (decide again)."""
    session, appdef = read.session, read.appdef
    assert isinstance(appdef, AppDefinition)
    ikey = InstanceKey(read.namespace, appdef.name, k)
    with leases.try_lease(str(ikey)) as g:
        if g is None:
            return Result.deferred(f"instance {k} is busy", on=ikey)
        made: Writes = []
        if not _burst_write(reader, kube, appdef, k, session, read.sessions, g, settings,
                            made):
            return None  # made or used meanwhile: decide again on what is there
        result = reconcile_instance(reader, kube, ikey, g, settings, prober=prober)
        return Result(Outcome.CLAIMED,
                      written={str(ikey): [*made, *result.written_under(ikey)]},
                      record=Record(plan=result.record.plan, instance=ikey,
                                    fence=g.fence, attempts=result.record.attempts,
                                    appdef=session.appdef,
                                    session_created=session.created,
                                    start=Start.COLD))


def _try_candidates(
    reader: Reader, kube: Kube, leases: Leases, settings: PoolSettings, read: _ClaimRead,
    candidates: Sequence[int], *, hand_on: bool, prober: Prober | None,
) -> Result | None:
    """The deciding write on the first free candidate whose lease is free, then its
    reconcile; None when the candidate was refused or taken (decide again)."""
    session, appdef, ns = read.session, read.appdef, read.namespace
    assert isinstance(appdef, AppDefinition)
    busy = False
    for i, k in enumerate(candidates):
        ikey = InstanceKey(ns, appdef.name, k)
        with leases.try_lease(str(ikey)) as g:
            if g is None and i == 0:
                # Our target is being reconciled (or claimed): wait for it rather
                # than take a higher id than ours.
                return Result.deferred(f"instance {k} is busy", on=ikey)
            if g is None:
                busy = True
                continue
            written: Writes = []
            if _deciding_write(reader, kube, appdef, k, session, read.sessions, g, written):
                result = reconcile_instance(reader, kube, ikey, g, settings, prober=prober)
                written += result.written_under(ikey)
                rest = [s for s in reader.sessions(ns, appdef.name) if s.uid != session.uid]
                return Result(
                    Outcome.CLAIMED,
                    _wake_waiting(reader, ns, appdef, rest, dict(written),
                                  settings.burst) if hand_on else [],
                    written={str(ikey): written}, record=Record(
                        plan=result.record.plan, instance=ikey, fence=g.fence,
                        attempts=result.record.attempts, appdef=session.appdef,
                        session_created=session.created,
                        start=Start.WARM if is_warm(k, read.facts) else Start.COLD))
            # Refused or taken: decide again from the top rather than try the
            # next id. The read behind this decision was stale for k; it may be
            # for this Session too (a deciding write of a previous attempt whose
            # answer was lost), and the fresh read of k is now in the cache.
            break
    if busy:
        return Result.deferred("every free instance was busy")
    return None  # the candidate was taken under our feet: look again


def resync_pool(
    reader: Reader, kube: Kube, key: PoolKey, settings: PoolSettings, *,
    every_instance: bool = False, timeouts: TimeoutSettings | None = None,
) -> Result:
    """The keys of one pool that have work, as the result's follow-ups: each instance whose
    decision, on this read, has actions (or that references a Session the read does not
    know), each waiting claim. An invalid AppDefinition is reported and refused.

    A resync is the backstop for work whose key was lost (Redis lost it, a failover dropped
    the last writes): that work shows in the cache as an instance whose decision is not
    empty, so an instance whose decision is empty is not queued. Every other instance would
    only run to find nothing to do: at a thousand instances, a thousand runs per resync.
    Skipping one on a stale read is safe: the change the read lacks has a watch event still
    to come, which queues the key. `every_instance`: every id that exists, is held or should
    exist (the sequential driver, which reconciles the whole pool each round).

    Its timers (issue #29): the pool's next schedule edge is its `requeue_after`
    (`keep_schedules`, which also writes each PoolSchedule's status), and with `timeouts`
    each of its Sessions' timeout keys is named in `later`, due at its next deadline.
    """
    appdef = reader.appdef(key.namespace, key.appdef)
    # The schedule's next edge is this job's timer: the queue runs the pool again then.
    next_edge = keep_schedules(
        reader, kube, key.namespace, key.appdef,
        reader.appdef(key.namespace, key.appdef, as_specified=True)
        if isinstance(appdef, AppDefinition) else appdef)
    if isinstance(appdef, Invalid):
        Executor(kube, key.namespace, Unguarded()).apply([Report(
            "InvalidAppDefinition", f"AppDefinition {key.appdef} is left as it is: "
            f"{appdef.message}",
            regarding={"kind": v.APPDEF_KIND, "name": key.appdef,
                       "apiVersion": v.APPDEF_API_VERSION})])
        # Refused, but not frozen (issue #27): the instances a release is due on are
        # queued, so that an ended Session loses its access now, not once the spec is fixed.
        # Its waiting Sessions are not queued: their claims wait for a valid spec.
        releases = _releases_due(reader, key, appdef, settings)
        # Its Sessions' limits hold all the same (spec.timeout is read on its own).
        later = (session_timers(reader, key.namespace, key.appdef,
                                reader.sessions(key.namespace, key.appdef), timeouts)
                 if timeouts is not None else [])
        return Result(Outcome.REFUSED, [(k, None) for k in releases], later=later,
                      message=appdef.message, requeue_after=next_edge)
    sessions = reader.sessions(key.namespace, key.appdef)
    if settings.routing and appdef is not None:
        _sweep_routes(reader, kube, appdef, sessions)
    found = report_pool_health(reader, kube, appdef) if appdef is not None else None
    pool = reader.pool(key.namespace, key.appdef, appdef, sessions)
    ids = set(pool) | {s.instance_id for s in sessions if s.instance_id}
    if appdef is not None:
        ids |= set(range(1, appdef.min_instances + 1))
    if not every_instance:
        template = reader.proxy_template(key.namespace) if appdef is not None else None
        ids = {k for k in ids if _has_work(reader, key, appdef, pool.get(k, InstanceView(k, {})),
                                           sessions, template, settings)}
    keys: list[Key] = [InstanceKey(key.namespace, key.appdef, k) for k in sorted(ids)]
    # Every Session no Service references: waiting, or annotated with what it does not hold.
    facts = pool_facts(pool)
    keys += [SessionKey(key.namespace, s.name) for s in sessions
             if s.live and s.uid not in facts.referenced and s.status != v.STATUS_ERROR]
    # No versions to wait for: a resync's keys reconcile fully.
    later = (session_timers(reader, key.namespace, key.appdef, sessions, timeouts)
             if timeouts is not None else [])
    return Result(Outcome.RESYNCED, [(k, None) for k in keys], later=later,
                  requeue_after=next_edge,
                  record=Record(health=found))


def _releases_due(
    reader: Reader, key: PoolKey, invalid: Invalid, settings: PoolSettings
) -> list[Key]:
    """The instances of an invalid AppDefinition's pool whose own job would release
    something (`decide_release_without_definition` has actions on this read), or that
    reference a Session the read does not know (the job asks the server). A stale read is
    harmless as in `_has_work`: what it lacks has a watch event still to come."""
    ns = key.namespace
    sessions = reader.sessions(ns, key.appdef)
    known = {s.uid for s in sessions}
    session_routes = reader.session_routes(ns) if settings.routing else []
    shared = _invalid_ingress(reader, ns, invalid, settings, fresh=False)
    due: list[Key] = []
    for k, view in sorted(reader.pool(ns, key.appdef, None, sessions).items()):
        ext = view.get(Part.EXTERNAL_SERVICE)
        if ext is not None and session_routes:
            view = dataclasses.replace(view, routes=routes.routes_to_instance(
                session_routes, name_of(ext), holder_uids(view)))
        unknown = any(is_session_ref(r) and r.get("uid") not in known
                      for _, obj in view.existing() for r in refs(obj))
        elsewhere, _ = _claims_elsewhere(reader, ns, key.appdef, view, sessions)
        if unknown or decide_release_without_definition(
                view, key.appdef, invalid, sessions, settings=settings,
                held_elsewhere=elsewhere, shared_ingress=shared).actions:
            due.append(InstanceKey(ns, key.appdef, k))
    return due


def _sweep_routes(
    reader: Reader, kube: Kube, appdef: AppDefinition, sessions: list[Session]
) -> None:
    """Delete the pool's orphaned session routes (session-lifecycle §3): labelled for this
    AppDefinition, owned only by their Session, which is gone or being deleted. The routes
    to an instance are its own job's; this finds those no instance leads to (a Session
    deleted with propagationPolicy Orphan, or while no garbage collector ran).

    Safe on a stale read: each candidate's Session is read from the server first (a uid
    never comes back, so "no live Session with that uid" there is final), and the delete
    carries the route's uid and resourceVersion, so a route changed since is not touched.
    """
    label = naming.label_value(appdef.spec_name)  # as builders.session_labels writes it
    live = {s.uid for s in sessions if s.live}
    actions: list[Action] = []
    for route in reader.session_routes(appdef.namespace):
        uid = routes.session_uid_of(route)
        if (labels_of(route).get(v.LABEL_APP_DEFINITION) != label or uid in live
                or not routes.only_owned_by_its_session(route)):
            continue
        owner = next((str(r.get("name")) for r in owner_refs(route) if r.get("uid") == uid), "")
        now = reader.session(appdef.namespace, owner, fresh=True) if owner else None
        if now is not None and now.uid == uid and now.live:
            continue
        actions.append(Delete(Part.ROUTE, name_of(route), uid_of(route),
                              resource_version_of(route), "its Session is gone"))
    for action in actions:
        with contextlib.suppress(Conflict, KubeError):  # changed or gone meanwhile: next time
            Executor(kube, appdef.namespace, Unguarded(), sink=reader).apply([action])


def _has_work(
    reader: Reader, key: PoolKey, appdef: AppDefinition | None, view: InstanceView,
    sessions: list[Session], template: str | None, settings: PoolSettings,
) -> bool:
    """Whether instance `view.id`'s own job would act: its decision on this read has actions,
    or an object references a Session the read does not know (the job asks the server)."""
    known = {s.uid for s in sessions}
    if any(is_session_ref(r) and r.get("uid") not in known
           for _, obj in view.existing() for r in refs(obj)):
        return True
    elsewhere, _ = _claims_elsewhere(reader, key.namespace, key.appdef, view, sessions)
    plan = decide_instance(view, key.appdef, appdef, sessions, proxy_template=template,
                           settings=settings, held_elsewhere=elsewhere,
                           shared_route=_shared_route(reader, appdef, settings))
    return bool(plan.actions)
