"""One delivery's life on the worker side: start (take the lease) -> handler -> done.

`Jobs.begin` turns a delivered message into a `JobContext` or a reason to skip it;
`Jobs.finish` releases the lease, accounts success or failure and re-enqueues the key if it
was added meanwhile. The dramatiq middleware is a thin shell around these two, and unit
tests drive them directly.

Freshness: a job gets the triggers its key's adds recorded (`ctx.triggers`: the object
versions it must see before it acts on cached state) and reports the versions its own
guarded writes produced (`ctx.note_write`). When the watch events of those writes come back
as adds, the rerun they cause would only read back what the job wrote: the start script
skips it (reason "own") instead of running it.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback

import redis

from warmpool.queue.keyed import KeyedQueue
from warmpool.queue.lease import Lease, LeaseBook, holder_of
from warmpool.queue.observer import QueueObserver
from warmpool.queue.routing import Router, actor_for_key
from warmpool.queue.scripts import (
    UNTRIGGERED,
    Busy,
    Done,
    DoneOutcome,
    Skip,
    Started,
    merge_trigger,
    own_fence,
)
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
        triggers: dict[str, str] | None = None,
    ) -> None:
        self.jobs = jobs
        self.key = key
        self.lease = lease
        self.attempt = attempt  # 1 + consecutive failures before this run
        self.queued_seconds = queued_seconds
        self.message_id = message_id
        self.started = time.monotonic()
        self.secondary: dict[str, Lease] = {}
        # As recorded by the adds, `*` included: what a defer or a give-back puts back.
        self._recorded: dict[str, str] = dict(triggers or {})
        self.triggers: dict[str, str] = {
            k: v for k, v in self._recorded.items() if k != UNTRIGGERED
        }
        #: Some add named no version (resync, manual add, retry, recovery, ...), or the
        #: record was lost: reconcile fully rather than just to the triggers' versions.
        self.untriggered = UNTRIGGERED in self._recorded or not self._recorded
        self.writes: dict[str, dict[str, str]] = {}  # key -> own writes made under it
        self._leased: set[str] = set()  # every key this job held a secondary lease on

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
            self._leased.add(key)
        return lease

    def release(self, lease: Lease) -> None:
        if lease is self.lease:
            raise ValueError("the job's own lease is released when the job ends")
        if self.secondary.pop(lease.key, None) is lease:
            self.jobs.release(lease, self.writes.pop(lease.key, None))

    def note_write(self, field: str, value: str, key: str | None = None) -> None:
        """Record a write this job made under a precondition: `"Kind/name"` -> the
        resourceVersion the write returned, `"Kind/name#gone"` -> the uid of a delete.
        Stored for this key when the job ends, so the watch events of these very writes do
        not rerun the key. `key`: a key this job holds or held a secondary lease on (the
        write was made under it): stored for that key when its lease is released, or, if
        noted after that, when the job ends. Only note guarded writes: the version must be
        one this job's own logic produced from what it read."""
        target = self.key if key is None else key
        if target != self.key and target not in self._leased:
            raise ValueError(f"{target!r} was not leased by this job")
        merge_trigger(self.writes.setdefault(target, {}), field, str(value))

    def defer(self, seconds: float) -> str:
        """Run this key again in `seconds` (or sooner if it is added meanwhile), still
        waiting for the versions this run was triggered by."""
        return self.jobs.queue.add_after(self.key, seconds, self._recorded or None)

    def park(self, on: str, fallback: float) -> str:
        """Run this key again when the lease of key `on` is released, or in `fallback`
        seconds at the latest, still waiting for the versions this run was triggered by."""
        return self.jobs.queue.park(self.key, on, fallback, self._recorded or None)

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
    ) -> JobContext | Skip:
        """Take `key` for a delivered message: a JobContext, or why to skip it (`Skip`).
        `ack` = (dramatiq acks key or "", redis message id of the delivery); a skipped
        delivery is acked (when an acks key is given) in the same step."""
        token = self.book.new_token()
        sent_at = time.monotonic()
        r = self.scripts.start(key, token, self.settings.lease_ttl_ms, ack)
        if isinstance(r, Busy) and holder_of(r.holder) == token:
            # Our own start went through but its reply was lost and the call retried (its
            # triggers went with the lost reply: run untriggered, i.e. fully).
            r = Started(r.holder, own_fence(key, r.holder), None, 0)
        if not isinstance(r, Started):
            reason = Skip.BUSY if isinstance(r, Busy) else r
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
            triggers=r.triggers,
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
            self._safe_release(lease, ctx.writes.pop(lease.key, None))
        ctx.secondary.clear()
        s = self.settings
        key = ctx.key
        # This key's record, and what was noted for secondary keys after their release.
        writes = ctx.writes
        # Untrack first: the renewal thread must not see the release as a lost lease, and if
        # Redis fails us the lease simply lapses and maintenance reruns the key.
        self.book.untrack(ctx.lease)
        if error is None:
            done = self.scripts.done(key, ctx.lease.value, "ok", ack=ack, writes=writes)
        else:
            text = format_error(error)
            done = self.scripts.done(
                key,
                ctx.lease.value,
                "fail",
                ack=ack,
                writes=writes,
                error=text,
                base_ms=max(1, int(s.backoff_base * 1000)),
                cap_ms=int(s.backoff_cap * 1000),
                max_failures=s.max_failures,
                dead=self.messages.dead_body(key, text, s.max_failures),
            )
        self._requeue(key, done)
        self._report(key, done, time.monotonic() - ctx.started, error)
        return done

    def abandon(self, ctx: JobContext) -> Done:
        """The job was skipped after taking its key (another middleware said no): give the
        key back, with the triggers it came with, and make it wait again, with no failure
        counted."""
        for lease in list(ctx.secondary.values()):
            self._safe_release(lease)
        ctx.secondary.clear()
        # dirty while we hold it: "rerun" on release
        self.queue.add(ctx.key, ctx._recorded or None)
        return self.release(ctx.lease)

    def acquire(self, key: str) -> Lease | None:
        token = self.book.new_token()
        sent_at = time.monotonic()
        r = self.scripts.acquire(key, token, self.settings.lease_ttl_ms)
        if isinstance(r, Busy):
            if holder_of(r.holder) != token:
                self.observer.on_contention(key, holder_of(r.holder))
                return None
            r = (r.holder, own_fence(key, r.holder))
        value, fence = r
        return self.book.track(Lease(key, value, fence, self.book.valid_until(sent_at), False))

    def release(self, lease: Lease, writes: dict[str, str] | None = None) -> Done:
        """Give a lease back without success/failure accounting (secondary leases); `writes`
        made under it are merged into that key's own-write record."""
        self.book.untrack(lease)
        own = {lease.key: writes} if writes else None
        done = self.scripts.done(lease.key, lease.value, "release", writes=own)
        self._requeue(lease.key, done)
        if done.outcome is DoneOutcome.LOST:
            self.observer.on_lease_lost(lease.key)
        return done

    def _requeue(self, key: str, done: Done) -> None:
        """The key was added while held and has no message on its way: queue one. The only
        place a body is built after a run, so a run that was not re-added builds none."""
        if not done.message_needed:
            return
        try:
            self.scripts.requeue([(key, *self.messages.body(key))])
        except redis.RedisError:
            log.exception("re-enqueueing %s failed; the audit will", key)

    def _safe_release(self, lease: Lease, writes: dict[str, str] | None = None) -> None:
        try:
            self.release(lease, writes)
        except redis.RedisError:
            log.exception("releasing %s failed; it expires in %.1fs", lease.key, lease.ttl_left())

    def _report(self, key: str, done: Done, seconds: float, error: BaseException | None) -> None:
        obs = self.observer
        obs.on_done(key, done.outcome, seconds)
        if done.outcome is DoneOutcome.RETRY and done.delay_ms is not None:
            obs.on_retry(key, done.delay_ms / 1000, done.failures)
        elif done.outcome is DoneOutcome.DEAD:
            obs.on_dead_letter(key, repr(error))
        elif done.outcome is DoneOutcome.LOST:
            obs.on_lease_lost(key)
