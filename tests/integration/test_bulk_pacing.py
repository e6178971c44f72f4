"""Bulk work yields to a waiting claim (issue #28, deliverable 3), on the real API server and
Redis: while a claim message waits on the claims queue, a scale-down's plan takes one token
per write, and a plan with no token is not sent (its job is DEFERRED, nothing written) until
its token is due; with no claim waiting nothing is held back. The pacer's clock is a fake
one (the writes are real), so what is asserted is writes per token, never elapsed time."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis

from warmpool.controller.guard import LocalLeases
from warmpool.controller.reconcile import reconcile_instance
from warmpool.controller.result import Outcome, Result
from warmpool.controller.sequential import run_until_quiet
from warmpool.keys import InstanceKey
from warmpool.kube.api import Kube
from warmpool.kube.pacing import ClaimWatch, Pacer, PacingSettings
from warmpool.kube.reader import LiveReader
from warmpool.pool.builders import PoolSettings
from warmpool.queue.claims import ClaimCount
from warmpool.queue.layout import Layout
from warmpool.queue.settings import QueueSettings
from warmpool.testing.world import create_appdef, patch_appdef_spec

RATE = 1.0  # tokens per (fake) second


class DeleteCountingKube(Kube):
    def __init__(self, api_client: Any) -> None:
        super().__init__(api_client)
        self.deletes = 0
        self._lock = threading.Lock()

    def delete(self, *a: Any, **kw: Any) -> Any:
        with self._lock:
            self.deletes += 1
        return super().delete(*a, **kw)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _pacer(client: redis.Redis, settings: QueueSettings, clock: FakeClock) -> Pacer:
    count = ClaimCount(client, Layout.of(settings), settings.heartbeat_timeout)
    pacing = PacingSettings(rate=RATE, burst=1, max_wait=1e9, poll=0.05)
    return Pacer(pacing, ClaimWatch(count, pacing.poll, clock=clock), clock=clock)


def _run(kube: DeleteCountingKube, ns: str, instance: int, pacer: Pacer) -> Result:
    key = InstanceKey(ns, "java", instance)
    with LocalLeases().try_lease(str(key)) as guard:
        assert guard is not None
        return reconcile_instance(LiveReader(kube), kube, key, guard, PoolSettings(),
                                  pacer=pacer)


def test_a_scale_down_takes_a_token_per_delete_while_a_claim_waits_and_none_after(
    kube: Kube, namespace: str, redis_client: redis.Redis, queue_settings: QueueSettings,
) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=3)
    run_until_quiet(kube, ns)
    patch_appdef_spec(kube, ns, "java", minInstances=0)  # every instance retires
    counting = DeleteCountingKube(kube.api_client)
    clock = FakeClock()
    pacer = _pacer(redis_client, queue_settings, clock)
    claims = Layout.of(queue_settings).claims_messages_list

    redis_client.rpush(claims, "a-claim-message-id")  # a claim waits on the claims queue
    first = _run(counting, ns, 3, pacer)  # the burst's token: sent, its deletes in debt
    assert first.outcome is not Outcome.DEFERRED
    deletes = counting.deletes
    assert deletes >= 2, "a retirement deletes the instance's objects one by one"
    assert pacer.stats.paced == 1 and pacer.stats.writes >= deletes  # (and its events)
    taken = pacer.stats.writes

    held = _run(counting, ns, 2, pacer)  # no token: not sent, nothing written
    assert held.outcome is Outcome.DEFERRED and counting.deletes == deletes
    assert held.requeue_after is not None
    assert held.requeue_after * RATE == pytest.approx(taken)  # the debt is paid first
    clock.now += held.requeue_after
    assert _run(counting, ns, 2, pacer).outcome is not Outcome.DEFERRED  # its token is due
    assert counting.deletes > deletes and pacer.stats.paced == 2

    redis_client.delete(claims)  # served: nothing waits
    clock.now += 0.05  # the cached count is read again; the bucket is still in debt
    sent = counting.deletes
    assert _run(counting, ns, 1, pacer).outcome is not Outcome.DEFERRED
    assert counting.deletes > sent and pacer.stats.free == 1
