"""Scheduled pool sizes (issue #17, item 2): PoolSchedule windows and a pool's target. Pure.

A PoolSchedule (``warmpool.io/v1alpha1``, namespaced) names one AppDefinition and lists
windows; each window is a span of local time on some days of the week, in an IANA time
zone, with the pool size wanted inside it and a lead time:

    spec:
      appDefinition: java-17        # the AppDefinition's metadata.name
      windows:
        - days: [Mon, Wed]          # optional; default: every day
          start: "08:00"            # HH:MM or HH:MM:SS, local time of timeZone
          end: "10:00"              # after start, on the same day ("24:00" is midnight)
          timeZone: Europe/Berlin   # IANA name (zoneinfo)
          size: 40                  # >= 0, at most the AppDefinition's maxInstances
          leadTime: 10m             # optional: a duration "1h30m", "10m", "45s" (at most 24h)

A window is *active* from ``start - leadTime`` until ``end`` (half-open): the pool grows
ahead of the window, and shrinks only once it has ended. The pool's target (pool-spec §4) is

    min(maxInstances, max(spec.minInstances, sizes of the windows active now))

over every valid PoolSchedule of the AppDefinition; an invalid one changes nothing.

Local times are resolved with zoneinfo, day by day, so a window keeps its wall-clock times
across a DST change. A local time that does not exist (the hour skipped in spring) is read
with the offset before the change (02:30 becomes 03:30 summer time), as Python's `fold=0`
does; a repeated one (autumn) is its first occurrence. A window whose start so resolved is
not before its end is empty that day.
"""

from __future__ import annotations

import heapq
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo

from warmpool.pool.conditions import Condition, set_conditions
from warmpool.pool.grammar import object_name_error
from warmpool.pool.grammar import shown as _shown
from warmpool.pool.meta import namespace_of
from warmpool.pool.model import AppDefinition, Invalid

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")  # datetime.weekday() order
DAY_SECONDS = 24 * 3600
#: The longest lead time: a window's growth starts at most a day ahead of it.
MAX_LEAD_SECONDS = DAY_SECONDS
#: How far `next_change` looks ahead: a week repeats, plus a day for lead times and DST.
HORIZON = timedelta(days=8)
#: The most windows one PoolSchedule may list (the CRD's maxItems says the same): the leader
#: evaluates every window of every schedule at each boundary, so a schedule is bounded.
MAX_WINDOWS = 50
OK = "ok"

_TIME = re.compile(r"([0-9]{2}):([0-9]{2})(?::([0-9]{2}))?")
_DURATION = re.compile(r"(?:([0-9]{1,6})h)?(?:([0-9]{1,6})m)?(?:([0-9]{1,6})s)?")


@dataclass(frozen=True, slots=True)
class Window:
    days: frozenset[int]  # weekdays, 0 = Monday
    start: int  # seconds after local midnight
    end: int  # seconds after local midnight; start < end <= DAY_SECONDS
    zone: str  # an IANA name that zoneinfo knows
    size: int
    lead: int  # seconds


@dataclass(frozen=True, slots=True)
class PoolSchedule:
    name: str
    namespace: str
    uid: str
    appdef: str  # spec.appDefinition: the AppDefinition's metadata.name
    windows: tuple[Window, ...]


@lru_cache(maxsize=256)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _zone_error(name: object) -> str | None:
    if not isinstance(name, str) or not name:
        return f"must be an IANA time zone name such as 'Europe/Berlin', got {_shown(name)}"
    try:
        _zone(name)
    except Exception:  # ZoneInfoNotFoundError, ValueError (a path), IsADirectoryError, ...
        return f"{_shown(name)} is not a known IANA time zone"
    return None


