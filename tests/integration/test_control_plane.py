"""The local control plane is a real one: these behaviours are what the controller relies on.

If one of them fails, every higher-level test's verdict is meaningless, so they run first and
check the API server, etcd, the garbage collector, the deployment machinery and the fake kubelet
directly, with no project code in between.
"""

from __future__ import annotations

import ipaddress
import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from tests.waiting import wait_for
from warmpool.cluster import local
from warmpool.kube.api import Kube, connect
from warmpool.testing.apiproxy import ApiProxy

GROUP = "theia.cloud"
APPDEF = {"version": "v1beta11", "plural": "appdefinitions"}
SESSION = {"version": "v1beta8", "plural": "sessions"}


def _appdef(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{APPDEF['version']}",
        "kind": "AppDefinition",
        "metadata": {"name": name},
        "spec": {"name": name, "image": "theiacloud/theia-cloud-demo", "uid": 101, "port": 3000,
                 "minInstances": 1, "maxInstances": 3, **spec},
    }


def _gone(read: Any, *args: Any) -> bool:
    try:
        read(*args)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def test_crd_round_trip_preserves_unknown_fields_and_bad_values(
    custom_objects: client.CustomObjectsApi, namespace: str
) -> None:
    # uid 0 and the empty Session fields below are zero values of typed fields: Kubernetes 1.20
    # built with Go >= 1.16 rejects them as "null" unless build.sh's validator patch is in.
    body = _appdef("roundtrip", minInstances="abc", futureField={"nested": [1, 2]}, uid=0)
    custom_objects.create_namespaced_custom_object(GROUP, APPDEF["version"], namespace,
                                                   APPDEF["plural"], body)
    got = custom_objects.get_namespaced_custom_object(GROUP, APPDEF["version"], namespace,
                                                      APPDEF["plural"], "roundtrip")
    # The controller, not the API server, must see and report bad input: it is admitted as-is.
    assert got["spec"]["minInstances"] == "abc"
    assert got["spec"]["futureField"] == {"nested": [1, 2]}
    assert got["spec"]["uid"] == 0
    assert got["metadata"]["generation"] == 1

    # Status subresource: a status write leaves generation alone, a spec change bumps it.
    custom_objects.patch_namespaced_custom_object_status(
        GROUP, APPDEF["version"], namespace, APPDEF["plural"], "roundtrip",
        {"status": {"observedGeneration": 1, "anything": "kept"}},
        _content_type="application/merge-patch+json",
    )
    custom_objects.patch_namespaced_custom_object(
        GROUP, APPDEF["version"], namespace, APPDEF["plural"], "roundtrip",
        {"spec": {"minInstances": 2}}, _content_type="application/merge-patch+json",
    )
    got = custom_objects.get_namespaced_custom_object(GROUP, APPDEF["version"], namespace,
                                                      APPDEF["plural"], "roundtrip")
    assert got["metadata"]["generation"] == 2
    assert got["status"] == {"observedGeneration": 1, "anything": "kept"}
    assert got["spec"]["futureField"] == {"nested": [1, 2]}

    session = {
        "apiVersion": f"{GROUP}/{SESSION['version']}", "kind": "Session",
        "metadata": {"name": "ses-1"},
        "spec": {"name": "ses-1", "appDefinition": "roundtrip", "user": "",
                 "workspace": "", "extra": True},
    }
    custom_objects.create_namespaced_custom_object(GROUP, SESSION["version"], namespace,
                                                   SESSION["plural"], session)
    got = custom_objects.get_namespaced_custom_object(GROUP, SESSION["version"], namespace,
                                                      SESSION["plural"], "ses-1")
    # An empty user must reach the controller (which answers with status ERROR).
    assert got["spec"]["user"] == ""
    assert got["spec"]["workspace"] == ""
    assert got["spec"]["extra"] is True


