"""The scheduler as a process (`python -m scheduler`) with real worker processes
(`workers.process.WorkerPool`, 2 x 4 threads, running `workers.handlers`) on the real control
plane and a real Redis: the pool converges end to end, changes made while everything was
stopped are applied at start, and two schedulers hand the Lease over on SIGKILL, SIGTERM and
SIGSTOP of the leader.

Hand-over times are measured and printed (run with `-s` to see them), not asserted: the
assertions only use generous deadlines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from scheduler.leader import DEFAULT_LEASE_NAME, LEASE_API_VERSION, LEASE_KIND
from scheduler.process import SchedulerProcess
from tests.pool_world import (
    converge,
    emails,
    held_instance,
    instance_count,
    instance_objects,
    owner_kinds,
    session,
)
from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo
from warmpool.invariants import check
from warmpool.kube.api import Kube
from warmpool.queue import Layout, QueueSettings
from warmpool.testing.world import (
    USERS,
    create_appdef,
    create_session,
    delete_session,
    patch_appdef_spec,
)
from workers.process import WorkerPool

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]


def pgrep(*args: str) -> list[int]:
    out = subprocess.run(["pgrep", *args], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


class Stack:
    """Schedulers and worker pools of one test, all on the test's namespace and queue."""

    def __init__(self, cluster: ClusterInfo, namespace: str, settings: QueueSettings,
                 client: redis.Redis, tmp_path: Path) -> None:
        self.cluster, self.ns, self.settings, self.client = cluster, namespace, settings, client
        self.tmp_path = tmp_path
        self.schedulers: list[SchedulerProcess] = []
        self.pools: list[WorkerPool] = []
        assert settings.redis_url
        self.env = {
            "KUBECONFIG": str(cluster.kubeconfig),
            "WARMPOOL_REDIS_URL": settings.redis_url,
            "WARMPOOL_QUEUE_PREFIX": settings.prefix,
            "WARMPOOL_QUEUE_NAMESPACE": settings.namespace,
            "WARMPOOL_QUEUE_QUEUE_NAME": settings.queue_name,
            "PYTHONPATH": str(ROOT),
        }

    def scheduler(self, *extra: str, ready: bool = True) -> SchedulerProcess:
        n = len(self.schedulers)
        proc = SchedulerProcess(
            ["--namespace", self.ns, "--lease-namespace", self.ns, "--log-level", "INFO",
             *extra],
            env=self.env, log_path=self.tmp_path / f"scheduler-{n}.log", cwd=ROOT)
        self.schedulers.append(proc)
        return proc.start(ready=ready)

    def workers(self, processes: int = 2, threads: int = 4, **env: str) -> WorkerPool:
        pool = WorkerPool(self.settings, processes=processes, threads=threads,
                          env={"KUBECONFIG": str(self.cluster.kubeconfig), **env})
        self.pools.append(pool)
        return pool.start()

    def waiting_keys(self) -> set[str]:
        return {m.decode() for m in self.client.smembers(Layout.of(self.settings).dirty)}

    def lease(self, kube: Kube) -> dict[str, Any]:
        obj = kube.get(LEASE_API_VERSION, LEASE_KIND, self.ns, DEFAULT_LEASE_NAME)
        return (obj or {}).get("spec") or {}

    def close(self) -> None:
        for s in self.schedulers:
            if s.proc is not None:
                s.signal(signal.SIGCONT)  # in case a test left one stopped
                s.stop(timeout=20)
        for pool in self.pools:
            pool.stop(timeout=40)

    def leftovers(self) -> list[int]:
        """Our scheduler processes (their argv names the namespace) and worker processes
        (spawned children of this process) that are still alive."""
        mine = pgrep("-f", f"scheduler --health-port 0 --namespace {self.ns}( |$)")
        workers = [p for p in pgrep("-P", str(os.getpid()), "-f", "spawn_main")
                   if any(p in pool.pids for pool in self.pools)]
        return mine + workers


