"""Session timeouts on the cluster's clock, with hosts whose own clocks are 2 h off and a
monitor that never answers (issue #29, the first "Must show").

The whole system: a scheduler process and a worker process against the local control plane
and a real Redis, through the fault-injecting API proxy. Every process's wall clock is 2 h
fast or 2 h slow (`tests.clock_skew`: every `time.time()` is shifted, as on a host whose clock
is wrong); the timeouts run as the worker's `timeout/` jobs (issue #29). Each Session's IDE
monitor is one real TCP listener that accepts every
connection and never replies; the worker reaches it through the cluster IP of the pool's
external Service of the instance the Session holds (`tests.service_ips` stands in for
kube-proxy, which the local cluster has not, and logs the address dialled).

Deadlines are minutes; the test does not wait for them. The cluster's clock is moved instead:
the proxy adds an offset to the `Date` header of every API response (`clock_offset`), the one
place the controller reads the server's time from, while `creationTimestamp` stays the real
server's. So minutes of the cluster's time pass in a second, through the production path.

What is asserted, each time after two whole runs of each Session's timeout job that began
after the workers' reading of the clock was renewed (the run log: a positive event, never a
sleep):

1. "Just before": the cluster's time is 30 s before the hard limit (`spec.timeout` = 30 min)
   and 29 min after the Sessions became HANDLED, far beyond `timeoutAfter` (1 min), so Java's
   rule (a silent monitor counts as inactive) would have deleted them, and a leader 2 h fast
   comparing its own clock would have deleted them too. Nothing is deleted; the monitor was
   asked (through the pool's Services' cluster IPs only) and each Session got one Warning
   `ActivityUnknown` that names the cap.
2. "Just after": the cluster's time is 1 s past the hard limit. The two Sessions of the
   30-minute AppDefinition are deleted (with a Normal `SessionTimedOut`) by the first whole
   pass; a leader 2 h slow would have kept them 2 h more. The Session of the 600-minute
   AppDefinition is kept.

The bound stated (docs/lifecycle.md): a Session is deleted by the first run of its timeout
job after its deadline by the cluster's clock: its hard deadline is the key's own
`requeue_after`, a tracked Session's job runs every `WARMPOOL_TIMEOUT_INTERVAL`; late by the
`Date` header's resolution (under 1 s plus a request's round trip) and the age of the
worker's reading of the clock after a step (`CLOCK_MAX_AGE`); never before it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.pool_world import held_instance
from tests.redis_server import resolve_redis_url
from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo, free_port
from warmpool.harness import System
from warmpool.kube.api import Kube
from warmpool.pool import vocabulary as v
from warmpool.pool.timeouts import (
    REASON_INACTIVE,
    REASON_MONITOR_UNKNOWN,
    REASON_TIMED_OUT,
    epoch_seconds,
)
from warmpool.testing.world import USERS, create_appdef, create_session
from workers.handlers import CLOCK_MAX_AGE

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
HOURS_2 = 2 * 3600.0
TIMEOUT_MIN = 30  # spec.timeout of the "short" AppDefinition
LONG_MIN = 600  # of the "long" one
INTERVAL = 0.5  # s between a tracked Session's looks (WARMPOOL_TIMEOUT_INTERVAL)
MONITOR_TIMEOUT = 0.5  # s a worker waits for a monitor


class SilentMonitor:
    """A real TCP listener that accepts every connection, reads what is sent, and never
    answers: an IDE's monitor that hangs. Keeps what each connection sent (the request)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.received: list[bytes] = []
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self._open.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        data = b""
        try:
            while b"\r\n\r\n" not in data and len(data) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        with self._lock:
            self.received.append(data)
        # ...and never a reply: the connection stays open until the client gives up.

    def requests(self) -> list[bytes]:
        with self._lock:
            return list(self.received)

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        with self._lock:
            for conn in self._open:
                conn.close()


@pytest.fixture
def monitor() -> Iterator[SilentMonitor]:
    m = SilentMonitor()
    try:
        yield m
    finally:
        m.close()


