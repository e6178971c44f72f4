"""Where a job's reads come from: the API server itself, or this process's watch-fed cache.

The controller's jobs read through a `Reader` and write through the executor, like a
controller-runtime reconciler with its (cached) client. `LiveReader` asks the API server on
every read (the sequential driver, the CLI, tools); `CachedReader` answers from a
`ClusterCache` and makes no request at all on the common path, which is what makes a claim
cost the same at a thousand instances as at ten.

Both return the same parsed model, so a decision cannot tell them apart; an AppDefinition
comes with its `min_instances` replaced by the pool's target at the reader's clock (its
spec.minInstances raised by the active windows of its valid PoolSchedules, capped by
maxInstances: warmpool.pool.schedule), so every decision that sizes the pool obeys the
schedule without knowing of it; what differs is how
stale a read may be, and that is made harmless by the writes (see `warmpool.kube.cache`):
after a conflict a job calls `instance(..., fresh=True)`, which reads the instance's objects
directly and, for the cache, keeps what it read.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from itertools import compress, repeat
from operator import eq, ge, itemgetter, not_
from typing import Any, Protocol

from warmpool.kube import observe
from warmpool.kube.api import Kube
from warmpool.kube.cache import ClusterCache
from warmpool.kube.clock import ApiServerClock
from warmpool.pool import builders, naming, routes
from warmpool.pool import vocabulary as v
from warmpool.pool.claim import PoolFacts, pool_facts
from warmpool.pool.emails import same_user
from warmpool.pool.grammar import is_object_name
from warmpool.pool.health import PoolHealth, pool_health
from warmpool.pool.instances import InstanceView, is_appdef_ref, is_session_ref, refs
from warmpool.pool.meta import name_of, uid_of
from warmpool.pool.model import (
    MAX_INSTANCES_CEILING,
    AppDefinition,
    Invalid,
    Session,
    parse_session,
)
from warmpool.pool.parts import PARTS, POOL_KINDS, Part
from warmpool.pool.pods import Warmth, warmth_by_instance
from warmpool.pool.pods import warmth as pod_warmth
from warmpool.pool.schedule import scheduled
from warmpool.pool.validate import validate_appdefinition

Obj = dict[str, Any]
#: What time it is, for the schedules (aware, UTC); injectable so tests fix it.
Clock = Callable[[], datetime]


def cluster_time(server_clock: ApiServerClock) -> Clock:
    """The schedules' clock on the API server's (issue #29): a pool's target and its next
    change are read at the cluster's time, never at this host's, so a worker whose wall clock
    is off grows or shrinks the pool when every other worker does."""
    return lambda: datetime.fromtimestamp(server_clock.now(), UTC)


class Reader(Protocol):
    def appdef(self, namespace: str, name: str, *, fresh: bool = False,
               as_specified: bool = False) -> AppDefinition | Invalid | None:
        """An AppDefinition by name, its min_instances the pool's target now (its schedules
        applied); `fresh`: straight from the API server; `as_specified`: its min_instances
        spec.minInstances, no schedule applied (what the schedule's own arithmetic starts
        from)."""
        ...

    def schedules(self, namespace: str) -> list[Obj]:
        """The PoolSchedule objects of `namespace`, their status included."""
        ...

    def object(self, kind: str, namespace: str, name: str, *, fresh: bool = False
               ) -> Obj | None:
        """An AppDefinition, a Session or a pool object as read (a cache's copy is stripped:
        `warmpool.kube.cache.strip`), for jobs that read fields the model does not keep as
        written (a Session's status.lastActivity); None if it does not exist. `fresh`:
        straight from the API server, whole (a Deployment's spec, which a cache does not
        keep)."""
        ...

    def now(self) -> datetime:
        """The time the schedules are read at: the API server's clock (aware, UTC)."""
        ...

    def session(self, namespace: str, name: str, *, fresh: bool = False) -> Session | None:
        """A Session by name; `fresh`: straight from the API server."""
        ...

    def sessions(self, namespace: str, appdef_name: str) -> list[Session]: ...

    def server_now_ms(self) -> int:
        """The API server's clock now, in epoch ms (`warmpool.kube.clock`: the Date of one of
        its answers, at most a minute old, carried forward on this host's monotonic clock):
        what a Session marked HANDLED records as its `lastActivity`, so that a worker whose
        wall clock is off never stamps a time the timeouts would misread. Raises
        ClockUnavailable when the server's time cannot be read (the job fails and retries:
        the host's wall clock is never the fallback)."""
        ...

    def session_gone(self, namespace: str, name: str, uid: str) -> bool:
        """Known without a request to have been deleted (that very uid); False if unsure."""
        ...

    def gone_session_uid(self, namespace: str, name: str) -> str | None:
        """The uid of the Session of that name seen deleted, while none of that name is
        known to exist; None if unknown (a reader without a watch never knows)."""
        ...

    def holdings(self, namespace: str, session_uid: str) -> list[tuple[str, int]]:
        """(AppDefinition, id) of each instance with an object that references the Session
        `uid`: what its release must free."""
        ...

    def claimed_on_server(self, namespace: str, session_uid: str) -> list[tuple[str, int]]:
        """`holdings` among the Services the API server labels with the Session's uid (one
        LIST by label, its answer the size of the Session's claims, not of the pool); a
        cache keeps what it read."""
        ...

    def user_sessions(self, namespace: str, user: str) -> list[Session]:
        """The namespace's Sessions of `user` (as oauth2-proxy compares addresses:
        `emails.user_key`), of every AppDefinition."""
        ...

    def user_sessions_as_of(self, namespace: str, user: str, version: str) -> list[Session]:
        """`user_sessions`, with every Session the API server had at resourceVersion
        `version` (the claiming Session's, as read): from a cache whose Session watch is
        past `version`, else from the server (one LIST of the namespace's Sessions: a CRD's
        spec.user has no label or field selector, so the user's are picked from it here)."""
        ...

    def instance(
        self, namespace: str, appdef_name: str, appdef: AppDefinition | None, k: int,
        sessions: Sequence[Session], *, fresh: bool = False,
    ) -> InstanceView:
        """Instance k's five objects; `fresh`: straight from the API server (after a 409)."""
        ...

    def instances(
        self, namespace: str, appdef_name: str, appdef: AppDefinition | None,
        ids: Iterable[int], sessions: Sequence[Session],
    ) -> dict[int, InstanceView]:
        """The instances with these ids that have any object (a claim's view of its pool)."""
        ...

    def pool_facts(
        self, namespace: str, appdef_name: str, appdef: AppDefinition | None,
        sessions: Sequence[Session],
    ) -> PoolFacts:
        """Which instances exist, which are clean, which Sessions they reference (a claim's
        view of the whole pool, without its objects)."""
        ...

    def referencing(self, namespace: str, appdef_name: str, session: Session, *,
                    fresh: bool = False) -> frozenset[int]:
        """Ids of the instances whose external Service references `session` (its claims);
        `fresh`: straight from the API server."""
        ...

    def pool_health(self, namespace: str, appdef: AppDefinition) -> PoolHealth | None:
        """How many of the pool's instances have a Ready pod, one starting, one that cannot
        start (`warmpool.pool.health`); None where the reader does not know the pods."""
        ...

    def pool(
        self, namespace: str, appdef_name: str, appdef: AppDefinition | None,
        sessions: Sequence[Session],
    ) -> dict[int, InstanceView]:
        """Every instance of the pool that has any object (a scan: resyncs, status)."""
        ...

    def pool_objects(self, namespace: str) -> list[Obj]:
        """Every pool object of the namespace, whatever owns it, its kind filled in (a scan:
        the sweep of objects nothing owns, `warmpool.controller.orphans`)."""
        ...

    def proxy_template(self, namespace: str) -> str | None: ...

    def route(self, namespace: str, name: str, *, fresh: bool = False,
              ask_on_miss: bool = True) -> Obj | None:
        """An HTTPRoute by name (an AppDefinition's shared route), or None. A cache that
        lacks it asks the server, unless `ask_on_miss` is False: for a caller to whom a route
        created a moment ago and not yet seen makes no difference."""
        ...

    def session_routes(self, namespace: str) -> list[Obj]:
        """Every session route of `namespace` (Theia Cloud's session labels)."""
        ...

    def instance_routes(
        self, namespace: str, service: str, holder_uids: Iterable[str], *, fresh: bool = False,
    ) -> tuple[Mapping[str, Any], ...]:
        """The session routes of one instance (`routes.routes_to_instance`): those sending to
        its external Service `service`, and the route of each of `holder_uids` by name.
        `fresh`: each read from the server (a route created since that a cache lacks is a
        holder's, found by its name; another one's is seen by its event)."""
        ...

    def ingress(self, namespace: str, name: str, *, fresh: bool = False) -> Obj | None:
        """An Ingress by name (the shared one of upstream's mode), or None."""
        ...

    def wrote(self, obj: Obj) -> None:
        """A write's response: later reads of this job must see at least this version."""
        ...

    def deleted(self, kind: str, namespace: str, name: str, uid: str) -> None: ...

    def instance_pods(
        self, namespace: str, app_selector: str
    ) -> tuple[list[Obj], list[Obj]] | None:
        """(pods, ReplicaSets) labelled ``app=<app_selector>`` as a watch-fed cache last saw
        them, possibly old (what a claim's pod refresh may act on:
        `warmpool.kube.executor.Executor._own_pods`); None without such a cache."""
        ...


class LiveReader:
    """Every read is a request to the API server (always current, cost grows with the pool)."""

    def __init__(self, kube: Kube, *, max_instances_ceiling: int = MAX_INSTANCES_CEILING,
                 routes: bool = False, clock: Clock | None = None,
                 server_clock: ApiServerClock | None = None) -> None:
        self.kube = kube
        self.max_instances_ceiling = max_instances_ceiling
        # One per process where readers are made per job (workers/handlers.py), so that the
        # server's time is asked at most once a minute, not once a job.
        self.server_clock = server_clock or ApiServerClock(kube, max_age=60.0)
        self.clock = clock or cluster_time(self.server_clock)
        # Whether Session routes are in use: instance views then carry theirs.
        self.routes = routes

    def server_now_ms(self) -> int:
        return int(self.server_clock.now() * 1000)

    def appdef(self, namespace: str, name: str, *, fresh: bool = False,
               as_specified: bool = False) -> AppDefinition | Invalid | None:
        obj = self.kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, namespace, name)
        if obj is None:
            return None
        # Valid only together with the others of its namespace (selector collisions).
        others, _ = self.kube.list(v.APPDEF_API_VERSION, v.APPDEF_KIND, namespace)
        parsed = validate_appdefinition(obj, others,
                                        max_instances_ceiling=self.max_instances_ceiling)
        if isinstance(parsed, Invalid) or as_specified:
            return parsed
        schedules = self.schedules(namespace)
        # No schedule, no need of the time (which may cost a request).
        return scheduled(parsed, schedules, self.clock()) if schedules else parsed

    def schedules(self, namespace: str) -> list[Obj]:
        return observe.list_schedules(self.kube, namespace)

    def object(self, kind: str, namespace: str, name: str, *, fresh: bool = False
               ) -> Obj | None:
        return self.kube.get(*_api_of(kind), namespace, name)

    def now(self) -> datetime:
        return self.clock()

    def session(self, namespace: str, name: str, *, fresh: bool = False) -> Session | None:
        return observe.read_session(self.kube, namespace, name)

    def sessions(self, namespace: str, appdef_name: str) -> list[Session]:
        return observe.list_sessions(self.kube, namespace, appdef_name)

    def session_gone(self, namespace: str, name: str, uid: str) -> bool:
        return False

    def gone_session_uid(self, namespace: str, name: str) -> str | None:
        return None

    def holdings(self, namespace: str, session_uid: str) -> list[tuple[str, int]]:
        return _holdings(observe.list_pool_objects(self.kube, namespace), session_uid)

    def claimed_on_server(self, namespace: str, session_uid: str) -> list[tuple[str, int]]:
        return _holdings(_labelled_services(self.kube, namespace, session_uid), session_uid)

    def user_sessions(self, namespace: str, user: str) -> list[Session]:
        return _of_user(observe.list_sessions(self.kube, namespace), user)

    def user_sessions_as_of(self, namespace: str, user: str, version: str) -> list[Session]:
        return self.user_sessions(namespace, user)

    def instance(
        self, namespace: str, appdef_name: str, appdef: AppDefinition | None, k: int,
        sessions: Sequence[Session], *, fresh: bool = False,
    ) -> InstanceView:
        if appdef is not None:
            # Its warmth unknown (None): the pods are listed for a claim's choice only
            # (`pool_facts`), not for every instance read.
            view = observe.observe_instance(self.kube, appdef, k)
            if not self.routes:
                return view
            return dataclasses.replace(view, routes=self.instance_routes(
                namespace, builders.object_name(appdef, Part.EXTERNAL_SERVICE, k),
                observe.holder_uids(view)))
        pool = observe.observe_pool(self.kube, namespace, appdef_name, None, sessions)
        return pool.get(k, InstanceView(k, {}))

    def instances(
        self, namespace: str, appdef_name: str, appdef: AppDefinition | None,
        ids: Iterable[int], sessions: Sequence[Session],
    ) -> dict[int, InstanceView]:
        if appdef is None:
            wanted = set(ids)
            pool = observe.observe_pool(self.kube, namespace, appdef_name, None, sessions)
            return {k: view for k, view in pool.items() if k in wanted}
        # Each by `instance`, as the cached reader does, so both give the same views (the
        # routes too: tests/integration/test_reader_agreement.py).
        views = {k: self.instance(namespace, appdef_name, appdef, k, sessions) for k in ids}
        return {k: view for k, view in views.items() if view.existing()}

    def pool_facts(
        self, namespace: str, appdef_name: str, appdef: AppDefinition | None,
        sessions: Sequence[Session],
    ) -> PoolFacts:
        facts = pool_facts(self.pool(namespace, appdef_name, appdef, sessions))
        if appdef is None:
            return facts
        return with_warmth(facts, appdef, self._pod_warmth(namespace, appdef))

    def _pod_warmth(self, namespace: str, appdef: AppDefinition) -> dict[int, tuple[str, str]]:
        """Each instance's warmth from the pool's pods, listed (no cache to keep them)."""
        return warmth_by_instance(observe.list_pool_pods(self.kube, namespace),
                                  _name_rests(appdef, Part.DEPLOYMENT))

    def referencing(self, namespace: str, appdef_name: str, session: Session, *,
                    fresh: bool = False) -> frozenset[int]:
        return observe.referencing(self.kube, namespace, session.uid)

    def pool(
        self, namespace: str, appdef_name: str, appdef: AppDefinition | None,
        sessions: Sequence[Session],
    ) -> dict[int, InstanceView]:
        return observe.observe_pool(self.kube, namespace, appdef_name, appdef, sessions)

    def pool_objects(self, namespace: str) -> list[Obj]:
        return observe.list_pool_objects(self.kube, namespace)

    def pool_health(self, namespace: str, appdef: AppDefinition) -> PoolHealth | None:
        # Not read: asked before each missing instance is made, it would cost this reader
        # the whole pool and its pods each time (a pool built one instance at a time, by
        # tools and the sequential driver, which make what is missing).
        return None

    def proxy_template(self, namespace: str) -> str | None:
        return observe.proxy_template(self.kube, namespace)

    def route(self, namespace: str, name: str, *, fresh: bool = False,
              ask_on_miss: bool = True) -> Obj | None:
        return observe.read_route(self.kube, namespace, name) if name else None

    def session_routes(self, namespace: str) -> list[Obj]:
        return observe.list_session_routes(self.kube, namespace) if self.routes else []

    def instance_routes(
        self, namespace: str, service: str, holder_uids: Iterable[str], *, fresh: bool = False,
    ) -> tuple[Mapping[str, Any], ...]:
        return routes.routes_to_instance(self.session_routes(namespace), service, holder_uids)

    def ingress(self, namespace: str, name: str, *, fresh: bool = False) -> Obj | None:
        return observe.read_ingress(self.kube, namespace, name) if name else None

    def wrote(self, obj: Obj) -> None:
        return None

    def deleted(self, kind: str, namespace: str, name: str, uid: str) -> None:
        return None

    def instance_pods(
        self, namespace: str, app_selector: str
    ) -> tuple[list[Obj], list[Obj]] | None:
        return None


