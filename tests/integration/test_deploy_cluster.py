"""deploy/ against the real control plane (kube-apiserver 1.20 with RBAC authorization):

- every manifest of the base and the overlays passes `kubectl apply --dry-run=server`, the
  instances' NetworkPolicy included (and it is created for real, selecting the instance pods);
- the CRDs and the RBAC objects, applied for real in a test namespace (the base re-rendered with
  that namespace by kustomize), allow the ServiceAccount every verb the code uses and refuse
  Secrets, cluster-wide objects, other namespaces and other Leases (`kubectl auth can-i`);
- the scheduler and the workers, installed from the wheel the Dockerfile builds (same COPY
  list), started with the manifests' own args and environment and authenticated with the
  ServiceAccount's token, pass pool-spec scenario S1 with no Forbidden anywhere; the worker runs
  as PID 1 of its own PID namespace, as in a container, and answers its HTTP probes.

The one adaptation for this 1.20 server: PodDisruptionBudgets are policy/v1 in deploy/ (1.21+,
the only version since 1.25) and are sent as policy/v1beta1 when the server lacks policy/v1.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
import yaml
from kubernetes import client as k8s

from tests.pool_world import (
    converge,
    emails,
    held_instance,
    instance_count,
    instance_objects,
    owner_kinds,
    session,
    snapshot,
)
from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo, free_port
from warmpool.harness.quiet import mark, wait_quiet
from warmpool.invariants import check
from warmpool.kube.api import Kube, KubeError
from warmpool.pool import vocabulary as v
from warmpool.queue import Layout, QueueSettings
from warmpool.testing.world import (
    USERS,
    create_appdef,
    create_session,
    delete_session,
    patch_appdef_spec,
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
#: One ServiceAccount per role (issue #27, point 7), named like the role's Deployment.
SCHEDULER_SA, WORKER_SA = "warmpool-scheduler", "warmpool-worker"
SAS = (SCHEDULER_SA, WORKER_SA)
RBAC_KINDS = ("CustomResourceDefinition", "ServiceAccount", "Role", "RoleBinding")


# --- kubectl and kustomize -----------------------------------------------------------------


def kubectl(cluster: ClusterInfo, *args: str, kubeconfig: Path | None = None,
            stdin: str | None = None, check_rc: bool = True) -> subprocess.CompletedProcess[str]:
    path = shutil.which("kubectl")
    assert path, "kubectl is needed"
    out = subprocess.run([path, f"--kubeconfig={kubeconfig or cluster.kubeconfig}", *args],
                         input=stdin, capture_output=True, text=True, timeout=120)
    if check_rc:
        assert out.returncode == 0, f"kubectl {' '.join(args)}:\n{out.stdout}\n{out.stderr}"
    return out


def render(path: Path, namespace: str, tmp_path: Path) -> list[dict[str, Any]]:
    """`path` rendered by kubectl's kustomize into `namespace`, through an overlay that only
    sets the namespace (kustomize rewrites metadata.namespace and the RoleBinding's subject)."""
    overlay = Path(tempfile.mkdtemp(prefix=f"ns-{path.name}-", dir=tmp_path))
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": namespace, "resources": [os.path.relpath(path, overlay)]}))
    out = subprocess.run([shutil.which("kubectl") or "kubectl", "kustomize", str(overlay)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def for_this_server(cluster: ClusterInfo, objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """PodDisruptionBudgets as policy/v1beta1 where the server has no policy/v1 (< 1.21); the
    two versions share every field deploy/ uses (minAvailable, maxUnavailable, selector)."""
    versions = set(kubectl(cluster, "api-versions").stdout.split())
    if "policy/v1" in versions:
        return objs
    assert "policy/v1beta1" in versions
    out = []
    for o in objs:
        if o["apiVersion"] == "policy/v1":
            assert o["kind"] == "PodDisruptionBudget"
            o = {**o, "apiVersion": "policy/v1beta1"}
        out.append(o)
    return out


def dump(objs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objs)


# --- the manifests on the server -----------------------------------------------------------


@pytest.mark.parametrize("variant", ["base", "overlays/with-redis", "overlays/example"])
def test_every_manifest_passes_server_side_dry_run(
    cluster: ClusterInfo, namespace: str, tmp_path: Path, kube: Kube, variant: str
) -> None:
    objs = for_this_server(cluster, render(DEPLOY / variant, namespace, tmp_path))
    out = kubectl(cluster, "apply", "--dry-run=server", "-f", "-", stdin=dump(objs))
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == len(objs), out.stdout
    assert all(line.endswith("(server dry run)") for line in lines), out.stdout
    kinds = {o["kind"] for o in objs}
    assert {"Deployment", "PodDisruptionBudget", "Service", "Role", "RoleBinding",
            "ServiceAccount", "ConfigMap"} <= kinds
    crds = {o["metadata"]["name"] for o in objs if o["kind"] == "CustomResourceDefinition"}
    # The example drops Theia Cloud's CRDs (its chart owns them) but keeps warmpool's own.
    theia = {"appdefinitions.theia.cloud", "sessions.theia.cloud"}
    assert crds == ({"poolschedules.warmpool.io"} if variant == "overlays/example"
                    else {*theia, "poolschedules.warmpool.io"})
    # The instances' NetworkPolicy is in every variant (on by default); the in-cluster Redis
    # brings its own.
    policies = {o["metadata"]["name"] for o in objs if o["kind"] == "NetworkPolicy"}
    assert "theia-cloud-instances" in policies
    assert ("warmpool-redis" in policies) == (variant == "overlays/with-redis")
    # A dry run it was: nothing of it exists.
    assert kube.get("apps/v1", "Deployment", namespace, "warmpool-scheduler") is None
    assert all(kube.get("v1", "ServiceAccount", namespace, sa) is None for sa in SAS)


def label_selector(selector: dict[str, Any]) -> str:
    """A LabelSelector as the API server's `labelSelector` query parameter."""
    terms = [f"{k}={val}" for k, val in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        op, key, values = expr["operator"], expr["key"], ",".join(expr.get("values") or [])
        terms.append({"Exists": key, "DoesNotExist": f"!{key}", "In": f"{key} in ({values})",
                      "NotIn": f"{key} notin ({values})"}[op])
    return ",".join(terms)


def test_the_instances_network_policy_selects_exactly_the_pool_pods_on_the_server(
    cluster: ClusterInfo, namespace: str, tmp_path: Path, kube: Kube,
) -> None:
    """Created for real (not only dry-run): the server keeps the policy as written, and its pod
    selector, evaluated by the server, picks every instance pod and no other pod of the
    namespace."""
    from warmpool.controller.sequential import run_until_quiet

    ns = namespace
    (policy,) = [o for o in render(DEPLOY / "base", ns, tmp_path)
                 if o["kind"] == "NetworkPolicy"
                 and o["metadata"]["name"] == "theia-cloud-instances"]
    kubectl(cluster, "apply", "-f", "-", stdin=dump([policy]))
    stored = kube.get("networking.k8s.io/v1", "NetworkPolicy", ns, "theia-cloud-instances")
    assert stored is not None
    assert stored["spec"]["ingress"] == policy["spec"]["ingress"]
    assert stored["spec"]["policyTypes"] == ["Ingress"]
    # Another pod of the namespace (the Theia Cloud service's): not selected.
    service_pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "service", "namespace": ns, "labels": {"app": "service"}},
                   "spec": {"automountServiceAccountToken": False,
                            "containers": [{"name": "service", "image": "theiacloud/service"}]}}
    # Retried while the namespace's default ServiceAccount does not exist yet.
    wait_for(lambda: kube.create(service_pod), timeout=30, ignore=(KubeError,),
             message="the Theia Cloud service's pod")
    create_appdef(kube, ns, min_instances=2)
    run_until_quiet(kube, ns)

    def pods(selector: str | None = None) -> set[str]:
        items, _ = kube.list("v1", "Pod", ns, label_selector=selector)
        return {p["metadata"]["name"] for p in items}

    wait_for(lambda: len(pods()) == 3, timeout=60, message="two instance pods and the service")
    selected = pods(label_selector(stored["spec"]["podSelector"]))
    instance_pods = pods(f"{v.LABEL_APP} in (java-app-1,java-app-2)")
    assert len(instance_pods) == 2
    assert selected == instance_pods
    (peer,) = stored["spec"]["ingress"][1]["from"]
    assert pods(label_selector(peer["podSelector"])) == {"service"}


def with_gateway_namespaces(tmp_path: Path, namespace: str, gateways: list[str]) -> Path:
    """An overlay of the base in `namespace` that sets the gateway's namespaces as
    deploy/base/instances-networkpolicy.yaml says to (its JSON patch)."""
    overlay = Path(tempfile.mkdtemp(prefix="gateway-", dir=tmp_path))
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": namespace, "resources": [os.path.relpath(DEPLOY / "base", overlay)],
        "patches": [{"target": {"group": "networking.k8s.io", "kind": "NetworkPolicy",
                                "name": "theia-cloud-instances"},
                     "patch": yaml.safe_dump([{
                         "op": "replace",
                         "path": "/spec/ingress/0/from/0/namespaceSelector/matchExpressions/0/"
                                 "values",
                         "value": gateways}])}]}))
    return overlay


