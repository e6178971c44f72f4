"""The bulk-write pacer's decisions (`warmpool.kube.pacing`), on an injected clock: no
sleeps, no timed assertions."""

from __future__ import annotations

import pytest

from warmpool.kube.pacing import (
    ClaimWatch,
    Pacer,
    PacingSettings,
    TokenBucket,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.slept.append(seconds)
        self.now += seconds


# --- the bucket ----------------------------------------------------------------------------

def test_without_claims_waiting_every_write_goes_and_takes_nothing() -> None:
    bucket = TokenBucket(rate=10, burst=2)
    assert [bucket.take(100.0, pressed=False) for _ in range(50)] == [0.0] * 50
    assert bucket.tokens == 2


def test_while_claims_wait_a_burst_goes_then_one_write_per_token() -> None:
    bucket = TokenBucket(rate=10, burst=2)
    assert bucket.take(100.0, True) == 0.0
    assert bucket.take(100.0, True) == 0.0
    assert bucket.take(100.0, True) == pytest.approx(0.1)  # the next token, 1/rate away
    assert bucket.take(100.05, True) == pytest.approx(0.05)
    assert bucket.take(100.1, True) == 0.0


def test_tokens_accrue_up_to_the_burst_only() -> None:
    bucket = TokenBucket(rate=10, burst=3)
    for _ in range(3):
        bucket.take(0.0, True)
    bucket.take(1000.0, False)  # a long quiet spell
    assert [bucket.take(1000.0, True) for _ in range(4)][:3] == [0.0] * 3
    assert bucket.take(1000.0, True) > 0


def test_writes_allowed_per_second_is_the_rate_while_claims_wait() -> None:
    bucket, now, sent = TokenBucket(rate=5, burst=1), 0.0, 0
    while now < 10.0:
        wait = bucket.take(now, True)
        if wait == 0.0:
            sent += 1
        else:
            now += wait
    assert sent == 1 + 5 * 10  # the burst, then `rate` a second


def test_a_clock_that_goes_back_neither_adds_nor_removes_tokens() -> None:
    bucket = TokenBucket(rate=10, burst=1)
    bucket.take(100.0, True)
    assert bucket.take(99.0, True) == pytest.approx(0.1)
    assert bucket.take(100.1, True) == 0.0


@pytest.mark.parametrize("rate,burst", [(0, 1), (-1, 1), (1, 0.5)])
def test_a_bucket_that_could_starve_is_refused(rate: float, burst: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate=rate, burst=burst)


# --- the setting ---------------------------------------------------------------------------

def test_the_setting() -> None:
    assert PacingSettings.from_env({}).rate is None  # off unless asked for
    assert PacingSettings.from_env({"WARMPOOL_BULK_PACE": "off"}).rate is None
    assert PacingSettings.from_env({"WARMPOOL_BULK_PACE": " 7.5 "}).rate == 7.5
    for bad in ("0", "-3", "fast", "inf", "nan"):
        with pytest.raises(ValueError, match="WARMPOOL_BULK_PACE"):
            PacingSettings.from_env({"WARMPOOL_BULK_PACE": bad})


# --- the claim count's cache ---------------------------------------------------------------

def test_the_claim_count_is_read_at_most_once_per_poll() -> None:
    clock, reads = Clock(), []

    def count() -> int:
        reads.append(clock.now)
        return len(reads)

    watch = ClaimWatch(count, poll=0.05, clock=clock)
    assert watch.waiting() == 1
    clock.now += 0.04
    assert watch.waiting() == 1
    clock.now += 0.01
    assert watch.waiting() == 2
    assert len(reads) == 2


def test_a_failed_claim_count_reads_as_none_waiting() -> None:
    def count() -> int:
        raise ConnectionError("redis went away")

    assert ClaimWatch(count, poll=0.05, clock=Clock()).waiting() == 0


# --- the pacer -----------------------------------------------------------------------------

def _pacer(waiting: list[int], rate: float = 10, max_wait: float = 2.0) -> tuple[Pacer, Clock]:
    clock = Clock()
    watch = ClaimWatch(lambda: waiting[0], poll=0.05, clock=clock)
    settings = PacingSettings(rate=rate, burst=1, max_wait=max_wait, poll=0.05)
    return Pacer(settings, watch, clock=clock, sleep=clock.sleep), clock


def test_no_claim_waiting_no_wait() -> None:
    pacer, clock = _pacer([0])
    pacer.admit(30)
    assert clock.slept == [] and pacer.stats.free == 30 and pacer.stats.paced == 0


def test_while_a_claim_waits_writes_are_spread_at_the_rate() -> None:
    pacer, clock = _pacer([1], rate=10)
    start = clock.now
    for _ in range(11):
        pacer.admit()
    assert pacer.stats.paced == 11 and pacer.stats.waits == 10 and pacer.stats.overdue == 0
    assert clock.now - start == pytest.approx(1.0)  # 1 from the burst + 10 at 10/s
    assert max(clock.slept) <= 0.05 + 1e-9  # short naps: the claim count is read again


def test_the_wait_ends_when_the_claims_are_served() -> None:
    waiting = [1]
    pacer, clock = _pacer(waiting, rate=0.1)  # a token every 10 s
    pacer.admit()  # the burst
    original = clock.sleep

    def sleep(seconds: float) -> None:
        original(seconds)
        waiting[0] = 0  # served during the first nap

    pacer._sleep = sleep
    pacer.admit()
    assert len(clock.slept) == 1 and pacer.stats.free == 1


def test_no_write_waits_more_than_max_wait() -> None:
    pacer, clock = _pacer([1], rate=0.01, max_wait=2.0)  # a token every 100 s
    pacer.admit()
    start = clock.now
    pacer.admit(3)  # the three writes of one run share the bound
    assert clock.now - start == pytest.approx(2.0)
    assert pacer.stats.overdue == 3


def test_pacing_off_makes_no_pacer() -> None:
    with pytest.raises(ValueError):
        Pacer(PacingSettings(rate=None), ClaimWatch(lambda: 0, 0.05))