@pytest.fixture
def stack(request: pytest.FixtureRequest, cluster: ClusterInfo, namespace: str,
          tmp_path: Path) -> Iterator[Stack]:
    settings: QueueSettings = request.getfixturevalue("queue_settings")
    client: redis.Redis = request.getfixturevalue("redis_client")
    st = Stack(cluster, namespace, settings, client, tmp_path)
    try:
        yield st
    finally:
        st.close()
        assert st.leftovers() == [], "processes left behind"
        for s in st.schedulers:
            assert not s.alive()
        for pool in st.pools:
            assert all(p is None or not p.is_alive() for p in pool.procs)


# --- end to end ----------------------------------------------------------------------------


def test_scheduler_and_two_worker_processes_converge_the_pool(
    stack: Stack, kube: Kube, namespace: str
) -> None:
    ns = namespace
    # Strict minInstances: the fourth Session is to wait for the first one's instance through
    # the scale-down (with a burst it would get an instance of its own at once).
    stack.workers(processes=2, WARMPOOL_BURST="off")
    sched = stack.scheduler()
    assert sched.get("/healthz")[0] == 200 and sched.get("/readyz")[0] == 200

    create_appdef(kube, ns, min_instances=3)
    converge(kube, ns, lambda: all(instance_count(kube, ns, k) == 5 for k in (1, 2, 3)),
             what="three free instances")

    for i in (1, 2, 3):
        create_session(kube, ns, f"s{i}", USERS[i])
    converge(kube, ns, lambda: sorted(filter(None, (held_instance(kube, ns, f"s{i}")
                                                    for i in (1, 2, 3)))) == [1, 2, 3],
             what="three claims")
    held = {f"s{i}": held_instance(kube, ns, f"s{i}") for i in (1, 2, 3)}
    create_session(kube, ns, "s4", USERS[4])  # no free instance: waits
    converge(kube, ns, lambda: (session(kube, ns, "s4").get("status") or {})
             .get("operatorStatus") == "HANDLING", what="s4 waiting")

    patch_appdef_spec(kube, ns, "java", minInstances=1)  # below claimed ids 2 and 3
    converge(kube, ns, lambda: True, what="scale-down with claims")
    for name, k in held.items():
        assert instance_count(kube, ns, k) == 5, f"claimed instance {k} lost objects"
        assert emails(kube, ns, "java", k) == USERS[int(name[1:])]
        for obj in instance_objects(kube, ns, "java", k).values():
            assert owner_kinds(obj) == ["AppDefinition", "Session"]

    above = [n for n, k in held.items() if k > 1]
    for name in above:
        delete_session(kube, ns, name)
    converge(kube, ns, lambda: all(instance_count(kube, ns, held[n]) == 0 for n in above),
             what="released instances above minInstances deleted")
    assert held_instance(kube, ns, "s4") is None  # instance 1 is still held

    (first,) = [n for n, k in held.items() if k == 1]
    delete_session(kube, ns, first)
    converge(kube, ns, lambda: held_instance(kube, ns, "s4") == 1,
             what="the waiting session gets the freed instance")
    assert emails(kube, ns, "java", 1) == USERS[4]
    assert sched.alive()
    sched.terminate()
    assert sched.wait(20) == 0


