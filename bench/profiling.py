"""py-spy around benchmark processes, and a plain-text summary of where they spent CPU.

`Profiler(pids, out_dir, label)` runs one `py-spy record --format raw` per process (sampled
stacks of threads on CPU; idle threads, parked in a syscall, are left out) until `stop()`;
`summarize(paths)` reads the collapsed stacks and names the hot spots: the functions with
the most samples on top of the stack (self), and those most often on it at all (inclusive).
py-spy is in the `bench` extra; without it the profiler says so and records nothing.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from bench.report import say


def py_spy() -> str | None:
    import sys

    candidate = Path(sys.executable).with_name("py-spy")
    return str(candidate) if candidate.exists() else shutil.which("py-spy")


class Profiler:
    def __init__(self, pids: Sequence[int], out_dir: Path, label: str, rate: int = 67) -> None:
        self.out_dir = out_dir
        self.paths: list[Path] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        exe = py_spy()
        if exe is None:
            say("py-spy not installed (pip install -e '.[bench]'): not profiling")
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        for pid in pids:
            path = out_dir / f"{label}-{pid}.txt"
            self.paths.append(path)
            self.procs.append(subprocess.Popen(
                [exe, "record", "--pid", str(pid), "--format", "raw", "--gil", "--rate", str(rate),
                 "--output", str(path), "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def stop(self) -> list[Path]:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGINT)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        return [p for p in self.paths if p.exists()]


def _frame_name(frame: str) -> str:
    # py-spy raw frames look like "function (path/to/file.py:123)"; keep function and file
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path, _, _line = where.rpartition(":")
    short = "/".join(Path(path).parts[-2:]) if path else ""
    return f"{name} ({short})" if short else name


def read_stacks(paths: Iterable[Path]) -> Counter[tuple[str, ...]]:
    stacks: Counter[tuple[str, ...]] = Counter()
    for path in paths:
        with contextlib.suppress(OSError):
            for line in path.read_text(errors="replace").splitlines():
                stack, _, count = line.rpartition(" ")
                if not stack or not count.isdigit():
                    continue
                frames = tuple(_frame_name(f) for f in stack.split(";") if f)
                stacks[frames] += int(count)
    return stacks


def summarize(paths: Iterable[Path], top: int = 15) -> list[str]:
    stacks = read_stacks(paths)
    total = sum(stacks.values())
    if not total:
        return ["(no samples)"]
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for frames, n in stacks.items():
        # the first frame is the thread ("process 123:thread ..."), the last the leaf
        real = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not real:
            continue
        self_time[real[-1]] += n
        for f in set(real):
            inclusive[f] += n
    out = [f"{total} samples on CPU", "self (leaf) time:"]
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in self_time.most_common(top)]
    out.append("inclusive time:")
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in inclusive.most_common(top * 2)]
    return out
