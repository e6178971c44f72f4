"""session-lifecycle §4 as pure functions: the instance's rule on the shared Ingress."""

from __future__ import annotations

import copy

from tests.unit.pool_fixtures import appdef
from warmpool.pool import ingress
from warmpool.pool.builders import PoolSettings

SETTINGS = PoolSettings(routes="ingress", instances_host="h.example.org")
PLACEHOLDER = {"host": "h.example.org"}
FOREIGN = {"host": "h.example.org", "http": {"paths": [
    {"path": "/other", "pathType": "Prefix",
     "backend": {"service": {"name": "x", "port": {"number": 1}}}}]}}


def _ingress(*rules):  # type: ignore[no-untyped-def]
    return {"metadata": {"name": "shared"}, "spec": {"rules": list(rules)}}


def test_the_rule_is_upstreams_and_added_once() -> None:
    a = appdef()
    rule = ingress.desired_rule(a, 3, SETTINGS)
    assert rule == {"host": "h.example.org", "http": {"paths": [{
        "path": "/java-17-3(/|$)(.*)", "pathType": "ImplementationSpecific",
        "backend": {"service": {"name": "instance-3-java-17-381261d79c23",
                                "port": {"number": 3000}}}}]}}
    added = ingress.with_rule(_ingress(PLACEHOLDER, FOREIGN), a, 3, SETTINGS)
    assert added == [PLACEHOLDER, FOREIGN, rule]
    assert ingress.with_rule(_ingress(*added), a, 3, SETTINGS) is None  # idempotent
    haproxy = PoolSettings(routes="ingress", instances_host="h", ingress_path_suffix="")
    assert ingress.rule_path(a, 3, haproxy) == "/java-17-3"


def test_a_wrong_backend_on_our_path_is_corrected_in_place() -> None:
    a = appdef()
    rule = copy.deepcopy(ingress.desired_rule(a, 3, SETTINGS))
    rule["http"]["paths"][0]["backend"]["service"]["name"] = "elsewhere"
    fixed = ingress.with_rule(_ingress(FOREIGN, rule), a, 3, SETTINGS)
    assert fixed == [FOREIGN, ingress.desired_rule(a, 3, SETTINGS)]


def test_release_removes_only_our_path() -> None:
    a = appdef()
    mine, other = ingress.desired_rule(a, 3, SETTINGS), ingress.desired_rule(a, 4, SETTINGS)
    shared_rule = {"host": "h.example.org", "http": {"paths": [
        *FOREIGN["http"]["paths"], *mine["http"]["paths"]]}}  # someone merged ours into theirs
    rules = ingress.without_rule(_ingress(PLACEHOLDER, FOREIGN, mine, other, shared_rule),
                                 a, 3, SETTINGS)
    assert rules == [PLACEHOLDER, FOREIGN, other, FOREIGN]
    assert ingress.without_rule(_ingress(PLACEHOLDER, FOREIGN, other), a, 3, SETTINGS) is None
