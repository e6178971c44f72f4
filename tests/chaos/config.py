"""A chaos run's settings, and the command line that replays them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# --- configuration ----------------------------------------------------------------------------


@dataclass
class ChaosConfig:
    seed: int
    ops: int = 80
    faults: int | None = None  # None: one per `ops_per_fault` operations
    ops_per_fault: int = 8
    round_ops: int = 100  # operations between two quiescence checks
    pace: float = 0.3  # the runner sleeps uniform(0, pace) between operations
    workers: int = 3
    threads: int = 4
    missing_grace: float = 5.0  # X: how long a held instance may stay damaged (fault-free time)
    settle_timeout: float = 240.0
    outage_seconds: tuple[float, float] = (3.0, 10.0)
    long_outages: int = 0  # outages of `long_outage_seconds`, placed at seeded positions
    long_outage_seconds: float = 30.0
    resync_period: float = 30.0
    lease_ttl: float = 3.0
    scheduler_lease: float = 6.0
    max_sessions: int = 14
    max_appdefs_per_namespace: int = 3
    history: int = 80
    poll: float = 0.4
    kinds: tuple[str, ...] | None = None  # restrict the fault kinds (None: all)
    # Redis as a primary, a replica and this many Sentinels, every process given the
    # redis+sentinel:// URL (0: one private server). Decides the Redis faults: with Sentinels
    # only `redis_failover`, without them the restarts and flushes of the one server.
    sentinels: int = 0
    lag_seconds: tuple[float, float] = (10.0, 20.0)  # a `watch_lag` window lasts this long
    lag_delay: tuple[float, float] = (3.0, 8.0)  # and delays the lagging worker's watches so
    # `hostile_edits` (tests/chaos/hostile.py): edits per fault, seconds between two, seconds
    # an edit stays in effect at most before the fault heals it, and a cap per run
    hostile_edits: tuple[int, int] = (2, 5)
    hostile_gap: tuple[float, float] = (0.3, 1.5)
    # (long enough that the controller often writes the instance meanwhile, a claim or a
    # repair: it reads a foreign fence only then)
    hostile_hold: tuple[float, float] = (5.0, 30.0)
    hostile_max: int = 400
    # keys `hostile_edits` leaves alone (e.g. "warmpool.io/fence", to see what the other keys
    # find while a known finding about the fence is still open)
    hostile_skip: tuple[str, ...] = ()
    # the many-host topology (warmpool.harness.hosts): each worker process on a host of its
    # own, the two schedulers on two more, every host reaching Redis and the API server
    # through links of its own; it adds the network faults (NETWORK_KINDS in faults.py)
    hosts: bool = False
    partition_seconds: tuple[float, float] = (4.0, 12.0)  # past the lease TTL: leases lapse
    slow_delay: tuple[float, float] = (0.05, 0.5)  # a slow link's delay, each way
    # L, the liveness bound (tests/chaos/liveness.py): every valid Session that has room is
    # served, and every ended holder's allow-list and route are gone, within L seconds of
    # fault-free time (the resync period: whatever an event missed, the resync finds)
    liveness_bound: float = 30.0

    def command(self) -> str:
        """The long tier's command line that replays this configuration."""
        lo, hi = self.outage_seconds
        extra = (f" --sentinels {self.sentinels}" if self.sentinels else "") + (
            f" --kinds {','.join(self.kinds)}" if self.kinds is not None else "") + (
            f" --hostile-skip {','.join(self.hostile_skip)}" if self.hostile_skip else "") + (
            " --hosts" if self.hosts else "")
        return (f"python -m tests.chaos --seeds {self.seed} --ops {self.ops} "
                f"--ops-per-fault {self.ops_per_fault} --round-ops {self.round_ops} "
                f"--long-outages {self.long_outages} --outage-seconds {lo:g},{hi:g}{extra}")
