"""A stand-in for the scheduler and kubelet of the local control plane.

The local cluster has no nodes, so Pods would stay Pending forever and Deployments would never
report ready replicas, and the pool's notion of "a ready instance" could not be tested. This
process watches all Pods and writes the status a kubelet would write for a healthy pod: phase
Running, conditions PodScheduled/Initialized/ContainersReady/Ready True, a pod IP, and a ready
status for each container. The replicaset and deployment controllers then derive readyReplicas
from those conditions themselves, as they do on a real cluster.

Pods keep an empty spec.nodeName on purpose: the API server deletes unscheduled pods at once
instead of waiting for a kubelet to confirm the end of a grace period.

What a real cluster does to pods, on demand, so that warm and cold claims and a pool that
cannot start can be shown (issue #28):
- a start delay: a pod is reported Pending (ContainerCreating) for that many seconds after
  this process first saw it, then Running and Ready: every pod with `--start-delay`
  (`WARMPOOL_FAKE_KUBELET_START_DELAY`), or a pod whose image is
  ``fake-kubelet.invalid/start-<N>s`` (N seconds, at most 600);
- a failure: a pod whose container image matches a pattern of `--fail PATTERN=REASON`
  (`WARMPOOL_FAKE_KUBELET_FAIL`, several separated by ``;``; fnmatch patterns) stays Pending
  with that container waiting for REASON (ImagePullBackOff or CrashLoopBackOff), as does
  one whose image is ``fake-kubelet.invalid/pull-error`` or ``fake-kubelet.invalid/crash-loop``.
The image directives let tests on one shared control plane ask per AppDefinition; the flags
serve a benchmark that wants every pod to take its time.

Run: python -m warmpool.cluster.fake_kubelet --kubeconfig PATH [--ready-file PATH]
     [--start-delay SECONDS] [--fail PATTERN=REASON ...]
Resilient by design: any watch error, 410 Gone included, leads to a fresh list; SIGTERM exits.
Every list is answered by the API server's watch cache (resourceVersion "0", as a real
kubelet's informer lists), never by etcd: the benchmarks count the LISTs etcd answers, and a
stand-in for the cluster's kubelets must not add ones the real ones would not. A list older
than what the last watch showed is harmless: every status write carries the pod's
resourceVersion, so a write from an old view is refused (409) and the watch brings the pod.
"""

from __future__ import annotations

import argparse
import fnmatch
import heapq
import json
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
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
ENV_START_DELAY = "WARMPOOL_FAKE_KUBELET_START_DELAY"
ENV_FAIL = "WARMPOOL_FAKE_KUBELET_FAIL"
#: The registry of the images that ask this kubelet for a behaviour (`behaviour_of`).
DIRECTIVE_REGISTRY = "fake-kubelet.invalid"
#: The failures it can play: the waiting reason a real kubelet reports for each.
FAILURES = ("ImagePullBackOff", "CrashLoopBackOff")
_DIRECTIVES = {"pull-error": "ImagePullBackOff", "crash-loop": "CrashLoopBackOff"}
_START = re.compile(r"start-([0-9]{1,3})s")
MAX_DELAY = 600.0


def _log(msg: str) -> None:
    print(f"{datetime.now(UTC).strftime('%H:%M:%S')} fake-kubelet: {msg}", flush=True)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Behaviour:
    """What this kubelet plays for every pod: a start delay, failures by image pattern."""

    start_delay: float = 0.0
    #: (fnmatch pattern of a container image, waiting reason in `FAILURES`)
    fail: tuple[tuple[str, str], ...] = field(default_factory=tuple)


def parse_fail(text: str) -> tuple[tuple[str, str], ...]:
    """``PATTERN=REASON[;PATTERN=REASON...]`` -> the rules; ValueError on a bad one."""
    rules: list[tuple[str, str]] = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        pattern, sep, reason = item.rpartition("=")
        if not sep or not pattern or reason not in FAILURES:
            raise ValueError(f"--fail {item!r}: want PATTERN=REASON, REASON one of "
                             f"{', '.join(FAILURES)}")
        rules.append((pattern, reason))
    return tuple(rules)


