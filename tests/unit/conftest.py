"""Shared fixtures of the unit tests."""

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from warmpool.kube.cache import ClusterCache

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
