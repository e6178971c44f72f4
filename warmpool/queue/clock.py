"""The one clock every process of the queue agrees on: the Redis server's.

Workers run on many hosts, and hosts' clocks disagree. Everything the queue decides in Redis
already reads the server's clock (`TIME` in the Lua library, the leases' TTLs); what did not
were the timestamps the clients wrote themselves: dramatiq's dispatch stamps every command with
the caller's `time.time()`, and a worker's heartbeat is a score compared with the *maintaining*
worker's clock. A host whose clock runs 5 s (the heartbeat timeout) behind then looks dead to
the others, who requeue the messages it is running; one whose clock runs ahead declares every
other worker dead at each maintenance. With `ServerClock`, a timestamp is the server's time
(read once, then carried forward on this process's monotonic clock, and read again every
`refresh` seconds), so a skewed wall clock changes nothing and a stepped one is never seen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis


class ServerClock:
    """Milliseconds since the epoch on the Redis server's clock, without a round trip per
    reading. Accurate to half the round trip of the `TIME` it was synchronised with, plus the
    drift of the local monotonic clock over `refresh` seconds (microseconds)."""

    def __init__(self, client: redis.Redis, *, refresh: float = 60.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.refresh = refresh
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._base: tuple[float, float] | None = None  # (monotonic s, server ms)

    def sync(self) -> None:
        """Read the server's clock now (the reading is taken as made halfway through)."""
        sent = self.monotonic()
        sec, usec = self.client.time()
        back = self.monotonic()
        with self._lock:
            self._base = ((sent + back) / 2, int(sec) * 1000 + int(usec) / 1000)

    def now_ms(self) -> int:
        base = self._base
        if base is None or self.monotonic() - base[0] > self.refresh:
            try:
                self.sync()
            except redis.RedisError:
                if base is None:
                    raise  # nothing to carry forward: the caller's command would fail too
            base = self._base
        assert base is not None
        return int(base[1] + (self.monotonic() - base[0]) * 1000)
