"""Bad input, case by case: each gets a precise status, event or exit message; nothing else moves.

Resource cases run against the real thing: one scheduler process and two worker processes
watch a namespace for the whole module. Next to the cases lives a control pool whose Session
holds an instance; after every case the controller must still run (every process alive) and
the control instance must be exactly as it was (uids, owners, labels, allow-list), so a bad
object can neither crash the controller nor make it touch what a live Session owns.

Configuration cases run `warmpool worker` and `warmpool scheduler` as a person would, with one
thing wrong each (a bad Redis URL, an unreachable server, an unknown namespace, rejected
credentials): each must exit non-zero within seconds with one line saying what is wrong, and
no traceback.
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from kubernetes.client import AppsV1Api, CoreV1Api
from kubernetes.client.rest import ApiException

from tests.pool_world import emails, instance_objects, snapshot
from tests.redis_server import resolve_redis_url
from tests.waiting import wait_for
from warmpool.cluster.local import ClusterInfo
from warmpool.harness import System
from warmpool.invariants import check
from warmpool.keys import SessionKey
from warmpool.kube.api import Kube, KubeError
from warmpool.pool import builders, naming
from warmpool.pool import vocabulary as v
from warmpool.pool.model import AppDefinition, parse_appdefinition
from warmpool.pool.parts import Part
from warmpool.queue.redis_conn import connect as redis_connect
from warmpool.queue.settings import QueueSettings
from warmpool.testing.world import (
    USERS,
    appdef_body,
    create_appdef,
    create_namespace,
    create_session,
    session_body,
    session_spec,
)

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
SETTLE = 60.0  # generous: the controller acts in well under a second when idle


# --- the controller under test, for the whole module -----------------------------------------


@dataclass
class Controller:
    kube: Kube
    ns: str
    system: System
    control: dict[str, Any] = field(default_factory=dict)

    def alive(self) -> list[str]:
        """What died (empty when the controller still runs whole)."""
        return self.system.dead()


def valid_spec(spec_name: str, /, **changes: Any) -> dict[str, Any]:
    spec = {"name": spec_name, "image": "theiacloud/theia-cloud-demo:1.0", "uid": 101, "port": 3000,
            "ingressname": "theia-cloud-demo-ws-ingress", "minInstances": 1, "maxInstances": 3,
            "requestsCpu": "100m", "requestsMemory": "64Mi", "limitsCpu": "1",
            "limitsMemory": "512Mi"}
    for key, value in changes.items():
        if value is DROP:
            spec.pop(key, None)
        else:
            spec[key] = value
    return spec


DROP = object()


def status_of(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    obj = kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name)
    assert obj is not None, f"Session {name} is gone"
    return obj.get("status") or {}


def events_about(kube: Kube, ns: str, name: str, reason: str) -> list[str]:
    items, _ = kube.list("v1", "Event", ns)
    return [e.get("message", "") for e in items
            if e.get("reason") == reason and (e.get("involvedObject") or {}).get("name") == name]


def wait_status(kube: Kube, ns: str, name: str, status: str, text: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        st = status_of(kube, ns, name)
        ok = st.get("operatorStatus") == status and text in (st.get("operatorMessage") or "")
        return st if ok else None
    return wait_for(done, timeout=SETTLE, interval=0.2,
                    message=lambda: f"Session {name} {status} with {text!r}: "
                                    f"{status_of(kube, ns, name)}")


@pytest.fixture(scope="module")
def controller(cluster: ClusterInfo, kube: Kube, kube_api: Any,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    core = CoreV1Api(kube_api)
    ns = f"t-bad-input-{uuid.uuid4().hex[:6]}"
    create_namespace(kube, ns, labels={"warmpool-test": "true"}, timeout=30)
    # The whole system, its handlers' runs logged (`workers.runlog`, the harness's default):
    # a case proves that nothing moved after the job it caused has run, not after a sleep.
    system = System(cluster, namespaces=[ns], workers=2, threads=4, resync_period=20,
                    redis=resolve_redis_url(),
                    queue=QueueSettings(lease_ttl=3.0, heartbeat_timeout=3.0,
                                        recovery_period=0.25, drain_timeout=5),
                    log_dir=tmp_path_factory.mktemp("bad-input"))
    ctl = Controller(kube, ns, system)
    try:
        system.start()
        # The control pool: one instance held by a live Session, one free.
        create_appdef(kube, ns, "control", min_instances=2, spec_name="control")
        create_session(kube, ns, "control-s", USERS[1], "control")
        wait_status(kube, ns, "control-s", "HANDLED", "Instance")
        wait_for(lambda: check(kube, ns) == [], timeout=SETTLE,
                 message=lambda: str(check(kube, ns)))
        ctl.control = snapshot(kube, ns, "control", 1)
        yield ctl
    finally:
        system.stop()
        with contextlib.suppress(ApiException):
            core.delete_namespace(ns)


@pytest.fixture
def ctl(controller: Controller) -> Iterator[Controller]:
    """After each case: the controller still runs, and the control instance is untouched."""
    yield controller
    assert controller.alive() == [], f"the controller lost {controller.alive()}"
    assert snapshot(controller.kube, controller.ns, "control", 1) == controller.control, \
        "a bad input made the controller touch the control Session's instance"
    st = status_of(controller.kube, controller.ns, "control-s")
    assert st.get("operatorStatus") == "HANDLED"


# --- AppDefinitions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BadAppDef:
    id: str
    changes: dict[str, Any]
    message: str  # in the InvalidAppDefinition event and the waiting Session's status


BAD_APPDEFS = [
    BadAppDef("min-negative", {"minInstances": -1}, "spec.minInstances must be >= 0, got -1"),
    BadAppDef("min-string", {"minInstances": "2"},
              "spec.minInstances must be an integer, got '2'"),
    BadAppDef("min-word", {"minInstances": "abc"},
              "spec.minInstances must be an integer, got 'abc'"),
    BadAppDef("min-float", {"minInstances": 1.5},
              "spec.minInstances must be an integer, got 1.5"),
    BadAppDef("min-bool", {"minInstances": True},
              "spec.minInstances must be an integer, got True"),
    BadAppDef("min-missing", {"minInstances": DROP}, "spec.minInstances is missing"),
    BadAppDef("max-missing", {"maxInstances": DROP}, "spec.maxInstances is missing"),
    BadAppDef("min-above-max", {"minInstances": 5, "maxInstances": 2},
              "spec.minInstances (5) must not exceed spec.maxInstances (2)"),
    BadAppDef("max-negative", {"minInstances": 0, "maxInstances": -3},
              "spec.minInstances (0) must not exceed spec.maxInstances (-3)"),
    BadAppDef("port-missing", {"port": DROP}, "spec.port is missing"),
    BadAppDef("port-out-of-range", {"port": 70000},
              "spec.port must be a TCP port (1-65535), got 70000"),
    BadAppDef("port-zero", {"port": 0}, "spec.port must be a TCP port (1-65535), got 0"),
    BadAppDef("image-missing", {"image": DROP}, "spec.image is missing"),
    BadAppDef("image-blank", {"image": "   "}, "spec.image is missing"),
    BadAppDef("name-missing", {"name": DROP}, "spec.name must match"),
    # issue #15, item 6: a hard cap on the pool size
    BadAppDef("max-above-ceiling", {"maxInstances": 1_000_000},
              "spec.maxInstances (1000000) is above the ceiling of 5000 instances"),
    BadAppDef("min-above-ceiling", {"minInstances": 1_000_000, "maxInstances": 1_000_000},
              "spec.minInstances (1000000) is above the ceiling of 5000 instances"),
    # item 9: fields that go verbatim into every Deployment
    BadAppDef("cpu-word", {"requestsCpu": "lots"},
              "spec.requestsCpu must be a Kubernetes quantity"),
    BadAppDef("memory-with-space", {"limitsMemory": "1 Gi"},
              "spec.limitsMemory must be a Kubernetes quantity"),
    BadAppDef("memory-mb", {"requestsMemory": "64MB"},
              "spec.requestsMemory must be a Kubernetes quantity"),
    BadAppDef("limit-negative", {"limitsCpu": "-1"}, "spec.limitsCpu must not be negative"),
    BadAppDef("request-above-limit", {"requestsMemory": "1Gi", "limitsMemory": "512Mi"},
              "spec.requestsMemory ('1Gi') must not exceed spec.limitsMemory ('512Mi')"),
    BadAppDef("pull-policy-lower-case", {"imagePullPolicy": "always"},
              "spec.imagePullPolicy must be one of Always, IfNotPresent, Never"),
    BadAppDef("uid-negative", {"uid": -1},
              "spec.uid (the pod's runAsUser) must be between 0 and 2147483647"),
    BadAppDef("uid-above-int32", {"uid": 2**31},
              "spec.uid (the pod's runAsUser) must be between 0 and 2147483647"),
    BadAppDef("image-trailing-space", {"image": "theiacloud/theia-cloud-demo:1.0 "},
              "spec.image must not contain whitespace"),
    BadAppDef("port-of-the-proxy", {"port": 5000}, "spec.port must not be 5000"),
]


@pytest.mark.parametrize("case", BAD_APPDEFS, ids=lambda c: c.id)
def test_invalid_appdefinition_gets_an_event_and_its_sessions_wait(
    ctl: Controller, case: BadAppDef
) -> None:
    kube, ns = ctl.kube, ctl.ns
    name = f"ad-{case.id}"
    spec = valid_spec(name, **case.changes)
    kube.create(appdef_body(ns, name, spec))
    create_session(kube, ns, f"s-{case.id}", USERS[2], name)
    wait_for(lambda: any(case.message in m for m in events_about(kube, ns, name,
                                                                 "InvalidAppDefinition")),
             timeout=SETTLE, message=lambda: f"InvalidAppDefinition event with {case.message!r}: "
             f"{events_about(kube, ns, name, 'InvalidAppDefinition')}")
    st = wait_status(kube, ns, f"s-{case.id}", "HANDLING", "is invalid")
    assert case.message in st["operatorMessage"]
    assert instance_objects(kube, ns, name, 1) == {}, "an invalid pool must not be built"


BROKEN_LATER = [
    BadAppDef("lowered-below-zero", {"minInstances": -1}, "spec.minInstances must be >= 0"),
    BadAppDef("inverted", {"minInstances": 3, "maxInstances": 1}, "must not exceed"),
    BadAppDef("not-a-number", {"minInstances": "many"}, "must be an integer"),
    BadAppDef("image-removed", {"image": None}, "spec.image is missing"),
    # issue #15, item 9: a spec change with a bad quantity deleted every free Deployment,
    # whose re-creation then failed forever
    BadAppDef("cpu-quantity", {"limitsCpu": "two"}, "spec.limitsCpu must be a Kubernetes quantity"),
    BadAppDef("pull-policy", {"imagePullPolicy": "Sometimes"},
              "spec.imagePullPolicy must be one of"),
    BadAppDef("cpu-request-above-limit", {"requestsCpu": "4", "limitsCpu": "1"},
              "spec.requestsCpu ('4') must not exceed spec.limitsCpu ('1')"),
    # item 6: raised past the ceiling, the pool is left as it is (no million ids enumerated)
    BadAppDef("above-ceiling", {"minInstances": 1_000_000, "maxInstances": 1_000_000},
              "is above the ceiling of 5000 instances"),
]


@pytest.mark.parametrize("case", BROKEN_LATER, ids=lambda c: c.id)
def test_appdefinition_broken_while_in_use_is_left_as_it_is(
    ctl: Controller, case: BadAppDef
) -> None:
    """A pool with a live Session whose AppDefinition turns invalid: reported, nothing moves."""
    kube, ns = ctl.kube, ctl.ns
    name = f"live-{case.id}"
    create_appdef(kube, ns, name, min_instances=2, max_instances=3, spec_name=name)
    sname = f"s-{case.id}"
    create_session(kube, ns, sname, USERS[3], name)
    wait_status(kube, ns, sname, "HANDLED", "Instance")
    wait_for(lambda: len(instance_objects(kube, ns, name, 2)) == 5, timeout=SETTLE)
    before = {k: snapshot(kube, ns, name, k) for k in (1, 2)}
    kube.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, name,
                     {"spec": {k: (None if val is DROP else val)
                               for k, val in case.changes.items()}})
    wait_for(lambda: any(case.message in m for m in events_about(kube, ns, name,
                                                                 "InvalidAppDefinition")),
             timeout=SETTLE, message=f"InvalidAppDefinition event with {case.message!r}")
    held_status = status_of(kube, ns, sname)
    touch_and_settle(ctl, sname)  # its claim job runs again, against an invalid AppDefinition
    assert {k: snapshot(kube, ns, name, k) for k in (1, 2)} == before
    after = status_of(kube, ns, sname)
    assert (after.get("operatorStatus"), after.get("operatorMessage")) == (
        held_status["operatorStatus"], held_status["operatorMessage"]), \
        "the status of a Session that holds an instance was rewritten"


# (field, value, exact): with `exact`, the API server's verdict on a Deployment carrying the value
# must equal parse_appdefinition's; without it, only a value the server refuses must be refused
# (the parser may be stricter: whitespace inside an image, huge exponents, "." or "Mi" for 0).
DEPLOYMENT_FIELDS: list[tuple[str, Any, bool]] = [
    *((f, q, True) for f, q in [
        ("requestsCpu", "100m"), ("requestsCpu", "2"), ("requestsCpu", ".5"),
        ("requestsCpu", "1."), ("requestsCpu", "+1"), ("requestsCpu", "100n"),
        ("requestsCpu", "5u"), ("limitsCpu", "1e3"), ("requestsCpu", "1E-3"),
        ("limitsCpu", "lots"), ("limitsCpu", "-1"), ("limitsCpu", "1,5"),
        ("limitsCpu", "0x10"), ("limitsCpu", "1_000"), ("limitsCpu", "1e"),
        ("requestsMemory", "64Mi"), ("requestsMemory", "0.5Gi"), ("requestsMemory", "1k"),
        ("requestsMemory", "1Ki"), ("requestsMemory", "64MB"), ("requestsMemory", "64mi"),
        ("requestsMemory", "1ki"), ("requestsMemory", "1e3Mi"), ("limitsMemory", "1 Gi"),
        ("limitsMemory", "2Ei"), ("limitsMemory", "-1Gi"), ("limitsMemory", "nan"),
        ("limitsMemory", "Infinity"), ("limitsMemory", "\u0661"),
    ]),
    ("imagePullPolicy", "Always", True), ("imagePullPolicy", "Never", True),
    ("imagePullPolicy", "always", True), ("imagePullPolicy", "Sometimes", True),
    ("uid", 0, True), ("uid", -1, True), ("uid", 2**31 - 1, True), ("uid", 2**31, True),
    ("image", "theiacloud/theia-cloud-demo:1.0 ", False),
    ("image", " theiacloud/theia-cloud-demo:1.0", False),
    ("image", "theia cloud", False),
    ("requestsCpu", "1e61", False),
    # apimachinery reads these as 0; a person who wrote them meant something else
    ("limitsCpu", ".", False), ("limitsCpu", "+", False), ("limitsMemory", "Mi", False),
    # the server trims a quantity's JSON string first; the parser asks for it as it is meant
    ("limitsCpu", "1 ", False), ("requestsMemory", " 64Mi", False),
]


def _deployment_with(ns: str, spec_field: str, value: Any) -> dict[str, Any]:
    """The Deployment builders.build makes for a valid spec, with one field set to `value`."""
    ok = parse_appdefinition({"metadata": {"name": "probe", "namespace": ns,
                                           "uid": "0000-probe-0123456789ab"},
                              "spec": valid_spec("probe")})
    assert isinstance(ok, AppDefinition), ok
    body = builders.build(Part.DEPLOYMENT, ok, 1, holder=None, proxy_template=None,
                          settings=builders.PoolSettings())
    app = body["spec"]["template"]["spec"]["containers"][0]
    where = {"requestsCpu": ("requests", "cpu"), "requestsMemory": ("requests", "memory"),
             "limitsCpu": ("limits", "cpu"), "limitsMemory": ("limits", "memory")}
    if spec_field in where:
        group, resource = where[spec_field]
        app["resources"][group][resource] = value
    elif spec_field == "imagePullPolicy":
        app["imagePullPolicy"] = value
    elif spec_field == "uid":
        app["securityContext"] = {"runAsUser": value}
    else:
        app[spec_field] = value
    body["metadata"]["name"] = f"probe-{uuid.uuid4().hex[:8]}"
    return body


def test_the_deployment_checks_agree_with_the_api_server(ctl: Controller, kube_api: Any) -> None:
    """A spec the parser accepts is a Deployment the API server accepts: asked with a dry run
    for every value above (the quantity grammar exactly; the rest no looser than the server)."""
    apps = AppsV1Api(kube_api)
    wrong = []
    for spec_field, value, exact in DEPLOYMENT_FIELDS:
        parsed = parse_appdefinition({"metadata": {"name": "p", "uid": "u" * 20},
                                      "spec": valid_spec("probe", **{spec_field: value})})
        mine = isinstance(parsed, AppDefinition)
        try:
            apps.create_namespaced_deployment(ctl.ns, _deployment_with(ctl.ns, spec_field, value),
                                              dry_run="All")
            server, why = True, ""
        except ApiException as exc:
            if exc.status not in (400, 422):
                raise
            server, why = False, f" ({str(exc.body)[:300]})"
        if (mine != server) if exact else (mine and not server):
            wrong.append(f"{spec_field}={value!r}: parser {'accepts' if mine else 'refuses'}, "
                         f"API server {'accepts' if server else 'refuses'}{why}")
    assert wrong == [], "\n".join(wrong)


# --- selector collisions (issue #15, item 8) ---------------------------------------------------


@pytest.mark.parametrize(("first", "second"), [
    pytest.param("CollJava", "colljava", id="case"),
    pytest.param("coll_a_b", "coll-a-b", id="underscore"),
])
def test_the_later_of_two_colliding_appdefinitions_is_invalid(
    ctl: Controller, first: str, second: str
) -> None:
    """Two pools whose `app` selectors coincide would route each other's Services to each
    other's pods: the later is reported invalid, naming the earlier, and builds nothing; the
    earlier one's instance is not touched, and its Session keeps it."""
    kube, ns = ctl.kube, ctl.ns
    tag = uuid.uuid4().hex[:5]
    # creationTimestamp has a resolution of seconds: both may carry the same one, and then
    # the names decide (pool-spec order: creationTimestamp, then name).
    older, newer = f"coll-1-{tag}", f"coll-2-{tag}"
    create_appdef(kube, ns, older, min_instances=1, max_instances=2, spec_name=first)
    sname = f"s-{older}"
    create_session(kube, ns, sname, USERS[12], older)
    wait_status(kube, ns, sname, "HANDLED", "Instance 1")
    wait_for(lambda: len(instance_objects(kube, ns, older, 1)) == 5, timeout=SETTLE)
    before = snapshot(kube, ns, older, 1)
    try:
        create_appdef(kube, ns, newer, min_instances=2, max_instances=3, spec_name=second)
        fragment = f"AppDefinition {older!r} (spec.name {first!r})"
        wait_for(lambda: any(fragment in m for m in events_about(kube, ns, newer,
                                                                 "InvalidAppDefinition")),
                 timeout=SETTLE, message=lambda: f"InvalidAppDefinition event with "
                 f"{fragment!r}: {events_about(kube, ns, newer, 'InvalidAppDefinition')}")
        waiting = f"s-{newer}"
        create_session(kube, ns, waiting, USERS[13], newer)
        st = wait_status(kube, ns, waiting, "HANDLING", "is invalid")
        assert fragment in st["operatorMessage"]
        assert all(instance_objects(kube, ns, newer, k) == {} for k in (1, 2)), \
            "the later of two colliding pools was built"
        assert snapshot(kube, ns, older, 1) == before
        assert status_of(kube, ns, sname).get("operatorStatus") == "HANDLED"
    finally:
        # The checker of the other cases knows nothing of collisions: leave none behind.
        for name in (newer, older):
            with contextlib.suppress(KubeError):
                kube.delete(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, name)
        with contextlib.suppress(KubeError):
            kube.delete(v.SESSION_API_VERSION, v.SESSION_KIND, ns, sname)
        with contextlib.suppress(KubeError):
            kube.delete(v.SESSION_API_VERSION, v.SESSION_KIND, ns, f"s-{newer}")


