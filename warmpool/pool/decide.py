"""Level-triggered decisions: observed state of one instance in, the actions that converge it out.

This is pool-spec.md §4 as code. It reads nothing and writes nothing, so every rule (the fix for
the Java operator's defect included) is tested without a server; the executor applies the plan
under the instance's lease, and a 409 makes the caller observe again and decide again.

Three rules carry the fix:
- a claimed instance keeps all five objects, each owned by the AppDefinition *and* the Session,
  whatever minInstances says, and whatever is missing is recreated with the holder's e-mail;
- the AppDefinition's reference is never stripped, and no object is left with zero owners;
- a release clears the allow-list first and the external Service's Session reference last, so
  a crash anywhere in between leaves a marker that makes the next run finish the release.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from warmpool.pool import builders, ingress, naming, proxy, routes
from warmpool.pool import vocabulary as v
from warmpool.pool.actions import (
    Action,
    AnnotateSession,
    Create,
    Delete,
    Patch,
    ProbeUrl,
    RefreshPods,
    Report,
    ResetPods,
    SetSessionStatus,
)
from warmpool.pool.availability import ProbeTarget
from warmpool.pool.builders import PoolSettings
from warmpool.pool.instances import (
    InstanceView,
    Obj,
    emails_of,
    has_ref,
    holders,
    is_appdef_ref,
    is_foreign_ref,
    is_session_ref,
    refs,
    release_markers,
)
from warmpool.pool.meta import annotations_of, labels_of, meta_of
from warmpool.pool.model import AppDefinition, Session, session_error
from warmpool.pool.parts import PARTS, Part
from warmpool.pool.pods import Warmth


class State(StrEnum):
    """What an instance is converging to. The values are recorded in Redis for the pool's
    gauges (`metrics.poolstate`) and are metric label values: never rename one."""

    CLAIMED = "claimed"
    FREE = "free"
    #: Free, but one of its objects could not be replaced at the new generation.
    OUTDATED = "outdated"
    #: Above minInstances (or its AppDefinition gone): being deleted.
    RETIRED = "retired"
    #: Its AppDefinition is invalid: nothing is decided, the instance is left as it is.
    INVALID = "invalid"


@dataclass(frozen=True, slots=True)
class Plan:
    """The actions for one instance and the state it is converging to (for status and metrics).

    `released`: the instance still carried a holder's traces (a reference, a session label,
    an e-mail) and no live holder, so this plan clears them: it ends (or finishes, after a
    crash) a release. The metrics count releases from it, not from the actions.
    """

    state: State
    holder: Session | None
    actions: list[Action] = field(default_factory=list)
    released: bool = False


# --- small readers -------------------------------------------------------------------------

#: The Normal events of a Session's claim and release (on the Session).
REASON_CLAIMED = "Claimed"
REASON_RELEASED = "Released"


def _shape(obj: Obj) -> str | None:
    return annotations_of(obj).get(v.ANNOTATION_SHAPE)


def _generation(obj: Obj) -> str | None:
    return labels_of(obj).get(v.LABEL_GENERATION)



def rightful_instance(session: Session, referencing: frozenset[int] | None, here: int) -> int:
    """The one instance `session` holds, given the ids whose external Service references it:
    the annotated one if it is among them (or nothing references it), else the lowest.
    Without that knowledge (None), the instance at hand: it is a holder as `holders` says."""
    if referencing is None:
        return here
    if not referencing:
        return session.instance_id if session.instance_id is not None else here
    if session.instance_id in referencing:
        return session.instance_id
    return min(referencing)


# --- the decision --------------------------------------------------------------------------

def decide_instance(
    instance: InstanceView,
    appdef_name: str,
    appdef: AppDefinition | None,
    sessions: Sequence[Session],
    *,
    proxy_template: str | None,
    settings: PoolSettings,
    held_elsewhere: Mapping[str, frozenset[int]] | None = None,
    shared_route: Obj | None = None,
    now_ms: int = 0,
) -> Plan:
    """Converge one instance. `appdef` is None when the AppDefinition no longer exists.

    `shared_route`: the HTTPRoute the AppDefinition's `spec.ingressname` names, as read (None:
    it does not exist), where routes are in use (`settings.routing`): the holder's route
    copies its parentRefs and hostnames. `now_ms`: the time (epoch ms) a Session marked
    HANDLED now records as its `lastActivity`.

    `held_elsewhere`: for a claimant, the ids of every instance whose external Service
    references it (this one included), where the caller knows them. A Session holds one
    instance (`rightful_instance`); on any other that references it the reference is a double
    claim (a claim retried after its deciding write's answer was lost, on a read that had
    not yet seen it) and that instance is released instead of fought over.
    """
    claimants = [s for s in holders(instance, appdef_name, sessions)
                 if rightful_instance(s, (held_elsewhere or {}).get(s.uid), instance.id)
                 == instance.id]
    if claimants:
        plan = _claimed(instance, appdef, claimants, proxy_template, settings, shared_route,
                        now_ms)
    else:
        plan = _free(instance, appdef_name, appdef, proxy_template, settings, shared_route)
    plan.actions[:] = _guard_route_deletes(instance, plan.actions, free=not claimants)
    plan.actions.extend(_template_reports(plan.actions, proxy_template, settings))
    # A report is about the pool: file it on the AppDefinition unless it names its own object.
    regarding = {"apiVersion": v.APPDEF_API_VERSION, "kind": v.APPDEF_KIND, "name": appdef_name}
    plan.actions[:] = [replace(a, regarding=regarding)
                       if isinstance(a, Report) and not a.regarding else a
                       for a in plan.actions]
    return plan


def _template_reports(
    actions: Sequence[Action], template: str | None, settings: PoolSettings
) -> list[Report]:
    """A Warning on the namespace's template ConfigMap for each part of it the proxy
    configuration just built does not use as written (warmpool.pool.proxy): once per
    ConfigMap created, so an unchanged template is not reported on every reconcile."""
    if not any(isinstance(a, Create) and a.part is Part.PROXY_CONFIGMAP for a in actions):
        return []
    regarding = {"apiVersion": "v1", "kind": "ConfigMap", "name": v.NAMESPACE_PROXY_TEMPLATE}
    return [Report(f.reason, f.message, regarding=regarding)
            for f in proxy.prepare(template, settings.proxy_policy).findings]


def _claimed(
    instance: InstanceView,
    appdef: AppDefinition | None,
    claimants: list[Session],
    proxy_template: str | None,
    settings: PoolSettings,
    shared_route: Obj | None,
    now_ms: int,
) -> Plan:
    holder = claimants[0]
    actions: list[Action] = []
    if len(claimants) > 1:
        others = ", ".join(s.name for s in claimants[1:])
        actions.append(Report("InstanceConflict",
                              f"instance {instance.id} is claimed by {holder.name}; "
                              f"also by {others}, who must claim again"))
    user_ok = session_error(holder) is None
    if not user_ok:
        actions.append(Report("InvalidUser", f"Session {holder.name} holds instance "
                              f"{instance.id} but its spec.user is not one e-mail address; "
                              "its allow-list is left empty"))
    emails = holder.user if user_ok else ""
    if appdef is None or appdef.deleting:
        _held_without_definition(instance, holder, emails, actions)
        return Plan(State.CLAIMED, holder, actions)
    _holders_objects(instance, appdef, holder, emails, proxy_template, settings, actions)
    _holders_annotation(instance, holder, actions)
    _holders_route_and_status(instance, appdef, holder, shared_route, settings, now_ms, actions)
    # An outdated generation is deliberately left alone while claimed: the session keeps
    # running, and the release refreshes the instance.
    return Plan(State.CLAIMED, holder, actions)


def _held_without_definition(
    instance: InstanceView, holder: Session, emails: str, actions: list[Action],
) -> None:
    """A held instance whose AppDefinition is gone (or going): its spec cannot rebuild
    anything, so what exists is kept and only the allow-list is kept right; the release
    deletes the instance when the Session ends. A claim it interrupted is finished (HANDLED)
    or failed (ERROR), so that the Session does not wait forever.

    Every route but the holder's goes first, as in a release (session-lifecycle §3), guarded
    by the external Service (`_guard_route_deletes`: a claim since refuses them). The
    holder's own route goes once the holder is ERROR: a failed Session is sent nowhere, and
    nothing else would delete its route before the Session ends (a burst claim routes before
    its status, so an AppDefinition deleted in between leaves one behind).
    """
    complete = holder.instance_id == instance.id and instance.complete
    fails = holder.status == v.STATUS_ERROR or not (complete or (
        holder.instance_id == instance.id and holder.status == v.STATUS_HANDLED))
    others = routes.stray_routes(instance.routes, holder.uid)
    actions.extend(_delete(Part.ROUTE, r, f"instance {instance.id} is not its Session's")
                   for r in others)
    email = instance.get(Part.EMAIL_CONFIGMAP)
    unvouched = (instance.get(Part.EXTERNAL_SERVICE) is None
                 and not emails_of(email).strip())
    # With the Service and the allow-list's content gone, nothing says whom the pod
    # served, and without the AppDefinition it cannot be reset (its selector is the
    # spec's): the allow-list stays empty (a 403, never another user's pod).
    if email is not None and emails_of(email) != emails and not unvouched:
        actions.append(_patch(Part.EMAIL_CONFIGMAP, email, {"data": {v.EMAILS_KEY: emails}},
                              "allow-list of the holder"))
    if complete and holder.status not in (v.STATUS_HANDLED, v.STATUS_ERROR):
        # The claim had done everything but its status (a write that failed, then the
        # AppDefinition went): the Session holds a whole instance, so it is HANDLED (it
        # would otherwise stay NEW until it ends; the long chaos tier, seed 12).
        ext_name = meta_of(instance.get(Part.EXTERNAL_SERVICE)).get("name")
        actions.append(SetSessionStatus(holder.name, {
            "operatorStatus": v.STATUS_HANDLED,
            "operatorMessage": f"Instance {instance.id} of {holder.appdef} ({ext_name}); "
                               "its AppDefinition was deleted: kept until the Session ends"},
            uid=holder.uid, first=holder.status == v.STATUS_NEW,
            resource_version=holder.resource_version))
    elif fails and holder.status != v.STATUS_ERROR:
        # The claim was in flight (deciding write made, Session not yet annotated, or an
        # object still missing): it cannot be completed, and without a word the Session
        # would wait forever.
        message = (f"AppDefinition {holder.appdef!r} was deleted before the claim of "
                   f"instance {instance.id} completed")
        actions.append(SetSessionStatus(holder.name, {"operatorStatus": v.STATUS_ERROR,
                                                      "operatorMessage": message},
                                        uid=holder.uid,
                                        first=holder.status == v.STATUS_NEW,
                                        resource_version=holder.resource_version))
        actions.append(Report("ClaimNotCompleted", f"Session {holder.name}: {message}"))
    if fails:
        # After the ERROR just planned, never before: that write tests the Session's
        # resourceVersion, so on a stale read (its claim completed since) it is refused
        # and this delete is not reached. A holder read as ERROR is ERROR now: without an
        # AppDefinition nothing writes a Session out of ERROR, and a re-created one's
        # reconcile would make the route again. The delete carries the route's uid and
        # version.
        actions.extend(_delete(Part.ROUTE, r, f"instance {instance.id}: its holder failed")
                       for r in routes.stray_routes(instance.routes, None) if r not in others)


def _holders_objects(
    instance: InstanceView, appdef: AppDefinition, holder: Session, emails: str,
    proxy_template: str | None, settings: PoolSettings, actions: list[Action],
) -> None:
    """The instance's five objects made whole and the holder's: each missing one created,
    each present one patched to be owned by (and labelled for) the holder, its allow-list
    naming the holder's user; the pods reset first where nothing says whom they served, and
    refreshed after where the allow-list changed under them."""
    deployment = instance.get(Part.DEPLOYMENT)
    unknown_user = (instance.get(Part.EXTERNAL_SERVICE) is None and deployment is not None
                    and not emails_of(instance.get(Part.EMAIL_CONFIGMAP)).strip())
    if unknown_user and emails and deployment is not None:
        # The Service and the allow-list are both gone (deleted by hand): nothing says whom
        # the running pod served (`HolderIndex.of`), so it is reset before the allow-list
        # names the holder again, and no one's state reaches another user.
        actions.append(ResetPods(naming.app_selector(appdef.spec_name, instance.id),
                                 *_deployment_id(deployment)))
    email_written = False
    for part in PARTS:
        obj = instance.get(part)
        if obj is None:
            body = builders.build(part, appdef, instance.id, holder=holder,
                                  proxy_template=proxy_template, settings=settings)
            if part is Part.EMAIL_CONFIGMAP:
                body["data"][v.EMAILS_KEY] = emails
                email_written = True
            actions.append(Create(part, body))
            continue
        patch = _holders_patch(part, obj, appdef, holder, emails)
        if "data" in patch:
            email_written = True
        if patch:
            actions.append(_patch(part, obj, patch, f"held by Session {holder.name}"))
    if email_written and deployment is not None:
        # Only the pods of the Deployment as read; one created by this plan starts its pods
        # with the allow-list already written, so there is nothing to refresh.
        actions.append(RefreshPods(naming.app_selector(appdef.spec_name, instance.id),
                                   *_deployment_id(deployment)))


def _holders_patch(
    part: Part, obj: Obj, appdef: AppDefinition, holder: Session, emails: str,
) -> dict[str, Any]:
    """What one existing object of a held instance lacks to be the holder's (empty: nothing):
    its owner references (the AppDefinition and the holder, no other Session), a Service's
    Session labels, the external Service's claimed-for annotation, the allow-list's user
    (under "data": the allow-list is then rewritten)."""
    patch: dict[str, Any] = {}
    current = refs(obj)
    wanted = [r for r in current if not is_session_ref(r) or r.get("uid") == holder.uid]
    for ref in (appdef.owner_reference(), holder.owner_reference()):
        if not has_ref(wanted, ref):
            wanted.append(ref)
    if wanted != current:
        patch.setdefault("metadata", {})["ownerReferences"] = wanted
    if part.is_service:
        labels = labels_of(obj)
        changed = {k: val for k, val in builders.session_labels(appdef, holder).items()
                   if labels.get(k) != val}
        if changed:
            patch.setdefault("metadata", {})["labels"] = changed
    claimed_for = naming.claimed_for(holder.uid, holder.user)
    if (part is Part.EXTERNAL_SERVICE
            and annotations_of(obj).get(v.ANNOTATION_CLAIMED_FOR) != claimed_for):
        # A claim made before this annotation existed (or by the Java operator): adopt it.
        patch.setdefault("metadata", {})["annotations"] = {
            v.ANNOTATION_CLAIMED_FOR: claimed_for}
    if part is Part.EMAIL_CONFIGMAP and emails_of(obj) != emails:
        patch["data"] = {v.EMAILS_KEY: emails}
    return patch


def _holders_annotation(instance: InstanceView, holder: Session, actions: list[Action]) -> None:
    """The holder annotated with the instance it holds (and eager start): a malformed
    instance-id annotation reported, and replaced."""
    raw_id = holder.annotations.get(v.ANNOTATION_INSTANCE_ID)
    if raw_id is not None and holder.instance_id is None:
        # Not an instance id at all ('²', 5000 digits, 'abc'): not obeyed (pool-spec §4) and
        # reported; the annotation below replaces it with the instance the Session holds.
        shown = repr(raw_id) if len(raw_id) <= 40 else f"{raw_id[:40]!r}... ({len(raw_id)} chars)"
        actions.append(Report("AnnotationIgnored", f"Session {holder.name}: its "
                              f"{v.ANNOTATION_INSTANCE_ID} annotation {shown} is not an "
                              f"instance id: not obeyed, replaced by {instance.id}",
                              regarding={"kind": v.SESSION_KIND, "name": holder.name,
                                         "apiVersion": v.SESSION_API_VERSION}))
    if (holder.instance_id != instance.id
            or holder.annotations.get(v.ANNOTATION_START_STRATEGY) != v.START_STRATEGY_EAGER):
        # After the completing patches (I1: a Session annotated with k finds k's objects
        # owned by it); the executor sends it together with the pod refresh.
        actions.append(AnnotateSession(holder.name, {
            v.ANNOTATION_INSTANCE_ID: str(instance.id),
            v.ANNOTATION_START_STRATEGY: v.START_STRATEGY_EAGER,
        }, resource_version=holder.resource_version))


def _holders_route_and_status(
    instance: InstanceView, appdef: AppDefinition, holder: Session, shared_route: Obj | None,
    settings: PoolSettings, now_ms: int, actions: list[Action],
) -> None:
    """The holder's route (or Ingress rule), then its status: HANDLING while nothing can route
    to the instance, else HANDLED with its URL (and the URL probe where that is on)."""
    routed = True
    if settings.routing:
        routed = _route(instance, appdef, holder, shared_route, settings, actions)
    elif settings.ingress:
        routed = _ingress_rule(instance, appdef, shared_route, settings, actions, claimed=True)
    if not routed:
        # Claimed, but nothing can route to it until the shared route exists (and can be
        # copied): not HANDLED (a client would open a URL that leads nowhere). Its creation
        # (or repair) queues this again.
        missing = routes.ROUTE_MISSING if settings.routing else ingress.INGRESS_MISSING
        if (settings.routing and shared_route is not None and (
                error := routes.shared_route_error(appdef, shared_route, settings))):
            missing = routes.invalid_shared_route(appdef, error)
        if holder.status != v.STATUS_HANDLING or holder.message != missing:
            actions.append(SetSessionStatus(holder.name, {
                "operatorStatus": v.STATUS_HANDLING, "operatorMessage": missing},
                uid=holder.uid, first=holder.status == v.STATUS_NEW,
                resource_version=holder.resource_version))
        return
    _handled(instance, appdef, holder, settings, now_ms, actions)


def _handled(
    instance: InstanceView, appdef: AppDefinition, holder: Session, settings: PoolSettings,
    now_ms: int, actions: list[Action],
) -> None:
    """A routed holder's HANDLED status with its URL (once, or again when the URL moved), the
    claim's event, and the URL probe while the holder lacks its URL."""
    url = settings.session_url(appdef, instance.id)
    # HANDLED with another instance's URL: the younger Session of a double claim the
    # Java operator left (docs/operating.md) keeps the URL of the instance the older one
    # keeps, and serving it here must move its URL too, or its user would open the other
    # user's path (and get oauth2-proxy's 403). So does a change of the instances host.
    stale_url = bool(holder.url) and holder.url != url
    if holder.status != v.STATUS_HANDLED or stale_url:
        ext_name = builders.object_name(appdef, Part.EXTERNAL_SERVICE, instance.id)
        status: dict[str, Any] = {
            "operatorStatus": v.STATUS_HANDLED,
            "operatorMessage": f"Instance {instance.id} of {appdef.name} ({ext_name})"
                               + _cold_note(instance),
            # Java's markHandled: now, in epoch ms (§2); the activity tracker raises it.
            "lastActivity": now_ms,
        }
        if not settings.url_probe:
            status["url"] = url  # nothing will probe it: it comes with HANDLED
        elif stale_url:
            status["url"] = ""  # blank is "not ready" (§2); the probe writes this one
        actions.append(SetSessionStatus(holder.name, status, uid=holder.uid,
                                        first=holder.status == v.STATUS_NEW,
                                        resource_version=holder.resource_version))
        if holder.status != v.STATUS_HANDLED:
            # After the status (events run in order, each after the writes before it):
            # an operator sees the claim once it is one (not a URL moved on a claim
            # already HANDLED). Names the instance, never the user.
            actions.append(Report(REASON_CLAIMED, f"instance {instance.id} of "
                                  f"{appdef.name} ({ext_name})", warning=False,
                                  regarding=holder.owner_reference()))
    if settings.url_probe and (not holder.url or stale_url) and not holder.error:
        # Level-triggered: every run for a holder without its URL asks again (a probe
        # lost with its process is started anew), and a running probe is left alone.
        actions.append(ProbeUrl(ProbeTarget(holder.namespace, holder.name, holder.uid,
                                            instance.id, url, appdef.name)))


