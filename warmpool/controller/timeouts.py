"""Carry out the Session timeouts (session-lifecycle §5): one pass over the namespaces served.

A pass lists the AppDefinitions and Sessions of each namespace from the API server (the
scheduler's watch caches keep stubs without ``spec.timeout``, ``spec.monitor`` or the Sessions'
secrets, and a pass a minute is two LISTs per namespace), decides each Session with
``warmpool.pool.timeouts`` and acts:

- a deletion: a **Normal** Event on the Session first, saying which limit, then a delete with
  the Session's **uid** as precondition, so that a Session re-created under the same name since
  it was read survives (409); one already gone (404) is fine;
- the activity tracker (off unless ``WARMPOOL_ACTIVITY_TRACKER=on``): asks the Session's
  monitor for its last activity, writes a higher one (a uid-tested status patch, through the
  executor), posts the popup or the timeout message.

The clock, the monitor endpoint resolver and the HTTP client are injected; the defaults are the
real ones: the ``clusterIP`` of the Session's external Service (§5.2 step 1) and plain HTTP to
``http://<ip>:<spec.monitor.port>/monitor/...`` with ``Authorization: Bearer <sessionSecret>``.

Errors are isolated per Session: one that fails is logged and counted, and the pass goes on.
The session secret is never logged, nor is ``spec.user``.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from warmpool.controller.guard import Unguarded
from warmpool.controller.result import Later, Outcome, Result
from warmpool.keys import TimeoutKey
from warmpool.kube.api import Conflict, Kube, KubeError
from warmpool.kube.clock import ApiServerClock, ServerClock
from warmpool.kube.executor import Executor
from warmpool.kube.reader import Reader
from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.pool.actions import Report
from warmpool.pool.grammar import is_object_name
from warmpool.pool.meta import labels_of, name_of, owner_refs
from warmpool.pool.model import Lifetime, Session, parse_lifetime, parse_session
from warmpool.pool.parts import Part
from warmpool.pool.timeouts import (
    REASON_FOREIGN_SERVICE,
    REASON_MONITOR_UNKNOWN,
    ActivityAction,
    DeleteSession,
    Observation,
    Observed,
    Popup,
    PostMessage,
    Unknown,
    WriteLastActivity,
    activity_plan,
    hard_limit,
    next_look,
    read_last_activity,
    tracker_for,
)

log = logging.getLogger(__name__)

Obj = dict[str, Any]

ENABLED_SETTING = "WARMPOOL_TIMEOUTS"
INTERVAL_SETTING = "WARMPOOL_TIMEOUT_INTERVAL"
TRACKER_SETTING = "WARMPOOL_ACTIVITY_TRACKER"
MONITOR_TIMEOUT_SETTING = "WARMPOOL_MONITOR_TIMEOUT"

_ON = ("on", "true", "yes", "1")
_OFF = ("off", "false", "no", "0")


def _flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    raw = environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _ON:
        return True
    if raw in _OFF:
        return False
    raise ValueError(f"{name} must be on or off, got {environ[name]!r}")


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a positive number of seconds, got {environ[name]!r}")
    return value


@dataclass(frozen=True, slots=True)
class TimeoutSettings:
    """How the timeouts run. Java needs ``--enableMonitor`` and ``--enableActivityTracker``
    for the tracker and always runs the hard limit; here both are settings."""

    enabled: bool = True  # WARMPOOL_TIMEOUTS=on|off: the periodic pass at all
    interval: float = 60.0  # WARMPOOL_TIMEOUT_INTERVAL, seconds between passes (Java: 1 min)
    activity_tracker: bool = False  # WARMPOOL_ACTIVITY_TRACKER=on|off
    monitor_timeout: float = 5.0  # WARMPOOL_MONITOR_TIMEOUT, seconds per monitor request

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TimeoutSettings:
        """The settings from the environment (unset or empty: the default); a bad value
        raises ValueError naming the variable."""
        env = os.environ if environ is None else environ
        default = cls()
        return cls(
            enabled=_flag(env, ENABLED_SETTING, default.enabled),
            interval=_seconds(env, INTERVAL_SETTING, default.interval),
            activity_tracker=_flag(env, TRACKER_SETTING, default.activity_tracker),
            monitor_timeout=_seconds(env, MONITOR_TIMEOUT_SETTING, default.monitor_timeout),
        )


# --- what a pass reads --------------------------------------------------------------------


class TimeoutSource(Protocol):
    """Where a pass reads full AppDefinitions and Sessions (namespace None: all of them)."""

    def appdefinitions(self, namespace: str | None) -> list[Obj]: ...

    def sessions(self, namespace: str | None) -> list[Obj]: ...


class LiveSource:
    """Lists from the API server, page by page."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def _all(self, api_version: str, kind: str, namespace: str | None) -> list[Obj]:
        return [item for page, _ in self.kube.list_pages(api_version, kind, namespace)
                for item in page]

    def appdefinitions(self, namespace: str | None) -> list[Obj]:
        return self._all(v.APPDEF_API_VERSION, v.APPDEF_KIND, namespace)

    def sessions(self, namespace: str | None) -> list[Obj]:
        return self._all(v.SESSION_API_VERSION, v.SESSION_KIND, namespace)


