"""Selector collisions across a namespace's pools: two AppDefinitions whose instances would
carry the same `app` label would route each other's Services to each other's pods (and a
release of one would reset the other's pod). The later one is Invalid, naming the other."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from warmpool.pool import naming
from warmpool.pool.model import AppDefinition, Invalid, parse_appdefinition
from warmpool.pool.validate import selector_collision, selector_key, validate_appdefinition


def raw(name: str, spec_name: Any, created: str = "2026-01-01T00:00:00Z",
        ns: str = "ns", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}-0123456789ab",
                         "creationTimestamp": created},
            "spec": {"name": spec_name, "image": "img", "port": 3000, "minInstances": 1,
                     "maxInstances": 3, **spec}}


def parsed(obj: dict[str, Any]) -> AppDefinition:
    a = parse_appdefinition(obj)
    assert isinstance(a, AppDefinition), a
    return a


@pytest.mark.parametrize(("older", "newer"), [
    ("java", "Java"), ("a_b", "a-b"), ("JAVA_17", "java-17"), ("-java", "a-java"),
    ("1app", "a1app"), ("_x", "-x"),
])
def test_the_later_of_two_colliding_appdefinitions_is_invalid(older: str, newer: str) -> None:
    first = raw("first", older, "2026-01-01T00:00:00Z")
    second = raw("second", newer, "2026-01-02T00:00:00Z")
    both = [first, second]
    assert selector_collision(parsed(first), both) is None
    message = selector_collision(parsed(second), both)
    assert message is not None
    assert "AppDefinition 'first'" in message and repr(older) in message
    assert naming.app_selector(newer, 1) in message


def test_same_creation_time_orders_by_name() -> None:
    a, b = raw("alpha", "java"), raw("beta", "Java")
    assert selector_collision(parsed(a), [a, b]) is None
    assert selector_collision(parsed(b), [a, b]) is not None


def test_other_namespaces_and_itself_do_not_count() -> None:
    mine = raw("mine", "java", "2026-01-02T00:00:00Z")
    elsewhere = raw("other", "java", "2026-01-01T00:00:00Z", ns="other-ns")
    assert selector_collision(parsed(mine), [mine, elsewhere]) is None


def test_an_invalid_or_deleting_older_appdefinition_still_counts() -> None:
    """Invalid is "left as it is": its instances keep running with their selectors."""
    older = raw("older", "java", "2026-01-01T00:00:00Z", minInstances=-1)
    older["metadata"]["deletionTimestamp"] = "2026-01-03T00:00:00Z"
    newer = raw("newer", "Java", "2026-01-02T00:00:00Z")
    assert selector_collision(parsed(newer), [older, newer]) is not None


@pytest.mark.parametrize("spec_name", [None, 7, "", ["java"]])
def test_others_with_no_usable_spec_name_are_ignored(spec_name: Any) -> None:
    other = raw("other", spec_name, "2026-01-01T00:00:00Z")
    mine = raw("mine", "java", "2026-01-02T00:00:00Z")
    assert selector_collision(parsed(mine), [other, mine]) is None


def test_distinct_keys_never_share_a_selector_at_any_id() -> None:
    """Why one key suffices: selector(name, k) is key(name) without its '-1', then '-k'; ids
    are digits only, so two different keys can never produce one selector."""
    names = ["java", "Java", "java-1", "java-11", "java-1-1", "a_b", "a-b", "a", "a-1", "1",
             "-", "_", "a--1", "ab", "a-", "x9", "x-9", "-java", "a-java"]
    ids = range(1, 130)
    for a, b in itertools.combinations(names, 2):
        shared = ({naming.app_selector(a, k) for k in ids}
                  & {naming.app_selector(b, k) for k in ids})
        assert bool(shared) == (selector_key(a) == selector_key(b)), (a, b, shared)


def test_validate_appdefinition_combines_parsing_and_the_namespace() -> None:
    first = raw("first", "java", "2026-01-01T00:00:00Z")
    second = raw("second", "Java", "2026-01-02T00:00:00Z")
    result = validate_appdefinition(second, [first, second])
    assert isinstance(result, Invalid) and "AppDefinition 'first'" in result.message
    assert isinstance(validate_appdefinition(first, [first, second]), AppDefinition)
    too_big = raw("big", "big", maxInstances=50)
    assert isinstance(validate_appdefinition(too_big, [], max_instances_ceiling=10), Invalid)
