"""Coalescing and scheduling: 10,000 watch events over 100 instances -> how many reconcile runs,
and how soon after an event its instance's job starts.

Events are real: the bench patches an annotation (`bench.warmpool.io/touch`) on the
instances' email ConfigMaps (direct connection, 8 threads); the scheduler sees each change on
its watch (a MODIFIED whose digest changed) and adds the instance's key. Runs are counted by
the workers' `workers.runlog` wrapper (every job start logged, then the real handler).

- paused: the workers are stopped while the 10,000 events happen, then started. Goal: one
  run per instance (nothing changes while they run). Baseline (same run): the keys the
  scheduler handed to the queue, i.e. the messages plain dramatiq, which does not
  deduplicate, would have run.
- running: the same number of events at `--rate` per second while the workers run. The
  event time is when the bench's own watch on those ConfigMaps (direct connection) delivered
  the change, the moment the scheduler's watch gets it too (its stream passes the proxy, a
  relay, so a little later). Counted: runs, and "needless" runs (a run of a key with no event
  of that key delivered since the key's previous run started, allowing 50 ms of skew
  between the two watches: the queue owed it nothing; goal 0); latency event -> the first
  start of that instance's key at or after it (the same 50 ms of skew allowed: a start up to
  50 ms before the bench saw the event counts, as latency 0).

  python -m bench coalescing [--instances 100] [--events 10000] [--rate 200]
"""

from __future__ import annotations

import argparse
import bisect
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from bench.cluster import (
    direct_kube,
    latency_proxy,
    new_namespace,
    private_cluster,
    quiet_warnings,
)
from bench.machine import LoadSampler
from bench.report import Row, dur_summary, fmt_s, pct, print_rows, say, verdict
from bench.stack import Stack
from bench.world import PoolCounter, create_appdef, identity_stub
from warmpool.keys import InstanceKey
from warmpool.kube.api import Kube
from warmpool.kube.reflector import Reflector, Watched
from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.pool.meta import annotations_of, name_of
from warmpool.queue.embedded import resolve_redis_url

APPDEF = "java"
TOUCH = "bench.warmpool.io/touch"
EMAILS_SELECTOR = f"{v.LABEL_TEMPLATE_PURPOSE}={v.PURPOSE_EMAILS}"
#: The bench's watch and the scheduler's deliver the same change within milliseconds of each
#: other, in either order: a run that starts in that gap looks like it had no event.
SKEW = 0.05


@dataclass
class CoalesceResult:
    instances: int = 0
    events: int = 0
    paused_runs: int = 0
    paused_waiting: int = 0
    paused_enqueued: int = 0  # keys the scheduler added (the no-dedup baseline)
    paused_seen: int = 0  # ConfigMap events the scheduler's watch received
    running_events: int = 0
    running_runs: int = 0
    running_needless: int = 0  # allowing SKEW between the two watches
    running_needless_strict: int = 0
    running_enqueued: int = 0
    latencies: list[float] = field(default_factory=list)
    unmatched: int = 0
    rate: float = 0.0
    load: str = ""
    job_times: str = ""


def email_configmaps(kube: Kube, ns: str) -> dict[int, str]:
    items, _ = kube.list("v1", "ConfigMap", ns, label_selector=EMAILS_SELECTOR)
    out = {}
    for item in items:
        name = item["metadata"]["name"]
        k = naming.instance_id_from_name(name)
        if k is not None:
            out[k] = name
    return out


def _scheduler_numbers(stack: Stack) -> tuple[int, int]:
    """(keys the scheduler added to the queue, ConfigMap watch events it received)."""
    assert stack.scheduler is not None
    st = stack.scheduler.status()
    events = sum(w.get("events", 0) for name, w in st["watches"].items()
                 if name.startswith("ConfigMap@"))
    return int(st["stats"]["enqueued"]), int(events)