@dataclass(frozen=True, slots=True)
class MonitorTarget:
    """Where a Session's monitor is asked: `base` (``http://<clusterIP>:<port>``) of the pool's
    Service `service` of the instance the Session holds."""

    base: str
    service: str


@dataclass(frozen=True, slots=True)
class Resolution:
    """A monitor target, or why there is none (`why`), and the names of Services that claim to
    be the Session's (an owner reference to it) but are not the pool's: ignored, reported."""

    target: MonitorTarget | None
    why: str = ""
    foreign: tuple[str, ...] = ()


class EndpointResolver(Protocol):
    def resolve(self, session: Session, lifetime: Lifetime, port: int) -> Resolution:
        """`session`'s monitor on `port`, or why it has none."""


class PoolServiceEndpoints:
    """§5.2 step 1, narrowed (issue #29): the ``clusterIP`` of the external Service the pool
    made for the instance the Session holds, and nothing else.

    Java takes the first Service not ending in ``-int`` with an owner reference naming the
    Session, and sends it the Session's bearer token: anyone who can create a Service can
    receive the token. Here the Service must be the one the pool makes for this holder:

    - named as the pool names instance k's external Service (k: the Session's instance-id
      annotation, parsed to at most 9 digits), derived from the AppDefinition's ``spec.name``
      and **uid**, so another AppDefinition's or a predecessor's Service never matches;
    - owned by the AppDefinition (its uid) and by the Session (its uid), and labelled with the
      Session's uid and instance k's selector, as the pool writes them on a claim;
    - with a ``clusterIP`` that parses as an IP address (``ipaddress``: bounded).

    Every other Service with an owner reference to the Session (its uid, or its name without
    a uid) and none to its AppDefinition is foreign, and so is one with the external Service's
    name that fails a check: never asked, named in `Resolution.foreign` for a Warning event.
    Lists each namespace's Services once, at its first use: make one per pass.
    """

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._services: dict[str, list[Obj]] = {}

    def _of(self, namespace: str) -> list[Obj]:
        if namespace not in self._services:
            self._services[namespace] = [
                item for page, _ in self.kube.list_pages("v1", "Service", namespace)
                for item in page]
        return self._services[namespace]

    def resolve(self, session: Session, lifetime: Lifetime, port: int) -> Resolution:
        k = session.instance_id
        ours: set[str] = set()
        if k is not None and lifetime.uid and lifetime.spec_name:
            external = Part.EXTERNAL_SERVICE.object_name(lifetime.spec_name, lifetime.uid, k)
            internal = Part.INTERNAL_SERVICE.object_name(lifetime.spec_name, lifetime.uid, k)
            ours = {external, internal}
        services = self._of(session.namespace)
        # Foreign: owned by the Session, not one of the two names, and not the AppDefinition's
        # either (another instance's Service in the middle of a claim is the pool's). Only
        # what is reported depends on this; the target is decided by the checks below alone.
        foreign = tuple(sorted(
            name_of(svc) for svc in services
            if name_of(svc) not in ours
            and any(_names_session(ref, session) for ref in owner_refs(svc))
            and not (lifetime.uid and any(
                ref.get("kind") == v.APPDEF_KIND and ref.get("uid") == lifetime.uid
                for ref in owner_refs(svc)))))
        if k is None:
            return Resolution(None, "the Session names no instance (annotation "
                                    f"{v.ANNOTATION_INSTANCE_ID})", foreign)
        if not ours:
            return Resolution(None, "its AppDefinition has no uid or spec.name", foreign)
        found = next((svc for svc in services if name_of(svc) == external), None)
        if found is None:
            return Resolution(None, f"no Service {external} (instance {k})", foreign)
        problem = _not_the_pools(found, session, lifetime, k)
        if problem is not None:
            return Resolution(None, f"Service {external} {problem}",
                              tuple(sorted({*foreign, external})))
        ip = _cluster_ip(found)
        if ip is None:
            return Resolution(None, f"Service {external} has no cluster IP", foreign)
        host = f"[{ip}]" if ":" in ip else ip
        return Resolution(MonitorTarget(f"http://{host}:{port}", external), "", foreign)


