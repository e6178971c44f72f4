"""`warmpool status`: each pool of a namespace as the controller sees it, and what went wrong.

`pool_status` is pure (API objects in, a JSON-ready dict out) so the rules are unit-tested;
the command only lists the objects and renders the dict.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from warmpool.cli.output import Column, Output, Table, age, joined, output_options, redact
from warmpool.config import KubeConfig, kube_options
from warmpool.errors import BadValue, NotFound
from warmpool.kube.observe import group_pool
from warmpool.pool import ingress as shared_ingress
from warmpool.pool import naming, routes
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings
from warmpool.pool.claim import pool_facts, waiting_sessions
from warmpool.pool.health import find_condition
from warmpool.pool.instances import HolderIndex, InstanceView, release_markers
from warmpool.pool.meta import labels_of, meta_of, uid_of
from warmpool.pool.model import (
    AppDefinition,
    Invalid,
    Session,
    parse_appdefinition,
    parse_session,
)
from warmpool.pool.parts import PARTS, POOL_KIND_NAMES, Part
from warmpool.pool.pods import warmth
from warmpool.pool.schedule import (
    effective_target,
    next_change,
    parse_schedule,
    rfc3339,
    valid_schedules,
)

if TYPE_CHECKING:
    from warmpool.kube.api import Kube

Obj = Mapping[str, Any]

#: Warning Event reasons the controller records (warmpool/controller, warmpool/pool/decide).
CONTROLLER_REASONS = frozenset(
    {"InvalidAppDefinition", "InvalidSession", "ForeignOwner", "InstanceConflict", "InvalidUser",
     "PodsFailing"}
)
#: What a free instance's pod is (`warmpool.pool.pods.Warmth`): how "free" splits.
POD_STATES = ("warm", "starting", "failing")
STATES = ("claimed", "free", "outdated", "starting", "releasing", "removing")


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _route_state(holder: Session | None, route_by_name: Mapping[str, Obj] | None,
                 service: str | None) -> str | None:
    """A holder's route: "ok" (sends to its instance), "missing", "elsewhere" (edited to
    send to another Service); None without a holder or where routes are not in use."""
    if holder is None or route_by_name is None:
        return None
    route = route_by_name.get(routes.route_name(holder.uid))
    if route is None:
        return "missing"
    return "ok" if service is None or routes.backends(route) == {service} else "elsewhere"


def _ingress_state(ingress: Obj | None, appdef: AppDefinition, k: int,
                   settings: PoolSettings) -> str:
    """A holder's rule on the shared Ingress (upstream's routing): "ok" (its path sends to
    the instance), "missing" (no such path, or no Ingress), "elsewhere" (its path sends to
    another Service)."""
    if ingress is None:
        return "missing"
    rules = shared_ingress.with_rule(ingress, appdef, k, settings)
    if rules is None:
        return "ok"
    spec = ingress.get("spec")
    had = spec.get("rules") if isinstance(spec, Mapping) else None
    return "missing" if len(rules) > len(had if isinstance(had, list) else []) else "elsewhere"


def _instance(inst: InstanceView, min_instances: int | None,
              generation: int | None, index: HolderIndex,
              route_by_name: Mapping[str, Obj] | None = None,
              urls: Mapping[str, str] | None = None) -> dict[str, Any]:
    held = index.of(inst)
    existing = inst.existing()
    outdated = generation is not None and any(
        labels_of(obj).get(v.LABEL_GENERATION) != str(generation) for _, obj in existing)
    if held:
        state = "claimed"
    elif release_markers(inst):
        state = "releasing"
    elif min_instances is not None and inst.id > min_instances:
        state = "removing"
    elif len(existing) < len(PARTS):
        state = "starting"
    elif outdated:
        state = "outdated"
    else:
        state = "free"
    return {
        "id": inst.id,
        "state": state,
        "session": held[0].name if held else None,
        "also_claimed_by": [s.name for s in held[1:]],
        "objects": len(existing),
        "outdated": outdated,
        "route": _route_state(held[0] if held else None, route_by_name,
                              meta_of(inst.get(Part.EXTERNAL_SERVICE)).get("name")),
        # status.url of the holder: "" until the instance answers (or with HANDLED)
        "url": (urls or {}).get(held[0].name, "") if held else None,
    }


def _when(event: Obj) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime")
               or meta_of(event).get("creationTimestamp") or "")


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _attribute(event: Obj, appdefs: Mapping[str, str], session_pool: Mapping[str, str]
               ) -> str | None:
    """The AppDefinition an event is about, when that can be told; `appdefs` maps name -> uid."""
    involved = event.get("involvedObject") or {}
    kind, name = involved.get("kind"), str(involved.get("name") or "")
    if kind == v.APPDEF_KIND:
        return name
    if kind == v.SESSION_KIND:
        return session_pool.get(name)
    if kind in POOL_KIND_NAMES:
        found = [a for a, uid in appdefs.items() if uid and uid[-12:] in name]
        return found[0] if len(found) == 1 else None
    # Namespace-wide reports (InstanceConflict, InvalidUser, ...) name Sessions in the text.
    message = str(event.get("message") or "")
    pools = {pool for session, pool in session_pool.items()
             if pool and re.search(rf"(?<![\w.-]){re.escape(session)}(?![\w.-])", message)}
    return pools.pop() if len(pools) == 1 else None


def _event_errors(events: Iterable[Obj]) -> list[dict[str, Any]]:
    """Repeated reports (the controller records one Event per occurrence) grouped, newest first."""
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for event in events:
        involved = event.get("involvedObject") or {}
        obj = f"{involved.get('kind', '?')}/{involved.get('name', '?')}"
        reason = str(event.get("reason"))
        message = redact(str(event.get("message") or ""))
        entry = groups.setdefault((reason, obj, message), {
            "source": "event", "reason": reason, "object": obj, "message": message,
            "count": 0, "last_seen": None})
        entry["count"] += int(event.get("count") or 1)
        when = _when(event)
        if when and (entry["last_seen"] is None or when > entry["last_seen"]):
            entry["last_seen"] = when
    return sorted(groups.values(), key=lambda e: e["last_seen"] or "", reverse=True)


def _session_error(s: Session) -> dict[str, Any]:
    return {"source": "session", "reason": "SessionError", "object": f"Session/{s.name}",
            "message": redact(s.message), "count": 1, "last_seen": None}


def pool_status(
    namespace: str,
    appdef_items: Sequence[Obj],
    session_items: Sequence[Obj],
    pool_objects: list[dict[str, Any]],
    event_items: Sequence[Obj],
    *,
    only: str | None = None,
    errors_limit: int = 5,
    route_items: Sequence[Obj] | None = None,
    schedule_items: Sequence[Obj] = (),
    now: datetime | None = None,
    pod_items: Sequence[Obj] | None = None,
    ingress_items: Sequence[Obj] | None = None,
    settings: PoolSettings | None = None,
) -> dict[str, Any]:
    """The JSON document of `warmpool status` (see the command's help for its keys).
    `route_items`: the namespace's session routes (None: routes are not in use);
    `ingress_items`: its Ingresses where holders are routed by a rule on the shared one
    (upstream's routing; None: not), judged with `settings` (host, paths, suffix);
    `schedule_items`: its PoolSchedules, read at `now` (default: the current time);
    `pod_items`: the pool's pods (None: not read, free instances are not split)."""
    now = now or datetime.now(UTC)
    sessions = [parse_session(o) for o in session_items]
    route_by_name = (None if route_items is None
                     else {str(meta_of(r).get("name")): r for r in route_items})
    urls = {str(meta_of(o).get("name")): str((o.get("status") or {}).get("url") or "")
            for o in session_items}
    session_pool = {s.name: s.appdef for s in sessions}
    appdef_uids = {str(meta_of(a).get("name")): uid_of(a) for a in appdef_items}
    warnings = [e for e in event_items
                if e.get("type") == "Warning" and e.get("reason") in CONTROLLER_REASONS]
    by_pool: dict[str | None, list[Obj]] = {}
    for event in warnings:
        pool = _attribute(event, appdef_uids, session_pool)
        by_pool.setdefault(pool if pool in appdef_uids else None, []).append(event)

    pods_by_app: dict[str, list[Obj]] | None = None
    if pod_items is not None:
        pods_by_app = {}
        for pod in pod_items:
            pods_by_app.setdefault(labels_of(pod).get(v.LABEL_APP, ""), []).append(pod)
    pools = []
    for item in sorted(appdef_items, key=lambda a: str(meta_of(a).get("name"))):
        name = str(meta_of(item).get("name"))
        if only is not None and name != only:
            continue
        spec = item.get("spec") or {}
        parsed = parse_appdefinition(item)
        appdef = parsed if isinstance(parsed, AppDefinition) else None
        generation = _int_or_none(meta_of(item).get("generation"))
        schedules = [o for o in schedule_items
                     if (o.get("spec") or {}).get("appDefinition") == name]
        target, next_at = None, None
        if appdef is not None:
            valid = valid_schedules(appdef, schedules)
            target = effective_target(appdef, valid, now)
            next_at = rfc3339(next_change(appdef, valid, now))
        min_i = target if target is not None else _int_or_none(spec.get("minInstances"))
        mine = [s for s in sessions if s.appdef == name]
        views = group_pool(pool_objects, name, appdef, mine)
        ids = set(views) | {s.instance_id for s in mine if s.live and s.instance_id}
        if target is not None:
            ids |= set(range(1, target + 1))
        empty = dict.fromkeys(PARTS)
        index = HolderIndex(name, mine)
        instances = [_instance(views.get(k) or InstanceView(k, empty), min_i, generation, index,
                               route_by_name, urls)
                     for k in sorted(ids)]
        for i in instances:
            i["pod"] = (_pod_of(views.get(i["id"]), appdef, pods_by_app)
                        if pods_by_app is not None and appdef is not None else None)
            if ingress_items is not None and appdef is not None and i["session"]:
                shared = next((o for o in ingress_items
                               if meta_of(o).get("name") == appdef.ingress_name), None)
                i["route"] = _ingress_state(shared, appdef, i["id"], settings or PoolSettings())
        waiting = [s.name for s in waiting_sessions(pool_facts(views), index)]
        counts = {state: sum(1 for i in instances if i["state"] == state) for state in STATES}
        counts["outdated"] = sum(1 for i in instances if i["outdated"])
        counts["waiting"] = len(waiting)
        # The free instances by their pod: warm (Ready: a claim waits for nothing),
        # starting, failing (an image pull error, a crash loop).
        for pod_state in POD_STATES:
            counts[f"free_{pod_state}"] = sum(1 for i in instances if i["state"] == "free"
                                              and i["pod"] == pod_state)
        failing = find_condition(item.get("status"))
        errors = [_session_error(s) for s in mine if s.live and s.status == v.STATUS_ERROR]
        errors += _event_errors(by_pool.get(name, []))
        pools.append({
            "name": name,
            "valid": appdef is not None,
            "problem": None if appdef is not None else redact(getattr(parsed, "message", "")),
            "generation": generation,
            "minInstances": spec.get("minInstances"),
            "maxInstances": spec.get("maxInstances"),
            # The pool's size now: minInstances raised by its PoolSchedules (null: invalid).
            "target": target,
            "nextChange": next_at,
            "schedules": [_schedule_entry(o, appdef) for o in
                          sorted(schedules, key=lambda o: str(meta_of(o).get("name")))],
            "counts": counts,
            "instances": instances,
            "waiting": waiting,
            "errors": errors[:errors_limit],
            "errors_total": len(errors),
            # The pool's own condition (warmpool.pool.health): its pods fail to start.
            "podsFailing": (redact(str(failing.get("message") or ""))[:1000]
                            if failing is not None and failing.get("status") == "True"
                            else None),
        })

    other: list[dict[str, Any]] = []
    if only is None:
        other = [_session_error(s) for s in sessions
                 if s.live and s.status == v.STATUS_ERROR and s.appdef not in appdef_uids]
        other += _event_errors(by_pool.get(None, []))
    return {"namespace": namespace, "appdefinitions": pools,
            "errors": other[:errors_limit], "errors_total": len(other)}


def _pod_of(view: InstanceView | None, appdef: AppDefinition,
            pods_by_app: Mapping[str, list[Obj]]) -> str | None:
    """The instance's pod as `warmpool.pool.pods.warmth` says (None: no Deployment)."""
    if view is None or view.get(Part.DEPLOYMENT) is None:
        return None
    selector = naming.app_selector(appdef.spec_name, view.id)
    return warmth(pods_by_app.get(selector, []),
                  str(meta_of(view.get(Part.DEPLOYMENT)).get("name")))[0]


def _schedule_entry(obj: Obj, appdef: AppDefinition | None) -> dict[str, Any]:
    parsed = parse_schedule(obj, appdef)
    return {"name": str(meta_of(obj).get("name")),
            "valid": not isinstance(parsed, Invalid),
            "message": redact(parsed.message) if isinstance(parsed, Invalid) else "ok"}


# --- rendering ------------------------------------------------------------------------------

def _print_errors(out: Output, errors: list[dict[str, Any]], total: int, now: datetime) -> None:
    shown = f" ({len(errors)} of {total})" if total > len(errors) else ""
    out.heading(f"recent errors{shown}")
    t = Table("age", "reason", Column("count", wide=True), "object", "message")
    for e in errors:
        seen = _parse_time(e["last_seen"])
        when = age((now - seen).total_seconds()) if seen else "-"
        count = f" x{e['count']}" if e["count"] > 1 and not out.wide else ""
        t.add_row(when, e["reason"] + count, e["count"], e["object"], e["message"])
    out.table(t)


def render(doc: dict[str, Any], out: Output, now: datetime | None = None) -> None:
    now = now or datetime.now(UTC)
    if not doc["appdefinitions"]:
        out.line(f"no AppDefinitions in namespace {doc['namespace']}")
    for pool in doc["appdefinitions"]:
        out.heading(f"{pool['name']}  minInstances {pool['minInstances']}  maxInstances "
                    f"{pool['maxInstances']}  generation {pool['generation']}  "
                    f"(namespace {doc['namespace']})")
        if not pool["valid"]:
            out.line(f"invalid, left as it is: {pool['problem'] or ''}")
        if pool["schedules"]:
            names = joined([sch["name"] for sch in pool["schedules"]])
            nxt = pool["nextChange"] or "none ahead"
            out.line(f"target {pool['target']} (scheduled by {names}; next change {nxt})")
            for sch in pool["schedules"]:
                if not sch["valid"]:
                    out.line(f"PoolSchedule {sch['name']} is invalid, ignored: {sch['message']}")
        c = pool["counts"]
        extra = "".join(f"  {s} {c[s]}" for s in ("starting", "releasing", "removing") if c[s])
        split = (f" (warm {c['free_warm']}, starting {c['free_starting']}, failing "
                 f"{c['free_failing']})" if any(i.get("pod") for i in pool["instances"]) else "")
        out.line(f"free {c['free']}{split}  claimed {c['claimed']}  outdated {c['outdated']}  "
                 f"waiting {c['waiting']}{extra}")
        if pool.get("podsFailing"):
            out.line(f"pods fail to start: {pool['podsFailing']}")
        if pool["instances"]:
            t = Table("id", "state", "pod", "objects", "session",
                      Column("also-claimed-by", wide=True), "route", Column("url", wide=True))
            for i in pool["instances"]:
                state = i["state"] + (" (old generation)" if i["outdated"]
                                      and i["state"] != "outdated" else "")
                holder = i["session"] or ""
                if i["also_claimed_by"] and not out.wide:
                    holder += f" (also: {', '.join(i['also_claimed_by'])})"
                url = i["url"] if i["url"] else ("not yet" if i["url"] == "" else "")
                t.add_row(i["id"], state, i.get("pod") or "", f"{i['objects']}/{len(PARTS)}",
                          holder, joined(i["also_claimed_by"]), i["route"], url)
            out.table(t)
        if pool["waiting"]:
            out.line(f"waiting, oldest first: {joined(pool['waiting'])}")
        if pool["errors"]:
            _print_errors(out, pool["errors"], pool["errors_total"], now)
        out.line()
    if doc["errors"]:
        out.heading(f"namespace {doc['namespace']} (not tied to one AppDefinition)")
        _print_errors(out, doc["errors"], doc["errors_total"], now)


def namespace_status(client: Kube, namespace: str, appdef: str | None,
                     errors_limit: int) -> dict[str, Any]:
    """`pool_status` of one namespace, from the objects listed there now."""
    from warmpool.kube.kinds import settle_routes
    from warmpool.kube.observe import list_pool_objects, list_schedules, list_session_routes

    appdefs, _ = client.list(v.APPDEF_API_VERSION, v.APPDEF_KIND, namespace)
    sessions, _ = client.list(v.SESSION_API_VERSION, v.SESSION_KIND, namespace)
    events, _ = client.list("v1", "Event", namespace)
    # From the API server's watch cache ("0": any recent state): a status is a glance. By the
    # `app` label every instance's pods carry (`_pod_of` keeps only its Deployment's), not the
    # generation label: the pods Java made on upstream's line have none, and were all shown
    # "starting" while they ran.
    pods, _ = client.list("v1", "Pod", namespace, label_selector=v.LABEL_APP,
                          resource_version="0")
    # The routing the roles run with: WARMPOOL_ROUTES, else what the install has (upstream's
    # shared Ingress, the fork's HTTPRoutes), so that on upstream's line a status read
    # without the roles' settings does not call every holder's route "missing".
    settings, _ = settle_routes(client, PoolSettings.from_env(os.environ), os.environ)
    route_items = list_session_routes(client, namespace) if settings.routing else None
    ingress_items = (client.list("networking.k8s.io/v1", "Ingress", namespace)[0]
                     if settings.ingress else None)
    return pool_status(namespace, appdefs, sessions, list_pool_objects(client, namespace),
                       events, only=appdef, errors_limit=errors_limit, route_items=route_items,
                       schedule_items=list_schedules(client, namespace), pod_items=pods,
                       ingress_items=ingress_items, settings=settings)


def _has(doc: dict[str, Any], appdef: str) -> bool:
    return any(p["name"] == appdef for p in doc["appdefinitions"])


@click.command("status")
@click.argument("appdef", required=False)
@kube_options
@click.option("--all-namespaces", "-A", "all_namespaces", is_flag=True,
              help="Every namespace that has AppDefinitions (one section each), instead of "
                   "-n's; needs the right to list AppDefinitions cluster-wide.")
@click.option("--errors", "errors_limit", type=click.IntRange(min=0), default=5,
              show_default=True, help="Recent errors shown per AppDefinition.")
@output_options
def status(appdef: str | None, kube: KubeConfig, all_namespaces: bool, errors_limit: int,
           out: Output) -> None:
    """Each pool of the namespace (or only APPDEF): its size, free, claimed, outdated and
    waiting counts, which Session holds which instance, and recent errors.

    The target is minInstances raised by the AppDefinition's PoolSchedules (the windows
    active now, capped by maxInstances); where a schedule names the pool, the target, its
    next change and each schedule that is invalid (and so ignored) are shown.

    Recent errors are the controller's Warning Events (InvalidAppDefinition, InvalidSession,
    ForeignOwner, InstanceConflict, InvalidUser), repeated ones grouped, newest first, and
    Sessions in ERROR with their message. Sessions are named, never their users.

    A free instance's pod is warm (Ready: a claim takes these first), starting, or failing
    (an image pull error, a crash loop: never handed out; at 3 the pool makes no more, and
    "podsFailing" says why).

    States: claimed (held by a Session); free (claimable now); outdated (free but from an
    older AppDefinition generation: replaced soon); starting (objects missing); releasing
    (a holder's traces being removed); removing (free, above the target). The count
    "outdated" counts every instance from an older generation, claimed ones too (those are
    refreshed when released).

    \b
    -o wide: each instance's URL and every other Session claiming it (a
      column), and each error's count (a column).
    -o json | -o yaml:
      {"namespace", "appdefinitions": [POOL], "errors": [ERROR], "errors_total"}
      (with -A: {"namespaces": [that document, one per namespace]})
      POOL: {"name", "valid", "problem", "generation", "minInstances",
        "maxInstances", "target": int|null, "nextChange": RFC 3339|null,
        "schedules": [{"name", "valid", "message"}], "counts": {"claimed",
        "free", "free_warm", "free_starting", "free_failing", "outdated",
        "starting", "releasing", "removing", "waiting"},
        "instances": [{"id", "state", "pod": "warm"|"starting"|"failing"|null,
        "session", "also_claimed_by", "objects", "outdated",
        "route": "ok"|"missing"|"elsewhere"|null (the holder's HTTPRoute, or
        its rule on the shared Ingress), "url": str|null}],
        "waiting": [Session names, oldest first], "errors": [ERROR],
        "errors_total", "podsFailing": str|null}
      ERROR: {"source": "event"|"session", "reason", "object", "message",
        "count", "last_seen"}
      The top-level "errors" are those not tied to one AppDefinition.
    """
    if all_namespaces and kube.namespace_flag:
        raise BadValue("give -n/--namespace or -A/--all-namespaces, not both")
    client, namespace = kube.connect()
    if all_namespaces:
        listed, _ = client.list(v.APPDEF_API_VERSION, v.APPDEF_KIND, None)
        names = sorted({str(meta_of(a).get("namespace")) for a in listed})
        docs = [namespace_status(client, ns, appdef, errors_limit) for ns in names]
        if appdef is not None:
            docs = [d for d in docs if _has(d, appdef)]
            if not docs:
                raise NotFound(f"AppDefinition {appdef!r} not found in any namespace; "
                               "'warmpool status -A' lists them all")
        if out.document({"namespaces": docs}):
            return
        if not docs:
            out.line("no AppDefinitions in any namespace")
        for doc in docs:
            render(doc, out)
        return
    doc = namespace_status(client, namespace, appdef, errors_limit)
    if appdef is not None and not _has(doc, appdef):
        raise NotFound(f"AppDefinition {appdef!r} not found in namespace {namespace!r}; "
                       f"'warmpool status -n {namespace}' lists those there")
    if not out.document(doc):
        render(doc, out)
