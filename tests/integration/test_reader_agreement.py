"""The two readers agree: one world on the real control plane, read by `LiveReader` (every
read a request) and by `CachedReader` (the worker's watch-fed cache, its indexes), every
fact the jobs decide from compared.

`warmpool/kube/reader.py` computes the same facts twice, once from the server's objects and
once from the cache's stubs and indexes; a fact the two compute differently makes a job's
decision depend on which reader it got (issue #29). The world is built to have a fact of each
kind to disagree on: claimed and free instances, a user with two Sessions, a Session deleted
while it held an instance, a Session that waits, an instance missing an object, an
outdated template, a pool above its target. The cache is compared only once it holds every
object at the server's version, so what remains to differ is the computation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tests.waiting import wait_for
from warmpool.controller.sequential import run_until_quiet
from warmpool.kube.api import Kube
from warmpool.kube.cache import ClusterCache
from warmpool.kube.reader import CachedReader, LiveReader, Reader
from warmpool.pool import builders
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings
from warmpool.pool.decide import decide_instance
from warmpool.pool.instances import InstanceView
from warmpool.pool.model import AppDefinition, Session
from warmpool.pool.parts import PARTS, Part
from warmpool.testing.world import USERS, create_appdef, create_session, patch_appdef_spec

#: Every kind the cache keeps for this world, as the server lists it.
KINDS = (
    (v.APPDEF_API_VERSION, v.APPDEF_KIND, None),
    (v.SESSION_API_VERSION, v.SESSION_KIND, None),
    *((p.api_version, p.kind, v.LABEL_GENERATION) for p in PARTS if p is not Part.ROUTE),
    (v.ROUTE_API_VERSION, v.ROUTE_KIND, None),
)


def _versions(objs: Iterable[dict[str, Any]]) -> dict[str, str]:
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in objs}


def _caught_up(kube: Kube, ns: str, cache: ClusterCache) -> bool:
    """The cache holds every object of every kept kind at the server's version, and no
    other."""
    for api_version, kind, selector in KINDS:
        items, _ = kube.list(api_version, kind, ns, label_selector=selector)
        cached = [o for o in (cache.get(kind, ns, name) for name in _versions(items)) if o]
        if _versions(cached) != _versions(items):
            return False
    return True


def _referring(kube: Kube, ns: str, uid: str) -> list[str]:
    """The names of the pool's objects that still have an owner reference to `uid`."""
    return [o["metadata"]["name"]
            for api_version, kind, selector in KINDS
            for o in kube.list(api_version, kind, ns, label_selector=selector)[0]
            if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or ())]


def _view_facts(view: InstanceView) -> dict[str, Any]:
    """An instance view as the decisions read it: each part's name and version, the routes."""
    return {
        "parts": {part.name: (o["metadata"]["name"], o["metadata"]["resourceVersion"])
                  for part, o in view.objects.items() if o is not None},
        "routes": sorted(r["metadata"]["name"] for r in view.routes),
    }


def _plan_facts(reader: Reader, ns: str, appdef: AppDefinition, k: int,
                sessions: list[Session], settings: PoolSettings) -> Any:
    view = reader.instance(ns, appdef.name, appdef, k, sessions)
    plan = decide_instance(view, appdef.name, appdef, sessions,
                           proxy_template=reader.proxy_template(ns), settings=settings,
                           shared_route=reader.route(ns, appdef.ingress_name),
                           now_ms=0)
    return plan.state, plan.holder, [repr(a) for a in plan.actions], plan.released


