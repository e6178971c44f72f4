"""The dramatiq broker for keyed work: dramatiq's RedisBroker, standard layout, our middleware.

Differences from dramatiq's defaults, and why:
  * keyed deliveries are acked by the script that releases the key (see `_Consumer`);
  * no Retries middleware: failures are retried per key with millisecond backoff by the
    keyed protocol (dramatiq's would wait >= 15 s and retry the message, not the key);
  * `heartbeat_timeout` from our settings (5 s instead of 60 s), used when maintenance
    requeues dead workers' messages;
  * KeyedMiddleware first (see its docstring);
  * a rejected (nacked) claims message is dead-lettered in the main queue's `.XQ`;
  * each consumer reclaims the deliveries of its own ack set it never received (see
    `HeldDeliveries`): dramatiq requeues the ack sets of dead workers only;
  * every dispatch is stamped with the Redis server's clock (`ServerClock`), not the
    caller's, so workers on hosts whose clocks disagree do not take each other for dead;
  * an idle consumer waits for the doorbell (`warmpool.queue.doorbell`) up to
    `idle_poll_timeout` instead of fetching every `poll_timeout` (see `_Consumer._idle`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import compute_backoff, dq_name, q_name
from dramatiq.errors import ConnectionClosed
from dramatiq.message import Message
from dramatiq.middleware import AgeLimit, Callbacks, Pipelines, ShutdownNotifications, TimeLimit

from warmpool.queue.clock import ServerClock
from warmpool.queue.doorbell import Doorbell
from warmpool.queue.jobs import Jobs
from warmpool.queue.middleware import KeyedMiddleware, is_acked
from warmpool.queue.observer import QueueObserver
from warmpool.queue.redis_conn import connect
from warmpool.queue.routing import Router, actor_for_key
from warmpool.queue.settings import QueueSettings

DEAD_MESSAGE_TTL_MS = 7 * 24 * 3600 * 1000

log = logging.getLogger(__name__)


class _QuietSkips(logging.Filter):
    """dramatiq warns on every skipped message; for keyed work a skip is routine (a duplicate
    or a busy key), and the observer counts them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "Message %s was skipped."


def _quiet_skips() -> None:
    logger = logging.getLogger("dramatiq.worker.WorkerThread")
    if not any(isinstance(f, _QuietSkips) for f in logger.filters):
        logger.addFilter(_QuietSkips())


class HeldDeliveries:
    """The deliveries this process's consumers hold, per dramatiq queue, by redis message id:
    received from a fetch and not yet acked, nacked or requeued (in the worker's work queue,
    running, or waiting for their eta). Kept on the broker, not the consumer: dramatiq
    replaces a consumer after a connection error while its worker threads still run, and
    later ack, what the old one delivered.

    `check` finds the ids of the worker's ack set in Redis that no consumer holds -- a fetch
    whose reply was lost left them there, and nothing else would ever requeue them while the
    process lives -- and reclaims those seen missing by two consecutive checks (`period`
    apart), each atomically only if still unacked (`Scripts.reclaim`).

    Why this cannot take a delivery that is on its way: a queue's fetches and its checks run
    on its one consumer thread, the check only when the prefetch cache is empty, so every id
    a fetch answered with is held before the next check starts; the held ids are read before
    the ack set and an id leaves `held` only after its ack reached Redis, so an id read in
    the set and not held was never received. The second sighting and the script's
    still-in-the-set test are a margin on top (for a reply in flight on a connection the
    consumer gave up on, were it ever read).
    """

    def __init__(self, period: float) -> None:
        self.period = period
        self._lock = threading.Lock()
        self._held: dict[str, set[str]] = {}
        self._suspects: dict[str, set[str]] = {}
        self._next_check: dict[str, float] = {}

    def add(self, queue: str, rid: str) -> None:
        with self._lock:
            self._held.setdefault(queue, set()).add(rid)

    def discard(self, queue: str, rids: Iterable[str]) -> None:
        with self._lock:
            held = self._held.get(queue)
            if held:
                held.difference_update(rids)

    def clear(self, queue: str) -> None:
        with self._lock:
            self._held.pop(queue, None)

    def held(self, queue: str) -> set[str]:
        with self._lock:
            return set(self._held.get(queue, ()))

    def due(self, queue: str, now: float) -> bool:
        if now < self._next_check.get(queue, 0.0):
            return False
        self._next_check[queue] = now + self.period
        return True

    def check(self, queue: str, acks: set[str], held: set[str]) -> list[str]:
        """The ids to reclaim now: in `acks` (read after `held`), not held, and not held at
        the previous check either. Remembers the rest of the missing ones for the next."""
        missing = acks - held
        confirmed = missing & self._suspects.get(queue, set())
        self._suspects[queue] = missing - confirmed
        return sorted(confirmed)


