"""The HTTP endpoints: one per scheduler process, one per worker host.

- Scheduler (`scheduler_registry`): its own state (`SchedulerCollector`), the keys it added,
  the cluster-wide queue and pool gauges read from Redis (`ClusterCollector`) and the usual
  process series. Single process: no multiprocess mode.
- Worker host (`host_registry`): the worker parent aggregates its children's files in the
  multiprocess directory (`MultiProcessCollector`), plus its own view of the children.
  `prepare_multiprocess_dir` empties that directory before any child starts (files of an
  earlier run would be summed in); `workers.process.WorkerPool` removes a dead child's
  live-gauge files (`mark_process_dead`) before it starts a replacement.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import redis
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from metrics.build import BuildInfoCollector
from metrics.collectors import (
    AddCounter,
    ClusterCollector,
    SchedulerCollector,
    SchedulerView,
    WorkerPoolCollector,
    WorkerPoolView,
)
from warmpool.queue.settings import QueueSettings
from warmpool.serving import BoundedServer, family_for, serve_in_thread

log = logging.getLogger(__name__)

SCHEDULER_PORT = 9090
WORKER_PORT = 9091


def prepare_multiprocess_dir(path: str | Path) -> Path:
    """Create the directory, or empty it of prometheus-client's files (``*.db``): values
    left by processes of an earlier run must not be summed into this one's."""
    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    for f in d.glob("*.db"):
        f.unlink(missing_ok=True)
    return d


def host_registry(path: str | Path, pool: WorkerPoolView | None = None) -> CollectorRegistry:
    Path(path).mkdir(parents=True, exist_ok=True)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(path))
    registry.register(BuildInfoCollector())
    if pool is not None:
        registry.register(WorkerPoolCollector(pool))
    return registry


def scheduler_registry(
    app: SchedulerView, client: redis.Redis | None, settings: QueueSettings,
    adds: AddCounter | None = None,
) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(SchedulerCollector(app, adds))
    registry.register(BuildInfoCollector())
    if client is not None:
        registry.register(ClusterCollector(client, settings))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


class _BoundedWSGIServer(BoundedServer, ThreadingMixIn, WSGIServer):
    """prometheus-client's threading WSGI server, with warmpool.serving's bounds: a scraper
    that connects and sends nothing is closed, and a few handlers run at once."""


class _SilentHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class MetricsServer:
    """prometheus-client's exposition app on (host, port), served by a bounded server
    (warmpool.serving: per-connection timeout and deadline, bounded handler threads); port 0
    picks a free one."""

    def __init__(self, registry: CollectorRegistry, host: str = "0.0.0.0", port: int = 0, *,
                 timeout: float | None = None, deadline: float | None = None,
                 max_connections: int | None = None) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._timeout, self._deadline, self._max = timeout, deadline, max_connections
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> MetricsServer:
        """Raises OSError when the address cannot be bound."""
        server_class = type("MetricsWSGIServer", (_BoundedWSGIServer,),
                            {"address_family": family_for(self.host)})
        server: WSGIServer = make_server(self.host, self.port, make_wsgi_app(self.registry),
                                         server_class, handler_class=_SilentHandler)
        assert isinstance(server, _BoundedWSGIServer)
        server.bound(timeout=self._timeout, deadline=self._deadline,
                     max_connections=self._max)
        self._server = server
        self._thread = serve_in_thread(server, "metrics")
        return self

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}/metrics"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None


def serve(
    registry: CollectorRegistry, host: str, port: int, *, required: bool
) -> MetricsServer | None:
    """Start a `MetricsServer`. If the port cannot be bound: raise when `required` (the port
    was asked for explicitly), else log a warning and return None (a second process on one
    host, on the default port, runs without an endpoint rather than not at all)."""
    try:
        return MetricsServer(registry, host, port).start()
    except OSError as exc:
        if required:
            raise
        log.warning("metrics not served: %s:%d: %s", host, port, exc)
        return None
