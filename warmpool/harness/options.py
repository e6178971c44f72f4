"""What a `System` starts, as one value: the roles, their numbers, the Redis, the queue."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from warmpool.harness.processes import WorkerGroup
from warmpool.harness.redis import RedisServer
from warmpool.queue.settings import ENV_PREFIX, QueueSettings

#: `SystemOptions.tag`'s default: a fresh tag on a Redis that is not our own, none on ours.
AUTO = "auto"


@dataclass(frozen=True)
class SystemOptions:
    """Everything optional; `System(cluster, namespaces=[ns])` is a whole system.

    namespaces: what the schedulers watch and the workers cache (empty: all namespaces); the
        first holds the leader-election Lease.
    workers, threads: worker processes (one group) and job threads in each.
    worker_groups: instead of `workers`, groups with environments of their own (indices run
        over the groups in order).
    worker_modules: the modules that register the handlers; the default logs every run
        (`workers.runlog`), which `System.wait_quiet` needs.
    worker_env: extra environment of the worker processes (`env` applies to every process).
    worker_command: run the workers as one `warmpool worker` child (the production
        supervisor, its metrics on a free loopback port; it can outlive this process with
        `System.detach`) instead of `WorkerPool`s addressable by index.
    schedulers: scheduler processes; with more than one, leave `leader_elect` on.
    leader_elect: Lease leader election (off: `--no-leader-elect`, one always adds keys).
    leader_lease: the Lease duration (renew deadline 2/3 of it, retry period 1/6, at least
        0.5 s); None: the scheduler's defaults.
    resync_period: the schedulers' periodic resync (None: their default).
    scheduler_identity: each scheduler's `--identity` is `<this>-<index>` (None: host_pid).
    scheduler_args: more `python -m scheduler` arguments (e.g. `--watch-timeout 60 120`,
        `--no-metrics`); they come last and win.
    kubeconfig: the processes reach the API server with this kubeconfig instead of the
        cluster's (e.g. through a proxy of the caller's that outlives the system); not with
        `proxy`. With no cluster (`System(None, ...)`: workers on a queue only, no
        schedulers) and no kubeconfig, the processes get no KUBECONFIG.
    hosts: that many hosts, each a network namespace of its own reaching Redis and the API
        server only through links of its own (`warmpool.harness.hosts`; `System.hosts`);
        needs `proxy` and a Redis on this machine. Worker groups go onto a host with
        `WorkerGroup(host=i)`, schedulers with `scheduler_hosts`.
    scheduler_hosts: the host of each scheduler, by index (None or missing: this machine).
    proxy: every process reaches the API server through a fault-injecting
        `warmpool.testing.apiproxy.ApiProxy` (`System.proxy`); the caller's own clients
        still talk to the cluster directly. `proxy_seed` seeds its faults.
    redis: "private" (a valkey-server of our own, restartable: the default), a URL (an
        existing server), or a `RedisServer` (e.g. `SentinelRedis`), started and stopped
        with the system.
    queue: the queue's settings (lease TTL, heartbeat timeout, ...); its `redis_url` is
        replaced by the Redis's, its prefix and namespace carry the tag.
    tag: keys under `<tag>:<prefix>` and `<tag>:<namespace>`, so several systems share one
        Redis; removed from that Redis at `stop()`. "auto": a fresh tag unless the Redis is
        private; None: no tag, the keys every `warmpool` command reads by default.
    workdir: the private Redis's data, the proxy's kubeconfigs, and by default the logs
        (None: a new temporary directory).
    log_dir: `workers.log` and `scheduler[-<i>].log` (None: the workdir).
    log_level: of every process (None: each role's default, WARNING / INFO).
    start_timeout: how long each process may take to be ready.
    """

    namespaces: Sequence[str] = ()
    workers: int = 2
    threads: int = 4
    worker_groups: Sequence[WorkerGroup] = ()
    worker_modules: Sequence[str] = ("workers.runlog",)
    worker_env: Mapping[str, str] = field(default_factory=dict)
    worker_command: bool = False
    schedulers: int = 1
    leader_elect: bool = True
    leader_lease: float | None = None
    resync_period: float | None = None
    scheduler_identity: str | None = None
    scheduler_args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    kubeconfig: Path | None = None
    hosts: int = 0
    scheduler_hosts: Sequence[int | None] = ()
    proxy: bool = False
    proxy_seed: int | None = None
    redis: str | RedisServer = "private"
    queue: QueueSettings = field(default_factory=QueueSettings)
    tag: str | None = AUTO
    workdir: Path | None = None
    log_dir: Path | None = None
    log_level: str | None = None
    start_timeout: float = 120.0

    def groups(self) -> list[WorkerGroup]:
        return list(self.worker_groups) or [WorkerGroup(self.workers)]

    def replace(self, **changes: object) -> SystemOptions:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def queue_settings(options: SystemOptions, redis_url: str,
                   private: bool) -> tuple[QueueSettings, str | None]:
    """The settings every process of the system shares, and their tag (decided here, once)."""
    tag = options.tag
    if tag == AUTO:
        tag = None if private else f"run{uuid.uuid4().hex[:8]}"
    q = options.queue
    if tag:
        q = q.replace(prefix=f"{tag}:{q.prefix}", namespace=f"{tag}:{q.namespace}")
    return q.replace(redis_url=redis_url), tag


def settings_env(settings: QueueSettings) -> dict[str, str]:
    """The environment that gives a `warmpool` command these settings
    (`QueueSettings.from_env`): the URL and every field that differs from its default."""
    assert settings.redis_url is not None
    out = {"WARMPOOL_REDIS_URL": settings.redis_url}
    for f in dataclasses.fields(QueueSettings):
        value = getattr(settings, f.name)
        if f.name != "redis_url" and value != f.default:
            out[ENV_PREFIX + f.name.upper()] = str(value)
    return out