#: What a HANDLED status adds when the instance's pod was not Ready at the claim.
COLD_START_NOTE = ("; no prewarmed instance was ready, so its pod is still starting (a cold "
                   "start: the session opens once it is Ready)")


def _cold_note(instance: InstanceView) -> str:
    """The user is told when the claim had to take an instance whose pod is starting: the
    wait that follows is the pod's, not a fault (`claim.claimable_ids` takes warm first)."""
    return COLD_START_NOTE if instance.warmth in (Warmth.STARTING, Warmth.FAILING) else ""


def _route(
    instance: InstanceView, appdef: AppDefinition, holder: Session, shared: Obj | None,
    settings: PoolSettings, actions: list[Action],
) -> bool:
    """Append what brings the holder's route to its desired state (session-lifecycle §1);
    whether the holder is routed once they are applied.

    After everything else of the claim in `actions`; the executor sends it once the completing
    writes are answered, with the pod refresh (`warmpool.kube.executor._waves` says why a
    path then never reaches an allow-list that lets anyone but the holder in). Another
    Session's route to this instance (a released one the garbage collector has not taken
    yet) is deleted. While the shared route is missing an existing route is left as it is
    (it still names its Gateway) and none is made.
    """
    mine = routes.route_name(holder.uid)
    for stray in routes.stray_routes(instance.routes, holder.uid):
        actions.append(_delete(Part.ROUTE, stray, f"a route to instance {instance.id}, "
                               f"which {holder.name} holds"))
    live = next((r for r in instance.routes if meta_of(r).get("name") == mine), None)
    if shared is None or routes.shared_route_error(appdef, shared, settings) is not None:
        # Missing, or with parentRefs or hostnames no route may carry: an existing route is
        # left as it is (it still names its Gateway), and none is made from a bad copy.
        return live is not None
    desired = routes.desired_route(appdef, instance.id, holder, shared, settings)
    if live is None:
        actions.append(Create(Part.ROUTE, desired))
    elif patch := routes.route_patch(live, desired):
        actions.append(_patch(Part.ROUTE, live, patch, f"route of {holder.name}"))
    return True