def _names_session(ref: Mapping[str, Any], session: Session) -> bool:
    """An owner reference that points at `session`: its uid, or its name without any uid."""
    if ref.get("kind") != v.SESSION_KIND:
        return False
    uid = ref.get("uid")
    return uid == session.uid if uid else ref.get("name") == session.name


def _not_the_pools(service: Obj, session: Session, lifetime: Lifetime, k: int) -> str | None:
    """Why `service`, named as instance k's external Service, is not the one the pool made
    for `session` (None: it is). Every check is an exact string comparison."""
    refs = owner_refs(service)
    if not any(ref.get("kind") == v.APPDEF_KIND and ref.get("uid") == lifetime.uid
               for ref in refs):
        return f"is not owned by AppDefinition {lifetime.name} (uid {lifetime.uid})"
    if not any(ref.get("kind") == v.SESSION_KIND and ref.get("uid") == session.uid
               for ref in refs):
        return "is not owned by this Session (its uid)"
    labels = labels_of(service)
    if labels.get(v.LABEL_SESSION_UUID) != session.uid:
        return f"is not labelled {v.LABEL_SESSION_UUID}={session.uid}"
    if labels.get(v.LABEL_APP) != naming.app_selector(lifetime.spec_name, k):
        return f"does not select instance {k}"
    return None


def _cluster_ip(service: Obj) -> str | None:
    """``spec.clusterIP`` when it is one IP address (the only bound needed: the text is put in
    a URL's host), else None ("None" for a headless Service, missing, anything else)."""
    ip = (service.get("spec") or {}).get("clusterIP")
    if not isinstance(ip, str) or len(ip) > 45:
        return None
    try:
        return str(ipaddress.ip_address(ip))
    except ValueError:
        return None


class MonitorClient(Protocol):
    """The three monitor calls of §5.2. Any failure raises; the runner logs it."""

    def last_activity(self, base: str, secret: str) -> int | None:
        """``GET <base>/monitor/activity/lastActivity``: epoch ms, None if not a 200 with
        a number."""

    def popup(self, base: str, secret: str) -> None:
        """``POST <base>/monitor/activity/popup``, an empty text/plain body."""

    def message(self, base: str, secret: str, body: str) -> None:
        """``POST <base>/monitor/message`` with the JSON `body`."""


_EPOCH_MS = re.compile(r"[0-9]{1,18}")


