"""Memory: peak RSS (VmHWM) of the worker processes and of the scheduler with 10,000 pool
objects in the watched namespace, against the same processes with only the pool's own 100.

The 10,000 objects are ConfigMaps with the pool label, half shaped like proxy ConfigMaps
(a ~1 KB oauth2-proxy config), half like email ConfigMaps, owned by the AppDefinition but
named outside the instance scheme, so the controller leaves them alone while the scheduler
watches them all and every resync and claim lists them all. Each phase starts fresh
processes (VmHWM is a lifetime peak), then runs the same load: the startup resync, 16
Sessions claimed at once (each claim lists the pool), 3 more resyncs, the 16 released.

  python -m bench memory [--objects 10000] [--instances 20]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bench.cluster import (
    PROXY_TEMPLATE,
    direct_kube,
    latency_proxy,
    new_namespace,
    private_cluster,
    quiet_warnings,
)
from bench.machine import hwm_mb
from bench.report import Row, print_rows, say, verdict
from bench.stack import Stack
from bench.world import PoolCounter, create_appdef
from warmpool.keys import PoolKey
from warmpool.kube.api import Kube
from warmpool.pool import vocabulary as v
from warmpool.queue.embedded import resolve_redis_url
from warmpool.queue.keyed import KeyedQueue
from warmpool.testing.world import create_session

APPDEF = "java"
GOAL_WORKER_MB = 120.0
GOAL_SCHEDULER_MB = 250.0
CLAIMS = 16

@dataclass
class Peak:
    workers: float
    scheduler: float
    one_list: float = 0.0  # MB: peak Python allocation of one list_pool_objects, in-process


def one_list_mb(kube: Kube, ns: str) -> float:
    """What one `observe.list_pool_objects` (every claim and resync makes one) allocates at
    its peak, measured with tracemalloc in this process."""
    import gc
    import tracemalloc

    from warmpool.kube.observe import list_pool_objects

    gc.collect()
    tracemalloc.start()
    try:
        objects = list_pool_objects(kube, ns)
        peak = tracemalloc.get_traced_memory()[1]
        del objects
    finally:
        tracemalloc.stop()
    return peak / 1024 / 1024


def _filler(appdef: dict, i: int) -> dict:
    meta = appdef["metadata"]
    proxy = i % 2 == 0
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": f"bench-mem-{i}", "namespace": meta["namespace"],
            "labels": {v.LABEL_GENERATION: str(meta["generation"]),
                       v.LABEL_TEMPLATE_PURPOSE: v.PURPOSE_PROXY if proxy
                       else v.PURPOSE_EMAILS},
            "ownerReferences": [{"apiVersion": v.APPDEF_API_VERSION, "kind": v.APPDEF_KIND,
                                 "name": meta["name"], "uid": meta["uid"]}],
        },
        "data": ({v.PROXY_CONFIG_KEY: PROXY_TEMPLATE} if proxy
                 else {v.EMAILS_KEY: f"user{i}@example.com"}),
    }


def _load(direct: Kube, ns: str, stack: Stack, label: str) -> Peak:
    """Fresh processes, then the load; returns their peak RSS."""
    stack.stop_scheduler()
    stack.stop_workers()
    stack.start_workers()
    stack.start_scheduler()
    stack.wait_idle(300)
    queue = KeyedQueue(stack.client, stack.settings)
    names = [f"{label}-{i}" for i in range(CLAIMS)]
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda n: create_session(direct, ns, n, f"{n}@example.com", APPDEF), names))
    stack.wait_idle(300)
    for _ in range(3):
        queue.add(str(PoolKey(ns, APPDEF)))
        time.sleep(0.2)
    stack.wait_idle(300)
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda n: direct.delete(v.SESSION_API_VERSION, v.SESSION_KIND, ns, n),
                    names))
    stack.wait_idle(300)
    assert stack.scheduler is not None
    peak = Peak(max(hwm_mb(p) for p in stack.worker_pids()), hwm_mb(stack.scheduler.pid),
                one_list_mb(direct, ns))
    say(f"memory {label}: workers {peak.workers:.0f} MB, scheduler {peak.scheduler:.0f} MB")
    return peak


def run(objects: int = 10_000, instances: int = 20,
        url: str | None = None) -> tuple[list[Row], tuple[Peak, Peak]]:
    url = url or resolve_redis_url()
    with private_cluster("memory") as info, latency_proxy(info) as proxy:
        direct = direct_kube(info)
        ns = new_namespace(direct, "memory")
        counter = PoolCounter(direct, ns).start()
        stack = Stack(url, info, ns, kubeconfig=proxy.kubeconfig_path, processes=2, threads=8)
        try:
            stack.start()
            appdef = create_appdef(direct, ns, APPDEF, instances)
            gen = int(appdef["metadata"]["generation"])
            if counter.wait(instances, gen, 600, idle=lambda: stack.wait_idle(60)) is None:
                raise RuntimeError("the pool did not converge")
            counter.stop()
            base = _load(direct, ns, stack, "small")
            say(f"memory: creating {objects} pool-labelled ConfigMaps")
            with ThreadPoolExecutor(16) as ex:
                list(ex.map(lambda i: direct.create(_filler(appdef, i)), range(objects)))
            stack.wait_idle(600)
            big = _load(direct, ns, stack, "big")
        finally:
            stack.close()
            counter.stop()
    return rows_for(base, big, objects, instances), (base, big)


def rows_for(base: Peak, big: Peak, objects: int, instances: int) -> list[Row]:
    total = objects + 5 * instances
    base_n = 5 * instances
    note = (f"the larger peak of 2 worker processes x 8 threads; load: startup resync, "
            f"{CLAIMS} claims at once, 3 resyncs, {CLAIMS} releases; one list of the pool "
            f"objects (each claim and resync makes one) allocates {big.one_list:.0f} MB at its "
            f"peak ({base.one_list:.1f} MB with {base_n}), up to 8 at once per process")
    return [
        Row("6 memory", f"worker process, {total:,} pool objects", f"{big.workers:.0f} MB "
            "peak RSS", f"<= {GOAL_WORKER_MB:.0f} MB", f"{base.workers:.0f} MB with "
            f"{base_n} pool objects", verdict(big.workers <= GOAL_WORKER_MB), note),
        Row("6 memory", f"scheduler, {total:,} pool objects watched",
            f"{big.scheduler:.0f} MB peak RSS", f"<= {GOAL_SCHEDULER_MB:.0f} MB",
            f"{base.scheduler:.0f} MB with {base_n} pool objects",
            verdict(big.scheduler <= GOAL_SCHEDULER_MB), ""),
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--instances", type=int, default=20)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args(argv)
    quiet_warnings()
    rows, _ = run(args.objects, args.instances, args.redis_url)
    print_rows(rows)
    return 0