def _ingress_rule(
    instance: InstanceView, appdef: AppDefinition | None, shared: Obj | None,
    settings: PoolSettings, actions: list[Action], *, claimed: bool,
) -> bool:
    """Append the patch that adds (claimed) or removes (free) the instance's rule on the
    shared Ingress (session-lifecycle §4); whether the instance is routed once it is applied.
    The patch replaces the rules whole, guarded by the Ingress's resourceVersion."""
    if shared is None or appdef is None:
        return False
    rules = (ingress.with_rule if claimed else ingress.without_rule)(
        shared, appdef, instance.id, settings)
    if rules is not None:
        why = (f"rule of instance {instance.id}, claimed" if claimed
               else f"rule of instance {instance.id} removed: free")
        actions.append(_patch(Part.INGRESS, shared, {"spec": {"rules": rules}}, why))
    return True


def _guard_route_deletes(
    instance: InstanceView, actions: list[Action], *, free: bool
) -> list[Action]:
    """Put a guarded write of the external Service before a plan's route deletes (and, in
    the plan of a free instance, before the removal of its Ingress rule).

    A route is deleted when the read says its Session does not hold the instance. On a
    stale read that Session may hold it now: its claim changed the external Service, so an
    empty patch of the Service at the version read (the executor stamps its fence on it) is
    refused, and the route survives. A plan that starts with a write of the Service (a
    retirement's delete) is guarded already. With no Service in the read, the caller
    confirms on the server's view first (`unguarded_deletes`).
    """
    if not any((isinstance(a, Delete) and a.part is Part.ROUTE)
               or (free and isinstance(a, Patch) and a.part is Part.INGRESS)
               for a in actions):
        return actions
    first = actions[0]
    if isinstance(first, Patch | Delete) and first.part is Part.EXTERNAL_SERVICE:
        return actions
    ext = instance.get(Part.EXTERNAL_SERVICE)
    if ext is None:
        return actions
    return [_patch(Part.EXTERNAL_SERVICE, ext, {}, "guard the route deletes"), *actions]


