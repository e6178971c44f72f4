"""Apply a plan's actions, in order, each one only while the lease is still held.

Every write carries a precondition (resourceVersion, or uid + resourceVersion for deletes), so a
plan decided on a stale read fails with Conflict instead of clobbering; the caller then observes
and decides again. Every write also stamps the lease's fence on the object, so a holder whose
lease has expired can tell that a newer holder has been here (see ``check_fence``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from warmpool.controller.guard import Guard
from warmpool.kube.api import Conflict, Kube, KubeError
from warmpool.pool import vocabulary as v
from warmpool.pool.actions import (
    Action,
    AnnotateSession,
    Create,
    Delete,
    Patch,
    RefreshPods,
    Report,
    ResetPods,
    SetSessionStatus,
)
from warmpool.pool.decide import InstanceView

log = logging.getLogger(__name__)


class FenceRegression(Exception):
    """An object was last written under a newer lease than ours: we are a stale holder."""


def observed_fence(view: InstanceView) -> int:
    best = 0
    for _, obj in view.existing():
        raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(v.ANNOTATION_FENCE, "")
        if raw.isdigit():
            best = max(best, int(raw))
    return best


def check_fence(view: InstanceView, guard: Guard) -> None:
    """Refuse to act if a newer lease holder wrote this instance, unless our lease still holds.

    A higher fence with our lease still valid can only mean the fence counter itself was reset
    (Redis lost its data): nobody else can hold the lease now, so we go on and our writes carry
    the new, lower numbers from here.
    """
    seen = observed_fence(view)
    if seen > guard.fence:
        try:
            guard.ensure_held()
        except Exception as exc:
            raise FenceRegression(f"instance {view.id} was written under fence {seen}, "
                                  f"ours is {guard.fence}") from exc
        log.warning("instance %s carries fence %s above ours (%s): fence counter was reset",
                    view.id, seen, guard.fence)


class Executor:
    def __init__(self, kube: Kube, namespace: str, guard: Guard) -> None:
        self.kube = kube
        self.namespace = namespace
        self.guard = guard

    def _fenced(self, metadata: Mapping[str, Any]) -> dict[str, Any]:
        annotations = dict(metadata.get("annotations") or {})
        annotations[v.ANNOTATION_FENCE] = str(self.guard.fence)
        return {**metadata, "annotations": annotations}

    def _pods(self, app_selector: str) -> list[dict[str, Any]]:
        pods, _ = self.kube.list("v1", "Pod", self.namespace,
                                 label_selector=f"{v.LABEL_APP}={app_selector}")
        return pods

    def apply(self, actions: Iterable[Action]) -> int:
        """Apply in order; returns the number of writes. Raises Conflict on a stale precondition."""
        writes = 0
        for action in actions:
            self.guard.ensure_held()
            writes += self._apply(action)
        return writes

    def _apply(self, action: Action) -> int:
        ns = self.namespace
        match action:
            case Create(part=part, body=body):
                self.kube.create({**body, "metadata": self._fenced(body["metadata"])})
                log.info("created %s %s", part.kind, body["metadata"]["name"])
            case Patch(part=part, name=name, resource_version=rv, patch=patch, why=why):
                body = {**patch, "metadata": self._fenced(patch.get("metadata", {}))}
                try:
                    self.kube.merge_patch(part.api_version, part.kind, ns, name, body,
                                          resource_version=rv)
                except KubeError as exc:
                    if exc.status == 404:
                        raise Conflict(f"{part.kind} {name} vanished") from exc
                    raise
                log.info("patched %s %s (%s)", part.kind, name, why)
            case Delete(part=part, name=name, uid=uid, resource_version=rv, why=why):
                self.kube.delete(part.api_version, part.kind, ns, name, uid=uid,
                                 resource_version=rv)
                log.info("deleted %s %s (%s)", part.kind, name, why)
            case ResetPods(app_selector=selector):
                pods = self._pods(selector)
                for pod in pods:
                    meta = pod["metadata"]
                    self.kube.delete("v1", "Pod", ns, meta["name"], uid=meta.get("uid"))
                log.info("reset %d pod(s) of %s", len(pods), selector)
                return len(pods)
            case RefreshPods(app_selector=selector):
                now = datetime.now(UTC).isoformat()
                pods = self._pods(selector)
                for pod in pods:
                    try:
                        self.kube.merge_patch("v1", "Pod", ns, pod["metadata"]["name"],
                                              {"metadata": {"annotations": {v.ANNOTATION_REFRESH:
                                                                            now}}})
                    except KubeError as exc:  # a pod that went away needs no refresh
                        if exc.status != 404:
                            raise
                return len(pods)
            case AnnotateSession(session=name, annotations=annotations):
                try:
                    self.kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name,
                                          {"metadata": {"annotations": annotations}})
                except KubeError as exc:
                    # A Session deleted during its claim: its instance is released by the
                    # next reconcile of that instance, which its deletion queues.
                    if exc.status != 404:
                        raise
                    log.info("Session %s went away before its annotation", name)
                    return 0
                log.info("annotated Session %s with %s", name, annotations)
            case SetSessionStatus(session=name, status=status):
                try:
                    self.kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name,
                                          {"status": status}, status=True)
                except KubeError as exc:
                    if exc.status != 404:  # a Session deleted meanwhile needs no status
                        raise
                log.info("Session %s is %s: %s", name, status.get("operatorStatus"),
                         status.get("operatorMessage"))
            case Report(reason=reason, message=message, warning=warning, regarding=regarding):
                log.warning("%s: %s", reason, message)
                self.kube.event(ns, regarding or {"kind": "Namespace", "name": ns}, reason,
                                message, warning=warning)
                return 0
        return 1
