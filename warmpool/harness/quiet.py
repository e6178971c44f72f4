"""`wait_quiet(since=mark)`: "the work caused by the change made after `mark` has run".

Built on the run log the workers keep when they import `workers.runlog` (the harness's
default worker module): every job's start and end appended to two Redis lists
(`Layout.runs_started`, `Layout.runs_ended`), and on the queue's own view of what is waiting,
running or delayed (`Inspector.stats()`).

What `quiet` (and so `wait_quiet`) guarantees once it returns:

- for each named key: a run of it that *started after the mark* has *ended* (returned or
  raised). A run already under way at the mark does not count, nor does its end: the mark
  records which keys were running then. (A key's runs never overlap while its lease holds, so
  its i-th end belongs to its i-th start; a holder frozen past its lease, as the chaos runner's
  `worker_stop` does, can break that pairing for that key.)
- with no keys: at least one lease was taken since the mark (the queue's fence counter moved
  on), so a run began after it; with nothing running, it has ended. This part needs no run
  log: it holds for workers started as production starts them (without `workers.runlog`).
- and, read twice in a row with no run ending or beginning in between: nothing waiting
  (`dirty`), running (a lease held) or delayed to run within `TIMER_HORIZON` (a retry, a
  deferral, a short requeue_after) in the queue. A key delayed further is a timer (issue #29:
  a schedule's next edge, a Session's deadline, a URL probe's next attempt): time, not work
  the change caused; it does not keep the queue from being quiet. Nor does a key of a timer
  kind (`timeout/`, `probe/`), delayed however soon it is due, waiting or running: a URL
  probe of an instance that never answers tries every few seconds for minutes, each attempt
  up to its timeout, and a namespace with a few dozen such Sessions always has some running
  (a test module's shared namespace had 8 running and 30 waiting, for as long as it ran).
  What such a run writes is a change like any other: a key it causes is work.

What it does NOT guarantee:

- that the change's watch events have reached the scheduler and become keys: with no keys,
  an idle queue right after an unrelated run ends passes. Name the keys the change must cause
  (the Session's `session/<ns>/<name>`, an instance's `instance/<ns>/<appdef>/<k>`) when it
  matters.
- that the cluster converged (that is the caller's check: invariants, a wait on objects);
  only that the queue has no more work for now. Dead letters are not "pending".
- anything about the future: a delayed follow-up scheduled after the check, a resync, or an
  event still in a watch stream may add work later.
- anything across a Redis that lost its data after the mark (flush, restart without
  persistence, failover): the run log and the fence counter go with it; `quiet` says so and
  the wait times out.
- anything if the workers do not log their runs (no `workers.runlog`): the keys never appear.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import redis

from warmpool.keys import ProbeKey, TimeoutKey
from warmpool.queue.inspect import Inspector, QueueStats
from warmpool.queue.layout import Layout
from warmpool.queue.replies import members, text
from warmpool.queue.settings import QueueSettings
from warmpool.testing.waiting import WaitTimeout, wait_for

#: Delayed keys due later than this (s) are timers, not pending work (see the docstring): the
#: queue's retries and deferrals are due within it (backoff caps are seconds).
TIMER_HORIZON = 30.0


def owed(inspector: Inspector, client: redis.Redis, layout: Layout) -> QueueStats | None:
    """The stats when the queue is not idle, else None: nothing waiting or running, and no
    delayed key due within `TIMER_HORIZON`."""
    stats = inspector.stats()
    if stats.waiting or stats.running:
        if stats.waiting + stats.running > DUE_SCAN:
            return stats
        with client.pipeline(transaction=False) as p:
            p.smembers(layout.dirty)
            p.zrange(layout.inflight, 0, -1)
            dirty, inflight = p.execute()
        if any(not _is_timer_key(raw) for raw in (*cast(set[bytes], dirty),
                                                  *members(inflight))):
            return stats
    if stats.delayed:
        due = client.zrangebyscore(layout.delayed, "-inf",
                                   inspector.now_ms() + int(TIMER_HORIZON * 1000),
                                   start=0, num=DUE_SCAN)
        if any(not _is_timer_key(raw) for raw in cast(list[bytes], due)) \
                or len(due) == DUE_SCAN:
            return stats
    return None


#: Timer kinds: their keys poll time or the world, not work a change caused (a URL probe
#: tries every few seconds for minutes while the instance does not answer; a Session's
#: deadline job looks again when it is due). Delayed ones never keep the queue from quiet.
TIMER_KINDS = (f"{TimeoutKey.kind}/", f"{ProbeKey.kind}/")
#: How many keys `owed` reads to tell timers from work (more: not idle): soon-due delayed
#: ones, or waiting and running ones together.
DUE_SCAN = 200


def _is_timer_key(raw: bytes) -> bool:
    return raw.decode(errors="replace").startswith(TIMER_KINDS)


class NotQuiet(WaitTimeout):
    """`wait_quiet` timed out (an AssertionError): the message says which keys had not run and
    what the queue held."""


@dataclass(frozen=True, slots=True)
class Mark:
    """A moment in the run log: its lengths then, the keys whose run was under way, and the
    queue's fence counter (every lease taken later carries a higher fence)."""

    starts: int
    ends: int
    running: frozenset[str]
    fence: int = 0


def _key_of(raw: bytes | str) -> str:
    """The key of a run-log entry, "<time> <key> [<worker>]" (`workers.runlog`)."""
    return text(raw).partition(" ")[2].partition(" ")[0]


