"""Which Redis faults a chaos run plans: the one server's restarts and flushes, or, on a run
with Sentinels, `redis_failover` (tests/chaos/runner.py)."""

from __future__ import annotations

import random

import pytest

from tests.chaos.config import ChaosConfig
from tests.chaos.faults import (
    NETWORK_KINDS,
    SENTINEL_KINDS,
    SINGLE_REDIS_KINDS,
    fault_kinds,
    plan_faults,
)
from tests.chaos.test_chaos import CI_KINDS


def planned(cfg: ChaosConfig) -> set[str]:
    plan = plan_faults(random.Random(cfg.seed * 7919 + 1), cfg)
    return {kind for faults in plan.values() for kind, _ in faults}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_single_server_run_never_fails_over(seed: int) -> None:
    # The CI tier's three seeds plan every kind but the hostile edits (a seed of their own).
    kinds = planned(ChaosConfig(seed=seed, ops=90, ops_per_fault=7, kinds=CI_KINDS))
    assert not kinds & SENTINEL_KINDS
    assert kinds >= SINGLE_REDIS_KINDS  # every kind once: the CI tier's plan as before


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_sentinel_run_fails_over_and_never_restarts_one_server(seed: int) -> None:
    kinds = planned(ChaosConfig(seed=seed, ops=90, ops_per_fault=7, sentinels=3))
    assert "redis_failover" in kinds
    assert not kinds & SINGLE_REDIS_KINDS


def test_kinds_restrict_the_plan_and_must_fit_the_redis() -> None:
    cfg = ChaosConfig(seed=1, ops=200, ops_per_fault=10, long_outages=1, sentinels=3,
                      kinds=("redis_failover", "worker_stop"))
    assert planned(cfg) == {"redis_failover", "worker_stop"}  # no 30 s outage either
    assert "--sentinels 3 --kinds redis_failover,worker_stop" in cfg.command()
    with pytest.raises(ValueError, match="need Sentinels"):
        fault_kinds(ChaosConfig(seed=1, kinds=("redis_failover",)))
    with pytest.raises(ValueError, match="need one Redis server"):
        fault_kinds(ChaosConfig(seed=1, sentinels=3, kinds=("redis_flush",)))
    with pytest.raises(ValueError, match="unknown"):
        fault_kinds(ChaosConfig(seed=1, kinds=("typo",)))


def test_the_network_faults_are_planned_only_on_hosts() -> None:
    one_network = planned(ChaosConfig(seed=1, ops=400, ops_per_fault=4))
    assert not one_network & NETWORK_KINDS
    hosts = ChaosConfig(seed=1, ops=400, ops_per_fault=4, hosts=True)
    assert planned(hosts) >= NETWORK_KINDS
    assert hosts.command().endswith(" --hosts")
    with pytest.raises(ValueError, match="need hosts"):
        fault_kinds(ChaosConfig(seed=1, kinds=("host_partition",)))
