"""`warmpool status`'s rules, on objects as the API server returns them (no server)."""

from __future__ import annotations

import copy
from typing import Any

from tests.unit.pool_fixtures import observed
from warmpool.cli.status import pool_status
from warmpool.pool import builders
from warmpool.pool import vocabulary as v
from warmpool.pool.model import AppDefinition, Session, parse_appdefinition, parse_session
from warmpool.pool.parts import PARTS, Part
from warmpool.testing.world import appdef_body, appdef_spec, session_body, session_spec

SETTINGS = builders.PoolSettings()
UID = "aaaa-bbbb-381261d79c23"


def appdef_obj(name: str = "java", min_i: Any = 3, max_i: Any = 10, generation: int = 1,
               uid: str = UID) -> dict[str, Any]:
    return appdef_body("ns", name, appdef_spec(
        name, min_instances=min_i, max_instances=max_i, spec_name=f"{name}-17", image="img",
        ingressname=None, resources=False), metadata={"uid": uid, "generation": generation})


def parsed(obj: dict[str, Any]) -> AppDefinition:
    a = parse_appdefinition(obj)
    assert isinstance(a, AppDefinition), a
    return a


def session_obj(name: str, user: str = "jane@example.com", instance: int | None = None,
                status: str | None = None, message: str = "", appdef: str = "java",
                created: str = "2026-01-01T00:00:01Z") -> dict[str, Any]:
    ann = {v.ANNOTATION_INSTANCE_ID: str(instance)} if instance else {}
    return session_body(
        "ns", name, session_spec(name, user, appdef, workspace=None),
        metadata={"uid": f"uid-{name}", "creationTimestamp": created, "annotations": ann},
        status={"operatorStatus": status, "operatorMessage": message} if status else {})


def objects(a: AppDefinition, k: int, holder: Session | None = None,
            missing: tuple[Part, ...] = ()) -> list[dict[str, Any]]:
    return [observed(builders.build(p, a, k, holder=holder, proxy_template=None,
                                    settings=SETTINGS)) for p in PARTS if p not in missing]


def event(reason: str, kind: str, name: str, message: str, when: str = "2026-01-01T00:00:05Z",
          type_: str = "Warning", count: int = 1) -> dict[str, Any]:
    return {"type": type_, "reason": reason, "message": message, "count": count,
            "involvedObject": {"kind": kind, "name": name, "namespace": "ns"},
            "lastTimestamp": when, "metadata": {"name": f"{name}.x"}}


def world() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """java (min 3): 1 and 2 held by s1 and s2, 3 free; s3 waits; s4 is in ERROR."""
    ad = appdef_obj()
    a = parsed(ad)
    sessions = [session_obj("s1", "ann@example.com", 1, "HANDLED"),
                session_obj("s2", "bob@example.com", 2, "HANDLED"),
                session_obj("s3", "cy@example.com", None, "HANDLING",
                            created="2026-01-01T00:00:03Z"),
                session_obj("s4", "a@b.com,c@d.com", None, "ERROR",
                            "spec.user a@b.com,c@d.com must be exactly one e-mail address")]
    s1, s2 = (parse_session(s) for s in sessions[:2])
    pool = objects(a, 1, s1) + objects(a, 2, s2) + objects(a, 3)
    return [ad], sessions, pool


def test_counts_holders_waiting_and_session_errors_without_addresses() -> None:
    appdefs, sessions, pool = world()
    doc = pool_status("ns", appdefs, sessions, pool, [])
    (java,) = doc["appdefinitions"]
    assert java["valid"] and java["problem"] is None
    assert (java["minInstances"], java["maxInstances"], java["generation"]) == (3, 10, 1)
    assert java["counts"] == {"claimed": 2, "free": 1, "outdated": 0, "starting": 0,
                              "releasing": 0, "removing": 0, "waiting": 1,
                              # pods not read: free instances are not split
                              "free_warm": 0, "free_starting": 0, "free_failing": 0}
    assert [(i["id"], i["state"], i["session"], i["objects"]) for i in java["instances"]] == [
        (1, "claimed", "s1", 5), (2, "claimed", "s2", 5), (3, "free", None, 5)]
    assert java["waiting"] == ["s3"]
    (err,) = java["errors"]
    assert err["source"] == "session" and err["object"] == "Session/s4"
    assert "@" not in str(doc), "no e-mail address in the document"
    assert "<e-mail>" in err["message"]