def _free(
    instance: InstanceView,
    appdef_name: str,
    appdef: AppDefinition | None,
    proxy_template: str | None,
    settings: PoolSettings,
    shared_route: Obj | None = None,
) -> Plan:
    keep = appdef is not None and not appdef.deleting and instance.id <= appdef.min_instances
    releasing = release_markers(instance)
    # A released Session's route goes first, before its allow-list is cleared (§3): once the
    # list is empty the path would lead a browser to a 403. Guarded (`_guard_route_deletes`).
    actions: list[Action] = [_delete(Part.ROUTE, r, f"instance {instance.id} is free")
                             for r in routes.stray_routes(instance.routes, None)]
    if settings.ingress:  # the instance's rule goes first too (§4: before the allow-list)
        _ingress_rule(instance, appdef, shared_route, settings, actions, claimed=False)
    obj: Mapping[str, Any] | None  # each loop below: a part's object (the second: or None)
    if not keep:
        # The external Service goes first: it is the object a claim's deciding write touches,
        # so this delete (resourceVersion-guarded) and a claim of the same instance cannot
        # both succeed, however stale the read behind either was. Once it is gone the
        # instance is incomplete, never free, so deleting the rest can race no claim.
        for part, obj in sorted(instance.existing(),
                                key=lambda po: po[0] is not Part.EXTERNAL_SERVICE):
            foreign = [r for r in refs(obj) if is_foreign_ref(r, appdef_name)]
            if not foreign:
                actions.append(_delete(part, obj, "free and above minInstances"
                                       if appdef is not None else "AppDefinition deleted"))
                continue
            owners = ", ".join(f"{r.get('kind')}/{r.get('name')}" for r in foreign)
            actions.append(Report(
                "ForeignOwner",
                f"{part.kind} {meta_of(obj).get('name')} would be deleted (instance {instance.id} "
                f"is free and above minInstances) but is also owned by {owners}: left in place",
                regarding={"kind": part.kind, "name": str(meta_of(obj).get("name"))}))
            patch = _free_patch(part, obj, appdef_name, appdef)
            if patch:
                actions.append(_patch(part, obj, patch, "free (kept for its other owner)"))
        # An external Service kept for another owner is still what a claim writes: guard
        # the deletes of the rest with it, as a replacement does.
        actions.extend(_released(instance, appdef_name))
        return Plan(State.RETIRED, None, _claim_guard_first(instance, actions), releasing)

    assert appdef is not None
    outdated = False
    for part in PARTS:
        obj = instance.get(part)
        fresh_pods = obj is None  # a Deployment created now starts clean pods anyway
        if obj is None:
            actions.append(Create(part, builders.build(part, appdef, instance.id, holder=None,
                                                       proxy_template=proxy_template,
                                                       settings=settings)))
        elif _generation(obj) != str(appdef.generation):
            fresh = builders.build(part, appdef, instance.id, holder=None,
                                   proxy_template=proxy_template, settings=settings)
            if _shape(obj) == _shape(fresh):
                # Only the generation moved (minInstances, say): relabel, keep the pod warm.
                # A Deployment's pod template keeps its old label: changing it would roll it.
                patch = _free_patch(part, obj, appdef_name, appdef)
                patch.setdefault("metadata", {}).setdefault("labels", {})[v.LABEL_GENERATION] = (
                    str(appdef.generation))
                actions.append(_patch(part, obj, patch, "same shape at a new generation"))
            elif any(is_foreign_ref(r, appdef_name) for r in refs(obj)):
                outdated = True
                actions.append(Report("ForeignOwner", f"{part.kind} {meta_of(obj).get('name')} is "
                                      "outdated but has another owner: not replaced"))
            else:
                outdated = fresh_pods = True
                actions.append(_delete(part, obj, f"outdated generation {_generation(obj)}"))
                actions.append(Create(part, fresh))
        else:
            patch = _free_patch(part, obj, appdef_name, appdef)
            if patch:
                actions.append(_patch(part, obj, patch, "free"))
        if part is Part.DEPLOYMENT and releasing and not fresh_pods and obj is not None:
            # Access is cut (allow-list emptied first); now give the next user a clean pod.
            # After the Deployment's own write: deleting its pods moves its status, and so its
            # resourceVersion, which a write after this would then find changed, every time.
            # Before the external Service is freed, which is what lets the next claim in.
            actions.append(ResetPods(naming.app_selector(appdef.spec_name, instance.id),
                                     *_deployment_id(obj)))
    actions.extend(_released(instance, appdef_name))
    return Plan(State.OUTDATED if outdated else State.FREE, None,
                _guard_reset(instance, _claim_guard_first(instance, actions)), releasing)