#: kind -> apiVersion of the kinds `Reader.object` reads.
_OBJECT_KINDS: dict[str, str] = {
    v.APPDEF_KIND: v.APPDEF_API_VERSION, v.SESSION_KIND: v.SESSION_API_VERSION,
    **{kind: api_version for api_version, kind in POOL_KINDS}}


def _api_of(kind: str) -> tuple[str, str]:
    """(apiVersion, kind) of the kinds `Reader.object` reads."""
    if kind not in _OBJECT_KINDS:
        raise ValueError(f"Reader.object reads AppDefinitions, Sessions and pool objects, "
                         f"not {kind}")
    return _OBJECT_KINDS[kind], kind


def with_warmth(
    facts: PoolFacts, appdef: AppDefinition, states: Mapping[int, tuple[str, str]]
) -> PoolFacts:
    """`facts` with which of its free ids are warm and which failing (`PoolFacts.warm`),
    from each instance's (`Warmth`, reason); an id without a pod is starting."""
    free = frozenset(filter(functools.partial(ge, appdef.min_instances), facts.clean))
    return dataclasses.replace(facts, warm=free & _ids_in(states, Warmth.WARM),
                               failing=free & _ids_in(states, Warmth.FAILING))


def _ids_in(states: Mapping[int, tuple[str, str]], warmth: str) -> frozenset[int]:
    """The ids whose state is `warmth`, selected in C (a claim reads the whole pool's): a
    mapping's keys and values come in the same order."""
    return frozenset(compress(states.keys(),
                              map(eq, map(itemgetter(0), states.values()), repeat(warmth))))


