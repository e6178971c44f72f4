"""The whole system on one machine: control plane, Redis, scheduler and worker processes.

The demo runs on it, and so can tests and benchmarks that need the real thing end to end. Every
process it starts is a child it tracks and stops (SIGTERM, then SIGKILL), so nothing outlives it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from warmpool.cluster import local
from warmpool.queue.embedded import EmbeddedRedis, embedded_redis


@dataclass
class LocalStack:
    state_dir: Path
    namespace: str
    workers: int = 2
    threads: int = 4
    redis_url: str | None = None
    cluster: local.ClusterInfo | None = None
    _redis: EmbeddedRedis | None = None
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        assert self.cluster is not None and self.redis_url is not None
        return {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig),
                "WARMPOOL_REDIS_URL": self.redis_url, "WARMPOOL_NAMESPACE": self.namespace,
                # No gateway in the local stack routes to an instance: the URL comes with
                # HANDLED (session-lifecycle §2, the probe switched off).
                "WARMPOOL_URL_PROBE": os.environ.get("WARMPOOL_URL_PROBE", "off"),
                "PYTHONUNBUFFERED": "1"}

    def start_cluster(self) -> local.ClusterInfo:
        if not local.binaries_present():
            local.build(progress=True)
        self.cluster = local.up(self.state_dir / "cluster")
        return self.cluster

    def start_redis(self) -> str:
        """WARMPOOL_REDIS_URL when set, else an embedded server of our own."""
        self.redis_url = os.environ.get("WARMPOOL_REDIS_URL")
        if not self.redis_url:
            self._redis = embedded_redis(unix_socket=False)
            self.redis_url = self._redis.url
        return self.redis_url

    def _spawn(self, name: str, *args: str) -> None:
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "ab") as out:
            self._procs[name] = subprocess.Popen(
                [sys.executable, "-m", "warmpool.cli", *args], env=self.env,
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    # Loopback and free ports: the demo's endpoints are for this machine's user only, and must
    # not collide with a real deployment's 9090/9091/8080 on the same host.
    _LOCAL_ENDPOINTS = ("--metrics-host", "127.0.0.1", "--metrics-port", "0")

    def start_workers(self) -> None:
        self._spawn("workers", "worker", "--processes", str(self.workers),
                    "--threads", str(self.threads), *self._LOCAL_ENDPOINTS)

    def start_scheduler(self) -> None:
        self._spawn("scheduler", "scheduler", "--namespace", self.namespace,
                    "--health-port", "0", *self._LOCAL_ENDPOINTS)

    def metrics_urls(self) -> dict[str, str]:
        """The /metrics URL each process printed at start (`metrics=<url>` in its log)."""
        urls = {}
        for name in self._procs:
            log = self.log_path(name).read_text(errors="replace")
            found = re.findall(r"metrics=(http\S+)", log)
            if found:
                urls[name] = found[-1]
        return urls

    def log_path(self, name: str) -> Path:
        return self.state_dir / "logs" / f"{name}.log"

    def dead(self) -> list[str]:
        """Processes that exited on their own (a crash the caller should report)."""
        return [n for n, p in self._procs.items() if p.poll() is not None]

    def stop_processes(self, timeout: float = 20.0) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self._procs.values():
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()

    def detach(self) -> list[int]:
        """Leave everything running after this process exits; returns the pids to stop later
        (the control plane is stopped with `warmpool cluster down --state-dir ...`)."""
        pids = [p.pid for p in self._procs.values()]
        if self._redis is not None and (pid := self._redis.detach()) is not None:
            pids.append(pid)
        return pids

    def stop(self, keep_cluster: bool = False) -> None:
        self.stop_processes()
        if self._redis is not None:
            self._redis.stop()
            self._redis = None
        if not keep_cluster and self.cluster is not None:
            local.down(self.state_dir / "cluster")
