"""N worker processes x T threads, each a dramatiq Worker on the keyed broker.

Processes are started with the "spawn" method: the parent may have threads (a test runner,
an embedded Redis watcher), and forking a threaded process is unsafe. Each child imports the
handler modules it is given (which `register` their handlers), builds its own broker and
Redis connections, and drains on SIGTERM: running jobs finish and release their keys,
prefetched messages go back to the queue.

Metrics (``metrics_dir``): each child writes its series to files in that directory
(prometheus-client's multiprocess mode; the parent serves them, see metrics/exposition.py).
The pool empties it before the first child starts, and removes a dead child's live-gauge
files (``mark_process_dead``) as soon as it sees it dead, before any replacement starts, so a
SIGKILLed child's running jobs stop counting. Without ``metrics_dir`` the children run with
``PROMETHEUS_MULTIPROC_DIR`` unset (even if this process has it), so they write no files.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as MpEvent
from types import TracebackType

from warmpool import logs
from warmpool.queue.settings import QueueSettings

log = logging.getLogger(__name__)

DEFAULT_MODULES = ("workers.handlers",)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def run_worker_process(
    settings: QueueSettings,
    threads: int,
    modules: Sequence[str],
    env: dict[str, str] | None = None,
    ready: MpEvent | None = None,
    log_level: int = logging.WARNING,
    metrics_dir: str | None = None,
    log_format: str = "text",
) -> None:
    """Entry point of one worker process; returns after a SIGTERM/SIGINT-triggered drain."""
    os.environ.update(env or {})
    # Before anything creates a metric: prometheus-client picks its mode from this variable.
    if metrics_dir:
        os.environ[MULTIPROC_ENV] = metrics_dir
    else:
        os.environ.pop(MULTIPROC_ENV, None)
    logs.setup("worker", log_level, log_format)
    from metrics.worker import install

    install()  # the queue observer: before the broker is built
    for name in modules:
        importlib.import_module(name)
    from workers.runtime import start_worker

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    parent = os.getppid()
    running = start_worker(settings, threads=threads)
    if ready is not None:
        ready.set()
    while not stop.wait(1.0):
        if os.getppid() != parent:
            # The supervisor was killed without stopping us: drain and exit rather than run
            # on unsupervised (nobody would restart, stop or count this process).
            logging.getLogger(__name__).warning(
                "parent process %d is gone; draining and exiting", parent)
            break
    running.stop()


class WorkerPool:
    """Starts, stops, kills and restarts worker processes (the CLI and the tests use it)."""

    def __init__(
        self,
        settings: QueueSettings,
        *,
        processes: int = 2,
        threads: int = 8,
        modules: Sequence[str] = DEFAULT_MODULES,
        env: dict[str, str] | None = None,
        log_level: int = logging.WARNING,
        metrics_dir: str | os.PathLike[str] | None = None,
        log_format: str = "text",
    ) -> None:
        if settings.redis_url is None:
            raise ValueError("resolve settings.redis_url before starting worker processes")
        self.settings = settings
        self.threads = threads
        self.modules = tuple(modules)
        self.env = dict(env or {})
        self.log_level = log_level
        self.log_format = log_format
        self._mp = multiprocessing.get_context("spawn")
        self.procs: list[BaseProcess | None] = [None] * processes
        # A child unpickles its ready-event after start(): keep each alive until replaced.
        self._ready: list[MpEvent | None] = [None] * processes
        self.metrics_dir = os.fspath(metrics_dir) if metrics_dir is not None else None
        self.restarts = 0  # children started again after they exited
        # When `supervise` last looked at the children (time.monotonic): its liveness probe.
        self.last_round = time.monotonic()
        # Processes whose files are already gone (not pids: a pid may be reused by a child).
        self._reaped: weakref.WeakSet[BaseProcess] = weakref.WeakSet()

    def _target(self) -> Callable[..., None]:
        """What a child runs: `run_worker_process`, or (a subclass) a wrapper that calls it,
        e.g. in a network namespace of its own (`warmpool.harness.hosts`)."""
        return run_worker_process

    def _spawn(self, i: int) -> tuple[BaseProcess, MpEvent]:
        ready = self._mp.Event()
        proc = self._mp.Process(
            target=self._target(),
            args=(self.settings, self.threads, self.modules, self.env, ready, self.log_level,
                  self.metrics_dir, self.log_format),
            name=f"warmpool-worker-{i}",
            daemon=False,
        )
        proc.start()
        self.procs[i] = proc
        self._ready[i] = ready
        return proc, ready

    def start(self, *, wait: bool = True, timeout: float = 60.0) -> WorkerPool:
        if self.metrics_dir is not None and not any(p and p.is_alive() for p in self.procs):
            from metrics.exposition import prepare_multiprocess_dir

            prepare_multiprocess_dir(self.metrics_dir)
        started = [self._spawn(i) for i in range(len(self.procs))]
        if wait:
            for proc, ready in started:
                self._wait_ready(proc, ready, timeout)
        return self

    def _wait_ready(self, proc: BaseProcess, ready: MpEvent, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready.wait(0.1):
            if not proc.is_alive():
                raise RuntimeError(f"{proc.name} exited with {proc.exitcode} while starting")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{proc.name} not ready after {timeout}s")

    def restart(self, i: int, *, wait: bool = True, timeout: float = 60.0) -> BaseProcess:
        old = self.procs[i]
        if old is not None and old.is_alive():
            raise RuntimeError(f"worker {i} is still running")
        if old is not None:
            self._reap(old)
            self.restarts += 1
        proc, ready = self._spawn(i)
        if wait:
            self._wait_ready(proc, ready, timeout)
        return proc

    @property
    def pids(self) -> list[int | None]:
        return [p.pid if p is not None else None for p in self.procs]

    def index_of(self, pid: int) -> int:
        return self.pids.index(pid)

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[i]
        if proc is not None and proc.pid is not None and proc.is_alive():
            os.kill(proc.pid, sig)
            if sig == signal.SIGKILL:
                proc.join(10)
                self._reap(proc)

    def _reap(self, proc: BaseProcess) -> None:
        """A child is dead: its live gauges (running jobs) must stop counting now."""
        pid = proc.pid
        if self.metrics_dir is None or pid is None or proc in self._reaped or proc.is_alive():
            return
        from prometheus_client.multiprocess import mark_process_dead

        try:
            mark_process_dead(pid, self.metrics_dir)
        except OSError as exc:
            log.warning("could not remove the metrics files of pid %s: %s", pid, exc)
        self._reaped.add(proc)

    def dead(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p is None or not p.is_alive()]

    def supervise(self, stop: threading.Event, backoff: float = 1.0) -> None:
        """Restart crashed workers until `stop` is set (the `warmpool worker` main loop)."""
        while not stop.wait(backoff):
            self.last_round = time.monotonic()
            for i in self.dead():
                proc = self.procs[i]
                log.warning(
                    "worker %d (pid %s) exited with %s; restarting",
                    i,
                    proc.pid if proc else None,
                    proc.exitcode if proc else None,
                )
                if proc is not None:
                    self._reap(proc)
                    self.restarts += 1
                self._spawn(i)

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM every worker (they drain), then SIGKILL whatever outlives `timeout`."""
        limit = self.settings.drain_timeout + 10 if timeout is None else timeout
        for proc in self.procs:
            if proc is not None and proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + limit
        for proc in self.procs:
            if proc is None:
                continue
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                log.warning("%s did not drain in %.0fs; killing it", proc.name, limit)
                proc.kill()
                proc.join(5)
            self._reap(proc)

    def __enter__(self) -> WorkerPool:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
