"""Watch events to work keys: the scheduler's whole decision, as pure functions.

The scheduler holds no pool state. For every event on a watched object it names the keys
whose jobs must look again; the jobs read the cluster themselves and decide. To map a
deletion it only needs a little of the last state it saw, so the watch caches keep a *stub*
per object (``summarize``): the object's identity, the few fields the mapping reads, and a
digest of everything but its status, so that a status-only change (a Deployment's replica
counts, a Session's ``lastActivity``, the controller's own status writes) maps to nothing.

Rules (see the README of the scheduler in ``scheduler/__init__.py``):

- AppDefinition added, deleted, or modified with a new ``metadata.generation`` (or a new
  deletionTimestamp) -> ``PoolKey``: the resync job fans out to its instances and claims.
- Session added -> ``SessionKey`` and ``TimeoutKey`` (its deadlines' job, which then waits
  for the next one as its ``requeue_after``; the pool's job names it again on every run),
  plus its ``InstanceKey`` if it is already annotated.
  Deleted, or modified with a deletionTimestamp -> its ``SessionKey`` (the claims queue: its
  job releases what the Session's uid holds, so a release never waits behind bulk work) and
  the ``InstanceKey`` of its ``theia-cloud.io/instance-id`` annotation, else the ``PoolKey``
  of its AppDefinition (a claim may be in flight, not annotated yet). Otherwise modified ->
  ``SessionKey`` and, if annotated, its ``InstanceKey``.
- HTTPRoute: a Session's route (Theia Cloud's session labels) -> the ``InstanceKey`` of each
  instance it sends to (before and after), under its Session's AppDefinition, else that
  Session's ``SessionKey`` (unless deleted: a Session unknown here is gone or not yet seen,
  and a route holds nothing); any other route (a shared one) -> the ``PoolKey`` of each
  AppDefinition whose ``spec.ingressname`` names it (its claims wait for it).
- Ingress (upstream's mode) added or deleted -> the ``PoolKey`` of each AppDefinition naming
  it. Its modifications map to nothing: the workers edit it for every claim and release,
  and a rule removed by hand is restored by the periodic resync.
- PoolSchedule added, deleted or modified (not its status) -> the ``PoolKey`` of the
  AppDefinition it names (before and after): the pool's target may have changed. The
  boundaries of its windows are the pool job's own timer (its ``requeue_after``).
- Pool object (Service, Deployment, ConfigMap) added, modified or deleted -> ``InstanceKey``
  of the AppDefinition named by its owner reference and the id in its name; without such a
  reference (the Java operator strips it) -> the ``PoolKey`` of each owning Session's
  AppDefinition if known; with no owner reference at all, added or modified -> the
  namespace's ``SweepKey`` (its job deletes the object if its AppDefinition is gone, else
  queues its instance: reliability.md, finding 18); else nothing (debug log).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from warmpool.keys import InstanceKey, Key, PoolKey, SessionKey, SweepKey, TimeoutKey
from warmpool.kube import reflector
from warmpool.pool import naming, routes
from warmpool.pool import vocabulary as v
from warmpool.pool.grammar import is_object_name
from warmpool.pool.instances import is_appdef_ref, is_session_ref
from warmpool.pool.meta import annotations_of, labels_of, meta_of, name_of, owner_refs
from warmpool.pool.model import parse_instance_id
from warmpool.pool.parts import POOL_KIND_NAMES

log = logging.getLogger(__name__)

ADDED, MODIFIED, DELETED, EVENT_TYPES = reflector.ADDED, reflector.MODIFIED, reflector.DELETED, \
    reflector.EVENT_TYPES

APPDEF = v.APPDEF_KIND
SESSION = v.SESSION_KIND
ROUTE = v.ROUTE_KIND
INGRESS = "Ingress"
SCHEDULE = v.SCHEDULE_KIND

Obj = Mapping[str, Any]
# (namespace, session name) -> that Session's spec.appDefinition, if the scheduler knows it.
SessionAppdef = Callable[[str, str], str | None]
# (namespace, route name) -> the AppDefinitions whose spec.ingressname names that route.
RoutedBy = Callable[[str, str], list[str]]

_DIGEST_SKIP_META = ("resourceVersion", "managedFields")
# Bookkeeping other controllers write into metadata that no decision reads: the deployment
# controller stamps every new Deployment with its revision, which would otherwise run each
# created instance a second time.
_DIGEST_SKIP_ANNOTATIONS = ("deployment.kubernetes.io/revision",)


def digest(obj: Obj) -> str:
    """A short hash of everything a job could react to: the object without its status,
    resourceVersion and managedFields. Equal digests mean a status-only change."""
    meta = {k: val for k, val in meta_of(obj).items() if k not in _DIGEST_SKIP_META}
    if meta.get("annotations"):
        meta["annotations"] = {k: val for k, val in meta["annotations"].items()
                               if k not in _DIGEST_SKIP_ANNOTATIONS}
    body = {k: val for k, val in obj.items() if k not in ("metadata", "status")}
    body["metadata"] = meta
    raw = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()


def summarize(kind: str, obj: Obj) -> dict[str, Any]:
    """The stub a watch cache keeps for `obj`: object-shaped, so ``keys_for`` reads a stub
    (a tombstone after a relist) exactly like the full object."""
    meta = meta_of(obj)
    stub_meta: dict[str, Any] = {
        k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "generation",
                             "deletionTimestamp") if meta.get(k) is not None
    }
    stub: dict[str, Any] = {"kind": kind, "metadata": stub_meta, "digest": digest(obj)}
    if kind == SESSION:
        instance = annotations_of(obj).get(v.ANNOTATION_INSTANCE_ID)
        if instance is not None:
            stub_meta["annotations"] = {v.ANNOTATION_INSTANCE_ID: instance}
        appdef = (obj.get("spec") or {}).get("appDefinition")
        if appdef:
            stub["spec"] = {"appDefinition": appdef}
    elif kind in (APPDEF, SCHEDULE):
        # The whole spec (AppDefinitions and schedules are few): a schedule maps to its
        # AppDefinition's pool, a pool's resync is named by it, and the routes map by
        # spec.ingressname.
        spec = obj.get("spec")
        if isinstance(spec, Mapping):
            stub["spec"] = dict(spec)
    elif kind == ROUTE:
        labels = labels_of(obj)
        if routes.is_session_route(obj):
            stub_meta["labels"] = {k: labels[k] for k in (v.LABEL_COMPONENT, v.LABEL_PART_OF)}
            stub_meta["ownerReferences"] = [
                {k: r.get(k) for k in ("apiVersion", "kind", "name", "uid")}
                for r in owner_refs(obj) if is_session_ref(r)]
            stub["spec"] = {"rules": [{"backendRefs": [
                {"name": name} for name in sorted(routes.backends(obj))]}]}
    elif kind in POOL_KIND_NAMES:
        refs = [{k: r.get(k) for k in ("apiVersion", "kind", "name", "uid")}
                for r in owner_refs(obj)
                if is_appdef_ref(r) or is_session_ref(r)]
        if refs:
            stub_meta["ownerReferences"] = refs
    return stub


def _digest_of(obj: Obj) -> str:
    return str(obj["digest"]) if "digest" in obj else digest(obj)


def changed(obj: Obj, old: Obj | None, kept_digest: str | None = None) -> bool:
    """False only when `old` is known and differs from `obj` in status alone. `kept_digest`:
    `obj`'s `digest`, where the caller has it already (the stub its watch cache just kept)."""
    return old is None or (kept_digest or _digest_of(obj)) != _digest_of(old)


