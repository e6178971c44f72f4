"""The issue #28 rows of `python -m bench all`, from made-up measurements: the rate sweep's
verdicts and its highest rate, the churn cost rows, and the warm-claim share (which free
instances count as warm, and which claims had one available)."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest

from bench.claim_latency import ChurnResult, ClaimBench, parse_rates, rows_for, sweep_rows
from bench.warm import Claimed, WarmResult, _pool_stub, free_warm
from bench.warm import rows_for as warm_rows
from bench.world import pod_stub
from warmpool.pool import vocabulary as v


def churn(rate: float, latencies: list[float], unserved: int = 0, *, lists: int = 0,
          workers: float = 0.0) -> ChurnResult:
    res = ChurnResult(rate=rate, window=60.0, created=len(latencies) + unserved,
                      served=latencies, unserved=unserved, duration=90.0, scale_down=40.0)
    res.cpu.used = {"workers": workers, "scheduler": 0.0, "redis": 0.0, "kube-apiserver": 9.0}
    res.cpu.wall = 90.0
    if lists:
        res.etcd_lists["*core.Pod"] = lists
    return res


def test_rates_parse_once_each_and_refuse_nonpositive() -> None:
    assert parse_rates("8,12, 16,20,12") == [8.0, 12.0, 16.0, 20.0]
    assert parse_rates("") == []
    with pytest.raises(argparse.ArgumentTypeError):
        parse_rates("8,0")


def test_the_sweep_names_the_highest_rate_that_met_and_flags_a_gap() -> None:
    out = ClaimBench()
    out.sweep = {8.0: churn(8, [0.1] * 100, workers=1.0),
                 12.0: churn(12, [0.2] * 100, workers=2.0),
                 16.0: churn(16, [0.2] * 90 + [3.0] * 10),  # p99 3 s
                 20.0: churn(20, [0.3] * 100, unserved=1)}
    rows = sweep_rows(out, 1000, 100, 20.0)
    by_case = {r.case: r for r in rows}
    assert [by_case[f"{r} Sessions/s during 1000→100"].verdict for r in (8, 12, 16, 20)] == [
        "met", "met", "MISSED", "MISSED"]
    best = by_case["highest rate with p99 <= 1 s and 0 unserved, during 1000→100"]
    assert (best.result, best.verdict) == ("12 Sessions/s", "met")
    assert "not monotonic" not in best.note
    out.sweep[16.0] = churn(16, [0.2] * 100)
    out.sweep[12.0] = churn(12, [2.0] * 100)
    best = {r.case: r for r in sweep_rows(out, 1000, 100, 20.0)}[best.case]
    assert best.result == "16 Sessions/s" and "not monotonic" in best.note


def test_churn_cost_rows_hold_every_rate_to_the_goal() -> None:
    out = ClaimBench()
    out.sweep = {8.0: churn(8, [0.1] * 100, workers=2.0),  # 20 ms / Session
                 12.0: churn(12, [0.1] * 100, workers=2.0, lists=5)}
    rows = {r.case.split(",")[0]: r for r in sweep_rows(out, 1000, 100, 20.0)}
    lists = rows["LISTs answered by etcd per served Session"]
    assert lists.result == ("8/s 0.00 (0.00 with admission's); 12/s 0.05 (0.05 with "
                            "admission's)") and lists.verdict == "MISSED"
    out.sweep[12.0].etcd_lists = Counter({"*[]core.LimitRange": 5})
    lists = {r.case: r for r in sweep_rows(out, 1000, 100, 20.0)}[lists.case]
    assert lists.verdict == "met" and "12/s 0.00 (0.05 with admission's)" in lists.result
    # The API server's repair loops list every Service: not the controller's, unless the
    # proxy saw the controller send Service scans (then as many as it sent count).
    out.sweep[12.0].etcd_lists = Counter({"*[]core.Service": 2})
    assert {r.case: r for r in sweep_rows(out, 1000, 100, 20.0)}[lists.case].verdict == "met"
    out.sweep[12.0].controller_etcd_lists = Counter({"services consistent": 1,
                                                     "pods one object": 7})
    lists = {r.case: r for r in sweep_rows(out, 1000, 100, 20.0)}[lists.case]
    assert lists.verdict == "MISSED" and "12/s 0.01 (0.02 with admission's)" in lists.result
    assert "services consistent 1" in lists.note and "pods one object 7" in lists.note
    cpu = rows["controller CPU per served Session (workers + scheduler + Redis)"]
    assert cpu.result == "8/s 20 ms; 12/s 20 ms" and cpu.verdict == "met"  # apiserver not in


def test_the_slow_rate_row_has_the_sweep_goal_and_a_verdict() -> None:
    out = ClaimBench(workers=churn(20, [0.3] * 100), slow=churn(8, [0.5] * 100),
                     steady=churn(2, [0.2] * 60))
    rows = {r.case: r for r in rows_for(out, 1000, 100, 20.0, 2.0)}
    slow = rows["8 Sessions/s during 1000→100"]
    assert (slow.goal, slow.verdict) == ("p99 <= 1000 ms, 0 unserved", "met")
    steady = rows["2 Sessions/s, steady 100-instance pool"]
    assert (steady.goal, steady.verdict) == ("p99 <= 150 ms, 0 unserved", "MISSED")


def _service(k: int, *, claimed: bool = False, internal: bool = False,
             gen: str = "2") -> dict[str, object]:
    labels = {v.LABEL_GENERATION: gen}
    if internal:
        labels[v.LABEL_SERVICE_TYPE] = v.SERVICE_TYPE_INTERNAL
    refs = [{"kind": v.SESSION_KIND, "name": "s", "uid": "u"}] if claimed else []
    return _pool_stub("Service", {"metadata": {
        "name": f"instance-{k}-java-abc{'-int' if internal else ''}", "labels": labels,
        "ownerReferences": refs}})


def _deployment(k: int, gen: str = "2") -> dict[str, object]:
    return _pool_stub("Deployment", {"metadata": {"name": f"instance-{k}-java-abc",
                                                  "labels": {v.LABEL_GENERATION: gen}}})


def _pod(k: int, *, ready: bool, deleting: bool = False) -> dict[str, object]:
    meta: dict[str, object] = {
        "name": f"instance-{k}-java-abc-h4sh-xyz", "labels": {"pod-template-hash": "h4sh"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": f"instance-{k}-java-abc-h4sh",
                             "controller": True}]}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T20:00:00Z"
    status = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return pod_stub("Pod", {"metadata": meta, "status": status})


def test_warm_means_free_at_the_generation_with_a_current_pod_ready() -> None:
    services = [_service(1), _service(1, internal=True, claimed=True), _service(2, claimed=True),
                _service(3), _service(4), _service(5), _service(6, gen="1")]
    deployments = [_deployment(k) for k in range(1, 6)] + [_deployment(6, gen="1")]
    pods = [_pod(1, ready=True), _pod(2, ready=True), _pod(3, ready=False),
            _pod(4, ready=True, deleting=True), _pod(5, ready=True), _pod(6, ready=True)]
    # 2 claimed; 3 starting; 4's only Ready pod is on its way out (a reset); 6 outdated
    assert free_warm(services, deployments, pods, "2") == {1, 5}


def test_the_warm_share_counts_only_claims_that_had_a_warm_instance() -> None:
    res = WarmResult(claims=[Claimed("a", "1", True, True), Claimed("b", "2", False, False),
                             Claimed("c", "3", False, True, ((5, 0.5), (6, 2.0)), 0.3),
                             Claimed("d", "4", True, True)])
    assert res.share() == pytest.approx(2 / 3)
    row = warm_rows(res, None, 20, 2.0, 2.0, 5.0, 40, 10)[0]
    assert row.verdict == "MISSED" and row.result.startswith("2 of 3 claims")
    assert "cold claims took ids 2, 3" in row.note
    assert ("c took 3 (0.30 s after its create) while 5 (warm 0.5 s before the create), "
            "6 (warm 2.0 s before the create) were free and warm throughout") in row.note
    res.claims[2] = Claimed("c", "3", True, True)
    assert warm_rows(res, None, 20, 2.0, 2.0, 5.0, 40, 10)[0].verdict == "met"


def test_older_waiting_counts_the_sessions_sent_before_and_not_yet_handled() -> None:
    from bench.claim_latency import Churn

    churn = Churn(None, "ns", 1.0, 2.0, prefix="w")  # type: ignore[arg-type]  # never started
    churn.sent = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    churn.handled = {"b": 2.5}
    assert churn.older_waiting(4.0) == 2  # a and c; b served, d is the one asking
    assert churn.older_waiting(1.0) == 0
