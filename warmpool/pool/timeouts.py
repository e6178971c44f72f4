"""When a Session's time is up: the two limits of session-lifecycle §5, as pure decisions.

- The **hard limit** (§5.1): AppDefinition ``spec.timeout`` minutes from the Session's
  creation, for every Session not already being deleted, whatever its status. The minutes are
  whole minutes, truncated (Java's ``ChronoUnit.MINUTES.between``), and the Session is due when
  they are *above* the limit: deletion comes between timeout+1 and timeout+2 minutes after
  creation. No AppDefinition, no value, 0 or a negative value: no limit.
- The **activity tracker** (§5.2): for HANDLED Sessions whose AppDefinition has a
  ``spec.monitor.activityTracker`` block with ``timeoutAfter > 0`` (Java reads an omitted one as
  0 and deletes every HANDLED Session at once; here ``<= 0`` disables it) and a monitor port.
  ``m = floor((now - lastActivity) / 1 min)``: a popup while ``notifyAfter <= m < timeoutAfter``,
  and at ``m >= timeoutAfter`` the timeout message, then the deletion.

Choices where Java's behaviour is an accident of its types (each one documented in its place):
an omitted ``notifyAfter`` means no popup (Java reads 0: a popup every minute from the start);
an unset ``lastActivity`` starts the count now (Java reads 0: deleted at once); a reported value
past ``now`` counts as ``now`` (a monitor with a fast clock must not keep a Session forever).

Everything here takes ``now`` (epoch seconds) and returns plain data; the runner
(``warmpool.controller.timeouts``) reads the cluster, asks the monitor and carries it out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from warmpool.pool import vocabulary as v
from warmpool.pool.model import ActivityTracker, Lifetime, Session

MINUTE_MS = 60_000

#: Event reasons (Normal events on the Session, written right before its deletion).
REASON_TIMED_OUT = "SessionTimedOut"
REASON_INACTIVE = "SessionInactive"

#: The monitor message's fixed parts (EC:`OP/messaging/MonitorMessagingServiceImpl.java`).
TIMEOUT_MESSAGE = "Your session has timed out!"


@dataclass(frozen=True, slots=True)
class WriteLastActivity:
    """Raise ``status.lastActivity`` to `value` (epoch ms), if the Session still has its uid."""

    value: int


@dataclass(frozen=True, slots=True)
class Popup:
    """``POST /monitor/activity/popup``: the IDE asks its user whether they are still there."""


@dataclass(frozen=True, slots=True)
class PostMessage:
    """``POST /monitor/message`` with `body`, the exact JSON text Java sends."""

    body: str


@dataclass(frozen=True, slots=True)
class DeleteSession:
    """Delete the Session (uid-preconditioned), after a Normal event `reason`: `message`."""

    reason: str
    message: str


ActivityAction = WriteLastActivity | Popup | PostMessage | DeleteSession


def epoch_seconds(timestamp: str) -> float | None:
    """An RFC 3339 timestamp as the API server writes it, in epoch seconds; None if it is not
    one (a timestamp without a zone is not trusted to be UTC)."""
    try:
        parsed = datetime.fromisoformat(timestamp)
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo is not None else None


def whole_minutes(start: float, end: float) -> int:
    """Whole minutes from `start` to `end` (epoch seconds), truncated toward zero, as
    ``ChronoUnit.MINUTES.between`` counts them."""
    ms = round((end - start) * 1000)
    minutes = abs(ms) // MINUTE_MS
    return minutes if ms >= 0 else -minutes


def hard_limit(session: Session, lifetime: Lifetime | None, now: float) -> DeleteSession | None:
    """§5.1: the deletion of a Session older than its AppDefinition's ``spec.timeout``, or None.

    `lifetime` is the Session's AppDefinition's (None: no AppDefinition of that name).
    """
    if session.deleting or lifetime is None:
        return None
    timeout = lifetime.timeout
    if timeout is None or timeout <= 0:
        return None
    created = epoch_seconds(session.created)
    if created is None:
        return None
    age = whole_minutes(created, now)
    if age <= timeout:
        return None
    return DeleteSession(
        REASON_TIMED_OUT,
        f"Session timed out: created {age} minutes ago, beyond the {timeout}-minute limit of "
        f"AppDefinition {lifetime.name} (spec.timeout)")


def tracker_for(session: Session, lifetime: Lifetime | None) -> ActivityTracker | None:
    """§5.2: the activity tracker that watches `session`, or None when none does: not HANDLED,
    being deleted, no AppDefinition, no tracker block, ``timeoutAfter`` missing or ``<= 0``,
    or no monitor port to ask."""
    if session.deleting or session.status != v.STATUS_HANDLED or lifetime is None:
        return None
    tracker = lifetime.tracker
    if tracker is None or tracker.timeout_after is None or tracker.timeout_after <= 0:
        return None
    if lifetime.monitor_port is None:
        return None
    return tracker


def timeout_message(timeout_after: int) -> str:
    """The message posted to the IDE before an inactive Session is deleted, byte for byte."""
    return json.dumps({
        "message": TIMEOUT_MESSAGE, "level": "info", "fullscreen": True,
        "detail": f"Timeout of {timeout_after} minutes of inactivity was reached!",
    }, separators=(",", ":"))


def activity_plan(
    tracker: ActivityTracker, last_activity: int | None, reported: int | None, now: float,
) -> tuple[ActivityAction, ...]:
    """§5.2 steps 2-3 for one tracked Session, in the order to carry them out.

    `last_activity`: its ``status.lastActivity`` (epoch ms; None when unset); `reported`: what
    its monitor answered (None: no answer). A higher value is written and counted from; a
    lower or equal one is ignored. An unset ``lastActivity`` starts the count now (written);
    a reported value past now counts as now.
    """
    timeout_after = tracker.timeout_after
    assert timeout_after is not None and timeout_after > 0, "tracker_for decides who is tracked"
    now_ms = int(now * 1000)
    actions: list[ActivityAction] = []
    base = last_activity
    if reported is not None and reported >= 0:
        reported = min(reported, now_ms)
        if base is None or reported > base:
            base = reported
    if base is None:
        base = now_ms
    minutes = (now_ms - base) // MINUTE_MS
    if minutes >= timeout_after:
        # A Session about to be deleted needs no new lastActivity: it could only be lower
        # than one that keeps it alive.
        return (PostMessage(timeout_message(timeout_after)), DeleteSession(
            REASON_INACTIVE,
            f"Session inactive for {minutes} minutes: the activity tracker's limit is "
            f"{timeout_after} minutes (spec.monitor.activityTracker.timeoutAfter)"))
    if base != last_activity:
        actions.append(WriteLastActivity(base))
    notify_after = tracker.notify_after
    if notify_after is not None and notify_after <= minutes:
        actions.append(Popup())
    return tuple(actions)