def test_changes_made_while_everything_was_stopped_are_applied_at_start(
    stack: Stack, kube: Kube, namespace: str
) -> None:
    ns = namespace
    pool = stack.workers(processes=2)
    sched = stack.scheduler()
    create_appdef(kube, ns, min_instances=3)
    # The lowest free *complete* instance is claimed: let the pool be built first.
    converge(kube, ns, lambda: all(instance_count(kube, ns, k) == 5 for k in (1, 2, 3)),
             what="three free instances")
    create_session(kube, ns, "s1", USERS[1])
    converge(kube, ns, lambda: held_instance(kube, ns, "s1") == 1, what="s1 on 1")
    create_session(kube, ns, "s2", USERS[2])
    converge(kube, ns, lambda: held_instance(kube, ns, "s2") == 2, what="s2 on 2")

    sched.terminate()
    assert sched.wait(20) == 0
    pool.stop(timeout=40)

    patch_appdef_spec(kube, ns, "java", minInstances=1)
    delete_session(kube, ns, "s2")
    # Only the garbage collector acts meanwhile: it drops the dangling Session references,
    # which leaves instance 2 free with s2's e-mail still in its allow-list.
    wait_for(lambda: all("Session" not in owner_kinds(o)
                         for o in instance_objects(kube, ns, "java", 2).values()),
             timeout=90, message="the garbage collector to drop s2's references")
    assert emails(kube, ns, "java", 2) == USERS[2]
    assert instance_count(kube, ns, 3) == 5
    assert {x.invariant for x in check(kube, ns)} >= {"I2", "I5"}

    stack.workers(processes=2)
    stack.scheduler()
    converge(kube, ns, lambda: instance_count(kube, ns, 2) == 0
             and instance_count(kube, ns, 3) == 0, what="scale-down and release at start")
    assert held_instance(kube, ns, "s1") == 1 and instance_count(kube, ns, 1) == 5
    assert emails(kube, ns, "java", 1) == USERS[1]


def test_a_release_whose_work_redis_lost_is_done_in_seconds_not_at_the_next_resync(
    stack: Stack, kube: Kube, namespace: str
) -> None:
    """Redis restarted without persistence while a release waited in the queue: the scheduler
    sees its epoch gone within epoch_period and resyncs at once (the periodic resync, an hour
    here, cannot be what does it)."""
    from tests.redis_server import delete_prefix

    ns = namespace
    stack.env["WARMPOOL_QUEUE_EPOCH_PERIOD"] = "0.5"
    pool = stack.workers(processes=1)
    sched = stack.scheduler("--resync-period", "3600")
    create_appdef(kube, ns, min_instances=1)
    converge(kube, ns, lambda: instance_count(kube, ns, 1) == 5, what="one free instance")
    create_session(kube, ns, "s1", USERS[1])
    converge(kube, ns, lambda: held_instance(kube, ns, "s1") == 1, what="s1 on 1")
    assert stack.client.get(Layout.of(stack.settings).epoch)  # the scheduler made it

    pool.stop(timeout=40)  # nobody runs the release's keys ...
    patch_appdef_spec(kube, ns, "java", minInstances=0)
    delete_session(kube, ns, "s1")
    # ... the garbage collector drops s1's references (its events are the last the scheduler
    # gets; their keys wait in Redis) ...
    wait_for(lambda: all("Session" not in owner_kinds(o)
                         for o in instance_objects(kube, ns, "java", 1).values()),
             timeout=90, message="the garbage collector to drop s1's references")
    wait_for(lambda: f"instance/{ns}/java/1" in stack.waiting_keys(), timeout=20,
             message="the release's key in the queue")
    # ... and Redis loses everything (only this test's keys: the server is shared).
    delete_prefix(stack.client, stack.settings.prefix.split(":", 1)[0] + ":")
    assert stack.waiting_keys() == set()

    stack.workers(processes=1)
    converge(kube, ns, lambda: instance_count(kube, ns, 1) == 0, timeout=60,
             what="the release done after the loss")
    stats = sched.status()["stats"]
    assert stats["redis_losses"] >= 1
    assert stats["last_resync_reason"] == "redis lost"
    assert stack.client.get(Layout.of(stack.settings).epoch)  # made again


# --- leader election -----------------------------------------------------------------------


def two_schedulers(stack: Stack, kube: Kube) -> tuple[SchedulerProcess, SchedulerProcess]:
    a = stack.scheduler()
    wait_for(lambda: stack.lease(kube).get("holderIdentity") == a.identity, timeout=30,
             message="the first scheduler to lead")
    b = stack.scheduler()
    wait_for(lambda: b.status()["holder"] == a.identity, timeout=30,
             message="the second scheduler to see the first lead")
    assert a.status()["leader"] and not b.status()["leader"]
    assert b.get("/readyz")[0] == 200  # a standby is ready too
    return a, b


