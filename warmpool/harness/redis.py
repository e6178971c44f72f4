"""The Redis a system runs on: a private server of its own (the default), an existing one by
URL, or a Sentinel topology. All three answer `url`, `client()`, `start()` and `stop()`; only
the private server can be restarted in place (`restart`), the fault the chaos runner injects.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import redis

from warmpool.cluster.local import free_port
from warmpool.queue.embedded import EmbeddedRedis
from warmpool.queue.redis_conn import connect as redis_connect


class RedisServer(Protocol):
    """What `System` needs of a Redis: a URL for every process, a client for its own reads."""

    @property
    def url(self) -> str: ...

    def start(self) -> RedisServer: ...

    def client(self) -> redis.Redis: ...

    def restart(self, keep: bool, down_for: float = 0.0) -> None: ...

    def stop(self) -> None: ...


class PrivateRedis:
    """A valkey-server of our own on a fixed loopback port, so it can be restarted in place:
    `restart(keep=True)` saves and restores the data (an orderly restart), `keep=False` comes
    back empty (persistence off: leases, fences, queued keys all gone)."""

    def __init__(self, data_dir: Path) -> None:
        from warmpool.queue.embedded import valkey_server_class

        self.port = free_port()
        self.data_dir = data_dir
        self.server = valkey_server_class()(port=self.port, data_dir=data_dir)
        self._url = f"redis://127.0.0.1:{self.port}/0"

    @property
    def url(self) -> str:
        return self._url

    def start(self) -> PrivateRedis:
        # A fresh server: no data an earlier run left in this directory (`restart` keeps it).
        (self.data_dir / "dump.rdb").unlink(missing_ok=True)
        self.server.start()
        return self

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=2)

    def restart(self, keep: bool, down_for: float = 0.0) -> None:
        dump = self.data_dir / "dump.rdb"
        if keep:
            with contextlib.suppress(redis.RedisError):
                self.client().save()
        self.server.terminate()  # SIGKILL: no shutdown save
        if not keep:
            dump.unlink(missing_ok=True)  # after the kill: nothing can write it again
        time.sleep(down_for)  # the stimulus: how long the server stays away
        for attempt in range(20):
            try:
                self.server.start()
                return
            except Exception:
                if attempt == 19:
                    raise
                time.sleep(0.25)  # the port may linger a moment after the kill: retry

    def detach(self) -> int | None:
        """Let the server outlive this process (`warmpool demo --keep`); returns its pid."""
        return EmbeddedRedis(self.url, self.server).detach()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.server.terminate()


class ExternalRedis:
    """A server someone else runs (a URL): never started, stopped or restarted here."""

    def __init__(self, url: str) -> None:
        self._url = url

    @property
    def url(self) -> str:
        return self._url

    def start(self) -> ExternalRedis:
        return self

    def client(self) -> redis.Redis:
        return redis_connect(self.url)

    def restart(self, keep: bool, down_for: float = 0.0) -> None:
        raise NotImplementedError("not our server: it cannot be restarted from here")

    def stop(self) -> None:
        pass


class SentinelRedis:
    """Redis as a primary, replicas and Sentinels, reached by every process through the
    redis+sentinel:// URL. `open_topology` starts the servers and yields an object with their
    `url` (and whatever the caller's faults use, e.g. `kill_primary`): the tests' is
    `tests.integration.sentinel_cluster.sentinel_cluster`, kept there with the tests that
    drive it. `cluster` is that object while running."""

    def __init__(self, open_topology: Callable[[], AbstractContextManager[Any]]) -> None:
        self.open_topology = open_topology
        self.cluster: Any = None
        self._stack = contextlib.ExitStack()

    @property
    def url(self) -> str:
        assert self.cluster is not None, "start() first"
        return str(self.cluster.url)

    def start(self) -> SentinelRedis:
        self.cluster = self._stack.enter_context(self.open_topology())
        return self

    def client(self) -> redis.Redis:
        # Our own look at the queue: a failover in progress answers within seconds.
        return redis_connect(self.url, failover_wait=5.0, socket_timeout=5)

    def restart(self, keep: bool, down_for: float = 0.0) -> None:
        raise NotImplementedError("a Sentinel topology fails its primary over instead; "
                                  "restarts are single-server faults")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._stack.close()


def redis_server(spec: str | RedisServer, workdir: Path) -> RedisServer:
    """"private" -> a `PrivateRedis` in `workdir/redis`; another string -> that URL's server;
    a `RedisServer` -> itself."""
    if isinstance(spec, str):
        return PrivateRedis(workdir / "redis") if spec == "private" else ExternalRedis(spec)
    return spec
