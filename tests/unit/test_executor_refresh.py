"""`Executor.apply`: a claim's pod refresh is sent with its run, and nothing after it waits
for its answer; the plan ends (and fails) only once it has been answered."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from warmpool.controller.guard import Unguarded
from warmpool.kube.api import Conflict
from warmpool.kube.executor import Executor
from warmpool.pool.actions import (
    AnnotateSession,
    Patch,
    RefreshPods,
    ResetPods,
    SetSessionStatus,
)
from warmpool.pool.parts import Part
from warmpool.pool.pods import POD_TEMPLATE_HASH

RS = {"metadata": {"name": "dep-abc", "uid": "rs-uid", "labels": {POD_TEMPLATE_HASH: "abc"},
                   "ownerReferences": [{"kind": "Deployment", "name": "dep", "uid": "dep-uid",
                                        "controller": True}]}}
POD = {"metadata": {"name": "pod-1", "uid": "pod-uid", "resourceVersion": "7",
                    "labels": {"app": "app-1", POD_TEMPLATE_HASH: "abc"},
                    "ownerReferences": [{"kind": "ReplicaSet", "name": "dep-abc",
                                         "uid": "rs-uid", "controller": True}]}}

#: Bounds only a wait-for cycle (a status that waits for the refresh while the refresh's
#: read waits for the status): the order is what the tests assert, never a time.
CYCLE = 30.0


class _Kube:
    """The API server as the plan's writes see it: the pod LIST is held until the Session's
    status has been written, which only a status write that does not wait for it allows."""

    def __init__(self, refuse_annotation: bool = False) -> None:
        self.calls: list[str] = []
        self.status_written = threading.Event()
        self.refuse_annotation = refuse_annotation
        self._lock = threading.Lock()

    def _note(self, call: str) -> None:
        with self._lock:
            self.calls.append(call)

    def list(self, api_version: str, kind: str, namespace: str, **_: Any
             ) -> tuple[list[dict[str, Any]], str]:
        if kind == "Pod":
            if not self.status_written.wait(CYCLE):
                raise AssertionError("the status write waited for the refresh's reads")
            self._note("list Pod")
            return [dict(POD)], "8"
        self._note(f"list {kind}")
        return [dict(RS)], "8"

    def merge_patch(self, api_version: str, kind: str, namespace: str, name: str,
                    patch: dict[str, Any], **_: Any) -> dict[str, Any]:
        if kind == "Session" and self.refuse_annotation:
            self._note("refused Session")
            raise Conflict("the Session changed")
        self._note(f"patch {kind}")
        return {"kind": kind, "metadata": {"name": name, "resourceVersion": "9"}}

    def event(self, namespace: str, regarding: dict[str, str], reason: str, message: str,
              **_: Any) -> None:
        self._note(f"event {reason}")

    def json_patch(self, api_version: str, kind: str, namespace: str, name: str,
                   ops: Any, **_: Any) -> dict[str, Any]:
        self._note("status")
        self.status_written.set()
        return {"kind": kind, "metadata": {"name": name, "resourceVersion": "10"}}


def _plan() -> list[Any]:
    return [Patch(Part.EMAIL_CONFIGMAP, "emails", "3", {"data": {"x": "y"}}, "holder"),
            RefreshPods("app-1", "dep", "dep-uid"),
            AnnotateSession("s1", {"instance": "1"}, "5"),
            SetSessionStatus("s1", {"operatorStatus": "HANDLED"}, uid="s1-uid",
                             resource_version="5")]


def test_the_status_is_written_without_waiting_for_the_refresh_and_the_plan_for_both() -> None:
    kube = _Kube()
    writes = Executor(kube, "ns", Unguarded()).apply(_plan())  # type: ignore[arg-type]
    # The refresh's reads were answered only after the status write; the plan returned
    # only after its stamp: the allow-list, the annotation, the status and the pod.
    assert kube.calls.index("status") < kube.calls.index("list Pod")
    assert kube.calls.index("list Pod") < kube.calls.index("patch Pod")
    assert kube.calls.index("patch ConfigMap") < kube.calls.index("patch Session")
    assert writes == 4


def test_a_refused_annotation_still_lets_the_refresh_finish_then_fails_the_plan() -> None:
    kube = _Kube(refuse_annotation=True)
    kube.status_written.set()  # no status comes after a refused run
    with pytest.raises(Conflict):
        Executor(kube, "ns", Unguarded()).apply(_plan())  # type: ignore[arg-type]
    # The pod was stamped (its allow-list is the holder's: the plan decided again finds
    # nothing to refresh), and no status was written after the refused run.
    assert "patch Pod" in kube.calls and "status" not in kube.calls


class _Cache:
    """A worker's cache as the executor asks it: the instance's pods and ReplicaSets."""

    def __init__(self, pods: list[dict[str, Any]], sets: list[dict[str, Any]]) -> None:
        self.pods, self.sets = pods, sets
        self.asked: list[str] = []

    def instance_pods(self, namespace: str, app_selector: str
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        self.asked.append(app_selector)
        return list(self.pods), list(self.sets)


def test_a_refresh_stamps_the_cached_own_pod_without_a_list() -> None:
    kube = _Kube()
    cache = _Cache([dict(POD)], [dict(RS)])
    Executor(kube, "ns", Unguarded(), pods=cache).apply(  # type: ignore[arg-type]
        [RefreshPods("app-1", "dep", "dep-uid")])
    assert cache.asked == ["app-1"]
    assert kube.calls == ["patch Pod"]


def test_a_cached_pod_of_another_deployment_is_not_stamped() -> None:
    kube = _Kube()
    other = {"metadata": {**RS["metadata"], "ownerReferences": [  # type: ignore[dict-item]
        {"kind": "Deployment", "name": "dep", "uid": "someone-else", "controller": True}]}}
    Executor(kube, "ns", Unguarded(), pods=_Cache([dict(POD)], [other])).apply(  # type: ignore[arg-type]
        [RefreshPods("app-1", "dep", "dep-uid")])
    assert kube.calls == ["event ForeignPod"]  # reported, not stamped, and no LIST


def test_a_cached_pod_whose_replica_set_the_cache_lacks_is_listed() -> None:
    # Both made within the cache's lag: the LISTs decide, and the pod is the Deployment's.
    kube = _Kube()
    kube.status_written.set()
    Executor(kube, "ns", Unguarded(), pods=_Cache([dict(POD)], [])).apply(  # type: ignore[arg-type]
        [RefreshPods("app-1", "dep", "dep-uid")])
    assert "list Pod" in kube.calls and "list ReplicaSet" in kube.calls
    assert kube.calls[-1] == "patch Pod"


class _ChangedPodKube:
    """The API server during a reset: the listed pod's kubelet wrote its status between the
    list and the delete (the delete's resourceVersion is refused once)."""

    def __init__(self) -> None:
        self.lists: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, str | None]] = []

    def list(self, api_version: str, kind: str, namespace: str, **query: Any
             ) -> tuple[list[dict[str, Any]], str]:
        self.lists.append({"kind": kind, **query})
        if kind == "ReplicaSet":
            return [dict(RS)], "8"
        if query.get("field_selector"):  # the re-read: the pod at its new version
            return [{"metadata": {**POD["metadata"], "resourceVersion": "9"}}], "9"
        return [dict(POD)], "8"

    def delete(self, api_version: str, kind: str, namespace: str, name: str, *,
               uid: str | None = None, resource_version: str | None = None) -> bool:
        if resource_version == "7":
            raise Conflict("the pod changed")
        self.deleted.append((name, resource_version))
        return True

    def merge_patch(self, api_version: str, kind: str, namespace: str, name: str,
                    patch: dict[str, Any], **_: Any) -> dict[str, Any]:
        return {"kind": kind, "metadata": {"name": name, "resourceVersion": "12"}}


def test_a_pod_changed_under_a_reset_is_read_again_by_its_name_not_by_a_scan() -> None:
    kube = _ChangedPodKube()
    Executor(kube, "ns", Unguarded()).apply([  # type: ignore[arg-type]
        Patch(Part.EMAIL_CONFIGMAP, "emails", "3", {"data": {"x": ""}}, "release"),
        ResetPods("app-1", "dep", "dep-uid")])
    assert kube.deleted == [("pod-1", "9")]  # deleted at the version read again
    reread = [q for q in kube.lists if q["kind"] == "Pod" and q.get("field_selector")]
    # One pod's key, from etcd (no resourceVersion: the refused version's successor is
    # unknown), still only while it carries the instance's label.
    assert reread == [{"kind": "Pod", "label_selector": "app=app-1",
                       "field_selector": "metadata.name=pod-1"}]
    # The first listing was the watch cache's, not older than the plan's own write.
    assert [q.get("resource_version") for q in kube.lists if q["kind"] == "Pod"] == ["12", None]
