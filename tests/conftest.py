"""Shared fixtures: a real local Kubernetes control plane for the whole test session.

Fixtures (use them by name as arguments):

- `cluster` (session): a `warmpool.cluster.local.ClusterInfo` with `.kubeconfig`, `.server`,
  `.token`, `.etcd_url` (for compaction, 410 tests), `.state_dir`, `.pids`. Started once per
  session in a temp dir with `--watch-cache=false` (so a compaction really gives 410 Gone), and
  stopped at the end. With WARMPOOL_TEST_KUBECONFIG set, that cluster is used instead and nothing
  is started (WARMPOOL_TEST_ETCD_URL may then name its etcd).
- `crds` (session): which Theia Cloud CRDs `cluster` has: "warmpool" (warmpool's own, the
  EduIDE-Cloud fork's versions) unless a test is parametrized over both with
  `tests.crd_sets.BOTH_CRD_SETS`. One kube-apiserver holds one CRD per kind, so upstream's set
  runs on a second control plane, started the first time a test asks for it (about 15 s) and
  kept for the session; WARMPOOL_TEST_UPSTREAM_KUBECONFIG names an external one instead.
- `kube_api` (session): a `kubernetes.client.ApiClient` for that cluster. Never the global
  default configuration, so a stray ~/.kube/config can never be touched by a test.
- `kube` (session): `warmpool.kube.api.Kube` on `kube_api` (plain dicts, typed errors).
- `core_v1`, `apps_v1`, `custom_objects` (session): the API groups on `kube_api`.
- `namespace` (function): a fresh, uniquely named namespace (its default ServiceAccount is
  ready, so pods can be created at once), deleted after the test.
- `redis_url`, `redis_client`, `queue_settings`: a real Redis and a per-test key prefix
  (tests/plugins/redis.py, registered below).

Tests that use the cluster get the `cluster` marker automatically, so `-m "not cluster"` selects
the rest; nothing is skipped: the fixtures build and start what is missing.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from warmpool.cluster import local
from warmpool.kube.api import Kube
from warmpool.kube.cache import ClusterCache
from warmpool.testing.world import create_namespace

# tests/ is a package (so is each folder under it): pytest puts the repository root on
# sys.path, and `tests.<module>` imports work under plain `pytest` too.
pytest_plugins = ["tests.plugins.redis"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that needs the control plane (directly or through another fixture)."""
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


def _external_cluster(kubeconfig: Path) -> local.ClusterInfo:
    """Describe a cluster given by kubeconfig (current context, token auth) without owning it."""
    cfg = yaml.safe_load(kubeconfig.read_text())
    ctx_name = cfg.get("current-context")
    ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
    server = next(c["cluster"]["server"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
    user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
    return local.ClusterInfo(
        kubeconfig=kubeconfig, server=server, token=str(user.get("token", "")),
        etcd_url=os.environ.get("WARMPOOL_TEST_ETCD_URL") or None,
    )


class ControlPlanes:
    """The session's control planes, one per CRD set, each started when first asked for and
    stopped at the end of the session (not when the tests switch from one set to the other:
    pytest sets up a session fixture again for each parameter, a control plane must not)."""

    EXTERNAL = {"warmpool": "WARMPOOL_TEST_KUBECONFIG",
                "upstream": "WARMPOOL_TEST_UPSTREAM_KUBECONFIG"}

    def __init__(self, request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> None:
        self._request = request
        self._tmp = tmp_path_factory
        self._started: dict[str, local.ClusterInfo] = {}

    def get(self, crds: str) -> local.ClusterInfo:
        if crds in self._started:
            return self._started[crds]
        external = os.environ.get(self.EXTERNAL[crds])
        if external:
            info = _external_cluster(Path(external))
        else:
            if not local.binaries_present():
                # Minutes, once per machine (cached outside the repo): show the stages live,
                # not captured, so a CI log does not sit silent.
                capman = self._request.config.pluginmanager.getplugin("capturemanager")
                with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
                    local.build(progress=True)
            state_dir = self._tmp.mktemp(f"cluster-{crds}")
            # die_with_parent: a killed pytest leaves no etcd or apiserver behind.
            info = local.up(state_dir, watch_cache=False, die_with_parent=True, crds=crds)
        self._started[crds] = info
        return info

    def stop(self) -> None:
        for info in self._started.values():
            if info.state_dir is not None and info.pids:
                local.down(info.state_dir)


@pytest.fixture(scope="session")
def control_planes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlanes]:
    planes = ControlPlanes(request, tmp_path_factory)
    try:
        yield planes
    finally:
        planes.stop()


@pytest.fixture(scope="session")
def crds() -> str:
    """The CRD set of `cluster`: every test that uses it is parametrized on it
    (`pytest_generate_tests`), so this default is never what a test gets."""
    return "warmpool"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize `crds` (session scope) on every test that uses a control plane and does not
    already (tests.crd_sets.BOTH_CRD_SETS), with warmpool's own set.

    Why: pytest caches a session fixture by its parameter. A test that took the fixture's
    default got the `cluster` still cached from the last parametrized test, so after
    `[upstream]` tests it ran on upstream Theia Cloud's control plane (seen: the migration
    test after test_ingress_mode, in ingress mode there). With a parameter of its own, a
    change of set tears the cached plane's dependants down, as between two parameters."""
    if "crds" not in metafunc.fixturenames:
        return
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0] if marker.args else marker.kwargs.get("argnames", "")
        listed = names.replace(" ", "").split(",") if isinstance(names, str) else list(names)
        if "crds" in listed:
            return
    metafunc.parametrize("crds", ["warmpool"], scope="session")


@pytest.fixture(scope="session")
def cluster(control_planes: ControlPlanes, crds: str) -> local.ClusterInfo:
    return control_planes.get(crds)


@pytest.fixture(scope="session")
def kube_api(cluster: local.ClusterInfo) -> Iterator[client.ApiClient]:
    api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        yield api_client
    finally:
        api_client.close()


@pytest.fixture(scope="session")
def kube(kube_api: client.ApiClient) -> Kube:
    """The controller's API wrapper on the test cluster (plain dicts, typed errors)."""
    return Kube(kube_api)


@pytest.fixture(scope="session")
def core_v1(kube_api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(kube_api)


@pytest.fixture(scope="session")
def apps_v1(kube_api: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(kube_api)


@pytest.fixture(scope="session")
def custom_objects(kube_api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube_api)


def _namespace_name(test_name: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"t-{base}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def namespace(request: pytest.FixtureRequest, kube: Kube, core_v1: client.CoreV1Api
              ) -> Iterator[str]:
    name = _namespace_name(request.node.name)
    create_namespace(kube, name, labels={"warmpool-test": "true"}, timeout=30)
    try:
        yield name
    finally:
        try:
            core_v1.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def pytest_configure(config: pytest.Config) -> None:
    # The local cluster's cert is self-signed and skipped on purpose (loopback only).
    config.addinivalue_line(
        "filterwarnings", "ignore::urllib3.exceptions.InsecureRequestWarning")


@pytest.fixture
def cache(kube: Kube, namespace: str) -> Iterator[ClusterCache]:
    """A worker's watch-fed cache of `namespace`, synced (tests that read through it)."""
    c = ClusterCache(lambda: kube, [namespace], timeout_range=(60.0, 90.0)).start()
    assert c.wait_synced(30)
    yield c
    c.stop()