def _labelled_services(
    kube: Kube, namespace: str, session_uid: str, *, since: str | None = None
) -> list[Obj]:
    """The Services of `namespace` labelled with the Session uid (a claim's deciding write
    sets the label with the owner reference, in one patch); `since`: from the API server's
    watch cache, not older than that revision (None: from etcd, `Kube.list`)."""
    service = Part.EXTERNAL_SERVICE
    items, _ = kube.list(service.api_version, service.kind, namespace,
                         label_selector=f"{v.LABEL_SESSION_UUID}={session_uid}",
                         resource_version=since)
    for item in items:
        item.setdefault("kind", service.kind)
        item.setdefault("apiVersion", service.api_version)
    return items


def _holdings(objects: Iterable[Obj], session_uid: str) -> list[tuple[str, int]]:
    """(AppDefinition, id) of the instances whose objects among `objects` reference the
    Session `session_uid` (any part: the garbage collector strips references one object at
    a time), by each object's AppDefinition owner reference and the id in its name."""
    out: set[tuple[str, int]] = set()
    for obj in objects:
        owners = refs(obj)
        if not any(is_session_ref(r) and r.get("uid") == session_uid for r in owners):
            continue
        k = naming.instance_id_from_name(name_of(obj))
        if k is not None:
            # An owner reference's name is anyone's with `patch` (the API server checks only
            # that it is not empty): bounded by the object-name grammar before it names an
            # instance key (a '/' would make one the queue cannot parse).
            out |= {(r["name"], k) for r in owners
                    if is_appdef_ref(r) and is_object_name(r.get("name"))}
    return sorted(out)