@pytest.mark.parametrize("spec_name", [
    pytest.param("bad name!", id="space-and-bang"),
    pytest.param("naïve", id="non-ascii"),
    pytest.param("a.b", id="dot"),
])
def test_appdefinition_name_the_api_server_refuses(ctl: Controller, spec_name: str) -> None:
    """The CRD's pattern for spec.name: the API server refuses, with a message naming it."""
    with pytest.raises(KubeError) as err:
        ctl.kube.create(appdef_body(ctl.ns, f"refused-{uuid.uuid4().hex[:5]}",
                                    valid_spec(spec_name)))
    assert err.value.status == 422 and "spec.name" in str(err.value)


@pytest.mark.parametrize("spec_name", [
    pytest.param("x" * 70, id="longer-than-a-label"),
    pytest.param("y" * 61, id="selector-cut-to-62"),
])
def test_appdefinition_spec_name_too_long_for_its_selectors(ctl: Controller,
                                                           spec_name: str) -> None:
    """spec.name passes the CRD's pattern, but the `app` selector '<spec.name>-<id>' is cut to
    62 characters: instances would share one selector and route to each other's pods. The
    AppDefinition is reported invalid, naming spec.name, and its Sessions wait."""
    kube, ns = ctl.kube, ctl.ns
    name = f"label-{uuid.uuid4().hex[:6]}"
    create_appdef(kube, ns, name, min_instances=2, max_instances=3, spec_name=spec_name)
    sname = f"s-{name}"
    create_session(kube, ns, sname, USERS[4], name)
    fragment = f"spec.name is {len(spec_name)} characters"
    wait_for(lambda: any(fragment in m for m in events_about(kube, ns, name,
                                                             "InvalidAppDefinition")),
             timeout=SETTLE, message=lambda: f"InvalidAppDefinition event with {fragment!r}: "
             f"{events_about(kube, ns, name, 'InvalidAppDefinition')}")
    st = wait_status(kube, ns, sname, "HANDLING", "is invalid")
    assert fragment in st["operatorMessage"]
    assert instance_objects(kube, ns, name, 1) == {}, "an invalid pool must not be built"


