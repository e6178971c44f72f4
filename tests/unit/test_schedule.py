"""PoolSchedule windows and the effective pool target (warmpool.pool.schedule), on fixed
clocks: no wall time is read anywhere here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.unit.pool_fixtures import appdef
from warmpool.pool import vocabulary as v
from warmpool.pool.model import Invalid
from warmpool.pool.schedule import (
    PoolSchedule,
    active,
    effective_target,
    format_duration,
    next_change,
    parse_duration,
    parse_schedule,
    schedule_status,
    scheduled,
)

# Monday 2 March 2026, 10:00 UTC (Berlin: 11:00, winter time).
MONDAY = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


def window(**kw: Any) -> dict[str, Any]:
    return {"start": "12:00", "end": "14:00", "timeZone": "UTC", "size": 8, **kw}


def schedule_obj(*windows: dict[str, Any], name: str = "lecture", appdef_name: str = "java",
                 ) -> dict[str, Any]:
    return {"apiVersion": v.SCHEDULE_API_VERSION, "kind": v.SCHEDULE_KIND,
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
            "spec": {"appDefinition": appdef_name, "windows": list(windows)}}


def parsed(*windows: dict[str, Any], **kw: Any) -> PoolSchedule:
    s = parse_schedule(schedule_obj(*windows, **kw), appdef())
    assert isinstance(s, PoolSchedule), s
    return s


def at(hour: int, minute: int = 0, second: int = 0, day: int = 2) -> datetime:
    return datetime(2026, 3, day, hour, minute, second, tzinfo=UTC)


# --- parsing ----------------------------------------------------------------------------------


def test_a_window_parses_with_its_defaults() -> None:
    (w,) = parsed(window()).windows
    assert w.days == frozenset(range(7)) and (w.start, w.end) == (12 * 3600, 14 * 3600)
    assert (w.zone, w.size, w.lead) == ("UTC", 8, 0)
    (w,) = parsed(window(days=["Mon", "Fri"], start="08:15:30", end="24:00",
                         leadTime="1h30m")).windows
    assert w.days == {0, 4} and w.start == 8 * 3600 + 15 * 60 + 30 and w.end == 24 * 3600
    assert w.lead == 5400


@pytest.mark.parametrize(("bad", "message"), [
    ({"timeZone": "Mars/Olympus_Mons"}, "spec.windows[0].timeZone 'Mars/Olympus_Mons' is not a "
                                        "known IANA time zone"),
    ({"timeZone": "../../etc/passwd"}, "is not a known IANA time zone"),
    ({"timeZone": ""}, "spec.windows[0].timeZone must be an IANA time zone name"),
    ({"end": "12:00"}, "spec.windows[0].end (12:00) must be after its start (12:00)"),
    ({"start": "22:00", "end": "02:00"}, "must be after its start (22:00)"),
    ({"days": ["Mon", "Funday"]}, "spec.windows[0].days[1] must be one of Mon, Tue, Wed, Thu, "
                                  "Fri, Sat, Sun, got 'Funday'"),
    ({"days": []}, "spec.windows[0].days must be a non-empty list"),
    ({"size": 11}, "spec.windows[0].size (11) is above maxInstances (10) of AppDefinition "
                   "'java'"),
    ({"size": -1}, "spec.windows[0].size must be >= 0, got -1"),
    ({"size": "10"}, "spec.windows[0].size must be an integer, got '10'"),
    ({"size": True}, "spec.windows[0].size must be an integer"),
    ({"size": 10 ** 5000}, "an integer of about"),
    ({"start": "25:00"}, "spec.windows[0].start must be a time of day (00:00 to 23:59:59)"),
    ({"start": "24:00"}, "spec.windows[0].start must be a time of day"),
    ({"end": "9:00"}, "spec.windows[0].end must be a time HH:MM or HH:MM:SS, got '9:00'"),
    ({"leadTime": "10 minutes"}, "spec.windows[0].leadTime must be a duration such as '90s'"),
    ({"leadTime": 600}, "spec.windows[0].leadTime must be a duration"),
    ({"leadTime": "25h"}, "spec.windows[0].leadTime ('25h') must be at most 24h"),
])
def test_an_invalid_window_says_precisely_why(bad: dict[str, Any], message: str) -> None:
    got = parse_schedule(schedule_obj(window(**bad)), appdef())
    assert isinstance(got, Invalid)
    assert message in got.message


@pytest.mark.parametrize(("obj", "message"), [
    ({"metadata": {}}, "spec is missing"),
    ({"spec": []}, "spec must be an object, got list"),
    ({"spec": {"windows": [window()]}}, "spec.appDefinition must name an AppDefinition"),
    ({"spec": {"appDefinition": "java"}}, "spec.windows must be a non-empty list, got None"),
    ({"spec": {"appDefinition": "java", "windows": []}}, "spec.windows must be a non-empty"),
    ({"spec": {"appDefinition": "java", "windows": [window(), "x"]}},
     "spec.windows[1] must be an object"),
])
def test_an_invalid_schedule_never_raises(obj: dict[str, Any], message: str) -> None:
    got = parse_schedule(obj, appdef())
    assert isinstance(got, Invalid) and message in got.message


def test_the_size_is_checked_against_max_only_with_the_appdefinition() -> None:
    assert isinstance(parse_schedule(schedule_obj(window(size=50))), PoolSchedule)
    assert isinstance(parse_schedule(schedule_obj(window(size=50)), appdef()), Invalid)
    other = parse_schedule(schedule_obj(window(), appdef_name="python"), appdef())
    assert isinstance(other, Invalid) and "not 'java'" in other.message


def test_durations() -> None:
    assert [parse_duration(d) for d in ("0s", "45s", "10m", "1h", "1h30m", "2h0m5s")] == [
        0, 45, 600, 3600, 5400, 7205]
    assert all(isinstance(parse_duration(d), str) for d in ("", "h", "10", "1m1h", " 1m", 5))
    assert [format_duration(s) for s in (0, 45, 600, 5400, 7205)] == [
        "0s", "45s", "10m", "1h30m", "2h5s"]


# --- active and the target -------------------------------------------------------------------


def test_active_from_start_minus_lead_until_end() -> None:
    (w,) = parsed(window(leadTime="20m")).windows
    assert not active(w, at(11, 39, 59))
    assert active(w, at(11, 40))  # the lead: growth starts here
    assert active(w, at(13, 59, 59))
    assert not active(w, at(14, 0))  # half-open: the end is outside
    with pytest.raises(ValueError, match="aware"):
        active(w, datetime(2026, 3, 2, 12, 0))


def test_days_of_the_week_are_local_days_and_a_lead_may_reach_into_the_day_before() -> None:
    # 00:10-01:00 on Tuesdays in Berlin (UTC+1), led by 20 minutes: Monday 22:50 UTC.
    (w,) = parsed(window(days=["Tue"], start="00:10", end="01:00", timeZone="Europe/Berlin",
                         leadTime="20m")).windows
    assert not active(w, at(22, 49))
    assert active(w, at(22, 50))  # Monday in UTC and in Berlin: Tuesday's window leads
    assert active(w, at(23, 59, day=2))
    assert not active(w, at(0, 0, day=3))  # 01:00 Berlin on Tuesday: ended
    assert not active(w, at(22, 50, day=3))  # Wednesday's lead: no window on Wednesday


def test_effective_target_is_capped_and_never_below_min() -> None:
    a = appdef(min_instances=2, max_instances=10)
    s = [parsed(window(size=8)), parsed(window(start="13:00", end="15:00", size=5), name="b"),
         parsed(window(size=1), name="small")]
    assert effective_target(a, s, at(11)) == 2
    assert effective_target(a, s, at(12)) == 8
    assert effective_target(a, s, at(14)) == 5  # only b's window is left
    assert effective_target(a, s, at(15)) == 2
    # A schedule written for a larger AppDefinition: the target stops at maxInstances.
    big = parse_schedule(schedule_obj(window(size=50)))
    assert isinstance(big, PoolSchedule)
    assert effective_target(a, [big], at(12)) == 10
    # Schedules of other AppDefinitions do not count.
    other = parse_schedule(schedule_obj(window(size=9), appdef_name="python"))
    assert isinstance(other, PoolSchedule)
    assert effective_target(a, [other], at(12)) == 2


def test_scheduled_replaces_min_with_the_target_and_invalid_schedules_change_nothing() -> None:
    a = appdef(min_instances=2, max_instances=10)
    objs = [schedule_obj(window(size=6)),
            schedule_obj(window(size=9, timeZone="Nowhere/Land"), name="bad"),
            schedule_obj(window(size=11), name="too-big")]
    assert scheduled(a, objs, at(12)).min_instances == 6
    assert scheduled(a, objs, at(12)).max_instances == 10
    assert scheduled(a, objs, at(11)) is a
    assert scheduled(a, objs[1:], at(12)) is a


# --- next change -----------------------------------------------------------------------------


def test_next_change_is_the_lead_then_the_end_and_none_without_effect() -> None:
    a = appdef(min_instances=2)
    s = [parsed(window(leadTime="20m"))]
    assert next_change(a, s, at(10)) == at(11, 40)
    assert next_change(a, s, at(11, 40)) == at(14)
    assert next_change(a, s, at(14)) == at(11, 40, day=3)  # tomorrow's (every day)
    # A window no larger than minInstances never changes the target.
    assert next_change(appdef(min_instances=8), s, at(10)) is None
    assert next_change(a, [], at(10)) is None


def test_next_change_skips_boundaries_that_change_nothing() -> None:
    a = appdef(min_instances=2)
    s = [parsed(window(size=8)), parsed(window(start="13:00", end="13:30", size=4), name="b")]
    # 13:00 and 13:30 are boundaries of b, but 8 holds from 12:00 to 14:00.
    assert next_change(a, s, at(12)) == at(14)


def test_next_change_on_weekdays_only() -> None:
    a = appdef(min_instances=0)
    s = [parsed(window(days=["Mon"], start="09:00", end="10:00", size=3))]
    assert next_change(a, s, at(10)) == datetime(2026, 3, 9, 9, 0, tzinfo=UTC)


# --- daylight saving time -------------------------------------------------------------------


def test_windows_keep_local_times_across_dst_changes() -> None:
    a = appdef(min_instances=0)
    s = [parsed(window(start="08:00", end="09:00", timeZone="Europe/Berlin", size=3))]
    # Saturday 28 March: winter time (UTC+1); Monday 30 March: summer time (UTC+2).
    assert next_change(a, s, datetime(2026, 3, 28, 0, 0, tzinfo=UTC)) == datetime(
        2026, 3, 28, 7, 0, tzinfo=UTC)
    assert next_change(a, s, datetime(2026, 3, 30, 0, 0, tzinfo=UTC)) == datetime(
        2026, 3, 30, 6, 0, tzinfo=UTC)
    # Autumn, 25 October: back to UTC+1.
    assert next_change(a, s, datetime(2026, 10, 25, 0, 0, tzinfo=UTC)) == datetime(
        2026, 10, 25, 7, 0, tzinfo=UTC)


def test_a_skipped_local_time_reads_with_the_offset_before_the_change() -> None:
    # 29 March 2026 in Berlin: 02:00 -> 03:00. A 02:30 start is read as 01:30 UTC (03:30
    # summer time); the window ends at 04:00 summer time (02:00 UTC).
    (w,) = parsed(window(start="02:30", end="04:00", timeZone="Europe/Berlin",
                         days=["Sun"])).windows
    assert not active(w, datetime(2026, 3, 29, 1, 29, tzinfo=UTC))
    assert active(w, datetime(2026, 3, 29, 1, 30, tzinfo=UTC))
    assert not active(w, datetime(2026, 3, 29, 2, 0, tzinfo=UTC))
    # Inside the skipped hour only, the window is empty that day.
    (gap,) = parsed(window(start="02:30", end="03:00", timeZone="Europe/Berlin",
                           days=["Sun"])).windows
    day = datetime(2026, 3, 29, tzinfo=UTC)
    assert not any(active(gap, day + timedelta(minutes=m)) for m in range(0, 240, 5))


def test_a_repeated_local_time_is_its_first_occurrence_and_the_long_day_is_longer() -> None:
    # 25 October 2026 in Berlin: 03:00 summer time -> 02:00 winter time.
    (w,) = parsed(window(start="00:00", end="24:00", timeZone="Europe/Berlin",
                         days=["Sun"])).windows
    assert active(w, datetime(2026, 10, 24, 22, 0, tzinfo=UTC))  # 00:00 summer time
    assert active(w, datetime(2026, 10, 25, 22, 59, tzinfo=UTC))  # 23:59 winter time
    assert not active(w, datetime(2026, 10, 25, 23, 0, tzinfo=UTC))  # 25 hours in all
    (early,) = parsed(window(start="02:30", end="02:45", timeZone="Europe/Berlin",
                             days=["Sun"])).windows
    assert active(early, datetime(2026, 10, 25, 0, 30, tzinfo=UTC))  # first 02:30 (UTC+2)
    assert not active(early, datetime(2026, 10, 25, 1, 30, tzinfo=UTC))  # the second one


# --- status ----------------------------------------------------------------------------------


def _fields(status: dict[str, Any]) -> dict[str, Any]:
    """The status without its conditions (tested on their own below)."""
    return {k: val for k, val in status.items()
            if k not in ("conditions", "observedGeneration")}


def _conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_status_of_valid_and_invalid_schedules() -> None:
    a = appdef(min_instances=2)
    good = schedule_obj(window(leadTime="20m"))
    bad = schedule_obj(window(size=9, end="11:00"), name="bad")
    objs = [good, bad]
    assert _fields(schedule_status(good, a, objs, at(10))) == {
        "effectiveTarget": 2, "nextChange": "2026-03-02T11:40:00Z", "message": "ok"}
    got = schedule_status(bad, a, objs, at(12))
    assert got["effectiveTarget"] == 8 and got["nextChange"] == "2026-03-02T14:00:00Z"
    assert got["message"].startswith("spec.windows[0].end (11:00) must be after its start")
    missing = schedule_status(good, None, objs, at(10))
    assert _fields(missing) == {
        "effectiveTarget": None, "nextChange": None,
        "message": "AppDefinition 'java' does not exist in this namespace"}
    assert "is invalid" in schedule_status(good, Invalid("spec.port ..."), objs, at(10))[
        "message"]


def test_status_conditions_say_valid_and_active_with_the_generation_read() -> None:
    a = appdef(min_instances=2)
    good = schedule_obj(window(leadTime="20m"))
    good["metadata"]["generation"] = 3
    before = schedule_status(good, a, [good], at(9))
    assert before["observedGeneration"] == 3
    assert _conditions(before) == {"Valid": ("True", "Valid"),
                                   "Active": ("False", "NoWindowOpen")}
    assert all(c["observedGeneration"] == 3 for c in before["conditions"])
    assert all(c["lastTransitionTime"] == "2026-03-02T09:00:00Z" for c in before["conditions"])
    # Read back with that status: in the window, Active turns (and only its time moves).
    good["status"] = before
    during = schedule_status(good, a, [good], at(12, 30))
    assert _conditions(during)["Active"] == ("True", "WindowOpen")
    times = {c["type"]: c["lastTransitionTime"] for c in during["conditions"]}
    assert times == {"Valid": "2026-03-02T09:00:00Z", "Active": "2026-03-02T12:30:00Z"}

    bad = schedule_obj(window(size=9, end="11:00"), name="bad")
    assert _conditions(schedule_status(bad, a, [bad], at(12))) == {
        "Valid": ("False", "InvalidSpec"), "Active": ("False", "NotValid")}
    assert _conditions(schedule_status(good, None, [good], at(10)))["Valid"] == (
        "False", "AppDefinitionNotFound")
    assert _conditions(schedule_status(good, Invalid("spec.port ..."), [good], at(10)))[
        "Valid"] == ("False", "AppDefinitionInvalid")
