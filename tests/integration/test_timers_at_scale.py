"""Time is a key (issue #29): Session deadlines and PoolSchedule edges at scale, two workers.

The whole system (one scheduler, two worker processes, a real Redis, the local control plane
through the fault-injecting API proxy) with N Sessions carrying `spec.timeout` and one
PoolSchedule of W windows. No timer runs in the scheduler any more: each Session's deadline
is its `timeout/` key's `requeue_after`, each schedule edge the pool's job's.

The cluster's clock is moved, not waited for: the proxy adds `AHEAD` seconds to every
response's `Date` (the one place the controller reads the server's time), while the
Sessions' creationTimestamps stay the real server's. So a Session whose 1-minute limit makes
it due 2 minutes after its creation (by the cluster's clock) is due `LEAD` seconds after its
creation in real time, through the production path: the first run of its key reads the
clock and waits for the rest.

What is shown:
- every Session is deleted, none before its deadline and each within `BOUND` seconds after
  it by the cluster's clock (the test's own watch records when each deletion arrived: an
  observation after the fact, so lateness is over-, never under-stated);
- every schedule edge is met: the pool's job starts a run within `BOUND` after each edge
  (run log), and the schedule's status ends at the pool's minimum;
- the work spread over both workers: the run log (`workers.runlog`) names, for the
  `timeout/` and `pool/` runs, the worker process that ran each; both ran some;
- the scheduler's CPU: read from /proc before and after each phase and printed (reported,
  not asserted: the scheduler only maps the Sessions' watch events to keys).

The bound: a deadline is met when a worker takes its delayed key (promoted within ~20 ms of
its time by the queue's maintenance) and deletes the Session: late by the clock's lag (the
`Date` header is whole seconds), the queue's backlog at that moment and two API calls. BOUND
(30 s) is that with a wide margin for a loaded 2-core machine; the printed figures are the
measurement.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.redis_server import resolve_redis_url
from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo
from warmpool.harness import System
from warmpool.kube.api import Kube
from warmpool.kube.reflector import Reflector, Watched
from warmpool.pool import vocabulary as v
from warmpool.pool.timeouts import epoch_seconds
from warmpool.testing.world import create_appdef, session_body, session_spec
from warmpool.testing.zones import noon_zone

pytestmark = pytest.mark.redis

TIMEOUT_MIN = 1  # spec.timeout: due (timeout + 1) minutes after creation, by the cluster's clock
LEAD = 25.0  # seconds of real time from a Session's creation to its deadline
AHEAD = (TIMEOUT_MIN + 1) * 60 - LEAD  # how far the proxy moves the cluster's clock ahead
BOUND = 30.0  # seconds: every deadline and edge is met within this after it
WINDOW = 2  # seconds each schedule window lasts
GAP = 4  # seconds from one window's start to the next's

SIZES = [
    pytest.param(50, 3, id="50-sessions-3-windows"),
    pytest.param(1000, 20, id="1000-sessions-20-windows", marks=pytest.mark.slow),
]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (/proc/<pid>/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Deletions:
    """When each Session's deletion reached a watch of the test's own (time.time())."""

    def __init__(self, kube: Kube, ns: str) -> None:
        self.seen: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.reflector = Reflector(Kube(kube.api_client), Watched(v.SESSION_KIND,
                                                                  v.SESSION_API_VERSION),
                                   ns, self._on, summarize=lambda kind, obj: obj,
                                   timeout_range=(30.0, 60.0))

    def _on(self, event_type: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if event_type == "DELETED":
            with self.lock:
                self.seen.setdefault(obj["metadata"]["name"], time.time())

    def count(self) -> int:
        with self.lock:
            return len(self.seen)

    def __enter__(self) -> Deletions:
        self.reflector.start(self.stop)
        assert self.reflector.synced.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()


@pytest.fixture
def system(cluster: ClusterInfo, namespace: str, tmp_path: Path) -> Iterator[System]:
    """`namespace` served by one scheduler (its periodic resync an hour away: no resync is
    what meets a deadline) and two worker processes, through the API proxy."""
    system = System(cluster, namespaces=[namespace], workers=2, threads=4, proxy=True,
                    resync_period=3600, redis=resolve_redis_url(),
                    env={"WARMPOOL_URL_PROBE": "off"}, log_dir=tmp_path)
    # The clock is moved before any process starts: a worker's clock takes the Date of any
    # answer it had (its start-up discovery too), and one from before the move would put it
    # AHEAD seconds behind the cluster's, each edge's run that much late.
    system.start(workers=False, schedulers=False)
    try:
        assert system.proxy is not None
        system.proxy.set(clock_offset=AHEAD)
        system.start_workers()
        system.start_schedulers()
        yield system
        assert system.dead() == [], "a controller process died"
    finally:
        system.stop()


def windows(count: int, first: datetime, offset: timedelta) -> list[dict[str, Any]]:
    """`count` windows of size 1, WINDOW s long, GAP s apart, the first opening at `first`
    (the cluster's time): each opening and each end changes the pool's target."""
    out = []
    for i in range(count):
        start = first + timedelta(seconds=GAP * i)
        out.append({"start": (start + offset).strftime("%H:%M:%S"),
                    "end": (start + offset + timedelta(seconds=WINDOW)).strftime("%H:%M:%S"),
                    "timeZone": noon_zone(first)[0], "size": 1})
    return out


@pytest.mark.parametrize(("sessions", "window_count"), SIZES)
def test_every_deadline_and_edge_is_met_on_both_workers(
    system: System, kube: Kube, namespace: str, sessions: int, window_count: int,
) -> None:
    ns = namespace
    scheduler_pid = system.schedulers[0].pid
    create_appdef(kube, ns, "java", min_instances=0, max_instances=1, timeout=TIMEOUT_MIN)
    create_appdef(kube, ns, "sched", min_instances=0, max_instances=2, shared_route=False)

    with Deletions(kube, ns) as deletions:
        cpu_start = cpu_seconds(scheduler_pid)
        # The schedule: its first window opens a little after the Sessions are made.
        cluster_now = datetime.now(UTC) + timedelta(seconds=AHEAD)
        first = cluster_now.replace(microsecond=0) + timedelta(seconds=15 + sessions // 50)
        _, zone_offset = noon_zone(first)
        spec_windows = windows(window_count, first, zone_offset)
        kube.create({"apiVersion": v.SCHEDULE_API_VERSION, "kind": v.SCHEDULE_KIND,
                     "metadata": {"name": "lecture", "namespace": ns},
                     "spec": {"appDefinition": "sched", "windows": spec_windows}})
        edges = sorted({first + timedelta(seconds=GAP * i + d)
                        for i in range(window_count) for d in (0, WINDOW)})

        created: dict[str, float] = {}
        for i in range(sessions):
            name = f"t{i}"
            obj = kube.create(session_body(ns, name, session_spec(
                name, f"user{i}@example.com", "java")))
            stamp = epoch_seconds(obj["metadata"]["creationTimestamp"])
            assert stamp is not None
            created[name] = stamp
        cpu_created = cpu_seconds(scheduler_pid)

        wait_for(lambda: deletions.count() == sessions,
                 timeout=LEAD + BOUND + sessions * 0.2 + 60, interval=0.5,
                 message=lambda: f"{deletions.count()} of {sessions} Sessions deleted")
        # Each edge's run, or the bound past the last edge: a run is recorded when it starts,
        # after its edge, so the log is read only once every edge has one or none can be met.
        runs = system.runs

        def pool_runs() -> list[float]:
            return [t + AHEAD for t, key in runs.starts() if key == f"pool/{ns}/sched"]

        def settled() -> bool:
            starts = pool_runs()
            every_edge_ran = all(any(t >= edge.timestamp() for t in starts) for edge in edges)
            return every_edge_ran or time.time() + AHEAD > edges[-1].timestamp() + BOUND
        wait_for(settled, timeout=(edges[-1] - first).total_seconds() + BOUND + 120,
                 interval=0.5, message="a run of the pool after each schedule edge")
        cpu_end = cpu_seconds(scheduler_pid)

    # Deadlines: by the cluster's clock, deleted at or after creation + (timeout + 1) min
    # (the test's watch saw it after the fact: a deletion is never earlier than seen), within
    # BOUND. creationTimestamp is whole seconds, as the controller reads it too.
    lateness = {name: seen + AHEAD - (created[name] + (TIMEOUT_MIN + 1) * 60)
                for name, seen in deletions.seen.items()}
    assert sorted(lateness) == sorted(created)
    early = {n: late for n, late in lateness.items() if late < 0}
    assert not early, f"deleted before their deadline: {early}"
    late = {n: late for n, late in lateness.items() if late > BOUND}
    assert not late, f"deleted more than {BOUND} s after their deadline: {late}"

    # Edges: the pool's job ran at or after each one, within BOUND (its runs in the log).
    starts = pool_runs()
    edge_lateness = []
    for edge in edges:
        at = edge.timestamp()
        after = [t - at for t in starts if t >= at]
        assert after and after[0] <= BOUND, f"no run of the pool within {BOUND} s of {edge}"
        edge_lateness.append(after[0])
    def status() -> dict[str, Any]:
        obj = kube.get(v.SCHEDULE_API_VERSION, v.SCHEDULE_KIND, ns, "lecture") or {}
        return dict(obj.get("status") or {})
    wait_for(lambda: status().get("effectiveTarget") == 0 and status().get("message") == "ok",
             timeout=30, message=lambda: f"the schedule's status after its windows: {status()}")

    # The work spread over both workers.
    timeouts = runs.by_worker("timeout")
    pools = runs.by_worker("pool")
    assert sum(timeouts.values()) >= sessions
    assert len(timeouts) == 2, f"timeout runs by worker: {dict(timeouts)}"

    late_values = sorted(lateness.values())
    print(f"\n{sessions} Sessions, {window_count} windows ({len(edges)} edges), two workers:"
          f"\n  deadline lateness (s, cluster clock, as observed): "
          f"median {statistics.median(late_values):.2f}, max {late_values[-1]:.2f}"
          f"\n  edge lateness (s): median {statistics.median(edge_lateness):.2f}, "
          f"max {max(edge_lateness):.2f}"
          f"\n  timeout runs by worker: {dict(timeouts)}; pool runs by worker: {dict(pools)}"
          f"\n  scheduler CPU (s): creating the Sessions {cpu_created - cpu_start:.2f}, "
          f"deadlines and edges {cpu_end - cpu_created:.2f}")
