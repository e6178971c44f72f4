"""PoolSchedules in the queue's terms (issue #29): their events map to the pool's key, and the
pool's job keeps each schedule's status and returns the next edge as its `requeue_after` (on a
fake reader and API and a clock the test moves; no wall time is asserted)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from scheduler.mapping import keys_for, summarize
from warmpool.controller.schedules import keep_schedules
from warmpool.keys import PoolKey
from warmpool.kube.api import KubeError
from warmpool.pool import vocabulary as v
from warmpool.pool.model import AppDefinition, parse_appdefinition

NS = "ns1"
T0 = datetime(2026, 3, 2, 11, 0, tzinfo=UTC)


def meta(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": NS, "resourceVersion": "1", "uid": f"u-{name}", **extra}


def schedule(name: str, **window: Any) -> dict[str, Any]:
    return {"apiVersion": v.SCHEDULE_API_VERSION, "kind": v.SCHEDULE_KIND, "metadata": meta(name),
            "spec": {"appDefinition": "java", "windows": [{
                "start": "12:00", "end": "14:00", "timeZone": "UTC", "size": 3,
                "leadTime": "20m", **window}]}}


APPDEF = {"kind": v.APPDEF_KIND, "metadata": meta("java", generation=1),
          "spec": {"name": "java", "image": "img", "port": 3000,
                   "minInstances": 1, "maxInstances": 3}}


class Fake:
    """The pool job's reader (its schedules as a cache holds them, its clock) and API (the
    status patches, applied to the objects the reader holds, as a watch would)."""

    def __init__(self, *schedules: dict[str, Any]) -> None:
        self.objects = {s["metadata"]["name"]: s for s in schedules}
        self.at = T0
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        self.stale = 0  # the next writes refused as stale (422)
        self.stale = 0  # the next writes' tests fail (the object changed since it was read)

    def schedules(self, namespace: str) -> list[dict[str, Any]]:
        return list(self.objects.values())

    def now(self) -> datetime:
        return self.at

    def wrote(self, obj: dict[str, Any]) -> None:
        self.objects[obj["metadata"]["name"]] = obj

    def json_patch(self, api_version: str, kind: str, namespace: str, name: str,
                   ops: list[dict[str, Any]], *, status: bool = False, **kw: Any) -> Any:
        assert (kind, status) == (v.SCHEDULE_KIND, True)
        uid, version, add = ops
        assert uid == {"op": "test", "path": "/metadata/uid", "value": f"u-{name}"}
        # Changed since the read (its spec, or its status): refused, decided again on it.
        current = self.objects[name]["metadata"]["resourceVersion"]
        assert version["path"] == "/metadata/resourceVersion"
        if self.stale or version["value"] != current:
            self.stale = max(0, self.stale - 1)
            raise KubeError(422, "the test operation failed")
        self.patches.append((name, add["value"]))
        obj = {**self.objects[name], "status": add["value"]}
        obj["metadata"] = {**obj["metadata"], "resourceVersion": str(int(current) + 1)}
        return obj

    def statuses(self) -> dict[str, dict[str, Any]]:
        """Each status without its conditions (checked on their own below)."""
        return {name: {k: val for k, val in (obj.get("status") or {}).items()
                       if k not in ("conditions", "observedGeneration")}
                for name, obj in self.objects.items()}

    def conditions(self, name: str) -> dict[str, tuple[str, str]]:
        status = self.objects[name].get("status") or {}
        return {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions", [])}


def run(fake: Fake) -> float | None:
    appdef = parse_appdefinition(APPDEF)
    assert isinstance(appdef, AppDefinition)
    return keep_schedules(fake, fake, NS, "java", appdef)  # type: ignore[arg-type]


def test_schedule_events_map_to_the_pool_key() -> None:
    obj = schedule("lecture")
    assert keys_for(v.SCHEDULE_KIND, "ADDED", obj) == [PoolKey(NS, "java")]
    moved = {**obj, "spec": {**obj["spec"], "appDefinition": "python"}}
    assert keys_for(v.SCHEDULE_KIND, "MODIFIED", moved, summarize(v.SCHEDULE_KIND, obj)) == [
        PoolKey(NS, "python"), PoolKey(NS, "java")]
    status_only = {**obj, "status": {"message": "ok"}}
    assert keys_for(v.SCHEDULE_KIND, "MODIFIED", status_only,
                    summarize(v.SCHEDULE_KIND, obj)) == []
    assert keys_for(v.SCHEDULE_KIND, "DELETED", summarize(v.SCHEDULE_KIND, obj)) == [
        PoolKey(NS, "java")]


def test_the_pool_job_waits_for_the_edge_and_writes_status_on_change() -> None:
    fake = Fake(schedule("lecture"), schedule("too-big", size=4))
    # 11:00: the lead opens at 11:40, 2400 s from now: the pool's job runs again then.
    assert run(fake) == 2400
    status = fake.statuses()
    assert status["lecture"] == {"effectiveTarget": 1, "nextChange": "2026-03-02T11:40:00Z",
                                 "message": "ok"}
    assert fake.conditions("lecture") == {"Valid": ("True", "Valid"),
                                          "Active": ("False", "NoWindowOpen")}
    assert status["too-big"]["message"] == (
        "spec.windows[0].size (4) is above maxInstances (3) of AppDefinition 'java'")
    assert len(fake.patches) == 2

    # Run again before the edge (an event queued the pool): nothing changed, nothing written.
    fake.at = datetime(2026, 3, 2, 11, 30, tzinfo=UTC)
    assert run(fake) == 600
    assert len(fake.patches) == 2

    # At the lead: the statuses say the new target, the next edge is the window's end.
    fake.at = datetime(2026, 3, 2, 11, 40, tzinfo=UTC)
    assert run(fake) == 2 * 3600 + 20 * 60
    assert fake.statuses()["lecture"] == {
        "effectiveTarget": 3, "nextChange": "2026-03-02T14:00:00Z", "message": "ok"}
    assert fake.conditions("lecture") == {"Valid": ("True", "Valid"),
                                          "Active": ("True", "WindowOpen")}

    # The window ends: back to minInstances, the next edge tomorrow's lead (every day).
    fake.at = datetime(2026, 3, 2, 14, 0, tzinfo=UTC)
    assert run(fake) == 24 * 3600 - 2 * 3600 - 20 * 60
    assert fake.statuses()["lecture"]["effectiveTarget"] == 1


def test_a_run_a_moment_before_the_edge_looks_again_shortly_not_at_once() -> None:
    """The cluster's clock as read lags by up to a second: a run that reads a time just before
    the edge waits the rest, at least `MIN_WAIT`."""
    fake = Fake(schedule("lecture"))
    fake.at = datetime(2026, 3, 2, 11, 39, 59, 999000, tzinfo=UTC)
    after = run(fake)
    assert after is not None and 0.09 < after <= 0.1


def test_no_schedule_no_timer() -> None:
    assert run(Fake()) is None


def test_a_status_refused_as_stale_is_no_error_and_written_by_the_next_run() -> None:
    fake = Fake(schedule("lecture"))
    fake.stale = 1
    assert run(fake) == 2400  # the timer stands: the write is the next run's
    assert fake.patches == []
    assert run(fake) == 2400
    assert fake.statuses()["lecture"]["effectiveTarget"] == 1