def wait_takeover(stack: Stack, kube: Kube, b: SchedulerProcess, t0: float,
                  deadline: float) -> tuple[float, float]:
    """Seconds from t0 until b holds the Lease, and until b has done its takeover resync."""
    wait_for(lambda: stack.lease(kube).get("holderIdentity") == b.identity, timeout=deadline,
             interval=0.02, message="the standby to take the Lease")
    t_lease = time.monotonic() - t0

    def resynced() -> bool:
        st = b.status()
        return bool(st["leader"] and st["stats"]["last_resync_reason"] == "new leader")
    wait_for(resynced, timeout=10, interval=0.02, message="the new leader's resync")
    return t_lease, time.monotonic() - t0


def new_session_is_added_by(stack: Stack, kube: Kube, name: str) -> None:
    create_session(kube, stack.ns, name, USERS[7])
    wait_for(lambda: f"session/{stack.ns}/{name}" in stack.waiting_keys(), timeout=20,
             message=f"session/{stack.ns}/{name} in the queue")


def test_sigkill_of_the_leader_hands_over_after_the_lease_duration(
    stack: Stack, kube: Kube, namespace: str
) -> None:
    create_appdef(kube, namespace, min_instances=1)
    a, b = two_schedulers(stack, kube)
    renewed = stack.lease(kube)["renewTime"]
    wait_for(lambda: stack.lease(kube)["renewTime"] != renewed, timeout=10, interval=0.02)
    t0 = time.monotonic()  # just after a renewal: the worst case, a whole lease to wait
    a.kill()
    a.wait(10)
    t_lease, t_resync = wait_takeover(stack, kube, b, t0, deadline=60)
    print(f"\nSIGKILL hand-over: standby took the Lease after {t_lease:.2f}s, resynced after "
          f"{t_resync:.2f}s (lease duration 15s, retry period 2s)")
    assert stack.lease(kube)["leaseTransitions"] == 1
    new_session_is_added_by(stack, kube, "after-kill")


def test_sigterm_of_the_leader_hands_over_at_once(
    stack: Stack, kube: Kube, namespace: str
) -> None:
    create_appdef(kube, namespace, min_instances=1)
    a, b = two_schedulers(stack, kube)
    t0 = time.monotonic()
    a.terminate()
    t_lease, t_resync = wait_takeover(stack, kube, b, t0, deadline=60)
    code = a.wait(20)
    print(f"\nSIGTERM hand-over: standby took the Lease after {t_lease:.2f}s, resynced after "
          f"{t_resync:.2f}s (lease duration 15s, retry period 2s)")
    assert code == 0
    # Handed over, not expired: a gave the Lease up on its way out (what lets b take it at
    # once; the hand-over's timing is the leader-election unit tests', on a fake clock).
    assert a.log_path is not None
    assert f"released by {a.identity}" in a.log_path.read_text()
    assert stack.lease(kube)["leaseTransitions"] == 1
    new_session_is_added_by(stack, kube, "after-term")


def test_a_paused_leader_stops_adding_keys_when_it_wakes_up(
    stack: Stack, kube: Kube, namespace: str
) -> None:
    create_appdef(kube, namespace, min_instances=1)
    a, b = two_schedulers(stack, kube)
    before = a.status()["stats"]
    t0 = time.monotonic()
    a.signal(signal.SIGSTOP)  # a pause longer than the lease: a GC pause, a frozen VM
    try:
        t_lease, _ = wait_takeover(stack, kube, b, t0, deadline=60)
        print(f"\nSIGSTOP hand-over: standby took the Lease after {t_lease:.2f}s")
        new_session_is_added_by(stack, kube, "while-paused")
    finally:
        a.signal(signal.SIGCONT)
    # Awake, a must not add what its watches now deliver: its renew deadline has passed.
    wait_for(lambda: a.status()["stats"]["dropped_not_leader"] > before["dropped_not_leader"],
             timeout=20, message="the old leader to drop the events it missed")
    st = a.status()
    assert not st["leader"]
    assert st["stats"]["enqueued"] == before["enqueued"]
    wait_for(lambda: a.status()["holder"] == b.identity, timeout=10)
    assert b.status()["leader"]
