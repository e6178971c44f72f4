"""Hosts on one machine: Linux network namespaces, each joined to this one by a veth pair.

A `Netns` is one "host": a namespace of its own with its own loopback and one link to the
machine's namespace, a /30 out of 198.18.0.0/15 (the range set aside for network tests, RFC
2544; never a real network's): the machine's end of the link is `.gateway`, the host's end
`.address`. Nothing else is routed, so from inside a host 127.0.0.1 is that host's own
loopback (the machine's Redis on 127.0.0.1:6379 is out of reach), and every service the host
may use must listen on its `.gateway` (`warmpool.harness.hosts` puts a fault point there).

    with Network(2) as net:
        h = net.hosts[0]
        subprocess.run(h.exec_args(["python", "-c", "..."]))   # a process on that host
        h.isolate()                # a dead path: nothing it sends is answered, silently
        h.rejoin()

Processes join a host as `ip netns exec <name> ...` does (`exec_args`), or, for a child that
this process spawns, by calling `enter(name)` first thing in the child (a thread's network
namespace is inherited by the threads it starts, so the child must enter before it starts
any; the sockets it opens afterwards are the host's).

Names are `wpn<pid>-<i>` (the namespace and the machine's end of its veth; the host's end is
`eth0` inside it), so a run owns its names and can tell stale ones: `cleanup_stale()` (run by
every `Network` on entry) removes those of processes that are gone, so a run killed before
its cleanup leaves nothing behind for long. Another live run's namespaces are never touched.
Addresses are chosen under a file lock from those no link on the machine has yet, so runs
side by side never collide.

Root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and the `ip` command are needed; `NetnsUnavailable`
says what is missing (a test tier that needs hosts fails with it, it never skips).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import itertools
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

#: The range the links' addresses come from: 198.18.0.0/15, for network tests (RFC 2544).
TEST_RANGE = ipaddress.IPv4Network("198.18.0.0/15")
PREFIX = "wpn"
_NAME = re.compile(rf"^{PREFIX}(\d+)-(\d+)$")
_LOCK = Path("/run/warmpool-netns.lock")
_CLONE_NEWNET = 0x40000000
_SERIAL = itertools.count()  # a process's hosts are numbered across its networks


class NetnsUnavailable(RuntimeError):
    """This machine (or this user) cannot make network namespaces: what failed, and why."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `ip ARGS`; a failure raises `NetnsUnavailable` with ip's own message."""
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError as exc:
        raise NetnsUnavailable("the `ip` command (iproute2) is not installed") from exc
    if check and done.returncode != 0:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def check_available() -> None:
    """Raise `NetnsUnavailable` unless namespaces can be made here (root and `ip`)."""
    if shutil.which("ip") is None:
        raise NetnsUnavailable("the `ip` command (iproute2) is not installed")
    if os.geteuid() != 0:
        raise NetnsUnavailable(f"network namespaces need root; running as uid {os.geteuid()}")