def test_missing_surplus_outdated_and_releasing_instances() -> None:
    ad = appdef_obj(min_i=4, generation=2)
    old = parsed(appdef_obj(min_i=4, generation=1))
    new = parsed(ad)
    s1 = parse_session(session_obj("s1", instance=1))
    releasing = objects(new, 4)
    ext = next(o for o in releasing if o["kind"] == "Service"
               and not (o["metadata"]["labels"] or {}).get(v.LABEL_SERVICE_TYPE))
    ext["metadata"]["ownerReferences"].append(  # a gone Session's reference: being released
        {"apiVersion": v.SESSION_API_VERSION, "kind": v.SESSION_KIND, "name": "gone",
         "uid": "uid-gone"})
    pool = (objects(old, 1, s1)  # claimed at the old generation
            + objects(new, 2, missing=(Part.DEPLOYMENT,))  # starting
            + objects(old, 3)  # free, outdated
            + releasing
            + objects(new, 6))  # above minInstances 4: removing
    doc = pool_status("ns", [ad], [session_obj("s1", instance=1, status="HANDLED")], pool, [])
    (java,) = doc["appdefinitions"]
    states = {i["id"]: (i["state"], i["outdated"], i["objects"]) for i in java["instances"]}
    assert states == {1: ("claimed", True, 5), 2: ("starting", False, 4),
                      3: ("outdated", True, 5), 4: ("releasing", False, 5),
                      6: ("removing", False, 5)}
    c = java["counts"]
    assert (c["claimed"], c["free"], c["outdated"], c["starting"], c["releasing"],
            c["removing"]) == (1, 0, 2, 1, 1, 1)


def test_instances_that_should_exist_but_do_not_are_listed_as_starting() -> None:
    doc = pool_status("ns", [appdef_obj(min_i=2)], [], [], [])
    (java,) = doc["appdefinitions"]
    assert [(i["id"], i["state"], i["objects"]) for i in java["instances"]] == [
        (1, "starting", 0), (2, "starting", 0)]


def test_an_invalid_appdefinition_is_reported_with_its_raw_values() -> None:
    appdefs, sessions, pool = world()
    bad = appdef_obj("bad", min_i=5, max_i=2, uid="cccc-dddd-999999999999")
    doc = pool_status("ns", [*appdefs, bad], sessions, pool, [
        event("InvalidAppDefinition", v.APPDEF_KIND, "bad", "AppDefinition bad is left as it "
              "is: spec.name must match ^[a-z0-9A-Z-_]+$")])
    by_name = {p["name"]: p for p in doc["appdefinitions"]}
    b = by_name["bad"]
    assert not b["valid"] and "must not exceed" in b["problem"]
    assert (b["minInstances"], b["maxInstances"], b["instances"]) == (5, 2, [])
    assert [e["reason"] for e in b["errors"]] == ["InvalidAppDefinition"]
    assert by_name["java"]["counts"]["claimed"] == 2


def test_events_are_attributed_grouped_filtered_and_limited() -> None:
    appdefs, sessions, pool = world()
    other = appdef_obj("py", uid="eeee-ffff-777777777777")
    pool_obj = next(o for o in pool if o["kind"] == "ConfigMap")["metadata"]["name"]
    events = [
        event("InvalidSession", v.SESSION_KIND, "s4", "Session s4: bad user",
              "2026-01-01T00:00:01Z"),
        event("InvalidSession", v.SESSION_KIND, "s4", "Session s4: bad user",
              "2026-01-01T00:00:09Z", count=2),
        event("ForeignOwner", "ConfigMap", pool_obj, "ConfigMap is also owned by X",
              "2026-01-01T00:00:02Z"),
        event("InstanceConflict", "Namespace", "ns",
              "instance 1 is claimed by s1; also by s2, who must claim again",
              "2026-01-01T00:00:03Z"),
        event("InvalidUser", "Namespace", "ns", "Session someone-gone holds instance 2",
              "2026-01-01T00:00:04Z"),
        event("InvalidSession", v.SESSION_KIND, "stray", "Session stray: AppDefinition "
              "'nowhere' not found", "2026-01-01T00:00:06Z"),
        event("BackOff", "Pod", "p", "not ours"),  # another component's reason
        event("InvalidSession", v.SESSION_KIND, "s4", "normal", type_="Normal"),
    ]
    sessions = [*sessions, session_obj("stray", appdef="nowhere", status="ERROR",
                                       message="AppDefinition 'nowhere' not found")]
    doc = pool_status("ns", [*appdefs, other], sessions, pool, events)
    java = next(p for p in doc["appdefinitions"] if p["name"] == "java")
    got = [(e["source"], e["reason"], e["count"]) for e in java["errors"]]
    assert got == [("session", "SessionError", 1), ("event", "InvalidSession", 3),
                   ("event", "InstanceConflict", 1), ("event", "ForeignOwner", 1)]
    assert java["errors"][1]["last_seen"] == "2026-01-01T00:00:09Z"
    py = next(p for p in doc["appdefinitions"] if p["name"] == "py")
    assert py["errors"] == []
    # Not tied to one AppDefinition: the stray Session, the unattributable InvalidUser.
    assert [(e["reason"], e["object"]) for e in doc["errors"]] == [
        ("SessionError", "Session/stray"), ("InvalidSession", "Session/stray"),
        ("InvalidUser", "Namespace/ns")]

    limited = pool_status("ns", appdefs, sessions, pool, events, errors_limit=2)
    java = limited["appdefinitions"][0]
    assert len(java["errors"]) == 2 and java["errors_total"] == 4
    only = pool_status("ns", [*appdefs, other], sessions, pool, events, only="py")
    assert [p["name"] for p in only["appdefinitions"]] == ["py"] and only["errors"] == []


