"""Bulk writes yield to claims at the API server (issue #28, deliverable 3).

A claim is a user waiting; a scale-down delete, a refill or a generation refresh is not. The
queue already takes claims first (their own dramatiq queue, consumed first, at a higher
priority), but that only orders the jobs: once a claim runs, its writes meet the API server
with every bulk job's writes in flight on the other threads and processes. During a
1,000 -> 100 scale-down 2 x 8 threads of deletes keep the API server (and the 2 cores) busy,
and a claim's five round trips each queue behind them.

So while claims wait (queued, prefetched or running anywhere), each write of a bulk job first
takes a token from a bucket that refills at `rate` writes/s per worker process; with no claim
waiting, bulk writes go at full speed and take nothing.

What was measured (`python -m bench claim --pacing ...`, 2 x 8 workers, on a 2-core machine
shared with another tenant, load 4-11; docs/benchmarks.md "Bulk pacing"), and why pacing is
off by default (`WARMPOOL_BULK_PACE=off`):

- At 3 Sessions/s during 350 -> 100 (two pairs, on the quieter machine) 8 writes/s per
  process made claims slower: p50 0.70 s against 0.22-0.30 s, p99 2.3-2.5 s against
  0.8-1.3 s, the scale-down 46 s against 12-18 s. The claim jobs themselves were no slower;
  the time went before they started, waiting for a job thread while bulk jobs slept on
  tokens in every thread (instance jobs' p99 6.1 s against ~1 s).
- At 6 Sessions/s the claim jobs' own p50 fell 15-20x at 8/s (616 / 242 ms to 39 / 13 ms:
  their writes no longer queue behind deletes) but the end-to-end p99 did not improve, and
  the scale-down took 7-11 s longer. There all 16 job threads ran claims while the claims
  list grew to ~100 (sampled): the claim path's own cost is the limit, not bulk writes.
- 20 writes/s per process changed nothing: unpaced, the scale-down sends about 25 writes/s in
  all, under the 40 that 2 processes at 20 allow.
- Giving a bulk key back instead of sleeping (a plan reserves its tokens up front; no job
  thread held) was worse on every count at 6/s: 2.5x the instance jobs, claim p99 26 / 31 s
  against 8 / 10 s, the scale-down 90 / 83 s against 66 / 63 s. It was reverted.

What pacing needs before it can help: job threads bulk work cannot take (claims-only threads
or processes), so that a bulk job sleeping on a token never stands between a claim and a
thread. Until then it stays off, kept to be measured again with those.

Why a token bucket in the client, and not the others considered:

- Separate connection pools: not measured, because a claim never waits for a connection.
  The workers' pool (`warmpool.kube.api.CONNECTIONS`, 64 per host) does not block when it
  is full (urllib3 opens and drops an extra one), and a process uses at most its 8 job
  threads plus the executor's 32 fan-out threads. The queue a claim waits in is the API
  server's CPU, which a second pool leaves as full.
- API Priority and Fairness with two identities: not measured. APF queues a request only
  once its priority level's concurrency share is used up; the shares come from the server's
  max-inflight limits (600 in all by default), far above the 2 x 40 requests these workers
  can have in flight, so nothing would queue. Making bulk work wait would take a
  PriorityLevelConfiguration with a tiny share and a FlowSchema for a second ServiceAccount:
  cluster-admin objects and a second credential in every worker, where the bucket needs
  nothing; and the CPU the bulk requests cost (apiserver, etcd, the garbage collector their
  deletes set off) is spent whichever queue they wait in.
- A bucket per process, not one cluster-wide in Redis: the rate is per process, so the total
  scales with the workers deployed, which is how the API server's load scales anyway; a shared
  bucket would add a Redis round trip to every bulk write for an exactness nothing here needs.

The wait is bounded two ways, so a scale-down always finishes: the bucket refills at a
positive rate (claims never starve bulk work, they slow it), and no run of writes (one of
`Executor.apply`'s waves) waits more than `max_wait` in all (then it goes regardless).
While it waits the job holds its key's lease, which a separate thread renews
(`warmpool.queue.jobs`); the executor checks the lease again after the wait, right before
the writes (`Executor.apply`), as it does before every run of writes.

Why a stale decision is safe: the pacer only decides *when* a write is sent, never whether or
what. A write delayed past a change in the world is refused by its precondition (the
resourceVersion, uid or must-not-exist it carries) and the job reads again; a claim count read
up to `poll` seconds ago only makes one write wait a little longer, or go a little sooner,
than it would with a perfect count.

The decision (`TokenBucket.take`) is pure, on an injected clock; `ClaimWatch` reads the claim
count from Redis (at most once per `poll` per process, cached); `Pacer` joins them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

#: The setting: bulk writes per second per worker process while claims wait; `off`: no pacing.
PACE_SETTING = "WARMPOOL_BULK_PACE"
#: The rate measured (below the ~25 writes/s an unpaced scale-down sends in all); not the
#: default: the default is off (the module's docstring says what was measured).
MEASURED_RATE = 8.0
#: Writes a bulk job may make at once after a quiet spell (the bucket's depth).
BURST = 4.0
#: No bulk write waits longer than this for a token: a scale-down always moves.
MAX_WAIT = 2.0
#: How old the claim count may get before a process reads it again.
POLL = 0.05


@dataclass(frozen=True, slots=True)
class PacingSettings:
    """`rate` None: pacing is off (every write goes at once: the baseline)."""

    rate: float | None = None
    burst: float = BURST
    max_wait: float = MAX_WAIT
    poll: float = POLL

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> PacingSettings:
        raw = environ.get(PACE_SETTING, "").strip().lower()
        if not raw:
            return cls()
        if raw == "off":
            return cls(rate=None)
        try:
            rate = float(raw)
        except ValueError:
            rate = -1.0
        if not rate > 0 or rate == float("inf"):
            raise ValueError(f"{PACE_SETTING} must be `off` or writes/s > 0, got {raw!r}")
        return cls(rate=rate)


@dataclass(slots=True)
class TokenBucket:
    """A token bucket that only counts while claims wait. Not thread-safe (`Pacer` locks).

    `take(now, pressed)` decides one write: 0.0 means send it now (a token was taken, or no
    claim waits and none is needed); a positive number is how long to wait before asking
    again. Tokens accrue at `rate` up to `burst`, also while no claim waits, so the first
    writes after claims appear go at once (a bulk job's few writes in a row) and then at
    `rate`."""

    rate: float
    burst: float
    tokens: float = field(init=False)
    stamp: float | None = None

    def __post_init__(self) -> None:
        if not self.rate > 0 or not self.burst >= 1:
            raise ValueError(f"a bucket needs rate > 0 and burst >= 1, got {self.rate}, "
                             f"{self.burst}")
        self.tokens = self.burst

    def _refill(self, now: float) -> None:
        if self.stamp is not None and now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        if self.stamp is None or now > self.stamp:
            self.stamp = now

    def take(self, now: float, pressed: bool) -> float:
        self._refill(now)
        if not pressed:
            return 0.0
        if self.tokens >= 1.0 - _EPSILON:  # a token accrued in float steps counts whole
            self.tokens = max(0.0, self.tokens - 1.0)
            return 0.0
        return (1.0 - self.tokens) / self.rate


_EPSILON = 1e-9

Count = Callable[[], int]


class ClaimWatch:
    """How many claims wait, cluster-wide, as of at most `poll` seconds ago.

    `count` reads it (`redis_claim_count`); it is called by one thread at a time, the others
    use the cached value meanwhile. A failed read counts as none (pacing is an optimisation:
    a Redis hiccup must not stall bulk work), logged once per failure streak."""

    def __init__(self, count: Count, poll: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._count, self._poll, self._clock = count, poll, clock
        self._lock = threading.Lock()
        self._value = 0
        self._read_at: float | None = None
        self._failing = False

    def waiting(self) -> int:
        now = self._clock()
        if self._read_at is not None and now - self._read_at < self._poll - _EPSILON:
            return self._value
        if not self._lock.acquire(blocking=False):
            return self._value  # another thread is reading it
        try:
            try:
                self._value = self._count()
                self._failing = False
            except Exception:
                if not self._failing:
                    log.warning("reading the claims waiting failed; bulk writes unpaced "
                                "until it works again", exc_info=True)
                self._failing = True
                self._value = 0
            self._read_at = self._clock()
            return self._value
        finally:
            self._lock.release()


@dataclass
class PacerStats:
    """What the pacer did in this process (a benchmark's and a test's evidence)."""

    free: int = 0  # writes sent with no claim waiting
    paced: int = 0  # writes sent on a token while claims waited
    waits: int = 0  # of `paced`, those that waited for their token
    overdue: int = 0  # writes sent after `max_wait` without a token
    waited: float = 0.0  # seconds spent waiting, all writes


class Pacer:
    """Where a bulk job's writes wait while claims do (`admit`, before each write)."""

    def __init__(self, settings: PacingSettings, watch: ClaimWatch,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if settings.rate is None:
            raise ValueError("pacing is off: make no Pacer")
        self.settings = settings
        self.watch = watch
        self._bucket = TokenBucket(settings.rate, settings.burst)
        self._lock = threading.Lock()
        self._clock, self._sleep = clock, sleep
        self.stats = PacerStats()

    def admit(self, writes: int = 1) -> None:
        """Return once `writes` bulk writes may be sent: at once when no claim waits, else
        one token each, waiting for them at most `max_wait` in all (then anyway)."""
        start = self._clock()
        deadline = start + self.settings.max_wait
        for _ in range(writes):
            slept = False
            while True:
                pressed = self.watch.waiting() > 0
                now = self._clock()
                with self._lock:
                    wait = self._bucket.take(now, pressed)
                if wait <= 0.0:
                    self._count(pressed, slept)
                    break
                if now >= deadline:
                    with self._lock:
                        self.stats.overdue += 1
                    break
                # Short naps: a claim that is served ends the wait at the next poll.
                self._sleep(min(wait, self.settings.poll, deadline - now))
                slept = True
        with self._lock:
            self.stats.waited += self._clock() - start

    def _count(self, pressed: bool, slept: bool) -> None:
        with self._lock:
            if not pressed:
                self.stats.free += 1
            else:
                self.stats.paced += 1
                self.stats.waits += slept
