"""A real Redis for tests, and per-test isolation by key prefix.

`resolve_redis_url()`: WARMPOOL_REDIS_URL, else a local Redis on 6379 if it answers, else an
embedded valkey-server (started once per test session). Each test gets its own project
prefix and dramatiq namespace (`t<random>:...`), so tests never see each other's keys even
on a shared server or when run in parallel; the keys are deleted afterwards.

Use the fixtures in a test module by binding them there:
`redis_url = redis_server.redis_url` (likewise `redis_client`, `queue_settings`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from warmpool.queue.embedded import resolve_redis_url
from warmpool.queue.redis_conn import connect
from warmpool.queue.settings import QueueSettings

__all__ = [
    "delete_prefix",
    "isolated",
    "isolated_settings",
    "queue_settings",
    "redis_client",
    "redis_url",
    "resolve_redis_url",
]


def isolated_settings(url: str, **changes: object) -> QueueSettings:
    """Settings whose every key lives under a fresh `t<hex>:` prefix."""
    tag = f"t{uuid.uuid4().hex[:10]}"
    return QueueSettings(
        redis_url=url,
        prefix=f"{tag}:warmpool:",
        namespace=f"{tag}:dramatiq",
        **changes,  # type: ignore[arg-type]
    )


@contextmanager
def isolated(url: str, client: redis.Redis, **changes: object) -> Iterator[QueueSettings]:
    """`isolated_settings` for the length of a block; every key under its prefix is deleted
    afterwards (a test module's `settings` fixture: `with isolated(...) as s: yield s`)."""
    settings = isolated_settings(url, **changes)
    try:
        yield settings
    finally:
        delete_prefix(client, settings.prefix.split(":", 1)[0] + ":")


def delete_prefix(client: redis.Redis, prefix: str) -> int:
    deleted = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=prefix + "*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            deleted += client.delete(*batch)
            batch.clear()
    if batch:
        deleted += client.delete(*batch)
    return deleted


@pytest.fixture(scope="session")
def redis_url() -> str:
    url = resolve_redis_url()
    try:
        connect(url).ping()
    except redis.RedisError as e:  # a missing service fails the run: a skip would hide it
        pytest.fail(f"no Redis at {url} (`bash .ci/run` starts one on 127.0.0.1:6379): {e}")
    return url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = connect(redis_url)
    yield client
    client.close()


@pytest.fixture
def queue_settings(redis_url: str, redis_client: redis.Redis) -> Iterator[QueueSettings]:
    with isolated(redis_url, redis_client) as settings:
        yield settings