class HttpMonitor:
    """The monitor over plain HTTP (the Session's Service, inside the cluster). Environment
    proxies are ignored: a cluster IP is never reached through one."""

    def __init__(self, timeout: float = 5.0) -> None:
        self.timeout = timeout
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _send(self, url: str, secret: str, data: bytes | None,
              content_type: str | None) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {secret}"}
        if content_type:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(url, data=data, headers=headers,
                                         method="GET" if data is None else "POST")
        with self._opener.open(request, timeout=self.timeout) as response:
            return int(response.status), bytes(response.read(1024))

    def last_activity(self, base: str, secret: str) -> int | None:
        status, body = self._send(f"{base}/monitor/activity/lastActivity", secret, None, None)
        text = body.decode("ascii", "replace").strip()
        return int(text) if status == 200 and _EPOCH_MS.fullmatch(text) else None

    def popup(self, base: str, secret: str) -> None:
        self._send(f"{base}/monitor/activity/popup", secret, b"", "text/plain")

    def message(self, base: str, secret: str, body: str) -> None:
        self._send(f"{base}/monitor/message", secret, body.encode(), "application/json")


# --- the pass -----------------------------------------------------------------------------

SessionRef = tuple[str, str]  # (namespace, name)


@dataclass
class PassReport:
    """What one pass did (tests, logs, metrics)."""

    sessions: int = 0
    deleted: list[tuple[str, str, str]] = field(default_factory=list)  # (ns, name, reason)
    spared: list[SessionRef] = field(default_factory=list)  # re-created before the delete
    activity_written: list[tuple[str, str, int]] = field(default_factory=list)
    popups: list[SessionRef] = field(default_factory=list)
    messages: list[SessionRef] = field(default_factory=list)
    errors: list[tuple[str, str, str]] = field(default_factory=list)  # (ns, name, error)
    stopped: bool = False  # no longer leading: the pass ended early