def _clock_time(value: object, *, end: bool) -> int | str:
    """Seconds after midnight of "HH:MM[:SS]", or what is wrong with it."""
    if not isinstance(value, str) or not (m := _TIME.fullmatch(value)):
        return f"must be a time HH:MM or HH:MM:SS, got {_shown(value)}"
    h, mi, s = int(m[1]), int(m[2]), int(m[3] or 0)
    if end and (h, mi, s) == (24, 0, 0):
        return DAY_SECONDS
    if h > 23 or mi > 59 or s > 59:
        limit = "00:00 to 23:59:59, or 24:00" if end else "00:00 to 23:59:59"
        return f"must be a time of day ({limit}), got {_shown(value)}"
    return h * 3600 + mi * 60 + s


def parse_duration(value: object) -> int | str:
    """Seconds of a Go-like duration ("1h30m", "10m", "45s", "0s"), or what is wrong with it."""
    if isinstance(value, str) and value and (m := _DURATION.fullmatch(value)):
        return int(m[1] or 0) * 3600 + int(m[2] or 0) * 60 + int(m[3] or 0)
    return f"must be a duration such as '90s', '10m' or '1h30m', got {_shown(value)}"


def format_duration(seconds: int) -> str:
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return "".join(f"{n}{u}" for n, u in ((h, "h"), (m, "m"), (s, "s")) if n) or "0s"


def _hhmm(seconds: int) -> str:
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h:02d}:{m:02d}" + (f":{s:02d}" if s else "")


def _window(raw: object, where: str, appdef: AppDefinition | None) -> Window | Invalid:
    if not isinstance(raw, Mapping):
        return Invalid(f"{where} must be an object, got {_shown(raw)}")
    days_raw = raw.get("days")
    if days_raw is None:
        days = frozenset(range(7))
    elif not isinstance(days_raw, list) or not days_raw or len(days_raw) > len(DAYS):
        return Invalid(f"{where}.days must be a non-empty list of at most {len(DAYS)} of "
                       f"{', '.join(DAYS)} (omit it for every day), got {_shown(days_raw)}")
    else:
        found: set[int] = set()
        for i, day in enumerate(days_raw):
            if day not in DAYS:
                return Invalid(f"{where}.days[{i}] must be one of {', '.join(DAYS)}, "
                               f"got {_shown(day)}")
            found.add(DAYS.index(day))
        days = frozenset(found)
    start = _clock_time(raw.get("start"), end=False)
    if isinstance(start, str):
        return Invalid(f"{where}.start {start}")
    end = _clock_time(raw.get("end"), end=True)
    if isinstance(end, str):
        return Invalid(f"{where}.end {end}")
    if end <= start:
        return Invalid(f"{where}.end ({_hhmm(end % DAY_SECONDS)}) must be after its start "
                       f"({_hhmm(start)}): a window lies within one day (one that spans "
                       "midnight is two windows, the first ending at 24:00)")
    zone = raw.get("timeZone")
    if (error := _zone_error(zone)) is not None:
        return Invalid(f"{where}.timeZone {error}")
    assert isinstance(zone, str)
    size: object = raw.get("size")
    if isinstance(size, bool) or not isinstance(size, int):
        return Invalid(f"{where}.size must be an integer, got {_shown(size)}")
    if size < 0:
        return Invalid(f"{where}.size must be >= 0, got {size}")
    if appdef is not None and size > appdef.max_instances:
        return Invalid(f"{where}.size ({_shown(size)}) is above maxInstances "
                       f"({appdef.max_instances}) of AppDefinition {appdef.name!r}")
    lead_raw = raw.get("leadTime")
    lead = 0 if lead_raw is None else parse_duration(lead_raw)
    if isinstance(lead, str):
        return Invalid(f"{where}.leadTime {lead}")
    if lead > MAX_LEAD_SECONDS:
        return Invalid(f"{where}.leadTime ({_shown(lead_raw)}) must be at most 24h")
    return Window(days, start, end, zone, size, lead)


