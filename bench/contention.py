"""How soon a contended key runs again once its holder is done, vs a blocking Redis lock.

Keyed queue: each of N keys is added, and added again while its first run (20 ms of
simulated work) is in progress; the queue folds the second add into a re-run that the
holder's `done` script enqueues. Latency = re-run start - first run end, from the probe log.

Baseline, same Redis, same run: the usual alternative, a redis-py `Lock` taken blocking by a
second thread while the first holds it for 20 ms (a parked thread, polling every 0.1 s, the
library's default). Latency = acquire - release.

  python -m bench contention [--keys 300] [--processes 2] [--threads 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid

from bench.report import pct
from warmpool.harness import System
from warmpool.queue.embedded import resolve_redis_url
from warmpool.queue.keyed import KeyedQueue
from warmpool.queue.redis_conn import connect
from workers import probe

WORK = 0.02


def keyed_latencies(url: str, keys: int, processes: int, threads: int) -> list[float]:
    # Workers on a queue of the run's own, no cluster.
    system = System(None, redis=url, schedulers=0, workers=processes, threads=threads,
                    worker_modules=("workers.probe",), worker_env={"WARMPOOL_PROBE": "log"},
                    tag=f"bench{uuid.uuid4().hex[:8]}")
    try:
        system.start()
        settings, client = system.settings, system.client
        q = KeyedQueue(client, settings)
        log = probe.probe_key(settings, "log")
        client.set(probe.probe_key(settings, "sleep"), WORK)
        for i in range(1, keys + 1):
            key = f"instance/bench/contention/{i}"
            q.add(key)
            time.sleep(WORK / 2)  # the second add lands while the first run works
            q.add(key)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and client.llen(log) < 2 * keys:
            time.sleep(0.05)
        runs: dict[str, list[tuple[float, float]]] = {}
        for raw in client.lrange(log, 0, -1):
            key, _, start, end, _ = json.loads(raw)
            runs.setdefault(key, []).append((start, end))
        return [rs[1][0] - rs[0][1] for rs in (sorted(r) for r in runs.values()) if len(rs) == 2]
    finally:
        system.stop()


def lock_latencies(url: str, trials: int) -> list[float]:
    client = connect(url)
    out: list[float] = []
    for i in range(trials):
        name = f"bench{uuid.uuid4().hex[:8]}:lock:{i}"
        lock = client.lock(name, timeout=10)
        lock.acquire()
        got: list[float] = []

        def contender(name: str = name, got: list[float] = got) -> None:
            other = client.lock(name, timeout=10)
            other.acquire(blocking=True)
            got.append(time.time())
            other.release()

        t = threading.Thread(target=contender)
        t.start()
        time.sleep(WORK)
        release_time = time.time()
        lock.release()
        t.join()
        out.append(got[0] - release_time)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench contention", description=__doc__)
    parser.add_argument("--keys", type=int, default=300)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args(argv)
    url = args.redis_url or resolve_redis_url()
    keyed = keyed_latencies(url, args.keys, args.processes, args.threads)
    lock = lock_latencies(url, min(args.keys, 100))
    print(f"contention bench: {args.processes} x {args.threads} workers, {WORK * 1000:.0f} ms "
          f"holds, redis {url}")
    print(f"| {'case':<46} | {'n':>4} | {'p50 ms':>7} | {'p99 ms':>7} |")
    print(f"|{'-' * 48}|{'-' * 6}|{'-' * 9}|{'-' * 9}|")
    for name, xs in (("keyed queue: re-run start after holder done", keyed),
                     ("redis-py Lock, blocking (thread parked, polls)", lock)):
        print(f"| {name:<46} | {len(xs):>4} | {pct(xs, 0.5) * 1000:>7.1f} | "
              f"{pct(xs, 0.99) * 1000:>7.1f} |")
    print(f"ratio of p50 (lock / keyed): {statistics.median(lock) / statistics.median(keyed):.1f}x")
    return 0
