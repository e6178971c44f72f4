"""How many claims wait, cluster-wide: what bulk writes yield to (`warmpool.kube.pacing`).

A claim waits from the moment its message is queued until its job acks it: queued (the
claims queue's dramatiq list), prefetched by a worker, or running. dramatiq's Redis broker
moves a message from the list into its consumer's acks set (`__acks__.<worker>.<queue>`)
when the worker fetches it and removes it when the job ends, so the list's length plus the
acks sets of the live workers' claims queues is exactly that count. Prefetched claims matter
most: they are the ones waiting for a job thread that bulk work holds.

Two reads: the live workers (dramatiq's heartbeat set, re-read every `WORKERS_MAX_AGE`
seconds; a worker is live if its heartbeat is within the heartbeat timeout of the newest one,
so no clock is compared with Redis's), then one pipeline of LLEN + one SCARD per worker. A
crashed worker's acks set is left out once its heartbeat is old (maintenance requeues those
messages to the list, where they are counted again).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis

from warmpool.queue.layout import Layout
from warmpool.queue.replies import scored

#: How old the list of live workers may get (workers come and go rarely).
WORKERS_MAX_AGE = 2.0


class ClaimCount:
    """Callable: the number of claims waiting now (see the module's docstring)."""

    def __init__(self, client: redis.Redis, layout: Layout, heartbeat_timeout: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.layout = client, layout
        self.timeout_ms = heartbeat_timeout * 1000
        self._clock = clock
        self._lock = threading.Lock()
        self._workers: list[str] = []
        self._workers_at: float | None = None

    def workers(self) -> list[str]:
        now = self._clock()
        with self._lock:
            if self._workers_at is None or now - self._workers_at >= WORKERS_MAX_AGE:
                beats = [(w.decode(), s) for w, s in scored(
                    self.client.zrange(self.layout.heartbeats, 0, -1, withscores=True))]
                newest = max((s for _, s in beats), default=0.0)
                self._workers = [w for w, s in beats if s >= newest - self.timeout_ms]
                self._workers_at = now
            return list(self._workers)

    def __call__(self) -> int:
        lo = self.layout
        with self.client.pipeline(transaction=False) as p:
            p.llen(lo.claims_messages_list)
            for worker in self.workers():
                p.scard(lo.acks(worker, lo.claims_queue))
            return sum(int(n) for n in p.execute())
