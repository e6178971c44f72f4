"""Observed-state builders for the pure decision tests: objects as the API server returns them.

The AppDefinition and Session bodies are the test world's (`warmpool.testing.world`), parsed
into the model; what is only for these tests is the instances' observed objects."""

from __future__ import annotations

import copy
import itertools
from typing import Any

from warmpool.pool import builders
from warmpool.pool.instances import InstanceView
from warmpool.pool.model import AppDefinition, Session, parse_appdefinition, parse_session
from warmpool.pool.parts import PARTS, Part
from warmpool.testing.world import appdef_body, appdef_spec, session_body, session_spec

# Routes and the URL probe: tests/unit/test_routes.py.
SETTINGS = builders.PoolSettings(routes="none", url_probe=False)
_rv = itertools.count(100)


def appdef(min_instances: int = 2, max_instances: int = 10, generation: int = 1,
           deleting: bool = False, image: str = "img") -> AppDefinition:
    obj = appdef_body("ns", "java", appdef_spec(
        "java", min_instances=min_instances, max_instances=max_instances, spec_name="java-17",
        image=image, ingressname=None, resources=False), metadata={
            "uid": "aaaa-bbbb-381261d79c23", "generation": generation,
            **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {})})
    parsed = parse_appdefinition(obj)
    assert isinstance(parsed, AppDefinition), parsed
    return parsed


def session(name: str = "s1", user: str = "jane@example.com", instance: int | None = None,
            created: str = "2026-01-01T00:00:01Z", deleting: bool = False,
            status: str | None = None, appdef_name: str = "java", url: str = "") -> Session:
    ann = {"theia-cloud.io/instance-id": str(instance),
           "theia-cloud.io/session-start-strategy": "eager"} if instance else {}
    return parse_session(session_body(
        "ns", name, session_spec(name, user, appdef_name, workspace=None),
        metadata={"uid": f"uid-{name}", "creationTimestamp": created, "annotations": ann,
                  **({"deletionTimestamp": "2026-01-01T00:00:09Z"} if deleting else {})},
        status={**({"operatorStatus": status} if status else {}),
                **({"url": url} if url else {})}))


def observed(body: dict[str, Any]) -> dict[str, Any]:
    """What the API server would return after creating `body`."""
    obj = copy.deepcopy(body)
    obj["metadata"]["uid"] = f"uid-{obj['metadata']['name']}"
    obj["metadata"]["resourceVersion"] = str(next(_rv))
    return obj


def instance(a: AppDefinition, k: int, holder: Session | None = None,
             missing: tuple[Part, ...] = ()) -> InstanceView:
    """Instance k converged: free (holder None) or fully claimed by `holder`."""
    objects: dict[Part, dict[str, Any] | None] = {}
    for part in PARTS:
        if part in missing:
            objects[part] = None
            continue
        objects[part] = observed(builders.build(part, a, k, holder=holder, proxy_template=None,
                                                settings=SETTINGS))
    return InstanceView(k, objects)


def with_objects(view: InstanceView, **changes: dict[str, Any] | None) -> InstanceView:
    objects = dict(view.objects)
    for name, obj in changes.items():
        objects[Part[name]] = obj
    return InstanceView(view.id, objects)
