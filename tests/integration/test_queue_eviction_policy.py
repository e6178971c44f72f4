"""The eviction-policy check at start on real servers (issue #27, point 6): the shared test
Redis (noeviction, as it should be) passes quietly; a private valkey switched to an evicting
policy makes `warmpool worker`'s start-up check (`check_servers`) log the loud warning, and
start anyway (the choice is documented in `warmpool.queue.eviction` and the queue README)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis

from warmpool.config import check_servers
from warmpool.queue.embedded import EmbeddedRedis, embedded_redis
from warmpool.queue.eviction import eviction_policy, warn_if_evicting
from warmpool.queue.redis_conn import connect

pytestmark = pytest.mark.redis


@pytest.fixture
def private_redis() -> Iterator[EmbeddedRedis]:
    server = embedded_redis(unix_socket=False)
    yield server
    server.stop()


def test_the_test_redis_does_not_evict(redis_client: redis.Redis) -> None:
    assert eviction_policy(redis_client) == "noeviction"
    assert warn_if_evicting(redis_client) is None


def test_an_evicting_redis_is_warned_about_loudly_at_start(
    private_redis: EmbeddedRedis, caplog: pytest.LogCaptureFixture,
) -> None:
    client = connect(private_redis.url)
    client.config_set("maxmemory-policy", "volatile-lru")  # a private server: ours to change
    with caplog.at_level(logging.WARNING, logger="warmpool.queue.eviction"):
        check_servers(private_redis.url, kube=False)  # returns: a warning, not a refusal
    (record,) = [r for r in caplog.records if r.name == "warmpool.queue.eviction"]
    assert "'volatile-lru'" in record.getMessage() and "noeviction" in record.getMessage()
    client.config_set("maxmemory-policy", "noeviction")
    caplog.clear()
    check_servers(private_redis.url, kube=False)
    assert not [r for r in caplog.records if r.name == "warmpool.queue.eviction"]
    client.close()
