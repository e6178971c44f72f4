"""The Redis epoch: a random value the scheduler creates and every process checks, so a Redis
that lost its data (a restart without persistence, FLUSHALL, an eviction, a failover to an
empty replica) is noticed within seconds instead of at the next periodic resync (issue #15,
item 10). On fakeredis; each check is one call, no clock involved.
"""

from __future__ import annotations

import itertools

import fakeredis
import redis

from warmpool.queue.epoch import Epoch
from warmpool.queue.jobs import Jobs
from warmpool.queue.layout import Layout
from warmpool.queue.maintenance import Maintenance
from warmpool.queue.observer import NullObserver
from warmpool.queue.settings import QueueSettings

SETTINGS = QueueSettings(redis_url="redis://unused")
LAYOUT = Layout.of(SETTINGS)


def creator(client: redis.Redis, name: str = "e") -> Epoch:
    """A scheduler's view; its epochs are `<name>1`, `<name>2`, ... (random in production)."""
    numbers = itertools.count(1)
    return Epoch(client, LAYOUT, create=True, token=lambda: f"{name}{next(numbers)}")


def test_the_scheduler_creates_the_epoch_and_a_first_sight_is_no_loss(
    client: redis.Redis,
) -> None:
    epoch = creator(client)
    first = epoch.check()
    assert not first.lost and first.current == "e1"
    assert client.get(LAYOUT.epoch) == b"e1"
    again = epoch.check()
    assert not again.lost and again.current == "e1"
    # A second scheduler adopts the epoch it finds: not a loss either.
    other = Epoch(client, LAYOUT, create=True, token=lambda: "never")
    assert not other.check().lost and client.get(LAYOUT.epoch) == b"e1"


def test_a_flushed_redis_is_a_loss_once_and_the_epoch_is_created_again(
    client: redis.Redis,
) -> None:
    epoch = creator(client)
    epoch.check()
    client.flushall()
    lost = epoch.check()
    assert lost.lost and (lost.previous, lost.current) == ("e1", "e2")
    assert client.get(LAYOUT.epoch) == b"e2"
    assert not epoch.check().lost  # the new epoch is the known one now


def test_a_changed_epoch_is_a_loss_for_whoever_did_not_recreate_it(client: redis.Redis) -> None:
    leader, standby = creator(client, "leader-"), creator(client, "standby-")
    leader.check()
    standby.check()
    client.flushall()
    assert standby.check().lost  # it saw the key missing and made a new one
    changed = leader.check()  # it only sees a different value: the same loss
    assert changed.lost and changed.current == client.get(LAYOUT.epoch).decode()


def test_an_observer_reports_a_missing_epoch_once_and_adopts_the_new_one(
    client: redis.Redis,
) -> None:
    epoch = creator(client)
    worker = Epoch(client, LAYOUT, create=False)
    assert worker.check().current is None  # no scheduler yet
    epoch.check()
    assert not worker.check().lost  # first sight
    client.flushall()
    missing = worker.check()
    assert missing.lost and (missing.previous, missing.current) == ("e1", None)
    assert client.get(LAYOUT.epoch) is None  # a worker never creates it
    assert not worker.check().lost  # still missing: the same loss, not a new one
    epoch.check()  # the scheduler re-creates it
    back = worker.check()
    assert not back.lost and back.current == "e2"


def test_before_any_scheduler_ran_an_observer_sees_nothing_lost(client: redis.Redis) -> None:
    worker = Epoch(client, LAYOUT, create=False)
    assert not worker.check().lost
    assert not worker.check().lost


class Losses(NullObserver):
    def __init__(self) -> None:
        self.losses: list[tuple[str | None, str | None]] = []

    def on_redis_lost(self, previous: str | None, current: str | None) -> None:
        self.losses.append((previous, current))


def test_worker_maintenance_checks_the_epoch_and_reports_a_loss(client: redis.Redis) -> None:
    obs = Losses()
    jobs = Jobs(client, SETTINGS, router=lambda key: "job", observer=obs)
    maintenance = Maintenance(jobs)
    scheduler_side = creator(client)
    scheduler_side.check()
    maintenance.check_epoch()
    assert obs.losses == []
    client.flushall()
    maintenance.check_epoch()
    assert obs.losses == [("e1", None)]
    maintenance.check_epoch()
    assert obs.losses == [("e1", None)]


def test_worker_maintenance_survives_an_unreachable_redis() -> None:
    class Down(fakeredis.FakeRedis):
        def get(self, *args: object, **kwargs: object) -> None:
            raise redis.ConnectionError("down")

    obs = Losses()
    jobs = Jobs(Down(), SETTINGS, router=lambda key: "job", observer=obs)
    Maintenance(jobs).check_epoch()  # logs; the next tick tries again
    assert obs.losses == []


def test_a_worker_counts_each_loss_in_its_metric() -> None:
    from prometheus_client import REGISTRY

    from metrics.worker import WorkerObserver

    def value() -> float:
        return REGISTRY.get_sample_value("warmpool_redis_data_lost_total") or 0.0

    before = value()
    WorkerObserver().on_redis_lost("e1", None)
    assert value() == before + 1
