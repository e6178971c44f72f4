"""Instrumented handlers for every key kind: for the queue's tests and benchmarks, and for
smoke-testing a deployment (`warmpool worker -m workers.probe`).

Behaviour is steered through Redis under `<prefix>probe:` so a test can change it while
workers run, and through `WARMPOOL_PROBE` (read at import) for the mode:
  noop  each run only INCRs `probe:count` (throughput benchmarks);
  log   (default) each run appends [key, worker, start, end, fence] (time.time() floats) to
        `probe:log`, sleeping `probe:sleep` seconds (if set) in between; a key found in the
        hash `probe:hold` (key -> seconds) holds that long once, announcing itself on
        `probe:holding`; a key in `probe:fail` (key -> n) fails its next n runs; a key in
        `probe:defer` (key -> n) defers its next n runs by 50 ms (`ctx.defer`), each noted on
        `probe:deferred` as [key, time just before the defer]; a key in `probe:secondary`
        (key -> other key) holds the other key's lease (`ctx.try_lease`) while it sleeps.
A plain dramatiq actor `probe_raw` (INCRs `probe:raw`) is declared next to the keyed ones,
for comparing against bare dramatiq.
"""

from __future__ import annotations

import json
import os
import threading
import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from warmpool.queue.jobs import JobContext
from warmpool.queue.routing import ACTOR_FOR_KIND
from warmpool.queue.settings import QueueSettings
from workers import runtime

MODE = os.environ.get("WARMPOOL_PROBE", "log")
RAW_ACTOR = "probe_raw"
DEFER_SECONDS = 0.05


class ProbeFailure(RuntimeError):
    pass


def probe_key(settings: QueueSettings, name: str) -> str:
    return f"{settings.prefix}probe:{name}"


def _sleep_holding(ctx: JobContext, seconds: float, release: str | None = None) -> None:
    """Simulated work that stops as soon as the lease is gone, like a real handler would;
    with `release` (a set key), also as soon as this key is put in that set."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        ctx.ensure_held()
        if release is not None and ctx.jobs.client.srem(release, ctx.key):
            return
        time.sleep(min(left, 0.05 if release else 0.01))


def probe(ctx: JobContext) -> None:
    client = ctx.jobs.client
    settings = ctx.jobs.settings
    if MODE == "noop":
        client.incr(probe_key(settings, "count"))
        return
    start = time.time()
    worker = f"{os.getpid()}:{threading.get_ident()}"
    with client.pipeline(transaction=False) as p:
        p.hget(probe_key(settings, "hold"), ctx.key)
        p.hdel(probe_key(settings, "hold"), ctx.key)
        p.get(probe_key(settings, "sleep"))
        p.hget(probe_key(settings, "fail"), ctx.key)
        p.hget(probe_key(settings, "secondary"), ctx.key)
        p.hget(probe_key(settings, "defer"), ctx.key)
        hold, _, sleep, fail, other, defer = p.execute()
    if other is not None:
        ctx.try_lease(other.decode())  # released with the job (or refused: busy)
    if hold is not None:
        client.rpush(probe_key(settings, "holding"), json.dumps([ctx.key, os.getpid()]))
        _sleep_holding(ctx, float(hold), probe_key(settings, "release"))
    elif sleep is not None:
        _sleep_holding(ctx, float(sleep))
    if fail is not None and int(fail) > 0:
        client.hincrby(probe_key(settings, "fail"), ctx.key, -1)
        raise ProbeFailure(f"probe failure on {ctx.key} (attempt {ctx.attempt})")
    if defer is not None and int(defer) > 0:
        client.hincrby(probe_key(settings, "defer"), ctx.key, -1)
        deferred_at = time.time()  # before: a rerun cannot start before the defer's time
        ctx.defer(DEFER_SECONDS)
        client.rpush(probe_key(settings, "deferred"), json.dumps([ctx.key, deferred_at]))
    ctx.ensure_held()
    end = time.time()
    record = json.dumps([ctx.key, worker, start, end, ctx.fence])
    with client.pipeline(transaction=False) as p:
        p.rpush(probe_key(settings, "log"), record)
        p.incr(probe_key(settings, "count"))
        p.execute()


def _declare_raw(broker: RedisBroker, settings: QueueSettings) -> None:
    counter = probe_key(settings, "raw")

    def probe_raw() -> None:
        broker.client.incr(counter)

    # = dramatiq.actor(probe_raw, ...), in the spelling its typed overloads take
    dramatiq.actor(actor_name=RAW_ACTOR, queue_name=settings.queue_name, broker=broker)(probe_raw)


#: The probe for every key kind (`runtime.using(probe.HANDLERS)` in a test process).
HANDLERS = {kind: probe for kind in ACTOR_FOR_KIND}

for _kind, _fn in HANDLERS.items():
    runtime.register(_kind, _fn)
runtime.on_broker(_declare_raw)