class TimeoutRunner:
    """One pass at a time (``run_once``) over `namespaces` (None in it: every namespace).

    `clock` is the cluster's (`warmpool.kube.clock.ApiServerClock` on `kube` by default): no
    deadline is compared with this host's wall clock, and a pass that cannot read the server's
    time decides nothing."""

    def __init__(
        self, kube: Kube, namespaces: Sequence[str | None], settings: TimeoutSettings, *,
        source: TimeoutSource | None = None,
        resolver: EndpointResolver | None = None,
        monitor: MonitorClient | None = None,
        clock: ServerClock | None = None,
        active: Callable[[], bool] = lambda: True,
    ) -> None:
        self.kube = kube
        self.namespaces = list(namespaces)
        self.settings = settings
        self.source: TimeoutSource = source if source is not None else LiveSource(kube)
        self.resolver = resolver  # None: a PoolServiceEndpoints per pass
        self.monitor: MonitorClient = (monitor if monitor is not None
                                       else HttpMonitor(settings.monitor_timeout))
        self.clock: ServerClock = clock if clock is not None else ApiServerClock(kube)
        self.active = active  # checked before each Session: a deposed leader stops at once
        self._reported: set[tuple[str, str, tuple[str, ...]]] = set()
        # Warning events already recorded by this runner, (Session uid, reason, detail): one
        # per distinct finding, not one a pass.
        self._warned: set[tuple[str, str, str]] = set()

    def run_once(self) -> PassReport:
        """One pass. Raises ClockUnavailable, deciding nothing, when the API server's time
        cannot be read: a pass without the cluster's clock is no pass (the caller counts it
        as an error)."""
        report = PassReport()
        # The server's time, read afresh at each pass (one GET); within the pass it is
        # carried forward on the monotonic clock.
        self.clock.sync()
        resolver = self.resolver if self.resolver is not None else PoolServiceEndpoints(self.kube)
        for namespace in self.namespaces:
            try:
                lifetimes = self._lifetimes(self.source.appdefinitions(namespace))
                sessions = self.source.sessions(namespace)
            except Exception as exc:
                log.warning("timeouts: reading namespace %s failed: %s", namespace or "*", exc)
                report.errors.append((namespace or "", "", str(exc)))
                continue
            for obj in sessions:
                if not self.active():
                    report.stopped = True
                    return report
                self._one(obj, lifetimes, resolver, report)
        return report

    def _lifetimes(self, objects: Iterable[Obj]) -> dict[tuple[str, str], Lifetime]:
        found: dict[tuple[str, str], Lifetime] = {}
        for obj in objects:
            lifetime = parse_lifetime(obj)
            found[(lifetime.namespace, lifetime.name)] = lifetime
            key = (lifetime.namespace, lifetime.name, lifetime.problems)
            if lifetime.problems and key not in self._reported:
                self._reported.add(key)  # once per distinct problem, not every pass
                log.warning("AppDefinition %s/%s: %s", lifetime.namespace, lifetime.name,
                            "; ".join(lifetime.problems))
        return found

    def _one(self, obj: Obj, lifetimes: Mapping[tuple[str, str], Lifetime],
             resolver: EndpointResolver, report: PassReport) -> None:
        report.sessions += 1
        ns = name = ""
        try:
            session = parse_session(obj)
            ns, name = session.namespace, session.name
            # status.lastActivity raw: bounded by read_last_activity (an integer up to now).
            raw = (obj.get("status") or {}).get("lastActivity") if isinstance(
                obj.get("status"), dict) else None
            self.decide_and_act(session, raw, lifetimes.get((session.namespace,
                                                             session.appdef)),
                                resolver, report)
        except Exception as exc:
            log.warning("timeouts: Session %s/%s failed: %s", ns, name, exc)
            report.errors.append((ns, name, str(exc)))

    def _warn(self, session: Session, reason: str, detail: str, message: str) -> None:
        """A Warning event on `session`, once per (Session, reason, detail) for this runner,
        through the executor's event path (`Report`)."""
        key = (session.uid, reason, detail)
        if key in self._warned:
            return
        self._warned.add(key)
        Executor(self.kube, session.namespace, Unguarded()).apply([Report(
            reason, f"Session {session.name}: {message}",
            regarding=session.owner_reference())])

    def _observe(self, session: Session, lifetime: Lifetime, port: int,
                 resolver: EndpointResolver) -> tuple[Observation, MonitorTarget | None]:
        """Ask the Session's monitor, only at the pool's Service of its instance. Every failure
        is `Unknown`: silence is not inactivity."""
        resolution = resolver.resolve(session, lifetime, port)
        for service in resolution.foreign:
            self._warn(session, REASON_FOREIGN_SERVICE, service,
                       f"Service {service} has an owner reference to this Session "
                       "(metadata.ownerReferences) but is not the pool's Service of its "
                       "instance: ignored, the activity monitor is never asked there")
        target = resolution.target
        if target is None:
            return Unknown(f"no monitor target: {resolution.why}"), None
        try:
            reported = self.monitor.last_activity(target.base, session.secret)
        except Exception as exc:
            return Unknown(f"the monitor at Service {target.service} did not answer: "
                           f"{type(exc).__name__}: {str(exc)[:200]}"), target
        if reported is None:
            return Unknown(f"the monitor at Service {target.service} answered without an "
                           "epoch-ms number"), target
        return Observed(reported), target

    def decide_and_act(self, session: Session, raw_last_activity: object,
                       lifetime: Lifetime | None, resolver: EndpointResolver,
                       report: PassReport) -> None:
        """Decide `session` on the cluster's clock and carry it out; what was done goes into
        `report` (`deleted`, `spared`, ...). Raises ClockUnavailable deciding nothing."""
        now = self.clock.now()
        deletion = hard_limit(session, lifetime, now)
        if deletion is not None:
            self._delete(session, deletion, report, by_version=False)
            return
        if not self.settings.activity_tracker:
            return
        tracker = tracker_for(session, lifetime)
        if tracker is None or lifetime is None or lifetime.monitor_port is None:
            return
        observation, target = self._observe(session, lifetime, lifetime.monitor_port, resolver)
        if isinstance(observation, Unknown):
            self._warn_unknown(session, lifetime, observation)
        now = self.clock.now()  # asking the monitor takes time: decide on the time after it
        stored = read_last_activity(raw_last_activity, now)
        for action in activity_plan(tracker, stored, observation, now):
            self._act(session, raw_last_activity, action, target, report)

    def _warn_unknown(self, session: Session, lifetime: Lifetime, observation: Unknown) -> None:
        """Logged each pass, and a Warning once per Session: its activity cannot be observed,
        so it is not deleted for inactivity meanwhile."""
        log.info("Session %s/%s: activity unknown (%s)", session.namespace, session.name,
                 observation.why)
        cap = (f"spec.timeout ({lifetime.timeout} minutes from creation) still applies"
               if lifetime.timeout is not None and lifetime.timeout > 0 else
               f"AppDefinition {lifetime.name} has no spec.timeout: nothing ends it")
        # Once per Session: the reason may change from pass to pass (an error's text).
        self._warn(session, REASON_MONITOR_UNKNOWN, "",
                   f"its activity cannot be observed ({observation.why}): it is not "
                   f"deleted for inactivity while it is unknown; {cap}")

    def _act(self, session: Session, raw_last_activity: object, action: ActivityAction,
             target: MonitorTarget | None, report: PassReport) -> None:
        """Carry out one step of the activity tracker's plan for `session`."""
        ref = (session.namespace, session.name)
        match action:
            case Report():
                self._warn(session, action.reason, repr(raw_last_activity)[:64],
                           action.message)
            case WriteLastActivity(value=value):
                if self._write_last_activity(session, value):
                    report.activity_written.append((*ref, value))
            case Popup():
                assert target is not None, "no popup without an observation"
                try:
                    self.monitor.popup(target.base, session.secret)
                except Exception as exc:
                    log.info("Session %s/%s: the inactivity popup failed: %s", *ref, exc)
                else:
                    report.popups.append(ref)
            case PostMessage(body=body):
                assert target is not None, "no deletion for inactivity without one"
                try:  # a courtesy to the user: the deletion follows whatever its outcome
                    self.monitor.message(target.base, session.secret, body)
                except Exception as exc:
                    log.info("Session %s/%s: the timeout message failed: %s", *ref, exc)
                else:
                    report.messages.append(ref)
            case DeleteSession():
                self._delete(session, action, report, by_version=True)

    def _write_last_activity(self, session: Session, value: int) -> bool:
        """Set ``status.lastActivity`` to `value`, refused by the server (422) unless the
        Session still has the uid and the resourceVersion this decision read: a pass decided on
        a stale read (a deposed leader's, or one racing a newer value) writes nothing."""
        if not session.uid or not session.resource_version:
            raise ValueError("the Session was read without its uid or resourceVersion")
        try:
            self.kube.json_patch(v.SESSION_API_VERSION, v.SESSION_KIND, session.namespace,
                                 session.name, [
                                     {"op": "test", "path": "/metadata/uid", "value": session.uid},
                                     {"op": "test", "path": "/metadata/resourceVersion",
                                      "value": session.resource_version},
                                     {"op": "add", "path": "/status/lastActivity",
                                      "value": value}], status=True)
        except KubeError as exc:
            if exc.status not in (404, 422):
                raise
            log.info("Session %s/%s changed or went away since it was read: lastActivity "
                     "not written", session.namespace, session.name)
            return False
        return True

    def _delete(self, session: Session, deletion: DeleteSession, report: PassReport, *,
                by_version: bool) -> None:
        """Delete `session`, preconditioned on its uid (a Session re-created under the name
        survives) and, for inactivity (`by_version`), on the resourceVersion the decision read:
        a lastActivity raised since refuses the delete (409). The hard limit counts from the
        immutable creationTimestamp, so the uid is enough there."""
        ref = (session.namespace, session.name)
        if not session.uid:
            raise ValueError("the Session has no metadata.uid to delete it by")
        if by_version and not session.resource_version:
            raise ValueError("the Session has no metadata.resourceVersion to delete it by")
        if not self.active():
            report.stopped = True
            return
        self.kube.event(session.namespace, session.owner_reference(), deletion.reason,
                        deletion.message, warning=False)
        try:
            self.kube.delete(v.SESSION_API_VERSION, v.SESSION_KIND, session.namespace,
                             session.name, uid=session.uid,
                             resource_version=session.resource_version if by_version else None)
        except Conflict:
            log.info("Session %s/%s changed or was re-created since it was read: left alone",
                     *ref)
            report.spared.append(ref)
            return
        log.info("Session %s/%s deleted (%s): %s", *ref, deletion.reason, deletion.message)
        report.deleted.append((*ref, deletion.reason))


