"""Session timeouts (session-lifecycle §5) against the real control plane, with a fake clock.

A client cannot set creationTimestamp, so the clock is moved instead: `clock = created + N min`.
The activity tracker talks to a local HTTP server standing in for the IDE's monitor; the fake
resolver points every Session at it, on the AppDefinition's `spec.monitor.port` (the server's),
so the port comes from where the real one does.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes.client import ApiClient

from scheduler.app import Scheduler, SchedulerConfig
from tests.ide_monitor import Request, monitor_handler
from tests.producers import Recorder
from tests.waiting import wait_for
from warmpool.controller.result import Outcome
from warmpool.controller.timeouts import (
    LiveSource,
    MonitorTarget,
    PassReport,
    PoolServiceEndpoints,
    Resolution,
    TimeoutRunner,
    TimeoutSettings,
    session_timeout,
)
from warmpool.keys import TimeoutKey
from warmpool.kube.api import Kube
from warmpool.kube.clock import FixedClock
from warmpool.kube.reader import LiveReader
from warmpool.pool import vocabulary as v
from warmpool.pool.builders import PoolSettings, build
from warmpool.pool.model import (
    Invalid,
    Lifetime,
    Session,
    parse_appdefinition,
    parse_lifetime,
    parse_session,
)
from warmpool.pool.parts import Part
from warmpool.pool.timeouts import (
    REASON_INACTIVE,
    REASON_MONITOR_UNKNOWN,
    REASON_TIMED_OUT,
    epoch_seconds,
)
from warmpool.testing.world import appdef_body, appdef_spec, create_session

MIN = 60.0
USER = "jane@example.com"
TRACKER_ON = TimeoutSettings(activity_tracker=True, monitor_timeout=5.0)
MESSAGE = ('{"message":"Your session has timed out!","level":"info","fullscreen":true,'
           '"detail":"Timeout of 60 minutes of inactivity was reached!"}')


def make_appdef(kube: Kube, ns: str, name: str, **spec: Any) -> dict[str, Any]:
    # No route and no resources: only the timeout fields matter here.
    return kube.create(appdef_body(ns, name, appdef_spec(
        name, min_instances=0, max_instances=2, ingressname=None, resources=False, **spec)))


def make_session(kube: Kube, ns: str, name: str, appdef: str, *, secret: str = "",
                 status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj = create_session(kube, ns, name, USER, appdef)
    if secret:
        obj = kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name,
                               {"spec": {"sessionSecret": secret}})
    if status is not None:
        obj = kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name,
                               {"status": status}, status=True)
    return obj


def created_at(obj: dict[str, Any]) -> float:
    t = epoch_seconds(obj["metadata"]["creationTimestamp"])
    assert t is not None
    return t


def session_or_none(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    return kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name)


def gone(kube: Kube, ns: str, name: str, uid: str) -> bool:
    obj = session_or_none(kube, ns, name)
    return obj is None or obj["metadata"]["uid"] != uid


def events_for(kube: Kube, ns: str, uid: str) -> list[dict[str, Any]]:
    items, _ = kube.list("v1", "Event", ns)
    return [e for e in items if (e.get("involvedObject") or {}).get("uid") == uid]


def assert_deleted_after_normal_event(kube: Kube, ns: str, obj: dict[str, Any],
                                      reason: str) -> None:
    name, uid = obj["metadata"]["name"], obj["metadata"]["uid"]
    wait_for(lambda: gone(kube, ns, name, uid), timeout=30, message=f"Session {name} deleted")
    events = events_for(kube, ns, uid)
    assert [(e["type"], e["reason"]) for e in events] == [("Normal", reason)], events
    assert events[0]["involvedObject"]["kind"] == v.SESSION_KIND
    assert USER not in events[0]["message"]


# --- the hard limit ---------------------------------------------------------------------------


def test_a_session_past_spec_timeout_gets_a_normal_event_and_is_deleted(
    kube: Kube, namespace: str
) -> None:
    make_appdef(kube, namespace, "short", timeout=5)
    make_appdef(kube, namespace, "long", timeout=30)
    make_appdef(kube, namespace, "unlimited", timeout=0)
    old = make_session(kube, namespace, "s-short", "short")
    kept = make_session(kube, namespace, "s-long", "long")
    free = make_session(kube, namespace, "s-unlimited", "unlimited")
    orphan = make_session(kube, namespace, "s-orphan", "no-such-appdef")
    now = created_at(old) + 6 * MIN  # 6 whole minutes: above 5, not above 30
    runner = TimeoutRunner(kube, [namespace], TimeoutSettings(), clock=FixedClock(now))

    report = runner.run_once()

    assert report.deleted == [(namespace, "s-short", REASON_TIMED_OUT)]
    assert report.errors == []
    assert_deleted_after_normal_event(kube, namespace, old, REASON_TIMED_OUT)
    for obj in (kept, free, orphan):
        assert session_or_none(kube, namespace, obj["metadata"]["name"]) is not None
        assert events_for(kube, namespace, obj["metadata"]["uid"]) == []

    # 5 whole minutes (truncated) is not above a 5-minute limit.
    s2 = make_session(kube, namespace, "s-short-2", "short")
    at_limit = created_at(s2) + 5 * MIN + 59
    assert TimeoutRunner(kube, [namespace], TimeoutSettings(),
                         clock=FixedClock(at_limit)).run_once().deleted == []


class RecreatingSource(LiveSource):
    """Lists Sessions, then deletes and re-creates `name` (same name, new uid) before the pass
    acts on what it listed: the decision is taken on the predecessor."""

    def __init__(self, kube: Kube, name: str, appdef: str) -> None:
        super().__init__(kube)
        self.name, self.appdef = name, appdef
        self.recreated: dict[str, Any] | None = None

    def sessions(self, namespace: str | None) -> list[dict[str, Any]]:
        listed = super().sessions(namespace)
        assert namespace is not None
        old = next(o for o in listed if o["metadata"]["name"] == self.name)
        self.kube.delete(v.SESSION_API_VERSION, v.SESSION_KIND, namespace, self.name)
        wait_for(lambda: session_or_none(self.kube, namespace, self.name) is None, timeout=30)
        self.recreated = make_session(self.kube, namespace, self.name, self.appdef)
        assert self.recreated["metadata"]["uid"] != old["metadata"]["uid"]
        return listed


def test_a_session_recreated_under_the_same_name_before_the_delete_survives(
    kube: Kube, namespace: str
) -> None:
    make_appdef(kube, namespace, "short", timeout=1)
    old = make_session(kube, namespace, "again", "short")
    now = created_at(old) + 10 * MIN  # the successor is "old" too by this clock
    source = RecreatingSource(kube, "again", "short")
    report = TimeoutRunner(kube, [namespace], TimeoutSettings(), source=source,
                           clock=FixedClock(now)).run_once()
    assert report.spared == [(namespace, "again")] and report.deleted == []
    assert source.recreated is not None
    current = session_or_none(kube, namespace, "again")
    assert current is not None
    assert current["metadata"]["uid"] == source.recreated["metadata"]["uid"]


# --- bad input does not stop the pass ----------------------------------------------------------


class FailingResolver:
    """Raises for one Session, answers nothing for the others."""

    def __init__(self, fail: str) -> None:
        self.fail = fail

    def resolve(self, session: Session, lifetime: Lifetime, port: int) -> Resolution:
        if session.name == self.fail:
            raise RuntimeError("resolver exploded")
        return Resolution(None, "none here")


def test_malformed_sessions_and_appdefinitions_do_not_stop_the_pass(
    kube: Kube, namespace: str
) -> None:
    make_appdef(kube, namespace, "bad", timeout="soon", monitor=5)
    make_appdef(kube, namespace, "bad-tracker", timeout=[1],
                monitor={"port": "x", "activityTracker": {"timeoutAfter": "never"}})
    make_appdef(kube, namespace, "tracked", timeout=1,
                monitor={"port": 3000, "activityTracker": {"timeoutAfter": 60}})
    make_appdef(kube, namespace, "short", timeout=1)
    names = {
        "a-bad-appdef": make_session(kube, namespace, "a-bad-appdef", "bad"),
        "b-bad-tracker": make_session(kube, namespace, "b-bad-tracker", "bad-tracker"),
        "c-weird-status": make_session(kube, namespace, "c-weird-status", "short", status={
            "operatorStatus": 5, "lastActivity": "yesterday", "x": [None]}),
        "d-boom": make_session(kube, namespace, "d-boom", "tracked", status={
            "operatorStatus": "HANDLED", "lastActivity": {"no": 1}}),
        "e-good": make_session(kube, namespace, "e-good", "short"),
    }
    # d-boom is within the hard limit until the tracker runs: its resolver raises first.
    kube.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, namespace, "tracked",
                     {"spec": {"timeout": 10_000}})
    now = max(created_at(o) for o in names.values()) + 3 * MIN
    report = TimeoutRunner(kube, [namespace], TRACKER_ON, resolver=FailingResolver("d-boom"),
                           clock=FixedClock(now)).run_once()

    assert report.sessions == 5
    assert [e[:2] for e in report.errors] == [(namespace, "d-boom")]
    assert sorted(r[1] for r in report.deleted) == ["c-weird-status", "e-good"]
    for name in ("a-bad-appdef", "b-bad-tracker", "d-boom"):
        assert session_or_none(kube, namespace, name) is not None, name


# --- the activity tracker ----------------------------------------------------------------------


@dataclass
class Monitor:
    """A local stand-in for the IDE monitors: answers `lastActivity[secret]`, records posts."""

    last_activity: dict[str, int] = field(default_factory=dict)
    requests: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        def record(request: Request) -> None:
            with self.lock:
                self.requests.append(request)

        return monitor_handler(self.last_activity.get, record)

    def posts(self, secret: str) -> list[tuple[str, str, str]]:
        with self.lock:
            return [(path, ctype, body) for method, path, auth, ctype, body in self.requests
                    if method == "POST" and auth == f"Bearer {secret}"]


@pytest.fixture
def monitor() -> Iterator[tuple[Monitor, int]]:
    m = Monitor()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), m.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield m, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


class LocalResolver:
    """Every Session's monitor is the local one (the pool's Services are another test's)."""

    def resolve(self, session: Session, lifetime: Lifetime, port: int) -> Resolution:
        return Resolution(MonitorTarget(f"http://127.0.0.1:{port}", "local"))


