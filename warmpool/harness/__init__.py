"""The whole system on one machine, one way: `System(cluster, namespaces=[ns]).start()`.

A private Redis (or an existing one, or Sentinels), an optional fault-injecting API proxy,
worker processes addressable by index and one or more schedulers, on a running control plane
(`warmpool.cluster.local`); `System.mark()` and `System.wait_quiet(since=mark)` say when the
work a change caused has run. Used by `warmpool demo`, the benchmarks, the chaos runner and
integration tests.

Modules: `options` (what to start), `system` (starting, stopping, the processes one by one),
`processes` (worker pools and the `warmpool worker` command), `redis` (the servers),
`quiet` (mark and wait_quiet on the workers' run log), `runs` (reading that log), `netns`
(hosts as network namespaces) and `hosts` (each host's links to Redis and the API server,
fault points of its own; `SystemOptions.hosts`).
"""

from warmpool.harness.options import AUTO, SystemOptions, settings_env
from warmpool.harness.processes import WorkerCommand, WorkerGroup, Workers, stderr_to
from warmpool.harness.quiet import Mark, NotQuiet, Pending
from warmpool.harness.redis import (
    ExternalRedis,
    PrivateRedis,
    RedisServer,
    SentinelRedis,
    redis_server,
)
from warmpool.harness.runs import RunLog
from warmpool.harness.system import System

__all__ = [
    "AUTO",
    "ExternalRedis",
    "Mark",
    "NotQuiet",
    "Pending",
    "PrivateRedis",
    "RedisServer",
    "RunLog",
    "SentinelRedis",
    "System",
    "SystemOptions",
    "WorkerCommand",
    "WorkerGroup",
    "Workers",
    "redis_server",
    "settings_env",
    "stderr_to",
]
