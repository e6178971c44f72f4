"""`warmpool_build_info`: which warmpool (and which Python) a target runs.

The usual `<name>_build_info` gauge with the value 1 and the build in its labels: an operator
joins it onto any series (`* on (instance) group_left (version) warmpool_build_info`) to see
which version a rollout left where, and an alert can tell a mixed rollout. On every endpoint:
the scheduler's and each worker host's (its parent runs the same version as its children).
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from functools import lru_cache
from importlib import metadata

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

NAME = "warmpool_build_info"


@lru_cache(maxsize=1)
def version() -> str:
    """The installed distribution's version ("unknown" when run from a bare source tree)."""
    try:
        return metadata.version("warmpool")
    except metadata.PackageNotFoundError:
        return "unknown"


class BuildInfoCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(NAME, "The warmpool build of this process: always 1.",
                                   labels=["version", "python_version"])
        family.add_metric([version(), platform.python_version()], 1)
        yield family