def _of_user(sessions: Iterable[Session], user: str) -> list[Session]:
    return [s for s in sessions if same_user(s.user, user)]


def _name_rests(appdef: AppDefinition, part: Part) -> tuple[tuple[int | None, str], ...]:
    """What follows ``instance-<k>-`` in the names of `part` of `appdef`'s instances: one
    text for any k, except where the name's cut depends on the number of digits of k."""
    return _rests_of(appdef.spec_name, appdef.uid, part)


@functools.lru_cache(maxsize=1024)
def _rests_of(spec_name: str, uid: str, part: Part) -> tuple[tuple[int | None, str], ...]:
    """`_name_rests`, by what the names depend on: computed once per AppDefinition and part
    (a name per digit count each time was a claim's most frequent call), immutable."""
    rests: list[tuple[int | None, str]] = []
    for digits in range(1, _MAX_DIGITS + 1):
        split = naming.split_instance_name(part.object_name(spec_name, uid, 10 ** (digits - 1)))
        assert split is not None
        rests.append((digits, split[1]))
    if len({rest for _, rest in rests}) == 1:
        return ((None, rests[0][1]),)
    return tuple(rests)


#: Instance ids have at most this many digits (pools are capped far below).
_MAX_DIGITS = 7


class CachedReader:
    """Reads from a `ClusterCache`; only `fresh` reads and cache misses reach the API server.

    A miss is read directly once: a Session or AppDefinition the cache does not know yet (the
    job may have been caused by the event that creates it) is asked for by name, so that a
    lagging watch delays nothing it was asked to do.
    """

    def __init__(self, cache: ClusterCache, kube: Kube, *,
                 max_instances_ceiling: int = MAX_INSTANCES_CEILING,
                 clock: Clock | None = None, server_clock: ApiServerClock | None = None) -> None:
        self.cache = cache
        self.kube = kube
        self.max_instances_ceiling = max_instances_ceiling
        # One per process where readers are made per job (workers/handlers.py), so that the
        # server's time is asked at most once a minute, not once a job.
        self.server_clock = server_clock or ApiServerClock(kube, max_age=60.0)
        self.clock = clock or cluster_time(self.server_clock)

    def server_now_ms(self) -> int:
        return int(self.server_clock.now() * 1000)

    def appdef(self, namespace: str, name: str, *, fresh: bool = False,
               as_specified: bool = False) -> AppDefinition | Invalid | None:
        if fresh:
            cached = self.cache.get(v.APPDEF_KIND, namespace, name)
            obj = self.kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, namespace, name)
            if obj is None:
                if cached is not None:
                    self.cache.offer_gone(v.APPDEF_KIND, namespace, name,
                                          uid_of(cached))
                return None
            obj.setdefault("kind", v.APPDEF_KIND)
            self.cache.offer(obj)
            return self._judged(obj, namespace, as_specified)
        obj = self.cache.get(v.APPDEF_KIND, namespace, name)
        if obj is None:
            if self.cache.deleted(v.APPDEF_KIND, namespace, name):
                return None  # seen deleted (and not since re-created): no need to ask
            obj = self.kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, namespace, name)
            if obj is None:
                return None
            obj.setdefault("kind", v.APPDEF_KIND)
            self.cache.offer(obj)
        return self._judged(obj, namespace, as_specified)

    def schedules(self, namespace: str) -> list[Obj]:
        return self.cache.schedules(namespace)

    def object(self, kind: str, namespace: str, name: str, *, fresh: bool = False
               ) -> Obj | None:
        if not fresh:
            cached = self.cache.get(kind, namespace, name)
            if cached is not None or self.cache.deleted(kind, namespace, name):
                return cached
        # Not seen yet, or asked for whole: ask once. The cache keeps a stripped copy; the
        # caller gets the object as the server sent it.
        obj = self.kube.get(*_api_of(kind), namespace, name)
        if obj is not None:
            obj.setdefault("kind", kind)
            self.cache.offer(obj)
        return obj

    def now(self) -> datetime:
        return self.clock()

    def _judged(self, obj: Obj, namespace: str, as_specified: bool = False
                ) -> AppDefinition | Invalid:
        """Validated with its namespace, then with its PoolSchedules applied (a schedule
        is read from the cache: one created a moment ago counts once its event arrived,
        which queues the pool again)."""
        parsed = validate_appdefinition(obj, self.cache.appdefs(namespace),
                                        max_instances_ceiling=self.max_instances_ceiling)
        if isinstance(parsed, Invalid) or as_specified:
            return parsed
        schedules = self.cache.schedules(namespace)
        # No schedule, no need of the time (which may cost a request).
        return scheduled(parsed, schedules, self.clock()) if schedules else parsed

    def session(self, namespace: str, name: str, *, fresh: bool = False) -> Session | None:
        cached = self.cache.session(namespace, name)
        if not fresh and (cached is not None
                          or self.cache.deleted(v.SESSION_KIND, namespace, name)):
            return cached
        obj = self.kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, namespace, name)
        if obj is None:
            if cached is not None:
                self.cache.offer_gone(v.SESSION_KIND, namespace, name, cached.uid)
            return None
        obj.setdefault("kind", v.SESSION_KIND)
        self.cache.offer(obj)
        return parse_session(obj)

    def sessions(self, namespace: str, appdef_name: str) -> list[Session]:
        return self.cache.sessions_of(namespace, appdef_name)

    def session_gone(self, namespace: str, name: str, uid: str) -> bool:
        return bool(uid) and self.cache.deleted_uid(v.SESSION_KIND, namespace, name) == uid

    def gone_session_uid(self, namespace: str, name: str) -> str | None:
        if not self.cache.deleted(v.SESSION_KIND, namespace, name):
            return None
        return self.cache.deleted_uid(v.SESSION_KIND, namespace, name) or None

    def holdings(self, namespace: str, session_uid: str) -> list[tuple[str, int]]:
        return _holdings([obj for ns, kind, name in self.cache.traces_of(session_uid)
                          if ns == namespace
                          and (obj := self.cache.get(kind, ns, name)) is not None], session_uid)

    def claimed_on_server(self, namespace: str, session_uid: str) -> list[tuple[str, int]]:
        # From etcd (a consistent LIST): asked only where a deciding write this cache has
        # not seen may exist (a claim retried after a failure or a crash, `reconcile._claim`;
        # a route or a rival under sessionsPerUser, rare), never on a claim's usual path.
        services = _labelled_services(self.kube, namespace, session_uid)
        for svc in services:
            self.cache.offer(svc)
        return _holdings(services, session_uid)

    def user_sessions(self, namespace: str, user: str) -> list[Session]:
        return self.cache.sessions_of_user(namespace, user)

    def user_sessions_as_of(self, namespace: str, user: str, version: str) -> list[Session]:
        # Watch events come in resourceVersion order: a Session watch past `version` has
        # brought every Session created (or deleted, or failed) before it. The usual case
        # for a claim, whose Session came by that watch: no request. A Session read directly
        # (the cache had not seen it yet) is newer than the watch: ask the server.
        if self.cache.watched_past(v.SESSION_KIND, namespace, version):
            return self.cache.sessions_of_user(namespace, user)
        # Not offered to the cache: a LIST is one snapshot, and a Session the cache saw
        # deleted since must not come back from it. The caller decides on this answer.
        # At `version`, from the API server's watch cache: not older than it, which is the
        # whole promise (every Session the server had at `version`), without an etcd scan.
        return _of_user(observe.list_sessions(self.kube, namespace, since=version), user)

    def instance(
        self, namespace: str, appdef_name: str, appdef: AppDefinition | None, k: int,
        sessions: Sequence[Session], *, fresh: bool = False,
    ) -> InstanceView:
        if appdef is None:
            found = observe.group_pool(self.cache.pool_objects(namespace), appdef_name, None,
                                       sessions)
            cached = found.get(k, InstanceView(k, {}))
            if not fresh:
                return cached
            # Without the AppDefinition the names cannot be computed, so the objects the
            # cache lacks could only be found by listing: the rare path (an AppDefinition
            # deleted and a refused write) pays three LISTs rather than miss one.
            view = observe.observe_pool(self.kube, namespace, appdef_name, None,
                                        sessions).get(k, InstanceView(k, {}))
            self._offer_view(namespace, view, cached)
            return view
        cached = InstanceView(k, {
            part: self.cache.get(part.kind, namespace, builders.object_name(appdef, part, k))
            for part in PARTS}, warmth=self.warmth(namespace, appdef, k)[0])
        if fresh:
            view = dataclasses.replace(observe.observe_instance(self.kube, appdef, k),
                                       warmth=cached.warmth)
            self._offer_view(namespace, view, cached)
            return self._with_routes(namespace, appdef, view, cached, fresh=True)
        return self._with_routes(namespace, appdef, cached, cached, fresh=False)

    def _with_routes(
        self, namespace: str, appdef: AppDefinition, view: InstanceView, cached: InstanceView,
        *, fresh: bool,
    ) -> InstanceView:
        """`view` with its session routes (`instance_routes`), its holders' and the cached
        view's."""
        if not self.cache.routes:
            return view
        service = builders.object_name(appdef, Part.EXTERNAL_SERVICE, view.id)
        uids = observe.holder_uids(view) | observe.holder_uids(cached)
        return dataclasses.replace(
            view, routes=self.instance_routes(namespace, service, uids, fresh=fresh))

    def instance_routes(
        self, namespace: str, service: str, holder_uids: Iterable[str], *, fresh: bool = False,
    ) -> tuple[Mapping[str, Any], ...]:
        """From the cache's index of routes by the Service they send to: no scan."""
        if not self.cache.routes:
            return ()
        uids = sorted(set(holder_uids))
        candidates = [*self.cache.routes_to(namespace, service),
                      *(r for uid in uids if (r := self.cache.get(
                          v.ROUTE_KIND, namespace, routes.route_name(uid))) is not None)]
        if fresh:
            names = {name_of(r) for r in candidates}
            names |= {routes.route_name(uid) for uid in uids}
            candidates = []
            for name in sorted(names):
                obj = self.route(namespace, name, fresh=True)
                if obj is not None:
                    candidates.append(obj)
        return routes.routes_to_instance(candidates, service, uids)

    def _offer_view(self, namespace: str, view: InstanceView, cached: InstanceView) -> None:
        """Teach the cache what a direct read of one instance found, absences included."""
        for part in PARTS:
            obj, old = view.get(part), cached.get(part)
            if obj is not None:
                self.cache.offer({**obj, "kind": part.kind})
            elif old is not None:
                self.cache.offer_gone(part.kind, namespace, name_of(old), uid_of(old))

    def instances(
        self, namespace: str, appdef_name: str, appdef: AppDefinition | None,
        ids: Iterable[int], sessions: Sequence[Session],
    ) -> dict[int, InstanceView]:
        if appdef is None:
            wanted = set(ids)
            return {k: view for k, view in self.pool(namespace, appdef_name, None,
                                                     sessions).items() if k in wanted}
        out: dict[int, InstanceView] = {}
        for k in ids:
            view = self.instance(namespace, appdef_name, appdef, k, sessions)
            if view.existing():
                out[k] = view
        return out

    def pool_facts(
        self, namespace: str, appdef_name: str, appdef: AppDefinition | None,
        sessions: Sequence[Session],
    ) -> PoolFacts:
        """From the cache's indexes: set operations over ids, no object looked at; what does
        not depend on `sessions` once per change of the pool (`_pool_sets`)."""
        if appdef is None:
            return pool_facts(self.pool(namespace, appdef_name, None, sessions))
        facts = self.cache.derived(
            namespace, ("pool_sets", appdef.spec_name, appdef.uid, appdef.min_instances),
            lambda: self._pool_sets(namespace, appdef))
        ext = _name_rests(appdef, Part.EXTERNAL_SERVICE)[0][1]
        held: dict[str, set[int]] = {}
        for uid, services in self.cache.referenced_by_each(s.uid for s in sessions).items():
            for ns, name in services:
                split = naming.split_instance_name(name)
                if ns == namespace and split is not None and split[1] == ext:
                    held.setdefault(uid, set()).add(split[0])
        return dataclasses.replace(facts, referenced=frozenset(held),
                                   held=frozenset().union(*held.values()))

    def _pool_sets(self, namespace: str, appdef: AppDefinition) -> PoolFacts:
        """The `PoolFacts` of `appdef`'s pool that its Sessions do not change: which ids
        exist, which are clean, which free ones are warm or failing (`referenced` and `held`
        left empty). Reads only the marks and the pods' states, as `ClusterCache.derived`
        requires; its value depends on nothing of `appdef` but its key there (the names'
        spec name and uid, minInstances)."""
        marks = [self.cache.instance_marks(namespace, part.kind, _name_rests(appdef, part))
                 for part in PARTS]
        existing = frozenset().union(*marks)
        # The ids without a trace, selected in C (`compress` by the negated marks: a dict's
        # keys and values come in the same order) rather than by a Python test per id.
        clean = frozenset.intersection(*(frozenset(compress(m.keys(), map(not_, m.values())))
                                         for m in marks))
        # Which free instances are warm, from the cache's index of pods by Deployment (one
        # pass over the pool's instances with a pod, no name computed per id). A pod that
        # the cache saw Ready a moment after it was reset counts as warm until its
        # deletion's event arrives (milliseconds; this process's own resets are dropped at
        # once, the executor's sink): then the claim merely waits for the replacement.
        return with_warmth(
            PoolFacts(existing, clean, frozenset()),
            appdef, self.cache.pod_warmth(namespace, _name_rests(appdef, Part.DEPLOYMENT)))

    def pool_health(self, namespace: str, appdef: AppDefinition) -> PoolHealth | None:
        # Every instance with a Deployment, from the cache's indexes: no request.
        rests = _name_rests(appdef, Part.DEPLOYMENT)
        ids = self.cache.instance_marks(namespace, Part.DEPLOYMENT.kind, rests)
        states = self.cache.pod_warmth(namespace, rests)
        return pool_health(states.get(k, (Warmth.STARTING, "")) for k in sorted(ids))

    def warmth(self, namespace: str, appdef: AppDefinition, k: int) -> tuple[str, str]:
        """(`Warmth`, failure reason) of instance k, from the cached pods."""
        return pod_warmth(
            self.cache.pods_of(namespace, naming.app_selector(appdef.spec_name, k)),
            builders.object_name(appdef, Part.DEPLOYMENT, k))

    def referencing(self, namespace: str, appdef_name: str, session: Session, *,
                    fresh: bool = False) -> frozenset[int]:
        if fresh:
            return observe.referencing(self.kube, namespace, session.uid)
        return frozenset(k for ns, name in self.cache.referenced_by(session.uid)
                         if ns == namespace
                         and (k := naming.instance_id_from_name(name)) is not None)

    def pool(
        self, namespace: str, appdef_name: str, appdef: AppDefinition | None,
        sessions: Sequence[Session],
    ) -> dict[int, InstanceView]:
        return observe.group_pool(self.cache.pool_objects(namespace), appdef_name, appdef,
                                  sessions)

    def pool_objects(self, namespace: str) -> list[Obj]:
        return self.cache.pool_objects(namespace)

    def proxy_template(self, namespace: str) -> str | None:
        cm = self.cache.get("ConfigMap", namespace, v.NAMESPACE_PROXY_TEMPLATE)
        # Anyone with `patch` on ConfigMaps writes it: returned as read, and bounded where it is
        # used, by warmpool.pool.proxy.prepare (64 KiB, TOML, known values, rewritten).
        return None if cm is None else (cm.get("data") or {}).get(v.PROXY_CONFIG_KEY)

    def session_routes(self, namespace: str) -> list[Obj]:
        if not self.cache.routes:
            return []
        return [r for r in self.cache.items(v.ROUTE_KIND, namespace)
                if routes.is_session_route(r)]

    def route(self, namespace: str, name: str, *, fresh: bool = False,
              ask_on_miss: bool = True) -> Obj | None:
        return self._by_name(v.ROUTE_KIND, observe.read_route, self.cache.routes, namespace,
                             name, fresh, ask_on_miss)

    def ingress(self, namespace: str, name: str, *, fresh: bool = False) -> Obj | None:
        return self._by_name("Ingress", observe.read_ingress, self.cache.ingresses, namespace,
                             name, fresh)

    def _by_name(
        self, kind: str, read: Callable[[Kube, str, str], Obj | None], cached_kind: bool,
        namespace: str, name: str, fresh: bool, ask_on_miss: bool = True,
    ) -> Obj | None:
        """One object by name from the cache (a miss, or `fresh`: from the server, kept)."""
        if not name:
            return None
        if not cached_kind:
            return read(self.kube, namespace, name)
        cached = self.cache.get(kind, namespace, name)
        if not fresh and (cached is not None or not ask_on_miss
                          or self.cache.deleted(kind, namespace, name)):
            return cached
        obj = read(self.kube, namespace, name)
        if obj is not None:
            self.cache.offer(obj)
        elif cached is not None:
            self.cache.offer_gone(kind, namespace, name,
                                  uid_of(cached))
        return obj

    def wrote(self, obj: Obj) -> None:
        self.cache.offer(obj)

    def deleted(self, kind: str, namespace: str, name: str, uid: str) -> None:
        self.cache.offer_gone(kind, namespace, name, uid)

    def instance_pods(
        self, namespace: str, app_selector: str
    ) -> tuple[list[Obj], list[Obj]] | None:
        return (self.cache.pods_of(namespace, app_selector),
                self.cache.replica_sets_of(namespace, app_selector))