def _directive(image: str) -> tuple[float, str]:
    """(start delay, failure) an image of `DIRECTIVE_REGISTRY` asks for; (0, "") otherwise."""
    prefix = f"{DIRECTIVE_REGISTRY}/"
    if not image.startswith(prefix):
        return 0.0, ""
    name = image[len(prefix):].partition(":")[0]
    if name in _DIRECTIVES:
        return 0.0, _DIRECTIVES[name]
    match = _START.fullmatch(name)
    return (min(float(match.group(1)), MAX_DELAY), "") if match else (0.0, "")


def behaviour_of(pod: dict[str, Any], behaviour: Behaviour) -> tuple[float, str, str]:
    """(start delay s, failure reason or "", the failing container's name) for `pod`."""
    delay = behaviour.start_delay
    for c in (pod.get("spec") or {}).get("containers") or []:
        image = str(c.get("image") or "")
        extra, failure = _directive(image)
        delay = max(delay, extra)
        failure = failure or next((reason for pattern, reason in behaviour.fail
                                   if fnmatch.fnmatchcase(image, pattern)), "")
        if failure:
            return delay, failure, str(c.get("name") or "")
    return delay, "", ""


def waiting_status(pod: dict[str, Any], reason: str, failing: str = "") -> dict[str, Any]:
    """A pod not (yet) running: Pending, scheduled, not Ready; each container waiting for
    `reason` (ContainerCreating while it starts), the one named `failing` for its failure
    (with a restart count for a crash loop, as a kubelet reports it)."""
    now = _now()
    spec = pod.get("spec") or {}
    start = (pod.get("status") or {}).get("startTime") or now

    def container_status(c: dict[str, Any]) -> dict[str, Any]:
        why = reason if not failing or c.get("name") == failing else "ContainerCreating"
        return {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False,
                "started": False, "restartCount": 3 if why == "CrashLoopBackOff" else 0,
                "state": {"waiting": {"reason": why, "message": f"fake kubelet: {why}"}}}

    return {
        "phase": "Pending",
        "startTime": start,
        "qosClass": (pod.get("status") or {}).get("qosClass", "BestEffort"),
        "conditions": [
            {"type": t, "status": "True" if t == "PodScheduled" else "False",
             "lastProbeTime": None, "lastTransitionTime": now}
            for t in CONDITIONS
        ],
        "containerStatuses": [container_status(c) for c in spec.get("containers") or []],
    }


