"""The queue through Redis Sentinel: three real Sentinels, a primary and a replica (the
embedded valkey binary), and a primary killed with SIGKILL.

What must hold: every client warmpool makes from a `redis+sentinel://` URL (the keyed queue
and its leases, the dramatiq broker, the metrics collector, the CLI) finds the primary through
the Sentinels, and the very same client objects carry on against the promoted replica after a
failover: no re-created client, no process restart; a running dramatiq worker finishes the
job it held across the failover and runs every key exactly once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from metrics.collectors import ClusterCollector
from tests.cli_run import assert_one_line_error, clean_env, run, run_json
from tests.integration.sentinel_cluster import SentinelCluster, sentinel_cluster
from tests.integration.test_queue_workers import (
    assert_never_concurrent,
    hold,
    read_log,
    release,
    runs_per_key,
    wait_holding,
    wait_quiescent,
)
from tests.waiting import wait_for
from warmpool.queue import AddResult, KeyedQueue
from warmpool.queue.broker import build_broker, keyed_middleware
from warmpool.queue.jobs import JobContext, Jobs
from warmpool.queue.redis_conn import connect
from warmpool.queue.settings import QueueSettings
from workers import probe, runtime
from workers.health import redis_ping
from workers.runtime import start_worker

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> Iterator[SentinelCluster]:
    with sentinel_cluster(replicas=1, sentinels=3) as c:
        yield c


def _settings(url: str) -> QueueSettings:
    tag = f"t{uuid.uuid4().hex[:10]}"
    return QueueSettings(redis_url=url, prefix=f"{tag}:warmpool:", namespace=f"{tag}:dramatiq")


def _run_once(jobs: Jobs, client: redis.Redis, key: str) -> str:
    """Take the next delivery of `key` as a worker does and finish it: the outcome."""
    rid = client.lpop(jobs.queue.layout.messages_list)
    assert rid is not None, f"no message for {key!r}"
    ctx = jobs.begin(key, ack=("", rid.decode()))
    assert isinstance(ctx, JobContext), ctx
    return jobs.finish(ctx).outcome


def _primary_port(client: redis.Redis) -> int:
    return int(client.connection_pool.get_master_address()[1])  # type: ignore[attr-defined]


def test_same_clients_carry_on_after_the_primary_is_killed(cluster: SentinelCluster) -> None:
    settings = _settings(cluster.url)
    client = connect(cluster.url)
    jobs = Jobs(client, settings, router=lambda k: "job")
    broker = build_broker(settings)
    broker_jobs = keyed_middleware(broker).jobs
    collector = ClusterCollector(client, settings)
    old_primary = cluster.primary_port()
    assert _primary_port(client) == old_primary

    # Before: add (deduplicated), claim, done; a secondary lease with its fence.
    assert jobs.queue.add("instance/ns/app/1") == "enqueued"
    assert jobs.queue.add("instance/ns/app/1") != "enqueued"  # folded into the waiting one
    assert _run_once(jobs, client, "instance/ns/app/1") == "success"
    held = jobs.acquire("instance/ns/app/9")
    assert held is not None
    assert jobs.acquire("instance/ns/app/9") is None  # a second holder is refused
    assert jobs.queue.add("instance/ns/app/2") == "enqueued"  # waits across the failover
    assert broker_jobs.queue.add("instance/ns/app/3") == "enqueued"
    # Asynchronous replication may lose the last writes; this test is about reconnecting,
    # so let the replica catch up first (the loss case is the epoch's: README).
    assert client.execute_command("WAIT", 1, 5000) == 1

    new = cluster.fail_over_by_kill()
    assert new.port != old_primary

    # After: the same objects, no new client anywhere.
    assert _run_once(jobs, client, "instance/ns/app/2") == "success"
    assert _primary_port(client) == new.port
    assert jobs.acquire("instance/ns/app/9") is None  # the lease survived the failover
    assert jobs.release(held).outcome != "lost"
    again = jobs.acquire("instance/ns/app/9")
    assert again is not None and again.fence > held.fence  # fences only grow
    jobs.release(again)
    assert jobs.queue.add("instance/ns/app/4") == "enqueued"
    assert _run_once(jobs, client, "instance/ns/app/3") == "success"  # added through the broker
    assert _run_once(jobs, client, "instance/ns/app/4") == "success"
    # the broker's own client (dramatiq's enqueue path) and the metrics collector
    assert broker.client.ping()
    assert _primary_port(broker.client) == new.port
    up = next(m for m in collector.collect() if m.name == "warmpool_metrics_redis_up")
    assert up.samples[0].value == 1
    # the CLI, a fresh process, finds the new primary through the Sentinels by itself
    doc = run_json(clean_env(WARMPOOL_REDIS_URL=cluster.url, WARMPOOL_QUEUE_PREFIX=settings.prefix,
                             WARMPOOL_QUEUE_NAMESPACE=settings.namespace), "queue", "list")
    assert doc["redis"] == cluster.url
    assert doc["queues"][0]["in_flight"] == 0
    broker.close()
    client.close()


def test_the_workers_readiness_ping_passes_on_a_sentinel_url(cluster: SentinelCluster) -> None:
    """What the worker supervisor's /readyz asks (workers/health.py), on a Sentinel URL."""
    assert redis_ping(cluster.url)()


def test_the_cli_names_a_service_no_sentinel_monitors(cluster: SentinelCluster) -> None:
    """Sentinels that answer but know no such service: one line saying so, exit 4."""
    url = cluster.url.replace(f"/{cluster.service}/", "/not-monitored/").replace(
        "redis+sentinel://", "redis+sentinel://:pw@")
    proc = run(clean_env(WARMPOOL_REDIS_URL=url), "queue", "list", code=4)
    assert_one_line_error(proc, "no Sentinel of", "names a primary", "not-monitored")
    assert ":pw@" not in proc.stderr


def test_a_running_worker_carries_its_jobs_over_a_failover() -> None:
    """A dramatiq worker (4 threads, the probe handlers) holds a key while its primary is
    SIGKILLed: that job finishes on the new primary, keys added before and after all run
    exactly once, never two runs of a key at a time, and the worker is never restarted."""
    with sentinel_cluster() as c, runtime.using(probe.HANDLERS):
        settings = _settings(c.url)
        client = connect(c.url)
        q = KeyedQueue(client, settings)
        running = start_worker(settings, threads=4)
        try:
            threads = list(running.worker.workers)
            before = [f"instance/ns/app/{i}" for i in range(1, 11)]
            held = before[0]
            hold(client, settings, held)
            assert [q.add(k) for k in before] == [AddResult.ENQUEUED] * 10
            assert wait_holding(client, settings)[0] == held
            wait_for(lambda: runs_per_key(read_log(client, settings)).total() == 9,
                     timeout=30, interval=0.05, message="the other keys to run")
            assert client.execute_command("WAIT", 1, 5000) == 1

            c.fail_over_by_kill()

            after = [f"instance/ns/app/{i}" for i in range(11, 21)]
            assert [q.add(k) for k in after] == [AddResult.ENQUEUED] * 10
            release(client, settings, held)
            wait_quiescent(client, settings)
            records = read_log(client, settings)
            assert runs_per_key(records) == {k: 1 for k in before + after}
            assert_never_concurrent(records)
            assert running.worker.workers == threads  # the same worker threads throughout
            assert all(t.is_alive() for t in threads)
        finally:
            running.stop(timeout=10)
            client.close()
