"""`warmpool status`: each pool of a namespace as the controller sees it, and what went wrong.

`pool_status` is pure (API objects in, a JSON-ready dict out) so the rules are unit-tested;
the command only lists the objects and renders the dict.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import click

from warmpool.cli.config import KubeConfig, json_option, kube_options
from warmpool.cli.errors import NotFound
from warmpool.cli.output import Out, age, console, emit_json, escape, joined, redact, table
from warmpool.kube.observe import group_pool
from warmpool.pool import routes
from warmpool.pool import vocabulary as v
from warmpool.pool.claim import pool_facts, waiting_sessions
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
from warmpool.pool.schedule import (
    effective_target,
    next_change,
    parse_schedule,
    rfc3339,
    valid_schedules,
)

Obj = Mapping[str, Any]

#: Warning Event reasons the controller records (warmpool/controller, warmpool/pool/decide).
CONTROLLER_REASONS = frozenset(
    {"InvalidAppDefinition", "InvalidSession", "ForeignOwner", "InstanceConflict", "InvalidUser"}
)
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
) -> dict[str, Any]:
    """The JSON document of `warmpool status` (see the command's help for its keys).
    `route_items`: the namespace's session routes (None: routes are not in use);
    `schedule_items`: its PoolSchedules, read at `now` (default: the current time)."""
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
        waiting = [s.name for s in waiting_sessions(pool_facts(views), index)]
        counts = {state: sum(1 for i in instances if i["state"] == state) for state in STATES}
        counts["outdated"] = sum(1 for i in instances if i["outdated"])
        counts["waiting"] = len(waiting)
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
        })

    other: list[dict[str, Any]] = []
    if only is None:
        other = [_session_error(s) for s in sessions
                 if s.live and s.status == v.STATUS_ERROR and s.appdef not in appdef_uids]
        other += _event_errors(by_pool.get(None, []))
    return {"namespace": namespace, "appdefinitions": pools,
            "errors": other[:errors_limit], "errors_total": len(other)}


def _schedule_entry(obj: Obj, appdef: AppDefinition | None) -> dict[str, Any]:
    parsed = parse_schedule(obj, appdef)
    return {"name": str(meta_of(obj).get("name")),
            "valid": not isinstance(parsed, Invalid),
            "message": redact(parsed.message) if isinstance(parsed, Invalid) else "ok"}


# --- rendering ------------------------------------------------------------------------------

def _print_errors(out: Out, errors: list[dict[str, Any]], total: int, now: datetime) -> None:
    shown = f" ({len(errors)} of {total})" if total > len(errors) else ""
    out.print(f"[bold]recent errors[/]{shown}")
    t = table("age", "reason", "object", "message")
    for e in errors:
        seen = _parse_time(e["last_seen"])
        when = age((now - seen).total_seconds()) if seen else "-"
        count = f" x{e['count']}" if e["count"] > 1 else ""
        t.add_row(when, e["reason"] + count, e["object"], e["message"])
    out.print(t)


def render(doc: dict[str, Any], now: datetime | None = None) -> None:
    out = console()
    now = now or datetime.now(UTC)
    if not doc["appdefinitions"]:
        out.print(f"no AppDefinitions in namespace {doc['namespace']}", markup=False)
    for pool in doc["appdefinitions"]:
        out.print(f"[bold]{escape(pool['name'])}[/]  "
                  + escape(f"minInstances {pool['minInstances']}  maxInstances "
                           f"{pool['maxInstances']}  generation {pool['generation']}  "
                           f"(namespace {doc['namespace']})"))
        if not pool["valid"]:
            out.print(f"[red]invalid, left as it is:[/] {escape(pool['problem'] or '')}")
        if pool["schedules"]:
            names = joined([sch["name"] for sch in pool["schedules"]])
            nxt = pool["nextChange"] or "none ahead"
            out.print(escape(f"target {pool['target']} (scheduled by {names}; next change "
                             f"{nxt})"))
            for sch in pool["schedules"]:
                if not sch["valid"]:
                    out.print(f"[red]PoolSchedule {escape(sch['name'])} is invalid, ignored:[/] "
                              f"{escape(sch['message'])}")
        c = pool["counts"]
        extra = "".join(f"  {s} {c[s]}" for s in ("starting", "releasing", "removing") if c[s])
        out.print(f"free {c['free']}  claimed {c['claimed']}  outdated {c['outdated']}  "
                  f"waiting {c['waiting']}{extra}")
        if pool["instances"]:
            t = table("id", "state", "objects", "session", "route", "url")
            for i in pool["instances"]:
                state = i["state"] + (" (old generation)" if i["outdated"]
                                      and i["state"] != "outdated" else "")
                holder = i["session"] or ""
                if i["also_claimed_by"]:
                    holder += f" (also: {', '.join(i['also_claimed_by'])})"
                url = i["url"] if i["url"] else ("not yet" if i["url"] == "" else "")
                t.add_row(str(i["id"]), state, f"{i['objects']}/{len(PARTS)}", holder,
                          i["route"] or "", url)
            out.print(t)
        if pool["waiting"]:
            out.print(f"waiting, oldest first: {escape(joined(pool['waiting']))}")
        if pool["errors"]:
            _print_errors(out, pool["errors"], pool["errors_total"], now)
        out.print()
    if doc["errors"]:
        out.print(f"[bold]namespace {escape(doc['namespace'])}[/] (not tied to one "
                  "AppDefinition)")
        _print_errors(out, doc["errors"], doc["errors_total"], now)


@click.command("status")
@click.argument("appdef", required=False)
@kube_options
@click.option("--errors", "errors_limit", type=click.IntRange(min=0), default=5,
              show_default=True, help="Recent errors shown per AppDefinition.")
@json_option
def status(appdef: str | None, kube: KubeConfig, errors_limit: int, as_json: bool) -> None:
    """Each pool of the namespace (or only APPDEF): its size, free, claimed, outdated and
    waiting counts, which Session holds which instance, and recent errors.

    The target is minInstances raised by the AppDefinition's PoolSchedules (the windows
    active now, capped by maxInstances); where a schedule names the pool, the target, its
    next change and each schedule that is invalid (and so ignored) are shown.

    Recent errors are the controller's Warning Events (InvalidAppDefinition, InvalidSession,
    ForeignOwner, InstanceConflict, InvalidUser), repeated ones grouped, newest first, and
    Sessions in ERROR with their message. Sessions are named, never their users.

    States: claimed (held by a Session); free (claimable now); outdated (free but from an
    older AppDefinition generation: replaced soon); starting (objects missing); releasing
    (a holder's traces being removed); removing (free, above the target). The count
    "outdated" counts every instance from an older generation, claimed ones too (those are
    refreshed when released).

    \b
    JSON (--json):
      {"namespace", "appdefinitions": [POOL], "errors": [ERROR], "errors_total"}
      POOL: {"name", "valid", "problem", "generation", "minInstances",
        "maxInstances", "target": int|null, "nextChange": RFC 3339|null,
        "schedules": [{"name", "valid", "message"}], "counts": {"claimed",
        "free", "outdated", "starting", "releasing", "removing", "waiting"},
        "instances": [{"id", "state", "session", "also_claimed_by", "objects",
        "outdated", "route": "ok"|"missing"|"elsewhere"|null, "url": str|null}],
        "waiting": [Session names, oldest first], "errors": [ERROR],
        "errors_total"}
      ERROR: {"source": "event"|"session", "reason", "object", "message",
        "count", "last_seen"}
      The top-level "errors" are those not tied to one AppDefinition.
    """
    client, namespace = kube.connect()
    appdefs, _ = client.list(v.APPDEF_API_VERSION, v.APPDEF_KIND, namespace)
    if appdef is not None and not any(meta_of(a).get("name") == appdef for a in appdefs):
        raise NotFound(f"AppDefinition {appdef!r} not found in namespace {namespace!r}; "
                       f"'warmpool status -n {namespace}' lists those there")
    from warmpool.kube.observe import list_pool_objects, list_schedules, list_session_routes
    from warmpool.pool.builders import PoolSettings

    sessions, _ = client.list(v.SESSION_API_VERSION, v.SESSION_KIND, namespace)
    events, _ = client.list("v1", "Event", namespace)
    route_items = (list_session_routes(client, namespace)
                   if PoolSettings.from_env(os.environ).routing else None)
    doc = pool_status(namespace, appdefs, sessions, list_pool_objects(client, namespace), events,
                      only=appdef, errors_limit=errors_limit, route_items=route_items,
                      schedule_items=list_schedules(client, namespace))
    if as_json:
        emit_json(doc)
    else:
        render(doc)
