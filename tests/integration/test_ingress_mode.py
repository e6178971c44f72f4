"""session-lifecycle §4 on the real control plane: upstream Theia Cloud's shared Ingress.

`WARMPOOL_ROUTES=ingress`: a rule per claimed instance on the Ingress `spec.ingressname`
names, added once, removed on release; Helm's placeholder rule and a foreign rule are never
touched. The controller runs in-process and sequentially (``run_until_quiet``).
"""

from __future__ import annotations

from typing import Any

from tests.crd_sets import BOTH_CRD_SETS
from tests.pool_world import assert_invariants, held_instance, session
from warmpool.controller.sequential import run_until_quiet
from warmpool.kube.api import Kube
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings
from warmpool.testing.world import (
    SHARED_ROUTE,
    USERS,
    create_appdef,
    create_session,
    delete_session,
)

HOST = "ws.theia.example.org"
SETTINGS = PoolSettings(routes="ingress", instances_host=HOST, url_probe=False)
PLACEHOLDER = {"host": HOST}
FOREIGN = {"host": "other.example.org", "http": {"paths": [{
    "path": "/someone-else", "pathType": "Prefix",
    "backend": {"service": {"name": "foreign", "port": {"number": 80}}}}]}}

pytestmark = BOTH_CRD_SETS


def _ingress(kube: Kube, ns: str) -> dict[str, Any]:
    obj = kube.get("networking.k8s.io/v1", "Ingress", ns, SHARED_ROUTE)
    assert obj is not None
    return obj


def _our_paths(kube: Kube, ns: str) -> list[tuple[str, str, str]]:
    return sorted((r["host"], p["path"], p["backend"]["service"]["name"])
                  for r in _ingress(kube, ns)["spec"]["rules"] if r.get("host") == HOST
                  for p in (r.get("http") or {}).get("paths") or [])


def test_five_claims_three_releases_and_foreign_rules_untouched(kube, namespace) -> None:
    ns = namespace
    kube.create({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": SHARED_ROUTE, "namespace": ns, "annotations": {
            "nginx.ingress.kubernetes.io/rewrite-target": "/$2"}},
        "spec": {"rules": [PLACEHOLDER, FOREIGN]}})
    create_appdef(kube, ns, min_instances=5, shared_route=False)
    run_until_quiet(kube, ns, SETTINGS)
    assert _our_paths(kube, ns) == []  # free instances have no rule

    for i in range(1, 6):
        create_session(kube, ns, f"s{i}", USERS[i])
    run_until_quiet(kube, ns, SETTINGS)
    held = {f"s{i}": held_instance(kube, ns, f"s{i}") for i in range(1, 6)}
    assert sorted(held.values()) == [1, 2, 3, 4, 5]
    rules = _ingress(kube, ns)["spec"]["rules"]
    assert rules[:2] == [PLACEHOLDER, FOREIGN]  # Helm's and someone else's, as they were
    mine = rules[2:]
    assert len(mine) == 5  # one each, added once
    first = mine[0]
    assert first["host"] == HOST
    (path,) = first["http"]["paths"]
    assert path["pathType"] == "ImplementationSpecific"
    assert path["path"].endswith("(/|$)(.*)") and path["path"].startswith("/java-app-")
    assert path["backend"]["service"]["port"] == {"number": 3000}
    for name, k in held.items():
        status = session(kube, ns, name)["status"]
        assert status["operatorStatus"] == v.STATUS_HANDLED
        assert status["url"] == f"{HOST}/java-app-{k}/"
    before = _ingress(kube, ns)["metadata"]["resourceVersion"]
    run_until_quiet(kube, ns, SETTINGS)  # nothing to do: no rule added twice
    assert _ingress(kube, ns)["metadata"]["resourceVersion"] == before

    for name in ("s1", "s3", "s5"):
        delete_session(kube, ns, name)
    run_until_quiet(kube, ns, SETTINGS)
    rules = _ingress(kube, ns)["spec"]["rules"]
    assert rules[:2] == [PLACEHOLDER, FOREIGN]
    assert [p[1] for p in _our_paths(kube, ns)] == sorted(
        f"/java-app-{held[n]}(/|$)(.*)" for n in ("s2", "s4"))
    assert _ingress(kube, ns)["metadata"]["annotations"] == {
        "nginx.ingress.kubernetes.io/rewrite-target": "/$2"}
    assert_invariants(kube, ns)


def test_no_claim_while_the_shared_ingress_is_missing(kube, namespace) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=1, shared_route=False)
    run_until_quiet(kube, ns, SETTINGS)
    create_session(kube, ns, "s1", USERS[1])
    run_until_quiet(kube, ns, SETTINGS)
    status = session(kube, ns, "s1")["status"]
    assert (status["operatorStatus"], status["operatorMessage"]) == (
        v.STATUS_HANDLING, "Ingress not available.")
    assert held_instance(kube, ns, "s1") is None
    kube.create({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                 "metadata": {"name": SHARED_ROUTE, "namespace": ns},
                 "spec": {"rules": [PLACEHOLDER]}})
    run_until_quiet(kube, ns, SETTINGS)
    assert session(kube, ns, "s1")["status"]["operatorStatus"] == v.STATUS_HANDLED
    assert len(_our_paths(kube, ns)) == 1