def test_appdefinition_spec_name_with_symbols_at_the_ends_is_served(ctl: Controller) -> None:
    """'_edge_' passes the CRD's pattern; label values must start and end alphanumeric, so the
    labels are trimmed and the claim succeeds, each instance with its own selector."""
    kube, ns = ctl.kube, ctl.ns
    name = f"label-{uuid.uuid4().hex[:6]}"
    create_appdef(kube, ns, name, min_instances=2, max_instances=3, spec_name="_edge_")
    sname = f"s-{name}"
    create_session(kube, ns, sname, USERS[4], name)
    wait_status(kube, ns, sname, "HANDLED", "Instance")
    wait_for(lambda: len(instance_objects(kube, ns, name, 2)) == 5, timeout=SETTLE)
    selectors = set()
    for k in (1, 2):
        for obj in instance_objects(kube, ns, name, k).values():
            if "template" in (obj.get("spec") or {}):
                selectors.add(obj["spec"]["template"]["metadata"]["labels"]["app"])
    assert len(selectors) == 2, f"instances share the app selector {selectors}"


def test_absurdly_long_appdefinition_name_still_works(ctl: Controller) -> None:
    """metadata.name up to 253 characters: object names are cut, keys and references are not."""
    kube, ns = ctl.kube, ctl.ns
    name = "long-" + "n" * 200
    create_appdef(kube, ns, name, min_instances=1, max_instances=2, spec_name="longname")
    create_session(kube, ns, "s-longname", USERS[5], name)
    wait_status(kube, ns, "s-longname", "HANDLED", "Instance")
    assert len(instance_objects(kube, ns, name, 1)) == 5


