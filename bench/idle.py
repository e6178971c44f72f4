"""Idle workers: the doorbell vs the old 20 ms polling, side by side in one run (issue #28, 4).

For each mode, the same 2 x 8 worker processes (`workers.probe` in log mode) on the same Redis:
  * idle: nothing queued for `--idle` seconds; Redis commands per second (INFO stats
    `total_commands_processed`, the bench's own few INFO calls included) and CPU seconds of
    the worker processes (/proc) and of redis-server (INFO cpu);
  * latency: `--adds` keys added one at a time to the idle queue, 50-150 ms apart (random,
    so no add is in phase with a poll); add (client clock just before the call) -> job start
    (the probe's `time.time()` as it starts), p50 / p99; then as many delayed adds
    (`add_after`, 50 ms): ready time -> job start, which is the promoter's part.
Polling is the doorbell switched off (`idle_poll_timeout` = `poll_timeout`), which is
exactly the code path before it.

  python -m bench idle [--processes 2] [--threads 8] [--idle 20] [--adds 200]
      [--redis-url URL]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from bench.machine import cpu_seconds
from bench.report import Row, verdict
from warmpool.harness import System
from warmpool.queue.embedded import resolve_redis_url
from warmpool.queue.keyed import KeyedQueue
from warmpool.queue.settings import QueueSettings
from workers import probe

MODES: dict[str, QueueSettings] = {
    "doorbell": QueueSettings(idle_poll_timeout=1.0),
    "polling": QueueSettings(idle_poll_timeout=QueueSettings().poll_timeout),
}
DELAY = 0.05  # the delayed adds' delay


@dataclass
class IdleResult:
    """One mode's measurements (seconds and counts; latencies in seconds)."""

    mode: str
    window: float = 0.0
    commands: int = 0
    workers_cpu: float = 0.0
    redis_cpu: float = 0.0
    latencies: list[float] = field(default_factory=list)
    delayed_latencies: list[float] = field(default_factory=list)

    @property
    def commands_per_s(self) -> float:
        return self.commands / self.window if self.window else float("nan")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def _ms(values: list[float]) -> str:
    return (f"p50 {percentile(values, 50) * 1000:.1f} ms, p99 "
            f"{percentile(values, 99) * 1000:.1f} ms (n={len(values)})")


def rows_for(results: dict[str, IdleResult], processes: int, threads: int) -> list[Row]:
    """The benchmark's rows: the doorbell's figures, the polling baseline beside each."""
    bell, poll = results["doorbell"], results["polling"]
    shape = f"{processes} x {threads} workers"
    fewer = bell.commands_per_s <= poll.commands_per_s / 10
    return [
        Row("4 idle", f"Redis commands/s, {shape} idle {bell.window:.0f} s",
            f"{bell.commands_per_s:,.1f}/s", "<= 1/10 of polling",
            f"polling: {poll.commands_per_s:,.1f}/s", verdict(fewer),
            f"CPU over the window: workers {bell.workers_cpu:.2f} s, redis-server "
            f"{bell.redis_cpu:.2f} s (polling: {poll.workers_cpu:.2f} s, "
            f"{poll.redis_cpu:.2f} s)"),
        Row("4 idle", "add -> job start on an idle queue", _ms(bell.latencies),
            "p99 <= polling's + 10 ms", f"polling: {_ms(poll.latencies)}",
            verdict(percentile(bell.latencies, 99) <= percentile(poll.latencies, 99) + 0.01),
            "adds 50-150 ms apart, client clock at the add, the probe's at the start"),
        Row("4 idle", f"delayed add ({DELAY * 1000:.0f} ms): ready -> job start",
            _ms(bell.delayed_latencies), "p99 <= polling's + 10 ms",
            f"polling: {_ms(poll.delayed_latencies)}",
            verdict(percentile(bell.delayed_latencies, 99)
                    <= percentile(poll.delayed_latencies, 99) + 0.01),
            "the promoter's part: it sleeps until the earliest ready time"),
    ]


