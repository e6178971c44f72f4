"""The fence annotation (`warmpool.io/fence`) read as a bounded grammar. Pure: no I/O.

Every write warmpool makes stamps the lease's fence on the object; a job that finds a fence
above its own stops and lifts the shared Redis counter past it (`warmpool.kube.executor.
check_fence`). But the annotation is on objects anyone with `patch` can write (or a tool that
copies annotations), so what is read there is not trusted:

* the grammar is `0 | [1-9][0-9]{0,18}`, ASCII digits only (`str.isdigit` also takes '²' and
  other digits `int()` refuses), no sign, no leading zero, no space, at most 19 digits (so
  `int()` never meets a 5,000-digit string), and at most `FENCE_MAX` (2^63 - 1, what Redis's
  INCR can hold);
* a lift never sets the counter above `FENCE_CEILING` (10^18 - 1): INCR then has more than
  8 * 10^18 increments left before int64 overflows, i.e. it never does;
* a fence above `FENCE_CEILING` counts only when it is not above ours: our counter passes the
  ceiling only by INCRs after a lift to it, so such a fence can be one we issued, but one
  above ours could never be passed by any lift;

anything else is *foreign*: ignored for the fence decision (the instance is neither refused
nor does it lift the counter; our next write of that object replaces the value) and reported
with a Warning event on the object that carries it, naming the field. A foreign value thus
affects at most its own instance, never the counter that every key of the Redis shares.

A valid fence far above ours (`LARGE_LIFT`) is legal (Redis lost a counter that had run that
far) but is also how a hand-written value would look: it is lifted and reported, so an
operator sees it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from warmpool.pool import vocabulary as v
from warmpool.pool.actions import Report
from warmpool.pool.instances import InstanceView
from warmpool.pool.meta import annotations_of, name_of
from warmpool.pool.parts import Part

#: The highest fence Redis can hold (a signed 64-bit integer): nothing above is a fence.
FENCE_MAX = 2**63 - 1
#: The highest value a lift may set the counter to (`lift_fence.lua` caps there too).
FENCE_CEILING = 10**18 - 1
#: A lift by more than this is reported as well as logged.
LARGE_LIFT = 10**9
#: Where the fence lives on an object, as a Warning event names it.
FENCE_FIELD = f"metadata.annotations[{v.ANNOTATION_FENCE}]"

_GRAMMAR = re.compile(r"0|[1-9][0-9]{0,18}")  # ASCII only: [0-9] is not \d
_SHOWN = 40  # characters of a foreign value quoted in an event


def parse_fence(raw: object) -> int | None:
    """The fence `raw` spells, or None when it is not one (see the module's grammar)."""
    if not isinstance(raw, str) or _GRAMMAR.fullmatch(raw) is None:
        return None
    value = int(raw)  # at most 19 ASCII digits: exact and cheap
    return value if value <= FENCE_MAX else None


@dataclass(frozen=True, slots=True)
class ForeignFence:
    """A fence annotation warmpool cannot have written, on one object of the instance."""

    part: Part
    name: str
    raw: str
    why: str


@dataclass(frozen=True, slots=True)
class FenceReading:
    """What an instance's objects say about fences, for a holder of fence `ours`."""

    seen: int  # the highest valid fence (0: none)
    carrier: tuple[Part, str] | None  # (part, name) of the object that carries `seen`
    foreign: tuple[ForeignFence, ...]


def read_fences(view: InstanceView, ours: int) -> FenceReading:
    """Every fence annotation of the instance, sorted into the highest valid one and the
    foreign ones (the module's rules), for a holder whose fence is `ours`."""
    seen, carrier = 0, None
    foreign: list[ForeignFence] = []
    for part, obj in view.existing():
        annotations: Mapping[str, object] = annotations_of(obj)
        if v.ANNOTATION_FENCE not in annotations:
            continue
        raw = annotations[v.ANNOTATION_FENCE]
        value = parse_fence(raw)
        if value is None:
            foreign.append(ForeignFence(part, name_of(obj), str(raw),
                                        "not a fence (ASCII digits, no sign, at most 19)"))
        elif value > FENCE_CEILING and value > ours:
            foreign.append(ForeignFence(part, name_of(obj), str(raw),
                                        f"above {FENCE_CEILING}, which no lift can reach"))
        elif value > seen:
            seen, carrier = value, (part, name_of(obj))
    return FenceReading(seen, carrier, tuple(foreign))


def _shown(raw: str) -> str:
    return repr(raw) if len(raw) <= _SHOWN else f"{raw[:_SHOWN]!r}... ({len(raw)} chars)"


def fence_reports(instance: int, reading: FenceReading, ours: int) -> list[Report]:
    """The Warning events `reading` calls for: one per foreign value (on its object, naming
    the field), and one for a lift far above `ours` (on the object that carries it)."""
    reports = [
        Report("ForeignFence",
               f"{f.part.kind} {f.name}: its {FENCE_FIELD} {_shown(f.raw)} is {f.why}: "
               f"ignored for the fence check of instance {instance} (neither refused nor "
               "lifting the shared counter); warmpool's next write of it replaces the value",
               regarding={"apiVersion": f.part.api_version, "kind": f.part.kind,
                          "name": f.name})
        for f in reading.foreign
    ]
    if reading.carrier is not None and reading.seen - ours > LARGE_LIFT:
        part, name = reading.carrier
        reports.append(Report(
            "FenceLifted",
            f"{part.kind} {name}: its {FENCE_FIELD} {reading.seen} is far above the fence of "
            f"this run ({ours}): the shared fence counter is lifted to it. Expected once after "
            "Redis lost its data; otherwise someone wrote this value by hand",
            regarding={"apiVersion": part.api_version, "kind": part.kind, "name": name}))
    return reports
