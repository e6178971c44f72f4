"""The severable TCP proxy (warmpool.testing.tcpproxy) against a loopback echo server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from warmpool.testing.tcpproxy import TcpProxy


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
