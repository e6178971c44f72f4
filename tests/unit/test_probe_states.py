"""A URL probe's state between the runs of its key, in Redis (fakeredis: Redis logic only)."""

from __future__ import annotations

import fakeredis

from warmpool.controller.availability import ProbeState
from workers.probe_states import RedisProbeStates


def test_a_state_round_trips_expires_and_is_dropped() -> None:
    client = fakeredis.FakeRedis()
    states = RedisProbeStates(client, "t:")
    assert states.get("ns1", "uid-1") is None
    states.put("ns1", "uid-1", ProbeState(3, True, 1234), ttl=60)
    assert states.get("ns1", "uid-1") == ProbeState(3, True, 1234)
    assert states.get("ns1", "uid-2") is None  # by uid: a re-created Session starts anew
    assert 0 < client.pttl("t:probe-state:ns1/uid-1") <= 60_000
    states.drop("ns1", "uid-1")
    assert states.get("ns1", "uid-1") is None
    assert states.now_ms() > 1_600_000_000_000  # the Redis server's clock, in ms


def test_a_state_someone_else_wrote_is_read_as_none() -> None:
    client = fakeredis.FakeRedis()
    states = RedisProbeStates(client, "t:")
    for bad in ({"attempt": "x", "primed": "0", "due": "1"},
                {"attempt": "0", "primed": "0", "due": "1"},
                {"attempt": "1", "primed": "yes", "due": "1"},
                {"attempt": "1", "primed": "1", "due": "9" * 30}):
        client.delete("t:probe-state:ns1/u")
        client.hset("t:probe-state:ns1/u", mapping=bad)
        assert states.get("ns1", "u") is None, bad