def enter(name: str) -> None:
    """Move the calling thread into namespace `name` (what `ip netns exec` does first).
    Call it in a fresh child before it starts threads or opens sockets."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owned_names(listing: str) -> list[tuple[str, int]]:
    """(name, owner pid) of every name of ours in `ip netns list` / `ip -o link` output."""
    out = []
    for line in listing.splitlines():
        parts = line.split()
        if not parts:
            continue
        # `ip -o link`: "7: wpn12-0@if2: <...>"; `ip netns list`: "wpn12-0 (id: 3)".
        word = parts[1] if parts[0].endswith(":") and len(parts) > 1 else parts[0]
        name = word.rstrip(":").split("@")[0]
        if (m := _NAME.match(name)) is not None:
            out.append((name, int(m.group(1))))
    return out


def cleanup_stale() -> list[str]:
    """Remove the namespaces and links of runs whose process is gone; returns their names."""
    removed = []
    for name, pid in owned_names(ip("netns", "list").stdout):
        if not _alive(pid):
            ip("netns", "delete", name, check=False)
            removed.append(name)
    for name, pid in owned_names(ip("-o", "link", "show").stdout):
        if not _alive(pid):
            ip("link", "delete", name, check=False)
            removed.append(name)
    return removed


def used_networks(listing: str) -> set[ipaddress.IPv4Network]:
    """The /30s of the test range that some link already has (`ip -4 -o addr` output)."""
    used = set()
    for m in re.finditer(r"\binet (\d+\.\d+\.\d+\.\d+)/\d+", listing):
        addr = ipaddress.IPv4Address(m.group(1))
        if addr in TEST_RANGE:
            used.add(ipaddress.IPv4Network(f"{addr}/30", strict=False))
    return used


def free_networks(used: set[ipaddress.IPv4Network], n: int) -> list[ipaddress.IPv4Network]:
    """The first `n` /30s of the test range not in `used` (pure: the allocation's rule)."""
    out = []
    for net in TEST_RANGE.subnets(new_prefix=30):
        if net not in used:
            out.append(net)
            if len(out) == n:
                return out
    raise NetnsUnavailable(f"no {n} free /30 networks left in {TEST_RANGE}")


@contextlib.contextmanager
def _allocation_lock() -> Iterator[None]:
    with open(_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@dataclass(frozen=True)
class Netns:
    """One host: its namespace's name, and the two ends of its link."""

    name: str
    gateway: str  # the machine's end: services for this host listen here
    address: str  # the host's own end

    def exec_args(self, argv: Sequence[str]) -> list[str]:
        """`argv` run on this host."""
        return ["ip", "netns", "exec", self.name, *argv]

    def isolate(self) -> None:
        """A dead path, as the host sees it: nothing it sends is ever answered, not even
        acknowledged, and nothing tells it so (no reset, no ICMP error, its link still up):
        its connections hang on retransmissions, new ones time out. A blackhole route in
        the machine's namespace drops every packet towards the host's address (and, with
        reverse-path filtering, every packet from it). Not the link down: the host's kernel
        would see its carrier go and fail its sends at once, which no real dead path does."""
        ip("route", "replace", "blackhole", f"{self.address}/32")

    def rejoin(self) -> None:
        ip("route", "del", "blackhole", f"{self.address}/32", check=False)

    def _create(self, net: ipaddress.IPv4Network) -> None:
        ip("netns", "add", self.name)
        ip("link", "add", self.name, "type", "veth", "peer", "name", "eth0", "netns", self.name)
        ip("addr", "add", f"{self.gateway}/{net.prefixlen}", "dev", self.name)
        ip("link", "set", self.name, "up")
        ip("-n", self.name, "addr", "add", f"{self.address}/{net.prefixlen}", "dev", "eth0")
        ip("-n", self.name, "link", "set", "eth0", "up")
        ip("-n", self.name, "link", "set", "lo", "up")

    def remove(self) -> None:
        """The namespace, both ends of its link (the kernel frees a namespace's veth lazily,
        so the machine's end is deleted by name as well) and an `isolate`'s route."""
        self.rejoin()
        ip("netns", "delete", self.name, check=False)
        ip("link", "delete", self.name, check=False)


class Network:
    """`n` hosts, made on entry (stale ones of dead runs removed first) and removed on exit,
    also when making them fails half way."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.hosts: list[Netns] = []

    def __enter__(self) -> Network:
        check_available()
        cleanup_stale()
        try:
            with _allocation_lock():
                nets = free_networks(used_networks(ip("-4", "-o", "addr", "show").stdout),
                                     self.n)
                for net in nets:
                    gateway, address = list(net.hosts())[:2]
                    host = Netns(f"{PREFIX}{os.getpid()}-{next(_SERIAL)}", str(gateway),
                                 str(address))
                    self.hosts.append(host)
                    host._create(net)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for host in self.hosts:
            host.remove()
        self.hosts = []

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
