"""The session URL probe against a real TLS server and a real API server (issue #16 §2).

The TLS server is local, with a CA made here by the `openssl` CLI: the probe must trust it
only when given its bundle, check the hostname, follow no redirect and time out. Then the
probe's writes on the API server (`status.url` alone; the give-up's Warning event and
`status.error` 551; nothing for a same-name re-created Session), and the whole way: the
workers' `probe/` key, on a compressed schedule, writes the URL once the instance answers.
"""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.pool_world import session
from tests.waiting import wait_for
from warmpool.cluster.local import free_port
from warmpool.controller.availability import SessionWrites, fetch_status, ssl_context
from warmpool.kube.api import Kube
from warmpool.pool import vocabulary as v
from warmpool.pool.availability import (
    GIVE_UP_ERROR,
    GIVE_UP_REASON,
    ProbeTarget,
    session_url,
)
from warmpool.testing.world import create_session, delete_session


@dataclass
class Pki:
    ca: Path  # the CA's certificate: the bundle the probe is given
    cert: Path  # the server's, for DNS:localhost only, signed by the CA
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=warmpool test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    _openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=localhost", cwd=d)
    (d / "server.ext").write_text(
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext",
             cwd=d)
    return Pki(ca=d / "ca.pem", cert=d / "server.pem", key=d / "server.key")


@dataclass
class Answers:
    """What the server answers, per path: the statuses in turn, the last one repeated."""

    statuses: dict[str, list[int]] = field(default_factory=dict)
    seen: list[tuple[str, int]] = field(default_factory=list)  # (path, status answered)
    release: threading.Event = field(default_factory=threading.Event)  # for /hang/
    arrived: threading.Event = field(default_factory=threading.Event)  # /hang/ was asked
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, path: str, *statuses: int) -> None:
        with self.lock:
            self.statuses[path] = list(statuses)

    def next(self, path: str) -> int:
        with self.lock:
            queue = self.statuses.get(path, [404])
            status = queue.pop(0) if len(queue) > 1 else queue[0]
            self.seen.append((path, status))
            return status

    def paths(self) -> list[str]:
        with self.lock:
            return [p for p, _ in self.seen]

    def answered(self, path: str) -> list[int]:
        with self.lock:
            return [s for p, s in self.seen if p == path]


@dataclass
class Server:
    port: int
    answers: Answers

    @property
    def host(self) -> str:  # as an instancesHost: the name the certificate is for
        return f"localhost:{self.port}"


@pytest.fixture
def server(pki: Pki) -> Iterator[Server]:
    answers = Answers()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path == "/hang/":
                answers.arrived.set()
                answers.release.wait(30)
            status = answers.next(self.path)
            self.send_response(status)
            if status in (301, 302, 307):
                self.send_header("Location", f"https://localhost:{port}/elsewhere/")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.cert, pki.key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield Server(port, answers)
    finally:
        answers.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


# -- fetch_status: TLS, redirects, timeouts


def test_the_probe_trusts_the_servers_ca_only_when_given_its_bundle(server: Server,
                                                                     pki: Pki) -> None:
    server.answers.set("/java-app-1/", 503, 200)
    url = session_url(server.host, "/java-app-1")
    assert fetch_status(url, timeout=5) is None  # not a system CA: no request made
    assert server.answers.paths() == []
    assert fetch_status(url, ca_bundle=str(pki.ca), timeout=5) == 503
    assert fetch_status(url, ca_bundle=str(pki.ca), timeout=5) == 200
    assert server.answers.answered("/java-app-1/") == [503, 200]


def test_the_probe_checks_the_hostname(server: Server, pki: Pki) -> None:
    server.answers.set("/java-app-1/", 200)
    # The certificate is for DNS:localhost; the same server by its address is not trusted.
    assert fetch_status(f"127.0.0.1:{server.port}/java-app-1/", ca_bundle=str(pki.ca),
                        timeout=5) is None
    assert server.answers.paths() == []


def test_the_probe_follows_no_redirect(server: Server, pki: Pki) -> None:
    server.answers.set("/java-app-2/", 302)
    server.answers.set("/elsewhere/", 200)
    assert fetch_status(f"{server.host}/java-app-2/", ca_bundle=str(pki.ca), timeout=5) == 302
    assert server.answers.paths() == ["/java-app-2/"]


def test_the_probe_times_out_and_gets_no_status_from_a_closed_port(server: Server,
                                                                  pki: Pki) -> None:
    server.answers.set("/hang/", 200)
    # The server holds the request until `release`: the request reached it, and no answer
    # was sent, so the None can only be the client's timeout.
    assert fetch_status(f"{server.host}/hang/", ca_bundle=str(pki.ca), timeout=0.3) is None
    assert server.answers.arrived.is_set() and server.answers.answered("/hang/") == []
    server.answers.release.set()
    # Nothing listens on a port just bound and closed again.
    assert fetch_status(f"localhost:{free_port()}/x/", ca_bundle=str(pki.ca),
                        timeout=1) is None


def test_an_unreadable_ca_bundle_fails_at_once(tmp_path: Path) -> None:
    """What `warmpool worker` checks at start (`check_settings`): one clear error."""
    missing = tmp_path / "none.pem"
    with pytest.raises(ValueError, match=f"URL probe CA bundle {missing}"):
        ssl_context(str(missing))


# -- the probe's writes against the API server (the keyed job that makes them is
# tests/unit/test_availability.py's; the whole way is the workers' test below)


