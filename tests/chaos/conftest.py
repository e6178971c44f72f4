"""Options of the long chaos tier: `pytest tests/chaos -m slow --chaos-seeds 1,2,3
--chaos-ops 10000` (the CI tier, `-m chaos`, ignores them)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaos", "chaos tiers (tests/chaos)")
    group.addoption("--chaos-seeds", default="1,2,3",
                    help="comma-separated seeds of the long tier [default: 1,2,3]")
    group.addoption("--chaos-ops", type=int, default=10000,
                    help="operations per seed in the long tier [default: 10000]")
    group.addoption("--chaos-sentinels", type=int, default=0,
                    help="long tier: Redis as a primary, a replica and this many Sentinels, "
                    "with the redis_failover fault [default: 0, one server]")
    group.addoption("--chaos-report", default=None,
                    help="write the long tier's figures to this file (e.g. docs/reliability.md)")


def option(config: pytest.Config, name: str, default: object) -> object:
    """An option that may not be registered (this conftest loaded after the command line was
    parsed, e.g. `pytest` run from the root with no path): then its default."""
    try:
        return config.getoption(name)
    except ValueError:
        return default