def test_the_tracker_pops_up_raises_last_activity_and_posts_the_message_before_deleting(
    kube: Kube, namespace: str, monitor: tuple[Monitor, int]
) -> None:
    server, port = monitor
    make_appdef(kube, namespace, "tracked", monitor={
        "port": port, "activityTracker": {"timeoutAfter": 60, "notifyAfter": 55}})
    probe = make_session(kube, namespace, "probe", "tracked")
    now = created_at(probe) + 120 * MIN
    now_ms = int(now * 1000)
    handled = {"operatorStatus": "HANDLED"}
    idle = make_session(kube, namespace, "idle", "tracked", secret="secret-idle",
                        status={**handled, "lastActivity": now_ms - 57 * 60_000})
    active = make_session(kube, namespace, "active", "tracked", secret="secret-active",
                          status={**handled, "lastActivity": now_ms - 57 * 60_000})
    stale = make_session(kube, namespace, "stale", "tracked", secret="secret-stale",
                         status={**handled, "lastActivity": now_ms - 30 * 60_000})
    silent = make_session(kube, namespace, "silent", "tracked", secret="secret-silent",
                          status={**handled, "lastActivity": now_ms - 61 * 60_000})
    # Its monitor does not answer with a time (a 404): unknown, not inactive (issue #29).
    mute = make_session(kube, namespace, "mute", "tracked", secret="secret-mute",
                        status={**handled, "lastActivity": now_ms - 61 * 60_000})
    handling = make_session(kube, namespace, "handling", "tracked", secret="secret-handling",
                            status={"operatorStatus": "HANDLING",
                                    "lastActivity": now_ms - 600 * 60_000})
    server.last_activity.update({
        "secret-idle": now_ms - 57 * 60_000,  # the same as stored: the popup
        "secret-active": now_ms - 2 * 60_000,  # higher: written, no popup
        "secret-stale": now_ms - 45 * 60_000,  # lower than stored: ignored
        "secret-silent": now_ms - 61 * 60_000,  # the IDE says idle for 61 minutes
    })

    off = TimeoutRunner(kube, [namespace], TimeoutSettings(), resolver=LocalResolver(),
                        clock=FixedClock(now)).run_once()
    assert off == PassReport(sessions=7)  # tracker off by default: nothing asked, nothing done
    assert server.requests == []

    report = TimeoutRunner(kube, [namespace], TRACKER_ON, resolver=LocalResolver(),
                           clock=FixedClock(now)).run_once()

    assert report.errors == []
    assert report.popups == [(namespace, "idle")]
    assert server.posts("secret-idle") == [("/monitor/activity/popup", "text/plain", "")]
    assert report.activity_written == [(namespace, "active", now_ms - 2 * 60_000)]
    assert parse_session(session_or_none(kube, namespace, "active") or {}).last_activity \
        == now_ms - 2 * 60_000
    assert server.posts("secret-active") == []
    assert parse_session(session_or_none(kube, namespace, "stale") or {}).last_activity \
        == stale["status"]["lastActivity"]
    assert server.posts("secret-stale") == []
    assert report.messages == [(namespace, "silent")]
    assert server.posts("secret-silent") == [("/monitor/message", "application/json", MESSAGE)]
    assert report.deleted == [(namespace, "silent", REASON_INACTIVE)]
    assert_deleted_after_normal_event(kube, namespace, silent, REASON_INACTIVE)
    # Only HANDLED Sessions are tracked; every request carried its Session's own secret.
    assert server.posts("secret-handling") == [] and session_or_none(
        kube, namespace, handling["metadata"]["name"]) is not None
    gets = [(path, auth) for method, path, auth, _, _ in server.requests if method == "GET"]
    assert sorted(gets) == sorted(
        ("/monitor/activity/lastActivity", f"Bearer secret-{n}")
        for n in ("idle", "active", "stale", "silent", "mute"))
    # The mute monitor's Session is kept, told nothing, and a Warning says why and what caps it.
    assert session_or_none(kube, namespace, "mute") is not None
    assert server.posts("secret-mute") == []
    warnings = [(e["type"], e["reason"], e["message"])
                for e in events_for(kube, namespace, mute["metadata"]["uid"])]
    assert [w[:2] for w in warnings] == [("Warning", REASON_MONITOR_UNKNOWN)], warnings
    assert "not deleted for inactivity" in warnings[0][2] and "spec.timeout" in warnings[0][2]
    assert idle["metadata"]["uid"] and active["metadata"]["uid"]


