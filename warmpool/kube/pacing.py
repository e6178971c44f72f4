"""Bulk writes yield to claims at the API server (issue #28, deliverable 3).

A claim is a user waiting; a scale-down delete, a refill or a generation refresh is not. The
queue already takes claims first (their own dramatiq queue, consumed first, at a higher
priority), but that only orders the jobs: once a claim runs, its writes meet the API server
with every bulk job's writes in flight on the other threads and processes. During a
1,000 -> 100 scale-down 2 x 8 threads of deletes keep the API server (and the 2 cores) busy,
and a claim's five round trips each queue behind them.

So while claims wait (queued, prefetched or running anywhere), a bulk plan reserves one token
per write from a bucket that refills at `rate` writes/s per worker process before it sends
anything; with no token it writes nothing and gives its key back, to run again when the next
token is due (`Pacer.reserve`). With no claim waiting, bulk plans take no tokens and go at
full speed. A plan that got its tokens sends all its writes at once (the bucket goes into
debt for them), so the rate holds over time and no job thread ever sleeps.

Why give the key back rather than sleep in the job: a first version slept before each bulk
write, and a sleeping bulk job holds one of the process's 8 job threads, which is what a
prefetched claim waits for. At 3 Sessions/s during 350 -> 100 it made claims' p99 worse
(2.00 s against 1.56 s unpaced, p50 equal at 0.64 s) and the scale-down slower (47 s against
28 s): a claim found every thread asleep on a token.

Why this rate (measured, `python -m bench claim --pacing off,8,20`, 350 -> 100 under 6
Sessions/s, 2 x 8 workers, each variant twice, interleaved; docs/benchmarks.md "Bulk
pacing"): unpaced, the scale-down sends about 25 writes/s in all, so 20/s per process (40 in
all) paced nothing and changed nothing measurable (claim jobs p50 859 / 416 ms against
616 / 242 ms unpaced). At 8/s per process the claim jobs' p50 fell to 39 / 13 ms (their writes
no longer queue), at a cost of 7-11 s on a 50-70 s scale-down. What the end-to-end p99 is made
of on that machine (claim jobs' own p99 of 3-4 s, claims waiting for a job thread) is not
bulk writes, and pacing does not move it.

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
positive rate (claims never starve bulk work, they slow it), and a key this process has sent
back for `max_wait` seconds goes regardless the next time it asks. Nothing waits while holding
a lease: the key is given back with its lease, and its next run reads and decides again.

Why a stale decision is safe: the pacer only decides *when* a plan is sent, never whether or
what. A plan given back is decided again from a fresh read on its next run; a plan sent after
its tokens carries its preconditions (resourceVersion, uid or must-not-exist) as every write
does, so a world changed meanwhile refuses it and the job reads again. A claim count read up
to `poll` seconds ago only makes one plan wait a little longer, or go a little sooner, than
a perfect count would.

The decision (`TokenBucket.reserve`) is pure, on an injected clock; `ClaimWatch` reads the
claim count from Redis (at most once per `poll` per process, cached); `Pacer` joins them.
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
#: Its default: below the ~25 writes/s an unpaced scale-down sends in all (the module's
#: docstring says what was measured).
DEFAULT_RATE = 8.0
#: Writes a bulk job may make at once after a quiet spell (the bucket's depth).
BURST = 4.0
#: No bulk key is sent back for longer than this (per process): a scale-down always moves.
MAX_WAIT = 2.0
#: How old the claim count may get before a process reads it again.
POLL = 0.05


@dataclass(frozen=True, slots=True)
class PacingSettings:
    """`rate` None: pacing is off (every write goes at once: the baseline)."""

    rate: float | None = DEFAULT_RATE
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

    `reserve(now, pressed, n)` decides one plan of `n` writes: 0.0 means send it now (its
    tokens were taken, or no claim waits and none are needed); a positive number is how long
    until a token is due, to ask again then. A plan needs one whole token to start and then
    takes all `n`, into debt if it must: later plans wait for the debt to be paid, so over
    time writes go at `rate`. Tokens accrue up to `burst`, also while no claim waits, so
    the first plan after claims appear goes at once."""

    rate: float
    burst: float
    floor: float = -float("inf")  # the deepest debt (`Pacer`: `max_wait` seconds of refill)
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

    def reserve(self, now: float, pressed: bool, n: int = 1) -> float:
        self._refill(now)
        if not pressed:
            return 0.0
        if self.tokens >= 1.0 - _EPSILON:  # a token accrued in float steps counts whole
            self.charge(n)
            return 0.0
        return (1.0 - self.tokens) / self.rate

    def charge(self, n: int) -> None:
        """Take `n` tokens, into debt if need be (a plan sent without waiting for them), no
        deeper than `floor`: a debt is never more than a bounded wait to pay off."""
        self.tokens = max(self.tokens - n, self.floor)


_EPSILON = 1e-9

Count = Callable[[], int]


class ClaimWatch:
    """How many claims wait, cluster-wide, as of at most `poll` seconds ago.

    `count` reads it (`warmpool.queue.claims.ClaimCount`); one thread at a time calls it,
    the others use the cached value meanwhile. A failed read counts as none (pacing is an
    optimisation: a Redis hiccup must not stall bulk work), logged once per failure streak."""

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

    free: int = 0  # plans sent with no claim waiting
    paced: int = 0  # plans sent on their tokens while claims waited
    writes: int = 0  # the writes of `paced` (the tokens they took)
    deferred: int = 0  # times a plan was given back to wait for a token
    overdue: int = 0  # plans sent after `max_wait` of deferrals, their tokens taken as debt


#: Above this many keys waiting for a token, those waiting longer than `max_wait` are dropped
#: from the record (a key that never came back: its instance is gone, or another process has it).
_SINCE_CAP = 1024


class Pacer:
    """Whether a bulk plan may be sent now (`reserve`), per worker process, thread-safe."""

    def __init__(self, settings: PacingSettings, watch: ClaimWatch,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if settings.rate is None:
            raise ValueError("pacing is off: make no Pacer")
        self.settings = settings
        self.watch = watch
        self._bucket = TokenBucket(settings.rate, settings.burst,
                                   floor=-settings.rate * settings.max_wait)
        self._lock = threading.Lock()
        self._clock = clock
        self._since: dict[str, float] = {}  # key -> when this process first sent it back
        self.stats = PacerStats()

    def reserve(self, key: str, writes: int) -> float:
        """0.0: send the plan of `key` (`writes` writes) now; else the seconds until a token
        is due, after which the key should run again (its plan is not sent)."""
        if writes <= 0:
            return 0.0
        pressed = self.watch.waiting() > 0
        now = self._clock()
        with self._lock:
            wait = self._bucket.reserve(now, pressed, writes)
            if wait <= 0.0:
                self._since.pop(key, None)
                if pressed:
                    self.stats.paced += 1
                    self.stats.writes += writes
                else:
                    self.stats.free += 1
                return 0.0
            first = self._since.setdefault(key, now)
            if now - first >= self.settings.max_wait:
                del self._since[key]
                self._bucket.charge(writes)
                self.stats.overdue += 1
                return 0.0
            self.stats.deferred += 1
            if len(self._since) > _SINCE_CAP:
                self._since = {k: t for k, t in self._since.items()
                               if now - t < self.settings.max_wait}
            return wait
