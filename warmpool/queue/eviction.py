"""The external Redis's eviction policy, checked when a worker or the scheduler starts.

Redis under `maxmemory` with a policy that evicts keys (`allkeys-*`, or `volatile-*`, which
evicts keys with a TTL: every lease is one) drops the queue's keys when it fills: a lease
(two holders of one key at once, the later writes refused only by the fences and the
resourceVersions), the `dirty` set or a key's message (work delayed until the periodic
resync or the audit), the epoch (every pool resynced at once). warmpool survives each as it
survives a Redis that lost its data, but that is recovery, not operation.

Choice: a loud warning, not a refusal. A refusal would make warmpool unusable on managed
Redis services whose default policy evicts (ElastiCache's is `volatile-lru`) and that often
refuse `CONFIG` altogether, for a condition the design already recovers from; the warning
says what to set. `noeviction` (Redis's default) makes a full Redis refuse writes instead:
the jobs fail, are retried with backoff, and nothing is lost. See warmpool/queue/README.md.
"""

from __future__ import annotations

import logging

import redis

log = logging.getLogger(__name__)

#: The policies that never drop a key.
SAFE_POLICIES = frozenset({"noeviction"})


def eviction_policy(client: redis.Redis) -> str | None:
    """The server's `maxmemory-policy`, or None when it cannot be read (managed Redis often
    refuses CONFIG). Bounded: a short ASCII word is expected; anything else reads as None."""
    try:
        reply = client.config_get("maxmemory-policy")
    except redis.ResponseError:
        return None
    value = reply.get("maxmemory-policy") if isinstance(reply, dict) else None
    if isinstance(value, bytes):
        value = value.decode("ascii", errors="replace")
    if not isinstance(value, str) or not 0 < len(value) <= 64:
        return None
    return value


def eviction_warning(policy: str | None) -> str | None:
    """What to tell an operator about `policy` (None: it could not be read); None if safe."""
    if policy is None:
        return ("could not read the Redis server's maxmemory-policy (CONFIG GET refused?): "
                "make sure it is noeviction, or leases and queued work may be evicted when "
                "Redis is full (warmpool/queue/README.md, 'Redis requirements')")
    if policy in SAFE_POLICIES:
        return None
    return (f"the Redis server's maxmemory-policy is {policy!r}: when Redis is full it evicts "
            "keys, leases and queued work among them (two holders of one key, delayed work, "
            "full resyncs). Set maxmemory-policy noeviction (warmpool/queue/README.md, "
            "'Redis requirements')")


def warn_if_evicting(client: redis.Redis) -> str | None:
    """Log `eviction_warning` for the server behind `client` (as a WARNING, every start) and
    return it; None when the policy is safe."""
    warning = eviction_warning(eviction_policy(client))
    if warning is not None:
        log.warning("WARNING: %s", warning)
    return warning
