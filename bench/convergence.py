"""Convergence: a pool from zero to N instances, down to n, back to N, every API request of
the controller 10 ms slower (the latency proxy), against the same reconcile logic run
sequentially in one thread (the Java operator's model: `run_until_quiet`, no queue).

Each configuration runs on a fresh control plane of its own, so none inherits another's etcd
history or garbage collection. The worker configurations run the real system: the scheduler
(its watches through the proxy too) turns the AppDefinition's changes and the pool objects'
events into keys, the workers (`workers.runlog`, i.e. `workers.handlers`) run them. The
sequential baseline runs `run_until_quiet(max_rounds=1)` round after round (a round: resync the
pool, reconcile every instance) until the pool is converged.

Converged: exactly 5 x target pool objects (Services, Deployments, ConfigMaps with the pool
label) and all of them at the AppDefinition's current generation (a minInstances change bumps
it, so the free instances below the target are replaced too), seen by watches on a direct
connection. The clock runs from the AppDefinition's create or patch to that moment. A worker
configuration then also waits (not timed) for its queue to go idle before the next step.

API cost (the latency proxy's counters, `bench.traffic`): requests and response bytes by verb
over the three steps, per instance change, with the watch streams' bytes apart; and instance
runs per instance change (one would be ideal). Instance changes: 3 x N, each instance once
per step (see `changes`; earlier tables divided by 2 x N + n, shown beside it).

  python -m bench convergence [--instances 1000] [--small 100]
      [--configs seq,1x1,1x8,2x8] [--timeout 900] [--profile DIR]
"""

from __future__ import annotations

import argparse
import functools
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import traffic as tr
from bench.cluster import (
    direct_kube,
    latency_proxy,
    new_namespace,
    private_cluster,
    quiet_warnings,
)
from bench.machine import LoadSampler, cpu_seconds
from bench.report import Row, dur_summary, fmt_s, print_rows, say, verdict
from bench.stack import Stack
from bench.world import PoolCounter, create_appdef, set_min_instances
from warmpool.controller.sequential import run_until_quiet
from warmpool.kube.api import Kube, connect
from warmpool.queue.embedded import resolve_redis_url
from warmpool.testing.apiproxy import Traffic

APPDEF = "java"
GOAL_SPEEDUP = 10.0
GOAL_RUNS = 1.2  # instance runs per instance change (the queue's re-runs included)
SEQ = "seq"


@dataclass
class ConfigResult:
    name: str
    phases: list[tuple[str, float | None]] = field(default_factory=list)
    requests: int = 0  # every request through the proxy, watch streams included
    traffic: Traffic = field(default_factory=Traffic)  # by verb, requests and bytes
    runs: int = 0
    cpu: float = 0.0  # CPU seconds of the controller: driver thread, or workers + scheduler
    load: str = ""
    note: str = ""
    profile: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return bool(self.phases) and all(t is not None for _, t in self.phases)

    @property
    def total(self) -> float | None:
        return sum(t for _, t in self.phases if t is not None) if self.complete else None

    def describe(self) -> str:
        parts = [f"{label} {fmt_s(t)}" if t is not None else f"{label} not converged"
                 for label, t in self.phases]
        return "; ".join(parts) + (f"; total {fmt_s(self.total)}" if self.complete else "")


def label_of(name: str) -> str:
    if name == SEQ:
        return "sequential, 1 thread (run_until_quiet)"
    p, t = name.split("x")
    return f"{p} process{'es' if p != '1' else ''} x {t} thread{'s' if t != '1' else ''}"