def pool_services(kube: Kube, appdef_obj: dict[str, Any], session_obj: dict[str, Any],
                  k: int) -> dict[Part, dict[str, Any]]:
    """Instance k's two Services exactly as the pool builds them for `session_obj` as holder
    (`builders.build`), created, and the Session annotated with k as a claim annotates it."""
    appdef = parse_appdefinition(appdef_obj)
    assert not isinstance(appdef, Invalid), appdef
    holder = parse_session(session_obj)
    made = {part: kube.create(build(part, appdef, k, holder=holder, proxy_template=None,
                                    settings=PoolSettings()))
            for part in (Part.INTERNAL_SERVICE, Part.EXTERNAL_SERVICE)}
    kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, holder.namespace, holder.name,
                     {"metadata": {"annotations": {v.ANNOTATION_INSTANCE_ID: str(k)}}})
    return made


def foreign_service(kube: Kube, ns: str, name: str, owner: Session,
                    labels: dict[str, str] | None = None) -> dict[str, Any]:
    return kube.create({"apiVersion": "v1", "kind": "Service",
                        "metadata": {"name": name, "namespace": ns, "labels": labels or {},
                                     "ownerReferences": [owner.owner_reference()]},
                        "spec": {"ports": [{"port": 3000}], "selector": {"app": name}}})


