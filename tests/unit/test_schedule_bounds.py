"""Issue #27, point 6: a PoolSchedule's windows are bounded (the CRD's maxItems and the
parser's MAX_WINDOWS) and `next_change` is one sweep: 200 windows took 6 s per call in the
leader. The work is measured by counting the local-time resolutions (`_instant`, the costly
step: a zoneinfo lookup per span end) and the target evaluations, never by a clock; the
results equal the old algorithm's on random schedules."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.pool_fixtures import appdef
from warmpool.pool import schedule
from warmpool.pool import vocabulary as v
from warmpool.pool.model import AppDefinition, Invalid
from warmpool.pool.schedule import (
    HORIZON,
    MAX_WINDOWS,
    PoolSchedule,
    effective_target,
    next_change,
    parse_schedule,
    schedule_status,
)

ROOT = Path(__file__).resolve().parents[2]
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata",
         "America/Santiago"]


def quadratic_next_change(
    appdef: AppDefinition, schedules: list[PoolSchedule], now: datetime,
    horizon: timedelta = HORIZON,
) -> datetime | None:
    """The algorithm `next_change` had before issue #27, kept as the reference: every edge,
    then the whole target again at each edge in order."""
    mine = [s for s in schedules if s.appdef == appdef.name]
    current = effective_target(appdef, mine, now)
    until = now + horizon
    edges: set[datetime] = set()
    for s in mine:
        for w in s.windows:
            today = schedule._local_date(w, now)
            for opens, closes in schedule._spans(w, today - timedelta(days=1),
                                                 today + timedelta(days=horizon.days + 2)):
                edges |= {t for t in (opens, closes) if now < t <= until}
    for edge in sorted(edges):
        if effective_target(appdef, mine, edge) != current:
            return edge
    return None


def hhmm(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}"


def random_window(rng: random.Random, max_size: int) -> dict[str, Any]:
    start = rng.randrange(0, 24 * 4) * 900
    end = rng.randrange(start // 900 + 1, 24 * 4 + 1) * 900
    raw: dict[str, Any] = {"start": hhmm(start), "end": "24:00" if end == 86400 else hhmm(end),
                           "timeZone": rng.choice(ZONES), "size": rng.randrange(0, max_size + 1)}
    if rng.random() < 0.6:
        raw["days"] = rng.sample(schedule.DAYS, rng.randrange(1, 8))
    if rng.random() < 0.5:
        raw["leadTime"] = rng.choice(["0s", "15m", "1h", "90m", "23h", "24h"])
    return raw


def schedule_obj(windows: list[dict[str, Any]], name: str = "s") -> dict[str, Any]:
    return {"apiVersion": v.SCHEDULE_API_VERSION, "kind": v.SCHEDULE_KIND,
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
            "spec": {"appDefinition": "java", "windows": windows}}


def parsed(windows: list[dict[str, Any]], ad: AppDefinition, name: str = "s") -> PoolSchedule:
    s = parse_schedule(schedule_obj(windows, name), ad)
    assert isinstance(s, PoolSchedule), s
    return s


@pytest.mark.parametrize("seed", range(40))
def test_the_sweep_agrees_with_the_old_algorithm_on_random_schedules(seed: int) -> None:
    rng = random.Random(seed)
    ad = appdef(min_instances=rng.randrange(0, 4), max_instances=rng.randrange(4, 12))
    schedules = [parsed([random_window(rng, ad.max_instances)
                         for _ in range(rng.randrange(1, 12))], ad, name=f"s{i}")
                 for i in range(rng.randrange(1, 4))]
    for _ in range(6):
        # Any instant of 2026, DST changes included, and the edges themselves.
        now = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randrange(365 * 86400))
        now -= timedelta(seconds=now.second % 900 if rng.random() < 0.5 else 0)
        assert next_change(ad, schedules, now) == quadratic_next_change(ad, schedules, now), now


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Counts of the local-time resolutions and of the target evaluations (per window)."""
    counts = {"instant": 0, "active": 0}
    instant, active = schedule._instant, schedule.active

    def counting_instant(*args: Any) -> datetime:
        counts["instant"] += 1
        return instant(*args)

    def counting_active(*args: Any) -> bool:
        counts["active"] += 1
        return active(*args)

    monkeypatch.setattr(schedule, "_instant", counting_instant)
    monkeypatch.setattr(schedule, "active", counting_active)
    yield counts