# --- Sessions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BadSession:
    id: str
    spec: dict[str, Any]
    message: str  # in status.operatorMessage (status ERROR) and the InvalidSession event


BAD_USER = "spec.user must be exactly one e-mail address"
BAD_SESSIONS = [
    BadSession("unknown-appdef", {"appDefinition": "no-such-app"},
               "AppDefinition 'no-such-app' not found"),
    BadSession("empty-appdef", {"appDefinition": ""}, "spec.appDefinition is empty"),
    BadSession("missing-appdef", {"appDefinition": DROP}, "spec.appDefinition is empty"),
    BadSession("empty-user", {"user": ""}, "spec.user is empty"),
    BadSession("missing-user", {"user": DROP}, "spec.user is empty"),
    BadSession("multi-line", {"user": f"{USERS[1]}\n{USERS[2]}"}, BAD_USER),
    BadSession("trailing-newline", {"user": f"{USERS[1]}\n"}, BAD_USER),
    BadSession("comma", {"user": f"{USERS[1]},{USERS[2]}"}, BAD_USER),
    BadSession("comma-space", {"user": f"{USERS[1]}, {USERS[2]}"}, BAD_USER),
    BadSession("semicolon", {"user": f"{USERS[1]};{USERS[2]}"}, BAD_USER),
    BadSession("inner-space", {"user": "user 1@example.com"}, BAD_USER),
    BadSession("leading-space", {"user": f" {USERS[1]}"}, BAD_USER),
    BadSession("tab", {"user": f"{USERS[1]}\t"}, BAD_USER),
    BadSession("two-at", {"user": "a@b@example.com"}, BAD_USER),
    BadSession("no-at", {"user": "not-an-address"}, BAD_USER),
    BadSession("no-domain-dot", {"user": "user@localhost"}, BAD_USER),
    BadSession("only-spaces", {"user": "   "}, BAD_USER),
    # issue #15, item 7: the e-mail grammar, each refusal naming its rule
    BadSession("kelvin-sign", {"user": "\u212aate@example.com"},
               f"{BAD_USER}: character 1 is a non-ASCII character U+212A"),
    BadSession("no-break-space", {"user": "user1\u00a0@example.com"}, "U+00A0"),
    BadSession("quoted-local-part", {"user": '"user 1"@example.com'},
               f"{BAD_USER}: character 1 is a quote"),
    BadSession("leading-hash", {"user": "#user1@example.com"}, "starts with '#'"),
    BadSession("bell", {"user": "user1\x07@example.com"}, "control character (U+0007)"),
    BadSession("carriage-return", {"user": "user1@example.com\r"}, "control character"),
    BadSession("longer-than-254", {"user": "u" * 250 + "@example.com"},
               "longer than 254 characters"),
    BadSession("domain-literal", {"user": "user1@[127.0.0.1]"}, "not allowed after '@'"),
    BadSession("empty-domain-label", {"user": "user1@example..com"}, "label 2 of the domain"),
    BadSession("dot-at-start", {"user": ".user1@example.com"}, "local part"),
    BadSession("parenthesis", {"user": "user1(me)@example.com"},
               "character '(' is not allowed before '@'"),
]


