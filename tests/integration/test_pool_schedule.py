"""Scheduled pool sizes (issue #17, item 2) on the real control plane.

The pool is driven by ``run_until_quiet`` with an injected clock, standing before a window's
lead, inside it and after the window's end: what the pool is at each of those instants is
then a fact about the decisions, not about timing. The pool's job's own part (its next edge
as `requeue_after`, each schedule's status) runs against the same API server, on a clock the
test moves. Nothing here sleeps or measures wall time.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tests.pool_world import held_instance, instance_objects, snapshot
from tests.waiting import wait_for
from warmpool.controller.reconcile import resync_pool
from warmpool.controller.sequential import run_until_quiet
from warmpool.invariants import check
from warmpool.keys import PoolKey
from warmpool.kube.api import Kube
from warmpool.kube.reader import LiveReader
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings
from warmpool.testing.world import USERS, create_appdef, create_session, delete_session

SETTINGS = PoolSettings(url_probe=False)  # burst on, as by default
# "Now" of these tests: Monday 2 March 2026, 10:00:00 UTC. The window opens 30 s later, with
# a 20 s lead: the pool grows from 10:00:10 and shrinks at the window's end, 10:02:00.
NOW = datetime(2026, 3, 2, 10, 0, 0, tzinfo=UTC)
LEAD_OPENS = NOW + timedelta(seconds=10)
END = NOW + timedelta(minutes=2)


def create_schedule(kube: Kube, ns: str, name: str, **window: Any) -> dict[str, Any]:
    return kube.create({
        "apiVersion": v.SCHEDULE_API_VERSION, "kind": v.SCHEDULE_KIND,
        "metadata": {"name": name, "namespace": ns},
        "spec": {"appDefinition": "java", "windows": [{
            "days": ["Mon"], "start": "10:00:30", "end": "10:02:00", "timeZone": "UTC",
            "size": 10, "leadTime": "20s", **window}]},
    })


def existing(kube: Kube, ns: str) -> list[int]:
    """The ids of the instances that have any object, found by listing."""
    return [k for k in range(1, 12) if instance_objects(kube, ns, "java", k)]


def quiet_at(kube: Kube, ns: str, when: datetime) -> None:
    run_until_quiet(kube, ns, SETTINGS, clock=lambda: when)
    violations = check(kube, ns, now=when)
    assert not violations, "invariants violated:\n" + "\n".join(map(str, violations))


def test_the_pool_grows_in_the_lead_and_shrinks_after_the_end_claims_untouched(
    kube: Kube, namespace: str,
) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=2, max_instances=10)
    create_schedule(kube, ns, "lecture")
    quiet_at(kube, ns, NOW)
    assert existing(kube, ns) == [1, 2]

    # Three Sessions: two take the prewarmed 1 and 2, the third gets 3 made for it (burst).
    for i in (1, 2, 3):
        create_session(kube, ns, f"s{i}", USERS[i])
    quiet_at(kube, ns, NOW)
    assert [held_instance(kube, ns, f"s{i}") for i in (1, 2, 3)] == [1, 2, 3]
    claimed = snapshot(kube, ns, "java", 3)

    # A second before the lead: nothing grows.
    quiet_at(kube, ns, LEAD_OPENS - timedelta(seconds=1))
    assert existing(kube, ns) == [1, 2, 3]

    # The lead has begun: the pool is 10.
    quiet_at(kube, ns, LEAD_OPENS)
    assert existing(kube, ns) == list(range(1, 11))
    for k in range(4, 11):
        assert len(instance_objects(kube, ns, "java", k)) == 5, k
    assert snapshot(kube, ns, "java", 3) == claimed

    # The window is open and nearly over: still 10 (a free one is retired only after the end).
    quiet_at(kube, ns, END - timedelta(seconds=1))
    assert existing(kube, ns) == list(range(1, 11))

    # The window has ended: back to 2, the claimed 3 kept as it was.
    quiet_at(kube, ns, END)
    wait_for(lambda: existing(kube, ns) == [1, 2, 3], timeout=30,
             message=lambda: f"instances 4..10 retired: {existing(kube, ns)}")
    assert snapshot(kube, ns, "java", 3) == claimed
    assert held_instance(kube, ns, "s3") == 3

    # Its Session ends: above the target, 3 is retired like any instance there.
    delete_session(kube, ns, "s3")
    quiet_at(kube, ns, END)
    wait_for(lambda: existing(kube, ns) == [1, 2], timeout=30,
             message=lambda: f"instance 3 retired: {existing(kube, ns)}")


def test_an_invalid_schedule_changes_nothing(kube: Kube, namespace: str) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=2, max_instances=10)
    create_schedule(kube, ns, "elsewhere", timeZone="Europe/Atlantis")
    create_schedule(kube, ns, "backwards", start="10:01:00", end="10:00:30")
    create_schedule(kube, ns, "too-big", size=11)
    for when in (NOW, LEAD_OPENS, END - timedelta(seconds=1)):
        quiet_at(kube, ns, when)
        assert existing(kube, ns) == [1, 2], when


def schedule_status(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    """The status without its conditions (`conditions` reads those)."""
    obj = kube.get(v.SCHEDULE_API_VERSION, v.SCHEDULE_KIND, ns, name)
    assert obj is not None
    return {k: val for k, val in (obj.get("status") or {}).items()
            if k not in ("conditions", "observedGeneration")}


def conditions(kube: Kube, ns: str, name: str) -> dict[str, tuple[str, str]]:
    obj = kube.get(v.SCHEDULE_API_VERSION, v.SCHEDULE_KIND, ns, name)
    assert obj is not None
    status = obj.get("status") or {}
    assert status.get("observedGeneration") == obj["metadata"].get("generation")
    return {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions", [])}


def test_the_pools_job_waits_for_the_edge_and_keeps_each_status(
    kube: Kube, namespace: str,
) -> None:
    """Issue #29: the pool's own job, not a thread of the leader, keeps its schedules' status
    and returns the next edge as its `requeue_after` (the queue runs it again then)."""
    ns = namespace
    create_appdef(kube, ns, min_instances=2, max_instances=10)
    create_schedule(kube, ns, "lecture")
    create_schedule(kube, ns, "elsewhere", timeZone="Europe/Atlantis")
    create_schedule(kube, ns, "too-big", size=11)
    clock = [NOW]
    reader = LiveReader(kube, clock=lambda: clock[0])
    key = PoolKey(ns, "java")

    result = resync_pool(reader, kube, key, SETTINGS)
    assert result.requeue_after == 10.0  # the lead opens at 10:00:10
    assert schedule_status(kube, ns, "lecture") == {
        "effectiveTarget": 2, "nextChange": "2026-03-02T10:00:10Z", "message": "ok"}
    assert "'Europe/Atlantis' is not a known IANA time zone" in str(
        schedule_status(kube, ns, "elsewhere").get("message"))
    assert schedule_status(kube, ns, "elsewhere")["effectiveTarget"] == 2
    assert "spec.windows[0].size (11) is above maxInstances (10)" in str(
        schedule_status(kube, ns, "too-big").get("message"))

    # The lead opens: the run at the edge sees the new target (its follow-ups are the new
    # instances) and waits for the window's end; every status says so.
    clock[0] = LEAD_OPENS
    result = resync_pool(reader, kube, key, SETTINGS)
    assert result.requeue_after == (END - LEAD_OPENS).total_seconds()
    assert {str(k) for k, _ in result.follow_ups} >= {f"instance/{ns}/java/{k}"
                                                     for k in range(3, 11)}
    for name in ("lecture", "elsewhere", "too-big"):
        assert schedule_status(kube, ns, name)["effectiveTarget"] == 10
        assert schedule_status(kube, ns, name)["nextChange"] == "2026-03-02T10:02:00Z"
    assert conditions(kube, ns, "lecture") == {"Valid": ("True", "Valid"),
                                               "Active": ("True", "WindowOpen")}
    assert conditions(kube, ns, "elsewhere")["Valid"] == ("False", "InvalidSpec")

    # The window ends: back to 2; next Monday's lead is the next edge.
    clock[0] = END
    result = resync_pool(reader, kube, key, SETTINGS)
    assert schedule_status(kube, ns, "lecture")["effectiveTarget"] == 2
    assert schedule_status(kube, ns, "lecture")["nextChange"] == "2026-03-09T10:00:10Z"
    assert result.requeue_after == (datetime(2026, 3, 9, 10, 0, 10, tzinfo=UTC)
                                    - END).total_seconds()
