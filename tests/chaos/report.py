"""Figures of chaos runs, as markdown for docs/reliability.md."""

from __future__ import annotations

import datetime
import statistics
import subprocess
from collections import Counter
from pathlib import Path

from tests.chaos.run import ChaosResult

BEGIN = "<!-- chaos-figures:begin -->"
END = "<!-- chaos-figures:end -->"
INJECTED = ("409", "500", "429", "dropped", "lost_response", "watch_cut", "outage_503")


def _commit(root: Path) -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True).stdout.strip()
        return head + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def figures(results: list[ChaosResult], command: str, root: Path) -> str:
    ops: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    api: Counter[str] = Counter()
    settle: list[float] = []
    for r in results:
        ops.update(r.ops)
        failed.update(r.failed_ops)
        faults.update(r.faults)
        api.update(r.api)
        settle += r.settle_seconds
    total_ops = sum(ops.values()) + sum(failed.values())
    violations = sum(len(r.violations) for r in results)
    duration = sum(r.duration for r in results)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Last long-tier run: {when}, commit {_commit(root)}, `{command}`.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| seeds | {', '.join(str(r.seed) for r in results)} |",
        f"| operations | {total_ops} ({sum(failed.values())} failed, e.g. deleting what the "
        "garbage collector had already removed) |",
        f"| injected faults (process, Redis, API windows, outages) | {sum(faults.values())} |",
        f"| API requests answered with an injected fault | "
        f"{sum(api[k] for k in INJECTED)} of {api['requests']} |",
        f"| one worker's watches delayed (`watch_lag` windows; watch streams held, chunks "
        f"relayed late) | {faults['watch_lag']}; {api['watch_delay']}; "
        f"{api['watch_delayed_chunks']} |",
        f"| lease holders SIGSTOPped past their lease TTL, then resumed (`worker_stop`) | "
        f"{faults['worker_stop']} |",
        f"| Redis emptied (FLUSHALL or restart without persistence) between claims and the "
        f"scale-down racing them (`redis_flush_race`; the races run) | "
        f"{faults['redis_flush_race']}; {ops['race_claim_flush_scale']} |",
        f"| Redis emptied or restarted otherwise (`redis_flush`, `redis_restart`) | "
        f"{faults['redis_flush']}, {faults['redis_restart']} |",
        f"| quiescence checks (rounds) | {sum(r.rounds for r in results)} |",
        f"| watchdog polls (consistent snapshots) | {sum(r.polls for r in results)} |",
        f"| pool-object deletions audited on a watch | "
        f"{sum(r.deletions_audited for r in results)} |",
        f"| held objects the garbage collector took from a claim racing its AppDefinition's "
        f"deletion (excused, counted) | {sum(r.gc_races for r in results)} |",
        f"| hostile edits by hand (`hostile_edits`: foreign fences, ids, labels, owner "
        f"references) | {sum(r.hostile_edits for r in results)} |",
        f"| liveness obligations met within L = {results[0].liveness_bound if results else 30:g} "
        f"s (Sessions served, allow-lists emptied, routes removed) | "
        f"{sum(r.liveness_met for r in results)} |",
        f"| invariant violations | {violations} |",
        f"| lost or doubled claims | "
        f"{sum(1 for r in results for v in r.violations if 'claim' in v)} |",
        f"| I1 reports excused: deleted by hand, or taken by the garbage collector from a "
        f"claim racing the deletion, after their AppDefinition was gone (not rebuildable) | "
        f"{sum(len(r.unrebuildable) for r in results)} |",
        f"| settle time after a round, median / max | "
        f"{statistics.median(settle):.1f} s / {max(settle):.1f} s |" if settle else "",
        f"| duration | {duration / 60:.1f} min |",
        "",
        "Operations by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(ops.items())) + ".",
        "",
        "Faults by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(faults.items())) + ".",
        "",
        "Injected API answers (proxy counters): " + ", ".join(
            f"{k} {n}" for k, n in sorted(api.items())) + ".",
        "",
        "Per seed:",
        "",
        "| seed | operations | faults | violations | rounds | duration |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r.seed} | {r.operations} | {r.fault_count} | {len(r.violations)} | "
                     f"{r.rounds} | {r.duration / 60:.1f} min |")
    bad = [r for r in results if r.violations]
    if bad:
        lines += ["", "Violations:", ""]
        for r in bad:
            lines += [f"- seed {r.seed}: {x}" for x in r.violations]
    return "\n".join(line for line in lines if line is not None)


def write_figures(path: Path, text: str) -> None:
    """Replace the figures between the markers (the rest of the document is hand-written)."""
    doc = path.read_text() if path.exists() else f"# Reliability\n\n{BEGIN}\n{END}\n"
    if BEGIN not in doc or END not in doc:
        doc = doc.rstrip() + f"\n\n{BEGIN}\n{END}\n"
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
