"""Bulk writes yield to a waiting claim (issue #28, deliverable 3), on the real API server and
Redis: a scale-down's deletes take one token each while a claim message waits on the claims
queue, and none while it does not. The pacer's clock and sleep are a fake one (the writes are
real), so what is asserted is how many writes each token let through, never elapsed time."""

from __future__ import annotations

import threading
from typing import Any

import redis

from warmpool.controller.guard import LocalLeases
from warmpool.controller.reconcile import reconcile_instance
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

RATE = 2.0  # tokens per (fake) second


class DeleteCountingKube(Kube):
    def __init__(self, api_client: Any) -> None:
        super().__init__(api_client)
        self.deletes = 0
        self._lock = threading.Lock()

    def delete(self, *a: Any, **kw: Any) -> Any:
        with self._lock:
            self.deletes += 1
        return super().delete(*a, **kw)


class FakeTime:
    """The pacer's clock; each nap records how many deletes had been sent by then."""

    def __init__(self, kube: DeleteCountingKube) -> None:
        self.now, self.kube = 0.0, kube
        self.naps: list[tuple[float, int]] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.naps.append((self.now, self.kube.deletes))
        self.now += seconds


def _pacer(client: redis.Redis, settings: QueueSettings, time: FakeTime) -> Pacer:
    count = ClaimCount(client, Layout.of(settings), settings.heartbeat_timeout)
    pacing = PacingSettings(rate=RATE, burst=1, max_wait=1e9, poll=0.05)
    return Pacer(pacing, ClaimWatch(count, pacing.poll, clock=time), clock=time,
                 sleep=time.sleep)


def _retire(kube: DeleteCountingKube, ns: str, instance: int, pacer: Pacer) -> None:
    key = InstanceKey(ns, "java", instance)
    with LocalLeases().try_lease(str(key)) as guard:
        assert guard is not None
        result = reconcile_instance(LiveReader(kube), kube, key, guard, PoolSettings(),
                                    pacer=pacer)
    assert result.record is not None and result.record.plan.state == "retired"


def test_a_scale_down_delete_takes_a_token_while_a_claim_waits_and_none_after(
    kube: Kube, namespace: str, redis_client: redis.Redis, queue_settings: QueueSettings,
) -> None:
    ns = namespace
    create_appdef(kube, ns, min_instances=2)
    run_until_quiet(kube, ns)
    patch_appdef_spec(kube, ns, "java", minInstances=0)  # both instances retire
    counting = DeleteCountingKube(kube.api_client)
    time = FakeTime(counting)
    pacer = _pacer(redis_client, queue_settings, time)
    claims = Layout.of(queue_settings).claims_messages_list

    redis_client.rpush(claims, "a-claim-message-id")  # a claim waits on the claims queue
    _retire(counting, ns, 2, pacer)
    paced = counting.deletes
    assert paced >= 2, "a retirement deletes the instance's objects one by one"
    # One write on the burst's token, then each write only after its token accrued: the
    # writes sent by each nap's end never run ahead of the tokens given by then.
    assert pacer.stats.paced == paced and pacer.stats.free == 0 and pacer.stats.overdue == 0
    for now, sent in time.naps:
        assert sent <= 1 + int(now * RATE + 1e-9)
    assert time.now * RATE >= paced - 1 - 1e-9

    redis_client.delete(claims)  # served: nothing waits
    time.now += 1.0  # the count cached meanwhile is read again
    naps = len(time.naps)
    _retire(counting, ns, 1, pacer)
    assert counting.deletes > paced
    assert len(time.naps) == naps, "no claim waiting: bulk writes go at once"
    assert pacer.stats.free == counting.deletes - paced
