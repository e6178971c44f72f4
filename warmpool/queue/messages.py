"""dramatiq messages for keys, built the way `RedisBroker.enqueue` builds them.

A keyed message is `<actor>(key)` with a fresh `redis_message_id` option (the id dramatiq's
Redis layout files it under); it is encoded with dramatiq's configured encoder, so workers
decode it like any other message and dramatiq's tools show it.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from typing import Any

from dramatiq.encoder import JSONEncoder
from dramatiq.message import Message, get_encoder

from warmpool.queue.routing import Router, is_claim_key

# Message ids only need to be unique, not unpredictable: draw them from a PRNG seeded from
# the OS (and reseeded in forked children) instead of a getrandom() syscall per id.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def new_id() -> str:
    """A random (version 4) UUID string."""
    return str(uuid.UUID(int=_ids.getrandbits(128), version=4))


class MessageFactory:
    """Messages for keys, on the queue the scripts put them on: claims (session keys) on
    `claims_queue` when given, everything else on `queue_name`."""

    def __init__(self, queue_name: str, router: Router, claims_queue: str | None = None) -> None:
        self.queue_name = queue_name
        self.claims_queue = claims_queue
        self.router = router

    def queue_of(self, key: str) -> str:
        if self.claims_queue is not None and is_claim_key(key):
            return self.claims_queue
        return self.queue_name

    def message(self, key: str, **options: Any) -> tuple[str, Message[Any]]:
        rid = new_id()
        msg: Message[Any] = Message(
            queue_name=self.queue_of(key),
            actor_name=self.router(key),
            args=(key,),
            kwargs={},
            options={"redis_message_id": rid, **options},
            message_id=rid,
            message_timestamp=int(time.time() * 1000),
        )
        return rid, msg

    def body(self, key: str, **options: Any) -> tuple[str, bytes]:
        """(redis message id, encoded body) for a fresh message running `key`.

        A fresh message's id and its redis message id are the same value (dramatiq only
        makes them differ when it re-enqueues a message for a retry)."""
        if type(get_encoder()) is not JSONEncoder:
            rid, msg = self.message(key, **options)
            return rid, msg.encode()
        # Hot path (every add builds one): exactly JSONEncoder.encode(Message(...).asdict()),
        # without the dataclass round trip.
        rid = new_id()
        data = {
            "queue_name": self.queue_of(key),
            "actor_name": self.router(key),
            "args": [key],
            "kwargs": {},
            "options": {"redis_message_id": rid, **options},
            "message_id": rid,
            "message_timestamp": int(time.time() * 1000),
        }
        return rid, json.dumps(data, separators=(",", ":")).encode()

    def dead_body(self, key: str, error: str, failures: int | None = None) -> tuple[str, bytes]:
        """A dead letter: the error goes under `traceback`, where dramatiq's Retries
        middleware puts it, so dramatiq's tools show it."""
        options: dict[str, Any] = {"traceback": error}
        if failures is not None:
            options["retries"] = failures
        return self.body(key, **options)