def test_a_second_claimant_is_shown_next_to_the_rightful_one() -> None:
    ad = appdef_obj()
    a = parsed(ad)
    sessions = [session_obj("s1", instance=1, status="HANDLED"),
                session_obj("s2", instance=1, status="HANDLED",
                            created="2026-01-01T00:00:02Z")]
    pool = objects(a, 1, parse_session(sessions[0]))
    # A second deciding write (a double claim): the Service references both.
    ext = next(o for o in pool if o["kind"] == "Service"
               and "-int" not in o["metadata"]["name"])
    second = parse_session(sessions[1])
    ext["metadata"]["ownerReferences"].append(second.owner_reference())
    doc = pool_status("ns", [ad], copy.deepcopy(sessions), pool, [])
    first = doc["appdefinitions"][0]["instances"][0]
    assert (first["session"], first["also_claimed_by"]) == ("s1", ["s2"])


def test_each_holder_shows_its_route_and_url_state() -> None:
    from warmpool.pool import routes

    ad = appdef_obj(min_i=3)
    a = parsed(ad)
    s1 = parse_session(session_obj("s1", instance=1, status="HANDLED"))
    s2 = parse_session(session_obj("s2", user="max@example.com", instance=2, status="HANDLED"))
    s3 = parse_session(session_obj("s3", user="eve@example.com", instance=3, status="HANDLED"))
    shared = {"spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["h"]}}
    ok = routes.desired_route(a, 1, s1, shared, SETTINGS)
    elsewhere = routes.desired_route(a, 1, s3, shared, SETTINGS)  # s3's route sends to 1
    sessions = [session_obj("s1", instance=1, status="HANDLED"),
                session_obj("s2", user="max@example.com", instance=2, status="HANDLED"),
                session_obj("s3", user="eve@example.com", instance=3, status="HANDLED")]
    sessions[0]["status"]["url"] = "h/java-17-1/"
    pool = objects(a, 1, s1) + objects(a, 2, s2) + objects(a, 3, s3)
    doc = pool_status("ns", [ad], sessions, pool, [], route_items=[ok, elsewhere])
    got = {i["id"]: (i["route"], i["url"]) for i in doc["appdefinitions"][0]["instances"]}
    assert got == {1: ("ok", "h/java-17-1/"), 2: ("missing", ""), 3: ("elsewhere", "")}
    without = pool_status("ns", [ad], sessions, pool, [])  # routes not in use
    assert {i["route"] for i in without["appdefinitions"][0]["instances"]} == {None}


def _schedule(name: str, **window: Any) -> dict[str, Any]:
    return {"apiVersion": v.SCHEDULE_API_VERSION, "kind": v.SCHEDULE_KIND,
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
            "spec": {"appDefinition": "java", "windows": [{
                "start": "12:00", "end": "14:00", "timeZone": "UTC", "size": 5,
                "leadTime": "20m", **window}]}}


def test_a_scheduled_pool_shows_its_target_next_change_and_invalid_schedules() -> None:
    from datetime import UTC, datetime

    appdefs, sessions, pool = world()  # min 3, max 10; 1..3 exist
    schedules = [_schedule("lecture"), _schedule("broken", timeZone="Nowhere/Land")]
    inside = datetime(2026, 3, 2, 11, 45, tzinfo=UTC)
    (java,) = pool_status("ns", appdefs, sessions, pool, [], schedule_items=schedules,
                          now=inside)["appdefinitions"]
    assert (java["minInstances"], java["target"]) == (3, 5)
    assert java["nextChange"] == "2026-03-02T14:00:00Z"
    assert [i["id"] for i in java["instances"]] == [1, 2, 3, 4, 5]  # 4 and 5 to be made
    assert java["schedules"] == [
        {"name": "broken", "valid": False,
         "message": "spec.windows[0].timeZone 'Nowhere/Land' is not a known IANA time zone"},
        {"name": "lecture", "valid": True, "message": "ok"}]
    after = datetime(2026, 3, 2, 14, 0, tzinfo=UTC)
    (java,) = pool_status("ns", appdefs, sessions, pool, [], schedule_items=schedules,
                          now=after)["appdefinitions"]
    assert (java["target"], java["nextChange"]) == (3, "2026-03-03T11:40:00Z")
    (plain,) = pool_status("ns", appdefs, sessions, pool, [])["appdefinitions"]
    assert (plain["target"], plain["nextChange"], plain["schedules"]) == (3, None, [])


def _pod(a: AppDefinition, k: int, ready: bool, waiting: str = "") -> dict[str, Any]:
    deployment = builders.object_name(a, Part.DEPLOYMENT, k)
    state = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    return {"kind": "Pod", "metadata": {
        "name": f"{deployment}-h-{k}", "namespace": "ns",
        "labels": {"app": f"java-17-{k}", "pod-template-hash": "h", v.LABEL_GENERATION: "1"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": f"{deployment}-h", "uid": "rs",
                             "controller": True}]},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                   "containerStatuses": [{"name": "c", "state": state}]}}