def hook_dir(tmp_path: Path) -> Path:
    """A `sitecustomize` that loads the clock skew and the kube-proxy stand-in first."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import tests.clock_skew\nimport tests.service_ips\n")
    return site


def two_whole_runs(system: System, keys: list[str], skew: float) -> None:
    """Return once each key's timeout job has run twice, start to end, beginning after the
    workers' reading of the cluster's clock was renewed since the call (`CLOCK_MAX_AGE`): its
    second such run decided on the cluster's clock as it is now. (The run log's times are
    the workers' `time.time()`, `skew` off.)"""
    after = time.time() + skew + CLOCK_MAX_AGE

    def runs(key: str) -> int:
        log = system.runs
        starts = [t for t, k in log.starts() if k == key]
        ends = sum(1 for _, k in log.ends() if k == key)
        return sum(1 for t in starts[:ends] if t >= after)

    wait_for(lambda: all(runs(k) >= 2 for k in keys), timeout=60, interval=0.1,
             message=lambda: f"two runs of each of {keys}: {[runs(k) for k in keys]}")


def events(kube: Kube, ns: str, uid: str) -> list[tuple[str, str, str]]:
    items, _ = kube.list("v1", "Event", ns)
    return [(e["type"], e["reason"], e.get("message", "")) for e in items
            if (e.get("involvedObject") or {}).get("uid") == uid]


def alive(kube: Kube, ns: str, obj: dict[str, Any]) -> bool:
    """The Session is there, the same one, and not being deleted."""
    now = kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, obj["metadata"]["name"])
    return (now is not None and now["metadata"]["uid"] == obj["metadata"]["uid"]
            and not now["metadata"].get("deletionTimestamp"))


def created(obj: dict[str, Any]) -> float:
    t = epoch_seconds(obj["metadata"]["creationTimestamp"])
    assert t is not None
    return t


