"""The chaos tiers (see run.py for what a run does and checks).

CI tier (`-m chaos`): two seeds of 90 operations and about a dozen faults each, every fault
kind but `hostile_edits` in every seed (`watch_lag` included: one worker's watch events 3-8 s
late for 10-20 s; `worker_stop`: a lease holder SIGSTOPped past its lease TTL, then resumed;
`redis_flush_race`: Redis emptied between a race's claims and its scale-down), one quiescence
check in the middle
and one at the end; and a fourth seed of 60 operations with `hostile_edits` among every other
kind (foreign values written by hand into what the controller reads, tests/chaos/hostile.py).
A few minutes.

Long tier (`-m slow`, on demand): `pytest tests/chaos -m slow --chaos-seeds 1,2,3
--chaos-ops 10000 [--chaos-sentinels 3] [--chaos-report docs/reliability.md]`, or
`python -m tests.chaos [--sentinels 3]` (with Sentinels, the Redis fault is `redis_failover`).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from tests.chaos.config import ROOT, ChaosConfig
from tests.chaos.conftest import option
from tests.chaos.faults import FAULT_KINDS, NETWORK_KINDS
from tests.chaos.report import figures, write_figures
from tests.chaos.run import run_chaos
from warmpool.cluster.local import ClusterInfo

#: Two seeds (a cold CI run must stay under 30 minutes): 2, which found finding 16, and 3,
#: whose one long outage (30 s) no other CI seed has. Seed 1, and any other, in the long tier.
CI_SEEDS = (2, 3)
#: The two seeds' kinds: every kind of a one-server run but `hostile_edits`, which has a seed
#: of its own (below), so that these keep one fault of each kind (12 faults, 12 kinds).
CI_KINDS = tuple(k for k in FAULT_KINDS if k not in ("hostile_edits", "redis_failover")
                 and k not in NETWORK_KINDS)  # the network faults: the --hosts tier
#: The second, fourth and sixth edits of its first hostile fault (before operation 10) write a
#: fence of 99999999999999 or 10^20 on a pool object (each edit's target kind, key and value
#: are fixed draws of the fault's seed, tests/chaos/hostile.py): the values that poisoned the
#: shared fence counter (issue 27, point 1) are in this seed by construction.
HOSTILE_SEED = 25


@pytest.mark.chaos
@pytest.mark.parametrize("seed", [
    # Seed 3 (its long API outage among the faults) runs in the slow tier: CI keeps seed 2
    # and the hostile seed within a cold run's 30 minutes; the long tier runs many more.
    pytest.param(s, marks=pytest.mark.slow) if s == 3 else s for s in CI_SEEDS])
def test_chaos_ci_tier(cluster: ClusterInfo, tmp_path: Path, seed: int) -> None:
    # One fault per 7 operations: 12 faults, one of each of the 12 kinds.
    cfg = ChaosConfig(seed=seed, ops=90, ops_per_fault=7, round_ops=45,
                      outage_seconds=(4.0, 12.0), long_outages=1 if seed == 3 else 0,
                      kinds=CI_KINDS)
    result = run_chaos(cluster, cfg, tmp_path)
    print(result.report())
    assert result.ok, result.report()
    assert result.fault_count >= 7, result.report()
    assert result.faults["watch_lag"] >= 1, result.report()
    # issue 15: a lease holder frozen past its TTL and resumed, and Redis emptied between a
    # race's claims and its scale-down, in every seed
    assert result.faults["worker_stop"] >= 1, result.report()
    assert result.faults["redis_flush_race"] >= 1, result.report()
    assert result.ops["race_claim_flush_scale"] >= 1, result.report()


@pytest.mark.chaos
def test_chaos_ci_hostile_edits(cluster: ClusterInfo, tmp_path: Path) -> None:
    """Hostile edits among every other fault (issue 27): foreign fences, instance ids,
    generation and session labels, owner references written by hand while Sessions come and
    go. 0 violations of I1-I6, and the liveness check (every valid Session with room served,
    every ended holder's allow-list and route gone, within L fault-free seconds) holds."""
    # 60 operations, one fault per 4: 15 planned, every one of the 13 kinds at least once;
    # each hostile fault makes 6-10 edits.
    cfg = ChaosConfig(seed=HOSTILE_SEED, ops=60, ops_per_fault=4, round_ops=30,
                      outage_seconds=(4.0, 12.0), hostile_edits=(6, 10))
    result = run_chaos(cluster, cfg, tmp_path)
    print(result.report())
    assert result.ok, result.report()
    assert result.faults["hostile_edits"] >= 1, result.report()
    assert result.hostile_edits >= 6, result.report()
    assert result.liveness_met >= 1, result.report()


@pytest.mark.slow
@pytest.mark.timeout(0)  # hours, by design
def test_chaos_long_tier(cluster: ClusterInfo, tmp_path: Path,
                         request: pytest.FixtureRequest) -> None:
    seeds = [int(s) for s in str(option(request.config, "chaos_seeds", "1,2,3")).split(",")]
    ops = int(option(request.config, "chaos_ops", 10000))  # type: ignore[call-overload]
    sentinels = int(option(request.config, "chaos_sentinels", 0))  # type: ignore[call-overload]
    results = []
    for seed in seeds:
        cfg = ChaosConfig(seed=seed, ops=ops, ops_per_fault=25, round_ops=250,
                          long_outages=max(1, ops // 2500), sentinels=sentinels)
        result = run_chaos(cluster, cfg, tmp_path / f"seed-{seed}",
                           progress=lambda m: print(m, file=sys.stderr))
        print(result.report())
        results.append(result)
    report = option(request.config, "chaos_report", None)
    if report:
        command = "pytest " + shlex.join(request.config.invocation_params.args)
        write_figures(Path(str(report)), figures(results, command, ROOT))
    bad = [r for r in results if not r.ok]
    assert not bad, "\n\n".join(r.report() for r in bad)