def _rid(message: MessageProxy) -> str:
    return str(message.options.get("redis_message_id") or "")


#: The longest a consumer whose prefetch is full waits for an ack or a nack (`_wait_for_room`)
#: before it looks again anyway.
ROOM_FALLBACK = 1.0


class _Consumer(_RedisConsumer):
    """dramatiq's Redis consumer, minus the ack round trip for deliveries already acked by
    the keyed `done` script (which performs exactly dispatch.lua's ack writes), with the
    claims queue's rejected messages dead-lettered where the main queue's go (one place),
    and with what it delivers tracked in the broker's `HeldDeliveries`, so that before a
    fetch it can reclaim the deliveries of its ack set it never received."""

    broker: KeyedRedisBroker

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]  # dramatiq: unannotated
        # Notified by every ack and nack (worker threads make them, dramatiq 2.x): a consumer
        # whose prefetch is full waits here for room (`_wait_for_room`).
        self._room = threading.Condition()

    def __next__(self) -> MessageProxy | None:
        if not self.message_cache:
            self._check_acks()
        message = self._next_message()
        if message is not None and _rid(message):
            self.broker.held.add(self.queue_name, _rid(message))
        return message

    def _next_message(self) -> MessageProxy | None:
        """dramatiq's `_RedisConsumer.__next__` (dramatiq 2.x, brokers/redis.py), with one
        change, its idle path (`_idle`): dramatiq sleeps at most `timeout` (our
        `poll_timeout`, 20 ms) after an empty fetch and fetches again, which is every
        consumer of every idle process fetching ~50-100 times a second. Returns None after
        the idle wait, as dramatiq does, so the consumer thread can run its own chores."""
        try:
            while True:
                if self.message_cache:
                    data = self.message_cache.pop(0)
                    if data is None:  # dramatiq's guard (its #266), kept as it is
                        self.logger.warning("Found 'None' message in message cache for queue "
                                            "%r.", self.queue_name)
                        continue
                    self.misses = 0
                    message = Message.decode(data)
                    self.queued_message_ids.add(message.message_id)
                    return MessageProxy(message)
                room = self.prefetch - self.outstanding_message_count
                if room <= 0:  # nothing fetched: the queue need not be empty
                    self._wait_for_room()
                    return None
                bell = self.broker.doorbell
                if bell is not None:
                    bell.arm(self._list)  # before the fetch: a ring during it is kept
                self.message_cache = self.broker.do_fetch(self.queue_name, room)
                if not self.message_cache:
                    self._idle()
                    return None
        except redis.ConnectionError as e:
            raise ConnectionClosed(e) from None

    @property
    def _list(self) -> str:
        """The id list this consumer fetches from: what the scripts' doorbell names."""
        return keyed_middleware(self.broker).jobs.queue.layout.messages_list_of(
            self.queue_name)

    def _idle(self) -> None:
        """After an empty fetch: wait for the doorbell to ring for this queue, up to
        `broker.idle_timeout`, rather than poll. The fallback timeout bounds what a lost
        notification costs (pub/sub is lossy: a reconnect, a Sentinel failover), and while
        the doorbell is not subscribed `wait` returns at once and this polls as dramatiq
        does. A delay queue's consumer that holds messages waiting for their eta polls too:
        its thread moves them on only between two calls of `__next__`."""
        bell = self.broker.doorbell
        if bell is not None and not self._holds_etas() and bell.wait(self._list,
                                                             self.broker.idle_timeout):
            self.misses = 0
            return
        self._backoff()

    def _holds_etas(self) -> bool:
        """A delay queue's consumer holding messages until their eta: only its own thread
        moves them on, between two calls of `__next__`, so it must come back in time."""
        return bool(self.queue_name == dq_name(q_name(self.queue_name))
                    and self.outstanding_message_count > 0)

    def _wait_for_room(self) -> None:
        """Prefetch full: wait for an ack or nack to make room, instead of dramatiq's
        backoff (sleeps from 5 ms doubling to `timeout`, 20 ms, and a look each time): under
        churn every busy consumer looked 50 times a second (3 % of a worker's CPU, issue
        #28's profile), and a look came up to 20 ms after the ack that made room. A delay
        queue's consumer holding etas still comes back within `timeout` ms, as before (its
        thread moves due messages on); any other waits up to `ROOM_FALLBACK` seconds, a
        fallback only: nothing but an ack or a nack, which notify, makes room."""
        limit = self.timeout / 1000 if self._holds_etas() else ROOM_FALLBACK
        with self._room:
            if self.prefetch - self.outstanding_message_count <= 0:
                self._room.wait(limit)

    def _made_room(self) -> None:
        with self._room:
            self._room.notify_all()

    def _backoff(self) -> None:
        """dramatiq's idle sleep: doubling from 5 ms up to `timeout` ms."""
        self.misses, backoff_ms = compute_backoff(self.misses, max_backoff=self.timeout)
        time.sleep(backoff_ms / 1000)

    def _check_acks(self) -> None:
        held = self.broker.held
        if not held.due(self.queue_name, time.monotonic()):
            return
        jobs = keyed_middleware(self.broker).jobs
        acks = jobs.queue.layout.acks(self.broker.broker_id, self.queue_name)
        try:
            mine = held.held(self.queue_name)  # before the ack set: see HeldDeliveries
            in_redis = {x.decode() if isinstance(x, bytes) else str(x)
                        for x in self.broker.client.smembers(acks)}
            lost = held.check(self.queue_name, in_redis, mine)
            if lost:
                moved = jobs.scripts.reclaim(acks, self.queue_name, lost)
                log.warning("reclaimed %d of %d deliveries on %s that this worker never "
                            "received (a fetch whose reply was lost)", moved, len(lost),
                            self.queue_name)
        except redis.RedisError as e:
            log.warning("checking this worker's ack set on %s failed: %s", self.queue_name, e)

    def ack(self, message: MessageProxy) -> None:
        try:
            if not is_acked(message):
                super().ack(message)  # type: ignore[no-untyped-call]  # dramatiq: unannotated
        finally:
            self.queued_message_ids.discard(message.message_id)
            self._made_room()
        self.broker.held.discard(self.queue_name, [_rid(message)])  # only once acked

    def nack(self, message: MessageProxy) -> None:
        try:
            if not is_acked(message):
                self._nack(message)
        finally:
            self.queued_message_ids.discard(message.message_id)
            self._made_room()
        self.broker.held.discard(self.queue_name, [_rid(message)])  # only once nacked

    def _nack(self, message: MessageProxy) -> None:
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

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        messages = list(messages)
        super().requeue(messages)  # type: ignore[no-untyped-call]  # unannotated in dramatiq
        self.broker.held.discard(self.queue_name, [_rid(m) for m in messages])

    def close(self) -> None:
        # A delay queue's deliveries wait in its consumer thread's memory, which dramatiq
        # drops with the consumer (after requeueing them, or, on a connection error, not):
        # whatever is left in the ack set then is not held any more.
        if self.queue_name == dq_name(q_name(self.queue_name)):
            self.broker.held.clear(self.queue_name)
        super().close()


