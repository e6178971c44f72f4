"""What the machine is and what it spends while a benchmark runs: its description for the
report, its load average, CPU seconds by role, and a process's peak memory and CPU (all read
from /proc)."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import threading
import time
from pathlib import Path

from bench import REPO


def machine() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, check=True).stdout.strip()
        # What the run itself writes (docs/benchmarks*.md) does not make the code dirty.
        dirty = [line for line in subprocess.run(
            ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True,
            check=True).stdout.splitlines() if "docs/benchmarks" not in line]
        if dirty:
            commit += " (work tree has uncommitted changes)"
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "nproc": str(os.cpu_count()),
        "memory": f"{mem_kb / 1024 / 1024:.1f} GiB",
        "cpu": cpu,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "commit": commit,
    }


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


class LoadSampler:
    """Samples the 1-minute load average every few seconds while a benchmark runs."""

    def __init__(self, period: float = 5.0) -> None:
        self.period = period
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            with contextlib.suppress(OSError, ValueError):
                self.samples.append(float(Path("/proc/loadavg").read_text().split()[0]))
            if self._stop.wait(self.period):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)

    def summary(self) -> str:
        if not self.samples:
            return "n/a"
        return (f"min {min(self.samples):.1f} / mean {sum(self.samples) / len(self.samples):.1f}"
                f" / max {max(self.samples):.1f}")


#: Which process is which, by its command line (first match wins): for `CpuMeter`.
ROLES = (("kube-apiserver", "kube-apiserver"), ("etcd", "bin/etcd"),
         ("kube-controller-manager", "kube-controller-manager"),
         ("fake kubelet", "warmpool.cluster.fake_kubelet"), ("scheduler", "-m scheduler"),
         ("workers", "multiprocessing.spawn"), ("redis", "redis-server"),
         ("redis", "valkey-server"))


def _cpu_by_role() -> dict[str, float]:
    """CPU seconds (user + system) so far of every process on the machine, summed by role;
    the rest of the machine (the bench itself, its proxy and fake kubelet among it) apart."""
    tick = os.sysconf("SC_CLK_TCK")
    own = os.getpid()
    out: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if not cmd:
            continue  # a kernel thread
        role = ("bench (its proxy and watches)" if int(entry.name) == own
                else next((r for r, needle in ROLES if needle in cmd), "other"))
        out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


class CpuMeter:
    """CPU seconds each role used between `start()` and `stop()` (processes that ended in
    between are not counted: a window's processes must outlive it)."""

    def __init__(self) -> None:
        self.used: dict[str, float] = {}
        self.wall = 0.0
        self._before: dict[str, float] = {}
        self._t0 = 0.0

    def start(self) -> CpuMeter:
        self._before, self._t0 = _cpu_by_role(), time.monotonic()
        return self

    def stop(self) -> CpuMeter:
        after = _cpu_by_role()
        self.wall = time.monotonic() - self._t0
        self.used = {r: after[r] - self._before.get(r, 0.0) for r in after
                     if after[r] - self._before.get(r, 0.0) > 0}
        return self

    def describe(self, per: int = 0, what: str = "", digits: int = 0) -> str:
        """"kube-apiserver 68 s (0.85 cores, 93 ms / Session), ..." largest first; `digits`
        after the point for a window of a second or two."""
        if not self.used:
            return "n/a"
        parts = []
        for role, sec in sorted(self.used.items(), key=lambda x: -x[1]):
            part = f"{role} {sec:.{digits}f} s ({sec / max(self.wall, 1e-9):.2f} cores"
            if per:
                part += f", {sec / per * 1000:.0f} ms / {what}"
            parts.append(part + ")")
        return (f"CPU over {self.wall:.{digits}f} s on {os.cpu_count()} cores: "
                + ", ".join(parts))


def proc_status(pid: int) -> dict[str, int]:
    """VmHWM (peak RSS) and VmRSS of a process, in kB."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in ("VmHWM", "VmRSS"):
                out[name] = int(rest.split()[0])
    return out


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (its threads included), from /proc/<pid>/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def hwm_mb(pid: int | None) -> float:
    return proc_status(pid).get("VmHWM", 0) / 1024 if pid else float("nan")
