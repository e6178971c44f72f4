"""The idle benchmark's rows (`bench.idle`), from made-up measurements: its percentiles and
the verdicts against the polling baseline measured beside it."""

from __future__ import annotations

import math

from bench.idle import IdleResult, percentile, rows_for


def result(mode: str, commands: int, latency: float, delayed: float) -> IdleResult:
    return IdleResult(mode, window=20.0, commands=commands, workers_cpu=0.5, redis_cpu=0.2,
                      latencies=[latency] * 99 + [latency * 2],
                      delayed_latencies=[delayed] * 50)


def test_percentiles_are_nearest_rank_and_nan_for_nothing() -> None:
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 99) == 3.0
    assert math.isnan(percentile([], 50))


def test_the_doorbell_meets_when_it_is_quiet_and_no_slower() -> None:
    rows = rows_for({"doorbell": result("doorbell", 2_000, 0.004, 0.005),
                     "polling": result("polling", 200_000, 0.012, 0.015)}, 2, 8)
    assert [r.verdict for r in rows] == ["met", "met", "met"]
    assert rows[0].result == "100.0/s" and "polling: 10,000.0/s" in rows[0].baseline
    assert "p50 4.0 ms" in rows[1].result and "n=100" in rows[1].result


def test_a_doorbell_that_saves_little_or_is_slower_misses() -> None:
    rows = rows_for({"doorbell": result("doorbell", 50_000, 0.2, 0.3),
                     "polling": result("polling", 200_000, 0.012, 0.015)}, 2, 8)
    assert [r.verdict for r in rows] == ["MISSED", "MISSED", "MISSED"]
