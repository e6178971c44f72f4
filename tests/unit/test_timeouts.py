"""Session timeouts (session-lifecycle §5) as decisions: a table, no server, an explicit `now`.

The runner's own contract (event before a uid-preconditioned delete, errors isolated per
Session, a deposed leader stops) is checked here on a recording fake API; the same against
the real control plane is tests/integration/test_session_timeouts.py.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from warmpool.controller.result import Outcome
from warmpool.controller.timeouts import (
    AGAIN_AFTER,
    ENABLED_SETTING,
    INTERVAL_SETTING,
    MONITOR_TIMEOUT_SETTING,
    TRACKER_SETTING,
    PoolServiceEndpoints,
    Resolution,
    TimeoutRunner,
    TimeoutSettings,
    session_timeout,
    session_timers,
)
from warmpool.keys import TimeoutKey
from warmpool.kube.api import Conflict
from warmpool.kube.clock import FixedClock
from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.pool.actions import Report
from warmpool.pool.model import ActivityTracker, Lifetime, parse_lifetime, parse_session
from warmpool.pool.parts import Part
from warmpool.pool.timeouts import (
    CLOCK_RESOLUTION_MS,
    MINUTE_MS,
    REASON_BAD_LAST_ACTIVITY,
    REASON_INACTIVE,
    REASON_TIMED_OUT,
    DeleteSession,
    Observation,
    Observed,
    Popup,
    PostMessage,
    StoredActivity,
    Unknown,
    WriteLastActivity,
    activity_plan,
    hard_deadline,
    hard_limit,
    inactivity_deadline,
    next_look,
    read_last_activity,
    session_deadline,
    timeout_message,
    tracker_for,
    whole_minutes,
)
from warmpool.testing.world import session_spec

CREATED = "2026-03-01T10:00:00Z"
T0 = datetime(2026, 3, 1, 10, 0, 0, tzinfo=UTC).timestamp()
MIN = 60.0


def session_obj(name: str = "s1", *, status: str | None = "HANDLED", created: str = CREATED,
                appdef: str = "java", last_activity: Any = None, deleting: bool = False,
                uid: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}",
                            "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-03-01T10:01:00Z"
    spec = {**session_spec(name, "jane@example.com", appdef, workspace=None),
            "sessionSecret": "s3cr3t-token"}
    obj: dict[str, Any] = {"metadata": meta, "spec": spec}
    if status is not None:
        obj["status"] = {"operatorStatus": status}
        if last_activity is not None:
            obj["status"]["lastActivity"] = last_activity
    return obj


def appdef_obj(name: str = "java", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
            "spec": {"name": f"{name}-app", "image": "img", "port": 3000, **spec}}


def lifetime(**spec: Any) -> Lifetime:
    return parse_lifetime(appdef_obj(**spec))


TRACKED = {"monitor": {"port": 3000, "activityTracker": {"timeoutAfter": 60, "notifyAfter": 55}}}


# --- parsing ----------------------------------------------------------------------------------


def test_lifetime_reads_timeout_and_monitor_and_tolerates_unknown_fields() -> None:
    lt = lifetime(timeout=1440, monitor={"port": 3000, "future": [1],
                                         "activityTracker": {"timeoutAfter": 60,
                                                             "notifyAfter": 55, "x": {}}})
    assert (lt.timeout, lt.monitor_port) == (1440, 3000)
    assert lt.tracker == ActivityTracker(timeout_after=60, notify_after=55)
    assert lt.problems == ()
    assert lifetime(timeout="30").timeout == 30  # Jackson reads a decimal string as an int


@pytest.mark.parametrize("spec, problem", [
    ({"timeout": "abc"}, "spec.timeout must be an integer"),
    ({"timeout": True}, "spec.timeout must be an integer"),
    ({"timeout": 1.5}, "spec.timeout must be an integer"),
    ({"monitor": 5}, "spec.monitor must be an object"),
    ({"monitor": {"port": 70000}}, "spec.monitor.port must be a TCP port"),
    ({"monitor": {"activityTracker": []}}, "spec.monitor.activityTracker must be an object"),
    ({"monitor": {"activityTracker": {"timeoutAfter": {}}}},
     "spec.monitor.activityTracker.timeoutAfter must be an integer"),
])
def test_a_malformed_limit_reads_as_unset_with_a_message(spec: dict[str, Any],
                                                         problem: str) -> None:
    lt = lifetime(**spec)
    assert any(p.startswith(problem) for p in lt.problems), lt.problems
    assert lt.timeout is None and lt.monitor_port is None
    assert lt.tracker is None or lt.tracker.timeout_after is None


@pytest.mark.parametrize("raw", [None, "x", [], 5, {"spec": 3}])
def test_lifetime_never_raises(raw: Any) -> None:
    obj = raw if isinstance(raw, dict) else {"metadata": raw, "spec": raw}
    parse_lifetime(obj)


def test_session_keeps_its_secret_out_of_its_repr_and_reads_last_activity() -> None:
    s = parse_session(session_obj(last_activity=1_700_000_000_000))
    assert s.secret == "s3cr3t-token" and "s3cr3t" not in repr(s)
    assert s.last_activity == 1_700_000_000_000
    for bad in ("1700000000000", -5, True, 1.5, {}):
        assert parse_session(session_obj(last_activity=bad)).last_activity is None
    weird = session_obj()
    weird["spec"]["sessionSecret"] = 42
    assert parse_session(weird).secret == "" and parse_session(weird).malformed is None


# --- the hard limit (§5.1) --------------------------------------------------------------------


def test_whole_minutes_truncate_toward_zero() -> None:
    assert whole_minutes(T0, T0 + 59.999) == 0
    assert whole_minutes(T0, T0 + 60) == 1
    assert whole_minutes(T0, T0 + 5 * MIN + 59) == 5
    assert whole_minutes(T0, T0 - 59) == 0 and whole_minutes(T0, T0 - 61) == -1


@pytest.mark.parametrize("elapsed, due", [
    (5 * MIN, False),             # 5 whole minutes: not above 5
    (5 * MIN + 59.9, False),      # still 5, truncated
    (6 * MIN, True),              # 6 > 5
    (30 * MIN, True),
])
def test_hard_limit_counts_truncated_minutes_from_creation(elapsed: float, due: bool) -> None:
    d = hard_limit(parse_session(session_obj()), lifetime(timeout=5), T0 + elapsed)
    assert (d is not None) == due
    if d is not None:
        assert d.reason == REASON_TIMED_OUT
        assert "5-minute limit" in d.message and "spec.timeout" in d.message


@pytest.mark.parametrize("timeout", [None, 0, -1, "abc"])
def test_hard_limit_missing_zero_negative_or_malformed_is_no_limit(timeout: Any) -> None:
    spec = {} if timeout is None else {"timeout": timeout}
    assert hard_limit(parse_session(session_obj()), lifetime(**spec), T0 + 10**6) is None


def test_hard_limit_without_appdefinition_is_no_limit() -> None:
    assert hard_limit(parse_session(session_obj()), None, T0 + 10**6) is None


@pytest.mark.parametrize("status", [None, "NEW", "HANDLING", "HANDLED", "ERROR", "??"])
def test_hard_limit_applies_to_every_status(status: str | None) -> None:
    s = parse_session(session_obj(status=status))
    assert hard_limit(s, lifetime(timeout=1), T0 + 2 * MIN) is not None


def test_hard_limit_skips_a_session_being_deleted_and_an_unreadable_creation() -> None:
    lt = lifetime(timeout=1)
    assert hard_limit(parse_session(session_obj(deleting=True)), lt, T0 + 10 * MIN) is None
    assert hard_limit(parse_session(session_obj(created="yesterday")), lt, T0 + 10**6) is None


# --- the activity tracker (§5.2) --------------------------------------------------------------


def test_only_handled_sessions_with_a_positive_timeout_after_and_a_port_are_tracked() -> None:
    handled = parse_session(session_obj())
    assert tracker_for(handled, lifetime(**TRACKED)) == ActivityTracker(60, 55)
    for status in ("NEW", "HANDLING", "ERROR"):
        assert tracker_for(parse_session(session_obj(status=status)), lifetime(**TRACKED)) is None
    assert tracker_for(parse_session(session_obj(deleting=True)), lifetime(**TRACKED)) is None
    assert tracker_for(handled, None) is None
    assert tracker_for(handled, lifetime()) is None  # no monitor block
    assert tracker_for(handled, lifetime(monitor={"port": 3000})) is None  # no tracker block
    for after in (None, 0, -3):
        block = {} if after is None else {"timeoutAfter": after}
        assert tracker_for(handled, lifetime(monitor={"port": 3000,
                                                      "activityTracker": block})) is None
    assert tracker_for(handled, lifetime(monitor={"activityTracker": {"timeoutAfter": 5}})) \
        is None  # no port to ask


TRACKER = ActivityTracker(timeout_after=60, notify_after=55)
LAST = int(T0 * 1000)
SAME = Observed(LAST)  # the monitor answered, with nothing newer than what is stored
SILENT = Unknown("no answer")


def plan(tracker: ActivityTracker, last: Any, observation: Observation, now: float
         ) -> tuple[Any, ...]:
    """activity_plan on a stored lastActivity as the runner reads it (bounded at `now`)."""
    return activity_plan(tracker, read_last_activity(last, now), observation, now)


@pytest.mark.parametrize("minutes, expected", [
    (0, ()),
    (54, ()),
    (55, (Popup(),)),
    (59, (Popup(),)),
])
def test_popup_while_notify_after_le_m_lt_timeout_after(minutes: int, expected: tuple[Any, ...]
                                                        ) -> None:
    now = T0 + minutes * MIN + 59.9  # the minutes are floored
    assert plan(TRACKER, LAST, SAME, now) == expected


def test_message_then_delete_at_timeout_after() -> None:
    actions = plan(TRACKER, LAST, SAME, T0 + 60 * MIN)
    assert [type(a) for a in actions] == [PostMessage, DeleteSession]
    message, deletion = actions
    assert isinstance(message, PostMessage) and isinstance(deletion, DeleteSession)
    assert message.body == ('{"message":"Your session has timed out!","level":"info",'
                            '"fullscreen":true,"detail":"Timeout of 60 minutes of inactivity '
                            'was reached!"}')
    assert json.loads(message.body)["fullscreen"] is True
    assert deletion.reason == REASON_INACTIVE and "60 minutes" in deletion.message
    assert timeout_message(7).endswith(
        '"detail":"Timeout of 7 minutes of inactivity was reached!"}')


def test_a_silent_monitor_is_unknown_never_inactive() -> None:
    """Java deletes a Session whose monitor never answers timeoutAfter minutes after HANDLED;
    here nothing is deleted for inactivity that was not observed, and no popup is sent."""
    for minutes in (59, 60, 61, 10_000):
        assert plan(TRACKER, LAST, SILENT, T0 + minutes * MIN) == ()
    # Its deadline is the hard limit alone (the cap); observed, the inactivity one.
    session = parse_session(session_obj(last_activity=LAST))
    assert session_deadline(session, lifetime(timeout=90, **TRACKED), LAST, SILENT) \
        == T0 + 91 * MIN
    assert session_deadline(session, lifetime(timeout=90, **TRACKED), LAST, SAME) \
        == T0 + 60 * MIN
    assert session_deadline(session, lifetime(**TRACKED), LAST, SILENT) is None
    assert inactivity_deadline(TRACKER, LAST, SILENT) is None


def test_an_answer_after_a_silence_is_counted_from_what_it_says() -> None:
    # Unreachable for an hour, then it answers: the user was active 5 minutes ago.
    now = T0 + 65 * MIN
    recent = LAST + 60 * MINUTE_MS
    assert plan(TRACKER, LAST, Observed(recent), now) == (WriteLastActivity(recent),)
    # ...or it answers that the user left before the silence: deleted, as observed.
    assert isinstance(plan(TRACKER, LAST, SAME, now)[-1], DeleteSession)


def test_a_higher_reported_value_is_written_and_counted_from() -> None:
    now = T0 + 59 * MIN
    reported = LAST + 50 * MINUTE_MS  # 9 minutes ago: no popup any more
    assert plan(TRACKER, LAST, Observed(reported), now) == (WriteLastActivity(reported),)
    # and it saves a Session that the stored value would have timed out
    assert plan(TRACKER, LAST, Observed(reported), T0 + 61 * MIN) \
        == (WriteLastActivity(reported),)


def test_a_lower_or_equal_reported_value_is_ignored() -> None:
    now = T0 + 56 * MIN
    assert plan(TRACKER, LAST, Observed(LAST - 5 * MINUTE_MS), now) == (Popup(),)
    assert plan(TRACKER, LAST, SAME, now) == (Popup(),)
    assert plan(TRACKER, LAST, Observed(-1), T0 + 60 * MIN)[-1].__class__ is DeleteSession


def test_unset_last_activity_starts_the_count_now_and_a_future_report_counts_as_now() -> None:
    now = T0 + 1000 * MIN
    now_ms = int(now * 1000)
    assert plan(TRACKER, None, Observed(now_ms - 1000), now) \
        == (WriteLastActivity(now_ms - 1000),)
    assert plan(TRACKER, None, SILENT, now) == (WriteLastActivity(now_ms),)
    assert plan(TRACKER, LAST, Observed(now_ms + 10**9), now) == (WriteLastActivity(now_ms),)


@pytest.mark.parametrize("raw, why", [
    (int(T0 * 1000) + 2 * 3_600_000, "7200 s after the cluster's current time"),  # 2 h ahead
    (10**18, "more than 30 years after"),
    (2**70, "more than 30 years after"),
    ("yesterday", "must be epoch milliseconds"),
    (True, "must be epoch milliseconds"),
    (-5, "must be epoch milliseconds"),
    (1.5e12, "must be epoch milliseconds"),
    ({"no": 1}, "must be epoch milliseconds"),
    ("x" * 10_000, "must be epoch milliseconds"),
])
def test_a_stored_last_activity_past_now_or_not_an_integer_is_rewritten_to_now(
    raw: Any, why: str,
) -> None:
    """Stored in the future it would keep the Session alive until then (10^18: for ever);
    capped at now in the decision alone it would look fresh on every pass. So it is named in
    a Warning and rewritten to now, and the count starts there."""
    now = T0
    now_ms = int(now * 1000)
    stored = read_last_activity(raw, now)
    assert stored.value is None and stored.problem is not None and why in stored.problem
    assert len(stored.problem) < 200  # a huge value is shown cut
    for observation in (SAME, SILENT):
        warning, write = plan(TRACKER, raw, observation, now)
        assert isinstance(warning, Report) and warning.warning
        assert warning.reason == REASON_BAD_LAST_ACTIVITY
        assert "status.lastActivity" in warning.message
        assert write == WriteLastActivity(now_ms)
    # Exactly now is a time, not a problem; nor is unset; nor a value within the clock's
    # resolution after now (another reading of the cluster's clock wrote it), read as now.
    assert read_last_activity(now_ms, now) == StoredActivity(now_ms)
    assert read_last_activity(now_ms + CLOCK_RESOLUTION_MS, now) == StoredActivity(now_ms)
    assert read_last_activity(now_ms + CLOCK_RESOLUTION_MS + 1, now).problem is not None
    assert read_last_activity(None, now) == StoredActivity(None)


def test_no_popup_without_notify_after() -> None:
    tracker = ActivityTracker(timeout_after=60, notify_after=None)
    assert plan(tracker, LAST, SAME, T0 + 59 * MIN) == ()


def test_the_hard_deadline_is_the_first_instant_the_hard_limit_deletes() -> None:
    session = parse_session(session_obj())
    due = hard_deadline(session, lifetime(timeout=5))
    assert due == T0 + 6 * MIN
    assert hard_limit(session, lifetime(timeout=5), due - 0.001) is None
    assert hard_limit(session, lifetime(timeout=5), due) is not None


# --- settings ---------------------------------------------------------------------------------


def test_settings_defaults_and_values() -> None:
    assert TimeoutSettings.from_env({}) == TimeoutSettings(
        enabled=True, interval=60.0, activity_tracker=False, monitor_timeout=5.0)
    got = TimeoutSettings.from_env({ENABLED_SETTING: "off", INTERVAL_SETTING: "2.5",
                                    TRACKER_SETTING: "ON", MONITOR_TIMEOUT_SETTING: " 1 "})
    assert got == TimeoutSettings(enabled=False, interval=2.5, activity_tracker=True,
                                  monitor_timeout=1.0)


@pytest.mark.parametrize("name, raw", [
    (ENABLED_SETTING, "maybe"), (TRACKER_SETTING, "enabled"), (INTERVAL_SETTING, "0"),
    (INTERVAL_SETTING, "-1"), (INTERVAL_SETTING, "nan"), (INTERVAL_SETTING, "inf"),
    (INTERVAL_SETTING, "1m"), (MONITOR_TIMEOUT_SETTING, "x"),
])
def test_a_bad_setting_names_its_variable(name: str, raw: str) -> None:
    with pytest.raises(ValueError, match=name) as info:
        TimeoutSettings.from_env({name: raw})
    assert repr(raw) in str(info.value)


# --- the runner on a recording fake API -------------------------------------------------------


class FakeKube:
    def __init__(self, appdefs: list[dict[str, Any]], sessions: list[dict[str, Any]]) -> None:
        self.objects = {v.APPDEF_KIND: appdefs, v.SESSION_KIND: sessions, "Service": []}
        self.calls: list[tuple[Any, ...]] = []
        self.conflict_on: set[str] = set()
        self.fail_on: set[str] = set()

    def list_pages(self, api_version: str, kind: str, namespace: str | None, **_: Any) -> Any:
        yield list(self.objects[kind]), "1"

    def event(self, namespace: str, regarding: dict[str, str], reason: str, message: str, *,
              warning: bool) -> None:
        self.calls.append(("event", regarding["name"], regarding["uid"], reason, warning))

    def delete(self, api_version: str, kind: str, namespace: str, name: str, *,
               uid: str | None = None, resource_version: str | None = None) -> bool:
        if name in self.fail_on:
            raise RuntimeError("boom")
        if name in self.conflict_on:
            raise Conflict("uid precondition")
        self.calls.append(("delete", name, uid))
        return True


def run(kube: FakeKube, now: float, **kwargs: Any) -> Any:
    runner = TimeoutRunner(kube, ["ns"], TimeoutSettings(),  # type: ignore[arg-type]
                           clock=FixedClock(now), **kwargs)
    return runner.run_once()


def test_runner_records_a_normal_event_then_deletes_by_uid() -> None:
    kube = FakeKube([appdef_obj(timeout=5)], [session_obj("old"), session_obj(
        "young", created="2026-03-01T10:04:00Z")])
    report = run(kube, T0 + 6 * MIN)
    assert kube.calls == [("event", "old", "uid-old", REASON_TIMED_OUT, False),
                          ("delete", "old", "uid-old")]
    assert report.deleted == [("ns", "old", REASON_TIMED_OUT)]


def test_runner_isolates_errors_and_spares_a_recreated_session() -> None:
    kube = FakeKube([appdef_obj(timeout=5), appdef_obj("bad", timeout="soon", monitor=3)],
                    [session_obj("a"), session_obj("b"), session_obj("c"),
                     session_obj("d", appdef="bad"), {"metadata": "nonsense"}])
    kube.fail_on, kube.conflict_on = {"a"}, {"b"}
    report = run(kube, T0 + 6 * MIN)
    assert report.deleted == [("ns", "c", REASON_TIMED_OUT)]
    assert report.spared == [("ns", "b")]
    assert [e[:2] for e in report.errors] == [("ns", "a")]
    assert report.sessions == 5


def test_runner_stops_when_no_longer_leading() -> None:
    kube = FakeKube([appdef_obj(timeout=5)], [session_obj("a"), session_obj("b")])
    report = run(kube, T0 + 6 * MIN, active=lambda: False)
    assert report.stopped and kube.calls == []


# --- the monitor's target: only the pool's Service of the held instance ------------------------


class ServicesKube:
    """Lists the Services it is given (what PoolServiceEndpoints reads)."""

    def __init__(self, services: list[dict[str, Any]]) -> None:
        self.services = services

    def list_pages(self, api_version: str, kind: str, namespace: str | None, **_: Any) -> Any:
        assert kind == "Service"
        yield list(self.services), "1"


def held_session(k: int = 2) -> Any:
    obj = session_obj("s1", uid="uid-s1")
    obj["metadata"]["annotations"] = {v.ANNOTATION_INSTANCE_ID: str(k)}
    return parse_session(obj)


def pool_service(k: int = 2, *, appdef_uid: str = "uid-java", session_uid: str = "uid-s1",
                 ip: Any = "10.0.0.7", name: str | None = None,
                 label_uid: str | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name or Part.EXTERNAL_SERVICE.object_name("java-app", "uid-java", k),
            "labels": {v.LABEL_SESSION_UUID: label_uid or session_uid,
                       v.LABEL_APP: naming.app_selector("java-app", k)},
            "ownerReferences": [
                {"kind": v.APPDEF_KIND, "name": "java", "uid": appdef_uid},
                {"kind": v.SESSION_KIND, "name": "s1", "uid": session_uid}]},
        "spec": {"clusterIP": ip}}


def resolve(services: list[dict[str, Any]], session: Any = None) -> Resolution:
    return PoolServiceEndpoints(ServicesKube(services)).resolve(  # type: ignore[arg-type]
        session or held_session(), lifetime(**TRACKED), 3000)


def test_the_target_is_the_pools_external_service_of_the_held_instance() -> None:
    r = resolve([pool_service()])
    assert r.target is not None and r.target.base == "http://10.0.0.7:3000" and not r.foreign
    assert resolve([pool_service(ip="fd00::7")]).target.base == "http://[fd00::7]:3000"  # type: ignore[union-attr]


@pytest.mark.parametrize("service, why", [
    (pool_service(appdef_uid="uid-predecessor"), "not owned by AppDefinition"),
    (pool_service(session_uid="uid-other"), "not owned by this Session"),
    (pool_service(label_uid="uid-other"), "is not labelled"),
    (pool_service(ip="None"), "no cluster IP"),
    (pool_service(ip="10.0.0.7/8"), "no cluster IP"),
    (pool_service(ip="x" * 10_000), "no cluster IP"),
    (pool_service(ip=7), "no cluster IP"),
    (pool_service(k=3), "no Service"),  # another instance's Service: not the held one
])
def test_anything_short_of_the_pools_service_is_no_target(service: dict[str, Any], why: str
                                                          ) -> None:
    r = resolve([service])
    assert r.target is None and why in r.why


def test_other_services_owned_by_the_session_are_foreign_and_never_targets() -> None:
    thief = {"metadata": {"name": "a-thief", "ownerReferences": [
        {"kind": v.SESSION_KIND, "name": "s1", "uid": "uid-s1"}]},
        "spec": {"clusterIP": "10.9.9.9"}}
    by_name = {"metadata": {"name": "b-by-name", "ownerReferences": [
        {"kind": v.SESSION_KIND, "name": "s1"}]}, "spec": {"clusterIP": "10.9.9.8"}}
    predecessor = {"metadata": {"name": "c-old", "ownerReferences": [
        {"kind": v.SESSION_KIND, "name": "s1", "uid": "uid-old-s1"}]}}
    internal = pool_service(name=Part.INTERNAL_SERVICE.object_name("java-app", "uid-java", 2))
    r = resolve([thief, by_name, predecessor, internal, pool_service()])
    assert r.target is not None and r.target.base == "http://10.0.0.7:3000"
    assert r.foreign == ("a-thief", "b-by-name")  # a predecessor's is not this Session's
    # Without an instance (a claim in flight): no target at all; the pool's Services are not
    # foreign, the others still named.
    unheld = parse_session(session_obj("s1", uid="uid-s1"))
    r = resolve([thief, pool_service()], unheld)
    assert r.target is None and "names no instance" in r.why and r.foreign == ("a-thief",)


# --- a Session's timer as a keyed job (issue #29) -----------------------------------------------


def test_next_look_is_the_hard_deadline_or_the_poll_while_a_tracker_may_watch() -> None:
    s = parse_session(session_obj())
    # spec.timeout 5: due at creation + 6 min (whole minutes above the limit).
    assert next_look(s, lifetime(timeout=5), T0, poll=None) == T0 + 6 * MIN
    assert next_look(s, lifetime(), T0, poll=None) is None  # no limit: nothing ends it
    # A tracker (on): asked every poll, the hard deadline still a bound.
    assert next_look(s, lifetime(timeout=5, **TRACKED), T0, poll=60) == T0 + 60
    assert next_look(s, lifetime(timeout=5, **TRACKED), T0 + 5.5 * MIN,
                     poll=60) == T0 + 6 * MIN
    # Not HANDLED yet: it may become tracked (a status write queues nothing), so polled.
    waiting = parse_session(session_obj(status="HANDLING"))
    assert next_look(waiting, lifetime(**TRACKED), T0, poll=60) == T0 + 60
    # The tracker off (poll None), or a Session being deleted: no poll.
    assert next_look(s, lifetime(**TRACKED), T0, poll=None) is None
    assert next_look(parse_session(session_obj(deleting=True)), lifetime(timeout=5, **TRACKED),
                     T0, poll=60) is None


class ObjectReader:
    """`Reader.object` and `now` over fixed objects (what `session_timeout` reads)."""

    def __init__(self, *objects: dict[str, Any], now: float = T0) -> None:
        self.objects = {(o.get("kind") or (v.APPDEF_KIND if "image" in o["spec"] else
                                            v.SESSION_KIND), o["metadata"]["name"]): o
                        for o in objects}
        self.at = now

    def object(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((kind, name))

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.at, UTC)


def test_the_timeout_job_waits_for_the_deadline_then_ends_the_session() -> None:
    kube = FakeKube([], [])
    clock = FixedClock(T0 + 1 * MIN)
    runner = TimeoutRunner(kube, [], TimeoutSettings(), clock=clock)  # type: ignore[arg-type]
    reader = ObjectReader(appdef_obj(timeout=5), session_obj("s1"))
    key = TimeoutKey("ns", "s1")
    early = session_timeout(runner, reader, key)  # type: ignore[arg-type]
    assert early.outcome is Outcome.SCHEDULED and early.requeue_after == 5 * MIN
    assert kube.calls == []
    clock.at = T0 + 6 * MIN  # the queue runs it at its requeue_after
    due = session_timeout(runner, reader, key)  # type: ignore[arg-type]
    assert due.outcome is Outcome.ENDED and due.requeue_after is None
    assert kube.calls == [("event", "s1", "uid-s1", REASON_TIMED_OUT, False),
                          ("delete", "s1", "uid-s1")]


def test_the_timeout_job_of_a_session_without_limits_sets_no_timer() -> None:
    runner = TimeoutRunner(FakeKube([], []), [], TimeoutSettings(),  # type: ignore[arg-type]
                           clock=FixedClock(T0))
    result = session_timeout(runner, ObjectReader(appdef_obj(), session_obj("s1")),  # type: ignore[arg-type]
                             TimeoutKey("ns", "s1"))
    assert result.outcome is Outcome.SCHEDULED and result.requeue_after is None
    gone = session_timeout(runner, ObjectReader(appdef_obj()),  # type: ignore[arg-type]
                           TimeoutKey("ns", "s1"))
    assert gone.outcome is Outcome.SKIPPED and gone.requeue_after is None


def test_a_refused_deletion_is_decided_again_shortly() -> None:
    kube = FakeKube([], [])
    kube.conflict_on = {"s1"}  # re-created (or changed) since the read
    runner = TimeoutRunner(kube, [], TimeoutSettings(),  # type: ignore[arg-type]
                           clock=FixedClock(T0 + 7 * MIN))
    result = session_timeout(runner, ObjectReader(appdef_obj(timeout=5), session_obj("s1")),  # type: ignore[arg-type]
                             TimeoutKey("ns", "s1"))
    assert result.outcome is Outcome.SCHEDULED and result.requeue_after == AGAIN_AFTER


def test_the_pool_job_names_each_sessions_timeout_key_at_its_deadline() -> None:
    reader = ObjectReader(appdef_obj(timeout=5), now=T0 + 2 * MIN)
    sessions = [parse_session(session_obj("a")),
                parse_session(session_obj("b", created="2026-03-01T10:01:00Z"))]
    timers = session_timers(reader, "ns", "java", sessions,  # type: ignore[arg-type]
                            TimeoutSettings())
    assert timers == [(TimeoutKey("ns", "a"), 4 * MIN), (TimeoutKey("ns", "b"), 5 * MIN)]
    assert session_timers(reader, "ns", "java", sessions,  # type: ignore[arg-type]
                          TimeoutSettings(enabled=False)) == []
