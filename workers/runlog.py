"""The real handlers of `workers.handlers`, each run logged to Redis: "<time.time()> <key>" is
appended to `Layout.runs_started` before the handler starts and to `Layout.runs_ended` after
it returns or raises (`<prefix>runlog:starts` / `<prefix>runlog:ends`).

Who reads it: `warmpool.harness` (`RunLog`: the benchmarks' runs per key, each run's start
and duration; `System.mark`/`wait_quiet`: "the work caused by a change has run", instead of a
sleep). A key's runs never overlap while its lease holds, so a key's i-th end belongs to its
i-th start.

Run workers with `modules=("workers.runlog",)` (the harness's default): two RPUSHes per job
(loopback round trips, ~0.1 ms each, next to a job's many API calls).
"""

from __future__ import annotations

import functools
import time

import workers.handlers  # noqa: F401  (registers the real handlers)
from warmpool.queue.jobs import JobContext
from warmpool.queue.layout import Layout
from workers import runtime


def _logged(fn: runtime.Handler) -> runtime.Handler:
    # wraps: the worker sees the real handler underneath (and fills its cache before jobs).
    @functools.wraps(fn)
    def run(ctx: JobContext) -> None:
        client, layout = ctx.jobs.client, Layout.of(ctx.jobs.settings)
        client.rpush(layout.runs_started, f"{time.time():.6f} {ctx.key}")
        try:
            fn(ctx)
        finally:
            client.rpush(layout.runs_ended, f"{time.time():.6f} {ctx.key}")

    return run


for _kind, _fn in runtime.registered().items():
    runtime.register(_kind, _logged(_fn))
