"""`warmpool.kube.cache.ClusterCache`: indexes, freshness and read-your-writes, on scripted
watches (no server)."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections import deque
from typing import Any

from tests.unit.pool_fixtures import appdef, instance, with_objects
from tests.unit.pool_fixtures import session as model_session
from tests.waiting import wait_for
from warmpool.kube.cache import strip
from warmpool.kube.reader import CachedReader
from warmpool.pool import vocabulary as v
from warmpool.pool.claim import pool_facts
from warmpool.pool.parts import PARTS, Part

NS = "ns1"


def obj(kind: str, name: str, rv: int, uid: str | None = None, **extra: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": NS, "resourceVersion": str(rv), "uid": uid or f"u-{name}",
            "managedFields": [{"manager": "kubectl"}], **extra.pop("meta", {})}
    return {"kind": kind, "metadata": meta, **extra}


def session(name: str, rv: int, appdef: str = "java", **meta: Any) -> dict[str, Any]:
    return obj(v.SESSION_KIND, name, rv, spec={"appDefinition": appdef, "user": "a@b.c"},
               meta=meta)


def ext_service(k: int, rv: int, session_uid: str | None = None) -> dict[str, Any]:
    refs = [{"apiVersion": v.APPDEF_API_VERSION, "kind": v.APPDEF_KIND, "name": "java",
             "uid": "ad"}]
    if session_uid:
        refs.append({"apiVersion": v.SESSION_API_VERSION, "kind": v.SESSION_KIND, "name": "s",
                     "uid": session_uid})
    return obj("Service", f"ws-java-{k}", rv, spec={"ports": []}, status={"x": 1},
               meta={"ownerReferences": refs,
                     "labels": {v.LABEL_GENERATION: "1", v.LABEL_APP: f"java-{k}"}})


class Scripted:
    """Lists what `initial` holds per kind; watches play what `push` adds, in order."""

    def __init__(self, initial: dict[str, list[dict[str, Any]]]) -> None:
        self.initial = initial
        self.events: dict[str, deque[dict[str, Any]]] = {}
        self.lock = threading.Lock()

    def list_pages(self, api_version: str, kind: str, namespace: str | None,
                   **kw: Any) -> Any:
        yield [dict(o) for o in self.initial.get(kind, [])
               if kw.get("field_selector") is None], "1"

    def push(self, kind: str, etype: str, o: dict[str, Any]) -> None:
        with self.lock:
            self.events.setdefault(kind, deque()).append({"type": etype, "object": o})

    def watch(self, api_version: str, kind: str, namespace: str | None, **kw: Any) -> Any:
        if kw.get("field_selector"):
            time.sleep(0.01)  # stimulus: an empty watch lasts a moment, as a quiet server's
            return
        end = time.monotonic() + 0.05
        while time.monotonic() < end:
            with self.lock:
                q = self.events.get(kind)
                item = q.popleft() if q else None
            if item is not None:
                yield item
            else:
                time.sleep(0.002)  # stimulus: the fake server's poll of its pushed events




def test_strip_keeps_what_decisions_read_and_drops_the_rest() -> None:
    svc = strip("Service", ext_service(1, 5))
    assert "spec" not in svc and "status" not in svc
    assert "managedFields" not in svc["metadata"]
    assert svc["metadata"]["labels"][v.LABEL_APP] == "java-1"
    cm = strip("ConfigMap", obj("ConfigMap", "e", 1, data={v.EMAILS_KEY: "a@b.c", "x": "y"},
                                meta={"labels": {v.LABEL_TEMPLATE_PURPOSE: v.PURPOSE_EMAILS}}))
    assert cm["data"] == {v.EMAILS_KEY: "a@b.c"}
    proxy = strip("ConfigMap", obj("ConfigMap", "p", 1, data={"cfg": "big"},
                                   meta={"labels": {v.LABEL_TEMPLATE_PURPOSE: v.PURPOSE_PROXY}}))
    assert "data" not in proxy
    # A Deployment read whole (a fresh read offered to the cache) is kept as its watch sends
    # it, metadata alone: no decision on a cached view reads its spec (issue #28).
    dep = strip("Deployment", obj("Deployment", "d", 1, spec={
        "selector": {"matchLabels": {v.LABEL_APP: "java-1"}}, "template": {}},
        status={"readyReplicas": 1}))
    assert set(dep) == {"apiVersion", "kind", "metadata"}


def test_sessions_are_indexed_by_appdefinition_and_follow_changes(make_cache) -> None:
    kube = Scripted({v.SESSION_KIND: [session("a", 5), session("b", 6, appdef="other")]})
    c = make_cache(kube)
    assert [s.name for s in c.sessions_of(NS, "java")] == ["a"]
    kube.push(v.SESSION_KIND, "MODIFIED", session("b", 7, appdef="java"))
    wait_for(lambda: len(c.sessions_of(NS, "java")) == 2, timeout=5)
    assert c.sessions_of(NS, "other") == []
    kube.push(v.SESSION_KIND, "DELETED", session("a", 8))
    wait_for(lambda: [s.name for s in c.sessions_of(NS, "java")] == ["b"], timeout=5)
    assert c.deleted(v.SESSION_KIND, NS, "a") and not c.deleted(v.SESSION_KIND, NS, "b")


def test_holder_index_follows_the_external_services_session_references(make_cache) -> None:
    kube = Scripted({"Service": [ext_service(1, 5, session_uid="S1"), ext_service(2, 6)]})
    c = make_cache(kube)
    assert c.referenced_by("S1") == [(NS, "ws-java-1")]
    kube.push("Service", "MODIFIED", ext_service(1, 7))  # released
    kube.push("Service", "MODIFIED", ext_service(2, 8, session_uid="S1"))
    wait_for(lambda: c.referenced_by("S1") == [(NS, "ws-java-2")], timeout=5)


def test_a_deleted_sessions_holdings_are_found_on_any_part_it_is_still_referenced_by(
        make_cache) -> None:
    """What a release from the Session's own key looks up: the uid of the Session seen
    deleted, and every instance any of whose objects still references it (the garbage
    collector strips references one object at a time, the external Service's maybe first)."""
    appdef_ref = {"apiVersion": v.APPDEF_API_VERSION, "kind": v.APPDEF_KIND, "name": "java",
                  "uid": "ad"}
    session_ref = {"apiVersion": v.SESSION_API_VERSION, "kind": v.SESSION_KIND, "name": "a",
                   "uid": "u-a"}

    def service(k: int, rv: int, *refs: dict[str, Any]) -> dict[str, Any]:
        return obj("Service", f"instance-{k}-java", rv, spec={},
                   meta={"ownerReferences": [appdef_ref, *refs]})

    email = obj("ConfigMap", "instance-2-java-email", 3, data={},
                meta={"ownerReferences": [appdef_ref, session_ref],
                      "labels": {v.LABEL_TEMPLATE_PURPOSE: v.PURPOSE_EMAILS}})
    kube = Scripted({v.SESSION_KIND: [session("a", 2)],
                     "Service": [service(1, 5, session_ref), service(3, 6)],
                     "ConfigMap": [email]})
    c = make_cache(kube)
    reader = CachedReader(c, kube)  # type: ignore[arg-type]
    assert reader.gone_session_uid(NS, "a") is None  # alive
    assert reader.holdings(NS, "u-a") == [("java", 1), ("java", 2)]
    kube.push(v.SESSION_KIND, "DELETED", session("a", 7))
    kube.push("Service", "MODIFIED", service(1, 8))  # the collector strips one reference
    wait_for(lambda: reader.gone_session_uid(NS, "a") == "u-a", timeout=5)
    wait_for(lambda: reader.holdings(NS, "u-a") == [("java", 2)], timeout=5)
    kube.push(v.SESSION_KIND, "ADDED", session("a", 9, uid="u-a2"))  # re-created, same name
    wait_for(lambda: reader.gone_session_uid(NS, "a") is None, timeout=5)


def test_freshness_waits_for_the_version_or_the_deletion_that_caused_a_job(make_cache) -> None:
    kube = Scripted({"Service": [ext_service(1, 5)]})
    c = make_cache(kube)
    assert c.fresh(NS, {"Service/ws-java-1": "5"})
    assert not c.fresh(NS, {"Service/ws-java-1": "9"})
    assert not c.fresh(NS, {"Service/ws-java-1#gone": "u-ws-java-1"})
    assert not c.wait_fresh(NS, {"Service/ws-java-1": "9"}, timeout=0.05)
    kube.push("Service", "MODIFIED", ext_service(1, 9))
    assert c.wait_fresh(NS, {"Service/ws-java-1": "9"}, timeout=5)
    kube.push("Service", "DELETED", ext_service(1, 12))
    assert c.wait_fresh(NS, {"Service/ws-java-1#gone": "u-ws-java-1"}, timeout=5)
    # A tombstone is at least as new as the deletion's version.
    assert c.fresh(NS, {"Service/ws-java-1": "12"})
    # An object never seen, of a kind the cache keeps, is not fresh until it is...
    assert not c.fresh(NS, {f"{v.SESSION_KIND}/new": "3"})
    # ...or until its watch is past that version without it: it was created and deleted
    # before this cache listed (a worker started since), so no event of it will ever come.
    kube.push(v.SESSION_KIND, "ADDED", session("other", 20))
    wait_for(lambda: c.session(NS, "other") is not None, timeout=5)
    wait_for(lambda: c.fresh(NS, {f"{v.SESSION_KIND}/new": "3"}), timeout=5)
    assert c.fresh(NS, {f"{v.SESSION_KIND}/gone-before": "15"})
    assert not c.fresh(NS, {f"{v.SESSION_KIND}/gone-before": "25"})
    assert not c.fresh(NS, {f"{v.SESSION_KIND}/other": "25"})  # held: its own version counts
    # Kinds the cache does not keep are nothing to wait for.
    assert c.fresh(NS, {"StatefulSet/r": "100"})


def test_an_offered_write_is_read_back_until_the_watch_brings_it(make_cache) -> None:
    kube = Scripted({"Service": [ext_service(1, 5)]})
    c = make_cache(kube)
    c.offer(ext_service(1, 9, session_uid="S1"))
    assert c.get("Service", NS, "ws-java-1")["metadata"]["resourceVersion"] == "9"
    assert c.referenced_by("S1") == [(NS, "ws-java-1")]
    c.offer(ext_service(1, 7))  # older than what is cached: ignored
    assert c.get("Service", NS, "ws-java-1")["metadata"]["resourceVersion"] == "9"
    kube.push("Service", "MODIFIED", ext_service(1, 8))  # the watch is behind: kept
    kube.push("Service", "MODIFIED", ext_service(1, 11))
    wait_for(lambda: c.get("Service", NS, "ws-java-1")["metadata"]["resourceVersion"] == "11",
             timeout=5)
    assert c.referenced_by("S1") == []
    c.offer_gone("Service", NS, "ws-java-1", "someone-else")  # another uid: kept
    assert c.get("Service", NS, "ws-java-1") is not None
    c.offer_gone("Service", NS, "ws-java-1", "u-ws-java-1")
    assert c.get("Service", NS, "ws-java-1") is None


def test_an_answer_offered_after_the_watch_saw_its_object_deleted_does_not_bring_it_back(
    make_cache,
) -> None:
    """A write's answer (or a direct read) sent before a deletion and offered after the
    watch delivered it: the object is gone, and stays gone in the cache, its indexes and its
    freshness; a newer version (the name created again) is kept as before. Kept, the
    stale copy outlived the deletion with no event left to remove it (chaos tier, seed 2)."""
    kube = Scripted({"Service": [ext_service(1, 5)]})
    c = make_cache(kube)
    answer = ext_service(1, 6, session_uid="S1")  # the claim's write, its answer on its way
    kube.push("Service", "MODIFIED", ext_service(1, 6, session_uid="S1"))
    kube.push("Service", "DELETED", ext_service(1, 7, session_uid="S1"))
    wait_for(lambda: c.get("Service", NS, "ws-java-1") is None, timeout=5)
    c.offer(answer)
    assert c.get("Service", NS, "ws-java-1") is None
    assert c.referenced_by("S1") == []
    assert c.fresh(NS, {"Service/ws-java-1#gone": "u-ws-java-1"})
    c.offer(ext_service(1, 9))  # made again since: newer than the deletion, kept
    assert c.get("Service", NS, "ws-java-1")["metadata"]["resourceVersion"] == "9"


def test_a_claims_pool_facts_from_the_indexes_match_those_read_from_every_object(
    make_cache,
) -> None:
    """The cache answers a claim's whole-pool questions (which ids exist, which are clean,
    whom the Services reference) from per-object marks; they must be what looking at every
    instance gives. Ids cross digit boundaries, where a long AppDefinition name is cut
    differently in the internal Service's name."""
    a = dataclasses.replace(appdef(min_instances=120, max_instances=200),
                            namespace=NS, spec_name="a-rather-long-application-definition")
    rng = random.Random(7)
    holders = [dataclasses.replace(model_session(f"s{i}", instance=i), namespace=NS)
               for i in range(1, 30)]
    views = {}
    for k in range(1, 121):
        roll = rng.random()
        if roll < 0.2:
            view = instance(a, k, holder=holders[k % len(holders)])
        elif roll < 0.3:
            view = instance(a, k, missing=(rng.choice(PARTS),))
        elif roll < 0.4:
            free = instance(a, k)
            email = dict(free.get(Part.EMAIL_CONFIGMAP))
            email["data"] = {v.EMAILS_KEY: "left@behind.example"}
            view = with_objects(free, EMAIL_CONFIGMAP=email)
        else:
            view = instance(a, k)
        views[k] = view
    initial: dict[str, list[dict[str, Any]]] = {}
    for view in views.values():
        for part, o in view.existing():
            o = {**o, "kind": part.kind, "metadata": {**o["metadata"], "namespace": NS}}
            initial.setdefault(part.kind, []).append(o)
    c = make_cache(Scripted(initial))

    got = CachedReader(c, None).pool_facts(NS, a.name, a, holders)  # type: ignore[arg-type]

    want = pool_facts(views)
    assert got.existing == want.existing and got.clean == want.clean
    assert got.referenced == want.referenced & {s.uid for s in holders}
    assert any(k >= 100 for k in got.clean) and any(k < 10 for k in got.clean)


def test_an_appdefinitions_sessions_are_kept_in_claim_order_as_they_change(make_cache) -> None:
    """Issue #28: the waiting order (creationTimestamp, then name) is an index the cache keeps
    as Sessions come, change and go, not a sort of every Session per claim."""
    def at(name: str, rv: int, created: str, appdef: str = "java") -> dict[str, Any]:
        return session(name, rv, appdef=appdef, creationTimestamp=created)

    kube = Scripted({v.SESSION_KIND: [at("c", 5, "2026-01-01T00:00:03Z"),
                                      at("a", 6, "2026-01-01T00:00:01Z"),
                                      at("b2", 7, "2026-01-01T00:00:02Z"),
                                      at("b1", 8, "2026-01-01T00:00:02Z")]})
    c = make_cache(kube)
    assert [s.name for s in c.sessions_of(NS, "java")] == ["a", "b1", "b2", "c"]
    kube.push(v.SESSION_KIND, "ADDED", at("0", 9, "2026-01-01T00:00:00Z"))
    kube.push(v.SESSION_KIND, "MODIFIED", at("b1", 10, "2026-01-01T00:00:02Z"))  # annotated
    kube.push(v.SESSION_KIND, "MODIFIED", at("c", 11, "2026-01-01T00:00:03Z", "other"))
    kube.push(v.SESSION_KIND, "DELETED", at("a", 12, "2026-01-01T00:00:01Z"))
    wait_for(lambda: [s.name for s in c.sessions_of(NS, "java")] == ["0", "b1", "b2"],
             timeout=5)
    assert [s.name for s in c.sessions_of(NS, "other")] == ["c"]


def test_sessions_are_indexed_by_user_as_oauth2_proxy_compares_users(make_cache) -> None:
    """Issue #27: ``A@B.C`` and ``a@b.c`` are one user to oauth2-proxy, and so to the
    sessions-per-user limit; the index follows a change of spec.user too."""
    def of_user(name: str, rv: int, user: str) -> dict[str, Any]:
        return obj(v.SESSION_KIND, name, rv, spec={"appDefinition": "java", "user": user})

    kube = Scripted({v.SESSION_KIND: [of_user("a", 5, "Jane@Example.COM"),
                                      of_user("b", 6, "jane@example.com"),
                                      of_user("c", 7, "bob@example.com")]})
    c = make_cache(kube)
    assert sorted(s.name for s in c.sessions_of_user(NS, "JANE@example.com")) == ["a", "b"]
    kube.push(v.SESSION_KIND, "MODIFIED", of_user("b", 8, "Bob@Example.com"))
    wait_for(lambda: [s.name for s in c.sessions_of_user(NS, "jane@example.com")] == ["a"],
             timeout=5)
    assert sorted(s.name for s in c.sessions_of_user(NS, "bob@example.com")) == ["b", "c"]


def test_a_session_watch_is_past_a_version_only_once_it_brought_it(make_cache) -> None:
    """What lets a claim under sessionsPerUser skip its LIST: the watch has brought every
    Session up to the claiming one's version."""
    kube = Scripted({v.SESSION_KIND: [session("a", 5)]})
    c = make_cache(kube)
    assert c.watched_past(v.SESSION_KIND, NS, "1")  # the list's version
    assert not c.watched_past(v.SESSION_KIND, NS, "9")
    kube.push(v.SESSION_KIND, "ADDED", session("b", 9))
    wait_for(lambda: c.watched_past(v.SESSION_KIND, NS, "9"), timeout=5)
    for odd in ("", "²", "9" * 21, "-1", "1e3"):
        assert not c.watched_past(v.SESSION_KIND, NS, odd)


def test_a_resync_trigger_is_seen_once_the_kinds_watch_is_past_its_version(make_cache) -> None:
    """`"<Kind>/*"` (a resync's, the scheduler's newest version of that kind): fresh only
    once this cache's watch of the kind has brought that version, whatever it holds."""
    kube = Scripted({v.SESSION_KIND: [session("a", 5)]})
    c = make_cache(kube)
    assert c.fresh(NS, {"Session/*": "1"})
    assert not c.fresh(NS, {"Session/*": "9"})
    assert not c.fresh(NS, {"Session/*": "9", "*": "1"})
    kube.push(v.SESSION_KIND, "ADDED", session("b", 9))
    wait_for(lambda: c.fresh(NS, {"Session/*": "9"}), timeout=5)
    assert c.fresh(NS, {"NotAKind/*": "99"})  # a kind this cache does not keep: nothing to see
    assert not c.fresh(NS, {"Session/*": "²"})


def _pod(a, k: int, rv: int, *, ready: bool, name: str = "", waiting: str = "",
         deleting: bool = False) -> dict[str, Any]:
    from warmpool.pool import builders

    deployment = builders.object_name(a, Part.DEPLOYMENT, k)
    meta: dict[str, Any] = {
        "labels": {v.LABEL_APP: f"java-17-{k}", "pod-template-hash": "h",
                   v.LABEL_GENERATION: "1"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": f"{deployment}-h", "uid": "rs",
                             "controller": True}]}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    state = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    return obj("Pod", name or f"{deployment}-h-x", rv, meta=meta, status={
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [{"name": "c", "state": state}]})


