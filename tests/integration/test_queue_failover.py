"""The whole system through a Redis Sentinel failover (issue #19, part 1).

Three real Sentinels, a primary and a replica (`sentinel_cluster`); two worker processes
(`WorkerPool`, 4 threads each) and a scheduler process (`python -m scheduler`), all given the
`redis+sentinel://` URL and nothing else about Redis; the real control plane. The primary is
SIGKILLed

- during a claim storm: 20 Sessions on a pool of 10 instances, the kill once the first
  claim is served and with the rest in flight, the last 10 Sessions created while there is
  no primary at all;
- during a scale-down: minInstances 10 -> 3 with 5 instances claimed (2 of them above the new
  minimum), the kill once the first free instance above it has started going.

The workers reach the API server through the fault proxy with 30 ms added per request while
the failover happens, so the claims and the scale-down are still running when the primary
dies (not a wait: it only widens the window the kill lands in).

The always-invariants (I1/I3/I4 for held instances) are polled from before the kill to the
end. After each failover, waiting for conditions only (`converge`): every Session is served
or waits with a reason (HANDLING and a message), no instance has two holders and no Session
two instances, every claimed instance kept the very objects it had before (uids recorded
before the kill), the pool is as its spec says, and the worker processes and the scheduler
are the ones started before the kill: same PIDs, never
exited, never restarted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scheduler.process import SchedulerProcess
from tests.chaos.checks import claim_problems
from tests.chaos.world import PinnedKube, snapshot
from tests.integration.sentinel_cluster import SentinelCluster, sentinel_cluster
from tests.integration.test_pool_concurrency import Watchdog, _uids
from tests.integration.test_scheduler_processes import Stack, instance_count
from tests.pool_world import deployment_ready, held_instance, instance_objects, session
from tests.redis_server import isolated_settings
from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo
from warmpool.kube.api import Kube
from warmpool.kube.api import connect as kube_connect
from warmpool.pool import vocabulary as v
from warmpool.queue.redis_conn import connect
from warmpool.testing.apiproxy import ApiProxy
from warmpool.testing.world import USERS, create_appdef, create_session, patch_appdef_spec
from workers.process import WorkerPool

pytestmark = pytest.mark.redis

POOL = 10
LATENCY = 0.03  # s per API request of the workers while the primary dies


@dataclass
class System:
    redis: SentinelCluster
    api: ApiProxy
    stack: Stack
    workers: WorkerPool
    scheduler: SchedulerProcess
    dog: Watchdog
    pinned: PinnedKube

    def processes(self) -> tuple[list[int | None], int]:
        return list(self.workers.pids), self.scheduler.pid

    def assert_same_processes(self, before: tuple[list[int | None], int]) -> None:
        """No worker process or scheduler exited or was replaced across the failover."""
        assert self.processes() == before, "a process was replaced"
        assert not self.workers.dead(), f"worker processes {self.workers.dead()} exited"
        assert self.workers.restarts == 0
        assert self.scheduler.alive(), "the scheduler exited"

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Poll the always-invariants in the background while the block runs (the kill and
        the promotion, when nothing else polls), into the same `Watchdog`."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(0.2):
                with contextlib.suppress(Exception):  # the API server busy: next time
                    self.dog.quiet()
        t = threading.Thread(target=loop, name="failover-watchdog", daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join(30)

    def converge(self, expect: Callable[[], object], what: str, timeout: float = 120
                 ) -> None:
        """`Watchdog.converge` (the always-invariants polled until the pool is quiet), plus
        `expect()`, plus no lost or doubled claim (the chaos runner's quiescence check)."""
        ns = self.stack.ns

        def done() -> bool:
            return (self.dog.quiet() and bool(expect())
                    and not claim_problems(snapshot(self.pinned, [ns]), ns))
        wait_for(done, timeout=timeout, interval=0.2, message=lambda: f"{what}: "
                 f"{claim_problems(snapshot(self.pinned, [ns]), ns)}")
        assert not self.dog.seen, "violated meanwhile:\n" + "\n".join(sorted(self.dog.seen))


@pytest.fixture
def system(cluster: ClusterInfo, kube: Kube, namespace: str, tmp_path: Path
           ) -> Iterator[System]:
    with sentinel_cluster(replicas=1, sentinels=3) as redis_cluster, \
            ApiProxy(upstream=cluster.server, token=cluster.token,
                     kubeconfig_path=tmp_path / "kubeconfig-proxy") as api:
        # Leases and heartbeats as the chaos runner's: a holder lost with the primary's
        # unreplicated writes is replaced within seconds.
        settings = isolated_settings(redis_cluster.url, lease_ttl=3.0, heartbeat_timeout=3.0,
                                     recovery_period=0.25, drain_timeout=5)
        client = connect(redis_cluster.url, failover_wait=10)
        via_proxy = dataclasses.replace(cluster, kubeconfig=api.kubeconfig_path)
        stack = Stack(via_proxy, namespace, settings, client, tmp_path)
        try:
            workers = stack.workers(processes=2, threads=4)
            scheduler = stack.scheduler()
            assert stack.env["WARMPOOL_REDIS_URL"].startswith("redis+sentinel://")
            assert all(p.settings.redis_url == redis_cluster.url for p in stack.pools)
            yield System(redis_cluster, api, stack, workers, scheduler,
                         Watchdog(kube, namespace),
                         PinnedKube(kube_connect(str(cluster.kubeconfig))))
        finally:
            stack.close()
            assert stack.leftovers() == [], "processes left behind"
            client.close()


def statuses(kube: Kube, ns: str, names: list[str]) -> dict[str, tuple[str, str, int | None]]:
    out = {}
    for name in names:
        st = session(kube, ns, name).get("status") or {}
        out[name] = (st.get("operatorStatus", ""), st.get("operatorMessage", ""),
                     held_instance(kube, ns, name))
    return out


def build_pool(system: System, kube: Kube, ns: str) -> dict[int, dict[str, str]]:
    create_appdef(kube, ns, min_instances=POOL, max_instances=POOL)
    # Built means warm too: claims take the lowest warm id first, so a pod still starting
    # (the fake kubelet's, on a loaded machine) would send a claim past it, and the
    # scale-down test's claims would not be instances 1 to 5.
    def built(k: int) -> bool:
        objects = instance_objects(kube, ns, "java", k)
        return len(objects) == 5 and deployment_ready(objects)

    system.converge(lambda: all(built(k) for k in range(1, POOL + 1)),
                    what="the pool of 10 built, its pods ready")
    return {k: _uids(kube, ns, k) for k in range(1, POOL + 1)}


def test_primary_killed_during_a_claim_storm(system: System, kube: Kube, namespace: str
                                             ) -> None:
    ns = namespace
    uids = build_pool(system, kube, ns)
    before = system.processes()
    names = [f"s{i}" for i in range(1, 21)]

    system.api.set(latency=LATENCY)
    with system.watching():
        for name in names[:10]:
            create_session(kube, ns, name, USERS[int(name[1:])])
        # The kill lands in the storm: some claims done, the others on their way.
        wait_for(lambda: any(held_instance(kube, ns, n) is not None for n in names[:10]),
                 timeout=60, interval=0.02, message="the first claim")
        old = system.redis.kill_primary()
        served_at_kill = sum(held_instance(kube, ns, n) is not None for n in names[:10])
        for name in names[10:]:  # no primary now: these claims start during the failover
            create_session(kube, ns, name, USERS[int(name[1:])])
        new = system.redis.wait_promoted(old)
    system.api.reset()

    def storm_over() -> bool:
        st = statuses(kube, ns, names)
        held = [k for status, _, k in st.values() if status == v.STATUS_HANDLED and k]
        waiting = [m for status, m, k in st.values()
                   if status == v.STATUS_HANDLING and m and k is None]
        return sorted(held) == list(range(1, POOL + 1)) and len(waiting) == 10
    system.converge(storm_over, what="10 Sessions served, 10 waiting with a reason")

    final = statuses(kube, ns, names)
    holders: dict[int, str] = {}
    for name, (status, message, k) in final.items():
        if status == v.STATUS_HANDLED:
            assert k is not None and k not in holders, f"instance {k} has two holders"
            holders[k] = name
            assert _uids(kube, ns, k) == uids[k], f"claimed instance {k} lost an object"
        else:
            assert status == v.STATUS_HANDLING and message and k is None, (name, status)
    system.assert_same_processes(before)
    stats = system.scheduler.status()["stats"]
    print(f"\nclaim storm: primary {old.port} killed with {served_at_kill} of 20 Sessions "
          f"served, replica {new.port} promoted; after it 10 served, 10 waiting "
          f"({next(m for s, m, _ in final.values() if s == v.STATUS_HANDLING)!r}); "
          f"scheduler saw {stats['redis_losses']} Redis loss(es), last resync: "
          f"{stats['last_resync_reason']}")


def test_primary_killed_during_a_scale_down(system: System, kube: Kube, namespace: str
                                            ) -> None:
    ns = namespace
    build_pool(system, kube, ns)
    names = [f"s{i}" for i in range(1, 6)]
    for name in names:
        create_session(kube, ns, name, USERS[int(name[1:])])
    system.converge(lambda: sorted(k for _, _, k in statuses(kube, ns, names).values()
                                   if k is not None) == [1, 2, 3, 4, 5], what="5 claims")
    held = {n: held_instance(kube, ns, n) for n in names}
    uids = {k: _uids(kube, ns, k) for k in range(1, 6)}
    before = system.processes()

    system.api.set(latency=LATENCY)
    with system.watching():
        patch_appdef_spec(kube, ns, "java", minInstances=3)
        # The kill lands in the scale-down: the first free instance above 3 has started going.
        wait_for(lambda: any(instance_count(kube, ns, k) < 5 for k in range(6, POOL + 1)),
                 timeout=60, interval=0.02, message="the scale-down to start")
        old = system.redis.kill_primary()
        left_at_kill = sum(instance_count(kube, ns, k) > 0 for k in range(6, POOL + 1))
        new = system.redis.wait_promoted(old)
    system.api.reset()

    system.converge(lambda: all(instance_count(kube, ns, k) == 0
                                for k in range(6, POOL + 1)),
                    what="the free instances above minInstances gone")
    assert {n: held_instance(kube, ns, n) for n in names} == held
    for name, (status, _, k) in statuses(kube, ns, names).items():
        assert status == v.STATUS_HANDLED and k == held[name]
    for k in range(1, 6):  # 4 and 5 are above minInstances: kept whole for their holders
        assert _uids(kube, ns, k) == uids[k], f"claimed instance {k} lost an object"
    system.assert_same_processes(before)
    print(f"\nscale-down: primary {old.port} killed with {left_at_kill} of 5 free instances "
          f"above minInstances still there, replica {new.port} promoted; all 5 claims kept")
