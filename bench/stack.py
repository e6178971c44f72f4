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
from warmpool.harness import System, stderr_to
from warmpool.queue.inspect import Inspector
from warmpool.queue.layout import Layout
from warmpool.queue.replies import text
from warmpool.queue.settings import QueueSettings

#: How long a worker or the scheduler may take to be ready (a loaded 2-core machine).
START_TIMEOUT = 120.0


@dataclass
class Stack:
    """Worker processes and a scheduler on a private queue, for one benchmark case.

    `cluster` is the control plane as the processes reach it (`bench.cluster.through`: via the
    latency proxy). Workers import `workers.runlog` by default: the real handlers, each run
    logged to Redis first (so runs and their start times can be counted)."""

    redis_url: str
    cluster: ClusterInfo
    namespace: str
    processes: int = 2
    threads: int = 8
    modules: tuple[str, ...] = ("workers.runlog",)
    tag: str = field(default_factory=lambda: f"bench{uuid.uuid4().hex[:8]}")
    log_dir: Path | None = None
    worker_env: dict[str, str] = field(default_factory=dict)

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
            log_dir=self.log_dir, start_timeout=START_TIMEOUT)

    # the processes
    def start(self) -> None:
        """The workers, then the scheduler, each ready."""
        self.system.start()

    def stop_workers(self) -> None:
        """Stop every worker (they drain); the scheduler goes on adding keys."""
        self.system.workers.stop(timeout=30)

    def start_workers(self) -> None:
        """Start the stopped workers again, with the same options (fresh processes)."""
        with stderr_to(self.system.worker_log):
            self.system.workers.start(timeout=START_TIMEOUT)

    def stop_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop(timeout=15)

    def start_scheduler(self) -> None:
        """Start the stopped scheduler again (same arguments), ready."""
        assert self.scheduler is not None, "start() the stack first"
        self.scheduler.start(timeout=START_TIMEOUT)

    @property
    def scheduler(self) -> SchedulerProcess | None:
        return self.system.schedulers[0] if self.system.schedulers else None

    def worker_pids(self) -> list[int]:
        return [p for p in self.system.workers.pids if p]

    def kill_worker(self, pid: int) -> None:
        """SIGKILL the worker process `pid` (one of ours)."""
        i = self.system.workers.index_of(pid)
        if i is None:
            raise RuntimeError(f"pid {pid} is not one of the stack's worker processes")
        self.system.kill_worker(i)

    # the queue
    @property
    def settings(self) -> QueueSettings:
        return self.system.settings

    @property
    def client(self) -> redis.Redis:
        return self.system.client

    @property
    def inspector(self) -> Inspector:
        return self.system.inspector

    def idle(self) -> bool:
        s = self.inspector.stats()
        return s.waiting == 0 and s.running == 0 and s.delayed == 0

    def wait_idle(self, timeout: float = 120.0, settle: float = 0.5) -> bool:
        """Idle, and still idle `settle` seconds later (a run may add follow-ups, and its
        writes' watch events may add keys): the end of a measured window, not a test's
        proof (that is `System.wait_quiet`). False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.idle():
                time.sleep(settle)  # the window's tail: follow-ups may still be on their way
                if self.idle():
                    return True
            time.sleep(0.1)  # polling the queue
        return False

    # the run log
    @property
    def starts_key(self) -> str:
        return Layout.of(self.settings).runs_started

    def _log(self, name: str) -> list[tuple[float, str]]:
        out = []
        for raw in self.client.lrange(name, 0, -1):
            t, _, key = text(raw).partition(" ")
            out.append((float(t), key))
        return out

    def starts(self) -> list[tuple[float, str]]:
        """Every job start logged so far: (time.time(), key)."""
        return self._log(self.starts_key)

    def durations(self, kind: str) -> list[float]:
        """Seconds each finished run of `kind` keys took (a key's runs never overlap, so its
        i-th end belongs to its i-th start)."""
        starts: dict[str, list[float]] = {}
        for t, key in self.starts():
            starts.setdefault(key, []).append(t)
        ends: dict[str, list[float]] = {}
        for t, key in self._log(Layout.of(self.settings).runs_ended):
            ends.setdefault(key, []).append(t)
        return [e - s for key, es in ends.items() if key.startswith(kind + "/")
                for s, e in zip(starts.get(key, []), es, strict=False)]

    def clear_starts(self) -> None:
        layout = Layout.of(self.settings)
        self.client.delete(layout.runs_started, layout.runs_ended)

    def close(self) -> None:
        """Stop the scheduler and the workers; remove the run's keys from Redis."""
        self.system.stop()
