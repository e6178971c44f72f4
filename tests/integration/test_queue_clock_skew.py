"""Workers on hosts whose clocks disagree (issue #19, part 3: many hosts, simulated).

Two worker processes with separate Redis connections, one of them on a wall clock 30 s off
(`tests.clock_skew`: every `time.time()` of that process is shifted, as on a host whose clock
is wrong; its monotonic clock is not). Worker A holds a key (a long probe run); worker B runs
the queue's recovery, which requeues the messages of workers whose heartbeat is older than the
heartbeat timeout (2 s here). Two ways to be wrong, one case each:

- A's clock is behind: stamped with A's own clock, A's heartbeats would look 30 s old to B,
  which would take A for dead and requeue the message A is running;
- B's clock is ahead: every other worker's heartbeat would look 30 s old to B.

Both are proved not to happen by a positive event, never by waiting: a "canary" message sits
in the ack set of a worker that really died a minute ago; the recovery pass that puts it back
(its run shows in the probe's log) is the same pass that judged A, and A must still hold its
message, be alive to the Inspector, and keep its heartbeat. Only B runs recovery passes (A
is started without them, `tests.clock_skew`), so each of the five passes is B's judgement.
Then A is killed: its lease lapses in Redis whatever the clocks say, and B takes the key and
runs it.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pytest
import redis

from tests.redis_server import isolated
from tests.waiting import wait_for
from warmpool.queue.inspect import Inspector
from warmpool.queue.keyed import KeyedQueue
from warmpool.queue.layout import Layout
from warmpool.queue.replies import text
from warmpool.queue.settings import QueueSettings
from workers.probe import RAW_ACTOR, probe_key
from workers.process import WorkerPool

pytestmark = pytest.mark.redis


ROOT = Path(__file__).resolve().parents[2]
SKEW = 30.0  # seconds: far beyond the heartbeat timeout
KEY = "instance/skew/java/1"


@pytest.fixture
def settings(redis_url: str, redis_client: redis.Redis) -> Iterator[QueueSettings]:
    with isolated(redis_url, redis_client, lease_ttl=3.0, heartbeat_timeout=2.0,
                  recovery_period=0.25) as s:
        yield s


def worker(settings: QueueSettings, skew: float, *, recovers: bool) -> WorkerPool:
    """One worker process whose wall clock is `skew` s off. Recovery passes are taken by one
    process per period (a lock) and the first to start would keep taking them; so that the
    pass that judges A is B's, only B runs them (`recovers`)."""
    env = {"WARMPOOL_TEST_CLOCK_SKEW": str(skew), "PYTHONPATH": str(ROOT)}
    if not recovers:
        env["WARMPOOL_TEST_NO_RECOVERY"] = "1"
    return WorkerPool(settings, processes=1, threads=2,
                      modules=("tests.clock_skew", "workers.probe"), env=env)


def server_ms(client: redis.Redis) -> int:
    sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000


def runs(client: redis.Redis, settings: QueueSettings) -> list[list[object]]:
    return [json.loads(text(r)) for r in client.lrange(probe_key(settings, "log"), 0, -1)]


def holders(client: redis.Redis, lo: Layout, message_id: str) -> list[str]:
    """The workers whose ack set holds `message_id` (fetched, not acked)."""
    return [text(k) for k in client.scan_iter(match=lo.acks("*"), count=1000)
            if client.sismember(k, message_id)]


def plant_canary(client: redis.Redis, lo: Layout, settings: QueueSettings, n: int) -> None:
    """A message of the probe's plain dramatiq actor (it counts `probe:raw`), fetched by a
    worker that died a minute ago (on the server's clock): in that worker's ack set, never in
    the queue list, so only a recovery pass can give it to a live worker."""
    dead = f"canary-dead-worker-{n}"
    mid = str(uuid.uuid4())
    message = dramatiq.Message(queue_name=settings.queue_name, actor_name=RAW_ACTOR, args=(),
                               kwargs={}, options={"redis_message_id": mid}, message_id=mid)
    with client.pipeline(transaction=True) as p:
        p.hset(lo.messages, mid, message.encode())
        p.sadd(lo.acks(dead), mid)
        p.zadd(lo.heartbeats, {dead: server_ms(client) - 60_000})
        p.execute()


@pytest.mark.parametrize(("holder_skew", "other_skew"), [(-SKEW, 0.0), (0.0, SKEW)],
                         ids=["holder-clock-behind", "recovering-clock-ahead"])
def test_skewed_clocks_neither_kill_a_live_worker_nor_keep_a_dead_ones_lease(
    settings: QueueSettings, redis_client: redis.Redis, holder_skew: float,
    other_skew: float,
) -> None:
    client, lo = redis_client, Layout.of(settings)
    q = KeyedQueue(client, settings)
    client.hset(probe_key(settings, "hold"), KEY, 120)  # A's run of KEY lasts until A dies
    q.add(KEY)
    held_mid = text(client.lindex(lo.messages_list, -1))
    a = worker(settings, holder_skew, recovers=False).start()
    b: WorkerPool | None = None
    try:
        pid_a = a.pids[0]
        wait_for(lambda: [KEY, pid_a] in [json.loads(text(x)) for x in client.lrange(
            probe_key(settings, "holding"), 0, -1)], timeout=30, message="A holding the key")
        [ack_a] = holders(client, lo, held_mid)
        b = worker(settings, other_skew, recovers=True).start()
        pid_b = b.pids[0]
        inspector = Inspector(client, settings)
        for n in range(5):
            plant_canary(client, lo, settings, n)
            wait_for(lambda n=n: int(client.get(probe_key(settings, "raw")) or 0) == n + 1,
                     timeout=30, message=f"canary {n} put back by a recovery pass and run")
            assert holders(client, lo, held_mid) == [ack_a], (
                f"after canary {n}: A's message was taken from it (A judged dead)")
            queued = [text(m) for m in client.lrange(lo.messages_list, 0, -1)]
            assert held_mid not in queued, f"after canary {n}: A's message requeued"
            alive = {w.worker_id: w.alive for w in inspector.workers()}
            assert len([w for w, ok in alive.items() if ok]) >= 2, alive
        assert all(r[0] != KEY for r in runs(client, settings)), "KEY ran while A held it"

        # A dies: its lease lapses in Redis (a TTL, not a timestamp), B takes the key.
        os.kill(pid_a, signal.SIGKILL)
        record = wait_for(lambda: next((r for r in runs(client, settings) if r[0] == KEY),
                                       None), timeout=30, message="KEY run again by B")
        assert str(record[1]).startswith(f"{pid_b}:"), record
    finally:
        a.stop(timeout=10)
        if b is not None:
            b.stop(timeout=10)
