"""The worker supervisor's probes, served by `warmpool.health.HealthServer`.

They replace two exec probes that started a Python interpreter in the container every 15-20 s
(one read /proc to find worker processes, the other connected to Redis): slow, costly, and
blind to a supervisor whose loop had stopped.

- `/healthz` (liveness): the supervisor's loop ran within `STALL` seconds and at least one
  worker process is alive. It restarts a crashed process within a second, so none at all
  means it is wedged or cannot start any. Nothing here depends on Redis: an outage must not
  restart every worker at once.
- `/readyz` (readiness): alive, and Redis answers a PING with this pod's URL (auth and TLS
  options included, and Sentinel URLs: through warmpool's own connection code, `redis_ping`),
  so a rollout whose new pods cannot reach the queue stops there.
- `/status`: the processes, their restarts, the last Redis answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

#: Seconds without a round of the supervisor's loop (it runs every second) before it is dead.
STALL = 30.0
#: Seconds a readiness PING may take (the kubelet's own timeout is above it).
PING_TIMEOUT = 3.0
#: Seconds a PING through Sentinels waits for them to name a primary (the queue's own
#: clients wait through a failover; a probe says "not ready" instead).
PING_FAILOVER_WAIT = 1.0


def redis_ping(url: str) -> Callable[[], object]:
    """The readiness check of `url`: one client, kept (its connection is reused), whose PING
    fails within about PING_TIMEOUT seconds when the server (or every Sentinel) is away."""
    from warmpool.queue.redis_conn import connect

    client = connect(url, socket_timeout=PING_TIMEOUT, socket_connect_timeout=PING_TIMEOUT,
                     failover_wait=PING_FAILOVER_WAIT)
    return client.ping


class Supervised(Protocol):
    """What the probes read of `workers.process.WorkerPool`."""

    @property
    def procs(self) -> Sequence[BaseProcess | None]: ...
    @property
    def restarts(self) -> int: ...
    @property
    def last_round(self) -> float: ...


class WorkerHealth:
    """`warmpool.health.Probed` for the worker supervisor; `ping` answers whether Redis
    does (it raises or returns False when not)."""

    def __init__(self, pool: Supervised, ping: Callable[[], object],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = pool
        self.ping = ping
        self.clock = clock
        self._lock = threading.Lock()
        self._redis_error: str | None = None

    def _alive(self) -> list[int]:
        return [p.pid for p in self.pool.procs
                if p is not None and p.is_alive() and p.pid is not None]

    def healthy(self) -> bool:
        return bool(self._alive()) and self.clock() - self.pool.last_round < STALL

    def ready(self) -> bool:
        if not self.healthy():
            return False
        try:
            ok = bool(self.ping())
            error = None if ok else "no answer"
        except Exception as exc:  # any failure to reach Redis: not ready, said in /status
            ok, error = False, f"{type(exc).__name__}: {exc}"
        with self._lock:
            self._redis_error = error
        return ok

    def status(self) -> dict[str, Any]:
        with self._lock:
            error = self._redis_error
        return {"processes": len(self.pool.procs), "alive": self._alive(),
                "restarts": self.pool.restarts,
                "last_round_seconds_ago": round(self.clock() - self.pool.last_round, 3),
                "redis_error": error}
