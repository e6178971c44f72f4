"""The eviction-policy check at start (issue #27, point 6): an external Redis that evicts
keys is reported loudly (the choice, and why not a refusal: `warmpool.queue.eviction`)."""

from __future__ import annotations

import fakeredis
import pytest

from warmpool.queue.eviction import eviction_policy, eviction_warning


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random",
                                    "volatile-lru", "volatile-lfu", "volatile-random",
                                    "volatile-ttl", "something-new"])
def test_every_policy_but_noeviction_is_warned_about(policy: str) -> None:
    warning = eviction_warning(policy)
    assert warning is not None and policy in warning and "noeviction" in warning


def test_noeviction_is_quiet() -> None:
    assert eviction_warning("noeviction") is None


def test_a_server_that_refuses_config_is_warned_about_too() -> None:
    policy = eviction_policy(fakeredis.FakeRedis())  # fakeredis, like managed Redis: no CONFIG
    assert policy is None
    warning = eviction_warning(policy)
    assert warning is not None and "could not read" in warning
