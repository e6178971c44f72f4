"""Issue #27, point 6: names read from objects warmpool does not own never make a key the
queue cannot parse. A Session's `spec.appDefinition` of 'a/b' made `instance/ns/a/b/1`
(dead-lettered after 20 failures) and the resync's `pool/ns/a/b` every period; an owner
reference's name is only checked by the API server for being non-empty."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from scheduler.mapping import EVENT_TYPES, appdef_names, keys_for, summarize
from warmpool.keys import parse_key
from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.pool.grammar import object_name_error
from warmpool.pool.model import parse_session, session_error
from warmpool.testing.world import session_body

NS = "ns1"
#: Values anyone with `patch` on a Session, a PoolSchedule or a pool object can write.
HOSTILE = ["a/b", "/", "a/", "/a", "x/status", "Java", "a b", "a\nb", "ä", "-a", "a-",
           "a..b", "x" * 254, "a/b/c/d", "\u0661", "instance/ns/a/1", "", " "]


def bad_session(appdef: str, instance: str | None = "1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "s1", "namespace": NS, "uid": "uid-s1",
                            "resourceVersion": "7"}
    if instance is not None:
        meta["annotations"] = {v.ANNOTATION_INSTANCE_ID: instance}
    return session_body(NS, "s1", {"appDefinition": appdef, "user": "a@example.com"},
                        metadata=meta)


def ref(kind: str, name: str) -> dict[str, str]:
    api = v.APPDEF_API_VERSION if kind == v.APPDEF_KIND else v.SESSION_API_VERSION
    return {"apiVersion": api, "kind": kind, "name": name, "uid": "u-1"}


def pool_object(kind: str, name: str, refs: list[dict[str, str]]) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": name, "namespace": NS, "uid": "o-1",
                                       "resourceVersion": "9", "ownerReferences": refs}}


def all_keys(kind: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    out = []
    for event in EVENT_TYPES:
        out += [str(k) for k in keys_for(kind, event, obj, old,
                                         session_appdef_of=lambda ns, n: "a/b",
                                         routed_by=lambda ns, n: [])]
    return out


def assert_parseable(keys: list[str]) -> None:
    for key in keys:
        assert str(parse_key(key)) == key


@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_a_session_naming_no_possible_appdefinition_makes_no_key_from_it(value: str) -> None:
    keys = all_keys(v.SESSION_KIND, bad_session(value))
    assert_parseable(keys)
    assert keys and all(k == "session/ns1/s1" for k in keys), keys  # its own key, for its ERROR
    assert appdef_names(v.SESSION_KIND, summarize(v.SESSION_KIND, bad_session(value))) == set()
    # Changed from a good reference to a bad one: the old instance's key, nothing of the bad.
    keys = all_keys(v.SESSION_KIND, bad_session(value), bad_session("java"))
    assert_parseable(keys)
    assert "instance/ns1/java/1" in keys


@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_owner_references_and_schedules_with_foreign_names_make_no_key(value: str) -> None:
    for kind in ("Service", "ConfigMap", "Deployment"):
        for refs in ([ref(v.APPDEF_KIND, value)], [ref(v.SESSION_KIND, value)],
                     [ref(v.APPDEF_KIND, value), ref(v.APPDEF_KIND, "java")]):
            keys = all_keys(kind, pool_object(kind, "instance-1-java-381261d79c23", refs))
            assert_parseable(keys)
            assert all("java" in k for k in keys), keys
            assert appdef_names(kind, pool_object(kind, "x", refs)) <= {"java"}
    route = pool_object(v.ROUTE_KIND, "r", [ref(v.SESSION_KIND, value)])
    route["metadata"]["labels"] = {v.LABEL_COMPONENT: "session",
                                   v.LABEL_PART_OF: "theia-cloud"}
    route["spec"] = {"rules": [{"backendRefs": [{"name": "instance-1-java-ext"}]}]}
    assert_parseable(all_keys(v.ROUTE_KIND, route))
    schedule = {"kind": v.SCHEDULE_KIND, "metadata": {"name": "p", "namespace": NS,
                                                      "resourceVersion": "3"},
                "spec": {"appDefinition": value, "windows": []}}
    assert all_keys(v.SCHEDULE_KIND, schedule) == []


def test_every_key_the_mapping_makes_parses_whatever_the_names() -> None:
    """Every pair of (Session reference, owner reference) from the hostile list and a good
    name: no key that `parse_key` refuses."""
    for a, b in itertools.product([*HOSTILE, "java"], repeat=2):
        assert_parseable(all_keys(v.SESSION_KIND, bad_session(a), bad_session(b)))
        assert_parseable(all_keys("Service", pool_object(
            "Service", "instance-2-x", [ref(v.APPDEF_KIND, a), ref(v.SESSION_KIND, b)])))


@pytest.mark.parametrize("value", [h for h in HOSTILE if h.strip()], ids=repr)
def test_the_session_is_an_error_naming_the_field_and_keeps_no_reference(value: str) -> None:
    session = parse_session(bad_session(value))
    error = session_error(session)
    assert error is not None and error.startswith("spec.appDefinition must name an "
                                                  "AppDefinition"), error
    assert "\n" not in error and len(error) < 300
    assert session.appdef == "", "nothing may be built from a reference that names nothing"


@pytest.mark.parametrize("value", ["java", "java-17", "a.b", "a" * 253, "0x1"])
def test_good_references_are_kept(value: str) -> None:
    session = parse_session(bad_session(value))
    assert session.appdef == value and session_error(session) is None
    assert object_name_error(value) is None


@pytest.mark.parametrize(("name", "k"), [
    ("instance-1-java-381261d79c23", 1), ("instance-999999999-x", 999999999),
    ("instance-1000000000-x", None), ("instance-01-x", None), ("instance-\u0661-x", None),
    ("instance-" + "1" * 5000 + "-x", None), ("instance--1-x", None),
])
def test_an_instance_id_in_an_object_name_is_bounded(name: str, k: int | None) -> None:
    assert naming.instance_id_from_name(name) == k


def test_a_release_names_no_instance_from_a_foreign_owner_reference() -> None:
    """A released Session's holdings come from the owner references of the objects that
    reference it: an AppDefinition reference named 'a/b' names no instance key."""
    from warmpool.kube.reader import _holdings

    session_ref = {**ref(v.SESSION_KIND, "s1"), "uid": "uid-s1"}
    objs = [pool_object("Service", "instance-1-java-x", [ref(v.APPDEF_KIND, "a/b"),
                                                          session_ref]),
            pool_object("Service", "instance-2-java-x", [ref(v.APPDEF_KIND, "java"),
                                                          session_ref])]
    assert _holdings(objs, "uid-s1") == [("java", 2)]
