"""One delivery's life on the worker side: start (take the lease) -> handler -> done.

`Jobs.begin` turns a delivered message into a `JobContext` or a reason to skip it;
`Jobs.finish` releases the lease, accounts success or failure and re-enqueues the key if it
was added meanwhile. The dramatiq middleware is a thin shell around these two, and unit
tests drive them directly.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback

import redis

from warmpool.queue.keyed import KeyedQueue
from warmpool.queue.lease import Lease, LeaseBook, fence_of, holder_of
from warmpool.queue.observer import QueueObserver
from warmpool.queue.routing import Router, actor_for_key
from warmpool.queue.scripts import STALE, Busy, Done, Started
from warmpool.queue.settings import QueueSettings

log = logging.getLogger(__name__)

_local = threading.local()


def current_job() -> JobContext:
    """The context of the job running on this thread; RuntimeError outside a keyed job."""
    ctx: JobContext | None = getattr(_local, "ctx", None)
    if ctx is None:
        raise RuntimeError("no keyed job is running on this thread")
    return ctx


def _set_current(ctx: JobContext | None) -> None:
    _local.ctx = ctx


def _pop_current() -> JobContext | None:
    ctx = getattr(_local, "ctx", None)
    _local.ctx = None
    return ctx


def format_error(error: BaseException, limit: int = 30) -> str:
    return "".join(traceback.format_exception(error, limit=limit))


class JobContext:
    """What a handler gets: its key, its lease (fence) and the means to take other keys.

    Never wait while holding a lease: `try_lease` is non-blocking, and a handler that cannot
    get what it needs should `defer` and return.
    """

    def __init__(
        self,
        jobs: Jobs,
        key: str,
        lease: Lease,
        *,
        attempt: int,
        queued_seconds: float | None,
        message_id: str = "",
    ) -> None:
        self.jobs = jobs
        self.key = key
        self.lease = lease
        self.attempt = attempt  # 1 + consecutive failures before this run
        self.queued_seconds = queued_seconds
        self.message_id = message_id
        self.started = time.monotonic()
        self.secondary: dict[str, Lease] = {}

    @property
    def fence(self) -> int:
        """Grows with every acquisition of this key (across all keys, in fact)."""
        return self.lease.fence

    @property
    def token(self) -> str:
        return self.lease.value

    def ensure_held(self) -> None:
        """Raise LeaseLost unless this job still holds its key and every secondary lease."""
        self.lease.ensure_held()
        for lease in self.secondary.values():
            lease.ensure_held()

    def try_lease(self, key: str) -> Lease | None:
        """Take `key`'s lease now if it is free, else None (never waits). Released when the
        job ends, or earlier with `release`; if `key` was added meanwhile it runs after."""
        if key == self.key:
            return self.lease
        held = self.secondary.get(key)
        if held is not None and held.held():
            return held
        lease = self.jobs.acquire(key)
        if lease is not None:
            self.secondary[key] = lease
        return lease

    def release(self, lease: Lease) -> None:
        if lease is self.lease:
            raise ValueError("the job's own lease is released when the job ends")
        if self.secondary.pop(lease.key, None) is lease:
            self.jobs.release(lease)

    def defer(self, seconds: float) -> str:
        """Run this key again in `seconds` (or sooner if it is added meanwhile)."""
        return self.jobs.queue.add_after(self.key, seconds)

    def requeue(self) -> str:
        """Run this key again right after this run."""
        return self.jobs.queue.add(self.key)


class Jobs:
    """The worker half of the per-key protocol, for one process."""

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
        self.queue = KeyedQueue(client, settings, router=router, observer=observer)
        self.scripts = self.queue.scripts
        self.messages = self.queue.messages
        self.book = LeaseBook(client, self.scripts, settings, lambda: self.queue.observer)

    @property
    def observer(self) -> QueueObserver:
        return self.queue.observer

    def begin(
        self, key: str, message_id: str = "", ack: tuple[str, str] = ("", "")
    ) -> JobContext | str:
        """Take `key` for a delivered message: a JobContext, or "busy" / "stale" to skip.
        `ack` = (dramatiq acks key or "", redis message id of the delivery); a skipped
        delivery is acked (when an acks key is given) in the same step."""
        token = self.book.new_token()
        sent_at = time.monotonic()
        r = self.scripts.start(key, token, self.settings.lease_ttl_ms, ack)
        if isinstance(r, Busy) and holder_of(r.holder) == token:
            # Our own start went through but its reply was lost and the call retried.
            r = Started(r.holder, fence_of(r.holder), None, 0)
        if not isinstance(r, Started):
            reason = "busy" if isinstance(r, Busy) else STALE
            self.observer.on_skip(key, reason)
            return reason
        lease = self.book.track(Lease(key, r.value, r.fence, self.book.valid_until(sent_at)))
        queued = None if r.queued_ms is None else r.queued_ms / 1000
        self.observer.on_start(key, queued)
        return JobContext(
            self,
            key,
            lease,
            attempt=r.failures + 1,
            queued_seconds=queued,
            message_id=message_id,
        )

    def finish(
        self,
        ctx: JobContext,
        error: BaseException | None = None,
        ack: tuple[str, str] = ("", ""),
    ) -> Done:
        """Release everything the job holds; account success or failure; rerun if re-added.
        `ack` = (dramatiq acks key, redis message id): ack the delivery in the same step."""
        for lease in list(ctx.secondary.values()):
            self._safe_release(lease)
        ctx.secondary.clear()
        s = self.settings
        key = ctx.key
        # Untrack first: the renewal thread must not see the release as a lost lease, and if
        # Redis fails us the lease simply lapses and maintenance reruns the key.
        self.book.untrack(ctx.lease)
        if error is None:
            done = self.scripts.done(key, ctx.lease.value, "ok", self.messages.body(key), ack=ack)
        else:
            text = format_error(error)
            done = self.scripts.done(
                key,
                ctx.lease.value,
                "fail",
                self.messages.body(key),
                ack=ack,
                error=text,
                base_ms=max(1, int(s.backoff_base * 1000)),
                cap_ms=int(s.backoff_cap * 1000),
                max_failures=s.max_failures,
                dead=self.messages.dead_body(key, text, s.max_failures),
            )
        self._report(key, done, time.monotonic() - ctx.started, error)
        return done

    def abandon(self, ctx: JobContext) -> Done:
        """The job was skipped after taking its key (another middleware said no): give the
        key back and make it wait again, with no failure counted."""
        for lease in list(ctx.secondary.values()):
            self._safe_release(lease)
        ctx.secondary.clear()
        self.queue.add(ctx.key)  # dirty while we hold it: "rerun" on release
        return self.release(ctx.lease)

    def acquire(self, key: str) -> Lease | None:
        token = self.book.new_token()
        sent_at = time.monotonic()
        r = self.scripts.acquire(key, token, self.settings.lease_ttl_ms)
        if isinstance(r, Busy):
            if holder_of(r.holder) != token:
                self.observer.on_contention(key, holder_of(r.holder))
                return None
            r = (r.holder, fence_of(r.holder))
        value, fence = r
        return self.book.track(Lease(key, value, fence, self.book.valid_until(sent_at), False))

    def release(self, lease: Lease) -> Done:
        """Give a lease back without success/failure accounting (secondary leases)."""
        self.book.untrack(lease)
        done = self.scripts.done(lease.key, lease.value, "release", self.messages.body(lease.key))
        if done.outcome == "lost":
            self.observer.on_lease_lost(lease.key)
        return done

    def _safe_release(self, lease: Lease) -> None:
        try:
            self.release(lease)
        except redis.RedisError:
            log.exception("releasing %s failed; it expires in %.1fs", lease.key, lease.ttl_left())

    def _report(self, key: str, done: Done, seconds: float, error: BaseException | None) -> None:
        obs = self.observer
        obs.on_done(key, done.outcome, seconds)
        if done.outcome == "retry" and done.delay_ms is not None:
            obs.on_retry(key, done.delay_ms / 1000, done.failures)
        elif done.outcome == "dead":
            obs.on_dead_letter(key, repr(error))
        elif done.outcome == "lost":
            obs.on_lease_lost(key)