def test_the_proxy_port_admits_the_gateway_namespace_and_no_other_on_the_server(
    cluster: ClusterInfo, namespace: str, tmp_path: Path, kube: Kube,
) -> None:
    """Issue #27: port 5000 from the gateway's namespace(s) only. The policy, created for
    real, is read back; its peers are evaluated by the server: the namespaceSelector picks
    exactly the gateway's namespace among several (the one where another user's IDE runs
    included), and as shipped (setting unset) it picks none."""
    gateway = f"{namespace}-gw"[:63]
    others = [f"{namespace}-ide"[:63], f"{namespace}-x"[:63]]
    # Servers from 1.21 label every namespace with its name; this 1.20 one does not, so the
    # test labels them as a 1.21 server would (the policy's comment says so for old clusters).
    for name in (gateway, *others):
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": name, "labels": {"kubernetes.io/metadata.name": name,
                                     "warmpool-test": "true"}}})
    try:
        def namespaces(selector: str) -> set[str]:
            items, _ = kube.list("v1", "Namespace", None, label_selector=selector)
            return {n["metadata"]["name"] for n in items
                    if n["metadata"]["name"] in {gateway, *others, namespace}}

        for overlay, expected in ((DEPLOY / "base", set()),
                                  (with_gateway_namespaces(tmp_path, namespace, [gateway]),
                                   {gateway})):
            (policy,) = [o for o in render(overlay, namespace, tmp_path)
                         if o["kind"] == "NetworkPolicy"
                         and o["metadata"]["name"] == "theia-cloud-instances"]
            kubectl(cluster, "apply", "-f", "-", stdin=dump([policy]))
            stored = kube.get("networking.k8s.io/v1", "NetworkPolicy", namespace,
                              "theia-cloud-instances")
            assert stored is not None
            proxy_rule, service_rule = stored["spec"]["ingress"]
            assert proxy_rule["ports"] == [{"port": 5000, "protocol": "TCP"}]
            (peer,) = proxy_rule["from"]  # one peer, a namespace selector: no pod selector
            assert set(peer) == {"namespaceSelector"}, peer
            assert namespaces(label_selector(peer["namespaceSelector"])) == expected
            # The other rule: the Theia Cloud service's pods of this namespace, nothing else.
            (service_peer,) = service_rule["from"]
            assert service_peer == {"podSelector": {"matchLabels": {"app": "service"}}}
            assert all("from" in rule for rule in stored["spec"]["ingress"]), \
                "a rule without peers would admit every pod of the cluster"
    finally:
        for name in (gateway, *others):
            kube.delete("v1", "Namespace", "", name)