def _touch(kube: Kube, ns: str, name: str, i: int) -> None:
    kube.merge_patch("v1", "ConfigMap", ns, name, {"metadata": {"annotations": {TOUCH: str(i)}}})


def run(instances: int = 100, events: int = 10_000, rate: float = 200.0,
        url: str | None = None, timeout: float = 600.0) -> tuple[list[Row], CoalesceResult]:
    url = url or resolve_redis_url()
    res = CoalesceResult(instances=instances, events=events, rate=rate)
    with private_cluster("coalesce") as info, latency_proxy(info) as proxy, \
            LoadSampler() as load:
        direct = direct_kube(info)
        ns = new_namespace(direct, "coalesce")
        counter = PoolCounter(direct, ns).start()
        stack = Stack(url, info, ns, kubeconfig=proxy.kubeconfig_path, processes=2, threads=8)
        try:
            stack.start()
            gen = int(create_appdef(direct, ns, APPDEF, instances)["metadata"]["generation"])
            if counter.wait(instances, gen, timeout, idle=lambda: stack.wait_idle(60)) is None:
                raise RuntimeError(f"the {instances}-instance pool did not converge")
            cms = email_configmaps(direct, ns)
            ids = sorted(cms)
            key_of = {k: str(InstanceKey(ns, APPDEF, k)) for k in ids}

            # --- paused ---------------------------------------------------------------
            stack.stop_workers()
            stack.runs.clear()
            enq0, seen0 = _scheduler_numbers(stack)
            say(f"coalescing: {events} events over {len(ids)} instances, workers stopped")
            with ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda i: _touch(direct, ns, cms[ids[i % len(ids)]], i),
                            range(events)))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # the scheduler has seen them all
                enq, seen = _scheduler_numbers(stack)
                if seen - seen0 >= events:
                    break
                time.sleep(0.2)
            time.sleep(1.0)  # its dispatcher hands the last batch to the queue
            enq, seen = _scheduler_numbers(stack)
            res.paused_enqueued, res.paused_seen = enq - enq0, seen - seen0
            res.paused_waiting = stack.inspector.stats().waiting
            stack.start_workers()
            stack.wait_idle(timeout)
            res.paused_runs = sum(1 for _, k in stack.runs.starts() if k.startswith("instance/"))
            say(f"coalescing paused: {res.paused_runs} runs, {res.paused_enqueued} adds")

            # --- running --------------------------------------------------------------
            stack.runs.clear()
            enq0, _ = _scheduler_numbers(stack)
            # the bench's own watch on the email ConfigMaps: when each change was delivered
            delivered: dict[int, tuple[str, float]] = {}
            by_name = {name: key_of[k] for k, name in cms.items()}
            lock = threading.Lock()

            def on_event(etype: str, obj: dict, old: dict | None) -> None:
                touch = annotations_of(obj).get(TOUCH)
                key = by_name.get(name_of(obj))
                if etype == "MODIFIED" and touch and touch.isdigit() and key:
                    with lock:
                        delivered.setdefault(int(touch), (key, time.time()))

            stop = threading.Event()
            watch = Reflector(direct, Watched("ConfigMap", "v1", EMAILS_SELECTOR), ns, on_event,
                              summarize=identity_stub,
                              timeout_range=(240.0, 300.0))
            watch.start(stop)
            watch.synced.wait(60)

            def touch_at(i: int, start: float) -> None:
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                _touch(direct, ns, cms[ids[i % len(ids)]], events + i)

            say(f"coalescing: {events} events at {rate:.0f}/s, workers running")
            start = time.monotonic() + 0.5
            with ThreadPoolExecutor(16) as ex:
                list(ex.map(lambda i: touch_at(i, start), range(events)))
            time.sleep(1.0)
            stack.wait_idle(timeout)
            stop.set()
            enq, _ = _scheduler_numbers(stack)
            res.running_enqueued = enq - enq0
            starts: dict[str, list[float]] = defaultdict(list)
            for t, key in stack.runs.starts():
                if key.startswith("instance/"):
                    starts[key].append(t)
            res.running_runs = sum(len(s) for s in starts.values())
            res.job_times = dur_summary("instance jobs", stack.runs.durations("instance"))
            with lock:
                running_seen = [v for i, v in delivered.items() if i >= events]
            res.running_events = len(running_seen)
            _match_runs(res, starts, running_seen)
        finally:
            stack.close()
            counter.stop()
    res.load = load.summary()
    return rows_for(res), res


