"""A worker process's watch-fed copy of what the pool's decisions read.

controller-runtime's default client reads from shared informer caches and writes to the API
server; this is that cache for warmpool. One per worker process, shared by its threads: the
AppDefinitions, the Sessions, the PoolSchedules, the pool's Services, Deployments,
ConfigMaps, pods and ReplicaSets (their metadata alone), and the namespace's oauth2-proxy
template, each kept by a `Reflector` (list in pages, watch with bookmarks, relist on 410)
and stripped on arrival to the fields the decisions read (an informer's transform), so a
pool of thousands costs megabytes, not hundreds.

Indexes, kept up to date by every change:
- (namespace, AppDefinition name) -> its Sessions, parsed once per version; (namespace,
  spec.user as oauth2-proxy compares it, `emails.user_key`) -> that user's Sessions (for the
  sessions-per-user limit);
- Session uid -> the external Services that reference it (the deciding write of a claim), so
  a claim finds what a Session holds without looking at every instance;
- (namespace, kind, name after ``instance-<k>-``) -> k -> whether that object carries a trace
  of a holder, so a claim finds the free instances and who holds anything with set
  operations, not by looking at five objects of every instance (`instance_marks`);
- (kind, namespace, name) -> the resourceVersion and uid of the last deletion seen
  (tombstones), so a job can tell that its cache has seen a deletion.

Derived from those, so that a claim does not pass over the whole pool each time (issue #28):
each AppDefinition's Sessions as a tuple, each instance's pods' warmth combined, and what
a reader computes from the marks and the pods (`derived`: kept until an event of the
namespace's pool changes a mark or an instance's warmth). Each is changed or dropped under
the lock, in the same place as what it is derived from, and handed out as an immutable
value or as a copy.

Why reading from here is safe although it may lag behind the API server: every write the
controller makes carries a precondition (resourceVersion, uid, or "must not exist"), so a
decision taken on a stale copy is refused by the server (409) instead of applied; the caller
then reads the objects concerned directly (`offer` puts what it read here) and decides again.
Lagging can still delay work, never misapply it; and a job waits until the cache has seen the
versions that caused it (`wait_fresh`), so it cannot miss them either.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast

from warmpool.kube.api import Kube
from warmpool.kube.observe import POOL_SELECTOR, POOL_WATCHES, classify
from warmpool.kube.reflector import DELETED, Backoff, Reflector, Watched, rv_int, rv_number
from warmpool.pool import naming, routes
from warmpool.pool import vocabulary as v
from warmpool.pool.emails import user_key
from warmpool.pool.instances import holder_trace, is_session_ref
from warmpool.pool.meta import labels_of, meta_of, name_of, namespace_of, owner_refs, uid_of
from warmpool.pool.model import Session, parse_session
from warmpool.pool.parts import Part
from warmpool.pool.pods import PodState, combine, deployment_of, pod_state, strip_pod_status

log = logging.getLogger(__name__)

Obj = dict[str, Any]

APPDEFS = Watched(v.APPDEF_KIND, v.APPDEF_API_VERSION)
SESSIONS = Watched(v.SESSION_KIND, v.SESSION_API_VERSION)
#: The pool's kinds as a worker watches them (`POOL_WATCHES`: a Service's and a Deployment's
#: metadata alone, since `strip` keeps nothing else of either; the one reader of a
#: Deployment's spec, a release without its AppDefinition, asks the server:
#: `reconcile._with_own_selector`).
_POOL_WATCH = {w.kind: w for w in POOL_WATCHES}
# The Services' watch keeps an index of its own: who holds what (`referenced_by`).
SERVICES = _POOL_WATCH[Part.EXTERNAL_SERVICE.kind]
PROXY_TEMPLATE = Watched("ConfigMap", "v1", None,
                         f"metadata.name={v.NAMESPACE_PROXY_TEMPLATE}")
# Every HTTPRoute of the namespace: the shared routes are found by name (an AppDefinition's
# spec.ingressname), the Sessions' routes by the Service they send to (`routes_to`).
ROUTES = Watched(v.ROUTE_KIND, v.ROUTE_API_VERSION)
# Every Ingress of the namespace, in upstream's mode: the shared one is found by name.
INGRESSES = Watched("Ingress", "networking.k8s.io/v1")
# Every PoolSchedule of the namespace: the readers raise each AppDefinition's target by them.
SCHEDULES = Watched(v.SCHEDULE_KIND, v.SCHEDULE_API_VERSION)
# The pool's pods (their template carries the generation label, like every pool object): a
# claim takes a warm instance first (`warmpool.pool.pods.warmth`), and the pool's status
# counts the starting and failing ones, without a LIST per claim.
PODS = Watched("Pod", "v1", POOL_SELECTOR)
# The pool's ReplicaSets (they carry their pod template's labels), their metadata alone: which
# Deployment controls each, so a claim's pod refresh finds the instance's own pods here
# (`warmpool.pool.pods.split_pods`) instead of two LISTs per claim (issue #28).
REPLICA_SETS = Watched("ReplicaSet", "apps/v1", POOL_SELECTOR, metadata_only=True)
WATCHES: tuple[Watched, ...] = (APPDEFS, SESSIONS, *POOL_WATCHES, PROXY_TEMPLATE, PODS,
                                REPLICA_SETS)
#: The kinds indexed by their `app=` label (an instance's pods and ReplicaSets).
_BY_APP = (PODS, REPLICA_SETS)

#: Deletions remembered per cache, for freshness checks (the oldest are forgotten first).
TOMBSTONES = 20_000

#: Values `ClusterCache.derived` remembers at most (a few per AppDefinition); past that the
#: memo is emptied and refilled by the next reads.
DERIVED_MAX = 1024

T = TypeVar("T")

_META_DROP = ("managedFields",)


#: The name in a trigger `"<Kind>/*"`: every object of that kind in the key's namespace, up
#: to the version given (what the scheduler had seen when it resynced).
ANY_OBJECT = "*"


def _stripped_meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the object's metadata, without what no decision reads: the cached copy's own."""
    return {k: val for k, val in meta_of(obj).items() if k not in _META_DROP}


