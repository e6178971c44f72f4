"""Events aggregated per cause (warmpool.kube.events): the name and the write decided."""

from __future__ import annotations

from warmpool.kube.events import BumpEvent, Cause, CreateEvent, event_name, plan_event

APPDEF = {"apiVersion": "theia.cloud/v1beta11", "kind": "AppDefinition", "name": "java"}
T0, T1 = "2026-03-02T10:00:00Z", "2026-03-02T10:01:00Z"


def cause(**kw: object) -> Cause:
    fields: dict[str, object] = {"namespace": "ns", "regarding": APPDEF,
                                 "reason": "InvalidAppDefinition", "warning": True, **kw}
    return Cause(**fields)  # type: ignore[arg-type]


def test_one_name_per_cause_whatever_the_message_or_time() -> None:
    name = event_name(cause())
    assert name == event_name(cause()) and name.startswith("java.")
    # Another reason, type, object, uid, namespace or source: another Event.
    others = [cause(reason="ForeignOwner"), cause(warning=False),
              cause(regarding={**APPDEF, "name": "python"}),
              cause(regarding={**APPDEF, "uid": "u2"}), cause(namespace="other"),
              cause(component="warmpool-scheduler")]
    assert len({name, *map(event_name, others)}) == 1 + len(others)


def test_a_long_object_name_still_makes_a_valid_event_name() -> None:
    name = event_name(cause(regarding={**APPDEF, "name": "a" * 253}))
    assert len(name) <= 253 and name.split(".")[1].isalnum()


def test_the_first_occurrence_creates_with_count_one() -> None:
    write = plan_event(cause(), "spec.port is missing", T0, None)
    assert isinstance(write, CreateEvent)
    body = write.body
    assert body["metadata"] == {"name": event_name(cause()), "namespace": "ns"}
    assert (body["count"], body["firstTimestamp"], body["lastTimestamp"]) == (1, T0, T0)
    assert (body["type"], body["reason"]) == ("Warning", "InvalidAppDefinition")
    assert body["involvedObject"] == {**APPDEF, "namespace": "ns"}


def test_a_recurrence_raises_the_count_under_the_version_read() -> None:
    existing = {**plan_event(cause(), "old", T0, None).body,  # type: ignore[union-attr]
                "metadata": {"name": event_name(cause()), "resourceVersion": "42"}}
    existing["count"] = 6
    write = plan_event(cause(), "new " + "x" * 2000, T1, existing)
    assert isinstance(write, BumpEvent)
    assert (write.name, write.resource_version) == (event_name(cause()), "42")
    assert write.patch["count"] == 7 and write.patch["lastTimestamp"] == T1
    assert len(write.patch["message"]) == 1024 and write.patch["message"].startswith("new ")


def test_an_unreadable_count_restarts_at_two_and_no_version_means_create() -> None:
    existing = {"metadata": {"resourceVersion": "3"}, "count": "many"}
    write = plan_event(cause(), "m", T1, existing)
    assert isinstance(write, BumpEvent) and write.patch["count"] == 2
    assert isinstance(plan_event(cause(), "m", T1, {"count": 4}), CreateEvent)


def test_what_this_process_wrote_is_remembered_boundedly() -> None:
    from warmpool.kube.events import Recorded

    seen = Recorded(size=2)
    seen.wrote("a", {"metadata": {"resourceVersion": "1", "name": "a"}, "count": 1})
    seen.wrote("b", {"metadata": {"resourceVersion": "2"}, "count": 3})
    seen.wrote("a", {"metadata": {"resourceVersion": "5"}, "count": 2})  # a: most recent
    seen.wrote("c", {"metadata": {"resourceVersion": "6"}, "count": 1})  # b forgotten
    assert seen.get("b") is None
    assert seen.get("a") == {"metadata": {"resourceVersion": "5"}, "count": 2}
    # What is remembered is enough to decide the next write without a read.
    write = plan_event(cause(), "m", T1, seen.get("a"))
    assert isinstance(write, BumpEvent) and (write.resource_version, write.patch["count"]) == (
        "5", 3)
    seen.forget("a")
    assert seen.get("a") is None
