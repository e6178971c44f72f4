"""Upstream Theia Cloud's routing (session-lifecycle §4): one rule per claimed instance on the
shared Ingress, as pure functions.

eclipse-theia/theia-cloud routes through one Ingress named by `spec.ingressname`, which Helm
creates with one placeholder rule per host (an empty `http`). A claim appends the rule
`{host: H, http: {paths: [{path: <path><suffix>, pathType: ImplementationSpecific, backend:
<k's external Service, spec.port>}]}}`; a release removes it. Upstream appends without looking
(a retry adds a duplicate) and removes every path equal to its own on any host. Ours: a rule's
identity is (host, path), it is added once and removed on release, and nothing else of the
Ingress is touched (the placeholders, foreign rules, annotations). The list is replaced whole by
a merge patch guarded by the Ingress's resourceVersion: many workers edit this one object, and
an edit decided on a version someone else has changed since is refused and decided again.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from warmpool.pool import builders
from warmpool.pool.builders import PoolSettings
from warmpool.pool.model import AppDefinition
from warmpool.pool.parts import Part

Obj = Mapping[str, Any]

#: A Session's message while the AppDefinition's shared Ingress does not exist.
INGRESS_MISSING = "Ingress not available."


def rule_path(appdef: AppDefinition, instance: int, settings: PoolSettings) -> str:
    """`getPath(A, k)` and the configured suffix (nginx's `(/|$)(.*)` by default)."""
    return settings.session_path(appdef, instance) + settings.ingress_path_suffix


def _backend(appdef: AppDefinition, instance: int) -> dict[str, Any]:
    return {"service": {"name": builders.object_name(appdef, Part.EXTERNAL_SERVICE, instance),
                        "port": {"number": appdef.port}}}


def desired_rule(appdef: AppDefinition, instance: int, settings: PoolSettings) -> dict[str, Any]:
    """Upstream's rule for a claimed instance, byte for byte."""
    return {"host": settings.instances_host, "http": {"paths": [{
        "path": rule_path(appdef, instance, settings),
        "pathType": "ImplementationSpecific",
        "backend": _backend(appdef, instance)}]}}


def _rules(ingress: Obj) -> list[Any]:
    spec = ingress.get("spec")
    rules = spec.get("rules") if isinstance(spec, Mapping) else None
    return copy.deepcopy(list(rules)) if isinstance(rules, list) else []


def _paths(rule: Any) -> list[Any]:
    if not isinstance(rule, Mapping):
        return []
    http = rule.get("http")
    paths = http.get("paths") if isinstance(http, Mapping) else None
    return paths if isinstance(paths, list) else []


def with_rule(ingress: Obj, appdef: AppDefinition, instance: int,
              settings: PoolSettings) -> list[Any] | None:
    """The Ingress's rules with the instance's rule in place, or None if it is already there
    (same host, path and backend). A path of ours with another backend is corrected there."""
    host, path = settings.instances_host, rule_path(appdef, instance, settings)
    rules = _rules(ingress)
    for rule in rules:
        if not isinstance(rule, Mapping) or rule.get("host") != host:
            continue
        for entry in _paths(rule):
            if isinstance(entry, dict) and entry.get("path") == path:
                want = (_backend(appdef, instance), "ImplementationSpecific")
                if (entry.get("backend"), entry.get("pathType")) == want:
                    return None
                entry["backend"], entry["pathType"] = want
                return rules
    rules.append(desired_rule(appdef, instance, settings))
    return rules


def without_rule(ingress: Obj, appdef: AppDefinition, instance: int,
                 settings: PoolSettings) -> list[Any] | None:
    """The Ingress's rules without the instance's path on its host, or None if it has none.
    A rule left with no path by that is dropped; every other rule stays as it is."""
    host, path = settings.instances_host, rule_path(appdef, instance, settings)
    return _without_paths(
        ingress, lambda rule, entry: rule.get("host") == host
        and isinstance(entry, Mapping) and entry.get("path") == path)


def _without_paths(ingress: Obj, drop: Callable[[dict[str, Any], Any], bool]
                   ) -> list[Any] | None:
    """The Ingress's rules without every path `drop` names, or None if it names none. A rule
    left with no path by that is dropped; every other rule (and every rule that is not an
    object: foreign content is kept as it is) stays as it is."""
    out: list[Any] = []
    changed = False
    for rule in _rules(ingress):
        paths = _paths(rule)
        if not isinstance(rule, dict) or not paths:
            out.append(rule)
            continue
        kept = [p for p in paths if not drop(rule, p)]
        if len(kept) == len(paths):
            out.append(rule)
            continue
        changed = True
        if kept:
            rule["http"]["paths"] = kept
            out.append(rule)
    return out if changed else None


def _backend_service(entry: Any) -> str | None:
    """The Service name a path of an Ingress rule sends to (networking.k8s.io/v1), or None."""
    backend = entry.get("backend") if isinstance(entry, Mapping) else None
    service = backend.get("service") if isinstance(backend, Mapping) else None
    name = service.get("name") if isinstance(service, Mapping) else None
    return name if isinstance(name, str) else None


def without_backend(ingress: Obj, service: str) -> list[Any] | None:
    """The Ingress's rules without every path that sends to the Service `service`, or None if
    none does. A rule left with no path by that is dropped; every other rule stays as it is.

    For a release while the AppDefinition is invalid (issue #27): the rule's path is made of
    the spec, but its backend is the instance's external Service, whose name the instance's
    own object says. Every path sending there is the released instance's, on whatever host.
    """
    return _without_paths(ingress, lambda _rule, entry: _backend_service(entry) == service)
