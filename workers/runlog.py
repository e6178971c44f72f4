"""The real handlers of `workers.handlers`, each run logged to Redis ("<time.time()> <key>")
in `<prefix>bench:starts` before it starts and in `<prefix>bench:ends` after it returns or
raises: for the benchmarks (runs per key, each run's start and duration) and for tests that
must know a key's job has run since a change (`ran_since`), instead of sleeping.

Run workers with `modules=("workers.runlog",)`: two RPUSHes per job (loopback round trips,
~0.1 ms each, next to a job's many API calls).
"""

from __future__ import annotations

import functools
import time

import redis

import workers.handlers  # noqa: F401  (registers the real handlers)
from warmpool.queue.jobs import JobContext
from warmpool.queue.replies import text
from warmpool.queue.settings import QueueSettings
from workers import runtime


def starts_key(settings: QueueSettings) -> str:
    return f"{settings.prefix}bench:starts"


def ends_key(settings: QueueSettings) -> str:
    return f"{settings.prefix}bench:ends"


def mark(client: redis.Redis, settings: QueueSettings) -> int:
    """The number of runs ended so far: pass it to `ran_since`."""
    return int(client.llen(ends_key(settings)))


def ran_since(client: redis.Redis, settings: QueueSettings, key: str, since: int) -> bool:
    """Whether a run of `key` ended after `mark()` returned `since`."""
    return any(text(raw).partition(" ")[2] == key
               for raw in client.lrange(ends_key(settings), since, -1))


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
