"""Crash recovery: the worker running a claim is SIGKILLed right after the claim's deciding
write (the Session's owner reference on the instance's external Service) and before the
Session is HANDLED; measured: kill -> Session HANDLED and the invariant checker green.

- keyed queue: 2 worker processes x 4 threads (`workers.handlers` via `workers.runlog`); the
  killed one held the Session key's lease. Its leases lapse after the lease TTL; the
  survivor's maintenance takes the key back and runs the claim again, which finds the
  instance already claimed and completes it. Goal: <= lease TTL + 2 s.
- baseline: the same claim function as a plain dramatiq actor on a broker with dramatiq's
  defaults (`bench.default_worker`): 2 processes, heartbeat timeout 60 s, dead workers'
  messages requeued by maintenance on 0.1 % of broker calls. Waited for up to `--cap` s.

In both cases the bench itself enqueues the Session's claim (no scheduler: only the queue's
own recovery is measured), and every controller request goes through the proxy, slowed to
150 ms while the claim runs so that the kill lands mid-claim, and back to 10 ms at the kill.

  python -m bench crash [--cap 300]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass, field

from bench import default_worker
from bench.cluster import (
    direct_kube,
    latency_proxy,
    new_namespace,
    private_cluster,
    quiet_warnings,
)
from bench.report import Row, fmt_s, print_rows, say, verdict
from bench.stack import Stack
from bench.world import PoolCounter, create_appdef
from warmpool.cluster.local import ClusterInfo
from warmpool.invariants import check
from warmpool.keys import SessionKey
from warmpool.kube.api import Kube
from warmpool.kube.observe import POOL_SELECTOR
from warmpool.pool import vocabulary as v
from warmpool.pool.meta import owner_refs
from warmpool.queue.keyed import KeyedQueue
from warmpool.queue.layout import Layout
from warmpool.queue.lease import holder_of
from warmpool.queue.redis_conn import connect as redis_connect
from warmpool.queue.replies import text
from warmpool.testing.apiproxy import ApiProxy
from warmpool.testing.world import create_session

APPDEF = "java"
POOL = 3
SLOW = 0.15


@dataclass
class CrashResult:
    recovered: float | None = None  # kill -> HANDLED and invariants green
    handled: float | None = None  # kill -> HANDLED
    mid_claim: bool = False
    cap: float = 0.0
    notes: list[str] = field(default_factory=list)


def _decided(kube: Kube, ns: str, session: str) -> bool:
    items, _ = kube.list("v1", "Service", ns, label_selector=POOL_SELECTOR)
    return any(r.get("kind") == v.SESSION_KIND and r.get("name") == session
               for s in items for r in owner_refs(s))


def _status(kube: Kube, ns: str, session: str) -> str | None:
    obj = kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, session)
    return ((obj or {}).get("status") or {}).get("operatorStatus")


def _wait_decided(kube: Kube, ns: str, session: str, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _decided(kube, ns, session):
            return True
        time.sleep(0.01)
    return False


def _wait_recovered(kube: Kube, ns: str, session: str, t_kill: float, cap: float,
                    res: CrashResult) -> None:
    while time.monotonic() - t_kill < cap:
        if res.handled is None and _status(kube, ns, session) == v.STATUS_HANDLED:
            res.handled = time.monotonic() - t_kill
        if res.handled is not None and not check(kube, ns):
            res.recovered = time.monotonic() - t_kill
            return
        time.sleep(0.1)


def _build(direct: Kube, ns: str, stack: Stack, counter: PoolCounter) -> None:
    stack.start()
    gen = int(create_appdef(direct, ns, APPDEF, POOL)["metadata"]["generation"])
    if counter.wait(POOL, gen, 300, idle=lambda: stack.wait_idle(60)) is None:
        raise RuntimeError("the pool did not converge")
    stack.stop_scheduler()


def keyed_case(info: ClusterInfo, proxy: ApiProxy, url: str) -> tuple[CrashResult, float]:
    res = CrashResult()
    direct = direct_kube(info)
    ns = new_namespace(direct, "crash-keyed")
    counter = PoolCounter(direct, ns).start()
    stack = Stack(url, info, ns, kubeconfig=proxy.kubeconfig_path, processes=2, threads=4)
    try:
        _build(direct, ns, stack, counter)
        ttl = stack.settings.lease_ttl
        proxy.set(latency=SLOW)
        create_session(direct, ns, "s1", "crash@example.com", APPDEF)
        key = str(SessionKey(ns, "s1"))
        KeyedQueue(stack.client, stack.settings).add(key)
        if not _wait_decided(direct, ns, "s1"):
            raise RuntimeError("the claim never made its deciding write")
        raw = stack.client.get(Layout.of(stack.settings).lease(key))
        if raw is None:
            raise RuntimeError("the claim's lease is not held at its deciding write")
        pid = int(holder_of(text(raw)).split(":")[1])
        stack.kill_worker(pid)
        t_kill = time.monotonic()
        proxy.set(latency=0.01)
        res.mid_claim = _status(direct, ns, "s1") != v.STATUS_HANDLED
        say(f"crash keyed: killed worker {pid} mid-claim={res.mid_claim}")
        res.cap = 120.0
        _wait_recovered(direct, ns, "s1", t_kill, res.cap, res)
        say(f"crash keyed: recovered in {fmt_s(res.recovered)}")
    finally:
        proxy.set(latency=0.01)
        stack.close()
        counter.stop()
    return res, ttl


def baseline_case(info: ClusterInfo, proxy: ApiProxy, url: str, cap: float) -> CrashResult:
    res = CrashResult(cap=cap)
    direct = direct_kube(info)
    ns = new_namespace(direct, "crash-default")
    counter = PoolCounter(direct, ns).start()
    stack = Stack(url, info, ns, kubeconfig=proxy.kubeconfig_path, processes=2, threads=4)
    tag = stack.tag + "-default"
    ctx = multiprocessing.get_context("spawn")
    procs = []
    client = redis_connect(url)
    try:
        _build(direct, ns, stack, counter)
        stack.stop_workers()
        for _ in range(2):
            ready = ctx.Event()
            p = ctx.Process(target=default_worker.run,
                            args=(url, tag, str(proxy.kubeconfig_path), 4, ready))
            p.start()
            ready.wait(60)
            procs.append(p)
        broker = default_worker.broker_for(url, tag)
        actor = default_worker.declare(broker, tag)
        proxy.set(latency=SLOW)
        create_session(direct, ns, "s1", "crash@example.com", APPDEF)
        actor.send(ns, "s1")
        if not _wait_decided(direct, ns, "s1"):
            raise RuntimeError("the baseline claim never made its deciding write")
        pid = int(client.get(default_worker.holder_key(tag)) or 0)
        os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        proxy.set(latency=0.01)
        res.mid_claim = _status(direct, ns, "s1") != v.STATUS_HANDLED
        say(f"crash baseline: killed worker {pid} mid-claim={res.mid_claim}; waiting up to "
            f"{cap:.0f}s")
        _wait_recovered(direct, ns, "s1", t_kill, cap, res)
        say(f"crash baseline: recovered in {fmt_s(res.recovered)}")
    finally:
        proxy.set(latency=0.01)
        for p in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)
        for p in procs:
            p.join(15)
            if p.is_alive():
                p.kill()
                p.join(5)
        stack.close()
        counter.stop()
        batch = list(client.scan_iter(match=f"{tag}:*", count=1000))
        for i in range(0, len(batch), 500):
            client.delete(*batch[i : i + 500])
    return res


def run(cap: float = 300.0, url: str | None = None,
        baseline: bool = True) -> tuple[list[Row], tuple[CrashResult, CrashResult | None]]:
    from warmpool.queue.embedded import resolve_redis_url

    url = url or resolve_redis_url()
    with private_cluster("crash") as info, latency_proxy(info) as proxy:
        keyed, ttl = keyed_case(info, proxy, url)
        base = baseline_case(info, proxy, url, cap) if baseline else None
    return rows_for(keyed, base, ttl), (keyed, base)


def _describe(r: CrashResult) -> str:
    if r.recovered is not None:
        return f"{r.recovered:.1f} s (HANDLED after {fmt_s(r.handled)})"
    if r.handled is not None:
        return f"HANDLED after {fmt_s(r.handled)}, invariants not green within {r.cap:.0f} s"
    return f"> {r.cap:.0f} s (cap; claim not completed)"


def rows_for(k: CrashResult, b: CrashResult | None, ttl: float) -> list[Row]:
    goal = ttl + 2.0
    base = ("dramatiq defaults (heartbeat 60 s, maintenance 0.1 %): " + _describe(b)
            if b else "not run")
    ok = k.recovered is not None and k.recovered <= goal
    notes = [f"killed mid-claim: keyed {'yes' if k.mid_claim else 'NO'}"
             + (f", baseline {'yes' if b.mid_claim else 'NO'}" if b else ""),
             f"lease TTL {ttl:.0f} s", "claim enqueued by the bench, no scheduler"]
    return [Row("5 crash recovery", "SIGKILL mid-claim, keyed queue (2 x 4 workers)",
                _describe(k), f"<= lease TTL + 2 s = {goal:.0f} s", base, verdict(ok),
                "; ".join(notes))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench crash", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cap", type=float, default=300.0,
                        help="longest wait for the dramatiq-defaults baseline (s)")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args(argv)
    quiet_warnings()
    rows, _ = run(args.cap, args.redis_url, baseline=not args.no_baseline)
    print_rows(rows)
    return 0
