"""The invariants I1-I6 of pool-spec.md §5, checked against the cluster as it is.

Used by every integration test, the chaos suite and the demo's verdict. It reads the API server
directly and shares no state with the controller, so a controller bug cannot hide from it; it
does reuse the pure readers (names, holders) so that "instance k" means the same thing here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from warmpool.kube import observe
from warmpool.kube.api import Kube
from warmpool.pool import builders, routes
from warmpool.pool import vocabulary as v
from warmpool.pool.instances import HolderIndex, InstanceView, has_ref, refs
from warmpool.pool.meta import labels_of
from warmpool.pool.model import (
    AppDefinition,
    Session,
    parse_session,
    session_error,
)
from warmpool.pool.parts import PARTS, Part
from warmpool.pool.schedule import scheduled
from warmpool.pool.validate import validate_appdefinition


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: str
    message: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.message}"


def check(
    kube: Kube, namespace: str, *, quiet: bool = True, now: datetime | None = None
) -> list[Violation]:
    """All violations in `namespace`. With quiet=False only those that must hold at all times:
    I1 and I2 for Sessions annotated with their instance, I3, I4.

    I5's "minInstances" is the pool's target: spec.minInstances raised by the valid
    PoolSchedules' windows active at `now` (default: the current time), as the workers read
    it; the schedules are read here too, not taken from the controller."""
    now = now or datetime.now(UTC)
    schedule_items = observe.list_schedules(kube, namespace)
    appdef_items, _ = kube.list(v.APPDEF_API_VERSION, v.APPDEF_KIND, namespace)
    session_items, _ = kube.list(v.SESSION_API_VERSION, v.SESSION_KIND, namespace)
    sessions = [parse_session(o) for o in session_items]
    objects = observe.list_pool_objects(kube, namespace)
    out: list[Violation] = []

    for obj in objects:  # I4
        if not refs(obj):
            out.append(Violation("I4", f"{obj['kind']} {obj['metadata']['name']} has no owner"))

    appdefs: dict[str, AppDefinition | None] = {}
    for item in appdef_items:
        parsed = validate_appdefinition(item, appdef_items)  # as the workers judge it
        appdefs[item["metadata"]["name"]] = (scheduled(parsed, schedule_items, now)
                                             if isinstance(parsed, AppDefinition) else None)
    names = set(appdefs) | {s.appdef for s in sessions if s.appdef}
    held: dict[str, set[str]] = defaultdict(set)
    for name in sorted(names):
        appdef = appdefs.get(name)
        mine = [s for s in sessions if s.appdef == name]
        pool = observe.group_pool(objects, name, appdef, mine)
        out += _check_pool(name, appdef, pool, mine, quiet, held)
    out += _check_routes(kube, namespace, appdefs, sessions, objects, held, quiet)
    if quiet:  # I6
        for s in sessions:
            if (not s.live or session_error(s) is not None or s.appdef not in appdefs
                    or s.started_lazily):  # runs on its own Deployment: not a pool's
                continue
            ok_handled = s.status == v.STATUS_HANDLED and s.name in held[s.appdef]
            ok_waiting = s.status == v.STATUS_HANDLING and bool(s.message)
            if not (ok_handled or ok_waiting):
                out.append(Violation("I6", f"Session {s.name} is {s.status} "
                                     f"({s.message!r}) without an instance"))
    return out


def _check_pool(
    name: str, appdef: AppDefinition | None, pool: dict[int, InstanceView],
    sessions: list[Session], quiet: bool, held: dict[str, set[str]],
) -> list[Violation]:
    live = [s for s in sessions if s.live]
    index = HolderIndex(name, sessions)
    by_instance = _claimants_by_instance(pool, live)
    out = [Violation("I3", f"instance {k} of {name} is held by {sorted(who)}")
           for k, who in sorted(by_instance.items()) if len(who) > 1]
    for s in live:  # I1 and I2 for held instances
        if s.instance_id is not None:
            out += _check_held(name, appdef, pool, index, s, held)
    for k, inst in pool.items():  # I2 for free instances and I5, once quiet
        # Between a Session's end and its release the allow-list still names the old holder:
        # that is the release's work in progress, so only a quiet pool must show it empty.
        if quiet and not index.of(inst) and k not in by_instance:
            out += _check_free(name, appdef, k, inst)
    if quiet and appdef is not None and not appdef.deleting:
        for k in range(1, appdef.min_instances + 1):
            if k not in pool and k not in by_instance:
                out.append(Violation("I5", f"instance {k} of {name} is missing"))
    return out


def _claimants_by_instance(
    pool: dict[int, InstanceView], live: list[Session],
) -> dict[int, set[str]]:
    """The names of the live Sessions that claim each instance: by their annotation, or by
    their reference on its external Service."""
    by_instance: dict[int, set[str]] = defaultdict(set)
    for s in live:
        if s.instance_id is not None:
            by_instance[s.instance_id].add(s.name)
    for k, inst in pool.items():
        ext = inst.get(Part.EXTERNAL_SERVICE)
        for r in refs(ext):
            if r.get("kind") == v.SESSION_KIND and any(s.uid == r.get("uid") for s in live):
                by_instance[k].add(str(r.get("name")))
    return by_instance


def _check_held(
    name: str, appdef: AppDefinition | None, pool: dict[int, InstanceView], index: HolderIndex,
    s: Session, held: dict[str, set[str]],
) -> list[Violation]:
    """I1 and I2 for the instance live Session `s` is annotated with (noting it in `held`
    where `s` is its holder)."""
    assert s.instance_id is not None
    out: list[Violation] = []
    inst = pool.get(s.instance_id, InstanceView(s.instance_id, {}))
    top = index.of(inst)
    if top and top[0].uid == s.uid:
        held[name].add(s.name)
    for part in PARTS:
        obj = inst.get(part)
        if obj is None:
            out.append(Violation("I1", f"Session {s.name} holds instance {s.instance_id} of "
                                 f"{name} but its {part.name} is missing"))
            continue
        owners = refs(obj)
        need = [s.owner_reference()] + ([appdef.owner_reference()] if appdef else [])
        for ref in need:
            if not has_ref(owners, ref):
                out.append(Violation("I1", f"{part.kind} {obj['metadata']['name']} of "
                                     f"Session {s.name} is not owned by {ref['kind']}"))
    email = inst.get(Part.EMAIL_CONFIGMAP)
    if email is not None and _emails(email) != s.user:
        out.append(Violation("I2", f"allow-list of instance {s.instance_id} of {name} does "
                             f"not hold exactly the user of Session {s.name}"))
    return out


def _check_free(
    name: str, appdef: AppDefinition | None, k: int, inst: InstanceView,
) -> list[Violation]:
    """I2 and I5 for free instance `k` of a quiet pool."""
    out: list[Violation] = []
    email = inst.get(Part.EMAIL_CONFIGMAP)
    if email is not None and _emails(email).strip():
        out.append(Violation("I2", f"free instance {k} of {name} has a non-empty allow-list"))
    if appdef is None:
        return out
    if k > appdef.min_instances and inst.existing():
        out.append(Violation("I5", f"free instance {k} of {name} exists above "
                             f"minInstances={appdef.min_instances} (the target)"))
    elif k <= appdef.min_instances:
        for part in PARTS:
            obj = inst.get(part)
            gen = labels_of(obj).get(v.LABEL_GENERATION) if obj else None
            if gen != str(appdef.generation):
                state = "missing" if obj is None else f"at generation {gen}"
                out.append(Violation("I5", f"free instance {k} of {name}: {part.name} is "
                                     f"{state}"))
    return out


def _check_routes(
    kube: Kube, namespace: str, appdefs: Mapping[str, AppDefinition | None],
    sessions: list[Session], objects: list[dict[str, Any]], held: Mapping[str, set[str]],
    quiet: bool,
) -> list[Violation]:
    """session-lifecycle §1 and §3. At all times, R3: a session route to instance k exists only
    while k's allow-list is its Session's user (the route is made after the list is the
    holder's and deleted before it is cleared; a list deleted by hand is I1's to report). Once
    quiet, R1: a Session that holds k of an AppDefinition whose shared route exists has its
    route, sending to k's external Service; R2: every session route sends to an instance its
    Session holds. Skipped where the cluster serves no HTTPRoutes."""
    try:
        every, _ = kube.list(v.ROUTE_API_VERSION, v.ROUTE_KIND, namespace)
    except Exception:  # no Gateway API here (the discovery error is the client's own type)
        return []
    shared_names = {str(r["metadata"]["name"]) for r in every if not routes.is_session_route(r)}
    by_name = {str(r["metadata"]["name"]): r for r in every if routes.is_session_route(r)}
    users = {s.uid: s.user for s in sessions}
    live = {s.uid: s for s in sessions if s.live}
    out: list[Violation] = []
    lists: dict[str, str] = {}  # external Service name -> its instance's allow-list
    holder_of: dict[str, tuple[str, int, str]] = {}  # route name -> (pool, k, Service)
    for name, appdef in appdefs.items():
        if appdef is None:
            continue
        mine = [s for s in sessions if s.appdef == name]
        index = HolderIndex(name, mine)
        for k, inst in observe.group_pool(objects, name, appdef, mine).items():
            service = builders.object_name(appdef, Part.EXTERNAL_SERVICE, k)
            email = inst.get(Part.EMAIL_CONFIGMAP)
            if email is not None:
                lists[service] = _emails(email)
            top = index.of(inst)
            if top and top[0].name in held[name]:
                route_name = routes.route_name(top[0].uid)
                holder_of[route_name] = (name, k, service)
                if quiet and appdef.ingress_name in shared_names and route_name not in by_name:
                    out.append(Violation("R1", f"Session {top[0].name} holds instance {k} of "
                                         f"{name} but has no route"))
    for route_name, route in sorted(by_name.items()):
        uid = routes.session_uid_of(route)
        for service in sorted(routes.backends(route)):
            if service in lists and uid in users and lists[service] != users[uid]:
                out.append(Violation("R3", f"route {route_name} sends to {service}, whose "
                                     "allow-list is not its Session's user"))
        if not quiet:
            continue
        target = holder_of.get(route_name)
        holder = live.get(uid)
        if holder is None or holder.name not in held[holder.appdef]:
            out.append(Violation("R2", f"route {route_name} has no live holder"))
        elif target is not None and routes.backends(route) != {target[2]}:
            out.append(Violation("R1", f"route {route_name} sends to "
                                 f"{sorted(routes.backends(route))}, not to {target[2]}"))
    return out


def _emails(obj: Mapping[str, Any]) -> str:
    return (obj.get("data") or {}).get(v.EMAILS_KEY) or ""
