"""A keyed work queue on dramatiq's Redis broker with client-go's per-key contract, across
processes and hosts: a key added many times while waiting runs once; a key never runs in two
workers at once; a key added while it runs runs exactly once more afterwards; FIFO by first
add. Per-key leases (with fences) make the "never at once" hold; see `layout` for the keys
and `scripts` for the state machine.

Producers: `KeyedQueue.add(key, triggers=None)` / `.add_after(key, seconds, triggers=None)`
(triggers: the object versions the run must see). Claims (session keys) go to their own
dramatiq queue, `<queue>-claims`, ahead of bulk work.
Workers: `build_broker(settings)` + keyed actors (see `workers.runtime`); handlers get a
`JobContext` (`ctx.fence`, `ctx.triggers`, `ctx.ensure_held()`, `ctx.try_lease(other)`,
`ctx.note_write(field, version)`, `ctx.defer(s)`).
"""

from warmpool.queue.broker import build_broker, keyed_middleware
from warmpool.queue.embedded import EmbeddedRedis, embedded_redis, resolve_redis_url
from warmpool.queue.inspect import Inspector, KeyState, QueueStats, WorkerInfo
from warmpool.queue.jobs import JobContext, Jobs, current_job
from warmpool.queue.keyed import AddResult, DeadLetter, KeyedQueue
from warmpool.queue.layout import Layout
from warmpool.queue.lease import Lease, LeaseLost
from warmpool.queue.observer import NullObserver, QueueObserver, get_observer, set_observer
from warmpool.queue.redis_conn import connect
from warmpool.queue.routing import ACTOR_FOR_KIND, actor_for_key
from warmpool.queue.settings import QueueSettings

__all__ = [
    "ACTOR_FOR_KIND",
    "AddResult",
    "DeadLetter",
    "EmbeddedRedis",
    "Inspector",
    "JobContext",
    "Jobs",
    "KeyState",
    "KeyedQueue",
    "Layout",
    "Lease",
    "LeaseLost",
    "NullObserver",
    "QueueObserver",
    "QueueSettings",
    "QueueStats",
    "WorkerInfo",
    "actor_for_key",
    "build_broker",
    "connect",
    "current_job",
    "embedded_redis",
    "get_observer",
    "keyed_middleware",
    "resolve_redis_url",
    "set_observer",
]
