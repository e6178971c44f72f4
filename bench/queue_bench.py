"""Keyed queue vs bare dramatiq, side by side on one Redis with the same worker processes.

Both cases run no-op jobs (one INCR each, to count them) on the same 2 x 8 workers
(`workers.probe` in noop mode, which declares the keyed actors and a plain `probe_raw`).
The backlog is written to a staging list while the workers idle, then RENAMEd onto
dramatiq's queue in one step, so the clock measures consumption only: no producer competes
for the CPU, and no worker starts late.

  python -m bench queue [--processes 2] [--threads 8] [--jobs 20000] [--rounds 3]
      [--profile DIR]

Each case also reports the CPU it cost, per 1,000 jobs, in the worker processes and in Redis:
on a 2-core machine that total, not Redis latency, is what bounds the rate.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from dramatiq.message import Message

from bench.machine import cpu_seconds
from bench.profiling import Profiler, summarize
from warmpool.harness import System
from warmpool.queue.embedded import resolve_redis_url
from warmpool.queue.inspect import Inspector
from warmpool.queue.keyed import KeyedQueue
from warmpool.queue.layout import Layout
from warmpool.queue.scripts import Scripts
from warmpool.queue.settings import QueueSettings
from workers import probe


def _staging(settings: QueueSettings) -> str:
    return settings.prefix + "bench:staging"


class _StagedLayout(Layout):
    """The real layout, except that new messages go to a staging list (and hash)."""

    @property
    def messages_list(self) -> str:
        return self.prefix + "bench:staging"

    @property
    def messages(self) -> str:
        # The scripts take the hash's name from the layout too (since the Lua moved to files).
        return self.prefix + "bench:staging.msgs"


def _staged_queue(client: redis.Redis, settings: QueueSettings) -> KeyedQueue:
    q = KeyedQueue(client, settings)
    base = Layout.of(settings)
    q.scripts = Scripts(client, _StagedLayout(base.prefix, base.namespace, base.queue))
    return q


def _release(client: redis.Redis, settings: QueueSettings) -> None:
    """Hand the whole staged backlog to the workers at once."""
    lo = Layout.of(settings)
    staging = _staging(settings)
    # The previous case's count can reach its total a moment before its last acks have
    # removed their messages: wait for those, not for new work.
    deadline = time.monotonic() + 30
    while client.exists(lo.messages_list, lo.messages):
        if time.monotonic() > deadline:
            raise RuntimeError("the real queue is not empty; cannot release the staged backlog")
        time.sleep(0.05)
    with client.pipeline(transaction=True) as pipe:
        pipe.rename(staging + ".msgs", lo.messages)
        pipe.rename(staging, lo.messages_list)
        # as the scripts ring for what they enqueue: idle workers wait for it (the doorbell)
        pipe.publish(lo.doorbell_channel, lo.messages_list)
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


def _redis_cpu(client: redis.Redis) -> float:
    """CPU seconds the Redis server has used (user + system, its main thread included)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


@dataclass
class Spent:
    """Where one timed case's CPU went: what a 2-core machine runs out of first."""

    seconds: float
    workers_cpu: float
    redis_cpu: float


def _timed(
    client: redis.Redis, settings: QueueSettings, counter: str, n: int, stage: Callable[[], None],
    pids: list[int] | None = None,
) -> Spent:
    client.delete(counter)
    stage()
    workers0, redis0 = sum(map(cpu_seconds, pids or [])), _redis_cpu(client)
    _release(client, settings)
    secs = _wait_count(client, counter, n, timeout=max(120.0, n / 50))
    return Spent(secs, sum(map(cpu_seconds, pids or [])) - workers0,
                 _redis_cpu(client) - redis0)


def _drained(inspector: Inspector) -> bool:
    """No key waiting, running or delayed, and no message left for a worker to fetch."""
    stats = inspector.stats()
    return stats.idle and stats.messages == 0


@dataclass
class PipelineResult:
    processes: int
    threads: int
    jobs: int
    rounds: int
    url: str
    raw_rates: list[float]
    keyed_rates: list[float]
    raw_spent: list[Spent]
    keyed_spent: list[Spent]
    dedup_runs: int
    dedup_adds: int
    dedup_enqueued: int
    add_rate: float
    profile: list[str]

    @property
    def raw(self) -> float:
        return statistics.mean(self.raw_rates)

    @property
    def keyed(self) -> float:
        return statistics.mean(self.keyed_rates)


