"""The crash benchmark's baseline worker: the same claim, on dramatiq as it comes.

A plain `RedisBroker` with dramatiq's defaults (heartbeat_timeout 60 s, maintenance -- the
requeue of dead workers' unacked messages -- on 0.1 % of broker calls, default middleware
with its Retries) and one actor that runs `claim_session` with process-local leases, as a
deployment of the claim on bare dramatiq would. Each run first records its pid, so the bench
knows whom to kill.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from multiprocessing.synchronize import Event as MpEvent

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

ACTOR = "bench_claim"
QUEUE = "claims"


def holder_key(tag: str) -> str:
    return f"{tag}:holder"


def broker_for(redis_url: str, tag: str) -> RedisBroker:
    return RedisBroker(client=redis.Redis.from_url(redis_url), namespace=f"{tag}:dramatiq")


def declare(broker: RedisBroker, tag: str) -> dramatiq.Actor:
    def bench_claim(namespace: str, session: str) -> None:
        from warmpool.controller.guard import LocalLeases
        from warmpool.controller.reconcile import claim_session
        from warmpool.controller.result import Outcome
        from warmpool.keys import SessionKey
        from warmpool.kube.api import Kube, connect
        from warmpool.kube.reader import LiveReader
        from warmpool.pool.builders import PoolSettings

        broker.client.set(holder_key(tag), os.getpid())
        leases = LocalLeases()
        # The pool was built by the keyed workers, under their Redis fences: start above them
        # (a guard lifts the process's fence counter, as `check_fence` does on a refusal).
        with leases.try_lease("bench/fence-floor") as guard:
            assert guard is not None
            guard.lift_fence(int(os.environ.get("BENCH_FENCE_FLOOR", "0")))
        kube = Kube(connect(os.environ["KUBECONFIG"]))
        result = claim_session(LiveReader(kube), kube, SessionKey(namespace, session), leases,
                               PoolSettings())
        if result.outcome is Outcome.DEFERRED:
            # Plain dramatiq has no "run again later" but a failure: its Retries middleware
            # runs the message again after its backoff.
            raise RuntimeError(f"claim of {session} deferred: {result.message}")

    # = dramatiq.actor(bench_claim, ...), in the spelling its typed overloads take
    return dramatiq.actor(actor_name=ACTOR, queue_name=QUEUE, broker=broker)(bench_claim)


def run(redis_url: str, tag: str, kubeconfig: str, threads: int, ready: MpEvent) -> None:
    """Entry point of one baseline worker process (multiprocessing, spawn)."""
    os.environ["KUBECONFIG"] = kubeconfig
    os.environ.setdefault("BENCH_FENCE_FLOOR", str(10**9))
    logging.basicConfig(level=logging.WARNING)
    broker = broker_for(redis_url, tag)
    declare(broker, tag)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    worker = dramatiq.Worker(broker, queues={QUEUE}, worker_threads=threads)
    worker.start()
    ready.set()
    while not stop.wait(0.5):
        pass
    worker.stop(timeout=5000)
