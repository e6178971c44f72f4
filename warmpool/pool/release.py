"""A release while the AppDefinition does not parse (issue #27, point 3). Pure.

An invalid AppDefinition (`warmpool scale --min 5001`, `requestsCpu: "1 Gi"`) used to stop
every decision about its instances, releases included: a Session that ended meanwhile kept its
allow-list entry, its running pod and its route or Ingress rule, so the ended user kept the
IDE until someone fixed the spec. A release needs nothing of the spec: it takes a holder's
traces off objects that exist. So it is decided here from what the instance's own objects say
(their owner references, labels and allow-list; the Deployment's own selector for the pod
reset; the external Service's name for the Ingress rule), in the order of every release
(README "A release leaves a trail", `decide._free`): route or Ingress rule first, allow-list
emptied, pods reset, the Session's reference on the external Service removed last. What needs
the spec waits until it is valid again: creating, replacing at a new generation, deleting
above minInstances, and everything about a live holder's instance.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from warmpool.pool import ingress, routes
from warmpool.pool import vocabulary as v
from warmpool.pool.actions import Action, Report, ResetPods
from warmpool.pool.builders import PoolSettings

# A release's own patch shapes and guards, from the module that decides every other release:
# one implementation of each, so that this plan cannot drift from `decide._free`'s.
from warmpool.pool.decide import (
    Plan,
    State,
    _delete,
    _deployment_id,
    _free_patch,
    _guard_reset,
    _guard_route_deletes,
    _patch,
    rightful_instance,
)
from warmpool.pool.instances import InstanceView, Obj, holders, release_markers
from warmpool.pool.meta import labels_of, meta_of
from warmpool.pool.model import Invalid, Session
from warmpool.pool.parts import PARTS, Part

# A label value Kubernetes accepts (at most 63 characters, alphanumeric at both ends).
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True, slots=True)
class OwnFacts:
    """What an instance's own objects say in place of its AppDefinition's spec.

    `pod_selector`: the `app` label the instance's Deployment selects its pods by, None when
    it cannot be read (`problem` says why); `external_service`: the external Service's name
    (what the instance's Ingress rule sends to), None when the Service does not exist.
    """

    pod_selector: str | None
    external_service: str | None
    problem: str | None = None


def own_facts(instance: InstanceView) -> OwnFacts:
    """Read `OwnFacts` off the instance's objects.

    The pod selector is the Deployment's spec.selector.matchLabels.app: immutable once the
    Deployment exists (apps/v1 refuses a change, and refuses a pod template its selector
    does not match), so it is the selector warmpool built for the instance. Bounded all the
    same, since the reset deletes every pod it selects: a label value ending in "-<id>", as
    `naming.app_selector` makes it, and the same value as the `app` label of each of the
    instance's Services (as `builders.build` writes them all). One foreign edit (a
    Service's label, a Deployment re-created by hand) cannot point the reset at another
    pool's pods; a value that fails is not used (no pod is deleted on it) and reported.
    """
    ext = instance.get(Part.EXTERNAL_SERVICE)
    service = meta_of(ext).get("name") if ext is not None else None
    service = service if isinstance(service, str) and service else None
    deployment = instance.get(Part.DEPLOYMENT)
    if deployment is None:
        return OwnFacts(None, service)  # no Deployment, no pods of it to reset
    raw = _dig(deployment, "spec", "selector", "matchLabels", v.LABEL_APP)
    others = [labels_of(obj).get(v.LABEL_APP)
              for part in (Part.INTERNAL_SERVICE, Part.EXTERNAL_SERVICE)
              if (obj := instance.get(part)) is not None]
    if (isinstance(raw, str) and _LABEL_VALUE.fullmatch(raw)
            and raw.endswith(f"-{instance.id}") and all(o == raw for o in others)):
        return OwnFacts(raw, service)
    shown = repr(raw)[:80]
    return OwnFacts(None, service, problem=(
        f"Deployment {meta_of(deployment).get('name')}: spec.selector.matchLabels."
        f"{v.LABEL_APP} is {shown}, which is not instance {instance.id}'s `app` label as its "
        "Services carry it: its pods are not reset (the allow-list is emptied all the "
        "same)"))


def _dig(obj: Mapping[str, Any], *path: str) -> Any:
    value: Any = obj
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def decide_release_without_definition(
    instance: InstanceView,
    appdef_name: str,
    invalid: Invalid,
    sessions: Sequence[Session],
    *,
    settings: PoolSettings,
    held_elsewhere: Mapping[str, frozenset[int]] | None = None,
    shared_ingress: Obj | None = None,
) -> Plan:
    """The plan for instance `instance` of the invalid AppDefinition `appdef_name`: the
    release of a holder that is gone, and nothing else. Its state is `State.INVALID`.

    An instance a live Session holds is left as it is (as before: its spec cannot be read).
    `shared_ingress`: in Ingress mode, the Ingress `invalid.ingress_name` names, as read.
    `held_elsewhere`: as for `decide.decide_instance` (a double claim is released here too).

    Every write is guarded as any release's is, so a plan decided on a stale read is
    refused: each patch of the instance's objects carries the resourceVersion read (and the
    executor stamps the lease's fence on it); the Ingress patch carries the Ingress's
    resourceVersion (no fence: not the instance's object); a route delete carries the
    route's uid and resourceVersion, and an empty patch of the external Service at the
    version read goes before it (`_guard_route_deletes`); the pod reset comes after a
    guarded write (`_guard_reset`) and deletes only the pods it lists, by uid. Without the
    external Service in the read, the caller decides again on the server's view first
    (`decide.unguarded_deletes`).
    """
    claimants = [s for s in holders(instance, appdef_name, sessions)
                 if rightful_instance(s, (held_elsewhere or {}).get(s.uid), instance.id)
                 == instance.id]
    if claimants:
        return Plan(State.INVALID, claimants[0])
    facts = own_facts(instance)
    releasing = release_markers(instance)
    # The route first, then the Ingress rule: once the allow-list is empty, a path that still
    # leads here would lead a browser to a 403 (session-lifecycle §3, §4).
    actions: list[Action] = [
        _delete(Part.ROUTE, r, f"instance {instance.id} is free (AppDefinition invalid)")
        for r in routes.stray_routes(instance.routes, None)]
    if settings.ingress and shared_ingress is not None and facts.external_service:
        rules = ingress.without_backend(shared_ingress, facts.external_service)
        if rules is not None:
            actions.append(_patch(Part.INGRESS, shared_ingress, {"spec": {"rules": rules}},
                                  f"rule of instance {instance.id} removed: free"))
    for part in PARTS:  # release order: the allow-list first, the external Service last
        obj = instance.get(part)
        if obj is None:
            continue
        # No AppDefinition reference is added (its uid is not known here); none is removed.
        patch = _free_patch(part, obj, appdef_name, None)
        if patch:
            actions.append(_patch(part, obj, patch, "released (AppDefinition invalid)"))
        if part is Part.DEPLOYMENT and releasing:
            if facts.pod_selector is not None:
                # Access is cut (allow-list emptied above); the next user gets a clean pod.
                actions.append(ResetPods(facts.pod_selector, *_deployment_id(obj)))
            elif facts.problem is not None:
                actions.append(Report("PodsNotReset", facts.problem, regarding={
                    "kind": part.kind, "name": str(meta_of(obj).get("name"))}))
    if not actions:
        return Plan(State.INVALID, None)
    actions = _guard_route_deletes(instance, actions, free=True)
    actions = _guard_reset(instance, actions)
    regarding = {"apiVersion": v.APPDEF_API_VERSION, "kind": v.APPDEF_KIND, "name": appdef_name}
    reason = Report("ReleasedWithoutDefinition",
                    f"instance {instance.id} released while AppDefinition {appdef_name} is "
                    f"invalid ({invalid.message}); it is neither made nor removed until the "
                    "AppDefinition is fixed", warning=False, regarding=regarding)
    return Plan(State.INVALID, None, [*actions, reason] if releasing else actions, releasing)