def test_pods_are_indexed_by_their_deployment_and_claims_read_which_free_ones_are_warm(
        make_cache) -> None:
    """Issue #28: the pool's pods, stripped, indexed by the Deployment their chain names; a
    reset (the pod deleted, its replacement starting) makes the instance cold at once."""
    a = appdef(min_instances=3)
    initial: dict[str, list[dict[str, Any]]] = {}
    for k in (1, 2, 3):
        for part, o in instance(a, k).existing():
            o = {**o, "kind": part.kind, "metadata": {**o["metadata"], "namespace": NS}}
            initial.setdefault(part.kind, []).append(o)
    initial["Pod"] = [_pod(a, 1, 50, ready=True), _pod(a, 2, 51, ready=True),
                      _pod(a, 3, 52, ready=False, waiting="ImagePullBackOff")]
    kube = Scripted(initial)
    c = make_cache(kube)
    reader = CachedReader(c, None)  # type: ignore[arg-type]

    facts = reader.pool_facts(NS, a.name, a, [])
    assert (facts.warm, facts.failing) == ({1, 2}, {3})
    health = reader.pool_health(NS, a)
    assert health is not None and (health.warm, health.starting, health.failing) == (2, 0, 1)
    assert set(c.get("Pod", NS, initial["Pod"][0]["metadata"]["name"])["status"]) == {"ready"}

    # Instance 1 released: its pod deleted, the ReplicaSet's new one starting.
    old = _pod(a, 1, 60, ready=True, deleting=True)
    kube.push("Pod", "MODIFIED", old)
    kube.push("Pod", "ADDED", _pod(a, 1, 61, ready=False, name="new-pod"))
    wait_for(lambda: reader.pool_facts(NS, a.name, a, []).warm == {2}, timeout=5)
    assert reader.warmth(NS, a, 1)[0] == "starting"
    kube.push("Pod", "DELETED", old)
    kube.push("Pod", "MODIFIED", _pod(a, 1, 63, ready=True, name="new-pod"))
    wait_for(lambda: reader.pool_facts(NS, a.name, a, []).warm == {1, 2}, timeout=5)
