"""A worker process cut off from Redis in the middle of a claim (issue #19, part 2).

Worker process A reaches Redis through a TCP proxy the test severs (`warmpool.testing.
tcpproxy`) and the API server through a proxy port of its own (`ApiProxy.add_client`), whose
`hold` keeps A's deciding write -- the PATCH of the external Service that makes the Session
the instance's holder -- from the server: A has read, decided and sent, and waits. Then:

1. A's link to Redis is severed: it can renew nothing, its leases (Session and instance)
   lapse in Redis and in its own clock;
2. worker processes B (started once A is cut off) recover the key once A's lease is gone and
   claim the instance themselves, under fresh leases with higher fences;
3. A's held write is let go: the API server refuses it (409: the Service's resourceVersion
   moved with B's write), and nothing A wrote late is left on the objects;
4. the link heals: A carries on as the same process, and the pool converges with every
   invariant holding, polled all along.

Nothing here waits for time: each step waits for the condition it needs (held request,
lapsed lease, the Session served, the answer to the late write).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.integration.test_pool_concurrency import Watchdog, _uids
from tests.pool_world import held_instance, session
from tests.redis_server import isolated
from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo
from warmpool.keys import PoolKey, SessionKey
from warmpool.kube.api import Kube
from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.queue.keyed import KeyedQueue
from warmpool.queue.layout import Layout
from warmpool.queue.lease import fence_of, holder_of
from warmpool.queue.settings import QueueSettings
from warmpool.testing.apiproxy import ApiProxy
from warmpool.testing.tcpproxy import TcpProxy
from warmpool.testing.world import USERS, create_appdef, create_session
from workers.process import WorkerPool

pytestmark = pytest.mark.redis


CUT_OFF = "cut-off-worker"  # the API proxy's client name for worker A


@pytest.fixture
def settings(redis_url: str, redis_client: redis.Redis) -> Iterator[QueueSettings]:
    # Short leases: A's lapse within seconds of the cut (as test_pool_concurrency's).
    with isolated(redis_url, redis_client, lease_ttl=2.0, heartbeat_timeout=2.0,
                  recovery_period=0.25, drain_timeout=5) as s:
        yield s


def lease_of(client: redis.Redis, settings: QueueSettings, key: str) -> str | None:
    raw = client.get(Layout.of(settings).lease_prefix + key)
    return raw.decode() if isinstance(raw, bytes) else raw


def pid_of(lease: str | None) -> int | None:
    """The process holding a lease ("<fence>|<host>:<pid>:<thread>:<nonce>")."""
    if lease is None:
        return None
    return int(holder_of(lease).split(":")[1])


def fence_on(obj: dict[str, Any]) -> int:
    return int(((obj["metadata"].get("annotations") or {}).get(v.ANNOTATION_FENCE)) or 0)


def test_a_worker_cut_off_from_redis_mid_claim_loses_its_lease_and_its_late_write_is_refused(
    cluster: ClusterInfo, kube: Kube, namespace: str, settings: QueueSettings,
    redis_client: redis.Redis, tmp_path: Path,
) -> None:
    ns, dog = namespace, Watchdog(kube, namespace)
    conn = redis_client.connection_pool.connection_kwargs
    upstream = (str(conn.get("host", "127.0.0.1")), int(conn.get("port", 6379)))
    with ApiProxy(upstream=cluster.server, token=cluster.token,
                  kubeconfig_path=tmp_path / "kubeconfig-main") as api, \
            TcpProxy(upstream) as link:
        a_kubeconfig = api.add_client(CUT_OFF, tmp_path / "kubeconfig-cut-off")
        a_settings = settings.replace(
            redis_url=f"redis://127.0.0.1:{link.port}/{int(conn.get('db', 0))}")
        a = WorkerPool(a_settings, processes=1, threads=2,
                       env={"KUBECONFIG": str(a_kubeconfig)})
        b = WorkerPool(settings, processes=2, threads=2,
                       env={"KUBECONFIG": str(cluster.kubeconfig)})
        queue = KeyedQueue(redis_client, settings)
        try:
            a.start()
            (a_pid,) = a.pids
            ad = create_appdef(kube, ns, min_instances=2)
            queue.add(str(PoolKey(ns, "java")))
            dog.converge()  # A alone built the pool
            before = {k: _uids(kube, ns, k) for k in (1, 2)}
            ext_name = naming.create_name(ad["spec"]["name"], ad["metadata"]["uid"], 1)
            ext_before = kube.get("v1", "Service", ns, ext_name)
            assert ext_before is not None

            # A claims: its deciding write on instance 1's external Service is held.
            hold = api.hold(CUT_OFF, method="PATCH", path=f"/services/{ext_name}")
            create_session(kube, ns, "s1", USERS[1])
            skey, ikey = str(SessionKey(ns, "s1")), f"instance/{ns}/java/1"
            queue.add(skey)
            (late,) = hold.wait_held(1, timeout=60)
            late_fence = fence_on(late.json())
            a_lease = lease_of(redis_client, settings, ikey)
            assert pid_of(lease_of(redis_client, settings, skey)) == a_pid
            assert pid_of(a_lease) == a_pid and a_lease is not None
            assert fence_of(a_lease) == late_fence  # the held write carries A's fence
            assert late.json()["metadata"]["ownerReferences"][-1]["name"] == "s1"

            # The partition, at once: A's held call gives up within its lease TTL (the jobs'
            # API calls are bounded by it), so A is cut off while the call still waits. A
            # reaches Redis no more; its leases lapse, B takes the key and serves the Session
            # under fresh leases.
            assert link.sever() >= 1
            b.start()
            wait_for(lambda: pid_of(lease_of(redis_client, settings, skey)) != a_pid
                     and pid_of(lease_of(redis_client, settings, ikey)) != a_pid,
                     timeout=30, interval=0.05, message="A's leases to lapse in Redis")

            def served_by_b() -> bool:
                dog.quiet()  # poll the always-invariants meanwhile
                st = (session(kube, ns, "s1").get("status") or {}).get("operatorStatus")
                return st == v.STATUS_HANDLED and held_instance(kube, ns, "s1") == 1
            wait_for(served_by_b, timeout=60, interval=0.1,
                     message="the other workers to serve s1")
            ext_b = kube.get("v1", "Service", ns, ext_name)
            assert ext_b is not None
            b_fence = fence_on(ext_b)
            assert b_fence > late_fence, "B's writes carry a higher fence than A's"
            assert ext_b["metadata"]["resourceVersion"] != ext_before["metadata"][
                "resourceVersion"]

            # A's late write reaches the server now, and is refused.
            hold.release()
            (answered,) = hold.wait_answered(1, timeout=30)
            assert answered.status == 409, f"A's late deciding write was answered " \
                f"{answered.status}, not refused"
            ext_after = kube.get("v1", "Service", ns, ext_name)
            assert ext_after is not None and fence_on(ext_after) >= b_fence
            assert [r["name"] for r in ext_after["metadata"]["ownerReferences"]
                    if r["kind"] == v.SESSION_KIND] == ["s1"]

            # The link heals; A carries on, the same process, and everything converges.
            link.heal()
            dog.converge(timeout=90)
            assert held_instance(kube, ns, "s1") == 1
            for k in (1, 2):
                assert _uids(kube, ns, k) == before[k], f"an object of instance {k} was " \
                    "deleted and recreated"
            assert a.pids == [a_pid] and not a.dead(), "the cut-off worker exited"
            assert a.restarts == 0 and not b.dead()
            final = kube.get("v1", "Service", ns, ext_name)
            assert final is not None and fence_on(final) > late_fence
            print(f"\npartition: A (pid {a_pid}) held fence {late_fence}; B claimed under "
                  f"fence {b_fence}; A's late write answered {answered.status}; Redis link "
                  f"{link.stats()}")
        finally:
            api.release_holds()  # a failing test leaves no request of A parked
            a.stop(timeout=15)
            b.stop(timeout=15)


def test_the_messages_of_a_fetch_whose_reply_was_lost_still_run(
    settings: QueueSettings, redis_client: redis.Redis,
) -> None:
    """What a failover (or any dying link) can do between Redis and a consumer: the fetch
    script ran on the server (its messages moved to this worker's ack set) and its answer
    never arrived. The consumer reconnects and fetches again; every key must still run."""
    from tests.integration.test_queue_workers import read_log, runs_per_key
    from workers import probe, runtime

    conn = redis_client.connection_pool.connection_kwargs
    upstream = (str(conn.get("host", "127.0.0.1")), int(conn.get("port", 6379)))
    queue = KeyedQueue(redis_client, settings)
    keys = [f"instance/ns/app/{i}" for i in range(1, 7)]
    with TcpProxy(upstream) as link, runtime.using(probe.HANDLERS):
        via = settings.replace(redis_url=f"redis://127.0.0.1:{link.port}/"
                               f"{int(conn.get('db', 0))}")
        link.lose_reply(b"instance/ns/app/")  # the first fetch's answer: its bodies
        for k in keys:
            queue.add(k)
        running = runtime.start_worker(via, threads=2)
        try:
            wait_for(lambda: link.stats().get("lost_replies") == 1, timeout=30,
                     message="the consumer's first fetch, answered and lost")
            wait_for(lambda: runs_per_key(read_log(redis_client, settings))
                     == {k: 1 for k in keys}, timeout=15, interval=0.1,
                     message=lambda: f"every key to run once: "
                     f"{dict(runs_per_key(read_log(redis_client, settings)))}")
        finally:
            running.stop(timeout=10)
