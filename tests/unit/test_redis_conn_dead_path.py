"""Every Redis call gives up on a silent path within COMMAND_TIMEOUT, and every connection
is closed within DEAD_PATH_SECONDS once its path is lost (warmpool.queue.redis_conn):
keep-alives for an idle one, TCP_USER_TIMEOUT for one with unacknowledged bytes. Checked on
a real socket that redis-py opened with `connect()`'s settings (its handshake left out: the
listener says nothing)."""

from __future__ import annotations

import socket

from warmpool.queue.redis_conn import COMMAND_TIMEOUT, DEAD_PATH_SECONDS, connect


def test_a_connection_carries_the_dead_path_bounds() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        conn = connect(f"redis://127.0.0.1:{port}/0").connection_pool.make_connection()
        sock = conn._connect()  # type: ignore[attr-defined]  # the socket, as configured
        try:
            assert sock.gettimeout() == COMMAND_TIMEOUT  # whatever redis-py's own default
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == \
                DEAD_PATH_SECONDS * 1000
            idle = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
            every = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
            probes = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
            assert idle + every * probes <= DEAD_PATH_SECONDS
        finally:
            sock.close()
