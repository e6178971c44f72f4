"""Kubernetes-convention status conditions, computed without I/O.

Operators read a custom resource's state with `kubectl wait --for=condition=...`, dashboards
and alerts that look for `status.conditions[type=X].status`, and `observedGeneration` to tell
a status computed from the current spec from one left over from the previous spec. This is
the shape `metav1.Condition` has (type, status, reason, message, lastTransitionTime,
observedGeneration) and the rule apimachinery's `meta.SetStatusCondition` follows:
`lastTransitionTime` moves only when the status changes, so re-writing the same verdict every
pass changes nothing (and the caller, comparing, writes nothing).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["True", "False", "Unknown"]
#: A condition's reason is CamelCase, as the API conventions require (and the CRD checks).
_REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")
#: metav1.Condition's limit; a longer message is cut.
MESSAGE_LIMIT = 32768


@dataclass(frozen=True)
class Condition:
    """One verdict: `type` is true, false or unknown, for a `reason`, as `message` says."""

    type: str
    status: Status
    reason: str
    message: str = ""

    def __post_init__(self) -> None:
        if not _REASON.fullmatch(self.reason):
            raise ValueError(f"condition reason {self.reason!r} is not CamelCase")


def set_conditions(
    existing: object, wanted: Iterable[Condition], generation: int | None, now: str,
) -> list[dict[str, Any]]:
    """The `status.conditions` list after setting each of `wanted`, as of `generation`.

    `existing`: the list as read (anything: a status is an object anyone with patch on the
    status can write; what is not a list of conditions is dropped). A wanted condition
    whose status is unchanged keeps its lastTransitionTime; a new or changed one gets
    `now` (RFC 3339). Conditions of other types are kept, in their order; wanted ones of a
    new type are appended."""
    old = [c for c in existing if isinstance(c, Mapping) and isinstance(c.get("type"), str)] \
        if isinstance(existing, list) else []
    by_type = {c.type: c for c in wanted}
    out: list[dict[str, Any]] = []
    done: set[str] = set()
    for current in old:
        ctype = str(current["type"])
        if ctype in done:
            continue  # a duplicate type someone wrote: the first one stands
        done.add(ctype)
        cond = by_type.get(ctype)
        out.append(dict(current) if cond is None else _entry(cond, current, generation, now))
    out.extend(_entry(c, None, generation, now) for c in by_type.values() if c.type not in done)
    return out


def _entry(
    cond: Condition, current: Mapping[str, Any] | None, generation: int | None, now: str,
) -> dict[str, Any]:
    since = current.get("lastTransitionTime") if current is not None else None
    if current is None or current.get("status") != cond.status or not isinstance(since, str):
        since = now
    entry: dict[str, Any] = {"type": cond.type, "status": cond.status, "reason": cond.reason,
                             "message": cond.message[:MESSAGE_LIMIT],
                             "lastTransitionTime": since}
    if generation is not None:
        entry["observedGeneration"] = generation
    return entry


def find(conditions: object, ctype: str) -> Mapping[str, Any] | None:
    """The condition of `ctype` in a conditions list as read, or None."""
    if not isinstance(conditions, Sequence):
        return None
    return next((c for c in conditions
                 if isinstance(c, Mapping) and c.get("type") == ctype), None)