def apply_rbac(cluster: ClusterInfo, namespace: str, tmp_path: Path) -> list[dict[str, Any]]:
    """The base's CRDs, ServiceAccount, Role and RoleBinding, applied for real in `namespace`."""
    objs = [o for o in render(DEPLOY / "base", namespace, tmp_path) if o["kind"] in RBAC_KINDS]
    assert sorted(o["kind"] for o in objs) == sorted(
        ["CustomResourceDefinition"] * 3 + ["ServiceAccount", "Role", "RoleBinding"] * 2)
    kubectl(cluster, "apply", "-f", "-", stdin=dump(objs))
    kubectl(cluster, "wait", "--for=condition=Established", "--timeout=60s",
            "crd/appdefinitions.theia.cloud", "crd/sessions.theia.cloud",
            "crd/poolschedules.warmpool.io")
    return objs


# (verb, resource[, subresource]) each role's code calls; see the table in deploy/base/rbac.yaml
# (tests/unit/test_deploy_manifests.py derives it from the code).
WATCHED = ["appdefinitions.theia.cloud", "sessions.theia.cloud", "poolschedules.warmpool.io",
           "services", "configmaps", "deployments.apps", "httproutes.gateway.networking.k8s.io",
           "ingresses.networking.k8s.io"]
SCHEDULER_ALLOWED = [
    *[(verb, resource) for resource in WATCHED for verb in ("list", "watch")],
    *[(verb, "leases.coordination.k8s.io") for verb in ("create", "list", "watch")],
    *[(verb, "leases.coordination.k8s.io/warmpool-scheduler") for verb in ("get", "patch")],
]
WORKER_ALLOWED = [
    *[(verb, resource) for resource in WATCHED for verb in ("list", "watch")],
    *[(verb, "appdefinitions.theia.cloud") for verb in ("get",)],
    # delete: timed-out Sessions (session-lifecycle §5, the `timeout/` job, issue #29)
    *[(verb, "sessions.theia.cloud") for verb in ("get", "patch", "delete")],
    ("patch", "sessions.theia.cloud", "status"),
    ("patch", "poolschedules.warmpool.io", "status"),  # the pool's job keeps it
    # The pool's condition when its pods fail to start (warmpool.controller.health, #28)
    ("patch", "appdefinitions.theia.cloud", "status"),
    *[(verb, resource) for resource in ("services", "configmaps", "deployments.apps")
      for verb in ("get", "create", "patch", "delete")],
    # watch: the worker cache keeps the pool's pods (warm-first claims, issue #28)
    *[(verb, "pods") for verb in ("list", "watch", "patch", "delete")],
    # Which ReplicaSets an instance's Deployment controls (a reset or refresh touches only
    # its pods, issue #27); watch: the worker cache keeps them (issue #28)
    ("list", "replicasets.apps"),
    ("watch", "replicasets.apps"),
    # Session routes (session-lifecycle §1): the shared route is only read
    *[(verb, "httproutes.gateway.networking.k8s.io")
      for verb in ("get", "create", "patch", "delete")],
    *[(verb, "ingresses.networking.k8s.io") for verb in ("get", "patch")],
    ("create", "events"),
]
DENIED_HERE = [
    # No writes to what people and Theia Cloud own; no update (everything is a merge patch).
    *[(verb, "appdefinitions.theia.cloud") for verb in ("create", "update", "patch", "delete")],
    *[(verb, "sessions.theia.cloud") for verb in ("create", "update")],
    ("update", "sessions.theia.cloud", "status"),
    ("update", "appdefinitions.theia.cloud", "status"),
    *[(verb, "poolschedules.warmpool.io") for verb in ("create", "update", "patch", "delete")],
    ("update", "poolschedules.warmpool.io", "status"),
    *[("update", resource) for resource in ("services", "configmaps", "deployments.apps",
                                            "httproutes.gateway.networking.k8s.io")],
    *[(verb, "pods") for verb in ("get", "create", "update")],
    ("create", "pods", "exec"),
    ("get", "pods", "log"),
    *[(verb, "secrets") for verb in ("get", "list", "watch", "create", "patch", "delete")],
    # Other Leases (Theia Cloud's operator elects its leader in this namespace too).
    *[(verb, "leases.coordination.k8s.io/theia-cloud-operator") for verb in ("get", "patch")],
    ("delete", "leases.coordination.k8s.io/warmpool-scheduler"),
    ("update", "leases.coordination.k8s.io/warmpool-scheduler"),
    *[(verb, resource) for resource in ("roles.rbac.authorization.k8s.io",
                                        "rolebindings.rbac.authorization.k8s.io",
                                        "serviceaccounts") for verb in ("create", "patch")],
    ("create", "serviceaccounts", "token"),
    *[(verb, "replicasets.apps") for verb in ("get", "create", "update", "patch", "delete")],
    ("patch", "statefulsets.apps"),
    ("create", "ingresses.networking.k8s.io"),
]
#: Each role is denied what only the other needs (issue #27, point 7): the scheduler builds,
#: changes and runs nothing; the workers take no Lease and end no Session.
SCHEDULER_DENIED = [c for c in WORKER_ALLOWED if c not in SCHEDULER_ALLOWED]
WORKER_DENIED = [c for c in SCHEDULER_ALLOWED if c not in WORKER_ALLOWED]
DENIED_CLUSTER_WIDE = [
    *[(verb, "nodes") for verb in ("get", "list", "patch")],
    *[(verb, "namespaces") for verb in ("get", "list", "create", "delete")],
    *[(verb, "clusterroles.rbac.authorization.k8s.io") for verb in ("list", "create", "bind",
                                                                    "escalate")],
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    *[(verb, "customresourcedefinitions.apiextensions.k8s.io")
      for verb in ("list", "create", "patch", "delete")],
    ("create", "persistentvolumes"),
]