def _fence(raw: bytes | str | None) -> int:
    return int(text(raw) or 0) if raw is not None else 0


def mark(client: redis.Redis, settings: QueueSettings) -> Mark:
    """Now, in the run log and the fence counter (read in one MULTI, so at one moment)."""
    layout = Layout.of(settings)
    with client.pipeline(transaction=True) as p:
        p.lrange(layout.runs_started, 0, -1)
        p.lrange(layout.runs_ended, 0, -1)
        p.get(layout.fence)
        starts, ends, fence = p.execute()
    open_runs = Counter(_key_of(r) for r in starts)
    open_runs.subtract(_key_of(r) for r in ends)
    return Mark(len(starts), len(ends), frozenset(k for k, n in open_runs.items() if n > 0),
                _fence(fence))


@dataclass(frozen=True, slots=True)
class Pending:
    """What `quiet` found still outstanding (empty: quiet)."""

    keys_not_run: tuple[str, ...] = ()
    no_run_yet: bool = False  # no keys named, and no lease has been taken since the mark
    queue: QueueStats | None = None  # the stats when the queue was not idle
    log_lost: bool = False  # the run log or the fence counter went back: Redis lost its data
    busy: bool = False  # idle twice, but a run ended or began between the two reads

    def __bool__(self) -> bool:
        return bool(self.keys_not_run or self.no_run_yet or self.queue is not None
                    or self.log_lost or self.busy)

    def __str__(self) -> str:
        parts = []
        if self.log_lost:
            parts.append("the run log or the fence counter is behind the mark "
                         "(Redis lost its data?)")
        if self.keys_not_run:
            parts.append(f"keys with no run started after the mark and ended: "
                         f"{list(self.keys_not_run)}")
        if self.no_run_yet:
            parts.append("no lease taken since the mark: no run has happened")
        if self.queue is not None:
            q = self.queue
            parts.append(f"queue not idle: {q.waiting} waiting, {q.running} running, "
                         f"{q.delayed} delayed ({q.messages} messages, {q.dead} dead, "
                         f"{q.workers_alive} workers alive)")
        if self.busy:
            parts.append("runs still ending")
        return "; ".join(parts) or "quiet"


def quiet(client: redis.Redis, settings: QueueSettings, since: Mark,
          keys: Iterable[str] = ()) -> Pending:
    """One look: what is still pending of the work since `since` (falsy when none is)."""
    layout = Layout.of(settings)
    wanted = list(dict.fromkeys(keys))
    with client.pipeline(transaction=True) as p:
        p.lrange(layout.runs_started, since.starts, -1)
        p.lrange(layout.runs_ended, since.ends, -1)
        p.llen(layout.runs_ended)
        p.get(layout.fence)
        starts, ends, n_ends, raw_fence = p.execute()
    fence = _fence(raw_fence)
    if int(n_ends) < since.ends or fence < since.fence:
        return Pending(tuple(wanted), not wanted, None, log_lost=True)
    started = Counter(_key_of(r) for r in starts)
    ended = Counter(_key_of(r) for r in ends)
    # A key running at the mark ends once more before a run started after it can end.
    not_run = tuple(k for k in wanted
                    if started[k] < 1 or ended[k] - (k in since.running) < 1)
    # No keys named: a lease taken since the mark is a run that began after it, and with
    # nothing running (below) it has ended. This needs no run log, so it holds for workers
    # started as production starts them too (the manifests' deployment test).
    no_run = not wanted and fence <= since.fence
    inspector = Inspector(client, settings)
    stats = owed(inspector, client, layout)
    if stats is None:
        # Read again: the three counts are read one after the other, not at one moment, so a
        # key moving between them (delayed -> waiting) could be missed once, not twice; and
        # a run that ended in between may have added work the first read did not see.
        again = owed(inspector, client, layout)
        if again is not None:
            return Pending(not_run, no_run, again)
        with client.pipeline(transaction=True) as p:
            p.llen(layout.runs_ended)
            p.get(layout.fence)
            ends_now, fence_now = p.execute()
        busy = int(ends_now) != int(n_ends) or _fence(fence_now) != fence
        return Pending(not_run, no_run, None, busy=busy)
    return Pending(not_run, no_run, stats)


def wait_quiet(client: redis.Redis, settings: QueueSettings, since: Mark,
               keys: Iterable[str] = (), timeout: float = 60.0,
               interval: float = 0.05) -> None:
    """Poll `quiet` until nothing is pending (see the module docstring for exactly what that
    means); on timeout raise `NotQuiet` saying what still was."""
    wanted = tuple(keys)
    last = [Pending()]

    def settled() -> bool:
        last[0] = quiet(client, settings, since, wanted)
        return not last[0]

    try:
        wait_for(settled, timeout=timeout, interval=interval)
    except WaitTimeout:
        raise NotQuiet(f"not quiet after {timeout:.1f} s: {last[0]}"
                       f"{_sample(Inspector(client, settings))}") from None


def _sample(inspector: Inspector, limit: int = 8) -> str:
    """A few of the keys still owed, for the message: which work never ends."""
    running = [k.key for k in inspector.running(limit)]
    waiting = [k for k, _ in inspector.pending(limit)]
    delayed = [k for k, _ in inspector.delayed(limit)]
    return f"; running {running}, waiting {waiting}, delayed {delayed}"
