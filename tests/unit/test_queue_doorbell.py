"""The doorbell (issue #28, deliverable 4): scripts ring on every enqueue and delayed add, and
an idle consumer or promoter whose fallback is far away (600 s here) still wakes for it.

The ringing is checked on fakeredis (real Lua); the waking on the test Redis, with threads.
No test times anything: each waits for what must happen with a bounded wait, and a fallback
of ten minutes makes a wake that came from polling impossible within it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator

import fakeredis
import pytest
import redis

from tests.waiting import wait_for
from warmpool.queue.broker import KeyedRedisBroker, _Consumer, build_broker, keyed_middleware
from warmpool.queue.doorbell import Doorbell, parse_ring
from warmpool.queue.jobs import JobContext, Jobs
from warmpool.queue.maintenance import Maintenance
from warmpool.queue.redis_conn import connect
from warmpool.queue.settings import QueueSettings

LONG = 600.0  # a fallback no bounded wait of these tests comes near


def rings(client: redis.Redis, channel: str) -> Iterator[list[str]]:
    """A subscriber on fakeredis; the list it yields fills with the payloads rung so far
    (read when the generator is advanced)."""
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel)
    seen: list[str] = []
    while True:
        while (m := pubsub.get_message()) is not None:
            seen.append(m["data"].decode())
        yield seen


@pytest.fixture
def fake_jobs() -> Jobs:
    return Jobs(fakeredis.FakeRedis(), QueueSettings(redis_url="redis://unused"),
                router=lambda key: "job")


# --- the scripts ring ---------------------------------------------------------------------


def test_an_enqueue_rings_its_list_once_per_call(fake_jobs: Jobs) -> None:
    lo = fake_jobs.queue.layout
    heard = rings(fake_jobs.client, lo.doorbell_channel)
    next(heard)
    fake_jobs.queue.add_many(["a", "b", "c", "session/ns/s1"])
    assert sorted(next(heard)) == sorted([lo.messages_list, lo.claims_messages_list])
    fake_jobs.queue.add("a")  # deduplicated: nothing written, nothing rung
    assert len(next(heard)) == 2


def test_a_delayed_add_rings_its_ready_time(fake_jobs: Jobs) -> None:
    lo = fake_jobs.queue.layout
    heard = rings(fake_jobs.client, lo.doorbell_channel)
    next(heard)
    assert fake_jobs.queue.add_after("k", 5.0) == "delayed"
    (payload,) = next(heard)
    score = fake_jobs.client.zscore(lo.delayed, "k")
    assert parse_ring(payload) == (None, int(score))


def test_a_failed_run_rings_its_retry_time(
    jobs: Jobs, started_job: Callable[[str], JobContext],
) -> None:
    lo = jobs.queue.layout
    ctx = started_job("k")
    heard = rings(jobs.client, lo.doorbell_channel)
    next(heard)
    jobs.finish(ctx, RuntimeError("boom"))  # retried after backoff_base: a delayed key
    (payload,) = next(heard)
    assert parse_ring(payload) == (None, int(jobs.client.zscore(lo.delayed, "k")))


def test_a_released_lease_rings_for_the_keys_parked_on_it(
    jobs: Jobs, started_job: Callable[[str], JobContext],
) -> None:
    """A parked claim (issue #28) is due when the lease it waits for is released: the
    promoters must hear it then, not at the claim's fallback a lease TTL later."""
    lo = jobs.queue.layout
    holder = started_job("instance/ns/java/1")
    claim = started_job("session/ns/s1")
    heard = rings(jobs.client, lo.doorbell_channel)
    next(heard)
    assert claim.park("instance/ns/java/1", 60) == "parked"
    jobs.finish(claim)
    assert len(next(heard)) == 1  # the park rang its fallback
    jobs.finish(holder)
    fallback, released = next(heard)
    assert parse_ring(released) == (None, int(jobs.client.zscore(lo.delayed, "session/ns/s1")))
    assert parse_ring(released)[1] < parse_ring(fallback)[1]  # due now, not at the fallback


def test_parse_ring_tells_lists_from_ready_times_and_ignores_the_rest() -> None:
    assert parse_ring("dramatiq:warmpool") == ("dramatiq:warmpool", None)
    assert parse_ring("1700000000123") == (None, 1700000000123)
    assert parse_ring("hello") == (None, None)
    assert parse_ring("9" * 40) == (None, None)


def test_a_ring_sets_its_lists_event_and_the_earliest_due_time() -> None:
    bell = Doorbell(fakeredis.FakeRedis(), "c")
    bell.ring("ns:q")
    assert bell.event("ns:q").is_set() and not bell.event("ns:other").is_set()
    bell.ring("200")
    bell.ring("100")
    bell.ring("300")
    assert bell.delayed.is_set()
    assert bell.take_due() == 100 and bell.take_due() is None


def test_without_a_subscription_a_wait_returns_at_once_so_the_caller_polls() -> None:
    bell = Doorbell(fakeredis.FakeRedis(), "c")
    assert bell.wait("ns:q", LONG) is False


def test_the_setting_turns_the_doorbell_off_at_or_below_the_poll_timeout() -> None:
    assert QueueSettings().doorbell  # on by default: less CPU under churn (settings.py)
    assert QueueSettings(idle_poll_timeout=1.0).doorbell
    assert not QueueSettings(idle_poll_timeout=0.02).doorbell
    broker = build_broker(QueueSettings(idle_poll_timeout=0.02), client=fakeredis.FakeRedis())
    assert isinstance(broker, KeyedRedisBroker) and broker.doorbell is None


# --- idle waiters wake (the test Redis, real threads) ------------------------------------


@pytest.fixture
def long_idle(queue_settings: QueueSettings) -> QueueSettings:
    """Fallbacks and periodic tasks ten minutes away: only a ring can wake anything."""
    return queue_settings.replace(idle_poll_timeout=LONG, recovery_period=LONG,
                                  audit_period=LONG, epoch_period=LONG)


@pytest.fixture
def broker(long_idle: QueueSettings, redis_url: str) -> Iterator[KeyedRedisBroker]:
    b = build_broker(long_idle, client=connect(redis_url), router=lambda key: "job")
    assert isinstance(b, KeyedRedisBroker) and b.doorbell is not None
    b.doorbell.start()
    wait_for(lambda: b.doorbell is not None and b.doorbell.listening, 10,
             message="the doorbell never subscribed")
    yield b
    b.doorbell.stop()
    b.client.close()


def entered_wait(bell: Doorbell) -> threading.Event:
    """An event set each time someone starts waiting on `bell` (so a test adds only then)."""
    entered = threading.Event()
    original = bell.wait

    def wait(list_name: str, timeout: float) -> bool:
        entered.set()
        return original(list_name, timeout)

    bell.wait = wait  # type: ignore[method-assign]
    return entered


def consuming(consumer: _Consumer) -> tuple[threading.Thread, list[object]]:
    """A thread calling `next(consumer)` until one message comes, and the list it puts that
    message's key in."""
    got: list[object] = []

    def consume() -> None:
        while not got:
            message = next(consumer)
            if message is not None:
                got.append(message.args[0])

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    return thread, got


def test_an_idle_consumer_wakes_on_an_enqueue_without_waiting_out_its_fallback(
    broker: KeyedRedisBroker, long_idle: QueueSettings,
) -> None:
    assert broker.doorbell is not None
    entered = entered_wait(broker.doorbell)
    consumer = broker.consume(long_idle.queue_name, prefetch=1, timeout=int(LONG * 1000))
    assert isinstance(consumer, _Consumer)
    consumer.misses = 32  # long idle: dramatiq's own backoff would now sleep `timeout`
    thread, got = consuming(consumer)
    assert entered.wait(10), "the consumer never went idle"
    keyed_middleware(broker).jobs.queue.add("k1")
    thread.join(30)
    assert got == ["k1"]


def test_the_promoter_wakes_for_a_delayed_add_and_sleeps_otherwise(
    broker: KeyedRedisBroker,
) -> None:
    jobs = keyed_middleware(broker).jobs
    maintenance = Maintenance(jobs, broker)
    ticks: list[int] = []
    tick = maintenance.tick

    def counted() -> None:
        tick()
        ticks.append(1)

    maintenance.tick = counted  # type: ignore[method-assign]
    maintenance.start()
    try:
        wait_for(lambda: ticks, 10, message="maintenance never ticked")
        assert jobs.queue.add_after("k1", 0.5) == "delayed"
        wait_for(lambda: jobs.client.sismember(jobs.queue.layout.dirty, "k1"), 30,
                 message="the delayed key was never promoted")
    finally:
        maintenance.stop()
    # Polling every 20 ms would have ticked ~25 times over the 0.5 s delay; the doorbell
    # ticks at the start, then at the ready time (and maybe once more around it).
    assert len(ticks) <= 4, ticks


def test_the_subscriber_comes_back_after_its_connection_is_killed(
    redis_url: str, redis_client: redis.Redis,
) -> None:
    name = f"doorbell-{uuid.uuid4().hex[:8]}"
    channel = f"t{uuid.uuid4().hex[:8]}:doorbell"
    bell = Doorbell(connect(redis_url, client_name=name), channel, retry_delay=0.1)
    bell.start()
    try:
        wait_for(lambda: bell.listening, 10, message="never subscribed")
        killed = 0
        for client in redis_client.client_list():
            if client.get("name") == name:
                killed += redis_client.client_kill_filter(_id=client["id"])
        assert killed

        def heard() -> bool:
            bell.arm("ns:q")
            redis_client.publish(channel, "ns:q")
            return bell.event("ns:q").wait(0.2)

        wait_for(heard, 30, message="no ring heard after the connection was killed")
        assert bell._thread is not None and bell._thread.is_alive()
    finally:
        bell.stop()
    assert bell._thread is None and not bell.listening


# --- a full consumer waits for room (issue #28: no polling while its prefetch is full) ----


def test_a_full_consumer_waits_for_an_ack_and_fetches_right_after_it(
    broker: KeyedRedisBroker, long_idle: QueueSettings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Prefetch 1, one message held: `next` neither polls nor returns until the held one is
    acked; then the next message is fetched. The fallback (`ROOM_FALLBACK`) is set ten
    minutes away, so only the ack can have woken it."""
    monkeypatch.setattr("warmpool.queue.broker.ROOM_FALLBACK", LONG)
    jobs = keyed_middleware(broker).jobs
    jobs.queue.add_many(["k1", "k2"])
    consumer = broker.consume(long_idle.queue_name, prefetch=1, timeout=20)
    assert isinstance(consumer, _Consumer)
    first = None
    while first is None:
        first = next(consumer)
    fetches: list[int] = []
    fetch = broker.do_fetch

    def counted(queue: str, room: int) -> list[bytes]:
        fetches.append(room)
        return fetch(queue, room)

    broker.do_fetch = counted  # type: ignore[method-assign]
    thread, got = consuming(consumer)
    wait_for(lambda: bool(consumer._room._waiters), 10,  # type: ignore[attr-defined]
             message="the full consumer never waited for room")
    assert fetches == [] and got == []  # full: no fetch, nothing delivered
    consumer.ack(first)
    thread.join(30)
    assert not thread.is_alive(), "the ack did not wake the full consumer"
    assert got == [{"k1", "k2"}.difference({first.args[0]}).pop()]
    assert fetches == [1]
