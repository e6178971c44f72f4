"""Worker metrics across processes (prometheus-client's multiprocess mode) on a real Redis:
one endpoint per host sums its worker processes, and a SIGKILLed worker's running jobs stop
counting as soon as it is reaped, whether the test (`WorkerPool.kill` / `restart`) or the
`warmpool worker` supervisor restarts it. Jobs are `workers.probe` runs held open on demand.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from metrics.exposition import MetricsServer, host_registry
from tests.redis_server import isolated
from tests.waiting import wait_for
from warmpool.queue import Inspector, KeyedQueue, QueueSettings
from workers import probe
from workers.process import WorkerPool

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("instance", "session", "pool")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def total(samples: Samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def negatives(samples: Samples) -> list[tuple[str, float]]:
    return [(n, v) for (n, _), v in samples.items() if n.startswith("warmpool_") and v < 0]


def idle(samples: Samples) -> bool:
    return all(total(samples, f"warmpool_workqueue_{g}") == 0
               for g in ("in_flight", "unfinished_work_seconds",
                         "longest_running_processor_seconds"))


@pytest.fixture
def settings(redis_url: str, redis_client: redis.Redis) -> Iterator[QueueSettings]:
    # Short lease and heartbeat: a SIGKILLed worker's keys come back within seconds.
    with isolated(redis_url, redis_client, lease_ttl=2.0, heartbeat_timeout=2.0,
                  recovery_period=0.25, drain_timeout=5) as s:
        yield s


def hold(client: redis.Redis, settings: QueueSettings, keys: list[str]) -> None:
    """Make each key's next probe run hold its lease until released (or 60 s)."""
    client.hset(probe.probe_key(settings, "hold"), mapping=dict.fromkeys(keys, 60))
    KeyedQueue(client, settings).add_many(keys)


def holding(client: redis.Redis, settings: QueueSettings) -> dict[str, int]:
    """key -> pid of the worker process holding it open."""
    raw = client.lrange(probe.probe_key(settings, "holding"), 0, -1)
    return {k: pid for k, pid in (json.loads(r) for r in raw)}


def release_all(client: redis.Redis, settings: QueueSettings, keys: list[str]) -> None:
    client.sadd(probe.probe_key(settings, "release"), *keys)


def quiet(client: redis.Redis, settings: QueueSettings) -> bool:
    s = Inspector(client, settings).stats()
    return s.waiting == 0 and s.running == 0 and s.delayed == 0


