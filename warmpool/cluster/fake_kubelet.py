"""A stand-in for the scheduler and kubelet of the local control plane.

The local cluster has no nodes, so Pods would stay Pending forever and Deployments would never
report ready replicas, and the pool's notion of "a ready instance" could not be tested. This
process watches all Pods and writes the status a kubelet would write for a healthy pod: phase
Running, conditions PodScheduled/Initialized/ContainersReady/Ready True, a pod IP, and a ready
status for each container. The replicaset and deployment controllers then derive readyReplicas
from those conditions themselves, as they do on a real cluster.

Pods keep an empty spec.nodeName on purpose: the API server deletes unscheduled pods at once
instead of waiting for a kubelet to confirm the end of a grace period.

Run: python -m warmpool.cluster.fake_kubelet --kubeconfig PATH [--ready-file PATH]
Resilient by design: any watch error, 410 Gone included, leads to a fresh list; SIGTERM exits.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from warmpool.pool.meta import (
    meta_of,
    name_of,
    namespace_of,
    resource_version_of,
    uid_of,
)

MERGE_PATCH = "application/merge-patch+json"
CONDITIONS = ("PodScheduled", "Initialized", "ContainersReady", "Ready")
WATCH_SECONDS = 240


def _log(msg: str) -> None:
    print(f"{datetime.now(UTC).strftime('%H:%M:%S')} fake-kubelet: {msg}", flush=True)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def needs_status(pod: dict[str, Any]) -> bool:
    """True unless the pod already looks Running and Ready for every container."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return True
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    if any(conds.get(t) != "True" for t in CONDITIONS):
        return True
    want = {c["name"] for c in (pod.get("spec") or {}).get("containers") or []}
    have = {c.get("name") for c in status.get("containerStatuses") or [] if c.get("ready")}
    return want != have


def running_status(pod: dict[str, Any], pod_ip: str) -> dict[str, Any]:
    """The status a kubelet reports for a pod whose containers all started and passed probes."""
    now = _now()
    spec = pod.get("spec") or {}
    uid = uid_of(pod)
    start = (pod.get("status") or {}).get("startTime") or now

    def container_status(c: dict[str, Any], init: bool) -> dict[str, Any]:
        state: dict[str, Any]
        if init:
            state = {"terminated": {"exitCode": 0, "reason": "Completed",
                                    "startedAt": start, "finishedAt": now}}
        else:
            state = {"running": {"startedAt": now}}
        return {
            "name": c["name"], "image": c.get("image", ""), "imageID": "",
            "containerID": f"fake://{uid}/{c['name']}", "ready": True,
            "started": not init, "restartCount": 0, "state": state,
        }

    return {
        "phase": "Running",
        "hostIP": pod_ip,
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": start,
        "qosClass": (pod.get("status") or {}).get("qosClass", "BestEffort"),
        "conditions": [
            {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
            for t in CONDITIONS
        ],
        "initContainerStatuses": [container_status(c, True)
                                  for c in spec.get("initContainers") or []],
        "containerStatuses": [container_status(c, False) for c in spec.get("containers") or []],
    }


class FakeKubelet:
    """List, then watch from the list's resourceVersion; on any trouble, list again."""

    def __init__(self, api_client: client.ApiClient, pod_ip: str = "127.0.0.1",
                 ready_file: Path | None = None) -> None:
        self.core = client.CoreV1Api(api_client)
        self.pod_ip = pod_ip
        self.ready_file = ready_file

    def handle(self, pod: dict[str, Any]) -> None:
        ns, name = namespace_of(pod), name_of(pod)
        if not ns or not name:
            return
        if meta_of(pod).get("deletionTimestamp"):
            # A kubelet confirms termination; only matters for pods that carry a nodeName.
            if (pod.get("spec") or {}).get("nodeName"):
                try:
                    self.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
                except ApiException as exc:
                    if exc.status != 404:
                        _log(f"delete {ns}/{name}: {exc.status} {exc.reason}")
            return
        if not needs_status(pod):
            return
        body = {"metadata": {"resourceVersion": resource_version_of(pod)},
                "status": running_status(pod, self.pod_ip)}
        try:
            self.core.patch_namespaced_pod_status(name, ns, body, _content_type=MERGE_PATCH)
            _log(f"{ns}/{name} -> Running, Ready")
        except ApiException as exc:
            # 409: the pod changed meanwhile, the watch brings the new version; 404: gone.
            if exc.status not in (404, 409):
                _log(f"patch {ns}/{name}: {exc.status} {exc.reason}")

    def list_all(self) -> str:
        # _preload_content=False: the raw response, not the V1PodList the client is typed with
        resp = cast(urllib3.HTTPResponse,
                    self.core.list_pod_for_all_namespaces(_preload_content=False))
        data = json.loads(resp.data)
        for pod in data.get("items") or []:
            self.handle(pod)
        if self.ready_file is not None and not self.ready_file.exists():
            self.ready_file.write_text("ready\n")
        return str(data["metadata"]["resourceVersion"])

    def watch(self, resource_version: str) -> str:
        """Follow changes until the server ends the watch; returns the last resourceVersion."""
        resp = cast(urllib3.HTTPResponse, self.core.list_pod_for_all_namespaces(  # as above
            watch=True, resource_version=resource_version, allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS, _preload_content=False,
        ))
        try:
            for line in iter_resp_lines(resp):
                if not line:
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise ApiException(status=int(obj.get("code") or 500),
                                       reason=str(obj.get("message")))
                rv = resource_version_of(obj)
                if rv:
                    resource_version = rv
                if event.get("type") in ("ADDED", "MODIFIED"):
                    self.handle(obj)
        finally:
            resp.release_conn()
        return resource_version

    def run(self) -> None:
        backoff = 0.5
        while True:
            try:
                rv = self.list_all()
                backoff = 0.5
                while True:
                    rv = self.watch(rv)
            except ApiException as exc:
                if exc.status == 410:
                    _log("watch expired (410 Gone): listing again")
                    continue
                _log(f"API error {exc.status} {exc.reason}: listing again in {backoff:.1f} s")
            except Exception as exc:  # connection reset, apiserver restart, ...
                _log(f"{type(exc).__name__}: {exc}: listing again in {backoff:.1f} s")
            time.sleep(backoff)
            backoff = min(backoff * 2, 5.0)


def _on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--pod-ip", default="127.0.0.1")
    parser.add_argument("--ready-file", type=Path, default=None,
                        help="written after the first full pod list (for the starter to wait on)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    # The local cluster's self-signed cert is skipped on purpose (loopback only); one warning
    # per request would bury the log.
    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    api_client = config.new_client_from_config(config_file=args.kubeconfig)
    _log(f"watching pods via {api_client.configuration.host}")
    try:
        FakeKubelet(api_client, args.pod_ip, args.ready_file).run()
    except (SystemExit, KeyboardInterrupt):
        _log("stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())