class SequentialDriver:
    """Rounds of `run_until_quiet(max_rounds=1)` in a thread until told to stop."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.rounds = 0
        self.cpu = 0.0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sequential", daemon=True)

    def _run(self) -> None:
        try:
            self._rounds()
        finally:
            self.cpu = time.thread_time()

    def _rounds(self) -> None:
        while not self._stop.is_set():
            try:
                run_until_quiet(self.kube, self.namespace, max_rounds=1)
            except RuntimeError as exc:
                if "did not settle" not in str(exc):
                    self.errors.append(str(exc))
            except Exception as exc:  # an API error: the next round starts over
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self.rounds += 1

    def start(self) -> SequentialDriver:
        self._thread.start()
        return self

    def stop(self, timeout: float = 900.0) -> None:
        """Stop after the round in progress."""
        self._stop.set()
        self._thread.join(timeout)


def run_config(name: str, instances: int, small: int, url: str, timeout: float,
               profile_dir: Path | None = None) -> ConfigResult:
    result = ConfigResult(name)
    steps = [(f"0→{instances}", instances), (f"{instances}→{small}", small),
             (f"{small}→{instances}", instances)]
    with private_cluster(f"conv-{name}") as info, latency_proxy(info) as proxy, \
            LoadSampler() as load:
        direct = direct_kube(info)
        ns = new_namespace(direct, f"conv-{name}")
        counter = PoolCounter(direct, ns).start()
        stack: Stack | None = None
        driver: SequentialDriver | None = None
        profiler = None
        try:
            if name == SEQ:
                driver = SequentialDriver(Kube(connect(str(proxy.kubeconfig_path))), ns)
            else:
                p, t = (int(x) for x in name.split("x"))
                stack = Stack(url, info, ns, kubeconfig=proxy.kubeconfig_path, processes=p,
                              threads=t)
                stack.start()
                if profile_dir is not None:
                    from bench.profiling import Profiler

                    assert stack.scheduler is not None
                    profiler = Profiler([*stack.worker_pids(), stack.scheduler.pid],
                                        profile_dir, f"convergence-{name}")
            before = proxy.traffic()
            for i, (label, target) in enumerate(steps):
                say(f"convergence {name}: {label}")
                if i == 0:
                    gen = int(create_appdef(direct, ns, APPDEF, target)["metadata"]["generation"])
                else:
                    gen = set_min_instances(direct, ns, APPDEF, target)
                if driver is not None and i == 0:
                    driver.start()
                idle = functools.partial(stack.wait_idle, 60) if stack else None
                elapsed = counter.wait(target, gen, timeout, idle=idle)
                result.phases.append((label, elapsed))
                say(f"convergence {name}: {label} in {fmt_s(elapsed)}")
                if elapsed is None:
                    break
            result.traffic = proxy.traffic() - before
            result.requests = result.traffic.total_requests(watches=True)
            if driver is not None:
                driver.stop()
                result.runs = driver.rounds
                result.cpu = driver.cpu
                if driver.errors:
                    result.note = f"{len(driver.errors)} round errors, e.g. {driver.errors[0]}"
            if stack is not None:
                result.runs = sum(1 for _, k in stack.runs.starts() if k.startswith("instance/"))
                result.note = dur_summary("instance jobs", stack.runs.durations("instance"))
                assert stack.scheduler is not None
                result.cpu = sum(cpu_seconds(p) for p in [*stack.worker_pids(),
                                                            stack.scheduler.pid])
        finally:
            if profiler is not None:
                from bench.profiling import summarize

                result.profile = summarize(profiler.stop())
            if driver is not None:
                driver.stop()
            if stack is not None:
                stack.close()
            counter.stop()
    result.load = load.summary()
    return result


def changes(instances: int, small: int) -> int:
    """Instance changes over the three steps: every instance changes once in each (N built;
    going down, N - n retired and n relabelled at the new generation; going up, n relabelled
    and N - n built), 3 x N. Runs are counted for all of them, so the changes are too."""
    return 3 * instances


def legacy_changes(instances: int, small: int) -> int:
    """What the table divided by until 2026-12-01: 2 x N + n, which left out the N - n
    retirements while counting their runs (shown beside the new figure, for comparison with
    earlier runs)."""
    return 2 * instances + small


def cost_row(r: ConfigResult, base: ConfigResult | None, instances: int,
             small: int) -> Row:
    """Runs, requests and bytes per instance change of one configuration."""
    n = changes(instances, small)
    cost = tr.describe(r.traffic, n, "change")
    note = (f"{size_label(instances, small)}, {n} instance changes; bytes by verb: "
            f"{tr.bytes_by_verb(r.traffic, n)}; {tr.watch_note(r.traffic, n, 'change')}")
    if r.name == SEQ:
        return Row("1 convergence API cost", label_of(r.name), f"{r.runs} rounds; {cost}",
                   "(baseline)", "-", "", note)
    runs = r.runs / n
    legacy = r.runs / legacy_changes(instances, small)
    base_text = (f"sequential: {tr.describe(base.traffic, n, 'change')}"
                 if base is not None and base.traffic.total_requests() else "not run")
    ok = runs <= GOAL_RUNS if r.name == "2x8" else None
    return Row("1 convergence API cost", label_of(r.name) + " + scheduler",
               f"{runs:.2f} instance runs / change ({legacy:.2f} per 2N+n, the count of "
               f"earlier tables); {cost}",
               f"<= {GOAL_RUNS} runs / change at 2x8", base_text, verdict(ok), note)


def size_label(instances: int, small: int) -> str:
    return f"{instances}→{small}→{instances} instances"


def rows_for(results: list[ConfigResult], instances: int, small: int) -> list[Row]:
    base = next((r for r in results if r.name == SEQ), None)
    base_total = base.total if base else None
    base_text = (f"sequential: {base.describe()}" if base else "not run")
    size = size_label(instances, small)
    rows = []
    for r in results:
        speedup = (base_total / r.total) if base_total and r.total else None
        if r.name == SEQ:
            result = r.describe()
            ok = None
            extra = f"{r.runs} rounds"
        else:
            result = r.describe() + (f"; {speedup:.1f}x the baseline" if speedup else "")
            ok = (speedup is not None and speedup >= GOAL_SPEEDUP) if r.name == "2x8" else None
            if r.name == "2x8" and speedup is None:
                ok = False
            extra = f"{r.runs} instance runs ({r.runs / changes(instances, small):.1f} per " \
                    "instance change)"
            if base is not None and base.requests and r.requests:
                p, t = (int(x) for x in r.name.split("x"))
                extra += (f"; {r.requests / base.requests:.2f}x the baseline's API requests, so "
                          f"a latency-bound ceiling of {p * t * base.requests / r.requests:.1f}x")
        per_req = f" ({1000 * r.cpu / r.requests:.1f} ms per request)" if r.requests else ""
        note = (f"{size}; {extra}; {r.requests} API requests; controller CPU {r.cpu:.0f} s"
                f"{per_req}; load {r.load}")
        if r.note:
            note += f"; {r.note}"
        rows.append(Row("1 convergence", label_of(r.name) + (
            "" if r.name == SEQ else " + scheduler"), result,
            f">= {GOAL_SPEEDUP:.0f}x baseline at 2x8" if r.name != SEQ else "(baseline)",
            base_text if r.name != SEQ else "-", verdict(ok), note))
    return rows + [cost_row(r, base, instances, small) for r in results]


def run(instances: int = 1000, small: int = 100, configs: tuple[str, ...] = (SEQ, "1x1", "1x8",
        "2x8"), timeout: float = 900.0, url: str | None = None,
        profile_dir: Path | None = None) -> tuple[list[Row], list[ConfigResult]]:
    url = url or resolve_redis_url()
    results = []
    for name in configs:
        prof = profile_dir if (profile_dir is not None and name == "2x8") else None
        results.append(run_config(name, instances, small, url, timeout, prof))
    return rows_for(results, instances, small), results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench convergence", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--configs", default="seq,1x1,1x8,2x8")
    parser.add_argument("--timeout", type=float, default=900.0, help="per step (s)")
    parser.add_argument("--profile", type=Path, default=None,
                        help="py-spy the 2x8 workers and scheduler; stacks go to this dir")
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args(argv)
    quiet_warnings()
    rows, results = run(args.instances, args.small, tuple(args.configs.split(",")),
                        args.timeout, args.redis_url, args.profile)
    print_rows(rows)
    for r in results:
        if r.profile:
            print(f"\nprofile of {r.name} (workers + scheduler):")
            print("\n".join(r.profile))
    return 0
