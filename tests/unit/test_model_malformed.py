"""One malformed object must not stop a namespace: the parsers never raise.

The API server type-checks nothing under spec or status (the CRDs preserve unknown fields) and
annotations are free text, so any field of a Session or AppDefinition may hold anything. The
cache parses every Session of the namespace on every event and every job reads them: a parser
that raises on one object stops claims and releases for all of them. These tests feed each
field the shapes a hand edit or another tool could leave there.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from warmpool.pool import vocabulary as v
from warmpool.pool.model import (
    AppDefinition,
    Invalid,
    Session,
    parse_appdefinition,
    parse_instance_id,
    parse_session,
    session_error,
)
from warmpool.testing.world import appdef_body, appdef_spec, session_body, session_spec

WEIRD: list[Any] = [None, "", "²", "١٢", "1" * 5000, "-1", "0", "007", " 7", "7\n", 7, 7.5,
                    True, [], ["1"], {}, {"a": 1}, float("nan"), "x" * 100_000, "\u212a"]


def session_obj() -> dict[str, Any]:
    return session_body("ns", "s1", session_spec("s1", "jane@example.com", workspace=None),
                        metadata={"uid": "uid-s1", "creationTimestamp": "2026-01-01T00:00:01Z",
                                  "resourceVersion": "5",
                                  "annotations": {v.ANNOTATION_INSTANCE_ID: "3"}},
                        status={"operatorStatus": "HANDLED", "operatorMessage": "ok"})


def appdef_obj() -> dict[str, Any]:
    spec = appdef_spec("java", min_instances=1, max_instances=3, spec_name="java-17",
                       image="img", ingressname=None, imagePullPolicy="Always")
    return appdef_body("ns", "java", spec, metadata={
        "uid": "aaaa-bbbb-381261d79c23", "generation": 2,
        "creationTimestamp": "2026-01-01T00:00:00Z"})


def test_a_superscript_instance_id_is_not_an_id() -> None:
    """'²'.isdigit() is True, but int('²') raises: the crash of issue #15, item 5."""
    obj = session_obj()
    obj["metadata"]["annotations"][v.ANNOTATION_INSTANCE_ID] = "²"
    s = parse_session(obj)
    assert s.instance_id is None
    assert session_error(s) is None  # the annotation is not obeyed; the Session is still valid


@pytest.mark.parametrize("raw", ["1" * 5000, "١٢", "-1", "0", " 7", "7\n", "+7", "1_0"])
def test_instance_ids_are_plain_ascii_decimals(raw: str) -> None:
    obj = session_obj()
    obj["metadata"]["annotations"][v.ANNOTATION_INSTANCE_ID] = raw
    assert parse_session(obj).instance_id is None


def test_a_plain_instance_id_is_read() -> None:
    assert parse_session(session_obj()).instance_id == 3


@pytest.mark.parametrize("raw", WEIRD)
def test_parse_instance_id_is_total(raw: Any) -> None:
    """The one reading of the annotation, for the scheduler's key mapping too."""
    k = parse_instance_id(raw)
    assert k is None or (isinstance(k, int) and 0 < k < 10**9)


def _paths(obj: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in obj.items():
        out.append((*prefix, key))
        if isinstance(value, dict):
            out += _paths(value, (*prefix, key))
    return out


def _set(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = copy.deepcopy(value)
    return out


SESSION_PATHS = [p for p in _paths(session_obj()) if p[0] != "metadata" or p[-1] in (
    "annotations", v.ANNOTATION_INSTANCE_ID)]


@pytest.mark.parametrize("path", SESSION_PATHS, ids="/".join)
def test_parse_session_never_raises(path: tuple[str, ...]) -> None:
    for value in WEIRD:
        s = parse_session(_set(session_obj(), path, value))
        assert isinstance(s, Session)
        assert isinstance(s.user, str) and isinstance(s.appdef, str)
        assert isinstance(s.status, str) and isinstance(s.message, str)
        assert s.instance_id is None or (isinstance(s.instance_id, int) and s.instance_id > 0)
        error = session_error(s)
        assert error is None or isinstance(error, str)


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("user", 42, "spec.user must be a string"),
    ("user", ["jane@example.com"], "spec.user must be a string"),
    ("appDefinition", {"name": "java"}, "spec.appDefinition must be a string"),
    ("appDefinition", 7, "spec.appDefinition must be a string"),
])
def test_a_session_with_a_mistyped_field_is_an_error_naming_it(
    field: str, value: Any, fragment: str
) -> None:
    s = parse_session(_set(session_obj(), ("spec", field), value))
    error = session_error(s)
    assert error is not None and fragment in error


def test_a_session_whose_spec_is_not_a_mapping_is_an_error() -> None:
    for spec in ("text", ["a"], 5):
        error = session_error(parse_session(_set(session_obj(), ("spec",), spec)))
        assert error is not None and "spec must be an object" in error


def test_a_session_whose_status_is_not_a_mapping_is_read_as_new() -> None:
    """The controller owns the status and rewrites it; a mangled one is no reason to refuse."""
    s = parse_session(_set(session_obj(), ("status",), "broken"))
    assert s.status == v.STATUS_NEW and session_error(s) is None


APPDEF_PATHS = [p for p in _paths(appdef_obj()) if p[0] == "spec" or p[-1] in (
    "generation", "creationTimestamp")]


@pytest.mark.parametrize("path", APPDEF_PATHS, ids="/".join)
def test_parse_appdefinition_never_raises(path: tuple[str, ...]) -> None:
    for value in WEIRD:
        parsed = parse_appdefinition(_set(appdef_obj(), path, value))
        assert isinstance(parsed, (AppDefinition, Invalid))
        if isinstance(parsed, Invalid):
            assert parsed.message and "\n" not in parsed.message


def test_parse_appdefinition_with_a_non_mapping_spec_is_invalid() -> None:
    for spec in ("text", ["a"], 5, None):
        parsed = parse_appdefinition(_set(appdef_obj(), ("spec",), spec))
        assert isinstance(parsed, Invalid)


def test_spec_name_with_a_trailing_newline_is_invalid() -> None:
    """re.match with '$' accepts 'java\\n': the name must match the CRD's pattern exactly."""
    parsed = parse_appdefinition(_set(appdef_obj(), ("spec", "name"), "java\n"))
    assert isinstance(parsed, Invalid) and "spec.name" in parsed.message


def test_messages_quote_a_huge_value_cut() -> None:
    parsed = parse_appdefinition(_set(appdef_obj(), ("spec", "minInstances"), "9" * 100_000))
    assert isinstance(parsed, Invalid) and len(parsed.message) < 200


def test_a_sessions_error_is_kept_with_it_and_made_again_by_replace() -> None:
    """Issue #28: `session_error` is computed once, when the Session is made (a claim asks it
    of every Session of its pool); a Session changed by `dataclasses.replace` is a new one,
    whose error is computed again, and the kept value never makes two Sessions differ."""
    import dataclasses

    good = parse_session(session_body("ns", "s", session_spec("s", "a@b.c", "java",
                                                                workspace=None)))
    assert session_error(good) is None
    no_user = dataclasses.replace(good, user="")
    assert str(session_error(no_user)).startswith("spec.user is empty")
    assert session_error(dataclasses.replace(no_user, user="a@b.c")) is None
    assert session_error(dataclasses.replace(good, appdef="")) == "spec.appDefinition is empty"
    assert session_error(dataclasses.replace(good, malformed="bad")) == "bad"
    assert dataclasses.replace(no_user, user="a@b.c") == good
    assert "problem" not in repr(good)
