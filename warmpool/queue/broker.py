"""The dramatiq broker for keyed work: dramatiq's RedisBroker, standard layout, our middleware.

Differences from dramatiq's defaults, and why:
  * keyed deliveries are acked by the script that releases the key (see `_Consumer`);
  * no Retries middleware: failures are retried per key with millisecond backoff by the
    keyed protocol (dramatiq's would wait >= 15 s and retry the message, not the key);
  * `heartbeat_timeout` from our settings (5 s instead of 60 s), used when maintenance
    requeues dead workers' messages;
  * KeyedMiddleware first (see its docstring);
  * a rejected (nacked) claims message is dead-lettered in the main queue's `.XQ`.
"""

from __future__ import annotations

import logging

import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import q_name
from dramatiq.errors import ConnectionClosed
from dramatiq.middleware import AgeLimit, Callbacks, Pipelines, ShutdownNotifications, TimeLimit

from warmpool.queue.jobs import Jobs
from warmpool.queue.middleware import KeyedMiddleware, is_acked
from warmpool.queue.observer import QueueObserver
from warmpool.queue.redis_conn import connect
from warmpool.queue.routing import Router, actor_for_key
from warmpool.queue.settings import QueueSettings

DEAD_MESSAGE_TTL_MS = 7 * 24 * 3600 * 1000


class _QuietSkips(logging.Filter):
    """dramatiq warns on every skipped message; for keyed work a skip is routine (a duplicate
    or a busy key), and the observer counts them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "Message %s was skipped."


def _quiet_skips() -> None:
    logger = logging.getLogger("dramatiq.worker.WorkerThread")
    if not any(isinstance(f, _QuietSkips) for f in logger.filters):
        logger.addFilter(_QuietSkips())


class _Consumer(_RedisConsumer):
    """dramatiq's Redis consumer, minus the ack round trip for deliveries already acked by
    the keyed `done` script (which performs exactly dispatch.lua's ack writes), and with the
    claims queue's rejected messages dead-lettered where the main queue's go (one place)."""

    def ack(self, message: MessageProxy) -> None:
        if is_acked(message):
            self.queued_message_ids.discard(message.message_id)
            return
        super().ack(message)  # type: ignore[no-untyped-call]  # dramatiq leaves it unannotated

    def nack(self, message: MessageProxy) -> None:
        if is_acked(message):
            self.queued_message_ids.discard(message.message_id)
            return
        jobs = keyed_middleware(self.broker).jobs
        layout = jobs.queue.layout
        if q_name(self.queue_name) != layout.claims_queue:
            super().nack(message)  # type: ignore[no-untyped-call]  # unannotated in dramatiq
            return
        try:
            jobs.scripts.nack(
                layout.acks(self.broker.broker_id, self.queue_name),
                message.options["redis_message_id"],
                layout.messages_of(self.queue_name),
            )
        except redis.ConnectionError as e:
            raise ConnectionClosed(e) from None
        finally:
            self.queued_message_ids.discard(message.message_id)


class KeyedRedisBroker(RedisBroker):
    @property
    def consumer_class(self) -> type[_RedisConsumer]:
        return _Consumer


def build_broker(
    settings: QueueSettings,
    *,
    client: redis.Redis | None = None,
    router: Router = actor_for_key,
    observer: QueueObserver | None = None,
) -> RedisBroker:
    """A RedisBroker wired for keyed work (`keyed_middleware(broker).jobs` is the worker side
    of the protocol, `.jobs.queue` a producer on the same client)."""
    if client is None:
        if settings.redis_url is None:
            from warmpool.queue.embedded import resolve_redis_url

            settings = settings.replace(redis_url=resolve_redis_url())
        assert settings.redis_url is not None
        client = connect(settings.redis_url)
    keyed = KeyedMiddleware(Jobs(client, settings, router=router, observer=observer))
    broker = KeyedRedisBroker(
        client=client,
        namespace=settings.namespace,
        heartbeat_timeout=int(settings.heartbeat_timeout * 1000),
        dead_message_ttl=DEAD_MESSAGE_TTL_MS,
        middleware=[
            keyed,
            AgeLimit(),
            TimeLimit(),
            ShutdownNotifications(),
            Callbacks(),
            Pipelines(),
        ],
    )
    _quiet_skips()
    return broker


def keyed_middleware(broker: RedisBroker) -> KeyedMiddleware:
    for m in broker.middleware:
        if isinstance(m, KeyedMiddleware):
            return m
    raise LookupError("this broker was not built by warmpool.queue.broker.build_broker")