def can_i(cluster: ClusterInfo, user: list[str], verb: str, resource: str,
          subresource: str | None = None, namespace: str | None = None) -> bool:
    args = ["auth", "can-i", *user, verb, resource]
    if subresource:
        args.append(f"--subresource={subresource}")
    args += ["-n", namespace] if namespace else []
    out = kubectl(cluster, *args, check_rc=False)
    answer = out.stdout.strip()
    assert answer in ("yes", "no"), f"can-i {args}: {out.stdout} {out.stderr}"
    return answer == "yes"


def sa_user(namespace: str, sa: str) -> list[str]:
    """Impersonate the ServiceAccount with the groups its token carries."""
    return [f"--as=system:serviceaccount:{namespace}:{sa}",
            "--as-group=system:serviceaccounts",
            f"--as-group=system:serviceaccounts:{namespace}"]


@pytest.mark.parametrize(("sa", "allowed", "denied"), [
    pytest.param(SCHEDULER_SA, SCHEDULER_ALLOWED, SCHEDULER_DENIED, id="scheduler"),
    pytest.param(WORKER_SA, WORKER_ALLOWED, WORKER_DENIED, id="worker"),
])
def test_each_serviceaccount_may_do_what_its_code_does_and_nothing_more(
    cluster: ClusterInfo, namespace: str, tmp_path: Path, core_v1: k8s.CoreV1Api, sa: str,
    allowed: list[tuple[str, ...]], denied: list[tuple[str, ...]],
) -> None:
    apply_rbac(cluster, namespace, tmp_path)
    user = sa_user(namespace, sa)

    def answers(checks: list[tuple[str, ...]], ns: str | None) -> dict[tuple[str, ...], bool]:
        return {c: can_i(cluster, user, c[0], c[1], c[2] if len(c) > 2 else None, ns)
                for c in checks}

    granted = answers(allowed, namespace)
    assert [c for c, ok in granted.items() if not ok] == [], "verbs the code needs"
    refused = answers([*DENIED_HERE, *denied], namespace)
    assert [c for c, ok in refused.items() if ok] == [], "more than the code needs"
    cluster_wide = answers(DENIED_CLUSTER_WIDE, None)
    assert [c for c, ok in cluster_wide.items() if ok] == [], "cluster-wide access"
    # Not in any other namespace, not even to read.
    other = {ns: answers([("list", "configmaps"), ("list", "appdefinitions.theia.cloud"),
                          ("list", "sessions.theia.cloud"), ("create", "events"),
                          ("get", "leases.coordination.k8s.io/warmpool-scheduler")], ns)
             for ns in ("default", "kube-system")}
    assert [(ns, c) for ns, a in other.items() for c, ok in a.items() if ok] == []
    out = kubectl(cluster, "auth", "can-i", *user, "list", "sessions.theia.cloud",
                  "--all-namespaces", check_rc=False)
    assert out.stdout.strip() == "no"
    # The control: the same checks as an administrator say yes.
    assert can_i(cluster, [], "list", "secrets", None, namespace)


