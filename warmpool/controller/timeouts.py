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

import logging
import os
import re
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from warmpool.controller.guard import Unguarded
from warmpool.kube.api import Conflict, Kube
from warmpool.kube.executor import Executor
from warmpool.pool import vocabulary as v
from warmpool.pool.actions import SetSessionStatus
from warmpool.pool.meta import name_of, owner_refs
from warmpool.pool.model import Lifetime, Session, parse_lifetime, parse_session
from warmpool.pool.timeouts import (
    DeleteSession,
    Popup,
    PostMessage,
    WriteLastActivity,
    activity_plan,
    hard_limit,
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


class EndpointResolver(Protocol):
    def endpoint(self, session: Session, port: int) -> str | None:
        """The base URL of `session`'s monitor (``http://<host>:<port>``), or None when it
        has no target."""


class ServiceEndpoints:
    """§5.2 step 1: the ``clusterIP`` of the first listed Service not ending in ``-int`` with an
    owner reference of kind Session naming the Session (its uid too, where the reference has
    one: a predecessor's Service is not this Session's), i.e. its eager external Service.

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

    def endpoint(self, session: Session, port: int) -> str | None:
        for service in self._of(session.namespace):
            if name_of(service).endswith("-int"):
                continue
            if not any(_names_session(ref, session) for ref in owner_refs(service)):
                continue
            ip = (service.get("spec") or {}).get("clusterIP")
            if not isinstance(ip, str) or not ip or ip == "None":
                return None
            host = f"[{ip}]" if ":" in ip else ip
            return f"http://{host}:{port}"
        return None


def _names_session(ref: Mapping[str, Any], session: Session) -> bool:
    return (ref.get("kind") == v.SESSION_KIND and ref.get("name") == session.name
            and ref.get("uid") in (None, "", session.uid))


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
    """One pass at a time (``run_once``) over `namespaces` (None in it: every namespace)."""

    def __init__(
        self, kube: Kube, namespaces: Sequence[str | None], settings: TimeoutSettings, *,
        source: TimeoutSource | None = None,
        resolver: EndpointResolver | None = None,
        monitor: MonitorClient | None = None,
        clock: Callable[[], float] = time.time,
        active: Callable[[], bool] = lambda: True,
    ) -> None:
        self.kube = kube
        self.namespaces = list(namespaces)
        self.settings = settings
        self.source: TimeoutSource = source if source is not None else LiveSource(kube)
        self.resolver = resolver  # None: a ServiceEndpoints per pass
        self.monitor: MonitorClient = (monitor if monitor is not None
                                       else HttpMonitor(settings.monitor_timeout))
        self.clock = clock
        self.active = active  # checked before each Session: a deposed leader stops at once
        self._reported: set[tuple[str, str, tuple[str, ...]]] = set()

    def run_once(self) -> PassReport:
        report = PassReport()
        resolver = self.resolver if self.resolver is not None else ServiceEndpoints(self.kube)
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
            self._decide_and_act(session, lifetimes.get((session.namespace, session.appdef)),
                                 resolver, report)
        except Exception as exc:
            log.warning("timeouts: Session %s/%s failed: %s", ns, name, exc)
            report.errors.append((ns, name, str(exc)))

    def _decide_and_act(self, session: Session, lifetime: Lifetime | None,
                        resolver: EndpointResolver, report: PassReport) -> None:
        now = self.clock()
        deletion = hard_limit(session, lifetime, now)
        if deletion is not None:
            self._delete(session, deletion, report)
            return
        if not self.settings.activity_tracker:
            return
        tracker = tracker_for(session, lifetime)
        if tracker is None or lifetime is None or lifetime.monitor_port is None:
            return
        ref = (session.namespace, session.name)
        base = resolver.endpoint(session, lifetime.monitor_port)
        if base is None:
            log.info("Session %s/%s: no monitor target (no external Service with a cluster "
                     "IP): activity not tracked this pass", *ref)
            return
        reported: int | None = None
        try:
            reported = self.monitor.last_activity(base, session.secret)
        except Exception as exc:
            log.info("Session %s/%s: the monitor did not answer: %s", *ref, exc)
        for action in activity_plan(tracker, session.last_activity, reported, now):
            match action:
                case WriteLastActivity(value=value):
                    Executor(self.kube, session.namespace, Unguarded()).apply([SetSessionStatus(
                        session.name, {"lastActivity": value}, uid=session.uid)])
                    report.activity_written.append((*ref, value))
                case Popup():
                    try:
                        self.monitor.popup(base, session.secret)
                    except Exception as exc:
                        log.info("Session %s/%s: the inactivity popup failed: %s", *ref, exc)
                    else:
                        report.popups.append(ref)
                case PostMessage(body=body):
                    try:  # a courtesy to the user: the deletion follows whatever its outcome
                        self.monitor.message(base, session.secret, body)
                    except Exception as exc:
                        log.info("Session %s/%s: the timeout message failed: %s", *ref, exc)
                    else:
                        report.messages.append(ref)
                case DeleteSession():
                    self._delete(session, action, report)

    def _delete(self, session: Session, deletion: DeleteSession, report: PassReport) -> None:
        ref = (session.namespace, session.name)
        if not session.uid:
            raise ValueError("the Session has no metadata.uid to delete it by")
        if not self.active():
            report.stopped = True
            return
        self.kube.event(session.namespace, session.owner_reference(), deletion.reason,
                        deletion.message, warning=False)
        try:
            self.kube.delete(v.SESSION_API_VERSION, v.SESSION_KIND, session.namespace,
                             session.name, uid=session.uid)
        except Conflict:
            log.info("Session %s/%s was re-created since it was read: left alone", *ref)
            report.spared.append(ref)
            return
        log.info("Session %s/%s deleted (%s): %s", *ref, deletion.reason, deletion.message)
        report.deleted.append((*ref, deletion.reason))
