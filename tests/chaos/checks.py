"""What must hold once a chaos run is quiet: all of I1-I6, no lost or doubled claim,
nothing orphaned."""

from __future__ import annotations

from collections import Counter

from tests.chaos.hostile import HostileEdits
from tests.chaos.watchdog import Excusals
from tests.chaos.world import PinnedKube, World, snapshot, violations_in
from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.pool.instances import is_session_ref, refs
from warmpool.pool.model import (
    AppDefinition,
    Session,
    parse_appdefinition,
    parse_session,
    session_error,
)


def quiet_problems(kube: PinnedKube, namespaces: list[str],
                   excusals: Excusals | None = None,
                   hostile: HostileEdits | None = None) -> list[str]:
    """Everything that must hold once the system is quiet (one consistent snapshot).

    Quiet means every hostile edit is over (healed or overwritten), so `hostile.mask` changes
    nothing then; it is applied all the same, so that a check never reads a hint a hand
    wrote in place of the truth."""
    world = snapshot(kube, namespaces)
    if hostile is not None:
        world = hostile.mask(world)
    out = violations_in(world, namespaces, quiet=True)
    if excusals is not None:
        out = [x for x in out if not excusals.classify(x, world)]
    for ns in namespaces:
        out += [f"{ns}: {p}" for p in claim_problems(world, ns)]
    return out


def summary(kube: PinnedKube, namespaces: list[str]) -> str:
    """Sessions by status and instances by state, for the history."""
    world = snapshot(kube, namespaces)
    status: Counter[str] = Counter()
    for ns in namespaces:
        for s in map(parse_session, world.sessions[ns]):
            status[s.status + ("+id" if s.instance_id else "")] += 1
    objects = sum(len(o) for o in world.objects.values())
    return f"Sessions {dict(status)}, {objects} pool objects"


def claim_problems(world: World, ns: str) -> list[str]:
    """Zero lost or doubled claims, bad Sessions in ERROR, nothing orphaned."""
    out: list[str] = []
    appdefs: dict[str, AppDefinition | None] = {}
    for item in world.appdefs[ns]:
        parsed = parse_appdefinition(item)
        appdefs[item["metadata"]["name"]] = parsed if isinstance(parsed, AppDefinition) else None
    sessions = [parse_session(o) for o in world.sessions[ns]]
    live = [s for s in sessions if s.live]
    ext_refs = _external_refs(world, ns)
    held_by: dict[tuple[str, int], list[str]] = {}
    for s in live:
        if s.instance_id is not None:
            held_by.setdefault((s.appdef, s.instance_id), []).append(s.name)
        out += _session_problems(s, ext_refs.get(s.uid, []), appdefs)
    for (app, k), names in held_by.items():
        if len(names) > 1:
            out.append(f"doubled claim: instance {k} of {app} is held by {sorted(names)}")
    out += _waiting_beside_free(appdefs, live, held_by)
    existing = {o["metadata"]["uid"] for o in world.appdefs[ns]} | {s.uid for s in sessions}
    for obj in world.objects[ns]:
        owners = refs(obj)
        if owners and not any(r.get("uid") in existing for r in owners):
            out.append(f"orphan: {obj['kind']} {obj['metadata']['name']} has no existing owner")
    return out


def _external_refs(world: World, ns: str) -> dict[str, list[tuple[str, int]]]:
    """Session uid -> the external Services (name, instance id) that reference it."""
    ext_refs: dict[str, list[tuple[str, int]]] = {}
    for obj in world.objects[ns]:
        labels = (obj["metadata"].get("labels") or {})
        if obj["kind"] != "Service" or labels.get(v.LABEL_SERVICE_TYPE) == "internal":
            continue
        k = naming.instance_id_from_name(obj["metadata"]["name"])
        for r in refs(obj):
            if is_session_ref(r):
                ext_refs.setdefault(str(r.get("uid")), []).append((obj["metadata"]["name"], k or 0))
    return ext_refs


def _session_problems(s: Session, mine: list[tuple[str, int]],
                      appdefs: dict[str, AppDefinition | None]) -> list[str]:
    """What is wrong with live Session `s`, referenced by the external Services `mine`."""
    out: list[str] = []
    if len(mine) > 1:
        out.append(f"doubled claim: Session {s.name} is referenced by {len(mine)} instances "
                   f"{sorted(n for n, _ in mine)}")
    error = session_error(s)
    if error is not None or (s.appdef not in appdefs and s.instance_id is None):
        if s.status != v.STATUS_ERROR or not s.message:
            out.append(f"Session {s.name} ({error or 'unknown AppDefinition'}) is "
                       f"{s.status}, not ERROR with a message")
        return out
    if s.appdef not in appdefs:  # held before its AppDefinition went: keeps it
        # HANDLED, or ERROR naming the missing AppDefinition (what the controller writes
        # today; pool-spec §4 asks ERROR for "a Session naming an unknown AppDefinition").
        if s.status not in (v.STATUS_HANDLED, v.STATUS_ERROR) or not s.message:
            out.append(f"Session {s.name} of deleted {s.appdef} holds {s.instance_id} "
                       f"but is {s.status} ({s.message!r})")
        return out
    if s.status == v.STATUS_HANDLED and (s.instance_id is None or not mine):
        out.append(f"lost claim: Session {s.name} is HANDLED without an instance")
    return out


def _waiting_beside_free(appdefs: dict[str, AppDefinition | None], live: list[Session],
                         held_by: dict[tuple[str, int], list[str]]) -> list[str]:
    """Lost claims: Sessions that wait while instances of their pool's target are free."""
    out: list[str] = []
    for app, appdef in appdefs.items():
        if appdef is None or appdef.deleting:
            continue
        waiting = [s.name for s in live if s.appdef == app and s.instance_id is None
                   and session_error(s) is None and s.status != v.STATUS_ERROR]
        free = [k for k in range(1, appdef.min_instances + 1) if (app, k) not in held_by]
        if waiting and free:
            out.append(f"lost claim: {sorted(waiting)} wait while instances {free} of {app} "
                       "are free")
    return out
