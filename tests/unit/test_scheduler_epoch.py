"""The scheduler notices a Redis that lost its data within seconds (the epoch, see
`warmpool.queue.epoch`) and resyncs every pool at once instead of at the next periodic resync;
the deployed periodic resync is short enough for releases that depend on it (issue #15,
item 10). A static fake API and fakeredis; waits are on conditions, never on sleeps.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import fakeredis
import pytest

from metrics.collectors import SchedulerCollector
from scheduler.app import Scheduler, SchedulerConfig
from tests.waiting import wait_for
from warmpool.queue.epoch import Epoch
from warmpool.queue.keyed import KeyedQueue
from warmpool.queue.layout import Layout
from warmpool.queue.settings import QueueSettings

NS = "ns1"
SETTINGS = QueueSettings(redis_url="redis://unused")
LAYOUT = Layout.of(SETTINGS)


class Kube:
    """Lists one AppDefinition; its watches stay quiet."""

    def list_pages(self, api_version: str, kind: str, namespace: str | None, **kw: Any) -> Any:
        objs = [{"metadata": {"name": "java", "namespace": NS, "resourceVersion": "1",
                              "uid": "u-java", "generation": 1}}] if kind == "AppDefinition" else []
        yield objs, "1"

    def watch(self, api_version: str, kind: str, namespace: str | None, **kw: Any) -> Any:
        time.sleep(0.02)  # stimulus: each fake watch lasts a moment, as a quiet server's
        yield from ()


class Elector:
    def __init__(self, leading: bool) -> None:
        self.leading = leading
        self.identity = "fake"
        self.last_error = None

    def is_leader(self) -> bool:
        return self.leading

    def observed_holder(self) -> str:
        return "fake"

    def run(self, stop: threading.Event) -> None:
        stop.wait()

    def release(self) -> bool:
        return True


@pytest.fixture
def made() -> Any:
    schedulers: list[Scheduler] = []
    yield schedulers
    for s in schedulers:
        s.stop(timeout=5)


def scheduler(client: fakeredis.FakeRedis, made: list[Scheduler], **cfg: Any) -> Scheduler:
    s = Scheduler(lambda: Kube(), KeyedQueue(client, SETTINGS),  # type: ignore[arg-type]
                  SchedulerConfig(namespaces=[NS], **cfg),
                  epoch=Epoch(client, LAYOUT, create=True))
    made.append(s)
    return s


def waiting(client: fakeredis.FakeRedis) -> set[str]:
    return {k.decode() for k in client.smembers(LAYOUT.dirty)}


def test_a_flushed_redis_is_resynced_at_once_and_the_epoch_made_again(
    client: fakeredis.FakeRedis, made: list[Scheduler],
) -> None:
    s = scheduler(client, made, epoch_period=3600.0)  # only the explicit checks below
    s.start()
    wait_for(lambda: waiting(client) == {"pool/ns1/java"}, timeout=10,
             message="the startup resync")
    epoch = client.get(LAYOUT.epoch)
    assert epoch  # created at start
    client.flushall()  # Redis restarted without persistence: the waiting key is gone too
    assert s.check_epoch() is True
    wait_for(lambda: waiting(client) == {"pool/ns1/java"}, timeout=10,
             message="the resync after the loss")
    assert s.resync_counts().get("redis lost") == 1
    assert s.stats.redis_losses == 1
    assert client.get(LAYOUT.epoch) not in (None, epoch)
    assert s.check_epoch() is False  # the new epoch is the known one: nothing more to do
    families = {f.name: f for f in SchedulerCollector(s).collect()}
    (sample,) = families["warmpool_redis_data_lost"].samples
    assert sample.value == 1
    by_reason = {x.labels["reason"]: x.value for x in families["warmpool_scheduler_resyncs"]
                 .samples if x.name.endswith("_total")}
    assert by_reason["redis_lost"] == 1


def test_the_scheduler_checks_the_epoch_by_itself_every_epoch_period(
    client: fakeredis.FakeRedis, made: list[Scheduler],
) -> None:
    s = scheduler(client, made, epoch_period=0.05, resync_period=3600.0)
    s.start()
    wait_for(lambda: client.get(LAYOUT.epoch) and waiting(client), timeout=10,
             message="the epoch and the startup resync")
    client.flushall()
    wait_for(lambda: s.resync_counts().get("redis lost") == 1, timeout=10,
             message="a resync for the lost data, long before the periodic one")
    wait_for(lambda: waiting(client) == {"pool/ns1/java"}, timeout=10)


def test_a_standby_recreates_the_epoch_but_leaves_the_resync_to_the_leader(
    client: fakeredis.FakeRedis, made: list[Scheduler],
) -> None:
    standby = scheduler(client, made, epoch_period=3600.0)
    standby.elector = Elector(leading=False)  # type: ignore[assignment]
    standby.start()
    assert standby.check_epoch() is False
    client.flushall()
    assert standby.check_epoch() is True
    assert client.get(LAYOUT.epoch)
    assert standby.stats.resyncs == 0 and not waiting(client)


def test_the_periodic_resync_defaults_to_a_minute() -> None:
    """The backstop for what the epoch cannot see (one key evicted, a failover that lost only
    the last writes): a release whose key was lost waits at most this long."""
    from scheduler.cli import scheduler as command

    assert SchedulerConfig().resync_period == 60.0
    (option,) = [p for p in command.params if p.name == "resync_period"]
    assert option.default == 60.0
