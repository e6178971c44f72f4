"""The system a cluster benchmark measures, started by the one system harness
(`warmpool.harness.System`) on the bench's terms, and what the bench reads of it.

The terms: the Redis at a URL with every key under a tag unique to the run (removed at
`close`), real worker processes that log their runs (`workers.runlog`) and one scheduler
without leader election or metrics, all reaching the API server the way the caller says (the
bench's latency proxy). What the bench reads: the run log (each job's start, each run's
duration) and whether the queue is idle.

Two waits, on purpose: `System.wait_quiet(since=mark)` means "the work this change caused has
run" (a test's question); `Stack.wait_idle` means "the queue has drained and stayed drained
`settle` seconds", whatever caused the work. A benchmark's window ends at the latter: it
counts the follow-ups a run's own writes cause once their watch events arrive, which a
quiet-wait does not wait for.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import redis

from scheduler.process import SchedulerProcess
from warmpool.cluster.local import ClusterInfo
from warmpool.harness import RunLog, System
from warmpool.harness.quiet import owed
from warmpool.queue.inspect import Inspector
from warmpool.queue.layout import Layout
from warmpool.queue.settings import QueueSettings

#: How long a worker or the scheduler may take to be ready (a loaded 2-core machine).
START_TIMEOUT = 120.0


@dataclass
class Stack:
    """Worker processes and a scheduler on a private queue, for one benchmark case.

    `kubeconfig` is how the processes reach `cluster`'s API server (the bench's latency
    proxy, which outlives the stack; None: directly). Workers import `workers.runlog` by
    default: the real handlers, each run logged to Redis first (so runs and their start times
    can be counted)."""

    redis_url: str
    cluster: ClusterInfo
    namespace: str
    processes: int = 2
    threads: int = 8
    modules: tuple[str, ...] = ("workers.runlog",)
    tag: str = field(default_factory=lambda: f"bench{uuid.uuid4().hex[:8]}")
    log_dir: Path | None = None
    worker_env: dict[str, str] = field(default_factory=dict)
    kubeconfig: Path | None = None

    def __post_init__(self) -> None:
        self.system = System(
            self.cluster, namespaces=[self.namespace], workers=self.processes,
            threads=self.threads, worker_modules=self.modules,
            # No gateway routes to the instances here: a URL probe would only fail (the
            # claims measured are the pool's; the probe runs off the claim path anyway).
            # Strict minInstances: the pool benchmarks measure claims of prewarmed instances
            # (a burst would make up to maxInstances, the ceiling here, under churn).
            worker_env={"WARMPOOL_URL_PROBE": "off", "WARMPOOL_BURST": "off",
                        **self.worker_env},
            leader_elect=False, scheduler_args=("--no-metrics",), log_level="WARNING",
            env={"PYTHONWARNINGS": "ignore"}, redis=self.redis_url, tag=self.tag,
            log_dir=self.log_dir, start_timeout=START_TIMEOUT, kubeconfig=self.kubeconfig)

    # the processes
    def start(self) -> None:
        """The workers, then the scheduler, each ready."""
        self.system.start()

    def stop_workers(self) -> None:
        """Stop every worker (they drain); the scheduler goes on adding keys."""
        self.system.stop_workers(timeout=30)

    def start_workers(self) -> None:
        """Start the workers again, with the same options (fresh processes), ready."""
        self.system.start_workers()

    def restart_workers(self, env: dict[str, str]) -> None:
        """Stop the workers, then start fresh ones with `env` added to their environment
        (a setting compared within one run, e.g. WARMPOOL_BULK_PACE)."""
        self.stop_workers()
        self.worker_env = {**self.worker_env, **env}
        self.system.options = self.system.options.replace(
            worker_env={**self.system.options.worker_env, **env})
        self.start_workers()

    def stop_scheduler(self) -> None:
        self.system.stop_schedulers(timeout=15)

    def start_scheduler(self) -> None:
        """Start the scheduler again (same arguments), ready."""
        self.system.start_schedulers()

    @property
    def scheduler(self) -> SchedulerProcess | None:
        """The scheduler while it runs."""
        return self.system.schedulers[0] if self.system.schedulers else None

    def worker_pids(self) -> list[int]:
        return [p for p in self.system.workers.pids if p]

    def kill_worker(self, pid: int) -> None:
        """SIGKILL the worker process `pid` (one of ours)."""
        i = self.system.workers.index_of(pid)
        if i is None:
            raise RuntimeError(f"pid {pid} is not one of the stack's worker processes")
        self.system.kill_worker(i)

    # the queue and the run log
    @property
    def settings(self) -> QueueSettings:
        return self.system.settings

    @property
    def client(self) -> redis.Redis:
        return self.system.client

    @property
    def inspector(self) -> Inspector:
        return self.system.inspector

    @property
    def runs(self) -> RunLog:
        """Every job's start and end (`starts()`, `durations(kind)`, `clear()`)."""
        return self.system.runs

    def wait_idle(self, timeout: float = 120.0, settle: float = 0.5) -> bool:
        """Idle (nothing waiting, running or delayed but timers: `quiet.owed`, a pool's next
        schedule edge is not work), and still idle `settle` seconds later (a run may add
        follow-ups, and its writes' watch events may add keys): the end of a measured
        window, not a test's proof (that is `System.wait_quiet`). False on timeout."""
        deadline = time.monotonic() + timeout
        layout = Layout.of(self.system.settings)

        def idle() -> bool:
            return owed(self.inspector, self.system.client, layout) is None

        while time.monotonic() < deadline:
            if idle():
                time.sleep(settle)  # the window's tail: follow-ups may still be on their way
                if idle():
                    return True
            time.sleep(0.1)  # polling the queue
        return False

    def close(self) -> None:
        """Stop the scheduler and the workers; remove the run's keys from Redis."""
        self.system.stop()