def _released(instance: InstanceView, appdef_name: str) -> list[Report]:
    """A Normal `Released` event on the Session the external Service was still claimed for:
    the plan it ends clears (or deletes) that trace, so it is reported once per release (a
    plan that fails and runs again raises the same Event's count). Last in the plan: after
    the writes that release. Names the instance, never the user.

    The Session is read from the Service's owner reference, else (the garbage collector
    removes the reference to a deleted Session, often before the release runs) from its
    session labels, the uid from the claimed-for annotation when the label is gone too."""
    ext = instance.get(Part.EXTERNAL_SERVICE)
    if ext is None:
        return []
    held = {str(r.get("uid") or ""): str(r.get("name") or "")
            for r in refs(ext) if is_session_ref(r)}
    if not held:
        labels = labels_of(ext)
        uid = (labels.get(v.LABEL_SESSION_UUID)
               or annotations_of(ext).get(v.ANNOTATION_CLAIMED_FOR, "").partition("/")[0])
        if uid:
            held[uid] = labels.get(v.LABEL_SESSION, "")
    return [Report(REASON_RELEASED, f"instance {instance.id} of {appdef_name} released",
                   warning=False, regarding={
                       "apiVersion": v.SESSION_API_VERSION, "kind": v.SESSION_KIND,
                       "name": name or uid, "uid": uid})
            for uid, name in held.items()]


