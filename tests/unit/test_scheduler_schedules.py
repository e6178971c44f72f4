"""The scheduler's side of PoolSchedules: their events map to the pool's key, and the leader's
schedule loop queues the pool when a window's edge passes and writes each schedule's status
(on a static fake API and a clock the test moves; no wall time is asserted)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler.app import Scheduler, SchedulerConfig
from scheduler.mapping import keys_for, summarize
from tests.producers import Recorder
from tests.waiting import wait_for
from warmpool.keys import PoolKey
from warmpool.pool import vocabulary as v

NS = "ns1"
T0 = datetime(2026, 3, 2, 11, 0, tzinfo=UTC)


def meta(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": NS, "resourceVersion": "1", "uid": f"u-{name}", **extra}


def schedule(name: str, **window: Any) -> dict[str, Any]:
    return {"apiVersion": v.SCHEDULE_API_VERSION, "kind": v.SCHEDULE_KIND, "metadata": meta(name),
            "spec": {"appDefinition": "java", "windows": [{
                "start": "12:00", "end": "14:00", "timeZone": "UTC", "size": 3,
                "leadTime": "20m", **window}]}}


OBJECTS: dict[str, list[dict[str, Any]]] = {
    "AppDefinition": [{"kind": v.APPDEF_KIND, "metadata": meta("java", generation=1),
                       "spec": {"name": "java", "image": "img", "port": 3000,
                                "minInstances": 1, "maxInstances": 3}}],
    "PoolSchedule": [schedule("lecture"), schedule("too-big", size=4)],
    "Session": [], "Service": [], "Deployment": [], "ConfigMap": [],
}


class Fake:
    """Lists OBJECTS forever, never has events; records status patches."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def list_pages(self, api_version: str, kind: str, namespace: str | None, **kw: Any) -> Any:
        yield [dict(o) for o in OBJECTS[kind]], "1"

    def watch(self, api_version: str, kind: str, namespace: str | None, **kw: Any) -> Any:
        time.sleep(0.02)  # stimulus: each fake watch lasts a moment, as a quiet server's
        yield from ()

    def json_patch(self, api_version: str, kind: str, namespace: str, name: str,
                   ops: list[dict[str, Any]], *, status: bool = False, **kw: Any) -> Any:
        assert (kind, status) == (v.SCHEDULE_KIND, True)
        test, add = ops
        assert test["op"] == "test" and test["path"] == "/metadata/uid"  # re-created: refused
        with self.lock:
            self.patches.append((name, add["value"]))
        return {}

    def statuses(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return dict(self.patches)


@pytest.fixture
def world() -> Iterator[tuple[Scheduler, Fake, Recorder, list[datetime]]]:
    fake, rec, clock = Fake(), Recorder(), [T0]
    s = Scheduler(lambda: fake, rec, SchedulerConfig(  # type: ignore[arg-type]
        namespaces=[NS], clock=lambda: clock[0]))
    s.start()
    yield s, fake, rec, clock
    s.stop(timeout=5)


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


def test_the_loop_queues_the_pool_at_the_edge_and_writes_status_on_change(world) -> None:
    s, fake, rec, clock = world
    wait_for(lambda: len(fake.statuses()) == 2, timeout=10)
    status = fake.statuses()
    assert status["lecture"] == {"effectiveTarget": 1, "nextChange": "2026-03-02T11:40:00Z",
                                 "message": "ok"}
    assert status["too-big"]["message"] == (
        "spec.windows[0].size (4) is above maxInstances (3) of AppDefinition 'java'")
    assert s.stats.next_schedule_change == "2026-03-02T11:40:00Z"
    wait_for(lambda: "pool/ns1/java" in rec.added, timeout=10)  # the startup resync
    resynced = len(rec.added)

    # The lead opens: the pool is queued, and the statuses say so.
    clock[0] = datetime(2026, 3, 2, 11, 40, 1, tzinfo=UTC)
    s._wake_schedules.set()
    wait_for(lambda: rec.added[resynced:] == ["pool/ns1/java"], timeout=10,
             message=lambda: str(rec.added))
    wait_for(lambda: fake.statuses()["lecture"]["effectiveTarget"] == 3, timeout=10)
    assert fake.statuses()["lecture"]["nextChange"] == "2026-03-02T14:00:00Z"
    assert s.stats.schedule_offers == 1

    # Nothing changed: a pass writes no status and queues nothing.
    writes, passes = len(fake.patches), s.stats.schedule_passes
    s._wake_schedules.set()
    wait_for(lambda: s.stats.schedule_passes > passes, timeout=10)
    assert len(fake.patches) == writes and rec.added[resynced:] == ["pool/ns1/java"]

    # The window ends: queued again, back to minInstances.
    clock[0] = datetime(2026, 3, 2, 14, 0, 1, tzinfo=UTC)
    s._wake_schedules.set()
    wait_for(lambda: rec.added[resynced:] == ["pool/ns1/java"] * 2, timeout=10,
             message=lambda: str(rec.added))
    wait_for(lambda: fake.statuses()["lecture"]["effectiveTarget"] == 1, timeout=10)