@pytest.mark.parametrize("case", BAD_SESSIONS, ids=lambda c: c.id)
def test_bad_session_gets_error_with_a_reason_and_takes_nothing(
    ctl: Controller, case: BadSession
) -> None:
    kube, ns = ctl.kube, ctl.ns
    name = f"bad-{case.id}"
    bait = f"bait-{case.id}"  # a pool of its own with a free instance it must not take
    create_appdef(kube, ns, bait, min_instances=1, max_instances=2, spec_name=bait)
    wait_for(lambda: len(instance_objects(kube, ns, bait, 1)) == 5, timeout=SETTLE)
    spec = session_spec(name, USERS[6], bait)
    for key, value in case.spec.items():
        if value is DROP:
            spec.pop(key)
        else:
            spec[key] = value
    free_before = snapshot(kube, ns, bait, 1)
    kube.create(session_body(ns, name, spec))
    st = wait_status(kube, ns, name, "ERROR", case.message)
    assert "\n" not in st["operatorMessage"]
    wait_for(lambda: any(case.message in m for m in events_about(kube, ns, name,
                                                                 "InvalidSession")),
             timeout=SETTLE, message="an InvalidSession event")
    obj = kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name)
    assert v.ANNOTATION_INSTANCE_ID not in (obj["metadata"].get("annotations") or {})
    assert snapshot(kube, ns, bait, 1) == free_before, "the free instance was touched"


@pytest.mark.parametrize("name", [
    pytest.param("s" + "x" * 62, id="63-chars"),
    pytest.param("s" + "x" * 100, id="101-chars"),
    pytest.param("s" + "x" * 252, id="253-chars"),
])
def test_long_session_name(ctl: Controller, name: str) -> None:
    """A Session name is a DNS subdomain (up to 253 characters), but it is also written as the
    value of the `theia-cloud.io/session` label (at most 63). The Session must either be
    served or get ERROR with a message; it must not sit in NEW with its claim failing."""
    kube, ns = ctl.kube, ctl.ns
    create_appdef(kube, ns, f"ln-{len(name)}", min_instances=1, max_instances=2,
                  spec_name=f"ln-{len(name)}")
    create_session(kube, ns, name, USERS[7], f"ln-{len(name)}")

    def settled() -> str | None:
        st = status_of(kube, ns, name)
        return st.get("operatorStatus") if st.get("operatorStatus") in ("HANDLED",
                                                                         "ERROR") else None

    outcome = wait_for(settled, timeout=SETTLE, message=lambda: (
        f"Session with a {len(name)}-character name is {status_of(kube, ns, name)}"))
    if outcome == "ERROR":
        assert status_of(kube, ns, name).get("operatorMessage")
    else:
        assert check(kube, ns) == []


@pytest.mark.parametrize("user", [
    pytest.param("First.Last+tag@Example.COM", id="plus-and-case"),
    pytest.param("u" * 200 + "@example.com", id="very-long-address"),
    pytest.param("o'brien@example.ie", id="apostrophe"),
])
def test_odd_but_valid_users_are_served(ctl: Controller, user: str) -> None:
    """Valid addresses with symbols the user label must rewrite: served, allow-list exact."""
    kube, ns = ctl.kube, ctl.ns
    app = f"odd-{uuid.uuid4().hex[:5]}"
    create_appdef(kube, ns, app, min_instances=1, max_instances=2, spec_name=app)
    name = f"s-{app}"
    create_session(kube, ns, name, user, app)
    wait_status(kube, ns, name, "HANDLED", "Instance")
    lists = [o for o in instance_objects(kube, ns, app, 1).values()
             if (o["metadata"].get("labels") or {}).get(v.LABEL_TEMPLATE_PURPOSE) == "emails"]
    assert lists and lists[0]["data"][v.EMAILS_KEY] == user


def test_malformed_sessions_among_twenty_claiming_at_once(ctl: Controller) -> None:
    """Issue #15, item 5: a Session annotated `instance-id: "²"` made parse_session raise in
    every job of the namespace. Two malformed Sessions (that annotation, and one of 5000
    digits, which int() refuses) arrive with 20 valid ones at once: all 20 are served, each
    with its own instance, and the malformed ones settle too (the annotation is not obeyed)."""
    kube, ns = ctl.kube, ctl.ns
    app = f"crowd-{uuid.uuid4().hex[:5]}"
    create_appdef(kube, ns, app, min_instances=22, max_instances=25, spec_name=app)
    uid12 = kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, app)["metadata"]["uid"][-12:]

    def complete() -> int:  # instances with all five objects, from one listing of each kind
        parts: dict[int, int] = {}
        for api_version, kind in (("v1", "Service"), ("apps/v1", "Deployment"),
                                  ("v1", "ConfigMap")):
            items, _ = kube.list(api_version, kind, ns, label_selector=v.LABEL_GENERATION)
            for item in items:
                k = naming.instance_id_from_name(item["metadata"]["name"])
                if k is not None and uid12 in item["metadata"]["name"]:
                    parts[k] = parts.get(k, 0) + 1
        return sum(1 for n in parts.values() if n == 5)

    wait_for(lambda: complete() == 22, timeout=SETTLE,
             message=lambda: f"22 prewarmed instances, {complete()} complete")
    odd = {f"{app}-sup": "²", f"{app}-long": "1" * 5000}
    valid = [f"{app}-{i}" for i in range(20)]
    for i, name in enumerate([*odd, *valid]):
        body = session_body(ns, name, session_spec(name, USERS[20 + i], app))
        if name in odd:
            body["metadata"]["annotations"] = {v.ANNOTATION_INSTANCE_ID: odd[name]}
        kube.create(body)

    def served() -> dict[str, str] | None:
        ids = {}
        for name in valid:
            obj = kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name)
            if (obj.get("status") or {}).get("operatorStatus") != "HANDLED":
                return None
            ids[name] = obj["metadata"]["annotations"][v.ANNOTATION_INSTANCE_ID]
        return ids

    ids = wait_for(served, timeout=SETTLE, message=lambda: "the 20 valid Sessions: " + str(
        {n: status_of(kube, ns, n).get("operatorStatus") for n in valid}))
    assert len(set(ids.values())) == 20, f"two Sessions share an instance: {ids}"
    for name in odd:
        # Served like any other: the annotation is not an id, so it names no instance; the
        # claim replaces it with the instance it holds, and says so.
        wait_status(kube, ns, name, "HANDLED", "Instance")
        annotated = kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name)
        ids[name] = annotated["metadata"]["annotations"][v.ANNOTATION_INSTANCE_ID]
        assert ids[name].isdigit() and len(ids[name]) <= 2
        assert emails(kube, ns, app, int(ids[name])) == \
            USERS[20 + [*odd, *valid].index(name)]
        reports = events_about(kube, ns, name, "AnnotationIgnored")
        assert reports and "is not an instance id" in reports[0], reports
    assert len(set(ids.values())) == 22, f"two Sessions share an instance: {ids}"
    # The odd two are judged above: how a report of their annotation shows is not I1-I6's.
    problems = [str(x) for x in check(kube, ns)
                if app in str(x) and not any(n in str(x) for n in odd)]
    assert problems == [], "; ".join(problems)


