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

    def __call__(self) -> float:
        return self.now



# --- the bucket ----------------------------------------------------------------------------

def test_without_claims_waiting_every_plan_goes_and_takes_nothing() -> None:
    bucket = TokenBucket(rate=10, burst=2)
    assert [bucket.reserve(100.0, False, 5) for _ in range(50)] == [0.0] * 50
    assert bucket.tokens == 2


def test_while_claims_wait_a_plan_takes_a_token_per_write_into_debt() -> None:
    bucket = TokenBucket(rate=10, burst=2)
    assert bucket.reserve(100.0, True, 1) == 0.0
    assert bucket.reserve(100.0, True, 3) == 0.0  # one whole token starts a plan of 3
    assert bucket.tokens == pytest.approx(-2.0)
    assert bucket.reserve(100.0, True, 1) == pytest.approx(0.3)  # the debt, then a token
    assert bucket.reserve(100.2, True, 1) == pytest.approx(0.1)
    assert bucket.reserve(100.3, True, 1) == 0.0


def test_tokens_accrue_up_to_the_burst_only() -> None:
    bucket = TokenBucket(rate=10, burst=3)
    bucket.reserve(0.0, True, 3)
    bucket.reserve(1000.0, False)  # a long quiet spell
    assert [bucket.reserve(1000.0, True) for _ in range(3)] == [0.0] * 3
    assert bucket.reserve(1000.0, True) > 0


def test_writes_allowed_per_second_is_the_rate_while_claims_wait() -> None:
    bucket, now, sent = TokenBucket(rate=5, burst=1), 0.0, 0
    while now < 10.0:
        wait = bucket.reserve(now, True, 2)  # plans of two writes
        if wait == 0.0:
            sent += 2
        else:
            now += wait
    assert 5 * 10 <= sent <= 5 * 10 + 2  # `rate` a second, give or take the last plan


def test_a_clock_that_goes_back_neither_adds_nor_removes_tokens() -> None:
    bucket = TokenBucket(rate=10, burst=1)
    bucket.reserve(100.0, True)
    assert bucket.reserve(99.0, True) == pytest.approx(0.1)
    assert bucket.reserve(100.1, True) == 0.0


def test_a_debt_is_never_deeper_than_the_floor() -> None:
    bucket = TokenBucket(rate=10, burst=1, floor=-20)
    bucket.charge(1000)
    assert bucket.tokens == -20
    assert bucket.reserve(0.0, True) == pytest.approx(2.1)  # at most floor/rate, and a token


@pytest.mark.parametrize("rate,burst", [(0, 1), (-1, 1), (1, 0.5)])
def test_a_bucket_that_could_starve_is_refused(rate: float, burst: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate=rate, burst=burst)


# --- the setting ---------------------------------------------------------------------------

def test_the_setting() -> None:
    assert PacingSettings.from_env({}).rate == 8.0
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
    return Pacer(settings, watch, clock=clock), clock


def test_no_claim_waiting_no_wait() -> None:
    pacer, _ = _pacer([0])
    assert [pacer.reserve(f"instance/ns/a/{i}", 5) for i in range(30)] == [0.0] * 30
    assert pacer.stats.free == 30 and pacer.stats.paced == 0


def test_while_a_claim_waits_plans_are_sent_back_until_their_token_is_due() -> None:
    pacer, clock = _pacer([1], rate=10)
    assert pacer.reserve("instance/ns/a/1", 3) == 0.0  # the burst's token, 3 in debt
    wait = pacer.reserve("instance/ns/a/2", 3)
    assert wait == pytest.approx(0.3)
    clock.now += wait
    assert pacer.reserve("instance/ns/a/2", 3) == 0.0
    assert pacer.stats.paced == 2 and pacer.stats.writes == 6 and pacer.stats.deferred == 1


def test_the_wait_ends_when_the_claims_are_served() -> None:
    waiting = [1]
    pacer, clock = _pacer(waiting, rate=0.1)  # a token every 10 s
    pacer.reserve("instance/ns/a/1", 1)
    assert pacer.reserve("instance/ns/a/2", 1) > 0
    waiting[0] = 0
    clock.now += 0.05  # the count is read again
    assert pacer.reserve("instance/ns/a/2", 1) == 0.0 and pacer.stats.free == 1


def test_no_key_is_sent_back_for_longer_than_max_wait() -> None:
    pacer, clock = _pacer([1], rate=0.01, max_wait=2.0)  # a token every 100 s
    pacer.reserve("instance/ns/a/1", 1)
    key = "instance/ns/a/2"
    assert pacer.reserve(key, 4) > 0
    clock.now += 1.9
    assert pacer.reserve(key, 4) > 0
    clock.now += 0.1
    assert pacer.reserve(key, 4) == 0.0  # overdue: sent, its tokens taken as debt
    assert pacer.stats.overdue == 1 and pacer.stats.deferred == 2
    assert pacer.reserve(key, 4) > 0  # a new plan of the key waits afresh


def test_a_plan_without_writes_is_never_held() -> None:
    pacer, _ = _pacer([1], rate=0.01)
    pacer.reserve("instance/ns/a/1", 1)
    assert pacer.reserve("instance/ns/a/2", 0) == 0.0


def test_pacing_off_makes_no_pacer() -> None:
    with pytest.raises(ValueError):
        Pacer(PacingSettings(rate=None), ClaimWatch(lambda: 0, 0.05))
