"""``/healthz``, ``/readyz`` and ``/status`` (JSON details) over plain HTTP, for the kubelet's
probes of a role's process: the scheduler (alive: every scheduler thread runs; ready: every
watch has its first list, leader and standby alike) and the worker supervisor
(`workers.health`: alive: it supervises live worker processes; ready: and Redis answers).

Served by `warmpool.serving.BoundedHTTPServer`: a client that connects and sends nothing is
closed after a timeout, and at most a few handlers run at once, so a slow client cannot take
the leader's threads (issue #27, point 6)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol

from warmpool.serving import BoundedHTTPServer, family_for, serve_in_thread


class Probed(Protocol):
    def healthy(self) -> bool: ...

    def ready(self) -> bool: ...

    def status(self) -> dict[str, Any]: ...


class HealthServer:
    def __init__(self, target: Probed, host: str = "127.0.0.1", port: int = 8080, *,
                 timeout: float | None = None, deadline: float | None = None,
                 max_connections: int | None = None) -> None:
        probed = target

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    ok = probed.healthy()
                    self._send(200 if ok else 503, "ok\n" if ok else "unhealthy\n")
                elif path == "/readyz":
                    ok = probed.ready()
                    self._send(200 if ok else 503, "ok\n" if ok else "not ready\n")
                elif path == "/status":
                    body = json.dumps(probed.status(), default=str, indent=1) + "\n"
                    self._send(200, body, "application/json")
                else:
                    self._send(404, "not found\n")

            def _send(self, code: int, body: str, ctype: str = "text/plain") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server_class = type("HealthHTTPServer", (BoundedHTTPServer,),
                            {"address_family": family_for(host)})
        self.server = server_class((host, port), Handler)
        self.server.bound(timeout=timeout, deadline=deadline, max_connections=max_connections)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.server_address[:2]
        return str(host), int(port)

    def start(self) -> HealthServer:
        self._thread = serve_in_thread(self.server, "health")
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