def instance_id(obj: Obj | None) -> int | None:
    # The workers' reading exactly ('²'.isdigit() is True, but int('²') raises).
    return parse_instance_id(annotations_of(obj).get(v.ANNOTATION_INSTANCE_ID))


def _named(value: object) -> str | None:
    """`value` if it can be an AppDefinition's or Session's metadata.name, else None.

    Every name a key holds between its `/`s passes here first: a reference read from an
    object anyone may write (a Session's or PoolSchedule's spec.appDefinition, an owner
    reference's name) is bounded by the DNS-1123 subdomain grammar (warmpool.pool.grammar),
    so no key is made that the queue cannot parse ('a/b') or that names no possible object.
    The Session's own claim job reports the bad reference (ERROR, InvalidSession event).
    """
    return value if isinstance(value, str) and is_object_name(value) else None


def session_appdef(obj: Obj | None) -> str | None:
    """The AppDefinition a Session names (spec.appDefinition) if it can name one, or None."""
    return _named(((obj or {}).get("spec") or {}).get("appDefinition"))


def schedule_appdef(obj: Obj | None) -> str | None:
    """The AppDefinition a PoolSchedule names (spec.appDefinition), or None."""
    return _named(((obj or {}).get("spec") or {}).get("appDefinition"))


def _ref_names(refs: Iterable[Mapping[str, Any]], is_kind: Callable[..., bool]) -> list[str]:
    """The names of the owner references of one kind that can be object names (an owner
    reference's name is not checked by the API server beyond being non-empty)."""
    return [name for r in refs if is_kind(r) and (name := _named(r.get("name"))) is not None]