def unguarded_deletes(instance: InstanceView, plan: Plan) -> bool:
    """Whether `plan` deletes an object (or resets the pods) of an instance whose external
    Service was not seen.

    Every other delete is tied to the external Service on the server: the retirement deletes
    it first, the replacement of an outdated part patches it first (`_claim_guard_first`),
    each with the resourceVersion read, so a claim since then makes the server refuse the
    plan. With no Service in the read there is nothing to guard with, and a read may lack it
    while holding the rest: a cache whose Service watch lags its ConfigMap watch can hold a
    claimed instance's ConfigMaps (with their current versions) and no Service saying who
    holds them. Such a plan must be decided again on a read from the server. That read
    settles it: the only jobs that create an external Service are this instance's own and a
    burst claim of it (which makes the Service first, with its holder), and both hold the
    instance's lease, which the caller holds; so a Service absent on the server stays absent
    while the plan runs. Route deletes and a free instance's Ingress rule removal count too:
    the Service is what guards them (`_guard_route_deletes`).
    """
    return (instance.get(Part.EXTERNAL_SERVICE) is None
            and any(isinstance(a, Delete | ResetPods)
                    or (plan.holder is None and isinstance(a, Patch)
                        and a.part is Part.INGRESS)
                    for a in plan.actions))


def _claim_guard_first(instance: InstanceView, actions: list[Action]) -> list[Action]:
    """Put a write to the external Service before any delete of a free instance's objects.

    A claim's deciding write is a resourceVersion-guarded patch of the external Service, so
    whichever of that claim and this plan writes the Service second is refused: a plan read
    before the claim cannot go on to delete a part of the now claimed instance. The plan's own
    write to the Service moves to the front; without one, an empty patch (the executor stamps
    its fence on it) guards the plan.
    """
    if not any(isinstance(a, Delete) and a.part is not Part.ROUTE for a in actions):
        return actions
    ext = instance.get(Part.EXTERNAL_SERVICE)
    first = next((a for a in actions if isinstance(a, Patch | Delete)
                  and a.part is Part.EXTERNAL_SERVICE), None)
    if first is None:
        if ext is None:
            return actions
        first = _patch(Part.EXTERNAL_SERVICE, ext, {}, "guard against a claim meanwhile")
        return [first, *actions]
    return [first, *(a for a in actions if a is not first)]


