"""Worker-side instrumentation for the benchmarks: the real handlers of `workers.handlers`,
each run logged to Redis ("<time.time()> <key>") in `<prefix>bench:starts` before it starts
and in `<prefix>bench:ends` after it returns or raises.

Run workers with `modules=("bench.counting",)`: two RPUSHes per job (loopback round trips,
~0.1 ms each, next to a job's many API calls) buy the benchmark the number of runs per key,
each run's start (coalescing, event-to-start latency) and its duration.
"""

from __future__ import annotations

import functools
import time

import workers.handlers  # noqa: F401  (registers the real handlers)
from warmpool.queue.jobs import JobContext
from warmpool.queue.settings import QueueSettings
from workers import runtime


def starts_key(settings: QueueSettings) -> str:
    return f"{settings.prefix}bench:starts"


def ends_key(settings: QueueSettings) -> str:
    return f"{settings.prefix}bench:ends"


def _logged(fn: runtime.Handler) -> runtime.Handler:
    # wraps: the worker sees the real handler underneath (and fills its cache before jobs).
    @functools.wraps(fn)
    def run(ctx: JobContext) -> None:
        client, settings = ctx.jobs.client, ctx.jobs.settings
        client.rpush(starts_key(settings), f"{time.time():.6f} {ctx.key}")
        try:
            fn(ctx)
        finally:
            client.rpush(ends_key(settings), f"{time.time():.6f} {ctx.key}")

    return run


for _kind, _fn in runtime.registered().items():
    runtime.register(_kind, _logged(_fn))