def test_sigkilled_and_restarted_worker_leaves_no_stale_or_negative_gauges(
    settings: QueueSettings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    pool = WorkerPool(settings, processes=2, threads=2, modules=("workers.probe",),
                      env={"WARMPOOL_PROBE": "log"}, metrics_dir=tmp_path / "mp")
    (tmp_path / "mp").mkdir()
    (tmp_path / "mp" / "counter_1.db").write_bytes(b"stale")  # a file from an earlier run
    server = MetricsServer(host_registry(tmp_path / "mp", pool), "127.0.0.1", 0).start()
    # Each process prefetches twice its threads (4 messages) and runs 2 at a time: 8 keys
    # give each process two held runs.
    keys = [f"pool/mt/app-{i}" for i in range(8)]
    try:
        pool.start()
        assert not (tmp_path / "mp" / "counter_1.db").exists(), "the directory was not emptied"
        hold(redis_client, settings, keys)
        wait_for(lambda: sorted(Counter(holding(redis_client, settings).values()).values())
                 == [2, 2], timeout=30, message="four held runs, two per worker process")
        got = wait_for(lambda: (s := scrape(server.url))
                       and total(s, "warmpool_workqueue_in_flight") == 4 and s, timeout=10,
                       message="the host endpoint to count four runs")
        assert got[("warmpool_workqueue_in_flight", (("kind", "pool"),))] == 4
        assert total(got, "warmpool_worker_processes") == 2

        # Give the runs a second of age, then SIGKILL the process holding the first key.
        wait_for(lambda: scrape(server.url)[
            ("warmpool_workqueue_longest_running_processor_seconds", (("kind", "pool"),))] >= 1,
            timeout=10, message="the running-work gauges to grow")
        victim_pid = holding(redis_client, settings)[keys[0]]
        killed = [k for k, pid in holding(redis_client, settings).items() if pid == victim_pid]
        i = pool.index_of(victim_pid)
        pool.kill(i)
        after_kill = scrape(server.url)
        # Its runs stopped counting at once (the parent reaped it); nothing went negative.
        assert total(after_kill, "warmpool_workqueue_in_flight") == 4 - len(killed)
        assert negatives(after_kill) == []
        assert total(after_kill, "warmpool_worker_processes") == 1
        assert not list((tmp_path / "mp").glob(f"gauge_live*_{victim_pid}.db"))

        pool.restart(i)
        # The killed runs' keys come back after the lease TTL (crash recovery) and run again
        # without holding (`hold` is consumed by the first run); release the others.
        release_all(redis_client, settings, keys)
        wait_for(lambda: quiet(redis_client, settings), timeout=60,
                 message="every key to finish")
        final = wait_for(lambda: (s := scrape(server.url)) and idle(s) and s, timeout=10,
                         message="in-flight and unfinished-work gauges back to 0")
        assert negatives(final) == []
        assert total(final, "warmpool_worker_restarts_total") == 1
        assert total(final, "warmpool_worker_processes") == 2
        # Counters survive the killed process (its files stay): every key ran at least once,
        # and the killed runs were taken back as expired leases.
        assert total(final, "warmpool_workqueue_work_duration_seconds_count") >= 8
        assert total(final, "warmpool_lease_expired_total") >= len(killed)
        assert total(final, "warmpool_workqueue_dead_lettered_total") == 0
    finally:
        release_all(redis_client, settings, keys)
        pool.stop(timeout=20)
        server.stop()


def test_worker_command_serves_the_host_and_reaps_a_crashed_child(
    settings: QueueSettings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """`warmpool worker`: the supervisor restarts a SIGKILLed child and its gauges go."""
    assert settings.redis_url
    mp = tmp_path / "mp"
    env = {**os.environ, "WARMPOOL_REDIS_URL": settings.redis_url,
           "WARMPOOL_QUEUE_PREFIX": settings.prefix,
           "WARMPOOL_QUEUE_NAMESPACE": settings.namespace,
           "WARMPOOL_QUEUE_LEASE_TTL": "2", "WARMPOOL_QUEUE_HEARTBEAT_TIMEOUT": "2",
           "WARMPOOL_QUEUE_RECOVERY_PERIOD": "0.25", "WARMPOOL_QUEUE_DRAIN_TIMEOUT": "5",
           "WARMPOOL_PROBE": "log", "PROMETHEUS_MULTIPROC_DIR": str(mp),
           "PYTHONPATH": str(ROOT)}
    log = (tmp_path / "worker.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "warmpool.cli", "worker", "-p", "2", "-t", "2",
         "-m", "workers.probe", "--metrics-host", "127.0.0.1", "--metrics-port", "0"],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    keys = [f"pool/mc/app-{i}" for i in range(2)]
    try:
        def url() -> str | None:
            text = (tmp_path / "worker.log").read_text()
            for word in text.split():
                if word.startswith("metrics=http://"):
                    return word.removeprefix("metrics=")
            assert proc.poll() is None, text
            return None

        metrics_url = wait_for(url, timeout=60, message="the worker command's metrics URL")
        hold(redis_client, settings, keys)
        wait_for(lambda: len(holding(redis_client, settings)) == 2, timeout=30,
                 message="two held runs")
        wait_for(lambda: total(scrape(metrics_url), "warmpool_workqueue_in_flight") == 2,
                 timeout=10, message="two runs counted")
        victim = holding(redis_client, settings)[keys[0]]
        held_by_victim = sum(1 for pid in holding(redis_client, settings).values()
                             if pid == victim)
        os.kill(victim, signal.SIGKILL)
        restarted = wait_for(
            lambda: (s := scrape(metrics_url))
            and total(s, "warmpool_worker_restarts_total") == 1
            and total(s, "warmpool_worker_processes") == 2 and s,
            timeout=30, message="the supervisor to restart the killed child")
        assert total(restarted, "warmpool_workqueue_in_flight") <= 2 - held_by_victim
        assert negatives(restarted) == []
        assert not list(mp.glob(f"gauge_live*_{victim}.db"))
        release_all(redis_client, settings, keys)
        wait_for(lambda: quiet(redis_client, settings), timeout=60, message="keys finished")
        final = wait_for(lambda: (s := scrape(metrics_url)) and idle(s) and s, timeout=10,
                         message="gauges back to 0")
        assert negatives(final) == []
    finally:
        release_all(redis_client, settings, keys)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
    assert proc.returncode == 0, (tmp_path / "worker.log").read_text()
