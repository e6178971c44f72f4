"""Migration from Theia Cloud's Java operator to warmpool, and warmpool's uninstall, proven on
the real control plane (docs/operating.md, issue #31 item 2).

The pool and its live Sessions are written exactly as the Java operator leaves them
(`warmpool.testing.java_operator`, each write citing the Java source), its known broken
states included:

- instance 1: held by alice, healthy as Java leaves a claim (its ConfigMaps owned by the
  AppDefinition alone: pool-spec §3);
- instance 2: claimed twice, by bob and then by carol (Java's stale-list reservation), the
  allow-list carol's (the last writer);
- instance 3: free, released by Java after erin ended, so its Services keep the three
  session labels Java's release does not remove, and its allow-list is empty;
- instance 4: held by dave, above minInstances after Java's scale-down: its two ConfigMaps
  deleted and the AppDefinition's reference stripped from its Services and Deployment
  (the seed's defect);
- instance 5: free and above minInstances: deleted by that scale-down;
- and frank's Session, which Java's lazy fallback started on a Deployment of its own (no
  instance was free for it): warmpool must leave it running where it is.

Then warmpool's scheduler and workers start (the harness, real processes, real Redis) and the
test shows, object by object: every live Session keeps its instance (the same object uids,
nothing recreated but what was missing), its allow-list and its pod (the same pod uid); the
broken states are repaired, and "repaired" means, for the double claim, that the older
Session (bob, by creationTimestamp: pool-spec §4 `claimant`, `HolderIndex.of`) keeps
instance 2 with its allow-list set to bob alone, while carol loses every reference to it and
is served a clean instance of her own (her annotation, status URL and route follow), and for
the missing ConfigMaps that they are recreated for dave, owned by the AppDefinition and dave,
and the AppDefinition's references restored; every invariant I1-I6 holds. The pool is then
scaled up and down as usual. Last, warmpool is uninstalled (its processes stopped, its Lease
deleted, by the commands docs/operating.md gives) and every live Session's objects, allow-list,
pod and route are still exactly there; a Session ended then is not released, and the doc's
command to find such instances names it.
"""

from __future__ import annotations

import os
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.crd_sets import BOTH_CRD_SETS
from tests.pool_world import converge, instance_objects, owner_kinds, session, session_routes
from tests.redis_server import resolve_redis_url
from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo
from warmpool.harness import System
from warmpool.invariants import check
from warmpool.kube.api import Kube
from warmpool.kube.clock import parse_http_date
from warmpool.pool import vocabulary as v
from warmpool.pool.meta import labels_of, meta_of, owner_refs, uid_of
from warmpool.queue.settings import QueueSettings
from warmpool.testing.java_operator import UPSTREAM, JavaPool, create_proxy_template
from warmpool.testing.world import (
    USERS,
    create_appdef,
    create_session,
    delete_session,
    patch_appdef_spec,
)

pytestmark = pytest.mark.redis

ALICE, BOB, CAROL, DAVE, ERIN, FRANK = USERS[1:7]
SETTLE = 120.0
DOC = Path(__file__).resolve().parents[2] / "docs" / "operating.md"


def _created_after(kube: Kube, obj: dict[str, Any]) -> None:
    """Wait until the API server's clock is past the second `obj` was created in, so the
    next object is strictly younger (creationTimestamp has whole seconds)."""
    created = meta_of(obj)["creationTimestamp"]
    at = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    wait_for(lambda: (parse_http_date(kube.date_header()) or 0) >= at + 1, timeout=10,
             message="the API server's clock to pass " + created)


def _pod_uids(pool: JavaPool, k: int) -> set[str]:
    return {uid_of(p) for p in pool.pods(k)}


def _lazy_pods(kube: Kube, s: dict[str, Any]) -> set[str]:
    """The pods of the lazily started Session's own Deployment."""
    deployments, _ = kube.list("apps/v1", "Deployment", meta_of(s)["namespace"])
    (mine,) = [d for d in deployments
               if [r.get("uid") for r in owner_refs(d)] == [uid_of(s)]]
    selector = mine["spec"]["selector"]["matchLabels"][v.LABEL_APP]
    pods, _ = kube.list("v1", "Pod", meta_of(s)["namespace"],
                        label_selector=f"{v.LABEL_APP}={selector}")
    return {uid_of(p) for p in pods}


