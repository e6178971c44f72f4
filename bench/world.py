"""What a benchmark puts in the cluster and how it watches the result: the test world's
AppDefinitions (warmpool.testing.world; Sessions are that module's `create_session`) at the
bench's scale, and a watch-fed count of the pool objects (counting costs no request, however
often it is asked)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from bench.report import say
from warmpool.kube.api import Kube
from warmpool.kube.observe import POOL_WATCHES
from warmpool.kube.reflector import Reflector, Watched
from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.pool.meta import labels_of, meta_of, name_of, owner_refs
from warmpool.pool.model import MAX_INSTANCES_CEILING
from warmpool.pool.parts import PARTS
from warmpool.pool.pods import deployment_of, pod_state
from warmpool.testing import world

PARTS_PER_INSTANCE = len(PARTS)


def create_appdef(kube: Kube, ns: str, name: str, min_instances: int) -> dict[str, Any]:
    """The test world's AppDefinition (and the shared route it names) with maxInstances at
    the controller's default ceiling (warmpool.pool.model): the most a pool may have (above
    it the AppDefinition would be invalid and left as it is)."""
    return world.create_appdef(kube, ns, name, min_instances=min_instances,
                               max_instances=MAX_INSTANCES_CEILING)


def set_min_instances(kube: Kube, ns: str, name: str, n: int) -> int:
    """Patch spec.minInstances; returns the AppDefinition's new metadata.generation."""
    return int(world.patch_appdef_spec(kube, ns, name, minInstances=n)["metadata"]["generation"])


# ---- watching what the cluster holds --------------------------------------------------------


def identity_stub(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """What a bench's watch keeps of an object it only counts or names: the identity the
    reflector needs (name, namespace, resourceVersion), so a large pool costs little memory."""
    meta = meta_of(obj)
    return {"metadata": {k: meta.get(k) for k in ("name", "namespace", "resourceVersion")}}


def _gen_stub(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {**identity_stub(kind, obj),
            "gen": labels_of(obj).get(v.LABEL_GENERATION),
            "id": naming.instance_id_from_name(name_of(obj)),
            "claimed": any(r.get("kind") == v.SESSION_KIND for r in owner_refs(obj))}


def pod_stub(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """A pod: the Deployment it is a current pod of (None: being deleted, or none), Ready."""
    return {**identity_stub(kind, obj), "dep": deployment_of(obj), "ready": pod_state(obj).ready}


class PoolCounter:
    """Pool objects of a namespace (the three kinds, by the pool label), kept by watches on the
    direct connection: counting costs no request, however often it is asked. With `pods`, the
    namespace's pods too, so a bench can wait for the pool to be running, not just written
    (`pods_settled`)."""

    def __init__(self, kube: Kube, namespace: str, *, pods: bool = False) -> None:
        self._stop = threading.Event()
        self.reflectors = [
            Reflector(kube, watched, namespace, lambda *_: None, summarize=_gen_stub,
                      timeout_range=(240.0, 300.0))
            for watched in POOL_WATCHES
        ]
        self.pods = (Reflector(kube, Watched("Pod", "v1", None), namespace, lambda *_: None,
                               summarize=pod_stub, timeout_range=(240.0, 300.0))
                     if pods else None)

    def start(self) -> PoolCounter:
        watches = [*self.reflectors, *([self.pods] if self.pods is not None else [])]
        for r in watches:
            r.start(self._stop)
        for r in watches:
            r.synced.wait(60)
        return self

    def pods_settled(self) -> bool:
        """Every Deployment of the pool has a current pod Ready (needs `pods`).

        Why a bench waits for this and not only for the objects: kube-controller-manager
        makes each Deployment's ReplicaSet and pod at its own client rate (20 requests/s by
        default), minutes behind a 1,000-instance build. A churn started before it caught up
        shares the API server with that backlog, and its claims find pods still starting:
        the same churn on the same code measured p50 21 s in one run and 0.25 s in the next.
        """
        assert self.pods is not None, "PoolCounter(pods=True) to wait for the pods"
        ready = {p["dep"] for p in self.pods.items() if p["ready"] and p["dep"]}
        deployments = next(r for r in self.reflectors if r.watched.kind == "Deployment")
        return all(d["metadata"]["name"] in ready for d in deployments.items())

    def stop(self) -> None:
        self._stop.set()

    def counts(self, generation: int) -> tuple[int, int]:
        """(all pool objects, those labelled with `generation`)."""
        total = at_gen = 0
        want = str(generation)
        for r in self.reflectors:
            for stub in r.items():
                total += 1
                at_gen += stub.get("gen") == want
        return total, at_gen

    def converged(self, instances: int, generation: int) -> bool:
        total, at_gen = self.counts(generation)
        return total == at_gen == PARTS_PER_INSTANCE * instances

    def converged_free(self, instances: int, generation: int) -> bool:
        """Converged as far as free instances go (claimed ones keep their objects and their
        generation until released): every unclaimed id <= `instances` has its five objects
        at `generation`, and no unclaimed id above it has any."""
        parts: dict[int, int] = {}
        claimed: set[int] = set()
        stubs = [s for r in self.reflectors for s in r.items()]
        for s in stubs:
            if s.get("id") is not None and s.get("claimed"):
                claimed.add(s["id"])
        want = str(generation)
        for s in stubs:
            k = s.get("id")
            if k is None or k in claimed:
                continue
            if k > instances or s.get("gen") != want:
                return False
            parts[k] = parts.get(k, 0) + 1
        return all(parts.get(k, 0) == PARTS_PER_INSTANCE
                   for k in range(1, instances + 1) if k not in claimed)

    def wait(self, instances: int, generation: int, timeout: float,
             idle: Callable[[], bool] | None = None) -> float | None:
        """Seconds until `instances` full instances exist at `generation` and nothing else;
        None on timeout. With `idle`, the wait goes on until it is also true (not counted)."""
        start = time.monotonic()
        reached: float | None = None
        last_say = start
        while time.monotonic() - start < timeout:
            if reached is None and self.converged(instances, generation):
                reached = time.monotonic() - start
            if reached is not None and (idle is None or idle()):
                return reached
            if time.monotonic() - last_say > 30:
                last_say = time.monotonic()
                total, at_gen = self.counts(generation)
                say(f"  ... {time.monotonic() - start:.0f}s: {total} pool objects, {at_gen} at "
                    f"generation {generation}, want {PARTS_PER_INSTANCE * instances}")
            time.sleep(0.1)
        return reached
