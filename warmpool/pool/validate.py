"""Checks of an AppDefinition against the other AppDefinitions of its namespace. Pure.

``parse_appdefinition`` sees one object; a selector collision needs the namespace. Each
instance's Services and Deployment select its pods by the `app` label
``asValidName(spec.name + "-" + k)``, which maps `Java` and `java`, `a_b` and `a-b`, `-x`
and `a-x` to the same value: two such pools would route each other's Services to each
other's pods, and a release in one would reset a pod of the other. The later of the two (by
creationTimestamp, then name) is Invalid, before anything is created or deleted for it; the
earlier one keeps running.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from warmpool.pool import naming
from warmpool.pool.model import (
    MAX_INSTANCES_CEILING,
    AppDefinition,
    Invalid,
    parse_appdefinition,
)


def selector_key(spec_name: str) -> str:
    """What two spec.names must share for their instances' `app` selectors to meet.

    selector(name, k) is this key's stem followed by "-<k>" (asValidName replaces, prefixes,
    lower-cases; parse_appdefinition refuses names long enough to be cut). Ids are digits
    only, so two different stems never meet at any pair of ids, and two equal stems meet at
    every id: comparing the selectors of instance 1 decides it for all instances.
    """
    return naming.app_selector(spec_name, 1)


def selector_collision(
    appdef: AppDefinition, others: Iterable[Mapping[str, Any]]
) -> str | None:
    """Why `appdef` must not run because an earlier AppDefinition of its namespace has the same
    `app` selectors, or None.

    `others` are AppDefinition objects as the API server returns them (`appdef`'s own may be
    among them). Every one with a string spec.name counts, valid or not and being deleted or
    not: an Invalid AppDefinition is left as it is, and a deleted one's claimed instances stay
    until their Sessions end, so their objects keep their selectors.
    """
    key = selector_key(appdef.spec_name)
    mine = (appdef.created, appdef.name)
    earliest: tuple[tuple[str, str], str] | None = None
    for obj in others:
        meta = obj.get("metadata")
        spec = obj.get("spec")
        if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
            continue
        name = str(meta.get("name") or "")
        if name == appdef.name or str(meta.get("namespace") or "") != appdef.namespace:
            continue
        spec_name = spec.get("name")
        if not isinstance(spec_name, str) or not spec_name or selector_key(spec_name) != key:
            continue
        order = (str(meta.get("creationTimestamp") or ""), name)
        if order < mine and (earliest is None or order < earliest[0]):
            earliest = (order, spec_name)
    if earliest is None:
        return None
    (_, other), other_spec_name = earliest
    return (f"its instances' `app` selectors ({key}, ...) are those of AppDefinition "
            f"{other!r} (spec.name {other_spec_name!r}), created before it: their Services "
            "would route to each other's pods; give one of them another spec.name")


def validate_appdefinition(
    obj: Mapping[str, Any], namespace_appdefs: Iterable[Mapping[str, Any]], *,
    max_instances_ceiling: int = MAX_INSTANCES_CEILING,
) -> AppDefinition | Invalid:
    """``parse_appdefinition``, then the checks across the namespace: what a reader returns.

    `namespace_appdefs`: the AppDefinitions of `obj`'s namespace (it may be among them).
    """
    parsed = parse_appdefinition(obj, max_instances_ceiling=max_instances_ceiling)
    if isinstance(parsed, Invalid):
        return parsed
    if (message := selector_collision(parsed, namespace_appdefs)) is not None:
        return Invalid(message, ingress_name=parsed.ingress_name)
    return parsed