def _allow_list(kube: Kube, ns: str, k: int) -> str | None:
    """The e-mail ConfigMap's list (None: the ConfigMap is missing)."""
    for key, obj in instance_objects(kube, ns, "java", k).items():
        if key.startswith("ConfigMap/") and labels_of(obj).get(
                v.LABEL_TEMPLATE_PURPOSE) == v.PURPOSE_EMAILS:
            return str((obj.get("data") or {}).get(v.EMAILS_KEY) or "")
    return None


def _uids(kube: Kube, ns: str, k: int) -> dict[str, str]:
    return {key: uid_of(obj) for key, obj in instance_objects(kube, ns, "java", k).items()}


def _holder_refs(kube: Kube, ns: str, k: int) -> dict[str, list[str]]:
    """Each object of instance k: the names of the Sessions referencing it."""
    return {key: sorted(r["name"] for r in owner_refs(obj) if r.get("kind") == v.SESSION_KIND)
            for key, obj in instance_objects(kube, ns, "java", k).items()}


def _live_view(kube: Kube, ns: str, pool: JavaPool, names: list[str]) -> dict[str, Any]:
    """What a live Session needs to keep working: its instance's objects (uids, owners,
    allow-list), its pod, its route and its status."""
    out: dict[str, Any] = {}
    routes = session_routes(kube, ns)
    for name in names:
        s = session(kube, ns, name)
        k = int(s["metadata"]["annotations"][v.ANNOTATION_INSTANCE_ID])
        route = routes.get(uid_of(s) + v.ROUTE_SUFFIX)
        out[name] = {
            "instance": k,
            "objects": {key: (uid_of(o), sorted((r["kind"], r["name"]) for r in owner_refs(o)))
                        for key, o in instance_objects(kube, ns, "java", k).items()},
            "allow_list": _allow_list(kube, ns, k),
            "pods": _pod_uids(pool, k),
            "route": (uid_of(route), route["spec"]["rules"][1]["backendRefs"][0]["name"])
            if route else None,
            "status": {key: (s.get("status") or {}).get(key)
                       for key in ("operatorStatus", "url")},
        }
    return out


def _run_doc(heading: str, ns: str, cluster: ClusterInfo, skip: str | None = None
             ) -> subprocess.CompletedProcess[str]:
    """Run the first `sh` block after `heading` in docs/operating.md, as written but for the
    namespace (`theia-cloud` there) and the lines containing `skip`."""
    text = DOC.read_text()
    block = re.search(r"```sh\n(.*?)```", text[text.index(heading):], re.S)
    assert block is not None, f"no commands after {heading!r}"
    script = re.sub(r"\\\n", "", block.group(1))  # join continued lines, then drop skipped
    script = "\n".join(line for line in script.splitlines()
                       if not (skip and skip in line)).replace("-n theia-cloud", f"-n {ns}")
    return subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)})


def _events(kube: Kube, ns: str, reason: str) -> list[str]:
    items, _ = kube.list("v1", "Event", ns)
    return [e.get("message", "") for e in items if e.get("reason") == reason]