def test_free_instances_split_into_warm_starting_and_failing_with_the_pools_condition(
) -> None:
    """Issue #28: a free instance's pod, and the condition of a pool whose pods fail."""
    ad = appdef_obj(min_i=3)
    a = parsed(ad)
    ad["status"] = {"conditions": [{"type": "WarmPoolPodsFailing", "status": "True",
                                    "message": "3 instances cannot start their pod"}]}
    pool = objects(a, 1) + objects(a, 2) + objects(a, 3)
    pods = [_pod(a, 1, True), _pod(a, 2, False), _pod(a, 3, False, "ImagePullBackOff")]
    (java,) = pool_status("ns", [ad], [], pool, [], pod_items=pods)["appdefinitions"]
    assert [(i["id"], i["pod"]) for i in java["instances"]] == [
        (1, "warm"), (2, "starting"), (3, "failing")]
    c = java["counts"]
    assert (c["free"], c["free_warm"], c["free_starting"], c["free_failing"]) == (3, 1, 1, 1)
    assert java["podsFailing"] == "3 instances cannot start their pod"


def _selects(selector: str | None, obj: dict[str, Any]) -> bool:
    """A label selector of `key` and `key=value` terms, as the API server applies it."""
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, (selector or "").split(",")):
        key, eq, value = term.partition("=")
        if key not in labels or (eq and labels[key] != value):
            return False
    return True


class _LineKube:
    """What `namespace_status` reads of a cluster of Theia Cloud's `line` whose namespace
    holds `items` (kind -> objects; none by default); `listed` records the kinds it listed."""

    def __init__(self, line: Any, httproute_served: bool = True,
                 items: dict[str, list[dict[str, Any]]] | None = None) -> None:
        self._line = line
        self._httproutes = httproute_served
        self._items = items or {}
        self.listed: list[str] = []

    def line(self) -> Any:
        return self._line

    def serves(self, api_version: str, kind: str) -> bool:
        return kind != v.ROUTE_KIND or self._httproutes

    def list(self, api_version: str, kind: str, ns: str, *, label_selector: str | None = None,
             **_: Any) -> tuple[list[dict[str, Any]], str]:
        self.listed.append(kind)
        return [o for o in self._items.get(kind, []) if _selects(label_selector, o)], "1"