def test_stale_resource_version_is_a_409_conflict(core_v1: client.CoreV1Api,
                                                   namespace: str) -> None:
    cm = core_v1.create_namespaced_config_map(
        namespace, {"metadata": {"name": "cas"}, "data": {"v": "0"}})
    stale = cm.metadata.resource_version
    core_v1.replace_namespaced_config_map(
        "cas", namespace,
        {"metadata": {"name": "cas", "resourceVersion": stale}, "data": {"v": "1"}})
    with pytest.raises(ApiException) as err:
        core_v1.replace_namespaced_config_map(
            "cas", namespace,
            {"metadata": {"name": "cas", "resourceVersion": stale}, "data": {"v": "2"}})
    assert err.value.status == 409
    assert core_v1.read_namespaced_config_map("cas", namespace).data == {"v": "1"}


def test_an_empty_precondition_is_refused_before_any_write(kube: Kube, namespace: str) -> None:
    """The server takes an empty resourceVersion or uid as no precondition: a guarded write
    built from an object read without its version would be applied unguarded. `Kube`
    refuses it and the object is untouched."""
    cm = kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": "guarded", "namespace": namespace},
                      "data": {"k": "1"}})
    with pytest.raises(ValueError, match="resource_version"):
        kube.merge_patch("v1", "ConfigMap", namespace, "guarded", {"data": {"k": "2"}},
                         resource_version="")
    for uid, rv in (("", None), (None, "")):
        with pytest.raises(ValueError, match="precondition"):
            kube.delete("v1", "ConfigMap", namespace, "guarded", uid=uid, resource_version=rv)
    now = kube.get("v1", "ConfigMap", namespace, "guarded")
    assert now is not None and now["data"] == {"k": "1"}
    assert now["metadata"]["resourceVersion"] == cm["metadata"]["resourceVersion"]


def test_a_metadata_only_write_answers_the_objects_metadata_typed_as_its_kind(
    kube: Kube, namespace: str
) -> None:
    """Issue #28: a write whose caller keeps only the answer's metadata asks for nothing else
    (the server encodes, the worker decodes, a fraction of a Deployment). The answer is typed
    as the object, as a metadata-only watch's objects are, and carries the written version."""
    body = {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "meta", "namespace": namespace, "labels": {"a": "1"}},
            "spec": {"selector": {"matchLabels": {"app": "meta"}},
                     "template": {"metadata": {"labels": {"app": "meta"}},
                                  "spec": {"containers": [{"name": "c", "image": "i"}]}}}}
    created = kube.create(body, metadata_only=True)
    assert (created["apiVersion"], created["kind"], set(created)) == (
        "apps/v1", "Deployment", {"apiVersion", "kind", "metadata"})
    patched = kube.merge_patch("apps/v1", "Deployment", namespace, "meta",
                               {"metadata": {"labels": {"a": "2"}}},
                               resource_version=created["metadata"]["resourceVersion"],
                               metadata_only=True)
    assert (patched["kind"], set(patched), patched["metadata"]["labels"]) == (
        "Deployment", {"apiVersion", "kind", "metadata"}, {"a": "2"})
    now = kube.get("apps/v1", "Deployment", namespace, "meta")
    assert now is not None and now["spec"]["template"]["spec"]["containers"][0]["image"] == "i"
    assert now["metadata"]["resourceVersion"] == patched["metadata"]["resourceVersion"]
    # A delete's answer is not read: asked for as metadata, it still deletes, once.
    assert kube.delete("apps/v1", "Deployment", namespace, "meta",
                       uid=created["metadata"]["uid"])
    assert not kube.delete("apps/v1", "Deployment", namespace, "meta")