def test_a_java_operator_pool_is_adopted_repaired_managed_and_survives_uninstall(
    cluster: ClusterInfo, kube: Kube, namespace: str, tmp_path: Any
) -> None:
    ns = namespace
    # --- the Java operator's cluster ---------------------------------------------------------
    create_proxy_template(kube, ns)
    appdef = create_appdef(kube, ns, "java", min_instances=5, max_instances=10,
                           spec_name="java-app")
    pool = JavaPool(kube, appdef)
    pool.own_shared_route()
    for k in range(1, 6):
        pool.instance(k)
    alice = create_session(kube, ns, "alice-session", ALICE)
    bob = create_session(kube, ns, "bob-session", BOB)
    _created_after(kube, bob)
    carol = create_session(kube, ns, "carol-session", CAROL)
    dave = create_session(kube, ns, "dave-session", DAVE)
    pool.claim(1, alice)
    pool.claim(2, bob)
    pool.double_claim(2, carol)
    pool.claim(4, dave)
    pool.scale_below(3, claimed={1: alice, 2: bob, 4: dave})
    erin = create_session(kube, ns, "erin-session", ERIN)
    pool.claim(3, erin)
    # Java releases once the Session is gone, while the garbage collector drops the same
    # references; releasing first keeps this setup free of that race, with the same result.
    pool.released(3, erin)
    delete_session(kube, ns, "erin-session")
    frank = create_session(kube, ns, "frank-session", FRANK)
    frank = pool.lazy_fallback(frank)

    # What Java left, as the test means it (not warmpool's reading of it):
    assert _holder_refs(kube, ns, 2)[f"Service/{pool.name(2)}"] == ["bob-session",
                                                                   "carol-session"]
    assert _allow_list(kube, ns, 2) == CAROL
    assert _allow_list(kube, ns, 4) is None  # both ConfigMaps of dave's instance are gone
    assert all(owner_kinds(o) == ["Session"]
               for o in instance_objects(kube, ns, "java", 4).values())
    assert {k for k in range(1, 6) if instance_objects(kube, ns, "java", k)} == {1, 2, 3, 4}
    assert v.LABEL_COMPONENT in labels_of(kube.get("v1", "Service", ns, pool.name(3)))
    assert check(kube, ns), "the Java state must violate the invariants this test repairs"
    wait_for(lambda: all(pool.pods(k) for k in (1, 2, 3, 4)) and _lazy_pods(kube, frank),
             timeout=60, message="a pod for each instance and for frank")
    frank_pods = _lazy_pods(kube, frank)
    before = {"alice-session": (1, _uids(kube, ns, 1), _pod_uids(pool, 1)),
              "bob-session": (2, _uids(kube, ns, 2), _pod_uids(pool, 2)),
              "dave-session": (4, _uids(kube, ns, 4), _pod_uids(pool, 4))}
    routes_before = {uid_of(s): uid_of(r) for s in (alice, bob, dave)
                     for r in [session_routes(kube, ns)[uid_of(s) + v.ROUTE_SUFFIX]]}

    # --- warmpool starts ----------------------------------------------------------------------
    system = System(cluster, namespaces=[ns], workers=2, threads=4, resync_period=20,
                    redis=resolve_redis_url(), env={"WARMPOOL_URL_PROBE": "off"},
                    queue=QueueSettings(lease_ttl=5.0, heartbeat_timeout=5.0,
                                        recovery_period=0.5, drain_timeout=5),
                    log_dir=tmp_path / "logs")
    try:
        system.start()

        def carol_served() -> int | None:
            # Between losing instance 2 and her new claim, carol's annotation is removed
            # (an annotation naming an instance she does not hold is not obeyed).
            s = session(kube, ns, "carol-session")
            raw = (s["metadata"].get("annotations") or {}).get(v.ANNOTATION_INSTANCE_ID)
            k = int(raw) if raw else None
            return k if k not in (None, 2) and _allow_list(kube, ns, k) == CAROL else None

        converge(kube, ns, carol_served, "the Java pool adopted and repaired", timeout=SETTLE)

        # Every live Session keeps its instance, its objects and its pod.
        for name, (k, uids, pods) in before.items():
            s = session(kube, ns, name)
            assert s["metadata"]["annotations"][v.ANNOTATION_INSTANCE_ID] == str(k)
            assert s["status"]["operatorStatus"] == v.STATUS_HANDLED
            assert s["status"]["url"] == f"{pool.host}/java-app-{k}/"
            now = _uids(kube, ns, k)
            assert {key: now[key] for key in uids} == uids, f"{name}: objects were recreated"
            assert _pod_uids(pool, k) == pods, f"{name}: its pod was replaced"
            assert all(owner_kinds(o) == ["AppDefinition", "Session"]
                       for o in instance_objects(kube, ns, "java", k).values())
            assert all(refs == [name] for refs in _holder_refs(kube, ns, k).values()), name
        assert _allow_list(kube, ns, 1) == ALICE
        # The double claim, repaired: the older Session keeps instance 2, alone.
        assert _allow_list(kube, ns, 2) == BOB
        assert any("instance 2 is claimed by bob-session; also by carol-session" in m
                   for m in _events(kube, ns, "InstanceConflict"))
        k_carol = carol_served()
        assert k_carol is not None
        carol_now = session(kube, ns, "carol-session")
        assert carol_now["status"]["url"] == f"{pool.host}/java-app-{k_carol}/"
        assert all(refs == ["carol-session"]
                   for refs in _holder_refs(kube, ns, k_carol).values())
        carol_route = session_routes(kube, ns)[uid_of(carol) + v.ROUTE_SUFFIX]
        assert carol_route["spec"]["rules"][1]["backendRefs"][0]["name"] == pool.name(k_carol)
        # The missing ConfigMaps, repaired: recreated for dave, owned by both.
        assert _allow_list(kube, ns, 4) == DAVE
        assert len(instance_objects(kube, ns, "java", 4)) == 5
        # The lazily started Session: never claimed, still on its own pod, at its own URL.
        frank_now = session(kube, ns, "frank-session")
        assert v.ANNOTATION_INSTANCE_ID not in frank_now["metadata"]["annotations"]
        assert frank_now["status"] == frank["status"]
        assert _lazy_pods(kube, frank) == frank_pods
        assert not any(r.get("uid") == uid_of(frank) for k in range(1, 11)
                       for o in instance_objects(kube, ns, "java", k).values()
                       for r in owner_refs(o))
        # Routes: the live Sessions' own, untouched; the AppDefinition's reference Java put
        # on the shared route kept (warmpool never writes the shared route).
        routes_now = session_routes(kube, ns)
        for s_uid, r_uid in routes_before.items():
            assert uid_of(routes_now[s_uid + v.ROUTE_SUFFIX]) == r_uid
        shared = kube.get(v.ROUTE_API_VERSION, v.ROUTE_KIND, ns, appdef["spec"]["ingressname"])
        assert [r["name"] for r in owner_refs(shared)] == ["java"]

        # --- the pool managed as usual: scale up, scale down ----------------------------------
        live = ["alice-session", "bob-session", "carol-session", "dave-session"]
        held = {name: int(session(kube, ns, name)["metadata"]["annotations"][
            v.ANNOTATION_INSTANCE_ID]) for name in live}
        patch_appdef_spec(kube, ns, "java", minInstances=6)
        converge(kube, ns, lambda: all(len(instance_objects(kube, ns, "java", k)) == 5
                                       for k in range(1, 7)), "scale up to 6", timeout=SETTLE)
        patch_appdef_spec(kube, ns, "java", minInstances=1)
        free_above = [k for k in range(2, 7) if k not in held.values()]
        converge(kube, ns, lambda: not any(instance_objects(kube, ns, "java", k)
                                           for k in free_above),
                 "scale down to 1", timeout=SETTLE)
        for name, k in held.items():
            assert len(instance_objects(kube, ns, "java", k)) == 5, name
            assert _allow_list(kube, ns, k) == {"alice-session": ALICE, "bob-session": BOB,
                                                "carol-session": CAROL,
                                                "dave-session": DAVE}[name]
        before_uninstall = _live_view(kube, ns, pool, live)
    finally:
        system.stop()

    # --- uninstall, as docs/operating.md §5 says (the processes are stopped above) ---------------
    # The harness ran warmpool as local processes, so of its objects only the Lease exists
    # here; the doc's commands run as written, on this namespace, but for the CRD: this test
    # session's control plane is shared with the other tests.
    done = _run_doc("## 5. Uninstall", ns, cluster, skip="delete crd")
    assert done.returncode == 0, done.stderr
    assert kube.get("coordination.k8s.io/v1", "Lease", ns, "warmpool-scheduler") is None
    after = _live_view(kube, ns, pool, live)
    assert after == before_uninstall
    assert _lazy_pods(kube, frank) == frank_pods
    finder = _run_doc("One gap needs a look", ns, cluster)
    assert finder.returncode == 0 and finder.stdout == "", finder.stdout + finder.stderr
    for name in live:
        k = after[name]["instance"]
        dep = kube.get("apps/v1", "Deployment", ns, pool.name(k))
        assert dep is not None and (dep.get("status") or {}).get("readyReplicas") == 1, name

    # With no controller left, an ended Session is not released (docs/operating.md §4-5): the
    # garbage collector drops its references, and the doc's finder names its instance.
    delete_session(kube, ns, "alice-session")
    wait_for(lambda: not _holder_refs(kube, ns, 1)[f"Service/{pool.name(1)}"], timeout=90,
             message="the garbage collector to drop alice's references")
    finder = _run_doc("One gap needs a look", ns, cluster)
    assert finder.stdout.split("\n") == [f"not released: {pool.name(1)}", ""], finder.stdout


