"""What an operator sees of a running system (issue #31, item 4), on the real control plane.

One scheduler and the production worker supervisor (`warmpool worker`, JSON logs asked for
through the setting) watch one namespace for the whole module, with a short resync:
- an invalid AppDefinition is one Warning Event whose count grows with each resync, not a
  new Event per resync;
- a claim and a release are each a Normal Event on the Session, naming the instance, never
  the user;
- the workers log the claim at INFO as JSON with its key, fence and Session uid, and no
  e-mail address anywhere;
- the supervisor answers the kubelet's probes on /healthz and /readyz.
"""

from __future__ import annotations

import contextlib
import json
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes.client import CoreV1Api
from kubernetes.client.rest import ApiException

from tests.redis_server import resolve_redis_url
from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo
from warmpool.harness import System
from warmpool.kube.api import Kube
from warmpool.pool import vocabulary as v
from warmpool.queue.settings import QueueSettings
from warmpool.testing.world import USERS, create_appdef, create_namespace, create_session

pytestmark = pytest.mark.redis

SETTLE = 60.0
RESYNC = 2  # seconds: each resync of the invalid pool reports it again


@dataclass
class Running:
    kube: Kube
    ns: str
    system: System


@pytest.fixture(scope="module")
def running(cluster: ClusterInfo, kube: Kube, kube_api: Any,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    ns = f"t-operator-view-{uuid.uuid4().hex[:6]}"
    create_namespace(kube, ns, labels={"warmpool-test": "true"}, timeout=30)
    system = System(cluster, namespaces=[ns], workers=1, threads=4, resync_period=RESYNC,
                    worker_command=True, worker_env={"WARMPOOL_LOG_FORMAT": "json"},
                    log_level="INFO", redis=resolve_redis_url(),
                    queue=QueueSettings(drain_timeout=5),
                    log_dir=tmp_path_factory.mktemp("operator-view"))
    try:
        system.start()
        yield Running(kube, ns, system)
    finally:
        system.stop()
        with contextlib.suppress(ApiException):
            CoreV1Api(kube_api).delete_namespace(ns)


def events(kube: Kube, ns: str, name: str, reason: str) -> list[dict[str, Any]]:
    items, _ = kube.list("v1", "Event", ns)
    return [e for e in items
            if e.get("reason") == reason and (e.get("involvedObject") or {}).get("name") == name]


def test_an_invalid_appdefinition_is_one_event_counted_over_resyncs(running: Running) -> None:
    kube, ns = running.kube, running.ns
    create_appdef(kube, ns, "broken", min_instances=3, max_instances=1, spec_name="broken")

    def counted() -> int:
        found = events(kube, ns, "broken", "InvalidAppDefinition")
        return max((int(e.get("count") or 0) for e in found), default=0)

    # Two resyncs at least (the first creates it, each later one raises its count).
    wait_for(lambda: counted() >= 2, timeout=SETTLE,
             message=lambda: str(events(kube, ns, "broken", "InvalidAppDefinition")))
    (event,) = events(kube, ns, "broken", "InvalidAppDefinition")
    assert event["type"] == "Warning" and "must not exceed" in event["message"]
    assert event["lastTimestamp"] >= event["firstTimestamp"]
    # And it keeps counting in the one Event, not in new ones.
    seen = int(event["count"])
    wait_for(lambda: counted() > seen, timeout=SETTLE,
             message=lambda: str(events(kube, ns, "broken", "InvalidAppDefinition")))
    assert len(events(kube, ns, "broken", "InvalidAppDefinition")) == 1


def session_status(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    obj = kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name)
    return dict((obj or {}).get("status") or {})


def test_a_claim_and_a_release_are_normal_events_and_info_logs(running: Running) -> None:
    kube, ns = running.kube, running.ns
    create_appdef(kube, ns, "java", min_instances=1, max_instances=2, spec_name="java")
    user = USERS[3]
    session = create_session(kube, ns, "s-claim", user, "java")
    uid = session["metadata"]["uid"]
    wait_for(lambda: session_status(kube, ns, "s-claim").get("operatorStatus") == "HANDLED",
             timeout=SETTLE, message=lambda: str(session_status(kube, ns, "s-claim")))
    (claimed,) = wait_for(lambda: events(kube, ns, "s-claim", "Claimed"), timeout=SETTLE,
                          message="a Claimed event on the Session")
    assert claimed["type"] == "Normal" and claimed["count"] == 1
    assert claimed["involvedObject"]["uid"] == uid
    assert "instance 1 of java" in claimed["message"] and user not in claimed["message"]

    kube.delete(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s-claim")
    (released,) = wait_for(lambda: events(kube, ns, "s-claim", "Released"), timeout=SETTLE,
                           message="a Released event on the Session")
    assert released["type"] == "Normal" and released["involvedObject"]["uid"] == uid
    assert "instance 1 of java released" in released["message"]

    # The workers' log: JSON lines, the claim at INFO with its key, fence and Session uid.
    log = running.system.worker_log.read_text()
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    claims = [r for r in lines if r.get("session_uid") == uid and "claimed" in r["msg"]]
    assert claims, "the claim is logged with the Session's uid"
    assert all(r["level"] == "INFO" and r["key"] and r["fence"] >= 1 for r in claims)
    assert any(r["msg"].startswith("Released") for r in lines if r.get("session_uid") == uid)
    assert user.lower() not in log.lower(), "no e-mail address in the workers' log"


def test_the_worker_supervisor_answers_the_kubelets_probes(running: Running) -> None:
    command = running.system.worker_command
    assert command is not None and command.health_url is not None
    base = command.health_url
    for path in ("/healthz", "/readyz"):
        with urllib.request.urlopen(base + path, timeout=10) as resp:
            assert resp.status == 200 and resp.read() == b"ok\n"
    with urllib.request.urlopen(base + "/status", timeout=10) as resp:
        body = json.loads(resp.read())
    assert body["alive"] and body["redis_error"] is None