def _guard_reset(instance: InstanceView, actions: list[Action]) -> list[Action]:
    """Make sure a guarded write comes before a pod reset.

    The reset deletes the pods it lists when it runs, with no precondition of its own: on a
    stale read (the release was finished long ago and the instance claimed again) it would
    take the new holder's pod. A guarded write before it is refused in that case, which stops
    the plan; a release usually has one (the allow-list, the Deployment), and when it has
    none (a release resumed after a crash) an empty patch of the external Service, which
    still carries the old holder's reference, is put first. While that reference is there,
    no claim can take the instance.
    """
    for action in actions:
        if isinstance(action, Patch | Delete):
            return actions
        if isinstance(action, ResetPods):
            break
    else:
        return actions
    ext = instance.get(Part.EXTERNAL_SERVICE)
    if ext is None:
        return actions  # `unguarded_deletes`: the caller confirms on the server's view
    return [_patch(Part.EXTERNAL_SERVICE, ext, {}, "guard the pod reset"), *actions]


def _free_patch(
    part: Part, obj: Obj, appdef_name: str, appdef: AppDefinition | None
) -> dict[str, Any]:
    """The merge patch that brings an existing object to the free shape (no holder traces)."""
    patch: dict[str, Any] = {}
    current = refs(obj)
    wanted = [r for r in current if not is_session_ref(r)]
    if appdef is not None and not any(is_appdef_ref(r, appdef_name) for r in wanted):
        wanted.append(appdef.owner_reference())
    if wanted != current and wanted:  # never leave an object with zero owners
        patch.setdefault("metadata", {})["ownerReferences"] = wanted
    if part.is_service:
        stale = {k: None for k in v.SESSION_LABEL_KEYS if k in labels_of(obj)}
        if stale:
            patch.setdefault("metadata", {})["labels"] = stale
    if v.ANNOTATION_CLAIMED_FOR in annotations_of(obj):
        patch.setdefault("metadata", {})["annotations"] = {v.ANNOTATION_CLAIMED_FOR: None}
    if part is Part.EMAIL_CONFIGMAP and emails_of(obj):
        patch["data"] = {v.EMAILS_KEY: ""}
    return patch


def _deployment_id(deployment: Obj) -> tuple[str, str]:
    """The name and uid of the Deployment whose pods a reset or refresh may touch."""
    meta = meta_of(deployment)
    return str(meta.get("name") or ""), str(meta.get("uid") or "")


def _patch(part: Part, obj: Obj, patch: dict[str, Any], why: str) -> Patch:
    meta = meta_of(obj)
    return Patch(part, str(meta.get("name")), str(meta.get("resourceVersion")), patch, why)


def _delete(part: Part, obj: Obj, why: str) -> Delete:
    meta = meta_of(obj)
    return Delete(part, str(meta.get("name")), str(meta.get("uid")),
                  str(meta.get("resourceVersion")), why)
