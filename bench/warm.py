"""Claims on a warm pod, and Sessions all at once (issue #28), on a control plane whose fake
kubelet keeps each pod Pending `--start-delay` s (5) before it is Ready: a warm instance is
then worth something, and a claim that takes a starting one makes its user wait for it.

Warm: Sessions created at `--rate`/s for `--window` s on a pool of `--instances`, each
deleted `--hold` s after it is seen HANDLED, so releases reset pods during the run (the
reset pod is Pending again for the start delay). For every claim the bench answers two
questions:

- did it have a warm instance available when it was decided? The bench's own watches (the
  pool's external Services, Deployments and pods, on the direct connection) say at every
  moment which instances are free (external Service owned by no Session) and warm (a
  current pod of the Deployment Ready, the Deployment at the AppDefinition's generation,
  `warmpool.pool.pods`' own reading of a pod). The decision falls between the Session's
  create and its HANDLED, and a concurrent older Session may take a warm instance first, so
  "available" is strict: more instances free and warm from the create until HANDLED was
  seen than older Sessions still waiting then (they come first in the claim order), or the
  claim got a warm one.
- did it get a warm one? What the controller says: its HANDLED message carries the
  cold-start note (`warmpool.pool.decide.COLD_START_NOTE`) when the instance's pod was not
  Ready at the claim (the same decision its warm/cold metric counts).

The row's result is the share of the claims that had a warm instance available which got
one (goal 100 %; the lowest-free-id order would often give the instance just released).

At once: `--together` Sessions (40) created at once on a pool of `--together-pool` (10)
warm instances, bursting on (the controller's default: instances made above minInstances
for the rest), kept until the end; latency as in `bench.claim_latency` (create sent ->
HANDLED seen), p95 <= 250 ms.

  python -m bench warm [--instances 30] [--rate 2] [--hold 2] [--window 60] [--grace 30]
      [--start-delay 5] [--together 40] [--together-pool 10] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from bench.claim_latency import APPDEF, Churn, ChurnResult, build_pool
from bench.cluster import (
    direct_kube,
    latency_proxy,
    new_namespace,
    private_cluster,
    quiet_warnings,
)
from bench.machine import LoadSampler
from bench.report import Row, dur_summary, print_rows, say, verdict
from bench.stack import Stack
from bench.world import PoolCounter, identity_stub, pod_stub
from warmpool.cluster import local
from warmpool.invariants import check
from warmpool.kube.api import Kube
from warmpool.kube.observe import POOL_SELECTOR
from warmpool.kube.reflector import Reflector, Watched
from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.pool.decide import COLD_START_NOTE
from warmpool.pool.meta import annotations_of, labels_of, meta_of, name_of, owner_refs
from warmpool.queue.embedded import resolve_redis_url
from warmpool.testing.apiproxy import ApiProxy

START_DELAY = 5.0
GOAL_WARM_SHARE = 1.0  # of the claims that had a warm instance available, those that got one
GOAL_P95_TOGETHER = 0.25  # 40 Sessions at once on 10 instances

Stub = dict[str, Any]


def _pool_stub(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """What the warmth watches keep of a Service or Deployment of the pool."""
    labels = labels_of(obj)
    return {**identity_stub(kind, obj),
            "id": naming.instance_id_from_name(name_of(obj)),
            "gen": labels.get(v.LABEL_GENERATION),
            "internal": labels.get(v.LABEL_SERVICE_TYPE) == v.SERVICE_TYPE_INTERNAL,
            "claimed": any(r.get("kind") == v.SESSION_KIND for r in owner_refs(obj))}


def free_warm(services: Iterable[Stub], deployments: Iterable[Stub], pods: Iterable[Stub],
              generation: str) -> set[int]:
    """The ids of the free, warm instances, from the stubs of `_pool_stub` and `pod_stub`:
    external Service owned by no Session, Deployment at `generation` with a current pod
    Ready."""
    free = {s["id"] for s in services
            if s["id"] is not None and not s["internal"] and not s["claimed"]
            and s["gen"] == generation}
    ready = {p["dep"] for p in pods if p["ready"] and p["dep"]}
    return {d["id"] for d in deployments
            if d["id"] in free and d["gen"] == generation and d["metadata"]["name"] in ready}


class PoolWarmth:
    """Which free instances of a pool are warm, from the bench's own watches, and since when
    (wall clock, as `Churn` stamps its creates). Free: the external Service (the object a
    claim's deciding write takes) is owned by no Session; it is freed last in a release,
    after the pod reset. Warm: one of the Deployment's current pods is Ready and the
    Deployment is at `generation`."""

    def __init__(self, kube: Kube, namespace: str, generation: int) -> None:
        self.want = str(generation)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.since: dict[int, float] = {}  # free and warm instance id -> since when

        def watch(kind: str, api_version: str, selector: str | None,
                  stub: Any) -> Reflector:
            return Reflector(kube, Watched(kind, api_version, selector), namespace,
                             lambda *_: self.update(), summarize=stub,
                             timeout_range=(240.0, 300.0))

        self.services = watch("Service", "v1", POOL_SELECTOR, _pool_stub)
        self.deployments = watch("Deployment", "apps/v1", POOL_SELECTOR, _pool_stub)
        self.pods = watch("Pod", "v1", None, pod_stub)

    def start(self) -> PoolWarmth:
        for r in (self.services, self.deployments, self.pods):
            r.start(self._stop)
        for r in (self.services, self.deployments, self.pods):
            r.synced.wait(60)
        self.update()
        return self

    def stop(self) -> None:
        self._stop.set()

    def update(self) -> None:
        with self._lock:
            warm = free_warm(self.services.items(), self.deployments.items(),
                             self.pods.items(), self.want)
            now = time.time()
            for k in warm - self.since.keys():
                self.since[k] = now
            for k in self.since.keys() - warm:
                del self.since[k]

    def warm_throughout(self, since: float) -> list[tuple[int, float]]:
        """The instances free and warm now that have been since `since` (wall), each with
        how long before `since` it became so (s)."""
        self.update()
        with self._lock:
            return sorted((k, since - t) for k, t in self.since.items() if t <= since)

    def count(self) -> int:
        self.update()
        with self._lock:
            return len(self.since)

    def wait_all(self, n: int, timeout: float) -> float | None:
        """Seconds until `n` instances are free and warm (None: not within `timeout`)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.count() >= n:
                return time.monotonic() - t0
            time.sleep(0.1)
        return None


@dataclass
class Claimed:
    """One claim as the bench saw it."""

    name: str
    instance: str  # the id the Session was annotated with
    got_warm: bool  # no cold-start note in its HANDLED message
    #: more instances free and warm from its create to its HANDLED than older Sessions
    #: waiting then (or it got a warm one)
    available: bool
    #: a cold claim that had a warm instance available: those free and warm throughout,
    #: each with how long before the create it had been (s)
    warm_ids: tuple[tuple[int, float], ...] = ()
    latency: float = 0.0  # create sent -> HANDLED seen (s)


@dataclass
class WarmResult:
    churn: ChurnResult = field(default_factory=ChurnResult)
    claims: list[Claimed] = field(default_factory=list)
    warm_at_start: float | None = None  # seconds until the pool built was all warm
    built: float | None = None

    def available(self) -> list[Claimed]:
        return [c for c in self.claims if c.available]

    def share(self) -> float:
        """Of the claims that had a warm instance available, the share that got one."""
        avail = self.available()
        return sum(c.got_warm for c in avail) / len(avail) if avail else float("nan")

    def describe(self) -> str:
        avail = self.available()
        got = sum(c.got_warm for c in avail)
        cold = [c for c in self.claims if not c.got_warm]
        return (f"{got} of {len(avail)} claims that had a warm instance available got one "
                f"({100 * self.share():.0f} %); {len(cold)} of {len(self.claims)} claims "
                f"cold, {len(self.claims) - len(avail)} with no warm instance available")


def _record(churn: Churn, res: WarmResult, warmth: PoolWarmth) -> Churn:
    """`churn`, each claim it sees HANDLED recorded in `res` (`Claimed`)."""
    lock = threading.Lock()

    def on_handled(name: str, obj: dict[str, Any], sent: float) -> None:
        message = str((obj.get("status") or {}).get("operatorMessage") or "")
        got_warm = not message.endswith(COLD_START_NOTE)
        # The Sessions older than this one still waiting are first in the claim order
        # (`warmpool.pool.claim`): a warm instance is this one's only beyond theirs.
        warm = [] if got_warm else warmth.warm_throughout(sent)
        available = got_warm or len(warm) > churn.older_waiting(sent)
        instance = annotations_of(obj).get(v.ANNOTATION_INSTANCE_ID, "?")
        with lock:
            res.claims.append(Claimed(name, instance, got_warm, available,
                                      tuple(warm) if available else (),
                                      time.time() - sent))
    churn.on_handled = on_handled
    return churn


@contextmanager
def _pool(direct: Kube, info: local.ClusterInfo, proxy: ApiProxy, url: str, prefix: str,
          instances: int, timeout: float, res: WarmResult, start_delay: float,
          env: dict[str, str] | None = None) -> Iterator[tuple[str, Stack, PoolWarmth]]:
    """A namespace with a pool of `instances`, all warm, its stack and warmth watches."""
    ns = new_namespace(direct, prefix)
    counter = PoolCounter(direct, ns, pods=True).start()
    stack = Stack(url, info, ns, kubeconfig=proxy.kubeconfig_path, processes=2, threads=8,
                  worker_env=env or {})
    warmth: PoolWarmth | None = None
    try:
        stack.start()
        say(f"warm {prefix}: building {instances} instances")
        res.built = build_pool(direct, ns, stack, counter, instances, timeout)
        if res.built is None:
            raise RuntimeError(f"the {instances}-instance pool did not converge")
        appdef = direct.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, APPDEF) or {}
        warmth = PoolWarmth(direct, ns, int(meta_of(appdef).get("generation") or 0)).start()
        res.warm_at_start = warmth.wait_all(instances, start_delay * 4 + 120)
        if res.warm_at_start is None:
            raise RuntimeError(f"{instances} instances were not all warm in time")
        yield ns, stack, warmth
    finally:
        if warmth is not None:
            warmth.stop()
        stack.close()
        counter.stop()


