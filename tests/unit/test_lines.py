"""Theia Cloud's two lines (warmpool.pool.lines) and what the model reads of each version."""

from __future__ import annotations

from typing import Any

import pytest

from warmpool.pool import lines
from warmpool.pool.model import (
    AppDefinition,
    Invalid,
    parse_appdefinition,
    parse_session,
)
from warmpool.testing.world import appdef_body, appdef_spec, session_body, session_spec

#: The theia.cloud group as upstream's chart (theia-cloud-crds 1.3.0-next) serves it: the
#: discovery API's versions in priority order, and the kinds at each.
UPSTREAM_VERSIONS = ["v1beta10", "v1beta9", "v1beta8", "v1beta7", "v1beta6", "v1beta5",
                     "v1beta4", "v1beta3"]
UPSTREAM_KINDS = {"v1beta10": ["AppDefinition"], "v1beta9": ["AppDefinition"],
                  "v1beta8": ["AppDefinition", "Session"], "v1beta7": ["Session"],
                  "v1beta6": ["Session"], "v1beta5": ["Workspace"], "v1beta4": ["Workspace"],
                  "v1beta3": ["Workspace"]}
FORK_VERSIONS = ["v1beta11", "v1beta8"]
FORK_KINDS = {"v1beta11": ["AppDefinition"], "v1beta8": ["Session"]}


def test_each_kind_gets_its_first_served_version_in_priority_order() -> None:
    # The group prefers v1beta10, which serves no Session: chosen per kind, not per group.
    assert lines.choose_line(UPSTREAM_VERSIONS, UPSTREAM_KINDS) == lines.TheiaLine(
        appdefinition="v1beta10", session="v1beta8")
    assert lines.choose_line(FORK_VERSIONS, FORK_KINDS) == lines.OWN
    assert lines.OWN.fork and not lines.TheiaLine("v1beta10", "v1beta8").fork


def test_a_preferred_version_warmpool_does_not_know_is_passed_over() -> None:
    versions = ["v1beta12", "v1beta11"]
    kinds = {"v1beta12": ["AppDefinition", "Session"], "v1beta11": ["AppDefinition"]}
    assert lines.choose_version("AppDefinition", versions, kinds) == "v1beta11"
    assert lines.choose_version("Session", versions, kinds) is None
    assert lines.choose_line(versions, kinds) is None


@pytest.mark.parametrize(("versions", "kinds", "says"), [
    ([], {}, "the cluster serves no AppDefinition (theia.cloud): install Theia Cloud first"),
    (["v1beta8"], {"v1beta8": ["AppDefinition"]},
     "the cluster serves AppDefinition only at v1beta8, and this warmpool reads AppDefinition "
     "at v1beta11, v1beta10, v1beta9"),
])
def test_the_advice_on_a_missing_kind_never_is_to_replace_the_clusters_crds(
        versions: list[str], kinds: dict[str, list[str]], says: str) -> None:
    advice = lines.missing_advice("AppDefinition", versions, kinds)
    assert advice.startswith(says)
    assert "deploy/base/crds" not in advice and "warmpool/kube/crds" not in advice
    assert "never installs or replaces" in advice or "do not replace" in advice


@pytest.mark.parametrize(("line", "httproute", "routes"), [
    (lines.OWN, True, "httproute"),
    (lines.OWN, False, "ingress"),
    (lines.TheiaLine("v1beta10", "v1beta8"), True, "ingress"),
    (lines.TheiaLine("v1beta10", "v1beta8"), False, "ingress"),
])
def test_the_default_routing_is_the_installs(line: lines.TheiaLine, httproute: bool,
                                             routes: str) -> None:
    chosen, why = lines.default_routes(line, httproute)
    assert chosen == routes
    assert line.name in why


def _appdef(api_version: str, **spec: Any) -> AppDefinition | Invalid:
    body = appdef_body("ns", spec={**appdef_spec(), **spec},
                       metadata={"uid": "u-1", "generation": 1})
    return parse_appdefinition({**body, "apiVersion": api_version})


def test_an_owner_reference_says_the_version_its_owner_was_read_at() -> None:
    for version in ("v1beta11", "v1beta10", "v1beta9"):
        parsed = _appdef(f"theia.cloud/{version}")
        assert isinstance(parsed, AppDefinition)
        assert parsed.owner_reference()["apiVersion"] == f"theia.cloud/{version}"
    session = parse_session({**session_body("ns", "s1", session_spec("s1", "a@example.com")),
                             "apiVersion": "theia.cloud/v1beta8"})
    assert session.owner_reference()["apiVersion"] == "theia.cloud/v1beta8"
    # What is no Theia Cloud apiVersion never reaches an owner reference.
    for bad in ("theia.cloud/v1beta10\n", "other.io/v1", 7, "theia.cloud/../v1"):
        parsed = _appdef(bad)  # type: ignore[arg-type]
        assert isinstance(parsed, AppDefinition)
        assert parsed.owner_reference()["apiVersion"] == "theia.cloud/v1beta11"


def test_v1beta11_sidecars_are_read_and_v1beta10_has_none() -> None:
    upstream = _appdef("theia.cloud/v1beta10")
    assert isinstance(upstream, AppDefinition) and upstream.sidecars == ()
    fork = _appdef("theia.cloud/v1beta11", sidecars=[
        {"name": "java-ls", "image": "ls:1", "port": 5000},
        {"name": "rust-ls", "image": "ls:2", "port": 5001}])
    assert isinstance(fork, AppDefinition) and fork.sidecars == ("java-ls", "rust-ls")
    for bad, says in ((["x"], "spec.sidecars[0].name"), ({"a": 1}, "spec.sidecars must be"),
                      ([{"name": "a b"}], "spec.sidecars[0].name"),
                      ([{"name": f"s{i}"} for i in range(17)], "at most 16")):
        parsed = _appdef("theia.cloud/v1beta11", sidecars=bad)
        assert isinstance(parsed, Invalid) and says in parsed.message
