"""Issue #27, point 6: the grammars of the names and hosts copied from objects warmpool does
not own (warmpool.pool.grammar), and where they stop a bad value: an AppDefinition's
hostname prefixes, the shared route's parentRefs and hostnames."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.unit.pool_fixtures import appdef, instance, session
from tests.unit.test_routes import ROUTING, SHARED, _decide
from warmpool.pool import grammar, routes
from warmpool.pool.actions import Create, Patch, SetSessionStatus
from warmpool.pool.builders import PoolSettings
from warmpool.pool.model import AppDefinition, Invalid, parse_appdefinition
from warmpool.pool.parts import Part
from warmpool.testing.world import appdef_body, appdef_spec


@pytest.mark.parametrize("name", ["a", "java-17", "a.b.c", "0", "a" * 253, "x" * 70])
def test_object_names_that_kubernetes_accepts(name: str) -> None:
    assert grammar.object_name_error(name) is None


@pytest.mark.parametrize(("name", "says"), [
    ("a/b", "DNS-1123"), ("A", "DNS-1123"), ("-a", "DNS-1123"), ("a-", "DNS-1123"),
    ("a..b", "DNS-1123"), ("a_b", "DNS-1123"), ("ä", "DNS-1123"), ("\u0661", "DNS-1123"),
    ("a\n", "DNS-1123"), ("", "non-empty"), (None, "non-empty"), (7, "non-empty"),
    ("a" * 254, "at most 253"),
])
def test_object_names_that_it_refuses(name: object, says: str) -> None:
    error = grammar.object_name_error(name)
    assert error is not None and says in error and "\n" not in error


@pytest.mark.parametrize("host", ["ide.example.org", "*.webview.ide.example.org", "h",
                                  "a-1.b-2", "x" * 63 + ".org"])
def test_hostnames(host: str) -> None:
    assert grammar.hostname_error(host) is None


@pytest.mark.parametrize("host", ["IDE.example.org", "ide.example.org.", "a..b", "-a.org",
                                  "a.*.org", "*", "*.", "ide.example.org:8443", "a b",
                                  "x" * 64 + ".org", "a." * 127 + "ab", "", 5, "ide\n.org"])
def test_not_hostnames(host: object) -> None:
    assert grammar.hostname_error(host) is not None


@pytest.mark.parametrize("prefix", ["", "ws.", "*.webview.", "a.b."])
def test_hostname_prefixes(prefix: str) -> None:
    assert grammar.hostname_prefix_error(prefix) is None


@pytest.mark.parametrize("prefix", ["ws", ".ws.", "WS.", "w s.", "a.*.", "ws..", "**.",
                                    "x" * 64 + ".", 3])
def test_not_hostname_prefixes(prefix: object) -> None:
    assert grammar.hostname_prefix_error(prefix) is not None


GOOD_REF = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw",
            "namespace": "infra", "sectionName": "https", "port": 443}


@pytest.mark.parametrize(("change", "says"), [
    ({"name": "a/b"}, "name must be a Kubernetes object name"),
    ({"name": None}, "name must be a non-empty string"),
    ({"group": "Gateway.IO"}, "group"),
    ({"kind": "Gate way"}, "kind must be a kind"),
    ({"namespace": "infra.x"}, "namespace must be a namespace name"),
    ({"sectionName": "HTTPS"}, "sectionName"),
    ({"port": 0}, "port must be a TCP port"),
    ({"port": "443"}, "port must be a TCP port"),
    ({"port": True}, "port must be a TCP port"),
    ({"extra": 1}, "has fields other than"),
])
def test_parent_refs_are_held_to_the_gateway_api_grammar(change: dict[str, Any],
                                                         says: str) -> None:
    assert grammar.parent_ref_error(GOOD_REF) is None
    assert grammar.parent_ref_error({"name": "gw"}) is None
    assert grammar.parent_ref_error({**GOOD_REF, "group": ""}) is None
    ref = {**GOOD_REF, **change}
    error = grammar.parent_ref_error(ref)
    assert error is not None and says in error, error


def test_route_lists_are_bounded_and_name_the_field() -> None:
    assert grammar.route_parents_error([GOOD_REF], ["a.org"]) is None
    assert grammar.route_parents_error(None, None) is None
    assert grammar.route_parents_error("gw", None) == "spec.parentRefs must be a list, got 'gw'"
    assert grammar.route_parents_error([GOOD_REF] * 33, None) == \
        "spec.parentRefs has 33 entries; at most 32"
    assert grammar.route_parents_error([], ["a.org"] * 17) == \
        "spec.hostnames has 17 entries; at most 16"
    error = grammar.route_parents_error([GOOD_REF, {"name": "x/y"}], [])
    assert error is not None and error.startswith("spec.parentRefs[1] name ")
    error = grammar.route_parents_error([], ["ok.org", "Bad.org"])
    assert error is not None and error.startswith("spec.hostnames[1] must be an RFC 1123")


# --- an AppDefinition's hostname prefixes ---------------------------------------------------


def parsed(prefixes: object) -> AppDefinition | Invalid:
    spec = appdef_spec("java", min_instances=1, max_instances=2, spec_name="java",
                       image="img", ingressname="shared", resources=False)
    spec["ingressHostnamePrefixes"] = prefixes
    return parse_appdefinition(appdef_body("ns", "java", spec, metadata={"uid": "u" * 20}))


def test_good_prefixes_are_kept() -> None:
    ok = parsed(["ws.", "*.webview."])
    assert isinstance(ok, AppDefinition) and ok.ingress_hostname_prefixes == ("ws.",
                                                                              "*.webview.")


@pytest.mark.parametrize(("prefixes", "says"), [
    (["ws.", "bad prefix."], "spec.ingressHostnamePrefixes[1] must be hostname labels"),
    (["ws"], "spec.ingressHostnamePrefixes[0] must be hostname labels"),
    ([f"p{i}." for i in range(16)], "spec.ingressHostnamePrefixes has 16 entries; at most 15"),
])
def test_bad_prefixes_make_the_appdefinition_invalid(prefixes: list[str], says: str) -> None:
    result = parsed(prefixes)
    assert isinstance(result, Invalid) and result.message.startswith(says), result


# --- the shared route ------------------------------------------------------------------------


def shared_with(**spec: Any) -> dict[str, Any]:
    route = copy.deepcopy(SHARED)
    route["spec"].update(spec)
    return route


@pytest.mark.parametrize(("spec", "says"), [
    ({"parentRefs": [{"name": "gw", "nmae": "typo"}]}, "spec.parentRefs[0] has fields"),
    ({"parentRefs": [{"name": "gw/x"}]}, "spec.parentRefs[0] name"),
    ({"hostnames": ["IDE.example.org"]}, "spec.hostnames[0] must be an RFC 1123"),
])
def test_a_shared_route_that_cannot_be_copied_makes_no_route(spec: dict[str, Any],
                                                             says: str) -> None:
    bad = shared_with(**spec)
    error = routes.shared_route_error(appdef(), bad, ROUTING)
    assert error is not None and error.startswith(says), error
    s1 = session("s1", instance=None, status="HANDLING")
    plan = _decide(instance(appdef(), 1, holder=s1), [s1], shared=bad)
    assert not [a for a in plan.actions if isinstance(a, Create | Patch)
                and a.part is Part.ROUTE], "a route was built from an invalid shared route"
    statuses = [a for a in plan.actions if isinstance(a, SetSessionStatus)]
    assert statuses and statuses[-1].status["operatorStatus"] == "HANDLING"
    assert says in statuses[-1].status["operatorMessage"]


def test_hostnames_made_from_the_instances_host_are_checked_too() -> None:
    with_port = PoolSettings(instances_host="ide.example.org:8443", url_probe=False)
    error = routes.shared_route_error(appdef(), SHARED, with_port)
    assert error is not None and "the instances host" in error
    assert routes.shared_route_error(appdef(), SHARED, ROUTING) is None