def test_the_optional_admin_role_scales_pools_and_reads_sessions(
    cluster: ClusterInfo, namespace: str, tmp_path: Path
) -> None:
    overlay = tmp_path / "admin"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": namespace,
        "components": [os.path.relpath(DEPLOY / "components" / "admin", overlay)]}))
    out = subprocess.run([shutil.which("kubectl") or "kubectl", "kustomize", str(overlay)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    kubectl(cluster, "apply", "-f", "-", stdin=out.stdout)
    kubectl(cluster, "-n", namespace, "create", "rolebinding", "warmpool-admin",
            "--role=warmpool-admin", "--user=alice@example.com")
    alice = ["--as=alice@example.com"]
    for verb in ("get", "list", "watch", "patch"):
        assert can_i(cluster, alice, verb, "appdefinitions.theia.cloud", None, namespace)
    for verb in ("get", "list", "watch"):
        assert can_i(cluster, alice, verb, "sessions.theia.cloud", None, namespace)
    for verb in ("get", "list", "watch", "create", "patch", "delete"):  # they write schedules
        assert can_i(cluster, alice, verb, "poolschedules.warmpool.io", None, namespace)
    for resource in ("services", "configmaps", "events", "deployments.apps"):  # warmpool status
        assert can_i(cluster, alice, "list", resource, None, namespace)
    for verb, resource in (("patch", "sessions.theia.cloud"), ("delete", "sessions.theia.cloud"),
                           ("delete", "appdefinitions.theia.cloud"), ("get", "secrets"),
                           ("patch", "configmaps")):
        assert not can_i(cluster, alice, verb, resource, None, namespace), (verb, resource)
    assert not can_i(cluster, alice, "list", "appdefinitions.theia.cloud", None, "default")


# --- end to end: the real processes, as the ServiceAccount ---------------------------------


def sa_kubeconfig(cluster: ClusterInfo, core_v1: k8s.CoreV1Api, namespace: str,
                  path: Path, sa: str) -> Path:
    """A kubeconfig with the ServiceAccount's token from its token Secret (what in-cluster
    config would read from /var/run/secrets/kubernetes.io/serviceaccount)."""
    def token() -> str | None:
        account = core_v1.read_namespaced_service_account(sa, namespace)
        for ref in account.secrets or []:
            secret = core_v1.read_namespaced_secret(ref.name, namespace)
            if secret.type == "kubernetes.io/service-account-token" and secret.data:
                return base64.b64decode(secret.data["token"]).decode()
        return None

    value = wait_for(token, timeout=30, message="the ServiceAccount's token Secret")
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    ctx = next(c["context"] for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster_entry = next(c for c in admin["clusters"] if c["name"] == ctx["cluster"])
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster_entry],
        "users": [{"name": sa, "user": {"token": value}}],
        "contexts": [{"name": sa, "context": {"cluster": cluster_entry["name"], "user": sa,
                                              "namespace": namespace}}],
        "current-context": sa}))
    path.chmod(0o600)
    return path


