"""Per-test isolation on a real Redis by key prefix.

Each test gets its own project prefix and dramatiq namespace (`t<random>:...`), so tests never
see each other's keys even on a shared server or when run in parallel; the keys are deleted
afterwards. The fixtures on top of these (`redis_url`, `redis_client`, `queue_settings`) are
tests/plugins/redis.py, available to every test.

`resolve_redis_url()` (re-exported): WARMPOOL_REDIS_URL, else a local Redis on 6379 if it
answers, else an embedded valkey-server (started once per process).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from warmpool.queue.embedded import resolve_redis_url
from warmpool.queue.settings import QueueSettings

__all__ = ["delete_prefix", "isolated", "isolated_settings", "resolve_redis_url"]


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
