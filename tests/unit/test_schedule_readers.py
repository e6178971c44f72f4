"""Both readers hand out an AppDefinition whose min_instances is the scheduled target at their
clock; an invalid PoolSchedule changes nothing (issue #17, item 2)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from tests.unit.test_readers_validate import NS, Listed, appdef_obj
from warmpool.kube.cache import ClusterCache
from warmpool.kube.reader import CachedReader, LiveReader
from warmpool.pool import vocabulary as v
from warmpool.pool.model import AppDefinition

BEFORE = datetime(2026, 3, 2, 11, 39, 59, tzinfo=UTC)
IN_LEAD = datetime(2026, 3, 2, 11, 40, tzinfo=UTC)
AFTER = datetime(2026, 3, 2, 14, 0, tzinfo=UTC)


def schedule(name: str, **window: Any) -> dict[str, Any]:
    return {"apiVersion": v.SCHEDULE_API_VERSION, "kind": v.SCHEDULE_KIND,
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}",
                         "resourceVersion": "5"},
            "spec": {"appDefinition": "java", "windows": [{
                "start": "12:00", "end": "14:00", "timeZone": "UTC", "size": 3,
                "leadTime": "20m", **window}]}}


OBJECTS = [appdef_obj("java", "java", "2026-01-01T00:00:00Z"),  # min 1, max 3
           schedule("lecture"),
           schedule("bad-zone", timeZone="Atlantis/Capital", start="00:00", end="24:00"),
           schedule("too-big", size=4, start="00:00", end="24:00")]


def target(reader: Any) -> int:
    a = reader.appdef(NS, "java")
    assert isinstance(a, AppDefinition), a
    return int(a.min_instances)


def test_the_live_reader_applies_the_valid_schedules_at_its_clock() -> None:
    for now, want in ((BEFORE, 1), (IN_LEAD, 3), (AFTER, 1)):
        reader = LiveReader(Listed(OBJECTS), clock=lambda now=now: now)  # type: ignore[arg-type]
        assert target(reader) == want, now
    reader = LiveReader(Listed(OBJECTS), clock=lambda: IN_LEAD)  # type: ignore[arg-type]
    a = reader.appdef(NS, "java")
    assert isinstance(a, AppDefinition) and a.max_instances == 3


def test_the_cached_reader_applies_the_cached_schedules(
    make_cache: Callable[[Any], ClusterCache],
) -> None:
    cache = make_cache(Listed(OBJECTS))
    assert len(cache.schedules(NS)) == 3
    now = [BEFORE]
    reader = CachedReader(cache, None, clock=lambda: now[0])  # type: ignore[arg-type]
    assert target(reader) == 1
    now[0] = IN_LEAD
    assert target(reader) == 3
    now[0] = AFTER
    assert target(reader) == 1


def test_only_invalid_schedules_change_nothing() -> None:
    invalid = [OBJECTS[0], *OBJECTS[2:]]
    reader = LiveReader(Listed(invalid), clock=lambda: IN_LEAD)  # type: ignore[arg-type]
    assert target(reader) == 1
