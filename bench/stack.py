"""A private queue with real worker processes and a real scheduler on it: queue settings
unique to the run (Redis key prefix and dramatiq namespace), the processes, and the run log
the workers write (job starts and ends, for counting runs and their durations)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import redis

from bench import REPO
from scheduler.process import SchedulerProcess
from warmpool.queue.inspect import Inspector
from warmpool.queue.redis_conn import connect as redis_connect
from warmpool.queue.replies import text
from warmpool.queue.settings import QueueSettings
from workers.process import WorkerPool


@dataclass
class Stack:
    """Queue settings unique to this run, worker processes and a scheduler on them.

    Workers import `workers.runlog` by default: the real handlers, each run logged to Redis
    first (so runs and their start times can be counted)."""

    redis_url: str
    kubeconfig: Path
    namespace: str
    processes: int = 2
    threads: int = 8
    modules: tuple[str, ...] = ("workers.runlog",)
    tag: str = field(default_factory=lambda: f"bench{uuid.uuid4().hex[:8]}")
    log_dir: Path | None = None
    worker_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.settings = QueueSettings(redis_url=self.redis_url, prefix=f"{self.tag}:warmpool:",
                                      namespace=f"{self.tag}:dramatiq")
        self.client: redis.Redis = redis_connect(self.redis_url)
        self.workers: WorkerPool | None = None
        self.scheduler: SchedulerProcess | None = None
        self.inspector = Inspector(self.client, self.settings)

    # workers
    def start_workers(self, processes: int | None = None, threads: int | None = None) -> None:
        self.workers = WorkerPool(
            self.settings, processes=processes or self.processes,
            threads=threads or self.threads, modules=self.modules,
            # No gateway routes to the instances here: a URL probe would only fail (the
            # claims measured are the pool's; the probe runs off the claim path anyway).
            # Strict minInstances: the pool benchmarks measure claims of prewarmed instances
            # (a burst would make up to maxInstances, the ceiling here, under churn).
            env={"KUBECONFIG": str(self.kubeconfig), "WARMPOOL_URL_PROBE": "off",
                 "WARMPOOL_BURST": "off", **self.worker_env})
        self.workers.start(timeout=120)

    def stop_workers(self) -> None:
        if self.workers is not None:
            self.workers.stop(timeout=30)
            self.workers = None

    def worker_pids(self) -> list[int]:
        return [p for p in (self.workers.pids if self.workers else []) if p]

    # scheduler
    def scheduler_env(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfig), "WARMPOOL_REDIS_URL": self.redis_url,
                "WARMPOOL_QUEUE_PREFIX": self.settings.prefix,
                "WARMPOOL_QUEUE_NAMESPACE": self.settings.namespace,
                "PYTHONWARNINGS": "ignore"}

    def start_scheduler(self) -> None:
        log_path = (self.log_dir / f"scheduler-{self.tag}.log") if self.log_dir else None
        self.scheduler = SchedulerProcess(
            ["--no-leader-elect", "--namespace", self.namespace, "--no-metrics",
             "--log-level", "WARNING"],
            env=self.scheduler_env(), log_path=log_path, cwd=REPO)
        self.scheduler.start(timeout=120)

    def stop_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop(timeout=15)
            self.scheduler = None

    # the queue
    def idle(self) -> bool:
        s = self.inspector.stats()
        return s.waiting == 0 and s.running == 0 and s.delayed == 0

    def wait_idle(self, timeout: float = 120.0, settle: float = 0.5) -> bool:
        """Idle, and still idle `settle` seconds later (a run may add follow-ups)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.idle():
                time.sleep(settle)
                if self.idle():
                    return True
            time.sleep(0.1)
        return False

    @property
    def starts_key(self) -> str:
        from workers.runlog import starts_key

        return starts_key(self.settings)

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
        from workers.runlog import ends_key

        starts: dict[str, list[float]] = {}
        for t, key in self.starts():
            starts.setdefault(key, []).append(t)
        ends: dict[str, list[float]] = {}
        for t, key in self._log(ends_key(self.settings)):
            ends.setdefault(key, []).append(t)
        return [e - s for key, es in ends.items() if key.startswith(kind + "/")
                for s, e in zip(starts.get(key, []), es, strict=False)]

    def clear_starts(self) -> None:
        from workers.runlog import ends_key

        self.client.delete(self.starts_key, ends_key(self.settings))

    def close(self) -> None:
        try:
            self.stop_scheduler()
        finally:
            self.stop_workers()
            batch = list(self.client.scan_iter(match=f"{self.tag}:*", count=1000))
            for i in range(0, len(batch), 500):
                self.client.delete(*batch[i : i + 500])