@BOTH_CRD_SETS
def test_an_upstream_line_pool_is_adopted_once_labelled(
    cluster: ClusterInfo, kube: Kube, namespace: str, tmp_path: Any
) -> None:
    """Upstream's operator leaves no generation label and no Session annotation
    (`java_operator.UPSTREAM`); after the labelling docs/operating.md §2 gives, warmpool sees
    the pool and keeps the live Session's instance, objects, pod and allow-list, and replaces
    the free instance. On both CRD sets: upstream Theia Cloud's (its own line, v1beta10) and
    warmpool's. Routes off: upstream routes through its shared Ingress (warmpool's
    `ingress` mode, tests/integration/test_ingress_mode.py), which this test does not build."""
    ns = namespace
    create_proxy_template(kube, ns)
    appdef = create_appdef(kube, ns, "java", min_instances=2, max_instances=4,
                           spec_name="java-app", shared_route=False)  # upstream: an Ingress
    pool = JavaPool(kube, appdef, line=UPSTREAM)
    for k in (1, 2):
        pool.instance(k)
    alice = create_session(kube, ns, "alice-session", ALICE)
    pool.claim(1, alice, route=False)
    wait_for(lambda: pool.pods(1) and pool.pods(2), timeout=60, message="the instances' pods")

    def by_name(k: int) -> dict[str, dict[str, Any]]:
        found = {}
        for api_version, kind, name in (("v1", "Service", pool.name(k)),
                                        ("v1", "Service", pool.internal_name(k)),
                                        ("apps/v1", "Deployment", pool.name(k)),
                                        ("v1", "ConfigMap", pool.name(k, "proxy")),
                                        ("v1", "ConfigMap", pool.name(k, "email"))):
            obj = kube.get(api_version, kind, ns, name)
            if obj is not None:
                found[f"{kind}/{name}"] = obj
        return found

    held = {key: uid_of(o) for key, o in by_name(1).items()}
    free = {key: uid_of(o) for key, o in by_name(2).items()}
    assert len(held) == len(free) == 5
    assert not any(v.LABEL_GENERATION in labels_of(o) for k in (1, 2)
                   for o in by_name(k).values())
    pods = _pod_uids(pool, 1)

    labelled = _run_doc("label its pool objects", ns, cluster)
    assert labelled.returncode == 0, labelled.stderr
    assert {labels_of(o).get(v.LABEL_GENERATION) for k in (1, 2)
            for o in by_name(k).values()} == {"0"}

    system = System(cluster, namespaces=[ns], workers=2, threads=4, resync_period=20,
                    redis=resolve_redis_url(),
                    env={"WARMPOOL_URL_PROBE": "off", "WARMPOOL_ROUTES": "none"},
                    queue=QueueSettings(lease_ttl=5.0, heartbeat_timeout=5.0,
                                        recovery_period=0.5, drain_timeout=5),
                    log_dir=tmp_path / "logs")
    generation = str(kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java")["metadata"][
        "generation"])
    try:
        system.start()

        def adopted() -> bool:
            s = session(kube, ns, "alice-session")
            return ((s["metadata"].get("annotations") or {}).get(v.ANNOTATION_INSTANCE_ID) == "1"
                    and all(labels_of(o).get(v.LABEL_GENERATION) == generation
                            for o in by_name(2).values()))

        converge(kube, ns, adopted, "the upstream pool adopted", timeout=SETTLE)
    finally:
        system.stop()
    assert {key: uid_of(o) for key, o in by_name(1).items()} == held
    assert _pod_uids(pool, 1) == pods
    assert _allow_list(kube, ns, 1) == ALICE
    assert all(owner_kinds(o) == ["AppDefinition", "Session"] for o in by_name(1).values())
    replaced = {key: uid_of(o) for key, o in by_name(2).items()}
    assert replaced.keys() == free.keys()
    assert not set(replaced.values()) & set(free.values()), "the free instance was kept"
    assert session(kube, ns, "alice-session")["status"]["url"] == f"{pool.host}/java-app-1/"
