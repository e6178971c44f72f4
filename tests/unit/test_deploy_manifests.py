"""deploy/: the kustomize base, components and overlays, rendered by kubectl's own kustomize
(offline, no server) and checked for what the README promises: the CRDs are the package's, every
pod is locked down, the command lines are ones the real CLI accepts, probes and ports line up,
the Role grants nothing broad. The cluster-side checks (server dry-run, `kubectl auth can-i`,
the scheduler and workers running as the ServiceAccount) are in
tests/integration/test_deploy_cluster.py.
"""

from __future__ import annotations

import copy
import filecmp
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from warmpool.queue.settings import QueueSettings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CRD_SOURCE = ROOT / "warmpool" / "kube" / "crds"
MULTIPROC_DIR = "/var/run/warmpool/prometheus"
POD_KINDS = ("Deployment",)


def kubectl() -> str:
    path = shutil.which("kubectl")
    assert path, "kubectl is needed to render deploy/ (kubectl kustomize)"
    return path


def kustomize(path: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize PATH`: the objects the README's `kubectl apply -k PATH` would send."""
    out = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return deployment["spec"]["template"]["spec"]["containers"]


def container(objs: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    (c,) = containers(by_kind(objs, "Deployment")[deployment])
    return c


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env") or []}


def parse_cli(args: list[str]) -> tuple[str, dict[str, Any]]:
    """Parse a container's args exactly as `warmpool ARGS` would, without running anything:
    an unknown option, a bad value or a missing sub-command raises click's error."""
    from warmpool.cli.main import _register, cli

    _register()
    name, *rest = args
    assert not name.startswith("-"), f"the first argument selects the role: {args}"
    with cli.make_context("warmpool", [name]) as ctx:
        cmd = cli.get_command(ctx, name)
        if cmd is None:
            raise click.UsageError(f"no such command {name!r}")
        with cmd.make_context(name, rest, parent=ctx) as sub:
            return name, dict(sub.params)


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return kustomize(DEPLOY / "base")


@pytest.fixture(scope="module")
def with_redis() -> list[dict[str, Any]]:
    return kustomize(DEPLOY / "overlays" / "with-redis")


@pytest.fixture(scope="module")
def example() -> list[dict[str, Any]]:
    return kustomize(DEPLOY / "overlays" / "example")


# --- what is in it -------------------------------------------------------------------------


#: Installed by the local control plane for its tests; a real cluster has its own Gateway API
#: (its gateway implementation installs the CRDs at the version it supports).
GATEWAY_API_CRD = "gateway.networking.k8s.io_httproutes.yaml"


def test_the_crds_in_deploy_are_the_packages_own_byte_for_byte() -> None:
    shipped = sorted(p.name for p in CRD_SOURCE.glob("*.yaml") if p.name != GATEWAY_API_CRD)
    copied = sorted(p.name for p in (DEPLOY / "base" / "crds").glob("*.yaml"))
    assert copied == shipped
    _, mismatch, errors = filecmp.cmpfiles(CRD_SOURCE, DEPLOY / "base" / "crds", shipped,
                                           shallow=False)
    assert not mismatch and not errors, (
        f"deploy/base/crds differs from warmpool/kube/crds in {mismatch + errors}: "
        "cp warmpool/kube/crds/*.yaml deploy/base/crds/")


def test_the_base_holds_exactly_the_controller_and_nothing_cluster_wide_but_crds(
    base: list[dict[str, Any]],
) -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in base)
    assert kinds == sorted([
        ("CustomResourceDefinition", "appdefinitions.theia.cloud"),
        ("CustomResourceDefinition", "sessions.theia.cloud"),
        ("CustomResourceDefinition", "poolschedules.warmpool.io"),
        ("ServiceAccount", "warmpool-scheduler"),
        ("Role", "warmpool-scheduler"),
        ("RoleBinding", "warmpool-scheduler"),
        ("ServiceAccount", "warmpool-worker"),
        ("Role", "warmpool-worker"),
        ("RoleBinding", "warmpool-worker"),
        ("ConfigMap", by_kind(base, "ConfigMap").popitem()[0]),
        ("Deployment", "warmpool-scheduler"),
        ("Deployment", "warmpool-worker"),
        ("PodDisruptionBudget", "warmpool-scheduler"),
        ("PodDisruptionBudget", "warmpool-worker"),
        ("Service", "warmpool-scheduler-metrics"),
        ("Service", "warmpool-worker-metrics"),
        ("NetworkPolicy", "theia-cloud-instances"),
        ("NetworkPolicy", "warmpool-controller"),
    ])
    for o in base:
        if o["kind"] != "CustomResourceDefinition":
            assert o["metadata"]["namespace"] == "theia-cloud", o["metadata"]["name"]
    # The CRDs are the package's, unchanged by kustomize (no namespace, no labels added).
    for o in by_kind(base, "CustomResourceDefinition").values():
        source = CRD_SOURCE / f"{o['spec']['names']['plural']}.yaml"
        assert o == yaml.safe_load(source.read_text())


ROLES = {"scheduler": "warmpool-scheduler", "worker": "warmpool-worker"}


def test_each_role_is_namespaced_narrow_and_bound_to_its_own_serviceaccount(
    base: list[dict[str, Any]],
) -> None:
    assert not by_kind(base, "ClusterRole") and not by_kind(base, "ClusterRoleBinding")
    deployments = by_kind(base, "Deployment")
    for name in ROLES.values():
        role = by_kind(base, "Role")[name]
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
            assert "update" not in rule["verbs"], "the code never updates; it merge-patches"
            assert not {"secrets", "namespaces", "nodes"} & set(rule["resources"]), rule
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule
        binding = by_kind(base, "RoleBinding")[name]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": name}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name,
                                        "namespace": "theia-cloud"}]
        assert deployments[name]["spec"]["template"]["spec"]["serviceAccountName"] == name
    # The Lease rule names the scheduler's default Lease, and only the scheduler has one.
    from scheduler.leader import DEFAULT_LEASE_NAME
    named = [r for r in by_kind(base, "Role")["warmpool-scheduler"]["rules"]
             if r.get("resourceNames")]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": [DEFAULT_LEASE_NAME], "verbs": ["get", "patch"]}]
    # Point 7 of issue #27: the scheduler runs no code and changes no pool object.
    scheduler = granted(by_kind(base, "Role")["warmpool-scheduler"])
    assert not {g for g in scheduler if g[1] in ("pods", "deployments", "services",
                                                 "configmaps", "httproutes", "ingresses")
                and g[2] not in ("list", "watch")}
    # Issue #29: the scheduler writes nothing but its Lease (timeouts and schedule status are
    # the workers' jobs); the workers get no Lease.
    assert {g for g in scheduler if g[2] not in ("list", "watch")} == {
        (LEASES, "leases", verb) for verb in ("create", "get", "patch")}
    worker = granted(by_kind(base, "Role")["warmpool-worker"])
    assert not {g for g in worker if g[1] == "leases"}


# --- the verbs, derived from the code -------------------------------------------------------

Grant = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)
KUBE_METHODS = {"serves", "get", "list", "list_pages", "create", "merge_patch", "json_patch",
                "delete", "watch", "event"}
#: Modules run by people and tests, never by the deployed roles: the admin CLI (its own
#: Role, components/admin), the demo, the harness, the test world, the invariant checker and
#: the sequential driver.
NOT_DEPLOYED = ("warmpool.cli.demo", "warmpool.cli.status", "warmpool.cli.scale",
                "warmpool.testing.", "warmpool.harness.", "warmpool.invariants",
                "warmpool.controller.sequential")


def _grants(group: str, resources: str, verbs: str) -> set[Grant]:
    return {(group, r, verb) for r in resources.split() for verb in verbs.split()}


THEIA, GW, NET, SCHED, LEASES = ("theia.cloud", "gateway.networking.k8s.io",
                                 "networking.k8s.io", "warmpool.io", "coordination.k8s.io")
#: (apiGroup, resource) of the five parts of an instance.
POOL_PARTS = {("", "services"), ("", "configmaps"), ("apps", "deployments")}
#: ... and of what each role's Reflectors watch (scheduler/app.py's, warmpool/kube/cache.py's).
WATCHED = POOL_PARTS | {(THEIA, "appdefinitions"), (THEIA, "sessions"),
                        (SCHED, "poolschedules"), (GW, "httproutes"), (NET, "ingresses")}


def _with(kinds: set[tuple[str, str]], verbs: str) -> set[Grant]:
    return {(group, resource, verb) for group, resource in kinds for verb in verbs.split()}


#: An Event is aggregated per cause (warmpool/kube/events.py): read, then created or its
#: count raised.
EVENTS = _grants("", "events", "get create patch")


def _parts(verbs: str) -> set[Grant]:
    return _with(POOL_PARTS, verbs)


def _watched(verb: str) -> set[Grant]:
    return _with(WATCHED, verb)


def _worker_watched(verb: str) -> set[Grant]:
    """What only the workers' caches watch besides `WATCHED`."""
    return {("", "pods", verb), ("apps", "replicasets", verb)}


#: Every call of Kube (warmpool/kube/api.py) in the deployed code, found by
#: `test_every_kube_call_is_in_the_table`: (module, function) -> {role: the grants it needs}.
#: A role absent from a call's entry does not reach that call (checked against the import
#: graph where it decides: a module only one role imports belongs to that role).
KUBE_CALLS: dict[tuple[str, str], dict[str, set[Grant]]] = {
    # Namespace get at start: a 403 reads as "exists" (no rule wanted).
    ("warmpool.config", "check_namespaces"): {"scheduler": set(), "worker": set()},
    # Discovery only (whether HTTPRoutes are served; the Theia Cloud line): no rule wanted.
    ("warmpool.kube.kinds", "settle_routes"): {"scheduler": set(), "worker": set()},
    ("warmpool.kube.reflector", "Reflector.list_and_sync"): {
        "scheduler": _watched("list"), "worker": _watched("list") | _worker_watched("list")},
    # The workers' caches watch the pool's pods too (warm first), and its ReplicaSets (a
    # claim's pod refresh reads no LIST), issue #28.
    ("warmpool.kube.reflector", "Reflector.watch_once"): {
        "scheduler": _watched("watch"), "worker": _watched("watch") | _worker_watched("watch")},
    ("scheduler.leader", "LeaderElector._get"): {"scheduler": {(LEASES, "leases", "get")}},
    ("scheduler.leader", "LeaderElector.try_acquire_or_renew"): {
        "scheduler": _grants(LEASES, "leases", "create patch")},
    ("scheduler.leader", "LeaderElector.release"): {"scheduler": {(LEASES, "leases", "patch")}},
    ("scheduler.leader", "LeaderElector.watch_lease"): {
        "scheduler": _grants(LEASES, "leases", "list watch")},
    # The pool's job keeps its PoolSchedules' status (issue #29: no timer outside the queue).
    ("warmpool.controller.schedules", "_write_status"): {
        "worker": {(SCHED, "poolschedules/status", "patch")}},
    # Session timeouts run as the workers' `timeout/` jobs (issue #29); `run_once`'s lists
    # are the tools' and tests' pass over a namespace.
    ("warmpool.controller.timeouts", "LiveSource._all"): {
        "worker": _grants(THEIA, "appdefinitions sessions", "list")},
    ("warmpool.controller.timeouts", "PoolServiceEndpoints._of"): {
        "worker": {("", "services", "list")}},
    # A lastActivity in the future or unreadable is rewritten to the server's now (issue #29).
    ("warmpool.controller.timeouts", "TimeoutRunner._write_last_activity"): {
        "worker": {(THEIA, "sessions/status", "patch")}},
    ("warmpool.controller.timeouts", "TimeoutRunner._delete"): {
        "worker": {*EVENTS, (THEIA, "sessions", "delete")}},
    # SetSessionStatus: the activity tracker, the claims and releases.
    ("warmpool.kube.executor", "Executor._set_status"): {
        "worker": {(THEIA, "sessions/status", "patch"), (THEIA, "sessions", "get")}},
    # Everything else the executor does runs in the workers' jobs only.
    ("warmpool.kube.executor", "Executor._pods"): {"worker": {("", "pods", "list")}},
    # One pod by name, still a LIST (the server reads its one key): no `get` on pods.
    ("warmpool.kube.executor", "Executor._pod_named"): {"worker": {("", "pods", "list")}},
    ("warmpool.kube.executor", "Executor._replica_sets"): {
        "worker": {("apps", "replicasets", "list")}},
    ("warmpool.kube.executor", "Executor._create"): {"worker": (
        _parts("create") | {(GW, "httproutes", "create")})},
    ("warmpool.kube.executor", "Executor._patch"): {"worker": (
        _parts("patch") | {(GW, "httproutes", "patch"), (NET, "ingresses", "patch")})},
    ("warmpool.kube.executor", "Executor._delete"): {"worker": (
        _parts("delete") | {(GW, "httproutes", "delete")})},
    ("warmpool.kube.executor", "Executor._annotate_session"): {
        "worker": {(THEIA, "sessions", "patch")}},
    ("warmpool.kube.executor", "Executor._report"): {"worker": {*EVENTS}},
    # Pod resets and refreshes touch only the pods of the instance's own Deployment: its
    # ReplicaSets are listed to tell them apart (issue #27, point 5; `_replica_sets` above).
    ("warmpool.kube.executor", "Executor._delete_pod"): {"worker": {("", "pods", "delete")}},
    ("warmpool.kube.executor", "Executor._stamp_pod"): {"worker": {("", "pods", "patch")}},
    ("warmpool.controller.reconcile", "_deciding_write"): {"worker": {("", "services",
                                                                       "patch")}},
    ("warmpool.controller.availability", "SessionWrites.give_up"): {
        "worker": {*EVENTS}},
    # The pool's condition on its AppDefinition (issue #28): read, then a JSON patch of the
    # status that tests the version and generation read.
    ("warmpool.controller.health", "report_pool_health"): {"worker": {
        (THEIA, "appdefinitions", "get"), (THEIA, "appdefinitions/status", "patch")}},
    ("warmpool.kube.observe", "read_appdef"): {"worker": {(THEIA, "appdefinitions", "get")}},
    ("warmpool.kube.observe", "read_session"): {"worker": {(THEIA, "sessions", "get")}},
    ("warmpool.kube.observe", "list_sessions"): {"worker": {(THEIA, "sessions", "list")}},
    ("warmpool.kube.observe", "proxy_template"): {"worker": {("", "configmaps", "get")}},
    ("warmpool.kube.observe", "read_route"): {"worker": {(GW, "httproutes", "get")}},
    ("warmpool.kube.observe", "read_ingress"): {"worker": {(NET, "ingresses", "get")}},
    ("warmpool.kube.observe", "list_session_routes"): {"worker": {(GW, "httproutes", "list")}},
    ("warmpool.kube.observe", "list_schedules"): {"worker": {(SCHED, "poolschedules", "list")}},
    ("warmpool.kube.observe", "observe_instance"): {"worker": _parts("get")},
    ("warmpool.kube.observe", "list_pool_objects"): {"worker": _parts("list")},
    ("warmpool.kube.observe", "list_pool_pods"): {"worker": {("", "pods", "list")}},
    # The sweep of pool objects nothing owns confirms "its AppDefinition is gone" on the
    # server (reliability.md, finding 18); its Sessions come from list_sessions above.
    ("warmpool.controller.orphans", "sweep_orphans"): {
        "worker": {(THEIA, "appdefinitions", "list")}},
    # A double claim's release is decided on the server's references (issue #27).
    ("warmpool.kube.observe", "referencing"): {"worker": {("", "services", "list")}},
    ("warmpool.kube.reader", "LiveReader.appdef"): {
        "worker": _grants(THEIA, "appdefinitions", "get list")},
    ("warmpool.kube.reader", "_labelled_services"): {"worker": {("", "services", "list")}},
    ("warmpool.kube.reader", "CachedReader.appdef"): {
        "worker": {(THEIA, "appdefinitions", "get")}},
    ("warmpool.kube.reader", "CachedReader.session"): {"worker": {(THEIA, "sessions", "get")}},
    ("warmpool.kube.reader", "LiveReader.object"): {
        "worker": _grants(THEIA, "appdefinitions sessions", "get")},
    ("warmpool.kube.reader", "CachedReader.object"): {
        "worker": _grants(THEIA, "appdefinitions sessions", "get")},
}


def kube_call_sites() -> set[tuple[str, str]]:
    """(module, Class.function) of every call `<...>kube.<Kube method>(...)` in the code."""
    import ast

    found: set[tuple[str, str]] = set()
    for package in ("warmpool", "scheduler", "workers", "metrics"):
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)

            def walk(node: ast.AST, where: list[str], module: str = module) -> None:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                        walk(child, [*where, child.name])
                        continue
                    func = getattr(child, "func", None)
                    target = getattr(func, "value", None)
                    named = ((isinstance(target, ast.Name) and target.id == "kube")
                             or (isinstance(target, ast.Attribute)
                                 and target.attr.endswith("kube")))
                    if (isinstance(child, ast.Call) and isinstance(func, ast.Attribute)
                            and func.attr in KUBE_METHODS and named):
                        found.add((module, ".".join(where)))
                    walk(child, where)

            walk(ast.parse(path.read_text()), [])
    return {site for site in found if not site[0].startswith(NOT_DEPLOYED)}


def role_modules() -> dict[str, set[str]]:
    """The modules each role's process imports (its package and everything it reaches)."""
    import grimp

    graph = grimp.build_graph("warmpool", "scheduler", "workers", "metrics")
    out = {}
    for role, package in (("scheduler", "scheduler"), ("worker", "workers")):
        roots = {m for m in graph.modules if m == package or m.startswith(f"{package}.")}
        out[role] = roots | {up for m in roots for up in graph.find_upstream_modules(m)}
    return out


def granted(role: dict[str, Any]) -> set[Grant]:
    """A Role's rules as (apiGroup, resource, verb) triples; named rules as "<resource>/<name>"
    only where the name limits them (the Lease)."""
    out: set[Grant] = set()
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out


def test_every_kube_call_is_in_the_table() -> None:
    """A Kube call added anywhere in the deployed code fails here until its grants and its
    role are in KUBE_CALLS (and then the Role must follow: the test below)."""
    sites = kube_call_sites()
    assert sites - KUBE_CALLS.keys() == set(), "Kube calls missing from KUBE_CALLS"
    assert KUBE_CALLS.keys() - sites == set(), "KUBE_CALLS names calls that are gone"


def test_each_call_is_assigned_to_the_roles_that_import_it() -> None:
    modules = role_modules()
    for (module, function), roles in KUBE_CALLS.items():
        importers = {role for role, mods in modules.items() if module in mods}
        assert set(roles) <= importers, f"{module}.{function}: {set(roles) - importers} " \
            "cannot reach it"
        if len(importers) == 1:
            assert set(roles) == importers, f"{module}.{function} runs in {importers}"


@pytest.mark.parametrize("role", sorted(ROLES))
def test_each_role_grants_exactly_what_its_calls_need(
    base: list[dict[str, Any]], role: str,
) -> None:
    needed = set().union(*(grants.get(role, set()) for grants in KUBE_CALLS.values()))
    rules = granted(by_kind(base, "Role")[ROLES[role]])
    assert rules - needed == set(), f"{ROLES[role]} grants what no call of its role needs"
    assert needed - rules == set(), f"{ROLES[role]} lacks what its calls need"


# --- pods ----------------------------------------------------------------------------------


def _assert_locked_down(deployment: dict[str, Any]) -> None:
    name = deployment["metadata"]["name"]
    pod = deployment["spec"]["template"]["spec"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0, name
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, name
    mounts_by_volume = {v["name"]: v for v in pod.get("volumes") or []}
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0, (name, c["name"])
        assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])
        assert sc["allowPrivilegeEscalation"] is False, (name, c["name"])
        assert sc.get("privileged", False) is False, (name, c["name"])
        assert sc["capabilities"] == {"drop": ["ALL"]}, (name, c["name"])
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, (name, c["name"])
        assert "resources" in c and c["resources"]["requests"] and c["resources"]["limits"]
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
        assert "emptyDir" in mounts_by_volume[mounts["/tmp"]], (name, "a writable /tmp")


def test_every_pod_runs_non_root_read_only_without_capabilities(
    base: list[dict[str, Any]], with_redis: list[dict[str, Any]],
) -> None:
    deployments = {**by_kind(base, "Deployment"), **by_kind(with_redis, "Deployment")}
    assert sorted(deployments) == ["warmpool-redis", "warmpool-scheduler", "warmpool-worker"]
    for d in deployments.values():
        _assert_locked_down(d)


def test_workers_have_a_writable_multiprocess_dir_and_the_image_agrees(
    base: list[dict[str, Any]],
) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"PROMETHEUS_MULTIPROC_DIR={MULTIPROC_DIR}" in dockerfile
    d = by_kind(base, "Deployment")["warmpool-worker"]
    (c,) = containers(d)
    assert env_of(c)["PROMETHEUS_MULTIPROC_DIR"]["value"] == MULTIPROC_DIR
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in d["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes[mounts[MULTIPROC_DIR]]
    # The scheduler is one process: single-process mode (prometheus-client takes an empty
    # value as unset), so the image's default is overridden.
    sched = container(base, "warmpool-scheduler")
    assert env_of(sched)["PROMETHEUS_MULTIPROC_DIR"]["value"] == ""
    assert c["image"] == sched["image"] == "warmpool:0.1.0"


def test_container_args_are_accepted_by_the_real_cli(base: list[dict[str, Any]]) -> None:
    name, params = parse_cli(container(base, "warmpool-scheduler")["args"])
    assert name == "scheduler"
    assert params["leader_elect"] is True
    assert params["health_host"] == "0.0.0.0"  # the kubelet probes the pod's IP
    health = {p["name"]: p["containerPort"]
              for p in container(base, "warmpool-scheduler")["ports"]}["health"]
    assert params["health_port"] == health
    if "metrics_port" in params:
        assert params["metrics_host"] == "0.0.0.0"
        assert params["metrics_port"] == {p["name"]: p["containerPort"] for p in container(
            base, "warmpool-scheduler")["ports"]}["metrics"]
    name, params = parse_cli(container(base, "warmpool-worker")["args"])
    assert name == "worker"
    if "metrics_port" in params:
        assert params["metrics_host"] == "0.0.0.0"
        assert params["metrics_port"] == {p["name"]: p["containerPort"] for p in container(
            base, "warmpool-worker")["ports"]}["metrics"]
    assert params["processes"] >= 1 and params["threads"] >= 1
    # --processes matches the CPU limit (one busy process per core at most).
    cpu = container(base, "warmpool-worker")["resources"]["limits"]["cpu"]
    assert params["processes"] == int(cpu)


def test_the_deployed_resync_leaves_no_release_waiting_minutes(
    base: list[dict[str, Any]],
) -> None:
    """A release whose key Redis lost (without the epoch noticing) waits for the periodic
    resync: the deployed period is a minute at most, and said so in the manifest."""
    _, params = parse_cli(container(base, "warmpool-scheduler")["args"])
    assert 0 < params["resync_period"] <= 60
    text = (DEPLOY / "base" / "scheduler.yaml").read_text()
    assert "--resync-period" in text and "backstop" in text


def test_a_misspelt_option_would_be_caught() -> None:
    with pytest.raises(click.NoSuchOption):
        parse_cli(["scheduler", "--health-prot=8080"])


def test_both_roles_read_namespace_redis_url_and_config_from_the_cluster(
    base: list[dict[str, Any]],
) -> None:
    config = by_kind(base, "ConfigMap")
    (config_name,) = config
    assert config_name.startswith("warmpool-config-")  # generated: a change rolls the pods
    data = config[config_name]["data"]
    # WARMPOOL_ROUTES unset: the routing follows the install (warmpool.pool.lines).
    assert set(data) == {"WARMPOOL_INSTANCES_HOST", "WARMPOOL_SESSIONS_PER_USER",
                         "WARMPOOL_URL_PROBE", "WARMPOOL_TIMEOUTS",
                         "WARMPOOL_ACTIVITY_TRACKER", "WARMPOOL_OAUTH2_PROXY_IMAGE",
                         "WARMPOOL_TRUSTED_PROXY_IPS", "WARMPOOL_PROXY_SECRET"}
    assert data["WARMPOOL_SESSIONS_PER_USER"] == "1"  # as Theia Cloud's chart sets it
    # Every value as the controller reads it (a typo here fails the roles at start).
    from warmpool.controller.timeouts import TimeoutSettings
    from warmpool.pool.builders import PoolSettings

    settings = PoolSettings.from_env(data)
    assert (settings.routes, settings.url_probe) == ("httproute", True)
    # The proxy's image as deployed is the code's default (issue #27), not an older one.
    assert settings.oauth2_proxy_image == PoolSettings().oauth2_proxy_image
    assert (settings.trusted_proxy_ips, settings.proxy_secret) == ((), "")
    assert TimeoutSettings.from_env(data).enabled
    for name in ("warmpool-scheduler", "warmpool-worker"):
        c = container(base, name)
        env = env_of(c)
        assert env["WARMPOOL_NAMESPACE"]["valueFrom"] == {
            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}
        } or env["WARMPOOL_NAMESPACE"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "metadata.namespace"}}
        # Never optional: without a URL the roles refuse to start (exit 4), a crash loop.
        assert env["WARMPOOL_REDIS_URL"]["valueFrom"] == {
            "secretKeyRef": {"name": "warmpool-redis", "key": "url"}}
        assert c["envFrom"] == [{"configMapRef": {"name": config_name}}]
        assert "KUBECONFIG" not in env  # in-cluster config from the ServiceAccount


# --- probes, ports, disruption -------------------------------------------------------------


def test_scheduler_probes_use_healthz_and_readyz(base: list[dict[str, Any]]) -> None:
    c = container(base, "warmpool-scheduler")
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


def test_worker_probes_use_the_supervisors_healthz_and_readyz(
    base: list[dict[str, Any]],
) -> None:
    c = container(base, "warmpool-worker")
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert not any("exec" in c[p] for p in ("startupProbe", "livenessProbe", "readinessProbe"))
    _, params = parse_cli(c["args"])
    assert params["health_on"] is not False
    assert params["health_host"] == "0.0.0.0"  # the kubelet probes the pod's IP
    assert params["health_port"] == {p["name"]: p["containerPort"] for p in c["ports"]}[
        "health"]


def test_metrics_ports_services_and_monitors_line_up(base: list[dict[str, Any]]) -> None:
    expected = {"warmpool-scheduler": 9090, "warmpool-worker": 9091}
    services = by_kind(base, "Service")
    monitors = kustomize_component("prometheus-operator")
    for name, port in expected.items():
        c = container(base, name)
        assert {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"] == port
        pod_labels = by_kind(base, "Deployment")[name]["spec"]["template"]["metadata"]["labels"]
        svc = services[f"{name}-metrics"]
        assert svc["spec"]["clusterIP"] == "None"
        assert svc["spec"]["ports"] == [{"name": "metrics", "port": port,
                                         "targetPort": "metrics", "protocol": "TCP"}]
        assert svc["spec"]["selector"].items() <= pod_labels.items()
        # Selects this role's pods only.
        other = next(n for n in expected if n != name)
        other_labels = by_kind(base, "Deployment")[other]["spec"]["template"]["metadata"][
            "labels"]
        assert not svc["spec"]["selector"].items() <= other_labels.items()
    sm = by_kind(monitors, "ServiceMonitor")["warmpool-scheduler"]
    svc = services["warmpool-scheduler-metrics"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    pm = by_kind(monitors, "PodMonitor")["warmpool-worker"]
    worker_labels = by_kind(base, "Deployment")["warmpool-worker"]["spec"]["template"][
        "metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= worker_labels.items()
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def kustomize_component(name: str) -> list[dict[str, Any]]:
    """A component's objects, rendered on the base through a throwaway overlay."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [_rel(DEPLOY / "base", Path(tmp))],
            "components": [_rel(DEPLOY / "components" / name, Path(tmp))],
        }))
        return kustomize(Path(tmp))


def _rel(target: Path, start: Path) -> str:
    import os

    return os.path.relpath(target, start)  # kustomize refuses absolute paths


def test_scheduler_keeps_two_replicas_and_one_through_a_drain(base: list[dict[str, Any]]) -> None:
    d = by_kind(base, "Deployment")["warmpool-scheduler"]
    assert d["spec"]["replicas"] == 2
    assert d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdb = by_kind(base, "PodDisruptionBudget")["warmpool-scheduler"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == d["spec"]["selector"]["matchLabels"]


def test_workers_get_time_to_drain_before_sigkill(base: list[dict[str, Any]]) -> None:
    d = by_kind(base, "Deployment")["warmpool-worker"]
    s = QueueSettings()
    grace = d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # WorkerPool.stop: drain_timeout + 10 s, then SIGKILL and a 5 s join; the leases of
    # anything cut off lapse after lease_ttl.
    assert grace > s.drain_timeout + 10 + 5
    assert grace > s.lease_ttl
    pdb = by_kind(base, "PodDisruptionBudget")["warmpool-worker"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == d["spec"]["selector"]["matchLabels"]
    assert d["spec"]["replicas"] >= 2


# --- components and overlays ---------------------------------------------------------------


def test_redis_component_runs_without_persistence_with_a_password_from_the_secret(
    with_redis: list[dict[str, Any]],
) -> None:
    d = by_kind(with_redis, "Deployment")["warmpool-redis"]
    (c,) = containers(d)
    args = c["args"]
    assert args[args.index("--save") + 1] == ""
    assert args[args.index("--appendonly") + 1] == "no"
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert env_of(c)["REDIS_PASSWORD"]["valueFrom"] == {
        "secretKeyRef": {"name": "warmpool-redis", "key": "password"}}
    assert d["spec"]["strategy"] == {"type": "Recreate"}
    assert d["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    svc = by_kind(with_redis, "Service")["warmpool-redis"]
    assert svc["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    # Only warmpool's pods may connect, and both of warmpool's roles are selected.
    policy = by_kind(with_redis, "NetworkPolicy")["warmpool-redis"]
    (allowed,) = policy["spec"]["ingress"][0]["from"]
    for name in ("warmpool-scheduler", "warmpool-worker"):
        labels = by_kind(with_redis, "Deployment")[name]["spec"]["template"]["metadata"][
            "labels"]
        assert allowed["podSelector"]["matchLabels"].items() <= labels.items()
    assert not allowed["podSelector"]["matchLabels"].items() <= d["spec"]["template"][
        "metadata"]["labels"].items()


def test_example_overlay_points_at_an_external_redis_with_tls(
    example: list[dict[str, Any]],
) -> None:
    assert not by_kind(example, "Deployment").get("warmpool-redis")
    # Theia Cloud's chart owns its CRDs there (components/without-crds); warmpool's own
    # PoolSchedule stays.
    assert list(by_kind(example, "CustomResourceDefinition")) == ["poolschedules.warmpool.io"]
    for o in example:
        if o["kind"] != "CustomResourceDefinition":
            assert o["metadata"]["namespace"] == "theia-prod"
    for name in ROLES.values():
        assert by_kind(example, "RoleBinding")[name]["subjects"][0]["namespace"] == (
            "theia-prod")
    assert "warmpool-admin" in by_kind(example, "Role")
    for name in ("warmpool-scheduler", "warmpool-worker"):
        d = by_kind(example, "Deployment")[name]
        (c,) = containers(d)
        assert c["image"] == "registry.example.com/theia/warmpool:0.1.0"
        volumes = {v["name"]: v for v in d["spec"]["template"]["spec"]["volumes"]}
        assert volumes["redis-tls"]["secret"]["secretName"] == "warmpool-redis-tls"
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["redis-tls"]["mountPath"] == "/etc/warmpool/redis-tls"
        assert mounts["redis-tls"]["readOnly"] is True
        _assert_locked_down(d)
    assert by_kind(example, "Deployment")["warmpool-worker"]["spec"]["replicas"] == 6
    (config,) = by_kind(example, "ConfigMap").values()
    assert config["data"]["WARMPOOL_INSTANCES_HOST"] == "instances.theia.example.com"
    # The URL format the overlay documents is one redis-py turns into a verified TLS connection.
    import redis

    text = (DEPLOY / "overlays" / "example" / "kustomization.yaml").read_text()
    (url,) = re.findall(r"rediss://[^'\s]+", text)
    url = url.replace("<password>", "secret")
    pool = redis.ConnectionPool.from_url(url)
    assert pool.connection_class is redis.SSLConnection
    conn = pool.make_connection()
    assert conn.ca_certs == "/etc/warmpool/redis-tls/ca.crt"
    assert conn.cert_reqs == 2  # ssl.CERT_REQUIRED
    assert conn.password == "secret"


# --- the instances' NetworkPolicy ------------------------------------------------------------


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector's verdict on a pod's labels (matchLabels and matchExpressions)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
    return True


def instance_pod_labels() -> dict[str, str]:
    """The labels of an instance's pod, as the controller builds its Deployment."""
    from tests.unit.pool_fixtures import SETTINGS, appdef
    from warmpool.pool import builders
    from warmpool.pool.parts import Part

    deployment = builders.build(Part.DEPLOYMENT, appdef(), 3, holder=None, proxy_template=None,
                                settings=SETTINGS)
    return dict(deployment["spec"]["template"]["metadata"]["labels"])


def proxy_port() -> int:
    from tests.unit.pool_fixtures import SETTINGS, appdef
    from warmpool.pool import builders
    from warmpool.pool.parts import Part

    deployment = builders.build(Part.DEPLOYMENT, appdef(), 3, holder=None, proxy_template=None,
                                settings=SETTINGS)
    ports = {p.get("name"): p["containerPort"]
             for c in deployment["spec"]["template"]["spec"]["containers"]
             for p in c.get("ports") or []}
    return int(ports["web"])


#: The Theia Cloud service's pods (its Helm chart's Deployment `service-deployment`).
THEIA_CLOUD_SERVICE_POD = {"app": "service"}


#: The placeholder the base names as the gateway's namespace: none exists, so it admits nobody.
UNSET_GATEWAY = "set-the-gateway-namespace-in-an-overlay"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def gateway_namespaces(proxy_rule: dict[str, Any]) -> list[str]:
    """The namespaces the port-5000 rule admits: its one peer must be a namespaceSelector on
    the namespace's name, with no podSelector beside it and nothing else (issue #27)."""
    (peer,) = proxy_rule["from"]
    assert set(peer) == {"namespaceSelector"}, peer
    selector = peer["namespaceSelector"]
    assert set(selector) == {"matchExpressions"}, selector
    (expr,) = selector["matchExpressions"]
    assert (expr["key"], expr["operator"]) == (NAMESPACE_NAME_LABEL, "In"), expr
    return list(expr["values"])


def test_instance_pods_accept_the_proxy_port_from_the_gateway_namespace_only_and_the_service(
    base: list[dict[str, Any]], with_redis: list[dict[str, Any]],
) -> None:
    from warmpool.pool import vocabulary as v

    policy = by_kind(base, "NetworkPolicy")["theia-cloud-instances"]
    spec = policy["spec"]
    # It selects the instance pods the controller builds, and no pod of warmpool's own, of
    # its Redis or of the Theia Cloud service.
    assert selects(spec["podSelector"], instance_pod_labels())
    others = [THEIA_CLOUD_SERVICE_POD,
              *(d["spec"]["template"]["metadata"]["labels"]
                for d in by_kind(with_redis, "Deployment").values())]
    for labels in others:
        assert not selects(spec["podSelector"], labels), labels
    # Ingress only (egress is not this policy's business), and exactly two rules.
    assert spec["policyTypes"] == ["Ingress"]
    proxy_rule, service_rule = spec["ingress"]
    # oauth2-proxy's port, from the gateway's namespace only: as shipped, a namespace that does
    # not exist (the setting unset fails closed), never every pod (no rule without `from`).
    assert proxy_rule["ports"] == [{"port": v.OAUTH2_PROXY_PORT, "protocol": "TCP"}]
    assert v.OAUTH2_PROXY_PORT == proxy_port() == 5000
    assert gateway_namespaces(proxy_rule) == [UNSET_GATEWAY]
    assert all("from" in rule for rule in spec["ingress"])
    # ... and only the Theia Cloud service's pods, of this namespace, reach the app itself
    # (spec.port, through the internal Service): no other pod bypasses the proxy.
    (peer,) = service_rule["from"]
    assert set(peer) == {"podSelector"}, "this namespace's pods only: no namespaceSelector"
    assert selects(peer["podSelector"], THEIA_CLOUD_SERVICE_POD)
    assert not selects(peer["podSelector"], instance_pod_labels())
    for d in by_kind(with_redis, "Deployment").values():
        assert not selects(peer["podSelector"], d["spec"]["template"]["metadata"]["labels"])


def test_the_example_overlay_sets_the_gateway_namespace_and_nothing_else_of_the_policy(
    base: list[dict[str, Any]], example: list[dict[str, Any]],
) -> None:
    """The setting as the example overlay makes it (the documented patch): only the list of
    namespaces differs from the base's policy."""
    shipped = by_kind(base, "NetworkPolicy")["theia-cloud-instances"]["spec"]
    set_ = by_kind(example, "NetworkPolicy")["theia-cloud-instances"]["spec"]
    assert gateway_namespaces(set_["ingress"][0]) == ["envoy-gateway-system"]
    shipped_rule = copy.deepcopy(shipped["ingress"][0])
    shipped_rule["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] = [
        "envoy-gateway-system"]
    assert set_ == {**shipped, "ingress": [shipped_rule, shipped["ingress"][1]]}


def test_a_component_removes_the_instances_network_policy_and_nothing_else(
    base: list[dict[str, Any]],
) -> None:
    without = kustomize_component("without-instance-network-policy")
    assert "theia-cloud-instances" not in by_kind(without, "NetworkPolicy")
    assert sorted((o["kind"], o["metadata"]["name"]) for o in without) == sorted(
        (o["kind"], o["metadata"]["name"]) for o in base
        if (o["kind"], o["metadata"]["name"]) != ("NetworkPolicy", "theia-cloud-instances"))
    # The in-cluster Redis keeps its own policy when both components are used.
    assert "warmpool-redis" in by_kind(
        kustomize_components("redis", "without-instance-network-policy"), "NetworkPolicy")


def test_the_controller_pods_admit_only_metrics_from_the_monitoring_namespace(
    base: list[dict[str, Any]],
) -> None:
    """Issue #27, point 6: /metrics and /status were open to every pod. The policy selects
    both roles' pods (and no instance pod), and admits one port, named `metrics` in both
    containers, from one namespace chosen by its name label."""
    policy = by_kind(base, "NetworkPolicy")["warmpool-controller"]
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    for name in ROLES.values():
        d = by_kind(base, "Deployment")[name]
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert spec["podSelector"]["matchLabels"].items() <= labels.items(), name
        assert "metrics" in {p["name"] for p in container(base, name)["ports"]}
    assert spec["ingress"] == [{
        "from": [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "monitoring"}}}],
        "ports": [{"port": "metrics", "protocol": "TCP"}]}]


def kustomize_components(*names: str) -> list[dict[str, Any]]:
    """The base with these components, through a throwaway overlay."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [_rel(DEPLOY / "base", Path(tmp))],
            "components": [_rel(DEPLOY / "components" / n, Path(tmp)) for n in names],
        }))
        return kustomize(Path(tmp))


def test_admin_role_can_scale_but_not_write_sessions() -> None:
    role = by_kind(kustomize_component("admin"), "Role")["warmpool-admin"]
    rules = {tuple(r["resources"]): set(r["verbs"]) for r in role["rules"]}
    assert rules == {("appdefinitions",): {"get", "list", "watch", "patch"},
                     ("poolschedules",): {"get", "list", "watch", "create", "patch",
                                          "delete"},
                     ("sessions",): {"get", "list", "watch"},
                     ("services", "configmaps", "events", "pods"): {"list"},
                     ("deployments",): {"list"},
                     # `warmpool status` on the fork's line (HTTPRoutes) was refused (403)
                     ("httproutes",): {"list"},
                     ("ingresses",): {"list"}}  # and its holders' rules on upstream's line


def test_without_crds_drops_exactly_the_two_crds(base: list[dict[str, Any]]) -> None:
    rest = kustomize_component("without-crds")
    dropped = [o for o in base if o not in rest]
    assert sorted(o["metadata"]["name"] for o in dropped) == [
        "appdefinitions.theia.cloud", "sessions.theia.cloud"]
    assert len(rest) == len(base) - 2


def test_readme_section_follows_the_manifests() -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Run it on your cluster"):]
    for path in set(re.findall(r"deploy/(?:base|overlays|components|compose)[\w./-]*\w",
                               section)):
        assert (ROOT / path).exists(), path
    for target in re.findall(r"kubectl apply -k (\S+)", section):
        assert kustomize(ROOT / target)
    # The Secret the README creates is the one, with the keys, the manifests read.
    refs = set()
    for variant in ("base", "overlays/with-redis"):
        for d in by_kind(kustomize(DEPLOY / variant), "Deployment").values():
            for c in containers(d):
                for e in c.get("env") or []:
                    ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                    if ref:
                        refs.add((ref["name"], ref["key"]))
    assert refs == {("warmpool-redis", "url"), ("warmpool-redis", "password")}
    assert set(re.findall(r"create secret generic (\S+)", section)) == {"warmpool-redis"}
    assert set(re.findall(r"--from-literal=(\w+)=", section)) == {key for _, key in refs}
