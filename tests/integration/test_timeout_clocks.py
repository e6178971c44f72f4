"""Session timeouts on the cluster's clock, with a leader whose own clock is 2 h off and a
monitor that never answers (issue #29, the first "Must show").

The whole system: a scheduler process and a worker process against the local control plane
and a real Redis, through the fault-injecting API proxy. The scheduler's wall clock is 2 h fast
or 2 h slow (`tests.clock_skew`: every `time.time()` of that process is shifted, as on a host
whose clock is wrong). Each Session's IDE monitor is one real TCP listener that accepts every
connection and never replies; the scheduler reaches it through the cluster IP of the pool's
external Service of the instance the Session holds (`tests.service_ips` stands in for
kube-proxy, which the local cluster has not, and logs the address dialled).

Deadlines are minutes; the test does not wait for them. The cluster's clock is moved instead:
the proxy adds an offset to the `Date` header of every API response (`clock_offset`), the one
place the controller reads the server's time from, while `creationTimestamp` stays the real
server's. So minutes of the cluster's time pass in a second, through the production path.

What is asserted, each time after two whole timeout passes that began after the clock moved
(the scheduler's `/status` counts passes: a positive event, never a sleep):

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

The bound stated (docs/lifecycle.md): a Session is deleted by the first pass that starts after
its deadline by the cluster's clock, i.e. at most one interval plus one pass late, plus the
`Date` header's resolution (under 1 s plus a request's round trip); never before it.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.pool_world import held_instance
from tests.redis_server import resolve_redis_url
from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo
from warmpool.harness import System
from warmpool.kube.api import Kube
from warmpool.pool import vocabulary as v
from warmpool.pool.timeouts import REASON_MONITOR_UNKNOWN, REASON_TIMED_OUT, epoch_seconds
from warmpool.testing.world import USERS, create_appdef, create_session

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
HOURS_2 = 2 * 3600.0
TIMEOUT_MIN = 30  # spec.timeout of the "short" AppDefinition
LONG_MIN = 600  # of the "long" one
INTERVAL = 0.5  # s between timeout passes
MONITOR_TIMEOUT = 0.5  # s the scheduler waits for a monitor


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


def passes(system: System) -> int:
    return int(system.schedulers[0].status()["stats"]["timeout_passes"])


def two_whole_passes(system: System) -> None:
    """Return once two timeout passes have begun and ended since the call: the second one
    began after it, so it read the cluster's clock as it is now."""
    start = passes(system)
    wait_for(lambda: passes(system) >= start + 2, timeout=60, interval=0.1,
             message=lambda: f"two timeout passes after {start}: {passes(system)}")


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
    with System(cluster, namespaces=[ns], workers=1, threads=4, proxy=True, env=env,
                # Only the leader's clock is off: the workers keep the host's.
                worker_env={"WARMPOOL_TEST_CLOCK_SKEW": "0"},
                redis=resolve_redis_url(), log_dir=tmp_path) as system:
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
        two_whole_passes(system)
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
        two_whole_passes(system)
        for name in ("a", "b"):
            obj = sessions[name]
            assert not alive(kube, ns, obj), f"Session {name} kept past its time"
            assert ("Normal", REASON_TIMED_OUT) in [
                e[:2] for e in events(kube, ns, obj["metadata"]["uid"])]
        assert alive(kube, ns, sessions["keep"]), "the 600-minute Session was deleted"
        assert system.dead() == []


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