def _drive(direct: Kube, ns: str, stack: Stack, res: WarmResult, churn: Churn,
           window: float, grace: float) -> None:
    """Run `churn` for `window` s (or until its limit), wait `grace` s for the last claims,
    then delete every Session and check the invariants once the queue is idle."""
    c = res.churn
    c.cpu.start()
    t0 = time.monotonic()
    with LoadSampler() as load:
        try:
            churn.start()
            time.sleep(window)
            churn.stop_creating()
            churn.wait_served(grace)
            c.created, c.served, c.unserved = churn.latencies()
            c.duration = time.monotonic() - t0
            c.cpu.stop()
            c.errors = churn.errors
        finally:
            churn.finish()
    c.load = load.summary()
    stack.wait_idle(180)
    c.violations = [str(x) for x in check(direct, ns, quiet=False)]
    say(f"warm {ns}: {c.describe()}")


def run(instances: int = 30, rate: float = 2.0, hold: float = 2.0, window: float = 60.0,
        grace: float = 30.0, start_delay: float = START_DELAY, together: int = 40,
        together_pool: int = 10, url: str | None = None,
        timeout: float = 600.0) -> tuple[list[Row], list[WarmResult]]:
    url = url or resolve_redis_url()
    warm, at_once = WarmResult(), WarmResult()
    with private_cluster("warm", start_delay=start_delay) as info, \
            latency_proxy(info) as proxy:
        direct = direct_kube(info)
        with _pool(direct, info, proxy, url, "warm", instances, timeout, warm,
                   start_delay) as (ns, stack, warmth):
            warm.churn.rate, warm.churn.window = rate, window
            churn = _record(Churn(direct, ns, rate, hold, prefix="w"), warm, warmth)
            _drive(direct, ns, stack, warm, churn, window, grace)
            say(f"warm: {warm.describe()}")
        if together:
            # Bursting as the controller's default has it: the Sessions beyond the pool get
            # instances made for them (cold), not a wait for a release.
            with _pool(direct, info, proxy, url, "together", together_pool, timeout, at_once,
                       start_delay, env={"WARMPOOL_BURST": "on"}) as (ns, stack, warmth):
                churn = _record(Churn(direct, ns, 1000.0, 3600.0, prefix="t", limit=together),
                                at_once, warmth)
                at_once.churn.window = 0.0
                _drive(direct, ns, stack, at_once, churn, 1.0, grace)
    return rows_for(warm, at_once if together else None, instances, rate, hold, start_delay,
                    together, together_pool), [warm, at_once]