class KeyedRedisBroker(RedisBroker):
    def __init__(self, *, reclaim_period: float = 1.0, clock: ServerClock | None = None,
                 doorbell: Doorbell | None = None, idle_timeout: float = 1.0,
                 **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]
        self.held = HeldDeliveries(reclaim_period)
        self.clock = clock or ServerClock(self.client)
        self.doorbell = doorbell
        self.idle_timeout = idle_timeout

    def enqueue(self, message: Message[object], *, delay: int | None = None
                ) -> Message[object]:
        """dramatiq's enqueue (a plain actor's send, or a delay queue's message whose eta
        came), then a ring for the list it went to: dispatch.lua is dramatiq's, so the
        ring is a second command, sent after the write (a waiter woken by it finds the
        message). Only with the doorbell: without it nobody waits for one."""
        sent: Message[object] = super().enqueue(message, delay=delay)
        if self.doorbell is not None:
            layout = keyed_middleware(self).jobs.queue.layout
            try:
                self.client.publish(layout.doorbell_channel,
                                    layout.messages_list_of(sent.queue_name))
            except redis.RedisError as e:  # the message is queued: idle consumers poll it
                log.warning("ringing the doorbell for %s failed: %s", sent.queue_name, e)
        return sent

    def _dispatch(self, command: str) -> Callable[..., object]:
        """dramatiq's own `_dispatch` (dramatiq 1.x, brokers/redis.py), with one change: the
        timestamp is the server's (`ServerClock`). dispatch.lua writes it as this worker's
        heartbeat and compares other workers' heartbeats and dead letters with it."""
        dispatch = self.scripts["dispatch"]
        keys = [self.namespace]

        def do_dispatch(queue_name: str, *args: str | int | float | bytes) -> object:
            return dispatch(args=[
                command, self.clock.now_ms(), queue_name, self.broker_id,
                self.heartbeat_timeout, self.dead_message_ttl,
                self._should_do_maintenance(command), self._max_unpack_size(), *args,
            ], keys=keys)

        return do_dispatch

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
    layout = keyed.jobs.queue.layout
    broker = KeyedRedisBroker(
        reclaim_period=settings.recovery_period,
        clock=keyed.jobs.book.clock,  # one server clock per process
        # started with the worker (KeyedMiddleware.after_worker_boot), stopped with it
        doorbell=Doorbell(client, layout.doorbell_channel) if settings.doorbell else None,
        idle_timeout=settings.idle_poll_timeout,
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