def test_live_and_cached_readers_agree_on_every_fact(
    kube: Kube, namespace: str, cache: ClusterCache
) -> None:
    ns = namespace
    settings = PoolSettings()
    create_appdef(kube, ns, min_instances=4)
    run_until_quiet(kube, ns, settings)
    made = {name: create_session(kube, ns, name, user)
            for name, user in (("s1", USERS[1]), ("s2", USERS[2]), ("s3", USERS[1].upper()),
                               ("s4", USERS[4]))}
    run_until_quiet(kube, ns, settings)
    # Drift, left for the jobs to find: a held instance's proxy ConfigMap deleted; a holder
    # deleted (its release due); a new template (every instance outdated); the target
    # lowered below the claimed ids; one more Session than the pool may serve.
    holder = kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s1")
    assert holder is not None
    k1 = int(holder["metadata"]["annotations"][v.ANNOTATION_INSTANCE_ID])
    appdef_obj = kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java")
    assert appdef_obj is not None
    parsed = LiveReader(kube).appdef(ns, "java")
    assert isinstance(parsed, AppDefinition)
    kube.delete("v1", "ConfigMap", ns, builders.object_name(parsed, Part.PROXY_CONFIGMAP, k1))
    kube.delete(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s2")
    patch_appdef_spec(kube, ns, "java", image="theiacloud/theia-cloud-demo:1.1",
                      minInstances=1, maxInstances=4)
    create_session(kube, ns, "s5", USERS[5])
    # The garbage collector removes the deleted holder's owner references on its own time;
    # a reference dropped between the two readers' calls would be a difference of time, not
    # of computation. Compared once it is done.
    gone = made["s2"]["metadata"]["uid"]
    wait_for(lambda: not _referring(kube, ns, gone), timeout=60,
             message="the garbage collector to drop the deleted Session's references")
    wait_for(lambda: _caught_up(kube, ns, cache), timeout=60,
             message="the cache to hold every object at the server's version")

    live: Reader = LiveReader(kube, routes=True)
    cached: Reader = CachedReader(cache, kube)

    def both(fn: str, *args: Any) -> tuple[Any, Any]:
        return getattr(live, fn)(ns, *args), getattr(cached, fn)(ns, *args)

    a_live, a_cached = both("appdef", "java")
    assert a_live == a_cached
    assert isinstance(a_live, AppDefinition)
    appdef = a_live
    s_live, s_cached = both("sessions", "java")
    assert sorted(s_live, key=lambda s: s.name) == sorted(s_cached, key=lambda s: s.name)
    sessions = sorted(s_live, key=lambda s: s.name)
    assert {s.name for s in sessions} >= {"s1", "s3", "s4", "s5"}
    for name in ("s1", "s3", "s4", "s5", "s2", "nobody"):
        assert both("session", name)[0] == both("session", name)[1], name
    uids = {name: body["metadata"]["uid"] for name, body in made.items()}
    for name, uid in uids.items():
        for fn in ("holdings", "claimed_on_server"):
            got_live, got_cached = both(fn, uid)
            assert sorted(got_live) == sorted(got_cached), (fn, name)
        # A reader without a watch never knows a deletion; the cache may: it must not claim
        # one the server does not show.
        if cached.session_gone(ns, name, uid):
            assert kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name) is None
    version = kube.list(v.SESSION_API_VERSION, v.SESSION_KIND, ns)[1]
    for user in (USERS[1], USERS[1].upper(), USERS[2], USERS[4], "nobody@example.com"):
        for fn, args in (("user_sessions", (user,)), ("user_sessions_as_of", (user, version))):
            got_live, got_cached = both(fn, *args)
            assert (sorted(s.name for s in got_live)
                    == sorted(s.name for s in got_cached)), (fn, user)
    assert both("pool_facts", "java", appdef, sessions)[0] == \
        both("pool_facts", "java", appdef, sessions)[1]
    for s in sessions:
        assert both("referencing", "java", s)[0] == both("referencing", "java", s)[1], s.name
    p_live, p_cached = both("pool", "java", appdef, sessions)
    assert sorted(p_live) == sorted(p_cached)
    assert len(p_live) >= 4
    for k in sorted(p_live):
        assert _view_facts(p_live[k]) == _view_facts(p_cached[k]), k
    ids = [*sorted(p_live), max(p_live) + 1]
    i_live, i_cached = both("instances", "java", appdef, ids, sessions)
    assert {k: _view_facts(x) for k, x in i_live.items()} == \
        {k: _view_facts(x) for k, x in i_cached.items()}
    assert both("proxy_template")[0] == both("proxy_template")[1]
    assert sorted(r["metadata"]["name"] for r in live.session_routes(ns)) == \
        sorted(r["metadata"]["name"] for r in cached.session_routes(ns))
    route = appdef.ingress_name
    r_live, r_cached = both("route", route)
    assert (r_live or {}).get("metadata", {}).get("resourceVersion") == \
        (r_cached or {}).get("metadata", {}).get("resourceVersion")
    # The timers' reads (issue #29): the PoolSchedules, and a Session and its AppDefinition
    # as written (the timeout job reads status.lastActivity from them).
    assert _versions(live.schedules(ns)) == _versions(cached.schedules(ns))
    for kind, name in ((v.SESSION_KIND, "s1"), (v.SESSION_KIND, "s2"), (v.APPDEF_KIND, "java"),
                       (v.SESSION_KIND, "nobody")):
        o_live, o_cached = live.object(kind, ns, name), cached.object(kind, ns, name)
        assert (o_live is None) == (o_cached is None), (kind, name)
        if o_live is not None and o_cached is not None:
            for part in ("spec", "status"):
                assert o_live.get(part) == o_cached.get(part), (kind, name, part)
            assert _versions([o_live]) == _versions([o_cached]), (kind, name)
    # And what the jobs do with it: the same plan for every instance, drift and all.
    plans = 0
    for k in ids:
        got_live = _plan_facts(live, ns, appdef, k, sessions, settings)
        got_cached = _plan_facts(cached, ns, appdef, k, sessions, settings)
        assert got_live == got_cached, k
        plans += bool(got_live[2])
    assert plans >= 3, "the world should leave work for the jobs on several instances"