def test_garbage_collector_deletes_dependents_of_core_and_custom_owners(
    core_v1: client.CoreV1Api, custom_objects: client.CustomObjectsApi, namespace: str
) -> None:
    owner = core_v1.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    core_v1.create_namespaced_config_map(namespace, {"metadata": {
        "name": "dependent",
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                             "uid": owner.metadata.uid}],
    }})
    appdef = custom_objects.create_namespaced_custom_object(
        GROUP, APPDEF["version"], namespace, APPDEF["plural"], _appdef("gc-owner"))
    core_v1.create_namespaced_config_map(namespace, {"metadata": {
        "name": "appdef-dependent",
        "ownerReferences": [{"apiVersion": f"{GROUP}/{APPDEF['version']}",
                             "kind": "AppDefinition", "name": "gc-owner",
                             "uid": appdef["metadata"]["uid"]}],
    }})

    core_v1.delete_namespaced_config_map("owner", namespace)
    custom_objects.delete_namespaced_custom_object(GROUP, APPDEF["version"], namespace,
                                                   APPDEF["plural"], "gc-owner")

    # Asynchronous: the CRDs exist before kube-controller-manager starts, so this takes
    # about a second; a minute would mean the garbage collector missed our kinds.
    wait_for(lambda: _gone(core_v1.read_namespaced_config_map, "dependent", namespace),
             timeout=45, message="the ConfigMap owned by a ConfigMap to be collected")
    wait_for(lambda: _gone(core_v1.read_namespaced_config_map, "appdef-dependent", namespace),
             timeout=45, message="the ConfigMap owned by an AppDefinition to be collected")


def test_deployment_becomes_ready_through_fake_kubelet(
    apps_v1: client.AppsV1Api, core_v1: client.CoreV1Api, namespace: str
) -> None:
    labels = {"app": "web"}
    apps_v1.create_namespaced_deployment(namespace, {
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                {"name": "app", "image": "example/app:1"},
                {"name": "oauth2-proxy", "image": "example/proxy:1"},
            ]}},
        },
    })

    def ready_replicas() -> int:
        status = apps_v1.read_namespaced_deployment_status("web", namespace).status
        return int(status.ready_replicas or 0) if status else 0

    wait_for(lambda: ready_replicas() == 1, timeout=60,
             message=lambda: f"Deployment web readyReplicas=1 (now {ready_replicas()})")
    pods = core_v1.list_namespaced_pod(namespace, label_selector="app=web").items
    assert len(pods) == 1
    pod = pods[0]
    assert pod.status.phase == "Running"
    conditions = {c.type: c.status for c in pod.status.conditions}
    assert conditions["Ready"] == "True"
    assert {c.name for c in pod.status.container_statuses if c.ready} == {"app", "oauth2-proxy"}


#: Two ClusterIP Services per pool instance; the local control plane must hold this many.
POOL_INSTANCES_GOAL = 5_000


def test_service_range_is_sized_for_the_pool_goal() -> None:
    # The range (minus network and broadcast) takes two Services per instance, with headroom;
    # kube-apiserver 1.20 refuses an IPv4 range wider than /12.
    net = ipaddress.ip_network(local.SERVICE_CIDR)
    assert net.is_private and net.version == 4 and net.prefixlen >= 12
    assert net.num_addresses - 2 >= 2 * 2 * POOL_INSTANCES_GOAL


def test_control_plane_runs_with_the_service_range(cluster: local.ClusterInfo) -> None:
    if not cluster.pids:
        pytest.skip("external cluster: its service range is not ours to check")
    flag = f"--service-cluster-ip-range={local.SERVICE_CIDR}"
    for name in ("kube-apiserver", "kube-controller-manager"):
        argv = Path(f"/proc/{cluster.pids[name]}/cmdline").read_bytes().split(b"\0")
        assert flag.encode() in argv, f"{name} runs without {flag}"


def test_service_range_holds_more_than_a_slash_24(
    cluster: local.ClusterInfo, core_v1: client.CoreV1Api, namespace: str
) -> None:
    # 300 Services: more than a /24 (254 ClusterIPs) holds, the old range's limit of 127
    # pool instances. Each create returns its ClusterIP (allocated synchronously).
    count = 300
    ips = [
        core_v1.create_namespaced_service(namespace, {
            "metadata": {"name": f"svc-{i}"},
            "spec": {"type": "ClusterIP", "ports": [{"port": 80}]},
        }).spec.cluster_ip
        for i in range(count)
    ]
    assert all(ips) and len(set(ips)) == count
    if cluster.pids:  # ours: the range is known
        net = ipaddress.ip_network(local.SERVICE_CIDR)
        assert all(ipaddress.ip_address(ip) in net for ip in ips)