def measure(processes: int, threads: int, jobs: int, rounds: int, url: str,
            profile_dir: Path | None = None) -> PipelineResult:
    # Workers on a queue of the run's own, no cluster. No orphan audit while a backlog is
    # staged: its keys' messages are not in the real queue yet, so the audit would "repair"
    # them with duplicates.
    system = System(None, redis=url, schedulers=0, workers=processes, threads=threads,
                    worker_modules=("workers.probe",), worker_env={"WARMPOOL_PROBE": "noop"},
                    queue=QueueSettings(audit_period=3600.0),
                    tag=f"bench{uuid.uuid4().hex[:8]}")
    try:
        system.start()
        settings, client = system.settings, system.client
        raw_counter = probe.probe_key(settings, "raw")
        keyed_counter = probe.probe_key(settings, "count")
        q = _staged_queue(client, settings)
        # warm-up: connections, script cache, code paths
        _timed(client, settings, raw_counter, 500, lambda: _stage_raw(client, settings, 500))
        warm = [f"instance/bench/warm/{i}" for i in range(1, 501)]
        _timed(client, settings, keyed_counter, 500, lambda: _stage_keyed(q, warm))

        pids = [pid for pid in system.workers.pids if pid is not None]
        raw_spent, keyed_spent = [], []
        for r in range(rounds):
            raw_spent.append(_timed(client, settings, raw_counter, jobs,
                                    lambda: _stage_raw(client, settings, jobs), pids))
            keys = [f"instance/bench/r{r}/{i}" for i in range(1, jobs + 1)]
            keyed_spent.append(_timed(client, settings, keyed_counter, jobs,
                                      functools.partial(_stage_keyed, q, keys), pids))
        raw_rates = [jobs / x.seconds for x in raw_spent]
        keyed_rates = [jobs / x.seconds for x in keyed_spent]
        profile: list[str] = []
        if profile_dir is not None:  # one more round of each, sampled (not in the rates)
            for label, counter, stage in (
                ("raw", raw_counter, lambda: _stage_raw(client, settings, jobs)),
                ("keyed", keyed_counter, lambda: _stage_keyed(
                    q, [f"instance/bench/p/{i}" for i in range(1, jobs + 1)])),
            ):
                prof = Profiler(pids, profile_dir, f"pipeline-{label}")
                _timed(client, settings, counter, jobs, stage, pids)
                profile += [f"pipeline, {label} no-op jobs, worker processes (py-spy --gil):",
                            *summarize(prof.stop(), top=12)]

        # dedup while workers see nothing ("paused"), then let them at it
        client.delete(keyed_counter)
        adds = [f"instance/bench/dedup/{i % 100 + 1}" for i in range(10_000)]
        t = time.monotonic()
        results = q.add_many(adds)
        add_rate = len(adds) / (time.monotonic() - t)
        _release(client, settings)
        deadline = time.monotonic() + 60
        while not _drained(system.inspector) and time.monotonic() < deadline:
            time.sleep(0.01)
        runs = int(client.get(keyed_counter) or 0)
        enqueued = sum(1 for x in results if x == "enqueued")
    finally:
        system.stop()
    return PipelineResult(processes, threads, jobs, rounds, url, raw_rates, keyed_rates,
                          raw_spent, keyed_spent, runs, len(adds), enqueued, add_rate, profile)


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
        *cpu_lines(m),
    ]


def cpu_lines(m: PipelineResult) -> list[str]:
    """CPU per 1,000 jobs, workers and Redis apart: the machine's cores are the budget."""
    def per_k(spent: list[Spent]) -> tuple[float, float]:
        n = m.jobs * len(spent) / 1000
        return (sum(x.workers_cpu for x in spent) / n, sum(x.redis_cpu for x in spent) / n)
    rw, rr = per_k(m.raw_spent)
    kw, kr = per_k(m.keyed_spent)
    return [f"CPU per 1,000 jobs: raw {rw:.2f} s in workers + {rr:.2f} s in Redis = "
            f"{rw + rr:.2f} s; keyed {kw:.2f} s + {kr:.2f} s = {kw + kr:.2f} s "
            f"(keyed / raw: workers {kw / rw:.2f}, Redis {kr / rr:.2f})"]


def run(processes: int, threads: int, jobs: int, rounds: int, url: str,
        profile_dir: Path | None = None) -> list[str]:
    m = measure(processes, threads, jobs, rounds, url, profile_dir)
    return [*lines_for(m), *m.profile]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench queue", description=__doc__)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="after the timed rounds, one py-spy sampled round of each case")
    args = parser.parse_args(argv)
    url = args.redis_url or resolve_redis_url()
    for line in run(args.processes, args.threads, args.jobs, args.rounds, url, args.profile):
        print(line)
    return 0