def build_image_site(tmp_path: Path) -> Path:
    """What the image's final stage installs, built the Dockerfile's way: a build context of
    exactly its COPY sources (minus what .dockerignore drops), `pip wheel`, then the wheel
    installed into a directory of its own (the dependencies are this venv's)."""
    from tests.unit.test_deploy_image import copied_sources, parse_dockerfile

    _, stages = parse_dockerfile((ROOT / "Dockerfile").read_text())
    context = tmp_path / "context"
    context.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for source in copied_sources(stages[0]):
        src = ROOT / source
        if src.is_dir():
            shutil.copytree(src, context / source, ignore=ignore)
        else:
            shutil.copy2(src, context / source)
    wheels = tmp_path / "wheels"
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                          "--wheel-dir", str(wheels), str(context)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    (wheel,) = wheels.glob("warmpool-*.whl")
    site = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                          "-q", "--target", str(site), str(wheel)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert (site / "bin" / "warmpool").exists()
    assert (site / "warmpool" / "kube" / "crds" / "sessions.yaml").exists()
    return site


class Role:
    """One container of the rendered manifests, run here as a process: its args (health on
    loopback, free ports), its env with fieldRef/secretKeyRef/configMapRef resolved from the
    cluster, volume mounts as temporary directories, KUBECONFIG as in-cluster config would be."""

    def __init__(self, objs: list[dict[str, Any]], deployment: str, *,
                 kubeconfigs: dict[str, Path], site: Path, core_v1: k8s.CoreV1Api,
                 namespace: str, extra_env: dict[str, str], tmp_path: Path) -> None:
        d = next(o for o in objs if o["kind"] == "Deployment"
                 and o["metadata"]["name"] == deployment)
        (self.container,) = d["spec"]["template"]["spec"]["containers"]
        # The token of the ServiceAccount the Deployment names, as the kubelet would mount it.
        kubeconfig = kubeconfigs[d["spec"]["template"]["spec"]["serviceAccountName"]]
        self.name = deployment
        self.log_path = tmp_path / f"{deployment}.log"
        self.dirs = {m["mountPath"]: tmp_path / f"{deployment}{m['mountPath'].replace('/', '-')}"
                     for m in self.container.get("volumeMounts") or []}
        for p in self.dirs.values():
            p.mkdir()
        env = {k: val for k, val in os.environ.items()
               if not k.startswith(("WARMPOOL_", "PROMETHEUS_", "PYTHON", "KUBECONFIG"))}
        for ref in self.container.get("envFrom") or []:
            cm = core_v1.read_namespaced_config_map(ref["configMapRef"]["name"], namespace)
            env.update(cm.data or {})
        for e in self.container.get("env") or []:
            if "value" in e:
                env[e["name"]] = str(self.dirs.get(e["value"], e["value"]))
            elif "fieldRef" in e["valueFrom"]:
                assert e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
                env[e["name"]] = namespace
            else:
                ref = e["valueFrom"]["secretKeyRef"]
                secret = core_v1.read_namespaced_secret(ref["name"], namespace)
                env[e["name"]] = base64.b64decode(secret.data[ref["key"]]).decode()
        env.update(KUBECONFIG=str(kubeconfig), PYTHONPATH=str(site),
                   TMPDIR=str(self.dirs["/tmp"]), **extra_env)
        self.env = env
        self.args = self._local_args(self.container["args"], site)
        self.proc: subprocess.Popen[bytes] | None = None
        # The process to SIGTERM: the role's own (PID 1 in its namespace), not a wrapper.
        self.main_pid: int | None = None

    @staticmethod
    def _local_args(args: list[str], site: Path) -> list[str]:
        out = []
        for a in args:
            if a.startswith("--health-host="):
                a = "--health-host=127.0.0.1"  # loopback only on this machine
            elif a.startswith("--health-port="):
                a = "--health-port=0"
            out.append(a)
        from tests.unit.test_deploy_manifests import parse_cli

        _, params = parse_cli(out)
        if "metrics_port" in params:  # on loopback, and not the fixed default port here
            out += ["--metrics-host=127.0.0.1", f"--metrics-port={free_port()}"]
        return [str(site / "bin" / "warmpool"), *out]

    def start(self, prefix: list[str] | None = None) -> Role:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([*(prefix or []), *self.args], env=self.env,
                                         cwd=self.dirs["/tmp"], stdout=log, stderr=log,
                                         start_new_session=True)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_log(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        def seen() -> re.Match[str] | None:
            assert self.proc is not None and self.proc.poll() is None, (
                f"{self.name} exited:\n{self.log()}")
            return re.search(pattern, self.log())
        return wait_for(seen, timeout=timeout, message=f"{self.name}: {pattern}")

    def stop(self, timeout: float = 70) -> int | None:
        """SIGTERM, as the kubelet sends it; the kill of our own session if it hangs."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        os.kill(self.main_pid or self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the session start_new_session made
            self.proc.wait(10)
            return None


def pool_spec_s1(kube: Kube, ns: str, client: redis.Redis, settings: QueueSettings, *,
                 timeout: float = 120) -> None:
    """Scenario S1 of pool-spec §6 on a running system (whatever started it): five free
    instances, five claims, minInstances lowered below the claimed ids (nothing claimed is
    touched), three released (their instances go, 1 and 2 stay)."""
    create_appdef(kube, ns, min_instances=5)
    converge(kube, ns, lambda: all(instance_count(kube, ns, k) == 5 for k in range(1, 6)),
             what="five free instances", timeout=timeout)
    for i in range(1, 6):
        create_session(kube, ns, f"s{i}", USERS[i])
    converge(kube, ns, lambda: sorted(filter(None, (held_instance(kube, ns, f"s{i}")
                                                    for i in range(1, 6)))) == [1, 2, 3, 4, 5],
             what="five claims", timeout=timeout)
    held: dict[str, int] = {}
    for i in range(1, 6):
        k = held_instance(kube, ns, f"s{i}")
        assert k is not None
        held[f"s{i}"] = k
    for name in held:
        assert session(kube, ns, name)["status"]["operatorStatus"] == v.STATUS_HANDLED
    untouched = {k: snapshot(kube, ns, "java", k) for k in (1, 2)}

    # minInstances lowered below the claimed ids. What proves the workers have seen it
    # (they log no runs, as the manifests start them): a lease taken after the patch, then
    # a quiet queue (warmpool.harness.quiet, without keys).
    since = mark(client, settings)
    patch_appdef_spec(kube, ns, "java", minInstances=2)
    wait_quiet(client, settings, since, timeout=90)
    converge(kube, ns, lambda: True, what="minInstances lowered below claimed ids", timeout=timeout)
    for name, k in held.items():
        objects = instance_objects(kube, ns, "java", k)
        assert len(objects) == 5, f"instance {k} lost objects: {sorted(objects)}"
        assert emails(kube, ns, "java", k) == USERS[int(name[1:])]
        for obj in objects.values():
            assert owner_kinds(obj) == ["AppDefinition", "Session"]
    for k in (1, 2):
        assert snapshot(kube, ns, "java", k) == untouched[k], f"instance {k} was touched"

    released = [name for name, k in held.items() if k > 2]
    assert sorted(released) == ["s3", "s4", "s5"]
    for name in released:
        delete_session(kube, ns, name)
    converge(kube, ns, lambda: all(instance_count(kube, ns, held[n]) == 0 for n in released),
             what="released instances above minInstances deleted", timeout=timeout)
    for k in (1, 2):
        assert instance_count(kube, ns, k) == 5


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


# A refusal, as the API server words it ("... is forbidden: User ... cannot ...", "Unauthorized")
# or as warmpool logs its status ("API error 403"). A bare 403 is not one: resourceVersions and
# fences are numbers too ("the ResourceVersion in record (403)", a conflict, failed CI once).
FORBIDDEN = re.compile(r"forbidden|unauthori[sz]ed|\berror:? 40[13]\b|\bstatus[=: ]+40[13]\b",
                       re.IGNORECASE)
# A log line's timestamp ("14:05:00,401") is not a status code: only the message is searched.
LOG_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


@pytest.fixture
def queue(request: pytest.FixtureRequest) -> tuple[QueueSettings, redis.Redis]:
    """This test's isolated key prefix on the real Redis (set up before, torn down after, the
    processes that use it)."""
    return request.getfixturevalue("queue_settings"), request.getfixturevalue("redis_client")


@pytest.fixture
def roles() -> Iterator[list[Role]]:
    started: list[Role] = []
    yield started
    for role in reversed(started):
        role.stop(timeout=70)


@pytest.mark.redis
def test_s1_end_to_end_as_the_serviceaccount_with_the_manifests_commands(
    cluster: ClusterInfo, namespace: str, tmp_path: Path, kube: Kube, core_v1: k8s.CoreV1Api,
    queue: tuple[QueueSettings, redis.Redis], roles: list[Role],
) -> None:
    ns = namespace
    settings, client = queue
    site = build_image_site(tmp_path)
    objs = render(DEPLOY / "base", ns, tmp_path)
    apply_rbac(cluster, ns, tmp_path)
    config = next(o for o in objs if o["kind"] == "ConfigMap")
    kubectl(cluster, "apply", "-f", "-", stdin=dump([config]))
    assert settings.redis_url
    # The Secret the manifests read the Redis URL from, as a person would create it.
    kubectl(cluster, "-n", ns, "create", "secret", "generic", "warmpool-redis",
            f"--from-literal=url={settings.redis_url}")
    # Each role runs as its own ServiceAccount (issue #27, point 7).
    kubeconfigs = {sa: sa_kubeconfig(cluster, core_v1, ns, tmp_path / f"{sa}.kubeconfig", sa)
                   for sa in SAS}
    for sa, kubeconfig in kubeconfigs.items():
        # That kubeconfig really is the ServiceAccount, and it may not read Secrets.
        out = kubectl(cluster, "get", "secrets", "-n", ns, kubeconfig=kubeconfig,
                      check_rc=False)
        assert out.returncode != 0
        assert f"system:serviceaccount:{ns}:{sa}" in out.stderr and "forbidden" in out.stderr

    isolation = {"WARMPOOL_QUEUE_PREFIX": settings.prefix,
                 "WARMPOOL_QUEUE_NAMESPACE": settings.namespace}
    common = dict(kubeconfigs=kubeconfigs, site=site, core_v1=core_v1, namespace=ns,
                  extra_env=isolation, tmp_path=tmp_path)
    # The code that runs is the wheel's, not this checkout's.
    probe = subprocess.run([sys.executable, "-c", "import warmpool, scheduler, workers; "
                            "print(warmpool.__file__, scheduler.__file__, workers.__file__)"],
                           env={**os.environ, "PYTHONPATH": str(site)}, cwd=tmp_path,
                           capture_output=True, text=True)
    assert probe.returncode == 0 and probe.stdout.count(str(site)) == 3, probe

    # The worker as PID 1 of its own PID namespace (with its own /proc), as in its container.
    worker = Role(objs, "warmpool-worker", **common)
    roles.append(worker.start(prefix=["unshare", "--pid", "--fork", "--mount-proc",
                                      "--kill-child"]))
    worker.wait_log(r"worker processes x \d+ threads")
    assert worker.proc is not None
    # `unshare` ignores SIGTERM while it waits: signals go to its child, the supervisor.
    supervisor = wait_for(lambda: int(Path(f"/proc/{worker.proc.pid}/task/{worker.proc.pid}"
                                           "/children").read_text().split()[0]),
                          timeout=10, ignore=(IndexError, OSError), message="the supervisor")
    worker.main_pid = supervisor
    scheduler = Role(objs, "warmpool-scheduler", **common)
    roles.append(scheduler.start())
    health = scheduler.wait_log(r"health=(http://\S+)").group(1)
    wait_for(lambda: http_status(f"{health}/readyz") == 200, timeout=60,
             message="the scheduler's /readyz")
    assert http_status(f"{health}/healthz") == 200

    # The metrics endpoints the Services and monitors point at: path /metrics.
    for role in (worker, scheduler):
        found = re.search(r"metrics=(http://\S+)", role.log())
        if found and "--metrics-port" in " ".join(role.args):
            assert urlsplit(found.group(1)).path == "/metrics"
            assert http_status(found.group(1)) == 200, role.name

    # The worker supervisor's probes, as the kubelet asks them: httpGet on its health port
    # (workers/health.py; the failing cases are tests/unit/test_worker_health.py's).
    worker_health = worker.wait_log(r"health=(http://\S+)").group(1)
    for name in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe_get = worker.container[name]["httpGet"]
        assert probe_get["port"] == "health"
        wait_for(lambda path=probe_get["path"]: http_status(f"{worker_health}{path}") == 200,
                 timeout=30, message=f"the worker's {name}")

    pool_spec_s1(kube, ns, client, settings)

    # Bad input: an ERROR status and an Event (the error path's verbs).
    create_session(kube, ns, "lost", USERS[9], appdef="nosuchapp")
    wait_for(lambda: (session(kube, ns, "lost").get("status") or {}).get("operatorStatus")
             == v.STATUS_ERROR, timeout=60, message="the bad Session's ERROR status")
    wait_for(lambda: [e for e in core_v1.list_namespaced_event(ns).items
                      if e.reason == "InvalidSession"], timeout=30,
             message="an InvalidSession event")
    assert check(kube, ns) == []

    # The scheduler led, through its own Lease.
    lease = kube.get("coordination.k8s.io/v1", "Lease", ns, "warmpool-scheduler")
    assert lease is not None and lease["spec"]["holderIdentity"]

    assert scheduler.stop() == 0
    assert worker.stop() == 0  # drained and exited on SIGTERM, as PID 1

    # No request of theirs was refused: not in their logs, not in the queue's error records.
    for role in (scheduler, worker):
        refused = [line for line in role.log().splitlines()
                   if FORBIDDEN.search(LOG_TIMESTAMP.sub("", line))]
        assert refused == [], f"{role.name} was refused (the Role lacks a verb)"
    layout = Layout.of(settings)
    errors = {k.decode(): val.decode(errors="replace")
              for k, val in client.hgetall(layout.errors).items()}
    assert not [k for k, text in errors.items() if FORBIDDEN.search(text)], errors