FINALIZER = "warmpool.test/hold"


def test_session_for_an_appdefinition_being_deleted(ctl: Controller) -> None:
    """An AppDefinition with a deletionTimestamp (held by a finalizer): a new Session gets
    ERROR; the Session that already holds an instance keeps it, objects and allow-list."""
    kube, ns = ctl.kube, ctl.ns
    app = "dying"
    create_appdef(kube, ns, app, min_instances=2, max_instances=3, spec_name=app)
    kube.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, app,
                     {"metadata": {"finalizers": [FINALIZER]}})
    create_session(kube, ns, "s-holder", USERS[8], app)
    wait_status(kube, ns, "s-holder", "HANDLED", "Instance")
    held = int(kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, "s-holder")
               ["metadata"]["annotations"][v.ANNOTATION_INSTANCE_ID])
    wait_for(lambda: len(instance_objects(kube, ns, app, held)) == 5, timeout=SETTLE)
    uids = {n: o["metadata"]["uid"] for n, o in instance_objects(kube, ns, app, held).items()}
    holder_status = status_of(kube, ns, "s-holder")
    try:
        kube.delete(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, app)
        create_session(kube, ns, "s-late", USERS[9], app)
        wait_status(kube, ns, "s-late", "ERROR", "is being deleted")
        touch_and_settle(ctl, "s-holder")
        objs = instance_objects(kube, ns, app, held)
        assert {n: o["metadata"]["uid"] for n, o in objs.items()} == uids
        emails = [o for o in objs.values() if (o["metadata"].get("labels") or {})
                  .get(v.LABEL_TEMPLATE_PURPOSE) == "emails"]
        assert emails[0]["data"][v.EMAILS_KEY] == USERS[8]
        after = status_of(kube, ns, "s-holder")
        assert (after.get("operatorStatus"), after.get("operatorMessage")) == (
            holder_status["operatorStatus"], holder_status["operatorMessage"]), \
            "the status of the Session that holds an instance was rewritten"
    finally:
        kube.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, app,
                         {"metadata": {"finalizers": None}})


def test_appdefinition_deleted_while_a_session_holds_an_instance(ctl: Controller) -> None:
    """The instance stays with its Session (objects, allow-list, status), and the invariant
    checker sees it: the garbage collector strips the deleted AppDefinition's reference from
    the held objects, which then carry only the Session's."""
    kube, ns = ctl.kube, ctl.ns
    app = "gone"
    create_appdef(kube, ns, app, min_instances=1, max_instances=2, spec_name=app)
    create_session(kube, ns, "s-gone", USERS[11], app)
    wait_status(kube, ns, "s-gone", "HANDLED", "Instance 1")
    wait_for(lambda: len(instance_objects(kube, ns, app, 1)) == 5, timeout=SETTLE)
    uids = {n: o["metadata"]["uid"] for n, o in instance_objects(kube, ns, app, 1).items()}
    holder_status = status_of(kube, ns, "s-gone")
    kube.delete(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, app)

    def held() -> dict[str, dict[str, Any]]:  # by name: the AppDefinition is gone
        found = {}
        for api_version, kind in (("v1", "Service"), ("apps/v1", "Deployment"),
                                  ("v1", "ConfigMap")):
            items, _ = kube.list(api_version, kind, ns, label_selector=v.LABEL_GENERATION)
            found |= {f"{kind}/{o['metadata']['name']}": o for o in items
                      if f"{kind}/{o['metadata']['name']}" in uids}
        return found

    def stripped() -> bool:  # the garbage collector removed the dangling reference
        objs = held()
        return len(objs) == 5 and all(
            [r["kind"] for r in o["metadata"]["ownerReferences"]] == ["Session"]
            for o in objs.values())

    wait_for(stripped, timeout=SETTLE, message="the GC strips the AppDefinition's reference")
    touch_and_settle(ctl, "s-gone")
    assert {n: o["metadata"]["uid"] for n, o in held().items()} == uids
    after = status_of(kube, ns, "s-gone")
    assert (after.get("operatorStatus"), after.get("operatorMessage")) == (
        holder_status["operatorStatus"], holder_status["operatorMessage"]), \
        "the status of the Session that holds an instance was rewritten"
    problems = [str(x) for x in check(kube, ns) if "s-gone" in str(x)]
    assert problems == [], "the invariant checker does not see the held instance: " \
        + "; ".join(problems)


def touch(kube: Kube, ns: str, name: str) -> None:
    """Someone annotates the Session (`kubectl annotate`, a tool): it changes outside its
    status, so the scheduler queues its claim job again."""
    kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name,
                     {"metadata": {"annotations": {"example.com/touched": str(time.time())}}})


def touch_and_settle(ctl: Controller, name: str) -> None:
    """`touch` the Session, then wait until its claim job has run since and the queue is idle
    (what that run and the changes before it queued has run too): the point after which
    "nothing moved" means something."""
    since = ctl.system.mark()
    touch(ctl.kube, ctl.ns, name)
    ctl.system.wait_quiet(since, keys=[str(SessionKey(ctl.ns, name))], timeout=SETTLE)


def test_the_controller_still_serves_after_the_catalogue(ctl: Controller) -> None:
    """Last: a new pool is built and a Session of it served (nothing got stuck)."""
    kube, ns = ctl.kube, ctl.ns
    create_appdef(kube, ns, "after", min_instances=1, max_instances=2, spec_name="after")
    create_session(kube, ns, "s-after", USERS[10], "after")
    wait_status(kube, ns, "s-after", "HANDLED", "Instance 1")


# --- configuration errors of `warmpool worker` and `warmpool scheduler` -----------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nobody listens once it is closed


def kubeconfig_variant(cluster: ClusterInfo, path: Path, *, server: str | None = None,
                       token: str | None = None) -> Path:
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    config = copy.deepcopy(config)
    if server is not None:
        config["clusters"][0]["cluster"]["server"] = server
    if token is not None:  # the only credential: a client certificate would win over it
        config["users"][0]["user"] = {"token": token}
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass(frozen=True)
class ConfigCase:
    id: str
    command: tuple[str, ...]
    setup: Callable[[ClusterInfo, Path, str], dict[str, str]]  # -> environment changes
    says: tuple[str, ...]  # each must appear in the error output (case-insensitive)
    codes: tuple[int, ...] = (2, 4)


def _env(kubeconfig: str | Path | None = None, redis_url: str | None = None,
         namespace: str | None = None) -> dict[str, str]:
    out: dict[str, str] = {}
    if kubeconfig is not None:
        out["KUBECONFIG"] = str(kubeconfig)
    if redis_url is not None:
        out["WARMPOOL_REDIS_URL"] = redis_url
    if namespace is not None:
        out["WARMPOOL_NAMESPACE"] = namespace
    return out