# --- one Session, as a keyed job (issue #29: time is a key) -----------------------------------

#: A deletion refused because the Session changed since it was read (its lastActivity raised:
#: a status write, which queues nothing) is decided again this much later, on a newer read.
AGAIN_AFTER = 1.0
#: The least a Session's job waits for its next look: the cluster's clock as read lags the
#: server's by up to a second, so a run a moment before a deadline looks again this much later.
MIN_WAIT = 0.1


def session_timeout(runner: TimeoutRunner, reader: Reader, key: TimeoutKey) -> Result:
    """The job of ``timeout/<ns>/<session>``: end the Session if it is past a limit, else
    return its next deadline as `requeue_after` (`warmpool.pool.timeouts.next_look`), so the
    queue, not a pass of the leader, wakes it then, on whichever worker takes the key.

    Reads the Session and its AppDefinition as the job's reader has them (a worker's cache:
    the Session's status.lastActivity as written, which the parsed model does not keep), and
    decides on the cluster's clock (`runner.clock`). Every write it makes carries its
    precondition (`TimeoutRunner._delete`, `_write_last_activity`): a deletion decided on a
    stale read is refused by the API server, and then decided again `AGAIN_AFTER` later."""
    obj = reader.object(v.SESSION_KIND, key.namespace, key.session)
    if obj is None or not runner.settings.enabled:
        return Result(Outcome.SKIPPED, message="no such Session" if obj is None else
                      "timeouts are off (WARMPOOL_TIMEOUTS)")
    session = parse_session(obj)
    appdef = reader.object(v.APPDEF_KIND, key.namespace, session.appdef) if is_object_name(
        session.appdef) else None
    lifetime = parse_lifetime(appdef) if appdef is not None else None
    status = obj.get("status")
    raw = status.get("lastActivity") if isinstance(status, dict) else None
    report = PassReport(sessions=1)
    resolver = (runner.resolver if runner.resolver is not None
                else PoolServiceEndpoints(runner.kube))
    runner.decide_and_act(session, raw, lifetime, resolver, report)
    if report.deleted:
        return Result(Outcome.ENDED, message=report.deleted[0][2])
    if report.spared:
        return Result(Outcome.SCHEDULED, requeue_after=AGAIN_AFTER,
                      message="changed since it was read: decided again")
    now = runner.clock.now()
    poll = runner.settings.interval if runner.settings.activity_tracker else None
    when = next_look(session, lifetime, now, poll=poll)
    return Result(Outcome.SCHEDULED,
                  requeue_after=None if when is None else max(MIN_WAIT, when - now))


def session_timers(reader: Reader, namespace: str, appdef_name: str, sessions: list[Session],
                   settings: TimeoutSettings) -> list[Later]:
    """The timeout keys of a pool's Sessions, each due at its next look (`next_look`): what
    the pool's job hands the queue on every run, so a key Redis lost (or that was never
    added) is derived from the cluster again. The queue's `add_after` only moves a waiting
    key earlier, so a key already waiting for its deadline is left as it is."""
    if not settings.enabled or not sessions:
        return []
    appdef = reader.object(v.APPDEF_KIND, namespace, appdef_name)
    lifetime = parse_lifetime(appdef) if appdef is not None else None
    poll = settings.interval if settings.activity_tracker else None
    now = reader.now().timestamp()
    timers: list[Later] = []
    for session in sessions:
        when = next_look(session, lifetime, now, poll=poll)
        if when is not None:
            timers.append((TimeoutKey(namespace, session.name), max(0.0, when - now)))
    return timers
