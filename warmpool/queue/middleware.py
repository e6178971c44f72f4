"""The dramatiq middleware that puts keyed actors under the per-key protocol.

Only actors declared with the `keyed=True` option are touched; other actors on the same
broker behave as plain dramatiq. A keyed delivery is acked by the same script that releases
its lease (one round trip instead of two); the broker's consumer then skips its own ack.
Skipped deliveries (busy, stale, own) are acked by the start script, likewise: the key's
state in Redis, not the message, says whether work is owed.

This middleware goes first in the broker's list, so its `before_process_message` runs first
and its `after_*` hooks run last -- after TimeLimit has disarmed its timer, so no
asynchronous TimeLimitExceeded can land in the middle of a release.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import dq_name
from dramatiq.middleware import Middleware, SkipMessage
from dramatiq.worker import Worker

from warmpool.queue.jobs import Jobs, _pop_current, _set_current
from warmpool.queue.maintenance import Maintenance
from warmpool.queue.scripts import Skip

log = logging.getLogger(__name__)

_ACKED = "_warmpool_acked"


def mark_acked(message: MessageProxy) -> None:
    """A keyed script (start on a skip, done after a run) acked this delivery; dramatiq's
    consumer need not."""
    setattr(message, _ACKED, True)


def is_acked(message: MessageProxy) -> bool:
    return bool(message.__dict__.get(_ACKED))


class KeyedMiddleware(Middleware):
    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs
        self.maintenance: Maintenance | None = None
        self._acks: dict[tuple[str, str], str] = {}  # (worker id, queue) -> acks key

    @property
    def actor_options(self) -> set[str]:
        return {"keyed"}

    def _keyed(self, broker: Broker, message: MessageProxy) -> bool:
        actor = broker.actors.get(message.actor_name)
        return bool(actor is not None and actor.options.get("keyed"))

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        if not self._keyed(broker, message):
            return
        key = message.args[0]
        ack = self._ack_of(broker, message)
        try:
            result = self.jobs.begin(key, message.message_id, ack)
        except redis.RedisError as e:
            # Without a lease the job must not run. The message is acked; the key stays
            # dirty and the audit (or crash recovery, if the start did apply) reruns it.
            log.error("could not start %s: %s", key, e)
            raise SkipMessage(f"{key}: redis error") from e
        if isinstance(result, Skip):
            if ack[0]:
                mark_acked(message)
            raise SkipMessage(f"{key}: {result}")
        _set_current(result)

    def _ack_of(self, broker: Broker, message: MessageProxy) -> tuple[str, str]:
        """(acks key, redis message id) of a delivery, for the scripts to ack it."""
        worker_id = getattr(broker, "broker_id", None)
        rid = message.options.get("redis_message_id") or ""
        if worker_id is None or not rid:
            return ("", rid)
        name = (worker_id, message.queue_name)
        acks = self._acks.get(name)
        if acks is None:
            acks = self._acks[name] = self.jobs.queue.layout.acks(worker_id, message.queue_name)
        return (acks, rid)

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        ctx = _pop_current()
        if ctx is None:
            return
        ack = self._ack_of(broker, message)
        self.jobs.finish(ctx, exception, ack=ack)
        if ack[0]:
            mark_acked(message)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        ctx = _pop_current()
        if ctx is not None:
            self.jobs.abandon(ctx)

    def after_worker_boot(self, broker: Broker, worker: Worker) -> None:
        from dramatiq.brokers.redis import RedisBroker

        assert isinstance(broker, RedisBroker)
        layout = self.jobs.queue.layout
        self.jobs.book.start(heartbeat=(layout.heartbeats, broker.broker_id,
                                        layout.worker(broker.broker_id)))
        doorbell = getattr(broker, "doorbell", None)
        if doorbell is not None:
            doorbell.start()
        self.maintenance = Maintenance(self.jobs, broker)
        self.maintenance.start()

    def before_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        """Stop the doorbell first: while the worker drains, its consumers and the promoter
        poll as before it, so each notices its thread's stop within `poll_timeout` instead
        of sleeping out `idle_poll_timeout`."""
        doorbell = getattr(broker, "doorbell", None)
        if doorbell is not None:
            doorbell.stop()

    def after_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        """dramatiq requeues the messages in its work queue on stop, but not those still in
        the consumer's prefetch cache; every worker thread has finished by now, so whatever
        is still unacked for this worker was never started: give it all back. Then leave
        dramatiq's heartbeat set, so tools do not list a stopped worker."""
        from dramatiq.brokers.redis import RedisBroker

        assert isinstance(broker, RedisBroker)
        if self.maintenance is not None:
            self.maintenance.stop()
        try:
            layout = self.jobs.queue.layout
            for name in (q for queue in layout.queues for q in (queue, dq_name(queue))):
                ids = self.jobs.client.smembers(layout.acks(broker.broker_id, name))
                if ids:
                    broker.do_requeue(name, *ids)
            # do_requeue heartbeats; a cleanly stopped worker is not a worker any more
            self.jobs.client.zrem(layout.heartbeats, broker.broker_id)
            self.jobs.client.delete(layout.worker(broker.broker_id))
        except redis.RedisError:
            log.exception("could not requeue this worker's prefetched messages")
        finally:
            self.jobs.book.stop()
