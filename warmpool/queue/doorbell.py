"""The doorbell: idle workers sleep long and still start a new job within milliseconds.

Every script that puts a message on a dramatiq queue PUBLISHes the id list it wrote on the
layout's `doorbell_channel`, and every delayed add its ready time (server ms), in the same
script, so a notification never arrives before what it announces (lua/lib.lua: `ring`,
`ring_delayed`). Each worker process runs one subscriber thread (`Doorbell`) that turns the
notifications into per-list `threading.Event`s, which the idle consumers
(`warmpool.queue.broker._Consumer`) and the promoter (`warmpool.queue.maintenance`) wait on,
with a long fallback timeout (`QueueSettings.idle_poll_timeout`) instead of polling Redis
every 20 ms.

Pub/sub is lossy: a notification published while the subscriber reconnects (a dropped
connection, a Sentinel failover) is gone. So:
  * a waiter arms its event *before* it reads Redis, so a ring during the read is kept;
  * every (re)subscription rings every event, so waiters read Redis once after a gap;
  * while not subscribed, `listening` is False and waiters poll as before (`poll_timeout`,
    `maintenance_period`);
  * a notification lost anyway (published to a primary the subscriber is not connected to
    yet) costs at most the fallback timeout, after which every waiter reads Redis again.
"""

from __future__ import annotations

import logging
import threading

import redis

log = logging.getLogger(__name__)

#: How long one `get_message` blocks (no Redis command: a poll on the socket), so `stop` is
#: noticed within it.
LISTEN_TICK = 0.25
#: How long the subscriber waits before subscribing again after a connection error; doubled
#: after each failed attempt up to `RETRY_CAP` (a Redis or proxy that refuses SUBSCRIBE
#: logs a line a minute, not a second), and reset once subscribed.
RETRY_DELAY = 1.0
RETRY_CAP = 60.0


def parse_ring(payload: str) -> tuple[str | None, int | None]:
    """(id list, None) for an enqueue's notification, (None, ready ms) for a delayed add's
    (digits only: a list name always has the namespace's ":"), (None, None) for anything
    else (someone else publishing on the channel: ignored)."""
    if payload.isascii() and payload.isdigit() and len(payload) <= 19:
        return None, int(payload)
    if ":" in payload:
        return payload, None
    return None, None


class Doorbell:
    """One subscriber per worker process; an event per dramatiq id list and one for the
    delayed set. Thread-safe: the subscriber sets, waiters clear (`arm`) and wait."""

    def __init__(self, client: redis.Redis, channel: str, *,
                 retry_delay: float = RETRY_DELAY) -> None:
        self.client = client
        self.channel = channel
        self.retry_delay = retry_delay
        self.delayed = threading.Event()
        self._lock = threading.Lock()
        self._events: dict[str, threading.Event] = {}
        self._earliest_due: int | None = None
        self._listening = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def listening(self) -> bool:
        """Subscribed now: a ring from here on reaches the waiters. When False, waiters must
        poll, since nothing would wake them."""
        return self._listening.is_set()

    def event(self, list_name: str) -> threading.Event:
        with self._lock:
            ev = self._events.get(list_name)
            if ev is None:
                ev = self._events[list_name] = threading.Event()
            return ev

    def arm(self, list_name: str) -> None:
        """Forget past rings of `list_name`: call before reading the list, so a ring that
        comes during the read still wakes the wait after it."""
        self.event(list_name).clear()

    def wait(self, list_name: str, timeout: float) -> bool:
        """Wait up to `timeout` for a ring of `list_name` (since `arm`). False at once when
        not listening: the caller then polls."""
        if not self.listening:
            return False
        self.event(list_name).wait(timeout)
        return True

    def take_due(self) -> int | None:
        """The earliest ready time (server ms) rung since the last call, and forget it."""
        with self._lock:
            due, self._earliest_due = self._earliest_due, None
            return due

    def ring(self, payload: str) -> None:
        """Wake the waiters a notification is for."""
        list_name, due = parse_ring(payload)
        if list_name is not None:
            self.event(list_name).set()
        elif due is not None:
            with self._lock:
                if self._earliest_due is None or due < self._earliest_due:
                    self._earliest_due = due
            self.delayed.set()

    def ring_all(self) -> None:
        """Wake every waiter: after a gap in the subscription something may have been
        missed, so each reads Redis once (or, when not listening, falls back to polling)."""
        with self._lock:
            events = list(self._events.values())
        for ev in events:
            ev.set()
        self.delayed.set()

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="queue-doorbell",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop listening (waiters poll again from now on) and end the thread."""
        self._stop.set()
        self._listening.clear()
        self.ring_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        delay = self.retry_delay
        while not self._stop.is_set():
            try:
                self._listen()
            except (redis.RedisError, OSError) as e:
                log.warning("doorbell subscription lost (idle workers poll meanwhile): %s", e)
            except Exception:  # never end the thread: waiters would poll for good
                log.exception("doorbell subscriber failed")
            finally:
                subscribed = self._listening.is_set()
                self._listening.clear()
                self.ring_all()
            delay = self.retry_delay if subscribed else min(delay * 2, RETRY_CAP)
            self._stop.wait(delay)

    def _listen(self) -> None:
        pubsub = self.client.pubsub()
        try:
            pubsub.subscribe(self.channel)
            while not self._stop.is_set():
                message = pubsub.get_message(timeout=LISTEN_TICK)
                if message is not None:
                    self._handle(message)
        finally:
            pubsub.close()

    def _handle(self, message: dict[str, object]) -> None:
        kind = message.get("type")
        if kind == "subscribe":  # also after redis-py reconnected and subscribed again
            self._listening.set()
            self.ring_all()
        elif kind == "message":
            data = message.get("data")
            self.ring(data.decode(errors="replace") if isinstance(data, bytes) else str(data))
