"""The one HTTP server of the processes' own endpoints (the scheduler's /healthz, /readyz,
/status; the scheduler's and the worker hosts' /metrics), bounded against slow clients.

The standard library's threading servers start one thread per connection, with no limit and
no timeout: a client that opens connections and sends nothing (or a byte now and then) holds
a thread each, forever; on the leading scheduler that exhausts its threads. This server:

- closes a connection that sends nothing for `timeout` seconds (a socket timeout on every
  read and write of the handler);
- closes a connection still open `deadline` seconds after it was accepted, whatever it does
  (a client trickling one header byte per `timeout` would otherwise be served for ever);
- runs at most `max_connections` handlers at once: while all are busy, further connections
  wait in the listen backlog, unaccepted (no thread), until one ends -- at most `deadline`.

So a slow client costs one slot for at most `deadline` seconds, and the others are answered.
Where the endpoint is reachable from is the deployment's (the bind address, and the
NetworkPolicy deploy/base/controller-networkpolicy.yaml).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from http.server import ThreadingHTTPServer
from socketserver import BaseServer
from typing import Any

#: Seconds a connection may stay silent (per read or write).
CONNECTION_TIMEOUT = 5.0
#: Seconds a connection may last in all, from its accept.
CONNECTION_DEADLINE = 15.0
#: Handlers running at once.
MAX_CONNECTIONS = 8
_POLL = 0.5  # seconds between looks at the stop flag while every slot is busy


class BoundedServer:
    """The bounds, mixed into a socketserver threading server (before it in the bases)."""

    daemon_threads = True
    connection_timeout = CONNECTION_TIMEOUT
    connection_deadline = CONNECTION_DEADLINE
    max_connections = MAX_CONNECTIONS

    def bound(self, *, timeout: float | None = None, deadline: float | None = None,
              max_connections: int | None = None) -> None:
        """Set the bounds (before serving); None keeps the default."""
        if timeout is not None:
            self.connection_timeout = timeout
        if deadline is not None:
            self.connection_deadline = deadline
        if max_connections is not None:
            self.max_connections = max_connections
        if not (self.connection_timeout > 0 and self.connection_deadline > 0
                and self.max_connections > 0):
            raise ValueError("timeout, deadline and max_connections must be > 0")
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._closing = threading.Event()

    def _slots_ready(self) -> threading.BoundedSemaphore:
        if not hasattr(self, "_slots"):
            self.bound()
        return self._slots

    def get_request(self) -> tuple[Any, Any]:
        """Accept only with a free slot; otherwise leave the connection in the backlog.

        Raising OSError makes socketserver skip this round (its accept-failure path), so a
        shutdown is noticed within _POLL seconds even while every slot is held."""
        slots = self._slots_ready()
        while not slots.acquire(timeout=_POLL):
            if self._closing.is_set():
                raise OSError("shutting down")
        try:
            conn, addr = super().get_request()  # type: ignore[misc]
        except BaseException:
            slots.release()
            raise
        conn.settimeout(self.connection_timeout)
        return conn, addr

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request(request, client_address)  # type: ignore[misc]
        except BaseException:
            self._slots.release()  # no thread started: its slot is free again
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        cut = threading.Timer(self.connection_deadline, _cut, args=(request,))
        cut.daemon = True
        cut.start()
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            cut.cancel()
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A timed-out or cut client is no error of ours: not a traceback on stderr."""

    def shutdown(self) -> None:
        self._slots_ready()
        self._closing.set()
        super().shutdown()  # type: ignore[misc]


def _cut(request: socket.socket) -> None:
    """End a connection past its deadline: its handler's next read or write fails."""
    with contextlib.suppress(OSError):  # already closed
        request.shutdown(socket.SHUT_RDWR)


class BoundedHTTPServer(BoundedServer, ThreadingHTTPServer):
    """`http.server.ThreadingHTTPServer` with the bounds above."""


def family_for(host: str) -> socket.AddressFamily:
    """IPv6 for an IPv6 literal or a name that only resolves to IPv6; IPv4 otherwise."""
    try:
        infos = socket.getaddrinfo(host or None, 0, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except OSError:
        return socket.AF_INET
    families = [info[0] for info in infos]
    return socket.AF_INET if socket.AF_INET in families or not families else families[0]


def serve_in_thread(server: BaseServer, name: str) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    return thread