def _unique(keys: Iterable[Key]) -> list[Key]:
    return list(dict.fromkeys(keys))


def keys_for(
    kind: str,
    event_type: str,
    obj: Obj,
    old_obj: Obj | None = None,
    *,
    session_appdef_of: SessionAppdef | None = None,
    routed_by: RoutedBy | None = None,
    kept_digest: str | None = None,
) -> list[Key]:
    """The keys to add for one watch event (or one difference found by a relist).

    `obj` is the object as the event carries it (for a deletion found by a relist: the stub
    the cache kept); `old_obj` the previous state the cache kept (a stub or a full object),
    None if unknown. `session_appdef_of` looks up a Session's AppDefinition for pool objects
    owned only by Sessions. `kept_digest`: `obj`'s `digest`, if the caller has it already.
    """
    if event_type not in EVENT_TYPES:
        return []
    if event_type == MODIFIED and not changed(obj, old_obj, kept_digest):
        return []
    ns = meta_of(obj).get("namespace") or meta_of(old_obj).get("namespace")
    if not ns:
        return []
    if kind == APPDEF:
        return _appdef_keys(ns, event_type, obj, old_obj)
    if kind == SESSION:
        return _session_keys(ns, event_type, obj, old_obj)
    if kind in POOL_KIND_NAMES:
        return _pool_object_keys(kind, ns, event_type, obj, old_obj, session_appdef_of)
    if kind == ROUTE:
        return _route_keys(ns, event_type, obj, old_obj, session_appdef_of, routed_by)
    if kind == SCHEDULE:
        return _unique(PoolKey(ns, a) for o in (obj, old_obj)
                       if (a := schedule_appdef(o)) is not None)
    if kind == INGRESS and event_type != MODIFIED:
        name = name_of(obj)
        return [PoolKey(ns, a) for a in (routed_by(ns, name) if routed_by else [])]
    return []


def _route_keys(
    ns: str, event_type: str, obj: Obj, old: Obj | None, lookup: SessionAppdef | None,
    routed_by: RoutedBy | None,
) -> list[Key]:
    name = name_of(obj)
    if not any(routes.is_session_route(o) for o in (obj, old) if o is not None):
        return [PoolKey(ns, a) for a in (routed_by(ns, name) if routed_by else [])]
    keys: list[Key] = []
    ids = sorted({k for o in (obj, old) if o is not None for service in routes.backends(o)
                  if (k := naming.instance_id_from_name(service)) is not None})
    sessions = {name for o in (obj, old) if o is not None
                for name in _ref_names(owner_refs(o), is_session_ref)}
    for session in sorted(sessions):
        appdef = _named(lookup(ns, session)) if lookup is not None else None
        if appdef and ids:
            keys += [InstanceKey(ns, appdef, k) for k in ids]
        elif appdef or event_type != DELETED:
            keys.append(SessionKey(ns, session))
        # A deleted route of a Session this scheduler does not know: the garbage collector
        # removing a deleted Session's route (or the Session not seen yet, whose own event
        # queues its claim). Nothing to do either way: a route holds nothing, and its
        # Session's key ran for the Session's deletion (issue #28: a release ran 3 times).
    return _unique(keys)


def _appdef_keys(ns: str, event_type: str, obj: Obj, old: Obj | None) -> list[Key]:
    name = meta_of(obj).get("name")
    if not name:
        return []
    key = PoolKey(ns, name)
    if event_type in (ADDED, DELETED) or old is None:
        return [key]
    meta, old_meta = meta_of(obj), meta_of(old)
    if meta.get("generation") != old_meta.get("generation"):
        return [key]
    if meta.get("deletionTimestamp") and not old_meta.get("deletionTimestamp"):
        return [key]
    return []


