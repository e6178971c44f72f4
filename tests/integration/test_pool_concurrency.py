"""S3 and S6 of pool-spec.md: the pool under real concurrency, real worker processes.

Three worker processes run the pool's handlers against the real API server; the test plays the
scheduler by enqueueing keys itself, so these tests depend on the queue and the reconcile logic
only. The invariants that must hold at every moment (I1, I3, I4, checked with quiet=False) are
polled while the work runs; all of them once it is quiet.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import pytest
import redis

from tests.chaos.world import PinnedKube, snapshot, violations_in
from tests.crd_sets import BOTH_CRD_SETS
from tests.pool_world import converge, held_instance, instance_objects, session
from tests.redis_server import isolated
from warmpool.invariants import check
from warmpool.keys import InstanceKey, PoolKey, SessionKey
from warmpool.kube.api import Kube
from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.queue.keyed import KeyedQueue
from warmpool.queue.redis_conn import connect
from warmpool.queue.settings import QueueSettings
from warmpool.testing.world import (
    USERS,
    create_appdef,
    create_session,
    delete_session,
    patch_appdef_spec,
)
from workers.process import WorkerPool


@pytest.fixture
def settings(redis_url: str, redis_client: redis.Redis) -> Iterator[QueueSettings]:
    # A short lease so a SIGKILLed worker's keys come back within seconds.
    with isolated(redis_url, redis_client, lease_ttl=2.0, heartbeat_timeout=2.0,
                  recovery_period=0.25, drain_timeout=5) as s:
        yield s


@pytest.fixture
def workers(settings: QueueSettings, cluster) -> Iterator[WorkerPool]:
    # Strict minInstances: S3 is the race of a claim and a scale-down of the same prewarmed
    # instance, and its check (an object's uid unchanged) assumes nothing makes instances
    # within a round, which a burst would (the chaos suite races bursts and scale-downs).
    pool = WorkerPool(settings, processes=3, threads=4, modules=("workers.handlers",),
                      # The pool's HTTPRoute shape on both CRD sets (unset, upstream's
                      # line would route by the shared Ingress, which these tests don't make).
                      env={"KUBECONFIG": str(cluster.kubeconfig), "WARMPOOL_BURST": "off",
                           "WARMPOOL_ROUTES": "httproute"})
    pool.start()
    yield pool
    pool.stop(timeout=15)


@pytest.fixture
def queue(settings: QueueSettings) -> KeyedQueue:
    return KeyedQueue(connect(settings.redis_url), settings)


class Watchdog:
    """Collects violations of what must hold at every moment, each time it is polled."""

    def __init__(self, kube: Kube, ns: str) -> None:
        self.kube, self.ns, self.seen = kube, ns, set()
        self.pinned = PinnedKube(kube.api_client)

    def record(self) -> bool:
        """Note the always-invariants' violations now; always true (a `converge` expectation).

        Checked on one snapshot: every kind listed at one resourceVersion, as the chaos
        suite's watchdog does. Lists read one after the other pair an allow-list read just
        before a claim wrote it with the route that claim made just after: an R3 violation
        that never existed at any revision (seen once in a full suite run, S3 [upstream])."""
        world = snapshot(self.pinned, [self.ns])
        self.seen |= set(violations_in(world, [self.ns], quiet=False))
        return True

    def quiet(self) -> bool:
        return self.record() and not check(self.kube, self.ns, quiet=True)

    def converge(self, timeout: float = 90) -> None:
        """`converge`, watching the always-invariants on every poll; none may have broken."""
        converge(self.kube, self.ns, self.record, timeout=timeout, interval=0.1)
        assert not self.seen, "violated while running:\n" + "\n".join(sorted(self.seen))


def _uids(kube: Kube, ns: str, k: int) -> dict[str, str]:
    return {n: o["metadata"]["uid"] for n, o in instance_objects(kube, ns, "java", k).items()}


@BOTH_CRD_SETS
def test_s3_claim_and_scale_down_of_the_same_instance_at_once(
    kube, namespace, workers, queue
) -> None:
    """Claims and a scale-down below every id, issued together, round after round.

    Transient damage would be repaired by the next reconcile (a claimed instance's missing
    objects are recreated), so the test does not rely on catching it in the act: nothing
    replaces a free instance within a round, so every object of an instance that ends up
    claimed must still have the uid it had before the round. A deleted one has a new uid.
    """
    ns, dog = namespace, Watchdog(kube, namespace)
    size = 4
    create_appdef(kube, ns, min_instances=size)
    queue.add(str(PoolKey(ns, "java")))
    dog.converge()
    won, rng = 0, random.Random(3)
    rounds = 12
    for round_no in range(rounds):
        before = {k: _uids(kube, ns, k) for k in range(1, size + 1)}
        names = [f"r{round_no}s{i}" for i in range(size)]
        for i, name in enumerate(names):
            create_session(kube, ns, name, USERS[i])
        queue.add_many([str(SessionKey(ns, n)) for n in names])
        # Stimulus: place the scale-down inside the claims' window (a seeded offset of a few
        # ms, not a wait for anything): some claims win, some lose, some are caught half-way.
        time.sleep(rng.uniform(0, 0.03))
        shrunk = patch_appdef_spec(kube, ns, "java", minInstances=0)
        cause = {"AppDefinition/java": shrunk["metadata"]["resourceVersion"]}
        queue.add_many([(str(PoolKey(ns, "java")), cause),
                        *((str(InstanceKey(ns, "java", k)), cause) for k in range(1, size + 1))])
        dog.converge()
        held = {}
        for name in names:
            k = held_instance(kube, ns, name)
            status = session(kube, ns, name)["status"]["operatorStatus"]
            # Either it won the race (and keeps its whole instance, above minInstances) or
            # it waits for one.
            assert (k is not None and status == "HANDLED") or (k is None and status == "HANDLING")
            if k is not None:
                held[name] = k
                assert _uids(kube, ns, k) == before[k], f"an object of claimed instance {k} " \
                    "was deleted and recreated"
        assert len(set(held.values())) == len(held)
        won += len(held)
        for name in names:
            delete_session(kube, ns, name)
        grown = patch_appdef_spec(kube, ns, "java", minInstances=size)
        # As the scheduler does: the resync carries the version that caused it, so a worker
        # whose cache has not yet seen the new minInstances waits for it instead of deciding
        # on the old one (and finding nothing to do).
        queue.add_many([(str(PoolKey(ns, "java")),
                         {"AppDefinition/java": grown["metadata"]["resourceVersion"]}),
                        *(str(InstanceKey(ns, "java", k)) for k in held.values())])
        dog.converge()
    print(f"S3: {won} of {rounds * size} claims won the race against the scale-down")


@BOTH_CRD_SETS
def test_s6_workers_sigkilled_mid_claims_complete_or_roll_back(
    kube, namespace, workers, queue
) -> None:
    ns, dog = namespace, Watchdog(kube, namespace)
    rng = random.Random(6)
    create_appdef(kube, ns, min_instances=8)
    queue.add(str(PoolKey(ns, "java")))
    dog.converge(timeout=120)
    for i in range(8):
        create_session(kube, ns, f"s{i}", USERS[i])
        queue.add(str(SessionKey(ns, f"s{i}")))
        if i % 3 == 1:  # kill a worker while claims are in flight, then bring it back
            victim = rng.randrange(3)
            workers.kill(victim)
            workers.restart(victim)
    dog.converge(timeout=120)
    held = sorted(held_instance(kube, ns, f"s{i}") for i in range(8))
    assert held == list(range(1, 9))


@BOTH_CRD_SETS
def test_s6_a_claim_left_half_done_by_a_dead_worker_is_completed(
    kube, namespace, workers, queue
) -> None:
    """The state a worker leaves when killed right after its deciding write."""
    ns, dog = namespace, Watchdog(kube, namespace)
    ad = create_appdef(kube, ns, min_instances=2)
    queue.add(str(PoolKey(ns, "java")))
    dog.converge()
    s = create_session(kube, ns, "s1", USERS[1])
    ext_name = naming.create_name(ad["spec"]["name"], ad["metadata"]["uid"], 1)
    ext = kube.get("v1", "Service", ns, ext_name)
    ref = {"apiVersion": v.SESSION_API_VERSION, "kind": v.SESSION_KIND,
           "name": "s1", "uid": s["metadata"]["uid"]}
    kube.merge_patch("v1", "Service", ns, ext_name, {"metadata": {
        "ownerReferences": [*ext["metadata"]["ownerReferences"], ref],
        "labels": {v.LABEL_SESSION: "s1"}}})
    # ... and its lease on instance 1 is still there, held by nobody alive.
    lease_key = queue.layout.lease_prefix + str(InstanceKey(ns, "java", 1))
    queue.client.set(lease_key, "1|dead-host:1:1:x.1", px=2000)
    queue.add(str(SessionKey(ns, "s1")))
    dog.converge()
    assert held_instance(kube, ns, "s1") == 1
    email = kube.get("v1", "ConfigMap", ns,
                     naming.create_name(ad["spec"]["name"], ad["metadata"]["uid"], 1, "email"))
    assert email["data"][v.EMAILS_KEY] == USERS[1]
