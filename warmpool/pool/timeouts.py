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
an unset ``lastActivity`` starts the count now (Java reads 0: deleted at once).

Choices where Java fails deadly (issue #29), each a bound stated here and in docs/lifecycle.md:

- **"Now" is the cluster's** (``warmpool.kube.clock``): every ``now`` here is the API server's
  time, never a host's, so a leader whose clock is hours off decides as a correct one would.
- **An unanswered monitor is unknown, not inactive.** Java counts a monitor that never answers
  as "no activity" and deletes the Session ``timeoutAfter`` minutes after HANDLED whatever its
  user does. Here inactivity is only enforced on what the monitor *said*: while it is
  unreachable (no target, no answer, an error, an answer that is not an epoch-ms number) nothing
  is deleted for inactivity, no popup is sent, and the count is not advanced by the silence.
  **The cap** on a Session whose activity cannot be observed is the hard limit, ``spec.timeout``
  (deleted between timeout+1 and timeout+2 minutes after creation, as always); an AppDefinition
  with a tracker but no ``spec.timeout`` has no cap, and the runner says so in a Warning event.
- **``lastActivity`` is bounded by now.** A stored value is an epoch-ms integer no later than
  the server's now; one later (a worker with a fast clock, a hand edit, 10^18) or not an integer
  at all is rewritten to now with a Warning event naming ``status.lastActivity``, so a Session
  is counted from the moment it was found, and a future value cannot keep it alive. A value
  the monitor reports past now counts as now.

Everything here takes ``now`` (epoch seconds, the server's) and returns plain data; the runner
(``warmpool.controller.timeouts``) reads the cluster, asks the monitor and carries it out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from warmpool.pool import vocabulary as v
from warmpool.pool.actions import Report
from warmpool.pool.model import ActivityTracker, Lifetime, Session

MINUTE_MS = 60_000
#: How far two readings of the cluster's clock may disagree (ms): the Date header has whole
#: seconds and each reading lags the server by up to one request's round trip, so a value this
#: pass wrote at its "now" can be a little after the next pass's "now". Within it a stored
#: value is read as now (not a problem, not rewritten); beyond it, it is in the future.
CLOCK_RESOLUTION_MS = 5_000

#: Event reasons (Normal events on the Session, written right before its deletion).
REASON_TIMED_OUT = "SessionTimedOut"
REASON_INACTIVE = "SessionInactive"
#: Warning events on the Session: a ``status.lastActivity`` that is not a time up to now, a
#: monitor whose activity cannot be observed, a Service owned by the Session that is not the
#: pool's (the monitor's token is never sent to it).
REASON_BAD_LAST_ACTIVITY = "LastActivityInvalid"
REASON_MONITOR_UNKNOWN = "ActivityUnknown"
REASON_FOREIGN_SERVICE = "ForeignServiceIgnored"

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


ActivityAction = WriteLastActivity | Popup | PostMessage | DeleteSession | Report


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


# --- what was observed ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredActivity:
    """``status.lastActivity`` as read: `value` in epoch ms when usable (an integer, not after
    now), else None; `problem` says why a value that is present is not usable."""

    value: int | None
    problem: str | None = None


def _shown(raw: object) -> str:
    text = json.dumps(raw, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def read_last_activity(raw: object, now: float) -> StoredActivity:
    """Bound ``status.lastActivity`` (anyone with ``patch`` on ``sessions/status`` writes it, and
    a worker writes it from its own clock): an integer of epoch ms in ``[0, now]``, where a value
    up to `CLOCK_RESOLUTION_MS` after now is read as now. Missing is unset (no problem);
    anything else is unusable, and says why (shown cut to 40 characters)."""
    if raw is None:
        return StoredActivity(None)
    field_name = "status.lastActivity"
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        return StoredActivity(None, f"{field_name} must be epoch milliseconds (a non-negative "
                                    f"integer), got {_shown(raw)}")
    now_ms = int(now * 1000)
    if raw <= now_ms + CLOCK_RESOLUTION_MS:
        return StoredActivity(min(raw, now_ms))
    if raw > now_ms:
        ahead = (raw - now_ms) // 1000
        shown = f"{ahead} s" if ahead < 10**9 else "more than 30 years"
        return StoredActivity(None, f"{field_name} {_shown(raw)} is {shown} after the "
                                    "cluster's current time")
    return StoredActivity(raw)


@dataclass(frozen=True, slots=True)
class Observed:
    """The monitor answered: the IDE's last activity, epoch ms (already bounded to 18 digits)."""

    value: int


@dataclass(frozen=True, slots=True)
class Unknown:
    """The monitor could not be asked or did not answer usably: nothing is known of activity."""

    why: str


Observation = Observed | Unknown


# --- deadlines --------------------------------------------------------------------------------


def hard_deadline(session: Session, lifetime: Lifetime | None) -> float | None:
    """When `session` passes its hard limit (epoch s): the first instant its whole minutes of
    age are above ``spec.timeout``, i.e. creation + (timeout + 1) min; None: no limit."""
    if session.deleting or lifetime is None or lifetime.timeout is None or lifetime.timeout <= 0:
        return None
    created = epoch_seconds(session.created)
    if created is None:
        return None
    return created + (lifetime.timeout + 1) * 60


def inactivity_deadline(tracker: ActivityTracker, base_ms: int,
                        observation: Observation) -> float | None:
    """When a tracked Session counted from `base_ms` is due for inactivity (epoch s), or None
    when its activity is unknown: a Session is never deleted for inactivity not observed."""
    if isinstance(observation, Unknown) or not tracker.timeout_after:
        return None
    return (base_ms + tracker.timeout_after * MINUTE_MS) / 1000


def session_deadline(session: Session, lifetime: Lifetime | None, base_ms: int | None,
                     observation: Observation | None) -> float | None:
    """The first instant `session` is due (epoch s), or None when nothing will end it:
    the hard limit, and the inactivity deadline when it is tracked (`base_ms` the
    ``lastActivity`` it counts from) and its activity observed. `observation` None: not
    tracked. An unknown observation leaves the hard limit alone in force: that is the cap."""
    due = [hard_deadline(session, lifetime)]
    tracker = tracker_for(session, lifetime)
    if tracker is not None and observation is not None and base_ms is not None:
        due.append(inactivity_deadline(tracker, base_ms, observation))
    known = [d for d in due if d is not None]
    return min(known) if known else None


def activity_plan(
    tracker: ActivityTracker, stored: StoredActivity, observation: Observation, now: float,
) -> tuple[ActivityAction, ...]:
    """§5.2 steps 2-3 for one tracked Session, in the order to carry them out.

    `stored`: its ``status.lastActivity`` as bounded by `read_last_activity`; `observation`:
    what its monitor answered. A reported value above the stored one is written and counted
    from (past now: now); a lower or equal one is ignored. An unset ``lastActivity`` starts the
    count now (written), and so does an unusable one, after a Warning naming the field. With an
    `Unknown` observation nothing is deleted and no popup is sent: only the stored value is
    bounded.
    """
    timeout_after = tracker.timeout_after
    assert timeout_after is not None and timeout_after > 0, "tracker_for decides who is tracked"
    now_ms = int(now * 1000)
    actions: list[ActivityAction] = []
    if stored.problem is not None:
        actions.append(Report(REASON_BAD_LAST_ACTIVITY,
                              f"{stored.problem}: counted from now ({now_ms})"))
    base = stored.value
    if isinstance(observation, Observed) and observation.value >= 0:
        reported = min(observation.value, now_ms)
        if base is None or reported > base:
            base = reported
    if base is None:
        base = now_ms
    deadline = inactivity_deadline(tracker, base, observation)
    if deadline is not None and now_ms >= deadline * 1000:
        minutes = (now_ms - base) // MINUTE_MS
        # A Session about to be deleted needs no new lastActivity: it could only be lower
        # than one that keeps it alive.
        return (*actions, PostMessage(timeout_message(timeout_after)), DeleteSession(
            REASON_INACTIVE,
            f"Session inactive for {minutes} minutes: the activity tracker's limit is "
            f"{timeout_after} minutes (spec.monitor.activityTracker.timeoutAfter)"))
    if base != stored.value or stored.problem is not None:
        actions.append(WriteLastActivity(base))
    if isinstance(observation, Unknown):
        return tuple(actions)
    minutes = (now_ms - base) // MINUTE_MS
    notify_after = tracker.notify_after
    if notify_after is not None and notify_after <= minutes:
        actions.append(Popup())
    return tuple(actions)


def may_be_tracked(session: Session, lifetime: Lifetime | None) -> bool:
    """Whether an activity tracker watches `session` now or will once it is HANDLED: its
    AppDefinition has a tracker with ``timeoutAfter > 0`` and a monitor port, and it is not
    being deleted. (Its HANDLED status is a status write, which queues nothing: its job keeps
    looking while it may become tracked.)"""
    if session.deleting or session.status == v.STATUS_ERROR or lifetime is None:
        return False
    tracker = lifetime.tracker
    return (tracker is not None and tracker.timeout_after is not None
            and tracker.timeout_after > 0 and lifetime.monitor_port is not None)


def next_look(session: Session, lifetime: Lifetime | None, now: float, *,
              poll: float | None) -> float | None:
    """When `session`'s timeout job should run again (epoch s, the cluster's clock), or None:
    nothing will end it unless it or its AppDefinition changes (whose events queue it).

    Its hard deadline (`hard_deadline`), and, with the tracker on (`poll`: seconds between
    asks of its monitor, Java's one minute), `poll` from now while a tracker watches it or
    may: its activity is only known by asking. An inactivity deadline is therefore met within
    one `poll` (as Java's pass every minute meets it); the hard limit exactly, on the
    cluster's clock as read (late by at most the clock's lag, `warmpool.kube.clock`)."""
    due = [hard_deadline(session, lifetime)]
    if poll is not None and may_be_tracked(session, lifetime):
        due.append(now + poll)
    known = [d for d in due if d is not None]
    return min(known) if known else None