def strip(kind: str, obj: Mapping[str, Any]) -> Obj:
    """What the decisions read of `obj`; everything else is dropped as it arrives.

    Pool objects: their metadata (identity, labels, annotations with the shape hash and the
    fence, owner references) and the allow-list of an e-mail ConfigMap; of a Deployment
    neither its spec (its shape annotation says whether it is current; a release while the
    AppDefinition is invalid reads its selector from the server) nor its status. So a
    Deployment read in full (a fresh read offered here) is kept as its watch, metadata
    alone, sends it.
    AppDefinitions, Sessions, PoolSchedules and HTTPRoutes: metadata and spec (and a
    Session's and a PoolSchedule's status: the pool's job writes the latter only where it
    differs). The proxy template: its data. Pods: metadata (the ownership chain,
    the `app=` label) and of the status only whether it is Ready and why a container cannot
    start (`warmpool.pool.pods.strip_pod_status`).
    """
    out: Obj = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind") or kind,
                "metadata": _stripped_meta(obj)}
    if kind in (v.APPDEF_KIND, v.SESSION_KIND, v.SCHEDULE_KIND, v.ROUTE_KIND, "Ingress"):
        out["spec"] = obj.get("spec")
        if kind in (v.SESSION_KIND, v.SCHEDULE_KIND) and obj.get("status") is not None:
            out["status"] = obj.get("status")
    elif kind == "ConfigMap":
        data = obj.get("data") or {}
        name = out["metadata"].get("name")
        if name == v.NAMESPACE_PROXY_TEMPLATE:
            out["data"] = dict(data)
        elif classify(obj) is Part.EMAIL_CONFIGMAP:
            out["data"] = {v.EMAILS_KEY: data.get(v.EMAILS_KEY)} if v.EMAILS_KEY in data else {}
    elif kind == "Pod":
        out["status"] = strip_pod_status(obj.get("status"))
    return out


def _is_ext_service(obj: Mapping[str, Any]) -> bool:
    return obj.get("kind") == "Service" and classify(obj) is Part.EXTERNAL_SERVICE


