"""The dramatiq side: middleware hooks, the ack folded into `done`, and dramatiq's own
maintenance run with our heartbeat timeout -- driven by hand on fakeredis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis
from dramatiq.message import Message
from dramatiq.middleware import SkipMessage

from warmpool.queue.broker import keyed_middleware
from warmpool.queue.jobs import current_job
from warmpool.queue.maintenance import Maintenance
from warmpool.queue.middleware import KeyedMiddleware, is_acked
from warmpool.queue.settings import QueueSettings
from workers import runtime
from workers.runtime import build_worker_broker

KEY = "instance/ns/app/1"


@pytest.fixture
def broker(client: redis.Redis) -> Iterator[RedisBroker]:
    # No handlers registered while the broker is built: a test module that imported
    # workers.handlers (the CLI's in-process tests) would otherwise have its hook start a
    # Kubernetes cache here.
    with runtime.using({}):
        yield build_worker_broker(QueueSettings(redis_url="redis://unused"), client=client)


@pytest.fixture
def mw(broker: RedisBroker) -> KeyedMiddleware:
    return keyed_middleware(broker)


def fetch(broker: RedisBroker) -> MessageProxy:
    """What dramatiq's consumer does: the fetch command moves the id into this worker's acks."""
    (data,) = broker.do_fetch("warmpool", 1)
    return MessageProxy(Message.decode(data))


def test_keyed_delivery_is_run_under_lease_and_acked_by_done(
    broker: RedisBroker, mw: KeyedMiddleware, client: redis.Redis
) -> None:
    mw.jobs.queue.add(KEY)
    msg = fetch(broker)
    assert msg.actor_name == "reconcile_instance"
    lo = mw.jobs.queue.layout
    acks = lo.acks(broker.broker_id)
    assert client.scard(acks) == 1
    mw.before_process_message(broker, msg)
    assert current_job().key == KEY
    mw.after_process_message(broker, msg)
    assert is_acked(msg)
    assert client.scard(acks) == 0 and client.hlen(lo.messages) == 0
    assert client.get(lo.lease(KEY)) is None
    with pytest.raises(RuntimeError):
        current_job()


def test_failed_job_is_acked_and_retried_per_key(
    broker: RedisBroker, mw: KeyedMiddleware, client: redis.Redis
) -> None:
    mw.jobs.queue.add(KEY)
    msg = fetch(broker)
    mw.before_process_message(broker, msg)
    mw.after_process_message(broker, msg, exception=ValueError("bad"))
    lo = mw.jobs.queue.layout
    assert is_acked(msg) and client.hlen(lo.messages) == 0
    assert client.zscore(lo.delayed, KEY) is not None
    assert b"ValueError: bad" in client.hget(lo.errors, KEY)


def test_busy_and_stale_deliveries_are_skipped(
    broker: RedisBroker, mw: KeyedMiddleware, client: redis.Redis
) -> None:
    mw.jobs.queue.add(KEY)
    lease = mw.jobs.acquire(KEY)
    msg = fetch(broker)
    with pytest.raises(SkipMessage):
        mw.before_process_message(broker, msg)
    assert is_acked(msg)  # by the start script
    mw.after_skip_message(broker, msg)  # nothing held: nothing to do
    assert client.hlen(mw.jobs.queue.layout.messages) == 0
    assert lease is not None
    assert mw.jobs.release(lease).rerun  # still dirty: re-enqueued
    msg = fetch(broker)
    mw.before_process_message(broker, msg)
    mw.after_process_message(broker, msg)
    rid, body = mw.jobs.messages.body(KEY)  # a stray duplicate
    client.hset(mw.jobs.queue.layout.messages, rid, body)
    client.rpush(mw.jobs.queue.layout.messages_list, rid)
    with pytest.raises(SkipMessage):
        mw.before_process_message(broker, fetch(broker))


def test_release_while_a_delivery_is_in_flight_does_not_duplicate(
    broker: RedisBroker, mw: KeyedMiddleware, client: redis.Redis
) -> None:
    mw.jobs.queue.add(KEY)
    lease = mw.jobs.acquire(KEY)
    assert lease is not None
    msg = fetch(broker)  # prefetched by a consumer, not yet processed
    assert mw.jobs.release(lease).rerun
    assert client.llen(mw.jobs.queue.layout.messages_list) == 0  # no second message
    mw.before_process_message(broker, msg)  # it finds the key free
    mw.after_process_message(broker, msg)
    assert client.scard(mw.jobs.queue.layout.dirty) == 0


def test_skip_by_a_later_middleware_gives_the_key_back(
    broker: RedisBroker, mw: KeyedMiddleware, client: redis.Redis
) -> None:
    mw.jobs.queue.add(KEY)
    msg = fetch(broker)
    mw.before_process_message(broker, msg)
    mw.after_skip_message(broker, msg)
    lo = mw.jobs.queue.layout
    assert client.get(lo.lease(KEY)) is None
    assert client.sismember(lo.dirty, KEY) and client.llen(lo.messages_list) == 1


def test_plain_actors_are_left_alone(broker: RedisBroker, mw: KeyedMiddleware) -> None:
    import dramatiq

    dramatiq.actor(lambda: None, actor_name="plain", queue_name="warmpool", broker=broker)
    msg = MessageProxy(Message("warmpool", "plain", (), {}, {"redis_message_id": "r"}))
    mw.before_process_message(broker, msg)
    mw.after_process_message(broker, msg)
    assert not is_acked(msg)


def test_dead_workers_messages_requeued_with_short_heartbeat_timeout(
    broker: RedisBroker, mw: KeyedMiddleware, client: redis.Redis
) -> None:
    lo = mw.jobs.queue.layout
    mw.jobs.queue.add(KEY)
    client.lpop(lo.messages_list)  # fetched by a worker that then died...
    (rid,) = client.hkeys(lo.messages)
    client.sadd(lo.acks("dead-worker"), rid)
    stale = current_millis() - broker.heartbeat_timeout - 1000
    client.zadd(lo.heartbeats, {"dead-worker": stale})
    Maintenance(mw.jobs, broker).requeue_dead_workers()
    assert client.lrange(lo.messages_list, 0, -1) == [rid]
    assert client.scard(lo.acks("dead-worker")) == 0
    assert client.zscore(lo.heartbeats, "dead-worker") is None


CLAIM = "session/ns/s1"


def fetch_from(broker: RedisBroker, queue: str) -> MessageProxy:
    (data,) = broker.do_fetch(queue, 1)
    return MessageProxy(Message.decode(data))


def test_claim_delivery_is_acked_on_the_claims_queue(
    broker: RedisBroker, mw: KeyedMiddleware, client: redis.Redis
) -> None:
    lo = mw.jobs.queue.layout
    mw.jobs.queue.add(CLAIM)
    assert client.llen(lo.messages_list) == 0
    msg = fetch_from(broker, lo.claims_queue)
    assert (msg.actor_name, msg.queue_name) == ("claim_session", lo.claims_queue)
    mw.before_process_message(broker, msg)
    mw.after_process_message(broker, msg)
    assert is_acked(msg)
    assert client.scard(lo.acks(broker.broker_id, lo.claims_queue)) == 0
    assert client.hlen(lo.claims_messages) == 0 and client.scard(lo.dirty) == 0


def test_shutdown_gives_back_prefetched_messages_of_both_queues(
    broker: RedisBroker, mw: KeyedMiddleware, client: redis.Redis
) -> None:
    lo = mw.jobs.queue.layout
    mw.jobs.queue.add_many([KEY, CLAIM])
    fetch(broker)
    fetch_from(broker, lo.claims_queue)
    assert client.llen(lo.messages_list) == client.llen(lo.claims_messages_list) == 0
    mw.after_worker_shutdown(broker, None)  # type: ignore[arg-type]
    assert client.llen(lo.messages_list) == client.llen(lo.claims_messages_list) == 1
    for queue in lo.queues:
        assert client.scard(lo.acks(broker.broker_id, queue)) == 0


def test_dead_workers_claims_are_requeued_too(
    broker: RedisBroker, mw: KeyedMiddleware, client: redis.Redis
) -> None:
    lo = mw.jobs.queue.layout
    mw.jobs.queue.add(CLAIM)
    rid = client.lpop(lo.claims_messages_list)
    client.sadd(lo.acks("dead-worker", lo.claims_queue), rid)
    client.zadd(lo.heartbeats, {"dead-worker": current_millis() - broker.heartbeat_timeout - 1})
    Maintenance(mw.jobs, broker).requeue_dead_workers()
    assert client.lrange(lo.claims_messages_list, 0, -1) == [rid]


def test_rejected_claims_message_is_dead_lettered_in_the_main_queue(
    broker: RedisBroker, mw: KeyedMiddleware, client: redis.Redis
) -> None:
    lo = mw.jobs.queue.layout
    mw.jobs.queue.add(CLAIM)
    consumer = broker.consume(lo.claims_queue, prefetch=1, timeout=100)
    msg = next(consumer)
    assert msg is not None and msg.args == (CLAIM,)
    consumer.nack(msg)  # what dramatiq does with a message it failed (e.g. unknown actor)
    assert client.zcard(lo.xq) == 1 and client.hexists(lo.xq_messages, msg.options[
        "redis_message_id"])
    assert client.hlen(lo.claims_messages) == 0
    assert client.scard(lo.acks(broker.broker_id, lo.claims_queue)) == 0
    (dead,) = mw.jobs.queue.list_dead()
    assert dead.key == CLAIM
