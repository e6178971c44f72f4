"""`System`: the whole system on one machine, on a running control plane.

A Redis (private by default), optionally the fault-injecting API proxy, worker processes and
one or more schedulers, all sharing one set of queue settings. Every process it starts is
one it tracks and stops (SIGTERM, then SIGKILL), so nothing outlives it unless `detach()` says
so. The demo, the benchmarks, the chaos runner and integration tests start the system this way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

import warmpool
from scheduler.process import SchedulerProcess
from warmpool.cluster.local import ClusterInfo
from warmpool.harness import quiet as _quiet
from warmpool.harness.hosts import Hosts, HostWorkerPool, scheduler_args
from warmpool.harness.options import SystemOptions, queue_settings, settings_env
from warmpool.harness.processes import WorkerCommand, Workers, stderr_to
from warmpool.harness.redis import PrivateRedis, RedisServer, redis_server
from warmpool.harness.runs import RunLog
from warmpool.queue.inspect import Inspector
from warmpool.queue.layout import Layout
from warmpool.queue.settings import QueueSettings
from warmpool.testing.apiproxy import ApiProxy
from workers.process import WorkerPool

#: The checkout (or site-packages) this code runs from: child processes import the same code.
_CODE_ROOT = Path(warmpool.__file__).resolve().parents[1]


class System:
    """Start with `start()` or `with System(cluster, ...) as system:`; see `SystemOptions`
    for every option (given as one `options` value, keyword arguments, or both)."""

    def __init__(self, cluster: ClusterInfo | None, options: SystemOptions | None = None,
                 **changes: Any) -> None:
        self.cluster = cluster
        self.options = opts = (options or SystemOptions()).replace(**changes)
        if cluster is None and (opts.proxy or opts.schedulers):
            raise ValueError("without a cluster, a system is workers on a queue only: "
                             "schedulers=0, proxy=False")
        if opts.hosts and not opts.proxy:
            raise ValueError("hosts reach the API server through the proxy: proxy=True")
        if opts.proxy and opts.kubeconfig is not None:
            raise ValueError("the processes reach the API server through the proxy or "
                             "through `kubeconfig`, not both")
        self.workdir = Path(opts.workdir) if opts.workdir is not None else Path(
            tempfile.mkdtemp(prefix="warmpool-system-"))
        self.log_dir = Path(opts.log_dir) if opts.log_dir is not None else self.workdir
        self.redis: RedisServer = redis_server(opts.redis, self.workdir)
        # Made now, so its fault switches and records can be handed out before `start()`.
        self.proxy: ApiProxy | None = (
            ApiProxy(upstream=cluster.server, token=cluster.token, seed=opts.proxy_seed,
                     kubeconfig_path=self.workdir / "proxy-kubeconfig")
            if opts.proxy and cluster is not None else None)
        self.schedulers: list[SchedulerProcess] = []
        self._hosts: Hosts | None = None
        self.worker_command: WorkerCommand | None = None
        self.worker_log = self.log_dir / "workers.log"
        self.leases_seen = 0  # lease keys in Redis at the last `lease_holders`
        self._workers: Workers | None = None
        self._proxy_clients: dict[str, Path] = {}  # proxy client name -> its kubeconfig
        self._settings: QueueSettings | None = None
        self._tag: str | None = None
        self._client: redis.Redis | None = None
        self._inspector: Inspector | None = None
        self._lock = threading.Lock()  # one restart at a time: stderr_to redirects fd 2
        self._started = False
        self._detached = False

    # --- what the caller uses -------------------------------------------------------------

    @property
    def settings(self) -> QueueSettings:
        """The queue settings every process shares (known once started)."""
        if self._settings is None:
            raise RuntimeError("the system is not started")
        return self._settings

    @property
    def client(self) -> redis.Redis:
        """A client of the system's Redis (reconnects after a restart or failover)."""
        if self._client is None:
            self._client = self.redis.client()
        return self._client

    @property
    def inspector(self) -> Inspector:
        """The queue's one reader of its states (`Inspector.stats().idle`, `census()`, ...)."""
        if self._inspector is None:
            self._inspector = Inspector(self.client, self.settings)
        return self._inspector

    @property
    def runs(self) -> RunLog:
        """The workers' run log (every job's start and end), for counting and timing runs."""
        return RunLog(self.client, self.settings)

    @property
    def workers(self) -> Workers:
        """The worker processes by index (not with `worker_command`)."""
        if self._workers is None:
            raise RuntimeError("no index-addressed workers: not started, or worker_command")
        return self._workers

    @property
    def hosts(self) -> Hosts:
        """The hosts (`options.hosts`), each with its links to Redis and the API server."""
        if self._hosts is None:
            raise RuntimeError("no hosts: options.hosts is 0, or the system is not started")
        return self._hosts

    @property
    def kubeconfig(self) -> Path:
        """The kubeconfig the system's processes use: `options.kubeconfig`, else the proxy's
        main port when on, else the cluster's."""
        if self.options.kubeconfig is not None:
            return Path(self.options.kubeconfig)
        if self.proxy is not None:
            return self.proxy.kubeconfig_path
        if self.cluster is None:
            raise RuntimeError("a system without a cluster has no kubeconfig")
        return self.cluster.kubeconfig

    def _kube_env(self) -> dict[str, str]:
        """KUBECONFIG for the processes (none for a queue-only system)."""
        if self.cluster is None and self.options.kubeconfig is None:
            return {}
        return {"KUBECONFIG": str(self.kubeconfig)}

    @property
    def tag(self) -> str | None:
        return self._tag

    @property
    def running(self) -> bool:
        """Started (`start()` returned) and not stopped or detached since."""
        return self._started and not self._detached

    # --- start and stop -------------------------------------------------------------------

    def start(self, *, workers: bool = True, schedulers: bool = True) -> System:
        """Redis and the proxy, then (unless told not to) the workers and the schedulers,
        each ready. Roles left out start later with `start_workers` / `start_schedulers`."""
        opts = self.options
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.redis.start()
            self._settings, self._tag = queue_settings(
                opts, self.redis.url, private=isinstance(self.redis, PrivateRedis))
            if self.proxy is not None:
                self.proxy.start()
            if opts.hosts:
                assert self.proxy is not None
                self._hosts = Hosts(opts.hosts, redis_url=self.redis.url, api=self.proxy,
                                    workdir=self.workdir).start()
            if workers:
                self.start_workers()
            if schedulers:
                self.start_schedulers()
        except BaseException:
            self.stop()
            raise
        self._started = True
        return self

    def start_schedulers(self) -> None:
        """Start `options.schedulers` schedulers at once, then wait for each one's /readyz."""
        if self.schedulers:
            raise RuntimeError("schedulers are running: stop_schedulers() first")
        opts = self.options
        for i in range(opts.schedulers):
            self.schedulers.append(self._scheduler(i))
            self.schedulers[-1].start(ready=False, timeout=opts.start_timeout)
        for s in self.schedulers:
            self._await_ready(s, opts.start_timeout)

    def stop_schedulers(self, timeout: float = 15.0) -> None:
        for s in self.schedulers:
            with contextlib.suppress(Exception):
                s.stop(timeout=timeout)
        self.schedulers = []

    def stop_workers(self, timeout: float | None = 15.0) -> None:
        """SIGTERM every worker (they drain), SIGKILL after `timeout` (None: the queue's
        drain timeout + 10 s)."""
        if self._workers is not None:
            self._workers.stop(timeout=timeout)
            self._workers = None
        if self.worker_command is not None:
            with contextlib.suppress(Exception):
                self.worker_command.stop(timeout=(
                    timeout if timeout is not None else self.settings.drain_timeout + 10))
            self.worker_command = None

    def start_workers(self) -> None:
        """Start the workers (all groups, or the worker command) and wait until each is up."""
        if self._workers is not None or self.worker_command is not None:
            raise RuntimeError("workers are running: stop_workers() first")
        opts, settings = self.options, self.settings
        if opts.worker_command:
            env = {**os.environ, **self._process_env(), **self._served_env(), **opts.worker_env,
                   **self._kube_env(), "PYTHONUNBUFFERED": "1"}
            self.worker_command = WorkerCommand(
                processes=sum(g.processes for g in opts.groups()), threads=opts.threads,
                modules=opts.worker_modules, env=env, log_path=self.worker_log,
                log_level=opts.log_level)
            self.worker_command.start(timeout=opts.start_timeout)
            return
        level = getattr(logging, opts.log_level.upper()) if opts.log_level else logging.WARNING
        pools: list[WorkerPool] = []
        for group in opts.groups():
            if group.processes < 1:
                continue
            if group.host is not None:
                host = self.hosts[group.host]
                pools.append(HostWorkerPool(
                    host.netns.name, settings.replace(redis_url=host.redis_url),
                    processes=group.processes, threads=opts.threads,
                    modules=opts.worker_modules, log_level=level,
                    env={**opts.env, **self._served_env(), **opts.worker_env, **group.env,
                         "KUBECONFIG": str(host.kubeconfig)}))
                continue
            kube_env = self._kube_env()
            if group.proxy_client is not None and self.proxy is not None:
                kubeconfig = self._proxy_clients.get(group.proxy_client) or self.proxy.add_client(
                    group.proxy_client, self.workdir / f"proxy-kubeconfig-{group.proxy_client}")
                self._proxy_clients[group.proxy_client] = kubeconfig
                kube_env = {"KUBECONFIG": str(kubeconfig)}
            pools.append(WorkerPool(
                settings, processes=group.processes, threads=opts.threads,
                modules=opts.worker_modules, log_level=level,
                env={**opts.env, **self._served_env(), **opts.worker_env, **group.env,
                     **kube_env}))
        self._workers = Workers(pools)
        with self._lock, stderr_to(self.worker_log):
            self._workers.start(timeout=opts.start_timeout)

    def _served_env(self) -> dict[str, str]:
        """The workers cache the namespaces the schedulers watch (`WARMPOOL_NAMESPACE`,
        `workers.handlers.served_namespaces`), not the whole cluster."""
        names = self.options.namespaces
        return {"WARMPOOL_NAMESPACE": ",".join(names)} if names else {}

    def _process_env(self) -> dict[str, str]:
        """What every child started by command gets: the queue, the code, the caller's env."""
        path = os.pathsep.join(p for p in (str(_CODE_ROOT), os.environ.get("PYTHONPATH"))
                               if p)
        return {**settings_env(self.settings), "PYTHONPATH": path, **self.options.env}

    def _scheduler(self, i: int) -> SchedulerProcess:
        opts = self.options
        args: list[str] = []
        if opts.namespaces:
            args += ["--namespace", ",".join(opts.namespaces)]
        if not opts.leader_elect:
            args.append("--no-leader-elect")
        else:
            if opts.namespaces:
                args += ["--lease-namespace", opts.namespaces[0]]
            if opts.leader_lease is not None:
                lease = opts.leader_lease
                args += ["--lease-duration", str(lease), "--renew-deadline", str(lease * 2 / 3),
                         "--retry-period", str(max(0.5, lease / 6))]
            if opts.scheduler_identity is not None:
                args += ["--identity", f"{opts.scheduler_identity}-{i}"]
        if opts.resync_period is not None:
            args += ["--resync-period", str(opts.resync_period)]
        if opts.log_level:
            args += ["--log-level", opts.log_level]
        env = {**self._process_env(), **self._kube_env()}
        wrapper: list[str] = []
        if (h := self.scheduler_host(i)) is not None:
            host = self.hosts[h]
            env.update(WARMPOOL_REDIS_URL=host.redis_url, KUBECONFIG=str(host.kubeconfig))
            args += scheduler_args(host)
            wrapper = host.netns.exec_args([])
        return SchedulerProcess([*args, *opts.scheduler_args], env=env,
                                log_path=self.scheduler_log(i), cwd=_CODE_ROOT,
                                wrapper=wrapper)

    def scheduler_host(self, i: int) -> int | None:
        """The host scheduler `i` runs on (None: this machine's namespace)."""
        hosts = self.options.scheduler_hosts
        return hosts[i] if i < len(hosts) else None

    def scheduler_log(self, i: int) -> Path:
        name = "scheduler" if self.options.schedulers == 1 else f"scheduler-{i}"
        return self.log_dir / f"{name}.log"

    @staticmethod
    def _await_ready(s: SchedulerProcess, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while s.get("/readyz")[0] != 200:
            if not s.alive():
                raise RuntimeError(f"scheduler exited with {s.proc.returncode if s.proc else '?'}"
                                   f" (log: {s.log_path})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"scheduler not ready after {timeout}s (log: {s.log_path})")
            time.sleep(0.1)  # polling its /readyz

    def stop(self) -> None:
        """Stop every process started (schedulers, workers, proxy, Redis); remove the tag's
        keys from a Redis that is not ours. Nothing after `detach()`."""
        if self._detached:
            return
        self.stop_schedulers()
        if self._workers is not None:
            self._workers.stop(timeout=15)
            self._workers = None
        if self.worker_command is not None:
            with contextlib.suppress(Exception):
                self.worker_command.stop(timeout=(self._settings.drain_timeout + 10
                                                  if self._settings else 40))
            self.worker_command = None
        if self._hosts is not None:
            self._hosts.close()  # after every process on them has stopped
            self._hosts = None
        if self.proxy is not None:
            with contextlib.suppress(Exception):
                self.proxy.stop()
        if not isinstance(self.redis, PrivateRedis) and self._settings is not None:
            with contextlib.suppress(Exception):
                self._forget_keys()
        self.redis.stop()
        self._started = False

    def _forget_keys(self) -> None:
        """The tag's keys (all of this system's), or without a tag the run log only."""
        client = self.client
        if self._tag:
            names = list(client.scan_iter(match=f"{self._tag}:*", count=1000))
        else:
            layout = Layout.of(self.settings)
            names = [layout.runs_started, layout.runs_ended]
        for i in range(0, len(names), 500):
            client.delete(*names[i:i + 500])

    def detach(self) -> list[int]:
        """Leave the processes running after this process exits (`warmpool demo --keep`);
        returns their pids, for the caller to stop later. Only a system whose processes are
        all children by command can: `worker_command`, no proxy."""
        if self._workers is not None or self.proxy is not None:
            raise RuntimeError("worker pools and the proxy live in this process: they cannot "
                               "be detached (use worker_command, no proxy)")
        pids = [s.pid for s in self.schedulers if s.alive()]
        if self.worker_command is not None and self.worker_command.pid is not None:
            pids.insert(0, self.worker_command.pid)
        if isinstance(self.redis, PrivateRedis) and (pid := self.redis.detach()) is not None:
            pids.append(pid)
        self._detached = True
        return pids

    def __enter__(self) -> System:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # --- quiet ----------------------------------------------------------------------------

    def mark(self) -> _quiet.Mark:
        """Now, in the workers' run log: pass it to `wait_quiet` after making a change."""
        return _quiet.mark(self.client, self.settings)

    def quiet(self, since: _quiet.Mark, keys: Iterable[str] = ()) -> _quiet.Pending:
        """One look at what is still pending since `since` (falsy: quiet)."""
        return _quiet.quiet(self.client, self.settings, since, keys)

    def wait_quiet(self, since: _quiet.Mark, keys: Iterable[str] = (),
                   timeout: float = 60.0) -> None:
        """Wait until the work caused by the change made after `since` has run: each of
        `keys` has a run that started after the mark and has ended (with no keys: at least
        one run has ended since the mark), and the queue has nothing waiting, running or
        delayed. Raises `NotQuiet` (an AssertionError) saying what was pending on timeout.
        Exactly what this does and does not guarantee: `warmpool.harness.quiet`."""
        _quiet.wait_quiet(self.client, self.settings, since, keys, timeout)

    # --- the processes, one by one (faults, restarts) -------------------------------------

    def kill_worker(self, i: int) -> None:
        self.workers.kill(i, signal.SIGKILL)

    def stop_worker(self, i: int) -> None:
        """SIGSTOP: the process freezes with its leases, threads and sockets as they are (a
        long GC pause, a VM stall); its lease renewals and heartbeats stop with it."""
        self.workers.kill(i, signal.SIGSTOP)

    def resume_worker(self, i: int) -> None:
        self.workers.kill(i, signal.SIGCONT)

    def restart_worker(self, i: int, attempts: int = 30) -> None:
        """Start worker `i` again if it is dead; retried while it cannot start (e.g. Redis is
        down this very moment)."""
        for attempt in range(attempts):
            try:
                with self._lock, stderr_to(self.worker_log):
                    if self.workers.alive(i):
                        return
                    self.workers.restart(i, timeout=30)
                return
            except Exception:
                if attempt == attempts - 1:
                    raise
                time.sleep(1.0)  # a retry's pause: the cause (Redis down) passes by itself

    def lease_holders(self) -> Counter[int]:
        """Worker index -> leases it holds now, from the lease keys in Redis (instance leases
        included: a claim, keyed by its Session, takes one for its deciding write)."""
        out: Counter[int] = Counter()
        self.leases_seen = 0
        with contextlib.suppress(redis.RedisError):
            for process, keys in self.inspector.lease_holders().items():  # "host:pid" -> keys
                self.leases_seen += len(keys)
                pid = process.rpartition(":")[2]
                if pid.isdigit() and (i := self.workers.index_of(int(pid))) is not None:
                    out[i] += len(keys)
        return out

    def leader(self) -> int | None:
        """The index of the scheduler that leads now (None: none says so)."""
        for i, s in enumerate(self.schedulers):
            with contextlib.suppress(Exception):
                if s.alive() and s.status().get("leader"):
                    return i
        return None

    def kill_scheduler(self, i: int) -> None:
        s = self.schedulers[i]
        s.kill()
        with contextlib.suppress(Exception):
            s.wait(10)

    def restart_scheduler(self, i: int, timeout: float = 120.0) -> None:
        """As a kubelet would: a scheduler started while the API server or Redis is down
        waits a few seconds for it, then exits 4; it is started again until it stays up."""
        deadline = time.monotonic() + timeout
        while True:
            s = self._scheduler(i)
            try:
                s.start(ready=False)
            except RuntimeError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(1.0)  # a retry's pause, as a kubelet's backoff
                continue
            self.schedulers[i] = s
            return

    def ensure_running(self) -> None:
        """Every process up again (after faults that killed some)."""
        if self._workers is not None:
            for i in self._workers.dead():
                self.restart_worker(i)
        for i, s in enumerate(self.schedulers):
            if not s.alive():
                with contextlib.suppress(Exception):
                    s.wait(1)
                self.restart_scheduler(i)

    def dead(self) -> list[str]:
        """Processes that exited on their own (a crash the caller should report), by the
        names `log_path` takes: `worker-<i>` or `workers`, `scheduler` or `scheduler-<i>`."""
        out = []
        if self._workers is not None:
            out += [f"worker-{i}" for i in self._workers.dead()]
        if self.worker_command is not None and not self.worker_command.alive():
            out.append("workers")
        out += [self.scheduler_log(i).stem for i, s in enumerate(self.schedulers)
                if not s.alive()]
        return out

    def log_path(self, name: str) -> Path:
        """The log of a process named as `dead()` names it."""
        if name.startswith("worker"):
            return self.worker_log
        return self.log_dir / f"{name}.log"

    def metrics_urls(self) -> dict[str, str]:
        """The /metrics URL of each process that serves one: `workers` (the worker command)
        and `scheduler` / `scheduler-<i>`."""
        urls = {}
        if self.worker_command is not None and (url := self.worker_command.metrics_url):
            urls["workers"] = url
        for i, s in enumerate(self.schedulers):
            if s.metrics_url and s.metrics_url.startswith("http"):
                urls[self.scheduler_log(i).stem] = s.metrics_url
        return urls