def parse_schedule(
    obj: Mapping[str, Any], appdef: AppDefinition | None = None
) -> PoolSchedule | Invalid:
    """Validate a PoolSchedule; never raises. With `appdef` (the AppDefinition it names, as
    parsed from its spec), each window's size is checked against its maxInstances too."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return Invalid("spec is missing" if spec is None
                       else f"spec must be an object, got {type(spec).__name__}")
    name = spec.get("appDefinition")
    if (error := object_name_error(name)) is not None:
        # Bounded by the object-name grammar: the name goes into the pool's work key.
        return Invalid("spec.appDefinition must name an AppDefinition (its metadata.name): "
                       f"it {error}")
    assert isinstance(name, str)
    if appdef is not None and appdef.name != name:
        return Invalid(f"spec.appDefinition is {name!r}, not {appdef.name!r}")
    raw_windows = spec.get("windows")
    if not isinstance(raw_windows, list) or not raw_windows:
        return Invalid(f"spec.windows must be a non-empty list, got {_shown(raw_windows)}")
    if len(raw_windows) > MAX_WINDOWS:
        return Invalid(f"spec.windows has {len(raw_windows)} windows; at most {MAX_WINDOWS} "
                       "per PoolSchedule (use several schedules, or fewer, longer windows)")
    windows: list[Window] = []
    for i, raw in enumerate(raw_windows):
        w = _window(raw, f"spec.windows[{i}]", appdef)
        if isinstance(w, Invalid):
            return w
        windows.append(w)
    return PoolSchedule(
        name=str(meta.get("name") or ""), namespace=str(meta.get("namespace") or ""),
        uid=str(meta.get("uid") or ""), appdef=name, windows=tuple(windows))


# --- time -----------------------------------------------------------------------------------


def _instant(day: date, seconds: int, zone: ZoneInfo) -> datetime:
    """The UTC instant of local time `seconds` after midnight of `day` in `zone` (fold=0)."""
    wall = datetime(day.year, day.month, day.day, tzinfo=zone) + timedelta(seconds=seconds)
    return wall.astimezone(UTC)  # aware + timedelta is wall-clock arithmetic in Python


def _utc(now: datetime) -> datetime:
    if now.tzinfo is None:
        raise ValueError("a schedule needs an aware datetime (UTC), got a naive one")
    return now.astimezone(UTC)


def _spans(window: Window, first: date, last: date) -> Iterator[tuple[datetime, datetime]]:
    """(active from, active until) of the window on each of its days from `first` to `last`
    (local dates), lead time included; empty days (a start skipped by DST) left out."""
    zone = _zone(window.zone)
    day = first
    while day <= last:
        if day.weekday() in window.days:
            opens = _instant(day, window.start, zone)
            closes = _instant(day, window.end, zone)
            if opens < closes:
                yield opens - timedelta(seconds=window.lead), closes
        day += timedelta(days=1)


def _local_date(window: Window, now: datetime) -> date:
    return now.astimezone(_zone(window.zone)).date()


def active(window: Window, now: datetime) -> bool:
    """Whether the window counts at `now` (aware): from its start minus the lead time until
    its end."""
    now = _utc(now)
    today = _local_date(window, now)
    # A span ends by the midnight after its day and opens at most a day (the longest lead)
    # and a DST hour before its day: only these days can hold `now`.
    return any(opens <= now < closes for opens, closes in _spans(
        window, today - timedelta(days=1), today + timedelta(days=2)))


def _mine(appdef: AppDefinition, schedules: Iterable[PoolSchedule]) -> list[PoolSchedule]:
    return [s for s in schedules
            if s.appdef == appdef.name and s.namespace in ("", appdef.namespace)]


def effective_target(
    appdef: AppDefinition, schedules: Iterable[PoolSchedule], now: datetime
) -> int:
    """min(maxInstances, max(spec.minInstances, sizes of the windows active at `now`)).

    `appdef` as parsed from its spec (its min_instances is spec.minInstances); `schedules`:
    valid ones (those of other AppDefinitions are ignored)."""
    sizes = [w.size for s in _mine(appdef, schedules) for w in s.windows if active(w, now)]
    return min(appdef.max_instances, max([appdef.min_instances, *sizes]))


def next_change(
    appdef: AppDefinition, schedules: Iterable[PoolSchedule], now: datetime,
    horizon: timedelta = HORIZON,
) -> datetime | None:
    """The next instant after `now` at which the target changes, or None if it does not
    within `horizon` (no window would change it, or none applies).

    One sweep over the windows' spans in time order, O(S log S) for S spans (S = windows x
    days in the horizon): each span is resolved once, and the sizes active at each edge are
    kept in a count with a max-heap of them, instead of asking every window again at every
    edge (which was O(S x windows): 200 windows took 6 s per call, in the leader).
    """
    mine = _mine(appdef, schedules)
    now = _utc(now)
    until = now + horizon
    active_sizes: Counter[int] = Counter()
    edges: list[tuple[datetime, int, int]] = []  # (instant, +1 opens / -1 closes, size)
    for s in mine:
        for w in s.windows:
            today = _local_date(w, now)
            # The days whose spans can hold an instant in [now, until] (see `active`).
            for opens, closes in _spans(w, today - timedelta(days=1),
                                        today + timedelta(days=horizon.days + 2)):
                if opens <= now < closes:
                    active_sizes[w.size] += 1
                for t, change in ((opens, 1), (closes, -1)):
                    if now < t <= until:
                        edges.append((t, change, w.size))
    heap = [-size for size in active_sizes]
    heapq.heapify(heap)

    def target() -> int:
        while heap and active_sizes[-heap[0]] <= 0:  # sizes no span holds any more
            heapq.heappop(heap)
        largest = -heap[0] if heap else 0
        return min(appdef.max_instances, max(appdef.min_instances, largest))

    current = target()
    edges.sort(key=lambda e: e[0])
    i = 0
    while i < len(edges):
        t = edges[i][0]
        while i < len(edges) and edges[i][0] == t:  # every span that opens or closes at t
            _, change, size = edges[i]
            active_sizes[size] += change
            if change > 0 and active_sizes[size] == 1:
                heapq.heappush(heap, -size)
            i += 1
        if target() != current:
            return t
    return None


def valid_schedules(
    appdef: AppDefinition, objects: Iterable[Mapping[str, Any]]
) -> list[PoolSchedule]:
    """The PoolSchedule objects (of any AppDefinition) that name `appdef` and are valid."""
    out: list[PoolSchedule] = []
    for obj in objects:
        spec = obj.get("spec")
        if not isinstance(spec, Mapping) or spec.get("appDefinition") != appdef.name:
            continue
        if namespace_of(obj) not in ("", appdef.namespace):
            continue
        parsed = parse_schedule(obj, appdef)
        if isinstance(parsed, PoolSchedule):
            out.append(parsed)
    return out


def scheduled(
    appdef: AppDefinition, objects: Iterable[Mapping[str, Any]], now: datetime
) -> AppDefinition:
    """`appdef` (as parsed from its spec) with min_instances replaced by its target at `now`:
    what the readers hand the decisions, so everything that sizes the pool obeys it."""
    target = effective_target(appdef, valid_schedules(appdef, objects), now)
    return appdef if target == appdef.min_instances else replace(appdef, min_instances=target)


def rfc3339(when: datetime | None) -> str | None:
    return None if when is None else _utc(when).strftime("%Y-%m-%dT%H:%M:%SZ")


#: The conditions a PoolSchedule's status carries (`warmpool.pool.conditions`).
COND_VALID = "Valid"    # the schedule counts: its spec and its AppDefinition are valid
COND_ACTIVE = "Active"  # one of its windows raises the pool's target now


def schedule_status(
    obj: Mapping[str, Any], appdef: AppDefinition | Invalid | None,
    objects: Iterable[Mapping[str, Any]], now: datetime,
) -> dict[str, Any]:
    """The status a PoolSchedule should show: the named AppDefinition's `effectiveTarget`
    and `nextChange` (RFC 3339, null if none ahead) over all its valid schedules, and
    `message`: "ok", or why this schedule is invalid (it then counts for nothing).

    And the same verdict as an operator's tools read it: `conditions` (`Valid`, `Active`)
    and `observedGeneration`, the spec's generation it was computed from (a status whose
    generation is behind the object's was computed from an older spec)."""
    spec = obj.get("spec")
    name = spec.get("appDefinition") if isinstance(spec, Mapping) else None
    meta = obj.get("metadata")
    generation = meta.get("generation") if isinstance(meta, Mapping) else None
    generation = generation if isinstance(generation, int) else None
    previous = obj.get("status")
    existing = previous.get("conditions") if isinstance(previous, Mapping) else None
    when = rfc3339(now) or ""

    def verdict(fields: dict[str, Any], *conds: Condition) -> dict[str, Any]:
        observed = {} if generation is None else {"observedGeneration": generation}
        return {**fields, **observed,
                "conditions": set_conditions(existing, conds, generation, when)}

    if not isinstance(appdef, AppDefinition):
        parsed = parse_schedule(obj)
        if isinstance(parsed, Invalid):
            message, reason = parsed.message, "InvalidSpec"
        elif appdef is None:
            message = f"AppDefinition {name!r} does not exist in this namespace"
            reason = "AppDefinitionNotFound"
        else:
            message = f"AppDefinition {name!r} is invalid and left as it is: {appdef.message}"
            reason = "AppDefinitionInvalid"
        return verdict({"effectiveTarget": None, "nextChange": None, "message": message},
                       Condition(COND_VALID, "False", reason, message),
                       Condition(COND_ACTIVE, "False", "NotValid", "an invalid schedule "
                                 "changes no pool size"))
    parsed = parse_schedule(obj, appdef)
    mine = valid_schedules(appdef, objects)
    target = effective_target(appdef, mine, now)
    fields = {"effectiveTarget": target, "nextChange": rfc3339(next_change(appdef, mine, now)),
              "message": parsed.message if isinstance(parsed, Invalid) else OK}
    if isinstance(parsed, Invalid):
        return verdict(fields, Condition(COND_VALID, "False", "InvalidSpec", parsed.message),
                       Condition(COND_ACTIVE, "False", "NotValid", "an invalid schedule "
                                 "changes no pool size"))
    open_now = [w for w in parsed.windows if active(w, now)]
    if open_now:
        size = max(w.size for w in open_now)
        active_cond = Condition(COND_ACTIVE, "True", "WindowOpen",
                                f"a window asks for {size} instance(s); the pool's target "
                                f"is {target}")
    else:
        active_cond = Condition(COND_ACTIVE, "False", "NoWindowOpen",
                                f"no window of this schedule is open; the pool's target "
                                f"is {target}")
    return verdict(fields, Condition(COND_VALID, "True", "Valid", OK), active_cond)


@dataclass(frozen=True, slots=True)
class Timetable:
    """What a pool's job does with its PoolSchedules at `now`: the status each schedule
    should show (`statuses`: (schedule object, status), only those that name the pool) and
    the next instant its target changes (None: none within the horizon)."""

    statuses: tuple[tuple[Mapping[str, Any], dict[str, Any]], ...]
    next_change: datetime | None


def timetable(
    name: str, appdef: AppDefinition | Invalid | None, objects: Iterable[Mapping[str, Any]],
    now: datetime,
) -> Timetable:
    """The schedules of the AppDefinition `name` (`appdef` as parsed from its spec, its
    min_instances spec.minInstances; Invalid or None: no target, every schedule says why)."""
    objects = list(objects)
    mine = [obj for obj in objects if _names(obj) == name]
    edge = (next_change(appdef, valid_schedules(appdef, objects), now)
            if isinstance(appdef, AppDefinition) and mine else None)
    return Timetable(tuple((obj, schedule_status(obj, appdef, objects, now)) for obj in mine),
                     edge)


def _names(obj: Mapping[str, Any]) -> str | None:
    spec = obj.get("spec")
    name = spec.get("appDefinition") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) else None
