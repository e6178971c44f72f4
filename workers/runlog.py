"""The real handlers of `workers.handlers`, each run logged to Redis: "<time.time()> <key>" is
appended to `Layout.runs_started` before the handler starts and to `Layout.runs_ended` after
it returns or raises (`<prefix>runlog:starts` / `<prefix>runlog:ends`).

Who reads it: the benchmarks (runs per key, each run's start and duration) and
`warmpool.harness` (`System.wait_quiet`: "the work caused by a change has run", instead of a
sleep). A key's runs never overlap while its lease holds, so a key's i-th end belongs to its
i-th start.

Run workers with `modules=("workers.runlog",)` (the harness's default): two RPUSHes per job
(loopback round trips, ~0.1 ms each, next to a job's many API calls).
"""

from __future__ import annotations

import functools
import time

import redis

import workers.handlers  # noqa: F401  (registers the real handlers)
from warmpool.queue.jobs import JobContext
from warmpool.queue.layout import Layout
from warmpool.queue.replies import text
from warmpool.queue.settings import QueueSettings
from workers import runtime


def starts_key(settings: QueueSettings) -> str:
    return Layout.of(settings).runs_started


def ends_key(settings: QueueSettings) -> str:
    return Layout.of(settings).runs_ended


def mark(client: redis.Redis, settings: QueueSettings) -> int:
    """The number of runs ended so far: pass it to `ran_since`. (`warmpool.harness`'s
    `System.mark`/`wait_quiet` also tell runs that started after the mark from runs that
    were already under way.)"""
    return int(client.llen(ends_key(settings)))


def ran_since(client: redis.Redis, settings: QueueSettings, key: str, since: int) -> bool:
    """Whether a run of `key` ended after `mark()` returned `since`."""
    return any(text(raw).partition(" ")[2] == key
               for raw in client.lrange(ends_key(settings), since, -1))


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
