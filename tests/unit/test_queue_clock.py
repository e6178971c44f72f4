"""`ServerClock`: the server's time carried forward on the monotonic clock (fakeredis)."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest
import redis

from warmpool.queue.clock import ServerClock


class Server:
    """A Redis whose TIME the test sets, counting the readings."""

    def __init__(self) -> None:
        self.ms = 1_700_000_000_000
        self.reads = 0
        self.down = False

    def time(self) -> tuple[int, int]:
        if self.down:
            raise redis.ConnectionError("down")
        self.reads += 1
        return self.ms // 1000, (self.ms % 1000) * 1000


def test_readings_follow_the_monotonic_clock_between_syncs() -> None:
    server, mono = Server(), [100.0]
    clock = ServerClock(server, refresh=60.0, monotonic=lambda: mono[0])  # type: ignore[arg-type]
    assert clock.now_ms() == server.ms
    mono[0] += 2.5
    assert clock.now_ms() == server.ms + 2500
    assert server.reads == 1  # no round trip per reading


def test_it_reads_the_server_again_after_refresh_seconds() -> None:
    server, mono = Server(), [0.0]
    clock = ServerClock(server, refresh=60.0, monotonic=lambda: mono[0])  # type: ignore[arg-type]
    clock.now_ms()
    server.ms += 61_000 + 40  # the server's clock ran 40 ms faster than ours
    mono[0] += 61.0
    assert clock.now_ms() == server.ms
    assert server.reads == 2


def test_an_unreachable_server_carries_the_last_reading_forward() -> None:
    server, mono = Server(), [0.0]
    clock = ServerClock(server, refresh=1.0, monotonic=lambda: mono[0])  # type: ignore[arg-type]
    start = clock.now_ms()
    server.down = True
    mono[0] += 5.0
    assert clock.now_ms() == start + 5000
    fresh = ServerClock(server)  # type: ignore[arg-type]
    with pytest.raises(redis.ConnectionError):
        fresh.now_ms()  # nothing to carry forward


def test_on_a_real_client_it_agrees_with_time() -> None:
    client: Any = fakeredis.FakeRedis()
    sec, usec = client.time()
    assert abs(ServerClock(client).now_ms() - (int(sec) * 1000 + int(usec) // 1000)) < 1000