def test_status_checks_session_routes_only_where_the_install_routes_by_them(
        monkeypatch: Any) -> None:
    """Without WARMPOOL_ROUTES (a status read from an operator's shell, not the roles'
    ConfigMap) the routing is the install's, as the roles settle it: upstream's line routes
    through its shared Ingress, so its holders' HTTPRoutes are not looked for (the walk of
    docs/operating.md saw every live Session's route called "missing" there)."""
    from warmpool.cli.status import namespace_status
    from warmpool.pool.lines import OWN, TheiaLine

    monkeypatch.delenv("WARMPOOL_ROUTES", raising=False)
    upstream = TheiaLine(appdefinition="v1beta10", session="v1beta8")
    for line, routed in ((upstream, False), (OWN, True)):
        kube = _LineKube(line)
        namespace_status(kube, "ns", None, errors_limit=5)  # type: ignore[arg-type]
        assert (v.ROUTE_KIND in kube.listed) is routed, line
    monkeypatch.setenv("WARMPOOL_ROUTES", "httproute")  # a value that is set is kept
    kube = _LineKube(upstream)
    namespace_status(kube, "ns", None, errors_limit=5)  # type: ignore[arg-type]
    assert v.ROUTE_KIND in kube.listed


def test_status_sees_the_pods_java_made_on_upstreams_line() -> None:
    """Upstream's operator labels neither its pool objects nor their pods with the generation;
    docs/operating.md labels the objects (not the pods: a label on the template restarts
    them). The status found pods by the generation label, so it showed every pod Java made
    `starting` while it ran (seen in the walk of docs/operating.md)."""
    from warmpool.cli.status import namespace_status
    from warmpool.pool.lines import TheiaLine

    ad = appdef_obj(min_i=1)
    a = parsed(ad)
    java_pod = _pod(a, 1, True)
    del java_pod["metadata"]["labels"][v.LABEL_GENERATION]
    pool = objects(a, 1)
    items: dict[str, list[dict[str, Any]]] = {v.APPDEF_KIND: [ad], "Pod": [java_pod]}
    for obj in pool:
        items.setdefault(obj["kind"], []).append(obj)
    kube = _LineKube(TheiaLine(appdefinition="v1beta10", session="v1beta8"), items=items)
    doc = namespace_status(kube, "ns", None, errors_limit=5)  # type: ignore[arg-type]
    assert [(i["id"], i["pod"]) for i in doc["appdefinitions"][0]["instances"]] == [(1, "warm")]


def test_with_upstreams_shared_ingress_each_holder_shows_its_rule() -> None:
    """Upstream's routing is a rule per holder on the shared Ingress: the status judges that
    rule as it judges a holder's HTTPRoute (the walk of docs/operating.md showed `-` for
    every holder there, so a newcomer could not check the routes kept by the migration)."""
    from warmpool.pool import ingress

    settings = builders.PoolSettings(routes="ingress")
    ad = appdef_obj(min_i=4)
    ad["spec"]["ingressname"] = "shared"
    a = parsed(ad)
    sessions = [session_obj(f"s{k}", user=f"u{k}@example.com", instance=k, status="HANDLED")
                for k in (1, 2, 3)]
    held = [parse_session(o) for o in sessions]
    pool = [o for k in (1, 2, 3) for o in objects(a, k, held[k - 1])] + objects(a, 4)
    rule_2 = ingress.desired_rule(a, 2, settings)
    rule_2["http"]["paths"][0]["backend"]["service"]["name"] = "someone-else"
    shared = {"metadata": {"name": "shared"}, "spec": {"rules": [
        {"host": settings.instances_host}, ingress.desired_rule(a, 1, settings), rule_2]}}

    def routes_of(items: list[dict[str, Any]]) -> dict[int, Any]:
        doc = pool_status("ns", [ad], sessions, pool, [], ingress_items=items,
                          settings=settings)
        return {i["id"]: i["route"] for i in doc["appdefinitions"][0]["instances"]}

    assert routes_of([shared]) == {1: "ok", 2: "elsewhere", 3: "missing", 4: None}
    assert routes_of([]) == {1: "missing", 2: "missing", 3: "missing", 4: None}


def test_status_reads_the_ingresses_only_where_the_install_routes_by_them(
        monkeypatch: Any) -> None:
    from warmpool.cli.status import namespace_status
    from warmpool.pool.lines import OWN, TheiaLine

    monkeypatch.delenv("WARMPOOL_ROUTES", raising=False)
    for line, read in ((TheiaLine(appdefinition="v1beta10", session="v1beta8"), True),
                       (OWN, False)):
        kube = _LineKube(line)
        namespace_status(kube, "ns", None, errors_limit=5)  # type: ignore[arg-type]
        assert ("Ingress" in kube.listed) is read, line