def _etcd_post(etcd_url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(f"{etcd_url}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return dict(json.loads(resp.read()))


def test_watch_from_compacted_revision_is_410_gone(
    cluster: local.ClusterInfo, core_v1: client.CoreV1Api, namespace: str
) -> None:
    if not cluster.etcd_url:
        pytest.skip("external cluster without WARMPOOL_TEST_ETCD_URL: cannot compact etcd")
    cm = core_v1.create_namespaced_config_map(
        namespace, {"metadata": {"name": "old"}, "data": {"v": "0"}})
    old_rv = cm.metadata.resource_version
    for i in range(3):
        core_v1.patch_namespaced_config_map("old", namespace, {"data": {"v": str(i + 1)}},
                                            _content_type="application/merge-patch+json")
    # The header revision of any range request is etcd's current revision.
    rev = int(_etcd_post(cluster.etcd_url, "/v3/kv/range", {"key": "AA=="})["header"]["revision"])
    _etcd_post(cluster.etcd_url, "/v3/kv/compaction", {"revision": rev, "physical": True})

    # The server answers either with an HTTP 410 or with a 200 stream holding an ERROR event.
    code = None
    try:
        resp = core_v1.list_namespaced_config_map(
            namespace, watch=True, resource_version=old_rv, timeout_seconds=5,
            _preload_content=False)
        try:
            for line in iter_resp_lines(resp):
                event = json.loads(line)
                if event["type"] == "ERROR":
                    code = event["object"]["code"]
                    break
        finally:
            resp.release_conn()
    except ApiException as exc:
        code = exc.status
    assert code == 410


def test_up_is_idempotent_and_down_leaves_no_process(tmp_path: Path) -> None:
    if not local.binaries_present():
        local.build(progress=True)
    state_dir = tmp_path / "plane"
    info = local.up(state_dir, die_with_parent=True)
    try:
        assert set(info.pids) == set(local.COMPONENTS)
        for pid in info.pids.values():
            assert Path(f"/proc/{pid}").exists()
        again = local.up(state_dir)
        assert again.pids == info.pids, "a second up must reuse the running cluster"
        assert local.env(state_dir) == f"export KUBECONFIG={info.kubeconfig}\n"
    finally:
        stopped = local.down(state_dir)
    assert set(stopped) == set(local.COMPONENTS)
    for name, pid in info.pids.items():
        assert not Path(f"/proc/{pid}").exists(), f"{name} (pid {pid}) still exists after down"
    assert not (state_dir / "pids.json").exists()
    assert (state_dir / "logs" / "kube-apiserver.log").stat().st_size > 0
    assert local.down(state_dir) == [], "a second down finds nothing to stop"
    assert os.path.exists(info.kubeconfig), "down keeps the kubeconfig (and data and logs)"


def test_kinds_resolved_ahead_cost_a_first_job_no_discovery(
    cluster: local.ClusterInfo, namespace: str, tmp_path: Path,
) -> None:
    """A worker looks up its kinds before it takes jobs (`Kube.resolve`): then the first LIST
    of each sends that LIST alone, no discovery GET on the job's path (without it: 18 more,
    one per API group); a kind the server does not serve is named, not raised."""
    with ApiProxy(upstream=cluster.server, token=cluster.token,
                  kubeconfig_path=tmp_path / "kubeconfig") as proxy:
        fresh = Kube(connect(str(proxy.kubeconfig_path)))
        missing = fresh.resolve([("v1", "Pod"), ("apps/v1", "ReplicaSet"),
                                 ("example.com/v1", "Nothing")])
        assert missing == [("example.com/v1", "Nothing")]
        before = proxy.traffic()
        fresh.list("v1", "Pod", namespace)
        fresh.list("apps/v1", "ReplicaSet", namespace)
        assert (proxy.traffic() - before).total_requests() == 2  # the two LISTs alone
