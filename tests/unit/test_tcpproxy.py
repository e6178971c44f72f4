"""The severable TCP proxy (warmpool.testing.tcpproxy) against a loopback echo server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from warmpool.testing.tcpproxy import TcpProxy
from warmpool.testing.waiting import wait_for


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[:2]
    stop.set()
    server.close()


def roundtrip(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(payload)
        return s.recv(4096)


def test_relays_then_severs_then_heals(echo: tuple[str, int]) -> None:
    with TcpProxy(echo) as link:
        assert roundtrip(link.port, b"ping") == b"ping"
        held = socket.create_connection(("127.0.0.1", link.port), timeout=5)
        held.sendall(b"a")
        assert held.recv(10) == b"a"
        assert link.sever() == 1  # the open connection is cut ...
        assert held.recv(10) == b""  # ... the client sees the end of the stream
        held.close()
        with pytest.raises(OSError):  # new ones are closed on accept: nothing comes back
            reply = roundtrip(link.port, b"lost")
            if not reply:
                raise ConnectionResetError("closed")
        link.heal()
        assert roundtrip(link.port, b"again") == b"again"
        stats = link.stats()
        assert stats["cut"] == 1 and stats["refused"] == 1 and stats["relayed"] == 3


def test_a_stall_keeps_connections_open_and_answers_nothing_until_healed(
        echo: tuple[str, int]) -> None:
    with TcpProxy(echo) as link:
        held = socket.create_connection(("127.0.0.1", link.port), timeout=5)
        held.sendall(b"a")
        assert held.recv(10) == b"a"
        link.stall()  # both ways
        held.sendall(b"b")
        held.settimeout(0.3)  # a client's own timeout is what notices a silent link
        with pytest.raises(TimeoutError):
            held.recv(10)
        fresh = socket.create_connection(("127.0.0.1", link.port), timeout=5)  # accepted
        fresh.sendall(b"c")
        fresh.settimeout(0.3)
        with pytest.raises(TimeoutError):
            fresh.recv(10)
        assert link.open_connections() == 2 and link.stats().get("cut", 0) == 0
        link.heal()  # what was held flows on, in order
        held.settimeout(5)
        fresh.settimeout(5)
        assert held.recv(10) == b"b"
        assert fresh.recv(10) == b"c"
        held.close()
        fresh.close()


def test_a_one_way_stall_lets_requests_through_and_holds_the_replies() -> None:
    """"down" stalled: the server gets the request (and acts), the client hears nothing."""
    server = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(4096):
                got.append(data)
                conn.sendall(b"ok:" + data)

    threading.Thread(target=serve, daemon=True).start()
    with TcpProxy(server.getsockname()[:2]) as link:
        link.stall("down")
        client = socket.create_connection(("127.0.0.1", link.port), timeout=5)
        client.sendall(b"write")
        wait_for(lambda: got == [b"write"], timeout=5, message="the request at the server")
        client.settimeout(0.3)
        with pytest.raises(TimeoutError):
            client.recv(10)
        link.heal()
        client.settimeout(5)
        assert client.recv(10) == b"ok:write"
        client.close()
    server.close()


def test_a_delay_forwards_each_chunk_no_sooner_than_its_time(echo: tuple[str, int]) -> None:
    with TcpProxy(echo) as link:
        link.delay(0.2)
        start = time.monotonic()
        assert roundtrip(link.port, b"slow") == b"slow"
        assert time.monotonic() - start >= 0.4  # 0.2 s each way, never less
        with pytest.raises(ValueError):
            link.delay(-1)
        with pytest.raises(ValueError):
            link.stall("sideways")
