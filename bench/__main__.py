"""Dispatch `python -m bench <name> [args...]` to the benchmark module registered as `name`."""

from __future__ import annotations

import importlib
import signal
import sys

#: name -> module with a `main(argv: list[str]) -> int`
BENCHMARKS: dict[str, str] = {
    "queue": "bench.queue_bench",
    "contention": "bench.contention",
    "convergence": "bench.convergence",
    "pipeline": "bench.queue_bench",
    "idle": "bench.idle",
    "claim": "bench.claim_latency",
    "warm": "bench.warm",
    "coalescing": "bench.coalescing",
    "crash": "bench.crash",
    "memory": "bench.memory",
    "lecture": "bench.lecture",
    "all": "bench.all",
}


def _terminate(signum: int, frame: object) -> None:
    print(f"bench: got signal {signum}; stopping what was started", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)  # unwind: every benchmark stops what it started


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHMARKS:
        print("usage: python -m bench <name> [options]\nbenchmarks: " + ", ".join(BENCHMARKS))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(BENCHMARKS[argv[0]])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
