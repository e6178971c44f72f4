"""Scheduled pool sizes (issue #17, item 2) on the real control plane.

The pool is driven by ``run_until_quiet`` with an injected clock, standing before a window's
lead, inside it and after the window's end: what the pool is at each of those instants is
then a fact about the decisions, not about timing. The scheduler's part (queue the pool at
the edge, write each schedule's status) runs in-process against the same API server, on a
clock the test moves. Nothing here sleeps or measures wall time.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler.app import Scheduler, SchedulerConfig
from tests.pool_world import held_instance, instance_objects, snapshot
from tests.producers import Recorder
from tests.waiting import wait_for
from warmpool.controller.sequential import run_until_quiet
from warmpool.invariants import check
from warmpool.kube.api import Kube
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
    obj = kube.get(v.SCHEDULE_API_VERSION, v.SCHEDULE_KIND, ns, name)
    assert obj is not None
    return dict(obj.get("status") or {})


def test_the_scheduler_queues_the_pool_at_the_edge_and_keeps_each_status(
    kube: Kube, namespace: str,
) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=2, max_instances=10)
    create_schedule(kube, ns, "lecture")
    create_schedule(kube, ns, "elsewhere", timeZone="Europe/Atlantis")
    create_schedule(kube, ns, "too-big", size=11)
    clock = [NOW]
    rec = Recorder()
    sched = Scheduler(lambda: Kube(kube.api_client), rec, SchedulerConfig(
        namespaces=[ns], watch_timeout=(2, 3), clock=lambda: clock[0])).start()
    try:
        assert sched.wait_synced(30)
        wait_for(lambda: schedule_status(kube, ns, "lecture") == {
            "effectiveTarget": 2, "nextChange": "2026-03-02T10:00:10Z", "message": "ok"},
            timeout=30, message=lambda: str(schedule_status(kube, ns, "lecture")))
        wait_for(lambda: "'Europe/Atlantis' is not a known IANA time zone" in str(
            schedule_status(kube, ns, "elsewhere").get("message")), timeout=30,
            message=lambda: str(schedule_status(kube, ns, "elsewhere")))
        assert schedule_status(kube, ns, "elsewhere")["effectiveTarget"] == 2
        wait_for(lambda: "spec.windows[0].size (11) is above maxInstances (10)" in str(
            schedule_status(kube, ns, "too-big").get("message")), timeout=30)
        wait_for(lambda: sched.stats.resyncs >= 1 and "pool/" + ns + "/java" in rec.added,
                 timeout=30, message="the startup resync")
        mark = len(rec.added)
        assert sched.stats.schedule_offers == 0

        # The lead opens: the pool is queued (by the schedule, not by a resync), and every
        # status shows the new target and the window's end as the next change.
        clock[0] = LEAD_OPENS
        sched._wake_schedules.set()
        wait_for(lambda: f"pool/{ns}/java" in rec.added[mark:], timeout=30,
                 message=lambda: str(rec.added[mark:]))
        assert sched.stats.schedule_offers == 1
        for name in ("lecture", "elsewhere", "too-big"):
            wait_for(lambda name=name: schedule_status(kube, ns, name).get(
                "effectiveTarget") == 10, timeout=30,
                message=lambda name=name: str(schedule_status(kube, ns, name)))
            assert schedule_status(kube, ns, name)["nextChange"] == "2026-03-02T10:02:00Z"

        # The window ends: queued again, back to 2.
        mark = len(rec.added)
        clock[0] = END
        sched._wake_schedules.set()
        wait_for(lambda: f"pool/{ns}/java" in rec.added[mark:], timeout=30,
                 message=lambda: str(rec.added[mark:]))
        wait_for(lambda: schedule_status(kube, ns, "lecture").get("effectiveTarget") == 2,
                 timeout=30)
        # Next Monday's lead.
        assert schedule_status(kube, ns, "lecture")["nextChange"] == "2026-03-09T10:00:10Z"
    finally:
        sched.stop()