def many_windows(n: int, ad: AppDefinition) -> list[PoolSchedule]:
    """n windows of one schedule each (MAX_WINDOWS bounds one schedule, not their number),
    every day, staggered so that the target changes only at the last edge."""
    return [parsed([{"start": f"{(i % 23):02d}:{(i * 7) % 60:02d}", "end": "24:00",
                     "timeZone": ZONES[i % len(ZONES)], "size": 1}], ad, name=f"s{i}")
            for i in range(n)]


def test_next_change_is_linear_in_the_windows(counted: dict[str, int]) -> None:
    """Quadrupling the windows quadruples the work of the sweep; the old algorithm's grows
    more than tenfold (every edge asked every window again)."""
    ad = appdef(min_instances=1, max_instances=5)  # size 1 never moves the target: all edges
    now = datetime(2026, 3, 2, 10, tzinfo=UTC)
    work = {}
    for n in (20, 80):
        counted.update(instant=0, active=0)
        assert next_change(ad, many_windows(n, ad), now) is None
        work[n] = counted["instant"] + counted["active"]
        counted.update(instant=0, active=0)
        assert quadratic_next_change(ad, many_windows(n, ad), now) is None
        work[("old", n)] = counted["instant"] + counted["active"]
    assert work[80] == 4 * work[20], work  # each window resolved once per day of the horizon
    assert work[("old", 80)] > 10 * work[("old", 20)], work
    assert work[("old", 80)] > 50 * work[80], work


def test_a_schedule_over_the_bound_is_invalid_with_a_clear_status() -> None:
    ad = appdef(max_instances=10)
    windows = [{"start": "08:00", "end": "09:00", "timeZone": "UTC", "size": 3}]
    assert isinstance(parse_schedule(schedule_obj(windows * MAX_WINDOWS), ad), PoolSchedule)
    over = schedule_obj(windows * (MAX_WINDOWS + 1))
    parsed_over = parse_schedule(over, ad)
    assert isinstance(parsed_over, Invalid)
    assert parsed_over.message.startswith(f"spec.windows has {MAX_WINDOWS + 1} windows; "
                                          f"at most {MAX_WINDOWS} per PoolSchedule")
    status = schedule_status(over, ad, [over], datetime(2026, 3, 2, tzinfo=UTC))
    assert status["message"] == parsed_over.message
    days = schedule_obj([{**windows[0], "days": ["Mon"] * 8}])
    assert "at most 7" in getattr(parse_schedule(days, ad), "message", "")


@pytest.mark.parametrize("name", ["a/b", "Java", "", "x" * 254, 7])
def test_a_schedule_naming_no_possible_appdefinition_is_invalid(name: object) -> None:
    obj = schedule_obj([{"start": "08:00", "end": "09:00", "timeZone": "UTC", "size": 3}])
    obj["spec"]["appDefinition"] = name
    result = parse_schedule(obj)
    assert isinstance(result, Invalid)
    assert result.message.startswith("spec.appDefinition must name an AppDefinition")


def test_the_crd_bounds_the_windows_as_the_parser_does() -> None:
    for where in (ROOT / "warmpool" / "kube" / "crds", ROOT / "deploy" / "base" / "crds"):
        crd = yaml.safe_load((where / "poolschedules.yaml").read_text())
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        windows = spec["properties"]["windows"]
        assert windows["maxItems"] == MAX_WINDOWS
        assert windows["items"]["properties"]["days"]["maxItems"] == len(schedule.DAYS)
        assert spec["properties"]["appDefinition"]["maxLength"] == 253
