"""Dead letters: keys that failed `max_failures` times in a row, kept in dramatiq's own
dead-letter queue (`<queue>.XQ`), one per key, with the last error under `traceback`.

dramatiq's maintenance drops dead letters after 7 days, like any other dead message.

`KeyedQueue` (``keyed``) exposes these as its methods; they take the queue's parts, not the
queue, so that this module does not import ``keyed`` back.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import redis
from dramatiq.message import Message

from warmpool.queue.layout import Layout
from warmpool.queue.messages import MessageFactory
from warmpool.queue.replies import raw, scored, text
from warmpool.queue.scripts import Scripts


@dataclass(frozen=True, slots=True)
class DeadLetter:
    message_id: str  # the redis message id, the member of `.XQ`
    actor: str
    key: str | None  # None for a plain (not keyed) dramatiq message
    error: str
    dead_at: float  # unix seconds
    failures: int | None


def _key_of(messages: MessageFactory, msg: Message[Any]) -> str | None:
    """The work key of a keyed message, or None for a plain dramatiq message."""
    if len(msg.args) != 1 or not isinstance(msg.args[0], str):
        return None
    try:
        return msg.args[0] if messages.router(msg.args[0]) == msg.actor_name else None
    except (ValueError, KeyError):
        return None


def list_dead(
    client: redis.Redis, layout: Layout, messages: MessageFactory, limit: int = 1000
) -> list[DeadLetter]:
    entries = scored(client.zrange(layout.xq, 0, limit - 1, withscores=True))
    if not entries:
        return []
    bodies = client.hmget(layout.xq_messages, [rid for rid, _ in entries])
    out = []
    for (rid, score), body in zip(entries, bodies, strict=True):
        if body is None:
            continue
        msg = Message.decode(raw(body))
        out.append(
            DeadLetter(
                message_id=rid.decode(),
                actor=msg.actor_name,
                key=_key_of(messages, msg),
                error=str(msg.options.get("traceback", "")),
                dead_at=score / 1000,
                failures=msg.options.get("retries"),
            )
        )
    return out


def retry_dead(
    client: redis.Redis, layout: Layout, scripts: Scripts, messages: MessageFactory,
    key_or_id: str,
) -> str:
    """Run a dead letter again, by work key or by dead message id: "missing" if there is no
    such dead letter, else the add result ("enqueued" for a plain message). The key starts
    over with no failures."""
    rid = key_or_id
    if client.zscore(layout.xq, rid) is None:
        found = client.hget(layout.dead, key_or_id)
        if found is None:
            return "missing"
        rid = text(found)
    body = client.hget(layout.xq_messages, rid)
    if body is None:
        return "missing"
    msg = Message.decode(raw(body))
    key = _key_of(messages, msg)
    if key is not None:
        return scripts.redrive(rid, key, *messages.body(key))
    new_rid = str(uuid.uuid4())
    options = {k: v for k, v in msg.options.items() if k not in ("traceback", "retries")}
    fresh: Message[Any] = Message(
        queue_name=msg.queue_name,
        actor_name=msg.actor_name,
        args=msg.args,
        kwargs=msg.kwargs,
        options={**options, "redis_message_id": new_rid},
        message_id=msg.message_id,
        message_timestamp=msg.message_timestamp,
    )
    return scripts.redrive(rid, None, new_rid, fresh.encode())


def purge_dead(client: redis.Redis, layout: Layout) -> int:
    """Drop every dead letter of the queue; returns how many there were."""
    with client.pipeline() as pipe:
        pipe.zcard(layout.xq)
        pipe.delete(layout.xq, layout.xq_messages, layout.dead)
        count, _ = pipe.execute()
    return int(count)
