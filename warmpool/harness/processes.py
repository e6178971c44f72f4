"""The worker processes of a system: index-addressed `WorkerPool`s in this process, or one
`warmpool worker` command (the production supervisor) in a child of its own.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from workers.process import WorkerPool

_METRICS = re.compile(r"metrics=(http\S+)")
_HEALTH = re.compile(r"health=(http\S+)")


@contextlib.contextmanager
def stderr_to(path: Path | None) -> Iterator[None]:
    """Children spawned inside inherit this stderr: worker logs go to a file, not the caller's
    (None: left as it is). File descriptor 2 is the whole process's: callers serialize."""
    if path is None:
        yield
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = os.dup(2)
    os.dup2(fd, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


@dataclass(frozen=True)
class WorkerGroup:
    """Worker processes that share one environment (one `WorkerPool`).

    `proxy_client`: with the fault proxy on, this group reaches the API server through a proxy
    port of its own under that name, so a fault can single it out (the chaos runner's
    `watch_lag` delays one worker's watch streams); None: the proxy's main port.
    `host`: the group runs on host `host` of the system's hosts (`SystemOptions.hosts`), in
    its network namespace, through its links (`proxy_client` is then that host's).
    """

    processes: int
    proxy_client: str | None = None
    host: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)


class Workers:
    """The worker processes, by index, over one or more `WorkerPool`s (one per group, in the
    groups' order): faults and restarts address processes by their index here."""

    def __init__(self, pools: list[WorkerPool]) -> None:
        self.pools = pools
        self.slots = [(pool, j) for pool in pools for j in range(len(pool.procs))]

    def __len__(self) -> int:
        return len(self.slots)

    def start(self, timeout: float = 60.0) -> None:
        for pool in self.pools:
            pool.start(timeout=timeout)

    def alive(self, i: int) -> bool:
        pool, j = self.slots[i]
        proc = pool.procs[j]
        return proc is not None and proc.is_alive()

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        """Send `sig` (SIGKILL by default; SIGSTOP/SIGCONT freeze and resume)."""
        pool, j = self.slots[i]
        pool.kill(j, sig)

    @property
    def pids(self) -> list[int | None]:
        procs = [pool.procs[j] for pool, j in self.slots]
        return [proc.pid if proc is not None else None for proc in procs]

    def index_of(self, pid: int) -> int | None:
        """The index of the worker process with this pid (None: not one of ours now)."""
        for i, (pool, j) in enumerate(self.slots):
            proc = pool.procs[j]
            if proc is not None and proc.pid == pid:
                return i
        return None

    def restart(self, i: int, timeout: float = 60.0) -> None:
        pool, j = self.slots[i]
        pool.restart(j, timeout=timeout)

    def dead(self) -> list[int]:
        return [i for i in range(len(self.slots)) if not self.alive(i)]

    def stop(self, timeout: float | None = None) -> None:
        for pool in self.pools:
            with contextlib.suppress(Exception):
                pool.stop(timeout=timeout)


class WorkerCommand:
    """`python -m warmpool.cli worker` as a child process: N worker processes under the
    production supervisor, which restarts crashed ones and serves their metrics (on a free
    loopback port, printed as `metrics=<url>` in its log). It can outlive this process
    (`detach`); its worker processes are not addressable one by one."""

    def __init__(self, *, processes: int, threads: int, modules: Sequence[str],
                 env: Mapping[str, str], log_path: Path, log_level: str | None = None) -> None:
        self.args = [sys.executable, "-m", "warmpool.cli", "worker",
                     "--processes", str(processes), "--threads", str(threads),
                     # Loopback and a free port: the system's endpoints are for this machine's
                     # user only and must not collide with a real deployment's 9091.
                     "--metrics-host", "127.0.0.1", "--metrics-port", "0",
                     "--health-host", "127.0.0.1", "--health-port", "0",
                     *(a for m in modules for a in ("--module", m)),
                     *(("--log-level", log_level) if log_level else ())]
        self.env = dict(env)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, timeout: float = 120.0) -> WorkerCommand:
        """Start it and wait until its worker processes are up (its `metrics=` line)."""
        with open(self.log_path, "ab") as out:
            offset = out.tell()
            self.proc = subprocess.Popen(self.args, env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while self._log(offset).find("metrics=") < 0:
            if self.proc.poll() is not None:
                raise RuntimeError(f"warmpool worker exited with {self.proc.returncode} while "
                                   f"starting (log: {self.log_path})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"warmpool worker not up after {timeout}s "
                                   f"(log: {self.log_path})")
            time.sleep(0.1)  # polling its log for the line it prints once up
        return self

    def _log(self, offset: int = 0) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    @property
    def metrics_url(self) -> str | None:
        found = _METRICS.findall(self._log()) if self.log_path.exists() else []
        return found[-1] if found else None

    @property
    def health_url(self) -> str | None:
        """The supervisor's health endpoint (its `health=<url>` line): `/healthz`,
        `/readyz` and `/status` under it."""
        found = _HEALTH.findall(self._log()) if self.log_path.exists() else []
        return found[-1] if found else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 40.0) -> None:
        """SIGTERM (its workers drain), then SIGKILL if it outlives `timeout`."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
