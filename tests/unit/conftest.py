"""Shared fixtures of the unit tests."""

import importlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import fakeredis
import pytest
import redis
from dramatiq.message import Message

from warmpool.kube.cache import ClusterCache
from warmpool.queue.jobs import JobContext, Jobs
from warmpool.queue.settings import QueueSettings
from workers import runtime

NS = "ns1"


@pytest.fixture
def make_cache() -> Iterator[Callable[[Any], ClusterCache]]:
    """A `ClusterCache` of namespace ns1 over a scripted API (anything with list_pages and
    watch), synced; stopped after the test."""
    made: list[ClusterCache] = []

    def make(kube: Any) -> ClusterCache:
        c = ClusterCache(lambda: kube, [NS], timeout_range=(1.0, 2.0)).start()
        assert c.wait_synced(5)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


# --- a keyed queue on fakeredis, and jobs started on it -----------------------------------------


@pytest.fixture
def client() -> redis.Redis:
    return fakeredis.FakeRedis()


@pytest.fixture
def jobs(client: redis.Redis) -> Jobs:
    settings = QueueSettings(redis_url="redis://unused", prefix="h:warmpool:",
                             namespace="h:dramatiq")
    return Jobs(client, settings, router=lambda key: "job")


@pytest.fixture
def started_job(jobs: Jobs) -> Iterator[Callable[[str], JobContext]]:
    """started_job(key) -> a JobContext holding key's lease, taken as a worker takes it: the
    key added, its message delivered, the job begun (finished at teardown if still held)."""
    held: list[JobContext] = []

    def start(key: str) -> JobContext:
        jobs.queue.add(key)
        lo = jobs.queue.layout
        queue = lo.queue_of(key)  # claims have their own dramatiq queue
        rid = jobs.client.lpop(lo.messages_list_of(queue))
        msg = Message.decode(jobs.client.hget(lo.messages_of(queue), rid))
        ctx = jobs.begin(msg.args[0], msg.message_id, ("", rid.decode()))
        assert isinstance(ctx, JobContext)
        held.append(ctx)
        return ctx

    yield start
    for ctx in held:
        if not ctx.lease.released:
            jobs.finish(ctx)


@pytest.fixture
def handlers() -> ModuleType:
    """`workers.handlers`, imported under `using`: the import registers the real jobs, which
    would otherwise stay registered for every later test of the session (and a worker broker
    built by one of them would start a cache on a cluster that is not there)."""
    with runtime.using({}):
        return importlib.import_module("workers.handlers")
