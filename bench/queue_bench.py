"""Keyed queue vs bare dramatiq, side by side on one Redis with the same worker processes.

Both cases run no-op jobs (one INCR each, to count them) on the same 2 x 8 workers
(`workers.probe` in noop mode, which declares the keyed actors and a plain `probe_raw`).
The backlog is written to a staging list while the workers idle, then RENAMEd onto
dramatiq's queue in one step, so the clock measures consumption only: no producer competes
for the CPU, and no worker starts late.

  python -m bench queue [--processes 2] [--threads 8] [--jobs 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import redis
from dramatiq.message import Message

from warmpool.queue.embedded import resolve_redis_url
from warmpool.queue.keyed import KeyedQueue
from warmpool.queue.layout import Layout
from warmpool.queue.redis_conn import connect
from warmpool.queue.scripts import Scripts
from warmpool.queue.settings import QueueSettings
from workers import probe
from workers.process import WorkerPool


def _staging(settings: QueueSettings) -> str:
    return settings.prefix + "bench:staging"


class _StagedLayout(Layout):
    """The real layout, except that new messages go to a staging list (and hash)."""

    @property
    def messages_list(self) -> str:
        return self.prefix + "bench:staging"


def _staged_queue(client: redis.Redis, settings: QueueSettings) -> KeyedQueue:
    q = KeyedQueue(client, settings)
    base = Layout.of(settings)
    q.scripts = Scripts(client, _StagedLayout(base.prefix, base.namespace, base.queue))
    return q


def _release(client: redis.Redis, settings: QueueSettings) -> None:
    """Hand the whole staged backlog to the workers at once."""
    lo = Layout.of(settings)
    staging = _staging(settings)
    if client.exists(lo.messages_list, lo.messages):
        raise RuntimeError("the real queue is not empty; cannot release the staged backlog")
    with client.pipeline(transaction=True) as pipe:
        pipe.rename(staging + ".msgs", lo.messages)
        pipe.rename(staging, lo.messages_list)
        pipe.execute()


def _wait_count(client: redis.Redis, counter: str, target: int, timeout: float) -> float:
    start = time.monotonic()
    while int(client.get(counter) or 0) < target:
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{counter} did not reach {target} in {timeout}s")
        time.sleep(0.005)
    return time.monotonic() - start


def _stage_raw(client: redis.Redis, settings: QueueSettings, n: int) -> None:
    staging = _staging(settings)
    with client.pipeline(transaction=False) as pipe:
        for i in range(n):
            rid = str(uuid.uuid4())
            msg: Message = Message(
                queue_name=settings.queue_name,
                actor_name=probe.RAW_ACTOR,
                args=(),
                kwargs={},
                options={"redis_message_id": rid},
            )
            pipe.hset(staging + ".msgs", rid, msg.encode())
            pipe.rpush(staging, rid)
            if i % 1000 == 999:
                pipe.execute()
        pipe.execute()


def _stage_keyed(q: KeyedQueue, keys: list[str]) -> None:
    q.add_many(keys)


def _timed(
    client: redis.Redis, settings: QueueSettings, counter: str, n: int, stage: Callable[[], None]
) -> float:
    client.delete(counter)
    stage()
    _release(client, settings)
    return _wait_count(client, counter, n, timeout=max(120.0, n / 50))


def _drained(client: redis.Redis, settings: QueueSettings) -> bool:
    lo = Layout.of(settings)
    with client.pipeline(transaction=False) as p:
        p.scard(lo.dirty)
        p.zcard(lo.inflight)
        p.llen(lo.messages_list)
        return not any(p.execute())


@dataclass
class PipelineResult:
    processes: int
    threads: int
    jobs: int
    rounds: int
    url: str
    raw_rates: list[float]
    keyed_rates: list[float]
    dedup_runs: int
    dedup_adds: int
    dedup_enqueued: int
    add_rate: float

    @property
    def raw(self) -> float:
        return statistics.mean(self.raw_rates)

    @property
    def keyed(self) -> float:
        return statistics.mean(self.keyed_rates)


def measure(processes: int, threads: int, jobs: int, rounds: int, url: str) -> PipelineResult:
    tag = f"bench{uuid.uuid4().hex[:8]}"
    settings = QueueSettings(redis_url=url, prefix=f"{tag}:warmpool:", namespace=f"{tag}:dramatiq")
    client = connect(url)
    pool = WorkerPool(
        settings,
        processes=processes,
        threads=threads,
        modules=("workers.probe",),
        env={"WARMPOOL_PROBE": "noop"},
    )
    raw_counter = probe.probe_key(settings, "raw")
    keyed_counter = probe.probe_key(settings, "count")
    q = _staged_queue(client, settings)
    try:
        pool.start()
        # warm-up: connections, script cache, code paths
        _timed(client, settings, raw_counter, 500, lambda: _stage_raw(client, settings, 500))
        warm = [f"instance/bench/warm/{i}" for i in range(1, 501)]
        _timed(client, settings, keyed_counter, 500, lambda: _stage_keyed(q, warm))

        raw_rates, keyed_rates = [], []
        for r in range(rounds):
            secs = _timed(
                client, settings, raw_counter, jobs, lambda: _stage_raw(client, settings, jobs)
            )
            raw_rates.append(jobs / secs)
            keys = [f"instance/bench/r{r}/{i}" for i in range(1, jobs + 1)]
            secs = _timed(client, settings, keyed_counter, jobs, lambda k=keys: _stage_keyed(q, k))
            keyed_rates.append(jobs / secs)

        # dedup while workers see nothing ("paused"), then let them at it
        client.delete(keyed_counter)
        adds = [f"instance/bench/dedup/{i % 100 + 1}" for i in range(10_000)]
        t = time.monotonic()
        results = q.add_many(adds)
        add_rate = len(adds) / (time.monotonic() - t)
        _release(client, settings)
        deadline = time.monotonic() + 60
        while not _drained(client, settings) and time.monotonic() < deadline:
            time.sleep(0.01)
        runs = int(client.get(keyed_counter) or 0)
        enqueued = sum(1 for x in results if x == "enqueued")
    finally:
        pool.stop(timeout=30)
        batch = list(client.scan_iter(match=f"{tag}:*", count=1000))
        for i in range(0, len(batch), 500):
            client.delete(*batch[i : i + 500])
    return PipelineResult(processes, threads, jobs, rounds, url, raw_rates, keyed_rates, runs,
                          len(adds), enqueued, add_rate)


def lines_for(m: PipelineResult) -> list[str]:
    raw, keyed = m.raw, m.keyed
    w = 44
    return [
        f"queue bench: {m.processes} processes x {m.threads} threads, {m.jobs} no-op jobs per "
        f"case, {m.rounds} rounds, redis {m.url}",
        f"| {'case':<{w}} | {'result':>22} | {'goal':>10} |",
        f"|{'-' * (w + 2)}|{'-' * 24}|{'-' * 12}|",
        f"| {'raw dramatiq no-op actor':<{w}} | {raw:>16,.0f} jobs/s | {'':>10} |",
        f"| {'keyed queue no-op (lease+fence per job)':<{w}} | {keyed:>16,.0f} jobs/s | "
        f"{'':>10} |",
        f"| {'ratio keyed / raw':<{w}} | {keyed / raw:>22.2f} | {'>= 0.7':>10} |",
        f"| {'dedup: 10,000 adds over 100 keys, paused':<{w}} | {m.dedup_runs:>17} runs | "
        f"{'100':>10} |",
        f"| {'  adds enqueued / deduplicated':<{w}} | "
        f"{f'{m.dedup_enqueued} / {m.dedup_adds - m.dedup_enqueued}':>22} | {'':>10} |",
        f"| {'  add rate (add_many, one client)':<{w}} | {m.add_rate:>16,.0f} adds/s | "
        f"{'':>10} |",
        "per round raw: "
        + ", ".join(f"{x:,.0f}" for x in m.raw_rates)
        + "; keyed: "
        + ", ".join(f"{x:,.0f}" for x in m.keyed_rates),
    ]


def run(processes: int, threads: int, jobs: int, rounds: int, url: str) -> list[str]:
    return lines_for(measure(processes, threads, jobs, rounds, url))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench queue", description=__doc__)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args(argv)
    url = args.redis_url or resolve_redis_url()
    for line in run(args.processes, args.threads, args.jobs, args.rounds, url):
        print(line)
    return 0
