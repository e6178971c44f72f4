"""The benchmarks' output: result rows, the Markdown table they make, and the few number
formats the rows use; progress lines go to stderr, so stdout holds only the rows."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass


def say(msg: str) -> None:
    """Progress on stderr (the rows go to stdout)."""
    print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


@dataclass
class Row:
    bench: str
    case: str
    result: str
    goal: str = ""
    baseline: str = ""
    verdict: str = ""  # "met" | "MISSED" | "" (information only)
    note: str = ""


HEADER = ("benchmark", "case", "result", "goal", "baseline (same run)", "verdict", "notes")


def table(rows: Sequence[Row]) -> list[str]:
    """A Markdown table of the rows."""
    def cell(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(HEADER) + " |", "|" + "|".join("---" for _ in HEADER) + "|"]
    for r in rows:
        out.append("| " + " | ".join(cell(x) for x in (r.bench, r.case, r.result, r.goal,
                                                          r.baseline, r.verdict, r.note)) + " |")
    return out


def print_rows(rows: Sequence[Row]) -> None:
    for line in table(rows):
        print(line, flush=True)


def verdict(ok: bool | None) -> str:
    return "" if ok is None else ("met" if ok else "MISSED")


def nearest_rank(n: int, q: float) -> int:
    """The index of the q-quantile (q in 0..1) among n sorted values (n > 0)."""
    return min(n - 1, max(0, round(q * (n - 1))))


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1); nan for no values."""
    if not values:
        return float("nan")
    return sorted(values)[nearest_rank(len(values), q)]


def dur_summary(label: str, values: Sequence[float]) -> str:
    """"claim jobs p50 120 ms, p99 900 ms (n=...)" for a list of seconds."""
    if not values:
        return f"{label}: none"
    return (f"{label} p50 {pct(values, 0.5) * 1000:.0f} ms, p99 {pct(values, 0.99) * 1000:.0f} "
            f"ms (n={len(values):,})")


def fmt_s(seconds: float | None, digits: int = 1) -> str:
    if seconds is None or seconds != seconds:
        return "n/a"
    return f"{seconds:.{digits}f} s"
