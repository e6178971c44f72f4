"""Worker and scheduler hosts, each in a network namespace of its own, reaching Redis and the
API server only through fault points of its own.

    machine's namespace                               host i's namespace (`netns.Netns`)
    Redis 127.0.0.1:R  <- TcpProxy  gateway_i:r  <--veth-->  address_i   worker, scheduler
    ApiProxy client "host-i" 127.0.0.1:A <- TcpProxy gateway_i:a  <--'

Each host has two links, `host.redis` and `host.api`: `warmpool.testing.tcpproxy.TcpProxy`s
listening on the machine's end of the host's veth, forwarding to Redis and to the
`ApiProxy` port that is this host's alone (client name = the host's name). A link can be
severed (reset), stalled one way or both (silent: connections open, nothing passes),
delayed, and healed, one service at a time; `Netns.isolate()` takes the whole host off the
network at the kernel's level (a dead path: nothing it sends is answered, silently). The API
proxy behind the link records what each host's writes were answered
(`ApiProxy.writes(host.name)`): the API server's side of a late write.

A host keeps its own loopback and has no route but its link, so a process on it reaches
nothing it was not given (checked by `Host.reaches`): a misconfigured URL fails, it does
not pass around the fault point. Processes go onto a host with `host.netns.exec_args(argv)`
(a command) or as `HostWorkerPool` children (spawned, they enter the namespace first).
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from warmpool.harness.netns import Netns, Network, enter
from warmpool.testing.apiproxy import ApiProxy
from warmpool.testing.tcpproxy import TcpProxy
from workers.process import WorkerPool, run_worker_process

#: Which links a fault names: "redis", "api", or "both".
SERVICES = ("redis", "api")


def via(url: str, host: str, port: int) -> str:
    """`url` (redis://[user:pass@]host:port/db) pointed at `host:port` instead."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@{host}:{port}" if auth else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass
class Host:
    """One host: its namespace, its two links, and what a process on it is given."""

    name: str  # also the API proxy's client name for this host
    netns: Netns
    redis: TcpProxy
    api: TcpProxy
    redis_url: str  # Redis, through `redis`
    kubeconfig: Path  # the API server, through `api`

    def links(self, service: str = "both") -> list[TcpProxy]:
        if service == "both":
            return [self.redis, self.api]
        if service not in SERVICES:
            raise ValueError(f"service must be 'redis', 'api' or 'both', not {service!r}")
        return [getattr(self, service)]

    def partition(self, service: str = "both", direction: str = "both") -> None:
        """Silence the host's link(s) to `service` (nothing passes `direction`, connections
        stay open): what hangs a client that has no timeout."""
        for link in self.links(service):
            link.stall(direction)

    def sever(self, service: str = "both") -> None:
        """Reset every connection to `service` and refuse new ones (a fast failure)."""
        for link in self.links(service):
            link.sever()

    def slow(self, seconds: float, service: str = "both") -> None:
        for link in self.links(service):
            link.delay(seconds)

    def heal(self, service: str = "both") -> None:
        for link in self.links(service):
            link.heal()

    def reaches(self, address: str, port: int, timeout: float = 2.0) -> bool:
        """Whether a TCP connect from this host to `address:port` succeeds (the test that
        the host's own loopback is all 127.0.0.1 means there)."""
        return _connect_from(self.netns.name, address, port, timeout)


def _connect_from(netns: str, address: str, port: int, timeout: float) -> bool:
    code = ("import socket,sys\n"
            "try:\n"
            f"    socket.create_connection(({address!r}, {port}), timeout={timeout}).close()\n"
            "except OSError:\n"
            "    sys.exit(1)\n")
    done = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code],
                          capture_output=True, timeout=timeout + 30)
    return done.returncode == 0


class Hosts:
    """`n` hosts in front of one Redis (`redis_url`, on this machine) and one `ApiProxy`
    (started): made on `start()` / entry, every namespace, link and listener gone on
    `close()` / exit, also when making them failed half way."""

    def __init__(self, n: int, *, redis_url: str, api: ApiProxy, workdir: Path,
                 prefix: str = "host") -> None:
        self.n, self.redis_url, self.api, self.workdir = n, redis_url, api, workdir
        self.prefix = prefix
        self.network = Network(n)
        self.hosts: list[Host] = []

    def __len__(self) -> int:
        return len(self.hosts)

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def start(self) -> Hosts:
        parts = urlsplit(self.redis_url)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(f"hosts need one Redis by URL on this machine, not {parts.scheme}")
        upstream = (parts.hostname or "127.0.0.1", parts.port or 6379)
        try:
            self.network.__enter__()
            for i, ns in enumerate(self.network.hosts):
                name = f"{self.prefix}-{i}"
                redis_link = TcpProxy(upstream, host=ns.gateway).start()
                self.api.add_client(name, self.workdir / f"proxy-kubeconfig-{name}")
                api_link = TcpProxy(("127.0.0.1", self.api.client_port(name)),
                                    host=ns.gateway).start()
                kubeconfig = self.api.write_kubeconfig(
                    self.workdir / f"kubeconfig-{name}", name,
                    server=f"http://{ns.gateway}:{api_link.port}")
                self.hosts.append(Host(name, ns, redis_link, api_link,
                                       via(self.redis_url, ns.gateway, redis_link.port),
                                       kubeconfig))
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for host in self.hosts:
            host.redis.stop()
            host.api.stop()
        self.hosts = []
        self.network.close()

    def __enter__(self) -> Hosts:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def run_worker_on(netns: str, *args: Any) -> None:
    """A worker process's entry on a host: into the namespace first (no thread or socket
    exists yet in a freshly spawned child), then the usual `run_worker_process`."""
    enter(netns)
    run_worker_process(*args)


class HostWorkerPool(WorkerPool):
    """A `WorkerPool` whose children run on one host (give it settings whose `redis_url`
    and an env whose KUBECONFIG are that host's)."""

    def __init__(self, netns: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.netns = netns

    def _target(self) -> Any:
        return functools.partial(run_worker_on, self.netns)


def scheduler_args(host: Host) -> Sequence[str]:
    """A scheduler on `host` serves its health and metrics on the host's own address (its
    loopback is not this machine's): the harness reaches them over the link."""
    return ["--health-host", host.netns.address, "--metrics-host", host.netns.address]
