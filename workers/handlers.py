"""The pool's handlers on the keyed queue: which controller function runs for which key kind.

Importing this module registers them. The worker process owns one Kubernetes client (made on
first use from KUBECONFIG, else in-cluster config) shared by its threads, and a producer to
enqueue follow-up keys: a resync's instances, and waiting claims when an instance frees.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from warmpool.controller.guard import Guard
from warmpool.controller.reconcile import (
    Deferred,
    claim_session,
    reconcile_instance,
    resync_pool,
)
from warmpool.keys import InstanceKey, PoolKey, SessionKey, parse_key
from warmpool.kube.api import Kube, connect
from warmpool.pool.builders import PoolSettings
from warmpool.queue.jobs import JobContext
from workers.runtime import register

log = logging.getLogger(__name__)

_kube: Kube | None = None
_kube_lock = threading.Lock()


def kube() -> Kube:
    """This process's API client: KUBECONFIG if set, else the in-cluster ServiceAccount."""
    global _kube
    with _kube_lock:
        if _kube is None:
            _kube = Kube(connect(os.environ.get("KUBECONFIG") or None))
        return _kube


def pool_settings() -> PoolSettings:
    host = os.environ.get("WARMPOOL_INSTANCES_HOST")
    return PoolSettings(instances_host=host) if host else PoolSettings()


class JobLeases:
    """The controller's `Leases` on a job: other keys' leases, taken without waiting."""

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx

    @contextmanager
    def try_lease(self, key: str) -> Iterator[Guard | None]:
        lease = self.ctx.try_lease(key)
        try:
            yield lease
        finally:
            if lease is not None and lease is not self.ctx.lease:
                self.ctx.release(lease)


def reconcile(ctx: JobContext) -> None:
    key = parse_key(ctx.key)
    assert isinstance(key, InstanceKey)
    result = reconcile_instance(kube(), key, ctx.lease, pool_settings())
    if result.follow_ups:
        ctx.jobs.queue.add_many(str(k) for k in result.follow_ups)


def claim(ctx: JobContext) -> None:
    key = parse_key(ctx.key)
    assert isinstance(key, SessionKey)
    try:
        claim_session(kube(), key, JobLeases(ctx), pool_settings())
    except Deferred as exc:
        # An instance this claim needs is leased by another job: try again in milliseconds,
        # never by parking this thread.
        log.debug("claim %s deferred: %s", key, exc)
        ctx.defer(exc.after)


def resync(ctx: JobContext) -> None:
    key = parse_key(ctx.key)
    assert isinstance(key, PoolKey)
    ctx.jobs.queue.add_many(str(k) for k in resync_pool(kube(), key))


register("instance", reconcile)
register("session", claim)
register("pool", resync)
