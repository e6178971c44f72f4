"""A lecture start (issue #17): 100 Sessions in 10 s on an AppDefinition with minInstances 10
and maxInstances 120, three ways side by side in one run:

- **schedule**: a PoolSchedule window opening 35 s after the pool is built, with a 30 s lead
  and size 110: the scheduler grows the pool ahead of the window (its boundary loop, not a
  resync), and the Sessions arrive when the window opens;
- **burst**: no schedule; past the 10 prewarmed instances each waiting Session gets an
  instance made for it (the default);
- **strict**: no schedule, `WARMPOOL_BURST=off`: today's Java behaviour without its lazy
  fallback; past the 10, Sessions wait for someone to leave (nobody does in a lecture).

Sessions are kept for the whole run (a lecture), so a Session that waits is served only by a
new instance. Latency = Session create request sent -> HANDLED seen on a watch (client
clocks, as `bench.claim_latency`). "Waited": the Session was seen HANDLING with a waiting
message before it was HANDLED (or never was). "Cold": served by an instance above the
AppDefinition's target at the time (made for it); the rest were warm. A Session not HANDLED
`--grace` s after the last create counts as unserved ("more than the run").

Each case runs on a namespace of its own with a fresh scheduler and 2 x 8 workers; every
controller request goes through the latency proxy (+10 ms), as in the other pool benchmarks.

  python -m bench lecture [--sessions 100] [--over 10] [--min 10] [--max 120]
      [--size 110] [--grace 45]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.claim_latency import APPDEF, Churn, ChurnResult
from bench.cluster import (
    direct_kube,
    latency_proxy,
    new_namespace,
    private_cluster,
    quiet_warnings,
)
from bench.machine import LoadSampler
from bench.report import Row, fmt_s, print_rows, say
from bench.stack import Stack
from bench.world import PoolCounter, create_appdef
from warmpool.cluster.local import ClusterInfo
from warmpool.invariants import check
from warmpool.kube.api import Kube
from warmpool.pool import vocabulary as v
from warmpool.pool.meta import annotations_of, name_of
from warmpool.queue.embedded import resolve_redis_url
from warmpool.testing.world import patch_appdef_spec
from warmpool.testing.zones import noon_zone

CASES = ("schedule", "burst", "strict")
LEAD = 30  # s: the schedule's lead time
OPENS_IN = 35  # s after the pool is built: the window's start


class Lecture(Churn):
    """`Churn` that never deletes, and also notes which Sessions waited and which instance
    served each one."""

    def __init__(self, kube: Kube, namespace: str, sessions: int, over: float,
                 prefix: str) -> None:
        super().__init__(kube, namespace, sessions / over, hold=10**9, prefix=prefix,
                         limit=sessions)
        self.waited: set[str] = set()
        self.served_by: dict[str, int] = {}

    def _on_event(self, etype: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        status = obj.get("status") or {}
        name = name_of(obj)
        if etype != "DELETED" and name:
            with self._lock:
                if (status.get("operatorStatus") == v.STATUS_HANDLING
                        and str(status.get("operatorMessage") or "").startswith("Waiting")
                        and name not in self.handled):
                    self.waited.add(name)
                if status.get("operatorStatus") == v.STATUS_HANDLED:
                    raw = annotations_of(obj).get(v.ANNOTATION_INSTANCE_ID)
                    if raw is not None and str(raw).isdigit():
                        self.served_by.setdefault(name, int(raw))
        super()._on_event(etype, obj, old)


@dataclass
class LectureResult:
    case: str
    res: ChurnResult = field(default_factory=ChurnResult)
    waited: int = 0
    cold: int = 0
    prewarmed: int = 0  # free instances when the first Session was sent
    grown_before_open: float | None = None  # s before the window opened that it was ready
    violations: list[str] = field(default_factory=list)
    load: str = ""


def _hms(t: datetime) -> str:
    return t.strftime("%H:%M:%S")


def _create_schedule(kube: Kube, ns: str, size: int, opens: datetime) -> None:
    """A window opening at `opens` for 30 minutes, written in a zone where it is about noon
    (so that it never spans midnight there, whenever the benchmark runs)."""
    zone, offset = noon_zone(opens)
    kube.create({
        "apiVersion": v.SCHEDULE_API_VERSION, "kind": v.SCHEDULE_KIND,
        "metadata": {"name": "lecture", "namespace": ns},
        "spec": {"appDefinition": APPDEF, "windows": [{
            "start": _hms(opens + offset), "end": _hms(opens + offset + timedelta(minutes=30)),
            "timeZone": zone, "size": size, "leadTime": f"{LEAD}s"}]},
    })


def run_case(direct: Kube, info: ClusterInfo, kubeconfig: Path, url: str, case: str, sessions: int,
             over: float, min_instances: int, max_instances: int, size: int,
             grace: float) -> LectureResult:
    out = LectureResult(case)
    ns = new_namespace(direct, f"lecture-{case}")
    counter = PoolCounter(direct, ns).start()
    stack = Stack(url, info, ns, kubeconfig=kubeconfig, processes=2, threads=8,
                  worker_env={"WARMPOOL_BURST": "off" if case == "strict" else "on"})
    try:
        stack.start()
        gen = int(create_appdef(direct, ns, APPDEF, min_instances)["metadata"]["generation"])
        patch_appdef_spec(direct, ns, APPDEF, maxInstances=max_instances)
        gen += 1
        if counter.wait(min_instances, gen, 300, idle=lambda: stack.wait_idle(60)) is None:
            raise RuntimeError(f"{case}: the {min_instances}-instance pool did not converge")
        if case == "schedule":
            opens = (datetime.now(UTC) + timedelta(seconds=OPENS_IN)).replace(microsecond=0)
            _create_schedule(direct, ns, size, opens)
            say(f"lecture {case}: window opens at {_hms(opens)} UTC, lead {LEAD}s, size {size}")
            ready = counter.wait(size, gen, OPENS_IN + 60, idle=lambda: stack.wait_idle(60))
            if ready is not None:
                out.grown_before_open = (opens - datetime.now(UTC)).total_seconds()
            delay = (opens - datetime.now(UTC)).total_seconds()
            if delay > 0:
                time.sleep(delay)  # the lecture starts when its window opens
        target = size if case == "schedule" else min_instances
        out.prewarmed = target
        say(f"lecture {case}: {sessions} Sessions in {over:g} s")
        with LoadSampler() as load:
            lecture = Lecture(direct, ns, sessions, over, prefix=case[:1])
            lecture.start()
            t0 = time.monotonic()
            try:
                while time.monotonic() - t0 < over:
                    time.sleep(0.05)
                lecture.stop_creating()
                lecture.wait_served(grace)
                res = out.res
                res.created, res.served, res.unserved = lecture.latencies()
                res.duration = time.monotonic() - t0
                res.rate, res.window, res.errors = sessions / over, over, lecture.errors
                with lecture._lock:
                    out.waited = len(lecture.waited | (set(lecture.sent) - set(lecture.handled)))
                    out.cold = sum(1 for k in lecture.served_by.values() if k > target)
                say(f"lecture {case}: {res.describe()}; {out.waited} waited, {out.cold} cold")
            finally:
                lecture.finish()
        out.load = load.summary()
        stack.wait_idle(180)
        out.violations = [str(x) for x in check(direct, ns, quiet=False)]
    finally:
        stack.close()
        counter.stop()
    return out


def run(sessions: int = 100, over: float = 10.0, min_instances: int = 10,
        max_instances: int = 120, size: int = 110, grace: float = 45.0,
        url: str | None = None) -> tuple[list[Row], list[LectureResult]]:
    url = url or resolve_redis_url()
    results: list[LectureResult] = []
    with private_cluster("lecture") as info, latency_proxy(info) as proxy:
        direct = direct_kube(info)
        for case in CASES:
            results.append(run_case(direct, info, proxy.kubeconfig_path, url, case, sessions, over,
                                    min_instances, max_instances, size, grace))
    return rows_for(results, sessions, over, min_instances, max_instances, size), results


def _latency(r: LectureResult) -> str:
    return f"p50 {r.res.quantile(0.5)}, p99 {r.res.quantile(0.99)}"


def rows_for(results: list[LectureResult], sessions: int, over: float, min_instances: int,
             max_instances: int, size: int) -> list[Row]:
    by = {r.case: r for r in results}
    what = {
        "schedule": f"prewarmed by a PoolSchedule (size {size}, lead {LEAD} s)",
        "burst": "burst alone (the default)",
        "strict": "strict minInstances (WARMPOOL_BURST=off)",
    }
    rows = []
    for case in CASES:
        r = by.get(case)
        if r is None:
            continue
        others = "; ".join(f"{c}: {_latency(o)}, {o.waited} waited"
                           for c, o in by.items() if c != case)
        note = (f"{sessions} Sessions in {over:g} s, kept (a lecture); minInstances "
                f"{min_instances}, maxInstances {max_instances}; {r.cold} cold (an instance "
                f"made above the target of {r.prewarmed}), {len(r.res.served) - r.cold} warm; "
                f"{r.res.unserved} unserved after the grace; "
                f"{len(r.violations)} invariant violations after; load {r.load}")
        if case == "schedule":
            note += (f"; pool at {size} {fmt_s(r.grown_before_open)} before the window "
                     "opened" if r.grown_before_open is not None
                     else f"; the pool did not reach {size} before the window opened")
        rows.append(Row("7 lecture start", what[case],
                        f"{_latency(r)}; {r.waited} of {r.res.created} waited",
                        "", f"same run: {others}", "", note))
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench lecture", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--over", type=float, default=10.0, help="seconds")
    parser.add_argument("--min", type=int, default=10, dest="min_instances")
    parser.add_argument("--max", type=int, default=120, dest="max_instances")
    parser.add_argument("--size", type=int, default=110, help="the schedule's window size")
    parser.add_argument("--grace", type=float, default=45.0)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args(argv)
    quiet_warnings()
    rows, _ = run(args.sessions, args.over, args.min_instances, args.max_instances, args.size,
                  args.grace, url=args.redis_url)
    print_rows(rows)
    return 0