@pytest.mark.parametrize("skew", [HOURS_2, -HOURS_2], ids=["leader-2h-fast", "leader-2h-slow"])
def test_no_session_deleted_before_its_time_nor_kept_past_it(
    cluster: ClusterInfo, kube: Kube, namespace: str, tmp_path: Path, monitor: SilentMonitor,
    skew: float,
) -> None:
    ns = namespace
    dial_log = tmp_path / "dialled"
    env = {
        "PYTHONPATH": f"{hook_dir(tmp_path)}:{ROOT}",
        "WARMPOOL_TEST_CLOCK_SKEW": str(skew),
        "WARMPOOL_TEST_SERVICE_PORTS": str(monitor.port),
        "WARMPOOL_TEST_DIAL_LOG": str(dial_log),
        "WARMPOOL_ACTIVITY_TRACKER": "on",
        "WARMPOOL_TIMEOUT_INTERVAL": str(INTERVAL),
        "WARMPOOL_MONITOR_TIMEOUT": str(MONITOR_TIMEOUT),
        "WARMPOOL_URL_PROBE": "off",
    }
    tracker = {"port": monitor.port, "activityTracker": {"timeoutAfter": 1, "notifyAfter": 0}}
    # Every process's host clock is off: the scheduler's and the workers' (which run the
    # timeouts as keyed jobs, issue #29).
    # The workers as one `warmpool worker` command: a fresh interpreter, which loads the
    # `sitecustomize` (spawned worker processes would not).
    with System(cluster, namespaces=[ns], workers=1, threads=4, proxy=True, env=env,
                worker_command=True, redis=resolve_redis_url(), log_dir=tmp_path) as system:
        assert system.proxy is not None
        create_appdef(kube, ns, "short", min_instances=2, max_instances=3, timeout=TIMEOUT_MIN,
                      monitor=tracker)
        create_appdef(kube, ns, "long", min_instances=1, max_instances=2, timeout=LONG_MIN,
                      monitor=tracker)
        sessions = {}
        for i, (name, appdef) in enumerate((("a", "short"), ("b", "short"), ("keep", "long")),
                                           start=1):
            create_session(kube, ns, name, USERS[i], appdef)
            sessions[name] = kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name,
                                              {"spec": {"sessionSecret": f"token-{name}"}})
        def handled() -> bool:
            return all((kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, n) or {})
                       .get("status", {}).get("operatorStatus") == "HANDLED" for n in sessions)
        wait_for(handled, timeout=90, message="the three Sessions HANDLED")
        due = max(created(sessions[n]) for n in ("a", "b")) + (TIMEOUT_MIN + 1) * 60

        # 1. Just before the hard limit, 29 minutes of silence after HANDLED.
        offset_before = due - 30 - server_now(kube, ns)
        system.proxy.set(clock_offset=offset_before)
        keys = [f"timeout/{ns}/{name}" for name in sessions]
        two_whole_runs(system, keys, skew)
        for name, obj in sessions.items():
            assert alive(kube, ns, obj), f"Session {name} deleted before its time"
            warnings = [e for e in events(kube, ns, obj["metadata"]["uid"])
                        if e[0] == "Warning"]
            assert [w[1] for w in warnings] == [REASON_MONITOR_UNKNOWN], warnings
            assert "spec.timeout" in warnings[0][2] and "still applies" in warnings[0][2]
        # The monitors were asked, each only at its own instance's external Service, with its
        # Session's token; the listener never answered.
        ips = {svc_ip(kube, ns, appdef, held_instance(kube, ns, name))
               for name, appdef in (("a", "short"), ("b", "short"), ("keep", "long"))}
        dialled = {line.split()[0] for line in dial_log.read_text().splitlines()}
        assert dialled == ips, (dialled, ips)
        asked = monitor.requests()
        assert asked and all(r.startswith(b"GET /monitor/activity/lastActivity ") for r in asked)
        assert {bearer(r) for r in asked} == {f"token-{name}" for name in sessions}

        # 2. One second past it: the two short Sessions go, by the first whole pass.
        system.proxy.set(clock_offset=offset_before + 31)
        two_whole_runs(system, keys[2:], skew)  # "keep"; the short ones may be gone before twice
        for name in ("a", "b"):
            wait_for(lambda name=name: not alive(kube, ns, sessions[name]), timeout=30,
                     message=f"Session {name} deleted past its time")
        for name in ("a", "b"):
            obj = sessions[name]
            assert not alive(kube, ns, obj), f"Session {name} kept past its time"
            assert ("Normal", REASON_TIMED_OUT) in [
                e[:2] for e in events(kube, ns, obj["metadata"]["uid"])]
        assert alive(kube, ns, sessions["keep"]), "the 600-minute Session was deleted"
        assert system.dead() == []


