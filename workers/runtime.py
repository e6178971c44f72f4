"""The worker runtime: handlers by key kind, and one keyed dramatiq actor per kind.

Handlers are plain functions `fn(ctx: JobContext) -> None`, registered by kind
(`register("instance", reconcile)`); this module imports neither Kubernetes nor the handlers
themselves, so producers, tools and tests can import it freely. The actors look the handler
up at call time, so registering after the broker is built works too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from warmpool.queue.broker import build_broker, keyed_middleware
from warmpool.queue.jobs import JobContext, Jobs, current_job
from warmpool.queue.observer import QueueObserver
from warmpool.queue.routing import ACTOR_FOR_KIND, CLAIM_KIND
from warmpool.queue.settings import QueueSettings

#: dramatiq priorities (lower runs first: a worker's prefetched messages wait in one
#: PriorityQueue by actor priority): a claim is a user waiting, bulk work is not.
CLAIM_PRIORITY = 0
BULK_PRIORITY = 10

Handler = Callable[[JobContext], None]
BrokerHook = Callable[[RedisBroker, QueueSettings], None]

_handlers: dict[str, Handler] = {}
_broker_hooks: list[BrokerHook] = []


class NoHandler(LookupError):
    pass


def register(kind: str, fn: Handler) -> Handler:
    """Run `fn(ctx)` for keys of `kind` (instance | session | pool); replaces any previous."""
    if kind not in ACTOR_FOR_KIND:
        raise ValueError(f"unknown key kind {kind!r}; expected one of {sorted(ACTOR_FOR_KIND)}")
    _handlers[kind] = fn
    return fn


def handles(kind: str) -> Callable[[Handler], Handler]:
    """Decorator form of `register`."""
    return lambda fn: register(kind, fn)


def handler_for(kind: str) -> Handler:
    try:
        return _handlers[kind]
    except KeyError:
        raise NoHandler(f"no handler registered for {kind!r} keys") from None


def registered() -> dict[str, Handler]:
    return dict(_handlers)


@contextmanager
def using(handlers: Mapping[str, Handler]) -> Iterator[None]:
    """Run with exactly these handlers registered, then put the previous ones back (for tests
    that run a worker in their own process, where another module may have registered)."""
    before = dict(_handlers)
    _handlers.clear()
    for kind, fn in handlers.items():
        register(kind, fn)
    try:
        yield
    finally:
        _handlers.clear()
        _handlers.update(before)


def on_broker(hook: BrokerHook) -> BrokerHook:
    """Call `hook(broker, settings)` on every worker broker built from now on (e.g. to
    declare plain dramatiq actors next to the keyed ones)."""
    _broker_hooks.append(hook)
    return hook


def _actor_fn(kind: str, actor_name: str) -> Callable[[str], None]:
    def run(key: str) -> None:
        handler_for(kind)(current_job())

    run.__name__ = run.__qualname__ = actor_name
    return run


def declare_actors(
    broker: RedisBroker, settings: QueueSettings,
) -> dict[str, dramatiq.Actor[[str], None]]:
    """One keyed actor per kind, named as in `warmpool.queue.routing.ACTOR_FOR_KIND`: the
    claim actor on the claims queue at `CLAIM_PRIORITY`, the others on the main queue at
    `BULK_PRIORITY`, so a claim neither queues behind nor waits in a worker behind bulk work."""
    # dramatiq.actor(**options)(fn), which is what dramatiq.actor(fn, **options) does: only
    # this spelling is one of its typed overloads
    return {
        kind: dramatiq.actor(
            actor_name=name,
            queue_name=settings.claims_queue_name if kind == CLAIM_KIND else settings.queue_name,
            priority=CLAIM_PRIORITY if kind == CLAIM_KIND else BULK_PRIORITY,
            broker=broker,
            keyed=True,
        )(_actor_fn(kind, name))
        for kind, name in ACTOR_FOR_KIND.items()
    }


def build_worker_broker(
    settings: QueueSettings,
    *,
    client: redis.Redis | None = None,
    observer: QueueObserver | None = None,
) -> RedisBroker:
    broker = build_broker(settings, client=client, observer=observer)
    declare_actors(broker, settings)
    for hook in list(_broker_hooks):
        hook(broker, settings)
    return broker


@dataclass
class RunningWorker:
    """A dramatiq Worker running in this process (tests, single-process runs)."""

    broker: RedisBroker
    worker: dramatiq.Worker

    @property
    def jobs(self) -> Jobs:
        return keyed_middleware(self.broker).jobs

    def stop(self, timeout: float | None = None) -> None:
        ms = int((timeout if timeout is not None else self.jobs.settings.drain_timeout) * 1000)
        self.worker.stop(timeout=ms)


#: The job threads of this process's worker (`start_worker`): what a job kind that may wait
#: long (a URL probe) takes a share of.
_threads = 8


def job_threads() -> int:
    """How many job threads this process's worker runs (8 before `start_worker`)."""
    return _threads


def start_worker(
    settings: QueueSettings,
    *,
    threads: int = 8,
    client: redis.Redis | None = None,
    observer: QueueObserver | None = None,
) -> RunningWorker:
    """Start consuming `settings.queue_name` and its claims queue with `threads` worker threads
    in this process. dramatiq allows one Worker per process; stop it before starting another."""
    global _threads
    _threads = threads
    broker = build_worker_broker(settings, client=client, observer=observer)
    worker = dramatiq.Worker(
        broker,
        queues={settings.queue_name, settings.claims_queue_name},
        worker_threads=threads,
        worker_timeout=max(1, int(settings.poll_timeout * 1000)),
    )
    worker.start()
    return RunningWorker(broker, worker)