WORKER = ("worker", "--processes", "1", "--threads", "1")
SCHEDULER = ("scheduler", "--health-port", "0")

CONFIG_CASES = [
    ConfigCase("worker-redis-url-malformed", WORKER,
               lambda c, t, r: _env(c.kubeconfig, "not-a-url"), ("redis",)),
    ConfigCase("worker-redis-unreachable", WORKER,
               lambda c, t, r: _env(c.kubeconfig, f"redis://127.0.0.1:{closed_port()}/0"),
               ("redis",), (4,)),
    ConfigCase("worker-api-unreachable", WORKER,
               lambda c, t, r: _env(kubeconfig_variant(
                   c, t / "kc", server=f"https://127.0.0.1:{closed_port()}"), r),
               ("kubernetes",), (4,)),
    ConfigCase("worker-credentials-rejected", WORKER,
               lambda c, t, r: _env(kubeconfig_variant(c, t / "kc", token="expired-token"), r),
               ("credentials",), (4,)),
    ConfigCase("worker-kubeconfig-missing", WORKER,
               lambda c, t, r: _env(t / "no-such-kubeconfig", r), ("kubeconfig",), (4,)),
    ConfigCase("scheduler-redis-url-malformed", SCHEDULER,
               lambda c, t, r: _env(c.kubeconfig, "not-a-url", "default"), ("redis",)),
    ConfigCase("scheduler-redis-unreachable", SCHEDULER,
               lambda c, t, r: _env(c.kubeconfig, f"redis://127.0.0.1:{closed_port()}/0",
                                    "default"), ("redis",), (4,)),
    ConfigCase("scheduler-api-unreachable", SCHEDULER,
               lambda c, t, r: _env(kubeconfig_variant(
                   c, t / "kc", server=f"https://127.0.0.1:{closed_port()}"), r, "default"),
               ("kubernetes",), (4,)),
    ConfigCase("scheduler-credentials-rejected", SCHEDULER,
               lambda c, t, r: _env(kubeconfig_variant(c, t / "kc", token="expired-token"), r,
                                    "default"), ("credentials",), (4,)),
    ConfigCase("scheduler-unknown-namespace", SCHEDULER,
               lambda c, t, r: _env(c.kubeconfig, r, "no-such-namespace-42"),
               ("no-such-namespace-42",), (3, 4)),
    ConfigCase("scheduler-kubeconfig-missing", SCHEDULER,
               lambda c, t, r: _env(t / "no-such-kubeconfig", r, "default"), ("kubeconfig",),
               (4,)),
    ConfigCase("scheduler-kubeconfig-garbage", SCHEDULER,
               lambda c, t, r: (t.joinpath("kc").write_text("{not: [valid"),
                                _env(t / "kc", r, "default"))[1], ("kubeconfig",), (4,)),
]
EXIT_WITHIN = 20.0


@pytest.mark.parametrize("case", CONFIG_CASES, ids=lambda c: c.id)
def test_configuration_error_exits_with_one_clear_line(
    cluster: ClusterInfo, tmp_path: Path, case: ConfigCase
) -> None:
    url = resolve_redis_url()
    try:
        redis_connect(url).ping()
    except redis.RedisError as exc:  # a missing service is a failure, never a skip
        pytest.fail(f"no Redis at {url} (.ci/run starts one): {exc}")
    env = {k: val for k, val in os.environ.items()
           if not k.startswith("WARMPOOL_") and k != "KUBECONFIG"}
    env.update(case.setup(cluster, tmp_path, url))
    env["WARMPOOL_QUEUE_PREFIX"] = f"t{uuid.uuid4().hex[:8]}:warmpool:"
    proc = subprocess.Popen([sys.executable, "-m", "warmpool.cli", *case.command], env=env,
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=EXIT_WITHIN)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        pytest.fail(f"`warmpool {' '.join(case.command)}` did not exit within "
                    f"{EXIT_WITHIN:.0f}s; it kept running with:\n{_tail(out, err)}")
    text = out + err
    assert proc.returncode in case.codes, \
        f"exit {proc.returncode}, expected one of {case.codes}:\n{_tail(out, err)}"
    assert "Traceback" not in text, f"a traceback instead of a message:\n{_tail(out, err)}"
    assert "a bug?" not in text, f"reported as an unexpected error:\n{_tail(out, err)}"
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, f"expected one 'error:' line:\n{_tail(out, err)}"
    for word in case.says:
        assert word.lower() in errors[0].lower(), f"{word!r} not in {errors[0]!r}"


def _tail(out: str, err: str, lines: int = 15) -> str:
    text = (out + err).strip().splitlines()
    return "\n".join(text[:3] + (["..."] if len(text) > lines else []) + text[-lines:])


# --- timeouts and clocks (issue #29) ----------------------------------------------------------
# A Session's timeouts read status.lastActivity (anyone with patch on sessions/status writes it,
# and a worker writes it from its own clock) and the Services that name the Session as owner
# (anyone who can create a Service makes one). Each case runs one timeout pass of the real
# runner against the module's controller, on the API server's clock (the production
# ApiServerClock), with the tracker on; the monitors are asked through a recording client that
# never gets an answer (the test host cannot route to a cluster IP), so activity is unknown.


CLOCKED = "clocked"  # a tracked AppDefinition: 60 minutes of inactivity, 30 hours hard limit


