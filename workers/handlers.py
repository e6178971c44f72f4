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

from metrics import worker as job_metrics
from warmpool.controller.guard import Guard
from warmpool.controller.reconcile import (
    Deferred,
    claim_session,
    reconcile_instance,
    resync_pool,
)
from warmpool.keys import InstanceKey, PoolKey, SessionKey, parse_key
from warmpool.kube import observe
from warmpool.kube.api import Kube, connect
from warmpool.pool.builders import PoolSettings
from warmpool.pool.model import Invalid
from warmpool.queue.jobs import JobContext
from workers.runtime import register

log = logging.getLogger(__name__)

#: `warmpool worker` checks, before starting any process, that the API server answers and
#: accepts the credentials: a worker that cannot reach it should say so once and exit, not
#: fail every job in a loop.
NEEDS_KUBERNETES = True

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
        if lease is None:
            job_metrics.lease_busy(self.ctx, key)
        elif lease is not self.ctx.lease:
            job_metrics.lease_taken(self.ctx, key)
        try:
            yield lease
        finally:
            if lease is not None and lease is not self.ctx.lease:
                self.ctx.release(lease)


def reconcile(ctx: JobContext) -> None:
    key = parse_key(ctx.key)
    assert isinstance(key, InstanceKey)
    with job_metrics.JobMetrics("instance") as m:
        result = reconcile_instance(kube(), key, ctx.lease, pool_settings())
        m.attempts = result.attempts
        job_metrics.instance_done(ctx, key.appdef, result)  # under the lease: the pool gauges
        if result.follow_ups:
            ctx.jobs.queue.add_many(str(k) for k in result.follow_ups)


def claim(ctx: JobContext) -> None:
    key = parse_key(ctx.key)
    assert isinstance(key, SessionKey)
    with job_metrics.JobMetrics("session") as m:
        try:
            result = claim_session(kube(), key, JobLeases(ctx), pool_settings())
        except Deferred as exc:
            # An instance this claim needs is leased by another job: try again in
            # milliseconds, never by parking this thread.
            log.debug("claim %s deferred: %s", key, exc)
            m.requeue()
            ctx.defer(exc.after)
            return
        job_metrics.claim_done(ctx, result)


def resync(ctx: JobContext) -> None:
    key = parse_key(ctx.key)
    assert isinstance(key, PoolKey)
    with job_metrics.JobMetrics("pool"):
        started = job_metrics.resync_started(ctx)
        keys = resync_pool(kube(), key)
        # An empty resync may be a refused AppDefinition: its Sessions still wait for it.
        refused = not keys and isinstance(observe.read_appdef(kube(), key.namespace,
                                                              key.appdef), Invalid)
        job_metrics.resync_done(ctx, key, keys, started, refused=refused)
        ctx.jobs.queue.add_many(str(k) for k in keys)


register("instance", reconcile)
register("session", claim)
register("pool", resync)