def _info(client: redis.Redis) -> tuple[int, float]:
    stats, cpu = client.info("stats"), client.info("cpu")
    return (int(stats["total_commands_processed"]),
            float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]))


def _idle(system: System, seconds: float, out: IdleResult) -> None:
    pids = [pid for pid in system.workers.pids if pid is not None]
    commands0, redis0 = _info(system.client)
    workers0, t0 = sum(map(cpu_seconds, pids)), time.monotonic()
    time.sleep(seconds)
    commands1, redis1 = _info(system.client)
    out.window = time.monotonic() - t0
    out.workers_cpu = sum(map(cpu_seconds, pids)) - workers0
    out.commands, out.redis_cpu = commands1 - commands0, redis1 - redis0


def _starts(client: redis.Redis, settings: QueueSettings) -> dict[str, float]:
    """Each key's first start time, from the probe's log."""
    out: dict[str, float] = {}
    for raw in client.lrange(probe.probe_key(settings, "log"), 0, -1):
        key, _, start, *_ = json.loads(raw)
        out.setdefault(key, float(start))
    return out


def _latencies(system: System, n: int, add: Callable[[KeyedQueue, str], object],
               lag: float) -> list[float]:
    """n adds, one at a time, 50-150 ms apart; each add's key's start minus (add + lag)."""
    queue = KeyedQueue(system.client, system.settings)
    tag = uuid.uuid4().hex[:6]
    added: dict[str, float] = {}
    for i in range(n):
        key = f"instance/bench/{tag}/{i + 1}"
        added[key] = time.time() + lag
        add(queue, key)
        time.sleep(random.uniform(0.05, 0.15))
    deadline = time.monotonic() + 30
    starts = _starts(system.client, system.settings)
    while len(set(added) & set(starts)) < n and time.monotonic() < deadline:
        time.sleep(0.1)
        starts = _starts(system.client, system.settings)
    return [starts[k] - t for k, t in added.items() if k in starts]


def measure_mode(mode: str, url: str, processes: int, threads: int, idle: float,
                 adds: int) -> IdleResult:
    out = IdleResult(mode)
    system = System(None, redis=url, schedulers=0, workers=processes, threads=threads,
                    worker_modules=("workers.probe",), worker_env={"WARMPOOL_PROBE": "log"},
                    queue=MODES[mode], tag=f"idle{uuid.uuid4().hex[:8]}")
    try:
        system.start()
        time.sleep(3)  # boot traffic (script loads, first maintenance) settles
        _idle(system, idle, out)
        out.latencies = _latencies(system, adds, lambda q, k: q.add(k), 0.0)
        out.delayed_latencies = _latencies(
            system, adds // 2, lambda q, k: q.add_after(k, DELAY), DELAY)
    finally:
        system.stop()
    return out


def lines_for(results: dict[str, IdleResult]) -> list[str]:
    return [
        f"{r.mode:>8}: idle {r.window:.1f} s: {r.commands_per_s:,.1f} Redis commands/s, CPU "
        f"workers {r.workers_cpu:.2f} s, redis-server {r.redis_cpu:.2f} s; add -> start "
        f"{_ms(r.latencies)}; delayed ready -> start {_ms(r.delayed_latencies)}"
        for r in results.values()
    ]


def run(processes: int, threads: int, idle: float, adds: int,
        url: str) -> tuple[list[Row], list[str]]:
    results = {mode: measure_mode(mode, url, processes, threads, idle, adds)
               for mode in MODES}
    return rows_for(results, processes, threads), lines_for(results)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench idle", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--idle", type=float, default=20.0)
    parser.add_argument("--adds", type=int, default=200)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args(argv)
    rows, lines = run(args.processes, args.threads, args.idle, args.adds,
                      args.redis_url or resolve_redis_url())
    for line in lines:
        print(line)
    for row in rows:
        print(f"| {row.case} | {row.result} | {row.goal} | {row.baseline} | {row.verdict} |")
    return 0
