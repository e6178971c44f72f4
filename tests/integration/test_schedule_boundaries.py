"""A PoolSchedule acted on by the real system at its boundaries, on the real clock (issue #17).

`test_pool_schedule.py` proves what the pool is at each instant with an injected clock; this
proves the scheduler process acts at the boundaries themselves: one scheduler and two worker
processes, the periodic resync an hour away (so no resync can be what moves the pool), and a
window that opens 30 s from now with a 20 s lead. The assertions are on the order of events,
never on elapsed times: nothing of the growth is created before the lead's boundary (the
objects' creationTimestamps, the API server's clock), the pool is whole before the window
opens, nothing is retired before the window's end, it is back at minInstances after it, and
the claimed instance is untouched throughout. The invariants are checked at the end.

The window's times are local to a fixed-offset zone chosen so that it is about noon there:
a window never spans midnight, whenever the test runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.pool_world import assert_invariants, held_instance, instance_objects, snapshot
from tests.redis_server import resolve_redis_url
from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo
from warmpool.harness import System
from warmpool.kube.api import Kube
from warmpool.pool import vocabulary as v
from warmpool.testing.world import USERS, create_appdef, create_session
from warmpool.testing.zones import noon_zone

pytestmark = pytest.mark.redis

OPENS_IN = timedelta(seconds=30)
LEAD = timedelta(seconds=20)
LENGTH = timedelta(seconds=20)  # the window, from its start to its end
SIZE = 6


def created(obj: dict[str, Any]) -> datetime:
    return datetime.strptime(obj["metadata"]["creationTimestamp"],
                             "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def existing(kube: Kube, ns: str) -> list[int]:
    return [k for k in range(1, SIZE + 2) if instance_objects(kube, ns, "java", k)]


def schedule_status(kube: Kube, ns: str) -> dict[str, Any]:
    """The schedule's status fields this test checks (its conditions have tests of their
    own: tests/unit/test_conditions.py, tests/integration/test_operator_view.py)."""
    obj = kube.get(v.SCHEDULE_API_VERSION, v.SCHEDULE_KIND, ns, "lecture") or {}
    status = obj.get("status") or {}
    return {k: status[k] for k in ("effectiveTarget", "nextChange", "message") if k in status}


def whole(kube: Kube, ns: str, ids: range) -> bool:
    return all(len(instance_objects(kube, ns, "java", k)) == 5 for k in ids)


@pytest.fixture
def system(cluster: ClusterInfo, namespace: str, tmp_path: Path) -> Iterator[str]:
    """`namespace` served by one scheduler (resync an hour away) and two worker processes."""
    with System(cluster, namespaces=[namespace], workers=2, threads=4, resync_period=3600,
                redis=resolve_redis_url(), env={"WARMPOOL_URL_PROBE": "off"},
                log_dir=tmp_path) as system:
        yield namespace
        assert system.dead() == [], "a controller process died"


def test_the_scheduler_grows_the_pool_at_the_lead_and_shrinks_it_at_the_end(
    system: str, kube: Kube,
) -> None:
    ns = system
    create_appdef(kube, ns, min_instances=2, max_instances=10)
    wait_for(lambda: whole(kube, ns, range(1, 3)), timeout=60,
             message=lambda: f"the pool at 2: {existing(kube, ns)}")
    create_session(kube, ns, "s1", USERS[1])  # the only Session: the lowest free id, 1
    wait_for(lambda: held_instance(kube, ns, "s1") == 1 and whole(kube, ns, range(1, 3)),
             timeout=60, message=lambda: f"s1 on instance 1, 2 free: {existing(kube, ns)}")
    claimed = snapshot(kube, ns, "java", 1)

    now = datetime.now(UTC).replace(microsecond=0)
    zone, offset = noon_zone(now)
    start = now + OPENS_IN
    end = start + LENGTH
    boundary = start - LEAD
    kube.create({
        "apiVersion": v.SCHEDULE_API_VERSION, "kind": v.SCHEDULE_KIND,
        "metadata": {"name": "lecture", "namespace": ns},
        "spec": {"appDefinition": "java", "windows": [{
            "start": (start + offset).strftime("%H:%M:%S"),
            "end": (end + offset).strftime("%H:%M:%S"), "timeZone": zone, "size": SIZE,
            "leadTime": f"{int(LEAD.total_seconds())}s"}]},
    })

    # The pool is whole at SIZE before the window opens...
    wait_for(lambda: whole(kube, ns, range(1, SIZE + 1)),
             timeout=max(1.0, (start - datetime.now(UTC)).total_seconds()),
             message=lambda: f"the pool at {SIZE} before the window opens: {existing(kube, ns)}")
    # ...and nothing of the growth was made before the lead's boundary.
    grown = [obj for k in range(3, SIZE + 1)
             for obj in instance_objects(kube, ns, "java", k).values()]
    assert len(grown) == 5 * (SIZE - 2)
    assert min(created(o) for o in grown) >= boundary, (
        f"instances created before the lead boundary {boundary:%H:%M:%S}: "
        f"{sorted({o['metadata']['creationTimestamp'] for o in grown})}")
    assert snapshot(kube, ns, "java", 1) == claimed
    wait_for(lambda: schedule_status(kube, ns) == {
        "effectiveTarget": SIZE, "nextChange": end.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "message": "ok"}, timeout=30,
        message=lambda: f"the schedule's status in its window: {schedule_status(kube, ns)}")

    # Until the window's end nothing is retired: every poll up to a second before it sees the
    # whole pool (the end is the awaited condition; each poll is an observation, not a sleep).
    def whole_until_the_end() -> bool:
        assert existing(kube, ns) == list(range(1, SIZE + 1)), "retired before the end"
        return datetime.now(UTC) >= end - timedelta(seconds=1)
    wait_for(whole_until_the_end, interval=0.5,
             timeout=max(1.0, (end - datetime.now(UTC)).total_seconds()),
             message="the window's end, the pool whole")

    # After the end: back to minInstances; the claimed instance kept as it was.
    wait_for(lambda: existing(kube, ns) == [1, 2], timeout=60,
             message=lambda: f"the pool back at 2 after the window: {existing(kube, ns)}")
    assert datetime.now(UTC) >= end
    assert snapshot(kube, ns, "java", 1) == claimed
    assert held_instance(kube, ns, "s1") == 1
    wait_for(lambda: schedule_status(kube, ns).get("effectiveTarget") == 2, timeout=30,
             message=lambda: f"the schedule's status after its window: "
                             f"{schedule_status(kube, ns)}")
    assert_invariants(kube, ns)