def _session_keys(ns: str, event_type: str, obj: Obj, old: Obj | None) -> list[Key]:
    name = meta_of(obj).get("name")
    if not name:
        return []
    appdef = session_appdef(obj) or session_appdef(old)
    k = instance_id(obj) or instance_id(old)
    if event_type == DELETED or meta_of(obj).get("deletionTimestamp"):
        # The release: its own key first (the claims queue: the claim job releases whatever
        # the Session's uid still holds, ahead of bulk work), and the instance it holds, or
        # (claim in flight) its whole pool, as the rule that needs no index.
        if appdef and k:
            return [SessionKey(ns, name), InstanceKey(ns, appdef, k)]
        if appdef:
            return [SessionKey(ns, name), PoolKey(ns, appdef)]
        return []  # without an AppDefinition it never claimed anything
    keys: list[Key] = [SessionKey(ns, name)]
    if event_type == ADDED and appdef:
        # Its deadlines (its AppDefinition's): the job ends it past them, else waits for the
        # next (requeue_after).
        keys.append(TimeoutKey(ns, name))
    if appdef:
        keys += [InstanceKey(ns, appdef, i) for i in (instance_id(obj), instance_id(old)) if i]
        old_appdef = session_appdef(old)
        if old_appdef and old_appdef != appdef and instance_id(old):
            keys.append(InstanceKey(ns, old_appdef, instance_id(old)))  # type: ignore[arg-type]
    return _unique(keys)


def _pool_object_keys(
    kind: str, ns: str, event_type: str, obj: Obj, old: Obj | None, lookup: SessionAppdef | None
) -> list[Key]:
    name = name_of(obj)
    refs = [*owner_refs(obj), *owner_refs(old)]
    appdefs = _ref_names(refs, is_appdef_ref)
    k = naming.instance_id_from_name(name)
    if appdefs:
        return _unique(InstanceKey(ns, a, k) if k else PoolKey(ns, a) for a in appdefs)
    keys: list[Key] = []
    for session in _ref_names(refs, is_session_ref):
        appdef = _named(lookup(ns, session)) if lookup is not None else None
        if appdef:
            keys.append(PoolKey(ns, appdef))
    if not keys and event_type != DELETED and not owner_refs(obj) and k:
        # Nothing owns it: no other key would ever reach it (finding 18). A stub keeps only
        # these two kinds of reference, so one with a foreign owner may come here too: the
        # sweep reads the object itself.
        return [SweepKey(ns)]
    if not keys:
        log.debug("%s %s/%s has no AppDefinition owner and no known Session owner: ignored",
                  kind, ns, name)
    return _unique(keys)


def trigger(kind: str, event_type: str, obj: Obj) -> dict[str, str]:
    """The version a job caused by this event must see: `"<Kind>/<name>" -> resourceVersion`,
    or for a deletion `"<Kind>/<name>#gone" -> uid` (the queue's trigger syntax)."""
    meta = meta_of(obj)
    name = meta.get("name")
    if not name:
        return {}
    if event_type == DELETED:
        uid = meta.get("uid")
        return {f"{kind}/{name}#gone": str(uid)} if uid else {}
    rv = meta.get("resourceVersion")
    return {f"{kind}/{name}": str(rv)} if rv else {}


def merge_triggers(into: dict[str, str], more: Mapping[str, str]) -> None:
    """Fold `more` into `into`: the newest resourceVersion per object, the last uid per
    deletion (as the queue merges them)."""
    for field, value in more.items():
        old = into.get(field)
        if old is not None and "#" not in field and old.isdigit() and value.isdigit():
            value = str(max(int(old), int(value)))
        into[field] = value


def appdef_names(kind: str, stub: Obj) -> set[str]:
    """The AppDefinitions a cached object names: the resync's pool keys come from these."""
    if kind == APPDEF:
        name = meta_of(stub).get("name")
        return {name} if name else set()
    if kind == SESSION:
        appdef = session_appdef(stub)
        return {appdef} if appdef else set()
    if kind in POOL_KIND_NAMES:
        return set(_ref_names(owner_refs(stub), is_appdef_ref))
    return set()