def test_the_default_resolver_targets_only_the_pools_service_of_the_held_instance(
    kube: Kube, namespace: str
) -> None:
    """Java asks the first Service not ending in -int owned by the Session, and sends it the
    Session's token; anyone who can create a Service gets it. Here only instance k's external
    Service the pool made for this holder is a target; any other Service owned by the Session
    is foreign, and named so that the runner can warn."""
    appdef_obj = make_appdef(kube, namespace, "java")
    lifetime = parse_lifetime(appdef_obj)
    owner_obj = make_session(kube, namespace, "owner", "java")
    owner = parse_session(owner_obj)
    # Listed before the pool's Services, not ending in -int, owned by the Session by uid:
    # Java's rule would pick it.
    foreign_service(kube, namespace, "a-thief", owner)
    made = pool_services(kube, appdef_obj, owner_obj, 2)
    owner = parse_session(session_or_none(kube, namespace, "owner") or {})
    external = made[Part.EXTERNAL_SERVICE]
    resolution = PoolServiceEndpoints(kube).resolve(owner, lifetime, 4242)
    assert resolution.target == MonitorTarget(
        f"http://{external['spec']['clusterIP']}:4242", external["metadata"]["name"])
    assert resolution.foreign == ("a-thief",)

    # The same Service with the Session's uid label edited away is not the pool's any more.
    kube.merge_patch("v1", "Service", namespace, external["metadata"]["name"],
                     {"metadata": {"labels": {v.LABEL_SESSION_UUID: "someone-else"}}})
    resolution = PoolServiceEndpoints(kube).resolve(owner, lifetime, 4242)
    assert resolution.target is None and "is not labelled" in resolution.why
    assert resolution.foreign == ("a-thief", external["metadata"]["name"])

    # A Session without an instance has no target, whatever Services it owns.
    lone = parse_session(make_session(kube, namespace, "lone", "java"))
    foreign_service(kube, namespace, "b-lone", lone)
    resolution = PoolServiceEndpoints(kube).resolve(lone, lifetime, 4242)
    assert resolution.target is None and resolution.foreign == ("b-lone",)