HANDLED = {"operatorStatus": v.STATUS_HANDLED, "lastActivity": 1700000000000}


def _handled_session(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    created = create_session(kube, ns, name, "user1@example.com")
    kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name, {"status": HANDLED},
                     status=True)
    return created


def _target(obj: dict[str, Any], server: Server, path: str, k: int = 1) -> ProbeTarget:
    meta = obj["metadata"]
    return ProbeTarget(namespace=meta["namespace"], session=meta["name"], uid=meta["uid"],
                       instance=k, url=session_url(server.host, path), app_definition="java")


def _events(kube: Kube, ns: str, name: str) -> list[dict[str, Any]]:
    items, _ = kube.list("v1", "Event", ns)
    return [e for e in items if e["involvedObject"].get("name") == name]


def test_the_url_write_adds_only_the_url(kube: Kube, namespace: str, server: Server) -> None:
    s1 = _handled_session(kube, namespace, "s1")
    SessionWrites(kube).write_url(_target(s1, server, "/java-app-1"))
    # Only url was added; no scheme, a trailing slash.
    assert session(kube, namespace, "s1")["status"] == {
        **HANDLED, "url": f"localhost:{server.port}/java-app-1/"}


def test_the_give_up_writes_551_and_a_warning_event(
    kube: Kube, namespace: str, server: Server,
) -> None:
    path = "/java-app-3/"
    s1 = _handled_session(kube, namespace, "s1")
    SessionWrites(kube).give_up(_target(s1, server, "/java-app-3", k=3))
    assert session(kube, namespace, "s1")["status"] == {**HANDLED, "error": GIVE_UP_ERROR}
    assert GIVE_UP_ERROR == "551:Unable to launch session within time limit."
    [event] = _events(kube, namespace, "s1")
    assert event["type"] == "Warning" and event["reason"] == GIVE_UP_REASON
    assert event["involvedObject"]["uid"] == s1["metadata"]["uid"]
    assert event["involvedObject"]["kind"] == v.SESSION_KIND
    assert f"localhost:{server.port}{path}" in event["message"]


def test_a_same_name_session_recreated_since_is_not_written(
    kube: Kube, namespace: str, server: Server,
) -> None:
    """A probe decided for the old uid (a lagging read): the writes' uid test refuses both."""
    old = _handled_session(kube, namespace, "s1")
    delete_session(kube, namespace, "s1")
    wait_for(lambda: kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, namespace, "s1") is None,
             timeout=30, message="s1 gone")
    new = _handled_session(kube, namespace, "s1")
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    writes = SessionWrites(kube)
    writes.write_url(_target(old, server, "/java-app-1"))
    writes.give_up(_target(old, server, "/java-app-1"))
    live = session(kube, namespace, "s1")
    assert live["metadata"]["uid"] == new["metadata"]["uid"]
    assert live["status"] == HANDLED  # no url, no error
    assert _events(kube, namespace, "s1") == []


def test_the_workers_write_the_url_once_the_instance_answers_through_its_route(
    cluster: Any, kube: Kube, namespace: str, server: Server, pki: Pki,
    tmp_path: Path,
) -> None:
    """End to end: scheduler and worker processes with the probe on. HANDLED comes first,
    without a URL, while the instance answers 503; the URL once it answers 200."""
    from tests.pool_world import held_instance
    from tests.redis_server import resolve_redis_url
    from warmpool.harness import System
    from warmpool.queue.settings import QueueSettings
    from warmpool.testing.world import create_appdef

    path = "/java-app-1/"
    server.answers.set(path, 503)
    env = {"WARMPOOL_INSTANCES_HOST": server.host, "WARMPOOL_URL_PROBE": "on",
           "WARMPOOL_URL_PROBE_CA_BUNDLE": str(pki.ca),
           "WARMPOOL_URL_PROBE_SCHEDULE": "400x0.1", "WARMPOOL_URL_PROBE_TIMEOUT": "2"}
    with System(cluster, namespaces=[namespace], workers=1, threads=4, resync_period=20,
                redis=resolve_redis_url(), env=env, log_dir=tmp_path,
                queue=QueueSettings(lease_ttl=3.0, heartbeat_timeout=3.0,
                                    recovery_period=0.25, drain_timeout=5)):
        create_appdef(kube, namespace, min_instances=1)
        create_session(kube, namespace, "s1", "user1@example.com")
        wait_for(lambda: (session(kube, namespace, "s1").get("status") or {}).get(
            "operatorStatus") == v.STATUS_HANDLED, timeout=60,
            message=lambda: f"s1 HANDLED: {session(kube, namespace, 's1').get('status')}")
        assert held_instance(kube, namespace, "s1") == 1
        wait_for(lambda: len(server.answers.answered(path)) >= 3, timeout=30,
                 message="the probe's GETs while the instance answers 503")
        assert "url" not in session(kube, namespace, "s1")["status"]
        server.answers.set(path, 200)
        status = wait_for(lambda: (session(kube, namespace, "s1").get("status") or {})
                          if "url" in (session(kube, namespace, "s1").get("status") or {})
                          else None, timeout=30, message="s1's URL")
        assert status["url"] == f"{server.host}{path}"
        assert status["operatorStatus"] == v.STATUS_HANDLED and "error" not in status
        assert isinstance(status.get("lastActivity"), int) and status["lastActivity"] > 0