def _cpu_bound(t: ChurnResult) -> str:
    """How busy the machine was from the first create to the last HANDLED: near 100 % of its
    cores, the latency is bounded by the CPU the claims (and all else running) need, not by
    any wait of the controller's."""
    if not t.cpu.used or t.cpu.wall <= 0:
        return ""
    total, cores = sum(t.cpu.used.values()), os.cpu_count() or 1
    return (f"; the cores were {100 * total / (cores * t.cpu.wall):.0f} % busy from the "
            f"first create to the last HANDLED (every process: {total:.2f} CPU-s in "
            f"{t.cpu.wall:.2f} s on {cores} cores); {t.cpu.describe(digits=2)}")


def rows_for(warm: WarmResult, at_once: WarmResult | None, instances: int, rate: float,
             hold: float, start_delay: float, together: int,
             together_pool: int) -> list[Row]:
    c = warm.churn
    cold_ids = sorted({int(x.instance) for x in warm.claims
                       if not x.got_warm and x.instance.isdigit()})
    share = warm.share()
    note = (f"{instances} instances, {rate:g} Sessions/s for {c.window:.0f} s, each deleted "
            f"{hold:g} s after HANDLED (its release resets the pod: Pending {start_delay:g} s "
            f"again); claim latency {c.describe()}; cold claims took ids "
            f"{', '.join(map(str, cold_ids)) or 'none'}; {len(c.violations)} invariant "
            f"violations after; load {c.load}")
    missed = [x for x in warm.claims if x.available and not x.got_warm]
    if missed:
        note += "; cold with a warm instance available: " + ", ".join(
            f"{x.name} took {x.instance} ({x.latency:.2f} s after its create) while "
            + ", ".join(f"{k} (warm {age:.1f} s before the create)" for k, age in x.warm_ids)
            + " were free and warm throughout" for x in missed[:10])
    if c.cpu.used:
        note += f"; {c.cpu.describe(len(c.served), 'Session served')}"
    rows = [Row("3 claim warm", f"claims on a warm pod, fake-kubelet start delay "
                f"{start_delay:g} s, releases during the run", warm.describe(),
                f"{GOAL_WARM_SHARE * 100:.0f} % of claims with a warm instance available got "
                "one", "", verdict(bool(warm.available()) and share >= GOAL_WARM_SHARE),
                note)]
    if at_once is not None:
        t = at_once.churn
        p95, exact = t.percentile(0.95)
        cold = sum(not x.got_warm for x in at_once.claims)
        rows.append(Row(
            "3 claim latency", f"{together} Sessions at once on {together_pool} instances",
            t.describe(), f"p95 <= {GOAL_P95_TOGETHER * 1000:.0f} ms", "",
            verdict(exact and p95 <= GOAL_P95_TOGETHER and t.unserved == 0),
            f"2 x 8 workers + scheduler, bursting on: {together_pool} warm instances, the "
            f"rest made for their claims ({cold} of {len(at_once.claims)} claims cold); "
            f"Sessions created together and kept; "
            f"{dur_summary('create -> HANDLED', t.served)}; {len(t.violations)} invariant "
            f"violations after; load {t.load}{_cpu_bound(t)}"))
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench warm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=30)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--hold", type=float, default=2.0)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--grace", type=float, default=30.0)
    parser.add_argument("--start-delay", type=float, default=START_DELAY)
    parser.add_argument("--together", type=int, default=40,
                        help="Sessions created at once on --together-pool instances (0: skip)")
    parser.add_argument("--together-pool", type=int, default=10)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args(argv)
    quiet_warnings()
    rows, _ = run(args.instances, args.rate, args.hold, args.window, args.grace,
                  args.start_delay, args.together, args.together_pool, url=args.redis_url)
    print_rows(rows)
    return 0