class UnansweredMonitor:
    """Records every monitor request (base URL, token) and answers none of them."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def last_activity(self, base: str, secret: str) -> int | None:
        self.asked.append((base, secret))
        raise ConnectionRefusedError("nothing listens here")

    def popup(self, base: str, secret: str) -> None:
        self.asked.append((base, secret))
        raise ConnectionRefusedError("nothing listens here")

    def message(self, base: str, secret: str, body: str) -> None:
        self.asked.append((base, secret))
        raise ConnectionRefusedError("nothing listens here")


def _clocked_pool(ctl: Controller) -> None:
    if ctl.kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, ctl.ns, CLOCKED) is None:
        create_appdef(ctl.kube, ctl.ns, CLOCKED, min_instances=1, max_instances=4,
                      spec_name=CLOCKED, timeout=1800,
                      monitor={"port": 3000, "activityTracker": {"timeoutAfter": 60}})


def _handled_clocked_session(ctl: Controller, name: str, user: str) -> dict[str, Any]:
    _clocked_pool(ctl)
    create_session(ctl.kube, ctl.ns, name, user, CLOCKED)
    ctl.kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ctl.ns, name,
                         {"spec": {"sessionSecret": f"token-{name}"}})
    wait_status(ctl.kube, ctl.ns, name, "HANDLED", "Instance")
    obj = ctl.kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ctl.ns, name)
    assert obj is not None
    return obj


def _timeout_runner(ctl: Controller, monitor: UnansweredMonitor) -> Any:
    from warmpool.controller.timeouts import TimeoutRunner, TimeoutSettings

    return TimeoutRunner(ctl.kube, [ctl.ns], TimeoutSettings(activity_tracker=True),
                         monitor=monitor)


def _timeout_pass(ctl: Controller, monitor: UnansweredMonitor) -> Any:
    return _timeout_runner(ctl, monitor).run_once()


def _server_ms(ctl: Controller) -> int:
    from warmpool.kube.clock import ApiServerClock

    return int(ApiServerClock(ctl.kube).sync() * 1000)


@pytest.mark.parametrize("value", [
    pytest.param("future-2h", id="two-hours-ahead"),
    pytest.param(10**18, id="huge"),
    pytest.param(10**30, id="beyond-int64"),
    pytest.param("yesterday", id="text"),
    pytest.param({"no": 1}, id="object"),
    pytest.param(-5, id="negative"),
    pytest.param(True, id="boolean"),
])
def test_last_activity_in_the_future_or_garbage_is_named_and_rewritten_to_now(
    ctl: Controller, value: Any,
) -> None:
    """Today a future value keeps a Session alive until then (10^18: for ever). It gets a
    Warning naming status.lastActivity and is rewritten to the cluster's now; the Session is
    not deleted (its activity is unknown), and a sibling with a good value is left alone."""
    kube, ns = ctl.kube, ctl.ns
    tag = uuid.uuid4().hex[:5]
    bad, good = f"la-bad-{tag}", f"la-good-{tag}"
    try:
        _last_activity_case(ctl, value, bad, good)
    finally:  # the pool is shared by the cases: hand its instances back
        for name in (bad, good):
            with contextlib.suppress(KubeError):
                kube.delete(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name)


def _last_activity_case(ctl: Controller, value: Any, bad: str, good: str) -> None:
    from warmpool.pool.timeouts import REASON_BAD_LAST_ACTIVITY

    kube, ns = ctl.kube, ctl.ns
    _handled_clocked_session(ctl, bad, USERS[11])
    good_obj = _handled_clocked_session(ctl, good, USERS[12])
    good_value = good_obj["status"]["lastActivity"]
    raw = _server_ms(ctl) + 2 * 3_600_000 if value == "future-2h" else value
    kube.merge_patch(v.SESSION_API_VERSION, v.SESSION_KIND, ns, bad,
                     {"status": {"lastActivity": raw}}, status=True)

    before = _server_ms(ctl)
    report = _timeout_pass(ctl, UnansweredMonitor())
    after = _server_ms(ctl)

    assert report.errors == [] and report.deleted == []
    written = dict(((n, x) for _, n, x in report.activity_written))
    assert set(written) == {bad}, report.activity_written
    assert before - 1000 <= written[bad] <= after + 1000  # the cluster's now (Date: 1 s steps)
    assert status_of(kube, ns, bad)["lastActivity"] == written[bad]
    [message] = events_about(kube, ns, bad, REASON_BAD_LAST_ACTIVITY)
    assert "status.lastActivity" in message and len(message) < 400
    assert status_of(kube, ns, good)["lastActivity"] == good_value
    assert events_about(kube, ns, good, REASON_BAD_LAST_ACTIVITY) == []
    # Both still held and served; the next pass finds nothing wrong.
    for name in (bad, good):
        assert status_of(kube, ns, name)["operatorStatus"] == "HANDLED"
    assert _timeout_pass(ctl, UnansweredMonitor()).activity_written == []


def test_a_foreign_service_owned_by_the_session_never_gets_its_token(ctl: Controller) -> None:
    """Java sends the monitor's bearer token to the first Service not ending in -int with an
    owner reference to the Session. A Service made by anyone, owned by the Session and listed
    first, is ignored with a Warning naming it; the token goes only to the pool's Service of
    the held instance; a second Session's monitor is asked as usual."""
    kube, ns = ctl.kube, ctl.ns
    tag = uuid.uuid4().hex[:5]
    victim, other = f"fs-victim-{tag}", f"fs-other-{tag}"
    try:
        _foreign_service_case(ctl, tag, victim, other)
    finally:  # the pool is shared by the cases: hand its instances back
        for name in (victim, other):
            with contextlib.suppress(KubeError):
                kube.delete(v.SESSION_API_VERSION, v.SESSION_KIND, ns, name)
        with contextlib.suppress(KubeError):
            kube.delete("v1", "Service", ns, f"a-thief-{tag}")


def _foreign_service_case(ctl: Controller, tag: str, victim: str, other: str) -> None:
    from warmpool.pool.timeouts import REASON_FOREIGN_SERVICE

    kube, ns = ctl.kube, ctl.ns
    victim_obj = _handled_clocked_session(ctl, victim, USERS[13])
    _handled_clocked_session(ctl, other, USERS[14])
    thief = kube.create({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": f"a-thief-{tag}", "namespace": ns,
                     "labels": {v.LABEL_SESSION_UUID: victim_obj["metadata"]["uid"]},
                     "ownerReferences": [{"apiVersion": v.SESSION_API_VERSION,
                                          "kind": v.SESSION_KIND, "name": victim,
                                          "uid": victim_obj["metadata"]["uid"]}]},
        "spec": {"ports": [{"port": 3000}], "selector": {"app": "thief"}}})

    monitor = UnansweredMonitor()
    runner = _timeout_runner(ctl, monitor)  # the leader's runner lives across passes
    report = runner.run_once()

    assert report.errors == [] and report.deleted == []
    [message] = events_about(kube, ns, victim, REASON_FOREIGN_SERVICE)
    assert thief["metadata"]["name"] in message and "metadata.ownerReferences" in message
    thief_ip = thief["spec"]["clusterIP"]
    assert all(thief_ip not in base for base, _ in monitor.asked), monitor.asked

    def pool_ip(session: str) -> str:
        obj = kube.get(v.SESSION_API_VERSION, v.SESSION_KIND, ns, session) or {}
        k = int(obj["metadata"]["annotations"][v.ANNOTATION_INSTANCE_ID])
        appdef = parse_appdefinition(kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns,
                                              CLOCKED) or {})
        assert isinstance(appdef, AppDefinition)
        svc = kube.get("v1", "Service", ns,
                       builders.object_name(appdef, Part.EXTERNAL_SERVICE, k)) or {}
        return str(svc["spec"]["clusterIP"])

    assert sorted(monitor.asked) == sorted([
        (f"http://{pool_ip(victim)}:3000", f"token-{victim}"),
        (f"http://{pool_ip(other)}:3000", f"token-{other}")])
    assert events_about(kube, ns, other, REASON_FOREIGN_SERVICE) == []
    # One Warning per foreign Service, not one a pass; the token still only to the pool's.
    asked = len(monitor.asked)
    assert runner.run_once().errors == []
    assert all(thief_ip not in base for base, _ in monitor.asked[asked:])
    assert len(events_about(kube, ns, victim, REASON_FOREIGN_SERVICE)) == 1
    for name in (victim, other):
        assert status_of(kube, ns, name)["operatorStatus"] == "HANDLED"
