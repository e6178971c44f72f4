"""Both Theia Cloud lines on the real control plane: warmpool's own CRDs (the EduIDE-Cloud
fork's versions) and upstream Theia Cloud's vendored chart, rendered as its README says.

The line is read from the discovery API, every object goes at its version, owner references
say the version the owner is served at (so the garbage collector resolves them), and the
routing where WARMPOOL_ROUTES is unset is the install's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes import config

from tests.crd_sets import BOTH_CRD_SETS
from tests.pool_world import held_instance, instance_objects, owner_kinds
from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo
from warmpool.config import check_servers
from warmpool.controller.sequential import run_until_quiet
from warmpool.kube import kinds
from warmpool.kube.api import Kube
from warmpool.pool import lines
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings
from warmpool.testing.world import (
    USERS,
    create_appdef,
    create_namespace,
    create_session,
    delete_session,
)

EXPECTED = {"warmpool": lines.TheiaLine(appdefinition="v1beta11", session="v1beta8"),
            "upstream": lines.TheiaLine(appdefinition="v1beta10", session="v1beta8")}


@pytest.fixture
def plane(control_planes: object, crds: str) -> Iterator[tuple[ClusterInfo, Kube]]:
    """This CRD set's control plane and a client of it, taken from the registry by the
    test's own `crds`: the session-scoped `cluster` and `kube` fixtures do not follow the
    parametrization in every order (after other tests, an upstream case got the warmpool
    plane's client in CI)."""
    info = control_planes.get(crds)  # type: ignore[attr-defined]
    api = config.new_client_from_config(config_file=str(info.kubeconfig))
    try:
        yield info, Kube(api)
    finally:
        api.close()


@BOTH_CRD_SETS
def test_the_line_is_the_preferred_served_version_of_each_kind(plane, crds) -> None:
    _, kube = plane
    versions, kinds_by_version = kube.theia_group()
    if crds == "upstream":
        # Upstream's group prefers v1beta10, which serves no Session: chosen per kind.
        assert versions[:3] == ["v1beta10", "v1beta9", "v1beta8"]
        assert "Session" not in kinds_by_version["v1beta10"]
    assert kube.line() == EXPECTED[crds]
    assert kube.served_api_version(v.APPDEF_API_VERSION, v.APPDEF_KIND) == \
        f"theia.cloud/{EXPECTED[crds].appdefinition}"


@BOTH_CRD_SETS
def test_the_start_up_check_passes_and_the_routing_follows_the_install(plane, crds) -> None:
    cluster, kube = plane
    check_servers(None, kube=True, kubeconfig=str(cluster.kubeconfig), kinds=kinds.theia())
    settled, said = kinds.settle_routes(kube, PoolSettings(), {})
    assert settled.routes == ("httproute" if crds == "warmpool" else "ingress")
    assert said.startswith(f"routing: {settled.routes} (WARMPOOL_ROUTES unset")
    assert EXPECTED[crds].describe() in said
    # A value that is set is kept, whatever the line.
    kept, said = kinds.settle_routes(kube, PoolSettings(routes="none"),
                                     {"WARMPOOL_ROUTES": "none"})
    assert kept.routes == "none" and "WARMPOOL_ROUTES is set" in said


@BOTH_CRD_SETS
def test_objects_are_written_at_the_line_and_owned_at_its_versions(plane, crds) -> None:
    _, kube = plane
    ns = f"t-theia-lines-{uuid.uuid4().hex[:6]}"
    create_namespace(kube, ns, labels={"warmpool-test": "true"}, timeout=30)
    made = create_appdef(kube, ns, min_instances=1)
    assert made["apiVersion"] == f"theia.cloud/{EXPECTED[crds].appdefinition}"
    create_session(kube, ns, "s1", USERS[1])
    run_until_quiet(kube, ns)
    k = held_instance(kube, ns, "s1")
    for obj in instance_objects(kube, ns, "java", k).values():
        assert owner_kinds(obj) == ["AppDefinition", "Session"]
        assert {r["kind"]: r["apiVersion"] for r in obj["metadata"]["ownerReferences"]} == {
            "AppDefinition": f"theia.cloud/{EXPECTED[crds].appdefinition}",
            "Session": f"theia.cloud/{EXPECTED[crds].session}"}
    # The garbage collector resolves those references: the Session's go when it does.
    delete_session(kube, ns, "s1")
    wait_for(lambda: all("Session" not in owner_kinds(o)
                         for o in instance_objects(kube, ns, "java", k).values()),
             timeout=90, message="the garbage collector to drop the Session references")