def _waiting_reasons(pod: dict[str, Any]) -> set[str]:
    return {str(((c.get("state") or {}).get("waiting") or {}).get("reason"))
            for c in (pod.get("status") or {}).get("containerStatuses") or []}


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
                 ready_file: Path | None = None, behaviour: Behaviour | None = None) -> None:
        self.core = client.CoreV1Api(api_client)
        self.pod_ip = pod_ip
        self.ready_file = ready_file
        self.behaviour = behaviour or Behaviour()
        # uid -> when this process first saw the pod (monotonic): what a start delay counts
        # from; forgotten once the pod is Ready.
        self._seen: dict[str, float] = {}
        # (due, namespace, name): pods to look at again once their delay is over.
        self._due: list[tuple[float, str, str]] = []
        self._scheduled: set[tuple[str, str]] = set()  # (namespace, name) in `_due`
        self._wake = threading.Condition()

    def _later(self, due: float, ns: str, name: str) -> None:
        with self._wake:
            if (ns, name) in self._scheduled:
                return
            self._scheduled.add((ns, name))
            heapq.heappush(self._due, (due, ns, name))
            self._wake.notify()

    def _run_due(self) -> None:
        """Look again at each delayed pod when its delay is over (a thread of its own, so
        the watch is never held up)."""
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._wake.wait(None if not self._due
                                    else max(0.0, self._due[0][0] - time.monotonic()))
                _, ns, name = heapq.heappop(self._due)
                self._scheduled.discard((ns, name))
            try:
                resp = cast(urllib3.HTTPResponse, self.core.read_namespaced_pod(
                    name, ns, _preload_content=False))
                self.handle(json.loads(resp.data))
            except ApiException as exc:
                if exc.status != 404:
                    _log(f"read {ns}/{name}: {exc.status} {exc.reason}")
            except Exception as exc:  # keep the thread alive: the next relist handles it
                _log(f"delayed pod {ns}/{name}: {type(exc).__name__}: {exc}")

    def _patch_status(self, pod: dict[str, Any], status: dict[str, Any], what: str) -> None:
        ns, name = namespace_of(pod), name_of(pod)
        body = {"metadata": {"resourceVersion": resource_version_of(pod)}, "status": status}
        try:
            self.core.patch_namespaced_pod_status(name, ns, body, _content_type=MERGE_PATCH)
            _log(f"{ns}/{name} -> {what}")
        except ApiException as exc:
            # 409: the pod changed meanwhile, the watch brings the new version; 404: gone.
            if exc.status not in (404, 409):
                _log(f"patch {ns}/{name}: {exc.status} {exc.reason}")

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
            self._seen.pop(uid_of(pod), None)
            return
        delay, failure, container = behaviour_of(pod, self.behaviour)
        if failure:
            if failure not in _waiting_reasons(pod):
                self._patch_status(pod, waiting_status(pod, failure, container),
                                   f"Pending, {failure}")
            return
        first = self._seen.setdefault(uid_of(pod), time.monotonic())
        due = first + delay
        if delay > 0 and time.monotonic() < due:
            if "ContainerCreating" not in _waiting_reasons(pod):
                self._patch_status(pod, waiting_status(pod, "ContainerCreating"),
                                   f"Pending, starting for {delay:g} s")
            self._later(due, ns, name)
            return
        self._patch_status(pod, running_status(pod, self.pod_ip), "Running, Ready")

    def list_all(self) -> str:
        # _preload_content=False: the raw response, not the V1PodList the client is typed with
        resp = cast(urllib3.HTTPResponse,
                    self.core.list_pod_for_all_namespaces(resource_version="0",
                                                          _preload_content=False))
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
        threading.Thread(target=self._run_due, name="delayed-pods", daemon=True).start()
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
    parser.add_argument("--start-delay", type=float,
                        default=float(os.environ.get(ENV_START_DELAY) or 0),
                        help=f"seconds each pod stays Pending before it is Ready "
                             f"[default: ${ENV_START_DELAY} or 0]")
    parser.add_argument("--fail", action="append", default=[],
                        help="PATTERN=REASON: pods with a container image matching PATTERN "
                             f"(fnmatch) never start, waiting for REASON ({', '.join(FAILURES)});"
                             f" repeatable [default: ${ENV_FAIL}, ';'-separated]")
    args = parser.parse_args(argv)
    try:
        fail = parse_fail(";".join(args.fail or [os.environ.get(ENV_FAIL) or ""]))
    except ValueError as exc:
        parser.error(str(exc))
    behaviour = Behaviour(min(max(args.start_delay, 0.0), MAX_DELAY), fail)
    signal.signal(signal.SIGTERM, _on_sigterm)
    # The local cluster's self-signed cert is skipped on purpose (loopback only); one warning
    # per request would bury the log.
    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    api_client = config.new_client_from_config(config_file=args.kubeconfig)
    _log(f"watching pods via {api_client.configuration.host}")
    try:
        FakeKubelet(api_client, args.pod_ip, args.ready_file, behaviour).run()
    except (SystemExit, KeyboardInterrupt):
        _log("stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())
