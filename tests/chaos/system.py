"""The system a chaos run attacks, started by `warmpool.harness`: a private Redis (or Sentinels),
the fault proxy, worker processes (the last one on a proxy port of its own) and two schedulers;
with `ChaosConfig.hosts`, each worker and each scheduler on a host (network namespace) of its own.

Workers and schedulers reach the API server through the proxy; the runner and its checks talk
to the real server directly, so they see the truth while the controller sees faults.
"""

from __future__ import annotations

from pathlib import Path

from tests.chaos.config import ChaosConfig
from tests.integration.sentinel_cluster import sentinel_cluster
from warmpool.cluster.local import ClusterInfo
from warmpool.harness import SentinelRedis, System, SystemOptions, WorkerGroup
from warmpool.queue.settings import QueueSettings

#: The proxy's client name of the worker process whose watches `watch_lag` delays.
LAGGING = "lagging-worker"


def lagging_client(cfg: ChaosConfig) -> str:
    """The proxy client `watch_lag` delays: with hosts, the last worker's host."""
    return f"host-{cfg.workers - 1}" if cfg.hosts else LAGGING


def chaos_system(cluster: ClusterInfo, cfg: ChaosConfig, workdir: Path,
                 namespaces: list[str]) -> System:
    """Not started yet: its proxy's records can be handed out first (`System.proxy`)."""
    lease = cfg.lease_ttl
    redis = (SentinelRedis(lambda: sentinel_cluster(replicas=1, sentinels=cfg.sentinels,
                                                     directory=workdir / "sentinel"))
             if cfg.sentinels else "private")
    # A `WorkerPool` gives all its processes one environment, and the lagging worker needs a
    # KUBECONFIG of its own (the proxy's second port): a group of one, last, beside the others.
    # With hosts, every worker is a group of one on its own host (and its own proxy port).
    if cfg.hosts:
        groups = [WorkerGroup(1, host=i) for i in range(cfg.workers)]
    else:
        groups = [WorkerGroup(cfg.workers - 1)] if cfg.workers > 1 else []
        groups.append(WorkerGroup(1, proxy_client=LAGGING))
    hosts = cfg.workers + 2 if cfg.hosts else 0
    return System(cluster, SystemOptions(
        namespaces=namespaces, worker_groups=groups, threads=cfg.threads,
        hosts=hosts, scheduler_hosts=[cfg.workers, cfg.workers + 1] if hosts else [],
        worker_modules=("workers.handlers",),
        schedulers=2, leader_lease=cfg.scheduler_lease, resync_period=cfg.resync_period,
        scheduler_identity="chaos-scheduler", scheduler_args=("--watch-timeout", "60", "120"),
        proxy=True, proxy_seed=cfg.seed, redis=redis,
        queue=QueueSettings(lease_ttl=lease, heartbeat_timeout=lease, recovery_period=0.25,
                            drain_timeout=5),
        tag=None, workdir=workdir, log_level="INFO"))
