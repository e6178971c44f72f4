"""Imported first by a controller process on this host, which has no kube-proxy: connections
to a Service's cluster IP reach nothing here. With `WARMPOOL_TEST_SERVICE_PORTS` ("3001,3002"),
a TCP connection to a non-loopback address on one of those ports goes to the same port on
127.0.0.1 instead (what kube-proxy's DNAT does for a Service whose endpoint is local), and the
address dialled is appended to `WARMPOOL_TEST_DIAL_LOG` ("<ip> <port>" a line), so a test can
say which Service the process tried to reach. Every other connection is left alone.

Loaded through a `sitecustomize` the test writes (see tests/integration/test_timeout_clocks.py),
together with `tests.clock_skew`, so that `python -m scheduler` needs no option for it."""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

_PORTS = frozenset(int(p) for p in os.environ.get("WARMPOOL_TEST_SERVICE_PORTS", "").split(",")
                   if p.strip())
_LOG = os.environ.get("WARMPOOL_TEST_DIAL_LOG", "")

if _PORTS:
    _real = socket.create_connection
    _lock = threading.Lock()

    def _routed(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        host, port = address[0], int(address[1])
        if port in _PORTS and host not in ("127.0.0.1", "localhost", "::1"):
            if _LOG:
                with _lock, open(_LOG, "a") as log:
                    log.write(f"{host} {port}\n")
            address = ("127.0.0.1", port)
        return _real(address, *args, **kwargs)

    socket.create_connection = _routed  # type: ignore[assignment]