class ClusterCache:
    """Watch-fed caches of one worker process for `namespaces` (None: all namespaces)."""

    def __init__(
        self,
        kube_factory: Callable[[], Kube],
        namespaces: Sequence[str] | None = None,
        *,
        timeout_range: tuple[float, float] = (300.0, 600.0),
        watch_routes: bool = True,
        watch_ingresses: bool = False,
        watch_schedules: bool = True,
    ) -> None:
        """`watch_routes`: keep the HTTPRoutes too (Session routes in use; the CRD must
        exist, or the cache never syncs); `watch_ingresses`: the Ingresses (upstream's mode);
        `watch_schedules`: the PoolSchedules (their CRD must exist too)."""
        self.namespaces = list(namespaces) if namespaces else None
        self.routes = watch_routes
        self.ingresses = watch_ingresses
        self.schedules_kept = watch_schedules
        watched = (*WATCHES, *((ROUTES,) if watch_routes else ()),
                   *((INGRESSES,) if watch_ingresses else ()),
                   *((SCHEDULES,) if watch_schedules else ()))
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._sessions: dict[tuple[str, str], Session] = {}
        # Each AppDefinition's Sessions in claim order, (creationTimestamp, name), kept
        # sorted as they change: the waiting order is read off it, not sorted per claim.
        self._by_appdef: dict[tuple[str, str], list[tuple[str, str]]] = {}
        # The same, as the Sessions themselves, built on the first read after a change of
        # one of them (`_index_session` drops it, under the lock, where `_by_appdef` changes):
        # a claim copies a tuple instead of looking up every Session of the pool. A tuple, so
        # no caller can change what the next one reads.
        self._sessions_of: dict[tuple[str, str], tuple[Session, ...]] = {}
        self._by_user: dict[tuple[str, str], set[str]] = {}
        self._holders: dict[str, set[tuple[str, str]]] = {}
        # Session uid -> (namespace, kind, name) of every pool object referencing it: what a
        # release must look at, whichever of its references the garbage collector left.
        self._traces: dict[str, set[tuple[str, str, str]]] = {}
        self._marks: dict[tuple[str, str, str], dict[int, bool]] = {}
        # (namespace, Service name) -> names of the session routes that send to it.
        self._routes_to: dict[tuple[str, str], set[str]] = {}
        # (kind, namespace, `app=` label) -> names of the pods (ReplicaSets) carrying it: an
        # instance's.
        self._by_app: dict[tuple[str, str, str], set[str]] = {}
        # (namespace, Deployment name after ``instance-<k>-``) -> k -> pod name -> its state:
        # the current pods of each instance's Deployment (`pods.deployment_of`), so a claim
        # reads which free instances are warm without naming each one's pods.
        self._pod_states: dict[tuple[str, str], dict[int, dict[str, PodState]]] = {}
        # The same keys -> k -> (`Warmth`, failure reason) of those pods together (`combine`),
        # updated with `_pod_states` (`_index_pods`, under the lock) for the instances an
        # event touches: a claim copies each instance's answer rather than combining its pods.
        self._warmth: dict[tuple[str, str], dict[int, tuple[str, str]]] = {}
        # namespace -> a count of the events that changed `_marks` or `_warmth` there (bumped
        # in `_index`, under the lock): what `derived` tells a current value by.
        self._pool_generation: dict[str, int] = {}
        # (namespace, key) -> (generation, value) of `derived`: immutable values only.
        self._derived: dict[tuple[str, Hashable], tuple[int, object]] = {}
        self._tombstones: OrderedDict[tuple[str, str, str], tuple[int, str]] = OrderedDict()
        self._stop = threading.Event()
        self.reflectors: dict[tuple[str | None, Watched], Reflector] = {}
        everywhere: list[str | None] = [None]  # no namespaces given: one of each for all
        for ns in self.namespaces or everywhere:
            kube = kube_factory()  # one client per namespace: its watches hold connections
            for kind in watched:
                self.reflectors[(ns, kind)] = Reflector(
                    kube, kind, ns, self._handler(kind), summarize=strip,
                    timeout_range=timeout_range, backoff=Backoff(), report_first_list=True)

    # --- life cycle -------------------------------------------------------------------------

    def start(self) -> ClusterCache:
        for r in self.reflectors.values():
            r.start(self._stop)
        return self

    def stop(self) -> None:
        self._stop.set()

    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.reflectors.values())

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(r.synced.wait(max(0.0, deadline - time.monotonic()))
                   for r in self.reflectors.values())

    def healthy(self) -> bool:
        return all(r.alive() and not r.stuck() for r in self.reflectors.values())

    def serves(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces

    # --- reads ------------------------------------------------------------------------------

    def _reflector(self, watched: Watched, namespace: str) -> Reflector:
        return self.reflectors[(None if self.namespaces is None else namespace, watched)]

    def _watched(self, kind: str, name: str) -> Watched:
        if kind == v.APPDEF_KIND:
            return APPDEFS
        if kind == v.SESSION_KIND:
            return SESSIONS
        if kind == PODS.kind:
            return PODS
        if kind == REPLICA_SETS.kind:
            return REPLICA_SETS
        if kind == PROXY_TEMPLATE.kind and name == v.NAMESPACE_PROXY_TEMPLATE:
            return PROXY_TEMPLATE
        if kind in _POOL_WATCH:
            return _POOL_WATCH[kind]
        if kind == v.ROUTE_KIND and self.routes:
            return ROUTES
        if kind == "Ingress" and self.ingresses:
            return INGRESSES
        if kind == v.SCHEDULE_KIND and self.schedules_kept:
            return SCHEDULES
        raise KeyError(f"no cache of {kind}")

    def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        """The cached (stripped) object, or None. Callers must not modify it."""
        return self._reflector(self._watched(kind, name), namespace).get(namespace, name)

    def session(self, namespace: str, name: str) -> Session | None:
        with self._lock:
            return self._sessions.get((namespace, name))

    def sessions_of(self, namespace: str, appdef: str) -> list[Session]:
        """The AppDefinition's Sessions in claim order, (creationTimestamp, name): the
        waiting order (`warmpool.pool.claim.waiting_sessions`), kept as they change.

        A new list each call (the caller's to change), copied from a tuple kept until one of
        those Sessions changes: a copy costs far less than a lookup per Session."""
        key = (namespace, appdef)
        with self._lock:
            kept = self._sessions_of.get(key)
            if kept is None:
                ordered = self._by_appdef.get(key)
                if not ordered:
                    return []  # not kept: any name may be asked for
                kept = tuple(self._sessions[(namespace, n)] for _, n in ordered
                             if (namespace, n) in self._sessions)
                self._sessions_of[key] = kept
            return list(kept)

    def sessions_of_user(self, namespace: str, user: str) -> list[Session]:
        """The Sessions of `namespace` whose spec.user names `user` as oauth2-proxy compares
        addresses (`emails.user_key`: case aside), whatever their AppDefinition."""
        with self._lock:
            names = self._by_user.get((namespace, user_key(user)), ())
            return [self._sessions[(namespace, n)] for n in names
                    if (namespace, n) in self._sessions]

    def referenced_by(self, session_uid: str) -> list[tuple[str, str]]:
        """(namespace, name) of the external Services that reference the Session `uid`."""
        with self._lock:
            return sorted(self._holders.get(session_uid, ()))

    def referenced_by_each(self, session_uids: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
        """`referenced_by` of each of `session_uids` that any external Service references
        (the others are left out), under one acquisition of the lock rather than one each."""
        with self._lock:
            return {uid: sorted(held) for uid in session_uids
                    if (held := self._holders.get(uid))}

    def routes_to(self, namespace: str, service: str) -> list[Obj]:
        """The cached session routes whose rules send to Service `service`."""
        with self._lock:
            names = sorted(self._routes_to.get((namespace, service), ()))
        return [o for n in names if (o := self.get(v.ROUTE_KIND, namespace, n)) is not None]

    def pods_of(self, namespace: str, app_selector: str) -> list[Obj]:
        """The cached (stripped) pods labelled ``app=<app_selector>``: one instance's,
        and whatever else carries its label (`warmpool.pool.pods` tells them apart)."""
        return self._of_app(PODS, namespace, app_selector)

    def replica_sets_of(self, namespace: str, app_selector: str) -> list[Obj]:
        """The cached ReplicaSets (their metadata) labelled ``app=<app_selector>``: what
        `warmpool.pool.pods.split_pods` checks the pods of `pods_of` against."""
        return self._of_app(REPLICA_SETS, namespace, app_selector)

    def _of_app(self, watched: Watched, namespace: str, app_selector: str) -> list[Obj]:
        with self._lock:
            names = sorted(self._by_app.get((watched.kind, namespace, app_selector), ()))
        return [o for n in names if (o := self.get(watched.kind, namespace, n)) is not None]

    def pod_warmth(
        self, namespace: str, names: Sequence[tuple[int | None, str]]
    ) -> dict[int, tuple[str, str]]:
        """k -> (`Warmth`, failure reason) of each instance whose Deployment is named
        ``instance-<k>-<rest>`` for a (digits, rest) of `names` (as `instance_marks`) and has
        a current pod; an instance without one is not in the answer (it is STARTING)."""
        with self._lock:
            if len(names) == 1 and names[0][0] is None:
                return dict(self._warmth.get((namespace, names[0][1]), {}))
            out: dict[int, tuple[str, str]] = {}
            for digits, rest in names:
                for k, state in self._warmth.get((namespace, rest), {}).items():
                    if digits is None or len(str(k)) == digits:
                        out[k] = state
            return out

    def derived(self, namespace: str, key: Hashable, compute: Callable[[], T]) -> T:
        """`compute()`, remembered under (namespace, key) until an event changes the
        instance marks or an instance's warmth in `namespace` (`instance_marks`,
        `pod_warmth`): what a claim derives from the whole pool is derived once per change
        of the pool, not once per claim, and not again for the status writes of the
        deployment controller and the kubelets, which change neither.

        Safe because `compute` runs under the lock (the RLock: it may call those methods),
        so the generation read with it is the one its value reflects; it must read nothing
        else of the cache, and return an immutable value, which every caller then shares."""
        with self._lock:
            generation = self._pool_generation.get(namespace, 0)
            found = self._derived.get((namespace, key))
            if found is not None and found[0] == generation:
                return cast(T, found[1])
            value = compute()
            if len(self._derived) >= DERIVED_MAX:
                self._derived.clear()
            self._derived[(namespace, key)] = (generation, value)
            return value

    def traces_of(self, session_uid: str) -> list[tuple[str, str, str]]:
        """(namespace, kind, name) of the pool objects of any part that reference the
        Session `uid`."""
        with self._lock:
            return sorted(self._traces.get(session_uid, ()))

    def instance_marks(
        self, namespace: str, kind: str, names: Sequence[tuple[int | None, str]]
    ) -> dict[int, bool]:
        """k -> whether that object carries a trace of a holder, for the cached pool objects
        of `kind` named ``instance-<k>-<rest>``, for each (digits, rest) in `names` (digits:
        only ids of that many digits; None: any)."""
        with self._lock:
            if len(names) == 1 and names[0][0] is None:
                return dict(self._marks.get((namespace, kind, names[0][1]), {}))
            out: dict[int, bool] = {}
            for digits, rest in names:
                for k, mark in self._marks.get((namespace, kind, rest), {}).items():
                    if digits is None or len(str(k)) == digits:
                        out[k] = mark
            return out

    def appdefs(self, namespace: str) -> list[Obj]:
        """Every cached AppDefinition of `namespace`: an AppDefinition is valid only together
        with the others of its namespace (warmpool.pool.validate: selector collisions)."""
        return [o for o in self._reflector(APPDEFS, namespace).items()
                if meta_of(o).get("namespace") == namespace]

    def schedules(self, namespace: str) -> list[Obj]:
        """Every cached PoolSchedule of `namespace` (none unless `watch_schedules`)."""
        if not self.schedules_kept:
            return []
        return self.items(v.SCHEDULE_KIND, namespace)

    def items(self, kind: str, namespace: str) -> list[Obj]:
        """Every cached object of `kind` in `namespace` (a scan: for resyncs and sweeps)."""
        return [o for o in self._reflector(self._watched(kind, ""), namespace).items()
                if meta_of(o).get("namespace") == namespace]

    def pool_objects(self, namespace: str) -> list[Obj]:
        """Every cached pool object of `namespace` (a scan: for resyncs and rare paths)."""
        out: list[Obj] = []
        for watched in POOL_WATCHES:
            out += [o for o in self._reflector(watched, namespace).items()
                    if meta_of(o).get("namespace") == namespace]
        return out

    def deleted(self, kind: str, namespace: str, name: str) -> bool:
        """Whether the last this cache saw of that name was its deletion."""
        with self._lock:
            return (kind, namespace, name) in self._tombstones and self.get(
                kind, namespace, name) is None

    def deleted_uid(self, kind: str, namespace: str, name: str) -> str | None:
        """The uid of the last deletion of that name this cache saw, or None."""
        with self._lock:
            tomb = self._tombstones.get((kind, namespace, name))
            return tomb[1] if tomb else None

    # --- freshness --------------------------------------------------------------------------

    def fresh(self, namespace: str, triggers: Mapping[str, str]) -> bool:
        """Whether this cache has seen every version in `triggers`.

        A trigger is `"<Kind>/<name>" -> resourceVersion` (the event or write that caused the
        job: seen once the cached object, or its deletion, is at least that new) or
        `"<Kind>/<name>#gone" -> uid` (a deletion: seen once that uid is not cached) or
        `"<Kind>/*" -> resourceVersion` (a resync's: seen once the watch of that kind in the
        namespace is past that version, `watched_past`; the scheduler's `seen_versions`).

        An object the cache does not hold, with no deletion of it remembered, is seen once its
        watch is past that version: a process started (or relisted) after the object was
        created and deleted never saw either, and would otherwise wait for ever (the long
        chaos tier, seed 12: four claims of Sessions re-created and deleted again spun for
        minutes on every worker).
        """
        for field, value in triggers.items():
            ident, _, gone = field.partition("#")
            kind, _, name = ident.partition("/")
            try:
                watched = self._watched(kind, name)
            except KeyError:
                continue  # not a kind this cache keeps: nothing to wait for
            if name == ANY_OBJECT:
                if not self.watched_past(kind, namespace, value):
                    return False
                continue
            obj = self._reflector(watched, namespace).get(namespace, name)
            if gone:
                if obj is not None and meta_of(obj).get("uid") == value:
                    return False
                continue
            want = rv_number(value)  # from Redis: bounded, 0 if not a version
            reflector = self._reflector(watched, namespace)
            with self._lock:
                tomb = self._tombstones.get((kind, namespace, name))
            if max(rv_int(obj), tomb[0] if tomb else 0) >= want:
                continue
            past = reflector.last_rv
            if obj is None and past is not None and rv_number(past) >= want:
                continue
            return False
        return True

    def watched_past(self, kind: str, namespace: str, version: str) -> bool:
        """Whether the watch of `kind` in `namespace` has brought every change up to
        resourceVersion `version` into this cache (its `last_rv` is at least that): then
        every object of that kind the server had at `version` is here, and so are their
        deletions. False when unsure (no such watch; a version that is not a plain number of
        at most 20 digits, which no API server writes)."""
        try:
            reflector = self._reflector(self._watched(kind, ""), namespace)
        except KeyError:
            return False
        past = reflector.last_rv
        if not (_plain_version(version) and past is not None and _plain_version(past)):
            return False
        return int(past) >= int(version)

    def wait_fresh(self, namespace: str, triggers: Mapping[str, str], timeout: float) -> bool:
        """Wait (at most `timeout` s) until `fresh`; every change the watches bring wakes it."""
        if not triggers:
            return True
        deadline = time.monotonic() + timeout
        with self._changed:
            while not self.fresh(namespace, triggers):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    # --- read-your-writes -------------------------------------------------------------------

    def offer(self, obj: Obj) -> None:
        """A version of an object read or written directly: kept if newer than the cache's."""
        meta = meta_of(obj)
        kind, ns, name = str(obj.get("kind") or ""), meta.get("namespace"), meta.get("name")
        if not ns or not name:
            return
        try:
            reflector = self._reflector(self._watched(kind, name), ns)
        except KeyError:
            return
        old = reflector.get(ns, name)
        summary = reflector.offer(obj)
        if summary is not None:
            self._index(reflector.watched, "MODIFIED", summary, old)

    def offer_gone(self, kind: str, namespace: str, name: str, uid: str) -> None:
        """A delete this process made (or a 404 it got): drop that uid from the cache."""
        try:
            reflector = self._reflector(self._watched(kind, name), namespace)
        except KeyError:
            return
        dropped = reflector.offer_gone(namespace, name, uid)
        if dropped is not None:
            self._index(reflector.watched, DELETED, dropped, dropped)

    # --- indexes ----------------------------------------------------------------------------

    def _handler(self, watched: Watched) -> Callable[[str, Obj, Obj | None], None]:
        def handle(event_type: str, obj: Obj, old: Obj | None) -> None:
            ns = namespace_of(obj)
            current = obj if event_type == DELETED else self._reflector(watched, ns).get(
                ns, name_of(obj)) or obj
            self._index(watched, event_type, current, old)
        return handle

    def _index(self, watched: Watched, event_type: str, obj: Obj, old: Obj | None) -> None:
        ns, name = namespace_of(obj), name_of(obj)
        with self._changed:
            if event_type == DELETED:
                key = (watched.kind, ns, name)
                self._tombstones[key] = (rv_int(obj), uid_of(obj))
                self._tombstones.move_to_end(key)
                while len(self._tombstones) > TOMBSTONES:
                    self._tombstones.popitem(last=False)
            pool_changed = False
            if watched is SESSIONS:
                self._index_session(event_type, ns, name, obj)
            elif watched is SERVICES:
                self._index_holders(event_type, ns, name, obj, old)
            elif watched is ROUTES:
                self._index_routes(event_type, ns, name, obj, old)
            if watched in _BY_APP:
                self._index_app(watched.kind, event_type, ns, name, obj, old)
            if watched is PODS:
                pool_changed = self._index_pods(event_type, ns, name, obj, old)
            if watched in POOL_WATCHES:
                pool_changed = self._index_marks(event_type, ns, watched.kind, name, obj)
                self._index_traces(event_type, ns, watched.kind, name, obj, old)
            if pool_changed:
                # Only when what `derived` values are computed from changed (a mark, an
                # instance's warmth): the deployment controller's status writes and the
                # kubelets' are most of the pool's events, and change neither. Under the
                # lock `derived` computes under, so no value is stored between the change
                # and the new count.
                self._pool_generation[ns] = self._pool_generation.get(ns, 0) + 1
            self._changed.notify_all()

    def _index_marks(self, event_type: str, ns: str, kind: str, name: str, obj: Obj) -> bool:
        """Keep the object's mark (`instance_marks`); whether the marks changed."""
        split = naming.split_instance_name(name)
        part = classify(obj)
        if split is None or part is None:
            return False
        k, rest = split
        key = (ns, kind, rest)
        if event_type == DELETED:
            marks = self._marks.get(key)
            if marks is None or k not in marks:
                return False
            del marks[k]
            if not marks:
                del self._marks[key]
            return True
        marks = self._marks.setdefault(key, {})
        mark = holder_trace(part, obj)
        if k in marks and marks[k] == mark:
            return False
        marks[k] = mark
        return True

    def _index_traces(
        self, event_type: str, ns: str, kind: str, name: str, obj: Obj, old: Obj | None
    ) -> None:
        entry = (ns, kind, name)
        for o in (old, obj):
            for ref in _session_refs(o):
                found = self._traces.get(ref)
                if found is not None:
                    found.discard(entry)
                    if not found:
                        del self._traces[ref]
        if event_type == DELETED:
            return
        for ref in _session_refs(obj):
            self._traces.setdefault(ref, set()).add(entry)

    def _index_routes(
        self, event_type: str, ns: str, name: str, obj: Obj, old: Obj | None
    ) -> None:
        for o in (old, obj):
            for service in routes.backends(o or {}):
                names = self._routes_to.get((ns, service))
                if names is not None:
                    names.discard(name)
                    if not names:
                        del self._routes_to[(ns, service)]
        if event_type == DELETED or not routes.is_session_route(obj):
            return
        for service in routes.backends(obj):
            self._routes_to.setdefault((ns, service), set()).add(name)

    def _index_pods(
        self, event_type: str, ns: str, name: str, obj: Obj, old: Obj | None
    ) -> bool:
        """Keep the pod in `_pod_states`; whether an instance's warmth (`pod_warmth`)
        changed."""
        touched: set[tuple[int, str]] = set()
        for o in (old, obj):
            split = naming.split_instance_name(deployment_of(o or {}) or "")
            if split is None:
                continue
            touched.add(split)
            by_k = self._pod_states.get((ns, split[1]))
            pods = by_k.get(split[0]) if by_k is not None else None
            if by_k is not None and pods is not None:
                pods.pop(name, None)
                if not pods:
                    del by_k[split[0]]
                    if not by_k:
                        del self._pod_states[(ns, split[1])]
        split = naming.split_instance_name(deployment_of(obj) or "")
        if event_type != DELETED and split is not None:
            self._pod_states.setdefault((ns, split[1]), {}).setdefault(split[0], {})[name] = (
                pod_state(obj))
        changed = False
        for k, rest in touched:
            changed |= self._combine_pods(ns, k, rest)
        return changed

    def _index_app(
        self, kind: str, event_type: str, ns: str, name: str, obj: Obj, old: Obj | None
    ) -> None:
        """Keep the object under its `app=` label in `_by_app`."""
        for o in (old, obj):
            app = labels_of(o or {}).get(v.LABEL_APP)
            names = self._by_app.get((kind, ns, app)) if app is not None else None
            if names is not None:
                names.discard(name)
                if not names:
                    del self._by_app[(kind, ns, str(app))]
        app = labels_of(obj).get(v.LABEL_APP)
        if event_type != DELETED and app:
            self._by_app.setdefault((kind, ns, app), set()).add(name)

    def _combine_pods(self, ns: str, k: int, rest: str) -> bool:
        """`_warmth` of one instance again, from its pods in `_pod_states` (after a change);
        whether it changed."""
        pods = self._pod_states.get((ns, rest), {}).get(k)
        if pods:
            states = self._warmth.setdefault((ns, rest), {})
            state = combine(pods.values())
            if states.get(k) == state:
                return False
            states[k] = state
            return True
        kept = self._warmth.get((ns, rest))
        if kept is None or k not in kept:
            return False
        del kept[k]
        if not kept:
            del self._warmth[(ns, rest)]
        return True

    def _index_session(self, event_type: str, ns: str, name: str, obj: Obj) -> None:
        previous = self._sessions.pop((ns, name), None)
        if previous is not None:
            self._sessions_of.pop((ns, previous.appdef), None)
            ordered = self._by_appdef.get((ns, previous.appdef))
            if ordered is not None:
                entry = (previous.created, name)
                i = bisect.bisect_left(ordered, entry)
                if i < len(ordered) and ordered[i] == entry:
                    del ordered[i]
                if not ordered:
                    del self._by_appdef[(ns, previous.appdef)]
            names = self._by_user.get((ns, user_key(previous.user)))
            if names is not None:
                names.discard(name)
                if not names:
                    del self._by_user[(ns, user_key(previous.user))]
        if event_type == DELETED:
            return
        session = parse_session(obj)
        self._sessions[(ns, name)] = session
        self._sessions_of.pop((ns, session.appdef), None)
        bisect.insort(self._by_appdef.setdefault((ns, session.appdef), []),
                      (session.created, name))
        self._by_user.setdefault((ns, user_key(session.user)), set()).add(name)

    def _index_holders(
        self, event_type: str, ns: str, name: str, obj: Obj, old: Obj | None
    ) -> None:
        for o in (old, obj):
            for ref in _session_refs(o):
                held = self._holders.get(ref)
                if held is not None:
                    held.discard((ns, name))
                    if not held:
                        del self._holders[ref]
        if event_type == DELETED or not _is_ext_service(obj):
            return
        for ref in _session_refs(obj):
            self._holders.setdefault(ref, set()).add((ns, name))


def _plain_version(raw: str) -> bool:
    """A resourceVersion this cache compares: ASCII digits, at most 20 (etcd's int64)."""
    return 0 < len(raw) <= 20 and raw.isascii() and raw.isdigit()


def _session_refs(obj: Mapping[str, Any] | None) -> Iterable[str]:
    for ref in owner_refs(obj):
        if is_session_ref(ref) and ref.get("uid"):
            yield str(ref["uid"])
