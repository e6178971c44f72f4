"""Redis fixtures for every test (registered in tests/conftest.py's `pytest_plugins`).

- `redis_url` (session): WARMPOOL_REDIS_URL, else a local Redis on 6379 if it answers, else an
  embedded valkey-server (`warmpool.queue.embedded.resolve_redis_url`). No server fails the
  run: a skip would hide that the Redis tiers did not run.
- `redis_client`: a client on it, closed after the test.
- `queue_settings`: `QueueSettings` under a fresh `t<hex>:` prefix, every key under it deleted
  after the test (`tests.redis_server.isolated`), so tests never see each other's keys.

A test names them as arguments; nothing is imported or bound in test modules.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.redis_server import isolated
from warmpool.queue.embedded import resolve_redis_url
from warmpool.queue.redis_conn import connect
from warmpool.queue.settings import QueueSettings


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