def _match_runs(res: CoalesceResult, starts: dict[str, list[float]],
                seen: list[tuple[str, float]]) -> None:
    """Into `res`, for the running case: each delivered event's latency to the first start of
    its key after it (or unmatched), and the needless runs (no event of the key since its
    previous start), from the starts of each key and the (key, delivery time) of each event."""
    by_key: dict[str, list[float]] = defaultdict(list)
    for key, t in seen:
        by_key[key].append(t)
    for key, ts in by_key.items():
        runs = sorted(starts.get(key, []))
        ts.sort()
        for t in ts:
            # The first start of the key at or after the event, allowing the same
            # skew between the bench's watch and the system's as for needless runs:
            # the scheduler's watch may deliver a change a little before the bench's
            # does, and the run it causes then starts "before" the event.
            j = bisect.bisect_left(runs, t - SKEW)
            if j < len(runs):
                res.latencies.append(max(0.0, runs[j] - t))
            else:
                res.unmatched += 1
        prev = float("-inf")
        for r in runs:  # needless: no event of the key since its previous start
            if bisect.bisect_right(ts, r) == bisect.bisect_right(ts, prev):
                res.running_needless_strict += 1
                if (bisect.bisect_right(ts, r + SKEW)
                        == bisect.bisect_right(ts, prev + SKEW)):
                    res.running_needless += 1
            prev = r


def rows_for(r: CoalesceResult) -> list[Row]:
    goal_runs = r.instances
    rows = [
        Row("4 coalescing", f"paused: {r.events:,} events over {r.instances} instances, then "
            "2 x 8 workers", f"{r.paused_runs} reconcile runs ({r.paused_waiting} keys "
            "waiting before the start)", f"{goal_runs} (one per instance)",
            f"{r.paused_enqueued:,} keys added by the scheduler = runs of plain dramatiq "
            f"(no dedup); {r.paused_seen:,} ConfigMap events seen",
            verdict(r.paused_runs <= goal_runs), f"load {r.load}"),
        Row("4 coalescing", f"running: {r.running_events:,} events at {r.rate:.0f}/s over "
            f"{r.instances} instances", f"{r.running_runs:,} runs; {r.running_needless} "
            f"needless (no event since the key's previous start; {r.running_needless_strict} "
            f"without the {SKEW * 1000:.0f} ms watch-skew allowance)",
            "0 needless; <= 1 re-run per change while running",
            f"{r.running_enqueued:,} keys added by the scheduler = plain dramatiq runs",
            verdict(r.running_needless == 0), r.job_times),
        Row("4 scheduling", "watch event -> job start of its instance, running case",
            f"p50 {fmt_s(pct(r.latencies, 0.5), 3)}, p99 "
            f"{fmt_s(pct(r.latencies, 0.99), 3)} over {len(r.latencies):,} events"
            + (f" ({r.unmatched} with no later start)" if r.unmatched else ""),
            "p99 <= 1 s (anchor: a Go controller's queue-wait objective)",
            "none (the sequential driver has no events: it rescans)",
            verdict(bool(r.latencies) and not r.unmatched and pct(r.latencies, 0.99) <= 1.0),
            ""),
    ]
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench coalescing", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=100)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args(argv)
    quiet_warnings()
    rows, _ = run(args.instances, args.events, args.rate, args.redis_url)
    print_rows(rows)
    return 0
