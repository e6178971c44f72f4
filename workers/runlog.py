"""The real handlers of `workers.handlers`, each run logged to Redis: "<time.time()> <key>
<worker>" is appended to `Layout.runs_started` before the handler starts and to
`Layout.runs_ended` after it returns or raises (`<prefix>runlog:starts` /
`<prefix>runlog:ends`); `<worker>` is `<host>:<pid>` of the process that ran it, so a test
can tell how the work spread over the workers (`RunLog.by_worker`).

Who reads it: `warmpool.harness` (`RunLog`: the benchmarks' runs per key, each run's start
and duration; `System.mark`/`wait_quiet`: "the work caused by a change has run", instead of a
sleep). A key's runs never overlap while its lease holds, so a key's i-th end belongs to its
i-th start.

Run workers with `modules=("workers.runlog",)` (the harness's default): two RPUSHes per job
(loopback round trips, ~0.1 ms each, next to a job's many API calls).
"""

from __future__ import annotations

import functools
import os
import socket
import time

import workers.handlers  # noqa: F401  (registers the real handlers)
from warmpool.queue.jobs import JobContext
from warmpool.queue.layout import Layout
from workers import runtime


def _worker() -> str:
    """This process, as the run log names it (read per run: a forked child has its own pid)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _logged(fn: runtime.Handler) -> runtime.Handler:
    # wraps: the worker sees the real handler underneath (and fills its cache before jobs).
    @functools.wraps(fn)
    def run(ctx: JobContext) -> None:
        client, layout = ctx.jobs.client, Layout.of(ctx.jobs.settings)
        worker = _worker()
        client.rpush(layout.runs_started, f"{time.time():.6f} {ctx.key} {worker}")
        try:
            fn(ctx)
        finally:
            client.rpush(layout.runs_ended, f"{time.time():.6f} {ctx.key} {worker}")

    return run


for _kind, _fn in runtime.registered().items():
    runtime.register(_kind, _logged(_fn))
