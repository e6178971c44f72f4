"""The producer API: add a key now or after a delay.

`add` is the only way keyed work enters the queue (never dramatiq's `send`): one script marks
the key dirty and, unless it already waits or runs, writes its dramatiq message in the same
step, so there is no moment where a key is waiting without a message.

An add may carry *triggers*, `field -> value`, naming the object versions the job must see
(its worker reads Kubernetes from a watch cache that may lag the event that caused the add):
  "<Kind>/<name>"       -> a resourceVersion (decimal); merged over adds by numeric max;
  "<Kind>/<name>#gone"  -> the uid of an object seen deleted; the last add wins.
An add without triggers (a resync, a manual add) stands for "run, whatever the versions" and
is recorded as the field `*`. The job gets the merged map (`JobContext.triggers`), and a run
whose every trigger is a version the key's own last run wrote is skipped (see `jobs`).

Dead letters are this queue's too: keys that failed `max_failures` times in a row, kept in
dramatiq's own dead-letter queue (`<queue>.XQ`, both dramatiq queues'), one per key, with the
last error under `traceback` (where dramatiq's Retries middleware puts it, so its tools show
it). `list_dead`, `retry_dead` and `purge_dead` are the one way to read and act on them;
dramatiq's maintenance drops them after 7 days, like any other dead message.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import redis
from dramatiq.message import Message

from warmpool.queue.layout import Layout
from warmpool.queue.messages import MessageFactory, new_id
from warmpool.queue.observer import QueueObserver, get_observer
from warmpool.queue.redis_conn import connect
from warmpool.queue.replies import raw, scored, text
from warmpool.queue.routing import Router, actor_for_key
from warmpool.queue.scripts import Scripts
from warmpool.queue.settings import QueueSettings

Triggers = Mapping[str, str]
#: What `add_many` takes: a key, or (key, triggers).
AddItem = str | tuple[str, Triggers | None]


class AddResult(enum.StrEnum):
    ENQUEUED = "enqueued"  # now waiting, message queued
    DEDUPLICATED = "deduplicated"  # already waiting (or already due earlier): nothing to do
    RERUN = "rerun"  # running now: it runs exactly once more when the holder is done
    DELAYED = "delayed"  # scheduled (or moved earlier) in the delayed set
    PARKED = "parked"  # waiting for another key's lease to be released (and its fallback)
    OWN = "own"  # at rest, and every trigger a version its own last run wrote: not added


#: What `retry_dead` answers when there is no such dead letter (the `redrive` script's word).
MISSING: Literal["missing"] = "missing"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    message_id: str  # the redis message id, the member of `.XQ`
    actor: str
    key: str | None  # None for a plain (not keyed) dramatiq message
    error: str
    dead_at: float  # unix seconds, on the Redis server's clock
    failures: int | None


class KeyedQueue:
    """Producer side of the keyed work queue (thread-safe; share one per process)."""

    def __init__(
        self,
        client: redis.Redis,
        settings: QueueSettings,
        *,
        router: Router = actor_for_key,
        observer: QueueObserver | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.layout = Layout.of(settings)
        self.scripts = Scripts(client, self.layout)
        self.messages = MessageFactory(settings.queue_name, router, settings.claims_queue_name)
        self._observer = observer

    @classmethod
    def from_settings(
        cls,
        settings: QueueSettings,
        *,
        router: Router = actor_for_key,
        observer: QueueObserver | None = None,
    ) -> KeyedQueue:
        """A queue on its own connection; no URL in the settings means `resolve_redis_url()`."""
        if settings.redis_url is None:
            from warmpool.queue.embedded import resolve_redis_url

            settings = settings.replace(redis_url=resolve_redis_url())
        assert settings.redis_url is not None
        return cls(connect(settings.redis_url), settings, router=router, observer=observer)

    @property
    def observer(self) -> QueueObserver:
        return self._observer or get_observer()

    def add(self, key: str, triggers: Triggers | None = None) -> AddResult:
        """Make `key` run: once, however often it is added before a worker takes it; once
        more after the current run if it is running; never two at once. `triggers`: the
        versions that run must see (see the module docstring); none means "run anyway"."""
        rid, body = self.messages.body(key)
        result = AddResult(self.scripts.add([(key, rid, body, triggers)])[0])
        self.observer.on_add(key, result)
        return result

    def add_many(self, items: Iterable[AddItem], chunk: int = 500) -> list[AddResult]:
        """`add` for many keys (each a key, or (key, triggers)), in few round trips (a resync
        fanning out to its instances)."""
        results: list[AddResult] = []
        batch: list[tuple[str, str, bytes, Triggers | None]] = []

        def flush() -> None:
            for item, r in zip(batch, self.scripts.add(batch), strict=True):
                results.append(AddResult(r))
                self.observer.on_add(item[0], r)
            batch.clear()

        for item in items:
            key, triggers = (item, None) if isinstance(item, str) else item
            batch.append((key, *self.messages.body(key), triggers))
            if len(batch) >= chunk:
                flush()
        if batch:
            flush()
        return results

    def add_after(
        self, key: str, delay: float, triggers: Triggers | None = None
    ) -> AddResult:
        """Make `key` run no earlier than `delay` seconds from now -- or earlier, if it is
        added again meanwhile (re-adding a waiting key only ever moves it earlier). The
        `triggers` are recorded at once; a delayed run itself always runs (`*`)."""
        delay_ms = int(delay * 1000)
        if delay_ms <= 0:
            return self.add(key, triggers)
        result = AddResult(self.scripts.add_after(key, delay_ms, triggers))
        self.observer.on_add(key, result)
        return result

    def park(self, key: str, on: str, fallback: float,
             triggers: Triggers | None = None) -> AddResult:
        """Make `key` run when the lease of key `on` is released -- at once if it is free
        now -- and in `fallback` seconds at the latest (the holder of `on` may die, and a
        dead holder releases nothing). The `triggers` are recorded as `add_after` records
        them. Polling a busy lease instead costs a run per poll and up to a backoff's wait
        after the release (issue #28)."""
        result = AddResult(self.scripts.park(key, on, max(1, int(fallback * 1000)), triggers))
        self.observer.on_add(key, result)
        return result

    def _key_of(self, msg: Message[Any]) -> str | None:
        """The work key of a keyed message, or None for a plain dramatiq message."""
        if len(msg.args) != 1 or not isinstance(msg.args[0], str):
            return None
        try:
            return msg.args[0] if self.messages.router(msg.args[0]) == msg.actor_name else None
        except (ValueError, KeyError):
            return None

    def list_dead(self, limit: int = 1000) -> list[DeadLetter]:
        """The dead letters, oldest first (at most `limit`)."""
        lo = self.layout
        entries = scored(self.client.zrange(lo.xq, 0, limit - 1, withscores=True))
        if not entries:
            return []
        bodies = self.client.hmget(lo.xq_messages, [rid for rid, _ in entries])
        out = []
        for (rid, score), body in zip(entries, bodies, strict=True):
            if body is None:
                continue
            msg = Message.decode(raw(body))
            out.append(DeadLetter(
                message_id=rid.decode(),
                actor=msg.actor_name,
                key=self._key_of(msg),
                error=str(msg.options.get("traceback", "")),
                dead_at=score / 1000,
                failures=msg.options.get("retries"),
            ))
        return out

    def retry_dead(self, key_or_id: str) -> AddResult | Literal["missing"]:
        """Run a dead letter again, by work key or by dead message id: `MISSING` if there is
        no such dead letter, else the add result (ENQUEUED for a plain message). The key
        starts over with no failures."""
        lo = self.layout
        rid = key_or_id
        if self.client.zscore(lo.xq, rid) is None:
            found = self.client.hget(lo.dead, key_or_id)
            if found is None:
                return MISSING
            rid = text(found)
        body = self.client.hget(lo.xq_messages, rid)
        if body is None:
            return MISSING
        msg = Message.decode(raw(body))
        key = self._key_of(msg)
        if key is not None:
            result = self.scripts.redrive(rid, key, *self.messages.body(key))
        else:
            new_rid = new_id()
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
            result = self.scripts.redrive(rid, None, new_rid, fresh.encode())
        return MISSING if result == MISSING else AddResult(result)

    def purge_dead(self) -> int:
        """Drop every dead letter of the queue; returns how many there were."""
        lo = self.layout
        with self.client.pipeline() as pipe:
            pipe.zcard(lo.xq)
            pipe.delete(lo.xq, lo.xq_messages, lo.dead)
            count, _ = pipe.execute()
        return int(count)