def test_a_real_monitor_behind_the_holders_service_keeps_the_active_and_ends_the_idle(
    cluster: ClusterInfo, kube: Kube, namespace: str, tmp_path: Path,
) -> None:
    """Issue #29's third "Must show": the activity tracker against a real HTTP monitor in a
    process of its own (`tests.ide_monitor`, as in an instance's pod), reached by the worker
    through the cluster IP of the holder's external Service (no resolver of the test's). Two
    Sessions of one tracked AppDefinition (timeoutAfter 30 min); the cluster's clock moved 31
    minutes on. The IDE of one says it was used a minute ago: its lastActivity is raised to
    that and it stays. The IDE of the other says nothing newer: it gets the timeout message,
    then is deleted with a Normal event."""
    ns = namespace
    port = free_port()
    state, log, dial_log = tmp_path / "state.json", tmp_path / "requests", tmp_path / "dialled"
    state.write_text("{}")
    log.touch()
    pod = subprocess.Popen([sys.executable, "-m", "tests.ide_monitor", str(port), str(state),
                            str(log)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert pod.stdout is not None and pod.stdout.readline().strip() == "ready"
        env = {
            "PYTHONPATH": f"{hook_dir(tmp_path)}:{ROOT}",
            "WARMPOOL_TEST_SERVICE_PORTS": str(port),
            "WARMPOOL_TEST_DIAL_LOG": str(dial_log),
            "WARMPOOL_ACTIVITY_TRACKER": "on",
            "WARMPOOL_TIMEOUT_INTERVAL": str(INTERVAL),
            "WARMPOOL_MONITOR_TIMEOUT": "2",
            "WARMPOOL_URL_PROBE": "off",
        }
        tracker = {"port": port, "activityTracker": {"timeoutAfter": 30, "notifyAfter": 25}}
        with System(cluster, namespaces=[ns], workers=1, threads=4, proxy=True, env=env,
                    worker_command=True, redis=resolve_redis_url(), log_dir=tmp_path) as system:
            assert system.proxy is not None
            create_appdef(kube, ns, "tracked", min_instances=2, max_instances=3,
                          timeout=LONG_MIN, monitor=tracker)
            sessions = {}
            for i, name in enumerate(("used", "idle"), start=1):
                create_session(kube, ns, name, USERS[i], "tracked")
                sessions[name] = kube.merge_patch(
                    v.SESSION_API_VERSION, v.SESSION_KIND, ns, name,
                    {"spec": {"sessionSecret": f"token-{name}"}})

            def status(name: str) -> dict[str, Any]:
                obj = kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name) or {}
                return dict(obj.get("status") or {})

            wait_for(lambda: all(status(n).get("operatorStatus") == "HANDLED"
                                 for n in sessions), timeout=90, message="both HANDLED")
            handled_at = {n: int(status(n)["lastActivity"]) for n in sessions}
            moved = server_now(kube, ns) + 31 * 60
            used_at = int((moved - 60) * 1000)  # a minute before the moved clock's now
            state.write_text(json.dumps({"token-used": used_at,
                                         "token-idle": handled_at["idle"]}))
            system.proxy.set(clock_offset=31 * 60)

            wait_for(lambda: not alive(kube, ns, sessions["idle"]), timeout=60,
                     message="the idle Session deleted")
            assert ("Normal", REASON_INACTIVE) in [
                e[:2] for e in events(kube, ns, sessions["idle"]["metadata"]["uid"])]
            wait_for(lambda: status("used").get("lastActivity") == used_at, timeout=30,
                     message=lambda: f"lastActivity of the used Session raised to {used_at}: "
                     f"{status('used').get('lastActivity')}")
            two_whole_runs(system, [f"timeout/{ns}/used"], 0.0)
            assert alive(kube, ns, sessions["used"]), "the Session in use was deleted"
            assert system.dead() == []
        requests = [json.loads(line) for line in log.read_text().splitlines()]
        posts = {(r["token"], r["path"]) for r in requests if r["method"] == "POST"}
        assert ("token-idle", "/monitor/message") in posts, requests
        assert not any(token == "token-used" for token, _ in posts), requests
        # Reached only at each holder's own external Service, with its own token.
        ips = {svc_ip(kube, ns, "tracked", held_instance(kube, ns, "used"))}
        dialled = {line.split()[0] for line in dial_log.read_text().splitlines()}
        assert ips <= dialled and len(dialled) == 2, (dialled, ips)
        assert {r["token"] for r in requests} == {"token-used", "token-idle"}
    finally:
        pod.kill()
        pod.wait()


def server_now(kube: Kube, ns: str) -> float:
    """The API server's clock now, to the second: the creationTimestamp of an object made now."""
    probe = kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"generateName": "clock-", "namespace": ns}})
    kube.delete("v1", "ConfigMap", ns, probe["metadata"]["name"])
    return created(probe)


def svc_ip(kube: Kube, ns: str, appdef: str, k: int | None) -> str:
    assert k is not None
    ad = kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, appdef)
    assert ad is not None
    items, _ = kube.list("v1", "Service", ns)
    uid12 = ad["metadata"]["uid"][-12:]
    [svc] = [s for s in items if uid12 in s["metadata"]["name"]
             and s["metadata"]["labels"].get(v.LABEL_APP, "").endswith(f"-{k}")
             and not s["metadata"]["name"].endswith("-int")]
    return str(svc["spec"]["clusterIP"])


def bearer(request: bytes) -> str:
    for line in request.decode("latin-1").split("\r\n"):
        if line.lower().startswith("authorization: bearer "):
            return line.split(" ", 2)[2]
    return json.dumps(None)
