"""Issue #27, point 6: the scheduler's /healthz, /readyz, /status and the /metrics endpoints
(scheduler and worker hosts) against slow clients, on real sockets.

Before: one thread per connection, no timeout; a client that connected and sent nothing held
a thread of the leading scheduler for ever, and enough of them exhausted its threads. Now a
silent connection is closed after the server's timeout, a trickling one at its deadline,
and at most `max_connections` handlers run at once while the others are still answered.
"""

from __future__ import annotations

import socket
import threading
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from metrics.exposition import MetricsServer
from tests.waiting import wait_for
from warmpool.health import HealthServer

TIMEOUT = 0.5  # the servers' per-read timeout here (the default is 5 s)
DEADLINE = 2.0  # a connection's whole life here (the default is 15 s)
SLOTS = 2
PATIENCE = 30.0  # how long the test's own client waits for anything: never reached when right


class Probed:
    def healthy(self) -> bool:
        return True

    def ready(self) -> bool:
        return True

    def status(self) -> dict[str, Any]:
        return {"leader": True}


def start_health() -> tuple[str, int, Callable[[], None]]:
    server = HealthServer(Probed(), "127.0.0.1", 0, timeout=TIMEOUT, deadline=DEADLINE,
                          max_connections=SLOTS).start()
    host, port = server.address
    return host, port, server.stop


def start_metrics() -> tuple[str, int, Callable[[], None]]:
    registry = CollectorRegistry()
    Counter("warmpool_test_total", "a series", registry=registry).inc()
    server = MetricsServer(registry, "127.0.0.1", 0, timeout=TIMEOUT, deadline=DEADLINE,
                           max_connections=SLOTS).start()
    host, port = server.address
    return host, port, server.stop


@pytest.fixture(params=[("health", "/healthz"), ("metrics", "/metrics")], ids=lambda p: p[0])
def endpoint(request: pytest.FixtureRequest) -> Iterator[tuple[str, int, str]]:
    kind, path = request.param
    host, port, stop = (start_health if kind == "health" else start_metrics)()
    yield host, port, path
    stop()


def get(host: str, port: int, path: str) -> int:
    with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=PATIENCE) as resp:
        resp.read()
        return int(resp.status)


def silent(host: str, port: int) -> socket.socket:
    """A client that connects and sends nothing."""
    sock = socket.create_connection((host, port), timeout=PATIENCE)
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """Blocks until the server ends the connection (or PATIENCE passes: then False)."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def handler_threads() -> int:
    return sum(1 for t in threading.enumerate() if "process_request_thread" in t.name)


def test_a_silent_client_is_closed_and_others_are_answered(
    endpoint: tuple[str, int, str],
) -> None:
    host, port, path = endpoint
    with silent(host, port) as slow:
        assert get(host, port, path) == 200  # answered while the silent one is connected
        assert closed_by_server(slow), "the silent connection was never closed"
    assert get(host, port, path) == 200


def test_more_silent_clients_than_slots_hold_no_more_threads_and_delay_others_briefly(
    endpoint: tuple[str, int, str],
) -> None:
    """Ten silent clients against two slots: never more than two handler threads; a request
    behind them waits in the backlog until a slot frees (one timeout), and is answered."""
    host, port, path = endpoint
    before = handler_threads()
    with ExitStack() as stack:
        slow = [stack.enter_context(silent(host, port)) for _ in range(10)]
        seen: list[int] = []
        answered = threading.Event()

        def request() -> None:
            seen.append(get(host, port, path))
            answered.set()

        threading.Thread(target=request, daemon=True).start()
        while not answered.wait(0.05):
            assert handler_threads() - before <= SLOTS
        assert seen == [200]
        assert all(closed_by_server(s) for s in slow), "a silent connection stayed open"
    wait_for(lambda: handler_threads() == before, timeout=PATIENCE,
             message="the handler threads end with their connections")


def test_a_trickling_client_is_cut_at_its_deadline(endpoint: tuple[str, int, str]) -> None:
    """One header byte well within each timeout, never a whole request: the connection ends
    at the server's deadline, and the endpoint still answers."""
    host, port, path = endpoint
    pace = threading.Event()
    with socket.create_connection((host, port), timeout=PATIENCE) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nX-Slow: ".encode())
        cut = False
        for _ in range(int(PATIENCE / (TIMEOUT / 5))):
            try:
                sock.sendall(b"a")
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            sock.settimeout(0.0)
            try:
                if sock.recv(1024) == b"":
                    cut = True
                    break
            except BlockingIOError:
                pass
            except ConnectionResetError:
                cut = True
                break
            finally:
                sock.settimeout(PATIENCE)
            pace.wait(TIMEOUT / 5)  # the client's pace: a byte well within each timeout
        assert cut, "a trickling client was served past the deadline"
    assert get(host, port, path) == 200


def test_a_stopped_server_stops_even_with_every_slot_held() -> None:
    host, port, stop = start_health()
    with ExitStack() as stack:
        for _ in range(SLOTS + 3):
            stack.enter_context(silent(host, port))
        done = threading.Event()
        threading.Thread(target=lambda: (stop(), done.set()), daemon=True).start()
        assert done.wait(PATIENCE), "stop() hung while every slot was held"