# --- wiring: a Session's deadlines are its own key's job (issue #29) ------------------------


def test_the_timeout_job_waits_for_the_deadline_then_ends_the_session(
    kube: Kube, namespace: str
) -> None:
    make_appdef(kube, namespace, "short", timeout=1)
    obj = make_session(kube, namespace, "s", "short")
    clock = FixedClock(created_at(obj) + 1 * MIN)
    runner = TimeoutRunner(kube, [], TimeoutSettings(), clock=clock)
    key = TimeoutKey(namespace, "s")
    early = session_timeout(runner, LiveReader(kube), key)
    # Due at creation + 2 min: the key runs again then (the queue holds the delay).
    assert early.outcome is Outcome.SCHEDULED and early.requeue_after == pytest.approx(1 * MIN)
    assert session_or_none(kube, namespace, "s") is not None
    clock.at = created_at(obj) + 2 * MIN
    due = session_timeout(runner, LiveReader(kube), key)
    assert due.outcome is Outcome.ENDED and due.requeue_after is None
    assert_deleted_after_normal_event(kube, namespace, obj, REASON_TIMED_OUT)


def test_the_scheduler_runs_no_timer(kube_api: ApiClient, namespace: str) -> None:
    app = Scheduler(lambda: Kube(kube_api), Recorder(), SchedulerConfig(namespaces=[namespace]))
    app.start()
    try:
        assert app.wait_synced(30)
        assert not hasattr(app, "timeouts")
        names = {t.name for t in app._threads}
        assert not names & {"timeouts", "schedules"}, names
        assert json.dumps(app.stats.__dict__)  # the status page still serialises
    finally:
        app.stop()
